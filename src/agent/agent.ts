// The agent: level-triggered, single-flight reconciles. Any change (a set,
// the node's labels, the static folder, the drop-in folder, a retry coming
// due, the periodic resync) schedules one reconcile; a reconcile running
// when the desired state changes is cancelled at its next safe point (its
// pulls that are still wanted carry on and are joined by the next one).
//
// One reconcile, as in DESIGN.md: observe, plan (pure), pin (write the
// drop-in if its content changed, then reload CRI-O), pull what is missing,
// verify, report.
import * as fs from 'node:fs';
import type { Logger } from 'pino';
import type { Labels } from '../api/selector.ts';
import type { NodeSetStatus, PinnedImageSet, SetPhase } from '../api/types.ts';
import { readNodeStatus } from '../api/node-status.ts';
import type { ImageRuntime, RuntimeImage, RuntimeInfo } from '../cri/runtime.ts';
import { renderPinFile, type PinFile } from '../crio/pinfile.ts';
import type { Reloader } from '../crio/reloader.ts';
import type { AgentMetrics } from '../metrics/agent-metrics.ts';
import type { AuthFile } from '../registry/auth.ts';
import { RuntimeError } from '../cri/runtime.ts';
import { Backoff } from './backoff.ts';
import type { DiskCheck } from './disk.ts';
import { estimateBatch, noSpaceMessage, roomBelowWatermark, type SetEstimate, type SizeEstimator } from './estimate.ts';
import type { KubeObserver } from './kube.ts';
import type { EventRecorder } from './node-sinks.ts';
import { planReconcile, type ObservedSet, type Plan, type WantedImage } from './plan.ts';
import type { ImagePuller, PullResult } from './puller.ts';
import type { RolloutGate } from '../rollout/gate.ts';
import { admitDownloads } from './rollout-hook.ts';
import { StaticSource } from './static.ts';
import { computeSetStatuses, historyFromStatus, makeNodeStatus, type SetHistory, type StatusReporter } from './status.ts';

export interface AgentOptions {
  nodeName: string;
  runtime: ImageRuntime;
  pinFile: PinFile;
  reloader: Reloader;
  puller: ImagePuller;
  reporter: StatusReporter;
  logger: Logger;
  kube?: KubeObserver | null;
  staticDir: string;
  /** --node-labels: used when the Node cannot be read. */
  flagLabels?: Labels | null;
  authFile?: AuthFile | null;
  events?: EventRecorder | null;
  metrics?: AgentMetrics | null;
  /** Pulls wait while the image filesystem is above its high watermark. */
  diskCheck?: DiskCheck | null;
  /** Sizes of images to download, so a batch that would not fit below the watermark is not started. */
  sizeEstimator?: SizeEstimator | null;
  /** Estimated disk = compressed download x this (default 2). */
  diskEstimateFactor?: number;
  /** Rollout slots: downloads of sets with spec.rollout.maxConcurrentNodes wait for one (src/rollout/gate.ts). */
  rolloutGate?: RolloutGate | null;
  resyncIntervalMs?: number;
  /** Settle time before a triggered reconcile starts, to batch bursts of events. */
  debounceMs?: number;
  now?: () => number;
}

export interface ReconcileResult {
  plan: Plan;
  sets: NodeSetStatus[];
  wrote: boolean;
  reloaded: boolean;
  pullsAttempted: number;
  runtimeReachable: boolean;
}

/** Images by each repo digest they carry, lowercased (CRI-O matches names case-insensitively). */
function indexByDigest(images: readonly RuntimeImage[]): Map<string, RuntimeImage> {
  const m = new Map<string, RuntimeImage>();
  for (const img of images) for (const d of img.repoDigests) m.set(d.toLowerCase(), img);
  return m;
}

/** While pulls run, status is recomputed this often (the reporter decides what is written, and when). */
const PROGRESS_REPORT_MS = 5_000;

/** Warnings logged once while they persist: a problem seen in the previous reconcile is not logged again. */
class ProblemLog {
  readonly seen = new Set<string>();
  private readonly log: Logger;
  private readonly before: ReadonlySet<string>;
  constructor(log: Logger, before: ReadonlySet<string>) {
    this.log = log;
    this.before = before;
  }
  warn(fields: Record<string, unknown>, msg: string): void {
    const key = `${msg}\n${JSON.stringify(fields)}`;
    this.seen.add(key);
    if (!this.before.has(key)) this.log.warn(fields, msg);
  }
}

