// What the agent makes of the sets' CRD going away (src/agent/crd-check.ts):
// sets deleted with their CRD are not sets deleted by their owners, so the
// pins stay; the node status (pinsKept) and a log line say why and how to
// unpin. A CRD missing when the agent starts keeps the pins its file holds.
// A set deleted while the CRD stands is unpinned, as always, once the CRD
// has been read. The agent runs as its own process against the in-process
// API server (which deletes CRDs as the real one does:
// test/integration/apiserver-crd.test.ts) and the CRI-O stand-in.
import { afterEach, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseNodeStatus } from '../../src/api/node-status.ts';
import { CRD_NAME, STATUS_ANNOTATION, type NodeStatus } from '../../src/api/types.ts';
import { ApiServer, type KubeObject } from '../support/apiserver.ts';
import { startCrioNode, type CrioNode } from '../support/crio-node.ts';
import { AgentProcess, readPinFile } from '../support/agent-process.ts';

const NODE = 'node-1';
const img = (repo: string, c: string) => `registry.test/${repo}@sha256:${c.repeat(64)}`;
const A = img('team-a/web', 'a');
const B = img('team-b/api', 'b');
const CRDS = '/apis/apiextensions.k8s.io/v1/customresourcedefinitions';

const set = (name: string, images: string[]): KubeObject => ({
  apiVersion: 'pinset.dev/v1alpha1',
  kind: 'PinnedImageSet',
  metadata: { name },
  spec: { pinnedImages: images.map((n) => ({ name: n })) },
});

let api: ApiServer;
let node: CrioNode;
let dir: string;
let agent: AgentProcess | undefined;
let kubeconfig: string;

function status(): NodeStatus | undefined {
  return parseNodeStatus(api.get('nodes', NODE)?.metadata.annotations?.[STATUS_ANNOTATION]).status;
}

function start(): AgentProcess {
  agent = AgentProcess.start(
    [
      '--node-name', NODE,
      '--kubeconfig', kubeconfig,
      '--static-dir', join(dir, 'sets.d'),
      '--cri-endpoint', node.endpoint,
      '--crio-dropin-dir', node.dropInDir,
      '--state-dir', node.stateDir,
      '--reload', 'dbus',
      '--auth-file', join(dir, 'no-auth.json'),
      '--metrics-addr', '',
    ],
    { env: node.env },
  );
  return agent;
}

async function call(method: string, path: string, body?: unknown): Promise<number> {
  const res = await fetch(api.url + path, { method, headers: body ? { 'Content-Type': 'application/json' } : {}, body: body ? JSON.stringify(body) : undefined });
  await res.arrayBuffer();
  return res.status;
}

async function bothReady(): Promise<void> {
  await api.waitFor(() => status()?.sets.length === 2 && status()!.sets.every((s) => s.phase === 'Ready'), 20_000, `both sets Ready (now ${JSON.stringify(status())})`);
}

beforeEach(async () => {
  api = await ApiServer.start({ bookmarkIntervalMs: 1000, crdTeardownMs: 100 });
  node = await startCrioNode({ catalogue: { [A]: { size: 1000 }, [B]: { size: 1000 } } });
  dir = await mkdtemp(join(tmpdir(), 'pinset-agent-crd-'));
  await mkdir(join(dir, 'sets.d'));
  kubeconfig = await api.writeKubeconfig(dir);
  api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: NODE } });
});

afterEach(async () => {
  if (agent) assert.equal(await agent.stop(), 0, 'the agent exits 0 on SIGTERM');
  agent = undefined;
  await node.stop();
  await api.stop();
  await rm(dir, { recursive: true, force: true });
});

