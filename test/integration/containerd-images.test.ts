// The agent's client of containerd's Images service (src/containerd/images.ts)
// against the containerd twin: what it sends (always the record's target, a
// mask of exactly the labels that change, the k8s.io namespace), what it
// makes of the answers, and how it comes back after containerd restarts.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, beforeEach, describe, test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { CriImageRuntime } from '../../src/cri/client.ts';
import { RuntimeError } from '../../src/cri/runtime.ts';
import { ContainerdImages, labelChanges } from '../../src/containerd/images.ts';
import { startFakeContainerd, type FakeContainerd } from '../support/fake-containerd.ts';

const hex = () => randomBytes(32).toString('hex');

describe('ContainerdImages against the containerd twin', () => {
  let c: FakeContainerd;
  let images: ContainerdImages;
  let cri: CriImageRuntime;
  let n = 0;
  /** A fresh image pulled by tag: its tag, digest reference and ID. */
  const pulled = async () => {
    const repo = `registry.test/img${n++}`;
    const digest = `sha256:${hex()}`;
    const id = `sha256:${hex()}`;
    c.catalogue.set(`${repo}:v1`, { size: 10, digest, id });
    await cri.pullImage(`${repo}:v1`);
    return { tag: `${repo}:v1`, digestRef: `${repo}@${digest}`, id };
  };

  before(async () => {
    c = await startFakeContainerd({ version: '1.7.24' });
    images = new ContainerdImages(c.endpoint);
    cri = new CriImageRuntime(c.endpoint);
  });
  after(async () => {
    images.close();
    cri.close();
    await c.stop();
  });
  beforeEach(() => c.clearFailures());

  test('get: the record with its labels and target; null for a name containerd does not hold', async () => {
    const img = await pulled();
    const r = await images.get(img.id);
    assert.equal(r?.name, img.id);
    assert.deepEqual(r?.labels, { 'io.cri-containerd.image': 'managed' });
    assert.equal(r?.target?.digest, img.digestRef.split('@')[1]);
    assert.ok((r?.target?.size ?? 0) > 0);
    assert.equal(await images.get('registry.test/none:v1'), null);
    const last = c.imagesCalls.at(-1)!;
    assert.equal(last.namespace, 'k8s.io', 'the CRI namespace, as gRPC metadata');
  });

  test('list: every record, or those a filter selects', async () => {
    const img = await pulled();
    await images.setLabels(img.id, { 'pinset.dev/pinned': 'agent' });
    const all = (await images.list()).map((r) => r.name);
    for (const name of [img.tag, img.digestRef, img.id]) assert.ok(all.includes(name));
    assert.deepEqual((await images.list(['labels."pinset.dev/pinned"'])).map((r) => r.name), [img.id]);
    await assert.rejects(images.list(['labels.pinset.dev/pinned']), (e: RuntimeError) => e instanceof RuntimeError && e.code === grpc.status.INVALID_ARGUMENT && /Images\.List/.test(e.message));
  });

  test('setLabels: one Get, then one Update carrying the target and the mask labels.<key> of exactly the keys that change', async () => {
    const img = await pulled();
    const before = c.imagesCalls.length;
    const r = await images.setLabels(img.id, { 'io.cri-containerd.pinned': 'pinned', 'pinset.dev/pinned': 'agent' });
    assert.deepEqual(r.labels, { 'io.cri-containerd.image': 'managed', 'io.cri-containerd.pinned': 'pinned', 'pinset.dev/pinned': 'agent' });
    const calls = c.imagesCalls.slice(before);
    assert.deepEqual(calls.map((x) => x.method), ['Get', 'Update']);
    const update = calls[1]!.request;
    assert.deepEqual(update.updateMask.paths, ['labels.io.cri-containerd.pinned', 'labels.pinset.dev/pinned']);
    assert.deepEqual(update.image.target, c.record(img.id)!.target, 'the target the Get returned');
    assert.deepEqual(update.image.labels, { 'io.cri-containerd.pinned': 'pinned', 'pinset.dev/pinned': 'agent' });
    // Only what changes goes out; '' deletes.
    await images.setLabels(img.id, { 'io.cri-containerd.pinned': 'pinned', 'pinset.dev/pinned': '' });
    assert.deepEqual(c.updates(img.id).at(-1)!.request.updateMask.paths, ['labels.pinset.dev/pinned']);
    assert.deepEqual(c.record(img.id)!.labels, { 'io.cri-containerd.image': 'managed', 'io.cri-containerd.pinned': 'pinned' });
    assert.equal(c.updatesWithoutTarget.length, 0);
  });

  test('setLabels with nothing to change sends no Update', async () => {
    const img = await pulled();
    await images.setLabels(img.id, { a: 'b' });
    const updates = c.updates(img.id).length;
    const r = await images.setLabels(img.id, { a: 'b', gone: '' });
    assert.equal(c.updates(img.id).length, updates);
    assert.equal(r.labels.a, 'b');
  });

  test('setLabels of a record that does not exist: a NotFound RuntimeError, no Update', async () => {
    const updates = c.updates().length;
    await assert.rejects(images.setLabels('sha256:' + hex(), { a: 'b' }), (e: RuntimeError) => e instanceof RuntimeError && e.kind === 'NotFound' && /not found/.test(e.message));
    assert.equal(c.updates().length, updates);
  });

  test('a refused Update is a RuntimeError naming Images.Update, classified by its code', async () => {
    const img = await pulled();
    c.failUpdates({ code: grpc.status.UNAVAILABLE, message: 'timeout acquiring the metadata lock' });
    await assert.rejects(images.setLabels(img.id, { a: 'b' }), (e: RuntimeError) => e.kind === 'Unavailable' && /^Images\.Update: UNAVAILABLE: timeout acquiring/.test(e.message));
    c.failUpdates({ code: grpc.status.INVALID_ARGUMENT, message: 'image.Labels: label key and value length (5000 bytes) greater than maximum size' });
    await assert.rejects(images.setLabels(img.id, { a: 'b' }), (e: RuntimeError) => e.kind === 'Other' && e.code === grpc.status.INVALID_ARGUMENT);
    await images.setLabels(img.id, { a: 'b' });
  });

  test('after a restart of containerd the next call after a failed one connects at once, while the CRI client of the same socket still waits', async () => {
    const img = await pulled();
    c.stopServing();
    await assert.rejects(images.get(img.id), (e: RuntimeError) => e.kind === 'Unavailable');
    await assert.rejects(cri.version(), (e: RuntimeError) => e.kind === 'Unavailable');
    await c.resume();
    const t0 = Date.now();
    assert.equal((await images.get(img.id))?.name, img.id);
    assert.ok(Date.now() - t0 < 500, `took ${Date.now() - t0} ms`);
  });

  test('labelChanges: the keys whose value differs, absent counting as ""', () => {
    assert.deepEqual(labelChanges({ a: '1', b: '2' }, { a: '1', b: '3', c: '', d: '4' }), ['b', 'd']);
    assert.deepEqual(labelChanges({ a: '1' }, { a: '' }), ['a']);
  });
});
