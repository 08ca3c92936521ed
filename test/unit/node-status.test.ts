// The node status annotation's formats: version 2 as agents write it
// (compact, bounded) and the reader of versions 1 and 2, which must give
// the same answer for the same report whichever agent wrote it.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { encodedSize, encodeNodeStatus, parseNodeStatus, readNodeStatus } from '../../src/api/node-status.ts';
import { makeNodeStatus } from '../../src/agent/status.ts';
import { STATUS_ANNOTATION, STATUS_MAX_BYTES, type NodeSetStatus, type NodeStatus } from '../../src/api/types.ts';
import { typicalSets, worstCaseSets, PIN_FILE } from '../support/node-status-samples.ts';

/** The same report in version 1, as an agent of that version wrote it. */
function asV1(status: NodeStatus): string {
  return JSON.stringify({ ...status, version: 1, node: status.node ?? 'node-1' });
}

const degraded: NodeSetStatus = {
  name: 'edge-apps',
  uid: '5f0c7d38-6a3e-4c0e-9f43-2b1f5d9e8a71',
  source: 'api',
  desiredGeneration: 4,
  currentGeneration: 3,
  lastFailedGeneration: 4,
  lastFailedGenerationError: 'ImageNotFound: registry quay.io has no image quay.io/org/app@sha256:… (retrying)',
  images: { wanted: 12, present: 11, pinned: 12, failed: 1, invalid: 0 },
  phase: 'Degraded',
  reason: 'ImageNotFound',
  message: 'registry quay.io has no image quay.io/org/app@sha256:… (retrying)',
};
const recovered: NodeSetStatus = {
  name: 'boot',
  source: 'static',
  desiredGeneration: 1,
  currentGeneration: 1,
  lastFailedGeneration: 1,
  lastFailedGenerationError: 'RegistryUnavailable: registry quay.io could not be reached',
  images: { wanted: 3, present: 3, pinned: 3, failed: 0, invalid: 0 },
  phase: 'Ready',
  reason: 'AllImagesPinned',
};
const pulling: NodeSetStatus = {
  name: 'upgrade-workers',
  uid: '0b6e1c2a-0d7b-4c56-9a51-3e8f0b2d7c11',
  source: 'api',
  desiredGeneration: 2,
  currentGeneration: 0,
  images: { wanted: 412, present: 120, pinned: 412, failed: 0, invalid: 0 },
  estimatedBytes: 13207024435,
  phase: 'Progressing',
  reason: 'WaitingForRolloutSlot',
  message: 'waiting for a rollout slot: at most 50 node(s) download this set at a time; 120 of 412 images present',
};

function status(sets: NodeSetStatus[]): NodeStatus {
  return { version: 2, node: 'node-1', pinFile: PIN_FILE, updatedAt: '2026-11-21T10:04:05.123Z', sets };
}

describe('version 2: what agents write', () => {
  test('reads back to the same report (the node name, which the annotation\'s Node already has, aside)', () => {
    const s = status([degraded, recovered, pulling, ...typicalSets(3)]);
    const read = parseNodeStatus(encodeNodeStatus(s));
    assert.equal(read.error, undefined);
    assert.deepEqual(read.status, { version: 2, pinFile: PIN_FILE, updatedAt: '2026-11-21T10:04:05Z', sets: s.sets });
  });

  test('short keys, defaults left out: a Ready set is its name, uid, generation, phase, counts and total bytes', () => {
    const [ready] = typicalSets(1);
    const doc = JSON.parse(encodeNodeStatus(status([ready!, degraded, recovered])));
    assert.deepEqual(Object.keys(doc), ['version', 'pinFile', 'updatedAt', 'sets']);
    assert.equal(doc.version, 2);
    assert.deepEqual(doc.sets[0], { name: ready!.name, uid: ready!.uid, gen: ready!.desiredGeneration, phase: 'Ready', images: [ready!.images.wanted, ready!.images.wanted, ready!.images.wanted], bytes: [ready!.bytes!.total] });
    // A set failing now carries its message once: failedGen and error are its defaults.
    assert.deepEqual(doc.sets[1], {
      name: 'edge-apps', uid: degraded.uid, gen: 4, done: 3, phase: 'Degraded', reason: 'ImageNotFound', message: degraded.message, images: [12, 11, 12, 1],
    });
    // A set that failed before and is Ready now keeps the failure, written out.
    assert.deepEqual(doc.sets[2], { name: 'boot', source: 'static', gen: 1, phase: 'Ready', images: [3, 3, 3], failedGen: 1, error: recovered.lastFailedGenerationError });
  });

  test('an error that is not the message, or an older failed generation, is written out', () => {
    const other = { ...degraded, lastFailedGeneration: 3, lastFailedGenerationError: 'Unauthorized: something else' };
    const doc = JSON.parse(encodeNodeStatus(status([other])));
    assert.equal(doc.sets[0].failedGen, 3);
    assert.equal(doc.sets[0].error, 'Unauthorized: something else');
    assert.deepEqual(parseNodeStatus(JSON.stringify(doc)).status?.sets, [other]);
  });

  test('10 typical sets (Ready, no errors) fit in 2 KiB; the worst case stays within 16 KiB, Degraded sets kept', () => {
    const ten = makeNodeStatus('worker-3', PIN_FILE, typicalSets(10), '2026-11-21T10:04:05.123Z');
    assert.ok(encodedSize(ten) <= 2048, `${encodedSize(ten)} bytes`);
    assert.ok(encodedSize(ten) < Buffer.byteLength(asV1(ten)), 'smaller than version 1');
    const worst = makeNodeStatus('worker-3', PIN_FILE, worstCaseSets(200), '2026-11-21T10:04:05.123Z');
    assert.ok(encodedSize(worst) <= STATUS_MAX_BYTES, `${encodedSize(worst)} bytes`);
    assert.equal(worst.truncated, true);
    assert.ok(worst.sets.length > 0 && worst.sets.every((s) => s.phase === 'Degraded'));
  });
});

