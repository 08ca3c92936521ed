// A set's progress across its nodes and its ETA (src/controller/progress.ts),
// on a fake clock: what is summed, how the ETA takes the waiting nodes,
// slots and waves into account, and rollouts simulated step by step whose
// ETA at half-way is checked against when they really end.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { SetImageCounts } from '../../src/api/types.ts';
import { estimateSeconds, firstWaveIsLowerBound, firstWaveSeconds, fleetWork, mirroredSeconds, pace, ProgressTracker, progressSummary, type FleetWork, type NodeProgressInput } from '../../src/controller/progress.ts';

const counts = (wanted: number, present: number): SetImageCounts => ({ wanted, present, pinned: wanted, failed: 0, invalid: 0 });
const T0 = Date.UTC(2026, 11, 7, 12, 0, 0);
const at = (s: number) => new Date(T0 + s * 1000);

describe('fleetWork: what is summed', () => {
  test('bytes as the nodes report them; a node without bytes counts as the others do, by the share of its images present', () => {
    const nodes: NodeProgressInput[] = [
      { verdict: 'ready', entry: { reason: 'AllImagesPinned', images: counts(10, 10), bytes: { present: 1000, total: 1000 } } },
      { verdict: 'progressing', entry: { reason: 'Pulling', images: counts(10, 4), bytes: { present: 400, total: 1000 }, rate: 50 } },
      // Waits for a slot: has not asked the registry for sizes.
      { verdict: 'progressing', entry: { reason: 'WaitingForRolloutSlot', images: counts(10, 0) } },
      // Has not reported on this generation.
      { verdict: 'progressing' },
      // An agent from before `bytes`.
      { verdict: 'progressing', entry: { reason: 'Pulling', images: counts(10, 5) } },
      { verdict: 'degraded', entry: { reason: 'ImageNotFound', images: counts(10, 2), bytes: { present: 200, total: 1000 } } },
      // Waits for the first wave, with the images that landed already pulled.
      { verdict: 'progressing', entry: { reason: 'WaitingForFirstWave', images: counts(10, 3) } },
    ];
    assert.deepEqual(fleetWork(nodes, 10), {
      unit: 'bytes',
      present: 1000 + 400 + 0 + 0 + 500 + 200 + 300,
      total: 7000,
      // The degraded node's 800 are not left to time: it waits on a fix.
      remaining: 600 + 1000 + 1000 + 500 + 700,
      nodes: 7,
      done: 1,
      downloading: 2,
      waiting: 3,
      degraded: 1,
      reportedRate: 50,
    });
  });

  test('images, each once per node, where no node reports bytes; a node that has reported nothing counts the set\'s images', () => {
    const w = fleetWork(
      [
        { verdict: 'ready', entry: { reason: 'AllImagesPinned', images: counts(6, 6) } },
        { verdict: 'progressing', entry: { reason: 'Pulling', images: counts(6, 2) } },
        { verdict: 'progressing' },
      ],
      6,
    );
    assert.deepEqual([w.unit, w.present, w.total, w.remaining, w.downloading, w.waiting, w.reportedRate], ['images', 8, 18, 10, 1, 1, undefined]);
  });

  test('a node with every image present but not yet pinned downloads nothing and has nothing left', () => {
    const w = fleetWork([{ verdict: 'progressing', entry: { reason: 'WaitingForPin', images: counts(3, 3), bytes: { present: 90, total: 90 } } }], 3);
    assert.deepEqual([w.present, w.total, w.remaining, w.downloading, w.waiting, w.done], [90, 90, 0, 0, 0, 0]);
  });
});

