// `npm run bench:pins`: time from a set change (a PinnedImageSet created on
// the API server) to the runtime reporting every image of the set pinned
// (ImageStatus polled every 5 ms over the CRI socket by this process), and
// the reloads each change cost. Target: <= 1 s and exactly one reload.
//
// Runtimes: the CRI-O stand-in (always) and, with PINSET_CRIO_BIN set, a
// real CRI-O as a plain process (test/support/real-crio.ts). Both behind a
// private D-Bus whose systemd stand-in sends SIGHUP as CRI-O's unit does.
// And containerd 1.7 (.cache/containerd-1.7, when .ci/setup has unpacked
// it), pinned through its image labels: no reload at all.
// Images of each set (BENCH_PIN_K, default 10) are, per case:
// - present: already on the node under their digest names (pulled by digest);
// - by tag: on the node under a tag only (the agent adds the names);
// - absent: pulled by the agent (small images from a loopback registry).
// BENCH_RUNS changes per case (default 7). Results printed as Markdown and
// written to bench/pin-latency.json.
import { writeFile } from 'node:fs/promises';
import { mkdtemp, mkdir, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { randomBytes } from 'node:crypto';
import { AgentProcess } from '../test/support/agent-process.ts';
import { ApiServer, type KubeObject } from '../test/support/apiserver.ts';
import { missingComponents, missingMessage } from '../test/support/components.ts';
import { Containerd, CriClient } from '../test/support/containerd.ts';
import { startCrioNode, type CrioNode } from '../test/support/crio-node.ts';
import { buildImage, layerOf, nodePlatform, pushBlob, pushManifest, pushSingleLayer } from '../test/support/images.ts';
import { realCrioMissing, startRealCrioNode, type RealCrioNode } from '../test/support/real-crio.ts';
import { Registry } from '../test/support/registry.ts';

const RUNS = Number(process.env.BENCH_RUNS ?? 7);
const K = Number(process.env.BENCH_PIN_K ?? 10);
const RESULTS = fileURLToPath(new URL('./pin-latency.json', import.meta.url));
const AGENT_ENV: NodeJS.ProcessEnv = { NODE_OPTIONS: process.env.BENCH_AGENT_NODE_OPTIONS ?? '--max-semi-space-size=1' };
type Case = 'present' | 'by tag' | 'absent';
const CASES: Case[] = ['present', 'by tag', 'absent'];

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const say = (line = '') => process.stdout.write(`${line}\n`);
function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

/** A runtime under test: images it can be made to hold, and its reload count. */
interface Target {
  name: string;
  endpoint: string;
  env: NodeJS.ProcessEnv;
  /** Flags for the agent beyond the common ones. */
  agentArgs: string[];
  reloads(): number;
  /** K fresh images for one change, put on the node as `how` says; returns the references the set names. */
  images(how: Case, run: number): Promise<string[]>;
  stop(): Promise<void>;
}

async function standIn(): Promise<Target> {
  const node: CrioNode = await startCrioNode();
  const cri = new CriClient(node.endpoint);
  return {
    name: 'CRI-O stand-in',
    endpoint: node.endpoint,
    env: node.env,
    // No registry behind the stand-in: no size estimate to make.
    agentArgs: ['--crio-dropin-dir', node.dropInDir, '--state-dir', node.stateDir, '--reload', 'dbus', '--disk-estimate-factor', '0'],
    reloads: () => node.systemd.reloadCount('crio.service'),
    async images(how, run) {
      const refs: string[] = [];
      for (let i = 0; i < K; i++) {
        const d = `sha256:${randomBytes(32).toString('hex')}`;
        const repo = `registry.test/bench/r${run}-${how.replace(' ', '')}-${i}`;
        const ref = `${repo}@${d}`;
        node.crio.catalogue.set(ref, { size: 1000 });
        node.crio.catalogue.set(`${repo}:v1`, { size: 1000, digest: d });
        if (how === 'present') await cri.pullImage(ref);
        if (how === 'by tag') await cri.pullImage(`${repo}:v1`);
        refs.push(ref);
      }
      return refs;
    },
    async stop() {
      cri.close();
      await node.stop();
    },
  };
}

/** K images from the loopback registry, put on the node through CRI as `how` says (a runtime that pulls from it). */
async function registryImages(registry: Registry, cri: CriClient, how: Case, prefix: string): Promise<string[]> {
  const refs: string[] = [];
  for (let i = 0; i < K; i++) {
    const repo = `${prefix}-${how.replace(' ', '')}-${i}`;
    if (how === 'by tag') {
      const image = buildImage([layerOf([{ name: 'f.txt', data: randomBytes(64) }])], nodePlatform(), repo);
      for (const b of [...image.layers, image.config]) await pushBlob(registry, repo, b);
      await pushManifest(registry, repo, image.manifest, 'v1');
      await cri.pullImage(`registry.test/${repo}:v1`);
      refs.push(`registry.test/${repo}@${image.manifest.digest}`);
    } else {
      const ref = (await pushSingleLayer(registry, repo)).ref;
      if (how === 'present') await cri.pullImage(ref);
      refs.push(ref);
    }
  }
  return refs;
}

async function realCrio(bin: string): Promise<Target> {
  const registry = await Registry.start();
  const node: RealCrioNode = await startRealCrioNode({ bin, registries: { 'registry.test': `127.0.0.1:${registry.port}` } });
  const cri = new CriClient(node.endpoint);
  return {
    name: 'CRI-O 1.32 (real)',
    endpoint: node.endpoint,
    env: node.env,
    // The agent reads the node's registries.conf (CRI-O's here) for its size estimate, as on a node.
    agentArgs: ['--crio-dropin-dir', node.dropInDir, '--state-dir', node.stateDir, '--reload', 'dbus', '--registries-conf', path.join(path.dirname(node.crio.mainConfig), 'registries.conf')],
    reloads: () => node.systemd.reloadCount('crio.service'),
    images: (how, run) => registryImages(registry, cri, how, `bench/r${run}`),
    async stop() {
      cri.close();
      await node.stop();
      await registry.stop();
    },
  };
}

async function containerd17(): Promise<Target> {
  const registry = await Registry.start();
  const containerd = await Containerd.start({ version: '1.7', mirrors: { 'registry.test': registry.url } });
  const cri = new CriClient(containerd.endpoint);
  const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-bench-ctrd-'));
  // The size estimate reaches the loopback registry as containerd does (its mirror).
  const conf = path.join(dir, 'registries.conf');
  await writeFile(conf, `[[registry]]\nprefix = "registry.test"\nlocation = "127.0.0.1:${registry.port}"\ninsecure = true\n`);
  return {
    name: 'containerd 1.7.24 (real, plain process)',
    endpoint: containerd.endpoint,
    env: {},
    agentArgs: ['--pin-backend', 'containerd', '--crio-dropin-dir', path.join(dir, 'no-crio', 'crio.conf.d'), '--state-dir', path.join(dir, 'state'), '--registries-conf', conf],
    reloads: () => 0,
    images: (how, run) => registryImages(registry, cri, how, `bench/c${run}`),
    async stop() {
      cri.close();
      await containerd.stop();
      await registry.stop();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

interface Sample {
  ms: number;
  reloads: number;
}

async function measure(t: Target): Promise<Record<Case, Sample[]>> {
  const api = await ApiServer.start({ bookmarkIntervalMs: 1000 });
  api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'bench-node', labels: {} } });
  const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-bench-pins-'));
  await mkdir(path.join(dir, 'sets.d'));
  const agent = AgentProcess.start(
    [
      '--node-name', 'bench-node',
      '--kubeconfig', await api.writeKubeconfig(dir),
      '--static-dir', path.join(dir, 'sets.d'),
      '--cri-endpoint', t.endpoint,
      '--auth-file', path.join(dir, 'none.json'),
      '--metrics-addr', '',
      '--resync-interval', '10m',
      ...t.agentArgs,
    ],
    { env: { ...t.env, ...AGENT_ENV } },
  );
  const cri = new CriClient(t.endpoint);
  const out = { present: [], 'by tag': [], absent: [] } as Record<Case, Sample[]>;
  try {
    await agent.waitForReconcile(0, 30_000);
    let run = 0;
    for (let r = 0; r < RUNS; r++) {
      for (const how of CASES) {
        const refs = await t.images(how, run++);
        await sleep(300); // let the agent's own reconciles settle
        const reloadsBefore = t.reloads();
        const started = performance.now();
        api.create({ apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name: `s${run}` }, spec: { pinnedImages: refs.map((name) => ({ name })) } } as unknown as KubeObject);
        for (;;) {
          const st = await Promise.all(refs.map((ref) => cri.imageStatus(ref).catch(() => null)));
          if (st.every((s) => s?.pinned)) break;
          if (performance.now() - started > 60_000) throw new Error(`${t.name} ${how}: not pinned after 60 s\n${agent.output().slice(-2000)}`);
          await sleep(5);
        }
        const ms = performance.now() - started;
        await sleep(1500); // any further reload would come now
        out[how].push({ ms, reloads: t.reloads() - reloadsBefore });
        say(`  ${t.name}, ${how}: ${ms.toFixed(0)} ms, ${t.reloads() - reloadsBefore} reload(s)`);
      }
    }
  } finally {
    cri.close();
    await agent.stop();
    await api.stop();
    await rm(dir, { recursive: true, force: true });
  }
  return out;
}

