// `npm run bench:outage`: what the agent costs while a cause it cannot fix
// persists, and how soon it converges once the cause clears.
//
// For each outage (BENCH_OUTAGE_S seconds, default 60) the CPU seconds of
// the agent process (utime + stime from /proc/<pid>/stat) and its reconciles
// are counted over the outage; then the cause is cleared and the time to the
// set being pinned is measured. Outages:
// - healthy: nothing wrong (the idle cost, for comparison);
// - runtime down: the CRI-O stand-in stops serving (its socket gone); a set
//   created during the outage is pinned once it is back;
// - disk full: the drop-in folder on a full tmpfs (ENOSPC), then space freed;
// - read-only (BENCH_OUTAGES=read-only, for agents without a node lock): the
//   same tmpfs remounted read-only (EROFS), then read-write. An agent that
//   holds its node lock open on that filesystem makes the kernel refuse the
//   read-only remount ("busy"), so it cannot meet this outage at all.
// The tmpfs cases need root and permission to mount (skipped otherwise).
// BENCH_BASELINE_CLI=<path to another checkout's src/cli/main.ts> measures that
// agent too, for comparison. Results printed as Markdown and written to
// bench/outage.json.
import { execFileSync, spawn } from 'node:child_process';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { SOURCE_CLI as CLI, type LogLine } from '../test/support/agent-process.ts';
import { trackChild } from '../test/support/components.ts';
import { CriClient } from '../test/support/containerd.ts';
import { startCrioNode, type CrioNode } from '../test/support/crio-node.ts';
import { cpuMs } from './proc.ts';

const OUTAGE_S = Number(process.env.BENCH_OUTAGE_S ?? 60);
const RESULTS = fileURLToPath(new URL('./outage.json', import.meta.url));
const A1 = `registry.test/bench/a@sha256:${'a'.repeat(64)}`;
const A2 = `registry.test/bench/b@sha256:${'b'.repeat(64)}`;
const CONVERGE_LIMIT_MS = 180_000;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const say = (line = '') => process.stdout.write(`${line}\n`);

/** A remount fails "busy" while a file on it is open for writing: try again for a while. */
async function remount(mnt: string, mode: 'ro' | 'rw'): Promise<void> {
  for (let i = 0; ; i++) {
    try {
      execFileSync('mount', ['-o', `remount,${mode}`, mnt], { stdio: 'pipe' });
      return;
    } catch (e) {
      if (i >= 50) {
        let holders = '';
        try {
          holders = execFileSync('sh', ['-c', `ls -l /proc/[0-9]*/fd 2>/dev/null | grep -F ${JSON.stringify(mnt)} || true`]).toString();
        } catch {
          // best effort
        }
        throw new Error(`remount ${mode} of ${mnt} kept failing (${String((e as { stderr?: Buffer }).stderr ?? e).trim()}); open files: ${holders}`);
      }
      await sleep(100);
    }
  }
}

const cpuSeconds = (pid: number) => cpuMs(pid) / 1000;

