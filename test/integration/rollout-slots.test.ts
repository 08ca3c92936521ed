// Rollout slots (spec.rollout.maxConcurrentNodes): one contract for the
// Lease implementation on the in-process API server (real HTTP, optimistic
// concurrency, 409s) and its in-memory twin; then many simulated nodes and
// a holder that dies, against the API server.
import { after, before, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { ApiServer } from '../support/apiserver.ts';
import { simulateRollout } from '../support/rollout-agents.ts';
import { AGENT_FIELD_MANAGER } from '../../src/agent/node-sinks.ts';
import { clientNodeLeaseApi } from '../../src/rollout/lease-api.ts';
import { LeaseRolloutSlots, type LeaseApi } from '../../src/rollout/lease-slots.ts';
import { MemoryRolloutSlots, MemorySlotStore } from '../../src/rollout/memory-slots.ts';
import { GRANT_ANNOTATION, queueName, setLabelValue, slotName, SLOT_SET_LABEL, type QueueEvents, type RolloutSet, type RolloutSlots } from '../../src/rollout/slots.ts';

const NS = 'pinset-system';
const LEASE_MS = 10_000;

let api: ApiServer;
let leaseApi: LeaseApi;

before(async () => {
  api = await ApiServer.start();
  leaseApi = clientNodeLeaseApi(api.kubeConfig());
});
after(async () => {
  await api.stop();
});
beforeEach(() => {
  for (const l of api.list('leases')) api.remove('leases', l.metadata.name!, l.metadata.namespace);
  api.requests.length = 0;
});

interface Env {
  slots(identity: string): RolloutSlots;
  advance(ms: number): void;
  /** What the granter does: slot `index` of `set` in `node`'s name, and its queue entry marked. */
  grant(set: string, index: number, node: string): Promise<void>;
  /** Someone deletes `node`'s queue entry. */
  dropEntry(set: string, node: string): void;
  /** Let watch events arrive. */
  settle(): Promise<void>;
}

const implementations: [string, () => Env][] = [
  [
    'Leases on the API server',
    () => {
      let now = Date.parse('2026-01-01T00:00:00Z');
      return {
        slots: (identity) => new LeaseRolloutSlots({ api: leaseApi, namespace: NS, identity, fieldManager: AGENT_FIELD_MANAGER, leaseDurationMs: LEASE_MS, now: () => now }),
        advance: (ms) => (now += ms),
        grant: async (set, index, node) => {
          const t = new Date(now).toISOString().replace('Z', '000Z');
          api.create({ apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: slotName(set, index), namespace: NS, labels: { [SLOT_SET_LABEL]: set } }, spec: { holderIdentity: node, leaseDurationSeconds: 10, renewTime: t } });
          api.patch('leases', queueName(set, node), { metadata: { annotations: { [GRANT_ANNOTATION]: slotName(set, index) } } }, NS);
        },
        dropEntry: (set, node) => api.remove('leases', queueName(set, node), NS),
        settle: () => new Promise((r) => setTimeout(r, 300)),
      };
    },
  ],
  [
    'the in-memory twin',
    () => {
      let now = Date.parse('2026-01-01T00:00:00Z');
      const store = new MemorySlotStore({ now: () => now });
      return {
        slots: (identity) => new MemoryRolloutSlots(store, identity, { leaseDurationMs: LEASE_MS }),
        advance: (ms) => (now += ms),
        grant: async (set, index, node) => {
          store.putSlot(slotName(set, index), { set, index, pool: 'rollout', holder: node, renewedAt: now, durationMs: 10_000, version: store.nextVersion() });
          const e = store.queue.get(queueName(set, node))!;
          store.putEntry(queueName(set, node), { ...e, granted: slotName(set, index), version: store.nextVersion() });
        },
        dropEntry: (set, node) => store.deleteEntry(queueName(set, node)),
        settle: async () => {
          for (let i = 0; i < 3; i++) await new Promise((r) => setImmediate(r));
        },
      };
    },
  ],
];

const set = (name: string, max: number, uid = `uid-${name}`): RolloutSet => ({ name, uid, maxConcurrentNodes: max });

