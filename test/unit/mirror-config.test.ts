// `pinset mirror-config`: what it prints is read back as the runtimes read
// it. The hosts.toml through the project's reading of containerd's hosts
// (src/registry/hosts-toml.ts: the order containerd tries the hosts in);
// the CRI-O drop-in through its reading of registries.conf as
// containers/image does (src/registry/registries-conf.ts: the mirrors in
// order, then the registry); the k3s and OpenShift documents as YAML with
// their fields. That containerd 1.7 and 2.1 really pull through the printed
// hosts.toml is test/e2e/mirror-config.test.ts; that a real CRI-O pulls
// through the printed drop-in, test/crio/mirror-config.crio.ts.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { parse as parseYaml } from 'yaml';
import { parseRoute, render, run } from '../../src/cli/mirror-config.ts';
import { parseHostsToml } from '../../src/registry/hosts-toml.ts';
import { parseImageName } from '../../src/registry/names.ts';
import { loadRegistriesConf, parseRegistriesConf } from '../../src/registry/registries-conf.ts';
import { UsageError } from '../../src/util/flags.ts';

const route = (arg: string) => parseRoute(arg);
const name = (ref: string) => {
  const n = parseImageName(ref);
  assert.ok(n.ok);
  return n.value;
};

/** `pinset mirror-config ...args`: exit code and output. */
async function cli(args: string[]): Promise<{ code: number; stdout: string }> {
  let stdout = '';
  const sink = { write: (c: string) => ((stdout += c), true) } as unknown as NodeJS.WritableStream;
  const code = await run(args, { stdin: process.stdin, stdout: sink, stderr: sink });
  return { code, stdout };
}

