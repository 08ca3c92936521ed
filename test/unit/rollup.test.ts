import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { STATUS_ANNOTATION, type NodeSetStatus, type NodeStatus, type PinnedImageSet, type PinnedImageSetStatus } from '../../src/api/types.ts';
import { encodeNodeStatus, parseNodeStatus, readNodeStatus } from '../../src/api/node-status.ts';
import { MAX_DEGRADED_NODES, rollUpSetStatus, type ObservedNode } from '../../src/controller/rollup.ts';
import { sameJson } from '../../src/util/json.ts';

const T0 = new Date('2025-03-01T10:00:00.000Z');
const T1 = new Date('2025-03-01T10:05:00.000Z');
const UID = '5f0c7e0e-0000-4000-8000-000000000001';

function set(generation = 3, extra: Partial<PinnedImageSet['spec']> = {}, uid = UID): PinnedImageSet {
  return {
    apiVersion: 'pinset.dev/v1alpha1',
    kind: 'PinnedImageSet',
    metadata: { name: 'upgrade', uid, generation },
    spec: { nodeSelector: { matchLabels: { role: 'worker' } }, pinnedImages: [{ name: 'quay.io/a/b@sha256:' + 'a'.repeat(64) }], ...extra },
  };
}

function entry(over: Partial<NodeSetStatus> = {}): NodeSetStatus {
  return {
    name: 'upgrade',
    uid: UID,
    source: 'api',
    desiredGeneration: 3,
    currentGeneration: 3,
    images: { wanted: 1, present: 1, pinned: 1, failed: 0, invalid: 0 },
    phase: 'Ready',
    reason: 'AllImagesPinned',
    ...over,
  };
}

function node(name: string, sets: NodeSetStatus[] | undefined, labels: Record<string, string> = { role: 'worker' }): ObservedNode {
  if (sets === undefined) return { name, labels, reading: {} };
  const status: NodeStatus = { version: 1, node: name, pinFile: 'x.conf', updatedAt: T0.toISOString(), sets };
  return { name, labels, reading: parseNodeStatus(JSON.stringify(status)) };
}

/** The node as an agent of the current version reports it (format version 2). */
function nodeV2(name: string, sets: NodeSetStatus[]): ObservedNode {
  return { name, labels: { role: 'worker' }, reading: parseNodeStatus(encodeNodeStatus({ version: 2, pinFile: 'x.conf', updatedAt: T0.toISOString(), sets })) };
}

function cond(s: PinnedImageSetStatus, type: string) {
  const c = s.conditions?.find((x) => x.type === type);
  assert.ok(c, `condition ${type} present`);
  return c;
}

