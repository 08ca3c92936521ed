// The scale benchmark: the controller and `pinset status` over 5000 Nodes
// of realistic size (bench/scale-nodes.ts: 17.7 KB of JSON each, 2.2 KB of
// it metadata, plus each agent's status annotation) and 20 sets, on the
// in-process API server (test/support/apiserver.ts), which runs in this
// process; the controller runs as its own process (`pinset controller`,
// leader election and metrics on, as deployed) so its memory is its own.
//
//   npm run bench:scale                   # builds dist/, then about 25 minutes
//   BENCH_ONLY=scale npm run bench        # the same, as a section of npm run bench
//
// Measured (printed; raw in bench/scale.json), on the bundle as shipped
// (dist/, run with the Node.js flags of its first line; refused when built
// from other sources), and more briefly on the sources (BENCH_SCALE_CLI,
// default "bundle,sources": the first gets every measurement, the others
// the controller's and `pinset status`'s):
//   - the controller: start to every set's status written; RSS (VmRSS) and
//     peak (VmHWM, reset before each phase through /proc/PID/clear_refs),
//     and V8's heap in use (its metrics); with the sets and no Node too;
//   - the time from the last annotation change to the set's status written
//     (the status PATCH arriving at the API server): one node changing,
//     BENCH_SCALE_SAMPLES (10) times each way; and all nodes reporting a
//     set's new generation (two annotation writes per node, Progressing at
//     once and Ready after a pull of random length, spread over
//     BENCH_SCALE_ROLLOUT_SECONDS, 60);
//   - API requests of the controller at rest, by kind, over
//     BENCH_SCALE_REST_SECONDS (600), while kubelets update their Nodes'
//     status every 5 minutes (nodeStatusReportFrequency);
//   - `pinset status` (table and JSON) over all nodes: wall time and maximum
//     RSS (GNU time -v), median of BENCH_SCALE_STATUS_RUNS (3);
//   - rollout slots: BENCH_SCALE_SLOT_NODES (1000) simulated nodes following
//     the agents' slot protocol (src/rollout/gate.ts over Lease slots, by
//     polling) for a set with maxConcurrentNodes BENCH_SCALE_SLOT_MAX (50),
//     slot Leases of BENCH_SCALE_SLOT_LEASE_SECONDS (10; the agent's default
//     is 60, which only slows the waiting nodes' pace), each downloading 1
//     to 5 s: the most downloading at once, and that every one finished;
//   - the hand-over of rollout slots and the first wave's records
//     (bench/scale-slots.ts: polling against the queue with the
//     controller's granter, 6 and 5000 nodes; BENCH_SCALE_HANDOVER=0 skips
//     it, about 20 minutes);
//   - annotation writes per node per set rollout, from three real agents
//     (bench/agent-writes.ts; BENCH_SCALE_AGENT_WRITES=0 skips it).
// BENCH_SCALE_ONLY=slots runs the rollout slot sections alone (no Nodes,
// no roll-ups: the slots' figures do not depend on them), raw results in
// bench/scale-slots.json.
// BENCH_SCALE_BEFORE=<dir of another checkout, with node_modules> measures
// that checkout's sources the same way as the other builds, for a
// before/after. Sources run with the bundle's Node.js flags
// (scripts/build.ts NODE_FLAGS) unless BENCH_SCALE_NODE_FLAGS says otherwise
// (space-separated; "" for Node's defaults). Knobs: BENCH_SCALE_NODES
// (5000), BENCH_SCALE_SETS (20), BENCH_SCALE_RESULTS (the raw results' file,
// bench/scale.json).
import { spawn, type ChildProcess } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { makeNodeStatus } from '../src/agent/status.ts';
import { encodeNodeStatus } from '../src/api/node-status.ts';
import { API_VERSION, KIND, STATUS_ANNOTATION, type NodeSetStatus, type PinnedImageSetStatus } from '../src/api/types.ts';
import { AGENT_FIELD_MANAGER } from '../src/agent/node-sinks.ts';
import { clientNodeLeaseApi } from '../src/rollout/lease-api.ts';
import { LeaseRolloutSlots } from '../src/rollout/lease-slots.ts';
import { DEFAULT_SLOT_NAMESPACE, slotFree, slotSelector } from '../src/rollout/slots.ts';
import { NODE_FLAGS } from '../scripts/build.ts';
import { argvFor, bundledCli } from '../test/support/agent-process.ts';
import { ApiServer, type RecordedRequest } from '../test/support/apiserver.ts';
import { simulateRollout } from '../test/support/rollout-agents.ts';
import { runSlotBench } from './scale-slots.ts';
import { measureAgentWrites } from './agent-writes.ts';
import { NODE_POOLS, nodeName, realisticNode } from './scale-nodes.ts';
import { procStatus } from './proc.ts';

