// `node bench/eta-replay.ts`: a replay of the runs bench/fleet.ts recorded
// in bench/fleet.json, through the controller's estimate as it is in this
// tree (src/controller/progress.ts): what ETA it would have given at
// half-way in each recorded rollout, against when the rollout really
// ended. Nothing is run: no node, no agent, no controller, so an estimator
// can be tried on every recorded run in seconds. The benchmark itself
// (`npm run bench:fleet`) is what measures the controller; this only
// replays what was recorded.
//
// What is fed to the estimate, per recorded row:
// - rows recorded with each node's report of the set (`reports`: every
//   change, read every 100 ms): those reports as they were, at the times
//   they were read; the tracker observes the fleet at each change, as the
//   controller rolls a set up on each change of a Node;
// - older rows (no `reports`): reports rebuilt from what was recorded. A
//   node waits until its agent logged its first `pulling image`,
//   downloads until it was Ready, and is Ready from then. The fleet's
//   present bytes are those the controller summed at that moment (the
//   recorded status.progress), shared among the downloading nodes by how
//   far each was through its images (its images pulled, and the share of
//   time of those it was pulling). So the lag of the nodes' reports is
//   kept as a whole, not per node.
// Reports recorded before the agents reported `pullRate` and `mirrored`
// get them rebuilt: the pull rate from the agents' pull logs (`pulls`, see
// withPullRates), `mirrored` from the row's plan (every row but no-cache
// pulls through the cache, as its hosts.toml says). Rows rebuilt from
// timelines get neither, so the first-wave and one-slot estimates that
// use them are judged on rows recorded with reports only.
// Half-way as bench:fleet takes it: the first observation with half the
// set present across the fleet, and half the fleet's time. The error is
// (said - took) / took; "≥" marks an ETA the estimate said was a lower
// bound (estimatedCompletionIsLowerBound).
//
// BENCH_ETA_REPLAY_FILE (bench/fleet.json); BENCH_ETA_REPLAY_WINDOW: the
// controller's window to replay with (default: the run's --progress-window,
// 10s where the run did not record it).
import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import type { NodeProgressInput } from '../src/controller/progress.ts';
import { fleetWork, ProgressTracker } from '../src/controller/progress.ts';
import { NODE_RATE_WINDOW_MS } from '../src/api/set-bytes.ts';
import { parseDuration } from '../src/util/flags.ts';

/** One node's report of the set, as bench/fleet.ts records it (ms after the set's creation). */
export interface RecordedReport {
  atMs: number;
  node: string;
  phase: string;
  reason: string;
  desiredGeneration: number;
  currentGeneration: number;
  images: { wanted: number; present: number; pinned: number };
  bytes?: { present: number; total: number };
  rate?: number;
  pullRate?: number;
  mirrored?: boolean;
}

/** What the replay reads of a recorded row (bench/fleet.ts RowResult). */
export interface RecordedRow {
  row: string;
  label: string;
  fleetMs?: number;
  readyMs?: Record<string, number>;
  images?: { ref: string; bytes: number }[];
  pulls?: { node: string; image: string; startedMs: number; finishedMs?: number }[];
  progress?: { atMs: number; unit: string; present: number; total: number; etaMs?: number }[];
  eta?: { halfPresent?: { atMs: number; saidMs?: number; tookMs: number }; halfTime?: { atMs: number; saidMs?: number; tookMs: number } };
  reports?: RecordedReport[];
}

/** The fleet as the controller would see it at one moment: each selected node's input. */
export interface FleetObservation {
  atMs: number;
  nodes: NodeProgressInput[];
}

export interface ReplayCheck {
  atMs: number;
  /** What the estimate said was left (ms); undefined: no ETA. */
  saidMs?: number;
  /** The estimate said it was the earliest the set can be done (estimatedCompletionIsLowerBound). */
  lowerBound?: boolean;
  tookMs: number;
}

/** The error of a check in percent ((said - took) / took), or undefined without an ETA. */
export function errorPercent(c: ReplayCheck | undefined): number | undefined {
  return c?.saidMs === undefined ? undefined : ((c.saidMs - c.tookMs) / c.tookMs) * 100;
}

/** The slots a row's set had (bench/fleet.ts PLANS): one for `one-slot`, one per node for the other fleet rows, none alone. */
export function rowSlots(row: string, nodes: number): number | undefined {
  if (row === 'one-slot') return 1;
  if (row === 'solo') return undefined;
  return nodes;
}

