// containerd's registry hosts with real components: containerd 1.7 and
// pinset asked to fetch the same images through the same certs.d ask the
// same hosts for the same things; `pinset agent --once` on containerd
// sizes a batch through a hosts.toml mirror (the registry the images are
// named after does not exist) and refuses it with the figure on a small
// tmpfs image filesystem, then pulls it; `pinset resolve` and `size` with
// --containerd-hosts-dir reach a mirror, and a registry behind a private
// CA that asks for a client certificate (hosts.toml `ca` and `client`).
import assert from 'node:assert/strict';
import { copyFile, mkdir, mkdtemp, readFile, rm, statfs, writeFile } from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { stringify } from 'smol-toml';
import { parse as parseYaml, stringify as dumpYaml } from 'yaml';
import { run as resolve } from '../../src/cli/resolve.ts';
import { run as size, type SizeReport } from '../../src/cli/size.ts';
import { RegistryClient } from '../../src/registry/client.ts';
import { containerdNeedsHostTable } from '../../src/containerd/versions.ts';
import { ContainerdHosts } from '../../src/registry/containerd-hosts.ts';
import { parseImageName, type ImageName } from '../../src/registry/names.ts';
import { formatBytes } from '../../src/registry/size.ts';
import { bundledCli, runAgentOnce } from '../support/agent-process.ts';
import { runCli, runShipped } from '../support/cli-run.ts';
import { missingComponents, requireComponents, type ComponentName } from '../support/components.ts';
import { Containerd, containerdComponent, CriClient } from '../support/containerd.ts';
import { CountingProxy } from '../support/counting-proxy.ts';
import { MEDIA_TYPES, pushRandom, pushSingleLayer, type PushedImage } from '../support/images.ts';
import { makePrivateCa, type PrivateCa } from '../support/private-ca.ts';
import { freePort, Registry } from '../support/registry.ts';
import { mountTmpfs, type ScratchFs } from '../support/scratch-fs.ts';

const NEEDS_CONTAINERD: ComponentName[] = [containerdComponent('1.7'), 'runc', 'docker-registry'];
const NEEDS_CLI: ComponentName[] = ['docker-registry', 'htpasswd', 'openssl'];

function name(s: string): ImageName {
  const r = parseImageName(s);
  if (!r.ok) throw new Error(r.error);
  return r.value;
}

/** A registry host's hosts.toml in a certs.d root, from a TOML document (never by concatenation). */
async function hostsToml(root: string, folder: string, doc: Record<string, unknown>): Promise<string> {
  const dir = path.join(root, folder);
  await mkdir(dir, { recursive: true });
  await writeFile(path.join(dir, 'hosts.toml'), stringify(doc));
  return dir;
}

