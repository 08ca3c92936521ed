'use strict'
// What @kubernetes/client-node takes from undici (Agent, ProxyAgent and
// fetch: dist/config.js, watch.js, gen/http/isomorphic-fetch.js), without
// the rest of undici's index.js: MockAgent, WebSocket, EventSource, the
// cache stores, interceptors, pools and the cookie helpers. undici is
// CommonJS, so the bundler cannot drop the unused parts of its index by
// itself. Used by scripts/build.ts in place of `undici` for the bundle.
const Agent = require('undici/lib/dispatcher/agent')
const ProxyAgent = require('undici/lib/dispatcher/proxy-agent')
const { fetch: fetchImpl } = require('undici/lib/web/fetch')
// As undici's index.js: installs the global dispatcher that fetch() falls back to.
require('undici/lib/global')

module.exports.Agent = Agent
module.exports.ProxyAgent = ProxyAgent
module.exports.fetch = function fetch (init, options = undefined) {
  return fetchImpl(init, options)
}
