// What `pinset status` says of progress: the per-node cells, the line per
// set, the progress bar, and --watch's frames and change lines.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { NodeSetStatus, PinnedImageSet } from '../../src/api/types.ts';
import { bytesCell, controllerRate, etaText, nodeRemainingMs, percentOf, progressBar, progressLine, rateCell, SetProgressCollector, type SetProgressView } from '../../src/cli/status-progress.ts';
import { formatAge, statusRows } from '../../src/cli/status-table.ts';
import { changeLines, frameLines, type WatchView } from '../../src/cli/status-watch.ts';

const NOW = Date.parse('2026-12-07T12:00:00Z');
const UID = 'u-1';

function entry(over: Partial<NodeSetStatus> = {}): NodeSetStatus {
  return { name: 'upgrade', uid: UID, source: 'api', desiredGeneration: 1, currentGeneration: 0, images: { wanted: 4, present: 1, pinned: 4, failed: 0, invalid: 0 }, phase: 'Progressing', reason: 'Pulling', ...over };
}

function set(status?: PinnedImageSet['status']): PinnedImageSet {
  return { apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name: 'upgrade', uid: UID, generation: 1 }, spec: { nodeSelector: { matchLabels: { role: 'worker' } }, pinnedImages: [1, 2, 3, 4].map((i) => ({ name: `quay.io/org/app${i}@sha256:${'a'.repeat(64)}` })) }, ...(status ? { status } : {}) };
}

const reading = (sets: NodeSetStatus[], updatedAt = new Date(NOW - 10_000).toISOString()) => ({ status: { version: 2 as const, pinFile: 'x', updatedAt, sets } });

describe('the per-node cells', () => {
  test('BYTES: the share present of the total; 100% only when all are present; "-" without bytes', () => {
    assert.equal(bytesCell(entry({ bytes: { present: 1, total: 3 * 1024 ** 2 } })), '0% of 3.0 MiB');
    assert.equal(bytesCell(entry({ bytes: { present: 999, total: 1000 } })), '99% of 1000 B');
    assert.equal(bytesCell(entry({ bytes: { present: 1000, total: 1000 } })), '100% of 1000 B');
    assert.equal(bytesCell(entry()), '-');
    assert.equal(percentOf(0, 0), 100);
  });

  test('RATE and ETA: from the node\'s own rate, counted from when it reported', () => {
    const e = entry({ bytes: { present: 200, total: 1200 }, rate: 20 });
    assert.equal(rateCell(e), '20 B/s');
    // 1000 left at 20 B/s: 50 s after the report, which is 10 s old.
    assert.equal(nodeRemainingMs(e, NOW - 10_000, NOW), 40_000);
    assert.equal(etaText(nodeRemainingMs(e, NOW - 10_000, NOW), formatAge), '40s');
    assert.equal(etaText(nodeRemainingMs(e, NOW - 90_000, NOW), formatAge), '0s', 'a report older than its ETA: due now, never negative');
    assert.equal(nodeRemainingMs(entry({ bytes: { present: 200, total: 1200 } }), NOW, NOW), undefined, 'no rate');
    assert.equal(nodeRemainingMs({ ...e, phase: 'Ready' }, NOW, NOW), undefined);
    assert.equal(etaText(undefined, formatAge), '-');
  });

  test('the rows carry them: a node downloading, one waiting for a slot, one from an agent before bytes', () => {
    const rows = statusRows(
      [
        { name: 'a', labels: {}, reading: reading([entry({ bytes: { present: 600, total: 1200 }, rate: 60 })]) },
        { name: 'b', labels: {}, reading: reading([entry({ reason: 'WaitingForRolloutSlot', images: { wanted: 4, present: 0, pinned: 4, failed: 0, invalid: 0 } })]) },
        { name: 'c', labels: {}, reading: reading([entry()]) },
      ],
      new Date(NOW),
    );
    assert.deepEqual(rows.map((r) => [r.node, r.bytes, r.rate, r.eta]), [
      ['a', '50% of 1.2 KiB', '60 B/s', '0s'],
      ['b', '-', '-', '-'],
      ['c', '-', '-', '-'],
    ]);
  });
});

