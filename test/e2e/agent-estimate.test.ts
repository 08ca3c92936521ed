// The disk estimate with real components: the registry-backed size
// estimator against a real registry (and its in-memory twin held to the
// same answers), and `pinset agent --once` on containerd refusing a batch
// whose estimate does not fit below the watermark, then pulling it when it
// does.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdir, mkdtemp, rm, statfs, writeFile } from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { stringify as dumpYaml } from 'yaml';
import { MemorySizeEstimator } from '../../src/agent/estimate.ts';
import { RegistrySizeEstimator } from '../../src/registry/size-estimator.ts';
import { RegistryClient } from '../../src/registry/client.ts';
import { parseRegistriesConf, RegistriesConf } from '../../src/registry/registries-conf.ts';
import { bundledCli, readPinFile, runAgentOnce } from '../support/agent-process.ts';
import { missingComponents, requireComponents, type ComponentName } from '../support/components.ts';
import { Containerd, CriClient } from '../support/containerd.ts';
import { MEDIA_TYPES, nodePlatform, pushMultiArch, pushRandom, unknownRef, type PushedImage } from '../support/images.ts';
import { Registry } from '../support/registry.ts';

const NEEDS: ComponentName[] = ['containerd', 'runc', 'docker-registry'];

async function blobSizes(reg: Registry, repo: string, digest: string): Promise<Map<string, number>> {
  const res = await fetch(`${reg.url}/v2/${repo}/manifests/${digest}`, { headers: { accept: MEDIA_TYPES.manifest } });
  const doc = (await res.json()) as { config: { digest: string; size: number }; layers: { digest: string; size: number }[] };
  return new Map([doc.config, ...doc.layers].map((d) => [d.digest, d.size]));
}

describe('size estimates from a real registry', () => {
  let reg: Registry;
  const ok = () => missingComponents(['docker-registry']).length === 0;
  before(async () => {
    if (ok()) reg = await Registry.start();
  });
  after(async () => {
    await reg?.stop();
  });

  test('an image and a multi-arch index are sized by their blobs (the index by the node platform\'s image, never zero); a resync asks the registry nothing', async (t) => {
    if (!requireComponents(t, ['docker-registry'])) return;
    const img = await pushRandom(reg, 'est/app', 64 * 1024);
    const idx = await pushMultiArch(reg, 'est/multi');
    const registries = new RegistriesConf(parseRegistriesConf(`[[registry]]\nprefix = "registry.test"\nlocation = "${reg.host}"\ninsecure = true\n`, 't.conf'));
    // Without a manifest cache, as the agent makes it (src/agent/estimate.ts): the estimator keeps the sizes.
    const client = new RegistryClient({ registries, cacheEntries: 0 });
    const est = new RegistrySizeEstimator(client, { platform: nodePlatform() });
    try {
      const missing = unknownRef('est/nothing');
      const sizes = await est.sizes([img.ref, idx.ref, missing]);
      assert.deepEqual((sizes.get(img.ref) as { blobs: Map<string, number> }).blobs, await blobSizes(reg, 'est/app', img.digest));
      const mine = idx.platforms[`linux/${nodePlatform().architecture}`]!.manifestDigest;
      const multi = (sizes.get(idx.ref) as { blobs: Map<string, number> }).blobs;
      assert.deepEqual(multi, await blobSizes(reg, 'est/multi', mine));
      assert.ok([...multi.values()].reduce((a, b) => a + b, 0) > 0);
      assert.match((sizes.get(missing) as { unknown: string }).unknown, /HTTP 404/);
      const before = client.requests.manifest;
      await est.sizes([img.ref, idx.ref]);
      assert.equal(client.requests.manifest, before, 'sizes of references by digest come from the cache');

      // The in-memory twin answers the same shapes: blobs for what it knows, unknown (never a throw) for the rest.
      const twin = new MemorySizeEstimator();
      twin.set(img.ref, Object.fromEntries((sizes.get(img.ref) as { blobs: Map<string, number> }).blobs));
      const t2 = await twin.sizes([img.ref, missing]);
      assert.deepEqual(t2.get(img.ref), sizes.get(img.ref));
      assert.ok('unknown' in t2.get(missing)!);
    } finally {
      await client.close();
    }
  });

  test('a registry that fails is not asked again for a minute: the next estimate knows at once', async () => {
    let calls = 0;
    const srv = http.createServer((_req, res) => {
      calls++;
      res.writeHead(503).end();
    });
    await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
    const host = `127.0.0.1:${(srv.address() as AddressInfo).port}`;
    const registries = new RegistriesConf(parseRegistriesConf(`[[registry]]\nprefix = "down.test"\nlocation = "${host}"\ninsecure = true\n`, 't.conf'));
    const client = new RegistryClient({ registries, attempts: 2, retryPolicy: { baseMs: 5, capMs: 10 } });
    let now = 1_000_000;
    const est = new RegistrySizeEstimator(client, { now: () => now });
    const ref = (c: string) => `down.test/x/y@sha256:${createHash('sha256').update(c).digest('hex')}`;
    try {
      const first = await est.sizes([ref('a')]);
      assert.match((first.get(ref('a')) as { unknown: string }).unknown, /HTTP 503/);
      const asked = calls;
      const second = await est.sizes([ref('b'), ref('c')]);
      assert.equal(calls, asked, 'no request while the registry is remembered as down');
      assert.match((second.get(ref('c')) as { unknown: string }).unknown, /HTTP 503/);
      now += 61_000;
      await est.sizes([ref('d')]);
      assert.ok(calls > asked, 'asked again after a minute');
    } finally {
      await client.close();
      srv.closeAllConnections();
      await new Promise<void>((r) => srv.close(() => r()));
    }
  });
});

