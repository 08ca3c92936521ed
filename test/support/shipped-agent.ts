// The agent's container as `kubectl kustomize deploy/` renders it, run as
// a process on a node made of temporary folders: exactly its args and the
// literal values of its env, with every path the pod would see through a
// hostPath mount (in an env value, or a flag's default) put where that host
// path is under the test's host root. NODE_NAME comes from the test (the
// downward API), and metrics are off or on a free loopback port (9402 may be
// taken here). Nothing else is added.
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { parseAllDocuments } from 'yaml';
import { AGENT_FLAGS } from '../../src/agent/agent-flags.ts';
import { findBinary } from './components.ts';
import { DEPLOY_DIR } from './real-node-deploy.ts';

const run = promisify(execFile);

export interface ShippedMount {
  mountPath: string;
  hostPath: string;
  hostPathType: string;
  readOnly: boolean;
}

export interface ShippedAgent {
  args: string[];
  /** The env entries with a literal value, in order. */
  env: Record<string, string>;
  /** The env entries filled in by the downward API (the test gives them). */
  fromPod: string[];
  mounts: ShippedMount[];
}

/** kubectl, to render the kustomization; undefined when it is not installed. */
export function kubectlPath(): string | undefined {
  return existsSync('/usr/bin/kubectl') ? '/usr/bin/kubectl' : (findBinary('kubectl') ?? undefined);
}

/** The agent container of the DaemonSet that `kubectl kustomize <dir>` renders (default deploy/). */
export async function shippedAgent(dir = DEPLOY_DIR): Promise<ShippedAgent> {
  const kubectl = kubectlPath();
  if (!kubectl) throw new Error('kubectl is not installed: the DaemonSet cannot be rendered');
  const { stdout } = await run(kubectl, ['kustomize', dir], { maxBuffer: 16 << 20 });
  const ds = parseAllDocuments(stdout)
    .map((d) => d.toJS())
    .find((o) => o?.kind === 'DaemonSet' && o.metadata?.name === 'pinset-agent');
  if (!ds) throw new Error(`kubectl kustomize ${dir} renders no pinset-agent DaemonSet`);
  const spec = ds.spec.template.spec;
  const c = spec.containers.find((x: { name: string }) => x.name === 'agent');
  const volumes = new Map<string, { path: string; type?: string }>((spec.volumes ?? []).map((v: { name: string; hostPath?: { path: string; type?: string } }) => [v.name, v.hostPath]));
  const mounts: ShippedMount[] = (c.volumeMounts ?? []).map((m: { name: string; mountPath: string; readOnly?: boolean }) => {
    const hp = volumes.get(m.name);
    if (!hp) throw new Error(`mount ${m.mountPath} is not a hostPath volume`);
    return { mountPath: m.mountPath, hostPath: hp.path, hostPathType: hp.type ?? '', readOnly: m.readOnly === true };
  });
  const env: Record<string, string> = {};
  const fromPod: string[] = [];
  for (const e of c.env ?? []) {
    if (typeof e.value === 'string') env[e.name] = e.value;
    else fromPod.push(e.name);
  }
  return { args: c.args ?? [], env, fromPod, mounts };
}

/**
 * A path as the pod sees it, put where the test's node keeps it: under the
 * mount that holds it, as `hostRoot` + the host path. A folder that only
 * holds mounts (the host root itself, /host) maps to `hostRoot` when each
 * mount under it is that folder + its host path. Other paths stay.
 */
export function onTestNode(p: string, mounts: readonly ShippedMount[], hostRoot: string): string {
  const m = mounts.find((x) => p === x.mountPath || p.startsWith(`${x.mountPath}/`));
  if (m) return path.join(hostRoot, m.hostPath, p.slice(m.mountPath.length));
  const under = mounts.filter((x) => x.mountPath.startsWith(`${p}/`));
  if (under.length > 0 && under.every((x) => x.mountPath === path.join(p, x.hostPath))) return hostRoot;
  return p;
}

/**
 * The environment that runs the shipped container's args on a test node:
 * its env values, and the defaults of the agent's flags that the pod sees
 * through a mount, moved under `hostRoot`.
 */
export function shippedEnv(a: ShippedAgent, hostRoot: string, pod: Record<string, string>): Record<string, string> {
  const env: Record<string, string> = {};
  for (const name of a.fromPod) {
    if (pod[name] === undefined) throw new Error(`the test gives no value for ${name}, which the pod gets from the downward API`);
    env[name] = pod[name]!;
  }
  for (const [k, v] of Object.entries(a.env)) env[k] = v.startsWith('/') ? onTestNode(v, a.mounts, hostRoot) : v;
  for (const f of AGENT_FLAGS) {
    if (!f.env || f.env in env || typeof f.default !== 'string' || !f.default.startsWith('/')) continue;
    const moved = onTestNode(f.default, a.mounts, hostRoot);
    if (moved !== f.default) env[f.env] = moved;
  }
  return env;
}
