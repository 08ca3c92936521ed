// How CRI-O treats names, pins, reloads and its folder, as assertions that
// run unchanged against the CRI-O stand-in (test/integration, in `npm test`)
// and against a real CRI-O (test/crio, `npm run test:crio`): the same tests
// passing on both is what shows the stand-in behaves like the real runtime.
// Everything goes over the CRI socket, the drop-in folder and SIGHUP, as a
// node would see it.
import { after, before, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir, rm, symlink, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { stringify as toToml } from 'smol-toml';
import { CriClient } from './containerd.ts';

/** One CRI-O, real or stand-in, and images its registry serves. */
export interface CrioUnderTest {
  endpoint: string;
  dropInDir: string;
  /** crio.conf, read before the drop-ins. */
  mainConfig: string;
  /** A fresh image, reachable by `tag` and by `digestRef` (its manifest digest). */
  taggedImage(repo: string): Promise<{ tag: string; digestRef: string }>;
  /** A fresh multi-arch index: `index` by its index digest, `platform` by this node's platform manifest digest. */
  indexImage(repo: string): Promise<{ index: string; platform: string }>;
  /** A fresh single-manifest image, by digest. */
  digestImage(repo: string): Promise<string>;
  /** Layer downloads so far (a pull of stored content fetches a manifest and a config, no layer). */
  downloads(): number;
  /** `kill -HUP` the running CRI-O. */
  sighup(): void;
  /** Starts another CRI-O on the same configuration; resolves with why it refused to start, rejects if it started. */
  startRefused(): Promise<string>;
  close(): Promise<void>;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** CRI-O re-reads 10-40 ms after the signal; a refused reload is judged after this long. */
const SETTLE_MS = 500;
/** After this long a re-read has landed (several times CRI-O's 10-40 ms). */
const RELOADED_MS = 200;

export function crioBehaviour(name: string, open: () => Promise<CrioUnderTest | string>): void {
  describe(name, () => {
    let c: CrioUnderTest | undefined;
    let skip: string | undefined;
    let cri: CriClient;
    before(async () => {
      const r = await open();
      if (typeof r === 'string') skip = r;
      else {
        c = r;
        cri = new CriClient(c.endpoint);
      }
    });
    after(async () => {
      cri?.close();
      await c?.close();
    });
    beforeEach(async () => {
      if (!c) return;
      await rm(c.dropInDir, { recursive: true, force: true });
      await mkdir(c.dropInDir);
    });

    const pins = (patterns: string[]) => toToml({ crio: { image: { pinned_images: patterns } } }) + '\n';
    const writePins = (file: string, patterns: string[]) => writeFile(join(c!.dropInDir, file), pins(patterns));
    const pinnedNow = async (ref: string) => (await cri.imageStatus(ref))?.pinned;
    /**
     * SIGHUP, then wait for `ref` to report `want`, and for the re-read to
     * have landed even when `ref` already reported it (so no re-read is
     * still pending when the test changes the folder again).
     */
    const reloadUntil = async (ref: string, want: boolean) => {
      const signalled = Date.now();
      c!.sighup();
      const deadline = signalled + 10_000;
      while ((await pinnedNow(ref)) !== want) {
        assert.ok(Date.now() < deadline, `${ref} did not become pinned=${want} after a reload`);
        await sleep(10);
      }
      await sleep(Math.max(0, signalled + RELOADED_MS - Date.now()));
    };
    /** SIGHUP, give CRI-O ample time to re-read, and check `ref` reports `want` (for a state a reload must not change). */
    const reloadThenCheck = async (ref: string, want: boolean) => {
      c!.sighup();
      await sleep(SETTLE_MS);
      assert.equal(await pinnedNow(ref), want, `${ref} pinned=${want} after a reload`);
    };
    /**
     * What PullImage answers for `ref`: repo@digest of the manifest pulled
     * up to CRI-O 1.35.1 (the stand-in's 1.32.13 among them); the image's
     * ID, as ImageStatus gives it, from 1.35.2 and 1.36.0 (cri-o commit
     * aed9671d, "Return image ID from PullImage instead of repo digest",
     * backported to release-1.35).
     */
    const pullAnswer = async (ref: string, manifestRef: string) => {
      const v = (await cri.version()).runtimeVersion.split(/[.-]/).map(Number);
      const answersId = v[0]! > 1 || v[1]! > 35 || (v[1] === 35 && v[2]! >= 2);
      return answersId ? (await cri.imageStatus(ref))?.id : manifestRef;
    };
    const run = (title: string, fn: () => Promise<void>) =>
      test(title, async (t) => {
        if (skip) return t.skip(skip);
        await fn();
      });

    run('a pull by tag stores repo:tag only: a pin of its digest does not pin it; a pull by digest adds the name, downloads no layer, and pins it', async () => {
      const { tag, digestRef } = await c!.taggedImage('names/bytag');
      await cri.pullImage(tag);
      const listed = await cri.imageStatus(digestRef);
      assert.ok(listed, 'ImageStatus finds it by digest');
      assert.deepEqual(listed.repoDigests, [digestRef], 'repo_digests show the digest reference all the same');
      assert.deepEqual(listed.repoTags, [tag]);
      await writePins('50-pins', [digestRef]);
      await reloadThenCheck(digestRef, false); // applied, but the name is missing
      const downloads = c!.downloads();
      assert.equal(await cri.pullImage(digestRef), await pullAnswer(digestRef, digestRef), 'PullImage answers repo@manifest digest, or the image ID from CRI-O 1.35.2');
      assert.equal(c!.downloads(), downloads, 'no layer downloaded');
      assert.equal(await pinnedNow(digestRef), true);
      const again = await cri.imageStatus(digestRef);
      assert.deepEqual([again?.repoTags, again?.repoDigests], [[tag], [digestRef]], 'the CRI answer does not show the added name');
    });

    run('an index pulled by its index digest lists index and platform digests; a platform pin pins it only once the platform digest is pulled', async () => {
      const { index, platform } = await c!.indexImage('names/multi');
      assert.equal(await cri.pullImage(index), await pullAnswer(index, platform), 'PullImage answers the platform manifest reference, or the image ID from CRI-O 1.35.2');
      const img = await cri.imageStatus(index);
      assert.deepEqual(img?.repoDigests, [index, platform].sort());
      assert.match(img?.id ?? '', /^[0-9a-f]{64}$/, 'Image.id is the config digest without sha256:');
      await writePins('50-pins', [platform]);
      await reloadThenCheck(platform, false);
      const downloads = c!.downloads();
      await cri.pullImage(platform);
      assert.equal(c!.downloads(), downloads, 'no layer downloaded');
      assert.equal(await pinnedNow(platform), true);
    });

    run('the reverse: the platform manifest pulled, then the index: one image, pinned by the index pin', async () => {
      const { index, platform } = await c!.indexImage('names/rev');
      await cri.pullImage(platform);
      assert.deepEqual((await cri.imageStatus(platform))?.repoDigests, [platform]);
      await writePins('50-pins', [index]);
      c!.sighup();
      const downloads = c!.downloads();
      await cri.pullImage(index);
      assert.equal(c!.downloads(), downloads, 'no layer downloaded');
      await reloadUntil(index, true);
      assert.equal((await cri.listImages()).filter((i) => i.repoDigests.includes(platform)).length, 1);
    });

    run('patterns match stored names: prefix* unanchored, *kw* anywhere, exact case-insensitively; a bare repo or a tag pins nothing', async () => {
      const glob = await c!.digestImage('org/glob');
      await cri.pullImage(glob);
      const repo = glob.slice(0, glob.indexOf('@'));
      for (const pattern of ['org/gl*', '*GLOB*', glob.toUpperCase().replace('SHA256', 'sha256')]) {
        await writePins('50-pins', [pattern]);
        await reloadUntil(glob, true);
        await writePins('50-pins', []);
        await reloadUntil(glob, false);
      }
      for (const pattern of [repo, `${repo}:v1`, glob.slice(0, -10)]) {
        await writePins('50-pins', [pattern]);
        await reloadThenCheck(glob, false);
      }
    });

    run('the last file that sets pinned_images wins, in byte order, dotfiles and subfolders included, crio.conf first', async () => {
      const a = await c!.digestImage('order/a');
      const b = await c!.digestImage('order/b');
      await cri.pullImage(a);
      await cri.pullImage(b);
      await writePins('.hidden', [a]);
      await reloadUntil(a, true);
      await writePins('50-pins', [b]);
      await reloadUntil(a, false);
      assert.equal(await pinnedNow(b), true);
      await mkdir(join(c!.dropInDir, 'sub'));
      await writePins('sub/x', [a]);
      await reloadUntil(a, true);
      assert.equal(await pinnedNow(b), false, 'sub/x sorts after 50-pins and replaces its list');
      await rm(join(c!.dropInDir, 'sub'), { recursive: true });
      await writePins('50-pins.conf', [a]);
      await reloadUntil(a, true);
      assert.equal(await pinnedNow(b), false, '50-pins.conf sorts after 50-pins');
    });

    run('a reload is refused, the old list kept, by an unparsable file, a wrong type, a dangling link, a link to a folder; fixed, the next one applies', async () => {
      const a = await c!.digestImage('refuse/a');
      await cri.pullImage(a);
      await writePins('50-pins', [a]);
      await reloadUntil(a, true);
      await writePins('60-none', []);
      const bad: [string, () => Promise<void>][] = [
        ['10-bad', () => writeFile(join(c!.dropInDir, '10-bad'), '[crio.image\npinned_images = [')],
        ['10-wrongtype', () => writeFile(join(c!.dropInDir, '10-wrongtype'), '[crio.image]\npinned_images = "notalist"\n')],
        ['99-dangling', () => symlink(join(dirname(c!.dropInDir), 'nowhere'), join(c!.dropInDir, '99-dangling'))],
        ['20-dirlink', () => symlink(dirname(c!.dropInDir), join(c!.dropInDir, '20-dirlink'))],
      ];
      for (const [file, make] of bad) {
        await make();
        await reloadThenCheck(a, true);
        await rm(join(c!.dropInDir, file));
      }
      await reloadUntil(a, false);
    });

    run('CRI-O refuses to start with an unparsable drop-in or a dangling link', async () => {
      await writeFile(join(c!.dropInDir, '.50-half-written.tmp'), '[crio.image]\npinned_images = ["unterminated');
      assert.match(await c!.startRefused(), /50-half-written/);
      await rm(join(c!.dropInDir, '.50-half-written.tmp'));
      await symlink(join(dirname(c!.dropInDir), 'nowhere'), join(c!.dropInDir, '99-dangling'));
      assert.match(await c!.startRefused(), /99-dangling|no such file/);
    });

    run('RemoveImage: a name is untagged while the image has others; by its last name or its id the image goes, pinned or not', async () => {
      const { tag, digestRef } = await c!.taggedImage('remove/web');
      await cri.pullImage(tag);
      await cri.pullImage(digestRef);
      await writePins('50-pins', [digestRef]);
      await reloadUntil(digestRef, true);
      await cri.removeImage(tag);
      assert.equal(await cri.imageStatus(tag), null, 'the tag is gone');
      assert.equal(await pinnedNow(digestRef), true, 'the image stays, pinned by its digest name');
      await cri.removeImage(digestRef);
      assert.equal(await cri.imageStatus(digestRef), null, 'a pinned image is removed without complaint');
      const other = await c!.digestImage('remove/byid');
      await cri.pullImage(other);
      const id = (await cri.imageStatus(other))!.id;
      await cri.removeImage(id);
      assert.equal(await cri.imageStatus(other), null);
    });
  });
}