describe('pinset agent --once: the disk estimate before pulling, on containerd', () => {
  let registry: Registry;
  let containerd: Containerd;
  let cri: CriClient;
  let work: string;
  let ready = false;

  before(async () => {
    if (missingComponents(NEEDS).length > 0 || process.getuid?.() !== 0) return;
    registry = await Registry.start();
    containerd = await Containerd.start({ mirrors: { 'registry.test': registry.url } });
    cri = new CriClient(containerd.endpoint);
    work = await mkdtemp(path.join(os.tmpdir(), 'pinset-e2e-estimate-'));
    ready = true;
  });

  after(async () => {
    cri?.close();
    await containerd?.stop();
    await registry?.stop();
    if (work) await rm(work, { recursive: true, force: true });
  });

  test('a batch whose estimate exceeds the room below the watermark is not pulled (NoSpace, pins kept); with room it is', async (t) => {
    if (!requireComponents(t, NEEDS) || !ready) return;
    const a: PushedImage = await pushRandom(registry, 'est/big-a', 200 * 1024);
    const b: PushedImage = await pushRandom(registry, 'est/big-b', 100 * 1024);
    const staticDir = path.join(work, 'sets.d');
    const dropinDir = path.join(work, 'crio.conf.d');
    await mkdir(staticDir, { recursive: true });
    await mkdir(dropinDir, { recursive: true });
    await writeFile(path.join(staticDir, 'set.yaml'), dumpYaml({ apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name: 'big' }, spec: { pinnedImages: [{ name: a.ref }, { name: b.ref }] } }));
    const conf = path.join(work, 'registries.conf');
    await writeFile(conf, `[[registry]]\nprefix = "registry.test"\nlocation = "${registry.host}"\ninsecure = true\n`);
    const download = [...(await blobSizes(registry, 'est/big-a', a.digest)).values(), ...(await blobSizes(registry, 'est/big-b', b.digest)).values()].reduce((x, y) => x + y, 0);
    // The room below a 99% watermark on containerd's filesystem, as df sees it; a factor that makes the estimate twice that.
    const fs = await statfs(containerd.dir);
    const room = Math.floor((fs.blocks * fs.bsize * 99) / 100) - (fs.blocks - fs.bfree) * fs.bsize;
    const factor = Math.ceil((2 * room) / download);
    const flags = (f: number) => [
      '--node-name', 'estimate-node', '--static-dir', staticDir, '--cri-endpoint', containerd.endpoint, '--crio-dropin-dir', dropinDir,
      '--reload', 'none', '--pin-backend', 'crio', '--auth-file', path.join(work, 'none.json'), '--metrics-addr', '', '--image-fs-high-watermark', '99',
      '--registries-conf', conf, '--registries-conf-dir', path.join(work, 'none.d'), '--disk-estimate-factor', String(f),
    ];

    const refused = await runAgentOnce(flags(factor), { cli: await bundledCli() });
    assert.equal(refused.code, 1, refused.stderr);
    const s = refused.sets[0]!;
    assert.equal(s.phase, 'Degraded');
    assert.equal(s.reason, 'NoSpace');
    assert.match(s.message!, /^no space left on the image filesystem while pulling .*: needs [\d.]+ [KMGT]iB, [\d.]+ [KMGT]iB free below the 99% watermark on \//);
    assert.equal(s.estimatedBytes, Math.ceil(download * factor));
    const listed = await cri.listImages();
    assert.ok(!listed.some((i) => i.repoDigests.includes(a.ref) || i.repoDigests.includes(b.ref)), 'nothing of the batch was pulled');
    assert.deepEqual((await readPinFile(dropinDir))?.pins, [a.ref, b.ref].sort(), 'the pins are in place');

    const pulled = await runAgentOnce(flags(2), { cli: await bundledCli() });
    assert.equal(pulled.code, 0, pulled.stderr);
    assert.equal(pulled.sets[0]!.phase, 'Ready');
    assert.equal(pulled.sets[0]!.estimatedBytes, undefined);
  });
});