describe('rollUpSetStatus', () => {
  test('nodes reporting in version 1 and version 2 count alike (agents upgraded one by one)', () => {
    const samples: NodeSetStatus[] = [
      entry(),
      entry({ phase: 'Progressing', currentGeneration: 2, reason: 'WaitingForRolloutSlot', message: 'waiting' }),
      entry({ phase: 'Degraded', currentGeneration: 2, reason: 'ImageNotFound', message: 'manifest unknown', lastFailedGeneration: 3, lastFailedGenerationError: 'ImageNotFound: manifest unknown' }),
      entry({ desiredGeneration: 2, currentGeneration: 2 }),
      entry({ uid: 'an-older-object' }),
    ];
    const old = rollUpSetStatus(set(), samples.map((e, i) => node(`n${i}`, [e])), T0);
    const now = rollUpSetStatus(set(), samples.map((e, i) => nodeV2(`n${i}`, [e])), T0);
    const mixed = rollUpSetStatus(set(), samples.map((e, i) => (i % 2 ? node(`n${i}`, [e]) : nodeV2(`n${i}`, [e]))), T0);
    assert.deepEqual(old.nodes, { matched: 5, ready: 1, progressing: 3, degraded: 1 });
    assert.deepEqual(now, old);
    assert.deepEqual(mixed, old);
  });

  test('counts ready, progressing and degraded nodes among those the selector matches', () => {
    const nodes = [
      node('a', [entry()]),
      node('b', [entry({ phase: 'Progressing', currentGeneration: 2, reason: 'Pulling' })]),
      node('c', [entry({ phase: 'Degraded', reason: 'ImageNotFound', lastFailedGeneration: 3, lastFailedGenerationError: 'manifest unknown' })]),
      node('d', [entry()]),
      node('control', [entry()], { role: 'control-plane' }),
    ];
    const s = rollUpSetStatus(set(), nodes, T0);
    assert.equal(s.observedGeneration, 3);
    assert.deepEqual(s.nodes, { matched: 4, ready: 2, progressing: 1, degraded: 1 });
    assert.deepEqual(s.degradedNodes, [{ name: 'c', reason: 'ImageNotFound', message: 'manifest unknown' }]);
    assert.equal(cond(s, 'Ready').status, 'False');
    assert.equal(cond(s, 'Ready').reason, 'NodesDegraded');
    assert.equal(cond(s, 'Progressing').status, 'True');
    assert.equal(cond(s, 'Progressing').reason, 'NodesProgressing');
    assert.equal(cond(s, 'Degraded').status, 'True');
    assert.equal(cond(s, 'Degraded').reason, 'NodesDegraded');
    assert.match(cond(s, 'Degraded').message, /c \(ImageNotFound\)/);
    for (const c of s.conditions!) {
      assert.equal(c.observedGeneration, 3);
      assert.match(c.reason, /^[A-Z][A-Za-z]*$/, 'reasons are CamelCase');
      assert.equal(c.lastTransitionTime, '2025-03-01T10:00:00Z');
    }
  });

  test('every selected node ready makes the set Ready', () => {
    const s = rollUpSetStatus(set(), [node('a', [entry()]), node('b', [entry()])], T0);
    assert.deepEqual(s.nodes, { matched: 2, ready: 2, progressing: 0, degraded: 0 });
    assert.deepEqual([cond(s, 'Ready').status, cond(s, 'Ready').reason], ['True', 'AllNodesReady']);
    assert.deepEqual([cond(s, 'Progressing').status, cond(s, 'Degraded').status], ['False', 'False']);
    assert.equal(s.degradedNodes, undefined);
  });

  test('a node reporting an older generation counts as Progressing, even if it was Degraded or Ready then', () => {
    const s = rollUpSetStatus(set(4), [
      node('a', [entry({ desiredGeneration: 3, currentGeneration: 3, phase: 'Ready' })]),
      node('b', [entry({ desiredGeneration: 3, phase: 'Degraded', reason: 'ImageNotFound', lastFailedGeneration: 3 })]),
      node('c', [entry({ desiredGeneration: 4, currentGeneration: 4 })]),
    ], T0);
    assert.deepEqual(s.nodes, { matched: 3, ready: 1, progressing: 2, degraded: 0 });
    assert.equal(s.observedGeneration, 4);
    assert.equal(cond(s, 'Ready').reason, 'NodesProgressing');
  });

  test('a node that has seen the new generation but still runs the old one is Progressing', () => {
    const s = rollUpSetStatus(set(4), [node('a', [entry({ desiredGeneration: 4, currentGeneration: 3, phase: 'Ready' })])], T0);
    assert.deepEqual(s.nodes, { matched: 1, ready: 0, progressing: 1, degraded: 0 });
  });

  test('a selected node with no report, or an unreadable one, counts as Progressing; the others still count', () => {
    const garbled: ObservedNode = { name: 'g', labels: { role: 'worker' }, reading: readNodeStatus({ [STATUS_ANNOTATION]: '{not json' }) };
    const wrongShape: ObservedNode = { name: 'w', labels: { role: 'worker' }, reading: readNodeStatus({ [STATUS_ANNOTATION]: '{"version":1,"sets":"nope"}' }) };
    const s = rollUpSetStatus(set(), [node('a', [entry()]), node('silent', undefined), garbled, wrongShape], T0);
    assert.ok(garbled.reading.error);
    assert.deepEqual(s.nodes, { matched: 4, ready: 1, progressing: 3, degraded: 0 });
    assert.match(cond(s, 'Progressing').message, /3 nodes have not reported/);
  });

  test('one malformed entry is dropped without losing the node\'s other entries', () => {
    const raw = JSON.stringify({ version: 1, node: 'a', pinFile: 'x', updatedAt: T0.toISOString(), sets: [{ name: 'other', phase: 42 }, entry()] });
    const reading = parseNodeStatus(raw);
    assert.equal(reading.status?.sets.length, 1);
    assert.equal(reading.droppedEntries?.length, 1);
    const s = rollUpSetStatus(set(), [{ name: 'a', labels: { role: 'worker' }, reading }], T0);
    assert.equal(s.nodes?.ready, 1);
  });

  test('a report from a deleted set of the same name (other uid) does not count', () => {
    const recreated = set(1, {}, 'f00dfeed-0000-4000-8000-000000000002');
    const s = rollUpSetStatus(recreated, [node('a', [entry({ desiredGeneration: 1, currentGeneration: 1 })]), node('b', [entry({ uid: undefined, desiredGeneration: 1, currentGeneration: 1 })])], T0);
    // a: uid of the old object, ignored; b: no uid, matched by name.
    assert.deepEqual(s.nodes, { matched: 2, ready: 1, progressing: 1, degraded: 0 });
  });

  test('entries for static (node-local) sets are ignored', () => {
    const s = rollUpSetStatus(set(), [node('a', [entry({ source: 'static', uid: undefined })])], T0);
    assert.deepEqual(s.nodes, { matched: 1, ready: 0, progressing: 1, degraded: 0 });
  });

  test('at most ten degraded nodes are listed, sorted by name, while the count is exact', () => {
    const names = Array.from({ length: 14 }, (_, i) => `node-${String(14 - i).padStart(2, '0')}`);
    const nodes = names.map((n) => node(n, [entry({ phase: 'Degraded', reason: 'PullFailed', lastFailedGenerationError: `failed on ${n}` })]));
    const s = rollUpSetStatus(set(), nodes, T0);
    assert.equal(s.nodes?.degraded, 14);
    assert.equal(s.degradedNodes?.length, MAX_DEGRADED_NODES);
    assert.deepEqual(
      s.degradedNodes?.map((d) => d.name),
      Array.from({ length: 10 }, (_, i) => `node-${String(i + 1).padStart(2, '0')}`),
    );
    assert.equal(s.degradedNodes?.[0]?.message, 'failed on node-01');
    assert.match(cond(s, 'Degraded').message, /and 11 more/);
  });

  test('a degraded node without an error text falls back to its message', () => {
    const s = rollUpSetStatus(set(), [node('a', [entry({ phase: 'Degraded', reason: 'NoSpace', message: 'image filesystem 91% full' })])], T0);
    assert.deepEqual(s.degradedNodes, [{ name: 'a', reason: 'NoSpace', message: 'image filesystem 91% full' }]);
  });

  test('the credential reasons roll up as reported, with their messages (a pull secret named, a provider named)', () => {
    const secret = 'pull secret pinset-system/regcred does not exist; 0 of 1 images present, pins kept';
    const provider = 'credential provider ecr-credential-provider failed for quay.io/a/b: exit status 1; pulling quay.io/a/b@sha256:... without its credentials failed: 401';
    const s = rollUpSetStatus(
      set(),
      [
        nodeV2('a', [entry({ phase: 'Degraded', currentGeneration: 2, reason: 'PullSecretInvalid', message: secret })]),
        nodeV2('b', [entry({ phase: 'Degraded', currentGeneration: 2, reason: 'CredentialProviderFailed', message: provider })]),
      ],
      T0,
    );
    assert.deepEqual(s.degradedNodes, [
      { name: 'a', reason: 'PullSecretInvalid', message: `PullSecretInvalid: ${secret}` },
      { name: 'b', reason: 'CredentialProviderFailed', message: `CredentialProviderFailed: ${provider}` },
    ]);
    assert.match(cond(s, 'Degraded').message, /a \(PullSecretInvalid\)/);
  });

  test('lastTransitionTime is kept for a condition whose status did not change and renewed for one that did', () => {
    const first = rollUpSetStatus(set(), [node('a', [entry()]), node('b', [entry({ phase: 'Progressing', currentGeneration: 2 })])], T0);
    const withFirst = { ...set(), status: first };
    // Counts change (b is still progressing, a third node appears): no condition flips.
    const second = rollUpSetStatus(withFirst, [node('a', [entry()]), node('b', [entry({ phase: 'Progressing', currentGeneration: 2 })]), node('c', [entry()])], T1);
    for (const t of ['Ready', 'Progressing', 'Degraded']) assert.equal(cond(second, t).lastTransitionTime, '2025-03-01T10:00:00Z', t);
    // b finishes: Ready and Progressing flip, Degraded does not.
    const third = rollUpSetStatus({ ...set(), status: second }, [node('a', [entry()]), node('b', [entry()]), node('c', [entry()])], T1);
    assert.equal(cond(third, 'Ready').status, 'True');
    assert.equal(cond(third, 'Ready').lastTransitionTime, '2025-03-01T10:05:00Z');
    assert.equal(cond(third, 'Progressing').lastTransitionTime, '2025-03-01T10:05:00Z');
    assert.equal(cond(third, 'Degraded').lastTransitionTime, '2025-03-01T10:00:00Z');
  });

  test('the same inputs at a later time give an identical status (nothing to write)', () => {
    const nodes = [node('a', [entry()]), node('b', [entry({ phase: 'Degraded', reason: 'ImageNotFound' })])];
    const first = rollUpSetStatus(set(), nodes, T0);
    const again = rollUpSetStatus({ ...set(), status: first }, nodes, T1);
    assert.ok(sameJson(first, again));
    assert.deepEqual(again, first);
  });

  test('an invalid selector selects no node and makes the set Degraded with InvalidSpec', () => {
    const bad = set(2, { nodeSelector: { matchExpressions: [{ key: 'role', operator: 'In', values: [] }] } });
    const s = rollUpSetStatus(bad, [node('a', [entry({ desiredGeneration: 2, currentGeneration: 2 })])], T0);
    assert.deepEqual(s.nodes, { matched: 0, ready: 0, progressing: 0, degraded: 0 });
    assert.deepEqual([cond(s, 'Degraded').status, cond(s, 'Degraded').reason], ['True', 'InvalidSpec']);
    assert.deepEqual([cond(s, 'Ready').status, cond(s, 'Ready').reason], ['False', 'InvalidSpec']);
    assert.match(cond(s, 'Degraded').message, /matchExpressions\[0\]\.values/);
  });

  test('a selector that matches no node says so', () => {
    const s = rollUpSetStatus(set(1, { nodeSelector: { matchLabels: { role: 'gpu' } } }), [node('a', [entry()])], T0);
    assert.equal(s.nodes?.matched, 0);
    assert.equal(cond(s, 'Ready').reason, 'NoNodesSelected');
    assert.equal(cond(s, 'Degraded').status, 'False');
  });

  test('an absent selector selects every node', () => {
    const s = rollUpSetStatus(set(3, { nodeSelector: undefined }), [node('a', [entry()], {}), node('b', [entry()], { x: 'y' })], T0);
    assert.deepEqual(s.nodes, { matched: 2, ready: 2, progressing: 0, degraded: 0 });
  });
});

describe('parseNodeStatus', () => {
  test('rejects other format versions and non-objects without throwing', () => {
    for (const raw of ['null', '[]', '"x"', '{"version":3,"sets":[]}', '{"version":"2","sets":[]}', '{"version":1}', '{"version":2}', '']) {
      const r = parseNodeStatus(raw);
      assert.equal(r.status, undefined, raw);
      assert.ok(r.error, raw);
    }
    assert.deepEqual(parseNodeStatus(undefined), {});
  });
});
