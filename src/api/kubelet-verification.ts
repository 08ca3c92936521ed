// The kubelet's credential verification of images already on the node
// (KEP-2535, feature gate KubeletEnsureSecretPulledImages, beta and on by
// default in Kubernetes 1.35), as the kubelet decides it:
// pkg/kubelet/images/pullmanager/image_pull_policies.go (the policies, the
// allowlist's rules and its matching) and pkg/kubelet/images/image_manager.go
// (what the policy is asked about: the pod's image string as written in
// its spec, a default tag added, never normalized).
//
// What follows from those rules for pinset, by kubelet version:
// - An allowlist entry ending in "/*" is a prefix (the "*" dropped):
//   "registry.test/kep/*" covers "registry.test/kep/p1@sha256:…", and
//   every sibling repository below "registry.test/kep/" too.
// - 1.33 to 1.35 (NeverVerifyAllowlistedImages.imageMatches compares
//   absoluteURLs.Has(image)): any other entry must be a normalized image
//   name without tag or digest, and is compared for equality with the
//   pod's whole image string, which always carries a tag or a digest: such
//   an entry matches no pod. So for these kubelets pinset writes "/*"
//   entries only.
// - 1.36 and later (kubernetes#137629: imageMatches first strips the tag
//   and digest with trimImageTagDigest, and getAllowlistImagePattern takes
//   any name reference.Parse accepts, normalized or not): an exact entry
//   "registry.test/kep/p1" matches that repository with any tag or digest,
//   and no sibling; a "/*" entry is a prefix of the name without its tag or
//   digest. So for these pinset writes each repository as an exact entry.
// - "registry.test/kep/p1/*" does not cover "registry.test/kep/p1@…" in
//   either: the entry covering a repository by prefix is its parent path
//   followed by "/*".
import { MAX_NAME_LENGTH } from './reference.ts';

export const VERIFICATION_POLICIES = ['NeverVerify', 'NeverVerifyPreloadedImages', 'NeverVerifyAllowlistedImages', 'AlwaysVerify'] as const;
export type VerificationPolicy = (typeof VERIFICATION_POLICIES)[number];

/** The policy a 1.35 kubelet with the gate on uses when its configuration names none (v1beta1 defaults.go). */
export const DEFAULT_VERIFICATION_POLICY: VerificationPolicy = 'NeverVerifyPreloadedImages';

/** The feature gate of KEP-2535: alpha (off) in 1.33 and 1.34, beta (on) from 1.35. */
export const GATE = 'KubeletEnsureSecretPulledImages';

/** The minor of a kubelet version ("v1.35.6", "v1.33.1+k3s1", "1.36"): 99 past 1.x, undefined when it is no version. */
export function kubeletMinor(kubeletVersion: string | undefined): number | undefined {
  const m = /^v?(\d+)\.(\d+)(?:$|[.+-])/.exec(kubeletVersion ?? '');
  if (!m) return undefined;
  return Number(m[1]) === 1 ? Number(m[2]) : 99;
}

/** The gate's default for a kubelet version ("v1.35.6", "v1.33.1+k3s1"); undefined version: taken as 1.35. */
export function gateDefault(kubeletVersion: string | undefined): { known: boolean; on: boolean } {
  const minor = kubeletMinor(kubeletVersion);
  if (minor === undefined) return { known: true, on: true };
  return { known: minor >= 33, on: minor >= 35 };
}

/**
 * How a kubelet matches the pod's image with its allowlist, and which
 * entries it takes:
 * - "image" (1.33 to 1.35): an exact entry is compared with the whole image
 *   string, tag or digest included; entries must be normalized names;
 * - "repository" (1.36 and later, kubernetes#137629): the image's tag and
 *   digest are stripped first, so an exact entry names one repository;
 *   any name reference.Parse accepts is taken.
 */
export type AllowlistMatching = 'image' | 'repository';

/** The first kubelet minor that matches on the repository (image_pull_policies.go trimImageTagDigest, v1.36.0). */
export const REPOSITORY_MATCHING_SINCE = 36;

/** The matching of a kubelet version; an unknown version counts as 1.35 (like the gate), whose rules are the stricter. */
export function allowlistMatching(kubeletVersion: string | undefined): AllowlistMatching {
  const minor = kubeletMinor(kubeletVersion);
  return minor !== undefined && minor >= REPOSITORY_MATCHING_SINCE ? 'repository' : 'image';
}

