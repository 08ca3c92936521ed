// The agent: level-triggered, single-flight reconciles (./reconcile.ts).
// While a change settles, ./lookahead.ts asks ahead for what the reconcile
// will wait on before its first pull.
// Any change (a set, the node's labels, the static folder, what the pin
// backend watches, a retry coming due, the periodic resync) schedules one
// reconcile; a reconcile running when the desired state changes is
// cancelled at its next safe point (its pulls that are still wanted carry
// on and are joined by the next one). This class keeps the loop, the
// triggers, the timers and the watches; each phase's state is kept by the
// part that owns it.
//
// Every failing step is retried at its own pace (src/util/retry.ts: ~1 s
// doubling to ~1 min, with jitter) and logged once per change of state.
// Between attempts the agent sleeps; it wakes early when what it watches
// says the cause cleared: the runtime's socket reappearing, or what the pin
// backend watches or probes (CRI-O: its drop-in folder changing, a refused
// file fixed, or writable again).
//
// The agent does not know which runtime it pins on: it is handed the pin
// backend's choice (src/pins/choice.ts), built where the node's runtime is
// decided (./boot/pin-kit.ts). It owns the reactions to what changes
// outside: the API side tells it (onDesiredStateChanged, onSecretChanged,
// onRolloutSlotLost, onRolloutChanged), and so do the backends (a wake-up).
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { Logger } from 'pino';
import type { Labels } from '../api/selector.ts';
import type { NodeRuntime } from '../api/types.ts';
import type { ImageRuntime } from '../cri/runtime.ts';
import type { AgentMetrics } from '../metrics/agent-metrics.ts';
import type { PinChoice } from '../pins/choice.ts';
import type { DownloadProgress } from '../pins/downloads.ts';
import type { AuthFile } from '../registry/auth.ts';
import type { FirstWave } from '../rollout/first-wave.ts';
import type { RolloutGate } from '../rollout/gate.ts';
import type { BackoffPolicy } from '../util/backoff.ts';
import { Cancelled } from '../util/cancel.ts';
import { errMessage } from '../util/problem-log.ts';
import { RetryGate, STEP_RETRY } from '../util/retry.ts';
import type { DiskCheck } from './disk.ts';
import type { KubeletConfigWatch } from './kubelet-watch.ts';
import type { SizeEstimator } from './estimate.ts';
import type { KubeObserver } from './kube.ts';
import { Lookahead } from './lookahead.ts';
import type { AgentCredentials } from './image-credentials.ts';
import type { EventRecorder } from './node-sinks.ts';
import { SetSources } from './observe.ts';
import { Presence, PRESENCE_CHECK_MS } from './presence.ts';
import { PullAdmission } from './pull-admission.ts';
import type { ImagePuller } from './puller.ts';
import { reconcile, type ReconcileParts, type ReconcileResult } from './reconcile.ts';
import { RuntimeObserver } from './runtime-state.ts';
import { currentRuntime, SetReport } from './set-report.ts';
import type { StatusReporter } from './status-reporter.ts';

export { PRESENCE_CHECK_MS } from './presence.ts';
export type { ReconcileResult } from './reconcile.ts';

/**
 * Events within this long of the first one make one reconcile. A burst (a
 * `kubectl apply` of several sets, a relist, a folder of files written one
 * by one) arrives within a few ms; the settle time is paid by every set
 * change before anything happens on the node (BENCHMARKS.md, section 9).
 */
export const DEBOUNCE_MS = 50;

