// How `pinset uninstall` reads each node's report while it waits
// (src/cli/uninstall-wait.ts nodePins): no pins, pins held and why, a pin
// count it cannot know (an older agent, a report it cannot read), and no
// report at all.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { dropPinsAdvice, nodePins } from '../../src/cli/uninstall-wait.ts';
import { STATUS_ANNOTATION } from '../../src/api/types.ts';

const NOW = new Date('2026-01-01T12:00:00Z');
const report = (doc: Record<string, unknown>) => ({ [STATUS_ANNOTATION]: JSON.stringify({ version: 2, pinFile: 'f', updatedAt: '2026-01-01T11:58:00Z', sets: [], ...doc }) });

describe('a node\'s report, as the uninstall wait reads it', () => {
  test('pins 0: clear', () => {
    assert.deepEqual(nodePins('n', report({ pins: 0 }), NOW), { node: 'n', state: 'clear' });
  });

  test('no annotation: silent (no agent reported there), not waited for', () => {
    assert.deepEqual(nodePins('n', {}, NOW), { node: 'n', state: 'silent' });
    assert.deepEqual(nodePins('n', undefined, NOW), { node: 'n', state: 'silent' });
  });

  test('pins held: how many, and why (static sets named, the reason pins are kept, sets still reported), with the report\'s age', () => {
    const statics = nodePins('n', report({ pins: 2, sets: [{ name: 'boot', source: 'static', gen: 1, phase: 'Ready' }] }), NOW);
    assert.equal(statics.state, 'holding');
    assert.match((statics as { why: string }).why, /sets from the node's static folder still select it \(boot\): remove their files, or run `pinset agent --drop-pins` once the agent is gone \(report 2m old\)/);
    const kept = nodePins('n', report({ pins: 3, pinsKept: '3 pin(s) kept that no set asks for now: the node labels are unknown' }), NOW);
    assert.deepEqual(kept, { node: 'n', state: 'holding', pins: 3, runtime: undefined, why: '3 pin(s) kept that no set asks for now: the node labels are unknown (report 2m old)' });
    const late = nodePins('n', report({ pins: 1 }), NOW);
    assert.match((late as { why: string }).why, /its agent has not reported since the sets were deleted/);
  });

  test('a pin count it cannot know: an agent that does not report one, or a report it cannot read; never taken for 0', () => {
    const old = nodePins('n', report({}), NOW);
    assert.equal(old.state, 'unknown');
    assert.match((old as { why: string }).why, /does not report how many pins it holds .*upgrade pinset first, or run `pinset agent --drop-pins` on it/);
    assert.equal(nodePins('n', report({ pins: 'none' }), NOW).state, 'unknown', 'a bad count is no count');
    const garbled = nodePins('n', { [STATUS_ANNOTATION]: '{not json' }, NOW);
    assert.equal(garbled.state, 'unknown');
    assert.match((garbled as { why: string }).why, /its report cannot be read/);
  });

  test('what to do on a node still holding pins: its runtime\'s flags and Job, as its report names its pins; both when it does not say', () => {
    const ctrd = nodePins('a', report({ pins: 2, pinFile: 'containerd image label io.cri-containerd.pinned' }), NOW);
    const crio = nodePins('b', report({ pins: 1, pinFile: '99-pinset-6f1c2a4e.conf' }), NOW);
    const old = nodePins('c', report({ pinFile: 'none (pre-load only)' }), NOW);
    const advice = dropPinsAdvice([ctrd, crio, old]);
    assert.equal(advice.length, 3);
    assert.match(advice[0]!, /^On a: run `pinset agent --drop-pins --cri-endpoint=unix:\/\/\/run\/containerd\/containerd\.sock --pin-backend=containerd` .*deploy\/drop-pins\/containerd\.yaml\.$/);
    assert.match(advice[1]!, /^On b: .*--crio-dropin-dir.*deploy\/drop-pins\/crio\.yaml\.$/);
    assert.doesNotMatch(advice[1]!, /containerd/);
    assert.match(advice[2]!, /^On c: .*on containerd .*--pin-backend=containerd; on CRI-O its --crio-dropin-dir/);
  });
});
