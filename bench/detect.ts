// `npm run bench:detect`: how long the agent takes at start to find its
// node's runtime (src/agent/boot/node-profile.ts: the standard CRI sockets under
// the host root, CRI Version of each that is there, ImageFsInfo of the one
// that answered, containerd's config for its registry hosts), as it logs it
// (`detectionMs` of "node runtime detected"). The agent is the bundle
// (dist/), run with the args and env of the DaemonSet that `kubectl
// kustomize deploy/` renders (test/support/shipped-agent.ts) plus --once,
// on a node made of temporary folders, BENCH_RUNS times (default 7) per
// layout:
//  - the CRI-O stand-in at CRI-O's paths;
//  - containerd 2.1.9 at containerd's own paths;
//  - containerd 2.1.9 at k3s's paths;
//  - no runtime at all (every socket missing: the problem said at once).
// Each run is a new process: the figure includes loading the CRI client.
// Results printed as Markdown and written to bench/detect.json.
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { bundledCli, runAgentOnce } from '../test/support/agent-process.ts';
import { missingComponents, missingMessage } from '../test/support/components.ts';
import { Containerd, containerdComponent } from '../test/support/containerd.ts';
import { startCrioNode } from '../test/support/crio-node.ts';
import { shippedAgent, shippedEnv } from '../test/support/shipped-agent.ts';

const RUNS = Number(process.env.BENCH_RUNS ?? 7);
const RESULTS = fileURLToPath(new URL('./detect.json', import.meta.url));
const say = (line = '') => process.stdout.write(`${line}\n`);

interface Row {
  layout: string;
  runtime: string;
  runs: number[];
}

function quantile(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))]!;
}

async function main(): Promise<void> {
  const missing = missingComponents([containerdComponent('2.1'), 'runc', 'dbus-daemon']);
  if (missing.length) throw new Error(missingMessage(missing));
  const cli = await bundledCli();
  const shipped = await shippedAgent();
  const work = await mkdtemp(path.join(os.tmpdir(), 'pinset-bench-detect-'));
  const rows: Row[] = [];
  const measure = async (layout: string, root: string): Promise<Row> => {
    await mkdir(path.join(root, 'var/lib/pinset'), { recursive: true });
    const env = { ...shippedEnv(shipped, root, { NODE_NAME: 'bench', POD_NAMESPACE: 'pinset-system' }), PINSET_METRICS_ADDR: '' };
    const row: Row = { layout, runtime: '', runs: [] };
    for (let i = 0; i < RUNS; i++) {
      const r = await runAgentOnce([...shipped.args.slice(1), '--once'], { cli, env });
      const line = r.stderr
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l) as { msg?: string; detectionMs?: number; runtime?: { name?: string; version?: string; problem?: string } })
        .find((l) => l.detectionMs !== undefined);
      if (!line) throw new Error(`${layout}: no detection logged:\n${r.stderr}`);
      row.runtime = line.runtime?.problem ? 'none (problem said)' : `${line.runtime?.name} ${line.runtime?.version}`;
      row.runs.push(line.detectionMs!);
    }
    return row;
  };
  try {
    const crioRoot = path.join(work, 'crio');
    const crio = await startCrioNode({ hostRoot: crioRoot });
    try {
      rows.push(await measure('CRI-O (stand-in)', crioRoot));
    } finally {
      await crio.stop();
    }
    for (const [layout, socket] of [
      ['containerd', 'run/containerd/containerd.sock'],
      ['k3s', 'run/k3s/containerd/containerd.sock'],
    ] as const) {
      const root = path.join(work, layout);
      const c = await Containerd.start({ version: '2.1', socketPath: path.join(root, socket) });
      try {
        rows.push(await measure(`containerd 2.1 at ${layout}'s paths`, root));
      } finally {
        await c.stop();
      }
    }
    rows.push(await measure('no runtime', path.join(work, 'none')));
  } finally {
    await rm(work, { recursive: true, force: true });
  }
  say(`| layout | runtime | runs | median ms | p90 ms | max ms |`);
  say(`|---|---|---|---|---|---|`);
  for (const r of rows) say(`| ${r.layout} | ${r.runtime} | ${r.runs.length} | ${quantile(r.runs, 0.5)} | ${quantile(r.runs, 0.9)} | ${Math.max(...r.runs)} |`);
  await writeFile(RESULTS, JSON.stringify({ date: new Date().toISOString(), runs: RUNS, cpus: os.cpus().length, rows }, null, 2) + '\n');
}

await main();
