// containerd's Content service as the agent reads it (src/containerd/content.ts)
// against the real containerd 1.6 (the system's), 1.7.24 and 2.1.9 while a
// CRI pull crosses a thin link (test/support/thin-link.ts: 8 Mbit/s, so a
// 5 MB layer takes about 5 s): the layer is an ingest whose ref names its
// digest, whose total is its size and whose offset grows as the bytes
// arrive (a MiB at a time: content.Copy writes whole MiBs,
// content/helpers.go); once the pull is done the ingest is gone and Info
// tells the blob committed; the download progress seam counts the layer's
// bytes all along, never going back. containerd 1.6 and 1.7 pull through
// client.Pull, 2.1 through its transfer service: all write the same
// ingests (1.6 pins nothing, but the agent pre-loads there and counts its
// bytes alike).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { ContainerdContent, ContentDownloads } from '../../src/containerd/content.ts';
import { requireComponents, type ComponentName } from '../support/components.ts';
import { Containerd, containerdComponent, CriClient, type ContainerdVersion } from '../support/containerd.ts';
import { MEDIA_TYPES, pushRandom } from '../support/images.ts';
import { Registry } from '../support/registry.ts';
import { ThinLink } from '../support/thin-link.ts';

const LAYER_BYTES = 5_000_000;

for (const version of ['1.6', '1.7', '2.1'] as ContainerdVersion[]) {
  const needs: ComponentName[] = [containerdComponent(version), 'runc', 'docker-registry'];

  describe(`containerd ${version}: the bytes of a pull under way, from its Content service`, () => {
    let registry: Registry | undefined;
    let link: ThinLink | undefined;
    let containerd: Containerd | undefined;

    before(async () => {
      if (process.getuid?.() !== 0) return; // the test says why
      registry = await Registry.start();
      link = await ThinLink.start({ target: registry.url, bitsPerSecond: 8e6 });
      containerd = await Containerd.start({ version, mirrors: { 'registry.test': link.url } });
    });
    after(async () => {
      await containerd?.stop();
      await link?.stop();
      await registry?.stop();
    });

    test('a layer being pulled is an ingest named by its digest, its offset growing to its size; then committed, and counted whole', async (t) => {
      if (!requireComponents(t, needs) || !containerd || !registry) return;
      const img = await pushRandom(registry, `content/slow-${version.replace('.', '-')}`, LAYER_BYTES);
      const manifest = (await (await fetch(`${registry.url}/v2/${img.repo}/manifests/${img.digest}`, { headers: { accept: MEDIA_TYPES.manifest } })).json()) as {
        config: { digest: string; size: number };
        layers: { digest: string; size: number }[];
      };
      const layer = manifest.layers[0]!;
      const blobs = new Map([[manifest.config.digest, manifest.config.size], [layer.digest, layer.size]]);
      const content = new ContainerdContent(containerd.endpoint);
      const downloads = new ContentDownloads(content);
      const cri = new CriClient(containerd.endpoint);
      try {
        let done = false;
        const from = Date.now();
        const pulled = cri.pullImage(img.ref).finally(() => (done = true));
        const ingests: { ref: string; offset: number; total: number; startedAt: number; updatedAt: number }[] = [];
        const counted: number[] = [];
        while (!done) {
          const seen = (await content.listStatuses()).find((i) => i.digest === layer.digest);
          if (seen) ingests.push(seen);
          counted.push((await downloads.arrived(blobs)).get(layer.digest) ?? 0);
          await new Promise((r) => setTimeout(r, 150));
        }
        await pulled;

        assert.ok(ingests.length >= 3, `the layer seen being written ${ingests.length} times`);
        const to = Date.now();
        for (const i of ingests) {
          assert.ok(i.ref.endsWith(layer.digest), `the ref names the blob: ${i.ref}`);
          assert.equal(i.total, layer.size, 'total: the size the manifest gives');
          // The times the buffered part is counted from: on the node's clock, which the agent shares.
          assert.ok(from - 1000 <= i.startedAt && i.startedAt <= i.updatedAt && i.updatedAt <= to + 1000, `started ${i.startedAt - from} ms, updated ${i.updatedAt - from} ms into the pull`);
        }
        const offsets = ingests.map((i) => i.offset);
        assert.deepEqual(offsets, [...offsets].sort((a, b) => a - b), `offsets never go back: ${offsets.join(' ')}`);
        const between = new Set(offsets.filter((o) => o > 0 && o < layer.size));
        assert.ok(between.size >= 2, `offsets grow while the pull is slow: ${offsets.join(' ')}`);
        assert.deepEqual(counted, [...counted].sort((a, b) => a - b), `the seam's count never goes back: ${counted.join(' ')}`);

        assert.equal((await content.listStatuses()).find((i) => i.digest === layer.digest), undefined, 'no ingest once pulled');
        assert.deepEqual(await content.info(layer.digest), { digest: layer.digest, size: layer.size });
        assert.equal(await content.info(`sha256:${'0'.repeat(64)}`), null);
        assert.equal((await downloads.arrived(blobs)).get(layer.digest), layer.size, 'written at the last read, committed now: counted whole');
      } finally {
        cri.close();
        downloads.close();
      }
    });
  });
}
