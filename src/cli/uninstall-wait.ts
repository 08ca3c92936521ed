// `pinset uninstall`'s wait: until every node's agent reports, in its
// Node's pinset.dev/status annotation, that it holds no pins (`pins: 0`),
// or the time is up. Nodes are watched as metadata only (one list+watch,
// src/api/list-watch.ts), so waiting costs the API server one watch
// however many nodes there are. Progress goes to a terminal as one line
// rewritten in place, or as plain lines when the output is not a terminal.
import type { Logger } from 'pino';
import type { KubeHttp } from '../api/kube-http.ts';
import { ListWatchCache } from '../api/list-watch.ts';
import { readNodeStatus } from '../api/node-status.ts';
import { formatAge } from './status.ts';

/** Where one node stands, as its annotation says. */
export type NodePins =
  | { node: string; state: 'clear' }
  | { node: string; state: 'holding'; pins: number; why: string }
  | { node: string; state: 'unknown'; why: string }
  | { node: string; state: 'silent' };

/** How a node's report reads for the wait (pure). `now` for the report's age. */
export function nodePins(node: string, annotations: Readonly<Record<string, string>> | undefined, now: Date): NodePins {
  const { status, error } = readNodeStatus(annotations);
  if (error) return { node, state: 'unknown', why: `its report cannot be read: ${error}` };
  if (!status) return { node, state: 'silent' };
  const updated = Date.parse(status.updatedAt);
  const age = Number.isNaN(updated) ? 'of unknown age' : `${formatAge(now.getTime() - updated)} old`;
  if (status.pins === undefined) {
    return { node, state: 'unknown', why: `its agent does not report how many pins it holds (a pinset older than this one; report ${age}): upgrade pinset first, or run \`pinset agent --drop-pins\` on it` };
  }
  if (status.pins === 0) return { node, state: 'clear' };
  const statics = status.sets.filter((s) => s.source === 'static').map((s) => s.name);
  const reasons = [
    statics.length > 0 ? `sets from the node's static folder still select it (${statics.join(', ')}): remove their files, or run \`pinset agent --drop-pins\` once the agent is gone` : '',
    status.pinsKept ?? '',
    statics.length === 0 && !status.pinsKept ? (status.sets.length > 0 ? `it still reports ${status.sets.length} set(s)` : 'its agent has not reported since the sets were deleted') : '',
  ].filter(Boolean);
  return { node, state: 'holding', pins: status.pins, why: `${reasons.join('; ')} (report ${age})` };
}

export interface WaitResult {
  /** Nodes that reported no pins. */
  clear: string[];
  /** Nodes with no report at all: no agent has written one. */
  silent: string[];
  /** Nodes still holding pins, or whose pins are unknown, when the time was up. */
  left: NodePins[];
  timedOut: boolean;
}

export interface WaitOptions {
  http: KubeHttp;
  log: Logger;
  timeoutMs: number;
  out: NodeJS.WriteStream | NodeJS.WritableStream;
  /** Write progress as one line rewritten in place (a terminal). */
  tty: boolean;
  now?: () => number;
}

interface NodeMeta {
  metadata?: { name?: string; namespace?: string; resourceVersion?: string; annotations?: Record<string, string> };
}

/** A line listing nodes that still hold pins, cut to a few names. */
function pending(left: NodePins[]): string {
  const shown = left.slice(0, 4).map((n) => (n.state === 'holding' ? `${n.node} (${n.pins} pin${n.pins === 1 ? '' : 's'})` : `${n.node} (unknown)`));
  return shown.join(', ') + (left.length > 4 ? ` and ${left.length - 4} more` : '');
}

/** Waits until every node that reports at all reports no pins, or `timeoutMs` passes. */
export async function waitForNoPins(o: WaitOptions): Promise<WaitResult> {
  const now = o.now ?? Date.now;
  const started = now();
  const cache = new ListWatchCache<NodeMeta>(
    { http: o.http, path: '/api/v1/nodes', what: 'nodes', log: o.log, metadataOnly: true, minWatchTimeoutMs: Math.max(60_000, o.timeoutMs) },
    (n) => ({ metadata: { name: n.metadata?.name, resourceVersion: n.metadata?.resourceVersion, annotations: (n.metadata as NodeMeta['metadata'])?.annotations } }),
  );
  const reported = new Set<string>();
  let lastLine = '';
  let lastPlainAt = started;
  const write = (s: string) => o.out.write(s);
  const verdicts = () => cache.list().map((n) => nodePins(n.metadata?.name ?? '', n.metadata?.annotations, new Date(now())));
  return await new Promise<WaitResult>((resolve) => {
    let done = false;
    const finish = (timedOut: boolean) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      clearInterval(ticker);
      if (o.tty && lastLine) write('\r\x1b[K');
      void cache.stop();
      const all = verdicts();
      resolve({
        clear: all.filter((v) => v.state === 'clear').map((v) => v.node).sort(),
        silent: all.filter((v) => v.state === 'silent').map((v) => v.node).sort(),
        left: all.filter((v) => v.state === 'holding' || v.state === 'unknown').sort((a, b) => (a.node < b.node ? -1 : 1)),
        timedOut,
      });
    };
    const check = () => {
      if (done || !cache.synced) return;
      const all = verdicts();
      const elapsed = `${((now() - started) / 1000).toFixed(1)}s`;
      for (const v of all) {
        if (v.state !== 'clear' || reported.has(v.node)) continue;
        reported.add(v.node);
        // On a terminal above the progress line, which is drawn again below.
        write(`${o.tty && lastLine ? '\r\x1b[K' : ''}${v.node}: no pins (${elapsed})\n`);
        lastLine = o.tty ? '' : lastLine;
      }
      const left = all.filter((v) => v.state === 'holding' || v.state === 'unknown');
      if (left.length === 0) return finish(false);
      const line = `waiting for ${left.length} of ${all.filter((v) => v.state !== 'silent').length} node(s) to report no pins (${elapsed}): ${pending(left)}`;
      if (o.tty) {
        if (line !== lastLine) write(`\r\x1b[K${line}`);
        lastLine = line;
      } else if (now() - lastPlainAt >= 30_000 || !lastLine) {
        write(`${line}\n`);
        lastLine = line;
        lastPlainAt = now();
      }
    };
    for (const ev of ['add', 'update', 'delete', 'synced'] as const) cache.on(ev, () => check());
    const timer = setTimeout(() => finish(true), o.timeoutMs);
    // The elapsed time on a terminal, and the plain lines' pace, move without events too.
    const ticker = setInterval(check, 1_000);
    ticker.unref();
    cache.start();
  });
}
