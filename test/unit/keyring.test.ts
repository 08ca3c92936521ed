// The keyring against the kubelet's own tables of cases (Kubernetes 1.32,
// pkg/credentialprovider/keyring_test.go): URLsMatch, which decides both
// which plugin's matchImages apply to an image and which credential
// entries do; the keyring's lookups with globs, misses, Docker Hub's
// default entry, and the order of several matching entries.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { globMatch, isDefaultRegistryMatch, Keyring, parseSchemelessUrl, urlsMatch } from '../../src/registry/keyring.ts';
import { decodeDockerAuths } from '../../src/registry/auth.ts';

describe('URLsMatch: keyring_test.go TestURLsMatch', () => {
  const cases: [glob: string, target: string, match: boolean][] = [
    // match when there is no path component
    ['*.kubernetes.io', 'prefix.kubernetes.io', true],
    ['prefix.*.io', 'prefix.kubernetes.io', true],
    ['prefix.kubernetes.*', 'prefix.kubernetes.io', true],
    ['*-good.kubernetes.io', 'prefix-good.kubernetes.io', true],
    // match with path components
    ['*.kubernetes.io/blah', 'prefix.kubernetes.io/blah', true],
    ['prefix.*.io/foo', 'prefix.kubernetes.io/foo/bar', true],
    // match with path components and ports
    ['*.kubernetes.io:1111/blah', 'prefix.kubernetes.io:1111/blah', true],
    ['prefix.*.io:1111/foo', 'prefix.kubernetes.io:1111/foo/bar', true],
    // no match when number of parts mismatch
    ['*.kubernetes.io', 'kubernetes.io', false],
    ['*.*.kubernetes.io', 'prefix.kubernetes.io', false],
    ['*.*.kubernetes.io', 'kubernetes.io', false],
    ['*kubernetes.io', 'a.kubernetes.io', false],
    // match when number of parts match
    ['*kubernetes.io', 'kubernetes.io', true],
    ['*.*.*.kubernetes.io', 'a.b.c.kubernetes.io', true],
    // no match when some parts mismatch
    ['kubernetes.io', 'kubernetes.com', false],
    ['k*.io', 'quay.io', false],
    // no match when ports mismatch
    ['*.kubernetes.io:1234/blah', 'prefix.kubernetes.io:1111/blah', false],
    ['prefix.*.io/foo', 'prefix.kubernetes.io:1111/foo/bar', false],
  ];
  for (const [glob, target, match] of cases) {
    test(`${glob} ${match ? 'matches' : 'does not match'} ${target}`, () => assert.equal(urlsMatch(glob, target), match));
  }
});

/** A keyring of one entry, as a docker config names it, with the kubelet's sample credential. */
function keyringOf(key: string): Keyring {
  const k = new Keyring();
  const { entries } = decodeDockerAuths({ [key]: { email: 'foo@bar.baz', auth: Buffer.from('foo:bar').toString('base64') } }, true);
  k.add(entries, () => 'test');
  return k;
}

describe('the keyring: keyring_test.go TestDockerKeyringForGlob (each entry found for <target>/foo/bar)', () => {
  const cases: [glob: string, target: string][] = [
    ['https://hello.kubernetes.io', 'hello.kubernetes.io'],
    ['https://*.docker.io', 'prefix.docker.io'],
    ['https://prefix.*.io', 'prefix.docker.io'],
    ['https://prefix.docker.*', 'prefix.docker.io'],
    ['https://*.docker.io/path', 'prefix.docker.io/path'],
    ['https://prefix.*.io/path', 'prefix.docker.io/path/subpath'],
    ['https://prefix.docker.*/path', 'prefix.docker.io/path'],
    ['https://*.docker.io:8888', 'prefix.docker.io:8888'],
    ['https://prefix.*.io:8888', 'prefix.docker.io:8888'],
    ['https://prefix.docker.*:8888', 'prefix.docker.io:8888'],
    ['https://*.docker.io/path:1111', 'prefix.docker.io/path:1111'],
    ['https://*.docker.io/v1/', 'prefix.docker.io/path:1111'],
    ['https://*.docker.io/v2/', 'prefix.docker.io/path:1111'],
    ['https://prefix.docker.*/path:1111', 'prefix.docker.io/path:1111'],
    ['prefix.docker.io:1111', 'prefix.docker.io:1111/path'],
    ['*.docker.io:1111', 'prefix.docker.io:1111/path'],
  ];
  for (const [glob, target] of cases) {
    test(`${glob} serves ${target}/foo/bar`, () => {
      const found = keyringOf(glob).lookup(`${target}/foo/bar`);
      assert.equal(found.length, 1);
      assert.deepEqual(found[0]!.auth, { username: 'foo', password: 'bar' });
    });
  }
});

describe('the keyring: keyring_test.go TestKeyringMiss (nothing for <lookup>/foo/bar)', () => {
  const cases: [glob: string, lookup: string][] = [
    ['https://hello.kubernetes.io', 'world.mesos.org/foo/bar'],
    ['https://*.docker.com', 'prefix.docker.io'],
    ['https://suffix.*.io', 'prefix.docker.io'],
    ['https://prefix.docker.c*', 'prefix.docker.io'],
    ['https://prefix.*.io/path:1111', 'prefix.docker.io/path/subpath:1111'],
    ['suffix.*.io', 'prefix.docker.io'],
  ];
  for (const [glob, lookup] of cases) {
    test(`${glob} does not serve ${lookup}/foo/bar`, () => assert.deepEqual(keyringOf(glob).lookup(`${lookup}/foo/bar`), []));
  }
});

