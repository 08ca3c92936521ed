// `pinset snapshot` against the in-process API server holding Pods and
// Nodes, and the stand-in's pods themselves: served the way the real API
// server serves them (pkg/registry/core/pod), since snapshot relies on it.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { CoreV1Api } from '@kubernetes/client-node';
import { parse } from 'yaml';
import { pinnableImageID } from '../../src/cli/snapshot.ts';
import { ApiServer } from '../support/apiserver.ts';

const ROOT = path.resolve(import.meta.dirname, '../..');
const NODE = path.join(ROOT, 'node_modules/.bin/node');
const D = (c: string) => `sha256:${c.repeat(64)}`;

let api: ApiServer;
let dir: string;
let kubeconfig: string;

function pinset(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(NODE, ['src/cli/main.ts', 'snapshot', '--kubeconfig', kubeconfig, ...args], { cwd: ROOT, timeout: 30_000 }, (err, stdout, stderr) => {
      const code = err ? (typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : -1) : 0;
      resolve({ code, stdout, stderr });
    });
  });
}

interface ContainerSpec {
  name: string;
  imageID: string;
  image?: string;
}

function pod(ns: string, name: string, node: string, opts: { labels?: Record<string, string>; phase?: string; containers?: ContainerSpec[]; init?: ContainerSpec[]; ephemeral?: ContainerSpec[] }): void {
  const st = (c: ContainerSpec) => ({ name: c.name, image: c.image ?? 'x', imageID: c.imageID, ready: true, restartCount: 0 });
  api.create({
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name, namespace: ns, labels: opts.labels ?? {} },
    spec: { nodeName: node, containers: (opts.containers ?? []).map((c) => ({ name: c.name, image: c.image ?? 'x' })) },
    status: {
      phase: opts.phase ?? 'Running',
      containerStatuses: (opts.containers ?? []).map(st),
      ...(opts.init ? { initContainerStatuses: opts.init.map(st) } : {}),
      ...(opts.ephemeral ? { ephemeralContainerStatuses: opts.ephemeral.map(st) } : {}),
    },
  });
}

before(async () => {
  api = await ApiServer.start();
  dir = await mkdtemp(path.join(tmpdir(), 'pinset-snapshot-'));
  kubeconfig = await api.writeKubeconfig(dir);
  api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'edge-1', labels: { site: 'edge' } } });
  api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'core-1', labels: { site: 'core' } } });
  pod('shop', 'web-1', 'edge-1', {
    labels: { app: 'web' },
    init: [{ name: 'migrate', imageID: `quay.io/shop/migrate@${D('1')}` }],
    containers: [
      { name: 'web', imageID: `quay.io/shop/web@${D('2')}` },
      { name: 'local-tool', imageID: D('9'), image: 'localhost/tool:dev' },
    ],
    ephemeral: [{ name: 'debugger', imageID: `docker.io/library/busybox@${D('3')}` }],
  });
  pod('shop', 'web-2', 'core-1', { labels: { app: 'web' }, containers: [{ name: 'web', imageID: `quay.io/shop/web@${D('2')}` }] });
  pod('shop', 'batch', 'core-1', { labels: { app: 'batch' }, phase: 'Succeeded', containers: [{ name: 'job', imageID: `quay.io/shop/job@${D('4')}` }] });
  pod('infra', 'dns', 'edge-1', { containers: [{ name: 'dns', imageID: `docker-pullable://registry.k8s.io/coredns/coredns@${D('5')}` }] });
  pod('infra', 'starting', 'core-1', { phase: 'Pending', containers: [{ name: 'c', imageID: '' }] });
});

after(async () => {
  await api?.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
});

describe('the API server stand-in serves pods as the real one does', () => {
  test('create over HTTP starts at phase Pending whatever status was sent; /status writes status; lists filter by namespace, labels and spec.nodeName', async () => {
    const core = api.kubeConfig().makeApiClient(CoreV1Api);
    const created = await core.createNamespacedPod({
      namespace: 'tmp',
      body: { metadata: { name: 'p', labels: { a: 'b' } }, spec: { nodeName: 'edge-1', containers: [{ name: 'c', image: 'quay.io/x/y:1' }] }, status: { phase: 'Running' } },
    });
    assert.equal(created.status?.phase, 'Pending');
    // The kubelet's status write, through the status subresource; a write to the pod itself keeps the old status.
    await core.replaceNamespacedPodStatus({
      name: 'p',
      namespace: 'tmp',
      body: { ...created, status: { phase: 'Running', containerStatuses: [{ name: 'c', image: 'quay.io/x/y:1', imageID: `quay.io/x/y@${D('7')}`, ready: true, restartCount: 0 }] } },
    });
    const relabelled = await core.replaceNamespacedPod({ name: 'p', namespace: 'tmp', body: { ...(await core.readNamespacedPod({ name: 'p', namespace: 'tmp' })), status: { phase: 'Failed' } } });
    assert.equal(relabelled.status?.phase, 'Running');
    const got = await core.readNamespacedPod({ name: 'p', namespace: 'tmp' });
    assert.equal(got.status?.containerStatuses?.[0]?.imageID, `quay.io/x/y@${D('7')}`);
    const inNs = await core.listNamespacedPod({ namespace: 'tmp', labelSelector: 'a=b' });
    assert.deepEqual(inNs.items.map((p) => p.metadata?.name), ['p']);
    assert.equal((inNs.items[0] as { kind?: string }).kind, undefined, 'built-in list items carry no kind');
    const onEdge = await core.listPodForAllNamespaces({ fieldSelector: 'spec.nodeName=edge-1' });
    assert.deepEqual(onEdge.items.map((p) => `${p.metadata?.namespace}/${p.metadata?.name}`).sort(), ['infra/dns', 'shop/web-1', 'tmp/p']);
    await assert.rejects(core.listPodForAllNamespaces({ fieldSelector: 'spec.containers=x' }), (e: { code?: number }) => e.code === 400);
    await core.deleteNamespacedPod({ name: 'p', namespace: 'tmp' });
  });
});

