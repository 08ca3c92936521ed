// ImagePuller: pulls through the ImageRuntime with bounded parallelism,
// one attempt per image per reconcile, and per-image retry state (capped
// exponential backoff with jitter, at the pace of the failure's kind).
// An attempt tries each credential the credential source gives for the
// image, in its order, until a pull succeeds, as the kubelet's PullImage
// does (any error moves to the next); with none it pulls anonymously.
// Pulls outlive a cancelled reconcile: the next reconcile joins a pull that
// is still wanted and cancels one that is not.
import type { Logger } from 'pino';
import { isRuntimeDown } from '../cri/classify.ts';
import { RuntimeError, type FailureKind, type ImageRuntime } from '../cri/runtime.ts';
import type { Credential, CredentialSource } from '../registry/credentials.ts';
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
  /** A credential source that failed for this image (a credential provider plugin), when the pull then failed. */
  credentialFailure?: string;
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
  /** Not started: what let it through was withdrawn before it reached the runtime (a rollout slot lost); no failure, nothing to retry later. */
  heldBack?: true;
}

/** How ImagePuller.pull goes about a batch. */
export interface PullHow {
  /** Hears each result as it comes. */
  onEach?: (r: PullResult) => void;
  /** What a pull of the image does (default: download). */
  kindOf?: (key: string) => PullKind;
  /** Asked for each image when its turn comes (after the wait for a parallel pull): false holds it back (heldBack), the runtime never asked. */
  mayStart?: (key: string) => boolean;
  /** By key, a lane: the pulls of one lane run one at a time, in the order of the batch (behind those of the lane already under way), each taking one of the parallel pulls only when its turn comes. */
  oneAtATime?: ReadonlyMap<string, string>;
}

export interface ImagePullerOptions {
  runtime: ImageRuntime;
  maxParallel: number;
  logger: Logger;
  /** The credentials to try for each image (none: anonymous); their scrub() cleans every message. */
  credentials?: CredentialSource;
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
  /** Nothing holds a slot or waits for one. */
  get idle(): boolean {
    return this.used === 0 && this.waiters.length === 0;
  }
}

interface InFlight {
  promise: Promise<PullResult>;
  abort: AbortController;
}

export class ImagePuller {
  private readonly opts: ImagePullerOptions;
  private readonly slots: Slots;
  /** By name, pulls that go one at a time, in the order they were asked for (a first wave's fetches); dropped when idle. */
  private readonly lanes = new Map<string, Slots>();
  private readonly failures = new Map<string, PullFailure>();
  private readonly inflight = new Map<string, InFlight>();
  private readonly now: () => number;

  constructor(opts: ImagePullerOptions) {
    this.opts = opts;
    this.slots = new Slots(opts.maxParallel);
    this.now = opts.now ?? Date.now;
  }

