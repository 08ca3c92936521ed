// The in-process API server's CustomResourceDefinitions, as the real
// apiextensions-apiserver runs them (the sources read are named in
// test/support/apiserver.ts): the type served only while its CRD stands,
// and a CRD's deletion in its real order: marked (deletionTimestamp,
// finalizer, Terminating), every object deleted (watchers see DELETED),
// then the CRD gone, the type's watches ended, its paths 404. pinset's
// agent tells sets deleted by a user from sets going with their CRD by
// reading the CRD when it sees a deletion (src/agent/crd-check.ts), so the
// order (the CRD marked before the first DELETED) is what is tested here.
import assert from 'node:assert/strict';
import http from 'node:http';
import { describe, test, type TestContext } from 'node:test';
import { API_VERSION, CRD_NAME, GROUP, KIND, PLURAL, VERSION } from '../../src/api/types.ts';
import { ApiServer, CRD_CLEANUP_FINALIZER, type ApiServerOptions, type KubeObject } from '../support/apiserver.ts';
import { onLines } from '../support/lines.ts';

const SETS = `/apis/${GROUP}/${VERSION}/${PLURAL}`;
const CRDS = '/apis/apiextensions.k8s.io/v1/customresourcedefinitions';
const IMAGE = `registry.test/app@sha256:${'a'.repeat(64)}`;

async function startServer(t: TestContext, opts?: ApiServerOptions): Promise<ApiServer> {
  const server = await ApiServer.start(opts);
  t.after(() => server.stop());
  return server;
}

function set(name: string, extra: Record<string, unknown> = {}): KubeObject {
  return { apiVersion: API_VERSION, kind: KIND, metadata: { name, ...extra }, spec: { pinnedImages: [{ name: IMAGE }] } };
}

async function call(server: ApiServer, method: string, path: string, body?: unknown, contentType = 'application/json'): Promise<{ code: number; body: any }> {
  const res = await fetch(server.url + path, { method, headers: body === undefined ? {} : { 'Content-Type': contentType }, body: body === undefined ? undefined : JSON.stringify(body) });
  return { code: res.status, body: await res.json() };
}

interface Watched {
  events: { type: string; object: any; crdAtThatMoment?: { code: number; body: any } }[];
  ended: Promise<void>;
  close(): void;
}

/** A watch read line by line; with `probeCrd`, the CRD is read as each DELETED event arrives (as the agent does). */
function watch(server: ApiServer, path: string, probeCrd = false): Promise<Watched> {
  return new Promise((resolve, reject) => {
    const events: Watched['events'] = [];
    let ended!: () => void;
    const endedP = new Promise<void>((r) => (ended = r));
    const req = http.get(`${server.url}${path}?watch=true&resourceVersion=${server.resourceVersion}`, (res) => {
      assert.equal(res.statusCode, 200);
      onLines(res, (line) => {
        const ev = JSON.parse(line) as Watched['events'][number];
        events.push(ev);
        if (probeCrd && ev.type === 'DELETED') void call(server, 'GET', `${CRDS}/${CRD_NAME}`).then((r) => (ev.crdAtThatMoment = r));
      });
      res.on('end', () => ended());
      res.on('close', () => ended());
      resolve({ events, ended: endedP, close: () => req.destroy() });
    });
    req.on('error', reject);
  });
}

const condition = (crd: any, type: string) => (crd.status?.conditions ?? []).find((c: any) => c.type === type);

