// Which is newer, the granter's own write or what its watch shows
// (src/rollout/own-writes.ts), in each order the two can arrive.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { OwnWrites } from '../../src/rollout/own-writes.ts';
import type { LeaseObject } from '../../src/rollout/lease-slots.ts';

const lease = (version: string, uid = 'u1', holder = 'a'): LeaseObject => ({ apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: 'web-0', namespace: 'ns', uid, resourceVersion: version }, spec: { holderIdentity: holder } });

describe('OwnWrites', () => {
  test('the answer first: placed; an event of the version it replaced is older and ignored; the written version itself and later ones are taken', () => {
    const o = new OwnWrites();
    o.begin('web-0');
    assert.equal(o.answered('web-0', lease('12'), '10'), 'place');
    assert.equal(o.seen(lease('10')), false, 'the version written over');
    assert.equal(o.seen(lease('12')), true);
    assert.equal(o.seen(lease('10')), true, 'once the watch showed the write, it stands alone');
  });

  test('the watch first: the written version and a newer one shown while the write was in flight; the answer is older and not placed', () => {
    const o = new OwnWrites();
    o.begin('web-0');
    assert.equal(o.seen(lease('12')), true);
    assert.equal(o.seen(lease('13')), true, 'the node took it');
    assert.equal(o.answered('web-0', lease('12'), '10'), 'seen');
    assert.equal(o.seen(lease('10')), true, 'nothing is held back after an answer not placed');
  });

  test('the watch first, up to the written version only: the answer is the same version, not placed again', () => {
    const o = new OwnWrites();
    o.begin('web-0');
    assert.equal(o.seen(lease('12')), true);
    assert.equal(o.answered('web-0', lease('12'), '10'), 'seen');
  });

  test('a deletion shown before the answer wins, whatever version it carries', () => {
    const o = new OwnWrites();
    o.begin('web-0');
    o.gone(lease('14'));
    assert.equal(o.answered('web-0', lease('12'), ''), 'gone');
  });

  test('a deletion of an earlier object of the same name (another uid) does not hide the one created', () => {
    const o = new OwnWrites();
    o.begin('web-0');
    o.gone(lease('9', 'u0'));
    assert.equal(o.answered('web-0', lease('12', 'u1'), ''), 'place');
  });

  test('a watch behind the write (events of older versions only while it was in flight): the answer is placed', () => {
    const o = new OwnWrites();
    o.begin('web-0');
    assert.equal(o.seen(lease('10')), true);
    assert.equal(o.answered('web-0', lease('12'), '10'), 'place');
    assert.equal(o.seen(lease('10')), false);
  });

  test('a failed write places nothing and leaves nothing behind', () => {
    const o = new OwnWrites();
    o.begin('web-0');
    o.gone(lease('12'));
    assert.equal(o.answered('web-0', undefined, '10'), 'seen');
    o.begin('web-0');
    assert.equal(o.answered('web-0', lease('15'), '10'), 'place', 'the deletion seen during the earlier write does not count for this one');
  });

  test('a deletion after a placed write forgets it: an event of the replaced version is taken again', () => {
    const o = new OwnWrites();
    o.begin('web-0');
    assert.equal(o.answered('web-0', lease('12'), '10'), 'place');
    o.gone(lease('13'));
    assert.equal(o.seen(lease('10', 'u2')), true);
  });
});
