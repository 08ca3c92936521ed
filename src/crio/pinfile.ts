// PinFile: the agent's one drop-in in CRI-O's configuration folder.
//
// CRI-O reads crio.conf, then every file in crio.conf.d and its subfolders
// in byte order, and a `pinned_images` list in a later file REPLACES the one from an
// earlier file (cri-o pkg/config; facts/crio-pinning.md). So pinset writes
// the union of every set's images into a single file that sorts after the
// usual drop-ins, carries over the pins it finds in the files (and
// crio.conf) read before it, and reports any file sorted after it that sets
// pinned_images, since that file would silently replace every pin.
//
// The file name embeds a UUID, so no hand-written file can collide, and is
// reused across restarts (found by prefix + the owner marker in its header).
//
// Nothing half-written is ever visible to CRI-O. CRI-O reads every file in
// crio.conf.d, dotfiles and subfolders included, and refuses to start on one
// it cannot decode (facts/crio-pinning.md, "Observed on a real CRI-O"), so
// the temp file is written and fsynced in a staging folder beside
// crio.conf.d (`<parent>/.pinset/`, same filesystem and, in the DaemonSet and
// the systemd unit, the same mount: rename(2) across mount points fails with
// EXDEV even on one filesystem), then renamed into crio.conf.d, and the folder
// fsynced. A layout where the two are on different mounts (crio.conf.d
// mounted alone) is refused before anything is written, with a message that
// says what to mount (./mounts.ts). The agent deletes only its own pin file and the one temp file
// whose exact name it generates.
//
// scan() reads the folder exactly as CRI-O does (./crio-config.ts), every
// file included: CRI-O reads dotfiles and files without .conf too.
import { randomUUID } from 'node:crypto';
import { constants as fsc } from 'node:fs';
import * as fsp from 'node:fs/promises';
import * as path from 'node:path';
import { stringify as stringifyToml } from 'smol-toml';
import { readCrioConfig, type ConfigRejection } from './crio-config.ts';
import { CrossMountError, crossMountMessage, crossMountProblem } from './mounts.ts';

export const PIN_FILE_PREFIX = '99-pinset-';
export const PIN_FILE_SUFFIX = '.conf';
/** Present in the header of every file the agent owns; with the prefix, it proves ownership. */
export const OWNER_MARKER = '# pinset.dev/owner: pinset-agent';
const HEADER = [
  '# Written by the pinset agent (pinset.dev): the union of the images pinned by',
  '# the PinnedImageSets that select this node, plus the pinned_images of the',
  '# CRI-O configuration files read before this one. Do not edit: the agent',
  '# rewrites this file; change PinnedImageSets or your own drop-ins instead.',
  OWNER_MARKER,
  '',
].join('\n');

const uuidNameRe = /^99-pinset-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.conf$/;

/** The staging folder beside the drop-in folder: the temp file lives there, out of CRI-O's sight (and the node lock of earlier versions: src/agent/boot/node-lock-place.ts). */
export const STAGING_DIR_NAME = '.pinset';

export function stagingDirFor(dropInDir: string): string {
  return path.join(path.dirname(path.resolve(dropInDir)), STAGING_DIR_NAME);
}

export interface DropinPins {
  /** Path relative to the drop-in folder (or the path of crio.conf). */
  file: string;
  pins: string[];
}

export interface DropinScan {
  /** Content of the agent's own file, or null when absent. */
  ownContent: string | null;
  /** Pins in the agent's own file as parsed (empty when absent or unparsable). */
  ownPins: string[];
  /** pinned_images from crio.conf and the drop-ins sorting before the agent's file, in read order. */
  before: DropinPins[];
  /** Drop-ins sorting after the agent's file that set pinned_images: they override every pin. */
  overriding: DropinPins[];
  /** Files CRI-O would refuse (unreadable, a dangling link, TOML it cannot decode): it then refuses every reload, and a start. */
  rejected: ConfigRejection[];
  /** The pause image CRI-O pins whatever pinned_images says. */
  pauseImage: string;
}