describe('the in-process API server serves a custom resource while its CRD stands', () => {
  test('by default the PinnedImageSet CRD of deploy/crds is installed and Established, and the type is served and discovered', async (t) => {
    const server = await startServer(t);
    const crd = await call(server, 'GET', `${CRDS}/${CRD_NAME}`);
    assert.equal(crd.code, 200);
    assert.equal(condition(crd.body, 'Established')?.status, 'True');
    assert.equal(crd.body.spec.names.plural, PLURAL);
    assert.equal((await call(server, 'GET', SETS)).code, 200);
    const groups = (await call(server, 'GET', '/apis')).body.groups.map((g: any) => g.name);
    assert.ok(groups.includes(GROUP));
  });

  test('without its CRD the type is 404 on every verb and absent from discovery; a CRD created over HTTP loses its status, is Established, and serves it', async (t) => {
    const server = await startServer(t, { crd: false });
    for (const [method, path, body] of [['GET', SETS], ['GET', `${SETS}?watch=true`], ['GET', `${SETS}/a`], ['POST', SETS, set('a')]] as const) {
      const r = await call(server, method, path, body);
      assert.equal(r.code, 404, `${method} ${path}`);
      assert.equal(r.body.message, 'the server could not find the requested resource');
    }
    assert.equal((await call(server, 'GET', `/apis/${GROUP}/${VERSION}`)).code, 404);
    assert.ok(!(await call(server, 'GET', '/apis')).body.groups.some((g: any) => g.name === GROUP));
    assert.throws(() => server.create(set('a')), /could not find the requested resource/);

    const crds = await watch(server, CRDS);
    t.after(() => crds.close());
    const manifest = { apiVersion: 'apiextensions.k8s.io/v1', kind: 'CustomResourceDefinition', metadata: { name: CRD_NAME }, spec: { group: GROUP, names: { plural: PLURAL, kind: KIND }, scope: 'Cluster', versions: [] }, status: { made: 'up' } };
    const created = await call(server, 'POST', CRDS, manifest);
    assert.equal(created.code, 201);
    await server.waitFor(() => crds.events.length >= 2, 2000, 'ADDED and MODIFIED of the CRD');
    assert.deepEqual(crds.events.map((e) => e.type).slice(0, 2), ['ADDED', 'MODIFIED']);
    assert.equal(crds.events[0]!.object.status, undefined, 'the status given on create is dropped');
    assert.equal(condition(crds.events[1]!.object, 'Established')?.status, 'True');
    assert.equal((await call(server, 'POST', SETS, set('a'))).code, 201);
  });
});

