// A fleet on one machine, for the fleet test (test/e2e/fleet.test.ts) and
// its benchmark (bench/fleet.ts): N containerd nodes (1.7.24 and 2.1.9 in
// turn, each with its own root, state, socket and registry hosts folder),
// each with its own `pinset agent` process (the bundle) against the
// in-process API server, where each is a Node; an upstream registry
// (distribution) reachable only across a thin link (./thin-link.ts: shaped,
// every byte counted); and a real pull-through cache in front of it
// (distribution in proxy mode, run from deploy/cache/'s own configuration).
//
// The nodes' containerd finds the registry `registry.test` through the
// hosts.toml `pinset mirror-config` prints (src/cli/mirror-config.ts): the
// cache first, the registry across the link as `server`; or, for a fleet
// without a cache, the registry across the link alone.
import { mkdir, mkdtemp, rm, stat, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { stringify as stringifyToml } from 'smol-toml';
import { parseRoute, renderHostsToml } from '../../src/cli/mirror-config.ts';
import { parseNodeStatus } from '../../src/api/node-status.ts';
import { STATUS_ANNOTATION, type NodeSetStatus, type RolloutSpec } from '../../src/api/types.ts';
import { hostDirectory } from '../../src/registry/hosts-toml.ts';
import { AgentProcess, type LogLine } from './agent-process.ts';
import { ApiServer, type KubeObject } from './apiserver.ts';
import { Containerd, CriClient, type ContainerdVersion } from './containerd.ts';
import { pushRandom, type PushedImage } from './images.ts';
import { Registry } from './registry.ts';
import { ThinLink, type LinkTransfer } from './thin-link.ts';

/** The registry's name in the sets; each node's hosts.toml says where it is. */
export const FLEET_REGISTRY = 'registry.test';
/** The label every fleet Node carries, which the sets select. */
export const FLEET_LABEL = { 'pinset.dev/fleet': 'bed' } as const;
/** distribution's configuration as deploy/cache/ ships it (its ConfigMap holds this file as it is). */
export const CACHE_CONFIG = path.resolve(import.meta.dirname, '../../deploy/cache/config.yml');

export interface FleetBedOptions {
  /** How many nodes. */
  nodes: number;
  /** The agent program (bundledCli()). */
  cli: string;
  /** The link's rate, bits per second. */
  linkBitsPerSecond: number;
  /** Whether the nodes pull through the cache (else straight across the link). */
  cache: boolean;
  /** containerd versions, given to the nodes in turn; default 1.7 and 2.1. */
  versions?: readonly ContainerdVersion[];
  /** Extra flags for every agent (e.g. --rollout-lease-duration). */
  agentFlags?: readonly string[];
}

export interface FleetNode {
  name: string;
  version: ContainerdVersion;
  containerd: Containerd;
  cri: CriClient;
  agent: AgentProcess;
  dir: string;
}

/** When one node started and finished one image, from its agent's log (ms since the epoch). */
export interface ImagePull {
  node: string;
  image: string;
  startedAt: number;
  finishedAt?: number;
}

/** A blob an image's manifest names. */
export interface FleetBlob {
  digest: string;
  size: number;
}

/** An image's manifest, read back from the upstream registry: its config and layers. */
export interface FleetManifest {
  image: PushedImage;
  config: FleetBlob;
  layers: FleetBlob[];
}

/**
 * How often one blob (a config or a layer) of an image crossed the link, and
 * what explains each crossing, from what the link, the agents and the
 * cache's storage show:
 * - the pull of the first node to hold the image, through the cold cache:
 *   one copy through it, which is two GETs with distribution 2.8
 *   (registry/proxy/proxyblobstore.go, release/2.8: ServeBlob marks the
 *   digest in flight and starts storeLocal, a background copy to store;
 *   then it serves the client with copyContent, a second copy);
 * - other nodes' requests that came while the blob was still in flight,
 *   that is before that storing copy was committed: each is served with one
 *   more copy from upstream (copyContent again), not from storage. The
 *   first node got the serving copy, which can end well before the storing
 *   copy is committed (the commit syncs the file to disk: storage/driver/
 *   filesystem, fileWriter.Commit; on a busy machine here, blobs were
 *   stored up to 1.4 s after their last byte crossed), so a node that
 *   starts once the first one holds the image can still come in that
 *   window. A request that missed storage looks for the in-flight mark
 *   only after pinging the registry's /v2/ across the link, one request
 *   at a time (proxyregistry.go, tryEstablishChallenges: a registry that
 *   asks for no credentials is pinged on every miss); if storeLocal ended
 *   meanwhile (it removes the mark when it ends, stored or not), that
 *   request starts a copy through the cache of its own: two GETs. And a
 *   request that reads the blob's link while the commit writes it gets a
 *   500 ("invalid checksum digest format"), so containerd fetches the blob
 *   from the registry itself, hosts.toml's `server`: one GET with
 *   containerd's user agent. So each such node costs at most one copy
 *   through the cache (seen here: six GETs for five nodes, the blob's link
 *   dated 300 ms after the last of them; and a 500 from the cache
 *   followed by containerd's own GET). distribution 3 stores the copy it serves and commits it
 *   before it ends the response, which closes the window about when the
 *   first node has the blob.
 * A node's requests for an image come after its agent logged `pulling
 * image`: a node that started after the cache stored the blob cannot have
 * made it cross again.
 */
export interface BlobCrossings {
  image: string;
  blob: FleetBlob;
  /** The node whose pull of the image ended first (the first wave, or the first node to take a turn), and when it held the image (ms since the epoch). */
  wave: { node: string; heldAt: number };
  /** When the cache had the blob in its storage (ms since the epoch); undefined if it never stored it. */
  storedAt: number | undefined;
  /** The GETs of the blob across the link that carried it (200s), by start. */
  gets: LinkTransfer[];
  /** Of those, the GETs that began before the first node held the image: its copy through the cache. */
  waveGets: LinkTransfer[];
  /** Of those, the GETs that began once it held it: other nodes' requests while the blob was in flight. */
  laterGets: LinkTransfer[];
  /** The other nodes whose pull of the image started before the cache stored the blob: each may have cost one more copy through the cache. */
  startedInFlight: string[];
}

/**
 * When a distribution cache had a blob of a repository in its storage,
 * ready to serve (ms since the epoch): the modification time of the
 * repository's link to it, which distribution writes last when it commits
 * a blob (registry/storage/blobwriter.go Commit: moveBlob, then linkBlob;
 * the path: registry/storage/paths.go, layerLinkPathSpec), and which its
 * proxy's ServeBlob reads (through Stat) before it goes upstream. Undefined
 * while the cache does not hold it. The file system's clock ticks coarsely
 * (a few ms); a pull's requests come tens of ms after it starts.
 */
export async function cacheStoredAt(cache: Registry, repo: string, digest: string): Promise<number | undefined> {
  const [algorithm, hex] = digest.split(':');
  const link = path.join(cache.dir, 'storage', 'docker', 'registry', 'v2', 'repositories', ...repo.split('/'), '_layers', algorithm!, hex!, 'link');
  try {
    return (await stat(link)).mtimeMs;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
}

export class FleetBed {
  readonly api: ApiServer;
  readonly upstream: Registry;
  readonly link: ThinLink;
  readonly cache: Registry | undefined;
  readonly nodes: FleetNode[] = [];
  readonly dir: string;
  readonly #cli: string;
  readonly #agentFlags: readonly string[];
  readonly #kubeconfig: string;

  private constructor(parts: { api: ApiServer; upstream: Registry; link: ThinLink; cache: Registry | undefined; dir: string; kubeconfig: string; cli: string; agentFlags: readonly string[] }) {
    this.api = parts.api;
    this.upstream = parts.upstream;
    this.link = parts.link;
    this.cache = parts.cache;
    this.dir = parts.dir;
    this.#kubeconfig = parts.kubeconfig;
    this.#cli = parts.cli;
    this.#agentFlags = parts.agentFlags;
  }

  /** Starts everything; on a failure stops what it started and throws. */
  static async start(opts: FleetBedOptions): Promise<FleetBed> {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-fleet-'));
    const started: { stop(): Promise<void> }[] = [];
    try {
      const api = await ApiServer.start({ bookmarkIntervalMs: 1000 });
      started.push(api);
      const upstream = await Registry.start();
      started.push(upstream);
      const link = await ThinLink.start({ target: upstream.url, bitsPerSecond: opts.linkBitsPerSecond });
      started.push(link);
      const cache = opts.cache ? await Registry.start({ configFile: CACHE_CONFIG, proxy: { remoteurl: link.url } }) : undefined;
      if (cache) started.push(cache);
      const kubeconfig = await api.writeKubeconfig(dir);
      const bed = new FleetBed({ api, upstream, link, cache, dir, kubeconfig, cli: opts.cli, agentFlags: opts.agentFlags ?? [] });
      started.length = 0;
      try {
        const versions = opts.versions ?? ['1.7', '2.1'];
        for (let i = 0; i < opts.nodes; i++) await bed.addNode(`node-${i + 1}`, versions[i % versions.length]!);
      } catch (err) {
        await bed.stop();
        throw err;
      }
      return bed;
    } catch (err) {
      for (const s of started.reverse()) await s.stop().catch(() => undefined);
      await rm(dir, { recursive: true, force: true });
      throw err;
    }
  }

  /** The kubeconfig file of the bed's API server (for a controller or `pinset status` beside the agents). */
  get kubeconfig(): string {
    return this.#kubeconfig;
  }

  /** The hosts.toml every node has for FLEET_REGISTRY, as `pinset mirror-config` prints it (or the link alone, without a cache). */
  hostsToml(): string {
    if (this.cache) return renderHostsToml(parseRoute(`${FLEET_REGISTRY}=${this.cache.url}`), { url: new URL(this.link.url) });
    // The registry across the link, with no mirror: the fleet as it pulls without a cache.
    return stringifyToml({ server: this.link.url, host: { [this.link.url]: { capabilities: ['pull', 'resolve'] } } });
  }

  /** A node: its containerd, its Node object, its agent. */
  async addNode(name: string, version: ContainerdVersion): Promise<FleetNode> {
    const containerd = await Containerd.start({ version });
    const nodeDir = path.join(this.dir, name);
    const hostDir = path.join(containerd.certsDir, hostDirectory(FLEET_REGISTRY));
    await mkdir(hostDir, { recursive: true });
    await writeFile(path.join(hostDir, 'hosts.toml'), this.hostsToml());
    await mkdir(path.join(nodeDir, 'sets.d'), { recursive: true });
    this.api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name, labels: { ...FLEET_LABEL, 'kubernetes.io/hostname': name } } });
    const agent = AgentProcess.start(
      [
        '--node-name', name,
        '--kubeconfig', this.#kubeconfig,
        '--cri-endpoint', containerd.endpoint,
        '--containerd-hosts-dir', containerd.certsDir,
        '--static-dir', path.join(nodeDir, 'sets.d'),
        '--crio-dropin-dir', path.join(nodeDir, 'no-crio', 'crio.conf.d'),
        '--state-dir', path.join(nodeDir, 'state'),
        '--auth-file', path.join(nodeDir, 'none.json'),
        '--kubelet-config', '',
        '--kubelet-config-dir', '',
        '--metrics-addr', '',
        ...this.#agentFlags,
      ],
      { cli: this.#cli },
    );
    const node: FleetNode = { name, version, containerd, cri: new CriClient(containerd.endpoint), agent, dir: nodeDir };
    this.nodes.push(node);
    return node;
  }

  /** `count` images of `bytes` random bytes each, pushed to the upstream registry directly (not across the link). */
  async pushImages(prefix: string, count: number, bytes: number): Promise<PushedImage[]> {
    const out: PushedImage[] = [];
    for (let i = 0; i < count; i++) out.push(await pushRandom(this.upstream, `${prefix}/image-${i + 1}`, bytes, { host: FLEET_REGISTRY }));
    return out;
  }

  /** The images' manifests, read back from the upstream registry (not across the link). */
  async manifests(images: readonly PushedImage[]): Promise<FleetManifest[]> {
    const out: FleetManifest[] = [];
    for (const image of images) {
      const res = await fetch(`${this.upstream.url}/v2/${image.repo}/manifests/${image.digest}`, { headers: { accept: 'application/vnd.oci.image.manifest.v1+json' } });
      if (!res.ok) throw new Error(`the manifest of ${image.ref}: HTTP ${res.status} from the upstream registry`);
      const m = (await res.json()) as { config: FleetBlob; layers: FleetBlob[] };
      out.push({ image, config: m.config, layers: m.layers });
    }
    return out;
  }

  /** Per blob of these images (every node done pulling them): how often it crossed the link, and what explains it (BlobCrossings). */
  async blobCrossings(images: readonly PushedImage[]): Promise<BlobCrossings[]> {
    const pulls = this.pulls();
    const out: BlobCrossings[] = [];
    for (const m of await this.manifests(images)) {
      const mine = pulls.filter((p) => p.image === m.image.ref);
      const wave = mine.reduce<ImagePull | undefined>((a, b) => (a === undefined || (b.finishedAt ?? Infinity) < (a.finishedAt ?? Infinity) ? b : a), undefined);
      if (wave?.finishedAt === undefined) throw new Error(`no node finished pulling ${m.image.ref}`);
      const heldAt = wave.finishedAt;
      for (const blob of [m.config, ...m.layers]) {
        const storedAt = this.cache ? await cacheStoredAt(this.cache, m.image.repo, blob.digest) : undefined;
        const gets = this.link.blobGets(blob.digest).filter((g) => g.status === 200).sort((a, b) => a.startedAt - b.startedAt);
        out.push({
          image: m.image.ref,
          blob,
          wave: { node: wave.node, heldAt },
          storedAt,
          gets,
          waveGets: gets.filter((g) => g.startedAt < heldAt),
          laterGets: gets.filter((g) => g.startedAt >= heldAt),
          startedInFlight: mine.filter((p) => p !== wave && (storedAt === undefined || p.startedAt < storedAt)).map((p) => p.node),
        });
      }
    }
    return out;
  }

  /** Creates a set of these images for every fleet node; resolves to its creation time (ms since the epoch). */
  createSet(name: string, images: readonly PushedImage[], rollout?: RolloutSpec | Record<string, unknown>): number {
    const at = Date.now();
    this.api.create({
      apiVersion: 'pinset.dev/v1alpha1',
      kind: 'PinnedImageSet',
      metadata: { name },
      spec: { nodeSelector: { matchLabels: { ...FLEET_LABEL } }, pinnedImages: images.map((i) => ({ name: i.ref })), ...(rollout ? { rollout } : {}) },
    } as KubeObject);
    return at;
  }

  /** A node's status of one set, from its Node's annotation. */
  setStatus(node: string, set: string): NodeSetStatus | undefined {
    const raw = this.api.get('nodes', node)?.metadata.annotations?.[STATUS_ANNOTATION];
    return parseNodeStatus(raw).status?.sets.find((s) => s.name === set);
  }

  /**
   * Waits until every node reports the set Ready with every image pinned;
   * resolves to when each node was first seen so (ms since the epoch).
   */
  async waitAllReady(set: string, wanted: number, timeoutMs: number): Promise<Map<string, number>> {
    const readyAt = new Map<string, number>();
    const deadline = Date.now() + timeoutMs;
    while (readyAt.size < this.nodes.length) {
      for (const n of this.nodes) {
        if (readyAt.has(n.name)) continue;
        const s = this.setStatus(n.name, set);
        if (s?.phase === 'Ready' && s.images.pinned === wanted) readyAt.set(n.name, Date.now());
        if (!n.agent.running) throw new Error(`the agent of ${n.name} exited:\n${n.agent.output().slice(-3000)}`);
      }
      if (Date.now() > deadline) {
        const state = this.nodes.map((n) => `${n.name}: ${JSON.stringify(this.setStatus(n.name, set) ?? null)}`).join('\n');
        throw new Error(`not every node Ready with ${set} after ${timeoutMs} ms:\n${state}`);
      }
      await new Promise((r) => setTimeout(r, 20));
    }
    return readyAt;
  }

  /** When each node started and finished each image, from the agents' `pulling image` / `pulled image` lines. */
  pulls(): ImagePull[] {
    const out: ImagePull[] = [];
    for (const n of this.nodes) {
      const open = new Map<string, ImagePull>();
      for (const l of n.agent.logs() as (LogLine & { image?: string; time?: string })[]) {
        // The agent logs ISO times (src/util/log.ts).
        const time = typeof l.time === 'string' ? Date.parse(l.time) : NaN;
        if (typeof l.image !== 'string' || Number.isNaN(time)) continue;
        if (l.msg === 'pulling image' && !open.has(l.image)) {
          const p: ImagePull = { node: n.name, image: l.image, startedAt: time };
          open.set(l.image, p);
          out.push(p);
        } else if (l.msg === 'pulled image') {
          const p = open.get(l.image);
          if (p && p.finishedAt === undefined) p.finishedAt = time;
        }
      }
    }
    return out;
  }

  /** Stops every agent, containerd, registry and the link, by PID, and removes their folders. Safe to call twice. */
  async stop(): Promise<void> {
    for (const n of this.nodes) await n.agent.stop();
    for (const n of this.nodes) {
      n.cri.close();
      await n.containerd.stop();
    }
    this.nodes.length = 0;
    await this.cache?.stop();
    await this.link.stop();
    await this.upstream.stop();
    await this.api.stop();
    await rm(this.dir, { recursive: true, force: true });
  }
}
