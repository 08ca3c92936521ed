// The node's files under --host-root, named by their paths on the host: a
// read goes through the shared bounded reader (../util/regular-file.ts:
// regular files only, within a limit, a FIFO refused at once rather than
// waited on), and what it refuses is said with the host's path, so a
// person can act on the node.
import * as fsp from 'node:fs/promises';
import { join } from 'node:path';
import { readRegularFile, ReadRefusedError } from '../util/regular-file.ts';

/** A file's text; `missing` when nothing is at the path; `error` when something is there that cannot be read. */
export type HostFile = { text: string } | { missing: true } | { error: string };

/** What is at a path, a symbolic link counting as what it points to. */
export type PathKind = 'file' | 'folder' | 'other' | 'missing';

const codeOf = (e: unknown) => (e as NodeJS.ErrnoException).code;

function described(e: unknown): string {
  const code = codeOf(e);
  if (code === 'EACCES' || code === 'EPERM') return `permission denied (${code})`;
  if (code === 'ELOOP') return 'a loop of symbolic links (ELOOP)';
  return code ?? (e instanceof Error ? e.message : String(e)).split('\n')[0]!.slice(0, 200);
}

/** The text of the regular file `seen`, at most `maxBytes` of it; `file` names it in what is said (the host's path). */
async function readHostFile(seen: string, maxBytes: number, file: string): Promise<HostFile> {
  try {
    return { text: await readRegularFile(seen, { maxBytes, shownAs: file }) };
  } catch (e) {
    if (e instanceof ReadRefusedError) return { error: e.message };
    if (codeOf(e) === 'ENOENT' || codeOf(e) === 'ENOTDIR') {
      const link = await fsp.lstat(seen).catch(() => null);
      if (link?.isSymbolicLink()) return { error: `${file} is a symbolic link to ${await fsp.readlink(seen).catch(() => '?')}, which does not exist here` };
      return { missing: true };
    }
    return { error: `cannot read ${file}: ${described(e)}` };
  }
}

/** What is at `p` (a symbolic link counts as what it points to). */
async function pathKind(p: string): Promise<PathKind> {
  try {
    const st = await fsp.stat(p);
    return st.isFile() ? 'file' : st.isDirectory() ? 'folder' : 'other';
  } catch {
    return 'missing';
  }
}

/** The names in a folder, sorted by bytes as Go's os.ReadDir sorts them; [] when it does not exist; at most `max`. */
async function folderNames(path: string, max: number, dir: string): Promise<{ names: string[] } | { error: string }> {
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
  /** The host's path of `p` as seen here; `p` itself when it is not under the host root. */
  onHost(p: string): string;
  read(p: string, maxBytes: number): Promise<HostFile>;
  kind(p: string): Promise<PathKind>;
  names(p: string, max: number): Promise<{ names: string[] } | { error: string }>;
}

export function hostView(hostRoot: string): HostView {
  const root = hostRoot === '' || hostRoot === '/' ? '/' : hostRoot.replace(/\/+$/, '');
  const seen = (p: string) => (root === '/' ? p : join(root, p));
  return {
    root,
    seen,
    onHost: (p) => (root !== '/' && p.startsWith(`${root}/`) ? p.slice(root.length) : p),
    read: (p, maxBytes) => readHostFile(seen(p), maxBytes, p),
    kind: (p) => pathKind(seen(p)),
    names: (p, max) => folderNames(seen(p), max, p),
  };
}
