// `npm run bench:footprint`: the agent's memory as the kernel reports it
// (VmRSS, VmHWM) and `--once`'s wall time, run as the DaemonSet runs it (the
// bundle in dist/ with the Node.js flags of its first line), each figure
// printed beside the one recorded in BENCHMARKS.md (section 4, "npm run
// bench:footprint") and its target; then where the memory goes. Runs as root
// (containerd needs it); not part of `npm test`.
//
//   figures    idle watching the API with no sets, idle on the static folder
//              (metrics served in both, as the DaemonSet does), the peak of a
//              1000-image set from the API (CRI-O stand-in node, D-Bus
//              reload, the size estimate asking the loopback registry) and
//              the idle after it, `pinset agent --once` with 16 images
//              present; BENCH_RUNS runs each (default 3), medians.
//   breakdown  one run each:
//              - RSS by what backs it (/proc/<pid>/smaps) and the V8 heap by
//                space, code space included (the agent's /metrics), idle
//                static, idle on the API, after the 1000-image set;
//              - Node.js alone, and with the built-ins the agent loads;
//              - the heap by module: the bundle's files the agent loads (a
//                run with a module-load hook lists them), imported one by one,
//                dependencies first, in a Node.js with the same flags, RSS and
//                V8 heap after a full GC each;
//              - gRPC and the protobuf descriptors at work: the CRI client
//                made and one ListImages answered, in that same process;
//              - the watches and the API's caches: idle on the API less idle
//                static less the Kubernetes client's modules;
//              - what a 1000-image set leaves held: idle after it less idle
//                on the API.
//
// Knobs: BENCH_RUNS (3), BENCH_N (1000), BENCH_K (16), BENCH_ONLY
// (`figures` or `breakdown`), BENCH_AGENT_NODE_FLAGS (default: the bundle's).
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { promisify } from 'node:util';
import { COMPILE_CACHE, DIST, NODE_FLAGS } from '../scripts/build.ts';
import { bundledCli } from '../test/support/agent-process.ts';
import { installCommand, missingComponents } from '../test/support/components.ts';
import { Containerd } from '../test/support/containerd.ts';
import { pushRandom, pushSingleLayer } from '../test/support/images.ts';
import { Registry } from '../test/support/registry.ts';
import { apiSetRun, bareNodeRun, idleAgent, idleEmptyRun, median, onceAllPresentRun, pushMany, type AgentRunner } from './footprint-runs.ts';
import { procStatus, rssByBacking } from './proc.ts';

const RUNS = Number(process.env.BENCH_RUNS ?? 3);
const N = Number(process.env.BENCH_N ?? 1000);
const K = Number(process.env.BENCH_K ?? 16);
const ONLY = process.env.BENCH_ONLY ?? '';
const NODE_ARGS: string[] = process.env.BENCH_AGENT_NODE_FLAGS !== undefined ? process.env.BENCH_AGENT_NODE_FLAGS.split(' ').filter(Boolean) : [...NODE_FLAGS];
const BENCHMARKS = fileURLToPath(new URL('../BENCHMARKS.md', import.meta.url));
const execFileAsync = promisify(execFile);
const say = (line = '') => process.stdout.write(`${line}\n`);
const MB = (bytes: number) => (bytes / 1048576).toFixed(1);

/** A figure of the benchmark: its row label in BENCHMARKS.md and its target (issue #32), if any. */
interface Figure {
  label: string;
  unit: 'MB' | 'ms';
  target?: number;
  values: number[];
}

const FIGURES: Record<'bare' | 'idleApi' | 'idleStatic' | 'peak' | 'after' | 'once', Figure> = {
  bare: { label: 'Node.js alone, the bundle\'s flags, a timer', unit: 'MB', values: [] },
  idleApi: { label: 'idle, watching the API, no sets', unit: 'MB', target: 60, values: [] },
  idleStatic: { label: 'idle, static folder only', unit: 'MB', target: 55, values: [] },
  peak: { label: `peak, ${N}-image set from the API`, unit: 'MB', target: 80, values: [] },
  after: { label: `idle after the ${N}-image set`, unit: 'MB', values: [] },
  once: { label: `\`--once\`, ${K} images present, spawn to exit`, unit: 'ms', target: 150, values: [] },
};

