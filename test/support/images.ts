// Builds OCI images in memory and pushes them to a Registry over the
// distribution HTTP API (no network, no tools): blob upload (POST, then PUT
// ?digest=), then manifest PUT by digest. Layers are real gzip'd tars, so
// containerd unpacks them with the native snapshotter.
//
// References are returned under a made-up host (registry.test by default)
// that containerd's certs.d maps to the loopback registry.
import { createHash, randomBytes } from 'node:crypto';
import { gzipSync } from 'node:zlib';
import type { Registry } from './registry.ts';

export const MEDIA_TYPES = {
  manifest: 'application/vnd.oci.image.manifest.v1+json',
  index: 'application/vnd.oci.image.index.v1+json',
  config: 'application/vnd.oci.image.config.v1+json',
  layer: 'application/vnd.oci.image.layer.v1.tar+gzip',
} as const;

export function sha256(data: Buffer | string): string {
  return `sha256:${createHash('sha256').update(data).digest('hex')}`;
}

// ---------------------------------------------------------------------------
// A tar writer: POSIX ustar, regular files only (enough for a layer).
// Format: https://pubs.opengroup.org/onlinepubs/9699919799/utilities/pax.html#tag_20_92_13_06

export interface TarEntry {
  /** Path inside the archive, no leading slash, at most 100 bytes. */
  name: string;
  data: Buffer;
  mode?: number;
}

function octal(value: number, width: number): string {
  // width - 1 digits, then NUL.
  return value.toString(8).padStart(width - 1, '0') + '\0';
}

function tarHeader(name: string, size: number, mode: number): Buffer {
  const header = Buffer.alloc(512);
  if (Buffer.byteLength(name) > 100) throw new Error(`tar entry name longer than 100 bytes: ${name}`);
  header.write(name, 0, 100, 'utf8');
  header.write(octal(mode, 8), 100, 8, 'ascii');
  header.write(octal(0, 8), 108, 8, 'ascii'); // uid
  header.write(octal(0, 8), 116, 8, 'ascii'); // gid
  header.write(octal(size, 12), 124, 12, 'ascii');
  header.write(octal(0, 12), 136, 12, 'ascii'); // mtime: fixed, so layers are reproducible
  header.fill(0x20, 148, 156); // checksum is computed with its own field as spaces
  header.write('0', 156, 1, 'ascii'); // regular file
  header.write('ustar\0', 257, 6, 'ascii');
  header.write('00', 263, 2, 'ascii');
  header.write('root', 265, 32, 'ascii');
  header.write('root', 297, 32, 'ascii');
  let sum = 0;
  for (const byte of header) sum += byte;
  header.write(sum.toString(8).padStart(6, '0') + '\0 ', 148, 8, 'ascii');
  return header;
}

export function tar(entries: TarEntry[]): Buffer {
  const parts: Buffer[] = [];
  for (const e of entries) {
    parts.push(tarHeader(e.name, e.data.length, e.mode ?? 0o644), e.data);
    const pad = (512 - (e.data.length % 512)) % 512;
    if (pad) parts.push(Buffer.alloc(pad));
  }
  parts.push(Buffer.alloc(1024)); // two zero blocks end the archive
  return Buffer.concat(parts);
}

// ---------------------------------------------------------------------------
// Images in memory

export interface Blob {
  digest: string;
  mediaType: string;
  data: Buffer;
}

export interface Layer extends Blob {
  /** sha256 of the uncompressed tar (the config's rootfs.diff_ids). */
  diffId: string;
}

export interface Platform {
  os: string;
  architecture: string;
  variant?: string;
}

export interface BuiltImage {
  platform: Platform;
  config: Blob;
  layers: Layer[];
  manifest: Blob;
}

export function layerOf(files: TarEntry[]): Layer {
  const raw = tar(files);
  // Level 1: the big layers are random data that does not compress anyway.
  const data = gzipSync(raw, { level: 1 });
  return { digest: sha256(data), mediaType: MEDIA_TYPES.layer, data, diffId: sha256(raw) };
}

function jsonBlob(mediaType: string, value: unknown): Blob {
  const data = Buffer.from(JSON.stringify(value));
  return { digest: sha256(data), mediaType, data };
}

export function buildImage(layers: Layer[], platform: Platform, label: string): BuiltImage {
  const config = jsonBlob(MEDIA_TYPES.config, {
    architecture: platform.architecture,
    os: platform.os,
    ...(platform.variant ? { variant: platform.variant } : {}),
    config: { Labels: { 'dev.pinset.test': label } },
    rootfs: { type: 'layers', diff_ids: layers.map((l) => l.diffId) },
  });
  const manifest = jsonBlob(MEDIA_TYPES.manifest, {
    schemaVersion: 2,
    mediaType: MEDIA_TYPES.manifest,
    config: { mediaType: config.mediaType, digest: config.digest, size: config.data.length },
    layers: layers.map((l) => ({ mediaType: l.mediaType, digest: l.digest, size: l.data.length })),
  });
  return { platform, config, layers, manifest };
}

