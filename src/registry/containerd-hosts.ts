// Where containerd fetches an image from, from its registry host folders
// (`config_path`, usually /etc/containerd/certs.d; several folders joined
// with ":" are searched in order), so the registry client asks the same
// hosts containerd will pull from. For an image of registry R, the first of
// <root>/R_<port>_ (R with a port), <root>/R and <root>/_default that
// exists is R's folder, in the first root that has one; read as
// ./hosts-toml.ts says. No folder at all: R itself, as containerd goes to
// it (Docker Hub's real host for docker.io).
//
// Of those hosts, an image by digest is fetched from those with the `pull`
// capability, a tag is resolved only by those that also have `resolve`
// (containerd's Resolve and Fetch). A host that is not R is told R as
// ?ns=R. Credentials are the image's own registry's, for every host: the
// kubelet looks them up by the image's name and containerd sends them to
// whichever host it asks.
//
// containerd reads the folder again on every pull. Here a registry's
// folder, its hosts.toml and the certificate files it names are looked at
// again (mtime, size, inode) when their answer is more than a second old,
// and read again only when one changed.
import { stat } from 'node:fs/promises';
import path from 'node:path';
import tls from 'node:tls';
import { readRegularFile, ReadRefusedError } from '../util/regular-file.ts';
import type { ImageName } from './names.ts';
import type { HostTls, PullSource } from './pull-source.ts';
import { certFileHost, hostPaths, HostsTomlError, parseHostsToml, portOf, withDefaultHost, type Capability, type HostEntry } from './hosts-toml.ts';

export const DEFAULT_CONTAINERD_HOSTS_DIR = '/etc/containerd/certs.d';
/** A hosts.toml or certificate file larger than this is refused unread, as is one that is not a regular file. */
export const HOSTS_FILE_MAX_BYTES = 1024 * 1024;

/** Nothing can be fetched as the configuration stands (no host may, a certificate file unusable); asks nobody. */
export class ContainerdHostsError extends Error {
  override name = 'ContainerdHostsError';
}

/** One registry's hosts as last read. */
export interface RegistryHosts {
  /** The folder used, if any. */
  dir: string | undefined;
  /** What the hosts came from, for messages: a hosts.toml, a folder's certificate files, or containerd's default. */
  from: string;
  /** In the order containerd tries them, the image's own registry filled in. */
  entries: HostEntry[];
  /** Each entry's TLS, read from its files; undefined: the node's trust, verified. */
  tls: (HostTls | undefined)[];
  /** Why no host can be used (a certificate file containerd could not load either). */
  error?: string;
  /** Why hosts.toml was set aside for the certificate files, as containerd sets it aside. */
  problem?: string;
  files: string[];
  signature: string;
  checkedAt: number;
}

export interface ContainerdHostsOptions {
  /** Set aside a hosts.toml without [host] tables, as containerd before 1.7.32 does (containerdNeedsHostTable). */
  hostTableRequired?: boolean;
  /**
   * Where this process sees the host's / (the agent's --host-root): an
   * absolute certificate path in a hosts.toml is the host's, read under it.
   * Default /.
   */
  hostRoot?: string;
  /** How long a registry's hosts are used before their files are looked at again. Default 1 s. */
  recheckMs?: number;
  /** Called once per change of a hosts.toml containerd cannot use (it then falls back to the folder's certificate files). */
  onProblem?: (message: string) => void;
  now?: () => number;
}

async function fileStamp(p: string): Promise<string> {
  try {
    const s = await stat(p);
    return `${s.mtimeMs}:${s.size}:${s.ino}`;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code ?? 'error';
  }
}

