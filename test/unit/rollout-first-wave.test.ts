// The first wave (src/rollout/first-wave.ts) on the in-memory twin: a few
// nodes fetch each image first, the others wait for each image until a
// first-wave node holds it, image by image; a member that fails or goes
// away is replaced; nothing waits forever; sets that do not ask are left as
// they are.
import { afterEach, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { FirstWave, type WaveImage, type WaveSet } from '../../src/rollout/first-wave.ts';
import { RolloutGate } from '../../src/rollout/gate.ts';
import { decodeLanded, encodeLanded, imageListHash, sortedDigests, staticWaveName } from '../../src/rollout/landed.ts';
import { MemoryGranter, MemoryRolloutSlots, MemorySlotStore, MemoryWaveRecords } from '../../src/rollout/memory-slots.ts';
import { landedName } from '../../src/rollout/slots.ts';
import { silentLogger } from '../../src/util/log.ts';

const LEASE_MS = 60_000;
const STALL_MS = 30 * 60_000;
let now: number;
let store: MemorySlotStore;
let granter: MemoryGranter | undefined;
const waves: FirstWave[] = [];

const settle = async () => {
  for (let i = 0; i < 6; i++) await new Promise((r) => setImmediate(r));
};

const d = (c: string) => `sha256:${c.repeat(64)}`;
const X = d('1');
const Y = d('2');
const Z = d('3');
const SET: WaveSet = { name: 'upgrade', uid: 'uid-upgrade', nodes: 1, digests: [X, Y] };
const img = (digest: string, ...sets: string[]): WaveImage => ({ key: `registry.test/app@${digest}`, digest, sets: sets.length ? sets : ['api/upgrade'] });
const keys = (xs: readonly WaveImage[]) => xs.map((w) => w.digest);

interface Node {
  wave: FirstWave;
  changes: string[];
  /** What it holds. */
  has: Set<string>;
}

function node(name: string, opts: { onChange?: boolean } = {}): Node {
  const changes: string[] = [];
  const wave = new FirstWave({
    slots: new MemoryRolloutSlots(store, name, { leaseDurationMs: LEASE_MS }),
    records: new MemoryWaveRecords(store, name),
    logger: silentLogger(),
    now: () => now,
    random: () => 0.5,
    recordIntervalMs: 0,
    ...(opts.onChange === false ? {} : { onChange: (why: string) => changes.push(why) }),
  });
  waves.push(wave);
  return { wave, changes, has: new Set() };
}

/** What the node would download now: the set's images it lacks. */
async function admit(n: Node, set: WaveSet = SET, extra: WaveImage[] = []) {
  const missing = set.digests.filter((x) => !n.has.has(x)).map((x) => img(x));
  return n.wave.admit([...missing, ...extra], new Map([['api/upgrade', set]]));
}

/** The node pulls these images and says so. */
async function pull(n: Node, ...digests: string[]) {
  for (const x of digests) n.has.add(x);
  await n.wave.held(n.has);
  await settle();
}

/** With a granter: a takes the set's seat (the first to queue), then b waits. */
async function memberAndWaiter(): Promise<[Node, Node]> {
  granter = new MemoryGranter(store);
  const a = node('a');
  const b = node('b');
  await admit(a);
  await settle();
  await admit(a);
  await admit(b);
  await settle();
  return [a, b];
}

beforeEach(() => {
  now = Date.parse('2026-01-01T00:00:00Z');
  store = new MemorySlotStore({ now: () => now });
  granter = undefined;
});

afterEach(async () => {
  granter?.stop();
  await Promise.all(waves.splice(0).map((w) => w.close()));
});

describe('records: what a first-wave node holds', () => {
  test('a bitmap over the sorted digests (order and repeats do not count), tied to a hash of the list', () => {
    const sorted = sortedDigests([Z, X, Y, X]);
    assert.deepEqual(sorted, [X, Y, Z]);
    const bits = encodeLanded(sorted, new Set([Z, X]));
    assert.deepEqual([...decodeLanded(sorted, bits)].sort(), [X, Z]);
    assert.equal(imageListHash([Y, X]), imageListHash([X, Y, Y]));
    assert.notEqual(imageListHash([X]), imageListHash([X, Y]));
    const many = Array.from({ length: 5000 }, (_, i) => `sha256:${i.toString(16).padStart(64, '0')}`);
    assert.equal(encodeLanded(many, new Set(many)).length, 836, 'a 5000-image set fits in under a kilobyte');
    assert.match(staticWaveName('boot', [X]), /^boot\.static-[0-9a-f]{10}$/);
  });
});

describe('FirstWave, on the in-memory twin', () => {
  test('one node fetches first; the others wait for each image until it holds it, image by image', async () => {
    granter = new MemoryGranter(store);
    const [a, b, c] = ['a', 'b', 'c'].map((n) => node(n));
    await admit(a!);
    await settle();
    const ra = await admit(a!);
    assert.deepEqual(keys(ra.allowed), [X, Y], 'the first-wave node fetches everything');
    assert.deepEqual(ra.sets.get('api/upgrade'), { member: true, members: ['a'], landed: 0, images: 2, waitingFor: [] });
    const rb = await admit(b!);
    await admit(c!);
    await settle();
    assert.deepEqual(keys(rb.waiting), [X, Y]);
    assert.deepEqual(rb.allowed, []);
    const wb = (await admit(b!)).sets.get('api/upgrade')!;
    assert.deepEqual({ ...wb, waitingFor: wb.waitingFor.length }, { member: false, members: ['a'], landed: 0, images: 2, waitingFor: 2 }, 'the status can say who is in the first wave and what waits');

    await pull(a!, X);
    assert.deepEqual(b!.changes, ['the first wave landed an image'], 'told at once, not at its next poll');
    const after = await admit(b!);
    assert.deepEqual([keys(after.allowed), keys(after.waiting)], [[X], [Y]], 'X goes while Y is still being fetched');
    await pull(b!, X);
    await pull(a!, Y);
    const last = await admit(b!);
    assert.deepEqual(keys(last.allowed), [Y]);
    assert.deepEqual(last.sets.get('api/upgrade')!.waitingFor, []);
    assert.equal(store.writes.records, 3, 'the record: written once when a took its seat and once per landing');
  });

  test('a member fetches one at a time, in the set\'s order, the images no member has landed; an image another member landed, and a non-member\'s, are not among them', async () => {
    granter = new MemoryGranter(store);
    const set: WaveSet = { ...SET, nodes: 2, digests: [Y, Z, X] };
    const [a, b, c] = ['a', 'b', 'c'].map((n) => node(n));
    for (const n of [a!, b!]) await admit(n, set);
    await settle();
    const ra = await admit(a!, set);
    assert.equal(ra.sets.get('api/upgrade')!.member, true);
    assert.deepEqual(keys(ra.oneAtATime.get('api/upgrade')!), [Y, Z, X], 'the order of the set, not of the digests');
    await pull(a!, Y);
    const rb = await admit(b!, set);
    assert.equal(rb.sets.get('api/upgrade')!.member, true);
    assert.deepEqual(keys(rb.allowed), [Y, Z, X], 'a member fetches everything it lacks');
    assert.deepEqual(keys(rb.oneAtATime.get('api/upgrade')!), [Z, X], 'Y, landed by a, comes through the cache: not held to one at a time');
    const rc = await admit(c!, set);
    assert.deepEqual([keys(rc.allowed), rc.oneAtATime.size], [[Y], 0], 'a node outside the first wave pulls what landed, as it likes');
  });

  test('a set that does not ask for a first wave, and an image another such set also wants, never wait', async () => {
    const a = node('a');
    const plain = await a.wave.admit([img(X, 'api/plain')], new Map());
    assert.deepEqual([keys(plain.allowed), plain.waiting, plain.sets.size], [[X], [], 0]);
    assert.equal(store.calls, 0, 'no call at all for a set without a first wave');
    granter = new MemoryGranter(store);
    const m = node('m');
    await admit(m);
    await settle();
    const b = node('b');
    const r = await admit(b, SET, [img(Z, 'api/upgrade', 'api/plain')]);
    assert.deepEqual(keys(r.allowed), [Z], 'Z is also wanted by a set without a first wave');
    assert.deepEqual(keys(r.waiting), [X, Y]);
  });

  test('with maxConcurrentNodes: only landed images ask for a slot, and the first wave is granted slots before the nodes queued earlier', async () => {
    granter = new MemoryGranter(store);
    const limits = new Map([['api/upgrade', { name: 'upgrade', uid: 'uid-upgrade', maxConcurrentNodes: 1 }]]);
    const gates = new Map<string, RolloutGate>();
    const gateOf = (n: string) => {
      let g = gates.get(n);
      if (!g) gates.set(n, (g = new RolloutGate({ slots: new MemoryRolloutSlots(store, n, { leaseDurationMs: LEASE_MS }), logger: silentLogger(), now: () => now, random: () => 0.5, onChange: () => {} })));
      return g;
    };
    /** The agent's order: the first wave, then the slots for what may go. */
    const go = async (n: Node, name: string) => {
      const w = await admit(n);
      return keys((await gateOf(name).admit(w.allowed, limits, () => true)).allowed);
    };
    const [a, b] = await memberAndWaiter();
    const c = node('c');
    await go(a, 'a');
    await settle();
    assert.deepEqual(await go(a, 'a'), [X, Y], 'the member holds the slot');
    assert.deepEqual(await go(b, 'b'), [], 'nothing landed: b asks for no slot');
    assert.equal(store.queue.has('upgrade.b.queue'), false);
    await pull(a, X);
    await gateOf('a').releaseAll(); // its round ends with Y still to fetch (to be retried)
    now += 1;
    assert.deepEqual(await go(b, 'b'), [], 'X landed: b queues for a slot');
    now += 1;
    await go(c, 'c');
    await settle();
    assert.deepEqual([...store.holders('upgrade').values()], ['b'], 'the slot freed by a went to b');
    now += 1;
    await go(a, 'a'); // the member queues again, after c
    await gateOf('b').releaseAll();
    await settle();
    assert.deepEqual([...store.holders('upgrade').values()], ['a'], 'the first-wave member before c, queued earlier');
    await Promise.all([...gates.values()].map((g) => g.close()));
  });

  test('a member whose pull fails steps out; another node takes its seat and fetches what has not landed', async () => {
    granter = new MemoryGranter(store);
    const a = node('a');
    const b = node('b');
    await admit(a);
    await settle();
    await admit(a);
    await pull(a, X);
    await admit(b);
    await settle();
    await a.wave.failed(['api/upgrade']);
    await settle();
    assert.ok(b.changes.includes('first-wave seat granted'), 'b was handed the seat');
    const rb = await admit(b);
    assert.equal(rb.sets.get('api/upgrade')!.member, true);
    assert.deepEqual(keys(rb.allowed), [X, Y]);
    const ra = await admit(a);
    assert.equal(ra.sets.get('api/upgrade')!.member, false, 'a waits out its cooldown as an ordinary node');
    assert.deepEqual([keys(ra.allowed), keys(ra.waiting)], [[], [Y]], 'X landed before a failed: it is in the cache');
  });

  test('a member that goes away loses its seat when its lease expires; the next node takes it', async () => {
    granter = new MemoryGranter(store);
    const dead = new MemoryRolloutSlots(store, 'dead', { leaseDurationMs: LEASE_MS });
    assert.ok(await dead.tryAcquire({ name: 'upgrade', maxConcurrentNodes: 1, pool: 'first-wave' }));
    const b = node('b');
    assert.deepEqual(keys((await admit(b)).waiting), [X, Y]);
    await settle();
    now += LEASE_MS + 1;
    granter.pass();
    await settle();
    const r = await admit(b);
    assert.equal(r.sets.get('api/upgrade')!.member, true);
    assert.deepEqual(keys(r.allowed), [X, Y]);
  });

  test('never forever: nothing landed for 30 minutes, a node pulls by itself', async () => {
    const b = node('b');
    // A member that holds its seat and lands nothing (alive, stuck).
    const stuck = node('stuck');
    granter = new MemoryGranter(store);
    await admit(stuck);
    await settle();
    await admit(stuck);
    // It renews its seat all along (the test's clock moves faster than its renewal timer).
    for (const s of store.slots.values()) if (s.holder === 'stuck') s.durationMs = 10 * STALL_MS;
    assert.deepEqual(keys((await admit(b)).waiting), [X, Y]);
    now += STALL_MS - 1000;
    assert.deepEqual(keys((await admit(b)).waiting), [X, Y]);
    assert.ok(b.wave.nextAttemptAt()! <= now + 1000, 'the node is due again when the wait runs out');
    now += 1000;
    const r = await admit(b);
    assert.deepEqual(keys(r.allowed), [X, Y]);
    assert.equal(r.sets.get('api/upgrade')!.stalled, true);
  });

  test('a node that may not use the Leases (403) pulls without waiting, and says so', async () => {
    store.forbidden = 'leases.coordination.k8s.io is forbidden';
    const a = node('a');
    await admit(a);
    now += LEASE_MS;
    const r = await admit(a);
    assert.deepEqual(keys(r.allowed), [X, Y]);
    assert.match(r.sets.get('api/upgrade')!.forbidden!, /forbidden/);
    assert.equal(store.openWatches, 0, 'it follows no record it may not read');
  });

  test('a new image list is a new first wave: the old landings do not count', async () => {
    granter = new MemoryGranter(store);
    const a = node('a');
    const b = node('b');
    await admit(a);
    await settle();
    await admit(a);
    await pull(a, X, Y);
    assert.deepEqual((await admit(b)).allowed.length, 2);
    const next: WaveSet = { ...SET, digests: [X, Z] };
    const rb = await admit(b, next);
    assert.deepEqual([keys(rb.allowed), keys(rb.waiting)], [[], [X, Z]], 'X of the old list does not count for the new one');
  });

  test('done: a node with nothing left to fetch frees its seat and follows no record; close() leaves nothing behind', async () => {
    const [a, b] = await memberAndWaiter();
    assert.ok(store.openWatches >= 2, 'each node follows the set\'s record');
    await pull(a, X, Y);
    await a.wave.admit([], new Map([['api/upgrade', SET]]));
    await settle();
    assert.deepEqual([...store.holders('upgrade', 'first-wave').values()], ['b'], 'the seat went on to b, which still lacks images');
    assert.equal((await admit(b)).sets.get('api/upgrade')!.member, false, 'b needs no seat: what it lacks has landed');
    assert.equal(store.holders('upgrade', 'first-wave').size, 0, 'so it gave the seat up');
    const record = store.records.get(landedName('upgrade', 0))!;
    assert.equal(record.holder, 'a', 'the record still names the node that landed the images');
    assert.deepEqual([...decodeLanded(sortedDigests(SET.digests), record.landed)].sort(), [X, Y]);
    await b.wave.close();
    await a.wave.close();
    await settle();
    assert.equal(store.openWatches, 0);
    assert.equal(store.queue.size, 0);
    assert.equal(store.holders('upgrade', 'first-wave').size, 0);
  });

  test('the API unreachable while a member records: retried, paced; the others see the landing once it is back', async () => {
    const [a, b] = await memberAndWaiter();
    store.unavailable = 'connection refused';
    a.has.add(X);
    await a.wave.held(a.has);
    const writes = store.writes.records;
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(store.writes.records, writes, 'nothing written while unreachable');
    store.unavailable = undefined;
    await new Promise((r) => setTimeout(r, 1200));
    await settle();
    assert.deepEqual(keys((await admit(b)).allowed), [X], 'the retry (a second later) got through');
  });
});
