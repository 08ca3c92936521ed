// Reads something every `intervalMs` for as long as a scenario runs, and
// keeps every reading with its time: "was the pin in force at every
// instant" is a question about the whole timeline, not its end. A reading
// that takes longer than the interval delays the next one (never two at
// once); the largest gap between readings says how fine the timeline was.
export interface Sample<T> {
  /** When the reading started (Date.now()). */
  at: number;
  value?: T;
  /** Why the reading failed; a failed reading is a sample too, never skipped. */
  error?: string;
}

export class Sampler<T> {
  readonly samples: Sample<T>[] = [];
  readonly #probe: () => Promise<T>;
  readonly #intervalMs: number;
  #running = false;
  #timer: NodeJS.Timeout | undefined;
  #inflight: Promise<void> | undefined;

  constructor(probe: () => Promise<T>, intervalMs = 100) {
    this.#probe = probe;
    this.#intervalMs = intervalMs;
  }

  start(): void {
    if (this.#running) return;
    this.#running = true;
    this.#tick();
  }

  /** Stops after the reading in flight; resolves with every sample. */
  async stop(): Promise<Sample<T>[]> {
    this.#running = false;
    clearTimeout(this.#timer);
    await this.#inflight;
    return this.samples;
  }

  /** The samples taken from `from` to `to` (Date.now() values). */
  between(from: number, to = Infinity): Sample<T>[] {
    return this.samples.filter((s) => s.at >= from && s.at <= to);
  }

  /** The longest time between two readings' starts. */
  maxGapMs(): number {
    let gap = 0;
    for (let i = 1; i < this.samples.length; i++) gap = Math.max(gap, this.samples[i]!.at - this.samples[i - 1]!.at);
    return gap;
  }

  #tick(): void {
    if (!this.#running) return;
    const at = Date.now();
    this.#inflight = this.#probe().then(
      (value) => void this.samples.push({ at, value }),
      (e: unknown) => void this.samples.push({ at, error: e instanceof Error ? e.message : String(e) }),
    );
    void this.#inflight.then(() => {
      if (!this.#running) return;
      this.#timer = setTimeout(() => this.#tick(), Math.max(0, at + this.#intervalMs - Date.now()));
    });
  }
}
