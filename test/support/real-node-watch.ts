// What the node suite watches while pinset's agent is replaced on the real
// node (./real-node.ts): the runtime's own `pinned` for every pinned image,
// read through CRI every 100 ms (PinSampler), and the agent's pods as the
// API and the kubelet's logs show them, every 100 ms (AgentPodWatch).
import type { CriClient } from './containerd.ts';
import { AGENT_NAMESPACE, AGENT_SELECTOR, podLogDir, readPodLogDir, type AgentLogLine } from './real-node-deploy.ts';
import type { KubeApi } from './real-node.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const bareId = (id: string) => id.replace(/^sha256:/, '');

export interface PinSamples {
  samples: number;
  /** The fewest of the expected images reported pinned in one sample. */
  lowestPinned: number;
  expected: number;
  /** Every sample in which an expected image was reported unpinned or absent. */
  lapses: Array<{ at: number; ref: string; state: 'unpinned' | 'absent' }>;
  /** CRI calls that failed (the runtime did not answer: no sample). */
  errors: number;
  lastError?: string;
  /** The longest gap between two samples (ms). */
  longestGapMs: number;
}

/** Reads `pinned` of `expected` images (by image ID) through one CRI ListImages every `intervalMs`. */
export class PinSampler {
  readonly #cri: CriClient;
  readonly #expected: Array<{ ref: string; id: string }>;
  readonly #intervalMs: number;
  readonly #result: PinSamples;
  #running = false;
  #loop: Promise<void> | undefined;

  constructor(cri: CriClient, expected: Array<{ ref: string; id: string }>, intervalMs = 100) {
    this.#cri = cri;
    this.#expected = expected.map((e) => ({ ref: e.ref, id: bareId(e.id) }));
    this.#intervalMs = intervalMs;
    this.#result = { samples: 0, lowestPinned: expected.length, expected: expected.length, lapses: [], errors: 0, longestGapMs: 0 };
  }

  start(): void {
    this.#running = true;
    this.#loop = (async () => {
      let last = Date.now();
      while (this.#running) {
        const at = Date.now();
        try {
          // A runtime busy creating a container may hold its storage lock for
          // seconds (CRI-O on vfs copies every layer): a slow answer is a
          // longer gap between samples, not a lapse.
          const images = await this.#cri.listImages({ deadlineMs: 15_000 });
          const byId = new Map(images.map((i) => [bareId(i.id), i]));
          let pinned = 0;
          for (const e of this.#expected) {
            const img = byId.get(e.id);
            if (img?.pinned) pinned++;
            else this.#result.lapses.push({ at, ref: e.ref, state: img ? 'unpinned' : 'absent' });
          }
          this.#result.samples++;
          this.#result.lowestPinned = Math.min(this.#result.lowestPinned, pinned);
          this.#result.longestGapMs = Math.max(this.#result.longestGapMs, at - last);
          last = at;
        } catch (e) {
          this.#result.errors++;
          this.#result.lastError = (e as Error).message;
        }
        await sleep(Math.max(0, this.#intervalMs - (Date.now() - at)));
      }
    })();
  }

  async stop(): Promise<PinSamples> {
    this.#running = false;
    await this.#loop;
    return this.#result;
  }
}

export interface WatchedPod {
  name: string;
  uid: string;
  image: string;
  firstSeenAt: number;
  /** When the suite first saw a deletionTimestamp on it. */
  deletingSeenAt?: number;
  goneAt?: number;
  readyAt?: number;
  restarts: number;
  /** The container logs as last read (kept once the kubelet removes them with the pod). */
  logFiles: string[];
  log: AgentLogLine[];
}

/** The agent's pods on the node, polled every `intervalMs`: their life and their logs. */
export class AgentPodWatch {
  readonly pods = new Map<string, WatchedPod>();
  readonly #api: KubeApi;
  readonly #podLogsDir: string;
  readonly #intervalMs: number;
  #running = false;
  #loop: Promise<void> | undefined;

  constructor(api: KubeApi, podLogsDir: string, intervalMs = 100) {
    this.#api = api;
    this.#podLogsDir = podLogsDir;
    this.#intervalMs = intervalMs;
  }

  async #tick(): Promise<void> {
    const now = Date.now();
    const items = (await this.#api.get(`/api/v1/namespaces/${AGENT_NAMESPACE}/pods?labelSelector=${encodeURIComponent(AGENT_SELECTOR)}`)).items as any[];
    const seen = new Set<string>();
    for (const p of items) {
      const uid: string = p.metadata.uid;
      seen.add(uid);
      const w: WatchedPod = this.pods.get(uid) ?? { name: p.metadata.name, uid, image: p.spec.containers[0].image, firstSeenAt: now, restarts: 0, logFiles: [], log: [] };
      this.pods.set(uid, w);
      if (p.metadata.deletionTimestamp && !w.deletingSeenAt) w.deletingSeenAt = now;
      const cs = p.status?.containerStatuses?.[0];
      if (cs?.ready && !w.readyAt) w.readyAt = now;
      w.restarts = Math.max(w.restarts, cs?.restartCount ?? 0);
      const logs = readPodLogDir(podLogDir(this.#podLogsDir, p));
      if (logs.lines.length >= w.log.length) {
        w.log = logs.lines;
        w.logFiles = logs.files;
      }
    }
    for (const w of this.pods.values()) if (!seen.has(w.uid) && !w.goneAt) w.goneAt = now;
  }

  async start(): Promise<void> {
    await this.#tick();
    this.#running = true;
    this.#loop = (async () => {
      while (this.#running) {
        const at = Date.now();
        await this.#tick().catch(() => undefined);
        await sleep(Math.max(0, this.#intervalMs - (Date.now() - at)));
      }
    })();
  }

  async stop(): Promise<void> {
    this.#running = false;
    await this.#loop;
  }

  /** The first log line of `pod` whose msg starts with `msg`, and its time. */
  static line(pod: WatchedPod, msg: string): (AgentLogLine & { at: number }) | undefined {
    const l = pod.log.find((x) => typeof x.msg === 'string' && x.msg.startsWith(msg));
    return l ? { ...l, at: Date.parse(String(l.time)) } : undefined;
  }
}