/**
 * The pinned_images list CRI-O loads from this folder once the agent's file
 * holds `ownPins` (null: the agent has no file): the last file that sets
 * the key wins, and the agent's file always sets it.
 */
export function effectivePins(scan: Pick<DropinScan, 'before' | 'overriding'>, ownPins: readonly string[] | null): string[] {
  const last = scan.overriding.at(-1)?.pins ?? ownPins ?? scan.before.at(-1)?.pins ?? [];
  return [...last];
}

/** The steps of a write, in order (see PinFile.write). */
export const WRITE_STEPS = ['temp-created', 'temp-written', 'temp-fsynced', 'renamed', 'folder-fsynced'] as const;
export type WriteStep = (typeof WRITE_STEPS)[number];

/** Test seam: called after each step of a write (a test can fail or kill the writer there). */
export interface PinFileHooks {
  afterStep?: (step: WriteStep, tempPath: string) => void | Promise<void>;
}

export function renderPinFile(pins: readonly string[]): string {
  const sorted = [...new Set(pins)].sort();
  return HEADER + stringifyToml({ crio: { image: { pinned_images: sorted } } }) + '\n';
}

/** filepath.Walk order: path components compared one by one, as bytes. */
export function compareWalkOrder(a: string, b: string): number {
  const pa = a.split('/');
  const pb = b.split('/');
  for (let i = 0; i < Math.min(pa.length, pb.length); i++) {
    const c = Buffer.compare(Buffer.from(pa[i]!), Buffer.from(pb[i]!));
    if (c !== 0) return c;
  }
  return pa.length - pb.length;
}

function isOwnedContent(content: string): boolean {
  return content.split('\n', 12).includes(OWNER_MARKER);
}

/** Remove `file` if it is a regular file (never a link, a folder or anything else); true when removed. */
async function removeRegularFile(file: string): Promise<boolean> {
  const st = await fsp.lstat(file).catch(() => null);
  if (!st?.isFile()) return false;
  await fsp.rm(file, { force: true });
  return true;
}

export class PinFile {
  readonly dir: string;
  readonly name: string;
  readonly path: string;
  /** crio.conf, read before every drop-in. */
  readonly mainConfig: string;
  /** Where the temp file is written before it is renamed in: `<parent of dir>/.pinset`. */
  readonly stagingDir: string;
  /** The one temp file the agent writes: `<stagingDir>/<name>.tmp`, an exact name (one writer per node: see src/agent/node-lock.ts). */
  readonly tempPath: string;
  private readonly hooks: PinFileHooks;

  private constructor(dir: string, name: string, mainConfig: string, hooks: PinFileHooks) {
    this.dir = dir;
    this.name = name;
    this.path = path.join(dir, name);
    this.mainConfig = mainConfig;
    this.stagingDir = stagingDirFor(dir);
    this.tempPath = path.join(this.stagingDir, `${name}.tmp`);
    this.hooks = hooks;
  }

  /**
   * Find the agent's file in `dir` (reusing its name across restarts), or
   * choose a new name, and remove what a killed agent left behind: its temp
   * file in the staging folder, and (older versions wrote their temp file
   * inside crio.conf.d, where CRI-O reads it) `.<own file name>.<pid>.tmp`
   * beside its own file. Only those exact names, only regular files:
   * anything else, however alike, is someone else's. Call with the node
   * lock held, so no other agent is mid-write.
   */
  static async open(dir: string, opts: { mainConfig?: string; hooks?: PinFileHooks } = {}): Promise<PinFile> {
    const mainConfig = opts.mainConfig ?? path.join(path.dirname(path.resolve(dir)), 'crio.conf');
    let entries: string[] = [];
    try {
      entries = await fsp.readdir(dir);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
    }
    const owned = await PinFile.ownedFiles(dir, entries);
    for (const own of owned) {
      const legacyTemp = new RegExp(`^\\.${own.replaceAll('.', '\\.')}\\.[0-9]+\\.tmp$`);
      for (const e of entries) if (legacyTemp.test(e)) await removeRegularFile(path.join(dir, e));
    }
    const name = owned[owned.length - 1] ?? `${PIN_FILE_PREFIX}${randomUUID()}${PIN_FILE_SUFFIX}`;
    const pf = new PinFile(dir, name, mainConfig, opts.hooks ?? {});
    await removeRegularFile(pf.tempPath);
    return pf;
  }

