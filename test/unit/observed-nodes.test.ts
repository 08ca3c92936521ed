import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { encodeNodeStatus, readNodeStatus } from '../../src/api/node-status.ts';
import { STATUS_ANNOTATION, type NodeSetStatus } from '../../src/api/types.ts';
import { changedSetNames, compactReading, observeNode, SharedValues } from '../../src/controller/observed-nodes.ts';
import { rollUpSetStatus } from '../../src/controller/rollup.ts';

const UID = '5f0c7e0e-0000-4000-8000-000000000001';

function entry(over: Partial<NodeSetStatus> = {}): NodeSetStatus {
  return {
    name: 'upgrade',
    uid: UID,
    source: 'api',
    desiredGeneration: 3,
    currentGeneration: 3,
    images: { wanted: 40, present: 40, pinned: 40, failed: 0, invalid: 0 },
    estimatedBytes: 1234,
    phase: 'Ready',
    reason: 'AllImagesPinned',
    message: 'all 40 images present and pinned',
    ...over,
  };
}

const annotations = (sets: NodeSetStatus[]) => ({ [STATUS_ANNOTATION]: JSON.stringify({ version: 1, node: 'n', pinFile: 'x.conf', updatedAt: '2025-03-01T10:00:00Z', sets }) });

describe('what the controller keeps of a Node', () => {
  test('of a whole Node: its name, resourceVersion, labels and the report; nothing of status, spec or other metadata', () => {
    const node = {
      apiVersion: 'v1',
      kind: 'Node',
      metadata: {
        name: 'n1',
        resourceVersion: '42',
        uid: 'u',
        labels: { role: 'worker' },
        annotations: { ...annotations([entry()]), 'node.alpha.kubernetes.io/ttl': '0' },
        managedFields: [{ manager: 'kubelet' }],
      },
      spec: { podCIDR: '10.0.0.0/24' },
      status: { images: [{ names: ['a'], sizeBytes: 1 }] },
    };
    const kept = observeNode(node, new SharedValues());
    assert.deepEqual(Object.keys(kept).sort(), ['labels', 'metadata', 'name', 'reading']);
    assert.deepEqual(kept.metadata, { name: 'n1', resourceVersion: '42' });
    assert.deepEqual(kept.labels, { role: 'worker' });
    assert.deepEqual(kept.reading, {
      status: { sets: [{ name: 'upgrade', uid: UID, source: 'api', desiredGeneration: 3, currentGeneration: 3, phase: 'Ready', reason: 'AllImagesPinned', images: { wanted: 40, present: 40, pinned: 40, failed: 0, invalid: 0 } }] },
    });
  });

  test('a Degraded entry keeps its messages (the roll-up quotes them); an unreadable annotation keeps its error', () => {
    const pool = new SharedValues();
    const degraded = entry({ phase: 'Degraded', reason: 'ImageNotFound', lastFailedGeneration: 3, lastFailedGenerationError: 'manifest unknown', message: 'one image missing' });
    const r = compactReading(annotations([degraded]), pool);
    assert.equal(r.status!.sets[0]!.lastFailedGenerationError, 'manifest unknown');
    assert.equal(r.status!.sets[0]!.message, 'one image missing');
    assert.match(compactReading({ [STATUS_ANNOTATION]: '{nope' }, pool).error!, /not JSON/);
    assert.deepEqual(compactReading(undefined, pool), {});
  });

  test('the roll-up from the compact copy equals the roll-up from the whole report', () => {
    const cases = [
      [entry()],
      [entry({ phase: 'Progressing', currentGeneration: 2, reason: 'Pulling' })],
      [entry({ phase: 'Degraded', reason: 'NoSpace', message: 'image filesystem 91% full' })],
      [entry({ desiredGeneration: 2, currentGeneration: 2 })],
      [entry({ uid: 'an-older-object' })],
      [entry({ source: 'static', uid: undefined })],
    ];
    const set = { apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name: 'upgrade', uid: UID, generation: 3 }, spec: { pinnedImages: [] } };
    const now = new Date('2025-03-01T10:00:00Z');
    const pool = new SharedValues();
    const whole = cases.map((sets, i) => ({ name: `n${i}`, labels: {}, reading: readNodeStatus(annotations(sets)) }));
    const compact = cases.map((sets, i) => ({ name: `n${i}`, labels: {}, reading: compactReading(annotations(sets), pool) }));
    assert.deepEqual(rollUpSetStatus(set, compact, now), rollUpSetStatus(set, whole, now));
  });

  test('changedSetNames: the sets whose entries changed; every set when readability changed', () => {
    const pool = new SharedValues();
    const r = (sets: NodeSetStatus[]) => compactReading(annotations(sets), pool);
    const other = entry({ name: 'other', uid: 'u2' });
    // What the roll-up does not read changes nothing: a message of a set that is not Degraded, the disk estimate.
    assert.deepEqual(changedSetNames(r([entry(), other]), r([entry({ message: 'another text', estimatedBytes: 99 }), other])), new Set());
    assert.deepEqual(changedSetNames(r([entry(), other]), r([entry({ phase: 'Progressing' }), other])), new Set(['upgrade']));
    // Progress does: the set's status.progress is summed from the counts and
    // bytes (which only version 2 carries: agents that report bytes write it).
    const r2 = (sets: NodeSetStatus[]) => compactReading({ [STATUS_ANNOTATION]: encodeNodeStatus({ version: 2, pinFile: 'x.conf', updatedAt: '2025-03-01T10:00:00Z', sets }) }, pool);
    const pulling = entry({ phase: 'Progressing', reason: 'Pulling', images: { wanted: 40, present: 10, pinned: 40, failed: 0, invalid: 0 }, bytes: { present: 100, total: 400 } });
    assert.deepEqual(changedSetNames(r2([pulling, other]), r2([{ ...pulling, images: { ...pulling.images, present: 11 } }, other])), new Set(['upgrade']));
    assert.deepEqual(changedSetNames(r2([pulling, other]), r2([{ ...pulling, bytes: { present: 150, total: 400 } }, other])), new Set(['upgrade']));
    assert.deepEqual(changedSetNames(r2([pulling, other]), r2([{ ...pulling, rate: 12 }, other])), new Set(['upgrade']));
    assert.deepEqual(changedSetNames(r2([pulling, other]), r2([{ ...pulling }, other])), new Set());
    assert.deepEqual(changedSetNames(r([entry()]), r([entry(), other])), new Set(['other']));
    assert.equal(changedSetNames(r([entry()]), compactReading({ [STATUS_ANNOTATION]: 'x' }, pool)), undefined);
    assert.equal(changedSetNames(compactReading(undefined, pool), r([entry()])), undefined);
  });

  test('SharedValues: one frozen copy of each entry and of each list of entries; bounded', () => {
    const shared = new SharedValues(3);
    const a = compactReading(annotations([entry(), entry({ name: 'other', uid: 'u2' })]), shared);
    const b = compactReading(annotations([entry(), entry({ name: 'other', uid: 'u2' })]), shared);
    assert.equal(a.status!.sets, b.status!.sets, 'two nodes in the same state share one list');
    assert.ok(Object.isFrozen(a.status!.sets) && Object.isFrozen(a.status!.sets[0]));
    const c = compactReading(annotations([entry(), entry({ name: 'other', uid: 'u2', phase: 'Progressing' })]), shared);
    assert.notEqual(c.status!.sets, a.status!.sets);
    assert.equal(c.status!.sets[0], a.status!.sets[0], 'the unchanged entry is still shared');
    assert.equal(shared.string(['up', 'grade'].join('')), 'upgrade');
    for (const s of ['x1', 'x2', 'x3', 'x4']) shared.string(s);
    assert.ok(shared.size.strings <= 3, 'bounded');
    // Values handed out before a start-over stay valid.
    assert.equal(a.status!.sets[0]!.name, 'upgrade');
  });
});
