// What the controller keeps of each Node: its name, its labels, and of its
// `pinset.dev/status` annotation the fields the roll-up reads. The Node
// cache holds this instead of the object (the list and watch ask for
// metadata only, so status.images and conditions never arrive; of the
// metadata only this stays, not managedFields nor other annotations). The
// compact copy drops the agent's file name, the time, and messages of sets
// that are not Degraded, keeps the counts and bytes the set's progress is
// summed from (./progress.ts), and shares what nodes repeat: set entries
// (every node done with a set has the same), whole lists of them, label
// values. Measured by
// bench/node-cache-heap.ts (BENCHMARKS.md, "Scale: 5000 Nodes"): at 5000
// Nodes the whole Nodes took 126 MB of heap, their metadata 16 MB, the
// annotation parsed whole with the labels 19 MB, its text with the labels
// 8 MB (to be parsed again at every roll-up), and this copy 2.5 MB.
import { readNodeStatus } from '../api/node-status.ts';
import type { KubeObjectLike } from '../api/list-watch.ts';
import type { ObservedNode, ReportReading, SetReport } from './rollup.ts';

/** A Node as the controller's cache holds it. */
export interface ObservedNodeEntry extends ObservedNode {
  metadata: { name: string; resourceVersion?: string };
}

/**
 * One copy of each value many nodes repeat: strings (label values, set
 * names, uids, reasons), set entries (a set's entry is the same on every
 * node that has reached the same generation the same way) and whole lists
 * of entries (nodes selected by the same sets in the same state share one).
 * Shared values are frozen: nothing may change them in place. Bounded: past
 * `max` distinct values of a kind that kind starts over (hand-edited
 * annotations could bring any number); values already handed out stay valid.
 */
export class SharedValues {
  readonly #strings = new Map<string, string>();
  readonly #entries = new Map<string, SetReport>();
  readonly #lists = new Map<string, readonly SetReport[]>();
  /** The key each shared entry was stored under. */
  readonly #entryKeys = new WeakMap<SetReport, string>();
  readonly #max: number;
  constructor(max = 50_000) {
    this.#max = max;
  }
  get size(): { strings: number; entries: number; lists: number } {
    return { strings: this.#strings.size, entries: this.#entries.size, lists: this.#lists.size };
  }
  #put<V>(map: Map<string, V>, key: string, value: V): V {
    if (map.size >= this.#max) map.clear();
    map.set(key, value);
    return value;
  }
  string(s: string): string {
    return this.#strings.get(s) ?? this.#put(this.#strings, s, s);
  }
  entry(e: SetReport): SetReport {
    const key = JSON.stringify([e.name, e.uid, e.source, e.desiredGeneration, e.currentGeneration, e.phase, e.reason, e.message, e.lastFailedGenerationError, e.images, e.bytes, e.rate, e.pullRate, e.mirrored]);
    const had = this.#entries.get(key);
    if (had) return had;
    const shared = Object.freeze({ ...e });
    this.#entryKeys.set(shared, key);
    return this.#put(this.#entries, key, shared);
  }
  entries(list: readonly SetReport[]): readonly SetReport[] {
    const shared = list.map((e) => this.entry(e));
    const key = shared.map((e) => this.#entryKeys.get(e)).join('\n');
    return this.#lists.get(key) ?? this.#put(this.#lists, key, Object.freeze(shared));
  }
}

/** Label values longer than this are kept as they come (a hostname, a unique id: nothing to share). */
const MAX_SHARED_LABEL_VALUE = 63;

function compactEntry(e: SetReport, shared: SharedValues): SetReport {
  const out: SetReport = {
    name: shared.string(e.name),
    source: e.source === 'static' ? 'static' : 'api',
    desiredGeneration: e.desiredGeneration,
    currentGeneration: e.currentGeneration,
    phase: shared.string(e.phase) as SetReport['phase'],
    reason: shared.string(e.reason),
  };
  if (e.images) out.images = e.images;
  if (e.uid !== undefined) out.uid = shared.string(e.uid);
  if (e.bytes) out.bytes = e.bytes;
  if (e.rate !== undefined) out.rate = e.rate;
  if (e.pullRate !== undefined) out.pullRate = e.pullRate;
  if (e.mirrored === true) out.mirrored = true;
  // The roll-up quotes these only for a Degraded node (status.degradedNodes).
  if (e.phase === 'Degraded') {
    if (e.message !== undefined) out.message = e.message;
    if (e.lastFailedGenerationError !== undefined) out.lastFailedGenerationError = e.lastFailedGenerationError;
  }
  return out;
}

/** The roll-up's view of a status annotation's value. Never throws. */
export function compactReading(annotations: Readonly<Record<string, string>> | undefined, shared: SharedValues): ReportReading {
  const reading = readNodeStatus(annotations);
  if (reading.error !== undefined) return { error: reading.error };
  if (!reading.status) return {};
  return { status: { sets: shared.entries(reading.status.sets.map((e) => compactEntry(e, shared))) } };
}

/** What the cache keeps of a Node read from the API (metadata only or whole). */
export function observeNode(obj: KubeObjectLike, shared: SharedValues): ObservedNodeEntry {
  const meta = (obj.metadata ?? {}) as { name?: string; resourceVersion?: string; labels?: Record<string, string>; annotations?: Record<string, string> };
  const name = meta.name ?? '';
  const labels: Record<string, string> = {};
  for (const [k, v] of Object.entries(meta.labels ?? {})) labels[k] = typeof v === 'string' && v.length <= MAX_SHARED_LABEL_VALUE ? shared.string(v) : v;
  return {
    metadata: { name, resourceVersion: meta.resourceVersion },
    name,
    labels,
    reading: compactReading(meta.annotations, shared),
  };
}

export function sameLabels(a: Readonly<Record<string, string>>, b: Readonly<Record<string, string>>): boolean {
  const ak = Object.keys(a);
  return ak.length === Object.keys(b).length && ak.every((k) => Object.prototype.hasOwnProperty.call(b, k) && a[k] === b[k]);
}

function sameCounts(a: SetReport['images'] | undefined, b: SetReport['images'] | undefined): boolean {
  return a === b || (a !== undefined && b !== undefined && a.wanted === b.wanted && a.present === b.present && a.pinned === b.pinned && a.failed === b.failed && a.invalid === b.invalid);
}

function sameEntry(a: SetReport, b: SetReport): boolean {
  return (
    a === b ||
    a.name === b.name &&
    a.uid === b.uid &&
    a.source === b.source &&
    a.desiredGeneration === b.desiredGeneration &&
    a.currentGeneration === b.currentGeneration &&
    a.phase === b.phase &&
    a.reason === b.reason &&
    a.message === b.message &&
    a.lastFailedGenerationError === b.lastFailedGenerationError &&
    sameCounts(a.images, b.images) &&
    a.bytes?.present === b.bytes?.present &&
    a.bytes?.total === b.bytes?.total &&
    a.rate === b.rate &&
    a.pullRate === b.pullRate &&
    a.mirrored === b.mirrored
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
