// `node bench/pull-profile.ts`: where the running agent's time goes between
// "reconcile starts" and "last image present", in the pull benchmark of
// BENCHMARKS.md section 1 (K images of ~5 MB into a fresh containerd, the
// bundle, a warm agent that has reconciled a one-image set first).
//
// The agent runs with the bundle's Node.js flags plus --cpu-prof. Its CPU
// profile is cut to that window (V8 stamps samples with CLOCK_MONOTONIC,
// which this process reads too, so they line up with the log lines' wall
// times) and each sample is put down to the first frame, from the leaf up,
// that is pinset's own source file or a package (through the bundle's
// source maps; Node's internals count for their caller). Printed per
// parallelism (median of the runs):
//   - the steps before the first PullImage: CPU bursts and the waits
//     between them, in order, each named by what ran;
//   - the CPU per category, before the first PullImage and while pulling;
//   - at parallelism 1, the gap between one "pulled image" and the next
//     "pulling image" (the agent's own time between two pulls), and the
//     agent CPU per image;
//   - PullImage's own duration as each client sees it, the agent's (its
//     "pulled image" durationMs) next to a bare grpc-js loop's (runs
//     alternating with the agent's, each on a fresh containerd), and as
//     containerd's log has it: what containerd takes per image with the
//     agent as its client, and without.
//
// Knobs: PROFILE_PARALLELISM (1,4), PROFILE_RUNS (3), PROFILE_INTERVAL_US
// (250, the sampling interval), BENCH_K (16), BENCH_IMAGE_BYTES (5000000),
// PROFILE_AGENTS (bundles to compare, comma-separated, each optionally
// `|<Node.js flags>` replacing the base ones; default this checkout's
// dist/pinset.mjs), BENCH_AGENT_NODE_FLAGS (the base flags, as bench/run.ts
// takes them; default the bundle's), PROFILE_NODE_FLAGS (more, e.g.
// --trace-gc), PROFILE_AGENT_FLAGS (more agent flags, e.g.
// `--disk-estimate-factor 0`), PROFILE_BARE_WARM=1 (the bare loop pulls the
// warm-up image first, as the agent does), PROFILE_LEAVES=<text> (the leaf
// frames of the steps naming <text>), PROFILE_KEEP=1 keeps the .cpuprofile
// files (their folder is printed). Runs as root (containerd needs it);
// needs `npm run build` first.
import { execFile } from 'node:child_process';
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { SourceMap } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { stringify as dumpYaml } from 'yaml';
import { NODE_FLAGS } from '../scripts/build.ts';
import { AgentProcess, bundledCli, type LogLine } from '../test/support/agent-process.ts';
import { Containerd, CriClient } from '../test/support/containerd.ts';
import { pushRandom, pushSingleLayer } from '../test/support/images.ts';
import { Registry } from '../test/support/registry.ts';

const PARALLELISM = (process.env.PROFILE_PARALLELISM ?? '1,4').split(',').map(Number);
const RUNS = Number(process.env.PROFILE_RUNS ?? 3);
const INTERVAL_US = Number(process.env.PROFILE_INTERVAL_US ?? 250);
const K = Number(process.env.BENCH_K ?? 16);
const IMAGE_BYTES = Number(process.env.BENCH_IMAGE_BYTES ?? 5 * 1000 * 1000);
const KEEP = process.env.PROFILE_KEEP === '1';
/** PROFILE_LEAVES=<text>: the leaf frames of the samples before the first PullImage whose step names <text> (what a step spends its CPU in). */
const LEAVES = process.env.PROFILE_LEAVES ?? '';
/** More agent flags, e.g. `--disk-estimate-factor 0` (no estimate). */
const AGENT_FLAGS = (process.env.PROFILE_AGENT_FLAGS ?? '').split(' ').filter(Boolean);
/** PROFILE_BARE_WARM=1: the bare loop first pulls the warm-up image and waits as long as the agent's runs do, so containerd is in the same state. */
const BARE_WARM = process.env.PROFILE_BARE_WARM === '1';
/** The agent's Node.js flags, as bench/run.ts takes them (default: the bundle's, scripts/build.ts NODE_FLAGS). */
const BASE_FLAGS: string[] = process.env.BENCH_AGENT_NODE_FLAGS !== undefined ? process.env.BENCH_AGENT_NODE_FLAGS.split(' ').filter(Boolean) : [...NODE_FLAGS];
/** More Node.js flags for the agent, e.g. --trace-gc (its lines are printed). */
const EXTRA_FLAGS = (process.env.PROFILE_NODE_FLAGS ?? '').split(' ').filter(Boolean);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const execFileAsync = promisify(execFile);