describe('the line per set', () => {
  const views = (s: PinnedImageSet, nodes: { labels: Record<string, string>; sets: NodeSetStatus[] }[]): SetProgressView[] => {
    const c = new SetProgressCollector([s]);
    for (const n of nodes) c.add(n.labels, reading(n.sets));
    return c.views();
  };
  const worker = { role: 'worker' };

  test('bytes across the nodes the set selects, with the controller\'s rate and ETA', () => {
    const eta = new Date(NOW + 250_000).toISOString().replace('.000Z', 'Z');
    const s = set({ observedGeneration: 1, progress: { unit: 'bytes', present: 1, total: 2, rate: 4 * 1024 ** 2, nodesDownloading: 1, nodesWaiting: 1, estimatedCompletionTime: eta, summary: 'x' } });
    const [v] = views(s, [
      { labels: worker, sets: [entry({ bytes: { present: 300 * 1024 ** 2, total: 1024 ** 3 }, rate: 1 })] },
      { labels: worker, sets: [entry({ reason: 'WaitingForRolloutSlot', images: { wanted: 4, present: 0, pinned: 4, failed: 0, invalid: 0 } })] },
      { labels: { role: 'control-plane' }, sets: [entry({ bytes: { present: 0, total: 5 } })] },
    ]);
    assert.equal(v!.work.total, 2 * 1024 ** 3, 'the waiting node counts as the one that reports bytes; the unselected node not at all');
    assert.equal(
      progressLine(v!, { by: 'controller', rate: 4 * 1024 ** 2, eta: Date.parse(eta) }, NOW, formatAge),
      `upgrade: 14% of 2.0 GiB, 4.0 MiB/s (1 downloading, 1 waiting); done in about 4m10s (${eta})`,
    );
  });

  test('an ETA the controller says is a lower bound reads "≥"', () => {
    const eta = new Date(NOW + 30_000).toISOString().replace('.000Z', 'Z');
    const s = set({ observedGeneration: 1, progress: { unit: 'bytes', present: 1, total: 2, nodesDownloading: 1, nodesWaiting: 1, estimatedCompletionTime: eta, estimatedCompletionIsLowerBound: true, summary: 'x' } });
    const [v] = views(s, [{ labels: worker, sets: [entry({ bytes: { present: 300, total: 1000 }, rate: 1 })] }]);
    const r = controllerRate(v!);
    assert.equal(r.lowerBound, true);
    assert.match(progressLine(v!, r, NOW, formatAge), /; done in ≥ 30s \(not before 2026-12-07T12:00:30Z: how long the nodes after the first take is not known yet\)$/);
  });

  test('without the controller\'s progress: said, or the command\'s own estimate, marked', () => {
    const [v] = views(set(), [{ labels: worker, sets: [entry()] }]);
    assert.equal(v!.controller, undefined);
    assert.equal(progressLine(v!, { by: 'none' }, NOW, formatAge), "upgrade: 25% of 4 images (1 downloading); no ETA: the set's status has no progress from `pinset controller` (is it running?)");
    assert.match(progressLine(v!, { by: 'here', rate: 0.5, eta: NOW + 6000 }, NOW, formatAge), /^upgrade: 25% of 4 images, 0\.50 images\/s \(1 downloading\); done in about 6s \(2026-12-07T12:00:06Z\), estimated here$/);
  });

  test('a status about an older generation is not shown as this one\'s', () => {
    const s = set({ observedGeneration: 0, progress: { unit: 'bytes', present: 1, total: 2, nodesDownloading: 0, nodesWaiting: 0, summary: 'x' } });
    assert.equal(views(s, [{ labels: worker, sets: [entry()] }])[0]!.controller, undefined);
  });

  test('every node done: no ETA to give', () => {
    const [v] = views(set(), [{ labels: worker, sets: [entry({ phase: 'Ready', reason: 'AllImagesPinned', currentGeneration: 1, images: { wanted: 4, present: 4, pinned: 4, failed: 0, invalid: 0 } })] }]);
    assert.equal(progressLine(v!, { by: 'none' }, NOW, formatAge), 'upgrade: 100% of 4 images (every selected node done)');
  });

  test('the bar: filled in proportion, 100% only when all is present', () => {
    assert.equal(progressBar(1, 4, 8), '[##......]  25%');
    assert.equal(progressBar(999, 1000, 10), '[#########.]  99%');
    assert.equal(progressBar(5, 5, 4), '[####] 100%');
  });
});

