// The CRI's wire format for the agent's calls: protobuf.js reflection over
// proto/cri-image.json, the JSON descriptor of proto/cri-image.proto
// (scripts/proto-json.ts makes it; a unit test keeps the two equal). Its
// light build has no .proto parser, and no gRPC reflection descriptors are
// built: parsing the .proto and building those at every start cost the
// `--once` run about 10 ms and kept the parser's code in memory
// (BENCHMARKS.md, footprint).
//
// Messages become objects exactly as @grpc/proto-loader makes them with
// OBJECT_OPTIONS (camelCase fields, longs as numbers, enums as names,
// defaults filled in), which is what the test stand-ins serve with, from the
// .proto itself.
import protobuf from 'protobufjs/light.js';
import descriptor from '../../proto/cri-image.json' with { type: 'json' };

/** @grpc/proto-loader's options as the agent has always used them (keepCase false is in the descriptor's names). */
export const OBJECT_OPTIONS: protobuf.IConversionOptions = { longs: Number, enums: String, defaults: true, oneofs: true };

/** The services and methods of proto/cri-image.proto. */
export type CriService = 'ImageService' | 'RuntimeService';

export interface UnaryMethod {
  /** `/runtime.v1.<service>/<method>` */
  path: string;
  serialize(request: object): Buffer;
  deserialize(bytes: Buffer): any;
}

const PACKAGE = 'runtime.v1';
let root: protobuf.Root | undefined;
const methods = new Map<string, UnaryMethod>();

/** Serializers of one unary method, made on first use. */
export function criMethod(service: CriService, name: string): UnaryMethod {
  const path = `/${PACKAGE}.${service}/${name}`;
  let m = methods.get(path);
  if (m) return m;
  root ??= protobuf.Root.fromJSON(descriptor as protobuf.INamespace);
  m = unaryMethod(root, `${PACKAGE}.${service}`, name, 'proto/cri-image.json');
  methods.set(path, m);
  return m;
}

/** Serializers of a unary method of `service` (its full name) in a descriptor; `file` names the descriptor in errors. */
export function unaryMethod(root: protobuf.Root, service: string, name: string, file: string): UnaryMethod {
  const method = root.lookupService(service).methods[name];
  if (!method) throw new Error(`${service} has no method ${name} in ${file}`);
  method.resolve();
  const req = method.resolvedRequestType!;
  const res = method.resolvedResponseType!;
  return {
    path: `/${service}/${name}`,
    serialize: (request) => {
      const b = req.encode(req.fromObject(request)).finish();
      return Buffer.isBuffer(b) ? b : Buffer.from(b.buffer, b.byteOffset, b.byteLength);
    },
    deserialize: (bytes) => res.toObject(res.decode(bytes), OBJECT_OPTIONS),
  };
}
