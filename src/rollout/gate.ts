// The slot protocol one node follows (slots: ./slots.ts), independent of
// what downloads: the agent's reconcile (src/agent/rollout-hook.ts) and
// simulated nodes in tests and benchmarks drive it the same way.
//
// - Before downloading, admit(): an image may be downloaded when one of
//   the sets that want it has no limit or holds a slot. For every limited
//   set with images nothing else lets through, the node asks for one of its
//   slots (./claims.ts: one attempt when due, paced, and a place in the
//   set's queue); it never waits there, and never waits for one set while
//   holding another's slot (each set's slot is taken, renewed and freed on
//   its own), so no node can block another in a cycle.
// - A slot handed over from the queue arrives between two admit()s:
//   onChange tells the caller to admit again now.
// - When the downloads end (done or failed), releaseAll() frees every slot;
//   a failed image takes a slot again on its next retry. A slot of a set
//   that no longer has anything to download is freed on the next admit().
//
// Why a waiting node does not watch the slot Leases: at 5000 nodes, a watch
// per node on the slot Leases would send every renewal of every holder to
// every waiting node (maxConcurrentNodes / 20 s renewals x 5000 watchers)
// and wake all of them at once whenever a slot frees, a herd of conflicting
// writes for one slot. A waiting node instead sends one LIST from the watch
// cache per attempt (one per 30 to 60 s once it has waited a while: about
// 110/s from 5000 waiting nodes, against the 500 node-Lease writes/s the
// kubelets of 5000 nodes make anyway) and writes only when a slot looks
// free; and it watches one Lease, its own queue entry, by name, which no
// renewal touches (./grants.ts).
import { SlotClaims, type SlotClaimsOptions } from './claims.ts';
import type { RolloutSet, RolloutSlots } from './slots.ts';

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
  /**
   * Whether an image of `allowed` may still start now: false once every
   * slot that let it through was lost (a renewal found it another node's).
   * A pull that has not reached the runtime yet then waits for the next
   * admit(), as a node without the slot would; one under way finishes (a
   * runtime's pull cannot be cancelled halfway without losing its layers).
   */
  stillAllowed: (image: T) => boolean;
}

/**
 * Pacing, renewal and the callbacks: ./claims.ts. onChange: a slot was
 * handed over from the queue, admit again now; without it the node does
 * not queue and only polls.
 */
export type RolloutGateOptions = SlotClaimsOptions;

export class RolloutGate {
  readonly slots: RolloutSlots;
  readonly #claims: SlotClaims;

  constructor(opts: RolloutGateOptions) {
    this.slots = opts.slots;
    this.#claims = new SlotClaims(opts);
  }

  /** Set keys whose slot this node holds now. */
  held(): string[] {
    return this.#claims.held();
  }

  /** Set keys waiting in their set's queue now. */
  queued(): string[] {
    return this.#claims.waitingKeys().filter((k) => this.#claims.queued(k)).sort();
  }

  /** When a waiting set is due for its next attempt (ms since epoch); undefined when none waits. */
  nextAttemptAt(): number | undefined {
    return this.#claims.nextAttemptAt();
  }

  /**
   * Of `images` (each in one attempt of the caller's), those that may be
   * downloaded now. `limits`: by set key, the sets with a limit; a set not in
   * it has none. `needsSlot`: false for an image that downloads nothing (held
   * already, a name-only pull) or is not due now.
   */
  async admit<T extends GateImage>(images: readonly T[], limits: ReadonlyMap<string, RolloutSet>, needsSlot: (image: T) => boolean): Promise<Admission<T>> {
    const claims = this.#claims;
    const limitedOnly = (w: T) => needsSlot(w) && w.sets.length > 0 && w.sets.every((k) => limits.has(k));
    const gated = images.filter(limitedOnly);
    // Slots of sets that have nothing left to download go back at once.
    const wanted = new Set(gated.flatMap((w) => w.sets));
    for (const k of claims.held()) if (!wanted.has(k) || !limits.has(k)) await claims.release(k, 'nothing left to download');
    for (const k of claims.waitingKeys()) if (!wanted.has(k)) await claims.drop(k, 'nothing left to download');

    // Sets this node may not take slots of (403): their downloads go without one.
    const unlimited = new Map<string, string>();
    const covered = (w: T) => w.sets.some((k) => claims.holds(k) || unlimited.has(k));
    const waits = new Map<string, SlotWait>();
    // Sets with the most images waiting first: fewer slots cover more.
    const bySet = new Map<string, number>();
    for (const w of gated) if (!covered(w)) for (const k of w.sets) bySet.set(k, (bySet.get(k) ?? 0) + 1);
    const order = [...bySet.keys()].sort((a, b) => bySet.get(b)! - bySet.get(a)! || (a < b ? -1 : 1));
    for (const k of order) {
      // An image wanted by several sets counts under whichever set holds a slot.
      if (!gated.some((w) => w.sets.includes(k) && !covered(w))) continue;
      const set = limits.get(k)!;
      const state = await claims.want(k, set);
      if (state === 'held') continue;
      const w = claims.waitOf(k) ?? {};
      if (state === 'forbidden') unlimited.set(k, w.error ?? 'forbidden');
      else waits.set(k, { maxConcurrentNodes: set.maxConcurrentNodes, ...(w.error ? { error: w.error } : {}) });
    }
    // A set that needs no slot any more (an image now covered by another set's slot) stops waiting for one.
    for (const k of claims.waitingKeys()) if (!waits.has(k) && !unlimited.has(k) && !claims.holds(k)) await claims.drop(k, 'covered by another set');
    return { allowed: images.filter((w) => !limitedOnly(w) || covered(w)), waits, unenforced: unlimited, stillAllowed: (w) => !limitedOnly(w) || covered(w) };
  }

  /** The downloads of this round ended (done or failed): free every slot held. */
  async releaseAll(why = 'downloads ended'): Promise<void> {
    await this.#claims.releaseAll(why);
  }

  /** Stop: free every slot, leave every queue (a stopping node must not keep others waiting for its lease to expire). */
  async close(): Promise<void> {
    await this.#claims.close();
  }
}
