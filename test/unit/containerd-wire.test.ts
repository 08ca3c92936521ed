// The agent's wire format for containerd's Images and Content services
// (src/containerd/wire.ts, from proto/containerd-images.json and
// proto/containerd-content.json) against the .protos as @grpc/proto-loader
// reads them (what the containerd twin and the tests' own clients use): each
// descriptor is its .proto's, every message has the same bytes and the same
// object, and the field numbers are containerd's
// (api/services/images/v1/images.proto, api/types/descriptor.proto,
// api/services/content/v1/content.proto).
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { describe, test } from 'node:test';
import protobuf from 'protobufjs';
import { CONTAINERD_CONTENT_JSON_FILE, CONTAINERD_CONTENT_PROTO_FILE, CONTAINERD_JSON_FILE, CONTAINERD_PROTO_FILE, descriptorJson } from '../../scripts/proto-json.ts';
import { contentMethod, imagesMethod, type ContentMethodName, type ImagesMethodName } from '../../src/containerd/wire.ts';
import { containerdContentDefinition, containerdDefinition } from '../support/containerd-proto.ts';

const loaded = containerdDefinition();
function loaderMethod(name: ImagesMethodName): any {
  return (loaded['containerd.services.images.v1.Images'] as any)[name];
}

const record = {
  name: 'registry.test/app@sha256:' + 'b'.repeat(64),
  labels: { 'io.cri-containerd.image': 'managed', 'io.cri-containerd.pinned': 'pinned' },
  target: { mediaType: 'application/vnd.oci.image.manifest.v1+json', digest: 'sha256:' + 'b'.repeat(64), size: 2 ** 33 + 7, annotations: { a: 'b' } },
  createdAt: { seconds: 1_700_000_000, nanos: 5 },
  updatedAt: { seconds: 1_700_000_001, nanos: 0 },
};

const CASES: { name: ImagesMethodName; request: object; response: object; what?: string }[] = [
  { name: 'Get', request: { name: record.name }, response: { image: record } },
  { name: 'Get', request: { name: 'sha256:' + 'c'.repeat(64) }, response: {}, what: ' (no image)' },
  { name: 'List', request: { filters: ['labels."pinset.dev/pinned"', 'name==x'] }, response: { images: [record, { ...record, labels: {} }] } },
  { name: 'Update', request: { image: { name: record.name, labels: { 'io.cri-containerd.pinned': '' }, target: record.target }, updateMask: { paths: ['labels.io.cri-containerd.pinned'] } }, response: { image: record } },
];

describe("containerd's Images service on the wire", () => {
  test('proto/containerd-images.json is the descriptor of proto/containerd-images.proto (else run node scripts/proto-json.ts)', async () => {
    assert.equal(await readFile(CONTAINERD_JSON_FILE, 'utf8'), await descriptorJson(CONTAINERD_PROTO_FILE));
  });

  for (const c of CASES) {
    test(`Images.${c.name}${c.what ?? ''}: the same path, bytes and objects as @grpc/proto-loader's`, () => {
      const ours = imagesMethod(c.name);
      const theirs = loaderMethod(c.name);
      assert.equal(ours.path, `/containerd.services.images.v1.Images/${c.name}`);
      assert.equal(ours.path, theirs.path);
      const req = ours.serialize(c.request);
      assert.deepEqual(req, theirs.requestSerialize(c.request));
      const res = theirs.responseSerialize(c.response);
      assert.deepEqual(ours.deserialize(res), theirs.responseDeserialize(res));
    });
  }

  test("field numbers are containerd's: Image{name=1, labels=2, target=3, created_at=7, updated_at=8}, Descriptor{media_type=1, digest=2, size=3, annotations=5}", async () => {
    const json = JSON.parse(await readFile(CONTAINERD_JSON_FILE, 'utf8'));
    const r = protobuf.Root.fromJSON(json);
    const ids = (type: string) => Object.fromEntries(Object.entries(r.lookupType(type).fields).map(([k, f]) => [k, f.id]));
    assert.deepEqual(ids('containerd.services.images.v1.Image'), { name: 1, labels: 2, target: 3, createdAt: 7, updatedAt: 8 });
    assert.deepEqual(ids('containerd.types.Descriptor'), { mediaType: 1, digest: 2, size: 3, annotations: 5 });
    assert.deepEqual(ids('containerd.services.images.v1.GetImageRequest'), { name: 1 });
    assert.deepEqual(ids('containerd.services.images.v1.GetImageResponse'), { image: 1 });
    assert.deepEqual(ids('containerd.services.images.v1.UpdateImageRequest'), { image: 1, updateMask: 2 });
    assert.deepEqual(ids('containerd.services.images.v1.UpdateImageResponse'), { image: 1 });
    assert.deepEqual(ids('containerd.services.images.v1.ListImagesRequest'), { filters: 1 });
    assert.deepEqual(ids('containerd.services.images.v1.ListImagesResponse'), { images: 1 });
    assert.deepEqual(ids('google.protobuf.FieldMask'), { paths: 1 });
    assert.deepEqual(ids('google.protobuf.Timestamp'), { seconds: 1, nanos: 2 });
  });

  test('an Update request carries the target on the wire (field 3 of the image): a decoded request still has it', () => {
    const bytes = imagesMethod('Update').serialize({ image: { name: 'n', labels: { k: 'v' }, target: record.target }, updateMask: { paths: ['labels.k'] } });
    const back = loaderMethod('Update').requestDeserialize(bytes);
    assert.equal(back.image.target.digest, record.target.digest);
    assert.equal(back.image.target.size, record.target.size);
    assert.deepEqual(back.updateMask.paths, ['labels.k']);
  });
});

