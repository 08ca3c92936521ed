// What an image costs to pull: the compressed sizes of its layers and its
// config, read from its manifest (for an index, the manifest of the
// platform the node runs). Used by `pinset size` and by the agent's disk
// estimate. A multi-arch digest never counts as zero: the index's own
// entries are only pointers, the platform's manifest holds the sizes.
import type { RegistryClient } from './client.ts';
import { formatPlatform, platformsOf, selectPlatform, type Descriptor, type Platform } from './manifest.ts';
import type { ImageName } from './names.ts';

export interface ImageCost {
  /** The digest the reference resolved to (an index digest for a multi-arch image). */
  digest: string;
  /** The platform manifest's digest when `digest` is an index. */
  platformDigest?: string;
  /** The platform chosen from an index. */
  platform?: string;
  config: Descriptor;
  layers: Descriptor[];
  /** config + layers, compressed, as the registry sends them. */
  downloadBytes: number;
}

/** The enhancement's heuristic: an image takes about twice its compressed size on disk once unpacked. */
export const DEFAULT_DISK_ESTIMATE_FACTOR = 2;

export class PlatformNotFoundError extends Error {
  override name = 'PlatformNotFoundError';
}

/** The cost of one image for `platform`. Follows at most two levels of index (an index of indexes is rare but valid). */
export async function imageCost(client: RegistryClient, name: ImageName, platform: Platform, signal?: AbortSignal): Promise<ImageCost> {
  const top = await client.manifest(name, signal);
  let m = top;
  let platformDigest: string | undefined;
  for (let depth = 0; m.manifest.kind === 'index'; depth++) {
    if (depth >= 2) throw new PlatformNotFoundError(`${top.digest}: indexes nested more than two deep`);
    const entry = selectPlatform(m.manifest.manifests, platform);
    if (!entry) {
      const offered = platformsOf(m.manifest.manifests);
      throw new PlatformNotFoundError(`the index ${m.digest} has no image for ${formatPlatform(platform)} (it has ${offered.length ? offered.join(', ') : 'no platform entries'})`);
    }
    platformDigest = entry.digest;
    m = await client.manifest({ host: name.host, path: name.path, digest: entry.digest }, signal);
  }
  if (m.manifest.kind !== 'image') throw new Error('unreachable');
  const { config, layers } = m.manifest;
  const downloadBytes = config.size + layers.reduce((n, l) => n + l.size, 0);
  return {
    digest: top.digest,
    ...(platformDigest ? { platformDigest, platform: formatPlatform(platform) } : {}),
    config,
    layers,
    downloadBytes,
  };
}

/** Bytes of the distinct blobs (layers and configs) of several images: a layer shared by two images downloads once. */
export function distinctBytes(costs: readonly ImageCost[]): { bytes: number; blobs: number; layers: number } {
  const seen = new Map<string, number>();
  const layerDigests = new Set<string>();
  for (const c of costs) {
    seen.set(c.config.digest, c.config.size);
    for (const l of c.layers) {
      seen.set(l.digest, l.size);
      layerDigests.add(l.digest);
    }
  }
  let bytes = 0;
  for (const v of seen.values()) bytes += v;
  return { bytes, blobs: seen.size, layers: layerDigests.size };
}

/** 12.3 GiB, 512.0 MiB, 4.0 KiB, 17 B: binary units, one decimal. */
export function formatBytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return i === 0 ? `${n} B` : `${v.toFixed(1)} ${units[i]}`;
}
