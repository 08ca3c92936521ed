import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { parseReference } from '../../src/api/reference.ts';
import { wantedKey, type WantedImage } from '../../src/agent/plan.ts';
import { ImagePuller, RETRY_POLICY, type PullResult } from '../../src/agent/puller.ts';
import {
  RuntimeError,
  type ImageFilesystem,
  type ImageRuntime,
  type PullOptions,
  type RuntimeImage,
  type RuntimeInfo,
} from '../../src/cri/runtime.ts';
import { MemoryCredentials } from '../../src/registry/credentials.ts';
import { silentLogger } from '../../src/util/log.ts';

interface PullCall {
  ref: string;
  opts: PullOptions;
  resolve: (imageRef: string) => void;
  reject: (e: unknown) => void;
  settled: boolean;
}

/**
 * An in-memory ImageRuntime whose pulls wait until the test ends them.
 * On abort it rejects as CriImageRuntime does (gRPC CANCELLED), or, with
 * `abortWith: 'reason'`, with the signal's own reason.
 */
class MemoryRuntime implements ImageRuntime {
  calls: PullCall[] = [];
  active = 0;
  maxActive = 0;
  abortWith: 'grpc' | 'reason' = 'grpc';

  async version(): Promise<RuntimeInfo> {
    return { runtimeName: 'memory', runtimeVersion: '0', runtimeApiVersion: 'v1' };
  }
  async listImages(): Promise<RuntimeImage[]> {
    return [];
  }
  async imageStatus(): Promise<RuntimeImage | null> {
    return null;
  }
  async imageFsInfo(): Promise<ImageFilesystem[]> {
    return [];
  }
  close(): void {}

  pullImage(ref: string, opts: PullOptions = {}): Promise<string> {
    this.active++;
    this.maxActive = Math.max(this.maxActive, this.active);
    return new Promise<string>((resolve, reject) => {
      const call: PullCall = {
        ref,
        opts,
        settled: false,
        resolve: (v) => {
          if (call.settled) return;
          call.settled = true;
          this.active--;
          resolve(v);
        },
        reject: (e) => {
          if (call.settled) return;
          call.settled = true;
          this.active--;
          reject(e);
        },
      };
      this.calls.push(call);
      opts.signal?.addEventListener(
        'abort',
        () => call.reject(this.abortWith === 'grpc' ? new RuntimeError('Canceled', 'PullImage: CANCELLED: Cancelled on client', 1) : opts.signal!.reason),
        { once: true },
      );
    });
  }

  /** The pending (not yet ended) call for a reference. */
  open(ref: string): PullCall {
    const c = this.calls.find((x) => x.ref === ref && !x.settled);
    assert.ok(c, `no pull of ${ref} in progress`);
    return c;
  }
  started(): string[] {
    return this.calls.map((c) => c.ref);
  }
}

function wanted(ref: string, runtimeHandler = ''): WantedImage {
  const r = parseReference(ref);
  assert.ok(r.ok, ref);
  return { key: wantedKey(ref, runtimeHandler), reference: r.value, runtimeHandler, sets: ['api/test'] };
}

const img = (name: string, host = 'quay.io') => wanted(`${host}/org/${name}@sha256:${'a'.repeat(64)}`);
const settle = async () => {
  for (let i = 0; i < 5; i++) await new Promise<void>((r) => setImmediate(r));
};
const never = () => new AbortController().signal;

function puller(runtime: MemoryRuntime, over: Partial<ConstructorParameters<typeof ImagePuller>[0]> = {}) {
  const clock = { now: 1_000_000 };
  const p = new ImagePuller({ runtime, maxParallel: 2, logger: silentLogger(), now: () => clock.now, random: () => 1, ...over });
  return { p, clock };
}

