// How containerd keeps image records and their labels, and when CRI reports
// an image `pinned`, as assertions that run unchanged against the twin
// (test/integration/containerd-behaviour.test.ts) and against the real
// containerd 1.7.24 and 1.6.20 (test/e2e/containerd-behaviour.test.ts): the
// same tests passing on both is what shows the twin behaves like the real
// daemon. Everything goes over the one socket, CRI and the Images service,
// as a node agent would see it; the clients are the tests' own.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { CriClient } from './containerd.ts';
import { ImagesClient } from './containerd-proto.ts';
import { diesOnUpdateWithoutTarget, pinBehaviourOf } from './fake-containerd.ts';

/** One containerd, real or twin, and images its registry serves. */
export interface ContainerdUnderTest {
  endpoint: string;
  /** The version it reports, e.g. "1.7.24~ds1". */
  version: string;
  /** A fresh image, reachable by `tag` and by `digestRef`; `id` is its config digest (sha256:...). */
  taggedImage(repo: string): Promise<{ tag: string; digestRef: string; id: string }>;
  /** Stop and start on the same store. */
  restart(): Promise<void>;
  /** The process is alive (and, for the twin, serving). */
  running(): boolean;
  close(): Promise<void>;
}

const PIN = 'io.cri-containerd.pinned';
const MANAGED = { 'io.cri-containerd.image': 'managed' };
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** The pin follows a label within a few ms on 1.7.24; this is ample. */
const PIN_FOLLOWS_MS = 2_000;
/** Where a version must NOT pin, it is given this long to show it does not. */
const NO_PIN_SETTLE_MS = 500;

const hasCode = (code: number, re?: RegExp) => (err: grpc.ServiceError) => {
  assert.equal(err.code, code, `${err.code} ${err.details}`);
  if (re) assert.match(err.details, re);
  return true;
};

