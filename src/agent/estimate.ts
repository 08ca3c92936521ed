// The disk a batch of pulls will need, estimated before pulling: the
// compressed sizes of the distinct layers and configs of the images about
// to be downloaded (for an index, the node's platform's image), read from
// the registries, times a factor (the enhancement's heuristic, 2: an
// unpacked layer takes about twice its compressed size). Every layer counts,
// including any the node already holds for another image: the CRI lists
// images, not layers, so that cannot be known cheaply; the estimate errs
// high.
//
// The seam is SizeEstimator: RegistrySizeEstimator (src/registry/size-estimator.ts)
// asks the registries (sizes kept per digest reference, so a resync asks
// nothing again), made for the agent through the node's mirrors by
// ./boot/registry-access.ts; MemorySizeEstimator is its in-memory twin for
// tests.
import { formatBytes } from '../registry/size.ts';
import type { ImageSizes, SizeEstimator } from '../registry/size-estimator.ts';

export type { ImageSizes, SizeEstimator } from '../registry/size-estimator.ts';

export { DEFAULT_DISK_ESTIMATE_FACTOR } from '../registry/size.ts';

/** The in-memory twin: sizes set by the test, with a count of what was asked. */
export class MemorySizeEstimator implements SizeEstimator {
  readonly known = new Map<string, ImageSizes>();
  readonly asked: string[][] = [];
  set(ref: string, blobs: Record<string, number>): void {
    this.known.set(ref, { blobs: new Map(Object.entries(blobs)) });
  }
  fail(ref: string, why: string): void {
    this.known.set(ref, { unknown: why });
  }
  async sizes(references: readonly string[]): Promise<Map<string, ImageSizes>> {
    this.asked.push([...references]);
    return new Map(references.map((r) => [r, this.known.get(r) ?? { unknown: `${r}: no size known` }]));
  }
}

/** What the node status says of a set's estimate: its bytes (what is known), and why some are unknown. */
export interface SetEstimate {
  bytes?: number;
  unknown?: string;
}

export interface BatchEstimate {
  /** Estimated disk for the batch (distinct blobs of the known images x factor). */
  neededBytes: number;
  /** Per set key: estimated disk of that set's images in the batch (its distinct blobs x factor). */
  perSet: Map<string, number>;
  /** Images whose size is unknown, with why (the estimate is then a lower bound). */
  unknown: { reference: string; why: string }[];
}

/** Sum a batch: each blob once for the batch, each blob once per set. */
export function estimateBatch(
  images: readonly { reference: string; sets: readonly string[] }[],
  sizes: ReadonlyMap<string, ImageSizes>,
  factor: number,
): BatchEstimate {
  const all = new Map<string, number>();
  const bySet = new Map<string, Map<string, number>>();
  const unknown: BatchEstimate['unknown'] = [];
  for (const img of images) {
    const s = sizes.get(img.reference) ?? { unknown: 'not estimated' };
    if ('unknown' in s) {
      unknown.push({ reference: img.reference, why: s.unknown });
      continue;
    }
    for (const [d, n] of s.blobs) {
      all.set(d, n);
      for (const set of img.sets) {
        let m = bySet.get(set);
        if (!m) bySet.set(set, (m = new Map()));
        m.set(d, n);
      }
    }
  }
  const sum = (m: Map<string, number>) => [...m.values()].reduce((a, b) => a + b, 0);
  const perSet = new Map<string, number>();
  for (const [set, m] of bySet) perSet.set(set, Math.ceil(sum(m) * factor));
  return { neededBytes: Math.ceil(sum(all) * factor), perSet, unknown };
}

/** Room below the watermark on the image filesystem: what the kubelet lets images use before its GC starts. */
export function roomBelowWatermark(sizeBytes: number, usedBytes: number, watermarkPercent: number): number {
  return Math.floor((sizeBytes * watermarkPercent) / 100) - usedBytes;
}

/** "needs 12.3 GiB, 8.1 GiB free below the 85% watermark on /var/lib/containers" */
export function noSpaceMessage(neededBytes: number, roomBytes: number, watermarkPercent: number, mountpoint: string, images: number, unknown: number): string {
  const free = roomBytes > 0 ? `${formatBytes(roomBytes)} free` : `${formatBytes(-roomBytes)} over`;
  return (
    `needs ${formatBytes(neededBytes)}, ${free} below the ${watermarkPercent}% watermark on ${mountpoint}` +
    ` (estimated for ${images} image(s) to download${unknown ? `, ${unknown} more of unknown size` : ''}: their compressed layers and configs x the disk estimate factor); nothing of this batch is pulled until space is freed`
  );
}
