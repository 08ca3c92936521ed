// A real Kubernetes node on this machine, for the optional node suite
// (`npm run test:node`): etcd (Debian's etcd-server), a kube-apiserver and a
// kubelet given as binaries (PINSET_KUBE_APISERVER_BIN, PINSET_KUBELET_BIN),
// CRI-O (PINSET_CRIO_BIN) behind a private D-Bus whose systemd stand-in
// reloads it as its unit does, and a loopback registry. Nothing here builds
// any of them; it only runs binaries it is given, each stopped by its own PID.
//
// The node's files sit under a "host root" in a temporary folder, at their
// usual paths: <root>/etc/crio/crio.conf(.d), <root>/var/run/crio/crio.sock,
// <root>/var/lib/containers/storage, <root>/run/dbus/system_bus_socket,
// <root>/var/lib/kubelet (the kubelet's --root-dir, with config.json),
// <root>/etc/containers/registries.conf, <root>/etc/pinset/sets.d. The
// DaemonSet's hostPath volumes are mapped there (podFromDaemonSet): the
// container sees exactly the mounts the shipped DaemonSet gives it.
//
// What a kubelet changes on the machine, and this file restores
// (facts/test-bed.md): the sysctls vm.overcommit_memory, kernel.panic and
// kernel.panic_on_oops; /var/lib/kubelet/device-plugins and
// /var/log/containers, removed when they did not exist before; a cgroup v1
// hugetlb hierarchy, mounted for the run when missing and unmounted after.
import { execFile } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { Agent, fetch } from 'undici';
import { findBinary, ServerProcess, waitUntilServing } from './components.ts';
import { CriClient } from './containerd.ts';
import { PrivateBus, startSystemdStandIn, type SystemdStandIn } from './dbus.ts';
import { layerOf, MEDIA_TYPES, pushManifest, pushSingleLayer, sha256, type Blob } from './images.ts';
import { makeKubePki, writeKubeconfig, type KubePki } from './kube-pki.ts';
import { RealCrio, realCrioMissing } from './real-crio.ts';
import { freePort, Registry } from './registry.ts';

const run = promisify(execFile);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export const REPO_ROOT = resolve(fileURLToPath(new URL('../..', import.meta.url)));
export const DEPLOY_DIR = join(REPO_ROOT, 'deploy');
/** The registry name images are pulled under; registries.conf maps it to the loopback registry. */
export const REGISTRY_NAME = 'registry.test';

export interface NodeBins {
  kubelet: string;
  apiserver: string;
  crio: string;
  etcd: string;
  kubectl: string;
  skopeo: string;
}

/** The OCI layout scripts/build-image.sh leaves (PINSET_IMAGE_CACHE, default .cache/image), as `oci:<dir>:<tag>`. */
export function imageLayout(env: NodeJS.ProcessEnv = process.env): { dir: string; tag: string } {
  const cache = env.PINSET_IMAGE_CACHE ? resolve(env.PINSET_IMAGE_CACHE) : join(REPO_ROOT, '.cache', 'image');
  return { dir: join(cache, 'oci'), tag: 'dev' };
}

/** Why this machine cannot run the node suite, or null; and the binaries when it can. */
export function realNodeMissing(env: NodeJS.ProcessEnv = process.env): { why: string } | { bins: NodeBins } {
  const given: Array<[string, string | undefined, string]> = [
    ['PINSET_KUBELET_BIN', env.PINSET_KUBELET_BIN, 'a kubelet v1.32 binary'],
    ['PINSET_KUBE_APISERVER_BIN', env.PINSET_KUBE_APISERVER_BIN, 'a kube-apiserver v1.32 binary'],
    ['PINSET_CRIO_BIN', env.PINSET_CRIO_BIN, 'a crio v1.32 binary, with pinns beside it or on PATH'],
  ];
  const unset = given.filter(([, v]) => !v);
  if (unset.length) return { why: `${unset.map(([k, , what]) => `${k} is not set (${what})`).join('; ')}` };
  for (const [k, v] of given) if (!existsSync(v!)) return { why: `${k}=${v} does not exist` };
  const crio = realCrioMissing(env.PINSET_CRIO_BIN);
  if (crio) return { why: crio };
  if (!findBinary('runc')) return { why: 'runc is missing (apt-get install runc): the kubelet suite runs containers with runc' };
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
    bins: { kubelet: env.PINSET_KUBELET_BIN!, apiserver: env.PINSET_KUBE_APISERVER_BIN!, crio: env.PINSET_CRIO_BIN!, etcd: findBinary('etcd')!, kubectl: findBinary('kubectl')!, skopeo: findBinary('skopeo')! },
  };
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
// Images: the pinset image from its OCI layout (skopeo, digests kept), and
// workload images made from its layers with a long-running command and one
// layer of their own, so each has its own image ID and runs as a pod.

