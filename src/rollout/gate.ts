// The slot protocol one node follows (slots: ./slots.ts), independent of
// what downloads: the agent's reconcile (src/agent/rollout-hook.ts) and
// simulated nodes in tests and benchmarks drive it the same way.
//
// - Before downloading, admit(): an image may be downloaded when one of
//   the sets that want it has no limit or holds a slot. For every limited
//   set with images nothing else lets through, the node tries once to take
//   one of its slots; never waits there, and never waits for one set while
//   holding another's slot (each set's slot is taken, renewed and freed on
//   its own), so no node can block another in a cycle.
// - A set that got no slot waits: its next attempt is paced by a capped
//   exponential backoff with jitter (by default from a twelfth of the lease
//   duration up to the whole of it), and a set seen for the first time is
//   tried after a random delay of up to a sixth of the lease duration, so
//   thousands of nodes that learn of a new set together do not ask together.
// - A held slot is renewed every third of the lease duration while held.
// - When the downloads end (done or failed), releaseAll() frees every slot;
//   a failed image takes a slot again on its next retry. A slot of a set
//   that no longer has anything to download is freed on the next admit().
//
// Why poll rather than watch the Leases: at 5000 nodes, a watch per node on
// the slot Leases would send every renewal of every holder to every waiting
// node (maxConcurrentNodes / 20 s renewals x 5000 watchers) and wake all of
// them at once whenever a slot frees, a herd of conflicting writes for one
// slot. A waiting node instead sends one LIST from the watch cache per
// attempt (one per 30 to 60 s once it has waited a while: about 110/s from
// 5000 waiting nodes, against the 500 node-Lease writes/s the kubelets of
// 5000 nodes make anyway) and writes only when a slot looks free.
import type { Logger } from 'pino';
import { Backoff, type BackoffPolicy } from '../util/backoff.ts';
import type { HeldSlot, RolloutSet, RolloutSlots } from './slots.ts';

/** An image to download, by its key and the keys of the sets that want it. */
export interface GateImage {
  key: string;
  sets: readonly string[];
}

/** Why a set's downloads wait (the set's status says it, reason WaitingForRolloutSlot). */
export interface SlotWait {
  maxConcurrentNodes: number;
  /** The last attempt failed (the API could not be reached, ...); absent when every slot was held. */
  error?: string;
}

export interface Admission<T> {
  /** The images that may be downloaded now (and every image that needs no slot). */
  allowed: T[];
  /** By set key: the sets whose downloads wait for a slot. */
  waits: Map<string, SlotWait>;
  /** By set key: the sets downloading without a slot because this node may not hold one (403), and the API's answer. */
  unenforced: Map<string, string>;
}

export interface RolloutGateOptions {
  slots: RolloutSlots;
  logger: Logger;
  /** Renew a held slot this often; default a third of the lease duration. */
  renewIntervalMs?: number;
  /** Pace of a waiting set's attempts; default from a twelfth of the lease duration up to all of it. */
  retry?: BackoffPolicy;
  /** A set seen for the first time is tried after a random delay of up to this; default a sixth of the lease duration. */
  firstAttemptSpreadMs?: number;
  /** Called when a held slot turns out to be another node's (this node could not renew it in time). */
  onLost?: (setKey: string) => void;
  now?: () => number;
  random?: () => number;
}

interface Held {
  slot: HeldSlot;
  set: RolloutSet;
  timer: NodeJS.Timeout;
  renewing?: Promise<void>;
}

interface Waiting {
  backoff: Backoff;
  nextAttemptAt: number;
  error?: string;
  /** The wait was logged (once per wait). */
  logged?: boolean;
  /** The last attempt was refused with 403. */
  forbidden?: boolean;
}

function errText(e: unknown): string {
  return (e instanceof Error ? e.message : String(e)).split('\n')[0]!.slice(0, 300);
}

export class RolloutGate {
  readonly slots: RolloutSlots;
  readonly #log: Logger;
  readonly #renewMs: number;
  readonly #retry: BackoffPolicy;
  readonly #spreadMs: number;
  readonly #now: () => number;
  readonly #random: () => number;
  readonly #onLost: ((setKey: string) => void) | undefined;
  /** By set key. */
  readonly #held = new Map<string, Held>();
  readonly #waiting = new Map<string, Waiting>();
  #closed = false;