describe('estimateSeconds: the work left over the fleet\'s throughput', () => {
  const work = (over: Partial<FleetWork>): FleetWork => ({ unit: 'bytes', present: 0, total: 0, remaining: 6000, nodes: 6, done: 0, downloading: 2, waiting: 4, degraded: 0, ...over });

  test('the waiting nodes\' whole download is in the work left, at the measured throughput', () => {
    assert.equal(estimateSeconds(work({}), { rate: 100, meanDownloading: 2 }, 2), 60);
  });

  test('the last wave: fewer nodes left than downloaded at once go at their share of the throughput', () => {
    // 400/s was made by 4 nodes at once; 1 node is left with 1000.
    assert.equal(estimateSeconds(work({ remaining: 1000, downloading: 1, waiting: 0 }), { rate: 400, meanDownloading: 4 }, undefined), 10);
  });

  test('fewer slots than the nodes that made the throughput (maxConcurrentNodes lowered): each slot at its share', () => {
    assert.equal(estimateSeconds(work({}), { rate: 300, meanDownloading: 3 }, 1), 60);
  });

  test('no throughput measured yet: the rates the downloading nodes report', () => {
    assert.equal(estimateSeconds(work({ reportedRate: 200 }), {}, 2), 30);
  });

  test('slot-bound (more nodes left than slots): the nodes left finish at the pace of the recent completions, the next one that long after the last', () => {
    // 4 left, 1 slot, a node done every 10 s, the last 4 s ago: 6 + 3 x 10.
    assert.equal(estimateSeconds(work({ downloading: 1, waiting: 3 }), { rate: 1, nodeInterval: 10, sinceLastDone: 4 }, 1), 36);
    // Overdue (12 s since the last): the next one now, the others at the pace.
    assert.equal(estimateSeconds(work({ downloading: 1, waiting: 3 }), { rate: 1, nodeInterval: 10, sinceLastDone: 12 }, 1), 30);
    // As many slots as nodes left: the bytes over the throughput, not the pace.
    assert.equal(estimateSeconds(work({ downloading: 2, waiting: 0, remaining: 600 }), { rate: 100, meanDownloading: 2, nodeInterval: 10, sinceLastDone: 0 }, 2), 6);
  });

  test('the pace: the mean time between the last max(2, slots) completions; none from fewer than two', () => {
    assert.deepEqual(pace([10_000], 12_000, 1), {});
    // One slot: the last two intervals (the cold first node's 40 s is left out).
    assert.deepEqual(pace([0, 40_000, 44_000, 50_000], 53_000, 1), { nodeInterval: 5, sinceLastDone: 3 });
    // Four slots whose nodes finish in waves: the last four intervals span a wave.
    assert.deepEqual(pace([0, 0, 0, 0, 20_000, 20_000, 20_000, 20_000], 25_000, 4), { nodeInterval: 5, sinceLastDone: 5 });
  });

  test('no ETA: nothing arrived over the window, no rate at all, or no node left but degraded ones', () => {
    assert.equal(estimateSeconds(work({}), { rate: 0, meanDownloading: 2 }, 2), undefined);
    assert.equal(estimateSeconds(work({}), {}, 2), undefined);
    assert.equal(estimateSeconds(work({ remaining: 0, downloading: 0, waiting: 0, degraded: 2 }), { rate: 50 }, 2), undefined);
  });
});

