// The kubelet's rules for its credential verification of images on the
// node, against the cases of the 1.35 kubelet's own tests
// (pkg/kubelet/images/pullmanager/image_pull_policies_test.go, re-expressed
// here) and what was seen on a real 1.35 kubelet
// (../shared/facts/kubelet-credential-verification.md).
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import {
  allowlistEntryFor,
  allowlistEntryProblem,
  allowlistMatches,
  minimalAllowlist,
  offlineVerdict,
  requiresVerification,
} from '../../src/api/kubelet-verification.ts';

const D = 'sha256:' + 'a'.repeat(64);
const IMAGE = 'test.io/test/test-image';

describe('the policies (RequireCredentialVerificationForImage)', () => {
  test('NeverVerifyPreloadedImages verifies only an image the kubelet has records of', () => {
    assert.equal(requiresVerification('NeverVerifyPreloadedImages', [], 'test-image', false), false);
    assert.equal(requiresVerification('NeverVerifyPreloadedImages', [], 'test-image', true), true);
  });
  test('NeverVerify never verifies, AlwaysVerify always does, records or not', () => {
    for (const pulled of [false, true]) {
      assert.equal(requiresVerification('NeverVerify', [], IMAGE, pulled), false);
      assert.equal(requiresVerification('AlwaysVerify', [], IMAGE, pulled), true);
    }
  });

  // The kubelet's table for NewNeverVerifyAllowListedPullPolicy: the image asked about is always IMAGE.
  const cases: { name: string; pulled: boolean; allowlist: string[]; verify: boolean }[] = [
    { name: 'no records, not in the allowlist', pulled: false, verify: true, allowlist: ['test.io/test/image1', 'test.io/test/image2', 'test.io/test/image3'] },
    { name: 'records, not in the allowlist', pulled: true, verify: true, allowlist: ['test.io/test/image1', 'test.io/test/image3', 'test.io/test/image2', 'test.io/test/image3'] },
    { name: 'no records, in the allowlist', pulled: false, verify: false, allowlist: ['test.io/test/image1', 'test.io/test/image2', IMAGE, 'test.io/test/image3'] },
    { name: 'records, in the allowlist', pulled: true, verify: false, allowlist: ['test.io/test/image1', 'test.io/test/image2', IMAGE, 'test.io/test/image3'] },
    { name: 'a wildcard of another registry', pulled: false, verify: true, allowlist: ['test.io/test/image1', 'test.io/test/image2', 'different.repo/test/*'] },
    { name: 'a wildcard of the organisation', pulled: false, verify: false, allowlist: ['test.io/test/image1', 'test.io/test/image2', 'test.io/test/*'] },
    { name: 'a wildcard of the registry', pulled: false, verify: false, allowlist: ['test.io/test/image1', 'test.io/test/image2', 'test.io/*'] },
  ];
  for (const c of cases) {
    test(`NeverVerifyAllowlistedImages: ${c.name}`, () => {
      for (const e of c.allowlist) assert.equal(allowlistEntryProblem(e), undefined, e);
      assert.equal(requiresVerification('NeverVerifyAllowlistedImages', c.allowlist, IMAGE, c.pulled), c.verify);
    });
  }
});

describe('allowlist entries the kubelet refuses (getAllowlistImagePattern)', () => {
  const refused: [string, RegExp][] = [
    ['image.repo/pokus*/imagename', /wildcard/],
    ['image.repo/pokus*', /wildcard/],
    ['image.repo/*/imagename', /wildcard/],
    ['/*', /registry host/],
    ['image.repo/', /not an image name/],
    ['', /empty/],
    ['*', /wildcard/],
    ['test.io/test/image1:tagged', /tag nor a digest/],
    [`test.io/test/image1@${D}`, /tag nor a digest/],
    ['test.io/test/image1 ', /spaces/],
    [' test.io/*', /spaces/],
    // Names the kubelet does not take as they are: they must be normalized.
    ['nginx', /normalized.*docker\.io\/library\/nginx/],
    ['docker.io/nginx', /normalized.*docker\.io\/library\/nginx/],
    ['index.docker.io/library/nginx', /normalized/],
    ['test.io/Test/image', /not an image name/],
    ['a'.repeat(64), /64 hexadecimal/],
  ];
  for (const [entry, why] of refused) {
    test(JSON.stringify(entry), () => {
      const problem = allowlistEntryProblem(entry);
      assert.ok(problem, `${entry} was taken`);
      assert.match(problem, why);
    });
  }

  const taken = ['test.io/*', 'a/*', 'registry.test:5000/kep/*', 'docker.io/library/nginx', 'localhost:5000/app', 'localhost/app', 'registry.test/kep/p1', '[::1]:5000/app'];
  for (const entry of taken) test(`takes ${JSON.stringify(entry)}`, () => assert.equal(allowlistEntryProblem(entry), undefined));
});

