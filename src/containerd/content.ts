// ContainerdContent: containerd's own Content service (ListStatuses, Info),
// on the socket CRI uses, in CRI's namespace (k8s.io), as ./images.ts
// reaches the Images service. ContentDownloads reads it for the download
// progress seam (src/pins/downloads.ts): how many bytes of each blob of an
// image still downloading are on the node.
//
// While a pull runs (CRI's PullImage; containerd 1.7's client.Pull and 2.x's
// transfer service alike, core/remotes Fetch), each blob being fetched is an
// ingest whose ref ends with the blob's digest ("layer-sha256:<hex>",
// remotes.MakeRefKey) and whose offset is the bytes written so far; the
// local store leaves `expected` empty, so the digest is read off the ref.
// The offset moves a MiB at a time: content.Copy fills a 1 MiB buffer
// before each write (content/helpers.go copyWithBuffer), so a blob holds up
// to a MiB more than its offset says. That part is counted at the rate the
// blob has arrived so far, for the time since its last write (the ingest's
// updated_at; containerd and the agent share the node's clock), never more
// than the buffer: a node pulling 4 images of 6 layers at once holds up to
// 24 MiB in them. Once complete, a blob is committed and its ingest is
// gone: one Info then tells a committed blob (its size) from a dropped one
// (NOT_FOUND). So a report costs one ListStatuses, plus one Info per blob
// the first time it is seen gone; a blob fetched whole between two reports
// is counted when its image lands.
import { RuntimeChannel } from '../cri/channel.ts';
import { RuntimeError } from '../cri/runtime.ts';
import type { DownloadProgress } from '../pins/downloads.ts';
import { mapLimit } from '../util/limit.ts';
import { errMessage } from '../util/problem-log.ts';
import { CRI_NAMESPACE, NAMESPACE_HEADER } from './images.ts';
import { contentMethod, type ContentMethodName } from './wire.ts';

/** A local call: a containerd that takes this long is not worth waiting for in a progress report. */
export const CONTENT_DEADLINE_MS = 5_000;

/** gRPC's UNIMPLEMENTED: the socket's server has no Content service (not containerd). */
const UNIMPLEMENTED = 12;

/** Info calls at once, for blobs that finished between two reads. */
const INFO_PARALLEL = 8;

/** containerd's copy buffer (content/helpers.go bufPool): a blob's bytes read but not yet written fill it up to this. */
export const COPY_BUFFER_BYTES = 1 << 20;

/** One ingest under way. */
export interface Ingest {
  ref: string;
  /** The blob's digest: `expected` when containerd gives it, else the one the ref ends with; undefined when neither says. */
  digest: string | undefined;
  /** Bytes written so far. */
  offset: number;
  /** The size expected (0: not told). */
  total: number;
  /** When the ingest started and was last written to, ms since the epoch (0: not told). */
  startedAt: number;
  updatedAt: number;
}

/**
 * The bytes of a blob on the node while it is written: its offset, and
 * what containerd's copy buffer holds since the last write, at the rate the
 * blob has arrived so far (at most COPY_BUFFER_BYTES; nothing before its
 * first write, whose rate is not known). Never less than a later read's:
 * the buffer's part is at most what the next write adds.
 */
export function ingestBytes(i: Pick<Ingest, 'offset' | 'startedAt' | 'updatedAt'>, now: number): number {
  const { offset, startedAt, updatedAt } = i;
  if (offset <= 0 || !(updatedAt > startedAt) || startedAt <= 0) return Math.max(0, offset);
  const buffered = (offset / (updatedAt - startedAt)) * Math.max(0, now - updatedAt);
  return offset + Math.floor(Math.min(COPY_BUFFER_BYTES, buffered));
}

type WireTime = { seconds?: number; nanos?: number } | null | undefined;

const ms = (t: WireTime): number => (t ? Number(t.seconds ?? 0) * 1000 + Math.floor(Number(t.nanos ?? 0) / 1e6) : 0);

const DIGEST_AT_END = /(sha256:[a-f0-9]{64}|sha384:[a-f0-9]{96}|sha512:[a-f0-9]{128})$/;
const DIGEST = /^(sha256:[a-f0-9]{64}|sha384:[a-f0-9]{96}|sha512:[a-f0-9]{128})$/;

/** The blob an ingest writes: `expected` when set, else the digest its ref ends with ("layer-sha256:…", "name@sha256:…"). */
export function ingestDigest(ref: string, expected: string): string | undefined {
  if (DIGEST.test(expected)) return expected;
  return DIGEST_AT_END.exec(ref)?.[1];
}

interface WireStatus {
  startedAt?: WireTime;
  updatedAt?: WireTime;
  ref?: string;
  offset?: number;
  total?: number;
  expected?: string;
}

export class ContainerdContent {
  readonly endpoint: string;
  readonly namespace: string;
  private readonly channel: RuntimeChannel;

