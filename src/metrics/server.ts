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

export async function startHealthServer(addr: string, registry: Registry, checks: HealthChecks): Promise<{ server: http.Server; url: string; close(): Promise<void> }> {
  const { host, port } = parseListenAddress(addr);
  const server = http.createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, { allow: 'GET, HEAD' }).end();
      return;
    }
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
    close: () =>
      new Promise<void>((r) => {
        server.close(() => r());
        server.closeAllConnections();
      }),
  };
}
