// `node scripts/proto-json.ts`: the JSON descriptors the agent's gRPC
// clients read, one per .proto in proto/ that the agent calls through:
// proto/cri-image.json (CRI, src/cri/wire.ts), proto/containerd-images.json
// (containerd's Images service with what it imports) and
// proto/containerd-content.json (its Content service; both src/containerd/wire.ts),
// so that no .proto text is parsed when the agent starts (BENCHMARKS.md,
// footprint). Field names are camelCase, as @grpc/proto-loader makes them
// with keepCase false. test/unit/cri-wire.test.ts and
// test/unit/containerd-wire.test.ts fail when a .proto and its JSON
// disagree; rerun this after changing a .proto.
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import protobuf from 'protobufjs';

const ROOT = path.resolve(import.meta.dirname, '..');
const PROTO_DIR = path.join(ROOT, 'proto');
export const PROTO_FILE = path.join(PROTO_DIR, 'cri-image.proto');
export const JSON_FILE = path.join(PROTO_DIR, 'cri-image.json');
export const CONTAINERD_PROTO_FILE = path.join(PROTO_DIR, 'containerd-images.proto');
export const CONTAINERD_JSON_FILE = path.join(PROTO_DIR, 'containerd-images.json');
export const CONTAINERD_CONTENT_PROTO_FILE = path.join(PROTO_DIR, 'containerd-content.proto');
export const CONTAINERD_CONTENT_JSON_FILE = path.join(PROTO_DIR, 'containerd-content.json');

/** Each .proto the agent reads as JSON, and its JSON file. */
export const DESCRIPTORS: readonly { proto: string; json: string }[] = [
  { proto: PROTO_FILE, json: JSON_FILE },
  { proto: CONTAINERD_PROTO_FILE, json: CONTAINERD_JSON_FILE },
  { proto: CONTAINERD_CONTENT_PROTO_FILE, json: CONTAINERD_CONTENT_JSON_FILE },
];

/**
 * The descriptor of a .proto, its imports included, as its JSON file holds
 * it (with its trailing newline). Imports resolve in proto/; the
 * google/protobuf well-known types come from protobuf.js's own copies.
 */
export async function descriptorJson(protoFile = PROTO_FILE): Promise<string> {
  const root = new protobuf.Root();
  root.resolvePath = (_origin, target) => (path.isAbsolute(target) || target.startsWith('google/protobuf/') ? target : path.join(PROTO_DIR, target));
  await root.load(protoFile, { keepCase: false });
  root.resolveAll();
  return `${JSON.stringify(root.toJSON(), null, 1)}\n`;
}

if (import.meta.main) {
  for (const { proto, json } of DESCRIPTORS) {
    await writeFile(json, await descriptorJson(proto));
    process.stdout.write(`wrote ${path.relative(process.cwd(), json)}\n`);
  }
}
