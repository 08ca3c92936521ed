// The container runtime of the node suite's real node (./real-node.ts): a
// real CRI-O (PINSET_CRIO_BIN) behind a private D-Bus whose systemd stand-in
// reloads it as its unit does, or a real containerd (PINSET_CONTAINERD_BIN,
// else the 1.7.24 that .ci/containerd-1.7 unpacks into .cache/containerd-1.7).
// Each runs as a plain process with its files at the node's usual paths
// under the bed's host root, so the shipped DaemonSet's hostPath volumes
// (deploy/ or deploy/containerd/) find them there; each is stopped by its own
// PID, and what it started (conmon, containerd's shims) by theirs.
//
// Both start with no network configuration, as a node does before its CNI
// plugin is installed: the runtime reports NetworkReady=false and the kubelet
// keeps the Node NotReady. `installNetwork` then writes a bridge network of
// the CNI reference plugins (Debian's containernetworking-plugins) into the
// folder the runtime watches; nothing on the host changes until a pod that is
// not on the host's network uses it, and the suite runs none.
import { execFile, execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { mkdir, readdir, rename, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { stringify as toToml } from 'smol-toml';
import { componentPath, findBinary, ServerProcess, waitUntilServing } from './components.ts';
import { CriClient } from './containerd.ts';
import { PrivateBus, startSystemdStandIn, type SystemdStandIn } from './dbus.ts';
import { RealCrio, realCrioMissing } from './real-crio.ts';

const run = promisify(execFile);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export type RuntimeName = 'crio' | 'containerd';
export const RUNTIME_NAMES: readonly RuntimeName[] = ['crio', 'containerd'];

/** Where the CNI reference plugins are (Debian's containernetworking-plugins). */
export const CNI_PLUGIN_DIR = '/usr/lib/cni';

/** The containerd binary the suite runs: PINSET_CONTAINERD_BIN, else the project's 1.7. */
export function containerdBinaryFor(env: NodeJS.ProcessEnv = process.env): string | null {
  return env.PINSET_CONTAINERD_BIN || componentPath('containerd-1.7');
}

/** Why this machine cannot run the suite on `name`, or null. */
export function runtimeMissing(name: RuntimeName, env: NodeJS.ProcessEnv = process.env): string | null {
  if (name === 'crio') return realCrioMissing(env.PINSET_CRIO_BIN);
  const bin = containerdBinaryFor(env);
  if (!bin) return 'PINSET_CONTAINERD_BIN is not set and .cache/containerd-1.7 holds no containerd (bash .ci/containerd-1.7 unpacks 1.7.24)';
  if (!existsSync(bin)) return `PINSET_CONTAINERD_BIN=${bin} does not exist`;
  if (process.getuid?.() !== 0) return 'containerd needs root';
  const stdout = execFileSync(bin, ['--version'], { encoding: 'utf8' });
  const v = /\bv?(\d+)\.(\d+)\.(\d+)/.exec(stdout);
  if (!v) return `cannot read the version of ${bin} (${stdout.trim()})`;
  const [maj, min, patch] = v.slice(1).map(Number) as [number, number, number];
  // The versions whose CRI honours io.cri-containerd.pinned set after a pull (docs/runtimes.md).
  const pins = maj >= 2 || (maj === 1 && ((min === 6 && patch >= 25) || (min === 7 && patch >= 10)));
  if (!pins) return `${bin} is containerd ${v[0]}, which does not report pins to the kubelet (1.6.25+, 1.7.10+ or 2.x do)`;
  if (!existsSync(join(dirname(bin), 'containerd-shim-runc-v2')) && !findBinary('containerd-shim-runc-v2')) return `containerd-shim-runc-v2 is neither beside ${bin} nor on PATH`;
  if (!existsSync(join(dirname(bin), 'ctr')) && !findBinary('ctr')) return `ctr is neither beside ${bin} nor on PATH (the suite pins an image by hand with it)`;
  if (!existsSync(join(CNI_PLUGIN_DIR, 'bridge'))) return `no CNI plugins in ${CNI_PLUGIN_DIR} (apt-get install containernetworking-plugins)`;
  return null;
}

const CAP_SYS_RESOURCE = 24;

/** Whether this process may lower an oom_score_adj (CAP_SYS_RESOURCE in its effective set). */
export function canLowerOomScore(): boolean {
  const hex = /^CapEff:\s*([0-9a-f]+)$/m.exec(readFileSync('/proc/self/status', 'utf8'))?.[1];
  return hex !== undefined && ((BigInt(`0x${hex}`) >> BigInt(CAP_SYS_RESOURCE)) & 1n) === 1n;
}

/** What the suite watches of the runtime's pins while the agent is replaced. */
export interface PinWriteRecord {
  /** CRI-O: every pinset drop-in file name seen in the drop-in folder, and the most seen at once. */
  dropIns?: { names: string[]; mostAtOnce: number; reloads: number };
  /** containerd: every update of an image record containerd published (its /images/update events). */
  labelUpdates?: Array<{ at: number; name: string; labels: Record<string, string> }>;
}

export interface PinWriteWatch {
  stop(): Promise<PinWriteRecord>;
}

export interface NodeRuntime {
  readonly name: RuntimeName;
  /** The CRI socket the kubelet and the agent use. */
  readonly endpoint: string;
  /** What to apply: deploy/ (CRI-O) or deploy/containerd/. */
  start(): Promise<void>;
  /** Stops the runtime and whatever it started for containers. */
  stop(): Promise<void>;
  logTail(lines?: number): string;
  /** Every log file the runtime wrote in this bed (every start of it). */
  logFiles(): string[];
  /** Writes the CNI network the runtime loads (it watches the folder). */
  installNetwork(): Promise<void>;
  /** Pins `ref` as an administrator would, outside pinset. */
  handPin(ref: string): Promise<string>;
  /** Records pinset's writes to the runtime's pins until stopped. */
  watchPinWrites(): Promise<PinWriteWatch>;
}

function bridgeNetwork(ipamDir: string) {
  return {
    cniVersion: '1.0.0',
    name: 'pinset-node-suite',
    plugins: [
      {
        type: 'bridge',
        bridge: 'pinset-br0',
        isGateway: true,
        ipMasq: false,
        ipam: { type: 'host-local', ranges: [[{ subnet: '10.244.77.0/24' }]], dataDir: ipamDir },
      },
      { type: 'portmap', capabilities: { portMappings: true } },
    ],
  };
}

/** The network file, renamed into the folder whole: the runtime reads it as soon as it appears. */
async function writeNetwork(confDir: string, ipamDir: string): Promise<void> {
  await mkdir(confDir, { recursive: true });
  const file = join(confDir, '10-pinset-node-suite.conflist');
  await writeFile(`${file}.part`, JSON.stringify(bridgeNetwork(ipamDir), null, 2));
  await rename(`${file}.part`, file);
}

/** SIGKILLs the processes whose command line starts with `exe` and mentions `marker` (what a runtime left running for this bed). */
export async function killLeftovers(exeNames: string[], marker: string): Promise<number> {
  let killed = 0;
  for (const pid of await readdir('/proc').catch(() => [] as string[])) {
    if (!/^\d+$/.test(pid)) continue;
    let cmdline = '';
    try {
      cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
    } catch {
      continue;
    }
    const exe = cmdline.split('\0')[0] ?? '';
    if (exeNames.some((n) => exe === n || exe.endsWith(`/${n}`)) && cmdline.includes(marker)) {
      try {
        process.kill(Number(pid), 'SIGKILL');
        killed++;
      } catch {
        // gone meanwhile
      }
    }
  }
  return killed;
}

// ---------------------------------------------------------------------------
// CRI-O

export class CrioNodeRuntime implements NodeRuntime {
  readonly name = 'crio' as const;
  readonly crio: RealCrio;
  readonly bus: PrivateBus;
  systemd: SystemdStandIn | undefined;
  readonly #hostRoot: string;
  readonly #cniConfDir: string;
  readonly #state: string;
  readonly #registries: Record<string, string>;

  constructor(opts: { bin: string; hostRoot: string; state: string; registries: Record<string, string> }) {
    const host = (p: string) => join(opts.hostRoot, p);
    this.#hostRoot = opts.hostRoot;
    this.#registries = opts.registries;
    this.#state = opts.state;
    this.#cniConfDir = join(opts.state, 'crio', 'cni', 'net.d');
    this.crio = new RealCrio(join(opts.state, 'crio'), {
      bin: opts.bin,
      registries: opts.registries,
      dropInDir: host('etc/crio/crio.conf.d'),
      paths: {
        mainConfig: host('etc/crio/crio.conf'),
        socket: host('var/run/crio/crio.sock'),
        storageRoot: host('var/lib/containers/storage'),
        registriesConf: host('etc/containers/registries.conf'),
        registriesConfDir: host('etc/containers/registries.conf.d'),
      },
      cni: { confDir: this.#cniConfDir, pluginDirs: [CNI_PLUGIN_DIR] },
      // Debian 12's crun (1.8.1) refuses CRI-O 1.32's OCI spec version.
      runtime: 'runc',
      // As on a node: every container of an image shares its layers (vfs
      // copies the whole image for each one). The bed unmounts what is
      // mounted under its host root.
      storageDriver: 'overlay',
    });
    // The system bus, at the node's socket path, with systemd's reload of crio.service.
    this.bus = new PrivateBus(join(opts.state, 'dbus'), host('run/dbus/system_bus_socket'));
  }

  get endpoint(): string {
    return this.crio.endpoint;
  }

  get dropInDir(): string {
    return this.crio.dropInDir;
  }

  async start(): Promise<void> {
    await this.crio.configure(this.#registries);
    await this.crio.start();
    await this.bus.start();
    this.systemd = await startSystemdStandIn({ address: this.bus.address, units: ['crio.service'], onReload: () => this.crio.sighup() });
  }

  async stop(): Promise<void> {
    await this.systemd?.close();
    await this.bus.stop();
    await this.crio.stop();
    await killLeftovers(['conmon'], this.#hostRoot);
  }

  logTail(lines = 10): string {
    return this.crio.log().split('\n').slice(-lines).join('\n');
  }

  logFiles(): string[] {
    return readdirSync(this.crio.dir).filter((f) => /^crio-\d+\.log$/.test(f)).map((f) => join(this.crio.dir, f));
  }

  async installNetwork(): Promise<void> {
    await writeNetwork(this.#cniConfDir, join(this.#state, 'cni-ipam'));
  }

  /** An administrator's own drop-in listing `ref` in pinned_images, then `systemctl reload crio` (SIGHUP). */
  async handPin(ref: string): Promise<string> {
    const file = join(this.crio.dropInDir, '50-admin-pins.conf');
    await writeFile(file, toToml({ crio: { image: { pinned_images: [ref] } } }) + '\n');
    this.crio.sighup();
    return `${file} (pinned_images), CRI-O reloaded`;
  }

  /** The drop-in folder listed every 50 ms: pinset's files (99-pinset-*.conf) seen, and the reloads asked of systemd. */
  async watchPinWrites(): Promise<PinWriteWatch> {
    const names = new Set<string>();
    let mostAtOnce = 0;
    const reloadsBefore = this.systemd?.reloads.length ?? 0;
    let running = true;
    const loop = (async () => {
      while (running) {
        const now = readdirSync(this.crio.dropInDir).filter((n) => n.startsWith('99-pinset-'));
        for (const n of now) names.add(n);
        mostAtOnce = Math.max(mostAtOnce, now.length);
        await sleep(50);
      }
    })();
    return {
      stop: async () => {
        running = false;
        await loop;
        return { dropIns: { names: [...names].sort(), mostAtOnce, reloads: (this.systemd?.reloads.length ?? 0) - reloadsBefore } };
      },
    };
  }
}

// ---------------------------------------------------------------------------
// containerd

export class ContainerdNodeRuntime implements NodeRuntime {
  readonly name = 'containerd' as const;
  readonly bin: string;
  readonly socket: string;
  readonly #hostRoot: string;
  readonly #dir: string;
  readonly #configFile: string;
  readonly #cniConfDir: string;
  readonly #registries: Record<string, string>;
  readonly #sandboxImage: string;
  #proc: ServerProcess | undefined;

  /** `registries`: made-up registry names -> loopback host:port; `sandboxImage`: a runnable image (containerd runs the pod sandbox's container). */
  constructor(opts: { bin: string; hostRoot: string; state: string; registries: Record<string, string>; sandboxImage: string }) {
    this.bin = opts.bin;
    this.#hostRoot = opts.hostRoot;
    this.#dir = join(opts.state, 'containerd');
    this.#configFile = join(this.#dir, 'config.toml');
    this.#cniConfDir = join(this.#dir, 'cni', 'net.d');
    this.socket = join(opts.hostRoot, 'run/containerd/containerd.sock');
    this.#registries = opts.registries;
    this.#sandboxImage = opts.sandboxImage;
  }

  get endpoint(): string {
    return `unix://${this.socket}`;
  }

  #ctrBinary(): string {
    const beside = join(dirname(this.bin), 'ctr');
    return existsSync(beside) ? beside : findBinary('ctr')!;
  }

  /** This containerd's ctr on its socket, in the CRI namespace. */
  async ctr(args: string[]): Promise<string> {
    return (await run(this.#ctrBinary(), ['--address', this.socket, '-n', 'k8s.io', ...args], { maxBuffer: 16 << 20 })).stdout;
  }

  async #configure(): Promise<void> {
    const host = (p: string) => join(this.#hostRoot, p);
    // containerd's registry hosts at the node's usual path, where the agent
    // finds them (the DaemonSet mounts the host's /etc): its size estimate
    // reads the same hosts.toml files containerd pulls through.
    const certsDir = host('etc/containerd/certs.d');
    for (const d of [this.#dir, certsDir, this.#cniConfDir, join(this.#dir, 'opt'), host('var/lib/containerd'), host('run/containerd')]) await mkdir(d, { recursive: true });
    for (const [name, location] of Object.entries(this.#registries)) {
      await mkdir(join(certsDir, name), { recursive: true });
      // No credential in it: a private registry's come from the pull's own (CRI AuthConfig).
      const url = `http://${location}`;
      await writeFile(join(certsDir, name, 'hosts.toml'), toToml({ server: url, host: { [url]: { capabilities: ['pull', 'resolve'] } } }));
    }
    const config = {
      version: 2,
      // The node's usual paths, under the host's /run and /var/lib that the
      // DaemonSet mounts.
      root: host('var/lib/containerd'),
      state: host('run/containerd'),
      grpc: { address: this.socket },
      ttrpc: { address: `${this.socket}.ttrpc` },
      disabled_plugins: ['io.containerd.snapshotter.v1.aufs', 'io.containerd.snapshotter.v1.btrfs', 'io.containerd.snapshotter.v1.devmapper', 'io.containerd.snapshotter.v1.zfs'],
      plugins: {
        // Without this containerd creates /opt/containerd.
        'io.containerd.internal.v1.opt': { path: join(this.#dir, 'opt') },
        'io.containerd.grpc.v1.cri': {
          sandbox_image: this.#sandboxImage,
          // containerd gives every pod sandbox oom_score_adj -998, and runc
          // cannot lower a score without CAP_SYS_RESOURCE (the sandbox then
          // dies at start: "can't get final child's PID from pipe"). Where
          // this machine's root lacks it, containerd's own option for such
          // hosts keeps every score at or above containerd's own. A node's
          // root has it.
          restrict_oom_score_adj: !canLowerOomScore(),
          containerd: {
            // overlayfs, as on a node: every container of an image shares
            // its layers (native copies the whole image for each one).
            snapshotter: 'overlayfs',
            default_runtime_name: 'runc',
            // runc's state in the bed too (its default is /run/containerd/runc).
            runtimes: { runc: { runtime_type: 'io.containerd.runc.v2', options: { BinaryName: findBinary('runc')!, SystemdCgroup: false, Root: join(this.#dir, 'runc') } } },
          },
          cni: { bin_dir: CNI_PLUGIN_DIR, conf_dir: this.#cniConfDir },
          registry: { config_path: certsDir },
        },
      },
    };
    await writeFile(this.#configFile, toToml(config));
  }

  async start(): Promise<void> {
    if (!this.#proc) await this.#configure();
    // containerd finds its shim on PATH: its own folder first; Debian installs runc in /usr/sbin.
    const env = { ...process.env, PATH: `${dirname(this.bin)}:${process.env.PATH ?? ''}:/usr/local/sbin:/usr/sbin:/sbin` };
    const proc = new ServerProcess('containerd', this.bin, ['--config', this.#configFile], join(this.#dir, 'containerd.log'), env);
    this.#proc = proc;
    const cri = new CriClient(this.endpoint);
    try {
      await waitUntilServing(proc, async () => existsSync(this.socket) && (await cri.version({ deadlineMs: 1000 }).then((v) => v.runtimeName === 'containerd', () => false)));
    } finally {
      cri.close();
    }
  }

  async stop(): Promise<void> {
    await this.#proc?.stop(10_000);
    // Shims outlive containerd by design (containers keep running through its restarts).
    await killLeftovers(['containerd-shim-runc-v2'], this.socket);
  }

  logTail(lines = 10): string {
    return this.#proc?.logTail(lines) ?? '';
  }

  logFiles(): string[] {
    return [join(this.#dir, 'containerd.log')];
  }

  async installNetwork(): Promise<void> {
    await writeNetwork(this.#cniConfDir, join(this.#dir, 'cni-ipam'));
  }

  /** `ctr images label <ref> io.cri-containerd.pinned=pinned` on the reference's own record, as docs/runtimes.md shows an administrator. */
  async handPin(ref: string): Promise<string> {
    await this.ctr(['images', 'label', ref, 'io.cri-containerd.pinned=pinned']);
    return `ctr -n k8s.io images label ${ref} io.cri-containerd.pinned=pinned`;
  }

  /** Every image record of the CRI namespace with its labels (`ctr images ls`: the name first, the labels last). */
  async imageLabels(): Promise<Map<string, Record<string, string>>> {
    const out = new Map<string, Record<string, string>>();
    for (const line of (await this.ctr(['images', 'ls'])).trim().split('\n').slice(1)) {
      const cols = line.trim().split(/\s+/);
      const labels = cols.at(-1) === '-' ? [] : (cols.at(-1) ?? '').split(',');
      out.set(cols[0]!, Object.fromEntries(labels.map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)])));
    }
    return out;
  }

  /** Every /images/update event containerd publishes (`ctr events`), with the record's labels after the update. */
  async watchPinWrites(): Promise<PinWriteWatch> {
    const updates: NonNullable<PinWriteRecord['labelUpdates']> = [];
    const child: ChildProcess = spawn(this.#ctrBinary(), ['--address', this.socket, 'events'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let buffered = '';
    child.stdout!.setEncoding('utf8').on('data', (chunk: string) => {
      buffered += chunk;
      const lines = buffered.split('\n');
      buffered = lines.pop() ?? '';
      for (const line of lines) {
        // <date> <time> <zone> UTC k8s.io /images/update {"name":"...","labels":{...}}
        const m = / k8s\.io \/images\/update (\{.*\})$/.exec(line);
        if (!m) continue;
        const e = JSON.parse(m[1]!) as { name: string; labels?: Record<string, string> };
        updates.push({ at: Date.now(), name: e.name, labels: e.labels ?? {} });
      }
    });
    // ctr subscribes before printing anything: give it a moment to be listening.
    await sleep(300);
    if (child.exitCode !== null) throw new Error(`ctr events exited (${child.exitCode})`);
    return {
      stop: async () => {
        await sleep(300);
        child.kill('SIGTERM');
        await new Promise((r) => (child.exitCode !== null ? r(null) : child.once('exit', r)));
        return { labelUpdates: updates };
      },
    };
  }
}
