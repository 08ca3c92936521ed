// The roll-up: from the sets' specs and what each Node reports in its
// `pinset.dev/status` annotation, the status of one PinnedImageSet. A pure
// function (no I/O, the clock is an argument) so it can be read and tested
// alone; src/controller/controller.ts feeds it from the informers' caches.
// Beside the status it sums the set's download across its nodes
// (./progress.ts fleetWork), which the controller turns into
// status.progress with its window of earlier observations.
import { selectorErrors, selectorMatches } from '../api/selector.ts';
import { fleetWork, type FleetWork, type NodeProgressInput } from './progress.ts';
import {
  STATUS_MAX_ERROR_BYTES,
  type Condition,
  type DegradedNode,
  type NodeSetStatus,
  type PinnedImageSet,
  type PinnedImageSetStatus,
} from '../api/types.ts';

/** At most this many entries in status.degradedNodes, so the object stays small in a large cluster. */
export const MAX_DEGRADED_NODES = 10;
/** Node names listed in the Degraded condition's message. */
const NAMES_IN_MESSAGE = 3;

/** What the roll-up reads of a node's entry for one set. */
export type SetReport = Pick<
  NodeSetStatus,
  'name' | 'uid' | 'source' | 'desiredGeneration' | 'currentGeneration' | 'phase' | 'reason' | 'message' | 'lastFailedGenerationError' | 'bytes' | 'rate' | 'pullRate' | 'mirrored'
> &
  Partial<Pick<NodeSetStatus, 'images'>>;

/**
 * What the roll-up reads of a node's report: a NodeStatusReading
 * (readNodeStatus), or the controller's compact copy of one
 * (./observed-nodes.ts).
 */
export interface ReportReading {
  status?: { sets: readonly SetReport[] };
  /** Why the annotation could not be read (the node counts as not reporting). */
  error?: string;
}

export interface ObservedNode {
  name: string;
  labels: Readonly<Record<string, string>>;
  /** The node's parsed status annotation. */
  reading: ReportReading;
}

export const CONDITION_READY = 'Ready';
export const CONDITION_PROGRESSING = 'Progressing';
export const CONDITION_DEGRADED = 'Degraded';

export const REASON = {
  AllNodesReady: 'AllNodesReady',
  NodesProgressing: 'NodesProgressing',
  NodesDegraded: 'NodesDegraded',
  NoNodesDegraded: 'NoNodesDegraded',
  NoNodesSelected: 'NoNodesSelected',
  InvalidSpec: 'InvalidSpec',
} as const;

/**
 * The entry in a node's report that belongs to `set`. Entries for static
 * (node-local) sets are never API objects and do not count. When the entry
 * carries a uid it must be this object's uid: a set deleted and created again
 * under the same name is a new object whose nodes have not reported yet.
 */
export function reportFor(reading: ReportReading, set: Pick<PinnedImageSet, 'metadata'>): SetReport | undefined {
  const uid = set.metadata.uid;
  for (const entry of reading.status?.sets ?? []) {
    if (entry.source === 'static' || entry.name !== set.metadata.name) continue;
    if (entry.uid && uid && entry.uid !== uid) continue;
    return entry;
  }
  return undefined;
}

/** metav1.Time is RFC 3339 with whole seconds. */
export function metaTime(now: Date): string {
  return now.toISOString().replace(/\.\d+Z$/, 'Z');
}

/** Cut to at most `max` bytes of UTF-8 without splitting a character. */
export function cutBytes(s: string, max: number): string {
  if (Buffer.byteLength(s, 'utf8') <= max) return s;
  const suffix = '…';
  let out = '';
  let bytes = Buffer.byteLength(suffix, 'utf8');
  for (const ch of s) {
    const n = Buffer.byteLength(ch, 'utf8');
    if (bytes + n > max) break;
    out += ch;
    bytes += n;
  }
  return out + suffix;
}

/** The node's verdict, with its entry when that is about the set's current generation. */
type Verdict = ({ kind: 'ready' } | { kind: 'progressing'; unreported: boolean } | { kind: 'degraded'; node: DegradedNode }) & { current?: SetReport };

