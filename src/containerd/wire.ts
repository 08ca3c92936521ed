// containerd's Images service on the wire: protobuf.js light over
// proto/containerd-images.json, the JSON descriptor of
// proto/containerd-images.proto and what it imports (scripts/proto-json.ts
// makes it; test/unit/containerd-wire.test.ts keeps the two equal), read
// the same way as the CRI's (../cri/wire.ts): objects as @grpc/proto-loader
// makes them, camelCase, longs as numbers.
import protobuf from 'protobufjs/light.js';
import descriptor from '../../proto/containerd-images.json' with { type: 'json' };
import { unaryMethod, type UnaryMethod } from '../cri/wire.ts';

export const IMAGES_SERVICE = 'containerd.services.images.v1.Images';
export type ImagesMethodName = 'Get' | 'List' | 'Update';

let root: protobuf.Root | undefined;
const methods = new Map<string, UnaryMethod>();

/** Serializers of one method of containerd's Images service, made on first use. */
export function imagesMethod(name: ImagesMethodName): UnaryMethod {
  let m = methods.get(name);
  if (m) return m;
  root ??= protobuf.Root.fromJSON(descriptor as protobuf.INamespace);
  m = unaryMethod(root, IMAGES_SERVICE, name, 'proto/containerd-images.json');
  methods.set(name, m);
  return m;
}
