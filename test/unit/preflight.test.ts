// `pinset preflight`'s checks as pure functions of what was read
// (src/cli/preflight-checks.ts): versions as managed clusters report them, the
// SCC fields that admit the agent's pod, ResourceQuota quantities and
// scopes, and what each check says when a read failed (a note, never a
// verdict it cannot give). The checks against clusters of each kind, over
// HTTP: test/integration/preflight-cli.test.ts.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { parse } from 'yaml';
import {
  AGENT_PRIORITY_CLASS,
  AGENT_SERVICE_ACCOUNT,
  coversAgentClass,
  isGkeVersion,
  kubernetesCheck,
  kubernetesMinor,
  nodesCheck,
  openshiftCheck,
  priorityClassCheck,
  quantityOfPods,
  sccAdmitsAgent,
  setsCheck,
} from '../../src/cli/preflight-checks.ts';
import type { SecurityContextConstraintsFacts } from '../../src/cli/preflight-facts.ts';

describe('preflight: the agent it checks for is the one deploy/ installs', () => {
  test('its service account and priority class are the DaemonSet\'s', () => {
    const ds = parse(readFileSync(new URL('../../deploy/agent/daemonset.yaml', import.meta.url), 'utf8')) as { spec: { template: { spec: { serviceAccountName: string; priorityClassName: string } } } };
    assert.equal(ds.spec.template.spec.serviceAccountName, AGENT_SERVICE_ACCOUNT);
    assert.equal(ds.spec.template.spec.priorityClassName, AGENT_PRIORITY_CLASS);
  });
});

describe('preflight: reading what the API server reports', () => {
  test('the minor version from the gitVersion of kubeadm, GKE, EKS and AKS, else from major and minor', () => {
    assert.equal(kubernetesMinor({ gitVersion: 'v1.32.4' }), 32);
    assert.equal(kubernetesMinor({ gitVersion: 'v1.30.5-gke.1014001', major: '1', minor: '30+' }), 30);
    assert.equal(kubernetesMinor({ gitVersion: 'v1.31.2-eks-7f9249a', minor: '31+' }), 31);
    assert.equal(kubernetesMinor({ gitVersion: 'custom', major: '1', minor: '29+' }), 29);
    assert.equal(kubernetesMinor({ gitVersion: 'custom' }), undefined);
    assert.equal(kubernetesMinor({ gitVersion: 'v2.0.0' }), undefined);
  });

  test('GKE by its build of Kubernetes only', () => {
    assert.equal(isGkeVersion('v1.30.5-gke.1014001'), true);
    assert.equal(isGkeVersion('v1.30.5'), false);
    assert.equal(isGkeVersion('v1.30.4-eks-a737599'), false);
  });

  test('a quota\'s pods as resource.Quantity writes them', () => {
    assert.equal(quantityOfPods('10'), 10);
    assert.equal(quantityOfPods('1G'), 1e9);
    assert.equal(quantityOfPods('2k'), 2000);
    assert.equal(quantityOfPods('1Ki'), 1024);
    assert.equal(quantityOfPods('1.5k'), undefined);
    assert.equal(quantityOfPods(undefined), undefined);
  });

  test('a quota covers the agent\'s class by In with system-node-critical, or by Exists', () => {
    const scoped = (e: object) => ({ name: 'q', scopeSelector: { matchExpressions: [e] } });
    assert.equal(coversAgentClass(scoped({ scopeName: 'PriorityClass', operator: 'In', values: ['system-cluster-critical', 'system-node-critical'] })), true);
    assert.equal(coversAgentClass(scoped({ scopeName: 'PriorityClass', operator: 'Exists' })), true);
    assert.equal(coversAgentClass(scoped({ scopeName: 'PriorityClass', operator: 'In', values: ['system-cluster-critical'] })), false);
    assert.equal(coversAgentClass(scoped({ scopeName: 'PriorityClass', operator: 'NotIn', values: ['system-node-critical'] })), false);
    assert.equal(coversAgentClass({ name: 'plain' }), false);
  });
});

