// The CRI-O stand-in is the oracle for the agent's pin and pull tests, so
// its own behaviour is checked here over the wire, with a plain grpc-js
// client: CRI-O's drop-in rules for pins, and runtime-like pull errors.
import { test, describe, before, after, beforeEach } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { stringify as toToml } from 'smol-toml';
import { LOADER_OPTIONS } from '../../src/cri/client.ts';
import { startFakeCrio, PROTO_PATH, type FakeCrio, type CriImage } from '../support/fake-crio.ts';

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
      runtimeHandlers: ['kata'],
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
    test('Version says cri-o 1.31.0, CRI v1', async () => {
      const v = await client.version();
      assert.equal(v.runtimeName, 'cri-o');
      assert.equal(v.runtimeVersion, '1.31.0');
      assert.equal(v.runtimeApiVersion, 'v1');
    });

    test('an image pulled from the catalogue is listed and has a status; others have none', async () => {
      const ref = await client.pull(APP);
      assert.match(ref, /^sha256:[0-9a-f]{64}$/);
      const listed = (await client.list()).find((i) => i.id === ref);
      assert.deepEqual(listed?.repoDigests, [APP]);
      assert.equal(listed?.size, 100);
      assert.equal((await client.status(APP))?.id, ref);
      assert.equal((await client.status(ref))?.id, ref, 'ImageStatus by id');
      assert.equal(await client.status(DB), null, 'absent is not an error');
    });

    test('a tag reference lands as a repo tag', async () => {
      await client.pull(TAGGED);
      assert.deepEqual((await client.status(TAGGED))?.repoTags, [TAGGED]);
    });

    test('a reference outside the catalogue: NOT_FOUND', async () => {
      await rejectsWithCode(client.pull(`quay.io/org/nope@sha256:${hex('f')}`), grpc.status.NOT_FOUND, /not found/);
    });

    test('credentials: none or wrong -> UNKNOWN with 401 Unauthorized; right -> pulled; auth recorded apart from the request', async () => {
      await rejectsWithCode(client.pull(PRIVATE), grpc.status.UNKNOWN, /401 Unauthorized/);
      await rejectsWithCode(client.pull(PRIVATE, { auth: { username: 'robot', password: 'wrong' } }), grpc.status.UNKNOWN, /401 Unauthorized/);
      await client.pull(PRIVATE, { auth: { auth: Buffer.from('robot:s3cret').toString('base64'), serverAddress: 'private.registry.test' } });
      assert.ok(await client.status(PRIVATE));

      const pulls = crio.calls.filter((c) => c.method === 'PullImage' && (c.request.image as { image: string }).image === PRIVATE);
      assert.equal(pulls.length, 3);
      assert.equal(pulls[0]!.auth, null);
      assert.equal(pulls[1]!.auth?.password, 'wrong');
      assert.equal(pulls[2]!.auth?.serverAddress, 'private.registry.test');
      for (const p of pulls) assert.ok(!('auth' in p.request), 'the request record carries no credentials');
    });

    test('runtime handler: a configured one is stored with the image, an unknown one is refused', async () => {
      await client.pull(DB, { runtimeHandler: 'kata' });
      const img = (await client.list()).find((i) => i.repoDigests.includes(DB) && i.spec.runtimeHandler === 'kata');
      assert.ok(img, 'stored under the kata handler');
      await rejectsWithCode(client.pull(DB, { runtimeHandler: 'gvisor' }), grpc.status.UNKNOWN, /runtime handler "gvisor"/);
    });

    test('RemoveImage removes and is idempotent; ImageFsInfo counts stored bytes at a real mountpoint', async () => {
      await client.pull(BASE);
      const before = await client.fsInfo();
      await client.remove(BASE);
      await client.remove(BASE);
      assert.equal(await client.status(BASE), null);
      const after = await client.fsInfo();
      assert.equal(before.imageFilesystems[0].fsId.mountpoint, crio.imageFsMountpoint);
      assert.equal(before.imageFilesystems[0].usedBytes.value - after.imageFilesystems[0].usedBytes.value, 300);
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
      await assert.rejects(crio.reload(), /pinned_images must be an array of strings/);
    });

    test('the pause image is always pinned', async () => {
      crio.catalogue.set(crio.pauseImage, { size: 1 });
      crio.preload(crio.pauseImage);
      assert.equal(await pinned(client, crio.pauseImage), true);
    });
  });
});
