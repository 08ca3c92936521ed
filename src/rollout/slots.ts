// Rollout slots: `spec.rollout.maxConcurrentNodes` of a PinnedImageSet says
// how many nodes may download that set's images at the same time. Each node
// holds one of the set's slots while it downloads: slot i of set S is the
// coordination.k8s.io Lease `S-i` (i in 0..max-1) in the agents' namespace,
// held when its holderIdentity is the node and its renewTime plus
// leaseDurationSeconds has not passed. A node that dies frees its slot when
// the Lease expires.
//
// This module is the seam (RolloutSlots) and what every implementation
// shares: the names, the labels, when a slot is free. ./lease-slots.ts holds
// slots in Leases through the API; ./memory-slots.ts is its in-memory twin.
// ./gate.ts is the protocol a node follows (which sets need a slot, pacing,
// renewal, release).
import { createHash } from 'node:crypto';

/** A set whose downloads are limited. */
export interface RolloutSet {
  name: string;
  /** The set's uid: the slot Leases name the set as their owner, so they go when it goes. */
  uid?: string;
  /** spec.rollout.maxConcurrentNodes (>= 1). */
  maxConcurrentNodes: number;
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
}

/** Label on every slot Lease: which set it belongs to (see setLabelValue). */
export const SLOT_SET_LABEL = 'pinset.dev/rollout-set';
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

/**
 * The Lease of slot `index` of `set`: `<set>-<index>`. A set name so long
 * that this would pass 253 characters is cut and a hash of the whole name
 * added, `<start of set>-<hash>-<index>`, so two long names never share
 * slots.
 */
export function slotName(set: string, index: number): string {
  const suffix = `-${index}`;
  if (set.length + suffix.length <= MAX_OBJECT_NAME) return `${set}${suffix}`;
  const hash = shortHash(set);
  return `${cutName(set, MAX_OBJECT_NAME - suffix.length - hash.length - 1)}-${hash}${suffix}`;
}

/** The slot's index when `leaseName` is a slot of `set`, else undefined. */
export function slotIndex(set: string, leaseName: string): number | undefined {
  const m = /-(0|[1-9][0-9]*)$/.exec(leaseName);
  if (!m) return undefined;
  const index = Number(m[1]);
  return Number.isSafeInteger(index) && slotName(set, index) === leaseName ? index : undefined;
}

/** The value of SLOT_SET_LABEL for `set`: its name, or when longer than a label value may be, its start and a hash. */
export function setLabelValue(set: string): string {
  if (set.length <= MAX_LABEL_VALUE) return set;
  const hash = shortHash(set);
  return `${cutName(set, MAX_LABEL_VALUE - hash.length - 1)}-${hash}`;
}

/** The label selector that lists the slots of `set`. */
export function slotSelector(set: string): string {
  return `${SLOT_SET_LABEL}=${setLabelValue(set)}`;
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
