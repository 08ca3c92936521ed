// A DaemonSet a user wrote that mounts only /etc/crio/crio.conf.d: the
// drop-in folder is a mount point of its own, and the agent's staging folder
// beside it is on another mount, where rename(2) fails with EXDEV. Here a
// real bind mount over the CRI-O stand-in's folder (root only). The agent
// says at start what to mount instead, refuses every write with that same
// message (the sets' status: PinFileWriteFailed, not a raw EXDEV), and keeps
// the pins it had; mounted as one again, it pins.
import { afterEach, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readdir, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { readPinnedImages } from '../support/fake-crio.ts';
import { readPinFile } from '../support/agent-process.ts';
import { makeNodeBed, setObject, type NodeBed } from '../support/node-bed.ts';

const run = promisify(execFile);
const hex = (c: string) => c.repeat(64);
const img = (repo: string, c: string) => `registry.test/${repo}@sha256:${hex(c)}`;
const A = img('team-a/web', 'a');
const B = img('team-b/api', 'b');
const CATALOGUE = Object.fromEntries([A, B].map((r) => [r, { size: 1000 }]));
const esc = (s: string) => s.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&');

let bed: NodeBed;
let mounted: string | undefined;
beforeEach(async () => {
  bed = await makeNodeBed({ catalogue: CATALOGUE });
});
afterEach(async () => {
  if (mounted) await run('umount', [mounted]).catch(() => run('umount', ['-l', mounted!]));
  mounted = undefined;
  await bed.stop();
});

describe('crio.conf.d mounted on its own', () => {
  test('one clear message at start and in the status, no write, the pins kept; one mount again and it pins', async (t) => {
    if (process.getuid?.() !== 0) return t.skip('a bind mount needs root');
    const dropIn = bed.node.dropInDir;
    const staging = join(dirname(dropIn), '.pinset');
    await writeFile(join(bed.staticDir, 'sets.yaml'), JSON.stringify(setObject('apps', [A])));
    const first = bed.start();
    await bed.waitForSet('apps', (s) => s.phase === 'Ready', 'Ready on one mount');
    await first.stop();
    assert.deepEqual((await readPinFile(dropIn))?.pins, [A]);

    // The user's DaemonSet: crio.conf.d its own mount point (same filesystem, so the same st_dev).
    await run('mount', ['--bind', dropIn, dropIn]);
    mounted = dropIn;
    await writeFile(join(bed.staticDir, 'sets.yaml'), JSON.stringify(setObject('apps', [A, B])));
    const agent = bed.start();
    const startLine = await agent.waitForLog((l) => l.level === 'error' && /EXDEV/.test(String(l.msg)), 20_000, 'the start-up error');
    const message = String(startLine.msg);
    assert.match(message, new RegExp(`^${esc(dropIn)} is a mount point of its own, apart from the staging folder ${esc(staging)}: `));
    assert.match(message, new RegExp(`Mount ${esc(dirname(dropIn))} read-write as one mount instead`));
    assert.deepEqual([startLine.dropInDir, startLine.stagingDir], [dropIn, staging]);

    const s = await bed.waitForSet('apps', (x) => x.reason === 'PinFileWriteFailed', 'PinFileWriteFailed');
    assert.equal(s.phase, 'Degraded');
    assert.ok(s.message?.endsWith(message), `the status carries the same message, not a raw EXDEV: ${s.message}`);
    assert.doesNotMatch(s.message ?? '', /EXDEV: cross-device link/);
    assert.deepEqual((await readPinFile(dropIn))?.pins, [A], 'the pin file is as it was');
    assert.deepEqual(await readPinnedImages(dropIn), [A], 'CRI-O would still load the pin of A');
    assert.deepEqual(await readdir(staging).then((n) => n.filter((x) => x.endsWith('.tmp'))), [], 'no temp file left behind');
    await agent.stop();

    // Mounted as one again (the pod restarted with /etc/crio mounted): it pins.
    await run('umount', [dropIn]);
    mounted = undefined;
    bed.start();
    await bed.waitForSet('apps', (x) => x.phase === 'Ready' && x.images.pinned === 2, 'Ready with both images');
    assert.deepEqual((await readPinFile(dropIn))?.pins, [A, B].sort());
    assert.equal(bed.agent!.logs().filter((l) => /EXDEV/.test(String(l.msg))).length, 0, 'no complaint on one mount');
  });
});
