// One writer per node: two agents on one drop-in folder, as the DaemonSet's
// pod and the systemd unit during a migration. Each has its own view (its
// own static folder), so two writers would rewrite the file back and forth.
// The second waits and says so (log, /readyz, metric, an Event on the Node,
// and no status annotation of its own), and takes over within seconds when
// the first is SIGKILLed. --once gives up after --lock-timeout. A name
// planted at the lock's place stops the agent at start, naming it.
import { afterEach, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { link, mkdir, readFile, rm, stat, symlink, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { readPinFile, runAgentOnce } from '../support/agent-process.ts';
import { makeNodeBed, NODE, setObject, type NodeBed } from '../support/node-bed.ts';

const hex = (c: string) => c.repeat(64);
const img = (repo: string, c: string) => `registry.test/${repo}@sha256:${hex(c)}`;
const FIRST = img('first/app', 'a');
const SECOND = img('second/app', 'b');
const CATALOGUE = Object.fromEntries([FIRST, SECOND].map((r) => [r, { size: 1000 }]));

let bed: NodeBed;
beforeEach(async () => {
  bed = await makeNodeBed({ catalogue: CATALOGUE });
});
afterEach(async () => {
  await bed.stop();
});

describe('the node lock', () => {
  test('a second agent waits and says why; only the first writes; SIGKILL the first and the second takes over within seconds', async (t) => {
    await writeFile(join(bed.staticDir, 'first.yaml'), JSON.stringify(setObject('from-first', [FIRST])));
    const secondDir = join(bed.dir, 'second-sets.d');
    await mkdir(secondDir);
    await writeFile(join(secondDir, 'second.yaml'), JSON.stringify(setObject('from-second', [SECOND])));

    const first = bed.start();
    await bed.waitForSet('from-first', (s) => s.phase === 'Ready', 'Ready (first agent)');
    const pinFile = (await readPinFile(bed.node.dropInDir))!;
    assert.deepEqual(pinFile.pins, [FIRST]);
    const before = await stat(pinFile.file);

    const second = bed.start(['--metrics-addr', '127.0.0.1:0'], { staticDir: secondDir });
    const waiting = await second.waitForLog((l) => l.msg === 'another pinset agent holds the node lock; waiting for it to exit before writing anything', 20_000, 'the wait');
    assert.equal((waiting.holder as { pid: number }).pid, first.child.pid, 'it names the holder');
    assert.equal(waiting.lock, join(bed.node.stateDir, 'agent.lock'), 'the node lock in --state-dir, whatever the runtime');
    const url = String((await second.waitForLog((l) => l.msg === 'health and metrics listening')).url);
    const readyz = await fetch(`${url}/readyz`);
    assert.equal(readyz.status, 503);
    assert.match(await readyz.text(), new RegExp(`waiting for the node lock .*pinset agent pid ${first.child.pid} on host`));
    assert.equal((await fetch(`${url}/healthz`)).status, 200, 'alive while it waits: no restart loop');
    assert.match(await (await fetch(`${url}/metrics`)).text(), /^pinset_node_lock_held 0$/m);
    await bed.api.waitFor(
      () => bed.api.list('events', { namespace: 'default' }).find((e) => (e as { reason?: string }).reason === 'WaitingForNodeLock'),
      10_000,
      'a WaitingForNodeLock Event on the Node',
    );
    const ev = bed.api.list('events', { namespace: 'default' }).find((e) => (e as { reason?: string }).reason === 'WaitingForNodeLock') as unknown as { involvedObject: { kind: string; name: string }; message: string };
    assert.deepEqual([ev.involvedObject.kind, ev.involvedObject.name], ['Node', NODE]);
    assert.match(ev.message, new RegExp(`pid ${first.child.pid}`));

    // Several resyncs (2 s) of both: only the first writes; the status is the first's alone.
    const mark = first.mark();
    await first.waitForReconcile(mark);
    await first.waitForReconcile(first.mark());
    const after = await stat(pinFile.file);
    assert.equal(after.ino, before.ino, 'the pin file was not replaced');
    assert.equal(after.mtimeMs, before.mtimeMs);
    assert.deepEqual((await readPinFile(bed.node.dropInDir))!.pins, [FIRST]);
    assert.equal(second.logs().filter((l) => l.msg === 'pin file written' || l.msg === 'reconcile finished').length, 0, 'the waiting agent neither writes nor reconciles');
    assert.equal(second.logs().filter((l) => l.msg === 'another pinset agent holds the node lock; waiting for it to exit before writing anything').length, 1, 'said once');
    assert.equal(bed.setStatus('from-second'), undefined, 'the waiting agent writes no node status');

    // The holder dies without a word: the kernel releases the lock, the waiter takes over.
    const killedAt = Date.now();
    first.child.kill('SIGKILL');
    await first.exited;
    const took = await second.waitForLog((l) => l.msg === 'node lock held: this agent writes the pins of this node', 20_000, 'the takeover');
    assert.equal(took.tookOver, true);
    const tookMs = Date.now() - killedAt;
    t.diagnostic(`took over ${tookMs} ms after the SIGKILL`);
    await bed.waitForSet('from-second', (s) => s.phase === 'Ready', 'Ready (second agent)');
    assert.deepEqual((await readPinFile(bed.node.dropInDir))!.pins, [SECOND], 'the same file, now the second agent’s view');
    assert.equal(bed.node.crio.image(SECOND)?.pinned, true);
    assert.equal((await fetch(`${url}/readyz`)).status, 200);
    assert.match(await (await fetch(`${url}/metrics`)).text(), /^pinset_node_lock_held 1$/m);
    // A blocking wait, not a poll: the takeover is a matter of the kernel waking flock.
    assert.ok(tookMs < 15_000, `took over ${tookMs} ms after the kill`);
  });

  test('--once while another agent holds the lock: waits --lock-timeout, then exits 3 saying who holds it, having written nothing', async () => {
    await writeFile(join(bed.staticDir, 'first.yaml'), JSON.stringify(setObject('from-first', [FIRST])));
    const holder = bed.start();
    await bed.waitForSet('from-first', (s) => s.phase === 'Ready', 'Ready');
    const before = await stat((await readPinFile(bed.node.dropInDir))!.file);
    const otherDir = join(bed.dir, 'other-sets.d');
    await mkdir(otherDir);
    await writeFile(join(otherDir, 'second.yaml'), JSON.stringify(setObject('from-second', [SECOND])));
    const started = Date.now();
    const r = await runAgentOnce(bed.args(['--lock-timeout', '2s'], { staticDir: otherDir, api: false }), { env: bed.node.env });
    assert.equal(r.code, 3, r.stderr);
    assert.ok(Date.now() - started >= 2_000, 'it waited');
    assert.equal(r.stdout, '');
    assert.match(r.stderr, new RegExp(`pinset agent pid ${holder.child.pid} on host .* held the node lock for all of --lock-timeout`));
    assert.equal((await stat((await readPinFile(bed.node.dropInDir))!.file)).mtimeMs, before.mtimeMs, 'nothing written');

    // Released in time: --once proceeds.
    const waiting = runAgentOnce(bed.args(['--lock-timeout', '30s'], { staticDir: otherDir, api: false }), { env: bed.node.env });
    await new Promise((res) => setTimeout(res, 1_000));
    assert.equal(await holder.stop(), 0);
    const done = await waiting;
    assert.equal(done.code, 0, done.stderr);
    assert.deepEqual(done.sets.map((s) => [s.name, s.phase]), [['from-second', 'Ready']]);
  });

  test('a name planted at the node lock, or where earlier versions kept it: the agent exits 2 naming it and what to do, writing nothing through it', async () => {
    await writeFile(join(bed.staticDir, 'first.yaml'), JSON.stringify(setObject('from-first', [FIRST])));
    const victim = join(bed.dir, 'shadow');
    await writeFile(victim, 'keep me\n');
    const lock = join(bed.node.stateDir, 'agent.lock');
    const earlier = join(dirname(bed.node.dropInDir), '.pinset', 'agent.lock');
    const esc = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
    const plants = [
      { planted: lock, plant: () => link(victim, lock), says: `cannot take the node lock: the node lock ${esc(lock)} has 2 hard links: another name shares it, which writing it would overwrite; remove ${esc(lock)}` },
      { planted: earlier, plant: () => symlink(victim, earlier), says: `cannot take the node lock: the node lock ${esc(earlier)} is a symbolic link: pinset writes only its own file there; remove the link` },
    ];
    for (const { planted, plant, says } of plants) {
      await mkdir(dirname(planted), { recursive: true });
      await plant();
      const r = await runAgentOnce(bed.args([], { api: false }), { env: bed.node.env });
      assert.equal(r.code, 2, r.stderr);
      assert.match(r.stderr, new RegExp(says));
      assert.equal(await readFile(victim, 'utf8'), 'keep me\n', 'the file the planted name points at is untouched');
      assert.equal(await readPinFile(bed.node.dropInDir), null, 'nothing pinned');
      await rm(planted);
    }
    // Removed, as the message says: the agent runs.
    const ok = await runAgentOnce(bed.args([], { api: false }), { env: bed.node.env });
    assert.equal(ok.code, 0, ok.stderr);
    assert.deepEqual((await readPinFile(bed.node.dropInDir))?.pins, [FIRST]);
    assert.equal(await readFile(victim, 'utf8'), 'keep me\n');
  });
});
