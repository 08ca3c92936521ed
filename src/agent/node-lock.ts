// One writer per node. Two agents on one node (the DaemonSet's pod and the
// systemd unit during a migration, two pods in an overlapping rollout) would
// each rewrite the pins with their own view (and reload CRI-O back and
// forth). So the agent takes an exclusive flock(2) on the node lock before it
// touches anything, and holds it for its whole life; a second agent waits,
// says why, and takes over the moment the first exits. Where the lock lives
// is the composition root's (./boot/node-lock-place.ts); a node lock may be
// several files, always taken in the same order, all held or none.
//
// flock(2) is released by the kernel when the last descriptor of the open
// file goes away, so a holder that is SIGKILLed, OOM-killed or loses its node
// to a panic never leaves a stale lock behind (a pid file would). Node.js has
// no flock(2), and a native addon needs build tools the image does not have,
// so the lock is taken by util-linux's `flock` program (Debian-essential: in
// the node:24-bookworm-slim image and on every host) on a descriptor the
// agent opens and lends it as fd 3: `flock 3` locks the open file
// description the agent shares, and exits; the lock then lives exactly as
// long as the agent's own descriptor, i.e. as long as the agent.
//
// The lock file also says who holds it (pid, host or pod name, start time),
// for the waiting agent's messages. It is never deleted: deleting a lock file
// while it is held would let the next agent lock a new file beside it.
//
// A lock file is pinset's own, and so is its folder: a name planted there by
// someone else is refused, naming it and what to do, never followed or
// written through. The folder may not be a symbolic link, the file is opened
// by ../util/own-file.ts (no link of either kind, a regular file only), and
// the holder is read back with the bounded reader (../util/regular-file.ts).
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as fsp from 'node:fs/promises';
import * as path from 'node:path';
import { openOwnFileReadOnlySync, openOwnFileSync, OwnFileError } from '../util/own-file.ts';
import { readRegularFile } from '../util/regular-file.ts';

export const LOCK_FILE_NAME = 'agent.lock';

/** Who holds the lock, as the holder wrote it. */
export interface LockHolder {
  pid: number;
  /** Host name: the pod's name inside a pod, the node's on a host. */
  host: string;
  node: string;
  /** "pod" when running in Kubernetes, else "host". */
  runsIn: 'pod' | 'host';
  /** When the holder process started and when it took the lock (RFC 3339). */
  startedAt: string;
  lockedAt: string;
}

/** flock's exit status for "held by someone else" (-E): EX_TEMPFAIL, apart from its own errors (1, 64+). */
const BUSY_EXIT = 75;

/**
 * A blocking wait is one `flock --wait` of this many seconds, repeated: the
 * kernel wakes it the moment the lock is free, and a waiter whose agent was
 * SIGKILLed (nothing kills its children) gives up within this bound.
 */
const WAIT_ROUND_SECONDS = 15;

export function describeHolder(h: LockHolder | null): string {
  if (!h) return 'another pinset agent (it has not said who it is)';
  return `pinset agent pid ${h.pid} on ${h.runsIn === 'pod' ? `pod ${h.host}` : `host ${h.host}`} (node ${h.node}, started ${h.startedAt})`;
}

/** One file of a node lock. */
export interface LockFileSpec {
  path: string;
  /**
   * Taken only where it can be: a file this process cannot create (its
   * folder read-only here) is locked read-only if it exists (flock(2) needs
   * no write access), and left out if it does not (no agent holds a lock
   * file that was never created).
   */
  bestEffort?: boolean;
  /** The flag that names this file's folder, for a refusal of a folder that is a link to point at. */
  folderFlag?: string;
}

/** What holder() reads of a lock file: one identity is about 200 bytes. */
const HOLDER_MAX_BYTES = 4096;

/** Errors of a folder this process may not write in (ENOENT: mkdir on a read-only mount may say so): a best-effort file is then taken read-only. */
const CANNOT_MAKE = new Set(['EROFS', 'EACCES', 'EPERM', 'ENOENT']);

/** The node lock: its files, taken in order, all held or none. */
export class NodeLock {
  /** The node's lock (the first file); the others are taken after it. */
  readonly path: string;
  private readonly files: LockFile[];

  constructor(files: readonly (LockFileSpec | string)[], identity: Omit<LockHolder, 'lockedAt'>, opts: { flockBin?: string } = {}) {
    this.files = files.map((f) => new LockFile(typeof f === 'string' ? { path: f } : f, identity, opts.flockBin ?? 'flock'));
    this.path = this.files[0]!.path;
  }