describe('pinset mirror-config --runtime containerd', () => {
  test('the cache first (pull and resolve), the registry itself as the server last', async () => {
    const { code, stdout } = await cli(['quay.io=http://10.96.200.10:5000']);
    assert.equal(code, 0);
    const hosts = parseHostsToml(stdout, '/etc/containerd/certs.d/quay.io', { hostTableRequired: true });
    assert.deepEqual(
      hosts.map((h) => [h.scheme, h.host, h.path, h.capabilities]),
      [
        ['http', '10.96.200.10:5000', '/v2', ['pull', 'resolve']],
        ['https', 'quay.io', '/v2', ['pull', 'resolve', 'push', 'referrers']],
      ],
    );
    assert.match(stdout, /^# .*\n/, 'it says what it is and where it goes, in comments');
    assert.match(stdout, /<config_path>\/quay\.io\/hosts\.toml/);
  });

  test('Docker Hub is reached at its real host; a registry with a port gets the folder containerd looks for first', () => {
    const hub = parseHostsToml(render('containerd', [route('docker.io=https://hub-cache.example:5443')]), '/x');
    assert.deepEqual(hub.map((h) => `${h.scheme}://${h.host}`), ['https://hub-cache.example:5443', 'https://registry-1.docker.io']);
    assert.match(render('containerd', [route('registry.example.com:5000=http://10.0.0.1:5000')]), /<config_path>\/registry\.example\.com_5000_\/hosts\.toml/);
  });

  test('--server: the registry where the nodes reach it (e.g. over plain HTTP)', () => {
    const hosts = parseHostsToml(render('containerd', [route('registry.test=http://127.0.0.1:6000')], { server: 'http://127.0.0.1:5000' }), '/x');
    assert.deepEqual(hosts.map((h) => `${h.scheme}://${h.host}`), ['http://127.0.0.1:6000', 'http://127.0.0.1:5000']);
  });

  test('one registry per hosts.toml', () => {
    assert.throws(() => render('containerd', [route('quay.io=http://a:5000'), route('docker.io=http://b:5000')]), UsageError);
  });
});

describe('pinset mirror-config --runtime crio', () => {
  test('a drop-in containers/image reads as: the cache, then the registry, for tags and digests alike', async () => {
    const { code, stdout } = await cli(['--runtime', 'crio', 'quay.io=http://10.96.200.10:5000', 'registry.example.com:5000=https://cache.example']);
    assert.equal(code, 0);
    const entries = parseRegistriesConf(stdout, '50-pinset-registry-cache.conf');
    assert.equal(entries.length, 2);

    // Read as CRI-O reads its folder: the main file, then the drop-ins.
    const dir = await mkdtemp(path.join(tmpdir(), 'pinset-mirror-config-'));
    try {
      await writeFile(path.join(dir, 'registries.conf'), 'unqualified-search-registries = ["docker.io"]\n');
      await writeFile(path.join(dir, '50-pinset-registry-cache.conf'), stdout);
      const conf = await loadRegistriesConf({ file: path.join(dir, 'registries.conf'), dir, env: {} });
      for (const ref of [`quay.io/org/app@sha256:${'a'.repeat(64)}`, 'quay.io/org/app:1.2']) {
        assert.deepEqual(
          conf.sources(name(ref)).map((s) => [s.endpoint.location, s.endpoint.insecure, s.mirror, `${s.host}/${s.path}`]),
          [
            ['10.96.200.10:5000', true, true, '10.96.200.10:5000/org/app'],
            ['quay.io', false, false, 'quay.io/org/app'],
          ],
          ref,
        );
      }
      assert.deepEqual(
        conf.sources(name(`registry.example.com:5000/team/tool@sha256:${'b'.repeat(64)}`)).map((s) => [s.endpoint.location, s.endpoint.insecure]),
        [
          ['cache.example', false],
          ['registry.example.com:5000', false],
        ],
        'an https cache is verified',
      );
      assert.deepEqual(conf.sources(name('docker.io/library/nginx:1')).map((s) => s.endpoint.location), ['docker.io'], 'other registries are untouched');
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  test('--server: the location CRI-O reaches the registry at, insecure when it is plain HTTP', () => {
    const [e] = parseRegistriesConf(render('crio', [route('registry.test=http://127.0.0.1:6000')], { server: 'http://127.0.0.1:5000' }), 'x.conf');
    assert.equal(e!.prefix, 'registry.test');
    assert.equal(e!.location, '127.0.0.1:5000');
    assert.equal(e!.insecure, true);
    assert.deepEqual(e!.mirrors, [{ location: '127.0.0.1:6000', insecure: true, pullFromMirror: 'all' }]);
  });
});

describe('pinset mirror-config for platforms that own the nodes\' mirror config', () => {
  test('k3s/RKE2: registries.yaml mirrors, each registry\'s cache as its endpoint', () => {
    const doc = parseYaml(render('k3s', [route('quay.io=http://10.96.200.10:5000'), route('docker.io=https://hub-cache.example')]));
    assert.deepEqual(doc, { mirrors: { 'quay.io': { endpoint: ['http://10.96.200.10:5000'] }, 'docker.io': { endpoint: ['https://hub-cache.example'] } } });
  });

  test('OpenShift: an ImageDigestMirrorSet, the source still contacted; an HTTP cache named for insecureRegistries', () => {
    const text = render('openshift', [route('quay.io=http://10.96.200.10:5000')], { name: 'caches' });
    assert.deepEqual(parseYaml(text), {
      apiVersion: 'config.openshift.io/v1',
      kind: 'ImageDigestMirrorSet',
      metadata: { name: 'caches' },
      spec: { imageDigestMirrors: [{ source: 'quay.io', mirrors: ['10.96.200.10:5000'], mirrorSourcePolicy: 'AllowContactingSource' }] },
    });
    assert.match(text, /insecureRegistries: 10\.96\.200\.10:5000/);
  });

  test('--server has no meaning there', () => {
    assert.throws(() => render('k3s', [route('quay.io=http://a:5000')], { server: 'https://quay.io' }), /--server goes with --runtime containerd or crio/);
  });
});

describe('pinset mirror-config: bad input is refused, nothing printed', () => {
  for (const [arg, why] of [
    ['quay.io', /REGISTRY=CACHE_URL/],
    ['quay.io/org=http://a:5000', /not a registry host/],
    ['quay.io=ftp://a', /scheme must be http or https/],
    ['quay.io=http://user:pw@a:5000', /no credentials in the URL/],
    ['quay.io=http://a:5000/v2/', /scheme, host and port only/],
    ['quay.io=not a url', /not a URL/],
    ['bad host\n[x]=http://a:5000', /not a registry host/],
  ] as const) {
    test(JSON.stringify(arg), async () => {
      await assert.rejects(cli([arg]), (e: Error) => e instanceof UsageError && why.test(e.message));
    });
  }
  test('a registry given twice', () => {
    assert.throws(() => render('crio', [route('quay.io=http://a:5000'), route('quay.io=http://b:5000')]), /given twice/);
  });
});
