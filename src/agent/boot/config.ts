// `pinset agent`'s configuration: its flag table (../agent-flags.ts) parsed
// once into typed values, one section per builder of the composition root
// (./main.ts). Each check a flag's type cannot make is made here, once, and
// stops the agent with a usage error before anything starts; no builder
// reads the flag bag. `--drop-pins` takes the sections it needs from its own
// flags (../drop-pins/drop-pins.ts).
import { parseLabelList, type Labels } from '../../api/selector.ts';
import { minWatchTimeoutMs } from '../../api/watch-timeout.ts';
import { WRITE_STEPS, type WriteStep } from '../../crio/pinfile.ts';
import { normalizeUnitName, type ReloadMode } from '../../crio/reloader.ts';
import { parseListenAddress } from '../../metrics/server.ts';
import type { PinBackendFlag } from '../../pins/choice.ts';
import { UsageError, type FlagValues } from '../../util/flags.ts';
import type { GivenKubeletPaths } from '../../kubelet/layouts.ts';
import { hostPath } from './host-paths.ts';

/** CRI-O's drop-in folder on the host. */
export const CRIO_DROPIN_DIR = '/etc/crio/crio.conf.d';
/** systemd's system bus on the host. */
const SYSTEM_BUS_SOCKET = '/run/dbus/system_bus_socket';

/** What the node's profile (./node-profile.ts) takes from the flags: those given win over what is found. */
export interface ProfileConfig {
  /** --host-root: where the host's /run, /etc and /var/lib are seen. */
  hostRoot: string;
  /** Given explicitly: no detection of the socket. */
  criEndpoint?: string;
  /** Given explicitly (not `auto`): wins over the backend the runtime found calls for. */
  pinBackend: PinBackendFlag;
  /** CRI-O's drop-in folder as this process sees it: --crio-dropin-dir, else /etc/crio/crio.conf.d under the host root. */
  dropInDir: string;
  /** Given explicitly: wins over the folder containerd's configuration names. */
  containerdHostsDir?: string;
}

/** CRI-O's reloads and the wait for a pin change to show (./pin-kit.ts). */
export interface PinsConfig {
  reload: ReloadMode;
  /** --crio-unit, as systemd names it. */
  crioUnit: string;
  /** The system bus where the host's /run is seen, under --host-root (DBUS_SYSTEM_BUS_ADDRESS, when set, wins); undefined: the default bus. */
  busAddress?: string;
  /** --reload-confirm-timeout. */
  confirmTimeoutMs: number;
  /** Test only (PINSET_TEST_SIGKILL_AT): the agent SIGKILLs itself right after this step of a pin file write (test/integration/crash.test.ts). */
  killAfterStep?: WriteStep;
}

/** The node lock (./node-lock-place.ts). */
export interface LockConfig {
  stateDir: string;
  /** The drop-in folder: earlier versions kept a CRI-O node's lock beside it. */
  dropInDir: string;
  /** --lock-timeout: how long --once and --drop-pins wait for it. */
  timeoutMs: number;
  /** For the lock file's record of who holds it. */
  nodeName: string;
  runsInPod: boolean;
}

/** The API side (./api-side.ts). */
export interface ApiConfig {
  nodeName: string;
  kubeconfig?: string;
  /** In a pod: the in-cluster config is used when no --kubeconfig is given. */
  runsInPod: boolean;
  leaseNamespace: string;
  rolloutLeaseDurationMs: number;
  progressIntervalMs: number;
  minWatchTimeoutMs: number;
}

/** Registry access (./registry-access.ts): credentials and the size estimate. */
export interface RegistryConfig {
  authFile: string;
  /** The kubelet's credential provider plugins: both or neither. */
  providers?: { config: string; binDir: string; timeoutMs: number };
  registriesConf?: string;
  registriesConfDir: string;
  /** Estimated disk = compressed download x this; 0: no estimate. */
  diskEstimateFactor: number;
}

