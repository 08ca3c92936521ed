// A real CRI-O, for the optional suite (`PINSET_CRIO_BIN=/path/to/crio npm
// run test:crio`): run as a plain process in a temporary folder with its own
// root and runroot, vfs storage, crun (or runc) and conmon from the
// distribution, empty CNI folders, a registries.conf mapping the test
// registry names to loopback registries and a policy.json accepting
// anything; behind a private D-Bus whose systemd stand-in reloads it the way
// CRI-O's unit does (ExecReload=kill -HUP $MAINPID: the job ends when the
// signal is sent). Nothing here builds CRI-O; it only runs a binary it is
// given. Stopped by its own PID.
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { stringify as toToml } from 'smol-toml';
import { findBinary, ServerProcess } from './components.ts';
import { CriClient } from './containerd.ts';
import { startPrivateBus, startSystemdStandIn, type PrivateBus, type SystemdStandIn } from './dbus.ts';

export interface RealCrioOptions {
  /** The crio binary. */
  bin: string;
  /** Registry names to loopback `host:port` locations (plain HTTP). */
  registries: Record<string, string>;
  /** CRI-O's pause image (pinned under this name); default a name in the first registry. */
  pauseImage?: string;
  /** The drop-in folder; default `<dir>/crio.conf.d`. */
  dropInDir?: string;
  /**
   * Where CRI-O's files go when they must sit at a node's usual places (the
   * node suite lays out a host root: `<root>/etc/crio/crio.conf`,
   * `<root>/var/run/crio/crio.sock`, ...); each defaults to a file in `<dir>`.
   */
  paths?: { mainConfig?: string; socket?: string; storageRoot?: string; registriesConf?: string; registriesConfDir?: string };
  /** The OCI runtime; default crun when installed, else runc. */
  runtime?: 'crun' | 'runc';
  /** containers/storage's driver; default vfs (no mounts of its own to clean up). */
  storageDriver?: 'vfs' | 'overlay';
  /** CNI: the network folder (CRI-O watches it) and the plugins' folders; default empty folders in `<dir>/cni`. */
  cni?: { confDir: string; pluginDirs: string[] };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** A deadline to race a process's exit against: unref'd, so once the process is gone it keeps the tests' process alive no longer. */
const deadline = (ms: number) => new Promise((r) => setTimeout(r, ms).unref());

/** Why this machine cannot run the real-CRI-O suite, or null. */
export function realCrioMissing(bin: string | undefined): string | null {
  if (!bin) return 'PINSET_CRIO_BIN is not set (the path of a crio binary, e.g. a CRI-O 1.32 build)';
  if (!existsSync(bin)) return `PINSET_CRIO_BIN=${bin} does not exist`;
  if (process.getuid?.() !== 0) return 'CRI-O needs root';
  const missing = ['conmon', ['crun', 'runc']].filter((b) => (Array.isArray(b) ? b.every((x) => !findBinary(x)) : !findBinary(b)));
  if (missing.length) return `missing ${missing.map((m) => (Array.isArray(m) ? m.join(' or ') : m)).join(', ')} (Debian: apt-get install conmon crun)`;
  if (!findBinary('pinns') && !existsSync(join(dirname(bin), 'pinns'))) return `CRI-O needs pinns, on PATH or next to ${bin}`;
  return null;
}

/** CRI-O as a plain process. */
export class RealCrio {
  readonly dir: string;
  readonly bin: string;
  readonly socketPath: string;
  readonly dropInDir: string;
  readonly mainConfig: string;
  readonly pauseImage: string;
  readonly storageRoot: string;
  readonly registriesConf: string;
  readonly registriesConfDir: string;
  readonly runtime: 'crun' | 'runc' | undefined;
  readonly storageDriver: 'vfs' | 'overlay';
  readonly cni: { confDir: string; pluginDirs: string[] };
  proc: ServerProcess | undefined;
  #starts = 0;

