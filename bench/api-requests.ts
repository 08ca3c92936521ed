// API requests of one agent at rest, counted by the in-process API server
// (test/support/apiserver.ts): the real `pinset agent` process, a Node and a
// Ready set from the API, a CRI-O stand-in behind a private D-Bus, the
// default resync (5m). After the set is Ready the counting starts and runs
// for BENCH_API_SECONDS of wall clock, with a kubelet stand-in updating the
// Node's status every BENCH_KUBELET_SECONDS (the agent must ignore those).
//
//   node bench/api-requests.ts                              # defaults: --min-watch-timeout 10m, 1800 s
//   BENCH_MIN_WATCH_TIMEOUT=10s BENCH_API_SECONDS=300 node bench/api-requests.ts
//
// Per-hour figures are count * 3600 / seconds. With a short
// --min-watch-timeout the run also reports watches per watch lifetime: each
// watch asks for timeoutSeconds in [min, 2 min), so a client that re-opens
// only when the server ends a watch makes 3600 / (1.5 * min) re-opens per
// watch-hour; the same ratio at the default timeout is then linear
// arithmetic, not a measurement, and is labelled so.
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { API_VERSION, KIND, STATUS_ANNOTATION } from '../src/api/types.ts';
import { AgentProcess } from '../test/support/agent-process.ts';
import { ApiServer } from '../test/support/apiserver.ts';
import { startCrioNode } from '../test/support/crio-node.ts';

const SECONDS = Number(process.env.BENCH_API_SECONDS ?? 1800);
const MIN_WATCH_TIMEOUT = process.env.BENCH_MIN_WATCH_TIMEOUT ?? '10m';
const KUBELET_SECONDS = Number(process.env.BENCH_KUBELET_SECONDS ?? 60);
const NODE = 'bench-node';
const RESULTS = fileURLToPath(new URL('./api-requests.json', import.meta.url));
const IMAGES = [1, 2, 3].map((i) => `registry.test/bench/app${i}@sha256:${String(i).repeat(64)}`);

async function main(): Promise<void> {
  const node = await startCrioNode({ catalogue: Object.fromEntries(IMAGES.map((r) => [r, { size: 1000 }])) });
  const api = await ApiServer.start();
  const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-bench-api-'));
  try {
    api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: NODE, labels: { 'node-role.kubernetes.io/worker': '' } } });
    api.create({ apiVersion: API_VERSION, kind: KIND, metadata: { name: 'bench' }, spec: { pinnedImages: IMAGES.map((name) => ({ name })) } });
    const kubeconfig = await api.writeKubeconfig(dir);
    const agent = AgentProcess.start(
      [
        '--node-name', NODE,
        '--kubeconfig', kubeconfig,
        '--static-dir', path.join(dir, 'sets.d'),
        '--cri-endpoint', node.endpoint,
        '--crio-dropin-dir', node.dropInDir,
        '--state-dir', node.stateDir,
        '--reload', 'dbus',
        '--auth-file', path.join(dir, 'no-auth.json'),
        '--metrics-addr', '',
        '--min-watch-timeout', MIN_WATCH_TIMEOUT,
      ],
      { env: node.env },
    );
    try {
      await api.waitFor(
        () => {
          const raw = (api.get('nodes', NODE)?.metadata.annotations ?? {})[STATUS_ANNOTATION];
          return raw && (JSON.parse(raw) as { sets: { phase: string }[] }).sets.every((s) => s.phase === 'Ready');
        },
        60_000,
        'the set Ready',
      );
      await sleep(3000);
      const startRequests = api.requests.length;
      const startConnections = api.connections;
      const started = Date.now();
      process.stderr.write(`counting for ${SECONDS} s (--min-watch-timeout ${MIN_WATCH_TIMEOUT})...\n`);
      let beats = 0;
      while (Date.now() - started < SECONDS * 1000) {
        await sleep(Math.min(KUBELET_SECONDS * 1000, started + SECONDS * 1000 - Date.now()));
        if (Date.now() - started >= SECONDS * 1000) break;
        // The kubelet's status update (nodeStatusReportFrequency): a MODIFIED event on the agent's Node watch.
        api.patch('nodes', NODE, { status: { conditions: [{ type: 'Ready', status: 'True', lastHeartbeatTime: new Date().toISOString() }] } });
        beats++;
      }
      const elapsed = (Date.now() - started) / 1000;
      const reqs = api.requests.slice(startRequests);
      const watches = reqs.filter((r) => r.method === 'GET' && r.query.watch === 'true');
      const lists = reqs.filter((r) => r.method === 'GET' && r.query.watch !== 'true');
      const writes = reqs.filter((r) => r.method !== 'GET');
      const perHour = (n: number) => (n * 3600) / elapsed;
      const meanTimeout = watches.length ? watches.reduce((n, w) => n + Number(w.query.timeoutSeconds), 0) / watches.length : NaN;
      // Two watches, each ended by the server after the timeoutSeconds it asked for.
      const expectedReopens = (2 * elapsed) / meanTimeout;
      const result = {
        seconds: Math.round(elapsed),
        minWatchTimeout: MIN_WATCH_TIMEOUT,
        kubeletUpdates: beats,
        requests: reqs.length,
        connections: api.connections - startConnections,
        watchOpens: watches.length,
        watchOpensByResource: Object.fromEntries(
          ['nodes', 'pinnedimagesets'].map((r) => [r, watches.filter((w) => w.path.endsWith(`/${r}`)).length]),
        ),
        lists: lists.length,
        writes: writes.length,
        perHour: { watchOpens: +perHour(watches.length).toFixed(1), lists: +perHour(lists.length).toFixed(1), writes: +perHour(writes.length).toFixed(1) },
        meanTimeoutSecondsAsked: +meanTimeout.toFixed(1),
        expectedReopensIfOnlyServerTimeouts: +expectedReopens.toFixed(1),
        reopensPerServerTimeout: +(watches.length / expectedReopens).toFixed(2),
        // Arithmetic, not a measurement: two watches asking for 600-1200 s (mean 900 s), times the re-opens per server timeout measured here.
        projectedPerHourAtDefault10m: +(((2 * 3600) / 900) * (watches.length / expectedReopens)).toFixed(1),
        every: watches.map((w) => `${w.path.split('/').at(-1)} rv=${w.query.resourceVersion} timeout=${w.query.timeoutSeconds}`),
      };
      process.stdout.write(JSON.stringify(result, null, 2) + '\n');
      const all = JSON.parse(await readFile(RESULTS, 'utf8').catch(() => '{}')) as Record<string, unknown>;
      all[`minWatchTimeout=${MIN_WATCH_TIMEOUT}`] = { ...result, date: new Date().toISOString(), machine: `${os.cpus().length} CPUs, Node ${process.version}` };
      await writeFile(RESULTS, JSON.stringify(all, null, 2) + '\n');
    } finally {
      await agent.stop();
    }
  } finally {
    await api.stop();
    await node.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`bench: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exitCode = 1;
});
