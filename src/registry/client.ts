// A client for the part of the OCI distribution API pinset needs
// (https://github.com/opencontainers/distribution-spec/blob/main/spec.md):
// HEAD and GET of manifests by tag or digest, and GET of blobs, with
//   - Basic and Bearer token authentication: the WWW-Authenticate
//     challenge, a token request for scope repository:<path>:pull with the
//     registry's credentials (or an OAuth2 refresh token, or a registry
//     token used as is), tokens cached per scope until they expire
//     (https://distribution.github.io/distribution/spec/auth/token/);
//     every credential the source gives for the image is tried in turn
//     until one is let in (./credentials.ts), as the kubelet tries them;
//   - the node's mirrors from registries.conf, tried in order before the
//     registry itself, or containerd's registry hosts with their TLS,
//     headers and capabilities (./containerd-hosts.ts); a result always
//     names the image by its source name;
//   - digest verification of every manifest fetched by digest;
//   - per-request timeouts, and paced retries (capped exponential backoff
//     with jitter) of what is transient: connection failures, 429, 5xx;
//   - proxies and trust from the environment (./transport.ts).
// No credential or token appears in an error or a log line (./scrub.ts).
//
// Requests go through undici's request(), not fetch(): the agent runs
// without V8's optimizing compilers (scripts/build.ts NODE_FLAGS), where
// fetch's WHATWG machinery (Request, Headers, Response, web streams) cost
// about twice the CPU per manifest that request() does, and a size estimate
// asks for one manifest per image before any pull starts (BENCHMARKS.md,
// section 1). Redirects are followed by undici's redirect interceptor, which
// drops the Authorization header when a redirect leaves the origin, as
// fetch does.
//
// Why not a library: @snyk/docker-registry-v2-client (maintained, 2026) asks
// for a new token on every call (three round trips per manifest), has no
// HEAD of manifests, no mirrors, no refresh or registry tokens, and is
// built on needle, a second HTTP stack beside undici; docker-registry-client
// and oci-registry-client are unmaintained (last releases 2019 and 2024, on
// node-fetch 2). The protocol pinset needs fits in this file.
import type { Readable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { interceptors, request, type Dispatcher } from 'undici';
import type { BackoffPolicy } from '../util/backoff.ts';
import type { PullAuth } from '../cri/runtime.ts';
import { ANONYMOUS, failuresNote, type Credential, type CredentialSource, type ImageRef } from './credentials.ts';
import { MANIFEST_ACCEPT, MAX_MANIFEST_BYTES, ManifestError, parseManifest, type Manifest } from './manifest.ts';
import { formatImageName, manifestReference, repositoryOf, type ImageName } from './names.ts';
import { ContainerdHostsError, type ContainerdHosts } from './containerd-hosts.ts';
import { connectionOf, sourceUrl, tlsAdvice, withHostHeaders } from './pull-source.ts';
import { RegistriesConf, RegistriesConfError, type PullSource } from './registries-conf.ts';
import { Scrubber } from './scrub.ts';
import { requestToken } from './token.ts';
import { Transport } from './transport.ts';
import { type Answer, AttemptError, type Challenge, describeBody, discard, errorCode, header, isCertificateError, isTlsOrProtocolError, kindOfStatus, MAX_REDIRECTIONS, networkMessage, parseChallenge, readLimited, RegistryError, retryDelay, type RegistryErrorKind, sha256, type SourceFailure, TRANSIENT_STATUS } from './http.ts';

export { parseChallenge, RegistryError, type RegistryErrorKind, type SourceFailure } from './http.ts';

export interface ManifestHead {
  /** The manifest's digest (for a tag, what the registry resolved it to). */
  digest: string;
  mediaType: string;
  size: number;
  /** The registry that answered (a mirror's host, or the image's own). */
  registry: string;
}

export interface FetchedManifest extends ManifestHead {
  bytes: Buffer;
  manifest: Manifest;
}

export interface BlobStream {
  body: Readable;
  size: number | undefined;
  registry: string;
}

export interface RegistryClientOptions {
  credentials?: CredentialSource;
  registries?: RegistriesConf;
  /** containerd's registry hosts: used instead of `registries` when given. */
  containerdHosts?: ContainerdHosts;
  transport?: Transport;
  /** Deadline for one request's answer (headers, and the body of a manifest). Default 30 s. */
  timeoutMs?: number;
  /** Attempts per request for transient failures. Default 4. */
  attempts?: number;
  retryPolicy?: BackoffPolicy;
  userAgent?: string;
  /** Debug lines (one object each); never carries a secret. */
  debug?: (fields: Record<string, unknown>, msg: string) => void;
  /** Manifests cached by digest (immutable). Default 4096. */
  cacheEntries?: number;
}

interface EndpointState {
  scheme?: 'https' | 'http';
  challenge?: Challenge;
}

/** A source, and the image as its set names it (for credentials chosen by set). */
type Source = PullSource & { origin: NonNullable<ImageRef['origin']> };

interface CachedToken {
  value: string;
  expiresAt: number;
}

export class RegistryClient {
  readonly registries: RegistriesConf;
  readonly containerdHosts: ContainerdHosts | undefined;
  private readonly credentials: CredentialSource;
  private readonly transport: Transport;
  private readonly ownsTransport: boolean;
  /** The transport's dispatchers, following redirects. */
  private readonly verified: Dispatcher;
  private readonly unverified: Dispatcher;
  private readonly timeoutMs: number;
  private readonly attempts: number;
  private readonly retryPolicy: BackoffPolicy;
  private readonly userAgent: string;
  private readonly debug: (fields: Record<string, unknown>, msg: string) => void;
  private readonly cacheEntries: number;
  private readonly endpoints = new Map<string, EndpointState>();
  private readonly tokens = new Map<string, CachedToken>();
  private readonly tokenRequests = new Map<string, Promise<string>>();
  readonly scrubber: Scrubber;
  private readonly cache = new Map<string, FetchedManifest>();
  /** Requests sent, by method (for tests and benchmarks). */
  readonly requests = { manifest: 0, blob: 0, token: 0 };

  constructor(opts: RegistryClientOptions = {}) {
    this.registries = opts.registries ?? RegistriesConf.empty();
    this.containerdHosts = opts.containerdHosts;
    this.credentials = opts.credentials ?? ANONYMOUS;
    this.scrubber = new Scrubber(this.credentials);
    this.ownsTransport = !opts.transport;
    this.transport = opts.transport ?? new Transport();
    const redirects = interceptors.redirect({ maxRedirections: MAX_REDIRECTIONS });
    this.verified = this.transport.verified.compose(redirects);
    this.unverified = this.transport.unverified.compose(redirects);
    this.timeoutMs = opts.timeoutMs ?? 30_000;
    this.attempts = Math.max(1, opts.attempts ?? 4);
    this.retryPolicy = opts.retryPolicy ?? { baseMs: 250, capMs: 5_000 };
    this.userAgent = opts.userAgent ?? 'pinset';
    this.debug = opts.debug ?? (() => {});
    this.cacheEntries = opts.cacheEntries ?? 4096;
  }

  async close(): Promise<void> {
    if (this.ownsTransport) await this.transport.close();
  }

  /** The manifest's digest and type without its body (one HEAD; a GET when the registry sends no digest). */
  async head(name: ImageName, signal?: AbortSignal): Promise<ManifestHead> {
    if (name.digest) {
      const hit = this.cache.get(name.digest);
      if (hit) return { digest: hit.digest, mediaType: hit.mediaType, size: hit.size, registry: hit.registry };
    }
    return this.fromSources(name, async (src) => {
      const res = await this.send(src, 'HEAD', `manifests/${manifestReference(name)}`, { accept: MANIFEST_ACCEPT }, signal);
      const digest = name.digest ?? header(res, 'docker-content-digest') ?? undefined;
      if (!digest || !/^sha256:[a-f0-9]{64}$/.test(digest)) return this.getFrom(src, name, signal);
      return {
        digest,
        mediaType: (header(res, 'content-type') ?? '').split(';')[0]!.trim(),
        size: Number(header(res, 'content-length') ?? 0),
        registry: src.host,
      };
    });
  }

  /** The manifest, parsed; by digest it is verified, and served from the cache once fetched. */
  async manifest(name: ImageName, signal?: AbortSignal): Promise<FetchedManifest> {
    if (name.digest) {
      const hit = this.cache.get(name.digest);
      if (hit) {
        // Refresh its place in the LRU order.
        this.cache.delete(name.digest);
        this.cache.set(name.digest, hit);
        return hit;
      }
    }
    return this.fromSources(name, (src) => this.getFrom(src, name, signal));
  }

  /** A blob's content as a stream (the caller reads or destroys it). Not verified here: callers that need it hash it. */
  async blob(name: ImageName, digest: string, signal?: AbortSignal): Promise<BlobStream> {
    const withDigest: ImageName = { host: name.host, path: name.path, digest };
    return this.fromSources(withDigest, async (src) => {
      const res = await this.send(src, 'GET', `blobs/${digest}`, {}, signal, { bodyFollows: true });
      this.requests.blob++;
      const len = Number(header(res, 'content-length') ?? NaN);
      return { body: res.body, size: Number.isFinite(len) ? len : undefined, registry: src.host };
    });
  }

  private async getFrom(src: Source, name: ImageName, signal?: AbortSignal): Promise<FetchedManifest> {
    const res = await this.send(src, 'GET', `manifests/${manifestReference(name)}`, { accept: MANIFEST_ACCEPT }, signal, { bodyFollows: true });
    this.requests.manifest++;
    const bytes = await readLimited(res, MAX_MANIFEST_BYTES);
    const digest = sha256(bytes);
    if (name.digest && digest !== name.digest) {
      throw new AttemptError('Invalid', `sent a manifest whose digest is ${digest}, not the ${name.digest} asked for`);
    }
    const announced = header(res, 'docker-content-digest');
    if (!name.digest && announced && announced.startsWith('sha256:') && announced !== digest) {
      throw new AttemptError('Invalid', `sent a manifest whose digest is ${digest}, but announced ${announced}`);
    }
    const contentType = header(res, 'content-type');
    let manifest: Manifest;
    try {
      manifest = parseManifest(bytes, contentType);
    } catch (e) {
      throw new AttemptError('Invalid', (e as ManifestError).message);
    }
    const fetched: FetchedManifest = { digest, mediaType: manifest.mediaType, size: bytes.length, registry: src.host, bytes, manifest };
    this.cache.set(digest, fetched);
    while (this.cache.size > this.cacheEntries) this.cache.delete(this.cache.keys().next().value!);
    return fetched;
  }

  /** Whether the image is fetched from a mirror first (a host before the last, its own or containerd's `server`, which a hosts.toml may list as a [host] too); false when nothing may serve it. */
  async throughMirror(name: ImageName): Promise<boolean> {
    const found = await this.sources(name).catch(() => []);
    return found[0]?.mirror === true && found[0].host !== found.at(-1)!.host;
  }

  private sources = async (name: ImageName) => (this.containerdHosts ? await this.containerdHosts.sources(name) : this.registries.sources(name));

  /** Try each source in order; the first answer wins; otherwise one error naming what each said. */
  private async fromSources<T>(name: ImageName, op: (src: Source) => Promise<T>): Promise<T> {
    const image = formatImageName(name);
    const origin = { repository: repositoryOf(name), ...(name.digest ? { digest: name.digest } : {}) };
    const sources: Source[] = await this.sources(name).then((found) => found.map((s) => ({ ...s, origin })), (e: unknown) => {
      if (e instanceof RegistriesConfError || e instanceof ContainerdHostsError) throw new RegistryError('Blocked', image, `${image}: ${e.message}`);
      throw e;
    });
    const failures: SourceFailure[] = [];
    for (const src of sources) {
      try {
        return await op(src);
      } catch (e) {
        if (!(e instanceof AttemptError)) throw e;
        failures.push({ registry: src.host, mirror: src.mirror, kind: e.kind, message: this.scrubber.scrub(e.message, src) });
        if (src !== sources[sources.length - 1]) this.debug({ image, registry: src.host, err: failures.at(-1)!.message }, 'mirror failed; trying the next source');
      }
    }
    const kinds = new Set(failures.map((f) => f.kind));
    const kind: RegistryErrorKind = kinds.size === 1 ? failures[0]!.kind : [...kinds].every((k) => k === 'NotFound' || k === 'Unavailable') ? 'Unavailable' : failures.at(-1)!.kind;
    const parts = failures.map((f) => `${f.registry}${f.mirror ? ' (mirror)' : ''} ${f.message}`);
    throw new RegistryError(kind, image, `${image}: ${parts.join('; ')}`, failures);
  }

  private state(host: string): EndpointState {
    let s = this.endpoints.get(host);
    if (!s) this.endpoints.set(host, (s = {}));
    return s;
  }

  /**
   * One request to /v2/<path>/<suffix> at a source, with authentication and
   * retries. Resolves to a 2xx response (its body unread unless bodyFollows
   * is false, in which case it is discarded); throws AttemptError otherwise.
   */
  private async send(
    src: Source,
    method: 'GET' | 'HEAD',
    suffix: string,
    headers: Record<string, string>,
    signal: AbortSignal | undefined,
    opts: { bodyFollows?: boolean } = {},
  ): Promise<Answer> {
    // A containerd mirror is offered the credentials of the image's own registry.
    const who = src.credentialsOf ?? src;
    const { candidates, failures } = await this.credentials.credentialsFor({ host: who.host, path: who.path, origin: src.origin }, signal);
    const tries: (Credential | undefined)[] = candidates.length > 0 ? candidates : [undefined];
    const refused: string[] = [];
    for (let i = 0; ; i++) {
      try {
        return await this.sendAs(src, tries[i], method, suffix, headers, signal, opts);
      } catch (e) {
        if (!(e instanceof AttemptError) || e.kind !== 'Unauthorized') throw e;
        refused.push(e.message);
        // Refused: the next credential, as the kubelet tries each in turn.
        if (i < tries.length - 1) continue;
        throw new AttemptError('Unauthorized', refused.join('; ') + failuresNote(failures));
      }
    }
  }

  /** send() with one credential (undefined: anonymous). */
  private async sendAs(
    src: Source,
    credential: Credential | undefined,
    method: 'GET' | 'HEAD',
    suffix: string,
    headers: Record<string, string>,
    signal: AbortSignal | undefined,
    opts: { bodyFollows?: boolean },
  ): Promise<Answer> {
    const state = this.state(src.host);
    const auth = credential?.auth;
    const scope = `repository:${src.path}:pull`;
    let authorization: string | undefined;
    let triedChallenge = false;
    for (let attempt = 1; ; attempt++) {
      if (!authorization && state.challenge) {
        authorization = await this.authorization(src, state.challenge, auth, scope, signal);
        triedChallenge = true;
      }
      let res: Answer;
      try {
        res = await this.exchange(src, state, method, suffix, withHostHeaders(src, { 'user-agent': this.userAgent, ...headers, ...(authorization ? { authorization } : {}) }), signal);
      } catch (e) {
        if (signal?.aborted) throw signal.reason ?? e;
        if (e instanceof AttemptError) throw e;
        if (isCertificateError(e) || (isTlsOrProtocolError(e) && !src.endpoint.insecure && errorCode(e) !== 'ECONNRESET')) {
          // Not transient: retrying cannot change a certificate or a protocol.
          throw new AttemptError('Unavailable', `cannot be reached over TLS: ${networkMessage(e)} (${tlsAdvice(src)})`);
        }
        if (attempt >= this.attempts) throw new AttemptError('Unavailable', `cannot be reached: ${networkMessage(e)}`);
        await sleep(retryDelay(this.retryPolicy, attempt, undefined), undefined, { signal });
        continue;
      }
      if (res.statusCode === 401) {
        const challenge = parseChallenge(header(res, 'www-authenticate'));
        const body = method === 'HEAD' ? (await discard(res), '') : await res.body.text().catch(() => '');
        if (challenge && !triedChallenge) {
          state.challenge = challenge;
          authorization = await this.authorization(src, challenge, auth, scope, signal);
          triedChallenge = true;
          if (authorization) {
            attempt--; // the unauthenticated probe does not count as an attempt
            continue;
          }
        }
        const who = auth?.username ? `the credentials of ${auth.username} from ${credential!.from}` : auth ? `the token from ${credential!.from}` : 'anonymous access (no credentials for it)';
        throw new AttemptError('Unauthorized', `refused ${who}: HTTP 401${body ? ` ${describeBody(this.scrubber.scrub(body, src))}` : ''}`);
      }
      const status = res.statusCode;
      if (status >= 200 && status < 300) {
        if (!opts.bodyFollows) await discard(res);
        return res;
      }
      const body = method === 'HEAD' ? (await discard(res), '') : await res.body.text().catch(() => '');
      if (TRANSIENT_STATUS.has(status) && attempt < this.attempts) {
        await sleep(retryDelay(this.retryPolicy, attempt, header(res, 'retry-after')), undefined, { signal });
        continue;
      }
      if (method === 'HEAD') throw new AttemptError(kindOfStatus(status), `answered HTTP ${status}${status === 404 ? ': the manifest is unknown' : ''}`);
      const what = describeBody(this.scrubber.scrub(body, src));
      throw new AttemptError(kindOfStatus(status), `answered HTTP ${status}${what ? ` ${what}` : ''}`);
    }
  }

  /** The dispatcher for a source: its host's own TLS (containerd's hosts), or verifying unless it is insecure. */
  private dispatcher(src: PullSource): Dispatcher {
    const tls = src.connection?.tls;
    return tls ? this.transport.forHost(tls) : !src.connection && src.endpoint.insecure ? this.unverified : this.verified;
  }

  /** One HTTP exchange at the source, choosing https or (for an insecure registry, or containerd's fallback) http. */
  private async exchange(src: PullSource, state: EndpointState, method: 'GET' | 'HEAD', suffix: string, headers: Record<string, string | string[]>, signal?: AbortSignal): Promise<Answer> {
    const dispatcher = this.dispatcher(src);
    const possible = connectionOf(src).schemes;
    const schemes = state.scheme && possible.includes(state.scheme) ? [state.scheme] : possible;
    let lastError: unknown;
    for (const scheme of schemes) {
      const url = sourceUrl(src, scheme, suffix);
      const timeout = AbortSignal.timeout(this.timeoutMs);
      try {
        const res = await request(url, { method, headers, dispatcher, signal: signal ? AbortSignal.any([signal, timeout]) : timeout });
        state.scheme = scheme;
        return res;
      } catch (e) {
        lastError = e;
        // An insecure registry may speak plain HTTP: containers/image tries HTTPS, then HTTP.
        if (scheme === 'https' && schemes.length > 1 && (isTlsOrProtocolError(e) || errorCode(e) === 'ECONNREFUSED')) continue;
        throw e;
      }
    }
    throw lastError;
  }

  /** The Authorization header for a challenge, or undefined when there is nothing to offer. */
  private async authorization(src: PullSource, challenge: Challenge, auth: PullAuth | undefined, scope: string, signal?: AbortSignal): Promise<string | undefined> {
    if (challenge.scheme === 'basic') {
      if (auth?.username && auth.password !== undefined) return `Basic ${Buffer.from(`${auth.username}:${auth.password}`).toString('base64')}`;
      return undefined;
    }
    if (auth?.registryToken) return `Bearer ${auth.registryToken}`;
    if (!challenge.realm) throw new AttemptError('Unauthorized', 'asked for a bearer token without naming a realm to get it from');
    // Per credential, not per user name: candidates may share a user name with different passwords.
    const key = `${challenge.realm}\n${challenge.service ?? ''}\n${scope}\n${auth ? sha256(Buffer.from(JSON.stringify(auth))) : ''}`;
    const cached = this.tokens.get(key);
    if (cached && cached.expiresAt > Date.now()) return `Bearer ${cached.value}`;
    let pending = this.tokenRequests.get(key);
    if (!pending) {
      pending = this.fetchToken(src, challenge, auth, scope, key, signal).finally(() => this.tokenRequests.delete(key));
      this.tokenRequests.set(key, pending);
    }
    return `Bearer ${await pending}`;
  }

  private async fetchToken(src: PullSource, challenge: Challenge, auth: PullAuth | undefined, scope: string, key: string, signal?: AbortSignal): Promise<string> {
    this.requests.token++;
    const { token, ttlSeconds } = await requestToken({
      challenge,
      auth,
      scope,
      dispatcher: this.dispatcher(src),
      timeoutMs: this.timeoutMs,
      userAgent: this.userAgent,
      scrub: (t) => this.scrubber.scrub(t, src),
      signal,
    });
    // The spec's default lifetime is 60 s; renew a little early.
    this.tokens.set(key, { value: token, expiresAt: Date.now() + ttlSeconds * 900 });
    this.scrubber.addToken(token);
    return token;
  }
}
