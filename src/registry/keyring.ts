// Registry credentials matched to an image as the kubelet matches them
// (Kubernetes 1.32, pkg/credentialprovider/keyring.go), for the auth file,
// pull secrets and credential provider plugins alike:
// - a key is a schemeless URL: host[:port][/path]; a scheme is allowed and
//   dropped, and a path of /v1/ or /v2/ counts as none (Docker Hub's
//   https://index.docker.io/v1/ is the host index.docker.io);
// - a key matches an image when both hosts have the same number of DNS
//   labels, each label of the key is a glob (Go's filepath.Match: *, ?,
//   [a-z], [^x]) that matches the image's label, the ports are equal, and
//   the key's path is a prefix of the image's path as a string
//   (quay.io/team-a matches quay.io/team-ab/app, as in the kubelet);
// - lookup returns EVERY matching credential, keys in reverse lexical
//   order (longer, more specific keys first), credentials of one key in
//   the order they were added; with none, an index.docker.io entry serves
//   an image of Docker Hub.
// Hosts are compared as written (no case folding), as Go's url.Parse
// leaves them. The URL parsing follows Go's net/url closely enough that a
// key the kubelet refuses (a space or `|` in the host, a port that is not
// a number, a bad % escape) is refused here too.
import type { PullAuth } from '../cri/runtime.ts';

/** A credential to try, and where it came from (for messages: never the secret). */
export interface Credential {
  auth: PullAuth;
  from: string;
}

export interface SchemelessUrl {
  host: string;
  path: string;
}

/** Characters Go's net/url refuses in a host (shouldEscape in encodeHost mode). */
const BAD_HOST_CHAR = /[ {}|\\^`]/;

function unescapeUrl(s: string, what: 'host' | 'path'): string {
  if (!s.includes('%')) return s;
  const bytes: number[] = [];
  for (let i = 0; i < s.length; i++) {
    if (s[i] !== '%') {
      bytes.push(...Buffer.from(s[i]!, 'utf8'));
      continue;
    }
    const hex = s.slice(i + 1, i + 3);
    if (!/^[0-9a-fA-F]{2}$/.test(hex)) throw new Error(`invalid URL escape ${JSON.stringify(s.slice(i, i + 3))}`);
    // In a host only non-ASCII bytes (and %25) may be escaped.
    if (what === 'host' && parseInt(hex[0]!, 16) < 8 && hex !== '25') throw new Error(`invalid URL escape ${JSON.stringify(s.slice(i, i + 3))}`);
    bytes.push(parseInt(hex, 16));
    i += 2;
  }
  return Buffer.from(bytes).toString('utf8');
}

/** Go's url.Parse("https://" + s), keeping what the keyring reads: host (with port) and path. Throws as Go would. */
export function parseSchemelessUrl(s: string): SchemelessUrl {
  return parseUrl(`https://${s}`);
}

