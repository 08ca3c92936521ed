// ContainerdImages: containerd's own Images service (Get, List, Update),
// reached on the socket CRI uses (/run/containerd/containerd.sock), in the
// namespace CRI keeps its images in (k8s.io, sent as the gRPC metadata
// `containerd-namespace`). The agent uses it for one thing: labels on image
// records (the pin label, io.cri-containerd.pinned=pinned, and its own).
//
// Every label change is a Get, then an Update that carries the record's
// `target` from that Get and an update_mask naming exactly `labels.<key>`
// for each key that changes: containerd then writes those keys and nothing
// else (metadata/images.go), and an empty value deletes the key. An Update
// WITHOUT a target kills containerd 1.7 and 2.x (a nil dereference in
// services/images/helpers.go, issue 18): this client never sends one.
import { RuntimeChannel } from '../cri/channel.ts';
import { RuntimeError } from '../cri/runtime.ts';
import { imagesMethod, type ImagesMethodName } from './wire.ts';

/** CRI's namespace in containerd. */
export const CRI_NAMESPACE = 'k8s.io';
/** The gRPC metadata key containerd reads the namespace from. */
export const NAMESPACE_HEADER = 'containerd-namespace';

export interface ImagesDeadlines {
  get: number;
  list: number;
  update: number;
}
export const DEFAULT_IMAGES_DEADLINES: ImagesDeadlines = { get: 10_000, list: 30_000, update: 10_000 };

/** containerd's content descriptor (api/types/descriptor.proto). */
export interface Descriptor {
  mediaType: string;
  digest: string;
  size: number;
  annotations: Record<string, string>;
}

/** One image record: a name (a reference, or the image ID `sha256:<config digest>`), its labels and its target. */
export interface ImageRecord {
  name: string;
  labels: Record<string, string>;
  /** Undefined only if containerd answered without one (it never does). */
  target: Descriptor | undefined;
}

interface WireImage {
  name: string;
  labels?: Record<string, string> | null;
  target?: { mediaType?: string; digest?: string; size?: number; annotations?: Record<string, string> | null } | null;
}

function toRecord(w: WireImage): ImageRecord {
  const t = w.target;
  return {
    name: w.name,
    labels: { ...(w.labels ?? {}) },
    target: t && t.digest ? { mediaType: t.mediaType ?? '', digest: t.digest, size: Number(t.size ?? 0), annotations: { ...(t.annotations ?? {}) } } : undefined,
  };
}

/** A label change that cannot be sent safely: the record came back without a target. */
export class MissingTargetError extends RuntimeError {
  override name = 'MissingTargetError';
  constructor(image: string) {
    super('Other', `Images.Update: not sent: containerd returned image "${image}" without a target, and an Update without one kills containerd 1.7 and 2.x`);
  }
}

/** The label changes `want` makes to `have`: each key whose value differs ('' = absent). */
export function labelChanges(have: Record<string, string>, want: Record<string, string>): string[] {
  return Object.keys(want).filter((k) => (have[k] ?? '') !== want[k]).sort();
}

export class ContainerdImages {
  readonly endpoint: string;
  readonly namespace: string;
  readonly deadlines: ImagesDeadlines;
  private readonly channel: RuntimeChannel;

  constructor(endpoint: string, opts: { namespace?: string; deadlines?: Partial<ImagesDeadlines> } = {}) {
    this.endpoint = endpoint;
    this.namespace = opts.namespace ?? CRI_NAMESPACE;
    this.deadlines = { ...DEFAULT_IMAGES_DEADLINES, ...opts.deadlines };
    this.channel = new RuntimeChannel(endpoint);
  }

  private call<T>(name: ImagesMethodName, req: object, deadlineMs: number, signal?: AbortSignal): Promise<T> {
    return this.channel.call<T>(imagesMethod(name), req, { deadlineMs, signal, metadata: { [NAMESPACE_HEADER]: this.namespace }, label: `Images.${name}` });
  }

  /** The record named `name`, or null when there is none. */
  async get(name: string, signal?: AbortSignal): Promise<ImageRecord | null> {
    try {
      const r = await this.call<{ image: WireImage | null }>('Get', { name }, this.deadlines.get, signal);
      return r.image ? toRecord(r.image) : null;
    } catch (err) {
      if (err instanceof RuntimeError && err.kind === 'NotFound') return null;
      throw err;
    }
  }

  /** Records matching any of `filters` (containerd's filter syntax, e.g. `labels."pinset.dev/pinned"`); all without one. */
  async list(filters: readonly string[] = [], signal?: AbortSignal): Promise<ImageRecord[]> {
    const r = await this.call<{ images: WireImage[] }>('List', { filters: [...filters] }, this.deadlines.list, signal);
    return (r.images ?? []).map(toRecord);
  }

  /**
   * Sets labels on one record ('' removes the key), touching no other label
   * or field: a Get, then (only when a value changes) one Update with the
   * record's target and the mask `labels.<key>` per changed key. Resolves
   * with the record as containerd holds it afterwards. A record that does
   * not exist is a RuntimeError of kind NotFound.
   */
  async setLabels(name: string, labels: Record<string, string>, signal?: AbortSignal): Promise<ImageRecord> {
    const current = await this.get(name, signal);
    if (!current) throw new RuntimeError('NotFound', `Images.Get: NOT_FOUND: image "${name}": not found`, 5);
    const changed = labelChanges(current.labels, labels);
    if (changed.length === 0) return current;
    if (!current.target) throw new MissingTargetError(name);
    const req = {
      image: { name, labels: Object.fromEntries(changed.map((k) => [k, labels[k]!])), target: current.target },
      updateMask: { paths: changed.map((k) => `labels.${k}`) },
    };
    const r = await this.call<{ image: WireImage | null }>('Update', req, this.deadlines.update, signal);
    return r.image ? toRecord(r.image) : { ...current, labels: applyChanges(current.labels, labels, changed) };
  }

  close(): void {
    this.channel.close();
  }
}

function applyChanges(have: Record<string, string>, want: Record<string, string>, keys: readonly string[]): Record<string, string> {
  const out = { ...have };
  for (const k of keys) {
    if (want[k] === '') delete out[k];
    else out[k] = want[k]!;
  }
  return out;
}