function median(xs: number[]): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

const say = (line = '') => process.stdout.write(`${line}\n`);
const logTime = (l: LogLine) => Date.parse(String(l.time));

/** Wall-clock ms minus CLOCK_MONOTONIC ms, as this process sees them (the agent's profile uses the same monotonic clock). */
function wallMinusMono(): number {
  let best = Number.MAX_SAFE_INTEGER;
  let off = 0;
  for (let i = 0; i < 20; i++) {
    const a = process.hrtime.bigint();
    const w = Date.now();
    const b = process.hrtime.bigint();
    if (Number(b - a) < best) {
      best = Number(b - a);
      off = w - Number((a + b) / 2n) / 1e6;
    }
  }
  return off;
}

// ---------------------------------------------------------------------------
// The profile

interface CallFrame {
  functionName: string;
  url: string;
  lineNumber: number;
  columnNumber: number;
}
interface ProfileNode {
  id: number;
  callFrame: CallFrame;
  children?: number[];
}
interface CpuProfile {
  nodes: ProfileNode[];
  startTime: number;
  endTime: number;
  samples: number[];
  timeDeltas: number[];
}

const maps = new Map<string, SourceMap | null>();
async function sourceMapOf(url: string): Promise<SourceMap | null> {
  if (maps.has(url)) return maps.get(url)!;
  let m: SourceMap | null = null;
  try {
    const file = fileURLToPath(url);
    m = new SourceMap(JSON.parse(await readFile(`${file}.map`, 'utf8')));
  } catch {
    m = null;
  }
  maps.set(url, m);
  return m;
}

/** What a frame is, for attribution: pinset's source file, a package, Node's internals, or V8's pseudo-frames. */
interface Where {
  kind: 'src' | 'pkg' | 'node' | 'vm';
  name: string;
  fn: string;
}

