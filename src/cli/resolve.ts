// `pinset resolve FILE...`: sets (or plain lists of image references) whose
// images carry tags become valid sets with digests, as the registry
// resolves the tags now: the index digest for a multi-arch image (each node
// then pulls its own platform), or with --platform that platform's manifest
// digest. `pinset resolve --release IMAGE`: the images of an OpenShift
// release payload as one set.
//
// Nothing is printed unless every image resolved: a set missing an image
// would pin less than was asked for without anyone noticing.
// Exit status: 0 resolved, 1 an image or document could not be resolved,
// 2 usage error.
import path from 'node:path';
import { stringify } from 'yaml';
import { parseReference } from '../api/reference.ts';
import { API_VERSION, KIND } from '../api/types.ts';
import { describeProblems, validateSet } from '../api/validate.ts';
import { RegistryError, type RegistryClient } from '../registry/client.ts';
import { hostPlatform, parsePlatform, selectPlatform, formatPlatform, platformsOf, ManifestError, type Platform } from '../registry/manifest.ts';
import { formatImageName, parseImageName, pinnedReference, type ImageName } from '../registry/names.ts';
import { ReleaseError, readReleaseImages } from '../registry/release.ts';
import { helpText, parseFlags, UsageError, type FlagSpec, type FlagValues } from '../util/flags.ts';
import { readInputs, STDIN_LABEL, type InputSet } from './image-input.ts';
import { mapLimit } from '../util/limit.ts';
import { REGISTRY_FLAGS, registryClientFrom } from './registry-options.ts';

export const RESOLVE_FLAGS: readonly FlagSpec[] = [
  { name: 'output', short: 'o', type: 'string', choices: ['yaml', 'json'], default: 'yaml', help: 'output format' },
  { name: 'platform', env: 'PINSET_PLATFORM', type: 'string', help: 'os/arch[/variant]: pin that platform\'s manifest instead of a multi-arch index' },
  { name: 'name', type: 'string', help: 'name of the set made from plain reference lists or from --release (default: from the file name, or release-<version>)' },
  { name: 'release', type: 'string', help: 'an OpenShift release image: make a set of its payload\'s images (and itself)' },
  ...REGISTRY_FLAGS,
];

const USAGE = 'pinset resolve [flags] FILE...  |  pinset resolve --release IMAGE [flags]';
const SUMMARY =
  'Turns PinnedImageSet files, or plain lists of image references (one a line), whose images\n' +
  'carry tags into valid sets with digests, as the registries resolve the tags now: the index\n' +
  'digest for a multi-arch image, or with --platform that platform\'s manifest. With --release,\n' +
  'the images of an OpenShift release payload. Prints YAML (or JSON) on stdout, nothing unless\n' +
  'every image resolved. Exit status: 0 resolved, 1 an image could not be resolved, 2 usage error.';

export interface CommandIO {
  stdin: NodeJS.ReadableStream;
  stdout: NodeJS.WritableStream;
  stderr: NodeJS.WritableStream;
}

const stdio = (): CommandIO => ({ stdin: process.stdin, stdout: process.stdout, stderr: process.stderr });

/** A DNS-1123 subdomain made from any text: "Edge Sites" -> "edge-sites". */
export function dnsName(text: string, fallback = 'resolved-images'): string {
  const n = text.toLowerCase().replace(/[^a-z0-9.-]+/g, '-').replace(/^[^a-z0-9]+|[^a-z0-9]+$/g, '').slice(0, 253);
  return n || fallback;
}

/** A set name from a file name: "edge sites.txt" -> "edge-sites". */
export function setNameFromFile(file: string): string {
  return file === STDIN_LABEL ? 'resolved-images' : dnsName(path.basename(file).replace(/\.[^.]*$/, ''));
}

/** The digest to pin for `name`: the index or manifest the tag names, or with a platform that platform's manifest. */
export async function resolveDigest(client: RegistryClient, name: ImageName, platform: Platform | undefined, signal?: AbortSignal): Promise<string> {
  if (!platform) return (await client.head(name, signal)).digest;
  const m = await client.manifest(name, signal);
  if (m.manifest.kind === 'image') return m.digest;
  const entry = selectPlatform(m.manifest.manifests, platform);
  if (!entry) throw new ManifestError(`the index ${m.digest} has no image for ${formatPlatform(platform)} (it has ${platformsOf(m.manifest.manifests).join(', ') || 'no platform entries'})`);
  return entry.digest;
}

function output(sets: Record<string, unknown>[], format: string): string {
  if (format === 'json') {
    const doc = sets.length === 1 ? sets[0] : { apiVersion: 'v1', kind: 'List', items: sets };
    return `${JSON.stringify(doc, null, 2)}\n`;
  }
  return sets.map((s) => stringify(s, { lineWidth: 0 })).join('---\n');
}

/** Server-written fields a copied set must not carry into a new object. */
function cleanMetadata(md: unknown): Record<string, unknown> {
  const m = typeof md === 'object' && md !== null ? { ...(md as Record<string, unknown>) } : {};
  for (const k of ['uid', 'resourceVersion', 'generation', 'creationTimestamp', 'managedFields', 'selfLink', 'deletionTimestamp']) delete m[k];
  return m;
}

function makeSet(name: string, images: string[]): Record<string, unknown> {
  return { apiVersion: API_VERSION, kind: KIND, metadata: { name }, spec: { pinnedImages: images.map((n) => ({ name: n })) } };
}

/** The command's flags, for its --help and the reference (docs/reference.md; a test holds the two together). */
export const flags = RESOLVE_FLAGS;

