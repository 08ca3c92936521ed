// The agent: level-triggered, single-flight reconciles. Any change (a set,
// the node's labels, the static folder, the drop-in folder, a retry coming
// due, the periodic resync) schedules one reconcile; a reconcile running
// when the desired state changes is cancelled at its next safe point (its
// pulls that are still wanted carry on and are joined by the next one).
//
// One reconcile, as in DESIGN.md: observe, plan (pure), pin (write the
// drop-in if its content changed, then reload CRI-O and confirm that CRI-O
// applied it), pull what is missing (or only its name), verify, report.
//
// Every failing step is retried at its own pace (./retry.ts: ~1 s doubling
// to ~1 min, with jitter) and logged once per change of state: reaching the
// runtime, writing the pin file, reloading CRI-O, CRI-O applying it. Between
// attempts the agent sleeps; it wakes early when what it watches says the
// cause cleared: the runtime's socket reappearing, the drop-in folder
// changing (a refused file fixed) or writable again.
import * as fs from 'node:fs';
import * as fsp from 'node:fs/promises';
import * as path from 'node:path';
import type { Logger } from 'pino';
import type { Labels } from '../api/selector.ts';
import type { NodeSetStatus, PinnedImageSet, SetPhase } from '../api/types.ts';
import { readNodeStatus } from '../api/node-status.ts';
import type { ImageRuntime, RuntimeImage, RuntimeInfo } from '../cri/runtime.ts';
import type { ConfigRejection } from '../crio/crio-config.ts';
import { effectivePins, renderPinFile, type PinFile } from '../crio/pinfile.ts';
import type { Reloader } from '../crio/reloader.ts';
import type { AgentMetrics } from '../metrics/agent-metrics.ts';
import type { AuthFile } from '../registry/auth.ts';
import { RuntimeError } from '../cri/runtime.ts';
import { Backoff, type BackoffPolicy } from '../util/backoff.ts';
import type { DiskCheck } from './disk.ts';
import { estimateBatch, noSpaceMessage, roomBelowWatermark, type SetEstimate, type SizeEstimator } from './estimate.ts';
import type { KubeObserver } from './kube.ts';
import type { EventRecorder } from './node-sinks.ts';
import { planReconcile, type ObservedSet, type Plan, type WantedImage } from './plan.ts';
import { namesProvenByPins, pinListKey, reloadProbes, tentativeProbes, TENTATIVE_WAIT_MS, type LoadedPins } from '../crio/loaded-pins.ts';
import { RuntimeView } from '../cri/view.ts';
import { PIN_WAIT_TIMEOUT_MS, waitForPins, type PinProbe } from '../pins/confirm.ts';
import type { ImagePuller, PullKind, PullResult } from './puller.ts';
import { RetryGate, STEP_RETRY } from '../util/retry.ts';
import type { RolloutGate } from '../rollout/gate.ts';
import { admitDownloads } from './rollout-hook.ts';
import { StaticSource } from './static.ts';
import { mapLimit } from '../util/limit.ts';
import { computeSetStatuses, historyFromStatus, makeNodeStatus, type PinProblem, type SetHistory, type StatusReporter } from './status.ts';

export interface AgentOptions {
  nodeName: string;
  runtime: ImageRuntime;
  /** The CRI socket's path, when it is a unix socket: its folder is watched so a restarted runtime is noticed at once. */
  criSocketPath?: string | null;
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
  /** How often, at most, the runtime is asked (one ListImages) whether pinned images are still there between reconciles. */
  presenceCheckMs?: number;
  /** Settle time before a triggered reconcile starts, to batch bursts of events. */
  debounceMs?: number;
  /** Bound of the wait for CRI-O to apply a reload (tests shorten it). */
  pinWaitTimeoutMs?: number;
  /** Pace of every failing step (default STEP_RETRY: ~1 s doubling to ~1 min). */
  retryPolicy?: BackoffPolicy;
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

/** While pulls run, status is recomputed this often (the reporter decides what is written, and when). */
const PROGRESS_REPORT_MS = 5_000;
/**
 * Between reconciles, one ListImages at least this often: RemoveImage (e.g.
 * `crictl rmi`) removes pinned images without complaint and tells nobody,
 * so a removed image is noticed within this bound and pulled again.
 */
export const PRESENCE_CHECK_MS = 30_000;
/**
 * ImageStatus calls at once when verifying pulled images. A thousand at once
 * (a large set's first reconcile) held a thousand gRPC calls and HTTP/2
 * streams at the same moment: 20 MB more peak memory to verify 1000 images
 * 0.1 s sooner (BENCHMARKS.md, footprint).
 */
const VERIFY_PARALLEL = 8;
/** While the pin file cannot be written, this often a cheap check (access + statfs) looks for the cause clearing. */
const WRITE_PROBE_MS = 2_000;
/** Free space under which the drop-in folder counts as full for that check. */
const WRITE_PROBE_MIN_FREE = 64 * 1024;

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

const lowercasedLists = new WeakMap<readonly string[], ReadonlySet<string>>();
/**
 * A pin list's patterns lowercased (CRI-O matches case-insensitively), made
 * once per list: asked for every wanted image, a scan of the list each time
 * was 1000 x 1000 comparisons for a set of 1000. Pin lists are never changed
 * once made.
 */
function lowercased(patterns: readonly string[]): ReadonlySet<string> {
  let set = lowercasedLists.get(patterns);
  if (!set) lowercasedLists.set(patterns, (set = new Set(patterns.map((p) => p.toLowerCase()))));
  return set;
}

/** A pin problem without the set-specific part. */
type ReloadFailure = Pick<PinProblem, 'reason' | 'message'>;

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
  private historySeeded = false;
  private loggedProblems = new Set<string>();

