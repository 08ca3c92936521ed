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
// When it will be done (estimateSeconds, pure), from what is moving now:
// - The fleet's throughput is measured, not summed from the nodes: the
//   growth of the fleet's present bytes (the controller's successive
//   observations, ProgressTracker) over the recent half of the time since
//   a node was first seen downloading (or the bytes first grew), at least
//   half of --progress-window and within it. The time before (nodes
//   waiting for a slot, for their first attempt) is not counted, and the
//   start of the rollout, when the nodes begin one after another and
//   their first reports show little, leaves the measure as the rollout
//   goes on: at half-way it holds the second quarter and later.
// - A report is as old as its agent's pace (src/agent/status-reporter.ts),
//   so what a downloading node got since its bytes last changed (its own
//   rate over that time, at most half the window) counts as arrived.
// - While more nodes are left than the set's slots let download at once
//   (spec.rollout.maxConcurrentNodes), the rollout goes at the pace its
//   slots hand nodes on: the time between the nodes' recent completions
//   (over the last max(2, slots) of them), which holds how long a node
//   with a slot takes now (from a warm cache, faster than the first), and
//   how long a freed slot waits for the next node. The nodes left finish
//   at that pace, the next one that long after the last completion.
// - With a first wave (a node still to finish says WaitingForFirstWave
//   while another fetches, or has pulled behind the wave: a follower,
//   which it stays once its reason turns to Pulling): the wave's nodes
//   fetch over the link, the followers pull each image from inside once
//   the wave holds it (firstWaveSeconds). The wave ends when its slowest
//   node has fetched what it lacks at its rate; a follower no sooner than
//   that plus its last image, and no sooner than all it lacks, at the
//   followers' mean pull rate (else the highest rate one reported). Until
//   one has pulled behind the wave, the wave's time alone: a lower bound.
// - Slot-bound, fewer than two completions, nodes `mirrored` (a cache the
//   first nodes warm): see mirroredSeconds; a lower bound until a node has
//   pulled after the first completion. A lower bound is said so
//   (estimatedCompletionIsLowerBound).
// - Otherwise, all the nodes left can download at once: the work left
//   over the throughput. The work left counts the nodes waiting (for the
//   first wave, for their first attempt) with their whole download. Once
//   fewer nodes are left than made the throughput (on average D of them:
//   the last wave), each goes at its share (throughput / D), not the whole.
// No ETA rather than a wild one: none until bytes have grown (or a slot's
// pace is measured), and none while nothing arrives (where the slots'
// pace is measured, the nodes left go at it from now). Degraded nodes are
// left out of the estimate (they wait on a fix, not on time) but their
// bytes count in present and total, so the percentage never reads 100
// while they lack images. Nothing here needs to know how the first wave
// or the slots work: only each node's phase, reason, bytes and rate, which
// every agent reports, and when each node was first seen done.
//
// State (ProgressTracker): per set, one RateWindow (bounded: at most 34
// observations whatever the set's age), when a node first downloaded, each
// selected node as last seen (done or not, and since when its bytes are
// what they are: for what arrived since its report), and the times of the
// last completions (at most COMPLETIONS_KEPT), the followers' highest
// rate and their mean pull rate; started over when the set's
// generation or unit changes or its present bytes drop (a node left).
import { DOWNLOAD_WAIT_REASONS } from '../api/reasons.ts';
import type { NodeSetStatus, ProgressUnit, SetProgress } from '../api/types.ts';
import { formatBytes } from '../registry/size.ts';
import { RateWindow } from '../util/rate-window.ts';
import { estimateSeconds, firstWaveIsLowerBound, firstWaveSeconds, mirroredSeconds, pace, type MeasuredRate, type WaveNode } from './eta.ts';

/**
 * The controller's default window for a set's rate: "the last minutes".
 * The rate spans at least half of it: the longest pace at which an agent
 * writes its progress (5 minutes, src/agent/status-reporter.ts), so that
 * every downloading node's bytes move at least once inside it: over a
 * shorter span the rate would rise and fall with the nodes' writes rather
 * than with their downloads.
 */
export const DEFAULT_PROGRESS_WINDOW_MS = 10 * 60_000;

