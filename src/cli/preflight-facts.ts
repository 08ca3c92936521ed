// What `pinset preflight` reads of a cluster (readCluster), and the shape
// the checks (./preflight-checks.ts) take it in. Everything is read, nothing
// written; a read that fails is kept as why (Unreadable), so the check it
// serves can say it could not tell rather than guess. Only /version failing
// fails the whole reading: then the API server is not there.
import type { KubeConfig } from '@kubernetes/client-node';
import { KubeApiError, KubeHttp } from '../api/kube-http.ts';
import { apiError } from './api-error.ts';
import { DEFAULT_PAGE_SIZE, listAll } from '../api/list-pages.ts';
import { readNodeStatus } from '../api/node-status.ts';
import { GROUP, PLURAL, VERSION, type KubeletVerificationStatus, type LabelSelector } from '../api/types.ts';

/** A read that failed: the check it serves says it could not tell, and why. */
export interface Unreadable {
  unreadable: string;
}
export type Read<T> = T | Unreadable;
export const isUnreadable = <T>(r: Read<T>): r is Unreadable => typeof r === 'object' && r !== null && 'unreadable' in r;

export interface NodeFacts {
  name: string;
  labels: Record<string, string>;
  /** status.nodeInfo: what the kubelet reports of its host. */
  operatingSystem?: string;
  containerRuntimeVersion?: string;
  kubeletVersion?: string;
  /** What pinset's agent reports of the kubelet's credential verification, when it runs there. */
  kubeletVerification?: KubeletVerificationStatus;
}

export interface ResourceQuotaFacts {
  name: string;
  hardPods?: string;
  scopeSelector?: { matchExpressions?: { scopeName?: string; operator?: string; values?: string[] }[] };
}

export interface PolicyRule {
  apiGroups?: string[];
  resources?: string[];
  verbs?: string[];
  resourceNames?: string[];
}

export interface RoleBindingFacts {
  /** "RoleBinding <ns>/<name>" or "ClusterRoleBinding <name>". */
  label: string;
  roleRef: { kind: string; name: string };
  subjects: { kind: string; name: string; namespace?: string }[];
}

export interface SecurityContextConstraintsFacts {
  name: string;
  users?: string[];
  groups?: string[];
  allowHostDirVolumePlugin?: boolean;
  allowHostNetwork?: boolean;
  allowHostPorts?: boolean;
  volumes?: string[];
  runAsUser?: { type?: string; uid?: number };
  seLinuxContext?: { type?: string; seLinuxOptions?: { type?: string } };
  seccompProfiles?: string[];
}

export interface OpenShiftFacts {
  sccs: Read<SecurityContextConstraintsFacts[]>;
  /** RoleBindings in pinset's namespace and ClusterRoleBindings. */
  bindings: Read<RoleBindingFacts[]>;
  /** Roles ("Role <ns>/<name>") and ClusterRoles ("ClusterRole <name>") by that key: their rules. */
  roles: Read<Record<string, PolicyRule[]>>;
}

export interface SetFacts {
  name: string;
  /** "api", or the file it was read from. */
  origin: string;
  selector?: LabelSelector;
}

export interface ClusterFacts {
  server: string;
  namespace: string;
  version: { gitVersion: string; major?: string; minor?: string };
  /** The group versions /apis lists ("security.openshift.io/v1"). */
  groupVersions: Read<string[]>;
  /** The resources of admissionregistration.k8s.io/v1; null when that group version is not served. */
  admissionV1: Read<string[] | null>;
  nodes: Read<NodeFacts[]>;
  quotas: { kubeSystem: Read<ResourceQuotaFacts[]>; namespace: Read<ResourceQuotaFacts[]> };
  /** Read only on OpenShift. */
  openshift?: OpenShiftFacts;
  /** The sets in the API; null when the CRD is not installed. */
  apiSets: Read<SetFacts[] | null>;
  /** The sets of the FILE and DIR arguments. */
  fileSets: SetFacts[];
  /** What is wrong in the FILEs (each a failure of the sets check). */
  fileProblems: string[];
}

interface Reader {
  http: KubeHttp;
  timeoutMs: number;
}

async function attempt<T>(fn: () => Promise<T>): Promise<Read<T>> {
  try {
    return await fn();
  } catch (err) {
    return { unreadable: apiError(err) };
  }
}

/** A GET whose 404 means "not served here" (null). */
async function getOrNull<T>(r: Reader, path: string): Promise<T | null> {
  try {
    return await r.http.json<T>('GET', path, {}, undefined, { timeoutMs: r.timeoutMs });
  } catch (err) {
    if (err instanceof KubeApiError && err.code === 404) return null;
    throw err;
  }
}

async function listOf<T, U>(r: Reader, path: string, keep: (item: T) => U): Promise<U[]> {
  return (await listAll<T, U>({ http: r.http, path, pageSize: DEFAULT_PAGE_SIZE, timeoutMs: r.timeoutMs }, keep)).items;
}

interface NodeObject {
  metadata?: { name?: string; labels?: Record<string, string>; annotations?: Record<string, string> };
  status?: { nodeInfo?: { operatingSystem?: string; containerRuntimeVersion?: string; kubeletVersion?: string } };
}

const nodeFacts = (n: NodeObject): NodeFacts => ({
  name: n.metadata?.name ?? '',
  labels: n.metadata?.labels ?? {},
  operatingSystem: n.status?.nodeInfo?.operatingSystem,
  containerRuntimeVersion: n.status?.nodeInfo?.containerRuntimeVersion,
  kubeletVersion: n.status?.nodeInfo?.kubeletVersion,
  kubeletVerification: readNodeStatus(n.metadata?.annotations).status?.kubeletVerification,
});