async function resolveFrame(cf: CallFrame): Promise<Where> {
  if (!cf.url) {
    const n = cf.functionName;
    if (n === '(idle)' || n === '(garbage collector)' || n === '(program)' || n === '(root)') return { kind: 'vm', name: n, fn: n };
    return { kind: 'node', name: 'native', fn: n };
  }
  if (cf.url.startsWith('node:')) return { kind: 'node', name: cf.url, fn: cf.functionName };
  let source = cf.url;
  let fn = cf.functionName;
  const m = await sourceMapOf(cf.url);
  if (m) {
    const e = m.findEntry(cf.lineNumber, cf.columnNumber) as { originalSource?: string; name?: string };
    if (e?.originalSource) source = e.originalSource;
    if (e?.name) fn = e.name || fn;
  }
  source = source.replace(/^file:\/\//, '');
  const nm = source.lastIndexOf('node_modules/');
  if (nm >= 0) {
    const rest = source.slice(nm + 'node_modules/'.length).split('/');
    return { kind: 'pkg', name: rest[0]!.startsWith('@') ? `${rest[0]}/${rest[1]}` : rest[0]!, fn };
  }
  const src = source.indexOf('/src/');
  if (src >= 0) return { kind: 'src', name: source.slice(src + 1), fn };
  return { kind: 'node', name: path.basename(source), fn };
}

/** Categories a reader can act on. */
function category(leaf: Where, firstOwn: Where | undefined): string {
  if (leaf.kind === 'vm') return leaf.name === '(garbage collector)' ? 'GC' : leaf.name === '(program)' ? 'V8/native (program)' : leaf.name;
  if (leaf.kind === 'pkg') {
    if (/^(pino|sonic-boom|fast-redact|@pinojs\/redact|fast-safe-stringify|safe-stable-stringify|quick-format-unescaped|atomic-sleep|on-exit-leak-free|thread-stream)$/.test(leaf.name)) return 'logging (pino)';
    if (/^(@grpc\/grpc-js|@grpc\/proto-loader|protobufjs|@protobufjs\/.*|long)$/.test(leaf.name)) return 'CRI calls (grpc-js)';
    if (leaf.name === 'undici') return 'registry HTTP (undici)';
    if (leaf.name === 'yaml') return 'set files (yaml)';
    if (leaf.name === 'smol-toml') return 'pin file (toml)';
    return `package ${leaf.name}`;
  }
  const own = leaf.kind === 'src' ? leaf : firstOwn;
  if (!own) return 'Node.js internals (no pinset caller)';
  return own.name;
}

interface Sample {
  /** Wall-clock ms. */
  t: number;
  cat: string;
  /** The innermost pinset function on the stack, for the step timeline. */
  step: string;
  /** The leaf frame, for PROFILE_LEAVES. */
  leaf: string;
}

async function samplesOf(profile: CpuProfile, offsetMs: number): Promise<Sample[]> {
  const parent = new Map<number, number>();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const where = new Map<number, Where>();
  for (const n of profile.nodes) where.set(n.id, await resolveFrame(n.callFrame));
  const memo = new Map<number, { cat: string; step: string; leaf: string }>();
  const classify = (id: number) => {
    let hit = memo.get(id);
    if (hit) return hit;
    const leaf = where.get(id)!;
    let pkgLeaf: Where | undefined = leaf.kind === 'pkg' || leaf.kind === 'vm' || leaf.kind === 'src' ? leaf : undefined;
    let firstOwn: Where | undefined;
    let stepFn: string | undefined;
    for (let cur: number | undefined = id; cur !== undefined; cur = parent.get(cur)) {
      const w = where.get(cur)!;
      if (!pkgLeaf && w.kind === 'pkg') pkgLeaf = w;
      if (w.kind === 'src') {
        firstOwn ??= w;
        stepFn ??= `${w.name.replace(/^src\//, '')}:${w.fn || '(anonymous)'}`;
      }
    }
    const cat = category(pkgLeaf ?? leaf, firstOwn);
    hit = { cat, step: stepFn ?? cat, leaf: `${leaf.name}:${leaf.fn || '(anonymous)'}` };
    memo.set(id, hit);
    return hit;
  };
  const out: Sample[] = [];
  let t = profile.startTime;
  for (let i = 0; i < profile.samples.length; i++) {
    t += profile.timeDeltas[i]!;
    const c = classify(profile.samples[i]!);
    out.push({ t: t / 1000 + offsetMs, ...c });
  }
  return out;
}

/** CPU ms per category over [from, to) (idle excluded). */
function cpuByCategory(samples: readonly Sample[], from: number, to: number): Map<string, number> {
  const out = new Map<string, number>();
  for (let i = 0; i < samples.length; i++) {
    const s = samples[i]!;
    if (s.t < from || s.t >= to || s.cat === '(idle)' || s.cat === '(root)') continue;
    const prev = i > 0 ? samples[i - 1]!.t : s.t;
    out.set(s.cat, (out.get(s.cat) ?? 0) + Math.min(s.t - prev, (INTERVAL_US * 4) / 1000));
  }
  return out;
}

/** Busy stretches and the waits between them over [from, to): "step (ms)" in order. */
function timeline(samples: readonly Sample[], from: number, to: number): { at: number; ms: number; what: string }[] {
  const out: { at: number; ms: number; what: string }[] = [];
  let cur: { at: number; end: number; what: string } | undefined;
  const flush = () => {
    if (cur) out.push({ at: cur.at - from, ms: cur.end - cur.at, what: cur.what });
    cur = undefined;
  };
  for (const s of samples) {
    if (s.t < from || s.t >= to) continue;
    const what = s.cat === '(idle)' ? 'waiting' : s.step;
    if (cur && cur.what === what) {
      cur.end = s.t;
      continue;
    }
    if (cur) cur.end = s.t;
    flush();
    cur = { at: s.t, end: s.t, what };
  }
  if (cur) cur.end = to;
  flush();
  return out;
}

// ---------------------------------------------------------------------------
// The run, as bench/run.ts agentSteadyRun

function setDoc(name: string, refs: string[]) {
  return { apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name }, spec: { pinnedImages: refs.map((n) => ({ name: n })) } };
}

