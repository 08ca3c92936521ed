// The agent's footprint runs, shared by `npm run bench` (section 4,
// bench/run.ts) and `npm run bench:footprint` (bench/footprint.ts): each
// starts the agent as a node runs it (`runner`: the program and Node.js's
// flags) on real components and reads its memory from /proc.
import { execFile, spawn } from 'node:child_process';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { stringify as dumpYaml } from 'yaml';
import type { PinnedImageSet } from '../src/api/types.ts';
import { AgentProcess, runAgentOnce } from '../test/support/agent-process.ts';
import { ApiServer, type KubeObject } from '../test/support/apiserver.ts';
import { Containerd, CriClient } from '../test/support/containerd.ts';
import { startCrioNode } from '../test/support/crio-node.ts';
import type { PushedImage } from '../test/support/images.ts';
import type { Registry } from '../test/support/registry.ts';
import { cpuMs, procStatus } from './proc.ts';

const execFileAsync = promisify(execFile);
export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** How the agent is run: the program (dist/pinset.mjs or the sources), Node.js's options and NODE_OPTIONS. */
export interface AgentRunner {
  cli: string;
  nodeArgs: string[];
  env: NodeJS.ProcessEnv;
}

export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

export function logTime(line: Record<string, unknown>): number {
  return Date.parse(String(line.time));
}

export function parseLines(text: string): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
  for (const l of text.split('\n')) {
    if (!l.startsWith('{')) continue;
    try {
      out.push(JSON.parse(l) as Record<string, unknown>);
    } catch {
      // partial line
    }
  }
  return out;
}

export function setDoc(name: string, refs: string[]): PinnedImageSet {
  return { apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name }, spec: { pinnedImages: refs.map((name) => ({ name })) } };
}

/** Push `count` images with `workers` uploads at a time. */
export async function pushMany(count: number, workers: number, push: (i: number) => Promise<PushedImage>): Promise<PushedImage[]> {
  const out: PushedImage[] = new Array(count);
  let next = 0;
  await Promise.all(
    Array.from({ length: workers }, async () => {
      while (next < count) {
        const i = next++;
        out[i] = await push(i);
      }
    }),
  );
  return out;
}

export interface Scratch {
  dir: string;
  staticDir: string;
  dropinDir: string;
}

export async function scratch(): Promise<Scratch> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-bench-'));
  const s = { dir, staticDir: path.join(dir, 'sets.d'), dropinDir: path.join(dir, 'crio.conf.d') };
  await mkdir(s.staticDir);
  await mkdir(s.dropinDir);
  return s;
}

export function agentFlags(s: Scratch, endpoint: string, extra: string[] = []): string[] {
  return [
    '--node-name', 'bench-node',
    '--static-dir', s.staticDir,
    '--cri-endpoint', endpoint,
    '--crio-dropin-dir', s.dropinDir,
    '--state-dir', path.join(s.dir, 'state'),
    '--reload', 'none',
    '--pin-backend', 'crio',
    '--auth-file', path.join(s.dir, 'no-auth.json'),
    '--metrics-addr', '',
    '--log-level', 'info',
    ...extra,
  ];
}

/**
 * Flush the page cache's dirty pages of the previous run (its containerd
 * root was just written and removed) so its write-back does not land in
 * the next run's measurement.
 */
export async function settle(): Promise<void> {
  await execFileAsync('sync', []);
  await sleep(200);
}

/** RSS of Node.js itself with the agent's options, running nothing but a timer: the floor under every figure. */
export async function bareNodeRun(runner: Pick<AgentRunner, 'nodeArgs' | 'env'>, script = 'setInterval(() => {}, 1000)'): Promise<number> {
  const child = spawn(process.execPath, [...runner.nodeArgs, '-e', script], { env: { PATH: process.env.PATH, ...runner.env }, stdio: 'ignore' });
  try {
    await sleep(3000);
    return procStatus(child.pid!).rssKb / 1024;
  } finally {
    child.kill('SIGTERM');
  }
}

/** A long-running agent, idle on a fresh containerd; `look` reads it 5 s after its first reconcile. */
export async function idleAgent<T>(runner: AgentRunner, mirrors: Record<string, string>, withApi: boolean, look: (agent: AgentProcess) => Promise<T>): Promise<T> {
  const c = await Containerd.start({ mirrors });
  const s = await scratch();
  const api = withApi ? await ApiServer.start() : undefined;
  api?.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'bench-node', labels: {} } });
  const extra = api ? ['--kubeconfig', await api.writeKubeconfig(s.dir)] : [];
  const agent = AgentProcess.start(agentFlags(s, c.endpoint, ['--metrics-addr', '127.0.0.1:0', ...extra]), { env: runner.env, cli: runner.cli, nodeArgs: runner.nodeArgs });
  try {
    while (!agent.logs().some((l) => l.msg === 'reconcile finished')) {
      if (!agent.running) throw new Error(`agent exited:\n${agent.output()}`);
      await sleep(50);
    }
    await sleep(5000);
    return await look(agent);
  } finally {
    await agent.stop();
    await api?.stop();
    await c.stop();
    await rm(s.dir, { recursive: true, force: true });
  }
}

