// The rows of `pinset status`'s table, one per node and set it reports, and
// the table itself (kubectl-style columns, the ERROR column cut to the
// terminal's width): shared by the one-shot listing (./status.ts) and
// --watch (./status-watch.ts).
import type { NodeRuntime, NodeSetStatus } from '../api/types.ts';
import type { NodeStatusReading } from '../api/node-status.ts';
import { formatBytes } from '../registry/size.ts';
import { oneLine } from './status-notes.ts';
import { bytesCell, etaText, nodeRemainingMs, rateCell } from './status-progress.ts';

export interface NodeReport {
  name: string;
  labels: Record<string, string>;
  reading: NodeStatusReading;
}

export interface StatusRow {
  node: string;
  set: string;
  phase: string;
  images: string;
  generation: string;
  age: string;
  /** Bytes of the set present on the node: "41% of 30.0 MiB" ("-" when not reported). */
  bytes: string;
  /** The node's rate for the set: "5.2 MiB/s" ("-" when it is not downloading). */
  rate: string;
  /** When the node should hold the set, from its rate: "3m20s" ("-" when it cannot be told). */
  eta: string;
  /** Disk estimate of the images still to download ("-" when none). */
  estimate: string;
  /** The node's runtime as its agent found it: "containerd 2.1.9 (containerd)", the pin backend in brackets; "-" when not reported. */
  runtime: string;
  error: string;
}

/** The RUNTIME column: what answered CRI Version and the backend that pins there; why none was settled on. */
export function runtimeLabel(r: NodeRuntime | undefined): string {
  if (!r) return '-';
  if (r.problem) return 'none settled';
  const what = [r.name, r.version].filter(Boolean).join(' ') || '?';
  return `${what}${r.layout && r.layout !== r.name && r.layout !== 'crio' ? ` on ${r.layout}` : ''} (${r.pinBackend})`;
}

/**
 * A duration the way kubectl prints ages (k8s.io/apimachinery
 * pkg/util/duration.HumanDuration): 45s, 3m20s, 15m, 5h30m, 20h, 3d4h, 30d, 2y.
 */