  constructor(dir: string, opts: RealCrioOptions) {
    this.dir = dir;
    this.bin = opts.bin;
    this.socketPath = opts.paths?.socket ?? join(dir, 'crio.sock');
    this.dropInDir = opts.dropInDir ?? join(dir, 'crio.conf.d');
    this.mainConfig = opts.paths?.mainConfig ?? join(dir, 'crio.conf');
    this.storageRoot = opts.paths?.storageRoot ?? join(dir, 'root');
    this.registriesConf = opts.paths?.registriesConf ?? join(dir, 'registries.conf');
    this.registriesConfDir = opts.paths?.registriesConfDir ?? join(dir, 'registries.conf.d');
    this.runtime = opts.runtime;
    this.storageDriver = opts.storageDriver ?? 'vfs';
    this.cni = opts.cni ?? { confDir: join(dir, 'cni/net.d'), pluginDirs: [join(dir, 'cni/bin')] };
    this.pauseImage = opts.pauseImage ?? `${Object.keys(opts.registries)[0] ?? 'registry.test'}/pause:3.10`;
  }

  get endpoint(): string {
    return `unix://${this.socketPath}`;
  }

  get pid(): number {
    if (!this.proc?.running) throw new Error('CRI-O is not running');
    return this.proc.pid;
  }

  get running(): boolean {
    return this.proc?.running ?? false;
  }

  /** Writes the configuration (once). */
  async configure(registries: Record<string, string>): Promise<void> {
    const d = this.dir;
    for (const sub of ['cni/net.d', 'cni/bin', 'hooks', 'logs']) await mkdir(join(d, sub), { recursive: true });
    for (const folder of [this.cni.confDir, this.dropInDir, this.registriesConfDir, dirname(this.mainConfig), dirname(this.socketPath), dirname(this.registriesConf)]) await mkdir(folder, { recursive: true });
    const name = this.runtime ?? (findBinary('crun') ? 'crun' : 'runc');
    const runtime = { name, path: findBinary(name)! };
    const pinns = existsSync(join(dirname(this.bin), 'pinns')) ? join(dirname(this.bin), 'pinns') : findBinary('pinns')!;
    const config = {
      crio: {
        root: this.storageRoot,
        runroot: join(d, 'runroot'),
        storage_driver: this.storageDriver,
        log_dir: join(d, 'logs'),
        version_file: join(d, 'version'),
        version_file_persist: join(d, 'version-persist'),
        clean_shutdown_file: join(d, 'clean.shutdown'),
        api: { listen: this.socketPath, stream_address: '127.0.0.1', stream_port: '0' },
        runtime: {
          default_runtime: runtime.name,
          cgroup_manager: 'cgroupfs',
          conmon_cgroup: 'pod',
          hooks_dir: [join(d, 'hooks')],
          default_mounts_file: join(d, 'mounts.conf'),
          container_exits_dir: join(d, 'exits'),
          container_attach_socket_dir: join(d, 'attach'),
          namespaces_dir: join(d, 'ns'),
          pinns_path: pinns,
          decryption_keys_path: join(d, 'keys'),
          irqbalance_config_file: join(d, 'irqbalance'),
          irqbalance_config_restore_file: join(d, 'orig_irq_banned_cpus'),
          cdi_spec_dirs: [join(d, 'cdi')],
          enable_criu_support: false,
          runtimes: { [runtime.name]: { runtime_path: runtime.path, runtime_type: 'oci', runtime_root: join(d, runtime.name), monitor_path: findBinary('conmon')! } },
        },
        image: { signature_policy: join(d, 'policy.json'), signature_policy_dir: join(d, 'policies'), pause_image: this.pauseImage },
        network: { network_dir: this.cni.confDir, plugin_dirs: this.cni.pluginDirs },
        metrics: { enable_metrics: false },
        nri: { enable_nri: false },
      },
    };
    await writeFile(this.mainConfig, toToml(config) + '\n');
    const regs = {
      'unqualified-search-registries': [] as string[],
      'short-name-mode': 'permissive',
      registry: Object.entries(registries).flatMap(([prefix, location]) => [
        { prefix, location, insecure: true },
        // CRI-O sends a PullImage's credentials only to a location named like the reference.
        { location, insecure: true },
      ]),
    };
    await writeFile(this.registriesConf, toToml(regs) + '\n');
    await writeFile(join(d, 'policy.json'), JSON.stringify({ default: [{ type: 'insecureAcceptAnything' }] }));
  }

