// `pinset resolve` and `pinset size` against real registries on loopback,
// reached through a registries.conf that maps made-up hosts to them, as a
// site's mirror configuration does.
import assert from 'node:assert/strict';
import { chmod, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { parse, parseAllDocuments } from 'yaml';
import { validateSet } from '../../src/api/validate.ts';
import { run as resolve } from '../../src/cli/resolve.ts';
import { run as size, type SizeReport } from '../../src/cli/size.ts';
import { missingComponents, requireComponents, type ComponentName } from '../support/components.ts';
import { layerOf, MEDIA_TYPES, pushLayers, pushMultiArch, pushRandom, pushSingleLayer, type PushedImage, type PushedIndex } from '../support/images.ts';
import { Registry } from '../support/registry.ts';
import { makeCertificate } from '../support/token-server.ts';
import { runCli, runShipped } from '../support/cli-run.ts';

const NEEDS: ComponentName[] = ['docker-registry', 'htpasswd', 'openssl'];
const CREDS = { username: 'ci', password: 'resolve-pw-6d21' };



/** config + layers of a pushed manifest, read from the registry's raw JSON. */
async function blobBytes(reg: Registry, repo: string, digest: string): Promise<{ total: number; digests: Map<string, number> }> {
  const res = await fetch(`${reg.url}/v2/${repo}/manifests/${digest}`, { headers: { accept: `${MEDIA_TYPES.manifest}, ${MEDIA_TYPES.index}` } });
  const doc = (await res.json()) as { config: { digest: string; size: number }; layers: { digest: string; size: number }[] };
  const digests = new Map([doc.config, ...doc.layers].map((d) => [d.digest, d.size]));
  return { total: doc.config.size + doc.layers.reduce((n, l) => n + l.size, 0), digests };
}

describe('pinset resolve and size against real registries', () => {
  let tmp: string;
  let reg: Registry;
  let priv: Registry;
  let conf: string;
  let auth: string;
  let app: PushedImage;
  let multi: PushedIndex;
  let secret: PushedImage;
  let shared: { a: PushedImage; b: PushedImage };
  const ok = () => missingComponents(NEEDS).length === 0;

  before(async () => {
    if (!ok()) return;
    tmp = await mkdtemp(path.join(os.tmpdir(), 'pinset-resolve-'));
    reg = await Registry.start();
    priv = await Registry.start({ auth: CREDS });
    app = await pushSingleLayer(reg, 'org/app', { tag: '1.0' });
    multi = await pushMultiArch(reg, 'org/multi', undefined, { tag: 'v2' });
    secret = await pushSingleLayer(priv, 'team/secret', { tag: 'prod' });
    // Two images sharing a 200 KiB base layer.
    const base = layerOf([{ name: 'base.bin', data: Buffer.alloc(200 * 1024, 7) }]);
    shared = {
      a: await pushLayers(reg, 'org/a', [base, layerOf([{ name: 'a.txt', data: Buffer.from('a') }])], { tag: '1' }),
      b: await pushLayers(reg, 'org/b', [base, layerOf([{ name: 'b.txt', data: Buffer.from('b') }])], { tag: '1' }),
    };
    conf = path.join(tmp, 'registries.conf');
    await writeFile(
      conf,
      `[[registry]]\nprefix = "registry.test"\nlocation = "${reg.host}"\ninsecure = true\n\n[[registry]]\nprefix = "private.test"\nlocation = "${priv.host}"\ninsecure = true\n`,
    );
    auth = path.join(tmp, 'auth.json');
    await writeFile(auth, JSON.stringify({ auths: { [priv.host]: { auth: Buffer.from(`${CREDS.username}:${CREDS.password}`).toString('base64') } } }));
  });

  after(async () => {
    await reg?.stop();
    await priv?.stop();
    if (tmp) await rm(tmp, { recursive: true, force: true });
  });

  const common = () => ['--registries-conf', conf, '--registries-conf-dir', path.join(tmp, 'no.d'), '--auth-file', auth];

  test('resolve: tags in sets and in a plain list become digests (the index digest for a multi-arch image); everything else is kept', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const sets = path.join(tmp, 'sets.yaml');
    await writeFile(
      sets,
      `apiVersion: pinset.dev/v1alpha1
kind: PinnedImageSet
metadata: {name: web, resourceVersion: "12", labels: {team: web}}
spec:
  nodeSelector: {matchLabels: {role: web}}
  runtimeHandler: kata
  pinnedImages:
  - name: registry.test/org/app:1.0
  - name: registry.test/org/multi:v2
  - name: registry.test/org/app@${app.digest}
status: {observedGeneration: 3}
`,
    );
    const list = path.join(tmp, 'Edge Images.txt');
    await writeFile(list, `# what the edge runs\nprivate.test/team/secret:prod\n\nregistry.test/org/app:1.0   # twice\nregistry.test/org/app:1.0\n`);
    const r = await runCli(resolve, [...common(), sets, list]);
    assert.equal(r.code, 0, r.stderr);
    const docs = parseAllDocuments(r.stdout).map((d) => d.toJS());
    assert.equal(docs.length, 2);
    const [web, edge] = docs;
    assert.deepEqual(web.metadata, { name: 'web', labels: { team: 'web' } });
    assert.equal(web.status, undefined);
    assert.deepEqual(web.spec.nodeSelector, { matchLabels: { role: 'web' } });
    assert.equal(web.spec.runtimeHandler, 'kata');
    // The tag and the digest of app name one image: it appears once.
    assert.deepEqual(web.spec.pinnedImages, [{ name: `registry.test/org/app@${app.digest}` }, { name: `registry.test/org/multi@${multi.digest}` }]);
    assert.equal(edge.metadata.name, 'edge-images');
    assert.deepEqual(edge.spec.pinnedImages, [{ name: `private.test/team/secret@${secret.digest}` }, { name: `registry.test/org/app@${app.digest}` }]);
    for (const d of docs) assert.deepEqual(validateSet(d).errors, []);
  });

  test('resolve --platform pins that platform\'s manifest; -o json prints one object per set', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const r = await runCli(resolve, [...common(), '--platform', 'linux/arm64', '--name', 'arm', '-o', 'json', '-'], 'registry.test/org/multi:v2\n');
    assert.equal(r.code, 0, r.stderr);
    const set = JSON.parse(r.stdout);
    assert.equal(set.metadata.name, 'arm');
    assert.deepEqual(set.spec.pinnedImages, [{ name: `registry.test/org/multi@${multi.platforms['linux/arm64']!.manifestDigest}` }]);
    const bad = await runCli(resolve, [...common(), '--platform', 'linux/s390x', '-'], 'registry.test/org/multi:v2\n');
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /has no image for linux\/s390x \(it has linux\/amd64, linux\/arm64\)/);
  });

  test('resolve: an image that cannot be resolved fails the run, says where it was written and what the registry said, and prints nothing', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const sets = path.join(tmp, 'broken.yaml');
    await writeFile(sets, `apiVersion: pinset.dev/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: broken}\nspec:\n  pinnedImages:\n  - name: registry.test/org/app:1.0\n  - name: registry.test/org/app:missing\n  - name: nginx:latest\n`);
    const r = await runCli(resolve, [...common(), sets]);
    assert.equal(r.code, 1);
    assert.equal(r.stdout, '');
    assert.match(r.stderr, /broken\.yaml: document 1 \(set broken\): spec\.pinnedImages\[1\]\.name: registry\.test\/org\/app:missing: 127\.0\.0\.1:\d+ answered HTTP 404: the manifest is unknown/);
    assert.match(r.stderr, /spec\.pinnedImages\[2\]\.name: "nginx:latest" has no registry host .* docker\.io\/library\/nginx:latest/);
    // Without the credentials the private registry refuses, naming who asked.
    const noAuth = await runCli(resolve, ['--registries-conf', conf, '--registries-conf-dir', path.join(tmp, 'no.d'), '--auth-file', path.join(tmp, 'none.json'), '-'], 'private.test/team/secret:prod\n');
    assert.equal(noAuth.code, 1);
    assert.match(noAuth.stderr, /<stdin>:1: private\.test\/team\/secret:prod: 127\.0\.0\.1:\d+ refused anonymous access/);
    const unreadable = await runCli(resolve, [...common(), path.join(tmp, 'does-not-exist.yaml')]).catch((e: Error) => ({ code: 2, stdout: '', stderr: e.message }));
    assert.match(unreadable.stderr, /cannot read .*does-not-exist\.yaml: no such file/);
  });

  test('resolve --release: the payload\'s images and the release image itself, read from its layers', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const refs = {
      kind: 'ImageStream',
      apiVersion: 'image.openshift.io/v1',
      metadata: { name: '4.99.1', creationTimestamp: null },
      spec: {
        lookupPolicy: { local: false },
        tags: [
          { name: 'cli', from: { kind: 'DockerImage', name: `registry.test/org/app@${app.digest}` } },
          { name: 'installer', from: { kind: 'DockerImage', name: `registry.test/org/multi@${multi.digest}` } },
          { name: 'tools', from: { kind: 'DockerImage', name: 'registry.test/org/a:1' } },
        ],
      },
    };
    // A base layer, then the layer with the release manifests (as a release image is built).
    const baseLayer = layerOf([{ name: 'usr/bin/cluster-version-operator', data: Buffer.alloc(64 * 1024, 1) }]);
    const manifests = layerOf([
      { name: 'release-manifests/0000_00_cluster-version-operator_00_namespace.yaml', data: Buffer.from('kind: Namespace\n') },
      { name: 'release-manifests/image-references', data: Buffer.from(JSON.stringify(refs)) },
      { name: 'release-manifests/release-metadata', data: Buffer.from('{"version":"4.99.1"}') },
    ]);
    const release = await pushLayers(reg, 'ocp/release', [baseLayer, manifests], { tag: '4.99.1-x86_64' });
    const r = await runCli(resolve, [...common(), '--release', 'registry.test/ocp/release:4.99.1-x86_64']);
    assert.equal(r.code, 0, r.stderr);
    const set = parse(r.stdout);
    assert.equal(set.metadata.name, 'release-4.99.1');
    assert.deepEqual(
      set.spec.pinnedImages.map((i: { name: string }) => i.name),
      [`registry.test/ocp/release@${release.digest}`, `registry.test/org/app@${app.digest}`, `registry.test/org/multi@${multi.digest}`, `registry.test/org/a@${shared.a.digest}`],
    );
    // An image without the file is not a release image.
    const notRelease = await runCli(resolve, [...common(), '--release', 'registry.test/org/app:1.0']);
    assert.equal(notRelease.code, 1);
    assert.match(notRelease.stderr, /has no release-manifests\/image-references: is it an OpenShift release image\?/);
    // A later layer that deletes the file hides it.
    const whiteout = layerOf([{ name: 'release-manifests/.wh.image-references', data: Buffer.alloc(0) }]);
    await pushLayers(reg, 'ocp/release', [baseLayer, manifests, whiteout], { tag: 'deleted' });
    const deleted = await runCli(resolve, [...common(), '--release', 'registry.test/ocp/release:deleted']);
    assert.equal(deleted.code, 1);
    assert.match(deleted.stderr, /has no release-manifests\/image-references/);
  });

  test('size: per image and in total, a shared layer counted once, estimated disk = download x factor; an index is sized by its platform image', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const list = path.join(tmp, 'size.txt');
    await writeFile(list, 'registry.test/org/a:1\nregistry.test/org/b:1\nregistry.test/org/multi:v2\n');
    const r = await runCli(size, [...common(), '-o', 'json', '--platform', 'linux/arm64', '--disk-estimate-factor', '3', list]);
    assert.equal(r.code, 0, r.stderr);
    const report = JSON.parse(r.stdout) as SizeReport;
    const a = await blobBytes(reg, 'org/a', shared.a.digest);
    const b = await blobBytes(reg, 'org/b', shared.b.digest);
    const m = await blobBytes(reg, 'org/multi', multi.platforms['linux/arm64']!.manifestDigest);
    assert.deepEqual(
      report.images.map((i) => [i.image, i.downloadBytes, i.estimatedDiskBytes]),
      [
        ['registry.test/org/a:1', a.total, a.total * 3],
        ['registry.test/org/b:1', b.total, b.total * 3],
        ['registry.test/org/multi:v2', m.total, m.total * 3],
      ],
    );
    assert.ok(m.total > 0, 'a multi-arch image never sizes as zero');
    assert.equal(report.images[2]!.platformDigest, multi.platforms['linux/arm64']!.manifestDigest);
    const distinct = new Map([...a.digests, ...b.digests, ...m.digests]);
    const expected = [...distinct.values()].reduce((n, v) => n + v, 0);
    assert.equal(report.total.downloadBytes, expected);
    assert.ok(report.total.downloadBytes < a.total + b.total + m.total, 'the shared base layer counts once');
    assert.equal(report.total.distinctLayers, 4); // base, a, b, multi's arm64 layer
    assert.equal(report.total.estimatedDiskBytes, expected * 3);

    const table = await runCli(size, [...common(), list]);
    assert.equal(table.code, 0, table.stderr);
    assert.match(table.stdout, /^IMAGE\s+LAYERS\s+DOWNLOAD\s+DISK \(x2\)$/m);
    assert.match(table.stdout, /^TOTAL: 3 image\(s\), 4 distinct layer\(s\), linux\/\w+/m);
  });

  test('size: an image that cannot be sized is reported and fails the run; the others are still listed', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const big = await pushRandom(reg, 'org/big', 300 * 1024, { tag: '1' });
    const r = await runCli(size, [...common(), '-o', 'yaml', '-'], `registry.test/org/big@${big.digest}\nregistry.test/org/nothing:1\n`);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /<stdin>:2: registry\.test\/org\/nothing:1: .* answered HTTP 404/);
    const report = parse(r.stdout) as SizeReport;
    assert.equal(report.images.length, 1);
    assert.ok(report.images[0]!.downloadBytes > 300 * 1024);
  });

  test('the pinset command: TLS trusted through NODE_EXTRA_CA_CERTS, refused without it, and exit codes', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const { cert, key } = await makeCertificate(tmp, 'cli-tls', ['IP:127.0.0.1']);
    const tlsReg = await Registry.start({ tls: { certificate: cert, key } });
    try {
      // Push through a client that accepts the test's certificate.
      const { Agent, setGlobalDispatcher, getGlobalDispatcher } = await import('undici');
      const prev = getGlobalDispatcher();
      const lax = new Agent({ connect: { rejectUnauthorized: false } });
      setGlobalDispatcher(lax);
      let img: PushedImage;
      try {
        img = await pushSingleLayer(tlsReg, 'tls/app', { tag: 'x' });
      } finally {
        setGlobalDispatcher(prev);
        await lax.close();
      }
      const tlsConf = path.join(tmp, 'tls.conf');
      await writeFile(tlsConf, `[[registry]]\nprefix = "secure.test"\nlocation = "${tlsReg.host}"\n`);
      const list = path.join(tmp, 'tls.txt');
      await writeFile(list, 'secure.test/tls/app:x\n');
      const env = { CONTAINERS_REGISTRIES_CONF: tlsConf, PINSET_REGISTRIES_CONF_DIR: path.join(tmp, 'no.d'), REGISTRY_AUTH_FILE: path.join(tmp, 'none.json') };
      const trusted = await runShipped(['resolve', list], { ...env, NODE_EXTRA_CA_CERTS: cert });
      assert.equal(trusted.code, 0, trusted.stderr);
      assert.equal(parse(trusted.stdout).spec.pinnedImages[0].name, `secure.test/tls/app@${img!.digest}`);
      const untrusted = await runShipped(['resolve', list], { ...env, NODE_EXTRA_CA_CERTS: '' });
      assert.equal(untrusted.code, 1);
      assert.match(untrusted.stderr, /cannot be reached over TLS/);
      const usage = await runShipped(['size', '--platform', 'amd64', list], env);
      assert.equal(usage.code, 2);
      assert.match(usage.stderr, /--platform: "amd64" is not a platform/);
    } finally {
      await tlsReg.stop();
    }
  });
  test('resolve and size, as shipped, get the private registry\'s credential from a docker credential helper (credHelpers, then credsStore), as podman and skopeo do', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const bin = path.join(tmp, 'helpers');
    await mkdir(bin, { recursive: true });
    const log = path.join(tmp, 'helper-calls.log');
    const helper = path.join(bin, 'docker-credential-pinset-test');
    // docker-credential-helpers' protocol: `get`, the registry on stdin, JSON on stdout.
    await writeFile(
      helper,
      `#!/bin/sh\nread -r server\necho "$* $server" >> "${log}"\nif [ "$server" = "${priv.host}" ]; then printf '{"ServerURL":"%s","Username":"${CREDS.username}","Secret":"${CREDS.password}"}' "$server"; else echo "credentials not found in native keychain"; exit 1; fi\n`,
    );
    await chmod(helper, 0o755);
    const list = path.join(tmp, 'helper.txt');
    await writeFile(list, 'private.test/team/secret:prod\n');
    const env = { CONTAINERS_REGISTRIES_CONF: conf, PINSET_REGISTRIES_CONF_DIR: path.join(tmp, 'no.d'), PATH: `${bin}:${process.env.PATH}` };
    for (const doc of [{ credHelpers: { [priv.host]: 'pinset-test' } }, { credsStore: 'pinset-test' }]) {
      const authFile = path.join(tmp, 'helper-auth.json');
      await writeFile(authFile, JSON.stringify(doc));
      const resolved = await runShipped(['resolve', list], { ...env, REGISTRY_AUTH_FILE: authFile });
      assert.equal(resolved.code, 0, resolved.stderr);
      assert.equal(parse(resolved.stdout).spec.pinnedImages[0].name, `private.test/team/secret@${secret.digest}`);
      const sized = await runShipped(['size', '-o', 'json', list], { ...env, REGISTRY_AUTH_FILE: authFile });
      assert.equal(sized.code, 0, sized.stderr);
      for (const out of [resolved, sized]) assert.ok(!(out.stdout + out.stderr).includes(CREDS.password), 'the secret is printed nowhere');
    }
    assert.ok((await readFile(log, 'utf8')).split('\n').every((l) => l === '' || l === `get ${priv.host}`), 'run as `get` with the registry on stdin');
    // A helper that refuses: the registry's refusal says which helper failed.
    await writeFile(helper, '#!/bin/sh\necho "keychain locked" >&2\nexit 5\n');
    const refused = await runShipped(['resolve', list], { ...env, REGISTRY_AUTH_FILE: path.join(tmp, 'helper-auth.json') });
    assert.equal(refused.code, 1);
    assert.match(refused.stderr, /refused anonymous access.*docker-credential-pinset-test get exited with status 5/);
  });
});

