// `pinset uninstall` of pinset rendered into a namespace it shares with
// others (`kubectl kustomize` of deploy/ with `namespace: shared-tools`, as
// docs/operating.md allows), on the in-process API server, with two agents as
// real processes (the CRI-O stand-in, the containerd twin) as in
// ./uninstall.test.ts. The namespace was there before pinset, holding
// someone else's ConfigMap and Secret; the install labelled it as its own
// (server-side apply merges labels). A ClusterRole named as pinset's but
// without pinset's label stands for an object someone else owns under that
// name. Uninstall removes every pin and every object of pinset's, and leaves
// the namespace, both foreign objects and the unlabelled ClusterRole, saying
// why.
import { afterEach, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path, { join } from 'node:path';
import { promisify } from 'node:util';
import { randomBytes } from 'node:crypto';
import { OWN_LABEL } from '../../src/containerd/label-pins.ts';
import { parseNodeStatus } from '../../src/api/node-status.ts';
import { CRD_NAME, STATUS_ANNOTATION, type NodeStatus } from '../../src/api/types.ts';
import { parseYamlDocuments } from '../../src/api/yaml.ts';
import { PINSET_LABEL, PINSET_LABEL_VALUE } from '../../src/cli/manifests.ts';
import { ApiServer, type KubeObject, type ResourceName } from '../support/apiserver.ts';
import { startCrioNode, type CrioNode } from '../support/crio-node.ts';
import { startFakeContainerd, type FakeContainerd } from '../support/fake-containerd.ts';
import { AgentProcess, readPinFile, runPinset } from '../support/agent-process.ts';

const run = promisify(execFile);
const ROOT = path.resolve(import.meta.dirname, '../..');
const NS = 'shared-tools';
const kubectl = ['/usr/bin/kubectl', ...(process.env.PATH ?? '').split(path.delimiter).map((d) => path.join(d, 'kubectl'))].find((p) => existsSync(p));
const skip = !kubectl && process.env.CI !== 'true' ? 'kubectl not found: pinset cannot be rendered into another namespace' : false;

const hex = () => randomBytes(32).toString('hex');
const X = `registry.test/fleet/app@sha256:${hex()}`;
const Y = `registry.test/fleet/db@sha256:${hex()}`;
const ID = { [X]: `sha256:${hex()}`, [Y]: `sha256:${hex()}` };

const PLURALS: Record<string, ResourceName> = {
  Namespace: 'namespaces', ServiceAccount: 'serviceaccounts', DaemonSet: 'daemonsets', Deployment: 'deployments',
  Role: 'roles', RoleBinding: 'rolebindings', ClusterRole: 'clusterroles', ClusterRoleBinding: 'clusterrolebindings',
  ValidatingAdmissionPolicy: 'validatingadmissionpolicies', ValidatingAdmissionPolicyBinding: 'validatingadmissionpolicybindings',
  CustomResourceDefinition: 'customresourcedefinitions',
};
const CLUSTER_SCOPED = new Set(['Namespace', 'ClusterRole', 'ClusterRoleBinding', 'ValidatingAdmissionPolicy', 'ValidatingAdmissionPolicyBinding', 'CustomResourceDefinition']);

let api: ApiServer;
let dir: string;
let kubeconfig: string;
let rendered: string;
let objects: KubeObject[];
let crio: CrioNode;
let ctrd: FakeContainerd;
const agents: AgentProcess[] = [];

const statusOf = (node: string): NodeStatus | undefined => parseNodeStatus(api.get('nodes', node)?.metadata.annotations?.[STATUS_ANNOTATION]).status;
const nsOf = (o: KubeObject) => (CLUSTER_SCOPED.has(o.kind!) ? undefined : o.metadata.namespace);
const stored = (o: KubeObject) => api.get(PLURALS[o.kind!]!, o.metadata.name!, nsOf(o));
const ownLabelled = () => ctrd.recordNames().filter((n) => OWN_LABEL in ctrd.record(n)!.labels);
const foreign = () => [api.get('configmaps', 'app-config', NS), api.get('secrets', 'app-secret', NS)];

function common(node: string): string[] {
  return ['--node-name', node, '--kubeconfig', kubeconfig, '--static-dir', join(dir, `${node}-sets.d`), '--auth-file', join(dir, 'no-auth.json'), '--metrics-addr', '', '--resync-interval', '10s'];
}

async function uninstall(...args: string[]) {
  return await runPinset(['uninstall', '--kubeconfig', kubeconfig, '--manifests', rendered, ...args], { timeoutMs: 120_000 });
}

beforeEach(async () => {
  if (skip) return;
  api = await ApiServer.start({ bookmarkIntervalMs: 1000, crdTeardownMs: 100 });
  dir = await mkdtemp(join(tmpdir(), 'pinset-uninstall-shared-'));
  kubeconfig = await api.writeKubeconfig(dir);

  // The namespace and what others keep in it, before pinset.
  api.create({ apiVersion: 'v1', kind: 'Namespace', metadata: { name: NS, labels: { team: 'tools' } } });
  api.create({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'app-config', namespace: NS }, data: { 'settings.yaml': 'replicas: 3\n' } });
  api.create({ apiVersion: 'v1', kind: 'Secret', metadata: { name: 'app-secret', namespace: NS }, stringData: { token: 'not-pinsets' } });
  // What Kubernetes' controllers put in every namespace.
  api.create({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'kube-root-ca.crt', namespace: NS }, data: { 'ca.crt': 'PEM' } });
  api.create({ apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name: 'default', namespace: NS } });

  // pinset rendered into it, installed as `kubectl apply --server-side` would: the namespace's labels merged.
  const overlay = join(dir, 'overlay');
  await mkdir(overlay);
  await writeFile(join(overlay, 'kustomization.yaml'), JSON.stringify({ apiVersion: 'kustomize.config.k8s.io/v1beta1', kind: 'Kustomization', namespace: NS, resources: [path.relative(overlay, join(ROOT, 'deploy'))] }));
  const { stdout } = await run(kubectl!, ['kustomize', overlay], { maxBuffer: 16 << 20 });
  rendered = join(dir, 'rendered.yaml');
  await writeFile(rendered, stdout);
  objects = parseYamlDocuments(stdout).map((d) => ('value' in d ? (d.value as KubeObject) : assert.fail(d.error)));
  for (const o of objects) {
    const doc = { ...o, metadata: { ...o.metadata, ...(CLUSTER_SCOPED.has(o.kind!) ? { namespace: undefined } : {}) } };
    if (o.kind === 'Namespace') api.patch('namespaces', NS, { metadata: { labels: o.metadata.labels } });
    else if (o.kind === 'CustomResourceDefinition') api.patch('customresourcedefinitions', CRD_NAME, { metadata: { labels: o.metadata.labels } });
    else api.create(doc);
  }
  // An object named as pinset's that is not pinset's: no label.
  api.patch('clusterroles', 'pinset-node-agent', { metadata: { labels: { [PINSET_LABEL]: null } } } as never);
  api.create({ apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: 'pinset-controller', namespace: NS }, spec: { holderIdentity: 'pinset-controller-7d9f-abcde' } });

  for (const n of ['node-crio', 'node-ctrd']) api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: n } });
  api.create({ apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name: 'fleet' }, spec: { pinnedImages: [{ name: X }, { name: Y }] } });
  crio = await startCrioNode({ catalogue: { [X]: { size: 1000 }, [Y]: { size: 1000 } } });
  ctrd = await startFakeContainerd({ version: '1.7.24', catalogue: { [X]: { size: 10, id: ID[X] }, [Y]: { size: 10, id: ID[Y] } } });
  await mkdir(join(dir, 'state-ctrd'));
  const pod = { POD_NAMESPACE: NS };
  agents.push(AgentProcess.start([...common('node-crio'), '--cri-endpoint', crio.endpoint, '--crio-dropin-dir', crio.dropInDir, '--state-dir', crio.stateDir, '--reload', 'dbus'], { env: { ...crio.env, ...pod } }));
  agents.push(
    AgentProcess.start([...common('node-ctrd'), '--cri-endpoint', ctrd.endpoint, '--pin-backend', 'containerd', '--state-dir', join(dir, 'state-ctrd'), '--crio-dropin-dir', join(dir, 'no-crio', 'crio.conf.d')], { env: pod }),
  );
  for (const n of ['node-crio', 'node-ctrd']) {
    await api.waitFor(() => statusOf(n)?.sets[0]?.phase === 'Ready' && statusOf(n)?.pins === 2, 30_000, `${n}: the set Ready with 2 pins (now ${JSON.stringify(statusOf(n))})`);
  }
});

