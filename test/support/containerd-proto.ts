// containerd's Images service subset (proto/containerd-images.proto) for the
// containerd twin and the tests' own clients, loaded from the .proto text
// with @grpc/proto-loader, independently of the agent's client, which reads
// the JSON descriptor (src/containerd/wire.ts).
import { fileURLToPath } from 'node:url';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { LOADER_OPTIONS } from './cri-proto.ts';

export const CONTAINERD_PROTO_DIR = fileURLToPath(new URL('../../proto/', import.meta.url));
export const CONTAINERD_PROTO_PATH = fileURLToPath(new URL('../../proto/containerd-images.proto', import.meta.url));
export const CONTAINERD_LOADER_OPTIONS: protoLoader.Options = { ...LOADER_OPTIONS, includeDirs: [CONTAINERD_PROTO_DIR] };

let definition: protoLoader.PackageDefinition | undefined;
export function containerdDefinition(): protoLoader.PackageDefinition {
  definition ??= protoLoader.loadSync(CONTAINERD_PROTO_PATH, CONTAINERD_LOADER_OPTIONS);
  return definition;
}

/** The grpc-js service constructor of containerd.services.images.v1.Images. */
export function imagesServiceClient(): grpc.ServiceClientConstructor {
  const pkg = grpc.loadPackageDefinition(containerdDefinition()) as any;
  return pkg.containerd.services.images.v1.Images as grpc.ServiceClientConstructor;
}
