// The real programs the end-to-end tests drive, and what to do when one is
// missing. Under CI (CI=true) a missing program fails the test: CI installs
// them all (.ci/run), so absence there is a broken machine, not a reason to
// skip. On a developer machine the test is skipped, saying which package to
// install.
import { spawn, type ChildProcess } from 'node:child_process';
import { accessSync, closeSync, constants, openSync, readFileSync } from 'node:fs';
import path from 'node:path';
import type { TestContext } from 'node:test';

export interface Component {
  /** The program looked up on PATH. */
  binary: string;
  /** The Debian package that ships it. */
  aptPackage: string;
  /** A program kept in the project rather than installed: its path from the project's root (not looked up on PATH). */
  projectPath?: string;
  /** The command that puts it there (instead of apt-get install). */
  install?: string;
}

const ROOT = path.resolve(import.meta.dirname, '../..');

export const COMPONENTS = {
  containerd: { binary: 'containerd', aptPackage: 'containerd' },
  runc: { binary: 'runc', aptPackage: 'runc' },
  'docker-registry': { binary: 'docker-registry', aptPackage: 'docker-registry' },
  skopeo: { binary: 'skopeo', aptPackage: 'skopeo' },
  htpasswd: { binary: 'htpasswd', aptPackage: 'apache2-utils' },
  'dbus-daemon': { binary: 'dbus-daemon', aptPackage: 'dbus' },
  openssl: { binary: 'openssl', aptPackage: 'openssl' },
  // Debian trixie's containerd (1.7.24, which honours the pin label),
  // unpacked beside the system's 1.6 by .ci/containerd-1.7.
  'containerd-1.7': {
    binary: 'containerd',
    aptPackage: 'containerd (Debian trixie, unpacked into .cache/containerd-1.7)',
    projectPath: '.cache/containerd-1.7/usr/bin/containerd',
    install: 'bash .ci/containerd-1.7',
  },
  // Debian sid's containerd (2.1.9, what clusters created in 2026 run),
  // unpacked beside the others by .ci/containerd-2.1.
  'containerd-2.1': {
    binary: 'containerd',
    aptPackage: 'containerd (Debian sid, unpacked into .cache/containerd-2.1)',
    projectPath: '.cache/containerd-2.1/usr/bin/containerd',
    install: 'bash .ci/containerd-2.1',
  },
  podman: { binary: 'podman', aptPackage: 'podman' },
  buildah: { binary: 'buildah', aptPackage: 'buildah' },
} as const satisfies Record<string, Component>;

export type ComponentName = keyof typeof COMPONENTS;

// Debian puts runc in /usr/sbin, which is not on every user's PATH.
const EXTRA_DIRS = ['/usr/local/sbin', '/usr/sbin', '/sbin'];

/** Absolute path of an executable, or null when it is not installed. */
export function findBinary(binary: string): string | null {
  const dirs = [...(process.env.PATH ?? '').split(path.delimiter).filter(Boolean), ...EXTRA_DIRS];
  for (const dir of dirs) {
    const candidate = path.join(dir, binary);
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not here
    }
  }
  return null;
}

export function isCI(): boolean {
  const ci = process.env.CI;
  return ci !== undefined && ci !== '' && ci !== 'false' && ci !== '0';
}

/** Absolute path of a component's program, or null when it is not there. */
export function componentPath(name: ComponentName): string | null {
  const c: Component = COMPONENTS[name];
  if (!c.projectPath) return findBinary(c.binary);
  const p = path.join(ROOT, c.projectPath);
  try {
    accessSync(p, constants.X_OK);
    return p;
  } catch {
    return null;
  }
}

/** The components among `names` that are not installed. */
export function missingComponents(names: readonly ComponentName[]): ComponentName[] {
  return names.filter((n) => componentPath(n) === null);
}

/** The commands that install what is missing (apt-get for packages, the project's own scripts for the rest). */
export function installCommand(missing: readonly ComponentName[]): string {
  const list: Component[] = missing.map((n) => COMPONENTS[n]);
  const pkgs = [...new Set(list.filter((c) => !c.install).map((c) => c.aptPackage))];
  const own = [...new Set(list.flatMap((c) => (c.install ? [c.install] : [])))];
  return [...(pkgs.length ? [`sudo apt-get install -y --no-install-recommends ${pkgs.join(' ')}`] : []), ...own].join(' && ');
}

