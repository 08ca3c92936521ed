// `node bench/footprint-probe.ts <probe>`: single runs that look inside the
// footprint figures of `npm run bench` (BENCHMARKS.md, section 4), on the
// bundle as shipped with its Node.js flags (BENCH_AGENT_NODE_FLAGS replaces
// them, as in bench/run.ts). Not part of `npm test`; runs as root, as the
// benchmarks do.
//
//   timeline   the 1000-image set from the API on the CRI-O stand-in node
//              (as bench/run.ts): RSS every 20 ms with the agent's log lines
//              in between, so a peak can be put on the step that makes it.
//              BENCH_PROBE_FLAGS adds agent flags (e.g. "--disk-estimate-factor 0").
//   heap       a V8 heap snapshot of that agent after the set is Ready (and
//              12 s more: the registry client's request timers gone) and one
//              of an idle agent watching the API with no set, and what the
//              first holds more, by object type and, for strings, by kind.
//   breakdown  RSS by what backs it (/proc/<pid>/smaps: the node binary's
//              pages, shared libraries, anonymous memory) and the V8 heap
//              (/metrics), idle on static sets with metrics, idle watching
//              the API, and after the 1000-image set.
//   once       `pinset agent --once` with 16 images present in containerd:
//              each log line's time from spawn, 5 runs. BENCH_PROBE_ENV adds
//              environment variables (e.g. "NODE_DISABLE_COMPILE_CACHE=1").
//   tls        the size estimate of 300 images from a registry over TLS (its
//              CA in NODE_EXTRA_CA_CERTS), as the agent makes it: RSS before
//              and after, CPU; 3 runs (an HTTPS registry is what a cluster
//              has; bench/run.ts's registry is plain HTTP).
import { execFile, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { stringify as dumpYaml } from 'yaml';
import { NODE_FLAGS } from '../scripts/build.ts';
import { AgentProcess, bundledCli, type LogLine } from '../test/support/agent-process.ts';
import { ApiServer, type KubeObject } from '../test/support/apiserver.ts';
import { Containerd, CriClient } from '../test/support/containerd.ts';
import { startCrioNode } from '../test/support/crio-node.ts';
import { pushRandom, pushSingleLayer } from '../test/support/images.ts';
import { Registry } from '../test/support/registry.ts';
import { makeCertificate } from '../test/support/token-server.ts';
import { procStatus, rssByBacking } from './proc.ts';

const N = Number(process.env.BENCH_N ?? 1000);
const FLAGS: string[] = process.env.BENCH_AGENT_NODE_FLAGS !== undefined ? process.env.BENCH_AGENT_NODE_FLAGS.split(' ').filter(Boolean) : [...NODE_FLAGS];
const EXTRA: string[] = (process.env.BENCH_PROBE_FLAGS ?? '').split(' ').filter(Boolean);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const say = (line = '') => process.stdout.write(`${line}\n`);
const MB = (bytes: number) => (bytes / 1048576).toFixed(1);

function status(pid: number): { rss: number; hwm: number } {
  const st = procStatus(pid);
  return { rss: st.rssKb * 1024, hwm: st.hwmKb * 1024 };
}

function setDoc(name: string, refs: string[]) {
  return { apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name }, spec: { pinnedImages: refs.map((r) => ({ name: r })) } };
}

async function pushMany(registry: Registry, count: number, repo: (i: number) => string): Promise<string[]> {
  const refs: string[] = new Array(count);
  let next = 0;
  await Promise.all(
    Array.from({ length: 16 }, async () => {
      while (next < count) {
        const i = next++;
        refs[i] = (await pushSingleLayer(registry, repo(i))).ref;
      }
    }),
  );
  return refs;
}

interface ApiRun {
  agent: AgentProcess;
  t0: number;
  metricsUrl: string;
  done(): Promise<void>;
}

