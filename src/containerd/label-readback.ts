// What containerd reports once pinset's labels changed: the changes are
// waited for through CRI (containerd follows a label event in 3-8 ms on
// 1.7.24, in order), then one ListImages says, per image, whether CRI
// reports it pinned. The log line of a label change counts what CRI
// reports, not what was written: an image pinset stops pinning stays
// pinned while another of its records carries io.cri-containerd.pinned
// (an administrator's `ctr images label <ref> ...`, which labels the
// reference's record, not the image-ID record pinset labels), and the log
// says so, naming that record.
import type { ImageRuntime, RuntimeImage } from '../cri/runtime.ts';
import { waitForPins } from '../pins/confirm.ts';

/** The labels pinset changed in one pass. */
export interface LabelChanges {
  /** Records pinset labelled (image-ID records). */
  pinned: readonly string[];
  /** Records whose pinset labels were removed, with the other records of the same image that still carry the pin label (not pinset's). */
  removed: readonly { record: string; heldBy: readonly string[] }[];
}

/** Counts for the log line, as CRI reports them after the change. */
export interface LabelReport {
  /** Records labelled. */
  labelled: number;
  /** Records whose pinset labels were removed. */
  labelsRemoved: number;
  /** Of the images labelled, those CRI reports pinned (undefined: CRI could not be asked). */
  pinned: number | undefined;
  /** Of the images whose pinset labels went, those CRI reports unpinned. */
  unpinned: number | undefined;
  /** Of the images whose pinset labels went, those CRI still reports pinned, and why when known. */
  stillPinned: { record: string; heldBy: readonly string[] }[];
}

const idRecord = (img: RuntimeImage) => (img.id.includes(':') ? img.id : `sha256:${img.id}`);

/**
 * Waits until CRI shows the last label set and the last label removed that
 * should unpin its image (containerd applies label events in order), each
 * up to `timeoutMs`, then lists the images once. Undefined when nothing
 * changed or the list failed. `wait` false: a containerd that does not
 * follow labels (nothing to wait for).
 */
export async function readBack(runtime: ImageRuntime, changes: LabelChanges, o: { timeoutMs: number; signal: AbortSignal; wait: boolean }): Promise<RuntimeImage[] | undefined> {
  if (changes.pinned.length === 0 && changes.removed.length === 0) return undefined;
  if (o.wait) {
    const lastPinned = changes.pinned.at(-1);
    if (lastPinned) await waitForPins(runtime, [{ ref: lastPinned, expect: true }], { timeoutMs: o.timeoutMs, signal: o.signal });
    const lastUnpinned = changes.removed.filter((r) => r.heldBy.length === 0).at(-1);
    if (lastUnpinned) await waitForPins(runtime, [{ ref: lastUnpinned.record, expect: false }], { timeoutMs: o.timeoutMs, signal: o.signal });
  }
  try {
    return await runtime.listImages();
  } catch {
    return undefined;
  }
}

/** The counts of one pass, from the images CRI listed after it (undefined: not listed). */
export function labelReport(changes: LabelChanges, images: readonly RuntimeImage[] | undefined): LabelReport {
  const report: LabelReport = { labelled: changes.pinned.length, labelsRemoved: changes.removed.length, pinned: undefined, unpinned: undefined, stillPinned: [] };
  if (!images) return report;
  const byId = new Map(images.map((i) => [idRecord(i), i]));
  // An image gone meanwhile is counted nowhere.
  report.pinned = changes.pinned.filter((rec) => byId.get(rec)?.pinned === true).length;
  report.unpinned = 0;
  for (const r of changes.removed) {
    const img = byId.get(r.record);
    if (!img) continue;
    if (img.pinned) report.stillPinned.push(r);
    else report.unpinned++;
  }
  return report;
}
