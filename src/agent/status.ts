// Per-set status on this node: phases and counts from one reconcile's
// facts (a pure function), and the bounded NodeStatus document. The
// reporter that writes it is ./status-reporter.ts.
//
// A set's bytes and rate are facts too (./set-report.ts counts them); a
// Ready set whose sizes are not known in this process (the agent restarted,
// and a complete set asks the registries nothing) reports the total its
// last report gave at the same generation, kept in its history.
import { encodedSize, failureText } from '../api/node-status.ts';
import {
  STATUS_FORMAT_VERSION,
  STATUS_MAX_BYTES,
  STATUS_MAX_ERROR_BYTES,
  STATUS_MAX_MESSAGE_BYTES,
  type NodeRuntime,
  type NodeSetStatus,
  type KubeletVerificationStatus,
  type NodeStatus,
  type SetPhase,
} from '../api/types.ts';
import { mostSevere, severity, type SetProblem, type SetReason } from '../api/reasons.ts';
import type { FailureKind } from '../cri/runtime.ts';
import type { PinStatus } from '../pins/backend.ts';
import type { SetWave } from '../rollout/first-wave.ts';
import type { SlotWait } from '../rollout/gate.ts';
import type { Plan, PlannedSet, WantedImage } from './plan.ts';
import { wantedKey } from './plan.ts';
import type { SetEstimate } from './estimate.ts';
import type { PullFailure } from './puller.ts';
import { cutBytes } from '../util/text.ts';

export { cutBytes };

/** What this node remembers per set across reconciles (and restarts, via the annotation). */
export interface SetHistory {
  currentGeneration: number;
  lastFailedGeneration?: number;
  lastFailedGenerationError?: string;
  /** The set's total bytes when it was last Ready, at that generation (and uid). */
  readyBytes?: { total: number; generation: number; uid?: string };
}

export interface StatusFacts {
  plan: Plan;
  /** What the pin backend holds and why pins are not in effect (src/pins/backend.ts). */
  pins: PinStatus;
  /** Whether the runtime holds an image (for its handler). */
  present: (w: WantedImage) => boolean;
  /** The runtime's pinned flag; undefined when the runtime does not report pins. */
  pinnedByRuntime: (w: WantedImage) => boolean | undefined;
  failure: (key: string) => PullFailure | undefined;
  /** The runtime could not be asked what it holds. */
  runtimeError?: string;
  history: ReadonlyMap<string, SetHistory>;
  /** Per set key: the disk estimate of its images still to download (see ./estimate.ts). */
  estimates?: ReadonlyMap<string, SetEstimate>;
  /** Per set key: the set's downloads wait for a rollout slot (spec.rollout.maxConcurrentNodes, src/rollout/gate.ts). */
  rolloutWaits?: ReadonlyMap<string, SlotWait>;
  /** Per set key: the set downloads without a rollout slot because this node may not hold one, and why. */
  rolloutUnenforced?: ReadonlyMap<string, string>;
  /** Per set key: the set's first wave (spec.rollout.firstWave, src/rollout/first-wave.ts) as this node sees it. */
  firstWaves?: ReadonlyMap<string, SetWave>;
  /** Per set key: a pull secret of the set that cannot be used (missing, of another type, malformed), named with why. */
  pullSecretProblems?: ReadonlyMap<string, string>;
  /** Per set key: its bytes on this node (src/api/set-bytes.ts), where the sizes of all its images are known. */
  bytes?: ReadonlyMap<string, { present: number; total: number }>;
  /** Per set key: bytes per second arriving, while it downloads. */
  rates?: ReadonlyMap<string, number>;
  /** Per set key: its bytes per second over the seconds a pull of it ran (SetRates.pullRate). */
  pullRates?: ReadonlyMap<string, number>;
  /** Set keys whose every image the node fetches through a mirror first (src/registry/client.ts throughMirror). */
  mirrored?: ReadonlySet<string>;
}

const PULL_REASON: Record<FailureKind, SetReason> = {
  NotFound: 'ImageNotFound',
  Unauthorized: 'Unauthorized',
  Unavailable: 'RegistryUnavailable',
  NoSpace: 'NoSpace',
  Canceled: 'Pulling',
  Other: 'PullFailed',
};

/** " (and 2 more problems)": a count, not a list, keeps messages short. */
function more(n: number, one: string, many: string): string {
  return n > 1 ? ` (and ${n - 1} more ${n - 1 === 1 ? one : many})` : '';
}