interface OciLayout {
  dir: string;
  manifest: { digest: string; body: any };
  config: any;
}

async function readLayout(dir: string, tag: string): Promise<OciLayout> {
  const index = JSON.parse(await readFile(join(dir, 'index.json'), 'utf8'));
  const entry = (index.manifests as any[]).find((m) => m.annotations?.['org.opencontainers.image.ref.name'] === tag) ?? index.manifests[0];
  if (!entry) throw new Error(`${dir}/index.json lists no manifest`);
  const blob = (digest: string) => join(dir, 'blobs', ...digest.split(':'));
  const manifest = JSON.parse(await readFile(blob(entry.digest), 'utf8'));
  if (manifest.mediaType && manifest.mediaType !== MEDIA_TYPES.manifest) throw new Error(`${dir}: ${entry.digest} is ${manifest.mediaType}, not one image manifest`);
  const config = JSON.parse(await readFile(blob(manifest.config.digest), 'utf8'));
  return { dir, manifest: { digest: entry.digest, body: manifest }, config };
}

export interface NodeImage {
  /** registry.test/<repo>@sha256:..., what pods and sets name. */
  ref: string;
  repo: string;
  digest: string;
  /** The config digest without "sha256:" (CRI Image.id). */
  id: string;
}

/** The pinset image into the registry with skopeo (the layout's digest is kept). */
export async function pushPinsetImage(skopeo: string, registry: Registry, layout: { dir: string; tag: string }): Promise<NodeImage> {
  const oci = await readLayout(layout.dir, layout.tag);
  const repo = 'pinset/pinset';
  await run(skopeo, ['copy', '--quiet', '--dest-tls-verify=false', `oci:${layout.dir}:${layout.tag}`, `docker://${registry.host}/${repo}:${layout.tag}`], { maxBuffer: 1 << 20 });
  const head = await fetch(`${registry.url}/v2/${repo}/manifests/${oci.manifest.digest}`, { method: 'HEAD', headers: { accept: MEDIA_TYPES.manifest } });
  if (!head.ok) throw new Error(`skopeo copied ${layout.dir} but ${repo}@${oci.manifest.digest} is not in the registry (HTTP ${head.status})`);
  return { ref: `${REGISTRY_NAME}/${repo}@${oci.manifest.digest}`, repo, digest: oci.manifest.digest, id: oci.manifest.body.config.digest.replace(/^sha256:/, '') };
}

async function mountOrPush(registry: Registry, repo: string, from: string, blob: { digest: string; data: () => Promise<Buffer> }): Promise<void> {
  const head = await fetch(`${registry.url}/v2/${repo}/blobs/${blob.digest}`, { method: 'HEAD' });
  if (head.ok) return;
  const mount = await fetch(`${registry.url}/v2/${repo}/blobs/uploads/?mount=${blob.digest}&from=${from}`, { method: 'POST' });
  await mount.body?.cancel();
  if (mount.status === 201) return;
  const location = mount.headers.get('location');
  if (mount.status !== 202 || !location) throw new Error(`registry: blob upload to ${repo} answered ${mount.status}`);
  const url = new URL(location, registry.url);
  url.searchParams.set('digest', blob.digest);
  const data = await blob.data();
  const put = await fetch(url, { method: 'PUT', headers: { 'content-type': 'application/octet-stream', 'content-length': String(data.length) }, body: data });
  await put.body?.cancel();
  if (put.status !== 201) throw new Error(`registry: upload of ${blob.digest} to ${repo} answered ${put.status}`);
}

/**
 * A workload image named `name`: the pinset image's layers (mounted from its
 * repository, not uploaded again) plus one small layer of its own, running
 * `node -e 'setInterval(...)'` until stopped.
 */
