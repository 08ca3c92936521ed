// An upgrade of pinset itself keeps every pin in force at every instant.
//
// A rolling update of the agent's DaemonSet replaces the pod on each node:
// the kubelet stops the old container (SIGTERM, then SIGKILL once the pod's
// terminationGracePeriodSeconds has passed) and starts one of the new
// image. Here the image runs as the DaemonSet runs it (podman, the shipped
// args, mounts and security context), in two tags that are two builds
// (image IDs apart), on each runtime a node may have:
// - the CRI-O stand-in behind a private D-Bus whose systemd stand-in
//   reloads it (deploy/agent's mounts: /etc/crio, the socket folder, the
//   system bus socket);
// - containerd 1.7.24 pulling from a real registry through a counting proxy
//   (the same DaemonSet's args, env and mounts).
// While the old agent hands over to the new one, the runtime's own CRI
// `pinned` of every pinned image is read every 100 ms, with what would show
// churn: on CRI-O the drop-in folder (exactly one pin file, its content
// unchanged) and the pins CRI-O has loaded; on containerd every image
// record's pin labels and updated_at (a label removed and put back, or a
// record rewritten by a pull, changes it). Then: no false in any reading,
// nothing pulled, no reload, no registry request, and the new agent holds
// the node lock within the grace period and finds nothing to do.
//
// Three orders of hand-over:
// - as shipped: deploy/agent's RollingUpdate has maxUnavailable and no
//   maxSurge, so the DaemonSet controller deletes the old pod and creates
//   the new one only once the old one's containers have stopped (a
//   terminating pod still counts as the node's pod);
// - overlapping (a maxSurge, or the systemd unit beside the pod during a
//   migration): the new agent starts first, waits for the node lock, not
//   ready and writing nothing, and takes over as the old one exits;
// - the old agent SIGKILLed (no stop hook at all): the new one adopts its pins.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test, type TestContext } from 'node:test';
import { parse as parseYaml, stringify as dumpYaml } from 'yaml';
import { OWN_LABEL, PIN_LABEL } from '../../src/containerd/label-pins.ts';
import type { PinnedImageSet } from '../../src/api/types.ts';
import type { LogLine } from '../support/agent-process.ts';
import { missingComponents, requireComponents, type ComponentName } from '../support/components.ts';
import { Containerd, containerdComponent, CriClient } from '../support/containerd.ts';
import { ImagesClient } from '../support/containerd-proto.ts';
import { CountingProxy } from '../support/counting-proxy.ts';
import { startCrioNode, type CrioNode } from '../support/crio-node.ts';
import { pushMultiLayer, pushSingleLayer } from '../support/images.ts';
import { buildVariant, ImageContainer, imageProblem, imageTags, removeImage, requireImage } from '../support/pinset-image.ts';
import { freePort, Registry } from '../support/registry.ts';
import { Sampler, type Sample } from '../support/sampler.ts';

const ROOT = path.resolve(import.meta.dirname, '../..');
const NEEDS: ComponentName[] = ['podman', 'buildah', 'runc'];
const NEEDS_CRIO: ComponentName[] = [...NEEDS, 'dbus-daemon'];
const NEEDS_CONTAINERD: ComponentName[] = [...NEEDS, containerdComponent('1.7'), 'docker-registry'];
const NODE = 'upgrade-node';
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

// ---------------------------------------------------------------------------
// The DaemonSet as shipped: what the kubelet and the DaemonSet controller do with it.

