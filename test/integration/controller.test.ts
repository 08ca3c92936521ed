// The status controller against the in-process API server: real HTTP, real
// watches through client-node's informers, status written through the
// status subresource.
import { after, afterEach, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { ApiServer, type KubeObject } from '../support/apiserver.ts';
import { STATUS_ANNOTATION, type NodeSetStatus, type PinnedImageSetStatus } from '../../src/api/types.ts';
import { encodeNodeStatus } from '../../src/api/node-status.ts';
import { SetStatusController } from '../../src/controller/controller.ts';
import { LeaderElector } from '../../src/controller/leader.ts';
import { ControllerMetrics } from '../../src/controller/metrics.ts';
import { silentLogger } from '../../src/util/log.ts';

const SETS = '/apis/pinset.dev/v1alpha1/pinnedimagesets';
const IMAGE = `quay.io/org/app@sha256:${'a'.repeat(64)}`;

let api: ApiServer;
const running: Array<() => Promise<void>> = [];

before(async () => {
  api = await ApiServer.start();
});
after(async () => {
  await api.stop();
});
afterEach(async () => {
  while (running.length) await running.pop()!();
  for (const n of api.list('nodes')) api.remove('nodes', n.metadata.name!);
  for (const s of api.list('pinnedimagesets')) api.remove('pinnedimagesets', s.metadata.name!);
  for (const l of api.list('leases')) api.remove('leases', l.metadata.name!, l.metadata.namespace);
  api.requests.length = 0;
});

function report(over: Partial<NodeSetStatus> & { uid: string }): NodeSetStatus {
  return {
    name: 'upgrade',
    source: 'api',
    desiredGeneration: 1,
    currentGeneration: 1,
    images: { wanted: 1, present: 1, pinned: 1, failed: 0, invalid: 0 },
    phase: 'Ready',
    reason: 'AllImagesPinned',
    ...over,
  };
}

/** A report as an agent of version 1 wrote it. */
function annotation(node: string, sets: NodeSetStatus[], updatedAt = new Date().toISOString()): string {
  return JSON.stringify({ version: 1, node, pinFile: '99-pinset-x.conf', updatedAt, sets });
}

/** A report as agents write it now (version 2). */
function annotationV2(sets: NodeSetStatus[], updatedAt = new Date().toISOString()): string {
  return encodeNodeStatus({ version: 2, pinFile: '99-pinset-x.conf', updatedAt, sets });
}

function createNode(name: string, labels: Record<string, string>, sets?: NodeSetStatus[]): void {
  const metadata: KubeObject['metadata'] = { name, labels };
  if (sets) metadata.annotations = { [STATUS_ANNOTATION]: annotation(name, sets) };
  api.create({ apiVersion: 'v1', kind: 'Node', metadata, status: { conditions: [{ type: 'Ready', status: 'True' }] } });
}

function setReports(name: string, sets: NodeSetStatus[]): void {
  api.patch('nodes', name, { metadata: { annotations: { [STATUS_ANNOTATION]: annotation(name, sets) } } });
}

function createSet(name = 'upgrade', selector: Record<string, unknown> = { matchLabels: { role: 'worker' } }): KubeObject {
  return api.create({
    apiVersion: 'pinset.dev/v1alpha1',
    kind: 'PinnedImageSet',
    metadata: { name },
    spec: { nodeSelector: selector, pinnedImages: [{ name: IMAGE }] },
  });
}

function statusOf(name = 'upgrade'): PinnedImageSetStatus | undefined {
  return api.get('pinnedimagesets', name)?.status as PinnedImageSetStatus | undefined;
}

function statusWrites(name = 'upgrade'): number {
  return api.requests.filter((r) => r.path === `${SETS}/${name}/status` && (r.method === 'PATCH' || r.method === 'PUT') && r.status === 200).length;
}

function startController(opts: { leading?: boolean } = {}): { controller: SetStatusController; metrics: ControllerMetrics } {
  const metrics = new ControllerMetrics();
  const controller = new SetStatusController({ kubeConfig: api.kubeConfig(), log: silentLogger(), metrics, debounceMs: 50 });
  controller.start();
  if (opts.leading ?? true) controller.setLeading(true);
  running.push(() => controller.stop());
  return { controller, metrics };
}

async function rollups(metrics: ControllerMetrics): Promise<number> {
  return (await metrics.rollups.get()).values[0]?.value ?? 0;
}

const cond = (s: PinnedImageSetStatus | undefined, type: string) => s?.conditions?.find((c) => c.type === type);

describe('status controller', () => {
  test('rolls node reports up into the set status, written through the status subresource', async () => {
    const set = createSet();
    const uid = set.metadata.uid!;
    createNode('worker-a', { role: 'worker' }, [report({ uid })]);
    createNode('worker-b', { role: 'worker' }, [report({ uid, phase: 'Degraded', reason: 'ImageNotFound', lastFailedGeneration: 1, lastFailedGenerationError: 'manifest unknown' })]);
    createNode('worker-c', { role: 'worker' });
    createNode('control', { role: 'control-plane' }, [report({ uid })]);
    startController();

    await api.waitFor(() => statusOf()?.nodes, 5000, 'a status on the set');
    const status = statusOf()!;
    assert.equal(status.observedGeneration, 1);
    assert.deepEqual(status.nodes, { matched: 3, ready: 1, progressing: 1, degraded: 1 });
    assert.deepEqual(status.degradedNodes, [{ name: 'worker-b', reason: 'ImageNotFound', message: 'manifest unknown' }]);
    assert.equal(cond(status, 'Ready')?.status, 'False');
    assert.equal(cond(status, 'Degraded')?.status, 'True');
    assert.equal(cond(status, 'Progressing')?.status, 'True');

    const writes = api.requests.filter((r) => r.path.startsWith(SETS) && r.method !== 'GET');
    assert.ok(writes.length >= 1);
    for (const w of writes) {
      assert.equal(w.path, `${SETS}/upgrade/status`, 'only the status subresource is written');
      assert.equal(w.method, 'PATCH');
      assert.equal(w.contentType, 'application/merge-patch+json');
    }
    // The spec is untouched and no generation was bumped by the controller.
    assert.equal(api.get('pinnedimagesets', 'upgrade')?.metadata.generation, 1);
  });

  test('exports each set\'s node counts and degraded nodes by reason; a standby exports none', async () => {
    const uid = createSet().metadata.uid!;
    createNode('worker-a', { role: 'worker' }, [report({ uid })]);
    createNode('worker-b', { role: 'worker' }, [report({ uid, phase: 'Degraded', reason: 'PinsOverridden', message: 'zz-admin.conf overrides the pins' })]);
    createNode('worker-c', { role: 'worker' }, [report({ uid, phase: 'Degraded', reason: 'PinsOverridden' })]);
    const { controller, metrics } = startController();
    await api.waitFor(() => statusOf()?.nodes?.degraded === 2, 5000, 'the status');
    const text = await metrics.registry.metrics();
    assert.match(text, /^pinset_controller_set_nodes\{set="upgrade",state="matched"\} 3$/m);
    assert.match(text, /^pinset_controller_set_nodes\{set="upgrade",state="degraded"\} 2$/m);
    assert.match(text, /^pinset_controller_set_degraded_nodes\{set="upgrade",reason="PinsOverridden"\} 2$/m);

    setReports('worker-b', [report({ uid })]);
    setReports('worker-c', [report({ uid, phase: 'Degraded', reason: 'ImageNotFound' })]);
    await api.waitFor(async () => /reason="ImageNotFound"\} 1$/m.test(await metrics.registry.metrics()), 5000, 'the new reason');
    assert.doesNotMatch(await metrics.registry.metrics(), /reason="PinsOverridden"/, 'a reason no node reports any more is gone');

    controller.setLeading(false);
    assert.doesNotMatch(await metrics.registry.metrics(), /pinset_controller_set_nodes\{/);
  });

  test('a rolling upgrade of the agents: version 1 and version 2 reports count alike', async () => {
    const uid = createSet().metadata.uid!;
    const failing = report({ uid, phase: 'Degraded', reason: 'ImageNotFound', message: 'manifest unknown', lastFailedGeneration: 1, lastFailedGenerationError: 'ImageNotFound: manifest unknown' });
    createNode('old-ready', { role: 'worker' }, [report({ uid })]);
    createNode('old-failing', { role: 'worker' }, [failing]);
    createNode('old-pulling', { role: 'worker' }, [report({ uid, phase: 'Progressing', reason: 'Pulling', currentGeneration: 0 })]);
    api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'new-ready', labels: { role: 'worker' }, annotations: { [STATUS_ANNOTATION]: annotationV2([report({ uid })]) } } });
    api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'new-failing', labels: { role: 'worker' }, annotations: { [STATUS_ANNOTATION]: annotationV2([failing]) } } });
    api.create({
      apiVersion: 'v1', kind: 'Node',
      metadata: { name: 'new-waiting', labels: { role: 'worker' }, annotations: { [STATUS_ANNOTATION]: annotationV2([report({ uid, phase: 'Progressing', reason: 'WaitingForRolloutSlot', currentGeneration: 0 })]) } },
    });
    startController();
    await api.waitFor(() => statusOf()?.nodes?.matched === 6, 5000, 'a status counting all six nodes');
    const status = statusOf()!;
    assert.deepEqual(status.nodes, { matched: 6, ready: 2, progressing: 2, degraded: 2 });
    assert.deepEqual(status.degradedNodes, [
      { name: 'new-failing', reason: 'ImageNotFound', message: 'ImageNotFound: manifest unknown' },
      { name: 'old-failing', reason: 'ImageNotFound', message: 'ImageNotFound: manifest unknown' },
    ]);
    // A node upgraded in place: its next report is version 2, and nothing changes in the roll-up.
    const writes = statusWrites();
    api.patch('nodes', 'old-ready', { metadata: { annotations: { [STATUS_ANNOTATION]: annotationV2([report({ uid })]) } } });
    await sleep(300);
    assert.deepEqual(statusOf()!.nodes, { matched: 6, ready: 2, progressing: 2, degraded: 2 });
    assert.equal(statusWrites(), writes, 'the same report in the other format is no change');
  });

  test('writes only when the roll-up changes', async () => {
    const uid = createSet().metadata.uid!;
    createNode('worker-a', { role: 'worker' }, [report({ uid })]);
    createNode('worker-b', { role: 'worker' }, [report({ uid })]);
    const { metrics } = startController();
    await api.waitFor(() => cond(statusOf(), 'Ready')?.status === 'True', 5000, 'the set Ready');
    await sleep(300);
    const settled = statusWrites();
    assert.equal(settled, 1, 'one write brings the set to its status');

    // Changes that do not change the roll-up: a label the selector ignores,
    // a fresh report with the same content, a kubelet heartbeat.
    const before = await rollups(metrics);
    api.patch('nodes', 'worker-a', { metadata: { labels: { zone: 'b' } } });
    setReports('worker-b', [report({ uid })]);
    api.patch('nodes', 'worker-a', { status: { conditions: [{ type: 'Ready', status: 'True', reason: 'KubeletReady' }] } });
    await api.waitFor(async () => (await rollups(metrics)) > before, 5000, 'a recomputation');
    await sleep(300);
    assert.equal(statusWrites(), settled, 'no write for a roll-up that did not change');

    // A change that matters: one write, with the new content.
    setReports('worker-b', [report({ uid, phase: 'Degraded', reason: 'PullFailed', lastFailedGeneration: 1, lastFailedGenerationError: 'registry unavailable' })]);
    await api.waitFor(() => statusOf()?.nodes?.degraded === 1, 5000, 'worker-b degraded in the status');
    await sleep(300);
    assert.equal(statusWrites(), settled + 1);
    const s = statusOf()!;
    assert.deepEqual(s.degradedNodes, [{ name: 'worker-b', reason: 'PullFailed', message: 'registry unavailable' }]);
    // Ready went True -> False: new transition time; Degraded False -> True likewise.
    assert.equal(cond(s, 'Ready')?.status, 'False');

    // Recovery removes degradedNodes (merge patch with null).
    setReports('worker-b', [report({ uid })]);
    await api.waitFor(() => cond(statusOf(), 'Ready')?.status === 'True', 5000, 'the set Ready again');
    assert.equal(statusOf()?.degradedNodes, undefined);
  });

  test('keeps lastTransitionTime of conditions whose status did not change', async () => {
    const uid = createSet().metadata.uid!;
    createNode('worker-a', { role: 'worker' }, [report({ uid })]);
    createNode('worker-b', { role: 'worker' }, [report({ uid, phase: 'Progressing', currentGeneration: 0, reason: 'Pulling' })]);
    startController();
    await api.waitFor(() => statusOf()?.nodes?.progressing === 1, 5000, 'one node progressing');
    const first = statusOf()!;
    // Conditions carry whole seconds; cross a second boundary before the next change.
    await sleep(1100);
    createNode('worker-c', { role: 'worker' }, [report({ uid })]);
    await api.waitFor(() => statusOf()?.nodes?.matched === 3, 5000, 'three nodes matched');
    const second = statusOf()!;
    for (const t of ['Ready', 'Progressing', 'Degraded']) {
      assert.equal(cond(second, t)?.lastTransitionTime, cond(first, t)?.lastTransitionTime, t);
    }
    setReports('worker-b', [report({ uid })]);
    await api.waitFor(() => cond(statusOf(), 'Ready')?.status === 'True', 5000, 'the set Ready');
    const third = statusOf()!;
    assert.notEqual(cond(third, 'Ready')?.lastTransitionTime, cond(first, 'Ready')?.lastTransitionTime);
    assert.equal(cond(third, 'Degraded')?.lastTransitionTime, cond(first, 'Degraded')?.lastTransitionTime);
  });

  test('a new generation makes nodes that reported the old one Progressing', async () => {
    const uid = createSet().metadata.uid!;
    createNode('worker-a', { role: 'worker' }, [report({ uid })]);
    startController();
    await api.waitFor(() => cond(statusOf(), 'Ready')?.status === 'True', 5000, 'the set Ready');

    const current = api.get('pinnedimagesets', 'upgrade')!;
    api.update({ ...current, spec: { ...(current.spec as object), pinnedImages: [{ name: IMAGE }, { name: `quay.io/org/other@sha256:${'b'.repeat(64)}` }] } });
    await api.waitFor(() => statusOf()?.observedGeneration === 2, 5000, 'observedGeneration 2');
    const s = statusOf()!;
    assert.deepEqual(s.nodes, { matched: 1, ready: 0, progressing: 1, degraded: 0 });
    assert.equal(cond(s, 'Ready')?.status, 'False');

    setReports('worker-a', [report({ uid, desiredGeneration: 2, currentGeneration: 2 })]);
    await api.waitFor(() => cond(statusOf(), 'Ready')?.status === 'True', 5000, 'Ready for generation 2');
  });

  test('a node whose labels stop matching leaves the count; one that starts matching joins', async () => {
    const uid = createSet().metadata.uid!;
    createNode('worker-a', { role: 'worker' }, [report({ uid })]);
    createNode('spare', { role: 'spare' }, [report({ uid })]);
    startController();
    await api.waitFor(() => statusOf()?.nodes?.matched === 1, 5000, 'one node matched');
    api.patch('nodes', 'spare', { metadata: { labels: { role: 'worker' } } });
    await api.waitFor(() => statusOf()?.nodes?.matched === 2, 5000, 'two nodes matched');
    api.remove('nodes', 'worker-a');
    await api.waitFor(() => statusOf()?.nodes?.matched === 1 && statusOf()?.nodes?.ready === 1, 5000, 'back to one node');
  });

  test('a set deleted and created again does not count reports about the old object', async () => {
    const oldUid = createSet().metadata.uid!;
    createNode('worker-a', { role: 'worker' }, [report({ uid: oldUid })]);
    startController();
    await api.waitFor(() => cond(statusOf(), 'Ready')?.status === 'True', 5000, 'the old set Ready');
    api.remove('pinnedimagesets', 'upgrade');
    const fresh = createSet();
    assert.notEqual(fresh.metadata.uid, oldUid);
    await api.waitFor(() => statusOf()?.nodes, 5000, 'a status on the new set');
    const s = statusOf()!;
    assert.deepEqual(s.nodes, { matched: 1, ready: 0, progressing: 1, degraded: 0 });
  });

  test('an invalid selector is reported as Degraded with reason InvalidSpec', async () => {
    createSet('broken', { matchExpressions: [{ key: 'role', operator: 'In', values: [] }] });
    createNode('worker-a', { role: 'worker' });
    startController();
    await api.waitFor(() => statusOf('broken')?.conditions, 5000, 'a status on the broken set');
    const s = statusOf('broken')!;
    assert.equal(cond(s, 'Degraded')?.status, 'True');
    assert.equal(cond(s, 'Degraded')?.reason, 'InvalidSpec');
    assert.equal(s.nodes?.matched, 0);
  });

  test('a replica that does not lead writes nothing, and starts writing when it leads', async () => {
    const uid = createSet().metadata.uid!;
    createNode('worker-a', { role: 'worker' }, [report({ uid })]);
    const { controller } = startController({ leading: false });
    await api.waitFor(() => controller.synced(), 5000, 'the caches filled');
    setReports('worker-a', [report({ uid, phase: 'Progressing' })]);
    await sleep(400);
    assert.equal(statusWrites(), 0);
    assert.equal(statusOf(), undefined);
    controller.setLeading(true);
    await api.waitFor(() => statusOf()?.nodes?.progressing === 1, 5000, 'a status after leading');
  });

  test('keeps working across dropped watches and an API outage', async () => {
    const uid = createSet().metadata.uid!;
    createNode('worker-a', { role: 'worker' }, [report({ uid, phase: 'Progressing' })]);
    startController();
    await api.waitFor(() => statusOf()?.nodes?.progressing === 1, 5000, 'first status');
    api.dropWatches();
    api.setAvailable(false);
    await sleep(300);
    setReports('worker-a', [report({ uid })]);
    api.setAvailable(true);
    await api.waitFor(() => cond(statusOf(), 'Ready')?.status === 'True', 10000, 'the change made during the outage rolled up');
  });

  test('two controllers with leader election: only the leader writes; when it dies the other takes over', async () => {
    const uid = createSet().metadata.uid!;
    createNode('worker-a', { role: 'worker' }, [report({ uid, phase: 'Progressing' })]);
    const replicas = ['replica-1', 'replica-2'].map((identity) => {
      const { controller } = startController({ leading: false });
      const elector = new LeaderElector({
        kubeConfig: api.kubeConfig(),
        namespace: 'pinset-system',
        name: 'pinset-controller',
        identity,
        leaseDurationMs: 2000,
        renewDeadlineMs: 1000,
        retryPeriodMs: 250,
        log: silentLogger(),
        onStartedLeading: () => controller.setLeading(true),
        onStoppedLeading: () => controller.setLeading(false),
      });
      elector.start();
      running.push(() => elector.stop());
      return { identity, controller, elector };
    });
    await api.waitFor(() => statusOf()?.nodes?.progressing === 1, 5000, 'first status');
    const leaders = replicas.filter((r) => r.elector.isLeader());
    assert.equal(leaders.length, 1);
    const leader = leaders[0]!;
    const follower = replicas.find((r) => r !== leader)!;
    assert.equal(follower.controller.isLeading(), false);

    // The leader dies without releasing the Lease; the other takes over after it expires and resumes writing.
    await leader.elector.stop({ release: false });
    await leader.controller.stop();
    setReports('worker-a', [report({ uid })]);
    await api.waitFor(() => follower.elector.isLeader(), 5000, 'the follower to take over');
    await api.waitFor(() => cond(statusOf(), 'Ready')?.status === 'True', 5000, 'the new leader to write status');
    const lease = api.get('leases', 'pinset-controller', 'pinset-system')!;
    assert.equal((lease.spec as { holderIdentity?: string }).holderIdentity, follower.identity);

    // Every write (set status, the Lease) names the controller's field manager.
    const writes = api.requests.filter((r) => r.method !== 'GET');
    assert.ok(writes.some((r) => r.path.endsWith('/status')) && writes.some((r) => r.path.includes('/leases')));
    for (const w of writes) assert.equal(w.query.fieldManager, 'pinset-controller', `${w.method} ${w.path}`);
    const managed = api.get('pinnedimagesets', 'upgrade')!.metadata.managedFields as { manager: string; subresource?: string; fieldsV1: Record<string, unknown> }[];
    const mine = managed.find((m) => m.manager === 'pinset-controller');
    assert.equal(mine?.subresource, 'status');
    assert.deepEqual(Object.keys(mine!.fieldsV1), ['f:status'], 'the controller owns the status and nothing else');
  });
});

