// Runs `pinset agent` as its own process, the way a user (or the
// DaemonSet) starts it, and gives tests its log lines. Always stopped by
// its own PID.
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { NodeSetStatus } from '../../src/api/types.ts';

export const MAIN = fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url));

export type LogLine = Record<string, unknown> & { msg?: string; level?: string };

export interface AgentProcess {
  proc: ChildProcess;
  /** Parsed JSON log lines so far. */
  logs: LogLine[];
  /** Raw output (stdout + stderr), for secret scans. */
  output(): string;
  waitForLog(pred: (l: LogLine) => boolean, timeoutMs?: number, what?: string): Promise<LogLine>;
  /** Number of log lines so far: pass to waitForLog's `after` style helpers. */
  mark(): number;
  /** Wait for a "reconcile finished" line after `mark`. */
  waitForReconcile(after: number, timeoutMs?: number): Promise<LogLine>;
  /** SIGTERM, then SIGKILL after `graceMs`; resolves to the exit code (null if killed). */
  stop(graceMs?: number): Promise<number | null>;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

export function startAgent(args: string[], env: Record<string, string> = {}): AgentProcess {
  const proc = spawn(process.execPath, [MAIN, 'agent', ...args], {
    env: { ...process.env, KUBECONFIG: '', KUBERNETES_SERVICE_HOST: '', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const logs: LogLine[] = [];
  let raw = '';
  const waiters: { pred: (l: LogLine) => boolean; resolve: (l: LogLine) => void; from: number }[] = [];
  let buf = '';
  const onData = (chunk: Buffer) => {
    const text = chunk.toString('utf8');
    raw += text;
    buf += text;
    let nl: number;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      let parsed: LogLine;
      try {
        parsed = JSON.parse(line) as LogLine;
      } catch {
        parsed = { msg: line, level: 'raw' };
      }
      logs.push(parsed);
      for (const w of [...waiters]) {
        if (logs.length - 1 >= w.from && w.pred(parsed)) {
          waiters.splice(waiters.indexOf(w), 1);
          w.resolve(parsed);
        }
      }
    }
  };
  proc.stdout!.on('data', onData);
  proc.stderr!.on('data', onData);
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => proc.once('exit', (code, signal) => resolve({ code, signal })));

  const waitFrom = (from: number, pred: (l: LogLine) => boolean, timeoutMs = 20_000, what = 'log line') =>
    new Promise<LogLine>((resolve, reject) => {
      const found = logs.slice(from).find(pred);
      if (found) return resolve(found);
      const w = { pred, from, resolve: (l: LogLine) => (clearTimeout(t), resolve(l)) };
      const t = setTimeout(() => {
        waiters.splice(waiters.indexOf(w), 1);
        reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}; last lines:\n${logs.slice(-15).map((l) => JSON.stringify(l)).join('\n')}`));
      }, timeoutMs);
      waiters.push(w);
      void exited.then(({ code }) => {
        if (waiters.includes(w)) {
          clearTimeout(t);
          waiters.splice(waiters.indexOf(w), 1);
          reject(new Error(`agent exited (code ${code}) while waiting for ${what}; last lines:\n${logs.slice(-15).map((l) => JSON.stringify(l)).join('\n')}`));
        }
      });
    });

  return {
    proc,
    logs,
    output: () => raw,
    mark: () => logs.length,
    waitForLog: (pred, timeoutMs, what) => waitFrom(0, pred, timeoutMs, what),
    waitForReconcile: (after, timeoutMs) => waitFrom(after, (l) => l.msg === 'reconcile finished', timeoutMs, 'a finished reconcile'),
    async stop(graceMs = 10_000) {
      if (proc.exitCode !== null || proc.signalCode !== null) return proc.exitCode;
      proc.kill('SIGTERM');
      const t = setTimeout(() => proc.kill('SIGKILL'), graceMs);
      const { code } = await exited;
      clearTimeout(t);
      return code;
    },
    exited,
  };
}

/** `pinset agent --once`: exit code, the per-set JSON lines, and the logs (stderr). */
export async function runAgentOnce(args: string[], env: Record<string, string> = {}): Promise<{ code: number | null; sets: NodeSetStatus[]; stdout: string; stderr: string }> {
  const proc = spawn(process.execPath, [MAIN, 'agent', '--once', ...args], {
    env: { ...process.env, KUBECONFIG: '', KUBERNETES_SERVICE_HOST: '', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  proc.stdout.on('data', (c: Buffer) => (stdout += c.toString('utf8')));
  proc.stderr.on('data', (c: Buffer) => (stderr += c.toString('utf8')));
  const killer = setTimeout(() => proc.kill('SIGKILL'), 120_000);
  const code = await new Promise<number | null>((resolve) => proc.once('exit', (c) => resolve(c)));
  clearTimeout(killer);
  const sets = stdout
    .split('\n')
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l) as NodeSetStatus);
  return { code, sets, stdout, stderr };
}
