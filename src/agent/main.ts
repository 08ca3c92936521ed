// `pinset agent`: flags, wiring of the real implementations, and the two
// ways to run: until SIGTERM (the DaemonSet, the systemd unit) or --once.
import { existsSync } from 'node:fs';
import { hostname } from 'node:os';
import * as path from 'node:path';
import { parseLabelList } from '../api/selector.ts';
import { minWatchTimeoutMs } from '../api/watch-timeout.ts';
import type { NodeSetStatus } from '../api/types.ts';
import { helpText, parseFlags, UsageError } from '../util/flags.ts';
import { AGENT_FLAGS } from './agent-flags.ts';
import { CriImageRuntime, unixSocketPath } from '../cri/client.ts';
import { PinFile, WRITE_STEPS, type PinFileHooks, type WriteStep } from '../crio/pinfile.ts';
import { createReloader } from '../crio/reload.ts';
import type { ReloadMode } from '../crio/reloader.ts';
import type { AgentMetrics } from '../metrics/agent-metrics.ts';
import { parseListenAddress } from '../metrics/server.ts';
import { createLogger } from '../util/log.ts';
import { Agent } from './agent.ts';
import { credentialWiring } from './credential-wiring.ts';
import type { AgentCredentials } from './image-credentials.ts';
import type { PinBackendFlag } from './pin-choice.ts';
import type { KubeObserver } from './kube.ts';
import type { EventRecorder } from './node-sinks.ts';
import { DiskCheck } from './disk.ts';
import { KubeletConfigWatch } from './kubelet-config.ts';
import { lazyRegistrySizeEstimator } from './estimate.ts';
import { describeHolder, NodeLock } from './node-lock.ts';
import { pinWiring } from './pin-wiring.ts';
import { ImagePuller } from './puller.ts';
import { RolloutGate } from '../rollout/gate.ts';
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

/** The kubelet's configuration files, unless both flags are "" (then nothing is reported about the kubelet). */
function kubeletConfigWatch(f: Record<string, unknown>, kube: KubeObserver | null): KubeletConfigWatch | null {
  const configFile = String(f['kubelet-config'] ?? '') || undefined;
  const configDir = String(f['kubelet-config-dir'] ?? '') || undefined;
  if (!configFile && !configDir) return null;
  return new KubeletConfigWatch({ configFile, configDir }, () => kube?.currentNode()?.status?.nodeInfo?.kubeletVersion);
}

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

/** --drop-pins (or PINSET_DROP_PINS) on the command line or in the environment: the one-shot removal, with its own flags. */
function wantsDropPins(argv: readonly string[], env = process.env): boolean {
  const given = argv.find((a) => a === '--drop-pins' || a.startsWith('--drop-pins='));
  const raw = given ? (given.includes('=') ? given.slice(given.indexOf('=') + 1) : 'true') : (env.PINSET_DROP_PINS ?? '');
  return ['true', '1', 'yes'].includes(raw);
}

/** The command's flags, for its --help and the reference (docs/reference.md; a test holds the two together). */
export const flags = AGENT_FLAGS;

export async function run(argv: string[]): Promise<number> {
  if (wantsDropPins(argv)) return (await import('./drop-pins.ts')).runDropPins(argv);
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
  const minWatchTimeout = minWatchTimeoutMs(f);
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
  const creds = await credentialWiring(
    {
      authFile: String(f['auth-file']),
      providerConfig: (f['image-credential-provider-config'] as string | undefined) || undefined,
      providerBinDir: (f['image-credential-provider-bin-dir'] as string | undefined) || undefined,
      providerTimeoutMs: Number(f['image-credential-provider-timeout']),
    },
    logger,
    metrics,
  );
  const authFile = creds.authFile;
  // Set once the API is known (pull secrets are read from it); the puller asks it on every pull.
  let credentials: AgentCredentials | undefined;
  const puller = new ImagePuller({
    runtime,
    maxParallel,
    logger,
    credentials: { credentialsFor: (image, signal) => credentials!.credentialsFor(image, signal), scrub: (t) => credentials!.scrub(t) },
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
    const observer = new KubeObserver(kc, nodeName, logger, (why) => agent?.trigger(why, true), {
      minWatchTimeoutMs: minWatchTimeout,
      secretNamespace: leaseNamespace,
      // A changed pull secret: the images of the sets naming it are tried again now, not at their backoff.
      onSecretChange: (name) => {
        if (!credentials) return;
        puller.retryNow(credentials.imagesUsingSecret(name));
        agent?.trigger('pull secret changed');
      },
    });
    kube = observer;
    reporter = new StatusReporter(new NodeAnnotationSink(kc, nodeName), { logger, progressIntervalMs });
    events = new NodeEventRecorder(kc, nodeName, () => observer.currentNode()?.metadata?.uid, logger);
    const slots = new LeaseRolloutSlots({ api: clientNodeLeaseApi(kc), namespace: leaseNamespace, identity: nodeName, fieldManager: AGENT_FIELD_MANAGER, leaseDurationMs: slotLeaseMs });
    rolloutGate = new RolloutGate({ slots, logger, onLost: () => agent?.trigger('rollout slot lost') });
  } else {
    reporter = new StatusReporter(new LogStatusSink(logger), { logger, progressIntervalMs });
  }
  credentials = creds.withSecrets(kube?.secrets ?? null);
  const factor = Number(f['disk-estimate-factor']);
  if (factor !== 0 && factor < 1) throw new UsageError('--disk-estimate-factor must be 0 (no estimate) or at least 1');
  // The registry client is loaded on the first reconcile that has images to download.
  const sizeEstimator =
    factor > 0 && Number(f['image-fs-high-watermark']) > 0
      ? lazyRegistrySizeEstimator({
          credentials,
          file: f['registries-conf'] as string | undefined,
          dir: String(f['registries-conf-dir']),
          containerdHostsDir: f['containerd-hosts-dir'] as string | undefined,
          runtime: () => {
            const info = agent?.runtimeInfo;
            return info ? { name: info.runtimeName, version: info.runtimeVersion } : { name: f['pin-backend'] === 'containerd' ? 'containerd' : undefined };
          },
          logger,
        })
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
    credentials,
    events,
    metrics,
    diskCheck: new DiskCheck(runtime, { highWatermarkPercent: Number(f['image-fs-high-watermark']), logger }),
    kubeletConfig: kubeletConfigWatch(f, kube),
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