class Cancelled extends Error {
  override name = 'Cancelled';
}

function checkpoint(signal: AbortSignal): void {
  if (signal.aborted) throw new Cancelled('superseded by a newer desired state');
}

function errMessage(e: unknown): string {
  return (e instanceof Error ? e.message : String(e)).slice(0, 1000);
}

export class Agent {
  readonly opts: AgentOptions;
  private readonly log: Logger;
  private readonly now: () => number;
  private history = new Map<string, SetHistory>();
  private readonly lastPhase = new Map<string, SetPhase>();
  private readonly staticSource: StaticSource;
  runtimeInfo: RuntimeInfo | undefined;
  lastResult: ReconcileResult | undefined;
  /** Time the loop last finished a pass (for /healthz). */
  lastLoopAt = 0;
  firstSyncDone = false;

  // Reload state. The key is what CRI-O's pin list depends on: the agent's
  // file and any drop-in sorting after it. CRI-O is reloaded whenever the
  // key differs from the one it last loaded.
  private reloadNeeded = false;
  private reloadedKey: string | undefined;
  /** The key for which a reload was forced because the runtime reported pins missing (once per key). */
  private recoveryKey: string | undefined;
  private readonly reloadBackoff = new Backoff({ baseMs: 1_000, capMs: 60_000 });
  private reloadNextAt = 0;
  private lastReloadError: string | undefined;
  private readonly reconcileBackoff = new Backoff({ baseMs: 1_000, capMs: 60_000 });
  private historySeeded = false;
  private loggedProblems = new Set<string>();
  /** Wanted images the last reconcile saw present. */
  private knownPresent = new Set<string>();
  /** Per set key: the estimated disk of its images still to download, kept until they are all present. */
  private setEstimates = new Map<string, SetEstimate>();

  // Loop state.
  private dirty = true;
  private current: AbortController | undefined;
  private wake: (() => void) | undefined;
  private stopped = false;
  private loopDone: Promise<void> | undefined;
  private timer: NodeJS.Timeout | undefined;
  private debounce: NodeJS.Timeout | undefined;
  private watchers: fs.FSWatcher[] = [];

  constructor(opts: AgentOptions) {
    this.opts = opts;
    this.log = opts.logger;
    this.now = opts.now ?? Date.now;
    this.staticSource = new StaticSource(opts.staticDir, opts.logger);
  }

  /** Ask for a reconcile. `cancel`: the desired state changed, so a running reconcile is stale. */
  trigger(reason: string, cancel = false): void {
    if (this.stopped) return;
    this.log.debug({ reason }, 'reconcile requested');
    if (cancel && this.current && !this.current.signal.aborted) {
      this.log.info({ reason }, 'desired state changed; cancelling the running reconcile at its next safe point');
      this.current.abort(new Cancelled(reason));
    }
    // Events within debounceMs of the first one are batched into one
    // reconcile; the window does not slide, so a steady stream of events
    // delays a reconcile by at most debounceMs, never starves it.
    if (this.debounce) return;
    this.debounce = setTimeout(() => {
      this.debounce = undefined;
      this.dirty = true;
      this.wake?.();
    }, this.opts.debounceMs ?? 200);
  }

  /** Labels to select sets with: the Node's, else --node-labels, else unknown (null) when an API is in use. */
  private currentLabels(): Labels | null {
    const node = this.opts.kube?.currentNode();
    if (node) return node.metadata?.labels ?? {};
    if (this.opts.flagLabels) return this.opts.flagLabels;
    return this.opts.kube ? null : {};
  }

  private seedHistory(): void {
    if (this.historySeeded) return;
    const node = this.opts.kube?.currentNode();
    if (!node && this.opts.kube) return;
    this.historySeeded = true;
    const previous = readNodeStatus(node?.metadata?.annotations).status ?? null;
    this.opts.reporter.seed(previous);
    for (const [k, v] of historyFromStatus(previous)) if (!this.history.has(k)) this.history.set(k, v);
  }

