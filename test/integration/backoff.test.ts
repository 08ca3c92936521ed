// Every failing step retries at a pace (capped exponential backoff with
// jitter, ~1 s doubling to ~1 min), logs once per change of state, and
// recovers promptly when the cause clears: the runtime down (its socket
// reappearing wakes the agent), CRI-O's reload failing, the pin file write
// failing (ENOSPC, EROFS, EACCES injected; a real full tmpfs where this
// machine allows mounting one). Counts are asserted over a window with
// generous bounds; timings are not.
//
// A read-only remount under a running agent is not a case: the agent holds
// its node lock open for writing beside crio.conf.d, on the same filesystem,
// and the kernel refuses to remount a filesystem read-only ("busy") while a
// file on it is open for writing.
import { afterEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { NodeSetStatus } from '../../src/api/types.ts';
import { CriImageRuntime } from '../../src/cri/client.ts';
import { PinFile } from '../../src/crio/pinfile.ts';
import { NoReloader } from '../../src/crio/reload.ts';
import { Agent } from '../../src/agent/agent.ts';
import { ImagePuller } from '../../src/agent/puller.ts';
import { LogStatusSink, StatusReporter } from '../../src/agent/status-reporter.ts';
import { makeNodeBed, NODE, setObject, type NodeBed } from '../support/node-bed.ts';
import { captureLogs } from '../support/log-capture.ts';
import { startFakeCrio } from '../support/fake-crio.ts';
import { AgentProcess, readPinFile, type LogLine } from '../support/agent-process.ts';
import { crioChoice } from '../support/crio-choice.ts';

const A1 = `registry.test/team/app@sha256:${'a'.repeat(64)}`;
const A2 = `registry.test/team/db@sha256:${'b'.repeat(64)}`;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const set = setObject;
let bed: NodeBed | undefined;

/** Resyncs far apart, so every retry seen is the backoff's; debug logs, so every attempt is seen. */
const makeBed = () => makeNodeBed({ catalogue: { [A1]: { size: 100 }, [A2]: { size: 100 } }, resyncInterval: '10m' });
const startAgent = (b: NodeBed, dropInDir?: string) => b.start(['--log-level', 'debug'], { dropInDir });

afterEach(async () => {
  if (!bed) return;
  const code = await bed.agent?.stop();
  if (bed.agent) assert.equal(code, 0, 'agent exits 0 on SIGTERM');
  await bed.stop();
  bed = undefined;
});

const ready = (s: NodeSetStatus) => s.phase === 'Ready';
const count = (lines: LogLine[], msg: string) => lines.filter((l) => l.msg === msg).length;

describe('every failing step is paced and recovers promptly', () => {
  test('the runtime down: a handful of reconciles, not ~20 a second; one error line; its socket reappearing brings it back', async () => {
    bed = await makeBed();
    bed.api.create(set('a', [A1]));
    const agent = startAgent(bed);
    await bed.waitForSet('a', ready, 'Ready');
    await sleep(500);
    const mark = agent.mark();
    bed.node.crio.stopServing();
    bed.api.create(set('b', [A2])); // a change while it is down: pinned, not pulled
    await bed.waitForSet('b', (s) => s.reason === 'RuntimeUnavailable', 'RuntimeUnavailable');
    await sleep(10_000);
    const window = agent.logs().slice(mark);
    const reconciles = count(window, 'reconcile finished');
    // Backoff ~1, 2, 4, 8 s (each 50-100% of that): about 4-6 reconciles in 10 s, plus the set change. Unpaced it was ~200.
    assert.ok(reconciles <= 10, `${reconciles} reconciles in ~10 s of outage`);
    assert.equal(count(window, 'reaching the container runtime failed; retrying with backoff'), 1, 'the outage is logged once');
    const retry = window.find((l) => l.msg === 'reaching the container runtime failed; retrying with backoff')!;
    assert.equal(typeof retry.retryInMs, 'number', 'with the next attempt');
    assert.ok(String(retry.err).length > 0, 'and the error');

    const resumed = agent.mark();
    await bed.node.crio.resume();
    await bed.waitForSet('b', ready, 'Ready after the runtime is back');
    const after = agent.logs().slice(resumed);
    assert.ok(after.some((l) => l.msg === 'reconcile requested' && l.reason === 'the runtime socket appeared'), 'woken by the socket, not by the backoff timer');
    assert.equal(count(after, 'reaching the container runtime works again'), 1);
  });

  test("CRI-O's reload failing: retried at its backoff, logged once, then converges", async () => {
    bed = await makeBed();
    bed.node.systemd.failNextReloads(1000);
    bed.api.create(set('a', [A1]));
    const agent = startAgent(bed);
    await bed.waitForSet('a', (s) => s.reason === 'ReloadFailed', 'ReloadFailed');
    const before = bed.node.systemd.reloads.length;
    const mark = agent.mark();
    await sleep(8000);
    const attempts = bed.node.systemd.reloads.length - before;
    assert.ok(attempts >= 1 && attempts <= 6, `${attempts} reload attempts in 8 s`);
    assert.equal(count(agent.logs().slice(mark), 'reloading CRI-O failed; retrying with backoff'), 0, 'the same failure is not logged again');
    bed.node.systemd.failNextReloads(0);
    await bed.waitForSet('a', ready, 'Ready once reloads work', 90_000);
    assert.equal(bed.node.crio.image(A1)?.pinned, true);
  });
});

/** An in-process agent whose pin file writes fail with `errno` until `failing.code` is cleared. */
describe('the pin file write failing (injected ENOSPC, EROFS, EACCES)', () => {
  test('attempts at the backoff pace, each change of error logged once, written once a write works', async () => {
    const root = await mkdtemp(join(tmpdir(), 'pinset-write-fail-'));
    const dropIn = join(root, 'crio.conf.d');
    await mkdir(dropIn);
    const staticDir = join(root, 'sets.d');
    await mkdir(staticDir);
    await writeFile(join(staticDir, 'a.yaml'), JSON.stringify(set('a', [A1])));
    const crio = await startFakeCrio({ dropInDir: dropIn, catalogue: { [A1]: { size: 100 } } });
    const { logger, lines } = captureLogs('debug');
    const runtime = new CriImageRuntime(crio.endpoint);
    const pinFile = await PinFile.open(dropIn);
    const failing: { code: string | undefined } = { code: 'ENOSPC' };
    let attempts = 0;
    const realWrite = pinFile.write.bind(pinFile);
    pinFile.write = async (content: string) => {
      attempts++;
      if (failing.code) throw Object.assign(new Error(`${failing.code}: injected failure, write '${pinFile.path}'`), { code: failing.code });
      return realWrite(content);
    };
    // The production pace scaled down five times, so the test sees several attempts in seconds.
    const retryPolicy = { baseMs: 200, capMs: 2_000 };
    const pins = crioChoice({ pinFile, reloader: new NoReloader(), runtime, logger, retryPolicy });
    const agent = new Agent({
      nodeName: NODE,
      runtime,
      pins,
      puller: new ImagePuller({ runtime, maxParallel: 2, logger }),
      reporter: new StatusReporter(new LogStatusSink(logger), { logger }),
      logger,
      staticDir,
      resyncIntervalMs: 600_000,
      debounceMs: 50,
      retryPolicy,
    });
    const logged = () => lines.filter((l) => l.msg === 'writing the pin file failed; retrying with backoff');
    const until = async (what: string, ok: () => boolean | Promise<boolean>) => {
      const deadline = Date.now() + 20_000;
      while (!(await ok())) {
        assert.ok(Date.now() < deadline, `waited 20 s for ${what}`);
        await sleep(50);
      }
    };
    try {
      agent.start();
      await sleep(3000);
      // 200 ms doubling to 2 s (each delay 50-100% of that): 4-8 attempts in 3 s; unpaced it would be one per reconcile.
      assert.ok(attempts >= 2 && attempts <= 9, `${attempts} write attempts in 3 s`);
      assert.equal(logged().length, 1, 'the same error is logged once');
      assert.match(String(logged()[0]!.err), /ENOSPC/);
      assert.equal(typeof logged()[0]!.retryInMs, 'number', 'with the next attempt');
      failing.code = 'EROFS';
      await until('the EROFS line', () => logged().length === 2);
      assert.match(String(logged()[1]!.err), /EROFS/);
      failing.code = 'EACCES';
      await until('the EACCES line', () => logged().length === 3);
      assert.match(String(logged()[2]!.err), /EACCES/);
      const mark = attempts;
      await sleep(4000);
      assert.ok(attempts - mark <= 4, `${attempts - mark} attempts in 4 s at the 2 s cap`);
      failing.code = undefined;
      await until('the pin file', async () => (await readdir(dropIn)).some((f) => f.startsWith('99-pinset-')));
      // The file is in the folder once renamed; the write returns (and says so) after the folder's fsync.
      await until('the recovery line', () => lines.some((l) => l.msg === 'writing the pin file works again'));
      assert.equal(logged().length, 3, 'nothing more logged');
    } finally {
      await agent.stop();
      pins.close();
      runtime.close();
      await crio.stop();
      await rm(root, { recursive: true, force: true });
    }
  });
});

/** A real tmpfs at the drop-in folder: needs root and a kernel that lets this process mount. */
function canMountTmpfs(dir: string): string | null {
  if (process.getuid?.() !== 0) return 'needs root to mount a tmpfs';
  try {
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', dir], { stdio: 'pipe' });
    return null;
  } catch (e) {
    return `cannot mount a tmpfs here: ${String((e as { stderr?: Buffer }).stderr ?? e).trim()}`;
  }
}

describe('the pin file write failing on a real full filesystem', () => {
  test('a full tmpfs (ENOSPC), then space freed: written before the backoff is due', async (t) => {
    bed = await makeBed();
    const mnt = join(bed.dir, 'mnt');
    await mkdir(mnt);
    const why = canMountTmpfs(mnt);
    if (why) {
      t.skip(why);
      return;
    }
    try {
      await fullThenFreed(bed, mnt);
    } finally {
      await bed.agent?.stop();
      execFileSync('umount', ['-l', mnt], { stdio: 'ignore' });
    }
  });
});

/**
 * Waits until the write's next attempt is at least 8 s away, makes it
 * possible, and checks that the agent wrote before that attempt was due:
 * woken by its folder check, not by the backoff.
 */
async function unblockBeforeTheBackoff(agent: AgentProcess, unblock: () => Promise<void> | void, written: () => Promise<boolean>): Promise<void> {
  const failure = await agent.waitForLog(
    (l) => (l.msg === 'writing the pin file failed; retrying with backoff' || l.msg === 'writing the pin file failed again') && Number(l.retryInMs) >= 8000,
    120_000,
    'a write failure with the next attempt 8 s away',
    agent.mark(),
  );
  const dueAt = Date.parse(String(failure.time)) + Number(failure.retryInMs);
  await unblock();
  while (!(await written())) {
    assert.ok(Date.now() < dueAt, `not written before the backoff's next attempt was due: the folder check did not wake the agent\n${agent.logs().slice(-8).map((l) => JSON.stringify(l)).join('\n')}`);
    await sleep(100);
  }
  assert.ok(agent.logs().some((l) => l.msg === 'the drop-in folder looks writable again; retrying the pin file now'));
}

async function fullThenFreed(bed: NodeBed, mnt: string): Promise<void> {
  const dropIn = join(mnt, 'crio.conf.d');
  await mkdir(dropIn);
  // The CRI-O stand-in reads this folder: point it there.
  (bed.node.crio as { dropInDir: string }).dropInDir = dropIn;
  // The agent starts on a healthy folder (it takes its node lock and stages its writes beside it)...
  bed.api.create(set('a', [A1]));
  const agent = startAgent(bed, dropIn);
  await bed.waitForSet('a', ready, 'Ready');
  // ...then the filesystem fills up, and a change cannot be written.
  const filler = join(mnt, 'filler');
  try {
    execFileSync('dd', ['if=/dev/zero', `of=${filler}`, 'bs=4k', 'count=1000'], { stdio: 'ignore' });
  } catch {
    // dd stops at ENOSPC: the point
  }
  bed.api.create(set('b', [A2]));
  await bed.waitForSet('b', (s) => s.reason === 'PinFileWriteFailed', 'PinFileWriteFailed (ENOSPC)');
  assert.match(bed.setStatus('b')?.message ?? '', /ENOSPC|no space/);
  assert.equal(bed.setStatus('a')?.phase, 'Ready', 'the pins in place stay');
  const pins = async () => (await readPinFile(dropIn))?.pins ?? [];
  await unblockBeforeTheBackoff(agent, () => rm(filler), async () => (await pins()).includes(A2));
  await bed.waitForSet('b', ready, 'Ready after space was freed', 30_000);
}
