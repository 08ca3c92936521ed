// The agent's registry access, built from its flags and the node's
// profile: every pull's credentials (the auth file, the kubelet's
// credential provider plugins, the sets' pull secrets once the API is
// known) and the size estimate before downloads, which asks the registries
// through the same mirrors the runtime pulls through (registries.conf for
// CRI-O; containerd's registry hosts folder, the profile's).
import type { Logger } from 'pino';
import type { RuntimeInfo } from '../cri/runtime.ts';
import type { AgentMetrics } from '../metrics/agent-metrics.ts';
import type { AuthFile } from '../registry/auth.ts';
import { UsageError, type FlagValues } from '../util/flags.ts';
import { credentialWiring } from './credential-wiring.ts';
import { lazyRegistrySizeEstimator, type SizeEstimator } from './estimate.ts';
import type { AgentCredentials } from './image-credentials.ts';
import type { NodeProfile } from './node-profile.ts';
import type { SecretStore } from './pull-secrets.ts';

export interface RegistryAccess {
  authFile: AuthFile;
  credentials: AgentCredentials;
  sizeEstimator: SizeEstimator | null;
  diskEstimateFactor: number;
}

/** The node's credentials first (an invalid plugin config stops the agent, as it stops the kubelet); the pull secrets join with the API's store. */
export async function registryAccess(
  f: FlagValues,
  o: { profile: NodeProfile; secrets: SecretStore | null; runtimeInfo: () => RuntimeInfo | undefined; logger: Logger; metrics: AgentMetrics | null },
): Promise<RegistryAccess> {
  const factor = Number(f['disk-estimate-factor']);
  if (factor !== 0 && factor < 1) throw new UsageError('--disk-estimate-factor must be 0 (no estimate) or at least 1');
  const creds = await credentialWiring(
    {
      authFile: String(f['auth-file']),
      providerConfig: (f['image-credential-provider-config'] as string | undefined) || undefined,
      providerBinDir: (f['image-credential-provider-bin-dir'] as string | undefined) || undefined,
      providerTimeoutMs: Number(f['image-credential-provider-timeout']),
    },
    o.logger,
    o.metrics,
  );
  const credentials = creds.withSecrets(o.secrets);
  const { profile } = o;
  // The registry client is loaded on the first reconcile that has images to download.
  const sizeEstimator =
    factor > 0 && Number(f['image-fs-high-watermark']) > 0
      ? lazyRegistrySizeEstimator({
          credentials,
          file: f['registries-conf'] as string | undefined,
          dir: String(f['registries-conf-dir']),
          containerdHostsDir: profile.containerdHostsDir,
          hostRoot: String(f['host-root'] || '/'),
          runtime: () => {
            const info = o.runtimeInfo() ?? profile.runtime;
            return info ? { name: info.runtimeName, version: info.runtimeVersion } : { name: profile.pinBackend === 'containerd' ? 'containerd' : undefined };
          },
          logger: o.logger,
        })
      : null;
  return { authFile: creds.authFile, credentials, sizeEstimator, diskEstimateFactor: factor };
}