  /** One reconcile. Throws Cancelled when superseded. */
  async reconcile(signal: AbortSignal = new AbortController().signal): Promise<ReconcileResult> {
    const { runtime, pinFile, puller, metrics } = this.opts;
    const log = this.log;

    // 1. Observe. What the runtime holds is asked for at once and read after
    // pinning: the answer is not needed before then, and the pin file's
    // fsyncs and the runtime's answer then overlap.
    const runtimeView = this.observeRuntime();
    runtimeView.catch(() => {}); // read below; never an unhandled rejection if this reconcile ends early
    this.seedHistory();
    const labels = this.currentLabels();
    const kubeSets = this.opts.kube ? this.opts.kube.currentSets() : [];
    const apiSets: ObservedSet[] | null = kubeSets === null ? null : kubeSets.map((o: PinnedImageSet) => ({ source: 'api', object: o, origin: 'api' }));
    // Problems that persist are logged when they appear, not on every resync.
    const problems = new ProblemLog(log, this.loggedProblems);
    // The static source logs its files' problems itself, once per change.
    const stat = await this.staticSource.read();
    const scan = await pinFile.scan();
    for (const p of scan.problems) problems.warn({ file: p.file, err: p.error }, 'CRI-O configuration file could not be read');
    await this.opts.authFile?.refresh().catch((e) => problems.warn({ err: errMessage(e) }, 'auth file unreadable; pulling anonymously'));
    if (this.opts.authFile?.problem) problems.warn({ file: this.opts.authFile.path }, this.opts.authFile.problem);
    checkpoint(signal);

    // 2. Plan.
    const plan = planReconcile({
      labels,
      apiSets,
      staticSets: stat.sets,
      staticProblems: stat.unknown,
      currentPins: scan.ownPins,
      carriedPins: scan.before.flatMap((b) => b.pins),
    });
    if (plan.retained.length > 0) problems.warn({ retained: plan.retained.length, why: plan.retainReasons }, 'observation incomplete: keeping current pins');
    for (const s of plan.sets) {
      for (const p of s.invalidImages) problems.warn({ set: s.name, source: s.source, field: p.field, err: p.error }, 'invalid image reference: not pinned, not pulled');
      if (s.specErrors.length) problems.warn({ set: s.name, source: s.source, errs: s.specErrors }, 'invalid set: not applied');
    }
    for (const o of scan.overriding) problems.warn({ file: o.file, pinFile: pinFile.name }, 'a drop-in sorting after the pin file sets pinned_images and overrides every pin');
    this.loggedProblems = problems.seen;

    // The disk check matters only if something must be pulled: when the plan
    // wants an image the last reconcile did not see present, it runs while
    // pinning instead of after the runtime answered.
    const earlyDiskCheck = plan.wanted.some((w) => !this.knownPresent.has(w.key)) ? this.opts.diskCheck?.problem() : undefined;
    earlyDiskCheck?.catch(() => {});

    // 3. Pin: write the file if its content changed, then reload.
    const content = renderPinFile(plan.pins);
    let wrote = false;
    let writeError: string | undefined;
    if (scan.ownContent !== content) {
      try {
        await pinFile.write(content);
        wrote = true;
        this.reloadNeeded = true;
        metrics?.pinFileWrites.inc();
        log.info({ pinFile: pinFile.path, pins: plan.pins.length, created: scan.ownContent === null ? true : undefined }, 'pin file written');
        const stale = await pinFile.removeStaleOwnedFiles();
        if (stale.length) log.info({ removed: stale }, 'removed older pin files of this agent');
      } catch (e) {
        writeError = errMessage(e);
        log.error({ pinFile: pinFile.path, err: writeError }, 'pin file not written; the previous file stays in place');
      }
    }
    const pinsInFile = new Set(writeError ? scan.ownPins : plan.pins);
    const key = `${writeError ? (scan.ownContent ?? '') : content}\n${JSON.stringify(scan.overriding)}`;
    // At start, trust that CRI-O loaded what is on disk (checked below where
    // the runtime reports pins): a restart must not reload for nothing.
    if (this.reloadedKey === undefined && !wrote) this.reloadedKey = key;
    if (key !== this.reloadedKey) this.reloadNeeded = true;
    let reloaded = await this.reloadIfNeeded(key);

    // 4. What the runtime holds.
    let { images, error: runtimeError } = await runtimeView;
    const reportsPins = (this.runtimeInfo?.runtimeName ?? '').toLowerCase() === 'cri-o';
    // A runtime that reports pins answered before this reconcile's reload: ask again.
    if (reloaded && !runtimeError && reportsPins) {
      ({ images, error: runtimeError } = await this.observeRuntime());
    }
    if (runtimeError) log.warn({ err: runtimeError }, 'container runtime unreachable; pins kept, retrying');
    let byDigest = indexByDigest(images);
    const handlerImages = new Map<string, RuntimeImage | null>();
    if (!runtimeError) {
      for (const w of plan.wanted) {
        if (!w.runtimeHandler) continue;
        try {
          handlerImages.set(w.key, await runtime.imageStatus(w.reference.reference, w.runtimeHandler));
        } catch (e) {
          log.warn({ image: w.reference.reference, runtimeHandler: w.runtimeHandler, err: errMessage(e) }, 'image status failed');
        }
      }
    }
    const imageOf = (w: WantedImage): RuntimeImage | null | undefined =>
      w.runtimeHandler ? handlerImages.get(w.key) : (byDigest.get(w.reference.reference.toLowerCase()) ?? null);

    // A pin file in place that the runtime does not honour (e.g. the agent
    // stopped between writing and reloading): reload once for this content.
    if (!runtimeError && reportsPins && !this.reloadNeeded && this.recoveryKey !== key && scan.overriding.length === 0) {
      const unpinned = plan.wanted.some((w) => pinsInFile.has(w.reference.reference) && imageOf(w)?.pinned === false);
      if (unpinned) {
        this.recoveryKey = key;
        log.info('the runtime reports images of the pin file as not pinned; reloading CRI-O');
        this.reloadNeeded = true;
        reloaded = (await this.reloadIfNeeded(key)) || reloaded;
        if (reloaded) {
          images = await runtime.listImages().catch(() => images);
          byDigest = indexByDigest(images);
        }
      }
    }
    checkpoint(signal);

    // 5. Pull what is missing; cancel pulls no longer wanted.
    const cancelled = puller.retain(new Set(plan.wanted.map((w) => w.key)));
    if (cancelled.length) log.info({ cancelled: cancelled.length }, 'cancelled pulls of images no longer wanted');
    const missing = runtimeError ? [] : plan.wanted.filter((w) => !imageOf(w));
    for (const w of plan.wanted) if (imageOf(w)) puller.markPresent(w.key);
    let pullsAttempted = 0;
    const due = missing.filter((w) => puller.isDue(w.key));
    let diskProblem = due.length > 0 ? await (earlyDiskCheck ?? this.opts.diskCheck?.problem()) : null;
    if (diskProblem) {
      log.warn({ missing: missing.length, err: diskProblem }, 'image filesystem above its high watermark; not pulling');
      for (const w of due) puller.fail(w.key, new RuntimeError('NoSpace', diskProblem));
    }

    // Rollout slots: a download of a set limited by spec.rollout.maxConcurrentNodes
    // waits for the set's slot. Before the size estimate, so only nodes about to
    // download a set ask the registry about its images.
    const heldContent = new Set(images.flatMap((i) => i.repoDigests.map((d) => d.slice(d.lastIndexOf('@') + 1))));
    const admitted = await admitDownloads(this.opts.rolloutGate, plan, diskProblem ? [] : missing, (w) => puller.isDue(w.key) && !heldContent.has(w.reference.digest));
    const mayPull = new Set(admitted.pulls);
    const dueNow = due.filter((w) => mayPull.has(w));
    if (!diskProblem && dueNow.length > 0 && this.opts.sizeEstimator) {
      diskProblem = await this.estimateFits(dueNow, images, problems, signal);
      if (diskProblem) {
        log.warn({ missing: missing.length, err: diskProblem }, 'the images to pull would not fit below the high watermark; not pulling this batch');
        for (const w of dueNow) puller.fail(w.key, new RuntimeError('NoSpace', diskProblem));
        await this.opts.rolloutGate?.releaseAll('no room below the watermark');
      }
    }

    // 7. Report (also while pulls run, so a long pull shows its progress).
    const report = (): NodeSetStatus[] => {
      const { sets, history } = computeSetStatuses({
        plan,
        pinsInFile,
        present: (w) => Boolean(imageOf(w)),
        pinnedByRuntime: (w) => (reportsPins ? imageOf(w)?.pinned : undefined),
        failure: (k) => puller.failure(k),
        runtimeError,
        writeError,
        reloadError: this.reloadNeeded ? this.lastReloadError : undefined,
        overriding: scan.overriding,
        pinFile: pinFile.name,
        history: this.history,
        estimates: this.setEstimates,
        rolloutWaits: admitted.waits,
        rolloutUnenforced: admitted.unenforced,
      });
      this.history = history;
      this.opts.reporter.report(makeNodeStatus(this.opts.nodeName, pinFile.name, sets, new Date(this.now()).toISOString(), { imageFilesystemError: this.opts.diskCheck?.unmeasured }));
      this.recordEvents(sets, plan);
      this.updateMetrics(plan, sets, (w) => Boolean(imageOf(w)), runtimeError === undefined);
      return sets;
    };

    if (!diskProblem && admitted.pulls.length > 0) {
      log.info({ missing: missing.length, due: due.length, waitingForSlot: missing.length - admitted.pulls.length || undefined }, 'pulling missing images');
      const missingByKey = new Map(admitted.pulls.map((m) => [m.key, m]));
      // Until verified, a pulled image counts as present with the runtime's
      // answer to PullImage (progress reports while the others still pull).
      const landed = (r: PullResult) => {
        const w = missingByKey.get(r.key);
        if (!r.ok || !w) return;
        const img: RuntimeImage = { id: r.imageRef ?? '', repoTags: [], repoDigests: [w.reference.reference], size: 0, pinned: !reportsPins, runtimeHandler: w.runtimeHandler };
        if (w.runtimeHandler) handlerImages.set(w.key, img);
        else byDigest.set(w.reference.reference.toLowerCase(), img);
      };
      report(); // a set that starts pulling shows Progressing now
      const progress = setInterval(report, PROGRESS_REPORT_MS);
      let results: PullResult[];
      try {
        results = await puller.pull(admitted.pulls, signal, landed).catch((e) => {
          if (signal.aborted) throw new Cancelled('superseded');
          throw e;
        });
      } finally {
        clearInterval(progress);
      }
      await this.opts.rolloutGate?.releaseAll();
      pullsAttempted = results.length;
      // 6. Verify the pulled images with ImageStatus, once the pulls are done
      // (so verification never competes with them).
      await Promise.all(
        results.map(async (r) => {
          const w = missingByKey.get(r.key);
          if (!r.ok || !w) return;
          try {
            const st = await runtime.imageStatus(w.reference.reference, w.runtimeHandler);
            if (w.runtimeHandler) handlerImages.set(w.key, st);
            else if (st) byDigest.set(w.reference.reference.toLowerCase(), { ...st, repoDigests: st.repoDigests.length ? st.repoDigests : [w.reference.reference] });
            else {
              byDigest.delete(w.reference.reference.toLowerCase());
              log.warn({ image: w.reference.reference }, 'pulled, but the runtime does not report the image');
            }
          } catch (e) {
            log.warn({ image: w.reference.reference, err: errMessage(e) }, 'image status after pull failed');
          }
        }),
      );
    }

    // An estimate is shown while its set still has images to download.
    if (!runtimeError) {
      const pending = new Set(plan.wanted.filter((w) => !imageOf(w)).flatMap((w) => w.sets));
      for (const k of [...this.setEstimates.keys()]) if (!pending.has(k)) this.setEstimates.delete(k);
    }
    const sets = report();
    if (!runtimeError) this.knownPresent = new Set(plan.wanted.filter((w) => imageOf(w)).map((w) => w.key));
    if (!runtimeError) this.firstSyncDone = true;
    return { plan, sets, wrote, reloaded, pullsAttempted, runtimeReachable: runtimeError === undefined };
  }

