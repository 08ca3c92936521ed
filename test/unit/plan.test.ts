import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { planReconcile, wantedKey, type ObservedSet, type PlanInput } from '../../src/agent/plan.ts';
import { pinsKeptMessage } from '../../src/agent/status.ts';
import type { LabelSelector, SetSource } from '../../src/api/types.ts';

const ref = (name: string, c: string) => `quay.io/org/${name}@sha256:${c.repeat(64)}`;
const A = ref('a', 'a');
const B = ref('b', 'b');
const C = ref('c', 'c');
const D = ref('d', 'd');
const ADMIN = 'registry.example.com/admin/tool@sha256:' + 'e'.repeat(64);

function observed(
  name: string,
  images: string[],
  opts: { source?: SetSource; selector?: LabelSelector; runtimeHandler?: string; generation?: number; uid?: string; spec?: Record<string, unknown> } = {},
): ObservedSet {
  const source = opts.source ?? 'api';
  return {
    source,
    origin: source === 'api' ? 'api' : `/etc/pinset/sets.d/${name}.yaml#0`,
    object: {
      apiVersion: 'pinset.dev/v1alpha1',
      kind: 'PinnedImageSet',
      metadata: { name, ...(opts.uid ? { uid: opts.uid } : {}), ...(opts.generation !== undefined ? { generation: opts.generation } : {}) },
      spec: {
        ...(opts.selector ? { nodeSelector: opts.selector } : {}),
        ...(opts.runtimeHandler !== undefined ? { runtimeHandler: opts.runtimeHandler } : {}),
        pinnedImages: images.map((n) => ({ name: n })),
        ...opts.spec,
      },
    },
  };
}

function input(over: Partial<PlanInput> = {}): PlanInput {
  return { labels: { zone: 'a' }, apiSets: [], staticSets: [], staticProblems: [], currentPins: [], carriedPins: [], ...over };
}

const inZoneB: LabelSelector = { matchLabels: { zone: 'b' } };
const inZoneA: LabelSelector = { matchExpressions: [{ key: 'zone', operator: 'In', values: ['a'] }] };

