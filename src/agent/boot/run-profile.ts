// The agent on one node profile: a short list of builders, each handed the
// parts built before it, each returning its close() (./close-stack.ts): the
// node lock, the API side, the runtime's parts; then, with the lock held,
// the pin kit (./pin-kit.ts), registry access and the agent, which
// subscribes to the API side. It runs until it stops (a signal, --once
// done, the awaited kubeconfig appearing) or the node's runtime changes
// ('again'); what was built is closed in reverse, the lock last, so the
// final status goes out while this agent still holds the node.
import { existsSync } from 'node:fs';
import { hostname } from 'node:os';
import * as path from 'node:path';
import type { Logger } from 'pino';
import type { NodeSetStatus } from '../../api/types.ts';
import { unixSocketPath } from '../../cri/client.ts';
import { stagingDirFor } from '../../crio/pinfile.ts';
import type { AgentMetrics } from '../../metrics/agent-metrics.ts';
import { Backoff } from '../../util/backoff.ts';
import { OwnFileError } from '../../util/own-file.ts';
import { STEP_RETRY } from '../../util/retry.ts';
import { Agent } from '../agent.ts';
import type { KubeObserver } from '../kube.ts';
import { KubeletConfigWatch } from '../kubelet-watch.ts';
import { describeHolder, type NodeLock } from '../node-lock.ts';
import { ImagePuller } from '../puller.ts';
import { apiSide, type ApiSide } from './api-side.ts';
import { CloseStack } from './close-stack.ts';
import type { AgentConfig } from './config.ts';
import { describeProfile, nodeProfile, sameRuntime, type NodeProfile } from './node-profile.ts';
import { nodeLock, nodeLockPath } from './node-lock-place.ts';
import { pinKit, type PinKit } from './pin-kit.ts';
import { registryAccess } from './registry-access.ts';
import { runtimeParts, type RuntimeParts } from './runtime-parts.ts';

/** Exit status of --once when another agent held the node lock for all of --lock-timeout. */
export const EXIT_LOCK_BUSY = 3;

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

/** What /healthz and /readyz see of the current profile's agent and its wait for the node lock. */
export interface HealthState {
  agent?: Agent;
  /** Who holds the node lock while this agent waits for it (null: not waiting). */
  waitingFor: string | null;
  /** The lock file waited for. */
  lockPath?: string;
  /** Why no runtime was settled on. */
  problem?: string;
}

/** What lives as long as the process, across the node's profiles (./main.ts). */
export interface Process {
  cfg: AgentConfig;
  logger: Logger;
  metrics: AgentMetrics | null;
  stopping: AbortController;
  health: HealthState;
}

/** The node's profile, found (or from flags), logged with the time it took. */
export async function startProfile(p: Process): Promise<NodeProfile> {
  const found = await nodeProfile(p.cfg.profile);
  const said = describeProfile(found, nodeLockPath(p.cfg.lock));
  if (found.problem) p.logger.error({ runtime: said, detectionMs: found.detectionMs }, `no container runtime settled on: ${found.problem}; nothing is pinned until one is, and the agent looks again`);
  else p.logger.info({ runtime: said, detectionMs: found.detectionMs }, found.source === 'detected' ? 'node runtime detected' : 'node runtime from flags');
  return found;
}

/** Runs the agent on one profile until it stops, or the node's runtime changes ('again'); closes what it built, in reverse. */
export async function runProfile(p: Process, prof: NodeProfile): Promise<number | 'again'> {
  const parts = new CloseStack();
  try {
    return await runParts(p, prof, parts);
  } finally {
    await parts.unwind();
  }
}

