// ListWatchCache (src/api/list-watch.ts) against the in-process API server:
// what the API server sees of one agent's or controller's watch, at rest,
// while the server is away, after compaction and after a restart.
import assert from 'node:assert/strict';
import { describe, test, type TestContext } from 'node:test';
import { KubeHttp } from '../../src/api/kube-http.ts';
import { ListWatchCache, type ListWatchOptions } from '../../src/api/list-watch.ts';
import { silentLogger } from '../../src/util/log.ts';
import { ApiServer, type KubeObject } from '../support/apiserver.ts';

type Node = KubeObject;

async function startServer(t: TestContext): Promise<ApiServer> {
  const server = await ApiServer.start();
  t.after(() => server.stop());
  return server;
}

function node(name: string, labels: Record<string, string> = {}): KubeObject {
  return { apiVersion: 'v1', kind: 'Node', metadata: { name, labels } };
}

function cache(t: TestContext, server: ApiServer, opts: Partial<ListWatchOptions> = {}) {
  const http = new KubeHttp(server.kubeConfig(), { userAgent: 'pinset-test' });
  const c = new ListWatchCache<Node>({ http, log: silentLogger(), what: 'nodes', path: '/api/v1/nodes', ...opts });
  const log = { added: [] as string[], updated: [] as string[], deleted: [] as string[], failures: 0, synced: 0 };
  c.on('add', (o) => log.added.push(o.metadata.name!));
  c.on('update', (o) => log.updated.push(o.metadata.name!));
  c.on('delete', (o) => log.deleted.push(o.metadata.name!));
  c.on('failure', () => log.failures++);
  c.on('synced', () => log.synced++);
  t.after(async () => {
    await c.stop();
    http.close();
  });
  return { c, log };
}

const watchesOf = (server: ApiServer) => server.requests.filter((r) => r.path === '/api/v1/nodes' && r.query.watch === 'true');
const listsOf = (server: ApiServer) => server.requests.filter((r) => r.path === '/api/v1/nodes' && r.query.watch === undefined);
const names = (c: ListWatchCache<Node>) => c.list().map((o) => o.metadata.name).sort();

