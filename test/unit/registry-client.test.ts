// The registry client's own rules, against small HTTP servers on loopback
// that misbehave in the ways registries and networks do: busy answers,
// content that does not match its digest, oversized manifests. The real
// registry is exercised in test/e2e/registry-client.test.ts.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { describe, test } from 'node:test';
import { parseChallenge, RegistryClient, RegistryError } from '../../src/registry/client.ts';
import { hostPlatform, parseManifest, parsePlatform, selectPlatform, type IndexEntry } from '../../src/registry/manifest.ts';
import { formatImageName, parseImageName, type ImageName } from '../../src/registry/names.ts';
import { MemoryCredentials } from '../../src/registry/credentials.ts';
import { parseRegistriesConf, RegistriesConf } from '../../src/registry/registries-conf.ts';

const sha = (b: Buffer | string) => `sha256:${createHash('sha256').update(b).digest('hex')}`;

function name(s: string): ImageName {
  const r = parseImageName(s);
  if (!r.ok) throw new Error(r.error);
  return r.value;
}

async function serve(handler: http.RequestListener): Promise<{ host: string; close: () => Promise<void> }> {
  const server = http.createServer(handler);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const host = `127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    host,
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

const insecure = (host: string) => new RegistriesConf(parseRegistriesConf(`[[registry]]\nprefix = "r.test"\nlocation = "${host}"\ninsecure = true\n`, 't.conf'));
const manifestBody = Buffer.from(JSON.stringify({ schemaVersion: 2, mediaType: 'application/vnd.oci.image.manifest.v1+json', config: { mediaType: 'application/vnd.oci.image.config.v1+json', digest: sha('c'), size: 1 }, layers: [] }));

describe('whether an image is fetched through a mirror first (registries.conf)', () => {
  test('a registry with a mirror is; one without, or a mirror for digests only asked with a tag, is not', async () => {
    const conf = new RegistriesConf(
      parseRegistriesConf(
        '[[registry]]\nprefix = "m.test"\nlocation = "m.test"\n[[registry.mirror]]\nlocation = "cache.local:5000"\n\n[[registry]]\nprefix = "d.test"\nlocation = "d.test"\nmirror-by-digest-only = true\n[[registry.mirror]]\nlocation = "cache.local:5000"\n',
        't.conf',
      ),
    );
    const client = new RegistryClient({ registries: conf });
    const of = (ref: string) => {
      const n = parseImageName(ref);
      assert.ok(n.ok);
      return client.throughMirror(n.value);
    };
    assert.equal(await of(`m.test/app@sha256:${'a'.repeat(64)}`), true);
    assert.equal(await of(`plain.test/app@sha256:${'a'.repeat(64)}`), false);
    assert.equal(await of(`d.test/app@sha256:${'a'.repeat(64)}`), true);
    assert.equal(await of('d.test/app:1'), false);
  });
});

describe('image names', () => {
  test('tags, digests and both; a name without a tag means latest', () => {
    assert.deepEqual(name('quay.io/org/app:1.2'), { host: 'quay.io', path: 'org/app', tag: '1.2' });
    assert.deepEqual(name('localhost:5000/app'), { host: 'localhost:5000', path: 'app', tag: 'latest' });
    const d = 'sha256:' + 'c'.repeat(64);
    assert.deepEqual(name(`quay.io/org/app:1.2@${d}`), { host: 'quay.io', path: 'org/app', tag: '1.2', digest: d });
    assert.equal(formatImageName(name(`quay.io/org/app@${d}`)), `quay.io/org/app@${d}`);
  });

  test('a name without a registry host is refused with the fully qualified name to write instead', () => {
    const r = parseImageName('nginx:1.27');
    assert.equal(r.ok, false);
    assert.match((r as { error: string }).error, /no registry host.*docker\.io\/library\/nginx:1\.27/);
    const r2 = parseImageName('org/app');
    assert.match((r2 as { error: string }).error, /docker\.io\/org\/app/);
    assert.match((parseImageName('quay.io/Org/app') as { error: string }).error, /repository path/);
    assert.match((parseImageName('quay.io/org/app@sha256:abc') as { error: string }).error, /64 lowercase hex/);
  });
});

describe('manifests and platforms', () => {
  test('an index entry is chosen by os, architecture and variant, with arm64 meaning v8', () => {
    const e = (os: string, architecture: string, variant?: string): IndexEntry => ({ mediaType: '', digest: `${os}/${architecture}/${variant ?? ''}`, size: 1, platform: { os, architecture, ...(variant ? { variant } : {}) } });
    const entries = [{ mediaType: '', digest: 'attestation', size: 1 }, e('linux', 'arm', 'v6'), e('linux', 'arm', 'v7'), e('linux', 'arm64', 'v8'), e('linux', 'amd64'), e('windows', 'amd64')];
    assert.equal(selectPlatform(entries, parsePlatform('linux/arm64'))?.digest, 'linux/arm64/v8');
    assert.equal(selectPlatform(entries, parsePlatform('linux/arm'))?.digest, 'linux/arm/v7');
    assert.equal(selectPlatform(entries, parsePlatform('linux/arm/v6'))?.digest, 'linux/arm/v6');
    assert.equal(selectPlatform(entries, parsePlatform('linux/amd64'))?.digest, 'linux/amd64/');
    assert.equal(selectPlatform(entries, parsePlatform('linux/s390x')), undefined);
    assert.throws(() => parsePlatform('amd64'), /expected os\/arch\[\/variant\]/);
    assert.equal(hostPlatform().os, process.platform);
  });

  test('schema 1 manifests are refused with what to do', () => {
    assert.throws(() => parseManifest(Buffer.from('{"schemaVersion":1,"fsLayers":[]}'), 'application/vnd.docker.distribution.manifest.v1+prettyjws'), /schema 1.*push it again/);
  });

  test('WWW-Authenticate challenges are read with quoted commas and escapes', () => {
    assert.deepEqual(parseChallenge('Bearer realm="https://auth.example/token?a=1,b=2",service="reg \\"x\\"",scope="repository:a/b:pull"'), {
      scheme: 'bearer',
      realm: 'https://auth.example/token?a=1,b=2',
      service: 'reg "x"',
    });
    assert.deepEqual(parseChallenge('Basic realm="r"'), { scheme: 'basic', realm: 'r', service: undefined });
    assert.equal(parseChallenge('Negotiate abc'), undefined);
  });
});

describe('registry client', () => {
  test('busy answers (503, 429 with Retry-After) are retried at a paced interval, then succeed', async () => {
    let calls = 0;
    const srv = await serve((req, res) => {
      calls++;
      if (calls === 1) return void res.writeHead(503).end();
      if (calls === 2) return void res.writeHead(429, { 'retry-after': '0' }).end();
      res.writeHead(200, { 'content-type': 'application/vnd.oci.image.manifest.v1+json', 'docker-content-digest': sha(manifestBody) }).end(req.method === 'HEAD' ? undefined : manifestBody);
    });
    const client = new RegistryClient({ registries: insecure(srv.host), retryPolicy: { baseMs: 10, capMs: 50 } });
    try {
      const m = await client.manifest(name('r.test/a/b:1'));
      assert.equal(m.digest, sha(manifestBody));
      assert.equal(calls, 3);
    } finally {
      await client.close();
      await srv.close();
    }
  });

  test('retries stop after the configured attempts, saying what the registry answered', async () => {
    let calls = 0;
    const srv = await serve((_req, res) => {
      calls++;
      res.writeHead(502, { 'content-type': 'text/plain' }).end('bad gateway upstream');
    });
    const client = new RegistryClient({ registries: insecure(srv.host), attempts: 3, retryPolicy: { baseMs: 5, capMs: 20 } });
    try {
      await assert.rejects(client.manifest(name('r.test/a/b:1')), (e: RegistryError) => {
        assert.equal(e.kind, 'Unavailable');
        assert.match(e.message, /answered HTTP 502 bad gateway upstream/);
        return true;
      });
      assert.equal(calls, 3);
    } finally {
      await client.close();
      await srv.close();
    }
  });

  test('every credential for the registry is tried in turn until one is let in; a refusal names each by where it came from', async () => {
    const good = `Basic ${Buffer.from('robot:right-pw').toString('base64')}`;
    const seen: string[] = [];
    const srv = await serve((req, res) => {
      const a = req.headers.authorization;
      if (a) seen.push(Buffer.from(a.slice(6), 'base64').toString().split(':')[0]!);
      if (a !== good) return void res.writeHead(401, { 'www-authenticate': 'Basic realm="r"' }).end();
      res.writeHead(200, { 'content-type': 'application/vnd.oci.image.manifest.v1+json' }).end(req.method === 'HEAD' ? undefined : manifestBody);
    });
    const credentials = new MemoryCredentials()
      .add(`${srv.host}/a/b`, { username: 'stale', password: 'old-pw' }, 'the auth file (entry for a/b)')
      .add(srv.host, { username: 'robot', password: 'right-pw' }, 'credential provider test');
    const client = new RegistryClient({ registries: insecure(srv.host), credentials, attempts: 1 });
    try {
      const m = await client.manifest(name(`r.test/a/b@${sha(manifestBody)}`));
      assert.equal(m.digest, sha(manifestBody));
      assert.deepEqual(seen, ['stale', 'robot'], 'the most specific entry first, then the next');
      assert.ok(credentials.asked.every((a) => a.host === srv.host && a.path === 'a/b' && a.origin?.repository === 'r.test/a/b'), 'asked for the location, with the image as the set names it');
      const refused = new RegistryClient({ registries: insecure(srv.host), credentials: new MemoryCredentials().add(srv.host, { username: 'stale', password: 'old-pw' }, 'the auth file').add(`${srv.host}/a`, { username: 'other', password: 'x-pw' }, 'a pull secret'), attempts: 1 });
      await assert.rejects(refused.manifest(name(`r.test/a/b@${sha(manifestBody)}`)), (e: RegistryError) => {
        assert.equal(e.kind, 'Unauthorized');
        assert.match(e.message, /refused the credentials of other from a pull secret: HTTP 401.*refused the credentials of stale from the auth file: HTTP 401/);
        assert.doesNotMatch(e.message, /old-pw|x-pw/);
        return true;
      });
      await refused.close();
    } finally {
      await client.close();
      await srv.close();
    }
  });

  test('a bearer token from the token service never reaches an error, even when the registry echoes it in a body cut to size', async () => {
    const token = `tok-${'s3cr3t'.repeat(40)}`;
    const srv = await serve((req, res) => {
      if (req.url?.startsWith('/token')) return void res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ token, expires_in: 300 }));
      const a = req.headers.authorization;
      if (!a) return void res.writeHead(401, { 'www-authenticate': `Bearer realm="http://${req.headers.host}/token",service="r"` }).end();
      // A registry (or a proxy) that echoes the request's headers: the token crosses the 200-character cut.
      res.writeHead(404, { 'content-type': 'text/plain' }).end(`${'x'.repeat(120)} no such manifest for a request with Authorization: ${a}`);
    });
    const client = new RegistryClient({ registries: insecure(srv.host), attempts: 1 });
    try {
      await assert.rejects(client.manifest(name(`r.test/a/b@${sha(manifestBody)}`)), (e: RegistryError) => {
        assert.equal(e.kind, 'NotFound');
        assert.match(e.message, /Authorization: Bearer \[redacted\]/);
        assert.doesNotMatch(e.message, /s3cr3t/, 'not even the part of the token before the cut');
        return true;
      });
      assert.equal(client.scrubber.scrub(`a message with ${token} in it`), 'a message with [redacted] in it');
    } finally {
      await client.close();
      await srv.close();
    }
  });

  test('a redirect is followed; the credentials do not follow it to another host', async () => {
    const seen: (string | undefined)[] = [];
    const elsewhere = await serve((req, res) => {
      seen.push(req.headers.authorization);
      res.writeHead(200, { 'content-type': 'application/vnd.oci.image.manifest.v1+json' }).end(req.method === 'HEAD' ? undefined : manifestBody);
    });
    const srv = await serve((req, res) => {
      if (!req.headers.authorization) return void res.writeHead(401, { 'www-authenticate': 'Basic realm="r"' }).end();
      res.writeHead(307, { location: `http://${elsewhere.host}/storage/manifest` }).end();
    });
    const credentials = new MemoryCredentials().add(srv.host, { username: 'puller', password: 'secret' });
    const client = new RegistryClient({ registries: insecure(srv.host), credentials });
    try {
      const m = await client.manifest(name(`r.test/a/b@${sha(manifestBody)}`));
      assert.equal(m.digest, sha(manifestBody));
      assert.deepEqual(seen, [undefined], 'the other host got the request, without the Authorization header');
    } finally {
      await client.close();
      await srv.close();
      await elsewhere.close();
    }
  });

  test('a manifest fetched by digest must hash to that digest', async () => {
    const srv = await serve((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/vnd.oci.image.manifest.v1+json' }).end(manifestBody);
    });
    const client = new RegistryClient({ registries: insecure(srv.host) });
    const asked = 'sha256:' + 'd'.repeat(64);
    try {
      await assert.rejects(client.manifest(name(`r.test/a/b@${asked}`)), (e: RegistryError) => {
        assert.equal(e.kind, 'Invalid');
        assert.match(e.message, new RegExp(`digest is ${sha(manifestBody)}, not the ${asked} asked for`));
        return true;
      });
    } finally {
      await client.close();
      await srv.close();
    }
  });

  test('a manifest over 4 MiB is refused without reading it all', async () => {
    const srv = await serve((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/vnd.oci.image.manifest.v1+json', 'content-length': String(5 * 1024 * 1024) });
      res.write(Buffer.alloc(1024));
    });
    const client = new RegistryClient({ registries: insecure(srv.host) });
    try {
      await assert.rejects(client.manifest(name('r.test/a/b:1')), /over the 4194304-byte limit/);
    } finally {
      await client.close();
      await srv.close();
    }
  });

  test('a registry that never answers times out instead of hanging', async () => {
    const srv = await serve(() => {
      // never answers
    });
    const client = new RegistryClient({ registries: insecure(srv.host), timeoutMs: 200, attempts: 2, retryPolicy: { baseMs: 5, capMs: 10 } });
    try {
      await assert.rejects(client.head(name('r.test/a/b:1')), (e: RegistryError) => e.kind === 'Unavailable' && /no answer in time/.test(e.message));
    } finally {
      await client.close();
      await srv.close();
    }
  });
});
