// A real Kubernetes node on this machine, for the optional node suite
// (`npm run test:node`): etcd (Debian's etcd-server), a kube-apiserver and a
// kubelet given as binaries (PINSET_KUBE_APISERVER_BIN, PINSET_KUBELET_BIN),
// a container runtime (./real-node-runtime.ts: CRI-O from PINSET_CRIO_BIN,
// or containerd), Kubernetes' own controllers when given
// (./real-node-controllers.ts: kube-controller-manager and kube-scheduler),
// a loopback registry, and the two private registries and the kubelet's
// credential provider plugin of ./real-node-credentials.ts. Nothing here
// builds any of them; it only runs binaries it is given, each stopped by its
// own PID.
//
// The node's files sit under a "host root" in a temporary folder, at their
// usual paths: <root>/etc/crio/crio.conf(.d), <root>/var/run/crio/crio.sock,
// <root>/var/lib/containers/storage, <root>/run/dbus/system_bus_socket (on
// CRI-O), <root>/run/containerd/containerd.sock, <root>/var/lib/containerd,
// <root>/etc/containerd/certs.d, <root>/var/lib/pinset (on containerd),
// <root>/var/lib/kubelet (the kubelet's --root-dir, with config.json),
// <root>/etc/containers, <root>/etc/pinset/sets.d, and the credential
// provider folder <root>/etc/eks/image-credential-provider. The DaemonSet's
// hostPath volumes point there
// (./real-node-deploy.ts): the container sees exactly the mounts the shipped
// DaemonSet gives it.
//
// What a kubelet changes on the machine, and this file restores
// (facts/test-bed.md): the sysctls vm.overcommit_memory, kernel.panic and
// kernel.panic_on_oops; /var/lib/kubelet/device-plugins and
// /var/log/containers, removed when they did not exist before; a cgroup v1
// hugetlb hierarchy, mounted for the run when missing and unmounted after.
// containerd's shims put their sockets in /run/containerd/s whatever
// containerd's own paths (a fixed path: socket paths are short); that folder
// is removed after when it did not exist before.
import { execFile } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, rmdir, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { Agent, fetch } from 'undici';
import { findBinary, ServerProcess, waitUntilServing } from './components.ts';
import { CriClient } from './containerd.ts';
import { pushSingleLayer } from './images.ts';
import { makeKubePki, writeKubeconfig, type KubePki } from './kube-pki.ts';
import { controllerBins, startControllers, type ControllerBins, type RunningControllers } from './real-node-controllers.ts';
import { PLUGIN_REGISTRY, SECRET_REGISTRY, startNodeCredentials, type NodeCredentials } from './real-node-credentials.ts';
import { imageLayout, pushWorkloadImage, REGISTRY_NAME } from './real-node-images.ts';
import { containerdBinaryFor, ContainerdNodeRuntime, CrioNodeRuntime, runtimeMissing, type NodeRuntime, type RuntimeName } from './real-node-runtime.ts';
import { freePort, Registry } from './registry.ts';

const run = promisify(execFile);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export interface NodeBins {
  kubelet: string;
  apiserver: string;
  etcd: string;
  kubectl: string;
  skopeo: string;
  /** Kubernetes' controllers, or why the suite imitates them. */
  controllers: ControllerBins | { why: string };
}

/** Why this machine cannot run the node suite on any runtime, or the binaries when it can. */
export function realNodeMissing(env: NodeJS.ProcessEnv = process.env): { why: string } | { bins: NodeBins } {
  const given: Array<[string, string | undefined, string]> = [
    ['PINSET_KUBELET_BIN', env.PINSET_KUBELET_BIN, 'a kubelet binary, v1.32 or v1.35'],
    ['PINSET_KUBE_APISERVER_BIN', env.PINSET_KUBE_APISERVER_BIN, 'a kube-apiserver binary of the same version'],
  ];
  const unset = given.filter(([, v]) => !v);
  if (unset.length) return { why: `${unset.map(([k, , what]) => `${k} is not set (${what})`).join('; ')}` };
  for (const [k, v] of given) if (!existsSync(v!)) return { why: `${k}=${v} does not exist` };
  if (process.getuid?.() !== 0) return { why: 'the kubelet and the runtimes need root' };
  if (!findBinary('runc')) return { why: 'runc is missing (apt-get install runc): the node suite runs containers with runc' };
  const tools: Array<[string, string]> = [
    ['etcd', 'etcd-server'],
    ['openssl', 'openssl'],
    ['docker-registry', 'docker-registry'],
    ['skopeo', 'skopeo'],
    ['dbus-daemon', 'dbus'],
  ];
  const missing = tools.filter(([b]) => !findBinary(b));
  if (missing.length) return { why: `missing ${missing.map(([b, p]) => `${b} (apt package ${p})`).join(', ')}` };
  if (!findBinary('kubectl')) return { why: 'kubectl is missing (v1.32 or later: the suite applies deploy/ with `kubectl apply --server-side -k`)' };
  const layout = imageLayout(env);
  if (!existsSync(join(layout.dir, 'index.json'))) return { why: `the pinset image's OCI layout ${layout.dir} does not exist: build it with scripts/build-image.sh (or point PINSET_IMAGE_CACHE at its cache folder)` };
  return {
    bins: { kubelet: env.PINSET_KUBELET_BIN!, apiserver: env.PINSET_KUBE_APISERVER_BIN!, etcd: findBinary('etcd')!, kubectl: findBinary('kubectl')!, skopeo: findBinary('skopeo')!, controllers: controllerBins(env) },
  };
}

