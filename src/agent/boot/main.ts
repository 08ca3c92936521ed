// `pinset agent`: the composition root. What lives as long as the process
// (the configuration, parsed once from the flags; the log; metrics and the
// health server; the signals) is made here; then the agent runs on the
// node's profile (./run-profile.ts) until it stops: SIGTERM (the DaemonSet,
// the systemd unit) or --once done, and again on a new profile when the
// node's runtime changes. `--drop-pins` is a mode of its own
// (../drop-pins/drop-pins.ts).
import { helpText, parseFlags } from '../../util/flags.ts';
import { createLogger } from '../../util/log.ts';
import { AGENT_FLAGS } from '../agent-flags.ts';
import { agentConfig, type AgentConfig } from './config.ts';
import { runProfile, startProfile, type Process } from './run-profile.ts';

const SUMMARY = `Pins and pre-loads the images of the PinnedImageSets that select this node:
finds the node's runtime, pins their union (one CRI-O drop-in and a reload, or
containerd's pin label on each image), pulls missing images through the CRI
socket and reports per-set status on the Node annotation pinset.dev/status.`;

/** --drop-pins (or PINSET_DROP_PINS) on the command line or in the environment: the one-shot removal, with its own flags. */
function wantsDropPins(argv: readonly string[], env = process.env): boolean {
  const given = argv.find((a) => a === '--drop-pins' || a.startsWith('--drop-pins='));
  const raw = given ? (given.includes('=') ? given.slice(given.indexOf('=') + 1) : 'true') : (env.PINSET_DROP_PINS ?? '');
  return ['true', '1', 'yes'].includes(raw);
}

/** /healthz, /readyz and /metrics, for as long as the process runs (across profiles). */
async function healthServer(p: Process) {
  const { cfg, metrics, health } = p;
  if (!metrics) return null;
  return (await import('../../metrics/server.ts')).startHealthServer(cfg.metricsAddr, metrics.registry, {
    live: () => {
      const a = health.agent;
      return !a || a.lastLoopAt === 0 || Date.now() - a.lastLoopAt < cfg.loop.resyncIntervalMs * 3 + 60_000 ? null : 'reconcile loop stalled';
    },
    ready: () => {
      if (health.waitingFor) return `waiting for the node lock ${health.lockPath}: ${health.waitingFor} holds it and writes the pins of this node`;
      if (health.problem) return health.problem;
      if (!health.agent?.firstSyncDone) return 'waiting for the first reconcile that reaches the runtime';
      if (health.agent.lastResult && !health.agent.lastResult.runtimeReachable) return 'the container runtime is not reachable';
      return null;
    },
  });
}

/** The log (on stderr with --once: stdout carries the results), metrics where something serves them, the health server, the signals. */
async function startProcess(cfg: AgentConfig) {
  const logger = createLogger({ level: cfg.logLevel, base: { node: cfg.nodeName }, ...(cfg.once ? { destination: process.stderr } : {}) });
  // Metrics exist only where something serves them (prom-client is ~20 MB resident).
  const metrics = cfg.metricsAddr ? new (await import('../../metrics/agent-metrics.ts')).AgentMetrics({ defaultMetrics: true, resyncIntervalSeconds: cfg.loop.resyncIntervalMs / 1000 }) : null;
  const p: Process = { cfg, logger, metrics, stopping: new AbortController(), health: { waitingFor: null } };
  const server = await healthServer(p);
  if (server) logger.info({ url: server.url }, 'health and metrics listening');
  if (!cfg.once) {
    for (const sig of ['SIGTERM', 'SIGINT'] as const) {
      process.once(sig, () => {
        logger.info({ signal: sig }, 'stopping');
        p.stopping.abort();
      });
    }
  }
  return { p, close: async () => void (await server?.close()) };
}

/** The command's flags, for its --help and the reference (docs/reference.md; a test holds the two together). */
export const flags = AGENT_FLAGS;

export async function run(argv: string[]): Promise<number> {
  if (wantsDropPins(argv)) return (await import('../drop-pins/drop-pins.ts')).runDropPins(argv);
  const { values: f } = parseFlags(AGENT_FLAGS, argv);
  if (f.help) {
    process.stdout.write(helpText('pinset agent [flags]', SUMMARY, AGENT_FLAGS));
    return 0;
  }
  const cfg = agentConfig(f);
  const { p, close } = await startProcess(cfg);
  let code: number | 'again';
  do {
    code = await runProfile(p, await startProfile(p));
  } while (code === 'again' && !p.stopping.signal.aborted);
  await close();
  if (!cfg.once) p.logger.info('stopped');
  return code === 'again' ? 0 : code;
}
