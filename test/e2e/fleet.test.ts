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
// carries one copy through the cache, and with Debian's distribution 2.8
// once more for each request that comes before the cache has stored what
// the first node got (BlobCrossings in test/support/fleet-bed.ts).
// Measurements of the same bed at benchmark sizes: bench/fleet.ts.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { bundledCli } from '../support/agent-process.ts';
import { requireComponents, type ComponentName } from '../support/components.ts';
import { FleetBed, type FleetBlob, type ImagePull } from '../support/fleet-bed.ts';
import type { PushedImage } from '../support/images.ts';

const NEEDS: ComponentName[] = ['containerd-1.7', 'containerd-2.1', 'runc', 'docker-registry'];
const NODES = 6;
const IMAGES = 3;
const IMAGE_BYTES = 512 * 1024;

/** The layers of pushed images. */
async function layersOf(bed: FleetBed, images: readonly PushedImage[]): Promise<FleetBlob[]> {
  return (await bed.manifests(images)).flatMap((m) => m.layers);
}

/** The set's total bytes as the agents count them: the distinct configs and layers its images' manifests name. */
async function blobBytes(bed: FleetBed, images: readonly PushedImage[]): Promise<number> {
  const blobs = new Map((await bed.manifests(images)).flatMap((m) => [m.config, ...m.layers]).map((b) => [b.digest, b.size]));
  return [...blobs.values()].reduce((a, b) => a + b, 0);
}

/**
 * The link carried one copy through the cache, and every other crossing is
 * explained (BlobCrossings, test/support/fleet-bed.ts): per blob of the
 * images, the cache stored it; at most two GETs (one copy through
 * distribution 2.8) began before the first node held the image; and each
 * GET that began later served a request that came before the cache had
 * stored the blob: at most one copy through the cache (two GETs) per other
 * node that started before the cache stored it. So a node that starts before the first one holds
 * the image, a cache that does not store, or a copy after the cache stored
 * the blob, each fails. Resolves to the bytes of those later GETs.
 */
async function assertOneCopyThroughTheCache(bed: FleetBed, images: readonly PushedImage[]): Promise<number> {
  let inFlightBytes = 0;
  for (const c of await bed.blobCrossings(images)) {
    const at = (ms: number) => `${Math.round(ms - c.wave.heldAt)} ms`;
    const starts = bed.pulls().filter((p) => p.image === c.image && p.node !== c.wave.node).map((p) => `${p.node} ${at(p.startedAt)}`);
    const story = `${c.image}, blob ${c.blob.digest}: ${c.wave.node} held the image at 0 ms; the cache stored the blob ${c.storedAt === undefined ? 'never' : `at ${at(c.storedAt)}`}; GETs across the link ${c.gets.map((g) => `${at(g.startedAt)}..${g.endedAt === undefined ? '' : at(g.endedAt)} (${g.userAgent})`).join(', ')}; the other nodes started at ${starts.join(', ')}`;
    assert.ok(c.storedAt !== undefined, `the cache never stored it: ${story}`);
    assert.ok(c.waveGets.length >= 1 && c.waveGets.length <= 2, `it crossed the link ${c.waveGets.length} times before ${c.wave.node} held the image, not once or twice: ${story}`);
    assert.ok(
      c.laterGets.length <= 2 * c.startedInFlight.length,
      `it crossed the link ${c.laterGets.length} more times once ${c.wave.node} held the image, more than one copy through the cache for each of the ${c.startedInFlight.length} other nodes that started before the cache stored it: ${story}`,
    );
    inFlightBytes += c.laterGets.reduce((n, g) => n + g.bytesDown, 0);
  }
  return inFlightBytes;
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
    // After the first node, the cache served the others: no blob crossed
    // the link again but for requests that came before the cache had
    // stored it (distribution 2.8's in-flight window).
    await assertOneCopyThroughTheCache(bed, images);
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
    // The first-wave node fetched one image at a time, in the set's order: each began once the one before had landed.
    const firstPulls = bed.pulls().filter((p) => p.image === images[0]!.ref);
    const waveNode = firstPulls.reduce((a, b) => ((b.finishedAt ?? Infinity) < (a.finishedAt ?? Infinity) ? b : a)).node;
    const fetched = images.map((i) => bed!.pulls().find((p) => p.node === waveNode && p.image === i.ref)!);
    for (let k = 1; k < fetched.length; k++) {
      assert.ok(fetched[k]!.startedAt >= fetched[k - 1]!.finishedAt!, `${waveNode} began ${images[k]!.ref} before ${images[k - 1]!.ref} landed: ${JSON.stringify(fetched)}`);
    }
    const inFlightBytes = await assertOneCopyThroughTheCache(bed, images);
    // Manifests are small; the blobs are nearly all of it: one copy through
    // the cache is at most twice the payload, and the requests that came
    // while a blob was in flight at the cache carried what they carried.
    const bound = 2 * payload * 1.1 + inFlightBytes;
    assert.ok(bed.link.egressBytes() <= bound, `the link carried ${bed.link.egressBytes()} bytes, more than one copy through the cache (2 x ${payload}) and the ${inFlightBytes} bytes of GETs while a blob was in flight`);
    assert.ok(bed.api.list('leases').some((l) => /\.landed$/.test((l as { metadata: { name: string } }).metadata.name)), "the first wave's record is a Lease");
  });
});
