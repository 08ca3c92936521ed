// Runs one of pinset's commands in this process, as `pinset <command>`
// would, with its standard input given and its output collected.
import { execFile } from 'node:child_process';
import path from 'node:path';
import { PassThrough } from 'node:stream';
import type { CommandIO } from '../../src/cli/resolve.ts';
import { argvFor, bundledCli } from './agent-process.ts';

const ROOT = path.resolve(import.meta.dirname, '../..');

export interface CliOutput {
  code: number;
  stdout: string;
  stderr: string;
}

/** `fn` is a command's `run(argv, io)`; `stdinText` is what it reads from `-`. */
export async function runCli(fn: (argv: string[], io: CommandIO) => Promise<number>, args: string[], stdinText = ''): Promise<CliOutput> {
  const stdin = new PassThrough();
  stdin.end(stdinText);
  let stdout = '';
  let stderr = '';
  const sink = (f: (s: string) => void) => Object.assign(new PassThrough(), { write: (c: string | Buffer) => (f(String(c)), true) });
  const code = await fn(args, { stdin, stdout: sink((s) => (stdout += s)), stderr: sink((s) => (stderr += s)) });
  return { code, stdout, stderr };
}

/** The command as shipped: the bundle (checked to be built from these sources), with the Node.js flags of its first line, in a process of its own. */
export async function runShipped(args: string[], env: Record<string, string>, stdinText = ''): Promise<CliOutput> {
  const argv = argvFor(await bundledCli());
  return new Promise((done) => {
    const child = execFile(process.execPath, [...argv, ...args], { cwd: ROOT, env: { ...process.env, ...env }, timeout: 60_000 }, (err, stdout, stderr) => {
      const code = err ? (typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : -1) : 0;
      done({ code, stdout, stderr });
    });
    child.stdin?.end(stdinText);
  });
}
