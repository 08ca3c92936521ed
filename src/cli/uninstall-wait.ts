// `pinset uninstall`'s wait: until every node's agent reports, in its
// Node's pinset.dev/status annotation, that it holds no pins (`pins: 0`),
// or the time is up. Nodes are watched as metadata only (one list+watch,
// src/api/list-watch.ts), so waiting costs the API server one watch
// however many nodes there are. Progress goes to a terminal as one line
// rewritten in place, or as plain lines when the output is not a terminal.
// Then, once the agents' DaemonSet and the controller's Deployment are
// deleted, the wait until their pods are gone (waitForPodsGone): they need
// their RBAC, ServiceAccounts and CRD until they stop.
import type { Logger } from 'pino';
import type { KubeHttp } from '../api/kube-http.ts';
import { listAll } from '../api/list-pages.ts';
import { ListWatchCache } from '../api/list-watch.ts';
import { readNodeStatus } from '../api/node-status.ts';
import { labelSelectorQuery } from '../api/selector.ts';
import type { LabelSelector } from '../api/types.ts';
import { PINS_WHERE } from '../containerd/label-pins.ts';
import { PIN_FILE_PREFIX, PIN_FILE_SUFFIX } from '../crio/pinfile.ts';
import { apiError } from './api-error.ts';
import type { ManifestObject } from './manifests.ts';
import { formatAge } from './status.ts';

/** The runtime whose pins a node's agent held, as its report's `pinFile` names them; undefined when it does not say. */
export type PinRuntime = 'crio' | 'containerd' | undefined;

/** Where one node stands, as its annotation says. */
export type NodePins =
  | { node: string; state: 'clear' }
  | { node: string; state: 'holding'; pins: number; why: string; runtime: PinRuntime }
  | { node: string; state: 'unknown'; why: string; runtime?: PinRuntime }
  | { node: string; state: 'silent' };

function runtimeOf(pinFile: string): PinRuntime {
  if (pinFile === PINS_WHERE) return 'containerd';
  if (pinFile.startsWith(PIN_FILE_PREFIX) && pinFile.endsWith(PIN_FILE_SUFFIX)) return 'crio';
  return undefined;
}

/** `pinset agent --drop-pins` on each runtime: the flags its agent has there, and the Job of deploy/drop-pins/. */
const DROP_PINS_HOW: Record<'crio' | 'containerd' | 'either', string> = {
  crio: 'run `pinset agent --drop-pins` as root on the node, with its agent\'s --cri-endpoint, --crio-dropin-dir, --reload and --crio-unit (its own flags work as they are), or the Job deploy/drop-pins/crio.yaml',
  containerd:
    'run `pinset agent --drop-pins --cri-endpoint=unix:///run/containerd/containerd.sock --pin-backend=containerd` as root on the node, with its agent\'s --state-dir (its own flags work as they are), or the Job deploy/drop-pins/containerd.yaml',
  either:
    'run `pinset agent --drop-pins` as root on the node with the same flags as its agent (its own flags work as they are: on containerd --cri-endpoint=unix:///run/containerd/containerd.sock --pin-backend=containerd; on CRI-O its --crio-dropin-dir), or the Job of deploy/drop-pins/ for its runtime (crio.yaml, containerd.yaml)',
};

/** What to do about the nodes still holding pins once pinset is removed: one line per runtime, naming its nodes. */
export function dropPinsAdvice(left: readonly NodePins[]): string[] {
  const by = new Map<keyof typeof DROP_PINS_HOW, string[]>();
  for (const n of left) {
    const rt = n.state === 'holding' || n.state === 'unknown' ? (n.runtime ?? 'either') : 'either';
    by.set(rt, [...(by.get(rt) ?? []), n.node]);
  }
  return (['containerd', 'crio', 'either'] as const).filter((rt) => by.has(rt)).map((rt) => `On ${by.get(rt)!.join(', ')}: ${DROP_PINS_HOW[rt]}.`);
}

