// Registry credentials from a docker config.json, the format of the
// kubelet's /var/lib/kubelet/config.json: {"auths": {"<key>": {"auth":
// base64("user:pass")}}} (or username/password, identitytoken,
// registrytoken), and of the `.dockerconfigjson` of a pull secret; the
// legacy `.dockercfg` is the same map without "auths". Keys are matched as
// the kubelet matches them (./keyring.ts); every matching entry is a
// candidate, the most specific first. Each image gets the credentials of
// its own registry only. credHelpers and credsStore are read for the
// commands people run (./credentials.ts runs the helpers); the agent does
// not run them, as the kubelet does not.
import * as fsp from 'node:fs/promises';
import type { PullAuth } from '../cri/runtime.ts';
import { readRegularFile, ReadRefusedError } from '../util/regular-file.ts';
import { Keyring, type Credential } from './keyring.ts';

/** A docker config.json larger than this is refused (the kubelet's holds a few entries). */
export const AUTH_FILE_MAX_BYTES = 4 * 1024 * 1024;

export class DockerConfigError extends Error {
  override name = 'DockerConfigError';
}

export interface DockerAuths {
  entries: [string, PullAuth][];
  /** Every secret value the entries hold (for scrubbing). */
  secrets: string[];
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** base64 as Go's StdEncoding (padded) or RawStdEncoding (unpadded) reads it; null when it is neither. */
function strictBase64(s: string): Buffer | null {
  const t = s.replace(/[\r\n]/g, '');
  const padded = t.trim().endsWith('=');
  if (padded ? !/^[A-Za-z0-9+/]*={1,2}$/.test(t) || t.length % 4 !== 0 : !/^[A-Za-z0-9+/]*$/.test(t) || t.length % 4 === 1) return null;
  return Buffer.from(t, 'base64');
}

/**
 * The entries of an "auths" map (or a legacy .dockercfg). `strict` decodes
 * as the kubelet decodes a pull secret (DockerConfigEntry.UnmarshalJSON):
 * a field of the wrong type, an "auth" that is not base64 of
 * "user:password", is an error naming the entry's key and never its
 * content. Otherwise such entries are skipped. Entries with no credential
 * at all are skipped either way.
 */
export function decodeDockerAuths(auths: unknown, strict: boolean): DockerAuths {
  const entries: [string, PullAuth][] = [];
  const secrets = new Set<string>();
  if (auths === null || auths === undefined) return { entries, secrets: [] };
  if (!isObject(auths)) throw new DockerConfigError('"auths" is not an object');
  for (const [key, v] of Object.entries(auths)) {
    const bad = (what: string) => {
      if (strict) throw new DockerConfigError(`the entry ${JSON.stringify(key.slice(0, 200))} ${what}`);
    };
    if (!isObject(v)) {
      bad('is not an object');
      continue;
    }
    const auth: PullAuth = {};
    for (const f of ['username', 'password', 'email', 'auth'] as const) {
      if (v[f] !== undefined && v[f] !== null && typeof v[f] !== 'string') bad(`has a "${f}" that is not a string`);
    }
    if (typeof v.username === 'string' && v.username) auth.username = v.username;
    if (typeof v.password === 'string' && v.password) auth.password = v.password;
    if (typeof v.auth === 'string' && v.auth) {
      secrets.add(v.auth);
      const decoded = strict ? strictBase64(v.auth) : Buffer.from(v.auth, 'base64');
      const text = decoded?.toString('utf8') ?? '';
      const colon = text.indexOf(':');
      if (decoded === null) bad('has an "auth" that is not base64');
      else if (colon < 0) bad('has an "auth" that is not base64 of "user:password"');
      if (decoded !== null && colon >= 0) {
        auth.username = text.slice(0, colon);
        auth.password = text.slice(colon + 1);
      }
    }
    if (typeof v.identitytoken === 'string' && v.identitytoken) auth.identityToken = v.identitytoken;
    if (typeof v.registrytoken === 'string' && v.registrytoken) auth.registryToken = v.registrytoken;
    for (const s of [auth.password, auth.identityToken, auth.registryToken]) if (s) secrets.add(s);
    if (!auth.username && !auth.identityToken && !auth.registryToken) continue;
    // serverAddress stays empty, as the kubelet leaves it for credentials
    // from a config: the agent already chose this registry's entry, and
    // containerd drops credentials whose serverAddress (read as a URL)
    // names no host it is connecting to, which a bare "host:port" does not.
    entries.push([key, auth]);
  }
  return { entries, secrets: [...secrets].filter((s) => s.length >= MIN_SCRUBBED_LENGTH) };
}

/** Secrets shorter than this are not scrubbed: replacing every "ab" in a message would hide it, and such a secret hides nothing. */
export const MIN_SCRUBBED_LENGTH = 3;

/** Replace every secret in `text`. */
export function scrubSecrets(text: string, secrets: readonly string[]): string {
  let out = text;
  for (const s of secrets) out = out.split(s).join('[redacted]');
  return out;
}

export class AuthFile {
  readonly path: string;
  private keyring = new Keyring();
  private entryList: [string, PullAuth][] = [];
  private secrets: string[] = [];
  private mtimeMs = -1;
  private helpers: Record<string, string> = {};
  private store: string | undefined;
  /** Why the file could not be used, if it could not (it is then treated as empty). */
  problem: string | undefined;