  get isHeld(): boolean {
    return this.files.every((f) => f.isHeld);
  }

  /**
   * Wait for every file in order. `onWait` is called when one is held by
   * another agent (again whenever the holder changes), with that file's
   * path. Resolves true once all are held, false (none held) when `signal`
   * aborts or `timeoutMs` passes first.
   */
  async acquire(opts: { signal?: AbortSignal; timeoutMs?: number; onWait?: (holder: LockHolder | null, path: string) => void } = {}): Promise<boolean> {
    const deadline = opts.timeoutMs === undefined ? undefined : Date.now() + opts.timeoutMs;
    try {
      for (const f of this.files) {
        const timeoutMs = deadline === undefined ? undefined : Math.max(0, deadline - Date.now());
        if (!(await f.acquire({ signal: opts.signal, timeoutMs, onWait: (h) => opts.onWait?.(h, f.path) }))) {
          this.release();
          return false;
        }
      }
    } catch (e) {
      this.release();
      throw e;
    }
    return true;
  }

  /** Release every file, the last taken first (the kernel drops each lock). Exiting does the same. */
  release(): void {
    for (const f of [...this.files].reverse()) f.release();
  }
}

class LockFile {
  readonly path: string;
  private readonly bestEffort: boolean;
  private readonly folderFlag: string | undefined;
  private readonly flockBin: string;
  private readonly identity: Omit<LockHolder, 'lockedAt'>;
  private fd: number | undefined;
  private readOnly = false;
  private held = false;

  constructor(spec: LockFileSpec, identity: Omit<LockHolder, 'lockedAt'>, flockBin: string) {
    this.path = spec.path;
    this.bestEffort = spec.bestEffort ?? false;
    this.folderFlag = spec.folderFlag;
    this.identity = identity;
    this.flockBin = flockBin;
  }

  get isHeld(): boolean {
    return this.held;
  }

  /** Take the lock if it is free; false when another agent holds it. */
  private async tryAcquire(): Promise<boolean> {
    const r = await this.flock(['--nonblock']);
    if (r === 'locked') this.locked();
    return r === 'locked';
  }

  /**
   * Wait for the lock. `onWait` is called when it is held by another agent
   * (again whenever the holder changes). Resolves true once held, false when
   * `signal` aborts or `timeoutMs` passes first.
   */
  async acquire(opts: { signal?: AbortSignal; timeoutMs?: number; onWait?: (holder: LockHolder | null) => void } = {}): Promise<boolean> {
    if ((await this.openFile()) === undefined) {
      this.held = true; // left out: nothing to lock here (see LockFileSpec.bestEffort)
      return true;
    }
    if (await this.tryAcquire()) return true;
    const deadline = opts.timeoutMs === undefined ? Infinity : Date.now() + opts.timeoutMs;
    let lastHolder: string | undefined;
    for (;;) {
      let holder = await this.holder();
      // The holder may be between truncating the file and writing to it.
      if (!holder) holder = await new Promise<void>((r) => setTimeout(r, 200)).then(() => this.holder());
      const key = JSON.stringify(holder);
      if (key !== lastHolder) {
        lastHolder = key;
        opts.onWait?.(holder);
      }
      const left = deadline - Date.now();
      if (opts.signal?.aborted || left <= 0) break;
      const seconds = Math.max(0.1, Math.min(WAIT_ROUND_SECONDS, left / 1000));
      const r = await this.flock(['--wait', seconds.toFixed(1)], opts.signal);
      if (r === 'locked') {
        this.locked();
        return true;
      }
    }
    // A flock killed by the abort may have taken the lock on our descriptor
    // just before: closing it releases that.
    this.release();
    return false;
  }

  /** Who holds the lock, from the file; null when it does not say. */
  async holder(): Promise<LockHolder | null> {
    try {
      const h = JSON.parse(await readRegularFile(this.path, { maxBytes: HOLDER_MAX_BYTES, noFollow: true })) as LockHolder;
      return typeof h?.pid === 'number' && typeof h.host === 'string' ? h : null;
    } catch {
      return null;
    }
  }

  /** Release: close the descriptor (the kernel drops the lock). Exiting does the same. */
  release(): void {
    if (this.fd !== undefined) fs.closeSync(this.fd);
    this.fd = undefined;
    this.held = false;
  }