export function isVerificationPolicy(v: unknown): v is VerificationPolicy {
  return typeof v === 'string' && (VERIFICATION_POLICIES as readonly string[]).includes(v);
}

// distribution/reference's grammar (regexp.go) for a name without tag or digest.
const domainComponent = '(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])';
const domain = `(?:${domainComponent}(?:\\.${domainComponent})*|\\[[a-fA-F0-9:]+\\])(?::[0-9]+)?`;
const pathComponent = '[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*';
const nameRe = new RegExp(`^(?:${domain}/)?${pathComponent}(?:/${pathComponent})*$`);
const tagOrDigestRe = /(?::[\w][\w.-]{0,127}|@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})$/;
const identifierRe = /^[a-f0-9]{64}$/;
// reference.Parse's whole reference: a name, then an optional tag, then an optional digest.
const referenceRe = new RegExp(
  `^((?:${domain}/)?${pathComponent}(?:/${pathComponent})*)(?::[\\w][\\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$`,
);

/**
 * The image's name without its tag and digest, as the 1.36 kubelet's
 * trimImageTagDigest makes it (image_pull_policies.go); the image itself
 * when it does not parse, as imageMatches then falls back to it.
 */
export function trimTagDigest(image: string): string {
  return referenceRe.exec(image)?.[1] ?? image;
}

/** The path of a name as reference.Parse splits it (anchoredNameRegexp: a first component followed by "/" is the domain). */
function pathOf(name: string): string {
  const m = new RegExp(`^(?:${domain}/)?(.*)$`).exec(name);
  return m?.[1] ?? name;
}

/**
 * The name distribution's ParseNormalizedNamed makes of `name` (docker.io
 * and library/ added the way the docker CLI adds them); the kubelet
 * accepts an entry without "/*" only when it is already this.
 */
function normalizedName(name: string): string {
  const slash = name.indexOf('/');
  const first = slash < 0 ? '' : name.slice(0, slash);
  const isDomain = slash >= 0 && (/[.:]/.test(first) || first === 'localhost' || first.toLowerCase() !== first);
  let host = isDomain ? first : 'docker.io';
  let rest = isDomain ? name.slice(slash + 1) : name;
  if (host === 'index.docker.io') host = 'docker.io';
  if (host === 'docker.io' && !rest.includes('/')) rest = `library/${rest}`;
  return `${host}/${rest}`;
}

/**
 * Why the kubelet refuses `entry` in preloadedImagesVerificationAllowlist
 * (a kubelet with such an entry does not start), or undefined when it
 * takes it. The rules of getAllowlistImagePattern, in its order: the same
 * for "/*" entries in every version; an exact entry must be a normalized
 * name in 1.33 to 1.35 (reference.ParseNormalizedNamed), and any name
 * without tag or digest from 1.36 (reference.Parse, then
 * trimImageTagDigest).
 */
export function allowlistEntryProblem(entry: string, matching: AllowlistMatching = 'image'): string | undefined {
  if (entry !== entry.trim()) return 'leading or trailing spaces are not allowed';
  const wildcard = entry.endsWith('/*');
  const trimmed = wildcard ? entry.slice(0, -1) : entry;
  if (trimmed.length === 0) return 'empty';
  if (trimmed.includes('*')) return 'the only wildcard allowed is "/*" at the end';
  if (wildcard) return trimmed.length === 1 ? 'at least a registry host is needed before "/*"' : undefined;
  if (tagOrDigestRe.test(entry) && nameRe.test(entry.replace(tagOrDigestRe, ''))) return 'neither a tag nor a digest is accepted';
  if (matching === 'repository') {
    if (!nameRe.test(entry)) return 'not an image name';
    if (pathOf(entry).length > MAX_NAME_LENGTH) return `a repository path longer than ${MAX_NAME_LENGTH} characters`;
    return undefined;
  }
  if (identifierRe.test(entry)) return 'a repository name cannot be 64 hexadecimal characters';
  if (!nameRe.test(entry)) return 'not an image name';
  const normalized = normalizedName(entry);
  if (normalized.length > MAX_NAME_LENGTH) return `longer than ${MAX_NAME_LENGTH} characters`;
  if (normalized !== entry) return `not a normalized name (the kubelet reads it as ${JSON.stringify(normalized)})`;
  return undefined;
}

