// A fleet pre-loading over a thin link (test/support/fleet-bed.ts): six
// containerd nodes (1.7.24 and 2.1.9 in turn), each with its agent (the
// bundle) against the in-process API server; the registry reachable only
// across a 16 Mbit/s link that counts its bytes; a real distribution cache
// in front of it, run from deploy/cache/'s configuration, which the nodes
// reach through the hosts.toml `pinset mirror-config` prints.
//
// What a user would see: every node Ready with every image pinned and the
// set's bytes (its blobs' sizes, as the registry gave them) present, the
// bytes the link carried, and how sets roll out: with no limit every node
// goes for the images at once (a cache in front cannot then spare the link
// much: distribution fetches each concurrent miss on its own); with one
// slot the nodes take turns and, after the first, the cache serves them;
// with a first wave one node fetches each image and the others pull it
// from the cache once it holds it, image by image: either way the link
// carries one copy through the cache.
// Measurements of the same bed at benchmark sizes: bench/fleet.ts.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { bundledCli } from '../support/agent-process.ts';
import { requireComponents, type ComponentName } from '../support/components.ts';
import { FleetBed, type ImagePull } from '../support/fleet-bed.ts';
import type { PushedImage } from '../support/images.ts';

const NEEDS: ComponentName[] = ['containerd-1.7', 'containerd-2.1', 'runc', 'docker-registry'];
const NODES = 6;
const IMAGES = 3;
const IMAGE_BYTES = 512 * 1024;

type Blob = { digest: string; size: number };

/** The manifests of pushed images, read back from the upstream registry. */
async function manifestsOf(bed: FleetBed, images: readonly PushedImage[]): Promise<{ config: Blob; layers: Blob[] }[]> {
  const out: { config: Blob; layers: Blob[] }[] = [];
  for (const i of images) {
    const res = await fetch(`${bed.upstream.url}/v2/${i.repo}/manifests/${i.digest}`, { headers: { accept: 'application/vnd.oci.image.manifest.v1+json' } });
    out.push((await res.json()) as { config: Blob; layers: Blob[] });
  }
  return out;
}

/** The layer digests of pushed images. */
async function layersOf(bed: FleetBed, images: readonly PushedImage[]): Promise<Blob[]> {
  return (await manifestsOf(bed, images)).flatMap((m) => m.layers);
}

/** The set's total bytes as the agents count them: the distinct configs and layers its images' manifests name. */
async function blobBytes(bed: FleetBed, images: readonly PushedImage[]): Promise<number> {
  const blobs = new Map((await manifestsOf(bed, images)).flatMap((m) => [m.config, ...m.layers]).map((b) => [b.digest, b.size]));
  return [...blobs.values()].reduce((a, b) => a + b, 0);
}

/** Of `layers`, the GETs across the link that carried each (200s); one copy through distribution 2.8 is one or two (see below). */
function crossings(bed: FleetBed, layers: readonly { digest: string }[]): Map<string, number> {
  return new Map(layers.map((l) => [l.digest, bed.link.blobGets(l.digest).filter((g) => g.status === 200).length]));
}

/** Per node, from its first image started to its last finished. */
function spans(pulls: readonly ImagePull[]): { node: string; from: number; to: number }[] {
  const by = new Map<string, { node: string; from: number; to: number }>();
  for (const p of pulls) {
    const s = by.get(p.node) ?? { node: p.node, from: Infinity, to: -Infinity };
    s.from = Math.min(s.from, p.startedAt);
    s.to = Math.max(s.to, p.finishedAt ?? Infinity);
    by.set(p.node, s);
  }
  return [...by.values()].sort((a, b) => a.from - b.from);
}

