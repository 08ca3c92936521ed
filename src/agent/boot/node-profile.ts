// The node's profile: what this node's runtime is and where its parts live,
// found on the node (DESIGN, "The node, found rather than configured"),
// written down once, and what every other part of the agent is built from.
//
// Detection, with no --cri-endpoint: the standard CRI sockets are asked
// CRI Version, under --host-root (the DaemonSet mounts the host's /run
// there; on the host it is /):
//   CRI-O        /var/run/crio/crio.sock (/var/run is /run on every
//                systemd host, FHS 3.0, so it is probed at /run/crio)
//   containerd   /run/containerd/containerd.sock
//   k3s, RKE2    /run/k3s/containerd/containerd.sock
// Exactly one must answer. None, or two (a node moving from one runtime to
// the other), is a problem said plainly: nothing is pinned that the agent
// cannot confirm, and it looks again at a paced interval.
// From the answer: the image filesystem (CRI ImageFsInfo) and containerd's
// registry hosts folder (the `config_path` of the config the layout keeps,
// else the layout's default); and what that calls for in pins, decided
// where every pin decision is (./pin-kit.ts pinPlan). A flag given
// explicitly wins over what was found. The node lock is not the profile's:
// it is in the same place whatever was found (./node-lock-place.ts).
import { existsSync } from 'node:fs';
import * as path from 'node:path';
import { parse as parseToml } from 'smol-toml';
import type { NodeRuntime } from '../../api/types.ts';
import { CriImageRuntime, unixSocketPath } from '../../cri/client.ts';
import { RuntimeError, type ImageFilesystem, type ImageRuntime, type RuntimeImage, type RuntimeInfo } from '../../cri/runtime.ts';
import type { PinBackendFlag } from '../../pins/choice.ts';
import { errMessage } from '../../util/problem-log.ts';
import { readRegularFile } from '../../util/regular-file.ts';
import type { ProfileConfig } from './config.ts';
import { fromHostRoot, hostPath } from './host-paths.ts';
import { pinPlan } from './pin-kit.ts';

/** The node layouts the agent knows: where each keeps its socket, configuration and registry hosts. */
export type Layout = 'crio' | 'containerd' | 'k3s' | 'rke2';

interface LayoutPaths {
  socket: string;
  /** containerd's configuration file, whose config_path names the registry hosts folder. */
  config?: string;
  /** The registry hosts folder when the configuration names none. */
  hostsDir?: string;
}

/** Host paths of each layout (k3s and RKE2 share the socket; their files under /var/lib/rancher tell them apart). */
export const LAYOUTS: Readonly<Record<Layout, LayoutPaths>> = {
  crio: { socket: '/var/run/crio/crio.sock' },
  containerd: { socket: '/run/containerd/containerd.sock', config: '/etc/containerd/config.toml', hostsDir: '/etc/containerd/certs.d' },
  k3s: {
    socket: '/run/k3s/containerd/containerd.sock',
    config: '/var/lib/rancher/k3s/agent/etc/containerd/config.toml',
    hostsDir: '/var/lib/rancher/k3s/agent/etc/containerd/certs.d',
  },
  rke2: {
    socket: '/run/k3s/containerd/containerd.sock',
    config: '/var/lib/rancher/rke2/agent/etc/containerd/config.toml',
    hostsDir: '/var/lib/rancher/rke2/agent/etc/containerd/certs.d',
  },
};

/** How long one socket may take to answer Version during detection: a runtime that answers nothing in this long is not taken as this node's. */
export const DETECT_VERSION_DEADLINE_MS = 3_000;

