// deploy/admission/rollout-handover.yaml: an agent writes queue entries,
// first-wave seats and records only in its own node's name, and never
// changes an entry; the controller writes only grants. Evaluated offline
// (test/support/admission.ts); the agent's Leases are the ones
// src/rollout/lease-slots.ts and lease-records.ts write, captured.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { parseYamlDocuments } from '../../src/api/yaml.ts';
import { admit, type AdmissionRequest } from '../support/admission.ts';
import { LeaseRolloutSlots, LeaseApiError, type LeaseApi, type LeaseObject } from '../../src/rollout/lease-slots.ts';
import { LeaseWaveRecords } from '../../src/rollout/lease-records.ts';
import { GRANT_ANNOTATION, GRANTER_LEASE, queueName, slotName, type RolloutSet } from '../../src/rollout/slots.ts';

type Obj = Record<string, any>;
const ROOT = path.resolve(import.meta.dirname, '../..');
const load = async (f: string) => parseYamlDocuments(await readFile(path.join(ROOT, 'deploy/admission', f), 'utf8')).map((d) => ('value' in d ? (d.value as Obj) : assert.fail(d.error)));
const docs = await load('rollout-handover.yaml');
const policy = (name: string) => docs.find((d) => d.kind === 'ValidatingAdmissionPolicy' && d.metadata.name === name)!;
const agentPolicy = policy('pinset-agent-rollout-handover');
const controllerPolicy = policy('pinset-controller-rollout-grants');
const slotsPolicy = (await load('rollout-slots.yaml')).find((d) => d.kind === 'ValidatingAdmissionPolicy')!;

const AGENT = 'system:serviceaccount:pinset-system:pinset-agent';
const CONTROLLER = { username: 'system:serviceaccount:pinset-system:pinset-controller' };
const agentOn = (node: string): AdmissionRequest['userInfo'] => ({ username: AGENT, extra: { 'authentication.kubernetes.io/node-name': [node] } });
const req = (operation: AdmissionRequest['operation'], name: string, userInfo: AdmissionRequest['userInfo']): AdmissionRequest => ({
  operation,
  resource: { group: 'coordination.k8s.io', version: 'v1', resource: 'leases' },
  name,
  namespace: 'pinset-system',
  userInfo,
});
const allowed = { applies: true, denied: [] };

interface Write {
  operation: AdmissionRequest['operation'];
  oldObject: LeaseObject | null;
  object: LeaseObject | null;
}

/** A Lease API that keeps the Leases and every write, as the server would see them (with creationTimestamp, uid, resourceVersion). */
function capturingApi(): { api: LeaseApi; writes: Write[]; store: Map<string, LeaseObject> } {
  const store = new Map<string, LeaseObject>();
  const writes: Write[] = [];
  let rv = 1;
  const stamp = (l: LeaseObject, old?: LeaseObject): LeaseObject => ({ ...structuredClone(l), metadata: { ...structuredClone(l.metadata), uid: old?.metadata.uid ?? `uid-${rv}`, creationTimestamp: old?.metadata.creationTimestamp ?? '2026-01-01T00:00:00Z', resourceVersion: String(++rv) } });
  const api: LeaseApi = {
    list: async () => [...store.values()],
    get: async (_ns, name) => structuredClone(store.get(name) ?? null),
    create: async (_ns, l) => {
      if (store.has(l.metadata.name)) throw new LeaseApiError(409, 'AlreadyExists');
      const s = stamp(l);
      writes.push({ operation: 'CREATE', oldObject: null, object: s });
      store.set(l.metadata.name, s);
      return structuredClone(s);
    },
    replace: async (_ns, l) => {
      const old = store.get(l.metadata.name);
      if (!old) throw new LeaseApiError(404, 'NotFound');
      const s = stamp(l, old);
      writes.push({ operation: 'UPDATE', oldObject: old, object: s });
      store.set(l.metadata.name, s);
      return structuredClone(s);
    },
    delete: async (_ns, name) => {
      const old = store.get(name);
      if (!old) throw new LeaseApiError(404, 'NotFound');
      writes.push({ operation: 'DELETE', oldObject: old, object: null });
      store.delete(name);
    },
    watch: () => ({ stop: async () => {} }),
  };
  return { api, writes, store };
}

const verdict = (p: Obj, w: Write, userInfo: AdmissionRequest['userInfo']) => admit(p, req(w.operation, (w.object ?? w.oldObject)!.metadata.name, userInfo), w.oldObject, w.object);
const set: RolloutSet = { name: 'upgrade', uid: 'uid-upgrade', maxConcurrentNodes: 1 };
const seatSet: RolloutSet = { ...set, pool: 'first-wave' };
const events = { granted: () => {}, removed: () => {}, failed: () => {} };

