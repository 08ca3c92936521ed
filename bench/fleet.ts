// `npm run bench:fleet`: a fleet pre-loading one set over a thin link
// (test/support/fleet-bed.ts): N containerd nodes (1.7.24 and 2.1.9 in
// turn), each with its agent (the bundle, with its default flags) against
// the in-process API server; the registry reachable only across a shaped
// link that counts its bytes; a real distribution cache (Debian's 2.8.2,
// run from deploy/cache/'s configuration) in front where the row says so.
//
// Rows (each on a fresh bed: empty nodes, a cold cache, new images):
// - one node through the cache: one copy through the cache (the link's
//   bytes) and one node's time, what the other rows are divided by;
// - no cache, maxConcurrentNodes = N;
// - the cache, maxConcurrentNodes = N, no first wave;
// - the cache, maxConcurrentNodes = N, spec.rollout.firstWave {nodes: 1}:
//   measured only when this build's set validation accepts the field;
//   otherwise the row says the agent refuses it, and nothing is measured;
// - the cache, maxConcurrentNodes = 1.
//
// Per row: the link's bytes from the registry (egress) over the payload and
// over one copy through the cache; fleet time (set created to every node
// Ready with every image pinned, as the Nodes' status says) over one node's
// time; the longest stretch in which a rollout slot stayed free while a node
// had not started (slots are the set's Leases, src/rollout/slots.ts, read
// every 50 ms) and those free slot-seconds summed; the GETs per layer across
// the link, and, with a first wave, how many of them began once the first
// node held the image: requests that came while distribution 2.8 still had
// the blob in flight (BlobCrossings, test/support/fleet-bed.ts). And, for every node and image, when its agent logged `pulling
// image` and `pulled image` (relative to the set's creation).
//
// The ETA: `pinset controller` (the bundle) runs beside the fleet and
// writes the set's status.progress from the bytes the agents report (each
// node's bytes present of its total: the registries' sizes, and what
// containerd's ingests say is arriving); the set's status is read every
// 100 ms. At half-way (the first status with half the set present across
// the fleet, and again at half the fleet's time) the ETA it gave is
// compared with when the last node really was ready. The fleet here is a
// rollout shrunk in time: one node takes ~15 s where a 15 GB upgrade
// payload over 100 Mbit/s takes 20 minutes, about 80 times less. So the
// paces of the progress reports are shrunk alike: the agents write
// progress 1 s after their last write, then twice as long each time up to
// 5 s (--status-progress-interval; 1 then up to 5 minutes by default), the
// controller's window is 10 s (--progress-window; 10 minutes, twice the
// agents' longest pace) and it writes progress every 500 ms
// (--progress-interval; 30 s). Each node's report of the set is kept too
// (every change, read every 100 ms): what `node bench/eta-replay.ts`
// feeds an estimate to replay the run.
//
// Knobs: BENCH_FLEET_NODES (6), BENCH_FLEET_IMAGES (6),
// BENCH_FLEET_IMAGE_BYTES (5000000: a 30 MB set), BENCH_FLEET_MBIT (40),
// BENCH_FLEET_RUNS (1), BENCH_FLEET_ROWS (all: solo,no-cache,cache,first-wave,one-slot),
// BENCH_FLEET_AGENT_PROGRESS (1s), BENCH_FLEET_PROGRESS_WINDOW (10s),
// BENCH_FLEET_PROGRESS_INTERVAL (500ms).
// Results printed as Markdown and appended to bench/fleet.json (delete it
// to start over). Runs as root (containerd).
import { spawn } from 'node:child_process';
import { readFile, writeFile } from 'node:fs/promises';
import os from 'node:os';
import { fileURLToPath } from 'node:url';
import { validateSet } from '../src/api/validate.ts';
import { slotFree, slotSelector, DEFAULT_SLOT_NAMESPACE } from '../src/rollout/slots.ts';
import { STATUS_ANNOTATION, type SetProgress } from '../src/api/types.ts';
import { parseNodeStatus } from '../src/api/node-status.ts';
import { AgentProcess, argvFor, bundledCli } from '../test/support/agent-process.ts';
import { missingComponents, missingMessage, type ComponentName } from '../test/support/components.ts';
import { FleetBed, FLEET_REGISTRY, type ImagePull } from '../test/support/fleet-bed.ts';
import type { RecordedReport } from './eta-replay.ts';