for (const [name, make] of implementations) {
  describe(`rollout slots: ${name}`, () => {
    test('at most maxConcurrentNodes holders; a freed slot goes to the next node', async () => {
      const env = make();
      const [a, b, c] = ['node-a', 'node-b', 'node-c'].map((n) => env.slots(n));
      const s = set('web', 2);
      const sa = await a!.tryAcquire(s);
      const sb = await b!.tryAcquire(s);
      assert.ok(sa && sb);
      assert.notEqual(sa.name, sb.name);
      assert.deepEqual([sa.name, sb.name].sort(), [slotName('web', 0), slotName('web', 1)]);
      assert.equal(await c!.tryAcquire(s), null, 'every slot is held');
      await a!.release(sa);
      const sc = await c!.tryAcquire(s);
      assert.equal(sc?.name, sa.name);
    });

    test('a holder that stops renewing loses its slot after the lease duration, and cannot renew or free it then', async () => {
      const env = make();
      const [a, b] = ['node-a', 'node-b'].map((n) => env.slots(n));
      const s = set('web', 1);
      const sa = (await a!.tryAcquire(s))!;
      env.advance(LEASE_MS - 1_000);
      assert.equal(await b!.tryAcquire(s), null, 'not expired yet');
      env.advance(2_000);
      const sb = await b!.tryAcquire(s);
      assert.equal(sb?.name, sa.name, 'the expired slot is taken over');
      assert.equal(await a!.renew(sa), false, 'the old holder learns it lost the slot');
      await a!.release(sa);
      assert.equal(await b!.renew(sb!), true, "the old holder's release left the new holder alone");
    });

    test('renewing keeps a slot past its first lease duration', async () => {
      const env = make();
      const [a, b] = ['node-a', 'node-b'].map((n) => env.slots(n));
      const s = set('web', 1);
      const sa = (await a!.tryAcquire(s))!;
      for (let i = 0; i < 4; i++) {
        env.advance(LEASE_MS * 0.6);
        assert.equal(await a!.renew(sa), true);
      }
      assert.equal(await b!.tryAcquire(s), null);
    });

    test('a restarted node gets its own slot back, not a second one', async () => {
      const env = make();
      const s = set('web', 2);
      const first = (await env.slots('node-a').tryAcquire(s))!;
      const again = await env.slots('node-a').tryAcquire(s);
      assert.equal(again?.name, first.name);
      assert.ok(await env.slots('node-b').tryAcquire(s));
      assert.equal(await env.slots('node-c').tryAcquire(s), null);
    });

    test('the queue: a grant is heard through the entry and taken by this node only; a removal is heard; leaving deletes the entry', async () => {
      const env = make();
      const s = set('web', 1);
      const heard: string[] = [];
      const events: QueueEvents = { granted: (n) => heard.push(`granted ${n}`), removed: () => heard.push('removed'), failed: (e) => heard.push(`failed ${e.message}`) };
      const b = env.slots('node-b');
      const ticket = await b.join!(s, events);
      assert.equal(ticket.name, queueName('web', 'node-b'));
      const again = await b.join!(s, { granted: () => {}, removed: () => {}, failed: () => {} });
      assert.equal(again.name, ticket.name, 'a node that joins again (restarted) keeps its entry');
      await env.settle();
      assert.deepEqual(heard, [], 'nothing before a grant');
      await env.grant('web', 0, 'node-b');
      await env.settle();
      assert.deepEqual(heard, [`granted ${slotName('web', 0)}`]);
      assert.equal(await env.slots('node-c').accept!(s, slotName('web', 0)), null, 'not node-c\'s');
      const held = (await b.accept!(s, slotName('web', 0)))!;
      assert.equal(held.name, slotName('web', 0));
      assert.equal(await env.slots('node-c').tryAcquire(s), null, 'taken: held for the lease duration now');
      env.dropEntry('web', 'node-b');
      await env.settle();
      assert.deepEqual(heard.at(-1), 'removed');
      await ticket.leave();
      await again.leave();
      const c = env.slots('node-c');
      const t2 = await c.join!(s, events);
      await t2.leave();
      await env.settle();
      assert.equal(heard.filter((h) => h === 'removed').length, 1, 'leaving is not reported as a removal');
    });

    test('slots of different sets are independent; a set name too long for `<set>-<i>` still works', async () => {
      const env = make();
      const long = `${'a'.repeat(250)}.b`;
      const a = env.slots('node-a');
      const web = await a.tryAcquire(set('web', 1));
      const db = await a.tryAcquire(set('db', 1));
      const huge = await a.tryAcquire(set(long, 1));
      assert.ok(web && db && huge);
      assert.ok(huge.name.length <= 253, huge.name);
      assert.equal(await env.slots('node-b').tryAcquire(set(long, 1)), null);
      assert.ok(await env.slots('node-b').tryAcquire(set('other', 1)));
    });
  });
}

