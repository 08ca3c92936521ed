// A kubelet credential provider plugin run by the agent as the kubelet runs
// it (src/registry/credential-provider.ts), with the test plugin
// (test/support/test-credential-provider.mjs) as a real process: what it is
// sent (the request, its args, the environment), what is cached and for how
// long by the key type it answers with (counted in its own exec log),
// concurrent requests sharing one exec, and each way a plugin goes wrong
// (an exit status, a hang, garbage, another apiVersion), with nothing left
// running and no secret in any message. Then the node's keyring: the auth
// file and the plugins, in the kubelet's order.
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { AuthFile } from '../../src/registry/auth.ts';
import type { CredentialProviderSpec } from '../../src/registry/credential-provider-config.ts';
import { CredentialProviderError, ExecCredentialProvider } from '../../src/registry/credential-provider.ts';
import { NodeCredentials } from '../../src/registry/node-credentials.ts';
import { alive, controlPlugin, groupMembers, installTestPlugin, readPluginLog, TEST_PLUGIN_NAME } from '../support/credential-plugin.ts';

let dir: string;
let binDir: string;
let n = 0;
before(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-cred-plugin-'));
  binDir = path.join(dir, 'bin');
  await installTestPlugin(binDir);
});
after(() => rm(dir, { recursive: true, force: true }));

/** A provider of the test plugin with its own exec log and control file. */
function provider(over: Partial<CredentialProviderSpec> = {}, opts: { env?: Record<string, string>; timeoutMs?: number; now?: () => number } = {}) {
  n++;
  const log = path.join(dir, `exec-${n}.log`);
  const control = path.join(dir, `control-${n}.json`);
  const spec: CredentialProviderSpec = {
    name: TEST_PLUGIN_NAME,
    matchImages: ['registry.test', '*.registry.test'],
    defaultCacheDurationMs: 600_000,
    apiVersion: 'credentialprovider.kubelet.k8s.io/v1',
    args: [],
    env: Object.entries({ TEST_PLUGIN_LOG: log, TEST_PLUGIN_CONTROL: control, TEST_PLUGIN_USERNAME: 'robot', TEST_PLUGIN_PASSWORD: 'plugin-pw-1', ...opts.env }).map(([name, value]) => ({ name, value })),
    ...over,
  };
  const p = new ExecCredentialProvider(spec, { binDir, timeoutMs: opts.timeoutMs, now: opts.now, environ: { PATH: process.env.PATH, PINSET_TEST_MARK: 'from-the-agent', TEST_PLUGIN_USERNAME: 'overridden' } });
  return { p, log: () => readPluginLog(log), control: (s: Record<string, string>) => controlPlugin(control, s) };
}

describe('what the plugin is sent', () => {
  test('the request on stdin names the repository in the provider\'s apiVersion; args as configured; the agent\'s environment overlaid by the config\'s env', async () => {
    const { p, log } = provider({ args: ['--region', 'eu-west-1'], apiVersion: 'credentialprovider.kubelet.k8s.io/v1beta1' });
    const entries = await p.provide('registry.test/team/app');
    assert.deepEqual(entries, [['registry.test', { username: 'robot', password: 'plugin-pw-1' }]]);
    const [exec] = await log();
    assert.deepEqual(exec!.request, { apiVersion: 'credentialprovider.kubelet.k8s.io/v1beta1', kind: 'CredentialProviderRequest', image: 'registry.test/team/app' });
    assert.deepEqual(exec!.args, ['--region', 'eu-west-1']);
    assert.equal(exec!.env.PINSET_TEST_MARK, 'from-the-agent', 'the agent\'s own environment');
    assert.equal(exec!.env.TEST_PLUGIN_USERNAME, 'robot', 'the config\'s env wins over the agent\'s');
    assert.equal(exec!.pgid, exec!.pid, 'the plugin leads a process group of its own');
  });

  test('matchImages: only images they match (a glob per label, the same number of labels)', () => {
    const { p } = provider();
    assert.equal(p.matches('registry.test/a'), true);
    assert.equal(p.matches('eu.registry.test/a'), true);
    assert.equal(p.matches('a.b.registry.test/a'), false);
    assert.equal(p.matches('registry.test:5000/a'), false, 'the port must match');
    assert.equal(p.matches('quay.io/a'), false);
  });
});

