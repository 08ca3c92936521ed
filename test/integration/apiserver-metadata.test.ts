// The in-process API server (test/support/apiserver.ts) on what a client
// that watches thousands of Nodes relies on, with the headers and queries
// written out as a client sends them: content negotiation for metadata-only
// answers (PartialObjectMetadata, as controller-runtime's metadata informers
// and client-go's metadata client ask for them) and list pagination
// (limit/continue), each as the real kube-apiserver answers.
import assert from 'node:assert/strict';
import http from 'node:http';
import { describe, test, type TestContext } from 'node:test';
import { API_VERSION, GROUP, KIND, PLURAL, VERSION } from '../../src/api/types.ts';
import { ApiServer, type KubeObject, type KubeStatus } from '../support/apiserver.ts';
import { onLines } from '../support/lines.ts';

const NODES = '/api/v1/nodes';
const SETS = `/apis/${GROUP}/${VERSION}/${PLURAL}`;
const META_LIST = 'application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1';
const META_ONE = 'application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1';
const ACCEPTED = 'only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf';

async function startServer(t: TestContext): Promise<ApiServer> {
  const server = await ApiServer.start();
  t.after(() => server.stop());
  return server;
}

function node(name: string, labels: Record<string, string> = {}): KubeObject {
  return {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: { name, labels, annotations: { 'example.com/a': name } },
    spec: { podCIDR: '10.0.0.0/24' },
    status: { capacity: { cpu: '4' }, images: [{ names: ['registry.test/app:1'], sizeBytes: 1000 }] },
  };
}

interface Answer {
  code: number;
  contentType: string;
  body: Record<string, any>;
}