/** What was found on the node (or taken from explicit flags). */
export interface FoundRuntime {
  /** 'detected': found on the node; 'flags': --cri-endpoint given, the rest from flags as before. */
  source: 'detected' | 'flags';
  layout?: Layout;
  /** The runtime's answer to CRI Version (absent when none answered). */
  runtime?: RuntimeInfo;
  /** Where this process sees the host's /run, /etc and /var/lib (--host-root). */
  hostRoot: string;
  criEndpoint: string;
  /** CRI-O's drop-in folder as this process sees it (used or not: see usesDropIn). */
  dropInDir: string;
  /** containerd's registry hosts folder(s) as the agent reads them, for the size estimate. */
  containerdHostsDir?: string;
  /** The image filesystems CRI ImageFsInfo names, as host paths. */
  imageFs: string[];
  /** Why no runtime could be settled on (none answered, or two did); the agent then pins nothing and looks again. */
  problem?: string;
  /** How long the detection took. */
  detectionMs: number;
}

/** The node's profile: what was found, and what it calls for in pins (./pin-kit.ts pinPlan). */
export interface NodeProfile extends FoundRuntime {
  /** --pin-backend as what was found narrows it: the backend the runtime calls for, or `auto` while that depends on its answer. */
  pinBackend: PinBackendFlag;
  /** CRI-O's drop-in folder is used: its pin file is opened and CRI-O's backend can be made. */
  usesDropIn: boolean;
}

export interface ProfileProbes {
  /** A CRI client for an endpoint (tests give their own). */
  runtimeFor?: (endpoint: string) => ImageRuntime;
  now?: () => number;
}

interface Answer {
  layout: Layout;
  endpoint: string;
  info: RuntimeInfo;
}

/** Ask every standard socket that exists under the host root for its Version. */
async function probeSockets(hostRoot: string, runtimeFor: (endpoint: string) => ImageRuntime): Promise<{ answers: Answer[]; silent: string[] }> {
  const sockets = [...new Set(Object.values(LAYOUTS).map((l) => l.socket))];
  const silent: string[] = [];
  const results = await Promise.all(
    sockets.map(async (socket) => {
      const seen = hostPath(hostRoot, socket);
      if (!existsSync(seen)) return null;
      const endpoint = `unix://${seen}`;
      const rt = runtimeFor(endpoint);
      try {
        return { endpoint, socket, info: await rt.version() };
      } catch (e) {
        silent.push(`${socket} (${errMessage(e)})`);
        return null;
      } finally {
        rt.close();
      }
    }),
  );
  const answers: Answer[] = [];
  for (const r of results) if (r) answers.push({ layout: await layoutOf(hostRoot, r.socket, r.info), endpoint: r.endpoint, info: r.info });
  return { answers, silent };
}

/** Which layout a socket that answered belongs to. */
async function layoutOf(hostRoot: string, socket: string, info: RuntimeInfo): Promise<Layout> {
  if (socket === LAYOUTS.crio.socket || info.runtimeName.toLowerCase() === 'cri-o') return 'crio';
  if (socket === LAYOUTS.containerd.socket) return 'containerd';
  // k3s and RKE2 share the socket: the one whose agent folder is there (RKE2 embeds k3s, and keeps its own).
  return existsSync(hostPath(hostRoot, path.dirname(LAYOUTS.rke2.config!))) ? 'rke2' : 'k3s';
}

/**
 * The largest containerd configuration read: containerd's own default
 * configuration (`containerd config default`) is under 20 KiB; a larger file
 * is not one to take the registry hosts folder from.
 */
export const CONTAINERD_CONFIG_MAX_BYTES = 1024 * 1024;

/**
 * containerd's config_path from its configuration file: version 2's CRI
 * plugin, or version 3's images plugin (containerd 2.x). Undefined when the
 * file is missing, unreadable, not a regular file within the limit (a FIFO
 * at its name is refused at once: detection never waits on it) or names
 * none.
 */
