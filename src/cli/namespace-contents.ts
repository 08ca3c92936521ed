// Whether a namespace holds anything but pinset's objects, asked of the API
// server itself, for `pinset uninstall`: a Namespace goes only when it
// does not, since deleting a namespace deletes everything in it. pinset may
// have been rendered into a namespace that holds other things
// (docs/operating.md), and its install then labels that namespace as its
// own: the label alone cannot tell.
//
// Every namespaced resource type the server serves (discovery: /api/v1 and
// the preferred version of each group in /apis, the types that can be
// listed) is listed in the namespace, as metadata only. An object is
// pinset's when:
// - it carries pinset's label (app.kubernetes.io/part-of=pinset, set on
//   every object by deploy/base/kustomization.yaml);
// - it is owned (ownerReferences) only by objects that are pinset's, found
//   in the namespace or named by the manifests: a workload's pods,
//   ReplicaSets and ControllerRevisions, which the garbage collector
//   removes with it;
// - pinset made it at run time: a rollout slot Lease (labelled
//   pinset.dev/rollout-set) or a Lease a Role of the manifests names (the
//   controller's leader election Lease);
// - Kubernetes makes it in every namespace: the ConfigMap kube-root-ca.crt,
//   the ServiceAccount default and, on older clusters, its token Secret.
// Not counted: Events (records of what happened to objects, which expire)
// and metrics.k8s.io (views of the pods, which are counted themselves). A
// type that cannot be listed keeps the namespace: what it holds is unknown.
import { KubeApiError, type KubeHttp } from '../api/kube-http.ts';
import { listAll, METADATA_LIST_ACCEPT } from '../api/list-pages.ts';
import { SLOT_SET_LABEL } from '../rollout/slots.ts';
import { apiError } from './api-error.ts';
import { isPinsets, type ManifestObject } from './manifests.ts';

/** What a namespace holds besides pinset's objects. */
export interface NamespaceContents {
  /** Objects that are not pinset's, as `Kind namespace/name`, the first few. */
  foreign: string[];
  /** How many more foreign objects there are than listed. */
  moreForeign: number;
  /** Types that could not be listed, with why. */
  unreadable: string[];
}

/** How many foreign objects a message names. */
const NAMED = 5;
/** Groups whose objects do not count (see the top of the file). */
const NOT_COUNTED_GROUPS = new Set(['events.k8s.io', 'metrics.k8s.io']);

interface Meta {
  name?: string;
  uid?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  ownerReferences?: { kind?: string; name?: string; uid?: string }[];
}

interface Found {
  kind: string;
  group: string;
  meta: Meta;
}

interface Resource {
  groupVersion: string;
  name: string;
  kind: string;
}

/** Every namespaced type that can be listed, one version per group (the preferred one), and the group versions whose types cannot be told. */
async function namespacedTypes(http: KubeHttp, timeoutMs: number): Promise<{ types: Resource[]; unreadable: string[] }> {
  const groups = await http.json<{ groups?: { preferredVersion?: { groupVersion?: string } }[] }>('GET', '/apis', {}, undefined, { timeoutMs });
  const versions = ['v1', ...(groups.groups ?? []).map((g) => g.preferredVersion?.groupVersion).filter((v): v is string => Boolean(v))];
  const types: Resource[] = [];
  const unreadable: string[] = [];
  for (const gv of versions) {
    const group = gv.includes('/') ? gv.split('/')[0]! : '';
    if (NOT_COUNTED_GROUPS.has(group)) continue;
    let list: { resources?: { name: string; kind: string; namespaced?: boolean; verbs?: string[] }[] };
    try {
      list = await http.json('GET', gv === 'v1' ? '/api/v1' : `/apis/${gv}`, {}, undefined, { timeoutMs });
    } catch (err) {
      if (!(err instanceof KubeApiError)) throw err;
      // A group gone since /apis was read (a CRD just deleted): it holds nothing any more.
      if (err.code === 404) continue;
      // An aggregated API that is down (503): what it holds cannot be told.
      unreadable.push(`the types of ${gv}: ${apiError(err)}`);
      continue;
    }
    for (const r of list.resources ?? []) {
      if (!r.namespaced || r.name.includes('/') || !r.verbs?.includes('list')) continue;
      if (group === '' && r.name === 'events') continue;
      types.push({ groupVersion: gv, name: r.name, kind: r.kind });
    }
  }
  return { types, unreadable };
}

