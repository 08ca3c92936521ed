// containerd's registry hosts as pinset reads them, held to containerd's
// own cases: the hosts.toml of its docs (docs/hosts.md) and of its tests
// (remotes/docker/config/hosts_test.go: TestParseHostFile, TestLoadCertFiles,
// TestHTTPFallback), the folder names it looks for, the fallback to
// Docker's certificate files, and what changes when the files do.
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm, utimes, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { mirrorConfigFor } from '../../src/agent/boot/registry-access.ts';
import { containerdNeedsHostTable } from '../../src/containerd/versions.ts';
import { ContainerdHosts, ContainerdHostsError } from '../../src/registry/containerd-hosts.ts';
import { hostDirectory, hostPaths, parseHostsToml, withDefaultHost, type HostEntry } from '../../src/registry/hosts-toml.ts';
import { parseImageName, type ImageName } from '../../src/registry/names.ts';
import { sourceUrl, withHostHeaders, type PullSource } from '../../src/registry/pull-source.ts';

const ALL = ['pull', 'resolve', 'push', 'referrers'];
const DIGEST = `sha256:${'d'.repeat(64)}`;

function name(s: string): ImageName {
  const r = parseImageName(s);
  if (!r.ok) throw new Error(r.error);
  return r.value;
}

/** A host entry as containerd's tests write one: only the fields given. */
function host(scheme: string, h: string, p: string, capabilities: string[], more: Partial<HostEntry> = {}): HostEntry {
  return { scheme, host: h, path: p, capabilities: capabilities as HostEntry['capabilities'], ...more };
}

/** Where each source would send a manifest request, and whether it is a mirror. */
function urls(sources: PullSource[], ref = 'latest'): string[] {
  return sources.map((s) => `${s.connection!.schemes.join('+')} ${sourceUrl(s, s.connection!.schemes[0]!, `manifests/${ref}`)}${s.mirror ? ' (mirror)' : ''}`);
}

let tmp: string;
before(async () => {
  tmp = await mkdtemp(path.join(os.tmpdir(), 'pinset-hosts-'));
});
after(async () => {
  await rm(tmp, { recursive: true, force: true });
});

async function folder(root: string, dir: string, files: Record<string, string>): Promise<string> {
  const d = path.join(root, dir);
  await mkdir(d, { recursive: true });
  for (const [f, text] of Object.entries(files)) await writeFile(path.join(d, f), text);
  return d;
}

