// bench/eta-replay.ts: recorded rollouts fed through the controller's
// estimate, and the ETA at half-way taken as bench:fleet takes it.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { errorPercent, halfWay, observationsFromReports, replayRow, type RecordedReport, type RecordedRow } from '../../bench/eta-replay.ts';

const report = (atMs: number, node: string, present: number, over: Partial<RecordedReport> = {}): RecordedReport => ({
  atMs, node, phase: 'Progressing', reason: 'Pulling', desiredGeneration: 1, currentGeneration: 0,
  images: { wanted: 1, present: 0, pinned: 0 }, bytes: { present, total: 1000 }, ...over,
});
const ready = (atMs: number, node: string) => report(atMs, node, 1000, { phase: 'Ready', reason: 'AllImagesPinned', currentGeneration: 1, images: { wanted: 1, present: 1, pinned: 1 } });

describe('eta-replay', () => {
  test('reports read in the same sweep are one observation; a node not yet reported counts as progressing', () => {
    const obs = observationsFromReports([report(0, 'a', 0), report(0, 'b', 0), report(500, 'a', 100)], ['a', 'b', 'c']);
    assert.deepEqual(obs.map((o) => [o.atMs, o.nodes.map((n) => n.verdict)]), [[0, ['progressing', 'progressing', 'progressing']], [500, ['progressing', 'progressing', 'progressing']]]);
    assert.deepEqual(obs[0]!.nodes[2], { node: 'c', verdict: 'progressing' });
  });

  test('half-way: the first estimate with half present, and the last one at or before half the time; the error against the real end', () => {
    const estimates = [
      { atMs: 0, present: 0, total: 100 },
      { atMs: 4000, present: 40, total: 100, etaMs: 12_000 },
      { atMs: 6000, present: 50, total: 100, etaMs: 9_000 },
    ];
    const h = halfWay(estimates, 10_000);
    assert.deepEqual(h.halfPresent, { atMs: 6000, tookMs: 4000, saidMs: 3000 });
    assert.deepEqual(h.halfTime, { atMs: 5000, tookMs: 5000, saidMs: 7000 });
    assert.equal(errorPercent(h.halfPresent), -25);
    assert.equal(errorPercent(h.halfTime), 40);
    assert.equal(errorPercent({ atMs: 0, tookMs: 1 }), undefined);
  });

  test('a recorded one-slot rollout of three nodes replayed from its reports: no ETA before bytes grow, the pace once two are done', () => {
    const reports = [
      report(0, 'n1', 0), report(0, 'n2', 0, { reason: 'WaitingForRolloutSlot' }), report(0, 'n3', 0, { reason: 'WaitingForRolloutSlot' }),
      report(2000, 'n1', 500, { rate: 250 }),
      ready(4000, 'n1'), report(4000, 'n2', 0),
      ready(5000, 'n2'), report(5000, 'n3', 0),
      ready(6000, 'n3'),
    ];
    const row: RecordedRow = { row: 'one-slot', label: '3 nodes, one slot', fleetMs: 6000, readyMs: { n1: 4000, n2: 5000, n3: 6000 }, images: [{ ref: 'x', bytes: 1000 }], reports };
    const r = replayRow(row, 10_000)!;
    assert.equal(r.source, 'reports');
    // Half present (1500 of 3000) at 5 s: two done, 1 s apart; one node left, which may go at once: the bytes at the measured rate.
    assert.equal(r.halfPresent?.atMs, 5000);
    assert.equal(r.halfPresent?.tookMs, 1000);
    assert.ok(r.halfPresent?.saidMs !== undefined);
    // Half the time (3 s): the estimate made at 2 s, from the first node's 500 bytes in 2 s.
    assert.equal(r.halfTime?.atMs, 3000);
    assert.ok(r.halfTime?.saidMs !== undefined && r.halfTime.saidMs > 0);
  });
});