describe('the cache, by the key type the plugin answers with (execs counted)', () => {
  test('Image: the same repository again costs nothing; another repository of the registry execs', async () => {
    const { p, log, control } = provider();
    await control({ TEST_PLUGIN_CACHE_KEY_TYPE: 'Image' });
    await p.provide('registry.test/a');
    await p.provide('registry.test/a');
    await p.provide('registry.test/b');
    assert.deepEqual((await log()).map((e) => e.request.image), ['registry.test/a', 'registry.test/b']);
  });

  test('Registry: every repository of the registry is served from one exec; another registry execs', async () => {
    const { p, log, control } = provider();
    await control({ TEST_PLUGIN_CACHE_KEY_TYPE: 'Registry' });
    await p.provide('registry.test/a');
    await p.provide('registry.test/b');
    await p.provide('eu.registry.test/c');
    assert.deepEqual((await log()).map((e) => e.request.image), ['registry.test/a', 'eu.registry.test/c']);
  });

  test('Global: one exec serves every image', async () => {
    const { p, log, control } = provider();
    await control({ TEST_PLUGIN_CACHE_KEY_TYPE: 'Global' });
    await p.provide('registry.test/a');
    await p.provide('eu.registry.test/c');
    assert.equal((await log()).length, 1);
  });

  test('the answer\'s cacheDuration, else the provider\'s default; it expires then; 0 caches nothing', async () => {
    let now = 1_000_000;
    const { p, log, control } = provider({ defaultCacheDurationMs: 60_000 }, { now: () => now });
    await control({ TEST_PLUGIN_CACHE_KEY_TYPE: 'Image', TEST_PLUGIN_CACHE_DURATION: '5s' });
    await p.provide('registry.test/a');
    now += 5_000;
    await p.provide('registry.test/a');
    assert.equal((await log()).length, 1, 'still cached at exactly its duration');
    now += 1;
    await p.provide('registry.test/a');
    assert.equal((await log()).length, 2, 'expired: exec again');

    await control({ TEST_PLUGIN_CACHE_KEY_TYPE: 'Image' });
    await p.provide('registry.test/b');
    now += 59_000;
    await p.provide('registry.test/b');
    assert.equal((await log()).length, 3, 'no duration in the answer: the default 60s');

    await control({ TEST_PLUGIN_CACHE_KEY_TYPE: 'Image', TEST_PLUGIN_CACHE_DURATION: '0s' });
    await p.provide('registry.test/c');
    await p.provide('registry.test/c');
    assert.equal((await log()).length, 5, 'cacheDuration 0: nothing cached');
  });

  test('a provider whose defaultCacheDuration is 0 caches no answer without a duration; expired entries are purged after 15 minutes', async () => {
    let now = 1_000_000;
    const { p, log, control } = provider({ defaultCacheDurationMs: 0 }, { now: () => now });
    await control({ TEST_PLUGIN_CACHE_KEY_TYPE: 'Registry' });
    await p.provide('registry.test/a');
    await p.provide('registry.test/a');
    assert.equal((await log()).length, 2);
    await control({ TEST_PLUGIN_CACHE_KEY_TYPE: 'Image', TEST_PLUGIN_CACHE_DURATION: '1m' });
    for (const r of ['x', 'y', 'z']) await p.provide(`registry.test/${r}`);
    assert.equal(p.cacheSize, 3);
    now += 15 * 60_000 + 1;
    await p.provide('eu.registry.test/other');
    assert.equal(p.cacheSize, 1, 'the three expired entries went with the purge; the new answer is kept');
  });

  test('concurrent requests for one image share one exec; for two images of one registry, two (as the kubelet\'s singleflight is per image)', async () => {
    const { p, log, control } = provider();
    await control({ TEST_PLUGIN_CACHE_KEY_TYPE: 'Registry', TEST_PLUGIN_DELAY_MS: '200' });
    const answers = await Promise.all([...Array(5)].map(() => p.provide('registry.test/a')));
    assert.equal(answers.length, 5);
    assert.equal((await log()).length, 1);
    await Promise.all([p.provide('eu.registry.test/x'), p.provide('eu.registry.test/y')]);
    assert.equal((await log()).length, 3);
  });
});

describe('a plugin that goes wrong: a clear error, nothing cached, nothing left running, no secret in the message', () => {
  test('an exit status: the error names the plugin, the image and the status, with its stderr scrubbed', async () => {
    const { p, log, control } = provider();
    await control({ TEST_PLUGIN_MODE: 'fail', TEST_PLUGIN_STDERR: 'could not assume role; token plugin-pw-1 rejected' });
    await assert.rejects(p.provide('registry.test/a'), (e: Error) => {
      assert.ok(e instanceof CredentialProviderError);
      assert.equal(e.provider, TEST_PLUGIN_NAME);
      assert.match(e.message, /credential provider test-credential-provider failed for registry\.test\/a: exit status 1: could not assume role; token \[redacted\] rejected/);
      assert.doesNotMatch(e.message, /plugin-pw-1/, 'a secret of the config\'s env is never echoed');
      return true;
    });
    await control({});
    await p.provide('registry.test/a');
    assert.equal((await log()).length, 2, 'a failure is not cached: the next request execs again');
  });

  test('a hang: killed with its whole process group at the bound, a failure, never a stuck caller', async () => {
    const { p, log, control } = provider({}, { timeoutMs: 700 });
    await control({ TEST_PLUGIN_MODE: 'hang' });
    const started = Date.now();
    await assert.rejects(p.provide('registry.test/a'), /did not finish within 0\.7s and was killed/);
    const took = Date.now() - started;
    assert.ok(took < 5_000, `returned ${took} ms after it started`);
    const [exec] = await log();
    assert.ok(exec?.childPid, 'the plugin started a child');
    for (let i = 0; i < 50 && (alive(exec!.pid) || alive(exec!.childPid!)); i++) await sleep(20);
    assert.equal(alive(exec!.pid), false, 'the plugin is gone');
    assert.equal(alive(exec!.childPid!), false, 'its child is gone too');
    assert.deepEqual(groupMembers(exec!.pgid!), [], 'nothing is left running in its process group');
  });

  const bad: [string, RegExp][] = [
    ['garbage', /error reading GVK from response: what it printed on stdout is not JSON/],
    ['wrong-api-version', /apiVersion from credential plugin response did not match expected apiVersion:credentialprovider\.kubelet\.k8s\.io\/v1, actual apiVersion:credentialprovider\.kubelet\.k8s\.io\/v0/],
    ['bad-cache-key', /did not return a valid cacheKeyType: "Sometimes"/],
  ];
  for (const [mode, message] of bad) {
    test(`${mode}: refused without quoting what it printed`, async () => {
      const { p, control } = provider();
      await control({ TEST_PLUGIN_MODE: mode });
      await assert.rejects(p.provide('registry.test/a'), (e: Error) => message.test(e.message) && !e.message.includes('plugin-pw-1'));
      assert.equal(p.cacheSize, 0);
    });
  }
});