export function containerdBehaviour(name: string, open: () => Promise<ContainerdUnderTest | string>): void {
  describe(name, () => {
    let c: ContainerdUnderTest | undefined;
    let skip: string | undefined;
    let cri: CriClient;
    let images: ImagesClient;
    let pins: boolean;
    before(async () => {
      const r = await open();
      if (typeof r === 'string') skip = r;
      else {
        c = r;
        cri = new CriClient(c.endpoint);
        images = new ImagesClient(c.endpoint);
        pins = pinBehaviourOf(c.version) === 'live';
      }
    });
    after(async () => {
      cri?.close();
      images?.close();
      await c?.close();
    });

    const run = (title: string, fn: () => Promise<void>) =>
      test(title, async (t) => {
        if (skip) return t.skip(skip);
        await fn();
      });
    const pinnedNow = async (ref: string) => (await cri.imageStatus(ref))?.pinned;
    /** Waits until CRI reports `want` for ref (or, where the version cannot pin, checks it stays false). */
    const expectPinned = async (ref: string, want: boolean) => {
      if (!pins) {
        await sleep(NO_PIN_SETTLE_MS);
        assert.equal(await pinnedNow(ref), false, `containerd ${c!.version} never reports pinned for a label set after the pull`);
        return;
      }
      const deadline = Date.now() + PIN_FOLLOWS_MS;
      while ((await pinnedNow(ref)) !== want) {
        assert.ok(Date.now() < deadline, `${ref} did not become pinned=${want} within ${PIN_FOLLOWS_MS} ms`);
        await sleep(5);
      }
    };
    const labelsOf = async (n: string) => (await images.get(n)).labels;

    run('a CRI pull by tag stores three records of one target (tag, repo@digest, the image ID), each labelled managed; CRI shows the tag and the digest, never the ID record', async () => {
      const img = await c!.taggedImage('records/bytag');
      assert.equal(await cri.pullImage(img.tag), img.id, 'PullImage answers the image ID');
      const names = (await images.list()).map((r) => r.name);
      for (const n of [img.tag, img.digestRef, img.id]) assert.ok(names.includes(n), `record ${n} in ${names.join(', ')}`);
      const records = await Promise.all([img.tag, img.digestRef, img.id].map((n) => images.get(n)));
      for (const r of records) {
        assert.deepEqual(r.labels, MANAGED, r.name);
        assert.equal(r.target?.digest, img.digestRef.split('@')[1], `${r.name} targets the manifest`);
        assert.ok(r.target && r.target.size > 0 && r.target.mediaType !== '', 'a full descriptor');
      }
      const s = await cri.imageStatus(img.tag);
      assert.equal(s?.id, img.id);
      assert.deepEqual(s?.repoTags, [img.tag]);
      assert.deepEqual(s?.repoDigests, [img.digestRef]);
      assert.equal((await cri.imageStatus(img.id))?.id, img.id, 'ImageStatus finds it by its ID');
    });

    run('Get: NOT_FOUND for an unknown name; without a namespace FAILED_PRECONDITION; another namespace does not see k8s.io', async () => {
      const img = await c!.taggedImage('records/ns');
      await cri.pullImage(img.digestRef);
      await assert.rejects(images.get('registry.test/none:v1'), hasCode(grpc.status.NOT_FOUND, /^image "registry\.test\/none:v1": not found$/));
      const bare = new ImagesClient(c!.endpoint, null);
      const other = new ImagesClient(c!.endpoint, 'default');
      try {
        await assert.rejects(bare.get(img.id), hasCode(grpc.status.FAILED_PRECONDITION, /namespace is required/));
        await assert.rejects(other.get(img.id), hasCode(grpc.status.NOT_FOUND));
        assert.equal((await other.list()).some((r) => r.name === img.id), false);
      } finally {
        bare.close();
        other.close();
      }
    });

    run('Update with a mask labels.<key> writes that label only: others and the target stay; an empty value deletes it; an unknown path is INVALID_ARGUMENT', async () => {
      const img = await c!.taggedImage('labels/mask');
      await cri.pullImage(img.tag);
      const before = await images.get(img.id);
      const r = await images.update({ name: img.id, labels: { 'a.test/one': '1', 'a.test/ignored': 'x' }, target: before.target }, ['labels.a.test/one']);
      assert.deepEqual(r.labels, { ...MANAGED, 'a.test/one': '1' }, 'a label in the request but not in the mask is not written');
      assert.deepEqual(r.target, before.target);
      await images.label(img.id, { 'a.test/two': '2' });
      assert.deepEqual(await labelsOf(img.id), { ...MANAGED, 'a.test/one': '1', 'a.test/two': '2' });
      await images.label(img.id, { 'a.test/one': '' });
      assert.deepEqual(await labelsOf(img.id), { ...MANAGED, 'a.test/two': '2' });
      // A key in the mask that the request does not carry is deleted too (its value is "").
      await images.update({ name: img.id, labels: {}, target: before.target }, ['labels.a.test/two']);
      assert.deepEqual(await labelsOf(img.id), MANAGED);
      assert.deepEqual(await labelsOf(img.tag), MANAGED, 'other records untouched');
      await assert.rejects(images.update({ name: img.id, labels: {}, target: before.target }, ['size']), hasCode(grpc.status.INVALID_ARGUMENT, /cannot update "size" field/));
      await assert.rejects(images.label('registry.test/none:v1', { a: 'b' }), hasCode(grpc.status.NOT_FOUND));
      const long = 'x'.repeat(4096);
      await assert.rejects(images.update({ name: img.id, labels: { k: long }, target: before.target }, ['labels.k']), hasCode(grpc.status.INVALID_ARGUMENT, /greater than maximum size/));
    });

    run('List filters: labels."key" (present), ==, ~= on the name, "," is AND, filters are ORed; a dotted key unquoted does not parse', async () => {
      const img = await c!.taggedImage('labels/filter');
      await cri.pullImage(img.tag);
      await images.label(img.id, { 'pinset.test/mark': 'agent' });
      const names = async (filters: string[]) => (await images.list(filters)).map((r) => r.name).sort();
      assert.deepEqual(await names(['labels."pinset.test/mark"']), [img.id]);
      assert.deepEqual(await names(['labels."pinset.test/mark"==agent']), [img.id]);
      assert.deepEqual(await names(['labels."pinset.test/mark"==other']), []);
      assert.deepEqual(await names(['labels."pinset.test/mark",name~=^sha256:']), [img.id]);
      assert.deepEqual(await names(['labels."pinset.test/mark"', `name==${img.tag}`]), [img.tag, img.id].sort());
      await assert.rejects(images.list(['labels.pinset.test/mark']), hasCode(grpc.status.INVALID_ARGUMENT, /parse error/));
      await assert.rejects(images.list(['labels."unterminated']), hasCode(grpc.status.INVALID_ARGUMENT, /quoted literal not terminated/));
    });

    run('the pin label on the image-ID record: CRI reports the image pinned (1.6.25+, 1.7.10+, 2.x) under every name; only the value "pinned" pins; removing it unpins', async () => {
      const img = await c!.taggedImage('pin/id');
      await cri.pullImage(img.tag);
      assert.equal(await pinnedNow(img.tag), false);
      await images.label(img.id, { [PIN]: 'true' });
      await sleep(NO_PIN_SETTLE_MS);
      assert.equal(await pinnedNow(img.tag), false, 'io.cri-containerd.pinned=true does not pin');
      await images.label(img.id, { [PIN]: 'pinned' });
      await expectPinned(img.tag, true);
      if (pins) {
        assert.equal(await pinnedNow(img.digestRef), true);
        assert.equal((await cri.listImages()).find((i) => i.id === img.id)?.pinned, true, 'ListImages too');
      }
      await images.label(img.id, { [PIN]: '' });
      await expectPinned(img.tag, false);
    });

    run('a pull rewrites the pulled reference: a label on the tag is wiped by a pull of the tag, while the image-ID record keeps its labels through pulls by tag and by digest, and the pin holds', async () => {
      const img = await c!.taggedImage('pin/repull');
      await cri.pullImage(img.tag);
      await images.label(img.tag, { 'hand.test/note': 'kept?' });
      await images.label(img.digestRef, { 'hand.test/note': 'kept?' });
      await images.label(img.id, { [PIN]: 'pinned', 'pinset.test/mark': 'agent' });
      await expectPinned(img.tag, true);
      await cri.pullImage(img.tag);
      assert.deepEqual(await labelsOf(img.tag), MANAGED, 'the tag record was rewritten whole');
      assert.deepEqual(await labelsOf(img.digestRef), { ...MANAGED, 'hand.test/note': 'kept?' }, 'the digest record was not pulled: kept');
      assert.deepEqual(await labelsOf(img.id), { ...MANAGED, [PIN]: 'pinned', 'pinset.test/mark': 'agent' });
      await cri.pullImage(img.digestRef);
      assert.deepEqual(await labelsOf(img.digestRef), MANAGED, 'the digest record was rewritten whole');
      assert.deepEqual(await labelsOf(img.id), { ...MANAGED, [PIN]: 'pinned', 'pinset.test/mark': 'agent' });
      await expectPinned(img.tag, true);
    });

    run('a pin label on a tag record pins the image too, until a pull of the tag wipes it', async () => {
      const img = await c!.taggedImage('pin/tag');
      await cri.pullImage(img.tag);
      await images.label(img.tag, { [PIN]: 'pinned' });
      await expectPinned(img.digestRef, true);
      await cri.pullImage(img.tag);
      await expectPinned(img.digestRef, false);
    });

    run('labels live in the metadata store: after a restart they are there, and CRI reports the pin again', async () => {
      const img = await c!.taggedImage('pin/restart');
      await cri.pullImage(img.digestRef);
      await images.label(img.id, { [PIN]: 'pinned', 'pinset.test/mark': 'agent' });
      await expectPinned(img.digestRef, true);
      await c!.restart();
      assert.deepEqual(await labelsOf(img.id), { ...MANAGED, [PIN]: 'pinned', 'pinset.test/mark': 'agent' });
      await expectPinned(img.digestRef, true);
    });

    run('RemoveImage removes a pinned image, every record of it', async () => {
      const img = await c!.taggedImage('pin/remove');
      await cri.pullImage(img.tag);
      await images.label(img.id, { [PIN]: 'pinned' });
      await expectPinned(img.tag, true);
      await cri.removeImage(img.tag);
      assert.equal(await cri.imageStatus(img.digestRef), null);
      for (const n of [img.tag, img.digestRef, img.id]) await assert.rejects(images.get(n), hasCode(grpc.status.NOT_FOUND));
    });

    // Runs last: on 1.7 and 2.x it kills the daemon under test (a plain
    // process in a temp folder, started for this suite alone).
    run('DIES: an Update without image.target kills containerd 1.7 and 2.x (its clients see UNAVAILABLE); 1.6 accepts it', async () => {
      const img = await c!.taggedImage('crash/notarget');
      await cri.pullImage(img.digestRef);
      const sent = images.update({ name: img.id, labels: { 'a.test/x': 'y' } }, ['labels.a.test/x']);
      if (diesOnUpdateWithoutTarget(c!.version)) {
        await assert.rejects(sent, hasCode(grpc.status.UNAVAILABLE));
        const deadline = Date.now() + 5_000;
        while (c!.running()) {
          assert.ok(Date.now() < deadline, 'containerd still running 5 s after an Update without target');
          await sleep(20);
        }
      } else {
        const r = await sent;
        assert.equal(r.labels['a.test/x'], 'y');
        assert.ok(r.target?.digest, 'the stored target is kept');
        assert.ok(c!.running());
      }
    });
  });
}
