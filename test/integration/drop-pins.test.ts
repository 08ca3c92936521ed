// `pinset agent --drop-pins` (src/agent/drop-pins/drop-pins.ts) on a node whose agent
// is gone, as a user runs it: its own process, flags on the command line.
// On the CRI-O stand-in (reloaded over a private D-Bus), the agent's drop-in
// goes and CRI-O reports its images unpinned, while an administrator's
// drop-in and the images it pins stay; on the containerd twin, pinset's
// labels go and a hand pin stays. With an agent running, it waits for the
// node lock and gives up, changing nothing. (Real containerd 1.7.24:
// test/e2e/drop-pins.test.ts.)
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { OWN_LABEL, PIN_LABEL } from '../../src/containerd/label-pins.ts';
import { startCrioNode, type CrioNode } from '../support/crio-node.ts';
import { startFakeContainerd, type FakeContainerd } from '../support/fake-containerd.ts';
import { AgentProcess, readPinFile, runAgentOnce, runPinset } from '../support/agent-process.ts';

const hex = () => randomBytes(32).toString('hex');
const A = `registry.test/team-a/web@sha256:${hex()}`;
const B = `registry.test/team-b/api@sha256:${hex()}`;
const ADMIN = `quay.io/admin/tool@sha256:${hex()}`;

const staticSet = (images: string[]) =>
  `apiVersion: pinset.dev/v1alpha1\nkind: PinnedImageSet\nmetadata: {name: local}\nspec:\n  pinnedImages:\n${images.map((i) => `  - name: ${i}\n`).join('')}`;

