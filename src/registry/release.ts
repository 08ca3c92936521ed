// The images of an OpenShift release payload. A release image carries
// release-manifests/image-references: an ImageStream (image.openshift.io/v1)
// whose spec.tags[].from.name are the payload's images by digest
// (`oc adm release info --pullspecs` prints the same list). It is read from
// the image's layers, last layer first (a later layer's file wins over an
// earlier one's), without unpacking anything to disk.
import type { RegistryClient } from './client.ts';
import { formatPlatform, platformsOf, selectPlatform, type Platform } from './manifest.ts';
import type { ImageName } from './names.ts';
import { findInLayer } from './tar.ts';

export const IMAGE_REFERENCES = 'release-manifests/image-references';

export interface ReleaseImages {
  /** The release image's digest (an index digest when the release is multi-arch). */
  digest: string;
  /** metadata.name of the ImageStream: the release version. */
  version: string;
  /** Each tag's name and image, in the file's order. */
  tags: { tag: string; image: string }[];
}

export class ReleaseError extends Error {
  override name = 'ReleaseError';
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** The ImageStream's tags, with the problems of any that name no image. */
export function parseImageReferences(text: string): { version: string; tags: { tag: string; image: string }[] } {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch {
    throw new ReleaseError(`${IMAGE_REFERENCES} is not JSON`);
  }
  if (!isObject(doc) || doc.kind !== 'ImageStream' || !isObject(doc.spec) || !Array.isArray(doc.spec.tags)) {
    throw new ReleaseError(`${IMAGE_REFERENCES} is not an ImageStream with spec.tags`);
  }
  const version = isObject(doc.metadata) && typeof doc.metadata.name === 'string' ? doc.metadata.name : '';
  const tags: { tag: string; image: string }[] = [];
  doc.spec.tags.forEach((t: unknown, i: number) => {
    const from = isObject(t) && isObject(t.from) ? t.from : undefined;
    if (!from || from.kind !== 'DockerImage' || typeof from.name !== 'string' || !from.name) {
      throw new ReleaseError(`${IMAGE_REFERENCES}: spec.tags[${i}] has no from.name of kind DockerImage`);
    }
    tags.push({ tag: isObject(t) && typeof t.name === 'string' ? t.name : `#${i}`, image: from.name });
  });
  return { version, tags };
}

/**
 * Read the payload's image list from the release image `name`. For a
 * multi-arch release the platform's image is read (every platform's image
 * carries the same list for its own architecture).
 */
export async function readReleaseImages(client: RegistryClient, name: ImageName, platform: Platform, signal?: AbortSignal): Promise<ReleaseImages> {
  const top = await client.manifest(name, signal);
  let m = top;
  if (m.manifest.kind === 'index') {
    const entry = selectPlatform(m.manifest.manifests, platform);
    if (!entry) {
      throw new ReleaseError(`the release index ${top.digest} has no image for ${formatPlatform(platform)} (it has ${platformsOf(m.manifest.manifests).join(', ') || 'none'}); pass --platform`);
    }
    m = await client.manifest({ host: name.host, path: name.path, digest: entry.digest }, signal);
  }
  if (m.manifest.kind !== 'image') throw new ReleaseError(`the release image ${top.digest} is an index of indexes`);
  const layers = [...m.manifest.layers].reverse();
  for (const layer of layers) {
    const blob = await client.blob(name, layer.digest, signal);
    let lookup;
    try {
      lookup = await findInLayer(blob.body, IMAGE_REFERENCES, layer.digest);
    } catch (e) {
      blob.body.destroy();
      throw new ReleaseError(`layer ${layer.digest} of the release image: ${(e as Error).message}`);
    }
    if ('whiteout' in lookup) break;
    if ('found' in lookup) {
      const parsed = parseImageReferences(lookup.found.toString('utf8'));
      return { digest: top.digest, ...parsed };
    }
  }
  throw new ReleaseError(`the image ${top.digest} has no ${IMAGE_REFERENCES}: is it an OpenShift release image?`);
}
