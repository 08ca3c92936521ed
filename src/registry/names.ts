// Image names as people write them before they are pinned: a registry
// host, a repository path, and a tag, a digest or both
// (`quay.io/org/app:1.2`, `quay.io/org/app@sha256:…`,
// `quay.io/org/app:1.2@sha256:…`). The grammar is distribution's
// (github.com/distribution/reference, regexp.go), with one narrowing: the
// host must be written out. A name without one ("nginx", "org/app") is
// resolved by each node through its unqualified-search registries, so it
// names no single image; pinset asks for the registry instead of guessing.
import { quote } from '../api/reference.ts';

export interface ImageName {
  /** Registry host with port, lowercase as written (quay.io, 127.0.0.1:5000). */
  host: string;
  /** Repository path under the host (org/app). */
  path: string;
  tag?: string;
  /** sha256:<hex> */
  digest?: string;
}

const domainComponent = '(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])';
const hostRe = new RegExp(
  `^(?:localhost(?::[0-9]{1,5})?|${domainComponent}(?:\\.${domainComponent})+(?::[0-9]{1,5})?|${domainComponent}:[0-9]{1,5}|\\[[a-fA-F0-9:]+\\](?::[0-9]{1,5})?)$`,
);
const pathRe = /^[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*(?:\/[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*)*$/;
const tagRe = /^[\w][\w.-]{0,127}$/;
const digestRe = /^sha256:[a-f0-9]{64}$/;

export type NameResult = { ok: true; value: ImageName } | { ok: false; error: string };

/** Parse a name with a tag and/or a digest; a name with neither means the tag "latest", as every client reads it. */
export function parseImageName(input: string): NameResult {
  const s = input.trim();
  if (s === '') return { ok: false, error: 'is empty' };
  if (/\s/.test(s)) return { ok: false, error: `${quote(s)} contains whitespace` };
  let rest = s;
  let digest: string | undefined;
  const at = rest.indexOf('@');
  if (at >= 0) {
    digest = rest.slice(at + 1);
    rest = rest.slice(0, at);
    if (!digestRe.test(digest)) return { ok: false, error: `${quote(s)} has digest ${quote(digest, 80)}; expected sha256:<64 lowercase hex>` };
  }
  const slash = rest.indexOf('/');
  const first = slash < 0 ? rest : rest.slice(0, slash);
  if (slash < 0 || !hostRe.test(first)) {
    return {
      ok: false,
      error: `${quote(s)} has no registry host (${quote(first, 60)} is not one: a host has a dot or a port, or is localhost); write the registry explicitly, e.g. ${rest.includes('/') ? `docker.io/${s}` : `docker.io/library/${s}`}`,
    };
  }
  let repo = rest.slice(slash + 1);
  let tag: string | undefined;
  const colon = repo.lastIndexOf(':');
  if (colon >= 0) {
    tag = repo.slice(colon + 1);
    repo = repo.slice(0, colon);
    if (!tagRe.test(tag)) return { ok: false, error: `${quote(s)} has tag ${quote(tag, 60)}; a tag is up to 128 letters, digits, _ . -, not starting with . or -` };
  }
  if (!pathRe.test(repo)) {
    return { ok: false, error: `${quote(s)} has a repository path with characters other than lowercase letters, digits and the separators . _ __ - /` };
  }
  if (first.length + 1 + repo.length > 255) return { ok: false, error: `${quote(s)}: the name is longer than 255 characters` };
  const value: ImageName = { host: first, path: repo };
  if (tag !== undefined) value.tag = tag;
  if (digest !== undefined) value.digest = digest;
  if (tag === undefined && digest === undefined) value.tag = 'latest';
  return { ok: true, value };
}

/** host/path */
export function repositoryOf(n: Pick<ImageName, 'host' | 'path'>): string {
  return `${n.host}/${n.path}`;
}

/** The name as a person would write it: host/path[:tag][@digest]. */
export function formatImageName(n: ImageName): string {
  return `${repositoryOf(n)}${n.tag !== undefined ? `:${n.tag}` : ''}${n.digest !== undefined ? `@${n.digest}` : ''}`;
}

/** The reference a manifest request asks for: the digest when there is one (a tag beside it is informational). */
export function manifestReference(n: ImageName): string {
  return n.digest ?? n.tag ?? 'latest';
}

/** host/path@digest: what a PinnedImageSet holds. */
export function pinnedReference(n: Pick<ImageName, 'host' | 'path'>, digest: string): string {
  return `${repositoryOf(n)}@${digest}`;
}
