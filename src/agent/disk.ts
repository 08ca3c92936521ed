// The disk check before pulls: the image filesystem (where the runtime
// says it keeps images, CRI ImageFsInfo) must stay under a high watermark.
// The kubelet's image garbage collection starts at 85% used
// (imageGCHighThresholdPercent); pulling past it makes the kubelet delete
// unpinned images to make room, and a full disk fails pulls half-way. So
// pulls wait while the filesystem is above the watermark; pins stay.
import type { ImageRuntime } from '../cri/runtime.ts';

export interface FsUsage {
  mount: string;
  size: number;
  used: number;
}

/** Usage of the filesystem holding `path` (the longest mount point that contains it). */
export async function fsUsageOf(path: string): Promise<FsUsage | null> {
  // Loaded on first use: only a reconcile with images to pull checks the disk.
  const si = (await import('systeminformation')).default;
  const all = await si.fsSize();
  let best: FsUsage | null = null;
  for (const f of all) {
    const m = f.mount;
    const contains = path === m || path.startsWith(m.endsWith('/') ? m : `${m}/`);
    if (contains && (!best || m.length > best.mount.length)) best = { mount: m, size: f.size, used: f.used };
  }
  return best;
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
  private readonly usageOf: (path: string) => Promise<FsUsage | null>;
  private readonly ttlMs: number;
  private readonly now: () => number;
  private last: { at: number; answer: Promise<string | null> } | undefined;

  constructor(
    runtime: ImageRuntime,
    opts: { highWatermarkPercent: number; usageOf?: (path: string) => Promise<FsUsage | null>; ttlMs?: number; now?: () => number },
  ) {
    this.runtime = runtime;
    this.highWatermarkPercent = opts.highWatermarkPercent;
    this.usageOf = opts.usageOf ?? fsUsageOf;
    this.ttlMs = opts.ttlMs ?? DISK_CHECK_TTL_MS;
    this.now = opts.now ?? Date.now;
  }

  /** null when pulls may go ahead, else why not. Unknown usage never blocks. */
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
      const s = { mountpoint: f.mountpoint, size: u.size, used: u.used };
      if (!best || room(s) < room(best)) best = s;
    }
    return best;
  }

  private async check(): Promise<string | null> {
    if (this.highWatermarkPercent <= 0 || this.highWatermarkPercent >= 100) return null;
    const filesystems = await this.runtime.imageFsInfo().catch(() => []);
    for (const f of filesystems) {
      if (!f.mountpoint) continue;
      const u = await this.usageOf(f.mountpoint).catch(() => null);
      if (!u || u.size <= 0) continue;
      const pct = (u.used / u.size) * 100;
      if (pct >= this.highWatermarkPercent) {
        return `image filesystem ${f.mountpoint} (mounted at ${u.mount}) is ${pct.toFixed(1)}% full, at or above the ${this.highWatermarkPercent}% high watermark where the kubelet's image garbage collection starts; pulls wait until space is freed`;
      }
    }
    return null;
  }
}