describe('preflight: an SCC that admits the agent\'s pod', () => {
  const privileged: SecurityContextConstraintsFacts = {
    name: 'privileged', allowHostDirVolumePlugin: true, allowHostNetwork: true, allowHostPorts: true, volumes: ['*'],
    runAsUser: { type: 'RunAsAny' }, seLinuxContext: { type: 'RunAsAny' }, seccompProfiles: ['*'],
  };

  test('privileged admits it; so does one pinned to uid 0, spc_t, hostPath and RuntimeDefault', () => {
    assert.equal(sccAdmitsAgent(privileged), undefined);
    assert.equal(sccAdmitsAgent({ ...privileged, volumes: ['hostPath', 'projected'], runAsUser: { type: 'MustRunAs', uid: 0 }, seLinuxContext: { type: 'MustRunAs', seLinuxOptions: { type: 'spc_t' } }, seccompProfiles: ['runtime/default'] }), undefined);
  });

  test('each thing the pod needs, taken away, is named', () => {
    assert.equal(sccAdmitsAgent({ ...privileged, allowHostDirVolumePlugin: false }), 'no hostPath volumes');
    assert.equal(sccAdmitsAgent({ ...privileged, volumes: ['configMap', 'secret'] }), 'no hostPath volumes');
    assert.equal(sccAdmitsAgent({ ...privileged, allowHostNetwork: false }), 'no host network');
    assert.equal(sccAdmitsAgent({ ...privileged, allowHostPorts: false }), 'no host ports');
    assert.equal(sccAdmitsAgent({ ...privileged, runAsUser: { type: 'MustRunAsRange' } }), 'not uid 0');
    assert.equal(sccAdmitsAgent({ ...privileged, runAsUser: { type: 'MustRunAsNonRoot' } }), 'not uid 0');
    assert.equal(sccAdmitsAgent({ ...privileged, seLinuxContext: { type: 'MustRunAs', seLinuxOptions: { type: 'container_t' } } }), 'not the SELinux type spc_t');
    assert.equal(sccAdmitsAgent({ ...privileged, seccompProfiles: ['localhost/custom.json'] }), 'not the seccomp profile RuntimeDefault');
  });
});

describe('preflight: a read that failed is a note, not a verdict', () => {
  const unreadable = { unreadable: 'HTTP 403: forbidden' };

  test('the admission group, the API groups, OpenShift\'s objects', () => {
    assert.equal(kubernetesCheck({ version: { gitVersion: 'v1.32.0' }, admissionV1: unreadable }).result, 'note');
    assert.equal(openshiftCheck({ namespace: 'pinset-system', groupVersions: unreadable }).result, 'note');
    const os = openshiftCheck({ namespace: 'pinset-system', groupVersions: ['security.openshift.io/v1'], openshift: { sccs: [], bindings: unreadable, roles: {} } });
    assert.equal(os.result, 'note');
    assert.match(os.message, /HTTP 403: forbidden/);
  });

  test('kube-system\'s quotas unreadable off GKE: a note that says what to add if the class is limited; on GKE pinset\'s own namespace decides', () => {
    const nodes = [{ name: 'a', labels: { 'kubernetes.io/os': 'linux' } }];
    const off = priorityClassCheck({ version: { gitVersion: 'v1.32.0' }, namespace: 'pinset-system', nodes, quotas: { kubeSystem: unreadable, namespace: [] } });
    assert.equal(off.result, 'note');
    assert.match(off.todo!, /deploy\/critical-pods-quota/);
    const gke = priorityClassCheck({ version: { gitVersion: 'v1.32.0-gke.1' }, namespace: 'pinset-system', nodes, quotas: { kubeSystem: unreadable, namespace: [] } });
    assert.equal(gke.result, 'fail');
  });

  test('Nodes that cannot be listed fail the nodes check (nothing else can be told); sets unreadable in the API are a note', () => {
    assert.equal(nodesCheck({ nodes: unreadable }).result, 'fail');
    const sets = setsCheck({ nodes: [], apiSets: unreadable, fileSets: [], fileProblems: [] });
    assert.equal(sets.result, 'note');
    assert.match(sets.message, /could not list the PinnedImageSets: HTTP 403/);
  });

  test('an invalid selector in the API is a failure of the sets check, named', () => {
    const r = setsCheck({ nodes: [{ name: 'a', labels: { 'kubernetes.io/os': 'linux' } }], apiSets: [{ name: 'odd', origin: 'api', selector: { matchExpressions: [{ key: 'k', operator: 'In' as const, values: [] }] } }], fileSets: [], fileProblems: [] });
    assert.equal(r.result, 'fail');
    assert.match(r.message, /set odd: spec\.nodeSelector\.matchExpressions\[0\]\.values: must be non-empty for operator In/);
  });
});