/** A runtime the suite runs on: its label, the runtime, and the environment its run gets (which containerd). */
export interface NodeRuntimeChoice {
  label: string;
  runtime: RuntimeName;
  env: Record<string, string>;
}

/** The containerd releases the project unpacks into .cache/ (.ci/containerd-1.7, .ci/containerd-2.1), by label. */
const CONTAINERD_RELEASES: Record<string, string> = {
  'containerd-1.7': '.cache/containerd-1.7/usr/bin/containerd',
  'containerd-2.1': '.cache/containerd-2.1/usr/bin/containerd',
};
const PROJECT_ROOT = fileURLToPath(new URL('../..', import.meta.url));

/**
 * The runtimes to run the suite on: PINSET_NODE_RUNTIMES (comma-separated:
 * `crio`; `containerd`, the one PINSET_CONTAINERD_BIN names; `containerd-1.7`
 * and `containerd-2.1`, the ones .ci/ unpacks into .cache/) or, unset, every
 * one this machine has (PINSET_CONTAINERD_BIN's containerd in place of the
 * unpacked ones when it is set). A runtime named there that cannot run is an
 * error; one merely present or not is reported as skipped.
 */
export function nodeRuntimes(env: NodeJS.ProcessEnv = process.env): { run: NodeRuntimeChoice[]; skipped: Array<{ runtime: string; why: string }>; errors: string[] } {
  const asked = env.PINSET_NODE_RUNTIMES?.split(',').map((s) => s.trim()).filter(Boolean);
  const errors: string[] = [];
  const skipped: Array<{ runtime: string; why: string }> = [];
  const runs: NodeRuntimeChoice[] = [];
  const labels = asked ?? ['crio', ...(env.PINSET_CONTAINERD_BIN ? ['containerd'] : Object.keys(CONTAINERD_RELEASES))];
  for (const label of labels) {
    let choice: NodeRuntimeChoice;
    if (label === 'crio') choice = { label, runtime: 'crio', env: {} };
    else if (label === 'containerd') choice = { label, runtime: 'containerd', env: {} };
    else if (label in CONTAINERD_RELEASES) choice = { label, runtime: 'containerd', env: { PINSET_CONTAINERD_BIN: join(PROJECT_ROOT, CONTAINERD_RELEASES[label]!) } };
    else {
      errors.push(`PINSET_NODE_RUNTIMES names "${label}": the runtimes are crio, containerd (PINSET_CONTAINERD_BIN), ${Object.keys(CONTAINERD_RELEASES).join(', ')}`);
      continue;
    }
    const why = runtimeMissing(choice.runtime, { ...env, ...choice.env });
    if (!why) runs.push(choice);
    else if (asked) errors.push(`${label}: ${why}`);
    else skipped.push({ runtime: label, why });
  }
  return { run: runs, skipped, errors };
}

// ---------------------------------------------------------------------------
// A minimal API client (the admin's certificate): JSON in, JSON out.


export class KubeApiError extends Error {
  readonly status: number;
  readonly body: unknown;
  constructor(status: number, body: unknown, what: string) {
    super(`${what}: HTTP ${status} ${JSON.stringify(body).slice(0, 500)}`);
    this.status = status;
    this.body = body;
  }
}

export class KubeApi {
  readonly server: string;
  readonly #dispatcher: Agent;

  constructor(server: string, pki: KubePki) {
    this.server = server;
    this.#dispatcher = new Agent({ connect: { ca: readFileSync(pki.ca.cert), cert: readFileSync(pki.admin.cert), key: readFileSync(pki.admin.key) } });
  }

