// containerd's own services on the wire: protobuf.js light over the JSON
// descriptors of proto/containerd-images.proto (the Images service, with
// what it imports) and proto/containerd-content.proto (the Content service)
// (scripts/proto-json.ts makes them; test/unit/containerd-wire.test.ts keeps
// each equal to its .proto), read the same way as the CRI's (../cri/wire.ts):
// objects as @grpc/proto-loader makes them, camelCase, longs as numbers.
import protobuf from 'protobufjs/light.js';
import contentDescriptor from '../../proto/containerd-content.json' with { type: 'json' };
import imagesDescriptor from '../../proto/containerd-images.json' with { type: 'json' };
import { unaryMethod, type UnaryMethod } from '../cri/wire.ts';

export const IMAGES_SERVICE = 'containerd.services.images.v1.Images';
export type ImagesMethodName = 'Get' | 'List' | 'Update';
export const CONTENT_SERVICE = 'containerd.services.content.v1.Content';
export type ContentMethodName = 'Info' | 'ListStatuses';

const roots = new Map<string, protobuf.Root>();
const methods = new Map<string, UnaryMethod>();

function method(service: string, name: string, descriptor: unknown, file: string): UnaryMethod {
  const key = `${service}/${name}`;
  let m = methods.get(key);
  if (m) return m;
  let root = roots.get(file);
  if (!root) roots.set(file, (root = protobuf.Root.fromJSON(descriptor as protobuf.INamespace)));
  m = unaryMethod(root, service, name, file);
  methods.set(key, m);
  return m;
}

/** Serializers of one method of containerd's Images service, made on first use. */
export function imagesMethod(name: ImagesMethodName): UnaryMethod {
  return method(IMAGES_SERVICE, name, imagesDescriptor, 'proto/containerd-images.json');
}

/** Serializers of one method of containerd's Content service, made on first use. */
export function contentMethod(name: ContentMethodName): UnaryMethod {
  return method(CONTENT_SERVICE, name, contentDescriptor, 'proto/containerd-content.json');
}
