// The CRI-O stand-in is the oracle for the agent's pin and pull tests, so
// its own behaviour is checked here over the wire, with a plain grpc-js
// client: each behaviour observed on a real CRI-O 1.32.13
// (facts/crio-pinning.md) has a test: stored names apart from repo digests,
// pins matched against stored names, CRI-O's drop-in rules, reloads that end
// after the signal and may be refused, start-up, runtime-like pull errors.
import { test, describe, before, after, beforeEach } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm, stat, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { stringify as toToml } from 'smol-toml';
import { LOADER_OPTIONS } from '../support/cri-proto.ts';
import { startFakeCrio, PROTO_PATH, CRIO_VERSION, FakeCrio as FakeCrioClass, type FakeCrio, type CriImage } from '../support/fake-crio.ts';

const hex = (c: string) => c.repeat(64);
const APP = `quay.io/org/app@sha256:${hex('a')}`;
const DB = `quay.io/org/db@sha256:${hex('b')}`;
const BASE = `registry.example.com/base/ubi@sha256:${hex('c')}`;
const MIRRORED_BASE = `mirror.test/registry.example.com/base/ubi@sha256:${hex('d')}`;
const TAGGED = 'registry.example.com/tools/debug:1.0';
const PRIVATE = `private.registry.test/team/secret@sha256:${hex('e')}`;

// ---- a small CRI client of this file's own

type Unary = (req: object, opts: { deadline?: number } | grpc.Metadata, cb: (err: grpc.ServiceError | null, res: any) => void) => grpc.ClientUnaryCall;

class CriTestClient {
  readonly images: grpc.Client & Record<string, Unary>;
  readonly runtime: grpc.Client & Record<string, Unary>;
  constructor(endpoint: string) {
    // The options the production CRI client uses.
    const def = protoLoader.loadSync(PROTO_PATH, LOADER_OPTIONS);
    const v1 = (grpc.loadPackageDefinition(def).runtime as grpc.GrpcObject).v1 as grpc.GrpcObject;
    const creds = grpc.credentials.createInsecure();
    this.images = new (v1.ImageService as grpc.ServiceClientConstructor)(endpoint, creds) as grpc.Client & Record<string, Unary>;
    this.runtime = new (v1.RuntimeService as grpc.ServiceClientConstructor)(endpoint, creds) as grpc.Client & Record<string, Unary>;
  }
  call<T = any>(client: grpc.Client & Record<string, Unary>, method: string, req: object, signal?: AbortSignal): Promise<T> {
    return new Promise((resolve, reject) => {
      const c = client[method]!.call(client, req, { deadline: Date.now() + 10_000 }, (err, res) => (err ? reject(err) : resolve(res)));
      signal?.addEventListener('abort', () => c.cancel(), { once: true });
    });
  }
  version() {
    return this.call(this.runtime, 'version', { version: 'v1' });
  }
  list(): Promise<CriImage[]> {
    return this.call<{ images: CriImage[] }>(this.images, 'listImages', {}).then((r) => r.images);
  }
  status(image: string): Promise<CriImage | null> {
    return this.call<{ image: CriImage | null }>(this.images, 'imageStatus', { image: { image } }).then((r) => r.image);
  }
  pull(image: string, opts: { auth?: object; runtimeHandler?: string; signal?: AbortSignal } = {}): Promise<string> {
    const req = { image: { image, runtimeHandler: opts.runtimeHandler ?? '' }, auth: opts.auth };
    return this.call<{ imageRef: string }>(this.images, 'pullImage', req, opts.signal).then((r) => r.imageRef);
  }
  remove(image: string) {
    return this.call(this.images, 'removeImage', { image: { image } });
  }
  fsInfo() {
    return this.call(this.images, 'imageFsInfo', {});
  }
  close() {
    this.images.close();
    this.runtime.close();
  }
}

async function rejectsWithCode(p: Promise<unknown>, code: grpc.status, text?: RegExp): Promise<void> {
  await assert.rejects(p, (err: grpc.ServiceError) => {
    assert.equal(err.code, code, `expected ${grpc.status[code]}, got ${grpc.status[err.code]}: ${err.details}`);
    if (text) assert.match(err.details, text);
    return true;
  });
}

