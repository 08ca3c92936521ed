// The agent end to end on a real CRI-O (run by test/crio/run.ts, `npm run
// test:crio`): its own process, CRI-O's CRI socket, its drop-in folder,
// reloads through a private D-Bus whose systemd stand-in sends SIGHUP as
// CRI-O's unit does, images from a real registry behind a proxy that counts
// layer downloads. The scenarios of test/integration/pins.test.ts, with
// `pinned` read back from CRI-O itself.
import { afterEach, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { STATUS_ANNOTATION, type NodeSetStatus } from '../../src/api/types.ts';
import { parseNodeStatus } from '../../src/api/node-status.ts';
import { ApiServer } from '../support/apiserver.ts';
import { CriClient } from '../support/containerd.ts';
import { CountingProxy } from '../support/counting-proxy.ts';
import { AgentProcess, runAgentOnce } from '../support/agent-process.ts';
import { buildImage, layerOf, nodePlatform, pushBlob, pushManifest, pushMultiArch, pushSingleLayer } from '../support/images.ts';
import { realCrioMissing, startRealCrioNode, type RealCrioNode } from '../support/real-crio.ts';
import { Registry } from '../support/registry.ts';

const BIN = process.env.PINSET_CRIO_BIN;
const NODE = 'crio-node';

function set(name: string, images: string[]) {
  return { apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name }, spec: { pinnedImages: images.map((n) => ({ name: n })) } };
}

interface Bed {
  registry: Registry;
  proxy: CountingProxy;
  node: RealCrioNode;
  cri: CriClient;
  dir: string;
  staticDir: string;
  api?: ApiServer;
  agent?: AgentProcess;
  args(extra?: string[]): string[];
}

let bed: Bed | undefined;
let n = 0;

async function makeBed(): Promise<Bed> {
  const registry = await Registry.start();
  const proxy = await CountingProxy.start(registry.url);
  const node = await startRealCrioNode({ bin: BIN!, registries: { 'registry.test': proxy.hostPort } });
  const dir = await mkdtemp(join(tmpdir(), 'pinset-crio-agent-'));
  const staticDir = join(dir, 'sets.d');
  await mkdir(staticDir);
  const b: Bed = {
    registry,
    proxy,
    node,
    cri: new CriClient(node.endpoint),
    dir,
    staticDir,
    args: (extra = []) => [
      '--node-name', NODE,
      '--static-dir', staticDir,
      '--cri-endpoint', node.endpoint,
      '--crio-dropin-dir', node.dropInDir,
      '--state-dir', node.stateDir,
      '--reload', 'dbus',
      '--auth-file', join(dir, 'no-auth.json'),
      '--metrics-addr', '',
      '--resync-interval', '10m',
      ...extra,
    ],
  };
  return b;
}

const skipWhy = () => realCrioMissing(BIN);

beforeEach(async () => {
  if (!skipWhy()) bed = await makeBed();
});
afterEach(async () => {
  if (!bed) return;
  if (bed.agent) assert.equal(await bed.agent.stop(), 0, 'agent exits 0 on SIGTERM');
  bed.cri.close();
  await bed.api?.stop();
  await bed.node.stop();
  await bed.proxy.stop();
  await bed.registry.stop();
  await rm(bed.dir, { recursive: true, force: true });
  bed = undefined;
});

async function tagged(repo: string): Promise<{ tag: string; digestRef: string }> {
  const r = `t${n++}/${repo}`;
  const image = buildImage([layerOf([{ name: 'f.txt', data: Buffer.from(`${r} ${Date.now()}\n`) }])], nodePlatform(), r);
  for (const b of [...image.layers, image.config]) await pushBlob(bed!.registry, r, b);
  await pushManifest(bed!.registry, r, image.manifest, 'v1');
  return { tag: `registry.test/${r}:v1`, digestRef: `registry.test/${r}@${image.manifest.digest}` };
}

