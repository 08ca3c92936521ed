import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { parseLabelList, selectorErrors, selectorMatches, selectsEverything } from '../../src/api/selector.ts';
import type { LabelSelector } from '../../src/api/types.ts';

const worker = { 'node-role.kubernetes.io/worker': '', zone: 'a', disk: 'ssd' };
const infra = { 'node-role.kubernetes.io/infra': '', zone: 'b' };

describe('selectorMatches', () => {
  test('an absent or empty selector selects every node, even one without labels', () => {
    for (const sel of [undefined, {}, { matchLabels: {} }, { matchExpressions: [] }, { matchLabels: {}, matchExpressions: [] }] as (LabelSelector | undefined)[]) {
      assert.equal(selectorMatches(sel, worker), true);
      assert.equal(selectorMatches(sel, {}), true);
      assert.equal(selectsEverything(sel), true);
    }
  });

  test('matchLabels: every pair must be present with the same value', () => {
    const sel: LabelSelector = { matchLabels: { zone: 'a', disk: 'ssd' } };
    assert.equal(selectorMatches(sel, worker), true);
    assert.equal(selectorMatches(sel, { zone: 'a' }), false);
    assert.equal(selectorMatches(sel, { zone: 'a', disk: 'hdd' }), false);
    assert.equal(selectorMatches(sel, infra), false);
    assert.equal(selectsEverything(sel), false);
  });

  test('matchLabels with an empty value needs the key with an empty value', () => {
    const sel: LabelSelector = { matchLabels: { 'node-role.kubernetes.io/worker': '' } };
    assert.equal(selectorMatches(sel, worker), true);
    assert.equal(selectorMatches(sel, infra), false);
    assert.equal(selectorMatches(sel, { 'node-role.kubernetes.io/worker': 'x' }), false);
  });

  test('a label named like an Object.prototype member is not taken from the prototype', () => {
    assert.equal(selectorMatches({ matchLabels: { constructor: 'x' } }, {}), false);
    assert.equal(selectorMatches({ matchExpressions: [{ key: 'toString', operator: 'Exists' }] }, {}), false);
    assert.equal(selectorMatches({ matchExpressions: [{ key: 'toString', operator: 'DoesNotExist' }] }, {}), true);
  });

  test('In: the key is present with one of the values', () => {
    const sel: LabelSelector = { matchExpressions: [{ key: 'zone', operator: 'In', values: ['a', 'c'] }] };
    assert.equal(selectorMatches(sel, worker), true);
    assert.equal(selectorMatches(sel, infra), false);
    assert.equal(selectorMatches(sel, { disk: 'ssd' }), false, 'In needs the key');
  });

  test('NotIn: the key is absent, or present with none of the values', () => {
    const sel: LabelSelector = { matchExpressions: [{ key: 'zone', operator: 'NotIn', values: ['a'] }] };
    assert.equal(selectorMatches(sel, worker), false);
    assert.equal(selectorMatches(sel, infra), true);
    assert.equal(selectorMatches(sel, { disk: 'ssd' }), true, 'NotIn holds when the key is absent (as in Kubernetes)');
  });

  test('Exists and DoesNotExist look at the key only', () => {
    const exists: LabelSelector = { matchExpressions: [{ key: 'node-role.kubernetes.io/worker', operator: 'Exists' }] };
    const absent: LabelSelector = { matchExpressions: [{ key: 'node-role.kubernetes.io/worker', operator: 'DoesNotExist' }] };
    assert.equal(selectorMatches(exists, worker), true);
    assert.equal(selectorMatches(exists, infra), false);
    assert.equal(selectorMatches(absent, worker), false);
    assert.equal(selectorMatches(absent, infra), true);
  });

  test('matchLabels and every expression must all hold', () => {
    const sel: LabelSelector = {
      matchLabels: { disk: 'ssd' },
      matchExpressions: [
        { key: 'zone', operator: 'In', values: ['a', 'b'] },
        { key: 'node-role.kubernetes.io/infra', operator: 'DoesNotExist' },
      ],
    };
    assert.equal(selectorMatches(sel, worker), true);
    assert.equal(selectorMatches(sel, { ...worker, 'node-role.kubernetes.io/infra': '' }), false);
    assert.equal(selectorMatches(sel, { ...worker, zone: 'z' }), false);
    assert.equal(selectorMatches(sel, { ...worker, disk: 'hdd' }), false);
  });
});

describe('selectorErrors', () => {
  test('valid selectors have no errors', () => {
    assert.deepEqual(selectorErrors(undefined), []);
    assert.deepEqual(selectorErrors(null), []);
    assert.deepEqual(selectorErrors({}), []);
    assert.deepEqual(
      selectorErrors({
        matchLabels: { a: 'b' },
        matchExpressions: [
          { key: 'a', operator: 'In', values: ['x'] },
          { key: 'b', operator: 'NotIn', values: ['y'] },
          { key: 'c', operator: 'Exists' },
          { key: 'd', operator: 'DoesNotExist', values: [] },
        ],
      }),
      [],
    );
  });

  test('each problem is reported with its field path', () => {
    const cases: [unknown, string][] = [
      ['zone=a', 'spec.nodeSelector: must be an object'],
      [[], 'spec.nodeSelector: must be an object'],
      [{ matchLabel: { a: 'b' } }, 'spec.nodeSelector.matchLabel: unknown field'],
      [{ matchLabels: ['a'] }, 'spec.nodeSelector.matchLabels: must be a map of strings'],
      [{ matchLabels: { a: 1 } }, 'spec.nodeSelector.matchLabels["a"]: must be a string'],
      [{ matchExpressions: {} }, 'spec.nodeSelector.matchExpressions: must be a list'],
      [{ matchExpressions: ['x'] }, 'spec.nodeSelector.matchExpressions[0]: must be an object'],
      [{ matchExpressions: [{ key: '', operator: 'Exists' }] }, 'spec.nodeSelector.matchExpressions[0].key: must be a non-empty string'],
      [{ matchExpressions: [{ key: 'a', operator: 'Equals' }] }, 'spec.nodeSelector.matchExpressions[0].operator: must be one of In, NotIn, Exists, DoesNotExist'],
      [{ matchExpressions: [{ key: 'a', operator: 'In' }] }, 'spec.nodeSelector.matchExpressions[0].values: must be non-empty for operator In'],
      [{ matchExpressions: [{ key: 'a', operator: 'NotIn', values: [] }] }, 'spec.nodeSelector.matchExpressions[0].values: must be non-empty for operator NotIn'],
      [{ matchExpressions: [{ key: 'a', operator: 'Exists', values: ['x'] }] }, 'spec.nodeSelector.matchExpressions[0].values: must be empty for operator Exists'],
      [{ matchExpressions: [{ key: 'a', operator: 'In', values: [1] }] }, 'spec.nodeSelector.matchExpressions[0].values: must be a list of strings'],
    ];
    for (const [sel, want] of cases) {
      assert.deepEqual(selectorErrors(sel), [want], JSON.stringify(sel));
    }
  });

  test('the field prefix is the caller’s', () => {
    assert.deepEqual(selectorErrors(1, 'sel'), ['sel: must be an object']);
  });
});

describe('parseLabelList (--node-labels)', () => {
  test('k=v pairs, bare keys, spaces and empty parts', () => {
    assert.deepEqual(parseLabelList('zone=a, disk=ssd ,node-role.kubernetes.io/worker,,x=a=b'), {
      zone: 'a',
      disk: 'ssd',
      'node-role.kubernetes.io/worker': '',
      x: 'a=b',
    });
    assert.deepEqual(parseLabelList(''), {});
  });
});