  constructor(endpoint: string, opts: { namespace?: string } = {}) {
    this.endpoint = endpoint;
    this.namespace = opts.namespace ?? CRI_NAMESPACE;
    this.channel = new RuntimeChannel(endpoint);
  }

  private call<T>(name: ContentMethodName, req: object, signal?: AbortSignal): Promise<T> {
    return this.channel.call<T>(contentMethod(name), req, { deadlineMs: CONTENT_DEADLINE_MS, signal, metadata: { [NAMESPACE_HEADER]: this.namespace }, label: `Content.${name}` });
  }

  /** Every ingest under way in the namespace. */
  async listStatuses(signal?: AbortSignal): Promise<Ingest[]> {
    const r = await this.call<{ statuses?: WireStatus[] }>('ListStatuses', { filters: [] }, signal);
    return (r.statuses ?? []).map((s) => ({
      ref: s.ref ?? '',
      digest: ingestDigest(s.ref ?? '', s.expected ?? ''),
      offset: Number(s.offset ?? 0),
      total: Number(s.total ?? 0),
      startedAt: ms(s.startedAt),
      updatedAt: ms(s.updatedAt),
    }));
  }

  /** The committed blob's size, or null when the store holds no such blob. */
  async info(digest: string, signal?: AbortSignal): Promise<{ digest: string; size: number } | null> {
    try {
      const r = await this.call<{ info?: { digest?: string; size?: number } | null }>('Info', { digest }, signal);
      return r.info ? { digest: r.info.digest || digest, size: Number(r.info.size ?? 0) } : null;
    } catch (err) {
      if (err instanceof RuntimeError && err.kind === 'NotFound') return null;
      throw err;
    }
  }

  close(): void {
    this.channel.close();
  }
}

/** What ContentDownloads says of a failed read, for the agent's log. */
export type ContentProblem = (what: string, err: string) => void;

/**
 * The download progress seam on containerd's Content service. Holds, between
 * reads, the blobs last seen being written and those found committed (both
 * only for the blobs last asked about). A failed read answers what the last
 * one said; a socket with no Content service is not asked again.
 */
export class ContentDownloads implements DownloadProgress {
  private readonly content: Pick<ContainerdContent, 'listStatuses' | 'info' | 'close'>;
  private readonly onProblem: ContentProblem;
  private readonly now: () => number;
  /** Digest -> bytes, as last answered. */
  private last = new Map<string, number>();
  /** Digests being written at the last read. */
  private writing = new Set<string>();
  /** Digests found committed, with their size. */
  private committed = new Map<string, number>();
  private unsupported = false;

  constructor(content: Pick<ContainerdContent, 'listStatuses' | 'info' | 'close'>, onProblem: ContentProblem = () => {}, now: () => number = Date.now) {
    this.content = content;
    this.onProblem = onProblem;
    this.now = now;
  }

  async arrived(blobs: ReadonlyMap<string, number>, signal?: AbortSignal): Promise<ReadonlyMap<string, number>> {
    if (this.unsupported || blobs.size === 0) return new Map();
    try {
      return (this.last = await this.read(blobs, signal));
    } catch (e) {
      if (e instanceof RuntimeError && e.code === UNIMPLEMENTED) {
        this.unsupported = true;
        this.onProblem('the runtime has no containerd Content service; images count when they land', errMessage(e));
        return new Map();
      }
      this.onProblem('the runtime could not say what is arriving; progress shows what it said last', errMessage(e));
      return new Map([...this.last].filter(([d]) => blobs.has(d)));
    }
  }

  private async read(blobs: ReadonlyMap<string, number>, signal?: AbortSignal): Promise<Map<string, number>> {
    const active = new Map<string, number>();
    const ingests = await this.content.listStatuses(signal);
    const now = this.now();
    for (const i of ingests) {
      if (i.digest && blobs.has(i.digest)) active.set(i.digest, Math.max(active.get(i.digest) ?? 0, ingestBytes(i, now)));
    }
    // Written at the last read, gone now: committed, or dropped (a failed pull). One Info each, a few at a time.
    const gone = [...blobs.keys()].filter((d) => !active.has(d) && !this.committed.has(d) && this.writing.has(d));
    await mapLimit(gone, INFO_PARALLEL, async (d) => {
      const info = await this.content.info(d, signal);
      if (info) this.committed.set(d, info.size);
    });
    const out = new Map<string, number>();
    for (const [digest, size] of blobs) {
      const bytes = active.get(digest) ?? this.committed.get(digest);
      if (bytes !== undefined) out.set(digest, Math.min(size, bytes));
    }
    this.writing = new Set(active.keys());
    for (const d of [...this.committed.keys()]) if (!blobs.has(d)) this.committed.delete(d);
    return out;
  }

  close(): void {
    this.content.close();
  }
}
