// What the controller keeps of each Node: its name, its labels, and of its
// `pinset.dev/status` annotation the fields the roll-up reads. The Node
// cache holds this instead of the object (the list and watch ask for
// metadata only, so status.images, conditions and managedFields never
// arrive; of the metadata only this stays). At 5000 Nodes the annotation as
// text is several KB per node; parsed and kept whole it is more: the
// compact copy drops the image counts, the agent's file name, the time, and
// messages of sets that are not Degraded, and shares the strings every node
// repeats (set names, uids, phases, reasons, common label values).
// BENCHMARKS.md ("Scale") has the figures.
import { readNodeStatus } from '../api/node-status.ts';
import type { KubeObjectLike } from '../api/list-watch.ts';
import type { ObservedNode, ReportReading, SetReport } from './rollup.ts';

/** A Node as the controller's cache holds it. */
export interface ObservedNodeEntry extends ObservedNode {
  metadata: { name: string; resourceVersion?: string };
}

/**
 * One copy of each string many nodes repeat. Bounded: past `max` distinct
 * strings it starts over (hand-edited annotations could bring any number).
 */
export class StringPool {
  readonly #strings = new Map<string, string>();
  readonly #max: number;
  constructor(max = 50_000) {
    this.#max = max;
  }
  get size(): number {
    return this.#strings.size;
  }
  intern(s: string): string {
    const had = this.#strings.get(s);
    if (had !== undefined) return had;
    if (this.#strings.size >= this.#max) this.#strings.clear();
    this.#strings.set(s, s);
    return s;
  }
}

/** Label values longer than this are kept as they come (a hostname, a unique id: nothing to share). */
const MAX_SHARED_LABEL_VALUE = 63;

function compactEntry(e: SetReport, pool: StringPool): SetReport {
  const out: SetReport = {
    name: pool.intern(e.name),
    source: e.source === 'static' ? 'static' : 'api',
    desiredGeneration: e.desiredGeneration,
    currentGeneration: e.currentGeneration,
    phase: pool.intern(e.phase) as SetReport['phase'],
    reason: pool.intern(e.reason),
  };
  if (e.uid !== undefined) out.uid = pool.intern(e.uid);
  // The roll-up quotes these only for a Degraded node (status.degradedNodes).
  if (e.phase === 'Degraded') {
    if (e.message !== undefined) out.message = e.message;
    if (e.lastFailedGenerationError !== undefined) out.lastFailedGenerationError = e.lastFailedGenerationError;
  }
  return out;
}

/** The roll-up's view of a status annotation's value. Never throws. */
export function compactReading(annotations: Readonly<Record<string, string>> | undefined, pool: StringPool): ReportReading {
  const reading = readNodeStatus(annotations);
  if (reading.error !== undefined) return { error: reading.error };
  if (!reading.status) return {};
  return { status: { sets: reading.status.sets.map((e) => compactEntry(e, pool)) } };
}

/** What the cache keeps of a Node read from the API (metadata only or whole). */
export function observeNode(obj: KubeObjectLike, pool: StringPool): ObservedNodeEntry {
  const meta = (obj.metadata ?? {}) as { name?: string; resourceVersion?: string; labels?: Record<string, string>; annotations?: Record<string, string> };
  const name = meta.name ?? '';
  const labels: Record<string, string> = {};
  for (const [k, v] of Object.entries(meta.labels ?? {})) labels[k] = typeof v === 'string' && v.length <= MAX_SHARED_LABEL_VALUE ? pool.intern(v) : v;
  return {
    metadata: { name, resourceVersion: meta.resourceVersion },
    name,
    labels,
    reading: compactReading(meta.annotations, pool),
  };
}

export function sameLabels(a: Readonly<Record<string, string>>, b: Readonly<Record<string, string>>): boolean {
  const ak = Object.keys(a);
  return ak.length === Object.keys(b).length && ak.every((k) => Object.prototype.hasOwnProperty.call(b, k) && a[k] === b[k]);
}

function sameEntry(a: SetReport, b: SetReport): boolean {
  return (
    a.name === b.name &&
    a.uid === b.uid &&
    a.source === b.source &&
    a.desiredGeneration === b.desiredGeneration &&
    a.currentGeneration === b.currentGeneration &&
    a.phase === b.phase &&
    a.reason === b.reason &&
    a.message === b.message &&
    a.lastFailedGenerationError === b.lastFailedGenerationError
  );
}

/**
 * Names of the sets whose entries differ between two readings of one node,
 * or undefined when the change concerns every set (the annotation became
 * readable or unreadable).
 */
export function changedSetNames(a: ReportReading, b: ReportReading): Set<string> | undefined {
  if (a.error !== b.error || (a.status === undefined) !== (b.status === undefined)) return undefined;
  const changed = new Set<string>();
  const as = a.status?.sets ?? [];
  const bs = b.status?.sets ?? [];
  const byName = (list: readonly SetReport[]) => {
    const m = new Map<string, SetReport[]>();
    for (const e of list) m.set(e.name, [...(m.get(e.name) ?? []), e]);
    return m;
  };
  const am = byName(as);
  const bm = byName(bs);
  for (const name of new Set([...am.keys(), ...bm.keys()])) {
    const x = am.get(name) ?? [];
    const y = bm.get(name) ?? [];
    if (x.length !== y.length || x.some((e, i) => !sameEntry(e, y[i]!))) changed.add(name);
  }
  return changed;
}
