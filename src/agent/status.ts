// Per-set status on this node: phases and counts from one reconcile's
// facts (a pure function), and the bounded NodeStatus document. The
// reporter that writes it is ./status-reporter.ts.
import { encodedSize, failureText } from '../api/node-status.ts';
import {
  STATUS_FORMAT_VERSION,
  STATUS_MAX_BYTES,
  STATUS_MAX_ERROR_BYTES,
  STATUS_MAX_MESSAGE_BYTES,
  type NodeSetStatus,
  type NodeStatus,
  type SetPhase,
} from '../api/types.ts';
import type { FailureKind } from '../cri/runtime.ts';
import type { PinStatus } from '../pins/backend.ts';
import type { SlotWait } from '../rollout/gate.ts';
import type { Plan, PlannedSet, WantedImage } from './plan.ts';
import { wantedKey } from './plan.ts';
import type { SetEstimate } from './estimate.ts';
import type { PullFailure } from './puller.ts';

/** What this node remembers per set across reconciles (and restarts, via the annotation). */
export interface SetHistory {
  currentGeneration: number;
  lastFailedGeneration?: number;
  lastFailedGenerationError?: string;
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
}

const PULL_REASON: Record<FailureKind, string> = {
  NotFound: 'ImageNotFound',
  Unauthorized: 'Unauthorized',
  Unavailable: 'RegistryUnavailable',
  NoSpace: 'NoSpace',
  Canceled: 'Pulling',
  Other: 'PullFailed',
};
/** Which failure names the set's reason when several images fail differently. */
const PULL_SEVERITY: FailureKind[] = ['NoSpace', 'Unauthorized', 'NotFound', 'Other', 'Unavailable', 'Canceled'];

/** " (and 2 more problems)": a count, not a list, keeps messages short. */
function more(n: number, one: string, many: string): string {
  return n > 1 ? ` (and ${n - 1} more ${n - 1 === 1 ? one : many})` : '';
}

/** Cut to at most `max` bytes of UTF-8 without splitting a character. */
export function cutBytes(s: string, max: number): string {
  const b = Buffer.from(s, 'utf8');
  if (b.length <= max) return s;
  let end = max - 3;
  while (end > 0 && (b[end]! & 0xc0) === 0x80) end--;
  return b.subarray(0, end).toString('utf8') + '...';
}

