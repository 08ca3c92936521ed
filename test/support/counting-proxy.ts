// An HTTP proxy on loopback in front of a registry that counts what a
// runtime fetches. It reads the image manifests passing through, so it can
// tell layer downloads from the rest: a pull of content already stored
// (a name-only pull, on CRI-O) fetches the manifest and the small config
// blob, and no layer.
import http from 'node:http';
import type { AddressInfo } from 'node:net';

export interface ProxiedRequest {
  method: string;
  path: string;
}

export class CountingProxy {
  readonly requests: ProxiedRequest[] = [];
  /** Layer digests named by the manifests seen so far. */
  readonly layers = new Set<string>();
  readonly #server: http.Server;
  readonly #target: URL;

  private constructor(target: string) {
    this.#target = new URL(target);
    this.#server = http.createServer((req, res) => {
      this.requests.push({ method: req.method ?? '', path: req.url ?? '' });
      const upstream = http.request(
        { host: this.#target.hostname, port: this.#target.port, method: req.method, path: req.url, headers: { ...req.headers, host: this.#target.host } },
        (up) => {
          res.writeHead(up.statusCode ?? 502, up.headers);
          if (req.method === 'GET' && /\/manifests\//.test(req.url ?? '')) {
            const chunks: Buffer[] = [];
            up.on('data', (c: Buffer) => chunks.push(c));
            up.on('end', () => {
              try {
                const m = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { layers?: { digest: string }[] };
                for (const l of m.layers ?? []) this.layers.add(l.digest);
              } catch {
                // not JSON: nothing to learn
              }
            });
          }
          up.pipe(res);
        },
      );
      upstream.on('error', (e) => {
        res.writeHead(502);
        res.end(String(e));
      });
      req.pipe(upstream);
    });
  }

  static async start(target: string): Promise<CountingProxy> {
    const p = new CountingProxy(target);
    await new Promise<void>((resolve) => p.#server.listen(0, '127.0.0.1', resolve));
    return p;
  }

  /** host:port to name as the registry's location. */
  get hostPort(): string {
    const a = this.#server.address() as AddressInfo;
    return `127.0.0.1:${a.port}`;
  }

  /** Blob GETs so far (layers and configs). */
  blobGets(): number {
    return this.requests.filter((r) => r.method === 'GET' && /\/blobs\/sha256:/.test(r.path)).length;
  }

  /** Layer downloads so far. */
  layerGets(): number {
    return this.requests.filter((r) => r.method === 'GET' && this.layers.has(/\/blobs\/(sha256:[0-9a-f]+)/.exec(r.path)?.[1] ?? '')).length;
  }

  async stop(): Promise<void> {
    this.#server.closeAllConnections();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}