interface RunResult {
  /** PullImage durations as the client saw them (ms). */
  pullMs: number[];
  /** PullImage durations as containerd logged them (ms). */
  containerdMs: number[];
  /** GC (ms of samples) from the reconcile's start to "pin file written". */
  gcToPin: number;
  /** First PullImage to the last answer. */
  pulling: number;
  startToFirstPull: number;
  startToLastPulled: number;
  /** Per pull after the first (parallelism 1): last "pulled image" before it to its "pulling image". */
  gaps: number[];
  preCpu: Map<string, number>;
  pullCpu: Map<string, number>;
  preTimeline: { at: number; ms: number; what: string }[];
  /** Log lines of the measured reconcile, relative to its start. */
  steps: { at: number; msg: string }[];
}

/** A PROFILE_AGENTS entry: `<pinset.mjs>` or `<pinset.mjs>|<Node.js flags>` (the flags then replace the base ones). */
function agentEntry(entry: string): { cli: string; nodeFlags: string[] } {
  const [cli, flags] = entry.split('|');
  return { cli: cli!, nodeFlags: flags === undefined ? BASE_FLAGS : flags.split(' ').filter(Boolean) };
}

async function profiledRun(entry: string, registry: Registry, warmRef: string, refs: string[], parallel: number, profDir: string): Promise<RunResult> {
  const { cli, nodeFlags } = agentEntry(entry);
  const c = await Containerd.start({ mirrors: { 'registry.test': registry.url } });
  await execFileAsync('sync', []);
  await sleep(200);
  const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-prof-'));
  const staticDir = path.join(dir, 'sets.d');
  const dropinDir = path.join(dir, 'crio.conf.d');
  await mkdir(staticDir);
  await mkdir(dropinDir);
  const conf = path.join(dir, 'registries.conf');
  await writeFile(conf, `[[registry]]\nprefix = "registry.test"\nlocation = "${registry.host}"\ninsecure = true\n`);
  const runDir = await mkdtemp(path.join(profDir, `p${parallel}-`));
  const flags = [
    '--node-name', 'bench-node', '--static-dir', staticDir, '--cri-endpoint', c.endpoint, '--crio-dropin-dir', dropinDir,
    '--state-dir', path.join(dir, 'state'), '--reload', 'none', '--pin-backend', 'crio', '--auth-file', path.join(dir, 'no-auth.json'), '--metrics-addr', '', '--log-level', 'info',
    '--max-parallel-pulls', String(parallel), '--resync-interval', '10m',
    '--registries-conf', conf, '--registries-conf-dir', path.join(dir, 'registries.conf.d'),
    ...AGENT_FLAGS,
  ];
  const agent = AgentProcess.start(flags, { cli, nodeArgs: [...nodeFlags, '--cpu-prof', `--cpu-prof-dir=${runDir}`, `--cpu-prof-interval=${INTERVAL_US}`, ...EXTRA_FLAGS] });
  try {
    await writeFile(path.join(staticDir, 'warm.yaml'), dumpYaml(setDoc('warm', [warmRef])));
    await agent.waitForLog((l) => l.msg === 'reconcile finished' && (l.phases as Record<string, number>)?.Ready === 1, 60_000, 'the warm-up set Ready');
    await sleep(500);
    const from = agent.mark();
    await writeFile(path.join(staticDir, 'bench.yaml'), dumpYaml(setDoc('bench', refs)));
    const done = await agent.waitForLog((l) => l.msg === 'reconcile finished' && l.pulls === refs.length, 120_000, 'the reconcile that pulls the set', from);
    await agent.stop();
    const containerdMs = await containerdPullMs(c, refs);
    if (EXTRA_FLAGS.length) say(agent.stdout.split('\n').filter((l) => !l.startsWith('{')).join('\n'));
    const lines = agent.logs().slice(from);
    const start = logTime(done) - Number(done.durationMs);
    const pulling = lines.filter((l) => l.msg === 'pulling image').map(logTime);
    const pulled = lines.filter((l) => l.msg === 'pulled image').map(logTime);
    const firstPull = Math.min(...pulling);
    const lastPulled = Math.max(...pulled);
    const gaps: number[] = [];
    if (parallel === 1) for (let i = 1; i < pulling.length; i++) gaps.push(pulling[i]! - pulled[i - 1]!);
    const file = (await readdir(runDir)).find((f) => f.endsWith('.cpuprofile'));
    if (!file) throw new Error(`no CPU profile in ${runDir}`);
    const profile = JSON.parse(await readFile(path.join(runDir, file), 'utf8')) as CpuProfile;
    const samples = await samplesOf(profile, wallMinusMono());
    if (LEAVES) {
      const leaves = new Map<string, number>();
      for (const x of samples) if (x.t >= start && x.t <= firstPull + 1 && x.step.includes(LEAVES)) leaves.set(x.leaf, (leaves.get(x.leaf) ?? 0) + 1);
      say(`leaf frames under ${LEAVES} (samples of ${INTERVAL_US} µs): ${[...leaves].sort((a, b) => b[1] - a[1]).slice(0, 12).map(([k, v]) => `${k} ${v}`).join('; ')}`);
    }
    // Log times are whole ms: the window starts at the start of that ms and ends at the end of the last one.
    const pinAt = lines.find((l) => l.msg === 'pin file written' && logTime(l) >= start);
    const gcToPin = pinAt ? (cpuByCategory(samples, start, logTime(pinAt) + 1).get('GC') ?? 0) : NaN;
    return {
      gcToPin,
      pullMs: lines.filter((l) => l.msg === 'pulled image').map((l) => Number(l.durationMs)),
      containerdMs,
      pulling: lastPulled - firstPull,
      startToFirstPull: firstPull - start,
      startToLastPulled: lastPulled - start,
      gaps,
      preCpu: cpuByCategory(samples, start, firstPull + 1),
      pullCpu: cpuByCategory(samples, firstPull + 1, lastPulled + 1),
      preTimeline: timeline(samples, start, firstPull + 1),
      steps: lines.filter((l) => logTime(l) >= start && logTime(l) <= firstPull + 1).map((l) => ({ at: logTime(l) - start, msg: String(l.msg) })),
    };
  } finally {
    if (agent.running) await agent.stop();
    await c.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

/** The bare loop of bench/run.ts (same proto, grpc-js, P at a time, fresh containerd), each call timed. */
interface BareResult {
  pullMs: number[];
  containerdMs: number[];
  pulling: number;
}

async function bareRun(registry: Registry, warmRef: string, refs: string[], parallel: number): Promise<BareResult> {
  const c = await Containerd.start({ mirrors: { 'registry.test': registry.url } });
  await execFileAsync('sync', []);
  await sleep(200);
  try {
    const cri = new CriClient(c.endpoint);
    if (BARE_WARM) {
      await cri.pullImage(warmRef);
      await sleep(700);
    }
    const pullMs: number[] = [];
    const t0 = performance.now();
    let next = 0;
    await Promise.all(
      Array.from({ length: parallel }, async () => {
        while (next < refs.length) {
          const t = performance.now();
          await cri.pullImage(refs[next++]!);
          pullMs.push(performance.now() - t);
        }
      }),
    );
    const pulling = performance.now() - t0;
    cri.close();
    return { pullMs, pulling, containerdMs: await containerdPullMs(c, refs) };
  } finally {
    await c.stop();
  }
}

/**
 * containerd's own time per PullImage, from its log ("PullImage \"ref\"" to
 * "PullImage \"ref\" returns image reference"): what it takes whoever asks.
 */
async function containerdPullMs(c: Containerd, refs: readonly string[]): Promise<number[]> {
  const text = await readFile(path.join(c.dir, 'containerd.log'), 'utf8').catch(() => '');
  const started = new Map<string, number>();
  const out: number[] = [];
  const wanted = new Set(refs);
  for (const line of text.split('\n')) {
    const t = /time="([^"]+)"/.exec(line)?.[1];
    const m = /msg="PullImage \\"([^\\]+)\\"( returns image reference)?/.exec(line);
    if (!t || !m || !wanted.has(m[1]!)) continue;
    // RFC 3339 with nanoseconds: Date.parse takes milliseconds; the fraction is read here to the microsecond.
    const frac = /\.(\d+)/.exec(t)?.[1] ?? '0';
    const ms = Date.parse(t.replace(/\.\d+/, '')) + Number(`0.${frac}`) * 1000;
    if (!m[2]) started.set(m[1]!, ms);
    else if (started.has(m[1]!)) out.push(ms - started.get(m[1]!)!);
  }
  return out;
}

