// HTTP for the registry client: undici (the HTTP client inside Node's own
// fetch, published by the Node.js project; the same version
// @kubernetes/client-node already brings in), because Node 24's fetch does
// not honour HTTPS_PROXY/HTTP_PROXY/NO_PROXY unless the process was started
// with NODE_USE_ENV_PROXY=1 (or --use-env-proxy), which a library cannot
// arrange for the program that loads it, and because a registry marked
// insecure in registries.conf needs a connection that skips certificate
// checks for that registry only.
//
// Trust: Node's bundled roots plus NODE_EXTRA_CA_CERTS (tls "default") and
// the operating system's store (tls "system": /etc/ssl/certs on Debian, the
// node's own store on a host), so a registry signed by a site CA that the
// node trusts is trusted here too, as it is by CRI-O.
import tls from 'node:tls';
import { EnvHttpProxyAgent, type Dispatcher } from 'undici';

export interface TransportOptions {
  /** Proxy settings; default from the environment (HTTPS_PROXY, HTTP_PROXY, NO_PROXY, lowercase too). */
  env?: Record<string, string | undefined>;
  /** Extra PEM roots (tests). */
  extraCa?: string[];
  /** Time to wait for response headers; the caller's own deadline applies to the whole request. */
  headersTimeoutMs?: number;
}

let cachedRoots: string[] | undefined;

/** Bundled + NODE_EXTRA_CA_CERTS + the system's roots, without duplicates. */
export function trustedRoots(): string[] {
  if (!cachedRoots) {
    const set = new Set<string>(tls.getCACertificates('default'));
    try {
      for (const c of tls.getCACertificates('system')) set.add(c);
    } catch {
      // No readable system store: the bundled roots and NODE_EXTRA_CA_CERTS remain.
    }
    cachedRoots = [...set];
  }
  return cachedRoots;
}

function proxyEnv(env: Record<string, string | undefined>) {
  const pick = (k: string) => env[k.toLowerCase()] ?? env[k.toUpperCase()];
  return {
    httpProxy: pick('http_proxy') || undefined,
    httpsProxy: pick('https_proxy') || undefined,
    noProxy: pick('no_proxy') ?? '',
  };
}

/** Two dispatchers: one that verifies certificates, one for registries marked insecure. */
export class Transport {
  readonly verified: Dispatcher;
  readonly unverified: Dispatcher;

  constructor(opts: TransportOptions = {}) {
    const ca = [...trustedRoots(), ...(opts.extraCa ?? [])];
    const { httpProxy, httpsProxy, noProxy } = proxyEnv(opts.env ?? process.env);
    const common = {
      httpProxy,
      httpsProxy,
      noProxy,
      headersTimeout: opts.headersTimeoutMs ?? 30_000,
      // Keep-alive connections are reused across the many manifest requests of a set.
      keepAliveTimeout: 10_000,
    };
    this.verified = new EnvHttpProxyAgent({ ...common, connect: { ca }, requestTls: { ca }, proxyTls: { ca } });
    this.unverified = new EnvHttpProxyAgent({
      ...common,
      connect: { rejectUnauthorized: false },
      requestTls: { rejectUnauthorized: false },
      proxyTls: { ca },
    });
  }

  async close(): Promise<void> {
    await Promise.all([this.verified.close(), this.unverified.close()]);
  }
}