async function index(repo: string): Promise<{ index: string; platform: string }> {
  const r = `t${n++}/${repo}`;
  const pushed = await pushMultiArch(bed!.registry, r);
  return { index: pushed.ref, platform: `registry.test/${r}@${pushed.platforms[`linux/${nodePlatform().architecture}`]!.manifestDigest}` };
}

const plain = async (repo: string) => (await pushSingleLayer(bed!.registry, `t${n++}/${repo}`)).ref;
const pinned = async (ref: string) => (await bed!.cri.imageStatus(ref))?.pinned;
const reloads = () => bed!.node.systemd.reloadCount('crio.service');
const once = (extra: string[] = []) => runAgentOnce(bed!.args(extra), { env: bed!.node.env });
const writeStatic = (...sets: object[]) => writeFile(join(bed!.staticDir, 'sets.yaml'), sets.map((s) => JSON.stringify(s)).join('\n---\n'));

function runOrSkip(title: string, fn: () => Promise<void>) {
  test(title, async (t) => {
    const why = skipWhy();
    if (why) return t.skip(why);
    await fn();
  });
}

describe('pinset agent on a real CRI-O', () => {
  runOrSkip('--once: fresh images pulled and pinned, exit 0 on real CRI-O timing, one reload', async () => {
    const a = await plain('once/a');
    const b = await plain('once/b');
    await writeStatic(set('boot', [a, b]));
    const r = await once();
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(r.sets.map((s) => [s.name, s.phase]), [['boot', 'Ready']]);
    assert.equal(reloads(), 1);
    assert.equal(await pinned(a), true);
    assert.equal(await pinned(b), true);
  });

  runOrSkip('an image pulled by tag, wanted by digest: a name-only pull, no layer downloaded, pinned', async () => {
    const { tag, digestRef } = await tagged('names/web');
    await bed!.cri.pullImage(tag); // as the kubelet pulls
    const layers = bed!.proxy.layerGets();
    await writeStatic(set('web', [digestRef]));
    const r = await once();
    assert.equal(r.code, 0, r.stderr);
    assert.equal(await pinned(digestRef), true);
    assert.equal(bed!.proxy.layerGets(), layers, 'no layer downloaded');
    assert.match(r.stderr, /"kind":"name"[^\n]*"msg":"pulled image"/);
    assert.equal(reloads(), 1);
  });

  runOrSkip('an index pulled by index digest wanted by platform digest, and the reverse: pinned, no layer downloaded', async () => {
    const m = await index('names/multi');
    const rev = await index('names/rev');
    await bed!.cri.pullImage(m.index);
    await bed!.cri.pullImage(rev.platform);
    const layers = bed!.proxy.layerGets();
    await writeStatic(set('multi', [m.platform]), set('rev', [rev.index]));
    const r = await once();
    assert.equal(r.code, 0, r.stderr);
    assert.equal(await pinned(m.platform), true);
    assert.equal(await pinned(rev.index), true);
    assert.equal(bed!.proxy.layerGets(), layers, 'no layer downloaded');
    assert.equal(reloads(), 1);
  });

  runOrSkip('a removal is confirmed: the image stays, unpinned', async () => {
    const a = await plain('rm/a');
    const b = await plain('rm/b');
    await writeStatic(set('boot', [a, b]));
    assert.equal((await once()).code, 0);
    await writeStatic(set('boot', [a]));
    const r = await once();
    assert.equal(r.code, 0, r.stderr);
    assert.equal(reloads(), 2);
    assert.equal(await pinned(b), false);
    assert.ok(await bed!.cri.imageStatus(b), 'still on the node');
    assert.match(r.stderr, /"confirmed":true[^\n]*"msg":"CRI-O reloaded and applied its pin list"/);
  });

  runOrSkip('a pin file CRI-O never loaded is reloaded once and confirmed', async () => {
    const a = await plain('unloaded/a');
    await writeStatic(set('boot', [a]));
    const first = await once(['--reload', 'none']);
    assert.equal(first.code, 1, 'written and pulled, not loaded');
    assert.equal(await pinned(a), false);
    const r = await once();
    assert.equal(r.code, 0, r.stderr);
    assert.equal(reloads(), 1);
    assert.equal(await pinned(a), true);
  });

  runOrSkip('a drop-in CRI-O would refuse: CrioConfigRejected naming it, no reload; removed: reloaded at once and pinned', async () => {
    const api = (bed!.api = await ApiServer.start({ bookmarkIntervalMs: 1000 }));
    api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: NODE, labels: {} } });
    const a = await plain('refused/a');
    const broken = join(bed!.node.dropInDir, '.50-half-written.tmp');
    await writeFile(broken, '[crio.image]\npinned_images = ["unterminated');
    api.create(set('a', [a]));
    bed!.agent = AgentProcess.start([...bed!.args(), '--kubeconfig', await api.writeKubeconfig(bed!.dir)], { env: bed!.node.env });
    const status = (): NodeSetStatus | undefined => {
      const raw = api.get('nodes', NODE)?.metadata.annotations?.[STATUS_ANNOTATION];
      return raw ? parseNodeStatus(raw).status?.sets.find((s) => s.name === 'a') : undefined;
    };
    await api.waitFor(() => status()?.reason === 'CrioConfigRejected', 30_000, `CrioConfigRejected (now ${JSON.stringify(status())})`);
    assert.ok(status()?.message?.includes(broken));
    assert.equal(reloads(), 0);
    await rm(broken);
    await api.waitFor(() => status()?.phase === 'Ready', 30_000, `Ready after the fix (now ${JSON.stringify(status())})`);
    assert.equal(reloads(), 1);
    assert.equal(await pinned(a), true);
  });

  runOrSkip('RemoveImage of a pinned image: noticed, pulled again, pinned', async () => {
    const a = await plain('removed/a');
    await writeStatic(set('a', [a]));
    const agent = (bed!.agent = AgentProcess.start(bed!.args(['--presence-check-interval', '1s']), { env: bed!.node.env }));
    await agent.waitForLog((l) => l.msg === 'reconcile finished' && (l.phases as Record<string, number>)?.Ready === 1, 60_000, 'Ready');
    const id = (await bed!.cri.imageStatus(a))!.id;
    await bed!.cri.removeImage(id);
    const line = await agent.waitForLog((l) => l.msg === 'a pinned image was removed from the runtime; pulling it again', 30_000, 'the removal noticed');
    assert.equal(line.image, a);
    const deadline = Date.now() + 30_000;
    while ((await pinned(a)) !== true) {
      assert.ok(Date.now() < deadline, 'pulled again and pinned');
      await new Promise((r) => setTimeout(r, 200));
    }
  });

  runOrSkip('CRI-O restarted while the sets change: never signalled before it answers, then pinned', async () => {
    const a = await plain('restart/a');
    const b = await plain('restart/b');
    await writeStatic(set('a', [a]));
    const agent = (bed!.agent = AgentProcess.start(bed!.args(), { env: bed!.node.env }));
    await agent.waitForLog((l) => l.msg === 'reconcile finished' && (l.phases as Record<string, number>)?.Ready === 1, 60_000, 'Ready');
    await bed!.node.crio.stop();
    await writeStatic(set('a', [a]), set('b', [b]));
    await new Promise((r) => setTimeout(r, 1500));
    await bed!.node.crio.start();
    await agent.waitForLog((l) => l.msg === 'reconcile finished' && (l.phases as Record<string, number>)?.Ready === 2, 60_000, 'both Ready');
    assert.ok(bed!.node.crio.running, 'CRI-O is alive (a SIGHUP during its start would have killed it)');
    assert.equal(await pinned(b), true);
  });
});
