// Rollout slots in the reconcile: two nodes (two agents with in-memory
// runtimes) share one set of in-memory slots, as nodes share Leases. The
// set allows one node at a time: the first downloads, the second says
// WaitingForRolloutSlot until the first is done. Content already on a node
// (a name-only pull) and sets without a limit never wait. The status the
// reporter writes shows a phase change before any progress timer fires.
// With spec.rollout.firstWave, the nodes that are not in the first wave
// pull each image once a first-wave node holds it, image by image, and a
// first-wave node whose pull fails gives its place to another. A first-wave
// node fetches the set one image at a time, in its order; the others pull
// in parallel.
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, mock, test } from 'node:test';
import { Agent } from '../../src/agent/agent.ts';
import { DiskCheck } from '../../src/agent/disk.ts';
import { MemorySizeEstimator } from '../../src/agent/estimate.ts';
import type { KubeObserver } from '../../src/agent/kube.ts';
import type { PlannedSet } from '../../src/agent/plan.ts';
import { ImagePuller } from '../../src/agent/puller.ts';
import { firstWaves } from '../../src/agent/rollout-hook.ts';
import { parseReference } from '../../src/api/reference.ts';
import { StatusReporter, type StatusSink } from '../../src/agent/status-reporter.ts';
import type { NodeStatus, PinnedImageSet } from '../../src/api/types.ts';
import { PinFile } from '../../src/crio/pinfile.ts';
import { createReloader } from '../../src/crio/reload.ts';
import { FirstWave } from '../../src/rollout/first-wave.ts';
import { RolloutGate } from '../../src/rollout/gate.ts';
import { MemoryRolloutSlots, MemorySlotStore, MemoryWaveRecords } from '../../src/rollout/memory-slots.ts';
import { silentLogger } from '../../src/util/log.ts';
import { crioChoice } from '../support/crio-choice.ts';
import { HeldRuntime } from '../support/held-runtime.ts';

const D = (c: string) => `sha256:${c.repeat(64)}`;
const APP = `registry.test/org/app@${D('a')}`;
const DB = `registry.test/org/db@${D('b')}`;
const TOOL = `registry.test/org/tool@${D('c')}`;
const LIB = `registry.test/org/lib@${D('d')}`;
const CLI = `registry.test/org/cli@${D('e')}`;

class MemorySink implements StatusSink {
  written: NodeStatus[] = [];
  async write(s: NodeStatus): Promise<void> {
    this.written.push(structuredClone(s));
  }
  last(set: string) {
    return this.written.at(-1)?.sets.find((s) => s.name === set);
  }
}

function apiSet(name: string, images: string[], maxConcurrentNodes?: number, firstWave?: number): PinnedImageSet {
  const rollout = { ...(maxConcurrentNodes ? { maxConcurrentNodes } : {}), ...(firstWave ? { firstWave: { nodes: firstWave } } : {}) };
  return {
    apiVersion: 'pinset.dev/v1alpha1',
    kind: 'PinnedImageSet',
    metadata: { name, uid: `uid-${name}`, generation: 1 },
    spec: { pinnedImages: images.map((n) => ({ name: n })), ...(Object.keys(rollout).length > 0 ? { rollout } : {}) },
  };
}

interface Node {
  agent: Agent;
  runtime: HeldRuntime;
  sink: MemorySink;
  gate: RolloutGate;
  wave: FirstWave;
}

let dir: string;
let store: MemorySlotStore;
let sets: PinnedImageSet[];

