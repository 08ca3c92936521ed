// The pure parts of confirming reloads (which references must flip, which
// are provably stored names), the bounded wait, and the retry gate.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { ImageRuntime, RuntimeImage } from '../../src/cri/runtime.ts';
import { namesProvenByPins, reloadProbes, tentativeProbes } from '../../src/crio/loaded-pins.ts';
import { RuntimeView } from '../../src/cri/view.ts';
import { waitForPins } from '../../src/pins/confirm.ts';
import { RetryGate } from '../../src/util/retry.ts';
import { silentLogger, createLogger } from '../../src/util/log.ts';
import { Writable } from 'node:stream';

const ref = (n: string, c: string) => `registry.test/${n}@sha256:${c.repeat(64)}`;
const A = ref('a', 'a');
const B = ref('b', 'b');
const C = ref('c', 'c');
const PAUSE = 'registry.k8s.io/pause:3.10';

function img(names: string[], pinned: boolean, extra: Partial<RuntimeImage> = {}): RuntimeImage {
  return { id: names[0]!, repoTags: names.filter((n) => !n.includes('@')), repoDigests: names.filter((n) => n.includes('@')), size: 1, pinned, runtimeHandler: '', ...extra };
}

describe('namesProvenByPins', () => {
  test('pinned while only its own exact pattern could match: a stored name', () => {
    const view = new RuntimeView([img([A], true), img([B], false)]);
    assert.deepEqual(namesProvenByPins([A, B], view, PAUSE), [A]);
  });
  test('not proven when a glob or another exact pattern could have pinned it', () => {
    const tagged = img([B, 'registry.test/b:v1'], true);
    assert.deepEqual(namesProvenByPins([B, 'registry.test/b:v1'], new RuntimeView([tagged]), PAUSE), []);
    assert.deepEqual(namesProvenByPins([A, 'registry.test/*'], new RuntimeView([img([A], true)]), PAUSE), []);
  });
});

describe('reloadProbes', () => {
  const known = new Set([A, B].map((x) => x.toLowerCase()));
  test('an added pin on a known name, unpinned now: expect pinned; a removed one, pinned now, nothing else matching: expect unpinned', () => {
    const view = new RuntimeView([img([A], false), img([B], true)]);
    assert.deepEqual(reloadProbes([B], [A], view, known, PAUSE), [{ ref: A, expect: true }, { ref: B, expect: false }]);
  });
  test('nothing to observe: unknown names, absent images, a removal another pattern still covers', () => {
    const view = new RuntimeView([img([B], true), img([C], false)]);
    assert.deepEqual(reloadProbes([], [C], view, known, PAUSE), [], 'C is not known as a name');
    assert.deepEqual(reloadProbes([], [A], view, known, PAUSE), [], 'A is absent');
    assert.deepEqual(reloadProbes([B], ['registry.test/*'], view, known, PAUSE), [], 'B stays pinned by the glob');
  });
  test('at most `max`', () => {
    const many = Array.from({ length: 20 }, (_, i) => ref(`m${i}`, (i % 10).toString()));
    const view = new RuntimeView(many.map((m) => img([m], false)));
    assert.equal(reloadProbes([], many, view, new Set(many.map((m) => m.toLowerCase())), PAUSE, 8).length, 8);
  });
});

describe('tentativeProbes', () => {
  test('added exact pins on images shown unpinned, whatever is known', () => {
    const view = new RuntimeView([img([A], false), img([B], true)]);
    assert.deepEqual(tentativeProbes([], [A, B, C, 'registry.test/*'], view), [{ ref: A, expect: true }]);
  });
});

/** An ImageRuntime whose ImageStatus answers from a function of the call count. */
function runtimeAnswering(answer: (ref: string, call: number) => RuntimeImage | null): ImageRuntime & { calls: number } {
  const r = {
    calls: 0,
    async imageStatus(ref: string) {
      return answer(ref, r.calls++);
    },
  };
  return r as unknown as ImageRuntime & { calls: number };
}

describe('waitForPins', () => {
  test('polls until a probe flips', async () => {
    const rt = runtimeAnswering((_r, n) => img([A], n >= 3));
    const r = await waitForPins(rt, [{ ref: A, expect: true }], { intervalMs: 1, timeoutMs: 5000 });
    assert.equal(r.applied, true);
    assert.equal(rt.calls, 4);
  });
  test('gives up at the bound: not applied', async () => {
    const rt = runtimeAnswering(() => img([A], false));
    const r = await waitForPins(rt, [{ ref: A, expect: true }], { intervalMs: 5, timeoutMs: 60 });
    assert.equal(r.applied, false);
    assert.equal(r.unobservable, false);
    assert.ok(rt.calls >= 2);
  });
  test('a probe whose image is gone drops out: unobservable, not refused', async () => {
    const rt = runtimeAnswering(() => null);
    const r = await waitForPins(rt, [{ ref: A, expect: true }], { intervalMs: 1, timeoutMs: 5000 });
    assert.deepEqual([r.applied, r.unobservable], [false, true]);
    assert.equal(rt.calls, 1);
  });
});

describe('RetryGate', () => {
  test('paced: each failure pushes the next attempt out, doubling to the cap; a success resets', () => {
    let now = 0;
    const gate = new RetryGate('x', silentLogger(), { now: () => now, policy: { baseMs: 1000, capMs: 8000 }, random: () => 1 });
    assert.ok(gate.due());
    assert.deepEqual([1, 2, 3, 4, 5].map(() => gate.fail('e')), [1000, 2000, 4000, 8000, 8000]);
    assert.ok(!gate.due());
    now = gate.nextAt;
    assert.ok(gate.due());
    gate.expedite();
    gate.succeed();
    assert.equal(gate.failing, false);
    assert.equal(gate.fail('e'), 1000);
  });

  test('logs once per change of state (numbers aside), and the recovery', () => {
    const lines: Record<string, unknown>[] = [];
    const sink = new Writable({ write: (c, _e, cb) => (lines.push(JSON.parse(String(c))), cb()) });
    const gate = new RetryGate('reloading CRI-O', createLogger({ level: 'info', destination: sink }), { random: () => 0.5 });
    gate.fail('reload of crio.service ended with result "failed" (job /org/freedesktop/systemd1/job/101)');
    gate.fail('reload of crio.service ended with result "failed" (job /org/freedesktop/systemd1/job/102)');
    gate.fail('systemd refused to reload crio.service');
    gate.succeed();
    assert.deepEqual(lines.map((l) => l.msg), ['reloading CRI-O failed; retrying with backoff', 'reloading CRI-O failed; retrying with backoff', 'reloading CRI-O works again']);
    assert.equal(typeof lines[0]!.retryInMs, 'number');
    assert.match(String(lines[1]!.err), /refused/);
  });
});
