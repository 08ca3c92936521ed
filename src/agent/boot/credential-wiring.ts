// The node's own registry credentials: the auth file (--auth-file) and the
// kubelet's credential provider plugins (--image-credential-provider-config
// and -bin-dir, read and checked at start: an invalid config stops the
// agent, as it stops the kubelet). The sets' pull secrets join them in
// ./registry-access.ts.
import type { Logger } from 'pino';
import type { AgentMetrics } from '../../metrics/agent-metrics.ts';
import { AuthFile } from '../../registry/auth.ts';
import { ExecCredentialProvider } from '../../registry/credential-provider.ts';
import { NodeCredentials } from '../../registry/node-credentials.ts';
import { UsageError } from '../../util/flags.ts';
import type { RegistryConfig } from './config.ts';

type Providers = NonNullable<RegistryConfig['providers']>;

/** The plugins of the kubelet's CredentialProviderConfig, as the agent can run them. */
async function providerPlugins(cfg: Providers, authFile: AuthFile, logger: Logger, metrics: AgentMetrics | null): Promise<ExecCredentialProvider[]> {
  // Loaded only here: a node without providers never loads the config reader and its YAML parser.
  const { CredentialProviderConfigError, loadCredentialProviderConfig } = await import('../../registry/credential-provider-config.ts');
  let specs;
  try {
    specs = await loadCredentialProviderConfig(cfg.config, cfg.binDir);
  } catch (e) {
    if (e instanceof CredentialProviderConfigError) throw new UsageError(e.message);
    throw e;
  }
  const providers: ExecCredentialProvider[] = [];
  for (const spec of specs) {
    if (spec.tokenAttributes) {
      logger.warn({ provider: spec.name, config: cfg.config }, 'credential provider skipped: it sets tokenAttributes (a service-account token of the pod being pulled for, Kubernetes 1.33+), and the agent pulls for no pod');
      continue;
    }
    const onExec = (e: { provider: string; durationMs: number; ok: boolean }) => {
      metrics?.credentialPluginDuration.observe({ plugin: e.provider }, e.durationMs / 1000);
      if (!e.ok) metrics?.credentialPluginErrors.inc({ plugin: e.provider });
    };
    providers.push(new ExecCredentialProvider(spec, { binDir: cfg.binDir, timeoutMs: cfg.timeoutMs, scrub: (t: string) => authFile.scrub(t), onExec }));
  }
  logger.info({ config: cfg.config, binDir: cfg.binDir, providers: providers.map((p) => ({ name: p.name, matchImages: p.spec.matchImages })) }, 'credential provider plugins configured');
  return providers;
}

export async function nodeCredentials(cfg: RegistryConfig, logger: Logger, metrics: AgentMetrics | null): Promise<{ authFile: AuthFile; node: NodeCredentials }> {
  const authFile = new AuthFile(cfg.authFile);
  const providers = cfg.providers ? await providerPlugins(cfg.providers, authFile, logger, metrics) : [];
  return { authFile, node: new NodeCredentials(authFile, providers) };
}
