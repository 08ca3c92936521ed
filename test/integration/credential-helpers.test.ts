// Docker credential helpers for the commands people run
// (src/registry/docker-credential-helper.ts), with helper programs written
// here as docker-credential-helpers' protocol has them: `get` with the
// registry on stdin, JSON on stdout, "credentials not found" for none. Then
// the commands' lookup (AuthFiles): credHelpers as podman and skopeo use
// them, credsStore as docker does, the first file with a credential winning.
import assert from 'node:assert/strict';
import { chmod, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { loadAuthFiles } from '../../src/registry/credentials.ts';
import { CredentialHelperError, helperGet } from '../../src/registry/docker-credential-helper.ts';
import { alive } from '../support/credential-plugin.ts';

let dir: string;
let bin: string;
let env: NodeJS.ProcessEnv;

/** docker-credential-<name> as a shell script; every call appends "<name> <args> <stdin>" to calls.log. */
async function helper(name: string, body: string): Promise<void> {
  const file = path.join(bin, `docker-credential-${name}`);
  await writeFile(file, `#!/bin/sh\nread -r server\necho "${name} $* $server" >> "${dir}/calls.log"\n${body}\n`);
  await chmod(file, 0o755);
}

const calls = async () => (await readFile(path.join(dir, 'calls.log'), 'utf8').catch(() => '')).split('\n').filter(Boolean);

before(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-helpers-'));
  bin = path.join(dir, 'bin');
  await mkdir(bin);
  env = { ...process.env, PATH: `${bin}:${process.env.PATH}` };
  await helper('store', `case "$server" in registry.test) echo '{"ServerURL":"registry.test","Username":"keychain-user","Secret":"keychain-pw"}';; *) echo "credentials not found in native keychain"; exit 1;; esac`);
  await helper('token', `echo '{"ServerURL":"'$server'","Username":"<token>","Secret":"refresh-tok-1"}'`);
  await helper('broken', `echo "keychain locked; secret keychain-pw" >&2; echo "internal: keychain-pw"; exit 3`);
  await helper('garbage', `echo 'not json keychain-pw'`);
  await helper('hang', `sleep 600 & echo $! > "${dir}/hang-child.pid"; wait`);
});
after(() => rm(dir, { recursive: true, force: true }));

describe('docker-credential-<name> get', () => {
  test('a credential, an identity token, or none', async () => {
    assert.deepEqual(await helperGet('store', 'registry.test', { env }), { username: 'keychain-user', password: 'keychain-pw' });
    assert.deepEqual(await helperGet('token', 'quay.io', { env }), { identityToken: 'refresh-tok-1' });
    assert.equal(await helperGet('store', 'quay.io', { env }), null, '"credentials not found" is none, not a failure');
    assert.ok((await calls()).includes('store get registry.test'), 'the registry host on stdin, `get` as the argument');
  });

  test('failures name the helper and never quote what it printed', async () => {
    for (const [name, message] of [
      ['broken', /docker-credential-broken get exited with status 3$/],
      ['garbage', /docker-credential-garbage get printed something that is not JSON/],
      ['missing', /docker-credential-missing is not on PATH/],
      ['../../bin/sh', /is not a plain program name/],
    ] as const) {
      await assert.rejects(helperGet(name, 'registry.test', { env }), (e: Error) => e instanceof CredentialHelperError && message.test(e.message) && !e.message.includes('keychain-pw'), name);
    }
  });

  test('a helper that hangs is killed with its process group at the bound', async () => {
    const started = Date.now();
    await assert.rejects(helperGet('hang', 'registry.test', { env, timeoutMs: 500 }), /docker-credential-hang did not finish within 0\.5s and was killed/);
    assert.ok(Date.now() - started < 5_000);
    const child = Number(await readFile(path.join(dir, 'hang-child.pid'), 'utf8'));
    for (let i = 0; i < 50 && alive(child); i++) await sleep(20);
    assert.equal(alive(child), false, 'its `sleep` is gone too');
  });
});

describe("the commands' lookup: auth files with credential helpers", () => {
  async function file(name: string, doc: unknown): Promise<string> {
    const p = path.join(dir, name);
    await writeFile(p, JSON.stringify(doc));
    return p;
  }
  const b64 = (s: string) => Buffer.from(s).toString('base64');

  test('credHelpers answers for its registry, before the file\'s own entry; credsStore for the others, the file\'s entries when it has nothing', async () => {
    const p = await file('helpers.json', {
      credHelpers: { 'registry.test': 'store' },
      credsStore: 'store',
      auths: { 'registry.test': { auth: b64('file-user:file-pw') }, 'quay.io': { auth: b64('quay-user:quay-pw') } },
    });
    const { credentials } = await loadAuthFiles([p], { env });
    const from = async (host: string) => (await credentials.credentialsFor({ host, path: 'org/app' })).candidates.map((c) => [c.auth.username, c.from]);
    assert.deepEqual(await from('registry.test'), [['keychain-user', `credential helper docker-credential-store (named in ${p})`]]);
    assert.deepEqual(await from('quay.io'), [['quay-user', `the auth file ${p} (entry quay.io)`]], 'credsStore had nothing for quay.io');
    assert.equal(credentials.scrub('said keychain-pw'), 'said [redacted]', 'a helper\'s secret is scrubbed like a file\'s');
  });

  test('a helper is run once per registry for a whole command', async () => {
    const p = await file('once.json', { credHelpers: { 'once.test': 'token' } });
    const { credentials } = await loadAuthFiles([p], { env });
    const before = (await calls()).filter((c) => c.includes('once.test')).length;
    await Promise.all([...Array(5)].map(() => credentials.credentialsFor({ host: 'once.test', path: 'a' })));
    assert.equal((await calls()).filter((c) => c.includes('once.test')).length - before, 1);
  });

  test('a helper that fails is a failure beside the lookup; the next file still counts', async () => {
    const first = await file('broken-helper.json', { credHelpers: { 'registry.test': 'broken' } });
    const second = await file('plain.json', { auths: { 'registry.test': { auth: b64('second-user:pw2') } } });
    const { credentials } = await loadAuthFiles([first, second], { env });
    const found = await credentials.credentialsFor({ host: 'registry.test', path: 'a' });
    assert.deepEqual(found.candidates.map((c) => c.auth.username), ['second-user']);
    assert.equal(found.failures.length, 1);
    assert.equal(found.failures[0]!.reason, 'CredentialHelperFailed');
    assert.match(found.failures[0]!.message, /docker-credential-broken get exited with status 3/);
  });
});