/** RSS of an agent with no sets and metrics served, 5 s after its first reconcile; with `withApi`, watching an API server. */
export function idleEmptyRun(runner: AgentRunner, mirrors: Record<string, string>, withApi: boolean): Promise<number> {
  return idleAgent(runner, mirrors, withApi, async (agent) => procStatus(agent.child.pid!).rssKb / 1024);
}

export interface ApiSetRun {
  peakMb: number;
  idleMb: number;
  readyMs: number;
  /** The agent's CPU time over its whole run: start, the set's pulls, 3 no-op resyncs. */
  cpuMs: number;
}

/**
 * An N-image set from the in-process API server on the CRI-O stand-in node
 * (D-Bus reload), as on a cluster node: VmHWM from start until the set is
 * Ready and 3 resyncs later, and VmRSS then. The images are in the loopback
 * registry too, reached through a registries.conf, so the agent's size
 * estimate before pulling gets real answers (the stand-in itself "pulls"
 * from its catalogue). `look`, if given, reads the agent before it stops.
 */
export async function apiSetRun(runner: AgentRunner, refs: string[], registry: Registry, extra: string[] = [], look?: (agent: AgentProcess, metricsUrl: string) => Promise<void>): Promise<ApiSetRun> {
  const node = await startCrioNode({ catalogue: Object.fromEntries(refs.map((r) => [r, { size: 1000 }])) });
  const api = await ApiServer.start();
  const s = await scratch();
  api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'bench-node', labels: {} } });
  api.create(setDoc('bench-n', refs) as unknown as KubeObject);
  const conf = path.join(s.dir, 'registries.conf');
  await writeFile(conf, `[[registry]]\nprefix = "registry.test"\nlocation = "${registry.host}"\ninsecure = true\n`);
  const flags = agentFlags({ ...s, dropinDir: node.dropInDir }, node.endpoint, [
    '--reload', 'dbus', '--resync-interval', '2s', '--metrics-addr', '127.0.0.1:0', '--kubeconfig', await api.writeKubeconfig(s.dir),
    '--registries-conf', conf, '--registries-conf-dir', path.join(s.dir, 'registries.conf.d'), ...extra,
  ]);
  const t0 = Date.now();
  const agent = AgentProcess.start(flags, { env: { ...node.env, ...runner.env }, cli: runner.cli, nodeArgs: runner.nodeArgs });
  try {
    const ready = await agent.waitForLog((l) => (l.phases as Record<string, number> | undefined)?.Ready === 1 && l.msg === 'reconcile finished', 5 * 60_000, 'the set Ready');
    const readyMs = logTime(ready) - t0;
    let from = agent.mark();
    for (let i = 0; i < 3; i++) {
      await agent.waitForReconcile(from, 60_000);
      from = agent.mark();
    }
    const st = procStatus(agent.child.pid!);
    const run = { peakMb: st.hwmKb / 1024, idleMb: st.rssKb / 1024, readyMs, cpuMs: cpuMs(agent.child.pid) };
    await look?.(agent, String(agent.logs().find((l) => l.msg === 'health and metrics listening')?.url));
    return run;
  } finally {
    await agent.stop();
    await api.stop();
    await node.stop();
    await rm(s.dir, { recursive: true, force: true });
  }
}

/** `pinset agent --once` whole process, from spawn to exit, with every image of the set already in containerd. */
export async function onceAllPresentRun(runner: AgentRunner, mirrors: Record<string, string>, refs: string[]): Promise<number> {
  const c = await Containerd.start({ mirrors });
  const s = await scratch();
  try {
    const cri = new CriClient(c.endpoint);
    try {
      for (const ref of refs) await cri.pullImage(ref);
    } finally {
      cri.close();
    }
    await writeFile(path.join(s.staticDir, 'bench.yaml'), dumpYaml(setDoc('bench', refs)));
    await settle();
    const t0 = performance.now();
    const r = await runAgentOnce(agentFlags(s, c.endpoint), { env: runner.env, cli: runner.cli, nodeArgs: runner.nodeArgs });
    const ms = performance.now() - t0;
    if (r.code !== 0) throw new Error(`agent --once exited ${r.code}:\n${r.stderr.slice(-3000)}`);
    if (parseLines(r.stderr).some((l) => l.msg === 'pulling image')) throw new Error('--once pulled although every image was present');
    return ms;
  } finally {
    await c.stop();
    await rm(s.dir, { recursive: true, force: true });
  }
}
