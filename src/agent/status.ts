// Per-set status on this node: phases and counts from one reconcile's
// facts (a pure function), the bounded NodeStatus document, and the
// reporter that writes it to the Node annotation only when it changes: a
// change of phase at once, progress (counts, messages) at a pace.
import type { Logger } from 'pino';
import { encodedSize, failureText } from '../api/node-status.ts';
import {
  STATUS_FORMAT_VERSION,
  STATUS_MAX_BYTES,
  STATUS_MAX_ERROR_BYTES,
  STATUS_MAX_MESSAGE_BYTES,
  type NodeSetStatus,
  type NodeStatus,
  type SetPhase,
} from '../api/types.ts';
import type { FailureKind } from '../cri/runtime.ts';
import type { DropinPins } from '../crio/pinfile.ts';
import type { SlotWait } from '../rollout/gate.ts';
import { sameJson } from '../util/json.ts';
import { Backoff } from '../util/backoff.ts';
import type { Plan, PlannedSet, WantedImage } from './plan.ts';
import { wantedKey } from './plan.ts';
import type { SetEstimate } from './estimate.ts';
import type { PullFailure } from './puller.ts';

/** What this node remembers per set across reconciles (and restarts, via the annotation). */
export interface SetHistory {
  currentGeneration: number;
  lastFailedGeneration?: number;
  lastFailedGenerationError?: string;
}

export interface StatusFacts {
  plan: Plan;
  /** Pins the agent's file holds on disk after this reconcile. */
  pinsInFile: ReadonlySet<string>;
  /** Whether the runtime holds an image (for its handler). */
  present: (w: WantedImage) => boolean;
  /** The runtime's pinned flag; undefined when the runtime does not report pins. */
  pinnedByRuntime: (w: WantedImage) => boolean | undefined;
  failure: (key: string) => PullFailure | undefined;
  /** The runtime could not be asked what it holds. */
  runtimeError?: string;
  /** The pin file could not be written. */
  writeError?: string;
  /**
   * Why pins in the file are not (yet) in effect in CRI-O: the reload failed
   * (ReloadFailed), ended without CRI-O applying it (ReloadNotApplied), or
   * CRI-O would refuse a file in its folder (CrioConfigRejected). It makes a
   * set Degraded when it holds one of the `affected` references; with
   * `affectsAll`, every set (CRI-O may not even run with that file).
   */
  pinProblem?: PinProblem;
  overriding: readonly DropinPins[];
  pinFile: string;
  history: ReadonlyMap<string, SetHistory>;
  /** Per set key: the disk estimate of its images still to download (see ./estimate.ts). */
  estimates?: ReadonlyMap<string, SetEstimate>;
  /** Per set key: the set's downloads wait for a rollout slot (spec.rollout.maxConcurrentNodes, src/rollout/gate.ts). */
  rolloutWaits?: ReadonlyMap<string, SlotWait>;
  /** Per set key: the set downloads without a rollout slot because this node may not hold one, and why. */
  rolloutUnenforced?: ReadonlyMap<string, string>;
}

export interface PinProblem {
  reason: 'ReloadFailed' | 'ReloadNotApplied' | 'CrioConfigRejected';
  message: string;
  /** References whose pin is not in effect because of it. */
  affected: (ref: string) => boolean;
  affectsAll?: boolean;
}

const PULL_REASON: Record<FailureKind, string> = {
  NotFound: 'ImageNotFound',
  Unauthorized: 'Unauthorized',
  Unavailable: 'RegistryUnavailable',
  NoSpace: 'NoSpace',
  Canceled: 'Pulling',
  Other: 'PullFailed',
};
/** Which failure names the set's reason when several images fail differently. */
const PULL_SEVERITY: FailureKind[] = ['NoSpace', 'Unauthorized', 'NotFound', 'Other', 'Unavailable', 'Canceled'];

/** " (and 2 more problems)": a count, not a list, keeps messages short. */
function more(n: number, one: string, many: string): string {
  return n > 1 ? ` (and ${n - 1} more ${n - 1 === 1 ? one : many})` : '';
}