  // The runtime. A CRI-O that has not answered Version may still be in its
  // first ~50 ms, where a SIGHUP kills it (facts/crio-pinning.md): it is
  // never reloaded before answering, and after an outage or a change of its
  // socket it must answer again.
  private runtimeAnswered = false;
  private readonly runtimeGate: RetryGate;
  private noPinsLogged = false;

  // The pin file.
  private readonly writeGate: RetryGate;
  private writeProbe: NodeJS.Timeout | undefined;
  private writeProbeOk: boolean | undefined;

  // What CRI-O has loaded (./pin-sync.ts) and how reloads go.
  private loaded: LoadedPins | undefined;
  private readonly reloadGate: RetryGate;
  /** A reconcile that failed outside the steps above (a bug, an I/O error nobody expected). */
  private readonly reconcileGate: RetryGate;
  private reloadFailure: ReloadFailure | undefined;
  /** A reload is wanted but waits for its backoff. */
  private reloadWaiting = false;
  /** References known to be stored names in the runtime (lowercased). */
  private readonly knownNames = new Set<string>();
  /** Pace of reloads made because the runtime contradicted the loaded list. */
  private readonly evidenceBackoff: Backoff;
  private evidenceNextAt = 0;
  private evidenceWaiting = false;
  private lastRejectionKey = '[]';

  // Presence between reconciles.
  /** Wanted images the runtime held in place at the last reconcile: key -> reference. */
  private inPlace = new Map<string, string>();
  private lastListAt = 0;
  private lastReconcileAt = 0;
  /** Wanted images the last reconcile saw present (for the early disk check). */
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
    const gate = { now: this.now, policy: opts.retryPolicy ?? STEP_RETRY };
    this.runtimeGate = new RetryGate('reaching the container runtime', this.log, gate);
    this.writeGate = new RetryGate('writing the pin file', this.log, gate);
    this.reloadGate = new RetryGate('reloading CRI-O', this.log, gate);
    this.reconcileGate = new RetryGate('reconciling', this.log, gate);
    this.evidenceBackoff = new Backoff(gate.policy);
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

    // 3. Pin: write the file if its content changed (at the write's own pace while it fails).
    const content = renderPinFile(plan.pins);
    let wrote = false;
    let writeError: string | undefined;
    if (scan.ownContent !== content) {
      if (this.writeGate.due()) {
        try {
          await pinFile.write(content);
          wrote = true;
          this.writeGate.succeed({ pinFile: pinFile.path });
          metrics?.pinFileWrites.inc();
          log.info({ pinFile: pinFile.path, pins: plan.pins.length, created: scan.ownContent === null ? true : undefined }, 'pin file written');
          const stale = await pinFile.removeStaleOwnedFiles();
          if (stale.length) log.info({ removed: stale }, 'removed older pin files of this agent');
        } catch (e) {
          writeError = errMessage(e);
          this.writeGate.fail(writeError, { pinFile: pinFile.path, note: 'the previous file stays in place' });
          this.startWriteProbe();
        }
      } else {
        writeError = this.writeGate.error ?? 'waiting to retry';
      }
    } else if (this.writeGate.failing) {
      this.writeGate.succeed({ pinFile: pinFile.path });
    }
    if (!this.writeGate.failing) this.stopWriteProbe();
    const hasOwnFile = wrote || scan.ownContent !== null;
    const pinsInFile = new Set(wrote ? plan.pins : scan.ownPins);
    // What CRI-O loads from its folder now, and whether it would load it at all.
    const effective = effectivePins(scan, hasOwnFile ? [...pinsInFile] : null);
    const rejected = scan.rejected.filter((r) => !(wrote && r.path === pinFile.path));
    this.noteRejected(rejected);
    // At start, trust that CRI-O loaded what its files said before this
    // reconcile wrote anything (it reads them when it starts): a restart must
    // not reload for nothing. The runtime's answers check that below.
    this.loaded ??= (() => {
      const patterns = effectivePins(scan, scan.ownContent !== null ? scan.ownPins : null);
      return { patterns, key: pinListKey(patterns), state: 'assumed', reloadedAt: 0 } satisfies LoadedPins;
    })();

