// The disk check before pulls: the runtime's image filesystem must stay
// under a high watermark. The kubelet's image garbage collection starts at
// 85% used (imageGCHighThresholdPercent); pulling past it makes the kubelet
// delete unpinned images to make room, and a full disk fails pulls half-way.
// So pulls wait while the filesystem is above the watermark; pins stay.
//
// What is measured: the filesystem the runtime keeps its images on. CRI
// ImageFsInfo names its mountpoint (CRI-O: `<storage root>/<driver>-images`,
// by default /var/lib/containers/storage/overlay-images), and the agent
// statfs(2)s that path as it sees it. statfs answers for the filesystem that
// really holds the path, whatever the mount table says: a separate disk
// mounted at /var/lib/containers, and inside a container a hostPath mount,
// are measured as themselves. (A lookup of "the longest mount point that
// contains the path" in a mount list measured another filesystem inside a
// container, whose mount list is not the host's.) In the DaemonSet the path
// is visible because CRI-O's storage root is mounted read-only at the same
// path; the systemd unit sees the host.
//
// When the path cannot be measured (not visible, statfs fails, the runtime
// names no image filesystem) the check says so (`unmeasured`, in the node
// status and logged once) and pulls go ahead: the kubelet's own garbage
// collection still guards the disk, and holding every pull back for a
// missing mount would stop the agent from doing its work. It never measures
// some other filesystem instead.
//
// systeminformation (a dependency kept for this) names the device and the
// filesystem type in messages: its mount list is trusted only where its
// size matches what statfs measured, i.e. only where it describes the very
// same filesystem.
import * as fsp from 'node:fs/promises';
import type { Logger } from 'pino';
import type { ImageRuntime } from '../cri/runtime.ts';

export interface FsUsage {
  /** Bytes in the filesystem (f_blocks x f_bsize). */
  size: number;
  /** Bytes an unprivileged writer may still use (f_bavail x f_bsize), as the kubelet counts them. */
  available: number;
}

/** statfs(2) of `path` as this process sees it; throws when it cannot be measured. */
export async function statfsUsage(path: string): Promise<FsUsage> {
  const st = await fsp.statfs(path);
  return { size: st.blocks * st.bsize, available: st.bavail * st.bsize };
}

/**
 * Used percent as the kubelet's image GC computes it
 * (pkg/kubelet/images/image_gc_manager.go: `100 - int(available*100/capacity)`).
 */
export function usedPercent(u: FsUsage): number {
  return 100 - Math.trunc((u.available * 100) / u.size);
}

/** "device /dev/sdb1, ext4, mounted at /var/lib/containers" when a mount list entry is the filesystem statfs measured; null otherwise. */
export async function describeFilesystem(path: string, size: number): Promise<string | null> {
  try {
    const si = (await import('systeminformation')).default;
    const all = await si.fsSize();
    const candidates = all
      .filter((f) => path === f.mount || path.startsWith(f.mount.endsWith('/') ? f.mount : `${f.mount}/`))
      // df reports 1 KiB blocks: allow for its rounding.
      .filter((f) => Math.abs(f.size - size) <= Math.max(1 << 20, size / 1000))
      .sort((a, b) => b.mount.length - a.mount.length);
    const f = candidates[0];
    return f ? `device ${f.fs}, ${f.type}, mounted at ${f.mount}` : null;
  } catch {
    return null;
  }
}

const GiB = 1024 ** 3;
function size(n: number): string {
  return n >= GiB ? `${(n / GiB).toFixed(1)} GiB` : `${(n / 1024 ** 2).toFixed(1)} MiB`;
}

/**
 * An answer is reused for this long: the kubelet samples image filesystem
 * usage on its 10 s housekeeping interval, and containerd refreshes
 * ImageFsInfo about as often, so a fresher answer would not be more true.
 */
export const DISK_CHECK_TTL_MS = 10_000;

/** An image filesystem as the disk check sees it. */
export interface ImageFsSpace {
  /** Where the runtime keeps images (CRI ImageFsInfo). */
  mountpoint: string;
  size: number;
  used: number;
}

export class DiskCheck {
  private readonly runtime: ImageRuntime;
  readonly highWatermarkPercent: number;
  private readonly usageOf: (path: string) => Promise<FsUsage>;
  private readonly describe: (path: string, size: number) => Promise<string | null>;
  private readonly ttlMs: number;
  private readonly now: () => number;
  private readonly log: Logger | undefined;
  private last: { at: number; answer: Promise<string | null> } | undefined;
  /**
   * Why the image filesystem could not be measured at the last check (pulls
   * then go ahead without the watermark); null when it was measured or not
   * checked yet.
   */
  unmeasured: string | null = null;

