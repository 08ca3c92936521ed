// The hand-over of rollout slots: who gets a slot that frees, decided in one
// place (planGrants, pure) and applied by the granter (./granter.ts, in the
// controller, on Leases; ./memory-slots.ts MemoryGranter, its twin).
//
// A node that finds every slot of a set held puts itself in the set's queue:
// a Lease of its own, `<set>.<node>.queue` (the time the API server created
// it is its place, so no node can put itself earlier),
// and watches that one Lease by name. The API server's watch cache indexes
// watchers by (namespace, name) and dispatches an event only to the watchers
// of that object and to unscoped ones (k8s.io/apiserver
// pkg/storage/cacher/cacher.go, indexedWatchers.allWatchers and
// startDispatching), so a waiting node hears of its own entry and nothing
// else: no slot renewal reaches it. The controller's one active replica
// watches the agents' Leases (one watch, label-selected) and, when a slot
// is free (released, expired, or never taken), writes it in the name of the
// oldest waiting node with a short lease (the accept window, 20 s), then
// marks that node's entry with the slot's name. The node, woken by its own
// entry, takes the slot (a read and a renewal to its own lease duration) and
// leaves the queue. A node that does not take its grant in the window (it
// died, or its watch broke) lets the grant lapse: the granter deletes its
// entry and grants the slot to the next node (a live node that sees its
// entry go away queues again, at the back).
//
// Why the controller grants rather than the freeing holder hands over (a
// holder-to-next-waiter chain needs no controller; weighed and not chosen):
// - the holder would have to find the oldest waiter: a LIST of the set's
//   whole queue per hand-over (5000 entries of about 500 bytes: 2.5 MB from
//   the watch cache, for each slot freed); the controller keeps the queue
//   from its one watch and reads nothing per grant;
// - the holder would write another node's entry to wake it: the admission
//   policy would have to let every agent write every other node's Lease; here
//   an agent writes only Leases in its own node's name
//   (deploy/admission/rollout-handover.yaml), and the controller writes the
//   grants;
// - slots freed by a node that dies (expiry), by an agent too old to hand
//   over, or never taken yet (a new set: a free slot would otherwise wait for
//   the nodes' first-attempt jitter, 0 to 10 s) are granted the same way, at
//   once: the granter sees each expiry time and every free slot.
// What it costs instead: the controller watches every Lease the agents write
// in their namespace (each renewal once, to one watcher), and grants stop
// while no replica leads (the Lease's 15 s). The queue's entries live
// beside the slots, so a node's poll (a LIST of the set's slots by label,
// from the watch cache) now reads them too: a queued node that finds the
// granter's heartbeat live (./granter.ts) lists at only one attempt in ten
// and reads that one object otherwise (./claims.ts). Without a granter
// (none installed, an older controller, no leader, RBAC that forbids the
// watch, grants that fail) the heartbeat is gone and every node polls as
// before, so the rollout goes on at the polling pace, and a slot whose
// holder dies is freed by its expiry as before. The figures are in BENCHMARKS.md, section 11 ("Rollout slots:
// the hand-over").
import { slotFree } from './slots.ts';

/**
 * How long a granted slot waits to be taken before the grant lapses: a
 * node that died while queued keeps its slot idle this long, once; a live
 * node takes its grant in a fraction of a second, or in a few seconds
 * behind a busy API server (the bench's, section 11).
 */
export const DEFAULT_ACCEPT_MS = 20_000;

/** A slot Lease as the granter sees it. */
export interface SlotView {
  name: string;
  index: number;
  holder?: string;
  /** ms since epoch */
  renewedAt?: number;
  durationMs?: number;
  /** The optimistic-concurrency token of the last write seen (the resourceVersion). */
  version?: string;
}

/** A node's queue entry as the granter sees it. */
export interface QueueEntryView {
  name: string;
  node: string;
  /** When it queued (ms since epoch): its place. On Leases, the server's creationTimestamp (whole seconds), so no node can queue itself earlier. */
  queuedAt: number;
  /** Orders entries queued in the same second (the node's own acquireTime). */
  tiebreak?: number;
  /** The slot the granter last put in this node's name (the entry's annotation). */
  granted?: string;
  version?: string;
  uid?: string;
}

/** One set's pool of slots, as the granter sees it. */
export interface PoolState {
  /** The limit (maxConcurrentNodes, or firstWave.nodes for seats). */
  max: number;
  /** The slot Leases that exist. */
  slots: readonly SlotView[];
  queue: readonly QueueEntryView[];
  /** Nodes served before the others (a set's first-wave members, for its rollout slots). */
  preferred?: ReadonlySet<string>;
}

export interface Grant {
  index: number;
  /** The slot's Lease when it exists (free: released in place, or expired): written over with its version. */
  slot?: SlotView;
  node: string;
  entry: QueueEntryView;
}

export interface GrantPlan {
  grants: Grant[];
  /** Entries whose grant lapsed (the slot is not held in their node's name): deleted, so their place goes to the next. */
  lapsed: QueueEntryView[];
  /** When a live slot expires next (ms since epoch): the plan may change then. */
  nextCheckAt?: number;
}

const isLive = (s: SlotView, now: number) => !slotFree(s.holder, s.renewedAt, s.durationMs, now);

/**
 * Who gets which slot now. At most max slots are live after the grants
 * (slots above a lowered limit still count); each node holds at most one
 * slot of the set; the queue is served in order of queuedAt (preferred
 * nodes first), one node's oldest entry counting for it.
 */
export function planGrants(state: PoolState, now: number): GrantPlan {
  const live = state.slots.filter((s) => isLive(s, now));
  const holders = new Set(live.map((s) => s.holder!));
  const liveIndex = new Set(live.map((s) => s.index));
  const byName = new Map(state.slots.map((s) => [s.name, s]));
  const lapsed: QueueEntryView[] = [];
  const seen = new Set<string>();
  const waiting: QueueEntryView[] = [];
  const order = (a: QueueEntryView, b: QueueEntryView) => a.queuedAt - b.queuedAt || (a.tiebreak ?? 0) - (b.tiebreak ?? 0) || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0);
  for (const e of [...state.queue].sort(order)) {
    if (seen.has(e.node)) continue;
    seen.add(e.node);
    if (holders.has(e.node)) continue; // served: it leaves the queue itself
    if (e.granted !== undefined) {
      const g = byName.get(e.granted);
      // A grant still in this node's name and not expired: it is taking it.
      if (g && g.holder === e.node && isLive(g, now)) continue;
      lapsed.push(e);
      continue;
    }
    waiting.push(e);
  }
  const preferred = state.preferred;
  if (preferred?.size) waiting.sort((a, b) => Number(preferred.has(b.node)) - Number(preferred.has(a.node)));
  const grants: Grant[] = [];
  let room = Math.max(0, state.max - live.length);
  for (let index = 0; index < state.max && room > 0 && grants.length < waiting.length; index++) {
    if (liveIndex.has(index)) continue;
    const entry = waiting[grants.length]!;
    const slot = state.slots.find((s) => s.index === index);
    grants.push({ index, ...(slot ? { slot } : {}), node: entry.node, entry });
    room--;
  }
  let nextCheckAt: number | undefined;
  for (const s of live) {
    const at = s.renewedAt! + s.durationMs! + 1;
    if (nextCheckAt === undefined || at < nextCheckAt) nextCheckAt = at;
  }
  return { grants, lapsed, ...(nextCheckAt !== undefined ? { nextCheckAt } : {}) };
}
