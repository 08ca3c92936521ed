// A real CRI-O pulls through the registries.conf.d drop-in that `pinset
// mirror-config --runtime crio` (the bundle) prints. The registry is
// reachable only across a link that counts every request's bytes and
// User-Agent (test/support/thin-link.ts); a real distribution pull-through
// cache, run from deploy/cache/'s configuration with its access log on, sits
// in front of it. The drop-in goes into the folder CRI-O was started with
// (--registries-conf-dir) and CRI-O is reloaded as its unit is (D-Bus
// ReloadUnit to the systemd stand-in, which sends SIGHUP); the reload is
// taken as applied once CRI-O logs "Applied new registry configuration"
// (Config.ReloadRegistries, pkg/config/reload.go). Pulls are CRI ImageService
// PullImage by digest, as the agent pulls. Run by test/crio/run.ts (`npm
// run test:crio`) after `npm run build`.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, test } from 'node:test';
import { DbusReloader } from '../../src/crio/reload.ts';
import { bundledCli, runPinset } from '../support/agent-process.ts';
import { missingComponents, missingMessage } from '../support/components.ts';
import { CriClient } from '../support/containerd.ts';
import { CACHE_CONFIG, FLEET_REGISTRY } from '../support/fleet-bed.ts';
import { pushRandom, type PushedImage } from '../support/images.ts';
import { realCrioMissing, startRealCrioNode, type RealCrioNode } from '../support/real-crio.ts';
import { Registry } from '../support/registry.ts';
import { ThinLink } from '../support/thin-link.ts';

const BIN = process.env.PINSET_CRIO_BIN;
/** Where the docs say to save the drop-in, under the folder CRI-O reads. */
const DROPIN = '50-pinset-registry-cache.conf';
const LAYER_BYTES = 400_000;

/** A request as the cache's access log or the link records it. */
interface Seen {
  method: string;
  path: string;
  status: number;
  userAgent: string;
}

