// CriImageRuntime: the ImageRuntime seam over CRI v1 gRPC (CRI-O in
// production, containerd or a stand-in in tests). The wire definitions are
// the subset in proto/cri-image.proto.
import { fileURLToPath } from 'node:url';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { classifyGrpcError } from './classify.ts';
import type { ImageFilesystem, ImageRuntime, PullAuth, PullOptions, RuntimeImage, RuntimeInfo } from './runtime.ts';

// In the sources proto/ is two folders up from this file; the bundle
// (scripts/build.ts) copies it beside its own files and says so here.
declare const PINSET_BUNDLE_PROTO_PATH: string | undefined;
export const PROTO_PATH = fileURLToPath(
  new URL(typeof PINSET_BUNDLE_PROTO_PATH === 'string' ? PINSET_BUNDLE_PROTO_PATH : '../../proto/cri-image.proto', import.meta.url),
);
export const LOADER_OPTIONS: protoLoader.Options = { keepCase: false, longs: Number, enums: String, defaults: true, oneofs: true };

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

type Unary = (req: object, md: grpc.Metadata, opts: grpc.CallOptions, cb: (err: grpc.ServiceError | null, res: any) => void) => grpc.ClientUnaryCall;
type ServiceClient = grpc.Client & Record<string, Unary>;

let cachedPackage: grpc.GrpcObject | undefined;
export function loadCriPackage(): grpc.GrpcObject {
  cachedPackage ??= grpc.loadPackageDefinition(protoLoader.loadSync(PROTO_PATH, LOADER_OPTIONS));
  return cachedPackage;
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
  c.images.close();
  c.runtime.close();
}

/** The file path of a unix-socket endpoint ("unix:///run/x.sock", "/run/x.sock"), or null for anything else. */
export function unixSocketPath(endpoint: string): string | null {
  const t = criTarget(endpoint);
  return t.startsWith('unix://') ? t.slice('unix://'.length) : null;
}

/** One gRPC channel with its two service clients, and the calls running on it. */
interface Connection {
  images: ServiceClient;
  runtime: ServiceClient;
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
    const pkg = loadCriPackage() as any;
    const v1 = pkg.runtime.v1;
    const target = criTarget(this.endpoint);
    const options: grpc.ChannelOptions = {
      // Large ListImages answers (thousands of images) exceed the 4 MiB default.
      'grpc.max_receive_message_length': 64 * 1024 * 1024,
    };
    const images = new v1.ImageService(target, grpc.credentials.createInsecure(), options) as ServiceClient;
    // Share the channel between the two services.
    const runtime = new v1.RuntimeService(target, grpc.credentials.createInsecure(), { ...options, channelOverride: images.getChannel() }) as ServiceClient;
    return { images, runtime, inflight: 0, broken: false };
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

  private call<T>(which: 'images' | 'runtime', method: string, req: object, deadlineMs: number | undefined, signal?: AbortSignal): Promise<T> {
    const conn = this.current();
    const client = conn[which];
    conn.inflight++;
    return new Promise<T>((resolve, reject) => {
      const opts: grpc.CallOptions = deadlineMs ? { deadline: Date.now() + deadlineMs } : {};
      const call = client[method]!.call(client, req, new grpc.Metadata(), opts, (err, res) => {
        signal?.removeEventListener('abort', onAbort);
        conn.inflight--;
        if (err && err.code === grpc.status.UNAVAILABLE) conn.broken = true;
        if (conn !== this.conn && conn.inflight === 0) closeConnection(conn);
        if (err) reject(classifyGrpcError(err, method));
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
    const r = await this.call<{ runtimeName: string; runtimeVersion: string; runtimeApiVersion: string }>('runtime', 'Version', { version: 'v1' }, this.deadlines.version);
    return { runtimeName: r.runtimeName, runtimeVersion: r.runtimeVersion, runtimeApiVersion: r.runtimeApiVersion };
  }

  async listImages(): Promise<RuntimeImage[]> {
    const r = await this.call<{ images: WireImage[] }>('images', 'ListImages', {}, this.deadlines.listImages);
    return (r.images ?? []).map(toImage);
  }

  async imageStatus(ref: string, runtimeHandler = ''): Promise<RuntimeImage | null> {
    const r = await this.call<{ image: WireImage | null }>('images', 'ImageStatus', { image: { image: ref, runtimeHandler } }, this.deadlines.imageStatus);
    return r.image ? toImage(r.image) : null;
  }

  async pullImage(ref: string, opts: PullOptions = {}): Promise<string> {
    const req = { image: { image: ref, runtimeHandler: opts.runtimeHandler ?? '' }, auth: wireAuth(opts.auth) };
    const r = await this.call<{ imageRef: string }>('images', 'PullImage', req, undefined, opts.signal);
    return r.imageRef;
  }

  async imageFsInfo(): Promise<ImageFilesystem[]> {
    const r = await this.call<{ imageFilesystems: { fsId?: { mountpoint?: string }; usedBytes?: { value?: number } }[] }>('images', 'ImageFsInfo', {}, this.deadlines.imageFsInfo);
    return (r.imageFilesystems ?? []).map((f) => ({ mountpoint: f.fsId?.mountpoint ?? '', usedBytes: Number(f.usedBytes?.value ?? 0) }));
  }

  close(): void {
    closeConnection(this.conn);
  }
}