/** The TLS of a host, read as containerd's updateTLSConfigFromHost reads it; throws what containerd would say. */
async function readTls(e: HostEntry): Promise<HostTls | undefined> {
  if (e.ca === undefined && e.client === undefined && e.skipVerify === undefined) return undefined;
  const out: HostTls = { ca: [], verify: e.skipVerify !== true };
  for (const f of e.ca ?? []) {
    const pem = await readRegularFile(f, { maxBytes: HOSTS_FILE_MAX_BYTES }).catch((err: NodeJS.ErrnoException) => {
      throw new ContainerdHostsError(`unable to read CA cert ${JSON.stringify(f)}: ${err instanceof ReadRefusedError ? err.message : (err.code ?? err.message)}`);
    });
    if (!pem.includes('-----BEGIN CERTIFICATE-----')) throw new ContainerdHostsError(`unable to load CA cert ${JSON.stringify(f)}: no PEM certificate in it`);
    out.ca.push(pem);
  }
  // Go offers the first pair a server's request accepts; Node offers one: the first.
  const pair = e.client?.[0];
  if (pair) {
    const read = (f: string) =>
      readRegularFile(f, { maxBytes: HOSTS_FILE_MAX_BYTES }).catch((err: NodeJS.ErrnoException) => {
        throw new ContainerdHostsError(`unable to read CERT file ${JSON.stringify(f)}: ${err instanceof ReadRefusedError ? err.message : (err.code ?? err.message)}`);
      });
    out.cert = await read(pair[0]);
    out.key = pair[1] ? await read(pair[1]) : out.cert;
    try {
      tls.createSecureContext({ cert: out.cert, key: out.key });
    } catch (err) {
      // OpenSSL's reason only: never the key's text.
      throw new ContainerdHostsError(`failed to load X509 key pair ${JSON.stringify(pair[0])}: ${(err as { reason?: string }).reason ?? (err as Error).name}`);
    }
  }
  return out;
}

export class ContainerdHosts {
  readonly roots: readonly string[];
  private readonly recheckMs: number;
  private readonly hostTableRequired: boolean;
  private readonly hostRoot: string;
  private readonly onProblem: (message: string) => void;
  private readonly now: () => number;
  private readonly known = new Map<string, RegistryHosts>();
  private readonly reading = new Map<string, Promise<RegistryHosts>>();

  /** `dirs`: containerd's config_path, one folder or several joined with ":". */
  constructor(dirs: string | readonly string[], opts: ContainerdHostsOptions = {}) {
    this.roots = (typeof dirs === 'string' ? dirs.split(':') : dirs).filter((d) => d !== '');
    this.recheckMs = opts.recheckMs ?? 1_000;
    this.hostTableRequired = opts.hostTableRequired ?? false;
    this.hostRoot = opts.hostRoot || '/';
    this.onProblem = opts.onProblem ?? (() => {});
    this.now = opts.now ?? Date.now;
  }

  /** Where to fetch `name` from, in order. Throws ContainerdHostsError when no host may serve it. */
  async sources(name: ImageName): Promise<PullSource[]> {
    const r = await this.hosts(name.host);
    if (r.error) throw new ContainerdHostsError(`${r.from}: ${r.error}`);
    const need: Capability[] = name.digest ? ['pull'] : ['pull', 'resolve'];
    const out: PullSource[] = [];
    r.entries.forEach((e, i) => {
      if (!need.every((c) => e.capabilities.includes(c))) return;
      const tls = r.tls[i];
      // A host written http:// with TLS settings is tried over TLS first, then plain HTTP (not on port 80).
      const fallback = e.scheme === 'http' && tls !== undefined && portOf(e.host) !== '80';
      const own = e.host === name.host || (name.host === 'docker.io' && e.host === 'registry-1.docker.io');
      out.push({
        endpoint: { location: e.host, insecure: e.scheme === 'http' || tls?.verify === false },
        mirror: i < r.entries.length - 1,
        host: e.host,
        path: name.path,
        connection: { schemes: fallback ? ['https', 'http'] : [e.scheme as 'https' | 'http'], tls, root: e.path, header: e.header ?? {}, ...(own ? {} : { namespace: name.host }) },
        credentialsOf: { host: name.host, path: name.path },
      });
    });
    if (out.length === 0) {
      throw new ContainerdHostsError(
        name.digest
          ? `${r.from}: no host has the "pull" capability`
          : `${r.from}: no host may resolve a tag (capabilities "pull" and "resolve"); name the image by digest, or give a host both`,
      );
    }
    return out;
  }

