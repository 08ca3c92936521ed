// Registry credentials from a docker config.json, the format of the
// kubelet's /var/lib/kubelet/config.json: {"auths": {"<key>": {"auth":
// base64("user:pass")}}} (or username/password, identitytoken). Keys are
// matched the way the kubelet's credential provider does
// (pkg/credentialprovider/keyring.go): a key is a registry host optionally
// followed by a path prefix, may carry a scheme, and its host may start
// with "*." for one DNS label; the most specific key wins. Each image gets
// the credentials of its own registry only.
import * as fsp from 'node:fs/promises';
import type { PullAuth } from '../cri/runtime.ts';

interface Entry {
  host: string;
  pathPrefix: string;
  auth: PullAuth;
}

function parseKey(key: string): { host: string; pathPrefix: string } {
  let k = key.trim().replace(/^[a-z]+:\/\//i, '').replace(/\/+$/, '');
  // Docker Hub's legacy key.
  if (k === 'index.docker.io/v1') k = 'docker.io';
  const slash = k.indexOf('/');
  return slash < 0 ? { host: k.toLowerCase(), pathPrefix: '' } : { host: k.slice(0, slash).toLowerCase(), pathPrefix: k.slice(slash + 1) };
}

function hostMatches(pattern: string, host: string): boolean {
  if (pattern === host) return true;
  if (pattern.startsWith('*.')) {
    const dot = host.indexOf('.');
    return dot > 0 && host.slice(dot + 1) === pattern.slice(2);
  }
  return false;
}

export class AuthFile {
  readonly path: string;
  private entries: Entry[] = [];
  private secrets: string[] = [];
  private mtimeMs = -1;
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
        this.entries = [];
        this.mtimeMs = -1;
        this.problem = undefined;
        return;
      }
      throw e;
    }
    if (st.mtimeMs === this.mtimeMs) return;
    this.mtimeMs = st.mtimeMs;
    try {
      this.load(JSON.parse(await fsp.readFile(this.path, 'utf8')));
      this.problem = undefined;
    } catch (e) {
      this.entries = [];
      // The message of a JSON parse error can quote the file's text: never pass it on.
      this.problem = `${this.path} is not a docker config.json (${(e as Error).name}); pulling anonymously`;
    }
  }

  load(doc: unknown): void {
    const auths = (doc as { auths?: Record<string, Record<string, unknown>> })?.auths;
    if (typeof auths !== 'object' || auths === null) throw new TypeError('no "auths" object');
    const entries: Entry[] = [];
    const secrets = new Set<string>();
    for (const [key, v] of Object.entries(auths)) {
      if (typeof v !== 'object' || v === null) continue;
      const auth: PullAuth = {};
      if (typeof v.auth === 'string' && v.auth) {
        const decoded = Buffer.from(v.auth, 'base64').toString('utf8');
        const colon = decoded.indexOf(':');
        if (colon > 0) {
          auth.username = decoded.slice(0, colon);
          auth.password = decoded.slice(colon + 1);
        }
        secrets.add(v.auth);
      }
      if (typeof v.username === 'string' && v.username) auth.username = v.username;
      if (typeof v.password === 'string' && v.password) auth.password = v.password;
      if (typeof v.identitytoken === 'string' && v.identitytoken) auth.identityToken = v.identitytoken;
      if (typeof v.registrytoken === 'string' && v.registrytoken) auth.registryToken = v.registrytoken;
      for (const s of [auth.password, auth.identityToken, auth.registryToken]) if (s) secrets.add(s);
      if (!auth.username && !auth.identityToken && !auth.registryToken) continue;
      // serverAddress stays empty, as the kubelet leaves it for credentials
      // from a config.json: the agent already chose this registry's entry,
      // and containerd drops credentials whose serverAddress (read as a URL)
      // names no host it is connecting to, which a bare "host:port" does not.
      const { host, pathPrefix } = parseKey(key);
      entries.push({ host, pathPrefix, auth });
    }
    // Most specific first: exact host before wildcard, longer path prefix first.
    entries.sort((a, b) => Number(a.host.startsWith('*.')) - Number(b.host.startsWith('*.')) || b.pathPrefix.length - a.pathPrefix.length);
    this.entries = entries;
    this.secrets = [...secrets].filter((s) => s.length >= 3);
  }

  /** Credentials for an image at host/path, or undefined to pull anonymously. */
  authFor(host: string, path: string): PullAuth | undefined {
    const h = host.toLowerCase();
    for (const e of this.entries) {
      if (!hostMatches(e.host, h)) continue;
      if (e.pathPrefix && path !== e.pathPrefix && !path.startsWith(e.pathPrefix + '/')) continue;
      return { ...e.auth };
    }
    return undefined;
  }

  /** Replace every known secret in `text` (an error message from a runtime, say). */
  scrub(text: string): string {
    let out = text;
    for (const s of this.secrets) out = out.split(s).join('[redacted]');
    return out;
  }

  get size(): number {
    return this.entries.length;
  }
}
