// The disk a batch of pulls will need, estimated before pulling: the
// compressed sizes of the distinct layers and configs of the images about
// to be downloaded (for an index, the node's platform's image), read from
// the registries, times a factor (the enhancement's heuristic, 2: an
// unpacked layer takes about twice its compressed size). Every layer counts,
// including any the node already holds for another image: the CRI lists
// images, not layers, so that cannot be known cheaply; the estimate errs
// high.
//
// The seam is SizeEstimator: RegistrySizeEstimator (src/registry/size-estimator.ts)
// asks the registries (sizes kept per digest reference, so a resync asks
// nothing again); MemorySizeEstimator is its in-memory twin for tests.
import type { Logger } from 'pino';
import { containerdNeedsHostTable } from '../containerd/versions.ts';
import type { CredentialSource } from '../registry/credentials.ts';
import { formatBytes } from '../registry/size.ts';
import type { ImageSizes, SizeEstimator } from '../registry/size-estimator.ts';

export type { ImageSizes, SizeEstimator } from '../registry/size-estimator.ts';

export { DEFAULT_DISK_ESTIMATE_FACTOR } from '../registry/size.ts';

/** The in-memory twin: sizes set by the test, with a count of what was asked. */
export class MemorySizeEstimator implements SizeEstimator {
  readonly known = new Map<string, ImageSizes>();
  readonly asked: string[][] = [];
  set(ref: string, blobs: Record<string, number>): void {
    this.known.set(ref, { blobs: new Map(Object.entries(blobs)) });
  }
  fail(ref: string, why: string): void {
    this.known.set(ref, { unknown: why });
  }
  async sizes(references: readonly string[]): Promise<Map<string, ImageSizes>> {
    this.asked.push([...references]);
    return new Map(references.map((r) => [r, this.known.get(r) ?? { unknown: `${r}: no size known` }]));
  }
}

/** What the node status says of a set's estimate: its bytes (what is known), and why some are unknown. */
export interface SetEstimate {
  bytes?: number;
  unknown?: string;
}

export interface BatchEstimate {
  /** Estimated disk for the batch (distinct blobs of the known images x factor). */
  neededBytes: number;
  /** Per set key: estimated disk of that set's images in the batch (its distinct blobs x factor). */
  perSet: Map<string, number>;
  /** Images whose size is unknown, with why (the estimate is then a lower bound). */
  unknown: { reference: string; why: string }[];
}

/** Sum a batch: each blob once for the batch, each blob once per set. */
export function estimateBatch(
  images: readonly { reference: string; sets: readonly string[] }[],
  sizes: ReadonlyMap<string, ImageSizes>,
  factor: number,
): BatchEstimate {
  const all = new Map<string, number>();
  const bySet = new Map<string, Map<string, number>>();
  const unknown: BatchEstimate['unknown'] = [];
  for (const img of images) {
    const s = sizes.get(img.reference) ?? { unknown: 'not estimated' };
    if ('unknown' in s) {
      unknown.push({ reference: img.reference, why: s.unknown });
      continue;
    }
    for (const [d, n] of s.blobs) {
      all.set(d, n);
      for (const set of img.sets) {
        let m = bySet.get(set);
        if (!m) bySet.set(set, (m = new Map()));
        m.set(d, n);
      }
    }
  }
  const sum = (m: Map<string, number>) => [...m.values()].reduce((a, b) => a + b, 0);
  const perSet = new Map<string, number>();
  for (const [set, m] of bySet) perSet.set(set, Math.ceil(sum(m) * factor));
  return { neededBytes: Math.ceil(sum(all) * factor), perSet, unknown };
}

/** Room below the watermark on the image filesystem: what the kubelet lets images use before its GC starts. */
export function roomBelowWatermark(sizeBytes: number, usedBytes: number, watermarkPercent: number): number {
  return Math.floor((sizeBytes * watermarkPercent) / 100) - usedBytes;
}

/** "needs 12.3 GiB, 8.1 GiB free below the 85% watermark on /var/lib/containers" */
export function noSpaceMessage(neededBytes: number, roomBytes: number, watermarkPercent: number, mountpoint: string, images: number, unknown: number): string {
  const free = roomBytes > 0 ? `${formatBytes(roomBytes)} free` : `${formatBytes(-roomBytes)} over`;
  return (
    `needs ${formatBytes(neededBytes)}, ${free} below the ${watermarkPercent}% watermark on ${mountpoint}` +
    ` (estimated for ${images} image(s) to download${unknown ? `, ${unknown} more of unknown size` : ''}: their compressed layers and configs x the disk estimate factor); nothing of this batch is pulled until space is freed`
  );
}

