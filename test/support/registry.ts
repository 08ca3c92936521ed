// An OCI registry (distribution, Debian's `docker-registry`) on 127.0.0.1,
// with its storage in a temporary folder, optionally behind htpasswd basic
// auth. Always stopped by PID; can be paused and resumed on the same port and
// storage to play "registry down, then up again".
import { execFile } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { findBinary, ServerProcess, waitUntilServing } from './components.ts';

const run = promisify(execFile);

export interface RegistryCredentials {
  username: string;
  password: string;
}

export interface RegistryOptions {
  /** Require these credentials (htpasswd, bcrypt). */
  auth?: RegistryCredentials;
}

/** A free loopback TCP port (the kernel picks it; the listener is closed before use). */
export async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', resolve);
  });
  const { port } = server.address() as net.AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

export class Registry {
  readonly dir: string;
  readonly port: number;
  readonly auth: RegistryCredentials | undefined;
  readonly #configFile: string;
  #process: ServerProcess | undefined;

  private constructor(dir: string, port: number, configFile: string, auth: RegistryCredentials | undefined) {
    this.dir = dir;
    this.port = port;
    this.#configFile = configFile;
    this.auth = auth;
  }

  static async start(opts: RegistryOptions = {}): Promise<Registry> {
    const binary = findBinary('docker-registry');
    if (!binary) throw new Error('docker-registry is not installed (apt-get install docker-registry)');
    const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-registry-'));
    try {
      const auth = opts.auth ? { ...opts.auth } : undefined;
      let htpasswdFile: string | undefined;
      if (auth) {
        htpasswdFile = path.join(dir, 'htpasswd');
        const htpasswd = findBinary('htpasswd');
        if (!htpasswd) throw new Error('htpasswd is not installed (apt-get install apache2-utils)');
        await run(htpasswd, ['-Bbc', htpasswdFile, auth.username, auth.password]);
      }
      // A port can be taken between freePort() and the registry's bind; try a few.
      let lastError: unknown;
      for (let attempt = 0; attempt < 5; attempt++) {
        const port = await freePort();
        const configFile = path.join(dir, 'config.yml');
        // distribution reads YAML; JSON is YAML, and JSON.stringify escapes paths safely.
        const config = {
          version: 0.1,
          log: { level: 'warn', accesslog: { disabled: true } },
          storage: { filesystem: { rootdirectory: path.join(dir, 'storage') }, delete: { enabled: true } },
          http: { addr: `127.0.0.1:${port}`, secret: 'pinset-test-registry' },
          ...(htpasswdFile ? { auth: { htpasswd: { realm: 'pinset-test', path: htpasswdFile } } } : {}),
        };
        await writeFile(configFile, JSON.stringify(config, null, 2));
        const registry = new Registry(dir, port, configFile, auth);
        try {
          await registry.resume();
          return registry;
        } catch (err) {
          lastError = err;
          await registry.#process?.stop();
        }
      }
      throw lastError;
    } catch (err) {
      await rm(dir, { recursive: true, force: true });
      throw err;
    }
  }

  /** http://127.0.0.1:<port> */
  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  /** 127.0.0.1:<port>, the name a client would use without a mapping. */
  get host(): string {
    return `127.0.0.1:${this.port}`;
  }

  get pid(): number | undefined {
    return this.#process?.running ? this.#process.pid : undefined;
  }

  get running(): boolean {
    return this.#process?.running ?? false;
  }

  /** Basic auth header value for the registry's credentials, if it has any. */
  authorization(): string | undefined {
    if (!this.auth) return undefined;
    return `Basic ${Buffer.from(`${this.auth.username}:${this.auth.password}`).toString('base64')}`;
  }

  /** Stops the registry process; storage and port are kept for resume(). */
  async pause(): Promise<void> {
    await this.#process?.stop();
    this.#process = undefined;
  }

  /** (Re)starts the registry on the same port and storage; resolves once /v2/ answers. */
  async resume(): Promise<void> {
    if (this.#process?.running) return;
    const binary = findBinary('docker-registry');
    if (!binary) throw new Error('docker-registry is not installed (apt-get install docker-registry)');
    const proc = new ServerProcess(`docker-registry on ${this.host}`, binary, ['serve', this.#configFile], path.join(this.dir, 'registry.log'));
    this.#process = proc;
    const expected = this.auth ? 401 : 200;
    await waitUntilServing(proc, async () => {
      const res = await fetch(`${this.url}/v2/`, { signal: AbortSignal.timeout(1000) });
      await res.body?.cancel();
      return res.status === expected;
    });
  }

  /** Stops the process by PID and removes the storage. Safe to call twice. */
  async stop(): Promise<void> {
    await this.pause();
    await rm(this.dir, { recursive: true, force: true });
  }

  logTail(): string {
    return this.#process?.logTail() ?? '';
  }
}
