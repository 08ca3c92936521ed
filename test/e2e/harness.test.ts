// The end-to-end harness checks itself against the real programs: images
// made here must pull into containerd through its CRI socket exactly as a
// registry on the internet would serve them, the authenticated registry must
// refuse strangers, and every server must stop by its PID.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readdir, readFile, stat } from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';
import { missingComponents, requireComponents, type ComponentName } from '../support/components.ts';
import { Containerd, CriClient } from '../support/containerd.ts';
import { CriProxy } from '../support/cri-proxy.ts';
import { nodePlatform, pushMultiArch, pushMultiLayer, pushRandom, pushSingleLayer, unknownRef } from '../support/images.ts';
import { Registry } from '../support/registry.ts';

const run = promisify(execFile);
const NEEDS: ComponentName[] = ['containerd', 'runc', 'docker-registry', 'htpasswd'];
const CREDS = { username: 'pinset', password: 'harness-pw-7f3a' };

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** Contents of every file named `name` in containerd's native snapshots (unpacked layers). */
async function unpackedFiles(c: Containerd, name: string): Promise<string[]> {
  const snapshots = path.join(c.dir, 'root', 'io.containerd.snapshotter.v1.native', 'snapshots');
  const out: string[] = [];
  for (const id of await readdir(snapshots).catch(() => [] as string[])) {
    const file = path.join(snapshots, id, name);
    if (await stat(file).catch(() => null)) out.push(await readFile(file, 'utf8'));
  }
  return out;
}

