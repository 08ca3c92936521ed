// The disk estimate with real components: the registry-backed size
// estimator against a real registry (and its in-memory twin held to the
// same answers), and `pinset agent --once` on containerd refusing a batch
// whose estimate does not fit below the watermark, then pulling it when it
// does. There containerd answers through a CRI proxy under another name, so
// the agent reads registries.conf, as it does on any runtime but containerd
// (containerd's own registry hosts: test/e2e/containerd-hosts.test.ts).
// Last, the sizes it reads as each set's bytes on the node: agents on
// containerd 1.7 and 2.1 pulling across a thin link report the registry's
// total, and bytes present growing while the pull is slow (containerd's
// ingests, not only whole images landing).
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
import { MAX_PARALLEL_REQUESTS, RegistrySizeEstimator } from '../../src/registry/size-estimator.ts';
import { RegistryClient } from '../../src/registry/client.ts';
import { parseRegistriesConf, RegistriesConf } from '../../src/registry/registries-conf.ts';
import { bundledCli, readPinFile, runAgentOnce } from '../support/agent-process.ts';
import { missingComponents, requireComponents, type ComponentName } from '../support/components.ts';
import { Containerd, CriClient } from '../support/containerd.ts';
import { CriProxy } from '../support/cri-proxy.ts';
import { MEDIA_TYPES, nodePlatform, pushMultiArch, pushRandom, unknownRef, type PushedImage } from '../support/images.ts';
import { Registry } from '../support/registry.ts';
import { FleetBed } from '../support/fleet-bed.ts';

const NEEDS: ComponentName[] = ['containerd', 'runc', 'docker-registry'];

async function blobSizes(reg: Registry, repo: string, digest: string): Promise<Map<string, number>> {
  const res = await fetch(`${reg.url}/v2/${repo}/manifests/${digest}`, { headers: { accept: MEDIA_TYPES.manifest } });
  const doc = (await res.json()) as { config: { digest: string; size: number }; layers: { digest: string; size: number }[] };
  return new Map([doc.config, ...doc.layers].map((d) => [d.digest, d.size]));
}

/** A loopback "registry" (down.test) that answers 503 to everything, and a client that tries each request twice. */
async function downRegistry(): Promise<{ client: RegistryClient; calls: () => number; close: () => Promise<void> }> {
  let calls = 0;
  const srv = http.createServer((_req, res) => {
    calls++;
    res.writeHead(503).end();
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const host = `127.0.0.1:${(srv.address() as AddressInfo).port}`;
  const registries = new RegistriesConf(parseRegistriesConf(`[[registry]]\nprefix = "down.test"\nlocation = "${host}"\ninsecure = true\n`, 't.conf'));
  const client = new RegistryClient({ registries, attempts: 2, retryPolicy: { baseMs: 5, capMs: 10 } });
  return {
    client,
    calls: () => calls,
    close: async () => {
      await client.close();
      srv.closeAllConnections();
      await new Promise<void>((r) => srv.close(() => r()));
    },
  };
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
    const down = await downRegistry();
    const client = down.client;
    let now = 1_000_000;
    const est = new RegistrySizeEstimator(client, { now: () => now });
    const ref = (c: string) => `down.test/x/y@sha256:${createHash('sha256').update(c).digest('hex')}`;
    try {
      const first = await est.sizes([ref('a')]);
      assert.match((first.get(ref('a')) as { unknown: string }).unknown, /HTTP 503/);
      const asked = down.calls();
      const second = await est.sizes([ref('b'), ref('c')]);
      assert.equal(down.calls(), asked, 'no request while the registry is remembered as down');
      assert.match((second.get(ref('c')) as { unknown: string }).unknown, /HTTP 503/);
      now += 61_000;
      await est.sizes([ref('d')]);
      assert.ok(down.calls() > asked, 'asked again after a minute');
    } finally {
      await down.close();
    }
  });
});

/**
 * A loopback "registry" that serves `count` image manifests by digest, counting requests in flight.
 * It holds every answer until no new request has come for `quietMs`, then answers all it holds: each
 * wave of requests the client sends before it waits is counted whole, however slow the machine.
 */