/** The agent as its own process (this checkout's, or BENCH_BASELINE_CLI's), logs parsed. */
class Agent {
  readonly lines: LogLine[] = [];
  readonly child;
  constructor(cli: string, args: string[], env: NodeJS.ProcessEnv) {
    this.child = spawn(process.execPath, [cli, 'agent', ...args], { env: { PATH: process.env.PATH, NODE_OPTIONS: '--max-semi-space-size=1', ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    trackChild(this.child);
    let partial = '';
    this.child.stdout!.setEncoding('utf8').on('data', (d: string) => {
      partial += d;
      let nl: number;
      while ((nl = partial.indexOf('\n')) >= 0) {
        const line = partial.slice(0, nl);
        partial = partial.slice(nl + 1);
        try {
          this.lines.push(JSON.parse(line) as LogLine);
        } catch {
          // not a log line
        }
      }
    });
    this.child.stderr!.resume();
  }
  count(msg: string, from = 0): number {
    return this.lines.slice(from).filter((l) => l.msg === msg).length;
  }
  async stop(): Promise<void> {
    if (this.child.exitCode !== null) return;
    const done = new Promise((r) => this.child.once('exit', r));
    this.child.kill('SIGTERM');
    await done;
  }
}

async function until(what: string, ok: () => boolean | Promise<boolean>, timeoutMs = 120_000): Promise<number> {
  const started = performance.now();
  while (!(await ok())) {
    if (performance.now() - started > timeoutMs) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
  return performance.now() - started;
}

interface Result {
  outage: string;
  agent: string;
  cpuSeconds: number;
  reconciles: number;
  errorLines: number;
  /** null: nothing to converge; Infinity: not within CONVERGE_LIMIT_MS. */
  convergeMs: number | null;
}

type Outage = 'healthy' | 'runtime down' | 'disk full' | 'read-only';

async function run(outage: Outage, cliName: string, cli: string): Promise<Result | string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-bench-outage-'));
  let node: CrioNode | undefined;
  let agent: Agent | undefined;
  let mounted = false;
  try {
    let dropIn: string | undefined;
    if (outage === 'disk full' || outage === 'read-only') {
      if (process.getuid?.() !== 0) return 'needs root to mount a tmpfs';
      const mnt = path.join(dir, 'mnt');
      await mkdir(mnt);
      try {
        execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', mnt], { stdio: 'pipe' });
      } catch (e) {
        return `cannot mount a tmpfs: ${String((e as { stderr?: Buffer }).stderr ?? e).trim()}`;
      }
      mounted = true;
      dropIn = path.join(mnt, 'crio.conf.d');
      await mkdir(dropIn);
    }
    node = await startCrioNode({ catalogue: { [A1]: { size: 100 }, [A2]: { size: 100 } } });
    if (dropIn) (node.crio as { dropInDir: string }).dropInDir = dropIn;
    dropIn ??= node.dropInDir;
    const staticDir = path.join(dir, 'sets.d');
    await mkdir(staticDir);
    const setFile = (images: string[]) =>
      JSON.stringify({ apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name: 'a' }, spec: { pinnedImages: images.map((name) => ({ name })) } });
    await writeFile(path.join(staticDir, 'a.yaml'), setFile([A1]));
    agent = new Agent(
      cli,
      ['--node-name', 'bench', '--static-dir', staticDir, '--cri-endpoint', node.endpoint, '--crio-dropin-dir', dropIn, '--state-dir', path.join(dir, 'state'), '--reload', 'dbus', '--auth-file', path.join(dir, 'none.json'), '--metrics-addr', '', '--resync-interval', '5m'],
      node.env,
    );
    const cri = new CriClient(node.endpoint);
    const pinned = async (ref: string) => (await cri.imageStatus(ref).catch(() => null))?.pinned === true;
    try {
      await until('the first set pinned', () => pinned(A1));
      await sleep(2000);
      // Cause the outage; then change the set, so there is something to do once it clears.
      const mnt = path.dirname(dropIn);
      if (outage === 'runtime down') {
        // CRI-O goes away while the agent pulls (a restart, a crash): the pull fails UNAVAILABLE, then nothing answers.
        node.crio.failPulls(A2, { code: 14, message: 'connection error: desc = "transport: Error while dialing: dial unix crio.sock: connect: connection refused"' });
        await writeFile(path.join(staticDir, 'a.yaml'), setFile([A1, A2]));
        await until('the pull of the new image', () => node!.crio.pullCount(A2) > 0, 30_000);
        node.crio.stopServing();
      }
      if (outage === 'disk full') {
        try {
          execFileSync('dd', ['if=/dev/zero', `of=${path.join(mnt, 'filler')}`, 'bs=4k', 'count=1000'], { stdio: 'ignore' });
        } catch {
          // stops at ENOSPC
        }
      }
      if (outage === 'read-only') await remount(mnt, 'ro');
      if (outage === 'disk full' || outage === 'read-only') await writeFile(path.join(staticDir, 'a.yaml'), setFile([A1, A2]));
      await sleep(1000); // the change is seen and fails
      const mark = agent.lines.length;
      const cpu0 = cpuSeconds(agent.child.pid!);
      await sleep(OUTAGE_S * 1000);
      const cpu = cpuSeconds(agent.child.pid!) - cpu0;
      const reconciles = agent.count('reconcile finished', mark);
      const errorLines = agent.lines.slice(mark).filter((l) => l.level === 'error' || l.level === 'warn').length;
      let convergeMs: number | null = null;
      if (outage !== 'healthy') {
        const cleared = performance.now();
        if (outage === 'runtime down') await node.crio.resume();
        if (outage === 'disk full') await rm(path.join(mnt, 'filler'));
        if (outage === 'read-only') await remount(mnt, 'rw');
        convergeMs = await until('the changed set pinned', () => pinned(A2), CONVERGE_LIMIT_MS).then(
          () => performance.now() - cleared,
          () => Infinity,
        );
      }
      return { outage, agent: cliName, cpuSeconds: cpu, reconciles, errorLines, convergeMs };
    } finally {
      cri.close();
    }
  } finally {
    await agent?.stop();
    await node?.stop();
    if (mounted) execFileSync('umount', ['-l', path.join(dir, 'mnt')], { stdio: 'ignore' });
    await rm(dir, { recursive: true, force: true });
  }
}

function converged(r: Result): string {
  if (r.convergeMs === null) return '-';
  if (!Number.isFinite(r.convergeMs)) return `not within ${CONVERGE_LIMIT_MS / 1000}`;
  return (r.convergeMs / 1000).toFixed(1);
}

const agents: [string, string][] = [['this agent', CLI]];
if (process.env.BENCH_BASELINE_CLI) agents.push(['baseline', process.env.BENCH_BASELINE_CLI]);
const outages: Outage[] = (process.env.BENCH_OUTAGES?.split(',') as Outage[] | undefined) ?? ['healthy', 'runtime down', 'disk full'];
const results: Result[] = [];
const skipped: string[] = [];
for (const outage of outages) {
  for (const [name, cli] of agents) {
    say(`${name}: ${outage}, ${OUTAGE_S} s...`);
    const r = await run(outage, name, cli);
    if (typeof r === 'string') {
      skipped.push(`${outage}: ${r}`);
      say(`  skipped: ${r}`);
      break;
    }
    results.push(r);
    say(`  ${r.cpuSeconds.toFixed(2)} CPU s, ${r.reconciles} reconciles, ${r.errorLines} warn/error lines, converged ${converged(r)} after the cause cleared`);
  }
}
say();
say(`| outage (${OUTAGE_S} s) | agent | CPU seconds | reconciles | warn/error log lines | pinned after the cause cleared (s) |`);
say('|---|---|---:|---:|---:|---:|');
for (const r of results) say(`| ${r.outage} | ${r.agent} | ${r.cpuSeconds.toFixed(2)} | ${r.reconciles} | ${r.errorLines} | ${converged(r)} |`);
for (const s of skipped) say(`skipped ${s}`);
const json = results.map((r) => ({ ...r, convergeMs: r.convergeMs !== null && !Number.isFinite(r.convergeMs) ? `> ${CONVERGE_LIMIT_MS}` : r.convergeMs }));
await writeFile(RESULTS, JSON.stringify({ date: new Date().toISOString(), outageSeconds: OUTAGE_S, results: json, skipped }, null, 2) + '\n');
say(`\nraw: ${path.relative(process.cwd(), RESULTS)}`);
