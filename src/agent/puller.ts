// ImagePuller: pulls through the ImageRuntime with bounded parallelism,
// one attempt per image per reconcile, and per-image retry state (capped
// exponential backoff with jitter, at the pace of the failure's kind).
// Pulls outlive a cancelled reconcile: the next reconcile joins a pull that
// is still wanted and cancels one that is not.
import type { Logger } from 'pino';
import { isRuntimeDown } from '../cri/classify.ts';
import { RuntimeError, type FailureKind, type ImageRuntime, type PullAuth } from '../cri/runtime.ts';
import { backoffDelay, type BackoffPolicy } from '../util/backoff.ts';

/**
 * Each kind retries at its own pace: a registry or runtime that is down
 * comes back soon; an unknown digest or a refused credential needs a person,
 * so it is retried slowly (but retried: the image may be pushed, the secret
 * fixed, without anyone touching the node).
 */
export const RETRY_POLICY: Readonly<Record<FailureKind, BackoffPolicy>> = {
  Unavailable: { baseMs: 1_000, capMs: 60_000 },
  Canceled: { baseMs: 0, capMs: 0 },
  Other: { baseMs: 5_000, capMs: 5 * 60_000 },
  NoSpace: { baseMs: 30_000, capMs: 10 * 60_000 },
  Unauthorized: { baseMs: 30_000, capMs: 10 * 60_000 },
  NotFound: { baseMs: 60_000, capMs: 15 * 60_000 },
};
import type { WantedImage } from './plan.ts';

export interface PullFailure {
  kind: FailureKind;
  /** The runtime's socket could not be reached (not a registry problem). */
  runtimeDown: boolean;
  message: string;
  /** Consecutive failures of this image. */
  failures: number;
  /** When the next attempt is due (ms since epoch). */
  nextAttemptAt: number;
}

/**
 * `download`: the runtime does not show the content, so the pull fetches it.
 * `name`: the runtime shows the content under another name (pulled by tag,
 * or through another digest of the same index): the pull adds the set's
 * reference as a name and downloads no layer. CRI-O pins by stored names, so
 * without it the image is present but not pinned.
 */
export type PullKind = 'download' | 'name';

export interface PullResult {
  key: string;
  kind: PullKind;
  ok: boolean;
  imageRef?: string;
  failure?: PullFailure;
  durationMs: number;
}

export interface ImagePullerOptions {
  runtime: ImageRuntime;
  maxParallel: number;
  logger: Logger;
  /** Credentials for a reference (the registry's only); undefined for anonymous. */
  authFor?: (host: string, path: string) => PullAuth | undefined;
  /** Removes known secrets from text that will be logged or reported. */
  scrub?: (text: string) => string;
  onResult?: (r: PullResult) => void;
  now?: () => number;
  random?: () => number;
}

/** A counting semaphore: at most `limit` holders at once, FIFO. */
class Slots {
  private readonly limit: number;
  private used = 0;
  private readonly waiters: (() => void)[] = [];
  constructor(limit: number) {
    this.limit = Math.max(1, limit);
  }
  /** Take a free slot at once, if there is one (a slot freed while others wait goes to the first of them, never here). */
  tryAcquire(): boolean {
    if (this.used >= this.limit) return false;
    this.used++;
    return true;
  }
  async acquire(signal: AbortSignal): Promise<void> {
    if (this.tryAcquire()) return;
    await new Promise<void>((resolve, reject) => {
      const grant = () => {
        signal.removeEventListener('abort', onAbort);
        resolve();
      };
      const onAbort = () => {
        const i = this.waiters.indexOf(grant);
        if (i >= 0) this.waiters.splice(i, 1);
        reject(signal.reason);
      };
      this.waiters.push(grant);
      signal.addEventListener('abort', onAbort, { once: true });
    });
  }
  /** Hand the slot to the first waiter (it stays used), or free it. */
  release(): void {
    const next = this.waiters.shift();
    if (next) next();
    else this.used--;
  }
}

interface InFlight {
  promise: Promise<PullResult>;
  abort: AbortController;
}

export class ImagePuller {
  private readonly opts: ImagePullerOptions;
  private readonly slots: Slots;
  private readonly failures = new Map<string, PullFailure>();
  private readonly inflight = new Map<string, InFlight>();
  private readonly now: () => number;

  constructor(opts: ImagePullerOptions) {
    this.opts = opts;
    this.slots = new Slots(opts.maxParallel);
    this.now = opts.now ?? Date.now;
  }

  /** The last failure of an image still being retried, if any. */
  failure(key: string): PullFailure | undefined {
    return this.failures.get(key);
  }

  isDue(key: string): boolean {
    const f = this.failures.get(key);
    return !f || this.now() >= f.nextAttemptAt;
  }

  /** Earliest time a failed, still-wanted image is due again. */
  nextAttemptAt(): number | undefined {
    let min: number | undefined;
    for (const f of this.failures.values()) if (min === undefined || f.nextAttemptAt < min) min = f.nextAttemptAt;
    return min;
  }

  /** The image is present: forget its failures. */
  markPresent(key: string): void {
    this.failures.delete(key);
  }