export async function containerdConfigPath(file: string): Promise<string | undefined> {
  let text: string;
  try {
    text = await readRegularFile(file, { maxBytes: CONTAINERD_CONFIG_MAX_BYTES });
  } catch {
    return undefined;
  }
  try {
    const doc = parseToml(text) as { plugins?: Record<string, { registry?: { config_path?: unknown } }> };
    const plugins = doc.plugins ?? {};
    for (const id of ['io.containerd.cri.v1.images', 'io.containerd.grpc.v1.cri']) {
      const p = plugins[id]?.registry?.config_path;
      if (typeof p === 'string' && p) return p;
    }
  } catch {
    // A file containerd itself reads with its own parser; ours failing is no reason to guess.
  }
  return undefined;
}

/** The registry hosts folder(s) of a containerd layout, as this process reads them. */
async function hostsDirOf(hostRoot: string, layout: Layout): Promise<string | undefined> {
  const l = LAYOUTS[layout];
  if (!l.config) return undefined;
  const configured = await containerdConfigPath(hostPath(hostRoot, l.config));
  const dirs = configured ?? l.hostsDir!;
  return dirs
    .split(':')
    .filter(Boolean)
    .map((d) => hostPath(hostRoot, d))
    .join(':');
}

async function imageFsOf(rt: ImageRuntime): Promise<string[]> {
  try {
    return [...new Set((await rt.imageFsInfo()).map((f) => f.mountpoint).filter(Boolean))];
  } catch {
    return [];
  }
}

/** The profile from explicit flags (--cri-endpoint given): the runtime is not looked for, only asked what it is. */
async function profileFromFlags(f: ProfileConfig, runtimeFor: (endpoint: string) => ImageRuntime): Promise<Omit<FoundRuntime, 'detectionMs'>> {
  const endpoint = f.criEndpoint!;
  const rt = runtimeFor(endpoint);
  let info: RuntimeInfo | undefined;
  let imageFs: string[] = [];
  try {
    info = await rt.version();
    imageFs = await imageFsOf(rt);
  } catch {
    // Not up yet: the agent reaches it at its own pace.
  } finally {
    rt.close();
  }
  return {
    source: 'flags',
    ...(info ? { runtime: info } : {}),
    hostRoot: f.hostRoot,
    criEndpoint: endpoint,
    dropInDir: f.dropInDir,
    ...(f.containerdHostsDir ? { containerdHostsDir: f.containerdHostsDir } : {}),
    imageFs,
  };
}

/** None answered, or several did: said plainly, and nothing settled on. */
function unsettled(f: ProfileConfig, answers: readonly Answer[], silent: readonly string[]): Omit<FoundRuntime, 'detectionMs'> {
  const probed = [...new Set(Object.values(LAYOUTS).map((l) => l.socket))].join(', ');
  const problem =
    answers.length === 0
      ? `no container runtime answers on this node's CRI sockets (${probed}${f.hostRoot !== '/' ? ` under ${f.hostRoot}` : ''})${silent.length ? `; not answering: ${silent.join('; ')}` : ''}`
      : `${answers.length} container runtimes answer on this node: ${answers.map((a) => `${a.info.runtimeName} ${a.info.runtimeVersion} at ${fromHostRoot(f.hostRoot, unixSocketPath(a.endpoint) ?? a.endpoint)}`).join(', ')}; pinset pins on one: give --cri-endpoint (PINSET_CRI_ENDPOINT) to say which`;
  return {
    source: 'detected',
    hostRoot: f.hostRoot,
    criEndpoint: answers[0]?.endpoint ?? `unix://${hostPath(f.hostRoot, LAYOUTS.crio.socket)}`,
    dropInDir: f.dropInDir,
    imageFs: [],
    problem,
  };
}

