// Pull admission: which of the pulls due now may start. Three checks, in
// this order, each with its own owner:
// - the disk watermark (./disk.ts): above it, no download starts (NoSpace);
// - the first wave and rollout slots (src/rollout/ via ./rollout-hook.ts):
//   an image of a set with spec.rollout.firstWave waits until a first-wave
//   node holds it; a set with spec.rollout.maxConcurrentNodes downloads only
//   while the node holds one of its slots; asked before the size estimate,
//   so only nodes about to download a set ask the registry about its images;
// - the size estimate (./estimate.ts): the images about to be downloaded,
//   from the registries' manifests, must fit below the watermark, or
//   nothing of the batch starts.
// A name-only pull downloads nothing: it never waits for a slot or space.
//
// The estimate is started as soon as the runtime has said what it holds,
// for the images of sets no rollout slot limits, so it runs while the pins
// are written and confirmed rather than after.
//
// The sizes it reads are kept (imageSizes, ./known-sizes.ts) for the sets'
// bytes on the node, and each request also asks, once, for the other
// images of the sets it sizes: their totals need every image.
import type { Logger } from 'pino';
import { RuntimeError } from '../cri/runtime.ts';
import type { FirstWave, SetWave } from '../rollout/first-wave.ts';
import type { RolloutGate, SlotWait } from '../rollout/gate.ts';
import { checkpoint } from '../util/cancel.ts';
import type { ProblemLog } from '../util/problem-log.ts';
import type { DiskCheck, ImageFsSpace } from './disk.ts';
import { estimateBatch, noSpaceMessage, roomBelowWatermark, type ImageSizes, type SetEstimate, type SizeEstimator } from './estimate.ts';
import { KnownSizes, setsReferences } from './known-sizes.ts';
import type { Plan, WantedImage } from './plan.ts';
import type { ImagePuller } from './puller.ts';
import { admitDownloads, rolloutLimits } from './rollout-hook.ts';
import type { RuntimeSnapshot } from './runtime-state.ts';

export interface PullAdmissionOptions {
  logger: Logger;
  puller: ImagePuller;
  diskCheck?: DiskCheck | null;
  sizeEstimator?: SizeEstimator | null;
  /** Estimated disk = compressed download x this (default 2). */
  diskEstimateFactor?: number;
  rolloutGate?: RolloutGate | null;
  /** The first wave of sets with spec.rollout.firstWave (src/rollout/first-wave.ts); absent without an API. */
  firstWave?: FirstWave | null;
}

export interface Admitted {
  /** What to pass to the puller now. */
  pulling: WantedImage[];
  waits?: ReadonlyMap<string, SlotWait>;
  unenforced?: ReadonlyMap<string, string>;
  waves?: ReadonlyMap<string, SetWave>;
  /** Whether a pull of `pulling` may still start (false once the rollout slot that let it through was lost). */
  mayStart?: (w: WantedImage) => boolean;
  /** The pulls fetched for a first wave, by key: the set whose images go one at a time (./rollout-hook.ts). */
  oneAtATime?: ReadonlyMap<string, string>;
}

export class PullAdmission {
  private readonly o: PullAdmissionOptions;
  private readonly log: Logger;
  /** Per set key: the estimated disk of its images still to download, kept until they are all present. */
  readonly estimates = new Map<string, SetEstimate>();
  /** The blobs of the wanted images as the registries sized them: what each set's bytes are counted from. */
  readonly imageSizes = new KnownSizes();
  private early: Promise<string | null> | undefined;
  /** The room below the watermark, measured at the start of this reconcile when something may be downloaded. */
  private measuring: Promise<ImageFsSpace | null> | undefined;
  /** The digests the runtime held at the last reconcile. */
  private lastHeld: ReadonlySet<string> = new Set();
  private prefetched: Promise<Map<string, ImageSizes>> | undefined;

  constructor(o: PullAdmissionOptions) {
    this.o = o;
    this.log = o.logger;
  }

