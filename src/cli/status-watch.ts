// `pinset status --watch`: the status kept up to date from a list+watch of
// the Nodes (metadata only, as the controller watches them) and of the
// sets, rather than a list every few seconds: at 5000 Nodes a list is
// megabytes, a watch only the changes.
//
// On a terminal the screen is redrawn (at most every --interval, and only
// when something changed or a second passed, for the ETA's countdown): a
// progress bar per set, then the table, cut to the terminal's height.
// Anywhere else (a pipe, a file, a CI log) the first output is the table as
// `pinset status` prints it, then one line per change: a set's progress
// (with the time, when its bytes, rate or ETA moved) and each row that
// changed, as `kubectl get -w` prints rows. With --set the command ends,
// status 0, once every node the set selects is ready; otherwise on SIGINT
// or SIGTERM.
//
// The rate and ETA are the controller's (the set's status.progress); for a
// set without them (no controller running) this command measures its own,
// with the controller's own estimator (src/controller/progress.ts), from
// what it has watched.
import type { KubeConfig } from '@kubernetes/client-node';
import { KubeHttp } from '../api/kube-http.ts';
import { ListWatchCache, type KubeObjectLike } from '../api/list-watch.ts';
import { readNodeStatus } from '../api/node-status.ts';
import { selectorErrors, selectorMatches } from '../api/selector.ts';
import { GROUP, PLURAL, VERSION, type PinnedImageSet } from '../api/types.ts';
import { ProgressTracker } from '../controller/progress.ts';
import { silentLogger } from '../util/log.ts';
import { formatBytes } from '../registry/size.ts';
import { formatAge, statusRows, tableLines, type NodeReport, type StatusRow } from './status-table.ts';
import { controllerRate, progressBar, progressLine, SetProgressCollector, type RateAndEta, type SetProgressView } from './status-progress.ts';

export interface WatchOptions {
  kubeConfig: KubeConfig;
  setName?: string;
  wide: boolean;
  intervalMs: number;
  timeoutMs: number;
  pageSize: number;
}

/** Where the watch writes: a terminal (isTTY, columns, rows) or anything else. */
export type WatchOutput = Pick<NodeJS.WriteStream, 'write'> & { isTTY?: boolean; columns?: number; rows?: number };

interface WatchedNode extends NodeReport {
  metadata: { name: string; resourceVersion?: string };
}

/** What one draw shows. */
export interface WatchView {
  rows: StatusRow[];
  sets: { view: SetProgressView; rate: RateAndEta }[];
  /** Why the API could not be read lately (the watch retries). */
  problem?: string;
}

const CSI = '\x1b[';
/** Cursor home, and the end of a line (or of the screen) cleared: each frame overwrites the last without a flash. */
const HOME = `${CSI}H`;
const CLEAR_LINE = `${CSI}K`;
const CLEAR_BELOW = `${CSI}J`;
const CLEAR_SCREEN = `${CSI}2J`;
const BAR_WIDTH = 30;

function utc(ms: number): string {
  return new Date(ms).toISOString().replace(/\.\d+Z$/, 'Z');
}

/** The lines of one terminal frame: a line per set with its bar, the table, cut to `height` lines. */
export function frameLines(v: WatchView, now: number, width: number, height: number, wide: boolean, intervalMs: number): string[] {
  const every = intervalMs < 1000 ? `${intervalMs}ms` : formatAge(intervalMs);
  const head = [`pinset status --watch: every ${every}, ${utc(now)}${v.problem ? `; the API server: ${v.problem} (retrying)` : ''}`];
  for (const { view, rate } of v.sets) {
    const w = view.work;
    const amount = w.unit === 'bytes' ? `${formatBytes(w.present)} of ${formatBytes(w.total)}` : `${w.present} of ${w.total} images`;
    const speed = rate.rate !== undefined && w.present < w.total ? (w.unit === 'bytes' ? `  ${formatBytes(rate.rate)}/s` : `  ${rate.rate.toFixed(2)} images/s`) : '';
    const eta = w.done === w.nodes ? '  done' : rate.eta !== undefined ? `  ETA ${rate.lowerBound ? '≥ ' : ''}${formatAge(Math.max(0, rate.eta - now))} (${utc(rate.eta)})${rate.by === 'here' ? '*' : ''}` : '  ETA -';
    const nodes = `  ${w.done}/${w.nodes} nodes ready${w.downloading ? `, ${w.downloading} downloading` : ''}${w.waiting ? `, ${w.waiting} waiting` : ''}${w.degraded ? `, ${w.degraded} degraded` : ''}`;
    head.push(`${view.name}  ${progressBar(w.present, w.total, BAR_WIDTH)}  ${amount}${speed}${eta}${nodes}`);
  }
  if (v.sets.some((s) => s.rate.by === 'here')) head.push('* measured by this command: the set\'s status has no ETA from `pinset controller`');
  head.push('');
  const table = [...tableLines(v.rows, width, wide)];
  const room = Math.max(2, height - head.length - 1);
  const shown = table.length <= room ? table : [...table.slice(0, room - 1), `… and ${table.length - room + 1} more rows`];
  return [...head, ...shown].map((l) => ([...l].length > width ? [...l].slice(0, width).join('') : l));
}