const NODES = Number(process.env.BENCH_FLEET_NODES ?? 6);
const IMAGES = Number(process.env.BENCH_FLEET_IMAGES ?? 6);
const IMAGE_BYTES = Number(process.env.BENCH_FLEET_IMAGE_BYTES ?? 5_000_000);
const MBIT = Number(process.env.BENCH_FLEET_MBIT ?? 40);
const RUNS = Number(process.env.BENCH_FLEET_RUNS ?? 1);
const AGENT_PROGRESS = process.env.BENCH_FLEET_AGENT_PROGRESS ?? '1s';
const PROGRESS_WINDOW = process.env.BENCH_FLEET_PROGRESS_WINDOW ?? '10s';
const PROGRESS_INTERVAL = process.env.BENCH_FLEET_PROGRESS_INTERVAL ?? '500ms';
const RESULTS = fileURLToPath(new URL('./fleet.json', import.meta.url));
const READY_LIMIT_MS = 15 * 60_000;
const NEEDS: ComponentName[] = ['containerd-1.7', 'containerd-2.1', 'runc', 'docker-registry'];
const say = (line = '') => process.stdout.write(`${line}\n`);

type RowName = 'solo' | 'no-cache' | 'cache' | 'first-wave' | 'one-slot';
const ALL_ROWS: RowName[] = ['solo', 'no-cache', 'cache', 'first-wave', 'one-slot'];
const ROWS = (process.env.BENCH_FLEET_ROWS?.split(',').map((r) => r.trim()) ?? ALL_ROWS) as RowName[];

interface RowPlan {
  name: RowName;
  label: string;
  nodes: number;
  cache: boolean;
  rollout?: Record<string, unknown>;
}

const PLANS: Record<RowName, RowPlan> = {
  solo: { name: 'solo', label: 'one node, through the cache', nodes: 1, cache: true },
  'no-cache': { name: 'no-cache', label: `${NODES} nodes, no cache, maxConcurrentNodes: ${NODES}`, nodes: NODES, cache: false, rollout: { maxConcurrentNodes: NODES } },
  cache: { name: 'cache', label: `${NODES} nodes, the cache, maxConcurrentNodes: ${NODES}`, nodes: NODES, cache: true, rollout: { maxConcurrentNodes: NODES } },
  'first-wave': {
    name: 'first-wave',
    label: `${NODES} nodes, the cache, maxConcurrentNodes: ${NODES}, firstWave: {nodes: 1}`,
    nodes: NODES,
    cache: true,
    rollout: { maxConcurrentNodes: NODES, firstWave: { nodes: 1 } },
  },
  'one-slot': { name: 'one-slot', label: `${NODES} nodes, the cache, maxConcurrentNodes: 1`, nodes: NODES, cache: true, rollout: { maxConcurrentNodes: 1 } },
};

interface RowResult {
  row: RowName;
  label: string;
  /** Why the row was not measured. */
  notMeasured?: string;
  payloadBytes?: number;
  egressBytes?: number;
  ingressBytes?: number;
  fleetMs?: number;
  readyMs?: Record<string, number>;
  /** Longest stretch with a slot free while a node had not started; undefined without slots. */
  longestFreeSlotMs?: number;
  freeSlotSeconds?: number;
  /** GETs per layer across the link; inFlight: with a first wave, those that began once the first node held the image (all layers). */
  layerGets?: { mean: number; max: number; inFlight?: number };
  images?: { ref: string; bytes: number }[];
  /** Per node and image, ms after the set's creation. */
  pulls?: { node: string; version: string; image: string; startedMs: number; finishedMs?: number }[];
  /** The ETA the controller gave at half-way, and what was left really. */
  eta?: { halfPresent?: EtaCheck; halfTime?: EtaCheck };
  /** Every change of the set's status.progress, ms after the set's creation. */
  progress?: ProgressSample[];
  /** Every change of a node's report of the set, ms after the set's creation: what the controller's estimate is made from, for bench/eta-replay.ts. */
  reports?: NodeReportSample[];
}