/** The OCI platform of this machine, as containerd picks it from an index. */
export function nodePlatform(): Platform {
  const arch: Record<string, string> = { x64: 'amd64', arm64: 'arm64', arm: 'arm', ia32: '386', ppc64: 'ppc64le', s390x: 's390x', riscv64: 'riscv64' };
  const architecture = arch[process.arch];
  if (!architecture) throw new Error(`no OCI architecture known for node's ${process.arch}`);
  return { os: 'linux', architecture };
}

// ---------------------------------------------------------------------------
// Pushing

export interface PushedImage {
  /** <host>/<repo>@<manifest digest>, what a PinnedImageSet names. */
  ref: string;
  repo: string;
  /** Manifest digest (or index digest for a multi-arch image). */
  digest: string;
  /** The config digest: the image id containerd reports. For an index, the node platform's. */
  id: string;
  /** Bytes of all blobs pushed for this image (compressed layers + configs + manifests). */
  size: number;
}

export interface PushedIndex extends PushedImage {
  /** Per platform ("linux/amd64"): manifest digest and config digest (image id). */
  platforms: Record<string, { manifestDigest: string; id: string }>;
}

export interface PushOptions {
  /** Host name the reference is written with (containerd maps it to the registry). Default registry.test. */
  host?: string;
  /** Also tag the image (the index, for a multi-arch image) with this tag. */
  tag?: string;
}

const DEFAULT_HOST = 'registry.test';

async function ensureOk(res: Response, what: string): Promise<void> {
  if (!res.ok) {
    const body = await res.text().catch(() => '');
    throw new Error(`${what}: HTTP ${res.status} ${body.slice(0, 500)}`);
  }
}

function headers(registry: Registry, extra: Record<string, string> = {}): Record<string, string> {
  const auth = registry.authorization();
  return auth ? { ...extra, authorization: auth } : extra;
}

export async function pushBlob(registry: Registry, repo: string, blob: Blob): Promise<void> {
  const head = await fetch(`${registry.url}/v2/${repo}/blobs/${blob.digest}`, { method: 'HEAD', headers: headers(registry) });
  if (head.ok) return;
  const start = await fetch(`${registry.url}/v2/${repo}/blobs/uploads/`, { method: 'POST', headers: headers(registry) });
  await ensureOk(start, `start upload to ${repo}`);
  await start.body?.cancel();
  const location = start.headers.get('location');
  if (!location) throw new Error(`registry gave no upload location for ${repo}`);
  const url = new URL(location, registry.url);
  url.searchParams.set('digest', blob.digest);
  const put = await fetch(url, {
    method: 'PUT',
    headers: headers(registry, { 'content-type': 'application/octet-stream', 'content-length': String(blob.data.length) }),
    body: blob.data,
  });
  await ensureOk(put, `upload ${blob.digest} to ${repo}`);
  await put.body?.cancel();
}

export async function pushManifest(registry: Registry, repo: string, manifest: Blob, tag?: string): Promise<void> {
  for (const reference of tag ? [manifest.digest, tag] : [manifest.digest]) {
    const res = await fetch(`${registry.url}/v2/${repo}/manifests/${reference}`, {
      method: 'PUT',
      headers: headers(registry, { 'content-type': manifest.mediaType }),
      body: manifest.data,
    });
    await ensureOk(res, `put manifest ${reference} to ${repo}`);
    await res.body?.cancel();
  }
}

async function pushBuilt(registry: Registry, repo: string, image: BuiltImage, tag?: string): Promise<number> {
  let size = 0;
  for (const blob of [...image.layers, image.config]) {
    await pushBlob(registry, repo, blob);
    size += blob.data.length;
  }
  await pushManifest(registry, repo, image.manifest, tag);
  return size + image.manifest.data.length;
}

function imageRef(host: string, repo: string, digest: string): string {
  return `${host}/${repo}@${digest}`;
}

/** Content unique to this call, so two pushed images never share an id. */
function nonce(): string {
  return randomBytes(8).toString('hex');
}

export async function pushLayers(registry: Registry, repo: string, layers: Layer[], opts: PushOptions = {}): Promise<PushedImage> {
  const image = buildImage(layers, nodePlatform(), `${repo} ${nonce()}`);
  const size = await pushBuilt(registry, repo, image, opts.tag);
  return { ref: imageRef(opts.host ?? DEFAULT_HOST, repo, image.manifest.digest), repo, digest: image.manifest.digest, id: image.config.digest, size };
}

/** One layer holding one small text file. */
export function pushSingleLayer(registry: Registry, repo: string, opts: PushOptions = {}): Promise<PushedImage> {
  const layer = layerOf([{ name: 'hello.txt', data: Buffer.from(`hello from ${repo} ${nonce()}\n`) }]);
  return pushLayers(registry, repo, [layer], opts);
}