  /**
   * Whether the images about to be downloaded fit below the watermark,
   * estimated from the registries; null when they do or when it cannot be
   * told (sizes unknown, filesystem not measurable), else why not. An image
   * whose content the runtime holds under another name is a name-only pull
   * and costs nothing.
   */
  private async estimateFits(due: readonly WantedImage[], images: readonly RuntimeImage[], problems: ProblemLog, signal: AbortSignal): Promise<string | null> {
    const held = new Set(images.flatMap((i) => i.repoDigests.map((d) => d.slice(d.lastIndexOf('@') + 1))));
    const download = due.filter((w) => !held.has(w.reference.digest));
    if (download.length === 0) return null;
    const refs = [...new Set(download.map((w) => w.reference.reference))];
    const sizes = await this.opts.sizeEstimator!.sizes(refs, signal);
    checkpoint(signal);
    const factor = this.opts.diskEstimateFactor ?? 2;
    const batch = estimateBatch(download.map((w) => ({ reference: w.reference.reference, sets: w.sets })), sizes, factor);
    const unknownBySet = new Map<string, string>();
    for (const u of batch.unknown) for (const w of download) if (w.reference.reference === u.reference) for (const k of w.sets) if (!unknownBySet.has(k)) unknownBySet.set(k, u.why);
    for (const k of new Set(download.flatMap((w) => w.sets))) {
      const bytes = batch.perSet.get(k);
      const unknown = unknownBySet.get(k);
      this.setEstimates.set(k, { ...(bytes !== undefined ? { bytes } : {}), ...(unknown ? { unknown } : {}) });
    }
    if (batch.unknown.length > 0) {
      problems.warn({ unknown: batch.unknown.length, of: refs.length, first: batch.unknown[0]!.why }, 'size of images to pull unknown; pulling with the watermark check alone');
    }
    const check = this.opts.diskCheck;
    const wm = check?.highWatermarkPercent ?? 0;
    if (!check || wm <= 0 || wm >= 100) return null;
    const space = await check.space();
    if (!space) return null;
    const room = roomBelowWatermark(space.size, space.used, wm);
    this.log.info({ neededBytes: batch.neededBytes, roomBytes: room, images: download.length, unknown: batch.unknown.length, mountpoint: space.mountpoint }, 'disk estimate for the images to pull');
    // With some sizes unknown the estimate is a lower bound: if even that does not fit, nothing will.
    if (batch.neededBytes <= room) return null;
    return noSpaceMessage(batch.neededBytes, room, wm, space.mountpoint, download.length - batch.unknown.length, batch.unknown.length);
  }

