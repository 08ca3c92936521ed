import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { describeProblems, validateSet } from '../../src/api/validate.ts';

const A = 'quay.io/org/a@sha256:' + 'a'.repeat(64);
const B = 'quay.io/org/b@sha256:' + 'b'.repeat(64);

function set(spec: Record<string, unknown>, metadata: Record<string, unknown> = { name: 'web' }): Record<string, unknown> {
  return { apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata, spec };
}

describe('validateSet', () => {
  test('a valid set has no problems and lists its references in order', () => {
    const v = validateSet(set({ pinnedImages: [{ name: B }, { name: A }], runtimeHandler: 'kata', nodeSelector: { matchLabels: { a: 'b' } } }));
    assert.deepEqual(v.errors, []);
    assert.deepEqual(v.imageProblems, []);
    assert.deepEqual(
      v.images.map((i) => i.reference),
      [B, A],
    );
  });

  test('bad references are image problems with their index; the good ones stay usable', () => {
    const v = validateSet(set({ pinnedImages: [{ name: A }, { name: 'quay.io/org/app:1.2' }, { name: B }, {}] }));
    assert.deepEqual(v.errors, []);
    assert.deepEqual(
      v.images.map((i) => i.reference),
      [A, B],
    );
    assert.equal(v.imageProblems.length, 2);
    assert.equal(v.imageProblems[0]!.field, 'spec.pinnedImages[1].name');
    assert.match(v.imageProblems[0]!.error, /names a tag/);
    assert.equal(v.imageProblems[1]!.field, 'spec.pinnedImages[3].name');
    assert.match(v.imageProblems[1]!.error, /required/);
    const lines = describeProblems(v);
    assert.equal(lines.length, 2);
    assert.ok(lines[0]!.startsWith('spec.pinnedImages[1].name: "quay.io/org/app:1.2" names a tag'), lines[0]);
  });

  test('a duplicate name is a spec error (the API server refuses it as a map-list key)', () => {
    const v = validateSet(set({ pinnedImages: [{ name: A }, { name: A }] }));
    assert.equal(v.errors.length, 1);
    assert.match(v.errors[0]!, /^spec\.pinnedImages\[1\]\.name: duplicate of spec\.pinnedImages\[0\]\.name/);
    assert.equal(v.images.length, 1);
  });

  test('whole-set errors name the field', () => {
    const cases: [unknown, RegExp][] = [
      [null, /^must be an object$/],
      [{ ...set({ pinnedImages: [{ name: A }] }), apiVersion: 'v1' }, /^apiVersion: must be pinset\.dev\/v1alpha1, not "v1"$/],
      [{ ...set({ pinnedImages: [{ name: A }] }), kind: 'Pod' }, /^kind: must be PinnedImageSet/],
      [set({ pinnedImages: [{ name: A }] }, {}), /^metadata\.name: required$/],
      [set({ pinnedImages: [{ name: A }] }, { name: 'Web_1' }), /^metadata\.name: "Web_1" must be a lowercase DNS subdomain/],
      [set({ pinnedImages: [{ name: A }] }, { name: 'a'.repeat(254) }), /^metadata\.name: .* at most 253 characters/],
      [{ apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name: 'x' } }, /^spec: required$/],
      [set({}), /^spec\.pinnedImages: required/],
      [set({ pinnedImages: [] }), /^spec\.pinnedImages: must have at least 1 item$/],
      [set({ pinnedImages: [{ name: A }], runtimeHandler: 'Kata_1' }), /^spec\.runtimeHandler: "Kata_1" must be a DNS label/],
      [set({ pinnedImages: [{ name: A }], runtimeHandler: 'a'.repeat(64) }), /^spec\.runtimeHandler: /],
      [set({ pinnedImages: [{ name: A }], nodeSelector: { matchExpressions: [{ key: 'a', operator: 'In' }] } }), /^spec\.nodeSelector\.matchExpressions\[0\]\.values: must be non-empty/],
    ];
    for (const [obj, re] of cases) {
      const v = validateSet(obj);
      assert.ok(
        v.errors.some((e) => re.test(e)),
        `${JSON.stringify(obj)?.slice(0, 120)}: ${JSON.stringify(v.errors)} has nothing matching ${re}`,
      );
    }
  });

  test('more than 5000 images is a spec error', () => {
    const many = Array.from({ length: 5001 }, (_, i) => ({ name: `quay.io/org/a${i}@sha256:${'c'.repeat(64)}` }));
    const v = validateSet(set({ pinnedImages: many }));
    assert.ok(v.errors.includes('spec.pinnedImages: has 5001 items; at most 5000 are allowed'), JSON.stringify(v.errors));
    const ok = validateSet(set({ pinnedImages: many.slice(0, 5000) }));
    assert.deepEqual(ok.errors, []);
  });
});