/** Where BENCHMARKS.md records this benchmark's figures (section 4). */
export const RECORDED_UNDER = '### `npm run bench:footprint`';

/**
 * The figure recorded in BENCHMARKS.md for a label: under RECORDED_UNDER,
 * the table row `| <label> (<unit>) | before | now | target |`, its "now"
 * column; null when not recorded (or not a number there).
 */
export function recordedFigure(markdown: string, label: string, unit: string): number | null {
  const at = markdown.indexOf(RECORDED_UNDER);
  if (at < 0) return null;
  const row = markdown.slice(at).split('\n').find((l) => l.startsWith(`| ${label} (${unit}) |`));
  if (!row) return null;
  const now = row.split('|').slice(2, -1).map((c) => c.replace(/\*/g, '').trim())[1];
  return now && Number.isFinite(Number(now)) ? Number(now) : null;
}

async function figures(registry: Registry, runner: AgentRunner, mirrors: Record<string, string>, present: string[], nRefs: string[]): Promise<void> {
  const failed: string[] = [];
  // A run that fails (an agent gone, a component that did not start) is
  // reported and left out of the medians, not retried.
  const measure = async (f: Figure, run: () => Promise<number>) => {
    try {
      f.values.push(await run());
    } catch (e) {
      failed.push(`${f.label}: ${(e instanceof Error ? e.message : String(e)).split('\n')[0]}`);
    }
  };
  for (let i = 0; i < RUNS; i++) {
    await measure(FIGURES.bare, () => bareNodeRun(runner));
    await measure(FIGURES.idleStatic, () => idleEmptyRun(runner, mirrors, false));
    await measure(FIGURES.idleApi, () => idleEmptyRun(runner, mirrors, true));
    let after = NaN;
    await measure(FIGURES.peak, async () => {
      const set = await apiSetRun(runner, nRefs, registry);
      after = set.idleMb;
      return set.peakMb;
    });
    if (!Number.isNaN(after)) FIGURES.after.values.push(after);
    await measure(FIGURES.once, () => onceAllPresentRun(runner, mirrors, present));
    say(`  run ${i + 1}: ${Object.values(FIGURES).map((f) => `${f.label} ${f.values.at(-1)?.toFixed(f.unit === 'MB' ? 1 : 0) ?? '-'} ${f.unit}`).join('; ')}`);
  }
  for (const f of failed) say(`  failed, left out: ${f}`);
  const recorded = await readFile(BENCHMARKS, 'utf8');
  say(`\n| figure | median | runs | recorded (BENCHMARKS.md) | target | |\n|---|---:|---|---:|---:|---|`);
  for (const f of Object.values(FIGURES) as Figure[]) {
    const digits = f.unit === 'MB' ? 1 : 0;
    if (!f.values.length) {
      say(`| ${f.label} (${f.unit}) | no run succeeded | | | | |`);
      continue;
    }
    const m = median(f.values);
    const before = recordedFigure(recorded, f.label, f.unit);
    const change = before === null ? 'not recorded' : `${m - before >= 0 ? '+' : ''}${(m - before).toFixed(digits)}`;
    const verdict = f.target === undefined ? '' : m <= f.target ? 'met' : `MISSED by ${(m - f.target).toFixed(digits)}`;
    say(`| ${f.label} (${f.unit}) | ${m.toFixed(digits)} | ${f.values.map((v) => v.toFixed(digits)).join(', ')} | ${before ?? '-'} (${change}) | ${f.target !== undefined ? `<= ${f.target}` : ''} | ${verdict} |`);
  }
}

// ---------------------------------------------------------------------------
// Breakdown

interface Split {
  rss: number;
  hwm: number;
  nodeBinary: number;
  libraries: number;
  anonymous: number;
  sockets: number;
  /** V8 heap: committed and used in total, used by space. */
  heapCommitted: number;
  heapUsed: number;
  spaces: Record<string, number>;
  external: number;
}