async function node(name: string, sizeEstimator?: MemorySizeEstimator, maxParallel = 4): Promise<Node> {
  const logger = silentLogger();
  const runtime = new HeldRuntime();
  const sink = new MemorySink();
  const staticDir = path.join(dir, name, 'sets');
  await mkdir(staticDir, { recursive: true });
  const kube = { currentNode: () => ({ metadata: { name, labels: {} } }), currentSets: () => sets, settled: async () => {}, setsProblem: () => undefined } as unknown as KubeObserver;
  const slots = new MemoryRolloutSlots(store, name);
  const gate = new RolloutGate({ slots, logger, firstAttemptSpreadMs: 0, retry: { baseMs: 1, capMs: 1 } });
  const wave = new FirstWave({ slots, records: new MemoryWaveRecords(store, name), logger, claims: { firstAttemptSpreadMs: 0, retry: { baseMs: 1, capMs: 1 } }, recordIntervalMs: 1, failedCooldownMs: 60_000 });
  const agent = new Agent({
    nodeName: name,
    runtime,
    pins: crioChoice({ pinFile: await PinFile.open(path.join(dir, name, 'crio.conf.d'), { mainConfig: path.join(dir, name, 'crio.conf') }), reloader: createReloader('none'), runtime, logger }),
    puller: new ImagePuller({ runtime, maxParallel, logger }),
    reporter: new StatusReporter(sink, { logger }),
    logger,
    kube,
    staticDir,
    rolloutGate: gate,
    firstWave: wave,
    ...(sizeEstimator ? { sizeEstimator, diskCheck: new DiskCheck(runtime, { highWatermarkPercent: 85, usageOf: async () => ({ size: 100 * 2 ** 30, available: 90 * 2 ** 30 }) }) } : {}),
  });
  return { agent, runtime, sink, gate, wave };
}

beforeEach(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-rollout-'));
  store = new MemorySlotStore();
});
afterEach(async () => {
  mock.timers.reset();
  await rm(dir, { recursive: true, force: true });
});

