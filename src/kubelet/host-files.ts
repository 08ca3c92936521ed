// Reading the node's files under --host-root without trusting them: a
// bounded read of regular files only. A FIFO is opened with O_NONBLOCK (so
// the open never waits for a writer) and refused as not a regular file, as
// are devices, sockets and folders; a file over the bound is refused, and
// one that grows past it while read too. Every refusal says what the file
// is, so a person can act. src/agent/static.ts reads set files the same
// way.
import { constants as fsc } from 'node:fs';
import * as fsp from 'node:fs/promises';
import { join } from 'node:path';

/** A file's text; `missing` when nothing is at the path; `error` when something is there that cannot be read. */
export type HostFile = { text: string } | { missing: true } | { error: string };

/** What is at a path, without following it further than open(2) would. */
export type PathKind = 'file' | 'folder' | 'other' | 'missing';

const codeOf = (e: unknown) => (e as NodeJS.ErrnoException).code;

function described(e: unknown): string {
  const code = codeOf(e);
  if (code === 'EACCES' || code === 'EPERM') return `permission denied (${code})`;
  if (code === 'ELOOP') return 'a loop of symbolic links (ELOOP)';
  return code ?? (e instanceof Error ? e.message : String(e)).split('\n')[0]!.slice(0, 200);
}

/** The UTF-8 text of the regular file `path`, at most `maxBytes` of it; `file` names it in errors (the host's path). */
export async function readRegularFile(path: string, maxBytes: number, file = path): Promise<HostFile> {
  let fh: fsp.FileHandle;
  try {
    fh = await fsp.open(path, fsc.O_RDONLY | fsc.O_NONBLOCK | fsc.O_NOCTTY);
  } catch (e) {
    if (codeOf(e) === 'ENOENT' || codeOf(e) === 'ENOTDIR') {
      const link = await fsp.lstat(path).catch(() => null);
      if (link?.isSymbolicLink()) return { error: `${file} is a symbolic link to ${await fsp.readlink(path).catch(() => '?')}, which does not exist here` };
      return { missing: true };
    }
    return { error: `cannot read ${file}: ${described(e)}` };
  }
  try {
    const st = await fh.stat();
    if (st.isDirectory()) return { error: `${file} is a folder, not a file` };
    if (!st.isFile()) return { error: `${file} is not a regular file (${st.isFIFO() ? 'a FIFO' : st.isSocket() ? 'a socket' : 'a device'}): not read` };
    if (st.size > maxBytes) return { error: `${file} is ${st.size} bytes, more than the ${maxBytes} bytes read of such a file: not read` };
    const buf = Buffer.alloc(maxBytes + 1);
    let len = 0;
    for (;;) {
      const { bytesRead } = await fh.read(buf, len, buf.length - len, len);
      if (bytesRead === 0) break;
      len += bytesRead;
      if (len > maxBytes) return { error: `${file} grew past ${maxBytes} bytes while read: not read` };
    }
    try {
      return { text: new TextDecoder('utf-8', { fatal: true }).decode(buf.subarray(0, len)) };
    } catch {
      return { error: `${file} is not UTF-8 text` };
    }
  } catch (e) {
    return { error: `cannot read ${file}: ${described(e)}` };
  } finally {
    await fh.close().catch(() => {});
  }
}

/** What is at `p` (a symbolic link counts as what it points to). */
export async function pathKind(p: string): Promise<PathKind> {
  try {
    const st = await fsp.stat(p);
    return st.isFile() ? 'file' : st.isDirectory() ? 'folder' : 'other';
  } catch {
    return 'missing';
  }
}

/** The names in a folder, sorted by bytes as Go's os.ReadDir sorts them; [] when it does not exist; at most `max`. */
export async function folderNames(path: string, max: number, dir = path): Promise<{ names: string[] } | { error: string }> {
  let names: string[];
  try {
    names = await fsp.readdir(path);
  } catch (e) {
    if (codeOf(e) === 'ENOENT' || codeOf(e) === 'ENOTDIR') return { names: [] };
    return { error: `cannot list ${dir}: ${described(e)}` };
  }
  if (names.length > max) return { error: `${dir} holds ${names.length} entries, more than the ${max} read: not read` };
  return { names: names.sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b))) };
}

/** The host's files as this process sees them under --host-root: every path given is a host path. */
export interface HostView {
  /** The host root (/ on the host itself). */
  readonly root: string;
  /** Where host path `p` is seen here. */
  seen(p: string): string;
  read(p: string, maxBytes: number): Promise<HostFile>;
  kind(p: string): Promise<PathKind>;
  names(p: string, max: number): Promise<{ names: string[] } | { error: string }>;
}

export function hostView(root: string): HostView {
  const seen = (p: string) => (root === '/' || root === '' ? p : join(root, p));
  return {
    root: root || '/',
    seen,
    read: (p, maxBytes) => readRegularFile(seen(p), maxBytes, p),
    kind: (p) => pathKind(seen(p)),
    names: (p, max) => folderNames(seen(p), max, p),
  };
}
