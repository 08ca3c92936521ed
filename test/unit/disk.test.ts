// The disk check on real, separate filesystems: a tmpfs and a loop-mounted
// ext4 inside a temporary folder on this machine's disk. The image
// filesystem is the mounted one; the folder around it (this machine's disk)
// is far below the watermark, so a check that measured the wrong
// filesystem would let pulls through.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import * as fsp from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { DiskCheck, statfsUsage, usedPercent } from '../../src/agent/disk.ts';
import type { ImageRuntime } from '../../src/cri/runtime.ts';
import { captureLogs } from '../support/log-capture.ts';
import { mountLoopExt4, mountTmpfs, type ScratchFs } from '../support/scratch-fs.ts';

function runtimeWithFs(mountpoints: string[]): ImageRuntime {
  return {
    imageFsInfo: async () => mountpoints.map((m) => ({ mountpoint: m, usedBytes: 0 })),
  } as unknown as ImageRuntime;
}

let root: string;
let tmpfs: ScratchFs | string;
before(async () => {
  root = await fsp.mkdtemp(path.join(os.tmpdir(), 'pinset-disk-'));
  tmpfs = await mountTmpfs(path.join(root, 'containers'), 8 * 1024 * 1024);
});
after(async () => {
  if (typeof tmpfs !== 'string') await tmpfs.unmount();
  await fsp.rm(root, { recursive: true, force: true });
});

describe('DiskCheck on a real separate filesystem', () => {
  test('the image filesystem (a tmpfs) above the watermark holds pulls back, though the disk around it is not', async (t) => {
    if (typeof tmpfs === 'string') return t.skip(tmpfs);
    // CRI-O's ImageFsInfo names `<storage root>/<driver>-images`, a folder on the image filesystem.
    const images = path.join(tmpfs.path, 'storage', 'overlay-images');
    await fsp.mkdir(images, { recursive: true });
    const outer = usedPercent(await statfsUsage(root));
    assert.ok(outer < 85, `this machine's disk must be below 85% for this test (it is ${outer}%)`);

    await tmpfs.fill(90);
    let now = 0;
    const check = new DiskCheck(runtimeWithFs([images]), { highWatermarkPercent: 85, now: () => now });
    const problem = await check.problem();
    assert.match(problem ?? '', new RegExp(`^image filesystem ${images.replaceAll('/', '\\/')} is (9\\d|100)% full \\(\\d+\\.\\d MiB free of 8\\.0 MiB\\), at or above the 85% high watermark`));
    assert.equal(check.unmeasured, null);

    await tmpfs.free();
    now += 5_000;
    assert.ok(await check.problem(), 'within 10 s the last answer stands');
    now += 5_000;
    assert.equal(await check.problem(), null, 'after 10 s the disk is asked again, and space was freed');
  });

  test('a loop-mounted ext4: the message names the device, from the mount list entry that is the measured filesystem', async (t) => {
    const loop = await mountLoopExt4(path.join(root, 'loop'), path.join(root, 'loop.img'), 16 * 1024 * 1024);
    if (typeof loop === 'string') return t.skip(loop);
    try {
      await loop.fill(95);
      const problem = await new DiskCheck(runtimeWithFs([loop.path]), { highWatermarkPercent: 85 }).problem();
      assert.match(problem ?? '', new RegExp(`^image filesystem ${loop.path.replaceAll('/', '\\/')} \\(device /dev/loop\\d+, ext4, mounted at ${loop.path.replaceAll('/', '\\/')}\\) is \\d+% full`));
    } finally {
      await loop.unmount();
    }
  });

  test('a mountpoint the agent cannot see: not measured, said so (logged once), pulls not held back, nothing else measured', async () => {
    const invisible = path.join(root, 'not-mounted-here', 'overlay-images');
    const { logger, lines } = captureLogs();
    let now = 0;
    const check = new DiskCheck(runtimeWithFs([invisible]), { highWatermarkPercent: 1, now: () => now, logger });
    // A 1% watermark: any filesystem measured instead (this machine's disk) would block.
    assert.equal(await check.problem(), null);
    assert.match(check.unmeasured ?? '', new RegExp(`the image filesystem ${invisible.replaceAll('/', '\\/')} \\(CRI ImageFsInfo\\) is not visible to the agent; mount the runtime's storage root at the same path`));
    now += 20_000;
    await check.problem();
    now += 20_000;
    await check.problem();
    assert.equal(lines.filter((l) => l.level === 'warn').length, 1, 'logged once, not at every check');
  });

  test('the runtime names no image filesystem: said so; the runtime down or the watermark disabled: no verdict', async () => {
    const none = new DiskCheck(runtimeWithFs([]), { highWatermarkPercent: 85 });
    assert.equal(await none.problem(), null);
    assert.match(none.unmeasured ?? '', /names no image filesystem/);
    const failing = { imageFsInfo: async () => Promise.reject(new Error('down')) } as unknown as ImageRuntime;
    const down = new DiskCheck(failing, { highWatermarkPercent: 85 });
    assert.equal(await down.problem(), null);
    assert.equal(down.unmeasured, null, 'a runtime outage is reported on its own');
    const off = new DiskCheck(runtimeWithFs([path.join(root, 'nowhere')]), { highWatermarkPercent: 0 });
    assert.equal(await off.problem(), null);
    assert.equal(off.unmeasured, null);
  });
});

test('usedPercent counts as the kubelet does: 100 - int(available*100/capacity)', () => {
  assert.equal(usedPercent({ size: 1000, available: 151 }), 85);
  assert.equal(usedPercent({ size: 1000, available: 150 }), 85);
  assert.equal(usedPercent({ size: 1000, available: 159 }), 85);
  assert.equal(usedPercent({ size: 1000, available: 160 }), 84);
});
