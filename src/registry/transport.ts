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
// node trusts is trusted here too, as it is by CRI-O. They are read when the
// first connection that verifies certificates is made (an estimate that
// only asks plain-HTTP registries never reads them), into one TLS context
// that every such connection shares: given as `ca` to each connection, the
// roots were parsed again into a context of each connection's own, and the
// agent ended an estimate of 300 images from an HTTPS registry 4.6 MB larger
// (BENCHMARKS.md, footprint).
import { createHash } from 'node:crypto';
import tls from 'node:tls';
import { buildConnector, EnvHttpProxyAgent, interceptors, type Dispatcher } from 'undici';
import { MAX_REDIRECTIONS } from './http.ts';
import type { HostTls } from './pull-source.ts';

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

/**
 * Two dispatchers: one that verifies certificates, one for registries
 * marked insecure; and one for each distinct TLS setting of containerd's
 * hosts (a CA of their own, a client certificate, skip_verify), made when
 * first asked for.
 */
export class Transport {
  readonly verified: Dispatcher;
  readonly unverified: Dispatcher;
  private readonly perHost = new Map<string, { agent: Dispatcher; following: Dispatcher }>();
  private readonly makeForHost: (t: HostTls) => { agent: Dispatcher; following: Dispatcher };

  constructor(opts: TransportOptions = {}) {
    const extraCa = opts.extraCa ?? [];
    let context: tls.SecureContext | undefined;
    const trusted = () => (context ??= tls.createSecureContext({ ca: [...trustedRoots(), ...extraCa] }));
    // undici's own connector, given the shared context when it is first asked for a connection.
    let connector: buildConnector.connector | undefined;
    const connect: buildConnector.connector = (o, callback) => (connector ??= buildConnector({ secureContext: trusted() }))(o, callback);
    const { httpProxy, httpsProxy, noProxy } = proxyEnv(opts.env ?? process.env);
    // Through a proxy, undici connects with these instead (made at once: proxies are the exception).
    // EnvHttpProxyAgent falls back to the process's own variables for a proxy not given.
    const env = process.env;
    const viaProxy = Boolean((httpProxy ?? env.http_proxy ?? env.HTTP_PROXY) || (httpsProxy ?? env.https_proxy ?? env.HTTPS_PROXY));
    const proxied = viaProxy ? { secureContext: trusted() } : {};
    const common = {
      httpProxy,
      httpsProxy,
      noProxy,
      headersTimeout: opts.headersTimeoutMs ?? 30_000,
      // Keep-alive connections are reused across the many manifest requests of a set.
      keepAliveTimeout: 10_000,
    };
    this.verified = new EnvHttpProxyAgent({ ...common, connect, requestTls: proxied, proxyTls: proxied });
    this.unverified = new EnvHttpProxyAgent({
      ...common,
      connect: { rejectUnauthorized: false },
      requestTls: { rejectUnauthorized: false },
      proxyTls: proxied,
    });
    this.makeForHost = (t) => {
      // containerd adds a host's CAs to the system's pool; here to the roots every connection trusts.
      const secureContext = tls.createSecureContext({ ca: [...trustedRoots(), ...extraCa, ...t.ca], ...(t.cert ? { cert: t.cert, key: t.key } : {}) });
      const own = { secureContext, rejectUnauthorized: t.verify };
      const agent = new EnvHttpProxyAgent({ ...common, connect: buildConnector(own), requestTls: own, proxyTls: proxied });
      return { agent, following: agent.compose(interceptors.redirect({ maxRedirections: MAX_REDIRECTIONS })) };
    };
  }

  /** The dispatcher for a host with TLS settings of its own, following redirects; one per distinct setting. */
  forHost(t: HostTls): Dispatcher {
    const key = createHash('sha256').update(JSON.stringify([t.ca, t.cert ?? '', t.key ?? '', t.verify])).digest('hex');
    let d = this.perHost.get(key);
    if (!d) this.perHost.set(key, (d = this.makeForHost(t)));
    return d.following;
  }

  async close(): Promise<void> {
    await Promise.all([this.verified.close(), this.unverified.close(), ...[...this.perHost.values()].map((d) => d.agent.close())]);
  }
}
