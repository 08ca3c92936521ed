// The agent's registry access, built from its configuration and the node's
// profile: every pull's credentials (the auth file, the kubelet's
// credential provider plugins, then the sets' pull secrets from the API's
// store) and the size estimate before downloads, which asks the registries
// through the same mirrors the runtime pulls through (registries.conf for
// CRI-O; containerd's registry hosts folder, the profile's, read as the
// runtime's version reads it).
import type { Logger } from 'pino';
import { containerdNeedsHostTable } from '../../containerd/versions.ts';
import type { RuntimeInfo } from '../../cri/runtime.ts';
import type { AgentMetrics } from '../../metrics/agent-metrics.ts';
import type { AuthFile } from '../../registry/auth.ts';
import type { CredentialSource } from '../../registry/credentials.ts';
import type { SizeEstimator } from '../estimate.ts';
import { AgentCredentials } from '../image-credentials.ts';
import { PullSecrets, type SecretStore } from '../pull-secrets.ts';
import type { RegistryConfig } from './config.ts';
import { nodeCredentials } from './credential-wiring.ts';
import type { NodeProfile } from './node-profile.ts';

export interface RegistryAccess {
  authFile: AuthFile;
  credentials: AgentCredentials;
  sizeEstimator: SizeEstimator | null;
}

export type MirrorConfig = { containerdHosts: string | undefined; hostTableRequired: boolean } | 'registries.conf';

/**
 * Where the agent's size estimate learns the node's mirrors: containerd's
 * registry hosts where the runtime is containerd (its default folder
 * unless --containerd-hosts-dir names one) or wherever that flag is given;
 * registries.conf otherwise (CRI-O reads it). On a containerd node the
 * hosts are what containerd pulls through, so registries.conf (podman's,
 * maybe) is not read there. The hosts are read as the runtime's version
 * reads them. Before the runtime has answered, --pin-backend containerd
 * counts as containerd.
 */
export function mirrorConfigFor(runtime: { name?: string; version?: string }, containerdHostsDir: string | undefined): MirrorConfig {
  const containerd = runtime.name?.toLowerCase() === 'containerd';
  if (!containerdHostsDir && !containerd) return 'registries.conf';
  return { containerdHosts: containerdHostsDir, hostTableRequired: containerd && containerdNeedsHostTable(runtime.version ?? '') };
}

export interface LazyEstimatorOptions {
  credentials: CredentialSource;
  /** registries.conf and its drop-in folder. */
  file?: string;
  dir: string;
  /** --containerd-hosts-dir, or the profile's. */
  containerdHostsDir?: string;
  /** --host-root: where an absolute certificate path of a hosts.toml is read. */
  hostRoot?: string;
  /** The runtime's name and version from CRI Version; unset until it answers. */
  runtime: () => { name?: string; version?: string };
  logger: Logger;
}

/** The registry client's mirrors as `config` says: registries.conf (unusable: logged, and none), or containerd's hosts, looked at again as they change. */
async function mirrors(config: MirrorConfig, opts: LazyEstimatorOptions) {
  // Loaded here, not at start: the registry client (undici) costs memory a node without downloads never needs.
  const [{ loadRegistriesConf, RegistriesConf }, { ContainerdHosts, DEFAULT_CONTAINERD_HOSTS_DIR }] = await Promise.all([import('../../registry/registries-conf.ts'), import('../../registry/containerd-hosts.ts')]);
  if (config === 'registries.conf') {
    try {
      return { registries: await loadRegistriesConf({ file: opts.file, dir: opts.dir }) };
    } catch (e) {
      opts.logger.warn({ err: (e as Error).message }, 'registries.conf unusable; size estimates ask the registries directly, without mirrors');
      return { registries: RegistriesConf.empty() };
    }
  }
  const dir = config.containerdHosts ?? DEFAULT_CONTAINERD_HOSTS_DIR;
  const containerdHosts = new ContainerdHosts(dir, {
    hostTableRequired: config.hostTableRequired,
    hostRoot: opts.hostRoot,
    onProblem: (err) => opts.logger.warn({ err }, 'a containerd hosts.toml is unusable; size estimates ask what containerd asks instead'),
  });
  opts.logger.info({ containerdHostsDir: dir }, 'size estimates ask the registries as containerd does, through its registry hosts');
  return { containerdHosts };
}

/**
 * The agent's estimator: a RegistrySizeEstimator made on first use, with the
 * node's mirrors (mirrorConfigFor) and the agent's own credentials.
 * registries.conf is read then (CRI-O too reads it at start and on reload);
 * containerd's hosts are looked at again as they change (containerd reads
 * them on every pull). A registries.conf that cannot be used is logged and
 * the registries are asked directly.
 */
export function lazyRegistrySizeEstimator(opts: LazyEstimatorOptions): SizeEstimator {
  const made = new Map<string, Promise<SizeEstimator>>();
  const make = async (config: MirrorConfig) => {
    const [{ RegistrySizeEstimator }, { RegistryClient }] = await Promise.all([import('../../registry/size-estimator.ts'), import('../../registry/client.ts')]);
    // Fewer attempts and a shorter deadline than the commands': a reconcile must not wait long on a registry.
    // No manifest cache: the estimator keeps what it needs of each image, its blobs' sizes.
    const client = new RegistryClient({ ...(await mirrors(config, opts)), credentials: opts.credentials, timeoutMs: 10_000, attempts: 2, userAgent: 'pinset-agent', cacheEntries: 0 });
    return new RegistrySizeEstimator(client);
  };
  return {
    sizes: async (refs, signal) => {
      const config = mirrorConfigFor(opts.runtime(), opts.containerdHostsDir);
      const key = JSON.stringify(config);
      let estimator = made.get(key);
      if (!estimator) made.set(key, (estimator = make(config)));
      return (await estimator).sizes(refs, signal);
    },
  };
}

/**
 * The node's credentials first (an invalid plugin config stops the agent,
 * as it stops the kubelet), then the pull secrets from the API's store.
 * The estimate is made where it can matter: a factor, and a watermark.
 */
export async function registryAccess(
  cfg: RegistryConfig,
  o: { profile: NodeProfile; highWatermarkPercent: number; secrets: SecretStore | null; lastAnswer: () => RuntimeInfo | undefined; logger: Logger; metrics: AgentMetrics | null },
): Promise<RegistryAccess> {
  const { authFile, node } = await nodeCredentials(cfg, o.logger, o.metrics);
  const credentials = new AgentCredentials({ node, pullSecrets: new PullSecrets(o.secrets), logger: o.logger });
  const { profile } = o;
  const runtime = () => {
    const info = o.lastAnswer() ?? profile.runtime;
    return info ? { name: info.runtimeName, version: info.runtimeVersion } : { name: profile.pinBackend === 'containerd' ? 'containerd' : undefined };
  };
  // The registry client is loaded on the first reconcile that has images to download.
  const sizeEstimator =
    cfg.diskEstimateFactor > 0 && o.highWatermarkPercent > 0
      ? lazyRegistrySizeEstimator({ credentials, file: cfg.registriesConf, dir: cfg.registriesConfDir, containerdHostsDir: profile.containerdHostsDir, hostRoot: profile.hostRoot, runtime, logger: o.logger })
      : null;
  return { authFile, credentials, sizeEstimator };
}
