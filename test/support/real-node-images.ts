// Images for the node suite's real node (./real-node.ts): the pinset image
// from the OCI layout scripts/build-image.sh leaves (pushed with skopeo,
// digests kept), a second build of it for upgrades (the same layers, a
// configuration with its own label: another image ID, another digest), and
// workload images made from its layers with a long-running command and one
// layer of their own, so each has its own image ID and runs as a pod (or as
// containerd's pod sandbox), and small images of one layer. Pushes to an
// authenticated registry carry its credentials.
import { execFile } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { fetch } from 'undici';
import { layerOf, MEDIA_TYPES, pushManifest, pushSingleLayer, sha256, type Blob } from './images.ts';
import type { Registry } from './registry.ts';

const run = promisify(execFile);

/** The registry name images are pulled under; the runtime's configuration maps it to the loopback registry. */
export const REGISTRY_NAME = 'registry.test';
const REPO_ROOT = resolve(fileURLToPath(new URL('../..', import.meta.url)));

/** The OCI layout scripts/build-image.sh leaves (PINSET_IMAGE_CACHE, default .cache/image), as `oci:<dir>:<tag>`. */
export function imageLayout(env: NodeJS.ProcessEnv = process.env): { dir: string; tag: string } {
  const cache = env.PINSET_IMAGE_CACHE ? resolve(env.PINSET_IMAGE_CACHE) : join(REPO_ROOT, '.cache', 'image');
  return { dir: join(cache, 'oci'), tag: 'dev' };
}

interface OciLayout {
  dir: string;
  manifest: { digest: string; body: any };
  config: any;
}

async function readLayout(dir: string, tag: string): Promise<OciLayout> {
  const index = JSON.parse(await readFile(join(dir, 'index.json'), 'utf8'));
  const entry = (index.manifests as any[]).find((m) => m.annotations?.['org.opencontainers.image.ref.name'] === tag) ?? index.manifests[0];
  if (!entry) throw new Error(`${dir}/index.json lists no manifest`);
  const blob = (digest: string) => join(dir, 'blobs', ...digest.split(':'));
  const manifest = JSON.parse(await readFile(blob(entry.digest), 'utf8'));
  if (manifest.mediaType && manifest.mediaType !== MEDIA_TYPES.manifest) throw new Error(`${dir}: ${entry.digest} is ${manifest.mediaType}, not one image manifest`);
  const config = JSON.parse(await readFile(blob(manifest.config.digest), 'utf8'));
  return { dir, manifest: { digest: entry.digest, body: manifest }, config };
}

export interface NodeImage {
  /** registry.test/<repo>@sha256:..., what pods and sets name. */
  ref: string;
  repo: string;
  digest: string;
  /** The config digest without "sha256:" (CRI Image.id). */
  id: string;
}

/** The pinset image into the registry with skopeo (the layout's digest is kept). */
export async function pushPinsetImage(skopeo: string, registry: Registry, layout: { dir: string; tag: string }): Promise<NodeImage> {
  const oci = await readLayout(layout.dir, layout.tag);
  const repo = 'pinset/pinset';
  await run(skopeo, ['copy', '--quiet', '--dest-tls-verify=false', `oci:${layout.dir}:${layout.tag}`, `docker://${registry.host}/${repo}:${layout.tag}`], { maxBuffer: 1 << 20 });
  const head = await fetch(`${registry.url}/v2/${repo}/manifests/${oci.manifest.digest}`, { method: 'HEAD', headers: { accept: MEDIA_TYPES.manifest } });
  if (!head.ok) throw new Error(`skopeo copied ${layout.dir} but ${repo}@${oci.manifest.digest} is not in the registry (HTTP ${head.status})`);
  return { ref: `${REGISTRY_NAME}/${repo}@${oci.manifest.digest}`, repo, digest: oci.manifest.digest, id: oci.manifest.body.config.digest.replace(/^sha256:/, '') };
}

/** The registry's Authorization header (an authenticated registry), with `extra`. */
function headers(registry: Registry, extra: Record<string, string> = {}): Record<string, string> {
  const auth = registry.authorization();
  return auth ? { ...extra, authorization: auth } : extra;
}

async function mountOrPush(registry: Registry, repo: string, from: string, blob: { digest: string; data: () => Promise<Buffer> }): Promise<void> {
  const head = await fetch(`${registry.url}/v2/${repo}/blobs/${blob.digest}`, { method: 'HEAD', headers: headers(registry) });
  if (head.ok) return;
  // A repository `from` that does not hold the blob (or does not exist) answers 202: an upload.
  const mount = await fetch(`${registry.url}/v2/${repo}/blobs/uploads/?mount=${blob.digest}&from=${from}`, { method: 'POST', headers: headers(registry) });
  await mount.body?.cancel();
  if (mount.status === 201) return;
  const location = mount.headers.get('location');
  if (mount.status !== 202 || !location) throw new Error(`registry: blob upload to ${repo} answered ${mount.status}`);
  const url = new URL(location, registry.url);
  url.searchParams.set('digest', blob.digest);
  const data = await blob.data();
  const put = await fetch(url, { method: 'PUT', headers: headers(registry, { 'content-type': 'application/octet-stream', 'content-length': String(data.length) }), body: data });
  await put.body?.cancel();
  if (put.status !== 201) throw new Error(`registry: upload of ${blob.digest} to ${repo} answered ${put.status}`);
}

