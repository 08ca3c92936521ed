import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import * as fsp from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { AuthFile } from '../../src/registry/auth.ts';

const b64 = (s: string) => Buffer.from(s, 'utf8').toString('base64');

/** The first credential to try for an image, as an AuthConfig (undefined: anonymous). */
function first(f: AuthFile, host: string, path: string) {
  return f.lookup(host, path)[0]?.auth;
}

function loaded(auths: Record<string, unknown>): AuthFile {
  const f = new AuthFile('/nonexistent/config.json');
  f.load({ auths });
  return f;
}

let dir: string;
before(async () => {
  dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'pinset-auth-'));
});
after(async () => {
  await fsp.rm(dir, { recursive: true, force: true });
});

describe('AuthFile: matching an image to credentials', () => {
  test('"auth" is base64 of user:pass (the password may contain colons)', () => {
    const f = loaded({ 'quay.io': { auth: b64('robot:pa:ss') } });
    assert.deepEqual(first(f, 'quay.io', 'org/app'), { username: 'robot', password: 'pa:ss' });
  });

  test('username/password and identitytoken fields', () => {
    const f = loaded({
      'ghcr.io': { username: 'me', password: 'tok' },
      'registry.example.com': { identitytoken: 'refresh-token-123' },
    });
    assert.deepEqual(first(f, 'ghcr.io', 'me/app'), { username: 'me', password: 'tok' });
    assert.deepEqual(first(f, 'registry.example.com', 'x'), { identityToken: 'refresh-token-123' });
  });

  test('keys may carry a scheme and a trailing slash; hosts are compared as written, as the kubelet compares them', () => {
    const f = loaded({ 'https://quay.io/': { auth: b64('u:p') }, 'http://localhost:5000': { auth: b64('l:p') }, 'https://Ghcr.IO': { auth: b64('g:p') } });
    assert.equal(first(f, 'quay.io', 'a/b')?.username, 'u');
    assert.equal(first(f, 'ghcr.io', 'a/b'), undefined, 'Go\'s url.Parse keeps the case, and filepath.Match is case-sensitive');
    assert.equal(first(f, 'quay.io', 'a/b')?.serverAddress, undefined, 'containerd ignores credentials whose serverAddress is a bare host');
    assert.equal(first(f, 'localhost:5000', 'a')?.username, 'l');
    assert.equal(first(f, 'localhost', 'a'), undefined, 'the port is part of the host');
  });

  test("Docker Hub's legacy key https://index.docker.io/v1/ is docker.io", () => {
    const f = loaded({ 'https://index.docker.io/v1/': { auth: b64('hub:p') } });
    assert.equal(first(f, 'docker.io', 'library/nginx')?.username, 'hub');
  });

  test('a key with a path applies to the paths it is a string prefix of, as in the kubelet', () => {
    const f = loaded({ 'quay.io/team-a': { auth: b64('a:p') } });
    assert.equal(first(f, 'quay.io', 'team-a')?.username, 'a');
    assert.equal(first(f, 'quay.io', 'team-a/app')?.username, 'a');
    assert.equal(first(f, 'quay.io', 'team-ab/app')?.username, 'a', 'keyring_test.go: "match first part of path token"');
    assert.equal(first(f, 'quay.io', 'team-b/app'), undefined);
  });

  test('"*." matches exactly one DNS label', () => {
    const f = loaded({ '*.example.com': { auth: b64('w:p') } });
    assert.equal(first(f, 'registry.example.com', 'a')?.username, 'w');
    assert.equal(first(f, 'example.com', 'a'), undefined);
    assert.equal(first(f, 'a.b.example.com', 'a'), undefined);
    assert.equal(first(f, 'registry.example.org', 'a'), undefined);
  });

  test('every matching key is a candidate, the most specific first', () => {
    const f = loaded({
      '*.quay.io': { auth: b64('wild:p') },
      'quay.io': { auth: b64('host:p') },
      'quay.io/team-a': { auth: b64('team:p') },
      'quay.io/team-a/special': { auth: b64('special:p') },
      'eu.quay.io': { auth: b64('eu:p') },
    });
    assert.equal(first(f, 'quay.io', 'team-a/special/app')?.username, 'special');
    assert.equal(first(f, 'quay.io', 'team-a/app')?.username, 'team');
    assert.equal(first(f, 'quay.io', 'team-b/app')?.username, 'host');
    assert.equal(first(f, 'eu.quay.io', 'x')?.username, 'eu', 'an exact host beats a wildcard');
    assert.equal(first(f, 'us.quay.io', 'x')?.username, 'wild');
    assert.deepEqual(
      f.lookup('quay.io', 'team-a/special/app').map((c) => c.auth.username),
      ['special', 'team', 'host'],
      'reverse lexical order of the keys: quay.io/team-a/special, quay.io/team-a, quay.io',
    );
    assert.deepEqual(f.lookup('eu.quay.io', 'x').map((c) => c.auth.username), ['eu', 'wild']);
    assert.match(f.lookup('eu.quay.io', 'x')[0]!.from, /entry eu\.quay\.io/, 'each candidate names its entry');
  });

  test('other registries get nothing', () => {
    const f = loaded({ 'quay.io': { auth: b64('u:p') } });
    assert.equal(first(f, 'gcr.io', 'quay.io/app'), undefined);
    assert.equal(first(f, 'quay.io.evil.example', 'app'), undefined);
    assert.equal(first(f, 'evilquay.io', 'app'), undefined);
  });

  test('entries without usable credentials are skipped', () => {
    const f = loaded({ 'quay.io': {}, 'ghcr.io': 'nope', 'gcr.io': { auth: b64('no-colon') } });
    assert.equal(f.size, 0);
    assert.equal(first(f, 'quay.io', 'a'), undefined);
  });

  test('each lookup returns a copy', () => {
    const f = loaded({ 'quay.io': { auth: b64('u:p') } });
    first(f, 'quay.io', 'a')!.password = 'changed';
    assert.equal(first(f, 'quay.io', 'a')?.password, 'p');
  });
});

