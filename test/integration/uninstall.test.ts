// `pinset uninstall` (src/cli/uninstall.ts) as a user runs it, on the
// in-process API server holding what deploy/ installs, with two agents as
// real processes: one on the CRI-O stand-in (its drop-in, reloads over a
// private D-Bus), one on the containerd twin (image labels). Each test
// starts them afresh, with one set that selects every node, Ready on both.
// The agents are not stopped by the DaemonSet's deletion here (no
// daemonset controller runs): what they do after it is what an agent in
// its grace period would do.
import { afterEach, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { OWN_LABEL } from '../../src/containerd/label-pins.ts';
import { parseNodeStatus } from '../../src/api/node-status.ts';
import { CRD_NAME, STATUS_ANNOTATION, type NodeStatus } from '../../src/api/types.ts';
import { readManifests, describeObject, type ManifestObject } from '../../src/cli/manifests.ts';
import { ApiServer, type ResourceName } from '../support/apiserver.ts';
import { startCrioNode, type CrioNode } from '../support/crio-node.ts';
import { startFakeContainerd, type FakeContainerd } from '../support/fake-containerd.ts';
import { AgentProcess, readPinFile, runPinset } from '../support/agent-process.ts';
import { installManifests } from '../support/installed.ts';

const hex = () => randomBytes(32).toString('hex');
const X = `registry.test/fleet/app@sha256:${hex()}`;
const Y = `registry.test/fleet/db@sha256:${hex()}`;
const ID = { [X]: `sha256:${hex()}`, [Y]: `sha256:${hex()}` };

/** The plural each kind of deploy/ is served as by the in-process server. */
const PLURALS: Record<string, ResourceName> = {
  Namespace: 'namespaces', ServiceAccount: 'serviceaccounts', DaemonSet: 'daemonsets', Deployment: 'deployments',
  Role: 'roles', RoleBinding: 'rolebindings', ClusterRole: 'clusterroles', ClusterRoleBinding: 'clusterrolebindings',
  ValidatingAdmissionPolicy: 'validatingadmissionpolicies', ValidatingAdmissionPolicyBinding: 'validatingadmissionpolicybindings',
  CustomResourceDefinition: 'customresourcedefinitions',
};

let api: ApiServer;
let dir: string;
let kubeconfig: string;
let crio: CrioNode;
let ctrd: FakeContainerd;
let manifests: ManifestObject[];
const agents: AgentProcess[] = [];

const statusOf = (node: string): NodeStatus | undefined => parseNodeStatus(api.get('nodes', node)?.metadata.annotations?.[STATUS_ANNOTATION]).status;
const stored = (o: ManifestObject) => api.get(PLURALS[o.kind]!, o.name, o.namespace);
const ownLabelled = () => ctrd.recordNames().filter((n) => OWN_LABEL in ctrd.record(n)!.labels);

function common(node: string): string[] {
  return ['--node-name', node, '--kubeconfig', kubeconfig, '--static-dir', join(dir, `${node}-sets.d`), '--auth-file', join(dir, 'no-auth.json'), '--metrics-addr', '', '--resync-interval', '10s'];
}

async function uninstall(...args: string[]) {
  return await runPinset(['uninstall', '--kubeconfig', kubeconfig, ...args], { timeoutMs: 120_000 });
}

beforeEach(async () => {
  api = await ApiServer.start({ bookmarkIntervalMs: 1000, crdTeardownMs: 100 });
  dir = await mkdtemp(join(tmpdir(), 'pinset-uninstall-'));
  kubeconfig = await api.writeKubeconfig(dir);
  manifests = (await readManifests(undefined)).objects;
  installManifests(api, manifests);
  // What Kubernetes puts in every namespace, and the controller's leader election Lease: none of them keeps the namespace.
  api.create({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'kube-root-ca.crt', namespace: 'pinset-system' }, data: { 'ca.crt': 'PEM' } });
  api.create({ apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name: 'default', namespace: 'pinset-system' } });
  api.create({ apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: 'pinset-controller', namespace: 'pinset-system' }, spec: { holderIdentity: 'pinset-controller-7d9f-abcde' } });
  for (const n of ['node-crio', 'node-ctrd', 'node-silent']) api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: n } });
  api.create({ apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name: 'fleet' }, spec: { pinnedImages: [{ name: X }, { name: Y }] } });

  crio = await startCrioNode({ catalogue: { [X]: { size: 1000 }, [Y]: { size: 1000 } } });
  ctrd = await startFakeContainerd({ version: '1.7.24', catalogue: { [X]: { size: 10, id: ID[X] }, [Y]: { size: 10, id: ID[Y] } } });
  await mkdir(join(dir, 'state-ctrd'));
  agents.push(AgentProcess.start([...common('node-crio'), '--cri-endpoint', crio.endpoint, '--crio-dropin-dir', crio.dropInDir, '--state-dir', crio.stateDir, '--reload', 'dbus'], { env: crio.env }));
  agents.push(
    AgentProcess.start([...common('node-ctrd'), '--cri-endpoint', ctrd.endpoint, '--pin-backend', 'containerd', '--state-dir', join(dir, 'state-ctrd'), '--crio-dropin-dir', join(dir, 'no-crio', 'crio.conf.d')]),
  );
  for (const n of ['node-crio', 'node-ctrd']) {
    await api.waitFor(() => statusOf(n)?.sets[0]?.phase === 'Ready' && statusOf(n)?.pins === 2, 30_000, `${n}: the set Ready with 2 pins (now ${JSON.stringify(statusOf(n))})`);
  }
});