function pullMessage(w: WantedImage, f: PullFailure, handler: string): SetProblem {
  const ref = w.reference.reference;
  const host = w.reference.host;
  if (f.runtimeDown) return { reason: 'RuntimeUnavailable', message: `the container runtime could not be reached while pulling ${ref}: ${f.message}` };
  // A refusal after a credential provider failed: the provider is the likelier cause than the registry.
  if (f.credentialFailure && (f.kind === 'Unauthorized' || f.kind === 'NotFound')) {
    return { reason: 'CredentialProviderFailed', message: `${f.credentialFailure}; pulling ${ref} without its credentials failed: ${f.message}` };
  }
  if (handler && /runtime.?handler|runtime.?class|handler/i.test(f.message)) {
    return { reason: 'RuntimeHandlerRejected', message: `the runtime rejected runtimeHandler ${JSON.stringify(handler)} for ${ref}: ${f.message}` };
  }
  switch (f.kind) {
    case 'Unauthorized':
      return { reason: 'Unauthorized', message: `registry ${host} refused the credentials for ${ref} (check the credentials for ${host}: the set's pull secrets, the auth file, the credential providers): ${f.message}` };
    case 'NotFound':
      return { reason: 'ImageNotFound', message: `registry ${host} has no image ${ref}: ${f.message}` };
    case 'Unavailable':
      return { reason: 'RegistryUnavailable', message: `registry ${host} could not be reached for ${ref}: ${f.message}` };
    case 'NoSpace':
      return { reason: 'NoSpace', message: `no space left on the image filesystem while pulling ${ref}: ${f.message}` };
    default:
      return { reason: PULL_REASON[f.kind], message: `pulling ${ref} failed: ${f.message}` };
  }
}

type SetOutcome = { phase: SetPhase; reason: string; message?: string; counts: NodeSetStatus['images'] };

/**
 * A set's phase, reason and message: everything that holds for it this
 * reconcile, ranked by src/api/reasons.ts (the most severe names the
 * reason; the message names the worst of each other kind too).
 */