  /**
   * Right after the plan: when it wants an image the last reconcile did not
   * see present, the disk check starts now; and once the runtime has said
   * what it lacks, the sizes of what it lacks are asked for, for the sets
   * no rollout slot limits.
   */
  prepare(plan: Plan, knownPresent: ReadonlySet<string>, runtime: Promise<RuntimeSnapshot>, signal: AbortSignal): void {
    this.early = this.prefetched = this.measuring = undefined;
    if (!plan.wanted.some((w) => !knownPresent.has(w.key))) return;
    this.early = this.o.diskCheck?.problem();
    this.early?.catch(() => {});
    const estimator = this.o.sizeEstimator;
    if (!estimator || !this.watermarkApplies()) return;
    this.measuring = this.o.diskCheck?.space();
    this.measuring?.catch(() => {});
    this.prefetched = runtime.then((r) => {
      if (r.error) return new Map<string, ImageSizes>();
      const held = r.heldDigests();
      const refs = toEstimate(plan, (w) => !!r.found(w) || held.has(w.reference.digest));
      const also = this.imageSizes.toAsk(setsReferences(plan, plan.wanted.filter((w) => refs.includes(w.reference.reference))));
      const all = [...new Set([...refs, ...also])];
      return all.length > 0 ? estimator.sizes(all, signal) : new Map<string, ImageSizes>();
    });
    this.prefetched.then((m) => this.imageSizes.note(m)).catch(() => {});
  }

  /**
   * The sets just changed and their reconcile waits out the settle time
   * (DEBOUNCE_MS): the disk check and the sizes of what they may download
   * (not known present at the last reconcile) are asked for now, so that
   * reconcile finds them answered or in flight (the estimator joins a
   * request already made) instead of waiting for them before its pulls.
   */
  lookahead(plan: Plan, knownPresent: ReadonlySet<string>): void {
    if (!plan.wanted.some((w) => !knownPresent.has(w.key))) return;
    this.o.diskCheck?.problem().catch(() => {});
    const estimator = this.o.sizeEstimator;
    if (!estimator || !this.watermarkApplies()) return;
    const refs = toEstimate(plan, (w) => knownPresent.has(w.key) || this.lastHeld.has(w.reference.digest));
    if (refs.length > 0) estimator.sizes(refs).catch(() => {});
  }

  private watermarkApplies(): boolean {
    const wm = this.o.diskCheck?.highWatermarkPercent ?? 0;
    return wm > 0 && wm < 100;
  }

  /** Admit what may start among `toPull` (downloads and name-only pulls); failures are recorded on the puller. */
  async admit(plan: Plan, toPull: readonly WantedImage[], isName: (w: WantedImage) => boolean, runtime: RuntimeSnapshot, problems: ProblemLog, signal: AbortSignal): Promise<Admitted> {
    const { puller, rolloutGate, firstWave, diskCheck } = this.o;
    const dueDownloads = toPull.filter((w) => puller.isDue(w.key) && !isName(w));
    let diskProblem = dueDownloads.length > 0 ? await (this.early ?? diskCheck?.problem()) : null;
    if (diskProblem) {
      this.log.warn({ missing: dueDownloads.length, err: diskProblem }, 'image filesystem above its high watermark; not pulling');
      for (const w of dueDownloads) puller.fail(w.key, new RuntimeError('NoSpace', diskProblem));
    }
    const admitted = await admitDownloads({ gate: rolloutGate, firstWave }, plan, diskProblem ? toPull.filter(isName) : [...toPull], (w) => puller.isDue(w.key) && !isName(w));
    const mayPull = new Set(admitted.pulls);
    const dueNow = dueDownloads.filter((w) => mayPull.has(w));
    if (!diskProblem && dueNow.length > 0 && this.o.sizeEstimator) {
      diskProblem = await this.estimateFits(dueNow, runtime, problems, signal, this.imageSizes.toAsk(setsReferences(plan, dueNow)));
      if (diskProblem) {
        this.log.warn({ missing: dueNow.length, err: diskProblem }, 'the images to pull would not fit below the high watermark; not pulling this batch');
        for (const w of dueNow) puller.fail(w.key, new RuntimeError('NoSpace', diskProblem));
        await rolloutGate?.releaseAll('no room below the watermark');
      }
    }
    return { pulling: diskProblem ? admitted.pulls.filter(isName) : admitted.pulls, waits: admitted.waits, unenforced: admitted.unenforced, waves: admitted.waves, ...(admitted.mayStart ? { mayStart: admitted.mayStart } : {}), ...(admitted.oneAtATime ? { oneAtATime: admitted.oneAtATime } : {}) };
  }

