// Who gets a slot that frees (src/rollout/grants.ts planGrants): the
// decision the granter makes on Leases and its in-memory twin makes alike.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { planGrants, type QueueEntryView, type SlotView } from '../../src/rollout/grants.ts';

const NOW = Date.parse('2026-01-01T00:00:00Z');
const held = (index: number, holder: string, renewedAgoMs = 0, durationMs = 60_000): SlotView => ({ name: `web-${index}`, index, holder, renewedAt: NOW - renewedAgoMs, durationMs, version: '1' });
const entry = (node: string, queuedAgoMs: number, granted?: string): QueueEntryView => ({ name: `web.${node}.queue`, node, queuedAt: NOW - queuedAgoMs, ...(granted ? { granted } : {}), version: '7', uid: `uid-${node}` });
const grants = (p: ReturnType<typeof planGrants>) => p.grants.map((g) => `${g.index}:${g.node}`);

describe('planGrants', () => {
  test('free slots go to the nodes queued longest, in order, up to the limit', () => {
    const p = planGrants({ max: 3, slots: [held(1, 'a')], queue: [entry('late', 10), entry('first', 30), entry('second', 20)] }, NOW);
    assert.deepEqual(grants(p), ['0:first', '2:second']);
    assert.equal(p.grants[0]!.slot, undefined, 'an index with no Lease is created');
    assert.deepEqual(p.lapsed, []);
  });

  test('an expired slot or one left without a holder is granted over its Lease (with its version)', () => {
    const expired = held(0, 'dead', 61_000);
    const p = planGrants({ max: 1, slots: [expired], queue: [entry('b', 5)] }, NOW);
    assert.deepEqual(grants(p), ['0:b']);
    assert.equal(p.grants[0]!.slot, expired);
  });

  test('never more live slots than the limit: live slots above a lowered limit count', () => {
    const p = planGrants({ max: 2, slots: [held(3, 'x'), held(4, 'y')], queue: [entry('b', 5)] }, NOW);
    assert.deepEqual(grants(p), []);
  });

  test('a node that holds a slot, or whose grant is pending, is not granted again; one entry per node counts', () => {
    const p = planGrants(
      {
        max: 4,
        slots: [held(0, 'holder'), held(1, 'pending', 0, 10_000)],
        queue: [entry('holder', 50), entry('pending', 40, 'web-1'), entry('twice', 30), { ...entry('twice', 20), name: 'other-name' }, entry('c', 10)],
      },
      NOW,
    );
    assert.deepEqual(grants(p), ['2:twice', '3:c']);
  });

  test('a grant not taken within its lease lapses: the entry is dropped, the slot goes to the next node', () => {
    const lapsedGrant = held(0, 'slow', 11_000, 10_000);
    const p = planGrants({ max: 1, slots: [lapsedGrant], queue: [entry('slow', 50, 'web-0'), entry('next', 10)] }, NOW);
    assert.deepEqual(p.lapsed.map((e) => e.node), ['slow']);
    assert.deepEqual(grants(p), ['0:next']);
  });

  test('a grant whose slot another node took meanwhile lapses too', () => {
    const p = planGrants({ max: 1, slots: [held(0, 'poller')], queue: [entry('b', 50, 'web-0')] }, NOW);
    assert.deepEqual(p.lapsed.map((e) => e.node), ['b']);
    assert.deepEqual(grants(p), []);
  });

  test('preferred nodes (a set\'s first wave, for its rollout slots) are served first, then by age', () => {
    const p = planGrants({ max: 2, slots: [], queue: [entry('old', 90), entry('member', 5), entry('mid', 50)], preferred: new Set(['member']) }, NOW);
    assert.deepEqual(grants(p), ['0:member', '1:old']);
  });

  test('nextCheckAt: just after the first live slot expires', () => {
    const p = planGrants({ max: 2, slots: [held(0, 'a', 10_000), held(1, 'b', 50_000)], queue: [entry('c', 5)] }, NOW);
    assert.equal(p.nextCheckAt, NOW + 10_000 + 1);
    assert.equal(planGrants({ max: 1, slots: [], queue: [] }, NOW).nextCheckAt, undefined);
  });
});
