// `npm run bench:credentials`: how long a pull waits on its credentials.
// The puller asks the credential seam (src/agent/image-credentials.ts) for
// every image before it calls the runtime's PullImage; this measures, with
// an in-memory runtime that only notes when PullImage is called:
//   - none: no credential source at all (the floor: the puller's own path);
//   - auth file: a pull secret keyring and the auth file, no plugin;
//   - cached: a credential provider plugin whose answer is in its cache
//     (what every pull but the first of a cache period waits on);
//   - first exec: a plugin asked for the first time (cache empty), for two
//     plugins: a shell script that prints a fixed answer (an exec's own
//     cost, as a static Go plugin such as ecr-credential-provider has
//     before it makes any request), and the tests' Node.js plugin.
// Run under the agent's Node.js flags (scripts/build.ts NODE_FLAGS: no
// optimizing compiler), as the bundle runs. Results: printed as Markdown and
// written to bench/credentials-results.json; figures in BENCHMARKS.md.
import { spawnSync } from 'node:child_process';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseReference } from '../src/api/reference.ts';
import { AgentCredentials } from '../src/agent/image-credentials.ts';
import { planReconcile, type WantedImage } from '../src/agent/plan.ts';
import { ImagePuller } from '../src/agent/puller.ts';
import { PullSecrets, type SecretStore } from '../src/agent/pull-secrets.ts';
import type { ImageRuntime } from '../src/cri/runtime.ts';
import { AuthFile } from '../src/registry/auth.ts';
import type { CredentialProviderSpec } from '../src/registry/credential-provider-config.ts';
import type { CredentialSource } from '../src/registry/credentials.ts';
import { ExecCredentialProvider } from '../src/registry/credential-provider.ts';
import { NodeCredentials } from '../src/registry/node-credentials.ts';
import { silentLogger } from '../src/util/log.ts';
import { NODE_FLAGS } from '../scripts/build.ts';
import { installTestPlugin, TEST_PLUGIN_NAME } from '../test/support/credential-plugin.ts';

const PULLS = Number(process.env.BENCH_PULLS ?? 2000);
const EXECS = Number(process.env.BENCH_EXECS ?? 30);
const RESULTS = fileURLToPath(new URL('./credentials-results.json', import.meta.url));
const HEX = 'a'.repeat(64);

function percentile(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]!;
}

/** A runtime whose PullImage notes when it was called and answers at once. */
class NotingRuntime implements ImageRuntime {
  calledAt = 0n;
  async version() {
    return { runtimeName: 'memory', runtimeVersion: '0', runtimeApiVersion: 'v1' };
  }
  async listImages() {
    return [];
  }
  async imageStatus() {
    return null;
  }
  async imageFsInfo() {
    return [];
  }
  close(): void {}
  async pullImage(): Promise<string> {
    this.calledAt = process.hrtime.bigint();
    return 'sha256:' + HEX;
  }
}

function wanted(ref: string): WantedImage {
  const r = parseReference(ref);
  if (!r.ok) throw new Error(r.error);
  return { key: `\n${ref}`, reference: r.value, runtimeHandler: '', sets: ['api/bench'] };
}

/** Microseconds from pull() to the runtime's PullImage, per pull, each a different image. */
async function waitBeforePull(credentials: CredentialSource | undefined, n: number, host = 'registry.test'): Promise<number[]> {
  const runtime = new NotingRuntime();
  const puller = new ImagePuller({ runtime, maxParallel: 1, logger: silentLogger(), credentials });
  const out: number[] = [];
  const never = new AbortController().signal;
  for (let i = 0; i < n; i++) {
    const w = wanted(`${host}/bench/app-${i}@sha256:${HEX}`);
    const start = process.hrtime.bigint();
    await puller.pull([w], never);
    out.push(Number(runtime.calledAt - start) / 1000);
  }
  return out;
}

const store: SecretStore = { namespace: 'pinset-system', watch() {}, synced: true, get: () => undefined, whenSynced: async () => true };

function agentCredentials(node: CredentialSource): AgentCredentials {
  const creds = new AgentCredentials({ node, pullSecrets: new PullSecrets(store) });
  creds.notePlan(planReconcile({ labels: {}, apiSets: [], staticSets: [], staticProblems: [], currentPins: [], carriedPins: [] }));
  return creds;
}