  /**
   * At the end of a reconcile: an estimate is shown while its set still has
   * images to download; what the runtime held is kept for the next look ahead.
   */
  forgetDone(plan: Plan, runtime: RuntimeSnapshot): void {
    this.imageSizes.retain(new Set(plan.wanted.map((w) => w.reference.reference)));
    if (runtime.error) return;
    this.lastHeld = runtime.heldDigests();
    const pending = new Set(plan.wanted.filter((w) => !runtime.found(w)).flatMap((w) => w.sets));
    for (const k of [...this.estimates.keys()]) if (!pending.has(k)) this.estimates.delete(k);
  }

  /** Sizes of `refs`: those asked for early, and the rest now; kept in imageSizes. */
  private async sizes(refs: readonly string[], signal: AbortSignal): Promise<Map<string, ImageSizes>> {
    const early = (await this.prefetched?.catch(() => undefined)) ?? new Map<string, ImageSizes>();
    const rest = refs.filter((r) => !early.has(r));
    const late = rest.length > 0 ? await this.o.sizeEstimator!.sizes(rest, signal) : new Map<string, ImageSizes>();
    const out = new Map(refs.map((r) => [r, early.get(r) ?? late.get(r)!]));
    this.imageSizes.note(out);
    return out;
  }

  /**
   * Whether the images about to be downloaded fit below the watermark,
   * estimated from the registries; null when they do or when it cannot be
   * told (sizes unknown, filesystem not measurable), else why not. Name-only
   * pulls are not in `due`: they download nothing. `also`: references sized
   * in the same request for the sets' totals, not estimated.
   */
  private async estimateFits(due: readonly WantedImage[], runtime: RuntimeSnapshot, problems: ProblemLog, signal: AbortSignal, also: readonly string[]): Promise<string | null> {
    const held = runtime.heldDigests();
    const download = due.filter((w) => !held.has(w.reference.digest));
    if (download.length === 0) return null;
    const refs = [...new Set(download.map((w) => w.reference.reference))];
    const check = this.watermarkApplies() ? this.o.diskCheck : null;
    // The room below the watermark: measured when this reconcile started (while the sizes were asked for), or now.
    const measuring = check ? (this.measuring ?? check.space()) : undefined;
    measuring?.catch(() => {});
    const sizes = await this.sizes([...new Set([...refs, ...also])], signal);
    checkpoint(signal);
    const factor = this.o.diskEstimateFactor ?? 2;
    const batch = estimateBatch(download.map((w) => ({ reference: w.reference.reference, sets: w.sets })), sizes, factor);
    const unknownBySet = new Map<string, string>();
    for (const u of batch.unknown) for (const w of download) if (w.reference.reference === u.reference) for (const k of w.sets) if (!unknownBySet.has(k)) unknownBySet.set(k, u.why);
    for (const k of new Set(download.flatMap((w) => w.sets))) {
      const bytes = batch.perSet.get(k);
      const unknown = unknownBySet.get(k);
      this.estimates.set(k, { ...(bytes !== undefined ? { bytes } : {}), ...(unknown ? { unknown } : {}) });
    }
    if (batch.unknown.length > 0) {
      problems.warn({ unknown: batch.unknown.length, of: refs.length, first: batch.unknown[0]!.why }, 'size of images to pull unknown; pulling with the watermark check alone');
    }
    if (!check || !measuring) return null;
    const wm = check.highWatermarkPercent;
    const space = await measuring;
    if (!space) return null;
    const room = roomBelowWatermark(space.size, space.used, wm);
    this.log.info({ neededBytes: batch.neededBytes, roomBytes: room, images: download.length, unknown: batch.unknown.length, mountpoint: space.mountpoint }, 'disk estimate for the images to pull');
    // With some sizes unknown the estimate is a lower bound: if even that does not fit, nothing will.
    if (batch.neededBytes <= room) return null;
    return noSpaceMessage(batch.neededBytes, room, wm, space.mountpoint, download.length - batch.unknown.length, batch.unknown.length);
  }
}

/**
 * The references whose sizes an estimate needs: images of sets no rollout
 * slot limits (only a node about to download such a set asks about it),
 * not under a runtime handler (asked for one by one later, the estimate
 * takes them then), and not `present`.
 */
function toEstimate(plan: Plan, present: (w: WantedImage) => boolean): string[] {
  const limited = rolloutLimits(plan.sets);
  const refs = new Set<string>();
  for (const w of plan.wanted) {
    if (w.runtimeHandler || w.sets.some((k) => limited.has(k)) || present(w)) continue;
    refs.add(w.reference.reference);
  }
  return [...refs];
}
