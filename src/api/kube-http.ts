// Plain HTTP(S) requests to the Kubernetes API with a KubeConfig's
// credentials, for what @kubernetes/client-node's own transport does badly
// for a long-lived node agent:
// - watches: client-node's Watch reads through undici, whose default
//   bodyTimeout (300 s, undici lib/dispatcher/client.js) cuts any watch that
//   is silent for 5 minutes, and its own 30 s idle limit cuts a quiet watch
//   sooner still; a real API server sends nothing on a quiet watch (no
//   bookmark until its watch cache has processed an event). Here the idle
//   limit is the caller's.
// - client certificates that rotate (the kubelet's
//   /var/lib/kubelet/pki/kubelet-client-current.pem): the files are read
//   again for every request, so a rotated certificate is used from the next
//   request on.
// Credentials (token, exec plugin, client certificate) come from
// KubeConfig.applyToHTTPSOptions and are never logged.
import http from 'node:http';
import https from 'node:https';
import type { KubeConfig } from '@kubernetes/client-node';

/** A failed request: the HTTP status and, when the server sent one, its metav1.Status. */
export class KubeApiError extends Error {
  readonly code: number;
  readonly reason: string | undefined;
  constructor(code: number, message: string, reason?: string) {
    super(message);
    this.code = code;
    this.reason = reason;
  }
}

export interface KubeHttpOptions {
  /** Sent as User-Agent; the API server names writes without a fieldManager after it. */
  userAgent?: string;
  /** How long to wait for response headers. */
  connectTimeoutMs?: number;
}

export type Query = Record<string, string | number | boolean | undefined>;

/** An open response body, read line by line. */
export interface OpenStream {
  /** Called with each complete line of the body. */
  onLine(fn: (line: string) => void): void;
  /** Called once when the body ends (err null) or fails. */
  onEnd(fn: (err: Error | null) => void): void;
  /** Called on every chunk of data (for idle limits). */
  onData(fn: () => void): void;
  abort(reason?: Error): void;
}

const DEFAULT_CONNECT_TIMEOUT_MS = 30_000;
/** Keepalive probes on idle connections, as client-go and client-node set them (30 s). */
const TCP_KEEPALIVE_MS = 30_000;

function statusMessage(code: number, text: string): { message: string; reason?: string } {
  try {
    const s = JSON.parse(text) as { kind?: string; message?: string; reason?: string };
    if (s && s.kind === 'Status') return { message: `HTTP ${code}: ${s.message ?? ''}`.trim(), reason: s.reason };
  } catch {
    // not JSON
  }
  return { message: `HTTP ${code}: ${text.slice(0, 200).trim() || http.STATUS_CODES[code] || 'error'}` };
}

export class KubeHttp {
  readonly #kc: KubeConfig;
  readonly #userAgent: string;
  readonly #connectTimeoutMs: number;
  readonly #httpAgent = new http.Agent({ keepAlive: true });
  readonly #httpsAgent = new https.Agent({ keepAlive: true });

  constructor(kc: KubeConfig, opts: KubeHttpOptions = {}) {
    this.#kc = kc;
    this.#userAgent = opts.userAgent ?? 'pinset';
    this.#connectTimeoutMs = opts.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS;
  }

  /** The server's base URL (the current context's cluster). */
  get server(): string {
    const cluster = this.#kc.getCurrentCluster();
    if (!cluster) throw new Error('the kubeconfig names no current cluster');
    return cluster.server;
  }