/** Progressing reasons under which a node downloads nothing of the set (src/api/reasons.ts). */
export const WAITING_REASONS: ReadonlySet<string> = DOWNLOAD_WAIT_REASONS;

/** What the estimate reads of one selected node: its name, the roll-up's verdict and, when the node reports on the set's current generation, its entry. */
export interface NodeProgressInput {
  /** The Node's name: how the tracker tells when each node is done. */
  node?: string;
  verdict: 'ready' | 'progressing' | 'degraded';
  entry?: Pick<NodeSetStatus, 'reason' | 'bytes' | 'rate'> & Partial<Pick<NodeSetStatus, 'images' | 'pullRate' | 'mirrored'>>;
}

export type NodeProgressState = 'done' | 'downloading' | 'waiting' | 'degraded' | 'finishing';

/** The reason under which a node pulls behind the set's first wave (src/agent/status.ts): each image once a first-wave node holds it. */
export const FOLLOWING_REASON = 'WaitingForFirstWave';

/** One node's part of the work. */
export interface NodeWork {
  state: NodeProgressState;
  present: number;
  total: number;
  rate?: number;
  /** While still to finish: the rate it reports over the seconds a pull of the set ran (how fast it pulls, its waits left out). */
  pullRate?: number;
  /** The node says it waits for the first wave (FOLLOWING_REASON): it pulls each image behind it. */
  following?: boolean;
  /** While following: the rate it reports (bytes from the in-cluster cache, not over the link). */
  followRate?: number;
  /** Its images' mean compressed size (total / images wanted), bytes only. */
  imageBytes?: number;
}

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
  /** A node still to finish says its pulls of the set go through a mirror (NodeSetStatus.mirrored). */
  mirrored?: boolean;
  /** Each named node's state, present and total, and the rate it reports while downloading; absent when no input names its node. */
  byNode?: Record<string, NodeWork>;
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
    if (n.node !== undefined) {
      const rate = state === 'downloading' && unit === 'bytes' ? n.entry?.rate : undefined;
      const pullRate = n.verdict === 'progressing' && unit === 'bytes' && n.entry?.pullRate !== undefined && n.entry.pullRate > 0 ? n.entry.pullRate : undefined;
      const following = n.verdict === 'progressing' && n.entry?.reason === FOLLOWING_REASON;
      const followRate = following && unit === 'bytes' && n.entry?.rate !== undefined && n.entry.rate > 0 ? n.entry.rate : undefined;
      const imageBytes = unit === 'bytes' && images && images.wanted > 0 ? total / images.wanted : undefined;
      (work.byNode ??= {})[n.node] = {
        state, present, total,
        ...(rate !== undefined ? { rate } : {}),
        ...(pullRate !== undefined ? { pullRate } : {}),
        ...(following ? { following } : {}),
        ...(followRate !== undefined ? { followRate } : {}),
        ...(imageBytes !== undefined ? { imageBytes } : {}),
      };
    }
    if (n.verdict === 'progressing' && n.entry?.mirrored === true) work.mirrored = true;
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

export { estimateSeconds, firstWaveIsLowerBound, firstWaveSeconds, mirroredSeconds, pace, type MeasuredRate, type WaveNode } from './eta.ts';

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

/** Completions kept per set: enough for the pace of max(2, slots) of them up to this many. */
export const COMPLETIONS_KEPT = 16;

/** The throughput is measured over this share of the time since a node first downloaded (see the top). */
export const RECENT_SHARE = 0.5;

interface SetTrack {
  uid?: string;
  generation: number;
  unit: ProgressUnit;
  window: RateWindow;
  /** When a node was first seen downloading, or the last observation before the fleet's present bytes first grew if that came first. */
  movedFrom?: number;
  /** Each node as last seen: done or not (a node seen not done, then done, is a completion), since when its present bytes are what they are, and whether it has pulled behind the first wave. */
  nodes: Map<string, { done: boolean; present: number; since: number; followed: boolean }>;
  /**
   * The highest rate a follower has reported (behind the first wave, or
   * from inside once it is done): what the followers pull at from inside.
   * Not their mean: a follower's rate is over the last minutes, so it
   * falls while it waits for the wave's next image, not while it pulls.
   */
  followRate?: number;
  /** The mean of the followers' pull rates now (the last seen while none reports one): preferred to followRate. */
  followPullRate?: number;
  /** When the nodes' completions were seen, oldest first (at most COMPLETIONS_KEPT). */
  completions: number[];
}

