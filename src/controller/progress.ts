// A set's progress across the nodes it selects, and when it will be done:
// `status.progress` (SetProgress in src/api/types.ts).
//
// What is summed (fleetWork, pure): per selected node, the set's bytes
// present of its total as the node reports them (`bytes`: compressed
// bytes from the registries' manifests). A node that reports no bytes (it
// has not reported on this generation yet, waits for a rollout slot and
// has not asked the registry, or runs an agent from before `bytes`)
// counts as the nodes that do: their mean total, and of that the share of
// its images present. Where no node reports bytes, the unit is images:
// each image counted once per node.
//
// When it will be done (estimateSeconds, pure): the work left on the nodes
// still to finish, over the fleet's throughput. The throughput is
// measured, not summed from the nodes: the growth of the fleet's present
// bytes over the last minutes (the controller's successive observations,
// ProgressTracker), which already holds what slows a rollout: nodes waiting
// for a slot or for the first wave do not download, slots handed over late
// sit idle, a cache warmed by the first nodes serves the next ones faster.
// Nodes waiting for a slot or for the first wave are not downloading, but
// their whole download is in the work left. The rollout's slots and waves
// enter where the measured throughput would mislead: it was made by the
// nodes downloading in the window (on average D of them), and once fewer
// nodes than that are left to go (the last wave), or the set now allows
// fewer at once (maxConcurrentNodes lowered), each goes at its share
// (throughput / D), not the whole. Degraded nodes are left out of the
// estimate (they wait on a fix, not on time) but their bytes count in
// present and total, so the percentage never reads 100 while they lack
// images. Nothing here needs to know how the first wave or the slots work:
// only each node's phase and reason, which every agent reports.
//
// State (ProgressTracker): one RateWindow per set, bounded (at most 34
// observations whatever the set's age), started over when the set's
// generation or unit changes or its present bytes drop (a node left).
import { DOWNLOAD_WAIT_REASONS } from '../api/reasons.ts';
import type { NodeSetStatus, ProgressUnit, SetProgress } from '../api/types.ts';
import { formatBytes } from '../registry/size.ts';
import { RateWindow } from '../util/rate-window.ts';

/**
 * The controller's default window for a set's rate: "the last minutes".
 * Twice the longest pace at which an agent writes its progress (5 minutes,
 * src/agent/status-reporter.ts), so that every downloading node's bytes
 * move at least once inside it: over a shorter window the rate would rise
 * and fall with the nodes' writes rather than with their downloads.
 */
export const DEFAULT_PROGRESS_WINDOW_MS = 10 * 60_000;

/** Progressing reasons under which a node downloads nothing of the set (src/api/reasons.ts). */
export const WAITING_REASONS: ReadonlySet<string> = DOWNLOAD_WAIT_REASONS;

/** What the estimate reads of one selected node: the roll-up's verdict and, when the node reports on the set's current generation, its entry. */
export interface NodeProgressInput {
  verdict: 'ready' | 'progressing' | 'degraded';
  entry?: Pick<NodeSetStatus, 'reason' | 'bytes' | 'rate'> & Partial<Pick<NodeSetStatus, 'images'>>;
}

export type NodeProgressState = 'done' | 'downloading' | 'waiting' | 'degraded' | 'finishing';

export interface FleetWork {
  unit: ProgressUnit;
  present: number;
  total: number;
  /** What the nodes still to finish (downloading and waiting) have left. */
  remaining: number;
  /** Selected nodes, and of them those done (Ready at the current generation). */
  nodes: number;
  done: number;
  downloading: number;
  waiting: number;
  degraded: number;
  /** Sum of the rates the downloading nodes report (bytes only); undefined when none does. */
  reportedRate?: number;
}

/** The node's state for the estimate. */
export function nodeState(input: NodeProgressInput, present: number, total: number): NodeProgressState {
  if (input.verdict === 'ready') return 'done';
  if (input.verdict === 'degraded') return 'degraded';
  if (!input.entry || WAITING_REASONS.has(input.entry.reason)) return 'waiting';
  return present < total ? 'downloading' : 'finishing';
}

/**
 * The fleet's present and total (see the top of this file). `specImages`:
 * the set's image count, for nodes that have not reported any.
 */
export function fleetWork(nodes: readonly NodeProgressInput[], specImages: number): FleetWork {
  const reportedTotals = nodes.flatMap((n) => (n.entry?.bytes ? [n.entry.bytes.total] : []));
  const unit: ProgressUnit = reportedTotals.length > 0 ? 'bytes' : 'images';
  const meanTotal = reportedTotals.length > 0 ? Math.round(reportedTotals.reduce((a, b) => a + b, 0) / reportedTotals.length) : 0;
  const work: FleetWork = { unit, present: 0, total: 0, remaining: 0, nodes: nodes.length, done: 0, downloading: 0, waiting: 0, degraded: 0 };
  let reportedRate: number | undefined;
  for (const n of nodes) {
    const images = n.entry?.images;
    const shareOfImages = images && images.wanted > 0 ? images.present / images.wanted : 0;
    let total: number;
    let present: number;
    if (unit === 'bytes') {
      total = n.entry?.bytes?.total ?? meanTotal;
      present = n.entry?.bytes?.present ?? Math.round(total * shareOfImages);
    } else {
      total = images && images.wanted > 0 ? images.wanted : specImages;
      present = images?.present ?? 0;
    }
    if (n.verdict === 'ready') present = total;
    present = Math.min(present, total);
    const state = nodeState(n, present, total);
    work.present += present;
    work.total += total;
    if (state === 'downloading' || state === 'waiting') work.remaining += total - present;
    if (state === 'downloading') {
      work.downloading++;
      if (unit === 'bytes' && n.entry?.rate !== undefined) reportedRate = (reportedRate ?? 0) + n.entry.rate;
    } else if (state === 'waiting') work.waiting++;
    else if (state === 'degraded') work.degraded++;
    else if (state === 'done') work.done++;
  }
  if (reportedRate !== undefined) work.reportedRate = reportedRate;
  return work;
}

