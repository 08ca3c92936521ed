// The reference grammar against two corpora in test/fixtures/references:
//   good.txt: one reference per line, verbatim;
//   bad.txt:  one JSON array per line, ["<reference>", "<fragment of the expected error>"],
//             JSON so that newlines, tabs and control characters can be written.
// In both, lines starting with "#" and blank lines are comments.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import * as path from 'node:path';
import { isValidReference, MAX_REFERENCE_LENGTH, parseReference, quote, REFERENCE_PATTERN } from '../../src/api/reference.ts';

const dir = path.join(import.meta.dirname, '..', 'fixtures', 'references');

function corpusLines(file: string): string[] {
  return readFileSync(path.join(dir, file), 'utf8')
    .split('\n')
    .filter((l) => l.trim() !== '' && !l.startsWith('#'));
}

const good = corpusLines('good.txt');
const bad = corpusLines('bad.txt').map((l) => {
  const v = JSON.parse(l) as unknown;
  assert.ok(Array.isArray(v) && v.length === 2 && typeof v[0] === 'string' && typeof v[1] === 'string', `bad.txt line is not ["ref", "fragment"]: ${l}`);
  return { ref: v[0] as string, expect: v[1] as string };
});
const patternRe = new RegExp(REFERENCE_PATTERN);
const HEX = '3ddd18007da0e2a1e7da24b251a2d691f53a918f9e2dedf116c0bd39de1149fe';

describe('reference grammar: good corpus', () => {
  test('the corpus is not trivially small', () => {
    assert.ok(good.length >= 10);
  });
  for (const ref of good) {
    test(`accepts ${ref.length > 90 ? ref.slice(0, 90) + '…' : ref}`, () => {
      const r = parseReference(ref);
      assert.ok(r.ok, r.ok ? '' : r.error);
      assert.equal(r.value.reference, ref);
      // The parts put back together give the reference.
      assert.equal(`${r.value.host}/${r.value.path}@${r.value.digest}`, ref);
      assert.match(r.value.digest, /^sha256:[a-f0-9]{64}$/);
      assert.ok(isValidReference(ref));
      // The CRD's pattern says the same as the parser.
      assert.ok(patternRe.test(ref));
    });
  }
  test('the longest allowed name (255 characters) is in the corpus and accepted', () => {
    const longest = good.find((r) => r.length === MAX_REFERENCE_LENGTH);
    assert.ok(longest, 'good.txt lacks a reference of the maximum length');
    assert.equal(longest.indexOf('@'), 255);
  });
});

describe('reference grammar: bad corpus', () => {
  test('the corpus is not trivially small', () => {
    assert.ok(bad.length >= 30);
  });
  for (const { ref, expect } of bad) {
    test(`refuses ${quote(ref, 70)}: ${expect}`, () => {
      const r = parseReference(ref);
      assert.equal(r.ok, false, `accepted ${quote(ref)}`);
      if (r.ok) return;
      assert.ok(r.error.includes(expect), `error ${quote(r.error, 400)} does not contain ${quote(expect)}`);
      // Messages end up in logs and status JSON: never a raw line break from the input.
      assert.ok(!/[\n\r\u0000]/.test(r.error), 'error carries raw control characters');
      assert.equal(isValidReference(ref), false);
      // The CRD bounds the length with maxLength, the rest with the pattern.
      if (ref.length <= MAX_REFERENCE_LENGTH) assert.equal(patternRe.test(ref), false, 'the CRD pattern accepts what the parser refuses');
    });
  }
});

describe('reference grammar: specific cases', () => {
  test('splits host (with port) and path', () => {
    const r = parseReference(`localhost:5000/team/app@sha256:${HEX}`);
    assert.ok(r.ok);
    assert.deepEqual(r.value, { reference: `localhost:5000/team/app@sha256:${HEX}`, host: 'localhost:5000', path: 'team/app', digest: `sha256:${HEX}` });
  });

  test('the error names the reference, quoted', () => {
    const r = parseReference('quay.io/org/app:1.2');
    assert.equal(r.ok, false);
    if (!r.ok) assert.ok(r.error.startsWith('"quay.io/org/app:1.2" '), r.error);
  });

  test('the TOML-injection attempt is refused and its text is quoted, not spliced, into the error', () => {
    const evil = `quay.io/org/app@sha256:${HEX}"]\n[crio.runtime]\ndefault_runtime = "evil"\n#`;
    const r = parseReference(evil);
    assert.equal(r.ok, false);
    if (r.ok) return;
    assert.ok(!r.error.includes('\n'));
    assert.ok(r.error.includes('\\n[crio.runtime]'), r.error);
  });

  test('a very long reference is quoted shortened in the error', () => {
    const r = parseReference('quay.io/' + 'a'.repeat(5000));
    assert.equal(r.ok, false);
    if (!r.ok) {
      assert.match(r.error, /is 5008 characters long; at most 327 are allowed/);
      assert.ok(r.error.length < 200);
    }
  });

  test('non-strings are refused', () => {
    for (const v of [undefined, null, 42, {}, ['quay.io/a@sha256:' + HEX]]) {
      const r = parseReference(v);
      assert.deepEqual(r, { ok: false, error: 'must be a string' });
    }
  });

  test('quote() cuts and escapes', () => {
    assert.equal(quote('a"b\nc'), '"a\\"b\\nc"');
    assert.equal(quote('abcdef', 3), '"abc…"');
  });
});
