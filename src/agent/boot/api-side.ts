// The agent's API side: where sets come from (the list+watches), where the
// node status goes (the Node's annotation, or the log when there is no
// API), Events, and the rollout slots. The Kubernetes client is large
// (about 80 MB resident): a node that runs on static sets alone never loads
// it.
//
// A kubeconfig that does not exist yet is the kubelet's before the node has
// joined (deploy/systemd): until it appears the agent applies static sets
// only; then it exits so that its service manager starts it again with the
// API.
//
// What the API sees change is told to whoever subscribed (the agent, which
// owns the reactions): it is built before the agent, and nothing is watched
// until the agent has subscribed and the watches start.
import { existsSync } from 'node:fs';
import type { Logger } from 'pino';
import { FirstWave } from '../../rollout/first-wave.ts';
import { RolloutGate } from '../../rollout/gate.ts';
import { UsageError } from '../../util/flags.ts';
import type { KubeObserver } from '../kube.ts';
import type { EventRecorder } from '../node-sinks.ts';
import { LogStatusSink, StatusReporter } from '../status-reporter.ts';
import type { ApiConfig } from './config.ts';

async function loadKubeModules() {
  const [{ loadAgentKubeConfig }, { KubeObserver }, { AGENT_FIELD_MANAGER, NodeAnnotationSink, NodeEventRecorder }, { clientNodeLeaseApi }, { LeaseRolloutSlots }, { LeaseWaveRecords }] = await Promise.all([
    import('../../api/kubeconfig.ts'),
    import('../kube.ts'),
    import('../node-sinks.ts'),
    import('../../rollout/lease-api.ts'),
    import('../../rollout/lease-slots.ts'),
    import('../../rollout/lease-records.ts'),
  ]);
  return { loadAgentKubeConfig, KubeObserver, AGENT_FIELD_MANAGER, NodeAnnotationSink, NodeEventRecorder, clientNodeLeaseApi, LeaseRolloutSlots, LeaseWaveRecords };
}

/** What the API side tells its subscribers (the agent implements it). */
export interface ApiListener {
  /** A set, this Node's labels or the sets' CRD changed: the desired state may have changed. */
  onDesiredStateChanged(why: string): void;
  /** A Secret in the agents' namespace was added, changed or deleted (by name): only what a pull may use changed. */
  onSecretChanged(name: string): void;
  /** A rollout slot this node held was lost. */
  onRolloutSlotLost(): void;
  /** Between two reconciles, a slot or first-wave seat was granted to this node or the first wave landed an image: admit again now. */
  onRolloutChanged(why: string): void;
}

export interface ApiSide {
  kube: KubeObserver | null;
  reporter: StatusReporter;
  events: EventRecorder | null;
  rolloutGate: RolloutGate | null;
  firstWave: FirstWave | null;
  /** The agent runs in a pod (in-cluster config). */
  inCluster: boolean;
  /** The --kubeconfig that does not exist yet: static sets only until it appears. */
  awaitedKubeconfig?: string;
  /** Tell `listener` what the API sees change from now on. */
  subscribe(listener: ApiListener): void;
  /** Free a rollout slot now, stop the watches, send the last status: each waited for at most 2 s. */
  close(): Promise<void>;
}

/** The subscribers of one API side. */
class ApiChanges implements ApiListener {
  readonly listeners: ApiListener[] = [];
  onDesiredStateChanged(why: string): void {
    for (const l of this.listeners) l.onDesiredStateChanged(why);
  }
  onSecretChanged(name: string): void {
    for (const l of this.listeners) l.onSecretChanged(name);
  }
  onRolloutSlotLost(): void {
    for (const l of this.listeners) l.onRolloutSlotLost();
  }
  onRolloutChanged(why: string): void {
    for (const l of this.listeners) l.onRolloutChanged(why);
  }
}

/** Waits for `p` at most `ms`; the timer does not hold the process open once `p` is done. */
async function within(p: Promise<unknown> | undefined, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([p, new Promise((r) => (timer = setTimeout(r, ms)))]);
  clearTimeout(timer);
}

function closer(parts: Pick<ApiSide, 'kube' | 'reporter' | 'rolloutGate' | 'firstWave'>): () => Promise<void> {
  return async () => {
    // Free any rollout slot and first-wave seat now rather than keep other nodes waiting for it to expire.
    await within(Promise.all([parts.rolloutGate?.close(), parts.firstWave?.close()]), 2_000);
    await parts.kube?.stop();
    // The last status goes out if the API answers within 2 s.
    await within(parts.reporter.flush(), 2_000);
    parts.reporter.close();
  };
}

export async function apiSide(cfg: ApiConfig, logger: Logger): Promise<ApiSide> {
  const { nodeName, progressIntervalMs, leaseNamespace } = cfg;
  const awaitedKubeconfig = cfg.kubeconfig && !existsSync(cfg.kubeconfig) ? cfg.kubeconfig : undefined;
  const kubeconfig = awaitedKubeconfig ? undefined : cfg.kubeconfig;
  const inCluster = !awaitedKubeconfig && cfg.runsInPod;
  const m = kubeconfig || inCluster ? await loadKubeModules() : null;
  let kc = null;
  try {
    kc = m?.loadAgentKubeConfig(kubeconfig) ?? null;
  } catch (e) {
    throw new UsageError(`cannot load kubeconfig: ${(e as Error).message}`);
  }
  const changes = new ApiChanges();
  const base = { inCluster, ...(awaitedKubeconfig ? { awaitedKubeconfig } : {}), subscribe: (l: ApiListener) => void changes.listeners.push(l) };
  if (!kc || !m) {
    const reporter = new StatusReporter(new LogStatusSink(logger), { logger, progressIntervalMs });
    return { ...base, kube: null, events: null, rolloutGate: null, firstWave: null, reporter, close: closer({ kube: null, reporter, rolloutGate: null, firstWave: null }) };
  }
  const kube = new m.KubeObserver(kc, nodeName, logger, (why) => changes.onDesiredStateChanged(why), {
    minWatchTimeoutMs: cfg.minWatchTimeoutMs,
    secretNamespace: leaseNamespace,
    onSecretChange: (name) => changes.onSecretChanged(name),
  });
  const leases = { api: m.clientNodeLeaseApi(kc), namespace: leaseNamespace, identity: nodeName, fieldManager: m.AGENT_FIELD_MANAGER };
  const slots = new m.LeaseRolloutSlots({ ...leases, leaseDurationMs: cfg.rolloutLeaseDurationMs });
  const reporter = new StatusReporter(new m.NodeAnnotationSink(kc, nodeName), { logger, progressIntervalMs });
  // With onChange a waiting node queues, and a slot or seat granted from the queue is taken and used at once (src/rollout/grants.ts).
  const onChange = (why: string) => changes.onRolloutChanged(why);
  const rolloutGate = new RolloutGate({ slots, logger, onLost: () => changes.onRolloutSlotLost(), onChange });
  const firstWave = new FirstWave({ slots, records: new m.LeaseWaveRecords(leases), logger, onChange });
  const events = new m.NodeEventRecorder(kc, nodeName, () => kube.currentNode()?.metadata?.uid, logger);
  return { ...base, kube, reporter, events, rolloutGate, firstWave, close: closer({ kube, reporter, rolloutGate, firstWave }) };
}
