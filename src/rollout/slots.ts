// Rollout slots: `spec.rollout.maxConcurrentNodes` of a PinnedImageSet says
// how many nodes may download that set's images at the same time. Each node
// holds one of the set's slots while it downloads: slot i of set S is the
// coordination.k8s.io Lease `S-i` (i in 0..max-1) in the agents' namespace,
// held when its holderIdentity is the node and its renewTime plus
// leaseDurationSeconds has not passed. A node that dies frees its slot when
// the Lease expires.
//
// The same mechanism holds a set's first-wave seats (spec.rollout.firstWave:
// the few nodes that fetch each image first, ./first-wave.ts): a second pool
// of slots, `S-i.first-wave`, labelled apart, so that listing one pool never
// reads the other.
//
// A node that finds every slot held may also queue for one (./grants.ts:
// a Lease of its own, `S.<node>.queue`, that it watches by name) so that a
// freed slot is handed to it at once rather than found by its next poll.
//
// This module is the seam (RolloutSlots) and what every implementation
// shares: the names, the labels, when a slot is free. ./lease-slots.ts holds
// slots in Leases through the API; ./memory-slots.ts is its in-memory twin.
// ./claims.ts is how a node takes, waits for, renews and frees slots;
// ./gate.ts the protocol of a node's downloads over them.
import { createHash } from 'node:crypto';

/** Which slots of a set: its rollout slots (maxConcurrentNodes) or its first-wave seats (firstWave.nodes). */
export type SlotPoolName = 'rollout' | 'first-wave';

/** A set whose downloads are limited. */
export interface RolloutSet {
  name: string;
  /** The set's uid: the slot Leases name the set as their owner, so they go when it goes. */
  uid?: string;
  /** spec.rollout.maxConcurrentNodes (>= 1); for the first-wave pool, firstWave.nodes. */
  maxConcurrentNodes: number;
  /** Default 'rollout'. */
  pool?: SlotPoolName;
}

/** A slot this node holds. The implementation keeps what it needs to renew and release it in `version`. */
export interface HeldSlot {
  /** The set's name. */
  readonly set: string;
  readonly index: number;
  /** The Lease's name. */
  readonly name: string;
  /** Opaque to callers: the implementation's optimistic-concurrency token (the Lease's resourceVersion). */
  version: string;
  /** When the holder last renewed it (ms since epoch, this process's clock). */
  renewedAt: number;
}

/**
 * The seam. Every call is one attempt: nothing here waits for a slot
 * (pacing and retries are the caller's, see ./gate.ts). Errors (the API
 * cannot be reached, ...) are thrown.
 */
export interface RolloutSlots {
  /** The holder identity written into the slots: the node's name. */
  readonly identity: string;
  /** How long a slot holds without renewal. */
  readonly leaseDurationMs: number;
  /**
   * Take a slot of `set`: one this identity already holds (after a
   * restart), else a free or expired one below maxConcurrentNodes. Null
   * when every slot is held by a live holder, or another node took the
   * free ones first.
   */
  tryAcquire(set: RolloutSet): Promise<HeldSlot | null>;
  /** Renew; false when the slot is no longer this identity's (it expired and another node took it, or it was deleted). */
  renew(slot: HeldSlot): Promise<boolean>;
  /** Free it for the next node. A slot already lost is not an error. */
  release(slot: HeldSlot): Promise<void>;
  /**
   * The hand-over queue, where the implementation has one (./grants.ts):
   * put this node in `set`'s queue (or find its entry there, after a
   * restart) and report grants and the entry's removal through `events`
   * until the ticket is left. Absent: the node only polls.
   */
  join?(set: RolloutSet, events: QueueEvents): Promise<QueueTicket>;
  /**
   * Take a slot the granter wrote in this node's name: held from now (renewed
   * to this node's lease duration), or null when it is not this node's (the
   * grant lapsed, another node took it).
   */
  accept?(set: RolloutSet, slotName: string): Promise<HeldSlot | null>;
  /**
   * Whether a granter serves the queues now (its heartbeat, GRANTER_LEASE, is
   * live): one read of one object. Absent: not known (poll as ever).
   */
  granterAlive?(): Promise<boolean>;
}

