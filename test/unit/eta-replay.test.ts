// bench/eta-replay.ts: recorded rollouts fed through the controller's
// estimate, and the ETA at half-way taken as bench:fleet takes it.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { errorPercent, halfWay, observationsFromReports, replayRow, withMirrored, withPullRates, type RecordedReport, type RecordedRow } from '../../bench/eta-replay.ts';

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
  test('a recorded first-wave rollout: the wave\'s time alone until a node pulled behind it, then the followers at the rate they pulled from inside', () => {
    const w = (atMs: number, node: string, reason: string, present?: number, rate?: number, images = 0): RecordedReport => ({
      atMs, node, phase: 'Progressing', reason, desiredGeneration: 1, currentGeneration: 0, images: { wanted: 5, present: images, pinned: images },
      ...(present !== undefined ? { bytes: { present, total: 1000 } } : {}), ...(rate !== undefined ? { rate } : {}),
    });
    const reports = [
      // Before the wave is chosen every node says it waits for it.
      w(0, 'w', 'WaitingForFirstWave'), w(0, 'f1', 'WaitingForFirstWave'), w(0, 'f2', 'WaitingForFirstWave'),
      w(500, 'w', 'Pulling', 0),
      w(2000, 'w', 'Pulling', 300, 150, 1),
      w(4000, 'w', 'Pulling', 600, 150, 3), w(4000, 'f1', 'WaitingForFirstWave', 400, 1000, 2), w(4000, 'f2', 'WaitingForFirstWave', 400, 1000, 2),
      ready(6500, 'w'),
      w(7000, 'f1', 'Pulling', 800, 1000, 4), w(7000, 'f2', 'Pulling', 800, 1000, 4),
      ready(7500, 'f1'), ready(7500, 'f2'),
    ];
    const row: RecordedRow = { row: 'first-wave', label: '3 nodes, a first wave of one', fleetMs: 7500, readyMs: { w: 6500, f1: 7500, f2: 7500 }, images: [{ ref: 'x', bytes: 1000 }], reports };
    const r = replayRow(row, 10_000)!;
    // Half the time (3.75 s), as estimated at 2 s: the wave's 700 bytes at 150/s (4.67 s), to the whole second (7 s);
    // the followers, not yet seen pulling, are not counted at the wave's rate over the link: a lower bound, said so.
    assert.deepEqual(r.halfTime, { atMs: 3750, tookMs: 3750, saidMs: 3250, lowerBound: true });
    // Half present (1500 of 3000) at 6.5 s, the wave done: each follower's 600 bytes at the 1000/s they pulled at: 7.1 s, 7 s whole.
    assert.deepEqual(r.halfPresent, { atMs: 6500, tookMs: 1000, saidMs: 500 });
  });

  test('reports from before the pull rate get it rebuilt from the pull logs: the bytes of the images pulled over the time a pull ran', () => {
    const rep = (atMs: number, present: number): RecordedReport => ({
      atMs, node: 'n', phase: 'Progressing', reason: 'WaitingForFirstWave', desiredGeneration: 1, currentGeneration: 0, images: { wanted: 4, present: present / 100, pinned: 0 }, bytes: { present, total: 400 }, rate: 10,
    });
    const row = {
      images: [{ ref: 'a', bytes: 100 }, { ref: 'b', bytes: 100 }],
      // Two pulls of 0.5 s each, 10 s apart (waiting for the wave between).
      pulls: [{ node: 'n', image: 'a', startedMs: 1000, finishedMs: 1500 }, { node: 'n', image: 'b', startedMs: 11_000, finishedMs: 11_500 }],
    };
    const out = withPullRates([rep(500, 0), rep(2000, 100), rep(12_000, 200)], row);
    assert.equal(out[0]!.pullRate, undefined, 'no pull finished yet');
    assert.equal(out[1]!.pullRate, 200, '100 bytes in 0.5 s');
    assert.equal(out[2]!.pullRate, 200, '200 bytes in the 1 s the pulls ran, not over the 11 s');
    assert.deepEqual(withPullRates([{ ...rep(500, 0), pullRate: 7 }], row), [{ ...rep(500, 0), pullRate: 7 }], 'recorded ones are kept as they are');
    assert.equal(withMirrored([rep(500, 0)], 'one-slot')[0]!.mirrored, true);
    assert.equal(withMirrored([rep(500, 0)], 'no-cache')[0]!.mirrored, undefined);
  });
});
