// pinset's install on the node suite's bed (./real-node.ts), as an operator
// makes it: `kubectl apply --server-side -k` of a kustomization over deploy/
// (the one DaemonSet for every runtime), with kustomize components added (the
// credential provider one of deploy/credential-providers/) and the image
// replaced by the one built here. The kustomization also carries what
// differs on this bed, as one JSON patch per workload, and only that:
//  - the DaemonSet's hostPath volumes point at the same paths under the
//    bed's host root;
//  - the API server is on loopback, with no kube-proxy to answer for the
//    kubernetes Service's ClusterIP: KUBERNETES_SERVICE_HOST/PORT name it
//    (a container's own env wins over the kubelet's service variables);
//  - metrics and probes on a free port in place of 9402 and 9403 (the pods
//    share the host's network, where the usual port may be taken);
//  - no priority class when this machine's root lacks CAP_SYS_RESOURCE: the
//    kubelet gives a system-node-critical pod oom_score_adj -997, and runc
//    cannot lower a score without that capability ("failed to update
//    /proc/self/oom_score_adj: Permission denied"). A node's root has it;
//  - the controller's pods on the host's network, one replica, replaced
//    without a surge (a second pod would want the same port): no pod
//    network reaches an API server on loopback.
// Without kube-controller-manager and kube-scheduler, ImitatedDaemonSet makes
// the agent's pod as the daemonset controller would.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { mkdir, readdir, readFile, writeFile } from 'node:fs/promises';
import { join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseAllDocuments } from 'yaml';
import type { NodeImage } from './real-node-images.ts';
import type { KubeApi } from './real-node.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export const DEPLOY_DIR = resolve(fileURLToPath(new URL('../../deploy', import.meta.url)));
export const AGENT_NAMESPACE = 'pinset-system';
export const AGENT_SELECTOR = 'app.kubernetes.io/name=pinset-agent';
export const CONTROLLER_SELECTOR = 'app.kubernetes.io/name=pinset-controller';

export interface BedSpecifics {
  hostRoot: string;
  apiServerPort: number;
  agentMetricsPort: number;
  controllerMetricsPort: number;
  /** Whether this machine's root may lower an oom_score_adj (else no priority class). */
  lowerOomScore: boolean;
}

type Op = { op: 'add' | 'replace' | 'remove'; path: string; value?: unknown };

/** Ops moving a container's metrics and probes to `port`, and pointing it at the bed's API server. */
function containerOps(c: any, at: string, metricsEnv: string, port: number, apiServerPort: number): Op[] {
  const ops: Op[] = [];
  const env = (c.env ?? []) as Array<{ name: string; value?: string }>;
  const i = env.findIndex((e) => e.name === metricsEnv);
  if (i < 0) throw new Error(`${at}: no ${metricsEnv} in the container's env`);
  ops.push({ op: 'replace', path: `${at}/env/${i}/value`, value: `0.0.0.0:${port}` });
  ops.push({ op: 'add', path: `${at}/env/-`, value: { name: 'KUBERNETES_SERVICE_HOST', value: '127.0.0.1' } });
  ops.push({ op: 'add', path: `${at}/env/-`, value: { name: 'KUBERNETES_SERVICE_PORT', value: String(apiServerPort) } });
  (c.ports ?? []).forEach((_: unknown, k: number) => ops.push({ op: 'replace', path: `${at}/ports/${k}/containerPort`, value: port }));
  for (const probe of ['livenessProbe', 'readinessProbe', 'startupProbe']) if (c[probe]?.httpGet) ops.push({ op: 'replace', path: `${at}/${probe}/httpGet/port`, value: port });
  return ops;
}

/**
 * A kustomization in `dir` over deploy/ with the kustomize
 * `components` (folders) added, the image replaced by `image` (a digest
 * reference) and the bed's differences patched in. `render` runs `kubectl
 * kustomize`: the install is read as kubectl renders it, components
 * included, and the bed's patches (applied after the components) are made
 * from that.
 */
