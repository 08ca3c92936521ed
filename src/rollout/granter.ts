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
import { API_VERSION, KIND } from '../api/types.ts';
import { Backoff } from '../util/backoff.ts';
import type { Logger } from '../util/log.ts';
import { DEFAULT_ACCEPT_MS, planGrants, type QueueEntryView, type SlotView } from './grants.ts';
import { microTime, timeMs, type LeaseObject } from './lease-slots.ts';
import {
  GRANT_ANNOTATION,
  GRANTER_LEASE,
  POOLS,
  QUEUE_LIMIT_ANNOTATION,
  QUEUE_SET_ANNOTATION,
  SLOT_MANAGED_BY,
  slotName,
  type SlotPoolName,
} from './slots.ts';

/** How long a granted slot waits to be taken before the grant lapses. */
/** Changes within this window are planned together. */
const BATCH_MS = 20;
/** The heartbeat is renewed this often, and holds this long. */
const HEARTBEAT_EVERY_MS = 10_000;
const HEARTBEAT_SECONDS = 30;
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
  onPass?: (r: { grants: number; lapsed: number; conflicts: number; errors: number }) => void;
}

const LEASES = (ns: string) => `/apis/coordination.k8s.io/v1/namespaces/${encodeURIComponent(ns)}/leases`;
const MANAGED_BY = Object.entries(SLOT_MANAGED_BY).map(([k, v]) => `${k}=${v}`).join(',');

function codeOf(e: unknown): number | undefined {
  const c = (e as { code?: unknown } | null)?.code;
  return typeof c === 'number' ? c : undefined;
}

function errText(e: unknown): string {
  return (e instanceof Error ? e.message : String(e)).split('\n')[0]!.slice(0, 300);
}

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

interface Written {
  lease: LeaseObject;
  /** The version it replaced ('' for a create). */
  base: string;
  /** Forgotten after the accept window, whatever the cache shows. */
  until: number;
}

/** A grant this replica wrote: when the write was answered, to the version written. */
interface Granted {
  node: string;
  version: string;
  at: number;
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
  /** Slots this replica wrote that the cache has not shown yet, by name. */
  readonly #written = new Map<string, Written>();
  /** Grants this replica wrote, by slot name, until the slot changes. */
  readonly #granted = new Map<string, Granted>();
  #leading = false;
  #stopped = true;
  #timer: NodeJS.Timeout | undefined;
  #timerAt = Infinity;
  #running: Promise<void> | undefined;
  #again = false;
  #notBefore = 0;
  /** The last pass wrote what it meant to (the heartbeat is renewed only then). */
  #healthy = true;
  #heartbeat: NodeJS.Timeout | undefined;
  /** When the heartbeat was last written (0: not since this replica leads). */
  #beatAt = 0;

