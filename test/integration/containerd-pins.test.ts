// The containerd pin backend (src/containerd/label-pins.ts) against the
// containerd twin: pins are labels on image-ID records, set and removed
// through the agent's own clients, confirmed through CRI, and never removed
// on a fault. Every twin here also checks, when the suite ends, that no
// Update ever went out without a target.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, describe, test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { CriImageRuntime } from '../../src/cri/client.ts';
import { RuntimeView } from '../../src/cri/view.ts';
import { ContainerdImages } from '../../src/containerd/images.ts';
import { ContainerdLabelPins, OWN_LABEL, PIN_LABEL } from '../../src/containerd/label-pins.ts';
import type { RuntimeState } from '../../src/pins/backend.ts';
import { captureLogs } from '../support/log-capture.ts';
import { observedRuntime, pinTargets } from '../support/pin-runtime.ts';
import { startFakeContainerd, type FakeContainerd, type FakeContainerdOptions } from '../support/fake-containerd.ts';

const hex = () => randomBytes(32).toString('hex');
const MANAGED = { 'io.cri-containerd.image': 'managed' };
const OURS = { ...MANAGED, [PIN_LABEL]: 'pinned', [OWN_LABEL]: 'agent' };
const targets = pinTargets;
const signal = () => new AbortController().signal;


interface Bed {
  c: FakeContainerd;
  cri: CriImageRuntime;
  pins: ContainerdLabelPins;
  lines: Record<string, unknown>[];
  clock: { now: number };
  /** A fresh image in the catalogue: tag and digest references, and its ID record's name. */
  image(): { tag: string; digestRef: string; id: string };
  /** stage(refs) then sync with them wanted, as the core does. */
  reconcile(...refs: string[]): Promise<void>;
  close(): Promise<void>;
}