/** What a queued node hears about its entry. Called outside any caller's await; errors are the callee's. */
export interface QueueEvents {
  /** The granter put slot `slotName` in this node's name. */
  granted(slotName: string): void;
  /** The entry is gone (the granter dropped a grant this node did not take in time, or someone deleted it). */
  removed(): void;
  /** The entry cannot be watched (the error, with its HTTP status when it has one): polling is all that is left. */
  failed(err: Error & { code?: number }): void;
}

/** This node's place in a queue. */
export interface QueueTicket {
  /** The entry's name. */
  readonly name: string;
  /** Leave the queue: stop watching, delete the entry. Never throws (an entry left behind is dropped by the granter or goes with its set). */
  leave(): Promise<void>;
}

/** Label on every rollout slot Lease: which set it belongs to (see setLabelValue). */
export const SLOT_SET_LABEL = 'pinset.dev/rollout-set';
/** Label on every first-wave seat Lease, as SLOT_SET_LABEL on rollout slots. */
export const SEAT_SET_LABEL = 'pinset.dev/first-wave-set';
/** Label on a queue entry for a set's rollout slots. */
export const SLOT_QUEUE_LABEL = 'pinset.dev/rollout-queue';
/** Label on a queue entry for a set's first-wave seats. */
export const SEAT_QUEUE_LABEL = 'pinset.dev/first-wave-queue';
/** Label on a first-wave seat's record of the images landed (./first-wave.ts). */
export const LANDED_SET_LABEL = 'pinset.dev/first-wave-landed';
/** Annotation the granter writes on a queue entry: the slot it put in the entry's node's name. */
export const GRANT_ANNOTATION = 'pinset.dev/granted-slot';
/**
 * Annotation on a queue entry: the limit its node read in the set (a static
 * set is on the nodes only, so the granter learns its limit from them).
 */
export const QUEUE_LIMIT_ANNOTATION = 'pinset.dev/limit';
/**
 * The granter's heartbeat: a Lease the controller's leading replica renews
 * while its grants go through. A queued node that finds it live skips most
 * of its polls (each a LIST that reads every Lease of the namespace,
 * queue entries included); one that finds it gone polls as ever.
 */
export const GRANTER_LEASE = 'pinset-rollout-granter';
/** Annotation on a queue entry: the set's whole name (its label value may be cut and hashed). */
export const QUEUE_SET_ANNOTATION = 'pinset.dev/set';
/** Label on every slot Lease: who manages it. */
export const SLOT_MANAGED_BY = { 'app.kubernetes.io/managed-by': 'pinset-agent' } as const;
/** A node that dies frees its slot after this long (the default of `pinset agent --rollout-lease-duration`). */
export const DEFAULT_SLOT_LEASE_DURATION_MS = 60_000;
/** The agents' namespace, where the slot Leases live (`--lease-namespace`, from the pod's namespace in the DaemonSet). */
export const DEFAULT_SLOT_NAMESPACE = 'pinset-system';

/** Object names (a Lease's, a set's) are DNS subdomains of at most this many characters. */
const MAX_OBJECT_NAME = 253;
/** A label value is at most 63 characters. */
const MAX_LABEL_VALUE = 63;

function shortHash(s: string): string {
  return createHash('sha256').update(s).digest('hex').slice(0, 10);
}

/** `s` cut to `n` characters and to a last alphanumeric character (DNS names and label values end with one). */
function cutName(s: string, n: number): string {
  return s.slice(0, n).replace(/[^a-z0-9]+$/, '');
}

/** What each pool's Leases are called and labelled. */
export interface SlotPool {
  name: SlotPoolName;
  /** Ends every slot's name: rollout slots end with their index, so no other name can be a slot's. */
  slotTail: string;
  slotLabel: string;
  /** Ends every queue entry's name. */
  queueTail: string;
  queueLabel: string;
  /** What a person calls one of its slots (logs). */
  what: string;
}

export const POOLS: Readonly<Record<SlotPoolName, SlotPool>> = {
  rollout: { name: 'rollout', slotTail: '', slotLabel: SLOT_SET_LABEL, queueTail: '.queue', queueLabel: SLOT_QUEUE_LABEL, what: 'rollout slot' },
  'first-wave': { name: 'first-wave', slotTail: '.first-wave', slotLabel: SEAT_SET_LABEL, queueTail: '.first-wave-queue', queueLabel: SEAT_QUEUE_LABEL, what: 'first-wave seat' },
};

export function poolOf(set: RolloutSet): SlotPool {
  return POOLS[set.pool ?? 'rollout'];
}

