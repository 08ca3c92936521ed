// The API side of the agent's observation: one list+watch on
// PinnedImageSets and one on this node's Node object (field selector on its
// name), through @kubernetes/client-node's ListWatch, which keeps the
// resourceVersion, relists on 410 Gone and reconnects a watch that ends.
// A watch that fails is restarted here with capped, jittered backoff. The
// caches keep the last successful observation while the API is away: a
// fault never looks like a deleted set.
import {
  CoreV1Api,
  CustomObjectsApi,
  type KubeConfig,
  ListWatch,
  Watch,
  type KubernetesListObject,
  type KubernetesObject,
  type V1Node,
} from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { GROUP, PLURAL, VERSION, type PinnedImageSet } from '../api/types.ts';
import { Backoff } from './backoff.ts';

/** A ListWatch that knows whether its first list succeeded, and restarts after errors. */
class ObservedList<T extends KubernetesObject> {
  readonly what: string;
  readonly lw: ListWatch<T>;
  synced = false;
  private readonly backoff = new Backoff({ baseMs: 1_000, capMs: 30_000 });
  private retryTimer: NodeJS.Timeout | undefined;
  private stopped = false;

  /**
   * `relevant` reduces an object to what the agent acts on; an update that
   * leaves it unchanged (for the Node: anything but its labels, such as the
   * agent's own status annotation or the kubelet's heartbeat) triggers nothing.
   */
  constructor(
    what: string,
    kc: KubeConfig,
    path: string,
    list: () => Promise<KubernetesListObject<T>>,
    fieldSelector: string | undefined,
    log: Logger,
    onChange: (why: string) => void,
    relevant: (obj: T) => unknown = (obj) => obj,
  ) {
    this.what = what;
    const listAndMark = async () => {
      const r = await list();
      this.synced = true;
      this.backoff.reset();
      // The informer fills its cache right after this returns.
      setImmediate(() => onChange(`${what} listed`));
      return r;
    };
    // Bookmarks keep the resourceVersion fresh on quiet resources, so a
    // reconnect rarely needs a relist. ListWatch passes only its own
    // parameters, so this one rides on the path.
    this.lw = new ListWatch<T>(`${path}?allowWatchBookmarks=true`, new Watch(kc), listAndMark, false, undefined, fieldSelector);
    const seen = new Map<string, string>();
    const changed = (obj: T) => {
      const key = obj.metadata?.name ?? '';
      const now = JSON.stringify(relevant(obj));
      if (seen.get(key) === now) return false;
      seen.set(key, now);
      return true;
    };
    this.lw.on('add', (obj: T) => changed(obj) && onChange(`${what} added`));
    this.lw.on('update', (obj: T) => changed(obj) && onChange(`${what} updated`));
    this.lw.on('delete', (obj: T) => {
      seen.delete(obj.metadata?.name ?? '');
      onChange(`${what} deleted`);
    });
    this.lw.on('connect', () => this.backoff.reset());
    this.lw.on('error', (err: unknown) => {
      if (this.stopped) return;
      const delay = this.backoff.fail();
      log.warn({ err: errText(err), retryInMs: delay, watch: what }, 'watch failed; keeping the last observation and retrying');
      clearTimeout(this.retryTimer);
      this.retryTimer = setTimeout(() => void this.start(), delay);
    });
  }

  async start(): Promise<void> {
    this.stopped = false;
    await this.lw.start().catch(() => {
      // Reported through the 'error' callback.
    });
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.retryTimer);
    await this.lw.stop();
  }
}

function errText(err: unknown): string {
  if (err instanceof Error) return err.message.slice(0, 500);
  return String(err).slice(0, 500);
}

export class KubeObserver {
  readonly nodeName: string;
  private readonly sets: ObservedList<PinnedImageSet & KubernetesObject>;
  private readonly node: ObservedList<V1Node>;

  constructor(kc: KubeConfig, nodeName: string, log: Logger, onChange: (why: string) => void) {
    this.nodeName = nodeName;
    const custom = kc.makeApiClient(CustomObjectsApi);
    const core = kc.makeApiClient(CoreV1Api);
    const setsPath = `/apis/${GROUP}/${VERSION}/${PLURAL}`;
    this.sets = new ObservedList(
      'pinnedimagesets',
      kc,
      setsPath,
      () => custom.listClusterCustomObject({ group: GROUP, version: VERSION, plural: PLURAL }) as Promise<KubernetesListObject<PinnedImageSet & KubernetesObject>>,
      undefined,
      log,
      onChange,
      // The controller's status writes change nothing for the agent.
      (s) => [s.metadata?.uid, s.metadata?.generation, s.spec],
    );
    const fieldSelector = `metadata.name=${nodeName}`;
    this.node = new ObservedList('node', kc, '/api/v1/nodes', () => core.listNode({ fieldSelector }), fieldSelector, log, onChange, (n: V1Node) => n.metadata?.labels ?? {});
  }

  async start(): Promise<void> {
    await Promise.all([this.sets.start(), this.node.start()]);
  }

  async stop(): Promise<void> {
    await Promise.all([this.sets.stop(), this.node.stop()]);
  }

  /** The sets from the last successful observation, or null if none has succeeded yet. */
  currentSets(): PinnedImageSet[] | null {
    return this.sets.synced ? (this.sets.lw.list() as PinnedImageSet[]) : null;
  }

  /** This node as last observed, or null if it has not been read. */
  currentNode(): V1Node | null {
    if (!this.node.synced) return null;
    return this.node.lw.get(this.nodeName) ?? null;
  }

  get synced(): boolean {
    return this.sets.synced && this.node.synced;
  }
}
