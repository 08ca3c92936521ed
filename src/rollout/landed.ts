// The first wave's records (./first-wave.ts): what each seat's holder has
// landed, the seam that reads and writes them (./lease-records.ts on
// Leases; MemoryWaveRecords in ./memory-slots.ts), and their encoding: a
// hash of the set's image list, and a bitmap over its sorted digests (a set
// of 5000 images is 834 bytes of base64; a record names no image, so it
// stays small whatever the references).
import { createHash } from 'node:crypto';
import type { Logger } from 'pino';
import type { RolloutSet } from './slots.ts';

/** What a first-wave seat's holder has landed, as its record says. */
export interface LandedRecord {
  /** The node that wrote it last (the seat's holder then). */
  holder: string;
  /** Which image list the bits are of: imageListHash(). */
  images: string;
  /** Bit i set: the i-th of the list's sorted digests has landed (base64). */
  landed: string;
  /** The implementation's optimistic-concurrency token. */
  version?: string;
}

/** The records seam: ./lease-records.ts on Leases, MemoryWaveRecords (./memory-slots.ts) in memory. */
export interface WaveRecords {
  /**
   * Follow seat `index`'s record of `set` (pool first-wave): onRecord with
   * the record (null while there is none) now and at every change. Failures
   * are retried inside, paced.
   */
  watch(set: RolloutSet, index: number, onRecord: (r: LandedRecord | null) => void): { close(): Promise<void> };
  /** Write seat `index`'s record in this node's name: `update` makes it from what is there. Throws on failure. */
  write(set: RolloutSet, index: number, update: (current: LandedRecord | null) => LandedRecord): Promise<void>;
}

/** Annotation of a record: imageListHash() of the list its bits are of. */
export const LANDED_IMAGES_ANNOTATION = 'pinset.dev/first-wave-images';
/** Annotation of a record: the bitmap (base64) of the landed images. */
export const LANDED_BITS_ANNOTATION = 'pinset.dev/first-wave-landed';

/** The set's digests, each once, sorted: the order of a record's bits. */
export function sortedDigests(digests: readonly string[]): string[] {
  return [...new Set(digests)].sort();
}

/** A short hash of the set's image list (order and repeats do not count). */
export function imageListHash(digests: readonly string[]): string {
  return createHash('sha256').update(sortedDigests(digests).join('\n')).digest('hex').slice(0, 16);
}

/** The name a static set's first wave goes by: its name and a hash of its images. */
export function staticWaveName(name: string, digests: readonly string[]): string {
  return `${name}.static-${imageListHash(digests).slice(0, 10)}`;
}

/** The bitmap over `sorted` with the bits of `landed` set, base64. */
export function encodeLanded(sorted: readonly string[], landed: ReadonlySet<string>): string {
  const bytes = new Uint8Array(Math.ceil(sorted.length / 8));
  sorted.forEach((d, i) => {
    if (landed.has(d)) bytes[i >> 3]! |= 1 << (i & 7);
  });
  return Buffer.from(bytes).toString('base64');
}

/** The digests of `sorted` whose bits are set in `bits` (base64); bits past the list are ignored. */
export function decodeLanded(sorted: readonly string[], bits: string): Set<string> {
  const bytes = Buffer.from(bits, 'base64');
  const out = new Set<string>();
  sorted.forEach((d, i) => {
    if (((bytes[i >> 3] ?? 0) >> (i & 7)) & 1) out.add(d);
  });
  return out;
}

export interface RecordWriterOptions {
  records: WaveRecords;
  /** The set's seats (pool first-wave). */
  set: RolloutSet;
  index: number;
  /** The set's sorted digests and their hash. */
  sorted: readonly string[];
  hash: string;
  identity: string;
  intervalMs: number;
  now: () => number;
  logger: Logger;
}

/**
 * A member's writes of its seat's record: at once when it takes the seat,
 * then at most once per interval (landings in between share a write), the
 * bits of the seat's earlier holders kept (what they pulled through the
 * cache is still there); a failed write is tried again at the same pace.
 */
export class RecordWriter {
  readonly index: number;
  readonly #o: RecordWriterOptions;
  readonly #mine = new Set<string>();
  #timer: NodeJS.Timeout | undefined;
  #writing: Promise<void> | undefined;
  #writtenAt = -Infinity;
  #stopped = false;

  constructor(o: RecordWriterOptions) {
    this.#o = o;
    this.index = o.index;
    this.#schedule(true);
  }

  /** What this node holds now: the set's images among them are recorded (soon). */
  note(present: ReadonlySet<string>): void {
    let grew = false;
    for (const d of this.#o.sorted) if (present.has(d) && !this.#mine.has(d)) (this.#mine.add(d), (grew = true));
    if (grew) this.#schedule(false);
  }

  /** The write running now, if any. */
  get writing(): Promise<void> | undefined {
    return this.#writing;
  }

  /** A write due later goes now, and the writer stops (the seat is given up). */
  async close(): Promise<void> {
    await this.#writing;
    if (this.#timer) {
      clearTimeout(this.#timer);
      this.#write();
      await this.#writing;
    }
    this.#stopped = true;
    clearTimeout(this.#timer);
  }

  #schedule(immediate: boolean): void {
    if (this.#timer || this.#stopped) return;
    const wait = this.#writing ? this.#o.intervalMs : immediate ? 0 : Math.max(0, this.#writtenAt + this.#o.intervalMs - this.#o.now());
    if (wait === 0) this.#write();
    else this.#timer = setTimeout(() => this.#write(), wait).unref();
  }

  #write(): void {
    this.#timer = undefined;
    if (this.#stopped) return;
    const { records, set, index, sorted, hash, identity } = this.#o;
    const mine = new Set(this.#mine);
    this.#writtenAt = this.#o.now();
    this.#writing = (async () => {
      try {
        await records.write(set, index, (cur) => {
          const kept = cur && cur.images === hash ? decodeLanded(sorted, cur.landed) : new Set<string>();
          for (const d of mine) kept.add(d);
          return { holder: identity, images: hash, landed: encodeLanded(sorted, kept) };
        });
      } catch (e) {
        this.#o.logger.warn({ set: set.name, seat: index, err: (e instanceof Error ? e.message : String(e)).slice(0, 300) }, "could not write the first wave's record; retrying");
        if (!this.#timer && !this.#stopped) this.#timer = setTimeout(() => this.#write(), Math.max(this.#o.intervalMs, 1_000)).unref();
      } finally {
        this.#writing = undefined;
      }
    })();
  }
}