function pullMessage(w: WantedImage, f: PullFailure, handler: string): { reason: string; message: string } {
  const ref = w.reference.reference;
  const host = w.reference.host;
  if (f.runtimeDown) return { reason: 'RuntimeUnavailable', message: `the container runtime could not be reached while pulling ${ref}: ${f.message}` };
  if (handler && /runtime.?handler|runtime.?class|handler/i.test(f.message)) {
    return { reason: 'RuntimeHandlerRejected', message: `the runtime rejected runtimeHandler ${JSON.stringify(handler)} for ${ref}: ${f.message}` };
  }
  switch (f.kind) {
    case 'Unauthorized':
      return { reason: 'Unauthorized', message: `registry ${host} refused the credentials for ${ref} (check the entry for ${host} in the auth file): ${f.message}` };
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

function phaseOf(s: PlannedSet, facts: StatusFacts, wanted: Map<string, WantedImage>): { phase: SetPhase; reason: string; message?: string; counts: NodeSetStatus['images'] } {
  const counts = { wanted: s.references.length, present: 0, pinned: 0, failed: 0, invalid: s.invalidImages.length };
  if (s.specErrors.length > 0) {
    return { phase: 'Degraded', reason: 'InvalidSpec', message: `set ${s.name} (${s.origin}) is not applied: ${s.specErrors[0]}${more(s.specErrors.length, 'problem', 'problems')}`, counts };
  }
  if (s.selection === 'unknown') {
    return { phase: 'Progressing', reason: 'WaitingForNodeLabels', message: 'the node labels are not known yet, so the node selector cannot be evaluated', counts };
  }
  const failures: { w: WantedImage; f: PullFailure }[] = [];
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
      failures.push({ w, f });
    }
  }
  const overridden = facts.pins.overridden;
  if (overridden) return { phase: 'Degraded', ...overridden, counts };
  if (s.held) {
    return {
      phase: 'Degraded',
      reason: 'StaticFileUnreadable',
      message: `static file ${s.held.file} cannot be read (${s.held.error}); set ${s.name} keeps the pins of the file's last readable content until the file is readable again or removed from the folder`,
      counts,
    };
  }
  const pinProblem = facts.pins.problemFor(s.references.map((r) => r.reference));
  if (pinProblem) return { phase: 'Degraded', ...pinProblem, counts };
  if (facts.runtimeError) return { phase: 'Degraded', reason: 'RuntimeUnavailable', message: `the container runtime could not be reached: ${facts.runtimeError}`, counts };
  if (counts.invalid > 0) {
    const p = s.invalidImages[0]!;
    return { phase: 'Degraded', reason: 'InvalidReference', message: `${counts.invalid} reference(s) rejected and not pinned, first ${p.field}: ${p.error}`, counts };
  }
  if (failures.length > 0) {
    failures.sort((a, b) => PULL_SEVERITY.indexOf(a.f.kind) - PULL_SEVERITY.indexOf(b.f.kind));
    const { w, f } = failures[0]!;
    const m = pullMessage(w, f, s.runtimeHandler);
    const tail = failures.length > 1 ? ` (${failures.length} of ${counts.wanted} images failing; retrying)` : ' (retrying)';
    return { phase: 'Degraded', reason: m.reason, message: m.message + tail, counts };
  }
  if (counts.present < counts.wanted) {
    const wait = facts.rolloutWaits?.get(s.key);
    if (wait) {
      const why = wait.error
        ? `the rollout slots cannot be taken (retrying): ${wait.error}`
        : `waiting for a rollout slot: at most ${wait.maxConcurrentNodes} node(s) download this set at a time`;
      return { phase: 'Progressing', reason: 'WaitingForRolloutSlot', message: `${why}; ${counts.present} of ${counts.wanted} images present`, counts };
    }
    const unknown = facts.estimates?.get(s.key)?.unknown;
    const unenforced = facts.rolloutUnenforced?.get(s.key);
    const note =
      (unenforced ? `; downloading without a rollout slot, this node may not hold one: ${unenforced}` : '') +
      (unknown ? `; size estimate unknown, so only the watermark was checked: ${unknown}` : '');
    return { phase: 'Progressing', reason: 'Pulling', message: `${counts.present} of ${counts.wanted} images present${note}`, counts };
  }
  if (facts.pins.preloadOnly) {
    return { phase: 'Ready', reason: 'PreloadedNotPinned', message: `all ${counts.wanted} images present; pre-load only, so nothing keeps the kubelet's image garbage collection from removing them`, counts };
  }
  if (notInFile > 0) {
    return { phase: 'Progressing', reason: 'WaitingForPin', message: facts.pins.notHeld(notInFile), counts };
  }
  if (notPinned > 0) {
    return { phase: 'Progressing', reason: 'WaitingForPin', message: facts.pins.notPinned(notPinned), counts };
  }
  return { phase: 'Ready', reason: 'AllImagesPinned', counts };
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
      phase,
      reason,
      ...(message ? { message } : {}),
    };
    sets.push(st);
  }
  sets.sort((a, b) => (a.source + a.name < b.source + b.name ? -1 : 1));
  return { sets, history };
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
    ...(status.pinsKept ? { pinsKept: cutBytes(status.pinsKept, SHORT_MESSAGE_BYTES) } : {}),
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
  extra: { imageFilesystemError?: string | null; pins?: number; pinsKept?: string } = {},
): NodeStatus {
  const status: NodeStatus = { version: STATUS_FORMAT_VERSION, node, pinFile, updatedAt, sets };
  if (extra.imageFilesystemError) status.imageFilesystemError = cutBytes(extra.imageFilesystemError, STATUS_MAX_ERROR_BYTES);
  if (extra.pins !== undefined) status.pins = extra.pins;
  if (extra.pinsKept) status.pinsKept = cutBytes(extra.pinsKept, STATUS_MAX_MESSAGE_BYTES);
  return boundedNodeStatus(status);
}
