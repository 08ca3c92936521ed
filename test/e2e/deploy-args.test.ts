// One DaemonSet for every node: the agent run with exactly the args and env
// of the DaemonSet that `kubectl kustomize deploy/` renders (its host paths
// under a temporary host root, ./../support/shipped-agent.ts), on
//  - the CRI-O stand-in, reloaded over a private system bus, at CRI-O's
//    paths (/run/crio/crio.sock, /etc/crio/crio.conf.d, the bus at
//    /run/dbus/system_bus_socket);
//  - containerd 2.1.9 at containerd's own paths (/run/containerd/containerd.sock,
//    /etc/containerd/certs.d);
//  - containerd 2.1.9 at k3s's paths (/run/k3s/containerd/containerd.sock,
//    its config and registry hosts under /var/lib/rancher/k3s/agent/etc/containerd);
// finds the runtime by itself, pins every image of a static set (Ready,
// confirmed through CRI `pinned`), and says in the node status what it
// found. The agent is the bundle as shipped (dist/, `npm run build`).
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { stringify as dumpYaml } from 'yaml';
import type { NodeRuntime, NodeStatus, PinnedImageSet } from '../../src/api/types.ts';
import { AgentProcess, bundledCli, type LogLine } from '../support/agent-process.ts';
import { isCI, missingComponents, requireComponents, type ComponentName } from '../support/components.ts';
import { Containerd, containerdComponent, CriClient } from '../support/containerd.ts';
import { startCrioNode } from '../support/crio-node.ts';
import { pushSingleLayer, type PushedImage } from '../support/images.ts';
import { Registry } from '../support/registry.ts';
import { kubectlPath, shippedAgent, shippedEnv, type ShippedAgent } from '../support/shipped-agent.ts';

const NODE = 'node-deploy';
const NEEDS_CTRD: ComponentName[] = [containerdComponent('2.1'), 'runc', 'docker-registry'];
const NEEDS_CRIO: ComponentName[] = ['dbus-daemon'];

function set(refs: string[]): PinnedImageSet {
  return { apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name: 'everywhere' }, spec: { pinnedImages: refs.map((name) => ({ name })) } };
}

const noKubectl = !kubectlPath() ? 'kubectl not found: the DaemonSet cannot be rendered' : false;
if (noKubectl && isCI()) throw new Error(`CI=true and ${noKubectl}`);