/** The agent's loop and its parts (./agent-parts.ts). */
export interface LoopConfig {
  staticDir: string;
  /** --node-labels: used when the Node cannot be read. */
  nodeLabels: Labels | null;
  maxParallelPulls: number;
  /** --image-fs-high-watermark; 0: no disk check. */
  highWatermarkPercent: number;
  resyncIntervalMs: number;
  presenceCheckMs: number;
}

/** The kubelet's configuration (../kubelet-watch.ts): found under the host root, but for what the flags give. */
export interface KubeletConfig {
  hostRoot: string;
  /** --kubelet-config and --kubelet-config-dir: undefined not given (found on the node), "" none. */
  given: GivenKubeletPaths;
}

export interface AgentConfig {
  nodeName: string;
  once: boolean;
  logLevel: string;
  /** host:port of /healthz, /readyz and /metrics; '' when none is served (--metrics-addr "", or --once). */
  metricsAddr: string;
  profile: ProfileConfig;
  pins: PinsConfig;
  lock: LockConfig;
  api: ApiConfig;
  registry: RegistryConfig;
  loop: LoopConfig;
  /** The kubelet's configuration; null (both flags ""): nothing is reported about the kubelet. */
  kubelet: KubeletConfig | null;
}

/** A flag's value when given (an empty string counts as not given). */
const given = (f: FlagValues, name: string) => (f[name] ? String(f[name]) : undefined);

/** In a pod, by the variables the kubelet sets in every container. */
export function runsInPod(env: NodeJS.ProcessEnv = process.env): boolean {
  return Boolean(env.KUBERNETES_SERVICE_HOST && env.KUBERNETES_SERVICE_PORT);
}

export function profileConfig(f: FlagValues): ProfileConfig {
  const hostRoot = String(f['host-root'] || '/');
  return {
    hostRoot,
    criEndpoint: given(f, 'cri-endpoint'),
    pinBackend: f['pin-backend'] as PinBackendFlag,
    dropInDir: given(f, 'crio-dropin-dir') ?? hostPath(hostRoot, CRIO_DROPIN_DIR),
    containerdHostsDir: given(f, 'containerd-hosts-dir'),
  };
}

export function pinsConfig(f: FlagValues, env: NodeJS.ProcessEnv = process.env): PinsConfig {
  const reload = f.reload as ReloadMode;
  let crioUnit = String(f['crio-unit']);
  try {
    // Only a reloader that asks systemd needs a name systemd accepts.
    if (reload !== 'none') crioUnit = normalizeUnitName(crioUnit);
  } catch (e) {
    throw new UsageError(`--crio-unit: ${(e as Error).message}`);
  }
  const at = env.PINSET_TEST_SIGKILL_AT;
  if (at && !(WRITE_STEPS as readonly string[]).includes(at)) throw new UsageError(`PINSET_TEST_SIGKILL_AT must be one of ${WRITE_STEPS.join(', ')}`);
  const { hostRoot } = profileConfig(f);
  const busAddress = hostRoot !== '/' && !env.DBUS_SYSTEM_BUS_ADDRESS ? `unix:path=${hostPath(hostRoot, SYSTEM_BUS_SOCKET)}` : undefined;
  return {
    reload,
    crioUnit,
    ...(busAddress ? { busAddress } : {}),
    confirmTimeoutMs: Number(f['reload-confirm-timeout']),
    ...(at ? { killAfterStep: at as WriteStep } : {}),
  };
}

export function lockConfig(f: FlagValues, nodeName: string, env: NodeJS.ProcessEnv = process.env): LockConfig {
  return { stateDir: String(f['state-dir']), dropInDir: profileConfig(f).dropInDir, timeoutMs: Number(f['lock-timeout']), nodeName, runsInPod: runsInPod(env) };
}

