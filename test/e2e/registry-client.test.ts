// The registry client against real registries (Debian's docker-registry,
// distribution 2.8) on loopback: plain, htpasswd, bearer tokens from a token
// service, TLS with a private CA, a mirror standing in for a stopped
// registry, and a proxy from the environment.
import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { AuthFile } from '../../src/registry/auth.ts';
import { RegistryClient, RegistryError } from '../../src/registry/client.ts';
import { AuthFiles } from '../../src/registry/credentials.ts';
import { parseImageName, type ImageName } from '../../src/registry/names.ts';
import { parseRegistriesConf, RegistriesConf } from '../../src/registry/registries-conf.ts';
import { Transport } from '../../src/registry/transport.ts';
import { missingComponents, requireComponents, type ComponentName } from '../support/components.ts';
import { copyImage, pushMultiArch, pushSingleLayer, type PushedImage } from '../support/images.ts';
import { Registry } from '../support/registry.ts';
import { makeCertificate, TokenServer } from '../support/token-server.ts';

const NEEDS: ComponentName[] = ['docker-registry', 'htpasswd', 'openssl'];
const CREDS = { username: 'puller', password: 'pull-secret-93b1' };

function name(s: string): ImageName {
  const r = parseImageName(s);
  if (!r.ok) throw new Error(r.error);
  return r.value;
}

/** registries.conf text mapping `host` to a loopback registry (plain HTTP, so insecure). */
function conf(entries: { prefix: string; location: string; mirrors?: { location: string; pullFromMirror?: string }[] }[]): RegistriesConf {
  const text = entries
    .map((e) => {
      const mirrors = (e.mirrors ?? []).map((m) => `[[registry.mirror]]\nlocation = ${JSON.stringify(m.location)}\ninsecure = true\n${m.pullFromMirror ? `pull-from-mirror = ${JSON.stringify(m.pullFromMirror)}\n` : ''}`);
      return `[[registry]]\nprefix = ${JSON.stringify(e.prefix)}\nlocation = ${JSON.stringify(e.location)}\ninsecure = true\n${mirrors.join('')}`;
    })
    .join('\n');
  return new RegistriesConf(parseRegistriesConf(text, 'test.conf'), ['test.conf']);
}

async function authFile(dir: string, host: string, creds: { username: string; password: string }): Promise<AuthFiles> {
  const file = path.join(dir, `auth-${host.replace(/[^\w]/g, '_')}.json`);
  await writeFile(file, JSON.stringify({ auths: { [host]: { auth: Buffer.from(`${creds.username}:${creds.password}`).toString('base64') } } }));
  const f = new AuthFile(file);
  await f.refresh();
  return new AuthFiles([f]);
}