  constructor(path: string) {
    this.path = path;
  }

  /** Re-read the file if it changed. A missing file means anonymous pulls. */
  async refresh(): Promise<void> {
    let st;
    try {
      st = await fsp.stat(this.path);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') {
        this.load({ auths: {} });
        this.mtimeMs = -1;
        this.problem = undefined;
        return;
      }
      throw e;
    }
    if (st.mtimeMs === this.mtimeMs) return;
    this.mtimeMs = st.mtimeMs;
    let text: string;
    try {
      text = await readRegularFile(this.path, { maxBytes: AUTH_FILE_MAX_BYTES, what: 'the auth file' });
    } catch (e) {
      this.load({ auths: {} });
      this.problem = `${e instanceof ReadRefusedError ? e.message : `${this.path} cannot be read: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`}; pulling anonymously`;
      return;
    }
    try {
      this.load(JSON.parse(text));
      this.problem = undefined;
    } catch (e) {
      this.load({ auths: {} });
      // The message of a JSON parse error can quote the file's text: never pass it on.
      this.problem = `${this.path} is not a docker config.json (${(e as Error).name}); pulling anonymously`;
    }
  }

  load(doc: unknown): void {
    const d = isObject(doc) ? doc : {};
    const helpers = isObject(d.credHelpers) ? (Object.fromEntries(Object.entries(d.credHelpers).filter(([, v]) => typeof v === 'string' && v)) as Record<string, string>) : {};
    const store = typeof d.credsStore === 'string' && d.credsStore ? d.credsStore : undefined;
    if (!isObject(d.auths) && Object.keys(helpers).length === 0 && !store) throw new TypeError('no "auths" object');
    const { entries, secrets } = decodeDockerAuths(isObject(d.auths) ? d.auths : {}, false);
    const keyring = new Keyring();
    keyring.add(entries, (key) => `the auth file ${this.path} (entry ${key})`);
    this.keyring = keyring;
    this.entryList = entries;
    this.secrets = secrets;
    this.helpers = helpers;
    this.store = store;
  }

  /** Every credential for an image at host/path, the most specific key first. */
  lookup(host: string, path: string): Credential[] {
    return this.keyring.lookup(`${host}/${path}`);
  }

  /** The entries as read, for a keyring that combines sources (./node-credentials.ts). */
  entries(): [string, PullAuth][] {
    return this.entryList.map(([k, a]) => [k, { ...a }]);
  }

  /** The credential helper for a registry host: credHelpers' entry, else credsStore (docker's order). */
  helperFor(host: string): { helper: string; store: boolean } | undefined {
    const named = this.helpers[host];
    if (named) return { helper: named, store: false };
    return this.store ? { helper: this.store, store: true } : undefined;
  }

  /** Replace every known secret in `text` (an error message from a runtime, say). */
  scrub(text: string): string {
    return scrubSecrets(text, this.secrets);
  }

  get size(): number {
    return this.entryList.length;
  }
}
