// src/util/regular-file.ts: a node-local file is read only when it is a
// regular file within its limit; a FIFO, a device or a folder is refused at
// once (never waited on), and a missing file is ENOENT as before.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import * as fsp from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { readRegularFile, readRegularFileBytes, readRegularFileSync, ReadRefusedError } from '../../src/util/regular-file.ts';

let dir: string;
before(async () => {
  dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'pinset-regular-file-'));
});
after(async () => {
  await fsp.rm(dir, { recursive: true, force: true });
});

const readers = [
  ['async', readRegularFile],
  ['sync', async (f: string, o: Parameters<typeof readRegularFileSync>[1]) => readRegularFileSync(f, o)],
] as const;

for (const [kind, read] of readers) {
  describe(`readRegularFile (${kind})`, () => {
    test('a regular file: its text, up to and including the limit', async () => {
      const f = path.join(dir, `${kind}-ok.conf`);
      await fsp.writeFile(f, 'héllo');
      const bytes = Buffer.byteLength('héllo');
      assert.equal(await read(f, { maxBytes: bytes }), 'héllo');
      await fsp.writeFile(f, '');
      assert.equal(await read(f, { maxBytes: 10 }), '', 'an empty file is empty text');
    });

    test('a larger file is read whole', async () => {
      const f = path.join(dir, `${kind}-big.conf`);
      const text = 'x'.repeat(70_000);
      await fsp.writeFile(f, text);
      assert.equal(await read(f, { maxBytes: 100_000 }), text);
    });

    test('a file one byte over the limit: EFBIG, saying its size and the limit', async () => {
      const f = path.join(dir, `${kind}-over.conf`);
      await fsp.writeFile(f, 'x'.repeat(11));
      await assert.rejects(read(f, { maxBytes: 10, what: 'the auth file' }), (e: unknown) => {
        assert.ok(e instanceof ReadRefusedError);
        assert.equal(e.code, 'EFBIG');
        assert.equal(e.size, 11);
        assert.equal(e.message, `the auth file ${f} is 11 bytes, more than the 10-byte limit for it: not read`);
        return true;
      });
      await assert.rejects(read(f, { maxBytes: 10, what: 'a drop-in', shownAs: '/etc/kubernetes/kubelet.conf.d/50-big.conf' }), (e: unknown) => {
        assert.ok(e instanceof ReadRefusedError);
        assert.equal(e.path, f, 'the error keeps the path that was read');
        assert.equal(e.message, 'a drop-in /etc/kubernetes/kubelet.conf.d/50-big.conf is 11 bytes, more than the 10-byte limit for it: not read', 'the message names the path given to show');
        return true;
      });
    });

    test('a FIFO is refused at once, not waited on (no writer ever comes)', async () => {
      const f = path.join(dir, `${kind}-fifo.conf`);
      execFileSync('mkfifo', [f]);
      const started = Date.now();
      await assert.rejects(read(f, { maxBytes: 1024 }), (e: unknown) => {
        assert.ok(e instanceof ReadRefusedError);
        assert.equal(e.code, 'EFTYPE');
        assert.equal(e.message, `${f} is a FIFO (named pipe), not a regular file (EFTYPE): not read`);
        return true;
      });
      assert.ok(Date.now() - started < 2_000, 'refused without blocking');
    });

    test('a character device and a folder are refused', async () => {
      await assert.rejects(read('/dev/zero', { maxBytes: 1024 }), (e: unknown) => e instanceof ReadRefusedError && e.code === 'EFTYPE' && /is a character device/.test(e.message));
      await assert.rejects(read(dir, { maxBytes: 1024 }), (e: unknown) => e instanceof ReadRefusedError && e.code === 'EISDIR' && /is a folder, not a regular file \(EISDIR\)/.test(e.message));
    });

    test('a link is followed, unless noFollow asks for the name itself; a missing file is ENOENT', async () => {
      const target = path.join(dir, `${kind}-target.conf`);
      const link = path.join(dir, `${kind}-link.conf`);
      await fsp.writeFile(target, 'through the link');
      await fsp.symlink(target, link);
      assert.equal(await read(link, { maxBytes: 100 }), 'through the link');
      await assert.rejects(read(link, { maxBytes: 100, noFollow: true }), (e: unknown) => e instanceof ReadRefusedError && e.code === 'EFTYPE' && /is a symbolic link/.test(e.message));
      await assert.rejects(read(path.join(dir, 'missing'), { maxBytes: 100 }), (e: unknown) => (e as NodeJS.ErrnoException).code === 'ENOENT');
    });
  });
}

describe('readRegularFileBytes', () => {
  test('the bytes as they are, for a reader that decodes them strictly; the same refusals', async () => {
    const f = path.join(dir, 'bytes.yaml');
    const bytes = Buffer.from([0x61, 0x3a, 0x20, 0xff, 0xfe, 0x0a]);
    await fsp.writeFile(f, bytes);
    assert.deepEqual(await readRegularFileBytes(f, { maxBytes: 6 }), bytes);
    assert.equal(await readRegularFile(f, { maxBytes: 6 }), 'a: \ufffd\ufffd\n', 'the text reader replaces what is not UTF-8');
    await assert.rejects(readRegularFileBytes(f, { maxBytes: 5 }), (e: unknown) => e instanceof ReadRefusedError && e.code === 'EFBIG' && e.size === 6);
    const fifo = path.join(dir, 'bytes-fifo.yaml');
    execFileSync('mkfifo', [fifo]);
    await assert.rejects(readRegularFileBytes(fifo, { maxBytes: 5 }), (e: unknown) => e instanceof ReadRefusedError && e.code === 'EFTYPE');
  });
});