  #args(): string[] {
    return ['--config', this.mainConfig, '--config-dir', this.dropInDir, '--registries-conf', this.registriesConf, '--registries-conf-dir', this.registriesConfDir, '--log-level', 'info'];
  }

  /** Starts CRI-O and waits until it answers Version (a SIGHUP before then would kill it). Throws with its log if it exits. */
  async start(timeoutMs = 30_000): Promise<void> {
    const args = this.#args();
    this.proc = new ServerProcess('crio', this.bin, args, join(this.dir, `crio-${this.#starts++}.log`));
    const cri = new CriClient(this.endpoint);
    const deadline = Date.now() + timeoutMs;
    try {
      for (;;) {
        if (!this.proc.running) throw new Error(`crio exited (${await this.proc.exited}):\n${this.proc.logTail(15)}`);
        if (existsSync(this.socketPath) && (await cri.version().then(() => true, () => false))) return;
        if (Date.now() > deadline) throw new Error(`crio did not answer within ${timeoutMs} ms:\n${this.proc.logTail(15)}`);
        await sleep(50);
      }
    } finally {
      cri.close();
    }
  }

  /** Starts CRI-O expecting it to refuse; resolves with its exit code and log. */
  async startRefused(timeoutMs = 30_000): Promise<{ code: number | string; log: string }> {
    const args = this.#args();
    const proc = new ServerProcess('crio', this.bin, args, join(this.dir, `crio-${this.#starts++}.log`));
    const code = await Promise.race([proc.exited, deadline(timeoutMs).then(() => 'still running')]);
    if (proc.running) {
      process.kill(proc.pid, 'SIGTERM');
      await proc.exited;
    }
    return { code, log: proc.logTail(10) };
  }

  sighup(): void {
    process.kill(this.pid, 'SIGHUP');
  }

  /** SIGTERM, as systemctl stop does; waits for the exit. */
  async stop(): Promise<void> {
    const p = this.proc;
    if (!p?.running) return;
    process.kill(p.pid, 'SIGTERM');
    const done = await Promise.race([p.exited.then(() => true), deadline(15_000).then(() => false)]);
    if (!done) {
      process.kill(p.pid, 'SIGKILL');
      await p.exited;
    }
  }

  log(): string {
    return this.proc?.logTail(40) ?? '';
  }
}

export interface RealCrioNode {
  crio: RealCrio;
  bus: PrivateBus;
  systemd: SystemdStandIn;
  dropInDir: string;
  /** The agent's --state-dir on this node (not created): where its node lock lives. */
  stateDir: string;
  endpoint: string;
  env: { DBUS_SYSTEM_BUS_ADDRESS: string };
  stop(): Promise<void>;
}

/** A real CRI-O behind a private bus with a systemd stand-in that sends SIGHUP as CRI-O's unit does. */
export async function startRealCrioNode(opts: RealCrioOptions): Promise<RealCrioNode> {
  const dir = await mkdtemp(join(tmpdir(), 'pinset-real-crio-'));
  const cleanups: Array<() => Promise<void> | void> = [() => rm(dir, { recursive: true, force: true })];
  const stop = async () => {
    while (cleanups.length > 0) await cleanups.pop()!();
  };
  try {
    const crio = new RealCrio(dir, opts);
    await crio.configure(opts.registries);
    await crio.start();
    cleanups.push(() => crio.stop());
    const bus = await startPrivateBus();
    cleanups.push(() => bus.dispose());
    // ExecReload=/bin/kill -s HUP $MAINPID: the job ends once the signal is sent.
    const systemd = await startSystemdStandIn({ address: bus.address, units: ['crio.service'], onReload: () => crio.sighup() });
    cleanups.push(() => systemd.close());
    return { crio, bus, systemd, dropInDir: crio.dropInDir, stateDir: join(dir, 'state'), endpoint: crio.endpoint, env: { DBUS_SYSTEM_BUS_ADDRESS: bus.address }, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}