/** How a node's report reads for the wait (pure). `now` for the report's age. */
export function nodePins(node: string, annotations: Readonly<Record<string, string>> | undefined, now: Date): NodePins {
  const { status, error } = readNodeStatus(annotations);
  if (error) return { node, state: 'unknown', why: `its report cannot be read: ${error}` };
  if (!status) return { node, state: 'silent' };
  const updated = Date.parse(status.updatedAt);
  const age = Number.isNaN(updated) ? 'of unknown age' : `${formatAge(now.getTime() - updated)} old`;
  if (status.pins === undefined) {
    return {
      node,
      state: 'unknown',
      runtime: runtimeOf(status.pinFile),
      why: `its agent does not report how many pins it holds (a pinset older than this one; report ${age}): upgrade pinset first, or run \`pinset agent --drop-pins\` on it`,
    };
  }
  if (status.pins === 0) return { node, state: 'clear' };
  const statics = status.sets.filter((s) => s.source === 'static').map((s) => s.name);
  const reasons = [
    statics.length > 0 ? `sets from the node's static folder still select it (${statics.join(', ')}): remove their files, or run \`pinset agent --drop-pins\` once the agent is gone` : '',
    status.pinsKept ?? '',
    statics.length === 0 && !status.pinsKept ? (status.sets.length > 0 ? `it still reports ${status.sets.length} set(s)` : 'its agent has not reported since the sets were deleted') : '',
  ].filter(Boolean);
  return { node, state: 'holding', pins: status.pins, runtime: runtimeOf(status.pinFile), why: `${reasons.join('; ')} (report ${age})` };
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

/** One progress line: rewritten in place on a terminal; elsewhere a plain line when it is new, at most every 30 s. */
export function progressLine(out: NodeJS.WritableStream, tty: boolean, now: () => number): { show(line: string): void; clear(): void } {
  let last = '';
  let plainAt = 0;
  return {
    show(line) {
      if (tty) {
        if (line !== last) out.write(`\r\x1b[K${line}`);
      } else if (!last || now() - plainAt >= 30_000) {
        out.write(`${line}\n`);
        plainAt = now();
      } else return;
      last = line;
    },
    clear() {
      if (tty && last) out.write('\r\x1b[K');
      last = '';
    },
  };
}

export interface PodsWaitOptions {
  http: KubeHttp;
  /** The DaemonSets and Deployments just deleted: their pods are those their selectors select in their namespaces. */
  workloads: readonly ManifestObject[];
  timeoutMs: number;
  requestTimeoutMs: number;
  out: NodeJS.WritableStream;
  tty: boolean;
  now?: () => number;
  pollMs?: number;
}

/** A pod of one of the workloads, by name, and its owner as "namespace/name". */
export interface PodLeft {
  name: string;
  owner: string;
}

/** The workloads' pods still there, sorted; a failed list is its error, and is asked again. */
async function podsLeft(o: PodsWaitOptions): Promise<PodLeft[] | string> {
  const pods: PodLeft[] = [];
  for (const w of o.workloads) {
    const selector = (w.doc as { spec?: { selector?: LabelSelector } }).spec?.selector;
    if (!selector) continue;
    const ns = w.namespace ?? 'default';
    try {
      const { items } = await listAll<{ metadata?: { name?: string } }, string>(
        { http: o.http, path: `/api/v1/namespaces/${encodeURIComponent(ns)}/pods`, labelSelector: labelSelectorQuery(selector), timeoutMs: o.requestTimeoutMs },
        (p) => p.metadata?.name ?? '',
      );
      for (const name of items) if (!pods.some((p) => p.name === name)) pods.push({ name, owner: `${ns}/${w.name}` });
    } catch (err) {
      return apiError(err);
    }
  }
  return pods.sort((a, b) => (a.name < b.name ? -1 : 1));
}

/** "2 pod(s) of ns/a, ns/b": the owners of the pods named. */
export function podsOf(left: readonly PodLeft[]): string {
  const owners = [...new Set(left.map((p) => p.owner))].join(', ');
  return `${left.length === 1 ? '1 pod' : `${left.length} pod(s)`} of ${owners}`;
}

/** Names of the first pods, and how many more. */
export function podNames(left: readonly PodLeft[]): string {
  return left.slice(0, 4).map((p) => p.name).join(', ') + (left.length > 4 ? ` and ${left.length - 4} more` : '');
}

/** Waits until the workloads' pods are gone (terminating ones count as there), or `timeoutMs` passes: the pods left, and why when they could not be listed. */
export async function waitForPodsGone(o: PodsWaitOptions): Promise<{ left: PodLeft[]; why?: string; elapsedMs: number }> {
  const now = o.now ?? Date.now;
  const started = now();
  const progress = progressLine(o.out, o.tty, now);
  let left: PodLeft[] = [];
  for (;;) {
    const got = await podsLeft(o);
    const why = typeof got === 'string' ? `the pods cannot be listed: ${got}` : undefined;
    if (typeof got !== 'string') left = got;
    const elapsedMs = now() - started;
    if ((why === undefined && left.length === 0) || elapsedMs >= o.timeoutMs) {
      progress.clear();
      return why === undefined ? { left, elapsedMs } : { left, why, elapsedMs };
    }
    progress.show(why ?? `waiting for ${podsOf(left)} to go (${(elapsedMs / 1000).toFixed(1)}s): ${podNames(left)}`);
    await new Promise((r) => setTimeout(r, o.pollMs ?? 1_000));
  }
}
