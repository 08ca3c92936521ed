// The in-process API server (test/support/apiserver.ts), driven the way
// pinset's own code drives a real one: through @kubernetes/client-node.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtemp, rm, stat } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, test, type TestContext } from 'node:test';
import { promisify } from 'node:util';
import {
  ApiException,
  CoordinationV1Api,
  CoreV1Api,
  CustomObjectsApi,
  ListWatch,
  makeInformer,
  PatchStrategy,
  setHeaderOptions,
  Watch,
  type KubeConfig,
  type KubernetesObject,
  type V1Node,
} from '@kubernetes/client-node';
import { API_VERSION, GROUP, KIND, PLURAL, STATUS_ANNOTATION, VERSION } from '../../src/api/types.ts';
import { ApiServer, KubeStatusError, type ApiServerOptions, type KubeObject, type KubeStatus } from '../support/apiserver.ts';

const run = promisify(execFile);
const CR = { group: GROUP, version: VERSION, plural: PLURAL };
const SETS_PATH = `/apis/${GROUP}/${VERSION}/${PLURAL}`;
const IMAGE = `registry.test/app@sha256:${'a'.repeat(64)}`;
const OTHER_IMAGE = `registry.test/other@sha256:${'b'.repeat(64)}`;
const mergePatch = setHeaderOptions('Content-Type', PatchStrategy.MergePatch);

async function startServer(t: TestContext, opts?: ApiServerOptions): Promise<ApiServer> {
  const server = await ApiServer.start(opts);
  t.after(() => server.stop());
  return server;
}

function node(name: string, labels: Record<string, string> = {}, extra: Partial<KubeObject> = {}): KubeObject {
  return { apiVersion: 'v1', kind: 'Node', metadata: { name, labels }, ...extra };
}

function pinnedImageSet(name: string, images: string[], extra: Partial<KubeObject> = {}): KubeObject {
  return { apiVersion: API_VERSION, kind: KIND, metadata: { name }, spec: { pinnedImages: images.map((i) => ({ name: i })) }, ...extra };
}

/** The metav1.Status a client-node call failed with. */
async function failureOf(call: Promise<unknown>): Promise<KubeStatus> {
  try {
    await call;
  } catch (err) {
    if (err instanceof ApiException) {
      const status = JSON.parse(String(err.body)) as KubeStatus;
      assert.equal(err.code, status.code, 'the HTTP status and the Status code agree');
      return status;
    }
    throw err;
  }
  return assert.fail('the call was expected to fail');
}

function assertStatus(s: KubeStatus, code: number, reason: string): void {
  assert.equal(s.kind, 'Status');
  assert.equal(s.apiVersion, 'v1');
  assert.equal(s.status, 'Failure');
  assert.equal(s.code, code, s.message);
  assert.equal(s.reason, reason, s.message);
  assert.equal(typeof s.message, 'string');
}

interface InformerLog<T> {
  added: T[];
  updated: T[];
  deleted: T[];
  errors: unknown[];
  connects: number;
}

function record<T extends KubernetesObject>(informer: ListWatch<T> | ReturnType<typeof makeInformer<T>>): InformerLog<T> {
  const log: InformerLog<T> = { added: [], updated: [], deleted: [], errors: [], connects: 0 };
  informer.on('add', (o) => log.added.push(o));
  informer.on('update', (o) => log.updated.push(o));
  informer.on('delete', (o) => log.deleted.push(o));
  informer.on('error', (e) => log.errors.push(e));
  informer.on('connect', () => log.connects++);
  return log;
}

const names = (objs: readonly KubernetesObject[]) => objs.map((o) => o.metadata?.name).sort();

interface WatchEventLine {
  type: string;
  object: { kind?: string; apiVersion?: string; metadata?: { name?: string; resourceVersion?: string }; code?: number; reason?: string };
}

/** A raw client-node Watch that collects its events and how it ended. */
async function openWatch(kc: KubeConfig, path: string, query: Record<string, string | boolean | number>) {
  const events: WatchEventLine[] = [];
  let resolveDone!: (err: unknown) => void;
  const done = new Promise<unknown>((resolve) => (resolveDone = resolve));
  const controller = await new Watch(kc).watch(path, query, (type, object) => events.push({ type, object }), (err) => resolveDone(err ?? null));
  return { events, done, stop: () => controller.abort() };
}

