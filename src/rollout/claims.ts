// How one node takes, waits for, renews and frees slots (./slots.ts), one
// set at a time, for the rollout gate (./gate.ts) and the first wave's seats
// (./first-wave.ts):
// - want(key, set): hold one of the set's slots if it can, else wait. A set
//   seen for the first time is first tried after a random delay of up to a
//   sixth of the lease duration, so thousands of nodes that learn of a new
//   set together do not ask together; then its attempts are paced by a
//   capped exponential backoff with jitter (by default from a twelfth of the
//   lease duration up to the whole of it). Nothing here ever waits for a
//   slot, and each set's slot is taken, renewed and freed on its own, so no
//   node can block another in a cycle.
// - while it waits, the node is also in the set's queue (./grants.ts), when
//   the slots have one and the caller listens for grants (onChange): a grant
//   is taken at once (accept) and the caller told to look again; the polls
//   go on meanwhile, so a queue nobody serves costs only its entry. The
//   queue is joined at once, not after the first attempt's delay: a free
//   slot is granted to the first node that queues. While queued, an attempt
//   first reads the granter's heartbeat (one object): with a granter alive
//   it skips the LIST (which reads every Lease of the namespace, the queue's
//   thousands of entries included), but for one attempt in
//   QUEUED_LIST_EVERY, a safety net for a granter that is alive and yet does
//   not serve this node.
// - a held slot is renewed every third of the lease duration; a renewal
//   that finds the slot another node's reports it lost (onLost).
// Every call is one step; retries are paced, never a loop.
import type { Logger } from 'pino';
import { Backoff, type BackoffPolicy } from '../util/backoff.ts';
import { poolOf, type HeldSlot, type QueueTicket, type RolloutSet, type RolloutSlots } from './slots.ts';

export interface SlotClaimsOptions {
  slots: RolloutSlots;
  logger: Logger;
  /** Renew a held slot this often; default a third of the lease duration. */
  renewIntervalMs?: number;
  /** Pace of a waiting set's attempts; default from a twelfth of the lease duration up to all of it. */
  retry?: BackoffPolicy;
  /** A set seen for the first time is tried after a random delay of up to this; default a sixth of the lease duration. */
  firstAttemptSpreadMs?: number;
  /** Called when a held slot turns out to be another node's (this node could not renew it in time). */
  onLost?: (key: string) => void;
  /**
   * Called when a slot was granted between calls (the caller should admit
   * again now). Without it the node does not queue: a grant nobody acts on
   * would hold the slot idle until the caller's next look.
   */
  onChange?: (why: string) => void;
  now?: () => number;
  random?: () => number;
}

/** Why a set waits. */
export interface ClaimWait {
  /** The last attempt failed (the API could not be reached, ...); absent when every slot was held. */
  error?: string;
  /** The last attempt was refused with 403: this node may not hold the set's slots. */
  forbidden?: boolean;
}

export type ClaimState = 'held' | 'waiting' | 'forbidden';

interface Held {
  slot: HeldSlot;
  set: RolloutSet;
  timer: NodeJS.Timeout;
  renewing?: Promise<void>;
}

interface Waiting extends ClaimWait {
  set: RolloutSet;
  backoff: Backoff;
  nextAttemptAt: number;
  /** The wait was logged (once per wait). */
  logged?: boolean;
  ticket?: QueueTicket;
  /** Not before this (ms since epoch) does the node queue again (after its entry went away, or a join failed). */
  queueAt: number;
  queueBackoff: Backoff;
  /** The queue cannot be used for this set (403 on the entry or its watch): polling only. */
  queueOff?: boolean;
  /** Attempts skipped because a granter serves the queue, since the last LIST. */
  skipped: number;
}

/** A queued node with a live granter still lists the slots at one attempt in this many. */
export const QUEUED_LIST_EVERY = 10;

function errText(e: unknown): string {
  return (e instanceof Error ? e.message : String(e)).split('\n')[0]!.slice(0, 300);
}

const codeOf = (e: unknown) => (e as { code?: unknown } | null)?.code;

export class SlotClaims {
  readonly slots: RolloutSlots;
  readonly #log: Logger;
  readonly #renewMs: number;
  readonly #retry: BackoffPolicy;
  readonly #spreadMs: number;
  readonly #now: () => number;
  readonly #random: () => number;
  readonly #onLost: ((key: string) => void) | undefined;
  readonly #onChange: ((why: string) => void) | undefined;
  /** By key. */
  readonly #held = new Map<string, Held>();
  readonly #waiting = new Map<string, Waiting>();
  /** Per key, the step running now: steps of one key run one after another (a grant arrives between a caller's steps). */
  readonly #serial = new Map<string, Promise<unknown>>();
  #closed = false;

