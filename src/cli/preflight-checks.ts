// `pinset preflight`'s checks: pure functions of what was read of the
// cluster (./preflight-facts.ts), each saying what is fine, what will fail
// and what to do. Why each check exists, with its sources: ./preflight.ts.
import { gateDefault, GATE } from '../api/kubelet-verification.ts';
import { selectorErrors, selectorMatches } from '../api/selector.ts';
import type { KubeletVerificationStatus } from '../api/types.ts';
import { containerdCanPin, PINNING_VERSIONS } from '../containerd/versions.ts';
import { isUnreadable, type ClusterFacts, type NodeFacts, type PolicyRule, type ResourceQuotaFacts, type RoleBindingFacts, type SecurityContextConstraintsFacts } from './preflight-facts.ts';

/** The agent's service account (deploy/agent/serviceaccount.yaml). */
export const AGENT_SERVICE_ACCOUNT = 'pinset-agent';
/** The agent's priority class (deploy/agent/daemonset.yaml). */
export const AGENT_PRIORITY_CLASS = 'system-node-critical';
/** The ResourceQuota component that admits it where the class is limited. */
const QUOTA_COMPONENT = 'deploy/critical-pods-quota';

export type CheckResult = 'ok' | 'note' | 'fail';

export interface CheckOutcome {
  check: string;
  /** ok: fine; note: nothing will fail, but something wants doing or knowing; fail: something will fail. */
  result: CheckResult;
  message: string;
  /** What to do, for a note or a failure. */
  todo?: string;
}