/** The one runtime that answered: its layout, image filesystem and registry hosts folder. */
async function detected(f: ProfileConfig, a: Answer, runtimeFor: (endpoint: string) => ImageRuntime): Promise<Omit<FoundRuntime, 'detectionMs'>> {
  const rt = runtimeFor(a.endpoint);
  const imageFs = await imageFsOf(rt).finally(() => rt.close());
  const containerdHostsDir = f.containerdHostsDir ?? (a.layout === 'crio' ? undefined : await hostsDirOf(f.hostRoot, a.layout));
  return {
    source: 'detected',
    layout: a.layout,
    runtime: a.info,
    hostRoot: f.hostRoot,
    criEndpoint: a.endpoint,
    dropInDir: f.dropInDir,
    ...(containerdHostsDir ? { containerdHostsDir } : {}),
    imageFs,
  };
}

/** Look at the node (or take the flags) and write down its profile. Never throws for what the node lacks: a problem is in `problem`. */
export async function nodeProfile(f: ProfileConfig, probes: ProfileProbes = {}): Promise<NodeProfile> {
  const now = probes.now ?? Date.now;
  const started = now();
  const runtimeFor = probes.runtimeFor ?? ((e: string) => new CriImageRuntime(e, { version: DETECT_VERSION_DEADLINE_MS }));
  let found: Omit<FoundRuntime, 'detectionMs'>;
  if (f.criEndpoint) found = await profileFromFlags(f, runtimeFor);
  else {
    const { answers, silent } = await probeSockets(f.hostRoot, runtimeFor);
    found = answers.length === 1 ? await detected(f, answers[0]!, runtimeFor) : unsettled(f, answers, silent);
  }
  const profile = { ...found, detectionMs: now() - started };
  return { ...profile, ...pinPlan(profile, f.pinBackend) };
}

/** Two profiles name the same runtime in the same place (a re-detection that found what the agent runs on). */
export function sameRuntime(a: NodeProfile, b: NodeProfile): boolean {
  return a.criEndpoint === b.criEndpoint && a.layout === b.layout && a.pinBackend === b.pinBackend && Boolean(a.problem) === Boolean(b.problem);
}

/**
 * The profile as the node status and the start log line carry it: host
 * paths, not the agent's own view of them. The agent's status puts the
 * backend in use and the runtime's last answer in their places (both may
 * change after the start: src/agent/set-report.ts currentRuntime).
 */
export function describeProfile(p: NodeProfile, lockPath: string): NodeRuntime {
  const host = (q: string) => fromHostRoot(p.hostRoot, q);
  const runtime = p.runtime;
  return {
    ...(runtime ? { name: runtime.runtimeName, version: runtime.runtimeVersion } : {}),
    ...(p.layout ? { layout: p.layout } : {}),
    source: p.source,
    pinBackend: p.pinBackend,
    socket: host(unixSocketPath(p.criEndpoint) ?? p.criEndpoint),
    ...(p.imageFs.length ? { imageFs: p.imageFs } : {}),
    ...(p.usesDropIn ? { dropInDir: host(p.dropInDir) } : {}),
    ...(p.containerdHostsDir ? { hostsDir: p.containerdHostsDir.split(':').map(host).join(':') } : {}),
    lock: host(lockPath),
    ...(p.problem ? { problem: p.problem } : {}),
  };
}

/**
 * The runtime of a node where none could be settled on: every call fails
 * with the reason, so the reconcile reports the runtime unreachable with
 * it, keeps every pin and pulls nothing onto a runtime it did not choose,
 * at the runtime's retry pace.
 */
export class UnsettledRuntime implements ImageRuntime {
  readonly problem: string;
  constructor(problem: string) {
    this.problem = problem;
  }
  private fail(): Promise<never> {
    return Promise.reject(new RuntimeError('Unavailable', this.problem));
  }
  version(): Promise<RuntimeInfo> {
    return this.fail();
  }
  listImages(): Promise<RuntimeImage[]> {
    return this.fail();
  }
  imageStatus(): Promise<RuntimeImage | null> {
    return this.fail();
  }
  pullImage(): Promise<string> {
    return this.fail();
  }
  imageFsInfo(): Promise<ImageFilesystem[]> {
    return this.fail();
  }
  close(): void {}
}