describe('ProgressTracker: status.progress from successive observations', () => {
  const w = (present: number, over: Partial<FleetWork> = {}): FleetWork => ({ unit: 'bytes', present, total: 1000, remaining: 1000 - present, nodes: 1, done: 0, downloading: 1, waiting: 0, degraded: 0, ...over });

  test('the first observation has no rate and no ETA; the second gives both; the ETA is absolute, in whole seconds', () => {
    const t = new ProgressTracker(60_000);
    const first = t.observe({ name: 's', generation: 1 }, w(0), at(0));
    assert.deepEqual(first, { unit: 'bytes', present: 0, total: 1000, nodesDownloading: 1, nodesWaiting: 0, summary: '0% of 1000 B' });
    const second = t.observe({ name: 's', generation: 1 }, w(250), at(10.4));
    assert.equal(second.rate, 24);
    // 750 left at 250 / 10.4 s: 31.2 s after 10.4 s.
    assert.equal(second.estimatedCompletionTime, '2026-12-07T12:00:42Z');
    assert.equal(second.summary, '25% of 1000 B, 24 B/s');
  });

  test('the window starts over on a new generation, another object of the same name, another unit, or fewer bytes present', () => {
    const t = new ProgressTracker(60_000);
    const set = { name: 's', uid: 'u1', generation: 1 };
    t.observe(set, w(0), at(0));
    assert.ok(t.observe(set, w(100), at(10)).rate);
    assert.equal(t.observe({ ...set, generation: 2 }, w(150), at(20)).rate, undefined);
    assert.ok(t.observe({ ...set, generation: 2 }, w(200), at(30)).rate);
    assert.equal(t.observe({ ...set, generation: 2, uid: 'u2' }, w(250), at(40)).rate, undefined);
    assert.ok(t.observe({ ...set, generation: 2, uid: 'u2' }, w(300), at(50)).rate);
    assert.equal(t.observe({ ...set, generation: 2, uid: 'u2' }, w(3, { unit: 'images', total: 10 }), at(60)).rate, undefined);
    t.observe({ ...set, generation: 2, uid: 'u2' }, w(5, { unit: 'images', total: 10 }), at(70));
    assert.equal(t.observe({ ...set, generation: 2, uid: 'u2' }, w(4, { unit: 'images', total: 10 }), at(80)).rate, undefined, 'a node left');
  });

  test('stalled: nothing arrived over the window, so a rate of 0 and no ETA', () => {
    const t = new ProgressTracker(60_000);
    t.observe({ name: 's', generation: 1 }, w(100), at(0));
    t.observe({ name: 's', generation: 1 }, w(400), at(30));
    t.observe({ name: 's', generation: 1 }, w(400), at(100));
    const p = t.observe({ name: 's', generation: 1 }, w(400), at(130));
    assert.equal(p.rate, 0);
    assert.equal(p.estimatedCompletionTime, undefined);
  });

  test('all present: no rate shown and no ETA', () => {
    const t = new ProgressTracker(60_000);
    t.observe({ name: 's', generation: 1 }, w(500), at(0));
    const done = t.observe({ name: 's', generation: 1 }, w(1000, { remaining: 0, downloading: 0, done: 1 }), at(10));
    assert.equal(done.rate, undefined);
    assert.equal(done.estimatedCompletionTime, undefined);
    assert.equal(done.summary, '100% of 1000 B');
  });

  test('nothing reported yet (every node waits, no bytes): no ETA rather than a wild one, however long it lasts', () => {
    const t = new ProgressTracker(60_000);
    const waiting = (s: number) => t.observe({ name: 's', generation: 1, slots: 2 }, w(0, { downloading: 0, waiting: 6, nodes: 6, total: 6000, remaining: 6000 }), at(s));
    for (const s of [0, 5, 30, 300]) assert.equal(waiting(s).estimatedCompletionTime, undefined);
  });

  test('the time before any node downloads is not counted, and the rate leaves the slow start as the rollout goes on', () => {
    // A window of 2 minutes: the rate spans at least 1 minute (half the window).
    const t = new ProgressTracker(120_000);
    const set = { name: 's', generation: 1 };
    const obs = (s: number, present: number) => t.observe(set, w(present, { total: 100_000, remaining: 100_000 - present }), at(s));
    // 100 s waiting for a slot, then 10/s for 100 s, then 100/s.
    const waiting = (s: number) => t.observe(set, w(0, { total: 100_000, remaining: 100_000, downloading: 0, waiting: 1 }), at(s));
    waiting(0);
    assert.equal(waiting(100).estimatedCompletionTime, undefined);
    obs(100.5, 0);
    assert.equal(obs(110.5, 100).rate, 10, 'from when the node was first seen downloading');
    for (let s = 120; s <= 200; s += 10) obs(s, (s - 100) * 10);
    let p = obs(200, 1000);
    for (let s = 210; s <= 400; s += 10) p = obs(s, 1000 + (s - 200) * 100);
    // At 400 s: 300 s since the node started; the recent half (150 s, within the window) is all at 100/s.
    assert.equal(p.rate, 100);
    // 100000 - 21000 left at 100/s.
    assert.equal(Date.parse(p.estimatedCompletionTime!), T0 + (400 + 790) * 1000);
  });

  test('what a node got since it last reported counts: its rate over the time since its bytes last changed', () => {
    const t = new ProgressTracker(60_000);
    const set = { name: 's', generation: 1 };
    const node = (present: number, rate?: number): NodeProgressInput => ({ node: 'n1', verdict: 'progressing', entry: { reason: 'Pulling', bytes: { present, total: 10_000 }, ...(rate !== undefined ? { rate } : {}) } });
    const obs = (s: number, present: number, rate?: number) => t.observe(set, fleetWork([node(present, rate)], 1), at(s));
    obs(0, 0);
    obs(10, 1000, 100);
    // Observed again 10 s later (another node's change, say) with the same report: 1000 more arrived meanwhile.
    const p = obs(20, 1000, 100);
    // 100/s over 0-20 s is 50/s measured; 10000 - 1000 - 1000 left at 50/s.
    assert.equal(Date.parse(p.estimatedCompletionTime!), T0 + (20 + 160) * 1000);
  });

  test('one slot, a warm cache: once two nodes are done, the nodes left go at the pace of the recent completions, not the cold first node\'s', () => {
    const t = new ProgressTracker(60_000);
    const set = { name: 's', generation: 1, slots: 1 };
    const nodes = (states: ('waiting' | 'pulling' | 'ready')[], pulling = 0): NodeProgressInput[] =>
      states.map((st, i) => ({
        node: `n${i}`,
        verdict: st === 'ready' ? 'ready' : 'progressing',
        entry: { reason: st === 'waiting' ? 'WaitingForRolloutSlot' : st === 'ready' ? 'AllImagesPinned' : 'Pulling', bytes: { present: st === 'ready' ? 1000 : st === 'pulling' ? pulling : 0, total: 1000 } },
      }));
    const obs = (s: number, n: NodeProgressInput[]) => t.observe(set, fleetWork(n, 1), at(s));
    obs(0, nodes(['pulling', 'waiting', 'waiting', 'waiting', 'waiting', 'waiting']));
    // The first node takes 100 s through the cold cache.
    obs(50, nodes(['pulling', 'waiting', 'waiting', 'waiting', 'waiting', 'waiting'], 500));
    obs(100, nodes(['ready', 'pulling', 'waiting', 'waiting', 'waiting', 'waiting']));
    // The next ones 10 s each from the warm cache.
    obs(110, nodes(['ready', 'ready', 'pulling', 'waiting', 'waiting', 'waiting']));
    const p = obs(120, nodes(['ready', 'ready', 'ready', 'pulling', 'waiting', 'waiting']));
    // Pace: (120 - 100) / 2 = 10 s; 3 left: 10 + 2 x 10 = 30 s.
    assert.equal(Date.parse(p.estimatedCompletionTime!), T0 + 150 * 1000);
  });

  test('retain and forget keep one window per set that is still there', () => {
    const t = new ProgressTracker(60_000);
    for (const name of ['a', 'b', 'c']) t.observe({ name, generation: 1 }, w(0), at(0));
    t.retain(new Set(['a', 'c']));
    t.forget('c');
    assert.equal(t.size, 1);
  });

  test('the summary in images', () => {
    assert.equal(progressSummary({ unit: 'images', present: 15, total: 36, rate: 0.4 }), '41% of 36 images, 0.40 images/s');
    assert.equal(progressSummary({ unit: 'images', present: 0, total: 1 }), '0% of 1 image');
    assert.equal(progressSummary({ unit: 'bytes', present: 1, total: 3 * 1024 ** 3 }), '0% of 3.0 GiB');
  });
});