  /** Version (once) and ListImages; failures are returned, not thrown. */
  private async observeRuntime(): Promise<{ images: RuntimeImage[]; error: string | undefined }> {
    try {
      if (!this.runtimeInfo) {
        this.runtimeInfo = await this.opts.runtime.version();
        this.log.info({ runtime: this.runtimeInfo }, 'connected to the container runtime');
      }
      return { images: await this.opts.runtime.listImages(), error: undefined };
    } catch (e) {
      return { images: [], error: errMessage(e) };
    }
  }

  private async reloadIfNeeded(key: string): Promise<boolean> {
    if (!this.reloadNeeded || this.now() < this.reloadNextAt) return false;
    const { reloader, metrics } = this.opts;
    if (reloader.mode === 'none') {
      // Nothing to reload (e.g. a runtime that is not CRI-O): the file is all there is.
      this.reloadNeeded = false;
      this.reloadedKey = key;
      return false;
    }
    try {
      await reloader.reload();
      this.reloadNeeded = false;
      this.reloadedKey = key;
      this.lastReloadError = undefined;
      this.reloadBackoff.reset();
      metrics?.reloads.inc({ result: 'success' });
      this.log.info({ mode: reloader.mode }, 'CRI-O reloaded');
      return true;
    } catch (e) {
      this.lastReloadError = errMessage(e);
      const delay = this.reloadBackoff.fail();
      this.reloadNextAt = this.now() + delay;
      metrics?.reloads.inc({ result: 'failure' });
      this.log.error({ mode: reloader.mode, err: this.lastReloadError, retryInMs: delay }, 'CRI-O reload failed; the pin file stays, retrying');
      this.opts.events?.record('Warning', 'ReloadFailed', `CRI-O reload failed (retrying): ${this.lastReloadError}`);
      return false;
    }
  }