const pinned = async (client: CriTestClient, ref: string) => (await client.status(ref))?.pinned;

// ----

describe('fake CRI-O', () => {
  let root: string;
  let dropIn: string;
  let crio: FakeCrio;
  let client: CriTestClient;

  before(async () => {
    root = await mkdtemp(join(tmpdir(), 'pinset-fake-crio-test-'));
    dropIn = join(root, 'crio.conf.d');
    await mkdir(dropIn);
    crio = await startFakeCrio({
      dropInDir: dropIn,
      catalogue: {
        [APP]: { size: 100 },
        [DB]: { size: 200 },
        [BASE]: { size: 300 },
        [MIRRORED_BASE]: { size: 300 },
        [TAGGED]: { size: 50 },
        [PRIVATE]: { size: 10, needsAuth: { username: 'robot', password: 's3cret' } },
      },
    });
    client = new CriTestClient(crio.endpoint);
  });
  after(async () => {
    client?.close();
    await crio?.stop();
    await rm(root, { recursive: true, force: true });
  });

  const writePins = (file: string, patterns: string[]) => writeFile(join(dropIn, file), toToml({ crio: { image: { pinned_images: patterns } } }));

  describe('as a runtime', () => {
    test('Version says cri-o 1.32.13, CRI v1', async () => {
      const v = await client.version();
      assert.equal(v.runtimeName, 'cri-o');
      assert.equal(v.runtimeVersion, CRIO_VERSION);
      assert.equal(v.runtimeApiVersion, 'v1');
    });

    test('an image pulled from the catalogue is listed and has a status; others have none', async () => {
      // CRI-O answers PullImage with a digested reference, and Image.id is the config digest without "sha256:".
      assert.equal(await client.pull(APP), APP);
      const listed = (await client.list()).find((i) => i.repoDigests.includes(APP));
      assert.match(listed?.id ?? '', /^[0-9a-f]{64}$/);
      assert.deepEqual(listed?.repoDigests, [APP]);
      assert.equal(listed?.size, 100);
      assert.equal((await client.status(APP))?.id, listed?.id);
      assert.equal((await client.status(listed!.id))?.id, listed?.id, 'ImageStatus by id');
      assert.equal(await client.status(DB), null, 'absent is not an error');
    });

    test('a tag reference lands as a repo tag', async () => {
      await client.pull(TAGGED);
      assert.deepEqual((await client.status(TAGGED))?.repoTags, [TAGGED]);
    });

    test("a reference outside the catalogue: UNKNOWN, containers/image's \"manifest unknown\"", async () => {
      await rejectsWithCode(client.pull(`quay.io/org/nope@sha256:${hex('f')}`), grpc.status.UNKNOWN, /reading manifest sha256:f+ in quay\.io\/org\/nope: manifest unknown/);
    });

    test('credentials: none or wrong -> UNKNOWN "authentication required"; right -> pulled; auth recorded apart from the request', async () => {
      await rejectsWithCode(client.pull(PRIVATE), grpc.status.UNKNOWN, /authentication required/);
      await rejectsWithCode(client.pull(PRIVATE, { auth: { username: 'robot', password: 'wrong' } }), grpc.status.UNKNOWN, /authentication required/);
      await client.pull(PRIVATE, { auth: { auth: Buffer.from('robot:s3cret').toString('base64'), serverAddress: 'private.registry.test' } });
      assert.ok(await client.status(PRIVATE));

      const pulls = crio.calls.filter((c) => c.method === 'PullImage' && (c.request.image as { image: string }).image === PRIVATE);
      assert.equal(pulls.length, 3);
      assert.equal(pulls[0]!.auth, null);
      assert.equal(pulls[1]!.auth?.password, 'wrong');
      assert.equal(pulls[2]!.auth?.serverAddress, 'private.registry.test');
      for (const p of pulls) assert.ok(!('auth' in p.request), 'the request record carries no credentials');
    });

    test('the runtime handler of an ImageSpec is ignored, as CRI-O 1.32 ignores it', async () => {
      await client.pull(DB, { runtimeHandler: 'kata' });
      assert.equal((await client.list()).filter((i) => i.repoDigests.includes(DB)).length, 1, 'one image, whatever the handler');
      assert.ok(await client.status(DB), 'found without a handler');
      await client.remove(DB);
    });

    test('spec: unset in ListImages, annotations only in ImageStatus', async () => {
      await client.pull(APP);
      assert.equal((await client.list()).find((i) => i.repoDigests.includes(APP))?.spec, null);
      assert.deepEqual((await client.status(APP))?.spec, { image: '', annotations: {}, userSpecifiedImage: '', runtimeHandler: '', imageRef: '' });
    });

    test('sha256:<id> is a short name to CRI-O (an error); the bare id and a unique prefix of it find the image', async () => {
      await client.pull(APP);
      const id = (await client.status(APP))!.id;
      await rejectsWithCode(client.status(`sha256:${id}`), grpc.status.UNKNOWN, /short-name/);
      assert.equal((await client.status(id.slice(0, 12)))?.id, id);
    });

    test('RemoveImage removes and is idempotent; ImageFsInfo names a real mountpoint, in both lists', async () => {
      await client.pull(BASE);
      await client.remove(BASE);
      await client.remove(BASE);
      assert.equal(await client.status(BASE), null);
      const fs = await client.fsInfo();
      assert.equal(fs.imageFilesystems[0].fsId.mountpoint, crio.imageFsMountpoint);
      assert.deepEqual(fs.containerFilesystems, fs.imageFilesystems);
    });

    test('injected failures hit the next N pulls of that reference only', async () => {
      crio.failPulls(BASE, { times: 2, code: grpc.status.UNAVAILABLE, message: 'registry unavailable' });
      await rejectsWithCode(client.pull(BASE), grpc.status.UNAVAILABLE, /registry unavailable/);
      await client.pull(APP);
      await rejectsWithCode(client.pull(BASE), grpc.status.UNAVAILABLE);
      await client.pull(BASE);
      assert.ok(await client.status(BASE));
    });

    test('a held pull cancelled by the client is recorded and never lands', async () => {
      await client.remove(DB);
      crio.holdPulls();
      try {
        const ac = new AbortController();
        const pull = client.pull(DB, { signal: ac.signal });
        await crio.waitForHeldPulls(1);
        assert.deepEqual(crio.heldPulls(), [DB]);
        ac.abort();
        await rejectsWithCode(pull, grpc.status.CANCELLED);
        while (crio.cancelled.length === 0) await new Promise((r) => setTimeout(r, 10));
        assert.deepEqual(crio.cancelled.at(-1), { method: 'PullImage', image: DB });
      } finally {
        crio.releasePulls();
      }
      await new Promise((r) => setTimeout(r, 20));
      assert.equal(await client.status(DB), null);
    });

    test('held pulls complete once released', async () => {
      crio.holdPulls();
      const pull = client.pull(DB);
      await crio.waitForHeldPulls(1);
      crio.releasePulls();
      await pull;
      assert.ok(await client.status(DB));
    });

    test('stopServing: held pulls are cut off and never land; calls get UNAVAILABLE; resume on the same socket: images still there', async () => {
      await client.remove(TAGGED);
      crio.holdPulls();
      const pull = client.pull(TAGGED);
      await crio.waitForHeldPulls(1);
      const cancelledBefore = crio.cancelled.length;
      crio.stopServing();
      crio.releasePulls();
      await assert.rejects(pull);
      assert.deepEqual(crio.cancelled.slice(cancelledBefore), [{ method: 'PullImage', image: TAGGED }]);
      await rejectsWithCode(client.list(), grpc.status.UNAVAILABLE);
      await crio.resume();
      // grpc-js reconnects with backoff; the first call after resume may still see the old failure.
      let images: CriImage[] | undefined;
      for (let i = 0; i < 50 && !images; i++) {
        images = await client.list().catch(() => undefined);
        if (!images) await new Promise((r) => setTimeout(r, 100));
      }
      assert.ok(images?.some((i) => i.repoDigests.includes(APP)));
      assert.ok(!images?.some((i) => i.repoTags.includes(TAGGED)), 'the cut-off pull did not land');
    });
  });

  describe('pins by CRI-O rules', () => {
    beforeEach(async () => {
      await rm(dropIn, { recursive: true, force: true });
      await mkdir(dropIn);
      for (const ref of [APP, DB, BASE, MIRRORED_BASE, TAGGED]) crio.preload(ref);
      await crio.reload();
    });

    test('nothing changes until reload()', async () => {
      await writePins('50-pins', [APP]);
      assert.equal(await pinned(client, APP), false);
      assert.deepEqual(crio.pinnedPatterns(), []);
      await crio.reload();
      assert.equal(await pinned(client, APP), true);
      assert.equal(await pinned(client, DB), false);
      assert.ok((await client.list()).find((i) => i.repoDigests.includes(APP))?.pinned, 'ListImages reports it too');
    });

    test('a later file replaces an earlier one, in byte order, whatever the suffix', async () => {
      await writePins('50-admin.conf', [APP]);
      await writePins('60-agent', [DB]);
      await crio.reload();
      assert.deepEqual(crio.pinnedPatterns(), [DB]);
      assert.equal(await pinned(client, APP), false, "the earlier file's list is replaced, not merged");
      assert.equal(await pinned(client, DB), true);

      // Uppercase sorts before lowercase in byte order: "Z" < "a".
      await rm(join(dropIn, '60-agent'));
      await writePins('Z-late', [DB]);
      await writePins('a-later', [APP]);
      await crio.reload();
      assert.deepEqual(crio.pinnedPatterns(), [APP]);
    });

    test('a later file without pinned_images leaves the list alone; an empty list unpins', async () => {
      await writePins('50-pins', [APP]);
      await writeFile(join(dropIn, '70-other'), toToml({ crio: { runtime: { log_level: 'info' } } }));
      await crio.reload();
      assert.equal(await pinned(client, APP), true);
      await writePins('80-empty', []);
      await crio.reload();
      assert.equal(await pinned(client, APP), false);
    });

    test('hidden files and files in subfolders are read too, as filepath.Walk visits them', async () => {
      await writePins('50-pins', [APP]);
      await writePins('.60-pins.tmp', [DB]);
      await crio.reload();
      assert.deepEqual(crio.pinnedPatterns(), [APP], '"." sorts before digits, so the hidden file comes first');
      await mkdir(join(dropIn, '90-sub'));
      await writePins(join('90-sub', 'pins'), [BASE]);
      await crio.reload();
      assert.deepEqual(crio.pinnedPatterns(), [BASE]);
    });

    test('prefix* is a glob', async () => {
      await writePins('50-pins', ['registry.example.com/base/*']);
      await crio.reload();
      assert.equal(await pinned(client, BASE), true);
      assert.equal(await pinned(client, TAGGED), false);
      assert.equal(await pinned(client, APP), false);
      // CRI-O's glob regexp is not anchored at the start.
      assert.equal(await pinned(client, MIRRORED_BASE), true);
    });

    test('*keyword* matches anywhere in a name', async () => {
      await writePins('50-pins', ['*org/d*']);
      await crio.reload();
      assert.equal(await pinned(client, DB), true);
      assert.equal(await pinned(client, APP), false);
    });

    test('matching is case-insensitive; anything else is an exact match', async () => {
      await writePins('50-pins', [APP.toUpperCase().replace('SHA256', 'sha256'), 'REGISTRY.EXAMPLE.COM/TOOLS/DEBUG:1.0', 'quay.io/org/db']);
      await crio.reload();
      assert.equal(await pinned(client, APP), true);
      assert.equal(await pinned(client, TAGGED), true, 'tags are names too');
      assert.equal(await pinned(client, DB), false, 'an exact pattern is not a prefix');
    });

    test('a file that does not parse fails the reload and keeps the old pins', async () => {
      await writePins('50-pins', [APP]);
      await crio.reload();
      await writeFile(join(dropIn, '60-broken'), 'pinned_images = ["unterminated');
      await writePins('70-more', [DB]);
      await assert.rejects(crio.reload(), /60-broken/);
      assert.deepEqual(crio.pinnedPatterns(), [APP]);
      assert.equal(await pinned(client, APP), true);
      assert.equal(await pinned(client, DB), false);
    });

    test('pinned_images of the wrong type fails the reload too', async () => {
      await writeFile(join(dropIn, '50-pins'), toToml({ crio: { image: { pinned_images: APP } } }));
      await assert.rejects(crio.reload(), /crio\.image\.pinned_images: incompatible types/);
    });

    test('the pause image is always pinned', async () => {
      crio.catalogue.set(crio.pauseImage, { size: 1 });
      crio.preload(crio.pauseImage);
      assert.equal(await pinned(client, crio.pauseImage), true);
    });
  });
  describe('stored names, as containers/storage keeps them', () => {
    const M = `sha256:${hex('1')}`;
    const WEB_TAG = 'registry.example.com/names/web:v1';
    const WEB_DIGEST = `registry.example.com/names/web@${M}`;
    const WEB_ELSEWHERE = `registry.example.com/elsewhere/web@${M}`;
    const PLATFORM_DIGEST = `sha256:${hex('3')}`;
    const INDEX = `registry.example.com/names/multi@sha256:${hex('2')}`;
    const PLATFORM = `registry.example.com/names/multi@${PLATFORM_DIGEST}`;

    beforeEach(async () => {
      crio.catalogue.set(WEB_TAG, { size: 10, digest: M });
      crio.catalogue.set(WEB_DIGEST, { size: 10 });
      crio.catalogue.set(INDEX, { size: 20, platformDigest: PLATFORM_DIGEST });
      crio.catalogue.set(PLATFORM, { size: 20 });
      for (const r of [WEB_TAG, WEB_DIGEST, INDEX, PLATFORM]) crio.evict(r);
      await rm(dropIn, { recursive: true, force: true });
      await mkdir(dropIn);
      await crio.reload();
    });

    test('a pull by tag stores repo:tag only; repo_digests still show repo@digest, and a digest pin does not pin it', async () => {
      const downloads = crio.downloadCount();
      await client.pull(WEB_TAG);
      assert.equal(crio.downloadCount(), downloads + 1);
      assert.deepEqual(crio.storedNames(WEB_TAG), [WEB_TAG]);
      const listed = (await client.list()).find((i) => i.repoTags.includes(WEB_TAG));
      assert.deepEqual(listed?.repoDigests, [WEB_DIGEST], 'names x digests: a digested reference that was never stored');
      assert.equal((await client.status(WEB_DIGEST))?.id, listed?.id, 'ImageStatus finds it by digest within its repo');
      assert.equal(await client.status(WEB_ELSEWHERE), null, 'but not under another repo');

      await writePins('50-pins', [WEB_DIGEST]);
      await crio.reload();
      assert.equal(await pinned(client, WEB_DIGEST), false, 'CRI-O matches stored names, not repo_digests');
    });

    test('a pull of content already stored adds the name and downloads nothing: from then on the digest pin matches', async () => {
      await client.pull(WEB_TAG);
      await writePins('50-pins', [WEB_DIGEST]);
      await crio.reload();
      const downloads = crio.downloadCount();
      assert.equal(await client.pull(WEB_DIGEST), WEB_DIGEST);
      assert.equal(crio.downloadCount(), downloads, 'no download');
      assert.deepEqual(crio.storedNames(WEB_DIGEST), [WEB_TAG, WEB_DIGEST]);
      assert.equal(await pinned(client, WEB_DIGEST), true);
      assert.equal((await client.list()).filter((i) => i.repoDigests.includes(WEB_DIGEST)).length, 1, 'still one image');
    });

    test('an index pulled by its index digest is stored under that name only; repo_digests list index and platform', async () => {
      assert.equal(await client.pull(INDEX), PLATFORM, "PullImage answers with the platform manifest's reference");
      assert.deepEqual(crio.storedNames(INDEX), [INDEX]);
      const listed = (await client.list()).find((i) => i.repoDigests.includes(INDEX));
      assert.deepEqual(listed?.repoDigests, [INDEX, PLATFORM].sort());
      assert.deepEqual(listed?.repoTags, []);
      await writePins('50-pins', [PLATFORM]);
      await crio.reload();
      assert.equal(await pinned(client, PLATFORM), false, 'a pin of the platform digest does not match');
      const downloads = crio.downloadCount();
      await client.pull(PLATFORM);
      assert.equal(crio.downloadCount(), downloads, 'the platform pull downloads nothing');
      assert.equal(await pinned(client, PLATFORM), true);
    });

    test('and the reverse: platform first, then the index: one download, both names', async () => {
      const downloads = crio.downloadCount();
      await client.pull(PLATFORM);
      assert.deepEqual((await client.status(PLATFORM))?.repoDigests, [PLATFORM]);
      assert.equal(await client.status(INDEX), null, 'the index digest is not among its digests yet');
      await client.pull(INDEX);
      assert.equal(crio.downloadCount(), downloads + 1);
      assert.deepEqual(crio.storedNames(PLATFORM), [PLATFORM, INDEX]);
      await writePins('50-pins', [INDEX]);
      await crio.reload();
      assert.equal(await pinned(client, INDEX), true);
    });

    test('RemoveImage by a name untags it while the image has other names; the last name removes the image', async () => {
      await client.pull(WEB_TAG);
      await client.pull(WEB_DIGEST);
      await writePins('50-pins', [WEB_DIGEST]);
      await crio.reload();
      await client.remove(WEB_TAG);
      assert.deepEqual(crio.storedNames(WEB_DIGEST), [WEB_DIGEST], 'only the tag went');
      assert.equal(await pinned(client, WEB_DIGEST), true);
      assert.equal(await client.status(WEB_TAG), null);
      await client.remove(WEB_DIGEST);
      assert.equal(await client.status(WEB_DIGEST), null);
    });

    test('RemoveImage removes a pinned image without complaint', async () => {
      await client.pull(WEB_DIGEST);
      await writePins('50-pins', [WEB_DIGEST]);
      await crio.reload();
      assert.equal(await pinned(client, WEB_DIGEST), true);
      await client.remove(WEB_DIGEST);
      assert.equal(await client.status(WEB_DIGEST), null);
    });
  });

  describe('reading the folder as CRI-O does', () => {
    beforeEach(async () => {
      await rm(dropIn, { recursive: true, force: true });
      await mkdir(dropIn);
      for (const ref of [APP, DB]) crio.preload(ref);
      await rm(join(root, 'crio.conf'), { force: true });
      await crio.reload();
    });
    after(() => rm(join(root, 'crio.conf'), { force: true }));

    test('crio.conf is read before the drop-ins', async () => {
      await writeFile(join(root, 'crio.conf'), toToml({ crio: { image: { pinned_images: [APP] } } }));
      await crio.reload();
      assert.deepEqual(crio.pinnedPatterns(), [APP]);
      await writePins('50-pins', [DB]);
      await crio.reload();
      assert.deepEqual(crio.pinnedPatterns(), [DB]);
    });

    test('a link to a file is read through; a dangling link, a link to a folder and a link loop each refuse the reload', async () => {
      await writeFile(join(root, 'target.conf'), toToml({ crio: { image: { pinned_images: [APP] } } }));
      await symlink(join(root, 'target.conf'), join(dropIn, '50-linked'));
      await crio.reload();
      assert.deepEqual(crio.pinnedPatterns(), [APP]);

      for (const [name, target] of [['60-dangling', join(root, 'nowhere')], ['60-folder', root], ['60-loop', join(dropIn, '60-loop')]] as const) {
        await symlink(target, join(dropIn, name));
        await writePins('70-more', [DB]);
        await assert.rejects(crio.reload(), (err: Error) => err.message.includes(name) || /ENOENT|EISDIR|ELOOP/.test(err.message), name);
        assert.deepEqual(crio.pinnedPatterns(), [APP], `${name}: the old list stays`);
        await rm(join(dropIn, name));
      }
    });
  });

  describe('reloads as systemd drives them, and start-up', () => {
    let own: string;
    const instances: FakeCrio[] = [];
    const start = async (opts: Partial<Parameters<typeof startFakeCrio>[0]> = {}) => {
      const c = await startFakeCrio({ dropInDir: join(own, 'crio.conf.d'), catalogue: { [APP]: { size: 1 } }, ...opts });
      instances.push(c);
      return c;
    };
    before(async () => {
      own = await mkdtemp(join(tmpdir(), 'pinset-fake-crio-reload-'));
      await mkdir(join(own, 'crio.conf.d'));
    });
    after(async () => {
      for (const c of instances) await c.stop();
      await rm(own, { recursive: true, force: true });
    });
    const ownPins = (file: string, patterns: string[]) => writeFile(join(own, 'crio.conf.d', file), toToml({ crio: { image: { pinned_images: patterns } } }));

    test('sighup() returns at once; the old list answers until the re-read 10-40 ms later', async () => {
      const c = await start();
      c.preload(APP);
      await ownPins('50-pins', [APP]);
      c.sighup();
      assert.equal(c.image(APP)?.pinned, false, 'right after the signal CRI-O still has the old list');
      await c.settled();
      assert.equal(c.image(APP)?.pinned, true);
      const rec = c.reloads.at(-1)!;
      assert.ok(rec.appliedAt! >= rec.signalledAt + 10, `re-read ${rec.appliedAt! - rec.signalledAt} ms after the signal`);
      await rm(join(own, 'crio.conf.d', '50-pins'));
    });

    test('a file it cannot decode refuses the reload: the old list stays and the error is recorded', async () => {
      const c = await start();
      c.preload(APP);
      await ownPins('50-pins', [APP]);
      await c.reload();
      await writeFile(join(own, 'crio.conf.d', '60-broken'), '[crio.image\npinned_images = [');
      try {
        await ownPins('70-none', []);
        c.sighup();
        await c.settled();
        assert.match(c.reloads.at(-1)!.error ?? '', /Unable to reload configuration: .*60-broken/);
        assert.equal(c.image(APP)?.pinned, true, 'the old list stays');
        await assert.rejects(start(), /60-broken/, 'and CRI-O refuses to start with it');
      } finally {
        await rm(join(own, 'crio.conf.d', '60-broken'));
        await rm(join(own, 'crio.conf.d', '70-none'));
        await rm(join(own, 'crio.conf.d', '50-pins'));
      }
    });

    test('refuseReloads: a reload broken outside the folder keeps the old list too', async () => {
      const c = await start();
      c.preload(APP);
      await ownPins('50-pins', [APP]);
      c.refuseReloads();
      try {
        c.sighup();
        await c.settled();
        assert.match(c.reloads.at(-1)!.error ?? '', /Unable to reload configuration: system registries reload failed/);
        assert.equal(c.image(APP)?.pinned, false);
        c.acceptReloads();
        c.sighup();
        await c.settled();
        assert.equal(c.image(APP)?.pinned, true);
      } finally {
        await rm(join(own, 'crio.conf.d', '50-pins'));
      }
    });

    test('a dangling link refuses the start', async () => {
      await symlink(join(own, 'nowhere'), join(own, 'crio.conf.d', '10-dangling'));
      try {
        await assert.rejects(start(), /ENOENT/);
      } finally {
        await rm(join(own, 'crio.conf.d', '10-dangling'));
      }
    });

    test('a SIGHUP once the socket exists but before CRI-O answers kills it (exit 129); once it answers, a SIGHUP is safe', async () => {
      const dir = await mkdtemp(join(tmpdir(), 'pinset-fake-crio-early-'));
      const c = new FakeCrioClass(dir, { dropInDir: join(own, 'crio.conf.d'), startupMs: 300 });
      instances.push(c);
      const starting = c.start();
      while (!(await stat(c.socketPath).then(() => true, () => false))) await new Promise((r) => setTimeout(r, 5));
      c.sighup();
      await assert.rejects(starting, /died while starting \(exit 129\)/);
      assert.equal(c.exitCode, 129);
      assert.equal(c.running, false);
      await c.start();
      const cli = new CriTestClient(c.endpoint);
      try {
        assert.equal((await cli.version()).runtimeName, 'cri-o');
        c.sighup();
        await c.settled();
        assert.equal(c.serving, true);
        assert.equal(c.reloads.at(-1)!.error, undefined);
      } finally {
        cli.close();
      }
    });
  });
});