/** Whether a row's nodes pull through the cache (bench/fleet.ts PLANS): every row but `no-cache`. */
export function rowThroughCache(row: string): boolean {
  return row !== 'no-cache';
}

/** Reports with `mirrored` as the agents say it (their hosts.toml names the cache first) where the run predates it: from the row's plan. */
export function withMirrored(reports: readonly RecordedReport[], row: string): RecordedReport[] {
  if (reports.some((r) => r.mirrored !== undefined) || !rowThroughCache(row)) return [...reports];
  return reports.map((r) => ({ ...r, mirrored: true }));
}

/** A node's input from its report, judged as the roll-up judges it (generation 1, as bench:fleet's sets are). */
function fromReport(r: RecordedReport): NodeProgressInput {
  const entry = {
    reason: r.reason,
    images: { ...r.images, failed: 0, invalid: 0 },
    ...(r.bytes ? { bytes: r.bytes } : {}),
    ...(r.rate !== undefined ? { rate: r.rate } : {}),
    ...(r.pullRate !== undefined ? { pullRate: r.pullRate } : {}),
    ...(r.mirrored !== undefined ? { mirrored: r.mirrored } : {}),
  };
  if (r.phase === 'Degraded') return { node: r.node, verdict: 'degraded', entry };
  if (r.phase === 'Ready' && r.currentGeneration >= 1) return { node: r.node, verdict: 'ready', entry };
  return { node: r.node, verdict: 'progressing', entry };
}

/** Milliseconds of [from, to] during which one of the intervals ran. */
function coveredMs(intervals: readonly [number, number][], from: number, to: number): number {
  const cut = intervals.map(([a, b]) => [Math.max(a, from), Math.min(b, to)] as const).filter(([a, b]) => b > a).sort((x, y) => x[0] - y[0]);
  let ms = 0;
  let end = from;
  for (const [a, b] of cut) {
    if (b <= end) continue;
    ms += b - Math.max(a, end);
    end = b;
  }
  return ms;
}

/**
 * Reports with the pull rate rebuilt where the run predates it (no
 * `pullRate` recorded) and its pulls were recorded (the agents' logs:
 * `pulls`, with each image's size in `images`): per node, the bytes of the
 * images it finished pulling within the agent's rate window
 * (NODE_RATE_WINDOW_MS) before the report was read, over the milliseconds
 * during which one of those pulls ran. The agent counts the same from its
 * own observations (src/api/set-bytes.ts PullTime), with the bytes still
 * arriving too; the reports' bytes cannot be used for it, as they are
 * written at the agent's pace and lag the pulls.
 */
export function withPullRates(reports: readonly RecordedReport[], row: Pick<RecordedRow, 'pulls' | 'images'>): RecordedReport[] {
  const size = new Map((row.images ?? []).map((i) => [i.ref, i.bytes]));
  const pulls = (row.pulls ?? []).filter((p) => p.finishedMs !== undefined && size.has(p.image));
  if (pulls.length === 0 || reports.some((r) => r.pullRate !== undefined)) return [...reports];
  return reports.map((r) => {
    if (!r.bytes || r.bytes.present >= r.bytes.total || r.phase === 'Ready') return r;
    const done = pulls.filter((p) => p.node === r.node && p.finishedMs! <= r.atMs && p.finishedMs! > r.atMs - NODE_RATE_WINDOW_MS);
    const ms = coveredMs(done.map((p) => [p.startedMs, p.finishedMs!]), r.atMs - NODE_RATE_WINDOW_MS, r.atMs);
    const bytes = done.reduce((a, p) => a + size.get(p.image)!, 0);
    return ms > 0 ? { ...r, pullRate: Math.round((bytes * 1000) / ms) } : r;
  });
}

/** The fleet at each change of a node's report, from recorded reports. */
export function observationsFromReports(reports: readonly RecordedReport[], nodes: readonly string[]): FleetObservation[] {
  const latest = new Map<string, NodeProgressInput>();
  const out: FleetObservation[] = [];
  const sorted = [...reports].sort((a, b) => a.atMs - b.atMs);
  for (let i = 0; i < sorted.length; i++) {
    const r = sorted[i]!;
    latest.set(r.node, fromReport(r));
    // Reports read in the same sweep are one observation.
    if (sorted[i + 1]?.atMs === r.atMs) continue;
    out.push({ atMs: r.atMs, nodes: nodes.map((n) => latest.get(n) ?? { node: n, verdict: 'progressing' }) });
  }
  return out;
}

