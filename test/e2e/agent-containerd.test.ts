// `pinset agent` on containerd as a containerd node runs it: the bundle, the
// default `--pin-backend auto`, no CRI-O folder. On containerd 1.7.24 the
// agent pins through image labels and a set is Ready only once CRI reports
// its images pinned; a set removed unpins, a pin set by hand stays. On
// Debian 12's containerd 1.6.20, which never reports pins, the images are
// pre-loaded and every set says plainly that nothing pins them.
import assert from 'node:assert/strict';
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { PinnedImageSet } from '../../src/api/types.ts';
import { ContainerdImages } from '../../src/containerd/images.ts';
import { OWN_LABEL, PIN_LABEL } from '../../src/containerd/label-pins.ts';
import { missingComponents, requireComponents, type ComponentName } from '../support/components.ts';
import { Containerd, containerdComponent, CriClient, PINNING_CONTAINERD_VERSIONS, type ContainerdVersion } from '../support/containerd.ts';
import { pushSingleLayer, type PushedImage } from '../support/images.ts';
import { Registry } from '../support/registry.ts';
import { bundledCli, runAgentOnce } from '../support/agent-process.ts';
import { staticNode } from '../support/static-node.ts';

const needs = (version: ContainerdVersion): ComponentName[] => [containerdComponent(version), 'runc', 'docker-registry'];
const NEEDS_16: ComponentName[] = [containerdComponent('1.6'), 'runc', 'docker-registry'];

function set(name: string, imgs: PushedImage[]): PinnedImageSet {
  return { apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name }, spec: { pinnedImages: imgs.map((i) => ({ name: i.ref })) } };
}

describe('pinset agent on containerd, --pin-backend auto', () => {
  let registry: Registry | undefined;
  let cli: string;
  let work: string;

  before(async () => {
    cli = await bundledCli();
    if (missingComponents(['docker-registry']).length === 0) registry = await Registry.start();
    work = await mkdtemp(path.join(os.tmpdir(), 'pinset-e2e-ctrd-agent-'));
  });
  after(async () => {
    await registry?.stop();
    await rm(work, { recursive: true, force: true });
  });

  /** A node of its own: a static folder, no CRI-O folder, a state folder for the lock. */
  async function node(name: string, containerd: Containerd) {
    const n = await staticNode(path.join(work, name), name, containerd.endpoint);
    return { ...n, run: () => runAgentOnce(n.flags, { cli }) };
  }

  // Every version that honours the label: 1.7.24 and 2.1.9.
  for (const version of PINNING_CONTAINERD_VERSIONS)
  test(`containerd ${version}: pinned through image labels, Ready once CRI reports pinned; a set removed unpins; a hand pin stays`, async (t) => {
    if (!requireComponents(t, needs(version))) return;
    const containerd = await Containerd.start({ version, mirrors: { 'registry.test': registry!.url } });
    const cri = new CriClient(containerd.endpoint);
    const labels = new ContainerdImages(containerd.endpoint);
    try {
      const a = await pushSingleLayer(registry!, 'agent-ctrd/a');
      const b = await pushSingleLayer(registry!, 'agent-ctrd/b');
      const hand = await pushSingleLayer(registry!, 'agent-ctrd/hand');
      const n = await node(`ctrd-${version}`, containerd);
      await n.writeSets(set('apps', [a, b]));

      const r = await n.run();
      assert.equal(r.code, 0, r.stderr);
      assert.equal(r.sets.length, 1);
      assert.equal(r.sets[0]!.phase, 'Ready');
      assert.equal(r.sets[0]!.reason, 'AllImagesPinned');
      assert.deepEqual(r.sets[0]!.images, { wanted: 2, present: 2, pinned: 2, failed: 0, invalid: 0 });
      assert.match(r.stderr, /"backend":"containerd".*pin backend chosen/);
      for (const img of [a, b]) {
        const st = await cri.imageStatus(img.ref);
        assert.equal(st?.pinned, true, `CRI reports ${img.ref} pinned`);
        const rec = await labels.get(st!.id);
        assert.equal(rec?.labels[PIN_LABEL], 'pinned', 'the label is on the image-ID record');
        assert.ok(rec && OWN_LABEL in rec.labels, "pinset's own label beside it");
      }
      assert.deepEqual(await readdir(n.dir).then((e) => e.sort()), ['sets.d', 'state'], 'no CRI-O folder is made on a containerd node');

      // An administrator's pin, set by hand as `ctr images label` does.
      await cri.pullImage(hand.ref);
      const handId = (await cri.imageStatus(hand.ref))!.id;
      await labels.setLabels(handId, { [PIN_LABEL]: 'pinned' });

      // The set goes: its images are unpinned, the hand pin stays.
      await n.writeSets();
      const after = await n.run();
      assert.equal(after.code, 0, after.stderr);
      assert.deepEqual(after.sets, []);
      for (const img of [a, b]) {
        const st = await cri.imageStatus(img.ref);
        assert.equal(st?.pinned, false, `${img.ref} unpinned once no set wants it`);
        const rec = await labels.get(st!.id);
        assert.ok(rec && !(PIN_LABEL in rec.labels) && !(OWN_LABEL in rec.labels), 'both labels removed');
      }
      assert.equal((await cri.imageStatus(hand.ref))?.pinned, true, 'a pin set by hand is never removed');
    } finally {
      labels.close();
      cri.close();
      await containerd.stop();
    }
  });

  test('containerd 1.6.20 (Debian 12): pre-loaded, every set Degraded RuntimeCannotPin naming the versions that pin', async (t) => {
    if (!requireComponents(t, NEEDS_16)) return;
    const containerd = await Containerd.start({ mirrors: { 'registry.test': registry!.url } });
    const cri = new CriClient(containerd.endpoint);
    try {
      const a = await pushSingleLayer(registry!, 'agent-ctrd16/a');
      const n = await node('ctrd-16', containerd);
      await n.writeSets(set('apps', [a]));
      const r = await n.run();
      assert.equal(r.code, 1, 'not Ready: nothing pins the images');
      const s = r.sets[0]!;
      assert.equal(s.phase, 'Degraded');
      assert.equal(s.reason, 'RuntimeCannotPin');
      assert.match(s.message!, /1\.6\.20/);
      assert.match(s.message!, /1\.6\.25/);
      assert.equal(s.images.present, 1, 'the image is pre-loaded all the same');
      assert.equal(s.images.pinned, 0);
      assert.equal((await cri.imageStatus(a.ref))?.pinned, false);
    } finally {
      cri.close();
      await containerd.stop();
    }
  });
});