describe('ImagePuller: parallelism', () => {
  test('never more pulls at once than maxParallel; queued pulls start in order as slots free', async () => {
    const rt = new MemoryRuntime();
    const { p } = puller(rt, { maxParallel: 2 });
    const images = ['a', 'b', 'c', 'd', 'e', 'f'].map((n) => img(n));
    const done = p.pull(images, never());
    await settle();
    assert.equal(rt.active, 2);
    assert.deepEqual(rt.started(), [images[0]!, images[1]!].map((w) => w.reference.reference));
    rt.open(images[1]!.reference.reference).resolve('sha256:b');
    await settle();
    assert.equal(rt.calls.length, 3);
    assert.equal(rt.calls[2]!.ref, images[2]!.reference.reference);
    for (let i = 0; i < 6; i++) {
      for (const c of rt.calls) if (!c.settled) c.resolve(`id-${c.ref}`);
      await settle();
    }
    const results = await done;
    assert.equal(rt.maxActive, 2);
    assert.deepEqual(
      rt.started(),
      images.map((w) => w.reference.reference),
    );
    assert.ok(results.every((r) => r.ok));
    assert.deepEqual(
      results.map((r) => r.key),
      images.map((w) => w.key),
    );
  });

  test('the first pulls of a batch reach the runtime in the same turn, before any timer or I/O, credentials looked up on the way', async () => {
    const rt = new MemoryRuntime();
    const credentials = new MemoryCredentials().add('quay.io', { username: 'u', password: 'p' });
    const { p } = puller(rt, { maxParallel: 2, credentials });
    // The next turn of the event loop: anything the caller starts next (a timer, a request) comes after it.
    const nextTurn = new Promise<string[]>((resolve) => setImmediate(() => resolve(rt.started())));
    void p.pull([img('a'), img('b'), img('c')], never());
    assert.deepEqual(await nextTurn, [img('a'), img('b')].map((w) => w.reference.reference));
  });

  test('a slot freed while pulls wait goes to the first of them, even when another pull asks at that very moment', async () => {
    // The newcomer asks at every point of the freed pull's completion, one microtask apart.
    for (let delay = 0; delay < 8; delay++) {
      const rt = new MemoryRuntime();
      const { p } = puller(rt, { maxParallel: 1 });
      const first = p.pull([img('a'), img('b')], never());
      await settle();
      rt.open(img('a').reference.reference).resolve('sha256:a');
      for (let i = 0; i < delay; i++) await Promise.resolve();
      const second = p.pull([img('c')], never());
      for (let i = 0; i < 4; i++) {
        for (const c of rt.calls) if (!c.settled) c.resolve(`id-${c.ref}`);
        await settle();
      }
      await Promise.all([first, second]);
      assert.equal(rt.maxActive, 1, `newcomer after ${delay} microtask(s)`);
      assert.deepEqual(rt.started(), ['a', 'b', 'c'].map((n) => img(n).reference.reference), `newcomer after ${delay} microtask(s)`);
    }
  });

  test('maxParallel below 1 still pulls, one at a time', async () => {
    const rt = new MemoryRuntime();
    const { p } = puller(rt, { maxParallel: 0 });
    const done = p.pull([img('a'), img('b')], never());
    await settle();
    assert.equal(rt.active, 1);
    rt.calls[0]!.resolve('x');
    await settle();
    rt.calls[1]!.resolve('y');
    assert.equal((await done).length, 2);
    assert.equal(rt.maxActive, 1);
  });

  test('passes the runtime handler and the credentials of the image’s own registry', async () => {
    const rt = new MemoryRuntime();
    const credentials = new MemoryCredentials().add('quay.io', { username: 'robot', password: 'secret' });
    const { p } = puller(rt, { credentials });
    const kata = wanted(`quay.io/org/a@sha256:${'a'.repeat(64)}`, 'kata');
    const other = img('b', 'ghcr.io');
    const done = p.pull([kata, other], never());
    await settle();
    assert.deepEqual(
      credentials.asked.map((a) => [a.host, a.path, a.origin?.repository, a.origin?.digest]),
      [
        ['quay.io', 'org/a', 'quay.io/org/a', `sha256:${'a'.repeat(64)}`],
        ['ghcr.io', 'org/b', 'ghcr.io/org/b', `sha256:${'a'.repeat(64)}`],
      ],
    );
    assert.equal(rt.calls[0]!.opts.runtimeHandler, 'kata');
    assert.deepEqual(rt.calls[0]!.opts.auth, { username: 'robot', password: 'secret' });
    assert.equal(rt.calls[1]!.opts.runtimeHandler, undefined, 'no handler: the runtime default');
    assert.equal(rt.calls[1]!.opts.auth, undefined, 'no credential for ghcr.io: anonymous');
    for (const c of rt.calls) c.resolve('id');
    await done;
  });
});

