// CriImageRuntime: the ImageRuntime seam over CRI v1 gRPC (CRI-O in
// production, containerd or a stand-in in tests). The wire definitions are
// the subset in proto/cri-image.proto, read from its JSON descriptor
// (./wire.ts).
import { RuntimeChannel } from './channel.ts';
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

export { criTarget, unixSocketPath } from './channel.ts';

export class CriImageRuntime implements ImageRuntime {
  readonly endpoint: string;
  readonly deadlines: CallDeadlines;
  private readonly channel: RuntimeChannel;

  constructor(endpoint: string, deadlines: Partial<CallDeadlines> = {}) {
    this.endpoint = endpoint;
    this.deadlines = { ...DEFAULT_DEADLINES, ...deadlines };
    this.channel = new RuntimeChannel(endpoint);
  }

  private call<T>(service: CriService, name: string, req: object, deadlineMs: number | undefined, signal?: AbortSignal): Promise<T> {
    return this.channel.call<T>(criMethod(service, name), req, { deadlineMs, signal, label: name });
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
    this.channel.close();
  }
}
