// The granter: the controller's side of the hand-over (./grants.ts). One
// list+watch of the Leases the agents write in their namespace (label
// app.kubernetes.io/managed-by=pinset-agent: slots, seats, queue entries,
// records), and while this replica leads, a pass over every set with a
// queue after each change (batched over a few milliseconds) and at the next
// slot's expiry: planGrants() decides, and the pass writes each grant (the
// slot in the waiting node's name, with the accept window as its lease, then
// the node's entry marked with the slot's name) and deletes entries whose
// grant lapsed. Every write is conditional (create, or the version read),
// so a node that polled its way into a slot meanwhile wins and the grant is
// skipped (409); nothing is retried in a loop: the watch event that follows
// a change brings the next pass, and a pass that failed for another reason
// waits a backoff (1 s doubling to 30 s) before the next. A grant's accept
// window is counted from the answer to its write, not from the time in the
// Lease: an API server slow to answer does not shorten it.
//
// While it leads and its last pass wrote what it meant to, the granter
// renews its heartbeat, the Lease GRANTER_LEASE (every 10 s, for 30 s): a
// queued node that reads it live skips most of its polls (./claims.ts).
// The heartbeat goes when the replica stops leading, or lapses when its
// writes fail, and the nodes poll as ever again.
//
// A set's limits come from its object (the controller's cache of sets);
// a set the API does not have (a static set, on the nodes only) is granted
// by the smallest limit its queued nodes read in their copies.
import type { KubeHttp } from '../api/kube-http.ts';
import { ListWatchCache, type ListWatchOptions } from '../api/list-watch.ts';
import { Backoff } from '../util/backoff.ts';
import type { Logger } from '../util/log.ts';
import { DEFAULT_ACCEPT_MS, planGrants, type QueueEntryView, type SlotView } from './grants.ts';
import { dropEntry, writeGrant, type GrantCounts as Counts } from './grant-writes.ts';
import { GranterHeartbeat } from './granter-heartbeat.ts';
import { OwnWrites } from './own-writes.ts';
import { timeMs, type LeaseObject } from './lease-slots.ts';
import {
  GRANT_ANNOTATION,
  POOLS,
  QUEUE_LIMIT_ANNOTATION,
  QUEUE_SET_ANNOTATION,
  SLOT_MANAGED_BY,
  slotFree,
  slotName,
  type SlotPoolName,
} from './slots.ts';

/** Changes within this window are planned together. */
const BATCH_MS = 20;
/** Writes of one pass in flight at once (grants of different slots do not depend on each other). */
const PARALLEL_WRITES = 16;

/** A set as its object says: its name, uid and each pool's limit (absent: none). */
export interface GrantedSet {
  name: string;
  uid?: string;
  limits: Partial<Record<SlotPoolName, number>>;
}

export interface RolloutGranterOptions {
  http: KubeHttp;
  /** The agents' namespace (where their Leases are). */
  namespace: string;
  log: Logger;
  /** The set whose Leases carry this label value (src/rollout/slots.ts setLabelValue), from the API; undefined when the API has none. */
  setOf: (labelValue: string) => GrantedSet | undefined;
  /** Field manager of every write. */
  fieldManager: string;
  /** This replica's name, in the heartbeat. */
  identity: string;
  acceptMs?: number;
  watch?: Partial<Pick<ListWatchOptions, 'minWatchTimeoutMs' | 'backoff'>>;
  now?: () => number;
  /** Called after each pass with what it did. */
  onPass?: (r: Counts) => void;
}

const LEASES = (ns: string) => `/apis/coordination.k8s.io/v1/namespaces/${encodeURIComponent(ns)}/leases`;
const MANAGED_BY = Object.entries(SLOT_MANAGED_BY).map(([k, v]) => `${k}=${v}`).join(',');

/** What a Lease is to the granter, from its labels and name. */
type Kind = { kind: 'slot' | 'queue'; pool: SlotPoolName; set: string; index?: number } | undefined;

function kindOf(l: LeaseObject): Kind {
  const labels = l.metadata.labels ?? {};
  for (const pool of Object.values(POOLS)) {
    const v = labels[pool.slotLabel];
    if (v !== undefined) {
      const name = l.metadata.name;
      if (!name.endsWith(pool.slotTail)) return undefined;
      const m = /-(0|[1-9][0-9]*)$/.exec(name.slice(0, name.length - pool.slotTail.length));
      return m ? { kind: 'slot', pool: pool.name, set: v, index: Number(m[1]) } : undefined;
    }
    const q = labels[pool.queueLabel];
    if (q !== undefined) return { kind: 'queue', pool: pool.name, set: q };
  }
  return undefined;
}

