// The node's registry configuration, read the way CRI-O reads it (through
// containers/image, pkg/sysregistriesv2): /etc/containers/registries.conf,
// or the file CONTAINERS_REGISTRIES_CONF names, then every *.conf file of
// /etc/containers/registries.conf.d in lexical order (no subfolders). Only
// the v2 format ([[registry]] tables); a drop-in's [[registry]] replaces the
// one with the same prefix from earlier files. What pinset uses:
//
//   [[registry]]
//   prefix = "quay.io/org"          # optional; defaults to location; "*.example.com" matches subdomains
//   location = "quay.io/org"        # the registry (and namespace) the prefix stands for
//   insecure = false                # HTTPS without verifying the certificate, or plain HTTP
//   blocked = false                 # no pulls at all
//   mirror-by-digest-only = false   # mirrors only for digest references
//   [[registry.mirror]]
//   location = "mirror.local:5000/org"
//   insecure = false
//   pull-from-mirror = "all"        # or "digest-only", "tag-only"
//
// The registry with the longest matching prefix applies; a reference is
// tried at each mirror in order, then at the location itself.
// unqualified-search-registries and short-name aliases do not apply:
// pinset's references always carry a registry host.
import { readdir } from 'node:fs/promises';
import path from 'node:path';
import { parse as parseToml } from 'smol-toml';
import { readRegularFile } from '../util/regular-file.ts';
import type { ImageName } from './names.ts';
import type { Endpoint, PullSource } from './pull-source.ts';

export type { Endpoint, PullSource } from './pull-source.ts';

export const DEFAULT_REGISTRIES_CONF = '/etc/containers/registries.conf';
export const DEFAULT_REGISTRIES_CONF_DIR = '/etc/containers/registries.conf.d';
/** A registries.conf (or drop-in) larger than this is refused unread, as is one that is not a regular file. */
export const REGISTRIES_CONF_MAX_BYTES = 4 * 1024 * 1024;

export type PullFromMirror = 'all' | 'digest-only' | 'tag-only';

export interface MirrorEndpoint extends Endpoint {
  pullFromMirror: PullFromMirror;
}

export interface RegistryEntry extends Endpoint {
  prefix: string;
  blocked: boolean;
  mirrorByDigestOnly: boolean;
  mirrors: MirrorEndpoint[];
  /** The file it came from, for messages. */
  file: string;
}

