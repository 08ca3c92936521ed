// The in-memory twin of LeaseRolloutSlots (./lease-slots.ts), of the
// first wave's records (./lease-records.ts) and of the granter
// (./granter.ts): many nodes (one MemoryRolloutSlots each) share one
// MemorySlotStore, as nodes share the Leases of the API server. Same names,
// same rules: a slot is held by one identity until it is released or its
// lease duration passes without a renewal; a node that holds a slot gets it
// back rather than a second one; a renewal of a slot another node has taken
// fails; a queue entry is watched by its node alone, and hears of grants
// and of its own removal after the change, never inside the call that made
// it (a watch event arrives after the write's answer). The store's clock is
// the test's. test/unit/rollout-slots.test.ts and
// test/integration/rollout-slots.test.ts run one contract against both
// implementations.
import type { LandedRecord, WaveRecords } from './landed.ts';
import { DEFAULT_ACCEPT_MS, planGrants, type QueueEntryView, type SlotView } from './grants.ts';
import {
  candidateSlots,
  landedName,
  poolOf,
  queueName,
  slotFree,
  slotName,
  DEFAULT_SLOT_LEASE_DURATION_MS,
  type HeldSlot,
  type QueueEvents,
  type QueueTicket,
  type RolloutSet,
  type RolloutSlots,
  type SlotPoolName,
} from './slots.ts';

interface StoredSlot {
  set: string;
  index: number;
  pool?: SlotPoolName;
  holder: string;
  renewedAt: number;
  durationMs: number;
  version: number;
}

interface StoredEntry {
  set: string;
  pool: SlotPoolName;
  node: string;
  queuedAt: number;
  /** The limit the node read in the set. */
  limit: number;
  granted?: string;
  version: number;
}

interface StoredRecord extends LandedRecord {
  set: string;
  index: number;
}

export class MemorySlotStore {
  readonly slots = new Map<string, StoredSlot>();
  readonly queue = new Map<string, StoredEntry>();
  readonly records = new Map<string, StoredRecord>();
  now: () => number;
  /** While set, every call fails with this message and code 403 (credentials that may not write the Leases). */
  forbidden: string | undefined;
  /** A granter serves the queues (its heartbeat is live). */
  granter = false;
  /** Writes made, by kind, and calls of any kind (a test's count of what a protocol costs). */
  readonly writes = { slots: 0, queue: 0, records: 0 };
  calls = 0;
  /** tryAcquire calls (a LIST of the slots on the API server). */
  polls = 0;
  #unavailable: string | undefined;
  #version = 0;
  /** Watches of one object, by name. */
  readonly #watchers = new Map<string, Set<() => void>>();
  /** Called after any change (the granter). */
  readonly #listeners = new Set<() => void>();

  constructor(opts: { now?: () => number } = {}) {
    this.now = opts.now ?? Date.now;
  }

  /** While set, every call fails with this message (an unreachable API), and no watch hears anything; cleared, every watch hears the present state. */
  get unavailable(): string | undefined {
    return this.#unavailable;
  }

