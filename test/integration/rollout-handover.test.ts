// The hand-over of rollout slots and the first wave on Leases, on the
// in-process API server (real HTTP, watches by name with bookmarks,
// optimistic concurrency): the agents' side (LeaseRolloutSlots,
// LeaseWaveRecords over clientNodeLeaseApi) and the controller's
// (RolloutGranter over KubeHttp), as deployed. Polling is paced in minutes
// here, so a rollout that finishes was carried by grants; where a test
// needs polling it says so.
import { after, before, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { ApiServer } from '../support/apiserver.ts';
import { handoverLatencies, simulateRollout } from '../support/rollout-agents.ts';
import { KubeHttp } from '../../src/api/kube-http.ts';
import { FirstWave } from '../../src/rollout/first-wave.ts';
import { RolloutGate } from '../../src/rollout/gate.ts';
import { RolloutGranter, type GrantedSet } from '../../src/rollout/granter.ts';
import { clientNodeLeaseApi } from '../../src/rollout/lease-api.ts';
import { LeaseWaveRecords } from '../../src/rollout/lease-records.ts';
import { LeaseRolloutSlots, type LeaseApi } from '../../src/rollout/lease-slots.ts';
import { LANDED_BITS_ANNOTATION, LANDED_IMAGES_ANNOTATION, imageListHash, staticWaveName } from '../../src/rollout/landed.ts';
import { GRANT_ANNOTATION, GRANTER_LEASE, queueName, slotName, setLabelValue, SLOT_QUEUE_LABEL, type RolloutSet } from '../../src/rollout/slots.ts';
import { silentLogger } from '../../src/util/log.ts';

const NS = 'pinset-system';
const LEASE_MS = 10_000;
/** Polling this slow cannot finish any rollout here: only grants can. */
const SLOW_POLLS = { retry: { baseMs: 600_000, capMs: 600_000 }, firstAttemptSpreadMs: 600_000 };

let api: ApiServer;
let leaseApi: LeaseApi;
let granter: RolloutGranter | undefined;
const limits = new Map<string, GrantedSet>();

before(async () => {
  api = await ApiServer.start({ bookmarkIntervalMs: 1_000 });
  leaseApi = clientNodeLeaseApi(api.kubeConfig());
});
let http: KubeHttp | undefined;
const stopGranter = async () => {
  await granter?.stop();
  http?.close();
  granter = undefined;
  http = undefined;
};
after(async () => {
  await stopGranter();
  await api.stop();
});
beforeEach(async () => {
  await stopGranter();
  limits.clear();
  for (const l of api.list('leases')) api.remove('leases', l.metadata.name!, l.metadata.namespace);
  api.requests.length = 0;
});

function startGranter(acceptMs = 10_000): RolloutGranter {
  http = new KubeHttp(api.kubeConfig(), { userAgent: 'pinset-controller' });
  granter = new RolloutGranter({
    http,
    namespace: NS,
    log: silentLogger(),
    setOf: (label) => limits.get(label),
    fieldManager: 'pinset-controller',
    identity: 'granter-test',
    acceptMs,
  });
  granter.start();
  granter.setLeading(true);
  return granter;
}

const slotsOf = (identity: string, opts: { queue?: boolean; leaseDurationMs?: number } = {}) =>
  new LeaseRolloutSlots({ api: leaseApi, namespace: NS, identity, fieldManager: 'pinset-agent', leaseDurationMs: opts.leaseDurationMs ?? LEASE_MS, ...(opts.queue === false ? { queue: false } : {}) });

function limited(name: string, max: number, firstWave?: number): RolloutSet {
  const uid = `uid-${name}`;
  limits.set(setLabelValue(name), { name, uid, limits: { rollout: max, ...(firstWave ? { 'first-wave': firstWave } : {}) } });
  return { name, uid, maxConcurrentNodes: max };
}

/** The rollout Leases (not the granter's heartbeat). */
const leases = (labelSelector?: string) => api.list('leases', { namespace: NS, ...(labelSelector ? { labelSelector } : {}) }).filter((l) => l.metadata.name !== GRANTER_LEASE);

describe('the hand-over on Leases', () => {
  test('the Leases as the API server stores them: the entry, the watch by name, the grant, the acceptance', async () => {
    startGranter();
    const set = limited('upgrade-workers', 1);
    const holder = (await slotsOf('worker-1').tryAcquire(set))!;
    const granted: string[] = [];
    const slots = slotsOf('worker-2');
    const ticket = await slots.join!(set, { granted: (n) => granted.push(n), removed: () => assert.fail('not removed'), failed: (e) => assert.fail(e.message) });
    const entry = api.get('leases', queueName('upgrade-workers', 'worker-2'), NS)!;
    assert.equal(entry.metadata.name, 'upgrade-workers.worker-2.queue');
    assert.deepEqual(entry.metadata.labels, { [SLOT_QUEUE_LABEL]: 'upgrade-workers', 'app.kubernetes.io/managed-by': 'pinset-agent' });
    assert.deepEqual(entry.metadata.annotations, { 'pinset.dev/limit': '1', 'pinset.dev/set': 'upgrade-workers' });
    assert.deepEqual(entry.metadata.ownerReferences, [{ apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', name: 'upgrade-workers', uid: 'uid-upgrade-workers' }]);
    const spec = entry.spec as { holderIdentity: string; acquireTime: string };
    assert.equal(spec.holderIdentity, 'worker-2');
    assert.match(spec.acquireTime, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/);
    await api.waitFor(() => api.openWatches().some((w) => w.query.fieldSelector === `metadata.name=${entry.metadata.name}`), 5000, 'the node watching its entry by name');
    const mine = api.openWatches().find((w) => w.query.fieldSelector === `metadata.name=${entry.metadata.name}`)!;
    assert.equal(mine.namespace, NS);
    assert.equal(mine.query.allowWatchBookmarks, 'true');
    assert.equal(mine.query.labelSelector, undefined);

    await slotsOf('worker-1').release(holder);
    await api.waitFor(() => granted.length === 1, 5000, 'the grant heard through the entry');
    assert.deepEqual(granted, [slotName('upgrade-workers', 0)]);
    const grant = api.get('leases', granted[0]!, NS)!;
    assert.deepEqual([(grant.spec as { holderIdentity: string }).holderIdentity, (grant.spec as { leaseDurationSeconds: number }).leaseDurationSeconds], ['worker-2', 10]);
    assert.equal(api.get('leases', entry.metadata.name!, NS)!.metadata.annotations![GRANT_ANNOTATION], granted[0]);
    const taken = (await slots.accept!(set, granted[0]!))!;
    assert.equal(taken.name, granted[0]);
    assert.equal(await slotsOf('worker-3').accept!(set, granted[0]!), null, 'another node cannot take it');
    await ticket.leave();
    assert.equal(api.get('leases', entry.metadata.name!, NS), undefined, 'leaving deletes the entry');
    const managers = api.requests.filter((r) => r.path.includes('/leases') && (r.method === 'POST' || r.method === 'PUT' || r.method === 'PATCH')).map((r) => `${r.method} ${r.query.fieldManager}`);
    assert.ok(managers.includes('PATCH pinset-controller') && managers.includes('POST pinset-agent'), managers.join(', '));
  });

  test('maxConcurrentNodes 2, eight nodes whose polls would take minutes: all finish by grants, never more than 2 at once, nothing left behind', async () => {
    startGranter();
    const set = limited('fleet', 2);
    const r = await simulateRollout({
      nodes: Array.from({ length: 8 }, (_, i) => `node-${i}`),
      set,
      slotsFor: (n) => slotsOf(n),
      downloadMs: () => 50 + Math.floor(Math.random() * 50),
      gate: SLOW_POLLS,
      timeoutMs: 60_000,
    });
    assert.equal(r.finished.length, 8);
    assert.ok(r.maxConcurrent <= 2, `${r.maxConcurrent} at once`);
    assert.equal(handoverLatencies(r, 2).length, 6, 'six slots handed over');
    await api.waitFor(() => leases().length === 0, 5000, 'every slot and queue entry gone');
  });

  test('a waiter that died: its grant lapses after the accept window and the slot goes to the next node', async () => {
    startGranter(2_000);
    const set = limited('lapse', 1);
    const first = (await slotsOf('first').tryAcquire(set))!;
    api.create({
      apiVersion: 'coordination.k8s.io/v1',
      kind: 'Lease',
      metadata: { name: queueName('lapse', 'dead'), namespace: NS, labels: { [SLOT_QUEUE_LABEL]: 'lapse', 'app.kubernetes.io/managed-by': 'pinset-agent' }, annotations: { 'pinset.dev/limit': '1', 'pinset.dev/set': 'lapse' } },
      spec: { holderIdentity: 'dead', acquireTime: '2020-01-01T00:00:00.000000Z' },
    });
    const run = simulateRollout({ nodes: ['alive'], set, slotsFor: (n) => slotsOf(n), downloadMs: () => 10, gate: SLOW_POLLS, timeoutMs: 30_000 });
    await api.waitFor(() => api.get('leases', queueName('lapse', 'alive'), NS), 5000, 'alive queued');
    await slotsOf('first').release(first);
    await api.waitFor(() => (api.get('leases', slotName('lapse', 0), NS)?.spec as { holderIdentity?: string } | undefined)?.holderIdentity === 'dead', 5000, 'granted to the dead node first');
    const r = await run;
    assert.deepEqual(r.finished, ['alive']);
    assert.equal(api.get('leases', queueName('lapse', 'dead'), NS), undefined, 'the dead node\'s entry was dropped');
  });

  test('a node dropped from the queue (its entry deleted, as when its grant lapsed) stops watching that entry', async () => {
    startGranter();
    const set = limited('dropped', 1);
    const holder = (await slotsOf('holder').tryAcquire(set))!;
    const gate = new RolloutGate({ slots: slotsOf('waiter'), logger: silentLogger(), onChange: () => {}, ...SLOW_POLLS });
    const entry = queueName('dropped', 'waiter');
    const watching = () => api.openWatches().filter((w) => w.query.fieldSelector === `metadata.name=${entry}`).length;
    try {
      await gate.admit([{ key: 'img', sets: ['api/dropped'] }], new Map([['api/dropped', set]]), () => true);
      await api.waitFor(() => watching() === 1, 5000, 'the node watching its entry');
      api.remove('leases', entry, NS);
      await api.waitFor(() => watching() === 0, 5000, 'the watch of the dropped entry ended');
      assert.deepEqual(gate.queued(), []);
    } finally {
      await gate.close();
      await slotsOf('holder').release(holder);
    }
  });

  test('a holder that died: the slot is granted when its lease expires', async () => {
    startGranter();
    const set = limited('crash', 1);
    assert.ok(await slotsOf('dead', { leaseDurationMs: 2_000 }).tryAcquire(set));
    const r = await simulateRollout({ nodes: ['a', 'b'], set, slotsFor: (n) => slotsOf(n), downloadMs: () => 20, gate: SLOW_POLLS, timeoutMs: 30_000 });
    assert.equal(r.finished.length, 2);
    assert.equal(r.maxConcurrent, 1);
  });

  test('old-protocol nodes mixed in: they poll, the others are granted; the limit holds, everyone finishes', async () => {
    startGranter();
    const set = limited('mixed', 1);
    const old = new Set(['old-0', 'old-1']);
    const r = await simulateRollout({
      nodes: ['old-0', 'new-0', 'old-1', 'new-1', 'new-2'],
      set,
      slotsFor: (n) => slotsOf(n, { queue: !old.has(n) }),
      downloadMs: () => 40,
      // Old nodes poll quickly enough to finish here; new nodes are served by grants alone.
      gate: { retry: { baseMs: 100, capMs: 400 }, firstAttemptSpreadMs: 100 },
      timeoutMs: 60_000,
    });
    assert.equal(r.finished.length, 5);
    assert.equal(r.maxConcurrent, 1);
    const entries = api.requests.filter((q) => q.method === 'POST' && q.path.endsWith('/leases') && (q.body as { metadata?: { name?: string } }).metadata?.name?.endsWith('.queue'));
    assert.deepEqual([...new Set(entries.map((q) => (q.body as { spec: { holderIdentity: string } }).spec.holderIdentity))].sort(), ['new-0', 'new-1', 'new-2'], 'only new nodes queue');
    await api.waitFor(() => leases().length === 0, 5000, 'nothing left behind');
  });

  test('the granter\'s heartbeat: renewed while it leads; a queued node reads it and lists the slots at one attempt in ten; gone when it stops', async () => {
    startGranter();
    await api.waitFor(() => api.get('leases', GRANTER_LEASE, NS), 5000, 'the heartbeat');
    const hb = api.get('leases', GRANTER_LEASE, NS)!;
    assert.deepEqual([(hb.spec as { holderIdentity: string }).holderIdentity, (hb.spec as { leaseDurationSeconds: number }).leaseDurationSeconds], ['granter-test', 30]);
    assert.equal(hb.metadata.labels, undefined, 'no rollout label: no agent may write it (deploy/admission/rollout-slots.yaml)');
    const set = limited('quiet', 1);
    assert.ok(await slotsOf('holder').tryAcquire(set));
    const from = api.requests.length;
    const run = simulateRollout({ nodes: ['waiter'], set, slotsFor: (n) => slotsOf(n), downloadMs: () => 10, gate: { retry: { baseMs: 20, capMs: 40 }, firstAttemptSpreadMs: 0 }, timeoutMs: 30_000 });
    await api.waitFor(() => api.requests.slice(from).filter((r) => r.path.endsWith(`/leases/${GRANTER_LEASE}`) && r.method === 'GET').length >= 30, 10_000, 'thirty attempts');
    const reqs = api.requests.slice(from);
    const lists = reqs.filter((r) => r.method === 'GET' && r.path.endsWith('/leases') && r.query.labelSelector?.startsWith('pinset.dev/rollout-set=')).length;
    const beats = reqs.filter((r) => r.method === 'GET' && r.path.endsWith(`/leases/${GRANTER_LEASE}`)).length;
    assert.ok(lists >= 2 && lists <= Math.ceil(beats / 9) + 1, `${lists} lists for ${beats} heartbeat reads`);
    await slotsOf('holder').release((await slotsOf('holder').tryAcquire(set))!);
    assert.equal((await run).finished.length, 1);
    await stopGranter();
    assert.equal(api.get('leases', GRANTER_LEASE, NS), undefined, 'a granter that stops takes its heartbeat with it');
  });

  test('no granter: the nodes queue, get their slots by polling, and leave nothing behind', async () => {
    const set = limited('alone', 1);
    const r = await simulateRollout({
      nodes: ['a', 'b', 'c'],
      set,
      slotsFor: (n) => slotsOf(n),
      downloadMs: () => 30,
      gate: { retry: { baseMs: 100, capMs: 300 }, firstAttemptSpreadMs: 100 },
      timeoutMs: 30_000,
    });
    assert.equal(r.finished.length, 3);
    assert.equal(r.maxConcurrent, 1);
    await api.waitFor(() => leases().length === 0, 5000, 'entries deleted by the nodes that took slots');
  });

  test('the API unreachable for 2 s mid-rollout: every retry is paced (no spin), and the rollout finishes after', async () => {
    startGranter();
    const set = limited('outage', 1);
    const run = simulateRollout({
      nodes: Array.from({ length: 6 }, (_, i) => `node-${i}`),
      set,
      slotsFor: (n) => slotsOf(n),
      downloadMs: () => 300,
      gate: { retry: { baseMs: 200, capMs: 2_000 }, firstAttemptSpreadMs: 100 },
      timeoutMs: 60_000,
    });
    await api.waitFor(() => leases(`${SLOT_QUEUE_LABEL}=outage`).length >= 4, 5000, 'nodes queued');
    const before = api.connections;
    api.setAvailable(false);
    await new Promise((r) => setTimeout(r, 2_000));
    const during = api.connections - before;
    api.setAvailable(true);
    const r = await run;
    assert.equal(r.finished.length, 6);
    assert.equal(r.maxConcurrent, 1);
    // Six nodes (an attempt, a watch each), a granter (a watch, its writes) and a renewal: paced from 200 ms and 1 s up, a few dozen at most; a spin makes thousands.
    assert.ok(during < 150, `${during} connections while unreachable`);
    await api.waitFor(() => leases().length === 0, 10_000, 'nothing left behind');
  });
});

describe('`pinset controller` grants', () => {
  const ROOT = path.resolve(import.meta.dirname, '../..');
  const run = async (extra: string[], body: () => Promise<void>) => {
    const dir = await mkdtemp(path.join(tmpdir(), 'pinset-grants-'));
    const kubeconfig = await api.writeKubeconfig(dir);
    const child = spawn(path.join(ROOT, 'node_modules/.bin/node'), ['src/cli/main.ts', 'controller', '--kubeconfig', kubeconfig, '--identity', 'granter', '--metrics-addr', '', '--retry-period', '250ms', ...extra], {
      cwd: ROOT,
      stdio: ['ignore', 'ignore', 'pipe'],
      env: { ...process.env, POD_NAMESPACE: NS },
    });
    let stderr = '';
    child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    const exited = new Promise((r) => child.once('exit', r));
    try {
      await api.waitFor(() => (api.get('leases', 'pinset-controller', NS)?.spec as { holderIdentity?: string } | undefined)?.holderIdentity === 'granter', 20_000, `the controller leading (${stderr})`);
      await body();
    } finally {
      child.kill('SIGTERM');
      await exited;
      await rm(dir, { recursive: true, force: true });
    }
  };
  const queued = async (set: string) => {
    api.create({ apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name: set }, spec: { rollout: { maxConcurrentNodes: 1 }, pinnedImages: [{ name: `registry.test/app@sha256:${'a'.repeat(64)}` }] } });
    const uid = api.get('pinnedimagesets', set)!.metadata.uid!;
    const granted: string[] = [];
    const ticket = await slotsOf('worker-1').join!({ name: set, uid, maxConcurrentNodes: 1 }, { granted: (n) => granted.push(n), removed: () => {}, failed: () => {} });
    return { granted, ticket };
  };

  test('the controller process, leading, grants a new set\'s free slot to the node queued for it; its limit read from the set', async () => {
    await run([], async () => {
      const { granted, ticket } = await queued('by-controller');
      await api.waitFor(() => granted.length === 1, 10_000, 'the grant');
      assert.deepEqual(granted, [slotName('by-controller', 0)]);
      await ticket.leave();
    });
    api.remove('pinnedimagesets', 'by-controller');
  });

  test('--rollout-grants=false: nothing is granted, the nodes poll', async () => {
    await run(['--rollout-grants=false'], async () => {
      const { granted, ticket } = await queued('no-grants');
      await new Promise((r) => setTimeout(r, 2_000));
      assert.deepEqual(granted, []);
      assert.equal(api.openWatches().filter((w) => w.query.labelSelector === 'app.kubernetes.io/managed-by=pinset-agent').length, 0, 'no watch of the agents\' Leases');
      await ticket.leave();
    });
    api.remove('pinnedimagesets', 'no-grants');
  });
});

describe('the first wave on Leases', () => {
  test('a static set (no object in the API): seats and records by its name and images\' hash; the granter takes the nodes\' word for the limit', async () => {
    startGranter();
    const X = `sha256:${'3'.repeat(64)}`;
    const name = staticWaveName('boot', [X]);
    const set = { name, nodes: 1, digests: [X] };
    const granted: string[] = [];
    const wave = new FirstWave({
      slots: slotsOf('n1'),
      records: new LeaseWaveRecords({ api: leaseApi, namespace: NS, identity: 'n1', fieldManager: 'pinset-agent' }),
      logger: silentLogger(),
      claims: SLOW_POLLS,
      onChange: (why) => granted.push(why),
    });
    const waves = new Map([['static/boot', set]]);
    const imgs = [{ key: `registry.test/boot@${X}`, digest: X, sets: ['static/boot'] }];
    try {
      await wave.admit(imgs, waves);
      await api.waitFor(() => granted.includes('first-wave seat granted'), 5000, 'the seat granted');
      assert.equal((await wave.admit(imgs, waves)).sets.get('static/boot')!.member, true);
      const seat = api.get('leases', `${name}-0.first-wave`, NS)!;
      assert.equal(seat.metadata.ownerReferences, undefined, 'no owner: the set is on the nodes only');
      assert.equal((api.get('leases', queueName(name, 'n1', 'first-wave'), NS) ?? { metadata: {} }).metadata.annotations?.['pinset.dev/limit'], undefined, 'the entry is gone once served');
    } finally {
      await wave.close();
    }
  });

  test('the member\'s record, watched by name, lets each image go as it lands; the record as stored', async () => {
    startGranter();
    limited('payload', 3, 1);
    const X = `sha256:${'1'.repeat(64)}`;
    const Y = `sha256:${'2'.repeat(64)}`;
    const set = { name: 'payload', uid: 'uid-payload', nodes: 1, digests: [X, Y] };
    const changes = new Map<string, string[]>();
    const waveOf = (n: string) =>
      new FirstWave({
        slots: slotsOf(n),
        records: new LeaseWaveRecords({ api: leaseApi, namespace: NS, identity: n, fieldManager: 'pinset-agent' }),
        logger: silentLogger(),
        claims: SLOW_POLLS,
        recordIntervalMs: 50,
        onChange: (why) => changes.set(n, [...(changes.get(n) ?? []), why]),
      });
    const [a, b] = [waveOf('a'), waveOf('b')];
    const imgs = (...ds: string[]) => ds.map((d) => ({ key: `registry.test/app@${d}`, digest: d, sets: ['api/payload'] }));
    const waves = new Map([['api/payload', set]]);
    try {
      await a.admit(imgs(X, Y), waves);
      await api.waitFor(() => changes.get('a')?.includes('first-wave seat granted'), 5000, 'a granted the seat');
      assert.equal((await a.admit(imgs(X, Y), waves)).sets.get('api/payload')!.member, true);
      assert.deepEqual((await b.admit(imgs(X, Y), waves)).waiting.length, 2);
      await a.held(new Set([X]));
      await api.waitFor(() => changes.get('b')?.includes('the first wave landed an image'), 5000, 'b told of the landing');
      const rb = await b.admit(imgs(X, Y), waves);
      assert.deepEqual([rb.allowed.map((w) => w.digest), rb.waiting.map((w) => w.digest)], [[X], [Y]]);
      assert.deepEqual(rb.sets.get('api/payload')!.members, ['a']);
      const record = api.get('leases', 'payload-0.landed', NS)!;
      assert.deepEqual(record.metadata.labels, { 'pinset.dev/first-wave-landed': 'payload', 'app.kubernetes.io/managed-by': 'pinset-agent' });
      assert.equal(record.metadata.annotations![LANDED_IMAGES_ANNOTATION], imageListHash([X, Y]));
      assert.equal(record.metadata.annotations![LANDED_BITS_ANNOTATION], 'AQ==');
      assert.equal((record.spec as { holderIdentity: string }).holderIdentity, 'a');
      // Every watch the nodes opened is on one Lease by name.
      const agentWatches = api.openWatches().filter((w) => w.resource === 'leases' && w.query.labelSelector === undefined);
      assert.ok(agentWatches.length >= 2);
      for (const w of agentWatches) assert.match(String(w.query.fieldSelector), /^metadata\.name=/);
    } finally {
      await Promise.all([a.close(), b.close()]);
    }
  });
});