describe("the keyring: Docker Hub's default entry (TestKeyringMissWithDockerHubCredentials, TestKeyringHit*DockerHub, TestIsDefaultRegistryMatch)", () => {
  const hub = () => keyringOf('https://index.docker.io/v1/');
  test('it serves no other registry', () => assert.deepEqual(hub().lookup('world.mesos.org/foo/bar'), []));
  test('it serves unqualified, library and docker.io names, once each', () => {
    for (const image of ['google/docker-registry', 'jenkins', 'docker.io/library/nginx', 'index.docker.io/google/docker-registry']) {
      const found = hub().lookup(image);
      assert.equal(found.length, 1, image);
      assert.equal(found[0]!.auth.username, 'foo');
    }
  });
  const samples: [string, boolean][] = [
    ['foo/bar', true],
    ['docker.io/foo/bar', true],
    ['index.docker.io/foo/bar', true],
    ['foo', true],
    ['', false],
    ['registry.tld/foo/bar', false],
    ['registry:5000/foo/bar', false],
    ['myhostdocker.io/foo/bar', false],
  ];
  for (const [image, expected] of samples) test(`isDefaultRegistryMatch(${JSON.stringify(image)}) is ${expected}`, () => assert.equal(isDefaultRegistryMatch(image), expected));
});

describe('the keyring: every matching credential, the most specific first (TestDockerKeyringLookup, TestIssue3797)', () => {
  const k = new Keyring();
  k.add(
    [
      ['bar.example.com/pong', { username: 'grace', password: 'squash' }],
      ['bar.example.com', { username: 'ada', password: 'smash' }],
    ],
    (key) => key,
  );
  const cases: [image: string, users: string[]][] = [
    ['bar.example.com', ['ada']],
    ['bar.example.com/pong', ['grace', 'ada']],
    ['bar.example.com/ping', ['ada']],
    ['bar.example.com/pongz', ['grace', 'ada']],
    ['bar.example.com/pong/pang', ['grace', 'ada']],
    ['example.com', []],
    ['foo.example.com', []],
  ];
  for (const [image, users] of cases) test(`${image}: ${JSON.stringify(users)}`, () => assert.deepEqual(k.lookup(image).map((c) => c.auth.username), users));

  test('an entry keyed with a scheme and /v1/ serves the host and every path under it', () => {
    const rex = new Keyring();
    rex.add([['https://quay.io/v1/', { username: 'rex', password: 'tiny arms' }]], () => 'rex');
    for (const image of ['quay.io', 'quay.io/foo', 'quay.io/foo/bar']) assert.deepEqual(rex.lookup(image).map((c) => c.auth.username), ['rex'], image);
  });

  test('two sources under one key: in the order they were added', () => {
    const two = new Keyring();
    two.add([['registry.test', { username: 'from-file', password: 'a' }]], () => 'file');
    two.add([['registry.test', { username: 'from-plugin', password: 'b' }]], () => 'plugin');
    assert.deepEqual(two.lookup('registry.test/app').map((c) => c.from), ['file', 'plugin']);
  });

  test('a key Go\'s URL parser refuses is skipped, as the kubelet skips it', () => {
    const bad = new Keyring();
    const skipped = bad.add([['bad host|name', { username: 'x', password: 'y' }], ['good.test', { username: 'g', password: 'h' }]], () => 'k');
    assert.deepEqual(skipped, ['bad host|name']);
    assert.equal(bad.size, 1);
  });
});

describe("Go's parsing, as the kubelet's validation and matching use it", () => {
  test('URLs Go refuses: a space or a pipe in the host, a port that is not a number, a bad escape, a control character, a host starting with [ that is no IPv6 literal', () => {
    for (const s of ['bad host.io', 'a|b.io', 'registry.io:port', 'registry.io/%zz', 'registry.io/\nx', '[a-z].io']) assert.throws(() => parseSchemelessUrl(s), Error, s);
  });
  test('URLs Go accepts: globs, brackets inside a label, an empty port, a query, an IPv6 literal', () => {
    for (const s of ['*.dkr.ecr.*.amazonaws.com', 'x[a-z].io', 'registry.io:', 'registry.io/path?x=1', '*.azurecr.io', '[::1]:5000/app']) assert.doesNotThrow(() => parseSchemelessUrl(s), s);
  });
  test("filepath.Match: classes, negation, escapes; a malformed pattern matches nothing", () => {
    assert.equal(globMatch('[a-c]x', 'bx'), true);
    assert.equal(globMatch('[^a-c]x', 'bx'), false);
    assert.equal(globMatch('a?c', 'abc'), true);
    assert.equal(globMatch('\\*', '*'), true);
    assert.equal(typeof globMatch('[a-', 'a'), 'symbol');
    assert.equal(urlsMatch('x[a-.io', 'xa.io'), false);
    assert.equal(urlsMatch('x[a-c].io', 'xb.io'), true);
  });
  test('real providers\' matchImages', () => {
    assert.equal(urlsMatch('*.dkr.ecr.*.amazonaws.com', '123456789012.dkr.ecr.us-east-1.amazonaws.com/app'), true);
    assert.equal(urlsMatch('*.dkr.ecr.*.amazonaws.com', 'dkr.ecr.us-east-1.amazonaws.com/app'), false);
    assert.equal(urlsMatch('*.pkg.dev', 'europe-docker.pkg.dev/proj/repo/app'), true);
    assert.equal(urlsMatch('*.azurecr.io', 'myregistry.azurecr.io/app'), true);
  });
});