  /** A registry's hosts, read again when older than the recheck time and one of its files changed. */
  async hosts(registry: string): Promise<RegistryHosts> {
    const hit = this.known.get(registry);
    if (hit && this.now() - hit.checkedAt < this.recheckMs) return hit;
    let pending = this.reading.get(registry);
    if (!pending) {
      pending = this.refresh(registry, hit).finally(() => this.reading.delete(registry));
      this.reading.set(registry, pending);
    }
    return pending;
  }

  private async refresh(registry: string, old: RegistryHosts | undefined): Promise<RegistryHosts> {
    const dir = await this.find(registry);
    if (old && old.dir === dir && (await this.signature(dir, old.files)) === old.signature) {
      old.checkedAt = this.now();
      return old;
    }
    const read = await this.read(registry, dir);
    this.known.set(registry, read);
    if (read.problem && read.problem !== old?.problem) this.onProblem(read.problem);
    return read;
  }

  /** containerd's hostDirFromRoots: the first folder that exists, root by root. */
  private async find(registry: string): Promise<string | undefined> {
    for (const root of this.roots) {
      for (const p of hostPaths(root, registry)) {
        try {
          await stat(p);
          return p;
        } catch (e) {
          const code = (e as NodeJS.ErrnoException).code;
          if (code !== 'ENOENT' && code !== 'ENOTDIR') throw new ContainerdHostsError(`cannot read ${p}: ${code ?? (e as Error).message}`);
        }
      }
    }
    return undefined;
  }

  private async signature(dir: string | undefined, files: readonly string[]): Promise<string> {
    if (!dir) return 'none';
    const stamps = await Promise.all([dir, path.join(dir, 'hosts.toml'), ...files].map(fileStamp));
    return stamps.join('|');
  }

  private async read(registry: string, dir: string | undefined): Promise<RegistryHosts> {
    const checkedAt = this.now();
    if (!dir) {
      const entries = withDefaultHost([], registry);
      return { dir, from: `containerd's default for ${registry} (no folder for it in ${this.roots.join(':')})`, entries, tls: await Promise.all(entries.map(readTls)), files: [], signature: 'none', checkedAt };
    }
    const file = path.join(dir, 'hosts.toml');
    const before = await this.signature(dir, []);
    let text = '';
    try {
      text = await readRegularFile(file, { maxBytes: HOSTS_FILE_MAX_BYTES });
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code !== 'ENOENT') return { dir, from: file, entries: [], tls: [], error: `cannot read it: ${e instanceof ReadRefusedError ? e.message : (code ?? (e as Error).message)}`, files: [], signature: before, checkedAt };
    }
    let entries: HostEntry[];
    let from = file;
    let problem: string | undefined;
    try {
      entries = text.length > 0 ? parseHostsToml(text, dir, { hostTableRequired: this.hostTableRequired, hostRoot: this.hostRoot }) : [await certFileHost(dir)];
      if (text.length === 0) from = `${dir} (certificate files; no hosts.toml)`;
    } catch (e) {
      if (!(e instanceof HostsTomlError)) throw e;
      problem = `${file}: ${e.message}; containerd does not use this file either (it falls back to the folder's certificate files)`;
      entries = [await certFileHost(dir)];
      from = `${dir} (certificate files; hosts.toml unusable)`;
    }
    entries = withDefaultHost(entries, registry);
    const files = [...new Set(entries.flatMap((e) => [...(e.ca ?? []), ...(e.client?.[0] ?? []).filter(Boolean)]))];
    const signature = before.split('|').concat((await Promise.all(files.map(fileStamp)))).join('|');
    try {
      const tlsOf = await Promise.all(entries.map(readTls));
      return { dir, from, entries, tls: tlsOf, problem, files, signature, checkedAt };
    } catch (e) {
      if (!(e instanceof ContainerdHostsError)) throw e;
      return { dir, from, entries, tls: [], error: e.message, problem, files, signature, checkedAt };
    }
  }
}
