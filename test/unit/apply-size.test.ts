// The size client-side `kubectl apply` makes an object's annotations, checked
// against the API server stand-in's limit on annotations (the real server's
// 256 KiB): the object as kubectl would send it is refused exactly when
// `pinset validate` warns.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { clientSideApplySize, clientSideApplyWarning, goJson, LAST_APPLIED_ANNOTATION, MAX_ANNOTATIONS_BYTES } from '../../src/api/apply-size.ts';
import { API_VERSION, KIND } from '../../src/api/types.ts';
import { ApiServer, KubeStatusError, type KubeObject } from '../support/apiserver.ts';

const H = '3ddd18007da0e2a1e7da24b251a2d691f53a918f9e2dedf116c0bd39de1149fe';

function setWith(n: number, annotations?: Record<string, string>): KubeObject {
  return {
    apiVersion: API_VERSION,
    kind: KIND,
    metadata: { name: `set-${n}`, ...(annotations ? { annotations } : {}) },
    spec: { pinnedImages: Array.from({ length: n }, (_, i) => ({ name: `quay.io/org/c${i}@sha256:${H}` })) },
  };
}

/** The object as client-side kubectl apply sends it. */
function asKubectlApplies(obj: KubeObject): KubeObject {
  const annotations = { ...(obj.metadata.annotations ?? {}) };
  delete annotations[LAST_APPLIED_ANNOTATION];
  const encoded = goJson({ ...obj, metadata: { ...obj.metadata, annotations } }) + '\n';
  return { ...obj, metadata: { ...obj.metadata, annotations: { ...annotations, [LAST_APPLIED_ANNOTATION]: encoded } } };
}

describe('client-side apply size', () => {
  test('Go JSON: sorted keys, HTML characters escaped, as kubectl writes the annotation', () => {
    assert.equal(goJson({ b: 1, a: ['<x&y>', null, true], c: { z: 'é' } }), '{"a":["\\u003cx\\u0026y\\u003e",null,true],"b":1,"c":{"z":"é"}}');
    const size = clientSideApplySize({ kind: 'K', metadata: { name: 'n' } });
    const expected = '{"kind":"K","metadata":{"annotations":{},"name":"n"}}\n';
    assert.equal(size.lastAppliedBytes, expected.length);
    assert.equal(size.annotationsBytes, LAST_APPLIED_ANNOTATION.length + expected.length);
  });

  test('refused by the API server exactly when pinset validate warns', async () => {
    const server = await ApiServer.start();
    try {
      // Find the largest set kubectl could apply client-side.
      let lo = 1;
      let hi = 5000;
      while (lo < hi) {
        const mid = Math.ceil((lo + hi) / 2);
        if (clientSideApplySize(setWith(mid)).annotationsBytes <= MAX_ANNOTATIONS_BYTES) lo = mid;
        else hi = mid - 1;
      }
      assert.ok(lo > 1000 && lo < 3000, `the limit falls at ${lo} images`);
      assert.equal(clientSideApplyWarning(setWith(lo)), null);
      assert.doesNotThrow(() => server.create(asKubectlApplies(setWith(lo))));
      assert.match(clientSideApplyWarning(setWith(lo + 1)) ?? '', /kubectl apply --server-side/);
      assert.throws(
        () => server.create(asKubectlApplies(setWith(lo + 1))),
        (e: unknown) => e instanceof KubeStatusError && e.code === 422 && /metadata\.annotations: Too long/.test(e.message),
      );
      // Without the annotation (server-side apply, kubectl create) the same set is accepted.
      assert.doesNotThrow(() => server.create(setWith(lo + 1)));
      // Annotations the set already carries count too.
      const withNote = setWith(lo, { 'example.com/note': 'x'.repeat(2000) });
      assert.match(clientSideApplyWarning(withNote) ?? '', /too large/);
      assert.throws(() => server.create({ ...asKubectlApplies(withNote), metadata: { ...asKubectlApplies(withNote).metadata, name: 'noted' } }), KubeStatusError);
    } finally {
      await server.stop();
    }
  });
});