  async request(method: string, path: string, body?: unknown, contentType = 'application/json'): Promise<{ status: number; body: any }> {
    const res = await fetch(`${this.server}${path}`, {
      method,
      dispatcher: this.#dispatcher,
      headers: body === undefined ? { accept: 'application/json' } : { accept: 'application/json', 'content-type': contentType },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(30_000),
    });
    const text = await res.text();
    let parsed: unknown = text;
    try {
      parsed = JSON.parse(text);
    } catch {
      // not JSON (readyz answers text)
    }
    return { status: res.status, body: parsed };
  }

  async get(path: string): Promise<any> {
    const r = await this.request('GET', path);
    if (r.status !== 200) throw new KubeApiError(r.status, r.body, `GET ${path}`);
    return r.body;
  }

  /** null on 404. */
  async find(path: string): Promise<any> {
    const r = await this.request('GET', path);
    if (r.status === 404) return null;
    if (r.status !== 200) throw new KubeApiError(r.status, r.body, `GET ${path}`);
    return r.body;
  }

  async create(path: string, obj: unknown): Promise<any> {
    const r = await this.request('POST', path, obj);
    if (r.status !== 201 && r.status !== 200) throw new KubeApiError(r.status, r.body, `POST ${path}`);
    return r.body;
  }

  /** Creates, or leaves alone what already exists (409). */
  async ensure(path: string, obj: unknown): Promise<void> {
    const r = await this.request('POST', path, obj);
    if (r.status !== 201 && r.status !== 200 && r.status !== 409) throw new KubeApiError(r.status, r.body, `POST ${path}`);
  }

  async delete(path: string, body?: unknown): Promise<void> {
    const r = await this.request('DELETE', path, body);
    if (r.status !== 200 && r.status !== 202 && r.status !== 404) throw new KubeApiError(r.status, r.body, `DELETE ${path}`);
  }

  close(): Promise<void> {
    return this.#dispatcher.close();
  }
}

// ---------------------------------------------------------------------------
// What the kubelet and the runtime change on the machine, saved and restored.

const SYSCTLS = ['vm/overcommit_memory', 'kernel/panic', 'kernel/panic_on_oops'];
const KUBELET_HOST_PATHS = ['/var/lib/kubelet', '/var/log/containers'];
// The kubelet's cAdvisor asks CRI-O for its storage root at this fixed path
// (cadvisor container/crio/client.go), whatever the kubelet's runtime
// endpoint; without an answer it cannot find the image filesystem, and every
// image GC pass ends in "failed to get imageFs info: non-existent label
// crio-images" (after the age path has run).
const CADVISOR_CRIO_SOCKET = '/var/run/crio/crio.sock';
// containerd's shims listen under this fixed folder (containerd's default
// state folder), whatever containerd's own state folder is.
const CONTAINERD_SHIM_SOCKETS = '/run/containerd/s';

interface HostState {
  sysctls: Map<string, string>;
  absentPaths: string[];
  hugetlbMounted: string | undefined;
}

/**
 * Why cAdvisor's CRI-O socket path is taken when a node suite run left it:
 * a run stopped before its cleanup leaves the link into its own bed under
 * the temporary folder. Said, not removed: another run may be going.
 */
function leftBy(socket: string): string | undefined {
  let target: string;
  try {
    target = readlinkSync(socket);
  } catch {
    return undefined;
  }
  const prefix = join(tmpdir(), 'pinset-node-');
  if (!target.startsWith(prefix)) return undefined;
  const bed = prefix + target.slice(prefix.length).split('/')[0];
  return `its ${socket} links to ${target}, the bed of a node suite run stopped before its cleanup${existsSync(bed) ? '' : ' (that bed is gone)'}: when no node suite is running, unmount what is mounted under ${bed}, then remove ${bed}, ${dirname(socket)}, ${KUBELET_HOST_PATHS.join(' and ')}`;
}

