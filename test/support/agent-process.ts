// Runs `pinset agent` the way a user (or the DaemonSet) does: its own
// process, flags on the command line, and nothing from this machine's
// environment that could point it elsewhere (KUBECONFIG, PINSET_*). Always
// stopped by its own PID; a test process that dies without its after-hooks
// still kills it (trackChild).
//
// Which program runs is chosen by the caller: the sources (SOURCE_CLI, the
// default: unit and integration tests) or the bundle as shipped (`cli:
// await bundledCli()`: the end-to-end tests and the benchmarks), which
// bundledCli() first checks is built from the current sources.
import { spawn, type ChildProcess } from 'node:child_process';
import { readdir, readFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse as parseToml } from 'smol-toml';
import type { NodeSetStatus } from '../../src/api/types.ts';
import { readFileSync } from 'node:fs';
import { BUNDLE_CLI, bundleProblem, hashbangNodeFlags } from '../../scripts/build.ts';
import { trackChild } from './components.ts';

/** The CLI run from the TypeScript sources. */
export const SOURCE_CLI = fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url));

/**
 * The CLI of the bundle in dist/ (what the image and the systemd unit run).
 * Throws, saying to run `npm run build`, when dist/ is missing or was built
 * from other sources: a stale bundle tested in place of the code would make
 * a passing run mean nothing.
 */
export async function bundledCli(): Promise<string> {
  const problem = await bundleProblem();
  if (problem) throw new Error(problem);
  return BUNDLE_CLI;
}

/**
 * `node <options> <cli>` as the program's first line asks (the bundle carries
 * V8 flags there), with this process's Node.js; `nodeArgs` replaces the options.
 */
export function argvFor(cli: string, nodeArgs?: string[]): string[] {
  return [...(nodeArgs ?? hashbangNodeFlags(readFileSync(cli, 'utf8').slice(0, 1000))), cli];
}

function cleanEnv(extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (k === 'KUBECONFIG' || k.startsWith('PINSET_') || k.startsWith('KUBERNETES_SERVICE_') || k === 'NODE_OPTIONS' || k.startsWith('NODE_TEST')) continue;
    env[k] = v;
  }
  return { ...env, ...extra };
}

/**
 * An agent's node lock lives in its --state-dir (/var/lib/pinset by
 * default: src/agent/boot/node-lock-place.ts). A test's agent takes it in a
 * folder of the test's node, given as the flag or as PINSET_STATE_DIR, so
 * that no test locks this machine's /var/lib/pinset, and the agents of one
 * test node (and only those) exclude each other.
 */
function assertOwnStateDir(args: readonly string[], env: NodeJS.ProcessEnv = {}): void {
  if (args.includes('--help') || env.PINSET_STATE_DIR || args.some((a) => a === '--state-dir' || a.startsWith('--state-dir='))) return;
  throw new Error(`an agent in a test needs --state-dir (or PINSET_STATE_DIR) in a folder of the test's node, not this machine's /var/lib/pinset: ${args.join(' ')}`);
}

export interface OnceResult {
  code: number | null;
  /** One NodeSetStatus per line of stdout. */
  sets: NodeSetStatus[];
  stdout: string;
  stderr: string;
}

/** `pinset agent --once ...args`; resolves when it exits (killed after `timeoutMs`). */
export function runAgentOnce(args: string[], opts: { timeoutMs?: number; env?: NodeJS.ProcessEnv; cli?: string; nodeArgs?: string[] } = {}): Promise<OnceResult> {
  assertOwnStateDir(args, opts.env);
  const child = spawn(process.execPath, [...argvFor(opts.cli ?? SOURCE_CLI, opts.nodeArgs), 'agent', '--once', ...args], { env: cleanEnv(opts.env), stdio: ['ignore', 'pipe', 'pipe'] });
  trackChild(child);
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
  child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
  const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 120_000);
  return new Promise((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code) => {
      clearTimeout(timer);
      const sets: NodeSetStatus[] = [];
      for (const line of stdout.split('\n')) {
        if (!line.trim()) continue;
        try {
          sets.push(JSON.parse(line) as NodeSetStatus);
        } catch {
          reject(new Error(`--once wrote a line to stdout that is not JSON: ${line}\nstderr:\n${stderr}`));
          return;
        }
      }
      resolve({ code, sets, stdout, stderr });
    });
  });
}