interface QuotaObject {
  metadata?: { name?: string };
  spec?: { hard?: Record<string, string>; scopeSelector?: ResourceQuotaFacts['scopeSelector'] };
}
const quotaFacts = (q: QuotaObject): ResourceQuotaFacts => ({ name: q.metadata?.name ?? '', hardPods: q.spec?.hard?.pods, scopeSelector: q.spec?.scopeSelector });

interface BindingObject {
  metadata?: { name?: string; namespace?: string };
  roleRef?: { kind?: string; name?: string };
  subjects?: { kind?: string; name?: string; namespace?: string }[];
}
const bindingFacts = (b: BindingObject): RoleBindingFacts => ({
  label: b.metadata?.namespace ? `RoleBinding ${b.metadata.namespace}/${b.metadata?.name}` : `ClusterRoleBinding ${b.metadata?.name}`,
  roleRef: { kind: b.roleRef?.kind ?? '', name: b.roleRef?.name ?? '' },
  subjects: (b.subjects ?? []).map((s) => ({ kind: s.kind ?? '', name: s.name ?? '', ...(s.namespace ? { namespace: s.namespace } : {}) })),
});

async function readOpenShift(r: Reader, namespace: string): Promise<OpenShiftFacts> {
  const ns = encodeURIComponent(namespace);
  const sccs = attempt(() => listOf<SecurityContextConstraintsFacts & { metadata?: { name?: string } }, SecurityContextConstraintsFacts>(r, '/apis/security.openshift.io/v1/securitycontextconstraints', (o) => ({ ...o, name: o.metadata?.name ?? '' })));
  const bindings = attempt(async () => [
    ...(await listOf<BindingObject, RoleBindingFacts>(r, `/apis/rbac.authorization.k8s.io/v1/namespaces/${ns}/rolebindings`, bindingFacts)),
    ...(await listOf<BindingObject, RoleBindingFacts>(r, '/apis/rbac.authorization.k8s.io/v1/clusterrolebindings', bindingFacts)),
  ]);
  const roles = attempt(async () => {
    type RoleObject = { metadata?: { name?: string; namespace?: string }; rules?: PolicyRule[] };
    const out: Record<string, PolicyRule[]> = {};
    for (const role of await listOf<RoleObject, RoleObject>(r, `/apis/rbac.authorization.k8s.io/v1/namespaces/${ns}/roles`, (o) => o)) out[`Role ${namespace}/${role.metadata?.name}`] = role.rules ?? [];
    for (const role of await listOf<RoleObject, RoleObject>(r, '/apis/rbac.authorization.k8s.io/v1/clusterroles', (o) => o)) out[`ClusterRole ${role.metadata?.name}`] = role.rules ?? [];
    return out;
  });
  return { sccs: await sccs, bindings: await bindings, roles: await roles };
}

/** Everything the checks need, read from the API; a read that fails is kept as why. Throws only when /version cannot be read. */
export async function readCluster(kc: KubeConfig, opts: { namespace: string; timeoutMs: number; fileSets: SetFacts[]; fileProblems: string[] }): Promise<ClusterFacts> {
  const http = new KubeHttp(kc, { userAgent: 'pinset-preflight', connectTimeoutMs: opts.timeoutMs });
  const r: Reader = { http, timeoutMs: opts.timeoutMs };
  try {
    const version = await http.json<ClusterFacts['version']>('GET', '/version', {}, undefined, { timeoutMs: opts.timeoutMs });
    const ns = encodeURIComponent(opts.namespace);
    const [groupVersions, admissionV1, nodes, kubeSystem, namespace, apiSets] = await Promise.all([
      attempt(async () => ((await http.json<{ groups?: { versions?: { groupVersion: string }[] }[] }>('GET', '/apis', {}, undefined, { timeoutMs: opts.timeoutMs })).groups ?? []).flatMap((g) => (g.versions ?? []).map((v) => v.groupVersion))),
      attempt(async () => (await getOrNull<{ resources?: { name: string }[] }>(r, '/apis/admissionregistration.k8s.io/v1'))?.resources?.map((x) => x.name) ?? null),
      attempt(() => listOf(r, '/api/v1/nodes', nodeFacts)),
      attempt(() => listOf(r, '/api/v1/namespaces/kube-system/resourcequotas', quotaFacts)),
      attempt(() => listOf(r, `/api/v1/namespaces/${ns}/resourcequotas`, quotaFacts)),
      attempt(async () => {
        // The CRD not installed: the type's path is 404 (no sets yet).
        try {
          return await listOf<{ metadata?: { name?: string }; spec?: { nodeSelector?: LabelSelector } }, SetFacts>(r, `/apis/${GROUP}/${VERSION}/${PLURAL}`, (s) => ({ name: s.metadata?.name ?? '', origin: 'api', selector: s.spec?.nodeSelector }));
        } catch (err) {
          if (err instanceof KubeApiError && err.code === 404) return null;
          throw err;
        }
      }),
    ]);
    const openshift = !isUnreadable(groupVersions) && groupVersions.includes('security.openshift.io/v1') ? await readOpenShift(r, opts.namespace) : undefined;
    return {
      server: http.server,
      namespace: opts.namespace,
      version: { gitVersion: String(version?.gitVersion ?? ''), major: version?.major, minor: version?.minor },
      groupVersions,
      admissionV1,
      nodes,
      quotas: { kubeSystem, namespace },
      ...(openshift ? { openshift } : {}),
      apiSets,
      fileSets: opts.fileSets,
      fileProblems: opts.fileProblems,
    };
  } finally {
    http.close();
  }
}

