// containerd's pin label and pinset's own label beside it, and the two
// pure steps of a labelling pass (./label-pins.ts): resolve each planned
// reference to the image-ID record that carries the pin, then diff those
// records against the ones labelled now.
import type { RuntimeImage } from '../cri/runtime.ts';
import type { RuntimeState } from '../pins/backend.ts';
import type { ImageRecord } from './images.ts';

/** The label containerd's CRI plugin reads (pkg/cri/labels), and the one value that pins. */
export const PIN_LABEL = 'io.cri-containerd.pinned';
export const PIN_VALUE = 'pinned';
/** Where the node status says containerd's pins are (its `pinFile`). */
export const PINS_WHERE = `containerd image label ${PIN_LABEL}`;
/** pinset's own mark beside it: a pin the agent set, and may remove. */
export const OWN_LABEL = 'pinset.dev/pinned';
export const OWN_VALUE = 'agent';
/** The List filter for the records pinset labelled (a dotted key must be quoted). */
export const OWN_FILTER = `labels."${OWN_LABEL}"`;

export const isPinned = (labels: Record<string, string>) => labels[PIN_LABEL] === PIN_VALUE;
export const isOwn = (labels: Record<string, string>) => OWN_LABEL in labels;
/** The image-ID record of a CRI image: containerd reports Image.id as `sha256:<hex>`. */
export const idRecord = (img: RuntimeImage) => (img.id.includes(':') ? img.id : `sha256:${img.id}`);
export const isDigestRef = (name: string) => /@sha256:[0-9a-f]{64}$/.test(name);
/** `sha256:<hex>` of a digest reference; '' for anything else. */
const digestOf = (ref: string) => (isDigestRef(ref) ? ref.slice(ref.lastIndexOf('@') + 1) : '');

/** One pass's references, resolved to the image-ID records that carry the pins. */
export interface Resolution {
  /** Every reference planned or wanted. */
  refs: string[];
  /** Reference -> the image-ID record it names now. */
  resolved: Map<string, string>;
  /** Image-ID record -> its image and the references naming it. */
  byRecord: Map<string, { img: RuntimeImage; refs: string[] }>;
  /** Every reference could be looked up: only then is anything unpinned. */
  complete: boolean;
}

/**
 * Which image each planned or wanted reference names now: by name, or its
 * content by manifest digest, whatever the name it is held under (a
 * mirror's, or the reference's own record removed by `ctr images rm`): the
 * same image, so the same pin. An image kept under a runtime handler is
 * asked for (`imageStatus`); one that cannot be asked makes the pass
 * incomplete.
 */
export async function resolveRecords(
  runtime: Pick<RuntimeState, 'view'>,
  planned: readonly string[],
  wanted: readonly { ref: string; runtimeHandler: string }[],
  imageStatus: (ref: string, handler: string) => Promise<RuntimeImage | null>,
): Promise<Resolution> {
  const refs = [...new Set([...planned, ...wanted.map((w) => w.ref)])];
  const handlers = new Map(wanted.map((w) => [w.ref, w.runtimeHandler]));
  const r: Resolution = { refs, resolved: new Map(), byRecord: new Map(), complete: true };
  const byDigest = new Map<string, RuntimeImage>();
  for (const img of runtime.view.images) for (const d of img.repoDigests) if (digestOf(d)) byDigest.set(digestOf(d), img);
  for (const ref of refs) {
    let img: RuntimeImage | null | undefined = runtime.view.find(ref) ?? (digestOf(ref) ? byDigest.get(digestOf(ref)) : undefined);
    const handler = handlers.get(ref);
    if (!img && handler) {
      try {
        img = await imageStatus(ref, handler);
      } catch {
        r.complete = false; // cannot tell which image it is: remove nothing this time
      }
    }
    if (!img) continue;
    const rec = idRecord(img);
    r.resolved.set(ref, rec);
    const entry = r.byRecord.get(rec) ?? { img, refs: [] };
    entry.refs.push(ref);
    r.byRecord.set(rec, entry);
  }
  return r;
}

/** The records to label and unlabel, and every pin-labelled record's labels and target (kept up to date as labels change). */
export interface LabelDiff {
  labels: Map<string, Record<string, string>>;
  targetOf: Map<string, string | undefined>;
  toPin: string[];
  toUnpin: string[];
  /** Resolved records pinned by hand (the pin label without pinset's): kept as they are. */
  handPins: string[];
}

/**
 * What to label and what to unlabel. A record pinned already (by the agent,
 * or by hand) is kept as it is. Only pinset's own labels go, from images no
 * planned reference names by name or by digest, and only when `unpin` and
 * every planned reference could be looked up.
 */
export function diffLabels(r: Resolution, labelled: readonly ImageRecord[], unpin: boolean): LabelDiff {
  const labels = new Map(labelled.map((x) => [x.name, x.labels]));
  const toPin = [...r.byRecord.keys()].filter((rec) => !isPinned(labels.get(rec) ?? {}));
  const plannedDigests = new Set(r.refs.map(digestOf));
  const toUnpin =
    unpin && r.complete ? labelled.filter((x) => isOwn(x.labels) && !r.byRecord.has(x.name) && !(x.target && plannedDigests.has(x.target.digest))).map((x) => x.name) : [];
  const handPins = [...r.byRecord.keys()].filter((rec) => isPinned(labels.get(rec) ?? {}) && !isOwn(labels.get(rec) ?? {}));
  return { labels, targetOf: new Map(labelled.map((x) => [x.name, x.target?.digest])), toPin, toUnpin, handPins };
}
