// Rollout slots held in coordination.k8s.io/v1 Leases (see ./slots.ts).
//
// API cost per node, by design for thousands of nodes:
// - an attempt is one LIST of the set's slots by label selector with
//   resourceVersion=0 (the API server answers from its watch cache, no
//   etcd read), and a write only when a slot looks free: a create of a slot
//   that does not exist yet, or an update of an expired one carrying the
//   resourceVersion just read. Two nodes racing for one slot: the API
//   server accepts one and answers 409 to the other (AlreadyExists,
//   Conflict), who tries another free slot or waits for its next attempt.
// - a held slot is renewed by an update with its resourceVersion, a few
//   times per lease duration; it is released by a delete with the
//   resourceVersion and uid as preconditions, so a node never deletes a
//   slot another node has taken since.
// - a Lease names its set as owner (ownerReferences), so the garbage
//   collector removes the slots of a deleted set.
// - the queue (./grants.ts): a node that waits creates its entry, a Lease
//   in its own name, and watches that one Lease by name (LeaseApi.watch:
//   a list and a watch with fieldSelector metadata.name, bookmarks, 410
//   relists); a grant is taken with a GET of the slot and a renewal; the
//   entry is deleted when the node leaves the queue.
// Every write carries the caller's field manager (the agent's: `pinset-agent`).
import { API_VERSION, KIND } from '../api/types.ts';
import {
  candidateSlots,
  poolOf,
  queueName,
  setLabelValue,
  slotFree,
  slotIndex,
  slotName,
  slotSelector,
  DEFAULT_SLOT_LEASE_DURATION_MS,
  QUEUE_LIMIT_ANNOTATION,
  QUEUE_SET_ANNOTATION,
  GRANT_ANNOTATION,
  GRANTER_LEASE,
  SLOT_MANAGED_BY,
  type HeldSlot,
  type QueueEvents,
  type QueueTicket,
  type RolloutSet,
  type RolloutSlots,
} from './slots.ts';

/** A Lease as the API serves it (JSON); times are metav1.MicroTime strings. */
export interface LeaseObject {
  apiVersion?: string;
  kind?: string;
  metadata: {
    name: string;
    namespace?: string;
    uid?: string;
    resourceVersion?: string;
    creationTimestamp?: string;
    labels?: Record<string, string>;
    annotations?: Record<string, string>;
    ownerReferences?: { apiVersion: string; kind: string; name: string; uid: string }[];
  };
  spec?: {
    holderIdentity?: string;
    leaseDurationSeconds?: number;
    acquireTime?: string;
    renewTime?: string;
    leaseTransitions?: number;
  };
}

/** A failed API call, with its HTTP status (409 Conflict/AlreadyExists, 404 NotFound, ...). */
export class LeaseApiError extends Error {
  readonly code: number;
  constructor(code: number, message: string) {
    super(message);
    this.code = code;
  }
}

/**
 * The Lease calls slots need. One implementation is on @kubernetes/client-node
 * (./lease-api.ts); a benchmark of many simulated nodes can share one.
 * Failures throw LeaseApiError (with the HTTP status) or any other error.
 */
export interface LeaseApi {
  /** LIST with this label selector, served from the watch cache (resourceVersion=0). */
  list(namespace: string, labelSelector: string): Promise<LeaseObject[]>;
  /** null when it does not exist. */
  get(namespace: string, name: string): Promise<LeaseObject | null>;
  create(namespace: string, lease: LeaseObject, fieldManager: string): Promise<LeaseObject>;
  /** PUT; metadata.resourceVersion is the precondition. */
  replace(namespace: string, lease: LeaseObject, fieldManager: string): Promise<LeaseObject>;
  /** DELETE with preconditions. */
  delete(namespace: string, name: string, preconditions: { uid?: string; resourceVersion?: string }): Promise<void>;
  /**
   * Follow one Lease by name (a list and a watch with fieldSelector
   * metadata.name, resumed from the last resourceVersion, relisted on 410):
   * object() with the Lease (null while there is none) after the list and at
   * every change; failed() at each failure, retried inside, paced. `seed`:
   * the Lease as just written (read back): watched from its
   * resourceVersion, with no first list. Absent: no queue, polling only.
   */
  watch?(namespace: string, name: string, handlers: LeaseWatchHandlers, seed?: LeaseObject): { stop(): Promise<void> };
}

export interface LeaseWatchHandlers {
  object(lease: LeaseObject | null): void;
  failed(err: Error & { code?: number }): void;
}

/** metav1.MicroTime: RFC 3339 with six fractional digits. */
export function microTime(ms: number): string {
  return new Date(ms).toISOString().replace(/\.(\d{3})Z$/, '.$1000Z');
}

export function timeMs(t: string | undefined): number | undefined {
  if (!t) return undefined;
  const ms = Date.parse(t);
  return Number.isNaN(ms) ? undefined : ms;
}

export function code(e: unknown): number | undefined {
  const c = (e as { code?: unknown } | null)?.code;
  return typeof c === 'number' ? c : undefined;
}

