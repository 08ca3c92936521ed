// Reading one file out of a layer: plain, gzip and zstd tars, pax and GNU
// long names, whiteouts, and a digest that must match.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { Readable } from 'node:stream';
import { test } from 'node:test';
import { gzipSync, zstdCompressSync } from 'node:zlib';
import { findInLayer } from '../../src/registry/tar.ts';
import { tar } from '../support/images.ts';

const WANTED = 'release-manifests/image-references';
const sha = (b: Buffer) => `sha256:${createHash('sha256').update(b).digest('hex')}`;
/** A stream that hands out the bytes in small chunks, as a network does. */
const chunked = (b: Buffer, size = 300) => Readable.from((function* () { for (let i = 0; i < b.length; i += size) yield b.subarray(i, i + size); })());

/** Change the type flag of the entry whose header starts at `offset`, fixing its checksum. */
function retype(archive: Buffer, offset: number, flag: string): Buffer {
  const out = Buffer.from(archive);
  out.write(flag, offset + 156, 1, 'ascii');
  out.fill(0x20, offset + 148, offset + 156);
  let sum = 0;
  for (let i = offset; i < offset + 512; i++) sum += out[i]!;
  out.write(sum.toString(8).padStart(6, '0') + '\0 ', offset + 148, 8, 'ascii');
  return out;
}

test('found in plain, gzip and zstd layers, read in small chunks; the digest is checked over every byte', async () => {
  const raw = tar([{ name: 'etc/x', data: Buffer.alloc(1000, 1) }, { name: `./${WANTED}`, data: Buffer.from('{"kind":"ImageStream"}') }]);
  for (const layer of [raw, gzipSync(raw), zstdCompressSync(raw)]) {
    const r = await findInLayer(chunked(layer), WANTED, sha(layer));
    assert.deepEqual(r, { found: Buffer.from('{"kind":"ImageStream"}') });
  }
  await assert.rejects(findInLayer(chunked(gzipSync(raw)), WANTED, sha(Buffer.from('other'))), /hashes to sha256:[a-f0-9]{64}, not its digest/);
});

test('a pax path record or a GNU long name names the next entry', async () => {
  // A pax record is "<length> key=value\n", the length counting itself.
  const body = ` path=${WANTED}\n`;
  const record = `${body.length + String(body.length + 2).length}${body}`;
  assert.equal(Buffer.byteLength(record), Number(record.split(' ')[0]));
  const pax = retype(tar([{ name: 'PaxHeaders/x', data: Buffer.from(record) }, { name: 'short-name', data: Buffer.from('via pax') }]), 0, 'x');
  assert.deepEqual(await findInLayer(chunked(pax), WANTED, sha(pax)), { found: Buffer.from('via pax') });
  const gnu = retype(tar([{ name: '././@LongLink', data: Buffer.from(`${WANTED}\0`) }, { name: 'cut', data: Buffer.from('via gnu') }]), 0, 'L');
  assert.deepEqual(await findInLayer(chunked(gnu), WANTED, sha(gnu)), { found: Buffer.from('via gnu') });
});

test('whiteouts: the file or its folder deleted in this layer; absent when not there at all', async () => {
  const wh = tar([{ name: 'release-manifests/.wh.image-references', data: Buffer.alloc(0) }]);
  assert.deepEqual(await findInLayer(chunked(wh), WANTED, sha(wh)), { whiteout: true });
  const opaque = tar([{ name: 'release-manifests/.wh..wh..opq', data: Buffer.alloc(0) }]);
  assert.deepEqual(await findInLayer(chunked(opaque), WANTED, sha(opaque)), { whiteout: true });
  const none = tar([{ name: 'etc/hosts', data: Buffer.from('x') }]);
  assert.deepEqual(await findInLayer(chunked(none), WANTED, sha(none)), { absent: true });
});
