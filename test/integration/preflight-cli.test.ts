// `pinset preflight` as a user runs it, against the in-process API server
// standing in for clusters of each kind (test/support/apiserver.ts:
// /version, discovery, Nodes with their status.nodeInfo, ResourceQuotas,
// RBAC, OpenShift's SCCs): for each check, a cluster that passes it and
// clusters that fail it, with the exit status (0 only when nothing fails)
// and what the report tells the user to do.
import { after, before, describe, test, type TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { parse } from 'yaml';
import { encodeNodeStatus } from '../../src/api/node-status.ts';
import { STATUS_ANNOTATION, type KubeletVerificationStatus } from '../../src/api/types.ts';
import type { CheckOutcome } from '../../src/cli/preflight-checks.ts';
import { run } from '../../src/cli/preflight.ts';
import { ApiServer, type ApiServerOptions, type KubeObject } from '../support/apiserver.ts';
import { runCli } from '../support/cli-run.ts';

const ROOT = path.resolve(import.meta.dirname, '../..');
const IMAGE = `registry.test/app@sha256:${'a'.repeat(64)}`;

let dir: string;
before(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'pinset-preflight-'));
});
after(() => rm(dir, { recursive: true, force: true }));

interface NodeSpec {
  os?: 'linux' | 'windows';
  /** The kubernetes.io/os label; default: the OS. null: none. */
  osLabel?: string | null;
  runtime?: string;
  kubelet?: string;
  labels?: Record<string, string>;
  kubeletVerification?: KubeletVerificationStatus;
}

/** A Node as a kubelet registers it: its OS label, and status.nodeInfo. */
function node(name: string, n: NodeSpec = {}): KubeObject {
  const os = n.os ?? 'linux';
  const osLabel = n.osLabel === undefined ? os : n.osLabel;
  const annotations = n.kubeletVerification
    ? { [STATUS_ANNOTATION]: encodeNodeStatus({ version: 2, pinFile: '', updatedAt: new Date().toISOString(), sets: [], kubeletVerification: n.kubeletVerification }) }
    : undefined;
  return {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: { name, labels: { 'kubernetes.io/hostname': name, ...(osLabel ? { 'kubernetes.io/os': osLabel } : {}), ...n.labels }, ...(annotations ? { annotations } : {}) },
    status: {
      nodeInfo: {
        operatingSystem: os,
        architecture: 'amd64',
        containerRuntimeVersion: n.runtime ?? (os === 'windows' ? 'containerd://1.7.24' : 'containerd://2.1.9'),
        kubeletVersion: n.kubelet ?? 'v1.32.4',
        osImage: os === 'windows' ? 'Windows Server 2022 Datacenter' : 'Debian GNU/Linux 12 (bookworm)',
      },
    },
  };
}

function set(name: string, nodeSelector?: Record<string, unknown>): KubeObject {
  return { apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name }, spec: { ...(nodeSelector ? { nodeSelector } : {}), pinnedImages: [{ name: IMAGE }] } };
}

/** A cluster: the API server with these options and objects. */
async function cluster(t: TestContext, opts: ApiServerOptions, objects: KubeObject[]): Promise<string> {
  const api = await ApiServer.start(opts);
  t.after(() => api.stop());
  for (const o of objects) api.create(o);
  return api.writeKubeconfig(await mkdtemp(path.join(dir, 'cluster-')));
}

interface Report {
  code: number;
  stderr: string;
  checks: Record<string, CheckOutcome>;
}

async function preflight(kubeconfig: string, args: string[] = []): Promise<Report> {
  const r = await runCli(run, ['--kubeconfig', kubeconfig, '-o', 'json', ...args]);
  assert.ok(r.stdout, `a report on stdout (stderr: ${r.stderr})`);
  const doc = JSON.parse(r.stdout) as { checks: CheckOutcome[] };
  return { code: r.code, stderr: r.stderr, checks: Object.fromEntries(doc.checks.map((c) => [c.check, c])) };
}

const results = (r: Report) => Object.fromEntries(Object.entries(r.checks).map(([k, c]) => [k, c.result]));
const ALL_OK = { kubernetes: 'ok', openshift: 'ok', 'priority class': 'ok', nodes: 'ok', runtimes: 'ok', kubelets: 'ok', sets: 'ok' };

