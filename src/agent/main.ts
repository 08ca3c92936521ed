// `pinset agent`: flags, wiring of the real implementations, and the two
// ways to run: until SIGTERM (the DaemonSet, the systemd unit) or --once.
import { existsSync } from 'node:fs';
import { hostname } from 'node:os';
import * as path from 'node:path';
import { parseLabelList } from '../api/selector.ts';
import type { NodeSetStatus } from '../api/types.ts';
import { helpText, parseFlags, type FlagSpec, UsageError } from '../util/flags.ts';
import { CriImageRuntime, unixSocketPath } from '../cri/client.ts';
import { PinFile, WRITE_STEPS, type PinFileHooks, type WriteStep } from '../crio/pinfile.ts';
import { createReloader } from '../crio/reload.ts';
import type { ReloadMode } from '../crio/reloader.ts';
import type { AgentMetrics } from '../metrics/agent-metrics.ts';
import { parseListenAddress } from '../metrics/server.ts';
import { AuthFile } from '../registry/auth.ts';
import { createLogger } from '../util/log.ts';
import { Agent } from './agent.ts';
import { PIN_BACKEND_FLAGS, type PinBackendFlag } from './pin-choice.ts';
import type { KubeObserver } from './kube.ts';
import type { EventRecorder } from './node-sinks.ts';
import { DiskCheck } from './disk.ts';
import { DEFAULT_DISK_ESTIMATE_FACTOR, lazyRegistrySizeEstimator } from './estimate.ts';
import { describeHolder, NodeLock } from './node-lock.ts';
import { pinWiring } from './pin-wiring.ts';
import { ImagePuller } from './puller.ts';
import { RolloutGate } from '../rollout/gate.ts';
import { DEFAULT_SLOT_NAMESPACE } from '../rollout/slots.ts';
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

/**
 * Default pull parallelism. Measured on containerd with a loopback
 * registry (BENCHMARKS.md): 4 parallel pulls reach nearly all of the
 * throughput of 8 while keeping the runtime's and the registry's load low;
 * the kubelet itself pulls serially by default.
 */
export const DEFAULT_MAX_PARALLEL_PULLS = 4;