describe('the agent and the sets\' CRD', () => {
  test('the CRD deleted: its sets go with it and the pins stay; the status and the log say why and how to unpin; the CRD created again with no sets, they go', async () => {
    const crd = api.get('customresourcedefinitions', CRD_NAME)!;
    api.create(set('a', [A]));
    api.create(set('b', [B]));
    const a = start();
    await bothReady();
    assert.equal(status()!.pins, 2, 'the status counts the pins');

    assert.equal(await call('DELETE', `${CRDS}/${CRD_NAME}`), 200);
    await api.waitFor(() => !api.get('customresourcedefinitions', CRD_NAME), 10_000, 'the CRD gone');
    const kept = (await api.waitFor(() => status()?.pinsKept, 20_000, 'pinsKept in the node status'))!;
    assert.match(kept, /^2 pin\(s\) kept that no set asks for now: the CustomResourceDefinition pinnedimagesets\.pinset\.dev is (being deleted|not installed)/);
    assert.match(kept, /`pinset uninstall`, or `pinset agent --drop-pins` on this node/);
    assert.equal(status()!.pins, 2);
    assert.deepEqual((await readPinFile(node.dropInDir))?.pins, [A, B].sort(), 'the pin file keeps both');
    assert.equal(node.crio.image(A)?.pinned, true, 'CRI-O still reports them pinned');
    assert.equal(node.crio.image(B)?.pinned, true);
    const line = await a.waitForLog((l) => l.msg === 'observation incomplete: keeping current pins', 10_000, 'the incomplete-observation log line');
    assert.match(JSON.stringify(line.why), /pinnedimagesets\.pinset\.dev is (being deleted|not installed)/);
    // Whether the agent reads the CRD while it is being deleted or once it is gone depends on timing; either way it says so.
    await a.waitForLog((l) => l.crd === CRD_NAME && /is (being deleted|not installed)/.test(String(l.msg)), 10_000, 'a log line naming the CRD');

    // The CRD back, with no set in it: a real observation of no sets.
    const { status: _s, ...again } = crd;
    assert.equal(await call('POST', CRDS, { ...again, metadata: { name: CRD_NAME } }), 201);
    await api.waitFor(async () => (await readPinFile(node.dropInDir)) === null, 40_000, 'the pin file removed once the CRD stands with no sets');
    await api.waitFor(() => status()?.pins === 0 && status()?.pinsKept === undefined, 10_000, `pins 0 in the status (now ${JSON.stringify(status())})`);
    assert.equal(node.crio.image(A)?.pinned, false);
  });

  test('the CRD missing when the agent starts: the pins its file holds stay, and the status says the CRD is not installed', async () => {
    api.create(set('a', [A]));
    api.create(set('b', [B]));
    const first = start();
    await bothReady();
    assert.equal(await first.stop(), 0);
    agent = undefined;
    api.remove('customresourcedefinitions', CRD_NAME); // gone whole, as if never installed
    await api.waitFor(async () => (await call('GET', '/apis/pinset.dev/v1alpha1/pinnedimagesets')) === 404, 5_000, 'the type not served');

    const second = start();
    const kept = (await api.waitFor(() => status()?.pinsKept, 20_000, 'pinsKept in the node status'))!;
    assert.match(kept, /the CustomResourceDefinition pinnedimagesets\.pinset\.dev is not installed, so the sets cannot be listed; the pins stay/);
    await second.waitForLog((l) => l.msg === 'reconcile finished', 10_000, 'a reconcile');
    assert.deepEqual((await readPinFile(node.dropInDir))?.pins, [A, B].sort());
    assert.equal(node.crio.image(A)?.pinned, true);
  });

  test('a set deleted while the CRD stands: the CRD is read, and the set is unpinned', async () => {
    api.create(set('a', [A]));
    api.create(set('b', [B]));
    start();
    await bothReady();
    const reads = () => api.requests.filter((r) => r.method === 'GET' && r.path === `${CRDS}/${CRD_NAME}`).length;
    const before = reads();
    await call('DELETE', '/apis/pinset.dev/v1alpha1/pinnedimagesets/b');
    await api.waitFor(async () => JSON.stringify((await readPinFile(node.dropInDir))?.pins) === JSON.stringify([A]), 20_000, 'b unpinned');
    assert.ok(reads() > before, 'the CRD was read after the deletion');
    await api.waitFor(() => status()?.pins === 1 && status()?.pinsKept === undefined, 10_000, 'pins 1, none kept');
    assert.equal(node.crio.image(B)?.pinned, false);
    assert.equal(node.crio.image(A)?.pinned, true);
  });
});