/** One node's report of the set as read from its Node (ms after the set's creation; its annotation's updatedAt too): what bench/eta-replay.ts replays. */
type NodeReportSample = RecordedReport & { updatedAtMs?: number };

/** One reading of the set's status.progress (ms after the set's creation; eta too), with the bytes that had crossed the link by then. */
interface ProgressSample {
  atMs: number;
  unit: string;
  present: number;
  total: number;
  rate?: number;
  etaMs?: number;
  /** The status said the ETA is the earliest the set can be done (estimatedCompletionIsLowerBound). */
  etaLowerBound?: boolean;
  linkBytes: number;
}

/** At `atMs`, the controller said the fleet would be done `saidMs` later; it took `tookMs`. */
interface EtaCheck {
  atMs: number;
  saidMs?: number;
  /** The ETA said was a lower bound. */
  lowerBound?: boolean;
  tookMs: number;
  unit: string;
  present: number;
  total: number;
}

/** Why this build's agent would not accept the row's set, or undefined. */
function refused(plan: RowPlan): string | undefined {
  const set = {
    apiVersion: 'pinset.dev/v1alpha1',
    kind: 'PinnedImageSet',
    metadata: { name: 'probe' },
    spec: { pinnedImages: [{ name: `${FLEET_REGISTRY}/probe@sha256:${'0'.repeat(64)}` }], ...(plan.rollout ? { rollout: plan.rollout } : {}) },
  };
  const errors = validateSet(set).errors;
  return errors.length > 0 ? errors.join('; ') : undefined;
}

/** Samples of how many of the set's slots are held, every 50 ms until stopped. */
function sampleSlots(bed: FleetBed, set: string): { stop: () => { at: number; held: number }[] } {
  const samples: { at: number; held: number }[] = [];
  const timer = setInterval(() => {
    const now = Date.now();
    const leases = bed.api.list('leases', { namespace: DEFAULT_SLOT_NAMESPACE, labelSelector: slotSelector(set) });
    const held = leases.filter((l) => {
      const spec = (l as { spec?: { holderIdentity?: string; renewTime?: string; leaseDurationSeconds?: number } }).spec ?? {};
      const renewed = spec.renewTime ? Date.parse(spec.renewTime) : undefined;
      return !slotFree(spec.holderIdentity, renewed, spec.leaseDurationSeconds === undefined ? undefined : spec.leaseDurationSeconds * 1000, now);
    }).length;
    samples.push({ at: now, held });
  }, 50);
  return {
    stop: () => {
      clearInterval(timer);
      return samples;
    },
  };
}

/**
 * Free slots while a node waited: at each sample, min(slots not held,
 * nodes that have not started pulling). The longest stretch in which that
 * was above 0, and its integral in slot-seconds.
 */
function freeSlots(samples: readonly { at: number; held: number }[], max: number, firstPullAt: readonly number[]): { longestMs: number; slotSeconds: number } {
  let longest = 0;
  let runFrom: number | undefined;
  let slotMs = 0;
  for (let i = 0; i < samples.length; i++) {
    const s = samples[i]!;
    const waiting = firstPullAt.filter((t) => t > s.at).length;
    const free = Math.max(0, Math.min(max - s.held, waiting));
    const next = samples[i + 1]?.at ?? s.at;
    slotMs += free * (next - s.at);
    if (free > 0) runFrom ??= s.at;
    else if (runFrom !== undefined) {
      longest = Math.max(longest, s.at - runFrom);
      runFrom = undefined;
    }
  }
  if (runFrom !== undefined) longest = Math.max(longest, samples.at(-1)!.at - runFrom);
  return { longestMs: longest, slotSeconds: slotMs / 1000 };
}

