// Reading a node-local file that someone else writes (the kubelet's
// configuration and auth file, CRI-O's drop-ins, containerd's hosts.toml,
// registries.conf, a credential provider config) without letting it hang or
// swamp the process:
// - only a regular file is read. A FIFO would block a plain open(2) or
//   read(2) until a writer comes (for ever, in a synchronous read that holds
//   the event loop), a device would read without end. So the path is
//   stat(2)ed first (nothing is opened that is not a regular file), then
//   opened with O_NONBLOCK (open(2) of a FIFO swapped in meanwhile returns at
//   once instead of waiting for a writer) and O_NOCTTY, and fstat(2)ed again:
//   the type and size checked are those of what was opened;
// - at most `maxBytes` are read, and one byte more tells a file that grew
//   past the limit while it was read;
// - O_NOFOLLOW on request, for a file whose name must not be a link.
// A refusal is a ReadRefusedError whose message says what the path is and
// what the limit was; a missing file is the usual ENOENT, so callers that
// treat "missing" as "none" go on doing so. Every other error is open(2)'s or
// read(2)'s own (EACCES, ELOOP, ...), with its code.
import { constants as fsc } from 'node:fs';
import * as fs from 'node:fs';
import * as fsp from 'node:fs/promises';

export interface RegularFileOptions {
  /** Files larger than this are refused; what a person would write is far smaller. */
  maxBytes: number;
  /** Refuse a symbolic link at the last component of the path (O_NOFOLLOW). Default false: links are followed, as the file's other readers follow them. */
  noFollow?: boolean;
  /** How the file is named in a refusal ("the auth file", "a drop-in"): the path alone when not given. */
  what?: string;
  /** The path a refusal names in place of `file`: the host's path of a file read under --host-root, which is where a person acts on it. */
  shownAs?: string;
}

/** The file was not read: not a regular file, or larger than the limit. */
export class ReadRefusedError extends Error {
  /** EISDIR for a folder, EFTYPE for any other type that is not a regular file, EFBIG for a file over the limit. */
  readonly code: 'EISDIR' | 'EFTYPE' | 'EFBIG';
  readonly path: string;
  /** EFBIG: the file's size as fstat(2) saw it; undefined when it grew past the limit while it was read. */
  readonly size: number | undefined;
  constructor(code: ReadRefusedError['code'], file: string, message: string, size?: number) {
    super(message);
    this.name = 'ReadRefusedError';
    this.code = code;
    this.path = file;
    this.size = size;
  }
}

/** What a stat(2) result is, in words: "a folder", "a FIFO (named pipe)", ... */
function typeOf(st: fs.Stats): string {
  if (st.isDirectory()) return 'a folder';
  if (st.isFIFO()) return 'a FIFO (named pipe)';
  if (st.isSocket()) return 'a socket';
  if (st.isCharacterDevice()) return 'a character device';
  if (st.isBlockDevice()) return 'a block device';
  if (st.isSymbolicLink()) return 'a symbolic link';
  return 'not a regular file';
}

/** How a refusal names the file: what it is, then its path as a person finds it. */
function nameOf(file: string, o: RegularFileOptions): string {
  const shown = o.shownAs ?? file;
  return o.what ? `${o.what} ${shown}` : shown;
}

/** The refusal for what a stat(2) found, or undefined when it is a regular file within the limit. */
function refusal(file: string, st: fs.Stats, o: RegularFileOptions): ReadRefusedError | undefined {
  const name = nameOf(file, o);
  if (!st.isFile()) {
    const code = st.isDirectory() ? 'EISDIR' : 'EFTYPE';
    return new ReadRefusedError(code, file, `${name} is ${typeOf(st)}, not a regular file (${code}): not read`);
  }
  if (st.size > o.maxBytes) return tooLarge(file, o, st.size);
  return undefined;
}

/** The refusal of a file over the limit: `size` bytes as fstat(2) saw it, or undefined when it grew past the limit while it was read. */
function tooLarge(file: string, o: RegularFileOptions, size?: number): ReadRefusedError {
  const name = nameOf(file, o);
  const is = size === undefined ? 'growing while it is read' : `${size} bytes`;
  return new ReadRefusedError('EFBIG', file, `${name} is ${is}, more than the ${o.maxBytes}-byte limit for it: not read`, size);
}

/**
 * The bytes read so far: sized for the file as fstat(2) saw it, plus one
 * byte to see it grow; grown (up to one byte past the limit) when it does.
 */
class BoundedBuffer {
  buf: Buffer;
  len = 0;
  readonly #file: string;
  readonly #o: RegularFileOptions;
  constructor(file: string, o: RegularFileOptions, size: number) {
    this.#file = file;
    this.#o = o;
    this.buf = Buffer.alloc(Math.min(size, o.maxBytes) + 1);
  }
  grew(n: number): void {
    this.len += n;
    if (this.len > this.#o.maxBytes) throw tooLarge(this.#file, this.#o);
    if (this.len === this.buf.length) {
      const bigger = Buffer.alloc(Math.min(this.buf.length * 2, this.#o.maxBytes + 1));
      this.buf.copy(bigger, 0, 0, this.len);
      this.buf = bigger;
    }
  }
  done(): Buffer {
    return this.buf.subarray(0, this.len);
  }
}

function openFlags(o: RegularFileOptions): number {
  return fsc.O_RDONLY | fsc.O_NONBLOCK | fsc.O_NOCTTY | (o.noFollow ? fsc.O_NOFOLLOW : 0);
}

/** The file's text (UTF-8, a malformed sequence read as U+FFFD), if it is a regular file of at most `maxBytes`. */
export async function readRegularFile(file: string, o: RegularFileOptions): Promise<string> {
  return (await readRegularFileBytes(file, o)).toString('utf8');
}

/** The file's bytes, if it is a regular file of at most `maxBytes`: for a reader that decodes them itself (strictly, say). */
export async function readRegularFileBytes(file: string, o: RegularFileOptions): Promise<Buffer> {
  const before = await (o.noFollow ? fsp.lstat(file) : fsp.stat(file));
  const early = refusal(file, before, o);
  if (early) throw early;
  const fh = await fsp.open(file, openFlags(o));
  try {
    const st = await fh.stat();
    const late = refusal(file, st, o);
    if (late) throw late;
    const bytes = new BoundedBuffer(file, o, st.size);
    for (;;) {
      const { bytesRead } = await fh.read(bytes.buf, bytes.len, bytes.buf.length - bytes.len, bytes.len);
      if (bytesRead === 0) return bytes.done();
      bytes.grew(bytesRead);
    }
  } finally {
    await fh.close().catch(() => {});
  }
}

/** readRegularFile, synchronously: for readers that are synchronous, which a FIFO would otherwise stop entirely. */
export function readRegularFileSync(file: string, o: RegularFileOptions): string {
  const early = refusal(file, o.noFollow ? fs.lstatSync(file) : fs.statSync(file), o);
  if (early) throw early;
  const fd = fs.openSync(file, openFlags(o));
  try {
    const st = fs.fstatSync(fd);
    const late = refusal(file, st, o);
    if (late) throw late;
    const bytes = new BoundedBuffer(file, o, st.size);
    for (;;) {
      const n = fs.readSync(fd, bytes.buf, bytes.len, bytes.buf.length - bytes.len, bytes.len);
      if (n === 0) return bytes.done().toString('utf8');
      bytes.grew(n);
    }
  } finally {
    fs.closeSync(fd);
  }
}