/** One set's pool: its slot Leases and its queue entries, kept from the watch's events. */
interface Group {
  pool: SlotPoolName;
  /** The set's label value. */
  set: string;
  slots: Map<string, LeaseObject>;
  queue: Map<string, LeaseObject>;
  /** Entries marked with a grant (whose grant may lapse). */
  pending: number;
}

/** What a queue entry says, parsed once per version of it. */
const entryViews = new WeakMap<LeaseObject, QueueEntryView>();

function entryView(l: LeaseObject): QueueEntryView {
  let v = entryViews.get(l);
  if (!v) {
    const granted = l.metadata.annotations?.[GRANT_ANNOTATION];
    v = {
      name: l.metadata.name,
      node: l.spec?.holderIdentity ?? '',
      queuedAt: timeMs(l.metadata.creationTimestamp) ?? timeMs(l.spec?.acquireTime) ?? Infinity,
      tiebreak: timeMs(l.spec?.acquireTime) ?? 0,
      ...(granted ? { granted } : {}),
      version: l.metadata.resourceVersion ?? '',
      ...(l.metadata.uid ? { uid: l.metadata.uid } : {}),
    };
    entryViews.set(l, v);
  }
  return v;
}

/** Run `tasks` with at most `n` at a time. */
async function bounded(tasks: (() => Promise<void>)[], n: number): Promise<void> {
  let next = 0;
  const worker = async () => {
    while (next < tasks.length) await tasks[next++]!();
  };
  await Promise.all(Array.from({ length: Math.min(n, tasks.length) }, worker));
}

export class RolloutGranter {
  readonly #o: RolloutGranterOptions;
  readonly #cache: ListWatchCache<LeaseObject>;
  readonly #now: () => number;
  readonly #backoff = new Backoff({ baseMs: 1_000, capMs: 30_000 });
  readonly #heartbeat: GranterHeartbeat;
  /** By `<pool>\0<set label>`. */
  readonly #groups = new Map<string, Group>();
  /** Which group each Lease is in. */
  readonly #where = new Map<string, string>();
  /** Groups to plan at the next pass. */
  readonly #dirty = new Set<string>();
  /** Per group, when its next live slot expires. */
  readonly #expiries = new Map<string, number>();
  /** This replica's grants against the watch: which is newer (./own-writes.ts). */
  readonly #own = new OwnWrites();
  /** Grants this replica wrote, by slot name: the version written and when the write was answered (the accept window counts from there). */
  readonly #grantedAt = new Map<string, { version: string; at: number }>();
  #leading = false;
  #stopped = true;
  #timer: NodeJS.Timeout | undefined;
  #timerAt = Infinity;
  #running: Promise<void> | undefined;
  #again = false;
  #notBefore = 0;
  /** The last pass wrote what it meant to (the heartbeat is renewed only then). */
  #healthy = true;