function phaseOf(s: PlannedSet, facts: StatusFacts, wanted: Map<string, WantedImage>): SetOutcome {
  const counts = { wanted: s.references.length, present: 0, pinned: 0, failed: 0, invalid: s.invalidImages.length };
  // Nothing else is evaluated for these two: the set is not applied, or not known to select the node.
  if (s.specErrors.length > 0) {
    return { phase: 'Degraded', reason: 'InvalidSpec', message: `set ${s.name} (${s.origin}) is not applied: ${s.specErrors[0]}${more(s.specErrors.length, 'problem', 'problems')}`, counts };
  }
  if (s.selection === 'unknown') {
    return { phase: 'Progressing', reason: 'WaitingForNodeLabels', message: 'the node labels are not known yet, so the node selector cannot be evaluated', counts };
  }
  const failures: SetProblem[] = [];
  let notPinned = 0;
  // Ready means present and in the pin file: an image outside the file is not pinned.
  let notInFile = 0;
  for (const r of s.references) {
    const w = wanted.get(wantedKey(r.reference, s.runtimeHandler));
    if (!w) continue;
    const present = facts.runtimeError === undefined && facts.present(w);
    if (present) counts.present++;
    const inFile = facts.pins.holds(r.reference);
    const reported = facts.pinnedByRuntime(w);
    if (inFile && (reported === undefined || reported || !present)) counts.pinned++;
    if (inFile && present && reported === false) notPinned++;
    if (present && !inFile) notInFile++;
    const f = present ? undefined : facts.failure(w.key);
    if (f && f.kind !== 'Canceled') {
      counts.failed++;
      failures.push(pullMessage(w, f, s.runtimeHandler));
    }
  }

  const holds: SetProblem[] = [];
  const pins = facts.pins;
  if (pins.overridden) holds.push(pins.overridden);
  if (s.held) {
    holds.push({
      reason: 'StaticFileUnreadable',
      message: `static file ${s.held.file} cannot be read (${s.held.error}); set ${s.name} keeps the pins of the file's last readable content until the file is readable again or removed from the folder`,
    });
  }
  const pinProblem = pins.problemFor(s.references.map((r) => r.reference));
  if (pinProblem) holds.push(pinProblem);
  if (facts.runtimeError) holds.push({ reason: 'RuntimeUnavailable', message: `the container runtime could not be reached: ${facts.runtimeError}` });
  if (counts.invalid > 0) {
    const p = s.invalidImages[0]!;
    holds.push({ reason: 'InvalidReference', message: `${counts.invalid} reference(s) rejected and not pinned, first ${p.field}: ${p.error}` });
  }
  const secretProblem = facts.pullSecretProblems?.get(s.key);
  if (secretProblem) holds.push({ reason: 'PullSecretInvalid', message: `${secretProblem}; ${counts.present} of ${counts.wanted} images present, pins kept` });
  if (failures.length > 0) {
    const worst = failures.reduce((a, b) => (severity(b.reason) < severity(a.reason) ? b : a));
    const tail = failures.length > 1 ? ` (${failures.length} of ${counts.wanted} images failing; retrying)` : ' (retrying)';
    holds.push({ reason: worst.reason, message: worst.message + tail });
  }
  const allPresent = counts.present === counts.wanted;
  const wave = facts.firstWaves?.get(s.key);
  if (!allPresent && wave && wave.waitingFor.length > 0) {
    holds.push({ reason: 'WaitingForFirstWave', message: `${waveMessage(wave)}; ${counts.present} of ${counts.wanted} images present` });
  } else if (!allPresent) {
    const wait = facts.rolloutWaits?.get(s.key);
    if (wait) {
      const why = wait.error
        ? `the rollout slots cannot be taken (retrying): ${wait.error}`
        : `waiting for a rollout slot: at most ${wait.maxConcurrentNodes} node(s) download this set at a time`;
      holds.push({ reason: 'WaitingForRolloutSlot', message: `${why}; ${counts.present} of ${counts.wanted} images present` });
    } else {
      const unknown = facts.estimates?.get(s.key)?.unknown;
      const unenforced = facts.rolloutUnenforced?.get(s.key);
      const note =
        (wave ? `; ${waveNote(wave)}` : '') +
        (unenforced ? `; downloading without a rollout slot, this node may not hold one: ${unenforced}` : '') +
        (unknown ? `; size estimate unknown, so only the watermark was checked: ${unknown}` : '');
      holds.push({ reason: 'Pulling', message: `${counts.present} of ${counts.wanted} images present${note}` });
    }
  }
  if (pins.cannotPin) {
    // "Pre-loaded" only when it is so; beside another problem, only why this node cannot pin.
    holds.push({
      reason: 'RuntimeCannotPin',
      message: allPresent
        ? `${counts.present} of ${counts.wanted} images present (pre-loaded) but not pinned: ${pins.cannotPin}; nothing keeps the kubelet's image garbage collection from removing them`
        : pins.cannotPin,
    });
  } else if (pins.preloadOnly && allPresent) {
    holds.push({ reason: 'PreloadedNotPinned', message: `all ${counts.wanted} images present; pre-load only, so nothing keeps the kubelet's image garbage collection from removing them` });
  }
  if (!pins.preloadOnly) {
    if (notInFile > 0) holds.push({ reason: 'WaitingForPin', message: pins.notHeld(notInFile) });
    else if (notPinned > 0) holds.push({ reason: 'WaitingForPin', message: pins.notPinned(notPinned) });
  }
  const { phase, reason, message } = mostSevere(holds, STATUS_MAX_MESSAGE_BYTES);
  return { phase, reason, ...(message !== undefined ? { message } : {}), counts };
}

/** Who is in the first wave, for a message: at most three names. */
function waveMembers(wave: SetWave): string {
  if (wave.members.length === 0) return 'no node has taken a first-wave seat yet';
  const shown = wave.members.slice(0, 3).join(', ');
  return `first wave: ${shown}${wave.members.length > 3 ? ` and ${wave.members.length - 3} more` : ''}`;
}

/** Why this node's downloads wait for the first wave. */
function waveMessage(wave: SetWave): string {
  const why = wave.error ? ` (this node's attempts at a first-wave seat fail, retrying: ${wave.error})` : '';
  return `waiting for the first wave to fetch ${wave.waitingFor.length} image(s) before this node pulls them: ${wave.landed} of ${wave.images} landed (${waveMembers(wave)})${why}`;
}