describe('ListWatchCache', () => {
  test('lists once, then watches from the list\'s resourceVersion with bookmarks and a jittered timeoutSeconds', async (t) => {
    const server = await startServer(t);
    server.create(node('a'));
    const draws = [0, 0.999];
    const { c, log } = cache(t, server, { minWatchTimeoutMs: 600_000, random: () => draws.shift() ?? 0.5, fieldSelector: 'metadata.name=a' });
    c.start();
    await server.waitFor(() => server.openWatches().length === 1, 5000, 'the watch');
    assert.deepEqual(names(c), ['a']);
    assert.equal(log.synced, 1);
    const [list] = listsOf(server);
    assert.equal(list!.query.fieldSelector, 'metadata.name=a');
    const [watch] = watchesOf(server);
    assert.equal(watch!.query.resourceVersion, server.resourceVersion);
    assert.equal(watch!.query.allowWatchBookmarks, 'true');
    assert.equal(watch!.query.fieldSelector, 'metadata.name=a');
    // client-go's reflector: minWatchTimeout * (1 + rand); here min 10 minutes.
    const timeout = Number(watch!.query.timeoutSeconds);
    assert.ok(timeout >= 600 && timeout < 1200, String(timeout));
    assert.equal(watch!.userAgent, 'pinset-test');

    server.patch('nodes', 'a', { metadata: { labels: { x: '1' } } });
    await server.waitFor(() => c.get('a')?.metadata.labels?.x === '1', 5000, 'the update');
    assert.deepEqual(log.updated, ['a']);
  });

  test('a quiet watch stays open until the server ends it, then resumes from its resourceVersion: one request per timeout, no list', async (t) => {
    const server = await startServer(t);
    server.create(node('a'));
    server.restart(); // a watch cache that has processed nothing: no bookmarks, as on a freshly started API server
    // 1 to 2 s watches; a healthy one is one open for 0.5 s.
    const { c, log } = cache(t, server, { minWatchTimeoutMs: 1000, healthyAfterMs: 500 });
    c.start();
    await server.waitFor(() => watchesOf(server).length >= 4, 15_000, 'four watches');
    const watches = watchesOf(server);
    const rv = server.resourceVersion;
    assert.ok(watches.every((w) => w.query.resourceVersion === rv), 'every watch resumed from the same resourceVersion');
    assert.equal(listsOf(server).length, 1, 'never relisted');
    assert.equal(log.failures, 0, 'no watch was cut by the client');
    assert.deepEqual(names(c), ['a']);
  });

  test('while the API server is away: retries back off (doubling, capped, jittered); the cache keeps its objects', async (t) => {
    const server = await startServer(t);
    server.create(node('a'));
    const { c, log } = cache(t, server, { backoff: { baseMs: 100, capMs: 800 }, random: () => 1 });
    c.start();
    await server.waitFor(() => server.openWatches().length === 1, 5000, 'the watch');
    server.setAvailable(false);
    const mark = Date.now();
    await new Promise((r) => setTimeout(r, 4000));
    const attempts = log.failures;
    server.setAvailable(true);
    // Delays 100, 200, 400, 800, 800, ... ms: at most 1 + 2 + 2 + 4 = about 8 attempts in 4 s,
    // where a reset on every connection attempt would make 40 (one per 100 ms).
    assert.ok(attempts >= 3, `it kept retrying (${attempts})`);
    assert.ok(attempts <= 9, `${attempts} attempts in ${Date.now() - mark} ms: the backoff did not grow`);
    assert.deepEqual(names(c), ['a'], 'the last observation stays');
    assert.equal(log.deleted.length, 0);
    await server.waitFor(() => server.openWatches().length === 1, 10_000, 'the watch again');
    assert.equal(listsOf(server).length, 1, 'resumed without a relist: nothing was compacted');
  });

  test('a watch that is accepted and ends at once with nothing is paced like a failure', async (t) => {
    const server = await startServer(t);
    server.create(node('a'));
    const { c } = cache(t, server, { backoff: { baseMs: 100, capMs: 800 }, random: () => 1, healthyAfterMs: 60_000 });
    c.start();
    await server.waitFor(() => server.openWatches().length === 1, 5000, 'the watch');
    // A server (or proxy) that ends every watch right away.
    const stop = setInterval(() => server.dropWatches({ graceful: true }), 5);
    t.after(() => clearInterval(stop));
    const before = watchesOf(server).length;
    await new Promise((r) => setTimeout(r, 3000));
    clearInterval(stop);
    const made = watchesOf(server).length - before;
    assert.ok(made >= 2 && made <= 8, `${made} watches in 3 s`);
  });

  test('410 after compaction: one relist that sees what changed, deletions included', async (t) => {
    const server = await startServer(t);
    server.create(node('a'));
    server.create(node('b'));
    const { c, log } = cache(t, server, { backoff: { baseMs: 50, capMs: 200 } });
    c.start();
    await server.waitFor(() => server.openWatches().length === 1, 5000, 'the watch');
    server.setAvailable(false);
    server.remove('nodes', 'b');
    server.create(node('c'));
    server.compact();
    server.setAvailable(true);
    await server.waitFor(() => names(c).join() === 'a,c', 10_000, 'the cache to converge');
    assert.deepEqual(log.deleted, ['b']);
    assert.equal(listsOf(server).length, 2, 'one relist');
  });

  test('after an API server restart that missed nothing the watch resumes; one that missed changes gets 410 and relists', async (t) => {
    const server = await startServer(t);
    server.create(node('a'));
    const { c, log } = cache(t, server, { backoff: { baseMs: 50, capMs: 200 } });
    c.start();
    await server.waitFor(() => server.openWatches().length === 1, 5000, 'the watch');
    server.restart();
    await server.waitFor(() => watchesOf(server).length === 2 && server.openWatches().length === 1, 10_000, 'a new watch');
    assert.equal(listsOf(server).length, 1, 'the new watch cache starts at the resourceVersion the client has: no relist');
    assert.equal(log.failures, 0, 'a clean end is not a failure');

    // Changes made while the server was down are older than its new watch cache.
    server.setAvailable(false);
    server.create(node('b'));
    server.restart();
    server.setAvailable(true);
    await server.waitFor(() => c.get('b'), 10_000, 'b through a relist');
    assert.equal(listsOf(server).length, 2);
    server.create(node('c'));
    await server.waitFor(() => c.get('c'), 5000, 'c through the new watch');
    assert.equal(log.deleted.length, 0);
  });

  test('seed(): the object just written is reported, and watched from its resourceVersion with no list; a seed compacted away relists', async (t) => {
    const server = await startServer(t);
    const written = server.create(node('a'));
    const { c, log } = cache(t, server, { fieldSelector: 'metadata.name=a' });
    c.seed([written], written.metadata.resourceVersion!).start();
    assert.equal(c.synced, true);
    await server.waitFor(() => server.openWatches().length === 1, 5000, 'the watch');
    assert.deepEqual([log.added, log.synced], [['a'], 1]);
    assert.equal(listsOf(server).length, 0, 'no list');
    assert.equal(watchesOf(server)[0]!.query.resourceVersion, written.metadata.resourceVersion);
    server.patch('nodes', 'a', { metadata: { labels: { x: 'y' } } });
    await server.waitFor(() => log.updated.length === 1, 5000, 'the change');
    assert.throws(() => c.seed([], '1'), /before start/);

    const old = server.create(node('b'));
    server.patch('nodes', 'b', { metadata: { labels: { x: 'z' } } });
    server.compact();
    const late = cache(t, server, { fieldSelector: 'metadata.name=b' });
    late.c.seed([old], old.metadata.resourceVersion!).start();
    await server.waitFor(() => late.log.synced === 2, 5000, 'the relist after 410');
    assert.equal(late.c.get('b')!.metadata.labels!.x, 'z', 'the list brought the change the seed missed');
  });

  test('a failed first list leaves the cache unsynced, never empty-and-synced', async (t) => {
    const server = await startServer(t);
    server.setAvailable(false);
    const { c, log } = cache(t, server, { backoff: { baseMs: 50, capMs: 100 } });
    c.start();
    await server.waitFor(() => log.failures >= 2, 5000, 'failed lists');
    assert.equal(c.synced, false);
    server.create(node('a'));
    server.setAvailable(true);
    await server.waitFor(() => c.synced, 5000, 'the first list');
    assert.deepEqual(names(c), ['a']);
  });
});
