// The size estimator that asks the registries (see src/agent/estimate.ts): each
// image's manifest (for an index, the node's platform's), its config and
// layer sizes. What a reference by digest was found to hold is kept (its
// blobs' digests and sizes, not its manifests: a tenth of the memory), so
// an estimate made again (pulls retried) asks the registry nothing; a
// registry found unreachable is not asked again for a minute, so a
// reconcile never waits on it image by image; the whole estimate has a time
// budget.
import { RegistryError, type RegistryClient } from './client.ts';
import { hostPlatform, type Platform } from './manifest.ts';
import { parseImageName } from './names.ts';
import { imageCost, PlatformNotFoundError } from './size.ts';

/** An image's blobs (digest -> compressed bytes), or why they are unknown. */
export type ImageSizes = { blobs: ReadonlyMap<string, number> } | { unknown: string };

/** The seam the agent's disk estimate asks; MemorySizeEstimator (src/agent/estimate.ts) is its in-memory twin. */
export interface SizeEstimator {
  /** Sizes for each reference (a digest reference); a failure is `unknown`, never thrown (only a cancelled signal rejects). */
  sizes(references: readonly string[], signal?: AbortSignal): Promise<Map<string, ImageSizes>>;
}

/** A registry found unreachable is not asked again for this long (so a reconcile never waits on it image by image). */
export const UNREACHABLE_MEMORY_MS = 60_000;

export interface RegistrySizeEstimatorOptions {
  platform?: Platform;
  /** Manifest requests in flight at once. Default 8. */
  parallel?: number;
  /** No estimate takes longer than this; what is not known by then is unknown. Default 60 s. */
  budgetMs?: number;
  /** Sizes of references by digest kept, the least recently used dropped first. Default 4096. */
  cacheEntries?: number;
  now?: () => number;
}

export class RegistrySizeEstimator implements SizeEstimator {
  private readonly client: RegistryClient;
  private readonly platform: Platform;
  private readonly parallel: number;
  private readonly budgetMs: number;
  private readonly now: () => number;
  /** host -> until when it is taken as unreachable, and what it said. */
  private readonly unreachable = new Map<string, { until: number; why: string }>();
  private readonly cacheEntries: number;
  /** Reference by digest -> its blobs (content by digest never changes), in least recently used order. */
  private readonly known = new Map<string, ImageSizes>();

  constructor(client: RegistryClient, opts: RegistrySizeEstimatorOptions = {}) {
    this.client = client;
    this.platform = opts.platform ?? hostPlatform();
    this.parallel = opts.parallel ?? 8;
    this.budgetMs = opts.budgetMs ?? 60_000;
    this.cacheEntries = opts.cacheEntries ?? 4096;
    this.now = opts.now ?? Date.now;
  }

  async sizes(references: readonly string[], signal?: AbortSignal): Promise<Map<string, ImageSizes>> {
    const out = new Map<string, ImageSizes>();
    const budget = AbortSignal.timeout(this.budgetMs);
    const sig = signal ? AbortSignal.any([signal, budget]) : budget;
    let next = 0;
    const worker = async () => {
      while (next < references.length) {
        const ref = references[next++]!;
        out.set(ref, await this.one(ref, sig));
      }
    };
    await Promise.all(Array.from({ length: Math.min(this.parallel, references.length) }, worker));
    if (signal?.aborted) throw signal.reason;
    return out;
  }

  private async one(ref: string, signal: AbortSignal): Promise<ImageSizes> {
    const parsed = parseImageName(ref);
    if (!parsed.ok) return { unknown: parsed.error };
    const name = parsed.value;
    const hit = this.known.get(ref);
    if (hit) {
      this.known.delete(ref);
      this.known.set(ref, hit);
      return hit;
    }
    const down = this.unreachable.get(name.host);
    if (down && down.until > this.now()) return { unknown: down.why };
    if (signal.aborted) return { unknown: 'the size estimate ran out of time' };
    try {
      const cost = await imageCost(this.client, name, this.platform, signal);
      const blobs = new Map<string, number>([[cost.config.digest, cost.config.size]]);
      for (const l of cost.layers) blobs.set(l.digest, l.size);
      const sizes = { blobs };
      if (name.digest) {
        this.known.set(ref, sizes);
        while (this.known.size > this.cacheEntries) this.known.delete(this.known.keys().next().value!);
      }
      return sizes;
    } catch (e) {
      if (signal.aborted) return { unknown: 'the size estimate ran out of time' };
      if (e instanceof RegistryError) {
        if (e.kind === 'Unavailable') this.unreachable.set(name.host, { until: this.now() + UNREACHABLE_MEMORY_MS, why: e.message });
        return { unknown: e.message };
      }
      if (e instanceof PlatformNotFoundError) return { unknown: `${ref}: ${e.message}` };
      return { unknown: `${ref}: ${(e as Error).message}` };
    }
  }
}