export interface LeaseRolloutSlotsOptions {
  api: LeaseApi;
  namespace: string;
  /** The node's name. */
  identity: string;
  /** Field manager of every write (the agent's is AGENT_FIELD_MANAGER, src/agent/node-sinks.ts). */
  fieldManager: string;
  /** Whole seconds in the Lease; default DEFAULT_SLOT_LEASE_DURATION_MS. */
  leaseDurationMs?: number;
  now?: () => number;
  random?: () => number;
  /** Writes tried per attempt when slots look free (default 2). */
  writesPerAttempt?: number;
  /** false: no queue (a node of a version before it), polling only. */
  queue?: boolean;
}

/** The metadata of a Lease of `set`'s: labelled with `label` (whose value is the set's), pinset's, owned by the set when it has a uid. */
export function leaseMetadata(namespace: string, set: RolloutSet, name: string, label: string, base?: LeaseObject['metadata']): LeaseObject['metadata'] {
  return {
    ...base,
    name,
    namespace,
    labels: { ...base?.labels, [label]: setLabelValue(set.name), ...SLOT_MANAGED_BY },
    ...(set.uid ? { ownerReferences: [{ apiVersion: API_VERSION, kind: KIND, name: set.name, uid: set.uid }] } : {}),
  };
}

export class LeaseRolloutSlots implements RolloutSlots {
  readonly identity: string;
  readonly leaseDurationMs: number;
  readonly namespace: string;
  readonly #api: LeaseApi;
  readonly #seconds: number;
  readonly #now: () => number;
  readonly #random: () => number;
  readonly #writes: number;
  readonly #fieldManager: string;

  constructor(opts: LeaseRolloutSlotsOptions) {
    if (!opts.identity) throw new Error('rollout slots need a holder identity (the node name)');
    this.#api = opts.api;
    this.namespace = opts.namespace;
    this.identity = opts.identity;
    this.#seconds = Math.max(1, Math.round((opts.leaseDurationMs ?? DEFAULT_SLOT_LEASE_DURATION_MS) / 1000));
    this.leaseDurationMs = this.#seconds * 1000;
    this.#now = opts.now ?? Date.now;
    this.#random = opts.random ?? Math.random;
    this.#writes = opts.writesPerAttempt ?? 2;
    this.#fieldManager = opts.fieldManager;
    // Without a watch there is no queue: a grant would never be heard of.
    if (!opts.api.watch || opts.queue === false) {
      this.join = undefined;
      this.accept = undefined;
    }
  }