/** The builders in order, each pushing its close() on `parts`. */
async function runParts(p: Process, prof: NodeProfile, parts: CloseStack): Promise<number | 'again'> {
  const { cfg, logger } = p;
  const lock = nodeLock(cfg.lock);
  // Made first, so released last: the final status goes out while this agent still holds the node.
  parts.defer(() => lock.release());
  const api = parts.push(await apiSide(cfg.api, logger));
  const rt = parts.push(runtimeParts(prof, { highWatermarkPercent: cfg.loop.highWatermarkPercent, logger }));
  p.health.problem = prof.problem;
  logger.info({ dropInDir: prof.dropInDir, criEndpoint: prof.criEndpoint, reload: cfg.pins.reload, maxParallelPulls: cfg.loop.maxParallelPulls, host: hostname() }, 'pinset agent starting');
  const held = await holdNodeLock(p, lock, api);
  if (typeof held !== 'boolean') return held === 'busy' ? EXIT_LOCK_BUSY : held === 'stopped' ? 0 : cannotStart(logger, lock, prof, held);
  let kit: PinKit;
  try {
    // With the lock held, no other agent is mid-write: opening the pin file may clean up after a killed one.
    kit = parts.push(await pinKit(prof, cfg.pins, { runtime: rt.runtime, logger, metrics: p.metrics, events: api.events }));
  } catch (e) {
    return cannotStart(logger, lock, prof, e);
  }
  await sayLockHeld(logger, lock, kit, held);
  const agent = await buildAgent(p, prof, { api, rt, kit, lock });
  parts.defer(() => agent.stop());
  api.subscribe(agent);
  p.health.agent = agent;
  warnAwaitedKubeconfig(p, api);
  return cfg.once ? reconcileOnce(api, agent, logger) : runUntilStopped(p, prof, api, agent);
}

/**
 * One writer per node: nothing is written (pins, Node status) before the
 * node lock is held. /healthz, /readyz and /metrics answer meanwhile, so a
 * waiting pod is alive, not ready, and says why. Held: whether it took
 * over from an agent it waited for. 'busy': --once gave up after
 * --lock-timeout; 'stopped': a signal came first; an error: the lock could
 * not be taken.
 */
async function holdNodeLock(p: Process, lock: NodeLock, api: ApiSide): Promise<boolean | 'busy' | 'stopped' | Error> {
  const { cfg, logger, metrics, health } = p;
  metrics?.nodeLockHeld.set(0);
  let locked: boolean;
  try {
    locked = await lock.acquire({
      signal: p.stopping.signal,
      timeoutMs: cfg.once ? cfg.lock.timeoutMs : undefined,
      onWait: (holder, file) => {
        health.waitingFor = describeHolder(holder);
        health.lockPath = file;
        logger.warn({ lock: file, holder }, 'another pinset agent holds the node lock; waiting for it to exit before writing anything');
        api.events?.record('Warning', 'WaitingForNodeLock', `${health.waitingFor} holds the node lock ${file}; the agent pid ${process.pid} on ${hostname()} waits and takes over when it exits`);
      },
    });
  } catch (e) {
    return e as Error;
  }
  if (!locked && cfg.once) logger.error({ lock: health.lockPath ?? lock.path, waitedMs: cfg.lock.timeoutMs }, `${health.waitingFor ?? 'another pinset agent'} held the node lock for all of --lock-timeout: it is pinning this node; nothing was written`);
  if (!locked) return cfg.once ? 'busy' : 'stopped';
  const tookOver = health.waitingFor !== null;
  health.waitingFor = null;
  metrics?.nodeLockHeld.set(1);
  return tookOver;
}

/** The node lock, or CRI-O's drop-in folder, cannot be used: said with what must be writable, or what was planted where the lock goes; exit 2. */
function cannotStart(logger: Logger, lock: NodeLock, prof: NodeProfile, e: unknown): number {
  const err = (e as Error).message;
  if (lock.isHeld)
    logger.error(
      { lock: lock.path, err },
      `cannot open the drop-in folder: the agent needs ${stagingDirFor(prof.dropInDir)} and ${prof.dropInDir} writable, on one mount (the DaemonSet mounts the host's /etc/crio at /host/etc/crio, writable over its read-only /etc; the systemd unit has ReadWritePaths=/etc/crio)`,
    );
  else if (e instanceof OwnFileError) logger.error({ lock: lock.path, err }, `cannot take the node lock: ${err}`);
  else logger.error({ lock: lock.path, err }, `cannot take the node lock: the agent needs ${path.dirname(lock.path)} writable (--state-dir; the DaemonSet mounts /var/lib/pinset; the systemd unit has StateDirectory=pinset)`);
  return 2;
}

/**
 * Said once the lock is held. crio.conf.d mounted alone: every write would
 * fail with EXDEV. Said once here; each write then refuses with the same
 * message, which the sets' status carries (PinFileWriteFailed), and the
 * current pins stay.
 */
