// The drop-in folder mounted on its own (a DaemonSet that mounts only
// /etc/crio/crio.conf.d): a real bind mount over the folder, as root. The
// bind mount is of the same filesystem, so st_dev cannot tell it apart;
// rename(2) still fails with EXDEV, and the pin file must refuse to write
// with a message that says what to mount, leaving the current file alone.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import * as fsp from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { promisify } from 'node:util';
import { CrossMountError, crossMountProblem, mountPointOf, parseMountInfo } from '../../src/crio/mounts.ts';
import { PinFile, renderPinFile } from '../../src/crio/pinfile.ts';

const run = promisify(execFile);
const A = `quay.io/org/a@sha256:${'a'.repeat(64)}`;
const B = `quay.io/org/b@sha256:${'b'.repeat(64)}`;
const esc = (s: string) => s.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&');

let root: string;
before(async () => {
  root = await fsp.mkdtemp(path.join(os.tmpdir(), 'pinset-mounts-'));
});
after(async () => {
  await fsp.rm(root, { recursive: true, force: true });
});

/** `<root>/<name>/crio.conf.d` bind-mounted onto itself for the duration of `fn`; a string says why it could not be. */
async function withOwnMount(dir: string, fn: () => Promise<void>): Promise<string | void> {
  if (process.getuid?.() !== 0) return 'a bind mount needs root';
  try {
    await run('mount', ['--bind', dir, dir]);
  } catch (e) {
    return `mount --bind failed: ${(e as Error).message}`;
  }
  try {
    await fn();
  } finally {
    await run('umount', [dir]).catch(() => run('umount', ['-l', dir]));
  }
}

describe('the drop-in folder on a mount of its own', () => {
  test('the probe says EXDEV where st_dev sees one filesystem; the write refuses and the pin file stays as it was', async (t) => {
    const dir = path.join(root, 'own-mount', 'crio.conf.d');
    await fsp.mkdir(dir, { recursive: true });
    const pf = await PinFile.open(dir);
    await pf.write(renderPinFile([A]));
    assert.equal(await pf.mountProblem(), null, 'one mount: no problem');
    const before = await fsp.readFile(pf.path, 'utf8');

    const skipped = await withOwnMount(dir, async () => {
      const [d, p] = [await fsp.stat(dir), await fsp.stat(path.dirname(dir))];
      assert.equal(d.dev, p.dev, 'a bind mount of the same filesystem: st_dev alone cannot tell');

      const problem = await pf.mountProblem();
      assert.ok(problem, 'the layout is detected');
      assert.match(problem, new RegExp(`^${esc(dir)} is a mount point of its own, apart from the staging folder ${esc(pf.stagingDir)}: the pin file cannot be renamed into place \\(EXDEV\\)\\. `));
      assert.match(problem, new RegExp(`Mount ${esc(path.dirname(dir))} read-write as one mount instead \\(deploy/agent/daemonset\\.yaml mounts the host's /etc/crio at /host/etc/crio;`));
      assert.match(problem, /the current pins stay$/);

      const listed = await fsp.readdir(dir);
      await assert.rejects(pf.write(renderPinFile([A, B])), (e: unknown) => {
        assert.ok(e instanceof CrossMountError);
        assert.equal(e.message, problem);
        return true;
      });
      assert.equal(await fsp.readFile(pf.path, 'utf8'), before, 'the current pin file is untouched');
      assert.deepEqual(await fsp.readdir(dir), listed, 'nothing new in the drop-in folder (the probe creates nothing)');
      assert.deepEqual(await fsp.readdir(pf.stagingDir), [], 'no temp file left in the staging folder');
    });
    if (typeof skipped === 'string') return t.skip(skipped);

    await pf.write(renderPinFile([A, B]));
    assert.equal(await fsp.readFile(pf.path, 'utf8'), renderPinFile([A, B]), 'one mount again: the write goes through');
  });

  test('a drop-in folder that does not exist yet is no problem (the first write creates it and asks again)', async () => {
    const dir = path.join(root, 'missing', 'crio.conf.d');
    assert.equal(await crossMountProblem(dir, path.join(root, 'missing', '.pinset')), null);
  });
});

describe('mountinfo, for the message', () => {
  const text = [
    '22 1 0:21 / / rw,relatime - ext4 /dev/vda rw',
    '30 22 0:40 / /etc/crio rw - ext4 /dev/vda rw',
    '31 30 0:41 /crio.conf.d /etc/crio/crio.conf.d rw - ext4 /dev/vda rw',
    '32 22 0:42 / /mnt/with\\040space rw - tmpfs tmpfs rw',
    '',
  ].join('\n');

  test('each line: its id and its mount point, octal escapes decoded', () => {
    assert.deepEqual(parseMountInfo(text), [
      { id: 22, mountPoint: '/' },
      { id: 30, mountPoint: '/etc/crio' },
      { id: 31, mountPoint: '/etc/crio/crio.conf.d' },
      { id: 32, mountPoint: '/mnt/with space' },
    ]);
  });

  test('a path is under the longest mount point that is it or a parent of it', () => {
    const m = parseMountInfo(text);
    assert.equal(mountPointOf(m, '/etc/crio/crio.conf.d'), '/etc/crio/crio.conf.d');
    assert.equal(mountPointOf(m, '/etc/crio/.pinset'), '/etc/crio');
    assert.equal(mountPointOf(m, '/etc/crio-other'), '/', 'a name that only starts like a mount point is not under it');
    assert.equal(mountPointOf(m, '/mnt/with space/x'), '/mnt/with space');
  });
});
