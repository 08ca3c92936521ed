// `pinset agent --drop-pins` on the real containerd 1.7.24 and 2.1.9, as shipped (the
// bundle): a node whose agent pinned two images (run once, as a node's
// agent would) and where an administrator pinned one of them by hand with
// `ctr images label`, and a third. --drop-pins removes pinset's labels, and
// CRI (what the kubelet's garbage collection reads) reports pinset's images
// unpinned, while the hand-pinned ones stay pinned, their labels untouched.
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { stringify as dumpYaml } from 'yaml';
import { ContainerdImages } from '../../src/containerd/images.ts';
import { OWN_LABEL, PIN_LABEL } from '../../src/containerd/label-pins.ts';
import { missingComponents, requireComponents, type ComponentName } from '../support/components.ts';
import { Containerd, containerdComponent, CriClient, PINNING_CONTAINERD_VERSIONS } from '../support/containerd.ts';
import { pushSingleLayer } from '../support/images.ts';
import { Registry } from '../support/registry.ts';
import { bundledCli, runAgentOnce, runPinset } from '../support/agent-process.ts';


// Every version that honours the label: 1.7.24 and 2.1.9.
for (const version of PINNING_CONTAINERD_VERSIONS)
describe(`pinset agent --drop-pins on containerd ${version}`, () => {
  const NEEDS: ComponentName[] = [containerdComponent(version), 'runc', 'docker-registry'];
  let registry: Registry | undefined;
  let containerd: Containerd | undefined;
  let work: string;
  let cli: string;

  before(async () => {
    cli = await bundledCli();
    work = await mkdtemp(path.join(os.tmpdir(), 'pinset-e2e-drop-'));
    if (missingComponents(NEEDS).length > 0 || process.getuid?.() !== 0) return; // the test reports it
    registry = await Registry.start();
    containerd = await Containerd.start({ version, mirrors: { 'registry.test': registry.url } });
  });
  after(async () => {
    if (containerd) assert.equal(containerd.running, true, `containerd died:\n${containerd.logTail()}`);
    await containerd?.stop();
    await registry?.stop();
    await rm(work, { recursive: true, force: true });
  });

  test("pinset's labels removed, its images reported unpinned through CRI; the images an administrator pinned by hand stay pinned", async (t) => {
    if (!requireComponents(t, NEEDS)) return;
    const c = containerd!;
    const cri = new CriClient(c.endpoint);
    const images = new ContainerdImages(c.endpoint);
    try {
      const a = await pushSingleLayer(registry!, 'drop/a');
      const b = await pushSingleLayer(registry!, 'drop/b');
      const hand = await pushSingleLayer(registry!, 'drop/hand');
      const staticDir = path.join(work, 'sets.d');
      await mkdir(staticDir);
      await writeFile(path.join(staticDir, 'sets.yaml'), dumpYaml({ apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name: 'apps' }, spec: { pinnedImages: [{ name: a.ref }, { name: b.ref }] } }));
      const node = ['--cri-endpoint', c.endpoint, '--crio-dropin-dir', path.join(work, 'no-crio', 'crio.conf.d'), '--state-dir', path.join(work, 'state')];
      const once = await runAgentOnce(['--node-name', 'n1', '--static-dir', staticDir, '--auth-file', path.join(work, 'none.json'), '--metrics-addr', '', ...node], { cli });
      assert.equal(once.code, 0, once.stderr);
      for (const img of [a, b]) assert.equal((await cri.imageStatus(img.ref))?.pinned, true);

      // The administrator pins b (which pinset pins too) and another image by hand, on their references.
      await c.ctr(['images', 'label', b.ref, `${PIN_LABEL}=pinned`]);
      await cri.pullImage(hand.ref);
      await c.ctr(['images', 'label', hand.ref, `${PIN_LABEL}=pinned`]);

      const r = await runPinset(['agent', '--drop-pins', ...node], { cli });
      assert.equal(r.code, 0, `${r.stdout}\n${r.stderr}`);
      assert.match(r.stdout, /^removed pinset's labels \(pinset\.dev\/pinned, io\.cri-containerd\.pinned\) from 2 image record\(s\) in containerd$/m);
      assert.match(r.stdout, /^confirmed through CRI: 1 image\(s\) no longer pinned, 1 still pinned by a pin that is not pinset's \(kept\)$/m);
      assert.match(r.stdout, new RegExp(`${b.ref.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')}: still pinned by the label io\\.cri-containerd\\.pinned=pinned on ${b.ref.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')} \\(not pinset's\\)`));

      const own = (await images.list()).filter((rec) => OWN_LABEL in rec.labels);
      assert.deepEqual(own, [], "no record carries pinset's label");
      assert.equal((await cri.imageStatus(a.ref))?.pinned, false, 'pinned by pinset alone: unpinned');
      assert.equal((await cri.imageStatus(b.ref))?.pinned, true, 'pinned by hand too: stays pinned');
      assert.equal((await cri.imageStatus(hand.ref))?.pinned, true, 'pinned by hand only: untouched');
      assert.equal((await images.get(b.ref))?.labels[PIN_LABEL], 'pinned');
      assert.equal((await images.get(hand.ref))?.labels[PIN_LABEL], 'pinned');
    } finally {
      images.close();
      cri.close();
    }
  });
});
