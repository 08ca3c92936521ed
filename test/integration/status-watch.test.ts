// `pinset status --watch` as a user runs it, against the in-process API
// server: on a pipe (plain lines, one per change), and on a terminal (a
// pseudo-terminal from util-linux's `script`: the screen redrawn with a
// progress bar). With --set it ends once every node the set selects is
// ready.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { ApiServer } from '../support/apiserver.ts';
import { encodeNodeStatus } from '../../src/api/node-status.ts';
import { STATUS_ANNOTATION, type NodeSetStatus } from '../../src/api/types.ts';

const ROOT = path.resolve(import.meta.dirname, '../..');
const NODE = path.join(ROOT, 'node_modules/.bin/node');
const IMAGES = [1, 2, 3, 4].map((i) => ({ name: `quay.io/org/app${i}@sha256:${'a'.repeat(64)}` }));
const MiB = 1024 ** 2;
const noScript = spawnSync('script', ['--version']).status !== 0 ? 'util-linux script is not installed' : false;

let api: ApiServer;
let dir: string;
let kubeconfig: string;

before(async () => {
  api = await ApiServer.start();
  dir = await mkdtemp(path.join(tmpdir(), 'pinset-status-watch-'));
  kubeconfig = await api.writeKubeconfig(dir);
});
after(async () => {
  await api.stop();
  await rm(dir, { recursive: true, force: true });
});

/** A fresh set of `name` with three worker nodes: one downloading, one waiting for the slot, one not reported yet. */
function rollout(name: string): { uid: string; report: (node: string, over: Partial<NodeSetStatus>) => void } {
  const uid = api.create({
    apiVersion: 'pinset.dev/v1alpha1',
    kind: 'PinnedImageSet',
    metadata: { name },
    spec: { nodeSelector: { matchLabels: { fleet: name } }, pinnedImages: IMAGES, rollout: { maxConcurrentNodes: 1 } },
  }).metadata.uid!;
  const report = (node: string, over: Partial<NodeSetStatus>) => {
    const entry: NodeSetStatus = { name, uid, source: 'api', desiredGeneration: 1, currentGeneration: 0, images: { wanted: 4, present: 0, pinned: 4, failed: 0, invalid: 0 }, phase: 'Progressing', reason: 'Pulling', ...over };
    api.patch('nodes', node, { metadata: { annotations: { [STATUS_ANNOTATION]: encodeNodeStatus({ version: 2, pinFile: 'x', updatedAt: new Date().toISOString(), sets: [entry] }) } } });
  };
  for (const n of ['a', 'b', 'c']) api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: `${name}-${n}`, labels: { fleet: name } } });
  report(`${name}-a`, { bytes: { present: 10 * MiB, total: 40 * MiB }, rate: 2 * MiB, images: { wanted: 4, present: 1, pinned: 4, failed: 0, invalid: 0 } });
  report(`${name}-b`, { reason: 'WaitingForRolloutSlot' });
  return { uid, report };
}

const ready = { phase: 'Ready' as const, reason: 'AllImagesPinned', currentGeneration: 1, images: { wanted: 4, present: 4, pinned: 4, failed: 0, invalid: 0 }, bytes: { present: 40 * MiB, total: 40 * MiB } };

