// The thin link of the fleet bed (test/support/thin-link.ts) against a real
// registry (distribution): it counts the bytes each request put on the wire
// in both directions, it holds the rate it is given (bounds from below
// only: a loaded machine can only make it slower), concurrent transfers
// share that rate, and hold() stops the transfers it picks until release().
// And distribution's pull-through cache, run from deploy/cache/'s own
// configuration behind the link, as the facts say it behaves
// (shared/facts/registry-caches.md): a blob it does not hold crosses the
// link, one it holds does not.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import http from 'node:http';
import { after, before, describe, test } from 'node:test';
import { requireComponents } from '../support/components.ts';
import { CACHE_CONFIG, cacheStoredAt } from '../support/fleet-bed.ts';
import { pushRandom, sha256, type PushedImage } from '../support/images.ts';
import { Registry } from '../support/registry.ts';
import { TokenServer } from '../support/token-server.ts';
import { ThinLink, type LinkTransfer } from '../support/thin-link.ts';

/** A GET on a connection of its own; resolves with the status, the body's length and the bytes read off the socket. */
function get(url: string, headers: Record<string, string> = {}): Promise<{ status: number; body: number; wire: number; ms: number }> {
  const started = performance.now();
  return new Promise((resolve, reject) => {
    const req = http.get(url, { agent: false, headers }, (res) => {
      let body = 0;
      res.on('data', (c: Buffer) => (body += c.length));
      res.on('end', () => {
        const wire = req.socket?.bytesRead ?? 0;
        resolve({ status: res.statusCode ?? 0, body, wire, ms: performance.now() - started });
      });
    });
    req.on('error', reject);
  });
}

/** The layer digest of a one-layer image pushed with pushRandom. */
async function layerOf(registry: Registry, image: PushedImage): Promise<string> {
  const res = await fetch(`${registry.url}/v2/${image.repo}/manifests/${image.digest}`, { headers: { accept: 'application/vnd.oci.image.manifest.v1+json' } });
  return ((await res.json()) as { layers: { digest: string }[] }).layers[0]!.digest;
}

describe('the thin link in front of a registry', () => {
  let registry: Registry | undefined;
  let image: PushedImage;
  let layer: string;
  const MB = 1_000_000;

  before(async () => {
    try {
      registry = await Registry.start();
    } catch {
      return; // each test reports the missing registry
    }
    image = await pushRandom(registry, 'link/one', MB);
    layer = await layerOf(registry, image);
  });
  after(async () => {
    await registry?.stop();
  });

  test('counts every byte of a request on the wire, both ways, and holds its rate', async (t) => {
    if (!requireComponents(t, ['docker-registry']) || !registry) return;
    const link = await ThinLink.start({ target: registry.url, bitsPerSecond: 4e6 });
    try {
      const r = await get(`${link.url}/v2/${image.repo}/blobs/${layer}`, { 'user-agent': 'thin-link-test' });
      assert.equal(r.status, 200);
      assert.ok(r.body >= MB);
      const [x] = link.blobGets(layer);
      assert.equal(x!.userAgent, 'thin-link-test');
      assert.equal(x!.status, 200);
      // Down: the registry's status line, headers and the whole body.
      assert.ok(x!.bytesDown >= r.body && x!.bytesDown - r.body < 2048, `counted ${x!.bytesDown} for a body of ${r.body}`);
      // Up: the request line and headers (a GET has no body).
      assert.ok(x!.bytesUp > 50 && x!.bytesUp < 2048, `counted ${x!.bytesUp} bytes up`);
      assert.equal(link.egressBytes(), x!.bytesDown);
      // 1 MB at 4 Mbit/s (500 kB/s), less what an idle link lends (64 KiB): at least 1.8 s.
      assert.ok(r.ms >= 1800, `1 MB crossed a 4 Mbit/s link in ${Math.round(r.ms)} ms`);
    } finally {
      await link.stop();
    }
  });

  test('an upload is counted towards the registry', async (t) => {
    if (!requireComponents(t, ['docker-registry']) || !registry) return;
    const link = await ThinLink.start({ target: registry.url, bitsPerSecond: 80e6 });
    try {
      const data = randomBytes(300_000);
      const start = await fetch(`${link.url}/v2/link/up/blobs/uploads/`, { method: 'POST' });
      assert.equal(start.status, 202);
      const location = new URL(start.headers.get('location')!, link.url);
      location.searchParams.set('digest', sha256(data));
      const put = await fetch(new URL(location.pathname + location.search, link.url), { method: 'PUT', body: data, headers: { 'content-type': 'application/octet-stream' } });
      assert.equal(put.status, 201);
      const x = link.transfers.find((y) => y.method === 'PUT')!;
      assert.ok(x.bytesUp >= data.length && x.bytesUp - data.length < 4096, `counted ${x.bytesUp} bytes up for ${data.length}`);
      assert.ok(link.ingressBytes() >= data.length);
    } finally {
      await link.stop();
    }
  });

  test('concurrent transfers share the rate', async (t) => {
    if (!requireComponents(t, ['docker-registry']) || !registry) return;
    const link = await ThinLink.start({ target: registry.url, bitsPerSecond: 8e6 });
    try {
      const started = performance.now();
      const rs = await Promise.all([1, 2, 3].map(() => get(`${link.url}/v2/${image.repo}/blobs/${layer}`)));
      const ms = performance.now() - started;
      for (const r of rs) assert.equal(r.status, 200);
      // 3 MB at 1 MB/s: at least 2.8 s, whichever way they interleave.
      assert.ok(ms >= 2800, `3 x 1 MB crossed an 8 Mbit/s link in ${Math.round(ms)} ms`);
      assert.ok(link.egressBytes() >= 3 * MB);
    } finally {
      await link.stop();
    }
  });

  test('hold() stops the transfers it picks until release(); the others pass', async (t) => {
    if (!requireComponents(t, ['docker-registry']) || !registry) return;
    const link = await ThinLink.start({ target: registry.url, bitsPerSecond: 80e6 });
    try {
      link.hold((x) => x.path.includes('/blobs/'));
      let done = false;
      const blob = get(`${link.url}/v2/${image.repo}/blobs/${layer}`).then((r) => ((done = true), r));
      const manifest = await get(`${link.url}/v2/${image.repo}/manifests/${image.digest}`, { accept: 'application/vnd.oci.image.manifest.v1+json' });
      assert.equal(manifest.status, 200, 'a manifest passes');
      await new Promise((r) => setTimeout(r, 700));
      assert.equal(done, false, 'the blob waits');
      link.release();
      const r = await blob;
      assert.equal(r.status, 200);
      assert.ok(r.body >= MB);
    } finally {
      await link.stop();
    }
  });
});