/** Cut to at most `max` bytes of UTF-8 without splitting a character. */
export function cutBytes(s: string, max: number): string {
  const b = Buffer.from(s, 'utf8');
  if (b.length <= max) return s;
  let end = max - 3;
  while (end > 0 && (b[end]! & 0xc0) === 0x80) end--;
  return b.subarray(0, end).toString('utf8') + '...';
}

function pullMessage(w: WantedImage, f: PullFailure, handler: string): { reason: string; message: string } {
  const ref = w.reference.reference;
  const host = w.reference.host;
  if (f.runtimeDown) return { reason: 'RuntimeUnavailable', message: `the container runtime could not be reached while pulling ${ref}: ${f.message}` };
  if (handler && /runtime.?handler|runtime.?class|handler/i.test(f.message)) {
    return { reason: 'RuntimeHandlerRejected', message: `the runtime rejected runtimeHandler ${JSON.stringify(handler)} for ${ref}: ${f.message}` };
  }
  switch (f.kind) {
    case 'Unauthorized':
      return { reason: 'Unauthorized', message: `registry ${host} refused the credentials for ${ref} (check the entry for ${host} in the auth file): ${f.message}` };
    case 'NotFound':
      return { reason: 'ImageNotFound', message: `registry ${host} has no image ${ref}: ${f.message}` };
    case 'Unavailable':
      return { reason: 'RegistryUnavailable', message: `registry ${host} could not be reached for ${ref}: ${f.message}` };
    case 'NoSpace':
      return { reason: 'NoSpace', message: `no space left on the image filesystem while pulling ${ref}: ${f.message}` };
    default:
      return { reason: PULL_REASON[f.kind], message: `pulling ${ref} failed: ${f.message}` };
  }
}