describe('in-process API server through @kubernetes/client-node', () => {
  test('nodes: list with label and field selectors, get, create; lists carry the resourceVersion', async (t) => {
    const server = await startServer(t);
    const core = server.kubeConfig().makeApiClient(CoreV1Api);
    server.create(node('node-a', { role: 'worker', zone: 'z1' }));
    server.create(node('node-b', { role: 'infra' }));

    const all = await core.listNode();
    assert.deepEqual(names(all.items), ['node-a', 'node-b']);
    assert.equal(all.metadata?.resourceVersion, server.resourceVersion);
    assert.deepEqual(names((await core.listNode({ labelSelector: 'role=worker' })).items), ['node-a']);
    assert.deepEqual(names((await core.listNode({ labelSelector: 'role in (infra, gpu)' })).items), ['node-b']);
    assert.deepEqual(names((await core.listNode({ labelSelector: 'role,!zone' })).items), ['node-b']);
    assert.deepEqual(names((await core.listNode({ labelSelector: 'role!=worker' })).items), ['node-b']);
    assert.deepEqual(names((await core.listNode({ fieldSelector: 'metadata.name=node-b' })).items), ['node-b']);
    assert.deepEqual(names((await core.listNode({ fieldSelector: 'metadata.name!=node-b' })).items), ['node-a']);

    const before = Number(server.resourceVersion);
    const created = await core.createNode({ body: { metadata: { name: 'node-c' } } });
    assert.match(created.metadata?.uid ?? '', /^[0-9a-f-]{36}$/);
    assert.ok(created.metadata?.creationTimestamp instanceof Date);
    assert.equal(created.metadata?.resourceVersion, String(before + 1));
    assert.equal(created.kind, 'Node');
    assert.equal((await core.readNode({ name: 'node-c' })).metadata?.uid, created.metadata?.uid);

    // Built-in list items carry no kind/apiVersion, as the real server sends them.
    const raw = (await (await fetch(`${server.url}/api/v1/nodes`)).json()) as { kind: string; items: KubeObject[] };
    assert.equal(raw.kind, 'NodeList');
    assert.equal(raw.items[0]!.kind, undefined);

    assertStatus(await failureOf(core.createNode({ body: { metadata: { name: 'node-c' } } })), 409, 'AlreadyExists');
    const missing = await failureOf(core.readNode({ name: 'node-z' }));
    assertStatus(missing, 404, 'NotFound');
    assert.equal(missing.message, 'nodes "node-z" not found');
    assert.deepEqual(missing.details, { name: 'node-z', kind: 'nodes' });
    const badName = await failureOf(core.createNode({ body: { metadata: { name: 'Node_C' } } }));
    assertStatus(badName, 422, 'Invalid');
    assert.equal(badName.details?.causes?.[0]?.field, 'metadata.name');
    assertStatus(await failureOf(core.listNode({ fieldSelector: 'spec.podCIDR=x' })), 400, 'BadRequest');
    assertStatus(await failureOf(core.listNode({ labelSelector: 'role in (' })), 400, 'BadRequest');
  });

  test('merge patch on a node changes exactly the annotation sent; null deletes it; .status is not touched', async (t) => {
    const server = await startServer(t);
    const core = server.kubeConfig().makeApiClient(CoreV1Api);
    server.create(node('node-a', { role: 'worker' }, { metadata: { name: 'node-a', annotations: { keep: 'me' } }, status: { nodeInfo: { machineID: 'm1' } } }));
    const body = { metadata: { annotations: { [STATUS_ANNOTATION]: '{"version":1}' } } };

    const rv0 = server.resourceVersion;
    const patched = await core.patchNode({ name: 'node-a', body }, mergePatch);
    assert.deepEqual(patched.metadata?.annotations, { keep: 'me', [STATUS_ANNOTATION]: '{"version":1}' });
    assert.notEqual(patched.metadata?.resourceVersion, rv0);
    const sent = server.requests.filter((r) => r.method === 'PATCH');
    assert.equal(sent.length, 1);
    assert.equal(sent[0]!.path, '/api/v1/nodes/node-a');
    assert.equal(sent[0]!.contentType, 'application/merge-patch+json');
    assert.deepEqual(sent[0]!.body, body);
    assert.equal(sent[0]!.status, 200);

    // The same patch again changes nothing, so nothing is written (no new resourceVersion).
    const rv1 = server.resourceVersion;
    await core.patchNode({ name: 'node-a', body }, mergePatch);
    assert.equal(server.resourceVersion, rv1);

    await core.patchNode({ name: 'node-a', body: { metadata: { annotations: { [STATUS_ANNOTATION]: null } } } }, mergePatch);
    assert.deepEqual(server.get('nodes', 'node-a')?.metadata.annotations, { keep: 'me' });

    // Node status belongs to the /status subresource: a main-resource patch leaves it alone.
    await core.patchNode({ name: 'node-a', body: { status: { nodeInfo: { machineID: 'm2' } } } }, mergePatch);
    assert.deepEqual(server.get('nodes', 'node-a')?.status, { nodeInfo: { machineID: 'm1' } });

    // A resourceVersion in the patch is a precondition.
    const stale = await failureOf(core.patchNode({ name: 'node-a', body: { metadata: { resourceVersion: rv0, labels: { x: 'y' } } } }, mergePatch));
    assertStatus(stale, 409, 'Conflict');
    assert.equal(server.get('nodes', 'node-a')?.metadata.labels?.x, undefined);
  });

  test('JSON patch (the client default) and strategic merge patch on nodes; strategic merge is 415 on a custom resource', async (t) => {
    const server = await startServer(t);
    const kc = server.kubeConfig();
    const core = kc.makeApiClient(CoreV1Api);
    server.create(node('node-a', { role: 'worker' }));

    await core.patchNode({ name: 'node-a', body: [{ op: 'add', path: '/metadata/labels/example.com~1pool', value: 'gpu' }] });
    assert.equal(server.requests.at(-1)!.contentType, 'application/json-patch+json');
    assert.deepEqual(server.get('nodes', 'node-a')?.metadata.labels, { role: 'worker', 'example.com/pool': 'gpu' });

    const failedTest = await failureOf(
      core.patchNode({ name: 'node-a', body: [{ op: 'test', path: '/metadata/labels/role', value: 'infra' }, { op: 'remove', path: '/metadata/labels/role' }] }),
    );
    assertStatus(failedTest, 422, 'Invalid');
    assert.equal(server.get('nodes', 'node-a')?.metadata.labels?.role, 'worker', 'a failed test op applies nothing');

    await core.patchNode(
      { name: 'node-a', body: { metadata: { labels: { role: null } } } },
      setHeaderOptions('Content-Type', PatchStrategy.StrategicMergePatch),
    );
    assert.deepEqual(server.get('nodes', 'node-a')?.metadata.labels, { 'example.com/pool': 'gpu' });

    server.create(pinnedImageSet('set-a', [IMAGE]));
    const custom = kc.makeApiClient(CustomObjectsApi);
    const smp = await failureOf(
      custom.patchClusterCustomObject({ ...CR, name: 'set-a', body: { metadata: { labels: { a: 'b' } } } }, setHeaderOptions('Content-Type', PatchStrategy.StrategicMergePatch)),
    );
    assertStatus(smp, 415, 'UnsupportedMediaType');
  });

  test('a node informer with a field selector sees only its node, through add, update and delete', async (t) => {
    const server = await startServer(t);
    const kc = server.kubeConfig();
    const core = kc.makeApiClient(CoreV1Api);
    server.create(node('node-a', { role: 'worker' }));
    server.create(node('node-b', { role: 'worker' }));

    // makeInformer in client-node 2.0.1 takes no field selector; ListWatch does.
    const selector = 'metadata.name=node-a';
    const informer = new ListWatch<V1Node>('/api/v1/nodes', new Watch(kc), () => core.listNode({ fieldSelector: selector }), false, undefined, selector);
    t.after(() => informer.stop());
    const log = record(informer);
    await informer.start();
    assert.deepEqual(names(informer.list()), ['node-a']);
    await server.waitFor(() => server.openWatches().length === 1, 5000, 'the watch');
    assert.equal(server.openWatches()[0]!.query.fieldSelector, selector);

    server.patch('nodes', 'node-b', { metadata: { labels: { role: 'infra' } } });
    server.patch('nodes', 'node-a', { metadata: { labels: { role: 'infra' } } });
    await server.waitFor(() => log.updated.length === 1, 5000, 'the update of node-a');
    assert.equal(log.updated[0]!.metadata?.name, 'node-a');
    assert.equal(informer.get('node-a')?.metadata?.labels?.role, 'infra');
    assert.equal(informer.get('node-a')?.metadata?.resourceVersion, server.resourceVersion);

    server.remove('nodes', 'node-a');
    await server.waitFor(() => log.deleted.length === 1, 5000, 'the deletion of node-a');
    assert.deepEqual(names(log.deleted), ['node-a']);
    assert.deepEqual(names(log.added), ['node-a'], 'node-b never reached this informer');
    assert.deepEqual(informer.list(), []);
  });

  test('a label-selected informer (makeInformer) gets DELETED when a node stops matching and ADDED when one starts', async (t) => {
    const server = await startServer(t);
    const kc = server.kubeConfig();
    const core = kc.makeApiClient(CoreV1Api);
    server.create(node('node-a', { pool: 'gpu' }));
    server.create(node('node-b', { pool: 'cpu' }));

    const informer = makeInformer<V1Node>(kc, '/api/v1/nodes', () => core.listNode({ labelSelector: 'pool=gpu' }), 'pool=gpu');
    t.after(() => informer.stop());
    const log = record(informer);
    await informer.start();
    assert.deepEqual(names(informer.list()), ['node-a']);

    server.patch('nodes', 'node-b', { metadata: { labels: { pool: 'gpu' } } });
    server.patch('nodes', 'node-a', { metadata: { labels: { pool: 'cpu' } } });
    await server.waitFor(() => log.deleted.length === 1 && log.added.length === 2, 5000, 'node-b in, node-a out');
    assert.deepEqual(names(informer.list()), ['node-b']);
    assert.equal(log.deleted[0]!.metadata?.name, 'node-a');
  });

  test('pinnedimagesets: informer over CustomObjectsApi; uid, creationTimestamp, generation; .status ignored on main writes', async (t) => {
    const server = await startServer(t);
    const kc = server.kubeConfig();
    const custom = kc.makeApiClient(CustomObjectsApi);

    const created = await custom.createClusterCustomObject({ ...CR, body: pinnedImageSet('set-a', [IMAGE], { status: { observedGeneration: 7 } }) });
    assert.equal(created.metadata.generation, 1);
    assert.match(created.metadata.uid, /^[0-9a-f-]{36}$/);
    assert.match(created.metadata.creationTimestamp, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    assert.equal(created.status, undefined, 'status cannot be set on create');

    const informer = makeInformer<KubernetesObject>(kc, SETS_PATH, () => custom.listClusterCustomObject(CR));
    t.after(() => informer.stop());
    const log = record(informer);
    await informer.start();
    assert.deepEqual(names(informer.list()), ['set-a']);
    assert.equal(informer.get('set-a')?.kind, KIND, 'custom resource list items keep kind');

    // Metadata-only change: generation stays.
    await custom.patchClusterCustomObject({ ...CR, name: 'set-a', body: { metadata: { labels: { tier: 'a' } } } }, mergePatch);
    await server.waitFor(() => log.updated.length === 1, 5000, 'the label update');
    assert.equal(informer.get('set-a')?.metadata?.generation, 1);

    // Spec change through replace: generation 2; the status sent is ignored.
    const current = await custom.getClusterCustomObject({ ...CR, name: 'set-a' });
    current.spec.pinnedImages.push({ name: OTHER_IMAGE });
    current.status = { observedGeneration: 9 };
    const replaced = await custom.replaceClusterCustomObject({ ...CR, name: 'set-a', body: current });
    assert.equal(replaced.metadata.generation, 2);
    assert.equal(replaced.status, undefined);
    await server.waitFor(() => informer.get('set-a')?.metadata?.generation === 2, 5000, 'generation 2 in the informer');

    // Custom resources need a resourceVersion on update; a stale one conflicts.
    const { resourceVersion: _rv, ...noRv } = current.metadata;
    assertStatus(await failureOf(custom.replaceClusterCustomObject({ ...CR, name: 'set-a', body: { ...current, metadata: noRv } })), 422, 'Invalid');
    const conflict = await failureOf(custom.replaceClusterCustomObject({ ...CR, name: 'set-a', body: current }));
    assertStatus(conflict, 409, 'Conflict');
    assert.match(conflict.message ?? '', /pinnedimagesets\.pinset\.dev "set-a": the object has been modified/);

    const deleted = (await custom.deleteClusterCustomObject({ ...CR, name: 'set-a' })) as KubeStatus;
    assert.equal(deleted.status, 'Success');
    await server.waitFor(() => log.deleted.length === 1, 5000, 'the deletion');
    assert.deepEqual(informer.list(), []);
  });

  test('status subresource: PATCH and PUT change only .status and keep the generation', async (t) => {
    const server = await startServer(t);
    const custom = server.kubeConfig().makeApiClient(CustomObjectsApi);
    server.create(pinnedImageSet('set-a', [IMAGE]));

    const condition = { type: 'Ready', status: 'True', reason: 'AllNodesReady', message: '1/1', observedGeneration: 1, lastTransitionTime: '2025-01-01T00:00:00Z' };
    const patched = await custom.patchClusterCustomObjectStatus(
      { ...CR, name: 'set-a', body: { status: { observedGeneration: 1, conditions: [condition] }, spec: { pinnedImages: [] }, metadata: { labels: { x: 'y' } } } },
      mergePatch,
    );
    assert.deepEqual(patched.status, { observedGeneration: 1, conditions: [condition] });
    assert.deepEqual(patched.spec.pinnedImages, [{ name: IMAGE }], 'spec is not written through /status');
    assert.equal(patched.metadata.labels, undefined, 'metadata is not written through /status');
    assert.equal(patched.metadata.generation, 1);
    const req = server.requests.at(-1)!;
    assert.equal(req.path, `${SETS_PATH}/set-a/status`);
    assert.equal(req.contentType, 'application/merge-patch+json');

    const got = await custom.getClusterCustomObjectStatus({ ...CR, name: 'set-a' });
    got.status = { observedGeneration: 1, nodes: { matched: 2, ready: 1, progressing: 1, degraded: 0 } };
    got.spec.pinnedImages = [];
    const replaced = await custom.replaceClusterCustomObjectStatus({ ...CR, name: 'set-a', body: got });
    assert.deepEqual(replaced.status, got.status, 'PUT /status replaces the whole status');
    assert.deepEqual(replaced.spec.pinnedImages, [{ name: IMAGE }]);
    assert.equal(replaced.metadata.generation, 1);

    assertStatus(await failureOf(custom.replaceClusterCustomObjectStatus({ ...CR, name: 'set-a', body: got })), 409, 'Conflict');
  });

  test('a watch from a compacted resourceVersion gets ERROR 410 Expired inside a 200 stream, which then ends', async (t) => {
    const server = await startServer(t);
    const kc = server.kubeConfig();
    server.create(node('node-a'));
    const old = server.resourceVersion;
    server.create(node('node-b'));
    server.compact();

    const expired = await openWatch(kc, '/api/v1/nodes', { resourceVersion: old });
    assert.equal(await expired.done, null, 'the stream ends without a transport error');
    assert.equal(expired.events.length, 1);
    assert.equal(expired.events[0]!.type, 'ERROR');
    assert.equal(expired.events[0]!.object.kind, 'Status');
    assert.equal(expired.events[0]!.object.code, 410);
    assert.equal(expired.events[0]!.object.reason, 'Expired');
    assert.equal(server.requests.at(-1)!.status, 200);

    // From the current resourceVersion the watch works and sees only what follows.
    const current = await openWatch(kc, '/api/v1/nodes', { resourceVersion: server.resourceVersion });
    t.after(current.stop);
    server.create(node('node-c'));
    await server.waitFor(() => current.events.length === 1, 5000, 'the ADDED event');
    assert.equal(current.events[0]!.type, 'ADDED');
    assert.equal(current.events[0]!.object.metadata?.name, 'node-c');

    // Without a resourceVersion the watch starts with ADDED for every current object.
    const fromNow = await openWatch(kc, '/api/v1/nodes', {});
    t.after(fromNow.stop);
    await server.waitFor(() => fromNow.events.length === 3, 5000, 'three synthetic ADDED events');
    assert.deepEqual(
      fromNow.events.map((e) => `${e.type} ${e.object.metadata?.name}`),
      ['ADDED node-a', 'ADDED node-b', 'ADDED node-c'],
    );
  });

  test('an informer that missed changes while the server was away gets 410, relists and converges', async (t) => {
    const server = await startServer(t);
    const kc = server.kubeConfig();
    const core = kc.makeApiClient(CoreV1Api);
    server.create(node('node-a'));
    server.create(node('node-b'));

    const informer = makeInformer<V1Node>(kc, '/api/v1/nodes', () => core.listNode());
    const log = record(informer);
    // The documented client-node pattern: an informer stops on error and its owner restarts it.
    let stopped = false;
    informer.on('error', () => {
      setTimeout(() => {
        if (!stopped) void informer.start();
      }, 20);
    });
    t.after(() => {
      stopped = true;
      return informer.stop();
    });
    await informer.start();
    await server.waitFor(() => server.openWatches().length === 1, 5000, 'the first watch');
    const seenRv = server.resourceVersion;

    server.setAvailable(false);
    await server.waitFor(() => log.errors.length > 0, 5000, 'the informer to notice');
    server.remove('nodes', 'node-b');
    server.patch('nodes', 'node-a', { metadata: { labels: { moved: 'yes' } } });
    server.create(node('node-c'));
    server.compact();
    server.setAvailable(true);

    await server.waitFor(
      () => names(informer.list()).join() === 'node-a,node-c' && informer.get('node-a')?.metadata?.labels?.moved === 'yes',
      10000,
      'the informer to converge',
    );
    assert.deepEqual(names(log.deleted), ['node-b']);
    // list, watch, (server away), watch from the old resourceVersion -> 410, list, watch.
    // The informer converges on the relist; its next watch follows a moment later.
    const nodeRequests = () => server.requests.filter((r) => r.path === '/api/v1/nodes');
    await server.waitFor(() => nodeRequests().length >= 5, 5000, 'the watch after the relist');
    assert.deepEqual(
      nodeRequests().slice(0, 5).map((r) => (r.query.watch ? `watch ${r.query.resourceVersion}` : 'list')),
      ['list', `watch ${seenRv}`, `watch ${seenRv}`, 'list', `watch ${server.resourceVersion}`],
    );
  });

  test('dropped watches: a clean end resumes from the last resourceVersion; an abrupt one errors and a restart resumes', async (t) => {
    const server = await startServer(t);
    const kc = server.kubeConfig();
    const core = kc.makeApiClient(CoreV1Api);
    server.create(node('node-a'));
    const informer = makeInformer<V1Node>(kc, '/api/v1/nodes', () => core.listNode());
    const log = record(informer);
    let stopped = false;
    informer.on('error', () => {
      setTimeout(() => {
        if (!stopped) void informer.start();
      }, 20);
    });
    t.after(() => {
      stopped = true;
      return informer.stop();
    });
    await informer.start();
    await server.waitFor(() => server.openWatches().length === 1, 5000, 'the watch');
    const lists = () => server.requests.filter((r) => r.path === '/api/v1/nodes' && r.query.watch === undefined).length;
    assert.equal(lists(), 1);

    // Clean end of stream (what the server's own watch timeout looks like): the informer reconnects by itself.
    let rv = server.resourceVersion;
    let mark = server.requests.length;
    assert.equal(server.dropWatches({ graceful: true }), 1);
    server.create(node('node-b'));
    await server.waitFor(() => informer.get('node-b'), 5000, 'node-b after the clean drop');
    assert.equal(log.errors.length, 0);
    assert.equal(server.requests[mark]?.query.watch, 'true');
    assert.equal(server.requests[mark]?.query.resourceVersion, rv, 'resumed from the last resourceVersion');

    // Abrupt end (connection cut): the informer reports an error; restarted, it resumes without a relist.
    await server.waitFor(() => server.openWatches().length === 1, 5000, 'the second watch');
    rv = server.resourceVersion;
    mark = server.requests.length;
    assert.equal(server.dropWatches(), 1);
    server.create(node('node-c'));
    await server.waitFor(() => informer.get('node-c'), 5000, 'node-c after the abrupt drop');
    assert.ok(log.errors.length >= 1, 'the cut was reported');
    assert.equal(server.requests[mark]?.query.watch, 'true');
    assert.equal(server.requests[mark]?.query.resourceVersion, rv);
    assert.equal(lists(), 1, 'no relist was needed');
    assert.deepEqual(names(log.added), ['node-a', 'node-b', 'node-c']);
  });

  test('bookmarks carry only kind, apiVersion and the last event\'s resourceVersion, and only when asked for', async (t) => {
    const server = await startServer(t, { bookmarkIntervalMs: 20 });
    const kc = server.kubeConfig();
    server.create(node('node-a'));

    const withMarks = await openWatch(kc, '/api/v1/nodes', { resourceVersion: server.resourceVersion, allowWatchBookmarks: true });
    t.after(withMarks.stop);
    const without = await openWatch(kc, '/api/v1/nodes', { resourceVersion: server.resourceVersion });
    t.after(without.stop);
    const bookmarks = () => withMarks.events.filter((e) => e.type === 'BOOKMARK');
    await server.waitFor(() => bookmarks().length >= 2, 5000, 'two bookmarks');
    assert.deepEqual(bookmarks()[0]!.object, { kind: 'Node', apiVersion: 'v1', metadata: { resourceVersion: server.resourceVersion } });

    server.create(node('node-b'));
    const after = server.resourceVersion;
    // A change to another resource moves the global resourceVersion, not the nodes' watch cache.
    server.create(pinnedImageSet('elsewhere', [IMAGE]));
    await server.waitFor(() => bookmarks().some((b) => b.object.metadata?.resourceVersion === after), 5000, 'a bookmark at the new resourceVersion');
    await server.waitFor(() => without.events.length === 1, 5000, 'the ADDED event on the other watch');
    assert.ok(bookmarks().every((b) => Number(b.object.metadata?.resourceVersion) <= Number(after)), 'bookmarks name the nodes\' last event');
    assert.deepEqual(
      without.events.map((e) => e.type),
      ['ADDED'],
      'no bookmarks without allowWatchBookmarks',
    );
  });

  test('a quiet watch on a resource nothing has touched since the server started gets no bookmark at all, not even before its timeout', async (t) => {
    const server = await startServer(t, { bookmarkIntervalMs: 50 });
    server.create(node('node-a'));
    server.restart(); // node-a is now in "etcd" only: the new watch cache has processed no event
    const started = Date.now();
    const w = await openWatch(server.kubeConfig(), '/api/v1/nodes', { resourceVersion: server.resourceVersion, timeoutSeconds: 3, allowWatchBookmarks: true });
    t.after(w.stop);
    assert.equal(await w.done, null, 'ended by the server, cleanly');
    assert.ok(Date.now() - started >= 2900, 'not before timeoutSeconds');
    assert.deepEqual(w.events, [], 'nothing at all: no periodic bookmark, no pre-timeout bookmark');

    // An etcd progress notification is an event for the watch cache: bookmarks flow from then on.
    server.progressNotify();
    const after = await openWatch(server.kubeConfig(), '/api/v1/nodes', { resourceVersion: server.resourceVersion, allowWatchBookmarks: true });
    t.after(after.stop);
    await server.waitFor(() => after.events.length >= 2, 5000, 'periodic bookmarks after the progress notification');
    assert.ok(after.events.every((e) => e.type === 'BOOKMARK' && e.object.metadata?.resourceVersion === server.resourceVersion));
  });

  test('timeoutSeconds ends the watch cleanly; with bookmarks allowed and an event processed, one bookmark comes 2 s before the end', async (t) => {
    const server = await startServer(t); // bookmarkFrequency 1 minute: only the pre-timeout bookmark fits in 3 s
    server.create(node('node-a'));
    const started = Date.now();
    const w = await openWatch(server.kubeConfig(), '/api/v1/nodes', { resourceVersion: server.resourceVersion, timeoutSeconds: 3, allowWatchBookmarks: true });
    t.after(w.stop);
    let bookmarkAt = 0;
    void server.waitFor(() => w.events.length > 0, 10_000).then(() => (bookmarkAt = Date.now()), () => {});
    assert.equal(await w.done, null);
    const endedAt = Date.now();
    assert.deepEqual(w.events.map((e) => e.type), ['BOOKMARK']);
    assert.equal(w.events[0]!.object.metadata?.resourceVersion, server.resourceVersion);
    assert.ok(bookmarkAt > 0 && endedAt - bookmarkAt >= 1000, `the bookmark came well before the end (${endedAt - bookmarkAt} ms)`);
    assert.ok(endedAt - started >= 2900, 'not before timeoutSeconds');
    assert.equal(server.openWatches().length, 0);

    // A watch shorter than 2 s has no pre-timeout bookmark, as on the real server.
    const short = await openWatch(server.kubeConfig(), '/api/v1/nodes', { resourceVersion: server.resourceVersion, timeoutSeconds: 1, allowWatchBookmarks: true });
    t.after(short.stop);
    assert.equal(await short.done, null);
    assert.deepEqual(short.events, []);
  });

  test('restart(): watches end cleanly and resuming from an older resourceVersion gets 410 Expired', async (t) => {
    const server = await startServer(t);
    server.create(node('node-a'));
    const rv = server.resourceVersion;
    const w = await openWatch(server.kubeConfig(), '/api/v1/nodes', { resourceVersion: rv, allowWatchBookmarks: true });
    server.create(node('node-b'));
    await server.waitFor(() => w.events.length === 1, 5000, 'node-b');
    server.restart();
    assert.equal(await w.done, null);
    const again = await openWatch(server.kubeConfig(), '/api/v1/nodes', { resourceVersion: rv });
    assert.equal(await again.done, null);
    assert.deepEqual(again.events.map((e) => `${e.type} ${e.object.code}`), ['ERROR 410']);
    assert.equal(server.list('nodes').length, 2, 'the objects survive');
  });

  test('managedFields: each write records its field manager as the owner of the fields it changed', async (t) => {
    const server = await startServer(t);
    const kc = server.kubeConfig();
    const core = kc.makeApiClient(CoreV1Api);
    await core.createNode({ body: { metadata: { name: 'node-a', labels: { zone: 'a' } } }, fieldManager: 'kubelet' });
    await core.patchNode(
      { name: 'node-a', body: { metadata: { annotations: { [STATUS_ANNOTATION]: '{}' } } }, fieldManager: 'pinset-agent' },
      mergePatch,
    );
    // Without fieldManager the manager is the User-Agent's product, as on the real server.
    await core.patchNode({ name: 'node-a', body: { metadata: { labels: { zone: 'b' } } } }, mergePatch);
    const n = server.get('nodes', 'node-a')!;
    const entries = n.metadata.managedFields as { manager: string; operation: string; fieldsV1: Record<string, unknown> }[];
    const byManager = Object.fromEntries(entries.map((e) => [e.manager, e]));
    assert.deepEqual(byManager['pinset-agent']!.fieldsV1, { 'f:metadata': { 'f:annotations': { [`f:${STATUS_ANNOTATION}`]: {} } } });
    assert.equal(byManager['pinset-agent']!.operation, 'Update');
    const ua = server.requests.at(-1)!.userAgent.split('/')[0]!;
    assert.ok(ua, 'the client sent a User-Agent');
    assert.deepEqual(byManager[ua]!.fieldsV1, { 'f:metadata': { 'f:labels': { 'f:zone': {} } } });
    assert.equal(byManager.kubelet, undefined, 'the kubelet no longer owns anything: its only field was taken over');
    assert.equal(server.requests.filter((r) => r.query.fieldManager === 'pinset-agent').length, 1);

    // A write that changes nothing changes no managedFields and no resourceVersion.
    const before = server.get('nodes', 'node-a')!;
    await core.patchNode({ name: 'node-a', body: { metadata: { labels: { zone: 'b' } } }, fieldManager: 'someone-else' }, mergePatch);
    assert.deepEqual(server.get('nodes', 'node-a'), before);
  });

  test('leases: optimistic concurrency; of two writers with the same resourceVersion one wins and one gets 409', async (t) => {
    const server = await startServer(t);
    const coord = server.kubeConfig().makeApiClient(CoordinationV1Api);
    const namespace = 'pinset-system';
    const renewTime = new Date('2025-01-01T00:00:00.000Z');
    const created = await coord.createNamespacedLease({
      namespace,
      body: { metadata: { name: 'pinset-controller' }, spec: { holderIdentity: 'a', leaseDurationSeconds: 15, renewTime } },
    });
    assert.equal(created.metadata?.namespace, namespace);
    // MicroTime comes back in the server's microsecond format (client-node leaves it a string).
    assert.equal(String(created.spec?.renewTime), '2025-01-01T00:00:00.000000Z');

    const seen = await coord.readNamespacedLease({ name: 'pinset-controller', namespace });
    const attempt = (holder: string) =>
      coord.replaceNamespacedLease({ name: 'pinset-controller', namespace, body: { ...seen, spec: { ...seen.spec, holderIdentity: holder } } });
    const results = await Promise.allSettled([attempt('b'), attempt('c')]);
    const won = results.filter((r) => r.status === 'fulfilled');
    const lost = results.filter((r) => r.status === 'rejected');
    assert.equal(won.length, 1);
    assert.equal(lost.length, 1);
    const status = await failureOf(Promise.reject((lost[0] as PromiseRejectedResult).reason));
    assertStatus(status, 409, 'Conflict');
    assert.equal(
      status.message,
      'Operation cannot be fulfilled on leases.coordination.k8s.io "pinset-controller": the object has been modified; please apply your changes to the latest version and try again',
    );
    assert.deepEqual(status.details, { name: 'pinset-controller', group: 'coordination.k8s.io', kind: 'leases' });
    const holder = (won[0] as PromiseFulfilledResult<{ spec?: { holderIdentity?: string } }>).value.spec?.holderIdentity;
    const holderOf = () => (server.get('leases', 'pinset-controller', namespace)?.spec as { holderIdentity?: string } | undefined)?.holderIdentity;
    assert.equal(holderOf(), holder);

    // Without a resourceVersion a lease update is unconditional (leases allow it).
    const { resourceVersion: _rv, ...meta } = seen.metadata!;
    await coord.replaceNamespacedLease({ name: 'pinset-controller', namespace, body: { ...seen, metadata: meta, spec: { ...seen.spec, holderIdentity: 'd' } } });
    assert.equal(holderOf(), 'd');

    await coord.deleteNamespacedLease({ name: 'pinset-controller', namespace });
    assertStatus(await failureOf(coord.readNamespacedLease({ name: 'pinset-controller', namespace })), 404, 'NotFound');
  });

  test('leases: a watch on one Lease by name hears that Lease alone, as the watch cache dispatches it; other Leases\' renewals reach it only as bookmarks', async (t) => {
    // cacher.go indexes a watch whose scope is (namespace, name) (the request's
    // namespace, fieldSelector metadata.name) under that pair and dispatches it
    // only that object's events; bookmarks go to every watcher that asked,
    // at the resource's last processed resourceVersion.
    const server = await startServer(t, { bookmarkIntervalMs: 100 });
    const kc = server.kubeConfig();
    const lease = (name: string, namespace: string, holder: string): KubeObject => ({
      apiVersion: 'coordination.k8s.io/v1',
      kind: 'Lease',
      metadata: { name, namespace },
      spec: { holderIdentity: holder, leaseDurationSeconds: 60, renewTime: '2026-01-01T00:00:00.000000Z' },
    });
    server.create(lease('slot-0', 'pinset-system', 'holder'));
    const path = '/apis/coordination.k8s.io/v1/namespaces/pinset-system/leases';
    const mine = await openWatch(kc, path, { fieldSelector: 'metadata.name=web.node-a.queue', resourceVersion: server.resourceVersion, allowWatchBookmarks: true });
    t.after(mine.stop);
    const before = server.watchEvents.leases?.MODIFIED ?? 0;
    for (let i = 1; i <= 5; i++) server.patch('leases', 'slot-0', { spec: { renewTime: `2026-01-01T00:00:0${i}.000000Z` } }, 'pinset-system');
    server.create(lease('web.node-a.queue', 'other-namespace', 'node-a'));
    server.create(lease('web.node-a.queue', 'pinset-system', 'node-a'));
    server.patch('leases', 'web.node-a.queue', { metadata: { annotations: { 'pinset.dev/granted-slot': 'web-0' } } }, 'pinset-system');
    server.remove('leases', 'web.node-a.queue', 'pinset-system');
    await server.waitFor(() => mine.events.some((e) => e.type === 'DELETED'), 5000, 'the DELETED event');
    const lastRv = server.resourceVersion;
    server.patch('leases', 'slot-0', { spec: { renewTime: '2026-01-01T00:00:09.000000Z' } }, 'pinset-system');
    await server.waitFor(() => mine.events.some((e) => e.type === 'BOOKMARK' && Number(e.object.metadata?.resourceVersion) > Number(lastRv)), 5000, 'a bookmark past the last event it got');
    const changes = mine.events.filter((e) => e.type !== 'BOOKMARK');
    assert.deepEqual(
      changes.map((e) => `${e.type} ${e.object.metadata?.name}`),
      ['ADDED web.node-a.queue', 'MODIFIED web.node-a.queue', 'DELETED web.node-a.queue'],
      'its own Lease\'s events, none of the slot\'s renewals, none of the same name elsewhere',
    );
    assert.equal(server.watchEvents.leases!.MODIFIED! - before, 1, 'the renewals were sent to nobody');

    // Resumed from a resourceVersion compacted away: 410 inside the stream, as for any watch.
    server.compact();
    const expired = await openWatch(kc, path, { fieldSelector: 'metadata.name=web.node-a.queue', resourceVersion: lastRv });
    assert.equal(await expired.done, null);
    assert.deepEqual(expired.events.map((e) => [e.type, e.object.code]), [['ERROR', 410]]);
  });

  test('events: create with generateName, list by involvedObject field selector, patch', async (t) => {
    const server = await startServer(t);
    const core = server.kubeConfig().makeApiClient(CoreV1Api);
    const involvedObject = { kind: 'Node', name: 'node-a', uid: 'u-1' };
    const ev = await core.createNamespacedEvent({
      namespace: 'default',
      body: { metadata: { generateName: 'node-a.' }, involvedObject, reason: 'SetReady', message: 'set-a is ready', type: 'Normal', count: 1 },
    });
    assert.match(ev.metadata?.name ?? '', /^node-a\.[a-z0-9]{5}$/);
    await core.createNamespacedEvent({
      namespace: 'default',
      body: { metadata: { name: 'node-b.1' }, involvedObject: { kind: 'Node', name: 'node-b' }, reason: 'PullFailed', message: 'x', type: 'Warning' },
    });

    const forA = await core.listNamespacedEvent({ namespace: 'default', fieldSelector: 'involvedObject.kind=Node,involvedObject.name=node-a' });
    assert.deepEqual(names(forA.items), [ev.metadata!.name]);
    assert.equal((await core.listEventForAllNamespaces({ fieldSelector: 'type=Warning' })).items.length, 1);

    await core.patchNamespacedEvent({ name: ev.metadata!.name!, namespace: 'default', body: { count: 2 } }, mergePatch);
    assert.equal(server.list('events', { fieldSelector: 'reason=SetReady' })[0]!.count, 2);
    assert.equal(server.list('events', { namespace: 'other' }).length, 0);
  });

  test('secrets: stringData written into data, type Opaque by default, pull-secret types validated with their content redacted, type immutable, field selector type', async (t) => {
    const server = await startServer(t);
    const core = server.kubeConfig().makeApiClient(CoreV1Api);
    const config = JSON.stringify({ auths: { 'registry.test': { auth: Buffer.from('u:secret-pw').toString('base64') } } });
    const made = await core.createNamespacedSecret({ namespace: 'pinset-system', body: { metadata: { name: 'regcred' }, type: 'kubernetes.io/dockerconfigjson', stringData: { '.dockerconfigjson': config } } });
    assert.equal(Buffer.from(made.data!['.dockerconfigjson']!, 'base64').toString(), config, 'stringData lands in data, base64');
    assert.equal(made.stringData, undefined, 'stringData is never stored');
    const opaque = await core.createNamespacedSecret({ namespace: 'pinset-system', body: { metadata: { name: 'plain' }, data: { token: Buffer.from('x').toString('base64') } } });
    assert.equal(opaque.type, 'Opaque');
    assert.deepEqual(names((await core.listNamespacedSecret({ namespace: 'pinset-system', fieldSelector: 'type=kubernetes.io/dockerconfigjson' })).items), ['regcred']);

    const refused: [string, Record<string, unknown>, RegExp][] = [
      ['no .dockerconfigjson', { type: 'kubernetes.io/dockerconfigjson', data: {} }, /data\[\.dockerconfigjson\]/],
      ['not JSON', { type: 'kubernetes.io/dockerconfigjson', stringData: { '.dockerconfigjson': 'secret-pw {' } }, /<secret contents redacted>/],
      ['a dockercfg that is not a JSON object', { type: 'kubernetes.io/dockercfg', stringData: { '.dockercfg': '[1]' } }, /data\[\.dockercfg\]/],
      ['a bad data key', { data: { 'a b': 'eA==' } }, /valid config key/],
    ];
    for (const [what, body, message] of refused) {
      const st = await failureOf(core.createNamespacedSecret({ namespace: 'pinset-system', body: { metadata: { name: 'bad' }, ...body } as never }));
      assert.equal(st.code, 422, what);
      assert.match(JSON.stringify(st), message, what);
      assert.doesNotMatch(JSON.stringify(st), /secret-pw/, `${what}: the content is not echoed`);
    }
    const badBase64 = await fetch(`${server.url}/api/v1/namespaces/pinset-system/secrets`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ metadata: { name: 'b64' }, data: { x: 'not base64!' } }) });
    assert.equal(badBase64.status, 400);
    await badBase64.body?.cancel();

    const changed = await failureOf(core.patchNamespacedSecret({ name: 'regcred', namespace: 'pinset-system', body: { type: 'Opaque' } }, mergePatch));
    assert.equal(changed.code, 422);
    assert.match(changed.message ?? '', /field is immutable/);
    const rotated = JSON.stringify({ auths: { 'registry.test': { auth: Buffer.from('u:rotated').toString('base64') } } });
    const patched = await core.patchNamespacedSecret({ name: 'regcred', namespace: 'pinset-system', body: { stringData: { '.dockerconfigjson': rotated } } }, mergePatch);
    assert.equal(Buffer.from(patched.data!['.dockerconfigjson']!, 'base64').toString(), rotated, 'a rotated secret through a patch of stringData');
    assert.equal(patched.type, 'kubernetes.io/dockerconfigjson');
  });

  test('configmaps: string data and base64 binaryData stored as given, listed by label (!= included), config keys validated, non-strings refused as the decoder refuses them', async (t) => {
    const server = await startServer(t);
    const core = server.kubeConfig().makeApiClient(CoreV1Api);
    const made = await core.createNamespacedConfigMap({ namespace: 'tools', body: { metadata: { name: 'app-config', labels: { team: 'a' } }, data: { 'settings.yaml': 'a: 1\n' }, binaryData: { 'logo.png': Buffer.from([0, 1, 2]).toString('base64') } } });
    assert.deepEqual(made.data, { 'settings.yaml': 'a: 1\n' });
    assert.equal(made.binaryData?.['logo.png'], 'AAEC');
    await core.createNamespacedConfigMap({ namespace: 'tools', body: { metadata: { name: 'mine', labels: { 'app.kubernetes.io/part-of': 'pinset' } } } });
    assert.deepEqual(names((await core.listNamespacedConfigMap({ namespace: 'tools', labelSelector: 'app.kubernetes.io/part-of!=pinset' })).items), ['app-config'], 'an object without the label matches !=');
    const refused: [string, Record<string, unknown>, RegExp][] = [
      ['a bad data key', { data: { 'a b': 'x' } }, /data\[a b\].*valid config key/],
      ['a key in data and binaryData', { data: { k: 'x' }, binaryData: { k: 'eA==' } }, /duplicate of key present in binaryData/],
    ];
    for (const [what, body, message] of refused) {
      const st = await failureOf(core.createNamespacedConfigMap({ namespace: 'tools', body: { metadata: { name: 'bad' }, ...body } as never }));
      assert.equal(st.code, 422, what);
      assert.match(JSON.stringify(st), message, what);
    }
    for (const body of [{ data: { n: 5 } }, { binaryData: { x: 'not base64!' } }]) {
      const res = await fetch(`${server.url}/api/v1/namespaces/tools/configmaps`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ metadata: { name: 'undecodable' }, ...body }) });
      assert.equal(res.status, 400, JSON.stringify(body));
      assert.match(((await res.json()) as KubeStatus).message ?? '', /cannot be handled as a ConfigMap/);
    }
  });

  test('finalizers delay deletion until the last one is removed', async (t) => {
    const server = await startServer(t);
    const custom = server.kubeConfig().makeApiClient(CustomObjectsApi);
    server.create(pinnedImageSet('set-a', [IMAGE], { metadata: { name: 'set-a', finalizers: ['pinset.dev/cleanup'] } }));

    const marked = (await custom.deleteClusterCustomObject({ ...CR, name: 'set-a' })) as KubeObject;
    assert.ok(marked.metadata.deletionTimestamp, 'marked for deletion');
    assert.ok(server.get('pinnedimagesets', 'set-a'), 'still there');
    await custom.patchClusterCustomObject({ ...CR, name: 'set-a', body: { metadata: { finalizers: null } } }, mergePatch);
    assert.equal(server.get('pinnedimagesets', 'set-a'), undefined);
  });

  test('while unavailable every request fails at the connection; the same URL serves again afterwards', async (t) => {
    const server = await startServer(t);
    const core = server.kubeConfig().makeApiClient(CoreV1Api);
    server.create(node('node-a'));
    server.setAvailable(false);
    await assert.rejects(core.listNode(), (err: unknown) => !(err instanceof ApiException), 'a transport error, not an HTTP answer');
    assert.equal(server.requests.length, 0);
    server.setAvailable(true);
    assert.deepEqual(names((await core.listNode()).items), ['node-a']);
  });

  test('a written kubeconfig works from another process; a configured token is required', async (t) => {
    const server = await startServer(t, { token: 'test-token-1' });
    server.create(node('node-a'));
    const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-apiserver-'));
    t.after(() => rm(dir, { recursive: true, force: true }));
    const file = await server.writeKubeconfig(dir);
    assert.equal((await stat(file)).mode & 0o777, 0o600);

    const script = `
      import { KubeConfig, CoreV1Api } from '@kubernetes/client-node';
      const kc = new KubeConfig();
      kc.loadFromDefault();
      const list = await kc.makeApiClient(CoreV1Api).listNode();
      console.log(JSON.stringify(list.items.map((n) => n.metadata.name)));
    `;
    const { stdout } = await run(process.execPath, ['--input-type=module', '-e', script], {
      cwd: path.resolve(import.meta.dirname, '../..'),
      env: { ...process.env, KUBECONFIG: file },
    });
    assert.deepEqual(JSON.parse(stdout), ['node-a']);

    const anonymous = await fetch(`${server.url}/api/v1/nodes`);
    assert.equal(anonymous.status, 401);
    assertStatus((await anonymous.json()) as KubeStatus, 401, 'Unauthorized');
  });

  test('test controls: errors are KubeStatusError; validators answer 422 with causes', async (t) => {
    const server = await startServer(t, {
      validators: { pinnedimagesets: (obj) => ((obj.spec as { pinnedImages?: unknown[] }).pinnedImages?.length ? [] : ['spec.pinnedImages: Required value']) },
    });
    server.create(node('node-a'));
    assert.throws(() => server.create(node('node-a')), (err: unknown) => err instanceof KubeStatusError && err.code === 409 && err.reason === 'AlreadyExists');
    assert.throws(() => server.patch('nodes', 'node-z', {}), (err: unknown) => err instanceof KubeStatusError && err.code === 404);

    const custom = server.kubeConfig().makeApiClient(CustomObjectsApi);
    const invalid = await failureOf(custom.createClusterCustomObject({ ...CR, body: pinnedImageSet('set-a', []) }));
    assertStatus(invalid, 422, 'Invalid');
    assert.equal(invalid.message, 'PinnedImageSet.pinset.dev "set-a" is invalid: spec.pinnedImages: Required value');
    assert.deepEqual(invalid.details?.causes, [{ reason: 'FieldValueInvalid', field: 'spec.pinnedImages', message: 'Required value' }]);

    // A test control may set or clear .status through the main resource; as
    // on the real server only a spec change moves the generation.
    server.create(pinnedImageSet('set-b', [IMAGE]));
    assert.equal(server.patch('pinnedimagesets', 'set-b', { status: { observedGeneration: 1 } }).metadata.generation, 1);
    assert.equal(server.patch('pinnedimagesets', 'set-b', { status: null }).metadata.generation, 1);
    assert.equal(server.patch('pinnedimagesets', 'set-b', { spec: { pinnedImages: [{ name: OTHER_IMAGE }] } }).metadata.generation, 2);
  });
});
