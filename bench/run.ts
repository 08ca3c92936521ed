// `npm run bench`: the agent's cost on a real containerd and a loopback
// registry; results and commands in BENCHMARKS.md. Not part of `npm test`.
//
//   1. overhead: K images of ~5 MB into a fresh containerd, from the start of
//      the agent's reconcile to all present, against a bare grpc-js loop that
//      makes the same PullImage calls at the same parallelism;
//   2. parallelism: the same at 1, 2, 4 and 8 parallel pulls;
//   3. a no-op resync with N images present (containerd with N real images,
//      and the CRI-O stand-in whose reload goes through D-Bus), with the pin
//      file writes and reloads it caused;
//   4. agent memory: RSS idle, and peak while reconciling an N-image set;
//   5. footprint (BENCH_ONLY=memory): RSS idle watching the API, idle on the
//      static folder with metrics served, peak and idle with an N-image set
//      from the API, `--once` whole process with K images present, and the
//      agent's own CPU time while K images are pulled, next to containerd's;
//   6. scale: the controller and `pinset status` over 5000 Nodes, rollout
//      slots with 1000 simulated nodes (bench/scale.ts, also `npm run
//      bench:scale`; BENCH_ONLY=scale runs it alone, without root or
//      containerd).
//
// The agent is the bundle as shipped (dist/, `npm run build`; refused when
// built from other sources), or with BENCH_AGENT=sources the TypeScript
// sources; BENCH_AGENT=bundle,sources measures section 5 for both.
//
// Every measurement is the median of BENCH_RUNS (default 5) runs, agent and
// baseline alternating in order. Results: printed as Markdown and written to
// bench/results.json.
import { execFile } from 'node:child_process';
import { readFile, rm, stat, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { stringify as dumpYaml } from 'yaml';
import { AgentProcess, bundledCli, readPinFile, runAgentOnce, SOURCE_CLI } from '../test/support/agent-process.ts';
import { installCommand, missingComponents, type ComponentName } from '../test/support/components.ts';
import { Containerd, CriClient } from '../test/support/containerd.ts';
import { ApiServer, type KubeObject } from '../test/support/apiserver.ts';
import { startCrioNode } from '../test/support/crio-node.ts';
import { pushRandom, pushSingleLayer } from '../test/support/images.ts';
import { Registry } from '../test/support/registry.ts';
import { NODE_FLAGS } from '../scripts/build.ts';
import { runScale } from './scale.ts';
import { cpuMs, procStatus } from './proc.ts';
import { agentFlags, apiSetRun, bareNodeRun, idleEmptyRun, logTime, median, onceAllPresentRun, parseLines, pushMany, scratch, setDoc, settle, sleep, type AgentRunner, type Scratch } from './footprint-runs.ts';

const RUNS = Number(process.env.BENCH_RUNS ?? 5);
const K = Number(process.env.BENCH_K ?? 16);
const IMAGE_BYTES = Number(process.env.BENCH_IMAGE_BYTES ?? 5 * 1000 * 1000);
const PARALLELISM = (process.env.BENCH_PARALLELISM ?? '1,2,4,8').split(',').map(Number);
/** BENCH_BARE_WARM=0: the bare loop into a containerd that has pulled nothing (by default it first pulls the warm-up image, as the running agent does). */
const BARE_WARM = process.env.BENCH_BARE_WARM !== '0';
const N = Number(process.env.BENCH_N ?? 1000);
const RESYNC_MS = 2000;
const execFileAsync = promisify(execFile);
const RESYNC_SAMPLES = 7;
const NEEDS: ComponentName[] = ['containerd', 'runc', 'docker-registry', 'dbus-daemon'];
// BENCH_ONLY=pulls, resync or memory runs one section.
// The agent runs with the Node.js flags the bundle's first line carries
// (scripts/build.ts NODE_FLAGS: what the image and the systemd unit run), for
// the sources too, so the two differ by bundling alone. BENCH_AGENT_NODE_FLAGS
// replaces them (space-separated; "" for Node's defaults), e.g.
// BENCH_AGENT_NODE_FLAGS="--max-semi-space-size=1 --max-old-space-size=64".
// BENCH_AGENT_NODE_OPTIONS is passed as NODE_OPTIONS besides.
const AGENT_NODE_FLAGS: string[] = process.env.BENCH_AGENT_NODE_FLAGS !== undefined ? process.env.BENCH_AGENT_NODE_FLAGS.split(' ').filter(Boolean) : [...NODE_FLAGS];
const AGENT_NODE_OPTIONS = process.env.BENCH_AGENT_NODE_OPTIONS ?? '';
const AGENT_ENV: NodeJS.ProcessEnv = AGENT_NODE_OPTIONS ? { NODE_OPTIONS: AGENT_NODE_OPTIONS } : {};
/** How Node.js runs the agent: its flags and NODE_OPTIONS, as a label. */
/** The agent of a build, as section 4 runs it. */
const runnerOf = (cli: string): AgentRunner => ({ cli, nodeArgs: AGENT_NODE_FLAGS, env: AGENT_ENV });
const NODE_SETUP = [...AGENT_NODE_FLAGS, ...(AGENT_NODE_OPTIONS ? [`NODE_OPTIONS=${AGENT_NODE_OPTIONS}`] : [])].join(' ') || 'Node.js defaults';
const ONLY = process.env.BENCH_ONLY ?? '';
type AgentBuild = 'bundle' | 'sources';
const AGENT_BUILDS = (process.env.BENCH_AGENT ?? 'bundle').split(',').map((b) => {
  if (b !== 'bundle' && b !== 'sources') throw new Error(`BENCH_AGENT: ${JSON.stringify(b)} is not bundle or sources`);
  return b as AgentBuild;
});
/** Program per build, filled in by main() (the bundle checked to be current). */
const CLI_OF: Partial<Record<AgentBuild, string>> = {};
/** The program sections 1 to 4 run: the first of BENCH_AGENT. */
let CLI = '';
const RESULTS = fileURLToPath(new URL('./results.json', import.meta.url));

function say(line = ''): void {
  process.stdout.write(`${line}\n`);
}

/**
 * A registries.conf that sends `registry.test` to the loopback registry, as
 * containerd's mirror does: the agent's disk estimate then asks the registry
 * the images come from, as on a node (without it, the name does not resolve
 * and every estimate waits on a failing DNS lookup).
 */
async function registryFlags(s: Scratch, mirrors: Record<string, string>): Promise<string[]> {
  const conf = path.join(s.dir, 'registries.conf');
  await writeFile(conf, `[[registry]]\nprefix = "registry.test"\nlocation = "${new URL(mirrors['registry.test']!).host}"\ninsecure = true\n`);
  return ['--registries-conf', conf, '--registries-conf-dir', path.join(s.dir, 'registries.conf.d')];
}

// ---------------------------------------------------------------------------
// 1 + 2: agent vs bare loop

interface PullRun {
  /** A running (warm) agent: start of the reconcile that pulls the set to the last image present (its "pulled image" line). */
  agentMs?: number;
  /** A running agent: start of the reconcile to its first PullImage (the agent's own work before pulling). */
  agentFirstPullMs?: number;
  /** A running agent: the set file written (the change the agent sees) to its first PullImage, the settle time (DEBOUNCE_MS) included. */
  changeFirstPullMs?: number;
  /** A running agent: the set file written to the last image present. */
  changeMs?: number;
  /** A running agent: its own CPU time (user + system) from writing the set to the reconcile's end. */
  agentCpuMs?: number;
  /** containerd's CPU time over the same window. */
  containerdCpuMs?: number;
  /** `--once`, cold: "pinset agent starting" to the last image present. */
  agentOnceMs?: number;
  /** Start of the reconcile to its end (the status after the last pull). */
  agentReconcileMs?: number;
  /** The whole `pinset agent --once` process, start-up included. */
  agentProcessMs?: number;
  bareMs?: number;
  /** The bare loop's own CPU time (the benchmark process, user + system) over its loop. */
  bareCpuMs?: number;
}


async function agentPullRun(mirrors: Record<string, string>, refs: string[], parallel: number): Promise<PullRun> {
  const c = await Containerd.start({ mirrors });
  await settle();
  const s = await scratch();
  try {
    await writeFile(path.join(s.staticDir, 'bench.yaml'), dumpYaml(setDoc('bench', refs)));
    const t0 = performance.now();
    const r = await runAgentOnce(agentFlags(s, c.endpoint, ['--max-parallel-pulls', String(parallel), ...(await registryFlags(s, mirrors))]), { env: AGENT_ENV, cli: CLI, nodeArgs: AGENT_NODE_FLAGS });
    const processMs = performance.now() - t0;
    if (r.code !== 0) throw new Error(`agent --once exited ${r.code}:\n${r.stderr.slice(-3000)}`);
    const lines = parseLines(r.stderr);
    const start = lines.find((l) => l.msg === 'pinset agent starting');
    const end = lines.filter((l) => l.msg === 'node status').at(-1);
    const pulled = lines.filter((l) => l.msg === 'pulled image');
    if (!start || !end || pulled.length !== refs.length) throw new Error(`agent logs lack start, status or pull lines:\n${r.stderr.slice(-3000)}`);
    const present = new Set((await listRepoDigests(c.endpoint)));
    for (const ref of refs) if (!present.has(ref)) throw new Error(`${ref} not present after the agent`);
    const lastPulled = Math.max(...pulled.map(logTime));
    return { agentOnceMs: lastPulled - logTime(start), agentReconcileMs: logTime(end) - logTime(start), agentProcessMs: processMs };
  } finally {
    await c.stop();
    await rm(s.dir, { recursive: true, force: true });
  }
}

/**
 * The agent as it runs on a node: a long-running process that has already
 * reconciled (a one-image warm-up set), then a set of the K images appears in
 * its static folder. From the start of the reconcile that pulls them (its
 * "reconcile finished" time minus its durationMs) to the last "pulled image".
 */
async function agentSteadyRun(mirrors: Record<string, string>, warmRef: string, refs: string[], parallel: number, cli = CLI): Promise<PullRun> {
  const c = await Containerd.start({ mirrors });
  await settle();
  const s = await scratch();
  const agent = AgentProcess.start(agentFlags(s, c.endpoint, ['--max-parallel-pulls', String(parallel), '--resync-interval', '10m', ...(await registryFlags(s, mirrors))]), { env: AGENT_ENV, cli, nodeArgs: AGENT_NODE_FLAGS });
  try {
    await writeFile(path.join(s.staticDir, 'warm.yaml'), dumpYaml(setDoc('warm', [warmRef])));
    await agent.waitForLog((l) => l.msg === 'reconcile finished' && (l.phases as Record<string, number>)?.Ready === 1, 60_000, 'the warm-up set Ready');
    await sleep(500);
    const from = agent.mark();
    const cpu0 = { agent: cpuMs(agent.child.pid), containerd: cpuMs(c.pid) };
    const written = Date.now();
    await writeFile(path.join(s.staticDir, 'bench.yaml'), dumpYaml(setDoc('bench', refs)));
    const done = await agent.waitForLog((l) => l.msg === 'reconcile finished' && l.pulls === refs.length, 120_000, 'the reconcile that pulls the set', from);
    const agentCpuMs = cpuMs(agent.child.pid) - cpu0.agent;
    const containerdCpuMs = cpuMs(c.pid) - cpu0.containerd;
    const pulled = agent.logs().slice(from).filter((l) => l.msg === 'pulled image');
    if (pulled.length !== refs.length) throw new Error(`expected ${refs.length} pulls, saw ${pulled.length}`);
    const present = new Set(await listRepoDigests(c.endpoint));
    for (const ref of refs) if (!present.has(ref)) throw new Error(`${ref} not present after the agent`);
    const start = logTime(done) - Number(done.durationMs);
    const firstPull = Math.min(...agent.logs().slice(from).filter((l) => l.msg === 'pulling image').map(logTime));
    const last = Math.max(...pulled.map(logTime));
    return { agentMs: last - start, agentFirstPullMs: firstPull - start, changeFirstPullMs: firstPull - written, changeMs: last - written, agentCpuMs, containerdCpuMs };
  } finally {
    await agent.stop();
    await c.stop();
    await rm(s.dir, { recursive: true, force: true });
  }
}

async function listRepoDigests(endpoint: string): Promise<string[]> {
  const cri = new CriClient(endpoint);
  try {
    return (await cri.listImages()).flatMap((i) => i.repoDigests);
  } finally {
    cri.close();
  }
}

/**
 * The bare loop. With `warmRef` (the default, BENCH_BARE_WARM) it first pulls
 * the warm-up image and waits as the running agent's runs do, so both
 * measure a containerd that has pulled one image a moment before (its
 * pulls are then slower than a containerd's first: BENCHMARKS.md, section 1).
 */
async function barePullRun(mirrors: Record<string, string>, refs: string[], parallel: number, warmRef?: string, ownProcess = false): Promise<PullRun> {
  const c = await Containerd.start({ mirrors });
  await settle();
  try {
    if (warmRef) {
      const warm = new CriClient(c.endpoint);
      await warm.pullImage(warmRef);
      warm.close();
      await sleep(500);
    }
    if (ownProcess) {
      const ctrd0 = cpuMs(c.pid);
      const { stdout } = await execFileAsync(process.execPath, [...AGENT_NODE_FLAGS, fileURLToPath(new URL('./bare-client.ts', import.meta.url)), c.endpoint, String(parallel), ...refs], { env: { PATH: process.env.PATH, ...AGENT_ENV } });
      const r = JSON.parse(stdout.trim().split('\n').at(-1)!) as { ms: number; cpuMs: number };
      return { bareMs: r.ms, bareCpuMs: r.cpuMs, containerdCpuMs: cpuMs(c.pid) - ctrd0 };
    }
    const t0 = performance.now();
    const cpu0 = { self: process.cpuUsage(), containerd: cpuMs(c.pid) };
    const cri = new CriClient(c.endpoint);
    let next = 0;
    await Promise.all(
      Array.from({ length: parallel }, async () => {
        while (next < refs.length) await cri.pullImage(refs[next++]);
      }),
    );
    const ms = performance.now() - t0;
    const self = process.cpuUsage(cpu0.self);
    const containerdCpuMs = cpuMs(c.pid) - cpu0.containerd;
    cri.close();
    return { bareMs: ms, bareCpuMs: (self.user + self.system) / 1000, containerdCpuMs };
  } finally {
    await c.stop();
  }
}

// ---------------------------------------------------------------------------
// 3 + 4: N images present, memory

interface ResyncRun {
  runtime: 'containerd' | 'cri-o stand-in';
  /** Initial reconcile of the N-image set: first start to all Ready. */
  convergeMs: number;
  /** Median duration of the no-op resyncs of this run. */
  noopMs: number;
  noopSamples: number[];
  /** Before the no-op resyncs (the first reconcile): the counters work. */
  fileWritesBefore: number;
  reloadsBefore: number;
  /** Over the no-op resyncs. */
  fileWrites: number;
  reloads: number;
  pinFileUnchanged: boolean;
  peakRssMb: number;
  idleRssMb: number;
}

async function metricsOf(url: string): Promise<Record<string, number>> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out: Record<string, number> = {};
  for (const line of text.split('\n')) {
    const m = /^(pinset_(?:pin_file_writes_total|reloads_total)(?:\{[^}]*\})?) (\S+)$/.exec(line);
    if (m) out[m[1]] = Number(m[2]);
  }
  return out;
}