const targets: (() => Promise<Target>)[] = [standIn];
const bin = process.env.PINSET_CRIO_BIN;
const why = realCrioMissing(bin);
if (!why) targets.push(() => realCrio(bin!));
else say(`real CRI-O skipped: ${why}`);
const ctrd = missingComponents(['containerd-1.7', 'runc', 'docker-registry']);
if (ctrd.length === 0) targets.push(containerd17);
else say(`containerd 1.7 skipped: ${missingMessage(ctrd)}`);

const results: Record<string, Record<Case, Sample[]>> = {};
for (const make of targets) {
  const t = await make();
  say(`${t.name}: ${RUNS} changes per case, ${K} images per set`);
  try {
    results[t.name] = await measure(t);
  } finally {
    await t.stop();
  }
}

say();
say('| runtime | images of the new set | set change to all pinned (ms, median) | slowest (ms) | reloads per change |');
say('|---|---|---:|---:|---|');
for (const [name, byCase] of Object.entries(results)) {
  for (const how of CASES) {
    const s = byCase[how];
    say(`| ${name} | ${how} | ${median(s.map((x) => x.ms)).toFixed(0)} | ${Math.max(...s.map((x) => x.ms)).toFixed(0)} | ${[...new Set(s.map((x) => x.reloads))].join(', ')} |`);
  }
}
await writeFile(RESULTS, JSON.stringify({ date: new Date().toISOString(), runs: RUNS, k: K, results }, null, 2) + '\n');
say(`\nraw: ${path.relative(process.cwd(), RESULTS)}`);