/**
 * A workload image named `name`: the pinset image's layers (mounted from the
 * repository `layersFrom` when it holds them, else uploaded) plus one small
 * layer of its own, running `node -e 'setInterval(...)'` until stopped.
 * `host` is the registry name its reference uses.
 */
export async function pushWorkloadImage(registry: Registry, layout: { dir: string; tag: string }, name: string, opts: { host?: string; layersFrom?: string } = {}): Promise<NodeImage> {
  const from = opts.layersFrom ?? 'pinset/pinset';
  const oci = await readLayout(layout.dir, layout.tag);
  const repo = `node-suite/${name}`;
  const own = layerOf([{ name: `pinset-node-suite/${name}`, data: Buffer.from(`${name}\n`) }]);
  const base = oci.config;
  const config: Blob = (() => {
    const value = {
      ...base,
      config: { ...base.config, Entrypoint: ['node', '-e', 'setInterval(() => {}, 1 << 30)'], Cmd: undefined, Labels: { ...(base.config?.Labels ?? {}), 'dev.pinset.test': name } },
      rootfs: { type: 'layers', diff_ids: [...base.rootfs.diff_ids, own.diffId] },
      history: [...(base.history ?? []), { created: new Date().toISOString(), created_by: `pinset node suite: workload ${name}` }],
    };
    const data = Buffer.from(JSON.stringify(value));
    return { digest: sha256(data), mediaType: MEDIA_TYPES.config, data };
  })();
  for (const layer of oci.manifest.body.layers as Array<{ digest: string }>) {
    await mountOrPush(registry, repo, from, { digest: layer.digest, data: () => readFile(join(layout.dir, 'blobs', ...layer.digest.split(':'))) });
  }
  for (const blob of [own, config]) await mountOrPush(registry, repo, from, { digest: blob.digest, data: async () => blob.data });
  const manifestData = Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: MEDIA_TYPES.manifest,
      config: { mediaType: MEDIA_TYPES.config, digest: config.digest, size: config.data.length },
      layers: [...oci.manifest.body.layers, { mediaType: own.mediaType, digest: own.digest, size: own.data.length }],
    }),
  );
  const manifest: Blob = { digest: sha256(manifestData), mediaType: MEDIA_TYPES.manifest, data: manifestData };
  await pushManifest(registry, repo, manifest);
  return { ref: `${opts.host ?? REGISTRY_NAME}/${repo}@${manifest.digest}`, repo, digest: manifest.digest, id: config.digest.replace(/^sha256:/, '') };
}

/** A one-layer image of its own (./images.ts pushSingleLayer) under the registry name `host`, as a NodeImage. */
export async function pushSmallImage(registry: Registry, name: string, host: string): Promise<NodeImage> {
  const img = await pushSingleLayer(registry, `node-suite/${name}`, { host });
  return { ref: img.ref, repo: img.repo, digest: img.digest, id: img.id.replace(/^sha256:/, '') };
}


/**
 * A second build of the pinset image, as a release after it would be: the
 * same layers (mounted, not uploaded again) under a configuration with the
 * label dev.pinset.test.build=`build`, pushed as pinset/pinset:`build`. Its
 * own config digest makes it another image to the runtime (another image ID,
 * another digest reference), running the same program.
 */
export async function pushRebuiltPinsetImage(registry: Registry, layout: { dir: string; tag: string }, build: string): Promise<NodeImage> {
  const oci = await readLayout(layout.dir, layout.tag);
  const repo = 'pinset/pinset';
  const base = oci.config;
  const configData = Buffer.from(
    JSON.stringify({
      ...base,
      created: new Date().toISOString(),
      config: { ...base.config, Labels: { ...(base.config?.Labels ?? {}), 'dev.pinset.test.build': build } },
      history: [...(base.history ?? []), { created: new Date().toISOString(), created_by: `pinset node suite: build ${build}`, empty_layer: true }],
    }),
  );
  const config: Blob = { digest: sha256(configData), mediaType: MEDIA_TYPES.config, data: configData };
  await mountOrPush(registry, repo, repo, { digest: config.digest, data: async () => config.data });
  for (const layer of oci.manifest.body.layers as Array<{ digest: string }>) {
    await mountOrPush(registry, repo, repo, { digest: layer.digest, data: () => readFile(join(layout.dir, 'blobs', ...layer.digest.split(':'))) });
  }
  const manifestData = Buffer.from(JSON.stringify({ ...oci.manifest.body, config: { mediaType: MEDIA_TYPES.config, digest: config.digest, size: config.data.length } }));
  const manifest: Blob = { digest: sha256(manifestData), mediaType: MEDIA_TYPES.manifest, data: manifestData };
  await pushManifest(registry, repo, manifest, build);
  return { ref: `${REGISTRY_NAME}/${repo}@${manifest.digest}`, repo, digest: manifest.digest, id: config.digest.replace(/^sha256:/, '') };
}
