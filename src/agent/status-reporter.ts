// The reporter that writes a NodeStatus to the Node annotation only when
// it changes: a change of phase at once, progress (counts, messages) at a
// pace, a failed write retried with backoff.
import type { Logger } from 'pino';
import { DOWNLOAD_WAIT_REASONS } from '../api/reasons.ts';
import type { NodeSetStatus, NodeStatus } from '../api/types.ts';
import { Backoff } from '../util/backoff.ts';
import { sameJson } from '../util/json.ts';

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
 * in the same phase and generations, with other counts, bytes, rates,
 * messages or estimates, or a Progressing set with another reason
 * (WaitingForPin after Pulling), or another non-zero pin count. Anything
 * else is news an operator and the controller wait for: a set added or
 * gone, a phase or a generation changed, a set that starts downloading (a
 * Progressing set leaving a reason under which it downloads nothing, such
 * as WaitingForRolloutSlot: the controller's ETA counts the node as
 * downloading from then on; one write per node per rollout), a Degraded
 * set failing for another reason, or with another error while its counts
 * stand still (the cause changed, not the progress), the pin count
 * reaching or leaving 0, pins kept for another reason.
 */
export function progressOnly(prev: NodeStatus | undefined, next: NodeStatus): boolean {
  if (!prev || prev.pinFile !== next.pinFile || prev.imageFilesystemError !== next.imageFilesystemError || prev.cannotPin !== next.cannotPin || JSON.stringify(prev.runtime) !== JSON.stringify(next.runtime)) return false;
  // The pin count is progress while it grows on a pulling node; reaching 0
  // (or becoming known) is news: `pinset uninstall` waits for it.
  if ((prev.pins === 0) !== (next.pins === 0) || (prev.pins === undefined) !== (next.pins === undefined) || prev.pinsKept !== next.pinsKept) return false;
  if (!sameJson(prev.kubeletVerification, next.kubeletVerification)) return false;
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
    if (n.phase === 'Progressing') return !(DOWNLOAD_WAIT_REASONS.has(p.reason) && !DOWNLOAD_WAIT_REASONS.has(n.reason));
    if (n.phase !== 'Degraded') return true;
    return p.reason === n.reason && (p.message === n.message || !sameJson(p.images, n.images));
  });
}

/** The first progress-only write waits this long after the last write; each next one twice as long, up to the cap. */
export const PROGRESS_WRITE_INTERVAL_MS = 60_000;
/**
 * The cap is this many times the first wait: 5 minutes by default, as the
 * kubelet reports an unchanged Node status every 5 minutes
 * (nodeStatusReportFrequency), never more often than that for progress
 * alone. A shorter first wait (--status-progress-interval) shrinks the cap
 * alike, so a rollout shrunk in time is reported at the same rhythm.
 */
export const PROGRESS_WRITE_CAP_FACTOR = 5;
/** The cap with the default first wait. */
export const PROGRESS_WRITE_INTERVAL_CAP_MS = PROGRESS_WRITE_CAP_FACTOR * PROGRESS_WRITE_INTERVAL_MS;

/**
 * Writes a NodeStatus when its content changed. A change of phase (or of
 * the sets or generations, or a set starting to download) is written at
 * once; a change of progress alone (counts, bytes, reasons, messages) waits
 * `progressIntervalMs` after the last write, and each further one in a row
 * twice as long up to `progressIntervalCapMs` (5 x the first wait unless
 * given; the latest content wins). So a set rollout costs 2 writes when it
 * takes under a minute (Progressing, Ready), 3 under three minutes, and
 * after that one more per 5 minutes at most (one more when the set first
 * waited for a rollout slot): every Node write reaches every Node watcher
 * in the cluster. A failed write is retried with backoff; the newest
 * content is what lands.
 */
export class StatusReporter {
  private readonly sink: StatusSink;
  /** The first wait of a progress-only write. */
  readonly progressIntervalMs: number;
  private readonly progressIntervalCapMs: number;
  private readonly log: Logger;
  private readonly now: () => number;
  private lastWritten: NodeStatus | undefined;
  /** What a write in flight carries: what the Node holds once it lands. */
  private inFlight: NodeStatus | undefined;
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
    this.progressIntervalCapMs = Math.max(this.progressIntervalMs, opts.progressIntervalCapMs ?? PROGRESS_WRITE_CAP_FACTOR * this.progressIntervalMs);
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

  /** What the Node holds once the write in flight, if any, lands. */
  private landing(): NodeStatus | undefined {
    return this.inFlight ?? this.lastWritten;
  }

  /** True when this content differs from what was last written (or is being written, or queued). */
  changed(status: NodeStatus): boolean {
    return !sameContent(status, this.pending ?? this.landing());
  }

  report(status: NodeStatus): void {
    if (!this.changed(status)) return;
    // Compared with what the Node will hold, not what it held: content that
    // goes back to the last write while another is in flight (a drop-in read
    // half-written, then whole) must follow that write, or the Node keeps the
    // in-flight content until something else changes.
    if (sameContent(status, this.landing())) {
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
    this.inFlight = status;
    this.writing = (async () => {
      try {
        await this.sink.write(status);
        this.inFlight = undefined;
        this.lastWritten = status;
        this.lastWriteAt = this.now();
        this.writes++;
        this.backoff.reset();
        this.progressWait = paced ? Math.min(this.progressIntervalCapMs, this.progressWait * 2) : this.progressIntervalMs;
      } catch (e) {
        const delay = this.backoff.fail();
        this.log.warn({ err: (e as Error).message?.slice(0, 300), retryInMs: delay }, 'status write failed; retrying');
        this.inFlight = undefined;
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
