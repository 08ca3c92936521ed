// `pinset agent`: flags, wiring of the real implementations, and the two
// ways to run: until SIGTERM (the DaemonSet, the systemd unit) or --once.
import { existsSync } from 'node:fs';
import { hostname } from 'node:os';
import * as path from 'node:path';
import type { Logger } from 'pino';
import { parseLabelList } from '../api/selector.ts';
import { minWatchTimeoutMs } from '../api/watch-timeout.ts';
import type { NodeSetStatus } from '../api/types.ts';
import { unixSocketPath } from '../cri/client.ts';
import { PinFile, WRITE_STEPS, type PinFileHooks, type WriteStep } from '../crio/pinfile.ts';
import type { AgentMetrics } from '../metrics/agent-metrics.ts';
import { parseListenAddress } from '../metrics/server.ts';
import { Backoff } from '../util/backoff.ts';
import { helpText, parseFlags, UsageError, type FlagValues } from '../util/flags.ts';
import { createLogger } from '../util/log.ts';
import { STEP_RETRY } from '../util/retry.ts';
import { AGENT_FLAGS, profileFlags } from './agent-flags.ts';
import { Agent } from './agent.ts';
import { apiSide, type ApiSide } from './api-side.ts';
import type { AgentCredentials } from './image-credentials.ts';
import type { KubeObserver } from './kube.ts';
import { KubeletConfigWatch } from './kubelet-config.ts';
import { describeProfile, nodeProfile, sameRuntime, type NodeProfile } from './node-profile.ts';
import { describeHolder } from './node-lock.ts';
import { ImagePuller } from './puller.ts';
import { registryAccess } from './registry-access.ts';
import { runtimeParts, type RuntimeParts } from './runtime-parts.ts';

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

/** Checks of the flags that parseFlags cannot make; a bad value stops the agent with a usage error. */
function checkFlags(f: FlagValues, once: boolean): void {
  if (f['metrics-addr'] && !once) {
    try {
      parseListenAddress(String(f['metrics-addr']));
    } catch (e) {
      throw new UsageError(`--metrics-addr: ${(e as Error).message}`);
    }
  }
  if (Number(f['max-parallel-pulls']) < 1) throw new UsageError('--max-parallel-pulls must be at least 1');
  minWatchTimeoutMs(f);
  // A Lease stores whole seconds, and the slot is renewed every third of it.
  if (Number(f['rollout-lease-duration']) < 3_000) throw new UsageError('--rollout-lease-duration must be at least 3s');
  if (Number(f['status-progress-interval']) < 1_000) throw new UsageError('--status-progress-interval must be at least 1s');
  if (!String(f['lease-namespace'])) throw new UsageError('--lease-namespace (or POD_NAMESPACE) must not be empty');
  const factor = Number(f['disk-estimate-factor']);
  if (factor !== 0 && factor < 1) throw new UsageError('--disk-estimate-factor must be 0 (no estimate) or at least 1');
}

/** What lives as long as the process, across the node's profiles: the log, metrics and the health server's view of the current one. */
interface Process {
  f: FlagValues;
  once: boolean;
  logger: Logger;
  metrics: AgentMetrics | null;
  stopping: AbortController;
  /** The current profile's agent and lock wait, for /healthz and /readyz. */
  state: { agent?: Agent; waitingFor: string | null; lockPath?: string; problem?: string };
}

/** The node's profile, found (or from flags), logged with the time it took. */
async function profile(p: Process): Promise<NodeProfile> {
  const hostRoot = String(p.f['host-root'] || '/');
  const found = await nodeProfile(profileFlags(p.f));
  const said = describeProfile(found, hostRoot);
  if (found.problem) p.logger.error({ runtime: said, detectionMs: found.detectionMs }, `no container runtime settled on: ${found.problem}; nothing is pinned until one is, and the agent looks again`);
  else p.logger.info({ runtime: said, detectionMs: found.detectionMs }, found.source === 'detected' ? 'node runtime detected' : 'node runtime from flags');
  return found;
}

