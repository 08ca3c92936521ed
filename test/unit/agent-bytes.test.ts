// A set's bytes on the node, in the reconcile: the agent with an in-memory
// runtime whose downloads wait until released, the in-memory size
// estimator, an in-memory download progress seam (what containerd's
// ingests would say), and its real planner, pin file, puller, status and
// reporter. While a set downloads its bytes grow with what is arriving and
// its rate follows; sizes are asked for once per image (present images of
// the set too, in the same request); a restart with the set Ready asks the
// registry nothing and keeps its total from the annotation.
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, mock, test } from 'node:test';
import { Agent } from '../../src/agent/agent.ts';
import { DiskCheck } from '../../src/agent/disk.ts';
import { MemorySizeEstimator } from '../../src/agent/estimate.ts';
import { KnownSizes, SIZE_RETRY_MS } from '../../src/agent/known-sizes.ts';
import type { KubeObserver } from '../../src/agent/kube.ts';
import { ImagePuller } from '../../src/agent/puller.ts';
import { progressReportMs } from '../../src/agent/pulls.ts';
import { StatusReporter, type StatusSink } from '../../src/agent/status-reporter.ts';
import { encodeNodeStatus } from '../../src/api/node-status.ts';
import { STATUS_ANNOTATION, type NodeStatus, type PinnedImageSet } from '../../src/api/types.ts';
import { PinFile } from '../../src/crio/pinfile.ts';
import { createReloader } from '../../src/crio/reload.ts';
import type { DownloadProgress } from '../../src/pins/downloads.ts';
import { silentLogger } from '../../src/util/log.ts';
import { crioChoice } from '../support/crio-choice.ts';
import { HeldRuntime } from '../support/held-runtime.ts';

const D = (c: string) => `sha256:${c.repeat(64)}`;
const APP = `registry.test/org/app@${D('a')}`;
const DB = `registry.test/org/db@${D('b')}`;
// Blobs: a base layer both images share, a layer and a config each.
const BLOBS = { [APP]: { [D('0')]: 1000, [D('1')]: 3000, [D('2')]: 10 }, [DB]: { [D('0')]: 1000, [D('3')]: 2000, [D('4')]: 10 } };
const TOTAL = 1000 + 3000 + 10 + 2000 + 10;
/** How often the agent recomputes its status while pulling, with the reporter below. */
const EVERY = progressReportMs(1);

/** What containerd's ingests would say: the bytes of each blob set by the test; what was asked for is kept. */
class MemoryDownloads implements DownloadProgress {
  bytes = new Map<string, number>();
  asked: string[][] = [];
  async arrived(blobs: ReadonlyMap<string, number>): Promise<ReadonlyMap<string, number>> {
    this.asked.push([...blobs.keys()].sort());
    return new Map([...this.bytes].filter(([d]) => blobs.has(d)));
  }
  close(): void {}
}

/** The Node: what the agent wrote to its annotation is what a restarted agent reads. */
class NodeSink implements StatusSink {
  written: NodeStatus[] = [];
  annotations: Record<string, string> = {};
  async write(s: NodeStatus): Promise<void> {
    this.written.push(structuredClone(s));
    this.annotations[STATUS_ANNOTATION] = encodeNodeStatus(s);
  }
  last() {
    return this.written.at(-1)?.sets.find((s) => s.name === 'web');
  }
}

let dir: string;
let sets: PinnedImageSet[];
let now: number;

function apiSet(images: string[]): PinnedImageSet {
  return { apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name: 'web', uid: 'uid-web', generation: 1 }, spec: { pinnedImages: images.map((n) => ({ name: n })) } };
}