export type MirrorConfig = { containerdHosts: string | undefined; hostTableRequired: boolean } | 'registries.conf';

/**
 * Where the agent's size estimate learns the node's mirrors: containerd's
 * registry hosts where the runtime is containerd (its default folder
 * unless --containerd-hosts-dir names one) or wherever that flag is given;
 * registries.conf otherwise (CRI-O reads it). On a containerd node the
 * hosts are what containerd pulls through, so registries.conf (podman's,
 * maybe) is not read there. The hosts are read as the runtime's version
 * reads them. Before the runtime has answered, --pin-backend containerd
 * counts as containerd.
 */
export function mirrorConfigFor(runtime: { name?: string; version?: string }, containerdHostsDir: string | undefined): MirrorConfig {
  const containerd = runtime.name?.toLowerCase() === 'containerd';
  if (!containerdHostsDir && !containerd) return 'registries.conf';
  return { containerdHosts: containerdHostsDir, hostTableRequired: containerd && containerdNeedsHostTable(runtime.version ?? '') };
}

export interface LazyEstimatorOptions {
  credentials: CredentialSource;
  /** registries.conf and its drop-in folder. */
  file?: string;
  dir: string;
  /** --containerd-hosts-dir. */
  containerdHostsDir?: string;
  /** --host-root: where an absolute certificate path of a hosts.toml is read. */
  hostRoot?: string;
  /** The runtime's name and version from CRI Version; unset until it answers. */
  runtime: () => { name?: string; version?: string };
  logger: Logger;
}

/**
 * The agent's estimator: a RegistrySizeEstimator made on first use, with the
 * node's mirrors (mirrorConfigFor) and the agent's own credentials.
 * registries.conf is read then (CRI-O too reads it at start and on reload);
 * containerd's hosts are looked at again as they change (containerd reads
 * them on every pull). A registries.conf that cannot be used is logged and
 * the registries are asked directly.
 */
export function lazyRegistrySizeEstimator(opts: LazyEstimatorOptions): SizeEstimator {
  const made = new Map<string, Promise<SizeEstimator>>();
  const make = async (config: MirrorConfig) => {
    // Loaded here, not at start: the registry client (undici) costs memory a node without downloads never needs.
    const [{ RegistrySizeEstimator }, { RegistryClient }, { loadRegistriesConf, RegistriesConf }, { ContainerdHosts, DEFAULT_CONTAINERD_HOSTS_DIR }] = await Promise.all([
      import('../registry/size-estimator.ts'),
      import('../registry/client.ts'),
      import('../registry/registries-conf.ts'),
      import('../registry/containerd-hosts.ts'),
    ]);
    let registries;
    let containerdHosts;
    if (config === 'registries.conf') {
      try {
        registries = await loadRegistriesConf({ file: opts.file, dir: opts.dir });
      } catch (e) {
        opts.logger.warn({ err: (e as Error).message }, 'registries.conf unusable; size estimates ask the registries directly, without mirrors');
        registries = RegistriesConf.empty();
      }
    } else {
      const dir = config.containerdHosts ?? DEFAULT_CONTAINERD_HOSTS_DIR;
      containerdHosts = new ContainerdHosts(dir, {
        hostTableRequired: config.hostTableRequired,
        hostRoot: opts.hostRoot,
        onProblem: (err) => opts.logger.warn({ err }, 'a containerd hosts.toml is unusable; size estimates ask what containerd asks instead'),
      });
      opts.logger.info({ containerdHostsDir: dir }, "size estimates ask the registries as containerd does, through its registry hosts");
    }
    // Fewer attempts and a shorter deadline than the commands': a reconcile must not wait long on a registry.
    // No manifest cache: the estimator keeps what it needs of each image, its blobs' sizes.
    const client = new RegistryClient({ registries, containerdHosts, credentials: opts.credentials, timeoutMs: 10_000, attempts: 2, userAgent: 'pinset-agent', cacheEntries: 0 });
    return new RegistrySizeEstimator(client);
  };
  return {
    sizes: async (refs, signal) => {
      const config = mirrorConfigFor(opts.runtime(), opts.containerdHostsDir);
      const key = JSON.stringify(config);
      let estimator = made.get(key);
      if (!estimator) made.set(key, (estimator = make(config)));
      return (await estimator).sizes(refs, signal);
    },
  };
}
