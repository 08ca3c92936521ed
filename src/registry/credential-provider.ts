// One kubelet credential provider plugin, run as the kubelet 1.32 runs it
// (pkg/credentialprovider/plugin/plugin.go):
// - asked only for an image one of its matchImages matches (./keyring.ts
//   urlsMatch); the image is the repository, host/path without tag or
//   digest, as the kubelet's keyring lookup passes it;
// - `<bin-dir>/<name> <args...>` with the agent's environment overlaid by
//   the config's `env`, a CredentialProviderRequest {apiVersion, kind,
//   image} on stdin, a CredentialProviderResponse on stdout whose
//   apiVersion must be the provider's;
// - one minute at most (the kubelet's fixed bound), then the plugin and its
//   process group are killed (../util/bounded-exec.ts): a failure, never a
//   stuck pull;
// - the answer cached under the key its cacheKeyType names (Image: the
//   image; Registry: its host; Global: one entry) for its cacheDuration,
//   else the provider's defaultCacheDuration; 0 caches nothing; a lookup
//   tries the image's, the registry's, then the global entry; expired
//   entries are purged every 15 minutes;
// - concurrent requests for one image share one exec (the kubelet's
//   singleflight); requests for different images of one registry each exec
//   once, even when the answer turns out Registry-keyed, as in the kubelet.
// A failure is an error naming the plugin and the image, with its stderr
// (scrubbed of every secret the agent knows, and cut short); a response
// that cannot be decoded is never quoted, as it may hold credentials.
import path from 'node:path';
import type { PullAuth } from '../cri/runtime.ts';
import { runBounded } from '../util/bounded-exec.ts';
import type { CredentialProviderSpec } from './credential-provider-config.ts';
import { parseGoDuration } from './go-duration.ts';
import { urlsMatch } from './keyring.ts';

/** The kubelet's bound on one exec of a plugin. */
export const PLUGIN_TIMEOUT_MS = 60_000;
const CACHE_PURGE_INTERVAL_MS = 15 * 60_000;
const GLOBAL_CACHE_KEY = '<global>';
/** Of a failing plugin's stderr, this much goes into the error. */
const STDERR_IN_ERROR = 500;

export class CredentialProviderError extends Error {
  override name = 'CredentialProviderError';
  readonly provider: string;
  constructor(provider: string, message: string) {
    super(message);
    this.provider = provider;
  }
}

export interface ExecCredentialProviderOptions {
  binDir: string;
  timeoutMs?: number;
  /** The agent's environment, which the plugin's is built on. */
  environ?: NodeJS.ProcessEnv;
  /** Replaces every secret the agent knows in text that leaves it (stderr in an error). */
  scrub?: (text: string) => string;
  now?: () => number;
  /** Told of every exec, with its duration and whether it failed (metrics, benchmarks). */
  onExec?: (e: { provider: string; durationMs: number; ok: boolean }) => void;
}

interface CacheEntry {
  entries: [string, PullAuth][];
  expiresAt: number;
}

