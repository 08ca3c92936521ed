// Real, separate filesystems for disk tests: a tmpfs, or ext4 on a loop
// device, mounted under a temporary folder (root only; tests skip without).
// Filled to a chosen use with a plain file, as images would fill it.
import { execFile } from 'node:child_process';
import * as fsp from 'node:fs/promises';
import * as path from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

export interface ScratchFs {
  /** Where it is mounted. */
  path: string;
  /** Write a filler file until the kubelet's measure of use is at least `percent`. */
  fill(percent: number): Promise<void>;
  /** Remove the filler file. */
  free(): Promise<void>;
  unmount(): Promise<void>;
}

function scratch(at: string, cleanup: () => Promise<void>): ScratchFs {
  const filler = path.join(at, 'filler');
  return {
    path: at,
    async fill(percent) {
      const st = await fsp.statfs(at);
      const size = st.blocks * st.bsize;
      const keepFree = Math.floor((size * (100 - percent)) / 100) - 64 * 1024;
      const bytes = Math.max(0, st.bavail * st.bsize - keepFree);
      await fsp.writeFile(filler, Buffer.alloc(bytes, 0x5a));
    },
    async free() {
      await fsp.rm(filler, { force: true });
    },
    unmount: cleanup,
  };
}

async function umount(at: string): Promise<void> {
  await run('umount', [at]).catch(() => run('umount', ['-l', at]).catch(() => {}));
}

/** A tmpfs of `bytes` at `at` (created); a string says why it could not be mounted. */
export async function mountTmpfs(at: string, bytes: number): Promise<ScratchFs | string> {
  if (process.getuid?.() !== 0) return 'mounting a tmpfs needs root';
  await fsp.mkdir(at, { recursive: true });
  try {
    await run('mount', ['-t', 'tmpfs', '-o', `size=${bytes}`, 'pinset-test', at]);
  } catch (e) {
    return `mount -t tmpfs failed: ${(e as Error).message}`;
  }
  return scratch(at, () => umount(at));
}

/** ext4 in an image file on a loop device, mounted at `at`; a string says why not. */
export async function mountLoopExt4(at: string, image: string, bytes: number): Promise<ScratchFs | string> {
  if (process.getuid?.() !== 0) return 'mounting a loop device needs root';
  await fsp.mkdir(at, { recursive: true });
  try {
    await fsp.writeFile(image, '');
    await fsp.truncate(image, bytes);
    await run('mkfs.ext4', ['-q', '-F', image]);
    await run('mount', ['-o', 'loop', image, at]);
  } catch (e) {
    return `a loop-mounted ext4 could not be made: ${(e as Error).message}`;
  }
  return scratch(at, async () => {
    await umount(at);
    await fsp.rm(image, { force: true });
  });
}
