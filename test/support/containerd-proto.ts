// containerd's Images service subset (proto/containerd-images.proto) for the
// containerd twin and the tests' own clients, and its Content service subset
// (proto/containerd-content.proto), loaded from the .proto text with
// @grpc/proto-loader, independently of the agent's clients, which read the
// JSON descriptors (src/containerd/wire.ts).
import { fileURLToPath } from 'node:url';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { LOADER_OPTIONS } from './cri-proto.ts';

export const CONTAINERD_PROTO_DIR = fileURLToPath(new URL('../../proto/', import.meta.url));
export const CONTAINERD_PROTO_PATH = fileURLToPath(new URL('../../proto/containerd-images.proto', import.meta.url));
export const CONTAINERD_LOADER_OPTIONS: protoLoader.Options = { ...LOADER_OPTIONS, includeDirs: [CONTAINERD_PROTO_DIR] };

/** containerd's Content service subset (proto/containerd-content.proto). */
export const CONTAINERD_CONTENT_PROTO_PATH = fileURLToPath(new URL('../../proto/containerd-content.proto', import.meta.url));

let definition: protoLoader.PackageDefinition | undefined;
export function containerdDefinition(): protoLoader.PackageDefinition {
  definition ??= protoLoader.loadSync(CONTAINERD_PROTO_PATH, CONTAINERD_LOADER_OPTIONS);
  return definition;
}

let contentDefinition: protoLoader.PackageDefinition | undefined;
export function containerdContentDefinition(): protoLoader.PackageDefinition {
  contentDefinition ??= protoLoader.loadSync(CONTAINERD_CONTENT_PROTO_PATH, CONTAINERD_LOADER_OPTIONS);
  return contentDefinition;
}

/** The grpc-js service constructor of containerd.services.images.v1.Images. */
export function imagesServiceClient(): grpc.ServiceClientConstructor {
  const pkg = grpc.loadPackageDefinition(containerdDefinition()) as any;
  return pkg.containerd.services.images.v1.Images as grpc.ServiceClientConstructor;
}

/** A record as the tests' client returns it (camelCase, as on the wire). */
export interface WireImageRecord {
  name: string;
  labels: Record<string, string>;
  target: { mediaType: string; digest: string; size: number; annotations: Record<string, string> } | null;
  createdAt: { seconds: number; nanos: number } | null;
  updatedAt: { seconds: number; nanos: number } | null;
}

/**
 * A bare client of containerd's Images service (grpc-js + the .proto),
 * independent of the agent's: requests go out exactly as given, so a test
 * can also send what the agent never must (an Update without a target).
 */
export class ImagesClient {
  readonly namespace: string | null;
  readonly #client: grpc.Client;

  /** namespace null: no `containerd-namespace` metadata at all. */
  constructor(endpoint: string, namespace: string | null = 'k8s.io') {
    this.namespace = namespace;
    const Images = imagesServiceClient();
    this.#client = new Images(endpoint, grpc.credentials.createInsecure());
  }

  #call<T>(method: string, req: object): Promise<T> {
    const md = new grpc.Metadata();
    if (this.namespace !== null) md.set('containerd-namespace', this.namespace);
    const fn = (this.#client as any)[method].bind(this.#client);
    return new Promise((resolve, reject) => fn(req, md, { deadline: Date.now() + 10_000 }, (err: grpc.ServiceError | null, res: T) => (err ? reject(err) : resolve(res))));
  }

  async get(name: string): Promise<WireImageRecord> {
    return (await this.#call<{ image: WireImageRecord }>('get', { name })).image;
  }

  async list(filters: string[] = []): Promise<WireImageRecord[]> {
    return (await this.#call<{ images: WireImageRecord[] }>('list', { filters })).images;
  }

  /** Images.Update as given: `image` may lack a target, `paths` may be empty. */
  async update(image: { name: string; labels?: Record<string, string>; target?: object | null }, paths: string[]): Promise<WireImageRecord> {
    return (await this.#call<{ image: WireImageRecord }>('update', { image, updateMask: { paths } })).image;
  }

  /** Get, then Update the given labels with the record's target and a `labels.<key>` mask. */
  async label(name: string, labels: Record<string, string>): Promise<WireImageRecord> {
    const { target } = await this.get(name);
    return this.update({ name, labels, target }, Object.keys(labels).map((k) => `labels.${k}`));
  }

  close(): void {
    this.#client.close();
  }
}