/** What the first wave means for a set this node downloads. */
function waveNote(wave: SetWave): string {
  if (wave.member) return `in the first wave: fetching the images for the other nodes (${waveMembers(wave)})`;
  if (wave.forbidden) return `not waiting for the first wave, this node may not use its Leases: ${wave.forbidden}`;
  if (wave.stalled) return `not waiting for the first wave any more: it landed nothing new for a long while (${wave.landed} of ${wave.images} landed)`;
  return `${wave.landed} of ${wave.images} images landed by the first wave (${waveMembers(wave)})`;
}

/**
 * Status of every set that selects this node (or might: labels unknown),
 * and the updated history. Pure.
 */
export function computeSetStatuses(facts: StatusFacts): { sets: NodeSetStatus[]; history: Map<string, SetHistory> } {
  const wanted = new Map(facts.plan.wanted.map((w) => [w.key, w]));
  const history = new Map<string, SetHistory>();
  const sets: NodeSetStatus[] = [];
  for (const s of facts.plan.sets) {
    if (s.selection === 'not-selected' && s.specErrors.length === 0) continue;
    const { phase, reason, message: fullMessage, counts } = phaseOf(s, facts, wanted);
    const message = fullMessage === undefined ? undefined : cutBytes(fullMessage, STATUS_MAX_MESSAGE_BYTES);
    const estimated = phase === 'Ready' ? undefined : facts.estimates?.get(s.key)?.bytes;
    const prev = facts.history.get(s.key) ?? { currentGeneration: 0 };
    const h: SetHistory = { ...prev };
    if (phase === 'Ready') h.currentGeneration = s.generation;
    const bytes = phase === 'Ready' ? readyBytes(s, facts.bytes?.get(s.key), h) : facts.bytes?.get(s.key);
    const rate = phase === 'Ready' ? undefined : facts.rates?.get(s.key);
    const pullRate = phase === 'Ready' ? undefined : facts.pullRates?.get(s.key);
    const mirrored = phase !== 'Ready' && facts.mirrored?.has(s.key) === true;
    if (phase === 'Degraded') {
      h.lastFailedGeneration = s.generation;
      h.lastFailedGenerationError = cutBytes(failureText(reason, message), STATUS_MAX_ERROR_BYTES);
    }
    history.set(s.key, h);
    const st: NodeSetStatus = {
      name: s.name,
      ...(s.uid ? { uid: s.uid } : {}),
      source: s.source,
      desiredGeneration: s.generation,
      currentGeneration: h.currentGeneration,
      ...(h.lastFailedGeneration !== undefined ? { lastFailedGeneration: h.lastFailedGeneration, lastFailedGenerationError: h.lastFailedGenerationError } : {}),
      images: counts,
      ...(estimated !== undefined ? { estimatedBytes: estimated } : {}),
      ...(bytes ? { bytes } : {}),
      ...(rate !== undefined ? { rate } : {}),
      ...(pullRate !== undefined ? { pullRate } : {}),
      ...(mirrored ? { mirrored } : {}),
      phase,
      reason,
      ...(message ? { message } : {}),
    };
    sets.push(st);
  }
  sets.sort((a, b) => (a.source + a.name < b.source + b.name ? -1 : 1));
  return { sets, history };
}

/**
 * A Ready set's bytes: all present, of the total counted now, or else of
 * the one its history keeps for this generation; recorded in `h`.
 */
function readyBytes(s: PlannedSet, counted: { present: number; total: number } | undefined, h: SetHistory): { present: number; total: number } | undefined {
  const kept = h.readyBytes;
  const total = counted?.total ?? (kept && kept.generation === s.generation && kept.uid === s.uid ? kept.total : undefined);
  if (total === undefined) return undefined;
  h.readyBytes = { total, generation: s.generation, ...(s.uid ? { uid: s.uid } : {}) };
  return { present: total, total };
}

/** Messages are cut to this when the whole document would not fit. */
const SHORT_MESSAGE_BYTES = 160;

function shortened(s: NodeSetStatus): NodeSetStatus {
  const message = s.message === undefined ? undefined : cutBytes(s.message, SHORT_MESSAGE_BYTES);
  let error = s.lastFailedGenerationError;
  // A set failing now carries its error as its message (version 2 writes it once): keep them one.
  if (error !== undefined) error = error === failureText(s.reason, s.message) ? failureText(s.reason, message) : cutBytes(error, SHORT_MESSAGE_BYTES);
  return { ...s, ...(message !== undefined ? { message } : {}), ...(error !== undefined ? { lastFailedGenerationError: error } : {}) };
}