describe('AuthFile: reading the file', () => {
  test('a missing file means anonymous pulls, without a problem', async () => {
    const f = new AuthFile(path.join(dir, 'missing.json'));
    await f.refresh();
    assert.equal(f.size, 0);
    assert.equal(f.problem, undefined);
    assert.equal(first(f, 'quay.io', 'a'), undefined);
  });

  test('reads the file and re-reads it when it changes', async () => {
    const p = path.join(dir, 'config.json');
    await fsp.writeFile(p, JSON.stringify({ auths: { 'quay.io': { auth: b64('one:p') } } }));
    const f = new AuthFile(p);
    await f.refresh();
    assert.equal(first(f, 'quay.io', 'a')?.username, 'one');
    await fsp.writeFile(p, JSON.stringify({ auths: { 'quay.io': { auth: b64('two:p') } } }));
    const later = new Date(Date.now() + 10_000);
    await fsp.utimes(p, later, later);
    await f.refresh();
    assert.equal(first(f, 'quay.io', 'a')?.username, 'two');
    await fsp.rm(p);
    await f.refresh();
    assert.equal(first(f, 'quay.io', 'a'), undefined, 'a removed file means anonymous again');
  });

  test('a malformed file is a problem that quotes none of its content; pulls go anonymous', async () => {
    const p = path.join(dir, 'broken.json');
    const secret = b64('robot:hunter2-SECRET');
    await fsp.writeFile(p, `{"auths": {"quay.io": {"auth": "${secret}", "password": "hunter2-SECRET"}`);
    const f = new AuthFile(p);
    await f.refresh();
    assert.ok(f.problem, 'no problem reported');
    assert.ok(f.problem.includes(p), f.problem);
    for (const leak of [secret, 'hunter2', 'robot', 'quay.io', '{']) assert.ok(!f.problem.includes(leak), `problem leaks ${leak}: ${f.problem}`);
    assert.equal(first(f, 'quay.io', 'a'), undefined);
  });

  test('a JSON file of the wrong shape is a problem too; one with credential helpers only is not', async () => {
    const p = path.join(dir, 'wrong.json');
    await fsp.writeFile(p, JSON.stringify({ registries: ['quay.io'] }));
    const f = new AuthFile(p);
    await f.refresh();
    assert.match(f.problem ?? '', /is not a docker config\.json/);
    const h = path.join(dir, 'helpers.json');
    await fsp.writeFile(h, JSON.stringify({ credHelpers: { 'quay.io': 'ecr-login' }, credsStore: 'pass' }));
    const g = new AuthFile(h);
    await g.refresh();
    assert.equal(g.problem, undefined);
    assert.deepEqual(g.helperFor('quay.io'), { helper: 'ecr-login', store: false });
    assert.deepEqual(g.helperFor('ghcr.io'), { helper: 'pass', store: true });
  });
});

describe('AuthFile.scrub', () => {
  test('removes passwords, base64 auth strings and tokens from text', () => {
    const auth = b64('robot:s3cr3t-pass');
    const f = loaded({
      'quay.io': { auth },
      'ghcr.io': { username: 'me', password: 'ghp_tokenvalue' },
      'registry.example.com': { identitytoken: 'idtoken-xyz' },
    });
    const text = `pull failed: 401 for robot:s3cr3t-pass (auth ${auth}); ghp_tokenvalue rejected; token idtoken-xyz expired`;
    const out = f.scrub(text);
    for (const secret of ['s3cr3t-pass', auth, 'ghp_tokenvalue', 'idtoken-xyz']) assert.ok(!out.includes(secret), `${secret} left in ${out}`);
    assert.ok(out.includes('[redacted]'));
    assert.ok(out.startsWith('pull failed: 401 for robot:'), 'the rest of the text is kept');
  });

  test('text without secrets is unchanged', () => {
    const f = loaded({ 'quay.io': { auth: b64('u:pw') } });
    assert.equal(f.scrub('manifest unknown'), 'manifest unknown');
  });
});