export async function pushWorkloadImage(registry: Registry, layout: { dir: string; tag: string }, name: string): Promise<NodeImage> {
  const oci = await readLayout(layout.dir, layout.tag);
  const repo = `node-suite/${name}`;
  const own = layerOf([{ name: `pinset-node-suite/${name}`, data: Buffer.from(`${name}\n`) }]);
  const base = oci.config;
  const config: Blob = (() => {
    const value = {
      ...base,
      config: { ...base.config, Entrypoint: ['node', '-e', 'setInterval(() => {}, 1 << 30)'], Cmd: undefined, Labels: { ...(base.config?.Labels ?? {}), 'dev.pinset.test': name } },
      rootfs: { type: 'layers', diff_ids: [...base.rootfs.diff_ids, own.diffId] },
      history: [...(base.history ?? []), { created: new Date().toISOString(), created_by: `pinset node suite: workload ${name}` }],
    };
    const data = Buffer.from(JSON.stringify(value));
    return { digest: sha256(data), mediaType: MEDIA_TYPES.config, data };
  })();
  for (const layer of oci.manifest.body.layers as Array<{ digest: string }>) {
    await mountOrPush(registry, repo, 'pinset/pinset', { digest: layer.digest, data: () => readFile(join(layout.dir, 'blobs', ...layer.digest.split(':'))) });
  }
  for (const blob of [own, config]) await mountOrPush(registry, repo, 'pinset/pinset', { digest: blob.digest, data: async () => blob.data });
  const manifestData = Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: MEDIA_TYPES.manifest,
      config: { mediaType: MEDIA_TYPES.config, digest: config.digest, size: config.data.length },
      layers: [...oci.manifest.body.layers, { mediaType: own.mediaType, digest: own.digest, size: own.data.length }],
    }),
  );
  const manifest: Blob = { digest: sha256(manifestData), mediaType: MEDIA_TYPES.manifest, data: manifestData };
  await pushManifest(registry, repo, manifest);
  return { ref: `${REGISTRY_NAME}/${repo}@${manifest.digest}`, repo, digest: manifest.digest, id: config.digest.replace(/^sha256:/, '') };
}

// ---------------------------------------------------------------------------
// What the kubelet changes on the machine, saved and restored.

const SYSCTLS = ['vm/overcommit_memory', 'kernel/panic', 'kernel/panic_on_oops'];
const KUBELET_HOST_PATHS = ['/var/lib/kubelet', '/var/log/containers'];
// The kubelet's cAdvisor asks CRI-O for its storage root at this fixed path
// (cadvisor container/crio/client.go), whatever the kubelet's runtime
// endpoint; without an answer it cannot find the image filesystem, and every
// image GC pass ends in "failed to get imageFs info: non-existent label
// crio-images" (after the age path has run).
const CADVISOR_CRIO_SOCKET = '/var/run/crio/crio.sock';

interface HostState {
  sysctls: Map<string, string>;
  absentPaths: string[];
  hugetlbMounted: string | undefined;
}