describe("the node's keyring: the auth file and the plugins, in the kubelet's order", () => {
  async function authFile(auths: Record<string, { username: string; password: string }>): Promise<AuthFile> {
    const file = path.join(dir, `auth-${++n}.json`);
    await writeFile(file, JSON.stringify({ auths }));
    const f = new AuthFile(file);
    await f.refresh();
    return f;
  }

  test('under one key the auth file comes first, then the plugins by name; a more specific key comes first whatever its source', async () => {
    const file = await authFile({ 'registry.test': { username: 'file-user', password: 'file-pw' } });
    const a = provider({ name: TEST_PLUGIN_NAME });
    await a.control({ TEST_PLUGIN_AUTH_KEY: 'registry.test/team', TEST_PLUGIN_USERNAME: 'team-robot' });
    const node = new NodeCredentials(file, [a.p]);
    const found = await node.credentialsFor({ host: 'registry.test', path: 'team/app' });
    assert.deepEqual(found.candidates.map((c) => [c.auth.username, c.from]), [
      ['team-robot', 'credential provider test-credential-provider'],
      ['file-user', `the auth file ${file.path} (entry registry.test)`],
    ]);
    const b = provider();
    const same = await new NodeCredentials(file, [b.p]).credentialsFor({ host: 'registry.test', path: 'other' });
    assert.deepEqual(same.candidates.map((c) => c.auth.username), ['file-user', 'robot']);
  });

  test('several matching plugins are all asked, and combined by name, as the kubelet 1.32 registers them', async () => {
    await installTestPlugin(binDir, 'a-provider');
    await installTestPlugin(binDir, 'z-provider');
    const z = provider({ name: 'z-provider' }, { env: { TEST_PLUGIN_USERNAME: 'zed' } });
    const a = provider({ name: 'a-provider' }, { env: { TEST_PLUGIN_USERNAME: 'ay' } });
    const other = provider({ name: 'z-provider', matchImages: ['quay.io'] });
    const found = await new NodeCredentials(null, [z.p, other.p, a.p]).credentialsFor({ host: 'registry.test', path: 'app' });
    assert.deepEqual(found.candidates.map((c) => [c.auth.username, c.from]), [
      ['ay', 'credential provider a-provider'],
      ['zed', 'credential provider z-provider'],
    ]);
    assert.equal((await a.log()).length, 1);
    assert.equal((await z.log()).length, 1);
    assert.equal((await other.log()).length, 0);
  });

  test('a plugin whose matchImages do not match is not asked', async () => {
    const a = provider({ matchImages: ['quay.io'] });
    const node = new NodeCredentials(await authFile({}), [a.p]);
    assert.deepEqual((await node.credentialsFor({ host: 'registry.test', path: 'a' })).candidates, []);
    assert.equal((await a.log()).length, 0);
  });

  test('a plugin that fails is a failure beside the other candidates, not an error', async () => {
    const file = await authFile({ 'registry.test': { username: 'file-user', password: 'file-pw' } });
    const a = provider();
    await a.control({ TEST_PLUGIN_MODE: 'fail', TEST_PLUGIN_STDERR: 'saw file-pw' });
    const found = await new NodeCredentials(file, [a.p]).credentialsFor({ host: 'registry.test', path: 'a' });
    assert.deepEqual(found.candidates.map((c) => c.auth.username), ['file-user']);
    assert.equal(found.failures.length, 1);
    assert.equal(found.failures[0]!.reason, 'CredentialProviderFailed');
    assert.match(found.failures[0]!.message, /exit status 1: saw \[redacted\]/, 'the auth file\'s secrets are scrubbed from a plugin\'s stderr too');
  });
});
