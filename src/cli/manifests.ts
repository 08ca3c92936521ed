// What an install of pinset created, read from the manifests themselves
// (never a list of names kept apart, which would drift from them): the
// objects of a kustomization folder (deploy/, deploy/containerd/, an
// overlay), of a YAML file, or of standard input (`kubectl kustomize
// my-overlay | pinset uninstall --manifests -`). By default, the deploy/
// that ships with this pinset (dist/deploy in the bundle, deploy/ beside
// the sources).
//
// A kustomization is read for the objects it names, not built: resources
// (files and folders, recursively) give the objects, and what only changes
// their content (labels, images, patches) is ignored. What would change an
// object's name or namespace (namePrefix, nameSuffix, namespace,
// replacements, components) or make objects (generators, Helm charts) is
// refused with a message that says to render it with `kubectl kustomize`
// first. test/unit/uninstall-manifests.test.ts checks that the objects
// read here are the objects `kubectl kustomize` builds from deploy/ and
// deploy/containerd/.
import { existsSync, statSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseYamlDocuments } from '../api/yaml.ts';

/** One object the manifests create. */
export interface ManifestObject {
  apiVersion: string;
  kind: string;
  name: string;
  /** As the manifest says; undefined for cluster-scoped objects (and namespaced ones that leave it to the client's default). */
  namespace?: string;
  /** The whole document (the CRD is installed again from it when it is missing). */
  doc: Record<string, unknown>;
}

const KUSTOMIZATION_FILES = ['kustomization.yaml', 'kustomization.yml', 'Kustomization'];
/** Kustomization fields that change names or namespaces, or make objects: read them with `kubectl kustomize` instead. */
const UNSUPPORTED = ['namePrefix', 'nameSuffix', 'namespace', 'replacements', 'components', 'configMapGenerator', 'secretGenerator', 'helmCharts', 'generators', 'transformers'];

/** The label deploy/base/kustomization.yaml sets on every object pinset installs: `pinset uninstall` removes only objects that carry it. */
export const PINSET_LABEL = 'app.kubernetes.io/part-of';
export const PINSET_LABEL_VALUE = 'pinset';

/** Whether labels carry pinset's label. */
export function isPinsets(labels: Readonly<Record<string, string>> | undefined): boolean {
  return labels?.[PINSET_LABEL] === PINSET_LABEL_VALUE;
}

/** `Kind namespace/name`, as the plan prints an object. */
export function describeObject(o: Pick<ManifestObject, 'kind' | 'name' | 'namespace'>): string {
  return `${o.kind} ${o.namespace ? `${o.namespace}/` : ''}${o.name}`;
}

/** The deploy/ folder that ships with this pinset: dist/deploy beside the bundle's files, or deploy/ beside src/. */
export function shippedManifests(): string | undefined {
  for (const rel of ['./deploy/', '../../deploy/']) {
    const dir = fileURLToPath(new URL(rel, import.meta.url));
    if (KUSTOMIZATION_FILES.some((f) => existsSync(path.join(dir, f)))) return dir;
  }
  return undefined;
}

function objectsOf(text: string, from: string): ManifestObject[] {
  const out: ManifestObject[] = [];
  for (const d of parseYamlDocuments(text)) {
    if ('error' in d) throw new Error(`${from}, the document at line ${d.line}: ${d.error}`);
    const v = d.value as { apiVersion?: unknown; kind?: unknown; metadata?: { name?: unknown; namespace?: unknown } } | null;
    if (!v || typeof v !== 'object') continue;
    if (typeof v.apiVersion !== 'string' || typeof v.kind !== 'string' || typeof v.metadata?.name !== 'string') {
      throw new Error(`${from}, the document at line ${d.line}: not a Kubernetes object (apiVersion, kind and metadata.name are needed)`);
    }
    // A List (what `kubectl get -o yaml` prints) holds its objects in items.
    if (v.kind === 'List') throw new Error(`${from}, the document at line ${d.line}: a List; give the objects as separate documents`);
    out.push({
      apiVersion: v.apiVersion,
      kind: v.kind,
      name: v.metadata.name,
      ...(typeof v.metadata.namespace === 'string' && v.metadata.namespace ? { namespace: v.metadata.namespace } : {}),
      doc: v as Record<string, unknown>,
    });
  }
  return out;
}

async function readKustomization(dir: string, seen: Set<string>): Promise<ManifestObject[]> {
  const real = path.resolve(dir);
  if (seen.has(real)) throw new Error(`${dir}: a kustomization that includes itself`);
  seen.add(real);
  const file = KUSTOMIZATION_FILES.map((f) => path.join(dir, f)).find((f) => existsSync(f));
  if (!file) throw new Error(`${dir} holds no kustomization.yaml`);
  const docs = parseYamlDocuments(await readFile(file, 'utf8'));
  const first = docs[0];
  if (!first || 'error' in first || typeof first.value !== 'object' || first.value === null) throw new Error(`${file}: ${first && 'error' in first ? first.error : 'not a kustomization'}`);
  const k = first.value as Record<string, unknown>;
  const unsupported = UNSUPPORTED.filter((f) => k[f] !== undefined);
  if (unsupported.length > 0) {
    throw new Error(`${file} sets ${unsupported.join(', ')}, which this reader does not apply; render it first: \`kubectl kustomize ${dir} | pinset uninstall --manifests -\``);
  }
  const entries = [...((k.resources as unknown[]) ?? []), ...((k.bases as unknown[]) ?? [])];
  const out: ManifestObject[] = [];
  for (const e of entries) {
    if (typeof e !== 'string') throw new Error(`${file}: resources holds ${JSON.stringify(e)}, not a path`);
    if (/^[a-z]+:\/\/|^github\.com\//.test(e)) throw new Error(`${file}: the remote resource ${e} is not read here; render it first: \`kubectl kustomize ${dir} | pinset uninstall --manifests -\``);
    const p = path.join(dir, e);
    if (!existsSync(p)) throw new Error(`${file}: ${e} does not exist`);
    out.push(...(statSync(p).isDirectory() ? await readKustomization(p, seen) : objectsOf(await readFile(p, 'utf8'), p)));
  }
  return out;
}

async function readStdin(): Promise<string> {
  let text = '';
  process.stdin.setEncoding('utf8');
  for await (const chunk of process.stdin) text += chunk as string;
  return text;
}

/**
 * The objects the manifests at `source` create: a kustomization folder, a
 * YAML file, "-" for standard input, or (undefined) the shipped deploy/.
 * Each object once. Throws an Error that names the file and the problem.
 */
export async function readManifests(source: string | undefined): Promise<{ objects: ManifestObject[]; from: string }> {
  let from: string;
  let objects: ManifestObject[];
  if (source === '-') {
    from = 'standard input';
    objects = objectsOf(await readStdin(), from);
  } else {
    const where = source ?? shippedManifests();
    if (!where) throw new Error('this pinset ships no manifests (no deploy/ beside it); give the ones it was installed with: --manifests DIR, or --manifests - with `kubectl kustomize DIR` on standard input');
    from = where;
    if (!existsSync(where)) throw new Error(`${where} does not exist`);
    objects = statSync(where).isDirectory() ? await readKustomization(where, new Set()) : objectsOf(await readFile(where, 'utf8'), where);
  }
  const byId = new Map<string, ManifestObject>();
  for (const o of objects) byId.set(`${o.apiVersion.split('/')[0]}/${describeObject(o)}`, o);
  if (byId.size === 0) throw new Error(`${from} holds no objects`);
  return { objects: [...byId.values()], from };
}
