// `pinset controller`: one active replica (leader election on a Lease) rolls
// what the agents report on their Nodes up into each PinnedImageSet's status
// and hands rollout slots over to the nodes queued for them
// (src/rollout/granter.ts).
import { hostname } from 'node:os';
import type { KubeConfig } from '@kubernetes/client-node';
import { loadClientKubeConfig } from '../api/kubeconfig.ts';
import { minWatchTimeoutFlag, minWatchTimeoutMs } from '../api/list-watch.ts';
import { helpText, parseFlags, UsageError, type FlagSpec } from '../util/flags.ts';
import { createLogger } from '../util/log.ts';
import { KubeHttp } from '../api/kube-http.ts';
import type { PinnedImageSet } from '../api/types.ts';
import { RolloutGranter, type GrantedSet } from '../rollout/granter.ts';
import { setLabelValue } from '../rollout/slots.ts';
import { CONTROLLER_FIELD_MANAGER, SetStatusController } from './controller.ts';
import { LeaderElector, leaderElectionConfigErrors } from './leader.ts';
import { parseListenAddress, startHealthServer } from '../metrics/server.ts';
import { ControllerMetrics } from './metrics.ts';

export const CONTROLLER_FLAGS: readonly FlagSpec[] = [
  { name: 'kubeconfig', env: 'KUBECONFIG', type: 'string', help: 'kubeconfig file; in-cluster configuration when unset' },
  { name: 'leader-elect', env: 'PINSET_LEADER_ELECT', type: 'bool', default: true, help: 'elect one active replica through a Lease' },
  { name: 'lease-namespace', env: 'POD_NAMESPACE', type: 'string', default: 'pinset-system', help: 'namespace of the leader election Lease, and of the agents\' rollout Leases' },
  { name: 'lease-name', env: 'PINSET_LEASE_NAME', type: 'string', default: 'pinset-controller', help: 'name of the leader election Lease' },
  // No default in the table: it is the host name where the controller runs, not where --help or the reference is made.
  { name: 'identity', env: 'POD_NAME', type: 'string', help: 'this replica\'s name in the Lease (unset: this host\'s name)' },
  { name: 'lease-duration', env: 'PINSET_LEASE_DURATION', type: 'duration', default: '15s', help: 'how long a Lease holds without renewal before others may take it' },
  { name: 'renew-deadline', env: 'PINSET_RENEW_DEADLINE', type: 'duration', default: '10s', help: 'the leader steps down when it cannot renew for this long' },
  { name: 'retry-period', env: 'PINSET_RETRY_PERIOD', type: 'duration', default: '2s', help: 'interval between attempts to acquire or renew' },
  {
    name: 'metrics-addr',
    env: 'PINSET_CONTROLLER_METRICS_ADDR',
    type: 'string',
    default: '0.0.0.0:9403',
    allowEmpty: true,
    help: 'listen address for /healthz, /readyz and /metrics; "" disables',
  },
  minWatchTimeoutFlag(),
  { name: 'debounce', env: 'PINSET_CONTROLLER_DEBOUNCE', type: 'duration', default: '500ms', help: 'changes within this window are rolled up together' },
  {
    name: 'rollout-grants',
    env: 'PINSET_ROLLOUT_GRANTS',
    type: 'bool',
    default: true,
    help: 'hand a freed rollout slot or first-wave seat to the node queued longest, at once; off, nodes find free slots by polling',
  },
  { name: 'progress-window', env: 'PINSET_CONTROLLER_PROGRESS_WINDOW', type: 'duration', default: '10m', help: 'a set\'s download rate, and its ETA from it (status.progress), is measured over the recent half of its download, within this much of the recent past and over at least half of it (at least twice the agents\' longest progress pace, 5m)' },
  { name: 'progress-interval', env: 'PINSET_CONTROLLER_PROGRESS_INTERVAL', type: 'duration', default: '30s', help: 'a change of a set\'s progress alone is written to its status at most this often; other changes at once' },
  { name: 'log-level', env: 'PINSET_LOG_LEVEL', type: 'string', default: 'info', choices: ['debug', 'info', 'warn', 'error'], help: 'log level' },
];

/** Whole shutdown (stop leading, release the Lease, stop watches) within this. */
const SHUTDOWN_BUDGET_MS = 5000;

/** The command's flags, for its --help and the reference (docs/reference.md; a test holds the two together). */
export const flags = CONTROLLER_FLAGS;