/** What the window measured: the fleet's growth per second and how many nodes downloaded on average meanwhile. */
export interface MeasuredRate {
  rate?: number;
  meanDownloading?: number;
}

/**
 * Seconds until the nodes still to finish are done, or undefined when it
 * cannot be told: none left (done, or only degraded nodes), or no
 * throughput to go by (no history yet, or nothing arrived over the window).
 * `slots`: spec.rollout.maxConcurrentNodes (undefined: no limit).
 */
export function estimateSeconds(work: FleetWork, measured: MeasuredRate, slots: number | undefined): number | undefined {
  const left = work.downloading + work.waiting;
  if (left === 0 || work.remaining <= 0) return undefined;
  const rate = measured.rate ?? work.reportedRate;
  if (rate === undefined || !(rate > 0)) return undefined;
  // The measured throughput came from `made` nodes at once; the nodes that
  // can download at once from now on are the ones left, within the slots.
  const made = Math.max(1, measured.rate !== undefined ? (measured.meanDownloading ?? work.downloading) : work.downloading);
  const able = Math.min(left, slots ?? Infinity);
  return work.remaining / (rate * Math.min(1, able / made));
}

/** "41% of 180.0 MiB, 5.2 MiB/s" or, in images, "41% of 36 images, 0.40 images/s". */
export function progressSummary(p: Pick<SetProgress, 'unit' | 'present' | 'total' | 'rate'>): string {
  const pct = p.total <= 0 || p.present >= p.total ? 100 : Math.floor((p.present * 100) / p.total);
  const of = p.unit === 'bytes' ? formatBytes(p.total) : `${p.total} ${p.total === 1 ? 'image' : 'images'}`;
  const rate = p.rate === undefined ? '' : p.unit === 'bytes' ? `, ${formatBytes(p.rate)}/s` : `, ${p.rate.toFixed(2)} images/s`;
  return `${pct}% of ${of}${rate}`;
}

/** metav1.Time: RFC 3339 in whole seconds. */
function wholeSeconds(ms: number): string {
  return new Date(Math.round(ms / 1000) * 1000).toISOString().replace(/\.\d+Z$/, 'Z');
}

/** The set as the tracker knows it. */
export interface TrackedSet {
  name: string;
  uid?: string;
  generation: number;
  /** spec.rollout.maxConcurrentNodes. */
  slots?: number;
}

/**
 * Each set's window of observations, and its progress from them. Bounded:
 * one RateWindow per set the controller rolls up; retain() forgets sets
 * that are gone.
 */
export class ProgressTracker {
  readonly windowMs: number;
  readonly #sets = new Map<string, { uid?: string; generation: number; unit: ProgressUnit; window: RateWindow }>();

  constructor(windowMs = DEFAULT_PROGRESS_WINDOW_MS) {
    this.windowMs = windowMs;
  }

  /** Sets tracked. */
  get size(): number {
    return this.#sets.size;
  }

  /** Records this observation of the set and returns its progress as of `now`. */
  observe(set: TrackedSet, work: FleetWork, now: Date): SetProgress {
    let t = this.#sets.get(set.name);
    if (!t || t.uid !== set.uid || t.generation !== set.generation || t.unit !== work.unit) {
      t = { uid: set.uid, generation: set.generation, unit: work.unit, window: new RateWindow(this.windowMs) };
      this.#sets.set(set.name, t);
    }
    const at = now.getTime();
    t.window.add(at, work.present, work.downloading);
    const measured: MeasuredRate = { rate: t.window.rate(), meanDownloading: t.window.meanActive() };
    const rate = measured.rate ?? work.reportedRate;
    const progress: SetProgress = {
      unit: work.unit,
      present: work.present,
      total: work.total,
      nodesDownloading: work.downloading,
      nodesWaiting: work.waiting,
      summary: '',
    };
    if (rate !== undefined && work.present < work.total) progress.rate = work.unit === 'bytes' ? Math.round(rate) : Math.round(rate * 100) / 100;
    const seconds = estimateSeconds(work, measured, set.slots);
    if (seconds !== undefined && Number.isFinite(seconds)) progress.estimatedCompletionTime = wholeSeconds(at + seconds * 1000);
    progress.summary = progressSummary(progress);
    return progress;
  }

  forget(name: string): void {
    this.#sets.delete(name);
  }

  /** Forget every set not named. */
  retain(names: ReadonlySet<string>): void {
    for (const n of [...this.#sets.keys()]) if (!names.has(n)) this.#sets.delete(n);
  }
}
