// The size estimator that asks the registries (see src/agent/estimate.ts): each
// image's manifest (for an index, the node's platform's manifest), which
// names its config's and its layers' digests and sizes, so no blob is
// fetched: one request per image (two for an index). What a reference by
// digest was found to hold is kept (its blobs' digests and sizes, not its
// manifests: a tenth of the memory), so an estimate made again (pulls
// retried) asks the registry nothing; a registry found unreachable is not
// asked again for a minute, so a reconcile never waits on it image by
// image; the whole estimate has a time budget.
//
// Every image of a batch is asked for at once, up to MAX_PARALLEL_REQUESTS:
// the pulls wait for the whole estimate, so it takes as long as its slowest
// chain of requests, and 8 at a time made a batch of N images take N/8
// round trips to the registry where one suffices. A registry this
// estimator has not had an answer from yet (the first estimate, or after
// it was found unreachable) is asked for one image first: that request
// learns what every other one needs (http or https, the token), and a
// registry that is down or a name that does not resolve costs one failed
// request, not one per image. A reference already being asked for (by an
// estimate started earlier, e.g. while the pin file is written) is not asked
// again: the later estimate waits for that answer.
import { RegistryError, type RegistryClient } from './client.ts';
import { hostPlatform, type Platform } from './manifest.ts';
import { parseImageName, type ImageName } from './names.ts';
import { imageCost, PlatformNotFoundError } from './size.ts';

/** An image's blobs (digest -> compressed bytes), or why they are unknown. */
/** An image's blobs (digest -> compressed bytes), and whether it is fetched through a mirror first (RegistryClient.throughMirror); or why not known. */
export type ImageSizes = { blobs: ReadonlyMap<string, number>; mirror?: boolean } | { unknown: string };

/** The seam the agent's disk estimate asks; MemorySizeEstimator (src/agent/estimate.ts) is its in-memory twin. */
export interface SizeEstimator {
  /** Sizes for each reference (a digest reference); a failure is `unknown`, never thrown (only a cancelled signal rejects). */
  sizes(references: readonly string[], signal?: AbortSignal): Promise<Map<string, ImageSizes>>;
}

/** A registry found unreachable is not asked again for this long (so a reconcile never waits on it image by image). */
export const UNREACHABLE_MEMORY_MS = 60_000;

/**
 * Manifest requests in flight at once, at most. Over HTTP/1.1 each is a
 * connection of its own (and a TLS handshake, the first time): 64 covers
 * the batches of nearly every set change in one round trip, while a
 * 1000-image set's first estimate neither opens 1000 connections to one
 * registry (nor holds 1000 requests' buffers at once, as with the CRI calls,
 * src/util/limit.ts) nor looks like a flood to a registry that limits
 * connections per client; it then takes 16 round trips, not 125.
 */
export const MAX_PARALLEL_REQUESTS = 64;

export interface RegistrySizeEstimatorOptions {
  platform?: Platform;
  /** Images asked for at once. Default MAX_PARALLEL_REQUESTS (every image of a batch of up to 64 at once). */
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
  /** Hosts that answered since they were last found unreachable: asked for every image at once. */
  private readonly answered = new Set<string>();
  /** Reference -> the request for it in flight, and the signal that may cut it short. */
  private readonly inflight = new Map<string, { answer: Promise<ImageSizes>; signal: AbortSignal }>();
  private readonly cacheEntries: number;
  /** Reference by digest -> its blobs (content by digest never changes), in least recently used order. */
  private readonly known = new Map<string, ImageSizes>();

  constructor(client: RegistryClient, opts: RegistrySizeEstimatorOptions = {}) {
    this.client = client;
    this.platform = opts.platform ?? hostPlatform();
    this.parallel = Math.max(1, opts.parallel ?? MAX_PARALLEL_REQUESTS);
    this.budgetMs = opts.budgetMs ?? 60_000;
    this.cacheEntries = opts.cacheEntries ?? 4096;
    this.now = opts.now ?? Date.now;
  }

