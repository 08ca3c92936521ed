// The one grammar for image references in a PinnedImageSet, shared by the
// agent, `pinset validate` and the CRD's OpenAPI `pattern` (see
// deploy/crds/; the test in test/unit/crd.test.ts checks they are equal).
//
// A reference must be `<registry host>/<path>@sha256:<64 lowercase hex>`:
// the distribution reference grammar
// (github.com/distribution/reference, regexp.go) narrowed to what pinning
// needs. CRI-O matches pinned_images against the names it stores, so only a
// fully qualified name with a digest names one image for ever: a tag moves,
// a name without a host is resolved through the node's search registries.
//
// The pattern avoids look-around so that it is valid in both ECMAScript and
// RE2 (the Kubernetes API server validates `pattern` with Go's regexp).

/** A DNS label: letters, digits, inner hyphens. */
const domainComponent = '(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])';
const port = '(?::[0-9]{1,5})';
/**
 * A registry host, told apart from a first path component the way
 * distribution does it: it has a dot, a port, is localhost, or is an IPv6
 * literal in brackets.
 */
const host =
  `(?:localhost${port}?` +
  `|${domainComponent}(?:\\.${domainComponent})+${port}?` +
  `|${domainComponent}${port}` +
  `|\\[[a-fA-F0-9:]+\\]${port}?)`;
/** A path component: lowercase letters and digits, joined by ., _, __ or dashes. */
const pathComponent = '[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*';
const digest = 'sha256:[a-f0-9]{64}';

/** Source of the full-match pattern, for the CRD and for RegExp. */
export const REFERENCE_PATTERN = `^${host}(?:/${pathComponent})+@${digest}$`;
/** distribution limits the name (host and path) to 255 characters. */
export const MAX_NAME_LENGTH = 255;
/** name + "@sha256:" + 64 hex */
export const MAX_REFERENCE_LENGTH = MAX_NAME_LENGTH + 1 + 7 + 64;

const referenceRe = new RegExp(REFERENCE_PATTERN);
const hostRe = new RegExp(`^${host}$`);
const pathRe = new RegExp(`^${pathComponent}(?:/${pathComponent})*$`);

export interface ParsedReference {
  /** The whole reference as given. */
  reference: string;
  /** Registry host, with port if any (e.g. quay.io, 127.0.0.1:5000). */
  host: string;
  /** Repository path under the host (e.g. org/app). */
  path: string;
  /** sha256:<hex> */
  digest: string;
}

export type ReferenceResult =
  | { ok: true; value: ParsedReference }
  | { ok: false; error: string };

/** Printable, quoted form of user input for error messages (no raw newlines). */
export function quote(s: string, max = 120): string {
  const cut = s.length > max ? s.slice(0, max) + '…' : s;
  return JSON.stringify(cut);
}

/**
 * Parse and validate a reference. The error says what is wrong in words a
 * person can act on; callers add which set and which item.
 */
export function parseReference(ref: unknown): ReferenceResult {
  if (typeof ref !== 'string') return { ok: false, error: 'must be a string' };
  if (ref.length === 0) return { ok: false, error: 'must not be empty' };
  if (ref.length > MAX_REFERENCE_LENGTH) {
    return { ok: false, error: `is ${ref.length} characters long; at most ${MAX_REFERENCE_LENGTH} are allowed` };
  }
  if (referenceRe.test(ref)) {
    const at = ref.lastIndexOf('@');
    const name = ref.slice(0, at);
    const slash = name.indexOf('/');
    if (name.length > MAX_NAME_LENGTH) {
      return { ok: false, error: `${quote(ref)}: the name before the digest is longer than ${MAX_NAME_LENGTH} characters` };
    }
    return { ok: true, value: { reference: ref, host: name.slice(0, slash), path: name.slice(slash + 1), digest: ref.slice(at + 1) } };
  }
  return { ok: false, error: `${quote(ref)} ${explain(ref)}` };
}

export function isValidReference(ref: unknown): ref is string {
  return parseReference(ref).ok;
}

/** Why a string that failed the pattern failed it, most specific reason first. */
function explain(ref: string): string {
  const expected = 'expected <registry host>/<path>@sha256:<64 lowercase hex>';
  if (/[\s"'\\\[\]{}=#\u0000-\u001f\u007f]/.test(ref)) {
    return `contains whitespace, quotes, brackets or control characters, which no image reference has; ${expected}`;
  }
  const at = ref.indexOf('@');
  if (at < 0) {
    const lastColon = ref.lastIndexOf(':');
    if (lastColon > ref.lastIndexOf('/')) {
      return `names a tag (${quote(ref.slice(lastColon + 1), 40)}), not a digest: tags move, so only a digest can be pinned; ${expected}`;
    }
    return `has no digest; ${expected}`;
  }
  if (ref.indexOf('@', at + 1) >= 0) return `has more than one "@"; ${expected}`;
  const name = ref.slice(0, at);
  const dig = ref.slice(at + 1);
  if (dig === '') return `has nothing after "@"; ${expected}`;
  if (!dig.startsWith('sha256:')) {
    return `has digest algorithm ${quote(dig.split(':')[0] ?? '', 20)}; only sha256 is supported`;
  }
  const hex = dig.slice('sha256:'.length);
  if (/[A-F]/.test(hex) && /^[a-fA-F0-9]{64}$/.test(hex)) {
    return 'has uppercase hex in its digest; a sha256 digest is written in lowercase';
  }
  if (!/^[a-f0-9]*$/.test(hex)) return 'has a digest with characters other than lowercase hex';
  if (hex.length !== 64) return `has a digest of ${hex.length} hex characters; a sha256 digest has 64`;
  if (name === '') return `has no name before "@"; ${expected}`;
  const slash = name.indexOf('/');
  const first = slash < 0 ? name : name.slice(0, slash);
  if (slash < 0 && hostRe.test(first)) {
    return `has a registry host (${quote(first, 60)}) but no repository path; ${expected}`;
  }
  const lastColonInName = name.lastIndexOf(':');
  if (lastColonInName > name.lastIndexOf('/') && slash >= 0) {
    return `has a tag as well as a digest; drop ${quote(name.slice(lastColonInName), 40)} and keep the digest`;
  }
  if (slash < 0 || !hostRe.test(first)) {
    return `has no registry host (${quote(first, 60)} is not one: a host has a dot or a port, or is localhost); write the registry explicitly, e.g. quay.io/${name}`;
  }
  if (!pathRe.test(name.slice(slash + 1))) {
    return 'has a repository path with characters other than lowercase letters, digits and the separators . _ __ - /';
  }
  return expected;
}