interface Container {
  args?: string[];
  env?: { name: string; value?: string }[];
}
interface DaemonSet {
  spec: {
    updateStrategy?: { type?: string; rollingUpdate?: { maxUnavailable?: string | number; maxSurge?: string | number } };
    template: { spec: { terminationGracePeriodSeconds?: number; containers: Container[] } };
  };
}
const SHIPPED = parseYaml(readFileSync(path.join(ROOT, 'deploy/agent/daemonset.yaml'), 'utf8')) as DaemonSet;
/** Kubernetes' default when the pod says nothing. */
const GRACE_SECONDS = SHIPPED.spec.template.spec.terminationGracePeriodSeconds ?? 30;
const ARGS = SHIPPED.spec.template.spec.containers[0]!.args!;
/** The shipped container's env with a literal value (the host root, the paths under it); the downward API's are given per node. */
const ENV = Object.fromEntries(SHIPPED.spec.template.spec.containers[0]!.env!.flatMap((e) => (typeof e.value === 'string' ? [[e.name, e.value]] : [])));
/** Where the DaemonSet mounts the host's / (its /run, /var/lib and /etc). */
const HOST = ENV.PINSET_HOST_ROOT!;

function set(refs: string[]): PinnedImageSet {
  return { apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name: 'upgrade' }, spec: { pinnedImages: refs.map((name) => ({ name })) } };
}

// ---------------------------------------------------------------------------
// A node, as the hand-over sees it.

interface Reading {
  /** CRI `pinned` of each pinned reference (false when the image is not there). */
  pinned: boolean[];
  /** What must not move while the agents hand over, as one comparable text. */
  state: string;
}

interface RollNode {
  runtime: string;
  refs: string[];
  /** The DaemonSet's container on this node: args after the ENTRYPOINT, mounts, environment. */
  container(metricsPort: number): { args: string[]; volumes: string[]; env: Record<string, string> };
  read(): Promise<Reading>;
  /** From now on, count what must not happen during the hand-over (pulls, reloads, registry requests). */
  mark(): void;
  /** What happened since mark() that should not have. */
  activity(): string[];
  close(): Promise<void>;
}

async function nodeFolders(prefix: string) {
  const dir = await mkdtemp(path.join(os.tmpdir(), prefix));
  const sets = path.join(dir, 'sets.d');
  const authFile = path.join(dir, 'config.json');
  const containersConf = path.join(dir, 'containers');
  await mkdir(sets);
  await mkdir(containersConf);
  await writeFile(authFile, JSON.stringify({ auths: {} }), { mode: 0o600 });
  return { dir, sets, authFile, containersConf };
}

/** CRI `pinned` of each reference (one ImageStatus each; an image not there counts as not pinned). */
async function pinnedOf(cri: CriClient, refs: string[]): Promise<boolean[]> {
  return Promise.all(refs.map(async (r) => (await cri.imageStatus(r, { deadlineMs: 5_000 }))?.pinned === true));
}

