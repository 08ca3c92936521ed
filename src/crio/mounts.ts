// Whether the pin file can be renamed from the staging folder into the
// drop-in folder. rename(2) works within one mount only: between two mounts
// it fails with EXDEV, even when both show the same filesystem (a bind
// mount). A DaemonSet that mounts only /etc/crio/crio.conf.d, as several
// node tools do, makes that folder a mount point of its own, and the staging
// folder beside it (<parent>/.pinset, ./pinfile.ts) lands on the container's
// own file system: every write would fail, however often it is retried.
//
// The check asks the kernel the very question: it renames a name that does
// not exist from the staging folder into the drop-in folder. Linux compares
// the two folders' mounts before it looks the source up (fs/namei.c,
// do_renameat2: EXDEV, and only then ENOENT for a missing source), so the
// answer is EXDEV across mounts and ENOENT within one, and nothing is
// created, moved, or seen by CRI-O. Comparing st_dev would miss the bind
// mount of a folder of the same filesystem, which has the same st_dev and
// still fails the rename.
import { randomUUID } from 'node:crypto';
import * as fsp from 'node:fs/promises';
import * as path from 'node:path';

/** The pin file cannot be renamed into place: the drop-in and staging folders are on different mounts. */
export class CrossMountError extends Error {
  readonly code = 'EXDEV';
  constructor(message: string) {
    super(message);
    this.name = 'CrossMountError';
  }
}

/**
 * Why the pin file cannot be renamed from `stagingDir` into `dropInDir`,
 * or null when it can (or when a folder does not exist yet: the first
 * write creates them and asks again). The message says what to mount.
 */
export async function crossMountProblem(dropInDir: string, stagingDir: string): Promise<string | null> {
  const probe = `.pinset-mount-probe-${randomUUID()}`;
  const from = path.join(stagingDir, probe);
  // A name made up just now cannot exist; if it somehow does, do not move it.
  if ((await fsp.lstat(from).catch(() => null)) !== null) return null;
  try {
    await fsp.rename(from, path.join(dropInDir, probe));
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'EXDEV') return null;
    return crossMountMessage(dropInDir, stagingDir, await mountPoints(dropInDir, stagingDir));
  }
  // Unreachable on Linux (the source does not exist); nothing to undo elsewhere.
  return null;
}

/** Where each folder is mounted, from /proc/self/mountinfo, for the message. */
export interface MountPoints {
  /** The mount point the drop-in folder is under, and the folder's real path. */
  dropIn?: string;
  dropInReal?: string;
  staging?: string;
}

/**
 * What is wrong and what to mount instead, in one sentence short enough for
 * the sets' status (STATUS_MAX_MESSAGE_BYTES, after the pin file's name).
 */
export function crossMountMessage(dropInDir: string, stagingDir: string, mounts: MountPoints = {}): string {
  const dropIn = path.resolve(dropInDir);
  const parent = path.dirname(dropIn);
  let what: string;
  if (mounts.dropIn && mounts.dropIn === mounts.dropInReal) what = `${dropIn} is a mount point of its own, apart from the staging folder ${stagingDir}`;
  else if (mounts.dropIn && mounts.staging) what = `${dropIn} (mounted at ${mounts.dropIn}) and the staging folder ${stagingDir} (mounted at ${mounts.staging}) are on different mounts`;
  else what = `${dropIn} and the staging folder ${stagingDir} are on different mounts`;
  return (
    `${what}: the pin file cannot be renamed into place (EXDEV). ` +
    `Mount ${parent} read-write as one mount instead (deploy/agent/daemonset.yaml mounts the host's /etc/crio at /host/etc/crio; ` +
    `the systemd unit has ReadWritePaths=/etc/crio); the current pins stay`
  );
}

/** One line of /proc/self/mountinfo: proc(5). */
interface MountInfoEntry {
  id: number;
  mountPoint: string;
}

/** Octal escapes in mountinfo paths (\040 for a space, \011, \012, \134). */
function unescapeMountPath(s: string): string {
  return s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
}

export function parseMountInfo(text: string): MountInfoEntry[] {
  const out: MountInfoEntry[] = [];
  for (const line of text.split('\n')) {
    const f = line.split(' ');
    if (f.length < 5) continue;
    out.push({ id: Number(f[0]), mountPoint: unescapeMountPath(f[4]!) });
  }
  return out;
}

/**
 * The mount point a path is under: the longest mount point that is the path
 * or one of its parents, the later of two on one point (it hides the
 * earlier). For the message only: the rename probe decides.
 */
export function mountPointOf(entries: readonly MountInfoEntry[], p: string): string | undefined {
  let best: string | undefined;
  for (const e of entries) {
    const m = e.mountPoint;
    const under = m === '/' || p === m || p.startsWith(m + '/');
    if (under && (best === undefined || m.length >= best.length)) best = m;
  }
  return best;
}

async function mountPoints(dropInDir: string, stagingDir: string): Promise<MountPoints> {
  try {
    const entries = parseMountInfo(await fsp.readFile('/proc/self/mountinfo', 'utf8'));
    const dropInReal = await fsp.realpath(dropInDir);
    const stagingReal = await fsp.realpath(stagingDir);
    return { dropIn: mountPointOf(entries, dropInReal), dropInReal, staging: mountPointOf(entries, stagingReal) };
  } catch {
    return {};
  }
}
