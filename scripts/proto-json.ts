// `node scripts/proto-json.ts`: proto/cri-image.json, the JSON descriptor of
// proto/cri-image.proto that the agent's CRI client reads (src/cri/wire.ts),
// so that no .proto text is parsed when the agent starts (BENCHMARKS.md,
// footprint). Field names are camelCase, as @grpc/proto-loader makes them
// with keepCase false. test/unit/cri-wire.test.ts fails when the two files
// disagree; rerun this after changing the .proto.
import { readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import protobuf from 'protobufjs';

const ROOT = path.resolve(import.meta.dirname, '..');
export const PROTO_FILE = path.join(ROOT, 'proto/cri-image.proto');
export const JSON_FILE = path.join(ROOT, 'proto/cri-image.json');

/** The descriptor of the .proto as the JSON file holds it (with its trailing newline). */
export async function descriptorJson(): Promise<string> {
  const parsed = protobuf.parse(await readFile(PROTO_FILE, 'utf8'), { keepCase: false });
  parsed.root.resolveAll();
  return `${JSON.stringify(parsed.root.toJSON(), null, 1)}\n`;
}

if (import.meta.main) {
  await writeFile(JSON_FILE, await descriptorJson());
  process.stdout.write(`wrote ${path.relative(process.cwd(), JSON_FILE)}\n`);
}
