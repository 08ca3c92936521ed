// The CRI-O behaviour assertions (test/support/crio-behaviour.ts) against a
// real CRI-O, the same ones test/integration/crio-behaviour.test.ts runs
// against the stand-in. Run with `PINSET_CRIO_BIN=/path/to/crio npm run
// test:crio` (test/crio/run.ts).
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { crioBehaviour } from '../support/crio-behaviour.ts';
import { CountingProxy } from '../support/counting-proxy.ts';
import { buildImage, layerOf, nodePlatform, pushBlob, pushManifest, pushMultiArch, pushSingleLayer } from '../support/images.ts';
import { RealCrio, realCrioMissing } from '../support/real-crio.ts';
import { Registry } from '../support/registry.ts';

const BIN = process.env.PINSET_CRIO_BIN;

crioBehaviour('CRI-O behaviour: a real CRI-O', async () => {
  const why = realCrioMissing(BIN);
  if (why) return why;
  const registry = await Registry.start();
  const proxy = await CountingProxy.start(registry.url);
  const dir = await mkdtemp(join(tmpdir(), 'pinset-real-behaviour-'));
  const crio = new RealCrio(dir, { bin: BIN!, registries: { 'registry.test': proxy.hostPort } });
  await crio.configure({ 'registry.test': proxy.hostPort });
  await crio.start();
  let n = 0;
  const repoOf = (repo: string) => `t${n++}/${repo}`;
  return {
    endpoint: crio.endpoint,
    dropInDir: crio.dropInDir,
    mainConfig: crio.mainConfig,
    async taggedImage(repo) {
      const r = repoOf(repo);
      const image = buildImage([layerOf([{ name: 'f.txt', data: Buffer.from(`${r} ${Date.now()}\n`) }])], nodePlatform(), r);
      for (const b of [...image.layers, image.config]) await pushBlob(registry, r, b);
      await pushManifest(registry, r, image.manifest, 'v1');
      return { tag: `registry.test/${r}:v1`, digestRef: `registry.test/${r}@${image.manifest.digest}` };
    },
    async indexImage(repo) {
      const r = repoOf(repo);
      const pushed = await pushMultiArch(registry, r);
      const mine = pushed.platforms[`linux/${nodePlatform().architecture}`]!;
      return { index: pushed.ref, platform: `registry.test/${r}@${mine.manifestDigest}` };
    },
    async digestImage(repo) {
      return (await pushSingleLayer(registry, repoOf(repo))).ref;
    },
    downloads: () => proxy.layerGets(),
    sighup: () => crio.sighup(),
    async startRefused() {
      // Another CRI-O with its own root and socket, on the same drop-in folder.
      const other = new RealCrio(await mkdtemp(join(tmpdir(), 'pinset-real-refused-')), { bin: BIN!, registries: { 'registry.test': proxy.hostPort }, dropInDir: crio.dropInDir });
      try {
        await other.configure({ 'registry.test': proxy.hostPort });
        const r = await other.startRefused();
        if (r.code === 0 || r.code === 'still running') throw new Error(`CRI-O started although it should have refused:\n${r.log}`);
        return r.log;
      } finally {
        await rm(other.dir, { recursive: true, force: true });
      }
    },
    async close() {
      await crio.stop();
      await proxy.stop();
      await registry.stop();
      await rm(dir, { recursive: true, force: true });
    },
  };
});
