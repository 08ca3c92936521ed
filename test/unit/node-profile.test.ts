// The node's profile (src/agent/boot/node-profile.ts): which socket answered
// under the host root, and what follows from the answer. The sockets here
// are files in a temporary host root and the runtimes answer from memory,
// keyed by the endpoint they were asked on; real sockets and runtimes are in
// test/e2e/deploy-args.test.ts.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { ImageRuntime, RuntimeInfo } from '../../src/cri/runtime.ts';
import { CRIO_DROPIN_DIR, type ProfileConfig } from '../../src/agent/boot/config.ts';
import { hostPath } from '../../src/agent/boot/host-paths.ts';
import { CONTAINERD_CONFIG_MAX_BYTES, containerdConfigPath, describeProfile, nodeProfile, sameRuntime, UnsettledRuntime } from '../../src/agent/boot/node-profile.ts';

const CRIO: RuntimeInfo = { runtimeName: 'cri-o', runtimeVersion: '1.32.13', runtimeApiVersion: 'v1' };
const CTRD: RuntimeInfo = { runtimeName: 'containerd', runtimeVersion: '2.1.9', runtimeApiVersion: 'v1' };
const K3S: RuntimeInfo = { runtimeName: 'containerd', runtimeVersion: 'v2.1.5-k3s1', runtimeApiVersion: 'v1' };