const ROOT = path.resolve(import.meta.dirname, '..');
const NODE = path.join(ROOT, 'node_modules/.bin/node');
const ONLY = process.env.BENCH_SCALE_ONLY ?? '';
if (ONLY !== '' && ONLY !== 'slots') throw new Error(`BENCH_SCALE_ONLY: ${JSON.stringify(ONLY)} is not "slots"`);
const RESULTS = process.env.BENCH_SCALE_RESULTS ? path.resolve(process.env.BENCH_SCALE_RESULTS) : fileURLToPath(new URL(ONLY === 'slots' ? './scale-slots.json' : './scale.json', import.meta.url));
const NODES = Number(process.env.BENCH_SCALE_NODES ?? 5000);
const SETS = Number(process.env.BENCH_SCALE_SETS ?? 20);
const SAMPLES = Number(process.env.BENCH_SCALE_SAMPLES ?? 10);
const ROLLOUT_SECONDS = Number(process.env.BENCH_SCALE_ROLLOUT_SECONDS ?? 60);
const REST_SECONDS = Number(process.env.BENCH_SCALE_REST_SECONDS ?? 600);
const STATUS_RUNS = Number(process.env.BENCH_SCALE_STATUS_RUNS ?? 3);
const BEFORE = process.env.BENCH_SCALE_BEFORE ?? '';
const SLOT_NODES = Number(process.env.BENCH_SCALE_SLOT_NODES ?? 1000);
const SLOT_MAX = Number(process.env.BENCH_SCALE_SLOT_MAX ?? 50);
const SLOT_LEASE_MS = Number(process.env.BENCH_SCALE_SLOT_LEASE_SECONDS ?? 10) * 1000;
const AGENT_WRITES = process.env.BENCH_SCALE_AGENT_WRITES !== '0';
const HANDOVER = process.env.BENCH_SCALE_HANDOVER !== '0';
/** Node.js flags for programs run from sources: the bundle's (scripts/build.ts NODE_FLAGS) unless given. */
const SOURCE_NODE_FLAGS: string[] = process.env.BENCH_SCALE_NODE_FLAGS !== undefined ? process.env.BENCH_SCALE_NODE_FLAGS.split(' ').filter(Boolean) : [...NODE_FLAGS];
type Build = 'bundle' | 'sources';
const BUILDS = (process.env.BENCH_SCALE_CLI ?? 'bundle,sources').split(',').map((b) => {
  if (b !== 'bundle' && b !== 'sources') throw new Error(`BENCH_SCALE_CLI: ${JSON.stringify(b)} is not bundle or sources`);
  return b as Build;
});
/** kubelet's nodeStatusReportFrequency: a Node's status is written at least this often. */
const KUBELET_REPORT_MS = 5 * 60_000;
const PIN_FILE = '99-pinset-6f1c2a4e-0d7b-4c56-9a51-3e8f0b2d7c11.conf';
const SETS_PATH = '/apis/pinset.dev/v1alpha1/pinnedimagesets';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const say = (line = '') => process.stdout.write(`${line}\n`);
const mb = (kb: number) => +(kb / 1024).toFixed(1);

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

async function waitFor<T>(pred: () => T | undefined | null | false, timeoutMs: number, what: string, everyMs = 5): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = pred();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(everyMs);
  }
}

// ----------------------------------------------------------------- the world

interface BenchSet {
  name: string;
  uid: string;
  generation: number;
  /** undefined: every node; else the pool it selects. */
  pool?: number;
  images: number;
}

function selects(set: BenchSet, i: number): boolean {
  return set.pool === undefined || i % NODE_POOLS === set.pool;
}

/** Half the sets select every node (fleet-wide), half one pool of NODES / 10 each: a node is in 11 of 20 sets. */
function createSets(api: ApiServer): BenchSet[] {
  const sets: BenchSet[] = [];
  for (let k = 0; k < SETS; k++) {
    const fleet = k < SETS / 2;
    const name = fleet ? `fleet-${['platform', 'observability', 'security', 'networking', 'storage'][k % 5]}-${k}` : `pool-${k % NODE_POOLS}-apps`;
    const images = [412, 36, 120, 18, 250, 9, 64, 31, 22, 140][k % 10]!;
    const spec: Record<string, unknown> = {
      nodeSelector: fleet ? { matchLabels: { 'node-role.kubernetes.io/worker': '' } } : { matchLabels: { 'pinset.bench/pool': `pool-${k % NODE_POOLS}` } },
      pinnedImages: Array.from({ length: Math.min(images, 50) }, (_, j) => ({ name: `registry.example.com/sets/${name}/image-${j}@sha256:${(k * 1000 + j).toString(16).padStart(64, '0')}` })),
    };
    const obj = api.create({ apiVersion: API_VERSION, kind: KIND, metadata: { name }, spec });
    sets.push({ name, uid: obj.metadata.uid!, generation: 1, pool: fleet ? undefined : k % NODE_POOLS, images });
  }
  return sets;
}

