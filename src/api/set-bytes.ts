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
 * Each set's rate on this node, from the bytes present at each report: what
 * the agent writes as `rate` while the set downloads. One RateWindow per
 * set; sets no longer reported are forgotten (retain()).
 */
export class SetRates {
  readonly #windowMs: number;
  readonly #windows = new Map<string, RateWindow>();

  constructor(windowMs = NODE_RATE_WINDOW_MS) {
    this.#windowMs = windowMs;
  }

  /**
   * Records the set's present bytes at `at` (ms) and returns its rate in
   * bytes per second, or undefined when it is not downloading (all
   * present) or has no history yet.
   */
  observe(key: string, bytes: { present: number; total: number }, at: number): number | undefined {
    let w = this.#windows.get(key);
    if (!w) this.#windows.set(key, (w = new RateWindow(this.#windowMs)));
    w.add(at, bytes.present);
    if (bytes.present >= bytes.total) return undefined;
    return w.rate();
  }

  /** Forget the sets not in `keys`. */
  retain(keys: ReadonlySet<string>): void {
    for (const k of [...this.#windows.keys()]) if (!keys.has(k)) this.#windows.delete(k);
  }
}