  /** A pull of the image runs now (from its start until it lands or fails). */
  pulling(key: string): boolean {
    return this.inflight.has(key);
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

  /** Make the failed images among `keys` due now (their credentials changed). */
  retryNow(keys: Iterable<string>): void {
    const now = this.now();
    for (const k of keys) {
      const f = this.failures.get(k);
      if (f) f.nextAttemptAt = Math.min(f.nextAttemptAt, now);
    }
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
   * `signal` stops the waiting, not the pulls; `how` says the rest.
   */
  async pull(images: readonly WantedImage[], signal: AbortSignal, how: PullHow = {}): Promise<PullResult[]> {
    const { onEach, kindOf = () => 'download', mayStart, oneAtATime } = how;
    const waits = images
      .filter((w) => this.inflight.has(w.key) || this.isDue(w.key))
      .map((w) =>
        this.start(w, kindOf(w.key), mayStart, oneAtATime?.get(w.key)).then((r) => {
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

  private start(w: WantedImage, kind: PullKind, mayStart?: (key: string) => boolean, lane?: string): Promise<PullResult> {
    const existing = this.inflight.get(w.key);
    if (existing) return existing.promise;
    const abort = new AbortController();
    const promise = this.inLane(w, kind, lane, abort.signal, () => this.attempt(w, kind, abort.signal, mayStart)).finally(() => this.inflight.delete(w.key));
    this.inflight.set(w.key, { promise, abort });
    return promise;
  }

  /**
   * Run `attempt` when the lane's turn comes (at once without a lane). The
   * lane is taken before a parallel pull, so a pull waiting for its lane
   * holds none of them; cancelled while waiting, it is never attempted.
   */
  private async inLane(w: WantedImage, kind: PullKind, name: string | undefined, signal: AbortSignal, attempt: () => Promise<PullResult>): Promise<PullResult> {
    if (name === undefined) return await attempt();
    let lane = this.lanes.get(name);
    if (!lane) this.lanes.set(name, (lane = new Slots(1)));
    const held = lane.tryAcquire() || (await lane.acquire(signal).then(() => true, () => false));
    try {
      return held ? await attempt() : this.cancelledWaiting(w, kind);
    } finally {
      if (held) lane.release();
      if (lane.idle) this.lanes.delete(name);
    }
  }

  private cancelledWaiting(w: WantedImage, kind: PullKind): PullResult {
    return { key: w.key, kind, ok: false, durationMs: 0, failure: this.recordFailure(w.key, new RuntimeError('Canceled', 'pull cancelled: no longer wanted')) };
  }

  private async attempt(w: WantedImage, kind: PullKind, signal: AbortSignal, mayStart?: (key: string) => boolean): Promise<PullResult> {
    const { logger } = this.opts;
    const ref = w.reference.reference;
    // A free slot is taken in the same turn: the first pulls of a batch reach
    // the runtime before pull() returns, not after whatever its caller does next.
    if (!this.slots.tryAcquire()) {
      try {
        await this.slots.acquire(signal);
      } catch {
        return this.cancelledWaiting(w, kind);
      }
    }
    if (mayStart && !mayStart(w.key)) {
      this.slots.release();
      this.opts.logger.info({ image: ref, kind }, 'pull not started: the rollout slot that let it through was lost; it waits for a slot again');
      return { key: w.key, kind, ok: false, heldBack: true, durationMs: 0 };
    }
    // Made once the pull has its slot: the pulls of a large set all wait for one at once.
    const log = logger.child({ image: ref, kind, ...(w.runtimeHandler ? { runtimeHandler: w.runtimeHandler } : {}) });
    const started = this.now();
    let credentialFailure: string | undefined;
    try {
      const { host, path, digest } = w.reference;
      const found = (await this.opts.credentials?.credentialsFor({ host, path, origin: { repository: `${host}/${path}`, digest } }, signal)) ?? { candidates: [], failures: [] };
      credentialFailure = found.failures[0] && `${found.failures[0].message}${found.failures.length > 1 ? ` (and ${found.failures.length - 1} more)` : ''}`;
      // Every line carries `kind`: a name-only pull fetches a manifest, not layers.
      log.info({ credentials: found.candidates.length, ...(found.failures.length ? { credentialFailures: found.failures.map((f) => f.source) } : {}) }, 'pulling image');
      const imageRef = await this.pullWith(w, found.candidates, signal, log);
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
      const failure = this.recordFailure(w.key, err, credentialFailure);
      const r: PullResult = { key: w.key, kind, ok: false, failure, durationMs: this.now() - started };
      if (err.kind === 'Canceled') log.info('pull cancelled: the image is no longer wanted');
      else {
        const why = failure.credentialFailure ? { credentialFailure: failure.credentialFailure } : {};
        log.warn({ kind: failure.kind, failures: failure.failures, retryInMs: failure.nextAttemptAt - this.now(), err: failure.message, ...why }, 'pull failed');
      }
      this.opts.onResult?.(r);
      return r;
    } finally {
      this.slots.release();
    }
  }

  /**
   * One pull per credential, in order, until one succeeds (none: one
   * anonymous pull). A cancelled pull or a runtime that cannot be reached
   * ends the attempt: no other credential can help.
   */
  private async pullWith(w: WantedImage, candidates: readonly Credential[], signal: AbortSignal, log: Logger): Promise<string> {
    const ref = w.reference.reference;
    const runtimeHandler = w.runtimeHandler || undefined;
    if (candidates.length === 0) return await this.opts.runtime.pullImage(ref, { runtimeHandler, signal });
    const refused: { from: string; err: RuntimeError }[] = [];
    for (const c of candidates) {
      try {
        return await this.opts.runtime.pullImage(ref, { runtimeHandler, auth: c.auth, signal });
      } catch (e) {
        const err = e instanceof RuntimeError ? e : new RuntimeError('Other', (e as Error).message);
        if (signal.aborted || isRuntimeDown(err) || err.kind === 'Canceled') throw err;
        refused.push({ from: c.from, err });
        if (refused.length < candidates.length) log.info({ with: c.from, err: this.scrub(err.message) }, 'pull with this credential failed; trying the next one');
      }
    }
    if (refused.length === 1) {
      const { from, err } = refused[0]!;
      throw new RuntimeError(err.kind, `with ${from}: ${err.message}`, err.code);
    }
    // Any other kind says more than a refusal: with the right credential the registry said what it has.
    const telling = refused.filter((r) => r.err.kind !== 'Unauthorized').at(-1) ?? refused.at(-1)!;
    throw new RuntimeError(telling.err.kind, refused.map((r) => `with ${r.from}: ${r.err.message}`).join('; '), telling.err.code);
  }

  private scrub(text: string): string {
    return this.opts.credentials ? this.opts.credentials.scrub(text) : text;
  }

  private recordFailure(key: string, err: RuntimeError, credentialFailure?: string): PullFailure {
    const prev = this.failures.get(key);
    const failures = (prev?.failures ?? 0) + 1;
    const delay = backoffDelay(RETRY_POLICY[err.kind], failures, this.opts.random);
    const message = this.scrub(err.message);
    const f: PullFailure = {
      kind: err.kind,
      runtimeDown: isRuntimeDown(err),
      message,
      failures,
      nextAttemptAt: this.now() + delay,
      ...(credentialFailure ? { credentialFailure: this.scrub(credentialFailure) } : {}),
    };
    if (err.kind === 'Canceled') this.failures.delete(key);
    else this.failures.set(key, f);
    return f;
  }
}
