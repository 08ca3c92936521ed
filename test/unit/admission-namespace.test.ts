// pinset rendered into another namespace (a kustomize `namespace:`
// override of deploy/, as docs/operating.md allows): the admission policies
// as rendered still hold its agents, evaluated with the CEL admission of
// ../support/admission.ts as the API server evaluates them. An agent's
// token, bound to a pod on node-a, may patch only node-a's pinset.dev/
// annotations and write only rollout slot Leases; the policies never match
// nothing.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { parseYamlDocuments } from '../../src/api/yaml.ts';
import { GRANT_ANNOTATION, queueName, setLabelValue, slotName, SLOT_QUEUE_LABEL, SLOT_SET_LABEL } from '../../src/rollout/slots.ts';
import { admit, type AdmissionRequest } from '../support/admission.ts';

type Obj = Record<string, any>;
const run = promisify(execFile);
const ROOT = path.resolve(import.meta.dirname, '../..');
const NS = 'shared-tools-2';
const kubectl = ['/usr/bin/kubectl', ...(process.env.PATH ?? '').split(path.delimiter).map((d) => path.join(d, 'kubectl'))].find((p) => existsSync(p));
const skip = !kubectl && process.env.CI !== 'true' ? 'kubectl not found: the kustomization is NOT rendered' : false;