export class RegistriesConfError extends Error {
  override name = 'RegistriesConfError';
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function location(v: unknown, what: string, file: string): string {
  if (v === undefined) return '';
  if (typeof v !== 'string') throw new RegistriesConfError(`${file}: ${what} must be a string`);
  const trimmed = v.replace(/\/+$/, '');
  if (/^https?:\/\//.test(trimmed)) throw new RegistriesConfError(`${file}: ${what} ${JSON.stringify(v)}: URI schemes are not supported; write host[:port][/namespace]`);
  return trimmed;
}

function bool(v: unknown, what: string, file: string): boolean {
  if (v === undefined) return false;
  if (typeof v !== 'boolean') throw new RegistriesConfError(`${file}: ${what} must be true or false`);
  return v;
}

/** The [[registry]] tables of one file's text, checked as containers/image checks them (postProcessRegistries). */
export function parseRegistriesConf(text: string, file: string): RegistryEntry[] {
  let doc: Record<string, unknown>;
  try {
    doc = parseToml(text) as Record<string, unknown>;
  } catch (e) {
    throw new RegistriesConfError(`${file}: not valid TOML: ${(e as Error).message.split('\n')[0]}`);
  }
  if (isObject(doc.registries)) {
    // sysregistries v1 ([registries.search] etc.): long deprecated; CRI-O refuses it in drop-ins.
    throw new RegistriesConfError(`${file}: the v1 format ([registries.*]) is not supported; use [[registry]] tables (containers-registries.conf(5))`);
  }
  const list = doc.registry;
  if (list === undefined) return [];
  if (!Array.isArray(list)) throw new RegistriesConfError(`${file}: "registry" must be an array of tables ([[registry]])`);
  const out: RegistryEntry[] = [];
  list.forEach((r: unknown, i: number) => {
    const what = `registry[${i}]`;
    if (!isObject(r)) throw new RegistriesConfError(`${file}: ${what} must be a table`);
    const loc = location(r.location, `${what}.location`, file);
    let prefix = location(r.prefix, `${what}.prefix`, file);
    if (prefix === '') {
      if (loc === '') throw new RegistriesConfError(`${file}: ${what}: both location and prefix are unset`);
      prefix = loc;
    } else if (loc === '' && !prefix.startsWith('*.')) {
      throw new RegistriesConfError(`${file}: ${what}: location is unset and prefix is not of the form *.example.com`);
    }
    if (prefix.startsWith('*.') && /[/@:]/.test(prefix)) {
      throw new RegistriesConfError(`${file}: ${what}: a wildcard prefix must be of the form *.example.com, not ${JSON.stringify(prefix)}`);
    }
    if (r['pull-from-mirror'] !== undefined) throw new RegistriesConfError(`${file}: ${what}: pull-from-mirror may be set on a mirror only`);
    const mirrorByDigestOnly = bool(r['mirror-by-digest-only'], `${what}.mirror-by-digest-only`, file);
    const mirrorsRaw = r.mirror === undefined ? [] : r.mirror;
    if (!Array.isArray(mirrorsRaw)) throw new RegistriesConfError(`${file}: ${what}.mirror must be an array of tables ([[registry.mirror]])`);
    const mirrors: MirrorEndpoint[] = mirrorsRaw.map((m: unknown, j: number) => {
      const mw = `${what}.mirror[${j}]`;
      if (!isObject(m)) throw new RegistriesConfError(`${file}: ${mw} must be a table`);
      const mloc = location(m.location, `${mw}.location`, file);
      if (mloc === '') throw new RegistriesConfError(`${file}: ${mw}: location is unset`);
      const pfm = m['pull-from-mirror'] ?? '';
      if (pfm !== '' && pfm !== 'all' && pfm !== 'digest-only' && pfm !== 'tag-only') {
        throw new RegistriesConfError(`${file}: ${mw}: pull-from-mirror ${JSON.stringify(pfm)} is not one of all, digest-only, tag-only`);
      }
      if (mirrorByDigestOnly && pfm !== '') {
        throw new RegistriesConfError(`${file}: ${what}: mirror-by-digest-only and a mirror's pull-from-mirror cannot both be set`);
      }
      return { location: mloc, insecure: bool(m.insecure, `${mw}.insecure`, file), pullFromMirror: (pfm || 'all') as PullFromMirror };
    });
    out.push({
      prefix,
      location: loc,
      insecure: bool(r.insecure, `${what}.insecure`, file),
      blocked: bool(r.blocked, `${what}.blocked`, file),
      mirrorByDigestOnly,
      mirrors,
      file,
    });
  });
  // The same location listed twice must agree on insecure and blocked.
  for (const a of out) {
    for (const b of out) {
      const key = (e: RegistryEntry) => e.location || e.prefix;
      if (key(a) !== key(b)) continue;
      if (a.insecure !== b.insecure) throw new RegistriesConfError(`${file}: registry ${JSON.stringify(key(a))} is defined more than once with conflicting "insecure"`);
      if (a.blocked !== b.blocked) throw new RegistriesConfError(`${file}: registry ${JSON.stringify(key(a))} is defined more than once with conflicting "blocked"`);
    }
  }
  // The first entry of a prefix wins within a file.
  const byPrefix = new Map<string, RegistryEntry>();
  for (const e of out) if (!byPrefix.has(e.prefix)) byPrefix.set(e.prefix, e);
  return [...byPrefix.values()];
}

/**
 * Length of `prefix` when it matches `ref` (host/path[:tag][@digest]),
 * else -1: containers/image's refMatchingPrefix. A plain prefix matches
 * itself followed by the end, ":", "/" or "@"; "*.example.com" matches any
 * subdomain of example.com as the host.
 */
export function prefixMatch(ref: string, prefix: string): number {
  if (prefix.startsWith('*.')) {
    const suffix = prefix.slice(1);
    const i = ref.indexOf(suffix);
    if (i < 0 || ref.slice(0, i).includes('/')) return -1;
    const end = i + suffix.length;
    if (end === ref.length || ':/@'.includes(ref[end]!)) return end;
    return -1;
  }
  if (ref.length < prefix.length || !ref.startsWith(prefix)) return -1;
  if (ref.length === prefix.length || ':/@'.includes(ref[prefix.length]!)) return prefix.length;
  return -1;
}

export class RegistriesConf {
  readonly entries: readonly RegistryEntry[];
  /** The files read, in order (for messages). */
  readonly files: readonly string[];

  constructor(entries: readonly RegistryEntry[] = [], files: readonly string[] = []) {
    this.entries = entries;
    this.files = files;
  }

  static empty(): RegistriesConf {
    return new RegistriesConf();
  }

  /** The registry entry with the longest prefix matching host/path, if any. */
  find(name: Pick<ImageName, 'host' | 'path'>): RegistryEntry | undefined {
    const ref = `${name.host}/${name.path}`;
    let best: RegistryEntry | undefined;
    for (const e of this.entries) {
      if (prefixMatch(ref, e.prefix) >= 0 && (!best || e.prefix.length > best.prefix.length)) best = e;
    }
    return best;
  }

  /**
   * Where to fetch an image from, in order: its mirrors (those that serve
   * this kind of reference), then its own location. Throws when its
   * registry is blocked.
   */
  sources(name: ImageName): PullSource[] {
    const e = this.find(name);
    if (!e) return [{ endpoint: { location: name.host, insecure: false }, mirror: false, host: name.host, path: name.path }];
    if (e.blocked) throw new RegistriesConfError(`registry ${e.prefix} is blocked in ${e.file}; nothing can be pulled from it`);
    const byDigest = name.digest !== undefined;
    const endpoints: { ep: Endpoint; mirror: boolean }[] = [];
    for (const m of e.mirrors) {
      if (e.mirrorByDigestOnly && !byDigest) continue;
      if (m.pullFromMirror === 'digest-only' && !byDigest) continue;
      if (m.pullFromMirror === 'tag-only' && byDigest) continue;
      endpoints.push({ ep: m, mirror: true });
    }
    endpoints.push({ ep: e, mirror: false });
    const ref = `${name.host}/${name.path}`;
    const cut = prefixMatch(ref, e.prefix);
    return endpoints.map(({ ep, mirror }) => {
      // An empty location (wildcard prefix) keeps the image's own name.
      const rewritten = ep.location === '' ? ref : ep.location + ref.slice(cut);
      const slash = rewritten.indexOf('/');
      return {
        endpoint: { location: ep.location || name.host, insecure: ep.insecure },
        mirror,
        host: rewritten.slice(0, slash),
        path: rewritten.slice(slash + 1),
      };
    });
  }
}

/** Merge drop-in entries over earlier ones: a later entry replaces one with the same prefix. */
function merge(base: RegistryEntry[], updates: RegistryEntry[]): RegistryEntry[] {
  const m = new Map(base.map((e) => [e.prefix, e]));
  for (const e of updates) m.set(e.prefix, e);
  return [...m.keys()].sort().map((k) => m.get(k)!);
}

export interface LoadOptions {
  /** The main file, named explicitly (it must exist); else CONTAINERS_REGISTRIES_CONF, else `defaultFile`. */
  file?: string;
  /** The main file when none is named: /etc/containers/registries.conf; it may be missing. */
  defaultFile?: string;
  /** The drop-in folder; default /etc/containers/registries.conf.d. */
  dir?: string;
  env?: Record<string, string | undefined>;
}

/**
 * Read the configuration. A missing default file or folder means no
 * configuration; a file named explicitly must exist. A bad file is an
 * error naming it (CRI-O would refuse to start on it too).
 */
export async function loadRegistriesConf(opts: LoadOptions = {}): Promise<RegistriesConf> {
  const env = opts.env ?? process.env;
  const explicit = opts.file ?? (env.CONTAINERS_REGISTRIES_CONF || undefined);
  const file = explicit ?? opts.defaultFile ?? DEFAULT_REGISTRIES_CONF;
  const dir = opts.dir ?? DEFAULT_REGISTRIES_CONF_DIR;
  const files: string[] = [];
  let entries: RegistryEntry[] = [];
  try {
    entries = merge([], parseRegistriesConf(await readRegularFile(file, { maxBytes: REGISTRIES_CONF_MAX_BYTES }), file));
    files.push(file);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT' || explicit) {
      if (e instanceof RegistriesConfError) throw e;
      throw new RegistriesConfError(`cannot read ${file}: ${(e as Error).message}`);
    }
  }
  let names: string[] = [];
  try {
    const dirents = await readdir(dir, { withFileTypes: true });
    names = dirents.filter((d) => !d.isDirectory() && d.name.endsWith('.conf')).map((d) => d.name).sort();
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw new RegistriesConfError(`cannot read ${dir}: ${(e as Error).message}`);
  }
  for (const n of names) {
    const f = path.join(dir, n);
    let text: string;
    try {
      text = await readRegularFile(f, { maxBytes: REGISTRIES_CONF_MAX_BYTES });
    } catch (e) {
      throw new RegistriesConfError(`cannot read ${f}: ${(e as Error).message}`);
    }
    entries = merge(entries, parseRegistriesConf(text, f));
    files.push(f);
  }
  return new RegistriesConf(entries, files);
}
