// Reading one file out of an image layer: a tar stream (POSIX ustar, with
// GNU long names and pax path records), compressed with gzip or zstd or
// not at all (told apart by magic bytes, since a media type can lie).
// Layer whiteouts (.wh.<name>, .wh..wh..opq) follow the OCI layer spec
// (https://github.com/opencontainers/image-spec/blob/main/layer.md#whiteouts).
import { createHash, type Hash } from 'node:crypto';
import { pipeline, Readable } from 'node:stream';
import zlib from 'node:zlib';

export type LayerLookup = { found: Buffer } | { whiteout: true } | { absent: true };

/** Normalise a tar entry name: no leading "./" or "/". */
function clean(name: string): string {
  return name.replace(/^(\.\/)+/, '').replace(/^\/+/, '');
}

function field(block: Buffer, start: number, len: number): string {
  const raw = block.subarray(start, start + len);
  const nul = raw.indexOf(0);
  return raw.subarray(0, nul < 0 ? len : nul).toString('utf8');
}

function octal(block: Buffer, start: number, len: number): number {
  // Base-256 (GNU) for sizes over 8 GiB: high bit set in the first byte.
  if (block[start]! & 0x80) {
    let v = 0;
    for (let i = start + 1; i < start + len; i++) v = v * 256 + block[i]!;
    return v;
  }
  const s = field(block, start, len).trim();
  return s ? parseInt(s, 8) : 0;
}

/**
 * The layer's bytes, hashed as they pass, decompressed by magic: gzip
 * 1f 8b, zstd 28 b5 2f fd, else as is. Backpressure holds: nothing is read
 * faster than the tar reader takes it.
 */
async function decompressed(layer: Readable, hash: Hash): Promise<Readable> {
  const it = layer[Symbol.asyncIterator]();
  const first = await it.next();
  const source = Readable.from(
    (async function* () {
      if (first.done) return;
      hash.update(first.value as Buffer);
      yield first.value as Buffer;
      for (;;) {
        const n = await it.next();
        if (n.done) return;
        hash.update(n.value as Buffer);
        yield n.value as Buffer;
      }
    })(),
  );
  const head = first.done ? Buffer.alloc(0) : (first.value as Buffer);
  let d: zlib.Gunzip | zlib.ZstdDecompress | null = null;
  if (head[0] === 0x1f && head[1] === 0x8b) d = zlib.createGunzip();
  else if (head[0] === 0x28 && head[1] === 0xb5 && head[2] === 0x2f && head[3] === 0xfd) d = zlib.createZstdDecompress();
  if (!d) return source;
  pipeline(source, d, () => {});
  return d;
}

/**
 * Find `wanted` (a path inside the layer, e.g. release-manifests/image-references)
 * in a layer stream. Reads the whole layer so its digest can be checked
 * against `digest` (the layer's descriptor): content that does not match
 * is refused. Files larger than `maxBytes` are refused.
 */
export async function findInLayer(layer: Readable, wanted: string, digest: string, maxBytes = 64 * 1024 * 1024): Promise<LayerLookup> {
  const hash = createHash('sha256');
  const tarStream = await decompressed(layer, hash);
  const dir = wanted.includes('/') ? wanted.slice(0, wanted.lastIndexOf('/') + 1) : '';
  const base = wanted.slice(dir.length);
  let result: LayerLookup = { absent: true };

  // The loop reads the stream to its end (past the end-of-archive blocks): the digest covers every byte.
  let buf: Buffer = Buffer.alloc(0);
  let pending: { name: string; remaining: number; pad: number; keep: Buffer[] | null; kind: 'file' | 'longname' | 'pax' | 'skip' } | null = null;
  let longName: string | undefined;
  let paxPath: string | undefined;
  let ended = false;

  for await (const chunk of tarStream) {
    buf = buf.length ? Buffer.concat([buf, chunk as Buffer]) : (chunk as Buffer);
    for (;;) {
      if (ended) {
        buf = Buffer.alloc(0);
        break;
      }
      if (pending) {
        const take = Math.min(pending.remaining, buf.length);
        if (pending.keep) pending.keep.push(buf.subarray(0, take));
        pending.remaining -= take;
        buf = buf.subarray(take);
        if (pending.remaining > 0) break;
        if (buf.length < pending.pad) {
          // Padding to 512 bytes may arrive with the next chunk.
          pending.pad -= buf.length;
          buf = Buffer.alloc(0);
          if (pending.pad > 0) break;
        } else {
          buf = buf.subarray(pending.pad);
          pending.pad = 0;
        }
        const data = pending.keep ? Buffer.concat(pending.keep) : null;
        if (pending.kind === 'longname' && data) longName = field(data, 0, data.length);
        else if (pending.kind === 'pax' && data) {
          for (const rec of data.toString('utf8').split('\n')) {
            const m = /^\d+ path=(.*)$/.exec(rec);
            if (m) paxPath = m[1];
          }
        } else if (pending.kind === 'file' && data) result = { found: data };
        pending = null;
        continue;
      }
      if (buf.length < 512) break;
      const block = buf.subarray(0, 512);
      buf = buf.subarray(512);
      if (block.every((b) => b === 0)) {
        ended = true;
        continue;
      }
      const prefix = field(block, 345, 155);
      const headerName = prefix ? `${prefix}/${field(block, 0, 100)}` : field(block, 0, 100);
      const type = String.fromCharCode(block[156] || 0x30);
      const size = octal(block, 124, 12);
      const pad = (512 - (size % 512)) % 512;
      if (type === 'L') {
        pending = { name: '', remaining: size, pad, keep: [], kind: 'longname' };
        continue;
      }
      if (type === 'x') {
        pending = { name: '', remaining: size, pad, keep: [], kind: 'pax' };
        continue;
      }
      const name = clean(paxPath ?? longName ?? headerName);
      longName = undefined;
      paxPath = undefined;
      let kind: 'file' | 'skip' = 'skip';
      if ((type === '0' || type === '\0' || type === '7') && name === wanted) {
        if (size > maxBytes) throw new Error(`${wanted} in the layer is ${size} bytes, more than the ${maxBytes} allowed`);
        kind = 'file';
      } else if (name === `${dir}.wh.${base}` || name === `${dir}.wh..wh..opq` || name === `${dir.replace(/\/$/, '')}` && (type === '0' || type === '2')) {
        // The file (or its whole folder) was deleted in this layer, or its folder replaced by a non-folder.
        if (!('found' in result)) result = { whiteout: true };
      }
      pending = { name, remaining: size, pad, keep: kind === 'file' ? [] : null, kind };
      if (size === 0 && pad === 0) {
        if (kind === 'file') result = { found: Buffer.alloc(0) };
        pending = null;
      }
    }
  }
  const actual = `sha256:${hash.digest('hex')}`;
  if (actual !== digest) throw new Error(`the layer's content hashes to ${actual}, not its digest ${digest}`);
  return result;
}
