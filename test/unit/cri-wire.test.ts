// The agent's CRI wire format (src/cri/wire.ts, from proto/cri-image.json)
// against the .proto as @grpc/proto-loader reads it (what the stand-ins and
// the tests' own clients use): the descriptor is the .proto's, and every
// message the agent sends or reads has the same bytes and the same object.
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { describe, test } from 'node:test';
import * as protoLoader from '@grpc/proto-loader';
import { descriptorJson, JSON_FILE } from '../../scripts/proto-json.ts';
import { criMethod, type CriService } from '../../src/cri/wire.ts';
import { LOADER_OPTIONS, PROTO_PATH } from '../support/cri-proto.ts';

const loaded = protoLoader.loadSync(PROTO_PATH, LOADER_OPTIONS);
function loaderMethod(service: CriService, name: string): protoLoader.MethodDefinition<object, object> {
  return (loaded[`runtime.v1.${service}`] as protoLoader.ServiceDefinition)[name]!;
}

const image = {
  id: 'sha256:' + 'a'.repeat(64),
  repoTags: ['registry.test/app:1'],
  repoDigests: [`registry.test/app@sha256:${'b'.repeat(64)}`],
  size: 2 ** 40 + 5,
  pinned: true,
  spec: { image: 'registry.test/app:1', annotations: { a: 'b' }, runtimeHandler: 'kata', userSpecifiedImage: '', imageRef: '' },
};

// Every method, with a request and a response that use each kind of field the agent relies on.
const CASES: { service: CriService; name: string; request: object; response: object; what?: string }[] = [
  { service: 'RuntimeService', name: 'Version', request: { version: 'v1' }, response: { version: '0.1.0', runtimeName: 'cri-o', runtimeVersion: '1.32.13', runtimeApiVersion: 'v1' } },
  { service: 'ImageService', name: 'ListImages', request: {}, response: { images: [image, { ...image, pinned: false, spec: null }] } },
  { service: 'ImageService', name: 'ImageStatus', request: { image: { image: 'registry.test/app:1', runtimeHandler: 'kata' }, verbose: false }, response: { image, info: { k: 'v' } }, what: ' (present)' },
  { service: 'ImageService', name: 'ImageStatus', request: { image: { image: 'registry.test/absent:1' } }, response: {}, what: ' (absent)' },
  {
    service: 'ImageService',
    name: 'PullImage',
    request: { image: { image: 'registry.test/app:1', runtimeHandler: '' }, auth: { username: 'u', password: 'p', auth: '', serverAddress: 'registry.test', identityToken: '', registryToken: '' } },
    response: { imageRef: 'sha256:' + 'c'.repeat(64) },
  },
  { service: 'ImageService', name: 'RemoveImage', request: { image: { image: 'registry.test/app:1' } }, response: {} },
  { service: 'ImageService', name: 'ImageFsInfo', request: {}, response: { imageFilesystems: [{ timestamp: 1700000000000000000, fsId: { mountpoint: '/var/lib/containers/storage' }, usedBytes: { value: 3 * 2 ** 32 }, inodesUsed: { value: 12 } }] } },
];

describe('the CRI wire format', () => {
  test('proto/cri-image.json is the descriptor of proto/cri-image.proto (else run node scripts/proto-json.ts)', async () => {
    assert.equal(await readFile(JSON_FILE, 'utf8'), await descriptorJson());
  });

  for (const c of CASES) {
    test(`${c.service}.${c.name}${c.what ?? ''}: the same path, bytes and objects as @grpc/proto-loader's`, () => {
      const ours = criMethod(c.service, c.name);
      const theirs = loaderMethod(c.service, c.name);
      assert.equal(ours.path, theirs.path);
      const req = ours.serialize(c.request);
      assert.ok(Buffer.isBuffer(req));
      assert.deepEqual(req, theirs.requestSerialize(c.request));
      const res = theirs.responseSerialize(c.response);
      assert.deepEqual(ours.deserialize(res), theirs.responseDeserialize(res));
    });
  }

  test('an ImageStatus answer keeps a size above 2^32, the pinned flag and the runtime handler', () => {
    const m = criMethod('ImageService', 'ImageStatus');
    const bytes = loaderMethod('ImageService', 'ImageStatus').responseSerialize({ image });
    const out = m.deserialize(bytes) as { image: { size: number; pinned: boolean; repoDigests: string[]; spec: { runtimeHandler: string } } };
    assert.equal(out.image.size, 2 ** 40 + 5);
    assert.equal(out.image.pinned, true);
    assert.deepEqual(out.image.repoDigests, image.repoDigests);
    assert.equal(out.image.spec.runtimeHandler, 'kata');
  });

  test('an unknown method is an error that names the file', () => {
    assert.throws(() => criMethod('ImageService', 'ListContainers'), /no method ListContainers in proto\/cri-image\.json/);
  });
});
