// Manifests as the registry serves them: OCI image manifest and index,
// Docker v2 schema 2 manifest and manifest list (the four a runtime accepts;
// schema 1 is long gone from registries and refused here with a message).
// https://github.com/opencontainers/image-spec/blob/main/manifest.md
// https://github.com/opencontainers/image-spec/blob/main/image-index.md
// https://github.com/distribution/distribution/blob/main/docs/content/spec/manifest-v2-2.md

export const MEDIA_TYPES = {
  ociManifest: 'application/vnd.oci.image.manifest.v1+json',
  ociIndex: 'application/vnd.oci.image.index.v1+json',
  dockerManifest: 'application/vnd.docker.distribution.manifest.v2+json',
  dockerList: 'application/vnd.docker.distribution.manifest.list.v2+json',
} as const;

/** What a manifest request accepts: the same set CRI-O and containerd ask for, so a tag resolves to the digest they would pull. */
export const MANIFEST_ACCEPT = [MEDIA_TYPES.ociIndex, MEDIA_TYPES.dockerList, MEDIA_TYPES.ociManifest, MEDIA_TYPES.dockerManifest].join(', ');

/** distribution refuses manifests over 4 MiB (registry/handlers/manifests.go maxManifestBodySize); so does this client. */
export const MAX_MANIFEST_BYTES = 4 * 1024 * 1024;

export interface Descriptor {
  mediaType: string;
  digest: string;
  size: number;
}

export interface Platform {
  os: string;
  architecture: string;
  variant?: string;
}

export interface IndexEntry extends Descriptor {
  platform?: Platform;
}

export type Manifest =
  | { kind: 'image'; mediaType: string; config: Descriptor; layers: Descriptor[] }
  | { kind: 'index'; mediaType: string; manifests: IndexEntry[] };

export class ManifestError extends Error {
  override name = 'ManifestError';
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function descriptor(v: unknown, what: string): Descriptor {
  if (!isObject(v) || typeof v.digest !== 'string' || typeof v.size !== 'number' || !Number.isSafeInteger(v.size) || v.size < 0) {
    throw new ManifestError(`${what} is not a descriptor with a digest and a size`);
  }
  return { mediaType: typeof v.mediaType === 'string' ? v.mediaType : '', digest: v.digest, size: v.size };
}

/**
 * Parse manifest bytes. `contentType` is the response's Content-Type; the
 * document's own mediaType wins when present (OCI makes it optional).
 */
export function parseManifest(bytes: Buffer, contentType: string | null): Manifest {
  let doc: unknown;
  try {
    doc = JSON.parse(bytes.toString('utf8'));
  } catch {
    throw new ManifestError('the manifest is not JSON');
  }
  if (!isObject(doc)) throw new ManifestError('the manifest is not a JSON object');
  const ct = (contentType ?? '').split(';')[0]!.trim();
  const mediaType = typeof doc.mediaType === 'string' && doc.mediaType ? doc.mediaType : ct;
  if (doc.schemaVersion === 1 || mediaType.startsWith('application/vnd.docker.distribution.manifest.v1')) {
    throw new ManifestError('the image has a Docker schema 1 manifest, which CRI-O and containerd no longer pull; push it again as Docker v2 or OCI');
  }
  if (Array.isArray(doc.manifests) && !Array.isArray(doc.layers)) {
    const manifests = doc.manifests.map((m: unknown, i: number) => {
      const d: IndexEntry = descriptor(m, `manifests[${i}]`);
      const p = (m as Record<string, unknown>).platform;
      if (isObject(p) && typeof p.os === 'string' && typeof p.architecture === 'string') {
        d.platform = { os: p.os, architecture: p.architecture, ...(typeof p.variant === 'string' && p.variant ? { variant: p.variant } : {}) };
      }
      return d;
    });
    return { kind: 'index', mediaType: mediaType || MEDIA_TYPES.ociIndex, manifests };
  }
  if (Array.isArray(doc.layers) && doc.config !== undefined) {
    return {
      kind: 'image',
      mediaType: mediaType || MEDIA_TYPES.ociManifest,
      config: descriptor(doc.config, 'config'),
      layers: doc.layers.map((l: unknown, i: number) => descriptor(l, `layers[${i}]`)),
    };
  }
  throw new ManifestError(`the manifest (${mediaType || 'no media type'}) is neither an image manifest nor an index`);
}

// Node's process.arch to OCI GOARCH names (image-spec config.md lists Go's).
const ARCH: Record<string, string> = { x64: 'amd64', arm64: 'arm64', arm: 'arm', ia32: '386', ppc64: 'ppc64le', s390x: 's390x', riscv64: 'riscv64', loong64: 'loong64', mips64el: 'mips64le' };

/** This machine's OCI platform (the runtime pulls for the node's own platform). */
export function hostPlatform(): Platform {
  const architecture = ARCH[process.arch] ?? process.arch;
  const os = process.platform === 'win32' ? 'windows' : process.platform;
  if (architecture === 'arm') {
    const v = Number((process.config.variables as Record<string, unknown>).arm_version);
    return { os, architecture, variant: `v${Number.isFinite(v) && v > 0 ? v : 7}` };
  }
  return { os, architecture };
}

/** "linux/arm64/v8" -> Platform; throws on a malformed one. */
export function parsePlatform(s: string): Platform {
  const parts = s.trim().split('/');
  if (parts.length < 2 || parts.length > 3 || parts.some((p) => !/^[a-z0-9_.-]+$/.test(p))) {
    throw new ManifestError(`${JSON.stringify(s)} is not a platform; expected os/arch[/variant], e.g. linux/amd64 or linux/arm64/v8`);
  }
  return { os: parts[0]!, architecture: parts[1]!, ...(parts[2] ? { variant: parts[2] } : {}) };
}

export function formatPlatform(p: Platform): string {
  return `${p.os}/${p.architecture}${p.variant ? `/${p.variant}` : ''}`;
}

/** The variant a platform means when it names none (containerd's platforms.Normalize). */
function normalVariant(p: Platform): string {
  if (p.variant) return p.variant;
  if (p.architecture === 'arm64') return 'v8';
  if (p.architecture === 'arm') return 'v7';
  return '';
}

/**
 * The index entry for `want`, as containerd and containers/image choose it:
 * same os and architecture, same variant (arm64's empty variant is v8, arm's
 * v7), first match in the index's order. Entries without a platform (such
 * as attestation manifests) never match.
 */
export function selectPlatform(entries: readonly IndexEntry[], want: Platform): IndexEntry | undefined {
  const wv = normalVariant(want);
  return entries.find((e) => e.platform && e.platform.os === want.os && e.platform.architecture === want.architecture && normalVariant(e.platform) === wv);
}

/** Platforms an index offers, for messages. */
export function platformsOf(entries: readonly IndexEntry[]): string[] {
  return entries.filter((e) => e.platform).map((e) => formatPlatform(e.platform!));
}