describe('ImagePuller: several credentials, as the kubelet tries them', () => {
  const three = () =>
    new MemoryCredentials()
      .add('quay.io/org', { username: 'team', password: 'team-pw' }, 'the team entry')
      .add('quay.io', { username: 'host', password: 'host-pw' }, 'the host entry');

  test('each credential in turn until a pull succeeds; the others are not tried', async () => {
    const rt = new MemoryRuntime();
    const { p } = puller(rt, { credentials: three().add('*.io', { username: 'wild', password: 'wild-pw' }) });
    const done = p.pull([img('a')], never());
    await settle();
    assert.equal(rt.calls.length, 1);
    assert.equal(rt.calls[0]!.opts.auth?.username, 'team', 'the most specific key first');
    rt.calls[0]!.reject(new RuntimeError('Unauthorized', 'HTTP 401'));
    await settle();
    assert.equal(rt.calls.length, 2);
    assert.equal(rt.calls[1]!.opts.auth?.username, 'host');
    rt.calls[1]!.resolve('id-a');
    const [r] = await done;
    assert.equal(r!.ok, true);
    assert.equal(r!.imageRef, 'id-a');
    assert.equal(rt.calls.length, 2, 'the wildcard entry was not needed');
  });

  test('all refused: one failure naming each credential by where it came from, never its secret; the registry\'s answer picks the kind', async () => {
    const rt = new MemoryRuntime();
    const { p } = puller(rt, { credentials: three() });
    const done = p.pull([img('a')], never());
    await settle();
    rt.calls[0]!.reject(new RuntimeError('Unauthorized', 'HTTP 401 for team:team-pw'));
    await settle();
    rt.calls[1]!.reject(new RuntimeError('NotFound', 'manifest unknown'));
    const [r] = await done;
    assert.equal(r!.failure?.kind, 'NotFound', 'with a credential it let in, the registry said the image is not there');
    assert.match(r!.failure!.message, /with the team entry: HTTP 401/);
    assert.match(r!.failure!.message, /with the host entry: manifest unknown/);
    assert.doesNotMatch(r!.failure!.message, /team-pw/);
  });

  test('the runtime down or the pull cancelled ends the attempt: no other credential is tried', async () => {
    const rt = new MemoryRuntime();
    const { p } = puller(rt, { credentials: three() });
    const done = p.pull([img('a')], never());
    await settle();
    rt.calls[0]!.reject(new RuntimeError('Unavailable', 'connect ECONNREFUSED /run/containerd/containerd.sock', 14));
    const [r] = await done;
    assert.equal(rt.calls.length, 1);
    assert.equal(r!.failure?.runtimeDown, true);
  });

  test('no credential: one anonymous pull', async () => {
    const rt = new MemoryRuntime();
    const { p } = puller(rt, { credentials: new MemoryCredentials() });
    const done = p.pull([img('a')], never());
    await settle();
    assert.equal(rt.calls.length, 1);
    assert.equal(rt.calls[0]!.opts.auth, undefined);
    rt.calls[0]!.reject(new RuntimeError('Unauthorized', 'HTTP 401'));
    const [r] = await done;
    assert.equal(rt.calls.length, 1, 'never anonymous after credentials, never credentials after anonymous');
    assert.equal(r!.failure?.kind, 'Unauthorized');
  });

  test('a credential provider that failed is carried on the failure when the pull then fails, not when it succeeds', async () => {
    const rt = new MemoryRuntime();
    const credentials = new MemoryCredentials().fail((image) => image.startsWith('quay.io/'), {
      reason: 'CredentialProviderFailed',
      source: 'credential provider ecr',
      message: 'credential provider ecr failed for quay.io/org/a: exit status 1',
    });
    const { p } = puller(rt, { credentials });
    const done = p.pull([img('a'), img('b')], never());
    await settle();
    rt.open(img('a').reference.reference).reject(new RuntimeError('Unauthorized', 'HTTP 401'));
    rt.open(img('b').reference.reference).resolve('id-b');
    const [a, b] = await done;
    assert.equal(a!.failure?.credentialFailure, 'credential provider ecr failed for quay.io/org/a: exit status 1');
    assert.equal(b!.ok, true);
    assert.equal(p.failure(img('b').key), undefined);
  });

  test('retryNow makes a failed image due at once; others keep their pace', async () => {
    const now = 1_000_000;
    const rt = new MemoryRuntime();
    const p = new ImagePuller({ runtime: rt, maxParallel: 4, logger: silentLogger(), now: () => now, random: () => 0.5 });
    const done = p.pull([img('a'), img('b')], never());
    await settle();
    for (const c of rt.calls) c.reject(new RuntimeError('Unauthorized', 'HTTP 401'));
    await done;
    assert.equal(p.isDue(img('a').key), false);
    p.retryNow([img('a').key]);
    assert.equal(p.isDue(img('a').key), true);
    assert.equal(p.isDue(img('b').key), false);
  });
});