async function sayLockHeld(logger: Logger, lock: NodeLock, kit: PinKit, tookOver: boolean): Promise<void> {
  const { pinFile } = kit;
  logger.info({ lock: lock.path, pinFile: pinFile?.path, ...(tookOver ? { tookOver: true } : {}) }, 'node lock held: this agent writes the pins of this node');
  const layout = await pinFile?.mountProblem();
  if (layout && pinFile) logger.error({ dropInDir: pinFile.dir, stagingDir: pinFile.stagingDir }, layout);
}

/** The agent of one profile, handed its parts: the API side, the runtime's, the pin kit, registry access. */
async function buildAgent(p: Process, prof: NodeProfile, b: { api: ApiSide; rt: RuntimeParts; kit: PinKit; lock: NodeLock }): Promise<Agent> {
  const { cfg, logger, metrics } = p;
  const { api, rt } = b;
  const access = await registryAccess(cfg.registry, { profile: prof, highWatermarkPercent: cfg.loop.highWatermarkPercent, secrets: api.kube?.secrets ?? null, lastAnswer: rt.lastAnswer, logger, metrics });
  const onResult = (r: { ok: boolean; failure?: { kind: string }; kind: string; durationMs: number }) => {
    metrics?.pulls.inc({ result: r.ok ? 'success' : (r.failure?.kind ?? 'Other'), kind: r.kind });
    if (r.ok) metrics?.pullDuration.observe(r.durationMs / 1000);
  };
  return new Agent({
    nodeName: cfg.nodeName,
    runtime: rt.runtime,
    criSocketPath: prof.problem ? null : unixSocketPath(prof.criEndpoint),
    pins: b.kit.choice,
    downloads: b.kit.downloads ?? null,
    puller: new ImagePuller({ runtime: rt.runtime, maxParallel: cfg.loop.maxParallelPulls, logger, credentials: access.credentials, onResult }),
    reporter: api.reporter,
    logger,
    kube: api.kube,
    staticDir: cfg.loop.staticDir,
    flagLabels: cfg.loop.nodeLabels,
    authFile: access.authFile,
    credentials: access.credentials,
    events: api.events,
    metrics,
    diskCheck: rt.diskCheck,
    kubeletConfig: await kubeletConfigWatch(p, api.kube),
    sizeEstimator: access.sizeEstimator,
    diskEstimateFactor: cfg.registry.diskEstimateFactor,
    rolloutGate: api.rolloutGate,
    firstWave: api.firstWave,
    resyncIntervalMs: cfg.loop.resyncIntervalMs,
    presenceCheckMs: cfg.loop.presenceCheckMs,
    nodeRuntime: describeProfile(prof, b.lock.path),
  });
}

/** The kubelet's configuration, found on the node (a flag given wins for its field) and watched; null when both flags are "". */
async function kubeletConfigWatch(p: Process, kube: KubeObserver | null): Promise<KubeletConfigWatch | null> {
  if (!p.cfg.kubelet) return null;
  return KubeletConfigWatch.found({ ...p.cfg.kubelet, kubeletVersion: () => kube?.currentNode()?.status?.nodeInfo?.kubeletVersion, logger: p.logger, metrics: p.metrics });
}

function warnAwaitedKubeconfig(p: Process, api: ApiSide): void {
  if (!api.awaitedKubeconfig) return;
  p.logger.warn(
    { kubeconfig: api.awaitedKubeconfig },
    p.cfg.once
      ? 'the kubeconfig does not exist yet (the kubelet writes its own when the node joins); applying static sets only'
      : 'the kubeconfig does not exist yet (the kubelet writes its own when the node joins); applying static sets only until it appears, then restarting to use it',
  );
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
    for (const s of [stopping.signal, done.signal]) s.addEventListener('abort', () => resolve(), { once: true });
  });
  clearInterval(poll);
  unwatch();
  return code;
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
    const now = await nodeProfile(p.cfg.profile);
    if (stopped) return;
    // A runtime that went away and is not back yet keeps the agent where it is (pins kept; it is reached again at its own pace).
    if (!now.problem && !sameRuntime(current, now)) {
      const lockPath = nodeLockPath(p.cfg.lock);
      p.logger.info({ was: describeProfile(current, lockPath), now: describeProfile(now, lockPath) }, "the node's runtime changed; the agent starts again on it");
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