    // 4. What the runtime holds.
    const { images, error: runtimeError } = await runtimeView;
    let view = new RuntimeView(images);
    const reportsPins = (this.runtimeInfo?.runtimeName ?? '').toLowerCase() === 'cri-o';
    if (!runtimeError && !reportsPins && !this.noPinsLogged) {
      this.noPinsLogged = true;
      log.info({ runtime: this.runtimeInfo?.runtimeName }, 'the runtime reports no pins: images count as in place when it holds them under the set reference, and reloads are not confirmed');
    }
    const handlerImages = new Map<string, RuntimeImage | null>();
    const readHandlerImages = async () => {
      for (const w of plan.wanted) {
        if (!w.runtimeHandler) continue;
        try {
          handlerImages.set(w.key, await runtime.imageStatus(w.reference.reference, w.runtimeHandler));
        } catch (e) {
          log.warn({ image: w.reference.reference, runtimeHandler: w.runtimeHandler, err: errMessage(e) }, 'image status failed');
        }
      }
    };
    if (!runtimeError) await readHandlerImages();
    // The image the runtime shows under the set's reference (by its name or, on CRI-O, by digest within its repo).
    const found = (w: WantedImage): RuntimeImage | null | undefined =>
      w.runtimeHandler ? handlerImages.get(w.key) : (view.find(w.reference.reference) ?? null);
    // In place: held under the set's own reference. CRI-O shows repo digests
    // computed from names x digests, so there only `pinned` proves the name
    // (the reference is in its pin list whenever a set wants it); containerd
    // reports no pins, and its repo digests and tags are its stored names.
    const inPlace = (w: WantedImage): boolean => {
      const img = found(w);
      return Boolean(img) && (!reportsPins || img!.pinned);
    };

    if (!runtimeError) {
      if (reportsPins && (this.loaded.state === 'assumed' || this.loaded.state === 'confirmed')) {
        for (const n of namesProvenByPins(this.loaded.patterns, view, scan.pauseImage)) this.knownNames.add(n);
      }
      for (const n of [...this.knownNames]) if (!view.find(n)) this.knownNames.delete(n);
      this.noteRemoved(plan, found);
    }

    // 5. Bring CRI-O's loaded list to what its files say: reload, confirm.
    let reloaded = false;
    let pinProblem: PinProblem | undefined;
    if (!runtimeError) {
      const r = await this.syncPins({ effective, rejected, view, reportsPins, pauseImage: scan.pauseImage, signal });
      reloaded = r.reloaded;
      pinProblem = r.problem;
      if (r.images) {
        view = new RuntimeView(r.images);
        await readHandlerImages();
      }
    } else if (rejected.length > 0) {
      // CRI-O is unreachable and would refuse its configuration: that is likely why.
      pinProblem = { ...this.rejectionProblem(rejected), affected: () => true, affectsAll: true };
    }
    checkpoint(signal);

    // 6. What to pull: images absent (a download), and on CRI-O images
    // present under another name whose pin is loaded (a name-only pull: it
    // adds the name CRI-O matches, downloading nothing).
    const cancelled = puller.retain(new Set(plan.wanted.map((w) => w.key)));
    if (cancelled.length) log.info({ cancelled: cancelled.length }, 'cancelled pulls of images no longer wanted');
    const kinds = new Map<string, PullKind>();
    if (!runtimeError) {
      // Content the runtime holds under any name with the same digest (another
      // repository, a mirror's name) is not downloaded again: both runtimes
      // store content by digest. Such a pull only adds the name.
      const heldDigests = new Set(view.images.flatMap((i) => i.repoDigests.map((d) => d.slice(d.lastIndexOf('@') + 1))));
      for (const w of plan.wanted) {
        const img = found(w);
        if (!img) kinds.set(w.key, heldDigests.has(w.reference.digest) ? 'name' : 'download');
        else if (reportsPins && !img.pinned && pinsInFile.has(w.reference.reference) && this.pinLoaded(w.reference.reference)) kinds.set(w.key, 'name');
        // In place, or waiting for a reload only: no pull, and no pull retry pending.
        else puller.markPresent(w.key);
      }
    }
    const toPull = plan.wanted.filter((w) => kinds.has(w.key));
    const isName = (w: WantedImage) => kinds.get(w.key) === 'name';
    const due = toPull.filter((w) => puller.isDue(w.key));
    const dueDownloads = due.filter((w) => !isName(w));
    let diskProblem = dueDownloads.length > 0 ? await (earlyDiskCheck ?? this.opts.diskCheck?.problem()) : null;
    if (diskProblem) {
      log.warn({ missing: dueDownloads.length, err: diskProblem }, 'image filesystem above its high watermark; not pulling');
      for (const w of dueDownloads) puller.fail(w.key, new RuntimeError('NoSpace', diskProblem));
    }

    // Rollout slots: a download of a set limited by spec.rollout.maxConcurrentNodes
    // waits for the set's slot. Before the size estimate, so only nodes about to
    // download a set ask the registry about its images. A name-only pull
    // downloads nothing: it never waits for a slot, nor for disk space.
    const admitted = await admitDownloads(this.opts.rolloutGate, plan, diskProblem ? toPull.filter(isName) : toPull, (w) => puller.isDue(w.key) && !isName(w));
    const mayPull = new Set(admitted.pulls);
    const dueNow = dueDownloads.filter((w) => mayPull.has(w));
    if (!diskProblem && dueNow.length > 0 && this.opts.sizeEstimator) {
      diskProblem = await this.estimateFits(dueNow, view.images, problems, signal);
      if (diskProblem) {
        log.warn({ missing: dueNow.length, err: diskProblem }, 'the images to pull would not fit below the high watermark; not pulling this batch');
        for (const w of dueNow) puller.fail(w.key, new RuntimeError('NoSpace', diskProblem));
        await this.opts.rolloutGate?.releaseAll('no room below the watermark');
      }
    }
    const pulling = diskProblem ? admitted.pulls.filter(isName) : admitted.pulls;

