// What `pinset status` says of progress: per node and set, the bytes
// present of the total, the rate and when that node will be done (from
// what its agent reports: `bytes` and `rate`, as of the report's
// `updatedAt`); per set, the bytes present across the nodes it selects
// (summed here from the same reports, as the controller sums them:
// src/controller/progress.ts), with the rate and the ETA the controller
// wrote in the set's status.progress, or, where it wrote none (no
// controller running, or an older one), those of this command's own
// observations when it watches (--watch).
import type { NodeSetStatus, PinnedImageSet, SetProgress } from '../api/types.ts';
import { selectorErrors, selectorMatches } from '../api/selector.ts';
import { fleetWork, progressSummary, type FleetWork, type NodeProgressInput } from '../controller/progress.ts';
import { progressInput, type ReportReading } from '../controller/rollup.ts';
import { formatBytes } from '../registry/size.ts';

/** "41% of 30.0 MiB": a share that is not all present never reads 100%. */
export function percentOf(present: number, total: number): number {
  return total <= 0 || present >= total ? 100 : Math.floor((present * 100) / total);
}

/** The BYTES cell: "41% of 30.0 MiB", "-" when the node reports no bytes. */
export function bytesCell(e: Pick<NodeSetStatus, 'bytes'>): string {
  return e.bytes ? `${percentOf(e.bytes.present, e.bytes.total)}% of ${formatBytes(e.bytes.total)}` : '-';
}

/** The RATE cell: "5.2 MiB/s", "-" when the node reports none (not downloading). */
export function rateCell(e: Pick<NodeSetStatus, 'rate'>): string {
  return e.rate !== undefined ? `${formatBytes(e.rate)}/s` : '-';
}

/**
 * Milliseconds until the node should hold the set, from its report: what
 * is left over its rate, counted from when it reported. Undefined when it
 * cannot be told (no bytes or no rate, or nothing left).
 */
export function nodeRemainingMs(e: Pick<NodeSetStatus, 'bytes' | 'rate' | 'phase'>, reportedAt: number, now: number): number | undefined {
  if (e.phase === 'Ready' || !e.bytes || !e.rate || e.rate <= 0 || Number.isNaN(reportedAt)) return undefined;
  const left = e.bytes.total - e.bytes.present;
  if (left <= 0) return undefined;
  return Math.max(0, reportedAt + (left / e.rate) * 1000 - now);
}

/** A duration as kubectl prints ages (passed in: `formatAge`), never negative. */
export function etaText(ms: number | undefined, formatAge: (ms: number) => string): string {
  return ms === undefined ? '-' : formatAge(Math.max(0, ms));
}

/** A set as the progress lines need it: its object (when it could be read) and the nodes it selects. */
export interface SetProgressView {
  name: string;
  set: PinnedImageSet;
  /** Summed from the node reports read now. */
  work: FleetWork;
  /** The controller's status.progress, when it is about this generation. */
  controller?: SetProgress;
}

/**
 * Collects, node by node as they are listed, what each set's progress is
 * summed from (one small entry per node and set, not the reports).
 */
export class SetProgressCollector {
  readonly #sets: { set: PinnedImageSet; valid: boolean; inputs: NodeProgressInput[] }[];

  constructor(sets: readonly PinnedImageSet[]) {
    this.#sets = sets.filter((s) => s.metadata?.name).map((set) => ({ set, valid: selectorErrors(set.spec?.nodeSelector).length === 0, inputs: [] }));
  }

  add(labels: Readonly<Record<string, string>>, reading: ReportReading): void {
    for (const s of this.#sets) if (s.valid && selectorMatches(s.set.spec?.nodeSelector, labels)) s.inputs.push(progressInput(reading, s.set));
  }

  /** One view per set that selects a node, by name. */
  views(): SetProgressView[] {
    const out: SetProgressView[] = [];
    for (const s of this.#sets) {
      if (s.inputs.length === 0) continue;
      const images = Array.isArray(s.set.spec?.pinnedImages) ? s.set.spec.pinnedImages.length : 0;
      const p = s.set.status?.progress;
      const current = p && s.set.status?.observedGeneration === (s.set.metadata.generation ?? 0) ? p : undefined;
      out.push({ name: s.set.metadata.name, set: s.set, work: fleetWork(s.inputs, images), ...(current ? { controller: current } : {}) });
    }
    return out.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  }
}

/** Where the rate and ETA of a line come from. */
export interface RateAndEta {
  rate?: number;
  /** ms since the epoch. */
  eta?: number;
  /** The ETA is the earliest the set can be done (estimatedCompletionIsLowerBound): shown as "at least". */
  lowerBound?: boolean;
  /** Whose they are: the controller's (the set's status), or this command's own observations. */
  by: 'controller' | 'here' | 'none';
}

export function controllerRate(view: SetProgressView): RateAndEta {
  const p = view.controller;
  if (!p) return { by: 'none' };
  const eta = p.estimatedCompletionTime ? Date.parse(p.estimatedCompletionTime) : NaN;
  return { by: 'controller', ...(p.rate !== undefined ? { rate: p.rate } : {}), ...(Number.isNaN(eta) ? {} : { eta, ...(p.estimatedCompletionIsLowerBound ? { lowerBound: true } : {}) }) };
}

/**
 * "upgrade: 41% of 180.0 MiB, 5.2 MiB/s on 6 nodes (2 downloading, 3
 * waiting); done in about 4m10s (16:20:31Z)".
 */
export function progressLine(view: SetProgressView, r: RateAndEta, now: number, formatAge: (ms: number) => string): string {
  const w = view.work;
  const rate = w.present < w.total && r.rate !== undefined ? r.rate : undefined;
  const nodes = w.downloading + w.waiting + w.degraded;
  const states = [w.downloading ? `${w.downloading} downloading` : '', w.waiting ? `${w.waiting} waiting` : '', w.degraded ? `${w.degraded} degraded` : ''].filter(Boolean).join(', ');
  let line = `${view.name}: ${progressSummary({ unit: w.unit, present: w.present, total: w.total, ...(rate !== undefined ? { rate } : {}) })}`;
  line += states ? ` (${states})` : nodes === 0 ? ' (every selected node done)' : '';
  if (w.present >= w.total && w.downloading + w.waiting === 0) return line;
  if (r.eta !== undefined) {
    const at = new Date(r.eta).toISOString().replace(/\.\d+Z$/, 'Z');
    const left = formatAge(Math.max(0, r.eta - now));
    line += r.lowerBound
      ? `; done in ≥ ${left} (not before ${at}: how long the nodes after the first take is not known yet)${r.by === 'here' ? ', estimated here' : ''}`
      : `; done in about ${left} (${at})${r.by === 'here' ? ', estimated here' : ''}`;
  } else if (r.by === 'none') line += '; no ETA: the set\'s status has no progress from `pinset controller` (is it running?)';
  else line += rate === undefined ? '; no ETA yet (no rate measured yet)' : w.downloading + w.waiting === 0 ? '' : '; no ETA (nothing arrived lately)';
  return line;
}

/** "[##########..........]  41%": a bar `width` characters wide inside its brackets. */
export function progressBar(present: number, total: number, width: number): string {
  const pct = percentOf(present, total);
  const filled = total <= 0 ? width : Math.min(width, Math.floor((present / total) * width));
  return `[${'#'.repeat(filled)}${'.'.repeat(width - filled)}] ${String(pct).padStart(3)}%`;
}