/** deploy/'s manifests of a kind, as `kubectl apply -k` would create them here. */
async function manifest(file: string): Promise<KubeObject> {
  return parse(await readFile(path.join(ROOT, file), 'utf8')) as KubeObject;
}

const GKE_QUOTA: KubeObject = {
  apiVersion: 'v1',
  kind: 'ResourceQuota',
  metadata: { name: 'gcp-critical-pods', namespace: 'kube-system', labels: { 'addonmanager.kubernetes.io/mode': 'Reconcile' } },
  spec: { hard: { pods: '1G' }, scopeSelector: { matchExpressions: [{ operator: 'In', scopeName: 'PriorityClass', values: ['system-node-critical', 'system-cluster-critical'] }] } },
};

describe('pinset preflight: a cluster where nothing will fail', () => {
  test('Kubernetes 1.32, Linux nodes on containerd and CRI-O, a Windows node, a set on every Linux node: every check ok, exit 0', async (t) => {
    const kc = await cluster(t, { version: { gitVersion: 'v1.32.4' } }, [
      node('linux-a'),
      node('linux-b', { runtime: 'cri-o://1.32.13' }),
      node('win-1', { os: 'windows' }),
      set('everywhere', { matchLabels: { 'kubernetes.io/os': 'linux' } }),
    ]);
    const r = await preflight(kc);
    assert.deepEqual(results(r), ALL_OK);
    assert.equal(r.code, 0);
    assert.match(r.checks.kubernetes!.message, /v1\.32\.4: ValidatingAdmissionPolicy v1 is served, and pods' service account tokens name their node/);
    assert.match(r.checks.nodes!.message, /an agent on each of 2 Linux nodes; 1 node of another OS \(win-1: windows\) gets none, as the DaemonSet selects kubernetes\.io\/os=linux/);
    assert.match(r.checks.runtimes!.message, /every runtime pins: containerd 2\.1\.9: 1 node; cri-o 1\.32\.13: 1 node/);
    assert.match(r.checks.sets!.message, /every set selects a node: everywhere \(2 nodes\)/);
  });

  test('the text report: one line per check, then the verdict', async (t) => {
    const kc = await cluster(t, {}, [node('linux-a', { kubelet: 'v1.35.6' })]);
    const r = await runCli(run, ['--kubeconfig', kc]);
    assert.equal(r.code, 0, r.stderr);
    const lines = r.stdout.trimEnd().split('\n');
    assert.match(lines[0]!, /^pinset preflight: http:\/\/127\.0\.0\.1:\d+, Kubernetes v1\.33\.0-pinset-test$/);
    assert.deepEqual(lines.slice(2, -2).filter((l) => !l.startsWith(' ')).map((l) => l.split(/\s{2,}/).slice(0, 2).join(' ')), [
      'ok kubernetes', 'ok openshift', 'ok priority class', 'ok nodes', 'ok runtimes', 'note kubelets', 'ok sets',
    ]);
    assert.match(r.stdout, /\n {22}to do: once their sets exist, `pinset kubelet-allowlist --node linux-a`/);
    assert.equal(lines.at(-1), 'Nothing will fail.');
  });

  test('a set file checked against the cluster before it is applied: examples/first-set.yaml selects every Linux node', async (t) => {
    const kc = await cluster(t, { crd: false }, [node('linux-a'), node('linux-b')]);
    const r = await preflight(kc, [path.join(ROOT, 'examples/first-set.yaml')]);
    assert.equal(r.checks.sets!.result, 'ok');
    assert.match(r.checks.sets!.message, /first-set \(2 nodes\)/);
    assert.equal(r.code, 0);
  });
});

describe("pinset preflight: the README's walk-through", () => {
  test('its sample is what preflight prints for the cluster it describes (Kubernetes 1.35, three Linux nodes on containerd 2.1.4, before the install)', async (t) => {
    const readme = await readFile(path.join(ROOT, 'README.md'), 'utf8');
    const lines = readme.split('\n');
    const start = lines.findIndex((l) => l.trim() === '$ pinset preflight examples/first-set.yaml');
    assert.ok(start > 0, 'the README runs `pinset preflight examples/first-set.yaml`');
    const indent = /^ */.exec(lines[start]!)![0].length;
    const end = lines.findIndex((l, i) => i > start && l.trim() === '```');
    const sample = lines.slice(start + 1, end).map((l) => l.slice(indent)).join('\n');

    const nodes = ['cp-1', 'worker-1', 'worker-2'].map((name) => node(name, { runtime: 'containerd://2.1.4', kubelet: 'v1.35.1' }));
    const kc = await cluster(t, { version: { gitVersion: 'v1.35.1' }, crd: false }, nodes);
    const columns = process.env.COLUMNS;
    process.env.COLUMNS = '80';
    t.after(() => (columns === undefined ? delete process.env.COLUMNS : (process.env.COLUMNS = columns)));
    const r = await runCli(run, ['--kubeconfig', kc, path.join(ROOT, 'examples/first-set.yaml')]);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout.trimEnd().replace(/^(pinset preflight: )\S+,/, '$1https://192.0.2.10:6443,'), sample);
  });
});