  private recordEvents(sets: NodeSetStatus[], plan: Plan): void {
    const ev = this.opts.events;
    for (const s of sets) {
      const key = `${s.source}/${s.name}`;
      const before = this.lastPhase.get(key);
      this.lastPhase.set(key, s.phase);
      if (!ev) continue;
      if (s.phase === 'Ready' && before !== 'Ready') ev.record('Normal', 'SetReady', `set ${s.name} (generation ${s.desiredGeneration}): all ${s.images.wanted} images present and pinned`, key);
      if (s.phase === 'Degraded' && s.reason === 'PinsOverridden') ev.record('Warning', 'PinsOverridden', s.message ?? s.reason, key);
      else if (s.phase === 'Degraded' && s.images.failed > 0) ev.record('Warning', 'PullFailed', `set ${s.name}: ${s.message ?? s.reason}`, key);
    }
    for (const k of [...this.lastPhase.keys()]) if (!plan.sets.some((s) => s.key === k)) this.lastPhase.delete(k);
  }

  private updateMetrics(plan: Plan, sets: NodeSetStatus[], present: (w: WantedImage) => boolean, reached: boolean): void {
    const m = this.opts.metrics;
    if (!m) return;
    for (const p of ['Ready', 'Progressing', 'Degraded'] as SetPhase[]) m.setsByPhase.set({ phase: p }, sets.filter((s) => s.phase === p).length);
    m.imagesPinned.set(plan.pins.length);
    m.imagesWanted.set(plan.wanted.length);
    m.imagesPresent.set(plan.wanted.filter(present).length);
    if (reached) m.lastSuccess.set(this.now() / 1000);
  }