/** `pinset controller` as shipped, against the bed's API server, with the paces shrunk as the fleet is (see the top). */
function startController(bed: FleetBed, cli: string): AgentProcess {
  const flags = [
    'controller', '--kubeconfig', bed.kubeconfig, '--leader-elect=false', '--metrics-addr', '', '--log-level', 'warn',
    '--debounce', '100ms', '--progress-window', PROGRESS_WINDOW, '--progress-interval', PROGRESS_INTERVAL,
  ];
  return AgentProcess.attach(spawn(process.execPath, [...argvFor(cli), ...flags], { stdio: ['ignore', 'pipe', 'pipe'] }));
}

/** The set's status.progress and each node's report of it every 100 ms, each change kept (ms after `created`). */
function sampleProgress(bed: FleetBed, set: string, created: number): { stop: () => { progress: ProgressSample[]; reports: NodeReportSample[] } } {
  const samples: ProgressSample[] = [];
  const reports: NodeReportSample[] = [];
  const lastReport = new Map<string, string>();
  let last = '';
  const timer = setInterval(() => {
    for (const n of bed.nodes) {
      const status = parseNodeStatus(bed.api.get('nodes', n.name)?.metadata.annotations?.[STATUS_ANNOTATION]).status;
      const e = status?.sets.find((x) => x.name === set);
      if (!e) continue;
      const updatedAt = status?.updatedAt ? Date.parse(status.updatedAt) - created : undefined;
      const r: Omit<NodeReportSample, 'atMs'> = {
        node: n.name, phase: e.phase, reason: e.reason, desiredGeneration: e.desiredGeneration, currentGeneration: e.currentGeneration,
        images: { wanted: e.images.wanted, present: e.images.present, pinned: e.images.pinned },
        ...(updatedAt !== undefined && !Number.isNaN(updatedAt) ? { updatedAtMs: updatedAt } : {}),
        ...(e.bytes ? { bytes: e.bytes } : {}), ...(e.rate !== undefined ? { rate: e.rate } : {}),
        ...(e.pullRate !== undefined ? { pullRate: e.pullRate } : {}), ...(e.mirrored ? { mirrored: true } : {}),
      };
      const key = JSON.stringify(r);
      if (lastReport.get(n.name) === key) continue;
      lastReport.set(n.name, key);
      reports.push({ atMs: Date.now() - created, ...r });
    }
    const p = (bed.api.get('pinnedimagesets', set)?.status as { progress?: SetProgress } | undefined)?.progress;
    if (!p) return;
    const eta = p.estimatedCompletionTime ? Date.parse(p.estimatedCompletionTime) - created : undefined;
    const lowerBound = eta !== undefined && p.estimatedCompletionIsLowerBound === true;
    const key = JSON.stringify([p.unit, p.present, p.total, p.rate, eta, lowerBound]);
    if (key === last) return;
    last = key;
    samples.push({
      atMs: Date.now() - created, unit: p.unit, present: p.present, total: p.total,
      ...(p.rate !== undefined ? { rate: p.rate } : {}), ...(eta !== undefined ? { etaMs: eta } : {}), ...(lowerBound ? { etaLowerBound: true } : {}),
      linkBytes: bed.link.egressBytes(),
    });
  }, 100);
  return { stop: () => (clearInterval(timer), { progress: samples, reports }) };
}

/** What the status said at `atMs` (the last reading at or before it), against the fleet's end. */
function etaAt(samples: readonly ProgressSample[], atMs: number, fleetMs: number): EtaCheck | undefined {
  const s = samples.filter((x) => x.atMs <= atMs).at(-1);
  if (!s) return undefined;
  return { atMs, tookMs: fleetMs - atMs, unit: s.unit, present: s.present, total: s.total, ...(s.etaMs !== undefined ? { saidMs: s.etaMs - atMs, ...(s.etaLowerBound ? { lowerBound: true } : {}) } : {}) };
}