/** A loopback server that must never be asked: it counts, and answers 500. */
async function trap(): Promise<{ host: string; calls: () => number; seen: string[]; close: () => Promise<void> }> {
  let calls = 0;
  const seen: string[] = [];
  const srv = http.createServer((req, res) => {
    calls++;
    seen.push(`${req.method} ${req.url} ${req.headers['user-agent']}`);
    res.writeHead(500).end();
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  return {
    host: `127.0.0.1:${(srv.address() as AddressInfo).port}`,
    calls: () => calls,
    seen,
    close: async () => {
      srv.closeAllConnections();
      await new Promise<void>((r) => srv.close(() => r()));
    },
  };
}

/** The manifest requests a proxy saw, as "METHOD path". */
const manifestRequests = (p: CountingProxy) => p.requests.filter((r) => r.path.includes('/manifests/')).map((r) => `${r.method} ${r.path}`);

describe('containerd 1.7 and pinset ask the same hosts', () => {
  let registry: Registry;
  let containerd: Containerd;
  let cri: CriClient;
  const proxies: CountingProxy[] = [];
  let ready = false;

  before(async () => {
    if (missingComponents(NEEDS_CONTAINERD).length > 0 || process.getuid?.() !== 0) return;
    registry = await Registry.start();
    containerd = await Containerd.start({ version: '1.7' });
    cri = new CriClient(containerd.endpoint);
    ready = true;
  });
  after(async () => {
    cri?.close();
    await containerd?.stop();
    for (const p of proxies) await p.stop();
    await registry?.stop();
  });

  test('a host with a port: <host>_<port>_ over <host>:<port>; a tag resolved by the mirror that may resolve, the content fetched from the pull-only one first; each told ?ns=', async (t) => {
    if (!requireComponents(t, NEEDS_CONTAINERD) || !ready) return;
    const [pullOnly, resolving, ignored] = [await CountingProxy.start(registry.url), await CountingProxy.start(registry.url), await CountingProxy.start(registry.url)];
    proxies.push(pullOnly, resolving, ignored);
    const img = await pushSingleLayer(registry, 'agree/app', { host: 'agree.test:5000', tag: '1' });
    await hostsToml(containerd.certsDir, 'agree.test_5000_', {
      server: `https://127.0.0.1:${await freePort()}`,
      host: {
        [`http://${pullOnly.hostPort}`]: { capabilities: ['pull'] },
        [`http://${resolving.hostPort}`]: { capabilities: ['pull', 'resolve'] },
      },
    });
    await hostsToml(containerd.certsDir, 'agree.test:5000', { server: `http://${ignored.hostPort}` });

    await cri.pullImage('agree.test:5000/agree/app:1');
    const byContainerd = { pullOnly: manifestRequests(pullOnly), resolving: manifestRequests(resolving), ignored: manifestRequests(ignored) };
    for (const p of [pullOnly, resolving, ignored]) p.requests.length = 0;

    const client = new RegistryClient({ containerdHosts: new ContainerdHosts(containerd.certsDir), attempts: 1 });
    try {
      const head = await client.head(name('agree.test:5000/agree/app:1'));
      assert.equal(head.digest, img.digest);
      await client.manifest(name(img.ref));
    } finally {
      await client.close();
    }
    const byPinset = { pullOnly: manifestRequests(pullOnly), resolving: manifestRequests(resolving), ignored: manifestRequests(ignored) };

    const ns = '?ns=agree.test%3A5000';
    assert.deepEqual(byContainerd.resolving, [`HEAD /v2/agree/app/manifests/1${ns}`], 'containerd resolved the tag at the mirror that may resolve');
    assert.deepEqual(byContainerd.pullOnly, [`GET /v2/agree/app/manifests/${img.digest}${ns}`], 'and fetched the manifest from the pull-only mirror');
    assert.deepEqual(byContainerd.ignored, []);
    assert.deepEqual(byPinset, byContainerd, 'pinset asked each host what containerd asked it');
  });

  test('a hosts.toml with a server and no [host] table: containerd 1.7.24 sets it aside and goes to the registry itself, and so does pinset told that version', async (t) => {
    if (!requireComponents(t, NEEDS_CONTAINERD) || !ready) return;
    const mirror = await CountingProxy.start(registry.url);
    proxies.push(mirror);
    const img = await pushSingleLayer(registry, 'server-only/app', { host: 'server-only.test' });
    await hostsToml(containerd.certsDir, 'server-only.test', { server: `http://${mirror.hostPort}` });
    await assert.rejects(cri.pullImage(img.ref), /failed to resolve reference .*Head "https:\/\/server-only\.test\/v2\/server-only\/app\/manifests\//);
    assert.deepEqual(mirror.requests, [], 'containerd did not use the server');
    const problems: string[] = [];
    const asThisVersion = new ContainerdHosts(containerd.certsDir, { hostTableRequired: containerdNeedsHostTable(await containerd.version()), onProblem: (m) => problems.push(m) });
    const sources = await asThisVersion.sources(name(img.ref));
    assert.deepEqual(sources.map((s) => `${s.connection!.schemes[0]}://${s.host}`), ['https://server-only.test']);
    assert.match(problems.join('\n'), /server-only\.test\/hosts\.toml: no \[host\."<url>"\] table: containerd before 1\.7\.32 cannot read/);
    // As 2.x and 1.7.32 read it: the server.
    assert.deepEqual((await new ContainerdHosts(containerd.certsDir).sources(name(img.ref))).map((s) => s.host), [mirror.hostPort]);
  });

  test('where they differ: containerd fetches content by digest from every host in order, even one without "pull" (its fetcher does not filter); pinset asks only hosts that may pull', async (t) => {
    if (!requireComponents(t, NEEDS_CONTAINERD) || !ready) return;
    const noPull = await trap();
    const mirror = await CountingProxy.start(registry.url);
    proxies.push(mirror);
    try {
      const img = await pushSingleLayer(registry, 'differ/app', { host: 'differ.test' });
      await hostsToml(containerd.certsDir, 'differ.test', {
        server: `https://127.0.0.1:${await freePort()}`,
        host: { [`http://${noPull.host}`]: { capabilities: ['push'] }, [`http://${mirror.hostPort}`]: { capabilities: ['pull', 'resolve'] } },
      });
      await cri.pullImage(img.ref);
      const ns = '?ns=differ.test';
      // containerd resolved the digest at the mirror only, then asked the push-only host first for each blob (it answers 500).
      assert.deepEqual(manifestRequests(mirror).filter((r) => r.startsWith('HEAD')), [`HEAD /v2/differ/app/manifests/${img.digest}${ns}`]);
      assert.ok(noPull.seen.some((r) => r.startsWith(`GET /v2/differ/app/manifests/${img.digest}${ns} containerd/`)), JSON.stringify(noPull.seen));
      const asked = noPull.calls();
      const client = new RegistryClient({ containerdHosts: new ContainerdHosts(containerd.certsDir), attempts: 1 });
      try {
        await client.manifest(name(img.ref));
        await (await client.blob(name(img.ref), img.id)).body.resume();
      } finally {
        await client.close();
      }
      assert.equal(noPull.calls(), asked, 'pinset did not ask the host without "pull"');
    } finally {
      await noPull.close();
    }
  });
});

describe('pinset agent --once on containerd: a hosts.toml mirror feeds the disk estimate', () => {
  let work: string;
  let imageFs: ScratchFs | string;
  let registry: Registry;
  let mirror: CountingProxy;
  let elsewhere: Awaited<ReturnType<typeof trap>>;
  let noPull: Awaited<ReturnType<typeof trap>>;
  let containerd: Containerd;
  let cri: CriClient;
  let ready = false;

  before(async () => {
    if (missingComponents(NEEDS_CONTAINERD).length > 0 || process.getuid?.() !== 0) return;
    work = await mkdtemp(path.join(os.tmpdir(), 'pinset-e2e-hosts-'));
    // containerd's whole root on a 96 MiB tmpfs: ImageFsInfo names it, and the agent measures it.
    imageFs = await mountTmpfs(path.join(work, 'imagefs'), 96 * 1024 * 1024);
    if (typeof imageFs === 'string') return;
    registry = await Registry.start();
    mirror = await CountingProxy.start(registry.url);
    elsewhere = await trap();
    noPull = await trap();
    containerd = await Containerd.start({ version: '1.7', root: path.join(imageFs.path, 'containerd') });
    cri = new CriClient(containerd.endpoint);
    ready = true;
  });
  after(async () => {
    cri?.close();
    await containerd?.stop();
    await mirror?.stop();
    await elsewhere?.close();
    await noPull?.close();
    await registry?.stop();
    if (imageFs && typeof imageFs !== 'string') await imageFs.unmount();
    if (work) await rm(work, { recursive: true, force: true });
  });

  test('the estimate asks the mirror hosts.toml names (air-gapped.test does not exist, its server does not answer): NoSpace with the figure, nothing pulled; with room, containerd pulls through the same mirror', async (t) => {
    if (!requireComponents(t, NEEDS_CONTAINERD)) return;
    if (typeof imageFs === 'string') return t.skip(imageFs);
    assert.ok(ready);
    const big: PushedImage = await pushRandom(registry, 'edge/big', 24 * 1024 * 1024, { host: 'air-gapped.test:5000' });
    await hostsToml(containerd.certsDir, 'air-gapped.test_5000_', {
      server: `https://127.0.0.1:${await freePort()}`,
      host: {
        // Without "pull": pinset never asks it (containerd's fetcher does, for content by digest: see above).
        [`http://${noPull.host}`]: { capabilities: ['resolve'] },
        [`http://${mirror.hostPort}`]: { capabilities: ['pull', 'resolve'] },
      },
    });
    // registries.conf sends the name elsewhere: on containerd the agent reads containerd's hosts instead.
    const registriesConf = path.join(work, 'registries.conf');
    await writeFile(registriesConf, stringify({ registry: [{ prefix: 'air-gapped.test:5000', location: elsewhere.host, insecure: true }] }));
    const staticDir = path.join(work, 'sets.d');
    await mkdir(staticDir, { recursive: true });
    await writeFile(path.join(staticDir, 'edge.yaml'), dumpYaml({ apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name: 'edge' }, spec: { pinnedImages: [{ name: big.ref }] } }));
    const manifest = (await (await fetch(`${registry.url}/v2/edge/big/manifests/${big.digest}`, { headers: { accept: MEDIA_TYPES.manifest } })).json()) as { config: { size: number }; layers: { size: number }[] };
    const download = manifest.config.size + manifest.layers.reduce((n, l) => n + l.size, 0);
    const flags = (factor: number) => [
      '--node-name', 'hosts-node', '--static-dir', staticDir, '--cri-endpoint', containerd.endpoint, '--pin-backend', 'containerd',
      '--state-dir', path.join(work, 'state'), '--crio-dropin-dir', path.join(work, 'no-crio', 'crio.conf.d'), '--auth-file', path.join(work, 'none.json'),
      '--metrics-addr', '', '--containerd-hosts-dir', containerd.certsDir, '--registries-conf', registriesConf, '--registries-conf-dir', path.join(work, 'none.d'),
      '--disk-estimate-factor', String(factor),
    ];

    // 24 MiB x 4 does not fit below 85% of 96 MiB.
    const refused = await runAgentOnce(flags(4), { cli: await bundledCli() });
    assert.equal(refused.code, 1, refused.stderr);
    const s = refused.sets[0]!;
    assert.equal(s.reason, 'NoSpace', JSON.stringify(s));
    assert.equal(s.estimatedBytes, Math.ceil(download * 4), 'the estimate is the mirror\'s manifest x the factor');
    assert.match(s.message!, new RegExp(`needs ${formatBytes(Math.ceil(download * 4)).replace('.', '\\.')}, [\\d.]+ MiB free below the 85% watermark on ${imageFs.path.replaceAll('/', '\\/')}\\/containerd`));
    assert.deepEqual(await cri.listImages().then((l) => l.filter((i) => i.repoDigests.includes(big.ref))), [], 'nothing pulled');
    assert.ok(manifestRequests(mirror).some((r) => r === `GET /v2/edge/big/manifests/${big.digest}?ns=air-gapped.test%3A5000`), `the mirror was asked: ${JSON.stringify(mirror.requests)}`);
    assert.match(refused.stderr, /size estimates ask the registries as containerd does/);

    // x2 fits: containerd pulls it through the same hosts.toml and pins it.
    const pulled = await runAgentOnce(flags(2), { cli: await bundledCli() });
    assert.equal(pulled.code, 0, pulled.stderr);
    assert.equal(pulled.sets[0]!.phase, 'Ready');
    assert.equal(pulled.sets[0]!.images?.pinned, 1);
    assert.ok(mirror.layerGets() >= 1, 'containerd downloaded the layer from the mirror');
    assert.equal(elsewhere.calls(), 0, `registries.conf's location was not asked: ${JSON.stringify(elsewhere.seen)}`);
    assert.deepEqual(noPull.seen.filter((r) => / pinset/.test(r)), [], 'pinset never asked the host without "pull"');
    const used = await statfs(imageFs.path);
    assert.ok((used.blocks - used.bfree) * used.bsize > 24 * 1024 * 1024, 'the image landed on the tmpfs');
  });
});


describe('pinset resolve and size with --containerd-hosts-dir', () => {
  const CREDS = { username: 'ci', password: 'hosts-pw-51c8' };
  let tmp: string;
  let plain: Registry;
  let secure: Registry;
  let pki: PrivateCa;
  let app: PushedImage;
  let secret: PushedImage;
  let roots: { full: string; noCa: string; noClient: string };
  let auth: string;
  const ok = () => missingComponents(NEEDS_CLI).length === 0;

  before(async () => {
    if (!ok()) return;
    tmp = await mkdtemp(path.join(os.tmpdir(), 'pinset-hosts-cli-'));
    pki = await makePrivateCa(tmp);
    plain = await Registry.start();
    // Signed by the private CA, asking every client for a certificate the CA signed, and for a password.
    secure = await Registry.start({ auth: CREDS, tls: { certificate: pki.server.cert, key: pki.server.key, clientCas: [pki.ca], probeClient: pki.client } });
    app = await pushSingleLayer(plain, 'org/app', { host: 'mirror.test', tag: '1.0' });
    secret = await pushThroughClientCert(pki, () => pushSingleLayer(secure, 'team/secret', { host: 'private.test', tag: 'prod' }));
    const closed = await freePort();
    const root = async (label: string, secureHost: Record<string, unknown>) => {
      const r = path.join(tmp, label);
      await hostsToml(r, 'mirror.test', { server: `https://127.0.0.1:${closed}`, host: { [`http://${plain.host}`]: { capabilities: ['pull', 'resolve'] } } });
      const dir = await hostsToml(r, 'private.test', { server: `https://${secure.host}`, ...secureHost });
      // The files sit in the host's folder, named relative to it as containerd's docs show.
      for (const [f, from] of [['ca.crt', pki.ca], ['client.cert', pki.client.cert], ['client.key', pki.client.key]] as const) await copyFile(from, path.join(dir, f));
      return r;
    };
    roots = {
      full: await root('full', { ca: 'ca.crt', client: [['client.cert', 'client.key']] }),
      noCa: await root('no-ca', { client: [['client.cert', 'client.key']] }),
      noClient: await root('no-client', { ca: 'ca.crt' }),
    };
    // Credentials under the image's registry name: containerd hands those to whichever host it asks.
    auth = path.join(tmp, 'auth.json');
    await writeFile(auth, JSON.stringify({ auths: { 'private.test': { auth: Buffer.from(`${CREDS.username}:${CREDS.password}`).toString('base64') } } }));
  });
  after(async () => {
    await plain?.stop();
    await secure?.stop();
    if (tmp) await rm(tmp, { recursive: true, force: true });
  });

  const list = 'mirror.test/org/app:1.0\nprivate.test/team/secret:prod\n';

  test('resolve: tags become digests through the mirror and through the registry behind a private CA with a client certificate; registries.conf is not read', async (t) => {
    if (!requireComponents(t, NEEDS_CLI)) return;
    const r = await runCli(resolve, ['--containerd-hosts-dir', roots.full, '--registries-conf', path.join(tmp, 'does-not-exist.conf'), '--auth-file', auth, '--name', 'edge', '-'], list);
    assert.equal(r.code, 0, r.stderr);
    const set = parseYaml(r.stdout) as { metadata: { name: string }; spec: { pinnedImages: { name: string }[] } };
    assert.deepEqual(set.spec.pinnedImages.map((i) => i.name), [app.ref, secret.ref]);
  });

  test('size: each image sized from the hosts containerd would ask', async (t) => {
    if (!requireComponents(t, NEEDS_CLI)) return;
    const r = await runCli(size, ['--containerd-hosts-dir', roots.full, '--auth-file', auth, '-o', 'json', '-'], `${app.ref}\n${secret.ref}\n`);
    assert.equal(r.code, 0, r.stderr);
    const report = JSON.parse(r.stdout) as SizeReport;
    assert.deepEqual(report.images.map((i) => [i.image, i.downloadBytes > 0]), [[app.ref, true], [secret.ref, true]]);
  });

  test("without hosts.toml's ca the private CA's certificate is refused, saying where the CA goes; without client, the registry refuses the connection", async (t) => {
    if (!requireComponents(t, NEEDS_CLI)) return;
    const noCa = await runCli(resolve, ['--containerd-hosts-dir', roots.noCa, '--auth-file', auth, '--timeout', '5s', '-'], 'private.test/team/secret:prod\n');
    assert.equal(noCa.code, 1);
    assert.match(noCa.stderr, /private\.test\/team\/secret:prod: 127\.0\.0\.1:\d+ cannot be reached over TLS: .*\(a host signed by a private CA needs that CA in its hosts\.toml \(ca = "<file>"\)/);
    const noClient = await runCli(resolve, ['--containerd-hosts-dir', roots.noClient, '--auth-file', auth, '--timeout', '5s', '-'], 'private.test/team/secret:prod\n');
    assert.equal(noClient.code, 1);
    assert.match(noClient.stderr, /private\.test\/team\/secret:prod: 127\.0\.0\.1:\d+ cannot be reached/);
    assert.doesNotMatch(noClient.stderr + noCa.stderr, new RegExp(CREDS.password));
  });

  test('a folder that is not there is a usage error; the environment twin works in the shipped bundle', async (t) => {
    if (!requireComponents(t, NEEDS_CLI)) return;
    await assert.rejects(runCli(resolve, ['--containerd-hosts-dir', path.join(tmp, 'nope'), '-'], list), (e: Error) => e.name === 'UsageError' && /--containerd-hosts-dir: .*nope is not a folder \(ENOENT\)/.test(e.message));
    const out = await runShipped(['resolve', '--auth-file', auth, '-'], { PINSET_CONTAINERD_HOSTS_DIR: roots.full }, list);
    assert.equal(out.code, 0, out.stderr);
    assert.deepEqual((parseYaml(out.stdout) as { spec: { pinnedImages: { name: string }[] } }).spec.pinnedImages.map((i) => i.name), [app.ref, secret.ref]);
  });
});


/** Push with the test's client certificate and without checking the private CA (the helpers push with global fetch). */
async function pushThroughClientCert<T>(pki: PrivateCa, push: () => Promise<T>): Promise<T> {
  const { Agent, setGlobalDispatcher, getGlobalDispatcher } = await import('undici');
  const before = getGlobalDispatcher();
  const agent = new Agent({ connect: { ca: await readFile(pki.ca), cert: await readFile(pki.client.cert), key: await readFile(pki.client.key) } });
  setGlobalDispatcher(agent);
  try {
    return await push();
  } finally {
    setGlobalDispatcher(before);
    await agent.close();
  }
}