/** The agent on the CRI-O stand-in node watching the in-process API server; with `refs`, a set of them (images in the registry for the size estimate). */
async function apiAgent(registry: Registry | null, refs: string[] | null, nodeArgs: string[]): Promise<ApiRun> {
  const node = await startCrioNode({ catalogue: Object.fromEntries((refs ?? []).map((r) => [r, { size: 1000 }])) });
  const api = await ApiServer.start();
  const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-probe-'));
  const staticDir = path.join(dir, 'sets.d');
  await mkdir(staticDir);
  api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'bench-node', labels: {} } });
  if (refs) api.create(setDoc('bench-n', refs) as unknown as KubeObject);
  const conf = path.join(dir, 'registries.conf');
  await writeFile(conf, registry ? `[[registry]]\nprefix = "registry.test"\nlocation = "${registry.host}"\ninsecure = true\n` : '');
  const flags = [
    '--node-name', 'bench-node', '--static-dir', staticDir, '--cri-endpoint', node.endpoint, '--crio-dropin-dir', node.dropInDir, '--state-dir', node.stateDir,
    '--auth-file', path.join(dir, 'no-auth.json'), '--log-level', 'info', '--reload', 'dbus', '--resync-interval', '2s',
    '--metrics-addr', '127.0.0.1:0', '--kubeconfig', await api.writeKubeconfig(dir),
    '--registries-conf', conf, '--registries-conf-dir', path.join(dir, 'registries.conf.d'), ...EXTRA,
  ];
  const t0 = Date.now();
  const agent = AgentProcess.start(flags, { env: node.env, cli: await bundledCli(), nodeArgs });
  const listening = await agent.waitForLog((l) => l.msg === 'health and metrics listening', 30_000, 'the metrics listener');
  return {
    agent,
    t0,
    metricsUrl: String(listening.url),
    done: async () => {
      await agent.stop();
      await api.stop();
      await node.stop();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/** Until the set is Ready, then `resyncs` more reconciles. */
async function untilReadyAndResyncs(agent: AgentProcess, resyncs = 3): Promise<LogLine> {
  const ready = await agent.waitForLog((l) => (l.phases as Record<string, number> | undefined)?.Ready === 1 && l.msg === 'reconcile finished', 5 * 60_000, 'the set Ready');
  let from = agent.mark();
  for (let i = 0; i < resyncs; i++) {
    await agent.waitForReconcile(from, 60_000);
    from = agent.mark();
  }
  return ready;
}

async function timeline(): Promise<void> {
  const registry = await Registry.start();
  try {
    say(`pushing ${N} images...`);
    const refs = await pushMany(registry, N, (i) => `bench/n${i}`);
    const run = await apiAgent(registry, refs, FLAGS);
    const samples: [number, number][] = [];
    const pid = run.agent.child.pid!;
    const sampler = setInterval(() => samples.push([Date.now() - run.t0, status(pid).rss]), 20);
    try {
      const ready = await untilReadyAndResyncs(run.agent);
      clearInterval(sampler);
      const st = status(pid);
      const pulls = run.agent.logs().filter((l) => l.msg === 'pulled image').map((l) => Date.parse(String(l.time)) - run.t0);
      say(`agent ${EXTRA.join(' ')} (${FLAGS.join(' ') || 'Node.js defaults'}): peak ${MB(st.hwm)} MB, idle after ${MB(st.rss)} MB, Ready at ${Date.parse(String(ready.time)) - run.t0} ms; ${pulls.length} pulls from ${Math.min(...pulls)} to ${Math.max(...pulls)} ms`);
      const marks = run.agent.logs().filter((l) => l.msg !== 'pulled image' && l.msg !== 'pulling image').map((l) => [Date.parse(String(l.time)) - run.t0, String(l.msg)] as const);
      let m = 0;
      let last = -Infinity;
      let max = 0;
      for (const [t, rss] of samples) {
        while (m < marks.length && marks[m]![0] <= t) say(`        ${String(marks[m]![0]).padStart(5)} ms  ${marks[m++]![1]}`);
        // Every 100 ms, and every sample above all before it.
        if (t - last >= 100 || rss > max) {
          say(`${String(t).padStart(5)} ms  ${MB(rss)} MB${rss > max ? ' (highest so far)' : ''}`);
          last = t;
        }
        max = Math.max(max, rss);
      }
    } finally {
      clearInterval(sampler);
      await run.done();
    }
  } finally {
    await registry.stop();
  }
}

type Summary = Map<string, [bytes: number, count: number]>;

/** Self sizes of a heap snapshot by node type and name; strings by kind (their first characters, digits and hex folded). */
function summarise(file: string): { total: number; byType: Summary; strings: Summary } {
  const snap = JSON.parse(readFileSync(file, 'utf8')) as { snapshot: { meta: { node_fields: string[]; node_types: [string[]] } }; nodes: number[]; strings: string[] };
  const fields = snap.snapshot.meta.node_fields;
  const types = snap.snapshot.meta.node_types[0];
  const W = fields.length;
  const [iT, iN, iS] = ['type', 'name', 'self_size'].map((f) => fields.indexOf(f)) as [number, number, number];
  const byType: Summary = new Map();
  const strings: Summary = new Map();
  const add = (m: Summary, k: string, n: number) => {
    const a = m.get(k) ?? [0, 0];
    a[0] += n;
    a[1]++;
    m.set(k, a);
  };
  let total = 0;
  for (let i = 0; i < snap.nodes.length; i += W) {
    const type = types[snap.nodes[i + iT]!]!;
    const name = snap.strings[snap.nodes[i + iN]!]!;
    const size = snap.nodes[i + iS]!;
    total += size;
    if (type === 'string' || type === 'concatenated string' || type === 'sliced string') {
      add(byType, 'string', size);
      let kind: string;
      if (name.startsWith('-----BEGIN CERTIFICATE')) kind = 'PEM certificate';
      else if (name.startsWith("import{createRequire as __pinsetCreateRequire}")) kind = 'source text of the bundle';
      else if (size > 20_000) kind = `large: ${name.slice(0, 30)}`;
      else kind = `${type === 'string' ? '' : `${type}: `}${name.slice(0, 24).replace(/\n/g, '\\n').replace(/[0-9a-f]{6,}/g, 'H').replace(/\d+/g, 'N')}`;
      add(strings, kind, size);
    } else {
      add(byType, type === 'code' || type === 'closure' ? type : `${type}: ${name.slice(0, 40)}`, size);
    }
  }
  return { total, byType, strings };
}

function diff(a: Summary, b: Summary, rows: number): string[] {
  const keys = new Set([...a.keys(), ...b.keys()]);
  return [...keys]
    .map((k) => [k, (b.get(k)?.[0] ?? 0) - (a.get(k)?.[0] ?? 0), (b.get(k)?.[1] ?? 0) - (a.get(k)?.[1] ?? 0)] as const)
    .sort((x, y) => Math.abs(y[1]) - Math.abs(x[1]))
    .slice(0, rows)
    .map(([k, bytes, count]) => `| ${k.replace(/\|/g, '\\|')} | ${(bytes / 1e6).toFixed(3)} | ${count} |`);
}

async function heap(): Promise<void> {
  const registry = await Registry.start();
  const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-heap-'));
  try {
    say(`pushing ${N} images...`);
    const refs = await pushMany(registry, N, (i) => `bench/n${i}`);
    const snapshotOf = async (withSet: boolean): Promise<string> => {
      const out = path.join(dir, withSet ? 'set' : 'idle');
      await mkdir(out);
      // Node.js writes the snapshot into its working folder on the signal.
      const prev = process.cwd();
      process.chdir(out);
      const run = await apiAgent(registry, withSet ? refs : null, [...FLAGS, '--heapsnapshot-signal=SIGUSR2']);
      process.chdir(prev);
      try {
        if (withSet) await untilReadyAndResyncs(run.agent);
        else await run.agent.waitForReconcile(0, 30_000);
        await sleep(12_000);
        run.agent.child.kill('SIGUSR2');
        for (let i = 0; i < 600; i++) {
          const f = (await readdir(out)).find((n) => n.endsWith('.heapsnapshot'));
          // Written when the agent answers again (its next log line or its metrics).
          if (f && (await fetch(`${run.metricsUrl}/healthz`).then(() => true, () => false))) return path.join(out, f);
          await sleep(100);
        }
        throw new Error('no heap snapshot written');
      } finally {
        await run.done();
      }
    };
    const idle = summarise(await snapshotOf(false));
    const withSet = summarise(await snapshotOf(true));
    say(`\nV8 heap (snapshot, live objects): idle watching the API ${MB(idle.total)} MB; after the ${N}-image set ${MB(withSet.total)} MB\n`);
    say('| object type | MB more | count more |\n|---|---:|---:|');
    for (const r of diff(idle.byType, withSet.byType, 15)) say(r);
    say('\n| strings, by kind | MB more | count more |\n|---|---:|---:|');
    for (const r of diff(idle.strings, withSet.strings, 15)) say(r);
  } finally {
    await registry.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

/** RSS by what backs it, and the V8 heap from the agent's /metrics. */
async function splitOf(pid: number, metricsUrl: string): Promise<Record<string, number>> {
  const out = { ...rssByBacking(pid), v8HeapCommitted: 0, v8HeapUsed: 0 };
  const text = await (await fetch(`${metricsUrl}/metrics`)).text();
  out.v8HeapCommitted = Number(/^nodejs_heap_size_total_bytes (\S+)/m.exec(text)?.[1]);
  out.v8HeapUsed = Number(/^nodejs_heap_size_used_bytes (\S+)/m.exec(text)?.[1]);
  return out;
}

async function breakdown(): Promise<void> {
  const registry = await Registry.start();
  const rows: [string, Record<string, number>][] = [];
  try {
    // Idle on static sets, metrics served: containerd, as in bench/run.ts.
    const c = await Containerd.start({});
    const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-split-'));
    try {
      await mkdir(path.join(dir, 's'));
      await mkdir(path.join(dir, 'd'));
      const agent = AgentProcess.start(
        ['--node-name', 'bench-node', '--static-dir', path.join(dir, 's'), '--cri-endpoint', c.endpoint, '--crio-dropin-dir', path.join(dir, 'd'), '--state-dir', path.join(dir, 'state'), '--reload', 'none', '--pin-backend', 'crio', '--auth-file', path.join(dir, 'x.json'), '--metrics-addr', '127.0.0.1:0', '--log-level', 'info'],
        { cli: await bundledCli(), nodeArgs: FLAGS },
      );
      try {
        await agent.waitForReconcile(0, 30_000);
        await sleep(5000);
        rows.push(['idle, static, metrics', await splitOf(agent.child.pid!, String(agent.logs().find((l) => l.msg === 'health and metrics listening')?.url))]);
      } finally {
        await agent.stop();
      }
    } finally {
      await c.stop();
      await rm(dir, { recursive: true, force: true });
    }
    const idle = await apiAgent(registry, null, FLAGS);
    try {
      await idle.agent.waitForReconcile(0, 30_000);
      await sleep(5000);
      rows.push(['idle, API', await splitOf(idle.agent.child.pid!, idle.metricsUrl)]);
    } finally {
      await idle.done();
    }
    say(`pushing ${N} images...`);
    const refs = await pushMany(registry, N, (i) => `bench/n${i}`);
    const set = await apiAgent(registry, refs, FLAGS);
    try {
      await untilReadyAndResyncs(set.agent);
      rows.push([`after ${N} images from the API`, await splitOf(set.agent.child.pid!, set.metricsUrl)]);
    } finally {
      await set.done();
    }
  } finally {
    await registry.stop();
  }
  say(`\n| MB | ${rows.map((r) => r[0]).join(' | ')} |\n|---|${rows.map(() => '---:').join('|')}|`);
  const line = (label: string, f: (r: Record<string, number>) => number) => say(`| ${label} | ${rows.map((r) => MB(f(r[1]))).join(' | ')} |`);
  line('RSS', (r) => r.rss!);
  line('the node binary (file-backed)', (r) => r.nodeBinary!);
  line('shared libraries (file-backed)', (r) => r.libraries!);
  line('anonymous', (r) => r.anonymous!);
  line('  of it V8 heap, committed', (r) => r.v8HeapCommitted!);
  line('  of that, live objects', (r) => r.v8HeapUsed!);
  line('  the rest: malloc (Node.js, nghttp2, V8 zones), stacks, WebAssembly', (r) => r.anonymous! - r.v8HeapCommitted!);
}

async function once(): Promise<void> {
  const registry = await Registry.start();
  const c = await Containerd.start({ mirrors: { 'registry.test': registry.url } });
  const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-once-'));
  try {
    const refs: string[] = [];
    for (let i = 0; i < 16; i++) refs.push((await pushRandom(registry, `bench/k${i}`, 100_000)).ref);
    const cri = new CriClient(c.endpoint);
    for (const r of refs) await cri.pullImage(r);
    cri.close();
    const cli = await bundledCli();
    const totals: number[] = [];
    for (let run = 0; run <= 5; run++) {
      const sd = path.join(dir, `s${run}`);
      const dd = path.join(dir, `d${run}`);
      await mkdir(sd);
      await mkdir(dd);
      await writeFile(path.join(sd, 'bench.yaml'), dumpYaml(setDoc('bench', refs)));
      const t0 = Date.now();
      const p0 = performance.now();
      const child = spawn(process.execPath, [...FLAGS, cli, 'agent', '--once', '--node-name', 'bench-node', '--static-dir', sd, '--cri-endpoint', c.endpoint, '--crio-dropin-dir', dd, '--state-dir', path.join(path.dirname(dd), 'state'), '--reload', 'none', '--pin-backend', 'crio', '--auth-file', path.join(dir, 'x.json'), '--metrics-addr', '', '--log-level', 'info'], {
        stdio: ['ignore', 'ignore', 'pipe'],
        env: { PATH: process.env.PATH, ...Object.fromEntries((process.env.BENCH_PROBE_ENV ?? '').split(' ').filter(Boolean).map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)])) },
      });
      let stderr = '';
      child.stderr.on('data', (d: Buffer) => (stderr += d));
      await new Promise((r) => child.on('close', r));
      const total = performance.now() - p0;
      if (run === 0) continue; // warm-up: the page cache
      totals.push(total);
      say(`run ${run}: ${total.toFixed(0)} ms from spawn to exit`);
      for (const l of stderr.split('\n').filter((x) => x.startsWith('{'))) {
        const j = JSON.parse(l) as { time: string; msg: string };
        say(`  ${String(Date.parse(j.time) - t0).padStart(4)} ms  ${j.msg}`);
      }
    }
    say(`median ${totals.sort((a, b) => a - b)[totals.length >> 1]!.toFixed(0)} ms from spawn to exit (${totals.length} runs)`);
  } finally {
    await c.stop();
    await registry.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

// The estimate as the agent makes it (src/agent/estimate.ts), in a process of its own with the bundle's flags.
const TLS_CHILD = `
import { readFileSync } from 'node:fs';
const [root, dir] = process.argv.slice(-2);
const { RegistrySizeEstimator } = await import(root + '/src/registry/size-estimator.ts');
const { RegistryClient } = await import(root + '/src/registry/client.ts');
const { loadRegistriesConf } = await import(root + '/src/registry/registries-conf.ts');
const refs = JSON.parse(readFileSync(dir + '/refs.json', 'utf8'));
const registries = await loadRegistriesConf({ file: dir + '/registries.conf', dir: dir + '/none.d' });
const client = new RegistryClient({ registries, timeoutMs: 10000, attempts: 2, userAgent: 'pinset-agent', cacheEntries: 0 });
const est = new RegistrySizeEstimator(client);
const before = process.memoryUsage().rss;
const cpu = process.cpuUsage();
const sizes = await est.sizes(refs);
const used = process.cpuUsage(cpu);
const unknown = [...sizes.values()].filter((s) => 'unknown' in s).length;
console.log(JSON.stringify({ before, after: process.memoryUsage().rss, cpuMs: (used.user + used.system) / 1000, unknown }));
await client.close();
`;

async function tlsEstimate(): Promise<void> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-tls-'));
  const { cert, key } = await makeCertificate(dir, 'registry', ['IP:127.0.0.1']);
  const registry = await Registry.start({ tls: { certificate: cert, key } });
  try {
    say('pushing 300 images over TLS...');
    const { Agent, getGlobalDispatcher, setGlobalDispatcher } = await import('undici');
    const prev = getGlobalDispatcher();
    setGlobalDispatcher(new Agent({ connect: { rejectUnauthorized: false } }));
    let refs: string[];
    try {
      refs = (await pushMany(registry, 300, (i) => `tls/n${i}`)).map((r) => r.replace('registry.test/', 'secure.test/'));
    } finally {
      setGlobalDispatcher(prev);
    }
    await writeFile(path.join(dir, 'refs.json'), JSON.stringify(refs));
    await writeFile(path.join(dir, 'registries.conf'), `[[registry]]\nprefix = "secure.test"\nlocation = "${registry.host}"\n`);
    await writeFile(path.join(dir, 'child.mts'), TLS_CHILD);
    const root = path.resolve(import.meta.dirname, '..');
    for (let i = 0; i < 3; i++) {
      const { stdout } = await promisify(execFile)(process.execPath, [...FLAGS, path.join(dir, 'child.mts'), root, dir], { env: { PATH: process.env.PATH, NODE_EXTRA_CA_CERTS: cert } });
      const r = JSON.parse(stdout) as { before: number; after: number; cpuMs: number; unknown: number };
      if (r.unknown) throw new Error(`${r.unknown} sizes unknown`);
      say(`run ${i + 1}: RSS ${MB(r.before)} MB before the estimate, ${MB(r.after)} MB after; CPU ${r.cpuMs.toFixed(0)} ms`);
    }
  } finally {
    await registry.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

const probes: Record<string, () => Promise<void>> = { timeline, heap, breakdown, once, tls: tlsEstimate };
const which = process.argv[2] ?? '';
if (!probes[which]) {
  process.stderr.write(`usage: node bench/footprint-probe.ts ${Object.keys(probes).join('|')}\n`);
  process.exitCode = 2;
} else {
  await probes[which]!();
}