function entry(set: BenchSet, over: Partial<NodeSetStatus> = {}): NodeSetStatus {
  return {
    name: set.name,
    uid: set.uid,
    source: 'api',
    desiredGeneration: set.generation,
    currentGeneration: set.generation,
    images: { wanted: set.images, present: set.images, pinned: set.images, failed: 0, invalid: 0 },
    phase: 'Ready',
    reason: 'AllImagesPinned',
    ...over,
  };
}

/** What each node's agent reports, per set name. */
const reports = new Map<number, Map<string, NodeSetStatus>>();

/** The annotation as an agent writes it (format version 2, bounded, as src/agent/status.ts makes it). */
function annotation(i: number): string {
  const sets = [...reports.get(i)!.values()];
  return encodeNodeStatus(makeNodeStatus(nodeName(i), PIN_FILE, sets, new Date().toISOString()));
}

function report(api: ApiServer, i: number, e: NodeSetStatus): void {
  reports.get(i)!.set(e.name, e);
  api.patch('nodes', nodeName(i), { metadata: { annotations: { [STATUS_ANNOTATION]: annotation(i) } } });
}

function createNodes(api: ApiServer, sets: BenchSet[]): { bytes: number; metadataBytes: number; annotationBytes: number } {
  for (let i = 0; i < NODES; i++) {
    reports.set(i, new Map(sets.filter((s) => selects(s, i)).map((s) => [s.name, entry(s)])));
    const node = realisticNode(i);
    node.metadata.annotations = { ...node.metadata.annotations, [STATUS_ANNOTATION]: annotation(i) };
    api.create(node);
  }
  const sample = api.get('nodes', nodeName(7))!;
  const ann = sample.metadata.annotations![STATUS_ANNOTATION]!;
  const { [STATUS_ANNOTATION]: _drop, ...others } = sample.metadata.annotations!;
  const bare = { ...sample, metadata: { ...sample.metadata, annotations: others } };
  return { bytes: JSON.stringify(bare).length, metadataBytes: JSON.stringify(bare.metadata).length, annotationBytes: Buffer.byteLength(ann) };
}

// ---------------------------------------------------------------- processes

/** Resets VmHWM to the current RSS (proc(5), clear_refs "5"). */
function resetPeak(pid: number): void {
  try {
    writeFileSync(`/proc/${pid}/clear_refs`, '5');
  } catch {
    // an older kernel: the peak then counts from the start
  }
}

/** Controllers still running, ended if the benchmark is interrupted. */
const children = new Set<ChildProcess>();
function onInterrupt(): void {
  for (const c of children) c.kill('SIGKILL');
  process.exit(130);
}

/** How to run `pinset`: the bundle (dist/pinset.mjs) with the Node.js flags of its first line, or a checkout's sources. */
interface Cli {
  label: string;
  /** The command and the arguments before the subcommand. */
  argv: string[];
  cwd: string;
  env: NodeJS.ProcessEnv;
}

/** This process's environment without NODE_OPTIONS: the flags are on the command line. */
function cleanEnv(): NodeJS.ProcessEnv {
  const env = { ...process.env };
  delete env.NODE_OPTIONS;
  return env;
}

function sourcesCli(root: string, label: string): Cli {
  return { label, argv: [NODE, ...SOURCE_NODE_FLAGS, path.join(root, 'src/cli/main.ts')], cwd: root, env: cleanEnv() };
}

async function cliOf(build: Build): Promise<Cli> {
  if (build === 'sources') return sourcesCli(ROOT, 'sources');
  // Refuses a dist/ built from other sources than these.
  return { label: 'bundle', argv: [NODE, ...argvFor(await bundledCli())], cwd: ROOT, env: cleanEnv() };
}

async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address() as net.AddressInfo;
  await new Promise((r) => server.close(r));
  return port;
}

class ControllerProcess {
  readonly child: ChildProcess;
  readonly lines: Record<string, unknown>[] = [];
  stderr = '';
  readonly started = Date.now();
  readonly metricsUrl: string;