/** The CRI-O stand-in, reloaded over a private D-Bus, with deploy/agent's mounts. */
async function crioNode(): Promise<RollNode> {
  const refs = ['upgrade/web', 'upgrade/db', 'upgrade/cache'].map((repo, i) => `registry.test/${repo}@sha256:${String(i + 1).repeat(64)}`);
  const node: CrioNode = await startCrioNode({ catalogue: Object.fromEntries(refs.map((r) => [r, { size: 4096 }])) });
  const f = await nodeFolders('pinset-e2e-upgrade-crio-');
  const state = path.join(f.dir, 'var-lib-pinset');
  await mkdir(state);
  await writeFile(path.join(f.sets, 'sets.yaml'), dumpYaml(set(refs)));
  const cri = new CriClient(node.endpoint);
  const etcCrio = path.dirname(node.dropInDir);
  let marked = { pulls: 0, reloads: 0 };
  const counts = () => ({ pulls: node.crio.calls.filter((c) => c.method === 'PullImage').length, reloads: node.systemd.reloads.length });
  return {
    runtime: 'CRI-O stand-in',
    refs,
    container: (port) => ({
      args: ARGS,
      // Each part of the node where the DaemonSet's host mounts show it (under /host).
      volumes: [
        `${path.dirname(node.crio.socketPath)}:${HOST}/run/crio:ro`,
        `${etcCrio}:${HOST}/etc/crio`,
        `${state}:/var/lib/pinset`,
        // The stand-in's image filesystem (ImageFsInfo), at its own path under the host's.
        `${node.crio.imageFsMountpoint}:${HOST}${node.crio.imageFsMountpoint}:ro`,
        `${node.bus.socketPath}:${HOST}/run/dbus/system_bus_socket:ro`,
        `${f.authFile}:${HOST}/var/lib/kubelet/config.json:ro`,
        `${f.sets}:${HOST}/etc/pinset/sets.d:ro`,
        `${f.containersConf}:${HOST}/etc/containers:ro`,
      ],
      env: { ...ENV, NODE_NAME: NODE, PINSET_METRICS_ADDR: `127.0.0.1:${port}` },
    }),
    async read() {
      const pinned = await pinnedOf(cri, refs);
      // Every entry of the drop-in folder, each pin file's bytes, and the list CRI-O has loaded.
      const names = (await readdir(node.dropInDir)).sort();
      const files = await Promise.all(names.filter((n) => n.startsWith('99-pinset-')).map(async (n) => [n, await readFile(path.join(node.dropInDir, n), 'utf8')]));
      if (files.length !== 1) throw new Error(`the drop-in folder holds ${files.length} pin files, not one: ${names.join(', ')}`);
      return { pinned, state: JSON.stringify({ names, files, loaded: node.crio.pinnedPatterns() }) };
    },
    mark: () => void (marked = counts()),
    activity: () => [
      ...node.crio.calls.filter((c) => c.method === 'PullImage').slice(marked.pulls).map((c) => `PullImage ${JSON.stringify(c.request.image)}`),
      ...node.systemd.reloads.slice(marked.reloads).map((r) => `ReloadUnit ${r.unit} (${r.result ?? 'running'})`),
    ],
    async close() {
      cri.close();
      await node.stop();
      await rm(f.dir, { recursive: true, force: true });
    },
  };
}

/** containerd 1.7.24 and a registry behind a counting proxy, with the DaemonSet's args, env and mounts. */
async function containerdNode(): Promise<RollNode> {
  const registry = await Registry.start();
  const proxy = await CountingProxy.start(registry.url);
  const containerd = await Containerd.start({ version: '1.7', mirrors: { 'registry.test': `http://${proxy.hostPort}` } });
  const images = [await pushSingleLayer(registry, 'upgrade/web'), await pushMultiLayer(registry, 'upgrade/db', 3), await pushSingleLayer(registry, 'upgrade/cache')];
  const refs = images.map((i) => i.ref);
  const f = await nodeFolders('pinset-e2e-upgrade-ctrd-');
  const state = path.join(f.dir, 'var-lib-pinset');
  await mkdir(state);
  await writeFile(path.join(f.sets, 'sets.yaml'), dumpYaml(set(refs)));
  const cri = new CriClient(containerd.endpoint);
  const records = new ImagesClient(containerd.endpoint);
  let marked = 0;
  return {
    runtime: 'containerd 1.7.24',
    refs,
    container: (port) => ({
      args: ARGS,
      volumes: [
        // containerd's folder holds its socket (containerd.sock): the host's /run/containerd.
        `${containerd.dir}:${HOST}/run/containerd:ro`,
        // Its root at its own path under the host's, for the disk check.
        `${path.join(containerd.dir, 'root')}:${HOST}${path.join(containerd.dir, 'root')}:ro`,
        // Its registry hosts, where containerd's default config_path is.
        `${containerd.certsDir}:${HOST}/etc/containerd/certs.d:ro`,
        `${state}:/var/lib/pinset`,
        `${f.authFile}:${HOST}/var/lib/kubelet/config.json:ro`,
        `${f.sets}:${HOST}/etc/pinset/sets.d:ro`,
      ],
      env: { ...ENV, NODE_NAME: NODE, PINSET_METRICS_ADDR: `127.0.0.1:${port}` },
    }),
    async read() {
      const [pinned, list] = await Promise.all([pinnedOf(cri, refs), records.list()]);
      // Every record (names and image IDs): its pin labels and when containerd last wrote it.
      const recs = list
        .map((r) => ({ name: r.name, pin: r.labels[PIN_LABEL] ?? null, own: r.labels[OWN_LABEL] ?? null, updatedAt: r.updatedAt ? `${r.updatedAt.seconds}.${r.updatedAt.nanos}` : null }))
        .sort((a, b) => a.name.localeCompare(b.name));
      const labelled = recs.filter((r) => r.pin === 'pinned' && r.own !== null);
      if (labelled.length !== images.length) throw new Error(`${labelled.length} image records carry pinset's pin labels, not ${images.length}: ${JSON.stringify(recs)}`);
      return { pinned, state: JSON.stringify(recs) };
    },
    mark: () => void (marked = proxy.requests.length),
    activity: () => proxy.requests.slice(marked).map((r) => `registry ${r.method} ${r.path}`),
    async close() {
      cri.close();
      records.close();
      await containerd.stop();
      await proxy.stop();
      await registry.stop();
      await rm(f.dir, { recursive: true, force: true });
    },
  };
}