export async function run(argv: string[]): Promise<number> {
  const { values } = parseFlags(CONTROLLER_FLAGS, argv);
  if (values.help) {
    process.stdout.write(helpText('pinset controller [flags]', 'Roll per-node results up into each PinnedImageSet\'s status.', CONTROLLER_FLAGS));
    return 0;
  }
  const leaseDurationMs = values['lease-duration'] as number;
  const renewDeadlineMs = values['renew-deadline'] as number;
  const retryPeriodMs = values['retry-period'] as number;
  const leaderElect = values['leader-elect'] as boolean;
  if (leaderElect) {
    const errs = leaderElectionConfigErrors({ leaseDurationMs, renewDeadlineMs, retryPeriodMs });
    if (errs.length > 0) throw new UsageError(errs.join('; '));
  }
  const metricsAddr = values['metrics-addr'] as string;
  if (metricsAddr) {
    try {
      parseListenAddress(metricsAddr);
    } catch (err) {
      throw new UsageError(`--metrics-addr: ${(err as Error).message}`);
    }
  }
  const minWatchTimeout = minWatchTimeoutMs(values);
  if (!((values['progress-window'] as number) > 0)) throw new UsageError('--progress-window must be longer than 0');
  const identity = (values.identity as string | undefined) ?? hostname();
  if (!identity) throw new UsageError('--identity (or POD_NAME) must not be empty');

  const log = createLogger({ level: values['log-level'] as string, name: 'pinset-controller' });
  let kc: KubeConfig;
  try {
    kc = loadClientKubeConfig(values.kubeconfig as string | undefined);
  } catch (err) {
    process.stderr.write(`pinset controller: ${(err as Error).message}\n`);
    return 2;
  }

  const metrics = new ControllerMetrics({ defaultMetrics: true });
  let granter: RolloutGranter | undefined;
  const controller = new SetStatusController({
    kubeConfig: kc,
    log,
    metrics,
    debounceMs: values.debounce as number,
    progressWindowMs: values['progress-window'] as number,
    progressIntervalMs: values['progress-interval'] as number,
    minWatchTimeoutMs: minWatchTimeout,
    onSetChange: () => granter?.kick(),
  });
  if (values['rollout-grants']) granter = rolloutGranter(kc, values['lease-namespace'] as string, identity, controller, log, minWatchTimeout);
  let server: Awaited<ReturnType<typeof startHealthServer>> | undefined;
  if (metricsAddr) {
    try {
      server = await startHealthServer(metricsAddr, metrics.registry, {
        live: () => null,
        ready: () => (controller.synced() ? null : 'caches not filled yet'),
      });
      log.info({ addr: server.url.replace(/^http:\/\//, '') }, 'serving /healthz, /readyz and /metrics');
    } catch (err) {
      log.error({ addr: metricsAddr, err: (err as Error).message }, 'cannot listen for metrics');
      return 1;
    }
  }

  controller.start();
  granter?.start();
  const lead = (leading: boolean) => {
    controller.setLeading(leading);
    granter?.setLeading(leading);
  };
  let elector: LeaderElector | undefined;
  if (leaderElect) {
    elector = new LeaderElector({
      kubeConfig: kc,
      namespace: values['lease-namespace'] as string,
      name: values['lease-name'] as string,
      identity,
      leaseDurationMs,
      renewDeadlineMs,
      retryPeriodMs,
      log,
      onStartedLeading: () => lead(true),
      onStoppedLeading: () => lead(false),
    });
    elector.start();
  } else {
    lead(true);
  }
  log.info({ identity, leaderElect, server: kc.getCurrentCluster()?.server }, 'controller started');

  const signal = await new Promise<NodeJS.Signals>((resolve) => {
    const on = (s: NodeJS.Signals) => {
      process.off('SIGTERM', on);
      process.off('SIGINT', on);
      resolve(s);
    };
    process.on('SIGTERM', on);
    process.on('SIGINT', on);
  });
  log.info({ signal }, 'shutting down');

  const shutdown = (async () => {
    // Stop writing before giving up the Lease, so the next leader never races our last write.
    lead(false);
    await elector?.stop({ release: true });
    await Promise.all([controller.stop(), granter?.stop()]);
    await server?.close();
  })();
  let timer: NodeJS.Timeout | undefined;
  const finished = await Promise.race([
    shutdown.then(() => true),
    new Promise<boolean>((resolve) => {
      timer = setTimeout(() => resolve(false), SHUTDOWN_BUDGET_MS);
    }),
  ]);
  clearTimeout(timer);
  if (!finished) log.warn({ budgetMs: SHUTDOWN_BUDGET_MS }, 'shutdown did not finish in time; exiting anyway');
  log.info('stopped');
  return 0;
}

/**
 * The granter of rollout slots and first-wave seats, on the agents' Leases
 * in `namespace`; the sets' limits come from the controller's cache of sets.
 */
function rolloutGranter(kc: KubeConfig, namespace: string, identity: string, controller: SetStatusController, log: ReturnType<typeof createLogger>, minWatchTimeoutMs: number): RolloutGranter {
  let byLabel: Map<string, GrantedSet> | undefined;
  let seen: readonly PinnedImageSet[] | undefined;
  const setOf = (label: string) => {
    const sets = controller.sets();
    if (!byLabel || sets.length !== seen?.length || sets.some((s, i) => s !== seen![i])) {
      seen = sets;
      byLabel = new Map(
        sets.map((s) => {
          const r = s.spec?.rollout;
          const limits = { ...(r?.maxConcurrentNodes ? { rollout: r.maxConcurrentNodes } : {}), ...(r?.firstWave?.nodes ? { 'first-wave': r.firstWave.nodes } : {}) };
          return [setLabelValue(s.metadata.name), { name: s.metadata.name, ...(s.metadata.uid ? { uid: s.metadata.uid } : {}), limits }];
        }),
      );
    }
    return byLabel.get(label);
  };
  return new RolloutGranter({
    http: new KubeHttp(kc, { userAgent: CONTROLLER_FIELD_MANAGER }),
    namespace,
    log,
    setOf,
    fieldManager: CONTROLLER_FIELD_MANAGER,
    identity,
    // A controller that may not watch the agents' Leases (RBAC of an older install) tries again every few minutes, not every 30 s.
    watch: { minWatchTimeoutMs, backoff: { baseMs: 1_000, capMs: 5 * 60_000 } },
  });
}