async function manifestServer(count: number, quietMs: number): Promise<{ refs: string[]; sizes: Map<string, Map<string, number>>; stats: { calls: number; inFlight: number; maxInFlight: number; firstAlone: boolean }; registries: RegistriesConf; close: () => Promise<void> }> {
  const bodies = new Map<string, Buffer>();
  const sizes = new Map<string, Map<string, number>>();
  const refs: string[] = [];
  const sha = (b: Buffer | string) => `sha256:${createHash('sha256').update(b).digest('hex')}`;
  for (let i = 0; i < count; i++) {
    const config = { mediaType: 'application/vnd.oci.image.config.v1+json', digest: sha(`config ${i}`), size: 500 + i };
    const layer = { mediaType: 'application/vnd.oci.image.layer.v1.tar+gzip', digest: sha(`layer ${i}`), size: 1_000_000 + i };
    const body = Buffer.from(JSON.stringify({ schemaVersion: 2, mediaType: MEDIA_TYPES.manifest, config, layers: [layer] }));
    bodies.set(sha(body), body);
    refs.push(`many.test/est/app${i}@${sha(body)}`);
    sizes.set(refs.at(-1)!, new Map([[config.digest, config.size], [layer.digest, layer.size]]));
  }
  const stats = { calls: 0, inFlight: 0, maxInFlight: 0, firstAlone: true };
  let held: (() => void)[] = [];
  let quiet: NodeJS.Timeout | undefined;
  const srv = http.createServer((req, res) => {
    stats.calls++;
    stats.inFlight++;
    stats.maxInFlight = Math.max(stats.maxInFlight, stats.inFlight);
    if (stats.calls === 2 && stats.inFlight > 1) stats.firstAlone = false;
    held.push(() => {
      stats.inFlight--;
      const body = bodies.get(req.url!.slice(req.url!.lastIndexOf('/') + 1));
      if (!body) res.writeHead(404).end();
      else res.writeHead(200, { 'content-type': MEDIA_TYPES.manifest, 'content-length': String(body.length) }).end(body);
    });
    clearTimeout(quiet);
    quiet = setTimeout(() => {
      const answers = held;
      held = [];
      for (const answer of answers) answer();
    }, quietMs);
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const host = `127.0.0.1:${(srv.address() as AddressInfo).port}`;
  const registries = new RegistriesConf(parseRegistriesConf(`[[registry]]\nprefix = "many.test"\nlocation = "${host}"\ninsecure = true\n`, 't.conf'));
  return {
    refs,
    sizes,
    stats,
    registries,
    close: async () => {
      clearTimeout(quiet);
      srv.closeAllConnections();
      await new Promise<void>((r) => srv.close(() => r()));
    },
  };
}

describe('size estimates ask for a batch at once', () => {
  test('a registry not heard from yet is asked for one image first, then for the rest of the batch at once; a registry that answered, for all of it at once', async () => {
    const reg = await manifestServer(30, 200);
    const client = new RegistryClient({ registries: reg.registries, cacheEntries: 0 });
    const est = new RegistrySizeEstimator(client);
    try {
      const sizes = await est.sizes(reg.refs.slice(0, 20));
      for (const ref of reg.refs.slice(0, 20)) assert.deepEqual((sizes.get(ref) as { blobs: Map<string, number> }).blobs, reg.sizes.get(ref));
      assert.deepEqual([...sizes.keys()], reg.refs.slice(0, 20), 'answers in the order asked');
      assert.ok(reg.stats.firstAlone, 'the first request went alone');
      assert.equal(reg.stats.maxInFlight, 19, 'then the other 19 at once');
      reg.stats.maxInFlight = 0;
      await est.sizes(reg.refs.slice(20));
      assert.equal(reg.stats.maxInFlight, 10, 'the registry answered before: all 10 at once');
      assert.equal(reg.stats.calls, 30, 'one request per image');
    } finally {
      await client.close();
      await reg.close();
    }
  });

  test('an estimate started earlier is joined, not repeated; one cut short by its caller\'s signal is asked again', async () => {
    const reg = await manifestServer(12, 200);
    const client = new RegistryClient({ registries: reg.registries, cacheEntries: 0 });
    const est = new RegistrySizeEstimator(client);
    try {
      await est.sizes(reg.refs.slice(0, 1));
      // Started early (as while the pin file is written), then asked for again with a part of it.
      const early = est.sizes(reg.refs.slice(1, 8));
      const later = await est.sizes(reg.refs.slice(4, 8));
      await early;
      assert.equal(reg.stats.calls, 8, 'one request per image');
      for (const ref of reg.refs.slice(4, 8)) assert.deepEqual((later.get(ref) as { blobs: Map<string, number> }).blobs, reg.sizes.get(ref));
      // The first caller gives up (a cancelled reconcile): the next one gets sizes, not "ran out of time".
      const cancel = new AbortController();
      const doomed = est.sizes(reg.refs.slice(8), cancel.signal);
      const next = est.sizes(reg.refs.slice(8));
      cancel.abort(new Error('superseded'));
      await assert.rejects(doomed, /superseded/);
      const sizes = await next;
      for (const ref of reg.refs.slice(8)) assert.deepEqual((sizes.get(ref) as { blobs: Map<string, number> }).blobs, reg.sizes.get(ref));
    } finally {
      await client.close();
      await reg.close();
    }
  });

  test('at most MAX_PARALLEL_REQUESTS requests at once', async () => {
    const reg = await manifestServer(MAX_PARALLEL_REQUESTS + 36, 200);
    const client = new RegistryClient({ registries: reg.registries, cacheEntries: 0 });
    const est = new RegistrySizeEstimator(client);
    try {
      await est.sizes(reg.refs.slice(0, 1));
      const sizes = await est.sizes(reg.refs.slice(1));
      assert.ok([...sizes.values()].every((s) => 'blobs' in s));
      assert.equal(reg.stats.maxInFlight, MAX_PARALLEL_REQUESTS);
    } finally {
      await client.close();
      await reg.close();
    }
  });

  test('a registry that is down costs one image\'s requests, not one per image', async () => {
    const down = await downRegistry();
    const client = down.client;
    const est = new RegistrySizeEstimator(client);
    const ref = (c: string) => `down.test/x/y@sha256:${createHash('sha256').update(c).digest('hex')}`;
    try {
      const refs = ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j'].map(ref);
      const sizes = await est.sizes(refs);
      assert.equal(down.calls(), 2, 'one image, two attempts');
      for (const r of refs) assert.match((sizes.get(r) as { unknown: string }).unknown, /HTTP 503/);
    } finally {
      await down.close();
    }
  });
});

describe('pinset agent --once: the disk estimate before pulling, on containerd', () => {
  let registry: Registry;
  let containerd: Containerd;
  let proxy: CriProxy;
  let cri: CriClient;
  let work: string;
  let ready = false;

  before(async () => {
    if (missingComponents(NEEDS).length > 0 || process.getuid?.() !== 0) return;
    registry = await Registry.start();
    containerd = await Containerd.start({ mirrors: { 'registry.test': registry.url } });
    proxy = await CriProxy.start(containerd.endpoint);
    // Not containerd (and not CRI-O either, which would be expected to report the pins it holds).
    proxy.runtimeName = 'pinset-test-runtime';
    cri = new CriClient(containerd.endpoint);
    work = await mkdtemp(path.join(os.tmpdir(), 'pinset-e2e-estimate-'));
    ready = true;
  });

  after(async () => {
    cri?.close();
    await proxy?.stop();
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
      '--node-name', 'estimate-node', '--static-dir', staticDir, '--cri-endpoint', proxy.endpoint, '--crio-dropin-dir', dropinDir,
      '--state-dir', path.join(work, 'state'), '--reload', 'none', '--pin-backend', 'crio', '--auth-file', path.join(work, 'none.json'), '--metrics-addr', '', '--image-fs-high-watermark', '99',
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

describe("each set's bytes on the node, on containerd 1.7 and 2.1 across a thin link", () => {
  const needs: ComponentName[] = ['containerd-1.7', 'containerd-2.1', 'runc', 'docker-registry'];
  let bed: FleetBed | undefined;

  before(async () => {
    if (missingComponents(needs).length > 0 || process.getuid?.() !== 0) return;
    // Progress written 1 s after the last write, then up to 5 s apart: a rollout shrunk in time.
    bed = await FleetBed.start({ nodes: 2, cli: await bundledCli(), linkBitsPerSecond: 8e6, cache: false, agentFlags: ['--status-progress-interval', '1s'] });
  });
  after(async () => {
    await bed?.stop();
  });

  test("the total is the registry's blob sizes; present grows while the pull is slow, never back, to the total when Ready", async (t) => {
    if (!requireComponents(t, needs) || !bed) return;
    // One 6 MB layer per node across an 8 Mbit/s link both share: about 12 s, so several reports fall inside the pull.
    const [img] = await bed.pushImages('bytes', 1, 6_000_000);
    const total = [...(await blobSizes(bed.upstream, img!.repo, img!.digest)).values()].reduce((a, b) => a + b, 0);
    const seen = new Map(bed.nodes.map((n) => [n.name, [] as { present: number; total: number; rate?: number; reason: string }[]]));
    bed.createSet('bytes', [img!]);
    const sample = () => {
      for (const n of bed!.nodes) {
        const s = bed!.setStatus(n.name, 'bytes');
        const last = seen.get(n.name)!.at(-1);
        if (s?.bytes && (s.bytes.present !== last?.present || s.reason !== last?.reason)) seen.get(n.name)!.push({ ...s.bytes, ...(s.rate !== undefined ? { rate: s.rate } : {}), reason: s.reason });
      }
    };
    const sampling = setInterval(sample, 50);
    try {
      await bed.waitAllReady('bytes', 1, 120_000);
    } finally {
      clearInterval(sampling);
    }
    sample();
    for (const n of bed.nodes) {
      const s = seen.get(n.name)!;
      const said = `${n.name} (containerd ${n.version}): ${JSON.stringify(s)}`;
      assert.ok(s.length > 0, said);
      for (const b of s) assert.equal(b.total, total, `the registry's blobs, config and layer: ${said}`);
      const present = s.map((b) => b.present);
      assert.deepEqual(present, [...present].sort((a, b) => a - b), `never back: ${said}`);
      const midway = s.filter((b) => b.present > 0 && b.present < total);
      assert.ok(midway.length > 0, `bytes of the layer counted while it arrives: ${said}`);
      assert.ok(midway.some((b) => (b.rate ?? 0) > 0), `with a rate: ${said}`);
      assert.deepEqual([s.at(-1)!.present, s.at(-1)!.reason], [total, 'AllImagesPinned'], said);
    }
  });
});
