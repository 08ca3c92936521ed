// Where the reconcile meets the rollout slots (src/rollout/): just before it
// downloads, the images of sets limited by spec.rollout.maxConcurrentNodes
// are let through only while their set holds a slot; the other sets wait
// (their status says WaitingForRolloutSlot).
import type { RolloutGate, SlotWait } from '../rollout/gate.ts';
import type { RolloutSet } from '../rollout/slots.ts';
import type { Plan, PlannedSet, WantedImage } from './plan.ts';

/**
 * By set key, the limited sets: sets from the API with
 * spec.rollout.maxConcurrentNodes. A static set is the node's own (it
 * applies with no API at all), so it is never held back.
 */
export function rolloutLimits(sets: readonly PlannedSet[]): Map<string, RolloutSet> {
  const out = new Map<string, RolloutSet>();
  for (const s of sets) {
    if (s.source !== 'api' || s.maxConcurrentNodes === undefined) continue;
    out.set(s.key, { name: s.name, ...(s.uid ? { uid: s.uid } : {}), maxConcurrentNodes: s.maxConcurrentNodes });
  }
  return out;
}

export interface AdmittedPulls {
  /** What to pass to the puller now. */
  pulls: WantedImage[];
  /** By set key, the sets whose downloads wait for a slot (for the status). */
  waits?: ReadonlyMap<string, SlotWait>;
  /** By set key, the sets downloading without a slot: this node may not hold one (for the status). */
  unenforced?: ReadonlyMap<string, string>;
}

/**
 * The reconcile is about to pull `pulls`. `downloads(w)`: true when pulling
 * `w` now downloads content (not held by the runtime under another name,
 * and due). Without a gate, everything goes.
 */
export async function admitDownloads(
  gate: RolloutGate | null | undefined,
  plan: Plan,
  pulls: WantedImage[],
  downloads: (w: WantedImage) => boolean,
): Promise<AdmittedPulls> {
  if (!gate) return { pulls };
  const { allowed, waits, unenforced } = await gate.admit(pulls, rolloutLimits(plan.sets), downloads);
  return { pulls: allowed, waits, unenforced };
}
