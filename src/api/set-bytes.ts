// What an agent reports of a set's download on its node: `bytes` (present
// of the total) and `rate` (NodeSetStatus in ./types.ts). Computed here, from
// what the agent already knows, so its reconcile hands over facts and the
// arithmetic is tested on its own:
// - the blobs of each image (digest -> compressed size), which the disk
//   estimate reads from the registries' manifests for the node's platform
//   (src/registry/size-estimator.ts), and whether the runtime holds it;
// - optionally, bytes of blobs still arriving (containerd's content store
//   lists its active ingests with their offsets; a runtime that does not
//   tell counts an image when it lands).
// A blob that two images share counts once, as it is stored once; a blob
// held by a present image is present for every image that has it.
import { RateWindow } from '../util/rate-window.ts';

export interface ImageBlobs {
  /** digest -> compressed bytes; undefined when the image's size is not known. */
  blobs: ReadonlyMap<string, number> | undefined;
  /** The runtime holds the image. */
  present: boolean;
}

/** Present and total bytes of a set's images; undefined when the size of any of them is not known (a part would mislead). */
export function setBytes(images: readonly ImageBlobs[], arriving?: ReadonlyMap<string, number>): { present: number; total: number } | undefined {
  const size = new Map<string, number>();
  const held = new Set<string>();
  for (const img of images) {
    if (!img.blobs) return undefined;
    for (const [digest, n] of img.blobs) {
      size.set(digest, n);
      if (img.present) held.add(digest);
    }
  }
  let total = 0;
  let present = 0;
  for (const [digest, n] of size) {
    total += n;
    present += held.has(digest) ? n : Math.min(n, Math.max(0, arriving?.get(digest) ?? 0));
  }
  return { present, total };
}

/** The window an agent's per-set rate is measured over: "the last minutes". */
export const NODE_RATE_WINDOW_MS = 2 * 60_000;

/**
 * Each set's rates on this node, from the bytes present at each report:
 * what the agent writes as `rate` while the set downloads, and as
 * `pullRate` the bytes that arrived over the seconds a pull of it ran.
 * One RateWindow and one PullTime per set; sets no longer reported are
 * forgotten (retain()).
 */
export class SetRates {
  readonly #windowMs: number;
  readonly #windows = new Map<string, RateWindow>();
  readonly #pulls = new Map<string, PullTime>();

  constructor(windowMs = NODE_RATE_WINDOW_MS) {
    this.#windowMs = windowMs;
  }

  /**
   * Records the set's present bytes at `at` (ms), and whether a pull of it
   * runs then, and returns its rate in bytes per second, or undefined when
   * it is not downloading (all present) or has no history yet.
   */
  observe(key: string, bytes: { present: number; total: number }, at: number, pulling = false): number | undefined {
    let w = this.#windows.get(key);
    if (!w) this.#windows.set(key, (w = new RateWindow(this.#windowMs)));
    w.add(at, bytes.present);
    let p = this.#pulls.get(key);
    if (!p) this.#pulls.set(key, (p = new PullTime(this.#windowMs)));
    p.add(at, bytes.present, pulling);
    if (bytes.present >= bytes.total) return undefined;
    return w.rate();
  }

  /** The set's bytes per second over the seconds a pull of it ran (as last observed); undefined as observe() and until a pull has run across two observations. */
  pullRate(key: string, bytes: { present: number; total: number }): number | undefined {
    if (bytes.present >= bytes.total) return undefined;
    return this.#pulls.get(key)?.rate();
  }

  /** Forget the sets not in `keys`. */
  retain(keys: ReadonlySet<string>): void {
    for (const k of [...this.#windows.keys()]) if (!keys.has(k)) this.#windows.delete(k);
    for (const k of [...this.#pulls.keys()]) if (!keys.has(k)) this.#pulls.delete(k);
  }
}

/** Buckets a PullTime keeps over its window (and one partly out of it). */
const PULL_BUCKETS = 32;

/**
 * The bytes that arrived over the time a pull ran, over a sliding window:
 * between two observations, the time counts when a pull ran at the first
 * of them (the agent observes as a pull starts, every few seconds while
 * it runs and as each image lands, so the time from one of those to the
 * next is time pulling), with what the bytes grew meanwhile; the time
 * after the last pull's landing until the next pull starts (waiting for a
 * slot, for the first wave's next image) does not. Bounded: at most
 * PULL_BUCKETS + 1 buckets of window / PULL_BUCKETS each. The bytes going
 * down (a new generation) start it over.
 */
export class PullTime {
  readonly #windowMs: number;
  #last: { at: number; present: number; pulling: boolean } | undefined;
  readonly #buckets: { at: number; bytes: number; ms: number }[] = [];

  constructor(windowMs: number) {
    this.#windowMs = windowMs;
  }

  add(at: number, present: number, pulling: boolean): void {
    const last = this.#last;
    if (last && at < last.at) return;
    if (last && present < last.present) this.#buckets.length = 0;
    else if (last?.pulling && at > last.at) {
      const b = this.#buckets.at(-1);
      const bytes = present - last.present;
      if (b && at - b.at < this.#windowMs / PULL_BUCKETS) {
        b.bytes += bytes;
        b.ms += at - last.at;
      } else this.#buckets.push({ at, bytes, ms: at - last.at });
    }
    this.#last = { at, present, pulling };
    while (this.#buckets.length > 0 && this.#buckets[0]!.at < at - this.#windowMs) this.#buckets.shift();
    if (this.#buckets.length > PULL_BUCKETS + 1) this.#buckets.splice(0, this.#buckets.length - PULL_BUCKETS - 1);
  }

  /** Bytes per second over the time pulling in the window; undefined when none was. */
  rate(): number | undefined {
    let bytes = 0;
    let ms = 0;
    for (const b of this.#buckets) {
      bytes += b.bytes;
      ms += b.ms;
    }
    return ms > 0 ? (bytes * 1000) / ms : undefined;
  }
}
