// Nothing half-written is ever visible to CRI-O. The agent, a real process,
// is SIGKILLed right after each step of a pin file write (the test-only
// PINSET_TEST_SIGKILL_AT makes it kill itself there, as a crash or power
// loss would stop it). After each kill, CRI-O's way of reading its folder
// (the stand-in's reader: every file, dotfiles and subfolders included,
// decoded as TOML) accepts the folder with the old pins or the new ones,
// and nothing but the pin file is in it; the agent restarted as a service
// converges (CRI-O pins the new list) and removes the temp file it left in
// the staging folder.
import { afterEach, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readdir, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { WRITE_STEPS } from '../../src/crio/pinfile.ts';
import { readPinFile, runAgentOnce } from '../support/agent-process.ts';
import { readPinnedImages } from '../support/fake-crio.ts';
import { makeNodeBed, setObject, type NodeBed } from '../support/node-bed.ts';

const hex = (c: string) => c.repeat(64);
const img = (repo: string, c: string) => `registry.test/${repo}@sha256:${hex(c)}`;
const IMAGES = 'abcdef'.split('').map((c) => img(`app-${c}`, c));
const CATALOGUE = Object.fromEntries(IMAGES.map((r) => [r, { size: 1000 }]));

let bed: NodeBed;
beforeEach(async () => {
  bed = await makeNodeBed({ catalogue: CATALOGUE });
});
afterEach(async () => {
  await bed.stop();
});

async function setImages(images: string[]): Promise<void> {
  await writeFile(join(bed.staticDir, 'set.yaml'), JSON.stringify(setObject('crashy', images)));
}

/** --once without the API (static sets only), with the CRI-O stand-in's bus. */
const once = (env: NodeJS.ProcessEnv = {}) => runAgentOnce(bed.args([], { api: false }), { env: { ...bed.node.env, ...env } });

/** What CRI-O would make of the folder now; throws as CRI-O refuses, on any file it cannot decode. */
async function crioView(): Promise<{ pins: string[]; files: string[] }> {
  return { pins: await readPinnedImages(bed.node.dropInDir), files: await readdir(bed.node.dropInDir) };
}

describe('killed at each step of a pin file write', () => {
  test('the folder CRI-O reads is whole after every kill, and a restart converges', async () => {
    const staging = join(dirname(bed.node.dropInDir), '.pinset');
    let current = [IMAGES[0]!];
    await setImages(current);
    const first = await once();
    assert.equal(first.code, 0, first.stderr);
    const pinFile = (await readPinFile(bed.node.dropInDir))!;
    const name = pinFile.file.slice(bed.node.dropInDir.length + 1);

    for (const [i, step] of WRITE_STEPS.entries()) {
      const next = [IMAGES[i + 1]!, IMAGES[0]!].sort();
      await setImages(next);
      const killed = await once({ PINSET_TEST_SIGKILL_AT: step });
      assert.equal(killed.code, null, `killed at ${step}, not exited: ${killed.stderr}`);
      assert.equal(killed.stdout, '', `killed at ${step} before reporting`);

      const view = await crioView();
      assert.deepEqual(view.files, [name], `only the pin file in crio.conf.d after a kill at ${step}`);
      const renamed = WRITE_STEPS.indexOf(step) >= WRITE_STEPS.indexOf('renamed');
      assert.deepEqual(view.pins, renamed ? next : current, `CRI-O reads ${renamed ? 'the new' : 'the previous'} pins after a kill at ${step}`);
      const temps = (await readdir(staging)).filter((f) => f !== 'agent.lock');
      assert.deepEqual(temps, renamed ? [] : [`${name}.tmp`], `staging folder after a kill at ${step}`);

      // Restarted as the service restarts it: it converges, CRI-O pinning the new list.
      const agent = bed.start([], { api: false });
      await bed.api.waitFor(() => next.every((r) => bed.node.crio.image(r)?.pinned === true), 30_000, `${next.join(', ')} pinned by CRI-O after a restart (killed at ${step})`);
      assert.equal(await agent.stop(), 0);
      assert.deepEqual((await crioView()).pins, next);
      assert.deepEqual(await readdir(staging), ['agent.lock'], 'the restart removed its temp file');
      current = next;
    }
  });

  test('killed while writing the very first pin file: CRI-O reads an empty folder, a restart writes it', async () => {
    await setImages([IMAGES[0]!]);
    const killed = await once({ PINSET_TEST_SIGKILL_AT: 'temp-written' });
    assert.equal(killed.code, null, killed.stderr);
    assert.deepEqual(await crioView(), { pins: [], files: [] });
    const again = await once();
    assert.equal(again.code, 0, again.stderr);
    assert.deepEqual((await crioView()).pins, [IMAGES[0]]);
  });
});
