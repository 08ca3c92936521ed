// The status controller: informers on Nodes and PinnedImageSets, and, while
// this replica leads, the roll-up of each set touched by a change written to
// the set's status subresource when (and only when) it differs from what is
// there. Level-triggered: every pass recomputes from the caches, so a missed
// or repeated event costs nothing but a recomputation.
//
// A set's progress (status.progress, ./progress.ts) changes with every
// node's progress report; written at once, each would reach every agent
// (they all watch the sets). So a status that differs from the one written
// in its progress alone waits until --progress-interval after the set's
// last write; any other change (a node ready or degraded, a new
// generation) is written at once, with the progress of that moment.
import { CustomObjectsApi, PatchStrategy, setHeaderOptions, type KubeConfig } from '@kubernetes/client-node';
import { KubeHttp } from '../api/kube-http.ts';
import { ListWatchCache, type ListWatchOptions } from '../api/list-watch.ts';
import { selectorErrors, selectorMatches } from '../api/selector.ts';
import { GROUP, PLURAL, VERSION, type PinnedImageSet, type PinnedImageSetStatus } from '../api/types.ts';
import type { Logger } from '../util/log.ts';
import type { ControllerMetrics } from './metrics.ts';
import { sameJson } from '../util/json.ts';
import { DEFAULT_PROGRESS_WINDOW_MS, ProgressTracker } from './progress.ts';
import { rollUp, type ObservedNode } from './rollup.ts';
import { changedSetNames, observeNode, sameLabels, SharedValues, type ObservedNodeEntry } from './observed-nodes.ts';

export interface SetStatusControllerOptions {
  kubeConfig: KubeConfig;
  log: Logger;
  metrics?: ControllerMetrics;
  /** Changes arriving within this window are rolled up together. */
  debounceMs?: number;
  /** Recompute every set this often even without events. */
  resyncMs?: number;
  /** A set's rate (status.progress) is measured over this much of the recent past. */
  progressWindowMs?: number;
  /** A change of a set's progress alone is written at most this often per set. */
  progressIntervalMs?: number;
  now?: () => Date;
  /** Watch tuning; see ListWatchOptions (timeoutSeconds is drawn from [min, 2 * min)). */
  minWatchTimeoutMs?: number;
  watch?: Partial<Pick<ListWatchOptions, 'idleGraceMs' | 'healthyAfterMs' | 'backoff' | 'pageSize'>>;
  /** Called when a set is added, changed or deleted (the rollout granter reads the sets' limits). */
  onSetChange?: () => void;
}

/** Every write the controller makes carries this field manager (the sets' managedFields name it). */
export const CONTROLLER_FIELD_MANAGER = 'pinset-controller';

type SetObject = PinnedImageSet;

const SET_NODE_STATES = ['matched', 'ready', 'progressing', 'degraded'] as const;

const SETS_PATH = `/apis/${GROUP}/${VERSION}/${PLURAL}`;
const NODES_PATH = '/api/v1/nodes';
const MAX_RETRY_MS = 30_000;
/** Default of --progress-interval. */
export const DEFAULT_PROGRESS_INTERVAL_MS = 30_000;

/** True when two statuses differ in their progress alone (both having one, in the same unit): such a change waits for its turn. */
export function progressOnly(written: PinnedImageSetStatus | undefined, next: PinnedImageSetStatus): boolean {
  if (!written?.progress || !next.progress || written.progress.unit !== next.progress.unit) return false;
  return sameJson({ ...written, progress: undefined }, { ...next, progress: undefined });
}

/**
 * The status as a merge patch sends it: lists are replaced whole, and keys
 * the new status lacks are sent as null so the server removes them (a
 * merge patch keeps what it does not name: an ETA that can no longer be
 * told must not stay).
 */
export function statusPatch(next: PinnedImageSetStatus): Record<string, unknown> {
  const progress = next.progress ? { rate: null, estimatedCompletionTime: null, estimatedCompletionIsLowerBound: null, ...next.progress } : null;
  return { ...next, degradedNodes: next.degradedNodes ?? null, progress };
}