function phaseOf(s: PlannedSet, facts: StatusFacts, wanted: Map<string, WantedImage>): { phase: SetPhase; reason: string; message?: string; counts: NodeSetStatus['images'] } {
  const counts = { wanted: s.references.length, present: 0, pinned: 0, failed: 0, invalid: s.invalidImages.length };
  if (s.specErrors.length > 0) {
    return { phase: 'Degraded', reason: 'InvalidSpec', message: `set ${s.name} (${s.origin}) is not applied: ${s.specErrors[0]}${more(s.specErrors.length, 'problem', 'problems')}`, counts };
  }
  if (s.selection === 'unknown') {
    return { phase: 'Progressing', reason: 'WaitingForNodeLabels', message: 'the node labels are not known yet, so the node selector cannot be evaluated', counts };
  }
  const failures: { w: WantedImage; f: PullFailure }[] = [];
  let notPinned = 0;
  // Ready means present and in the pin file: an image outside the file is not pinned.
  let notInFile = 0;
  for (const r of s.references) {
    const w = wanted.get(wantedKey(r.reference, s.runtimeHandler));
    if (!w) continue;
    const present = facts.runtimeError === undefined && facts.present(w);
    if (present) counts.present++;
    const inFile = facts.pinsInFile.has(r.reference);
    const reported = facts.pinnedByRuntime(w);
    if (inFile && (reported === undefined || reported || !present)) counts.pinned++;
    if (inFile && present && reported === false) notPinned++;
    if (present && !inFile) notInFile++;
    const f = present ? undefined : facts.failure(w.key);
    if (f && f.kind !== 'Canceled') {
      counts.failed++;
      failures.push({ w, f });
    }
  }
  if (facts.overriding.length > 0) {
    const file = facts.overriding[0]!.file;
    const others = more(facts.overriding.length, 'file', 'files');
    return {
      phase: 'Degraded',
      reason: 'PinsOverridden',
      message: `${file}${others} sets pinned_images and sorts after ${facts.pinFile}; CRI-O keeps only the last list, so no pin of this set is in effect. Remove pinned_images there (pins in files that sort before ${facts.pinFile} are carried over)`,
      counts,
    };
  }
  if (s.held) {
    return {
      phase: 'Degraded',
      reason: 'StaticFileUnreadable',
      message: `static file ${s.held.file} cannot be read (${s.held.error}); set ${s.name} keeps the pins of the file's last readable content until the file is readable again or removed from the folder`,
      counts,
    };
  }
  // A write that fails leaves the previous file in place: only sets with references it lacks are held up.
  if (facts.writeError && s.references.some((r) => !facts.pinsInFile.has(r.reference))) {
    return { phase: 'Degraded', reason: 'PinFileWriteFailed', message: `the pin file ${facts.pinFile} could not be written: ${facts.writeError}`, counts };
  }
  const pp = facts.pinProblem;
  if (pp && (pp.affectsAll || s.references.some((r) => pp.affected(r.reference)))) return { phase: 'Degraded', reason: pp.reason, message: pp.message, counts };
  if (facts.runtimeError) return { phase: 'Degraded', reason: 'RuntimeUnavailable', message: `the container runtime could not be reached: ${facts.runtimeError}`, counts };
  if (counts.invalid > 0) {
    const p = s.invalidImages[0]!;
    return { phase: 'Degraded', reason: 'InvalidReference', message: `${counts.invalid} reference(s) rejected and not pinned, first ${p.field}: ${p.error}`, counts };
  }
  if (failures.length > 0) {
    failures.sort((a, b) => PULL_SEVERITY.indexOf(a.f.kind) - PULL_SEVERITY.indexOf(b.f.kind));
    const { w, f } = failures[0]!;
    const m = pullMessage(w, f, s.runtimeHandler);
    const tail = failures.length > 1 ? ` (${failures.length} of ${counts.wanted} images failing; retrying)` : ' (retrying)';
    return { phase: 'Degraded', reason: m.reason, message: m.message + tail, counts };
  }
  if (counts.present < counts.wanted) {
    const wait = facts.rolloutWaits?.get(s.key);
    if (wait) {
      const why = wait.error
        ? `the rollout slots cannot be taken (retrying): ${wait.error}`
        : `waiting for a rollout slot: at most ${wait.maxConcurrentNodes} node(s) download this set at a time`;
      return { phase: 'Progressing', reason: 'WaitingForRolloutSlot', message: `${why}; ${counts.present} of ${counts.wanted} images present`, counts };
    }
    const unknown = facts.estimates?.get(s.key)?.unknown;
    const unenforced = facts.rolloutUnenforced?.get(s.key);
    const note =
      (unenforced ? `; downloading without a rollout slot, this node may not hold one: ${unenforced}` : '') +
      (unknown ? `; size estimate unknown, so only the watermark was checked: ${unknown}` : '');
    return { phase: 'Progressing', reason: 'Pulling', message: `${counts.present} of ${counts.wanted} images present${note}`, counts };
  }
  if (notInFile > 0) {
    return { phase: 'Progressing', reason: 'WaitingForPin', message: `${notInFile} image(s) are present but not yet in the pin file ${facts.pinFile}`, counts };
  }
  if (notPinned > 0) {
    return { phase: 'Progressing', reason: 'WaitingForPin', message: `${notPinned} image(s) are in the pin file but not yet reported pinned by the runtime`, counts };
  }
  return { phase: 'Ready', reason: 'AllImagesPinned', counts };
}

/**
 * Status of every set that selects this node (or might: labels unknown),
 * and the updated history. Pure.
 */
