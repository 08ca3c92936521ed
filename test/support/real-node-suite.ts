// What the node suite's files (test/node/*.node.ts) do on a real node
// (./real-node.ts) and share: waiting on the kubelet's clock, pods and their
// states, pinset's install applied as an operator applies it
// (./real-node-deploy.ts) and its agent's pod, and what went on, for a
// failure message.
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { readNodeStatus } from '../../src/api/node-status.ts';
import { PROVIDER_COMPONENT, secretsIn, type NodeCredentials } from './real-node-credentials.ts';
import { AGENT_NAMESPACE, AGENT_SELECTOR, ImitatedDaemonSet, podLogTail, writeDeployOverlay, type BedSpecifics } from './real-node-deploy.ts';
import type { NodeImage } from './real-node-images.ts';
import { canLowerOomScore } from './real-node-runtime.ts';
import { freePort } from './registry.ts';
import { ensureNamespaceBasics, type RealNode } from './real-node.ts';

/** The PinnedImageSets of every namespace. */
export const SETS_API = '/apis/pinset.dev/v1alpha1/pinnedimagesets';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Polls `check` every 200 ms until it gives a value; past `timeoutMs`, fails with `what` and the context. */
export async function until<T>(what: string, timeoutMs: number, check: () => Promise<T | undefined | false | null>, context: () => Promise<string> | string = () => ''): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await check();
    if (v !== undefined && v !== false && v !== null) return v;
    if (Date.now() > deadline) throw new Error(`${what}: not within ${Math.round(timeoutMs / 1000)} s\n${await context()}`);
    await sleep(200);
  }
}

/** Seconds, to a tenth. */
export const sec = (ms: number) => Math.round(ms / 100) / 10;

export interface PodOptions {
  namespace?: string;
  pullSecrets?: string[];
  imagePullPolicy?: 'IfNotPresent' | 'Always' | 'Never';
}

/** A pod of one container of `image` on the node, on the host's network (no pod network reaches anything here, and none is needed). */
export function workloadPod(nodeName: string, name: string, image: string, o: PodOptions = {}) {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name, namespace: o.namespace ?? 'default', labels: { 'app.kubernetes.io/name': name } },
    spec: {
      nodeName,
      hostNetwork: true,
      automountServiceAccountToken: false,
      terminationGracePeriodSeconds: 1,
      ...(o.pullSecrets?.length ? { imagePullSecrets: o.pullSecrets.map((s) => ({ name: s })) } : {}),
      containers: [{ name: 'main', image, imagePullPolicy: o.imagePullPolicy ?? 'IfNotPresent' }],
    },
  };
}

/** A real node with pinset's install on it: the bed, and what the suite's files ask of it. */
export class SuiteNode {
  readonly node: RealNode;
  readonly bed: BedSpecifics;
  /** The daemonset controller's work, when no kube-controller-manager runs. */
  readonly imitated: ImitatedDaemonSet | undefined;

  private constructor(node: RealNode, bed: BedSpecifics) {
    this.node = node;
    this.bed = bed;
    this.imitated = node.controllers ? undefined : new ImitatedDaemonSet(node.api, node.nodeName);
  }

  static async on(node: RealNode): Promise<SuiteNode> {
    return new SuiteNode(node, { hostRoot: node.hostRoot, apiServerPort: node.apiServerPort, agentMetricsPort: await freePort(), controllerMetricsPort: await freePort(), lowerOomScore: canLowerOomScore() });
  }

  get podLogsDir(): string {
    return this.node.hostPath('var/log/pods');
  }

  /**
   * Where the bed's credentials (and `more`: a file's own) appear in what
   * pinset writes or the API holds: every container log under the kubelet's
   * podLogsDir, the Node, the Events and the PinnedImageSets. Empty: none.
   */
  async credentialFindings(more: NodeCredentials['secrets'] = []): Promise<{ findings: string[]; logFiles: number }> {
    const secrets = [...this.node.credentials.secrets, ...more];
    const findings: string[] = [];
    const look = (where: string, text: string) => findings.push(...secretsIn(text, secrets).map((what) => `${what} in ${where}`));
    const logs = readdirSync(this.podLogsDir, { recursive: true, encoding: 'utf8' }).filter((f) => f.endsWith('.log'));
    for (const f of logs) {
      try {
        look(`var/log/pods/${f}`, readFileSync(join(this.podLogsDir, f), 'utf8'));
      } catch {
        // rotated or removed meanwhile
      }
    }
    look('the Node', JSON.stringify(await this.node.api.get(`/api/v1/nodes/${this.node.nodeName}`)));
    look('the Events', JSON.stringify(await this.node.api.get('/api/v1/events')));
    look('the PinnedImageSets', JSON.stringify(await this.node.api.get(SETS_API)));
    return { findings, logFiles: logs.length };
  }

