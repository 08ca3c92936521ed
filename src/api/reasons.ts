// The reasons a set's status on a node can carry, in the order in which
// they win: when several hold for one set at once, the first of them in
// SET_REASONS is the set's reason and decides its phase. docs/status.md's table
// of reasons lists them in this order (a test holds the two together).
//
// Each reason is of one kind: what it keeps from the set. A set's message
// is its reason's, and it also names the most severe Degraded problem of
// every other kind that holds ("...; also NoSpace: needs 1.2 GiB, ..."), so
// one line misleads about neither the images nor their pins. Progress
// (Pulling, WaitingFor...) is not named beside a fault: the image counts
// show it, and the fault's own words matter more in 512 bytes.
//
// Why this order:
// - `set`: a spec that cannot be applied, or labels not known yet, leave
//   nothing else to evaluate; a static file that cannot be read holds the
//   set at its last readable content.
// - the node's configuration voiding pins (a drop-in CRI-O would refuse,
//   which also keeps it from starting; a later drop-in replacing every pin)
//   comes before anything of one set: it reaches every set on the node, it
//   heals only by a fix, and an alert keys on PinsOverridden.
// - then what keeps images from being present, before what keeps present
//   images unprotected: a missing image is missing now, an unprotected one
//   may only go later. Among failed pulls, what a person must fix (the
//   disk, credentials, a wrong digest) before what retries cure (a registry
//   out of reach).
// - a pull secret a set names that cannot be used is the set's own
//   configuration (kind `set`), so a refused pull is named beside it; a
//   credential provider that failed comes before the refusal it likely
//   caused.
// - a pin that failed to apply (file, reload, label) outranks progress: a
//   fault needs a look, progress does not.
// - waiting for the first wave comes before waiting for a slot: the first
//   wave decides when the images may come at all, a slot only how many
//   nodes fetch them at once (a node waits for a slot only for what has
//   landed).
// - RuntimeCannotPin is a standing fact of the node (only an upgrade of the
//   runtime changes it, and the node status says it once, see
//   NodeStatus.cannotPin): it names the set's reason only once nothing else
//   keeps the set's images from being present.
// Adding a reason is one line here, at the place of its severity.
import { cutBytes } from '../util/text.ts';
import type { SetPhase } from './types.ts';

/** What a reason keeps from the set: its spec or source, its images on the node, their pins. */
export type ReasonKind = 'set' | 'images' | 'pins';

export const SET_REASONS = [
  { reason: 'InvalidSpec', phase: 'Degraded', kind: 'set' },
  { reason: 'WaitingForNodeLabels', phase: 'Progressing', kind: 'set' },
  { reason: 'CrioConfigRejected', phase: 'Degraded', kind: 'pins' },
  { reason: 'PinsOverridden', phase: 'Degraded', kind: 'pins' },
  { reason: 'StaticFileUnreadable', phase: 'Degraded', kind: 'set' },
  { reason: 'RuntimeUnavailable', phase: 'Degraded', kind: 'images' },
  { reason: 'InvalidReference', phase: 'Degraded', kind: 'images' },
  { reason: 'PullSecretInvalid', phase: 'Degraded', kind: 'set' },
  { reason: 'NoSpace', phase: 'Degraded', kind: 'images' },
  { reason: 'CredentialProviderFailed', phase: 'Degraded', kind: 'images' },
  { reason: 'Unauthorized', phase: 'Degraded', kind: 'images' },
  { reason: 'ImageNotFound', phase: 'Degraded', kind: 'images' },
  { reason: 'RuntimeHandlerRejected', phase: 'Degraded', kind: 'images' },
  { reason: 'PullFailed', phase: 'Degraded', kind: 'images' },
  { reason: 'RegistryUnavailable', phase: 'Degraded', kind: 'images' },
  { reason: 'PinFileWriteFailed', phase: 'Degraded', kind: 'pins' },
  { reason: 'ReloadFailed', phase: 'Degraded', kind: 'pins' },
  { reason: 'ReloadNotApplied', phase: 'Degraded', kind: 'pins' },
  { reason: 'PinLabelFailed', phase: 'Degraded', kind: 'pins' },
  { reason: 'PinNotReported', phase: 'Degraded', kind: 'pins' },
  { reason: 'WaitingForFirstWave', phase: 'Progressing', kind: 'images' },
  { reason: 'WaitingForRolloutSlot', phase: 'Progressing', kind: 'images' },
  { reason: 'Pulling', phase: 'Progressing', kind: 'images' },
  { reason: 'RuntimeCannotPin', phase: 'Degraded', kind: 'pins' },
  { reason: 'WaitingForPin', phase: 'Progressing', kind: 'pins' },
  { reason: 'PreloadedNotPinned', phase: 'Ready', kind: 'pins' },
  { reason: 'AllImagesPinned', phase: 'Ready', kind: 'pins' },
] as const satisfies readonly { reason: string; phase: SetPhase; kind: ReasonKind }[];

export type SetReason = (typeof SET_REASONS)[number]['reason'];

/** One thing that holds for a set this reconcile: a reason and its message. */
export interface SetProblem {
  reason: SetReason;
  message: string;
}

const RANK = new Map<string, number>(SET_REASONS.map((r, i) => [r.reason, i]));
const BY_REASON = new Map<string, (typeof SET_REASONS)[number]>(SET_REASONS.map((r) => [r.reason, r]));

/** Position in SET_REASONS: lower wins. */
export function severity(reason: SetReason): number {
  return RANK.get(reason)!;
}

export function phaseOfReason(reason: SetReason): SetPhase {
  return BY_REASON.get(reason)!.phase;
}

export function kindOfReason(reason: SetReason): ReasonKind {
  return BY_REASON.get(reason)!.kind;
}

/**
 * Progressing reasons under which a node downloads nothing of the set: it
 * waits for a rollout slot, for a first-wave node to hold the images
 * (spec.rollout.firstWave), or for its labels. The controller's ETA counts
 * such a node as waiting (src/controller/progress.ts), so the agent writes
 * a change from one of them at once (src/agent/status-reporter.ts).
 */
export const DOWNLOAD_WAIT_REASONS: ReadonlySet<string> = new Set(['WaitingForRolloutSlot', 'WaitingForFirstWave', 'WaitingForNodeLabels']);

/** At most this many bytes of each other problem a message names beside its own. */
export const ALSO_MAX_BYTES = 200;

/**
 * The set's reason, phase and message from everything that holds for it
 * (none: Ready, AllImagesPinned): the most severe problem, its message cut
 * so that, within `maxBytes`, it also names the most severe Degraded
 * problem of each other kind.
 */
export function mostSevere(problems: readonly SetProblem[], maxBytes: number): { reason: SetReason; phase: SetPhase; message?: string } {
  if (problems.length === 0) return { reason: 'AllImagesPinned', phase: 'Ready' };
  const ranked = [...problems].sort((a, b) => severity(a.reason) - severity(b.reason));
  const first = ranked[0]!;
  const kind = kindOfReason(first.reason);
  const others: SetProblem[] = [];
  for (const p of ranked) {
    const k = kindOfReason(p.reason);
    if (k === kind || phaseOfReason(p.reason) !== 'Degraded' || others.some((o) => kindOfReason(o.reason) === k)) continue;
    others.push(p);
  }
  const also = others.map((o) => `; also ${o.reason}: ${cutBytes(o.message, ALSO_MAX_BYTES)}`).join('');
  const own = cutBytes(first.message, Math.max(0, maxBytes - Buffer.byteLength(also, 'utf8')));
  return { reason: first.reason, phase: phaseOfReason(first.reason), message: own + also };
}