// ---------------------------------------------------------------------------
// The hand-over.

type Order = 'shipped' | 'overlapping' | 'sigkill';

interface Images {
  old: { tag: string; id: string };
  new: { tag: string; id: string };
}

const timeOf = (l: LogLine) => Date.parse(String(l.time));
const isReadyReconcile = (refs: string[]) => (l: LogLine) =>
  l.msg === 'reconcile finished' && l.wanted === refs.length && JSON.stringify(l.phases) === JSON.stringify({ Ready: 1 });

async function readyz(port: number): Promise<{ status: number; body: string }> {
  const res = await fetch(`http://127.0.0.1:${port}/readyz`, { signal: AbortSignal.timeout(2_000) });
  return { status: res.status, body: await res.text() };
}

async function eventuallyReady(port: number, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last = '';
  while (Date.now() < deadline) {
    const r = await readyz(port).catch((e: Error) => ({ status: 0, body: e.message }));
    if (r.status === 200) return;
    last = `${r.status} ${r.body}`;
    await sleep(100);
  }
  throw new Error(`/readyz not 200 within ${timeoutMs} ms: ${last}`);
}

function describeSample(s: Sample<Reading> | undefined, refs: string[]): string {
  if (!s) return 'none';
  if (s.error) return `${new Date(s.at).toISOString()}: reading failed: ${s.error}`;
  return `${new Date(s.at).toISOString()}: ${refs.map((r, i) => `${r.split('@')[0]}=${s.value!.pinned[i]}`).join(' ')}`;
}