  url(path: string, query: Query = {}): URL {
    const url = new URL(this.server.replace(/\/+$/, '') + path);
    for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== '') url.searchParams.set(k, String(v));
    return url;
  }

  async #request(method: string, url: URL, headers: Record<string, string> = {}): Promise<http.ClientRequest> {
    const opts: https.RequestOptions = {};
    // Token (re-read from its file), exec plugins, client certificate files: all applied here.
    await this.#kc.applyToHTTPSOptions(opts);
    const proxied = Boolean(this.#kc.getCurrentCluster()?.proxyUrl);
    const secure = url.protocol === 'https:';
    const request: https.RequestOptions = {
      method,
      headers: { ...(opts.headers ?? {}), Accept: 'application/json', 'User-Agent': this.#userAgent, ...headers },
      auth: opts.auth,
      // client-node caches one agent per cluster and user, built with the
      // first certificate it read; these agents key connections by the TLS
      // options, so a rotated certificate gets a new connection.
      agent: proxied ? opts.agent : secure ? this.#httpsAgent : this.#httpAgent,
    };
    if (secure) {
      Object.assign(request, { ca: opts.ca, cert: opts.cert, key: opts.key, pfx: opts.pfx, passphrase: opts.passphrase, servername: opts.servername });
      if (opts.rejectUnauthorized !== undefined) request.rejectUnauthorized = opts.rejectUnauthorized;
    }
    const req = (secure ? https : http).request(url, request);
    req.on('socket', (s) => s.setKeepAlive(true, TCP_KEEPALIVE_MS));
    return req;
  }

  /** Resolves with the response once its headers arrive; rejects on a transport error or no headers in time. */
  async #send(method: string, url: URL, body?: string, headers: Record<string, string> = {}, signal?: AbortSignal): Promise<{ req: http.ClientRequest; res: http.IncomingMessage }> {
    // Content-Length always with a body: Node.js sends a DELETE's body
    // neither chunked nor measured, which a server reads as a malformed request.
    const req = await this.#request(method, url, body === undefined ? headers : { 'Content-Type': 'application/json', 'Content-Length': String(Buffer.byteLength(body)), ...headers });
    return await new Promise((resolve, reject) => {
      const timer = setTimeout(() => req.destroy(new Error(`no answer from ${url.host} within ${this.#connectTimeoutMs}ms`)), this.#connectTimeoutMs);
      const onAbort = () => req.destroy(signal?.reason instanceof Error ? signal.reason : new Error('aborted'));
      signal?.addEventListener('abort', onAbort, { once: true });
      req.once('error', (err) => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        reject(err);
      });
      req.once('response', (res) => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        resolve({ req, res });
      });
      req.end(body);
    });
  }

  async #readAll(res: http.IncomingMessage): Promise<string> {
    res.setEncoding('utf8');
    let text = '';
    for await (const chunk of res) text += chunk as string;
    return text;
  }

  /**
   * A request whose answer is JSON; a non-2xx status throws KubeApiError.
   * `accept` replaces the Accept header (e.g. to ask for metadata only).
   */
  async json<T>(method: string, path: string, query: Query = {}, body?: unknown, opts: { timeoutMs?: number; contentType?: string; accept?: string } = {}): Promise<T> {
    const url = this.url(path, query);
    const signal = AbortSignal.timeout(opts.timeoutMs ?? 60_000);
    const headers: Record<string, string> = {};
    if (opts.contentType) headers['Content-Type'] = opts.contentType;
    if (opts.accept) headers.Accept = opts.accept;
    const { res } = await this.#send(method, url, body === undefined ? undefined : JSON.stringify(body), headers, signal);
    const text = await this.#readAll(res);
    const code = res.statusCode ?? 0;
    if (code < 200 || code > 299) {
      const { message, reason } = statusMessage(code, text);
      throw new KubeApiError(code, message, reason);
    }
    return JSON.parse(text) as T;
  }

  /**
   * Open a streaming GET (a watch). Resolves once a 200 answer's headers are
   * in; any other status rejects with KubeApiError.
   */
  async stream(path: string, query: Query = {}, opts: { accept?: string } = {}): Promise<OpenStream> {
    const url = this.url(path, query);
    const { req, res } = await this.#send('GET', url, undefined, opts.accept ? { Accept: opts.accept } : {});
    const code = res.statusCode ?? 0;
    if (code !== 200) {
      const text = await this.#readAll(res).catch(() => '');
      const { message, reason } = statusMessage(code, text);
      throw new KubeApiError(code, message, reason);
    }
    res.setEncoding('utf8');
    const lineFns: ((line: string) => void)[] = [];
    const dataFns: (() => void)[] = [];
    let endFn: ((err: Error | null) => void) | undefined;
    let ended: { err: Error | null } | undefined;
    const end = (err: Error | null) => {
      if (ended) return;
      ended = { err };
      endFn?.(err);
    };
    let partial = '';
    res.on('data', (chunk: string) => {
      for (const f of dataFns) f();
      partial += chunk;
      let nl: number;
      while ((nl = partial.indexOf('\n')) >= 0) {
        const line = partial.slice(0, nl).trim();
        partial = partial.slice(nl + 1);
        if (line) for (const f of lineFns) f(line);
      }
    });
    res.on('end', () => end(null));
    res.on('aborted', () => end(new Error('the API server cut the watch')));
    res.on('error', (err) => end(err));
    req.on('error', (err) => end(err));
    res.on('close', () => end(res.complete ? null : new Error('the watch connection closed before its end')));
    return {
      onLine: (fn) => void lineFns.push(fn),
      onData: (fn) => void dataFns.push(fn),
      onEnd: (fn) => {
        endFn = fn;
        if (ended) fn(ended.err);
      },
      abort: (reason) => {
        end(reason ?? null);
        req.destroy();
      },
    };
  }

  close(): void {
    this.#httpAgent.destroy();
    this.#httpsAgent.destroy();
  }
}