/** Saves what the kubelet will change; links cAdvisor's CRI-O socket path to `crioSocket`. */
async function saveHostState(crioSocket: string): Promise<HostState> {
  const sysctls = new Map<string, string>();
  for (const s of SYSCTLS) sysctls.set(s, (await readFile(`/proc/sys/${s}`, 'utf8')).trim());
  const cadvisorDir = dirname(CADVISOR_CRIO_SOCKET);
  if (existsSync(cadvisorDir)) throw new Error(`${cadvisorDir} exists: a CRI-O may run on this machine; the kubelet's cAdvisor would read its storage at ${CADVISOR_CRIO_SOCKET} instead of the bed's`);
  const absentPaths = [...KUBELET_HOST_PATHS.filter((p) => !existsSync(p)), cadvisorDir];
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
  try {
    await mkdir(cadvisorDir, { recursive: true });
    await symlink(crioSocket, CADVISOR_CRIO_SOCKET);
  } catch (err) {
    await rm(cadvisorDir, { recursive: true, force: true });
    if (hugetlbMounted) await run('umount', [hugetlbMounted]).catch(() => undefined);
    throw err;
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

export interface RealNode {
  hostRoot: string;
  state: string;
  nodeName: string;
  pki: KubePki;
  api: KubeApi;
  kubeconfig: string;
  apiServerPort: number;
  registry: Registry;
  crio: RealCrio;
  cri: CriClient;
  bus: PrivateBus;
  systemd: SystemdStandIn;
  kubelet: ServerProcess;
  /** When the kubelet started (its image GC period counts from here). */
  kubeletStartedAt: number;
  etcd: ServerProcess;
  apiserver: ServerProcess;
  /** The kubelet's log lines matching `re`. */
  kubeletLog(re: RegExp): string[];
  /** kubectl with the admin's kubeconfig. */
  kubectl(args: string[]): Promise<string>;
  /** Maps a host path of a pod's hostPath volume to where it is on this bed. */
  hostPath(path: string): string;
  stop(): Promise<string[]>;
}

export async function startRealNode(bins: NodeBins): Promise<RealNode> {
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
    for (const d of ['etc/crio/crio.conf.d', 'var/run/crio', 'var/lib/containers/storage', 'run/dbus', 'var/lib/kubelet', 'var/log/pods', 'etc/pinset/sets.d', 'etc/containers/registries.conf.d', 'bed/pki', 'bed/etcd', 'bed/apiserver', 'bed/kubelet', 'bed/crio', 'bed/dbus']) {
      await mkdir(host(d), { recursive: true });
    }
    // Mount propagation as on a systemd host, where "/" is shared: the
    // DaemonSet's HostToContainer mount needs a shared or slave source.
    await run('mount', ['--bind', hostRoot, hostRoot]);
    await run('mount', ['--make-rshared', hostRoot]);
    // No registry credentials on this node; the kubelet and the agent read the same file.
    await writeFile(host('var/lib/kubelet/config.json'), '{"auths": {}}\n');

    const hostState = await saveHostState(host('var/run/crio/crio.sock'));
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

    // The loopback registry, mapped as registry.test in CRI-O's and the agent's registries.conf.
    const registry = await Registry.start();
    cleanups.push({ what: 'stop the registry', run: () => registry.stop() });
    // CRI-O resolves its pause image for every pod sandbox. With
    // drop_infra_ctr (its default) these pods get no infra container, so the
    // image is never run: one small layer under the configured name will do.
    await pushSingleLayer(registry, 'pause', { tag: '3.10' });

    // CRI-O at the node's usual paths.
    const crio = new RealCrio(join(state, 'crio'), {
      bin: bins.crio,
      registries: { [REGISTRY_NAME]: registry.host },
      dropInDir: host('etc/crio/crio.conf.d'),
      paths: {
        mainConfig: host('etc/crio/crio.conf'),
        socket: host('var/run/crio/crio.sock'),
        storageRoot: host('var/lib/containers/storage'),
        registriesConf: host('etc/containers/registries.conf'),
        registriesConfDir: host('etc/containers/registries.conf.d'),
      },
      // Debian 12's crun (1.8.1) refuses CRI-O 1.32's OCI spec version.
      runtime: 'runc',
    });
    await crio.configure({ [REGISTRY_NAME]: registry.host });
    await crio.start();
    cleanups.push({ what: 'stop CRI-O and what it started', run: () => stopCrio(crio, hostRoot) });
    const cri = new CriClient(crio.endpoint);
    cleanups.push({ what: 'close the CRI client', run: () => cri.close() });

    // The system bus, at the node's socket path, with systemd's reload of crio.service.
    const bus = new PrivateBus(join(state, 'dbus'), host('run/dbus/system_bus_socket'));
    await bus.start();
    cleanups.push({ what: 'stop dbus-daemon', run: () => bus.stop() });
    const systemd = await startSystemdStandIn({ address: bus.address, units: ['crio.service'], onReload: () => crio.sighup() });
    cleanups.push({ what: 'stop the systemd stand-in', run: () => systemd.close() });

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
      containerRuntimeEndpoint: crio.endpoint,
      cgroupDriver: 'cgroupfs',
      cgroupsPerQOS: false,
      enforceNodeAllocatable: [],
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
    };
    const kubeletConfigFile = join(state, 'kubelet', 'config.json');
    await writeFile(kubeletConfigFile, JSON.stringify(kubeletConfig, null, 2));
    const kubeletStartedAt = Date.now();
    const kubelet = new ServerProcess(
      'kubelet',
      bins.kubelet,
      [
        '--config', kubeletConfigFile,
        '--kubeconfig', kubeletKubeconfig,
        '--hostname-override', NODE_NAME,
        '--root-dir', host('var/lib/kubelet'),
        '--cert-dir', join(state, 'kubelet', 'pki'),
        '--v', '2',
        // Image GC's decisions (pinned, removed) and each pass's end.
        '--vmodule', 'image_gc_manager=5,kubelet=4',
      ],
      join(state, 'kubelet.log'),
    );
    cleanups.push({ what: 'stop the kubelet', run: () => kubelet.stop(15_000) });
    await waitUntilServing(kubelet, async () => (await api.find(`/api/v1/nodes/${NODE_NAME}`)) !== null, 60_000);

    // What kube-controller-manager would publish: the CA pods verify the API
    // server with, and the namespace's default service account.
    for (const ns of ['default']) await ensureNamespaceBasics(api, ns, pki);

    const node: RealNode = {
      hostRoot,
      state,
      nodeName: NODE_NAME,
      pki,
      api,
      kubeconfig,
      apiServerPort,
      registry,
      crio,
      cri,
      bus,
      systemd,
      kubelet,
      kubeletStartedAt,
      etcd,
      apiserver,
      kubeletLog: (re) => readFileSync(kubelet.logFile, 'utf8').split('\n').filter((l) => re.test(l)),
      kubectl: async (args) => (await run(bins.kubectl, ['--kubeconfig', kubeconfig, ...args], { maxBuffer: 16 << 20 })).stdout,
      hostPath: (p) => join(hostRoot, p),
      stop: async () => {
        await deleteAllPods(api).catch((err) => notes.push(`deleting pods: ${(err as Error).message}`));
        return stop();
      },
    };
    return node;
  } catch (err) {
    const left = await stop();
    if (left.length) (err as Error).message += `\n(cleanup: ${left.join('; ')})`;
    throw err;
  }
}