export async function run(argv: string[], io: CommandIO = stdio()): Promise<number> {
  const { values, positional } = parseFlags(RESOLVE_FLAGS, argv);
  if (values.help) {
    io.stdout.write(helpText(USAGE, SUMMARY, RESOLVE_FLAGS));
    return 0;
  }
  let platform: Platform | undefined;
  if (values.platform) {
    try {
      platform = parsePlatform(values.platform as string);
    } catch (e) {
      throw new UsageError(`--platform: ${(e as Error).message}`);
    }
  }
  if (values.release !== undefined) {
    if (positional.length > 0) throw new UsageError('--release takes no files');
    return runRelease(values.release as string, values, platform, io);
  }
  const inputs = await readInputs(positional, io.stdin, USAGE);
  const problems = [...inputs.problems];

  // Every distinct name once, however many sets hold it.
  const names = new Map<string, ImageName>();
  const parsed = new Map<InputSet, { where: string; name: ImageName | null }[]>();
  for (const set of inputs.sets) {
    parsed.set(
      set,
      set.images.map((img) => {
        const r = parseImageName(img.name);
        if (!r.ok) {
          problems.push(`${img.where}: ${r.error}`);
          return { where: img.where, name: null };
        }
        names.set(formatImageName(r.value), r.value);
        return { where: img.where, name: r.value };
      }),
    );
  }

  const client = await registryClientFrom(values, 'resolve', io.stderr);
  const digests = new Map<string, string>();
  const failures = new Map<string, string>();
  try {
    const list = [...names];
    await mapLimit(list, values.parallel as number, async ([key, n]) => {
      try {
        digests.set(key, await resolveDigest(client, n, platform));
      } catch (e) {
        if (e instanceof RegistryError) failures.set(key, e.message);
        else if (e instanceof ManifestError) failures.set(key, `${key}: ${e.message}`);
        else throw e;
      }
    });
  } finally {
    await client.close();
  }
  for (const set of inputs.sets) {
    for (const { where, name } of parsed.get(set)!) {
      if (!name) continue;
      const f = failures.get(formatImageName(name));
      if (f) problems.push(`${where}: ${f}`);
    }
  }

  const out: Record<string, unknown>[] = [];
  const listImages: string[] = [];
  let listFile: string | undefined;
  for (const set of inputs.sets) {
    const refs = [...new Set(parsed.get(set)!.flatMap(({ name }) => (name && digests.has(formatImageName(name)) ? [pinnedReference(name, digests.get(formatImageName(name))!)] : [])))];
    if (set.object === null) {
      listImages.push(...refs);
      listFile ??= set.file;
      continue;
    }
    const copy = structuredClone(set.object);
    copy.metadata = cleanMetadata(copy.metadata);
    delete copy.status;
    (copy.spec as Record<string, unknown>).pinnedImages = refs.map((n) => ({ name: n }));
    out.push(copy);
  }
  if (listFile !== undefined) out.push(makeSet((values.name as string | undefined) ?? setNameFromFile(listFile), [...new Set(listImages)]));

  // The result must be what the agent and the CRD accept.
  for (const s of out) {
    const v = validateSet(s);
    const name = (s.metadata as { name?: string }).name;
    for (const p of describeProblems(v)) problems.push(`resolved set ${JSON.stringify(name)}: ${p}`);
  }
  if (problems.length > 0) {
    for (const p of problems) io.stderr.write(`pinset resolve: ${p}\n`);
    io.stderr.write(`pinset resolve: ${problems.length} problem(s); nothing printed\n`);
    return 1;
  }
  io.stdout.write(output(out, values.output as string));
  return 0;
}

async function runRelease(image: string, values: FlagValues, platform: Platform | undefined, io: CommandIO): Promise<number> {
  const r = parseImageName(image);
  if (!r.ok) throw new UsageError(`--release: ${r.error}`);
  const client = await registryClientFrom(values, 'resolve', io.stderr);
  try {
    const release = await readReleaseImages(client, r.value, platform ?? hostPlatform());
    const releaseDigest = platform ? await resolveDigest(client, { ...r.value, digest: release.digest }, platform) : release.digest;
    const problems: string[] = [];
    const refs: string[] = [pinnedReference(r.value, releaseDigest)];
    const tagged: { tag: string; name: ImageName }[] = [];
    for (const t of release.tags) {
      if (parseReference(t.image).ok) {
        refs.push(t.image);
        continue;
      }
      const n = parseImageName(t.image);
      if (!n.ok) problems.push(`image-references tag ${t.tag}: ${n.error}`);
      else tagged.push({ tag: t.tag, name: n.value });
    }
    // A payload names its images by digest; a tag among them is resolved like any other.
    await mapLimit(tagged, values.parallel as number, async (t) => {
      try {
        refs.push(pinnedReference(t.name, await resolveDigest(client, t.name, platform)));
      } catch (e) {
        problems.push(`image-references tag ${t.tag}: ${(e as Error).message}`);
      }
    });
    const name = (values.name as string | undefined) ?? dnsName(`release-${release.version || releaseDigest.slice(7, 19)}`);
    const set = makeSet(name, [...new Set(refs)]);
    for (const p of describeProblems(validateSet(set))) problems.push(`resolved set ${JSON.stringify(name)}: ${p}`);
    if (problems.length) {
      for (const p of problems) io.stderr.write(`pinset resolve: ${p}\n`);
      io.stderr.write(`pinset resolve: ${problems.length} problem(s); nothing printed\n`);
      return 1;
    }
    io.stdout.write(output([set], values.output as string));
    return 0;
  } catch (e) {
    if (e instanceof RegistryError || e instanceof ReleaseError || e instanceof ManifestError) {
      io.stderr.write(`pinset resolve: release ${image}: ${e.message}\n`);
      return 1;
    }
    throw e;
  } finally {
    await client.close();
  }
}