describe('hosts.toml, read as containerd reads it', () => {
  test("containerd's TestParseHostFile: every [host] in file order, then the server with the top-level settings", () => {
    // The file of TestParseHostFile (containerd 2.x), every table as it is there.
    const text = `
server = "https://test-default.registry"
ca = "/etc/path/default"
[header]
  x-custom-1 = "custom header"

[host."https://mirror.registry"]
  capabilities = ["pull"]
  ca = "/etc/certs/mirror.pem"
  skip_verify = false
  [host."https://mirror.registry".header]
    x-custom-2 = ["value1", "value2"]

[host."https://mirror-bak.registry/us"]
  capabilities = ["pull"]
  skip_verify = true

[host."http://mirror.registry"]
  capabilities = ["pull"]

[host."https://test-1.registry"]
  capabilities = ["pull", "resolve", "push", "referrers"]
  ca = ["/etc/certs/test-1-ca.pem", "/etc/certs/special.pem"]
  client = [["/etc/certs/client.cert", "/etc/certs/client.key"],["/etc/certs/client.pem", ""]]

[host."https://test-2.registry"]
  client = "/etc/certs/client.pem"

[host."https://test-3.registry"]
  client = ["/etc/certs/client-1.pem", "/etc/certs/client-2.pem"]

[host."https://no-referrers.registry"]
  capabilities = ["pull", "resolve", "push"]
  client = ["/etc/certs/client-1.pem", "/etc/certs/client-2.pem"]

[host."https://noncompliantmirror.registry/v2/namespaceprefix"]
  capabilities = ["pull"]
  override_path = true

[host."https://noprefixnoncompliant.registry"]
  override_path = true

[host."https://onlyheader.registry".header]
  x-custom-1 = "justaheader"

[host."https://dial-timeout.registry"]
  dial_timeout = "3s"
`;
    assert.deepEqual(parseHostsToml(text, ''), [
      host('https', 'mirror.registry', '/v2', ['pull'], { ca: ['/etc/certs/mirror.pem'], skipVerify: false, header: { 'x-custom-2': ['value1', 'value2'] } }),
      host('https', 'mirror-bak.registry', '/us/v2', ['pull'], { skipVerify: true }),
      host('http', 'mirror.registry', '/v2', ['pull']),
      host('https', 'test-1.registry', '/v2', ALL, {
        ca: ['/etc/certs/test-1-ca.pem', '/etc/certs/special.pem'],
        client: [['/etc/certs/client.cert', '/etc/certs/client.key'], ['/etc/certs/client.pem', '']],
      }),
      host('https', 'test-2.registry', '/v2', ALL, { client: [['/etc/certs/client.pem', '']] }),
      host('https', 'test-3.registry', '/v2', ALL, { client: [['/etc/certs/client-1.pem', ''], ['/etc/certs/client-2.pem', '']] }),
      host('https', 'no-referrers.registry', '/v2', ['pull', 'resolve', 'push'], { client: [['/etc/certs/client-1.pem', ''], ['/etc/certs/client-2.pem', '']] }),
      host('https', 'noncompliantmirror.registry', '/v2/namespaceprefix', ['pull']),
      host('https', 'noprefixnoncompliant.registry', '', ALL),
      host('https', 'onlyheader.registry', '/v2', ALL, { header: { 'x-custom-1': ['justaheader'] } }),
      // dial_timeout is accepted and not applied (pinset's own deadline is).
      host('https', 'dial-timeout.registry', '/v2', ALL),
      host('https', 'test-default.registry', '/v2', ALL, { ca: ['/etc/path/default'], header: { 'x-custom-1': ['custom header'] } }),
    ]);
  });

  test('paths are relative to the folder; a host without a scheme is https; capabilities are case-blind; an empty list means all', () => {
    const entries = parseHostsToml('server = "registry.example:5000"\n[host."mirror.local"]\n  capabilities = []\n  ca = "mirror.crt"\n  client = ["both.pem"]\n[host."http://10.0.0.1:5000"]\n  capabilities = ["PULL"]\n', '/etc/containerd/certs.d/docker.io');
    assert.deepEqual(entries, [
      host('https', 'mirror.local', '/v2', ALL, { ca: ['/etc/containerd/certs.d/docker.io/mirror.crt'], client: [['/etc/containerd/certs.d/docker.io/both.pem', '']] }),
      host('http', '10.0.0.1:5000', '/v2', ['pull']),
      host('https', 'registry.example:5000', '/v2', ALL),
    ]);
  });

  test('what containerd refuses is refused, naming the key: an unknown capability, a value of the wrong type, a client pair of three, bad TOML', () => {
    assert.throws(() => parseHostsToml('[host."https://m"]\n  capabilities = ["pull", "fetch"]\n', ''), /\[host\."https:\/\/m"\]: unknown capability "fetch"/);
    assert.throws(() => parseHostsToml('skip_verify = "yes"\n', ''), /server: skip_verify must be true or false/);
    assert.throws(() => parseHostsToml('[host."https://m"]\n  ca = 3\n', ''), /invalid type for .*"ca"/);
    assert.throws(() => parseHostsToml('[host."https://m"]\n  client = [["a", "b", "c"]]\n', ''), /invalid pair/);
    assert.throws(() => parseHostsToml('[host."https://m"]\n  [host."https://m".header]\n    x = 1\n', ''), /header "x"/);
    assert.throws(() => parseHostsToml('server = [', ''), /not valid TOML/);
    assert.throws(() => parseHostsToml('server = "httpx://x"', ''), /not an http or https URL/);
  });

  test("the docs' examples: a mirror for Docker Hub, a public pull-only mirror, a private one with its CA", () => {
    // docs/hosts.md, "Setup a Local Mirror for Docker".
    const text = `server = "https://registry-1.docker.io"    # Exclude this to not use upstream

[host."https://public-mirror.example.com"]
  capabilities = ["pull"]                  # Requires less trust, won't resolve tag to digest from this host
[host."https://docker-mirror.internal"]
  capabilities = ["pull", "resolve"]
  ca = "docker-mirror.crt"                 # Or absolute path /etc/containerd/certs.d/docker.io/docker-mirror.crt
`;
    assert.deepEqual(parseHostsToml(text, '/etc/containerd/certs.d/docker.io'), [
      host('https', 'public-mirror.example.com', '/v2', ['pull']),
      host('https', 'docker-mirror.internal', '/v2', ['pull', 'resolve'], { ca: ['/etc/containerd/certs.d/docker.io/docker-mirror.crt'] }),
      host('https', 'registry-1.docker.io', '/v2', ALL),
    ]);
    // "Bypass TLS Verification Example".
    assert.deepEqual(parseHostsToml('server = "https://registry-1.docker.io"\n\n[host."http://192.168.31.250:5000"]\n  capabilities = ["pull", "resolve", "push"]\n  skip_verify = true\n', ''), [
      host('http', '192.168.31.250:5000', '/v2', ['pull', 'resolve', 'push'], { skipVerify: true }),
      host('https', 'registry-1.docker.io', '/v2', ALL),
    ]);
  });
});