/** The names of the Leases the manifests' Roles in `ns` name (the controller's leader election Lease). */
function namedLeases(manifests: readonly ManifestObject[], ns: string): Set<string> {
  const out = new Set<string>();
  for (const o of manifests) {
    if (o.kind !== 'Role' || o.namespace !== ns) continue;
    for (const r of ((o.doc as { rules?: { resources?: string[]; resourceNames?: string[] }[] }).rules ?? [])) {
      if (r.resources?.includes('leases')) for (const n of r.resourceNames ?? []) out.add(n);
    }
  }
  return out;
}

/** What `ns` holds besides pinset's objects. */
export async function namespaceContents(http: KubeHttp, ns: string, o: { timeoutMs: number; manifests: readonly ManifestObject[] }): Promise<NamespaceContents> {
  const { types, unreadable } = await namespacedTypes(http, o.timeoutMs);
  const found: Found[] = [];
  for (const r of types) {
    const base = r.groupVersion === 'v1' ? '/api/v1' : `/apis/${r.groupVersion}`;
    try {
      const { items } = await listAll<{ metadata?: Meta }, Meta>({ http, path: `${base}/namespaces/${encodeURIComponent(ns)}/${r.name}`, accept: METADATA_LIST_ACCEPT, timeoutMs: o.timeoutMs }, (x) => x.metadata ?? {});
      const group = r.groupVersion.includes('/') ? r.groupVersion.split('/')[0]! : '';
      for (const meta of items) found.push({ kind: r.kind, group, meta });
    } catch (err) {
      unreadable.push(`${r.kind} (${r.name}${r.groupVersion.includes('/') ? `.${r.groupVersion.split('/')[0]}` : ''}): ${apiError(err)}`);
    }
  }
  const leases = namedLeases(o.manifests, ns);
  const named = new Set(o.manifests.filter((m) => m.namespace === ns).map((m) => `${m.kind}/${m.name}`));
  const pinsetUids = new Set<string>();
  const ours = (f: Found): boolean => {
    const m = f.meta;
    if (isPinsets(m.labels)) return true;
    if (f.kind === 'Lease' && f.group === 'coordination.k8s.io' && (m.labels?.[SLOT_SET_LABEL] !== undefined || leases.has(m.name ?? ''))) return true;
    if (f.group === '' && ((f.kind === 'ConfigMap' && m.name === 'kube-root-ca.crt') || (f.kind === 'ServiceAccount' && m.name === 'default'))) return true;
    if (f.group === '' && f.kind === 'Secret' && m.annotations?.['kubernetes.io/service-account.name'] === 'default') return true;
    const owners = m.ownerReferences ?? [];
    return owners.length > 0 && owners.every((r) => (r.uid !== undefined && pinsetUids.has(r.uid)) || named.has(`${r.kind}/${r.name}`));
  };
  // Owners before what they own, however deep (Deployment, ReplicaSet, Pod): until nothing more is found.
  let rest = found;
  for (let grew = true; grew; ) {
    grew = false;
    const next: Found[] = [];
    for (const f of rest) {
      if (ours(f)) {
        if (f.meta.uid) pinsetUids.add(f.meta.uid);
        grew = true;
      } else next.push(f);
    }
    rest = next;
  }
  const foreign = rest.map((f) => `${f.kind} ${ns}/${f.meta.name ?? '?'}`).sort();
  return { foreign: foreign.slice(0, NAMED), moreForeign: Math.max(0, foreign.length - NAMED), unreadable };
}

/** Why a namespace is kept, or undefined when it holds only pinset's objects. */
export function whyKept(c: NamespaceContents): string | undefined {
  const parts: string[] = [];
  if (c.foreign.length > 0) parts.push(`it holds objects that are not pinset's: ${c.foreign.join(', ')}${c.moreForeign > 0 ? ` and ${c.moreForeign} more` : ''}`);
  if (c.unreadable.length > 0) parts.push(`what it holds cannot all be listed: ${c.unreadable.join('; ')}`);
  return parts.length > 0 ? parts.join('; ') : undefined;
}