let dir: string;
before(async () => {
  dir = await mkdtemp(join(tmpdir(), 'pinset-drop-pins-'));
});
after(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('pinset agent --drop-pins on CRI-O (the stand-in)', () => {
  let node: CrioNode;
  let sets: string;
  const crioArgs = () => ['--cri-endpoint', node.endpoint, '--crio-dropin-dir', node.dropInDir, '--state-dir', node.stateDir, '--reload', 'dbus'];
  before(async () => {
    node = await startCrioNode({ catalogue: { [A]: { size: 1000 }, [B]: { size: 1000 }, [ADMIN]: { size: 1000 } } });
    sets = join(dir, 'crio-sets.d');
    await mkdir(sets);
  });
  after(async () => {
    await node.stop();
  });

  test("the agent's drop-in removed, CRI-O reloaded, its images reported unpinned; the administrator's drop-in and its pins untouched", async () => {
    const admin = '[crio.image]\npinned_images = ["quay.io/admin/*"]\n';
    await writeFile(join(node.dropInDir, '10-admin.conf'), admin);
    node.crio.preload(ADMIN);
    await node.crio.reload();
    await writeFile(join(sets, 'local.yaml'), staticSet([A, B]));
    const once = await runAgentOnce(['--node-name', 'n1', '--static-dir', sets, '--auth-file', join(dir, 'none.json'), ...crioArgs()], { env: node.env });
    assert.equal(once.code, 0, once.stderr);
    assert.deepEqual((await readPinFile(node.dropInDir))?.pins, [A, B, 'quay.io/admin/*'].sort(), 'the agent carried the admin pin over');
    assert.equal(node.crio.image(A)?.pinned, true);
    await rm(join(sets, 'local.yaml')); // the static set must not matter: --drop-pins removes every pin of pinset's

    const r = await runPinset(['agent', '--drop-pins', ...crioArgs()], { env: node.env });
    assert.equal(r.code, 0, `${r.stdout}\n${r.stderr}`);
    assert.equal(await readPinFile(node.dropInDir), null, 'the drop-in is gone');
    assert.equal(await readFile(join(node.dropInDir, '10-admin.conf'), 'utf8'), admin, "the administrator's drop-in is untouched");
    assert.equal(node.crio.image(A)?.pinned, false, 'CRI-O reports it unpinned');
    assert.equal(node.crio.image(B)?.pinned, false);
    assert.equal(node.crio.image(ADMIN)?.pinned, true, "still pinned by the administrator's file");
    assert.match(r.stdout, /^removed .*99-pinset-[0-9a-f-]+\.conf \(3 pin\(s\)\); CRI-O reloaded \(dbus\)$/m);
    assert.match(r.stdout, /^confirmed through CRI: 2 image\(s\) no longer pinned, 1 still pinned by a pin that is not pinset's \(kept\)$/m);
    assert.match(r.stdout, /quay\.io\/admin\/tool@sha256:[0-9a-f]{64}: still pinned by 10-admin\.conf \(pinned_images "quay\.io\/admin\/\*"\)/);

    const again = await runPinset(['agent', '--drop-pins', ...crioArgs()], { env: node.env });
    assert.equal(again.code, 0, 'a second run has nothing to do, and says so');
    assert.match(again.stdout, /no pinset drop-in in .*: nothing to remove/);
  });

  test('with an agent running on the node: it waits for the node lock, gives up (exit 3) and changes nothing', async () => {
    await writeFile(join(sets, 'local.yaml'), staticSet([A]));
    const agent = AgentProcess.start(['--node-name', 'n1', '--static-dir', sets, '--auth-file', join(dir, 'none.json'), '--metrics-addr', '', ...crioArgs()], { env: node.env });
    try {
      await agent.waitForLog((l) => l.msg === 'reconcile finished' && (l.phases as Record<string, number>)?.Ready === 1, 20_000, 'the agent Ready');
      const r = await runPinset(['agent', '--drop-pins', '--lock-timeout', '1s', ...crioArgs()], { env: node.env });
      assert.equal(r.code, 3, `${r.stdout}\n${r.stderr}`);
      assert.match(r.stdout, /a pinset agent is running on this node .*nothing was changed/);
      assert.deepEqual((await readPinFile(node.dropInDir))?.pins, [A, 'quay.io/admin/*'].sort());
      assert.equal(node.crio.image(A)?.pinned, true);
    } finally {
      assert.equal(await agent.stop(), 0);
    }
  });
});

describe('pinset agent --drop-pins on containerd (the twin)', () => {
  let c: FakeContainerd;
  before(async () => {
    c = await startFakeContainerd({ version: '1.7.24', catalogue: { [A]: { size: 10 }, [B]: { size: 10 } } });
  });
  after(async () => {
    assert.deepEqual(c.updatesWithoutTarget, []);
    await c.stop();
  });

  test("pinset's labels removed and CRI reports the image unpinned; an image pinned by hand stays pinned, its label untouched", async () => {
    const sets = join(dir, 'ctrd-sets.d');
    const state = join(dir, 'ctrd-state');
    await mkdir(sets);
    await mkdir(state);
    await writeFile(join(sets, 'local.yaml'), staticSet([A, B]));
    const args = ['--cri-endpoint', c.endpoint, '--pin-backend', 'containerd', '--state-dir', state];
    const once = await runAgentOnce(['--node-name', 'n2', '--static-dir', sets, '--auth-file', join(dir, 'none.json'), ...args]);
    assert.equal(once.code, 0, once.stderr);
    // An administrator pins B by hand too, on its reference's record.
    c.label(B, { [PIN_LABEL]: 'pinned' });
    const own = () => c.recordNames().filter((n) => OWN_LABEL in c.record(n)!.labels);
    assert.equal(own().length, 2);

    const r = await runPinset(['agent', '--drop-pins', ...args]);
    assert.equal(r.code, 0, `${r.stdout}\n${r.stderr}`);
    assert.deepEqual(own(), [], "no record carries pinset's label");
    assert.equal(c.criPinned(A), false);
    assert.equal(c.criPinned(B), true, 'pinned by hand, it stays pinned');
    assert.equal(c.record(B)!.labels[PIN_LABEL], 'pinned', 'the hand pin is untouched');
    assert.match(r.stdout, /^removed pinset's labels \(pinset\.dev\/pinned, io\.cri-containerd\.pinned\) from 2 image record\(s\) in containerd$/m);
    assert.match(r.stdout, /^confirmed through CRI: 1 image\(s\) no longer pinned, 1 still pinned by a pin that is not pinset's \(kept\)$/m);
    assert.match(r.stdout, new RegExp(`still pinned by the label io\\.cri-containerd\\.pinned=pinned on ${B.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')} \\(not pinset's\\)`));
  });

  test("the agent's own command line, as it is, with --drop-pins added: the flags it does not use are accepted and ignored", async () => {
    const sets = join(dir, 'ctrd-sets-2.d');
    const state = join(dir, 'ctrd-state-2');
    await mkdir(sets);
    await mkdir(state);
    await writeFile(join(sets, 'local.yaml'), staticSet([A]));
    // What a DaemonSet or a systemd unit gives the agent, flags --drop-pins has no use for among them.
    const agentArgs = [
      '--node-name', 'n3', '--static-dir', sets, '--auth-file', join(dir, 'none.json'), '--cri-endpoint', c.endpoint, '--pin-backend=containerd', '--state-dir', state,
      '--metrics-addr', '', '--max-parallel-pulls', '2', '--image-fs-high-watermark=90', '--resync-interval', '10m', '--lease-namespace', 'pinset-system', '--once',
    ];
    const once = await runAgentOnce(agentArgs);
    assert.equal(once.code, 0, once.stderr);
    assert.equal(c.criPinned(A), true);

    const r = await runPinset(['agent', ...agentArgs, '--drop-pins']);
    assert.equal(r.code, 0, `the agent's flags are accepted: ${r.stdout}\n${r.stderr}`);
    assert.doesNotMatch(r.stderr, /unknown flag/);
    assert.equal(c.criPinned(A), false, "pinset's pin removed");
  });
});