export async function writeDeployOverlay(dir: string, o: { components?: string[]; image: NodeImage; bed: BedSpecifics; render: (dir: string) => Promise<string> }): Promise<string> {
  await mkdir(dir, { recursive: true });
  const base = DEPLOY_DIR;
  const [name, digest] = o.image.ref.split('@');
  const install = {
    apiVersion: 'kustomize.config.k8s.io/v1beta1',
    kind: 'Kustomization',
    // kustomize takes bases and components by relative path only.
    resources: [relative(dir, base)],
    ...(o.components?.length ? { components: o.components.map((c) => relative(dir, c)) } : {}),
    images: [{ name: 'ghcr.io/pinset/pinset', newName: name, digest }],
  };
  await writeFile(join(dir, 'kustomization.yaml'), JSON.stringify(install, null, 2));
  const objects = parseAllDocuments(await o.render(dir)).map((d) => d.toJS() as any);
  const ds = objects.find((x) => x?.kind === 'DaemonSet' && x.metadata?.name === 'pinset-agent');
  const deploy = objects.find((x) => x?.kind === 'Deployment' && x.metadata?.name === 'pinset-controller');
  if (!ds || !deploy) throw new Error(`${base} renders no DaemonSet pinset-agent or no Deployment pinset-controller`);

  const dsOps: Op[] = [];
  (ds.spec.template.spec.volumes as any[]).forEach((v, i) => {
    if (v.hostPath) dsOps.push({ op: 'replace', path: `/spec/template/spec/volumes/${i}/hostPath/path`, value: join(o.bed.hostRoot, v.hostPath.path) });
  });
  if (!o.bed.lowerOomScore && ds.spec.template.spec.priorityClassName) dsOps.push({ op: 'remove', path: '/spec/template/spec/priorityClassName' });
  dsOps.push(...containerOps(ds.spec.template.spec.containers[0], '/spec/template/spec/containers/0', 'PINSET_METRICS_ADDR', o.bed.agentMetricsPort, o.bed.apiServerPort));

  const deployOps: Op[] = [
    { op: 'replace', path: '/spec/replicas', value: 1 },
    // On the host's network a surge pod would want the same port: replace in place.
    { op: 'add', path: '/spec/strategy', value: { type: 'RollingUpdate', rollingUpdate: { maxSurge: 0, maxUnavailable: 1 } } },
    { op: 'add', path: '/spec/template/spec/hostNetwork', value: true },
    ...containerOps(deploy.spec.template.spec.containers[0], '/spec/template/spec/containers/0', 'PINSET_CONTROLLER_METRICS_ADDR', o.bed.controllerMetricsPort, o.bed.apiServerPort),
  ];

  await writeFile(join(dir, 'bed-agent.json'), JSON.stringify(dsOps, null, 2));
  await writeFile(join(dir, 'bed-controller.json'), JSON.stringify(deployOps, null, 2));
  const kustomization = {
    ...install,
    patches: [
      { path: 'bed-agent.json', target: { kind: 'DaemonSet', name: 'pinset-agent' } },
      { path: 'bed-controller.json', target: { kind: 'Deployment', name: 'pinset-controller' } },
    ],
  };
  await writeFile(join(dir, 'kustomization.yaml'), JSON.stringify(kustomization, null, 2));
  return dir;
}

// ---------------------------------------------------------------------------
// The daemonset controller, imitated (no kube-controller-manager given).

/**
 * The DaemonSet's one pod on `nodeName`, made as the daemonset controller
 * would: its template, owned by the DaemonSet, bound to the node (the
 * scheduler's binding), with the tolerations the controller adds. A rolling
 * update with maxUnavailable and no surge replaces a pod of an older
 * generation: the old pod deleted (its grace period honoured), then the new
 * one created once the old one is gone.
 */
export class ImitatedDaemonSet {
  readonly #api: KubeApi;
  readonly #nodeName: string;

  constructor(api: KubeApi, nodeName: string) {
    this.#api = api;
    this.#nodeName = nodeName;
  }

  async sync(timeoutMs = 120_000): Promise<void> {
    const ds = await this.#api.get(`/apis/apps/v1/namespaces/${AGENT_NAMESPACE}/daemonsets/pinset-agent`);
    const generation = String(ds.metadata.generation);
    const pods = (await this.#api.get(`/api/v1/namespaces/${AGENT_NAMESPACE}/pods?labelSelector=${encodeURIComponent(AGENT_SELECTOR)}`)).items as any[];
    const current = pods.filter((p) => !p.metadata.deletionTimestamp && p.metadata.labels?.['pod-template-generation'] === generation);
    if (current.length > 0) return;
    for (const p of pods) if (!p.metadata.deletionTimestamp) await this.#api.delete(`/api/v1/namespaces/${AGENT_NAMESPACE}/pods/${p.metadata.name}`);
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const left = (await this.#api.get(`/api/v1/namespaces/${AGENT_NAMESPACE}/pods?labelSelector=${encodeURIComponent(AGENT_SELECTOR)}`)).items as any[];
      if (left.length === 0) break;
      if (Date.now() > deadline) throw new Error(`the old agent pod ${left[0].metadata.name} is still there ${timeoutMs / 1000} s after its deletion`);
      await sleep(100);
    }
    await this.#api.create(`/api/v1/namespaces/${AGENT_NAMESPACE}/pods`, podFromDaemonSet(ds, this.#nodeName));
  }
}

export function podFromDaemonSet(ds: any, nodeName: string): any {
  const template = structuredClone(ds.spec.template);
  const spec = template.spec;
  spec.nodeName = nodeName;
  // What the daemonset controller adds to every pod it makes (pkg/controller/daemon/util AddOrUpdateDaemonPodTolerations).
  const auto = [
    { key: 'node.kubernetes.io/not-ready', operator: 'Exists', effect: 'NoExecute' },
    { key: 'node.kubernetes.io/unreachable', operator: 'Exists', effect: 'NoExecute' },
    { key: 'node.kubernetes.io/disk-pressure', operator: 'Exists', effect: 'NoSchedule' },
    { key: 'node.kubernetes.io/memory-pressure', operator: 'Exists', effect: 'NoSchedule' },
    { key: 'node.kubernetes.io/pid-pressure', operator: 'Exists', effect: 'NoSchedule' },
    { key: 'node.kubernetes.io/unschedulable', operator: 'Exists', effect: 'NoSchedule' },
    ...(spec.hostNetwork ? [{ key: 'node.kubernetes.io/network-unavailable', operator: 'Exists', effect: 'NoSchedule' }] : []),
  ];
  spec.tolerations = [...(spec.tolerations ?? []), ...auto];
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: {
      generateName: `${ds.metadata.name}-`,
      namespace: ds.metadata.namespace,
      labels: { ...(template.metadata?.labels ?? {}), 'pod-template-generation': String(ds.metadata.generation) },
      annotations: template.metadata?.annotations ?? {},
      ownerReferences: [{ apiVersion: 'apps/v1', kind: 'DaemonSet', name: ds.metadata.name, uid: ds.metadata.uid, controller: true, blockOwnerDeletion: true }],
    },
    spec,
  };
}