function apiConfig(f: FlagValues, env: NodeJS.ProcessEnv): ApiConfig {
  // A Lease stores whole seconds, and the slot is renewed every third of it.
  if (Number(f['rollout-lease-duration']) < 3_000) throw new UsageError('--rollout-lease-duration must be at least 3s');
  if (Number(f['status-progress-interval']) < 1_000) throw new UsageError('--status-progress-interval must be at least 1s');
  if (!String(f['lease-namespace'])) throw new UsageError('--lease-namespace (or POD_NAMESPACE) must not be empty');
  return {
    nodeName: String(f['node-name']),
    kubeconfig: given(f, 'kubeconfig'),
    runsInPod: runsInPod(env),
    leaseNamespace: String(f['lease-namespace']),
    rolloutLeaseDurationMs: Number(f['rollout-lease-duration']),
    progressIntervalMs: Number(f['status-progress-interval']),
    minWatchTimeoutMs: minWatchTimeoutMs(f),
  };
}

function registryConfig(f: FlagValues): RegistryConfig {
  const factor = Number(f['disk-estimate-factor']);
  if (factor !== 0 && factor < 1) throw new UsageError('--disk-estimate-factor must be 0 (no estimate) or at least 1');
  const config = given(f, 'image-credential-provider-config');
  const binDir = given(f, 'image-credential-provider-bin-dir');
  if (Boolean(config) !== Boolean(binDir)) throw new UsageError('--image-credential-provider-config and --image-credential-provider-bin-dir go together: give both, or neither');
  return {
    authFile: String(f['auth-file']),
    ...(config && binDir ? { providers: { config, binDir, timeoutMs: Number(f['image-credential-provider-timeout']) } } : {}),
    registriesConf: given(f, 'registries-conf'),
    registriesConfDir: String(f['registries-conf-dir']),
    diskEstimateFactor: factor,
  };
}

function loopConfig(f: FlagValues): LoopConfig {
  if (Number(f['max-parallel-pulls']) < 1) throw new UsageError('--max-parallel-pulls must be at least 1');
  return {
    staticDir: String(f['static-dir']),
    nodeLabels: f['node-labels'] ? parseLabelList(String(f['node-labels'])) : null,
    maxParallelPulls: Number(f['max-parallel-pulls']),
    highWatermarkPercent: Number(f['image-fs-high-watermark']),
    resyncIntervalMs: Number(f['resync-interval']),
    presenceCheckMs: Number(f['presence-check-interval']),
  };
}

/** Each kubelet flag unset (found on the node), a path, or "" (none); both "": not reported. */
function kubeletConfig(f: FlagValues): KubeletConfig | null {
  const flag = (name: string) => (f[name] === undefined ? undefined : String(f[name]));
  const given: GivenKubeletPaths = { configFile: flag('kubelet-config'), configDir: flag('kubelet-config-dir') };
  if (given.configFile === '' && given.configDir === '') return null;
  return { hostRoot: profileConfig(f).hostRoot, given };
}

/** --metrics-addr as served: '' with --once (stdout carries the results; nothing serves them). */
function metricsAddr(f: FlagValues, once: boolean): string {
  const addr = once ? '' : String(f['metrics-addr'] ?? '');
  if (!addr) return '';
  try {
    parseListenAddress(addr);
  } catch (e) {
    throw new UsageError(`--metrics-addr: ${(e as Error).message}`);
  }
  return addr;
}

/** The agent's flags, parsed once; a value no builder could use is a usage error now. */
export function agentConfig(f: FlagValues, env: NodeJS.ProcessEnv = process.env): AgentConfig {
  const once = f.once === true;
  const nodeName = String(f['node-name']);
  return {
    nodeName,
    once,
    logLevel: String(f['log-level']),
    metricsAddr: metricsAddr(f, once),
    profile: profileConfig(f),
    pins: pinsConfig(f, env),
    lock: lockConfig(f, nodeName, env),
    api: apiConfig(f, env),
    registry: registryConfig(f),
    loop: loopConfig(f),
    kubelet: kubeletConfig(f),
  };
}