/**
 * Each set's window of observations, and its progress from them. Bounded:
 * one window per set the controller rolls up, and per set one entry per
 * selected node; retain() forgets sets that are gone.
 */
export class ProgressTracker {
  readonly windowMs: number;
  readonly #sets = new Map<string, SetTrack>();

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
      t = { uid: set.uid, generation: set.generation, unit: work.unit, window: new RateWindow(this.windowMs), nodes: new Map(), completions: [] };
      this.#sets.set(set.name, t);
    }
    const at = now.getTime();
    const before = t.window.last;
    if (before && work.present < before.value) {
      // A node left: what was measured no longer adds up.
      t.movedFrom = undefined;
      t.completions.length = 0;
    } else if (t.movedFrom === undefined) {
      if (work.downloading > 0) t.movedFrom = at;
      else if (work.present > (before?.value ?? 0)) t.movedFrom = before?.at ?? at;
    }
    t.window.add(at, work.present, work.downloading);
    this.#nodes(t, work, at);
    const arrivedByNode = this.#arrivedSinceReports(t, work, at);
    const arrived = [...arrivedByNode.values()].reduce((a, b) => a + b, 0);
    const measured = this.#measure(t, at, set.slots);
    const wave = work.unit === 'bytes' ? this.#waveNodes(t, work, arrivedByNode) : undefined;
    const waveSeconds = wave ? firstWaveSeconds(wave) : undefined;
    if (waveSeconds !== undefined) measured.firstWave = waveSeconds;
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
    const mirrored = this.#mirrored(t, work, arrivedByNode, measured, set.slots);
    const seconds = mirrored ? mirrored.seconds : estimateSeconds({ ...work, remaining: work.remaining - arrived }, measured, set.slots);
    if (seconds !== undefined && Number.isFinite(seconds)) {
      progress.estimatedCompletionTime = wholeSeconds(at + seconds * 1000);
      if (mirrored ? mirrored.lowerBound : wave !== undefined && seconds === waveSeconds && firstWaveIsLowerBound(wave)) progress.estimatedCompletionIsLowerBound = true;
    }
    progress.summary = progressSummary(progress);
    return progress;
  }

  /** mirroredSeconds where it applies (see the top); the warm rate: the fastest node downloading once one is done. */
  #mirrored(t: SetTrack, work: FleetWork, arrived: ReadonlyMap<string, number>, measured: MeasuredRate, slots: number | undefined): ReturnType<typeof mirroredSeconds> {
    if (!work.mirrored || work.unit !== 'bytes' || slots === undefined || measured.nodeInterval !== undefined) return undefined;
    if (work.downloading + work.waiting <= slots) return undefined;
    const downloading = Object.entries(work.byNode ?? {}).filter(([, w]) => w.state === 'downloading');
    const nodes = downloading.map(([node, w]) => ({ remaining: w.total - w.present - (arrived.get(node) ?? 0), ...(w.rate !== undefined ? { rate: w.pullRate ?? w.rate } : {}) }));
    const warm = t.completions.length > 0 ? Math.max(0, ...nodes.map((n) => n.rate ?? 0)) : 0;
    const total = work.nodes > 0 ? work.total / work.nodes : 0;
    return mirroredSeconds(nodes, work.waiting, total, warm > 0 ? warm : undefined, slots);
  }

  /** Each node as seen now: a node seen not done, then done, completed now. */
  #nodes(t: SetTrack, work: FleetWork, at: number): void {
    const waveMoving = Object.values(work.byNode ?? {}).some((w) => !w.following && (w.state === 'downloading' || w.state === 'finishing'));
    for (const [node, w] of Object.entries(work.byNode ?? {})) {
      const seen = t.nodes.get(node);
      const done = w.state === 'done';
      if (seen?.done === false && done) {
        t.completions.push(at);
        if (t.completions.length > COMPLETIONS_KEPT) t.completions.shift();
      }
      // A node that waited for the first wave while another fetched (or that
      // pulled behind it) stays a follower when its reason turns to Pulling:
      // the wave is done, the rest comes from inside. Before the wave is
      // chosen every node says it waits, the wave's own nodes too.
      const followed = (seen?.followed ?? false) || (w.following === true && (w.present > 0 || waveMoving));
      t.nodes.set(node, { done, present: w.present, since: seen && seen.present === w.present ? seen.since : at, followed });
    }
    const followers = Object.entries(work.byNode ?? {}).filter(([node, w]) => w.following === true || t.nodes.get(node)?.followed === true);
    const pullRates = followers.flatMap(([, w]) => (w.pullRate !== undefined ? [w.pullRate] : []));
    if (pullRates.length > 0) t.followPullRate = pullRates.reduce((a, b) => a + b, 0) / pullRates.length;
    const followRates = followers.flatMap(([, w]) => {
      const rate = w.followRate ?? w.rate;
      return rate !== undefined && rate > 0 ? [rate] : [];
    });
    if (followRates.length > 0) t.followRate = Math.max(t.followRate ?? 0, ...followRates);
    for (const node of t.nodes.keys()) if (!work.byNode?.[node]) t.nodes.delete(node);
  }

  /**
   * What the downloading nodes got since they last reported: each node's
   * rate over the time since its bytes last changed (at most half the
   * window: the agents' longest pace), within what it lacks. A report is
   * as old as its agent's pace, so the bytes it says lag what arrived.
   */
  #arrivedSinceReports(t: SetTrack, work: FleetWork, at: number): Map<string, number> {
    const arrived = new Map<string, number>();
    for (const [node, w] of Object.entries(work.byNode ?? {})) {
      if (w.rate === undefined || !(w.rate > 0)) continue;
      const age = Math.min(at - (t.nodes.get(node)?.since ?? at), this.windowMs / 2);
      arrived.set(node, Math.min(w.total - w.present, (w.rate * age) / 1000));
    }
    return arrived;
  }

  /**
   * The nodes still to finish, split into the first wave and its
   * followers, when the set has a first wave (some node still to finish
   * says it waits for it, or has pulled behind it); undefined otherwise.
   */
  #waveNodes(t: SetTrack, work: FleetWork, arrived: ReadonlyMap<string, number>): WaveNode[] | undefined {
    const left = Object.entries(work.byNode ?? {}).filter(([, w]) => w.state !== 'done' && w.state !== 'degraded');
    const follows = ([node, w]: [string, NodeWork]) => w.following === true || t.nodes.get(node)?.followed === true;
    if (!left.some(follows)) return undefined;
    return left.map(([node, w]) => {
      const following = follows([node, w]);
      const rate = following ? (t.followPullRate ?? t.followRate) : w.rate;
      return {
        following,
        remaining: w.total - w.present - (arrived.get(node) ?? 0),
        imageBytes: w.imageBytes ?? w.total,
        ...(rate !== undefined ? { rate } : {}),
      };
    });
  }

  #measure(t: SetTrack, at: number, slots: number | undefined): MeasuredRate {
    const measured: MeasuredRate = {};
    if (t.movedFrom !== undefined) {
      // The recent share of the time since a node first downloaded, but at least
      // half the window (the agents' longest pace, so that every
      // downloading node's bytes move inside it); the window bounds it.
      const since = Math.max(t.movedFrom, at - Math.max((at - t.movedFrom) * RECENT_SHARE, this.windowMs / 2));
      const rate = t.window.rate(since);
      if (rate !== undefined) {
        measured.rate = rate;
        const mean = t.window.meanActive(since);
        if (mean !== undefined) measured.meanDownloading = mean;
      }
    }
    return { ...measured, ...pace(t.completions, at, slots) };
  }

  forget(name: string): void {
    this.#sets.delete(name);
  }

  /** Forget every set not named. */
  retain(names: ReadonlySet<string>): void {
    for (const n of [...this.#sets.keys()]) if (!names.has(n)) this.#sets.delete(n);
  }
}
