// `pinset status`: what each agent reports in its Node's `pinset.dev/status`
// annotation, as a node-by-set table or as JSON. Nodes are listed as
// metadata only (PartialObjectMetadataList: no status.images, conditions or
// spec), in pages of --chunk-size, and of each only its rows of the table
// (or its JSON item) are kept: over 5000 Nodes it peaks at 131 MB, where
// whole Nodes in one answer took 506 MB (BENCHMARKS.md, "Scale: 5000 Nodes").
// A node whose runtime cannot pin is marked "(pre-load only)", and said once
// after the table with why and the versions that pin; a node keeping pins
// no set asks for is named after it too, and so is a node whose kubelet's
// credential verification will refuse pinned images offline
// (./status-notes.ts).
import type { KubeConfig } from '@kubernetes/client-node';
import { KubeApiError, KubeHttp } from '../api/kube-http.ts';
import { DEFAULT_PAGE_SIZE, listAll, METADATA_LIST_ACCEPT } from '../api/list-pages.ts';
import { selectorErrors, selectorMatches } from '../api/selector.ts';
import { GROUP, PLURAL, VERSION, type NodeRuntime, type NodeSetStatus, type PinnedImageSet } from '../api/types.ts';
import { loadClientKubeConfig } from '../api/kubeconfig.ts';
import { readNodeStatus, type NodeStatusReading } from '../api/node-status.ts';
import { formatBytes } from '../registry/size.ts';
import { helpText, parseFlags, type FlagSpec } from '../util/flags.ts';
import { apiError } from './api-error.ts';
import { kubeletVerificationLines, oneLine, pinsKeptLines, preloadOnlyLines, type KubeletNote } from './status-notes.ts';

export const STATUS_FLAGS: readonly FlagSpec[] = [
  { name: 'set', type: 'string', help: 'show only this PinnedImageSet' },
  { name: 'output', type: 'string', default: 'table', choices: ['table', 'wide', 'json'], help: 'output format (wide adds each set\'s disk estimate for what it still has to download, and each node\'s runtime and pin backend)', short: 'o' },
  { name: 'kubeconfig', env: 'KUBECONFIG', type: 'string', help: 'kubeconfig file; the usual search (~/.kube/config, in-cluster) when unset' },
  { name: 'timeout', env: 'PINSET_STATUS_TIMEOUT', type: 'duration', default: '15s', help: 'give up on an API request (a page of Nodes) after this long' },
  { name: 'chunk-size', env: 'PINSET_STATUS_CHUNK_SIZE', type: 'int', default: DEFAULT_PAGE_SIZE, help: 'list Nodes this many at a time (kubectl\'s --chunk-size); 0 lists them in one request' },
];

/** What a metadata-only list brings of a Node (a whole Node from a server that cannot send less). */
interface NodeMetadata {
  metadata?: { name?: string; labels?: Record<string, string>; annotations?: Record<string, string> };
}

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
    const empty = { images: '-', generation: '-', age: '-', estimate: '-', runtime };
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
        rows.push({ node: nodeLabel(node.name, status.cannotPin), set: only?.name ?? '<none>', phase: only ? 'NotReported' : '-', images: '-', generation: '-', age, estimate: '-', runtime, error: why || oneLine(status.runtime?.problem ?? '') });
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
  const cols = wide ? (['node', 'set', 'phase', 'images', 'generation', 'age', 'estimate', 'runtime'] as const) : (['node', 'set', 'phase', 'images', 'generation', 'age'] as const);
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

/** The width to fit lines to: the terminal's, else COLUMNS, else 120. */
export function terminalWidth(): number {
  if (process.stdout.isTTY && process.stdout.columns) return process.stdout.columns;
  const env = Number(process.env.COLUMNS);
  return Number.isInteger(env) && env > 0 ? env : 120;
}

/** One node in `-o json`. */
export interface JsonItem {
  node: string;
  status: NodeStatusReading['status'] | null;
  error?: string;
  droppedEntries?: string[];
}