/** The requests the cache answered so far, from its access log (deploy/cache/config.yml turns it on). */
function cacheAccess(cache: Registry): Seen[] {
  let text: string;
  try {
    text = readFileSync(path.join(cache.dir, 'registry.log'), 'utf8');
  } catch {
    return [];
  }
  const out: Seen[] = [];
  // distribution's access log: the combined log format, the User-Agent last.
  for (const m of text.matchAll(/"(GET|HEAD|POST|PUT|PATCH|DELETE) (\S+) HTTP\/[\d.]+" (\d{3}) \S+ "[^"]*" "([^"]*)"/g)) {
    out.push({ method: m[1]!, path: m[2]!, status: Number(m[3]), userAgent: m[4]! });
  }
  return out;
}

/** What the cache was asked after line `from`, but the readiness probe's GET /v2/ of the test's own helper. */
const cacheAsked = (cache: Registry, from: number): Seen[] => cacheAccess(cache).slice(from).filter((l) => l.path !== '/v2/' || /^cri-o\//i.test(l.userAgent));

/** CRI-O's own requests among the cache's log lines (its User-Agent names it: "cri-o/<version> ..."). */
const byCrio = <T extends Seen>(lines: readonly T[]): T[] => lines.filter((l) => /^cri-o\//i.test(l.userAgent));
/** An image of pushRandom has two blobs: its config and its one layer. */
const BLOBS = 2;
const blobGets = <T extends Seen>(lines: readonly T[], image: PushedImage): T[] =>
  lines.filter((l) => l.method === 'GET' && l.path.startsWith(`/v2/${image.repo}/blobs/`));
/** Whether `lines` hold a 200 GET of `image`'s manifest by digest, and how many of its blobs they got with a 200. */
const servedImage = (lines: readonly Seen[], image: PushedImage) => ({
  manifest: lines.some((l) => l.method === 'GET' && l.path === `/v2/${image.repo}/manifests/${image.digest}` && l.status === 200),
  blobs: new Set(blobGets(lines, image).filter((l) => l.status === 200).map((l) => l.path)).size,
});

/**
 * CRI-O's requests in the cache's access log after line `from`, once they
 * hold the whole of `image` (distribution writes a line as its answer ends,
 * which may be just after CRI-O has read it), or after 5 s those so far.
 */
async function crioAtCache(cache: Registry, from: number, image: PushedImage): Promise<Seen[]> {
  const deadline = Date.now() + 5000;
  for (;;) {
    const lines = byCrio(cacheAccess(cache).slice(from));
    const got = servedImage(lines, image);
    if ((got.manifest && got.blobs === BLOBS) || Date.now() > deadline) return lines;
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Requests one a line, for failure messages. */
const listed = (ts: readonly Seen[]) => ts.map((t) => `${t.method} ${t.path} ${t.status} ${t.userAgent}`).join('\n');

interface Bed {
  upstream: Registry;
  link: ThinLink;
  cache: Registry;
  node: RealCrioNode;
  cri: CriClient;
  reloader: DbusReloader;
  cli: string;
  stop(): Promise<void>;
}

/**
 * The upstream registry behind the link, the cache in front of it, and CRI-O
 * whose registries.conf already maps FLEET_REGISTRY straight across the link
 * (insecure, plain HTTP): the node as it pulls before any mirror.
 */
async function startBed(): Promise<Bed> {
  const cli = await bundledCli();
  const stops: Array<() => Promise<void> | void> = [];
  const stop = async () => {
    while (stops.length) await stops.pop()!();
  };
  try {
    const upstream = await Registry.start();
    stops.push(() => upstream.stop());
    const link = await ThinLink.start({ target: upstream.url, bitsPerSecond: 200e6 });
    stops.push(() => link.stop());
    const cache = await Registry.start({ configFile: CACHE_CONFIG, proxy: { remoteurl: link.url } });
    stops.push(() => cache.stop());
    const node = await startRealCrioNode({ bin: BIN!, registries: { [FLEET_REGISTRY]: link.hostPort } });
    stops.push(() => node.stop());
    const cri = new CriClient(node.endpoint);
    stops.push(() => cri.close());
    const reloader = new DbusReloader({ busAddress: node.bus.address, timeoutMs: 10_000 });
    stops.push(() => reloader.close());
    return { upstream, link, cache, node, cri, reloader, cli, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** How many registry reloads CRI-O has applied, from its log. */
function appliedRegistryReloads(node: RealCrioNode): number {
  const log = readFileSync(node.crio.proc!.logFile, 'utf8');
  return log.match(/Applied new registry configuration/g)?.length ?? 0;
}

/** `systemctl reload crio` (over D-Bus, as the agent does), then waits until CRI-O says it applied the registries. */
async function reloadRegistries(bed: Bed): Promise<void> {
  const before = appliedRegistryReloads(bed.node);
  await bed.reloader.reload();
  const deadline = Date.now() + 10_000;
  while (appliedRegistryReloads(bed.node) <= before) {
    if (Date.now() > deadline) throw new Error(`CRI-O did not apply its registries after a reload:\n${bed.node.crio.log()}`);
    if (/system registries reload failed/.test(bed.node.crio.log())) throw new Error(`CRI-O refused the registries:\n${bed.node.crio.log()}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** `pinset mirror-config --runtime crio ...args` from the bundle; its output, exactly. */
async function mirrorConfig(bed: Bed, args: string[]): Promise<string> {
  const printed = await runPinset(['mirror-config', '--runtime', 'crio', ...args], { cli: bed.cli });
  assert.equal(printed.code, 0, printed.stderr);
  return printed.stdout;
}

/** PullImage by digest; checks CRI-O holds the image that was pushed (its config digest is CRI-O's image ID). */
async function pull(bed: Bed, image: PushedImage): Promise<void> {
  await bed.cri.pullImage(image.ref, { deadlineMs: 60_000 });
  const status = await bed.cri.imageStatus(image.ref);
  assert.equal(status && (status.id.startsWith('sha256:') ? status.id : `sha256:${status.id}`), image.id, `${image.ref} pulled as pushed`);
}

function skipWhy(): string | null {
  const missing = missingComponents(['docker-registry', 'dbus-daemon']);
  return realCrioMissing(BIN) ?? (missing.length ? missingMessage(missing) : null);
}

describe('a real CRI-O pulls through the drop-in `pinset mirror-config --runtime crio` prints', () => {
  test('the cache first; with the cache stopped, the registry itself; without the drop-in, never the cache', async (t) => {
    const why = skipWhy();
    if (why) return t.skip(why);
    const bed = await startBed();
    try {
      const { link, cache, node } = bed;

      // Before the drop-in: CRI-O goes across the link itself, the cache sees nothing.
      const before = await pushRandom(bed.upstream, 'mirror/before', LAYER_BYTES, { host: FLEET_REGISTRY });
      await pull(bed, before);
      const crioUserAgent = byCrio(link.transfers)[0]?.userAgent;
      assert.ok(crioUserAgent, `CRI-O's own requests cross the link, named by their User-Agent:\n${listed(link.transfers)}`);
      assert.equal(blobGets(byCrio(link.transfers), before).length, BLOBS, 'CRI-O fetched the config and the layer itself');
      assert.deepEqual(cacheAsked(cache, 0), [], 'the cache saw no request');

      // The drop-in, as printed, in the folder CRI-O reads; then a reload. Its
      // [[registry]] for FLEET_REGISTRY replaces registries.conf's (the same prefix).
      const dropin = await mirrorConfig(bed, ['--server', link.url, `${FLEET_REGISTRY}=${cache.url}`]);
      assert.ok(dropin.includes(`location = "${cache.host}"`), `the drop-in names the cache:\n${dropin}`);
      await writeFile(path.join(node.crio.registriesConfDir, DROPIN), dropin);
      await reloadRegistries(bed);

      // Through the cache: every request on the link is the cache's, and CRI-O asked the cache for the manifest by digest and the blobs.
      link.reset();
      const accessBefore = cacheAccess(cache).length;
      const a = await pushRandom(bed.upstream, 'mirror/a', LAYER_BYTES, { host: FLEET_REGISTRY });
      await pull(bed, a);
      assert.deepEqual(byCrio(link.transfers), [], `CRI-O itself never reached the registry:\n${listed(link.transfers)}`);
      assert.equal(servedImage(link.transfers, a).blobs, BLOBS, `the cache fetched the config and the layer across the link:\n${listed(link.transfers)}`);
      assert.ok(link.egressBytes() >= LAYER_BYTES, `the layer crossed the link (${link.egressBytes()} bytes)`);
      const served = await crioAtCache(cache, accessBefore, a);
      assert.deepEqual(servedImage(served, a), { manifest: true, blobs: BLOBS }, `CRI-O got the manifest by digest, the config and the layer from the cache:\n${listed(served)}`);
      assert.equal(served[0]!.userAgent, crioUserAgent, 'the same CRI-O that pulled across the link before');

      // The cache stopped: containers/image moves on to the registry's own location, the pull succeeds.
      await cache.pause();
      link.reset();
      const b = await pushRandom(bed.upstream, 'mirror/b', LAYER_BYTES, { host: FLEET_REGISTRY });
      await pull(bed, b);
      assert.equal(blobGets(byCrio(link.transfers), b).filter((x) => x.status === 200).length, BLOBS, `with the cache down, CRI-O fetched the config and the layer across the link:\n${listed(link.transfers)}`);
      assert.deepEqual(link.transfers.filter((x) => x.userAgent !== crioUserAgent), [], 'nobody else crossed the link');

      // The drop-in removed and CRI-O reloaded, the cache up again: the cache sees nothing of the next pull.
      await cache.resume();
      await rm(path.join(node.crio.registriesConfDir, DROPIN));
      await reloadRegistries(bed);
      link.reset();
      const accessAfter = cacheAccess(cache).length;
      const c = await pushRandom(bed.upstream, 'mirror/c', LAYER_BYTES, { host: FLEET_REGISTRY });
      await pull(bed, c);
      assert.deepEqual(cacheAsked(cache, accessAfter), [], 'without the drop-in the cache saw no request');
      assert.equal(blobGets(byCrio(link.transfers), c).length, BLOBS, 'CRI-O fetched the config and the layer across the link itself');
    } finally {
      await bed.stop();
    }
  });

  test('registries named with a port and without, in one drop-in, reachable only through the cache', async (t) => {
    const why = skipWhy();
    if (why) return t.skip(why);
    const bed = await startBed();
    try {
      const { link, cache, node } = bed;
      // Neither name resolves: without the cache, neither image can be pulled at all.
      const withPort = 'registry.invalid:5000';
      const plain = 'other.invalid';
      const dropin = await mirrorConfig(bed, [`${withPort}=${cache.url}`, `${plain}=${cache.url}`]);
      await writeFile(path.join(node.crio.registriesConfDir, DROPIN), dropin);
      await reloadRegistries(bed);

      const p = await pushRandom(bed.upstream, 'mirror/port', LAYER_BYTES, { host: withPort });
      const q = await pushRandom(bed.upstream, 'mirror/plain', LAYER_BYTES, { host: plain });
      // The registry itself (the base registries.conf's entry, not in the drop-in) is untouched by the prefixes.
      const r = await pushRandom(bed.upstream, 'mirror/untouched', LAYER_BYTES, { host: FLEET_REGISTRY });
      const accessBefore = cacheAccess(cache).length;
      for (const image of [p, q]) {
        link.reset();
        await pull(bed, image);
        assert.deepEqual(byCrio(link.transfers), [], `${image.ref}: CRI-O itself never reached the registry`);
        assert.equal(servedImage(link.transfers, image).blobs, BLOBS, `${image.ref}: the cache fetched the config and the layer across the link`);
      }
      for (const image of [p, q]) {
        const served = await crioAtCache(cache, accessBefore, image);
        assert.deepEqual(servedImage(served, image), { manifest: true, blobs: BLOBS }, `${image.ref}: CRI-O got it from the cache:\n${listed(served)}`);
      }

      link.reset();
      const accessMid = cacheAccess(cache).length;
      await pull(bed, r);
      assert.equal(blobGets(byCrio(link.transfers), r).length, BLOBS, `${r.ref}: CRI-O went to its own location, across the link`);
      assert.deepEqual(cacheAsked(cache, accessMid), [], `${r.ref}: not through the cache`);
    } finally {
      await bed.stop();
    }
  });
});