  /** When the loop should run again without being triggered. */
  private nextWakeDelay(): number {
    const now = this.now();
    let at = now + (this.opts.resyncIntervalMs ?? 300_000);
    const pull = this.opts.puller.nextAttemptAt();
    if (pull !== undefined) at = Math.min(at, pull);
    const slot = this.opts.rolloutGate?.nextAttemptAt();
    if (slot !== undefined) at = Math.min(at, slot);
    if (this.reloadNeeded) at = Math.min(at, this.reloadNextAt);
    if (this.lastResult && !this.lastResult.runtimeReachable) at = Math.min(at, now + 2_000);
    return Math.max(50, at - now);
  }

  /** Start watching the folders and run reconciles until stop(). */
  start(): void {
    this.watchFolder(this.opts.staticDir, 'static folder changed', true);
    this.watchFolder(this.opts.pinFile.dir, 'drop-in folder changed', false);
    this.loopDone = this.loop();
  }

  private watchFolder(dir: string, reason: string, cancel: boolean): void {
    try {
      const w = fs.watch(dir, () => this.trigger(reason, cancel));
      w.on('error', () => w.close());
      this.watchers.push(w);
    } catch {
      // A missing folder is re-read on every resync.
    }
  }

  private async loop(): Promise<void> {
    while (!this.stopped) {
      if (!this.dirty) {
        await new Promise<void>((resolve) => {
          this.wake = resolve;
          this.timer = setTimeout(resolve, this.nextWakeDelay());
        });
        clearTimeout(this.timer);
        this.wake = undefined;
        if (this.stopped) break;
      }
      this.dirty = false;
      this.current = new AbortController();
      const started = this.now();
      try {
        const r = (this.lastResult = await this.reconcile(this.current.signal));
        this.reconcileBackoff.reset();
        const phases: Record<string, number> = {};
        for (const s of r.sets) phases[s.phase] = (phases[s.phase] ?? 0) + 1;
        this.log.info({ wrote: r.wrote, reloaded: r.reloaded, pulls: r.pullsAttempted, wanted: r.plan.wanted.length, phases, durationMs: this.now() - started }, 'reconcile finished');
        this.opts.metrics?.reconciles.inc({ result: 'success' });
      } catch (e) {
        if (e instanceof Cancelled || this.current.signal.aborted) {
          this.opts.metrics?.reconciles.inc({ result: 'cancelled' });
          // The change that cancelled it has its reconcile scheduled (after the
          // debounce, so a burst of changes costs one more reconcile, not one each).
          this.dirty = this.debounce === undefined;
        } else {
          const delay = this.reconcileBackoff.fail();
          this.opts.metrics?.reconciles.inc({ result: 'error' });
          this.log.error({ err: errMessage(e), retryInMs: delay }, 'reconcile failed; pins kept, retrying');
          await new Promise((r) => {
            this.wake = () => r(undefined);
            this.timer = setTimeout(r, delay);
          });
          this.dirty = true;
        }
      } finally {
        this.current = undefined;
        this.lastLoopAt = this.now();
      }
    }
  }

  /** Stop: cancel the running reconcile and pulls; files are consistent at every point. */
  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.debounce);
    clearTimeout(this.timer);
    for (const w of this.watchers) w.close();
    this.current?.abort(new Cancelled('shutting down'));
    this.opts.puller.abortAll();
    this.wake?.();
    await this.loopDone;
  }
}
