// src/util/own-file.ts: the node lock's file is opened only when its name
// is pinset's own regular file; a planted link of either kind, a FIFO or a
// folder is refused, and what a link points at is never touched.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as fsp from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { openOwnFileReadOnlySync, openOwnFileSync, OwnFileError } from '../../src/util/own-file.ts';

let dir: string;
before(async () => {
  dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'pinset-own-file-'));
});
after(async () => {
  await fsp.rm(dir, { recursive: true, force: true });
});

describe('openOwnFileSync', () => {
  test('creates the file when missing (with the mode asked for), and opens it again when it is there', () => {
    const f = path.join(dir, 'agent.lock');
    const fd = openOwnFileSync(f, 0o600);
    fs.writeSync(fd, 'holder');
    fs.closeSync(fd);
    assert.equal(fs.statSync(f).mode & 0o777, 0o600);
    const again = openOwnFileSync(f);
    assert.equal(fs.readFileSync(f, 'utf8'), 'holder');
    fs.closeSync(again);
  });

  test('a hard link planted at the name is refused: the file it shares is not opened for writing', async () => {
    const victim = path.join(dir, 'shadow');
    await fsp.writeFile(victim, 'keep me');
    const f = path.join(dir, 'hard.lock');
    await fsp.link(victim, f);
    assert.throws(() => openOwnFileSync(f), (e: unknown) => e instanceof OwnFileError && e.code === 'EPERM' && e.message === `${f} has 2 hard links: another name shares it, which writing it would overwrite; remove ${f}`);
    assert.equal(await fsp.readFile(victim, 'utf8'), 'keep me');
  });

  test('a symbolic link, a FIFO and a folder are refused at once', async () => {
    const victim = path.join(dir, 'target');
    await fsp.writeFile(victim, 'keep me');
    const link = path.join(dir, 'sym.lock');
    await fsp.symlink(victim, link);
    assert.throws(() => openOwnFileSync(link), (e: unknown) => e instanceof OwnFileError && e.code === 'ELOOP' && /is a symbolic link/.test(e.message));
    assert.equal(await fsp.readFile(victim, 'utf8'), 'keep me');
    const fifo = path.join(dir, 'fifo.lock');
    execFileSync('mkfifo', [fifo]);
    assert.throws(() => openOwnFileSync(fifo), (e: unknown) => e instanceof OwnFileError && /is not a regular file/.test(e.message));
    const folder = path.join(dir, 'folder.lock');
    await fsp.mkdir(folder);
    assert.throws(() => openOwnFileSync(folder), (e: unknown) => (e as NodeJS.ErrnoException).code === 'EISDIR');
  });

  test('read-only: opens a file that is there and never makes one; the same names refused, a FIFO at once', async () => {
    const f = path.join(dir, 'ro.lock');
    assert.throws(() => openOwnFileReadOnlySync(f), (e: unknown) => (e as NodeJS.ErrnoException).code === 'ENOENT');
    assert.equal(fs.existsSync(f), false, 'not made');
    await fsp.writeFile(f, 'holder');
    const fd = openOwnFileReadOnlySync(f);
    assert.throws(() => fs.writeSync(fd, 'x'), (e: unknown) => (e as NodeJS.ErrnoException).code === 'EBADF', 'opened for reading only');
    fs.closeSync(fd);
    const victim = path.join(dir, 'ro-shadow');
    await fsp.writeFile(victim, 'keep me');
    const hard = path.join(dir, 'ro-hard.lock');
    await fsp.link(victim, hard);
    assert.throws(() => openOwnFileReadOnlySync(hard), (e: unknown) => e instanceof OwnFileError && e.code === 'EPERM' && /has 2 hard links/.test(e.message));
    const sym = path.join(dir, 'ro-sym.lock');
    await fsp.symlink(victim, sym);
    assert.throws(() => openOwnFileReadOnlySync(sym), (e: unknown) => e instanceof OwnFileError && e.code === 'ELOOP');
    // A FIFO opened for reading without O_NONBLOCK waits for a writer: this would hang the test.
    const fifo = path.join(dir, 'ro-fifo.lock');
    execFileSync('mkfifo', [fifo]);
    assert.throws(() => openOwnFileReadOnlySync(fifo), (e: unknown) => e instanceof OwnFileError && /is not a regular file/.test(e.message));
    const folder = path.join(dir, 'ro-folder.lock');
    await fsp.mkdir(folder);
    assert.throws(() => openOwnFileReadOnlySync(folder), (e: unknown) => e instanceof OwnFileError && /is not a regular file/.test(e.message));
    assert.equal(await fsp.readFile(victim, 'utf8'), 'keep me');
  });
});