  constructor(opts: RolloutGranterOptions) {
    this.#o = opts;
    this.#now = opts.now ?? Date.now;
    this.#heartbeat = new GranterHeartbeat({ http: opts.http, namespace: opts.namespace, fieldManager: opts.fieldManager, identity: opts.identity, log: opts.log, now: this.#now });
    this.#cache = new ListWatchCache<LeaseObject>({
      http: opts.http,
      path: LEASES(opts.namespace),
      what: 'rollout leases',
      log: opts.log,
      labelSelector: MANAGED_BY,
      ...opts.watch,
    });
    this.#cache
      .on('add', (l) => this.#seen(l))
      .on('update', (l) => this.#seen(l))
      .on('delete', (l) => this.#gone(l))
      .on('synced', () => {
        // A relist: the index again from the cache, every group planned.
        this.#groups.clear();
        this.#where.clear();
        for (const l of this.#cache.list()) this.#seen(l);
        for (const k of this.#groups.keys()) this.#dirty.add(k);
        this.kick();
        // The first beat waits for the cache: a granter that cannot watch the Leases serves nobody.
        if (this.#leading) this.#heartbeat.start(() => this.#leading && this.#healthy);
      });
  }

  get synced(): boolean {
    return this.#cache.synced;
  }

  start(): void {
    if (!this.#stopped) return;
    this.#stopped = false;
    this.#cache.start();
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    this.#leading = false;
    clearTimeout(this.#timer);
    await this.#cache.stop();
    await this.#running;
    await this.#heartbeat.stop();
  }

  /** Grant only while this replica leads. */
  setLeading(leading: boolean): void {
    this.#leading = leading;
    if (leading) {
      for (const k of this.#groups.keys()) this.#dirty.add(k);
      this.kick();
      if (this.#cache.synced) this.#heartbeat.start(() => this.#leading && this.#healthy);
      return;
    }
    clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#timerAt = Infinity;
    this.#own.clear();
    this.#grantedAt.clear();
    void this.#heartbeat.stop();
  }

  /** A set's limit changed (or a set came or went): plan every group soon. */
  kick(delayMs = BATCH_MS): void {
    if (this.#stopped || !this.#leading) return;
    if (delayMs === BATCH_MS && this.#dirty.size === 0) for (const k of this.#groups.keys()) this.#dirty.add(k);
    this.#arm(delayMs);
  }

  #arm(delayMs: number): void {
    if (this.#stopped || !this.#leading) return;
    if (this.#running) {
      this.#again = true;
      return;
    }
    const at = Math.max(this.#now() + delayMs, this.#notBefore);
    if (this.#timer && this.#timerAt <= at) return;
    clearTimeout(this.#timer);
    this.#timerAt = at;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      this.#timerAt = Infinity;
      this.#running = this.#pass().finally(() => {
        this.#running = undefined;
        if (this.#again) {
          this.#again = false;
          this.#arm(BATCH_MS);
        }
      });
    }, Math.max(0, at - this.#now()));
    this.#timer.unref?.();
  }

  #group(pool: SlotPoolName, set: string): [string, Group] {
    const key = `${pool}\u0000${set}`;
    let g = this.#groups.get(key);
    if (!g) this.#groups.set(key, (g = { pool, set, slots: new Map(), queue: new Map(), pending: 0 }));
    return [key, g];
  }

  #touch(key: string, g: Group): void {
    this.#dirty.add(key);
    // A set's first-wave seats decide whom its rollout slots go to first.
    if (g.pool === 'first-wave') this.#dirty.add(this.#group('rollout', g.set)[0]);
    if (this.#leading) this.#arm(BATCH_MS);
  }

  /** A Lease as the watch shows it (unless this replica's own write is newer). */
  #seen(l: LeaseObject): void {
    if (this.#own.seen(l)) this.#place(l);
  }

  #place(l: LeaseObject): void {
    const name = l.metadata.name;
    this.#remove(name);
    const k = kindOf(l);
    if (!k) return;
    const [key, g] = this.#group(k.pool, k.set);
    if (k.kind === 'queue') {
      g.queue.set(name, l);
      if (l.metadata.annotations?.[GRANT_ANNOTATION]) g.pending++;
    } else g.slots.set(name, l);
    this.#where.set(name, key);
    this.#touch(key, g);
  }

  #remove(name: string): void {
    const key = this.#where.get(name);
    if (key === undefined) return;
    this.#where.delete(name);
    const g = this.#groups.get(key);
    if (!g) return;
    const entry = g.queue.get(name);
    if (entry?.metadata.annotations?.[GRANT_ANNOTATION]) g.pending--;
    g.queue.delete(name);
    g.slots.delete(name);
    this.#touch(key, g);
    if (g.queue.size === 0 && g.slots.size === 0) this.#groups.delete(key);
  }

  #gone(l: LeaseObject): void {
    const name = l.metadata.name;
    this.#own.gone(l);
    this.#grantedAt.delete(name);
    this.#remove(name);
  }

  #slotView(l: LeaseObject): SlotView {
    const s = l.spec ?? {};
    let renewedAt = timeMs(s.renewTime ?? s.acquireTime);
    // A grant of this replica's, not taken yet: its window counts from the answer to the write.
    const g = this.#grantedAt.get(l.metadata.name);
    if (g && g.version === l.metadata.resourceVersion) renewedAt = Math.max(renewedAt ?? 0, g.at);
    else if (g) this.#grantedAt.delete(l.metadata.name);
    return {
      name: l.metadata.name,
      index: kindOf(l)!.index!,
      ...(s.holderIdentity ? { holder: s.holderIdentity } : {}),
      ...(renewedAt !== undefined ? { renewedAt } : {}),
      durationMs: (s.leaseDurationSeconds ?? 0) * 1000,
      version: l.metadata.resourceVersion ?? '',
    };
  }

  async #pass(): Promise<void> {
    if (!this.#leading || !this.#cache.synced) return;
    const now = this.#now();
    for (const [k, at] of this.#expiries) if (at <= now) (this.#dirty.add(k), this.#expiries.delete(k));
    const dirty = [...this.#dirty];
    this.#dirty.clear();
    const counts: Counts = { grants: 0, lapsed: 0, conflicts: 0, errors: 0 };
    const tasks: (() => Promise<void>)[] = [];
    for (const key of dirty) {
      const g = this.#groups.get(key);
      if (!g || g.queue.size === 0) {
        this.#expiries.delete(key);
        continue;
      }
      tasks.push(...this.#plan(key, g, now, counts));
    }
    await bounded(tasks, PARALLEL_WRITES);
    this.#healthy = counts.errors === 0;
    if (counts.errors > 0) {
      this.#notBefore = this.#now() + this.#backoff.fail();
      for (const k of dirty) this.#dirty.add(k);
    } else this.#backoff.reset();
    this.#o.onPass?.(counts);
    const next = Math.min(...this.#expiries.values());
    if (this.#dirty.size > 0) this.#arm(BATCH_MS);
    else if (Number.isFinite(next)) this.#arm(Math.max(BATCH_MS, next - this.#now()));
  }

  /** The writes one group needs now (none when every slot is live and no grant is pending: the queue is not even read). */
  #plan(key: string, g: Group, now: number, counts: Counts): (() => Promise<void>)[] {
    const api = this.#o.setOf(g.set);
    let setName = api?.name;
    let max = api?.limits[g.pool];
    if (!api) {
      // A static set: its name and limit as its queued nodes read them (the smallest limit).
      for (const e of g.queue.values()) {
        setName ??= e.metadata.annotations?.[QUEUE_SET_ANNOTATION];
        const n = Number(e.metadata.annotations?.[QUEUE_LIMIT_ANNOTATION]);
        if (Number.isSafeInteger(n) && n >= 1) max = max === undefined ? n : Math.min(max, n);
      }
    }
    if (!setName || max === undefined) return [];
    const slots = [...g.slots.values()].map((l) => this.#slotView(l));
    const live = slots.filter((s) => !slotFree(s.holder, s.renewedAt, s.durationMs, now));
    const expiry = Math.min(...live.map((s) => s.renewedAt! + s.durationMs! + 1));
    if (Number.isFinite(expiry)) this.#expiries.set(key, expiry);
    else this.#expiries.delete(key);
    if (live.length >= max && g.pending === 0) return [];
    const [seatsKey] = this.#group('first-wave', g.set);
    const seats = g.pool === 'rollout' ? this.#groups.get(seatsKey) : undefined;
    const preferred = new Set<string>();
    for (const l of seats?.slots.values() ?? []) {
      const s = this.#slotView(l);
      if (!slotFree(s.holder, s.renewedAt, s.durationMs, now)) preferred.add(s.holder!);
    }
    const queue = [...g.queue.values()].map(entryView).filter((e) => e.node !== '');
    const plan = planGrants({ max, slots, queue, preferred }, now);
    const tasks: (() => Promise<void>)[] = [];
    const w = { ...this.#o, acceptMs: this.#o.acceptMs ?? DEFAULT_ACCEPT_MS };
    for (const e of plan.lapsed) {
      tasks.push(() => dropEntry(w, e, counts));
      this.#o.log.info({ set: setName, pool: g.pool, node: e.node, slot: e.granted }, 'a granted slot was not taken in time; the node leaves the queue');
    }
    for (const grant of plan.grants) {
      const lease = grant.slot ? g.slots.get(grant.slot.name) : undefined;
      const name = slotName(setName, grant.index, g.pool);
      tasks.push(async () => {
        this.#own.begin(name);
        let written: LeaseObject | undefined;
        try {
          written = await writeGrant(w, { pool: g.pool, label: g.set, setName: setName!, uid: api?.uid, index: grant.index, node: grant.node, entry: grant.entry, existing: lease }, counts);
        } finally {
          // Planned on from now, even before the watch shows it, unless the watch has shown it, or what followed, already.
          const answer = this.#own.answered(name, written, lease?.metadata.resourceVersion ?? '');
          if (written && answer !== 'gone') this.#grantedAt.set(name, { version: written.metadata.resourceVersion ?? '', at: this.#now() });
          if (written && answer === 'place') this.#place(written);
        }
      });
    }
    return tasks;
  }
}