describe('folders, and the default host containerd fills in', () => {
  test('a host with a port: host_port_ first, then host:port, then _default (docs: "Port Handling in Registry Host")', () => {
    assert.equal(hostDirectory('myregistry.io:5000'), 'myregistry.io_5000_');
    assert.equal(hostDirectory('[::1]:5000'), '[::1]_5000_');
    assert.equal(hostDirectory('docker.io'), 'docker.io');
    assert.deepEqual(hostPaths('/etc/containerd/certs.d', 'myregistry.io:5000'), ['/etc/containerd/certs.d/myregistry.io_5000_', '/etc/containerd/certs.d/myregistry.io:5000', '/etc/containerd/certs.d/_default']);
    assert.deepEqual(hostPaths('/c', 'quay.io'), ['/c/quay.io', '/c/_default']);
  });

  test("no server: the image's own registry, as containerd's TestDefaultHosts and TestHTTPFallback have it", () => {
    const only = (h: string) => {
      const [e] = withDefaultHost([], h);
      return `${e!.scheme}://${e!.host}${e!.path} skip_verify=${e!.skipVerify ?? '-'} caps=${e!.capabilities.join(',')}`;
    };
    assert.equal(only('docker.io'), 'https://registry-1.docker.io/v2 skip_verify=- caps=pull,resolve,push,referrers');
    assert.equal(only('example.com:5000'), 'https://example.com:5000/v2 skip_verify=- caps=pull,resolve,push,referrers');
    // Loopback: plain HTTP unless on 443 or no port, certificates unchecked unless on 80.
    assert.equal(only('localhost:8080'), 'http://localhost:8080/v2 skip_verify=true caps=pull,resolve,push,referrers');
    assert.equal(only('localhost:80'), 'http://localhost:80/v2 skip_verify=- caps=pull,resolve,push,referrers');
    assert.equal(only('localhost:443'), 'https://localhost:443/v2 skip_verify=true caps=pull,resolve,push,referrers');
    assert.equal(only('localhost'), 'https://localhost/v2 skip_verify=true caps=pull,resolve,push,referrers');
    assert.equal(only('127.0.0.254:5000'), 'http://127.0.0.254:5000/v2 skip_verify=true caps=pull,resolve,push,referrers');
    assert.equal(only('[::1]:5000'), 'http://[::1]:5000/v2 skip_verify=true caps=pull,resolve,push,referrers');
  });

  test('no folder at all: the registry itself; a loopback registry on an odd port is tried over TLS first, then plain HTTP (TestHTTPFallback)', async () => {
    const hosts = new ContainerdHosts(path.join(tmp, 'empty-root'));
    assert.deepEqual(urls(await hosts.sources(name('quay.io/org/app:1'))), ['https https://quay.io/v2/org/app/manifests/latest']);
    assert.deepEqual(urls(await hosts.sources(name('docker.io/library/nginx:1'))), ['https https://registry-1.docker.io/v2/library/nginx/manifests/latest']);
    assert.deepEqual(urls(await hosts.sources(name('127.0.0.1:5000/a:1'))), ['https+http https://127.0.0.1:5000/v2/a/manifests/latest']);
    assert.deepEqual(urls(await hosts.sources(name('localhost:80/a:1'))), ['http http://localhost:80/v2/a/manifests/latest']);
  });
});

