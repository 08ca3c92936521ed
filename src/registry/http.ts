// The registry's HTTP answers as the client (./client.ts) reads them: its
// errors and their kinds, WWW-Authenticate challenges, bodies read within a
// bound, and what a network failure says.
import { createHash } from 'node:crypto';
import type { Dispatcher } from 'undici';
import { backoffDelay, type BackoffPolicy } from '../util/backoff.ts';

export type RegistryErrorKind = 'NotFound' | 'Unauthorized' | 'Unavailable' | 'Blocked' | 'Invalid' | 'Other';

export interface SourceFailure {
  /** host[:port] asked. */
  registry: string;
  mirror: boolean;
  kind: RegistryErrorKind;
  message: string;
}

export class RegistryError extends Error {
  override name = 'RegistryError';
  readonly kind: RegistryErrorKind;
  /** The image as the caller named it. */
  readonly image: string;
  readonly failures: SourceFailure[];
  constructor(kind: RegistryErrorKind, image: string, message: string, failures: SourceFailure[] = []) {
    super(message);
    this.kind = kind;
    this.image = image;
    this.failures = failures;
  }
}

/** One failure at one registry, before the mirrors are summed up. */
export class AttemptError extends Error {
  readonly kind: RegistryErrorKind;
  constructor(kind: RegistryErrorKind, message: string) {
    super(message);
    this.kind = kind;
  }
}

export interface Challenge {
  scheme: 'basic' | 'bearer';
  realm?: string;
  service?: string;
}


/**
 * WWW-Authenticate: `Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull"`.
 * RFC 7235 auth-params; quoted strings may hold commas and escaped quotes.
 */
export function parseChallenge(header: string | null): Challenge | undefined {
  if (!header) return undefined;
  const m = /^\s*(\w+)\s*(.*)$/s.exec(header);
  if (!m) return undefined;
  const scheme = m[1]!.toLowerCase();
  if (scheme !== 'basic' && scheme !== 'bearer') return undefined;
  const params: Record<string, string> = {};
  const re = /([\w-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))\s*,?\s*/g;
  let p: RegExpExecArray | null;
  while ((p = re.exec(m[2]!)) !== null) {
    if (p[0] === '') break;
    params[p[1]!.toLowerCase()] = p[2] !== undefined ? p[2].replace(/\\(.)/g, '$1') : (p[3] ?? '');
  }
  return { scheme, realm: params.realm, service: params.service };
}

/** A distribution error body ({"errors":[{"code","message"}]}) in one line, else the start of the text. */
export function describeBody(text: string): string {
  try {
    const doc = JSON.parse(text) as { errors?: { code?: string; message?: string }[] };
    if (Array.isArray(doc.errors) && doc.errors.length > 0) {
      return doc.errors.map((e) => [e.code, e.message].filter(Boolean).join(': ')).join('; ');
    }
  } catch {
    // not JSON
  }
  return text.replace(/\s+/g, ' ').trim().slice(0, 200);
}

/** How long to wait before retry `attempt`: the policy's backoff, or the server's Retry-After (seconds) when longer, within the policy's cap. */
export function retryDelay(policy: BackoffPolicy, attempt: number, retryAfter: string | null | undefined): number {
  const ms = backoffDelay(policy, attempt);
  const ra = Number(retryAfter);
  return Number.isFinite(ra) && ra > 0 ? Math.min(policy.capMs, Math.max(ms, ra * 1000)) : ms;
}

export function kindOfStatus(status: number): RegistryErrorKind {
  if (status === 404) return 'NotFound';
  if (status === 401 || status === 403) return 'Unauthorized';
  if (status === 429 || status >= 500) return 'Unavailable';
  return 'Other';
}

export const TRANSIENT_STATUS = new Set([408, 429, 500, 502, 503, 504]);

export type NetError = { name?: string; message?: string; code?: unknown; cause?: NetError };

/** An error's code when it is a string (a DOMException's is a number). */
export function codeOf(e: NetError | undefined): string {
  return typeof e?.code === 'string' ? e.code : '';
}

/** The error that says what went wrong: undici's own, or the socket's or TLS's it wraps. */
export function rootCause(e: unknown): NetError {
  const err = e as NetError;
  return err?.cause && typeof err.cause === 'object' && (codeOf(err.cause) || !codeOf(err)) ? err.cause : err;
}

export function networkMessage(e: unknown): string {
  if ((e as NetError)?.name === 'TimeoutError') return 'no answer in time';
  const err = rootCause(e);
  const msg = err?.message ?? String(e);
  const code = codeOf(err);
  return code ? `${code}: ${msg}` : msg;
}

export function errorCode(e: unknown): string {
  return codeOf(rootCause(e));
}

export function isTlsOrProtocolError(e: unknown): boolean {
  const code = errorCode(e);
  const msg = rootCause(e)?.message ?? '';
  return code.startsWith('ERR_SSL') || code === 'EPROTO' || code === 'ECONNRESET' || /SSL|TLS|wrong version/i.test(msg);
}

export function isCertificateError(e: unknown): boolean {
  return /CERT|SELF_SIGNED|UNABLE_TO_VERIFY|UNABLE_TO_GET_ISSUER|ERR_TLS_CERT_ALTNAME/.test(errorCode(e));
}

/** An HTTP answer as undici's request() gives it. */
export type Answer = Dispatcher.ResponseData;

/** A response header's value (the first, if the server repeated it), or null. */
export function header(res: Answer, name: string): string | null {
  const v = res.headers[name];
  return v === undefined ? null : Array.isArray(v) ? (v[0] ?? null) : v;
}

/** Read and drop what is left of a body, so its connection can serve the next request. */
export async function discard(res: Answer): Promise<void> {
  await res.body.dump().catch(() => {});
}

/** Redirects followed per request (fetch's limit). */
export const MAX_REDIRECTIONS = 20;

export function sha256(data: Buffer): string {
  return `sha256:${createHash('sha256').update(data).digest('hex')}`;
}

export async function readLimited(res: Answer, limit: number): Promise<Buffer> {
  const declared = Number(header(res, 'content-length') ?? NaN);
  if (Number.isFinite(declared) && declared > limit) {
    res.body.destroy();
    throw new AttemptError('Invalid', `the manifest is ${declared} bytes, over the ${limit}-byte limit registries keep to`);
  }
  const chunks: Buffer[] = [];
  let total = 0;
  for await (const chunk of res.body) {
    total += (chunk as Buffer).length;
    if (total > limit) {
      res.body.destroy();
      throw new AttemptError('Invalid', `the manifest is over the ${limit}-byte limit registries keep to`);
    }
    chunks.push(chunk as Buffer);
  }
  return chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks);
}