describe('a first wave: the wave over the link, then the followers from inside', () => {
  // 5 images of 2000 bytes; node w is the first wave, f1-f3 follow it.
  const TOTAL = 10_000;
  const node = (name: string, reason: string, present?: number, rate?: number, verdict: NodeProgressInput['verdict'] = 'progressing'): NodeProgressInput => ({
    node: name,
    verdict,
    entry: { reason, images: counts(5, Math.floor((present ?? 0) / 2000)), ...(present !== undefined ? { bytes: { present, total: TOTAL } } : {}), ...(rate !== undefined ? { rate } : {}) },
  });
  const eta = (t: ProgressTracker, s: number, nodes: NodeProgressInput[]) => {
    const p = t.observe({ name: 'fw', generation: 1, slots: 4 }, fleetWork(nodes, 5), at(s));
    return p.estimatedCompletionTime === undefined ? undefined : (Date.parse(p.estimatedCompletionTime) - T0) / 1000 - s;
  };

  test('the wave in progress and none behind it yet: the wave\'s time alone, at its node\'s rate over the link', () => {
    const t = new ProgressTracker(60_000);
    // Before the wave is chosen every node says it waits for it, with nothing pulled: w is not taken for a follower.
    eta(t, 0, ['w', 'f1', 'f2', 'f3'].map((n) => node(n, 'WaitingForFirstWave')));
    // 4000 of 10000 at 100/s: 60 s, however many nodes wait behind it (not 4 x 60 s).
    assert.equal(eta(t, 40, [node('w', 'Pulling', 4000, 100), node('f1', 'WaitingForFirstWave'), node('f2', 'WaitingForFirstWave'), node('f3', 'WaitingForFirstWave')]), 60);
    const p = t.observe({ name: 'fw', generation: 1, slots: 4 }, fleetWork([node('w', 'Pulling', 4000, 100), node('f1', 'WaitingForFirstWave', 0), node('f2', 'WaitingForFirstWave'), node('f3', 'WaitingForFirstWave')], 5), at(40));
    assert.equal(p.estimatedCompletionIsLowerBound, true, 'the followers\' time is not known: the earliest the set can be done');
  });

  test('followers at the cache\'s pace: the wave\'s end plus the last image at their rate; once the wave is done, what each lacks at the highest rate they pulled at', () => {
    const t = new ProgressTracker(60_000);
    eta(t, 0, [node('w', 'Pulling', 0, 100), node('f1', 'WaitingForFirstWave'), node('f2', 'WaitingForFirstWave'), node('f3', 'WaitingForFirstWave')]);
    // The wave holds 2 images; f1 and f2 pulled them at 1000/s, f3 has not started.
    // Wave: 6000 at 100/s = 60 s; then f3's last image (2000) at the followers' 1000/s: 62 s.
    assert.equal(eta(t, 40, [node('w', 'Pulling', 4000, 100), node('f1', 'WaitingForFirstWave', 4000, 1000), node('f2', 'WaitingForFirstWave', 4000, 1000), node('f3', 'WaitingForFirstWave')]), 62);
    // The wave done; the followers now say Pulling and stay followers. Their rates fell to 500/s while they
    // waited for the wave's images; they pull at the highest seen, 1000/s: f3 lacks 8000, 8 s (not at the wave's 100/s).
    assert.equal(eta(t, 100, [node('w', 'AllImagesPinned', TOTAL, undefined, 'ready'), node('f1', 'Pulling', 8000, 500), node('f2', 'Pulling', 8000, 500), node('f3', 'Pulling', 2000)]), 8);
  });

  test('followers that report a pull rate are counted at its mean, not at the rate over the minutes they spent waiting for the wave', () => {
    const t = new ProgressTracker(60_000);
    const following = (name: string, present: number, rate: number, pullRate: number): NodeProgressInput => ({
      node: name,
      verdict: 'progressing',
      entry: { reason: 'WaitingForFirstWave', images: counts(5, Math.floor(present / 2000)), bytes: { present, total: TOTAL }, rate, pullRate },
    });
    eta(t, 0, [node('w', 'Pulling', 0, 100), node('f1', 'WaitingForFirstWave'), node('f2', 'WaitingForFirstWave'), node('f3', 'WaitingForFirstWave')]);
    // Wave: 6000 at 100/s = 60 s; then f3's last image (2000) at the followers' mean pull rate, (1000 + 3000) / 2 = 2000/s: 61 s
    // (at their highest rate over the minutes, 400/s, it would be 65 s).
    assert.equal(eta(t, 40, [node('w', 'Pulling', 4000, 100), following('f1', 4000, 400, 1000), following('f2', 4000, 300, 3000), node('f3', 'WaitingForFirstWave')]), 61);
  });

  test('firstWaveSeconds: the slowest wave node; a follower that lacks more than the wave\'s time at its rate; no estimate without a wave rate', () => {
    const wave = (remaining: number, rate?: number) => ({ following: false, remaining, imageBytes: 100, ...(rate !== undefined ? { rate } : {}) });
    const follower = (remaining: number, rate?: number) => ({ following: true, remaining, imageBytes: 100, ...(rate !== undefined ? { rate } : {}) });
    assert.equal(firstWaveSeconds([wave(100, 10), wave(300, 10), follower(500)]), 30);
    assert.equal(firstWaveSeconds([wave(100, 10), follower(500, 10)]), 50);
    assert.equal(firstWaveSeconds([wave(100, 10), follower(150, 50)]), 12);
    assert.equal(firstWaveSeconds([wave(100), follower(150, 50)]), undefined);
    assert.equal(firstWaveSeconds([follower(150)]), undefined);
  });
});