describe('--watch: the frame on a terminal, the lines elsewhere', () => {
  const view = (present: number, eta?: number): WatchView => {
    const c = new SetProgressCollector([set()]);
    c.add({ role: 'worker' }, reading([entry({ bytes: { present, total: 1000 }, rate: 10 })]));
    const [v] = c.views();
    const rows = statusRows([{ name: 'worker-1', labels: { role: 'worker' }, reading: reading([entry({ bytes: { present, total: 1000 }, rate: 10 })]) }], new Date(NOW));
    return { rows, sets: [{ view: v!, rate: { by: 'here', rate: 10, ...(eta ? { eta } : {}) } }] };
  };

  test('a frame: a bar per set, then the table, cut to the terminal\'s height and width', () => {
    const lines = frameLines(view(400, NOW + 60_000), NOW, 200, 40, false, 2000);
    assert.match(lines[0]!, /^pinset status --watch: every 2s, 2026-12-07T12:00:00Z$/);
    assert.match(lines[1]!, /^upgrade {2}\[#{12}\.{18}\] {2}40% {2}400 B of 1000 B {2}10 B\/s {2}ETA 60s \(2026-12-07T12:01:00Z\)\* {2}0\/1 nodes ready, 1 downloading$/);
    assert.match(lines[2]!, /measured by this command/);
    assert.match(lines[4]!, /^NODE\s+SET\s+PHASE\s+IMAGES\s+BYTES\s+ETA/);
    const narrow = frameLines(view(400), NOW, 30, 40, false, 2000);
    assert.ok(narrow.every((l) => [...l].length <= 30));
    const many: WatchView = { ...view(400), rows: Array.from({ length: 100 }, (_, i) => ({ ...view(400).rows[0]!, node: `worker-${i}` })) };
    const short = frameLines(many, NOW, 200, 20, false, 2000);
    assert.equal(short.length, 19, 'one line to spare at the bottom');
    assert.match(short.at(-1)!, /^… and \d+ more rows$/);
  });

  test('elsewhere: the set\'s line when its progress moved (not for the clock alone), and the rows that changed', () => {
    const seen = { sets: new Map<string, string>(), rows: new Map<string, string>() };
    const first = changeLines(view(400, NOW + 60_000), seen, NOW, 200, false);
    assert.equal(first.length, 2);
    assert.match(first[0]!, /^2026-12-07T12:00:00Z upgrade: 40% of 1000 B, 10 B\/s \(1 downloading\); done in about 60s/);
    assert.match(first[1]!, /^worker-1\s+upgrade\s+Progressing/);
    assert.deepEqual(changeLines(view(400, NOW + 60_000), seen, NOW + 5000, 200, false), [], 'nothing moved: nothing printed');
    const moved = changeLines(view(700, NOW + 30_000), seen, NOW + 6000, 200, false);
    assert.equal(moved.length, 2);
    assert.match(moved[0]!, /70% of 1000 B/);
    assert.ok(moved.every((l) => !l.includes('\x1b')), 'no terminal escapes in plain output');
  });
});