  async sizes(references: readonly string[], signal?: AbortSignal): Promise<Map<string, ImageSizes>> {
    const out = new Map<string, ImageSizes>();
    // What is known (sizes kept, a registry known down, a name that does not parse) is answered here; the rest is asked for.
    const ask: { ref: string; name: ImageName }[] = [];
    for (const ref of references) {
      if (out.has(ref)) continue;
      const hit = this.known.get(ref);
      if (hit) {
        this.known.delete(ref);
        this.known.set(ref, hit);
        out.set(ref, hit);
        continue;
      }
      const parsed = parseImageName(ref);
      if (!parsed.ok) {
        out.set(ref, { unknown: parsed.error });
        continue;
      }
      const down = this.unreachable.get(parsed.value.host);
      if (down && down.until > this.now()) {
        out.set(ref, { unknown: down.why });
        continue;
      }
      // A placeholder keeps the answer in the order asked.
      out.set(ref, { unknown: 'not estimated' });
      ask.push({ ref, name: parsed.value });
    }
    if (ask.length > 0) {
      const budget = AbortSignal.timeout(this.budgetMs);
      const sig = signal ? AbortSignal.any([signal, budget]) : budget;
      // Asked for already: wait for that answer (asked again if another caller's signal cut it short).
      const joined = ask.filter(({ ref }) => {
        const f = this.inflight.get(ref);
        return f !== undefined && !f.signal.aborted;
      });
      const own = ask.filter((a) => !joined.includes(a));
      const joining = Promise.all(
        joined.map(async ({ ref, name }) => {
          const f = this.inflight.get(ref)!;
          const r = await f.answer;
          out.set(ref, f.signal.aborted && !sig.aborted ? await this.shared(ref, name, sig) : r);
        }),
      );
      let next = 0;
      // host -> its first request, while the others wait for it.
      const leads = new Map<string, Promise<void>>();
      const worker = async () => {
        while (next < own.length) {
          const { ref, name } = own[next++]!;
          const lead = leads.get(name.host);
          if (lead) {
            await lead;
          } else if (!this.answered.has(name.host)) {
            const first = this.shared(ref, name, sig).then((r) => void out.set(ref, r));
            leads.set(name.host, first);
            await first;
            continue;
          }
          out.set(ref, await this.shared(ref, name, sig));
        }
      };
      await Promise.all([joining, ...Array.from({ length: Math.min(this.parallel, own.length) }, worker)]);
    }
    if (signal?.aborted) throw signal.reason;
    return out;
  }

  /** one(), visible to other estimates while it runs. */
  private shared(ref: string, name: ImageName, signal: AbortSignal): Promise<ImageSizes> {
    const answer = this.one(ref, name, signal).finally(() => {
      if (this.inflight.get(ref)?.answer === answer) this.inflight.delete(ref);
    });
    this.inflight.set(ref, { answer, signal });
    return answer;
  }

  private async one(ref: string, name: ImageName, signal: AbortSignal): Promise<ImageSizes> {
    // A registry found down while this estimate ran is not asked again for the rest of it.
    const down = this.unreachable.get(name.host);
    if (down && down.until > this.now()) return { unknown: down.why };
    if (signal.aborted) return { unknown: 'the size estimate ran out of time' };
    try {
      const cost = await imageCost(this.client, name, this.platform, signal);
      this.answered.add(name.host);
      const blobs = new Map<string, number>([[cost.config.digest, cost.config.size]]);
      for (const l of cost.layers) blobs.set(l.digest, l.size);
      const sizes: ImageSizes = { blobs, ...((await this.client.throughMirror(name)) ? { mirror: true } : {}) };
      if (name.digest) {
        this.known.set(ref, sizes);
        while (this.known.size > this.cacheEntries) this.known.delete(this.known.keys().next().value!);
      }
      return sizes;
    } catch (e) {
      if (signal.aborted) return { unknown: 'the size estimate ran out of time' };
      if (e instanceof RegistryError) {
        if (e.kind === 'Unavailable') {
          this.unreachable.set(name.host, { until: this.now() + UNREACHABLE_MEMORY_MS, why: e.message });
          this.answered.delete(name.host);
        } else if (e.kind !== 'Blocked') {
          // It answered, if only to refuse this image (registries.conf blocking it asks nobody).
          this.answered.add(name.host);
        }
        return { unknown: e.message };
      }
      if (e instanceof PlatformNotFoundError) return { unknown: `${ref}: ${e.message}` };
      return { unknown: `${ref}: ${(e as Error).message}` };
    }
  }
}

