// Where the reconcile meets the rollout (src/rollout/): just before it
// downloads, two checks, in this order:
// - the first wave (src/rollout/first-wave.ts): an image of a set with
//   spec.rollout.firstWave waits until a first-wave node holds it, unless
//   this node is in the first wave (its status says WaitingForFirstWave);
// - the rollout slots (src/rollout/gate.ts): of what may go, the images of
//   sets limited by spec.rollout.maxConcurrentNodes are let through only
//   while their set holds a slot (WaitingForRolloutSlot).
// The first wave comes first: it decides when an image may come at all, a
// slot only how many nodes fetch it at once, so only a node with something
// to fetch now asks for a slot.
import type { FirstWave, SetWave, WaveSet } from '../rollout/first-wave.ts';
import type { RolloutGate, SlotWait } from '../rollout/gate.ts';
import { staticWaveName } from '../rollout/landed.ts';
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

/**
 * By set key, the sets that ask for a first wave. A set from the API goes
 * by its name; a static set by its name and a hash of its images, so only
 * nodes with the same file share its first wave.
 */
export function firstWaves(sets: readonly PlannedSet[]): Map<string, WaveSet> {
  const out = new Map<string, WaveSet>();
  for (const s of sets) {
    if (s.firstWaveNodes === undefined || s.selection !== 'selected' || s.specErrors.length > 0) continue;
    const digests = s.references.map((r) => r.digest);
    if (digests.length === 0) continue;
    const name = s.source === 'api' ? s.name : staticWaveName(s.name, digests);
    out.set(s.key, { name, ...(s.source === 'api' && s.uid ? { uid: s.uid } : {}), nodes: s.firstWaveNodes, digests });
  }
  return out;
}

/** The rollout's two checks, either absent (no API: nothing waits). */
export interface Rollout {
  gate?: RolloutGate | null;
  firstWave?: FirstWave | null;
}

export interface AdmittedPulls {
  /** What to pass to the puller now. */
  pulls: WantedImage[];
  /** By set key, the sets whose downloads wait for a slot (for the status). */
  waits?: ReadonlyMap<string, SlotWait>;
  /** By set key, the sets downloading without a slot: this node may not hold one (for the status). */
  unenforced?: ReadonlyMap<string, string>;
  /** By set key, the sets with a first wave this node still has images of: who is in it, what waits (for the status). */
  waves?: ReadonlyMap<string, SetWave>;
  /** Whether a pull of `pulls` may still start: false once the rollout slot that let it through was lost (src/rollout/gate.ts stillAllowed). */
  mayStart?: (w: WantedImage) => boolean;
  /** The pulls this node fetches for a first wave, by key: the set key whose images are pulled one at a time (they come first in `pulls`, in the set's order). */
  oneAtATime?: ReadonlyMap<string, string>;
}

/**
 * The reconcile is about to pull `pulls`. `downloads(w)`: true when pulling
 * `w` now downloads content (not held by the runtime under another name,
 * and due). Without a gate or a first wave, everything goes.
 */
export async function admitDownloads(rollout: Rollout, plan: Plan, pulls: WantedImage[], downloads: (w: WantedImage) => boolean): Promise<AdmittedPulls> {
  const { gate, firstWave } = rollout;
  let mayGo = pulls;
  let waves: ReadonlyMap<string, SetWave> | undefined;
  const oneAtATime = new Map<string, string>();
  if (firstWave) {
    const due = pulls.filter(downloads).map((w) => ({ key: w.key, digest: w.reference.digest, sets: w.sets, wanted: w }));
    const wave = await firstWave.admit(due, firstWaves(plan.sets));
    const waiting = new Set(wave.waiting.map((i) => i.wanted));
    mayGo = pulls.filter((w) => !waiting.has(w));
    waves = wave.sets;
    for (const [k, fetch] of wave.oneAtATime) for (const i of fetch) oneAtATime.set(i.key, k);
  }
  const wave = { ...(waves ? { waves } : {}), ...(oneAtATime.size > 0 ? { oneAtATime } : {}) };
  if (!gate) return { pulls: fetchFirst(mayGo, oneAtATime), ...wave };
  const { allowed, waits, unenforced, stillAllowed } = await gate.admit(mayGo, rolloutLimits(plan.sets), downloads);
  return { pulls: fetchFirst(allowed, oneAtATime), waits, unenforced, mayStart: stillAllowed, ...wave };
}

/** The first wave's fetches first, in the order they are to be pulled one at a time, then the rest as they were. */
function fetchFirst(pulls: WantedImage[], oneAtATime: ReadonlyMap<string, string>): WantedImage[] {
  if (oneAtATime.size === 0) return pulls;
  const rank = new Map([...oneAtATime.keys()].map((key, i) => [key, i]));
  return [...pulls].sort((a, b) => (rank.get(a.key) ?? rank.size) - (rank.get(b.key) ?? rank.size));
}

/**
 * What this node holds of the first waves' images, by digest, as it
 * changes: a first-wave node records each image as it lands (at most once
 * a second, src/rollout/landed.ts), so the others start on it while the
 * rest still come.
 */
export class WaveLandings {
  readonly #wave: FirstWave | null | undefined;
  readonly #present = new Set<string>();

  constructor(wave: FirstWave | null | undefined, plan: Plan, present: (w: WantedImage) => boolean) {
    this.#wave = wave;
    if (!wave) return;
    for (const w of plan.wanted) if (present(w)) this.#present.add(w.reference.digest);
    void wave.held(this.#present).catch(() => {});
  }

  /** `w` landed on this node now. */
  landed(w: WantedImage): void {
    if (!this.#wave) return;
    this.#present.add(w.reference.digest);
    void this.#wave.held(this.#present).catch(() => {});
  }

  /**
   * The pulls of this round ended: what landed is written, and a first-wave
   * node whose download failed steps out, so another node takes its place.
   */
  async settle(failedDownloads: readonly WantedImage[]): Promise<void> {
    if (!this.#wave) return;
    await this.#wave.held(this.#present);
    if (failedDownloads.length > 0) await this.#wave.failed(failedDownloads.flatMap((w) => w.sets));
  }
}
