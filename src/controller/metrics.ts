// The controller's Prometheus metrics (served by src/metrics/server.ts).
// Each controller has its own Registry so two controllers in one process
// (the tests) do not share counters.
import { Counter, Gauge, Registry, collectDefaultMetrics } from 'prom-client';

export class ControllerMetrics {
  readonly registry: Registry;
  readonly leader: Gauge;
  readonly statusWrites: Counter<'result'>;
  readonly rollups: Counter;
  readonly watchErrors: Counter<'resource'>;
  readonly setsByReady: Gauge<'status'>;
  readonly setNodes: Gauge<'set' | 'state'>;
  readonly setDegradedNodes: Gauge<'set' | 'reason'>;

  constructor(opts: { defaultMetrics?: boolean } = {}) {
    this.registry = new Registry();
    if (opts.defaultMetrics) collectDefaultMetrics({ register: this.registry });
    const registers = [this.registry];
    this.leader = new Gauge({ name: 'pinset_controller_leader', help: '1 while this replica holds the lease and writes status, else 0', registers });
    this.statusWrites = new Counter({
      name: 'pinset_controller_status_writes_total',
      help: 'Writes of a PinnedImageSet status, by result (success, error)',
      labelNames: ['result'],
      registers,
    });
    this.rollups = new Counter({ name: 'pinset_controller_rollups_total', help: 'Set statuses computed (written or found unchanged)', registers });
    this.watchErrors = new Counter({
      name: 'pinset_controller_watch_errors_total',
      help: 'List or watch failures, by resource (nodes, pinnedimagesets)',
      labelNames: ['resource'],
      registers,
    });
    this.setsByReady = new Gauge({
      name: 'pinset_controller_sets',
      help: 'PinnedImageSets by the status of their Ready condition, as last computed by the leader',
      labelNames: ['status'],
      registers,
    });
    this.setNodes = new Gauge({
      name: 'pinset_controller_set_nodes',
      help: 'Nodes a PinnedImageSet selects (state matched) and how many are ready, progressing, degraded, as last computed by the leader',
      labelNames: ['set', 'state'],
      registers,
    });
    this.setDegradedNodes = new Gauge({
      name: 'pinset_controller_set_degraded_nodes',
      help: 'Degraded nodes of a PinnedImageSet by the reason they report (PinsOverridden, ImageNotFound, ReloadFailed, ...), as last computed by the leader',
      labelNames: ['set', 'reason'],
      registers,
    });
    this.leader.set(0);
    this.statusWrites.inc({ result: 'success' }, 0);
    this.statusWrites.inc({ result: 'error' }, 0);
  }
}
