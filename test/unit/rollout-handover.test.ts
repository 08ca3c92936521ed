// The hand-over of rollout slots (src/rollout/grants.ts) on the in-memory
// twin: nodes queue, the granter hands each freed slot to the node queued
// longest, at once; without a granter, or for nodes too old to queue, the
// rollout goes on by polling. The clock is the test's; the granter's passes
// run after every change, and by hand after the clock moves.
import { afterEach, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { RolloutGate, type GateImage } from '../../src/rollout/gate.ts';
import { MemoryGranter, MemoryRolloutSlots, MemorySlotStore } from '../../src/rollout/memory-slots.ts';
import { queueName, type RolloutSet } from '../../src/rollout/slots.ts';
import { silentLogger } from '../../src/util/log.ts';

const LEASE_MS = 60_000;
let now: number;
let store: MemorySlotStore;
let granter: MemoryGranter | undefined;
const gates: RolloutGate[] = [];

/** Let every watch event, grant and acceptance run (they are microtasks in the twin). */
const settle = async () => {
  for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
};

interface Node {
  gate: RolloutGate;
  changes: string[];
}

function node(name: string, opts: { queue?: boolean } = {}): Node {
  const changes: string[] = [];
  const gate = new RolloutGate({
    slots: new MemoryRolloutSlots(store, name, { leaseDurationMs: LEASE_MS, ...opts }),
    logger: silentLogger(),
    now: () => now,
    random: () => 0.5,
    // The agent's default: a new set's first attempt up to 10 s later.
    firstAttemptSpreadMs: LEASE_MS / 6,
    onChange: (why) => changes.push(why),
  });
  gates.push(gate);
  return { gate, changes };
}

const web = (max: number): [string, RolloutSet] => ['api/web', { name: 'web', uid: 'uid-web', maxConcurrentNodes: max }];
const image: GateImage = { key: 'img', sets: ['api/web'] };
const all = () => true;

async function admit(n: Node, max: number): Promise<boolean> {
  const r = await n.gate.admit([image], new Map([web(max)]), all);
  return r.allowed.length > 0;
}

beforeEach(() => {
  now = Date.parse('2026-01-01T00:00:00Z');
  store = new MemorySlotStore({ now: () => now });
  granter = undefined;
});

afterEach(async () => {
  granter?.stop();
  await Promise.all(gates.splice(0).map((g) => g.close()));
});

describe('the hand-over, on the in-memory twin', () => {
  test('a new set\'s free slots are granted at once to the nodes that queue, not after their first-attempt delay', async () => {
    granter = new MemoryGranter(store);
    const nodes = ['a', 'b', 'c'].map((n) => node(n));
    // The first attempt of each is 5 s away (the spread): only the queue can serve them now.
    for (const n of nodes) assert.equal(await admit(n, 2), false);
    await settle();
    const holding = nodes.filter((n) => n.gate.held().length > 0);
    assert.equal(holding.length, 2, 'both free slots taken');
    assert.deepEqual(holding.map((n) => n.changes), [['rollout slot granted'], ['rollout slot granted']], 'each told to look again');
    for (const n of holding) assert.equal(await admit(n, 2), true, 'its download goes');
    assert.deepEqual([...store.queue.values()].map((e) => e.node), ['c'], 'the served nodes left the queue');
    assert.deepEqual(gates[2]!.queued(), ['api/web']);
  });

  test('a freed slot goes to the node queued longest, at once; the others stay in order', async () => {
    granter = new MemoryGranter(store);
    const a = node('a');
    const b = node('b');
    const c = node('c');
    assert.equal(await admit(a, 1), false);
    await settle();
    assert.equal(await admit(a, 1), true);
    now += 1;
    await admit(b, 1);
    now += 1;
    await admit(c, 1);
    await settle();
    assert.deepEqual([...store.holders('web').values()], ['a']);
    await a.gate.releaseAll();
    await settle();
    assert.deepEqual([...store.holders('web').values()], ['b'], 'b queued first');
    assert.deepEqual(b.gate.held(), ['api/web']);
    assert.deepEqual(c.gate.held(), []);
    await b.gate.releaseAll();
    await settle();
    assert.deepEqual(c.gate.held(), ['api/web']);
    assert.equal(granter.counts.grants, 3);
  });

  test('a waiter that died: its grant lapses after the accept window, its entry goes, the slot goes to the next', async () => {
    granter = new MemoryGranter(store, { acceptMs: 10_000 });
    const a = node('a');
    await admit(a, 1);
    await settle();
    assert.deepEqual(a.gate.held(), ['api/web']);
    // A node that queued and died: its entry is there, nobody takes its grant.
    store.putEntry(queueName('web', 'dead'), { set: 'web', pool: 'rollout', node: 'dead', queuedAt: now - 1000, limit: 1, version: store.nextVersion() });
    now += 1;
    const b = node('b');
    await admit(b, 1);
    await a.gate.releaseAll();
    await settle();
    assert.deepEqual([...store.holders('web').values()], ['dead'], 'granted to the dead node first');
    now += 10_001;
    granter.pass();
    await settle();
    assert.equal(store.queue.has(queueName('web', 'dead')), false, 'its entry dropped');
    assert.deepEqual(b.gate.held(), ['api/web'], 'the next node has the slot');
    assert.equal(granter.counts.lapsed, 1);
  });

  test('a holder that died: its slot is granted when its lease expires, not at the next poll', async () => {
    granter = new MemoryGranter(store);
    const dead = new MemoryRolloutSlots(store, 'dead', { leaseDurationMs: LEASE_MS });
    assert.ok(await dead.tryAcquire(web(1)[1]));
    const b = node('b');
    await admit(b, 1);
    await settle();
    assert.deepEqual(b.gate.held(), []);
    now += LEASE_MS + 1;
    granter.pass(); // the granter's timer, at the expiry
    await settle();
    assert.deepEqual(b.gate.held(), ['api/web']);
    assert.ok(b.gate.nextAttemptAt() === undefined, 'no longer waiting');
  });

  test('an old-protocol node: it polls and is never granted; its frees are handed over to the queued', async () => {
    granter = new MemoryGranter(store);
    const old = node('old', { queue: false });
    const b = node('b');
    // old polls its way into the slot (its first attempt is due at the spread's middle).
    assert.equal(await admit(old, 1), false);
    now = old.gate.nextAttemptAt()!;
    assert.equal(await admit(old, 1), true);
    await admit(b, 1);
    await settle();
    assert.equal(store.queue.has(queueName('web', 'old')), false, 'an old node does not queue');
    await old.gate.releaseAll(); // it only deletes its slot
    await settle();
    assert.deepEqual(b.gate.held(), ['api/web'], 'handed to the queued node at once');
    // And an old node still gets a slot by polling once none is queued.
    const old2 = node('old2', { queue: false });
    await admit(old2, 1);
    await b.gate.releaseAll();
    await settle();
    now = old2.gate.nextAttemptAt()!;
    assert.equal(await admit(old2, 1), true);
  });

  test('no granter (none installed, an older controller): the queue is joined but the nodes get slots by polling, and leave the queue', async () => {
    const a = node('a');
    const b = node('b');
    assert.equal(await admit(a, 1), false);
    assert.equal(await admit(b, 1), false);
    await settle();
    assert.equal(store.queue.size, 2, 'queued, for a granter that may come');
    now = Math.max(a.gate.nextAttemptAt()!, b.gate.nextAttemptAt()!);
    const got = [await admit(a, 1), await admit(b, 1)];
    assert.deepEqual([...got].sort(), [false, true], 'one slot, taken by polling');
    const [winner, loser] = got[0] ? ['a', 'b'] : ['b', 'a'];
    assert.equal(store.queue.has(queueName('web', winner)), false, 'the node that took a slot left the queue');
    assert.equal(store.queue.has(queueName('web', loser)), true);
  });

  test('the API unreachable: attempts are paced by the backoff, no call between them; the queue is joined again after, and the rollout goes on', async () => {
    granter = new MemoryGranter(store);
    const holder = node('holder');
    await admit(holder, 1);
    await settle();
    store.unavailable = 'connection refused';
    const b = node('b');
    const r = await b.gate.admit([image], new Map([web(1)]), all);
    assert.deepEqual(r.allowed, []);
    const calls = store.calls;
    for (let i = 0; i < 50; i++) await b.gate.admit([image], new Map([web(1)]), all);
    assert.equal(store.calls, calls, 'no call before the next attempt is due: no spin');
    const due = b.gate.nextAttemptAt()!;
    now = due;
    const w = await b.gate.admit([image], new Map([web(1)]), all);
    assert.match(w.waits.get('api/web')!.error!, /connection refused/);
    assert.ok(b.gate.nextAttemptAt()! > now, 'the next attempt is later again');
    await holder.gate.releaseAll().catch(() => {}); // fails: it expires on its own
    store.unavailable = undefined;
    now = b.gate.nextAttemptAt()!;
    await b.gate.admit([image], new Map([web(1)]), all); // queues again (the slot is still the holder's)
    await settle();
    now += LEASE_MS + 1;
    granter.pass();
    await settle();
    assert.deepEqual(b.gate.held(), ['api/web']);
  });

  test('queued, with a granter alive: one attempt in ten lists the slots, the others only read the heartbeat; with none, every attempt lists', async () => {
    const holder = node('holder');
    await admit(holder, 1);
    now = holder.gate.nextAttemptAt()!;
    await admit(holder, 1); // polled its way in: nobody grants yet
    const count = async (n: Node) => {
      const before = store.polls;
      for (let i = 0; i < 20; i++) {
        now = n.gate.nextAttemptAt()!;
        await admit(n, 1);
      }
      return store.polls - before;
    };
    const b = node('b');
    assert.equal(await count(b), 20, 'no granter: twenty attempts, twenty lists');
    granter = new MemoryGranter(store);
    await settle();
    assert.equal(await count(b), 2, 'a granter serves the queue: two lists in twenty attempts');
    granter.stop();
    assert.equal(await count(b), 20, 'the granter gone: every attempt lists again');
  });

  test('close(): a queued node leaves its queue and a holder frees its slot; the granter moves on', async () => {
    granter = new MemoryGranter(store);
    const a = node('a');
    const b = node('b');
    const c = node('c');
    await admit(a, 1);
    await settle();
    now += 1;
    await admit(b, 1);
    now += 1;
    await admit(c, 1);
    await settle();
    await b.gate.close();
    await a.gate.close();
    await settle();
    assert.deepEqual(c.gate.held(), ['api/web'], 'b left, so c is next');
    assert.equal(store.openWatches, 0 + (c.gate.queued().length > 0 ? 1 : 0), 'no watch left behind by the nodes that closed');
  });
});