function errorText(err: unknown): string {
  const code = (err as { code?: unknown } | null)?.code;
  const msg = err instanceof Error ? err.message : String(err);
  return typeof code === 'number' ? `HTTP ${code}: ${msg.split('\n')[0]}` : msg;
}

/** Whether each set object's selector is valid, worked out once per object (a change brings a new object). */
const validSelector = new WeakMap<PinnedImageSet, boolean>();

/** Whether a set's selector selects these labels; an invalid selector selects nothing. */
function selects(set: PinnedImageSet, labels: Readonly<Record<string, string>> | undefined): boolean {
  if (!labels) return false;
  const sel = set.spec?.nodeSelector;
  let valid = validSelector.get(set);
  if (valid === undefined) {
    valid = selectorErrors(sel).length === 0;
    validSelector.set(set, valid);
  }
  return valid && selectorMatches(sel, labels);
}

export class SetStatusController {
  readonly #log: Logger;
  readonly #metrics: ControllerMetrics | undefined;
  readonly #debounceMs: number;
  readonly #resyncMs: number;
  readonly #now: () => Date;
  readonly #custom: CustomObjectsApi;
  readonly #http: KubeHttp;
  /** Nodes as ./observed-nodes.ts keeps them: name, labels, the roll-up's fields of the report. */
  readonly #nodeInformer: ListWatchCache<ObservedNodeEntry>;
  readonly #setInformer: ListWatchCache<SetObject>;
  readonly #shared = new SharedValues();
  /** Status written by this replica and not yet seen back in the set cache, by set name. */
  readonly #written = new Map<string, { uid: string | undefined; status: PinnedImageSetStatus }>();
  readonly #dirty = new Set<string>();
  readonly #retry = new Map<string, number>();
  readonly #progress: ProgressTracker;
  readonly #progressIntervalMs: number;
  /** When this replica last wrote each set's status (ms on its clock). */
  readonly #lastWriteAt = new Map<string, number>();
  /** Sets whose progress-only change waits, and until when. */
  readonly #held = new Map<string, number>();
  #leading = false;
  #stopped = true;
  #timer: NodeJS.Timeout | undefined;
  #timerDue = 0;
  #resyncTimer: NodeJS.Timeout | undefined;
  #flushing: Promise<void> | undefined;