describe('the reconcile takes a rollout slot before it downloads', () => {
  test('maxConcurrentNodes 1: the first node downloads, the second waits (WaitingForRolloutSlot), then downloads once the slot is free', async () => {
    sets = [apiSet('web', [APP, DB], 1)];
    const [n1, n2] = [await node('n1'), await node('n2')];
    n1.runtime.hold();
    // No interval timer fires in this test: what is written, is written without one.
    mock.timers.enable({ apis: ['setInterval'] });
    const first = n1.agent.reconcile();
    // Progressing is written as the pulls start, not when the progress timer fires.
    await waitFor(() => n1.runtime.downloads.length === 2 && n1.sink.last('web')?.phase === 'Progressing');
    assert.equal(n1.sink.last('web')?.reason, 'Pulling');
    assert.deepEqual(n1.gate.held(), ['api/web']);

    const waiting = await n2.agent.reconcile();
    assert.deepEqual(n2.runtime.downloads, [], 'nothing downloaded without a slot');
    const s = waiting.sets.find((x) => x.name === 'web')!;
    assert.equal(s.phase, 'Progressing');
    assert.equal(s.reason, 'WaitingForRolloutSlot');
    assert.match(s.message!, /^waiting for a rollout slot: at most 1 node\(s\) download this set at a time; 0 of 2 images present$/);
    assert.equal(waiting.pullsAttempted, 0);
    await n2.agent.opts.reporter.flush();
    assert.equal(n2.sink.last('web')?.reason, 'WaitingForRolloutSlot', 'written to the Node');

    n1.runtime.release();
    const done = await first;
    assert.equal(done.sets[0]!.phase, 'Ready');
    assert.deepEqual(n1.gate.held(), [], 'freed when the downloads ended');

    await new Promise((r) => setTimeout(r, 5));
    const after = await n2.agent.reconcile();
    assert.equal(after.sets[0]!.phase, 'Ready');
    assert.deepEqual(n2.runtime.downloads.sort(), [APP, DB].sort());
    assert.equal(store.slots.size, 0);
  });

  test('a node that loses its slot while it downloads (another took it once its lease ran out) starts no new pull of the set: the one under way finishes, the rest wait for a slot', async () => {
    sets = [apiSet('web', [APP, DB, TOOL], 1)];
    const n1 = await node('n1', undefined, 1);
    n1.runtime.holdEach([APP, DB, TOOL]);
    mock.timers.enable({ apis: ['setInterval'] });
    const first = n1.agent.reconcile();
    await waitFor(() => n1.runtime.downloads.length === 1);
    const [slot, s] = [...store.slots.entries()][0]!;
    store.slots.set(slot, { ...s, holder: 'n2' });
    mock.timers.tick(60_000); // the next renewal finds it n2's
    await waitFor(() => n1.gate.held().length === 0);
    const pulling = n1.runtime.downloads[0]!;
    n1.runtime.releaseOne(pulling);
    // Without the check, the next image's pull starts (and is held): the reconcile would not end.
    const done = await Promise.race([first, new Promise<undefined>((r) => setTimeout(() => r(undefined), 2_000))]).finally(() => {
      for (const ref of [APP, DB, TOOL]) if (ref !== pulling) n1.runtime.releaseOne(ref);
    });
    assert.deepEqual(n1.runtime.downloads, [pulling], 'the two images not started yet never reached the runtime');
    assert.ok(done, 'the reconcile ended');
    assert.equal(done.pullsAttempted, 1);
    const web = done.sets.find((x) => x.name === 'web')!;
    assert.equal(web.phase, 'Progressing');
    assert.equal(web.images?.failed ?? 0, 0, 'held back, not failed');
    assert.equal(store.slots.get(slot)!.holder, 'n2', 'n2 keeps the slot');
    const again = await n1.agent.reconcile();
    assert.equal(again.sets.find((x) => x.name === 'web')!.reason, 'WaitingForRolloutSlot');
    assert.deepEqual(n1.runtime.downloads, [pulling]);
  });

  test('content already on the node (a name-only pull) and sets without a limit never wait for a slot', async () => {
    sets = [apiSet('web', [APP, DB], 1), apiSet('tools', [TOOL])];
    const [n1, n2] = [await node('n1'), await node('n2')];
    n1.runtime.hold();
    const first = n1.agent.reconcile();
    await waitFor(() => n1.runtime.downloads.length === 3);
    // n2 holds DB's content under another name already.
    n2.runtime.images.push({ id: `id-${D('b')}`, repoTags: [], repoDigests: [`mirror.test/org/db@${D('b')}`], size: 1, pinned: false, runtimeHandler: '' });
    const r = await n2.agent.reconcile();
    assert.deepEqual(n2.runtime.downloads, [TOOL], 'the unlimited set downloads; the limited one waits');
    assert.ok(n2.runtime.images.find((i) => i.id === `id-${D('b')}`)!.repoDigests.includes(DB), 'DB got its name without a slot');
    assert.equal(r.sets.find((s) => s.name === 'tools')!.phase, 'Ready');
    const web = r.sets.find((s) => s.name === 'web')!;
    assert.equal(web.reason, 'WaitingForRolloutSlot');
    assert.equal(web.images.present, 1);
    n1.runtime.release();
    await first;
  });

  test('only a node about to download asks the registry for sizes: a waiting node does not', async () => {
    sets = [apiSet('web', [APP, DB], 1)];
    const [e1, e2] = [new MemorySizeEstimator(), new MemorySizeEstimator()];
    for (const e of [e1, e2]) for (const r of [APP, DB]) e.set(r, { [r]: 1000 });
    const [n1, n2] = [await node('n1', e1), await node('n2', e2)];
    n1.runtime.hold();
    const first = n1.agent.reconcile();
    await waitFor(() => n1.runtime.downloads.length === 2);
    assert.deepEqual(e1.asked.flat().sort(), [APP, DB].sort(), 'the slot holder estimated its batch');
    const waiting = await n2.agent.reconcile();
    assert.equal(waiting.sets[0]!.reason, 'WaitingForRolloutSlot');
    assert.deepEqual(e2.asked, [], 'the waiting node asked the registry nothing');
    n1.runtime.release();
    await first;
    await new Promise((r) => setTimeout(r, 5));
    assert.equal((await n2.agent.reconcile()).sets[0]!.phase, 'Ready');
    assert.deepEqual(e2.asked.flat().sort(), [APP, DB].sort());
  });

  test('a set removed while its node holds the slot gives the slot back at the next reconcile', async () => {
    sets = [apiSet('web', [APP], 1)];
    const n1 = await node('n1');
    n1.runtime.hold();
    const ac = new AbortController();
    const running = n1.agent.reconcile(ac.signal).catch(() => undefined);
    await waitFor(() => n1.runtime.downloads.length === 1);
    assert.equal(store.slots.size, 1);
    sets = [];
    ac.abort(); // the desired state changed: the reconcile is cancelled, its pull goes on
    await running;
    await n1.agent.reconcile();
    assert.equal(store.slots.size, 0, 'freed: the set has nothing left to download here');
    n1.runtime.release();
  });
});

