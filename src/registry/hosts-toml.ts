// containerd's registry host configuration, read as containerd reads it
// (remotes/docker/config/hosts.go, the same in 1.6, 1.7 and 2.x except where
// said): `config_path` names folders, one per registry host, each with a
// hosts.toml:
//
//   server = "https://registry.example.com"      # the registry itself; absent: the image's own host
//   [host."https://mirror.example.com:5000"]      # tried first, in file order
//     capabilities = ["pull", "resolve"]         # absent or []: all (pull, resolve, push, referrers)
//     ca = "mirror-ca.crt"                       # or a list; relative to the folder
//     client = [["client.cert", "client.key"]]   # or "both.pem", or a list of either
//     skip_verify = false
//     override_path = false                      # true: the URL's path is the API root, no /v2 added
//     [host."https://mirror.example.com:5000".header]
//       x-custom = "value"                       # or a list of values
//
// The same keys at the top level apply to `server`. A folder without a
// hosts.toml, or whose hosts.toml containerd cannot use (bad TOML, an
// unknown capability, a value of the wrong type), falls back to Docker's
// certificate files in it: *.crt are CAs, *.cert with its *.key a client
// pair. containerd 1.6 and 1.7 before 1.7.32 also refuse a hosts.toml with
// no [host] table at all (its server alone); 2.x and 1.7.32 read it. The
// caller says which (hostTableRequired), from the runtime's version.
//
// Not applied: `dial_timeout` (2.x; pinset's own request deadline applies)
// and k3s's `rewrite` tables (a k3s addition to its own containerd build).
import { readdir, stat } from 'node:fs/promises';
import path from 'node:path';
import { parse as parseToml } from 'smol-toml';

export const CAPABILITIES = ['pull', 'resolve', 'push', 'referrers'] as const;
export type Capability = (typeof CAPABILITIES)[number];

/** One host of a hosts.toml (a [host] table, or the server last), as containerd's hostConfig. */
export interface HostEntry {
  /** "https" or "http"; empty with `host` for the server left out. */
  scheme: string;
  /** host[:port] to connect to; empty: the image's own registry (containerd fills it in). */
  host: string;
  /** API root: the URL's path with /v2 added (none with override_path). */
  path: string;
  capabilities: Capability[];
  /** CA files (absolute). */
  ca?: string[];
  /** Client certificate and key files; an empty key: the key is in the certificate's file. */
  client?: [string, string][];
  skipVerify?: boolean;
  header?: Record<string, string[]>;
}

export class HostsTomlError extends Error {
  override name = 'HostsTomlError';
}

function isTable(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v) && !(v instanceof Date);
}

/** ":port" becomes "_port_" in folder names: the name containerd looks for first for a host with a port. */
export function hostDirectory(host: string): string {
  const i = host.lastIndexOf(':');
  return i > 0 ? `${host.slice(0, i)}_${host.slice(i + 1)}_` : host;
}

/** The folders containerd looks in for `host` under one root, in order (Unix). */
export function hostPaths(root: string, host: string): string[] {
  const ported = hostDirectory(host);
  return [...(ported !== host ? [path.join(root, ported)] : []), path.join(root, host), path.join(root, '_default')];
}

/** Go's path.Clean for an absolute URL path, without the trailing slash. */
function cleanPath(p: string): string {
  const n = path.posix.normalize(p);
  return n.length > 1 && n.endsWith('/') ? n.slice(0, -1) : n;
}

function strings(v: unknown, what: string, map: (s: string) => string = (s) => s): string[] {
  if (!Array.isArray(v)) throw new HostsTomlError(`invalid type for ${what}: ${JSON.stringify(v)}`);
  return v.map((x) => {
    if (typeof x !== 'string') throw new HostsTomlError(`${what}: ${JSON.stringify(x)} is not a string`);
    return map(x);
  });
}

/**
 * One host's settings (containerd's parseHostConfig); `server` empty for a
 * server left out. A relative file is in `baseDir`; an absolute one is a
 * path on the host, under `hostRoot` as this process sees the host.
 */