function parseUrl(raw: string): SchemelessUrl {
  const quoted = JSON.stringify(raw);
  if (/[\x00-\x1f\x7f]/.test(raw)) throw new Error(`parse ${quoted}: net/url: invalid control character in URL`);
  let rest = raw.split('#')[0]!;
  rest = rest.slice(rest.indexOf('://') + 3);
  const q = rest.indexOf('?');
  if (q >= 0) rest = rest.slice(0, q);
  const slash = rest.indexOf('/');
  let authority = slash >= 0 ? rest.slice(0, slash) : rest;
  const path = slash >= 0 ? rest.slice(slash) : '';
  const at = authority.lastIndexOf('@');
  if (at >= 0) {
    if (!/^[A-Za-z0-9\-._:~!$&'()*+,;=%@]*$/.test(authority.slice(0, at))) throw new Error(`parse ${quoted}: net/url: invalid userinfo`);
    authority = authority.slice(at + 1);
  }
  let host = authority;
  if (host.startsWith('[')) {
    const end = host.lastIndexOf(']');
    if (end < 0) throw new Error(`parse ${quoted}: missing ']' in host`);
    if (!/^(:[0-9]*)?$/.test(host.slice(end + 1))) throw new Error(`parse ${quoted}: invalid port ${JSON.stringify(host.slice(end + 1))} after host`);
  } else {
    const colon = host.lastIndexOf(':');
    if (colon >= 0 && !/^:[0-9]*$/.test(host.slice(colon))) throw new Error(`parse ${quoted}: invalid port ${JSON.stringify(host.slice(colon))} after host`);
  }
  const bad = BAD_HOST_CHAR.exec(host);
  if (bad) throw new Error(`parse ${quoted}: invalid character ${JSON.stringify(bad[0])} in host name`);
  try {
    host = unescapeUrl(host, 'host');
    return { host, path: unescapeUrl(path, 'path') };
  } catch (e) {
    throw new Error(`parse ${quoted}: ${(e as Error).message}`);
  }
}

/** Go's net.SplitHostPort; null where it fails (the kubelet then takes the whole host and no port). */
function splitHostPort(hostport: string): { host: string; port: string } | null {
  let host: string;
  let port: string;
  if (hostport.startsWith('[')) {
    const end = hostport.indexOf(']');
    if (end < 0 || hostport[end + 1] !== ':') return null;
    host = hostport.slice(1, end);
    port = hostport.slice(end + 2);
  } else {
    const i = hostport.lastIndexOf(':');
    if (i < 0) return null;
    host = hostport.slice(0, i);
    port = hostport.slice(i + 1);
    if (host.includes(':')) return null;
  }
  if (/[[\]]/.test(host) || /[[\]]/.test(port)) return null;
  return { host, port };
}

function hostParts(url: SchemelessUrl): { parts: string[]; port: string } {
  const hp = splitHostPort(url.host);
  return { parts: (hp ? hp.host : url.host).split('.'), port: hp ? hp.port : '' };
}

/** A bad pattern, as Go's filepath.ErrBadPattern. */
const BAD = Symbol('bad pattern');

/** Go's filepath.Match on Unix, over code points. Returns BAD for a malformed pattern. */
export function globMatch(pattern: string, name: string): boolean | typeof BAD {
  let pat = Array.from(pattern);
  let s = Array.from(name);
  const scanChunk = (p: string[]): { star: boolean; chunk: string[]; rest: string[] } => {
    let star = false;
    while (p[0] === '*') {
      p = p.slice(1);
      star = true;
    }
    let inRange = false;
    let i = 0;
    for (; i < p.length; i++) {
      const c = p[i];
      if (c === '\\') {
        if (i + 1 < p.length) i++;
      } else if (c === '[') inRange = true;
      else if (c === ']') inRange = false;
      else if (c === '*' && !inRange) break;
    }
    return { star, chunk: p.slice(0, i), rest: p.slice(i) };
  };
  const getEsc = (chunk: string[]): { r: string; rest: string[] } | typeof BAD => {
    if (chunk.length === 0 || chunk[0] === '-' || chunk[0] === ']') return BAD;
    if (chunk[0] === '\\') {
      chunk = chunk.slice(1);
      if (chunk.length === 0) return BAD;
    }
    const rest = chunk.slice(1);
    return rest.length === 0 ? BAD : { r: chunk[0]!, rest };
  };
  const matchChunk = (chunk: string[], str: string[]): { rest: string[] } | null | typeof BAD => {
    let failed = false;
    while (chunk.length > 0) {
      if (!failed && str.length === 0) failed = true;
      const c = chunk[0];
      if (c === '[') {
        const r = failed ? '' : str[0]!;
        if (!failed) str = str.slice(1);
        chunk = chunk.slice(1);
        let negated = false;
        if (chunk[0] === '^') {
          negated = true;
          chunk = chunk.slice(1);
        }
        let match = false;
        let ranges = 0;
        for (;;) {
          if (chunk[0] === ']' && ranges > 0) {
            chunk = chunk.slice(1);
            break;
          }
          const lo = getEsc(chunk);
          if (lo === BAD) return BAD;
          chunk = lo.rest;
          let hi = lo.r;
          if (chunk[0] === '-') {
            const h = getEsc(chunk.slice(1));
            if (h === BAD) return BAD;
            chunk = h.rest;
            hi = h.r;
          }
          if (r !== '' && lo.r.codePointAt(0)! <= r.codePointAt(0)! && r.codePointAt(0)! <= hi.codePointAt(0)!) match = true;
          ranges++;
        }
        if (match === negated) failed = true;
      } else if (c === '?') {
        if (!failed) {
          if (str[0] === '/') failed = true;
          str = str.slice(1);
        }
        chunk = chunk.slice(1);
      } else {
        if (c === '\\') {
          chunk = chunk.slice(1);
          if (chunk.length === 0) return BAD;
        }
        if (!failed) {
          if (chunk[0] !== str[0]) failed = true;
          str = str.slice(1);
        }
        chunk = chunk.slice(1);
      }
    }
    return failed ? null : { rest: str };
  };
  outer: while (pat.length > 0) {
    const { star, chunk, rest } = scanChunk(pat);
    pat = rest;
    if (star && chunk.length === 0) return !s.includes('/');
    const m = matchChunk(chunk, s);
    if (m !== null && m !== BAD && (m.rest.length === 0 || pat.length > 0)) {
      s = m.rest;
      continue;
    }
    if (m === BAD) return BAD;
    if (star) {
      for (let i = 0; i < s.length && s[i] !== '/'; i++) {
        const t = matchChunk(chunk, s.slice(i + 1));
        if (t !== null && t !== BAD) {
          if (pat.length === 0 && t.rest.length > 0) continue;
          s = t.rest;
          continue outer;
        }
        if (t === BAD) return BAD;
      }
    }
    while (pat.length > 0) {
      const next = scanChunk(pat);
      pat = next.rest;
      if (matchChunk(next.chunk, []) === BAD) return BAD;
    }
    return false;
  }
  return s.length === 0;
}

/** The kubelet's URLsMatchStr: does the key (or matchImages entry) `glob` match `target` (host/path of an image)? */
export function urlsMatch(glob: string, target: string): boolean {
  let g: SchemelessUrl;
  let t: SchemelessUrl;
  try {
    g = parseSchemelessUrl(glob);
    t = parseSchemelessUrl(target);
  } catch {
    return false;
  }
  const gh = hostParts(g);
  const th = hostParts(t);
  if (gh.port !== th.port || gh.parts.length !== th.parts.length) return false;
  if (!t.path.startsWith(g.path)) return false;
  return gh.parts.every((p, i) => globMatch(p, th.parts[i]!) === true);
}

/** Would an image of this name be pulled from Docker Hub (keyring.go isDefaultRegistryMatch)? */
export function isDefaultRegistryMatch(image: string): boolean {
  const slash = image.indexOf('/');
  const first = slash < 0 ? image : image.slice(0, slash);
  if (first === '') return false;
  if (slash < 0) return true;
  if (first === 'docker.io' || first === 'index.docker.io') return true;
  return !/[.:]/.test(first);
}

const DEFAULT_REGISTRY_HOST = 'index.docker.io';

/** The kubelet's BasicDockerKeyring. */
export class Keyring {
  private index: string[] = [];
  private readonly creds = new Map<string, Credential[]>();

  /**
   * Adds entries keyed as in a docker config ("https://quay.io/v1/",
   * "*.example.com", "registry:5000/team"). A key that does not parse is
   * skipped (the kubelet logs it and goes on); `from` names each entry for messages.
   */
  add(entries: Iterable<readonly [string, PullAuth]>, from: (key: string) => string): string[] {
    const skipped: string[] = [];
    for (const [loc, auth] of entries) {
      let parsed: SchemelessUrl;
      try {
        parsed = /^https?:\/\//.test(loc) ? parseUrl(loc) : parseSchemelessUrl(loc);
      } catch {
        skipped.push(loc);
        continue;
      }
      let p = parsed.path;
      if (p.startsWith('/v2/') || p.startsWith('/v1/')) p = p.slice(3);
      const key = p.length > 0 && p !== '/' ? parsed.host + p : parsed.host;
      const list = this.creds.get(key) ?? [];
      list.push({ auth: { ...auth }, from: from(loc) });
      this.creds.set(key, list);
    }
    // Reverse lexical order (Go compares bytes): more specific keys first.
    this.index = [...this.creds.keys()].sort((a, b) => Buffer.compare(Buffer.from(b), Buffer.from(a)));
    return skipped;
  }

  /** Every credential for an image (host/path, no tag or digest), in the order to try them. */
  lookup(image: string): Credential[] {
    const out: Credential[] = [];
    for (const k of this.index) if (urlsMatch(k, image)) out.push(...this.creds.get(k)!);
    if (out.length === 0 && isDefaultRegistryMatch(image)) out.push(...(this.creds.get(DEFAULT_REGISTRY_HOST) ?? []));
    return out.map((c) => ({ auth: { ...c.auth }, from: c.from }));
  }

  get size(): number {
    return this.creds.size;
  }
}
