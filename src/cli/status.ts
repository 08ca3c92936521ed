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
// (./status-notes.ts). Each row says how much of the set the node holds in
// bytes and when it will be done; after the table, one line per set says
// the same across the nodes it selects (./status-progress.ts). --watch
// keeps it on screen (./status-watch.ts).
import type { KubeConfig } from '@kubernetes/client-node';
import { KubeApiError, KubeHttp } from '../api/kube-http.ts';
import { DEFAULT_PAGE_SIZE, listAll, METADATA_LIST_ACCEPT } from '../api/list-pages.ts';
import { selectorErrors, selectorMatches } from '../api/selector.ts';
import { GROUP, PLURAL, VERSION, type PinnedImageSet } from '../api/types.ts';
import { loadClientKubeConfig } from '../api/kubeconfig.ts';
import { readNodeStatus, type NodeStatusReading } from '../api/node-status.ts';
import { helpText, parseFlags, UsageError, type FlagSpec } from '../util/flags.ts';
import { apiError } from './api-error.ts';
import { kubeletVerificationLines, pinsKeptLines, preloadOnlyLines, type KubeletNote } from './status-notes.ts';
import { controllerRate, progressLine, SetProgressCollector } from './status-progress.ts';
import { formatAge, statusRows, tableLines, type NodeReport, type StatusRow } from './status-table.ts';

export const STATUS_FLAGS: readonly FlagSpec[] = [
  { name: 'set', type: 'string', help: 'show only this PinnedImageSet' },
  { name: 'output', type: 'string', default: 'table', choices: ['table', 'wide', 'json'], help: 'output format (wide adds each node\'s rate per set, each set\'s disk estimate for what it still has to download, and each node\'s runtime and pin backend)', short: 'o' },
  { name: 'kubeconfig', env: 'KUBECONFIG', type: 'string', help: 'kubeconfig file; the usual search (~/.kube/config, in-cluster) when unset' },
  { name: 'timeout', env: 'PINSET_STATUS_TIMEOUT', type: 'duration', default: '15s', help: 'give up on an API request (a page of Nodes) after this long' },
  { name: 'chunk-size', env: 'PINSET_STATUS_CHUNK_SIZE', type: 'int', default: DEFAULT_PAGE_SIZE, help: 'list Nodes this many at a time (kubectl\'s --chunk-size); 0 lists them in one request' },
  { name: 'watch', type: 'bool', short: 'w', help: 'keep watching: on a terminal, redraw with a progress bar per set; otherwise print a line per change; with --set, stop once every node it selects is ready' },
  { name: 'interval', env: 'PINSET_STATUS_INTERVAL', type: 'duration', default: '2s', help: 'with --watch, redraw (or print changes) at most this often' },
];

/** What a metadata-only list brings of a Node (a whole Node from a server that cannot send less). */
interface NodeMetadata {
  metadata?: { name?: string; labels?: Record<string, string>; annotations?: Record<string, string> };
}

