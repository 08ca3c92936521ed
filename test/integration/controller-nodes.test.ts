// How the status controller reads Nodes, as the API server sees it: lists
// in pages and watches, both asking for metadata only (PartialObjectMetadata),
// with bookmarks and a timeout on every watch; the same roll-up from a server
// that can only send whole Nodes; and node updates that change nothing the
// roll-up reads cost no recomputation.
import assert from 'node:assert/strict';
import { describe, test, type TestContext } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { METADATA_LIST_ACCEPT, METADATA_WATCH_ACCEPT } from '../../src/api/list-pages.ts';
import { STATUS_ANNOTATION, type NodeSetStatus, type PinnedImageSetStatus } from '../../src/api/types.ts';
import { CONTROLLER_FIELD_MANAGER, SetStatusController } from '../../src/controller/controller.ts';
import { ControllerMetrics } from '../../src/controller/metrics.ts';
import { silentLogger, type Logger } from '../../src/util/log.ts';
import { captureLogs } from '../support/log-capture.ts';
import { ApiServer, type ApiServerOptions } from '../support/apiserver.ts';

const NODES = '/api/v1/nodes';
const IMAGE = `quay.io/org/app@sha256:${'a'.repeat(64)}`;

async function startServer(t: TestContext, opts?: ApiServerOptions): Promise<ApiServer> {
  const server = await ApiServer.start(opts);
  t.after(() => server.stop());
  return server;
}

function createSet(api: ApiServer, name: string): string {
  return api.create({
    apiVersion: 'pinset.dev/v1alpha1',
    kind: 'PinnedImageSet',
    metadata: { name },
    spec: { nodeSelector: { matchLabels: { role: 'worker' } }, pinnedImages: [{ name: IMAGE }] },
  }).metadata.uid!;
}

function entry(name: string, uid: string, over: Partial<NodeSetStatus> = {}): NodeSetStatus {
  return {
    name,
    uid,
    source: 'api',
    desiredGeneration: 1,
    currentGeneration: 1,
    images: { wanted: 1, present: 1, pinned: 1, failed: 0, invalid: 0 },
    phase: 'Ready',
    reason: 'AllImagesPinned',
    ...over,
  };
}

function annotation(node: string, sets: NodeSetStatus[]): string {
  return JSON.stringify({ version: 1, node, pinFile: '99-pinset-x.conf', updatedAt: new Date().toISOString(), sets });
}

/** A Node as a kubelet registers it: status with images and conditions, plus the agent's report. */
function createNode(api: ApiServer, name: string, sets: NodeSetStatus[]): void {
  api.create({
    apiVersion: 'v1',
    kind: 'Node',
    metadata: { name, labels: { role: 'worker', 'kubernetes.io/hostname': name }, annotations: { [STATUS_ANNOTATION]: annotation(name, sets) } },
    spec: { podCIDR: '10.0.0.0/24' },
    status: {
      conditions: [{ type: 'Ready', status: 'True', reason: 'KubeletReady' }],
      images: [{ names: [IMAGE], sizeBytes: 1000 }],
      nodeInfo: { kubeletVersion: 'v1.33.0' },
    },
  });
}

function startController(t: TestContext, api: ApiServer, opts: { pageSize?: number; log?: Logger } = {}) {
  const metrics = new ControllerMetrics();
  const controller = new SetStatusController({
    kubeConfig: api.kubeConfig(),
    log: opts.log ?? silentLogger(),
    metrics,
    debounceMs: 50,
    watch: { pageSize: opts.pageSize },
  });
  controller.start();
  controller.setLeading(true);
  t.after(() => controller.stop());
  return { controller, metrics };
}

const statusOf = (api: ApiServer, name: string) => api.get('pinnedimagesets', name)?.status as PinnedImageSetStatus | undefined;
const mine = (api: ApiServer) => api.requests.filter((r) => r.userAgent === CONTROLLER_FIELD_MANAGER && r.path === NODES);
const rollups = async (m: ControllerMetrics) => (await m.rollups.get()).values[0]?.value ?? 0;

