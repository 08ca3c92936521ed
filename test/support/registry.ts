// An OCI registry (distribution, Debian's `docker-registry`) on 127.0.0.1,
// with its storage in a temporary folder, optionally behind htpasswd basic
// auth. Always stopped by PID; can be paused and resumed on the same port and
// storage to play "registry down, then up again".
// With `proxy` it is a pull-through cache of another registry (distribution's
// proxy mode: shared/facts/registry-caches.md); with `configFile` it runs a
// configuration of the caller's (deploy/cache's), given its address, storage
// and upstream through the environment as a pod's would be
// (REGISTRY_HTTP_ADDR, REGISTRY_STORAGE_FILESYSTEM_ROOTDIRECTORY,
// REGISTRY_PROXY_*: distribution lets the environment set any key).
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { Agent, fetch as undiciFetch } from 'undici';
import { findBinary, ServerProcess, waitUntilServing } from './components.ts';

const run = promisify(execFile);

export interface RegistryCredentials {
  username: string;
  password: string;
}

export interface TokenAuthConfig {
  /** URL of the token service clients are sent to. */
  realm: string;
  service: string;
  issuer: string;
  /** PEM file of the certificates whose keys may sign tokens. */
  rootCertBundle: string;
}

export interface RegistryOptions {
  /** Require these credentials (htpasswd, bcrypt). */
  auth?: RegistryCredentials;
  /** Require bearer tokens from a token service (distribution's `auth: token`). */
  tokenAuth?: TokenAuthConfig;
  /** Serve HTTPS with this certificate and key (PEM files); with clientCas, only to clients with a certificate they signed. */
  tls?: { certificate: string; key: string; clientCas?: string[]; probeClient?: { cert: string; key: string } };
  /** A pull-through cache of this registry (distribution's proxy mode), logging in with these credentials when given. */
  proxy?: { remoteurl: string; username?: string; password?: string };
  /** Run this distribution configuration file (YAML) instead of one of this helper's; address, storage and `proxy` come through the environment. */
  configFile?: string;
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

/** distribution's environment names for the `proxy` section's keys (REGISTRY_<SECTION>_<KEY>), as deploy/cache/ sets them. */
export const PROXY_ENV = { remoteurl: 'REGISTRY_PROXY_REMOTEURL', username: 'REGISTRY_PROXY_USERNAME', password: 'REGISTRY_PROXY_PASSWORD' } as const;

function proxyEnv(proxy: RegistryOptions['proxy']): NodeJS.ProcessEnv {
  if (!proxy) return {};
  return {
    [PROXY_ENV.remoteurl]: proxy.remoteurl,
    ...(proxy.username !== undefined ? { [PROXY_ENV.username]: proxy.username } : {}),
    ...(proxy.password !== undefined ? { [PROXY_ENV.password]: proxy.password } : {}),
  };
}

export class Registry {
  readonly dir: string;
  readonly port: number;
  readonly auth: RegistryCredentials | undefined;
  readonly tls: boolean;
  readonly tokenAuth: boolean;
  readonly #configFile: string;
  /** The registry process's environment (configuration set through it); undefined: this process's. */
  #env: NodeJS.ProcessEnv | undefined;
  #process: ServerProcess | undefined;
  /** The client certificate the readiness probe shows a registry that asks for one (files). */
  #probeClient: { cert: string; key: string } | undefined;