export const AGENT_FLAGS: readonly FlagSpec[] = [
  { name: 'node-name', env: 'NODE_NAME', type: 'string', required: true, help: 'name of this node (the DaemonSet sets it from spec.nodeName)' },
  {
    name: 'kubeconfig',
    env: 'KUBECONFIG',
    type: 'string',
    help: 'kubeconfig file (on a host: the kubelet\'s, e.g. /var/lib/kubelet/kubeconfig; until it exists only static sets apply, then the agent exits with 75 to be restarted); in a pod the in-cluster config is used; with neither, only static sets apply',
  },
  { name: 'static-dir', env: 'PINSET_STATIC_DIR', type: 'string', default: '/etc/pinset/sets.d', help: 'folder of YAML files of PinnedImageSet documents (missing = none)' },
  { name: 'node-labels', env: 'PINSET_NODE_LABELS', type: 'string', help: 'k=v,... labels for selector matching when the Node cannot be read' },
  { name: 'cri-endpoint', env: 'PINSET_CRI_ENDPOINT', type: 'string', default: 'unix:///var/run/crio/crio.sock', help: 'CRI socket of the container runtime' },
  {
    name: 'pin-backend',
    env: 'PINSET_PIN_BACKEND',
    type: 'string',
    default: 'auto',
    choices: [...PIN_BACKEND_FLAGS],
    help: 'how images are pinned: auto (from the runtime CRI Version names: CRI-O drop-in, containerd image labels, else pre-load only), crio, containerd, or none (pre-load only)',
  },
  { name: 'state-dir', env: 'PINSET_STATE_DIR', type: 'string', default: '/var/lib/pinset', help: 'where the node lock lives when CRI-O\'s drop-in folder is not used (containerd, pre-load only)' },
  { name: 'crio-dropin-dir', env: 'PINSET_CRIO_DROPIN_DIR', type: 'string', default: '/etc/crio/crio.conf.d', help: 'CRI-O drop-in folder the pin file is written to' },
  { name: 'reload', env: 'PINSET_RELOAD', type: 'string', default: 'dbus', choices: ['dbus', 'systemctl', 'none'], help: 'how CRI-O is reloaded after the pin file changes' },
  { name: 'crio-unit', env: 'PINSET_CRIO_UNIT', type: 'string', default: 'crio.service', help: 'systemd unit of CRI-O' },
  { name: 'auth-file', env: 'PINSET_AUTH_FILE', type: 'string', default: '/var/lib/kubelet/config.json', help: 'registry credentials, docker config.json format (missing = anonymous pulls)' },
  { name: 'max-parallel-pulls', env: 'PINSET_MAX_PARALLEL_PULLS', type: 'int', default: DEFAULT_MAX_PARALLEL_PULLS, help: 'images pulled at the same time' },
  { name: 'image-fs-high-watermark', env: 'PINSET_IMAGE_FS_HIGH_WATERMARK', type: 'int', default: 85, help: 'pulls wait while the image filesystem is at least this % full (the kubelet\'s image GC threshold); 0 disables' },
  { name: 'disk-estimate-factor', env: 'PINSET_DISK_ESTIMATE_FACTOR', type: 'number', default: DEFAULT_DISK_ESTIMATE_FACTOR, help: 'before pulling, estimated disk = compressed size of the images to download (from the registry) x this; a batch that would not fit below the watermark waits; 0 disables the estimate' },
  { name: 'registries-conf', env: 'CONTAINERS_REGISTRIES_CONF', type: 'string', help: 'registries.conf with the node\'s mirrors, for the size estimate (default /etc/containers/registries.conf)' },
  { name: 'registries-conf-dir', env: 'PINSET_REGISTRIES_CONF_DIR', type: 'string', default: '/etc/containers/registries.conf.d', help: 'drop-in folder of registries.conf' },
  { name: 'lease-namespace', env: 'POD_NAMESPACE', type: 'string', default: DEFAULT_SLOT_NAMESPACE, help: 'namespace of the rollout slot Leases (spec.rollout.maxConcurrentNodes); the DaemonSet sets it to its own' },
  { name: 'rollout-lease-duration', env: 'PINSET_ROLLOUT_LEASE_DURATION', type: 'duration', default: '60s', help: 'a rollout slot not renewed for this long is free again (a node that died); renewed every third of it' },
  { name: 'status-progress-interval', env: 'PINSET_STATUS_PROGRESS_INTERVAL', type: 'duration', default: '1m', help: 'progress alone (image counts) is written to the Node this long after the last write, then twice as long each time up to 5m; a change of phase is written at once' },
  { name: 'resync-interval', env: 'PINSET_RESYNC_INTERVAL', type: 'duration', default: '5m', help: 'full reconcile at least this often' },
  { name: 'presence-check-interval', env: 'PINSET_PRESENCE_CHECK_INTERVAL', type: 'duration', default: '30s', help: 'between reconciles, ask the runtime this often (one ListImages) whether pinned images are still there' },
  { name: 'reload-confirm-timeout', env: 'PINSET_RELOAD_CONFIRM_TIMEOUT', type: 'duration', default: '5s', help: 'how long CRI-O may take to apply a reload before it counts as not applied (and is retried)' },
  {
    name: 'min-watch-timeout',
    env: 'PINSET_MIN_WATCH_TIMEOUT',
    type: 'duration',
    default: '10m',
    help: 'each API watch asks the server to end it after a random time between this and twice this, then resumes (2 watches: about 8 requests an hour)',
  },
  { name: 'metrics-addr', env: 'PINSET_METRICS_ADDR', type: 'string', default: '0.0.0.0:9402', allowEmpty: true, help: 'host:port for /healthz, /readyz and /metrics ("" disables)' },
  { name: 'log-level', env: 'PINSET_LOG_LEVEL', type: 'string', default: 'info', choices: ['trace', 'debug', 'info', 'warn', 'error', 'fatal'], help: 'log level' },
  { name: 'once', env: 'PINSET_ONCE', type: 'bool', default: false, help: 'one full reconcile, then exit 0 if every selected set is Ready, 1 if not (or a static file cannot be read); one JSON line per set on stdout' },
  { name: 'lock-timeout', env: 'PINSET_LOCK_TIMEOUT', type: 'duration', default: '1m', help: 'with --once: how long to wait while another agent on this node holds the node lock (then exit 3)' },
];

