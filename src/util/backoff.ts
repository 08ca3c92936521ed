// Capped exponential backoff with jitter (the pace of a pull per failure
// kind is src/agent/puller.ts RETRY_POLICY). Jitter spreads the retries of thousands of nodes that failed
// together (a registry outage) so they do not return together.
export interface BackoffPolicy {
  /** Delay after the first failure. */
  baseMs: number;
  /** No delay is longer than this. */
  capMs: number;
}

/**
 * Delay before attempt `failures + 1`, after `failures` consecutive
 * failures (>= 1): base * 2^(failures-1), capped, then "equal jitter": half
 * of it fixed, half uniformly random, so the delay is never below half the
 * nominal one and the cap is never exceeded.
 */
export function backoffDelay(policy: BackoffPolicy, failures: number, random: () => number = Math.random): number {
  if (failures < 1 || policy.capMs === 0) return 0;
  const exp = Math.min(policy.capMs, policy.baseMs * 2 ** Math.min(failures - 1, 30));
  return Math.round(exp / 2 + (exp / 2) * random());
}

/** A backoff that remembers its failures; reset on success. */
export class Backoff {
  readonly policy: BackoffPolicy;
  private readonly random: () => number;
  failures = 0;
  constructor(policy: BackoffPolicy, random: () => number = Math.random) {
    this.policy = policy;
    this.random = random;
  }
  /** Record a failure; returns the delay before the next attempt. */
  fail(): number {
    this.failures++;
    return backoffDelay(this.policy, this.failures, this.random);
  }
  reset(): void {
    this.failures = 0;
  }
}