describe('distribution as a pull-through cache (deploy/cache/config.yml) behind the link', () => {
  test('a blob it does not hold crosses the link, fetched by the cache; once stored, it crosses no more', async (t) => {
    if (!requireComponents(t, ['docker-registry'])) return;
    const upstream = await Registry.start();
    const link = await ThinLink.start({ target: upstream.url, bitsPerSecond: 80e6 });
    const cache = await Registry.start({ configFile: CACHE_CONFIG, proxy: { remoteurl: link.url } });
    try {
      const image = await pushRandom(upstream, 'cached/one', 400_000);
      const layer = await layerOf(upstream, image);
      const first = await get(`${cache.url}/v2/${image.repo}/blobs/${layer}`);
      assert.equal(first.status, 200);
      const fetched = link.blobGets(layer).filter((x) => x.status === 200);
      assert.ok(fetched.length >= 1, 'the cache fetched the blob across the link');
      for (const x of fetched) assert.match(x.userAgent, /^Go-http-client\//, "the cache's own client");
      // distribution 2.8 stores its copy in the background: wait until a GET of it crosses nothing.
      const deadline = Date.now() + 10_000;
      for (;;) {
        link.reset();
        const again = await get(`${cache.url}/v2/${image.repo}/blobs/${layer}`);
        assert.equal(again.status, 200);
        if (link.blobGets(layer).length === 0) break;
        assert.ok(Date.now() < deadline, 'the cache still fetches the blob across the link after 10 s');
        await new Promise((r) => setTimeout(r, 200));
      }
      assert.equal(link.egressBytes() < 10_000, true, `a stored blob cost ${link.egressBytes()} bytes across the link`);
    } finally {
      await cache.stop();
      await link.stop();
      await upstream.stop();
    }
  });

  // registry/proxy/proxyblobstore.go (release/2.8): ServeBlob marks a blob
  // it misses in flight, stores it from a copy of its own in the background
  // (storeLocal) and serves the client from another (copyContent); until
  // the storing copy is committed, every request for the blob is served
  // from one more copy. What the fleet test counts on (BlobCrossings in
  // test/support/fleet-bed.ts): that window outlasts the first client's
  // copy when the storing copy is slower, and cacheStoredAt() says when it
  // closed. The link holds one of the cache's two copies, each in turn,
  // until the held one is the storing copy.
  test('distribution 2.8 keeps a blob in flight until its storing copy is committed: a request the first client\'s copy outran crosses the link again; after cacheStoredAt() none does', async (t) => {
    if (!requireComponents(t, ['docker-registry'])) return;
    const upstream = await Registry.start();
    const link = await ThinLink.start({ target: upstream.url, bitsPerSecond: 80e6 });
    const cache = await Registry.start({ configFile: CACHE_CONFIG, proxy: { remoteurl: link.url } });
    const storedAt = async (repo: string, layer: string, timeoutMs: number): Promise<number | undefined> => {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const at = await cacheStoredAt(cache, repo, layer);
        if (at !== undefined || Date.now() > deadline) return at;
        await new Promise((r) => setTimeout(r, 20));
      }
    };
    try {
      let outran = false;
      for (let attempt = 0; attempt < 6 && !outran; attempt++) {
        const image = await pushRandom(upstream, `inflight/try-${attempt}`, 400_000);
        const layer = await layerOf(upstream, image);
        const url = `${cache.url}/v2/${image.repo}/blobs/${layer}`;
        link.reset();
        const gets = () => link.blobGets(layer);
        link.hold((x) => x.method === 'GET' && x.path.includes(`/blobs/${layer}`));
        const first = get(url);
        for (const deadline = Date.now() + 10_000; gets().length < 2; await new Promise((r) => setTimeout(r, 10))) {
          assert.ok(Date.now() < deadline, `the cache made ${gets().length} GETs of a blob it missed, not two`);
        }
        const held: LinkTransfer = gets()[attempt % 2]!;
        link.hold((x) => x === held);
        // Either the client gets its copy (the held one is the storing copy), or the blob is stored first.
        const outcome = await Promise.race([first.then(() => 'served' as const), storedAt(image.repo, layer, 10_000).then(() => 'stored' as const)]);
        if (outcome === 'served') {
          outran = true;
          assert.equal((await first).status, 200);
          assert.equal(await cacheStoredAt(cache, image.repo, layer), undefined, 'stored while its storing copy was held');
          const second = await get(url);
          assert.equal(second.status, 200);
          assert.equal(gets().length, 3, 'a request while the blob was in flight is served from a third copy across the link');
        }
        link.release();
        assert.equal((await first).status, 200);
        const stored = await storedAt(image.repo, layer, 10_000);
        assert.ok(stored !== undefined && stored <= Date.now(), 'the cache stored the blob once its copy crossed');
        link.reset();
        assert.equal((await get(url)).status, 200);
        assert.deepEqual(gets(), [], 'a request after cacheStoredAt() is served from storage');
      }
      assert.ok(outran, "in 6 tries, the held copy was never the one the cache stores");
    } finally {
      await cache.stop();
      await link.stop();
      await upstream.stop();
    }
  });

  // distribution's proxy logs in where the registry hands out bearer tokens
  // (Docker Hub, Quay, Harbor: the token protocol): registry/proxy/
  // proxyauth.go keeps the credentials by the realms the registry's /v2/
  // challenge names. (A registry with basic auth only gets none from 2.8.)
  test('a cache of a private registry logs in with the credentials its environment gives it (deploy/cache/credentials)', async (t) => {
    if (!requireComponents(t, ['docker-registry', 'openssl'])) return;
    const auth = { username: 'robot', password: 'cache-Secret-7f3a' };
    const tokens = await TokenServer.start({ users: { [auth.username]: auth.password }, allow: (user) => user !== null });
    const upstream = await Registry.start({ tokenAuth: tokens.registryConfig() });
    const link = await ThinLink.start({ target: upstream.url, bitsPerSecond: 80e6 });
    const withCredentials = await Registry.start({ configFile: CACHE_CONFIG, proxy: { remoteurl: link.url, ...auth } });
    const without = await Registry.start({ configFile: CACHE_CONFIG, proxy: { remoteurl: link.url } });
    try {
      upstream.bearer = tokens.adminToken(['private/one']);
      const image = await pushRandom(upstream, 'private/one', 50_000);
      const accept = { accept: 'application/vnd.oci.image.manifest.v1+json' };
      assert.equal((await get(`${withCredentials.url}/v2/${image.repo}/manifests/${image.digest}`, accept)).status, 200, 'served to a client that sent none');
      assert.ok(tokens.requests.some((r) => r.user === auth.username && r.granted), 'the cache logged in as its robot');
      assert.notEqual((await get(`${without.url}/v2/${image.repo}/manifests/${image.digest}`, accept)).status, 200, 'a cache without them gets nothing');
    } finally {
      await without.stop();
      await withCredentials.stop();
      await link.stop();
      await upstream.stop();
      await tokens.stop();
    }
  });
});
