// The disk estimate in a reconcile: the agent with in-memory twins (runtime,
// size estimator, filesystem usage) and its real planner, pin file, puller
// and status. A batch that would not fit below the watermark is not pulled
// and its sets go Degraded/NoSpace with pins kept; unknown sizes fall back
// to the watermark alone; content already on the node costs nothing.
import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, test } from 'node:test';
import { Agent } from '../../src/agent/agent.ts';
import { DiskCheck, type FsUsage } from '../../src/agent/disk.ts';
import { estimateBatch, MemorySizeEstimator, noSpaceMessage, roomBelowWatermark } from '../../src/agent/estimate.ts';
import { ImagePuller } from '../../src/agent/puller.ts';
import { StatusReporter } from '../../src/agent/status-reporter.ts';
import type { ImageFilesystem, ImageRuntime, RuntimeImage, RuntimeInfo } from '../../src/cri/runtime.ts';
import { PinFile } from '../../src/crio/pinfile.ts';
import { createReloader } from '../../src/crio/reload.ts';
import { silentLogger } from '../../src/util/log.ts';
import { crioChoice } from '../support/crio-choice.ts';

const GiB = 1024 ** 3;
const D = (c: string) => `sha256:${c.repeat(64)}`;
const APP = `registry.test/org/app@${D('a')}`;
const DB = `registry.test/org/db@${D('b')}`;
const TOOL = `registry.test/org/tool@${D('c')}`;

/** Pulls land at once; what was pulled is listed. */
class InstantRuntime implements ImageRuntime {
  images: RuntimeImage[] = [];
  pulls: string[] = [];
  async version(): Promise<RuntimeInfo> {
    return { runtimeName: 'memory', runtimeVersion: '0', runtimeApiVersion: 'v1' };
  }
  async listImages(): Promise<RuntimeImage[]> {
    return this.images.map((i) => ({ ...i }));
  }
  async imageStatus(ref: string): Promise<RuntimeImage | null> {
    return this.images.find((i) => i.repoDigests.includes(ref)) ?? null;
  }
  async pullImage(ref: string): Promise<string> {
    this.pulls.push(ref);
    const existing = this.images.find((i) => i.id === `id-${ref.split('@')[1]}`);
    if (existing) existing.repoDigests.push(ref);
    else this.images.push({ id: `id-${ref.split('@')[1]}`, repoTags: [], repoDigests: [ref], size: 1, pinned: false, runtimeHandler: '' });
    return `id-${ref}`;
  }
  async imageFsInfo(): Promise<ImageFilesystem[]> {
    return [{ mountpoint: '/var/lib/containers/storage', usedBytes: 0 }];
  }
  close(): void {}
}

describe('disk estimate arithmetic', () => {
  test('a layer shared by two images counts once in the batch and once in each set', () => {
    const sizes = new Map([
      [APP, { blobs: new Map([['base', 5 * GiB], ['app', 3 * GiB], ['cfg-a', 1000]]) }],
      [DB, { blobs: new Map([['base', 5 * GiB], ['db', 2 * GiB], ['cfg-b', 1000]]) }],
      [TOOL, { unknown: 'registry.test/org/tool: cannot be reached' }],
    ]);
    const b = estimateBatch([{ reference: APP, sets: ['static/web'] }, { reference: DB, sets: ['static/web', 'static/db'] }, { reference: TOOL, sets: ['static/db'] }], sizes, 2);
    assert.equal(b.neededBytes, 2 * (10 * GiB + 2000));
    assert.equal(b.perSet.get('static/web'), 2 * (10 * GiB + 2000));
    assert.equal(b.perSet.get('static/db'), 2 * (7 * GiB + 1000));
    assert.deepEqual(b.unknown, [{ reference: TOOL, why: 'registry.test/org/tool: cannot be reached' }]);
    assert.equal(roomBelowWatermark(100 * GiB, 70 * GiB, 85), 15 * GiB);
    assert.match(noSpaceMessage(Math.round(12.3 * GiB), Math.round(8.1 * GiB), 85, '/var/lib/containers', 3, 0), /^needs 12\.3 GiB, 8\.1 GiB free below the 85% watermark on \/var\/lib\/containers /);
  });
});