export function computeSetStatuses(facts: StatusFacts): { sets: NodeSetStatus[]; history: Map<string, SetHistory> } {
  const wanted = new Map(facts.plan.wanted.map((w) => [w.key, w]));
  const history = new Map<string, SetHistory>();
  const sets: NodeSetStatus[] = [];
  for (const s of facts.plan.sets) {
    if (s.selection === 'not-selected' && s.specErrors.length === 0) continue;
    const { phase, reason, message: fullMessage, counts } = phaseOf(s, facts, wanted);
    const message = fullMessage === undefined ? undefined : cutBytes(fullMessage, STATUS_MAX_MESSAGE_BYTES);
    const estimated = phase === 'Ready' ? undefined : facts.estimates?.get(s.key)?.bytes;
    const prev = facts.history.get(s.key) ?? { currentGeneration: 0 };
    const h: SetHistory = { ...prev };
    if (phase === 'Ready') h.currentGeneration = s.generation;
    if (phase === 'Degraded') {
      h.lastFailedGeneration = s.generation;
      h.lastFailedGenerationError = cutBytes(failureText(reason, message), STATUS_MAX_ERROR_BYTES);
    }
    history.set(s.key, h);
    const st: NodeSetStatus = {
      name: s.name,
      ...(s.uid ? { uid: s.uid } : {}),
      source: s.source,
      desiredGeneration: s.generation,
      currentGeneration: h.currentGeneration,
      ...(h.lastFailedGeneration !== undefined ? { lastFailedGeneration: h.lastFailedGeneration, lastFailedGenerationError: h.lastFailedGenerationError } : {}),
      images: counts,
      ...(estimated !== undefined ? { estimatedBytes: estimated } : {}),
      phase,
      reason,
      ...(message ? { message } : {}),
    };
    sets.push(st);
  }
  sets.sort((a, b) => (a.source + a.name < b.source + b.name ? -1 : 1));
  return { sets, history };
}

/** Messages are cut to this when the whole document would not fit. */
const SHORT_MESSAGE_BYTES = 160;

function shortened(s: NodeSetStatus): NodeSetStatus {
  const message = s.message === undefined ? undefined : cutBytes(s.message, SHORT_MESSAGE_BYTES);
  let error = s.lastFailedGenerationError;
  // A set failing now carries its error as its message (version 2 writes it once): keep them one.
  if (error !== undefined) error = error === failureText(s.reason, s.message) ? failureText(s.reason, message) : cutBytes(error, SHORT_MESSAGE_BYTES);
  return { ...s, ...(message !== undefined ? { message } : {}), ...(error !== undefined ? { lastFailedGenerationError: error } : {}) };
}

/**
 * The annotation document, cut to `maxBytes` as written (version 2):
 * messages first, then whole sets (Degraded ones kept first, then
 * Progressing, then Ready).
 */
export function boundedNodeStatus(status: NodeStatus, maxBytes = STATUS_MAX_BYTES): NodeStatus {
  const size = encodedSize;
  if (size(status) <= maxBytes) return status;
  const short: NodeStatus = {
    ...status,
    sets: status.sets.map(shortened),
    ...(status.imageFilesystemError ? { imageFilesystemError: cutBytes(status.imageFilesystemError, SHORT_MESSAGE_BYTES) } : {}),
  };
  if (size(short) <= maxBytes) return short;
  // Keep the sets an operator must look at: Degraded, then Progressing, then Ready.
  const order: Record<SetPhase, number> = { Degraded: 0, Progressing: 1, Ready: 2 };
  const ranked = [...short.sets].sort((a, b) => order[a.phase] - order[b.phase]);
  const kept: NodeSetStatus[] = [];
  const out: NodeStatus = { ...short, sets: kept, truncated: true };
  for (const s of ranked) {
    kept.push(s);
    if (size(out) > maxBytes) {
      kept.pop();
      break;
    }
  }
  return out;
}

/** History as remembered in a previous annotation (so a restart keeps currentGeneration). */
export function historyFromStatus(status: NodeStatus | null): Map<string, SetHistory> {
  const h = new Map<string, SetHistory>();
  for (const s of status?.sets ?? []) {
    h.set(`${s.source}/${s.name}`, {
      currentGeneration: s.currentGeneration ?? 0,
      ...(s.lastFailedGeneration !== undefined ? { lastFailedGeneration: s.lastFailedGeneration, lastFailedGenerationError: s.lastFailedGenerationError } : {}),
    });
  }
  return h;
}