function sumOf(m: Record<string, number>, prefix: string): number {
  return Object.entries(m)
    .filter(([k]) => k.startsWith(prefix))
    .reduce((a, [, v]) => a + v, 0);
}

async function resyncRun(runtime: ResyncRun['runtime'], endpoint: string, s: Scratch, refs: string[], extraFlags: string[], env?: NodeJS.ProcessEnv, api?: ApiServer): Promise<ResyncRun> {
  // With an API server the set comes from the API (the DaemonSet's case), else from the static folder.
  if (api) {
    api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'bench-node', labels: {} } });
    api.create(setDoc('bench-n', refs) as unknown as KubeObject);
    extraFlags = [...extraFlags, '--kubeconfig', await api.writeKubeconfig(s.dir)];
  } else {
    await writeFile(path.join(s.staticDir, 'bench.yaml'), dumpYaml(setDoc('bench-n', refs)));
  }
  const flags = agentFlags(s, endpoint, ['--resync-interval', `${RESYNC_MS / 1000}s`, '--metrics-addr', '127.0.0.1:0', ...extraFlags]);
  const t0 = Date.now();
  const agent = AgentProcess.start(flags, { env: { ...env, ...AGENT_ENV }, cli: CLI, nodeArgs: AGENT_NODE_FLAGS });
  let peakKb = 0;
  const sampler = setInterval(() => {
    const st = procStatus(agent.child.pid!);
    if (st.hwmKb > peakKb) peakKb = st.hwmKb;
  }, 50);
  try {
    const finished = () => agent.logs().filter((l) => l.msg === 'reconcile finished');
    const readyIndex = async () => {
      for (;;) {
        const f = finished();
        const i = f.findIndex((l) => (l.phases as Record<string, number> | undefined)?.Ready === 1 && Object.keys(l.phases as object).length === 1);
        if (i >= 0) return i;
        if (!agent.running) throw new Error(`agent exited:\n${agent.output().slice(-3000)}`);
        if (Date.now() - t0 > 15 * 60_000) throw new Error(`not Ready after 15 min:\n${agent.output().slice(-3000)}`);
        await sleep(100);
      }
    };
    const ri = await readyIndex();
    const convergeMs = logTime(finished()[ri]) - t0;
    const url = String(agent.logs().find((l) => l.msg === 'health and metrics listening')?.url);
    // Wait one resync so the window starts after any follow-up of the first reconcile.
    while (finished().length < ri + 2) await sleep(50);
    const before = await metricsOf(url);
    const pin = await readPinFile(s.dropinDir);
    const pinStat = pin ? await stat(pin.file) : null;
    const base = finished().length;
    while (finished().length < base + RESYNC_SAMPLES) {
      if (!agent.running) throw new Error(`agent exited:\n${agent.output().slice(-3000)}`);
      await sleep(50);
    }
    const window = finished().slice(base - 1, base + RESYNC_SAMPLES);
    const samples: number[] = [];
    for (let i = 1; i < window.length; i++) samples.push(logTime(window[i]) - logTime(window[i - 1]) - RESYNC_MS);
    const after = await metricsOf(url);
    const pinAfter = pin ? await stat(pin.file) : null;
    const writesInLogs = window.slice(1).filter((l) => l.wrote).length;
    const reloadsInLogs = window.slice(1).filter((l) => l.reloaded).length;
    const st = procStatus(agent.child.pid!);
    const idleKb = st.rssKb;
    peakKb = Math.max(peakKb, st.hwmKb);
    return {
      runtime,
      convergeMs,
      noopMs: median(samples),
      noopSamples: samples,
      fileWritesBefore: sumOf(before, 'pinset_pin_file_writes_total'),
      reloadsBefore: sumOf(before, 'pinset_reloads_total{result="success"}'),
      fileWrites: Math.max(writesInLogs, sumOf(after, 'pinset_pin_file_writes_total') - sumOf(before, 'pinset_pin_file_writes_total')),
      reloads: Math.max(reloadsInLogs, sumOf(after, 'pinset_reloads_total') - sumOf(before, 'pinset_reloads_total')),
      pinFileUnchanged: !!pinStat && !!pinAfter && pinStat.mtimeMs === pinAfter.mtimeMs && pinStat.ino === pinAfter.ino,
      peakRssMb: peakKb / 1024,
      idleRssMb: idleKb / 1024,
    };
  } finally {
    clearInterval(sampler);
    const code = await agent.stop();
    if (code !== 0) say(`  (agent exited ${code})`);
  }
}

