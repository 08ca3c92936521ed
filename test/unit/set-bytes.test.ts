// What an agent reports of a set's download on its node (`bytes`, `rate`),
// from the blobs of its images and what the runtime holds.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { setBytes, SetRates } from '../../src/api/set-bytes.ts';

const blobs = (o: Record<string, number>) => new Map(Object.entries(o));

describe('setBytes', () => {
  test('total of the distinct blobs; present of those a present image holds; a shared layer counts once', () => {
    const base = { 'sha256:base': 1000 };
    const images = [
      { blobs: blobs({ ...base, 'sha256:app-config': 10, 'sha256:app': 500 }), present: true },
      { blobs: blobs({ ...base, 'sha256:db-config': 20, 'sha256:db': 2000 }), present: false },
      { blobs: blobs({ 'sha256:tool-config': 5, 'sha256:tool': 300 }), present: false },
    ];
    assert.deepEqual(setBytes(images), { present: 1510, total: 3835 });
  });

  test('bytes still arriving count for their blob, never more than its size; a blob already held is not counted twice', () => {
    const images = [
      { blobs: blobs({ 'sha256:a': 100, 'sha256:b': 200 }), present: false },
      { blobs: blobs({ 'sha256:b': 200, 'sha256:c': 50 }), present: true },
    ];
    const arriving = new Map([
      ['sha256:a', 40],
      ['sha256:b', 150],
      ['sha256:x', 999],
    ]);
    assert.deepEqual(setBytes(images, arriving), { present: 40 + 200 + 50, total: 350 });
    assert.deepEqual(setBytes(images, new Map([['sha256:a', 5000]])), { present: 350, total: 350 });
    assert.deepEqual(setBytes(images, new Map([['sha256:a', -3]])), { present: 250, total: 350 });
  });

  test('unknown when the size of any image is unknown: a part of the total would mislead', () => {
    assert.equal(setBytes([{ blobs: blobs({ 'sha256:a': 1 }), present: true }, { blobs: undefined, present: false }]), undefined);
  });

  test('all present: present equals total', () => {
    assert.deepEqual(setBytes([{ blobs: blobs({ 'sha256:a': 7, 'sha256:b': 8 }), present: true }]), { present: 15, total: 15 });
  });
});

describe('SetRates', () => {
  test('a set downloading has the rate of its bytes over the window; none before two reports, none once all is present', () => {
    const r = new SetRates(60_000);
    assert.equal(r.observe('api/a', { present: 0, total: 1000 }, 0), undefined);
    assert.equal(r.observe('api/a', { present: 300, total: 1000 }, 10_000), 30);
    assert.equal(r.observe('api/a', { present: 1000, total: 1000 }, 20_000), undefined);
  });

  test('each set on its own; retain forgets the sets no longer reported', () => {
    const r = new SetRates(60_000);
    r.observe('api/a', { present: 0, total: 10 }, 0);
    r.observe('api/b', { present: 0, total: 10 }, 0);
    assert.equal(r.observe('api/b', { present: 5, total: 10 }, 5_000), 1);
    r.retain(new Set(['api/a']));
    assert.equal(r.observe('api/b', { present: 6, total: 10 }, 6_000), undefined, 'b starts over');
    assert.equal(r.observe('api/a', { present: 2, total: 10 }, 2_000), 1);
  });

  test('the pull rate counts the time from an observation with a pull running to the next, not the waits between pulls', () => {
    const r = new SetRates(60_000);
    const b = (present: number) => ({ present, total: 10_000 });
    r.observe('api/a', b(0), 0, false);
    assert.equal(r.pullRate('api/a', b(0)), undefined, 'no pull yet');
    // Waits 10 s, pulls an image of 2000 bytes in 1 s (its landing ends the pull), waits 10 s, pulls the next in 1 s.
    r.observe('api/a', b(0), 10_000, true);
    r.observe('api/a', b(2000), 11_000, false);
    r.observe('api/a', b(2000), 21_000, true);
    assert.equal(r.observe('api/a', b(4000), 22_000, false), 4000 / 22, 'the rate over the window counts the waits');
    assert.equal(r.pullRate('api/a', b(4000)), 2000, '4000 bytes over the 2 s pulls ran');
    assert.equal(r.pullRate('api/a', { present: 10_000, total: 10_000 }), undefined, 'none once all is present');
  });

  test('the pull rate forgets pulls older than the window, and starts over when the bytes go down', () => {
    const r = new SetRates(60_000);
    const b = (present: number) => ({ present, total: 100_000 });
    r.observe('api/a', b(0), 0, true);
    r.observe('api/a', b(1000), 1_000, false);
    r.observe('api/a', b(1000), 100_000, true);
    r.observe('api/a', b(5000), 101_000, true);
    assert.equal(r.pullRate('api/a', b(5000)), 4000, 'the pull at 0-1 s is out of the window');
    r.observe('api/a', b(0), 102_000, true);
    assert.equal(r.pullRate('api/a', b(0)), undefined, 'a new generation: nothing measured yet');
  });
});