let objects: Obj[] = [];
let dir: string;
before(async () => {
  if (skip) return;
  if (!kubectl) assert.fail('kubectl not found; CI=true requires it');
  dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-ns-override-'));
  await writeFile(path.join(dir, 'kustomization.yaml'), JSON.stringify({ apiVersion: 'kustomize.config.k8s.io/v1beta1', kind: 'Kustomization', namespace: NS, resources: [path.relative(dir, path.join(ROOT, 'deploy'))] }));
  const { stdout } = await run(kubectl, ['kustomize', dir], { maxBuffer: 16 << 20 });
  objects = parseYamlDocuments(stdout).map((d) => ('value' in d ? (d.value as Obj) : assert.fail(d.error)));
});
after(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

const find = (kind: string, name: string) => objects.find((o) => o.kind === kind && o.metadata.name === name) ?? assert.fail(`${kind} ${name} not rendered`);

function node(name: string): Obj {
  return { apiVersion: 'v1', kind: 'Node', metadata: { name, labels: { 'kubernetes.io/hostname': name }, annotations: { 'pinset.dev/status': '{"version":2,"sets":[]}' } }, spec: { podCIDR: '10.244.1.0/24' } };
}

describe(`deploy/ rendered into the namespace ${NS}`, { skip }, () => {
  /** The agent's user as the API server names it: its service account, as rendered, bound to a pod on `nodeName`. */
  const agentOn = (nodeName: string): AdmissionRequest['userInfo'] => {
    const sa = find('ServiceAccount', 'pinset-agent');
    assert.equal(sa.metadata.namespace, NS, 'the service account moved with the override');
    return {
      username: `system:serviceaccount:${sa.metadata.namespace}:${sa.metadata.name}`,
      groups: ['system:serviceaccounts', `system:serviceaccounts:${NS}`],
      extra: { 'authentication.kubernetes.io/node-name': [nodeName], 'authentication.kubernetes.io/pod-name': ['pinset-agent-x7k2p'] },
    };
  };
  const nodeUpdate = (name: string, userInfo: AdmissionRequest['userInfo']): AdmissionRequest => ({ operation: 'UPDATE', resource: { group: '', version: 'v1', resource: 'nodes' }, name, userInfo });
  const leaseWrite = (operation: AdmissionRequest['operation'], name: string, userInfo: AdmissionRequest['userInfo']): AdmissionRequest => ({ operation, resource: { group: 'coordination.k8s.io', version: 'v1', resource: 'leases' }, name, namespace: NS, userInfo });

  test('the agent still cannot patch another Node, nor its own Node\'s labels; its own pinset.dev/ annotation it may', () => {
    const policy = find('ValidatingAdmissionPolicy', 'pinset-agent-node-scope');
    const other = node('node-b');
    const forged = structuredClone(other);
    forged.metadata.annotations['pinset.dev/status'] = '{"version":2,"sets":[],"pins":0}';
    const onB = admit(policy, nodeUpdate('node-b', agentOn('node-a')), other, forged);
    assert.ok(onB.applies, 'the policy matches the agent of the overridden namespace');
    assert.ok(onB.applies && onB.denied.some((m) => /may change only its own Node/.test(m)), JSON.stringify(onB));

    const relabelled = structuredClone(other);
    relabelled.metadata.labels['node-role.kubernetes.io/control-plane'] = '';
    const labels = admit(policy, nodeUpdate('node-b', agentOn('node-a')), other, relabelled);
    assert.ok(labels.applies && labels.denied.some((m) => /may not change a Node's labels/.test(m)), JSON.stringify(labels));

    const own = node('node-a');
    const ownLabels = structuredClone(own);
    ownLabels.metadata.labels.evil = 'yes';
    const mine = admit(policy, nodeUpdate('node-a', agentOn('node-a')), own, ownLabels);
    assert.ok(mine.applies && mine.denied.some((m) => /labels/.test(m)), 'not even on its own Node');

    const report = structuredClone(own);
    report.metadata.annotations['pinset.dev/status'] = '{"version":2,"sets":[],"pins":3}';
    assert.deepEqual(admit(policy, nodeUpdate('node-a', agentOn('node-a')), own, report), { applies: true, denied: [] });
  });

  test('the agent still cannot write a Lease that is not a rollout slot of its own node', () => {
    const policy = find('ValidatingAdmissionPolicy', 'pinset-agent-rollout-slots');
    const notASlot = { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: 'pinset-controller', namespace: NS }, spec: { holderIdentity: 'node-a' } };
    const v = admit(policy, leaseWrite('CREATE', 'pinset-controller', agentOn('node-a')), null, notASlot);
    assert.ok(v.applies && v.denied.some((m) => /only rollout slot Leases/.test(m)), JSON.stringify(v));

    const slot = { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: slotName('web', 0), namespace: NS, labels: { [SLOT_SET_LABEL]: setLabelValue('web') } }, spec: { holderIdentity: 'node-a', leaseDurationSeconds: 60 } };
    assert.deepEqual(admit(policy, leaseWrite('CREATE', slot.metadata.name, agentOn('node-a')), null, slot), { applies: true, denied: [] });
    const theirs = { ...slot, spec: { ...slot.spec, holderIdentity: 'node-b' } };
    const taken = admit(policy, leaseWrite('CREATE', slot.metadata.name, agentOn('node-a')), null, theirs);
    assert.ok(taken.applies && taken.denied.some((m) => /only for its own node/.test(m)), JSON.stringify(taken));
  });

  test('the hand-over\'s policies still hold the agent\'s queue entries to its own node, and the controller to grants', () => {
    const handover = find('ValidatingAdmissionPolicy', 'pinset-agent-rollout-handover');
    const entry = { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: queueName('web', 'node-a'), namespace: NS, labels: { [SLOT_QUEUE_LABEL]: setLabelValue('web') }, annotations: { 'pinset.dev/limit': '1', 'pinset.dev/set': 'web' } }, spec: { holderIdentity: 'node-a' } };
    assert.deepEqual(admit(handover, leaseWrite('CREATE', entry.metadata.name, agentOn('node-a')), null, entry), { applies: true, denied: [] });
    const forged = admit(handover, leaseWrite('CREATE', entry.metadata.name, agentOn('node-b')), null, entry);
    assert.ok(forged.applies && forged.denied.some((m) => /only in its own node's name/.test(m)), JSON.stringify(forged));

    const grants = find('ValidatingAdmissionPolicy', 'pinset-controller-rollout-grants');
    const sa = find('ServiceAccount', find('Deployment', 'pinset-controller').spec.template.spec.serviceAccountName);
    const controller = { username: `system:serviceaccount:${sa.metadata.namespace}:${sa.metadata.name}` };
    const marked = { ...entry, metadata: { ...entry.metadata, annotations: { ...entry.metadata.annotations, [GRANT_ANNOTATION]: slotName('web', 0) } } };
    assert.deepEqual(admit(grants, leaseWrite('UPDATE', entry.metadata.name, controller), entry, marked), { applies: true, denied: [] });
    const created = admit(grants, leaseWrite('CREATE', entry.metadata.name, controller), null, entry);
    assert.ok(created.applies && created.denied.some((m) => /creates no queue entry/.test(m)), JSON.stringify(created));
  });

  test('the bindings enforce every policy with Deny, and RBAC follows the namespace the policies follow', () => {
    for (const name of ['pinset-agent-node-scope', 'pinset-agent-rollout-slots', 'pinset-agent-rollout-handover', 'pinset-controller-rollout-grants']) {
      const binding = find('ValidatingAdmissionPolicyBinding', name);
      assert.equal(binding.spec.policyName, name);
      assert.deepEqual(binding.spec.validationActions, ['Deny']);
      assert.equal(find('ValidatingAdmissionPolicy', name).spec.failurePolicy, 'Fail');
    }
    const slots = objects.find((o) => o.kind === 'RoleBinding' && o.metadata.name === 'pinset-agent-rollout-slots')!;
    assert.equal(slots.metadata.namespace, NS);
    assert.deepEqual(slots.subjects, [{ kind: 'ServiceAccount', name: 'pinset-agent', namespace: NS }]);
  });
});