// ---------------------------------------------------------------------------
// What the agent's pods say, and their processes.

export interface AgentLogLine {
  /** pino's time (RFC 3339, the image's logger sets it so). */
  time: string;
  msg: string;
  [k: string]: unknown;
}

/** The JSON lines of a pod's container logs in the kubelet's podLogsDir (`<ns>_<name>_<uid>/<container>/<n>.log`, CRI format). */
export function readPodLogDir(dir: string): { files: string[]; lines: AgentLogLine[] } {
  const files: string[] = [];
  const lines: AgentLogLine[] = [];
  if (!existsSync(dir)) return { files, lines };
  for (const c of readdirSync(dir)) {
    for (const f of readdirSync(join(dir, c)).sort()) {
      files.push(`${c}/${f}`);
      let text = '';
      try {
        text = readFileSync(join(dir, c, f), 'utf8');
      } catch {
        continue; // rotated or removed meanwhile
      }
      for (const l of text.split('\n')) {
        // <RFC 3339 time> <stream> <P|F> <content>
        const content = /^\S+ (?:stdout|stderr) [PF] (.*)$/.exec(l)?.[1];
        if (!content?.startsWith('{')) continue;
        try {
          lines.push(JSON.parse(content) as AgentLogLine);
        } catch {
          // a partial line
        }
      }
    }
  }
  return { files, lines };
}

/** The log folder of a pod (by namespace, name and uid) under the kubelet's podLogsDir. */
export function podLogDir(podLogsDir: string, pod: { metadata: { namespace: string; name: string; uid: string } }): string {
  return join(podLogsDir, `${pod.metadata.namespace}_${pod.metadata.name}_${pod.metadata.uid}`);
}

/** The last lines of a pod's container logs, for failure messages. */
export function podLogTail(podLogsDir: string, namespace: string, name: string, lines = 30): string {
  try {
    const out: string[] = [];
    for (const d of readdirSync(podLogsDir).filter((x) => x.startsWith(`${namespace}_${name}_`))) {
      for (const c of readdirSync(join(podLogsDir, d))) {
        for (const f of readdirSync(join(podLogsDir, d, c))) out.push(`--- ${c}/${f}`, ...readFileSync(join(podLogsDir, d, c, f), 'utf8').trimEnd().split('\n').slice(-lines));
      }
    }
    return out.join('\n');
  } catch (err) {
    return `(no logs: ${(err as Error).message})`;
  }
}

/**
 * The first process of a container (its PID 1 seen from the host): of the
 * processes whose cgroup path names the container's ID (runc names the
 * cgroup after it on both runtimes), the one whose parent is not among them.
 */
export async function containerInitPid(containerId: string): Promise<number> {
  // containerd: .../k8s.io/<id>; CRI-O: .../crio-<id> (its conmon sits in crio-conmon-<id>, not the container's).
  const own = new RegExp(`[:/](crio-)?${containerId}(\\.scope)?$`, 'm');
  const members = new Map<number, number>();
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (!own.test(await readFile(`/proc/${entry}/cgroup`, 'utf8'))) continue;
      const ppid = Number(/^PPid:\s*(\d+)$/m.exec(await readFile(`/proc/${entry}/status`, 'utf8'))?.[1]);
      members.set(Number(entry), ppid);
    } catch {
      // gone meanwhile
    }
  }
  const first = [...members].filter(([, ppid]) => !members.has(ppid)).map(([pid]) => pid);
  if (first.length !== 1) throw new Error(`container ${containerId}: ${members.size} processes, ${first.length} without a parent among them (${first.join(', ')})`);
  return first[0]!;
}
