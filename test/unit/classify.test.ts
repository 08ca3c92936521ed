import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Metadata, status as Status, type ServiceError } from '@grpc/grpc-js';
import { classifyGrpcError, classifyMessage, isRuntimeDown } from '../../src/cri/classify.ts';
import { RuntimeError, type FailureKind } from '../../src/cri/runtime.ts';

function grpcError(code: Status, details: string): ServiceError {
  return Object.assign(new Error(`${code} ${Status[code]}: ${details}`), { code, details, metadata: new Metadata() });
}

const REF = 'quay.io/org/app@sha256:' + 'a'.repeat(64);

describe('classifyMessage: registry answers as runtimes word them', () => {
  const cases: [string, FailureKind][] = [
    // containerd
    [`failed to pull and unpack image "${REF}": failed to resolve reference "${REF}": unexpected status from HEAD request to https://quay.io/v2/org/app/manifests/sha256:aa: 401 Unauthorized`, 'Unauthorized'],
    [`failed to resolve reference "${REF}": pull access denied, repository does not exist or may require authorization: server message: insufficient_scope: authorization failed`, 'Unauthorized'],
    [`failed to resolve reference "${REF}": ${REF}: not found`, 'NotFound'],
    [`failed to do request: Head "https://quay.io/v2/org/app/manifests/sha256:aa": dial tcp 127.0.0.1:443: connect: connection refused`, 'Unavailable'],
    ['dial tcp: lookup quay.io on 10.0.0.10:53: no such host', 'Unavailable'],
    ['failed to copy: httpReadSeeker: failed open: unexpected EOF', 'Unavailable'],
    ['unexpected status code 503 Service Unavailable', 'Unavailable'],
    ['net/http: TLS handshake timeout', 'Unavailable'],
    ['failed to extract layer: write /var/lib/containerd/tmpmounts/x: no space left on device', 'NoSpace'],
    // CRI-O (containers/image)
    ['reading manifest sha256:aa in quay.io/org/app: manifest unknown', 'NotFound'],
    ['reading manifest sha256:aa in quay.io/org/app: unauthorized: access to the requested resource is not authorized', 'Unauthorized'],
    ['initializing source docker://quay.io/org/app@sha256:aa: reading manifest: denied: requested access to the resource is denied', 'Unauthorized'],
    ['writing blob: storing blob to file "/var/tmp/x": write /var/tmp/x: no space left on device', 'NoSpace'],
    ['pinging container registry quay.io: received unexpected HTTP status: 502 Bad Gateway', 'Unavailable'],
    ['something nobody anticipated', 'Other'],
    ['http: server gave HTTP response to HTTPS client', 'Other'],
  ];
  for (const [message, kind] of cases) {
    test(`${kind}: ${message.slice(0, 80)}`, () => {
      assert.equal(classifyMessage(message), kind);
    });
  }

  test('no space wins over anything else in the same message', () => {
    assert.equal(classifyMessage('401 Unauthorized ... no space left on device'), 'NoSpace');
  });
});

describe('classifyGrpcError', () => {
  const cases: [Status, string, FailureKind][] = [
    [Status.UNKNOWN, 'failed to pull: 401 Unauthorized', 'Unauthorized'],
    [Status.UNKNOWN, 'dial tcp: connection refused', 'Unavailable'],
    [Status.NOT_FOUND, 'image not known', 'NotFound'],
    [Status.UNAVAILABLE, 'No connection established', 'Unavailable'],
    [Status.DEADLINE_EXCEEDED, 'Deadline exceeded', 'Unavailable'],
    [Status.CANCELLED, 'Cancelled on client', 'Canceled'],
    [Status.UNAUTHENTICATED, 'who are you', 'Unauthorized'],
    [Status.PERMISSION_DENIED, 'no', 'Unauthorized'],
    [Status.RESOURCE_EXHAUSTED, 'disk full', 'NoSpace'],
    [Status.RESOURCE_EXHAUSTED, 'too many requests: 503 Service Unavailable', 'Unavailable'],
    [Status.INTERNAL, 'weird', 'Other'],
  ];
  for (const [code, details, kind] of cases) {
    test(`${Status[code]} "${details}" is ${kind}`, () => {
      const e = classifyGrpcError(grpcError(code, details), 'PullImage');
      assert.ok(e instanceof RuntimeError);
      assert.equal(e.kind, kind);
      assert.equal(e.code, code);
      assert.equal(e.message, `PullImage: ${Status[code]}: ${details}`);
    });
  }

  test('a very long message is cut', () => {
    const e = classifyGrpcError(grpcError(Status.UNKNOWN, 'x'.repeat(10_000)), 'PullImage');
    assert.ok(e.message.length < 2100);
  });

  test('isRuntimeDown: only when the runtime socket itself failed', () => {
    assert.equal(isRuntimeDown(classifyGrpcError(grpcError(Status.UNAVAILABLE, 'connect ENOENT'), 'ListImages')), true);
    assert.equal(isRuntimeDown(classifyGrpcError(grpcError(Status.DEADLINE_EXCEEDED, 'deadline'), 'ListImages')), true);
    assert.equal(isRuntimeDown(classifyGrpcError(grpcError(Status.UNKNOWN, 'connection refused'), 'PullImage')), false, 'the registry is down, not the runtime');
    assert.equal(isRuntimeDown(new Error('x')), false);
  });
});
