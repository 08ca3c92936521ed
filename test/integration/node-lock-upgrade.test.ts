// One writer per node across an upgrade. Agents before this version took a
// CRI-O node's lock beside its drop-in (<parent of crio.conf.d>/.pinset/)
// and any other node's in --state-dir; this version takes --state-dir's on
// every node, whatever it found, and the earlier one too where CRI-O's
// configuration folder is (src/agent/boot/node-lock-place.ts). Here the
// earlier version is the real one: the bundle of commit 8239125, built from
// git into a temporary folder (as test/integration/bundle.test.ts builds
// bundles outside the repository), runs beside this version's agent on the
// CRI-O stand-in and on the containerd twin. Each time: the agent that
// holds the node writes, the other waits writing nothing (sampled all
// along), and takes over once the holder exits. And two agents of this
// version, one that found no runtime and one that found CRI-O, take the
// same lock.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdir, mkdtemp, realpath, rm, stat, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { promisify } from 'node:util';
import { AgentProcess, eventually, readPinFile, type LogLine } from '../support/agent-process.ts';
import { requireComponents } from '../support/components.ts';
import { startCrioNode } from '../support/crio-node.ts';
import { startFakeContainerd } from '../support/fake-containerd.ts';

const run = promisify(execFile);
const REPO = path.resolve(import.meta.dirname, '..', '..');
/** The last commit whose agents placed the node lock by the runtime they found. */
const EARLIER = '8239125';

const hex = (c: string) => c.repeat(64);
const FIRST = `registry.test/first/app@sha256:${hex('a')}`;
const SECOND = `registry.test/second/app@sha256:${hex('b')}`;
const WAITING = 'another pinset agent holds the node lock; waiting for it to exit before writing anything';
const HELD = 'node lock held: this agent writes the pins of this node';
/** What only an agent that holds the node logs: a pin written, a reconcile done. */
const WRITES = new Set(['pin file written', 'containerd image labels updated', 'reconcile finished']);

let dir: string;
let earlierCli: string;

before(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'pinset-lock-upgrade-'));
  const tree = path.join(dir, EARLIER);
  await mkdir(tree);
  // The commit's own tree and its own build script; the dependencies are the ones installed here.
  await run('git', ['-C', REPO, 'cat-file', '-e', `${EARLIER}^{commit}`]).catch(() => {
    throw new Error(`commit ${EARLIER} is not in ${REPO}'s history: the upgrade from it cannot be tried (a shallow clone? fetch the history)`);
  });
  await run('sh', ['-c', `git -C "$1" archive --format=tar "$2" | tar -x -C "$3"`, 'sh', REPO, EARLIER, tree]);
  await symlink(await realpath(path.join(REPO, 'node_modules')), path.join(tree, 'node_modules'));
  const { build } = (await import(pathToFileURL(path.join(tree, 'scripts', 'build.ts')).href)) as { build(o: { outdir: string }): Promise<unknown> };
  await build({ outdir: path.join(dir, 'dist') });
  earlierCli = path.join(dir, 'dist', 'pinset.mjs');
});
after(async () => {
  await rm(dir, { recursive: true, force: true });
});

async function sets(name: string, images: string[]): Promise<string> {
  const d = path.join(dir, `${name}-${Math.random().toString(36).slice(2)}`);
  await mkdir(d);
  await writeFile(path.join(d, 'set.yaml'), JSON.stringify({ apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name }, spec: { pinnedImages: images.map((n) => ({ name: n })) } }));
  return d;
}

/** Samples `read` every 20 ms until stopped: what the node's pins were, and when. */
function sample<T>(read: () => Promise<T> | T): { stop(): Promise<{ at: number; value: T }[]> } {
  const out: { at: number; value: T }[] = [];
  let running = true;
  const loop = (async () => {
    while (running) {
      out.push({ at: Date.now(), value: await read() });
      await new Promise((r) => setTimeout(r, 20));
    }
  })();
  return {
    stop: async () => {
      running = false;
      await loop;
      return out;
    },
  };
}

/** The lines a waiting agent must not have: anything only a writer logs. */
const writes = (a: AgentProcess) => a.logs().filter((l) => WRITES.has(String(l.msg)));

