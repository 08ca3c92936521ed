// The slot protocol a node follows (src/rollout/gate.ts), on the in-memory
// slots (whose likeness to the Lease implementation is pinned down in
// test/integration/rollout-slots.test.ts), with a clock the test moves.
import { afterEach, beforeEach, describe, mock, test } from 'node:test';
import assert from 'node:assert/strict';
import { RolloutGate, type GateImage } from '../../src/rollout/gate.ts';
import { MemoryRolloutSlots, MemorySlotStore } from '../../src/rollout/memory-slots.ts';
import { candidateSlots, setLabelValue, slotFree, slotIndex, slotName, type RolloutSet } from '../../src/rollout/slots.ts';
import { silentLogger } from '../../src/util/log.ts';

const LEASE_MS = 60_000;
let now: number;
let store: MemorySlotStore;

function gate(node: string, over: Partial<ConstructorParameters<typeof RolloutGate>[0]> = {}): RolloutGate {
  return new RolloutGate({
    slots: new MemoryRolloutSlots(store, node, { leaseDurationMs: LEASE_MS }),
    logger: silentLogger(),
    now: () => now,
    random: () => 0.5,
    firstAttemptSpreadMs: 0,
    ...over,
  });
}

const limited = (name: string, max: number): [string, RolloutSet] => [`api/${name}`, { name, uid: `uid-${name}`, maxConcurrentNodes: max }];
const img = (key: string, ...sets: string[]): GateImage => ({ key, sets: sets.map((s) => (s.includes('/') ? s : `api/${s}`)) });
const keys = (xs: readonly GateImage[]) => xs.map((x) => x.key);
const all = () => true;

beforeEach(() => {
  now = Date.parse('2026-01-01T00:00:00Z');
  store = new MemorySlotStore({ now: () => now });
});

describe('slot names', () => {
  test('<set>-<i>, read back only for that set; a long name is cut and hashed to 253 characters', () => {
    assert.equal(slotName('web', 0), 'web-0');
    assert.equal(slotName('web', 12), 'web-12');
    assert.equal(slotIndex('web', 'web-12'), 12);
    assert.equal(slotIndex('web', 'web-x-1'), undefined);
    assert.equal(slotIndex('web', 'web-01'), undefined);
    assert.equal(slotIndex('web-1', 'web-1'), undefined, 'set web-1 and set web are told apart');
    assert.equal(slotIndex('web', 'web-1'), 1);
    const long = `${'a'.repeat(200)}.${'b'.repeat(52)}`;
    for (const i of [0, 7, 12345]) {
      const n = slotName(long, i);
      assert.ok(n.length <= 253, n);
      assert.match(n, /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/);
      assert.equal(slotIndex(long, n), i);
    }
    assert.notEqual(slotName(long, 0), slotName(`${long.slice(0, -1)}c`, 0), 'two long names that share a start do not share slots');
  });

  test('the label value is the set name, or its start and a hash when longer than 63', () => {
    assert.equal(setLabelValue('web'), 'web');
    const v = setLabelValue(`${'x'.repeat(61)}.-y.z`);
    assert.ok(v.length <= 63);
    assert.match(v, /^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$/);
  });

  test('a slot is free with no holder or once its last renewal plus its duration has passed', () => {
    assert.equal(slotFree(undefined, 0, 1000, 0), true);
    assert.equal(slotFree('', 0, 1000, 0), true);
    assert.equal(slotFree('a', 0, 1000, 1000), false);
    assert.equal(slotFree('a', 0, 1000, 1001), true);
    assert.equal(slotFree('a', undefined, 1000, 0), true, 'a holder that never renewed holds nothing');
  });

  test('candidates: free slots and absent indices below the limit, shuffled; a huge limit is sampled, not walked', () => {
    const existing = new Map([[0, { free: false }], [1, { free: true }], [7, { free: true }]]);
    const c = candidateSlots(4, existing, Math.random, 10);
    assert.deepEqual(c.map((x) => x.index).sort(), [1, 2, 3]);
    assert.ok(c.find((x) => x.index === 1)!.exists);
    const big = candidateSlots(2 ** 31 - 1, new Map(), Math.random, 4);
    assert.equal(big.length, 4);
  });
});