  /** Cancel pulls and forget failures of images no longer wanted. Returns the keys cancelled. */
  retain(wanted: ReadonlySet<string>): string[] {
    const cancelled: string[] = [];
    for (const [key, f] of this.inflight) {
      if (!wanted.has(key)) {
        f.abort.abort(new Error('no longer wanted'));
        cancelled.push(key);
      }
    }
    for (const key of this.failures.keys()) if (!wanted.has(key)) this.failures.delete(key);
    return cancelled;
  }

  /**
   * Give every image that is due one attempt (joining pulls already in
   * flight) and wait for them; `onEach` hears each result as it comes.
   * `signal` stops the waiting, not the pulls.
   */
  async pull(images: readonly WantedImage[], signal: AbortSignal, onEach?: (r: PullResult) => void, kindOf: (key: string) => PullKind = () => 'download'): Promise<PullResult[]> {
    const waits = images
      .filter((w) => this.inflight.has(w.key) || this.isDue(w.key))
      .map((w) =>
        this.start(w, kindOf(w.key)).then((r) => {
          if (!signal.aborted) onEach?.(r);
          return r;
        }),
      );
    const all = Promise.all(waits);
    if (signal.aborted) throw signal.reason;
    return await new Promise<PullResult[]>((resolve, reject) => {
      const onAbort = () => reject(signal.reason);
      signal.addEventListener('abort', onAbort, { once: true });
      all.then(
        (r) => {
          signal.removeEventListener('abort', onAbort);
          resolve(r);
        },
        (e) => {
          signal.removeEventListener('abort', onAbort);
          reject(e);
        },
      );
    });
  }

  /** Record a failure decided without calling the runtime (e.g. the disk is full). */
  fail(key: string, err: RuntimeError): PullFailure {
    return this.recordFailure(key, err);
  }

  /** Cancel everything (shutdown). */
  abortAll(): void {
    for (const f of this.inflight.values()) f.abort.abort(new Error('shutting down'));
  }

  private start(w: WantedImage, kind: PullKind): Promise<PullResult> {
    const existing = this.inflight.get(w.key);
    if (existing) return existing.promise;
    const abort = new AbortController();
    const promise = this.attempt(w, kind, abort.signal).finally(() => this.inflight.delete(w.key));
    this.inflight.set(w.key, { promise, abort });
    return promise;
  }

  private async attempt(w: WantedImage, kind: PullKind, signal: AbortSignal): Promise<PullResult> {
    const { runtime, logger } = this.opts;
    const ref = w.reference.reference;
    // A free slot is taken in the same turn: the first pulls of a batch reach
    // the runtime before pull() returns, not after whatever its caller does next.
    if (!this.slots.tryAcquire()) {
      try {
        await this.slots.acquire(signal);
      } catch {
        return { key: w.key, kind, ok: false, durationMs: 0, failure: this.recordFailure(w.key, new RuntimeError('Canceled', 'pull cancelled: no longer wanted')) };
      }
    }
    // Made once the pull has its slot: the pulls of a large set all wait for one at once.
    const log = logger.child({ image: ref, kind, ...(w.runtimeHandler ? { runtimeHandler: w.runtimeHandler } : {}) });
    const started = this.now();
    try {
      const auth = this.opts.authFor?.(w.reference.host, w.reference.path);
      // Every line carries `kind`: a name-only pull fetches a manifest, not layers.
      log.info({ authenticated: auth !== undefined }, 'pulling image');
      const imageRef = await runtime.pullImage(ref, { runtimeHandler: w.runtimeHandler || undefined, auth, signal });
      const r: PullResult = { key: w.key, kind, ok: true, imageRef, durationMs: this.now() - started };
      this.failures.delete(w.key);
      log.info({ imageRef, durationMs: r.durationMs }, 'pulled image');
      this.opts.onResult?.(r);
      return r;
    } catch (e) {
      // Once the pull was cancelled, whatever the runtime answers is the cancellation
      // (an in-process runtime may reject with the signal's reason, not gRPC CANCELLED).
      const err = signal.aborted
        ? new RuntimeError('Canceled', `pull cancelled: ${(e as Error)?.message ?? String(e)}`)
        : e instanceof RuntimeError
          ? e
          : new RuntimeError('Other', (e as Error).message);
      const failure = this.recordFailure(w.key, err);
      const r: PullResult = { key: w.key, kind, ok: false, failure, durationMs: this.now() - started };
      if (err.kind === 'Canceled') log.info('pull cancelled: the image is no longer wanted');
      else log.warn({ kind: failure.kind, failures: failure.failures, retryInMs: failure.nextAttemptAt - this.now(), err: failure.message }, 'pull failed');
      this.opts.onResult?.(r);
      return r;
    } finally {
      this.slots.release();
    }
  }

  private recordFailure(key: string, err: RuntimeError): PullFailure {
    const prev = this.failures.get(key);
    const failures = (prev?.failures ?? 0) + 1;
    const delay = backoffDelay(RETRY_POLICY[err.kind], failures, this.opts.random);
    const message = (this.opts.scrub ?? ((s: string) => s))(err.message);
    const f: PullFailure = { kind: err.kind, runtimeDown: isRuntimeDown(err), message, failures, nextAttemptAt: this.now() + delay };
    if (err.kind === 'Canceled') this.failures.delete(key);
    else this.failures.set(key, f);
    return f;
  }
}