/** `waiter` waits for `holder`, names it, and writes nothing through two of the holder's reconciles; returns its wait line. */
async function waitsWritingNothing(waiter: AgentProcess, holder: AgentProcess): Promise<LogLine> {
  const waiting = await waiter.waitForLog((l) => l.msg === WAITING, 30_000, 'the wait for the node lock');
  assert.equal((waiting.holder as { pid: number } | null)?.pid, holder.child.pid, 'it names the holder');
  await holder.waitForReconcile(holder.mark(), 30_000);
  await holder.waitForReconcile(holder.mark(), 30_000);
  assert.deepEqual(writes(waiter), [], 'the waiting agent neither writes nor reconciles');
  return waiting;
}

describe('the node lock across an upgrade from the version that placed it by runtime', () => {
  test('CRI-O: the earlier agent holds the node; this one waits on its lock beside the drop-in, writing nothing, and takes over when it exits; an earlier one started then waits for this one', async (t) => {
    if (!requireComponents(t, ['dbus-daemon'])) return;
    const node = await startCrioNode({ catalogue: { [FIRST]: { size: 1000 }, [SECOND]: { size: 1000 } } });
    t.after(() => node.stop());
    const args = (staticDir: string) => [
      '--node-name', 'node-1', '--static-dir', staticDir, '--cri-endpoint', node.endpoint, '--crio-dropin-dir', node.dropInDir,
      '--state-dir', node.stateDir, '--reload', 'dbus', '--auth-file', path.join(dir, 'none.json'), '--metrics-addr', '', '--resync-interval', '2s',
    ];
    const earlier = AgentProcess.start(args(await sets('first', [FIRST])), { cli: earlierCli, env: node.env });
    t.after(() => earlier.stop());
    const earlierHeld = await earlier.waitForLog((l) => l.msg === HELD, 30_000, 'the earlier agent holding the node');
    const beside = path.join(path.dirname(node.dropInDir), '.pinset', 'agent.lock');
    assert.equal(earlierHeld.lock, beside, 'the earlier version locks beside the drop-in on CRI-O');
    await eventually(() => node.crio.image(FIRST)?.pinned, 30_000, () => 'the earlier agent pinning FIRST');
    const pins = sample(async () => JSON.stringify((await readPinFile(node.dropInDir))?.pins ?? null));
    t.after(() => pins.stop());
    const file = (await readPinFile(node.dropInDir))!.file;
    const before = await stat(file);

    const current = AgentProcess.start(args(await sets('second', [SECOND])), { env: node.env });
    t.after(() => current.stop());
    const waiting = await waitsWritingNothing(current, earlier);
    assert.equal(waiting.lock, beside, 'having taken its own lock in --state-dir, it waits on the earlier one');
    assert.equal((await stat(file)).mtimeMs, before.mtimeMs, 'the pin file is the earlier agent’s alone');
    assert.equal(node.crio.image(SECOND)?.pinned ?? false, false);

    assert.equal(await earlier.stop(), 0);
    const exitedAt = Date.now();
    const took = await current.waitForLog((l) => l.msg === HELD, 30_000, 'the takeover');
    assert.deepEqual([took.tookOver, took.lock], [true, path.join(node.stateDir, 'agent.lock')]);
    await eventually(() => node.crio.image(SECOND)?.pinned && !node.crio.image(FIRST)?.pinned, 30_000, () => 'this agent pinning SECOND alone');
    const seen = await pins.stop();
    const firstSecond = seen.find((s) => s.value === JSON.stringify([SECOND]));
    assert.ok(firstSecond && firstSecond.at >= exitedAt - 50, 'the new pins appear only once the earlier agent has exited');
    assert.deepEqual([...new Set(seen.map((s) => s.value))], [JSON.stringify([FIRST]), JSON.stringify([SECOND])], 'one writer, then the other: never back, never both');

    // A rollback: an earlier agent started now waits for this one.
    const again = AgentProcess.start(args(await sets('first-again', [FIRST])), { cli: earlierCli, env: node.env });
    t.after(() => again.stop());
    const back = await waitsWritingNothing(again, current);
    assert.equal(back.lock, beside);
    assert.deepEqual((await readPinFile(node.dropInDir))?.pins, [SECOND]);
    assert.equal(await again.stop(), 0);
    assert.equal(await current.stop(), 0);
  });

  test('containerd: both versions take the lock in --state-dir; this one waits for the earlier one, writing no label, and takes over when it exits', async (t) => {
    const c = await startFakeContainerd({ version: '1.7.24', catalogue: { [FIRST]: { size: 10 }, [SECOND]: { size: 10 } } });
    t.after(() => c.stop());
    const state = path.join(dir, 'ctrd-state');
    const args = (staticDir: string) => [
      '--node-name', 'node-2', '--static-dir', staticDir, '--cri-endpoint', c.endpoint, '--crio-dropin-dir', path.join(dir, 'no-crio', 'crio.conf.d'),
      '--state-dir', state, '--auth-file', path.join(dir, 'none.json'), '--metrics-addr', '', '--resync-interval', '2s',
    ];
    const earlier = AgentProcess.start(args(await sets('first', [FIRST])), { cli: earlierCli });
    t.after(() => earlier.stop());
    const earlierHeld = await earlier.waitForLog((l) => l.msg === HELD, 30_000, 'the earlier agent holding the node');
    assert.equal(earlierHeld.lock, path.join(state, 'agent.lock'));
    await eventually(() => c.criPinned(FIRST), 30_000, () => 'the earlier agent pinning FIRST');
    const pinned = sample(() => [c.criPinned(FIRST) === true, c.criPinned(SECOND) === true]);
    t.after(() => pinned.stop());

    const current = AgentProcess.start(args(await sets('second', [SECOND])));
    t.after(() => current.stop());
    const waiting = await waitsWritingNothing(current, earlier);
    assert.equal(waiting.lock, path.join(state, 'agent.lock'), 'the same lock');
    assert.notEqual(c.criPinned(SECOND), true, 'no pin of the waiting agent (it pulls nothing either)');

    assert.equal(await earlier.stop(), 0);
    const exitedAt = Date.now();
    assert.equal((await current.waitForLog((l) => l.msg === HELD, 30_000, 'the takeover')).tookOver, true);
    await eventually(() => c.criPinned(SECOND) && !c.criPinned(FIRST), 30_000, () => 'this agent pinning SECOND alone');
    const seen = await pinned.stop();
    assert.ok(seen.every((s) => !s.value[1] || s.at >= exitedAt - 50), 'SECOND is pinned only once the earlier agent has exited');
    const unpinned = seen.findIndex((s) => !s.value[0]);
    assert.ok(unpinned >= 0 && seen.slice(unpinned).every((s) => !s.value[0]), 'FIRST, once unpinned, stays unpinned: no earlier writer comes back');
    assert.equal(await current.stop(), 0);
  });

  test('this version: an agent that found no runtime holds the same lock as one that finds CRI-O, which waits for it', async (t) => {
    if (!requireComponents(t, ['dbus-daemon'])) return;
    const node = await startCrioNode({ catalogue: { [SECOND]: { size: 1000 } } });
    t.after(() => node.stop());
    const emptyRoot = path.join(dir, 'no-runtime-root');
    await mkdir(emptyRoot, { recursive: true });
    const common = ['--node-name', 'node-3', '--crio-dropin-dir', node.dropInDir, '--state-dir', node.stateDir, '--auth-file', path.join(dir, 'none.json'), '--metrics-addr', '', '--resync-interval', '2s'];
    // Looking under a host root with no runtime's socket: it finds none.
    const lost = AgentProcess.start([...common, '--static-dir', await sets('first', [FIRST]), '--host-root', emptyRoot], { env: node.env });
    t.after(() => lost.stop());
    await lost.waitForLog((l) => String(l.msg).startsWith('no container runtime settled on'), 30_000, 'no runtime found');
    const held = await lost.waitForLog((l) => l.msg === HELD, 30_000, 'the node lock held');

    const found = AgentProcess.start([...common, '--static-dir', await sets('second', [SECOND]), '--cri-endpoint', node.endpoint, '--reload', 'dbus'], { env: node.env });
    t.after(() => found.stop());
    assert.equal(((await found.waitForLog((l) => l.msg === 'node runtime from flags')).runtime as { name?: string }).name, 'cri-o');
    const waiting = await found.waitForLog((l) => l.msg === WAITING, 30_000, 'the wait');
    assert.equal(waiting.lock, held.lock, 'one lock, whatever each found');
    assert.equal((waiting.holder as { pid: number }).pid, lost.child.pid);
    await lost.waitForReconcile(lost.mark(), 30_000);
    assert.deepEqual(writes(found), []);
    assert.equal(await readPinFile(node.dropInDir), null, 'nothing pinned while it waits');

    assert.equal(await lost.stop(), 0);
    assert.equal((await found.waitForLog((l) => l.msg === HELD, 30_000, 'the takeover')).tookOver, true);
    await eventually(() => node.crio.image(SECOND)?.pinned, 30_000, () => 'SECOND pinned');
    assert.equal(await found.stop(), 0);
  });
});