/** The entries' problems, each "entry: why"; empty when the kubelet takes them all. */
export function allowlistProblems(entries: readonly string[], matching: AllowlistMatching = 'image'): string[] {
  const out: string[] = [];
  for (const e of entries) {
    const why = allowlistEntryProblem(e, matching);
    if (why) out.push(`${JSON.stringify(e)}: ${why}`);
  }
  return out;
}

/**
 * Whether the allowlist exempts a pod's `image` (as written in the pod):
 * the kubelet's imageMatches, on the whole string up to 1.35, on the name
 * without tag and digest from 1.36. Entries are taken as valid.
 */
export function allowlistMatches(entries: readonly string[], image: string, matching: AllowlistMatching = 'image'): boolean {
  const subject = matching === 'repository' ? trimTagDigest(image) : image;
  for (const e of entries) {
    if (e.endsWith('/*') ? subject.startsWith(e.slice(0, -1)) : subject === e) return true;
  }
  return false;
}

/**
 * The "/*" entry that covers an image as spelled, tag or digest included:
 * its name up to the last "/", then "/*". Undefined for a name without
 * "/" (e.g. "busybox:1"), which no entry the kubelet takes can cover.
 */
export function allowlistEntryFor(image: string): string | undefined {
  const name = image.replace(tagOrDigestRe, '');
  const slash = name.lastIndexOf('/');
  return slash <= 0 ? undefined : `${name.slice(0, slash)}/*`;
}

/**
 * The exact entry that covers an image from 1.36 on, and only its
 * repository: its name without tag or digest.
 */
export function exactAllowlistEntryFor(image: string): string {
  return trimTagDigest(image);
}

/**
 * The fewest entries covering what `entries` cover: duplicates dropped, and
 * an entry covered by a shorter "/*" entry dropped; sorted.
 */
export function minimalAllowlist(entries: Iterable<string>): string[] {
  const sorted = [...new Set(entries)].sort();
  const prefixes: string[] = [];
  const out: string[] = [];
  for (const e of sorted) {
    if (prefixes.some((p) => (e.endsWith('/*') ? e.slice(0, -1) : e).startsWith(p))) continue;
    if (e.endsWith('/*')) {
      const p = e.slice(0, -1);
      // A longer entry sorted before its prefix cannot exist ("a/" < "a/b/"), but exact names can.
      for (let i = out.length - 1; i >= 0; i--) if (out[i]!.startsWith(p)) out.splice(i, 1);
      prefixes.push(p);
    }
    out.push(e);
  }
  return out;
}

/** How a policy treats a pinned image when the registry is out of reach. */
export type OfflineVerdict =
  /** Started from the node, whatever the pod's credentials. */
  | 'starts'
  /** Starts only if the kubelet never pulled it itself (no record of it), or the pod's credentials match its record. */
  | 'unless-kubelet-pulled'
  /** Verified: a pod whose credentials match no record of the kubelet needs the registry. */
  | 'verified';

/**
 * Whether the kubelet verifies the pod's credentials for `image` before
 * starting it from the node (RequireCredentialVerificationForImage):
 * `pulledByKubelet` is whether the kubelet holds a pull record or intent
 * for it. Entries are taken as valid.
 */
export function requiresVerification(policy: VerificationPolicy, allowlist: readonly string[], image: string, pulledByKubelet: boolean, matching: AllowlistMatching = 'image'): boolean {
  switch (policy) {
    case 'NeverVerify':
      return false;
    case 'NeverVerifyPreloadedImages':
      return pulledByKubelet;
    case 'NeverVerifyAllowlistedImages':
      return !allowlistMatches(allowlist, image, matching);
    case 'AlwaysVerify':
      return true;
  }
}

/** The verdict of `policy` on a pod's `image`, over what pinset cannot see (whether the kubelet pulled it itself). */
export function offlineVerdict(policy: VerificationPolicy, allowlist: readonly string[], image: string, matching: AllowlistMatching = 'image'): OfflineVerdict {
  const ifPulled = requiresVerification(policy, allowlist, image, true, matching);
  const ifNot = requiresVerification(policy, allowlist, image, false, matching);
  return !ifPulled && !ifNot ? 'starts' : ifPulled && ifNot ? 'verified' : 'unless-kubelet-pulled';
}