async function handOver(t: TestContext, node: RollNode, images: Images, order: Order): Promise<void> {
  const containers: ImageContainer[] = [];
  const start = async (which: 'old' | 'new') => {
    const port = await freePort();
    const spec = node.container(port);
    const c = ImageContainer.start(spec.args, { image: images[which].tag, volumes: spec.volumes, env: spec.env });
    containers.push(c);
    return { c, port };
  };
  const sampler = new Sampler(() => node.read(), 100);
  try {
    // The old agent, until its set is Ready and the runtime reports every image pinned.
    const old = await start('old');
    await old.c.process.waitForLog(isReadyReconcile(node.refs), 90_000, 'the old agent: the set Ready');
    const before = await node.read();
    assert.deepEqual(before.pinned, node.refs.map(() => true), `${node.runtime} reports every image pinned before the roll`);
    await eventuallyReady(old.port);
    assert.equal(await old.c.imageId(), images.old.id, 'the old pod runs the old build');

    node.mark();
    sampler.start();
    await sleep(500);

    let next: { c: ImageContainer; port: number } | undefined;
    if (order === 'overlapping') {
      next = await start('new');
      await next.c.process.waitForLog((l) => l.msg === 'another pinset agent holds the node lock; waiting for it to exit before writing anything', 60_000, 'the new agent waiting for the node lock');
      const r = await readyz(next.port);
      assert.equal(r.status, 503, 'a waiting agent is not ready');
      assert.match(r.body, /waiting for the node lock .*agent\.lock: pinset agent pid \d+ on host \S+ \(node upgrade-node, started .*\) holds it/);
      await sleep(500); // it stays waiting, and writes nothing (the readings say so)
    }

    // The old agent goes.
    let termAt: number;
    const stopAsked = Date.now();
    if (order === 'sigkill') {
      termAt = stopAsked;
      assert.equal(await old.c.kill(), 137, 'SIGKILL ends the container at once');
    } else {
      const code = await old.c.stop(GRACE_SECONDS);
      const stopping = old.c.process.logs().find((l) => l.msg === 'stopping');
      assert.equal(stopping?.signal, 'SIGTERM', 'the old agent got SIGTERM');
      termAt = timeOf(stopping!);
      assert.equal(code, 0, `the old agent exits 0 on SIGTERM, within the grace period\n${old.c.process.output().slice(-2000)}`);
      assert.ok(old.c.process.logs().some((l) => l.msg === 'stopped'), 'the old agent stopped on its own, not killed');
    }
    const oldGoneAt = Date.now();
    // As shipped (and after a SIGKILL) the DaemonSet controller creates the new pod once the old one is gone.
    next ??= await start('new');

    const lock = await next.c.process.waitForLog((l) => l.msg === 'node lock held: this agent writes the pins of this node', 60_000, 'the new agent holding the node lock');
    const first = await next.c.process.waitForLog((l) => l.msg === 'reconcile finished', 60_000, "the new agent's first reconcile");
    assert.equal(await next.c.imageId(), images.new.id, 'the new pod runs the new build');
    assert.equal(lock.tookOver, order === 'overlapping' ? true : undefined, order === 'overlapping' ? 'it took over from the agent it waited for' : 'the lock was free when it started');
    assert.ok(timeOf(lock) - termAt < GRACE_SECONDS * 1000, `the new agent holds the node lock within the grace period (${GRACE_SECONDS} s)`);
    assert.deepEqual(
      { wrote: first.wrote, reloaded: first.reloaded, pulls: first.pulls, wanted: first.wanted, phases: first.phases },
      { wrote: false, reloaded: false, pulls: 0, wanted: node.refs.length, phases: { Ready: 1 } },
      'the new agent adopts the pins as they are: nothing written, reloaded or pulled, the set Ready',
    );
    await eventuallyReady(next.port);
    await sleep(500);
    const samples = await sampler.stop();

    // Every reading, from before the roll to after the new agent's first reconcile.
    const failed = samples.filter((s) => s.error !== undefined);
    assert.deepEqual(failed.map((s) => describeSample(s, node.refs)), [], 'every reading of the runtime answered');
    assert.ok(samples[0]!.at < stopAsked && samples.at(-1)!.at > timeOf(first), 'the readings cover the whole hand-over');
    const unpinned = samples.filter((s) => s.value!.pinned.some((p) => !p));
    assert.equal(unpinned.length, 0, `never a false: ${unpinned.length} of ${samples.length} readings had an image unpinned, first ${describeSample(unpinned[0], node.refs)}`);
    const moved = samples.filter((s) => s.value!.state !== before.state);
    assert.equal(moved.length, 0, `nothing moved: ${moved.length} readings differ from the one before the roll\nbefore: ${before.state}\nfirst:  ${moved[0]?.value?.state}`);
    assert.deepEqual(node.activity(), [], 'nothing pulled, reloaded or fetched from the registry during the hand-over');

    const lowest = Math.min(...samples.map((s) => s.value!.pinned.filter(Boolean).length));
    t.diagnostic(
      `${node.runtime}, ${order}: old stop asked -> old gone ${oldGoneAt - stopAsked} ms; ` +
        `${order === 'sigkill' ? 'SIGKILL' : 'SIGTERM'} -> new lock held ${timeOf(lock) - termAt} ms, -> new first reconcile done ${timeOf(first) - termAt} ms; ` +
        `lowest pinned count ${lowest} of ${node.refs.length} over ${samples.length} readings (largest gap ${sampler.maxGapMs()} ms)`,
    );
  } finally {
    await sampler.stop();
    for (const c of containers) await c.remove();
  }
}