export interface AgentOptions {
  nodeName: string;
  runtime: ImageRuntime;
  /** The CRI socket's path, when it is a unix socket: its folder is watched so a restarted runtime is noticed at once. */
  criSocketPath?: string | null;
  /** The node's pin backend, chosen as the runtime answers CRI Version (./boot/pin-kit.ts builds it; its owner closes it). */
  pins: PinChoice;
  /** What the runtime tells of downloads under way, for each set's bytes while it downloads (the pin kit builds it where the runtime is containerd; its owner closes it). */
  downloads?: DownloadProgress | null;
  puller: ImagePuller;
  reporter: StatusReporter;
  logger: Logger;
  kube?: KubeObserver | null;
  staticDir: string;
  /** --node-labels: used when the Node cannot be read. */
  flagLabels?: Labels | null;
  authFile?: AuthFile | null;
  /** Every pull's and estimate's credentials: the sets' pull secrets, then the node's (./image-credentials.ts). */
  credentials?: AgentCredentials | null;
  events?: EventRecorder | null;
  metrics?: AgentMetrics | null;
  /** Pulls wait while the image filesystem is above its high watermark. */
  diskCheck?: DiskCheck | null;
  /** The kubelet's configuration, found on the node and watched: what its credential verification does to pinned images offline (./kubelet-watch.ts). */
  kubeletConfig?: KubeletConfigWatch | null;
  /** Sizes of images to download, so a batch that would not fit below the watermark is not started. */
  sizeEstimator?: SizeEstimator | null;
  /** Estimated disk = compressed download x this (default 2). */
  diskEstimateFactor?: number;
  /** Rollout slots: downloads of sets with spec.rollout.maxConcurrentNodes wait for one (src/rollout/gate.ts). */
  rolloutGate?: RolloutGate | null;
  /** The first wave: downloads of sets with spec.rollout.firstWave wait until a first-wave node holds the image (src/rollout/first-wave.ts). */
  firstWave?: FirstWave | null;
  resyncIntervalMs?: number;
  /** How often, at most, the runtime is asked (one ListImages) whether pinned images are still there between reconciles. */
  presenceCheckMs?: number;
  /** Settle time before a triggered reconcile starts, to batch bursts of events (default DEBOUNCE_MS). */
  debounceMs?: number;
  /** The node's runtime as its profile describes it (./boot/node-profile.ts describeProfile); the node status puts the backend in use and the runtime's last answer in their places. */
  nodeRuntime?: NodeRuntime;
  /** Pace of every failing step (default STEP_RETRY: ~1 s doubling to ~1 min). */
  retryPolicy?: BackoffPolicy;
  now?: () => number;
}