    // 8. Report (also while pulls run, so a long pull shows its progress).
    const report = (): NodeSetStatus[] => {
      const { sets, history } = computeSetStatuses({
        plan,
        pinsInFile,
        present: (w) => Boolean(found(w)),
        pinnedByRuntime: (w) => (reportsPins ? found(w)?.pinned : undefined),
        failure: (k) => puller.failure(k),
        runtimeError,
        writeError,
        pinProblem,
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
      this.updateMetrics(plan, sets, (w) => Boolean(found(w)), runtimeError === undefined);
      return sets;
    };

    let pullsAttempted = 0;
    if (pulling.length > 0) {
      const downloads = pulling.filter((w) => kinds.get(w.key) === 'download').length;
      log.info(
        { missing: downloads, nameOnly: pulling.length - downloads, due: pulling.filter((w) => puller.isDue(w.key)).length, waitingForSlot: toPull.length - pulling.length || undefined },
        'pulling missing images',
      );
      const byKey = new Map(pulling.map((m) => [m.key, m]));
      // Until verified, a pulled image counts as present with the runtime's
      // answer to PullImage (progress reports while the others still pull).
      const landed = (r: PullResult) => {
        const w = byKey.get(r.key);
        if (!r.ok || !w) return;
        const img: RuntimeImage = { id: r.imageRef ?? '', repoTags: [], repoDigests: [w.reference.reference], size: 0, pinned: !reportsPins, runtimeHandler: w.runtimeHandler };
        if (w.runtimeHandler) handlerImages.set(w.key, img);
        else view.set(w.reference.reference, img);
      };
      report(); // a set that starts pulling shows Progressing now
      const progress = setInterval(report, PROGRESS_REPORT_MS);
      let results: PullResult[];
      try {
        results = await puller.pull(pulling, signal, landed, (k) => kinds.get(k) ?? 'download').catch((e) => {
          if (signal.aborted) throw new Cancelled('superseded');
          throw e;
        });
      } finally {
        clearInterval(progress);
      }
      await this.opts.rolloutGate?.releaseAll();
      pullsAttempted = results.length;
      const pulled = results.filter((r) => r.ok).map((r) => byKey.get(r.key)).filter((w): w is WantedImage => w !== undefined);
      // A pull adds the reference as a stored name.
      for (const w of pulled) if (!w.runtimeHandler) this.knownNames.add(w.reference.reference.toLowerCase());

      // 7. Verify, once the pulls are done (so verification never competes
      // with them). A reload that nothing could confirm before is confirmed
      // by the pulled images now: they hold their names, so once CRI-O has
      // loaded its list they report pinned.
      if (reportsPins && this.loaded.state === 'unconfirmed') {
        const probes: PinProbe[] = pulled.filter((w) => !w.runtimeHandler && this.pinLoaded(w.reference.reference)).slice(0, 8).map((w) => ({ ref: w.reference.reference, expect: true }));
        if (probes.length > 0) {
          const timeoutMs = Math.max(0, this.loaded.reloadedAt + this.pinWaitTimeout() - this.now());
          const r = await waitForPins(runtime, probes, { timeoutMs, signal });
          if (r.applied) this.confirmLoaded('pulled images report pinned', r.waitedMs);
          else if (!r.unobservable) pinProblem = this.reloadNotApplied(probes[0]!, effective) ?? pinProblem;
        }
      }
      await mapLimit(pulled, VERIFY_PARALLEL, async (w) => {
        try {
          const st = await runtime.imageStatus(w.reference.reference, w.runtimeHandler);
          if (w.runtimeHandler) handlerImages.set(w.key, st);
          else if (st) view.set(w.reference.reference, st);
          else {
            view.set(w.reference.reference, null);
            log.warn({ image: w.reference.reference }, 'pulled, but the runtime does not report the image');
          }
        } catch (e) {
          log.warn({ image: w.reference.reference, err: errMessage(e) }, 'image status after pull failed');
        }
      });
    }

    // The runtime contradicting the loaded list: a reference CRI-O holds by
    // name, that the list it is believed to have loaded pins, reported
    // unpinned. CRI-O has not loaded its files (the agent stopped between
    // writing and reloading, or CRI-O was reloaded behind its back): reload,
    // paced, confirmed by those very references.
    if (reportsPins && !runtimeError) {
      const recentReload = this.loaded.state === 'unconfirmed' && this.now() - this.loaded.reloadedAt < this.pinWaitTimeout();
      const contradicting = recentReload
        ? []
        : plan.wanted.filter((w) => {
            const ref = w.reference.reference;
            const img = found(w);
            return !w.runtimeHandler && img && !img.pinned && pinsInFile.has(ref) && this.knownNames.has(ref.toLowerCase()) && this.pinLoaded(ref);
          });
      this.evidenceWaiting = false;
      if (contradicting.length === 0) {
        this.evidenceBackoff.reset();
      } else {
        const first = contradicting[0]!.reference.reference;
        log.warn({ images: contradicting.length, image: first, state: this.loaded.state }, "CRI-O reports images unpinned that its files pin and that it holds by name: it has not loaded its files; reloading");
        this.loaded = { ...this.loaded, state: 'stale' };
        if (this.now() >= this.evidenceNextAt) {
          this.evidenceNextAt = this.now() + this.evidenceBackoff.fail();
          const probes = contradicting.slice(0, 8).map((w) => ({ ref: w.reference.reference, expect: true }));
          const r = await this.syncPins({ effective, rejected, view, reportsPins, pauseImage: scan.pauseImage, signal, probes });
          reloaded ||= r.reloaded;
          pinProblem = r.problem ?? pinProblem;
          if (r.images) view = new RuntimeView(r.images);
        } else {
          this.evidenceWaiting = true;
        }
      }
    }

    // An estimate is shown while its set still has images to download.
    if (!runtimeError) {
      const pending = new Set(plan.wanted.filter((w) => !found(w)).flatMap((w) => w.sets));
      for (const k of [...this.setEstimates.keys()]) if (!pending.has(k)) this.setEstimates.delete(k);
    }
    const sets = report();
    if (!runtimeError) {
      this.inPlace = new Map(plan.wanted.filter((w) => !w.runtimeHandler && inPlace(w)).map((w) => [w.key, w.reference.reference]));
      this.knownPresent = new Set(plan.wanted.filter((w) => found(w)).map((w) => w.key));
      this.lastListAt = this.now();
      this.firstSyncDone = true;
    }
    return { plan, sets, wrote, reloaded, pullsAttempted, runtimeReachable: runtimeError === undefined };
  }

  private pinWaitTimeout(): number {
    return this.opts.pinWaitTimeoutMs ?? PIN_WAIT_TIMEOUT_MS;
  }

  /** Is `ref` in the list CRI-O is believed to have loaded (and not contradicted)? */
  private pinLoaded(ref: string): boolean {
    const l = this.loaded;
    if (!l || l.state === 'stale') return false;
    return lowercased(l.patterns).has(ref.toLowerCase());
  }

  private confirmLoaded(how: string, waitedMs: number): void {
    if (!this.loaded) return;
    this.loaded = { ...this.loaded, state: 'confirmed' };
    this.opts.metrics?.reloadConfirmSeconds.observe((this.now() - this.loaded.reloadedAt) / 1000);
    this.log.info({ how, waitedMs, appliedAfterMs: this.now() - this.loaded.reloadedAt }, 'CRI-O applied the reload');
  }

  /** A reload CRI-O did not apply within the bound: retried at the reload's pace; the sets say so. */
  private reloadNotApplied(probe: PinProbe, effective: readonly string[]): PinProblem | undefined {
    if (!this.loaded) return undefined;
    const message = `CRI-O did not apply its pin list within ${this.pinWaitTimeout()} ms of the reload: ImageStatus of ${probe.ref} still reports pinned=${!probe.expect}. CRI-O logs why ("Unable to reload configuration"); retrying`;
    // The list CRI-O holds is unknown: the references it pinned before may still be in effect, the new ones are not.
    const previous = this.loaded.state === 'unconfirmed' ? [] : this.loaded.patterns;
    this.loaded = { patterns: previous, key: pinListKey(previous), state: 'notApplied', reloadedAt: this.loaded.reloadedAt };
    const delay = this.reloadGate.fail(message, { image: probe.ref });
    this.reloadFailure = { reason: 'ReloadNotApplied', message };
    this.reloadWaiting = true;
    this.opts.metrics?.reloads.inc({ result: 'not_applied' });
    this.opts.events?.record('Warning', 'ReloadNotApplied', `${message} in ${Math.round(delay / 1000)} s`);
    return { ...this.reloadFailure, affected: this.affectedBy(effective) };
  }

  /** References in `effective` whose pin is not in effect in CRI-O now. */
  private affectedBy(effective: readonly string[]): (ref: string) => boolean {
    const eff = new Set(effective.map((p) => p.toLowerCase()));
    const l = this.loaded;
    const loaded = new Set((l?.patterns ?? []).map((p) => p.toLowerCase()));
    const all = l?.state === 'stale';
    return (ref) => eff.has(ref.toLowerCase()) && (all || !loaded.has(ref.toLowerCase()));
  }

  private rejectionProblem(rejected: readonly ConfigRejection[]): ReloadFailure {
    const first = rejected[0]!;
    const more = rejected.length > 1 ? ` (and ${rejected.length - 1} more file(s): ${rejected.slice(1, 4).map((r) => r.path).join(', ')})` : '';
    return {
      reason: 'CrioConfigRejected',
      message: `CRI-O would refuse its configuration, so it can neither apply these pins nor start: ${first.path}: ${first.error}${more}. Fix or remove the file; pinset reloads CRI-O as soon as the folder changes`,
    };
  }

  /** Logs (once per change) and records an Event when CRI-O would refuse its folder. */
  private noteRejected(rejected: readonly ConfigRejection[]): void {
    const key = JSON.stringify(rejected);
    this.opts.metrics?.configRejected.set(rejected.length);
    if (key === this.lastRejectionKey) return;
    this.lastRejectionKey = key;
    if (rejected.length === 0) {
      this.log.info('CRI-O would accept its configuration again');
      return;
    }
    this.log.error({ files: rejected }, 'CRI-O would refuse its configuration (a reload would fail, a restart would not start): not reloading until the folder changes');
    this.opts.events?.record('Warning', 'CrioConfigRejected', this.rejectionProblem(rejected).message);
  }

  /** A wanted image that was in place and is gone (RemoveImage, `crictl rmi`): named in a log line and an Event. */
  private noteRemoved(plan: Plan, found: (w: WantedImage) => RuntimeImage | null | undefined): void {
    for (const w of plan.wanted) {
      if (!this.inPlace.has(w.key) || found(w)) continue;
      const ref = w.reference.reference;
      const sets = w.sets.map((k) => k.split('/').slice(1).join('/'));
      this.log.warn({ image: ref, sets }, 'a pinned image was removed from the runtime; pulling it again');
      this.opts.events?.record('Warning', 'ImageRemoved', `image ${ref} of set(s) ${sets.join(', ')} was removed from the runtime although pinned; pulling it again`, ref);
      this.inPlace.delete(w.key);
    }
  }

  /**
   * Reload CRI-O when the list its files hold differs from the one it is
   * believed to have loaded (or the runtime contradicted it), unless its
   * folder would be refused or the last attempt's backoff runs; then confirm
   * by polling `pinned` of references whose state must flip. One reload per
   * change. Returns the runtime's images afresh when a reload was confirmed.
   */
  private async syncPins(o: {
    effective: string[];
    rejected: readonly ConfigRejection[];
    view: RuntimeView;
    reportsPins: boolean;
    pauseImage: string;
    signal: AbortSignal;
    probes?: PinProbe[];
  }): Promise<{ reloaded: boolean; problem?: PinProblem; images?: RuntimeImage[] }> {
    const loaded = this.loaded!;
    const key = pinListKey(o.effective);
    this.reloadWaiting = false;
    if (key === loaded.key && (loaded.state === 'assumed' || loaded.state === 'confirmed' || loaded.state === 'unconfirmed')) {
      this.reloadFailure = undefined;
      return { reloaded: false };
    }
    const affected = this.affectedBy(o.effective);
    const { reloader, metrics, runtime } = this.opts;
    if (reloader.mode === 'none') {
      // Something else reloads CRI-O (or its next start applies the files):
      // from here on the files are what it is believed to load, unless it
      // says otherwise.
      if (loaded.state !== 'stale') this.loaded = { patterns: o.effective, key, state: 'assumed', reloadedAt: 0 };
      return { reloaded: false };
    }
    if (o.rejected.length > 0) return { reloaded: false, problem: { ...this.rejectionProblem(o.rejected), affected } };
    if (!this.reloadGate.due()) {
      this.reloadWaiting = true;
      return { reloaded: false, problem: this.reloadFailure ? { ...this.reloadFailure, affected } : undefined };
    }
    if (!this.runtimeAnswered) return { reloaded: false };
    const probes = o.probes ?? (o.reportsPins ? reloadProbes(loaded.patterns, o.effective, o.view, this.knownNames, o.pauseImage) : []);
    const started = this.now();
    try {
      await reloader.reload(o.signal);
    } catch (e) {
      if (o.signal.aborted) throw new Cancelled('superseded while reloading');
      const err = errMessage(e);
      const delay = this.reloadGate.fail(err, { mode: reloader.mode, note: 'the pin file stays' });
      this.reloadFailure = { reason: 'ReloadFailed', message: `CRI-O was not reloaded after its pin list changed (retrying): ${err}` };
      this.reloadWaiting = true;
      metrics?.reloads.inc({ result: 'failure' });
      this.opts.events?.record('Warning', 'ReloadFailed', `CRI-O reload failed (retrying in ${Math.round(delay / 1000)} s): ${err}`);
      return { reloaded: false, problem: { ...this.reloadFailure, affected } };
    }
    const signalledMs = this.now() - started;
    if (o.reportsPins && probes.length === 0) {
      // Nothing known to flip; but images the new list pins that the runtime
      // shows unpinned flip if their reference is a stored name (the common
      // case: pulled by digest). A short wait for them spares their
      // name-only pulls; if none flips, the pulls that follow confirm it.
      const tentative = tentativeProbes(loaded.patterns, o.effective, o.view);
      if (tentative.length > 0) {
        const r = await waitForPins(runtime, tentative, { timeoutMs: Math.min(TENTATIVE_WAIT_MS, this.pinWaitTimeout()), signal: o.signal });
        checkpoint(o.signal);
        if (r.applied) {
          for (const [ref, img] of r.last) if (img?.pinned) this.knownNames.add(ref.toLowerCase());
          return this.reloadApplied(o.effective, key, started, signalledMs, tentative.length);
        }
      }
    }
    if (!o.reportsPins || probes.length === 0) {
      // Nothing to read back now: containerd reports no pins; on CRI-O no
      // reference whose state must flip is present yet. The pulls that
      // follow confirm it (they add names the new list pins).
      this.loaded = { patterns: o.effective, key, state: o.reportsPins ? 'unconfirmed' : 'assumed', reloadedAt: started };
      this.reloadGate.succeed({ mode: reloader.mode });
      this.reloadFailure = undefined;
      metrics?.reloads.inc({ result: 'success' });
      this.log.info({ mode: reloader.mode, durationMs: signalledMs, confirmed: false }, o.reportsPins ? 'CRI-O reloaded; nothing present shows the change yet, the pulls that follow confirm it' : 'CRI-O reloaded');
      return { reloaded: true };
    }
    const r = await waitForPins(runtime, probes, { timeoutMs: this.pinWaitTimeout(), signal: o.signal });
    checkpoint(o.signal);
    if (r.applied) return this.reloadApplied(o.effective, key, started, signalledMs, probes.length);
    if (r.unobservable) {
      this.loaded = { patterns: o.effective, key, state: 'unconfirmed', reloadedAt: started };
      this.reloadGate.succeed({ mode: reloader.mode });
      this.reloadFailure = undefined;
      metrics?.reloads.inc({ result: 'success' });
      return { reloaded: true };
    }
    this.loaded = { ...loaded, reloadedAt: started };
    return { reloaded: true, problem: this.reloadNotApplied(probes[0]!, o.effective) };
  }

  /**
   * Whether the images about to be downloaded fit below the watermark,
   * estimated from the registries; null when they do or when it cannot be
   * told (sizes unknown, filesystem not measurable), else why not. Name-only
   * pulls are not in `due`: they download nothing.
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

  /** A reload seen applied: the list is CRI-O's; `pinned` changed under every image it touches, so the runtime is asked once more. */
  private async reloadApplied(effective: string[], key: string, started: number, signalledMs: number, probes: number): Promise<{ reloaded: true; images?: RuntimeImage[] }> {
    const { reloader, metrics, runtime } = this.opts;
    this.loaded = { patterns: effective, key, state: 'confirmed', reloadedAt: started };
    this.reloadGate.succeed({ mode: reloader.mode });
    this.reloadFailure = undefined;
    metrics?.reloads.inc({ result: 'success' });
    metrics?.reloadConfirmSeconds.observe((this.now() - started) / 1000);
    this.log.info({ mode: reloader.mode, durationMs: signalledMs, confirmed: true, appliedAfterMs: this.now() - started, probes }, 'CRI-O reloaded and applied its pin list');
    const images = await runtime.listImages().catch(() => undefined);
    return { reloaded: true, images };
  }

  /** Version (until answered since the last outage) and ListImages; failures are returned, not thrown. */
  private async observeRuntime(): Promise<{ images: RuntimeImage[]; error: string | undefined }> {
    try {
      if (!this.runtimeAnswered) {
        const info = await this.opts.runtime.version();
        if (JSON.stringify(info) !== JSON.stringify(this.runtimeInfo)) this.log.info({ runtime: info }, 'connected to the container runtime');
        this.runtimeInfo = info;
        this.runtimeAnswered = true;
      }
      const images = await this.opts.runtime.listImages();
      this.runtimeGate.succeed();
      return { images, error: undefined };
    } catch (e) {
      const error = errMessage(e);
      this.runtimeAnswered = false;
      this.runtimeGate.fail(error, { endpoint: this.opts.criSocketPath ?? undefined, note: 'pins kept' });
      return { images: [], error };
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

  // ---------------------------------------------------------------------------
  // The loop

  /** When a full reconcile is due without a trigger: the resync, or a failed step's next attempt. */
  private nextReconcileAt(): number {
    if (this.reconcileGate.failing) return this.reconcileGate.nextAt;
    let at = this.lastReconcileAt + (this.opts.resyncIntervalMs ?? 300_000);
    if (this.runtimeGate.failing) {
      // Nothing but reaching the runtime can make progress; pull retries wait for it.
      at = Math.min(at, this.runtimeGate.nextAt);
    } else {
      const pull = this.opts.puller.nextAttemptAt();
      if (pull !== undefined) at = Math.min(at, pull);
      if (this.reloadWaiting) at = Math.min(at, this.reloadGate.nextAt);
      if (this.evidenceWaiting) at = Math.min(at, this.evidenceNextAt);
      const slot = this.opts.rolloutGate?.nextAttemptAt();
      if (slot !== undefined) at = Math.min(at, slot);
    }
    if (this.writeGate.failing) at = Math.min(at, this.writeGate.nextAt);
    return at;
  }

  /** When the next cheap presence check is due, if one is needed. */
  private nextPresenceCheckAt(): number | undefined {
    if (this.runtimeGate.failing || this.inPlace.size === 0) return undefined;
    return this.lastListAt + (this.opts.presenceCheckMs ?? PRESENCE_CHECK_MS);
  }

  /** One ListImages: a full reconcile follows if a wanted image that was in place is gone or unpinned. */
  private async presenceCheck(): Promise<void> {
    this.lastListAt = this.now();
    const reportsPins = (this.runtimeInfo?.runtimeName ?? '').toLowerCase() === 'cri-o';
    try {
      const view = new RuntimeView(await this.opts.runtime.listImages());
      for (const ref of this.inPlace.values()) {
        const img = view.find(ref);
        if (!img || (reportsPins && !img.pinned)) {
          this.log.debug({ image: ref }, 'presence check: a pinned image is missing or unpinned');
          this.dirty = true;
          return;
        }
      }
    } catch {
      // The reconcile records the outage and paces what follows.
      this.dirty = true;
    }
  }

  /** Start watching the folders and run reconciles until stop(). */
  start(): void {
    const { pinFile, staticDir, criSocketPath } = this.opts;
    this.watch(staticDir, { recursive: false }, () => this.trigger('static folder changed', true));
    // CRI-O reads the whole folder, subfolders included: a change anywhere
    // may fix (or break) what a reload would load.
    this.watch(pinFile.dir, { recursive: true }, () => this.trigger('drop-in folder changed'));
    const main = path.basename(pinFile.mainConfig);
    this.watch(path.dirname(pinFile.mainConfig), { recursive: false }, (name) => {
      if (name === main) this.trigger('crio.conf changed');
    });
    if (criSocketPath) {
      const sock = path.basename(criSocketPath);
      this.watch(path.dirname(criSocketPath), { recursive: false }, (name) => {
        if (name !== sock) return;
        // A new socket is a new runtime process: it must answer before it is
        // signalled. A socket gone is a runtime gone: noticed now, not at the
        // next presence check.
        this.runtimeAnswered = false;
        if (fs.existsSync(criSocketPath)) {
          if (this.runtimeGate.failing) this.runtimeGate.expedite();
          this.trigger('the runtime socket appeared');
        } else {
          this.trigger('the runtime socket went away');
        }
      });
    }
    this.loopDone = this.loop();
  }

  private watch(dir: string, opts: { recursive: boolean }, onChange: (name: string | null) => void): void {
    try {
      const w = fs.watch(dir, { recursive: opts.recursive }, (_ev, name) => onChange(name === null ? null : String(name)));
      w.on('error', () => w.close());
      this.watchers.push(w);
    } catch {
      // A missing folder is re-read on every resync and retry.
    }
  }

  /** While writing fails: a cheap check (access + statfs) every few seconds brings the retry forward when the cause clears. */
  private startWriteProbe(): void {
    if (this.writeProbe) return;
    const dir = this.opts.pinFile.dir;
    const check = async () => {
      let ok: boolean;
      try {
        await fsp.access(dir, fs.constants.W_OK);
        const st = await fsp.statfs(dir);
        // Root may use the blocks reserved for it; others only the available ones.
        const free = (process.getuid?.() === 0 ? st.bfree : st.bavail) * st.bsize;
        ok = free >= WRITE_PROBE_MIN_FREE;
      } catch {
        ok = false;
      }
      if (ok && this.writeProbeOk === false && this.writeGate.failing) {
        this.log.info({ dir }, 'the drop-in folder looks writable again; retrying the pin file now');
        this.writeGate.expedite();
        this.trigger('drop-in folder writable again');
      }
      this.writeProbeOk = ok;
    };
    void check();
    this.writeProbe = setInterval(() => void check(), WRITE_PROBE_MS);
    this.writeProbe.unref();
  }

  private stopWriteProbe(): void {
    clearInterval(this.writeProbe);
    this.writeProbe = undefined;
    this.writeProbeOk = undefined;
  }

  private async sleepUntilWoken(): Promise<void> {
    const presence = this.nextPresenceCheckAt();
    const at = Math.min(this.nextReconcileAt(), presence ?? Infinity);
    await new Promise<void>((resolve) => {
      this.wake = resolve;
      this.timer = setTimeout(resolve, Math.max(50, at - this.now()));
    });
    clearTimeout(this.timer);
    this.wake = undefined;
  }

  private async loop(): Promise<void> {
    while (!this.stopped) {
      if (!this.dirty) {
        await this.sleepUntilWoken();
        if (this.stopped) break;
        if (!this.dirty && this.now() < this.nextReconcileAt()) {
          const presence = this.nextPresenceCheckAt();
          if (presence !== undefined && this.now() >= presence) {
            await this.presenceCheck();
            this.lastLoopAt = this.now();
          }
          if (!this.dirty) continue;
        }
      }
      this.dirty = false;
      this.current = new AbortController();
      const started = this.now();
      try {
        const r = (this.lastResult = await this.reconcile(this.current.signal));
        const phases: Record<string, number> = {};
        for (const s of r.sets) phases[s.phase] = (phases[s.phase] ?? 0) + 1;
        this.log.info(
          { wrote: r.wrote, reloaded: r.reloaded, pulls: r.pullsAttempted, wanted: r.plan.wanted.length, phases, pins: this.loaded?.state, durationMs: this.now() - started },
          'reconcile finished',
        );
        this.opts.metrics?.reconciles.inc({ result: 'success' });
        this.reconcileGate.succeed();
      } catch (e) {
        if (e instanceof Cancelled || this.current.signal.aborted) {
          this.opts.metrics?.reconciles.inc({ result: 'cancelled' });
          // The change that cancelled it has its reconcile scheduled (after the
          // debounce, so a burst of changes costs one more reconcile, not one each).
          this.dirty = this.debounce === undefined;
        } else {
          // Not one of the steps with a gate of their own (those do not throw): paced all the same.
          this.opts.metrics?.reconciles.inc({ result: 'error' });
          this.reconcileGate.fail(errMessage(e), { note: 'pins kept' });
        }
      } finally {
        this.current = undefined;
        this.lastReconcileAt = this.now();
        this.lastLoopAt = this.now();
      }
    }
  }

  /** Stop: cancel the running reconcile and pulls; files are consistent at every point. */
  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.debounce);
    clearTimeout(this.timer);
    this.stopWriteProbe();
    for (const w of this.watchers) w.close();
    this.current?.abort(new Cancelled('shutting down'));
    this.opts.puller.abortAll();
    this.wake?.();
    await this.loopDone;
  }
}