describe('one slot through a mirror: the first copy, then the nodes after it from the warm cache', () => {
  const set = { name: 'one', generation: 1, slots: 1 };
  // 6 nodes, 1000 bytes each; `done` of them Ready, the next one pulling `pulling` bytes at `rate` (its pull rate `pullRate`).
  const nodes = (done: number, pulling: number, rate?: number, o: { mirrored?: boolean; pullRate?: number } = {}): NodeProgressInput[] =>
    Array.from({ length: 6 }, (_, i) => ({
      node: `n${i}`,
      verdict: i < done ? 'ready' : 'progressing',
      entry: {
        reason: i < done ? 'AllImagesPinned' : i === done ? 'Pulling' : 'WaitingForRolloutSlot',
        ...(i <= done ? { bytes: { present: i < done ? 1000 : pulling, total: 1000 } } : {}),
        ...(i === done && rate !== undefined ? { rate } : {}),
        ...(i === done && o.pullRate !== undefined ? { pullRate: o.pullRate } : {}),
        ...(i === done && o.mirrored !== false ? { mirrored: true } : {}),
      },
    }));

  test('while the first node fetches through the cold cache: its time alone, said to be a lower bound, not every node at its rate', () => {
    const t = new ProgressTracker(10_000);
    t.observe(set, fleetWork(nodes(0, 0, undefined), 1), new Date(T0));
    const p = t.observe(set, fleetWork(nodes(0, 500, 100), 1), new Date(T0 + 5_000));
    // 500 left at 100/s: 5 s; the five nodes after it are not counted.
    assert.equal(Date.parse(p.estimatedCompletionTime!), T0 + 10_000);
    assert.equal(p.estimatedCompletionIsLowerBound, true);
  });

  test('without a mirror the nodes after the first are counted at its pace, as an estimate', () => {
    const t = new ProgressTracker(10_000);
    t.observe(set, fleetWork(nodes(0, 0, undefined, { mirrored: false }), 1), new Date(T0));
    const p = t.observe(set, fleetWork(nodes(0, 500, 100, { mirrored: false }), 1), new Date(T0 + 5_000));
    assert.ok(Date.parse(p.estimatedCompletionTime!) > T0 + 50_000, p.estimatedCompletionTime);
    assert.equal(p.estimatedCompletionIsLowerBound, undefined);
  });

  test('once a node pulls after the first: the nodes left at its pull rate, one slot at a time', () => {
    const t = new ProgressTracker(10_000);
    t.observe(set, fleetWork(nodes(0, 500, 100), 1), new Date(T0));
    t.observe(set, fleetWork(nodes(1, 0), 1), new Date(T0 + 5_000));
    // n1 pulls from the warm cache at 1000/s (its rate over the minutes, 400/s, counts the wait for the slot).
    const p = t.observe(set, fleetWork(nodes(1, 500, 400, { pullRate: 1000 }), 1), new Date(T0 + 6_000));
    // n1: 500 at 1000/s = 0.5 s; then 4 nodes x 1000 at 1000/s: 4.5 s, whole seconds: 10.5 s after T0, 11 s rounded.
    assert.equal(Date.parse(p.estimatedCompletionTime!), T0 + 11_000);
    assert.equal(p.estimatedCompletionIsLowerBound, undefined);
  });

  test('mirroredSeconds: the slowest node downloading, then the nodes waiting at the warm rate; a lower bound without it; none without a rate', () => {
    assert.deepEqual(mirroredSeconds([{ remaining: 100, rate: 10 }, { remaining: 50, rate: 10 }], 3, 200, undefined, 2), { seconds: 10, lowerBound: true });
    assert.deepEqual(mirroredSeconds([{ remaining: 100, rate: 10 }], 3, 200, 100, 2), { seconds: 10 + 2 * 2, lowerBound: false });
    assert.deepEqual(mirroredSeconds([{ remaining: 100, rate: 10 }], 0, 200, undefined, 1), { seconds: 10, lowerBound: false });
    assert.equal(mirroredSeconds([{ remaining: 100 }], 3, 200, 100, 1), undefined);
  });

  test('firstWaveIsLowerBound: the wave not done and a follower without a rate', () => {
    const node = (following: boolean, remaining: number, rate?: number) => ({ following, remaining, imageBytes: 100, ...(rate !== undefined ? { rate } : {}) });
    assert.equal(firstWaveIsLowerBound([node(false, 100, 10), node(true, 500)]), true);
    assert.equal(firstWaveIsLowerBound([node(false, 100, 10), node(true, 500, 50)]), false);
    assert.equal(firstWaveIsLowerBound([node(false, 0, 10), node(true, 500, 50)]), false);
  });
});