/**
 * The annotation document, cut to `maxBytes` as written (version 2):
 * messages first, then whole sets (Degraded ones kept first, then
 * Progressing, then Ready).
 */
export function boundedNodeStatus(status: NodeStatus, maxBytes = STATUS_MAX_BYTES): NodeStatus {
  const size = encodedSize;
  if (size(status) <= maxBytes) return status;
  const short: NodeStatus = {
    ...status,
    sets: status.sets.map(shortened),
    ...(status.imageFilesystemError ? { imageFilesystemError: cutBytes(status.imageFilesystemError, SHORT_MESSAGE_BYTES) } : {}),
    ...(status.cannotPin ? { cannotPin: cutBytes(status.cannotPin, SHORT_MESSAGE_BYTES) } : {}),
    ...(status.pinsKept ? { pinsKept: cutBytes(status.pinsKept, SHORT_MESSAGE_BYTES) } : {}),
    ...(status.kubeletVerification ? { kubeletVerification: { ...status.kubeletVerification, source: cutBytes(status.kubeletVerification.source, SHORT_MESSAGE_BYTES) } } : {}),
  };
  if (size(short) <= maxBytes) return short;
  // Keep the sets an operator must look at: Degraded, then Progressing, then Ready.
  const order: Record<SetPhase, number> = { Degraded: 0, Progressing: 1, Ready: 2 };
  const ranked = [...short.sets].sort((a, b) => order[a.phase] - order[b.phase]);
  const kept: NodeSetStatus[] = [];
  const out: NodeStatus = { ...short, sets: kept, truncated: true };
  for (const s of ranked) {
    kept.push(s);
    if (size(out) > maxBytes) {
      kept.pop();
      break;
    }
  }
  return out;
}

/** History as remembered in a previous annotation (so a restart keeps currentGeneration). */
export function historyFromStatus(status: NodeStatus | null): Map<string, SetHistory> {
  const h = new Map<string, SetHistory>();
  for (const s of status?.sets ?? []) {
    h.set(`${s.source}/${s.name}`, {
      currentGeneration: s.currentGeneration ?? 0,
      ...(s.lastFailedGeneration !== undefined ? { lastFailedGeneration: s.lastFailedGeneration, lastFailedGenerationError: s.lastFailedGenerationError } : {}),
      ...(s.phase === 'Ready' && s.bytes ? { readyBytes: { total: s.bytes.total, generation: s.desiredGeneration, ...(s.uid ? { uid: s.uid } : {}) } } : {}),
    });
  }
  return h;
}

/**
 * What the node status says of pins no set asks for: how many are kept and
 * why (the plan's reasons for an incomplete observation); undefined when
 * none is kept.
 */
export function pinsKeptMessage(plan: Pick<Plan, 'retained' | 'retainReasons'>): string | undefined {
  if (plan.retained.length === 0) return undefined;
  return `${plan.retained.length} pin(s) kept that no set asks for now: ${plan.retainReasons.join('; ')}`;
}

export function makeNodeStatus(
  node: string,
  pinFile: string,
  sets: NodeSetStatus[],
  updatedAt: string,
  extra: { imageFilesystemError?: string | null; cannotPin?: string; pins?: number; pinsKept?: string; kubeletVerification?: KubeletVerificationStatus; runtime?: NodeRuntime } = {},
): NodeStatus {
  const status: NodeStatus = { version: STATUS_FORMAT_VERSION, node, pinFile, updatedAt, sets };
  if (extra.imageFilesystemError) status.imageFilesystemError = cutBytes(extra.imageFilesystemError, STATUS_MAX_ERROR_BYTES);
  // Said once for the node, bounded like the other node-wide text.
  if (extra.cannotPin) status.cannotPin = cutBytes(extra.cannotPin, STATUS_MAX_ERROR_BYTES);
  if (extra.pins !== undefined) status.pins = extra.pins;
  if (extra.pinsKept) status.pinsKept = cutBytes(extra.pinsKept, STATUS_MAX_MESSAGE_BYTES);
  if (extra.kubeletVerification) status.kubeletVerification = { ...extra.kubeletVerification, source: cutBytes(extra.kubeletVerification.source, STATUS_MAX_ERROR_BYTES) };
  if (extra.runtime) status.runtime = extra.runtime.problem ? { ...extra.runtime, problem: cutBytes(extra.runtime.problem, STATUS_MAX_ERROR_BYTES) } : extra.runtime;
  return boundedNodeStatus(status);
}