/** Exit status of --once when another agent held the node lock for all of --lock-timeout. */
export const EXIT_LOCK_BUSY = 3;

/**
 * Test-only: PINSET_TEST_SIGKILL_AT=<write step> makes the agent SIGKILL
 * itself right after that step of a pin file write, as a crash or power
 * loss would stop it there (test/integration/crash.test.ts).
 */
function crashHooks(): PinFileHooks {
  const at = process.env.PINSET_TEST_SIGKILL_AT;
  if (!at) return {};
  if (!(WRITE_STEPS as readonly string[]).includes(at)) throw new UsageError(`PINSET_TEST_SIGKILL_AT must be one of ${WRITE_STEPS.join(', ')}`);
  return {
    afterStep: (step: WriteStep) => {
      if (step === at) process.kill(process.pid, 'SIGKILL');
    },
  };
}

const SUMMARY = `Pins and pre-loads the images of the PinnedImageSets that select this node:
writes one CRI-O drop-in with their union, reloads CRI-O, pulls missing images
through the CRI socket and reports per-set status on the Node annotation
pinset.dev/status.`;

/** How often the agent looks for a --kubeconfig that did not exist when it started. */
const KUBECONFIG_POLL_MS = 10_000;
/**
 * Exit status when the awaited kubeconfig appears: non-zero, so a service
 * manager restarts the agent under Restart=on-failure as under Restart=always
 * (75 is EX_TEMPFAIL).
 */
export const EXIT_RESTART_FOR_KUBECONFIG = 75;

/** How long --once waits for the first list of sets and the Node. */
const ONCE_SYNC_TIMEOUT_MS = 30_000;