afterEach(async () => {
  if (skip) return;
  for (const a of agents.splice(0)) assert.equal(await a.stop(), 0, 'an agent exits 0 on SIGTERM');
  await crio.stop();
  await ctrd.stop();
  await api.stop();
  await rm(dir, { recursive: true, force: true });
});

describe(`pinset uninstall of pinset rendered into the shared namespace ${NS}`, { skip }, () => {
  test('--dry-run says which objects stay and why: the namespace (naming the foreign objects, not the agents\' pods), the unlabelled ClusterRole; nothing changes', async () => {
    // The agent's pod, as the daemonset controller makes it: owned by the DaemonSet, so pinset's too.
    const ds = api.get('daemonsets', 'pinset-agent', NS)!;
    api.create({ apiVersion: 'v1', kind: 'Pod', metadata: { name: 'pinset-agent-x7k2p', namespace: NS, ownerReferences: [{ apiVersion: 'apps/v1', kind: 'DaemonSet', name: 'pinset-agent', uid: ds.metadata.uid!, controller: true }] }, spec: { nodeName: 'node-crio', containers: [{ name: 'agent', image: 'pinset' }] } });
    const r = await uninstall('--dry-run');
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, new RegExp(`Remove what the manifests install and is pinset's \\(${objects.length} objects, 2 of them kept\\)`));
    assert.match(r.stdout, new RegExp(`^ {3}Namespace ${NS}: kept: it holds objects that are not pinset's: ConfigMap ${NS}/app-config, Secret ${NS}/app-secret$`, 'm'));
    assert.match(r.stdout, /^ {3}ClusterRole pinset-node-agent: kept: not pinset's: it lacks the label app\.kubernetes\.io\/part-of=pinset$/m);
    assert.match(r.stdout, new RegExp(`^ {3}DaemonSet ${NS}/pinset-agent$`, 'm'), 'pinset\'s own objects are removed');
    assert.doesNotMatch(r.stdout, /pinset-agent-x7k2p|kube-root-ca\.crt|ServiceAccount shared-tools\/default|Lease/, 'the agent\'s pod, what Kubernetes makes and the controller\'s Lease are pinset\'s or nobody\'s');
    for (const o of objects) assert.ok(stored(o), `${o.kind} ${o.metadata.name} is still there`);
    assert.ok(api.get('pinnedimagesets', 'fleet'));
    assert.ok(!api.requests.some((q) => q.method !== 'GET' && q.userAgent.startsWith('pinset-uninstall')), 'no write');
  });

  test('every pin and every object of pinset\'s removed; the namespace, the foreign ConfigMap and Secret and the unlabelled ClusterRole stay, said why', async () => {
    const r = await uninstall('--wait-timeout', '30s');
    assert.equal(r.code, 0, `${r.stdout}\n${r.stderr}`);
    assert.match(r.stdout, /Every node reports no pins \(2 nodes\)\./);
    assert.match(r.stdout, new RegExp(`^Kept Namespace ${NS}: it holds objects that are not pinset's: ConfigMap ${NS}/app-config, Secret ${NS}/app-secret\\.$`, 'm'));
    assert.match(r.stdout, /^Kept ClusterRole pinset-node-agent: not pinset's: it lacks the label app\.kubernetes\.io\/part-of=pinset\.$/m);
    assert.match(r.stdout, new RegExp(`^Kept, as not pinset's alone \\(said above\\): ClusterRole pinset-node-agent, Namespace ${NS}\\.$`, 'm'));

    // The pins: gone from both runtimes.
    assert.equal(await readPinFile(crio.dropInDir), null, 'the CRI-O drop-in is gone');
    assert.equal(crio.crio.image(X)?.pinned, false);
    assert.deepEqual(ownLabelled(), [], 'no containerd record carries pinset\'s label');
    assert.equal(ctrd.criPinned(X), false);

    // What was there before pinset stays; everything of pinset's is gone.
    const ns = api.get('namespaces', NS);
    assert.ok(ns && !ns.metadata.deletionTimestamp, 'the namespace stays');
    for (const o of foreign()) assert.ok(o, 'the foreign ConfigMap and Secret stay');
    assert.ok(api.get('clusterroles', 'pinset-node-agent'), 'the unlabelled ClusterRole stays');
    await api.waitFor(() => !api.get('customresourcedefinitions', CRD_NAME), 5_000, 'the CRD gone once its finalizer ran');
    for (const o of objects) {
      if (o.kind === 'Namespace' || (o.kind === 'ClusterRole' && o.metadata.name === 'pinset-node-agent')) continue;
      assert.equal(stored(o), undefined, `${o.kind} ${o.metadata.name} removed`);
    }
    const deletes = api.requests.filter((q) => q.method === 'DELETE' && q.userAgent.startsWith('pinset-uninstall')).map((q) => q.path);
    assert.deepEqual(deletes.filter((p) => /\/namespaces\/[^/]+$|\/(configmaps|secrets)\//.test(p)), [], 'no delete of a namespace, a ConfigMap or a Secret was even sent');
    assert.ok(!deletes.some((p) => p.endsWith('/clusterroles/pinset-node-agent')), 'nor of the unlabelled ClusterRole');
  });
});

// The label the install sets, as the rendered objects carry it (the test's premise).
test('the rendered objects carry pinset\'s label', { skip }, async () => {
  const overlay = await mkdtemp(join(tmpdir(), 'pinset-uninstall-shared-label-'));
  try {
    await writeFile(join(overlay, 'kustomization.yaml'), JSON.stringify({ resources: [path.relative(overlay, join(ROOT, 'deploy'))], namespace: NS }));
    const { stdout } = await run(kubectl!, ['kustomize', overlay], { maxBuffer: 16 << 20 });
    for (const d of parseYamlDocuments(stdout)) {
      const o = 'value' in d ? (d.value as KubeObject) : assert.fail(d.error);
      assert.equal(o.metadata.labels?.[PINSET_LABEL], PINSET_LABEL_VALUE, `${o.kind} ${o.metadata.name}`);
    }
  } finally {
    await rm(overlay, { recursive: true, force: true });
  }
});
