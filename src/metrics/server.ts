// The health and metrics listener: /healthz (the loop is alive), /readyz
// (ready to report: runtime reachable and the first sync done), /metrics.
import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Registry } from 'prom-client';

export interface HealthChecks {
  /** null when healthy, else why not. */
  live(): string | null;
  ready(): string | null;
}

export function parseListenAddress(addr: string): { host: string; port: number } {
  const m = /^(?:\[([^\]]+)\]|([^:]*)):(\d+)$/.exec(addr);
  if (!m) throw new Error(`${JSON.stringify(addr)} is not host:port`);
  return { host: m[1] ?? (m[2] || '0.0.0.0'), port: Number(m[3]) };
}

export async function startHealthServer(addr: string, registry: Registry, checks: HealthChecks): Promise<{ server: http.Server; url: string; close(): Promise<void> }> {
  const { host, port } = parseListenAddress(addr);
  const server = http.createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    const answer = (problem: string | null) => {
      res.writeHead(problem ? 503 : 200, { 'content-type': 'text/plain; charset=utf-8' });
      res.end(problem ? `${problem}\n` : 'ok\n');
    };
    if (path === '/healthz') return answer(checks.live());
    if (path === '/readyz') return answer(checks.ready());
    if (path === '/metrics') {
      registry.metrics().then(
        (body) => {
          res.writeHead(200, { 'content-type': registry.contentType });
          res.end(body);
        },
        (e: Error) => {
          res.writeHead(500);
          res.end(e.message);
        },
      );
      return;
    }
    res.writeHead(404);
    res.end('not found\n');
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve());
  });
  const a = server.address() as AddressInfo;
  return {
    server,
    url: `http://${a.family === 'IPv6' ? `[${a.address}]` : a.address}:${a.port}`,
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}
