// How `pinset agent`'s flags wire its registry credentials: the auth file
// (--auth-file), the kubelet's credential provider plugins
// (--image-credential-provider-config and -bin-dir, read and checked at
// start: an invalid config stops the agent, as it stops the kubelet), and
// the pull secrets sets name, read from the agents' namespace.
import type { Logger } from 'pino';
import type { AgentMetrics } from '../metrics/agent-metrics.ts';
import { AuthFile } from '../registry/auth.ts';
import { ExecCredentialProvider } from '../registry/credential-provider.ts';
import { NodeCredentials } from '../registry/node-credentials.ts';
import { UsageError } from '../util/flags.ts';
import { AgentCredentials } from './image-credentials.ts';
import { PullSecrets, type SecretStore } from './pull-secrets.ts';

export interface CredentialFlags {
  authFile: string;
  providerConfig?: string;
  providerBinDir?: string;
  providerTimeoutMs: number;
}

export interface CredentialWiring {
  authFile: AuthFile;
  node: NodeCredentials;
  /** Completed once the API (and its Secrets) is known: see withSecrets(). */
  withSecrets(store: SecretStore | null): AgentCredentials;
}

export async function credentialWiring(f: CredentialFlags, logger: Logger, metrics: AgentMetrics | null): Promise<CredentialWiring> {
  const authFile = new AuthFile(f.authFile);
  const providers: ExecCredentialProvider[] = [];
  if (f.providerConfig || f.providerBinDir) {
    if (!f.providerConfig || !f.providerBinDir) throw new UsageError('--image-credential-provider-config and --image-credential-provider-bin-dir go together: give both, or neither');
    // Loaded only here: a node without providers never loads the config reader and its YAML parser.
    const { CredentialProviderConfigError, loadCredentialProviderConfig } = await import('../registry/credential-provider-config.ts');
    let specs;
    try {
      specs = await loadCredentialProviderConfig(f.providerConfig, f.providerBinDir);
    } catch (e) {
      if (e instanceof CredentialProviderConfigError) throw new UsageError(e.message);
      throw e;
    }
    const node = { scrub: (t: string) => authFile.scrub(t) };
    for (const spec of specs) {
      if (spec.tokenAttributes) {
        logger.warn(
          { provider: spec.name, config: f.providerConfig },
          'credential provider skipped: it sets tokenAttributes (a service-account token of the pod being pulled for, Kubernetes 1.33+), and the agent pulls for no pod',
        );
        continue;
      }
      providers.push(
        new ExecCredentialProvider(spec, {
          binDir: f.providerBinDir,
          timeoutMs: f.providerTimeoutMs,
          scrub: node.scrub,
          onExec: (e) => {
            metrics?.credentialPluginDuration.observe({ plugin: e.provider }, e.durationMs / 1000);
            if (!e.ok) metrics?.credentialPluginErrors.inc({ plugin: e.provider });
          },
        }),
      );
    }
    logger.info({ config: f.providerConfig, binDir: f.providerBinDir, providers: providers.map((p) => ({ name: p.name, matchImages: p.spec.matchImages })) }, 'credential provider plugins configured');
  }
  const node = new NodeCredentials(authFile, providers);
  return { authFile, node, withSecrets: (store) => new AgentCredentials({ node, pullSecrets: new PullSecrets(store), logger }) };
}