/** Runtimes by socket path (as seen under the root); a socket not listed refuses Version. */
function runtimes(by: Record<string, { info: RuntimeInfo; imageFs?: string }>) {
  const asked: string[] = [];
  const runtimeFor = (endpoint: string): ImageRuntime => {
    asked.push(endpoint);
    const r = by[endpoint.replace(/^unix:\/\//, '')];
    const fail = () => Promise.reject(new Error('connect ECONNREFUSED'));
    return {
      version: () => (r ? Promise.resolve(r.info) : fail()),
      imageFsInfo: () => (r ? Promise.resolve(r.imageFs ? [{ mountpoint: r.imageFs, usedBytes: 1 }] : []) : fail()),
      listImages: fail,
      imageStatus: fail,
      pullImage: fail,
      close: () => {},
    };
  };
  return { runtimeFor, asked };
}

describe('node profile', () => {
  let root: string;
  let n = 0;
  before(async () => {
    root = await mkdtemp(path.join(os.tmpdir(), 'pinset-profile-'));
  });
  after(async () => {
    await rm(root, { recursive: true, force: true });
  });

  /** A host root of its own with these host paths present (sockets as plain files) and these files' content. */
  async function host(paths: string[], files: Record<string, string> = {}): Promise<string> {
    const r = path.join(root, String(n++));
    for (const p of paths) {
      await mkdir(path.dirname(hostPath(r, p)), { recursive: true });
      await writeFile(hostPath(r, p), '');
    }
    for (const [p, text] of Object.entries(files)) {
      await mkdir(path.dirname(hostPath(r, p)), { recursive: true });
      await writeFile(hostPath(r, p), text);
    }
    return r;
  }
  const flags = (hostRoot: string, more: Partial<ProfileConfig> = {}): ProfileConfig => ({ hostRoot, pinBackend: 'auto', dropInDir: hostPath(hostRoot, CRIO_DROPIN_DIR), ...more });
  /** The node lock, wherever the runtime is: the agent's own (src/agent/boot/node-lock-place.ts). */
  const lock = (r: string) => path.join(r, 'var/lib/pinset/agent.lock');

  test('CRI-O at /var/run/crio/crio.sock (seen at <root>/run/crio): its drop-in under the root, ImageFsInfo', async () => {
    const r = await host(['/var/run/crio/crio.sock']);
    const { runtimeFor } = runtimes({ [`${r}/run/crio/crio.sock`]: { info: CRIO, imageFs: '/var/lib/containers/storage/overlay-images' } });
    const p = await nodeProfile(flags(r), { runtimeFor });
    assert.equal(p.problem, undefined);
    assert.equal(p.layout, 'crio');
    assert.equal(p.pinBackend, 'crio');
    assert.equal(p.usesDropIn, true);
    assert.equal(p.criEndpoint, `unix://${r}/run/crio/crio.sock`);
    assert.equal(p.dropInDir, `${r}/etc/crio/crio.conf.d`);
    assert.deepEqual(p.imageFs, ['/var/lib/containers/storage/overlay-images']);
    assert.equal(p.containerdHostsDir, undefined);
    assert.equal(p.hostRoot, r);
    const said = describeProfile(p, lock(r));
    assert.deepEqual(said, {
      name: 'cri-o',
      version: '1.32.13',
      layout: 'crio',
      source: 'detected',
      pinBackend: 'crio',
      socket: '/run/crio/crio.sock',
      imageFs: ['/var/lib/containers/storage/overlay-images'],
      dropInDir: '/etc/crio/crio.conf.d',
      lock: '/var/lib/pinset/agent.lock',
    });
  });

  test("containerd at its own paths: label pins, the hosts folder from config.toml's config_path (version 2 and 3)", async () => {
    for (const [config, want] of [
      ['version = 2\n[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "/etc/containerd/certs.d:/etc/docker/certs.d"\n', '/etc/containerd/certs.d:/etc/docker/certs.d'],
      ["version = 3\n[plugins.'io.containerd.cri.v1.images'.registry]\n  config_path = '/srv/hosts'\n", '/srv/hosts'],
      ['version = 2\n', '/etc/containerd/certs.d'],
    ] as const) {
      const r = await host(['/run/containerd/containerd.sock'], { '/etc/containerd/config.toml': config });
      const { runtimeFor } = runtimes({ [`${r}/run/containerd/containerd.sock`]: { info: CTRD } });
      const p = await nodeProfile(flags(r), { runtimeFor });
      assert.equal(p.layout, 'containerd');
      assert.equal(p.pinBackend, 'containerd');
      assert.equal(p.usesDropIn, false);
      assert.equal(p.containerdHostsDir, want.split(':').map((d) => hostPath(r, d)).join(':'));
      assert.equal(describeProfile(p, lock(r)).hostsDir, want);
    }
  });

  test('no containerd config: the default hosts folder; an unreadable one is not guessed at', async () => {
    const r = await host(['/run/containerd/containerd.sock'], { '/etc/containerd/config.toml': 'this is = = not toml' });
    const { runtimeFor } = runtimes({ [`${r}/run/containerd/containerd.sock`]: { info: CTRD } });
    assert.equal((await nodeProfile(flags(r), { runtimeFor })).containerdHostsDir, hostPath(r, '/etc/containerd/certs.d'));
    assert.equal(await containerdConfigPath(path.join(r, 'missing.toml')), undefined);
  });

  test('config.toml a FIFO or larger than the limit: not read (detection never waits on it), the default hosts folder', { timeout: 10_000 }, async () => {
    const r = await host(['/run/containerd/containerd.sock']);
    const config = hostPath(r, '/etc/containerd/config.toml');
    await mkdir(path.dirname(config), { recursive: true });
    execFileSync('mkfifo', [config]);
    const { runtimeFor } = runtimes({ [`${r}/run/containerd/containerd.sock`]: { info: CTRD } });
    // A read of a FIFO with no writer never ends: this would wait for the test's timeout.
    const p = await nodeProfile(flags(r), { runtimeFor });
    assert.equal(p.layout, 'containerd');
    assert.equal(p.containerdHostsDir, hostPath(r, '/etc/containerd/certs.d'));
    await rm(config);
    const named = 'version = 2\n[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "/srv/hosts"\n';
    await writeFile(config, named);
    assert.equal(await containerdConfigPath(config), '/srv/hosts', 'within the limit, read');
    await writeFile(config, named + '#'.repeat(CONTAINERD_CONFIG_MAX_BYTES - named.length) + '\n');
    assert.equal(await containerdConfigPath(config), undefined, 'one byte past the limit, not read');
  });

  test("k3s and RKE2 share /run/k3s/containerd/containerd.sock: each one's hosts folder under /var/lib/rancher", async () => {
    const k3s = await host(['/run/k3s/containerd/containerd.sock'], {
      '/var/lib/rancher/k3s/agent/etc/containerd/config.toml': 'version = 3\n[plugins."io.containerd.cri.v1.images".registry]\n  config_path = "/var/lib/rancher/k3s/agent/etc/containerd/certs.d"\n',
    });
    const rke2 = await host(['/run/k3s/containerd/containerd.sock', '/var/lib/rancher/rke2/agent/etc/containerd/certs.d/.keep']);
    for (const [r, layout] of [[k3s, 'k3s'], [rke2, 'rke2']] as const) {
      const { runtimeFor } = runtimes({ [`${r}/run/k3s/containerd/containerd.sock`]: { info: K3S, imageFs: `/var/lib/rancher/${layout}/agent/containerd/io.containerd.snapshotter.v1.overlayfs` } });
      const p = await nodeProfile(flags(r), { runtimeFor });
      assert.equal(p.layout, layout);
      assert.equal(p.pinBackend, 'containerd');
      assert.equal(p.containerdHostsDir, hostPath(r, `/var/lib/rancher/${layout}/agent/etc/containerd/certs.d`));
      assert.deepEqual(p.imageFs, [`/var/lib/rancher/${layout}/agent/containerd/io.containerd.snapshotter.v1.overlayfs`]);
    }
  });

  test('no runtime answers: a problem naming the sockets and why each was silent; nothing to pin with', async () => {
    const r = await host(['/run/containerd/containerd.sock']);
    const { runtimeFor } = runtimes({});
    const p = await nodeProfile(flags(r), { runtimeFor });
    assert.match(p.problem!, /no container runtime answers on this node's CRI sockets \(\/var\/run\/crio\/crio\.sock, \/run\/containerd\/containerd\.sock, \/run\/k3s\/containerd\/containerd\.sock under .*\); not answering: \/run\/containerd\/containerd\.sock \(connect ECONNREFUSED\)/);
    assert.equal(p.pinBackend, 'none');
    assert.equal(p.usesDropIn, false);
    const empty = await nodeProfile(flags(await host([])), { runtimeFor });
    assert.match(empty.problem!, /^no container runtime answers/);
    assert.doesNotMatch(empty.problem!, /not answering/);
  });

  test('two runtimes answer: a problem naming both, telling which flag settles it', async () => {
    const r = await host(['/var/run/crio/crio.sock', '/run/containerd/containerd.sock']);
    const { runtimeFor } = runtimes({ [`${r}/run/crio/crio.sock`]: { info: CRIO }, [`${r}/run/containerd/containerd.sock`]: { info: CTRD } });
    const p = await nodeProfile(flags(r), { runtimeFor });
    assert.equal(p.problem, '2 container runtimes answer on this node: cri-o 1.32.13 at /run/crio/crio.sock, containerd 2.1.9 at /run/containerd/containerd.sock; pinset pins on one: give --cri-endpoint (PINSET_CRI_ENDPOINT) to say which');
    assert.equal(p.pinBackend, 'none');
    assert.equal(describeProfile(p, lock(r)).problem, p.problem);
  });

  test('explicit flags win: --cri-endpoint is not looked for, --pin-backend and --containerd-hosts-dir are kept', async () => {
    const r = await host(['/var/run/crio/crio.sock', '/run/containerd/containerd.sock']);
    const { runtimeFor, asked } = runtimes({ [`${r}/run/containerd/containerd.sock`]: { info: CTRD } });
    const p = await nodeProfile(flags(r, { criEndpoint: `unix://${r}/run/containerd/containerd.sock`, pinBackend: 'none', containerdHostsDir: '/mine' }), { runtimeFor });
    assert.deepEqual(asked, [`unix://${r}/run/containerd/containerd.sock`]);
    assert.equal(p.source, 'flags');
    assert.equal(p.problem, undefined);
    assert.equal(p.pinBackend, 'none');
    assert.equal(p.containerdHostsDir, '/mine');
    assert.deepEqual(p.runtime, CTRD);
    const pinned = await nodeProfile(flags(r, { pinBackend: 'none' }), { runtimeFor: runtimes({ [`${r}/run/containerd/containerd.sock`]: { info: CTRD } }).runtimeFor });
    assert.equal(pinned.source, 'detected');
    assert.equal(pinned.pinBackend, 'none');
  });

  test('a re-detection that finds the same runtime is the same; another socket or a settled problem is not', async () => {
    const r = await host(['/run/containerd/containerd.sock']);
    const { runtimeFor } = runtimes({ [`${r}/run/containerd/containerd.sock`]: { info: CTRD } });
    const a = await nodeProfile(flags(r), { runtimeFor });
    const b = await nodeProfile(flags(r), { runtimeFor });
    const none = await nodeProfile(flags(r), { runtimeFor: runtimes({}).runtimeFor });
    assert.equal(sameRuntime(a, b), true);
    assert.equal(sameRuntime(a, none), false);
  });

  test('hostPath: / is the host itself; elsewhere /var/run is /run', () => {
    assert.equal(hostPath('/', '/var/run/crio/crio.sock'), '/var/run/crio/crio.sock');
    assert.equal(hostPath('/host', '/var/run/crio/crio.sock'), '/host/run/crio/crio.sock');
    assert.equal(hostPath('/host', '/etc/crio/crio.conf.d'), '/host/etc/crio/crio.conf.d');
  });

  test('the unsettled runtime fails every call with its reason, as an unavailable runtime', async () => {
    const u = new UnsettledRuntime('two runtimes answer');
    await assert.rejects(u.listImages(), (e: Error & { kind?: string }) => e.message === 'two runtimes answer' && e.kind === 'Unavailable');
    await assert.rejects(u.pullImage(), /two runtimes answer/);
  });
});
