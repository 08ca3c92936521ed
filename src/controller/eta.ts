// When a set will be done, from what was measured (pure): the estimates
// src/controller/progress.ts makes its ETA with, as its top comment
// describes them (the fleet's throughput, the pace of completions while
// slots bind, the first wave's time then its followers').

/** What the estimate reads of the work left (FleetWork in ./progress.ts). */
export interface WorkLeft {
  remaining: number;
  downloading: number;
  waiting: number;
  reportedRate?: number;
}

/** What the tracker measured: the fleet's growth per second and how many nodes downloaded on average meanwhile; the pace of completions. */
export interface MeasuredRate {
  rate?: number;
  meanDownloading?: number;
  /** Seconds between successive completions, over the recent ones; undefined with fewer than two. */
  nodeInterval?: number;
  /** Seconds since the last completion. */
  sinceLastDone?: number;
  /** With a first wave: the seconds firstWaveSeconds gives; undefined without a wave or when it cannot tell. */
  firstWave?: number;
}

/**
 * Seconds until the nodes still to finish are done, or undefined when it
 * cannot be told: none left (done, or only degraded nodes), or nothing to
 * go by (no growth measured yet, nothing arrived over the span, and no
 * pace of completions). `slots`: spec.rollout.maxConcurrentNodes
 * (undefined: no limit). See the top of this file.
 */
export function estimateSeconds(work: WorkLeft, measured: MeasuredRate, slots: number | undefined): number | undefined {
  const left = work.downloading + work.waiting;
  if (left === 0 || work.remaining <= 0) return undefined;
  if (slots !== undefined && left > slots && measured.nodeInterval !== undefined && measured.nodeInterval > 0) {
    // Slot-bound: the nodes left finish at the pace the slots hand them on.
    const next = Math.max(0, measured.nodeInterval - (measured.sinceLastDone ?? 0));
    return next + (left - 1) * measured.nodeInterval;
  }
  if (measured.firstWave !== undefined) return measured.firstWave;
  const rate = measured.rate ?? work.reportedRate;
  if (rate === undefined || !(rate > 0)) return undefined;
  // The measured throughput came from `made` nodes at once; the nodes that
  // can download at once from now on are the ones left, within the slots.
  const made = Math.max(1, measured.rate !== undefined ? (measured.meanDownloading ?? work.downloading) : work.downloading);
  const able = Math.min(left, slots ?? Infinity);
  return work.remaining / (rate * Math.min(1, able / made));
}

/** A node still to finish in a set with a first wave: in the wave (it fetches over the link) or following it (it pulls each image from inside once the wave holds it). */
export interface WaveNode {
  following: boolean;
  /** What it lacks, less what arrived since its report. */
  remaining: number;
  /** Bytes per second: a wave node's own rate over the link; for a follower, the highest rate the followers have reported (undefined until one has pulled). */
  rate?: number;
  /** One image's mean compressed size: what a follower still lacks when the wave is done. */
  imageBytes: number;
}

/**
 * Seconds until a set with a first wave is done, or undefined when it
 * cannot be told this way (a wave node has no rate yet; or the wave is
 * done and no follower's rate is known). The wave ends when its slowest
 * node has fetched what it lacks at its own rate over the link. A
 * follower ends no sooner than it pulls all it lacks at its rate from
 * inside, and no sooner than the wave's end plus its last image (the
 * fan-out goes image by image, so at the wave's end it lacks about the
 * image the wave fetched last). Until some node has pulled behind the
 * wave, no follower's rate is known: the estimate is the wave's time
 * alone, the earliest the set can be done.
 */
export function firstWaveSeconds(nodes: readonly WaveNode[]): number | undefined {
  let wave = 0;
  for (const n of nodes) {
    if (n.following || n.remaining <= 0) continue;
    if (n.rate === undefined || !(n.rate > 0)) return undefined;
    wave = Math.max(wave, n.remaining / n.rate);
  }
  const waveLeft = nodes.some((n) => !n.following && n.remaining > 0);
  let end = wave;
  for (const n of nodes) {
    if (!n.following || n.remaining <= 0) continue;
    if (n.rate === undefined || !(n.rate > 0)) {
      if (waveLeft) continue;
      return undefined;
    }
    end = Math.max(end, n.remaining / n.rate, waveLeft ? wave + Math.min(n.remaining, n.imageBytes) / n.rate : 0);
  }
  return end;
}

/** firstWaveSeconds gives the wave's time alone (the earliest the set can be done): the wave is not done and a follower that lacks bytes has no rate yet. */
export function firstWaveIsLowerBound(nodes: readonly WaveNode[]): boolean {
  const waveLeft = nodes.some((n) => !n.following && n.remaining > 0);
  return waveLeft && nodes.some((n) => n.following && n.remaining > 0 && !(n.rate !== undefined && n.rate > 0));
}

/** A node downloading a slot-bound set through a mirror: what it lacks (less what arrived since its report), and how fast it pulls. */
export interface MirroredNode {
  remaining: number;
  rate?: number;
}

/**
 * Seconds until a slot-bound set whose nodes pull through a mirror (a
 * cache their runtimes go to before the registry) is done, before the
 * pace of completions is known; undefined when a node downloading reports
 * no rate. The nodes downloading now end when the slowest has pulled what
 * it lacks at its rate. The nodes waiting for a slot pull from the cache
 * those left warm: each its whole download (`total`, their mean) at
 * `afterRate`, `slots` at a time. `afterRate`: how fast a node pulls from
 * the warm cache, known once a node has pulled after the first completion;
 * until then the waiting nodes are not counted and the result is a lower
 * bound (`lowerBound`): the earliest the set can be done.
 */
export function mirroredSeconds(downloading: readonly MirroredNode[], waiting: number, total: number, afterRate: number | undefined, slots: number): { seconds: number; lowerBound: boolean } | undefined {
  let now = 0;
  for (const n of downloading) {
    if (n.remaining <= 0) continue;
    if (n.rate === undefined || !(n.rate > 0)) return undefined;
    now = Math.max(now, n.remaining / n.rate);
  }
  if (waiting <= 0) return { seconds: now, lowerBound: false };
  if (afterRate === undefined || !(afterRate > 0)) return { seconds: now, lowerBound: true };
  return { seconds: now + Math.ceil(waiting / Math.max(1, slots)) * (total / afterRate), lowerBound: false };
}

/** The pace of completions (ms, oldest first): the mean time between the last max(2, slots) of them, and the time since the last. */
export function pace(completions: readonly number[], at: number, slots: number | undefined): Pick<MeasuredRate, 'nodeInterval' | 'sinceLastDone'> {
  const c = completions;
  if (c.length < 2) return {};
  const k = Math.min(c.length - 1, Math.max(2, slots ?? 2));
  return { nodeInterval: (c.at(-1)! - c.at(-1 - k)!) / k / 1000, sinceLastDone: (at - c.at(-1)!) / 1000 };
}
