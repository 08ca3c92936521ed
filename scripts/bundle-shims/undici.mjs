// What the bundle takes from undici: Agent, ProxyAgent and fetch for
// @kubernetes/client-node (dist/config.js, watch.js,
// gen/http/isomorphic-fetch.js), EnvHttpProxyAgent, buildConnector and fetch
// for src/registry/. Without the rest of undici's index.js: MockAgent, WebSocket,
// EventSource, the cache stores, interceptors, pools and the cookie helpers.
// undici is CommonJS, so the bundler cannot drop the unused parts of its
// index by itself. scripts/build.ts resolves `undici` here for the bundle;
// the names are exported one by one, so an import of anything else fails
// the build instead of being undefined at run time: add it here.
import Agent from 'undici/lib/dispatcher/agent.js';
import buildConnector from 'undici/lib/core/connect.js';
import EnvHttpProxyAgent from 'undici/lib/dispatcher/env-http-proxy-agent.js';
import ProxyAgent from 'undici/lib/dispatcher/proxy-agent.js';
import fetchModule from 'undici/lib/web/fetch/index.js';
// As undici's index.js does: the global dispatcher that fetch() falls back to.
import 'undici/lib/global.js';

export { Agent, buildConnector, EnvHttpProxyAgent, ProxyAgent };

export function fetch(init, options = undefined) {
  return fetchModule.fetch(init, options);
}