export { formatAge, renderTable, runtimeLabel, statusRows, tableLines, type NodeReport, type StatusRow } from './status-table.ts';

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
    process.stdout.write(helpText('pinset status [--set NAME] [-o table|wide|json] [-w [--interval D]] [--kubeconfig FILE]', 'Show, per node and set, what the agents report, and each set\'s progress.', STATUS_FLAGS));
    return 0;
  }
  if (values.watch && values.output === 'json') throw new UsageError('--watch prints the table as it changes; -o json prints one document (leave out one of them)');
  if (values.watch && !((values.interval as number) > 0)) throw new UsageError('--interval must be longer than 0');
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
  if (values.watch) {
    const { watchStatus } = await import('./status-watch.ts');
    return watchStatus({ kubeConfig: kc, setName, wide: values.output === 'wide', intervalMs: values.interval as number, timeoutMs, pageSize: values['chunk-size'] as number }, process.stdout);
  }
  const now = new Date();
  const http = new KubeHttp(kc, { userAgent: 'pinset-status', connectTimeoutMs: timeoutMs });

  // What is kept of each node while the list is read: its rows of the
  // table (and why it cannot pin, one copy per distinct text), or its item
  // of the JSON; the Node itself goes with its page.
  type Kept = { name: string; rows?: StatusRow[]; cannotPin?: string; pinsKept?: string; kubeletVerification?: KubeletNote['kubeletVerification']; item?: JsonItem };
  let kept: Kept[];
  const reasons = new Map<string, string>();
  const shared = (s: string) => reasons.get(s) ?? (reasons.set(s, s), s);
  let progress: SetProgressCollector | undefined;
  let setsUnread: string | undefined;
  try {
    // With --set, the object (when readable) says which nodes should have
    // reported on it; without it only the reports themselves are shown.
    // The set objects read also give each set's progress line.
    let only: Parameters<typeof statusRows>[2];
    if (setName) {
      only = { name: setName };
      try {
        const set = await http.json<PinnedImageSet>('GET', `/apis/${GROUP}/${VERSION}/${PLURAL}/${encodeURIComponent(setName)}`, {}, undefined, { timeoutMs });
        const sel = set?.spec?.nodeSelector;
        const valid = selectorErrors(sel).length === 0;
        only = { name: setName, uid: set?.metadata?.uid, selects: (labels) => valid && selectorMatches(sel, labels) };
        if (set?.metadata?.name) progress = new SetProgressCollector([set]);
      } catch (err) {
        if (err instanceof KubeApiError && err.code === 404) process.stderr.write(`pinset status: PinnedImageSet ${setName} does not exist; showing what nodes report under that name\n`);
      }
    } else if (!json) {
      try {
        const sets = await http.json<{ items?: PinnedImageSet[] }>('GET', `/apis/${GROUP}/${VERSION}/${PLURAL}`, {}, undefined, { timeoutMs });
        progress = new SetProgressCollector(sets?.items ?? []);
      } catch (err) {
        // The table stands without them: what the nodes report needs no set (said once the nodes are listed).
        setsUnread = apiError(err);
      }
    }
    try {
      // --timeout bounds each request (a page), not the whole list, which grows with the cluster.
      const list = await listAll<NodeMetadata, Kept>(
        { http, path: '/api/v1/nodes', pageSize: values['chunk-size'] as number, accept: METADATA_LIST_ACCEPT, timeoutMs },
        (n) => {
          const report: NodeReport = { name: n.metadata?.name ?? '', labels: n.metadata?.labels ?? {}, reading: readNodeStatus(n.metadata?.annotations) };
          if (json) return { name: report.name, item: jsonItem(report, setName) };
          progress?.add(report.labels, report.reading);
          const rows = statusRows([report], now, only);
          const cannotPin = rows.length > 0 ? report.reading.status?.cannotPin : undefined;
          const pinsKept = setName ? undefined : report.reading.status?.pinsKept;
          const kubeletVerification = rows.length > 0 ? kubeletNoteFor(report.reading.status?.kubeletVerification, setName) : undefined;
          return { name: report.name, rows, ...(cannotPin ? { cannotPin: shared(cannotPin) } : {}), ...(pinsKept ? { pinsKept } : {}), ...(kubeletVerification ? { kubeletVerification } : {}) };
        },
      );
      kept = list.items;
      if (setsUnread) process.stderr.write(`pinset status: cannot read the PinnedImageSets (${setsUnread}), so no progress per set is shown\n`);
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
  const views = progress?.views() ?? [];
  const table = function* () {
    yield* terminated(tableLines(rows, terminalWidth(), values.output === 'wide'));
    if (views.length > 0) yield* terminated(['', 'Progress:', ...views.map((v) => `  ${progressLine(v, controllerRate(v), now.getTime(), formatAge)}`)]);
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
