// The rate of a growing count over a sliding window of time, from
// successive observations: what a progress rate "over the last minutes"
// is. Bounded: at most maxSamples + 2 observations are kept however long
// it runs and however often it is fed (kept ones are at least window /
// maxSamples apart: a newer observation replaces the newest until it is),
// one of them at or before the window's start, so the rate spans the whole
// window once there is history.
//
// The count must not go down: when it does (a node left the set, the
// generation changed, the unit changed), the window starts over from that
// observation, as a rate across the drop would be meaningless.
//
// Beside the count, each observation may carry how many workers were
// active (nodes downloading): meanActive() is its time-weighted mean over
// the same span as rate(), so a caller can tell the rate per worker.
//
// rate() and meanActive() take an optional start: the span then begins at
// the newest observation kept at or before it (the oldest if none is), so
// a caller can measure over the recent part of the window only.

export interface RateSample {
  /** Milliseconds on the caller's clock. */
  at: number;
  value: number;
  active: number;
}

export class RateWindow {
  readonly windowMs: number;
  readonly #maxSamples: number;
  readonly #samples: RateSample[] = [];

  constructor(windowMs: number, maxSamples = 32) {
    if (!(windowMs > 0)) throw new RangeError('windowMs must be positive');
    this.windowMs = windowMs;
    this.#maxSamples = Math.max(2, maxSamples);
  }

  /** Observations kept (never more than maxSamples + 2). */
  get size(): number {
    return this.#samples.length;
  }

  /** The newest observation. */
  get last(): RateSample | undefined {
    return this.#samples.at(-1);
  }

  reset(): void {
    this.#samples.length = 0;
  }

  /** Record `value` (and `active`) as observed at `at`. An observation older than the newest is ignored. */
  add(at: number, value: number, active = 0): void {
    const s = this.#samples;
    const last = s.at(-1);
    if (last && at < last.at) return;
    if (last && value < last.value) s.length = 0;
    const sample = { at, value, active };
    const spacing = this.windowMs / this.#maxSamples;
    // The newest observation stays provisional until it is `spacing` after
    // the one before it: until then a newer one replaces it. So the kept
    // ones are at least `spacing` apart, and the newest is always kept.
    if (s.length >= 2 && s.at(-1)!.at - s.at(-2)!.at < spacing) s[s.length - 1] = sample;
    else s.push(sample);
    // Keep one observation at or before the window's start (the anchor), drop what is older.
    const start = at - this.windowMs;
    let anchor = 0;
    for (let i = 0; i < s.length - 1 && s[i + 1]!.at <= start; i++) anchor = i + 1;
    if (anchor > 0) s.splice(0, anchor);
    // The spacing keeps at most maxSamples + 1 in the window, plus the anchor; this only guards the bound.
    if (s.length > this.#maxSamples + 2) s.splice(0, s.length - this.#maxSamples - 2);
  }

  /** Index of the observation a span from `since` starts at: the newest at or before it, else the oldest. */
  #startIndex(since: number | undefined): number {
    if (since === undefined) return 0;
    const s = this.#samples;
    let i = 0;
    while (i + 1 < s.length && s[i + 1]!.at <= since) i++;
    return i;
  }

  /**
   * The span the rate is measured over: from the anchor (or oldest), or
   * from `since` (see the top), to the newest observation; undefined with
   * fewer than two observations apart in time.
   */
  span(since?: number): { from: RateSample; to: RateSample } | undefined {
    const s = this.#samples;
    const from = s[this.#startIndex(since)];
    if (!from || s.at(-1)!.at <= from.at) return undefined;
    return { from, to: s.at(-1)! };
  }

  /** Growth per second over the span; undefined until two observations apart in time. */
  rate(since?: number): number | undefined {
    const span = this.span(since);
    if (!span) return undefined;
    return ((span.to.value - span.from.value) * 1000) / (span.to.at - span.from.at);
  }

  /** Time-weighted mean of `active` over the span (each observation holds until the next); undefined as rate(). */
  meanActive(since?: number): number | undefined {
    const span = this.span(since);
    if (!span) return undefined;
    const s = this.#samples;
    let weighted = 0;
    for (let i = this.#startIndex(since); i < s.length - 1; i++) weighted += s[i]!.active * (s[i + 1]!.at - s[i]!.at);
    return weighted / (span.to.at - span.from.at);
  }
}