describe('bytes and rate: progress in bytes, added to version 2', () => {
  const downloading: NodeSetStatus = { ...pulling, reason: 'Pulling', message: '120 of 412 images present', bytes: { present: 2201170739, total: 6603512217 }, rate: 5452595.4 };

  test('written as [present, total], or [total] when all are present; the rate in whole bytes per second; read back', () => {
    const [ready] = typicalSets(1);
    const done = { ...ready!, bytes: { present: 734003200, total: 734003200 } };
    const doc = JSON.parse(encodeNodeStatus(status([downloading, done])));
    assert.deepEqual(doc.sets[0].bytes, [2201170739, 6603512217]);
    assert.equal(doc.sets[0].rate, 5452595);
    assert.deepEqual(doc.sets[1].bytes, [734003200]);
    assert.equal(doc.sets[1].rate, undefined);
    const read = parseNodeStatus(JSON.stringify(doc));
    assert.equal(read.droppedEntries, undefined);
    assert.deepEqual(read.status?.sets, [{ ...downloading, rate: 5452595 }, done]);
  });

  test('the pull rate: whole bytes per second, read back; a malformed one left out on its own', () => {
    const doc = JSON.parse(encodeNodeStatus(status([{ ...downloading, pullRate: 9437184.6 }])));
    assert.equal(doc.sets[0].pullRate, 9437185);
    assert.deepEqual(parseNodeStatus(JSON.stringify(doc)).status?.sets, [{ ...downloading, rate: 5452595, pullRate: 9437185 }]);
    doc.sets[0].pullRate = -3;
    const read = parseNodeStatus(JSON.stringify(doc));
    assert.equal(read.status?.sets[0]!.pullRate, undefined);
    assert.equal(read.status?.sets[0]!.rate, 5452595);
  });

  test('mirrored: written only when true, read back', () => {
    const doc = JSON.parse(encodeNodeStatus(status([{ ...downloading, mirrored: true }, { ...downloading, name: 'b', mirrored: false }])));
    assert.equal(doc.sets[0].mirrored, true);
    assert.equal('mirrored' in doc.sets[1], false);
    const read = parseNodeStatus(JSON.stringify(doc)).status!.sets;
    assert.equal(read[0]!.mirrored, true);
    assert.equal(read[1]!.mirrored, undefined);
  });

  test('the version stays 2: a set without them reads as before, and with them nothing else of the set changes', () => {
    const { bytes: _b, rate: _r, ...without } = downloading;
    const withThem = parseNodeStatus(encodeNodeStatus(status([downloading]))).status!;
    const withoutThem = parseNodeStatus(encodeNodeStatus(status([without]))).status!;
    assert.equal(withThem.version, 2);
    const { bytes: _b2, rate: _r2, ...rest } = withThem.sets[0]!;
    assert.deepEqual(rest, withoutThem.sets[0]);
    assert.equal(withoutThem.sets[0]!.bytes, undefined);
  });

  test('a malformed bytes or rate is left out on its own: the set\'s entry stays', () => {
    const entry = (extra: Record<string, unknown>) => ({ name: 'a', gen: 1, phase: 'Progressing', reason: 'Pulling', images: [2, 1], ...extra });
    const raw = JSON.stringify({
      version: 2, pinFile: 'p.conf', updatedAt: 'x',
      sets: [
        entry({ bytes: [5, 3] }),
        entry({ bytes: [1, 2, 3] }),
        entry({ bytes: 'all' }),
        entry({ bytes: [-1, 2] }),
        entry({ bytes: [] }),
        entry({ rate: -1 }),
        entry({ rate: 1.5 }),
        entry({ rate: '5 MB/s', bytes: [1.5, 3] }),
      ],
    });
    const r = parseNodeStatus(raw);
    assert.equal(r.droppedEntries, undefined);
    assert.equal(r.status?.sets.length, 8);
    for (const s of r.status!.sets) {
      assert.equal(s.bytes, undefined);
      assert.equal(s.rate, undefined);
      assert.equal(s.reason, 'Pulling');
    }
  });

  test('10 typical sets with their bytes still fit in 2 KiB', () => {
    const ten = makeNodeStatus('worker-3', PIN_FILE, typicalSets(10).map((s) => ({ ...s, bytes: { present: 13207024435, total: 13207024435 } })), '2026-11-21T10:04:05.123Z');
    assert.ok(encodedSize(ten) <= 2048, `${encodedSize(ten)} bytes`);
    const busy = makeNodeStatus('worker-3', PIN_FILE, typicalSets(10).map((s) => ({ ...s, phase: 'Progressing' as const, reason: 'Pulling', bytes: { present: 2201170739, total: 13207024435 }, rate: 11811160, pullRate: 52428800, mirrored: true })), '2026-11-21T10:04:05.123Z');
    assert.ok(encodedSize(busy) <= 2048 + 512, `${encodedSize(busy)} bytes`);
  });
});