describe('admission: the agent\'s queue entries, seats and records', () => {
  test('every write the agent\'s code makes for itself is allowed, and not judged as a slot\'s', async () => {
    const { api, writes } = capturingApi();
    const slots = new LeaseRolloutSlots({ api, namespace: 'pinset-system', identity: 'worker-1', fieldManager: 'pinset-agent' });
    const records = new LeaseWaveRecords({ api, namespace: 'pinset-system', identity: 'worker-1', fieldManager: 'pinset-agent' });
    await (await slots.join!(set, events)).leave();
    await (await slots.join!(seatSet, events)).leave();
    const seat = (await slots.tryAcquire(seatSet))!;
    await slots.renew(seat);
    await records.write(seatSet, seat.index, () => ({ holder: 'worker-1', images: 'abc', landed: 'AQ==' }));
    await records.write(seatSet, seat.index, () => ({ holder: 'worker-1', images: 'abc', landed: 'Aw==' }));
    await slots.release(seat);
    assert.deepEqual(writes.map((w) => w.operation), ['CREATE', 'DELETE', 'CREATE', 'DELETE', 'CREATE', 'UPDATE', 'CREATE', 'UPDATE', 'DELETE']);
    for (const w of writes) {
      assert.deepEqual(verdict(agentPolicy, w, agentOn('worker-1')), allowed, `${w.operation} ${(w.object ?? w.oldObject)!.metadata.name}`);
      assert.deepEqual(verdict(slotsPolicy, w, agentOn('worker-1')), { applies: false }, 'the slot policy leaves these to this one');
    }
  });

  test('a new member takes over a seat\'s record written by another node', async () => {
    const { api, writes } = capturingApi();
    await new LeaseWaveRecords({ api, namespace: 'pinset-system', identity: 'worker-9', fieldManager: 'pinset-agent' }).write(seatSet, 0, () => ({ holder: 'worker-9', images: 'abc', landed: 'AQ==' }));
    await new LeaseWaveRecords({ api, namespace: 'pinset-system', identity: 'worker-1', fieldManager: 'pinset-agent' }).write(seatSet, 0, () => ({ holder: 'worker-1', images: 'abc', landed: 'Aw==' }));
    assert.deepEqual(verdict(agentPolicy, writes[1]!, agentOn('worker-1')), allowed);
  });

  test('denied: what another node\'s, a forged, or a changed entry would be', async () => {
    const { api, store } = capturingApi();
    const slots = new LeaseRolloutSlots({ api, namespace: 'pinset-system', identity: 'worker-2', fieldManager: 'pinset-agent' });
    await slots.join!(set, events);
    const entry = store.get(queueName('upgrade', 'worker-2'))!;
    const cases: [string, Write, string, RegExp][] = [
      ['an entry in another node\'s name', { operation: 'CREATE', oldObject: null, object: entry }, 'worker-1', /only in its own node's name/],
      ['moving its own entry earlier', { operation: 'UPDATE', oldObject: entry, object: { ...entry, spec: { ...entry.spec, acquireTime: '2020-01-01T00:00:00.000000Z' } } }, 'worker-2', /never changed by an agent/],
      ['deleting another node\'s entry', { operation: 'DELETE', oldObject: entry, object: null }, 'worker-1', /delete only its own node's/],
      ['a queue label on a rollout slot (to slip past the slots\' policy)', { operation: 'CREATE', oldObject: null, object: { ...entry, metadata: { ...entry.metadata, name: 'upgrade-0', labels: { ...entry.metadata.labels, 'pinset.dev/rollout-set': 'upgrade' } } } }, 'worker-2', /exactly one of its labels, never a rollout slot's/],
      ['the controller\'s Lease, labelled as an entry', { operation: 'CREATE', oldObject: null, object: { ...entry, metadata: { ...entry.metadata, name: 'pinset-controller' } } }, 'worker-2', /does not fit the label/],
      ['a seat held in another node\'s name', { operation: 'CREATE', oldObject: null, object: { ...entry, metadata: { name: slotName('upgrade', 0, 'first-wave'), labels: { 'pinset.dev/first-wave-set': 'upgrade' } } } }, 'worker-1', /only in its own node's name/],
      ['dropping the label of a seat', { operation: 'UPDATE', oldObject: { ...entry, metadata: { name: 'upgrade-0.first-wave', labels: { 'pinset.dev/first-wave-set': 'upgrade' } } }, object: { ...entry, metadata: { name: 'upgrade-0.first-wave', labels: {} } } }, 'worker-2', /exactly one of its labels/],
    ];
    for (const [what, w, node, message] of cases) {
      const v = verdict(agentPolicy, w, agentOn(node));
      assert.ok(v.applies, what);
      assert.ok(v.denied.some((m) => message.test(m)), `${what}: ${JSON.stringify(v.denied)}`);
    }
  });
});

describe('admission: the controller\'s grants', () => {
  const entry: Obj = {
    apiVersion: 'coordination.k8s.io/v1',
    kind: 'Lease',
    metadata: { name: queueName('upgrade', 'worker-2'), namespace: 'pinset-system', labels: { 'pinset.dev/rollout-queue': 'upgrade', 'app.kubernetes.io/managed-by': 'pinset-agent' }, annotations: { 'pinset.dev/limit': '1', 'pinset.dev/set': 'upgrade' } },
    spec: { holderIdentity: 'worker-2', acquireTime: '2026-01-01T00:00:00.000000Z' },
  };
  const grant = (name: string, label: string): Obj => ({
    apiVersion: 'coordination.k8s.io/v1',
    kind: 'Lease',
    metadata: { name, namespace: 'pinset-system', labels: { [label]: 'upgrade', 'app.kubernetes.io/managed-by': 'pinset-agent' } },
    spec: { holderIdentity: 'worker-2', leaseDurationSeconds: 10, acquireTime: '2026-01-01T00:00:01.000000Z', renewTime: '2026-01-01T00:00:01.000000Z', leaseTransitions: 0 },
  });
  const marked = { ...entry, metadata: { ...entry.metadata, annotations: { ...entry.metadata.annotations, [GRANT_ANNOTATION]: 'upgrade-0' } } };

  test('allowed: a slot or seat granted (created, or over an expired one), given back; an entry marked; a lapsed entry dropped', () => {
    const slot = grant('upgrade-0', 'pinset.dev/rollout-set');
    const expired = { ...slot, spec: { ...slot.spec, holderIdentity: 'gone' } };
    const seat = grant('upgrade-0.first-wave', 'pinset.dev/first-wave-set');
    const writes: Write[] = [
      { operation: 'CREATE', oldObject: null, object: slot as LeaseObject },
      { operation: 'UPDATE', oldObject: expired as LeaseObject, object: slot as LeaseObject },
      { operation: 'DELETE', oldObject: slot as LeaseObject, object: null },
      { operation: 'CREATE', oldObject: null, object: seat as LeaseObject },
      { operation: 'UPDATE', oldObject: entry as LeaseObject, object: marked as LeaseObject },
      { operation: 'DELETE', oldObject: marked as LeaseObject, object: null },
    ];
    for (const w of writes) assert.deepEqual(verdict(controllerPolicy, w, CONTROLLER), allowed, `${w.operation} ${(w.object ?? w.oldObject)!.metadata.name}`);
  });

  test('denied: an entry created or changed beyond its mark, a record written, a slot granted to nobody', () => {
    const record = grant('upgrade-0.landed', 'pinset.dev/first-wave-landed');
    const cases: [string, Write, RegExp][] = [
      ['creating an entry', { operation: 'CREATE', oldObject: null, object: entry as LeaseObject }, /creates no queue entry/],
      ['moving an entry', { operation: 'UPDATE', oldObject: entry as LeaseObject, object: { ...marked, spec: { ...entry.spec, acquireTime: '2020-01-01T00:00:00.000000Z' } } as LeaseObject }, /nothing of a queue entry but/],
      ['dropping an entry\'s other annotation', { operation: 'UPDATE', oldObject: entry as LeaseObject, object: { ...entry, metadata: { ...entry.metadata, annotations: { [GRANT_ANNOTATION]: 'upgrade-0' } } } as LeaseObject }, /nothing of a queue entry but/],
      ['writing a record', { operation: 'CREATE', oldObject: null, object: record as LeaseObject }, /writes no record/],
      ['a slot granted to nobody', { operation: 'CREATE', oldObject: null, object: { ...grant('upgrade-0', 'pinset.dev/rollout-set'), spec: { leaseDurationSeconds: 10 } } as LeaseObject }, /names the node/],
    ];
    for (const [what, w, message] of cases) {
      const v = verdict(controllerPolicy, w, CONTROLLER);
      assert.ok(v.applies, what);
      assert.ok(v.denied.some((m) => message.test(m)), `${what}: ${JSON.stringify(v.denied)}`);
    }
  });

  test('the granter\'s heartbeat is the controller\'s (not matched here); an agent may not write it (the slots\' policy)', () => {
    const beat: Obj = { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: GRANTER_LEASE, namespace: 'pinset-system' }, spec: { holderIdentity: 'pinset-controller-7d9f', leaseDurationSeconds: 30 } };
    assert.deepEqual(admit(controllerPolicy, req('CREATE', GRANTER_LEASE, CONTROLLER), null, beat), { applies: false });
    const v = admit(slotsPolicy, req('CREATE', GRANTER_LEASE, agentOn('worker-1')), null, { ...beat, spec: { ...beat.spec, holderIdentity: 'worker-1' } });
    assert.ok(v.applies && v.denied.some((m) => /only rollout slot Leases/.test(m)), JSON.stringify(v));
  });

  test('not matched: the controller\'s leader election Lease, and anyone else\'s writes', () => {
    const leader: Obj = { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: 'pinset-controller', namespace: 'pinset-system' }, spec: { holderIdentity: 'pinset-controller-7d9f' } };
    assert.deepEqual(admit(controllerPolicy, req('UPDATE', 'pinset-controller', CONTROLLER), leader, leader), { applies: false });
    assert.deepEqual(admit(controllerPolicy, req('CREATE', 'upgrade-0', { username: 'kubernetes-admin' }), null, grant('upgrade-0', 'pinset.dev/rollout-set')), { applies: false });
    assert.deepEqual(admit(agentPolicy, req('DELETE', entry.metadata.name, CONTROLLER), entry, null), { applies: false });
  });
});
