// RetryGate: one failing step of the agent (reaching the runtime, writing
// the pin file, reloading CRI-O) retried at a pace: capped exponential
// backoff with jitter (./backoff.ts), logged once per change of state with
// the error and the next attempt, not once per attempt. A probe that sees
// the cause clear (the runtime's socket reappearing, the folder writable
// again) may bring the next attempt forward with expedite().
import type { Logger } from 'pino';
import { Backoff, type BackoffPolicy } from './backoff.ts';

/** ~1 s doubling to ~1 min, with jitter: every failing step's default pace. */
export const STEP_RETRY: BackoffPolicy = { baseMs: 1_000, capMs: 60_000 };

function stateOf(error: string): string {
  return error.replace(/\d+/g, '#');
}

export class RetryGate {
  readonly what: string;
  private readonly log: Logger;
  private readonly now: () => number;
  private readonly backoff: Backoff;
  /** The last error, while failing. */
  error: string | undefined;
  nextAt = 0;

  constructor(what: string, log: Logger, opts: { policy?: BackoffPolicy; now?: () => number; random?: () => number } = {}) {
    this.what = what;
    this.log = log;
    this.now = opts.now ?? Date.now;
    this.backoff = new Backoff(opts.policy ?? STEP_RETRY, opts.random);
  }

  get failing(): boolean {
    return this.error !== undefined;
  }

  get failures(): number {
    return this.backoff.failures;
  }

  /** May the step be attempted now? */
  due(): boolean {
    return this.now() >= this.nextAt;
  }

  /**
   * Record a failure; returns the delay before the next attempt. Logs only
   * when the state changes: a new error, numbers aside (a job path, a port,
   * a duration differ between attempts of the same failure).
   */
  fail(error: string, fields: Record<string, unknown> = {}): number {
    const delay = this.backoff.fail();
    this.nextAt = this.now() + delay;
    const changed = this.error === undefined || stateOf(error) !== stateOf(this.error);
    this.error = error;
    const line = { ...fields, step: this.what, err: error, failures: this.backoff.failures, retryInMs: delay };
    if (changed) this.log.error(line, `${this.what} failed; retrying with backoff`);
    else this.log.debug(line, `${this.what} failed again`);
    return delay;
  }

  /** Record a success; logs the recovery if the step was failing. */
  succeed(fields: Record<string, unknown> = {}): void {
    if (this.error !== undefined) this.log.info({ ...fields, step: this.what, failures: this.backoff.failures }, `${this.what} works again`);
    this.error = undefined;
    this.nextAt = 0;
    this.backoff.reset();
  }

  /** The cause looks cleared: allow the next attempt now (the backoff keeps counting until a success). */
  expedite(): void {
    this.nextAt = Math.min(this.nextAt, this.now());
  }
}