describe('matching the pod\'s image as written', () => {
  const p1 = `registry.test/kep/p1@${D}`;
  test('a "/*" entry is a prefix: it covers the repositories below it, siblings too', () => {
    assert.equal(allowlistMatches(['registry.test/kep/*'], p1), true);
    assert.equal(allowlistMatches(['registry.test/kep/*'], `registry.test/kep/p2@${D}`), true);
    assert.equal(allowlistMatches(['registry.test/kep/*'], 'registry.test/kep/deep/p3:v1'), true);
    assert.equal(allowlistMatches(['registry.test/kep/*'], `registry.test/other/p1@${D}`), false);
  });
  test('the repository\'s own name followed by "/*" does not cover it', () => {
    assert.equal(allowlistMatches(['registry.test/kep/p1/*'], p1), false);
  });
  test('a bare name never matches a pod image, which always carries a tag or a digest (why pods of P1 failed with the names listed)', () => {
    assert.equal(allowlistMatches(['registry.test/kep/p1', 'registry.test/kep/p2'], p1), false);
    assert.equal(allowlistMatches(['registry.test/kep/p1'], 'registry.test/kep/p1:latest'), false);
    assert.equal(allowlistMatches(['registry.test/kep/p1'], 'registry.test/kep/p1'), true);
  });
  test('the pod\'s spelling is not normalized: docker.io/library/* does not cover "nginx:1"', () => {
    assert.equal(allowlistMatches(['docker.io/library/*'], 'nginx:1'), false);
    assert.equal(allowlistMatches(['docker.io/library/*'], 'docker.io/library/nginx:1'), true);
  });
});

describe('allowlistEntryFor and minimalAllowlist', () => {
  test('the entry of an image is its name\'s parent path and "/*", and it covers the image', () => {
    for (const [image, entry] of [
      [`registry.test/kep/p1@${D}`, 'registry.test/kep/*'],
      [`registry.test/p1@${D}`, 'registry.test/*'],
      [`registry.test:5000/a/b/c@${D}`, 'registry.test:5000/a/b/*'],
      ['quay.io/org/app:v1', 'quay.io/org/*'],
    ] as const) {
      assert.equal(allowlistEntryFor(image), entry);
      assert.equal(allowlistEntryProblem(entry), undefined);
      assert.equal(allowlistMatches([entry], image), true);
    }
  });
  test('a name without "/" has no entry', () => {
    assert.equal(allowlistEntryFor('busybox:1'), undefined);
    assert.equal(allowlistEntryFor(`busybox@${D}`), undefined);
  });
  test('duplicates and entries under a shorter "/*" entry are dropped; the order is sorted', () => {
    assert.deepEqual(minimalAllowlist(['registry.test/kep/sub/*', 'quay.io/org/*', 'registry.test/kep/*', 'quay.io/org/*', 'registry.test/kep/p1', 'quay.io/other/*']), [
      'quay.io/org/*',
      'quay.io/other/*',
      'registry.test/kep/*',
    ]);
    assert.deepEqual(minimalAllowlist(['a.io/x/*', 'a.io/xy/*']), ['a.io/x/*', 'a.io/xy/*']);
  });
});

describe('offlineVerdict', () => {
  const p1 = `registry.test/kep/p1@${D}`;
  test('each policy on a pinned image with the registry out of reach', () => {
    assert.equal(offlineVerdict('NeverVerify', [], p1), 'starts');
    assert.equal(offlineVerdict('NeverVerifyPreloadedImages', [], p1), 'unless-kubelet-pulled');
    assert.equal(offlineVerdict('NeverVerifyAllowlistedImages', ['registry.test/kep/*'], p1), 'starts');
    assert.equal(offlineVerdict('NeverVerifyAllowlistedImages', ['registry.test/kep/p1'], p1), 'verified');
    assert.equal(offlineVerdict('AlwaysVerify', [], p1), 'verified');
  });
});
