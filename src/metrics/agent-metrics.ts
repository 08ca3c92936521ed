// Prometheus metrics of the agent (prom-client), on their own registry so
// tests can create several agents in one process.
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { SetPhase } from '../api/types.ts';

export class AgentMetrics {
  readonly registry = new Registry();
  readonly pulls = new Counter({
    name: 'pinset_pulls_total',
    help: 'Image pulls by result (success, or the failure kind) and kind (download: content absent; name: content present under another name, the pull only adds the name CRI-O pins by).',
    labelNames: ['result', 'kind'],
    registers: [this.registry],
  });
  readonly pullDuration = new Histogram({
    name: 'pinset_pull_duration_seconds',
    help: 'Duration of successful image pulls.',
    buckets: [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900],
    registers: [this.registry],
  });
  readonly setsByPhase = new Gauge({ name: 'pinset_sets', help: 'Sets selecting this node, by phase.', labelNames: ['phase'], registers: [this.registry] });
  readonly imagesPinned = new Gauge({ name: 'pinset_images_pinned', help: 'Entries in the pin file (set images and carried-over pins).', registers: [this.registry] });
  readonly imagesWanted = new Gauge({ name: 'pinset_images_wanted', help: 'Images wanted by the sets selecting this node.', registers: [this.registry] });
  readonly imagesPresent = new Gauge({ name: 'pinset_images_present', help: 'Wanted images present in the runtime.', registers: [this.registry] });
  readonly reloads = new Counter({
    name: 'pinset_reloads_total',
    help: 'CRI-O reloads by result: success (signalled; confirmed where observable), failure (the reload call failed), not_applied (CRI-O did not apply it within the bound).',
    labelNames: ['result'],
    registers: [this.registry],
  });
  readonly reloadConfirmSeconds = new Histogram({
    name: 'pinset_reload_confirm_seconds',
    help: 'From signalling a reload to CRI-O reporting the new pin list.',
    buckets: [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
    registers: [this.registry],
  });
  readonly configRejected = new Gauge({ name: 'pinset_crio_config_rejected_files', help: 'Files in CRI-O\'s configuration that CRI-O would refuse (it then refuses every reload and a start).', registers: [this.registry] });
  readonly pinFileWrites = new Counter({ name: 'pinset_pin_file_writes_total', help: 'Writes of the pin file.', registers: [this.registry] });
  readonly reconciles = new Counter({ name: 'pinset_reconciles_total', help: 'Reconciles by result (success, error, cancelled).', labelNames: ['result'], registers: [this.registry] });
  readonly nodeLockHeld = new Gauge({
    name: 'pinset_node_lock_held',
    help: '1 when this agent holds the node lock and writes; 0 while it waits for another agent on this node to exit.',
    registers: [this.registry],
  });
  readonly lastSuccess = new Gauge({ name: 'pinset_last_successful_reconcile_timestamp_seconds', help: 'Unix time of the end of the last reconcile that reached the runtime.', registers: [this.registry] });

  // The kubelet's kubelet_credential_provider_plugin_duration and _errors, by plugin name.
  readonly credentialPluginDuration = new Histogram({
    name: 'pinset_credential_provider_plugin_duration_seconds',
    help: 'Duration of execs of kubelet credential provider plugins, by plugin name.',
    labelNames: ['plugin'],
    buckets: [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
    registers: [this.registry],
  });
  readonly credentialPluginErrors = new Counter({
    name: 'pinset_credential_provider_plugin_errors_total',
    help: 'Execs of kubelet credential provider plugins that failed (exit status, timeout, an answer that cannot be used), by plugin name.',
    labelNames: ['plugin'],
    registers: [this.registry],
  });

  // The node status's kubeletVerification.refuses as a series per set, every
  // set named (the status names the first 10): what the alert
  // PinsetKubeletVerifiesPinnedImages (deploy/monitoring) fires on.
  readonly kubeletRefusedSets = new Gauge({
    name: 'pinset_kubelet_verification_refused_sets',
    help: "1 for each set selecting this node whose pinned images the kubelet's credential verification policy verifies, by set and policy: offline, their pods start only with credentials matching the kubelet's own record of a pull, and otherwise need the registry.",
    labelNames: ['set', 'policy'],
    registers: [this.registry],
  });

  readonly resyncInterval = new Gauge({
    name: 'pinset_resync_interval_seconds',
    help: 'The agent\'s --resync-interval: it reconciles at least this often (alerts compare the last successful reconcile with it).',
    registers: [this.registry],
  });

  /**
   * The sets the kubelet's policy would pull again offline, as last read:
   * the series of sets no longer refused (or of another policy) go.
   */
  reportKubeletRefused(policy: string, sets: readonly string[]): void {
    this.kubeletRefusedSets.reset();
    for (const set of sets) this.kubeletRefusedSets.set({ set, policy }, 1);
  }

  constructor(opts: { defaultMetrics?: boolean; resyncIntervalSeconds?: number } = {}) {
    if (opts.defaultMetrics) collectDefaultMetrics({ register: this.registry });
    if (opts.resyncIntervalSeconds !== undefined) this.resyncInterval.set(opts.resyncIntervalSeconds);
    for (const p of ['Ready', 'Progressing', 'Degraded'] as SetPhase[]) this.setsByPhase.set({ phase: p }, 0);
  }
}