/**
 * The fleet rebuilt for a row recorded without reports (see the top):
 * each node's state from its pulls and Ready time, the fleet's present
 * bytes from the controller's recorded sum. Observed when the controller
 * wrote a change of the set's progress and when a node became Ready, as
 * the controller rolls up on each change of a Node and not between them.
 */
export function observationsFromTimelines(row: RecordedRow): FleetObservation[] {
  const nodes = Object.keys(row.readyMs ?? {}).sort();
  const progress = (row.progress ?? []).filter((p) => p.unit === 'bytes' && p.total > 0);
  if (nodes.length === 0 || progress.length === 0 || row.fleetMs === undefined) return [];
  const perNode = progress.at(-1)!.total / nodes.length;
  const wanted = row.images?.length ?? 1;
  const slotted = rowSlots(row.row, nodes.length) !== undefined;
  const out: FleetObservation[] = [];
  const times = [...new Set([...progress.map((p) => p.atMs), ...Object.values(row.readyMs!)])].filter((t) => t >= progress[0]!.atMs).sort((a, b) => a - b);
  for (const t of times) {
    const summed = progress.filter((p) => p.atMs <= t).at(-1)?.present ?? 0;
    const ready = nodes.filter((n) => row.readyMs![n]! <= t);
    const moving = nodes.filter((n) => !ready.includes(n) && (row.pulls ?? []).some((p) => p.node === n && p.startedMs <= t));
    // How far each moving node was through its images, by time.
    const through = new Map(moving.map((n) => {
      const ps = (row.pulls ?? []).filter((p) => p.node === n);
      const done = ps.reduce((a, p) => a + (p.finishedMs === undefined ? 0 : p.finishedMs <= t ? 1 : p.startedMs <= t ? (t - p.startedMs) / (p.finishedMs - p.startedMs) : 0), 0);
      return [n, Math.min(1, done / wanted)];
    }));
    const share = [...through.values()].reduce((a, b) => a + b, 0);
    const movingBytes = Math.max(0, summed - ready.length * perNode);
    const inputs: NodeProgressInput[] = nodes.map((n) => {
      if (ready.includes(n)) return { node: n, verdict: 'ready', entry: { reason: 'AllImagesPinned', bytes: { present: perNode, total: perNode } } };
      if (!through.has(n)) return { node: n, verdict: 'progressing', entry: { reason: slotted ? 'WaitingForRolloutSlot' : 'Pulling', bytes: { present: 0, total: perNode } } };
      const present = share > 0 ? Math.min(perNode, (movingBytes * through.get(n)!) / share) : 0;
      return { node: n, verdict: 'progressing', entry: { reason: 'Pulling', bytes: { present: Math.round(present), total: perNode } } };
    });
    out.push({ atMs: t, nodes: inputs });
  }
  return out;
}

/** Feeds the observations through a fresh tracker; the ETA it gave (ms after the start) at each. */
export function replay(observations: readonly FleetObservation[], opts: { windowMs: number; slots?: number; images: number }): { atMs: number; present: number; total: number; etaMs?: number; lowerBound?: boolean }[] {
  const tracker = new ProgressTracker(opts.windowMs);
  return observations.map((o) => {
    const work = fleetWork(o.nodes, opts.images);
    const p = tracker.observe({ name: 'replay', generation: 1, ...(opts.slots !== undefined ? { slots: opts.slots } : {}) }, work, new Date(o.atMs));
    return {
      atMs: o.atMs, present: p.present, total: p.total,
      ...(p.estimatedCompletionTime ? { etaMs: Date.parse(p.estimatedCompletionTime), ...(p.estimatedCompletionIsLowerBound ? { lowerBound: true } : {}) } : {}),
    };
  });
}

/** The ETA at half present and at half the time, as bench:fleet takes them. */
export function halfWay(estimates: ReturnType<typeof replay>, fleetMs: number): { halfPresent?: ReplayCheck; halfTime?: ReplayCheck } {
  const at = (ms: number): ReplayCheck | undefined => {
    const e = estimates.filter((x) => x.atMs <= ms).at(-1);
    if (!e) return undefined;
    return { atMs: ms, tookMs: fleetMs - ms, ...(e.etaMs !== undefined ? { saidMs: e.etaMs - ms, ...(e.lowerBound ? { lowerBound: true } : {}) } : {}) };
  };
  const half = estimates.find((e) => e.total > 0 && e.present * 2 >= e.total);
  const halfPresent = half ? at(half.atMs) : undefined;
  const halfTime = at(fleetMs / 2);
  return { ...(halfPresent ? { halfPresent } : {}), ...(halfTime ? { halfTime } : {}) };
}

