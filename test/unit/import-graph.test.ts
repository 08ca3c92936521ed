// The layers of src/ hold (scripts/import-graph.ts): no circle, no import
// from a lower folder to a higher one, no import of a runtime's folder from
// the agent outside its composition root, no file far past 400 lines, no
// function of the composition root past 40 lines. And the check itself
// finds each fault in a tree made to have them.
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, test } from 'node:test';
import { lengthsUnder } from '../../scripts/function-lengths.ts';
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

  test('within agent/, only the composition root (agent/boot/) imports crio/ or containerd/', () => {
    const g = importGraph(SRC);
    assert.deepEqual(g.runtimeInAgent, []);
    // The rule has something to hold: the composition root does import them.
    const boot = [...g.files].filter(([f]) => f.startsWith('agent/boot/')).flatMap(([, f]) => f.imports);
    assert.ok(boot.some((t) => t.startsWith('crio/')) && boot.some((t) => t.startsWith('containerd/')));
  });

  test('no function of the composition root is over 40 lines', () => {
    const long = lengthsUnder(path.join(SRC, 'agent', 'boot'), SRC).filter((f) => f.lines > 40);
    assert.deepEqual(long, []);
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
      assert.deepEqual(g.runtimeInAgent, []);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  test('the check finds the agent importing a runtime outside its composition root, type-only and in a sub-folder too', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-graph-'));
    try {
      for (const d of ['crio', 'containerd', 'pins', 'agent/boot', 'agent/drop-pins']) await mkdir(path.join(dir, d), { recursive: true });
      await writeFile(path.join(dir, 'crio', 'pins.ts'), 'export const crio = 1;\n');
      await writeFile(path.join(dir, 'containerd', 'pins.ts'), 'export const containerd = 1;\n');
      await writeFile(path.join(dir, 'pins', 'seam.ts'), 'export type Seam = number;\n');
      await writeFile(path.join(dir, 'agent', 'boot', 'kit.ts'), "import { crio } from '../../crio/pins.ts';\nimport { containerd } from '../../containerd/pins.ts';\nexport const kit = crio + containerd;\n");
      await writeFile(path.join(dir, 'agent', 'loop.ts'), "import type { Seam } from '../pins/seam.ts';\nimport type { crio } from '../crio/pins.ts';\nexport const loop = 1;\n");
      await writeFile(path.join(dir, 'agent', 'drop-pins', 'drop.ts'), "import { kit } from '../boot/kit.ts';\nexport const drop = () => import('../../containerd/pins.ts');\n");
      const g = importGraph(dir);
      assert.deepEqual([...g.runtimeInAgent].sort((a, b) => a.from.localeCompare(b.from)), [
        { from: 'agent/drop-pins/drop.ts', to: 'containerd/pins.ts' },
        { from: 'agent/loop.ts', to: 'crio/pins.ts' },
      ]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