  /**
   * The lock file's descriptor, made and opened on first use; undefined for
   * a best-effort file that is not there and cannot be made. A planted name
   * (the folder a link, the file a link of either kind, not a regular file)
   * is an OwnFileError, best effort or not: it is not pinset's lock file,
   * and an agent of an earlier version would write through a hard link.
   */
  private async openFile(): Promise<number | undefined> {
    if (this.fd !== undefined) return this.fd;
    const dir = path.dirname(this.path);
    try {
      this.refuseLinkedFolder(dir);
      await fsp.mkdir(dir, { recursive: true, mode: 0o700 });
      this.fd = this.ownFile(() => openOwnFileSync(this.path));
    } catch (e) {
      if (e instanceof OwnFileError || !this.bestEffort || !CANNOT_MAKE.has((e as NodeJS.ErrnoException).code ?? '')) throw e;
      this.fd = this.openReadOnly();
    }
    return this.fd;
  }

  /** A best-effort file in a folder this process cannot write: locked read-only where it is there (flock(2) needs no write access). */
  private openReadOnly(): number | undefined {
    try {
      const fd = this.ownFile(() => openOwnFileReadOnlySync(this.path));
      this.readOnly = true;
      return fd;
    } catch (e) {
      if (e instanceof OwnFileError || (e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
      return undefined;
    }
  }

  /** The descriptor `open` gives; its refusal said as the node lock's. */
  private ownFile(open: () => number): number {
    try {
      return open();
    } catch (e) {
      throw e instanceof OwnFileError ? new OwnFileError(`the node lock ${e.message}`, e.code) : e;
    }
  }

  /**
   * The lock's folder is pinset's own, not a symbolic link: a link resolves
   * against the root of whoever follows it (the host's /, a pod's own root
   * with the host's folders under /host), so agents in different places
   * would lock different files, and a planted link would put the lock and
   * the holder written in it wherever it points. Missing is fine: it is made.
   */
  private refuseLinkedFolder(dir: string): void {
    let linked: boolean;
    try {
      linked = fs.lstatSync(dir).isSymbolicLink();
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') return;
      throw e;
    }
    if (!linked) return;
    let target = '?';
    try {
      target = fs.readlinkSync(dir);
    } catch {
      // Replaced meanwhile: the refusal stands, without the target.
    }
    const instead = this.folderFlag ? `give ${this.folderFlag} the folder the link points to, or replace the link with a folder` : 'replace the link with a folder';
    throw new OwnFileError(`the node lock's folder ${dir} is a symbolic link (to ${target}): pinset takes its lock ${this.path} only in a folder of its own, not through a link; ${instead}`, 'ELOOP');
  }

  /** Run `flock -E 75 <args> 3` on our descriptor. */
  private async flock(args: string[], signal?: AbortSignal): Promise<'locked' | 'busy'> {
    const fd = (await this.openFile())!;
    return new Promise((resolve, reject) => {
      const child = spawn(this.flockBin, ['--exclusive', '--conflict-exit-code', String(BUSY_EXIT), ...args, '3'], { stdio: ['ignore', 'ignore', 'pipe', fd] });
      let stderr = '';
      child.stderr!.setEncoding('utf8').on('data', (d: string) => (stderr += d));
      const onAbort = () => child.kill('SIGKILL');
      signal?.addEventListener('abort', onAbort, { once: true });
      child.once('error', (e: NodeJS.ErrnoException) => {
        signal?.removeEventListener('abort', onAbort);
        reject(
          e.code === 'ENOENT'
            ? new Error(`the flock program (util-linux) is not on PATH; the agent needs it to take the node lock ${this.path}`)
            : new Error(`cannot run flock for the node lock ${this.path}: ${e.message}`),
        );
      });
      child.once('close', (code, sig) => {
        signal?.removeEventListener('abort', onAbort);
        if (code === 0) resolve('locked');
        else if (code === BUSY_EXIT || sig === 'SIGKILL') resolve('busy');
        else reject(new Error(`flock failed on the node lock ${this.path} (exit ${code ?? sig}): ${stderr.trim().slice(0, 300)}`));
      });
    });
  }

  private locked(): void {
    this.held = true;
    if (this.readOnly) return; // locked, but it cannot say who holds it
    const me: LockHolder = { ...this.identity, lockedAt: new Date().toISOString() };
    const text = JSON.stringify(me) + '\n';
    // Through the locked descriptor: the file holds exactly one identity.
    fs.ftruncateSync(this.fd!, 0);
    fs.writeSync(this.fd!, text, 0, 'utf8');
  }
}