function mergeMedian(maps: Map<string, number>[]): [string, number][] {
  const keys = new Set(maps.flatMap((m) => [...m.keys()]));
  return [...keys].map((k) => [k, median(maps.map((m) => m.get(k) ?? 0))] as [string, number]).sort((a, b) => b[1] - a[1]);
}

function report(label: string, p: number, runs: RunResult[], bare: BareResult[]): void {
  say(`\n## ${label}, parallel ${p}: ${runs.length} runs\n`);
  const all = runs.flatMap((r) => r.pullMs);
  const bareAll = bare.flatMap((b) => b.pullMs);
  say(`PullImage duration per image (median over all pulls): agent ${median(all).toFixed(1)} ms, bare loop ${median(bareAll).toFixed(1)} ms; in containerd's log: agent's ${median(runs.flatMap((r) => r.containerdMs)).toFixed(1)} ms, bare loop's ${median(bare.flatMap((b) => b.containerdMs)).toFixed(1)} ms`);
  say(`first PullImage to last answer (median of runs): agent ${median(runs.map((r) => r.pulling))} ms, bare loop ${median(bare.map((b) => b.pulling)).toFixed(0)} ms (${bare.map((b) => b.pulling.toFixed(0)).join(', ')})`);
  say(`reconcile start to first PullImage: ${runs.map((r) => r.startToFirstPull).join(', ')} ms (median ${median(runs.map((r) => r.startToFirstPull))})`);
  say(`reconcile start to last image present: ${runs.map((r) => r.startToLastPulled).join(', ')} ms (median ${median(runs.map((r) => r.startToLastPulled))})`);
  // The stretches between the reconcile's log lines, median of the runs.
  const at = (r: RunResult, msg: string) => r.steps.find((x) => x.msg === msg)?.at;
  const span = (from: (r: RunResult) => number | undefined, to: (r: RunResult) => number | undefined) =>
    median(runs.map((r) => (to(r) ?? NaN) - (from(r) ?? NaN)).filter((x) => Number.isFinite(x)));
  const pinned = (r: RunResult) => at(r, 'pin file written');
  const estimated = (r: RunResult) => at(r, 'disk estimate for the images to pull') ?? pinned(r);
  say(
    `stretches (median of runs): start to "pin file written" ${span(() => 0, pinned)} ms; to "disk estimate for the images to pull" ${span(pinned, estimated)} ms; to the first PullImage ${span(estimated, (r) => r.startToFirstPull)} ms; GC before "pin file written" ${median(runs.map((r) => r.gcToPin)).toFixed(1)} ms`,
  );
  if (p === 1) {
    const all = runs.flatMap((r) => r.gaps);
    say(`"pulled image" to the next "pulling image": median ${median(all)} ms, max ${Math.max(...all)} ms over ${all.length} gaps (log times, whole ms)`);
  }
  const pre = mergeMedian(runs.map((r) => r.preCpu));
  say('\nagent CPU before the first PullImage (ms, median of runs):');
  for (const [k, v] of pre) if (v >= 0.05) say(`  ${v.toFixed(1).padStart(7)}  ${k}`);
  say(`  total ${median(runs.map((r) => [...r.preCpu.values()].reduce((a, b) => a + b, 0))).toFixed(1)} ms (median of the runs' totals)`);
  say(`\nagent CPU while pulling (ms, median of runs; per image: / ${K}):`);
  const pull = mergeMedian(runs.map((r) => r.pullCpu));
  for (const [k, v] of pull) if (v >= 0.05) say(`  ${v.toFixed(1).padStart(7)}  ${(v / K).toFixed(2).padStart(6)}/image  ${k}`);
  say(`  total ${median(runs.map((r) => [...r.pullCpu.values()].reduce((a, b) => a + b, 0))).toFixed(1)} ms (median of the runs' totals)`);
  // The timeline of the median run (by start to first PullImage).
  const mid = [...runs].sort((a, b) => a.startToFirstPull - b.startToFirstPull)[runs.length >> 1]!;
  say(`\nsteps before the first PullImage, run with ${mid.startToFirstPull} ms (ms from reconcile start; CPU bursts >= 0.5 ms and waits):`);
  for (const s of mid.preTimeline) if (s.ms >= 0.5) say(`  ${s.at.toFixed(1).padStart(6)} +${s.ms.toFixed(1).padStart(5)}  ${s.what}`);
  say('log lines in that stretch:');
  for (const s of mid.steps) say(`  ${String(s.at).padStart(4)}  ${s.msg}`);
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) throw new Error('run as root: containerd needs it');
  // PROFILE_AGENTS: bundles to compare (their pinset.mjs, each optionally `|<Node.js flags>`, comma-separated), runs alternating; default this checkout's dist/.
  const agents = process.env.PROFILE_AGENTS ? process.env.PROFILE_AGENTS.split(',') : [await bundledCli()];
  const profDir = await mkdtemp(path.join(os.tmpdir(), 'pinset-cpuprof-'));
  const registry = await Registry.start();
  try {
    say(`pushing ${K} images of ${IMAGE_BYTES} bytes...`);
    const refs: string[] = [];
    for (let i = 0; i < K; i++) refs.push((await pushRandom(registry, `bench/k${i}`, IMAGE_BYTES)).ref);
    const warm = (await pushSingleLayer(registry, 'bench/warm')).ref;
    say(`agents: ${agents.join(', ')} with ${[...BASE_FLAGS, ...EXTRA_FLAGS].join(' ')} --cpu-prof --cpu-prof-interval=${INTERVAL_US}${AGENT_FLAGS.length ? `; agent flags ${AGENT_FLAGS.join(' ')}` : ''}`);
    for (const p of PARALLELISM) {
      const runs = agents.map(() => [] as RunResult[]);
      const bare: BareResult[] = [];
      const loads: number[] = [];
      for (let i = 0; i < RUNS; i++) {
        // The agents, and the bare loop (-1), in turn; the order reversed every other run.
        const order = [...agents.map((_, j) => j), -1];
        if (i % 2 === 1) order.reverse();
        for (const j of order) {
          loads.push(os.loadavg()[0]!);
          if (j < 0) bare.push(await bareRun(registry, warm, refs, p));
          else runs[j]!.push(await profiledRun(agents[j]!, registry, warm, refs, p, profDir));
        }
      }
      say(`\n# parallel ${p}: load average (1 min) before the runs: ${loads.map((l) => l.toFixed(1)).join(' ')}`);
      agents.forEach((a, j) => report(path.relative(process.cwd(), a) || a, p, runs[j]!, bare));
    }
    if (KEEP) say(`\nprofiles kept in ${profDir} (open in Chrome DevTools, Performance panel)`);
  } finally {
    await registry.stop();
    if (!KEEP) await rm(profDir, { recursive: true, force: true });
  }
}

main().catch((e: unknown) => {
  process.stderr.write(`pull-profile: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`);
  process.exitCode = 1;
});