export async function run(argv: string[]): Promise<number> {
  const { values: f } = parseFlags(AGENT_FLAGS, argv);
  if (f.help) {
    process.stdout.write(helpText('pinset agent [flags]', SUMMARY, AGENT_FLAGS));
    return 0;
  }
  const once = f.once === true;
  const nodeName = String(f['node-name']);
  // With --once, stdout carries the results; logs go to stderr.
  const logger = createLogger({ level: String(f['log-level']), base: { node: nodeName }, ...(once ? { destination: process.stderr } : {}) });
  if (f['metrics-addr'] && !once) {
    try {
      parseListenAddress(String(f['metrics-addr']));
    } catch (e) {
      throw new UsageError(`--metrics-addr: ${(e as Error).message}`);
    }
  }
  const maxParallel = Number(f['max-parallel-pulls']);
  if (maxParallel < 1) throw new UsageError('--max-parallel-pulls must be at least 1');
  if (Number(f['min-watch-timeout']) < 1000) throw new UsageError('--min-watch-timeout must be at least 1s');
  const slotLeaseMs = Number(f['rollout-lease-duration']);
  // A Lease stores whole seconds, and the slot is renewed every third of it.
  if (slotLeaseMs < 3_000) throw new UsageError('--rollout-lease-duration must be at least 3s');
  const progressIntervalMs = Number(f['status-progress-interval']);
  if (progressIntervalMs < 1_000) throw new UsageError('--status-progress-interval must be at least 1s');
  const leaseNamespace = String(f['lease-namespace']);
  if (!leaseNamespace) throw new UsageError('--lease-namespace (or POD_NAMESPACE) must not be empty');

  // The Kubernetes client is large (about 80 MB resident): a node that runs on
  // static sets alone never loads it.
  // A kubeconfig that does not exist yet is the kubelet's before the node
  // has joined (deploy/systemd): until it appears the agent applies static
  // sets only; then it exits so that its service manager starts it again
  // with the API.
  const configured = f.kubeconfig as string | undefined;
  const awaitedKubeconfig = configured && !existsSync(configured) ? configured : undefined;
  const kubeconfig = awaitedKubeconfig ? undefined : configured;
  const inCluster = !awaitedKubeconfig && Boolean(process.env.KUBERNETES_SERVICE_HOST && process.env.KUBERNETES_SERVICE_PORT);
  const kubeModules = kubeconfig || inCluster ? await loadKubeModules() : null;
  let kc = null;
  try {
    kc = kubeModules?.loadAgentKubeConfig(kubeconfig) ?? null;
  } catch (e) {
    throw new UsageError(`cannot load kubeconfig: ${(e as Error).message}`);
  }
  const flagLabels = f['node-labels'] ? parseLabelList(String(f['node-labels'])) : null;

  // Metrics exist only where something serves them (prom-client is ~20 MB resident).
  const serveMetrics = !once && Boolean(f['metrics-addr']);
  const metrics: AgentMetrics | null = serveMetrics ? new (await import('../metrics/agent-metrics.ts')).AgentMetrics({ defaultMetrics: true, resyncIntervalSeconds: Number(f['resync-interval']) / 1000 }) : null;
  const runtime = new CriImageRuntime(String(f['cri-endpoint']));
  const dropInDir = String(f['crio-dropin-dir']);
  const hooks = crashHooks();
  let reloader;
  try {
    reloader = createReloader(f.reload as ReloadMode, { unit: String(f['crio-unit']), logger });
  } catch (e) {
    throw new UsageError(`--crio-unit: ${(e as Error).message}`);
  }
  const authFile = new AuthFile(String(f['auth-file']));
  const puller = new ImagePuller({
    runtime,
    maxParallel,
    logger,
    authFor: (host, path) => authFile.authFor(host, path),
    scrub: (t) => authFile.scrub(t),
    onResult: (r) => {
      metrics?.pulls.inc({ result: r.ok ? 'success' : (r.failure?.kind ?? 'Other'), kind: r.kind });
      if (r.ok) metrics?.pullDuration.observe(r.durationMs / 1000);
    },
  });

  let agent: Agent | undefined;
  let kube: KubeObserver | null = null;
  let events: EventRecorder | null = null;
  let reporter: StatusReporter;
  let rolloutGate: RolloutGate | null = null;
  if (kc && kubeModules) {
    const { KubeObserver, AGENT_FIELD_MANAGER, NodeAnnotationSink, NodeEventRecorder, clientNodeLeaseApi, LeaseRolloutSlots } = kubeModules;
    const observer = new KubeObserver(kc, nodeName, logger, (why) => agent?.trigger(why, true), { minWatchTimeoutMs: Number(f['min-watch-timeout']) });
    kube = observer;
    reporter = new StatusReporter(new NodeAnnotationSink(kc, nodeName), { logger, progressIntervalMs });
    events = new NodeEventRecorder(kc, nodeName, () => observer.currentNode()?.metadata?.uid, logger);
    const slots = new LeaseRolloutSlots({ api: clientNodeLeaseApi(kc), namespace: leaseNamespace, identity: nodeName, fieldManager: AGENT_FIELD_MANAGER, leaseDurationMs: slotLeaseMs });
    rolloutGate = new RolloutGate({ slots, logger, onLost: () => agent?.trigger('rollout slot lost') });
  } else {
    reporter = new StatusReporter(new LogStatusSink(logger), { logger, progressIntervalMs });
  }
  const factor = Number(f['disk-estimate-factor']);
  if (factor !== 0 && factor < 1) throw new UsageError('--disk-estimate-factor must be 0 (no estimate) or at least 1');
  // The registry client is loaded on the first reconcile that has images to download.
  const sizeEstimator =
    factor > 0 && Number(f['image-fs-high-watermark']) > 0
      ? lazyRegistrySizeEstimator({ credentials: authFile, file: f['registries-conf'] as string | undefined, dir: String(f['registries-conf-dir']), logger })
      : null;
  const shutdown = async () => {
    await agent?.stop();
    // Free any rollout slot now rather than keep other nodes waiting for it to expire.
    await Promise.race([rolloutGate?.close(), new Promise((r) => setTimeout(r, 2_000).unref())]);
    await kube?.stop();
    // The last status goes out if the API answers within 2 s; the timer must
    // not hold the process open once it has.
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([reporter.flush(), new Promise((r) => (timer = setTimeout(r, 2_000)))]);
    clearTimeout(timer);
    reporter.close();
    runtime.close();
    reloader.close();
  };

  // One writer per node: nothing is written (pin file, Node status) before
  // the node lock is held. /healthz, /readyz and /metrics answer meanwhile,
  // so a waiting pod is alive, not ready, and says why.
  const pinBackend = f['pin-backend'] as PinBackendFlag;
  const pins = pinWiring({ flag: pinBackend, dropInDir, stateDir: String(f['state-dir']), criEndpoint: String(f['cri-endpoint']), runtime, logger });
  const lock = new NodeLock(pins.lockPath, {
    pid: process.pid,
    host: hostname(),
    node: nodeName,
    runsIn: inCluster ? 'pod' : 'host',
    startedAt: new Date(Date.now() - process.uptime() * 1000).toISOString(),
  });
  let waitingFor: string | null = null;
  const health =
    metrics && !once
      ? await (await import('../metrics/server.ts')).startHealthServer(String(f['metrics-addr']), metrics.registry, {
          live: () => (!agent || agent.lastLoopAt === 0 || Date.now() - agent.lastLoopAt < Number(f['resync-interval']) * 3 + 60_000 ? null : 'reconcile loop stalled'),
          ready: () => {
            if (waitingFor) return `waiting for the node lock ${lock.path}: ${waitingFor} holds it and writes the pins of this node`;
            if (!agent?.firstSyncDone) return 'waiting for the first reconcile that reaches the runtime';
            if (agent.lastResult && !agent.lastResult.runtimeReachable) return 'the container runtime is not reachable';
            return null;
          },
        })
      : null;
  if (health) logger.info({ url: health.url }, 'health and metrics listening');

  const stopping = new AbortController();
  if (!once) {
    for (const sig of ['SIGTERM', 'SIGINT'] as const) {
      process.once(sig, () => {
        logger.info({ signal: sig }, 'stopping');
        stopping.abort();
      });
    }
  }
  logger.info({ dropInDir, criEndpoint: f['cri-endpoint'], reload: f.reload, maxParallelPulls: maxParallel, host: hostname() }, 'pinset agent starting');
  metrics?.nodeLockHeld.set(0);
  const cannotStart = async (e: unknown): Promise<number> => {
    logger.error(
      { lock: lock.path, err: (e as Error).message },
      pins.usesDropIn
        ? `cannot take the node lock or open the drop-in folder: the agent needs ${path.dirname(lock.path)} and ${dropInDir} writable, on one mount (the DaemonSet mounts /etc/crio read-write; the systemd unit has ReadWritePaths=/etc/crio)`
        : `cannot take the node lock: the agent needs ${path.dirname(lock.path)} writable (--state-dir; deploy/containerd mounts /var/lib/pinset)`,
    );
    await shutdown();
    await health?.close();
    lock.release();
    return 2;
  };
  let waited = false;
  let locked: boolean;
  try {
    locked = await lock.acquire({
      signal: stopping.signal,
      timeoutMs: once ? Number(f['lock-timeout']) : undefined,
      onWait: (holder) => {
        waited = true;
        waitingFor = describeHolder(holder);
        logger.warn({ lock: lock.path, holder }, 'another pinset agent holds the node lock; waiting for it to exit before writing anything');
        events?.record('Warning', 'WaitingForNodeLock', `${waitingFor} holds the node lock ${lock.path}; the agent pid ${process.pid} on ${hostname()} waits and takes over when it exits`);
      },
    });
  } catch (e) {
    return await cannotStart(e);
  }
  if (!locked) {
    if (once) {
      logger.error({ lock: lock.path, waitedMs: Number(f['lock-timeout']) }, `${waitingFor ?? 'another pinset agent'} held the node lock for all of --lock-timeout: it is pinning this node; nothing was written`);
    }
    await shutdown();
    await health?.close();
    return once ? EXIT_LOCK_BUSY : 0;
  }
  waitingFor = null;
  metrics?.nodeLockHeld.set(1);
  let pinFile: PinFile | null = null;
  try {
    // With the lock held, no other agent is mid-write: open() may clean up after a killed one.
    if (pins.usesDropIn) pinFile = await PinFile.open(dropInDir, { hooks });
  } catch (e) {
    return await cannotStart(e);
  }
  logger.info({ lock: lock.path, pinFile: pinFile?.path, ...(waited ? { tookOver: true } : {}) }, 'node lock held: this agent writes the pins of this node');
  // crio.conf.d mounted alone: every write would fail with EXDEV. Said once
  // here; each write then refuses with the same message, which the sets'
  // status carries (PinFileWriteFailed), and the current pins stay.
  const layout = await pinFile?.mountProblem();
  if (layout && pinFile) logger.error({ dropInDir: pinFile.dir, stagingDir: pinFile.stagingDir }, layout);

  agent = new Agent({
    nodeName,
    runtime,
    criSocketPath: unixSocketPath(String(f['cri-endpoint'])),
    pinFile,
    reloader,
    pinBackend,
    containerdPins: pins.containerd,
    puller,
    reporter,
    logger,
    kube,
    staticDir: String(f['static-dir']),
    flagLabels,
    authFile,
    events,
    metrics,
    diskCheck: new DiskCheck(runtime, { highWatermarkPercent: Number(f['image-fs-high-watermark']), logger }),
    sizeEstimator,
    diskEstimateFactor: factor,
    rolloutGate,
    resyncIntervalMs: Number(f['resync-interval']),
    presenceCheckMs: Number(f['presence-check-interval']),
    pinWaitTimeoutMs: Number(f['reload-confirm-timeout']),
  });

  if (awaitedKubeconfig) {
    logger.warn(
      { kubeconfig: awaitedKubeconfig },
      once
        ? 'the kubeconfig does not exist yet (the kubelet writes its own when the node joins); applying static sets only'
        : 'the kubeconfig does not exist yet (the kubelet writes its own when the node joins); applying static sets only until it appears, then restarting to use it',
    );
  }

  if (once) {
    await kube?.start();
    if (kube) {
      const deadline = Date.now() + ONCE_SYNC_TIMEOUT_MS;
      while (!kube.synced && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
      if (!kube.synced) logger.warn('the API could not be listed; applying static sets and keeping current pins');
    }
    let code = 0;
    try {
      const result = await agent.reconcile();
      for (const s of result.sets) process.stdout.write(JSON.stringify(s satisfies NodeSetStatus) + '\n');
      // A static file whose sets are unknown may hold sets that are not Ready.
      if (result.plan.unknownStatic.length) logger.error({ files: result.plan.unknownStatic }, 'static set files could not be read: their sets are not applied');
      code = result.sets.every((s) => s.phase === 'Ready') && result.plan.unknownStatic.length === 0 ? 0 : 1;
    } catch (e) {
      logger.error({ err: (e as Error).message }, 'reconcile failed');
      code = 1;
    }
    await shutdown();
    lock.release();
    return code;
  }

  let code = 0;
  if (!stopping.signal.aborted) {
    await kube?.start();
    agent.start();
    if (awaitedKubeconfig) {
      const poll = setInterval(() => {
        if (!existsSync(awaitedKubeconfig)) return;
        clearInterval(poll);
        logger.info({ kubeconfig: awaitedKubeconfig, exitCode: EXIT_RESTART_FOR_KUBECONFIG }, 'the kubeconfig appeared; exiting to be restarted with the API');
        code = EXIT_RESTART_FOR_KUBECONFIG;
        stopping.abort();
      }, KUBECONFIG_POLL_MS);
      poll.unref();
      stopping.signal.addEventListener('abort', () => clearInterval(poll), { once: true });
    }
    await new Promise<void>((resolve) => stopping.signal.addEventListener('abort', () => resolve(), { once: true }));
  }
  await shutdown();
  await health?.close();
  lock.release();
  logger.info('stopped');
  return code;
}