/** RSS by what backs it (smaps), open sockets, and the V8 heap by space from the agent's /metrics. */
async function splitOf(pid: number, metricsUrl: string): Promise<Split> {
  const out: Split = { ...rssByBacking(pid), hwm: procStatus(pid).hwmKb * 1024, sockets: 0, heapCommitted: 0, heapUsed: 0, spaces: {}, external: 0 };
  const { stdout } = await execFileAsync('ls', ['-l', `/proc/${pid}/fd`]);
  out.sockets = stdout.split('\n').filter((l) => l.includes('socket:')).length;
  const text = await (await fetch(`${metricsUrl}/metrics`)).text();
  const num = (re: RegExp) => Number(re.exec(text)?.[1] ?? NaN);
  out.heapCommitted = num(/^nodejs_heap_size_total_bytes (\S+)/m);
  out.heapUsed = num(/^nodejs_heap_size_used_bytes (\S+)/m);
  out.external = num(/^nodejs_external_memory_bytes (\S+)/m);
  for (const m of text.matchAll(/^nodejs_heap_space_size_used_bytes\{space="([^"]+)"\} (\S+)/gm)) out.spaces[m[1]!] = Number(m[2]);
  return out;
}

/**
 * What a running agent loaded: the files of dist/, in load order (a
 * module-load hook given with --import appends each URL to a file), and the
 * Node.js built-ins (process.moduleLoadList, written as it exits).
 */
async function loadedBy(runner: AgentRunner, mirrors: Record<string, string>, withApi: boolean): Promise<{ files: string[]; builtins: string[] }> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-footprint-'));
  try {
    const hook = path.join(dir, 'hook.mjs');
    const list = path.join(dir, 'loaded.txt');
    await writeFile(
      hook,
      [
        "import module from 'node:module';",
        "import { appendFileSync } from 'node:fs';",
        `const list = ${JSON.stringify(list)};`,
        "module.registerHooks({ load(url, ctx, next) { appendFileSync(list, url + '\\n'); return next(url, ctx); } });",
        "process.on('exit', () => appendFileSync(list, process.moduleLoadList.filter((m) => /^NativeModule [a-z]/.test(m) && !m.includes('internal')).map((m) => 'node:' + m.slice(13)).join('\\n') + '\\n'));",
      ].join('\n'),
    );
    await idleAgent({ ...runner, nodeArgs: [...runner.nodeArgs, '--import', pathToFileURL(hook).href] }, mirrors, withApi, async () => undefined);
    const lines = (await readFile(list, 'utf8')).split('\n');
    return { files: lines.filter((u) => u.startsWith('file:') && u.includes('/dist/')), builtins: [...new Set(lines.filter((u) => u.startsWith('node:') && !u.startsWith('node:_')))] };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** esbuild's metafile of dist/: each output file's static imports and the packages (or sources) it holds. */
function bundleMeta(): Map<string, { imports: string[]; holds: string }> {
  const meta = JSON.parse(readFileSync(path.join(DIST, 'meta.json'), 'utf8')) as { outputs: Record<string, { imports: { path: string; kind: string; external?: boolean }[]; inputs: Record<string, { bytesInOutput: number }>; bytes: number }> };
  const base = (p: string) => p.slice(p.lastIndexOf('/') + 1);
  const out = new Map<string, { imports: string[]; holds: string }>();
  for (const [file, o] of Object.entries(meta.outputs)) {
    if (!file.endsWith('.mjs')) continue;
    const by = new Map<string, number>();
    for (const [input, v] of Object.entries(o.inputs)) {
      const m = /node_modules\/((?:@[^/]+\/)?[^/]+)\//.exec(input);
      const key = m ? m[1]! : input.startsWith('src/') ? `pinset ${path.dirname(input).slice(4)}` : 'other';
      by.set(key, (by.get(key) ?? 0) + v.bytesInOutput);
    }
    const holds = [...by].sort((a, b) => b[1] - a[1]).filter(([, n]) => n >= 1024).slice(0, 5).map(([k, n]) => `${k} ${Math.round(n / 1024)}K`).join(', ');
    out.set(base(file), { imports: o.imports.filter((i) => i.kind === 'import-statement' && !i.external).map((i) => base(i.path)), holds: `${Math.round(o.bytes / 1024)}K: ${holds}` });
  }
  return out;
}

/** Each file after the files it imports statically, from the first loaded to the last. */
function dependenciesFirst(files: string[], meta: ReturnType<typeof bundleMeta>): string[] {
  const order: string[] = [];
  const seen = new Set<string>();
  const visit = (f: string) => {
    if (seen.has(f)) return;
    seen.add(f);
    for (const i of meta.get(f)?.imports ?? []) visit(i);
    order.push(f);
  };
  for (const f of files) visit(f);
  return order;
}

// Run in a Node.js with the agent's flags and --expose-gc: loads the
// built-ins the agent loads, then imports the listed files of dist/ one by one (V8's code cache on, as the agent runs),
// then makes the CRI client and has it answer one ListImages; prints RSS,
// V8 heap used, code space and external memory after a full GC at each step.
const MODULES_CHILD = `
import module from 'node:module';
import { readFileSync } from 'node:fs';
import v8 from 'node:v8';
const [cache, dist, endpoint, builtins, ...files] = process.argv.slice(2);
module.enableCompileCache({ directory: cache, portable: true });
const require = module.createRequire(import.meta.url);
const tick = () => new Promise((r) => setTimeout(r, 50));
async function look(step) {
  await tick(); globalThis.gc(); globalThis.gc();
  const rss = Number(/VmRSS:\\s+(\\d+)/.exec(readFileSync('/proc/self/status', 'utf8'))[1]) * 1024;
  const h = v8.getHeapStatistics();
  const code = v8.getHeapSpaceStatistics().find((s) => s.space_name === 'code_space').space_used_size;
  console.log(JSON.stringify({ step, rss, heap: h.used_heap_size, code, external: h.external_memory }));
}
await look('start');
for (const b of builtins.split(',')) require(b);
await look('builtins');
let cri;
for (const f of files) {
  const m = await import(dist + '/' + f);
  cri ??= m.CriImageRuntime;
  await look(f);
}
const client = new cri(endpoint);
await client.listImages();
await look('CRI client made, one ListImages answered');
await client.listImages();
await look('a second ListImages');
client.close();
`;

interface Step {
  step: string;
  rss: number;
  heap: number;
  code: number;
  external: number;
}

async function modulesStepByStep(builtins: string[], files: string[], endpoint: string): Promise<Step[]> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-footprint-'));
  try {
    const child = path.join(dir, 'modules.mjs');
    await writeFile(child, MODULES_CHILD);
    const { stdout } = await execFileAsync(process.execPath, [...NODE_ARGS, '--expose-gc', child, path.join(DIST, COMPILE_CACHE), pathToFileURL(DIST).href, endpoint, builtins.join(','), ...files], {
      env: { PATH: process.env.PATH },
    });
    return stdout.split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as Step);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

async function breakdown(registry: Registry, runner: AgentRunner, mirrors: Record<string, string>, nRefs: string[]): Promise<void> {
  // RSS by what backs it.
  const rows: [string, Split][] = [];
  const metricsUrl = (agent: { logs(): Record<string, unknown>[] }) => String(agent.logs().find((l) => l.msg === 'health and metrics listening')?.url);
  rows.push(['idle, static', await idleAgent(runner, mirrors, false, (a) => splitOf(a.child.pid!, metricsUrl(a)))]);
  rows.push(['idle, API', await idleAgent(runner, mirrors, true, (a) => splitOf(a.child.pid!, metricsUrl(a)))]);
  let after: Split | undefined;
  await apiSetRun(runner, nRefs, registry, [], async (a, url) => {
    after = await splitOf(a.child.pid!, url);
  });
  rows.push([`after ${N} images from the API`, after!]);
  say(`\n#### RSS by what backs it, and the V8 heap\n\n| MB | ${rows.map((r) => r[0]).join(' | ')} |\n|---|${rows.map(() => '---:').join('|')}|`);
  const line = (label: string, f: (s: Split) => number) => say(`| ${label} | ${rows.map((r) => MB(f(r[1]))).join(' | ')} |`);
  line('RSS (VmRSS)', (s) => s.rss);
  line('peak (VmHWM)', (s) => s.hwm);
  line('the node binary (file-backed)', (s) => s.nodeBinary);
  line('shared libraries (file-backed)', (s) => s.libraries);
  line('anonymous', (s) => s.anonymous);
  line('  of it the V8 heap, committed', (s) => s.heapCommitted);
  line('  of that, live objects', (s) => s.heapUsed);
  for (const space of Object.keys(rows[0]![1].spaces).filter((sp) => rows.some((r) => (r[1].spaces[sp] ?? 0) >= 50_000))) line(`    ${space.replace(/_/g, ' ')}`, (s) => s.spaces[space] ?? 0);
  line('  the rest: malloc (Node.js, nghttp2, OpenSSL, V8 zones), stacks, WebAssembly', (s) => s.anonymous - s.heapCommitted);
  line('  of it, external memory V8 knows of (Buffers)', (s) => s.external);
  say(`| open sockets | ${rows.map((r) => r[1].sockets).join(' | ')} |`);

  // Node.js alone and with the built-ins the agent loads.
  const onApi = await loadedBy(runner, mirrors, true);
  const onStaticOnly = await loadedBy(runner, mirrors, false);
  const apiFiles = onApi.files;
  const staticFiles = onStaticOnly.files;
  const loadedBuiltins = onApi.builtins;
  const floor = (mods: string[]) => bareNodeRun(runner, `${mods.map((m) => `require(${JSON.stringify(m)});`).join('')}setInterval(() => {}, 1000)`);
  say('\n#### Node.js and its built-ins (a process that loads them and waits)\n\n| MB | RSS |\n|---|---:|');
  say(`| Node.js alone | ${(await floor([])).toFixed(1)} |`);
  const apiOnly = loadedBuiltins.filter((b) => !onStaticOnly.builtins.includes(b));
  for (const set of [['node:http'], ['node:tls'], ['node:http2'], onStaticOnly.builtins, loadedBuiltins]) {
    const label = set === onStaticOnly.builtins ? `all the agent loads idle static (${set.join(', ')})` : set === loadedBuiltins ? `all it loads on the API (those and ${apiOnly.join(', ')})` : set.join(', ');
    say(`| + ${label} | ${(await floor(set)).toFixed(1)} |`);
  }

  // The heap by module, and gRPC at work.
  const meta = bundleMeta();
  const names = (urls: string[]) => urls.map((u) => u.slice(u.lastIndexOf('/') + 1)).filter((f) => meta.has(f) && f !== 'pinset.mjs');
  const order = dependenciesFirst(names(apiFiles), meta);
  const onStatic = new Set(names(staticFiles));
  const c = await Containerd.start({ mirrors });
  let steps: Step[];
  try {
    steps = await modulesStepByStep(loadedBuiltins, order, c.endpoint);
  } finally {
    await c.stop();
  }
  say(`\n#### The heap by module: the bundle's files the agent loads on the API, imported one by one (dependencies first), RSS and V8 heap after a full GC\n`);
  say('| file | loaded idle static | holds | RSS + (MB) | heap + (MB) | code space + (MB) |\n|---|---|---|---:|---:|---:|');
  let small = { rss: 0, heap: 0, n: 0 };
  for (let i = 1; i < steps.length; i++) {
    const d = { rss: steps[i]!.rss - steps[i - 1]!.rss, heap: steps[i]!.heap - steps[i - 1]!.heap, code: steps[i]!.code - steps[i - 1]!.code };
    const file = steps[i]!.step;
    if (meta.has(file) && Math.abs(d.rss) < 0.3 * 1048576 && d.heap < 0.15 * 1048576) {
      small = { rss: small.rss + d.rss, heap: small.heap + d.heap, n: small.n + 1 };
      continue;
    }
    if (file === 'builtins') {
      say(`| the built-ins the agent loads (before the files) | | | ${MB(d.rss)} | ${(d.heap / 1048576).toFixed(2)} | ${(d.code / 1048576).toFixed(2)} |`);
      continue;
    }
    say(`| ${file} | ${meta.has(file) ? (onStatic.has(file) ? 'yes' : 'no') : ''} | ${meta.get(file)?.holds ?? ''} | ${MB(d.rss)} | ${(d.heap / 1048576).toFixed(2)} | ${(d.code / 1048576).toFixed(2)} |`);
  }
  say(`| ${small.n} smaller files | | | ${MB(small.rss)} | ${(small.heap / 1048576).toFixed(2)} | |`);
  const first = steps.find((s) => s.step === 'builtins')!;
  const loaded = steps.findLast((s) => meta.has(s.step))!;
  say(`| all ${order.length} files | | | ${MB(loaded.rss - first.rss)} | ${((loaded.heap - first.heap) / 1048576).toFixed(2)} | ${((loaded.code - first.code) / 1048576).toFixed(2)} |`);

  // The API: watches and caches, by difference.
  const [st, api, set] = rows.map((r) => r[1]) as [Split, Split, Split];
  const kubeFiles = order.filter((f) => !onStatic.has(f));
  const kubeModules = kubeFiles.reduce((sum, f) => {
    const i = steps.findIndex((s) => s.step === f);
    return sum + (steps[i]!.rss - steps[i - 1]!.rss);
  }, 0);
  say(`\n#### By difference\n\n| MB | RSS | V8 heap used |\n|---|---:|---:|`);
  say(`| watching the API: idle on the API less idle static | ${MB(api.rss - st.rss)} | ${MB(api.heapUsed - st.heapUsed)} |`);
  say(`| of it the files loaded only with the API (${kubeFiles.length}: the Kubernetes client, undici, the watches' code) | ${MB(kubeModules)} | |`);
  say(`| the rest: the watches' connections (HTTP/1.1 streams, undici's WebAssembly HTTP parser), the Node object, the API's caches | ${MB(api.rss - st.rss - kubeModules)} | |`);
  say(`| what a ${N}-image set leaves held: idle after it less idle on the API (the set, its status document, pins read back, the estimate's sizes; heap V8 keeps committed) | ${MB(set.rss - api.rss)} | ${MB(set.heapUsed - api.heapUsed)} |`);
}

async function main(): Promise<void> {
  const missing = missingComponents(['containerd', 'runc', 'docker-registry', 'dbus-daemon']);
  if (missing.length) throw new Error(`missing components; install with: ${installCommand(missing)}`);
  const runner: AgentRunner = { cli: await bundledCli(), nodeArgs: NODE_ARGS, env: {} };
  say(`# pinset agent footprint\n\nmachine: ${os.cpus().length} CPUs (${os.cpus()[0]?.model ?? '?'}), ${(os.totalmem() / 2 ** 30).toFixed(1)} GiB, Node ${process.version}\nagent: ${path.relative(process.cwd(), runner.cli)} with ${NODE_ARGS.join(' ') || 'Node.js defaults'}\n`);
  const registry = await Registry.start();
  const mirrors = { 'registry.test': registry.url };
  try {
    say(`pushing ${K} images and ${N} small images...`);
    const present = (await pushMany(K, 4, (i) => pushRandom(registry, `bench/k${i}`, 100_000))).map((p) => p.ref);
    const nRefs = (await pushMany(N, 16, (i) => pushSingleLayer(registry, `bench/n${i}`))).map((p) => p.ref);
    if (ONLY === '' || ONLY === 'figures') await figures(registry, runner, mirrors, present, nRefs);
    if (ONLY === '' || ONLY === 'breakdown') await breakdown(registry, runner, mirrors, nRefs);
  } finally {
    await registry.stop();
  }
}

if (import.meta.main) await main();