  constructor(opts: RolloutGranterOptions) {
    this.#o = opts;
    this.#now = opts.now ?? Date.now;
    this.#cache = new ListWatchCache<LeaseObject>({
      http: opts.http,
      path: LEASES(opts.namespace),
      what: 'rollout leases',
      log: opts.log,
      labelSelector: MANAGED_BY,
      ...opts.watch,
    });
    const changed = (l: LeaseObject) => {
      if (kindOf(l)) this.kick();
    };
    this.#cache.on('add', changed).on('update', changed).on('delete', changed).on('synced', () => {
      this.kick();
      // The first beat waits for the cache: a granter that cannot watch the Leases serves nobody.
      if (this.#beatAt === 0) void this.#beat();
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
    const was = this.#leading;
    this.#leading = false;
    clearInterval(this.#heartbeat);
    clearTimeout(this.#timer);
    await this.#cache.stop();
    await this.#running;
    if (was) await this.#endHeartbeat();
  }

  /** Grant only while this replica leads. */
  setLeading(leading: boolean): void {
    const was = this.#leading;
    this.#leading = leading;
    if (leading) {
      this.kick();
      if (!this.#heartbeat) {
        this.#heartbeat = setInterval(() => void this.#beat(), HEARTBEAT_EVERY_MS);
        this.#heartbeat.unref?.();
        void this.#beat();
      }
    } else {
      clearTimeout(this.#timer);
      clearInterval(this.#heartbeat);
      this.#heartbeat = undefined;
      this.#timer = undefined;
      this.#timerAt = Infinity;
      this.#written.clear();
      this.#granted.clear();
      this.#beatAt = 0;
      if (was) void this.#endHeartbeat();
    }
  }

  /** Renew the heartbeat, if the grants go through. A failure waits for the next beat. */
  async #beat(): Promise<void> {
    if (!this.#leading || !this.#healthy || !this.#cache.synced) return;
    this.#beatAt = this.#now();
    const { http, namespace, fieldManager, identity } = this.#o;
    const path = `${LEASES(namespace)}/${GRANTER_LEASE}`;
    const now = microTime(this.#now());
    try {
      let cur: LeaseObject | undefined;
      try {
        cur = await http.json<LeaseObject>('GET', path);
      } catch (e) {
        if (codeOf(e) !== 404) throw e;
      }
      const spec = { holderIdentity: identity, leaseDurationSeconds: HEARTBEAT_SECONDS, renewTime: now };
      if (cur) await http.json('PUT', path, { fieldManager }, { ...cur, spec: { ...cur.spec, ...spec } });
      else await http.json('POST', LEASES(namespace), { fieldManager }, { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: GRANTER_LEASE, namespace }, spec: { ...spec, acquireTime: now } });
    } catch (e) {
      this.#o.log.debug({ err: errText(e) }, 'the granter\'s heartbeat was not renewed; the next beat tries again');
    }
  }

  /** No longer granting: the heartbeat goes now, so the queued nodes poll again at once. */
  async #endHeartbeat(): Promise<void> {
    const { http, namespace, identity } = this.#o;
    const path = `${LEASES(namespace)}/${GRANTER_LEASE}`;
    try {
      const cur = await http.json<LeaseObject>('GET', path);
      if (cur.spec?.holderIdentity !== identity) return;
      await http.json('DELETE', path, {}, { preconditions: { uid: cur.metadata.uid, resourceVersion: cur.metadata.resourceVersion } });
    } catch {
      // It lapses on its own.
    }
  }

  /** Something changed (a Lease, a set's limit): plan again soon. */
  kick(delayMs = BATCH_MS): void {
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
          this.kick();
        }
      });
    }, Math.max(0, at - this.#now()));
    this.#timer.unref?.();
  }

  /** A slot as the pass sees it: the cache's, or this replica's own write when the cache has not shown it yet. */
  #view(l: LeaseObject): LeaseObject {
    const w = this.#written.get(l.metadata.name);
    if (!w) return l;
    const rv = l.metadata.resourceVersion ?? '';
    if (rv === w.lease.metadata.resourceVersion || rv !== w.base || this.#now() > w.until) {
      this.#written.delete(l.metadata.name);
      return l;
    }
    return w.lease;
  }

  async #pass(): Promise<void> {
    if (!this.#leading || !this.#cache.synced) return;
    const now = this.#now();
    const groups = new Map<string, { pool: SlotPoolName; set: string; slots: LeaseObject[]; queue: LeaseObject[]; seats: LeaseObject[] }>();
    const group = (pool: SlotPoolName, set: string) => {
      const k = `${pool}\u0000${set}`;
      let g = groups.get(k);
      if (!g) groups.set(k, (g = { pool, set, slots: [], queue: [], seats: [] }));
      return g;
    };
    const names = new Set<string>();
    for (const raw of this.#cache.list()) {
      names.add(raw.metadata.name);
      const l = this.#view(raw);
      const k = kindOf(l);
      if (!k) continue;
      if (k.kind === 'queue') group(k.pool, k.set).queue.push(l);
      else {
        group(k.pool, k.set).slots.push(l);
        if (k.pool === 'first-wave') group('rollout', k.set).seats.push(l);
      }
    }
    // Own creates the cache has not shown yet.
    for (const [name, w] of this.#written) {
      if (names.has(name)) continue;
      if (now > w.until) {
        this.#written.delete(name);
        continue;
      }
      const k = kindOf(w.lease);
      if (k?.kind === 'slot') group(k.pool, k.set).slots.push(w.lease);
    }
    let next = Infinity;
    const counts = { grants: 0, lapsed: 0, conflicts: 0, errors: 0 };
    const tasks: (() => Promise<void>)[] = [];
    for (const g of groups.values()) {
      if (g.queue.length === 0) continue;
      const api = this.#o.setOf(g.set);
      const queueSetName = g.queue.map((e) => e.metadata.annotations?.[QUEUE_SET_ANNOTATION]).find((n) => n);
      const setName = api?.name ?? queueSetName;
      const declared = g.queue.map((e) => Number(e.metadata.annotations?.[QUEUE_LIMIT_ANNOTATION])).filter((n) => Number.isSafeInteger(n) && n >= 1);
      const max = api ? api.limits[g.pool] : declared.length ? Math.min(...declared) : undefined;
      if (!setName || max === undefined) continue;
      const slots = g.slots.map((l): SlotView => {
        const s = l.spec ?? {};
        let renewedAt = timeMs(s.renewTime ?? s.acquireTime);
        const mine = this.#granted.get(l.metadata.name);
        if (mine && (mine.node !== s.holderIdentity || mine.version !== l.metadata.resourceVersion)) this.#granted.delete(l.metadata.name);
        else if (mine) renewedAt = Math.max(renewedAt ?? 0, mine.at);
        return {
          name: l.metadata.name,
          index: kindOf(l)!.index!,
          ...(s.holderIdentity ? { holder: s.holderIdentity } : {}),
          ...(renewedAt !== undefined ? { renewedAt } : {}),
          durationMs: (s.leaseDurationSeconds ?? 0) * 1000,
          version: l.metadata.resourceVersion ?? '',
        };
      });
      const queue = g.queue.map((l): QueueEntryView => ({
        name: l.metadata.name,
        node: l.spec?.holderIdentity ?? '',
        queuedAt: timeMs(l.metadata.creationTimestamp) ?? timeMs(l.spec?.acquireTime) ?? Infinity,
        tiebreak: timeMs(l.spec?.acquireTime) ?? 0,
        ...(l.metadata.annotations?.[GRANT_ANNOTATION] ? { granted: l.metadata.annotations[GRANT_ANNOTATION] } : {}),
        version: l.metadata.resourceVersion ?? '',
        ...(l.metadata.uid ? { uid: l.metadata.uid } : {}),
      })).filter((e) => e.node !== '');
      const preferred = new Set(
        g.seats.filter((l) => {
          const s = l.spec ?? {};
          const at = timeMs(s.renewTime ?? s.acquireTime);
          return s.holderIdentity && at !== undefined && now <= at + (s.leaseDurationSeconds ?? 0) * 1000;
        }).map((l) => l.spec!.holderIdentity!),
      );
      const plan = planGrants({ max, slots, queue, preferred }, now);
      for (const e of plan.lapsed) {
        tasks.push(() => this.#dropEntry(e, counts));
        this.#o.log.info({ set: setName, pool: g.pool, node: e.node, slot: e.granted }, 'a granted slot was not taken in time; the node leaves the queue');
      }
      for (const grant of plan.grants) {
        const lease = g.slots.find((l) => l.metadata.name === grant.slot?.name);
        tasks.push(() => this.#grant(g.pool, g.set, setName, api?.uid, grant.index, grant.node, grant.entry, lease, counts));
      }
      if (plan.nextCheckAt !== undefined) next = Math.min(next, plan.nextCheckAt);
    }
    await bounded(tasks, PARALLEL_WRITES);
    this.#healthy = counts.errors === 0;
    if (counts.errors > 0) this.#notBefore = this.#now() + this.#backoff.fail();
    else this.#backoff.reset();
    this.#o.onPass?.(counts);
    if (counts.errors > 0) this.kick();
    else if (Number.isFinite(next)) this.kick(Math.max(BATCH_MS, next - this.#now()));
  }

  async #grant(pool: SlotPoolName, label: string, setName: string, uid: string | undefined, index: number, node: string, entry: QueueEntryView, existing: LeaseObject | undefined, counts: { grants: number; conflicts: number; errors: number }): Promise<void> {
    const { http, namespace, fieldManager } = this.#o;
    const name = slotName(setName, index, pool);
    const now = microTime(this.#now());
    const seconds = Math.max(1, Math.round((this.#o.acceptMs ?? DEFAULT_ACCEPT_MS) / 1000));
    const spec = { holderIdentity: node, leaseDurationSeconds: seconds, acquireTime: now, renewTime: now };
    let written: LeaseObject;
    try {
      if (existing) {
        const body: LeaseObject = { ...existing, spec: { ...existing.spec, ...spec, leaseTransitions: (existing.spec?.leaseTransitions ?? 0) + 1 } };
        written = await http.json<LeaseObject>('PUT', `${LEASES(namespace)}/${encodeURIComponent(name)}`, { fieldManager }, body);
      } else {
        const body: LeaseObject = {
          apiVersion: 'coordination.k8s.io/v1',
          kind: 'Lease',
          metadata: {
            name,
            namespace,
            labels: { [POOLS[pool].slotLabel]: label, ...SLOT_MANAGED_BY },
            ...(uid ? { ownerReferences: [{ apiVersion: API_VERSION, kind: KIND, name: setName, uid }] } : {}),
          },
          spec: { ...spec, leaseTransitions: 0 },
        };
        written = await http.json<LeaseObject>('POST', LEASES(namespace), { fieldManager }, body);
      }
    } catch (e) {
      // Taken (or gone) since the cache saw it: the event that follows brings the next pass.
      if (codeOf(e) === 409 || codeOf(e) === 404) counts.conflicts++;
      else {
        counts.errors++;
        this.#o.log.warn({ set: setName, slot: name, node, err: errText(e) }, 'could not grant a slot; retrying');
      }
      return;
    }
    this.#written.set(name, { lease: written, base: existing?.metadata.resourceVersion ?? '', until: this.#now() + seconds * 1000 });
    this.#granted.set(name, { node, version: written.metadata.resourceVersion ?? '', at: this.#now() });
    try {
      await http.json('PATCH', `${LEASES(namespace)}/${encodeURIComponent(entry.name)}`, { fieldManager }, { metadata: { annotations: { [GRANT_ANNOTATION]: name } } }, { contentType: 'application/merge-patch+json' });
      counts.grants++;
      this.#o.log.debug({ set: setName, slot: name, node }, 'granted a slot');
    } catch (e) {
      // The node left the queue meanwhile (404): the slot goes back now rather than after the accept window.
      if (codeOf(e) !== 404) {
        counts.errors++;
        this.#o.log.warn({ set: setName, slot: name, node, err: errText(e) }, 'granted a slot but could not tell the node; the grant lapses');
        return;
      }
      counts.conflicts++;
      this.#written.delete(name);
      await http.json('DELETE', `${LEASES(namespace)}/${encodeURIComponent(name)}`, {}, { preconditions: { uid: written.metadata.uid, resourceVersion: written.metadata.resourceVersion } }).catch(() => {});
    }
  }

  async #dropEntry(e: QueueEntryView, counts: { lapsed: number; conflicts: number; errors: number }): Promise<void> {
    const { http, namespace } = this.#o;
    try {
      await http.json('DELETE', `${LEASES(namespace)}/${encodeURIComponent(e.name)}`, {}, { preconditions: { ...(e.uid ? { uid: e.uid } : {}), ...(e.version ? { resourceVersion: e.version } : {}) } });
      counts.lapsed++;
    } catch (err) {
      if (codeOf(err) === 409 || codeOf(err) === 404) counts.conflicts++;
      else {
        counts.errors++;
        this.#o.log.warn({ entry: e.name, err: errText(err) }, 'could not drop a queue entry whose grant lapsed; retrying');
      }
    }
  }
}