export function formatAge(ms: number): string {
  const seconds = Math.floor(ms / 1000);
  if (seconds < -1) return '<invalid>';
  if (seconds < 0) return '0s';
  if (seconds < 120) return `${seconds}s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 10) {
    const s = seconds % 60;
    return s === 0 ? `${minutes}m` : `${minutes}m${s}s`;
  }
  if (minutes < 180) return `${minutes}m`;
  const hours = Math.floor(minutes / 60);
  if (hours < 8) {
    const m = minutes % 60;
    return m === 0 ? `${hours}h` : `${hours}h${m}m`;
  }
  if (hours < 48) return `${hours}h`;
  if (hours < 24 * 8) {
    const h = hours % 24;
    return h === 0 ? `${Math.floor(hours / 24)}d` : `${Math.floor(hours / 24)}d${h}h`;
  }
  if (hours < 24 * 365 * 2) return `${Math.floor(hours / 24)}d`;
  if (hours < 24 * 365 * 8) {
    const days = Math.floor(hours / 24);
    const dy = days % 365;
    return dy === 0 ? `${Math.floor(days / 365)}y` : `${Math.floor(days / 365)}y${dy}d`;
  }
  return `${Math.floor(hours / 24 / 365)}y`;
}


function errorOf(e: NodeSetStatus): string {
  const failedNow = e.lastFailedGenerationError && e.lastFailedGeneration !== undefined && e.lastFailedGeneration >= e.desiredGeneration;
  if (e.phase !== 'Degraded' && !failedNow) return '';
  const text = e.lastFailedGenerationError || e.message || '';
  const reason = e.reason || e.phase;
  // An agent's error reads "<reason>: <message>" already (src/api/node-status.ts failureText).
  return oneLine(!text ? reason : text.startsWith(`${reason}: `) ? text : `${reason}: ${text}`);
}

/**
 * One row per node and set it reports; one row for a node that reports
 * nothing. With `only`, rows for that set; `selects`, when the set object is
 * known, adds the nodes it selects that have not reported on it.
 */
export function statusRows(
  nodes: readonly NodeReport[],
  now: Date,
  only?: { name: string; uid?: string; selects?: (labels: Record<string, string>) => boolean },
): StatusRow[] {
  const rows: StatusRow[] = [];
  const sorted = [...nodes].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const node of sorted) {
    const { status, error } = node.reading;
    const updated = status?.updatedAt ? Date.parse(status.updatedAt) : NaN;
    const age = Number.isNaN(updated) ? '<unknown>' : formatAge(now.getTime() - updated);
    const runtime = runtimeLabel(status?.runtime);
    const none = { bytes: '-', rate: '-', eta: '-', estimate: '-' };
    const empty = { images: '-', generation: '-', age: '-', ...none, runtime };
    let entries = status?.sets ?? [];
    if (only) entries = entries.filter((e) => e.name === only.name);
    const mismatch = only?.uid ? entries.filter((e) => e.source === 'api' && e.uid && e.uid !== only.uid) : [];
    entries = entries.filter((e) => !mismatch.includes(e));
    if (entries.length === 0) {
      if (only && !error && !only.selects?.(node.labels) && mismatch.length === 0) continue;
      if (error) rows.push({ node: node.name, set: only?.name ?? '<none>', phase: 'Unreadable', ...empty, error: oneLine(error) });
      else if (!status) rows.push({ node: node.name, set: only?.name ?? '<none>', phase: 'NotReported', ...empty, error: '' });
      else {
        const why = mismatch.length > 0 ? 'the report is about an earlier set of the same name' : '';
        rows.push({ node: nodeLabel(node.name, status.cannotPin), set: only?.name ?? '<none>', phase: only ? 'NotReported' : '-', images: '-', generation: '-', age, ...none, runtime, error: why || oneLine(status.runtime?.problem ?? '') });
      }
      continue;
    }
    for (const e of [...entries].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))) {
      rows.push({
        node: nodeLabel(node.name, status?.cannotPin),
        set: e.source === 'static' ? `${e.name} (static)` : e.name,
        phase: e.phase,
        images: `${e.images.present}/${e.images.wanted}`,
        generation: `${e.currentGeneration}/${e.desiredGeneration}`,
        age,
        bytes: bytesCell(e),
        rate: rateCell(e),
        eta: etaText(nodeRemainingMs(e, updated, now.getTime()), formatAge),
        estimate: e.estimatedBytes !== undefined ? formatBytes(e.estimatedBytes) : '-',
        runtime,
        error: errorOf(e),
      });
    }
  }
  return rows;
}

/** The NODE column: a node whose runtime cannot pin is marked. */
function nodeLabel(name: string, cannotPin: string | undefined): string {
  return cannotPin ? `${name} (pre-load only)` : name;
}

const HEADERS: Record<keyof StatusRow, string> = {
  node: 'NODE',
  set: 'SET',
  phase: 'PHASE',
  images: 'IMAGES',
  generation: 'GENERATION',
  age: 'AGE',
  bytes: 'BYTES',
  rate: 'RATE',
  eta: 'ETA',
  estimate: 'ESTIMATE',
  runtime: 'RUNTIME',
  error: 'ERROR',
};
const GAP = 3;
/** ERROR keeps at least this many characters however narrow the terminal. */
const MIN_ERROR_WIDTH = 20;

function cut(s: string, width: number): string {
  const chars = [...s];
  return chars.length <= width ? s : `${chars.slice(0, Math.max(0, width - 1)).join('')}…`;
}

/** The table's lines, header first: kubectl-style columns, the ERROR column cut so each line fits `width`. */
export function* tableLines(rows: readonly StatusRow[], width: number, wide = false): Generator<string> {
  const cols = wide
    ? (['node', 'set', 'phase', 'images', 'bytes', 'rate', 'eta', 'generation', 'age', 'estimate', 'runtime'] as const)
    : (['node', 'set', 'phase', 'images', 'bytes', 'eta', 'generation', 'age'] as const);
  // Not Math.max(...rows): one argument per row overflows the stack from
  // about 125000 rows (12500 nodes of 10 sets) on Node.js 24's default stack.
  const widths = cols.map((c) => rows.reduce((w, r) => Math.max(w, [...r[c]].length), HEADERS[c].length));
  const line = (r: Record<keyof StatusRow, string>) => {
    const left = cols.map((c, i) => r[c] + ' '.repeat(widths[i]! - [...r[c]].length + GAP)).join('');
    const room = Math.max(MIN_ERROR_WIDTH, width - [...left].length);
    return (left + cut(r.error, room)).trimEnd();
  };
  yield line(HEADERS);
  for (const r of rows) yield line(r);
}

/** The whole table as one string (see tableLines). */
export function renderTable(rows: readonly StatusRow[], width: number, wide = false): string {
  return [...tableLines(rows, width, wide)].join('\n') + '\n';
}
