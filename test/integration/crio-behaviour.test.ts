// The CRI-O behaviour assertions (test/support/crio-behaviour.ts) against
// the stand-in. `npm run test:crio` runs the very same assertions against a
// real CRI-O: both passing is what shows the stand-in behaves like it.
import { randomBytes } from 'node:crypto';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { crioBehaviour } from '../support/crio-behaviour.ts';
import { startFakeCrio } from '../support/fake-crio.ts';

const digest = () => `sha256:${randomBytes(32).toString('hex')}`;

crioBehaviour('CRI-O behaviour: the stand-in', async () => {
  const root = await mkdtemp(join(tmpdir(), 'pinset-behaviour-'));
  const dropInDir = join(root, 'crio.conf.d');
  await mkdir(dropInDir);
  const crio = await startFakeCrio({ dropInDir });
  let n = 0;
  // Every image under its own repo, as the real suite pushes fresh ones.
  const repoOf = (repo: string) => `registry.test/t${n++}/${repo}`;
  return {
    endpoint: crio.endpoint,
    dropInDir,
    mainConfig: crio.mainConfig,
    async taggedImage(repo) {
      const r = repoOf(repo);
      const d = digest();
      crio.catalogue.set(`${r}:v1`, { size: 10, digest: d });
      crio.catalogue.set(`${r}@${d}`, { size: 10 });
      return { tag: `${r}:v1`, digestRef: `${r}@${d}` };
    },
    async indexImage(repo) {
      const r = repoOf(repo);
      const [i, p] = [digest(), digest()];
      crio.catalogue.set(`${r}@${i}`, { size: 10, platformDigest: p });
      crio.catalogue.set(`${r}@${p}`, { size: 10 });
      return { index: `${r}@${i}`, platform: `${r}@${p}` };
    },
    async digestImage(repo) {
      const ref = `${repoOf(repo)}@${digest()}`;
      crio.catalogue.set(ref, { size: 10 });
      return ref;
    },
    downloads: () => crio.downloadCount(),
    sighup: () => crio.sighup(),
    async startRefused() {
      const other = await startFakeCrio({ dropInDir, mainConfig: crio.mainConfig }).catch((e: Error) => e);
      if (other instanceof Error) return other.message;
      await other.stop();
      throw new Error('the stand-in started although it should have refused');
    },
    async close() {
      await crio.stop();
      await rm(root, { recursive: true, force: true });
    },
  };
});