describe('ContainerdLabelPins against the containerd twin', () => {
  const beds: Bed[] = [];
  after(async () => {
    for (const b of beds) {
      assert.deepEqual(b.c.updatesWithoutTarget, [], 'no Update was ever sent without a target');
      assert.equal(b.c.deaths, 0);
      await b.close();
    }
  });

  async function bed(opts: FakeContainerdOptions & { confirmTimeoutMs?: number } = {}): Promise<Bed> {
    const c = await startFakeContainerd({ version: '1.7.24', ...opts });
    const cri = new CriImageRuntime(c.endpoint);
    const { logger, lines } = captureLogs('debug');
    const clock = { now: Date.now() };
    const pins = new ContainerdLabelPins({ images: new ContainerdImages(c.endpoint), runtime: cri, log: logger, confirmTimeoutMs: opts.confirmTimeoutMs, now: () => clock.now, random: () => 0.5 });
    let n = 0;
    const b: Bed = {
      c,
      cri,
      pins,
      lines,
      clock,
      image() {
        const repo = `registry.test/app${n++}`;
        const digest = `sha256:${hex()}`;
        const id = `sha256:${hex()}`;
        c.catalogue.set(`${repo}:v1`, { size: 10, digest, id });
        c.catalogue.set(`${repo}@${digest}`, { size: 10, id });
        return { tag: `${repo}:v1`, digestRef: `${repo}@${digest}`, id };
      },
      async reconcile(...refs) {
        await pins.stage(refs);
        await pins.sync(await observedRuntime(cri), targets(...refs), signal());
      },
      async close() {
        pins.close();
        cri.close();
        await c.stop();
      },
    };
    beds.push(b);
    return b;
  }

  test('pin: the image-ID record gets the pin label and pinset\'s in one Update; CRI reports it pinned; the status holds it; observe() finds its reference', async () => {
    const b = await bed();
    const img = b.image();
    await b.cri.pullImage(img.digestRef);
    await b.reconcile(img.digestRef);
    assert.deepEqual(b.c.record(img.id)?.labels, OURS);
    assert.equal(b.c.updates(img.id).length, 1, 'both labels in one Update');
    assert.deepEqual(b.c.updates(img.id)[0]!.request.updateMask.paths, [`labels.${PIN_LABEL}`, `labels.${OWN_LABEL}`]);
    assert.deepEqual(b.c.record(img.digestRef)?.labels, MANAGED, 'the reference\'s own record is left alone');
    assert.equal((await b.cri.imageStatus(img.digestRef))?.pinned, true);
    const st = b.pins.status();
    assert.equal(st.holds(img.digestRef), true);
    assert.equal(st.problemFor([img.digestRef]), undefined);
    assert.equal(st.overridden, undefined);
    assert.match(st.where, /io\.cri-containerd\.pinned/);
    assert.deepEqual((await b.pins.observe()).current, [img.digestRef]);
    assert.equal(b.pins.state, 'labels set and reported');
    // Running again changes nothing.
    await b.reconcile(img.digestRef);
    assert.equal(b.c.updates(img.id).length, 1);
  });

  test('unpin: a reference no longer planned loses both labels; CRI reports it unpinned', async () => {
    const b = await bed();
    const img = b.image();
    await b.cri.pullImage(img.digestRef);
    await b.reconcile(img.digestRef);
    await b.reconcile();
    assert.deepEqual(b.c.record(img.id)?.labels, MANAGED);
    await new Promise((r) => setTimeout(r, 30));
    assert.equal((await b.cri.imageStatus(img.digestRef))?.pinned, false);
    assert.equal(b.pins.status().holds(img.digestRef), false);
    assert.deepEqual((await b.pins.observe()).current, []);
  });

  test('a hand pin (the pin label without pinset\'s) is kept: held while planned, never removed, never relabelled', async () => {
    const b = await bed();
    const img = b.image();
    await b.cri.pullImage(img.digestRef);
    b.c.label(img.id, { [PIN_LABEL]: 'pinned' });
    await b.reconcile(img.digestRef);
    assert.equal(b.c.updates(img.id).length, 0);
    assert.equal(b.pins.status().holds(img.digestRef), true);
    assert.ok(b.lines.some((l) => /pinned by hand/.test(String(l.msg))), 'the kept hand pin is logged');
    await b.reconcile();
    assert.equal(b.c.updates(img.id).length, 0, 'not unpinned');
    assert.deepEqual(b.c.record(img.id)?.labels, { ...MANAGED, [PIN_LABEL]: 'pinned' });
    assert.equal((await b.cri.imageStatus(img.digestRef))?.pinned, true);
    assert.deepEqual((await b.pins.observe()).current, [], 'not the agent\'s pin');
  });

  test('two references to one image (a tag and a digest): one pin; it stays while either is planned', async () => {
    const b = await bed();
    const img = b.image();
    await b.cri.pullImage(img.tag);
    await b.reconcile(img.digestRef, img.tag);
    assert.equal(b.c.updates(img.id).length, 1);
    await b.reconcile(img.tag);
    assert.deepEqual(b.c.record(img.id)?.labels, OURS, 'still planned through the tag');
    assert.equal(b.c.updates(img.id).length, 1);
    await b.reconcile();
    assert.deepEqual(b.c.record(img.id)?.labels, MANAGED);
  });

  test("the reference's own record deleted (ctr images rm repo@digest) while the image stays under its tag: the pin stays (its target is the planned digest); the name pulled again, it is held", async () => {
    const b = await bed();
    const img = b.image();
    await b.cri.pullImage(img.tag);
    await b.reconcile(img.digestRef);
    assert.equal(b.c.removeRecord(img.digestRef), true);
    await b.reconcile(img.digestRef);
    assert.deepEqual(b.c.record(img.id)?.labels, OURS, 'not unpinned');
    assert.equal(b.pins.status().holds(img.digestRef), false, 'CRI no longer shows the image under the reference');
    await b.cri.pullImage(img.digestRef);
    await b.pins.afterPulls(await observedRuntime(b.cri), targets(img.digestRef), targets(img.digestRef), signal());
    assert.equal(b.pins.status().holds(img.digestRef), true);
    assert.equal(b.c.updates(img.id).length, 1, 'labelled once');
  });

  test("a planned reference held under a mirror's name with the same digest: that image is pinned", async () => {
    const b = await bed();
    const img = b.image();
    const mirrored = img.digestRef.replace('registry.test/', 'mirror.test/');
    b.c.catalogue.set(mirrored, { size: 10, id: img.id });
    await b.cri.pullImage(mirrored);
    await b.reconcile(img.digestRef);
    assert.deepEqual(b.c.record(img.id)?.labels, OURS);
    assert.equal((await b.cri.imageStatus(mirrored))?.pinned, true);
  });

  test('a re-pull of the tag (imagePullPolicy: Always) leaves the pin in place: nothing to do at the next sync', async () => {
    const b = await bed();
    const img = b.image();
    await b.cri.pullImage(img.tag);
    await b.reconcile(img.digestRef);
    await b.cri.pullImage(img.tag);
    await b.cri.pullImage(img.digestRef);
    assert.equal((await b.cri.imageStatus(img.digestRef))?.pinned, true);
    await b.reconcile(img.digestRef);
    assert.equal(b.c.updates(img.id).length, 1);
  });

  test('a refused label Update: PinLabelFailed naming the image and the error, no pin removed, retried at its backoff, then it converges', async () => {
    const b = await bed();
    const [keep, add] = [b.image(), b.image()];
    await b.cri.pullImage(keep.digestRef);
    await b.cri.pullImage(add.digestRef);
    await b.reconcile(keep.digestRef);
    b.c.failUpdates({ times: 100, code: grpc.status.UNAVAILABLE, message: 'timeout acquiring the bolt lock' });
    await b.reconcile(add.digestRef);
    const st = b.pins.status();
    const problem = st.problemFor([add.digestRef]);
    assert.equal(problem?.reason, 'PinLabelFailed');
    assert.match(problem!.message, new RegExp(`${add.digestRef.replace(/[.]/g, '\\.')}.*timeout acquiring the bolt lock`));
    assert.equal(st.holds(add.digestRef), false);
    assert.deepEqual(b.c.record(keep.id)?.labels, OURS, 'the pin no longer planned is not removed while Updates fail');
    const next = b.pins.nextAttemptAt();
    assert.ok(next !== undefined && next > b.clock.now, 'a paced retry');
    // Not due yet: no Update is attempted.
    const tried = b.c.updates().length;
    await b.reconcile(add.digestRef);
    assert.equal(b.c.updates().length, tried);
    assert.equal(b.pins.status().problemFor([add.digestRef])?.reason, 'PinLabelFailed');
    // containerd accepts again; the retry is due.
    b.c.clearFailures();
    b.clock.now = next! + 1;
    await b.reconcile(add.digestRef);
    assert.equal(b.pins.status().problemFor([add.digestRef]), undefined);
    assert.deepEqual(b.c.record(add.id)?.labels, OURS);
    assert.deepEqual(b.c.record(keep.id)?.labels, MANAGED);
    assert.equal(b.pins.nextAttemptAt(), undefined);
    assert.ok(b.lines.some((l) => l.msg === 'labelling images in containerd works again'));
  });

  test('while the runtime errored, or its records cannot be listed, nothing is removed', async () => {
    const b = await bed();
    const img = b.image();
    await b.cri.pullImage(img.digestRef);
    await b.reconcile(img.digestRef);
    const down: RuntimeState = { answered: false, info: undefined, error: 'UNAVAILABLE', view: new RuntimeView([]), async refresh() {} };
    await b.pins.stage([]);
    await b.pins.sync(down, [], signal());
    assert.deepEqual(b.c.record(img.id)?.labels, OURS);
    b.c.failImagesCalls('List', { code: grpc.status.UNAVAILABLE, message: 'connection reset' });
    await b.reconcile();
    assert.deepEqual(b.c.record(img.id)?.labels, OURS);
    assert.equal(b.pins.status().problemFor([img.digestRef])?.reason, undefined, 'the planned list is empty: nothing affected');
    assert.ok(b.pins.nextAttemptAt() !== undefined);
  });

  test('containerd restarted: the labels are still there, nothing is relabelled, CRI reports the pin', async () => {
    const b = await bed();
    const img = b.image();
    await b.cri.pullImage(img.digestRef);
    await b.reconcile(img.digestRef);
    await b.c.restart();
    b.pins.runtimeRestarted();
    await b.cri.version().catch(() => {}); // a call on the dropped connection may fail; the next one reconnects
    await b.reconcile(img.digestRef);
    assert.equal(b.c.updates(img.id).length, 1);
    assert.equal((await b.cri.imageStatus(img.digestRef))?.pinned, true);
    assert.equal(b.pins.status().holds(img.digestRef), true);
  });

  test('afterPulls labels what landed', async () => {
    const b = await bed();
    const img = b.image();
    await b.reconcile(img.digestRef);
    assert.equal(b.pins.status().holds(img.digestRef), false, 'not present: nothing to label');
    await b.cri.pullImage(img.digestRef);
    await b.pins.afterPulls(await observedRuntime(b.cri), targets(img.digestRef), targets(img.digestRef), signal());
    assert.deepEqual(b.c.record(img.id)?.labels, OURS);
    assert.equal(b.pins.status().holds(img.digestRef), true);
  });

  test('afterPulls never unpins', async () => {
    const b = await bed();
    const img = b.image();
    await b.cri.pullImage(img.digestRef);
    await b.reconcile(img.digestRef);
    await b.pins.stage([]);
    await b.pins.afterPulls(await observedRuntime(b.cri), [], [], signal());
    assert.deepEqual(b.c.record(img.id)?.labels, OURS);
  });

  test('containerd 1.6.20: labels set all the same (an upgrade pins at its start), the node said unable to pin, naming the versions that pin; no wait', async () => {
    const b = await bed({ version: '1.6.20' });
    const img = b.image();
    await b.cri.pullImage(img.digestRef);
    const t0 = Date.now();
    await b.reconcile(img.digestRef);
    assert.ok(Date.now() - t0 < 1_000, `took ${Date.now() - t0} ms`);
    assert.deepEqual(b.c.record(img.id)?.labels, OURS);
    // Said for the node, not as a pin problem: whether images are pre-loaded is the status's to say.
    assert.equal(b.pins.status().overridden, undefined);
    assert.match(b.pins.status().cannotPin ?? '', /1\.6\.20.*1\.6\.25.*1\.7\.10.*2\.x/);
    assert.doesNotMatch(b.pins.status().cannotPin!, /pre-?load/);
    assert.equal(b.pins.inPlace((await b.cri.imageStatus(img.digestRef))!), false);
  });

  test('a containerd that should pin but does not report it within the bound: PinNotReported, re-checked later, cleared once reported', async () => {
    const b = await bed({ pinDelayMs: 1_500, confirmTimeoutMs: 200 });
    const img = b.image();
    await b.cri.pullImage(img.digestRef);
    await b.reconcile(img.digestRef);
    const p = b.pins.status().problemFor([img.digestRef]);
    assert.equal(p?.reason, 'PinNotReported');
    assert.match(p!.message, new RegExp(`does not report image ${img.digestRef.replace(/[.]/g, '\\.')} pinned`));
    assert.ok(b.pins.nextAttemptAt() !== undefined);
    await new Promise((r) => setTimeout(r, 1_500));
    await b.reconcile(img.digestRef);
    assert.equal(b.pins.status().problemFor([img.digestRef]), undefined);
    assert.equal(b.pins.nextAttemptAt(), undefined);
  });

  test('stage() touches nothing; a name-only pull never helps; in place is CRI\'s pinned', async () => {
    const b = await bed();
    const calls = b.c.imagesCalls.length;
    await b.pins.stage(['registry.test/x@sha256:' + hex()]);
    assert.equal(b.c.imagesCalls.length, calls);
    const img = { id: 'sha256:' + hex(), repoTags: [], repoDigests: [], size: 1, pinned: false, runtimeHandler: '' };
    assert.equal(b.pins.wantsNamePull('registry.test/x@sha256:' + hex(), img), false);
    assert.equal(b.pins.inPlace(img), false);
    assert.equal(b.pins.inPlace({ ...img, pinned: true }), true);
    assert.deepEqual(b.pins.watchPaths(), []);
  });

  test('a retained reference (planned by stage() though no set wants it now) keeps its pin', async () => {
    const b = await bed();
    const img = b.image();
    await b.cri.pullImage(img.digestRef);
    await b.reconcile(img.digestRef);
    // The API could not be read: the core keeps observe().current in its plan.
    const { current } = await b.pins.observe();
    await b.pins.stage(current);
    await b.pins.sync(await observedRuntime(b.cri), [], signal());
    assert.deepEqual(b.c.record(img.id)?.labels, OURS);
  });
});