  private constructor(dir: string, port: number, configFile: string, auth: RegistryCredentials | undefined, tls = false, tokenAuth = false) {
    this.dir = dir;
    this.port = port;
    this.#configFile = configFile;
    this.auth = auth;
    this.tls = tls;
    this.tokenAuth = tokenAuth;
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
        const storage = path.join(dir, 'storage');
        if (opts.configFile) {
          const registry = new Registry(dir, port, opts.configFile, undefined);
          registry.#env = {
            ...process.env,
            REGISTRY_HTTP_ADDR: `127.0.0.1:${port}`,
            REGISTRY_STORAGE_FILESYSTEM_ROOTDIRECTORY: storage,
            ...proxyEnv(opts.proxy),
          };
          try {
            await registry.resume();
            return registry;
          } catch (err) {
            lastError = err;
            await registry.#process?.stop();
            continue;
          }
        }
        const configFile = path.join(dir, 'config.yml');
        // distribution reads YAML; JSON is YAML, and JSON.stringify escapes paths safely.
        const config = {
          version: 0.1,
          log: { level: 'warn', accesslog: { disabled: true } },
          storage: { filesystem: { rootdirectory: storage }, delete: { enabled: true } },
          http: {
            addr: `127.0.0.1:${port}`,
            secret: 'pinset-test-registry',
            ...(opts.tls ? { tls: { certificate: opts.tls.certificate, key: opts.tls.key, ...(opts.tls.clientCas ? { clientcas: opts.tls.clientCas } : {}) } } : {}),
          },
          ...(htpasswdFile ? { auth: { htpasswd: { realm: 'pinset-test', path: htpasswdFile } } } : {}),
          ...(opts.proxy ? { proxy: opts.proxy } : {}),
          ...(opts.tokenAuth
            ? {
                auth: {
                  token: { realm: opts.tokenAuth.realm, service: opts.tokenAuth.service, issuer: opts.tokenAuth.issuer, rootcertbundle: opts.tokenAuth.rootCertBundle },
                },
              }
            : {}),
        };
        await writeFile(configFile, JSON.stringify(config, null, 2));
        const registry = new Registry(dir, port, configFile, auth, Boolean(opts.tls), Boolean(opts.tokenAuth));
        registry.#probeClient = opts.tls?.probeClient;
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

  /** http://127.0.0.1:<port> (https:// when serving TLS) */
  get url(): string {
    return `${this.tls ? 'https' : 'http'}://127.0.0.1:${this.port}`;
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

  /** A bearer token the test helpers push with (token-auth registries). */
  bearer: string | undefined;

  /** Authorization header value for the test helpers: the bearer token, else basic auth for the registry's credentials. */
  authorization(): string | undefined {
    if (this.bearer) return `Bearer ${this.bearer}`;
    if (!this.auth) return undefined;
    return `Basic ${Buffer.from(`${this.auth.username}:${this.auth.password}`).toString('base64')}`;
  }

  /**
   * Sets `user`'s password in an htpasswd registry: a second user, or a new
   * password for one it has (a rotation: the old one stops working). A
   * running registry is restarted on the same port to read it.
   */
  async setUser(user: RegistryCredentials): Promise<void> {
    if (!this.auth) throw new Error(`the registry on ${this.host} has no htpasswd authentication`);
    const htpasswd = findBinary('htpasswd');
    if (!htpasswd) throw new Error('htpasswd is not installed (apt-get install apache2-utils)');
    await run(htpasswd, ['-Bb', path.join(this.dir, 'htpasswd'), user.username, user.password]);
    if (this.running) {
      await this.pause();
      await this.resume();
    }
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
    const proc = new ServerProcess(`docker-registry on ${this.host}`, binary, ['serve', this.#configFile], path.join(this.dir, 'registry.log'), this.#env);
    this.#process = proc;
    const expected = this.auth || this.tokenAuth ? 401 : 200;
    // A TLS registry's certificate is the test's own: the probe does not check it.
    const client = this.#probeClient ? { cert: await readFile(this.#probeClient.cert), key: await readFile(this.#probeClient.key) } : {};
    const dispatcher = this.tls ? new Agent({ connect: { rejectUnauthorized: false, ...client } }) : undefined;
    try {
      await waitUntilServing(proc, async () => {
        const res = await undiciFetch(`${this.url}/v2/`, { signal: AbortSignal.timeout(1000), ...(dispatcher ? { dispatcher } : {}) });
        await res.body?.cancel();
        return res.status === expected;
      });
    } finally {
      await dispatcher?.close();
    }
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