/** `<base><suffix>`, or when that would pass 253 characters, `<start of base>-<hash of base><suffix>`. */
function boundedName(base: string, suffix: string): string {
  if (base.length + suffix.length <= MAX_OBJECT_NAME) return `${base}${suffix}`;
  const hash = shortHash(base);
  return `${cutName(base, MAX_OBJECT_NAME - suffix.length - hash.length - 1)}-${hash}${suffix}`;
}

/**
 * The Lease of slot `index` of `set`: `<set>-<index>` (a first-wave seat:
 * `<set>-<index>.first-wave`). A set name so long that this would pass 253
 * characters is cut and a hash of the whole name added, `<start of
 * set>-<hash>-<index>`, so two long names never share slots.
 */
export function slotName(set: string, index: number, pool: SlotPoolName = 'rollout'): string {
  return boundedName(set, `-${index}${POOLS[pool].slotTail}`);
}

/** The slot's index when `leaseName` is a slot of `set` (in `pool`), else undefined. */
export function slotIndex(set: string, leaseName: string, pool: SlotPoolName = 'rollout'): number | undefined {
  const tail = POOLS[pool].slotTail;
  if (!leaseName.endsWith(tail)) return undefined;
  const m = /-(0|[1-9][0-9]*)$/.exec(leaseName.slice(0, leaseName.length - tail.length));
  if (!m) return undefined;
  const index = Number(m[1]);
  return Number.isSafeInteger(index) && slotName(set, index, pool) === leaseName ? index : undefined;
}

/**
 * A node's entry in the queue for `set`'s slots: `<set>.<node>.queue`
 * (first-wave seats: `.first-wave-queue`), cut and hashed as slotName when
 * long. Set and node names are DNS subdomains, so this is one too; it ends
 * with no index, so it is never a slot's name.
 */
export function queueName(set: string, node: string, pool: SlotPoolName = 'rollout'): string {
  return boundedName(`${set}.${node}`, POOLS[pool].queueTail);
}

/** The record of the images first-wave seat `index` of `set` has landed: `<set>-<index>.landed`. */
export function landedName(set: string, index: number): string {
  return boundedName(set, `-${index}.landed`);
}

/** The value of SLOT_SET_LABEL for `set`: its name, or when longer than a label value may be, its start and a hash. */
export function setLabelValue(set: string): string {
  if (set.length <= MAX_LABEL_VALUE) return set;
  const hash = shortHash(set);
  return `${cutName(set, MAX_LABEL_VALUE - hash.length - 1)}-${hash}`;
}

/** The label selector that lists the slots of `set` (in `pool`). */
export function slotSelector(set: string, pool: SlotPoolName = 'rollout'): string {
  return `${POOLS[pool].slotLabel}=${setLabelValue(set)}`;
}

/**
 * Whether a slot with this holder and times is free at `now`: no holder, or
 * its last renewal plus its duration has passed (client-go's leader
 * election judges a Lease the same way; clocks are assumed to agree to well
 * within the duration, as NTP keeps them).
 */
export function slotFree(holder: string | undefined, renewedAt: number | undefined, durationMs: number | undefined, now: number): boolean {
  if (!holder) return true;
  if (renewedAt === undefined || durationMs === undefined || !Number.isFinite(renewedAt)) return true;
  return now > renewedAt + durationMs;
}

/**
 * Slot indices worth trying for `set`, in random order: existing slots
 * (given by index) that are free, and indices with no slot yet. Random, so
 * nodes that try together try different slots. Below 1024 slots every
 * absent index is a candidate; above, a few are sampled.
 */
export function candidateSlots(
  max: number,
  existing: ReadonlyMap<number, { free: boolean }>,
  random: () => number,
  limit = 4,
): { index: number; exists: boolean }[] {
  const out: { index: number; exists: boolean }[] = [];
  for (const [index, s] of existing) if (index < max && s.free) out.push({ index, exists: true });
  if (max <= 1024) {
    for (let i = 0; i < max; i++) if (!existing.has(i)) out.push({ index: i, exists: false });
  } else {
    const seen = new Set<number>();
    for (let tries = 0; tries < 64 && seen.size < limit; tries++) {
      const i = Math.floor(random() * max);
      if (!existing.has(i)) seen.add(i);
    }
    for (const i of seen) out.push({ index: i, exists: false });
  }
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [out[i], out[j]] = [out[j]!, out[i]!];
  }
  return out.slice(0, limit);
}