function judge(nodeName: string, reading: ReportReading, set: PinnedImageSet, generation: number): Verdict {
  // No annotation, or one that cannot be read: the node has not told us
  // anything about this generation yet.
  const entry = reportFor(reading, set);
  if (!entry) return { kind: 'progressing', unreported: true };
  // The agent has not seen the current spec yet; what it says about an older
  // generation (even a failure) says nothing about this one.
  if (entry.desiredGeneration < generation) return { kind: 'progressing', unreported: false };
  if (entry.phase === 'Degraded') {
    const reason = entry.reason || 'Degraded';
    const message = entry.lastFailedGenerationError || entry.message || '';
    return { kind: 'degraded', node: { name: nodeName, reason, message: cutBytes(message, STATUS_MAX_ERROR_BYTES) }, current: entry };
  }
  if (entry.phase === 'Ready' && entry.currentGeneration >= generation) return { kind: 'ready', current: entry };
  return { kind: 'progressing', unreported: false, current: entry };
}

/** What the set's progress (./progress.ts) reads of one node the set selects: the verdict, and the entry when it is about the current generation. */
export function progressInput(reading: ReportReading, set: PinnedImageSet): NodeProgressInput {
  const v = judge('', reading, set, set.metadata.generation ?? 0);
  return { verdict: v.kind, ...(v.current ? { entry: v.current } : {}) };
}

function plural(n: number, one: string, many: string): string {
  return `${n} ${n === 1 ? one : many}`;
}

function condition(
  type: string,
  status: Condition['status'],
  reason: string,
  message: string,
  generation: number,
  now: Date,
  previous: readonly Condition[] | undefined,
): Condition {
  const before = previous?.find((c) => c?.type === type);
  const lastTransitionTime =
    before && before.status === status && typeof before.lastTransitionTime === 'string' && before.lastTransitionTime !== ''
      ? before.lastTransitionTime
      : metaTime(now);
  return { type, status, reason, message, observedGeneration: generation, lastTransitionTime };
}

/**
 * The status of `set` given every node the controller knows. `previous` is the
 * status last written (by default the one on the object); a condition whose
 * status did not change keeps its lastTransitionTime from it.
 */
export function rollUpSetStatus(
  set: PinnedImageSet,
  nodes: readonly ObservedNode[],
  now: Date,
  previous: PinnedImageSetStatus | undefined = set.status,
): PinnedImageSetStatus {
  return rollUp(set, nodes, now, previous).status;
}

export interface RollUp {
  status: PinnedImageSetStatus;
  /** Degraded selected nodes by their reason (all of them, not only those listed in the status). */
  degradedReasons: Map<string, number>;
  /** The set's download summed over the nodes it selects; absent when it selects none (or its selector is invalid). */
  work?: FleetWork;
}

/** The status, and what the metrics show beside it. */
export function rollUp(
  set: PinnedImageSet,
  nodes: readonly ObservedNode[],
  now: Date,
  previous: PinnedImageSetStatus | undefined = set.status,
): RollUp {
  const degradedReasons = new Map<string, number>();
  const progress: NodeProgressInput[] = [];
  const status = computeStatus(set, nodes, now, previous, degradedReasons, progress);
  const images = Array.isArray(set.spec?.pinnedImages) ? set.spec.pinnedImages.length : 0;
  return { status, degradedReasons, ...(progress.length > 0 ? { work: fleetWork(progress, images) } : {}) };
}