/** What a row says that is news: all but its AGE and ETA, which change with the clock alone. */
function rowKey(r: StatusRow): string {
  return JSON.stringify([r.node, r.set, r.phase, r.images, r.bytes, r.rate, r.generation, r.estimate, r.runtime, r.error]);
}

/** What a set's line says that is news: its amounts, rate and ETA (not the countdown to it). */
function setKey(s: WatchView['sets'][number]): string {
  const w = s.view.work;
  return JSON.stringify([w.present, w.total, w.done, w.downloading, w.waiting, w.degraded, s.rate.rate, s.rate.eta, s.rate.lowerBound]);
}

/**
 * For output that is not a terminal: the lines saying what changed since
 * `seen` (updated in place): each set whose progress moved, with the time,
 * and the rows that changed, in the table's columns without its header.
 */
export function changeLines(v: WatchView, seen: { sets: Map<string, string>; rows: Map<string, string> }, now: number, width: number, wide: boolean): string[] {
  const out: string[] = [];
  for (const s of v.sets) {
    const key = setKey(s);
    if (seen.sets.get(s.view.name) === key) continue;
    seen.sets.set(s.view.name, key);
    out.push(`${utc(now)} ${progressLine(s.view, s.rate, now, formatAge)}`);
  }
  const changed = v.rows.filter((r) => {
    const id = `${r.node}\n${r.set}`;
    const key = rowKey(r);
    if (seen.rows.get(id) === key) return false;
    seen.rows.set(id, key);
    return true;
  });
  if (changed.length > 0) out.push(...[...tableLines(changed, width, wide)].slice(1));
  return out;
}

/** Whether `setName` is ready on every node it selects (and selects one). */
function allReady(v: WatchView, setName: string): boolean {
  const s = v.sets.find((x) => x.view.name === setName);
  return s !== undefined && s.view.work.nodes > 0 && s.view.work.done === s.view.work.nodes;
}