  /** Metrics on, as deployed (on a loopback port here): the heap figures come from them. */
  constructor(cli: Cli, kubeconfig: string, metricsPort: number) {
    const [command, ...pre] = cli.argv;
    this.metricsUrl = `http://127.0.0.1:${metricsPort}/metrics`;
    this.child = spawn(
      command!,
      [...pre, 'controller', '--kubeconfig', kubeconfig, '--identity', 'bench-controller', '--metrics-addr', `127.0.0.1:${metricsPort}`, '--log-level', 'info'],
      { cwd: cli.cwd, env: cli.env, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    children.add(this.child);
    this.child.once('exit', () => children.delete(this.child));
    let partial = '';
    this.child.stdout!.setEncoding('utf8').on('data', (chunk: string) => {
      partial += chunk;
      let nl: number;
      while ((nl = partial.indexOf('\n')) >= 0) {
        const line = partial.slice(0, nl);
        partial = partial.slice(nl + 1);
        try {
          if (this.lines.length < 100_000) this.lines.push(JSON.parse(line) as Record<string, unknown>);
        } catch {
          // not a log line
        }
      }
    });
    this.child.stderr!.setEncoding('utf8').on('data', (c: string) => {
      this.stderr = (this.stderr + c).slice(-4000);
    });
  }

  get pid(): number {
    return this.child.pid!;
  }

  /** V8's heap in use (prom-client's nodejs_heap_size_used_bytes), MB. */
  async heapUsedMb(): Promise<number> {
    try {
      const text = await (await fetch(this.metricsUrl)).text();
      return mb(Number(/^nodejs_heap_size_used_bytes (\S+)$/m.exec(text)?.[1] ?? NaN) / 1024);
    } catch {
      return NaN;
    }
  }

  async stop(): Promise<void> {
    if (this.child.exitCode !== null) return;
    const exited = new Promise((r) => this.child.once('exit', r));
    this.child.kill('SIGTERM');
    const t = setTimeout(() => this.child.kill('SIGKILL'), 10_000);
    await exited;
    clearTimeout(t);
  }
}

/** Runs a command under GNU time: wall time and maximum RSS of the process. */
async function timed(argv: string[], cwd: string, env: NodeJS.ProcessEnv): Promise<{ ms: number; maxRssKb: number; stdoutBytes: number; code: number | null; stderr: string }> {
  const started = Date.now();
  const child = spawn('/usr/bin/time', ['-v', ...argv], { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdoutBytes = 0;
  let stderr = '';
  child.stdout!.on('data', (c: Buffer) => (stdoutBytes += c.length));
  child.stderr!.setEncoding('utf8').on('data', (c: string) => (stderr += c));
  const code = await new Promise<number | null>((r) => child.once('exit', r));
  const ms = Date.now() - started;
  const maxRssKb = Number(/Maximum resident set size \(kbytes\): (\d+)/.exec(stderr)?.[1] ?? NaN);
  return { ms, maxRssKb, stdoutBytes, code, stderr: stderr.slice(0, 2000) };
}

// ------------------------------------------------------------- measurements

const statusWrites = (api: ApiServer, from: number, set?: string) =>
  api.requests.slice(from).filter((r) => r.method === 'PATCH' && r.path.startsWith(SETS_PATH) && r.path.endsWith('/status') && (!set || r.path === `${SETS_PATH}/${set}/status`));

function setStatus(api: ApiServer, name: string): PinnedImageSetStatus | undefined {
  return api.get('pinnedimagesets', name)?.status as PinnedImageSetStatus | undefined;
}

function expectedMatched(set: BenchSet): number {
  let n = 0;
  for (let i = 0; i < NODES; i++) if (selects(set, i)) n++;
  return n;
}

/**
 * Starts a controller once every set's status has been cleared, and waits
 * until it has written each set's status as the nodes report it (all Ready
 * for the current generation; with `noNodes`, no node matched).
 */
async function startController(api: ApiServer, cli: Cli, kubeconfig: string, sets: BenchSet[], noNodes = false) {
  for (const s of sets) api.patch('pinnedimagesets', s.name, { status: null });
  const from = api.requests.length;
  const c = new ControllerProcess(cli, kubeconfig, await freePort());
  await waitFor(
    () => {
      if (c.child.exitCode !== null) throw new Error(`the controller exited (${c.child.exitCode}): ${c.stderr}`);
      return sets.every((s) => {
        const st = setStatus(api, s.name);
        return st?.observedGeneration === s.generation && st.nodes?.ready === (noNodes ? 0 : expectedMatched(s)) && st.nodes?.matched === (noNodes ? 0 : expectedMatched(s));
      });
    },
    300_000,
    'every set rolled up',
    50,
  );
  const startMs = Date.now() - c.started;
  const nodeLists = api.requests.slice(from).filter((r) => r.path === '/api/v1/nodes' && r.query.watch === undefined);
  return { c, startMs, nodeListRequests: nodeLists.length, nodeListAccept: nodeLists[0]?.accept ?? '', nodeListLimit: nodeLists[0]?.query.limit ?? '' };
}

/**
 * One node changes its report on one set, SAMPLES times (Degraded, then
 * Ready again: two measurements each): time from the annotation written to
 * that set's status PATCH arriving.
 */
async function oneNodeChanges(api: ApiServer, sets: BenchSet[]): Promise<number[]> {
  const out: number[] = [];
  const change = async (i: number, set: BenchSet, e: NodeSetStatus) => {
    const from = api.requests.length;
    const t0 = Date.now();
    report(api, i, e);
    const w = await waitFor(() => statusWrites(api, from, set.name)[0], 30_000, `${set.name} written after node ${i} changed`, 2);
    out.push(w.at - t0);
    await sleep(1000);
  };
  for (let k = 0; k < SAMPLES; k++) {
    const i = (k * 977 + 13) % NODES;
    const candidates = sets.filter((s) => selects(s, i));
    const set = candidates[k % candidates.length]!;
    await change(i, set, entry(set, { phase: 'Degraded', reason: 'ImageNotFound', message: 'manifest unknown', lastFailedGeneration: set.generation, lastFailedGenerationError: 'ImageNotFound: manifest unknown' }));
    await change(i, set, entry(set));
  }
  return out;
}

/** Every selected node reports a new generation of one fleet-wide set: Progressing at once, Ready after a pull. */
async function fleetRollout(api: ApiServer, set: BenchSet, pid: number) {
  resetPeak(pid);
  const from = api.requests.length;
  const obj = api.get('pinnedimagesets', set.name)!;
  const spec = obj.spec as { pinnedImages: { name: string }[] };
  api.patch('pinnedimagesets', set.name, { spec: { pinnedImages: [...spec.pinnedImages, { name: `registry.example.com/sets/${set.name}/new@sha256:${'f'.repeat(64)}` }] } });
  set.generation += 1;
  set.images += 1;
  await waitFor(() => setStatus(api, set.name)?.observedGeneration === set.generation, 30_000, 'the new generation observed', 5);
  const nodes = Array.from({ length: NODES }, (_, i) => i).filter((i) => selects(set, i));
  // Agents see the new generation within a second or two (their watch), say
  // so at once (a change of phase), and report Ready when their pull ends.
  const events: { at: number; i: number; ready: boolean }[] = [];
  for (const i of nodes) {
    const seen = Math.random() * 2000;
    events.push({ at: seen, i, ready: false });
    events.push({ at: seen + 3000 + Math.random() * (ROLLOUT_SECONDS * 1000 - 5000), i, ready: true });
  }
  events.sort((a, b) => a.at - b.at);
  const t0 = Date.now();
  let lastWrite = 0;
  for (const ev of events) {
    const due = t0 + ev.at - Date.now();
    if (due > 0) await sleep(due);
    report(
      api,
      ev.i,
      entry(set, ev.ready ? {} : { currentGeneration: set.generation - 1, phase: 'Progressing', reason: 'Pulling', images: { wanted: set.images, present: set.images - 1, pinned: set.images, failed: 0, invalid: 0 } }),
    );
    lastWrite = Date.now();
  }
  const spreadMs = lastWrite - t0;
  const done = await waitFor(
    () => statusWrites(api, from, set.name).find((w) => (w.body as { status?: PinnedImageSetStatus }).status?.nodes?.ready === nodes.length),
    60_000,
    'the set Ready for the new generation',
    2,
  );
  const writes = statusWrites(api, from, set.name).filter((w) => w.at <= done.at).length;
  const otherWrites = statusWrites(api, from).filter((w) => !w.path.endsWith(`/${set.name}/status`)).length;
  await sleep(2000);
  return { nodes: nodes.length, annotationWrites: events.length, spreadMs, lastChangeToStatusMs: done.at - lastWrite, statusWrites: writes, otherSetsWrites: otherWrites, peakRssKb: procStatus(pid).hwmKb };
}

/** Requests of the controller while nothing changes but kubelets' status updates. */
async function atRest(api: ApiServer, seconds: number) {
  const from = api.requests.length;
  const started = Date.now();
  const perTick = NODES / (KUBELET_REPORT_MS / 1000);
  let next = 0;
  let kubelet = 0;
  while (Date.now() - started < seconds * 1000) {
    // The kubelet stand-in: every node's status once per nodeStatusReportFrequency.
    const due = Math.floor(((Date.now() - started) / 1000) * perTick);
    for (; next < due; next++) {
      const i = next % NODES;
      api.patch('nodes', nodeName(i), { status: { conditions: [{ type: 'Ready', status: 'True', reason: 'KubeletReady', message: 'kubelet is posting ready status', lastHeartbeatTime: new Date().toISOString(), lastTransitionTime: '2026-11-20T08:14:03Z' }] } });
      kubelet++;
    }
    await sleep(1000);
  }
  const minutes = (Date.now() - started) / 60_000;
  const reqs = api.requests.slice(from);
  const kind = (r: RecordedRequest) =>
    r.path.includes('/leases/') ? `lease ${r.method}` : r.query.watch === 'true' ? `watch ${r.path.split('/').at(-1)}` : r.method === 'GET' ? `list ${r.path.split('/').at(-1)}` : `${r.method} ${r.path}`;
  const byKind: Record<string, number> = {};
  for (const r of reqs) byKind[kind(r)] = (byKind[kind(r)] ?? 0) + 1;
  const perMinute = Object.fromEntries(Object.entries(byKind).map(([k, n]) => [k, +(n / minutes).toFixed(2)]));
  const statusWritesAtRest = reqs.filter((r) => r.method !== 'GET' && !r.path.includes('/leases/')).length;
  return { seconds: Math.round(minutes * 60), kubeletUpdates: kubelet, requests: reqs.length, perMinute, requestsPerMinute: +(reqs.length / minutes).toFixed(2), writesOtherThanLeases: statusWritesAtRest };
}

/**
 * SLOT_NODES simulated nodes (test/support/rollout-agents.ts: each a
 * RolloutGate over LeaseRolloutSlots, the agent's own protocol, sharing one
 * API client) want a set with maxConcurrentNodes = SLOT_MAX; each
 * "downloads" for 1 to 5 s once it holds a slot. Besides the simulation's
 * own count, every start of a download counts the live slot Leases in the
 * API server.
 */
async function slotRollout(api: ApiServer) {
  const set = api.create({
    apiVersion: API_VERSION,
    kind: KIND,
    metadata: { name: 'slots-bench' },
    spec: { rollout: { maxConcurrentNodes: SLOT_MAX }, pinnedImages: [{ name: `registry.example.com/sets/slots/app@sha256:${'e'.repeat(64)}` }] },
  });
  const leaseApi = clientNodeLeaseApi(api.kubeConfig());
  const from = api.requests.length;
  let maxLive = 0;
  const liveSlots = () =>
    api.list('leases', { namespace: DEFAULT_SLOT_NAMESPACE, labelSelector: slotSelector('slots-bench') }).filter((l) => {
      const spec = l.spec as { holderIdentity?: string; renewTime?: string; leaseDurationSeconds?: number };
      return !slotFree(spec.holderIdentity, spec.renewTime ? Date.parse(spec.renewTime) : undefined, (spec.leaseDurationSeconds ?? 0) * 1000, Date.now());
    }).length;
  const nodes = Array.from({ length: SLOT_NODES }, (_, i) => `sim-node-${i}`);
  const r = await simulateRollout({
    nodes,
    set: { name: 'slots-bench', uid: set.metadata.uid, maxConcurrentNodes: SLOT_MAX },
    // Polling, as before the hand-over (bench/scale-slots.ts measures both).
    slotsFor: (node) => new LeaseRolloutSlots({ api: leaseApi, namespace: DEFAULT_SLOT_NAMESPACE, identity: node, fieldManager: AGENT_FIELD_MANAGER, leaseDurationMs: SLOT_LEASE_MS, queue: false }),
    downloadMs: () => 1000 + Math.floor(Math.random() * 4000),
    timeoutMs: 30 * 60_000,
    onChange: (_node, downloading) => {
      if (downloading) maxLive = Math.max(maxLive, liveSlots());
    },
  });
  const reqs = api.requests.slice(from).filter((q) => q.path.includes('/leases'));
  const by = (m: string) => reqs.filter((q) => q.method === m).length;
  const conflicts = reqs.filter((q) => q.status === 409).length;
  await sleep(1000);
  const left = api.list('leases', { namespace: DEFAULT_SLOT_NAMESPACE, labelSelector: slotSelector('slots-bench') }).length;
  return {
    nodes: SLOT_NODES,
    maxConcurrentNodes: SLOT_MAX,
    leaseDurationMs: SLOT_LEASE_MS,
    maxDownloadingAtOnce: r.maxConcurrent,
    maxLiveSlotLeases: maxLive,
    finished: r.finished.length,
    durationMs: r.durationMs,
    leaseRequests: { lists: by('GET'), creates: by('POST'), updates: by('PUT'), deletes: by('DELETE'), conflicts409: conflicts },
    slotLeasesLeft: left,
  };
}

/** The rollout slot sections: the 1000-node rollout by polling, then the hand-over against polling (bench/scale-slots.ts). */
async function slotSections(api: ApiServer, cli: Cli, kubeconfig: string, results: Record<string, unknown>): Promise<void> {
  if (SLOT_NODES > 0) {
    const slots = await slotRollout(api);
    say(
      `rollout slots: ${slots.nodes} simulated nodes, maxConcurrentNodes ${slots.maxConcurrentNodes}, slot Leases of ${slots.leaseDurationMs / 1000} s: ` +
        `at most ${slots.maxDownloadingAtOnce} downloading at once (${slots.maxLiveSlotLeases} live slot Leases at most), ${slots.finished} of ${slots.nodes} finished in ${(slots.durationMs / 1000).toFixed(0)} s; ` +
        `Lease requests ${JSON.stringify(slots.leaseRequests)}; ${slots.slotLeasesLeft} slot Leases left`,
    );
    results.slots = slots;
  }
  if (!HANDOVER) return;
  const startController = async () => {
    const c = new ControllerProcess(cli, kubeconfig, await freePort());
    await waitFor(
      () => {
        if (c.child.exitCode !== null) throw new Error(`the controller exited (${c.child.exitCode}): ${c.stderr}`);
        const leading = (api.get('leases', 'pinset-controller', DEFAULT_SLOT_NAMESPACE)?.spec as { holderIdentity?: string } | undefined)?.holderIdentity === 'bench-controller';
        return leading && api.openWatches().some((w) => w.resource === 'leases' && w.query.labelSelector === 'app.kubernetes.io/managed-by=pinset-agent');
      },
      120_000,
      'the controller leading, its granter watching the agents\' Leases',
      50,
    );
    return { stop: () => c.stop() };
  };
  results.slotHandover = await runSlotBench({ api, say, startController });
}

async function statusRuns(cli: Cli, kubeconfig: string) {
  const env: NodeJS.ProcessEnv = { ...cli.env, COLUMNS: '200' };
  const out: Record<string, { ms: number; maxRssMb: number; outputBytes: number }> = {};
  for (const output of ['table', 'json']) {
    const runs = [];
    for (let r = 0; r < STATUS_RUNS; r++) {
      const x = await timed([...cli.argv, 'status', '--kubeconfig', kubeconfig, '-o', output], cli.cwd, env);
      if (x.code !== 0) throw new Error(`pinset status -o ${output} failed (${x.code}): ${x.stderr}`);
      runs.push(x);
    }
    out[output] = { ms: median(runs.map((x) => x.ms)), maxRssMb: mb(median(runs.map((x) => x.maxRssKb))), outputBytes: runs[0]!.stdoutBytes };
  }
  return out;
}

// --------------------------------------------------------------------- run

export async function runScale(): Promise<Record<string, unknown>> {
  const machine = `${os.cpus().length} CPUs (${os.cpus()[0]?.model ?? '?'}), ${(os.totalmem() / 2 ** 30).toFixed(1)} GiB RAM, Node ${process.version}`;
  say(`\n## Scale: ${NODES} Nodes, ${SETS} sets (in-process API server; the controller a process of its own)\n`);
  process.once('SIGINT', onInterrupt).once('SIGTERM', onInterrupt);
  // The builds first: one that cannot run (a dist/ older than its sources) fails before anything is started that would keep this process alive.
  const clis = await Promise.all(BUILDS.map(cliOf));
  const api = await ApiServer.start({ historyLimit: 2000 });
  const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-bench-scale-'));
  const main = clis[0]!;
  say(`measured: ${clis.map((c) => `${c.label} (${c.argv.join(' ')})`).join('; ')}${BEFORE ? `; and the sources of ${BEFORE}` : ''}`);
  const results: Record<string, unknown> = { machine, nodes: NODES, sets: SETS, builds: clis.map((c) => ({ label: c.label, argv: c.argv })), date: new Date().toISOString() };
  try {
    const kubeconfig = await api.writeKubeconfig(dir);
    if (ONLY === 'slots') {
      await slotSections(api, main, kubeconfig, results);
      await writeFile(RESULTS, JSON.stringify(results, null, 2) + '\n');
      say(`raw results: ${path.relative(process.cwd(), RESULTS)}`);
      return results;
    }
    const sets = createSets(api);

    // What the controller holds with the sets and no Node: Node.js, the Kubernetes client, the caches empty.
    {
      const empty = await startController(api, main, kubeconfig, sets, true);
      await sleep(10_000);
      const base = procStatus(empty.c.pid);
      const heap = await empty.c.heapUsedMb();
      await empty.c.stop();
      say(`controller with ${SETS} sets and no Nodes: RSS ${mb(base.rssKb)} MB, peak ${mb(base.hwmKb)} MB, heap used ${heap} MB`);
      results.controllerNoNodes = { rssMb: mb(base.rssKb), peakMb: mb(base.hwmKb), heapUsedMb: heap };
    }

    const t = Date.now();
    const sizes = createNodes(api, sets);
    say(`created ${NODES} nodes in ${Date.now() - t} ms: ${sizes.bytes} B of JSON each, ${sizes.metadataBytes} B of it metadata, plus a ${sizes.annotationBytes} B status annotation (${reports.get(7)!.size} sets)`);
    results.nodeSizes = sizes;

    // The controller on this checkout.
    const { c, startMs, nodeListRequests, nodeListAccept, nodeListLimit } = await startController(api, main, kubeconfig, sets);
    try {
      say(`controller: every set rolled up ${startMs} ms after start; Nodes listed in ${nodeListRequests} request(s), limit ${nodeListLimit || 'none'}, Accept ${nodeListAccept}`);
      await sleep(10_000);
      const settled = procStatus(c.pid);
      const settledHeap = await c.heapUsedMb();
      say(`controller RSS settled: ${mb(settled.rssKb)} MB, peak since start ${mb(settled.hwmKb)} MB, heap used ${settledHeap} MB`);
      resetPeak(c.pid);
      const oneNode = await oneNodeChanges(api, sets);
      say(`one node changes: last change to status written, ms: ${oneNode.join(', ')} (median ${median(oneNode)}, max ${Math.max(...oneNode)})`);
      const rollout = await fleetRollout(api, sets[0]!, c.pid);
      say(`all ${rollout.nodes} nodes report a new generation of ${sets[0]!.name} (${rollout.annotationWrites} annotation writes over ${(rollout.spreadMs / 1000).toFixed(0)} s): last change to status written ${rollout.lastChangeToStatusMs} ms; ${rollout.statusWrites} status writes of that set, ${rollout.otherSetsWrites} of others; controller peak ${mb(rollout.peakRssKb)} MB`);
      resetPeak(c.pid);
      const rest = await atRest(api, REST_SECONDS);
      const afterRest = procStatus(c.pid);
      const restHeap = await c.heapUsedMb();
      say(`at rest for ${rest.seconds} s (${rest.kubeletUpdates} kubelet status updates): ${rest.requestsPerMinute} requests/min ${JSON.stringify(rest.perMinute)}; writes other than the leader Lease: ${rest.writesOtherThanLeases}; RSS ${mb(afterRest.rssKb)} MB, peak ${mb(afterRest.hwmKb)} MB, heap used ${restHeap} MB`);
      results.controller = {
        startMs,
        nodeListRequests,
        nodeListLimit,
        nodeListAccept,
        settledRssMb: mb(settled.rssKb),
        startPeakMb: mb(settled.hwmKb),
        settledHeapUsedMb: settledHeap,
        oneNodeChangeMs: oneNode,
        oneNodeChangeMedianMs: median(oneNode),
        rollout: { ...rollout, peakRssMb: mb(rollout.peakRssKb) },
        rest: { ...rest, rssMb: mb(afterRest.rssKb), peakMb: mb(afterRest.hwmKb), heapUsedMb: restHeap },
      };
    } finally {
      await c.stop();
    }
    const status = await statusRuns(main, kubeconfig);
    say(`pinset status over ${NODES} nodes: table ${status.table!.ms} ms, max RSS ${status.table!.maxRssMb} MB; -o json ${status.json!.ms} ms, max RSS ${status.json!.maxRssMb} MB`);
    results.status = status;

    await slotSections(api, main, kubeconfig, results);

    if (AGENT_WRITES) results.agentWrites = await measureAgentWrites(say);

    // The other builds against the same API server: the sources, a checkout before these changes.
    const others: Cli[] = clis.slice(1);
    if (BEFORE) others.push(sourcesCli(BEFORE, `sources of ${BEFORE}`));
    const otherResults: Record<string, unknown>[] = [];
    for (const cli of others) {
      const o = await startController(api, cli, kubeconfig, sets);
      try {
        await sleep(10_000);
        const settled = procStatus(o.c.pid);
        const settledHeap = await o.c.heapUsedMb();
        resetPeak(o.c.pid);
        const oneNode = await oneNodeChanges(api, sets);
        const rollout = await fleetRollout(api, sets[0]!, o.c.pid);
        const rest = await atRest(api, Math.min(REST_SECONDS, 120));
        const after = procStatus(o.c.pid);
        const afterHeap = await o.c.heapUsedMb();
        say(
          `${cli.label}: every set rolled up ${o.startMs} ms after start, Nodes listed in ${o.nodeListRequests} request(s); RSS settled ${mb(settled.rssKb)} MB, peak since start ${mb(settled.hwmKb)} MB, heap used ${settledHeap} MB; ` +
            `one node changes: median ${median(oneNode)} ms; new generation on all nodes: ${rollout.lastChangeToStatusMs} ms after the last change, peak ${mb(rollout.peakRssKb)} MB; ` +
            `${rest.seconds} s at rest: ${rest.requestsPerMinute} requests/min, ${rest.writesOtherThanLeases} writes other than the Lease; RSS after ${mb(after.rssKb)} MB, heap used ${afterHeap} MB`,
        );
        const st = await statusRuns(cli, kubeconfig);
        say(`${cli.label}: pinset status table ${st.table!.ms} ms, max RSS ${st.table!.maxRssMb} MB; -o json ${st.json!.ms} ms, max RSS ${st.json!.maxRssMb} MB`);
        otherResults.push({
          label: cli.label,
          startMs: o.startMs,
          nodeListRequests: o.nodeListRequests,
          nodeListAccept: o.nodeListAccept,
          settledRssMb: mb(settled.rssKb),
          startPeakMb: mb(settled.hwmKb),
          settledHeapUsedMb: settledHeap,
          oneNodeChangeMedianMs: median(oneNode),
          rollout: { ...rollout, peakRssMb: mb(rollout.peakRssKb) },
          rest,
          rssAfterMb: mb(after.rssKb),
          heapUsedAfterMb: afterHeap,
          status: st,
        });
      } finally {
        await o.c.stop();
      }
    }
    if (otherResults.length) results.others = otherResults;
    await writeFile(RESULTS, JSON.stringify(results, null, 2) + '\n');
    say(`raw results: ${path.relative(process.cwd(), RESULTS)}`);
    return results;
  } finally {
    await api.stop();
    await rm(dir, { recursive: true, force: true });
    process.off('SIGINT', onInterrupt).off('SIGTERM', onInterrupt);
  }
}

if (import.meta.main) {
  runScale().catch((err: unknown) => {
    process.stderr.write(`bench: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exitCode = 1;
  });
}