// ---------------------------------------------------------------------------

/** Where the two builds are tagged, `<BUILDS>:old-<pid>-<time>` and `new-...`: never the image other tests run. */
const BUILDS = 'localhost/pinset-upgrade-test';

/** Builds a test process left behind when it died before its after hook (its pid is gone). */
async function removeLeftovers(): Promise<void> {
  for (const tag of await imageTags(BUILDS)) {
    const pid = Number(/:(?:old|new)-(\d+)-/.exec(tag)?.[1]);
    if (!pid) continue;
    try {
      process.kill(pid, 0);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ESRCH') await removeImage(tag);
    }
  }
}

describe('upgrading pinset: a rolling update of the DaemonSet keeps every pin in force', () => {
  let images: Images | undefined;

  before(async () => {
    if (missingComponents(NEEDS).length > 0 || (await imageProblem()) !== null) return; // each test reports it
    await removeLeftovers();
    const stamp = `${process.pid}-${Date.now().toString(36)}`;
    const tags = { old: `${BUILDS}:old-${stamp}`, new: `${BUILDS}:new-${stamp}` };
    const old = { tag: tags.old, id: await buildVariant(tags.old, { 'dev.pinset.test-build': 'old' }) };
    images = { old, new: { tag: tags.new, id: await buildVariant(tags.new, { 'dev.pinset.test-build': 'new' }) } };
  });

  after(async () => {
    if (images) for (const i of [images.old, images.new]) await removeImage(i.tag);
  });

  async function ready(t: TestContext, needs: ComponentName[]): Promise<Images | null> {
    if (!requireComponents(t, needs) || !(await requireImage(t))) return null;
    assert.ok(images, 'the two builds were made');
    assert.notEqual(images.old.id, images.new.id, 'two builds, two image IDs');
    return images;
  }

  test("the shipped DaemonSet rolls a node's pod delete-first, with a grace period", () => {
    const strategy = SHIPPED.spec.updateStrategy;
    assert.equal(strategy?.type, 'RollingUpdate');
    // With a maxSurge the DaemonSet controller would delete the old pod only
    // once the new one is available, and the new one is not ready while the
    // old one holds the node lock: the roll would stop at the first node.
    assert.equal(strategy?.rollingUpdate?.maxSurge ?? 0, 0, 'no maxSurge: the new pod starts once the old one is gone');
    // One DaemonSet on both runtimes: the agent finds each node's under the host root.
    assert.deepEqual(ARGS, ['agent']);
    assert.equal(HOST, '/host');
  });

  describe('on the CRI-O stand-in (drop-in file, D-Bus reload)', () => {
    for (const order of ['shipped', 'overlapping', 'sigkill'] as const) {
      test(`${order}: never a false, one pin file unchanged, nothing pulled or reloaded`, async (t) => {
        const imgs = await ready(t, NEEDS_CRIO);
        if (!imgs) return;
        const node = await crioNode();
        try {
          await handOver(t, node, imgs, order);
        } finally {
          await node.close();
        }
      });
    }
  });

  describe('on containerd 1.7.24 (image labels, a real registry)', () => {
    for (const order of ['shipped', 'overlapping', 'sigkill'] as const) {
      test(`${order}: never a false, no label removed or record rewritten, nothing fetched from the registry`, async (t) => {
        const imgs = await ready(t, NEEDS_CONTAINERD);
        if (!imgs) return;
        const node = await containerdNode();
        try {
          await handOver(t, node, imgs, order);
        } finally {
          await node.close();
        }
      });
    }
  });
});
