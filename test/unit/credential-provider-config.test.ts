// The CredentialProviderConfig as the kubelet 1.32 reads and validates it,
// against the cases of pkg/credentialprovider/plugin/config_test.go
// (Test_readCredentialProviderConfigFile, Test_validateCredentialProviderConfig),
// and the start-up checks of the bin folder (RegisterCredentialProviderPlugins).
import assert from 'node:assert/strict';
import { chmod, mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { stringify as dumpYaml } from 'yaml';
import { CredentialProviderConfigError, loadCredentialProviderConfig, parseCredentialProviderConfig, parseGoDuration } from '../../src/registry/credential-provider-config.ts';

const v1alpha1 = 'credentialprovider.kubelet.k8s.io/v1alpha1';

function config(providers: unknown[], apiVersion = 'kubelet.config.k8s.io/v1alpha1', kind = 'CredentialProviderConfig'): string {
  return dumpYaml({ kind, apiVersion, providers });
}

const provider = (over: Record<string, unknown> = {}) => ({ name: 'foobar', matchImages: ['foobar.registry.io'], defaultCacheDuration: '1m', apiVersion: v1alpha1, ...over });

describe('reading the config: config_test.go Test_readCredentialProviderConfigFile', () => {
  test('1 plugin and 1 image matcher, with args and env', () => {
    const [p] = parseCredentialProviderConfig(
      `kind: CredentialProviderConfig
apiVersion: kubelet.config.k8s.io/v1alpha1
providers:
  - name: test
    matchImages:
    - "registry.io/foobar"
    defaultCacheDuration: 10m
    apiVersion: credentialprovider.kubelet.k8s.io/v1alpha1
    args:
    - --v=5
    env:
    - name: FOO
      value: BAR
`,
      'c.yaml',
    );
    assert.deepEqual(p, { name: 'test', matchImages: ['registry.io/foobar'], defaultCacheDurationMs: 600_000, apiVersion: v1alpha1, args: ['--v=5'], env: [{ name: 'FOO', value: 'BAR' }] });
  });

  test('a wildcard, several matchers, several providers, in order', () => {
    const ps = parseCredentialProviderConfig(config([provider({ name: 'test1', matchImages: ['registry.io/*', 'foobar.registry.io/*'] }), provider({ name: 'test2' })]), 'c.yaml');
    assert.deepEqual(ps.map((p) => p.name), ['test1', 'test2']);
    assert.deepEqual(ps[0]!.matchImages, ['registry.io/*', 'foobar.registry.io/*']);
  });

  for (const [apiVersion, requests] of [
    ['kubelet.config.k8s.io/v1beta1', 'credentialprovider.kubelet.k8s.io/v1beta1'],
    ['kubelet.config.k8s.io/v1', 'credentialprovider.kubelet.k8s.io/v1'],
  ] as const) {
    test(`${apiVersion}, YAML or JSON`, () => {
      const doc = { kind: 'CredentialProviderConfig', apiVersion, providers: [provider({ apiVersion: requests })] };
      for (const text of [dumpYaml(doc), JSON.stringify(doc)]) assert.equal(parseCredentialProviderConfig(text, 'c')[0]!.apiVersion, requests);
    });
  }

  const refused: [string, string, RegExp][] = [
    ['a wrong kind', config([provider()], 'kubelet.config.k8s.io/v1alpha1', 'WrongKind'), /kind: must be CredentialProviderConfig, not "WrongKind"/],
    ['a wrong apiVersion', config([provider()], 'foobar/v1alpha1'), /apiVersion: must be one of kubelet\.config\.k8s\.io\/v1, .*not "foobar\/v1alpha1"/],
    ['a typo (an unknown field)', config([provider({ unknownField: 'should not be here' })]), /strict decoding error: unknown field "providers\[0\]\.unknownField"/],
    ['a field of the wrong type', config([provider({ args: '--v=5' })]), /providers\[0\]\.args: must be a list of strings/],
    ['a duration that is no duration', config([provider({ defaultCacheDuration: '10 minutes' })]), /defaultCacheDuration: time: unknown unit/],
    ['two documents', `${config([provider()])}---\n${config([provider()])}`, /one document expected/],
    ['YAML that does not parse', 'providers: [', /invalid YAML/],
  ];
  for (const [what, text, message] of refused) {
    test(`refused: ${what}`, () => assert.throws(() => parseCredentialProviderConfig(text, '/etc/x/config.yaml'), (e: Error) => e instanceof CredentialProviderConfigError && message.test(e.message) && e.message.includes('/etc/x/config.yaml')));
  }
});

describe('validating the config: config_test.go Test_validateCredentialProviderConfig', () => {
  const cases: [string, unknown[], RegExp | null][] = [
    ['no providers provided', [], /at least 1 item in plugins is required/],
    ['no matchImages provided', [provider({ matchImages: [] })], /at least 1 item in matchImages is required/],
    ['no default cache duration provided', [provider({ defaultCacheDuration: undefined })], /defaultCacheDuration is required/],
    ["name contains '/'", [provider({ name: 'foo/../bar' })], /provider name cannot contain '\/'/],
    ["name is '.'", [provider({ name: '.' })], /provider name cannot be '\.'/],
    ["name is '..'", [provider({ name: '..' })], /provider name cannot be '\.\.'/],
    ['name contains spaces', [provider({ name: 'foo bar' })], /provider name cannot contain spaces/],
    ['no apiVersion', [provider({ apiVersion: '' })], /apiVersion is required/],
    ['invalid apiVersion', [provider({ apiVersion: 'credentialprovider.kubelet.k8s.io/v1alpha0' })], /Unsupported value: "credentialprovider\.kubelet\.k8s\.io\/v1alpha0"/],
    ['negative default cache duration', [provider({ defaultCacheDuration: '-1m' })], /defaultCacheDuration must be greater than or equal to 0/],
    ['invalid match image', [provider({ matchImages: ['%invalid%'] })], /match image is invalid/],
    ['two providers of one name (the kubelet dies registering the second)', [provider(), provider()], /Duplicate value/],
    ['valid config', [provider()], null],
    ['a cache duration of 0 is valid: nothing cached', [provider({ defaultCacheDuration: '0' })], null],
  ];
  for (const [name, providers, problem] of cases) {
    test(name, () => {
      const text = config(providers.map((p) => Object.fromEntries(Object.entries(p as object).filter(([, v]) => v !== undefined))));
      if (!problem) return void assert.doesNotThrow(() => parseCredentialProviderConfig(text, 'c'));
      assert.throws(() => parseCredentialProviderConfig(text, 'c'), (e: Error) => problem.test(e.message));
    });
  }

  test('every problem is named at once, not one per start', () => {
    assert.throws(
      () => parseCredentialProviderConfig(config([provider({ name: 'a b', apiVersion: '' }), provider({ name: 'ok', matchImages: [] })]), 'c'),
      (e: Error) => /cannot contain spaces/.test(e.message) && /apiVersion is required/.test(e.message) && /matchImages is required/.test(e.message),
    );
  });

  test('tokenAttributes (Kubernetes 1.33) is read, and marks the provider to be skipped', () => {
    const [p] = parseCredentialProviderConfig(config([provider({ tokenAttributes: { serviceAccountTokenAudience: 'x', requireServiceAccount: true } })], 'kubelet.config.k8s.io/v1'), 'c');
    assert.equal(p!.tokenAttributes, true);
  });
});

test("durations as Go's time.ParseDuration reads them", () => {
  const ok: [string, number][] = [['10m', 600_000], ['1h30m', 5_400_000], ['0', 0], ['0s', 0], ['500ms', 500], ['1.5h', 5_400_000], ['.5s', 500], ['-1m', -60_000], ['12h', 43_200_000], ['100us', 0.1]];
  for (const [s, ms] of ok) assert.equal(parseGoDuration(s), ms, s);
  for (const s of ['', '10', 'm', '1d', '1 m', '.s', '+']) assert.throws(() => parseGoDuration(s), Error, s);
});

describe('at start, the bin folder and each plugin (RegisterCredentialProviderPlugins)', () => {
  let dir: string;
  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-cpc-'));
  });
  after(() => rm(dir, { recursive: true, force: true }));

  test('a config whose plugins are executables in the bin folder loads', async () => {
    const bin = path.join(dir, 'bin');
    await mkdir(bin, { recursive: true });
    await writeFile(path.join(bin, 'foobar'), '#!/bin/sh\n');
    await chmod(path.join(bin, 'foobar'), 0o755);
    const file = path.join(dir, 'ok.yaml');
    await writeFile(file, config([provider()]));
    assert.equal((await loadCredentialProviderConfig(file, bin))[0]!.name, 'foobar');
  });

  test('refused, each with what is wrong: no file, no bin folder, a plugin missing or not executable', async () => {
    const file = path.join(dir, 'two.yaml');
    await writeFile(file, config([provider(), provider({ name: 'missing' }), provider({ name: 'plain' })]));
    const bin = path.join(dir, 'bin2');
    await mkdir(bin, { recursive: true });
    await writeFile(path.join(bin, 'foobar'), '#!/bin/sh\n');
    await chmod(path.join(bin, 'foobar'), 0o755);
    await writeFile(path.join(bin, 'plain'), 'not executable');
    await assert.rejects(loadCredentialProviderConfig(path.join(dir, 'none.yaml'), bin), /cannot be read: ENOENT/);
    await assert.rejects(loadCredentialProviderConfig(file, path.join(dir, 'nowhere')), /bin folder .*nowhere does not exist/);
    await assert.rejects(loadCredentialProviderConfig(file, bin), (e: Error) => /bin2\/missing did not exist/.test(e.message) && /bin2\/plain did not exist as an executable file/.test(e.message));
  });
});
