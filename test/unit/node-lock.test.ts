// src/agent/node-lock.ts: a lock file and its folder are pinset's own. A
// name planted at the node lock's place (a hard link, a symbolic link, a
// FIFO, the folder a link), or at the place earlier versions kept it on a
// CRI-O node, is refused naming the file and what to do: nothing is
// followed, nothing is written through, the lock is not held, and what the
// planted name points at is left as it was. The holder is read with a bound.
import { afterEach, beforeEach, describe, test, type TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { link, mkdir, mkdtemp, readdir, readFile, rm, stat, symlink, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { NodeLock, type LockFileSpec, type LockHolder } from '../../src/agent/node-lock.ts';
import { OwnFileError } from '../../src/util/own-file.ts';

const identity = (pid: number): Omit<LockHolder, 'lockedAt'> => ({ pid, host: 'h', node: 'n', runsIn: 'host', startedAt: '2026-01-01T00:00:00Z' });

let dir: string;
/** A file a planted name points at, with what it held and when it last changed. */
let victim: { file: string; mtimeMs: number };
beforeEach(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-node-lock-'));
  const file = path.join(dir, 'shadow');
  await writeFile(file, 'root:x:0:0\n');
  victim = { file, mtimeMs: (await stat(file)).mtimeMs };
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

async function victimUntouched(): Promise<void> {
  assert.equal(await readFile(victim.file, 'utf8'), 'root:x:0:0\n', 'what the planted name points at keeps its content');
  assert.equal((await stat(victim.file)).mtimeMs, victim.mtimeMs, 'and was not written to');
}

/** The node's lock in <dir>/state, and the place earlier versions used in <dir>/crio/.pinset, taken best effort, as ../../src/agent/boot/node-lock-place.ts lays them out. */
function places(): { node: string; earlier: string; files: LockFileSpec[] } {
  const node = path.join(dir, 'state', 'agent.lock');
  const earlier = path.join(dir, 'crio', '.pinset', 'agent.lock');
  return { node, earlier, files: [{ path: node, folderFlag: '--state-dir' }, { path: earlier, bestEffort: true }] };
}

/** acquire() refused with an OwnFileError whose message is `message`; the lock not held, and when the refusal is the second file's, the first (taken before it) free for another agent. */
async function refused(files: LockFileSpec[], message: RegExp | string, secondRefused: boolean): Promise<void> {
  const lock = new NodeLock(files, identity(1));
  await assert.rejects(lock.acquire({ timeoutMs: 2_000 }), (e: unknown) => {
    assert.ok(e instanceof OwnFileError, `an OwnFileError, not ${String(e)}`);
    if (typeof message === 'string') assert.equal(e.message, message);
    else assert.match(e.message, message);
    return true;
  });
  assert.equal(lock.isHeld, false);
  if (!secondRefused) return;
  const other = new NodeLock([files[0]!.path], identity(2));
  assert.equal(await other.acquire({ timeoutMs: 0 }), true, 'the files taken before the refusal are released');
  other.release();
}

describe("the node lock's place is pinset's own", () => {
  for (const at of ['node', 'earlier'] as const) {
    const where = at === 'node' ? "at the node lock's path" : 'where earlier versions kept it';
    test(`a hard link planted ${where} is refused: the file it shares is neither locked nor written`, async () => {
      const p = places();
      await mkdir(path.dirname(p[at]), { recursive: true });
      await link(victim.file, p[at]);
      await refused(p.files, `the node lock ${p[at]} has 2 hard links: another name shares it, which writing it would overwrite; remove ${p[at]}`, at === 'earlier');
      await victimUntouched();
      // Removed as the message says: the lock is taken.
      await rm(p[at]);
      const lock = new NodeLock(p.files, identity(3));
      assert.equal(await lock.acquire({ timeoutMs: 0 }), true);
      assert.equal(JSON.parse(await readFile(p[at], 'utf8')).pid, 3);
      lock.release();
      await victimUntouched();
    });

    test(`a symbolic link planted ${where} is refused, not followed`, async () => {
      const p = places();
      await mkdir(path.dirname(p[at]), { recursive: true });
      await symlink(victim.file, p[at]);
      await refused(p.files, `the node lock ${p[at]} is a symbolic link: pinset writes only its own file there; remove the link`, at === 'earlier');
      await victimUntouched();
      // A dangling one is not made through either.
      await rm(p[at]);
      const nowhere = path.join(dir, 'made-through-the-link');
      await symlink(nowhere, p[at]);
      await refused(p.files, /is a symbolic link/, at === 'earlier');
      await assert.rejects(stat(nowhere), { code: 'ENOENT' });
    });

    test(`a FIFO ${where} is refused at once, never waited on`, async () => {
      const p = places();
      await mkdir(path.dirname(p[at]), { recursive: true });
      execFileSync('mkfifo', [p[at]]);
      await refused(p.files, `the node lock ${p[at]} is not a regular file: pinset writes only its own file there; remove it`, at === 'earlier');
    });

    test(`the lock's folder a symbolic link ${where}: refused, nothing made where it points`, async () => {
      const p = places();
      const elsewhere = path.join(dir, 'elsewhere');
      await mkdir(elsewhere);
      await mkdir(path.dirname(path.dirname(p[at])), { recursive: true });
      await symlink(elsewhere, path.dirname(p[at]));
      const instead = at === 'node' ? 'give --state-dir the folder the link points to, or replace the link with a folder' : 'replace the link with a folder';
      await refused(p.files, `the node lock's folder ${path.dirname(p[at])} is a symbolic link (to ${elsewhere}): pinset takes its lock ${p[at]} only in a folder of its own, not through a link; ${instead}`, at === 'earlier');
      assert.deepEqual(await readdir(elsewhere), [], 'no lock file made where the link points');
    });
  }

  test('a best-effort file in a folder this process cannot write (taken read-only): planted names refused there too, a FIFO never waited on', async (t) => {
    const p = places();
    const ro = path.dirname(p.earlier);
    await mkdir(ro, { recursive: true });
    execFileSync('mkfifo', [p.earlier]);
    if (!readOnly(t, ro)) return;
    try {
      // Without O_NONBLOCK, open(2) of a FIFO blocks until a writer comes.
      await refused(p.files, `the node lock ${p.earlier} is not a regular file: pinset writes only its own file there; remove it`, true);
    } finally {
      execFileSync('umount', [ro]);
    }
    await rm(p.earlier);
    await link(victim.file, p.earlier);
    if (!readOnly(t, ro)) return;
    try {
      await refused(p.files, `the node lock ${p.earlier} has 2 hard links: another name shares it, which writing it would overwrite; remove ${p.earlier}`, true);
      await victimUntouched();
    } finally {
      execFileSync('umount', [ro]);
    }
  });

  test("a lock file the holder's identity does not fit in is read up to 4096 bytes, and names no holder", async () => {
    const p = places();
    const holder = new NodeLock([p.node], identity(1));
    assert.equal(await holder.acquire(), true);
    // Rewritten in place (the same inode, so the lock stays whole): an identity padded past the bound.
    await writeFile(p.node, JSON.stringify({ ...identity(7), lockedAt: '2026-01-01T00:00:01Z', padding: 'x'.repeat(5000) }));
    const seen: (LockHolder | null)[] = [];
    const waiter = new NodeLock([p.node], identity(2));
    assert.equal(await waiter.acquire({ timeoutMs: 300, onWait: (h) => seen.push(h) }), false);
    assert.deepEqual(seen, [null], 'not read past the bound: the holder is not named');
    // Within the bound, the same file names it.
    await writeFile(p.node, JSON.stringify({ ...identity(7), lockedAt: '2026-01-01T00:00:01Z' }));
    const named: (LockHolder | null)[] = [];
    assert.equal(await waiter.acquire({ timeoutMs: 300, onWait: (h) => named.push(h) }), false);
    assert.equal(named[0]?.pid, 7);
    holder.release();
  });
});

/** `folder` made a read-only bind mount of itself (root writes through file modes, not through a read-only mount); false, the test skipped, where mounts cannot be made. */
function readOnly(t: TestContext, folder: string): boolean {
  if (process.getuid?.() !== 0) {
    t.skip('needs root to make a read-only bind mount');
    return false;
  }
  try {
    execFileSync('mount', ['--bind', folder, folder], { stdio: 'pipe' });
  } catch (e) {
    t.skip(`cannot make a bind mount here: ${String((e as { stderr?: Buffer }).stderr ?? e).trim()}`);
    return false;
  }
  try {
    execFileSync('mount', ['-o', 'remount,bind,ro', folder], { stdio: 'pipe' });
    return true;
  } catch (e) {
    execFileSync('umount', [folder]);
    t.skip(`cannot make a read-only bind mount here: ${String((e as { stderr?: Buffer }).stderr ?? e).trim()}`);
    return false;
  }
}