describe('rollout slots: the Leases as the API server stores them', () => {
  const slotsOf = (identity: string, leaseDurationMs = LEASE_MS) => new LeaseRolloutSlots({ api: leaseApi, namespace: NS, identity, fieldManager: AGENT_FIELD_MANAGER, leaseDurationMs });

  test('a slot is a Lease <set>-<i> in the agents\' namespace: holder, duration, labels, owner; every write as pinset-agent', async () => {
    const held = (await slotsOf('worker-1').tryAcquire(set('upgrade-workers', 5, '0b6e1c2a-0d7b-4c56-9a51-3e8f0b2d7c11')))!;
    const lease = api.get('leases', held.name, NS)!;
    assert.match(held.name, /^upgrade-workers-[0-4]$/);
    const spec = lease.spec as Record<string, unknown>;
    assert.equal(spec.holderIdentity, 'worker-1');
    assert.equal(spec.leaseDurationSeconds, 10);
    assert.match(String(spec.renewTime), /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/);
    assert.deepEqual(lease.metadata.labels, { [SLOT_SET_LABEL]: 'upgrade-workers', 'app.kubernetes.io/managed-by': 'pinset-agent' });
    assert.deepEqual(lease.metadata.ownerReferences, [{ apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', name: 'upgrade-workers', uid: '0b6e1c2a-0d7b-4c56-9a51-3e8f0b2d7c11' }]);
    assert.deepEqual((lease.metadata.managedFields as { manager: string }[]).map((m) => m.manager), ['pinset-agent']);
    const s2 = slotsOf('worker-1');
    const again = (await s2.tryAcquire(set('upgrade-workers', 5)))!;
    assert.ok(await s2.renew(again));
    await s2.release(again);
    assert.equal(api.get('leases', held.name, NS), undefined, 'released: deleted');
    const writes = api.requests.filter((r) => r.path.includes('/leases') && r.method !== 'GET');
    assert.ok(writes.length >= 3);
    for (const w of writes.filter((r) => r.method !== 'DELETE')) assert.equal(w.query.fieldManager, 'pinset-agent', `${w.method} ${w.path}`);
    const del = writes.find((r) => r.method === 'DELETE')!;
    assert.deepEqual(Object.keys((del.body as { preconditions: object }).preconditions).sort(), ['resourceVersion', 'uid'], 'a release deletes only the version it holds');
    // An attempt reads the set's slots by label, from the watch cache.
    const lists = api.requests.filter((r) => r.method === 'GET' && r.path === `/apis/coordination.k8s.io/v1/namespaces/${NS}/leases`);
    assert.ok(lists.length > 0);
    for (const l of lists) assert.deepEqual([l.query.labelSelector, l.query.resourceVersion], [`${SLOT_SET_LABEL}=upgrade-workers`, '0']);
  });

  test('ten nodes racing for one slot: the API server lets one have it (409 to the others), none fails', async () => {
    const results = await Promise.all(Array.from({ length: 10 }, (_, i) => slotsOf(`node-${i}`).tryAcquire(set('race', 1))));
    assert.equal(results.filter((r) => r !== null).length, 1);
    assert.ok(api.requests.some((r) => r.path.includes('/leases') && r.status === 409), 'the losers got 409s');
    assert.equal(api.list('leases', { namespace: NS }).length, 1);
  });

  test('two nodes taking over one expired slot at once: the update carries the version read, one gets 409', async () => {
    let now = Date.now();
    const at = (identity: string) => new LeaseRolloutSlots({ api: leaseApi, namespace: NS, identity, fieldManager: AGENT_FIELD_MANAGER, leaseDurationMs: LEASE_MS, now: () => now });
    const s = set('expired', 1);
    assert.ok(await at('dead').tryAcquire(s));
    now += LEASE_MS + 1_000;
    const results = await Promise.all(['node-a', 'node-b', 'node-c'].map((n) => at(n).tryAcquire(s)));
    const winners = results.filter((r) => r !== null);
    assert.equal(winners.length, 1);
    const holder = (api.get('leases', slotName('expired', 0), NS)!.spec as { holderIdentity: string; leaseTransitions: number });
    assert.equal(holder.leaseTransitions, 1);
    assert.ok(['node-a', 'node-b', 'node-c'].includes(holder.holderIdentity));
    assert.ok(api.requests.some((r) => r.method === 'PUT' && r.status === 409), 'the others got 409 Conflict');
  });

  test('a long set name: the Lease name and the label value stay within their limits', async () => {
    const name = `${'x'.repeat(120)}.${'y'.repeat(132)}`;
    assert.equal(name.length, 253);
    const held = (await slotsOf('node-a').tryAcquire(set(name, 3)))!;
    const lease = api.get('leases', held.name, NS)!;
    assert.ok(held.name.length <= 253);
    assert.ok(lease.metadata.labels![SLOT_SET_LABEL]!.length <= 63);
    assert.equal(lease.metadata.labels![SLOT_SET_LABEL], setLabelValue(name));
  });

  test('many simulated nodes, maxConcurrentNodes 3: never more than 3 download at once, every node finishes, no Lease is left', async () => {
    const s = set('fleet', 3);
    const liveHolders = () =>
      api.list('leases', { namespace: NS, labelSelector: `${SLOT_SET_LABEL}=fleet` }).filter((l) => {
        const spec = l.spec as { holderIdentity?: string; renewTime?: string; leaseDurationSeconds?: number };
        return spec.holderIdentity && Date.parse(spec.renewTime!) + spec.leaseDurationSeconds! * 1000 > Date.now();
      }).length;
    const nodes = Array.from({ length: 20 }, (_, i) => `node-${String(i).padStart(2, '0')}`);
    const r = await simulateRollout({
      nodes,
      set: s,
      slotsFor: (n) => slotsOf(n, 5_000),
      downloadMs: () => 80 + Math.floor(Math.random() * 80),
      gate: { retry: { baseMs: 40, capMs: 300 }, firstAttemptSpreadMs: 200 },
      onChange: (_node, downloading) => {
        if (downloading) assert.ok(liveHolders() <= 3, 'no more than 3 live slot Leases');
      },
    });
    assert.ok(r.maxConcurrent <= 3, `${r.maxConcurrent} at once`);
    assert.ok(r.maxConcurrent >= 2, 'the slots are used');
    assert.deepEqual([...r.finished].sort(), nodes);
    assert.equal(api.list('leases', { namespace: NS }).length, 0, 'every slot was freed');
  });

  test('a holder that dies: the others wait for its Lease to expire, then all finish, one at a time', async () => {
    const s = set('after-crash', 1);
    const dead = (await slotsOf('dead-node', 2_000).tryAcquire(s))!;
    const expiresAt = dead.renewedAt + 2_000;
    const starts: number[] = [];
    const r = await simulateRollout({
      nodes: ['node-a', 'node-b', 'node-c'],
      set: s,
      slotsFor: (n) => slotsOf(n, 5_000),
      downloadMs: () => 50,
      gate: { retry: { baseMs: 50, capMs: 250 }, firstAttemptSpreadMs: 0 },
      onChange: (_node, downloading) => {
        if (downloading) starts.push(Date.now());
      },
    });
    assert.equal(r.maxConcurrent, 1);
    assert.equal(r.finished.length, 3);
    assert.ok(starts[0]! >= expiresAt, `the first node started ${expiresAt - starts[0]!} ms before the dead node's slot expired`);
  });
});