async function node(runtime: HeldRuntime, sink: NodeSink, estimator: MemorySizeEstimator, downloads?: DownloadProgress): Promise<Agent> {
  const logger = silentLogger();
  const staticDir = path.join(dir, 'sets');
  await mkdir(staticDir, { recursive: true });
  const kube = { currentNode: () => ({ metadata: { name: 'n1', labels: {}, annotations: sink.annotations } }), currentSets: () => sets, settled: async () => {}, setsProblem: () => undefined } as unknown as KubeObserver;
  return new Agent({
    nodeName: 'n1',
    runtime,
    pins: crioChoice({ pinFile: await PinFile.open(path.join(dir, 'crio.conf.d'), { mainConfig: path.join(dir, 'crio.conf') }), reloader: createReloader('none'), runtime, logger }),
    puller: new ImagePuller({ runtime, maxParallel: 4, logger }),
    // Progress written 1 ms after the last write: what is reported is what lands, at once; recomputed every second while pulling.
    reporter: new StatusReporter(sink, { logger, progressIntervalMs: 1 }),
    logger,
    kube,
    staticDir,
    sizeEstimator: estimator,
    diskCheck: new DiskCheck(runtime, { highWatermarkPercent: 85, usageOf: async () => ({ size: 100 * 2 ** 30, available: 90 * 2 ** 30 }) }),
    downloads: downloads ?? null,
    now: () => now,
  });
}

function sizes(): MemorySizeEstimator {
  const e = new MemorySizeEstimator();
  for (const [ref, blobs] of Object.entries(BLOBS)) e.set(ref, blobs);
  return e;
}

async function waitFor(pred: () => boolean, what: string, timeoutMs = 5_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!pred()) {
    if (Date.now() > deadline) throw new Error(`not reached: ${what}`);
    await new Promise((r) => setTimeout(r, 2));
  }
}

beforeEach(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-bytes-'));
  now = 1_000_000;
});
afterEach(async () => {
  mock.timers.reset();
  await rm(dir, { recursive: true, force: true });
});

describe("a set's bytes on the node", () => {
  test('while it downloads, its bytes grow with what the runtime says is arriving and its rate follows; once the images land, all present of the total', async () => {
    sets = [apiSet([APP, DB])];
    const runtime = new HeldRuntime();
    const sink = new NodeSink();
    const downloads = new MemoryDownloads();
    const agent = await node(runtime, sink, sizes(), downloads);
    runtime.hold();
    mock.timers.enable({ apis: ['setInterval'] });
    const reconciled = agent.reconcile();
    await waitFor(() => runtime.downloads.length === 2 && sink.last()?.reason === 'Pulling', 'the pulls start');
    assert.deepEqual(sink.last()!.bytes, { present: 0, total: TOTAL }, 'the total as the pulls start, the shared base layer once');
    assert.deepEqual(downloads.asked.at(-1), Object.keys({ ...BLOBS[APP], ...BLOBS[DB] }).sort(), 'asked about the blobs of the images not present');

    // A report later, containerd has written part of the base layer and of APP's own.
    downloads.bytes = new Map([[D('0'), 1000], [D('1'), 1500]]);
    now += EVERY;
    mock.timers.tick(EVERY);
    await waitFor(() => sink.last()?.bytes?.present === 2500, 'the next progress report');
    assert.equal(sink.last()!.rate, 2500, '2500 bytes in 1 s');
    // A blob's bytes never count past its size.
    downloads.bytes = new Map([[D('0'), 1000], [D('1'), 99_999], [D('3'), 500]]);
    now += EVERY;
    mock.timers.tick(EVERY);
    await waitFor(() => sink.last()?.bytes?.present === 4500, 'the report after');
    assert.equal(sink.last()!.rate, 2250, '4500 bytes in 2 s');

    runtime.release();
    const r = await reconciled;
    await agent.opts.reporter.flush();
    assert.equal(r.sets[0]!.phase, 'Ready');
    assert.deepEqual(sink.last()!.bytes, { present: TOTAL, total: TOTAL });
    assert.equal(sink.last()!.rate, undefined, 'no rate once nothing downloads');
  });

  test('without download progress (CRI-O), an image counts when it lands', async () => {
    sets = [apiSet([APP, DB])];
    const runtime = new HeldRuntime();
    const sink = new NodeSink();
    const agent = await node(runtime, sink, sizes());
    runtime.hold();
    mock.timers.enable({ apis: ['setInterval'] });
    const reconciled = agent.reconcile();
    await waitFor(() => runtime.downloads.length === 2 && sink.last()?.reason === 'Pulling', 'the pulls start');
    now += EVERY;
    mock.timers.tick(EVERY);
    assert.deepEqual(sink.last()!.bytes, { present: 0, total: TOTAL });
    runtime.release();
    await reconciled;
    await agent.opts.reporter.flush();
    assert.deepEqual(sink.last()!.bytes, { present: TOTAL, total: TOTAL });
  });

  test('sizes are asked once per image, present images of the set in the same request; a restart with the set Ready asks nothing and keeps its total', async () => {
    sets = [apiSet([APP, DB])];
    const runtime = new HeldRuntime();
    runtime.images.push({ id: `id-${D('a')}`, repoTags: [], repoDigests: [APP], size: 1, pinned: false, runtimeHandler: '' });
    const sink = new NodeSink();
    const estimator = sizes();
    const agent = await node(runtime, sink, estimator, new MemoryDownloads());
    const r = await agent.reconcile();
    await agent.opts.reporter.flush();
    assert.deepEqual(runtime.downloads, [DB]);
    assert.deepEqual(estimator.asked, [[DB, APP]], 'one request: DB for the estimate, APP (present) for the total');
    assert.deepEqual(r.sets[0]!.bytes, { present: TOTAL, total: TOTAL });
    await agent.reconcile();
    assert.equal(estimator.asked.length, 1, 'a resync asks nothing');

    // The agent restarts: nothing is known but the annotation.
    const restarted = sizes();
    const again = await node(runtime, sink, restarted, new MemoryDownloads());
    const r2 = await again.reconcile();
    assert.deepEqual(restarted.asked, [], 'a Ready set asks the registry nothing');
    assert.equal(r2.sets[0]!.phase, 'Ready');
    assert.deepEqual(r2.sets[0]!.bytes, { present: TOTAL, total: TOTAL }, 'its total from the last annotation');
  });

  test('an image the registry cannot size leaves its set without bytes (a part would mislead); a complete set asks no more', async () => {
    sets = [apiSet([APP, DB])];
    const runtime = new HeldRuntime();
    runtime.images.push({ id: `id-${D('a')}`, repoTags: [], repoDigests: [APP], size: 1, pinned: false, runtimeHandler: '' });
    const sink = new NodeSink();
    const estimator = sizes();
    estimator.fail(APP, 'registry.test: 503 Service Unavailable');
    const agent = await node(runtime, sink, estimator);
    runtime.hold();
    const reconciled = agent.reconcile();
    await waitFor(() => runtime.downloads.length === 1, 'DB downloads');
    assert.deepEqual(estimator.asked, [[DB, APP]]);
    assert.equal(sink.last()?.bytes, undefined, 'no bytes while a size is unknown: a part would mislead');
    runtime.release();
    await reconciled;
    // DB has landed and the set is complete: nothing more to size.
    await agent.reconcile();
    assert.deepEqual(estimator.asked, [[DB, APP]]);
  });
});