function jsonItem(r: NodeReport, setName: string | undefined): JsonItem {
  const status = r.reading.status && setName ? { ...r.reading.status, sets: r.reading.status.sets.filter((s) => s.name === setName) } : r.reading.status;
  return {
    node: r.name,
    status: status ?? null,
    ...(r.reading.error ? { error: r.reading.error } : {}),
    ...(r.reading.droppedEntries ? { droppedEntries: r.reading.droppedEntries } : {}),
  };
}

/**
 * `{"nodes": [...]}` exactly as JSON.stringify(doc, null, 2) writes it, in
 * pieces (one per item), so thousands of nodes never make one string.
 */
export function* jsonPieces(items: readonly JsonItem[]): Generator<string> {
  if (items.length === 0) {
    yield '{\n  "nodes": []\n}\n';
    return;
  }
  yield '{\n  "nodes": [\n';
  for (let i = 0; i < items.length; i++) yield JSON.stringify(items[i], null, 2).replace(/^/gm, '    ') + (i < items.length - 1 ? ',\n' : '\n');
  yield '  ]\n}\n';
}

/** Pieces of output are written in batches of about this many characters. */
const WRITE_BATCH = 1 << 16;

/**
 * Writes the pieces to `out` in batches, waiting for 'drain' whenever the
 * stream asks to: process.stdout on a pipe writes asynchronously, so a
 * loop that never waits holds the whole output in memory until the reader
 * catches up (the 27 MB of JSON over 5000 Nodes took `pinset status -o
 * json | ...` from 114 to 195 MB; BENCHMARKS.md, "Scale: 5000 Nodes").
 * Resolves with the stream's error if it has one (EPIPE: the reader went
 * away), and writes nothing after it.
 */
export async function writePieces(pieces: Iterable<string>, out: NodeJS.WritableStream): Promise<Error | undefined> {
  let failed: Error | undefined;
  const onError = (err: Error) => {
    failed ??= err;
  };
  out.on('error', onError);
  const drained = () =>
    new Promise<void>((resolve) => {
      const done = () => {
        out.off('drain', done);
        out.off('error', done);
        out.off('close', done);
        resolve();
      };
      out.on('drain', done).on('error', done).on('close', done);
    });
  try {
    let batch = '';
    const flush = async () => {
      const ok = out.write(batch);
      batch = '';
      if (!ok && !failed) await drained();
    };
    for (const piece of pieces) {
      if (failed) return failed;
      batch += piece;
      if (batch.length >= WRITE_BATCH) await flush();
    }
    if (batch && !failed) await flush();
    return failed;
  } finally {
    out.off('error', onError);
  }
}

function* terminated(lines: Iterable<string>): Generator<string> {
  for (const line of lines) yield `${line}\n`;
}

/** A node's kubeletVerification as the notes need it; with --set, the refusals of that set only. */
export function kubeletNoteFor(kv: KubeletNote['kubeletVerification'], setName: string | undefined): KubeletNote['kubeletVerification'] {
  if (!kv || !setName || !kv.refuses) return kv;
  const refuses = kv.refuses.filter((s) => s === setName || s === `${setName} (static)`);
  const { refusesMore: _more, ...rest } = kv;
  return refuses.length > 0 ? { ...rest, refuses } : { policy: kv.policy, source: kv.source };
}

const byName = <T extends { name: string }>(a: T, b: T) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0);

/** The command's flags, for its --help and the reference (docs/reference.md; a test holds the two together). */
export const flags = STATUS_FLAGS;