export function makeNodeStatus(node: string, pinFile: string, sets: NodeSetStatus[], updatedAt: string, extra: { imageFilesystemError?: string | null } = {}): NodeStatus {
  const status: NodeStatus = { version: STATUS_FORMAT_VERSION, node, pinFile, updatedAt, sets };
  if (extra.imageFilesystemError) status.imageFilesystemError = cutBytes(extra.imageFilesystemError, STATUS_MAX_ERROR_BYTES);
  return boundedNodeStatus(status);
}

// ---------------------------------------------------------------------------

export interface StatusSink {
  write(status: NodeStatus): Promise<void>;
}

/** Only logs (no API configured, e.g. static sets on a bootstrap host). */
export class LogStatusSink implements StatusSink {
  private readonly log: Logger;
  constructor(log: Logger) {
    this.log = log;
  }
  async write(status: NodeStatus): Promise<void> {
    this.log.info({ status }, 'node status');
  }
}

/** Same content, whatever the time stamp, the format version read and key order. */
function sameContent(a: NodeStatus | undefined, b: NodeStatus | undefined): boolean {
  if (!a || !b) return a === b;
  return sameJson(comparable(a), comparable(b));
}

function comparable(s: NodeStatus): unknown {
  const { updatedAt: _t, version: _v, node: _n, ...rest } = s;
  return rest;
}

/**
 * True when `next` differs from `prev` in progress only: the same sets, each
 * in the same phase and generations, with other counts, messages or
 * estimates, or a Progressing set with another reason (Pulling after
 * WaitingForRolloutSlot). Anything else is news an operator and the
 * controller wait for: a set added or gone, a phase or a generation
 * changed, a Degraded set failing for another reason, or with another
 * error while its counts stand still (the cause changed, not the progress).
 */
export function progressOnly(prev: NodeStatus | undefined, next: NodeStatus): boolean {
  if (!prev || prev.pinFile !== next.pinFile || prev.imageFilesystemError !== next.imageFilesystemError) return false;
  if (Boolean(prev.truncated) !== Boolean(next.truncated) || prev.sets.length !== next.sets.length) return false;
  const key = (s: NodeSetStatus) => `${s.source}/${s.name}`;
  const before = new Map(prev.sets.map((s) => [key(s), s]));
  return next.sets.every((n) => {
    const p = before.get(key(n));
    if (
      p === undefined ||
      p.uid !== n.uid ||
      p.phase !== n.phase ||
      p.desiredGeneration !== n.desiredGeneration ||
      p.currentGeneration !== n.currentGeneration ||
      p.lastFailedGeneration !== n.lastFailedGeneration
    ) {
      return false;
    }
    if (n.phase !== 'Degraded') return true;
    return p.reason === n.reason && (p.message === n.message || !sameJson(p.images, n.images));
  });
}

/** The first progress-only write waits this long after the last write; each next one twice as long, up to the cap. */
export const PROGRESS_WRITE_INTERVAL_MS = 60_000;
/** The kubelet reports an unchanged Node status every 5 minutes (nodeStatusReportFrequency): never more often than that for progress alone. */
export const PROGRESS_WRITE_INTERVAL_CAP_MS = 5 * 60_000;

/**
 * Writes a NodeStatus when its content changed. A change of phase (or of
 * the sets or generations) is written at once; a change of progress alone
 * (counts, reasons, messages) waits `progressIntervalMs` after the last
 * write, and each further one in a row twice as long up to
 * `progressIntervalCapMs` (the latest content wins). So a set rollout
 * costs 2 writes when it takes under a minute (Progressing, Ready), 3 under
 * three minutes, and after that one more per 5 minutes at most: every Node
 * write reaches every Node watcher in the cluster. A failed write is
 * retried with backoff; the newest content is what lands.
 */