describe("containerd's Content service on the wire", () => {
  const theirs = (name: ContentMethodName): any => (containerdContentDefinition()['containerd.services.content.v1.Content'] as any)[name];
  const digest = 'sha256:' + 'd'.repeat(64);
  const status = { startedAt: { seconds: 1_700_000_000, nanos: 1 }, updatedAt: { seconds: 1_700_000_002, nanos: 0 }, ref: `layer-${digest}`, offset: 2 ** 33 + 5, total: 2 ** 34, expected: '' };
  const cases: { name: ContentMethodName; request: object; response: object; what?: string }[] = [
    { name: 'ListStatuses', request: { filters: [] }, response: { statuses: [status, { ...status, ref: 'config-x', offset: 0, total: 0 }] } },
    { name: 'ListStatuses', request: { filters: ['ref~=layer'] }, response: {}, what: ' (no ingest)' },
    { name: 'Info', request: { digest }, response: { info: { digest, size: 2 ** 34, createdAt: { seconds: 1, nanos: 2 }, updatedAt: { seconds: 3, nanos: 4 } } } },
  ];

  test('proto/containerd-content.json is the descriptor of proto/containerd-content.proto (else run node scripts/proto-json.ts)', async () => {
    assert.equal(await readFile(CONTAINERD_CONTENT_JSON_FILE, 'utf8'), await descriptorJson(CONTAINERD_CONTENT_PROTO_FILE));
  });

  for (const c of cases) {
    test(`Content.${c.name}${c.what ?? ''}: the same path, bytes and objects as @grpc/proto-loader's`, () => {
      const ours = contentMethod(c.name);
      assert.equal(ours.path, `/containerd.services.content.v1.Content/${c.name}`);
      assert.equal(ours.path, theirs(c.name).path);
      assert.deepEqual(ours.serialize(c.request), theirs(c.name).requestSerialize(c.request));
      const res = theirs(c.name).responseSerialize(c.response);
      assert.deepEqual(ours.deserialize(res), theirs(c.name).responseDeserialize(res));
    });
  }

  test("field numbers are containerd's: Status{started_at=1, updated_at=2, ref=3, offset=4, total=5, expected=6}, Info{digest=1, size=2, created_at=3, updated_at=4}", async () => {
    const r = protobuf.Root.fromJSON(JSON.parse(await readFile(CONTAINERD_CONTENT_JSON_FILE, 'utf8')));
    const ids = (type: string) => Object.fromEntries(Object.entries(r.lookupType(type).fields).map(([k, f]) => [k, f.id]));
    assert.deepEqual(ids('containerd.services.content.v1.Status'), { startedAt: 1, updatedAt: 2, ref: 3, offset: 4, total: 5, expected: 6 });
    assert.deepEqual(ids('containerd.services.content.v1.Info'), { digest: 1, size: 2, createdAt: 3, updatedAt: 4 });
    assert.deepEqual(ids('containerd.services.content.v1.InfoRequest'), { digest: 1 });
    assert.deepEqual(ids('containerd.services.content.v1.InfoResponse'), { info: 1 });
    assert.deepEqual(ids('containerd.services.content.v1.ListStatusesRequest'), { filters: 1 });
    assert.deepEqual(ids('containerd.services.content.v1.ListStatusesResponse'), { statuses: 1 });
  });
});