/**
 * The kube-root-ca.crt ConfigMap and the default ServiceAccount of `ns`
 * (kube-controller-manager's job on a cluster). Also openshift-service-ca.crt:
 * a kube-apiserver built from OpenShift's Kubernetes tree (as microshift
 * vendors it) adds that ConfigMap to every service-account token volume, and
 * the kubelet does not start a pod until it exists; other API servers ignore it.
 */
export async function ensureNamespaceBasics(api: KubeApi, ns: string, pki: KubePki): Promise<void> {
  const ca = await readFile(pki.ca.cert, 'utf8');
  await api.ensure(`/api/v1/namespaces/${ns}/configmaps`, { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'kube-root-ca.crt' }, data: { 'ca.crt': ca } });
  await api.ensure(`/api/v1/namespaces/${ns}/configmaps`, { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'openshift-service-ca.crt' }, data: { 'service-ca.crt': ca } });
  await api.ensure(`/api/v1/namespaces/${ns}/serviceaccounts`, { apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name: 'default' } });
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

/** SIGTERM to CRI-O, then any conmon it left running for this bed (found by the bed's paths on their command line), by PID. */
async function stopCrio(crio: RealCrio, hostRoot: string): Promise<void> {
  await crio.stop();
  for (const pid of await readdir('/proc').catch(() => [] as string[])) {
    if (!/^\d+$/.test(pid)) continue;
    let cmdline = '';
    try {
      cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
    } catch {
      continue;
    }
    if (cmdline.startsWith('/usr/bin/conmon\0') && cmdline.includes(hostRoot)) {
      try {
        process.kill(Number(pid), 'SIGKILL');
      } catch {
        // gone meanwhile
      }
    }
  }
}

// ---------------------------------------------------------------------------
// The DaemonSet's pod, made as the daemonset controller would.

export interface AgentPodOptions {
  nodeName: string;
  /** Host path of a hostPath volume -> path on this bed. */
  hostPath: (path: string) => string;
  apiServerPort: number;
  metricsPort: number;
}

