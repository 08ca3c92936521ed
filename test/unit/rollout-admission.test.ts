// deploy/admission/rollout-slots.yaml: the agent may write only rollout
// slot Leases, only as holder for its own node, and free only its own.
// Evaluated offline (test/support/admission.ts), with Leases shaped as
// src/rollout/lease-slots.ts writes them.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { parseYamlDocuments } from '../../src/api/yaml.ts';
import { admit, type AdmissionRequest } from '../support/admission.ts';
import { setLabelValue, slotName, SLOT_SET_LABEL } from '../../src/rollout/slots.ts';

type Obj = Record<string, any>;
const ROOT = path.resolve(import.meta.dirname, '../..');
const docs = parseYamlDocuments(await readFile(path.join(ROOT, 'deploy/admission/rollout-slots.yaml'), 'utf8')).map((d) => ('value' in d ? (d.value as Obj) : assert.fail(d.error)));
const policy = docs.find((d) => d.kind === 'ValidatingAdmissionPolicy')!;
const binding = docs.find((d) => d.kind === 'ValidatingAdmissionPolicyBinding')!;

const AGENT = 'system:serviceaccount:pinset-system:pinset-agent';
const agentOn = (node: string): AdmissionRequest['userInfo'] => ({
  username: AGENT,
  groups: ['system:serviceaccounts', 'system:serviceaccounts:pinset-system'],
  extra: { 'authentication.kubernetes.io/node-name': [node], 'authentication.kubernetes.io/pod-name': ['pinset-agent-x7k2p'] },
});

function slot(set: string, index: number, holder: string | undefined): Obj {
  return {
    apiVersion: 'coordination.k8s.io/v1',
    kind: 'Lease',
    metadata: { name: slotName(set, index), namespace: 'pinset-system', labels: { [SLOT_SET_LABEL]: setLabelValue(set), 'app.kubernetes.io/managed-by': 'pinset-agent' } },
    spec: { ...(holder ? { holderIdentity: holder } : {}), leaseDurationSeconds: 60, renewTime: '2026-01-01T00:00:00.000000Z' },
  };
}

const controllerLease: Obj = { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: 'pinset-controller', namespace: 'pinset-system' }, spec: { holderIdentity: 'pinset-controller-7d9f-abcde', leaseDurationSeconds: 15 } };

function req(operation: AdmissionRequest['operation'], name: string, userInfo: AdmissionRequest['userInfo']): AdmissionRequest {
  return { operation, resource: { group: 'coordination.k8s.io', version: 'v1', resource: 'leases' }, name, namespace: 'pinset-system', userInfo };
}

const allowed = { applies: true, denied: [] };

describe('admission: rollout slot Leases', () => {
  test('enforced with Deny, failing closed', () => {
    assert.equal(binding.spec.policyName, policy.metadata.name);
    assert.deepEqual(binding.spec.validationActions, ['Deny']);
    assert.equal(policy.spec.failurePolicy, 'Fail');
  });

  test('allowed: the agent takes a free slot, renews it, takes over an expired one, frees its own', () => {
    const mine = slot('web', 0, 'worker-1');
    assert.deepEqual(admit(policy, req('CREATE', mine.metadata.name, agentOn('worker-1')), null, mine), allowed);
    assert.deepEqual(admit(policy, req('UPDATE', mine.metadata.name, agentOn('worker-1')), mine, { ...mine, spec: { ...mine.spec, renewTime: '2026-01-01T00:00:20.000000Z' } }), allowed);
    const theirs = slot('web', 1, 'worker-9');
    assert.deepEqual(admit(policy, req('UPDATE', theirs.metadata.name, agentOn('worker-1')), theirs, slot('web', 1, 'worker-1')), allowed);
    assert.deepEqual(admit(policy, req('DELETE', mine.metadata.name, agentOn('worker-1')), mine, null), allowed);
    const long = slot(`${'a'.repeat(250)}.b`, 3, 'worker-1');
    assert.deepEqual(admit(policy, req('CREATE', long.metadata.name, agentOn('worker-1')), null, long), allowed);
  });

  const denials: [string, AdmissionRequest['operation'], Obj | null, Obj | null, string, RegExp][] = [
    ['a slot held in another node\'s name', 'CREATE', null, slot('web', 0, 'worker-2'), 'worker-1', /only for its own node/],
    ['a slot with no holder', 'CREATE', null, slot('web', 0, undefined), 'worker-1', /only for its own node/],
    ['renewing a slot into another node\'s name', 'UPDATE', slot('web', 0, 'worker-1'), slot('web', 0, 'worker-2'), 'worker-1', /only for its own node/],
    ['freeing another node\'s slot', 'DELETE', slot('web', 0, 'worker-2'), null, 'worker-1', /free only a rollout slot its own node holds/],
    ['taking the controller\'s leader election Lease', 'UPDATE', controllerLease, { ...controllerLease, spec: { ...controllerLease.spec, holderIdentity: 'worker-1' } }, 'worker-1', /only rollout slot Leases/],
    ['deleting the controller\'s Lease', 'DELETE', { ...controllerLease, spec: { holderIdentity: 'worker-1' } }, null, 'worker-1', /only rollout slot Leases/],
    ['creating a labelled Lease that is not named as a slot', 'CREATE', null, { ...slot('web', 0, 'worker-1'), metadata: { ...slot('web', 0, 'worker-1').metadata, name: 'pinset-controller' } }, 'worker-1', /only rollout slot Leases/],
    ['removing the slot label', 'UPDATE', slot('web', 0, 'worker-1'), { ...slot('web', 0, 'worker-1'), metadata: { name: 'web-0', namespace: 'pinset-system' } }, 'worker-1', /only rollout slot Leases/],
  ];
  for (const [what, op, oldObject, object, node, message] of denials) {
    test(`denied: ${what}`, () => {
      const name = (object ?? oldObject)!.metadata.name;
      const v = admit(policy, req(op, name, agentOn(node)), oldObject, object);
      assert.ok(v.applies);
      assert.equal(v.denied.length, 1, JSON.stringify(v.denied));
      assert.match(v.denied[0]!, message);
    });
  }

  test('denied: a token without exactly one node-name claim', () => {
    const tokens: AdmissionRequest['userInfo'][] = [{ username: AGENT }, { username: AGENT, extra: {} }, { username: AGENT, extra: { 'authentication.kubernetes.io/node-name': ['a', 'b'] } }];
    for (const userInfo of tokens) {
      const v = admit(policy, req('CREATE', 'web-0', userInfo), null, slot('web', 0, 'worker-1'));
      assert.ok(v.applies);
      assert.ok(v.denied.some((m) => /must name its node/.test(m)), JSON.stringify(v.denied));
    }
  });

  test('not in anyone else\'s way: the controller, the garbage collector and administrators are not matched', () => {
    for (const username of ['system:serviceaccount:pinset-system:pinset-controller', 'system:serviceaccount:kube-system:generic-garbage-collector', 'kubernetes-admin']) {
      assert.deepEqual(admit(policy, req('DELETE', 'web-0', { username }), slot('web', 0, 'worker-2'), null), { applies: false });
    }
    // Other resources are not matched at all.
    const nodeReq: AdmissionRequest = { ...req('UPDATE', 'worker-1', agentOn('worker-1')), resource: { group: '', version: 'v1', resource: 'nodes' } };
    assert.deepEqual(admit(policy, nodeReq, {}, {}), { applies: false });
  });
});
