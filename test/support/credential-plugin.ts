// The test credential provider plugin (./test-credential-provider.mjs)
// installed as a kubelet would find it, `<bin-dir>/<name>`, with a shebang
// naming this Node.js (or, for a plugin that must also run in pinset's
// image, `/usr/bin/env node`), and the CredentialProviderConfig that points
// at it. The same files serve `pinset agent` and a real kubelet.
import { readdirSync, readFileSync } from 'node:fs';
import { chmod, mkdir, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { stringify as dumpYaml } from 'yaml';

export const TEST_PLUGIN_SOURCE = path.join(import.meta.dirname, 'test-credential-provider.mjs');
export const TEST_PLUGIN_NAME = 'test-credential-provider';

/**
 * Writes `<binDir>/<name>`, executable; resolves to its path. `interpreter`
 * is its shebang's command: this Node.js by default; `/usr/bin/env node`
 * runs the `node` on the PATH of whoever execs the plugin (one that detects
 * ES module syntax, 20.19 or 22.7 and later: the file has no .mjs name).
 */
export async function installTestPlugin(binDir: string, name = TEST_PLUGIN_NAME, interpreter = process.execPath): Promise<string> {
  await mkdir(binDir, { recursive: true });
  const file = path.join(binDir, name);
  await writeFile(file, `#!${interpreter}\n${await readFile(TEST_PLUGIN_SOURCE, 'utf8')}`);
  await chmod(file, 0o755);
  return file;
}

export interface ProviderEntry {
  name?: string;
  matchImages: string[];
  defaultCacheDuration?: string;
  apiVersion?: string;
  args?: string[];
  env?: Record<string, string>;
}

/** A kubelet.config.k8s.io/v1 CredentialProviderConfig. */
export function providerConfig(providers: ProviderEntry[]): Record<string, unknown> {
  return {
    apiVersion: 'kubelet.config.k8s.io/v1',
    kind: 'CredentialProviderConfig',
    providers: providers.map((p) => ({
      name: p.name ?? TEST_PLUGIN_NAME,
      matchImages: p.matchImages,
      defaultCacheDuration: p.defaultCacheDuration ?? '10m',
      apiVersion: p.apiVersion ?? 'credentialprovider.kubelet.k8s.io/v1',
      ...(p.args ? { args: p.args } : {}),
      ...(p.env ? { env: Object.entries(p.env).map(([name, value]) => ({ name, value })) } : {}),
    })),
  };
}

export async function writeProviderConfig(file: string, providers: ProviderEntry[], format: 'yaml' | 'json' = 'yaml'): Promise<string> {
  const doc = providerConfig(providers);
  await writeFile(file, format === 'json' ? JSON.stringify(doc, null, 2) : dumpYaml(doc));
  return file;
}

/** One exec of the plugin, as it logged it. */
export interface PluginExec {
  at: number;
  pid: number;
  pgid?: number;
  args: string[];
  request: { apiVersion?: string; kind?: string; image?: string };
  env: Record<string, string>;
  mode: string;
  childPid?: number;
}

export async function readPluginLog(file: string): Promise<PluginExec[]> {
  const text = await readFile(file, 'utf8').catch(() => '');
  return text
    .split('\n')
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l) as PluginExec);
}

/** /proc/<pid>/stat's state and process group, or null when there is no such process. */
function procStat(pid: number): { state: string; pgrp: number } | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return { state: fields[0]!, pgrp: Number(fields[2]) };
  } catch {
    return null;
  }
}

/**
 * Whether a process still runs. A zombie does not: a killed orphan waits
 * for whoever adopted it to reap it, which in a container's minimal init
 * may be never.
 */
export function alive(pid: number): boolean {
  const s = procStat(pid);
  return s !== null && s.state !== 'Z' && s.state !== 'X';
}

/** The pids of the processes still running in a process group. */
export function groupMembers(pgid: number): number[] {
  return readdirSync('/proc')
    .filter((d) => /^\d+$/.test(d))
    .map(Number)
    .filter((pid) => {
      const s = procStat(pid);
      return s !== null && s.pgrp === pgid && s.state !== 'Z' && s.state !== 'X';
    });
}

/** Settings the plugin reads at every exec from its control file (TEST_PLUGIN_CONTROL). */
export async function controlPlugin(file: string, settings: Record<string, string>): Promise<void> {
  await writeFile(file, JSON.stringify(settings));
}