  set unavailable(v: string | undefined) {
    const back = this.#unavailable !== undefined && v === undefined;
    this.#unavailable = v;
    if (!back) return;
    for (const name of this.#watchers.keys()) this.changed(name);
  }

  nextVersion(): number {
    return ++this.#version;
  }

  /** Slots of `set` (rollout pool) held by a live holder now: holder by slot name. */
  holders(set: string, pool: SlotPoolName = 'rollout'): Map<string, string> {
    const now = this.now();
    const out = new Map<string, string>();
    for (const [name, s] of this.slots) if (s.set === set && (s.pool ?? 'rollout') === pool && !slotFree(s.holder, s.renewedAt, s.durationMs, now)) out.set(name, s.holder);
    return out;
  }

  check(): void {
    this.calls++;
    if (this.#unavailable !== undefined) throw new Error(this.#unavailable);
    if (this.forbidden !== undefined) throw Object.assign(new Error(this.forbidden), { code: 403 });
  }

  /** Object `name` changed: its watchers and the listeners hear of it after the current call, as from a watch. */
  changed(name: string): void {
    queueMicrotask(() => {
      if (this.#unavailable !== undefined) return;
      for (const fn of this.#watchers.get(name) ?? []) fn();
      for (const fn of this.#listeners) fn();
    });
  }

  watch(name: string, fn: () => void): () => void {
    let set = this.#watchers.get(name);
    if (!set) this.#watchers.set(name, (set = new Set()));
    set.add(fn);
    queueMicrotask(() => {
      if (this.#unavailable === undefined && set.has(fn)) fn();
    });
    return () => {
      set.delete(fn);
      if (set.size === 0 && this.#watchers.get(name) === set) this.#watchers.delete(name);
    };
  }

  /** How many watches of single objects are open (a test's check that nothing is left watching). */
  get openWatches(): number {
    let n = 0;
    for (const s of this.#watchers.values()) n += s.size;
    return n;
  }

  listen(fn: () => void): () => void {
    this.#listeners.add(fn);
    return () => this.#listeners.delete(fn);
  }

  putSlot(name: string, s: StoredSlot): void {
    this.slots.set(name, s);
    this.writes.slots++;
    this.changed(name);
  }

  deleteSlot(name: string): void {
    if (!this.slots.delete(name)) return;
    this.writes.slots++;
    this.changed(name);
  }

  putEntry(name: string, e: StoredEntry): void {
    this.queue.set(name, e);
    this.writes.queue++;
    this.changed(name);
  }

  deleteEntry(name: string): void {
    if (!this.queue.delete(name)) return;
    this.writes.queue++;
    this.changed(name);
  }

  putRecord(name: string, r: StoredRecord): void {
    this.records.set(name, r);
    this.writes.records++;
    this.changed(name);
  }
}

export class MemoryRolloutSlots implements RolloutSlots {
  readonly identity: string;
  readonly leaseDurationMs: number;
  readonly #store: MemorySlotStore;
  readonly #random: () => number;
  readonly #queue: boolean;

  /** `queue: false`: a node of a version before the queue (it only polls). */
  constructor(store: MemorySlotStore, identity: string, opts: { leaseDurationMs?: number; random?: () => number; queue?: boolean } = {}) {
    this.#store = store;
    this.identity = identity;
    // Whole seconds, as a Lease stores them.
    this.leaseDurationMs = Math.max(1, Math.round((opts.leaseDurationMs ?? DEFAULT_SLOT_LEASE_DURATION_MS) / 1000)) * 1000;
    this.#random = opts.random ?? Math.random;
    this.#queue = opts.queue ?? true;
    if (!this.#queue) {
      this.join = undefined;
      this.accept = undefined;
    }
  }

  #held(set: RolloutSet, name: string, s: StoredSlot): HeldSlot {
    return { set: set.name, index: s.index, name, version: String(s.version), renewedAt: s.renewedAt };
  }

  async tryAcquire(set: RolloutSet): Promise<HeldSlot | null> {
    const store = this.#store;
    store.check();
    store.polls++;
    const now = store.now();
    const pool = poolOf(set).name;
    const ofSet = [...store.slots.entries()].filter(([, s]) => s.set === set.name && (s.pool ?? 'rollout') === pool);
    const mine = ofSet.find(([, s]) => s.holder === this.identity);
    if (mine) {
      const [name, s] = mine;
      store.putSlot(name, { ...s, renewedAt: now, durationMs: this.leaseDurationMs, version: store.nextVersion() });
      return this.#held(set, name, store.slots.get(name)!);
    }
    const existing = new Map<number, { free: boolean }>();
    for (const [, s] of ofSet) existing.set(s.index, { free: slotFree(s.holder, s.renewedAt, s.durationMs, now) });
    const pick = candidateSlots(set.maxConcurrentNodes, existing, this.#random, 1)[0];
    if (!pick) return null;
    const name = slotName(set.name, pick.index, pool);
    store.putSlot(name, { set: set.name, index: pick.index, pool, holder: this.identity, renewedAt: now, durationMs: this.leaseDurationMs, version: store.nextVersion() });
    return this.#held(set, name, store.slots.get(name)!);
  }

  async renew(slot: HeldSlot): Promise<boolean> {
    const store = this.#store;
    store.check();
    const s = store.slots.get(slot.name);
    if (!s || s.holder !== this.identity) return false;
    const now = store.now();
    store.putSlot(slot.name, { ...s, renewedAt: now, durationMs: this.leaseDurationMs, version: store.nextVersion() });
    slot.version = String(store.slots.get(slot.name)!.version);
    slot.renewedAt = now;
    return true;
  }

  async release(slot: HeldSlot): Promise<void> {
    const store = this.#store;
    store.check();
    const s = store.slots.get(slot.name);
    if (s && s.holder === this.identity) store.deleteSlot(slot.name);
  }

  async granterAlive(): Promise<boolean> {
    this.#store.check();
    return this.#store.granter;
  }

  join?: RolloutSlots['join'] = async (set: RolloutSet, events: QueueEvents): Promise<QueueTicket> => {
    const store = this.#store;
    store.check();
    const pool = poolOf(set).name;
    const name = queueName(set.name, this.identity, pool);
    if (store.queue.get(name)?.node !== this.identity) {
      store.putEntry(name, { set: set.name, pool, node: this.identity, queuedAt: store.now(), limit: set.maxConcurrentNodes, version: store.nextVersion() });
    }
    let lastGranted: string | undefined;
    let present = false;
    let left = false;
    const unwatch = store.watch(name, () => {
      if (left) return;
      const e = store.queue.get(name);
      if (!e) {
        if (present) events.removed();
        present = false;
        return;
      }
      present = true;
      if (e.granted !== undefined && e.granted !== lastGranted) {
        lastGranted = e.granted;
        events.granted(e.granted);
      }
    });
    return {
      name,
      leave: async () => {
        if (left) return;
        left = true;
        unwatch();
        if (store.unavailable !== undefined) return; // left behind: the granter drops it
        if (store.queue.get(name)?.node === this.identity) store.deleteEntry(name);
      },
    };
  };

  accept?: RolloutSlots['accept'] = async (set: RolloutSet, name: string): Promise<HeldSlot | null> => {
    const store = this.#store;
    store.check();
    const s = store.slots.get(name);
    if (!s || s.set !== set.name || s.holder !== this.identity) return null;
    const now = store.now();
    store.putSlot(name, { ...s, renewedAt: now, durationMs: this.leaseDurationMs, version: store.nextVersion() });
    return this.#held(set, name, store.slots.get(name)!);
  };
}

/** The first wave's records in the store (./lease-records.ts is the real one). */
export class MemoryWaveRecords implements WaveRecords {
  readonly identity: string;
  readonly #store: MemorySlotStore;

  constructor(store: MemorySlotStore, identity: string) {
    this.#store = store;
    this.identity = identity;
  }

  watch(set: RolloutSet, index: number, onRecord: (r: LandedRecord | null) => void): { close(): Promise<void> } {
    const name = landedName(set.name, index);
    const store = this.#store;
    let last: StoredRecord | undefined | null = null;
    const unwatch = store.watch(name, () => {
      const r = store.records.get(name);
      if (r === last) return;
      last = r;
      onRecord(r ? { holder: r.holder, images: r.images, landed: r.landed, version: r.version } : null);
    });
    return { close: async () => unwatch() };
  }

  async write(set: RolloutSet, index: number, update: (current: LandedRecord | null) => LandedRecord): Promise<void> {
    const store = this.#store;
    store.check();
    const name = landedName(set.name, index);
    const cur = store.records.get(name) ?? null;
    const next = update(cur);
    if (cur && cur.holder === this.identity && cur.images === next.images && cur.landed === next.landed) return;
    store.putRecord(name, { ...next, holder: this.identity, set: set.name, index, version: String(store.nextVersion()) });
  }
}

export interface MemoryGranterOptions {
  /** The limit of a set's pool as its object says (undefined: a static set, take the nodes' word). */
  limit?: (set: string, pool: SlotPoolName) => number | undefined;
  /** How long a granted slot waits to be taken; default the granter's (DEFAULT_ACCEPT_MS). */
  acceptMs?: number;
}

/** The granter (./granter.ts) on the store: the same plan (./grants.ts), applied at once after every change. */
export class MemoryGranter {
  readonly #store: MemorySlotStore;
  readonly #opts: MemoryGranterOptions;
  readonly #unlisten: () => void;
  #scheduled = false;
  #stopped = false;
  #timer: NodeJS.Timeout | undefined;
  /** Grants made, and entries dropped because their grant lapsed. */
  readonly counts = { grants: 0, lapsed: 0 };

  constructor(store: MemorySlotStore, opts: MemoryGranterOptions = {}) {
    this.#store = store;
    this.#opts = opts;
    this.#unlisten = store.listen(() => this.#schedule());
    store.granter = true;
    this.#schedule();
  }

  #schedule(): void {
    if (this.#scheduled || this.#stopped) return;
    this.#scheduled = true;
    queueMicrotask(() => {
      this.#scheduled = false;
      this.pass();
    });
  }

  /** One pass over every queue now (a test calls it after moving the clock). */
  pass(): void {
    const store = this.#store;
    if (this.#stopped || store.unavailable !== undefined) return;
    const now = store.now();
    const acceptMs = this.#opts.acceptMs ?? DEFAULT_ACCEPT_MS;
    const groups = new Map<string, { set: string; pool: SlotPoolName; entries: [string, StoredEntry][] }>();
    for (const [name, e] of store.queue) {
      const k = `${e.pool}/${e.set}`;
      let g = groups.get(k);
      if (!g) groups.set(k, (g = { set: e.set, pool: e.pool, entries: [] }));
      g.entries.push([name, e]);
    }
    let next: number | undefined;
    for (const g of groups.values()) {
      const max = this.#opts.limit?.(g.set, g.pool) ?? Math.min(...g.entries.map(([, e]) => e.limit));
      const slotsOf = (pool: SlotPoolName) =>
        [...store.slots].filter(([, s]) => s.set === g.set && (s.pool ?? 'rollout') === pool).map(([name, s]): SlotView => ({ name, index: s.index, holder: s.holder, renewedAt: s.renewedAt, durationMs: s.durationMs, version: String(s.version) }));
      const preferred = g.pool === 'rollout' ? new Set(slotsOf('first-wave').filter((s) => !slotFree(s.holder, s.renewedAt, s.durationMs, now)).map((s) => s.holder!)) : undefined;
      const queue = g.entries.map(([name, e]): QueueEntryView => ({ name, node: e.node, queuedAt: e.queuedAt, ...(e.granted ? { granted: e.granted } : {}), version: String(e.version) }));
      const plan = planGrants({ max, slots: slotsOf(g.pool), queue, ...(preferred ? { preferred } : {}) }, now);
      for (const l of plan.lapsed) {
        store.deleteEntry(l.name);
        this.counts.lapsed++;
      }
      for (const grant of plan.grants) {
        const name = slotName(g.set, grant.index, g.pool);
        store.putSlot(name, { set: g.set, index: grant.index, pool: g.pool, holder: grant.node, renewedAt: now, durationMs: acceptMs, version: store.nextVersion() });
        const e = store.queue.get(grant.entry.name)!;
        store.putEntry(grant.entry.name, { ...e, granted: name, version: store.nextVersion() });
        this.counts.grants++;
      }
      if (plan.nextCheckAt !== undefined && (next === undefined || plan.nextCheckAt < next)) next = plan.nextCheckAt;
    }
    clearTimeout(this.#timer);
    this.#timer = undefined;
    if (next !== undefined && !this.#stopped) {
      this.#timer = setTimeout(() => this.pass(), Math.max(0, next - now));
      this.#timer.unref?.();
    }
  }

  stop(): void {
    this.#stopped = true;
    this.#store.granter = false;
    this.#unlisten();
    clearTimeout(this.#timer);
  }
}