  /** Files in `dir` that carry the agent's name pattern, are regular files (not links) and hold the owner marker. */
  private static async ownedFiles(dir: string, entries: string[]): Promise<string[]> {
    const owned: string[] = [];
    for (const e of entries.filter((n) => uuidNameRe.test(n)).sort()) {
      try {
        const full = path.join(dir, e);
        if ((await fsp.lstat(full)).isFile() && isOwnedContent(await fsp.readFile(full, 'utf8'))) owned.push(e);
      } catch {
        // unreadable: not provably ours, leave it alone
      }
    }
    return owned;
  }

  /**
   * Read crio.conf and the folder exactly as CRI-O does (./crio-config.ts:
   * every file, dotfiles and subfolders included, links followed, in
   * filepath.Walk order) and split the files around the agent's own.
   */
  async scan(): Promise<DropinScan> {
    const read = await readCrioConfig(this.mainConfig, this.dir);
    const result: DropinScan = { ownContent: null, ownPins: [], before: [], overriding: [], rejected: read.rejected, pauseImage: read.pauseImage };
    for (const f of read.files) {
      if (f.path === this.path) {
        // Unparsable or not: its raw text, so the agent rewrites it when it differs.
        result.ownContent = f.content ?? null;
        result.ownPins = f.decoded?.pinnedImages ?? [];
        continue;
      }
      const pins = f.decoded?.pinnedImages;
      if (!pins) continue;
      if (f.path === this.mainConfig || compareWalkOrder(f.file, this.name) < 0) result.before.push({ file: f.file, pins });
      else result.overriding.push({ file: f.file, pins });
    }
    return result;
  }

  /**
   * Atomically replace the file with `content`. On failure the previous
   * file is untouched and the temp file removed. Throws CrossMountError,
   * before writing anything, when the staging folder is on another mount.
   *
   * Order, and what a crash or a power loss at each point leaves:
   * 1. create `<staging>/<name>.tmp` (exclusively: createTemp), 2. write it, 3. fsync it: until here
   *    crio.conf.d holds the previous file only; a temp file left in the
   *    staging folder is removed by the next open().
   * 4. rename it over `crio.conf.d/<name>`: rename(2) replaces the name in one
   *    step, so a reader sees the old file or the new one, never neither nor
   *    a part. The data was fsynced first, so after a power loss the name
   *    can only point at complete content (without that fsync, a filesystem
   *    may commit the rename before the data: a zero-length or partial file
   *    under the final name).
   * 5. fsync crio.conf.d: makes the rename itself durable. Before it, a power
   *    loss may bring back the previous file (complete and valid, just
   *    older; the agent rewrites it) and leave the temp in the staging folder.
   */
  async write(content: string): Promise<void> {
    await fsp.mkdir(this.dir, { recursive: true });
    await fsp.mkdir(this.stagingDir, { recursive: true, mode: 0o700 });
    // mkdir -p accepts a link to a folder: the temp file would be written wherever it points.
    if ((await fsp.lstat(this.stagingDir)).isSymbolicLink()) {
      throw Object.assign(new Error(`the staging folder ${this.stagingDir} is a symbolic link, not a folder: the pin file's temp file is written only in a real folder; remove the link`), { code: 'ELOOP' });
    }
    const layout = await this.mountProblem();
    if (layout) throw new CrossMountError(layout);
    const temp = this.tempPath;
    const step = (s: WriteStep) => this.hooks.afterStep?.(s, temp);
    let fh: fsp.FileHandle | undefined;
    try {
      fh = await this.createTemp();
      await step('temp-created');
      await fh.writeFile(content, 'utf8');
      await step('temp-written');
      await fh.sync();
      await step('temp-fsynced');
      await fh.close();
      fh = undefined;
      await fsp.rename(temp, this.path);
    } catch (e) {
      await fh?.close().catch(() => {});
      await removeRegularFile(temp).catch(() => {});
      // A mount that changed since the check above.
      if ((e as NodeJS.ErrnoException).code === 'EXDEV') throw new CrossMountError(crossMountMessage(this.dir, this.stagingDir));
      throw e;
    }
    await step('renamed');
    const dh = await fsp.open(this.dir, fsc.O_RDONLY | fsc.O_DIRECTORY);
    try {
      await dh.sync();
    } finally {
      await dh.close();
    }
    await step('folder-fsynced');
  }