describe('the agent estimates before pulling', () => {
  let dir: string;
  let runtime: InstantRuntime;
  let estimator: MemorySizeEstimator;
  let usage: FsUsage;

  beforeEach(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-estimate-'));
    runtime = new InstantRuntime();
    estimator = new MemorySizeEstimator();
    usage = { size: 100 * GiB, available: (100 - 70) * GiB };
    estimator.set(APP, { base: 5 * GiB, app: 3 * GiB });
    estimator.set(DB, { base: 5 * GiB, db: 2 * GiB });
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  async function agent(images: string[], debounceMs?: number): Promise<{ agent: Agent; pinFile: PinFile; staticDir: string }> {
    const staticDir = path.join(dir, 'sets');
    await import('node:fs/promises').then((f) => f.mkdir(staticDir, { recursive: true }));
    await writeFile(
      path.join(staticDir, 'web.yaml'),
      `apiVersion: pinset.dev/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: web}\nspec:\n  pinnedImages:\n${images.map((i) => `  - name: ${i}\n`).join('')}`,
    );
    const pinFile = await PinFile.open(path.join(dir, 'crio.conf.d'), { mainConfig: path.join(dir, 'crio.conf') });
    const logger = silentLogger();
    const a = new Agent({
      nodeName: 'n1',
      runtime,
      pins: crioChoice({ pinFile, reloader: createReloader('none'), runtime, logger }),
      puller: new ImagePuller({ runtime, maxParallel: 2, logger }),
      reporter: new StatusReporter({ write: async () => {} }, { logger }),
      logger,
      staticDir,
      diskCheck: new DiskCheck(runtime, { highWatermarkPercent: 85, usageOf: async () => usage }),
      sizeEstimator: estimator,
      diskEstimateFactor: 2,
      ...(debounceMs !== undefined ? { debounceMs } : {}),
    });
    return { agent: a, pinFile, staticDir };
  }

  test('a batch that does not fit below the watermark pulls nothing: NoSpace with the numbers, pins kept, the estimate in the status', async () => {
    const { agent: a, pinFile } = await agent([APP, DB]);
    const r = await a.reconcile();
    assert.deepEqual(runtime.pulls, []);
    const [web] = r.sets;
    assert.equal(web!.phase, 'Degraded');
    assert.equal(web!.reason, 'NoSpace');
    // distinct: base 5 + app 3 + db 2 = 10 GiB, x2 = 20 GiB; room: 85 - 70 = 15 GiB.
    assert.match(web!.message!, /needs 20\.0 GiB, 15\.0 GiB free below the 85% watermark on \/var\/lib\/containers\/storage/);
    assert.equal(web!.estimatedBytes, 20 * GiB);
    const pins = await readFile(pinFile.path, 'utf8');
    assert.ok(pins.includes(APP) && pins.includes(DB), 'pins stay in the file');
  });

  test('when it fits, everything is pulled; once all is present the estimate leaves the status and resyncs ask nothing', async () => {
    usage = { size: 100 * GiB, available: (100 - 50) * GiB };
    const { agent: a } = await agent([APP, DB]);
    const r = await a.reconcile();
    assert.deepEqual(runtime.pulls.sort(), [APP, DB].sort());
    assert.equal(r.sets[0]!.phase, 'Ready');
    assert.equal(r.sets[0]!.estimatedBytes, undefined);
    assert.equal(estimator.asked.length, 1);
    await a.reconcile();
    assert.equal(estimator.asked.length, 1, 'nothing to download, nothing estimated');
  });

  test('unknown sizes: the batch is pulled on the watermark alone, unless the known part alone does not fit', async () => {
    estimator.fail(TOOL, 'registry.test/org/tool@…: 127.0.0.1:5000 cannot be reached: ECONNREFUSED');
    const first = await agent([APP, TOOL]);
    const r = await first.agent.reconcile();
    // APP alone: 8 GiB x2 = 16 GiB > 15 GiB room: even the lower bound does not fit.
    assert.equal(r.sets[0]!.reason, 'NoSpace');
    assert.match(r.sets[0]!.message!, /needs 16\.0 GiB, .*1 more of unknown size/);
    assert.deepEqual(runtime.pulls, []);

    // With more room (and a new agent: the failed batch waits out its NoSpace backoff otherwise).
    usage = { size: 100 * GiB, available: (100 - 60) * GiB };
    const second = await agent([APP, TOOL]);
    const r2 = await second.agent.reconcile();
    assert.deepEqual(runtime.pulls.sort(), [APP, TOOL].sort(), 'an unknown size does not block the pull');
    assert.equal(r2.sets[0]!.phase, 'Ready');
  });

  test('content the runtime holds under another name is a name-only pull and is not estimated (its size is asked in the same request, for the set\'s total)', async () => {
    runtime.images.push({ id: `id-${D('b')}`, repoTags: [], repoDigests: [`mirror.local/org/db@${D('b')}`], size: 1, pinned: false, runtimeHandler: '' });
    // 18 GiB below the watermark: APP alone (8 GiB x2) fits, APP and DB (10 GiB x2) would not.
    usage = { size: 100 * GiB, available: (100 - 67) * GiB };
    const { agent: a } = await agent([APP, DB]);
    const r = await a.reconcile();
    assert.deepEqual(estimator.asked, [[APP, DB]], 'one request');
    assert.deepEqual(runtime.pulls.sort(), [APP, DB].sort(), 'DB is not in the estimate: the batch fits');
    assert.deepEqual(r.sets[0]!.bytes, { present: 10 * GiB, total: 10 * GiB }, "the set's total counts both, the shared layer once");
  });

  test('a set change is looked ahead while it settles: the sizes of what it may download are asked for before its reconcile, what is present is not', async () => {
    usage = { size: 100 * GiB, available: (100 - 50) * GiB };
    // A settle time no test waits out: only the look ahead runs after the change.
    const { agent: a, staticDir } = await agent([APP], 600_000);
    try {
      await a.reconcile();
      assert.deepEqual(runtime.pulls, [APP]);
      estimator.asked.length = 0;
      await writeFile(path.join(staticDir, 'db.yaml'), `apiVersion: pinset.dev/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: db}\nspec:\n  pinnedImages:\n  - name: ${APP}\n  - name: ${DB}\n`);
      a.trigger('static folder changed', true);
      for (let i = 0; i < 200 && estimator.asked.length === 0; i++) await new Promise((r) => setTimeout(r, 5));
      assert.deepEqual(estimator.asked, [[DB]], 'DB asked for ahead; APP is present');
      assert.deepEqual(runtime.pulls, [APP], 'a look ahead pulls nothing');
      // The reconcile then decides from its own observation, as without the look ahead.
      const r = await a.reconcile();
      assert.deepEqual(runtime.pulls.sort(), [APP, DB].sort());
      assert.equal(r.sets.find((s) => s.name === 'db')!.phase, 'Ready');
    } finally {
      await a.stop();
    }
  });

  test('no look ahead for a change to nothing that may download, nor for a trigger that is not a change of the sets', async () => {
    usage = { size: 100 * GiB, available: (100 - 50) * GiB };
    const { agent: a, staticDir } = await agent([APP, DB], 600_000);
    // Long enough for a look ahead (a few ms here) on a slow machine.
    const settle = () => new Promise((r) => setTimeout(r, 300));
    const set = (name: string, ref: string) => `apiVersion: pinset.dev/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: ${name}}\nspec:\n  pinnedImages:\n  - name: ${ref}\n`;
    try {
      await a.reconcile();
      estimator.asked.length = 0;
      // The same image under a second set: nothing to download.
      await writeFile(path.join(staticDir, 'again.yaml'), set('again', DB));
      a.trigger('static folder changed', true);
      await settle();
      assert.deepEqual(estimator.asked, []);
      // A new image, but the trigger is a retry coming due, not a change of the sets.
      await writeFile(path.join(staticDir, 'tool.yaml'), set('tool', TOOL));
      a.trigger('a retry came due');
      await settle();
      assert.deepEqual(estimator.asked, []);
      // The change itself: looked ahead.
      a.trigger('static folder changed', true);
      for (let i = 0; i < 200 && estimator.asked.length === 0; i++) await new Promise((r) => setTimeout(r, 5));
      assert.deepEqual(estimator.asked, [[TOOL]]);
    } finally {
      await a.stop();
    }
  });
});
