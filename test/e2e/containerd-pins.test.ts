// The containerd pin backend (src/containerd/label-pins.ts) on the real
// containerd: 1.7.24 and 2.1.9 pin (CRI reports `pinned`, through pulls and
// restarts), 1.6.20 cannot (said plainly). Images come from a real registry
// on loopback; hand pins are set with containerd's own `ctr`. Every suite
// ends by checking its containerd is still the same process: an Update
// without a target would have killed 1.7.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { CriImageRuntime } from '../../src/cri/client.ts';
import { ContainerdImages } from '../../src/containerd/images.ts';
import { ContainerdLabelPins, OWN_LABEL, PIN_LABEL } from '../../src/containerd/label-pins.ts';
import { missingComponents, requireComponents, type ComponentName } from '../support/components.ts';
import { Containerd, containerdComponent, PINNING_CONTAINERD_VERSIONS, type ContainerdVersion } from '../support/containerd.ts';
import { ImagesClient } from '../support/containerd-proto.ts';
import { pushSingleLayer } from '../support/images.ts';
import { captureLogs } from '../support/log-capture.ts';
import { observedRuntime, pinTargets } from '../support/pin-runtime.ts';
import { Registry } from '../support/registry.ts';

const MANAGED = { 'io.cri-containerd.image': 'managed' };
const OURS = { ...MANAGED, [PIN_LABEL]: 'pinned', [OWN_LABEL]: 'agent' };
const signal = () => new AbortController().signal;
const targets = pinTargets;


function suite(version: ContainerdVersion, body: (ctx: () => Ctx) => void): void {
  const NEEDS: ComponentName[] = [containerdComponent(version), 'runc', 'docker-registry'];
  describe(`ContainerdLabelPins on the real containerd ${version}`, () => {
    let ctx: Ctx | undefined;
    before(async () => {
      if (missingComponents(NEEDS).length > 0 || process.getuid?.() !== 0) return; // each test reports it
      const registry = await Registry.start();
      const containerd = await Containerd.start({ version, mirrors: { 'registry.test': registry.url } });
      ctx = new Ctx(registry, containerd);
    });
    after(async () => {
      if (!ctx) return;
      try {
        assert.equal(ctx.containerd.running, true, `containerd ${version} died:\n${ctx.containerd.logTail()}`);
      } finally {
        await ctx.close();
      }
    });
    body(() => ctx!);
  });
}

class Ctx {
  readonly cri: CriImageRuntime;
  readonly images: ImagesClient;
  readonly pins: ContainerdLabelPins;
  readonly lines: Record<string, unknown>[];
  readonly registry: Registry;
  readonly containerd: Containerd;
  n = 0;
  constructor(registry: Registry, containerd: Containerd) {
    this.registry = registry;
    this.containerd = containerd;
    this.cri = new CriImageRuntime(containerd.endpoint);
    this.images = new ImagesClient(containerd.endpoint);
    const { logger, lines } = captureLogs('debug');
    this.lines = lines;
    this.pins = new ContainerdLabelPins({ images: new ContainerdImages(containerd.endpoint), runtime: this.cri, log: logger });
  }
  /** A fresh image pushed with a tag: its tag and digest references and its ID record's name. */
  async image(): Promise<{ tag: string; digestRef: string; id: string }> {
    const repo = `pins/app${this.n++}`;
    const img = await pushSingleLayer(this.registry, repo, { tag: 'v1' });
    return { tag: `registry.test/${repo}:v1`, digestRef: img.ref, id: img.id };
  }
  async reconcile(...refs: string[]): Promise<void> {
    await this.pins.stage(refs);
    await this.pins.sync(await observedRuntime(this.cri), targets(...refs), signal());
  }
  async labels(name: string): Promise<Record<string, string>> {
    return (await this.images.get(name)).labels;
  }
  async close(): Promise<void> {
    this.pins.close();
    this.cri.close();
    this.images.close();
    await this.containerd.stop();
    await this.registry.stop();
  }
}

const needs = (version: ContainerdVersion): ComponentName[] => [containerdComponent(version), 'runc', 'docker-registry'];
const NEEDS_16: ComponentName[] = [containerdComponent('1.6'), 'runc', 'docker-registry'];