  /**
   * Create the temp file, never opening one that exists (O_CREAT|O_EXCL,
   * and O_NOFOLLOW): a hard link or a symbolic link planted at its name
   * would otherwise have its target truncated and written. Something at the
   * exact name is a temp file a failed write could not remove, or a planted
   * name: the name is the agent's own (one writer per node), and unlink(2)
   * removes only the name, never what a link points at; then the file is
   * created anew, once. A folder there is refused.
   */
  private async createTemp(): Promise<fsp.FileHandle> {
    const flags = fsc.O_WRONLY | fsc.O_CREAT | fsc.O_EXCL | fsc.O_NOFOLLOW;
    try {
      return await fsp.open(this.tempPath, flags, 0o644);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
    }
    if ((await fsp.lstat(this.tempPath)).isDirectory()) {
      throw Object.assign(new Error(`${this.tempPath}, where the pin file's temp file is written, is a folder: remove it`), { code: 'EISDIR' });
    }
    await fsp.unlink(this.tempPath);
    return await fsp.open(this.tempPath, flags, 0o644);
  }

  /**
   * Why the pin file cannot be renamed into place (the drop-in folder and
   * the staging folder on different mounts: crio.conf.d mounted alone), or
   * null. Nothing is created; a folder that does not exist yet is no problem.
   */
  mountProblem(): Promise<string | null> {
    return crossMountProblem(this.dir, this.stagingDir);
  }

  /**
   * Remove the agent's file (and any older one it owns), when it holds no
   * pin of its own: then CRI-O reads exactly the administrator's files. An
   * empty `pinned_images` in a file that sorts last would instead unpin
   * every earlier file's pins. unlink(2) is one step (CRI-O sees the file
   * whole or not at all); the folder is fsynced so the removal survives a
   * power loss. Returns the names removed.
   */
  async remove(): Promise<string[]> {
    const entries = await fsp.readdir(this.dir).catch(() => [] as string[]);
    const owned = await PinFile.ownedFiles(this.dir, entries);
    const removed: string[] = [];
    for (const n of owned) if (await removeRegularFile(path.join(this.dir, n))) removed.push(n);
    if (removed.length > 0) {
      const dh = await fsp.open(this.dir, fsc.O_RDONLY | fsc.O_DIRECTORY);
      try {
        await dh.sync();
      } finally {
        await dh.close();
      }
    }
    return removed;
  }

  /** Other files this agent owns (an older name): removed once the current file is in place. */
  async removeStaleOwnedFiles(): Promise<string[]> {
    const entries = await fsp.readdir(this.dir).catch(() => [] as string[]);
    const stale = (await PinFile.ownedFiles(this.dir, entries)).filter((n) => n !== this.name);
    for (const n of stale) await removeRegularFile(path.join(this.dir, n));
    return stale;
  }
}