/** Saves what the kubelet will change; on CRI-O links cAdvisor's CRI-O socket path to `crioSocket`. */
async function saveHostState(runtime: RuntimeName, crioSocket: string): Promise<HostState> {
  const sysctls = new Map<string, string>();
  for (const s of SYSCTLS) sysctls.set(s, (await readFile(`/proc/sys/${s}`, 'utf8')).trim());
  const cadvisorDir = dirname(CADVISOR_CRIO_SOCKET);
  if (runtime === 'crio' && existsSync(cadvisorDir)) throw new Error(`${cadvisorDir} exists: ${leftBy(CADVISOR_CRIO_SOCKET) ?? 'a CRI-O may run on this machine'}; the kubelet's cAdvisor would read its storage at ${CADVISOR_CRIO_SOCKET} instead of the bed's`);
  const absentPaths = [...KUBELET_HOST_PATHS, CONTAINERD_SHIM_SOCKETS].filter((p) => !existsSync(p));
  if (runtime === 'crio') absentPaths.push(cadvisorDir);
  let hugetlbMounted: string | undefined;
  // cgroup v1 machines without a hugetlb hierarchy: the kubelet's container
  // manager refuses to start without one (facts/test-bed.md).
  const v1 = !existsSync('/sys/fs/cgroup/cgroup.controllers');
  const hugetlb = '/sys/fs/cgroup/hugetlb';
  const mounted = readFileSync('/proc/self/mountinfo', 'utf8').split('\n').some((l) => l.split(' ')[4] === hugetlb);
  if (v1 && !mounted && /^hugetlb\s/m.test(readFileSync('/proc/cgroups', 'utf8'))) {
    await mkdir(hugetlb, { recursive: true });
    await run('mount', ['-t', 'cgroup', '-o', 'hugetlb', 'cgroup', hugetlb]);
    hugetlbMounted = hugetlb;
  }
  if (runtime === 'crio') {
    try {
      await mkdir(cadvisorDir, { recursive: true });
      await symlink(crioSocket, CADVISOR_CRIO_SOCKET);
    } catch (err) {
      await rm(cadvisorDir, { recursive: true, force: true });
      if (hugetlbMounted) await run('umount', [hugetlbMounted]).catch(() => undefined);
      throw err;
    }
  }
  return { sysctls, absentPaths, hugetlbMounted };
}
async function restoreHostState(state: HostState): Promise<string[]> {
  const notes: string[] = [];
  for (const [s, v] of state.sysctls) {
    const now = (await readFile(`/proc/sys/${s}`, 'utf8')).trim();
    if (now !== v) {
      await writeFile(`/proc/sys/${s}`, v);
      notes.push(`${s.replace('/', '.')} ${now} -> ${v}`);
    }
  }
  for (const p of state.absentPaths) {
    if (p === CONTAINERD_SHIM_SOCKETS) {
      // Shared with any other containerd on the machine: removed only when empty.
      if (existsSync(p) && readdirSync(p).length === 0) {
        await rmdir(p);
        notes.push(`removed ${p}`);
      }
      continue;
    }
    if (existsSync(p)) {
      await unmountUnder(p);
      await rm(p, { recursive: true, force: true });
      notes.push(`removed ${p}`);
    }
  }
  if (state.hugetlbMounted) {
    await run('umount', [state.hugetlbMounted]).catch(() => run('umount', ['-l', state.hugetlbMounted!]));
    await rm(state.hugetlbMounted, { recursive: false, force: true }).catch(() => undefined);
    notes.push(`unmounted ${state.hugetlbMounted}`);
  }
  return notes;
}

/** Unmounts everything mounted at or below `dir`, deepest first (the kubelet's rshared root, tmpfs token volumes, CRI-O's shm). */
async function unmountUnder(dir: string): Promise<void> {
  for (let round = 0; round < 5; round++) {
    const targets = readFileSync('/proc/self/mountinfo', 'utf8')
      .split('\n')
      .map((l) => l.split(' ')[4])
      .filter((t): t is string => Boolean(t) && (t === dir || t!.startsWith(dir + '/')))
      .map((t) => t.replace(/\\040/g, ' '))
      .sort((a, b) => b.length - a.length);
    if (targets.length === 0) return;
    for (const t of targets) await run('umount', [t]).catch(() => run('umount', ['-l', t]).catch(() => undefined));
  }
}

// ---------------------------------------------------------------------------
// The node

export const NODE_NAME = 'pinset-node';
/** The kubelet's config file and drop-in folder on the bed's host root, at kubeadm's paths. */
export const KUBELET_CONFIG_FILE = 'var/lib/kubelet/config.yaml';
export const KUBELET_CONFIG_DIR = 'etc/kubernetes/kubelet.conf.d';
/** kubeadm's flags file, and the .deb's file of KUBELET_EXTRA_ARGS (10-kubeadm.conf). */
export const KUBEADM_FLAGS_FILE = 'var/lib/kubelet/kubeadm-flags.env';
export const KUBELET_EXTRA_ARGS_FILE = 'etc/default/kubelet';

/**
 * The kubelet's flags from kubeadm's files, as the packages' 10-kubeadm.conf
 * gives them: $KUBELET_KUBEADM_ARGS of /var/lib/kubelet/kubeadm-flags.env,
 * then $KUBELET_EXTRA_ARGS of /etc/default/kubelet. Each file is read by the
 * shell and each variable split at whitespace, as systemd splits a lone
 * $VAR (not pinset's reading of them: the agent's is the one under test);
 * a flag's value that is a host path ("--flag=/path", "--flag=unix:///path")
 * is put under the bed's host root.
 */
