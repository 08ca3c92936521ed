// The in-memory twin of LeaseRolloutSlots (./lease-slots.ts): many nodes
// (one MemoryRolloutSlots each) share one MemorySlotStore, as nodes share the
// Leases of the API server. Same names, same rules: a slot is held by one
// identity until it is released or its lease duration passes without a
// renewal; a node that holds a slot gets it back rather than a second one;
// a renewal of a slot another node has taken fails. The store's clock is
// the test's. test/unit/rollout-slots.test.ts runs one contract against
// both implementations.
import { candidateSlots, slotFree, slotName, DEFAULT_SLOT_LEASE_DURATION_MS, type HeldSlot, type RolloutSet, type RolloutSlots } from './slots.ts';

interface StoredSlot {
  set: string;
  index: number;
  holder: string;
  renewedAt: number;
  durationMs: number;
  version: number;
}

export class MemorySlotStore {
  readonly slots = new Map<string, StoredSlot>();
  now: () => number;
  /** While set, every call fails with this message (an unreachable API). */
  unavailable: string | undefined;
  /** While set, every call fails with this message and code 403 (credentials that may not write the Leases). */
  forbidden: string | undefined;
  #version = 0;

  constructor(opts: { now?: () => number } = {}) {
    this.now = opts.now ?? Date.now;
  }

  nextVersion(): number {
    return ++this.#version;
  }

  /** Slots of `set` held by a live holder now: holder by slot name. */
  holders(set: string): Map<string, string> {
    const now = this.now();
    const out = new Map<string, string>();
    for (const [name, s] of this.slots) if (s.set === set && !slotFree(s.holder, s.renewedAt, s.durationMs, now)) out.set(name, s.holder);
    return out;
  }

  check(): void {
    if (this.unavailable !== undefined) throw new Error(this.unavailable);
    if (this.forbidden !== undefined) throw Object.assign(new Error(this.forbidden), { code: 403 });
  }
}

export class MemoryRolloutSlots implements RolloutSlots {
  readonly identity: string;
  readonly leaseDurationMs: number;
  readonly #store: MemorySlotStore;
  readonly #random: () => number;

  constructor(store: MemorySlotStore, identity: string, opts: { leaseDurationMs?: number; random?: () => number } = {}) {
    this.#store = store;
    this.identity = identity;
    // Whole seconds, as a Lease stores them.
    this.leaseDurationMs = Math.max(1, Math.round((opts.leaseDurationMs ?? DEFAULT_SLOT_LEASE_DURATION_MS) / 1000)) * 1000;
    this.#random = opts.random ?? Math.random;
  }

  async tryAcquire(set: RolloutSet): Promise<HeldSlot | null> {
    const store = this.#store;
    store.check();
    const now = store.now();
    const mine = [...store.slots.entries()].find(([, s]) => s.set === set.name && s.holder === this.identity);
    if (mine) {
      const [name, s] = mine;
      Object.assign(s, { renewedAt: now, durationMs: this.leaseDurationMs, version: store.nextVersion() });
      return { set: set.name, index: s.index, name, version: String(s.version), renewedAt: now };
    }
    const existing = new Map<number, { free: boolean }>();
    for (const s of store.slots.values()) if (s.set === set.name) existing.set(s.index, { free: slotFree(s.holder, s.renewedAt, s.durationMs, now) });
    const pick = candidateSlots(set.maxConcurrentNodes, existing, this.#random, 1)[0];
    if (!pick) return null;
    const name = slotName(set.name, pick.index);
    const version = store.nextVersion();
    store.slots.set(name, { set: set.name, index: pick.index, holder: this.identity, renewedAt: now, durationMs: this.leaseDurationMs, version });
    return { set: set.name, index: pick.index, name, version: String(version), renewedAt: now };
  }

  async renew(slot: HeldSlot): Promise<boolean> {
    const store = this.#store;
    store.check();
    const s = store.slots.get(slot.name);
    if (!s || s.holder !== this.identity) return false;
    const now = store.now();
    Object.assign(s, { renewedAt: now, version: store.nextVersion() });
    slot.version = String(s.version);
    slot.renewedAt = now;
    return true;
  }

  async release(slot: HeldSlot): Promise<void> {
    const store = this.#store;
    store.check();
    const s = store.slots.get(slot.name);
    if (s && s.holder === this.identity) store.slots.delete(slot.name);
  }
}
