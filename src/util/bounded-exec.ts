// Runs a helper program (a kubelet credential provider plugin, a docker
// credential helper) with a bound on its run time and on what it may
// print, and leaves no process of it behind:
// - it starts in a process group of its own (detached), so a plugin that
//   forks (a shell script, a wrapper) is killed whole: SIGKILL to the group
//   when the bound passes or the caller gives up, never a stuck caller;
// - once it exits, whatever it left in its group (a child still holding the
//   pipes) is killed too, so the caller never waits on an orphan;
// - stdout and stderr are read up to a limit; more is a failure.
// The kubelet's exec.CommandContext kills the plugin only, not its
// children (pkg/credentialprovider/plugin/plugin.go); the group is the
// stricter reading of "a hung plugin is killed".
import { spawn } from 'node:child_process';

export interface BoundedRunOptions {
  /** Written to stdin, which is then closed. */
  input?: string;
  env?: NodeJS.ProcessEnv;
  /** The program and its group are killed after this long. */
  timeoutMs: number;
  /** Aborting kills the program and its group at once. */
  signal?: AbortSignal;
  /** Default 4 MiB. */
  maxStdoutBytes?: number;
  /** Default 64 KiB; stderr is cut there, not refused. */
  maxStderrBytes?: number;
}

export interface BoundedRun {
  /** Exit status, or null when it was killed by a signal. */
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: Buffer;
  stderr: string;
  /** Why it did not run to an exit of its own: started not at all, ran out of time, printed too much, cancelled. */
  failure?: string;
  /** The program's pid (its process group's id). */
  pid?: number;
}

function killGroup(pid: number | undefined): void {
  if (!pid) return;
  try {
    process.kill(-pid, 'SIGKILL');
  } catch {
    // ESRCH: nothing left in the group.
  }
}

export function runBounded(file: string, args: readonly string[], opts: BoundedRunOptions): Promise<BoundedRun> {
  const maxOut = opts.maxStdoutBytes ?? 4 << 20;
  const maxErr = opts.maxStderrBytes ?? 64 << 10;
  return new Promise((resolve) => {
    if (opts.signal?.aborted) {
      resolve({ code: null, signal: null, stdout: Buffer.alloc(0), stderr: '', failure: 'cancelled before it started' });
      return;
    }
    const child = spawn(file, args, { detached: true, stdio: ['pipe', 'pipe', 'pipe'], env: opts.env ?? process.env });
    const out: Buffer[] = [];
    let outBytes = 0;
    let err = '';
    let failure: string | undefined;
    let settled = false;
    const stop = (why: string) => {
      failure ??= why;
      killGroup(child.pid);
    };
    const timer = setTimeout(() => stop(`did not finish within ${Math.round(opts.timeoutMs / 100) / 10}s and was killed`), opts.timeoutMs);
    const onAbort = () => stop('cancelled');
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    const finish = (r: Omit<BoundedRun, 'stdout' | 'stderr' | 'pid'>) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      opts.signal?.removeEventListener('abort', onAbort);
      resolve({ ...r, stdout: Buffer.concat(out), stderr: err, pid: child.pid, ...(failure && !r.failure ? { failure } : {}) });
    };
    child.on('error', (e: NodeJS.ErrnoException) => {
      // Not started (ENOENT, EACCES): no group to kill.
      finish({ code: null, signal: null, failure: `could not be started: ${e.code ?? e.message}` });
    });
    child.stdout.on('data', (d: Buffer) => {
      outBytes += d.length;
      if (outBytes > maxOut) return stop(`printed more than ${maxOut} bytes on stdout and was killed`);
      out.push(d);
    });
    child.stderr.setEncoding('utf8').on('data', (d: string) => {
      if (err.length < maxErr) err += d.slice(0, maxErr - err.length);
    });
    // A program that exits without reading stdin closes the pipe: EPIPE is no failure of ours.
    child.stdin.on('error', () => {});
    child.stdin.end(opts.input ?? '');
    // Whatever it left in its group would hold the pipes open: gone with it.
    child.once('exit', () => killGroup(child.pid));
    child.once('close', (code, signal) => finish({ code, signal }));
  });
}