describe('the sources of an image', () => {
  test('mirrors in file order, then the server; a tag only from hosts that may resolve, a digest from every host that may pull; mirrors get ?ns=', async () => {
    const root = path.join(tmp, 'order');
    await folder(root, 'registry.example_5000_', {
      'hosts.toml': '[host."https://public-mirror.example.com"]\n  capabilities = ["pull"]\n[host."http://private-mirror.local:5000/base"]\n  capabilities = ["pull", "resolve"]\n[host."https://push-only.example.com"]\n  capabilities = ["push"]\n',
    });
    const hosts = new ContainerdHosts(root);
    assert.deepEqual(urls(await hosts.sources(name('registry.example:5000/team/app:1.0')), '1.0'), [
      'http http://private-mirror.local:5000/base/v2/team/app/manifests/1.0?ns=registry.example%3A5000 (mirror)',
      'https https://registry.example:5000/v2/team/app/manifests/1.0',
    ]);
    const byDigest = await hosts.sources(name(`registry.example:5000/team/app@${DIGEST}`));
    assert.deepEqual(urls(byDigest, DIGEST), [
      `https https://public-mirror.example.com/v2/team/app/manifests/${DIGEST}?ns=registry.example%3A5000 (mirror)`,
      `http http://private-mirror.local:5000/base/v2/team/app/manifests/${DIGEST}?ns=registry.example%3A5000 (mirror)`,
      `https https://registry.example:5000/v2/team/app/manifests/${DIGEST}`,
    ]);
    // Every host is offered the image's own registry's credentials, as the kubelet gives containerd those.
    assert.deepEqual(byDigest.map((s) => s.credentialsOf), byDigest.map(() => ({ host: 'registry.example:5000', path: 'team/app' })));
  });

  test('_default applies to every registry without a folder; the first root with a folder wins', async () => {
    const first = path.join(tmp, 'roots-1');
    const second = path.join(tmp, 'roots-2');
    await folder(first, '_default', { 'hosts.toml': 'server = "https://everything.mirror"\n' });
    await folder(second, 'quay.io', { 'hosts.toml': 'server = "https://quay.mirror"\n' });
    const both = new ContainerdHosts(`${first}:${second}`);
    assert.deepEqual(urls(await both.sources(name('quay.io/a/b:1'))), ['https https://everything.mirror/v2/a/b/manifests/latest?ns=quay.io']);
    const swapped = new ContainerdHosts([second, first]);
    assert.deepEqual(urls(await swapped.sources(name('quay.io/a/b:1'))), ['https https://quay.mirror/v2/a/b/manifests/latest?ns=quay.io']);
    assert.deepEqual(urls(await swapped.sources(name('ghcr.io/a/b:1'))), ['https https://everything.mirror/v2/a/b/manifests/latest?ns=ghcr.io']);
  });

  test('no host that may resolve: a tag is refused without asking anyone, saying which file and what to change', async () => {
    const root = path.join(tmp, 'pull-only');
    await folder(root, 'pull-only.example', { 'hosts.toml': 'server = "https://pull-only.example"\ncapabilities = ["pull"]\n' });
    const hosts = new ContainerdHosts(root);
    await assert.rejects(hosts.sources(name('pull-only.example/a:1')), (e: Error) => {
      assert.ok(e instanceof ContainerdHostsError);
      assert.match(e.message, /pull-only\.example\/hosts\.toml: no host may resolve a tag \(capabilities "pull" and "resolve"\); name the image by digest/);
      return true;
    });
    assert.equal((await hosts.sources(name(`pull-only.example/a@${DIGEST}`))).length, 1);
  });

  test('a host written http:// with TLS settings is tried over TLS first (not on port 80); its headers go with every request, after the client\'s own', async () => {
    const root = path.join(tmp, 'tls-http');
    await folder(root, 'reg.example', {
      'hosts.toml': '[host."http://m1.local:5000"]\n  skip_verify = true\n  [host."http://m1.local:5000".header]\n    accept = "application/x-extra"\n    authorization = "Bearer from-hosts-toml"\n    x-tenant = ["a", "b"]\n[host."http://m2.local:80"]\n  skip_verify = true\n',
    });
    const hosts = new ContainerdHosts(root);
    const [m1, m2] = await hosts.sources(name('reg.example/a:1'));
    assert.deepEqual(m1!.connection!.schemes, ['https', 'http']);
    assert.equal(m1!.connection!.tls?.verify, false);
    assert.deepEqual(m2!.connection!.schemes, ['http']);
    assert.deepEqual(withHostHeaders(m1!, { accept: 'application/json', 'user-agent': 'pinset' }), {
      accept: ['application/json', 'application/x-extra'],
      authorization: ['Bearer from-hosts-toml'],
      'x-tenant': ['a', 'b'],
      'user-agent': 'pinset',
    });
    // The client's own credentials replace a header written in the file.
    assert.equal(withHostHeaders(m1!, { authorization: 'Basic xyz' }).authorization, 'Basic xyz');
  });
});

