// The image runtime seam: what the agent needs from a container runtime.
// The real implementation is CriImageRuntime (./client.ts, CRI v1 over
// gRPC); tests use the same class against a CRI server stand-in or a real
// containerd.

export interface RuntimeInfo {
  runtimeName: string;
  runtimeVersion: string;
  runtimeApiVersion: string;
}

export interface RuntimeImage {
  id: string;
  repoTags: string[];
  repoDigests: string[];
  size: number;
  /** As the runtime reports it (CRI-O from pinned_images; containerd only for its sandbox image). */
  pinned: boolean;
  /** ImageSpec.runtime_handler the runtime stored the image under ('' if none). */
  runtimeHandler: string;
}

/** CRI AuthConfig. Every field but serverAddress and username is a secret: never log it. */
export interface PullAuth {
  username?: string;
  password?: string;
  auth?: string;
  serverAddress?: string;
  identityToken?: string;
  registryToken?: string;
}

export interface PullOptions {
  runtimeHandler?: string;
  auth?: PullAuth;
  /** Cancels the call (the runtime sees the RPC cancelled). */
  signal?: AbortSignal;
}

export interface ImageFilesystem {
  mountpoint: string;
  usedBytes: number;
}

export interface ImageRuntime {
  version(): Promise<RuntimeInfo>;
  listImages(): Promise<RuntimeImage[]>;
  /** null when the image is absent (not an error). */
  imageStatus(ref: string, runtimeHandler?: string): Promise<RuntimeImage | null>;
  /** Resolves to the runtime's image ref. No deadline: large pulls are slow, not stuck. */
  pullImage(ref: string, opts?: PullOptions): Promise<string>;
  imageFsInfo(): Promise<ImageFilesystem[]>;
  close(): void;
}

/** How a runtime failure should be treated; each kind has its own retry pace. */
export type FailureKind = 'NotFound' | 'Unauthorized' | 'Unavailable' | 'NoSpace' | 'Canceled' | 'Other';

export class RuntimeError extends Error {
  override name = 'RuntimeError';
  readonly kind: FailureKind;
  /** gRPC status code, when the failure came from a call. */
  readonly code: number | undefined;
  constructor(kind: FailureKind, message: string, code?: number) {
    super(message);
    this.kind = kind;
    this.code = code;
  }
}