describe('ImagePuller: retries', () => {
  for (const kind of ['NotFound', 'Unauthorized', 'Unavailable', 'NoSpace', 'Other'] as const) {
    test(`a ${kind} failure is retried at its own pace, doubling per failure`, async () => {
      const rt = new MemoryRuntime();
      const { p, clock } = puller(rt);
      const a = img('a');
      const first = p.pull([a], never());
      await settle();
      rt.open(a.reference.reference).reject(new RuntimeError(kind, `PullImage: UNKNOWN: ${kind}`, 2));
      const [r1] = await first;
      assert.equal(r1!.ok, false);
      assert.equal(r1!.failure!.kind, kind);
      assert.equal(r1!.failure!.failures, 1);
      const base = RETRY_POLICY[kind].baseMs;
      assert.equal(p.failure(a.key)!.nextAttemptAt, clock.now + base);
      assert.equal(p.nextAttemptAt(), clock.now + base);

      // Not due yet: no attempt.
      clock.now += base - 1;
      assert.equal(p.isDue(a.key), false);
      assert.deepEqual(await p.pull([a], never()), []);
      assert.equal(rt.calls.length, 1);

      // Due: one attempt; a second failure waits twice as long (capped).
      clock.now += 1;
      assert.equal(p.isDue(a.key), true);
      const second = p.pull([a], never());
      await settle();
      assert.equal(rt.calls.length, 2);
      rt.open(a.reference.reference).reject(new RuntimeError(kind, 'again', 2));
      const [r2] = await second;
      assert.equal(r2!.failure!.failures, 2);
      assert.equal(r2!.failure!.nextAttemptAt, clock.now + Math.min(RETRY_POLICY[kind].capMs, 2 * base));
    });
  }

  test('the retry pace has jitter: with random() = 0 the delay is half', async () => {
    const rt = new MemoryRuntime();
    const { p, clock } = puller(rt, { random: () => 0 });
    const a = img('a');
    const done = p.pull([a], never());
    await settle();
    rt.open(a.reference.reference).reject(new RuntimeError('Unavailable', 'connection refused', 2));
    await done;
    assert.equal(p.failure(a.key)!.nextAttemptAt, clock.now + RETRY_POLICY.Unavailable.baseMs / 2);
  });

  test('an error that is not a RuntimeError is Other, and its message is scrubbed of secrets', async () => {
    const rt = new MemoryRuntime();
    const results: PullResult[] = [];
    const { p } = puller(rt, { credentials: new MemoryCredentials().add('registry.invalid', { username: 'u', password: 'hunter2' }), onResult: (r) => results.push(r) });;
    const a = img('a');
    const done = p.pull([a], never());
    await settle();
    rt.open(a.reference.reference).reject(new Error('auth hunter2 rejected'));
    await done;
    const f = p.failure(a.key)!;
    assert.equal(f.kind, 'Other');
    assert.equal(f.message, 'auth [redacted] rejected');
    assert.equal(f.runtimeDown, false);
    assert.equal(results.length, 1);
    assert.equal(results[0]!.failure!.message, 'auth [redacted] rejected');
  });

  test('a runtime that is down is flagged as such', async () => {
    const rt = new MemoryRuntime();
    const { p } = puller(rt);
    const a = img('a');
    const done = p.pull([a], never());
    await settle();
    rt.open(a.reference.reference).reject(new RuntimeError('Unavailable', 'PullImage: UNAVAILABLE: connect ENOENT', 14));
    await done;
    assert.equal(p.failure(a.key)!.runtimeDown, true);
  });

  test('success and markPresent forget earlier failures', async () => {
    const rt = new MemoryRuntime();
    const { p, clock } = puller(rt);
    const a = img('a');
    const b = img('b');
    const f = p.pull([a, b], never());
    await settle();
    rt.open(a.reference.reference).reject(new RuntimeError('Unavailable', 'x', 2));
    rt.open(b.reference.reference).reject(new RuntimeError('Unavailable', 'x', 2));
    await f;
    clock.now += RETRY_POLICY.Unavailable.capMs;
    const s = p.pull([a], never());
    await settle();
    rt.open(a.reference.reference).resolve('id');
    const [r] = await s;
    assert.equal(r!.ok, true);
    assert.equal(r!.imageRef, 'id');
    assert.equal(p.failure(a.key), undefined);
    p.markPresent(b.key);
    assert.equal(p.failure(b.key), undefined);
    assert.equal(p.nextAttemptAt(), undefined);
  });
});

