// CriImageRuntime: the ImageRuntime seam over CRI v1 gRPC (CRI-O in
// production, containerd or a stand-in in tests). The wire definitions are
// the subset in proto/cri-image.proto, read from its JSON descriptor
// (./wire.ts).
import * as grpc from '@grpc/grpc-js';
import { classifyGrpcError } from './classify.ts';
import type { ImageFilesystem, ImageRuntime, PullAuth, PullOptions, RuntimeImage, RuntimeInfo } from './runtime.ts';
import { criMethod, type CriService } from './wire.ts';

/** Deadlines for every call but PullImage, which has none (slow is not stuck). */
export interface CallDeadlines {
  version: number;
  listImages: number;
  imageStatus: number;
  imageFsInfo: number;
}
export const DEFAULT_DEADLINES: CallDeadlines = { version: 10_000, listImages: 60_000, imageStatus: 15_000, imageFsInfo: 15_000 };

interface WireImage {
  id: string;
  repoTags: string[];
  repoDigests: string[];
  size: number;
  pinned: boolean;
  spec?: { image?: string; runtimeHandler?: string } | null;
}

function toImage(w: WireImage): RuntimeImage {
  return {
    id: w.id,
    repoTags: w.repoTags ?? [],
    repoDigests: w.repoDigests ?? [],
    size: Number(w.size ?? 0),
    pinned: Boolean(w.pinned),
    runtimeHandler: w.spec?.runtimeHandler ?? '',
  };
}

function wireAuth(a: PullAuth | undefined): object | undefined {
  if (!a) return undefined;
  return {
    username: a.username ?? '',
    password: a.password ?? '',
    auth: a.auth ?? '',
    serverAddress: a.serverAddress ?? '',
    identityToken: a.identityToken ?? '',
    registryToken: a.registryToken ?? '',
  };
}

/** Normalise "unix:///path", "/path" and "unix:/path" to a target grpc-js accepts. */
export function criTarget(endpoint: string): string {
  if (endpoint.startsWith('/')) return `unix://${endpoint}`;
  if (endpoint.startsWith('unix:') && !endpoint.startsWith('unix://')) return `unix://${endpoint.slice(5)}`;
  return endpoint;
}

function closeConnection(c: Connection): void {
  c.client.close();
}

/** The file path of a unix-socket endpoint ("unix:///run/x.sock", "/run/x.sock"), or null for anything else. */
export function unixSocketPath(endpoint: string): string | null {
  const t = criTarget(endpoint);
  return t.startsWith('unix://') ? t.slice('unix://'.length) : null;
}

/** One gRPC channel (both services' calls go over it), and the calls running on it. */
interface Connection {
  client: grpc.Client;
  inflight: number;
  /** A call on it failed because the runtime could not be reached. */
  broken: boolean;
}

export class CriImageRuntime implements ImageRuntime {
  readonly endpoint: string;
  readonly deadlines: CallDeadlines;
  private conn: Connection;

  constructor(endpoint: string, deadlines: Partial<CallDeadlines> = {}) {
    this.endpoint = endpoint;
    this.deadlines = { ...DEFAULT_DEADLINES, ...deadlines };
    this.conn = this.connect();
  }

  private connect(): Connection {
    const options: grpc.ChannelOptions = {
      // Large ListImages answers (thousands of images) exceed the 4 MiB default.
      'grpc.max_receive_message_length': 64 * 1024 * 1024,
    };
    return { client: new grpc.Client(criTarget(this.endpoint), grpc.credentials.createInsecure(), options), inflight: 0, broken: false };
  }

  /**
   * The connection for the next call. After the runtime could not be
   * reached, grpc-js keeps failing calls at once with the last error until
   * its own reconnect backoff (up to 2 min) runs out, so a runtime that came
   * back would go unnoticed that long: the next call after such a failure
   * gets a fresh channel, which connects right away. The agent paces those
   * calls itself. The old channel closes once its calls are done.
   */
  private current(): Connection {
    if (this.conn.broken) {
      const old = this.conn;
      this.conn = this.connect();
      if (old.inflight === 0) closeConnection(old);
    }
    return this.conn;
  }

  private call<T>(service: CriService, name: string, req: object, deadlineMs: number | undefined, signal?: AbortSignal): Promise<T> {
    const conn = this.current();
    const method = criMethod(service, name);
    conn.inflight++;
    return new Promise<T>((resolve, reject) => {
      const opts: grpc.CallOptions = deadlineMs ? { deadline: Date.now() + deadlineMs } : {};
      const call = conn.client.makeUnaryRequest(method.path, method.serialize, method.deserialize, req, new grpc.Metadata(), opts, (err, res) => {
        signal?.removeEventListener('abort', onAbort);
        conn.inflight--;
        if (err && err.code === grpc.status.UNAVAILABLE) conn.broken = true;
        if (conn !== this.conn && conn.inflight === 0) closeConnection(conn);
        if (err) reject(classifyGrpcError(err, name));
        else resolve(res as T);
      });
      const onAbort = () => call.cancel();
      if (signal) {
        if (signal.aborted) call.cancel();
        else signal.addEventListener('abort', onAbort, { once: true });
      }
    });
  }

  async version(): Promise<RuntimeInfo> {
    const r = await this.call<{ runtimeName: string; runtimeVersion: string; runtimeApiVersion: string }>('RuntimeService', 'Version', { version: 'v1' }, this.deadlines.version);
    return { runtimeName: r.runtimeName, runtimeVersion: r.runtimeVersion, runtimeApiVersion: r.runtimeApiVersion };
  }

  async listImages(): Promise<RuntimeImage[]> {
    const r = await this.call<{ images: WireImage[] }>('ImageService', 'ListImages', {}, this.deadlines.listImages);
    return (r.images ?? []).map(toImage);
  }

  async imageStatus(ref: string, runtimeHandler = ''): Promise<RuntimeImage | null> {
    const r = await this.call<{ image: WireImage | null }>('ImageService', 'ImageStatus', { image: { image: ref, runtimeHandler } }, this.deadlines.imageStatus);
    return r.image ? toImage(r.image) : null;
  }

  async pullImage(ref: string, opts: PullOptions = {}): Promise<string> {
    const req = { image: { image: ref, runtimeHandler: opts.runtimeHandler ?? '' }, auth: wireAuth(opts.auth) };
    const r = await this.call<{ imageRef: string }>('ImageService', 'PullImage', req, undefined, opts.signal);
    return r.imageRef;
  }

  async imageFsInfo(): Promise<ImageFilesystem[]> {
    const r = await this.call<{ imageFilesystems: { fsId?: { mountpoint?: string }; usedBytes?: { value?: number } }[] }>('ImageService', 'ImageFsInfo', {}, this.deadlines.imageFsInfo);
    return (r.imageFilesystems ?? []).map((f) => ({ mountpoint: f.fsId?.mountpoint ?? '', usedBytes: Number(f.usedBytes?.value ?? 0) }));
  }

  close(): void {
    closeConnection(this.conn);
  }
}