/** "1 node", "3 nodes". */
export const plural = (n: number, one: string, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;

/** Up to `max` names, then "and N more". */
function someNames(names: readonly string[], max = 5): string {
  const shown = names.slice(0, max).join(', ');
  return names.length > max ? `${shown} and ${names.length - max} more` : shown;
}

/** Kubernetes' minor version from /version ("v1.30.5-gke.1014001", or major "1" and minor "30+"); undefined for another major. */
export function kubernetesMinor(v: ClusterFacts['version']): number | undefined {
  const m = /^v?(\d+)\.(\d+)/.exec(v.gitVersion);
  const [major, minor] = m ? [Number(m[1]), Number(m[2])] : [Number.parseInt(v.major ?? '', 10), Number.parseInt(v.minor ?? '', 10)];
  return major === 1 && Number.isInteger(minor) ? minor : undefined;
}

/** ValidatingAdmissionPolicy v1, and the node-name claim the policies check. */
export function kubernetesCheck(f: Pick<ClusterFacts, 'version' | 'admissionV1'>): CheckOutcome {
  const check = 'kubernetes';
  const v = f.version.gitVersion;
  const minor = kubernetesMinor(f.version);
  if (isUnreadable(f.admissionV1)) return { check, result: 'note', message: `Kubernetes ${v}; could not read which admissionregistration.k8s.io/v1 resources it serves: ${f.admissionV1.unreadable}`, todo: 'deploy/admission needs ValidatingAdmissionPolicy v1: Kubernetes 1.30 or later' };
  const served = (f.admissionV1 ?? []).includes('validatingadmissionpolicies') && (f.admissionV1 ?? []).includes('validatingadmissionpolicybindings');
  if (!served) {
    return {
      check,
      result: 'fail',
      message: `Kubernetes ${v} serves no ValidatingAdmissionPolicy in admissionregistration.k8s.io/v1 (it does from 1.30): \`kubectl apply -k deploy/\` fails on the policies of deploy/admission, which keep each agent to its own Node`,
      todo: 'upgrade the cluster to Kubernetes 1.30 or later',
    };
  }
  if (minor !== undefined && minor < 30) {
    return {
      check,
      result: 'fail',
      message: `Kubernetes ${v} serves ValidatingAdmissionPolicy v1, but before 1.30 the service account tokens of pods name no node unless the API server's feature gate ServiceAccountTokenPodNodeInfo is on (it is off by default in 1.29): deploy/admission's policies would then refuse every agent's report on its Node`,
      todo: 'upgrade to Kubernetes 1.30 or later (or turn ServiceAccountTokenPodNodeInfo on in the API server)',
    };
  }
  const which = minor === undefined ? `${v} (a version pinset cannot read)` : v;
  return {
    check,
    result: minor === undefined ? 'note' : 'ok',
    message: `Kubernetes ${which}: ValidatingAdmissionPolicy v1 is served${minor === undefined ? '' : ", and pods' service account tokens name their node (on by default since 1.30)"}, as deploy/admission's policies need`,
    ...(minor === undefined ? { todo: 'make sure it is Kubernetes 1.30 or later' } : {}),
  };
}

/** Whether an SCC admits the agent's pod as deploy/agent/daemonset.yaml writes it (OpenShift's SCC admission, openshift/apiserver-library-go pkg/securitycontextconstraints). */
export function sccAdmitsAgent(scc: SecurityContextConstraintsFacts): string | undefined {
  const volumes = scc.volumes ?? [];
  if (!scc.allowHostDirVolumePlugin || !(volumes.includes('*') || volumes.includes('hostPath'))) return 'no hostPath volumes';
  if (!scc.allowHostNetwork) return 'no host network';
  // With hostNetwork the pod's containerPort 9402 is a host port too.
  if (!scc.allowHostPorts) return 'no host ports';
  const user = scc.runAsUser?.type;
  if (!(user === 'RunAsAny' || (user === 'MustRunAs' && scc.runAsUser?.uid === 0))) return 'not uid 0';
  const selinux = scc.seLinuxContext;
  if (!(selinux?.type === 'RunAsAny' || (selinux?.type === 'MustRunAs' && selinux.seLinuxOptions?.type === 'spc_t'))) return 'not the SELinux type spc_t';
  const seccomp = scc.seccompProfiles;
  if (seccomp && seccomp.length > 0 && !seccomp.includes('*') && !seccomp.includes('runtime/default')) return 'not the seccomp profile RuntimeDefault';
  return undefined;
}

const matches = (list: string[] | undefined, want: string) => (list ?? []).includes('*') || (list ?? []).includes(want);

/** The SCCs a role's rules let its subjects use: names, or '*' for every one. */
function sccsOfRules(rules: readonly PolicyRule[]): string[] {
  const out: string[] = [];
  for (const r of rules) {
    if (!matches(r.apiGroups, 'security.openshift.io') || !matches(r.resources, 'securitycontextconstraints') || !matches(r.verbs, 'use')) continue;
    out.push(...(r.resourceNames?.length ? r.resourceNames : ['*']));
  }
  return out;
}

/** OpenShift: an SCC that admits the agent's pod, granted to its service account. */
export function openshiftCheck(f: Pick<ClusterFacts, 'groupVersions' | 'namespace' | 'openshift'>): CheckOutcome {
  const check = 'openshift';
  if (isUnreadable(f.groupVersions)) return { check, result: 'note', message: `could not list the API groups: ${f.groupVersions.unreadable}` };
  if (!f.groupVersions.includes('security.openshift.io/v1') || !f.openshift) return { check, result: 'ok', message: 'not OpenShift (no security.openshift.io API): no SecurityContextConstraints to meet' };
  const sa = `system:serviceaccount:${f.namespace}:${AGENT_SERVICE_ACCOUNT}`;
  const groups = ['system:serviceaccounts', `system:serviceaccounts:${f.namespace}`, 'system:authenticated'];
  const todo = `let service account ${f.namespace}/${AGENT_SERVICE_ACCOUNT} use the privileged SCC: the RoleBinding of docs/installing.md#openshift, or \`oc adm policy add-scc-to-user privileged -z ${AGENT_SERVICE_ACCOUNT} -n ${f.namespace}\``;
  const { sccs, bindings, roles } = f.openshift;
  const unreadable = [sccs, bindings, roles].find(isUnreadable);
  if (unreadable) return { check, result: 'note', message: `OpenShift; could not tell which SCCs service account ${f.namespace}/${AGENT_SERVICE_ACCOUNT} may use: ${unreadable.unreadable}`, todo };
  const s = sccs as SecurityContextConstraintsFacts[];
  // Granted through the SCC's own users and groups, or through RBAC's `use` verb on it.
  const granted = new Map<string, string>();
  for (const scc of s) {
    if ((scc.users ?? []).includes(sa)) granted.set(scc.name, `its users name ${sa}`);
    else if ((scc.groups ?? []).some((g) => groups.includes(g))) granted.set(scc.name, 'its groups include the service account');
  }
  for (const b of bindings as RoleBindingFacts[]) {
    const bound = b.subjects.some(
      (x) => (x.kind === 'ServiceAccount' && x.name === AGENT_SERVICE_ACCOUNT && (x.namespace ?? f.namespace) === f.namespace) || (x.kind === 'Group' && groups.includes(x.name)),
    );
    if (!bound) continue;
    const key = b.roleRef.kind === 'Role' ? `Role ${f.namespace}/${b.roleRef.name}` : `ClusterRole ${b.roleRef.name}`;
    for (const name of sccsOfRules((roles as Record<string, PolicyRule[]>)[key] ?? [])) {
      for (const scc of name === '*' ? s : s.filter((x) => x.name === name)) if (!granted.has(scc.name)) granted.set(scc.name, `${b.label} grants ${key}`);
    }
  }
  const fits = [...granted].filter(([name]) => sccAdmitsAgent(s.find((x) => x.name === name)!) === undefined);
  if (fits.length > 0) {
    const [name, how] = fits[0]!;
    return { check, result: 'ok', message: `OpenShift: SCC ${name} admits the agent's pod (host paths, uid 0, spc_t, host network), and service account ${f.namespace}/${AGENT_SERVICE_ACCOUNT} may use it (${how})` };
  }
  const refused = [...granted].map(([name]) => `${name} (${sccAdmitsAgent(s.find((x) => x.name === name)!)})`);
  return {
    check,
    result: 'fail',
    message: `OpenShift: no SCC that admits the agent's pod (host paths, uid 0, spc_t, host network) is granted to service account ${f.namespace}/${AGENT_SERVICE_ACCOUNT}${refused.length ? `; those it may use do not: ${refused.join(', ')}` : ''}: the DaemonSet would create no pod`,
    todo,
  };
}

/** A quota's `pods` as a number (resource.Quantity: a plain number, or with a decimal or binary suffix). */
export function quantityOfPods(q: string | undefined): number | undefined {
  const m = /^(\d+)(k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$/.exec(q ?? '');
  if (!m) return undefined;
  const scale: Record<string, number> = { k: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, E: 1e18, Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, Pi: 2 ** 50, Ei: 2 ** 60 };
  return Number(m[1]) * (m[2] ? scale[m[2]]! : 1);
}

/** Whether a ResourceQuota's scope covers pods of the agent's priority class. */
export function coversAgentClass(q: ResourceQuotaFacts): boolean {
  return (q.scopeSelector?.matchExpressions ?? []).some(
    (e) => e.scopeName === 'PriorityClass' && (e.operator === 'Exists' || (e.operator === 'In' && (e.values ?? []).includes(AGENT_PRIORITY_CLASS))),
  );
}

/**
 * GKE, from what its API server answers: a gitVersion such as
 * "v1.30.5-gke.1014001" (GKE's own build of Kubernetes). Not the only sign
 * looked for: a ResourceQuota for system-node-critical in kube-system (GKE
 * keeps "gcp-critical-pods" there) shows any cluster that limits the class.
 */
export const isGkeVersion = (gitVersion: string) => /-gke\.\d/.test(gitVersion);

/** A limit on system-node-critical outside kube-system, and the quota that lifts it in pinset's namespace. */
export function priorityClassCheck(f: Pick<ClusterFacts, 'version' | 'quotas' | 'namespace' | 'nodes'>): CheckOutcome {
  const check = 'priority class';
  const gke = isGkeVersion(f.version.gitVersion);
  const kubeSystem = f.quotas.kubeSystem;
  const systemQuota = isUnreadable(kubeSystem) ? undefined : kubeSystem.find(coversAgentClass);
  const todo = `install with the component ${QUOTA_COMPONENT} (a ResourceQuota for ${AGENT_PRIORITY_CLASS} pods in ${f.namespace}; docs/installing.md#gke-and-the-priority-class)`;
  if (!gke && !systemQuota) {
    if (isUnreadable(kubeSystem)) {
      return { check, result: 'note', message: `could not read the ResourceQuotas of kube-system (${kubeSystem.unreadable}), which would show a limit on the priority class ${AGENT_PRIORITY_CLASS} (GKE's)`, todo: `if pods of ${AGENT_PRIORITY_CLASS} need a ResourceQuota outside kube-system here, ${todo}` };
    }
    return { check, result: 'ok', message: `no sign of a limit on the agent's priority class ${AGENT_PRIORITY_CLASS} outside kube-system (not GKE, no ResourceQuota for it in kube-system)` };
  }
  const why = gke ? `GKE (${f.version.gitVersion})` : `ResourceQuota kube-system/${systemQuota!.name} is for ${AGENT_PRIORITY_CLASS} pods`;
  const ns = f.quotas.namespace;
  if (isUnreadable(ns)) return { check, result: 'note', message: `${why}: pods of ${AGENT_PRIORITY_CLASS} are admitted only in a namespace with a ResourceQuota for them; could not read those of ${f.namespace}: ${ns.unreadable}`, todo };
  const quota = ns.find(coversAgentClass);
  if (!quota) {
    return {
      check,
      result: 'fail',
      message: `${why}: pods of the priority class ${AGENT_PRIORITY_CLASS} (the agent's) are admitted only in a namespace with a ResourceQuota for that class, and ${f.namespace} has none: the DaemonSet would create no pod ("insufficient quota to match these scopes")`,
      todo,
    };
  }
  const pods = quantityOfPods(quota.hardPods);
  const agents = isUnreadable(f.nodes) ? undefined : agentNodes(f.nodes).length;
  if (quota.hardPods !== undefined && pods !== undefined && agents !== undefined && pods < agents) {
    return { check, result: 'fail', message: `${why}: ResourceQuota ${f.namespace}/${quota.name} admits ${pods} ${AGENT_PRIORITY_CLASS} pods, and there is an agent for each of ${plural(agents, 'Linux node')}`, todo: `raise its spec.hard.pods to at least ${agents} (${QUOTA_COMPONENT} sets 1G)` };
  }
  return { check, result: 'ok', message: `${why}: ResourceQuota ${f.namespace}/${quota.name} admits the agents' ${AGENT_PRIORITY_CLASS} pods` };
}

/** The nodes the agent's DaemonSet selects (kubernetes.io/os=linux). */
export function agentNodes(nodes: readonly NodeFacts[]): NodeFacts[] {
  return nodes.filter((n) => n.labels['kubernetes.io/os'] === 'linux');
}

/** The nodes the agent will run on, and those it will not. */
export function nodesCheck(f: Pick<ClusterFacts, 'nodes'>): CheckOutcome {
  const check = 'nodes';
  if (isUnreadable(f.nodes)) return { check, result: 'fail', message: `could not list the Nodes: ${f.nodes.unreadable}`, todo: 'run it with credentials that may list Nodes' };
  const agents = agentNodes(f.nodes);
  const unlabelled = f.nodes.filter((n) => n.operatingSystem === 'linux' && n.labels['kubernetes.io/os'] !== 'linux').map((n) => n.name);
  const others = f.nodes.filter((n) => n.operatingSystem !== 'linux' && n.labels['kubernetes.io/os'] !== 'linux');
  const otherText = others.length ? `; ${plural(others.length, 'node')} of another OS (${someNames(others.map((n) => `${n.name}: ${n.operatingSystem ?? n.labels['kubernetes.io/os'] ?? 'not reported'}`))}) get${others.length === 1 ? 's' : ''} none, as the DaemonSet selects kubernetes.io/os=linux` : '';
  if (unlabelled.length > 0) {
    return {
      check,
      result: 'fail',
      message: `${plural(unlabelled.length, 'Linux node')} lack${unlabelled.length === 1 ? 's' : ''} the label kubernetes.io/os=linux, which the agent's DaemonSet selects: no agent will run on ${someNames(unlabelled)}${otherText}`,
      todo: `label them (the kubelet sets it at registration): kubectl label node ${unlabelled[0]} kubernetes.io/os=linux`,
    };
  }
  if (agents.length === 0) return { check, result: 'fail', message: `no Linux node: no agent will run${otherText}`, todo: 'pinset pins on Linux nodes (CRI-O, containerd)' };
  return { check, result: 'ok', message: `an agent on each of ${plural(agents.length, 'Linux node')}${otherText}` };
}

/** "containerd://1.7.24" as [name, version]. */
function runtimeOf(v: string | undefined): [string, string] {
  const m = /^([^:]+):\/\/(.*)$/.exec(v ?? '');
  return m ? [m[1]!, m[2]!] : [v || 'not reported', ''];
}

/** What pins on each node, from the runtime its kubelet reports. */
export function runtimesCheck(f: Pick<ClusterFacts, 'nodes'>): CheckOutcome {
  const check = 'runtimes';
  if (isUnreadable(f.nodes)) return { check, result: 'note', message: `could not list the Nodes: ${f.nodes.unreadable}` };
  const groups = new Map<string, { nodes: string[]; pins: boolean; why?: string }>();
  for (const n of agentNodes(f.nodes)) {
    const [name, version] = runtimeOf(n.containerRuntimeVersion);
    const key = `${name} ${version}`.trim();
    let g = groups.get(key);
    if (!g) {
      if (name === 'cri-o') g = { nodes: [], pins: true };
      else if (name === 'containerd') {
        const can = containerdCanPin(version);
        g = can.ok ? { nodes: [], pins: true } : { nodes: [], pins: false, why: can.why };
      } else g = { nodes: [], pins: false, why: `pinset pins on CRI-O and containerd, not on ${name}` };
      groups.set(key, g);
    }
    g.nodes.push(n.name);
  }
  if (groups.size === 0) return { check, result: 'ok', message: 'no Linux node to run an agent on' };
  const parts = [...groups].sort((a, b) => b[1].nodes.length - a[1].nodes.length).map(([key, g]) => `${key}: ${plural(g.nodes.length, 'node')}${g.pins ? '' : ` (${someNames(g.nodes, 3)}), pre-load only`}`);
  const cannot = [...groups.values()].filter((g) => !g.pins);
  if (cannot.length === 0) return { check, result: 'ok', message: `every runtime pins: ${parts.join('; ')}` };
  return {
    check,
    result: 'note',
    message: `${parts.join('; ')}. Pre-load only: the images are pulled there, but nothing keeps the kubelet's image garbage collection from removing them (${[...new Set(cannot.map((g) => g.why))].join('; ')})`,
    todo: `for pins there, CRI-O, or containerd ${PINNING_VERSIONS}`,
  };
}

/** Whether the agent reports that the kubelet starts pinned images offline whatever the pods' credentials. */
function startsOffline(kv: KubeletVerificationStatus | undefined): boolean {
  return kv !== undefined && ['NeverVerify', 'NeverVerifyAllowlistedImages', 'Off'].includes(kv.policy) && !kv.refuses?.length;
}

/** What the kubelet's credential verification (KEP-2535) needs, per kubelet version. */
export function kubeletsCheck(f: Pick<ClusterFacts, 'nodes'>): CheckOutcome {
  const check = 'kubelets';
  if (isUnreadable(f.nodes)) return { check, result: 'note', message: `could not list the Nodes: ${f.nodes.unreadable}` };
  const before = [] as string[];
  const gateOff = [] as string[];
  const needs = [] as string[];
  const fine = [] as string[];
  for (const n of agentNodes(f.nodes)) {
    const gate = gateDefault(n.kubeletVersion);
    if (!gate.known) before.push(n.name);
    else if (!gate.on) gateOff.push(`${n.name} (${n.kubeletVersion})`);
    else if (startsOffline(n.kubeletVerification)) fine.push(n.name);
    else needs.push(n.name);
  }
  const parts: string[] = [];
  const todos: string[] = [];
  if (needs.length) {
    parts.push(`${plural(needs.length, 'node')} (${someNames(needs)}) run${needs.length === 1 ? 's' : ''} a kubelet of 1.35 or later, which verifies the pull credentials of images already on the node: pinned images start offline only with pinset's drop-in in the kubelet's --config-dir`);
    todos.push(`once their sets exist, \`pinset kubelet-allowlist --node ${needs[0]}\` (for each node) into the kubelet's --config-dir, then restart the kubelet (docs/kubelet-credential-verification.md)`);
  }
  if (gateOff.length) {
    parts.push(`${plural(gateOff.length, 'node')} (${someNames(gateOff)}) run${gateOff.length === 1 ? 's' : ''} a kubelet of 1.33 or 1.34, where ${GATE} is off by default: give them no drop-in (a kubelet with the gate off refuses it and does not start)`);
    todos.push(`for a 1.33 or 1.34 kubelet that runs with ${GATE} on: \`pinset kubelet-allowlist --node NAME --kubelet-gate-on\``);
  }
  if (fine.length) parts.push(`${plural(fine.length, 'node')} (${someNames(fine)}): the agent reports pinned images start offline`);
  if (before.length) parts.push(`${plural(before.length, 'node')} (${someNames(before)}) run${before.length === 1 ? 's' : ''} a kubelet before 1.33, which needs no drop-in`);
  if (parts.length === 0) return { check, result: 'ok', message: 'no Linux node' };
  return { check, result: todos.length ? 'note' : 'ok', message: parts.join('; '), ...(todos.length ? { todo: todos.join('; ') } : {}) };
}

/** Sets (from the API and the FILEs) that select no node the agent runs on. */
export function setsCheck(f: Pick<ClusterFacts, 'nodes' | 'apiSets' | 'fileSets' | 'fileProblems'>): CheckOutcome {
  const check = 'sets';
  const problems = [...f.fileProblems];
  const sets = [...(isUnreadable(f.apiSets) ? [] : (f.apiSets ?? [])), ...f.fileSets];
  const notes: string[] = [];
  if (isUnreadable(f.apiSets)) notes.push(`could not list the PinnedImageSets: ${f.apiSets.unreadable}`);
  if (isUnreadable(f.nodes)) return { check, result: problems.length ? 'fail' : 'note', message: [...problems, `could not list the Nodes: ${f.nodes.unreadable}`, ...notes].join('; ') };
  const agents = agentNodes(f.nodes);
  const selecting: string[] = [];
  let hintWorker = false;
  for (const s of sets) {
    const label = s.origin === 'api' ? `set ${s.name}` : `set ${s.name} (${s.origin})`;
    const errs = selectorErrors(s.selector);
    if (errs.length) {
      problems.push(`${label}: ${errs.join('; ')}`);
      continue;
    }
    const n = agents.filter((node) => selectorMatches(s.selector, node.labels)).length;
    if (n > 0) {
      selecting.push(`${s.name} (${plural(n, 'node')})`);
      continue;
    }
    const elsewhere = f.nodes.filter((node) => selectorMatches(s.selector, node.labels)).length;
    problems.push(`${label} selects no node an agent runs on${elsewhere ? ` (only ${plural(elsewhere, 'node')} of another OS)` : ''}: its images will be on no node`);
    if (JSON.stringify(s.selector ?? {}).includes('node-role.kubernetes.io/worker')) hintWorker = true;
  }
  if (problems.length) {
    return {
      check,
      result: 'fail',
      message: [...problems, ...notes].join('; '),
      todo: `compare each set's spec.nodeSelector with \`kubectl get nodes --show-labels\`${hintWorker ? '; kubeadm, EKS, GKE and AKS do not set node-role.kubernetes.io/worker: select with kubernetes.io/os: linux or a label of your own' : ''}`,
    };
  }
  const message = sets.length ? `every set selects a node: ${someNames(selecting, 8)}` : f.apiSets === null ? "pinset's CRD is not installed yet: no set to check" : 'no set to check';
  return { check, result: notes.length ? 'note' : 'ok', message: [message, ...notes].join('; ') };
}

/** Every check, in the order they are shown. */
export function preflightChecks(f: ClusterFacts): CheckOutcome[] {
  return [kubernetesCheck(f), openshiftCheck(f), priorityClassCheck(f), nodesCheck(f), runtimesCheck(f), kubeletsCheck(f), setsCheck(f)];
}