describe('RolloutGate: which downloads go', () => {
  test('a set with no limit, and an image that downloads nothing, need no slot', async () => {
    const g = gate('n1');
    const { allowed, waits } = await g.admit([img('free', 'open'), img('held', 'web'), img('static', 'static/boot')], new Map([limited('web', 1)]), (w) => w.key !== 'held');
    assert.deepEqual(keys(allowed), ['free', 'held', 'static']);
    assert.equal(waits.size, 0);
    assert.deepEqual(g.held(), [], 'no slot taken');
    assert.equal(store.slots.size, 0);
  });

  test('a limited set takes a slot before its images go; with every slot held, it waits', async () => {
    const a = gate('n1');
    const b = gate('n2');
    const limits = new Map([limited('web', 1)]);
    assert.deepEqual(keys((await a.admit([img('x', 'web')], limits, all)).allowed), ['x']);
    assert.deepEqual(a.held(), ['api/web']);
    const r = await b.admit([img('x', 'web')], limits, all);
    assert.deepEqual(r.allowed, []);
    assert.deepEqual([...r.waits], [['api/web', { maxConcurrentNodes: 1 }]]);
  });

  test('an image in a limited and an unlimited set goes without a slot; in two limited sets, under whichever holds one', async () => {
    const limits = new Map([limited('web', 1), limited('db', 1)]);
    const other = gate('other');
    await other.admit([img('d', 'db')], limits, all); // db's only slot is taken
    const g = gate('n1');
    const r = await g.admit([img('shared', 'web', 'db'), img('d', 'db'), img('open', 'web', 'api/unlimited')], limits, all);
    assert.deepEqual(keys(r.allowed), ['shared', 'open']);
    assert.deepEqual(g.held(), ['api/web']);
    assert.deepEqual([...r.waits.keys()], ['api/db'], 'db still waits for its own image');
  });

  test('no deadlock: a node holding one set\'s slot and wanting another\'s downloads what it holds, then frees it', async () => {
    const limits = new Map([limited('web', 1), limited('db', 1)]);
    const [a, b] = [gate('a'), gate('b')];
    await a.admit([img('w', 'web')], limits, all); // a holds web's only slot
    await b.admit([img('d', 'db')], limits, all); // b holds db's only slot
    const both = [img('w', 'web'), img('d', 'db')];
    const ra = await a.admit(both, limits, all);
    const rb = await b.admit(both, limits, all);
    assert.deepEqual([keys(ra.allowed), [...ra.waits.keys()]], [['w'], ['api/db']]);
    assert.deepEqual([keys(rb.allowed), [...rb.waits.keys()]], [['d'], ['api/web']]);
    // Each downloads what it has a slot for and frees it; neither waited holding.
    await a.releaseAll();
    await b.releaseAll();
    now += 60_000;
    assert.deepEqual(keys((await a.admit([img('d', 'db')], limits, all)).allowed), ['d']);
    assert.deepEqual(keys((await b.admit([img('w', 'web')], limits, all)).allowed), ['w']);
  });

  test('a set with nothing left to download gives its slot back at the next admit; releaseAll frees every slot', async () => {
    const limits = new Map([limited('web', 1), limited('db', 1)]);
    const g = gate('n1');
    await g.admit([img('w', 'web'), img('d', 'db')], limits, all);
    assert.deepEqual(g.held(), ['api/db', 'api/web']);
    await g.admit([img('d', 'db')], limits, all);
    assert.deepEqual(g.held(), ['api/db']);
    assert.deepEqual([...store.slots.keys()], ['db-0']);
    await g.releaseAll();
    assert.deepEqual(g.held(), []);
    assert.equal(store.slots.size, 0);
  });

  test('errors reaching the slots: the set waits, says why, and tries again later', async () => {
    store.unavailable = 'connect ECONNREFUSED 10.96.0.1:443';
    const g = gate('n1');
    const r = await g.admit([img('x', 'web')], new Map([limited('web', 2)]), all);
    assert.deepEqual(r.allowed, []);
    assert.deepEqual(r.waits.get('api/web'), { maxConcurrentNodes: 2, error: 'connect ECONNREFUSED 10.96.0.1:443' });
    assert.ok(g.nextAttemptAt()! > now);
  });
});

describe('RolloutGate: a node that may not hold slots', () => {
  test('403 (a node\'s own credentials may not write Leases outside kube-node-lease): the set downloads without a slot, says so, and tries again at a pace', async () => {
    store.forbidden = 'HTTP 403: leases.coordination.k8s.io is forbidden: User "system:node:worker-1" cannot list resource "leases" in the namespace "pinset-system"';
    const g = gate('worker-1');
    const limits = new Map([limited('web', 1)]);
    const r = await g.admit([img('x', 'web'), img('open', 'api/unlimited')], limits, all);
    assert.deepEqual(keys(r.allowed), ['x', 'open'], 'not waiting for ever');
    assert.equal(r.waits.size, 0);
    assert.match(r.unenforced.get('api/web')!, /^HTTP 403: .* cannot list resource "leases"/);
    const next = g.nextAttemptAt()!;
    assert.ok(next > now, 'the next attempt is paced');
    // Not due yet: still downloading without a slot, and nothing asked.
    assert.deepEqual(keys((await g.admit([img('x', 'web')], limits, all)).allowed), ['x']);
    // Access granted later: the next attempt takes a slot.
    store.forbidden = undefined;
    now = next;
    const later = await g.admit([img('x', 'web')], limits, all);
    assert.deepEqual(keys(later.allowed), ['x']);
    assert.equal(later.unenforced.size, 0);
    assert.deepEqual(g.held(), ['api/web']);
  });
});

