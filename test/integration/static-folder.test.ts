// The static folder as Kubernetes and people fill it, against the agent as
// a process: a ConfigMap volume (links through `..data`), a set file that
// stops being readable in every way a node can make it (its sets keep their
// pins and say why, naming the file), YAML a parser chokes on, and one bad
// file never touching the other file's set. The pin file stays valid and
// unrewritten throughout, and CRI-O (the stand-in) keeps the images pinned.
import { afterEach, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, rmSync, symlinkSync } from 'node:fs';
import { mkdir, rename, rm, stat, symlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { readPinFile, runAgentOnce } from '../support/agent-process.ts';
import { readPinnedImages } from '../support/fake-crio.ts';
import { makeNodeBed, setObject, type NodeBed } from '../support/node-bed.ts';

const hex = (c: string) => c.repeat(64);
const img = (repo: string, c: string) => `registry.test/${repo}@sha256:${hex(c)}`;
const CM1 = img('from-configmap/app', 'a');
const CM2 = img('from-configmap/app', 'b');
const OTHER = img('other/tool', 'c');
const CATALOGUE = Object.fromEntries([CM1, CM2, OTHER].map((r) => [r, { size: 1000 }]));

const yamlOf = (o: object) => JSON.stringify(o, null, 2);

let bed: NodeBed;
beforeEach(async () => {
  bed = await makeNodeBed({ catalogue: CATALOGUE });
});
afterEach(async () => {
  await bed.stop();
});

/** A ConfigMap volume update as the kubelet's atomic writer makes it: a new timestamped folder, `..data` swapped, one link per key. */
async function configMap(dir: string, files: Record<string, string>, stamp: string): Promise<void> {
  const ts = join(dir, `..${stamp}`);
  await mkdir(ts);
  for (const [k, v] of Object.entries(files)) await writeFile(join(ts, k), v);
  await symlink(`..${stamp}`, join(dir, '..data_tmp'));
  await rename(join(dir, '..data_tmp'), join(dir, '..data'));
  for (const k of Object.keys(files)) await symlink(`..data/${k}`, join(dir, k)).catch((e: NodeJS.ErrnoException) => (e.code === 'EEXIST' ? undefined : Promise.reject(e)));
}

const ready = (s: { phase: string }) => s.phase === 'Ready';

describe('the static folder', () => {
  test('a ConfigMap set applies; while its file cannot be read its pins stay and its status names the file; only removing the name unpins', async () => {
    const dir = bed.staticDir;
    await configMap(dir, { 'cm.yaml': yamlOf(setObject('cm', [CM1])) }, '2026_11_24_10_00_00.000000001');
    await writeFile(join(dir, 'other.yaml'), yamlOf(setObject('other', [OTHER])));
    const agent = bed.start();
    await bed.waitForSet('cm', ready, 'Ready from the ConfigMap');
    await bed.waitForSet('other', ready, 'Ready');
    const pinFile = (await readPinFile(bed.node.dropInDir))!;
    assert.deepEqual(pinFile.pins, [CM1, OTHER].sort());
    assert.equal(bed.node.crio.image(CM1)?.pinned, true);
    const written = await stat(pinFile.file);

    const file = join(dir, 'cm.yaml');
    // The file's name taken over in one rename: a reconcile between a
    // removal and what replaces it would see the name gone, rightly, and
    // remove the set.
    // A folder cannot take a file's place in one rename, nor a file a
    // folder's: those two changes are made by synchronous calls, one right
    // after the other.
    const replaceWithLink = async (target: string) => {
      await symlink(target, join(dir, '.next-link'));
      await rename(join(dir, '.next-link'), file);
    };
    const replaceWithText = async (text: string) => {
      await writeFile(join(dir, '.next-text'), text);
      await rename(join(dir, '.next-text'), file);
    };
    const breakages: { name: string; breakIt: () => Promise<void>; error: RegExp }[] = [
      {
        name: 'link target gone',
        // An update whose new folder lacks the key, while the key's link stays.
        breakIt: () => configMap(dir, { 'unrelated.txt': 'x' }, '2026_11_24_10_05_00.000000002'),
        error: /its symbolic link points to \.\.data\/cm\.yaml, which does not exist/,
      },
      {
        name: 'link loop',
        breakIt: async () => {
          await symlink('cm.yaml', join(dir, 'loop.yml.d'));
          await replaceWithLink('loop.yml.d');
        },
        error: /loop of symbolic links \(ELOOP\)/,
      },
      {
        name: 'replaced by a folder',
        breakIt: async () => {
          rmSync(file);
          mkdirSync(file);
        },
        error: /it is a folder, not a file/,
      },
      {
        name: 'I/O error',
        breakIt: async () => {
          rmSync(file, { recursive: true });
          symlinkSync('/proc/self/mem', file);
        },
        error: /an I\/O error \(EIO\)/,
      },
      {
        name: 'alias bomb',
        breakIt: async () => {
          const lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]'];
          for (const [i, c] of [...'bcdefghi'].entries()) lines.push(`${c}: &${c} [${Array(9).fill(`*${'abcdefghi'[i]}`).join(',')}]`);
          await replaceWithText(lines.join('\n') + '\n');
        },
        error: /Excessive alias count/,
      },
      {
        name: 'unresolved alias',
        breakIt: () => replaceWithText('apiVersion: pinset.dev/v1alpha1\nkind: PinnedImageSet\nmetadata: *nowhere\n'),
        error: /Unresolved alias/,
      },
    ];
    for (const b of breakages) {
      await b.breakIt();
      const s = await bed.waitForSet('cm', (x) => x.reason === 'StaticFileUnreadable' && b.error.test(x.message ?? ''), `StaticFileUnreadable: ${b.name}`);
      assert.equal(s.phase, 'Degraded');
      assert.ok(s.message!.includes(file), `the status names the file: ${s.message}`);
      assert.deepEqual(s.images, { wanted: 1, present: 1, pinned: 1, failed: 0, invalid: 0 }, b.name);
      assert.equal(bed.setStatus('other')?.phase, 'Ready', `the other set is untouched (${b.name})`);
      // The pin file: valid for CRI-O, the same pins, not even rewritten.
      assert.deepEqual(await readPinnedImages(bed.node.dropInDir), [CM1, OTHER].sort(), b.name);
      const now = await stat(pinFile.file);
      assert.equal(now.ino, written.ino, `pin file not rewritten (${b.name})`);
      assert.equal(now.mtimeMs, written.mtimeMs);
      assert.equal(bed.node.crio.image(CM1)?.pinned, true, `CRI-O still pins it (${b.name})`);
    }
    // Logged once per change of state, not at every resync (2 s).
    await agent.waitForReconcile(agent.mark());
    const warned = agent.logs().filter((l) => l.file === file && l.level === 'warn');
    assert.equal(warned.length, breakages.length, JSON.stringify(warned.map((l) => l.err)));

    // Readable again, with new content: it applies.
    await replaceWithText(yamlOf(setObject('cm', [CM2])));
    await bed.waitForSet('cm', (x) => ready(x) && x.images.wanted === 1, 'Ready again');
    await bed.api.waitFor(async () => (await readPinFile(bed.node.dropInDir))?.pins.join() === [CM2, OTHER].sort().join(), 20_000, 'the new content pinned');
    assert.equal(bed.node.crio.image(CM2)?.pinned, true);

    // Broken again, then its name removed from the folder: now, and only now, its set goes.
    // In one rename (a link to a folder takes the file's place): a reconcile
    // between a removal and a mkdir would see the name gone, rightly.
    await mkdir(join(dir, 'held-target.d'));
    await replaceWithLink('held-target.d');
    await bed.waitForSet('cm', (x) => x.reason === 'StaticFileUnreadable', 'held again');
    await rm(file, { recursive: true });
    await bed.api.waitFor(() => bed.status() && !bed.setStatus('cm'), 20_000, 'the set leaves the status');
    await bed.api.waitFor(async () => (await readPinFile(bed.node.dropInDir))?.pins.join() === OTHER, 20_000, 'its pins removed');
    assert.equal(bed.node.crio.image(CM2)?.pinned, false, 'unpinned by CRI-O');
    assert.ok(bed.node.crio.image(CM2), 'the image stays on the node');
    assert.equal(bed.setStatus('other')?.phase, 'Ready');
  });

  test('--once: a file with an alias bomb next to a good file: the good set is pinned and Ready, the bad file named, exit 1', async () => {
    await writeFile(join(bed.staticDir, 'bad.yaml'), 'a: &a [1,1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\n');
    await writeFile(join(bed.staticDir, 'good.yaml'), yamlOf(setObject('good', [OTHER])));
    const r = await runAgentOnce(bed.args([], { api: false }), { env: bed.node.env });
    assert.equal(r.code, 1, r.stderr);
    assert.deepEqual(r.sets.map((s) => [s.name, s.phase]), [['good', 'Ready']]);
    assert.match(r.stderr, /static set file unreadable since the agent started/);
    assert.match(r.stderr, /bad\.yaml/);
    assert.match(r.stderr, /Excessive alias count/);
    assert.doesNotMatch(r.stderr, /reconcile failed/);
    assert.deepEqual((await readPinFile(bed.node.dropInDir))?.pins, [OTHER]);
  });
});
