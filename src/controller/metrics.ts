// The controller's Prometheus metrics and its small HTTP listener
// (/healthz, /readyz, /metrics). Each controller has its own Registry so two
// controllers in one process (the tests) do not share counters.
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Counter, Gauge, Registry, collectDefaultMetrics } from 'prom-client';

export class ControllerMetrics {
  readonly registry: Registry;
  readonly leader: Gauge;
  readonly statusWrites: Counter<'result'>;
  readonly rollups: Counter;
  readonly watchErrors: Counter<'resource'>;
  readonly setsByReady: Gauge<'status'>;

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
    this.leader.set(0);
    this.statusWrites.inc({ result: 'success' }, 0);
    this.statusWrites.inc({ result: 'error' }, 0);
  }
}

/** "host:port", "[v6]:port" or ":port" (all interfaces). */
export function parseListenAddress(addr: string): { host: string; port: number } {
  const i = addr.lastIndexOf(':');
  if (i < 0) throw new Error(`${JSON.stringify(addr)} is not host:port`);
  let host = addr.slice(0, i);
  const portText = addr.slice(i + 1);
  if (host.startsWith('[') && host.endsWith(']')) host = host.slice(1, -1);
  if (!/^\d+$/.test(portText) || Number(portText) > 65535) throw new Error(`${JSON.stringify(addr)}: the port must be a number from 0 to 65535`);
  return { host: host || '0.0.0.0', port: Number(portText) };
}

export interface HealthSource {
  /** The process's loops are running. */
  alive(): boolean;
  /** The caches are filled; the controller can judge sets. */
  ready(): boolean;
}

/** Start the listener; resolves once it is bound (rejects if it cannot bind). */
export async function serveMetrics(addr: string, metrics: ControllerMetrics, health: HealthSource): Promise<{ server: Server; address: AddressInfo }> {
  const { host, port } = parseListenAddress(addr);
  const server = createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, { allow: 'GET, HEAD' }).end();
      return;
    }
    if (path === '/healthz' || path === '/readyz') {
      const ok = path === '/healthz' ? health.alive() : health.ready();
      res.writeHead(ok ? 200 : 503, { 'content-type': 'text/plain; charset=utf-8' }).end(ok ? 'ok\n' : 'not ready\n');
      return;
    }
    if (path === '/metrics') {
      metrics.registry.metrics().then(
        (text) => res.writeHead(200, { 'content-type': metrics.registry.contentType }).end(text),
        (err: unknown) => res.writeHead(500, { 'content-type': 'text/plain; charset=utf-8' }).end(`${String(err)}\n`),
      );
      return;
    }
    res.writeHead(404, { 'content-type': 'text/plain; charset=utf-8' }).end('not found\n');
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  return { server, address: server.address() as AddressInfo };
}