describe('one slot with the hand-over: the pace of completions', () => {
  test('the slot taken within 50 ms of each completion: the nodes left go at the warm nodes\' pace, not the first node\'s', () => {
    const t = new ProgressTracker(10_000);
    const set = { name: 'one', generation: 1, slots: 1 };
    const nodes = (done: number, pulling?: number): NodeProgressInput[] =>
      Array.from({ length: 6 }, (_, i) => ({
        node: `n${i}`,
        verdict: i < done ? 'ready' : 'progressing',
        entry: { reason: i < done ? 'AllImagesPinned' : i === done ? 'Pulling' : 'WaitingForRolloutSlot', bytes: { present: i < done ? 1000 : i === done ? (pulling ?? 0) : 0, total: 1000 }, ...(i === done && pulling ? { rate: 80 } : {}) },
      }));
    const obs = (ms: number, n: NodeProgressInput[]) => t.observe(set, fleetWork(n, 1), new Date(T0 + ms));
    obs(0, nodes(0, 0));
    obs(6_000, nodes(0, 500));
    // The first node over the link: 12 s. Then each from the warm cache in 1 s, the slot handed on in 50 ms.
    obs(12_000, nodes(1));
    obs(12_050, nodes(1, 0));
    obs(13_050, nodes(2));
    obs(13_100, nodes(2, 0));
    const p = obs(14_100, nodes(3));
    // Pace (14.1 - 12.0) / 2 = 1.05 s; 3 left: 3.15 s, whole seconds: 17 s after T0.
    assert.equal(Date.parse(p.estimatedCompletionTime!), T0 + 17_000);
  });
});