export async function watchStatus(o: WatchOptions, out: WatchOutput, opts: { signal?: AbortSignal } = {}): Promise<number> {
  const http = new KubeHttp(o.kubeConfig, { userAgent: 'pinset-status', connectTimeoutMs: o.timeoutMs });
  const log = silentLogger();
  const nodes = new ListWatchCache<WatchedNode>({ http, log, what: 'nodes', path: '/api/v1/nodes', metadataOnly: true, pageSize: o.pageSize }, (obj: KubeObjectLike) => {
    const meta = (obj.metadata ?? {}) as { name?: string; resourceVersion?: string; labels?: Record<string, string>; annotations?: Record<string, string> };
    const name = meta.name ?? '';
    return { metadata: { name, resourceVersion: meta.resourceVersion }, name, labels: meta.labels ?? {}, reading: readNodeStatus(meta.annotations) };
  });
  const sets = new ListWatchCache<PinnedImageSet>({
    http,
    log,
    what: 'pinnedimagesets',
    path: `/apis/${GROUP}/${VERSION}/${PLURAL}`,
    ...(o.setName ? { fieldSelector: `metadata.name=${o.setName}` } : {}),
  });
  let problem: string | undefined;
  let changed = true;
  const news = () => ((changed = true), (problem = undefined));
  const failed = (err: Error) => ((problem = err.message.split('\n')[0]!.slice(0, 200)), (changed = true));
  nodes.on('add', news).on('update', news).on('delete', news).on('synced', news).on('failure', failed);
  sets.on('add', news).on('update', news).on('delete', news).on('synced', news).on('failure', failed);
  const own = new ProgressTracker();
  const tty = out.isTTY === true;
  const seen = { sets: new Map<string, string>(), rows: new Map<string, string>() };
  let first = true;
  let lastDraw = 0;

  const view = (now: number): WatchView => {
    const setObjects = sets.list();
    const set = o.setName ? setObjects.find((s) => s.metadata.name === o.setName) : undefined;
    const valid = set ? selectorErrors(set.spec?.nodeSelector).length === 0 : false;
    const only = o.setName ? { name: o.setName, ...(set ? { uid: set.metadata.uid, selects: (l: Record<string, string>) => valid && selectorMatches(set.spec?.nodeSelector, l) } : {}) } : undefined;
    const reports = nodes.list();
    const collector = new SetProgressCollector(setObjects);
    for (const n of reports) collector.add(n.labels, n.reading);
    const progress = collector.views().map((v) => {
      const slots = v.set.spec?.rollout?.maxConcurrentNodes;
      const mine = own.observe({ name: v.name, uid: v.set.metadata.uid, generation: v.set.metadata.generation ?? 0, ...(typeof slots === 'number' ? { slots } : {}) }, v.work, new Date(now));
      const theirs = controllerRate(v);
      const eta = mine.estimatedCompletionTime ? Date.parse(mine.estimatedCompletionTime) : undefined;
      const rate: RateAndEta =
        theirs.by === 'controller' ? theirs : { by: 'here', ...(mine.rate !== undefined ? { rate: mine.rate } : {}), ...(eta !== undefined ? { eta, ...(mine.estimatedCompletionIsLowerBound ? { lowerBound: true } : {}) } : {}) };
      return { view: v, rate };
    });
    return { rows: statusRows(reports, new Date(now), only), sets: progress, ...(problem ? { problem } : {}) };
  };

  const draw = (now: number): WatchView => {
    const v = view(now);
    const width = out.columns && out.columns > 0 ? out.columns : 120;
    if (tty) {
      const lines = frameLines(v, now, width, out.rows && out.rows > 0 ? out.rows : 40, o.wide, o.intervalMs);
      out.write(`${first ? CLEAR_SCREEN : ''}${HOME}${lines.map((l) => `${l}${CLEAR_LINE}`).join('\n')}${CLEAR_BELOW}`);
    } else {
      const lines = first
        ? [...tableLines(v.rows, width, o.wide), ...(v.sets.length > 0 ? ['', 'Progress:', ...v.sets.map((s) => `  ${progressLine(s.view, s.rate, now, formatAge)}`)] : [])]
        : changeLines(v, seen, now, width, o.wide);
      if (first) changeLines(v, seen, now, width, o.wide);
      if (lines.length > 0) out.write(`${lines.join('\n')}\n`);
    }
    first = false;
    lastDraw = now;
    changed = false;
    return v;
  };

  nodes.start();
  sets.start();
  let stop: () => void = () => {};
  const stopped = new Promise<void>((resolve) => (stop = resolve));
  opts.signal?.addEventListener('abort', stop, { once: true });
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
  let code = 0;
  try {
    let finished = false;
    while (!finished) {
      let timer: NodeJS.Timeout | undefined;
      const tick = new Promise<'tick'>((resolve) => (timer = setTimeout(() => resolve('tick'), o.intervalMs)));
      const woke = await Promise.race([tick, stopped.then(() => 'stop' as const)]);
      clearTimeout(timer);
      if (woke === 'stop') break;
      if (!nodes.synced || !sets.synced) {
        if (problem && changed && !tty) out.write(`pinset status: the API server: ${problem} (retrying)\n`);
        changed = false;
        continue;
      }
      const now = Date.now();
      // On a terminal the ETA counts down, so a frame a second at least; elsewhere only news is printed.
      if (!changed && !(tty && now - lastDraw >= 1000) && !first) continue;
      const v = draw(now);
      if (o.setName && allReady(v, o.setName)) finished = true;
    }
    if (tty && !first) out.write('\n');
  } catch (err) {
    out.write(`pinset status: ${(err as Error).message}\n`);
    code = 1;
  } finally {
    process.off('SIGINT', stop);
    process.off('SIGTERM', stop);
    opts.signal?.removeEventListener('abort', stop);
    await Promise.all([nodes.stop(), sets.stop()]);
    http.close();
  }
  return code;
}