describe('ImagePuller: joining and cancelling', () => {
  test('a pull outlives an abandoned wait and is joined by the next reconcile, not repeated', async () => {
    const rt = new MemoryRuntime();
    const { p } = puller(rt);
    const a = img('a');
    const first = new AbortController();
    const waiting = p.pull([a], first.signal);
    await settle();
    first.abort(new Error('superseded'));
    await assert.rejects(waiting, /superseded/);
    assert.equal(rt.calls[0]!.opts.signal!.aborted, false, 'the pull itself goes on');

    const second = p.pull([a], never());
    await settle();
    assert.equal(rt.calls.length, 1, 'joined, not started again');
    rt.open(a.reference.reference).resolve('id-a');
    const [r] = await second;
    assert.equal(r!.ok, true);
  });

  test('an already aborted wait starts the pulls but does not wait', async () => {
    const rt = new MemoryRuntime();
    const { p } = puller(rt);
    const c = new AbortController();
    c.abort(new Error('stop'));
    await assert.rejects(p.pull([img('a')], c.signal), /stop/);
    await settle();
    assert.equal(rt.calls.length, 1);
    rt.calls[0]!.resolve('x');
  });

  test('retain() cancels pulls no longer wanted: the runtime sees the abort, the failure is not kept', async () => {
    const rt = new MemoryRuntime();
    const { p } = puller(rt);
    const a = img('a');
    const b = img('b');
    const done = p.pull([a, b], never());
    await settle();
    const cancelled = p.retain(new Set([a.key]));
    assert.deepEqual(cancelled, [b.key]);
    const bCall = rt.calls.find((c) => c.ref === b.reference.reference)!;
    const aCall = rt.calls.find((c) => c.ref === a.reference.reference)!;
    assert.equal(bCall.opts.signal!.aborted, true);
    assert.equal(aCall.opts.signal!.aborted, false);
    aCall.resolve('id-a');
    const results = await done;
    const rb = results.find((r) => r.key === b.key)!;
    assert.equal(rb.ok, false);
    assert.equal(rb.failure!.kind, 'Canceled');
    assert.equal(p.failure(b.key), undefined, 'a cancelled pull leaves no failure behind');
    assert.equal(p.isDue(b.key), true, 'wanted again, it is pulled at once');
  });

  test('a runtime that rejects an aborted pull with the signal’s reason is still a cancellation', async () => {
    const rt = new MemoryRuntime();
    rt.abortWith = 'reason';
    const { p } = puller(rt);
    const a = img('a');
    const done = p.pull([a], never());
    await settle();
    p.retain(new Set());
    const [r] = await done;
    assert.equal(r!.failure!.kind, 'Canceled');
    assert.equal(p.failure(a.key), undefined);
    assert.equal(p.nextAttemptAt(), undefined);
  });

  test('retain() cancels a pull still waiting for a slot: it never reaches the runtime', async () => {
    const rt = new MemoryRuntime();
    const { p } = puller(rt, { maxParallel: 1 });
    const a = img('a');
    const b = img('b');
    const done = p.pull([a, b], never());
    await settle();
    assert.deepEqual(rt.started(), [a.reference.reference]);
    assert.deepEqual(p.retain(new Set([a.key])), [b.key]);
    rt.open(a.reference.reference).resolve('id');
    const results = await done;
    assert.equal(results.find((r) => r.key === b.key)!.failure!.kind, 'Canceled');
    assert.deepEqual(rt.started(), [a.reference.reference]);
    assert.equal(rt.active, 0);
  });

  test('retain() forgets failures of images no longer wanted', async () => {
    const rt = new MemoryRuntime();
    const { p } = puller(rt);
    const a = img('a');
    const b = img('b');
    const done = p.pull([a, b], never());
    await settle();
    rt.open(a.reference.reference).reject(new RuntimeError('NotFound', 'manifest unknown', 5));
    rt.open(b.reference.reference).reject(new RuntimeError('NotFound', 'manifest unknown', 5));
    await done;
    assert.deepEqual(p.retain(new Set([a.key])), []);
    assert.ok(p.failure(a.key));
    assert.equal(p.failure(b.key), undefined);
    assert.equal(p.isDue(b.key), true);
  });

  test('abortAll() cancels every pull in flight', async () => {
    const rt = new MemoryRuntime();
    const { p } = puller(rt);
    const done = p.pull([img('a'), img('b')], never());
    await settle();
    p.abortAll();
    const results = await done;
    assert.ok(rt.calls.every((c) => c.opts.signal!.aborted));
    assert.ok(results.every((r) => r.failure?.kind === 'Canceled'));
  });

  test('after a cancellation, the slot is free for the next pull', async () => {
    const rt = new MemoryRuntime();
    const { p } = puller(rt, { maxParallel: 1 });
    const a = img('a');
    const b = img('b');
    const first = p.pull([a], never());
    await settle();
    p.retain(new Set());
    await first;
    const second = p.pull([b], never());
    await settle();
    assert.equal(rt.active, 1);
    rt.open(b.reference.reference).resolve('id');
    assert.equal((await second)[0]!.ok, true);
  });
});

