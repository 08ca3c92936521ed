// The CRI v1 subset (proto/cri-image.proto) for the test stand-ins and the
// tests' own CRI clients, loaded from the .proto text with
// @grpc/proto-loader: independent of the agent's client, which reads the
// JSON descriptor (src/cri/wire.ts), so a descriptor that drifted from the
// .proto shows up as the agent and the stand-ins not understanding each other.
import { fileURLToPath } from 'node:url';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { OBJECT_OPTIONS } from '../../src/cri/wire.ts';

export const PROTO_PATH = fileURLToPath(new URL('../../proto/cri-image.proto', import.meta.url));
/** The agent's conversion options, with keepCase false (camelCase fields, as its descriptor has them). */
export const LOADER_OPTIONS: protoLoader.Options = { keepCase: false, ...(OBJECT_OPTIONS as protoLoader.Options) };

let cachedPackage: grpc.GrpcObject | undefined;
export function loadCriPackage(): grpc.GrpcObject {
  cachedPackage ??= grpc.loadPackageDefinition(protoLoader.loadSync(PROTO_PATH, LOADER_OPTIONS));
  return cachedPackage;
}