describe('fallbacks and changes', () => {
  test("a folder without hosts.toml uses Docker's certificate files (TestLoadCertFiles): *.crt as CAs, *.cert with its .key", async () => {
    const root = path.join(tmp, 'certfiles');
    const pem = '-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n';
    const dir = await folder(root, 'testing.io', { 'ca.crt': pem, 'client.cert': 'x', 'client.key': 'y', 'other.cert': 'z' });
    const hosts = new ContainerdHosts(root);
    const r = await hosts.hosts('testing.io');
    assert.deepEqual(r.entries.map((e) => [e.host, e.ca, e.client]), [['testing.io', [path.join(dir, 'ca.crt')], [[path.join(dir, 'client.cert'), path.join(dir, 'client.key')], [path.join(dir, 'other.cert'), '']]]]);
    // Its client pair is not a certificate and key: containerd could not load it, so nothing is fetched.
    assert.match(r.error ?? '', /failed to load X509 key pair ".*client\.cert"/);
    await assert.rejects(hosts.sources(name('testing.io/a:1')), ContainerdHostsError);
  });

  test('a hosts.toml containerd cannot use is set aside for the certificate files, said once; a CA file that cannot be read stops the registry with containerd\'s words', async () => {
    const root = path.join(tmp, 'bad');
    const problems: string[] = [];
    await folder(root, 'bad.example', { 'hosts.toml': 'server = "https://mirror.example"\ncapabilities = ["pull", "resolv"]\n' });
    let now = 0;
    const hosts = new ContainerdHosts(root, { onProblem: (m) => problems.push(m), now: () => now });
    assert.deepEqual(urls(await hosts.sources(name('bad.example/a:1'))), ['https https://bad.example/v2/a/manifests/latest']);
    now += 5_000;
    await hosts.sources(name('bad.example/a:1'));
    assert.equal(problems.length, 1);
    assert.match(problems[0]!, /bad\.example\/hosts\.toml: server: unknown capability "resolv"; containerd does not use this file either/);

    await folder(root, 'ca.example', { 'hosts.toml': 'server = "https://ca.example"\nca = "missing.crt"\n' });
    await assert.rejects(hosts.sources(name('ca.example/a:1')), /ca\.example\/hosts\.toml: unable to read CA cert ".*ca\.example\/missing\.crt": ENOENT/);
  });

  test("an absolute certificate path is the host's: under the agent's host root it is read there, a relative one stays in the folder", async () => {
    // The DaemonSet sees the host's / at /host: a hosts.toml that says
    // ca = "/etc/containerd/certs.d/abs.example/ca.crt" means the host's file.
    const hostRoot = path.join(tmp, 'host-root');
    const pem = '-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n';
    const root = path.join(hostRoot, 'etc/containerd/certs.d');
    const dir = await folder(root, 'abs.example', {
      'hosts.toml': 'server = "https://abs.example"\nca = "/etc/containerd/certs.d/abs.example/ca.crt"\n[host."https://mirror.abs.example"]\n  ca = "ca.crt"\n',
      'ca.crt': pem,
    });
    const seen = await new ContainerdHosts(root, { hostRoot }).hosts('abs.example');
    assert.equal(seen.error, undefined);
    assert.deepEqual(seen.entries.map((e) => [e.host, e.ca]), [['mirror.abs.example', [path.join(dir, 'ca.crt')]], ['abs.example', [path.join(dir, 'ca.crt')]]]);
    assert.equal(seen.tls[1]!.ca.length, 1);
    // Read as if this process were on the host, the same file is not there.
    const onHost = await new ContainerdHosts(root).hosts('abs.example');
    assert.match(onHost.error ?? '', /unable to read CA cert "\/etc\/containerd\/certs\.d\/abs\.example\/ca\.crt": ENOENT/);
    assert.deepEqual(parseHostsToml('ca = "/etc/x.crt"\nclient = [["/etc/c.cert", "k.key"]]\n', '/host/etc/d', { hostRoot: '/host' }).map((e) => [e.ca, e.client]), [[['/host/etc/x.crt'], [['/host/etc/c.cert', '/host/etc/d/k.key']]]]);
  });

  test('a changed hosts.toml is read again once its answer is older than the recheck time; an unchanged one is not', async () => {
    const root = path.join(tmp, 'changes');
    const dir = await folder(root, 'moving.example', { 'hosts.toml': 'server = "https://first.mirror"\n' });
    let now = 0;
    const hosts = new ContainerdHosts(root, { now: () => now, recheckMs: 1_000 });
    const first = await hosts.hosts('moving.example');
    assert.equal(first.entries[0]!.host, 'first.mirror');
    await writeFile(path.join(dir, 'hosts.toml'), 'server = "https://second.mirror"\n');
    await utimes(path.join(dir, 'hosts.toml'), new Date(), new Date(Date.now() + 10_000));
    assert.equal((await hosts.hosts('moving.example')).entries[0]!.host, 'first.mirror', 'within the recheck time');
    now += 1_500;
    assert.equal((await hosts.hosts('moving.example')).entries[0]!.host, 'second.mirror');
    now += 1_500;
    const again = await hosts.hosts('moving.example');
    assert.equal(again, await hosts.hosts('moving.example'), 'unchanged: the same answer, not read again');
    // The folder removed: containerd's default again.
    await rm(dir, { recursive: true });
    now += 1_500;
    assert.deepEqual(urls(await hosts.sources(name('moving.example/a:1'))), ['https https://moving.example/v2/a/manifests/latest']);
  });
});