/** `pinset <args>` (any command) to its end: exit code and output (killed after `timeoutMs`). */
export function runPinset(args: string[], opts: { timeoutMs?: number; env?: NodeJS.ProcessEnv; cli?: string; stdin?: string } = {}): Promise<{ code: number | null; stdout: string; stderr: string }> {
  if (args[0] === 'agent') assertOwnStateDir(args, opts.env);
  const child = spawn(process.execPath, [...argvFor(opts.cli ?? SOURCE_CLI), ...args], { env: cleanEnv(opts.env), stdio: [opts.stdin === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'] });
  trackChild(child);
  if (opts.stdin !== undefined) child.stdin!.end(opts.stdin);
  let stdout = '';
  let stderr = '';
  child.stdout!.setEncoding('utf8').on('data', (d: string) => (stdout += d));
  child.stderr!.setEncoding('utf8').on('data', (d: string) => (stderr += d));
  const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 120_000);
  return new Promise((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

export type LogLine = Record<string, unknown> & { msg?: string; level?: string };

interface Waiter {
  from: number;
  pred: (l: LogLine) => boolean;
  resolve: (l: LogLine) => void;
}

/** A long-running agent; its JSON log lines are parsed as they arrive. */
export class AgentProcess {
  readonly child: ChildProcess;
  stdout = '';
  stderr = '';
  readonly exited: Promise<number | null>;
  #running = true;
  readonly #lines: LogLine[] = [];
  readonly #waiters = new Set<Waiter>();
  #partial = '';

  private constructor(child: ChildProcess) {
    this.child = child;
    trackChild(child);
    child.stdout!.setEncoding('utf8').on('data', (d: string) => {
      this.stdout += d;
      this.#take(d);
    });
    child.stderr!.setEncoding('utf8').on('data', (d: string) => (this.stderr += d));
    this.exited = new Promise((resolve) =>
      child.once('close', (code) => {
        this.#running = false;
        resolve(code);
      }),
    );
  }

  /**
   * `cli`: the program to run, SOURCE_CLI (the default) or bundledCli().
   * `nodeArgs`: options for Node.js itself, before the program (V8 flags that
   * NODE_OPTIONS does not accept, e.g. --single-threaded-gc); by default the
   * ones the program's first line names, as when it is run as a command.
   */
  static start(args: string[], opts: { env?: NodeJS.ProcessEnv; cli?: string; nodeArgs?: string[] } = {}): AgentProcess {
    assertOwnStateDir(args, opts.env);
    return new AgentProcess(
      spawn(process.execPath, [...argvFor(opts.cli ?? SOURCE_CLI, opts.nodeArgs), 'agent', ...args], { env: cleanEnv(opts.env), stdio: ['ignore', 'pipe', 'pipe'] }),
    );
  }

  /** A process started elsewhere that logs as the agent does (the image's container: `podman run`, attached). */
  static attach(child: ChildProcess): AgentProcess {
    return new AgentProcess(child);
  }

  #take(chunk: string): void {
    this.#partial += chunk;
    let nl: number;
    while ((nl = this.#partial.indexOf('\n')) >= 0) {
      const line = this.#partial.slice(0, nl);
      this.#partial = this.#partial.slice(nl + 1);
      if (!line.startsWith('{')) continue;
      let parsed: LogLine;
      try {
        parsed = JSON.parse(line) as LogLine;
      } catch {
        continue;
      }
      this.#lines.push(parsed);
      for (const w of this.#waiters) {
        if (this.#lines.length - 1 >= w.from && w.pred(parsed)) {
          this.#waiters.delete(w);
          w.resolve(parsed);
        }
      }
    }
  }

  get running(): boolean {
    return this.#running;
  }

  /** Log lines so far, parsed. */
  logs(): LogLine[] {
    return [...this.#lines];
  }

  /** Everything the agent wrote. */
  output(): string {
    return this.stdout + this.stderr;
  }

  /** Count of log lines so far: a starting point for waitForLog/waitForReconcile. */
  mark(): number {
    return this.#lines.length;
  }

  /** The first log line from `from` on that satisfies `pred`. */
  waitForLog(pred: (l: LogLine) => boolean, timeoutMs = 20_000, what = 'a log line', from = 0): Promise<LogLine> {
    const found = this.#lines.slice(from).find(pred);
    if (found) return Promise.resolve(found);
    const tail = () => this.#lines.slice(-15).map((l) => JSON.stringify(l)).join('\n');
    return new Promise<LogLine>((resolve, reject) => {
      const w: Waiter = {
        from,
        pred,
        resolve: (l) => {
          clearTimeout(timer);
          resolve(l);
        },
      };
      const timer = setTimeout(() => {
        this.#waiters.delete(w);
        reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}; last lines:\n${tail()}`));
      }, timeoutMs);
      this.#waiters.add(w);
      void this.exited.then((code) => {
        if (!this.#waiters.delete(w)) return;
        clearTimeout(timer);
        reject(new Error(`agent exited (code ${code}) while waiting for ${what}; last lines:\n${tail()}\n${this.stderr}`));
      });
    });
  }

  /** The next "reconcile finished" line after `from`. */
  waitForReconcile(from: number, timeoutMs = 20_000): Promise<LogLine> {
    return this.waitForLog((l) => l.msg === 'reconcile finished', timeoutMs, 'a finished reconcile', from);
  }

  /** SIGTERM; resolves with the exit code (SIGKILL after `graceMs`, then code null). */
  async stop(graceMs = 10_000): Promise<number | null> {
    if (!this.#running) return this.exited;
    this.child.kill('SIGTERM');
    const timer = setTimeout(() => this.child.kill('SIGKILL'), graceMs);
    try {
      return await this.exited;
    } finally {
      clearTimeout(timer);
    }
  }
}

/** Polls until `check` returns a value other than undefined/false; throws with `describe()` after the timeout. */
export async function eventually<T>(check: () => Promise<T | undefined | false> | T | undefined | false, timeoutMs: number, describe: () => string): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await check();
    if (v !== undefined && v !== false) return v;
    if (Date.now() > deadline) throw new Error(`not reached after ${timeoutMs} ms: ${describe()}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

export interface PinFileContent {
  file: string;
  pins: string[];
}

/** The agent's pin file in a drop-in folder (99-pinset-<uuid>.conf), or null. */
export async function readPinFile(dropinDir: string): Promise<PinFileContent | null> {
  const names = (await readdir(dropinDir).catch(() => [] as string[])).filter((n) => /^99-pinset-.*\.conf$/.test(n));
  if (names.length === 0) return null;
  if (names.length > 1) throw new Error(`more than one pin file in ${dropinDir}: ${names.join(', ')}`);
  const file = path.join(dropinDir, names[0]!);
  const doc = parseToml(await readFile(file, 'utf8')) as { crio?: { image?: { pinned_images?: string[] } } };
  return { file, pins: doc.crio?.image?.pinned_images ?? [] };
}