// ---------------------------------------------------------------------------
// Rollouts simulated second by second: each node downloads its bytes at a
// rate while it may, and reports (bytes present, phase and reason) every
// `reportEvery` seconds; the controller observes every second what was
// reported. The ETA the tracker gives when half the bytes are present is
// compared with when the rollout really ends.

interface SimNode {
  present: number;
  /** Whether it may download now, and at what rate, given the others. */
  state: 'waiting' | 'downloading' | 'done';
}

function simulate(o: {
  nodes: number;
  bytes: number;
  slots?: number;
  /** Bytes per second each downloading node gets, given how many download and whether the first node is done (a cache then holds the first copy). */
  rate: (downloading: number, firstDone: boolean) => number;
  /** Nodes of the first wave (the others wait for them, then pull what they hold). */
  firstWave?: number;
  reportEvery: number;
  windowMs: number;
}): { etaAtHalf: number; halfAt: number; end: number } {
  const nodes: SimNode[] = Array.from({ length: o.nodes }, () => ({ present: 0, state: 'waiting' }));
  const reported = nodes.map(() => ({ present: 0, reason: 'WaitingForRolloutSlot', verdict: 'progressing' as NodeProgressInput['verdict'] }));
  const tracker = new ProgressTracker(o.windowMs);
  const slots = o.slots ?? Infinity;
  const wave = o.firstWave ?? 0;
  let halfAt: number | undefined;
  let etaAtHalf: number | undefined;
  for (let t = 0; t < 100_000; t++) {
    // Slots are taken at once by the waiting nodes (the first wave first).
    for (const n of nodes) if (n.state === 'waiting' && nodes.filter((x) => x.state === 'downloading').length < slots) n.state = 'downloading';
    const firstDone = nodes[0]!.state === 'done';
    const waveDone = nodes.slice(0, wave).every((n) => n.state === 'done');
    const downloading = nodes.filter((n) => n.state === 'downloading').length;
    for (const [i, n] of nodes.entries()) {
      if (n.state !== 'downloading') continue;
      let r = o.rate(downloading, firstDone);
      // A follower of the first wave has only what the first wave holds.
      if (wave > 0 && i >= wave) r = Math.min(r, Math.max(0, Math.min(...nodes.slice(0, wave).map((x) => x.present)) - n.present));
      n.present = Math.min(o.bytes, n.present + r);
      if (n.present >= o.bytes) n.state = 'done';
    }
    for (const [i, n] of nodes.entries()) {
      const r = reported[i]!;
      // A phase change is written at once, progress every `reportEvery` s.
      if (n.state === 'done' && r.verdict !== 'ready') Object.assign(r, { present: o.bytes, verdict: 'ready', reason: 'AllImagesPinned' });
      else if (n.state === 'downloading' && t % o.reportEvery === 0) Object.assign(r, { present: n.present, reason: wave > 0 && i >= wave && !waveDone ? 'WaitingForFirstWave' : 'Pulling' });
    }
    const work = fleetWork(
      reported.map((r) => ({ verdict: r.verdict, entry: { reason: r.reason, bytes: { present: r.present, total: o.bytes } } })),
      1,
    );
    const p = tracker.observe({ name: 'sim', generation: 1, ...(o.slots ? { slots: o.slots } : {}) }, work, at(t));
    if (halfAt === undefined && work.present * 2 >= work.total) {
      halfAt = t;
      etaAtHalf = p.estimatedCompletionTime ? (Date.parse(p.estimatedCompletionTime) - T0) / 1000 : NaN;
    }
    if (nodes.every((n) => n.state === 'done')) return { etaAtHalf: etaAtHalf!, halfAt: halfAt!, end: t };
  }
  throw new Error('the simulated rollout did not end');
}