  constructor(opts: SlotClaimsOptions) {
    const lease = opts.slots.leaseDurationMs;
    this.slots = opts.slots;
    this.#log = opts.logger;
    this.#renewMs = opts.renewIntervalMs ?? Math.max(100, Math.floor(lease / 3));
    this.#retry = opts.retry ?? { baseMs: Math.max(100, Math.floor(lease / 12)), capMs: lease };
    this.#spreadMs = opts.firstAttemptSpreadMs ?? Math.floor(lease / 6);
    this.#now = opts.now ?? Date.now;
    this.#random = opts.random ?? Math.random;
    this.#onLost = opts.onLost;
    this.#onChange = opts.onChange;
    if (this.#renewMs >= lease) throw new Error(`rollout slots: the renew interval (${this.#renewMs} ms) must be shorter than the lease duration (${lease} ms)`);
  }

  /** Keys whose slot this node holds now. */
  held(): string[] {
    return [...this.#held.keys()].sort();
  }

  holds(key: string): boolean {
    return this.#held.has(key);
  }

  /** The slot held under `key`, if any. */
  heldSlot(key: string): HeldSlot | undefined {
    return this.#held.get(key)?.slot;
  }

  /** Keys waiting for a slot. */
  waitingKeys(): string[] {
    return [...this.#waiting.keys()];
  }

  /** Why `key` waits; undefined when it does not. */
  waitOf(key: string): ClaimWait | undefined {
    const w = this.#waiting.get(key);
    return w && { ...(w.error ? { error: w.error } : {}), ...(w.forbidden ? { forbidden: true } : {}) };
  }

  /** Whether `key` waits in its set's queue now. */
  queued(key: string): boolean {
    return !!this.#waiting.get(key)?.ticket;
  }

  /** When a waiting key is due for its next attempt (ms since epoch); undefined when none waits. */
  nextAttemptAt(): number | undefined {
    let min: number | undefined;
    for (const w of this.#waiting.values()) if (min === undefined || w.nextAttemptAt < min) min = w.nextAttemptAt;
    return min;
  }

  #step<T>(key: string, f: () => Promise<T>): Promise<T> {
    const prev = this.#serial.get(key) ?? Promise.resolve();
    const run = prev.then(f, f);
    const tail = run.catch(() => {});
    this.#serial.set(key, tail);
    void tail.then(() => {
      if (this.#serial.get(key) === tail) this.#serial.delete(key);
    });
    return run;
  }

  /**
   * Hold a slot of `set` under `key` if this node can: "held" when it does
   * now, "forbidden" when the API refused this node slots (403: its
   * credentials may not write Leases there, as a node's own credentials may
   * not outside kube-node-lease), else "waiting". One attempt, if one is
   * due.
   */
  want(key: string, set: RolloutSet): Promise<ClaimState> {
    return this.#step(key, async () => {
      if (this.#held.has(key)) return 'held';
      const now = this.#now();
      let w = this.#waiting.get(key);
      if (!w) {
        w = {
          set,
          backoff: new Backoff(this.#retry, this.#random),
          nextAttemptAt: now + Math.floor(this.#random() * this.#spreadMs),
          queueAt: now,
          skipped: 0,
          queueBackoff: new Backoff({ baseMs: 1_000, capMs: this.slots.leaseDurationMs }, this.#random),
        };
        this.#waiting.set(key, w);
      }
      w.set = set;
      await this.#queue(key, w);
      if (this.#closed || this.#held.has(key) || now < w.nextAttemptAt) return this.#held.has(key) ? 'held' : w.forbidden ? 'forbidden' : 'waiting';
      return this.#attempt(key, w);
    });
  }

  async #attempt(key: string, w: Waiting): Promise<ClaimState> {
    const set = w.set;
    const what = poolOf(set).what;
    if (w.ticket && w.skipped + 1 < QUEUED_LIST_EVERY && (await this.#granterAlive())) {
      // Queued, and a granter serves the queue: it hands the slot over; no LIST this time.
      w.skipped++;
      w.nextAttemptAt = this.#now() + w.backoff.fail();
      return 'waiting';
    }
    w.skipped = 0;
    let slot: HeldSlot | null = null;
    const wasForbidden = w.forbidden;
    w.forbidden = false;
    try {
      slot = await this.slots.tryAcquire(set);
      w.error = undefined;
    } catch (e) {
      w.error = errText(e);
      w.forbidden = codeOf(e) === 403;
      if (w.forbidden && !wasForbidden) {
        this.#log.warn({ set: set.name, err: w.error }, `this node may not hold ${what}s; going on without one (grant it the Role of deploy/agent/rbac.yaml)`);
      } else if (!w.forbidden) {
        this.#log.warn({ set: set.name, err: w.error }, `${what}s could not be read or taken; retrying`);
      }
    }
    if (slot && !this.#closed) {
      await this.#take(key, w, slot);
      this.#log.info({ set: set.name, slot: slot.name, max: set.maxConcurrentNodes }, `took a ${what}`);
      return 'held';
    }
    if (slot) await this.slots.release(slot).catch(() => {});
    w.nextAttemptAt = this.#now() + w.backoff.fail();
    if (!w.error && !w.logged) {
      w.logged = true;
      this.#log.info({ set: set.name, max: set.maxConcurrentNodes, retryInMs: w.nextAttemptAt - this.#now(), queued: !!w.ticket }, `every ${what} of the set is held; waiting for one`);
    }
    return w.forbidden ? 'forbidden' : 'waiting';
  }

  /** Whether the granter's heartbeat is live; false when it cannot be told (polling then goes on as ever). */
  async #granterAlive(): Promise<boolean> {
    try {
      return (await this.slots.granterAlive?.()) ?? false;
    } catch {
      return false;
    }
  }

  /** Join the set's queue when there is one, someone acts on grants, and it is time. */
  async #queue(key: string, w: Waiting): Promise<void> {
    const join = this.slots.join;
    if (!join || !this.#onChange || w.ticket || w.queueOff || this.#closed || this.#now() < w.queueAt) return;
    const set = w.set;
    // Events are steps of the key too, run after the one joining.
    const later = (f: () => Promise<void>) => void this.#step(key, f).catch((e: unknown) => this.#log.warn({ set: set.name, err: errText(e) }, 'queue event not handled'));
    let ticket: QueueTicket | undefined;
    try {
      ticket = await join.call(this.slots, set, {
        granted: (slotName) => later(() => this.#granted(key, slotName)),
        removed: () => later(() => this.#removed(key, ticket)),
        failed: (err) => later(() => this.#queueFailed(key, err)),
      });
      if (this.#waiting.get(key) !== w || this.#closed) {
        await ticket.leave();
        return;
      }
      w.ticket = ticket;
    } catch (e) {
      if (codeOf(e) === 403) {
        w.queueOff = true;
        this.#log.warn({ set: set.name, err: errText(e) }, `this node may not queue for ${poolOf(set).what}s; polling for one instead`);
      } else {
        w.queueAt = this.#now() + w.queueBackoff.fail();
        this.#log.warn({ set: set.name, err: errText(e), retryInMs: w.queueAt - this.#now() }, `could not queue for a ${poolOf(set).what}; polling meanwhile`);
      }
    }
  }

  /** The granter put `slotName` in this node's name. */
  async #granted(key: string, slotName: string): Promise<void> {
    const w = this.#waiting.get(key);
    const held = this.#held.get(key);
    if (held?.slot.name === slotName) return;
    if (this.#closed || held || !w) {
      // Not wanted (any more), or a slot already held: given back at once
      // rather than left to lapse, so the granter moves on now.
      const set = held?.set ?? w?.set;
      if (set) await this.#giveBack(set, slotName);
      return;
    }
    let slot: HeldSlot | null = null;
    try {
      slot = (await this.slots.accept?.(w.set, slotName)) ?? null;
    } catch (e) {
      // The next poll finds the slot in this node's name and renews it (./lease-slots.ts tryAcquire).
      this.#log.warn({ set: w.set.name, slot: slotName, err: errText(e) }, `could not take the ${poolOf(w.set).what} granted; the next attempt takes it if it is still this node's`);
      return;
    }
    if (!slot) return;
    if (this.#closed || this.#waiting.get(key) !== w) {
      await this.slots.release(slot).catch(() => {});
      return;
    }
    await this.#take(key, w, slot);
    this.#log.info({ set: w.set.name, slot: slot.name, max: w.set.maxConcurrentNodes }, `took a ${poolOf(w.set).what} handed over from the queue`);
    this.#onChange?.(`${poolOf(w.set).what} granted`);
  }

  async #giveBack(set: RolloutSet, slotName: string): Promise<void> {
    try {
      const slot = await this.slots.accept?.(set, slotName);
      if (slot) await this.slots.release(slot);
    } catch {
      // It lapses on its own, after the accept window.
    }
  }

  async #removed(key: string, ticket: QueueTicket | undefined): Promise<void> {
    const w = this.#waiting.get(key);
    if (!w || !ticket || w.ticket !== ticket) return;
    // Dropped from the queue (a grant lapsed): back at the end of it at the next step, paced.
    w.ticket = undefined;
    // Its watch of the entry ends too: left running, it would watch a name nobody writes again,
    // one more watch on the API server per lapsed grant, for as long as the agent runs.
    await ticket.leave();
    w.queueAt = this.#now() + w.queueBackoff.fail();
    this.#log.info({ set: w.set.name, rejoinInMs: w.queueAt - this.#now() }, `left the ${poolOf(w.set).what} queue (a grant was not taken in time); queueing again`);
  }

  async #queueFailed(key: string, err: Error & { code?: number }): Promise<void> {
    const w = this.#waiting.get(key);
    if (!w || err.code !== 403) return; // the watch retries on its own, paced
    w.queueOff = true;
    const ticket = w.ticket;
    w.ticket = undefined;
    this.#log.warn({ set: w.set.name, err: errText(err) }, `this node may not watch its ${poolOf(w.set).what} queue entry; polling for one instead`);
    await ticket?.leave();
  }

  async #take(key: string, w: Waiting, slot: HeldSlot): Promise<void> {
    this.#waiting.delete(key);
    const ticket = w.ticket;
    w.ticket = undefined;
    this.#hold(key, w.set, slot);
    await ticket?.leave();
  }

  #hold(key: string, set: RolloutSet, slot: HeldSlot): void {
    const h: Held = { slot, set, timer: setInterval(() => void this.#renew(key, h), this.#renewMs) };
    h.timer.unref?.();
    this.#held.set(key, h);
  }

  async #renew(key: string, h: Held): Promise<void> {
    if (h.renewing || this.#held.get(key) !== h) return;
    const what = poolOf(h.set).what;
    h.renewing = (async () => {
      try {
        const ok = await this.slots.renew(h.slot);
        if (ok || this.#held.get(key) !== h) return;
        clearInterval(h.timer);
        this.#held.delete(key);
        this.#log.warn({ set: h.set.name, slot: h.slot.name }, `lost the ${what} (not renewed in time, another node took it)`);
        this.#onLost?.(key);
      } catch (e) {
        // Kept: nobody else can take it while the API is unreachable for
        // everyone, and a renewal that gets through in time keeps it.
        this.#log.warn({ set: h.set.name, slot: h.slot.name, err: errText(e) }, `${what} not renewed; retrying`);
      } finally {
        h.renewing = undefined;
      }
    })();
    await h.renewing;
  }

  /** Free the slot held under `key`, if any. */
  release(key: string, why: string): Promise<void> {
    return this.#step(key, () => this.#release(key, why));
  }

  async #release(key: string, why: string): Promise<void> {
    const h = this.#held.get(key);
    if (!h) return;
    const what = poolOf(h.set).what;
    clearInterval(h.timer);
    this.#held.delete(key);
    await h.renewing;
    try {
      await this.slots.release(h.slot);
      this.#log.info({ set: h.set.name, slot: h.slot.name, why }, `freed the ${what}`);
    } catch (e) {
      this.#log.warn({ set: h.set.name, slot: h.slot.name, err: errText(e) }, `${what} not freed; it expires on its own`);
    }
  }

  /** `key` is no longer wanted: its slot freed, its wait and queue entry dropped. */
  drop(key: string, why: string): Promise<void> {
    return this.#step(key, async () => {
      await this.#release(key, why);
      const w = this.#waiting.get(key);
      if (!w) return;
      this.#waiting.delete(key);
      await w.ticket?.leave();
    });
  }

  /** Free every slot held. */
  async releaseAll(why: string): Promise<void> {
    await Promise.all([...this.#held.keys()].map((k) => this.release(k, why)));
  }

  /** Stop: free every slot and leave every queue (a stopping node must not keep others waiting for its lease to expire). */
  async close(why = 'stopping'): Promise<void> {
    this.#closed = true;
    const keys = new Set([...this.#held.keys(), ...this.#waiting.keys()]);
    await Promise.all([...keys].map((k) => this.drop(k, why)));
  }
}