/**
 * The pod the daemonset controller would create for `ds` on `nodeName`: its
 * template, owned by the DaemonSet, with spec.nodeName (the binding the
 * scheduler would make). Then what differs on this bed, and only that:
 *  - hostPath volumes point at the same paths under the bed's host root;
 *  - hostNetwork: the bed has no CNI plugin (the Node stays NotReady and
 *    only host-network pods start), hence the API server's address given
 *    in KUBERNETES_SERVICE_HOST/PORT (no kube-proxy for the Service's
 *    ClusterIP) and a free port for the metrics and probes in place of 9402
 *    (on the host's network it might be taken);
 *  - no priority class when this machine's root lacks CAP_SYS_RESOURCE: the
 *    kubelet gives a system-node-critical pod oom_score_adj -997, and runc
 *    cannot lower a score without that capability ("failed to update
 *    /proc/self/oom_score_adj: Permission denied"). A node's root has it.
 * The container itself (image, args, env, security context, mounts,
 * resources, probes' paths) is the template's.
 */
export function podFromDaemonSet(ds: any, opts: AgentPodOptions): any {
  const template = structuredClone(ds.spec.template);
  const spec = template.spec;
  spec.nodeName = opts.nodeName;
  spec.hostNetwork = true;
  if (!canLowerOomScore()) delete spec.priorityClassName;
  for (const v of spec.volumes ?? []) if (v.hostPath) v.hostPath.path = opts.hostPath(v.hostPath.path);
  const defaultPort = 9402;
  for (const c of spec.containers) {
    c.env = (c.env ?? []).map((e: any) => (e.name === 'PINSET_METRICS_ADDR' ? { ...e, value: String(e.value).replace(`:${defaultPort}`, `:${opts.metricsPort}`) } : e));
    c.env.push({ name: 'KUBERNETES_SERVICE_HOST', value: '127.0.0.1' }, { name: 'KUBERNETES_SERVICE_PORT', value: String(opts.apiServerPort) });
    for (const p of c.ports ?? []) if (p.containerPort === defaultPort) p.containerPort = opts.metricsPort;
    for (const probe of [c.livenessProbe, c.readinessProbe, c.startupProbe]) if (probe?.httpGet?.port === defaultPort) probe.httpGet.port = opts.metricsPort;
  }
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: {
      generateName: `${ds.metadata.name}-`,
      namespace: ds.metadata.namespace,
      labels: { ...(template.metadata?.labels ?? {}), 'pod-template-generation': String(ds.metadata.generation) },
      annotations: template.metadata?.annotations ?? {},
      ownerReferences: [{ apiVersion: 'apps/v1', kind: 'DaemonSet', name: ds.metadata.name, uid: ds.metadata.uid, controller: true, blockOwnerDeletion: true }],
    },
    spec,
  };
}

const CAP_SYS_RESOURCE = 24;

/** Whether this process may lower an oom_score_adj (CAP_SYS_RESOURCE in its effective set). */
export function canLowerOomScore(): boolean {
  const hex = /^CapEff:\s*([0-9a-f]+)$/m.exec(readFileSync('/proc/self/status', 'utf8'))?.[1];
  return hex !== undefined && ((BigInt(`0x${hex}`) >> BigInt(CAP_SYS_RESOURCE)) & 1n) === 1n;
}

/** A kustomization in `dir` over deploy/ with the agent's image replaced by `image` (a digest reference). */
export async function writeDeployOverlay(dir: string, image: NodeImage): Promise<string> {
  await mkdir(dir, { recursive: true });
  const [name, digest] = image.ref.split('@');
  const kustomization = {
    apiVersion: 'kustomize.config.k8s.io/v1beta1',
    kind: 'Kustomization',
    // kustomize takes bases by relative path only.
    resources: [relative(dir, DEPLOY_DIR)],
    images: [{ name: 'ghcr.io/pinset/pinset', newName: name, digest }],
  };
  await writeFile(join(dir, 'kustomization.yaml'), JSON.stringify(kustomization, null, 2));
  return dir;
}

/** The container logs of a pod's containers on this bed (kubelet's podLogsDir), last lines. */
export function podLogs(node: RealNode, namespace: string, name: string, lines = 30): string {
  const base = node.hostPath('var/log/pods');
  try {
    const dirs = readdirSync(base).filter((d) => d.startsWith(`${namespace}_${name}_`));
    const out: string[] = [];
    for (const d of dirs) {
      for (const c of readdirSync(join(base, d))) {
        for (const f of readdirSync(join(base, d, c))) {
          out.push(`--- ${c}/${f}`, ...readFileSync(join(base, d, c, f), 'utf8').trimEnd().split('\n').slice(-lines));
        }
      }
    }
    return out.join('\n');
  } catch (err) {
    return `(no logs: ${(err as Error).message})`;
  }
}
