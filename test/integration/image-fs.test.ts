// The disk check measures the runtime's image filesystem, with the agent as
// a process: the CRI-O stand-in names (ImageFsInfo) a folder on a real tmpfs
// filled above the watermark, inside this machine's disk, which is not: the
// pull waits. A mountpoint the agent cannot see is said in the node status,
// and nothing else is measured in its place.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { statfsUsage, usedPercent } from '../../src/agent/disk.ts';
import { readPinFile } from '../support/agent-process.ts';
import { makeNodeBed, setObject } from '../support/node-bed.ts';
import { mountTmpfs, type ScratchFs } from '../support/scratch-fs.ts';

const IMAGE = `registry.test/big/app@sha256:${'a'.repeat(64)}`;
const CATALOGUE = { [IMAGE]: { size: 1000 } };

let root: string;
let tmpfs: ScratchFs | string;
before(async () => {
  root = await mkdtemp(join(tmpdir(), 'pinset-imagefs-'));
  tmpfs = await mountTmpfs(join(root, 'containers'), 8 * 1024 * 1024);
});
after(async () => {
  if (typeof tmpfs !== 'string') await tmpfs.unmount();
  await rm(root, { recursive: true, force: true });
});

describe('the image filesystem check', () => {
  test('its own filesystem above 85% (a tmpfs): NoSpace naming it, nothing pulled, pins in place', async (t) => {
    if (typeof tmpfs === 'string') return t.skip(tmpfs);
    const images = join(tmpfs.path, 'storage', 'overlay-images');
    await mkdir(images, { recursive: true });
    await tmpfs.fill(92);
    assert.ok(usedPercent(await statfsUsage(root)) < 85, "this machine's disk must be below 85% for this test");
    const bed = await makeNodeBed({ catalogue: CATALOGUE, imageFsMountpoint: images });
    try {
      await writeFile(join(bed.staticDir, 'big.yaml'), JSON.stringify(setObject('big', [IMAGE])));
      bed.start();
      const s = await bed.waitForSet('big', (x) => x.reason === 'NoSpace', 'NoSpace');
      assert.equal(s.phase, 'Degraded');
      assert.match(s.message ?? '', new RegExp(`image filesystem ${images.replaceAll('/', '\\/')} is (9\\d|100)% full .* at or above the 85% high watermark`));
      assert.equal(bed.node.crio.pullCount(), 0, 'no pull was started');
      assert.deepEqual((await readPinFile(bed.node.dropInDir))?.pins, [IMAGE], 'pinned before it is pulled');
      assert.equal(bed.status()?.imageFilesystemError, undefined, 'measured');
    } finally {
      await bed.stop();
      await tmpfs.free();
    }
  });

  test('a mountpoint the agent cannot see: the node status says so, pulls go ahead, nothing else is measured', async () => {
    const invisible = join(root, 'not-mounted-in-this-pod', 'overlay-images');
    const bed = await makeNodeBed({ catalogue: CATALOGUE, imageFsMountpoint: invisible });
    try {
      await writeFile(join(bed.staticDir, 'big.yaml'), JSON.stringify(setObject('big', [IMAGE])));
      // A 1% watermark: measuring any other filesystem (this machine's disk) would stop the pull.
      const agent = bed.start(['--image-fs-high-watermark', '1']);
      await bed.waitForSet('big', (x) => x.phase === 'Ready', 'Ready');
      assert.equal(bed.node.crio.pullCount(), 1);
      const status = await bed.api.waitFor(() => bed.status()?.imageFilesystemError, 10_000, 'imageFilesystemError in the node status');
      assert.match(status ?? '', new RegExp(`the image filesystem ${invisible.replaceAll('/', '\\/')} \\(CRI ImageFsInfo\\) is not visible to the agent`));
      const warned = agent.logs().filter((l) => l.msg === 'image filesystem cannot be measured; pulls go ahead without the high watermark check');
      assert.equal(warned.length, 1);
      assert.match(String(warned[0]!.err), /not visible to the agent/);
    } finally {
      await bed.stop();
    }
  });
});