export class Agent {
  readonly opts: AgentOptions;
  private readonly log: Logger;
  private readonly now: () => number;
  private readonly parts: ReconcileParts;
  private readonly runtime: RuntimeObserver;
  private readonly pins: PinChoice;
  private readonly presence: Presence;
  private readonly lookahead: Lookahead;
  lastResult: ReconcileResult | undefined;
  /** Time the loop last finished a pass (for /healthz). */
  lastLoopAt = 0;
  firstSyncDone = false;
  /** A reconcile that failed outside the steps with a gate of their own (a bug, an I/O error nobody expected). */
  private readonly reconcileGate: RetryGate;
  private lastReconcileAt = 0;

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
    const gate = { now: this.now, policy: opts.retryPolicy ?? STEP_RETRY };
    this.reconcileGate = new RetryGate('reconciling', this.log, gate);
    this.runtime = new RuntimeObserver(opts.runtime, this.log, new RetryGate('reaching the container runtime', this.log, gate), opts.criSocketPath);
    this.pins = opts.pins;
    this.pins.onWake((why) => this.trigger(why));
    this.presence = new Presence(this.log, opts.events);
    this.parts = {
      log: this.log,
      runtime: this.runtime,
      sets: new SetSources(opts),
      pins: this.pins,
      admission: new PullAdmission(opts),
      puller: opts.puller,
      rolloutGate: opts.rolloutGate,
      firstWave: opts.firstWave,
      credentials: opts.credentials,
      presence: this.presence,
      report: new SetReport({ ...opts, now: this.now, nodeRuntime: () => opts.nodeRuntime && currentRuntime(opts.nodeRuntime, this.pins.for(this.runtime.info).name, this.runtime.info) }),
      now: this.now,
    };
    this.lookahead = new Lookahead(this.parts);
  }

  /** One reconcile. Throws Cancelled when superseded. */
  async reconcile(signal: AbortSignal = new AbortController().signal): Promise<ReconcileResult> {
    const r = await reconcile(this.parts, signal);
    if (r.runtimeReachable) this.firstSyncDone = true;
    return r;
  }

  /** A set, the Node's labels or the sets' CRD changed: the desired state may have changed, so a running reconcile is stale. */
  onDesiredStateChanged(why: string): void {
    this.trigger(why, true);
  }

  /** A pull secret changed: the images of the sets naming it are tried again now. */
  onSecretChanged(name: string): void {
    const { credentials, puller } = this.opts;
    if (credentials) puller.retryNow(credentials.imagesUsingSecret(name));
    this.trigger('pull secret changed');
  }

  /** A rollout slot this node held was lost: the reconcile asks for it again. */
  onRolloutSlotLost(): void {
    this.trigger('rollout slot lost');
  }

  /** A slot or first-wave seat was granted, or the first wave landed an image: what may be downloaded changed. */
  onRolloutChanged(why: string): void {
    this.trigger(why);
  }

  /** Ask for a reconcile. `cancel`: the desired state changed, so a running reconcile is stale. */
  trigger(reason: string, cancel = false): void {
    if (this.stopped) return;
    this.log.debug({ reason }, 'reconcile requested');
    if (cancel && this.current && !this.current.signal.aborted) {
      this.log.info({ reason }, 'desired state changed; cancelling the running reconcile at its next safe point');
      this.current.abort(new Cancelled(reason));
    }
    if (cancel) this.lookahead.request();
    // Events within debounceMs of the first one are batched into one
    // reconcile; the window does not slide, so a steady stream of events
    // delays a reconcile by at most debounceMs, never starves it.
    if (this.debounce) return;
    this.debounce = setTimeout(() => {
      this.debounce = undefined;
      this.dirty = true;
      this.wake?.();
    }, this.opts.debounceMs ?? DEBOUNCE_MS);
  }

  /** When a full reconcile is due without a trigger: the resync, or a failed step's next attempt. */
  private nextReconcileAt(): number {
    if (this.reconcileGate.failing) return this.reconcileGate.nextAt;
    let at = this.lastReconcileAt + (this.opts.resyncIntervalMs ?? 300_000);
    const runtimeGate = this.runtime.gate;
    const pins = this.pins.for(this.runtime.info);
    if (runtimeGate.failing) {
      // Nothing but reaching the runtime can make progress; pull retries wait for it.
      at = Math.min(at, runtimeGate.nextAt);
    } else {
      const pull = this.opts.puller.nextAttemptAt();
      if (pull !== undefined) at = Math.min(at, pull);
      const slot = this.opts.rolloutGate?.nextAttemptAt();
      if (slot !== undefined) at = Math.min(at, slot);
      const wave = this.opts.firstWave?.nextAttemptAt();
      if (wave !== undefined) at = Math.min(at, wave);
    }
    return Math.min(at, pins.nextAttemptAt(!runtimeGate.failing) ?? Infinity);
  }

  /** When the next cheap presence check is due, if one is needed. */
  private nextPresenceCheckAt(): number | undefined {
    return this.presence.nextCheckAt(this.runtime.gate.failing, this.opts.presenceCheckMs ?? PRESENCE_CHECK_MS);
  }

  /** Start watching and run reconciles until stop(). */
  start(): void {
    const { staticDir, criSocketPath } = this.opts;
    this.watch(staticDir, { recursive: false }, () => this.trigger('static folder changed', true));
    for (const w of this.pins.for(this.runtime.info).watchPaths()) {
      this.watch(w.dir, { recursive: w.recursive }, (name) => {
        if (w.name === undefined || name === w.name) this.trigger(w.reason);
      });
    }
    if (criSocketPath) {
      const sock = path.basename(criSocketPath);
      this.watch(path.dirname(criSocketPath), { recursive: false }, (name) => {
        if (name !== sock) return;
        // A new socket is a new runtime process: it must answer before it is
        // signalled. A socket gone is a runtime gone: noticed now, not at the
        // next presence check.
        this.runtime.restarted();
        this.pins.for(this.runtime.info).runtimeRestarted?.();
        if (fs.existsSync(criSocketPath)) {
          if (this.runtime.gate.failing) this.runtime.gate.expedite();
          this.trigger('the runtime socket appeared');
        } else {
          this.trigger('the runtime socket went away');
        }
      });
    }
    // A drop-in added or changed (the kubelet reads them at its next start): the status says at once what it will do.
    this.opts.kubeletConfig?.start((why) => this.trigger(why));
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
            if (await this.presence.check(this.opts.runtime, this.pins.for(this.runtime.info), this.now())) this.dirty = true;
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
          { wrote: r.wrote, reloaded: r.reloaded, pulls: r.pullsAttempted, wanted: r.plan.wanted.length, phases, pins: this.pins.for(this.runtime.info).state, durationMs: this.now() - started },
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
    this.opts.kubeletConfig?.stop();
    for (const w of this.watchers) w.close();
    this.current?.abort(new Cancelled('shutting down'));
    this.opts.puller.abortAll();
    this.wake?.();
    await this.loopDone;
  }
}
