// docs/kubelet-credential-verification.md's tables of what the real 1.35
// and 1.36 kubelets did (the node suite, test/node/kubelet-verification.node.ts,
// compares each run with its version's table): whole, one row per
// configuration and image, one outcome per case; the configuration pinset
// prints for the version starting every pod of a pinned image; and the
// sibling repository exempted by 1.35's "/*" entries, verified under 1.36's
// exact ones.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { CASES, CONFIGS, documentedOutcomes, IMAGES, PINNED, TABLE_DOC, TABLE_MINORS } from '../support/kubelet-verification-table.ts';

for (const minor of TABLE_MINORS) {
  test(`1.${minor}: the table of measured scenarios is whole, and pinset's drop-in starts every pod of a pinned image`, () => {
    const table = documentedOutcomes(readFileSync(TABLE_DOC, 'utf8'), minor);
    assert.deepEqual(Object.keys(table).sort(), [...CONFIGS].sort());
    for (const config of CONFIGS) {
      assert.deepEqual(Object.keys(table[config]!).sort(), [...IMAGES].sort(), config);
      for (const image of IMAGES) {
        for (const c of CASES) assert.match(table[config]![image][c], /^(Running|ErrImagePull|ErrImageNeverPull)$/, `${config} ${image} ${c}`);
      }
    }
    for (const image of PINNED) for (const c of CASES) assert.equal(table.pinset![image][c], 'Running', `pinset's drop-in: ${image} ${c}`);
    // The sibling: exempted by 1.35's "/*" entry for its path; 1.36's exact entries do not name it, so it stays verified.
    for (const c of CASES) assert.equal(table.pinset!['secret-sibling'][c], minor >= 36 ? 'ErrImagePull' : 'Running', `pinset's drop-in, the sibling, ${c}`);
  });
}