function spec(name: string, dir: string, over: Partial<CredentialProviderSpec> = {}): CredentialProviderSpec {
  return {
    name,
    matchImages: ['registry.test'],
    defaultCacheDurationMs: 3_600_000,
    apiVersion: 'credentialprovider.kubelet.k8s.io/v1',
    args: [],
    env: [
      { name: 'TEST_PLUGIN_USERNAME', value: 'robot' },
      { name: 'TEST_PLUGIN_PASSWORD', value: 'bench-pw-123' },
      { name: 'TEST_PLUGIN_CACHE_KEY_TYPE', value: 'Global' },
      { name: 'TEST_PLUGIN_LOG', value: path.join(dir, 'execs.log') },
    ],
    ...over,
  };
}

async function main(): Promise<void> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-bench-creds-'));
  try {
    const bin = path.join(dir, 'bin');
    await installTestPlugin(bin);
    const shell = path.join(bin, 'static-answer');
    await writeFile(shell, `#!/bin/sh\ncat > /dev/null\nprintf '{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse","cacheKeyType":"Image","auth":{"registry.test":{"username":"robot","password":"bench-pw-123"}}}'\n`);
    await chmod(shell, 0o755);
    const authPath = path.join(dir, 'config.json');
    await writeFile(authPath, JSON.stringify({ auths: { 'registry.test': { auth: Buffer.from('robot:file-pw-123').toString('base64') }, 'quay.io': { auth: Buffer.from('q:pw').toString('base64') } } }));
    const authFile = new AuthFile(authPath);
    await authFile.refresh();

    const rows: { case: string; samples: number; p50Us: number; p90Us: number; p99Us: number }[] = [];
    const row = (name: string, us: number[]) => rows.push({ case: name, samples: us.length, p50Us: percentile(us, 50), p90Us: percentile(us, 90), p99Us: percentile(us, 99) });

    // Warm up the code paths once, then measure.
    await waitBeforePull(undefined, 200);
    row('no credential source', await waitBeforePull(undefined, PULLS));
    row('auth file (and pull secrets), no plugin', await waitBeforePull(agentCredentials(new NodeCredentials(authFile)), PULLS));
    const cachedPlugin = new ExecCredentialProvider(spec(TEST_PLUGIN_NAME, dir), { binDir: bin });
    const cached = agentCredentials(new NodeCredentials(authFile, [cachedPlugin]));
    await waitBeforePull(cached, 1); // the one exec that fills the cache
    row('plugin answer cached (Global key)', await waitBeforePull(cached, PULLS));
    if (cachedPlugin.execs !== 1) throw new Error(`the cached case exec'd the plugin ${cachedPlugin.execs} times`);

    for (const [name, label] of [
      ['static-answer', 'first exec: a shell script plugin'],
      [TEST_PLUGIN_NAME, 'first exec: the tests\' Node.js plugin'],
    ] as const) {
      const us: number[] = [];
      for (let i = 0; i < EXECS; i++) {
        // A new provider each time: an empty cache, so the pull waits on an exec.
        const p = new ExecCredentialProvider(spec(name, dir, { defaultCacheDurationMs: 0 }), { binDir: bin });
        us.push(...(await waitBeforePull(agentCredentials(new NodeCredentials(authFile, [p])), 1)));
      }
      row(label, us);
    }

    const result = { node: process.version, flags: process.execArgv, pulls: PULLS, execs: EXECS, cpus: os.cpus().length, rows };
    await writeFile(RESULTS, JSON.stringify(result, null, 2) + '\n');
    process.stdout.write(`Node.js ${process.version} ${process.execArgv.join(' ')}, ${os.cpus().length} CPUs\n\n| case | samples | p50 | p90 | p99 |\n|---|---:|---:|---:|---:|\n`);
    const fmt = (us: number) => (us >= 1000 ? `${(us / 1000).toFixed(1)} ms` : `${us.toFixed(0)} µs`);
    for (const r of rows) process.stdout.write(`| ${r.case} | ${r.samples} | ${fmt(r.p50Us)} | ${fmt(r.p90Us)} | ${fmt(r.p99Us)} |\n`);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

// Run again under the agent's flags unless already under them.
if (process.env.PINSET_BENCH_UNDER_AGENT_FLAGS !== '1') {
  const r = spawnSync(process.execPath, [...NODE_FLAGS, fileURLToPath(import.meta.url)], { stdio: 'inherit', env: { ...process.env, PINSET_BENCH_UNDER_AGENT_FLAGS: '1' } });
  process.exit(r.status ?? 1);
} else {
  await main();
}
