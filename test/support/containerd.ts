// containerd (CRI v1 ImageService, and its own Images service on the same
// socket) as a plain child process: its root, state, opt folder and sockets
// in a temporary folder, the native snapshotter, and a certs.d that maps
// made-up registry names to loopback registries. Stopped by PID; restart()
// keeps its root, so images and their labels survive.
// `rootBytes` puts its root (content, snapshots: the image filesystem CRI
// ImageFsInfo names) on a tmpfs of that size, for tests of a full disk.
// Three versions: Debian 12's package (1.6.20, on PATH), Debian trixie's
// 1.7.24 unpacked into .cache/containerd-1.7 by .ci/containerd-1.7, and
// Debian sid's 2.1.9 unpacked into .cache/containerd-2.1 by
// .ci/containerd-2.1; all read the same `version = 2` configuration.
// Configuration: ../../../shared/facts/test-bed.md.
import { execFile } from 'node:child_process';
import { mkdir, mkdtemp, rm, stat, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { stringify } from 'smol-toml';
import * as grpc from '@grpc/grpc-js';
import { loadCriPackage } from './cri-proto.ts';
import { promisify } from 'node:util';
import { componentPath, installCommand, ServerProcess, waitUntilServing, type ComponentName } from './components.ts';
import { mountTmpfs, type ScratchFs } from './scratch-fs.ts';

const run = promisify(execFile);

/** Which containerd: '1.6' is the system's (Debian 12), '1.7' and '2.1' the project's copies of Debian trixie's and sid's. */
export type ContainerdVersion = '1.6' | '1.7' | '2.1';

/** The versions that honour the pin label, which every end-to-end test of pins runs on. */
export const PINNING_CONTAINERD_VERSIONS: readonly ContainerdVersion[] = ['1.7', '2.1'];

/** The component that provides a containerd version (for requireComponents). */
export function containerdComponent(version: ContainerdVersion = '1.6'): ComponentName {
  return version === '1.6' ? 'containerd' : `containerd-${version}`;
}

/** The containerd binary of a version, or an Error saying how to get it. */
export function containerdBinary(version: ContainerdVersion = '1.6'): string {
  const component = containerdComponent(version);
  const bin = componentPath(component);
  if (!bin) throw new Error(`containerd ${version} is not installed; install with: ${installCommand([component])}`);
  return bin;
}

export interface ContainerdOptions {
  /** Default '1.6', the system's. */
  version?: ContainerdVersion;
  /** Made-up registry host -> loopback URL it stands for, e.g. {'registry.test': 'http://127.0.0.1:5000'}. */
  mirrors?: Record<string, string>;
  /** The CRI sandbox image; only used for pods, never pulled by these tests. */
  sandboxImage?: string;
  /** containerd's root (content and snapshots: the image filesystem CRI ImageFsInfo names), e.g. on a small tmpfs. Default: <dir>/root. */
  root?: string;
  /** Its root on a tmpfs of this many bytes, made in the temporary folder (a small image filesystem); not with `root`. */
  rootBytes?: number;
  /** Its socket (a node's /run/containerd/containerd.sock or /run/k3s/containerd/containerd.sock under a host root); default in its folder. */
  socketPath?: string;
  /** Its registry hosts folder (config_path); default <dir>/certs.d. */
  certsDir?: string;
}

export class Containerd {
  readonly dir: string;
  readonly socket: string;
  /** The containerd program this one runs (ctr lies beside it). */
  readonly binary: string;
  readonly #configFile: string;
  #process: ServerProcess | undefined;
  #rootFs: ScratchFs | undefined;

  readonly certsDir: string;

  private constructor(dir: string, binary: string, opts: ContainerdOptions = {}) {
    this.dir = dir;
    this.binary = binary;
    this.socket = opts.socketPath ?? path.join(dir, 'containerd.sock');
    this.certsDir = opts.certsDir ?? path.join(dir, 'certs.d');
    this.#configFile = path.join(dir, 'config.toml');
  }

  static async start(opts: ContainerdOptions = {}): Promise<Containerd> {
    const binary = containerdBinary(opts.version);
    if (process.getuid?.() !== 0) throw new Error('containerd needs root here (mounts for the snapshotter, /run for its shims)');
    // Unix socket paths are limited to 107 bytes: keep the folder short.
    const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-ctrd-'));
    const c = new Containerd(dir, binary, opts);
    try {
      if (opts.rootBytes !== undefined && opts.root !== undefined) throw new Error('Containerd.start: give root or rootBytes, not both');
      if (opts.rootBytes !== undefined) {
        const fs = await mountTmpfs(path.join(dir, 'root'), opts.rootBytes);
        if (typeof fs === 'string') throw new Error(fs);
        c.#rootFs = fs;
      }
      await c.writeConfig(opts);
      await c.start();
      return c;
    } catch (err) {
      await c.stop();
      throw err;
    }
  }

  /** unix:///... for a CRI client. */
  get endpoint(): string {
    return `unix://${this.socket}`;
  }

  get pid(): number | undefined {
    return this.#process?.running ? this.#process.pid : undefined;
  }

  get running(): boolean {
    return this.#process?.running ?? false;
  }

  /** Maps a made-up host to a registry URL; containerd re-reads certs.d on every pull. */
  async mapHost(host: string, url: string): Promise<void> {
    const hostDir = path.join(this.certsDir, host);
    await mkdir(hostDir, { recursive: true });
    await writeFile(
      path.join(hostDir, 'hosts.toml'),
      stringify({ server: url, host: { [url]: { capabilities: ['pull', 'resolve'] } } }),
    );
  }

  private async writeConfig(opts: ContainerdOptions): Promise<void> {
    for (const sub of ['root', 'state', 'opt']) await mkdir(path.join(this.dir, sub), { recursive: true });
    await mkdir(this.certsDir, { recursive: true });
    await mkdir(path.dirname(this.socket), { recursive: true });
    for (const [host, url] of Object.entries(opts.mirrors ?? {})) await this.mapHost(host, url);
    const config = {
      version: 2,
      root: opts.root ?? path.join(this.dir, 'root'),
      state: path.join(this.dir, 'state'),
      grpc: { address: this.socket },
      ttrpc: { address: `${this.socket}.ttrpc` },
      // Snapshotters that cannot work in a temp folder only add noise to the log.
      disabled_plugins: [
        'io.containerd.snapshotter.v1.aufs',
        'io.containerd.snapshotter.v1.btrfs',
        'io.containerd.snapshotter.v1.devmapper',
        'io.containerd.snapshotter.v1.zfs',
      ],
      plugins: {
        // Without this containerd creates /opt/containerd.
        'io.containerd.internal.v1.opt': { path: path.join(this.dir, 'opt') },
        'io.containerd.grpc.v1.cri': {
          sandbox_image: opts.sandboxImage ?? 'registry.test/pinset-test/pause@sha256:0000000000000000000000000000000000000000000000000000000000000000',
          containerd: { snapshotter: 'native' },
          registry: { config_path: this.certsDir },
        },
      },
    };
    await writeFile(this.#configFile, stringify(config));
  }

  /** `containerd --version`'s version, e.g. "1.7.24~ds1". */
  async version(): Promise<string> {
    const { stdout } = await run(this.binary, ['--version']);
    return stdout.trim().split(/\s+/)[2] ?? stdout.trim();
  }

  /** Runs this containerd's own `ctr` on its socket (namespace k8s.io unless args name one); resolves with stdout. */
  async ctr(args: string[]): Promise<string> {
    const ns = args.includes('-n') || args.includes('--namespace') ? [] : ['-n', 'k8s.io'];
    const { stdout } = await run(path.join(path.dirname(this.binary), 'ctr'), ['--address', this.socket, ...ns, ...args]);
    return stdout;
  }

  /** Starts containerd (again) on the same root, state and socket; resolves once the CRI socket answers. */
  async start(): Promise<void> {
    if (this.#process?.running) return;
    // containerd finds its shims and runc on PATH: its own folder first (the
    // project's 1.7 ships its own shims); Debian installs runc in /usr/sbin.
    const env = { ...process.env, PATH: `${path.dirname(this.binary)}:${process.env.PATH ?? ''}:/usr/local/sbin:/usr/sbin:/sbin` };
    const proc = new ServerProcess(`containerd in ${this.dir}`, this.binary, ['--config', this.#configFile], path.join(this.dir, 'containerd.log'), env);
    this.#process = proc;
    await waitUntilServing(proc, async () => {
      const s = await stat(this.socket).catch(() => null);
      return s !== null && s.isSocket() && (await this.answersCri());
    });
  }

  /** The CRI plugin loads after the socket appears; wait until it answers a Version call. */
  private async answersCri(): Promise<boolean> {
    const cri = new CriClient(this.endpoint);
    try {
      const v = await cri.version({ deadlineMs: 1000 });
      return v.runtimeName === 'containerd';
    } finally {
      cri.close();
    }
  }

  /** SIGTERM (SIGKILL after 5 s). Root and state are kept for start(). */
  async shutdown(): Promise<void> {
    await this.#process?.stop();
  }

  /** SIGKILL, as a crash would. Root and state are kept for start(). */
  async kill(): Promise<void> {
    await this.#process?.kill();
  }

  /** Stop then start, keeping the root: images survive. */
  async restart(): Promise<void> {
    await this.shutdown();
    await this.start();
  }

  /** Stops by PID and removes everything it had. Safe to call twice. */
  async stop(): Promise<void> {
    await this.shutdown();
    this.#process = undefined;
    await this.#rootFs?.unmount();
    this.#rootFs = undefined;
    await rm(this.dir, { recursive: true, force: true, maxRetries: 3 });
  }

  logTail(lines = 30): string {
    return this.#process?.logTail(lines) ?? '';
  }
}

// ---------------------------------------------------------------------------
// A bare CRI v1 client (grpc-js + proto/cri-image.proto), independent of the
// agent's own client: the tests look at containerd through it, and the
// benchmark's baseline is a loop over it.

// The wire schema is the project's one proto file (./cri-proto.ts).
export { PROTO_PATH as CRI_PROTO } from './cri-proto.ts';

export interface CriImage {
  id: string;
  repoTags: string[];
  repoDigests: string[];
  size: number;
  pinned: boolean;
  spec: { image: string; runtimeHandler: string } | null;
}

export interface CriAuth {
  username?: string;
  password?: string;
  auth?: string;
  serverAddress?: string;
}

interface CallOptions {
  deadlineMs?: number;
}

type Unary = (req: object, meta: grpc.Metadata, opts: grpc.CallOptions, cb: (err: grpc.ServiceError | null, res: any) => void) => grpc.ClientUnaryCall;

export function criPackage(): any {
  return (loadCriPackage() as any).runtime.v1;
}

export class CriClient {
  readonly endpoint: string;
  readonly #image: grpc.Client;
  readonly #runtime: grpc.Client;

  constructor(endpoint: string) {
    this.endpoint = endpoint;
    const pkg = criPackage();
    // unix:///path is grpc-js's own spelling of a unix socket target.
    this.#image = new pkg.ImageService(endpoint, grpc.credentials.createInsecure());
    this.#runtime = new pkg.RuntimeService(endpoint, grpc.credentials.createInsecure());
  }

  #call<T>(client: grpc.Client, method: string, req: object, opts: CallOptions = {}): Promise<T> {
    const fn = (client as unknown as Record<string, Unary>)[method].bind(client);
    const callOpts: grpc.CallOptions = opts.deadlineMs ? { deadline: Date.now() + opts.deadlineMs } : {};
    return new Promise((resolve, reject) => {
      fn(req, new grpc.Metadata(), callOpts, (err, res) => (err ? reject(err) : resolve(res as T)));
    });
  }

  version(opts?: CallOptions): Promise<{ version: string; runtimeName: string; runtimeVersion: string; runtimeApiVersion: string }> {
    return this.#call(this.#runtime, 'version', { version: 'v1' }, opts);
  }

  async listImages(opts?: CallOptions): Promise<CriImage[]> {
    const res = await this.#call<{ images: CriImage[] }>(this.#image, 'listImages', {}, opts);
    return res.images;
  }

  /** null when the image is absent. */
  async imageStatus(ref: string, opts?: CallOptions & { runtimeHandler?: string }): Promise<CriImage | null> {
    const res = await this.#call<{ image: CriImage | null }>(this.#image, 'imageStatus', { image: { image: ref, runtimeHandler: opts?.runtimeHandler ?? '' } }, opts);
    return res.image && res.image.id ? res.image : null;
  }

  /** Resolves to the image ref containerd returns (the config digest). */
  async pullImage(ref: string, opts: CallOptions & { auth?: CriAuth; runtimeHandler?: string } = {}): Promise<string> {
    const req: Record<string, unknown> = { image: { image: ref, runtimeHandler: opts.runtimeHandler ?? '' } };
    if (opts.auth) req.auth = opts.auth;
    const res = await this.#call<{ imageRef: string }>(this.#image, 'pullImage', req, opts);
    return res.imageRef;
  }

  async removeImage(ref: string, opts?: CallOptions): Promise<void> {
    await this.#call(this.#image, 'removeImage', { image: { image: ref } }, opts);
  }

  close(): void {
    this.#image.close();
    this.#runtime.close();
  }
}