describe('pinset preflight: the API server', () => {
  test('Kubernetes 1.29 without ValidatingAdmissionPolicy v1: fails, saying deploy/admission cannot be applied and to upgrade', async (t) => {
    const kc = await cluster(t, { version: { gitVersion: 'v1.29.7' }, notServed: ['validatingadmissionpolicies', 'validatingadmissionpolicybindings'] }, [node('a', { kubelet: 'v1.29.7' })]);
    const r = await preflight(kc);
    assert.deepEqual(results(r), { ...ALL_OK, kubernetes: 'fail' });
    assert.equal(r.code, 1);
    assert.match(r.checks.kubernetes!.message, /v1\.29\.7 serves no ValidatingAdmissionPolicy in admissionregistration\.k8s\.io\/v1 \(it does from 1\.30\)/);
    assert.equal(r.checks.kubernetes!.todo, 'upgrade the cluster to Kubernetes 1.30 or later');
  });

  test('ValidatingAdmissionPolicy v1 on a server before 1.30: fails on the node-name claim the policies check', async (t) => {
    const kc = await cluster(t, { version: { gitVersion: 'v1.29.7' } }, [node('a')]);
    const r = await preflight(kc);
    assert.equal(r.checks.kubernetes!.result, 'fail');
    assert.match(r.checks.kubernetes!.message, /before 1\.30 the service account tokens of pods name no node unless the API server's feature gate ServiceAccountTokenPodNodeInfo is on/);
  });

  test('a managed cluster\'s version (EKS: minor "30+"): read from its gitVersion', async (t) => {
    const kc = await cluster(t, { version: { gitVersion: 'v1.30.4-eks-a737599', minor: '30+' } }, [node('a')]);
    const r = await preflight(kc);
    assert.equal(r.checks.kubernetes!.result, 'ok');
    assert.equal(r.code, 0);
  });

  test('an API server that cannot be reached: exit 1, saying which', async () => {
    const api = await ApiServer.start();
    const kc = await api.writeKubeconfig(await mkdtemp(path.join(dir, 'gone-')));
    await api.stop();
    const r = await runCli(run, ['--kubeconfig', kc]);
    assert.equal(r.code, 1);
    assert.equal(r.stdout, '');
    assert.match(r.stderr, /^pinset preflight: cannot read the API server at http:\/\/127\.0\.0\.1:\d+: /);
  });
});

describe('pinset preflight: OpenShift', () => {
  // OpenShift's own objects, as a 4.x cluster has them: the privileged SCC,
  // restricted-v2, and a ClusterRole per SCC that grants its `use`.
  const privileged = {
    apiVersion: 'security.openshift.io/v1', kind: 'SecurityContextConstraints', metadata: { name: 'privileged' },
    allowHostDirVolumePlugin: true, allowHostIPC: true, allowHostNetwork: true, allowHostPID: true, allowHostPorts: true, allowPrivilegedContainer: true,
    runAsUser: { type: 'RunAsAny' }, seLinuxContext: { type: 'RunAsAny' }, seccompProfiles: ['*'], volumes: ['*'], users: ['system:admin', 'system:serviceaccount:openshift-infra:build-controller'], groups: ['system:cluster-admins', 'system:nodes', 'system:masters'],
  };
  const restricted = {
    apiVersion: 'security.openshift.io/v1', kind: 'SecurityContextConstraints', metadata: { name: 'restricted-v2' },
    allowHostDirVolumePlugin: false, allowHostNetwork: false, allowHostPorts: false,
    runAsUser: { type: 'MustRunAsRange' }, seLinuxContext: { type: 'MustRunAs' }, seccompProfiles: ['runtime/default'], volumes: ['configMap', 'csi', 'downwardAPI', 'emptyDir', 'ephemeral', 'persistentVolumeClaim', 'projected', 'secret'], users: [], groups: [],
  };
  const useScc = (scc: string): KubeObject => ({
    apiVersion: 'rbac.authorization.k8s.io/v1', kind: 'ClusterRole', metadata: { name: `system:openshift:scc:${scc}` },
    rules: [{ apiGroups: ['security.openshift.io'], resourceNames: [scc], resources: ['securitycontextconstraints'], verbs: ['use'] }],
  });
  const binding = (scc: string): KubeObject => ({
    apiVersion: 'rbac.authorization.k8s.io/v1', kind: 'RoleBinding', metadata: { name: `pinset-agent-scc-${scc}`, namespace: 'pinset-system' },
    roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: `system:openshift:scc:${scc}` },
    subjects: [{ kind: 'ServiceAccount', name: 'pinset-agent', namespace: 'pinset-system' }],
  });
  const openshift = [privileged, restricted, useScc('privileged'), useScc('restricted-v2')] as KubeObject[];

  test('no SCC granted to the agent\'s service account: fails, with the binding to apply', async (t) => {
    const kc = await cluster(t, { openshift: true }, [...openshift, node('worker-0', { runtime: 'cri-o://1.32.13' })]);
    const r = await preflight(kc);
    assert.equal(r.checks.openshift!.result, 'fail');
    assert.equal(r.code, 1);
    assert.match(r.checks.openshift!.message, /no SCC that admits the agent's pod \(host paths, uid 0, spc_t, host network\) is granted to service account pinset-system\/pinset-agent/);
    assert.match(r.checks.openshift!.todo!, /docs\/installing\.md#openshift, or `oc adm policy add-scc-to-user privileged -z pinset-agent -n pinset-system`/);
  });

  test('the RoleBinding of docs/installing.md to the privileged SCC\'s ClusterRole: ok', async (t) => {
    const kc = await cluster(t, { openshift: true }, [...openshift, binding('privileged'), node('worker-0', { runtime: 'cri-o://1.32.13' })]);
    const r = await preflight(kc);
    assert.deepEqual(results(r), ALL_OK);
    assert.match(r.checks.openshift!.message, /SCC privileged admits the agent's pod .*\(RoleBinding pinset-system\/pinset-agent-scc-privileged grants ClusterRole system:openshift:scc:privileged\)/);
  });

  test('an SCC that is granted but cannot admit the pod: fails, naming what it lacks', async (t) => {
    const kc = await cluster(t, { openshift: true }, [...openshift, binding('restricted-v2'), node('worker-0')]);
    const r = await preflight(kc);
    assert.equal(r.checks.openshift!.result, 'fail');
    assert.match(r.checks.openshift!.message, /those it may use do not: restricted-v2 \(no hostPath volumes\)/);
  });

  test('granted through the SCC\'s own users list: ok', async (t) => {
    const own = { ...privileged, metadata: { name: 'pinset-host' }, users: ['system:serviceaccount:pinset-system:pinset-agent'], groups: [] } as KubeObject;
    const kc = await cluster(t, { openshift: true }, [...openshift, own, node('worker-0')]);
    const r = await preflight(kc);
    assert.equal(r.checks.openshift!.result, 'ok');
    assert.match(r.checks.openshift!.message, /SCC pinset-host .*its users name system:serviceaccount:pinset-system:pinset-agent/);
  });
});

describe('pinset preflight: the priority class system-node-critical (GKE)', () => {
  const gke = { version: { gitVersion: 'v1.30.5-gke.1014001', minor: '30+' } };

  test('GKE without a quota in pinset-system: fails with the component to add', async (t) => {
    const kc = await cluster(t, gke, [GKE_QUOTA, node('gke-pool-1-a'), node('gke-pool-1-b')]);
    const r = await preflight(kc);
    assert.deepEqual(results(r), { ...ALL_OK, 'priority class': 'fail' });
    assert.equal(r.code, 1);
    assert.match(r.checks['priority class']!.message, /^GKE \(v1\.30\.5-gke\.1014001\): pods of the priority class system-node-critical \(the agent's\) are admitted only in a namespace with a ResourceQuota for that class, and pinset-system has none/);
    assert.match(r.checks['priority class']!.todo!, /install with the component deploy\/critical-pods-quota/);
  });

  test('GKE with deploy/critical-pods-quota applied: ok', async (t) => {
    const kc = await cluster(t, gke, [GKE_QUOTA, await manifest('deploy/critical-pods-quota/resourcequota.yaml'), node('gke-pool-1-a')]);
    const r = await preflight(kc);
    assert.deepEqual(results(r), ALL_OK);
    assert.match(r.checks['priority class']!.message, /ResourceQuota pinset-system\/pinset-critical-pods admits the agents' system-node-critical pods/);
  });

  test('a quota for the class too small for one agent per Linux node: fails', async (t) => {
    const small = { ...GKE_QUOTA, metadata: { name: 'small', namespace: 'pinset-system' }, spec: { ...(GKE_QUOTA.spec as object), hard: { pods: '2' } } } as KubeObject;
    const kc = await cluster(t, gke, [GKE_QUOTA, small, node('a'), node('b'), node('c')]);
    const r = await preflight(kc);
    assert.equal(r.checks['priority class']!.result, 'fail');
    assert.match(r.checks['priority class']!.message, /admits 2 system-node-critical pods, and there is an agent for each of 3 Linux nodes/);
  });

  test('not GKE, but a quota for the class in kube-system (the limit configured by hand): the same failure, with its reason', async (t) => {
    const kc = await cluster(t, {}, [{ ...GKE_QUOTA, metadata: { name: 'critical', namespace: 'kube-system' } }, node('a')]);
    const r = await preflight(kc);
    assert.equal(r.checks['priority class']!.result, 'fail');
    assert.match(r.checks['priority class']!.message, /^ResourceQuota kube-system\/critical is for system-node-critical pods: /);
  });
});

describe('pinset preflight: nodes, runtimes and kubelets', () => {
  test('a Linux node without the kubernetes.io/os label: fails, as no agent would run there', async (t) => {
    const kc = await cluster(t, {}, [node('a'), node('bare', { osLabel: null })]);
    const r = await preflight(kc);
    assert.equal(r.checks.nodes!.result, 'fail');
    assert.match(r.checks.nodes!.message, /1 Linux node lacks the label kubernetes\.io\/os=linux, which the agent's DaemonSet selects: no agent will run on bare/);
    assert.equal(r.checks.nodes!.todo, 'label them (the kubelet sets it at registration): kubectl label node bare kubernetes.io/os=linux');
  });

  test('Windows nodes only: fails, no agent would run', async (t) => {
    const kc = await cluster(t, {}, [node('win-1', { os: 'windows' })]);
    const r = await preflight(kc);
    assert.equal(r.checks.nodes!.result, 'fail');
    assert.match(r.checks.nodes!.message, /^no Linux node: no agent will run/);
    assert.equal(r.code, 1);
  });

  test('runtimes that cannot pin (containerd 1.6.20, Docker through cri-dockerd): a note naming them and what pins, exit 0', async (t) => {
    const kc = await cluster(t, {}, [node('old', { runtime: 'containerd://1.6.20' }), node('docker', { runtime: 'docker://24.0.7' }), node('new')]);
    const r = await preflight(kc);
    assert.equal(r.checks.runtimes!.result, 'note');
    assert.equal(r.code, 0);
    assert.match(r.checks.runtimes!.message, /containerd 1\.6\.20: 1 node \(old\), pre-load only/);
    assert.match(r.checks.runtimes!.message, /docker 24\.0\.7: 1 node \(docker\), pre-load only/);
    assert.match(r.checks.runtimes!.message, /containerd 1\.6\.20 does not honour io\.cri-containerd\.pinned set after the pull/);
    assert.match(r.checks.runtimes!.message, /pinset pins on CRI-O and containerd, not on docker/);
    assert.match(r.checks.runtimes!.todo!, /containerd 1\.6\.25 or later 1\.6, 1\.7\.10 or later 1\.7, or any 2\.x/);
  });

  test('kubelets by version: before 1.33 nothing; 1.33 and 1.34 no drop-in; 1.35 the drop-in, unless the agent reports pinned images start offline', async (t) => {
    const kc = await cluster(t, {}, [
      node('k132', { kubelet: 'v1.32.13' }),
      node('k133', { kubelet: 'v1.33.12' }),
      node('k134', { kubelet: 'v1.34.9' }),
      node('k135', { kubelet: 'v1.35.6' }),
      node('k135-done', { kubelet: 'v1.35.6', kubeletVerification: { policy: 'NeverVerifyAllowlistedImages', source: '/etc/kubernetes/kubelet.conf.d/50-pinset.conf' } }),
      node('k135-refuses', { kubelet: 'v1.35.6', kubeletVerification: { policy: 'NeverVerifyAllowlistedImages', source: '/etc/kubernetes/kubelet.conf.d/50-pinset.conf', refuses: ['web'] } }),
    ]);
    const r = await preflight(kc);
    const k = r.checks.kubelets!;
    assert.equal(k.result, 'note');
    assert.equal(r.code, 0, 'nothing fails at install');
    assert.match(k.message, /2 nodes \(k135, k135-refuses\) run a kubelet of 1\.35 or later, which verifies the pull credentials of images already on the node: pinned images start offline only with pinset's drop-in/);
    assert.match(k.message, /2 nodes \(k133 \(v1\.33\.12\), k134 \(v1\.34\.9\)\) run a kubelet of 1\.33 or 1\.34, where KubeletEnsureSecretPulledImages is off by default: give them no drop-in/);
    assert.match(k.message, /1 node \(k135-done\): the agent reports pinned images start offline/);
    assert.match(k.message, /1 node \(k132\) runs a kubelet before 1\.33, which needs no drop-in/);
    assert.match(k.todo!, /`pinset kubelet-allowlist --node k135`/);
    assert.match(k.todo!, /`pinset kubelet-allowlist --node NAME --kubelet-gate-on`/);
  });

  test('kubelets before 1.33 only: ok, no to-do', async (t) => {
    const kc = await cluster(t, {}, [node('a', { kubelet: 'v1.31.2' })]);
    const r = await preflight(kc);
    assert.equal(r.checks.kubelets!.result, 'ok');
    assert.equal(r.checks.kubelets!.todo, undefined);
  });
});

describe('pinset preflight: sets that select no node', () => {
  test('a set selecting node-role.kubernetes.io/worker on nodes without it, and one selecting only Windows nodes: fails, naming both, with the hint', async (t) => {
    const kc = await cluster(t, {}, [
      node('a'),
      node('win-1', { os: 'windows' }),
      set('upgrade-workers', { matchLabels: { 'node-role.kubernetes.io/worker': '' } }),
      set('windows-only', { matchLabels: { 'kubernetes.io/os': 'windows' } }),
      set('fine', { matchLabels: { 'kubernetes.io/os': 'linux' } }),
    ]);
    const r = await preflight(kc);
    const s = r.checks.sets!;
    assert.equal(s.result, 'fail');
    assert.equal(r.code, 1);
    assert.match(s.message, /set upgrade-workers selects no node an agent runs on: its images will be on no node/);
    assert.match(s.message, /set windows-only selects no node an agent runs on \(only 1 node of another OS\)/);
    assert.doesNotMatch(s.message, /set fine/);
    assert.match(s.todo!, /kubeadm, EKS, GKE and AKS do not set node-role\.kubernetes\.io\/worker: select with kubernetes\.io\/os: linux or a label of your own/);
  });

  test('set files: one that selects nothing is named by its file; one that does not validate fails too; an unreadable one is a usage error', async (t) => {
    const kc = await cluster(t, { crd: false }, [node('a')]);
    const file = path.join(dir, 'sets.yaml');
    await writeFile(file, `${JSON.stringify(set('nowhere', { matchLabels: { zone: 'mars' } }))}\n---\nkind: PinnedImageSet\nmetadata: {name: broken}\n`);
    const r = await preflight(kc, [file]);
    assert.equal(r.checks.sets!.result, 'fail');
    assert.match(r.checks.sets!.message, new RegExp(`set nowhere \\(${file.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')}\\) selects no node an agent runs on`));
    assert.match(r.checks.sets!.message, /document 2: /);
    const missing = await runCli(run, ['--kubeconfig', kc, path.join(dir, 'no-such.yaml')]).catch((e: Error) => e);
    assert.ok(missing instanceof Error && /cannot read .*no-such\.yaml: no such file or folder/.test(missing.message), String(missing));
  });

  test('before the install (no CRD): nothing to check, ok', async (t) => {
    const kc = await cluster(t, { crd: false }, [node('a')]);
    const r = await preflight(kc);
    assert.equal(r.checks.sets!.result, 'ok');
    assert.equal(r.checks.sets!.message, "pinset's CRD is not installed yet: no set to check");
  });
});