  async nodeStatus() {
    const obj = await this.node.api.get(`/api/v1/nodes/${this.node.nodeName}`);
    return readNodeStatus(obj.metadata.annotations ?? {});
  }

  async listPods(ns: string, selector: string): Promise<any[]> {
    return (await this.node.api.get(`/api/v1/namespaces/${ns}/pods?labelSelector=${encodeURIComponent(selector)}`)).items;
  }

  async podState(namespace: string, name: string) {
    const pod = await this.node.api.get(`/api/v1/namespaces/${namespace}/pods/${name}`);
    const cs = pod.status?.containerStatuses?.[0];
    return { phase: pod.status?.phase as string, waiting: cs?.state?.waiting?.reason as string | undefined, waitingMessage: cs?.state?.waiting?.message as string | undefined, running: Boolean(cs?.state?.running), ready: Boolean(cs?.ready), pod };
  }

  /** The agent's one live pod, Running and Ready, running `image`. */
  async readyAgentPod(image: NodeImage): Promise<any | undefined> {
    const pods = (await this.listPods(AGENT_NAMESPACE, AGENT_SELECTOR)).filter((p) => !p.metadata.deletionTimestamp);
    const p = pods.find((x) => x.spec.containers[0].image === image.ref);
    const cs = p?.status?.containerStatuses?.[0];
    return cs?.ready && cs.state?.running ? p : undefined;
  }

  /** Applies the install with the agent's image `image` (an upgrade when it changes), as an operator would, with the credential provider component and `components` (folders); the number of objects applied. */
  async applyDeploy(image: NodeImage, components: string[] = []): Promise<number> {
    const overlay = await writeDeployOverlay(join(this.node.state, 'overlay'), { components: [PROVIDER_COMPONENT, ...components], image, bed: this.bed, render: (d) => this.node.kubectl(['kustomize', d]) });
    const applied = await this.node.kubectl(['apply', '--server-side', '--field-manager=pinset-node-suite', '-k', overlay]);
    return applied.trim().split('\n').length;
  }

  /** Applies the install and waits for the agent's pod Running and Ready (making it as the daemonset controller would, without one). */
  async deployAgent(image: NodeImage, components: string[] = []): Promise<any> {
    await this.applyDeploy(image, components);
    if (this.imitated) {
      // What kube-controller-manager would publish in the namespace.
      await ensureNamespaceBasics(this.node.api, AGENT_NAMESPACE, this.node.pki);
      await this.imitated.sync();
    }
    return until('the agent pod Running and Ready', 180_000, () => this.readyAgentPod(image), () => this.context());
  }

  /** What went on, for a failure message: the agent's pods, their logs, the kubelet's, the runtime's and the controllers' last lines. */
  async context(): Promise<string> {
    const n = this.node;
    const out: string[] = [];
    for (const pod of await this.listPods(AGENT_NAMESPACE, AGENT_SELECTOR).catch(() => [])) {
      out.push(`agent pod ${pod.metadata.name}: ${JSON.stringify(pod.status?.containerStatuses ?? pod.status ?? null)}`);
      out.push(`agent log:\n${podLogTail(this.podLogsDir, AGENT_NAMESPACE, pod.metadata.name, 15)}`);
    }
    out.push(`node annotation: ${JSON.stringify((await this.nodeStatus().catch(() => null))?.status ?? null)}`);
    out.push(`kubelet:\n${n.kubelet.logTail(15)}`, `${n.runtime.name}:\n${n.runtime.logTail(10)}`);
    if (n.controllers) out.push(`kube-controller-manager:\n${n.controllers.controllerManager.logTail(8)}`, `kube-scheduler:\n${n.controllers.scheduler.logTail(5)}`);
    return out.join('\n');
  }
}
