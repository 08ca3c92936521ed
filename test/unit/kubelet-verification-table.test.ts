// docs/kubelet-credential-verification.md's table of what the real 1.35
// kubelet did (the node suite, test/node/kubelet-verification.node.ts,
// compares each run with it): whole, one row per configuration and image,
// one outcome per case, and the configuration pinset recommends starting
// every pod.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { CASES, CONFIGS, documentedOutcomes, IMAGES, TABLE_DOC } from '../support/kubelet-verification-table.ts';

test('the table of measured scenarios is whole, and pinset\'s drop-in starts every pod in it', () => {
  const table = documentedOutcomes(readFileSync(TABLE_DOC, 'utf8'));
  assert.deepEqual(Object.keys(table).sort(), [...CONFIGS].sort());
  for (const config of CONFIGS) {
    assert.deepEqual(Object.keys(table[config]!).sort(), [...IMAGES].sort(), config);
    for (const image of IMAGES) {
      for (const c of CASES) assert.match(table[config]![image][c], /^(Running|ErrImagePull|ErrImageNeverPull)$/, `${config} ${image} ${c}`);
    }
  }
  for (const image of IMAGES) for (const c of CASES) assert.equal(table.pinset![image][c], 'Running', `pinset's drop-in: ${image} ${c}`);
});