describe('the pace of progress reports while pulls run', () => {
  test('every 5 s, or as often as progress may be written when that is shorter, never under a second', () => {
    assert.equal(progressReportMs(60_000), 5_000, 'the default: a minute between progress writes');
    assert.equal(progressReportMs(1_000), 1_000, '--status-progress-interval 1s: what is written is at most a second old');
    assert.equal(progressReportMs(1), 1_000);
  });
});

describe('the sizes pull admission keeps', () => {
  test('a known reference is never asked again; one the registry could not size, again only after SIZE_RETRY_MS; references no longer wanted are forgotten', () => {
    let t = 0;
    const known = new KnownSizes(() => t);
    assert.deepEqual(known.toAsk([APP, DB, APP]), [APP, DB]);
    known.note(new Map([[APP, { blobs: new Map(Object.entries(BLOBS[APP])) }], [DB, { unknown: '503' }]]));
    assert.deepEqual(known.blobs(APP), new Map(Object.entries(BLOBS[APP])));
    assert.deepEqual(known.toAsk([APP, DB]), []);
    t += SIZE_RETRY_MS - 1;
    assert.deepEqual(known.toAsk([APP, DB]), []);
    t += 1;
    assert.deepEqual(known.toAsk([APP, DB]), [DB]);
    // An unknown answer never replaces a known size.
    known.note(new Map([[APP, { unknown: 'the size estimate ran out of time' }]]));
    assert.ok(known.blobs(APP));
    known.retain(new Set([DB]));
    assert.equal(known.blobs(APP), undefined);
    assert.equal(known.size, 0);
    assert.deepEqual(known.toAsk([APP]), [APP]);
  });
});
