// The containerd twin's own tests: what test/support/containerd-behaviour.ts
// cannot check on a real daemon (versions not installed here, injected
// faults, the record of Updates without target, a death and a start
// again), and its helpers. Its likeness to the real containerd 1.7.24 and
// 1.6.20 is pinned down by the behaviour suites.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, describe, test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { CriClient } from '../support/containerd.ts';
import { ImagesClient } from '../support/containerd-proto.ts';
import { diesOnUpdateWithoutTarget, parseFilter, pinBehaviourOf, startFakeContainerd } from '../support/fake-containerd.ts';

const hex = () => randomBytes(32).toString('hex');
const PIN = { 'io.cri-containerd.pinned': 'pinned' };
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A twin with one image in its catalogue, by tag and by digest. */
async function twin(opts: Parameters<typeof startFakeContainerd>[0] = {}) {
  const c = await startFakeContainerd(opts);
  const digest = `sha256:${hex()}`;
  const id = `sha256:${hex()}`;
  const tag = 'registry.test/app:v1';
  const digestRef = `registry.test/app@${digest}`;
  c.catalogue.set(tag, { size: 100, digest, id });
  c.catalogue.set(digestRef, { size: 100, id });
  const cri = new CriClient(c.endpoint);
  const images = new ImagesClient(c.endpoint);
  return {
    c,
    cri,
    images,
    tag,
    digestRef,
    id,
    async close() {
      cri.close();
      images.close();
      await c.stop();
    },
  };
}

