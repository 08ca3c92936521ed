// The planner: a pure function from what was observed to what the node
// should hold. No I/O, no clock: everything it needs is in PlanInput, so it
// can be tested exhaustively and run twice with the same answer.
import type { ParsedReference } from '../api/reference.ts';
import { selectorMatches, selectsEverything, type Labels } from '../api/selector.ts';
import type { PinnedImageSet, SetSource } from '../api/types.ts';
import { validateSet, type ImageProblem } from '../api/validate.ts';

export interface ObservedSet {
  source: SetSource;
  /** The object as read (API object, or a YAML document from the static folder). */
  object: unknown;
  /** Where it came from, for messages: "api" or a file path and document number. */
  origin: string;
  /** A static set kept from its file's last readable content: the file cannot be read now. */
  held?: { file: string; error: string };
}

/** A static file (or the static folder) that could not be read, and whose sets are unknown. */
export interface SourceProblem {
  origin: string;
  error: string;
}

export interface PlanInput {
  /** The node's labels; null when they could not be observed. */
  labels: Labels | null;
  /** Sets from the API; null when the API is configured but no list has succeeded yet. */
  apiSets: readonly ObservedSet[] | null;
  /** Static sets read now, and those held from files that cannot be read now (see static.ts). */
  staticSets: readonly ObservedSet[];
  /**
   * Static files whose sets are unknown (unreadable since the agent
   * started): every current pin is kept. A file whose last readable content
   * is known is not here: its sets are held in staticSets instead, so only
   * their pins are kept.
   */
  staticProblems: readonly SourceProblem[];
  /** Why the API's sets are not known (apiSets null): the CRD missing or being deleted, say; absent: not listed yet. */
  apiProblem?: string;
  /** Pins in the agent's own file now: kept while the observation is incomplete. */
  currentPins: readonly string[];
  /** pinned_images of crio.conf and the drop-ins read before the agent's file. */
  carriedPins: readonly string[];
}

export type Selection = 'selected' | 'not-selected' | 'unknown';

export interface PlannedSet {
  /** "api/<name>" or "static/<name>": unique among planned sets. */
  key: string;
  name: string;
  uid?: string;
  source: SetSource;
  origin: string;
  generation: number;
  runtimeHandler: string;
  selection: Selection;
  /** Problems that make the whole set unusable. */
  specErrors: string[];
  /** References that fail the grammar; the others still apply. */
  invalidImages: ImageProblem[];
  /** Valid references, de-duplicated. */
  references: ParsedReference[];
  /** Held from a static file that cannot be read now (see ObservedSet.held). */
  held?: { file: string; error: string };
  /** spec.rollout.maxConcurrentNodes: at most this many nodes download the set at a time (absent: no limit). */
  maxConcurrentNodes?: number;
  /** spec.rollout.firstWave.nodes: each image is first fetched by this many nodes, the others wait for it (absent: no first wave). */
  firstWaveNodes?: number;
  /** spec.pullSecrets: Secrets in the agents' namespace whose credentials are tried first for its images. */
  pullSecrets: string[];
}

export interface WantedImage {
  /** `${runtimeHandler}\n${reference}`: one pull per (image, handler). */
  key: string;
  reference: ParsedReference;
  runtimeHandler: string;
  /** Keys of the planned sets that want it. */
  sets: string[];
}

export interface Plan {
  sets: PlannedSet[];
  /** The union of images wanted by selected sets, each once per runtime handler. */
  wanted: WantedImage[];
  /**
   * The pin file's list: sorted, unique. Empty when the agent pins nothing
   * of its own (no wanted image, nothing kept): then others' pins are not
   * carried either, and the runtime holds the administrator's configuration
   * alone (CRI-O: no pinset drop-in at all).
   */
  pins: string[];
  /**
   * Pins kept only because the observation was incomplete (API not listed,
   * labels unknown, a static file never read): the current pins that no set
   * asks for, carried ones included. The node status's pinsKept counts these.
   */
  retained: string[];
  /** Why pins were retained, for logs; empty when the observation was complete. */
  retainReasons: string[];
  /** Static files whose sets are unknown (see PlanInput.staticProblems). */
  unknownStatic: string[];
}

export function wantedKey(ref: string, runtimeHandler: string): string {
  return `${runtimeHandler}\n${ref}`;
}

function metaOf(obj: unknown): { name: string; uid?: string; generation: number } {
  const md = (obj as { metadata?: { name?: unknown; uid?: unknown; generation?: unknown } } | null)?.metadata;
  return {
    name: typeof md?.name === 'string' && md.name ? md.name : '(unnamed)',
    uid: typeof md?.uid === 'string' ? md.uid : undefined,
    // Static documents usually carry no generation: they count as generation 1.
    generation: typeof md?.generation === 'number' ? md.generation : 1,
  };
}

