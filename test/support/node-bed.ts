// One node for agent-as-a-process scenarios: the in-process API server with
// this Node, the CRI-O stand-in behind a private D-Bus (crio-node.ts), and a
// temporary folder with a static set folder. Agents started through `start`
// are tracked and stopped by `stop`; `agent` is the last one started.
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { STATUS_ANNOTATION, type NodeSetStatus, type NodeStatus } from '../../src/api/types.ts';
import { parseNodeStatus } from '../../src/api/node-status.ts';
import { AgentProcess } from './agent-process.ts';
import { ApiServer, type KubeObject } from './apiserver.ts';
import { startCrioNode, type CrioNode } from './crio-node.ts';
import type { CatalogueImage, FakeCrioOptions } from './fake-crio.ts';

export const NODE = 'node-1';

export function setObject(name: string, images: string[], selector?: object): KubeObject {
  return {
    apiVersion: 'pinset.dev/v1alpha1',
    kind: 'PinnedImageSet',
    metadata: { name },
    spec: { ...(selector ? { nodeSelector: selector } : {}), pinnedImages: images.map((n) => ({ name: n })) },
  };
}

export interface NodeBed {
  api: ApiServer;
  node: CrioNode;
  dir: string;
  staticDir: string;
  kubeconfig: string;
  agents: AgentProcess[];
  /** The agent started last, if any. */
  readonly agent: AgentProcess | undefined;
  /** Flags for an agent of this node; `staticDir` and `dropInDir` replace those folders, `api: false` leaves the API out. */
  args(extra?: string[], opts?: AgentOpts): string[];
  start(extra?: string[], opts?: AgentOpts & { env?: NodeJS.ProcessEnv }): AgentProcess;
  status(): NodeStatus | null;
  setStatus(name: string): NodeSetStatus | undefined;
  /** Waits for the set's status to satisfy `pred`; on timeout the error shows the status and the last agent's last log lines. */
  waitForSet(name: string, pred: (s: NodeSetStatus) => boolean, what: string, timeoutMs?: number): Promise<NodeSetStatus>;
  /** The Events recorded with this reason. */
  events(reason: string): { reason?: string; message?: string }[];
  stop(): Promise<void>;
}

interface AgentOpts {
  staticDir?: string;
  dropInDir?: string;
  api?: boolean;
}

export async function makeNodeBed(
  opts: {
    catalogue: Record<string, CatalogueImage>;
    /** The agents' `--resync-interval` (2s). */
    resyncInterval?: string;
  } & Omit<FakeCrioOptions, 'dropInDir' | 'catalogue'>,
): Promise<NodeBed> {
  const { resyncInterval = '2s', ...crioOpts } = opts;
  const api = await ApiServer.start({ bookmarkIntervalMs: 1000 });
  const node = await startCrioNode(crioOpts);
  const dir = await mkdtemp(join(tmpdir(), 'pinset-bed-'));
  const staticDir = join(dir, 'sets.d');
  await mkdir(staticDir);
  const kubeconfig = await api.writeKubeconfig(dir);
  api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: NODE, labels: { 'node-role.kubernetes.io/worker': '' } } });
  const b: NodeBed = {
    api,
    node,
    dir,
    staticDir,
    kubeconfig,
    agents: [],
    get agent() {
      return b.agents.at(-1);
    },
    args: (extra = [], o = {}) => [
      '--node-name', NODE,
      ...(o.api === false ? [] : ['--kubeconfig', kubeconfig]),
      '--static-dir', o.staticDir ?? staticDir,
      '--cri-endpoint', node.endpoint,
      '--crio-dropin-dir', o.dropInDir ?? node.dropInDir,
      '--state-dir', node.stateDir,
      '--reload', 'dbus',
      '--auth-file', join(dir, 'no-auth.json'),
      '--metrics-addr', '',
      '--resync-interval', resyncInterval,
      ...extra,
    ],
    start(extra = [], o = {}) {
      const a = AgentProcess.start(b.args(extra, o), { env: { ...node.env, ...o.env } });
      b.agents.push(a);
      return a;
    },
    status() {
      const n = api.get('nodes', NODE);
      const raw = (n?.metadata as { annotations?: Record<string, string> } | undefined)?.annotations?.[STATUS_ANNOTATION];
      return parseNodeStatus(raw).status ?? null;
    },
    setStatus(name) {
      return b.status()?.sets.find((s) => s.name === name);
    },
    async waitForSet(name, pred, what, timeoutMs = 20_000) {
      return (await api.waitFor(
        (): NodeSetStatus | undefined => {
          const s = b.setStatus(name);
          return s && pred(s) ? s : undefined;
        },
        timeoutMs,
        `${name}: ${what} (now ${JSON.stringify(b.setStatus(name))})\n${b.agent?.logs().slice(-12).map((l) => JSON.stringify(l)).join('\n')}`,
      )) as NodeSetStatus;
    },
    events(reason) {
      return (api.list('events', { namespace: 'default' }) as { reason?: string; message?: string }[]).filter((e) => e.reason === reason);
    },
    async stop() {
      for (const a of b.agents) if (a.running) await a.stop();
      await node.stop();
      await api.stop();
      await rm(dir, { recursive: true, force: true });
    },
  };
  return b;
}
