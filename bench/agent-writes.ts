// Writes of the node status annotation per set rollout, per node, from real
// agents: BENCH_AGENT_NODES (3) `pinset agent` processes, each with its own
// CRI-O stand-in behind a private D-Bus (test/support/crio-node.ts), on one
// in-process API server of their own. Each pull takes a set time
// (the stand-in's delayPulls) and the agents pull one image at a time, so a
// rollout lasts as long as asked. Counted: the agents' PATCHes of their own
// Node from the set's creation (or its new generation) until every node
// reports it Ready, and a second after.
//
//   node bench/agent-writes.ts        # about 4 minutes; also a part of bench/scale.ts
//
// Rollouts: a new set of 6 images pulled in about 20 s; a new generation of
// it adding 6 images pulled in about 90 s (over a minute: one progress
// update is due); and a new set with maxConcurrentNodes 1, so the nodes take
// turns (a waiting node reports WaitingForRolloutSlot first).
import { createHash } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { parseNodeStatus } from '../src/api/node-status.ts';
import { API_VERSION, KIND, STATUS_ANNOTATION } from '../src/api/types.ts';
import { AgentProcess } from '../test/support/agent-process.ts';
import { ApiServer } from '../test/support/apiserver.ts';
import { startCrioNode, type CrioNode } from '../test/support/crio-node.ts';

const AGENT_NODES = Number(process.env.BENCH_AGENT_NODES ?? 3);
const image = (name: string, i: number) => `registry.test/bench/${name}-${i}@sha256:${createHash('sha256').update(`${name}-${i}`).digest('hex')}`;

export interface RolloutWrites {
  rollout: string;
  /** Seconds from the change to every node Ready. */
  seconds: number;
  /** Annotation writes by each node. */
  writesPerNode: number[];
  /** The phases and reasons each node wrote, in order (node 0's, as an example). */
  firstNodeReports: string[];
}

export async function measureAgentWrites(say: (line: string) => void = (l) => process.stdout.write(`${l}\n`)): Promise<RolloutWrites[]> {
  const api = await ApiServer.start();
  const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-bench-agents-'));
  const nodes: CrioNode[] = [];
  const agents: AgentProcess[] = [];
  const names = Array.from({ length: AGENT_NODES }, (_, i) => `agent-node-${i}`);
  const all = [...['first', 'second'].flatMap((n) => Array.from({ length: 6 }, (_, i) => image(n, i))), ...Array.from({ length: 6 }, (_, i) => image('turns', i))];
  const out: RolloutWrites[] = [];
  try {
    const kubeconfig = await api.writeKubeconfig(dir);
    for (const name of names) {
      const node = await startCrioNode({ catalogue: Object.fromEntries(all.map((r) => [r, { size: 1000 }])) });
      nodes.push(node);
      api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name, labels: { role: 'worker' } } });
      agents.push(
        AgentProcess.start(
          [
            '--node-name', name,
            '--kubeconfig', kubeconfig,
            '--static-dir', path.join(dir, `${name}-sets.d`),
            '--cri-endpoint', node.endpoint,
            '--crio-dropin-dir', node.dropInDir,
            '--state-dir', node.stateDir,
            '--reload', 'dbus',
            '--auth-file', path.join(dir, 'no-auth.json'),
            '--metrics-addr', '',
            '--max-parallel-pulls', '1',
            '--rollout-lease-duration', '10s',
          ],
          { env: node.env },
        ),
      );
    }
    const entryOn = (node: string, set: string) => parseNodeStatus(api.get('nodes', node)?.metadata.annotations?.[STATUS_ANNOTATION]).status?.sets.find((s) => s.name === set);
    await api.waitFor(() => names.every((n) => api.get('nodes', n)?.metadata.annotations?.[STATUS_ANNOTATION]), 60_000, 'every agent reporting');

    const rollout = async (label: string, set: string, pullMs: number, change: () => { generation: number }) => {
      for (const n of nodes) n.crio.delayPulls(pullMs);
      const patches = (node: string, from: number) =>
        api.requests.slice(from).filter((r) => r.method === 'PATCH' && r.path === `/api/v1/nodes/${node}` && r.status === 200);
      const from = api.requests.length;
      const started = Date.now();
      const { generation } = change();
      await api.waitFor(
        () => names.every((n) => {
          const e = entryOn(n, set);
          return e?.phase === 'Ready' && e.currentGeneration === generation;
        }),
        10 * 60_000,
        `${label}: every node Ready`,
      );
      const seconds = Math.round((Date.now() - started) / 1000);
      await new Promise((r) => setTimeout(r, 1000));
      const writesPerNode = names.map((n) => patches(n, from).length);
      const firstNodeReports = patches(names[0]!, from).map((r) => {
        const raw = (r.body as { metadata?: { annotations?: Record<string, string> } }).metadata?.annotations?.[STATUS_ANNOTATION];
        const e = parseNodeStatus(raw).status?.sets.find((s) => s.name === set);
        return e ? `${e.phase}/${e.reason}` : 'other';
      });
      say(`${label}: ${seconds} s to every node Ready; annotation writes per node ${writesPerNode.join(', ')} (${names[0]}: ${firstNodeReports.join(' -> ')})`);
      out.push({ rollout: label, seconds, writesPerNode, firstNodeReports });
    };

    const first = Array.from({ length: 6 }, (_, i) => image('first', i));
    await rollout('a new set, 6 images, about 20 s of pulls', 'writes', 3_300, () => {
      api.create({ apiVersion: API_VERSION, kind: KIND, metadata: { name: 'writes' }, spec: { pinnedImages: first.map((name) => ({ name })) } });
      return { generation: 1 };
    });
    await rollout('a new generation adding 6 images, about 90 s of pulls', 'writes', 15_000, () => {
      const second = Array.from({ length: 6 }, (_, i) => image('second', i));
      return { generation: api.patch('pinnedimagesets', 'writes', { spec: { pinnedImages: [...first, ...second].map((name) => ({ name })) } }).metadata.generation! };
    });
    await rollout(`a new set with maxConcurrentNodes 1 (${AGENT_NODES} nodes in turn, about 20 s each)`, 'turns', 3_300, () => {
      api.create({
        apiVersion: API_VERSION,
        kind: KIND,
        metadata: { name: 'turns' },
        spec: { rollout: { maxConcurrentNodes: 1 }, pinnedImages: Array.from({ length: 6 }, (_, i) => ({ name: image('turns', i) })) },
      });
      return { generation: 1 };
    });
    return out;
  } finally {
    for (const a of agents) await a.stop();
    for (const n of nodes) await n.stop();
    await api.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

if (import.meta.main) {
  measureAgentWrites().catch((err: unknown) => {
    process.stderr.write(`bench: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exitCode = 1;
  });
}
