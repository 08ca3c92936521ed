// `pinset uninstall` as a user runs it, on the in-process API server
// holding what deploy/ installs, with no agent process: what it removes when,
// and what it tells the user.
// - The agents' and the controller's pods outlive their DaemonSet and
//   Deployment for their grace period (the garbage collector deletes them,
//   the kubelet stops them). Here the pods are created as the daemonset and
//   deployment controllers would, and the test removes them, as the kubelet
//   would, a while after their owners' deletion. While they run, the RBAC,
//   ServiceAccounts and CRD they need must stay.
// - A node that still holds pins when the wait is over gets the advice of
//   its own runtime (the flags and the Job of CRI-O, or of containerd).
import { afterEach, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CRD_NAME, STATUS_ANNOTATION } from '../../src/api/types.ts';
import { readManifests, type ManifestObject } from '../../src/cli/manifests.ts';
import { ApiServer } from '../support/apiserver.ts';
import { runPinset } from '../support/agent-process.ts';
import { installManifests } from '../support/installed.ts';

let api: ApiServer;
let dir: string;
let kubeconfig: string;
let manifests: ManifestObject[];

const NS = 'pinset-system';
const report = (pinFile: string, pins: number) =>
  JSON.stringify({ version: 2, pinFile, updatedAt: new Date(Date.now() - 120_000).toISOString().replace(/\.\d+Z$/, 'Z'), sets: [], pins });

/** A pod of a workload, as its controller creates it: the template's labels, owned by it. */
function podOf(kind: 'DaemonSet' | 'Deployment', owner: string, name: string): void {
  const o = manifests.find((m) => m.kind === kind && m.name === owner)!;
  const labels = (o.doc as { spec: { selector: { matchLabels: Record<string, string> } } }).spec.selector.matchLabels;
  api.create({
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name, namespace: NS, labels, ownerReferences: [{ apiVersion: o.apiVersion, kind, name: owner, uid: 'x', controller: true }] },
    spec: { nodeName: 'node-a', containers: [{ name: 'main', image: 'pinset' }] },
  });
}

const deletes = () => api.requests.filter((q) => q.method === 'DELETE' && q.userAgent.startsWith('pinset-uninstall'));
const deleted = (re: RegExp) => deletes().find((q) => re.test(q.path));

async function uninstall(...args: string[]) {
  return await runPinset(['uninstall', '--kubeconfig', kubeconfig, ...args], { timeoutMs: 120_000 });
}

beforeEach(async () => {
  api = await ApiServer.start({ crdTeardownMs: 100 });
  dir = await mkdtemp(join(tmpdir(), 'pinset-uninstall-order-'));
  kubeconfig = await api.writeKubeconfig(dir);
  manifests = (await readManifests(undefined)).objects;
  installManifests(api, manifests);
});

afterEach(async () => {
  await api.stop();
  await rm(dir, { recursive: true, force: true });
});

describe('pinset uninstall: the agents go before what they need', () => {
  test('--keep-pins: the agents\' and the controller\'s pods are waited for, with progress, before their RBAC, ServiceAccounts and CRD go', async () => {
    api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'node-a', annotations: { [STATUS_ANNOTATION]: report('99-pinset-x.conf', 2) } } });
    podOf('DaemonSet', 'pinset-agent', 'pinset-agent-a1b2c');
    podOf('Deployment', 'pinset-controller', 'pinset-controller-7d9f-x2');
    const running = uninstall('--keep-pins');
    await api.waitFor(() => deleted(/daemonsets\/pinset-agent$/) && deleted(/deployments\/pinset-controller$/), 30_000, 'the workloads deleted');
    // The pods' grace period: the kubelet stops them a while later.
    await new Promise((r) => setTimeout(r, 2_500));
    assert.equal(deleted(/serviceaccounts\//), undefined, 'no ServiceAccount removed while the pods run');
    assert.equal(deleted(/clusterroles?\//), undefined, 'no ClusterRole removed while the pods run');
    assert.equal(deleted(/customresourcedefinitions\//), undefined, 'the CRD stands while the agents run');
    assert.ok(api.get('serviceaccounts', 'pinset-agent', NS));
    const goneAt = Date.now();
    api.remove('pods', 'pinset-agent-a1b2c', NS);
    api.remove('pods', 'pinset-controller-7d9f-x2', NS);
    const r = await running;
    assert.equal(r.code, 0, `${r.stdout}\n${r.stderr}`);
    assert.match(r.stdout, /waiting for 2 pod\(s\) of pinset-system\/pinset-agent, pinset-system\/pinset-controller to go \([\d.]+s\): pinset-agent-a1b2c, pinset-controller-7d9f-x2/);
    assert.match(r.stdout, /The agents' and the controller's pods are gone \([\d.]+s\)\./);
    for (const re of [/serviceaccounts\//, /clusterroles\//, /customresourcedefinitions\//, /namespaces\/pinset-system$/]) {
      const q = deleted(re);
      assert.ok(q, `${re} removed in the end`);
      assert.ok(q.at >= goneAt, `${re} removed only once the pods were gone`);
    }
    assert.match(r.stdout, /pinset is removed; the nodes keep their pins/);
  });

  test('pods that do not go within --wait-timeout: named, exit 1, and what they need is left in place (run it again)', async () => {
    podOf('DaemonSet', 'pinset-agent', 'pinset-agent-stuck');
    const r = await uninstall('--keep-pins', '--wait-timeout', '3s');
    assert.equal(r.code, 1, `${r.stdout}\n${r.stderr}`);
    assert.match(r.stdout, /1 pod of pinset-system\/pinset-agent is still there after 3s: pinset-agent-stuck\. Nothing else was removed: the pods need their RBAC, ServiceAccounts and CRD until they stop\. Run `pinset uninstall( --keep-pins)?` again once they are gone\./);
    assert.ok(deleted(/daemonsets\/pinset-agent$/), 'the workloads were deleted');
    assert.equal(deleted(/serviceaccounts\/|clusterroles\/|customresourcedefinitions\/|namespaces\/pinset-system$/), undefined, 'nothing they need');
    assert.ok(api.get('customresourcedefinitions', CRD_NAME));
  });
});

describe('pinset uninstall: what to do on a node still holding pins, in its runtime\'s words', () => {
  test('a containerd node is told the containerd flags and Job, a CRI-O node the CRI-O ones', async () => {
    api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'node-ctrd', annotations: { [STATUS_ANNOTATION]: report('containerd image label io.cri-containerd.pinned', 3) } } });
    api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'node-crio', annotations: { [STATUS_ANNOTATION]: report('99-pinset-6f1c2a4e.conf', 2) } } });
    const r = await uninstall('--wait-timeout', '2s');
    assert.equal(r.code, 1, `${r.stdout}\n${r.stderr}`);
    const advice = r.stdout.slice(r.stdout.indexOf('may still hold'));
    const line = (node: string) => advice.split('\n').find((l) => l.startsWith(`On ${node}`)) ?? '';
    assert.match(line('node-ctrd'), /pinset agent --drop-pins --cri-endpoint=unix:\/\/\/run\/containerd\/containerd\.sock --pin-backend=containerd/);
    assert.match(line('node-ctrd'), /deploy\/drop-pins\/containerd\.yaml/);
    assert.doesNotMatch(line('node-ctrd'), /crio/i);
    assert.match(line('node-crio'), /--crio-dropin-dir/);
    assert.match(line('node-crio'), /deploy\/drop-pins\/crio\.yaml/);
    assert.doesNotMatch(line('node-crio'), /containerd/);
  });
});
