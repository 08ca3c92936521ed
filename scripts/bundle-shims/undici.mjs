// What the bundle takes from undici: Agent, ProxyAgent and fetch for
// @kubernetes/client-node (dist/config.js, watch.js,
// gen/http/isomorphic-fetch.js), EnvHttpProxyAgent, buildConnector, request
// and the redirect interceptor for src/registry/. Without the rest of undici's
// index.js: MockAgent, WebSocket, EventSource, the cache stores, the other
// interceptors, pools and the cookie helpers.
// undici is CommonJS, so the bundler cannot drop the unused parts of its
// index by itself. scripts/build.ts resolves `undici` here for the bundle;
// the names are exported one by one, so an import of anything else fails
// the build instead of being undefined at run time: add it here.
import Agent from 'undici/lib/dispatcher/agent.js';
import buildConnector from 'undici/lib/core/connect.js';
import EnvHttpProxyAgent from 'undici/lib/dispatcher/env-http-proxy-agent.js';
import ProxyAgent from 'undici/lib/dispatcher/proxy-agent.js';
import fetchModule from 'undici/lib/web/fetch/index.js';
import apiRequest from 'undici/lib/api/api-request.js';
import redirect from 'undici/lib/interceptor/redirect.js';
// As undici's index.js does: the global dispatcher that fetch() falls back to.
import 'undici/lib/global.js';

export { Agent, buildConnector, EnvHttpProxyAgent, ProxyAgent };

export const interceptors = { redirect };

/** undici's request(url, opts) as its index.js makes it (its makeDispatcher), for a URL and an explicit dispatcher. */
export function request(url, opts) {
  const u = url instanceof URL ? url : new URL(url);
  const { dispatcher, ...rest } = opts;
  if (!dispatcher) throw new Error('request: the registry client always names its dispatcher');
  return apiRequest.call(dispatcher, { ...rest, origin: u.origin, path: u.search ? `${u.pathname}${u.search}` : u.pathname, method: opts.method || (opts.body ? 'PUT' : 'GET') });
}

export function fetch(init, options = undefined) {
  return fetchModule.fetch(init, options);
}
