// spec.rollout.maxConcurrentNodes with real agent processes: three nodes
// (each an agent process with its own CRI-O stand-in and systemd on a
// private D-Bus) share the in-process API server. The set allows one node
// at a time: only one node downloads while the others report
// WaitingForRolloutSlot; each frees its slot when done, and all end Ready
// with no slot Lease left behind.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ApiServer } from '../support/apiserver.ts';
import { startCrioNode, type CrioNode } from '../support/crio-node.ts';
import { AgentProcess } from '../support/agent-process.ts';
import { parseNodeStatus } from '../../src/api/node-status.ts';
import { STATUS_ANNOTATION, type NodeSetStatus } from '../../src/api/types.ts';
import { SLOT_SET_LABEL } from '../../src/rollout/slots.ts';

const img = (repo: string, c: string) => `registry.test/${repo}@sha256:${c.repeat(64)}`;
const IMAGES = [img('fleet/app', 'a'), img('fleet/db', 'b')];
const NAMES = ['node-0', 'node-1', 'node-2'];

let api: ApiServer;
let dir: string;
let kubeconfig: string;
const nodes = new Map<string, CrioNode>();
const agents = new Map<string, AgentProcess>();

function setOn(node: string): NodeSetStatus | undefined {
  const raw = api.get('nodes', node)?.metadata.annotations?.[STATUS_ANNOTATION];
  return parseNodeStatus(raw).status?.sets.find((s) => s.name === 'fleet');
}

before(async () => {
  api = await ApiServer.start({ bookmarkIntervalMs: 1000 });
  dir = await mkdtemp(join(tmpdir(), 'pinset-rollout-it-'));
  kubeconfig = await api.writeKubeconfig(dir);
  for (const name of NAMES) {
    const node = await startCrioNode({ catalogue: Object.fromEntries(IMAGES.map((r) => [r, { size: 1000 }])) });
    node.crio.holdPulls();
    nodes.set(name, node);
    api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name, labels: { role: 'worker' } } });
  }
});

after(async () => {
  for (const [name, a] of agents) assert.equal(await a.stop(), 0, `${name} exits 0 on SIGTERM`);
  for (const n of nodes.values()) {
    n.crio.releasePulls();
    await n.stop();
  }
  await api.stop();
  await rm(dir, { recursive: true, force: true });
});

describe('maxConcurrentNodes 1 across three agent processes', () => {
  test('one node downloads at a time, the others wait for the slot; all end Ready', async () => {
    api.create({
      apiVersion: 'pinset.dev/v1alpha1',
      kind: 'PinnedImageSet',
      metadata: { name: 'fleet' },
      spec: { nodeSelector: { matchLabels: { role: 'worker' } }, rollout: { maxConcurrentNodes: 1 }, pinnedImages: IMAGES.map((name) => ({ name })) },
    });
    for (const name of NAMES) {
      const n = nodes.get(name)!;
      const args = [
        '--node-name', name,
        '--kubeconfig', kubeconfig,
        '--static-dir', join(dir, `${name}-sets.d`),
        '--cri-endpoint', n.endpoint,
        '--crio-dropin-dir', n.dropInDir,
        '--state-dir', n.stateDir,
        '--reload', 'dbus',
        '--auth-file', join(dir, 'no-auth.json'),
        '--metrics-addr', '',
        '--rollout-lease-duration', '3s',
      ];
      agents.set(name, AgentProcess.start(args, { env: n.env }));
    }

    const done: string[] = [];
    for (let round = 0; round < NAMES.length; round++) {
      // Exactly one of the nodes not done yet gets the slot and starts downloading.
      const holder: string = await api.waitFor(
        () => NAMES.find((n) => !done.includes(n) && nodes.get(n)!.crio.heldPulls().length > 0) ?? '',
        30_000,
        `round ${round}: a node downloading`,
      );
      const others = NAMES.filter((n) => n !== holder && !done.includes(n));
      for (const n of others) {
        const s = await api.waitFor(() => (setOn(n)?.reason === 'WaitingForRolloutSlot' ? setOn(n) : undefined), 30_000, `${n} reports WaitingForRolloutSlot`);
        assert.equal(s!.phase, 'Progressing');
        assert.match(s!.message!, /at most 1 node\(s\) download this set at a time/);
      }
      // While the holder's downloads are held, nobody else has asked CRI-O for anything to pull.
      for (const n of others) assert.equal(nodes.get(n)!.crio.pullCount(), 0, `${n} must not download while ${holder} holds the slot`);
      const slots = api.list('leases', { namespace: 'pinset-system', labelSelector: `${SLOT_SET_LABEL}=fleet` });
      assert.deepEqual(slots.map((l) => [l.metadata.name, (l.spec as { holderIdentity: string }).holderIdentity]), [['fleet-0', holder]]);

      nodes.get(holder)!.crio.releasePulls();
      await api.waitFor(() => setOn(holder)?.phase === 'Ready', 30_000, `${holder} Ready`);
      done.push(holder);
    }

    assert.deepEqual([...done].sort(), NAMES);
    for (const n of NAMES) assert.equal(nodes.get(n)!.crio.pullCount(), IMAGES.length, `${n} pulled each image once`);
    await api.waitFor(() => api.list('leases', { namespace: 'pinset-system' }).length === 0, 10_000, 'every slot freed');
  });
});
