// Pins as CRI-O really applies them, scenario by scenario, against the CRI-O
// stand-in (which copies what a real CRI-O 1.32.13 was seen doing, and has
// tests of its own in fake-crio.test.ts), behind a private D-Bus whose
// systemd stand-in ends the reload job when the signal is sent, as CRI-O's
// unit does. The agent runs as its own process.
// - presence by the name CRI-O pins, name-only pulls that download nothing;
// - reloads confirmed by reading `pinned` back, on CRI-O's timing; a reload
//   CRI-O does not apply; a pin file CRI-O never loaded;
// - a folder CRI-O would refuse: named, no reload spent, fixed at once;
// - an image removed behind the agent's back comes back;
// - a starting CRI-O is never signalled.
import { afterEach, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir, rm, symlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { NodeSetStatus } from '../../src/api/types.ts';
import { CriClient } from '../support/containerd.ts';
import { readPinFile, runAgentOnce } from '../support/agent-process.ts';
import type { CatalogueImage } from '../support/fake-crio.ts';
import { makeNodeBed, setObject, type NodeBed } from '../support/node-bed.ts';

const hex = (c: string) => c.repeat(64);
const D = (c: string) => `sha256:${hex(c)}`;

// An image the kubelet pulled by tag; the set names it by digest.
const WEB_TAG = 'registry.test/team-a/web:v1';
const WEB = `registry.test/team-a/web@${D('1')}`;
// An index pulled by its index digest; the set names the platform manifest.
const MULTI_INDEX = `registry.test/base/multi@${D('2')}`;
const MULTI_PLATFORM = `registry.test/base/multi@${D('3')}`;
// And the reverse: the platform manifest pulled; the set names the index.
const REV_INDEX = `registry.test/base/rev@${D('4')}`;
const REV_PLATFORM = `registry.test/base/rev@${D('5')}`;
const A1 = `registry.test/team-b/api@${D('a')}`;
const A2 = `registry.test/team-b/db@${D('b')}`;

const CATALOGUE: Record<string, CatalogueImage> = {
  [WEB_TAG]: { size: 1000, digest: D('1') },
  [WEB]: { size: 1000 },
  [MULTI_INDEX]: { size: 2000, platformDigest: D('3') },
  [MULTI_PLATFORM]: { size: 2000 },
  [REV_INDEX]: { size: 3000, platformDigest: D('5') },
  [REV_PLATFORM]: { size: 3000 },
  [A1]: { size: 100 },
  [A2]: { size: 100 },
};

const set = setObject;
let bed: NodeBed;

/** Resyncs far apart, so what happens is the agent's own doing, not the resync's. */
const makeBed = (crioOpts: Omit<Parameters<typeof makeNodeBed>[0], 'catalogue'> = {}) => makeNodeBed({ catalogue: CATALOGUE, resyncInterval: '10m', ...crioOpts });

async function teardown(): Promise<void> {
  const code = await bed.agent?.stop();
  if (bed.agent) assert.equal(code, 0, 'agent exits 0 on SIGTERM');
  await bed.stop();
}

const ready = (s: NodeSetStatus) => s.phase === 'Ready';
const reloadsDone = () => bed.node.systemd.reloadCount('crio.service');

/** Static-folder-only flags for --once (no API). */
const onceArgs = (extra: string[] = []) => bed.args(extra, { api: false });

describe('presence by the name CRI-O pins', () => {
  beforeEach(async () => (bed = await makeBed()));
  afterEach(teardown);

  test('an image pulled by tag, wanted by digest: one name-only pull, nothing downloaded, Ready and pinned, one reload', async () => {
    bed.node.crio.preload(WEB_TAG); // as the kubelet pulled it
    bed.api.create(set('web', [WEB]));
    const agent = bed.start();
    const s = await bed.waitForSet('web', ready, 'Ready');
    assert.deepEqual(s.images, { wanted: 1, present: 1, pinned: 1, failed: 0, invalid: 0 });
    assert.equal(bed.node.crio.image(WEB)?.pinned, true, 'CRI-O pins it: the name was added');
    assert.deepEqual(bed.node.crio.storedNames(WEB), [WEB_TAG, WEB]);
    assert.equal(bed.node.crio.downloadCount(), 0, 'no layer downloaded');
    assert.equal(bed.node.crio.pullCount(WEB), 1);
    const pulled = agent.logs().filter((l) => l.msg === 'pulled image');
    assert.deepEqual(pulled.map((l) => [l.image, l.kind]), [[WEB, 'name']], 'logged as a name-only pull');
    assert.equal(reloadsDone(), 1, 'exactly one reload');
  });

  test('an index pulled by its index digest, wanted by a platform digest, and the reverse: Ready, pinned, nothing downloaded', async () => {
    bed.node.crio.preload(MULTI_INDEX);
    bed.node.crio.preload(REV_PLATFORM);
    bed.api.create(set('multi', [MULTI_PLATFORM]));
    bed.api.create(set('rev', [REV_INDEX]));
    bed.start();
    await bed.waitForSet('multi', ready, 'Ready');
    await bed.waitForSet('rev', ready, 'Ready');
    for (const r of [MULTI_PLATFORM, REV_INDEX]) assert.equal(bed.node.crio.image(r)?.pinned, true, `${r} pinned`);
    assert.deepEqual(bed.node.crio.storedNames(MULTI_PLATFORM), [MULTI_INDEX, MULTI_PLATFORM]);
    assert.deepEqual(bed.node.crio.storedNames(REV_INDEX), [REV_PLATFORM, REV_INDEX]);
    assert.equal(bed.node.crio.downloadCount(), 0, 'no layer downloaded');
    assert.equal(reloadsDone(), 1, 'exactly one reload');
  });

  test('an image already held under the set reference costs no pull at all', async () => {
    bed.node.crio.preload(A1);
    bed.api.create(set('a', [A1]));
    bed.start();
    await bed.waitForSet('a', ready, 'Ready');
    assert.equal(bed.node.crio.pullCount(), 0);
  });
});

describe('reloads confirmed by reading pinned back', () => {
  afterEach(teardown);

  test('--once exits 0 on CRI-O timing: the re-read 10-40 ms after the signal, one reload', async () => {
    bed = await makeBed();
    await writeFile(join(bed.staticDir, 'boot.yaml'), JSON.stringify(set('boot', [A1, A2])));
    const r = await runAgentOnce(onceArgs(), { env: bed.node.env });
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(r.sets.map((s) => [s.name, s.phase]), [['boot', 'Ready']]);
    assert.equal(reloadsDone(), 1);
    for (const ref of [A1, A2]) assert.equal(bed.node.crio.image(ref)?.pinned, true);
  });

  test('--once exits 0 on a slow CRI-O too (re-read 300-500 ms after the signal), and a removal is confirmed', async () => {
    bed = await makeBed({ reloadDelayMs: [300, 500] });
    await writeFile(join(bed.staticDir, 'boot.yaml'), JSON.stringify(set('boot', [A1, A2])));
    const first = await runAgentOnce(onceArgs(), { env: bed.node.env });
    assert.equal(first.code, 0, first.stderr);
    assert.equal(reloadsDone(), 1);
    // Removing A2: the agent knows A2 is a stored name (CRI-O reports it pinned by exactly that pin), so it waits for the unpin.
    await writeFile(join(bed.staticDir, 'boot.yaml'), JSON.stringify(set('boot', [A1])));
    const second = await runAgentOnce(onceArgs(), { env: bed.node.env });
    assert.equal(second.code, 0, second.stderr);
    assert.equal(reloadsDone(), 2);
    assert.equal(bed.node.crio.image(A2)?.pinned, false);
    const applied = second.stderr.split('\n').filter((l) => l.includes('"CRI-O reloaded and applied its pin list"'));
    assert.equal(applied.length, 1, second.stderr);
    assert.match(applied[0]!, /"confirmed":true/);
  });

  test('a pin file CRI-O never loaded (stopped between write and reload) is reloaded once and confirmed', async () => {
    bed = await makeBed();
    await writeFile(join(bed.staticDir, 'boot.yaml'), JSON.stringify(set('boot', [A1])));
    // --reload none: the file is written and the image pulled, CRI-O is not reloaded.
    const unloaded = await runAgentOnce(onceArgs(['--reload', 'none']), { env: bed.node.env });
    assert.equal(unloaded.code, 1, 'not pinned: CRI-O has not loaded the file');
    assert.equal(unloaded.sets[0]?.reason, 'WaitingForPin');
    assert.equal(bed.node.crio.image(A1)?.pinned, false);
    const downloads = bed.node.crio.downloadCount();

    const r = await runAgentOnce(onceArgs(), { env: bed.node.env });
    assert.equal(r.code, 0, r.stderr);
    assert.equal(reloadsDone(), 1, 'one reload');
    assert.equal(bed.node.crio.image(A1)?.pinned, true);
    assert.equal(bed.node.crio.downloadCount(), downloads, 'nothing downloaded again');
    assert.match(r.stderr, /has not loaded its files; reloading/);
  });

  test('a reload CRI-O does not apply: ReloadNotApplied with an Event, retried at a pace, then Ready', async () => {
    bed = await makeBed();
    bed.node.crio.refuseReloads();
    bed.api.create(set('a', [A1]));
    bed.start(['--reload-confirm-timeout', '300ms']);
    const s = await bed.waitForSet('a', (x) => x.reason === 'ReloadNotApplied', 'ReloadNotApplied');
    assert.equal(s.phase, 'Degraded');
    assert.match(s.message ?? '', /did not apply its pin list/);
    await bed.api.waitFor(() => bed.events('ReloadNotApplied').length > 0, 10_000, 'a ReloadNotApplied Event');
    // Over a window of 8 s the reload is retried at its backoff (about 1, 2, 4 s), not in a loop.
    const before = reloadsDone();
    await new Promise((r) => setTimeout(r, 8000));
    const during = reloadsDone() - before;
    assert.ok(during >= 1 && during <= 6, `${during} reloads in 8 s`);
    bed.node.crio.acceptReloads();
    await bed.waitForSet('a', ready, 'Ready once CRI-O applies reloads again', 90_000);
    assert.equal(bed.node.crio.image(A1)?.pinned, true);
  });

  test('a starting CRI-O is never signalled (a SIGHUP in its first moments kills it)', async () => {
    bed = await makeBed();
    bed.api.create(set('a', [A1]));
    const agent = bed.start();
    await bed.waitForSet('a', ready, 'Ready');
    bed.node.crio.stopServing();
    await agent.waitForLog((l) => l.msg === 'reaching the container runtime failed; retrying with backoff', 20_000, 'the outage noticed');
    // A slow start: CRI-O reads its files, then takes 1.5 s before it serves.
    bed.node.crio.startupMs = 1500;
    const starting = bed.node.crio.resume();
    bed.api.create(set('b', [A2])); // a change while it starts: the pin file is written, no reload may go out
    await starting;
    assert.equal(bed.node.crio.exitCode, undefined, 'CRI-O was not killed by a reload during its start');
    await bed.waitForSet('b', ready, 'Ready after CRI-O started', 30_000);
    assert.equal(bed.node.crio.image(A2)?.pinned, true);
  });
});

describe('a folder CRI-O would refuse', () => {
  beforeEach(async () => (bed = await makeBed()));
  afterEach(teardown);

  test('an unparsable drop-in: CrioConfigRejected naming it, an Event, no reload spent; fixed: reloaded at once', async () => {
    const broken = join(bed.node.dropInDir, '50-broken.conf');
    await writeFile(broken, '[crio.image\npinned_images = [');
    bed.api.create(set('a', [A1]));
    const agent = bed.start();
    const s = await bed.waitForSet('a', (x) => x.reason === 'CrioConfigRejected', 'CrioConfigRejected');
    assert.equal(s.phase, 'Degraded');
    assert.ok(s.message?.includes(broken), s.message);
    await bed.api.waitFor(() => bed.events('CrioConfigRejected').some((e) => e.message?.includes(broken)), 10_000, 'a CrioConfigRejected Event naming the file');
    assert.deepEqual((await readPinFile(bed.node.dropInDir))?.pins, [A1], 'the pin file is written all the same');
    assert.equal(reloadsDone(), 0, 'no reload while CRI-O would refuse it');
    assert.equal(agent.logs().filter((l) => l.msg?.startsWith('CRI-O would refuse its configuration')).length, 1, 'logged once');
    await rm(broken);
    // The resync is 10 minutes away: only the folder watch can bring this on.
    await bed.waitForSet('a', ready, 'Ready after the fix', 20_000);
    assert.equal(reloadsDone(), 1);
    assert.equal(bed.node.crio.image(A1)?.pinned, true);
  });

  test('a dangling link in a subfolder and a broken dotfile: both named; the pinned set stays Ready, the new one waits', async () => {
    bed.api.create(set('a', [A1]));
    bed.start();
    await bed.waitForSet('a', ready, 'Ready');
    await mkdir(join(bed.node.dropInDir, 'team'));
    const dangling = join(bed.node.dropInDir, 'team', '10-link.conf');
    const dotfile = join(bed.node.dropInDir, '.hidden');
    await symlink(join(bed.dir, 'nowhere.conf'), dangling);
    await writeFile(dotfile, '[crio.image]\npinned_images = "not a list"\n');
    bed.api.create(set('b', [A2]));
    const s = await bed.waitForSet('b', (x) => x.reason === 'CrioConfigRejected', 'CrioConfigRejected');
    assert.ok(s.message?.includes(dotfile) && s.message?.includes(dangling), s.message);
    assert.equal(bed.setStatus('a')?.phase, 'Ready', "the set whose pins CRI-O already holds is not affected");
    const reloads = reloadsDone();
    await rm(dotfile);
    await rm(dangling);
    await bed.waitForSet('b', ready, 'Ready after the fix', 20_000);
    assert.equal(reloadsDone(), reloads + 1);
  });
});

describe('an image removed behind the agent', () => {
  beforeEach(async () => (bed = await makeBed()));
  afterEach(teardown);

  test('RemoveImage of a pinned image: noticed by the presence check, named in a log line and an Event, pulled again', async () => {
    bed.api.create(set('a', [A1]));
    const agent = bed.start(['--presence-check-interval', '1s']);
    await bed.waitForSet('a', ready, 'Ready');
    const cri = new CriClient(bed.node.endpoint);
    try {
      await cri.removeImage(A1);
    } finally {
      cri.close();
    }
    const line = await agent.waitForLog((l) => l.msg === 'a pinned image was removed from the runtime; pulling it again', 20_000, 'the removal noticed');
    assert.equal(line.image, A1);
    await bed.api.waitFor(() => bed.events('ImageRemoved').some((e) => e.message?.includes(A1)), 10_000, 'an ImageRemoved Event');
    await bed.api.waitFor(() => bed.node.crio.image(A1)?.pinned === true, 20_000, 'pulled again and pinned');
    assert.equal(bed.node.crio.downloadCount(A1), 2);
  });
});
