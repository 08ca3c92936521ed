// The kubelet's rules for its credential verification of images on the
// node, against the cases of the kubelet's own tests
// (pkg/kubelet/images/pullmanager/image_pull_policies_test.go of 1.35.6 and
// of 1.36.2: TestNeverVerifyAllowlistedImages and, from 1.36,
// TestTrimImageTagDigest, re-expressed here) and what was seen on a real
// 1.35 kubelet (docs/kubelet-credential-verification.md).
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import {
  allowlistEntryFor,
  allowlistEntryProblem,
  allowlistMatches,
  allowlistMatching,
  exactAllowlistEntryFor,
  kubeletMinor,
  minimalAllowlist,
  offlineVerdict,
  requiresVerification,
  trimTagDigest,
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

describe('Kubernetes 1.36: the allowlist matched on the repository (kubernetes#137629)', () => {
  test('the matching by kubelet version: 1.36 and later on the repository, 1.35 and earlier (and an unknown version) on the whole image', () => {
    assert.equal(allowlistMatching('v1.36.2'), 'repository');
    assert.equal(allowlistMatching('v1.36.0-beta.0'), 'repository');
    assert.equal(allowlistMatching('v1.37.1+k3s1'), 'repository');
    assert.equal(allowlistMatching('v1.35.6'), 'image');
    assert.equal(allowlistMatching('v1.33.12'), 'image');
    assert.equal(allowlistMatching(undefined), 'image');
    assert.equal(allowlistMatching('nonsense'), 'image');
    assert.equal(kubeletMinor('1.36'), 36);
    assert.equal(kubeletMinor('v2.0.1'), 99);
    assert.equal(kubeletMinor('v1.3x'), undefined);
  });

  // TestNeverVerifyAllowlistedImages of 1.36.2: the image asked about is basicTestImage, with a tag.
  const TAGGED = 'test.io/test/test-image:tag';
  const cases: { name: string; image: string; pulled: boolean; allowlist: string[]; verify: boolean }[] = [
    { name: 'no records, not in the allowlist', image: TAGGED, pulled: false, verify: true, allowlist: ['test.io/test/image1', 'test.io/test/image2', 'test.io/test/image3'] },
    { name: 'records, not in the allowlist', image: TAGGED, pulled: true, verify: true, allowlist: ['test.io/test/image1', 'test.io/test/image3', 'test.io/test/image2', 'test.io/test/image3'] },
    { name: 'no records, in the allowlist by its repository', image: TAGGED, pulled: false, verify: false, allowlist: ['test.io/test/image1', 'test.io/test/image2', IMAGE, 'test.io/test/image3'] },
    { name: 'records, in the allowlist by its repository', image: TAGGED, pulled: true, verify: false, allowlist: ['test.io/test/image1', 'test.io/test/image2', IMAGE, 'test.io/test/image3'] },
    { name: 'a wildcard of another registry', image: TAGGED, pulled: false, verify: true, allowlist: ['test.io/test/image1', 'test.io/test/image2', 'different.repo/test/*'] },
    { name: 'a wildcard of the organisation', image: TAGGED, pulled: false, verify: false, allowlist: ['test.io/test/image1', 'test.io/test/image2', 'test.io/test/*'] },
    { name: 'a wildcard of the registry', image: TAGGED, pulled: false, verify: false, allowlist: ['test.io/test/image1', 'test.io/test/image2', 'test.io/*'] },
    { name: '"familiar" image, docker-disambiguated name listed: no match', image: 'ubuntu', pulled: false, verify: true, allowlist: ['docker.io/library/ubuntu'] },
    { name: '"familiar" image, docker-disambiguated wildcard listed: no match', image: 'ubuntu', pulled: false, verify: true, allowlist: ['docker.io/library/*'] },
    { name: '"familiar" image, "familiar" name listed', image: 'ubuntu', pulled: false, verify: false, allowlist: ['ubuntu'] },
    { name: '"familiar" image with a tag, "familiar" name listed', image: 'ubuntu:tagged', pulled: false, verify: false, allowlist: ['ubuntu'] },
    { name: '"familiar" image with a digest, "familiar" name listed', image: `ubuntu@${D}`, pulled: false, verify: false, allowlist: ['ubuntu'] },
  ];
  for (const c of cases) {
    test(`NeverVerifyAllowlistedImages: ${c.name}`, () => {
      for (const e of c.allowlist) assert.equal(allowlistEntryProblem(e, 'repository'), undefined, e);
      assert.equal(requiresVerification('NeverVerifyAllowlistedImages', c.allowlist, c.image, c.pulled, 'repository'), c.verify);
    });
  }

  test('the entries 1.36 refuses are those 1.35 refuses, but a name need not be normalized (reference.Parse, not ParseNormalizedNamed)', () => {
    for (const [entry, why] of [
      ['image.repo/pokus*/imagename', /wildcard/],
      ['/*', /registry host/],
      ['image.repo/', /not an image name/],
      ['', /empty/],
      ['test.io/test/image1:tagged', /tag nor a digest/],
      [`test.io/test/image1@${D}`, /tag nor a digest/],
      ['test.io/test/image1 ', /spaces/],
      ['test.io/Test/image', /not an image name/],
      ['registry.test:5000', /tag nor a digest/],
    ] as const) {
      assert.match(allowlistEntryProblem(entry, 'repository') ?? 'taken', why, entry);
    }
    for (const entry of ['ubuntu', 'docker.io/nginx', 'library/nginx', 'registry.test/kep/p1', 'localhost:5000/app', 'a'.repeat(64)]) {
      assert.equal(allowlistEntryProblem(entry, 'repository'), undefined, entry);
    }
    // The same names in 1.35: only normalized ones.
    assert.match(allowlistEntryProblem('ubuntu', 'image')!, /normalized/);
    assert.match(allowlistEntryProblem('a'.repeat(64), 'image')!, /64 hexadecimal/);
  });

  test('trimTagDigest: the cases of TestTrimImageTagDigest', () => {
    const d = 'sha256:38a8906435c4dd5f4258899d46621bfd8eea3ad6ff494ee3c2f17ef0321625bd';
    for (const [image, name] of [
      ['myimage', 'myimage'],
      ['myimage:latest', 'myimage'],
      [`myimage@${d}`, 'myimage'],
      [`myimage:v1@${d}`, 'myimage'],
      ['registry.io/myimage:v1.0', 'registry.io/myimage'],
      [`registry.io/myimage:latest@${d}`, 'registry.io/myimage'],
      ['registry.io/myorg/myimage', 'registry.io/myorg/myimage'],
      [`registry.io/myorg/myimage:v2@${d}`, 'registry.io/myorg/myimage'],
      ['registry.io/a/b/c/myimage:latest', 'registry.io/a/b/c/myimage'],
      ['localhost:5000/myimage:v1', 'localhost:5000/myimage'],
      ['myregistry:5000/myorg/myimage:v1', 'myregistry:5000/myorg/myimage'],
      ['docker.io/taghere/image:taghere', 'docker.io/taghere/image'],
      [`registry.io/38a8906435c4dd5f4258899d46621bfd8eea3ad6ff494ee3c2f17ef0321625bd/myorg/image@${d}`, 'registry.io/38a8906435c4dd5f4258899d46621bfd8eea3ad6ff494ee3c2f17ef0321625bd/myorg/image'],
    ] as const) {
      assert.equal(trimTagDigest(image), name, image);
    }
    // What the kubelet cannot parse it matches as written (imageMatches' fallback).
    for (const image of ['registry.io/myorg/', 'registry.io/myorg/:tag', `registry.io/myorg/@${d}`]) assert.equal(trimTagDigest(image), image);
  });

  test('an exact entry covers its repository, any tag or digest, and no sibling; the same entry in 1.35 matches no pod', () => {
    const p1 = `registry.test/kep/p1@${D}`;
    assert.equal(exactAllowlistEntryFor(p1), 'registry.test/kep/p1');
    assert.equal(allowlistMatches(['registry.test/kep/p1'], p1, 'repository'), true);
    assert.equal(allowlistMatches(['registry.test/kep/p1'], 'registry.test/kep/p1:v2', 'repository'), true);
    assert.equal(allowlistMatches(['registry.test/kep/p1'], `registry.test/kep/p2@${D}`, 'repository'), false);
    assert.equal(allowlistMatches(['registry.test/kep/p1'], `registry.test/kep/p1x@${D}`, 'repository'), false);
    assert.equal(allowlistMatches(['registry.test/kep/p1'], p1, 'image'), false);
    assert.equal(offlineVerdict('NeverVerifyAllowlistedImages', ['registry.test/kep/p1'], p1, 'repository'), 'starts');
    assert.equal(offlineVerdict('NeverVerifyAllowlistedImages', ['registry.test/kep/p1'], `registry.test/kep/sibling@${D}`, 'repository'), 'verified');
  });

  test('a "/*" entry is a prefix of the name without tag or digest: the same repositories as in 1.35, never the repository\'s own "/*"', () => {
    const p1 = `registry.test/kep/p1@${D}`;
    assert.equal(allowlistMatches(['registry.test/kep/*'], p1, 'repository'), true);
    assert.equal(allowlistMatches(['registry.test/kep/*'], `registry.test/kep/sibling@${D}`, 'repository'), true);
    assert.equal(allowlistMatches(['registry.test/kep/p1/*'], p1, 'repository'), false);
    assert.equal(allowlistMatches(['registry.test:5000/*'], `registry.test:5000/solo@${D}`, 'repository'), true);
  });
});