describe('the reader: versions 1 and 2 side by side', () => {
  test('the same report written by an old and a new agent reads the same', () => {
    // What both write: version 1 had no bytes.
    const s = status([degraded, recovered, pulling, ...typicalSets(2).map(({ bytes: _b, ...rest }) => rest)]);
    const v1 = parseNodeStatus(asV1(s));
    const v2 = parseNodeStatus(encodeNodeStatus(s));
    assert.equal(v1.status?.version, 1);
    assert.equal(v2.status?.version, 2);
    assert.deepEqual(v1.status?.sets, v2.status?.sets);
    assert.equal(v1.status?.node, 'node-1');
    assert.equal(v2.status?.node, undefined);
  });

  test('version 2: unknown keys are ignored (a newer agent may add some); missing defaults are filled', () => {
    const raw = JSON.stringify({
      version: 2, pinFile: 'p.conf', updatedAt: 'x', futureField: { a: 1 },
      sets: [{ name: 'a', gen: 2, phase: 'Ready', newKey: true }, { name: 'b', gen: 1, phase: 'Degraded', reason: 'NoSpace', message: 'full' }, { name: 'c', gen: 3, done: 2, phase: 'Progressing' }],
    });
    const { status: st, droppedEntries } = parseNodeStatus(raw);
    assert.equal(droppedEntries, undefined);
    assert.deepEqual(st?.sets, [
      { name: 'a', source: 'api', desiredGeneration: 2, currentGeneration: 2, images: { wanted: 0, present: 0, pinned: 0, failed: 0, invalid: 0 }, phase: 'Ready', reason: 'AllImagesPinned' },
      {
        name: 'b', source: 'api', desiredGeneration: 1, currentGeneration: 1, images: { wanted: 0, present: 0, pinned: 0, failed: 0, invalid: 0 }, phase: 'Degraded', reason: 'NoSpace', message: 'full',
        lastFailedGeneration: 1, lastFailedGenerationError: 'NoSpace: full',
      },
      { name: 'c', source: 'api', desiredGeneration: 3, currentGeneration: 2, images: { wanted: 0, present: 0, pinned: 0, failed: 0, invalid: 0 }, phase: 'Progressing', reason: '' },
    ]);
  });

  test('version 2: a malformed entry is dropped on its own, with the reason', () => {
    const raw = JSON.stringify({
      version: 2, pinFile: 'p.conf', updatedAt: 'x',
      sets: [
        { name: 'ok', gen: 1, phase: 'Ready', images: [1, 1, 1] },
        { name: '', gen: 1, phase: 'Ready' },
        { name: 'g', gen: -1, phase: 'Ready' },
        { name: 'p', gen: 1, phase: 'Unknown' },
        { name: 'i', gen: 1, phase: 'Ready', images: [1, 2, 3, 4, 5, 6] },
        { name: 'j', gen: 1, phase: 'Ready', images: [1, 'x'] },
        { name: 's', gen: 1, phase: 'Ready', source: 'elsewhere' },
        { name: 'f', gen: 1, phase: 'Ready', failedGen: 1.5 },
        'not an object',
      ],
    });
    const r = parseNodeStatus(raw);
    assert.deepEqual(r.status?.sets.map((s) => s.name), ['ok']);
    assert.deepEqual(r.droppedEntries, [
      'sets[1]: name: missing',
      'sets[2]: gen: not a non-negative integer',
      'sets[3]: phase: not Progressing, Ready or Degraded',
      'sets[4]: images: not a list of at most 5 counts',
      'sets[5]: images[1]: not a non-negative integer',
      'sets[6]: source: not "api" or "static"',
      'sets[7]: failedGen: not a non-negative integer',
      'sets[8]: not an object',
    ]);
  });

  test('a version this build does not know is an error that says to upgrade, never a throw', () => {
    const r = readNodeStatus({ [STATUS_ANNOTATION]: '{"version":3,"sets":[]}' });
    assert.equal(r.status, undefined);
    assert.match(r.error!, /format version 3; this build reads versions 1 and 2 \(upgrade pinset to read it\)/);
  });
});
