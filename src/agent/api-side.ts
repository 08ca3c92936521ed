// The agent's API side, built from its flags: where sets come from (the
// list+watches), where the node status goes (the Node's annotation, or the
// log when there is no API), Events, and the rollout slots. The Kubernetes
// client is large (about 80 MB resident): a node that runs on static sets
// alone never loads it.
//
// A kubeconfig that does not exist yet is the kubelet's before the node has
// joined (deploy/systemd): until it appears the agent applies static sets
// only; then it exits so that its service manager starts it again with the
// API.
import { existsSync } from 'node:fs';
import type { Logger } from 'pino';
import { minWatchTimeoutMs } from '../api/list-watch.ts';
import { RolloutGate } from '../rollout/gate.ts';
import { UsageError, type FlagValues } from '../util/flags.ts';
import type { KubeObserver } from './kube.ts';
import type { EventRecorder } from './node-sinks.ts';
import { LogStatusSink, StatusReporter } from './status-reporter.ts';

async function loadKubeModules() {
  const [{ loadAgentKubeConfig }, { KubeObserver }, { AGENT_FIELD_MANAGER, NodeAnnotationSink, NodeEventRecorder }, { clientNodeLeaseApi }, { LeaseRolloutSlots }] = await Promise.all([
    import('../api/kubeconfig.ts'),
    import('./kube.ts'),
    import('./node-sinks.ts'),
    import('../rollout/lease-api.ts'),
    import('../rollout/lease-slots.ts'),
  ]);
  return { loadAgentKubeConfig, KubeObserver, AGENT_FIELD_MANAGER, NodeAnnotationSink, NodeEventRecorder, clientNodeLeaseApi, LeaseRolloutSlots };
}

export interface ApiSide {
  kube: KubeObserver | null;
  reporter: StatusReporter;
  events: EventRecorder | null;
  rolloutGate: RolloutGate | null;
  /** The agent runs in a pod (in-cluster config). */
  inCluster: boolean;
  /** The --kubeconfig that does not exist yet: static sets only until it appears. */
  awaitedKubeconfig?: string;
}

/** What the API side calls back into: the agent, once it exists. */
export interface ApiSideHooks {
  trigger(why: string, cancel?: boolean): void;
  /** A pull secret changed: the images of the sets naming it are tried again now. */
  secretChanged(name: string): void;
}

export async function apiSide(f: FlagValues, logger: Logger, hooks: ApiSideHooks): Promise<ApiSide> {
  const nodeName = String(f['node-name']);
  const progressIntervalMs = Number(f['status-progress-interval']);
  const configured = f.kubeconfig as string | undefined;
  const awaitedKubeconfig = configured && !existsSync(configured) ? configured : undefined;
  const kubeconfig = awaitedKubeconfig ? undefined : configured;
  const inCluster = !awaitedKubeconfig && Boolean(process.env.KUBERNETES_SERVICE_HOST && process.env.KUBERNETES_SERVICE_PORT);
  const m = kubeconfig || inCluster ? await loadKubeModules() : null;
  let kc = null;
  try {
    kc = m?.loadAgentKubeConfig(kubeconfig) ?? null;
  } catch (e) {
    throw new UsageError(`cannot load kubeconfig: ${(e as Error).message}`);
  }
  const base = { inCluster, ...(awaitedKubeconfig ? { awaitedKubeconfig } : {}) };
  if (!kc || !m) return { ...base, kube: null, events: null, rolloutGate: null, reporter: new StatusReporter(new LogStatusSink(logger), { logger, progressIntervalMs }) };
  const leaseNamespace = String(f['lease-namespace']);
  const kube = new m.KubeObserver(kc, nodeName, logger, (why) => hooks.trigger(why, true), {
    minWatchTimeoutMs: minWatchTimeoutMs(f),
    secretNamespace: leaseNamespace,
    onSecretChange: (name) => hooks.secretChanged(name),
  });
  const slots = new m.LeaseRolloutSlots({ api: m.clientNodeLeaseApi(kc), namespace: leaseNamespace, identity: nodeName, fieldManager: m.AGENT_FIELD_MANAGER, leaseDurationMs: Number(f['rollout-lease-duration']) });
  return {
    ...base,
    kube,
    reporter: new StatusReporter(new m.NodeAnnotationSink(kc, nodeName), { logger, progressIntervalMs }),
    events: new m.NodeEventRecorder(kc, nodeName, () => kube.currentNode()?.metadata?.uid, logger),
    rolloutGate: new RolloutGate({ slots, logger, onLost: () => hooks.trigger('rollout slot lost') }),
  };
}