async function containerdResyncRun(mirrors: Record<string, string>, refs: string[]): Promise<ResyncRun> {
  const c = await Containerd.start({ mirrors });
  const s = await scratch();
  try {
    return await resyncRun('containerd', c.endpoint, s, refs, []);
  } finally {
    await c.stop();
    await rm(s.dir, { recursive: true, force: true });
  }
}

async function crioResyncRun(refs: string[]): Promise<ResyncRun> {
  const node = await startCrioNode({ catalogue: Object.fromEntries(refs.map((r) => [r, { size: 1000 }])) });
  const api = await ApiServer.start();
  const s = await scratch();
  try {
    const dropin = { ...s, dropinDir: node.dropInDir };
    return await resyncRun('cri-o stand-in', node.endpoint, dropin, refs, ['--reload', 'dbus'], node.env, api);
  } finally {
    await api.stop();
    await node.stop();
    await rm(s.dir, { recursive: true, force: true });
  }
}

// ---------------------------------------------------------------------------

async function benchPulls(registry: Registry, mirrors: Record<string, string>): Promise<Record<string, unknown>> {
  say(`pushing ${K} images of ${IMAGE_BYTES} random bytes...`);
  const big = await pushMany(K, 4, (i) => pushRandom(registry, `bench/k${i}`, IMAGE_BYTES));
  const refs = big.map((b) => b.ref);
  const warm = (await pushSingleLayer(registry, 'bench/warm')).ref;

  const byParallel: Record<number, { agent: number[]; agentFirstPull: number[]; change: number[]; changeFirstPull: number[]; agentOnce: number[]; agentReconcile: number[]; agentProcess: number[]; bare: number[]; agentCpu: number[]; agentContainerdCpu: number[]; bareCpu: number[]; bareContainerdCpu: number[]; child: number[]; childCpu: number[] }> = {};
  for (const p of PARALLELISM) {
    const b = (byParallel[p] = { agent: [] as number[], agentFirstPull: [] as number[], change: [] as number[], changeFirstPull: [] as number[], agentOnce: [] as number[], agentReconcile: [] as number[], agentProcess: [] as number[], bare: [] as number[], agentCpu: [] as number[], agentContainerdCpu: [] as number[], bareCpu: [] as number[], bareContainerdCpu: [] as number[], child: [] as number[], childCpu: [] as number[] });
    for (let i = 0; i < RUNS; i++) {
      const order = i % 2 === 0 ? (['agent', 'bare', 'child', 'once'] as const) : (['child', 'bare', 'agent', 'once'] as const);
      for (const who of order) {
        if (who === 'agent') {
          const r = await agentSteadyRun(mirrors, warm, refs, p);
          b.agent.push(r.agentMs!);
          b.agentFirstPull.push(r.agentFirstPullMs!);
          b.change.push(r.changeMs!);
          b.changeFirstPull.push(r.changeFirstPullMs!);
          b.agentCpu.push(r.agentCpuMs!);
          b.agentContainerdCpu.push(r.containerdCpuMs!);
        } else if (who === 'child') {
          const r = await barePullRun(mirrors, refs, p, BARE_WARM ? warm : undefined, true);
          b.child.push(r.bareMs!);
          b.childCpu.push(r.bareCpuMs!);
        } else if (who === 'once') {
          const r = await agentPullRun(mirrors, refs, p);
          b.agentOnce.push(r.agentOnceMs!);
          b.agentReconcile.push(r.agentReconcileMs!);
          b.agentProcess.push(r.agentProcessMs!);
        } else {
          const r = await barePullRun(mirrors, refs, p, BARE_WARM ? warm : undefined);
          b.bare.push(r.bareMs!);
          b.bareCpu.push(r.bareCpuMs!);
          b.bareContainerdCpu.push(r.containerdCpuMs!);
        }
      }
    }
    say(`  parallel ${p}: agent ${b.agent.map(Math.round).join(', ')} ms (first PullImage at ${b.agentFirstPull.map(Math.round).join(', ')} ms; from the set written ${b.changeFirstPull.map(Math.round).join(', ')} ms); --once ${b.agentOnce.map(Math.round).join(', ')} ms; bare ${b.bare.map(Math.round).join(', ')} ms; ratio of medians ${(median(b.agent) / median(b.bare)).toFixed(3)}`);
  }

  say('\n## Pulls: agent vs bare grpc-js loop\n');
  say(`${K} images x ${(IMAGE_BYTES / 1e6).toFixed(1)} MB into a fresh containerd${BARE_WARM ? ' (the bare loop, as the running agent, after pulling one warm-up image)' : ''}\n`);
  say('| parallel pulls | bare loop (ms) | running agent: reconcile start to all present (ms) | ratio | running agent: reconcile start to first PullImage (ms) | running agent: first PullImage to all present (ms) | ratio | running agent: set written to first PullImage (ms) | running agent: set written to all present (ms) | `--once` (cold): start to all present (ms) | ratio | `--once`: whole reconcile incl. status (ms) | `--once`: whole process (ms) |');
  say('|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
  for (const [p, b] of Object.entries(byParallel)) {
    // The pulls alone (the agent's per-image cost): each run's span from its first PullImage, then the median.
    const pulling = median(b.agent.map((a, i) => a - b.agentFirstPull[i]!));
    say(
      `| ${p} | ${median(b.bare).toFixed(0)} | ${median(b.agent).toFixed(0)} | ${(median(b.agent) / median(b.bare)).toFixed(3)} | ${median(b.agentFirstPull).toFixed(0)} | ${pulling.toFixed(0)} | ${(pulling / median(b.bare)).toFixed(3)} | ${median(b.changeFirstPull).toFixed(0)} | ${median(b.change).toFixed(0)} | ${median(b.agentOnce).toFixed(0)} | ${(median(b.agentOnce) / median(b.bare)).toFixed(3)} | ${median(b.agentReconcile).toFixed(0)} | ${median(b.agentProcess).toFixed(0)} |`,
    );
  }
  say('\nThe bare loop as a process of its own with the agent\'s Node.js flags (bench/bare-client.ts): a client that runs as the agent runs, with none of its code (ms, medians)\n');
  say('| parallel pulls | bare loop (ms) | bare loop, own process, agent\'s flags (ms) | its ratio to the bare loop | its client CPU (ms) | running agent: first PullImage to all present (ms) | ratio of that to the own-process loop |');
  say('|---:|---:|---:|---:|---:|---:|---:|');
  for (const [p, b] of Object.entries(byParallel)) {
    const pulling = median(b.agent.map((a, i) => a - b.agentFirstPull[i]!));
    say(`| ${p} | ${median(b.bare).toFixed(0)} | ${median(b.child).toFixed(0)} | ${(median(b.child) / median(b.bare)).toFixed(3)} | ${median(b.childCpu).toFixed(0)} | ${pulling.toFixed(0)} | ${(pulling / median(b.child)).toFixed(3)} |`);
  }
  say('\nCPU time (ms, medians): the client, and containerd, over each run (the running agent: from the set written to its reconcile\'s end, so its estimate, pin file and verification are in; /proc, 10 ms ticks)\n');
  say('| parallel pulls | bare loop: client | bare loop: containerd | running agent | running agent: containerd |');
  say('|---:|---:|---:|---:|---:|');
  for (const [p, b] of Object.entries(byParallel)) {
    say(`| ${p} | ${median(b.bareCpu).toFixed(0)} | ${median(b.bareContainerdCpu).toFixed(0)} | ${median(b.agentCpu).toFixed(0)} | ${median(b.agentContainerdCpu).toFixed(0)} |`);
  }
  return Object.fromEntries(
    Object.entries(byParallel).map(([p, b]) => [
      p,
      {
        ...b,
        agentMedianMs: median(b.agent),
        agentFirstPullMedianMs: median(b.agentFirstPull),
        changeFirstPullMedianMs: median(b.changeFirstPull),
        changeMedianMs: median(b.change),
        agentPullingMedianMs: median(b.agent.map((a, i) => a - b.agentFirstPull[i]!)),
        agentOnceMedianMs: median(b.agentOnce),
        agentReconcileMedianMs: median(b.agentReconcile),
        agentProcessMedianMs: median(b.agentProcess),
        bareMedianMs: median(b.bare),
        ratio: median(b.agent) / median(b.bare),
        onceRatio: median(b.agentOnce) / median(b.bare),
      },
    ]),
  );
}

async function benchResync(registry: Registry, mirrors: Record<string, string>): Promise<Record<string, unknown>> {
  say(`\npushing ${N} small images...`);
  const small = await pushMany(N, 16, (i) => pushSingleLayer(registry, `bench/n${i}`));
  const refs = small.map((s) => s.ref);
  const resync: ResyncRun[] = [];
  for (let i = 0; i < RUNS; i++) {
    const order = i % 2 === 0 ? (['containerd', 'crio'] as const) : (['crio', 'containerd'] as const);
    for (const who of order) {
      const r = who === 'containerd' ? await containerdResyncRun(mirrors, refs) : await crioResyncRun(refs);
      resync.push(r);
      say(`  ${r.runtime}: first reconcile ${r.convergeMs} ms, no-op ${r.noopMs.toFixed(0)} ms (${r.noopSamples.join(', ')}), writes ${r.fileWrites}, reloads ${r.reloads}, peak ${r.peakRssMb.toFixed(1)} MB, idle ${r.idleRssMb.toFixed(1)} MB`);
    }
  }
  say(`\n## No-op resync with ${N} images present\n`);
  say('| runtime | no-op resync (ms, median) | slowest no-op (ms) | pin file writes | reloads | pin file untouched | writes, reloads in the first reconcile | agent start to set Ready (ms, median) |');
  say('|---|---:|---:|---:|---:|---|---|---:|');
  for (const rt of ['containerd', 'cri-o stand-in'] as const) {
    const rs = resync.filter((r) => r.runtime === rt);
    const all = rs.flatMap((r) => r.noopSamples);
    say(
      `| ${rt} | ${median(rs.map((r) => r.noopMs)).toFixed(0)} | ${Math.max(...all)} | ${rs.reduce((a, r) => a + r.fileWrites, 0)} | ${rs.reduce((a, r) => a + r.reloads, 0)} | ${rs.every((r) => r.pinFileUnchanged) ? 'yes' : 'NO'} | ${rs.map((r) => `${r.fileWritesBefore}/${r.reloadsBefore}`).join(' ')} | ${median(rs.map((r) => r.convergeMs)).toFixed(0)} |`,
    );
  }
  const cd = resync.filter((r) => r.runtime === 'containerd');
  const cr = resync.filter((r) => r.runtime === 'cri-o stand-in');
  say('\n## Agent memory (RSS) with the resync runs above (idle and empty: BENCH_ONLY=memory)\n');
  say('| state | MB (median) |');
  say('|---|---:|');
  say(`| idle, ${N} images pinned and present (containerd, static set) | ${median(cd.map((r) => r.idleRssMb)).toFixed(1)} |`);
  say(`| peak while reconciling ${N} images (containerd, static set, real pulls) | ${median(cd.map((r) => r.peakRssMb)).toFixed(1)} |`);
  say(`| idle, ${N} images pinned and present (CRI-O stand-in, set from the API) | ${median(cr.map((r) => r.idleRssMb)).toFixed(1)} |`);
  say(`| peak while reconciling ${N} images (CRI-O stand-in, set from the API) | ${median(cr.map((r) => r.peakRssMb)).toFixed(1)} |`);
  return { resync };
}

// ---------------------------------------------------------------------------
// 5: footprint, per build (bundle, sources)

async function benchMemory(registry: Registry, mirrors: Record<string, string>): Promise<Record<string, unknown>> {
  say(`\npushing ${K} images of ${IMAGE_BYTES} random bytes and ${N} small images...`);
  const big = await pushMany(K, 4, (i) => pushRandom(registry, `bench/k${i}`, IMAGE_BYTES));
  const refs = big.map((b) => b.ref);
  const warm = (await pushSingleLayer(registry, 'bench/warm')).ref;
  const nRefs = (await pushMany(N, 16, (i) => pushSingleLayer(registry, `bench/n${i}`))).map((p) => p.ref);

  type Row = { bareNode: number[]; idleStatic: number[]; idleApi: number[]; setPeak: number[]; setPeakNoEstimate: number[]; setIdle: number[]; setReadyMs: number[]; setCpuMs: number[]; onceMs: number[]; agentCpuMs: number[]; containerdCpuMs: number[] };
  const rows = Object.fromEntries(
    AGENT_BUILDS.map((b) => [b, { bareNode: [], idleStatic: [], idleApi: [], setPeak: [], setPeakNoEstimate: [], setIdle: [], setReadyMs: [], setCpuMs: [], onceMs: [], agentCpuMs: [], containerdCpuMs: [] } as Row]),
  ) as Record<AgentBuild, Row>;
  for (let i = 0; i < RUNS; i++) {
    // Builds alternate in order from run to run.
    const order = i % 2 === 0 ? AGENT_BUILDS : [...AGENT_BUILDS].reverse();
    for (const b of order) {
      const cli = CLI_OF[b]!;
      const r = rows[b];
      r.bareNode.push(await bareNodeRun(runnerOf(cli)));
      r.idleStatic.push(await idleEmptyRun(runnerOf(cli), mirrors, false));
      r.idleApi.push(await idleEmptyRun(runnerOf(cli), mirrors, true));
      const set = await apiSetRun(runnerOf(cli), nRefs, registry);
      r.setPeak.push(set.peakMb);
      r.setIdle.push(set.idleMb);
      r.setReadyMs.push(set.readyMs);
      r.setCpuMs.push(set.cpuMs);
      r.setPeakNoEstimate.push((await apiSetRun(runnerOf(cli), nRefs, registry, ['--disk-estimate-factor', '0'])).peakMb);
      r.onceMs.push(await onceAllPresentRun(runnerOf(cli), mirrors, refs));
      const pulls = await agentSteadyRun(mirrors, warm, refs, 4, cli);
      r.agentCpuMs.push(pulls.agentCpuMs!);
      r.containerdCpuMs.push(pulls.containerdCpuMs!);
      say(
        `  ${b}: node ${r.bareNode.at(-1)!.toFixed(1)} MB, static ${r.idleStatic.at(-1)!.toFixed(1)} MB, API ${r.idleApi.at(-1)!.toFixed(1)} MB, ` +
          `${N} from API peak ${set.peakMb.toFixed(1)} MB idle ${set.idleMb.toFixed(1)} MB, --once ${r.onceMs.at(-1)!.toFixed(0)} ms, ` +
          `CPU agent ${pulls.agentCpuMs} ms containerd ${pulls.containerdCpuMs} ms`,
      );
    }
  }
  say(`\n## Footprint (${NODE_SETUP})\n`);
  say(`| state | ${AGENT_BUILDS.join(' | ')} |`);
  say(`|---|${AGENT_BUILDS.map(() => '---:').join('|')}|`);
  const line = (label: string, pick: (r: Row) => number[], digits = 1) => say(`| ${label} | ${AGENT_BUILDS.map((b) => median(pick(rows[b])).toFixed(digits)).join(' | ')} |`);
  line('Node.js alone, a timer (MB)', (r) => r.bareNode);
  line('idle, watching the API, no sets (MB)', (r) => r.idleApi);
  line('idle, static folder only, metrics served (MB)', (r) => r.idleStatic);
  line(`peak, ${N}-image set from the API (MB)`, (r) => r.setPeak);
  line(`idle after, ${N}-image set from the API (MB)`, (r) => r.setIdle);
  line(`peak, ${N}-image set from the API, no size estimate (\`--disk-estimate-factor 0\`) (MB)`, (r) => r.setPeakNoEstimate);
  line(`${N}-image set from the API: agent start to Ready (ms)`, (r) => r.setReadyMs, 0);
  line(`${N}-image set from the API: agent CPU, start to Ready and 3 no-op resyncs (ms)`, (r) => r.setCpuMs, 0);
  line(`\`--once\` whole process, ${K} images present (ms)`, (r) => r.onceMs, 0);
  line(`agent CPU while ${K} images are pulled (ms)`, (r) => r.agentCpuMs, 0);
  line(`containerd CPU for the same pulls (ms)`, (r) => r.containerdCpuMs, 0);
  return { memory: { node: NODE_SETUP, builds: rows } };
}

async function main(): Promise<number> {
  if (ONLY === 'scale') {
    await runScale();
    return 0;
  }
  const missing = missingComponents(NEEDS);
  if (missing.length) {
    process.stderr.write(`bench: missing components; install with: ${installCommand(missing)}\n`);
    return 1;
  }
  for (const b of AGENT_BUILDS) CLI_OF[b] = b === 'bundle' ? await bundledCli() : SOURCE_CLI;
  CLI = CLI_OF[AGENT_BUILDS[0]!]!;
  const machine = `${os.cpus().length} CPUs (${os.cpus()[0]?.model ?? '?'}), ${(os.totalmem() / 2 ** 30).toFixed(1)} GiB RAM, ${os.type()} ${os.release()}, Node ${process.version}`;
  say(`# pinset benchmarks\n\nmachine: ${machine}\nruns per measurement: ${RUNS} (median), alternating\nagent: ${AGENT_BUILDS.join(', ')}\nagent's Node.js: ${NODE_SETUP}\n`);

  // Results of a partial run (BENCH_ONLY) are merged into the last full ones.
  const previous = JSON.parse(await readFile(RESULTS, 'utf8').catch(() => '{}')) as Record<string, unknown>;
  const results: Record<string, unknown> = { ...previous, machine, runs: RUNS, k: K, imageBytes: IMAGE_BYTES, n: N, date: new Date().toISOString() };
  const registry = await Registry.start();
  const mirrors = { 'registry.test': registry.url };
  try {
    if (ONLY === '' || ONLY === 'pulls') results.pulls = await benchPulls(registry, mirrors);
    if (ONLY === '' || ONLY === 'resync') Object.assign(results, await benchResync(registry, mirrors));
    if (ONLY === '' || ONLY === 'memory') Object.assign(results, await benchMemory(registry, mirrors));
    await writeFile(RESULTS, JSON.stringify(results, null, 2) + '\n');
    say(`\nraw results: ${path.relative(process.cwd(), RESULTS)}`);
    if (ONLY === '') await runScale();
    return 0;
  } finally {
    await registry.stop();
  }
}

main().then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    process.stderr.write(`bench: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exitCode = 1;
  },
);