function computeStatus(
  set: PinnedImageSet,
  nodes: readonly ObservedNode[],
  now: Date,
  previous: PinnedImageSetStatus | undefined,
  degradedReasons: Map<string, number>,
  progress: NodeProgressInput[],
): PinnedImageSetStatus {
  const generation = set.metadata.generation ?? 0;
  const prevConditions = Array.isArray(previous?.conditions) ? previous.conditions : undefined;
  const cond = (type: string, status: Condition['status'], reason: string, message: string) =>
    condition(type, status, reason, message, generation, now, prevConditions);

  const selector = set.spec?.nodeSelector;
  const problems = selectorErrors(selector);
  if (problems.length > 0) {
    const message = `spec.nodeSelector is invalid, so the set selects no node: ${problems.join('; ')}`;
    return {
      observedGeneration: generation,
      nodes: { matched: 0, ready: 0, progressing: 0, degraded: 0 },
      conditions: [
        cond(CONDITION_READY, 'False', REASON.InvalidSpec, message),
        cond(CONDITION_PROGRESSING, 'False', REASON.InvalidSpec, message),
        cond(CONDITION_DEGRADED, 'True', REASON.InvalidSpec, message),
      ],
    };
  }

  let matched = 0;
  let ready = 0;
  let progressing = 0;
  let unreported = 0;
  const degraded: DegradedNode[] = [];
  for (const node of nodes) {
    if (!selectorMatches(selector, node.labels ?? {})) continue;
    matched++;
    const v = judge(node.name, node.reading, set, generation);
    progress.push({ node: node.name, verdict: v.kind, ...(v.current ? { entry: v.current } : {}) });
    if (v.kind === 'ready') ready++;
    else if (v.kind === 'degraded') {
      degraded.push(v.node);
      degradedReasons.set(v.node.reason, (degradedReasons.get(v.node.reason) ?? 0) + 1);
    }
    else {
      progressing++;
      if (v.unreported) unreported++;
    }
  }
  degraded.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));

  const status: PinnedImageSetStatus = {
    observedGeneration: generation,
    nodes: { matched, ready, progressing, degraded: degraded.length },
    conditions: [],
  };
  if (degraded.length > 0) status.degradedNodes = degraded.slice(0, MAX_DEGRADED_NODES);

  if (matched === 0) {
    // Nothing is missing on any selected node, as for a DaemonSet that
    // schedules no pod; the reason tells a careful reader that the selector
    // matched nothing (often a typo in a label).
    const message = 'the node selector matches no node';
    status.conditions = [
      cond(CONDITION_READY, 'True', REASON.NoNodesSelected, message),
      cond(CONDITION_PROGRESSING, 'False', REASON.NoNodesSelected, message),
      cond(CONDITION_DEGRADED, 'False', REASON.NoNodesSelected, message),
    ];
    return status;
  }

  const summary =
    `${ready} of ${plural(matched, 'selected node', 'selected nodes')} ready for generation ${generation}` +
    (progressing > 0 ? `, ${progressing} progressing` : '') +
    (degraded.length > 0 ? `, ${degraded.length} degraded` : '');

  const readyCond =
    ready === matched
      ? cond(CONDITION_READY, 'True', REASON.AllNodesReady, summary)
      : cond(CONDITION_READY, 'False', degraded.length > 0 ? REASON.NodesDegraded : REASON.NodesProgressing, summary);

  let progressingCond: Condition;
  if (progressing > 0) {
    const detail = unreported > 0 ? ` (${plural(unreported, 'node has', 'nodes have')} not reported on this set yet)` : '';
    progressingCond = cond(
      CONDITION_PROGRESSING,
      'True',
      REASON.NodesProgressing,
      `${progressing} of ${plural(matched, 'selected node', 'selected nodes')} progressing to generation ${generation}${detail}`,
    );
  } else {
    progressingCond = cond(CONDITION_PROGRESSING, 'False', degraded.length > 0 ? REASON.NodesDegraded : REASON.AllNodesReady, summary);
  }

  let degradedCond: Condition;
  if (degraded.length > 0) {
    const names = degraded
      .slice(0, NAMES_IN_MESSAGE)
      .map((d) => `${d.name} (${d.reason})`)
      .join(', ');
    const more = degraded.length > NAMES_IN_MESSAGE ? ` and ${degraded.length - NAMES_IN_MESSAGE} more` : '';
    degradedCond = cond(
      CONDITION_DEGRADED,
      'True',
      REASON.NodesDegraded,
      `${degraded.length} of ${plural(matched, 'selected node', 'selected nodes')} degraded: ${names}${more}`,
    );
  } else {
    degradedCond = cond(CONDITION_DEGRADED, 'False', REASON.NoNodesDegraded, summary);
  }

  status.conditions = [readyCond, progressingCond, degradedCond];
  return status;
}