describe('status controller: how it reads Nodes', () => {
  test('lists Nodes as metadata only, in pages, then watches them as metadata only with bookmarks and a timeout', async (t) => {
    const api = await startServer(t);
    const uid = createSet(api, 'upgrade');
    for (const n of ['n1', 'n2', 'n3', 'n4', 'n5']) createNode(api, n, [entry('upgrade', uid, n === 'n4' ? { phase: 'Degraded', reason: 'ImageNotFound', lastFailedGeneration: 1, lastFailedGenerationError: 'manifest unknown' } : {})]);
    startController(t, api, { pageSize: 2 });
    await api.waitFor(() => statusOf(api, 'upgrade')?.nodes?.matched === 5, 5000, 'all five nodes counted');
    const status = statusOf(api, 'upgrade')!;
    assert.deepEqual(status.nodes, { matched: 5, ready: 4, progressing: 0, degraded: 1 });
    assert.deepEqual(status.degradedNodes, [{ name: 'n4', reason: 'ImageNotFound', message: 'manifest unknown' }]);

    await api.waitFor(() => mine(api).some((r) => r.query.watch === 'true'), 5000, 'the node watch');
    const lists = mine(api).filter((r) => r.query.watch === undefined);
    assert.equal(lists.length, 3, 'five nodes in pages of two');
    for (const l of lists) {
      assert.equal(l.accept, METADATA_LIST_ACCEPT);
      assert.equal(l.query.limit, '2');
      assert.equal(l.status, 200);
    }
    assert.equal(lists[0]!.query.continue, undefined);
    assert.ok(lists[1]!.query.continue && lists[2]!.query.continue);
    const [watch] = mine(api).filter((r) => r.query.watch === 'true');
    assert.equal(watch!.accept, METADATA_WATCH_ACCEPT);
    assert.equal(watch!.query.allowWatchBookmarks, 'true');
    const timeout = Number(watch!.query.timeoutSeconds);
    assert.ok(timeout >= 600 && timeout < 1200, `timeoutSeconds ${timeout} in [600, 1200)`);

    // Changes arrive through the metadata-only watch.
    api.patch('nodes', 'n4', { metadata: { annotations: { [STATUS_ANNOTATION]: annotation('n4', [entry('upgrade', uid)]) } } });
    await api.waitFor(() => statusOf(api, 'upgrade')?.nodes?.ready === 5, 5000, 'n4 ready');
    api.remove('nodes', 'n5');
    await api.waitFor(() => statusOf(api, 'upgrade')?.nodes?.matched === 4, 5000, 'n5 gone');
  });

  test('a server that cannot send metadata only: whole Nodes are read instead, the same roll-up, and one warning', async (t) => {
    const api = await startServer(t, { partialObjectMetadata: false });
    const uid = createSet(api, 'upgrade');
    for (const n of ['n1', 'n2', 'n3']) createNode(api, n, [entry('upgrade', uid, n === 'n2' ? { phase: 'Progressing', currentGeneration: 0 } : {})]);
    const { logger, lines } = captureLogs();
    startController(t, api, { pageSize: 2, log: logger });
    await api.waitFor(() => statusOf(api, 'upgrade')?.nodes?.matched === 3, 5000, 'all three nodes counted');
    assert.deepEqual(statusOf(api, 'upgrade')!.nodes, { matched: 3, ready: 2, progressing: 1, degraded: 0 });
    api.patch('nodes', 'n2', { metadata: { annotations: { [STATUS_ANNOTATION]: annotation('n2', [entry('upgrade', uid)]) } } });
    await api.waitFor(() => statusOf(api, 'upgrade')?.nodes?.ready === 3, 5000, 'n2 ready through the watch of whole Nodes');
    const warnings = lines.filter((l) => l.watch === 'nodes' && String(l.msg).includes('whole objects'));
    assert.equal(warnings.length, 1);
    assert.equal(warnings[0]!.kind, 'NodeList');
  });

  test('a kubelet status update recomputes nothing; a change to one set\'s entry recomputes that set only', async (t) => {
    const api = await startServer(t);
    const a = createSet(api, 'set-a');
    const b = createSet(api, 'set-b');
    createNode(api, 'n1', [entry('set-a', a), entry('set-b', b)]);
    createNode(api, 'n2', [entry('set-a', a), entry('set-b', b)]);
    const { metrics } = startController(t, api);
    await api.waitFor(() => statusOf(api, 'set-a')?.nodes?.ready === 2 && statusOf(api, 'set-b')?.nodes?.ready === 2, 5000, 'both sets ready');
    await sleep(300);
    const settled = await rollups(metrics);

    // What kubelets write all day: conditions, heartbeats, images.
    api.patch('nodes', 'n1', { status: { conditions: [{ type: 'Ready', status: 'True', reason: 'KubeletReady', lastHeartbeatTime: new Date().toISOString() }] } });
    api.patch('nodes', 'n2', { metadata: { annotations: { 'node.alpha.kubernetes.io/ttl': '0' } } });
    // A new report whose content for the roll-up is the same (the time moved, the image counts changed).
    api.patch('nodes', 'n1', { metadata: { annotations: { [STATUS_ANNOTATION]: annotation('n1', [entry('set-a', a, { images: { wanted: 1, present: 1, pinned: 1, failed: 0, invalid: 0 } }), entry('set-b', b)]) } } });
    await sleep(500);
    assert.equal(await rollups(metrics), settled, 'no roll-up for changes the roll-up does not read');

    api.patch('nodes', 'n2', { metadata: { annotations: { [STATUS_ANNOTATION]: annotation('n2', [entry('set-a', a, { phase: 'Progressing', currentGeneration: 0 }), entry('set-b', b)]) } } });
    await api.waitFor(() => statusOf(api, 'set-a')?.nodes?.progressing === 1, 5000, 'set-a progressing');
    await sleep(300);
    assert.equal(await rollups(metrics), settled + 1, 'set-a only');
    assert.equal(statusOf(api, 'set-b')?.nodes?.ready, 2);

    // A label change can change any set's selection: both are recomputed.
    api.patch('nodes', 'n2', { metadata: { labels: { role: 'infra' } } });
    await api.waitFor(() => statusOf(api, 'set-a')?.nodes?.matched === 1 && statusOf(api, 'set-b')?.nodes?.matched === 1, 5000, 'n2 left both sets');
    await sleep(300);
    assert.equal(await rollups(metrics), settled + 3);
  });
});
