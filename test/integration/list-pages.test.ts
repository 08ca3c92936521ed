// listAll (src/api/list-pages.ts) against the in-process API server: a
// collection read in pages, each item reduced as it arrives, one snapshot
// even when a continue token expires halfway.
import assert from 'node:assert/strict';
import { describe, test, type TestContext } from 'node:test';
import { KubeApiError, KubeHttp } from '../../src/api/kube-http.ts';
import { listAll, METADATA_LIST_ACCEPT } from '../../src/api/list-pages.ts';
import { ApiServer, type KubeObject } from '../support/apiserver.ts';

const NODES = '/api/v1/nodes';

async function setup(t: TestContext, names: string[]): Promise<{ api: ApiServer; http: KubeHttp }> {
  const api = await ApiServer.start();
  const http = new KubeHttp(api.kubeConfig(), { userAgent: 'pinset-test' });
  t.after(async () => {
    http.close();
    await api.stop();
  });
  for (const name of names) api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name, labels: { n: name } }, status: { capacity: { cpu: '2' } } });
  return { api, http };
}

const nameOf = (o: KubeObject) => o.metadata.name!;

describe('listAll', () => {
  test('reads every page and keeps what `keep` returns; the resourceVersion is the list\'s', async (t) => {
    const { api, http } = await setup(t, ['a', 'b', 'c', 'd', 'e']);
    const rv = api.resourceVersion;
    const r = await listAll<KubeObject, string>({ http, path: NODES, pageSize: 2, accept: METADATA_LIST_ACCEPT }, (o) => `${nameOf(o)}:${Object.keys(o).sort().join(',')}`);
    assert.deepEqual(r.items, ['a:apiVersion,kind,metadata', 'b:apiVersion,kind,metadata', 'c:apiVersion,kind,metadata', 'd:apiVersion,kind,metadata', 'e:apiVersion,kind,metadata']);
    assert.equal(r.resourceVersion, rv);
    assert.equal(r.kind, 'PartialObjectMetadataList');
    assert.equal(r.requests, 3);
    const sent = api.requests.filter((q) => q.path === NODES);
    assert.deepEqual(sent.map((q) => q.query.limit), ['2', '2', '2']);
    assert.ok(sent.every((q) => q.accept === METADATA_LIST_ACCEPT));
    // pageSize 0: one request, no limit.
    const whole = await listAll<KubeObject, string>({ http, path: NODES, pageSize: 0 }, nameOf);
    assert.equal(whole.requests, 1);
    assert.equal(whole.kind, 'NodeList');
    assert.equal(api.requests.at(-1)!.query.limit, undefined);
  });

  test('a continue token that expires halfway: the list starts over once and is one snapshot', async (t) => {
    const { api, http } = await setup(t, ['a', 'b', 'c', 'd', 'e']);
    let expireAfterPage = 1;
    const r = await listAll<KubeObject, string>(
      {
        http,
        path: NODES,
        pageSize: 2,
        onPage: (n) => {
          if (n !== expireAfterPage) return;
          expireAfterPage = -1;
          api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'bb' } });
          api.remove('nodes', 'e');
          api.compact();
        },
      },
      nameOf,
    );
    assert.deepEqual(r.items, ['a', 'b', 'bb', 'c', 'd'], 'no item twice, none of the first attempt kept');
    assert.equal(r.resourceVersion, api.resourceVersion);
    assert.equal(r.requests, 2 + 3, 'two pages, the second expired, then three');
  });

  test('a token that expires on every attempt is an error that says so', async (t) => {
    const { api, http } = await setup(t, ['a', 'b', 'c']);
    const onPage = () => {
      api.patch('nodes', 'a', { metadata: { labels: { n: String(Math.random()) } } });
      api.compact();
    };
    await assert.rejects(listAll<KubeObject, string>({ http, path: NODES, pageSize: 1, onPage }, nameOf), (err: unknown) => {
      assert.ok(err instanceof KubeApiError);
      assert.equal(err.code, 410);
      assert.match(err.message, /continue token expired twice/);
      return true;
    });
  });
});
