import { test } from 'node:test';
import assert from 'node:assert/strict';
import { DiskCheck, fsUsageOf } from '../../src/agent/disk.ts';
import type { ImageRuntime } from '../../src/cri/runtime.ts';

function runtimeWithFs(mountpoints: string[]): ImageRuntime {
  return {
    imageFsInfo: async () => mountpoints.map((m) => ({ mountpoint: m, usedBytes: 0 })),
  } as unknown as ImageRuntime;
}

test('pulls wait when the image filesystem is at or above the watermark', async () => {
  const usage = new Map([['/var/lib/containers', { mount: '/var/lib/containers', size: 100, used: 90 }]]);
  let now = 0;
  const check = new DiskCheck(runtimeWithFs(['/var/lib/containers/storage']), {
    highWatermarkPercent: 85,
    now: () => now,
    usageOf: async (p) => (p.startsWith('/var/lib/containers') ? usage.get('/var/lib/containers')! : null),
  });
  const problem = await check.problem();
  assert.match(problem ?? '', /\/var\/lib\/containers\/storage .* is 90\.0% full, at or above the 85% high watermark/);
  usage.set('/var/lib/containers', { mount: '/var/lib/containers', size: 100, used: 84 });
  now += 5_000;
  assert.match((await check.problem()) ?? '', /90\.0% full/, 'within 10 s the last answer stands');
  now += 5_000;
  assert.equal(await check.problem(), null, 'after 10 s the disk is asked again');
});

test('unknown usage, no filesystem reported, or a disabled watermark never block', async () => {
  assert.equal(await new DiskCheck(runtimeWithFs([]), { highWatermarkPercent: 85, usageOf: async () => ({ mount: '/', size: 1, used: 1 }) }).problem(), null);
  assert.equal(await new DiskCheck(runtimeWithFs(['/x']), { highWatermarkPercent: 85, usageOf: async () => null }).problem(), null);
  assert.equal(await new DiskCheck(runtimeWithFs(['/x']), { highWatermarkPercent: 0, usageOf: async () => ({ mount: '/', size: 1, used: 1 }) }).problem(), null);
  const failing = { imageFsInfo: async () => { throw new Error('down'); } } as unknown as ImageRuntime;
  assert.equal(await new DiskCheck(failing, { highWatermarkPercent: 85 }).problem(), null);
});

test('fsUsageOf picks the filesystem that holds the path (real systeminformation)', async () => {
  const u = await fsUsageOf('/tmp');
  assert.ok(u, 'the root filesystem at least is listed');
  assert.ok('/tmp'.startsWith(u.mount === '/' ? '/' : `${u.mount}`));
  assert.ok(u.size > 0 && u.used >= 0 && u.used <= u.size);
});
