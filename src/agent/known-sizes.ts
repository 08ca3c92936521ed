// The sizes of the wanted images' blobs, as the registries told them (the
// size estimator, ./estimate.ts), kept per reference for as long as it is
// wanted: what a set's bytes on the node are counted from
// (src/api/set-bytes.ts, ./set-report.ts).
//
// Pull admission (./pull-admission.ts) fills it: with the sizes its disk
// estimate reads for the images about to download, and, in the same
// request, the other images of the sets those belong to (present ones, or
// held under another name), since a set's total needs all of them. Each
// reference is asked for once: a known one is never asked again, and one
// the registry could not size is asked again only after SIZE_RETRY_MS, so a
// reconcile, a progress report or a retried pull adds no registry request
// for what is known. A set that waits for a rollout slot asks nothing until
// it holds one (until then the controller counts it as the nodes that
// report); a set whose images are all present asks nothing (a Ready set
// carries its total from its last report, ./status.ts).
import type { ImageSizes } from './estimate.ts';
import type { Plan, WantedImage } from './plan.ts';

/** A reference the registry could not size is asked again after this long. */
export const SIZE_RETRY_MS = 5 * 60_000;

export class KnownSizes {
  readonly #blobs = new Map<string, ReadonlyMap<string, number>>();
  /** References fetched through a mirror first, as the estimator found. */
  readonly #mirrored = new Set<string>();
  /** Reference -> when it was answered unknown. */
  readonly #unknownAt = new Map<string, number>();
  readonly #now: () => number;

  constructor(now: () => number = Date.now) {
    this.#now = now;
  }

  /** The blobs (digest -> compressed bytes) of a reference, when known. */
  blobs(reference: string): ReadonlyMap<string, number> | undefined {
    return this.#blobs.get(reference);
  }

  /** The reference is fetched through a mirror first (its sizes known and said so). */
  mirrored(reference: string): boolean {
    return this.#mirrored.has(reference);
  }

  /** References known. */
  get size(): number {
    return this.#blobs.size;
  }

  /** Record what the estimator answered. */
  note(sizes: ReadonlyMap<string, ImageSizes>): void {
    const now = this.#now();
    for (const [ref, s] of sizes) {
      if ('blobs' in s) {
        this.#blobs.set(ref, s.blobs);
        if (s.mirror) this.#mirrored.add(ref);
        else this.#mirrored.delete(ref);
        this.#unknownAt.delete(ref);
      } else if (!this.#blobs.has(ref)) this.#unknownAt.set(ref, now);
    }
  }

  /** Of `refs`, those worth asking the registry for now: not known, and not answered unknown within SIZE_RETRY_MS. */
  toAsk(refs: Iterable<string>): string[] {
    const now = this.#now();
    const out = new Set<string>();
    for (const r of refs) {
      if (this.#blobs.has(r)) continue;
      const failed = this.#unknownAt.get(r);
      if (failed !== undefined && now - failed < SIZE_RETRY_MS) continue;
      out.add(r);
    }
    return [...out];
  }

  /** Forget references no longer wanted. */
  retain(refs: ReadonlySet<string>): void {
    for (const r of [...this.#blobs.keys()]) if (!refs.has(r)) this.#blobs.delete(r);
    for (const r of [...this.#mirrored]) if (!refs.has(r)) this.#mirrored.delete(r);
    for (const r of [...this.#unknownAt.keys()]) if (!refs.has(r)) this.#unknownAt.delete(r);
  }
}

/** The references of every set that has an image in `downloading`: what the sets' totals need besides the images the estimate asks for. */
export function setsReferences(plan: Plan, downloading: readonly WantedImage[]): string[] {
  const sets = new Set(downloading.flatMap((w) => w.sets));
  return plan.wanted.filter((w) => w.sets.some((k) => sets.has(k))).map((w) => w.reference.reference);
}