function planSet(o: ObservedSet, labels: Labels | null): PlannedSet {
  const v = validateSet(o.object);
  const meta = metaOf(o.object);
  const set = o.object as PinnedImageSet;
  const base = {
    key: `${o.source}/${meta.name}`,
    name: meta.name,
    uid: meta.uid,
    source: o.source,
    origin: o.origin,
    generation: meta.generation,
    runtimeHandler: typeof set?.spec?.runtimeHandler === 'string' ? set.spec.runtimeHandler : '',
    specErrors: v.errors,
    invalidImages: v.imageProblems,
    references: v.images,
    pullSecrets: v.pullSecrets,
    ...(o.held ? { held: o.held } : {}),
    ...(v.errors.length === 0 && typeof set.spec.rollout?.maxConcurrentNodes === 'number' ? { maxConcurrentNodes: set.spec.rollout.maxConcurrentNodes } : {}),
    ...(v.errors.length === 0 && typeof set.spec.rollout?.firstWave?.nodes === 'number' ? { firstWaveNodes: set.spec.rollout.firstWave.nodes } : {}),
  };
  // A set whose selector cannot be read selects nothing: it is reported, not applied.
  const selectorBroken = v.errors.some((e) => e.startsWith('spec.nodeSelector')) || !set?.spec;
  let selection: Selection;
  if (selectorBroken) selection = 'not-selected';
  else if (selectsEverything(set.spec.nodeSelector)) selection = 'selected';
  else if (labels === null) selection = 'unknown';
  else selection = selectorMatches(set.spec.nodeSelector, labels) ? 'selected' : 'not-selected';
  return { ...base, selection };
}

export function planReconcile(input: PlanInput): Plan {
  const observed = [...(input.apiSets ?? []), ...input.staticSets];
  const sets: PlannedSet[] = [];
  const keys = new Set<string>();
  for (const o of observed) {
    const p = planSet(o, input.labels);
    // Two static documents with the same name: the second is reported as a spec error.
    if (keys.has(p.key)) {
      p.specErrors = [`metadata.name: another ${p.source} set is already named ${JSON.stringify(p.name)} (${p.origin})`];
      p.selection = 'not-selected';
      p.key = `${p.key}#${sets.length}`;
    }
    keys.add(p.key);
    sets.push(p);
  }

  const wanted = new Map<string, WantedImage>();
  for (const s of sets) {
    // A set with spec errors is not applied; a set with only bad references applies its good ones.
    if (s.selection !== 'selected' || s.specErrors.length > 0) continue;
    for (const ref of s.references) {
      const k = wantedKey(ref.reference, s.runtimeHandler);
      const w = wanted.get(k);
      if (w) w.sets.push(s.key);
      else wanted.set(k, { key: k, reference: ref, runtimeHandler: s.runtimeHandler, sets: [s.key] });
    }
  }

  const retainReasons: string[] = [];
  if (input.apiSets === null) retainReasons.push(input.apiProblem ?? 'the API has not been listed yet');
  if (input.staticProblems.length > 0) retainReasons.push(`${input.staticProblems.length} static file(s) could not be read and what they held is unknown`);
  if (sets.some((s) => s.selection === 'unknown')) retainReasons.push('the node labels are unknown');

  const pins = new Set<string>(input.carriedPins);
  for (const w of wanted.values()) pins.add(w.reference.reference);
  // Kept: the current pins no set asks for, whatever the runtime carries
  // besides (CRI-O's carried pins are in its file, and so in its `pins`
  // count): one definition of what a node's pinsKept counts.
  const asked = new Set([...wanted.values()].map((w) => w.reference.reference));
  const retained: string[] = [];
  if (retainReasons.length > 0) {
    for (const p of new Set(input.currentPins)) {
      pins.add(p);
      if (!asked.has(p)) retained.push(p);
    }
  }
  // Others' pins are carried only while the agent holds pins of its own:
  // with nothing wanted and nothing to keep, it steps out of the way. While
  // the observation is incomplete, a current pin that is also carried still
  // counts as its own (the file that carries it may be what pins it).
  const ownPins = wanted.size > 0 || retained.length > 0 || (retainReasons.length > 0 && input.currentPins.length > 0);
  return {
    sets,
    wanted: [...wanted.values()].sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0)),
    pins: ownPins ? [...pins].sort() : [],
    retained: retained.sort(),
    retainReasons,
    unknownStatic: input.staticProblems.map((p) => p.origin),
  };
}
