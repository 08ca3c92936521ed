// The registry client through containerd's registry hosts, against small
// HTTP servers on loopback: what each host is asked and with what (the
// path under its API root, ?ns=, its headers, the image's own registry's
// credentials), which hosts are skipped for want of a capability, and
// the fall through to the next host. A real registry, TLS and the agent are
// in test/e2e/containerd-hosts.test.ts.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { stringify } from 'smol-toml';
import { loadAuthFiles } from '../../src/registry/credentials.ts';
import { RegistryClient, RegistryError } from '../../src/registry/client.ts';
import { ContainerdHosts } from '../../src/registry/containerd-hosts.ts';
import { parseImageName, type ImageName } from '../../src/registry/names.ts';

const sha = (b: Buffer | string) => `sha256:${createHash('sha256').update(b).digest('hex')}`;
const manifest = Buffer.from(JSON.stringify({ schemaVersion: 2, mediaType: 'application/vnd.oci.image.manifest.v1+json', config: { mediaType: 'application/vnd.oci.image.config.v1+json', digest: sha('c'), size: 1 }, layers: [] }));

function name(s: string): ImageName {
  const r = parseImageName(s);
  if (!r.ok) throw new Error(r.error);
  return r.value;
}

interface Seen {
  url: string;
  headers: http.IncomingHttpHeaders;
}