describe('the containerd twin', () => {
  const open: { close(): Promise<void> }[] = [];
  const make = async (opts?: Parameters<typeof startFakeContainerd>[0]) => {
    const t = await twin(opts);
    open.push(t);
    return t;
  };
  after(async () => {
    for (const t of open) await t.close();
  });

  test('pin behaviour and the crash by version, as issue 18 lists them', () => {
    const table: [string, string, boolean][] = [
      ['1.6.20', 'never', false],
      ['1.6.21', 'never', false],
      ['1.6.22', 'fixed-at-entry', false],
      ['1.6.24', 'fixed-at-entry', false],
      ['1.6.25', 'live', false],
      ['1.6.39', 'live', false],
      ['1.7.2', 'never', true],
      ['1.7.3', 'fixed-at-entry', true],
      ['1.7.9', 'fixed-at-entry', true],
      ['1.7.10', 'live', true],
      ['1.7.24~ds1', 'live', true],
      ['v1.7.29', 'live', true],
      ['2.1.5', 'live', true],
    ];
    for (const [v, pins, dies] of table) {
      assert.equal(pinBehaviourOf(v), pins, v);
      assert.equal(diesOnUpdateWithoutTarget(v), dies, v);
    }
  });

  test('CRI Version answers runtime_name containerd and the configured version', async () => {
    const t = await make({ version: '2.1.5' });
    const v = await t.cri.version();
    assert.deepEqual([v.runtimeName, v.runtimeVersion, v.runtimeApiVersion], ['containerd', '2.1.5', 'v1']);
  });

  test('an Update without target on 1.7: the twin dies, records it, and answers nothing until resumed; the records survive', async () => {
    const t = await make({ version: '1.7.24' });
    await t.cri.pullImage(t.tag);
    await t.images.label(t.id, PIN);
    await assert.rejects(t.images.update({ name: t.id, labels: { a: 'b' } }, ['labels.a']), (e: grpc.ServiceError) => e.code === grpc.status.UNAVAILABLE);
    assert.equal(t.c.dead, true);
    assert.equal(t.c.deaths, 1);
    assert.deepEqual(t.c.updatesWithoutTarget, [{ name: t.id, namespace: 'k8s.io', paths: ['labels.a'], died: true }]);
    await assert.rejects(t.cri.version({ deadlineMs: 500 }), (e: grpc.ServiceError) => e.code === grpc.status.UNAVAILABLE || e.code === grpc.status.DEADLINE_EXCEEDED);
    // Fresh clients: the old ones wait out grpc-js's reconnect backoff after
    // the failed attempts, and share it with any client of the same target.
    t.images.close();
    t.cri.close();
    await t.c.resume();
    const images = new ImagesClient(t.c.endpoint);
    const cri = new CriClient(t.c.endpoint);
    try {
      assert.equal((await images.get(t.id)).labels['io.cri-containerd.pinned'], 'pinned');
      assert.equal((await cri.imageStatus(t.tag))?.pinned, true, 'CRI rebuilt its cache from the labels at the start');
    } finally {
      images.close();
      cri.close();
    }
  });

  test('an Update without target on 1.6 is accepted, and recorded all the same', async () => {
    const t = await make({ version: '1.6.20' });
    await t.cri.pullImage(t.tag);
    const r = await t.images.update({ name: t.id, labels: { a: 'b' } }, ['labels.a']);
    assert.equal(r.labels.a, 'b');
    assert.equal(t.c.serving, true);
    assert.deepEqual(t.c.updatesWithoutTarget.map((u) => u.died), [false]);
  });

  test('injected Update failures: the next N Updates (of one name, if given) fail with the code and message; then Updates work', async () => {
    const t = await make();
    await t.cri.pullImage(t.tag);
    t.c.failUpdates({ times: 2, code: grpc.status.UNAVAILABLE, message: 'timeout waiting for the metadata lock', name: t.id });
    await assert.rejects(t.images.label(t.tag, { x: '1' }).then(() => t.images.label(t.id, PIN)), /metadata lock/);
    await assert.rejects(t.images.label(t.id, PIN), /metadata lock/);
    await t.images.label(t.id, PIN);
    assert.deepEqual(t.c.updates(t.id).map((u) => u.code), [grpc.status.UNAVAILABLE, grpc.status.UNAVAILABLE, grpc.status.OK]);
  });

  test('restart: labels and records persist; calls during the outage are UNAVAILABLE', async () => {
    const t = await make();
    await t.cri.pullImage(t.digestRef);
    await t.images.label(t.id, { ...PIN, 'pinset.dev/pinned': 'agent' });
    t.c.stopServing();
    await assert.rejects(t.images.get(t.id), (e: grpc.ServiceError) => e.code === grpc.status.UNAVAILABLE);
    await t.c.resume();
    assert.deepEqual((await t.images.get(t.id)).labels, { 'io.cri-containerd.image': 'managed', ...PIN, 'pinset.dev/pinned': 'agent' });
    assert.equal((await t.cri.imageStatus(t.digestRef))?.pinned, true);
  });

  test('CRI follows a label pinDelayMs later, not before', async () => {
    const t = await make({ pinDelayMs: 200 });
    await t.cri.pullImage(t.tag);
    await t.images.label(t.id, PIN);
    assert.equal((await t.cri.imageStatus(t.tag))?.pinned, false, 'not yet');
    await sleep(300);
    assert.equal((await t.cri.imageStatus(t.tag))?.pinned, true);
  });

  test('1.7.9: a label set after the pull is ignored, even after a restart when a name record sorts before the ID record; a pull carrying the label (the sandbox image) pins', async () => {
    const sandbox = 'registry.test/pause@sha256:' + hex();
    const t = await make({ version: '1.7.9', sandboxImage: sandbox });
    t.c.catalogue.set(sandbox, { size: 10 });
    await t.cri.pullImage(t.tag);
    await t.images.label(t.id, PIN);
    await sleep(50);
    assert.equal((await t.cri.imageStatus(t.tag))?.pinned, false);
    await t.c.restart();
    assert.equal((await t.cri.imageStatus(t.tag))?.pinned, false, 'registry.test/app:v1 sorts first and carries no pin');
    await t.cri.pullImage(sandbox);
    assert.equal((await t.cri.imageStatus(sandbox))?.pinned, true);
  });

  test('1.6.20 never reports pinned, not even after a restart', async () => {
    const t = await make({ version: '1.6.20' });
    await t.cri.pullImage(t.digestRef);
    await t.images.label(t.id, PIN);
    await t.c.restart();
    assert.equal((await t.cri.imageStatus(t.digestRef))?.pinned, false);
  });

  test('helpers: preload stores as a pull would, label() is ctr images label, evict removes every record, record() copies', async () => {
    const t = await make();
    assert.equal(t.c.preload(t.tag), t.id);
    assert.equal(t.c.pullCount(), 0);
    assert.deepEqual(t.c.recordNames(), [t.digestRef, t.tag, t.id].sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b))));
    t.c.label(t.id, PIN);
    await sleep(30);
    assert.equal(t.c.criPinned(t.tag), true);
    const copy = t.c.record(t.id)!;
    copy.labels.x = 'y';
    assert.equal(t.c.record(t.id)!.labels.x, undefined);
    assert.equal(t.c.evict(t.digestRef), true);
    assert.deepEqual(t.c.recordNames(), []);
    assert.equal(await t.cri.imageStatus(t.tag), null);
  });

  test('an unknown reference does not pull: NOT_FOUND', async () => {
    const t = await make();
    await assert.rejects(t.cri.pullImage('registry.test/none:v9'), (e: grpc.ServiceError) => e.code === grpc.status.NOT_FOUND);
  });

  test("containerd's filter syntax: quoted keys, operators, values; what it refuses", () => {
    assert.deepEqual(parseFilter('labels."pinset.dev/pinned"'), [{ path: ['labels', 'pinset.dev/pinned'] }]);
    assert.deepEqual(parseFilter('labels."a.b"==x,name~=^reg'), [
      { path: ['labels', 'a.b'], op: '==', value: 'x' },
      { path: ['name'], op: '~=', value: '^reg' },
    ]);
    assert.deepEqual(parseFilter('name=="a,b"'), [{ path: ['name'], op: '==', value: 'a,b' }]);
    assert.throws(() => parseFilter('labels.io.cri-containerd.pinned'), /expected an operator/);
    assert.throws(() => parseFilter('labels."x'), /quoted literal not terminated/);
  });
});