/** `count` layers, each with its own file. */
export function pushMultiLayer(registry: Registry, repo: string, count = 3, opts: PushOptions = {}): Promise<PushedImage> {
  const id = nonce();
  const layers = Array.from({ length: count }, (_, i) => layerOf([{ name: `layer-${i}.txt`, data: Buffer.from(`layer ${i} of ${repo} ${id}\n`) }]));
  return pushLayers(registry, repo, layers, opts);
}

/** One layer of `bytes` random bytes (incompressible, so the pull moves that much). */
export function pushRandom(registry: Registry, repo: string, bytes: number, opts: PushOptions = {}): Promise<PushedImage> {
  const layer = layerOf([{ name: 'random.bin', data: randomBytes(bytes) }]);
  return pushLayers(registry, repo, [layer], opts);
}

/**
 * An OCI image index naming one image per platform, each with its own
 * config and layer. `id` is the config digest of the node's platform: the
 * image that must land.
 */
export async function pushMultiArch(
  registry: Registry,
  repo: string,
  platforms: Platform[] = [
    { os: 'linux', architecture: 'amd64' },
    { os: 'linux', architecture: 'arm64' },
  ],
  opts: PushOptions = {},
): Promise<PushedIndex> {
  const id = nonce();
  const built: BuiltImage[] = [];
  let size = 0;
  for (const p of platforms) {
    const name = `${p.os}/${p.architecture}`;
    const layer = layerOf([{ name: 'platform.txt', data: Buffer.from(`${name} ${repo} ${id}\n`) }]);
    const image = buildImage([layer], p, `${repo} ${name} ${id}`);
    size += await pushBuilt(registry, repo, image);
    built.push(image);
  }
  const index = jsonBlob(MEDIA_TYPES.index, {
    schemaVersion: 2,
    mediaType: MEDIA_TYPES.index,
    manifests: built.map((b) => ({
      mediaType: b.manifest.mediaType,
      digest: b.manifest.digest,
      size: b.manifest.data.length,
      platform: b.platform,
    })),
  });
  await pushManifest(registry, repo, index, opts.tag);
  size += index.data.length;
  const byPlatform: PushedIndex['platforms'] = {};
  for (const b of built) byPlatform[`${b.platform.os}/${b.platform.architecture}`] = { manifestDigest: b.manifest.digest, id: b.config.digest };
  const node = nodePlatform();
  const mine = byPlatform[`${node.os}/${node.architecture}`];
  return {
    ref: imageRef(opts.host ?? DEFAULT_HOST, repo, index.digest),
    repo,
    digest: index.digest,
    id: mine?.id ?? '',
    size,
    platforms: byPlatform,
  };
}

/**
 * Copy a repository's manifest (and, for an index, its platform manifests)
 * with every blob from one registry to another, digests unchanged: a
 * mirror's copy. `tag`, when given, is tagged at the destination too.
 */
export async function copyImage(from: Registry, to: Registry, repo: string, digest: string, tag?: string, toRepo = repo): Promise<void> {
  const get = async (kind: 'manifests' | 'blobs', ref: string, accept?: string): Promise<{ data: Buffer; type: string }> => {
    const res = await fetch(`${from.url}/v2/${repo}/${kind}/${ref}`, { headers: headers(from, accept ? { accept } : {}) });
    await ensureOk(res, `get ${kind} ${ref} from ${repo}`);
    return { data: Buffer.from(await res.arrayBuffer()), type: (res.headers.get('content-type') ?? '').split(';')[0]! };
  };
  const accept = [MEDIA_TYPES.index, MEDIA_TYPES.manifest, 'application/vnd.docker.distribution.manifest.v2+json', 'application/vnd.docker.distribution.manifest.list.v2+json'].join(', ');
  const m = await get('manifests', digest, accept);
  const doc = JSON.parse(m.data.toString('utf8')) as { manifests?: { digest: string }[]; config?: { digest: string }; layers?: { digest: string; mediaType: string }[] };
  if (doc.manifests) {
    for (const child of doc.manifests) await copyImage(from, to, repo, child.digest, undefined, toRepo);
  } else {
    for (const d of [doc.config!, ...doc.layers!]) {
      const b = await get('blobs', d.digest);
      await pushBlob(to, toRepo, { digest: d.digest, mediaType: 'application/octet-stream', data: b.data });
    }
  }
  await pushManifest(to, toRepo, { digest, mediaType: m.type, data: m.data }, tag);
}

/** A well-formed digest reference that names nothing in the registry. */
export function unknownRef(repo: string, opts: PushOptions = {}): string {
  return imageRef(opts.host ?? DEFAULT_HOST, repo, sha256(`nothing here ${nonce()}`));
}