/** A loopback server that records each request and answers with `answer` (the manifest, or a status). */
async function server(answer: (url: string) => number): Promise<{ host: string; seen: Seen[]; close: () => Promise<void> }> {
  const seen: Seen[] = [];
  const srv = http.createServer((req, res) => {
    seen.push({ url: req.url ?? '', headers: req.headers });
    const status = answer(req.url ?? '');
    if (status !== 200) return void res.writeHead(status).end();
    res.writeHead(200, { 'content-type': 'application/vnd.oci.image.manifest.v1+json', 'docker-content-digest': sha(manifest), 'content-length': String(manifest.length) });
    res.end(req.method === 'HEAD' ? undefined : manifest);
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  return {
    host: `127.0.0.1:${(srv.address() as AddressInfo).port}`,
    seen,
    close: async () => {
      srv.closeAllConnections();
      await new Promise<void>((r) => srv.close(() => r()));
    },
  };
}

let tmp: string;
before(async () => {
  tmp = await mkdtemp(path.join(os.tmpdir(), 'pinset-hosts-client-'));
});
after(async () => {
  await rm(tmp, { recursive: true, force: true });
});

/** A certs.d root with one hosts.toml for `registry`, written from a TOML document (never by concatenation). */
async function certsD(registry: string, doc: Record<string, unknown>): Promise<string> {
  const root = await mkdtemp(path.join(tmp, 'certs.d-'));
  await mkdir(path.join(root, registry));
  await writeFile(path.join(root, registry, 'hosts.toml'), stringify(doc));
  return root;
}

describe('whether an image is fetched through a mirror first', () => {
  test('a host listed before the `server` is a mirror; the `server` listed as a [host] too, or no hosts.toml, is not', async () => {
    const cache = await certsD('cached.example', { server: 'https://cached.example', host: { 'http://127.0.0.1:5001': { capabilities: ['pull', 'resolve'] } } });
    assert.equal(await new RegistryClient({ containerdHosts: new ContainerdHosts(cache) }).throughMirror(name(`cached.example/app@${sha(manifest)}`)), true);
    const self = await certsD('self.example', { server: 'http://127.0.0.1:5002', host: { 'http://127.0.0.1:5002': { capabilities: ['pull', 'resolve'] } } });
    assert.equal(await new RegistryClient({ containerdHosts: new ContainerdHosts(self) }).throughMirror(name(`self.example/app@${sha(manifest)}`)), false);
    assert.equal(await new RegistryClient({ containerdHosts: new ContainerdHosts(self) }).throughMirror(name(`other.example/app@${sha(manifest)}`)), false, 'no folder: the registry itself');
  });
});

describe('the registry client through containerd hosts', () => {
  test("the values of a hosts.toml's headers never reach an error, even when the registry echoes them", async () => {
    const echo = http.createServer((req, res) => {
      res.writeHead(403, { 'content-type': 'application/json' }).end(JSON.stringify({ errors: [{ code: 'DENIED', message: `denied: authorization=${req.headers.authorization} x-api-key=${req.headers['x-api-key']}` }] }));
    });
    await new Promise<void>((r) => echo.listen(0, '127.0.0.1', r));
    const host = `127.0.0.1:${(echo.address() as AddressInfo).port}`;
    const root = await certsD('hdr.example', {
      server: `http://${host}`,
      host: { [`http://${host}`]: { capabilities: ['pull', 'resolve'], header: { authorization: 'Bearer hdr-bearer-4567', 'x-api-key': ['key-89abcdef'] } } },
    });
    const client = new RegistryClient({ containerdHosts: new ContainerdHosts(root), attempts: 1 });
    try {
      await assert.rejects(client.manifest(name(`hdr.example/team/app@${sha(manifest)}`)), (e: RegistryError) => {
        assert.equal(e.kind, 'Unauthorized');
        assert.match(e.message, /DENIED: denied: authorization=\[redacted\] x-api-key=\[redacted\]/);
        assert.doesNotMatch(e.message, /hdr-bearer-4567|key-89abcdef/);
        return true;
      });
    } finally {
      await client.close();
      echo.closeAllConnections();
      await new Promise<void>((r) => echo.close(() => r()));
    }
  });

  test('a pull-only mirror is not asked to resolve a tag; the next mirror is, under its own API root, with ?ns= and its headers', async () => {
    const trap = await server(() => 200);
    const mirror = await server(() => 200);
    const root = await certsD('private.example_5000_', {
      server: 'https://127.0.0.1:1',
      host: {
        [`http://${trap.host}`]: { capabilities: ['pull'] },
        [`http://${mirror.host}/proxy`]: { capabilities: ['pull', 'resolve'], header: { 'x-tenant': 'edge-7' } },
      },
    });
    const client = new RegistryClient({ containerdHosts: new ContainerdHosts(root), attempts: 1 });
    try {
      const head = await client.head(name('private.example:5000/team/app:1.0'));
      assert.equal(head.digest, sha(manifest));
      assert.equal(head.registry, mirror.host);
      assert.equal(trap.seen.length, 0, 'the pull-only mirror resolves no tag');
      assert.equal(mirror.seen[0]!.url, '/proxy/v2/team/app/manifests/1.0?ns=private.example%3A5000');
      assert.equal(mirror.seen[0]!.headers['x-tenant'], 'edge-7');

      // By digest the pull-only mirror comes first.
      await client.manifest(name(`private.example:5000/team/app@${sha(manifest)}`));
      assert.equal(trap.seen.length, 1);
      assert.equal(trap.seen[0]!.url, `/v2/team/app/manifests/${sha(manifest)}?ns=private.example%3A5000`);
      assert.equal(mirror.seen.length, 1, 'the first mirror answered');
    } finally {
      await client.close();
      await trap.close();
      await mirror.close();
    }
  });

  test("a mirror's credentials are the image registry's: sent to the mirror that asks, never looked up by the mirror's name", async () => {
    const user = 'puller';
    const password = 's3cret-pw';
    // A mirror that challenges for Basic credentials before it answers.
    const seen: (string | undefined)[] = [];
    const guarded = http.createServer((req, res) => {
      seen.push(req.headers.authorization);
      if (req.headers.authorization !== `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}`) return void res.writeHead(401, { 'www-authenticate': 'Basic realm="m"' }).end();
      res.writeHead(200, { 'content-type': 'application/vnd.oci.image.manifest.v1+json', 'docker-content-digest': sha(manifest), 'content-length': String(manifest.length) }).end();
    });
    await new Promise<void>((r) => guarded.listen(0, '127.0.0.1', r));
    const guardedHost = `127.0.0.1:${(guarded.address() as AddressInfo).port}`;
    const auth = path.join(tmp, 'auth-mirror.json');
    // Credentials for the image's registry only; none for the mirror's address.
    await writeFile(auth, JSON.stringify({ auths: { 'private.example': { auth: Buffer.from(`${user}:${password}`).toString('base64') } } }));
    const { credentials } = await loadAuthFiles([auth]);
    const root = await certsD('private.example', { server: `http://${guardedHost}` });
    const client = new RegistryClient({ containerdHosts: new ContainerdHosts(root), credentials, attempts: 1 });
    try {
      assert.equal((await client.head(name('private.example/team/app:1.0'))).registry, guardedHost);
      assert.deepEqual(seen.map((a) => (a ? 'basic' : 'none')), ['none', 'basic']);
    } finally {
      await client.close();
      guarded.closeAllConnections();
      await new Promise<void>((r) => guarded.close(() => r()));
    }
  });

  test('a mirror that lacks the image or cannot be reached is passed over for the next host; when none answers, the error names each', async () => {
    const empty = await server(() => 404);
    const upstream = await server(() => 200);
    const root = await certsD('reg.example', {
      server: `http://${upstream.host}`,
      host: { 'http://127.0.0.1:1': { capabilities: ['pull', 'resolve'] }, [`http://${empty.host}`]: { capabilities: ['pull', 'resolve'] } },
    });
    const client = new RegistryClient({ containerdHosts: new ContainerdHosts(root), attempts: 1 });
    try {
      assert.equal((await client.head(name('reg.example/a/b:1'))).registry, upstream.host);
      assert.equal(empty.seen.length, 1);
      await upstream.close();
      await assert.rejects(client.head(name('reg.example/a/b:2')), (e: RegistryError) => {
        assert.equal(e.kind, 'Unavailable');
        assert.match(e.message, /^reg\.example\/a\/b:2: 127\.0\.0\.1:1 \(mirror\) cannot be reached: ECONNREFUSED.*; 127\.0\.0\.1:\d+ \(mirror\) answered HTTP 404: the manifest is unknown; 127\.0\.0\.1:\d+ cannot be reached: ECONNREFUSED/);
        return true;
      });
    } finally {
      await client.close();
      await empty.close();
    }
  });

  test('a tag no host may resolve is refused without a request, as Blocked: a size estimate does not take the registry for down', async () => {
    const mirror = await server(() => 200);
    const root = await certsD('reg.example', { server: `http://${mirror.host}`, capabilities: ['pull'] });
    const client = new RegistryClient({ containerdHosts: new ContainerdHosts(root), attempts: 1 });
    try {
      await assert.rejects(client.head(name('reg.example/a/b:1')), (e: RegistryError) => e.kind === 'Blocked' && /no host may resolve a tag/.test(e.message));
      assert.deepEqual(mirror.seen, []);
    } finally {
      await client.close();
      await mirror.close();
    }
  });
});