  #metadata(set: RolloutSet, name: string, base?: LeaseObject['metadata']): LeaseObject['metadata'] {
    return leaseMetadata(this.namespace, set, name, poolOf(set).slotLabel, base);
  }

  /** The slot as last written by this node: the base of its renewal and the preconditions of its release. */
  readonly #last = new Map<string, LeaseObject>();

  #held(set: RolloutSet, index: number, lease: LeaseObject, at: number): HeldSlot {
    this.#last.set(lease.metadata.name, lease);
    return { set: set.name, index, name: lease.metadata.name, version: lease.metadata.resourceVersion ?? '', renewedAt: at };
  }

  async tryAcquire(set: RolloutSet): Promise<HeldSlot | null> {
    const pool = poolOf(set).name;
    const leases = await this.#api.list(this.namespace, slotSelector(set.name, pool));
    const now = this.#now();
    const byIndex = new Map<number, LeaseObject>();
    for (const l of leases) {
      const i = slotIndex(set.name, l.metadata?.name ?? '', pool);
      if (i !== undefined) byIndex.set(i, l);
    }
    // A slot already ours (this node restarted while downloading): keep it,
    // even above a lowered limit, rather than take a second one.
    for (const [index, lease] of byIndex) {
      if (lease.spec?.holderIdentity !== this.identity) continue;
      const slot = this.#held(set, index, lease, timeMs(lease.spec.renewTime) ?? 0);
      if (await this.renew(slot)) return slot;
    }
    const existing = new Map<number, { free: boolean }>();
    for (const [index, l] of byIndex) {
      const s = l.spec ?? {};
      existing.set(index, { free: slotFree(s.holderIdentity, timeMs(s.renewTime ?? s.acquireTime), (s.leaseDurationSeconds ?? 0) * 1000, now) });
    }
    for (const c of candidateSlots(set.maxConcurrentNodes, existing, this.#random, this.#writes)) {
      const name = slotName(set.name, c.index, pool);
      const spec = { holderIdentity: this.identity, leaseDurationSeconds: this.#seconds, acquireTime: microTime(now), renewTime: microTime(now) };
      try {
        if (!c.exists) {
          const body: LeaseObject = { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: this.#metadata(set, name), spec: { ...spec, leaseTransitions: 0 } };
          return this.#held(set, c.index, await this.#api.create(this.namespace, body, this.#fieldManager), now);
        }
        const old = byIndex.get(c.index)!;
        // The resourceVersion read above is the precondition: of two nodes
        // taking this expired slot, one gets 409.
        const body: LeaseObject = { ...old, metadata: this.#metadata(set, name, old.metadata), spec: { ...spec, leaseTransitions: (old.spec?.leaseTransitions ?? 0) + 1 } };
        return this.#held(set, c.index, await this.#api.replace(this.namespace, body, this.#fieldManager), now);
      } catch (e) {
        if (code(e) === 409 || code(e) === 404) continue; // taken (or gone) since the list: try the next one
        throw e;
      }
    }
    return null;
  }

  join?: RolloutSlots['join'] = async (set: RolloutSet, events: QueueEvents): Promise<QueueTicket> => {
    const watch = this.#api.watch!;
    const pool = poolOf(set);
    const name = queueName(set.name, this.identity, pool.name);
    const body: LeaseObject = {
      apiVersion: 'coordination.k8s.io/v1',
      kind: 'Lease',
      metadata: { ...leaseMetadata(this.namespace, set, name, pool.queueLabel), annotations: { [QUEUE_LIMIT_ANNOTATION]: String(set.maxConcurrentNodes), [QUEUE_SET_ANNOTATION]: set.name } },
      // Its place in the queue is its creationTimestamp (the server's); acquireTime orders a second's entries.
      spec: { holderIdentity: this.identity, acquireTime: microTime(this.#now()) },
    };
    let entry: LeaseObject;
    try {
      entry = await this.#api.create(this.namespace, body, this.#fieldManager);
    } catch (e) {
      if (code(e) !== 409) throw e;
      // Already queued (this node restarted): keep its place.
      const found = await this.#api.get(this.namespace, name);
      if (!found || found.spec?.holderIdentity !== this.identity) throw e;
      entry = found;
    }
    let present = false;
    let lastGranted: string | undefined;
    let left = false;
    const watching = watch.call(this.#api, this.namespace, name, {
      object: (l) => {
        if (left) return;
        if (!l) {
          if (present) events.removed();
          present = false;
          return;
        }
        present = true;
        const granted = l.metadata.annotations?.[GRANT_ANNOTATION];
        if (granted && granted !== lastGranted) {
          lastGranted = granted;
          events.granted(granted);
        }
      },
      failed: (err) => {
        if (!left) events.failed(err);
      },
    }, entry);
    const uid = entry.metadata.uid;
    return {
      name,
      leave: async () => {
        if (left) return;
        left = true;
        await watching.stop();
        // The uid as precondition: never an entry made since by someone else.
        await this.#api.delete(this.namespace, name, uid ? { uid } : {}).catch(() => {});
      },
    };
  };

  accept?: RolloutSlots['accept'] = async (set: RolloutSet, name: string): Promise<HeldSlot | null> => {
    const index = slotIndex(set.name, name, poolOf(set).name);
    if (index === undefined) return null;
    const lease = await this.#api.get(this.namespace, name);
    if (!lease || lease.spec?.holderIdentity !== this.identity) return null;
    const slot = this.#held(set, index, lease, timeMs(lease.spec.renewTime) ?? 0);
    return (await this.renew(slot)) ? slot : null;
  };

  async granterAlive(): Promise<boolean> {
    const l = await this.#api.get(this.namespace, GRANTER_LEASE);
    const s = l?.spec;
    return !!s && !slotFree(s.holderIdentity, timeMs(s.renewTime ?? s.acquireTime), (s.leaseDurationSeconds ?? 0) * 1000, this.#now());
  }

  async renew(slot: HeldSlot): Promise<boolean> {
    let base = this.#last.get(slot.name);
    for (let attempt = 0; attempt < 2; attempt++) {
      if (!base || base.metadata.resourceVersion !== slot.version) base = (await this.#api.get(this.namespace, slot.name)) ?? undefined;
      if (!base || base.spec?.holderIdentity !== this.identity) break;
      const now = this.#now();
      const body: LeaseObject = { ...base, spec: { ...base.spec, holderIdentity: this.identity, leaseDurationSeconds: this.#seconds, renewTime: microTime(now) } };
      try {
        const updated = await this.#api.replace(this.namespace, body, this.#fieldManager);
        this.#last.set(slot.name, updated);
        slot.version = updated.metadata.resourceVersion ?? '';
        slot.renewedAt = now;
        return true;
      } catch (e) {
        if (code(e) === 404) break;
        if (code(e) !== 409) throw e;
        // Changed since this node last wrote it: read it again; if it is still ours, renew on top.
        base = undefined;
      }
    }
    this.#last.delete(slot.name);
    return false;
  }

  async release(slot: HeldSlot): Promise<void> {
    let base = this.#last.get(slot.name);
    this.#last.delete(slot.name);
    for (let attempt = 0; attempt < 2; attempt++) {
      if (!base) base = (await this.#api.get(this.namespace, slot.name)) ?? undefined;
      if (!base || base.spec?.holderIdentity !== this.identity) return; // already someone else's, or gone
      try {
        await this.#api.delete(this.namespace, slot.name, { uid: base.metadata.uid, resourceVersion: base.metadata.resourceVersion });
        return;
      } catch (e) {
        if (code(e) === 404) return;
        if (code(e) !== 409) throw e;
        base = undefined;
      }
    }
  }
}
