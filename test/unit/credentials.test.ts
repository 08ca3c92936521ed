// Where the commands find registry credentials: podman's and skopeo's
// order (containers-auth.json(5)), then Docker's; the first file with an
// entry for the registry wins.
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
import { authFilePaths, loadAuthFiles } from '../../src/registry/credentials.ts';

test('--auth-file or REGISTRY_AUTH_FILE is the only file; otherwise the containers files, then Docker\'s', () => {
  assert.deepEqual(authFilePaths('/x/auth.json', { REGISTRY_AUTH_FILE: '/y.json' }, '/home/u'), ['/x/auth.json']);
  assert.deepEqual(authFilePaths(undefined, { REGISTRY_AUTH_FILE: '/y.json' }, '/home/u'), ['/y.json']);
  assert.deepEqual(authFilePaths(undefined, { XDG_RUNTIME_DIR: '/run/user/1000' }, '/home/u'), [
    '/run/user/1000/containers/auth.json',
    '/home/u/.config/containers/auth.json',
    '/home/u/.docker/config.json',
  ]);
  assert.deepEqual(authFilePaths(undefined, { XDG_CONFIG_HOME: '/cfg', DOCKER_CONFIG: '/dock' }, '/home/u'), ['/cfg/containers/auth.json', '/dock/config.json']);
});

test('the first file with an entry for the registry wins; a broken file is reported, not fatal, and its secrets are scrubbed anyway', async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-creds-'));
  try {
    const b64 = (s: string) => Buffer.from(s).toString('base64');
    const first = path.join(dir, 'auth.json');
    const second = path.join(dir, 'config.json');
    const broken = path.join(dir, 'broken.json');
    await writeFile(first, JSON.stringify({ auths: { 'quay.io': { auth: b64('podman-user:pw-from-podman') } } }));
    await writeFile(second, JSON.stringify({ auths: { 'quay.io': { auth: b64('docker-user:pw-from-docker') }, 'ghcr.io': { auth: b64('gh:pw-gh') } } }));
    await writeFile(broken, '{"auths": {"x": "pw-in-broken-file"');
    const { credentials, problems } = await loadAuthFiles([first, second, broken, path.join(dir, 'missing.json')]);
    const users = async (host: string, p: string) => (await credentials.credentialsFor({ host, path: p })).candidates.map((c) => c.auth.username);
    assert.deepEqual(await users('quay.io', 'org/app'), ['podman-user'], 'the first file with an entry, and only it');
    assert.deepEqual(await users('ghcr.io', 'org/app'), ['gh']);
    assert.deepEqual(await users('docker.io', 'library/nginx'), []);
    assert.equal(problems.length, 1);
    assert.match(problems[0]!, /broken\.json is not a docker config\.json/);
    assert.doesNotMatch(problems[0]!, /pw-in-broken-file/);
    assert.equal(credentials.scrub('said pw-from-docker and pw-gh'), 'said [redacted] and [redacted]');
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
