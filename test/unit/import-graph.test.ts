// The layers of src/ hold (scripts/import-graph.ts): no circle, no import
// from a lower folder to a higher one, no file far past 400 lines. And the
// check itself finds both faults in a tree made to have them.
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, test } from 'node:test';
import { importGraph } from '../../scripts/import-graph.ts';

const SRC = path.join(import.meta.dirname, '..', '..', 'src');

describe('the import graph of src/', () => {
  test('no circle, no upward import, every file within about 400 lines', () => {
    const g = importGraph(SRC);
    assert.deepEqual(g.circles, []);
    assert.deepEqual(g.upward, []);
    const over = g.largest.filter((f) => f.lines > 420);
    assert.deepEqual(over, [], 'files past about 400 lines');
  });

  test('the check finds a circle, an upward import and a dynamic import', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-graph-'));
    try {
      await mkdir(path.join(dir, 'util'));
      await mkdir(path.join(dir, 'agent'));
      await writeFile(path.join(dir, 'util', 'a.ts'), "import { b } from './b.ts';\nexport const a = 1;\n");
      await writeFile(path.join(dir, 'util', 'b.ts'), "import type { a } from './a.ts';\nexport const b = 2;\n");
      await writeFile(path.join(dir, 'util', 'c.ts'), "export const c = () => import('../agent/x.ts');\n");
      await writeFile(path.join(dir, 'agent', 'x.ts'), "import { a } from '../util/a.ts';\nexport const x = a;\n");
      const g = importGraph(dir);
      assert.deepEqual(g.circles, [['util/a.ts', 'util/b.ts']]);
      assert.deepEqual(g.upward, [{ from: 'util/c.ts', to: 'agent/x.ts' }]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