  constructor(
    runtime: ImageRuntime,
    opts: {
      highWatermarkPercent: number;
      usageOf?: (path: string) => Promise<FsUsage>;
      describe?: (path: string, size: number) => Promise<string | null>;
      ttlMs?: number;
      now?: () => number;
      logger?: Logger;
    },
  ) {
    this.runtime = runtime;
    this.highWatermarkPercent = opts.highWatermarkPercent;
    this.usageOf = opts.usageOf ?? statfsUsage;
    this.describe = opts.describe ?? describeFilesystem;
    this.ttlMs = opts.ttlMs ?? DISK_CHECK_TTL_MS;
    this.now = opts.now ?? Date.now;
    this.log = opts.logger;
  }

  /** null when pulls may go ahead, else why not. A filesystem that cannot be measured does not block (see `unmeasured`). */
  problem(): Promise<string | null> {
    if (this.last && this.now() - this.last.at < this.ttlMs) return this.last.answer;
    const answer = this.check();
    this.last = { at: this.now(), answer };
    return answer;
  }

  /**
   * The image filesystem with the least room below the high watermark, or
   * null when none can be measured (the estimate is then not compared).
   */
  async space(): Promise<ImageFsSpace | null> {
    const filesystems = await this.runtime.imageFsInfo().catch(() => []);
    let best: ImageFsSpace | null = null;
    const room = (f: ImageFsSpace) => (f.size * this.highWatermarkPercent) / 100 - f.used;
    for (const f of filesystems) {
      if (!f.mountpoint) continue;
      const u = await this.usageOf(f.mountpoint).catch(() => null);
      if (!u || u.size <= 0) continue;
      // Used as the kubelet counts it: everything not available to an unprivileged writer.
      const s = { mountpoint: f.mountpoint, size: u.size, used: u.size - u.available };
      if (!best || room(s) < room(best)) best = s;
    }
    return best;
  }

  private setUnmeasured(why: string | null): void {
    if (why === this.unmeasured) return;
    if (why) this.log?.warn({ err: why }, 'image filesystem cannot be measured; pulls go ahead without the high watermark check');
    else if (this.unmeasured) this.log?.info('image filesystem measured again');
    this.unmeasured = why;
  }

  private async check(): Promise<string | null> {
    if (this.highWatermarkPercent <= 0 || this.highWatermarkPercent >= 100) {
      this.setUnmeasured(null);
      return null;
    }
    let filesystems;
    try {
      filesystems = await this.runtime.imageFsInfo();
    } catch {
      // The runtime is down: that is reported on its own, and nothing is pulled meanwhile.
      return null;
    }
    const mountpoints = [...new Set(filesystems.map((f) => f.mountpoint).filter((m) => m))];
    if (mountpoints.length === 0) {
      this.setUnmeasured('the container runtime names no image filesystem (CRI ImageFsInfo returned no mountpoint)');
      return null;
    }
    const unmeasured: string[] = [];
    for (const mp of mountpoints) {
      let u: FsUsage;
      try {
        u = await this.usageOf(mp);
      } catch (e) {
        const code = (e as NodeJS.ErrnoException).code;
        unmeasured.push(
          code === 'ENOENT'
            ? `the image filesystem ${mp} (CRI ImageFsInfo) is not visible to the agent; mount the runtime's storage root at the same path (the DaemonSet mounts /var/lib/containers/storage read-only)`
            : `statfs of the image filesystem ${mp} failed: ${(e as Error).message}`,
        );
        continue;
      }
      if (u.size <= 0) {
        unmeasured.push(`statfs of the image filesystem ${mp} reports a size of 0`);
        continue;
      }
      const pct = usedPercent(u);
      if (pct >= this.highWatermarkPercent) {
        this.setUnmeasured(unmeasured[0] ?? null);
        const device = await this.describe(mp, u.size);
        return `image filesystem ${mp}${device ? ` (${device})` : ''} is ${pct}% full (${size(u.available)} free of ${size(u.size)}), at or above the ${this.highWatermarkPercent}% high watermark where the kubelet's image garbage collection starts; pulls wait until space is freed`;
      }
    }
    this.setUnmeasured(unmeasured[0] ?? null);
    return null;
  }
}
