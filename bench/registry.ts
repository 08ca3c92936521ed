// `npm run bench:registry`: how long `pinset resolve` and `pinset size` take
// for N image references by tag (default 500) on a loopback registry
// (distribution 2.8), run as a user runs them: the pinset command in its
// own process, from start to exit, each run a fresh process (no cache).
// The registry is reached through registries.conf, and (at the default
// parallelism) through containerd's registry hosts (--containerd-hosts-dir).
// Results: printed as Markdown and written to bench/registry-results.json;
// the figures and the command are in BENCHMARKS.md. Not part of `npm test`.
import { execFile } from 'node:child_process';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { stringify } from 'smol-toml';
import { installCommand, missingComponents } from '../test/support/components.ts';
import { pushSingleLayer } from '../test/support/images.ts';
import { Registry } from '../test/support/registry.ts';

const N = Number(process.env.BENCH_REFS ?? 500);
const RUNS = Number(process.env.BENCH_RUNS ?? 5);
const PARALLEL = (process.env.BENCH_REGISTRY_PARALLEL ?? '1,8,32').split(',').map(Number);
const ROOT = fileURLToPath(new URL('..', import.meta.url));
const NODE = path.join(ROOT, 'node_modules/.bin/node');
const RESULTS = fileURLToPath(new URL('./registry-results.json', import.meta.url));

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

function timed(args: string[], env: NodeJS.ProcessEnv): Promise<number> {
  const start = process.hrtime.bigint();
  return new Promise((resolve, reject) => {
    execFile(NODE, ['src/cli/main.ts', ...args], { cwd: ROOT, env: { ...process.env, ...env }, maxBuffer: 64 * 1024 * 1024 }, (err, _stdout, stderr) => {
      if (err) return reject(new Error(`pinset ${args[0]} failed: ${stderr}`));
      resolve(Number(process.hrtime.bigint() - start) / 1e6);
    });
  });
}

async function main(): Promise<void> {
  const missing = missingComponents(['docker-registry']);
  if (missing.length) throw new Error(`missing components; ${installCommand(missing)}`);
  const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-bench-registry-'));
  const registry = await Registry.start();
  try {
    process.stdout.write(`pushing ${N} tagged images...\n`);
    const refs: string[] = [];
    for (let i = 0; i < N; i++) {
      await pushSingleLayer(registry, `bench/app-${i}`, { tag: 'v1' });
      refs.push(`registry.test/bench/app-${i}:v1`);
    }
    const list = path.join(dir, 'refs.txt');
    await writeFile(list, refs.join('\n') + '\n');
    const conf = path.join(dir, 'registries.conf');
    await writeFile(conf, `[[registry]]\nprefix = "registry.test"\nlocation = "${registry.host}"\ninsecure = true\n`);
    const env = { CONTAINERS_REGISTRIES_CONF: conf, PINSET_REGISTRIES_CONF_DIR: path.join(dir, 'none.d'), REGISTRY_AUTH_FILE: path.join(dir, 'none.json') };
    const certsD = path.join(dir, 'certs.d');
    await mkdir(path.join(certsD, 'registry.test'), { recursive: true });
    await writeFile(path.join(certsD, 'registry.test', 'hosts.toml'), stringify({ server: registry.url, host: { [registry.url]: { capabilities: ['pull', 'resolve'] } } }));
    // Node's own start, for reference: `pinset --help` loads no command.
    const startup: number[] = [];
    for (let r = 0; r < RUNS; r++) startup.push(await timed(['--help'], env));
    const rows: { command: string; mirrors: string; parallel: number; medianMs: number; runsMs: number[] }[] = [];
    const modes = [
      ...PARALLEL.map((parallel) => ({ mirrors: 'registries.conf', parallel, extra: [] as string[] })),
      { mirrors: 'containerd hosts', parallel: 8, extra: ['--containerd-hosts-dir', certsD] },
    ];
    for (const { mirrors, parallel, extra } of modes) {
      for (const command of ['resolve', 'size']) {
        const runs: number[] = [];
        for (let r = 0; r < RUNS; r++) runs.push(await timed([command, '--parallel', String(parallel), ...extra, list], env));
        rows.push({ command, mirrors, parallel, medianMs: median(runs), runsMs: runs.map((x) => Math.round(x)) });
      }
    }
    const out = {
      when: new Date().toISOString(),
      references: N,
      runs: RUNS,
      node: process.version,
      cpus: os.cpus().length,
      startupMedianMs: Math.round(median(startup)),
      rows,
    };
    await writeFile(RESULTS, JSON.stringify(out, null, 2) + '\n');
    process.stdout.write(`\n${N} references by tag, loopback registry, median of ${RUNS} runs (pinset --help alone: ${out.startupMedianMs} ms)\n\n`);
    process.stdout.write('| command | mirrors from | --parallel | median | runs (ms) |\n|---|---|---|---|---|\n');
    for (const r of rows) process.stdout.write(`| pinset ${r.command} | ${r.mirrors} | ${r.parallel} | ${(r.medianMs / 1000).toFixed(2)} s | ${r.runsMs.join(', ')} |\n`);
  } finally {
    await registry.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

main().catch((e) => {
  process.stderr.write(`${(e as Error).stack ?? e}\n`);
  process.exitCode = 1;
});
