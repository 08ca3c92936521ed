// Where the registry client fetches an image from: the places the node's
// configuration lists for it, in order, each with the name the image has
// there and how to connect. Two configurations make them:
//   - registries.conf (./registries-conf.ts, as CRI-O reads it): an
//     endpoint is https, verified against the node's trust, unless it is
//     marked insecure (then unverified https, or plain http);
//   - containerd's registry hosts (./containerd-hosts.ts): each host has a
//     scheme, its own TLS settings (ca, client, skip_verify), headers, an
//     API root (/v2, or its own path with override_path), and a mirror is
//     told which registry the image belongs to (?ns=).
import path from 'node:path';

export interface Endpoint {
  /** host[:port][/namespace], no scheme. Empty only for a "*.example.com" prefix (the image's own host). */
  location: string;
  insecure: boolean;
}

/** TLS of one host of containerd's: PEM contents, read from the files its hosts.toml names. */
export interface HostTls {
  /** CA certificates trusted besides the node's own. */
  ca: string[];
  /** The client certificate and key offered (the first pair hosts.toml names). */
  cert?: string;
  key?: string;
  /** false with skip_verify = true. */
  verify: boolean;
}

/** How to connect to a source of containerd's hosts (registries.conf sources derive theirs from `insecure`). */
export interface Connection {
  /** Tried in order: ['https', 'http'] is containerd's fallback to plain HTTP for a host written http:// with TLS settings. */
  schemes: ('https' | 'http')[];
  /** Absent: the node's trust, verified. */
  tls?: HostTls;
  /** The API root every request path starts with: /v2, or a host's own path (override_path). */
  root: string;
  /** Headers hosts.toml adds to every request to this host. */
  header: Record<string, string[]>;
  /** The image's registry, sent as ?ns= to a host that is not that registry, as containerd does. */
  namespace?: string;
}

/** One place to try for an image: the endpoint, and the name there (rewritten through the prefix). */
export interface PullSource {
  endpoint: Endpoint;
  /** True for a mirror, false for the registry's own location. */
  mirror: boolean;
  /** The image's host and path at this endpoint. */
  host: string;
  path: string;
  /** containerd's hosts only; absent for registries.conf. */
  connection?: Connection;
  /**
   * Whose credentials are offered here: containerd gets the image's own
   * registry's credentials from the kubelet and sends them to every host
   * it tries. Absent: this source's own host and path (containers/image
   * looks credentials up by the mirror's name).
   */
  credentialsOf?: { host: string; path: string };
}

/** The connection a source asks for: its own, or the one registries.conf's `insecure` implies. */
export function connectionOf(src: PullSource): Connection {
  if (src.connection) return src.connection;
  // Insecure: unverified HTTPS, then plain HTTP (containers/image's order); the client picks the unverified dispatcher.
  return { schemes: src.endpoint.insecure ? ['https', 'http'] : ['https'], root: '/v2', header: {} };
}

/** The URL of `/v2/<path>/<suffix>` (or below the host's own root) at `scheme`. */
export function sourceUrl(src: PullSource, scheme: 'https' | 'http', suffix: string): string {
  const c = connectionOf(src);
  // As containerd joins them (path.Join): a root of "/" or "" and doubled slashes collapse.
  const pathname = path.posix.join('/', c.root, src.path, suffix);
  return `${scheme}://${src.host}${pathname}${c.namespace ? `?ns=${encodeURIComponent(c.namespace)}` : ''}`;
}

/**
 * The client's headers with the host's added, as containerd adds them: a
 * host's value goes after the client's own (both are sent), but the
 * Authorization the client computed replaces one written in hosts.toml.
 */
export function withHostHeaders(src: PullSource, own: Record<string, string>): Record<string, string | string[]> {
  const extra = src.connection?.header;
  if (!extra || Object.keys(extra).length === 0) return own;
  const out: Record<string, string | string[]> = {};
  for (const [k, v] of Object.entries(extra)) {
    const key = k.toLowerCase();
    out[key] = [...((out[key] as string[] | undefined) ?? []), ...v];
  }
  for (const [key, v] of Object.entries(own)) {
    const theirs = key === 'authorization' ? undefined : (out[key] as string[] | undefined);
    out[key] = theirs ? [v, ...theirs] : v;
  }
  return out;
}

/** What to change when a source's certificate is refused. */
export function tlsAdvice(src: PullSource): string {
  return src.connection
    ? `a host signed by a private CA needs that CA in its hosts.toml (ca = "<file>") or in the system store; skip_verify = true accepts any certificate`
    : 'a registry signed by a private CA needs that CA in the system store or NODE_EXTRA_CA_CERTS; one that serves plain HTTP needs insecure = true in registries.conf';
}