  constructor(opts: RolloutGateOptions) {
    const lease = opts.slots.leaseDurationMs;
    this.slots = opts.slots;
    this.#log = opts.logger;
    this.#renewMs = opts.renewIntervalMs ?? Math.max(100, Math.floor(lease / 3));
    this.#retry = opts.retry ?? { baseMs: Math.max(100, Math.floor(lease / 12)), capMs: lease };
    this.#spreadMs = opts.firstAttemptSpreadMs ?? Math.floor(lease / 6);
    this.#now = opts.now ?? Date.now;
    this.#random = opts.random ?? Math.random;
    this.#onLost = opts.onLost;
    if (this.#renewMs >= lease) throw new Error(`rollout slots: the renew interval (${this.#renewMs} ms) must be shorter than the lease duration (${lease} ms)`);
  }

  /** Set keys whose slot this node holds now. */
  held(): string[] {
    return [...this.#held.keys()].sort();
  }

  /** When a waiting set is due for its next attempt (ms since epoch); undefined when none waits. */
  nextAttemptAt(): number | undefined {
    let min: number | undefined;
    for (const w of this.#waiting.values()) if (min === undefined || w.nextAttemptAt < min) min = w.nextAttemptAt;
    return min;
  }

  /**
   * Of `images` (each in one attempt of the caller's), those that may be
   * downloaded now. `limits`: by set key, the sets with a limit; a set not in
   * it has none. `needsSlot`: false for an image that downloads nothing (held
   * already, a name-only pull) or is not due now.
   */
  async admit<T extends GateImage>(images: readonly T[], limits: ReadonlyMap<string, RolloutSet>, needsSlot: (image: T) => boolean): Promise<Admission<T>> {
    const limitedOnly = (w: T) => needsSlot(w) && w.sets.length > 0 && w.sets.every((k) => limits.has(k));
    const gated = images.filter(limitedOnly);
    // Slots of sets that have nothing left to download go back at once.
    const wanted = new Set(gated.flatMap((w) => w.sets));
    for (const k of [...this.#held.keys()]) if (!wanted.has(k) || !limits.has(k)) await this.#release(k, 'nothing left to download');
    for (const k of [...this.#waiting.keys()]) if (!wanted.has(k)) this.#waiting.delete(k);

    // Sets this node may not take slots of (403): their downloads go without one.
    const unlimited = new Map<string, string>();
    const covered = (w: T) => w.sets.some((k) => this.#held.has(k) || unlimited.has(k));
    const waits = new Map<string, SlotWait>();
    // Sets with the most images waiting first: fewer slots cover more.
    const bySet = new Map<string, number>();
    for (const w of gated) if (!covered(w)) for (const k of w.sets) bySet.set(k, (bySet.get(k) ?? 0) + 1);
    const order = [...bySet.keys()].sort((a, b) => bySet.get(b)! - bySet.get(a)! || (a < b ? -1 : 1));
    for (const k of order) {
      // An image wanted by several sets counts under whichever set holds a slot.
      if (!gated.some((w) => w.sets.includes(k) && !covered(w))) continue;
      const set = limits.get(k)!;
      const r = await this.#attempt(k, set);
      if (r === 'held') continue;
      const w = this.#waiting.get(k)!;
      if (r === 'forbidden') unlimited.set(k, w.error ?? 'forbidden');
      else waits.set(k, { maxConcurrentNodes: set.maxConcurrentNodes, ...(w.error ? { error: w.error } : {}) });
    }
    for (const k of [...this.#waiting.keys()]) if (!waits.has(k) && !unlimited.has(k)) this.#waiting.delete(k);
    return { allowed: images.filter((w) => !limitedOnly(w) || covered(w)), waits, unenforced: unlimited };
  }

  /**
   * One attempt for set `k` if it is due. "held": this node holds a slot of
   * it now; "forbidden": the API refused this node slots (403: its
   * credentials may not write Leases there, as a node's own credentials may
   * not outside kube-node-lease), so its downloads go without one rather
   * than never, and the next attempt is paced as a wait's.
   */
  async #attempt(k: string, set: RolloutSet): Promise<'held' | 'waiting' | 'forbidden'> {
    const now = this.#now();
    let w = this.#waiting.get(k);
    if (!w) {
      w = { backoff: new Backoff(this.#retry, this.#random), nextAttemptAt: now + Math.floor(this.#random() * this.#spreadMs) };
      this.#waiting.set(k, w);
    }
    if (this.#closed || now < w.nextAttemptAt) return w.forbidden ? 'forbidden' : 'waiting';
    let slot: HeldSlot | null = null;
    const wasForbidden = w.forbidden;
    w.forbidden = false;
    try {
      slot = await this.slots.tryAcquire(set);
      w.error = undefined;
    } catch (e) {
      w.error = errText(e);
      w.forbidden = (e as { code?: unknown } | null)?.code === 403;
      if (w.forbidden && !wasForbidden) {
        this.#log.warn({ set: set.name, err: w.error }, 'this node may not hold rollout slots; downloading the set without one (grant it the Role of deploy/agent/rbac.yaml)');
      } else if (!w.forbidden) {
        this.#log.warn({ set: set.name, err: w.error }, 'rollout slots could not be read or taken; retrying');
      }
    }
    if (slot && !this.#closed) {
      this.#waiting.delete(k);
      this.#hold(k, set, slot);
      this.#log.info({ set: set.name, slot: slot.name, maxConcurrentNodes: set.maxConcurrentNodes }, 'took a rollout slot');
      return 'held';
    }
    if (slot) await this.slots.release(slot).catch(() => {});
    w.nextAttemptAt = this.#now() + w.backoff.fail();
    if (!w.error && !w.logged) {
      w.logged = true;
      this.#log.info({ set: set.name, maxConcurrentNodes: set.maxConcurrentNodes, retryInMs: w.nextAttemptAt - this.#now() }, 'every rollout slot of the set is held; waiting for one');
    }
    return w.forbidden ? 'forbidden' : 'waiting';
  }

  #hold(k: string, set: RolloutSet, slot: HeldSlot): void {
    const h: Held = { slot, set, timer: setInterval(() => void this.#renew(k, h), this.#renewMs) };
    h.timer.unref?.();
    this.#held.set(k, h);
  }

  async #renew(k: string, h: Held): Promise<void> {
    if (h.renewing || this.#held.get(k) !== h) return;
    h.renewing = (async () => {
      try {
        const ok = await this.slots.renew(h.slot);
        if (ok || this.#held.get(k) !== h) return;
        clearInterval(h.timer);
        this.#held.delete(k);
        this.#log.warn({ set: h.set.name, slot: h.slot.name }, 'lost the rollout slot (not renewed in time, another node took it); the pulls already queued finish, the next round waits for a slot');
        this.#onLost?.(k);
      } catch (e) {
        // Kept: nobody else can take it while the API is unreachable for
        // everyone, and a renewal that gets through in time keeps it.
        this.#log.warn({ set: h.set.name, slot: h.slot.name, err: errText(e) }, 'rollout slot not renewed; retrying');
      } finally {
        h.renewing = undefined;
      }
    })();
    await h.renewing;
  }

  async #release(k: string, why: string): Promise<void> {
    const h = this.#held.get(k);
    if (!h) return;
    clearInterval(h.timer);
    this.#held.delete(k);
    await h.renewing;
    try {
      await this.slots.release(h.slot);
      this.#log.info({ set: h.set.name, slot: h.slot.name, why }, 'freed the rollout slot');
    } catch (e) {
      this.#log.warn({ set: h.set.name, slot: h.slot.name, err: errText(e) }, 'rollout slot not freed; it expires on its own');
    }
  }

  /** The downloads of this round ended (done or failed): free every slot held. */
  async releaseAll(why = 'downloads ended'): Promise<void> {
    await Promise.all([...this.#held.keys()].map((k) => this.#release(k, why)));
  }

  /** Stop: free every slot (a stopping node must not keep others waiting for its lease to expire). */
  async close(): Promise<void> {
    this.#closed = true;
    this.#waiting.clear();
    await this.releaseAll('stopping');
  }
}