/** The ETA at half-way: when the status first showed half the set present, and at half the fleet's time. */
function etaChecks(samples: readonly ProgressSample[], fleetMs: number): RowResult['eta'] {
  const half = samples.find((s) => s.total > 0 && s.present * 2 >= s.total);
  const halfPresent = half ? etaAt(samples, half.atMs, fleetMs) : undefined;
  const halfTime = etaAt(samples, fleetMs / 2, fleetMs);
  return { ...(halfPresent ? { halfPresent } : {}), ...(halfTime ? { halfTime } : {}) };
}

async function runRow(plan: RowPlan, cli: string, run: number): Promise<RowResult> {
  const why = refused(plan);
  if (why) return { row: plan.name, label: plan.label, notMeasured: `this build's agent refuses the set (${why}): the first wave is not in it yet, so nothing is measured` };
  const bed = await FleetBed.start({ nodes: plan.nodes, cli, linkBitsPerSecond: MBIT * 1e6, cache: plan.cache, agentFlags: ['--status-progress-interval', AGENT_PROGRESS] });
  const controller = startController(bed, cli);
  try {
    const images = await bed.pushImages(`run${run}-${plan.name}`, IMAGES, IMAGE_BYTES);
    const payload = images.reduce((n, i) => n + i.size, 0);
    const setName = `fleet-${plan.name}`;
    bed.link.reset();
    const slots = plan.rollout ? sampleSlots(bed, setName) : undefined;
    const created = bed.createSet(setName, images, plan.rollout);
    const progress = sampleProgress(bed, setName, created);
    const ready = await bed.waitAllReady(setName, IMAGES, READY_LIMIT_MS);
    const { progress: progressSamples, reports } = progress.stop();
    if (!controller.running) throw new Error(`the controller exited:\n${controller.output().slice(-3000)}`);
    const samples = slots?.stop();
    const fleetMs = Math.max(...ready.values()) - created;
    const pulls: ImagePull[] = bed.pulls();
    const versions = new Map(bed.nodes.map((n) => [n.name, n.version]));
    const firstPull = bed.nodes.map((n) => Math.min(...pulls.filter((p) => p.node === n.name).map((p) => p.startedAt)));
    const max = typeof plan.rollout?.maxConcurrentNodes === 'number' ? plan.rollout.maxConcurrentNodes : undefined;
    const free = samples && max !== undefined ? freeSlots(samples, max, firstPull) : undefined;
    const layers = (await bed.manifests(images)).flatMap((m) => m.layers);
    const gets = layers.map((l) => bed.link.blobGets(l.digest).filter((g) => g.status === 200).length);
    const layerDigests = new Set(layers.map((l) => l.digest));
    const inFlight = plan.rollout?.firstWave ? (await bed.blobCrossings(images)).filter((c) => layerDigests.has(c.blob.digest)).reduce((n, c) => n + c.laterGets.length, 0) : undefined;
    const result: RowResult = {
      row: plan.name,
      label: plan.label,
      payloadBytes: payload,
      egressBytes: bed.link.egressBytes(),
      ingressBytes: bed.link.ingressBytes(),
      fleetMs,
      readyMs: Object.fromEntries([...ready].map(([n, t]) => [n, t - created])),
      longestFreeSlotMs: free?.longestMs,
      freeSlotSeconds: free?.slotSeconds,
      layerGets: { mean: gets.reduce((a, b) => a + b, 0) / gets.length, max: Math.max(...gets), ...(inFlight !== undefined ? { inFlight } : {}) },
      images: images.map((i) => ({ ref: i.ref, bytes: i.size })),
      pulls: pulls.map((p) => ({
        node: p.node,
        version: versions.get(p.node) ?? '',
        image: p.image,
        startedMs: p.startedAt - created,
        ...(p.finishedAt !== undefined ? { finishedMs: p.finishedAt - created } : {}),
      })),
      eta: etaChecks(progressSamples, fleetMs),
      progress: progressSamples,
      reports,
    };
    return result;
  } finally {
    await controller.stop();
    await bed.stop();
  }
}