describe('registry client against real registries', () => {
  let tmp: string;
  let plain: Registry;
  let basic: Registry;
  let app: PushedImage;
  let multi: Awaited<ReturnType<typeof pushMultiArch>>;
  const ready = () => missingComponents(NEEDS).length === 0;

  before(async () => {
    if (!ready()) return;
    tmp = await mkdtemp(path.join(os.tmpdir(), 'pinset-client-'));
    plain = await Registry.start();
    basic = await Registry.start({ auth: CREDS });
    app = await pushSingleLayer(plain, 'org/app', { tag: '1.0' });
    multi = await pushMultiArch(plain, 'org/multi', undefined, { tag: 'v2' });
    await pushSingleLayer(basic, 'secret/app', { tag: 'latest' });
  });

  after(async () => {
    await plain?.stop();
    await basic?.stop();
    if (tmp) await rm(tmp, { recursive: true, force: true });
  });

  test('a tag resolves to the digest that was pushed; an index resolves to the index digest', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const client = new RegistryClient({ registries: conf([{ prefix: 'registry.test', location: plain.host }]) });
    try {
      const head = await client.head(name('registry.test/org/app:1.0'));
      assert.equal(head.digest, app.digest);
      assert.equal(head.mediaType, 'application/vnd.oci.image.manifest.v1+json');
      const idx = await client.manifest(name('registry.test/org/multi:v2'));
      assert.equal(idx.digest, multi.digest);
      assert.equal(idx.manifest.kind, 'index');
      assert.equal(idx.registry, plain.host);
    } finally {
      await client.close();
    }
  });

  test('a manifest fetched by digest is cached: asking again sends no request', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const client = new RegistryClient({ registries: conf([{ prefix: 'registry.test', location: plain.host }]) });
    try {
      const ref = name(`registry.test/org/app@${app.digest}`);
      const first = await client.manifest(ref);
      assert.equal(first.manifest.kind, 'image');
      assert.equal(client.requests.manifest, 1);
      await client.manifest(ref);
      await client.head(ref);
      assert.equal(client.requests.manifest, 1);
    } finally {
      await client.close();
    }
  });

  test('an unknown tag is NotFound, naming the image and the registry', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const client = new RegistryClient({ registries: conf([{ prefix: 'registry.test', location: plain.host }]) });
    try {
      await assert.rejects(client.manifest(name('registry.test/org/app:nope')), (e: RegistryError) => {
        assert.equal(e.kind, 'NotFound');
        assert.match(e.message, /registry\.test\/org\/app:nope/);
        assert.match(e.message, new RegExp(`${plain.host.replace(/\./g, '\\.')} answered HTTP 404 MANIFEST_UNKNOWN`));
        return true;
      });
    } finally {
      await client.close();
    }
  });

  test('basic auth: refused without credentials, served with them, and the password never shows', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const registries = conf([{ prefix: 'private.test', location: basic.host }]);
    const anon = new RegistryClient({ registries });
    try {
      await assert.rejects(anon.head(name('private.test/secret/app:latest')), (e: RegistryError) => {
        assert.equal(e.kind, 'Unauthorized');
        assert.match(e.message, /anonymous access/);
        return true;
      });
    } finally {
      await anon.close();
    }
    // Credentials are looked up under the host actually contacted.
    const good = new RegistryClient({ registries, credentials: await authFile(tmp, basic.host, CREDS) });
    try {
      const m = await good.manifest(name('private.test/secret/app:latest'));
      assert.equal(m.manifest.kind, 'image');
    } finally {
      await good.close();
    }
    const bad = new RegistryClient({ registries, credentials: await authFile(tmp, basic.host, { username: 'puller', password: 'wrong-pass-5521' }) });
    try {
      await assert.rejects(bad.head(name('private.test/secret/app:latest')), (e: RegistryError) => {
        assert.equal(e.kind, 'Unauthorized');
        assert.match(e.message, /credentials of puller/);
        assert.doesNotMatch(e.message, /wrong-pass-5521/);
        return true;
      });
    } finally {
      await bad.close();
    }
  });

  test('bearer tokens: fetched from the realm with credentials, cached per repository, refused for strangers', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const tokens = await TokenServer.start({ users: { [CREDS.username]: CREDS.password }, allow: (user, repo) => user !== null || repo === 'public/app' });
    const reg = await Registry.start({ tokenAuth: tokens.registryConfig() });
    try {
      reg.bearer = tokens.adminToken(['team/app', 'team/other', 'public/app']);
      const a = await pushSingleLayer(reg, 'team/app', { tag: '1' });
      const b = await pushSingleLayer(reg, 'team/other', { tag: '1' });
      const p = await pushSingleLayer(reg, 'public/app', { tag: '1' });
      const registries = conf([{ prefix: 'tokens.test', location: reg.host }]);

      const client = new RegistryClient({ registries, credentials: await authFile(tmp, reg.host, CREDS) });
      try {
        assert.equal((await client.head(name('tokens.test/team/app:1'))).digest, a.digest);
        assert.equal((await client.manifest(name('tokens.test/team/app:1'))).digest, a.digest);
        assert.equal((await client.head(name('tokens.test/team/other:1'))).digest, b.digest);
        const mine = tokens.requests.filter((r) => r.user === CREDS.username);
        assert.deepEqual(
          mine.map((r) => r.scope),
          ['repository:team/app:pull', 'repository:team/other:pull'],
          'one token per repository, reused for the second request',
        );
        assert.ok(mine.every((r) => r.service === tokens.service && r.granted));
      } finally {
        await client.close();
      }

      // Anonymous: a public repository gets an anonymous token; a private one is refused.
      const anon = new RegistryClient({ registries });
      try {
        assert.equal((await anon.head(name('tokens.test/public/app:1'))).digest, p.digest);
        await assert.rejects(anon.head(name('tokens.test/team/app:1')), (e: RegistryError) => e.kind === 'Unauthorized');
      } finally {
        await anon.close();
      }

      const wrong = new RegistryClient({ registries, credentials: await authFile(tmp, reg.host, { username: CREDS.username, password: 'bad-token-pw-0042' }) });
      try {
        await assert.rejects(wrong.head(name('tokens.test/team/app:1')), (e: RegistryError) => {
          assert.equal(e.kind, 'Unauthorized');
          assert.match(e.message, /token service at 127\.0\.0\.1:\d+ refused the credentials of puller: HTTP 401/);
          assert.doesNotMatch(e.message, /bad-token-pw-0042/);
          return true;
        });
      } finally {
        await wrong.close();
      }
    } finally {
      await reg.stop();
      await tokens.stop();
    }
  });

  test('a mirror serves the image while its registry is stopped; the name stays the source name', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const source = await Registry.start();
    const mirror = await Registry.start();
    try {
      const img = await pushSingleLayer(source, 'edge/app', { tag: 'stable' });
      // The mirror holds the copy under a namespace of its own, as an oc-mirror'd registry does.
      await copyImage(source, mirror, 'edge/app', img.digest, 'stable', 'mirrored/edge/app');
      await source.pause();
      const byDigest = new RegistryClient({
        registries: conf([{ prefix: 'upstream.test/edge', location: `${source.host}/edge`, mirrors: [{ location: `${mirror.host}/mirrored/edge`, pullFromMirror: 'digest-only' }] }]),
        attempts: 1,
      });
      try {
        const m = await byDigest.manifest(name(`upstream.test/edge/app@${img.digest}`));
        assert.equal(m.digest, img.digest);
        assert.equal(m.registry, mirror.host);
        // A digest-only mirror is not asked for a tag; the stopped registry is.
        await assert.rejects(byDigest.head(name('upstream.test/edge/app:stable')), (e: RegistryError) => {
          assert.equal(e.kind, 'Unavailable');
          assert.match(e.message, /^upstream\.test\/edge\/app:stable: /);
          assert.match(e.message, new RegExp(`${source.host.replace(/\./g, '\\.')} cannot be reached`));
          assert.doesNotMatch(e.message, /mirror/);
          return true;
        });
      } finally {
        await byDigest.close();
      }
      const allMirror = new RegistryClient({
        registries: conf([{ prefix: 'upstream.test/edge', location: `${source.host}/edge`, mirrors: [{ location: `${mirror.host}/mirrored/edge` }] }]),
        attempts: 1,
      });
      try {
        assert.equal((await allMirror.head(name('upstream.test/edge/app:stable'))).digest, img.digest);
        await assert.rejects(allMirror.head(name('upstream.test/edge/app:gone')), (e: RegistryError) => {
          assert.match(e.message, /\(mirror\) answered HTTP 404/);
          assert.match(e.message, /cannot be reached/);
          return true;
        });
      } finally {
        await allMirror.close();
      }
    } finally {
      await source.stop();
      await mirror.stop();
    }
  });

  test('TLS: trusted through an added CA, refused without it, accepted unverified when marked insecure', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const { cert, key } = await makeCertificate(tmp, 'registry-tls', ['IP:127.0.0.1', 'DNS:localhost']);
    const reg = await Registry.start({ tls: { certificate: cert, key } });
    const transports: Transport[] = [];
    try {
      const img = await pushWithInsecureTls(reg);
      const secure = new RegistriesConf(parseRegistriesConf(`[[registry]]\nprefix = "tls.test"\nlocation = "${reg.host}"\n`, 'tls.conf'));
      const trusting = new Transport({ extraCa: [await readFile(cert, 'utf8')] });
      transports.push(trusting);
      const ok = new RegistryClient({ registries: secure, transport: trusting });
      assert.equal((await ok.head(name('tls.test/tls/app:1'))).digest, img);

      const plainTrust = new Transport();
      transports.push(plainTrust);
      const refused = new RegistryClient({ registries: secure, transport: plainTrust, attempts: 1 });
      await assert.rejects(refused.head(name('tls.test/tls/app:1')), (e: RegistryError) => {
        assert.equal(e.kind, 'Unavailable');
        assert.match(e.message, /over TLS/);
        assert.match(e.message, /NODE_EXTRA_CA_CERTS/);
        return true;
      });

      const insecure = new RegistriesConf(parseRegistriesConf(`[[registry]]\nprefix = "tls.test"\nlocation = "${reg.host}"\ninsecure = true\n`, 'tls.conf'));
      const lax = new RegistryClient({ registries: insecure, transport: plainTrust });
      assert.equal((await lax.head(name('tls.test/tls/app:1'))).digest, img);
    } finally {
      for (const tr of transports) await tr.close();
      await reg.stop();
    }
  });

  test('HTTP_PROXY from the environment carries the requests; NO_PROXY bypasses it', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const seen: string[] = [];
    // A forward proxy: absolute-URI requests for http://, CONNECT tunnels for https://.
    const proxy = http.createServer((req, res) => {
      const target = new URL(req.url ?? '');
      seen.push(target.host);
      const up = http.request({ host: target.hostname, port: target.port, path: target.pathname + target.search, method: req.method, headers: req.headers }, (r) => {
        res.writeHead(r.statusCode ?? 502, r.headers);
        r.pipe(res);
      });
      up.on('error', () => res.writeHead(502).end());
      req.pipe(up);
    });
    proxy.on('connect', (req, socket, head) => {
      seen.push(req.url ?? '');
      const [host, port] = (req.url ?? '').split(':');
      const upstream = net.connect(Number(port), host, () => {
        socket.write('HTTP/1.1 200 Connection Established\r\n\r\n');
        upstream.write(head);
        upstream.pipe(socket);
        socket.pipe(upstream);
      });
      upstream.on('error', () => socket.destroy());
      socket.on('error', () => upstream.destroy());
    });
    await new Promise<void>((r) => proxy.listen(0, '127.0.0.1', r));
    const proxyUrl = `http://127.0.0.1:${(proxy.address() as net.AddressInfo).port}`;
    const registries = conf([{ prefix: 'registry.test', location: plain.host }]);
    const viaProxy = new Transport({ env: { HTTP_PROXY: proxyUrl, HTTPS_PROXY: proxyUrl } });
    const bypass = new Transport({ env: { HTTP_PROXY: proxyUrl, HTTPS_PROXY: proxyUrl, NO_PROXY: '127.0.0.1' } });
    try {
      const c1 = new RegistryClient({ registries, transport: viaProxy });
      assert.equal((await c1.head(name('registry.test/org/app:1.0'))).digest, app.digest);
      assert.ok(seen.includes(plain.host), `the proxy carried the request (saw ${JSON.stringify(seen)})`);
      seen.length = 0;
      const c2 = new RegistryClient({ registries, transport: bypass });
      assert.equal((await c2.head(name('registry.test/org/app:1.0'))).digest, app.digest);
      assert.deepEqual(seen, []);
    } finally {
      await viaProxy.close();
      await bypass.close();
      proxy.closeAllConnections();
      await new Promise<void>((r) => proxy.close(() => r()));
    }
  });
});

/** Push one tagged image to a TLS registry whose certificate the test made; returns its digest. */
async function pushWithInsecureTls(reg: Registry): Promise<string> {
  // The helpers push with global fetch; let it accept the test's certificate for this one upload.
  const { Agent, setGlobalDispatcher, getGlobalDispatcher } = await import('undici');
  const before = getGlobalDispatcher();
  const agent = new Agent({ connect: { rejectUnauthorized: false } });
  setGlobalDispatcher(agent);
  try {
    return (await pushSingleLayer(reg, 'tls/app', { tag: '1' })).digest;
  } finally {
    setGlobalDispatcher(before);
    await agent.close();
  }
}