describe('deleting a CRD: its objects first, then the CRD, then the type', () => {
  test('DELETE marks the CRD; each set is deleted while the CRD reads as being deleted; then the CRD goes, the watch ends, the type is 404', async (t) => {
    const server = await startServer(t, { crdTeardownMs: 200 });
    for (const n of ['a', 'b', 'c']) server.create(set(n));
    const sets = await watch(server, SETS, true);
    const crds = await watch(server, CRDS);
    t.after(() => {
      sets.close();
      crds.close();
    });

    const del = await call(server, 'DELETE', `${CRDS}/${CRD_NAME}`);
    assert.equal(del.code, 200, 'answered at once, with the object, not a Status');
    assert.equal(del.body.kind, 'CustomResourceDefinition');
    assert.ok(del.body.metadata.deletionTimestamp);
    assert.deepEqual(del.body.metadata.finalizers, [CRD_CLEANUP_FINALIZER]);
    assert.deepEqual(
      { status: condition(del.body, 'Terminating')?.status, reason: condition(del.body, 'Terminating')?.reason },
      { status: 'True', reason: 'InstanceDeletionPending' },
    );

    await sets.ended;
    const deleted = sets.events.filter((e) => e.type === 'DELETED');
    assert.deepEqual(deleted.map((e) => e.object.metadata.name).sort(), ['a', 'b', 'c']);
    await server.waitFor(() => deleted.every((e) => e.crdAtThatMoment), 2000, 'the CRD read at each deletion');
    for (const e of deleted) {
      // What a watcher can learn when a set's DELETED arrives: the CRD is being deleted, or gone.
      const crd = e.crdAtThatMoment!;
      assert.ok(crd.code === 404 || crd.body.metadata.deletionTimestamp, `at ${e.object.metadata.name}'s deletion the CRD reads ${JSON.stringify(crd.body.metadata)}`);
    }

    await server.waitFor(() => crds.events.some((e) => e.type === 'DELETED'), 2000, 'the CRD deleted');
    const reasons = crds.events.map((e) => `${e.type} ${condition(e.object, 'Terminating')?.reason ?? '-'}`);
    // The update that removes the last finalizer is not stored: it deletes
    // (registry/generic/registry/store.go Update, errEmptiedFinalizers), and
    // the DELETED event carries the CRD as last stored.
    assert.deepEqual(reasons, ['MODIFIED InstanceDeletionPending', 'MODIFIED InstanceDeletionInProgress', 'DELETED InstanceDeletionInProgress']);
    assert.equal((await call(server, 'GET', `${CRDS}/${CRD_NAME}`)).code, 404);
    assert.equal((await call(server, 'GET', SETS)).code, 404);
    assert.equal((await call(server, 'GET', `${SETS}?watch=true`)).code, 404);
  });

  test('a set with a finalizer holds the CRD Terminating; creating a set meanwhile is 403; the finalizer removed, the CRD goes', async (t) => {
    const server = await startServer(t, { crdCleanupPollMs: 50 });
    server.create(set('held', { finalizers: ['example.com/hold'] }));
    server.create(set('free'));
    await call(server, 'DELETE', `${CRDS}/${CRD_NAME}`);
    await server.waitFor(() => !server.get('pinnedimagesets', 'free'), 2000, 'the set without finalizers deleted');
    const held = server.get('pinnedimagesets', 'held')!;
    assert.ok(held.metadata.deletionTimestamp, 'the set with a finalizer is only marked');
    const crd = (await call(server, 'GET', `${CRDS}/${CRD_NAME}`)).body;
    assert.equal(condition(crd, 'Terminating').reason, 'InstanceDeletionInProgress');

    const refused = await call(server, 'POST', SETS, set('new'));
    assert.equal(refused.code, 403);
    assert.equal(refused.body.reason, 'Forbidden');
    assert.equal(refused.body.message, `${PLURAL}.${GROUP} "new" is forbidden: create not allowed while custom resource definition is terminating`);
    assert.equal((await call(server, 'GET', SETS)).code, 200, 'lists still served while terminating');
    assert.equal((await call(server, 'DELETE', `${CRDS}/${CRD_NAME}`)).body.metadata.deletionTimestamp, crd.metadata.deletionTimestamp, 'a second DELETE changes nothing');

    await call(server, 'PATCH', `${SETS}/held`, { metadata: { finalizers: null } }, 'application/merge-patch+json');
    await server.waitFor(async () => (await call(server, 'GET', `${CRDS}/${CRD_NAME}`)).code === 404, 2000, 'the CRD gone once its last object is');
  });

  test('a CRD created again serves the type again, with none of the old objects; a watch from before it is 410 Expired; the old watches end all the same', async (t) => {
    const server = await startServer(t, { crdTeardownMs: 300 });
    server.create(set('old'));
    const before = server.resourceVersion;
    const old = await watch(server, SETS);
    t.after(() => old.close());
    const manifest = (await call(server, 'GET', `${CRDS}/${CRD_NAME}`)).body;
    await call(server, 'DELETE', `${CRDS}/${CRD_NAME}`);
    await server.waitFor(async () => (await call(server, 'GET', SETS)).code === 404, 2000, 'the type gone');
    const again = { ...manifest, metadata: { name: CRD_NAME }, status: undefined };
    assert.equal((await call(server, 'POST', CRDS, again)).code, 201, 'created again before the old storage is torn down');
    await old.ended;
    const list = await call(server, 'GET', SETS);
    assert.equal(list.code, 200);
    assert.deepEqual(list.body.items, []);
    // The new storage's watch cache starts at its creation (cacher.go: "too old resource version").
    const res = await fetch(`${server.url}${SETS}?watch=true&resourceVersion=${before}`);
    const first = JSON.parse((await res.text()).split('\n')[0]!);
    assert.equal(first.type, 'ERROR');
    assert.equal(first.object.code, 410);
  });
});