export class StatusReporter {
  private readonly sink: StatusSink;
  private readonly progressIntervalMs: number;
  private readonly progressIntervalCapMs: number;
  private readonly log: Logger;
  private readonly now: () => number;
  private lastWritten: NodeStatus | undefined;
  private lastWriteAt = -Infinity;
  /** Wait before the next progress-only write, counted from the last write. */
  private progressWait: number;
  private pending: NodeStatus | undefined;
  private timer: NodeJS.Timeout | undefined;
  private writing: Promise<void> | undefined;
  /** The timer is a failed write's backoff: news does not jump it. */
  private retrying = false;
  private readonly backoff = new Backoff({ baseMs: 1_000, capMs: 60_000 });
  writes = 0;

  constructor(
    sink: StatusSink,
    opts: { progressIntervalMs?: number; progressIntervalCapMs?: number; logger: Logger; now?: () => number; initial?: NodeStatus | null },
  ) {
    this.sink = sink;
    this.progressIntervalMs = opts.progressIntervalMs ?? PROGRESS_WRITE_INTERVAL_MS;
    this.progressIntervalCapMs = Math.max(this.progressIntervalMs, opts.progressIntervalCapMs ?? PROGRESS_WRITE_INTERVAL_CAP_MS);
    this.progressWait = this.progressIntervalMs;
    this.log = opts.logger;
    this.now = opts.now ?? Date.now;
    if (opts.initial) this.lastWritten = opts.initial;
  }

  /** How long `status` waits before it may be written (0: at once). */
  private delayFor(status: NodeStatus): number {
    if (!progressOnly(this.lastWritten, status)) return 0;
    return Math.max(0, this.lastWriteAt + this.progressWait - this.now());
  }

  /** What is already on the Node (read at start): identical content is not written again. */
  seed(existing: NodeStatus | null): void {
    if (existing && this.lastWritten === undefined && !this.pending) this.lastWritten = existing;
  }

  /** True when this content differs from what was last written (or queued). */
  changed(status: NodeStatus): boolean {
    return !sameContent(status, this.pending ?? this.lastWritten);
  }

  report(status: NodeStatus): void {
    if (!this.changed(status)) return;
    if (sameContent(status, this.lastWritten)) {
      // Back to what is already written: nothing to send.
      this.pending = undefined;
      clearTimeout(this.timer);
      this.timer = undefined;
      return;
    }
    this.pending = status;
    const delay = this.delayFor(status);
    // News goes out now, even when progress was waiting for its turn.
    if (delay === 0 && this.timer && !this.retrying) {
      clearTimeout(this.timer);
      this.timer = undefined;
    }
    this.schedule(delay);
  }

  private schedule(delay: number): void {
    if (this.timer || this.writing) return;
    if (delay <= 0) {
      void this.flushPending();
      return;
    }
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.retrying = false;
      void this.flushPending();
    }, delay);
    this.timer.unref?.();
  }

  private async flushPending(): Promise<void> {
    const status = this.pending;
    if (!status) return;
    this.pending = undefined;
    const paced = progressOnly(this.lastWritten, status);
    this.writing = (async () => {
      try {
        await this.sink.write(status);
        this.lastWritten = status;
        this.lastWriteAt = this.now();
        this.writes++;
        this.backoff.reset();
        this.progressWait = paced ? Math.min(this.progressIntervalCapMs, this.progressWait * 2) : this.progressIntervalMs;
      } catch (e) {
        const delay = this.backoff.fail();
        this.log.warn({ err: (e as Error).message?.slice(0, 300), retryInMs: delay }, 'status write failed; retrying');
        this.pending ??= status;
        this.writing = undefined;
        this.retrying = true;
        this.schedule(delay);
        return;
      }
      this.writing = undefined;
      // Content that arrived during the write goes out at its own pace.
      const next = this.pending as NodeStatus | undefined;
      if (next) this.schedule(this.delayFor(next));
    })();
    await this.writing;
  }

  /** Write whatever is pending now (shutdown, --once). */
  async flush(): Promise<void> {
    clearTimeout(this.timer);
    this.timer = undefined;
    this.retrying = false;
    if (this.writing) await this.writing;
    await this.flushPending();
  }

  close(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }
}