export async function kubeadmFileArgs(hostRoot: string): Promise<string[]> {
  const script = 'set -a; . "$1"; . "$2"; for a in $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS; do printf "%s\\0" "$a"; done';
  const { stdout } = await run('bash', ['-c', script, 'kubeadm-flags', join(hostRoot, KUBEADM_FLAGS_FILE), join(hostRoot, KUBELET_EXTRA_ARGS_FILE)]);
  return stdout
    .split('\0')
    .filter(Boolean)
    .map((a) => a.replace(/^(--[\w-]+=)(unix:\/\/)?\//, (_m, flag: string, scheme = '') => `${flag}${scheme}${hostRoot}/`));
}

/** What `<bin> --version` prints last: `Kubernetes v1.35.6` gives v1.35.6. */
export async function binaryVersion(bin: string): Promise<string> {
  const { stdout } = await run(bin, ['--version']);
  const v = /v\d+\.\d+\.\d+\S*/.exec(stdout);
  if (!v) throw new Error(`${bin} --version printed no version: ${stdout.trim()}`);
  return v[0];
}

/** The minor version of a `v1.35.6` string. */
export function minorOf(version: string): number {
  return Number(/^v1\.(\d+)\./.exec(version)?.[1] ?? NaN);
}

export interface RealNode {
  hostRoot: string;
  state: string;
  nodeName: string;
  pki: KubePki;
  api: KubeApi;
  kubeconfig: string;
  apiServerPort: number;
  registry: Registry;
  /** The private registries, the credential provider plugin the kubelet and the agent share, the pull secret. */
  credentials: NodeCredentials;
  runtime: NodeRuntime;
  /** A CRI client on the runtime's socket, the suite's own view of the runtime. */
  cri: CriClient;
  /** kube-controller-manager and kube-scheduler, or null when the suite imitates them. */
  controllers: RunningControllers | null;
  /** The kubelet's own version (`kubelet --version`), e.g. v1.35.6. */
  kubeletVersion: string;
  /** The kubelet's config file and its drop-in folder (--config-dir), read at every start. */
  kubeletConfigFile: string;
  kubeletConfigDir: string;
  kubelet: ServerProcess;
  /** When the kubelet last started (its image GC period counts from here). */
  kubeletStartedAt: number;
  etcd: ServerProcess;
  apiserver: ServerProcess;
  /** The kubelet's log lines matching `re` (every start of it: one file). */
  kubeletLog(re: RegExp): string[];
  /** SIGTERM to the kubelet (pods keep running), and a start again with the same configuration. */
  stopKubelet(): Promise<void>;
  startKubelet(): Promise<void>;
  /** kubectl with the admin's kubeconfig. */
  kubectl(args: string[]): Promise<string>;
  /** Where a host path (a pod's hostPath volume) is on this bed. */
  hostPath(path: string): string;
  stop(): Promise<string[]>;
}

export async function startRealNode(bins: NodeBins, runtimeName: RuntimeName): Promise<RealNode> {
  const hostRoot = await mkdtemp(join(tmpdir(), 'pinset-node-'));
  const state = join(hostRoot, 'bed');
  const cleanups: Array<{ what: string; run: () => Promise<unknown> | unknown }> = [];
  const notes: string[] = [];
  const stop = async (): Promise<string[]> => {
    while (cleanups.length) {
      const c = cleanups.pop()!;
      try {
        await c.run();
      } catch (err) {
        notes.push(`cleanup "${c.what}" failed: ${(err as Error).message}`);
      }
    }
    return notes;
  };
  try {
    cleanups.push({ what: 'remove the host root', run: () => rm(hostRoot, { recursive: true, force: true }) });
    cleanups.push({ what: 'unmount the host root', run: () => unmountUnder(hostRoot) });
    const host = (p: string) => join(hostRoot, p);
    const folders = ['var/lib/kubelet', 'etc/kubernetes/kubelet.conf.d', 'var/log/pods', 'etc/pinset/sets.d', 'etc/containers/registries.conf.d', 'bed/pki', 'bed/etcd', 'bed/apiserver', 'bed/kubelet'];
    if (runtimeName === 'crio') folders.push('etc/crio/crio.conf.d', 'run/crio', 'var/lib/containers/storage', 'run/dbus', 'bed/crio', 'bed/dbus');
    else folders.push('run/containerd', 'var/lib/containerd', 'var/lib/pinset', 'bed/containerd');
    for (const d of folders) await mkdir(host(d), { recursive: true });
    // /var/run is a link to /run, as on every systemd host: the DaemonSet
    // mounts the host's /run and finds CRI-O's /var/run/crio/crio.sock there.
    await symlink('../run', host('var/run'));
    // Mount propagation as on a systemd host, where "/" is shared: the
    // DaemonSet's HostToContainer mounts need a shared or slave source.
    await run('mount', ['--bind', hostRoot, hostRoot]);
    await run('mount', ['--make-rshared', hostRoot]);
    // No registry credentials in the node's auth file; the kubelet and the
    // agent read the same file. Private registries' credentials come from the
    // credential provider plugin and a pull secret only.
    await writeFile(host('var/lib/kubelet/config.json'), '{"auths": {}}\n');

    const hostState = await saveHostState(runtimeName, host('var/run/crio/crio.sock'));
    cleanups.push({ what: 'restore the host', run: async () => notes.push(...(await restoreHostState(hostState))) });

    const pki = await makeKubePki(join(state, 'pki'), NODE_NAME);

    // etcd
    const [etcdClient, etcdPeer] = [await freePort(), await freePort()];
    const etcdUrl = `http://127.0.0.1:${etcdClient}`;
    const etcd = new ServerProcess(
      'etcd',
      bins.etcd,
      ['--name', 'node-suite', '--data-dir', join(state, 'etcd', 'data'), '--listen-client-urls', etcdUrl, '--advertise-client-urls', etcdUrl, '--listen-peer-urls', `http://127.0.0.1:${etcdPeer}`, '--initial-advertise-peer-urls', `http://127.0.0.1:${etcdPeer}`, '--initial-cluster', `node-suite=http://127.0.0.1:${etcdPeer}`, '--logger', 'zap'],
      join(state, 'etcd.log'),
    );
    cleanups.push({ what: 'stop etcd', run: () => etcd.stop() });
    await waitUntilServing(etcd, async () => (await fetch(`${etcdUrl}/health`, { signal: AbortSignal.timeout(1000) })).status === 200, 30_000);

    // kube-apiserver
    const apiServerPort = await freePort();
    const server = `https://127.0.0.1:${apiServerPort}`;
    const apiserver = new ServerProcess(
      'kube-apiserver',
      bins.apiserver,
      [
        '--etcd-servers', etcdUrl,
        '--bind-address', '127.0.0.1',
        '--secure-port', String(apiServerPort),
        '--advertise-address', '127.0.0.1',
        // A loopback address may not be an Endpoints address: no reconciler.
        '--endpoint-reconciler-type', 'none',
        '--tls-cert-file', pki.apiserver.cert,
        '--tls-private-key-file', pki.apiserver.key,
        '--client-ca-file', pki.ca.cert,
        '--service-account-issuer', 'https://kubernetes.default.svc',
        '--service-account-key-file', pki.serviceAccount.pub,
        '--service-account-signing-key-file', pki.serviceAccount.key,
        '--service-cluster-ip-range', '10.0.0.0/24',
        '--authorization-mode', 'Node,RBAC',
        '--enable-admission-plugins', 'NodeRestriction',
        '--cert-dir', join(state, 'apiserver'),
        '--profiling=false',
        '--v', '1',
      ],
      join(state, 'kube-apiserver.log'),
    );
    cleanups.push({ what: 'stop kube-apiserver', run: () => apiserver.stop() });
    const api = new KubeApi(server, pki);
    cleanups.push({ what: 'close the API client', run: () => api.close() });
    await waitUntilServing(apiserver, async () => (await api.request('GET', '/readyz')).status === 200, 90_000);
    const kubeconfig = await writeKubeconfig(join(state, 'admin.kubeconfig'), server, pki.ca.cert, pki.admin, 'admin');
    const kubeletKubeconfig = await writeKubeconfig(join(state, 'kubelet.kubeconfig'), server, pki.ca.cert, pki.kubelet, `system:node:${NODE_NAME}`);

    // The loopback registry, mapped as registry.test in the runtime's
    // configuration (which the agent reads too, for its size estimate), and
    // the private ones, mapped without any credential.
    const registry = await Registry.start();
    cleanups.push({ what: 'stop the registry', run: () => registry.stop() });
    const credentials = await startNodeCredentials(hostRoot, state, runtimeName);
    cleanups.push({ what: 'stop the private registries', run: () => credentials.stop() });
    const registries = { [REGISTRY_NAME]: registry.host, [PLUGIN_REGISTRY]: credentials.pluginRegistry.host, [SECRET_REGISTRY]: credentials.secretRegistry.host };

    let runtime: NodeRuntime;
    if (runtimeName === 'crio') {
      // CRI-O resolves its pause image for every pod sandbox. With
      // drop_infra_ctr (its default) these pods get no infra container, so the
      // image is never run: one small layer under the configured name will do.
      await pushSingleLayer(registry, 'pause', { tag: '3.10' });
      runtime = new CrioNodeRuntime({ bin: process.env.PINSET_CRIO_BIN!, hostRoot, state, registries });
    } else {
      // containerd runs every pod sandbox's container: its image must run.
      const pause = await pushWorkloadImage(registry, imageLayout(), 'pause');
      runtime = new ContainerdNodeRuntime({ bin: containerdBinaryFor()!, hostRoot, state, registries, sandboxImage: pause.ref });
    }
    cleanups.push({ what: `stop ${runtime.name} and what it started`, run: () => runtime.stop() });
    await runtime.start();
    const cri = new CriClient(runtime.endpoint);
    cleanups.push({ what: 'close the CRI client', run: () => cri.close() });

    // Kubernetes' controllers, when given.
    let controllers: RunningControllers | null = null;
    if (!('why' in bins.controllers)) {
      controllers = await startControllers(bins.controllers, { state, server, pki });
      const c = controllers;
      cleanups.push({ what: 'stop kube-scheduler and kube-controller-manager', run: () => c.stop() });
    }

    // The kubelet (the configuration facts/test-bed.md found to work here).
    const kubeletConfig = {
      kind: 'KubeletConfiguration',
      apiVersion: 'kubelet.config.k8s.io/v1beta1',
      address: '127.0.0.1',
      port: await freePort(),
      readOnlyPort: 0,
      healthzPort: 0,
      authentication: { anonymous: { enabled: true }, webhook: { enabled: false }, x509: { clientCAFile: pki.ca.cert } },
      authorization: { mode: 'AlwaysAllow' },
      containerRuntimeEndpoint: runtime.endpoint,
      cgroupDriver: 'cgroupfs',
      cgroupsPerQOS: false,
      // 'none': an empty list reads as unset in 1.35, whose default (pods) needs cgroupsPerQOS.
      enforceNodeAllocatable: ['none'],
      failSwapOn: false,
      makeIPTablesUtilChains: false,
      podLogsDir: host('var/log/pods'),
      volumePluginDir: join(state, 'kubelet', 'volume-plugins'),
      // The age path of image GC: unused for a minute means collectable at
      // the next pass; the disk path never triggers (100 %).
      imageMinimumGCAge: '1s',
      imageGCHighThresholdPercent: 100,
      imageGCLowThresholdPercent: 99,
      imageMaximumGCAge: '1m',
      registerNode: true,
      // 1.35 refuses a cgroup v1 host unless told otherwise; 1.32 accepts it either way.
      failCgroupV1: false,
    };
    // Where kubeadm keeps them: the config file under the kubelet's root, and
    // a drop-in folder (--config-dir) the suite writes to. The agent's pod
    // reads both, read-only, as it would on a node.
    const kubeletConfigFile = host(KUBELET_CONFIG_FILE);
    const kubeletConfigDir = host(KUBELET_CONFIG_DIR);
    await writeFile(kubeletConfigFile, JSON.stringify(kubeletConfig, null, 2));
    // kubeadm's files around them, as on a kubeadm node whose kubelet has a
    // drop-in folder: kubeadm's flags file, and the package's
    // /etc/default/kubelet given --config-dir through KUBELET_EXTRA_ARGS, as
    // docs/kubelet-credential-verification.md's kubeadm procedure adds it.
    // The kubelet is started from them as 10-kubeadm.conf starts it
    // (kubeadmFileArgs), and the agent finds its files from the same.
    await mkdir(host('etc/default'), { recursive: true });
    await mkdir(kubeletConfigDir, { recursive: true });
    await writeFile(host(KUBEADM_FLAGS_FILE), `KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=${runtime.endpoint.replace(`unix://${hostRoot}`, 'unix://')}"\n`);
    await writeFile(host(KUBELET_EXTRA_ARGS_FILE), `KUBELET_EXTRA_ARGS="--config-dir=/${KUBELET_CONFIG_DIR}"\n`);
    const kubeletArgs = [
      '--config', kubeletConfigFile,
      ...(await kubeadmFileArgs(hostRoot)),
      '--kubeconfig', kubeletKubeconfig,
      '--hostname-override', NODE_NAME,
      '--root-dir', host('var/lib/kubelet'),
      '--cert-dir', join(state, 'kubelet', 'pki'),
      '--v', '2',
      // Image GC's decisions (pinned, removed) and each pass's end.
      '--vmodule', 'image_gc_manager=5,kubelet=4',
      // The credential provider plugin the agent's pod mounts, the same files.
      ...credentials.kubeletArgs,
    ];
    const kubeletLogFile = join(state, 'kubelet.log');
    const node: RealNode = {
      hostRoot,
      state,
      nodeName: NODE_NAME,
      pki,
      api,
      kubeconfig,
      apiServerPort,
      registry,
      credentials,
      runtime,
      cri,
      controllers,
      kubeletVersion: await binaryVersion(bins.kubelet),
      kubeletConfigFile,
      kubeletConfigDir,
      kubelet: undefined as unknown as ServerProcess,
      kubeletStartedAt: 0,
      etcd,
      apiserver,
      kubeletLog: (re) => readFileSync(kubeletLogFile, 'utf8').split('\n').filter((l) => re.test(l)),
      stopKubelet: () => node.kubelet.stop(15_000),
      startKubelet: async () => {
        node.kubeletStartedAt = Date.now();
        node.kubelet = new ServerProcess('kubelet', bins.kubelet, kubeletArgs, kubeletLogFile, { ...process.env, ...credentials.kubeletEnv });
        await waitUntilServing(node.kubelet, async () => (await api.find(`/api/v1/nodes/${NODE_NAME}`)) !== null, 60_000);
      },
      kubectl: async (args) => (await run(bins.kubectl, ['--kubeconfig', kubeconfig, ...args], { maxBuffer: 16 << 20 })).stdout,
      hostPath: (p) => join(hostRoot, p),
      stop: async () => {
        // Nothing may create pods again once they are deleted.
        await controllers?.stop().catch((err) => notes.push(`stopping the controllers: ${(err as Error).message}`));
        await deleteAllPods(api).catch((err) => notes.push(`deleting pods: ${(err as Error).message}`));
        return stop();
      },
    };
    cleanups.push({ what: 'stop the kubelet', run: () => node.kubelet?.stop(15_000) });
    await node.startKubelet();

    // What kube-controller-manager publishes in every namespace, made by the
    // bed when it does not run (or, for openshift-service-ca.crt, when it
    // cannot).
    if (!controllers) await ensureNamespaceBasics(api, 'default', pki);
    else if (!controllers.publishesServiceCa) await ensureServiceCaConfigMap(api, 'default', pki);
    return node;
  } catch (err) {
    const left = await stop();
    if (left.length) (err as Error).message += `\n(cleanup: ${left.join('; ')})`;
    throw err;
  }
}

/**
 * The kube-root-ca.crt ConfigMap and the default ServiceAccount of `ns`
 * (kube-controller-manager's job on a cluster), and openshift-service-ca.crt.
 */
export async function ensureNamespaceBasics(api: KubeApi, ns: string, pki: KubePki): Promise<void> {
  const ca = await readFile(pki.ca.cert, 'utf8');
  await api.ensure(`/api/v1/namespaces/${ns}/configmaps`, { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'kube-root-ca.crt' }, data: { 'ca.crt': ca } });
  await ensureServiceCaConfigMap(api, ns, pki);
  await api.ensure(`/api/v1/namespaces/${ns}/serviceaccounts`, { apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name: 'default' } });
}

/**
 * openshift-service-ca.crt: a kube-apiserver built from OpenShift's
 * Kubernetes tree (as microshift vendors it) adds that ConfigMap to every
 * service-account token volume, and the kubelet does not start a pod until
 * it exists; that tree's kube-controller-manager publishes it, other API
 * servers ignore it.
 */
export async function ensureServiceCaConfigMap(api: KubeApi, ns: string, pki: KubePki): Promise<void> {
  const ca = await readFile(pki.ca.cert, 'utf8');
  await api.ensure(`/api/v1/namespaces/${ns}/configmaps`, { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'openshift-service-ca.crt' }, data: { 'service-ca.crt': ca } });
}

/** Deletes every pod and waits until the kubelet has stopped their containers and the API has let them go. */
async function deleteAllPods(api: KubeApi): Promise<void> {
  const pods = (await api.get('/api/v1/pods')).items as any[];
  for (const p of pods) await api.delete(`/api/v1/namespaces/${p.metadata.namespace}/pods/${p.metadata.name}`, { gracePeriodSeconds: 5 });
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    if (((await api.get('/api/v1/pods')).items as any[]).length === 0) return;
    await sleep(500);
  }
  throw new Error('pods still there 60 s after their deletion');
}