describe('the reconcile follows the first wave (spec.rollout.firstWave)', () => {
  test('image by image: a node outside the first wave pulls each image once a first-wave node holds it; slots are asked only for what may go; a set without a first wave never waits', async () => {
    sets = [apiSet('web', [APP, DB], 2, 1), apiSet('tools', [TOOL])];
    const [n1, n2] = [await node('n1'), await node('n2')];
    n1.runtime.holdEach([APP, DB]);
    const first = n1.agent.reconcile();
    await waitFor(() => n1.runtime.downloads.length === 2);
    assert.deepEqual(n1.runtime.downloads, [APP, TOOL], 'the first wave fetches one image at a time');
    assert.deepEqual(n1.gate.held(), ['api/web'], 'the first-wave node holds a rollout slot too');

    const waiting = await n2.agent.reconcile();
    assert.deepEqual(n2.runtime.downloads, [TOOL], 'the set without a first wave downloads at once; the other waits');
    const web = waiting.sets.find((x) => x.name === 'web')!;
    assert.equal(web.phase, 'Progressing');
    assert.equal(web.reason, 'WaitingForFirstWave');
    assert.match(web.message!, /^waiting for the first wave to fetch 2 image\(s\) before this node pulls them: 0 of 2 landed \(first wave: n1\); 0 of 2 images present$/);
    assert.deepEqual(n2.gate.held(), [], 'no slot asked for while every image waits');

    n1.runtime.releaseOne(APP);
    await waitFor(() => [...store.records.values()].some((r) => r.landed !== 'AA=='));
    const one = await n2.agent.reconcile();
    assert.deepEqual(n2.runtime.downloads.sort(), [APP, TOOL].sort(), 'the landed image, not the one still coming');
    assert.match(one.sets.find((x) => x.name === 'web')!.message!, /1 of 2 landed \(first wave: n1\); 1 of 2 images present$/);

    n1.runtime.releaseOne(DB);
    const done = await first;
    assert.equal(done.sets.find((x) => x.name === 'web')!.phase, 'Ready');
    await waitFor(() => [...store.records.values()].some((r) => r.landed === 'Aw=='));
    const all = await n2.agent.reconcile();
    assert.equal(all.sets.find((x) => x.name === 'web')!.phase, 'Ready');
    assert.deepEqual(n2.runtime.downloads.sort(), [APP, DB, TOOL].sort());
  });

  test('a first-wave node fetches the set one image at a time, in the set\'s order, while another set pulls in parallel; a node that pulls what landed pulls in parallel', async () => {
    sets = [apiSet('web', [DB, TOOL, APP], undefined, 1), apiSet('tools', [LIB, CLI])];
    const [n1, n2] = [await node('n1'), await node('n2')];
    n1.runtime.holdEach([DB, TOOL, APP, LIB, CLI]);
    const first = n1.agent.reconcile();
    await waitFor(() => n1.runtime.downloads.length === 3);
    await new Promise((r) => setTimeout(r, 50));
    assert.deepEqual(n1.runtime.downloads, [DB, CLI, LIB], 'the first image of the set, the other set\'s two beside it');
    n1.runtime.releaseOne(DB);
    await waitFor(() => n1.runtime.downloads.length === 4);
    await new Promise((r) => setTimeout(r, 50));
    assert.deepEqual(n1.runtime.downloads.slice(3), [TOOL], 'the next once the first landed, and only it');
    n1.runtime.releaseOne(TOOL);
    await waitFor(() => n1.runtime.downloads.length === 5);
    assert.deepEqual(n1.runtime.downloads.slice(4), [APP]);
    for (const r of [APP, LIB, CLI]) n1.runtime.releaseOne(r);
    assert.ok((await first).sets.every((s) => s.phase === 'Ready'));

    await waitFor(() => [...store.records.values()].some((r) => r.landed === 'Bw=='));
    n2.runtime.holdEach([DB, TOOL, APP]);
    const follower = n2.agent.reconcile();
    await waitFor(() => n2.runtime.downloads.filter((r) => [DB, TOOL, APP].includes(r)).length === 3);
    for (const r of [DB, TOOL, APP]) n2.runtime.releaseOne(r);
    assert.ok((await follower).sets.every((s) => s.phase === 'Ready'), 'the three were under way together');
  });

  test('a first-wave node whose pull fails gives its seat up: another node takes it and fetches for the rest', async () => {
    sets = [apiSet('web', [APP], undefined, 1)];
    const [n1, n2, n3] = [await node('n1'), await node('n2'), await node('n3')];
    n1.runtime.holdEach([APP]);
    const first = n1.agent.reconcile();
    await waitFor(() => n1.runtime.downloads.length === 1);
    assert.equal((await n2.agent.reconcile()).sets[0]!.reason, 'WaitingForFirstWave');
    n1.runtime.failOne(APP, new Error('connection reset by peer'));
    const failed = await first;
    assert.equal(failed.sets[0]!.phase, 'Degraded');

    const member = await n2.agent.reconcile();
    assert.deepEqual(n2.runtime.downloads, [APP], 'n2 took the seat n1 gave up and fetched');
    assert.equal(member.sets[0]!.phase, 'Ready');
    await waitFor(() => [...store.records.values()].some((r) => r.holder === 'n2' && r.landed === 'AQ=='));
    assert.equal((await n3.agent.reconcile()).sets[0]!.phase, 'Ready', 'the rest pull once n2 holds it');
    assert.deepEqual(n3.runtime.downloads, [APP]);
  });

  test('a node holding some of the images already fetches the rest as the first wave, and its record shows both', async () => {
    sets = [apiSet('web', [APP, DB], undefined, 1)];
    const n1 = await node('n1');
    n1.runtime.images.push({ id: `id-${D('a')}`, repoTags: [], repoDigests: [APP], size: 1, pinned: false, runtimeHandler: '' });
    const r = await n1.agent.reconcile();
    assert.deepEqual(n1.runtime.downloads, [DB], 'it is the first wave: it fetches what it lacks');
    assert.equal(r.sets[0]!.phase, 'Ready');
    await waitFor(() => [...store.records.values()].some((x) => x.landed === 'Aw=='), 2_000);
  });
});