describe('RolloutGate: pacing', () => {
  test('a waiting set is retried at a capped exponential pace with jitter, not before it is due', async () => {
    // A holder that keeps its slot for the whole test.
    const holder = gate('holder', { slots: new MemoryRolloutSlots(store, 'holder', { leaseDurationMs: 3_600_000 }) });
    const limits = new Map([limited('web', 1)]);
    await holder.admit([img('x', 'web')], limits, all);
    let attempts = 0;
    const slots = new MemoryRolloutSlots(store, 'n1', { leaseDurationMs: LEASE_MS });
    const counting = Object.assign(Object.create(slots) as MemoryRolloutSlots, {
      tryAcquire: (s: RolloutSet) => {
        attempts++;
        return slots.tryAcquire(s);
      },
    });
    const g = gate('n1', { slots: counting, random: () => 1 });
    const delays: number[] = [];
    for (let i = 0; i < 8; i++) {
      await g.admit([img('x', 'web')], limits, all);
      const next = g.nextAttemptAt()!;
      await g.admit([img('x', 'web')], limits, all); // not due: no attempt
      delays.push(next - now);
      now = next;
    }
    assert.equal(attempts, 8, 'one attempt per due time, none in between');
    // Default pace: from a twelfth of the lease duration (5 s) up to all of it (60 s); random() = 1 is the top of each jitter range.
    assert.deepEqual(delays, [5_000, 10_000, 20_000, 40_000, 60_000, 60_000, 60_000, 60_000]);
    await holder.close();
  });

  test('a set seen for the first time is first tried after a random delay of up to a sixth of the lease duration', async () => {
    const g = gate('n1', { firstAttemptSpreadMs: undefined, random: () => 0.999 });
    const r = await g.admit([img('x', 'web')], new Map([limited('web', 5)]), all);
    assert.deepEqual(r.allowed, [], 'not tried yet');
    assert.equal(r.waits.get('api/web')?.maxConcurrentNodes, 5);
    assert.equal(g.nextAttemptAt(), now + Math.floor(0.999 * (LEASE_MS / 6)));
    assert.equal(store.slots.size, 0);
    now = g.nextAttemptAt()!;
    assert.equal((await g.admit([img('x', 'web')], new Map([limited('web', 5)]), all)).allowed.length, 1);
  });
});

describe('RolloutGate: holding', () => {
  afterEach(() => mock.timers.reset());

  test('a held slot is renewed every third of the lease duration, so it outlives the lease; close() frees it', async () => {
    mock.timers.enable({ apis: ['setInterval'] });
    const g = gate('n1');
    const limits = new Map([limited('web', 1)]);
    await g.admit([img('x', 'web')], limits, all);
    for (let i = 0; i < 9; i++) {
      now += 20_000;
      mock.timers.tick(20_000);
      await new Promise((r) => setImmediate(r));
    }
    assert.equal(store.holders('web').get('web-0'), 'n1', 'still held three lease durations later');
    assert.equal((await gate('n2').admit([img('x', 'web')], limits, all)).allowed.length, 0);
    await g.close();
    assert.equal(store.slots.size, 0);
  });

  test('a slot lost to another node (not renewed in time) is dropped and reported; the images it let through may start no more; the next admit waits for a slot', async () => {
    mock.timers.enable({ apis: ['setInterval'] });
    const lost: string[] = [];
    const g = gate('n1', { onLost: (k) => lost.push(k) });
    const limits = new Map([limited('web', 1)]);
    const free = { key: 'free', sets: ['static/boot'] };
    const first = await g.admit([img('x', 'web'), img('y', 'web'), free], limits, all);
    assert.equal(first.allowed.length, 3);
    assert.ok(first.allowed.every((w) => first.stillAllowed(w)), 'all may start while the slot is held');
    now += LEASE_MS + 1; // this node stalled past its lease; another takes the slot
    assert.equal((await gate('n2').admit([img('x', 'web')], limits, all)).allowed.length, 1);
    mock.timers.tick(20_000);
    await new Promise((r) => setImmediate(r));
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(lost, ['api/web']);
    assert.deepEqual(g.held(), []);
    assert.deepEqual(first.allowed.map((w) => first.stillAllowed(w)), [false, false, true], 'the slot\'s images are held back; an image no limit covers is not');
    assert.equal((await g.admit([img('x', 'web')], limits, all)).allowed.length, 0);
  });
});