interface Response {
  cacheKeyType: 'Image' | 'Registry' | 'Global';
  cacheDurationMs: number | undefined;
  entries: [string, PullAuth][];
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** The host of an image, port included (the kubelet's parseRegistry). */
export function registryOf(image: string): string {
  return image.split('/')[0]!;
}

export class ExecCredentialProvider {
  readonly spec: CredentialProviderSpec;
  private readonly o: ExecCredentialProviderOptions;
  private readonly now: () => number;
  private readonly cache = new Map<string, CacheEntry>();
  private readonly inflight = new Map<string, Promise<Response>>();
  private lastPurge: number;
  /** Execs so far (for tests and benchmarks). */
  execs = 0;
  /** Every password this provider has answered with, so none is ever printed. */
  readonly secrets = new Set<string>();

  constructor(spec: CredentialProviderSpec, o: ExecCredentialProviderOptions) {
    this.spec = spec;
    this.o = o;
    this.now = o.now ?? Date.now;
    this.lastPurge = this.now();
    // The config's env may carry keys (AWS_SECRET_ACCESS_KEY and the like): never echoed either.
    for (const e of spec.env) if (e.value.length >= 6) this.secrets.add(e.value);
  }

  get name(): string {
    return this.spec.name;
  }

  /** Whether this provider is asked about an image (host/path). */
  matches(image: string): boolean {
    return this.spec.matchImages.some((m) => urlsMatch(m, image));
  }

  /** The plugin's auth entries for an image (host/path): cached, or from one exec shared by concurrent callers. Throws CredentialProviderError. */
  async provide(image: string): Promise<[string, PullAuth][]> {
    const cached = this.cached(image);
    if (cached) return cached;
    let pending = this.inflight.get(image);
    if (!pending) {
      pending = this.exec(image).finally(() => this.inflight.delete(image));
      this.inflight.set(image, pending);
    }
    const r = await pending;
    return r.entries.map(([k, a]) => [k, { ...a }]);
  }

  private cached(image: string): [string, PullAuth][] | undefined {
    const now = this.now();
    if (now > this.lastPurge + CACHE_PURGE_INTERVAL_MS) {
      for (const [k, e] of this.cache) if (now > e.expiresAt) this.cache.delete(k);
      this.lastPurge = now;
    }
    for (const key of [image, registryOf(image), GLOBAL_CACHE_KEY]) {
      const e = this.cache.get(key);
      if (!e) continue;
      if (now > e.expiresAt) {
        this.cache.delete(key);
        continue;
      }
      return e.entries.map(([k, a]) => [k, { ...a }]);
    }
    return undefined;
  }

  private async exec(image: string): Promise<Response> {
    const { spec } = this;
    const scrub = (t: string) => [...this.secrets].reduce((s, secret) => s.split(secret).join('[redacted]'), this.o.scrub ? this.o.scrub(t) : t);
    const fail = (why: string) => new CredentialProviderError(spec.name, `credential provider ${spec.name} failed for ${image}: ${why}`);
    const env: NodeJS.ProcessEnv = { ...(this.o.environ ?? process.env) };
    for (const e of spec.env) env[e.name] = e.value;
    this.execs++;
    const started = this.now();
    const run = await runBounded(path.join(this.o.binDir, spec.name), spec.args, {
      input: JSON.stringify({ apiVersion: spec.apiVersion, kind: 'CredentialProviderRequest', image }),
      env,
      timeoutMs: this.o.timeoutMs ?? PLUGIN_TIMEOUT_MS,
    });
    let response: Response | undefined;
    let error: CredentialProviderError | undefined;
    if (run.failure || run.code !== 0) {
      const how = run.failure ?? (run.signal ? `killed by ${run.signal}` : `exit status ${run.code}`);
      const stderr = scrub(run.stderr).replace(/[\x00-\x08\x0b-\x1f\x7f]/g, '').trim();
      const cut = stderr.length > STDERR_IN_ERROR ? `${stderr.slice(0, STDERR_IN_ERROR)}...` : stderr;
      error = fail(`${how}${cut ? `: ${cut}` : ''}`);
    } else {
      try {
        response = this.decode(run.stdout.toString('utf8'));
      } catch (e) {
        error = fail((e as Error).message);
      }
    }
    this.o.onExec?.({ provider: spec.name, durationMs: this.now() - started, ok: !error });
    if (error || !response) throw error;
    for (const [, a] of response.entries) if (a.password && a.password.length >= 3) this.secrets.add(a.password);
    this.remember(image, response);
    return response;
  }

  /** A CredentialProviderResponse, checked as the kubelet checks it; messages never quote what the plugin printed. */
  private decode(stdout: string): Response {
    let doc: unknown;
    try {
      doc = JSON.parse(stdout);
    } catch {
      throw new Error('error reading GVK from response: what it printed on stdout is not JSON');
    }
    if (!isObject(doc)) throw new Error('error reading GVK from response: what it printed on stdout is not a JSON object');
    const apiVersion = typeof doc.apiVersion === 'string' ? doc.apiVersion : '';
    if (apiVersion !== this.spec.apiVersion) {
      const shown = /^[a-z0-9.-]{1,100}\/[a-z0-9]{1,20}$/.test(apiVersion) ? apiVersion : apiVersion === '' ? '(none)' : '(not an API version)';
      throw new Error(`apiVersion from credential plugin response did not match expected apiVersion:${this.spec.apiVersion}, actual apiVersion:${shown}`);
    }
    const undecodable = new Error('error decoding credential provider plugin response from stdout');
    if (doc.kind !== 'CredentialProviderResponse') throw undecodable;
    for (const k of Object.keys(doc)) if (!['apiVersion', 'kind', 'cacheKeyType', 'cacheDuration', 'auth'].includes(k)) throw undecodable;
    let cacheDurationMs: number | undefined;
    if (doc.cacheDuration !== undefined && doc.cacheDuration !== null) {
      if (typeof doc.cacheDuration !== 'string') throw undecodable;
      try {
        cacheDurationMs = parseGoDuration(doc.cacheDuration);
      } catch {
        throw undecodable;
      }
    }
    const entries: [string, PullAuth][] = [];
    if (doc.auth !== undefined && doc.auth !== null) {
      if (!isObject(doc.auth)) throw undecodable;
      for (const [key, v] of Object.entries(doc.auth)) {
        if (!isObject(v) || Object.keys(v).some((k) => k !== 'username' && k !== 'password')) throw undecodable;
        if ((v.username !== undefined && typeof v.username !== 'string') || (v.password !== undefined && typeof v.password !== 'string')) throw undecodable;
        const auth: PullAuth = {};
        if (v.username) auth.username = v.username as string;
        if (v.password) auth.password = v.password as string;
        entries.push([key, auth]);
      }
    }
    const t = doc.cacheKeyType;
    if (t !== 'Image' && t !== 'Registry' && t !== 'Global') {
      throw new Error(`credential provider plugin did not return a valid cacheKeyType: ${typeof t === 'string' && /^[A-Za-z]{0,20}$/.test(t) ? JSON.stringify(t) : '(not a cache key type)'}`);
    }
    return { cacheKeyType: t, cacheDurationMs, entries };
  }

  private remember(image: string, r: Response): void {
    // An explicit 0 is not cached; no duration means the provider's default (0: not cached).
    const ms = r.cacheDurationMs ?? this.spec.defaultCacheDurationMs;
    if (ms <= 0) return;
    const key = r.cacheKeyType === 'Image' ? image : r.cacheKeyType === 'Registry' ? registryOf(image) : GLOBAL_CACHE_KEY;
    this.cache.set(key, { entries: r.entries, expiresAt: this.now() + ms });
  }

  /** Cached entries now (for tests). */
  get cacheSize(): number {
    return this.cache.size;
  }
}