describe('the DaemonSet of kubectl kustomize deploy/, as rendered, on every runtime', { skip: noKubectl }, () => {
  let shipped: ShippedAgent;
  let cli: string;
  let work: string;
  let registry: Registry | undefined;

  before(async () => {
    shipped = await shippedAgent();
    cli = await bundledCli();
    work = await mkdtemp(path.join(os.tmpdir(), 'pinset-e2e-ds-'));
    if (missingComponents(['docker-registry']).length === 0) registry = await Registry.start();
  });
  after(async () => {
    await registry?.stop();
    await rm(work, { recursive: true, force: true });
  });

  /** Starts the shipped container's command on the node at `hostRoot` with the set, and waits for it Ready with every image pinned. */
  async function runUntilPinned(hostRoot: string, refs: string[]): Promise<{ status: NodeStatus; detected: LogLine; agent: AgentProcess }> {
    await mkdir(path.join(hostRoot, 'etc/pinset/sets.d'), { recursive: true });
    await writeFile(path.join(hostRoot, 'etc/pinset/sets.d/sets.yaml'), dumpYaml(set(refs)));
    // The downward API's NODE_NAME and POD_NAMESPACE; metrics off (9402 may be taken on this machine).
    const env = { ...shippedEnv(shipped, hostRoot, { NODE_NAME: NODE, POD_NAMESPACE: 'pinset-system' }), PINSET_METRICS_ADDR: '' };
    const agent = AgentProcess.start(shipped.args.slice(1), { cli, env });
    assert.equal(shipped.args[0], 'agent');
    try {
      const detected = await agent.waitForLog((l) => l.msg === 'node runtime detected', 20_000, 'the node runtime detected');
      const line = await agent.waitForLog(
        (l) => {
          const s = l.status as NodeStatus | undefined;
          return l.msg === 'node status' && s?.sets.length === 1 && s.sets[0]!.phase === 'Ready' && s.sets[0]!.images.pinned === refs.length;
        },
        60_000,
        'the set Ready with every image pinned',
      );
      return { status: line.status as NodeStatus, detected, agent };
    } catch (e) {
      await agent.stop();
      throw e;
    }
  }

  test('rendered as one container: `agent`, the host root at /host, no runtime named; every mount a folder all nodes have (read-only), CRI-O\'s folder or pinset\'s own', () => {
    assert.deepEqual(shipped.args, ['agent']);
    assert.equal(shipped.env.PINSET_HOST_ROOT, '/host');
    assert.equal(shipped.env.PINSET_CRI_ENDPOINT, undefined);
    assert.equal(shipped.env.PINSET_PIN_BACKEND, undefined);
    for (const m of shipped.mounts) assert.ok(['/run', '/var/lib', '/etc', '/etc/crio', '/var/lib/pinset'].includes(m.hostPath), m.hostPath);
    assert.deepEqual(shipped.mounts.filter((m) => !m.readOnly).map((m) => m.hostPath).sort(), ['/etc/crio', '/var/lib/pinset'], 'writable: CRI-O\'s folder and pinset\'s state only');
  });

  test('CRI-O (the stand-in) at CRI-O\'s paths: detected, its drop-in written and reloaded over the bus, every image pinned', async (t) => {
    if (!requireComponents(t, NEEDS_CRIO)) return;
    const root = path.join(work, 'crio');
    const refs = ['web', 'db'].map((r, i) => `registry.test/ds/${r}@sha256:${String(i + 1).repeat(64)}`);
    const node = await startCrioNode({ hostRoot: root, catalogue: Object.fromEntries(refs.map((r) => [r, { size: 4096 }])) });
    try {
      const { status, detected, agent } = await runUntilPinned(root, refs);
      const cri = new CriClient(node.endpoint);
      try {
        for (const r of refs) assert.equal((await cri.imageStatus(r))?.pinned, true, r);
      } finally {
        cri.close();
      }
      assert.ok(node.systemd.reloads.length >= 1, 'crio.service reloaded over the bus at the host root');
      const runtime = status.runtime as NodeRuntime;
      assert.deepEqual(
        { name: runtime.name, layout: runtime.layout, source: runtime.source, pinBackend: runtime.pinBackend, socket: runtime.socket, dropInDir: runtime.dropInDir, lock: runtime.lock },
        { name: 'cri-o', layout: 'crio', source: 'detected', pinBackend: 'crio', socket: '/run/crio/crio.sock', dropInDir: '/etc/crio/crio.conf.d', lock: '/var/lib/pinset/agent.lock' },
      );
      assert.equal(typeof detected.detectionMs, 'number');
      assert.equal(await agent.stop(), 0);
    } finally {
      await node.stop();
    }
  });

  for (const layout of ['containerd', 'k3s'] as const) {
    const paths =
      layout === 'containerd'
        ? { socket: '/run/containerd/containerd.sock', hosts: '/etc/containerd/certs.d', config: '/etc/containerd/config.toml' }
        : { socket: '/run/k3s/containerd/containerd.sock', hosts: '/var/lib/rancher/k3s/agent/etc/containerd/certs.d', config: '/var/lib/rancher/k3s/agent/etc/containerd/config.toml' };
    test(`containerd 2.1 at ${layout}'s paths: detected, every image pinned through its labels, the registry hosts folder found`, async (t) => {
      if (!requireComponents(t, NEEDS_CTRD)) return;
      const root = path.join(work, layout);
      const images: PushedImage[] = [await pushSingleLayer(registry!, `ds-${layout}/web`), await pushSingleLayer(registry!, `ds-${layout}/db`)];
      // The configuration as the node keeps it (host paths): where config_path names the hosts folder.
      await mkdir(path.dirname(path.join(root, paths.config)), { recursive: true });
      await writeFile(path.join(root, paths.config), `version = 2\n[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "${paths.hosts}"\n`);
      const containerd = await Containerd.start({
        version: '2.1',
        socketPath: path.join(root, paths.socket),
        certsDir: path.join(root, paths.hosts),
        mirrors: { 'registry.test': registry!.url },
      });
      try {
        const { status, agent } = await runUntilPinned(root, images.map((i) => i.ref));
        const cri = new CriClient(containerd.endpoint);
        try {
          for (const i of images) assert.equal((await cri.imageStatus(i.ref))?.pinned, true, i.ref);
        } finally {
          cri.close();
        }
        const runtime = status.runtime as NodeRuntime;
        assert.equal(runtime.name, 'containerd');
        assert.match(runtime.version ?? '', /^v?2\.1\./);
        assert.deepEqual(
          { layout: runtime.layout, pinBackend: runtime.pinBackend, socket: runtime.socket, hostsDir: runtime.hostsDir, lock: runtime.lock, dropInDir: runtime.dropInDir },
          { layout, pinBackend: 'containerd', socket: paths.socket, hostsDir: paths.hosts, lock: '/var/lib/pinset/agent.lock', dropInDir: undefined },
        );
        assert.equal(await agent.stop(), 0);
      } finally {
        await containerd.stop();
      }
    });
  }

  test('no runtime at start: said plainly (the node status, each set RuntimeUnavailable, nothing pinned), no exit; containerd 2.1 coming up later is found and pinned on', async (t) => {
    if (!requireComponents(t, NEEDS_CTRD)) return;
    const root = path.join(work, 'later');
    const img = await pushSingleLayer(registry!, 'ds-later/web');
    await mkdir(path.join(root, 'etc/pinset/sets.d'), { recursive: true });
    await writeFile(path.join(root, 'etc/pinset/sets.d/sets.yaml'), dumpYaml(set([img.ref])));
    const env = { ...shippedEnv(shipped, root, { NODE_NAME: NODE, POD_NAMESPACE: 'pinset-system' }), PINSET_METRICS_ADDR: '' };
    const agent = AgentProcess.start(shipped.args.slice(1), { cli, env });
    let containerd: Containerd | undefined;
    try {
      const unsettled = await agent.waitForLog((l) => l.msg === 'node status' && Boolean((l.status as NodeStatus).runtime?.problem), 20_000, 'a status saying no runtime was settled on');
      const status = unsettled.status as NodeStatus;
      assert.match(status.runtime!.problem!, /^no container runtime answers on this node's CRI sockets/);
      assert.equal(status.runtime!.pinBackend, 'none');
      assert.deepEqual([status.sets[0]!.phase, status.sets[0]!.reason], ['Degraded', 'RuntimeUnavailable']);
      assert.equal(status.sets[0]!.images.pinned, 0);
      assert.match(status.sets[0]!.message ?? '', /no container runtime answers/);
      containerd = await Containerd.start({ version: '2.1', socketPath: path.join(root, 'run/containerd/containerd.sock'), certsDir: path.join(root, 'etc/containerd/certs.d'), mirrors: { 'registry.test': registry!.url } });
      await agent.waitForLog((l) => l.msg === "the node's runtime changed; the agent starts again on it", 30_000, 'the runtime found again');
      const line = await agent.waitForLog(
        (l) => l.msg === 'node status' && (l.status as NodeStatus).sets[0]?.phase === 'Ready' && (l.status as NodeStatus).sets[0]?.images.pinned === 1,
        60_000,
        'the set Ready and pinned on the runtime found later',
      );
      assert.equal((line.status as NodeStatus).runtime?.layout, 'containerd');
      assert.equal(agent.running, true, 'the agent never exited');
      assert.equal(await agent.stop(), 0);
    } finally {
      await agent.stop();
      await containerd?.stop();
    }
  });
});