// Every version that honours the label: 1.7.24 and 2.1.9.
for (const version of PINNING_CONTAINERD_VERSIONS) suite(version, (ctx) => {
  test('a planned reference pinned: the ID record labelled, CRI reports the image pinned under its tag and its digest', async (t) => {
    if (!requireComponents(t, needs(version))) return;
    const c = ctx();
    const img = await c.image();
    await c.cri.pullImage(img.tag);
    await c.reconcile(img.digestRef);
    assert.deepEqual(await c.labels(img.id), OURS);
    assert.equal((await c.cri.imageStatus(img.digestRef))?.pinned, true);
    assert.equal((await c.cri.imageStatus(img.tag))?.pinned, true);
    assert.equal(c.pins.status().holds(img.digestRef), true);
    assert.equal(c.pins.status().problemFor([img.digestRef]), undefined);
    assert.equal(c.pins.status().overridden, undefined);
    assert.ok((await c.pins.observe()).current.includes(img.digestRef));
  });

  test('no longer planned: unpinned, both labels gone', async (t) => {
    if (!requireComponents(t, needs(version))) return;
    const c = ctx();
    const img = await c.image();
    await c.cri.pullImage(img.digestRef);
    await c.reconcile(img.digestRef);
    await c.reconcile();
    assert.deepEqual(await c.labels(img.id), MANAGED);
    const deadline = Date.now() + 2_000;
    while ((await c.cri.imageStatus(img.digestRef))?.pinned) {
      assert.ok(Date.now() < deadline, 'still reported pinned 2 s after the labels went');
      await new Promise((r) => setTimeout(r, 10));
    }
  });

  test("an administrator's hand pin (ctr images label ... io.cri-containerd.pinned=pinned) is kept and never removed", async (t) => {
    if (!requireComponents(t, needs(version))) return;
    const c = ctx();
    const img = await c.image();
    await c.cri.pullImage(img.digestRef);
    await c.containerd.ctr(['images', 'label', img.id, `${PIN_LABEL}=pinned`]);
    await c.reconcile(img.digestRef);
    assert.deepEqual(await c.labels(img.id), { ...MANAGED, [PIN_LABEL]: 'pinned' }, 'not relabelled as the agent\'s');
    assert.equal(c.pins.status().holds(img.digestRef), true);
    await c.reconcile();
    assert.deepEqual(await c.labels(img.id), { ...MANAGED, [PIN_LABEL]: 'pinned' }, 'not removed');
    assert.equal((await c.cri.imageStatus(img.digestRef))?.pinned, true);
  });

  test("a set that listed a hand-pinned image removed: the log says pinset's pin went and the image stays pinned by the administrator's label; the counts are CRI's", async (t) => {
    if (!requireComponents(t, needs(version))) return;
    const c = ctx();
    const [mine, theirs] = [await c.image(), await c.image()];
    for (const img of [mine, theirs]) await c.cri.pullImage(img.digestRef);
    // The administrator pins one of them by hand, on its reference (as `ctr images label <ref>` does).
    await c.containerd.ctr(['images', 'label', theirs.digestRef, `${PIN_LABEL}=pinned`]);
    await c.reconcile(mine.digestRef, theirs.digestRef);
    assert.deepEqual(await c.labels(theirs.id), OURS, 'pinset pins the image-ID record, beside the hand pin on the reference');
    const from = c.lines.length;

    await c.reconcile();
    const logged = c.lines.slice(from);
    const updated = logged.find((l) => l.msg === 'containerd image labels updated');
    assert.ok(updated, 'one line for the label changes');
    // What CRI reports now: one image unpinned, one still pinned (by the administrator's label).
    assert.equal((await c.cri.imageStatus(mine.digestRef))?.pinned, false);
    assert.equal((await c.cri.imageStatus(theirs.digestRef))?.pinned, true);
    assert.deepEqual(
      { labelled: updated.labelled, labelsRemoved: updated.labelsRemoved, pinned: updated.pinned, unpinned: updated.unpinned, stillPinned: updated.stillPinned },
      { labelled: 0, labelsRemoved: 2, pinned: 0, unpinned: 1, stillPinned: 1 },
    );
    const still = logged.find((l) => typeof l.msg === 'string' && l.msg.startsWith("pinset's pin removed; containerd still reports the image pinned"));
    assert.ok(still, `a line saying the image stays pinned; got ${JSON.stringify(logged)}`);
    assert.equal(still.msg, "pinset's pin removed; containerd still reports the image pinned, by a label that is not pinset's (kept as it is)");
    assert.equal(still.image, theirs.id);
    assert.deepEqual(still.pinnedBy, [theirs.digestRef]);
    assert.deepEqual(await c.labels(theirs.digestRef), { ...MANAGED, [PIN_LABEL]: 'pinned' }, "the administrator's label untouched");
  });

  test('a tag and a digest of one image: one pin, kept while either is planned', async (t) => {
    if (!requireComponents(t, needs(version))) return;
    const c = ctx();
    const img = await c.image();
    await c.cri.pullImage(img.tag);
    await c.reconcile(img.tag, img.digestRef);
    await c.reconcile(img.tag);
    assert.deepEqual(await c.labels(img.id), OURS);
    assert.equal((await c.cri.imageStatus(img.digestRef))?.pinned, true);
    await c.reconcile();
    assert.deepEqual(await c.labels(img.id), MANAGED);
  });

  test('a re-pull of the tag and of the digest (the kubelet with imagePullPolicy: Always): the pin survives', async (t) => {
    if (!requireComponents(t, needs(version))) return;
    const c = ctx();
    const img = await c.image();
    await c.cri.pullImage(img.tag);
    await c.reconcile(img.digestRef);
    await c.cri.pullImage(img.tag);
    await c.cri.pullImage(img.digestRef);
    assert.deepEqual(await c.labels(img.id), OURS);
    assert.equal((await c.cri.imageStatus(img.tag))?.pinned, true);
  });

  test('containerd down: the label update fails (PinLabelFailed), no pin is removed; restarted, the labels are there and it converges', async (t) => {
    if (!requireComponents(t, needs(version))) return;
    const c = ctx();
    const [keep, add] = [await c.image(), await c.image()];
    await c.cri.pullImage(keep.digestRef);
    await c.cri.pullImage(add.digestRef);
    await c.reconcile(keep.digestRef);
    // The view is taken while containerd answers; then it goes away before the labels are written.
    const state = await observedRuntime(c.cri);
    await c.containerd.shutdown();
    await c.pins.stage([add.digestRef]);
    await c.pins.sync(state, targets(add.digestRef), signal());
    const problem = c.pins.status().problemFor([add.digestRef]);
    assert.equal(problem?.reason, 'PinLabelFailed');
    assert.match(problem!.message, /UNAVAILABLE/);
    assert.ok(c.pins.nextAttemptAt() !== undefined);
    await c.containerd.start();
    c.pins.runtimeRestarted();
    assert.deepEqual(await c.labels(keep.id), OURS, 'the pin no longer planned was not removed during the outage; labels survive the restart');
    assert.equal((await c.cri.imageStatus(keep.digestRef).catch(() => c.cri.imageStatus(keep.digestRef)))?.pinned, true, 'CRI reports it again after the start');
    await new Promise((r) => setTimeout(r, Math.max(0, c.pins.nextAttemptAt()! - Date.now())));
    await c.reconcile(add.digestRef);
    assert.equal(c.pins.status().problemFor([add.digestRef]), undefined);
    assert.deepEqual(await c.labels(add.id), OURS);
    assert.deepEqual(await c.labels(keep.id), MANAGED);
    assert.equal((await c.cri.imageStatus(add.digestRef))?.pinned, true);
  });

  test('restarted with pins in place: nothing relabelled, the pin still reported', async (t) => {
    if (!requireComponents(t, needs(version))) return;
    const c = ctx();
    const img = await c.image();
    await c.cri.pullImage(img.digestRef);
    await c.reconcile(img.digestRef);
    await c.containerd.restart();
    c.pins.runtimeRestarted();
    await c.cri.version().catch(() => {}); // a call on the dropped connection may fail; the next one reconnects
    const updated = () => c.lines.filter((l) => l.msg === 'containerd image labels updated').length;
    const before = updated();
    await c.reconcile(img.digestRef);
    assert.equal(updated(), before, 'no label written after the restart');
    assert.deepEqual(await c.labels(img.id), OURS);
    assert.equal((await c.cri.imageStatus(img.digestRef))?.pinned, true);
    assert.equal(c.pins.status().problemFor([img.digestRef]), undefined);
  });
});

suite('1.6', (ctx) => {
  test('1.6.20 cannot pin: labels set all the same, CRI reports unpinned, the node said unable to pin, naming the versions that can', async (t) => {
    if (!requireComponents(t, NEEDS_16)) return;
    const c = ctx();
    const img = await c.image();
    await c.cri.pullImage(img.digestRef);
    await c.reconcile(img.digestRef);
    assert.deepEqual(await c.labels(img.id), OURS);
    assert.equal((await c.cri.imageStatus(img.digestRef))?.pinned, false);
    // Said for the node, not as a pin problem: whether images are pre-loaded is the status's to say.
    assert.equal(c.pins.status().overridden, undefined);
    assert.match(c.pins.status().cannotPin ?? '', /1\.6\.20~ds1.*1\.6\.25.*1\.7\.10.*2\.x/);
    await c.reconcile();
    assert.deepEqual(await c.labels(img.id), MANAGED, 'and removed as on any version');
  });
});