const f2 = (n: number | undefined) => (n === undefined ? '-' : n.toFixed(2));
const f1 = (n: number | undefined) => (n === undefined ? '-' : n.toFixed(1));

function table(rows: readonly RowResult[]): string[] {
  const solo = rows.find((r) => r.row === 'solo' && r.egressBytes !== undefined);
  const out = [
    '| | link egress, x payload | x one copy through the cache | fleet time (s) | x one node\'s | longest free slot (s) | free slot-seconds | GETs per layer (mean, max) |',
    '|---|---:|---:|---:|---:|---:|---:|---|',
  ];
  for (const r of rows) {
    if (r.notMeasured) {
      out.push(`| ${r.label} | not measured: ${r.notMeasured} | | | | | | |`);
      continue;
    }
    out.push(
      `| ${r.label} | ${f2(r.egressBytes! / r.payloadBytes!)} | ${solo ? f2(r.egressBytes! / solo.egressBytes!) : '-'} | ${f1(r.fleetMs! / 1000)} | ${solo ? f2(r.fleetMs! / solo.fleetMs!) : '-'} | ${f1(r.longestFreeSlotMs === undefined ? undefined : r.longestFreeSlotMs / 1000)} | ${f1(r.freeSlotSeconds)} | ${f1(r.layerGets!.mean)}, ${r.layerGets!.max}${r.layerGets!.inFlight !== undefined ? ` (${r.layerGets!.inFlight} in flight)` : ''} |`,
    );
  }
  return out;
}

const pct = (c: EtaCheck) => (c.saidMs === undefined ? undefined : ((c.saidMs - c.tookMs) / c.tookMs) * 100);

/** "said 12.0 s, took 10.0 s (+20%)", or why there was no ETA. */
function etaText(c: EtaCheck | undefined): string {
  if (!c) return 'no progress in the status yet';
  const at = `at ${f1(c.atMs / 1000)} s (${c.present} of ${c.total} ${c.unit})`;
  if (c.saidMs === undefined) return `${at}: no ETA, took ${f1(c.tookMs / 1000)} s`;
  const e = pct(c)!;
  return `${at}: said ${c.lowerBound ? 'at least ' : ''}${f1(c.saidMs / 1000)} s, took ${f1(c.tookMs / 1000)} s (${e >= 0 ? '+' : ''}${e.toFixed(0)}%${c.lowerBound ? ', a lower bound' : ''})`;
}

/** Per row: the ETA the controller gave at half-way (half the set present; half the fleet's time) and what was really left. */
function etaLines(rows: readonly RowResult[]): string[] {
  const out: string[] = [];
  for (const r of rows) {
    if (!r.eta) continue;
    out.push(`- ${r.label}: half present ${etaText(r.eta.halfPresent)}; half the time ${etaText(r.eta.halfTime)}`);
  }
  return out;
}

/**
 * The targets the first wave and the slot hand-over are built to meet
 * (N = 6): with the first wave, egress at most 1.1 x one copy through the
 * cache and the fleet at most 1.5 x one node's time; with one slot, at most
 * 5 s of free slot in all and the fleet at most 1.75 x one node's time.
 */
function targets(rows: readonly RowResult[]): string[] {
  const solo = rows.find((r) => r.row === 'solo' && r.egressBytes !== undefined);
  if (!solo) return [];
  const check = (ok: boolean) => (ok ? 'met' : 'NOT met');
  const out: string[] = [];
  const wave = rows.find((r) => r.row === 'first-wave');
  if (wave?.notMeasured) out.push('- first wave: not measured');
  else if (wave) {
    const egress = wave.egressBytes! / solo.egressBytes!;
    const time = wave.fleetMs! / solo.fleetMs!;
    out.push(`- first wave: egress ${f2(egress)} x one copy (target <= 1.1: ${check(egress <= 1.1)}), fleet ${f2(time)} x one node's (target <= 1.5: ${check(time <= 1.5)})`);
  }
  const one = rows.find((r) => r.row === 'one-slot' && r.fleetMs !== undefined);
  if (one) {
    const time = one.fleetMs! / solo.fleetMs!;
    out.push(`- one slot: ${f1(one.freeSlotSeconds)} s of free slot in all (target <= 5: ${check((one.freeSlotSeconds ?? Infinity) <= 5)}), fleet ${f2(time)} x one node's (target <= 1.75: ${check(time <= 1.75)})`);
  }
  return out;
}