describe(`a fleet of ${NODES} containerd nodes behind a 16 Mbit/s link, with a pull-through cache`, () => {
  let bed: FleetBed | undefined;

  before(async () => {
    const cli = await bundledCli();
    if (process.getuid?.() !== 0) return; // each test reports it
    // A short rollout lease keeps the waiting for a slot short, yet long
    // enough that a holder on a loaded machine renews it in time.
    bed = await FleetBed.start({ nodes: NODES, cli, linkBitsPerSecond: 16e6, cache: true, agentFlags: ['--rollout-lease-duration', '5s'] });
  });
  after(async () => {
    await bed?.stop();
  });

  test('a set with no rollout limit: every node goes for the images at once, all end Ready and pinned, and the cache fetched every byte the link carried', async (t) => {
    if (!requireComponents(t, NEEDS) || !bed) return;
    const images = await bed.pushImages('open', IMAGES, IMAGE_BYTES);
    const payload = images.reduce((n, i) => n + i.size, 0);
    bed.link.reset();
    // No blob passes the link until every node has asked: none waits for another.
    bed.link.hold((x) => /\/blobs\//.test(x.path));
    bed.createSet('open', images);
    const asked = await bed.api.waitFor(
      () => {
        const nodes = new Set(bed!.pulls().map((p) => p.node));
        return nodes.size === NODES ? nodes : undefined;
      },
      60_000,
      `every node pulling while the link is held (pulling now: ${[...new Set(bed.pulls().map((p) => p.node))].join(', ')})`,
    );
    assert.equal(asked?.size, NODES);
    assert.deepEqual(bed.api.list('leases'), [], 'a set with no limit takes no rollout slot');
    bed.link.release();

    await bed.waitAllReady('open', IMAGES, 120_000);
    const total = await blobBytes(bed, images);
    for (const n of bed.nodes) {
      for (const i of images) assert.equal((await n.cri.imageStatus(i.ref))?.pinned, true, `${n.name} (containerd ${n.version}): ${i.ref} pinned`);
      assert.deepEqual(bed.setStatus(n.name, 'open')?.bytes, { present: total, total }, `${n.name} (containerd ${n.version}): the set's bytes all present`);
    }

    const transfers = bed.link.transfers;
    assert.ok(transfers.length > 0);
    // The runtimes pulled every blob through the cache.
    const around = transfers.filter((x) => /\/blobs\//.test(x.path) && !x.userAgent.startsWith('Go-http-client/'));
    assert.deepEqual(around.map((x) => `${x.method} ${x.path} ${x.userAgent}`), [], 'every blob across the link was fetched by the cache: no runtime went around it');
    assert.ok(transfers.some((x) => /\/blobs\//.test(x.path)));
    for (const layer of await layersOf(bed, images)) {
      const gets = bed.link.blobGets(layer.digest).filter((g) => g.status === 200);
      assert.ok(gets.length >= 1, `layer ${layer.digest} crossed the link`);
      for (const g of gets) assert.ok(g.bytesDown >= layer.size, `a GET of ${layer.digest} counted ${g.bytesDown} bytes, less than its ${layer.size}`);
    }
    assert.ok(bed.link.egressBytes() >= payload, `the link carried ${bed.link.egressBytes()} bytes, less than the payload (${payload})`);
  });

  test('maxConcurrentNodes 1: the nodes take turns, and after the first the cache serves them: the link carries one copy through the cache', async (t) => {
    if (!requireComponents(t, NEEDS) || !bed) return;
    const images = await bed.pushImages('turns', IMAGES, IMAGE_BYTES);
    bed.link.reset();
    bed.createSet('turns', images, { maxConcurrentNodes: 1 });
    await bed.waitAllReady('turns', IMAGES, 180_000);
    const total = await blobBytes(bed, images);
    for (const n of bed.nodes) {
      for (const i of images) assert.equal((await n.cri.imageStatus(i.ref))?.pinned, true, `${n.name}: ${i.ref} pinned`);
      assert.deepEqual(bed.setStatus(n.name, 'turns')?.bytes, { present: total, total }, `${n.name}: the set's bytes all present, sized once it held the slot`);
    }

    const mine = new Set(images.map((i) => i.ref));
    const turns = spans(bed.pulls().filter((p) => mine.has(p.image)));
    assert.equal(turns.length, NODES, 'every node pulled');
    for (let i = 1; i < turns.length; i++) {
      assert.ok(turns[i]!.from >= turns[i - 1]!.to, `${turns[i]!.node} started before ${turns[i - 1]!.node} was done: ${JSON.stringify(turns)}`);
    }
    // distribution 2.8 fetches a blob it does not hold twice (to store it,
    // and to serve it): one copy through it is at most two GETs a layer.
    for (const [digest, n] of crossings(bed, await layersOf(bed, images))) assert.ok(n >= 1 && n <= 2, `layer ${digest} crossed the link ${n} times, not once or twice`);
    const first = turns[0]!;
    const later = bed.link.transfers.filter((x) => x.method === 'GET' && /\/blobs\//.test(x.path) && x.startedAt > first.to);
    assert.deepEqual(later.map((x) => x.path), [], `after ${first.node}, no blob crossed the link`);
  });

  test('firstWave {nodes: 1}, no limit: one node fetches each image, the others pull it once that node holds it, image by image; the link carries one copy through the cache', async (t) => {
    if (!requireComponents(t, NEEDS) || !bed) return;
    const images = await bed.pushImages('wave', IMAGES, IMAGE_BYTES);
    const payload = images.reduce((n, i) => n + i.size, 0);
    bed.link.reset();
    bed.createSet('wave', images, { firstWave: { nodes: 1 } });
    await bed.waitAllReady('wave', IMAGES, 180_000);
    const total = await blobBytes(bed, images);
    for (const n of bed.nodes) {
      for (const i of images) assert.equal((await n.cri.imageStatus(i.ref))?.pinned, true, `${n.name}: ${i.ref} pinned`);
      assert.deepEqual(bed.setStatus(n.name, 'wave')?.bytes, { present: total, total }, `${n.name}: the set's bytes all present`);
    }

    for (const i of images) {
      const pulls: ImagePull[] = bed.pulls().filter((p) => p.image === i.ref);
      assert.equal(new Set(pulls.map((p) => p.node)).size, NODES, `every node pulled ${i.ref}`);
      // The first wave: the node whose pull ended first. Every other node started after it held the image.
      const first = pulls.reduce((a, b) => ((b.finishedAt ?? Infinity) < (a.finishedAt ?? Infinity) ? b : a));
      const early = pulls.filter((p) => p.node !== first.node && p.startedAt < first.finishedAt!);
      assert.deepEqual(early.map((p) => p.node), [], `${i.ref}: pulled before ${first.node} of the first wave held it`);
    }
    for (const [digest, n] of crossings(bed, await layersOf(bed, images))) assert.ok(n >= 1 && n <= 2, `layer ${digest} crossed the link ${n} times, not once or twice`);
    // Manifests and configs are small; the layers are nearly all of it: one copy through the cache is at most twice the payload.
    assert.ok(bed.link.egressBytes() <= 2 * payload * 1.1, `the link carried ${bed.link.egressBytes()} bytes, more than one copy through the cache (2 x ${payload})`);
    assert.ok(bed.api.list('leases').some((l) => /\.landed$/.test((l as { metadata: { name: string } }).metadata.name)), "the first wave's record is a Lease");
  });
});