describe('ImagePuller: a pull whose admission was withdrawn before it started', () => {
  test('mayStart false when its turn comes: held back, the runtime never asked, no failure kept; pulls under way finish', async () => {
    const rt = new MemoryRuntime();
    const { p } = puller(rt, { maxParallel: 1 });
    const [a, b, c] = ['a', 'b', 'c'].map((n) => img(n));
    let slotHeld = true;
    const done = p.pull([a!, b!, c!], never(), { mayStart: () => slotHeld });
    await settle();
    assert.deepEqual(rt.started(), [a!.reference.reference]);
    slotHeld = false; // the rollout slot was lost while a downloads
    rt.open(a!.reference.reference).resolve('id-a');
    const results = await done;
    assert.deepEqual(rt.started(), [a!.reference.reference], 'b and c never reached the runtime');
    assert.deepEqual(
      results.map((r) => [r.ok, r.heldBack ?? false]),
      [
        [true, false],
        [false, true],
        [false, true],
      ],
    );
    assert.equal(p.failure(b!.key), undefined);
    assert.equal(p.isDue(b!.key), true, 'due again at once, for when a slot is held again');
    const again = p.pull([b!], never(), { mayStart: () => true });
    await settle();
    rt.open(b!.reference.reference).resolve('id-b');
    assert.equal((await again)[0]!.ok, true);
  });
});

describe('ImagePuller: pulls that go one at a time (a first wave\'s fetches)', () => {
  test('a lane pulls one at a time in the order given, holding no parallel pull while it waits; a later round queues behind; a pull cancelled in the lane never reaches the runtime', async () => {
    const rt = new MemoryRuntime();
    const { p } = puller(rt, { maxParallel: 2 });
    const [z, y, x, o, w] = ['z', 'y', 'x', 'o', 'w'].map((n) => img(n));
    const ref = (i: WantedImage) => i.reference.reference;
    const lane = new Map([z!, y!, x!, w!].map((i) => [i.key, 'api/web']));
    const done = p.pull([z!, y!, x!, o!], never(), { oneAtATime: lane });
    await settle();
    assert.deepEqual(rt.started(), [ref(z!), ref(o!)], 'one of the lane, and the other pull beside it');
    const later = p.pull([w!], never(), { oneAtATime: lane });
    rt.open(ref(z!)).resolve('id-z');
    await settle();
    assert.deepEqual(rt.started().slice(2), [ref(y!)]);
    assert.deepEqual(p.retain(new Set([z!, y!, o!, w!].map((i) => i.key))), [x!.key], 'x still waits for its turn');
    rt.open(ref(y!)).resolve('id-y');
    await settle();
    assert.deepEqual(rt.started().slice(3), [ref(w!)], 'x cancelled while it waited: w is next');
    rt.open(ref(w!)).resolve('id-w');
    rt.open(ref(o!)).resolve('id-o');
    const results = await done;
    assert.equal(results.find((r) => r.key === x!.key)!.failure!.kind, 'Canceled');
    assert.equal((await later)[0]!.ok, true);
    assert.equal(rt.maxActive, 2);
  });
});