function parseHost(server: string, baseDir: string, hostRoot: string, c: Record<string, unknown>, where: string): HostEntry {
  // An empty key file stays empty: the key is in the certificate's file, as the docs mean it.
  const abs = (p: string) => (p === '' ? p : !path.isAbsolute(p) ? path.join(baseDir, p) : hostRoot === '/' ? p : path.join(hostRoot, p));
  if (c.override_path !== undefined && typeof c.override_path !== 'boolean') throw new HostsTomlError(`${where}: override_path must be true or false`);
  const overridePath = c.override_path === true;
  const entry: HostEntry = { scheme: '', host: '', path: '', capabilities: [...CAPABILITIES] };
  if (server !== '') {
    const url = server.startsWith('http') ? server : `https://${server}`;
    const m = /^([a-z][a-z0-9+.-]*):\/\/([^/?#]*)([^?#]*)/i.exec(url);
    if (!m || !m[2]) throw new HostsTomlError(`${where}: ${JSON.stringify(server)} is not a URL with a host`);
    entry.scheme = m[1]!.toLowerCase();
    if (entry.scheme !== 'https' && entry.scheme !== 'http') throw new HostsTomlError(`${where}: ${JSON.stringify(server)} is not an http or https URL`);
    entry.host = m[2]!;
    let p = m[3] ? cleanPath(m[3]) : '';
    if (!overridePath && !p.endsWith('/v2')) p = `${p}/v2`;
    entry.path = p;
  }
  if (c.skip_verify !== undefined) {
    if (typeof c.skip_verify !== 'boolean') throw new HostsTomlError(`${where}: skip_verify must be true or false`);
    entry.skipVerify = c.skip_verify;
  }
  if (c.capabilities !== undefined) {
    const caps = strings(c.capabilities, `${where} capabilities`, (s) => s.toLowerCase());
    if (caps.length > 0) {
      for (const cap of caps) if (!(CAPABILITIES as readonly string[]).includes(cap)) throw new HostsTomlError(`${where}: unknown capability ${JSON.stringify(cap)}`);
      entry.capabilities = CAPABILITIES.filter((cap) => caps.includes(cap));
    }
  }
  if (c.ca !== undefined) entry.ca = typeof c.ca === 'string' ? [abs(c.ca)] : strings(c.ca, `${where} "ca"`, abs);
  if (c.client !== undefined) {
    if (typeof c.client === 'string') entry.client = [[abs(c.client), '']];
    else if (Array.isArray(c.client)) {
      entry.client = c.client.map((p): [string, string] => {
        if (typeof p === 'string') return [abs(p), ''];
        const pair = strings(p, `${where} "client"`, abs);
        if (pair.length !== 2) throw new HostsTomlError(`${where}: invalid pair ${JSON.stringify(p)} for "client"`);
        return [pair[0]!, pair[1]!];
      });
    } else throw new HostsTomlError(`${where}: invalid type for "client"`);
  }
  if (c.header !== undefined) {
    if (!isTable(c.header)) throw new HostsTomlError(`${where}: header must be a table`);
    const header: Record<string, string[]> = {};
    for (const [k, v] of Object.entries(c.header)) {
      header[k] = typeof v === 'string' ? [v] : strings(v, `${where} header ${JSON.stringify(k)}`);
    }
    entry.header = header;
  }
  if (c.dial_timeout !== undefined && typeof c.dial_timeout !== 'string') throw new HostsTomlError(`${where}: dial_timeout must be a duration string`);
  return entry;
}

/**
 * The hosts of one hosts.toml, in the order containerd tries them: each
 * [host."<url>"] in file order, then the server (host empty when there is
 * no `server`). `baseDir` is the file's folder (relative paths);
 * `hostRoot` where the host's / is seen (absolute paths; default /).
 */
export function parseHostsToml(text: string, baseDir: string, opts: { hostTableRequired?: boolean; hostRoot?: string } = {}): HostEntry[] {
  const hostRoot = opts.hostRoot || '/';
  let doc: Record<string, unknown>;
  try {
    doc = parseToml(text) as Record<string, unknown>;
  } catch (e) {
    throw new HostsTomlError(`not valid TOML: ${(e as Error).message.split('\n')[0]}`);
  }
  if (doc.server !== undefined && typeof doc.server !== 'string') throw new HostsTomlError('server must be a string');
  if (opts.hostTableRequired && doc.host === undefined) {
    throw new HostsTomlError('no [host."<url>"] table: containerd before 1.7.32 cannot read a hosts.toml without one (it goes to the registry itself); add the server as a [host] table too, or upgrade containerd');
  }
  const hosts = doc.host ?? {};
  if (!isTable(hosts)) throw new HostsTomlError('host must be a table of [host."<url>"] tables');
  const out: HostEntry[] = [];
  // smol-toml keeps the tables in the order they first appear, as
  // containerd orders them (by their headers' places in the file).
  for (const [url, c] of Object.entries(hosts)) {
    if (!isTable(c)) throw new HostsTomlError(`host.${JSON.stringify(url)} must be a table`);
    out.push(parseHost(url, baseDir, hostRoot, c, `[host.${JSON.stringify(url)}]`));
  }
  out.push(parseHost((doc.server as string | undefined) ?? '', baseDir, hostRoot, doc, 'server'));
  return out;
}

/** Docker's certificate files in a host's folder (containerd's loadCertFiles): one host, the image's own. */
export async function certFileHost(dir: string): Promise<HostEntry> {
  const entry: HostEntry = { scheme: '', host: '', path: '', capabilities: [...CAPABILITIES] };
  let names: string[] = [];
  try {
    names = (await readdir(dir, { withFileTypes: true })).filter((d) => !d.isDirectory()).map((d) => d.name).sort();
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
  }
  for (const name of names) {
    if (name.endsWith('.crt')) (entry.ca ??= []).push(path.join(dir, name));
    if (name.endsWith('.cert')) {
      const key = path.join(dir, `${name.slice(0, -'.cert'.length)}.key`);
      const hasKey = await stat(key).then(
        () => true,
        (e: NodeJS.ErrnoException) => {
          if (e.code === 'ENOENT') return false;
          throw e;
        },
      );
      (entry.client ??= []).push([path.join(dir, name), hasKey ? key : '']);
    }
  }
  return entry;
}

/** host[:port] without the port, and the port ('' when none): Go's net.SplitHostPort, leniently. */
function splitHostPort(hostport: string): { host: string; port: string } {
  const v6 = /^\[([^\]]*)\](?::(\d*))?$/.exec(hostport);
  if (v6) return { host: v6[1]!, port: v6[2] ?? '' };
  const i = hostport.indexOf(':');
  if (i >= 0 && hostport.indexOf(':', i + 1) < 0) return { host: hostport.slice(0, i), port: hostport.slice(i + 1) };
  return { host: hostport, port: '' };
}

export function portOf(hostport: string): string {
  return splitHostPort(hostport).port;
}

/** containerd's docker.IsLocalhost: localhost or a loopback address, with or without a port. */
export function isLocalhost(hostport: string): boolean {
  const { host } = splitHostPort(hostport);
  return host === 'localhost' || /^127\.\d+\.\d+\.\d+$/.test(host) || host === '::1' || /^::ffff:127\.\d+\.\d+\.\d+$/i.test(host);
}

/**
 * The last host without a host of its own becomes the image's registry, as
 * containerd's ConfigureHosts fills it in: Docker Hub's real host for
 * docker.io; for a loopback registry https on 443 or no port, else http
 * (tried over TLS first), certificates unchecked unless on port 80; https
 * otherwise. Its capabilities become all of them.
 */
export function withDefaultHost(entries: readonly HostEntry[], imageHost: string): HostEntry[] {
  const out = entries.length > 0 ? entries.map((e) => ({ ...e })) : [{ scheme: '', host: '', path: '', capabilities: [...CAPABILITIES] }];
  const last = out[out.length - 1]!;
  if (last.host !== '') return out;
  if (imageHost === 'docker.io') {
    last.scheme = 'https';
    last.host = 'registry-1.docker.io';
  } else if (isLocalhost(imageHost)) {
    last.host = imageHost;
    const port = portOf(imageHost);
    last.scheme = port === '' || port === '443' ? 'https' : 'http';
    if (port !== '80') last.skipVerify = true;
  } else {
    last.scheme = 'https';
    last.host = imageHost;
  }
  last.path = '/v2';
  last.capabilities = [...CAPABILITIES];
  return out;
}