/** Whether this node's runtime has changed since `current` was found: asked at a paced interval while the runtime is not reachable. */
function watchProfile(p: Process, current: NodeProfile, agent: Agent, onChange: () => void): () => void {
  if (current.source !== 'detected') return () => {};
  const backoff = new Backoff(STEP_RETRY);
  let timer: NodeJS.Timeout | undefined;
  let stopped = false;
  const next = (ms: number) => {
    if (!stopped) timer = setTimeout(look, ms);
  };
  const look = async () => {
    const reachable = !current.problem && agent.lastResult?.runtimeReachable !== false;
    if (reachable) {
      backoff.reset();
      return next(STEP_RETRY.capMs);
    }
    const now = await nodeProfile(profileFlags(p.f));
    if (stopped) return;
    // A runtime that went away and is not back yet keeps the agent where it is (pins kept; it is reached again at its own pace).
    if (!now.problem && !sameRuntime(current, now)) {
      p.logger.info({ was: describeProfile(current, String(p.f['host-root'] || '/')), now: describeProfile(now, String(p.f['host-root'] || '/')) }, "the node's runtime changed; the agent starts again on it");
      return onChange();
    }
    next(backoff.fail());
  };
  next(backoff.fail());
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

/** The kubelet's configuration files, unless both flags are "" (then nothing is reported about the kubelet). */
function kubeletConfigWatch(f: FlagValues, kube: KubeObserver | null): KubeletConfigWatch | null {
  const configFile = String(f['kubelet-config'] ?? '') || undefined;
  const configDir = String(f['kubelet-config-dir'] ?? '') || undefined;
  if (!configFile && !configDir) return null;
  return new KubeletConfigWatch({ configFile, configDir }, () => kube?.currentNode()?.status?.nodeInfo?.kubeletVersion);
}

/** The agent of one profile, its parts wired together (the API side, registry access, the runtime's parts). */
async function wireAgent(p: Process, prof: NodeProfile, api: ApiSide, rt: RuntimeParts, pinFile: PinFile | null) {
  const { f, logger, metrics } = p;
  let agent: Agent | undefined;
  const access = await registryAccess(f, { profile: prof, secrets: api.kube?.secrets ?? null, runtimeInfo: () => agent?.runtimeInfo, logger, metrics });
  const puller = new ImagePuller({
    runtime: rt.runtime,
    maxParallel: Number(f['max-parallel-pulls']),
    logger,
    credentials: access.credentials,
    onResult: (r) => {
      metrics?.pulls.inc({ result: r.ok ? 'success' : (r.failure?.kind ?? 'Other'), kind: r.kind });
      if (r.ok) metrics?.pullDuration.observe(r.durationMs / 1000);
    },
  });
  const hostRoot = String(f['host-root'] || '/');
  agent = new Agent({
    nodeName: String(f['node-name']),
    runtime: rt.runtime,
    criSocketPath: prof.problem ? null : unixSocketPath(prof.criEndpoint),
    pinFile,
    reloader: rt.reloader,
    pinBackend: prof.pinBackend,
    containerdPins: rt.pins.containerd,
    puller,
    reporter: api.reporter,
    logger,
    kube: api.kube,
    staticDir: String(f['static-dir']),
    flagLabels: f['node-labels'] ? parseLabelList(String(f['node-labels'])) : null,
    authFile: access.authFile,
    credentials: access.credentials,
    events: api.events,
    metrics,
    diskCheck: rt.diskCheck,
    kubeletConfig: kubeletConfigWatch(f, api.kube),
    sizeEstimator: access.sizeEstimator,
    diskEstimateFactor: access.diskEstimateFactor,
    rolloutGate: api.rolloutGate,
    resyncIntervalMs: Number(f['resync-interval']),
    presenceCheckMs: Number(f['presence-check-interval']),
    pinWaitTimeoutMs: Number(f['reload-confirm-timeout']),
    describeRuntime: (backend, info) => describeProfile(prof, hostRoot, backend, info),
  });
  return { agent, puller, credentials: access.credentials };
}

/** Runs the agent on one profile until it stops (a signal, --once done) or the node's runtime changes ('again'). */
async function runProfile(p: Process, prof: NodeProfile): Promise<number | 'again'> {
  const { f, once, logger, metrics, stopping } = p;
  let agent: Agent | undefined;
  let credentials: AgentCredentials | undefined;
  let puller: ImagePuller | undefined;
  const api = await apiSide(f, logger, {
    trigger: (why, cancel) => agent?.trigger(why, cancel),
    secretChanged: (name) => {
      if (!credentials || !puller) return;
      puller.retryNow(credentials.imagesUsingSecret(name));
      agent?.trigger('pull secret changed');
    },
  });
  const rt = runtimeParts(f, { profile: prof, logger, inCluster: api.inCluster });
  const { lock } = rt;
  p.state.lockPath = lock.path;
  p.state.problem = prof.problem;
  const shutdown = async () => {
    await agent?.stop();
    // Free any rollout slot now rather than keep other nodes waiting for it to expire.
    await Promise.race([api.rolloutGate?.close(), new Promise((r) => setTimeout(r, 2_000).unref())]);
    await api.kube?.stop();
    // The last status goes out if the API answers within 2 s; the timer must
    // not hold the process open once it has.
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([api.reporter.flush(), new Promise((r) => (timer = setTimeout(r, 2_000)))]);
    clearTimeout(timer);
    api.reporter.close();
    rt.close();
  };
  const dropInDir = prof.dropInDir;
  logger.info({ dropInDir, criEndpoint: prof.criEndpoint, reload: f.reload, maxParallelPulls: Number(f['max-parallel-pulls']), host: hostname() }, 'pinset agent starting');
  metrics?.nodeLockHeld.set(0);
  const cannotStart = async (e: unknown): Promise<number> => {
    logger.error(
      { lock: lock.path, err: (e as Error).message },
      rt.pins.usesDropIn
        ? `cannot take the node lock or open the drop-in folder: the agent needs ${path.dirname(lock.path)} and ${dropInDir} writable, on one mount (the DaemonSet mounts the host's /etc read-write; the systemd unit has ReadWritePaths=/etc/crio)`
        : `cannot take the node lock: the agent needs ${path.dirname(lock.path)} writable (--state-dir; the DaemonSet mounts /var/lib/pinset)`,
    );
    await shutdown();
    lock.release();
    return 2;
  };

  // One writer per node: nothing is written (pin file, Node status) before
  // the node lock is held. /healthz, /readyz and /metrics answer meanwhile,
  // so a waiting pod is alive, not ready, and says why.
  let waited = false;
  let locked: boolean;
  try {
    locked = await lock.acquire({
      signal: stopping.signal,
      timeoutMs: once ? Number(f['lock-timeout']) : undefined,
      onWait: (holder) => {
        waited = true;
        p.state.waitingFor = describeHolder(holder);
        logger.warn({ lock: lock.path, holder }, 'another pinset agent holds the node lock; waiting for it to exit before writing anything');
        api.events?.record('Warning', 'WaitingForNodeLock', `${p.state.waitingFor} holds the node lock ${lock.path}; the agent pid ${process.pid} on ${hostname()} waits and takes over when it exits`);
      },
    });
  } catch (e) {
    return await cannotStart(e);
  }
  if (!locked) {
    if (once) logger.error({ lock: lock.path, waitedMs: Number(f['lock-timeout']) }, `${p.state.waitingFor ?? 'another pinset agent'} held the node lock for all of --lock-timeout: it is pinning this node; nothing was written`);
    await shutdown();
    return once ? EXIT_LOCK_BUSY : 0;
  }
  p.state.waitingFor = null;
  metrics?.nodeLockHeld.set(1);
  let pinFile: PinFile | null = null;
  try {
    // With the lock held, no other agent is mid-write: open() may clean up after a killed one.
    if (rt.pins.usesDropIn) pinFile = await PinFile.open(dropInDir, { hooks: crashHooks() });
  } catch (e) {
    return await cannotStart(e);
  }
  logger.info({ lock: lock.path, pinFile: pinFile?.path, ...(waited ? { tookOver: true } : {}) }, 'node lock held: this agent writes the pins of this node');
  // crio.conf.d mounted alone: every write would fail with EXDEV. Said once
  // here; each write then refuses with the same message, which the sets'
  // status carries (PinFileWriteFailed), and the current pins stay.
  const layout = await pinFile?.mountProblem();
  if (layout && pinFile) logger.error({ dropInDir: pinFile.dir, stagingDir: pinFile.stagingDir }, layout);

  const wired = await wireAgent(p, prof, api, rt, pinFile);
  agent = p.state.agent = wired.agent;
  credentials = wired.credentials;
  puller = wired.puller;
  if (api.awaitedKubeconfig) {
    logger.warn(
      { kubeconfig: api.awaitedKubeconfig },
      once
        ? 'the kubeconfig does not exist yet (the kubelet writes its own when the node joins); applying static sets only'
        : 'the kubeconfig does not exist yet (the kubelet writes its own when the node joins); applying static sets only until it appears, then restarting to use it',
    );
  }
  const code = once ? await reconcileOnce(api, agent, logger) : await runUntilStopped(p, prof, api, agent);
  await shutdown();
  lock.release();
  return code;
}

/** --once: one full reconcile, its sets on stdout; 0 when every set is Ready. */
async function reconcileOnce(api: ApiSide, agent: Agent, logger: Logger): Promise<number> {
  const { kube } = api;
  await kube?.start();
  if (kube) {
    const deadline = Date.now() + ONCE_SYNC_TIMEOUT_MS;
    while (!kube.synced && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    if (!kube.synced) logger.warn('the API could not be listed; applying static sets and keeping current pins');
  }
  try {
    const result = await agent.reconcile();
    for (const s of result.sets) process.stdout.write(JSON.stringify(s satisfies NodeSetStatus) + '\n');
    // A static file whose sets are unknown may hold sets that are not Ready.
    if (result.plan.unknownStatic.length) logger.error({ files: result.plan.unknownStatic }, 'static set files could not be read: their sets are not applied');
    return result.sets.every((s) => s.phase === 'Ready') && result.plan.unknownStatic.length === 0 ? 0 : 1;
  } catch (e) {
    logger.error({ err: (e as Error).message }, 'reconcile failed');
    return 1;
  }
}

/** The agent's loop until SIGTERM, the awaited kubeconfig appearing (exit 75) or the node's runtime changing ('again'). */
async function runUntilStopped(p: Process, prof: NodeProfile, api: ApiSide, agent: Agent): Promise<number | 'again'> {
  const { logger, stopping } = p;
  if (stopping.signal.aborted) return 0;
  await api.kube?.start();
  agent.start();
  let code: number | 'again' = 0;
  const done = new AbortController();
  const finish = (c: number | 'again') => {
    code = c;
    done.abort();
  };
  const unwatch = watchProfile(p, prof, agent, () => finish('again'));
  let poll: NodeJS.Timeout | undefined;
  const awaited = api.awaitedKubeconfig;
  if (awaited) {
    poll = setInterval(() => {
      if (!existsSync(awaited)) return;
      logger.info({ kubeconfig: awaited, exitCode: EXIT_RESTART_FOR_KUBECONFIG }, 'the kubeconfig appeared; exiting to be restarted with the API');
      finish(EXIT_RESTART_FOR_KUBECONFIG);
    }, KUBECONFIG_POLL_MS);
    poll.unref();
  }
  await new Promise<void>((resolve) => {
    stopping.signal.addEventListener('abort', () => resolve(), { once: true });
    done.signal.addEventListener('abort', () => resolve(), { once: true });
  });
  clearInterval(poll);
  unwatch();
  return code;
}

/** /healthz, /readyz and /metrics, for as long as the process runs (across profiles). */
async function healthServer(p: Process) {
  const { f, metrics, once, state } = p;
  if (!metrics || once) return null;
  return (await import('../metrics/server.ts')).startHealthServer(String(f['metrics-addr']), metrics.registry, {
    live: () => {
      const a = state.agent;
      return !a || a.lastLoopAt === 0 || Date.now() - a.lastLoopAt < Number(f['resync-interval']) * 3 + 60_000 ? null : 'reconcile loop stalled';
    },
    ready: () => {
      if (state.waitingFor) return `waiting for the node lock ${state.lockPath}: ${state.waitingFor} holds it and writes the pins of this node`;
      if (state.problem) return state.problem;
      if (!state.agent?.firstSyncDone) return 'waiting for the first reconcile that reaches the runtime';
      if (state.agent.lastResult && !state.agent.lastResult.runtimeReachable) return 'the container runtime is not reachable';
      return null;
    },
  });
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
  checkFlags(f, once);
  crashHooks();
  // With --once, stdout carries the results; logs go to stderr.
  const logger = createLogger({ level: String(f['log-level']), base: { node: String(f['node-name']) }, ...(once ? { destination: process.stderr } : {}) });
  // Metrics exist only where something serves them (prom-client is ~20 MB resident).
  const serveMetrics = !once && Boolean(f['metrics-addr']);
  const metrics: AgentMetrics | null = serveMetrics ? new (await import('../metrics/agent-metrics.ts')).AgentMetrics({ defaultMetrics: true, resyncIntervalSeconds: Number(f['resync-interval']) / 1000 }) : null;
  const p: Process = { f, once, logger, metrics, stopping: new AbortController(), state: { waitingFor: null } };
  const health = await healthServer(p);
  if (health) logger.info({ url: health.url }, 'health and metrics listening');
  if (!once) {
    for (const sig of ['SIGTERM', 'SIGINT'] as const) {
      process.once(sig, () => {
        logger.info({ signal: sig }, 'stopping');
        p.stopping.abort();
      });
    }
  }
  let code: number | 'again';
  do {
    code = await runProfile(p, await profile(p));
  } while (code === 'again' && !p.stopping.signal.aborted);
  await health?.close();
  if (!once) logger.info('stopped');
  return code === 'again' ? 0 : code;
}