/** Runs `argv`, collecting its output; `until` is awaited with a reader of the output so far. */
function run(argv: string[], env: Record<string, string> = {}): { output: () => string; exited: Promise<number | null>; kill: (s: NodeJS.Signals) => void } {
  const child = spawn(argv[0]!, argv.slice(1), { cwd: ROOT, env: { ...process.env, COLUMNS: '160', ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout.setEncoding('utf8').on('data', (c: string) => (out += c));
  child.stderr.setEncoding('utf8').on('data', (c: string) => (out += c));
  const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
  const exited = new Promise<number | null>((resolve) => child.once('close', (code) => (clearTimeout(timer), resolve(code))));
  return { output: () => out, exited, kill: (s) => child.kill(s) };
}

async function waitOutput(r: ReturnType<typeof run>, re: RegExp, what: string): Promise<void> {
  const deadline = Date.now() + 20_000;
  while (!re.test(r.output())) {
    if (Date.now() > deadline) assert.fail(`no ${what} in:\n${r.output()}`);
    await sleep(50);
  }
}

describe('pinset status --watch', () => {
  test('on a pipe: the table once, then a line per change; with --set it ends once every node is ready', async () => {
    const { report } = rollout('piped');
    const r = run([NODE, 'src/cli/main.ts', 'status', '--kubeconfig', kubeconfig, '--set', 'piped', '--watch', '--interval', '200ms']);
    // The first observation has no rate of its own yet: the one the downloading node reports (110 MiB left at 2 MiB/s).
    await waitOutput(r, /^Progress:\n {2}piped: 8% of 120\.0 MiB, 2\.0 MiB\/s \(1 downloading, 2 waiting\); done in about 5\ds/m, 'the first progress line');
    const firstPart = r.output();
    assert.match(firstPart, /^NODE\s+SET\s+PHASE\s+IMAGES\s+BYTES\s+ETA\s+GENERATION\s+AGE/m);
    assert.match(firstPart, /^piped-a\s+piped\s+Progressing\s+1\/4\s+25% of 40\.0 MiB\s+\d+s\s+0\/1/m);
    assert.match(firstPart, /estimated here/, 'no controller runs here: the command measures its own');

    report('piped-a', { bytes: { present: 30 * MiB, total: 40 * MiB }, rate: 2 * MiB, images: { wanted: 4, present: 3, pinned: 4, failed: 0, invalid: 0 } });
    await waitOutput(r, /^\d{4}-\d\d-\d\dT[\d:]+Z piped: 25% of 120\.0 MiB/m, 'a line for the progress that moved');
    await waitOutput(r, /^piped-a\s+piped\s+Progressing\s+3\/4\s+75% of 40\.0 MiB/m, 'the row that changed');

    report('piped-a', ready);
    report('piped-b', { bytes: { present: 0, total: 40 * MiB }, rate: undefined });
    await sleep(600);
    for (const n of ['piped-b', 'piped-c']) report(n, ready);
    assert.equal(await r.exited, 0, r.output());
    const out = r.output();
    assert.match(out, /piped: 100% of 120\.0 MiB \(every selected node done\)\n/);
    assert.doesNotMatch(out, /\x1b\[/, 'no terminal escapes on a pipe');
    // Lines for changes only: the ETA's countdown alone prints nothing.
    const stamped = out.split('\n').filter((l) => /^\d{4}-/.test(l));
    assert.ok(stamped.length >= 2 && stamped.length <= 6, `${stamped.length} progress lines:\n${out}`);
  });

  test('on a terminal: the screen redrawn with a progress bar per set, the controller\'s ETA when the status has one', { skip: noScript }, async () => {
    const { report } = rollout('tty');
    const eta = new Date(Date.now() + 95_000).toISOString().replace(/\.\d+Z$/, 'Z');
    api.patch('pinnedimagesets', 'tty', { status: { observedGeneration: 1, progress: { unit: 'bytes', present: 10 * MiB, total: 120 * MiB, rate: 3 * MiB, nodesDownloading: 1, nodesWaiting: 2, estimatedCompletionTime: eta, summary: '8% of 120.0 MiB, 3.0 MiB/s' } } });
    const cmd = [NODE, 'src/cli/main.ts', 'status', '--kubeconfig', kubeconfig, '--set', 'tty', '-w', '--interval', '200ms'].map((a) => `'${a}'`).join(' ');
    // script gives the command a pseudo-terminal of its own and copies what it writes; -e: its exit status.
    const r = run(['script', '-qefc', `stty cols 150 rows 30; exec ${cmd}`, '/dev/null']);
    await waitOutput(r, /tty {2}\[#{2}\.{28}\] {3}8% {2}10\.0 MiB of 120\.0 MiB {2}3\.0 MiB\/s {2}ETA \d+s \(/, 'a bar with the controller\'s rate and ETA');
    assert.match(r.output(), /\x1b\[2J\x1b\[H/, 'the screen cleared once, then the cursor home');
    assert.doesNotMatch(r.output(), /estimated here|measured by this command/, 'the controller\'s ETA, not its own');
    report('tty-a', ready);
    for (const n of ['tty-b', 'tty-c']) report(n, ready);
    assert.equal(await r.exited, 0, r.output());
    const frames = r.output().split('\x1b[H');
    assert.ok(frames.length >= 3, `redrawn: ${frames.length - 1} frames`);
    assert.match(frames.at(-1)!, /tty {2}\[#{30}\] 100% {2}120\.0 MiB of 120\.0 MiB {2}done {2}3\/3 nodes ready/);
  });

  test('without --set it runs until interrupted, and exits 0; -o json with --watch is a usage error', async () => {
    rollout('free');
    const r = run([NODE, 'src/cli/main.ts', 'status', '--kubeconfig', kubeconfig, '--watch', '--interval', '200ms']);
    await waitOutput(r, /^ {2}free: /m, 'the set\'s progress line');
    r.kill('SIGINT');
    assert.equal(await r.exited, 0, r.output());
    const json = run([NODE, 'src/cli/main.ts', 'status', '--kubeconfig', kubeconfig, '--watch', '-o', 'json']);
    assert.equal(await json.exited, 2);
    assert.match(json.output(), /--watch prints the table as it changes; -o json prints one document/);
  });
});