async function request(server: ApiServer, method: string, path: string, headers: Record<string, string> = {}, body?: unknown): Promise<Answer> {
  const res = await fetch(server.url + path, {
    method,
    headers: { ...(body === undefined ? {} : { 'Content-Type': 'application/merge-patch+json' }), ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { code: res.status, contentType: res.headers.get('content-type') ?? '', body: (await res.json()) as Record<string, any> };
}

const get = (server: ApiServer, path: string, accept?: string) => request(server, 'GET', path, accept === undefined ? {} : { Accept: accept });

function assertFailure(a: Answer, code: number, reason: string, message?: string | RegExp): KubeStatus {
  const s = a.body as KubeStatus;
  assert.equal(a.code, code, JSON.stringify(s));
  assert.equal(s.kind, 'Status');
  assert.equal(s.status, 'Failure');
  assert.equal(s.code, code);
  assert.equal(s.reason, reason);
  if (typeof message === 'string') assert.equal(s.message, message);
  else if (message) assert.match(s.message ?? '', message);
  return s;
}

/** Opens a watch and collects its event lines until stopped. */
function openWatch(server: ApiServer, query: string, accept?: string) {
  const events: { type: string; object: Record<string, any> }[] = [];
  let req: http.ClientRequest;
  const opened = new Promise<void>((resolve, reject) => {
    req = http.get(`${server.url}${NODES}?watch=true&${query}`, { headers: accept ? { Accept: accept } : {} }, (res) => {
      assert.equal(res.statusCode, 200);
      onLines(res, (line) => events.push(JSON.parse(line)));
      res.on('error', () => {});
      resolve();
    });
    req.on('error', reject);
  });
  return { events, opened, stop: () => req.destroy() };
}

function decodeToken(token: string): { v: string; rv: number; start: string } {
  return JSON.parse(Buffer.from(token, 'base64url').toString('utf8'));
}

describe('in-process API server: metadata-only answers (Accept: ...;as=PartialObjectMetadata...)', () => {
  test('a list asked as PartialObjectMetadataList: the list\'s metadata and each item\'s whole metadata, nothing else', async (t) => {
    const server = await startServer(t);
    server.create(node('a', { role: 'worker' }));
    server.create(node('b'));
    const a = await get(server, NODES, META_LIST);
    assert.equal(a.code, 200);
    assert.equal(a.contentType, 'application/json');
    assert.equal(a.body.kind, 'PartialObjectMetadataList');
    assert.equal(a.body.apiVersion, 'meta.k8s.io/v1');
    assert.equal(a.body.metadata.resourceVersion, server.resourceVersion);
    assert.deepEqual(a.body.items.map((i: KubeObject) => i.metadata.name), ['a', 'b']);
    const [first] = a.body.items;
    assert.deepEqual(Object.keys(first).sort(), ['apiVersion', 'kind', 'metadata']);
    assert.equal(first.kind, 'PartialObjectMetadata');
    assert.equal(first.apiVersion, 'meta.k8s.io/v1');
    const stored = server.get('nodes', 'a')!;
    assert.deepEqual(first.metadata, stored.metadata, 'labels, annotations, uid, resourceVersion, managedFields: all of metadata');
    assert.deepEqual(first.metadata.labels, { role: 'worker' });
    assert.ok(Array.isArray(first.metadata.managedFields));

    // meta.k8s.io/v1beta1 is served too; custom resources as well.
    const beta = await get(server, NODES, 'application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1beta1');
    assert.equal(beta.body.apiVersion, 'meta.k8s.io/v1beta1');
    assert.equal(beta.body.items[0].apiVersion, 'meta.k8s.io/v1beta1');
    server.create({ apiVersion: API_VERSION, kind: KIND, metadata: { name: 's' }, spec: { pinnedImages: [] } });
    const sets = await get(server, SETS, META_LIST);
    assert.equal(sets.body.kind, 'PartialObjectMetadataList');
    assert.deepEqual(Object.keys(sets.body.items[0]).sort(), ['apiVersion', 'kind', 'metadata']);
    assert.equal(sets.body.items[0].metadata.generation, 1);
  });

  test('without a transformation the answer is the whole list, as before', async (t) => {
    const server = await startServer(t);
    server.create(node('a'));
    for (const accept of [undefined, 'application/json', 'application/json, */*;q=0.8', '*/*']) {
      const a = await get(server, NODES, accept);
      assert.equal(a.body.kind, 'NodeList', String(accept));
      assert.deepEqual(a.body.items[0].status.capacity, { cpu: '4' });
    }
  });

  test('clauses are tried by q and in order; one the server cannot serve is skipped; none left is 406', async (t) => {
    const server = await startServer(t);
    server.create(node('a'));
    // client-go's metadata client: the metadata form first, plain JSON as the fallback.
    assert.equal((await get(server, NODES, `${META_LIST},application/json`)).body.kind, 'PartialObjectMetadataList');
    assert.equal((await get(server, NODES, `application/json;q=0.5, ${META_LIST}`)).body.kind, 'PartialObjectMetadataList');
    // An unknown as=, or as= without g/v, is skipped: the next clause answers...
    assert.equal((await get(server, NODES, 'application/json;as=NodeSummary;g=meta.k8s.io;v=v1, application/json')).body.kind, 'NodeList');
    assert.equal((await get(server, NODES, 'application/json;as=PartialObjectMetadataList, application/json')).body.kind, 'NodeList');
    assert.equal((await get(server, NODES, 'application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v2, application/json')).body.kind, 'NodeList');
    // ...and when nothing is left the answer is 406, with nothing else done.
    assertFailure(await get(server, NODES, 'application/json;as=NodeSummary;g=meta.k8s.io;v=v1'), 406, 'NotAcceptable', ACCEPTED);
    assertFailure(await get(server, NODES, 'application/json;as=PartialObjectMetadataList'), 406, 'NotAcceptable', ACCEPTED);
    assertFailure(await get(server, NODES, 'text/html'), 406, 'NotAcceptable', ACCEPTED);
    const before = server.resourceVersion;
    assertFailure(await request(server, 'PATCH', `${NODES}/a`, { Accept: 'application/json;as=NodeSummary;g=meta.k8s.io;v=v1' }, { metadata: { labels: { x: 'y' } } }), 406, 'NotAcceptable');
    assert.equal(server.resourceVersion, before, 'a refused answer is refused before the write');
    assert.deepEqual(server.get('nodes', 'a')!.metadata.labels, {});
  });

  test('the single form on a list is 406 even with a fallback after it; the list form on one object is 406', async (t) => {
    const server = await startServer(t);
    server.create(node('a'));
    // The real server picks the first clause it allows and fails the
    // transformation afterwards; it does not go back to the next clause.
    for (const accept of [META_ONE, `${META_ONE},application/json`]) {
      assertFailure(await get(server, NODES, accept), 406, 'NotAcceptable', 'you requested PartialObjectMetadata, but the requested object is a list (*core.NodeList)');
    }
    const one = await get(server, `${NODES}/a`, META_ONE);
    assert.equal(one.code, 200);
    assert.deepEqual(one.body, { kind: 'PartialObjectMetadata', apiVersion: 'meta.k8s.io/v1', metadata: server.get('nodes', 'a')!.metadata });
    assertFailure(await get(server, `${NODES}/a`, META_LIST), 406, 'NotAcceptable', 'you requested PartialObjectMetadataList, but the requested object is not a list (*core.Node)');
    // A write answered in metadata only: the write happens, the answer is its metadata.
    const patched = await request(server, 'PATCH', `${NODES}/a`, { Accept: META_ONE }, { metadata: { labels: { role: 'worker' } } });
    assert.equal(patched.body.kind, 'PartialObjectMetadata');
    assert.deepEqual(patched.body.metadata.labels, { role: 'worker' });
    assert.equal(patched.body.status, undefined);
    // Errors are Status objects, never transformed.
    assertFailure(await get(server, `${NODES}/nope`, META_ONE), 404, 'NotFound');
  });

  test('encodings the stand-in does not write (YAML, protobuf) are refused, never answered as JSON', async (t) => {
    const server = await startServer(t);
    server.create(node('a'));
    assertFailure(await get(server, NODES, 'application/yaml'), 406, 'NotAcceptable', /only application\/json/);
    assertFailure(await get(server, NODES, `application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,${META_LIST}`), 406, 'NotAcceptable');
    assertFailure(await get(server, NODES, 'application/json;as=Table;g=meta.k8s.io;v=v1'), 406, 'NotAcceptable', /Table/);
  });

  test('a watch asked as PartialObjectMetadata: every event\'s object is metadata only, bookmarks too; the list form sends whole objects', async (t) => {
    const server = await startServer(t);
    server.create(node('a'));
    const rv = server.resourceVersion;
    const meta = openWatch(server, `resourceVersion=${rv}&allowWatchBookmarks=true&timeoutSeconds=60`, META_ONE);
    const whole = openWatch(server, `resourceVersion=${rv}`, META_LIST);
    t.after(() => {
      meta.stop();
      whole.stop();
    });
    await Promise.all([meta.opened, whole.opened]);
    await server.waitFor(() => server.openWatches().length === 2, 5000, 'both watches');
    server.create(node('b'));
    server.patch('nodes', 'b', { metadata: { labels: { role: 'worker' } }, status: { capacity: { cpu: '8' } } });
    server.remove('nodes', 'b');
    await server.waitFor(() => meta.events.length >= 3 && whole.events.length >= 3, 5000, 'three events on each watch');
    assert.deepEqual(meta.events.map((e) => e.type), ['ADDED', 'MODIFIED', 'DELETED']);
    for (const e of meta.events) {
      assert.deepEqual(Object.keys(e.object).sort(), ['apiVersion', 'kind', 'metadata']);
      assert.equal(e.object.kind, 'PartialObjectMetadata');
      assert.equal(e.object.apiVersion, 'meta.k8s.io/v1');
      assert.equal(e.object.metadata.name, 'b');
    }
    assert.deepEqual(meta.events[1]!.object.metadata.labels, { role: 'worker' });
    for (const e of whole.events) assert.equal(e.object.kind, 'Node', 'the list form on a watch: the original objects');
    assert.equal(whole.events[1]!.object.status.capacity.cpu, '8');

    // Bookmarks, once an event has been processed: PartialObjectMetadata with the resourceVersion.
    const bm = openWatch(server, `resourceVersion=${server.resourceVersion}&allowWatchBookmarks=true&timeoutSeconds=3`, META_ONE);
    t.after(() => bm.stop());
    await bm.opened;
    await server.waitFor(() => bm.events.some((e) => e.type === 'BOOKMARK'), 5000, 'a bookmark before the timeout');
    const bookmark = bm.events.find((e) => e.type === 'BOOKMARK')!;
    assert.deepEqual(bookmark.object, { kind: 'PartialObjectMetadata', apiVersion: 'meta.k8s.io/v1', metadata: { resourceVersion: server.resourceVersion } });
  });

  test('a server that transforms nothing (partialObjectMetadata: false) answers the fallback clause, or 406 without one', async (t) => {
    const server = await ApiServer.start({ partialObjectMetadata: false });
    t.after(() => server.stop());
    server.create(node('a'));
    const whole = await get(server, NODES, `${META_LIST},application/json`);
    assert.equal(whole.body.kind, 'NodeList');
    assert.deepEqual(whole.body.items[0].status.capacity, { cpu: '4' });
    assertFailure(await get(server, NODES, META_LIST), 406, 'NotAcceptable', ACCEPTED);
  });

  test('the Accept header of every request is recorded', async (t) => {
    const server = await startServer(t);
    await get(server, NODES, META_LIST);
    assert.equal(server.requests.at(-1)!.accept, META_LIST);
  });
});

describe('in-process API server: list pagination (limit and continue)', () => {
  async function fiveNodes(t: TestContext): Promise<ApiServer> {
    const server = await startServer(t);
    for (const n of ['a', 'b', 'c', 'd', 'e']) server.create(node(n, { role: n < 'd' ? 'worker' : 'infra' }));
    return server;
  }
  const names = (a: Answer) => a.body.items.map((i: KubeObject) => i.metadata.name);

  test('pages of `limit` items in key order, one resourceVersion for the whole list, remainingItemCount, no token on the last page', async (t) => {
    const server = await fiveNodes(t);
    const rv = server.resourceVersion;
    const p1 = await get(server, `${NODES}?limit=2`);
    assert.deepEqual(names(p1), ['a', 'b']);
    assert.equal(p1.body.metadata.resourceVersion, rv);
    assert.equal(p1.body.metadata.remainingItemCount, 3);
    assert.deepEqual(decodeToken(p1.body.metadata.continue), { v: 'meta.k8s.io/v1', rv: Number(rv), start: 'b\u0000' });
    const p2 = await get(server, `${NODES}?limit=2&continue=${p1.body.metadata.continue}`);
    assert.deepEqual(names(p2), ['c', 'd']);
    assert.equal(p2.body.metadata.resourceVersion, rv);
    assert.equal(p2.body.metadata.remainingItemCount, 1);
    const p3 = await get(server, `${NODES}?limit=2&continue=${p2.body.metadata.continue}`);
    assert.deepEqual(names(p3), ['e']);
    assert.equal(p3.body.metadata.resourceVersion, rv);
    assert.equal(p3.body.metadata.continue, undefined);
    assert.equal(p3.body.metadata.remainingItemCount, undefined);
    // Exactly full: no token either.
    assert.equal((await get(server, `${NODES}?limit=5`)).body.metadata.continue, undefined);
  });

  test('every page shows the list as it was at its first page: later creations, changes and deletions do not show', async (t) => {
    const server = await fiveNodes(t);
    const p1 = await get(server, `${NODES}?limit=2`);
    server.create(node('bb'));
    server.patch('nodes', 'c', { metadata: { labels: { role: 'changed' } } });
    server.remove('nodes', 'e');
    const p2 = await get(server, `${NODES}?limit=10&continue=${p1.body.metadata.continue}`);
    assert.deepEqual(names(p2), ['c', 'd', 'e']);
    assert.deepEqual(p2.body.items[0].metadata.labels, { role: 'worker' });
    assert.equal(p2.body.metadata.resourceVersion, p1.body.metadata.resourceVersion);
    // A new list sees today's objects.
    assert.deepEqual(names(await get(server, NODES)), ['a', 'b', 'bb', 'c', 'd']);
  });

  test('with selectors: only matches, no remainingItemCount, every match exactly once across the pages', async (t) => {
    const server = await fiveNodes(t);
    const seen: string[] = [];
    let token = '';
    let pages = 0;
    do {
      const a = await get(server, `${NODES}?limit=1&labelSelector=role%3Dinfra${token ? `&continue=${token}` : ''}`);
      assert.equal(a.body.metadata.remainingItemCount, undefined);
      seen.push(...names(a));
      token = a.body.metadata.continue ?? '';
      pages++;
    } while (token && pages < 10);
    assert.deepEqual(seen, ['d', 'e']);
  });

  test('metadata only and paginated: PartialObjectMetadataList pages carry continue and remainingItemCount', async (t) => {
    const server = await fiveNodes(t);
    const p1 = await get(server, `${NODES}?limit=3`, META_LIST);
    assert.equal(p1.body.kind, 'PartialObjectMetadataList');
    assert.equal(p1.body.metadata.remainingItemCount, 2);
    const p2 = await get(server, `${NODES}?limit=3&continue=${p1.body.metadata.continue}`, META_LIST);
    assert.deepEqual(names(p2), ['d', 'e']);
    assert.equal(p2.body.items[0].kind, 'PartialObjectMetadata');
  });

  test('a continue token whose resourceVersion was compacted is 410 Expired, offering one that continues at the latest resourceVersion', async (t) => {
    const server = await fiveNodes(t);
    const p1 = await get(server, `${NODES}?limit=2`);
    server.create(node('bb'));
    server.compact();
    const expired = assertFailure(await get(server, `${NODES}?limit=2&continue=${p1.body.metadata.continue}`), 410, 'Expired', /The provided continue parameter is too old to display a consistent list result/);
    const offered = expired.metadata.continue!;
    assert.deepEqual(decodeToken(offered), { v: 'meta.k8s.io/v1', rv: -1, start: 'b\u0000' });
    const rest = await get(server, `${NODES}?limit=10&continue=${offered}`);
    assert.deepEqual(names(rest), ['bb', 'c', 'd', 'e'], 'the rest, as it is now');
    assert.equal(rest.body.metadata.resourceVersion, server.resourceVersion);
    // Also when more writes than the history keeps have happened since.
    const small = await ApiServer.start({ historyLimit: 2 });
    t.after(() => small.stop());
    for (const n of ['a', 'b', 'c']) small.create(node(n));
    const first = await get(small, `${NODES}?limit=1`);
    for (const n of ['x', 'y', 'z']) small.create(node(n));
    assertFailure(await get(small, `${NODES}?limit=1&continue=${first.body.metadata.continue}`), 410, 'Expired');
  });

  test('an API server restart ends watches but not a paginated list (etcd serves the pages)', async (t) => {
    const server = await fiveNodes(t);
    const p1 = await get(server, `${NODES}?limit=2`);
    server.create(node('bb'));
    server.restart();
    const p2 = await get(server, `${NODES}?limit=10&continue=${p1.body.metadata.continue}`);
    assert.deepEqual(names(p2), ['c', 'd', 'e']);
  });

  test('bad tokens and a resourceVersion beside a token are 400; resourceVersion=0 ignores limit', async (t) => {
    const server = await fiveNodes(t);
    assertFailure(await get(server, `${NODES}?limit=2&continue=not*base64`), 400, 'BadRequest', /^invalid continue token: continue key is not valid/);
    const forged = Buffer.from(JSON.stringify({ v: 'meta.k8s.io/v2', rv: 3, start: 'b\u0000' })).toString('base64url');
    assertFailure(await get(server, `${NODES}?limit=2&continue=${forged}`), 400, 'BadRequest', /server does not recognize this encoded version/);
    const escape = Buffer.from(JSON.stringify({ v: 'meta.k8s.io/v1', rv: 3, start: '../secrets/x' })).toString('base64url');
    assertFailure(await get(server, `${NODES}?limit=2&continue=${escape}`), 400, 'BadRequest');
    const p1 = await get(server, `${NODES}?limit=2`);
    assertFailure(
      await get(server, `${NODES}?limit=2&resourceVersion=${server.resourceVersion}&continue=${p1.body.metadata.continue}`),
      400,
      'BadRequest',
      'specifying resource version is not allowed when using continue',
    );
    const cached = await get(server, `${NODES}?limit=2&resourceVersion=0`);
    assert.deepEqual(names(cached), ['a', 'b', 'c', 'd', 'e']);
    assert.equal(cached.body.metadata.continue, undefined);
  });
});
