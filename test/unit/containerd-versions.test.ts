// Which containerd versions pin (issue 18: a label set after the pull is
// honoured from 1.6.25, 1.7.10 and in every 2.x), in the forms CRI Version
// and `containerd --version` report them.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { containerdCanPin, parseContainerdVersion } from '../../src/containerd/versions.ts';

describe('containerdCanPin', () => {
  const pins = ['1.6.25', '1.6.39', '1.7.10', '1.7.24', '1.7.24~ds1', 'v1.7.24', '1.7.29', '2.0.0', 'v2.1.5', '2.1.5+unknown', '2.0.0-rc.1'];
  const cannot = ['1.6.20', '1.6.20~ds1', '1.6.21', '1.6.22', '1.6.24', 'v1.6.24', '1.7.0', '1.7.2', '1.7.3', '1.7.9', '1.5.18', '1.4.0', '0.9.0', '1.7.10-rc.1', '1.6.25-beta.0'];
  for (const v of pins) test(`${v} pins`, () => assert.deepEqual(containerdCanPin(v), { ok: true }));
  for (const v of cannot) {
    test(`${v} cannot pin, and says which versions can`, () => {
      const r = containerdCanPin(v);
      assert.equal(r.ok, false);
      assert.ok(!r.ok && r.why.includes(v), 'names the version found');
      assert.ok(!r.ok && /1\.6\.25.*1\.7\.10.*2\.x/.test(r.why), r.ok ? '' : r.why);
    });
  }
  for (const v of ['', 'unknown', 'containerd', 'abc.def']) {
    test(`"${v}" is not a version: cannot tell, so no pins`, () => {
      const r = containerdCanPin(v);
      assert.equal(r.ok, false);
      assert.match(r.ok ? '' : r.why, /not a version number/);
    });
  }
});

describe('parseContainerdVersion', () => {
  test("Debian's ~ds1 is a release; -rc is a pre-release", () => {
    assert.deepEqual(parseContainerdVersion('1.7.24~ds1'), { major: 1, minor: 7, patch: 24, prerelease: false });
    assert.deepEqual(parseContainerdVersion('v2.1.5'), { major: 2, minor: 1, patch: 5, prerelease: false });
    assert.deepEqual(parseContainerdVersion('1.7.10-rc.2'), { major: 1, minor: 7, patch: 10, prerelease: true });
    assert.equal(parseContainerdVersion('x1.7.24'), undefined);
  });
});

describe('containerdCanPin agrees with the containerd twin', () => {
  test('for every version the twin copies, "can pin" is the twin pinning a label set after the pull', async () => {
    const { pinBehaviourOf } = await import('../support/fake-containerd.ts');
    for (let minor = 6; minor <= 7; minor++) {
      for (let patch = 0; patch <= 40; patch++) {
        const v = `1.${minor}.${patch}`;
        assert.equal(containerdCanPin(v).ok, pinBehaviourOf(v) === 'live', v);
      }
    }
    for (const v of ['2.0.0', '2.1.5', '1.5.9']) assert.equal(containerdCanPin(v).ok, pinBehaviourOf(v) === 'live', v);
  });
});
