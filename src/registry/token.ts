// A bearer token from a registry's token service
// (https://distribution.github.io/distribution/spec/auth/token/): a GET
// with the registry's credentials (basic), or an OAuth2 refresh-token
// grant with docker login's identity token; the answer's `token` (or
// `access_token`) and its lifetime. Failures are AttemptErrors that name
// the token service and never a secret.
import { request, type Dispatcher } from 'undici';
import type { PullAuth } from '../cri/runtime.ts';
import { type Answer, AttemptError, type Challenge, describeBody, kindOfStatus, networkMessage } from './http.ts';

export interface TokenRequest {
  challenge: Challenge;
  auth: PullAuth | undefined;
  /** e.g. repository:<path>:pull */
  scope: string;
  dispatcher: Dispatcher;
  timeoutMs: number;
  userAgent: string;
  /** Removes known secrets from a refusal's body before it goes into an error. */
  scrub: (text: string) => string;
  signal?: AbortSignal;
}

export async function requestToken(o: TokenRequest): Promise<{ token: string; ttlSeconds: number }> {
  const { challenge, auth, scope, dispatcher, signal } = o;
  let realm: URL;
  try {
    realm = new URL(challenge.realm!);
    if (realm.protocol !== 'https:' && realm.protocol !== 'http:') throw new Error('not http(s)');
  } catch {
    throw new AttemptError('Unauthorized', `named a token realm that is not an http(s) URL: ${JSON.stringify(challenge.realm).slice(0, 200)}`);
  }
  const timeout = AbortSignal.timeout(o.timeoutMs);
  const sig = signal ? AbortSignal.any([signal, timeout]) : timeout;
  let res: Answer;
  try {
    if (auth?.identityToken) {
      // OAuth2 refresh-token grant (docker login's identity token).
      const form = new URLSearchParams({ grant_type: 'refresh_token', refresh_token: auth.identityToken, client_id: o.userAgent, scope });
      if (challenge.service) form.set('service', challenge.service);
      res = await request(realm, { method: 'POST', body: form.toString(), headers: { 'content-type': 'application/x-www-form-urlencoded', 'user-agent': o.userAgent }, dispatcher, signal: sig });
    } else {
      if (challenge.service) realm.searchParams.set('service', challenge.service);
      realm.searchParams.set('scope', scope);
      const headers: Record<string, string> = { 'user-agent': o.userAgent };
      if (auth?.username && auth.password !== undefined) headers.authorization = `Basic ${Buffer.from(`${auth.username}:${auth.password}`).toString('base64')}`;
      res = await request(realm, { method: 'GET', headers, dispatcher, signal: sig });
    }
  } catch (e) {
    if (signal?.aborted) throw signal.reason ?? e;
    throw new AttemptError('Unavailable', `sent clients to its token service at ${realm.host}, which cannot be reached: ${networkMessage(e)}`);
  }
  const text = await res.body.text().catch(() => '');
  if (res.statusCode < 200 || res.statusCode >= 300) {
    const who = auth?.username ? `the credentials of ${auth.username}` : auth?.identityToken ? 'the identity token' : 'an anonymous token request';
    throw new AttemptError(res.statusCode === 401 || res.statusCode === 403 ? 'Unauthorized' : kindOfStatus(res.statusCode), `token service at ${realm.host} refused ${who}: HTTP ${res.statusCode} ${describeBody(o.scrub(text))}`);
  }
  let doc: { token?: unknown; access_token?: unknown; expires_in?: unknown };
  try {
    doc = JSON.parse(text);
  } catch {
    throw new AttemptError('Unauthorized', `token service at ${realm.host} answered something that is not JSON`);
  }
  const token = typeof doc.token === 'string' && doc.token ? doc.token : typeof doc.access_token === 'string' ? doc.access_token : '';
  if (!token) throw new AttemptError('Unauthorized', `token service at ${realm.host} answered without a token`);
  return { token, ttlSeconds: typeof doc.expires_in === 'number' && doc.expires_in > 0 ? doc.expires_in : 60 };
}