  constructor(opts: SetStatusControllerOptions) {
    this.#log = opts.log;
    this.#metrics = opts.metrics;
    this.#debounceMs = opts.debounceMs ?? 500;
    this.#resyncMs = opts.resyncMs ?? 5 * 60_000;
    this.#now = opts.now ?? (() => new Date());
    this.#progress = new ProgressTracker(opts.progressWindowMs ?? DEFAULT_PROGRESS_WINDOW_MS);
    this.#progressIntervalMs = opts.progressIntervalMs ?? DEFAULT_PROGRESS_INTERVAL_MS;
    const kc = opts.kubeConfig;
    this.#custom = kc.makeApiClient(CustomObjectsApi);
    this.#http = new KubeHttp(kc, { userAgent: CONTROLLER_FIELD_MANAGER });
    const common = { http: this.#http, log: this.#log, minWatchTimeoutMs: opts.minWatchTimeoutMs, ...opts.watch };
    // Nodes: metadata only, paginated, and of that only what the roll-up reads.
    this.#nodeInformer = new ListWatchCache<ObservedNodeEntry>({ ...common, what: 'nodes', path: NODES_PATH, metadataOnly: true }, (o) =>
      observeNode(o, this.#shared),
    );
    this.#setInformer = new ListWatchCache<SetObject>({ ...common, what: 'pinnedimagesets', path: SETS_PATH });

    this.#nodeInformer.on('add', (n) => this.#onNode(undefined, n));
    this.#nodeInformer.on('update', (n, old) => this.#onNode(old, n));
    this.#nodeInformer.on('delete', (n) => this.#onNode(n, undefined));
    this.#setInformer.on('add', (s) => this.#onSet(s, false));
    this.#setInformer.on('update', (s, old) => this.#onSet(s, false, old));
    this.#setInformer.on('delete', (s) => this.#onSet(s, true));
    if (opts.onSetChange) for (const e of ['add', 'update', 'delete'] as const) this.#setInformer.on(e, () => opts.onSetChange!());
    for (const [inf, resource] of [[this.#nodeInformer, 'nodes'], [this.#setInformer, 'pinnedimagesets']] as const) {
      // ListWatchCache retries on its own, with backoff; this only counts.
      inf.on('failure', () => this.#metrics?.watchErrors.inc({ resource }));
      inf.on('synced', () => this.#arm());
    }
  }

  /** Both caches have been filled from a list at least once. */
  synced(): boolean {
    return this.#nodeInformer.synced && this.#setInformer.synced;
  }

  isLeading(): boolean {
    return this.#leading;
  }

  /** The sets as the cache has them. */
  sets(): readonly PinnedImageSet[] {
    return this.#setInformer.list();
  }

  /** Start the informers. Failures are retried in the background. */
  start(): void {
    if (!this.#stopped) return;
    this.#stopped = false;
    this.#nodeInformer.start();
    this.#setInformer.start();
    this.#resyncTimer = setInterval(() => this.#markAll(), this.#resyncMs);
  }

  /**
   * Begin or end writing status. On becoming leader every set is recomputed;
   * on losing leadership nothing more is written.
   */
  setLeading(leading: boolean): void {
    if (leading === this.#leading) return;
    this.#leading = leading;
    this.#metrics?.leader.set(leading ? 1 : 0);
    if (leading) {
      this.#markAll();
    } else {
      clearTimeout(this.#timer);
      this.#timer = undefined;
      this.#written.clear();
      this.#retry.clear();
      this.#held.clear();
      this.#lastWriteAt.clear();
      // The next leader (maybe this one, later) starts its windows afresh: old observations would span a gap.
      this.#progress.retain(new Set());
      // Only the leader's view is exported; a standby shows no sets.
      this.#metrics?.setNodes.reset();
      this.#metrics?.setDegradedNodes.reset();
      this.#exportedReasons.clear();
    }
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    this.setLeading(false);
    clearInterval(this.#resyncTimer);
    await Promise.all([this.#nodeInformer.stop(), this.#setInformer.stop()]);
    await this.#flushing;
    this.#http.close();
  }

  /**
   * A node appeared, changed or went away: mark the sets whose roll-up it
   * changes. Kubelets update their Node every few seconds to minutes; when
   * neither the labels nor the report changed, nothing is marked, and when
   * only the report changed, only the sets whose entries changed.
   */
  #onNode(prev: ObservedNodeEntry | undefined, next: ObservedNodeEntry | undefined): void {
    const name = next?.name ?? prev?.name;
    if (!name) return;
    let only: Set<string> | undefined;
    if (prev && next && sameLabels(prev.labels, next.labels)) {
      only = changedSetNames(prev.reading, next.reading);
      if (only?.size === 0) return;
    }
    if (next?.reading.error && next.reading.error !== prev?.reading.error) this.#log.debug({ node: name, err: next.reading.error }, 'unreadable status annotation');
    for (const set of this.#setInformer.list()) {
      if (only && !only.has(set.metadata.name)) continue;
      if (selects(set, prev?.labels) || selects(set, next?.labels)) this.#mark(set.metadata.name);
    }
  }

  #onSet(set: SetObject, deleted: boolean, old?: SetObject): void {
    const name = set.metadata?.name;
    if (!name) return;
    const mine = this.#written.get(name);
    // The watch bringing back this replica's own status write, on the same
    // object and generation: nothing the roll-up reads has changed.
    const echo =
      !deleted &&
      mine !== undefined &&
      mine.uid === set.metadata.uid &&
      old?.metadata.uid === set.metadata.uid &&
      old?.metadata.generation === set.metadata.generation &&
      sameJson(mine.status, set.status);
    if (deleted || (mine && (mine.uid !== set.metadata.uid || sameJson(mine.status, set.status)))) this.#written.delete(name);
    this.#retry.delete(name);
    if (deleted) {
      this.#dirty.delete(name);
      this.#held.delete(name);
      this.#lastWriteAt.delete(name);
      this.#progress.forget(name);
      this.#setMetrics(name, undefined, new Map());
      return;
    }
    if (!echo) this.#mark(name);
  }

  #markAll(): void {
    for (const set of this.#setInformer.list()) this.#dirty.add(set.metadata.name);
    this.#arm();
  }

  #mark(name: string): void {
    this.#dirty.add(name);
    this.#arm();
  }

  /** Schedule a pass if one is due and allowed. */
  #arm(delay = this.#debounceMs): void {
    if (this.#stopped || !this.#leading || !this.synced() || this.#dirty.size === 0) return;
    const due = Date.now() + delay;
    if (this.#timer) {
      // A pass is already due sooner (or as soon): the change joins it.
      if (this.#timerDue <= due) return;
      clearTimeout(this.#timer);
    }
    this.#timerDue = due;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      if (this.#flushing) {
        // The running pass re-arms when it ends.
        return;
      }
      this.#flushing = this.#flush().finally(() => {
        this.#flushing = undefined;
        this.#arm(this.#nextDelay());
      });
    }, delay);
  }

  #nextDelay(): number {
    // Sets whose write failed wait for their own backoff, sets whose
    // progress alone changed for their turn; others go at the debounce pace.
    let retry = 0;
    let held = Infinity;
    const now = this.#now().getTime();
    for (const name of this.#dirty) {
      const r = this.#retry.get(name);
      const h = this.#held.get(name);
      if (r === undefined && h === undefined) return this.#debounceMs;
      if (r !== undefined) retry = Math.max(retry, r);
      else held = Math.min(held, h! - now);
    }
    return Math.max(this.#debounceMs, Math.min(retry > 0 ? retry : Infinity, held));
  }

  async #flush(): Promise<void> {
    const names = [...this.#dirty].sort();
    this.#dirty.clear();
    const nodes: readonly ObservedNode[] = this.#nodeInformer.list();
    for (const name of names) {
      if (!this.#leading || this.#stopped) return;
      const set = this.#setInformer.get(name);
      if (!set) continue;
      await this.#reconcileSet(set, nodes);
    }
    this.#countReady();
  }

  async #reconcileSet(set: SetObject, nodes: readonly ObservedNode[]): Promise<void> {
    const name = set.metadata.name;
    const mine = this.#written.get(name);
    const current = mine && mine.uid === set.metadata.uid ? mine.status : set.status;
    const now = this.#now();
    const { status: rolled, degradedReasons, work } = rollUp(set, nodes, now, current);
    let next = rolled;
    if (work) {
      const slots = set.spec?.rollout?.maxConcurrentNodes;
      const tracked = { name, uid: set.metadata.uid, generation: set.metadata.generation ?? 0, ...(typeof slots === 'number' ? { slots } : {}) };
      next = { ...rolled, progress: this.#progress.observe(tracked, work, now) };
    } else this.#progress.forget(name);
    this.#metrics?.rollups.inc();
    this.#setMetrics(name, next, degradedReasons);
    if (sameJson(next, current)) {
      this.#retry.delete(name);
      this.#held.delete(name);
      return;
    }
    const due = (this.#lastWriteAt.get(name) ?? -Infinity) + this.#progressIntervalMs;
    if (progressOnly(current, next) && now.getTime() < due) {
      // Its turn comes; the pass then rolls up again, with the progress of that moment.
      this.#held.set(name, due);
      this.#dirty.add(name);
      return;
    }
    this.#held.delete(name);
    // A merge patch replaces lists whole and removes fields set to null. The
    // resourceVersion is a precondition: the server answers 409 when the set
    // changed (or was deleted and created again) since the cache saw it, and
    // the watch event that follows brings the set back for a fresh roll-up.
    const body: Record<string, unknown> = { status: statusPatch(next) };
    if (set.metadata.resourceVersion) body.metadata = { resourceVersion: set.metadata.resourceVersion };
    try {
      await this.#custom.patchClusterCustomObjectStatus(
        { group: GROUP, version: VERSION, plural: PLURAL, name, body, fieldManager: CONTROLLER_FIELD_MANAGER },
        setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
      );
      this.#written.set(name, { uid: set.metadata.uid, status: next });
      this.#lastWriteAt.set(name, now.getTime());
      this.#retry.delete(name);
      this.#metrics?.statusWrites.inc({ result: 'success' });
      // Progress alone is logged at debug: it is written every --progress-interval while a set downloads.
      const fields = { set: name, generation: next.observedGeneration, nodes: next.nodes, ready: next.conditions?.find((c) => c.type === 'Ready')?.status, progress: next.progress?.summary, eta: next.progress?.estimatedCompletionTime };
      if (progressOnly(current, next)) this.#log.debug(fields, 'set progress updated');
      else this.#log.info(fields, 'set status updated');
    } catch (err) {
      const code = (err as { code?: unknown } | null)?.code;
      this.#metrics?.statusWrites.inc({ result: 'error' });
      if (code === 404) {
        this.#log.debug({ set: name }, 'set gone before its status was written');
        return;
      }
      // Back off; an event for the set (the usual answer to a 409) ends the wait.
      const delay = Math.min((this.#retry.get(name) ?? this.#debounceMs) * 2, MAX_RETRY_MS);
      this.#retry.set(name, delay);
      this.#dirty.add(name);
      if (code === 409) this.#log.debug({ set: name, retryInMs: delay }, 'set changed since the cache saw it; will recompute');
      else this.#log.warn({ set: name, err: errorText(err), retryInMs: delay }, 'cannot write set status; will retry');
    }
  }

  /** Reasons last exported per set, so a reason that went away is removed. */
  readonly #exportedReasons = new Map<string, Set<string>>();

  #setMetrics(name: string, status: PinnedImageSetStatus | undefined, reasons: ReadonlyMap<string, number>): void {
    const m = this.#metrics;
    if (!m) return;
    const before = this.#exportedReasons.get(name) ?? new Set<string>();
    if (!status) {
      for (const state of SET_NODE_STATES) m.setNodes.remove({ set: name, state });
      for (const reason of before) m.setDegradedNodes.remove({ set: name, reason });
      this.#exportedReasons.delete(name);
      return;
    }
    const nodes = status.nodes ?? { matched: 0, ready: 0, progressing: 0, degraded: 0 };
    for (const state of SET_NODE_STATES) m.setNodes.set({ set: name, state }, nodes[state] ?? 0);
    for (const reason of before) if (!reasons.has(reason)) m.setDegradedNodes.remove({ set: name, reason });
    for (const [reason, n] of reasons) m.setDegradedNodes.set({ set: name, reason }, n);
    this.#exportedReasons.set(name, new Set(reasons.keys()));
  }

  #countReady(): void {
    if (!this.#metrics) return;
    const counts: Record<string, number> = { True: 0, False: 0, Unknown: 0 };
    for (const set of this.#setInformer.list()) {
      const status = this.#written.get(set.metadata.name)?.status ?? set.status;
      const ready = status?.conditions?.find((c) => c.type === 'Ready')?.status ?? 'Unknown';
      counts[ready] = (counts[ready] ?? 0) + 1;
    }
    for (const [status, n] of Object.entries(counts)) this.#metrics.setsByReady.set({ status }, n);
  }
}