describe('pinset snapshot', () => {
  test('imageIDs: digest references are pinned, bare image ids skipped, dockershim prefixes and hostless Docker Hub names handled', () => {
    assert.deepEqual(pinnableImageID(`quay.io/a/b@${D('a')}`), { ref: `quay.io/a/b@${D('a')}` });
    assert.deepEqual(pinnableImageID(`docker-pullable://nginx@${D('a')}`), { ref: `docker.io/library/nginx@${D('a')}` });
    assert.deepEqual(pinnableImageID(`bitnami/redis@${D('a')}`), { ref: `docker.io/bitnami/redis@${D('a')}` });
    assert.match((pinnableImageID(D('b')) as { reason: string }).reason, /no registry digest/);
    assert.match((pinnableImageID('') as { reason: string }).reason, /not started/);
  });

  test('--all-namespaces: containers, init and ephemeral containers, each image once; finished pods left out; skipped ones on stderr', async () => {
    const r = await pinset(['-A', '--name', 'everything']);
    assert.equal(r.code, 0, r.stderr);
    const set = parse(r.stdout);
    assert.equal(set.metadata.name, 'everything');
    assert.equal(set.spec.nodeSelector, undefined);
    assert.deepEqual(
      set.spec.pinnedImages.map((i: { name: string }) => i.name),
      [`docker.io/library/busybox@${D('3')}`, `quay.io/shop/migrate@${D('1')}`, `quay.io/shop/web@${D('2')}`, `registry.k8s.io/coredns/coredns@${D('5')}`],
    );
    assert.match(r.stderr, /skipped shop\/web-1 container local-tool \(localhost\/tool:dev\): no registry digest/);
    assert.match(r.stderr, /skipped infra\/starting container c \(x\): no imageID yet/);
    assert.match(r.stdout, /^# pinset snapshot of 4 image\(s\) run by pods in any namespace; 2 container\(s\) skipped/);
  });

  test('--namespace with -l, and --node-selector, which also becomes the set\'s node selector', async () => {
    const web = await pinset(['-n', 'shop', '-l', 'app=web', '-o', 'json']);
    assert.equal(web.code, 0, web.stderr);
    assert.deepEqual(JSON.parse(web.stdout).spec.pinnedImages.map((i: { name: string }) => i.name), [`docker.io/library/busybox@${D('3')}`, `quay.io/shop/migrate@${D('1')}`, `quay.io/shop/web@${D('2')}`]);
    const edge = await pinset(['-A', '--node-selector', 'site=edge', '-o', 'json']);
    assert.equal(edge.code, 0, edge.stderr);
    const set = JSON.parse(edge.stdout);
    assert.deepEqual(set.spec.nodeSelector, { matchLabels: { site: 'edge' } });
    assert.deepEqual(set.spec.pinnedImages.map((i: { name: string }) => i.name), [`docker.io/library/busybox@${D('3')}`, `quay.io/shop/migrate@${D('1')}`, `quay.io/shop/web@${D('2')}`, `registry.k8s.io/coredns/coredns@${D('5')}`]);
    const core = await pinset(['-n', 'shop', '--node-selector', 'site=core', '-o', 'json']);
    assert.deepEqual(JSON.parse(core.stdout).spec.pinnedImages.map((i: { name: string }) => i.name), [`quay.io/shop/web@${D('2')}`]);
  });

  test('nothing to pin, an unreachable API and conflicting flags each get a clear message and their exit code', async () => {
    const none = await pinset(['-n', 'empty']);
    assert.equal(none.code, 1);
    assert.match(none.stderr, /no pod in namespace empty runs an image with a registry digest; no set printed/);
    assert.equal(none.stdout, '');
    const both = await pinset(['-n', 'a', '-A']);
    assert.equal(both.code, 2);
    assert.match(both.stderr, /--namespace and --all-namespaces exclude each other/);
    api.setAvailable(false);
    try {
      const down = await pinset(['-A', '--timeout', '5s']);
      assert.equal(down.code, 1);
      assert.match(down.stderr, /cannot list pods from the API server at http:\/\/127\.0\.0\.1:\d+/);
    } finally {
      api.setAvailable(true);
    }
  });
});