export async function run(argv: string[]): Promise<number> {
  const { values } = parseFlags(STATUS_FLAGS, argv);
  if (values.help) {
    process.stdout.write(helpText('pinset status [--set NAME] [-o table|wide|json] [--kubeconfig FILE]', 'Show, per node and set, what the agents report.', STATUS_FLAGS));
    return 0;
  }
  let kc: KubeConfig;
  try {
    kc = loadClientKubeConfig(values.kubeconfig as string | undefined);
  } catch (err) {
    process.stderr.write(`pinset status: ${(err as Error).message}\n`);
    return 1;
  }
  const server = kc.getCurrentCluster()?.server ?? '(no cluster)';
  const timeoutMs = values.timeout as number;
  const setName = values.set as string | undefined;
  const json = values.output === 'json';
  const now = new Date();
  const http = new KubeHttp(kc, { userAgent: 'pinset-status', connectTimeoutMs: timeoutMs });

  // What is kept of each node while the list is read: its rows of the
  // table (and why it cannot pin, one copy per distinct text), or its item
  // of the JSON; the Node itself goes with its page.
  type Kept = { name: string; rows?: StatusRow[]; cannotPin?: string; pinsKept?: string; kubeletVerification?: KubeletNote['kubeletVerification']; item?: JsonItem };
  let kept: Kept[];
  const reasons = new Map<string, string>();
  const shared = (s: string) => reasons.get(s) ?? (reasons.set(s, s), s);
  try {
    // With --set, the object (when readable) says which nodes should have
    // reported on it; without it only the reports themselves are shown.
    let only: Parameters<typeof statusRows>[2];
    if (setName) {
      only = { name: setName };
      try {
        const set = await http.json<PinnedImageSet>('GET', `/apis/${GROUP}/${VERSION}/${PLURAL}/${encodeURIComponent(setName)}`, {}, undefined, { timeoutMs });
        const sel = set?.spec?.nodeSelector;
        const valid = selectorErrors(sel).length === 0;
        only = { name: setName, uid: set?.metadata?.uid, selects: (labels) => valid && selectorMatches(sel, labels) };
      } catch (err) {
        if (err instanceof KubeApiError && err.code === 404) process.stderr.write(`pinset status: PinnedImageSet ${setName} does not exist; showing what nodes report under that name\n`);
      }
    }
    try {
      // --timeout bounds each request (a page), not the whole list, which grows with the cluster.
      const list = await listAll<NodeMetadata, Kept>(
        { http, path: '/api/v1/nodes', pageSize: values['chunk-size'] as number, accept: METADATA_LIST_ACCEPT, timeoutMs },
        (n) => {
          const report: NodeReport = { name: n.metadata?.name ?? '', labels: n.metadata?.labels ?? {}, reading: readNodeStatus(n.metadata?.annotations) };
          if (json) return { name: report.name, item: jsonItem(report, setName) };
          const rows = statusRows([report], now, only);
          const cannotPin = rows.length > 0 ? report.reading.status?.cannotPin : undefined;
          const pinsKept = setName ? undefined : report.reading.status?.pinsKept;
          const kubeletVerification = rows.length > 0 ? kubeletNoteFor(report.reading.status?.kubeletVerification, setName) : undefined;
          return { name: report.name, rows, ...(cannotPin ? { cannotPin: shared(cannotPin) } : {}), ...(pinsKept ? { pinsKept } : {}), ...(kubeletVerification ? { kubeletVerification } : {}) };
        },
      );
      kept = list.items;
    } catch (err) {
      process.stderr.write(`pinset status: cannot list nodes from the API server at ${server}: ${apiError(err)}\n`);
      return 1;
    }
  } finally {
    http.close();
  }
  kept.sort(byName);

  const rows = json ? [] : kept.flatMap((k) => k.rows ?? []);
  const empty = setName ? `No node reports on set ${setName}.\n` : 'No nodes found.\n';
  const table = function* () {
    yield* terminated(tableLines(rows, terminalWidth(), values.output === 'wide'));
    yield* terminated(preloadOnlyLines(kept));
    yield* terminated(pinsKeptLines(kept));
    yield* terminated(kubeletVerificationLines(kept));
  };
  const pieces = json ? jsonPieces(kept.map((k) => k.item!)) : rows.length === 0 ? [empty] : table();
  const err = await writePieces(pieces, process.stdout);
  if (err && (err as NodeJS.ErrnoException).code !== 'EPIPE') {
    process.stderr.write(`pinset status: cannot write the output: ${err.message}\n`);
    return 1;
  }
  return 0;
}