test('firstWaves: a set from the API goes by its name and uid, a static set by its name and a hash of its images; a set without the field, not selected or broken has none', () => {
  const ref = (r: string) => {
    const p = parseReference(r);
    return p.ok ? p.value : assert.fail(p.error);
  };
  const base: PlannedSet = { key: 'api/web', name: 'web', uid: 'uid-web', source: 'api', origin: 'api', generation: 1, runtimeHandler: '', selection: 'selected', specErrors: [], invalidImages: [], references: [ref(APP), ref(DB)], pullSecrets: [], firstWaveNodes: 2 };
  const waves = firstWaves([
    base,
    { ...base, key: 'static/web', source: 'static', origin: '/etc/pinset/sets/web.yaml', uid: undefined },
    { ...base, key: 'api/none', name: 'none', firstWaveNodes: undefined },
    { ...base, key: 'api/elsewhere', name: 'elsewhere', selection: 'not-selected' },
    { ...base, key: 'api/broken', name: 'broken', specErrors: ['spec.pinnedImages: required'] },
  ]);
  assert.deepEqual([...waves.keys()], ['api/web', 'static/web']);
  assert.deepEqual(waves.get('api/web'), { name: 'web', uid: 'uid-web', nodes: 2, digests: [D('a'), D('b')] });
  const fromFile = waves.get('static/web')!;
  assert.match(fromFile.name, /^web\.static-[0-9a-f]{10}$/);
  assert.equal(fromFile.uid, undefined, 'a static set has no uid: its Leases are not owned by an object');
});

async function waitFor(pred: () => boolean, timeoutMs = 5_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!pred()) {
    if (Date.now() > deadline) throw new Error('condition not reached');
    await new Promise((r) => setTimeout(r, 5));
  }
}