afterEach(async () => {
  for (const a of agents.splice(0)) assert.equal(await a.stop(), 0, 'an agent exits 0 on SIGTERM');
  await crio.stop();
  await ctrd.stop();
  await api.stop();
  await rm(dir, { recursive: true, force: true });
});

describe('pinset uninstall', () => {
  test('--dry-run prints the plan (the sets, each node and its pins, the objects in order) and changes nothing', async () => {
    const r = await uninstall('--dry-run');
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /1\. Delete every PinnedImageSet: 1 \(fleet\)\./);
    assert.match(r.stdout, /2\. Wait up to 300s until every node's agent reports it holds no pins:\n {3}node-crio: 2 pins\n {3}node-ctrd: 2 pins\n {3}node-silent: no report/);
    assert.match(r.stdout, new RegExp(`3\\. Remove what the manifests install and is pinset's \\(${manifests.length} objects\\), in this order:\n {3}(DaemonSet pinset-system/pinset-agent|Deployment pinset-system/pinset-controller)\n`));
    // Every object the manifests install is in the plan, once.
    for (const o of manifests.filter((m) => m.kind !== 'Namespace')) assert.equal(r.stdout.split('\n').filter((l) => l === `   ${describeObject(o)}`).length, 1, describeObject(o));
    assert.match(r.stdout, /CustomResourceDefinition pinnedimagesets\.pinset\.dev\n {3}Namespace pinset-system: it holds only pinset's objects\nDry run: nothing was changed\.\n$/);
    assert.ok(api.get('pinnedimagesets', 'fleet'), 'the set is still there');
    for (const o of manifests) assert.ok(stored(o), `${describeObject(o)} is still there`);
    assert.deepEqual((await readPinFile(crio.dropInDir))?.pins, [X, Y].sort());
    assert.equal(ownLabelled().length, 2);
    assert.ok(!api.requests.some((q) => q.method !== 'GET' && q.userAgent.startsWith('pinset-uninstall')), 'no write');
  });

  test('sets deleted, both agents report no pins (CRI-O drop-in gone, containerd labels gone), a node whose agent is gone is named with what to do, everything removed', async () => {
    // A node whose agent went away while it held 3 pins: its last report stays.
    const gone = { version: 2, pinFile: '99-pinset-x.conf', updatedAt: new Date(Date.now() - 600_000).toISOString().replace(/\.\d+Z$/, 'Z'), sets: [{ name: 'fleet', gen: 1, phase: 'Ready', images: [3, 3, 3] }], pins: 3 };
    api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'node-gone', annotations: { [STATUS_ANNOTATION]: JSON.stringify(gone) } } });

    const r = await uninstall('--wait-timeout', '8s');
    assert.equal(r.code, 1, `a node still holds pins: exit 1\n${r.stdout}\n${r.stderr}`);
    assert.match(r.stdout, /Deleted 1 PinnedImageSet\./);
    assert.match(r.stdout, /^node-crio: no pins \(\d+\.\ds\)$/m);
    assert.match(r.stdout, /^node-ctrd: no pins \(\d+\.\ds\)$/m);
    assert.match(r.stdout, /1 node still holds pins after 8s \(named below\); removing pinset all the same\./);
    assert.match(r.stdout, /No pinset agent has reported from 1 node, so none is known to hold pins there: node-silent\./);
    assert.match(r.stdout, /1 node may still hold pinset's pins, and no agent is left to remove them:\n {2}node-gone: 3 pins: it still reports 1 set\(s\) \(report 10m old\)\nOn node-gone: run `pinset agent --drop-pins` as root on the node, with its agent's --cri-endpoint, --crio-dropin-dir/);
    assert.match(r.stdout, /deploy\/drop-pins\/crio\.yaml/);
    assert.match(r.stdout, /The agents' and the controller's pods are gone \(\d+\.\ds\)\./);

    // What the runtimes report: nothing pinned any more.
    assert.equal(await readPinFile(crio.dropInDir), null, 'the CRI-O drop-in is gone');
    assert.equal(crio.crio.image(X)?.pinned, false);
    assert.equal(crio.crio.image(Y)?.pinned, false);
    assert.deepEqual(ownLabelled(), [], 'no containerd record carries pinset\'s label');
    assert.equal(ctrd.criPinned(X), false);
    assert.equal(ctrd.criPinned(Y), false);
    assert.equal(statusOf('node-crio')?.pins, 0);
    assert.equal(statusOf('node-ctrd')?.pins, 0);

    // Everything the manifests install is gone, the agents first, the CRD and the namespace last.
    await api.waitFor(() => !api.get('customresourcedefinitions', CRD_NAME), 5_000, 'the CRD gone once its finalizer ran');
    for (const o of manifests) assert.equal(stored(o), undefined, `${describeObject(o)} removed`);
    for (const o of manifests) assert.match(r.stdout, new RegExp(`Removed ${describeObject(o).replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')}\\.`));
    const deletes = api.requests.filter((q) => q.method === 'DELETE' && q.userAgent.startsWith('pinset-uninstall')).map((q) => q.path);
    assert.match(deletes[0]!, /pinnedimagesets\/fleet$/, 'the set first');
    const at = (re: RegExp) => deletes.findIndex((p) => re.test(p));
    assert.ok(at(/daemonsets\/pinset-agent$/) < at(/customresourcedefinitions\//), 'the agents before the CRD');
    assert.equal(at(/namespaces\/pinset-system$/), deletes.length - 1, 'the namespace last');
  });

  test('--keep-pins: the sets are not deleted nor waited for; the agents go first and the sets with their CRD, and no agent takes that as their deletion', async () => {
    const r = await uninstall('--keep-pins');
    assert.equal(r.code, 0, `${r.stdout}\n${r.stderr}`);
    assert.match(r.stdout, /1\. Keep the sets and their pins \(--keep-pins\)/);
    assert.match(r.stdout, /2 nodes keep their pins, which only `pinset agent --drop-pins` on each will remove\./);
    assert.doesNotMatch(r.stdout, /Deleted \d+ PinnedImageSet/);
    assert.match(r.stdout, /pinset is removed; the nodes keep their pins/);
    await api.waitFor(() => !api.get('customresourcedefinitions', CRD_NAME), 5_000, 'the CRD gone');
    assert.equal(api.get('pinnedimagesets', 'fleet'), undefined, 'the set went with its CRD');
    for (const n of ['node-crio', 'node-ctrd']) {
      const kept = await api.waitFor(() => statusOf(n)?.pinsKept, 20_000, `${n} says why it keeps its pins`);
      assert.match(kept!, /^2 pin\(s\) kept that no set asks for now: the CustomResourceDefinition pinnedimagesets\.pinset\.dev is (being deleted|not installed)/);
    }
    assert.deepEqual((await readPinFile(crio.dropInDir))?.pins, [X, Y].sort(), 'the CRI-O drop-in keeps both pins');
    assert.equal(crio.crio.image(X)?.pinned, true);
    assert.equal(ownLabelled().length, 2, 'containerd keeps pinset\'s labels');
    assert.equal(ctrd.criPinned(X), true);
  });

  test('the CRD missing at the start (the agents keep their pins while it is): installed again, its sets deleted, the agents unpin, then everything goes', async () => {
    api.remove('customresourcedefinitions', CRD_NAME);
    for (const n of ['node-crio', 'node-ctrd']) await api.waitFor(() => statusOf(n)?.pinsKept, 20_000, `${n} keeps its pins while the CRD is missing`);
    const r = await uninstall('--wait-timeout', '60s');
    assert.equal(r.code, 0, `${r.stdout}\n${r.stderr}`);
    assert.match(r.stdout, /1\. The CustomResourceDefinition pinnedimagesets\.pinset\.dev is missing: agents keep their pins while it is\. Install it again from the manifests, so that the agents see the sets deleted \(next step\) and unpin\./);
    assert.match(r.stdout, /2\. Delete every PinnedImageSet: those there are once the CRD is back\./);
    assert.match(r.stdout, /Installed the CustomResourceDefinition pinnedimagesets\.pinset\.dev again\.\n/);
    // Removed without its finalizer, the CRD left its set in storage: back with it, and deleted.
    assert.match(r.stdout, /Deleted 1 PinnedImageSet\./);
    assert.match(r.stdout, /Every node reports no pins \(2 nodes\)\./);
    assert.equal(await readPinFile(crio.dropInDir), null);
    assert.deepEqual(ownLabelled(), []);
    await api.waitFor(() => !api.get('customresourcedefinitions', CRD_NAME), 5_000, 'the CRD gone again');
  });

  test('the CRD being deleted at the start (held by a set\'s finalizer): waited for until it goes, installed again, then as always', async () => {
    api.create({ apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name: 'held', finalizers: ['example.com/hold'] }, spec: { pinnedImages: [{ name: X }] } });
    const res = await fetch(`${api.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions/${CRD_NAME}`, { method: 'DELETE' });
    assert.equal(res.status, 200);
    await res.arrayBuffer();
    const running = uninstall('--wait-timeout', '60s');
    // The finalizer's owner lets go a little later, once uninstall has seen the CRD Terminating (its start takes longer on a busy machine).
    await api.waitFor(() => api.requests.some((q) => q.method === 'GET' && q.userAgent.startsWith('pinset-uninstall') && q.path.endsWith(`/customresourcedefinitions/${CRD_NAME}`)), 60_000, 'uninstall reading the CRD');
    await new Promise((r) => setTimeout(r, 500));
    await fetch(`${api.url}/apis/pinset.dev/v1alpha1/pinnedimagesets/held`, { method: 'PATCH', headers: { 'Content-Type': 'application/merge-patch+json' }, body: JSON.stringify({ metadata: { finalizers: null } }) }).then((r) => r.arrayBuffer());
    const r = await running;
    assert.equal(r.code, 0, `${r.stdout}\n${r.stderr}`);
    assert.match(r.stdout, /The CustomResourceDefinition pinnedimagesets\.pinset\.dev is being deleted: agents keep their pins while it is\. Wait for it to go, then install it again/);
    assert.match(r.stdout, /Waiting for the CustomResourceDefinition pinnedimagesets\.pinset\.dev being deleted to go\.\.\.\nInstalled the CustomResourceDefinition pinnedimagesets\.pinset\.dev again\./);
    assert.match(r.stdout, /Every node reports no pins \(2 nodes\)\./);
    assert.equal(await readPinFile(crio.dropInDir), null);
    assert.deepEqual(ownLabelled(), []);
  });
});
