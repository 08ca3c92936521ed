// One writer per node. Two agents on one node (the DaemonSet's pod and the
// systemd unit during a migration, two pods in an overlapping rollout) would
// each rewrite the pin file with their own view and reload CRI-O back and
// forth. So the agent takes an exclusive flock(2) on
// `<parent of crio.conf.d>/.pinset/agent.lock` before it touches anything,
// and holds it for its whole life; a second agent waits, says why, and takes
// over the moment the first exits.
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
import { spawn } from 'node:child_process';
import { constants as fsc } from 'node:fs';
import * as fs from 'node:fs';
import * as fsp from 'node:fs/promises';
import * as path from 'node:path';
import { stagingDirFor } from '../crio/pinfile.ts';

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

export function lockPathFor(dropInDir: string): string {
  return path.join(stagingDirFor(dropInDir), LOCK_FILE_NAME);
}

export function describeHolder(h: LockHolder | null): string {
  if (!h) return 'another pinset agent (it has not said who it is)';
  return `pinset agent pid ${h.pid} on ${h.runsIn === 'pod' ? `pod ${h.host}` : `host ${h.host}`} (node ${h.node}, started ${h.startedAt})`;
}

export class NodeLock {
  readonly path: string;
  private readonly flockBin: string;
  private readonly identity: Omit<LockHolder, 'lockedAt'>;
  private fd: number | undefined;
  private held = false;

  constructor(lockPath: string, identity: Omit<LockHolder, 'lockedAt'>, opts: { flockBin?: string } = {}) {
    this.path = lockPath;
    this.identity = identity;
    this.flockBin = opts.flockBin ?? 'flock';
  }

  get isHeld(): boolean {
    return this.held;
  }

  /** Take the lock if it is free; false when another agent holds it. */
  async tryAcquire(): Promise<boolean> {
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
      const h = JSON.parse(await fsp.readFile(this.path, 'utf8')) as LockHolder;
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

  private async openFile(): Promise<number> {
    if (this.fd !== undefined) return this.fd;
    await fsp.mkdir(path.dirname(this.path), { recursive: true, mode: 0o700 });
    // O_NOFOLLOW: a link planted at the lock's name is refused, not followed.
    this.fd = fs.openSync(this.path, fsc.O_RDWR | fsc.O_CREAT | fsc.O_NOFOLLOW, 0o644);
    return this.fd;
  }

  /** Run `flock -E 75 <args> 3` on our descriptor. */
  private async flock(args: string[], signal?: AbortSignal): Promise<'locked' | 'busy'> {
    const fd = await this.openFile();
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
    const me: LockHolder = { ...this.identity, lockedAt: new Date().toISOString() };
    const text = JSON.stringify(me) + '\n';
    // Through the locked descriptor: the file holds exactly one identity.
    fs.ftruncateSync(this.fd!, 0);
    fs.writeSync(this.fd!, text, 0, 'utf8');
  }
}