describe('planReconcile', () => {
  test('two sets: the union, an image wanted by both counted once', () => {
    const p = planReconcile(input({ apiSets: [observed('one', [A, B]), observed('two', [B, C], { selector: inZoneA })] }));
    assert.deepEqual(p.pins, [A, B, C]);
    assert.equal(p.wanted.length, 3);
    const b = p.wanted.find((w) => w.reference.reference === B)!;
    assert.deepEqual(b.sets, ['api/one', 'api/two']);
    assert.deepEqual(
      p.sets.map((s) => [s.key, s.selection]),
      [
        ['api/one', 'selected'],
        ['api/two', 'selected'],
      ],
    );
    assert.deepEqual(p.retained, []);
    assert.deepEqual(p.retainReasons, []);
  });

  test('one pull per (image, runtime handler); one pin per image', () => {
    const p = planReconcile(input({ apiSets: [observed('plain', [A]), observed('kata', [A, B], { runtimeHandler: 'kata' })] }));
    assert.deepEqual(
      p.wanted.map((w) => w.key),
      [wantedKey(A, ''), wantedKey(A, 'kata'), wantedKey(B, 'kata')].sort(),
    );
    assert.equal(p.wanted.find((w) => w.key === wantedKey(A, 'kata'))!.runtimeHandler, 'kata');
    assert.deepEqual(p.pins, [A, B]);
  });

  test('invalid references are left out; the set’s valid ones still apply', () => {
    const evil = `${A}"]\n[crio.runtime]\ndefault_runtime = "evil"\n#`;
    const p = planReconcile(input({ apiSets: [observed('mixed', [A, 'quay.io/org/app:1.2', evil, B])] }));
    assert.deepEqual(p.pins, [A, B]);
    const s = p.sets[0]!;
    assert.deepEqual(s.specErrors, []);
    assert.deepEqual(
      s.invalidImages.map((i) => i.index),
      [1, 2],
    );
    assert.ok(!p.pins.some((x) => x.includes('crio.runtime')));
  });

  test('a set with spec errors is not applied, and its pins leave the file', () => {
    const p = planReconcile(
      input({
        apiSets: [observed('broken', [A, B], { runtimeHandler: 'Not_A_Label' }), observed('dup', [C, C]), observed('fine', [D])],
        currentPins: [A, B, C, D],
      }),
    );
    assert.deepEqual(p.pins, [D]);
    assert.ok(p.sets.find((s) => s.name === 'broken')!.specErrors[0]!.startsWith('spec.runtimeHandler'));
    assert.ok(p.sets.find((s) => s.name === 'dup')!.specErrors[0]!.includes('duplicate'));
    assert.deepEqual(p.retained, []);
  });

  test('a set with a broken selector selects nothing, even when labels are unknown', () => {
    const p = planReconcile(
      input({ labels: null, apiSets: [observed('bad-sel', [A], { selector: { matchExpressions: [{ key: 'zone', operator: 'In' }] } as unknown as LabelSelector })] }),
    );
    assert.equal(p.sets[0]!.selection, 'not-selected');
    assert.ok(p.sets[0]!.specErrors[0]!.startsWith('spec.nodeSelector'));
    assert.deepEqual(p.pins, []);
  });

  test('a set that no longer selects the node: its pins are gone', () => {
    const p = planReconcile(input({ apiSets: [observed('elsewhere', [A], { selector: inZoneB }), observed('here', [B], { selector: inZoneA })], currentPins: [A, B] }));
    assert.deepEqual(p.pins, [B]);
    assert.equal(p.sets.find((s) => s.name === 'elsewhere')!.selection, 'not-selected');
    assert.deepEqual(p.retained, []);
  });

  test('a deleted set (absent from a successful list): its pins are gone', () => {
    const p = planReconcile(input({ apiSets: [], currentPins: [A, B] }));
    assert.deepEqual(p.pins, []);
  });

  test('API not listed yet (apiSets null): current pins are retained, static sets still apply', () => {
    const p = planReconcile(input({ apiSets: null, staticSets: [observed('local', [C], { source: 'static' })], currentPins: [A, B] }));
    assert.deepEqual(p.pins, [A, B, C]);
    assert.deepEqual(p.retained, [A, B]);
    assert.deepEqual(p.retainReasons, ['the API has not been listed yet']);
    assert.deepEqual(
      p.wanted.map((w) => w.reference.reference),
      [C],
      'retained pins are kept, not pulled',
    );
  });

  test('labels unknown: sets with a selector are "unknown" and pins are retained; selector-less sets apply', () => {
    const p = planReconcile(
      input({ labels: null, apiSets: [observed('sel', [A], { selector: inZoneA }), observed('all', [B])], currentPins: [A, D] }),
    );
    assert.equal(p.sets.find((s) => s.name === 'sel')!.selection, 'unknown');
    assert.equal(p.sets.find((s) => s.name === 'all')!.selection, 'selected');
    assert.deepEqual(p.pins, [A, B, D]);
    assert.deepEqual(p.retained, [A, D]);
    assert.deepEqual(p.retainReasons, ['the node labels are unknown']);
    assert.deepEqual(
      p.wanted.map((w) => w.reference.reference),
      [B],
    );
  });

  test('labels null but no set has a selector: the observation is complete, nothing retained', () => {
    const p = planReconcile(input({ labels: null, apiSets: [observed('all', [B])], currentPins: [A] }));
    assert.deepEqual(p.pins, [B]);
    assert.deepEqual(p.retained, []);
  });

  test('a static file unreadable since the start (its sets unknown): every current pin is retained', () => {
    const p = planReconcile(input({ staticProblems: [{ origin: '/etc/pinset/sets.d/x.yaml', error: 'bad indentation' }], currentPins: [A] }));
    assert.deepEqual(p.pins, [A]);
    assert.deepEqual(p.retained, [A]);
    assert.deepEqual(p.retainReasons, ['1 static file(s) could not be read and what they held is unknown']);
  });

  test('a static file unreadable now with known last content: exactly its sets are kept, nothing else retained', () => {
    const held = { ...observed('from-x', [B], { source: 'static' }), held: { file: '/etc/pinset/sets.d/x.yaml', error: 'it is a folder, not a file' } };
    const p = planReconcile(
      input({
        // D was pinned for an API set that has since been deleted: it goes, although a static file is unreadable.
        apiSets: [observed('api', [A])],
        staticSets: [held, observed('other', [C], { source: 'static' })],
        currentPins: [A, B, C, D],
      }),
    );
    assert.deepEqual(p.pins, [A, B, C]);
    assert.deepEqual(p.retained, []);
    assert.deepEqual(p.retainReasons, []);
    const s = p.sets.find((x) => x.name === 'from-x')!;
    assert.deepEqual(s.held, held.held);
    assert.equal(s.selection, 'selected');
    assert.equal(p.sets.find((x) => x.name === 'other')!.held, undefined);
    assert.ok(p.wanted.some((w) => w.reference.reference === B), 'a held set stays wanted: its images are kept present too');
  });

  test('pins carried from earlier drop-ins are kept, and not counted as retained', () => {
    const p = planReconcile(input({ apiSets: [observed('one', [A])], carriedPins: [ADMIN, A], currentPins: [ADMIN, A, B] }));
    assert.deepEqual(p.pins, [A, ADMIN]);
    assert.deepEqual(p.retained, []);
    assert.equal(p.wanted.length, 1, 'carried pins are not pulled');
  });

  test('nothing of its own to pin (no set wants anything, nothing kept): the list is empty, others\' pins are not carried', () => {
    const p = planReconcile(input({ apiSets: [], carriedPins: [ADMIN], currentPins: [ADMIN, A] }));
    assert.deepEqual(p.pins, [], 'no list at all: on CRI-O, no drop-in (an empty one that sorts last would unpin the earlier files)');
    assert.deepEqual(p.retained, []);
  });

  test('observation incomplete with current pins that are all carried: the carried list stays, it may be what pins them', () => {
    const p = planReconcile(input({ apiSets: null, carriedPins: [ADMIN], currentPins: [ADMIN] }));
    assert.deepEqual(p.pins, [ADMIN]);
    assert.deepEqual(p.retained, [ADMIN], 'the file\'s one pin, which no set asks for, is the one kept (as its `pins` count says)');
    const empty = planReconcile(input({ apiSets: null, carriedPins: [ADMIN], currentPins: [] }));
    assert.deepEqual(empty.pins, [], 'no file before, none now');
  });

  test('pins kept that no set asks for are counted alike on every runtime: the pins the node reports (`pins`) that no set asks for', () => {
    // Four images pinned for a set, D also pinned by hand; then the sets cannot be read.
    // What each backend's observe() holds then (src/crio/crio-pins.ts, src/containerd/label-pins.ts):
    // CRI-O's drop-in lists all four and carries D from the administrator's
    // earlier file; containerd's own labels are on all four, and a hand pin is no pin of pinset's.
    const why = 'the CustomResourceDefinition pinnedimagesets.pinset.dev is being deleted';
    const crio = planReconcile(input({ apiSets: null, apiProblem: why, currentPins: [A, B, C, D], carriedPins: [D] }));
    const containerd = planReconcile(input({ apiSets: null, apiProblem: why, currentPins: [A, B, C, D], carriedPins: [] }));
    assert.equal(pinsKeptMessage(crio), `4 pin(s) kept that no set asks for now: ${why}`);
    assert.equal(pinsKeptMessage(containerd), pinsKeptMessage(crio));
    assert.deepEqual(crio.pins, [A, B, C, D], 'CRI-O keeps its file as it is');
    // A set still asking for one of them: the other three are the ones kept, on both.
    const partly = (carriedPins: string[]) => planReconcile(input({ apiSets: null, apiProblem: why, staticSets: [observed('boot', [A], { source: 'static' })], currentPins: [A, B, C, D], carriedPins }));
    assert.match(pinsKeptMessage(partly([D]))!, /^3 pin\(s\) kept/);
    assert.equal(pinsKeptMessage(partly([])), pinsKeptMessage(partly([D])));
  });

  test('why the API\'s sets are unknown (the CRD missing, say) is the reason pins are retained', () => {
    const why = 'the CustomResourceDefinition pinnedimagesets.pinset.dev is not installed';
    const p = planReconcile(input({ apiSets: null, apiProblem: why, currentPins: [A] }));
    assert.deepEqual(p.retainReasons, [why]);
    assert.deepEqual(p.retained, [A]);
    assert.deepEqual(p.pins, [A]);
  });

  test('output is sorted and unique', () => {
    const p = planReconcile(
      input({
        apiSets: [observed('z', [D, A, C]), observed('y', [C, B, A])],
        staticSets: [observed('x', [B, D], { source: 'static' })],
        carriedPins: [D, ADMIN, ADMIN],
      }),
    );
    assert.deepEqual(p.pins, [...new Set(p.pins)].sort());
    assert.deepEqual(p.pins, [A, B, C, D, ADMIN]);
    const keys = p.wanted.map((w) => w.key);
    assert.deepEqual(keys, [...new Set(keys)].sort());
  });

  test('running twice gives the same answer and leaves the input untouched', () => {
    const inp = input({
      labels: null,
      apiSets: [observed('one', [A, B], { selector: inZoneA }), observed('two', [C, 'bad'])],
      staticSets: [observed('two', [D], { source: 'static' }), observed('two', [A], { source: 'static' })],
      staticProblems: [],
      currentPins: [B, A],
      carriedPins: [ADMIN],
    });
    const before = structuredClone(inp);
    const first = planReconcile(inp);
    const second = planReconcile(inp);
    assert.deepEqual(second, first);
    assert.deepEqual(inp, before);
  });

  test('an API set and a static set of the same name are different sets', () => {
    const p = planReconcile(input({ apiSets: [observed('same', [A])], staticSets: [observed('same', [B], { source: 'static' })] }));
    assert.deepEqual(
      p.sets.map((s) => s.key),
      ['api/same', 'static/same'],
    );
    assert.deepEqual(p.pins, [A, B]);
  });

  test('two static documents with the same name: the second is a spec error and not applied', () => {
    const p = planReconcile(input({ staticSets: [observed('same', [A], { source: 'static' }), observed('same', [B], { source: 'static' })] }));
    assert.deepEqual(p.pins, [A]);
    const second = p.sets[1]!;
    assert.notEqual(second.key, p.sets[0]!.key, 'keys stay unique');
    assert.match(second.specErrors[0]!, /another static set is already named "same"/);
  });

  test('generation, uid and runtime handler are carried into the plan; static sets count as generation 1', () => {
    const p = planReconcile(
      input({ apiSets: [observed('api', [A], { generation: 7, uid: 'u-1', runtimeHandler: 'kata' })], staticSets: [observed('st', [B], { source: 'static' })] }),
    );
    const api = p.sets.find((s) => s.source === 'api')!;
    assert.equal(api.generation, 7);
    assert.equal(api.uid, 'u-1');
    assert.equal(api.runtimeHandler, 'kata');
    assert.equal(p.sets.find((s) => s.source === 'static')!.generation, 1);
  });

  test('spec.rollout.maxConcurrentNodes is carried into the plan; a bad one makes the set invalid, not unlimited', () => {
    const p = planReconcile(
      input({
        apiSets: [
          observed('limited', [A], { spec: { rollout: { maxConcurrentNodes: 50 } } }),
          observed('open', [B], { spec: { rollout: {} } }),
          observed('zero', [C], { spec: { rollout: { maxConcurrentNodes: 0 } } }),
        ],
      }),
    );
    const by = (n: string) => p.sets.find((s) => s.name === n)!;
    assert.equal(by('limited').maxConcurrentNodes, 50);
    assert.equal(by('open').maxConcurrentNodes, undefined);
    assert.equal(by('zero').maxConcurrentNodes, undefined);
    assert.match(by('zero').specErrors[0]!, /^spec\.rollout\.maxConcurrentNodes: "0" must be an integer of at least 1/);
    assert.deepEqual(p.pins, [A, B], 'the invalid set is not applied');
  });

  test('an object that is not a set at all is reported, not applied, and does not throw', () => {
    const p = planReconcile(input({ staticSets: [{ source: 'static', origin: 'x.yaml#0', object: 'just a string' }], currentPins: [A] }));
    assert.equal(p.sets.length, 1);
    assert.equal(p.sets[0]!.name, '(unnamed)');
    assert.ok(p.sets[0]!.specErrors.length > 0);
    assert.deepEqual(p.pins, []);
  });
});