describe("the agent's choice of mirrors", () => {
  test('containerd: its hosts (the default folder unless one is named); CRI-O or not known yet: registries.conf; a named folder always', () => {
    assert.deepEqual(mirrorConfigFor({ name: 'containerd', version: '2.1.5' }, undefined), { containerdHosts: undefined, hostTableRequired: false });
    const k3s = '/var/lib/rancher/k3s/agent/etc/containerd/certs.d';
    assert.deepEqual(mirrorConfigFor({ name: 'containerd', version: 'v1.7.36-k3s1' }, k3s), { containerdHosts: k3s, hostTableRequired: false });
    assert.equal(mirrorConfigFor({ name: 'cri-o', version: '1.32.13' }, undefined), 'registries.conf');
    assert.equal(mirrorConfigFor({}, undefined), 'registries.conf');
    assert.deepEqual(mirrorConfigFor({ name: 'cri-o' }, '/etc/containerd/certs.d'), { containerdHosts: '/etc/containerd/certs.d', hostTableRequired: false });
  });

  test("the hosts are read as the runtime's version reads them: before 1.7.32 a hosts.toml without [host] tables is set aside", () => {
    assert.equal(containerdNeedsHostTable('1.6.20~ds1'), true);
    assert.equal(containerdNeedsHostTable('1.7.24~ds1'), true);
    assert.equal(containerdNeedsHostTable('1.7.31'), true);
    assert.equal(containerdNeedsHostTable('1.7.32'), false);
    assert.equal(containerdNeedsHostTable('2.0.0'), false);
    assert.equal(containerdNeedsHostTable('not a version'), false);
    assert.deepEqual(mirrorConfigFor({ name: 'containerd', version: '1.7.24~ds1' }, undefined), { containerdHosts: undefined, hostTableRequired: true });
    const serverOnly = 'server = "https://registry.example.com"\n';
    assert.deepEqual(parseHostsToml(serverOnly, ''), [host('https', 'registry.example.com', '/v2', ALL)]);
    assert.throws(() => parseHostsToml(serverOnly, '', { hostTableRequired: true }), /no \[host\."<url>"\] table: containerd before 1\.7\.32 cannot read/);
    // An empty [host] table is enough for them.
    assert.equal(parseHostsToml(`${serverOnly}[host]\n`, '', { hostTableRequired: true }).length, 1);
  });
});