function within(r: { etaAtHalf: number; halfAt: number; end: number }, share: number): void {
  const real = r.end - r.halfAt;
  const told = r.etaAtHalf - r.halfAt;
  assert.ok(Math.abs(told - real) <= share * real, `at half-way (${r.halfAt} s) the ETA said ${told} s more, it took ${real} s`);
}

describe('the ETA at half-way of simulated rollouts, within 25 % of the real end', () => {
  const MB = 1e6;

  test('6 nodes, 2 slots, each node on its own link: 3 waves', () => {
    within(simulate({ nodes: 6, bytes: 600 * MB, slots: 2, rate: () => 10 * MB, reportEvery: 5, windowMs: 60_000 }), 0.25);
  });

  test('6 nodes, no limit, one link shared by all: the throughput is the link\'s', () => {
    within(simulate({ nodes: 6, bytes: 100 * MB, rate: (n) => (50 * MB) / n, reportEvery: 5, windowMs: 60_000 }), 0.25);
  });

  test('6 nodes, one slot, a cache: the first node over the link, the next ones from the cache, ten times faster', () => {
    // The proportions of 15 GB over 100 Mbit/s (20 minutes) and then from a
    // cache in the cluster at 1 Gbit/s (2 minutes), with the default
    // 10-minute window and progress written every 1 to 5 minutes, scaled
    // down 80x (7.5 s; every 0.75 to 3.75 s).
    for (const reportEvery of [1, 2, 3]) within(simulate({ nodes: 6, bytes: 300 * MB, slots: 1, rate: (_n, warm) => (warm ? 50 * MB : 5 * MB), reportEvery, windowMs: 7_500 }), 0.25);
  });

  test('6 nodes, a first wave of one: the others wait for it and pull what it holds from the cache', () => {
    within(simulate({ nodes: 6, bytes: 300 * MB, rate: () => 5 * MB, firstWave: 1, reportEvery: 5, windowMs: 60_000 }), 0.25);
  });

  test('22 nodes, 4 slots: the last wave half full', () => {
    within(simulate({ nodes: 22, bytes: 200 * MB, slots: 4, rate: () => 8 * MB, reportEvery: 5, windowMs: 120_000 }), 0.25);
  });
});
