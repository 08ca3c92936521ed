import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { RateWindow } from '../../src/util/rate-window.ts';

const S = 1000;

describe('RateWindow', () => {
  test('no rate from one observation, nor from two at the same time', () => {
    const w = new RateWindow(60 * S);
    assert.equal(w.rate(), undefined);
    w.add(0, 100);
    assert.equal(w.rate(), undefined);
    w.add(0, 200);
    assert.equal(w.rate(), undefined);
    w.add(10 * S, 300);
    assert.equal(w.rate(), 20, '200 more in 10 s from the first observation at 0');
  });

  test('the rate spans the window: what arrived before its start does not count, one observation at or before the start anchors it', () => {
    const w = new RateWindow(60 * S);
    // 10 per second for two minutes, then 100 per second for a minute.
    for (let t = 0; t <= 120; t += 5) w.add(t * S, t * 10);
    assert.equal(w.rate(), 10);
    for (let t = 125; t <= 180; t += 5) w.add(t * S, 1200 + (t - 120) * 100);
    assert.equal(w.rate(), 100, 'only the last minute counts');
    // Half way into the change: the window holds 30 s of each.
    const h = new RateWindow(60 * S);
    for (let t = 0; t <= 120; t += 5) h.add(t * S, t * 10);
    for (let t = 125; t <= 150; t += 5) h.add(t * S, 1200 + (t - 120) * 100);
    assert.equal(h.rate(), 55);
  });

  test('observations further apart than the window: the rate reaches back to the previous one', () => {
    const w = new RateWindow(60 * S);
    w.add(0, 0);
    w.add(300 * S, 600);
    assert.equal(w.rate(), 2);
  });

  test('a count that goes down starts the window over', () => {
    const w = new RateWindow(60 * S);
    w.add(0, 0);
    w.add(10 * S, 100);
    w.add(20 * S, 50);
    assert.equal(w.rate(), undefined);
    w.add(30 * S, 150);
    assert.equal(w.rate(), 10);
  });

  test('an observation older than the newest is ignored', () => {
    const w = new RateWindow(60 * S);
    w.add(10 * S, 100);
    w.add(20 * S, 200);
    w.add(15 * S, 999);
    assert.equal(w.rate(), 10);
    assert.equal(w.last?.value, 200);
  });

  test('bounded: fed every 10 ms for an hour it keeps at most maxSamples + 2 observations, and the rate is still right', () => {
    const w = new RateWindow(5 * 60 * S, 32);
    let most = 0;
    for (let t = 0; t <= 3600 * S; t += 10) {
      w.add(t, t * 3);
      most = Math.max(most, w.size);
    }
    assert.ok(most <= 34, `kept ${most}`);
    assert.ok(Math.abs(w.rate()! - 3000) < 1e-6, `rate ${w.rate()}`);
    const span = w.span()!;
    assert.ok(span.to.at - span.from.at >= 5 * 60 * S, 'the span covers the whole window');
    assert.ok(span.to.at - span.from.at <= 5 * 60 * S + (5 * 60 * S) / 32 + 10, 'and not much more');
  });

  test('meanActive: the time-weighted mean of the active count over the same span', () => {
    const w = new RateWindow(100 * S);
    w.add(0, 0, 1);
    w.add(30 * S, 30, 3);
    w.add(90 * S, 150, 2);
    w.add(100 * S, 170, 2);
    // 1 for 30 s, 3 for 60 s, 2 for 10 s, over 100 s.
    assert.equal(w.meanActive(), (30 + 180 + 20) / 100);
  });

  test('a window must be positive', () => {
    assert.throws(() => new RateWindow(0), RangeError);
  });
  test('a rate from a start inside the window: from the newest observation at or before it, the oldest if none is', () => {
    const w = new RateWindow(100 * S);
    // 1 per second for 50 s, then 5 per second, 10 workers then 2.
    for (let t = 0; t <= 50; t += 10) w.add(t * S, t, 10);
    for (let t = 60; t <= 100; t += 10) w.add(t * S, 50 + (t - 50) * 5, 2);
    assert.equal(w.rate(), 3);
    assert.equal(w.rate(55 * S), 5, 'from the observation at 50 s');
    // The observation at 50 s (10 workers) holds until 60 s, then 2 for 40 s.
    assert.equal(w.meanActive(55 * S), 3.6);
    assert.equal(w.rate(-10 * S), 3, 'before the oldest: from the oldest');
    assert.equal(w.rate(100 * S), undefined, 'from the newest: no span');
  });
});
