// A kubelet credential provider plugin for the tests: it speaks the
// CredentialProviderRequest/Response protocol (credentialprovider.kubelet.k8s.io
// v1, v1beta1 and v1alpha1: it answers in the apiVersion it is asked in), so
// the same plugin and the same CredentialProviderConfig serve `pinset agent`
// and a real kubelet. Node.js builtins only; installed with a shebang naming
// this Node.js by test/support/credential-plugin.ts.
//
// What it does is set by environment variables (from the config's `env`, or
// the environment it inherits), each overridden by the JSON file
// TEST_PLUGIN_CONTROL names, which it reads at every exec (so a test changes
// its behaviour without restarting anything):
//   TEST_PLUGIN_USERNAME, TEST_PLUGIN_PASSWORD   the credential it answers with
//   TEST_PLUGIN_AUTH_KEY       the key of its auth map (default: the image's registry host)
//   TEST_PLUGIN_CACHE_KEY_TYPE Image, Registry (default) or Global
//   TEST_PLUGIN_CACHE_DURATION e.g. "10m", "0s"; absent: none (the provider's default applies)
//   TEST_PLUGIN_MODE           ok (default); fail (exit 1, printing TEST_PLUGIN_STDERR);
//                              hang (start a child in its process group, then never answer);
//                              garbage (print what is not JSON); wrong-api-version;
//                              bad-cache-key (cacheKeyType "Sometimes")
//   TEST_PLUGIN_STDERR         written to stderr in every mode
//   TEST_PLUGIN_DELAY_MS       wait this long before answering
//   TEST_PLUGIN_LOG            append one JSON line per exec: pid, process group,
//                              args, the request, the TEST_PLUGIN_* and PATH it saw,
//                              the pid of the child `hang` started
import { spawn } from 'node:child_process';
import { appendFileSync, readFileSync } from 'node:fs';

const env = { ...process.env };
if (env.TEST_PLUGIN_CONTROL) {
  try {
    Object.assign(env, JSON.parse(readFileSync(env.TEST_PLUGIN_CONTROL, 'utf8')));
  } catch {
    // No control file (yet): the environment alone.
  }
}

function processGroup() {
  try {
    // /proc/self/stat: pid (comm) state ppid pgrp ...; comm may hold spaces, so count from its ')'.
    const stat = readFileSync('/proc/self/stat', 'utf8');
    return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[2]);
  } catch {
    return undefined;
  }
}

const chunks = [];
for await (const c of process.stdin) chunks.push(c);
const input = Buffer.concat(chunks).toString('utf8');
let request;
try {
  request = JSON.parse(input);
} catch {
  request = { unreadable: input.slice(0, 200) };
}

const record = { at: Date.now(), pid: process.pid, pgid: processGroup(), args: process.argv.slice(2), request, env: Object.fromEntries(Object.entries(process.env).filter(([k]) => k.startsWith('TEST_PLUGIN_') || k === 'PATH' || k === 'PINSET_TEST_MARK')) };
const log = (extra = {}) => {
  if (env.TEST_PLUGIN_LOG) appendFileSync(env.TEST_PLUGIN_LOG, JSON.stringify({ ...record, ...extra }) + '\n');
};
if (env.TEST_PLUGIN_STDERR) process.stderr.write(env.TEST_PLUGIN_STDERR);
if (Number(env.TEST_PLUGIN_DELAY_MS) > 0) await new Promise((r) => setTimeout(r, Number(env.TEST_PLUGIN_DELAY_MS)));

const mode = env.TEST_PLUGIN_MODE || 'ok';
if (mode === 'hang') {
  // A child in the same process group, as a wrapper script's would be: killing the plugin alone would leave it.
  const child = spawn(process.execPath, ['-e', 'setInterval(() => {}, 1000)'], { stdio: 'ignore' });
  log({ mode, childPid: child.pid });
  setInterval(() => {}, 1000);
} else {
  log({ mode });
  if (mode === 'fail') process.exit(1);
  if (mode === 'garbage') {
    process.stdout.write(`not a response ${env.TEST_PLUGIN_PASSWORD ?? ''} {`);
    process.exit(0);
  }
  const image = typeof request.image === 'string' ? request.image : '';
  const apiVersion = mode === 'wrong-api-version' ? 'credentialprovider.kubelet.k8s.io/v0' : request.apiVersion;
  const response = {
    apiVersion,
    kind: 'CredentialProviderResponse',
    cacheKeyType: mode === 'bad-cache-key' ? 'Sometimes' : env.TEST_PLUGIN_CACHE_KEY_TYPE || 'Registry',
    ...(env.TEST_PLUGIN_CACHE_DURATION ? { cacheDuration: env.TEST_PLUGIN_CACHE_DURATION } : {}),
    auth: { [env.TEST_PLUGIN_AUTH_KEY || image.split('/')[0]]: { username: env.TEST_PLUGIN_USERNAME ?? '', password: env.TEST_PLUGIN_PASSWORD ?? '' } },
  };
  process.stdout.write(JSON.stringify(response));
}