/** One recorded row replayed: its half-way checks, and how its observations were had. */
export function replayRow(row: RecordedRow, windowMs: number): { source: 'reports' | 'timelines'; halfPresent?: ReplayCheck; halfTime?: ReplayCheck } | undefined {
  if (row.fleetMs === undefined || !row.readyMs) return undefined;
  const nodes = Object.keys(row.readyMs).sort();
  const source = row.reports && row.reports.length > 0 ? 'reports' : 'timelines';
  const observations = source === 'reports' ? observationsFromReports(withMirrored(withPullRates(row.reports!, row), row.row), nodes) : observationsFromTimelines(row);
  if (observations.length === 0) return undefined;
  const slots = rowSlots(row.row, nodes.length);
  const estimates = replay(observations, { windowMs, images: row.images?.length ?? 1, ...(slots !== undefined ? { slots } : {}) });
  return { source, ...halfWay(estimates, row.fleetMs) };
}

const pct = (e: number | undefined, lowerBound?: boolean) => (e === undefined ? 'no ETA' : `${lowerBound ? '≥' : ''}${e >= 0 ? '+' : ''}${e.toFixed(0)}%`);

async function main(): Promise<void> {
  const file = process.env.BENCH_ETA_REPLAY_FILE ?? fileURLToPath(new URL('./fleet.json', import.meta.url));
  const doc = JSON.parse(await readFile(file, 'utf8')) as { invocations: { started: string; paces?: { progressWindow?: string }; runs: RecordedRow[][] }[] };
  const out = (l: string) => process.stdout.write(`${l}\n`);
  out(`# ETA replay of ${file}: error at half present / at half the time; recorded: what the controller of that run said; replayed: this tree's estimate`);
  // Per row: checks within 25 % at half present and at half the time, of how many.
  // A lower bound (the status says so) counts apart: it does not claim to be within 25 %.
  const within = new Map<string, { present: number; time: number; of: number; lowerBounds: number }>();
  for (const inv of doc.invocations) {
    const windowMs = parseDuration(process.env.BENCH_ETA_REPLAY_WINDOW ?? inv.paces?.progressWindow ?? '10s');
    for (const [i, run] of inv.runs.entries()) {
      for (const row of run) {
        if (!row.progress || row.progress.length === 0) continue;
        const r = replayRow(row, windowMs);
        if (!r) continue;
        const recP = row.eta?.halfPresent?.saidMs === undefined ? undefined : errorPercent(row.eta.halfPresent as ReplayCheck);
        const recT = row.eta?.halfTime?.saidMs === undefined ? undefined : errorPercent(row.eta.halfTime as ReplayCheck);
        const p = errorPercent(r.halfPresent);
        const t = errorPercent(r.halfTime);
        const w = within.get(row.row) ?? { present: 0, time: 0, of: 0, lowerBounds: 0 };
        within.set(row.row, w);
        w.of++;
        if (p !== undefined && Math.abs(p) <= 25) w.present++;
        if (t !== undefined && Math.abs(t) <= 25) w.time++;
        w.lowerBounds += (r.halfPresent?.lowerBound ? 1 : 0) + (r.halfTime?.lowerBound ? 1 : 0);
        out(`${inv.started} run ${i + 1} ${row.row.padEnd(9)} (${r.source.padEnd(9)}) fleet ${(row.fleetMs! / 1000).toFixed(1)} s: recorded ${pct(recP)} / ${pct(recT)}; replayed ${pct(p, r.halfPresent?.lowerBound)} / ${pct(t, r.halfTime?.lowerBound)}`);
      }
    }
  }
  for (const [row, w] of within) {
    const bounds = w.lowerBounds > 0 ? `; ${w.lowerBounds} of the ${w.of * 2} checks said a lower bound (≥)` : '';
    out(`${row}: within 25 % at half present in ${w.present} of ${w.of} runs, at half the time in ${w.time} of ${w.of}${bounds}`);
  }
}

if (import.meta.url === `file://${process.argv[1]}`) await main();
