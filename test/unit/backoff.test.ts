import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Backoff, backoffDelay, type BackoffPolicy } from '../../src/util/backoff.ts';
import { RETRY_POLICY } from '../../src/agent/puller.ts';

const policy: BackoffPolicy = { baseMs: 1_000, capMs: 60_000 };
const low = () => 0;
const high = () => 0.999999;

describe('backoffDelay', () => {
  test('doubles per failure, from base', () => {
    // With the jitter at its top, the delay is the nominal one.
    assert.deepEqual(
      [1, 2, 3, 4, 5].map((n) => backoffDelay(policy, n, () => 1)),
      [1_000, 2_000, 4_000, 8_000, 16_000],
    );
  });

  test('equal jitter: between half the nominal delay and the nominal delay', () => {
    for (let n = 1; n <= 10; n++) {
      const nominal = Math.min(policy.capMs, policy.baseMs * 2 ** (n - 1));
      assert.equal(backoffDelay(policy, n, low), nominal / 2);
      assert.ok(backoffDelay(policy, n, high) <= nominal);
      assert.ok(backoffDelay(policy, n, high) > nominal * 0.99);
    }
  });

  test('never above the cap, even after very many failures', () => {
    for (const n of [7, 8, 30, 31, 100, 10_000]) {
      const d = backoffDelay(policy, n, () => 1);
      assert.equal(d, policy.capMs, `after ${n} failures`);
      assert.ok(Number.isFinite(d));
    }
  });

  test('no failures, or a zero policy, means no delay', () => {
    assert.equal(backoffDelay(policy, 0, high), 0);
    assert.equal(backoffDelay({ baseMs: 0, capMs: 0 }, 5, high), 0);
  });

  test('the jitter spreads nodes that failed together', () => {
    let seed = 7;
    const random = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
    const delays = new Set(Array.from({ length: 100 }, () => backoffDelay(policy, 4, random)));
    assert.ok(delays.size > 50, `only ${delays.size} distinct delays`);
  });
});

describe('RETRY_POLICY', () => {
  test('each failure kind has its own pace: a person is needed for NotFound and Unauthorized', () => {
    const first = (k: keyof typeof RETRY_POLICY) => backoffDelay(RETRY_POLICY[k], 1, () => 1);
    assert.ok(first('Unavailable') < first('Other'));
    assert.ok(first('Other') < first('Unauthorized'));
    assert.ok(first('Unauthorized') <= first('NotFound'));
    assert.equal(first('Canceled'), 0, 'a cancelled pull is retried at once if wanted again');
    for (const [kind, p] of Object.entries(RETRY_POLICY)) {
      assert.ok(p.capMs >= p.baseMs, kind);
      assert.ok(p.capMs <= 15 * 60_000, `${kind}: retried at least every 15 minutes`);
    }
  });
});

describe('Backoff', () => {
  test('grows with each failure and starts over after reset', () => {
    const b = new Backoff(policy, () => 1);
    assert.deepEqual([b.fail(), b.fail(), b.fail()], [1_000, 2_000, 4_000]);
    assert.equal(b.failures, 3);
    b.reset();
    assert.equal(b.failures, 0);
    assert.equal(b.fail(), 1_000);
  });
});