export function missingMessage(missing: readonly ComponentName[]): string {
  const what = missing
    .map((n) => {
      const c: Component = COMPONENTS[n];
      return c.projectPath ? `${c.projectPath} (${c.aptPackage})` : `${c.binary} (apt package ${c.aptPackage})`;
    })
    .join(', ');
  return `missing ${what}; install with: ${installCommand(missing)}`;
}

/**
 * Returns true when every component is installed. Otherwise, under CI, throws
 * (the test fails); elsewhere marks the test skipped with the reason, writes
 * the reason to stderr so it cannot go unnoticed, and returns false: the
 * caller must return at once.
 */
export function requireComponents(t: TestContext, names: readonly ComponentName[]): boolean {
  const missing = missingComponents(names);
  let message = missing.length > 0 ? missingMessage(missing) : '';
  // containerd mounts snapshots and writes under /run: it does not run unprivileged.
  if (!message && names.some((n) => n.startsWith('containerd')) && process.getuid?.() !== 0) message = 'containerd needs root: run the end-to-end tests as root';
  if (!message) return true;
  if (isCI()) {
    throw new Error(`CI=true and ${message}`);
  }
  process.stderr.write(`\n*** SKIPPED end-to-end test "${t.name}": ${message} ***\n\n`);
  t.skip(`SKIPPED: ${message}`);
  return false;
}

// ---------------------------------------------------------------------------
// Running a component as a child process, always stopped by its own PID.

const live = new Set<ChildProcess>();

/** Kill `child` if the test process exits while it still runs. */
export function trackChild(child: ChildProcess): void {
  live.add(child);
  child.once('exit', () => live.delete(child));
  child.once('error', () => live.delete(child));
}

// Last line of defence when a test process ends without its after-hooks
// (an uncaught error): no server outlives the tests.
process.on('exit', () => {
  for (const child of live) {
    if (child.pid !== undefined) {
      try {
        process.kill(child.pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
  }
});

/** A server program run in the foreground of a child process, its output in a log file. */
export class ServerProcess {
  readonly name: string;
  readonly logFile: string;
  readonly child: ChildProcess;
  /** Resolves with the exit code (or signal name) when the process ends. */
  readonly exited: Promise<number | string>;
  #exitedWith: number | string | undefined;

  constructor(name: string, binary: string, args: string[], logFile: string, env?: NodeJS.ProcessEnv) {
    this.name = name;
    this.logFile = logFile;
    const fd = openSync(logFile, 'a');
    try {
      this.child = spawn(binary, args, { stdio: ['ignore', fd, fd], env: env ?? process.env });
    } finally {
      closeSync(fd);
    }
    live.add(this.child);
    this.exited = new Promise((resolve) => {
      this.child.once('exit', (code, signal) => {
        live.delete(this.child);
        this.#exitedWith = code ?? signal ?? 'unknown';
        resolve(this.#exitedWith);
      });
      this.child.once('error', (err) => {
        live.delete(this.child);
        this.#exitedWith = `spawn failed: ${err.message}`;
        resolve(this.#exitedWith);
      });
    });
  }

  get pid(): number {
    if (this.child.pid === undefined) throw new Error(`${this.name} did not start`);
    return this.child.pid;
  }

  get running(): boolean {
    return this.#exitedWith === undefined;
  }

  /** The last lines the process wrote, for error messages. */
  logTail(lines = 20): string {
    try {
      return readFileSync(this.logFile, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
    } catch {
      return '';
    }
  }

  /** SIGTERM, then SIGKILL after `graceMs`; resolves once the process is gone. */
  async stop(graceMs = 5000): Promise<void> {
    if (!this.running) return;
    this.signal('SIGTERM');
    const timer = setTimeout(() => this.signal('SIGKILL'), graceMs);
    try {
      await this.exited;
    } finally {
      clearTimeout(timer);
    }
  }

  /** SIGKILL at once, as a crash would. */
  async kill(): Promise<void> {
    if (!this.running) return;
    this.signal('SIGKILL');
    await this.exited;
  }

  private signal(sig: NodeJS.Signals): void {
    if (this.child.pid === undefined) return;
    try {
      process.kill(this.child.pid, sig);
    } catch {
      // already gone
    }
  }
}

/**
 * Polls `probe` until it returns true. Fails early, with the server's last
 * log lines, when the server exits.
 */
export async function waitUntilServing(server: ServerProcess, probe: () => Promise<boolean>, timeoutMs = 15000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (!server.running) {
      throw new Error(`${server.name} exited (${await server.exited}) before serving:\n${server.logTail()}`);
    }
    if (await probe().catch(() => false)) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`${server.name} (pid ${server.pid}) not serving after ${timeoutMs} ms:\n${server.logTail()}`);
}