describe('status controller: a set\'s progress and ETA', () => {
  const bytesReport = (uid: string, over: Partial<NodeSetStatus>) => report({ uid, phase: 'Progressing', reason: 'Pulling', currentGeneration: 0, images: { wanted: 2, present: 0, pinned: 2, failed: 0, invalid: 0 }, ...over });

  test('bytes summed over the selected nodes; progress alone is written every --progress-interval, a node ready at once, and an ETA no longer known is removed', async () => {
    const set = api.create({
      apiVersion: 'pinset.dev/v1alpha1',
      kind: 'PinnedImageSet',
      metadata: { name: 'upgrade' },
      spec: { nodeSelector: { matchLabels: { role: 'worker' } }, pinnedImages: [{ name: IMAGE }], rollout: { maxConcurrentNodes: 1 } },
    });
    const uid = set.metadata.uid!;
    const put = (node: string, over: Partial<NodeSetStatus>) => api.patch('nodes', node, { metadata: { annotations: { [STATUS_ANNOTATION]: annotationV2([bytesReport(uid, over)]) } } });
    for (const n of ['worker-a', 'worker-b', 'worker-c']) api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: n, labels: { role: 'worker' } } });
    put('worker-a', { bytes: { present: 0, total: 1000 } });
    put('worker-b', { reason: 'WaitingForRolloutSlot' });
    const controller = new SetStatusController({ kubeConfig: api.kubeConfig(), log: silentLogger(), debounceMs: 50, progressIntervalMs: 1500, progressWindowMs: 60_000 });
    controller.start();
    controller.setLeading(true);
    running.push(() => controller.stop());

    await api.waitFor(() => statusOf()?.progress, 5000, 'a progress on the set');
    // worker-b (waiting for the slot, no bytes yet) and worker-c (no report) count as worker-a does.
    assert.deepEqual(statusOf()!.progress, { unit: 'bytes', present: 0, total: 3000, nodesDownloading: 1, nodesWaiting: 2, summary: '0% of 2.9 KiB' });
    const first = statusWrites();

    // Progress alone: held back for its turn, then written with the latest.
    put('worker-a', { bytes: { present: 100, total: 1000 }, rate: 100 });
    await sleep(200);
    put('worker-a', { bytes: { present: 300, total: 1000 }, rate: 100 });
    await sleep(400);
    assert.equal(statusWrites(), first, 'not yet: the last write was less than --progress-interval ago');
    assert.equal(statusOf()!.progress!.present, 0);
    await api.waitFor(() => statusOf()?.progress?.present === 300, 5000, 'the progress written at its turn');
    assert.equal(statusWrites(), first + 1, 'one write for both reports');
    const p = statusOf()!.progress!;
    assert.ok(p.rate! > 0, `a rate measured from the two observations: ${p.rate}`);
    const eta = Date.parse(p.estimatedCompletionTime!);
    assert.ok(eta > Date.now(), `an ETA to come: ${p.estimatedCompletionTime}`);
    assert.match(p.summary, /^10% of 2\.9 KiB, \d+ B\/s$/);

    // A node ready is news: written at once, with the progress of that moment.
    const before = statusWrites();
    put('worker-a', { phase: 'Ready', reason: 'AllImagesPinned', currentGeneration: 1, images: { wanted: 2, present: 2, pinned: 2, failed: 0, invalid: 0 }, bytes: { present: 1000, total: 1000 } });
    await api.waitFor(() => statusOf()?.nodes?.ready === 1, 1000, 'the ready node written within a second');
    assert.equal(statusWrites(), before + 1);
    assert.equal(statusOf()!.progress!.present, 1000);

    // Every node left degraded: nothing left to time, so the ETA goes (a merge patch keeps what it does not name).
    put('worker-b', { phase: 'Degraded', reason: 'ImageNotFound', message: 'manifest unknown' });
    api.patch('nodes', 'worker-c', { metadata: { annotations: { [STATUS_ANNOTATION]: annotationV2([bytesReport(uid, { phase: 'Degraded', reason: 'ImageNotFound', message: 'manifest unknown' })]) } } });
    await api.waitFor(() => statusOf()?.nodes?.degraded === 2, 5000, 'both degraded');
    const last = statusOf()!.progress!;
    assert.equal(last.estimatedCompletionTime, undefined, JSON.stringify(last));
    assert.deepEqual([last.nodesDownloading, last.nodesWaiting], [0, 0]);
  });

  test('a burst of progress reports from many nodes costs one status write per --progress-interval', async () => {
    const uid = createSet().metadata.uid!;
    const nodes = Array.from({ length: 20 }, (_, i) => `worker-${i}`);
    for (const n of nodes) createNode(n, { role: 'worker' });
    const controller = new SetStatusController({ kubeConfig: api.kubeConfig(), log: silentLogger(), debounceMs: 50, progressIntervalMs: 1000 });
    controller.start();
    controller.setLeading(true);
    running.push(() => controller.stop());
    await api.waitFor(() => statusOf()?.progress, 5000, 'a progress on the set');
    const first = statusWrites();
    const started = Date.now();
    for (let step = 1; step <= 10; step++) {
      for (const n of nodes) api.patch('nodes', n, { metadata: { annotations: { [STATUS_ANNOTATION]: annotationV2([bytesReport(uid, { bytes: { present: step * 10, total: 100 } })]) } } });
      await sleep(200);
    }
    const elapsed = Date.now() - started;
    await api.waitFor(() => statusOf()?.progress?.present === 2000, 5000, 'the last progress written');
    const writes = statusWrites() - first;
    assert.ok(writes <= Math.ceil(elapsed / 1000) + 1, `${writes} writes in ${elapsed} ms for 200 reports`);
    assert.ok(writes >= 1);
  });
});