/** Per node: when its first image started and its last finished, and when it was Ready (s after the set's creation). */
function timeline(r: RowResult): string[] {
  if (!r.pulls) return [];
  const nodes = [...new Set(r.pulls.map((p) => p.node))].sort((a, b) => Number(a.split('-')[1]) - Number(b.split('-')[1]));
  return nodes.map((n) => {
    const ps = r.pulls!.filter((p) => p.node === n);
    const from = Math.min(...ps.map((p) => p.startedMs)) / 1000;
    const to = Math.max(...ps.map((p) => p.finishedMs ?? NaN)) / 1000;
    return `  ${n} (containerd ${ps[0]!.version}): images ${from.toFixed(1)}-${to.toFixed(1)} s, Ready at ${((r.readyMs?.[n] ?? NaN) / 1000).toFixed(1)} s`;
  });
}

async function main(): Promise<void> {
  const missing = missingComponents(NEEDS);
  if (missing.length > 0) throw new Error(missingMessage(missing));
  if (process.getuid?.() !== 0) throw new Error('bench:fleet runs containerd: run it as root');
  const cli = await bundledCli();
  const started = new Date().toISOString();
  say(`# bench:fleet: ${NODES} nodes, ${IMAGES} images of ${(IMAGE_BYTES / 1e6).toFixed(1)} MB, a ${MBIT} Mbit/s link; load average at start ${os.loadavg().map((l) => l.toFixed(2)).join(' ')}`);
  const runs: RowResult[][] = [];
  for (let run = 1; run <= RUNS; run++) {
    const rows: RowResult[] = [];
    for (const name of ROWS) {
      const plan = PLANS[name];
      if (!plan) throw new Error(`BENCH_FLEET_ROWS: no row ${JSON.stringify(name)} (rows: ${ALL_ROWS.join(', ')})`);
      say(`run ${run}: ${plan.label} ... (load ${os.loadavg()[0]!.toFixed(2)})`);
      const r = await runRow(plan, cli, run);
      rows.push(r);
      for (const l of timeline(r)) say(l);
    }
    runs.push(rows);
    say();
    say(`Run ${run} of ${RUNS}:`);
    say();
    for (const l of table(rows)) say(l);
    say();
    for (const l of targets(rows)) say(l);
    say();
    say(`The controller's ETA at half-way (agents' progress every ${AGENT_PROGRESS}, the controller's window ${PROGRESS_WINDOW}, its progress written every ${PROGRESS_INTERVAL}):`);
    say();
    for (const l of etaLines(rows)) say(l);
    say();
  }
  let previous: unknown[] = [];
  try {
    const old = JSON.parse(await readFile(RESULTS, 'utf8')) as { invocations?: unknown[] };
    previous = old.invocations ?? [];
  } catch {
    // none yet
  }
  const invocation = {
    started, nodes: NODES, images: IMAGES, imageBytes: IMAGE_BYTES, mbit: MBIT,
    paces: { agentProgress: AGENT_PROGRESS, progressWindow: PROGRESS_WINDOW, progressInterval: PROGRESS_INTERVAL },
    loadAverageAtEnd: os.loadavg(), runs,
  };
  await writeFile(RESULTS, `${JSON.stringify({ invocations: [...previous, invocation] }, null, 1)}\n`);
  say(`raw: ${RESULTS}`);
}

await main();