describe('e2e harness: registry, images, containerd', () => {
  let registry: Registry;
  let privateRegistry: Registry;
  let containerd: Containerd;
  let cri: CriClient;

  before(async () => {
    if (missingComponents(NEEDS).length > 0 || process.getuid?.() !== 0) return; // each test reports it
    registry = await Registry.start();
    privateRegistry = await Registry.start({ auth: CREDS });
    containerd = await Containerd.start({
      mirrors: { 'registry.test': registry.url, 'private.registry.test': privateRegistry.url },
    });
    cri = new CriClient(containerd.endpoint);
  });

  after(async () => {
    cri?.close();
    await containerd?.stop();
    await registry?.stop();
    await privateRegistry?.stop();
  });

  test('a single-layer image pulls by digest and unpacks', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const img = await pushSingleLayer(registry, 'harness/single');
    assert.match(img.ref, /^registry\.test\/harness\/single@sha256:[0-9a-f]{64}$/);

    const imageRef = await cri.pullImage(img.ref);
    assert.equal(imageRef, img.id);

    const listed = (await cri.listImages()).find((i) => i.id === img.id);
    assert.ok(listed, 'ListImages shows the image');
    assert.deepEqual(listed.repoDigests, [img.ref]);

    // containerd's own CLI agrees (k8s.io is the CRI namespace).
    const { stdout } = await run('ctr', ['--address', containerd.socket, '-n', 'k8s.io', 'images', 'ls', '-q']);
    assert.ok(stdout.split('\n').includes(img.ref), `ctr images ls lists ${img.ref}:\n${stdout}`);

    const files = await unpackedFiles(containerd, 'hello.txt');
    assert.ok(files.some((f) => f.startsWith('hello from harness/single')), 'the layer was unpacked by the native snapshotter');
  });

  test('a multi-layer image lands with every layer', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const img = await pushMultiLayer(registry, 'harness/multi', 3);
    assert.equal(await cri.pullImage(img.ref), img.id);
    const status = await cri.imageStatus(img.ref);
    assert.equal(status?.id, img.id);
    for (let i = 0; i < 3; i++) {
      const files = await unpackedFiles(containerd, `layer-${i}.txt`);
      assert.ok(files.some((f) => f.startsWith(`layer ${i} of harness/multi`)), `layer ${i} unpacked`);
    }
  });

  test("a digest naming a multi-arch index lands the node's platform", async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const img = await pushMultiArch(registry, 'harness/multiarch');
    const node = nodePlatform();
    const mine = img.platforms[`linux/${node.architecture}`];
    const others = Object.entries(img.platforms).filter(([p]) => p !== `linux/${node.architecture}`);
    assert.ok(mine, `the index has linux/${node.architecture}`);
    assert.ok(others.length > 0, 'the index has another platform too');

    assert.equal(await cri.pullImage(img.ref), mine.id);
    const ids = new Set((await cri.listImages()).map((i) => i.id));
    assert.ok(ids.has(mine.id));
    for (const [p, other] of others) assert.ok(!ids.has(other.id), `${p} did not land`);
    const status = await cri.imageStatus(img.ref);
    assert.deepEqual(status?.repoDigests, [img.ref]);
  });

  test('a 50 MB image pulls whole', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const img = await pushRandom(registry, 'harness/big', 50 * 1000 * 1000);
    assert.ok(img.size > 50 * 1000 * 1000);
    assert.equal(await cri.pullImage(img.ref), img.id);
    const status = await cri.imageStatus(img.ref);
    assert.ok(status && status.size >= 50 * 1000 * 1000, `size reported ${status?.size}`);
  });

  test('an unknown digest is NOT_FOUND', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    await pushSingleLayer(registry, 'harness/known');
    await assert.rejects(cri.pullImage(unknownRef('harness/known')), (err: { code?: number }) => err.code === 5);
  });

  test('the authenticated registry refuses anonymous and wrong credentials, accepts the right ones', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const anon = await fetch(`${privateRegistry.url}/v2/`);
    assert.equal(anon.status, 401);
    await anon.body?.cancel();

    const img = await pushSingleLayer(privateRegistry, 'harness/private', { host: 'private.registry.test' });
    assert.match(img.ref, /^private\.registry\.test\//);

    await assert.rejects(cri.pullImage(img.ref), /401 Unauthorized/);
    await assert.rejects(cri.pullImage(img.ref, { auth: { username: CREDS.username, password: 'wrong' } }), /401 Unauthorized/);
    assert.equal(await cri.imageStatus(img.ref), null, 'nothing landed without credentials');

    const auth = Buffer.from(`${CREDS.username}:${CREDS.password}`).toString('base64');
    assert.equal(await cri.pullImage(img.ref, { auth: { auth } }), img.id);
    assert.equal((await cri.imageStatus(img.ref))?.id, img.id);
  });

  // containerd 1.6 (pkg/cri/server/helpers.go ParseAuth) sends credentials
  // only when url.Parse(server_address).Host equals the host it connects to;
  // a bare host name parses with an empty Host, so it never matches. A CRI
  // client that wants its AuthConfig used by containerd leaves
  // server_address empty (CRI-O ignores the field).
  test('containerd drops credentials whose server_address is a bare host', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const img = await pushSingleLayer(privateRegistry, 'harness/server-address', { host: 'private.registry.test' });
    const creds = { username: CREDS.username, password: CREDS.password };
    await assert.rejects(cri.pullImage(img.ref, { auth: { ...creds, serverAddress: 'private.registry.test' } }), /401 Unauthorized/);
    assert.equal(await cri.pullImage(img.ref, { auth: { ...creds, serverAddress: privateRegistry.url } }), img.id);
  });

  test('the registry goes down and comes back on the same port with its images', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const img = await pushSingleLayer(registry, 'harness/outage');
    const { port } = registry;
    await registry.pause();
    assert.equal(registry.running, false);
    await assert.rejects(cri.pullImage(img.ref), /connection refused/);
    await registry.resume();
    assert.equal(registry.port, port);
    assert.equal(await cri.pullImage(img.ref), img.id);
  });

  test('containerd keeps its images across a restart and a crash', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const img = await pushSingleLayer(registry, 'harness/survivor');
    await cri.pullImage(img.ref);

    const before = containerd.pid;
    await containerd.restart();
    assert.notEqual(containerd.pid, before);
    assert.equal((await cri.imageStatus(img.ref))?.id, img.id, 'present after restart');

    const crashed = containerd.pid!;
    await containerd.kill();
    assert.equal(isAlive(crashed), false);
    await assert.rejects(cri.version({ deadlineMs: 1000 }));
    await containerd.start();
    assert.equal((await cri.imageStatus(img.ref))?.id, img.id, 'present after a crash');
  });

  test('the CRI proxy forwards to containerd, records runtime handlers and can refuse one', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const proxy = await CriProxy.start(containerd.endpoint);
    const viaProxy = new CriClient(proxy.endpoint);
    t.after(async () => {
      viaProxy.close();
      await proxy.stop();
    });
    const img = await pushSingleLayer(registry, 'harness/proxied');
    assert.equal((await viaProxy.version()).runtimeName, 'containerd');
    assert.equal(await viaProxy.pullImage(img.ref, { runtimeHandler: 'runc' }), img.id);
    assert.equal((await cri.imageStatus(img.ref))?.id, img.id, 'the pull reached containerd');
    assert.deepEqual(
      proxy.callsOf('PullImage').map((c) => [c.image, c.runtimeHandler, c.code]),
      [[img.ref, 'runc', 0]],
    );

    proxy.rejectHandler('kata', { code: 3, details: 'runtime handler kata not supported' });
    const other = await pushSingleLayer(registry, 'harness/proxied-kata');
    await assert.rejects(viaProxy.pullImage(other.ref, { runtimeHandler: 'kata' }), (err: { code?: number; details?: string }) => {
      return err.code === 3 && err.details === 'runtime handler kata not supported';
    });
    assert.equal(await cri.imageStatus(other.ref), null, 'a refused pull never reached containerd');
    assert.equal(proxy.callsOf('PullImage').at(-1)?.code, 3);

    await assert.rejects(viaProxy.pullImage(unknownRef('harness/proxied')), (err: { code?: number }) => err.code === 5);
    assert.equal(proxy.callsOf('PullImage').at(-1)?.code, 5, 'upstream errors pass through with their code');
  });

  test('stop() ends every process by PID and removes its folder', async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const r = await Registry.start({ auth: CREDS });
    const c = await Containerd.start({ mirrors: { 'registry.test': r.url } });
    const pids = [r.pid!, c.pid!];
    assert.ok(pids.every(isAlive));
    await c.stop();
    await r.stop();
    assert.deepEqual(pids.map(isAlive), [false, false]);
    for (const dir of [r.dir, c.dir]) assert.equal(await stat(dir).catch(() => null), null, `${dir} removed`);
    // No containerd or registry of ours is left: pgrep by our temp folders.
    const left = await run('pgrep', ['-f', `${c.dir}|${r.dir}`]).then(
      (res) => res.stdout.trim(),
      () => '',
    );
    assert.equal(left, '');
  });
});
