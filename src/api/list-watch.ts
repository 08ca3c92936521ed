// A list+watch cache of one kind of object, as client-go's reflector keeps
// one, for the agent and the controller:
// - list once, then watch from the list's resourceVersion, keeping the
//   resourceVersion of every event and bookmark so a watch that ends resumes
//   where it left off without a relist;
// - every watch asks the server to end it after timeoutSeconds, a random
//   time between minWatchTimeout and twice that (client-go's reflector:
//   minWatchTimeout * (1 + rand), with 5 minutes), with
//   allowWatchBookmarks=true, and gives up on a silent watch only a minute
//   after that: a real API server sends nothing at all on a quiet watch
//   until its watch cache has processed an event, so an idle limit below
//   timeoutSeconds re-opens every quiet watch (what client-node's Watch does
//   every 30 s);
// - 410 Gone (an ERROR event with code 410 or an HTTP 410, after etcd
//   compaction or an API server restart) relists, and so does a watch
//   refused with 404 (its type no longer served: a CRD deleted);
// - failures back off (1 s doubling to 30 s, with jitter); the backoff is
//   reset only by a watch that delivered an event or stayed open for a while,
//   never by a request merely starting or a list succeeding while the watch
//   keeps failing;
// - a failure never changes the cache: the last observation stays until a
//   successful list or watch says otherwise;
// - lists are read in pages (limit 500, as the reflector's pager), into a
//   fresh map that replaces the cache only once the last page is in;
// - seed(): a caller that has just written (and so read back) the one
//   object it follows starts from it, watching from its resourceVersion with
//   no first list (a 410 lists as usual): a node that queues for a rollout
//   slot makes one create and one watch, not a create, a list and a watch;
// - metadataOnly asks for PartialObjectMetadata on lists and watches (as
//   controller-runtime's metadata informers do), and `transform` keeps of
//   each object only what the consumer reads (client-go's SetTransform), so
//   a cache of thousands of Nodes holds neither their status nor their
//   managedFields (./list-pages.ts).
import type { Logger } from '../util/log.ts';
import { Backoff, type BackoffPolicy } from '../util/backoff.ts';
import { KubeApiError, type KubeHttp, type OpenStream } from './kube-http.ts';
import { DEFAULT_PAGE_SIZE, listAll, METADATA_LIST_ACCEPT, METADATA_LIST_KIND, METADATA_WATCH_ACCEPT } from './list-pages.ts';
import { DEFAULT_MIN_WATCH_TIMEOUT_MS } from './watch-timeout.ts';

export { DEFAULT_MIN_WATCH_TIMEOUT_MS, minWatchTimeoutFlag, minWatchTimeoutMs } from './watch-timeout.ts';

export interface KubeObjectLike {
  metadata?: { name?: string; namespace?: string; resourceVersion?: string };
}

interface WatchEvent {
  type: 'ADDED' | 'MODIFIED' | 'DELETED' | 'BOOKMARK' | 'ERROR';
  object: KubeObjectLike & { code?: number; message?: string; reason?: string };
}

export const WATCH_BACKOFF: BackoffPolicy = { baseMs: 1_000, capMs: 30_000 };

export interface ListWatchOptions {
  http: KubeHttp;
  /** Collection path, e.g. /api/v1/nodes. */
  path: string;
  /** Name for logs and metrics. */
  what: string;
  log: Logger;
  fieldSelector?: string;
  labelSelector?: string;
  /** timeoutSeconds is drawn from [min, 2 * min). */
  minWatchTimeoutMs?: number;
  /** A watch silent for timeoutSeconds plus this is given up as dead. */
  idleGraceMs?: number;
  /** A watch open this long counts as healthy even if it delivered nothing. */
  healthyAfterMs?: number;
  backoff?: BackoffPolicy;
  random?: () => number;
  /** Items per list request (limit/continue); 0 lists in one request. */
  pageSize?: number;
  /** Ask for metadata only (PartialObjectMetadataList on lists, PartialObjectMetadata on watches). */
  metadataOnly?: boolean;
}

/**
 * What the cache keeps of each object it reads (a list item or a watch
 * event's object, whole or metadata only). It must keep metadata.name,
 * metadata.namespace and metadata.resourceVersion.
 */
export type Transform<T> = (obj: KubeObjectLike) => T;

export type ListWatchEvent = 'add' | 'update' | 'delete' | 'synced' | 'failure';

type Handler<T> = {
  add: (obj: T) => void;
  update: (obj: T, old: T) => void;
  delete: (obj: T) => void;
  /** After every successful list. */
  synced: () => void;
  /** A list or watch failed (the cache is unchanged). */
  failure: (err: Error) => void;
};

type Outcome = { kind: 'closed' | 'expired' | 'error'; healthy: boolean; err?: Error };

function keyOf(obj: KubeObjectLike): string {
  return `${obj.metadata?.namespace ?? ''}/${obj.metadata?.name ?? ''}`;
}

function errText(err: unknown): string {
  return (err instanceof Error ? err.message : String(err)).slice(0, 500);
}

export class ListWatchCache<T extends KubeObjectLike> {
  readonly what: string;
  readonly #opts: Required<Omit<ListWatchOptions, 'fieldSelector' | 'labelSelector'>> & Pick<ListWatchOptions, 'fieldSelector' | 'labelSelector'>;
  readonly #transform: Transform<T>;
  /** Whether a metadata-only list was answered with whole objects (said once). */
  #toldWholeObjects = false;
  readonly #backoff: Backoff;
  readonly #objects = new Map<string, T>();
  readonly #handlers: { [K in keyof Handler<T>]: Handler<T>[K][] } = { add: [], update: [], delete: [], synced: [], failure: [] };
  #rv = '';
  #synced = false;
  #seeded = false;
  #stopped = true;
  #loop: Promise<void> | undefined;
  #stream: OpenStream | undefined;
  #wake: (() => void) | undefined;

  constructor(opts: ListWatchOptions, transform: Transform<T> = (o) => o as T) {
    this.what = opts.what;
    this.#transform = transform;
    this.#opts = {
      minWatchTimeoutMs: DEFAULT_MIN_WATCH_TIMEOUT_MS,
      idleGraceMs: 60_000,
      healthyAfterMs: 30_000,
      backoff: WATCH_BACKOFF,
      random: Math.random,
      pageSize: DEFAULT_PAGE_SIZE,
      metadataOnly: false,
      // An option given as undefined keeps its default.
      ...(Object.fromEntries(Object.entries(opts).filter(([, v]) => v !== undefined)) as ListWatchOptions),
    };
    this.#backoff = new Backoff(this.#opts.backoff, this.#opts.random);
  }

  on<E extends keyof Handler<T>>(event: E, fn: Handler<T>[E]): this {
    this.#handlers[event].push(fn);
    return this;
  }

  /** Whether a list has succeeded at least once. */
  get synced(): boolean {
    return this.#synced;
  }

  /** The resourceVersion the next watch starts from ('' = relist). */
  get resourceVersion(): string {
    return this.#rv;
  }

  list(): T[] {
    return [...this.#objects.values()];
  }

  get(name: string, namespace?: string): T | undefined {
    return this.#objects.get(`${namespace ?? ''}/${name}`);
  }

  /**
   * Before start(): begin from these objects as of `resourceVersion`, as a
   * list would have (they are reported as added when the cache starts), and
   * watch from there without a first list.
   */
  seed(items: readonly T[], resourceVersion: string): this {
    if (!this.#stopped || this.#synced) throw new Error(`${this.what}: seed() comes before start()`);
    for (const o of items) this.#objects.set(keyOf(o), o);
    this.#rv = resourceVersion;
    this.#seeded = true;
    return this;
  }

  start(): void {
    if (!this.#stopped) return;
    this.#stopped = false;
    this.#loop = this.#run();
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    this.#stream?.abort();
    this.#wake?.();
    await this.#loop;
    this.#loop = undefined;
  }

  #emit<E extends keyof Handler<T>>(event: E, ...args: Parameters<Handler<T>[E]>): void {
    for (const fn of this.#handlers[event]) {
      try {
        (fn as (...a: Parameters<Handler<T>[E]>) => void)(...args);
      } catch (err) {
        this.#opts.log.error({ watch: this.what, err: errText(err) }, 'list-watch handler failed');
      }
    }
  }

  async #sleep(ms: number): Promise<void> {
    if (ms <= 0 || this.#stopped) return;
    await new Promise<void>((resolve) => {
      const t = setTimeout(resolve, ms);
      this.#wake = () => {
        clearTimeout(t);
        resolve();
      };
    });
    this.#wake = undefined;
  }

  #fail(where: 'list' | 'watch', err: Error, delayMs: number): void {
    this.#emit('failure', err);
    this.#opts.log.warn({ watch: this.what, err: errText(err), retryInMs: delayMs, failures: this.#backoff.failures }, `${where} failed; keeping the last observation and retrying`);
  }

  async #run(): Promise<void> {
    if (this.#seeded) {
      this.#seeded = false;
      this.#synced = true;
      for (const o of this.#objects.values()) this.#emit('add', o);
      this.#emit('synced');
    }
    while (!this.#stopped) {
      if (this.#rv === '') {
        try {
          await this.#list();
        } catch (err) {
          if (this.#stopped) break;
          const delay = this.#backoff.fail();
          this.#fail('list', err as Error, delay);
          await this.#sleep(delay);
          continue;
        }
      }
      const outcome = await this.#watchOnce();
      if (this.#stopped) break;
      if (outcome.healthy) this.#backoff.reset();
      if (outcome.kind === 'expired') this.#rv = '';
      // A healthy watch that ended (the server's timeout) or expired resumes
      // at once; anything else waits: a watch that ends at once with
      // nothing, or fails, must not become a request loop.
      const delay = outcome.healthy && outcome.kind !== 'error' ? 0 : this.#backoff.fail();
      if (outcome.kind === 'error') this.#fail('watch', outcome.err ?? new Error('watch failed'), delay);
      else if (outcome.kind === 'expired') this.#opts.log.info({ watch: this.what, retryInMs: delay }, 'resourceVersion expired (410 Gone); relisting');
      else if (delay > 0) this.#opts.log.warn({ watch: this.what, retryInMs: delay }, 'watch ended at once without events; retrying');
      await this.#sleep(delay);
    }
  }

  async #list(): Promise<void> {
    const { fieldSelector, labelSelector, metadataOnly } = this.#opts;
    const list = await listAll<KubeObjectLike, T>(
      {
        http: this.#opts.http,
        path: this.#opts.path,
        fieldSelector,
        labelSelector,
        pageSize: this.#opts.pageSize,
        accept: metadataOnly ? METADATA_LIST_ACCEPT : undefined,
      },
      this.#transform,
    );
    if (this.#stopped) return;
    if (metadataOnly && list.kind !== METADATA_LIST_KIND && !this.#toldWholeObjects) {
      this.#toldWholeObjects = true;
      this.#opts.log.warn({ watch: this.what, kind: list.kind }, 'the API server answered whole objects to a metadata-only list; keeping only what is needed of each');
    }
    const fresh = new Map(list.items.map((o) => [keyOf(o), o]));
    for (const [key, old] of [...this.#objects]) {
      if (!fresh.has(key)) {
        this.#objects.delete(key);
        this.#emit('delete', old);
      }
    }
    for (const [key, obj] of fresh) this.#upsert(key, obj);
    this.#rv = list.resourceVersion;
    this.#synced = true;
    this.#emit('synced');
  }

  #upsert(key: string, obj: T): void {
    const old = this.#objects.get(key);
    this.#objects.set(key, obj);
    if (!old) this.#emit('add', obj);
    else if (old.metadata?.resourceVersion !== obj.metadata?.resourceVersion || old.metadata?.resourceVersion === undefined) this.#emit('update', obj, old);
  }

  /** Draw this watch's timeoutSeconds. */
  #timeoutSeconds(): number {
    const min = this.#opts.minWatchTimeoutMs / 1000;
    return Math.max(1, Math.floor(min * (1 + this.#opts.random())));
  }

  async #watchOnce(): Promise<Outcome> {
    const timeoutSeconds = this.#timeoutSeconds();
    const { fieldSelector, labelSelector } = this.#opts;
    const opened = Date.now();
    let stream: OpenStream;
    try {
      stream = await this.#opts.http.stream(
        this.#opts.path,
        { watch: 'true', resourceVersion: this.#rv, allowWatchBookmarks: 'true', timeoutSeconds, fieldSelector, labelSelector },
        { accept: this.#opts.metadataOnly ? METADATA_WATCH_ACCEPT : undefined },
      );
    } catch (err) {
      if (err instanceof KubeApiError && err.code === 410) return { kind: 'expired', healthy: false };
      // 404: the type is not served (a CRD deleted). Its history went with
      // it, so the next attempt lists, as client-go's reflector does after
      // a watch error it cannot retry.
      if (err instanceof KubeApiError && err.code === 404) this.#rv = '';
      return { kind: 'error', healthy: false, err: err as Error };
    }
    if (this.#stopped) {
      stream.abort();
      return { kind: 'closed', healthy: false };
    }
    this.#stream = stream;
    let delivered = false;
    let expired = false;
    let serverError: Error | undefined;
    const idleLimitMs = timeoutSeconds * 1000 + this.#opts.idleGraceMs;
    let idle: NodeJS.Timeout | undefined;
    const armIdle = () => {
      clearTimeout(idle);
      idle = setTimeout(() => stream.abort(new Error(`the watch sent nothing for ${Math.round(idleLimitMs / 1000)}s (timeoutSeconds ${timeoutSeconds} plus a grace)`)), idleLimitMs);
    };
    armIdle();
    stream.onData(armIdle);
    stream.onLine((line) => {
      let ev: WatchEvent;
      try {
        ev = JSON.parse(line) as WatchEvent;
      } catch {
        serverError = new Error(`the watch sent a line that is not JSON: ${line.slice(0, 100)}`);
        stream.abort(serverError);
        return;
      }
      const obj = ev.object;
      switch (ev.type) {
        case 'ADDED':
        case 'MODIFIED':
          this.#upsert(keyOf(obj), this.#transform(obj));
          break;
        case 'DELETED': {
          const key = keyOf(obj);
          const old = this.#objects.get(key);
          if (old) {
            this.#objects.delete(key);
            this.#emit('delete', this.#transform(obj));
          }
          break;
        }
        case 'BOOKMARK':
          break;
        case 'ERROR':
          // The server ends the stream after an ERROR event.
          if (obj?.code === 410) expired = true;
          else serverError = new Error(`the watch reported an error: ${obj?.code ?? ''} ${obj?.reason ?? ''} ${obj?.message ?? ''}`.trim());
          return;
        default:
          return;
      }
      delivered = true;
      if (obj?.metadata?.resourceVersion) this.#rv = obj.metadata.resourceVersion;
    });
    const err = await new Promise<Error | null>((resolve) => stream.onEnd(resolve));
    clearTimeout(idle);
    this.#stream = undefined;
    const healthy = delivered || Date.now() - opened >= this.#opts.healthyAfterMs;
    if (expired) return { kind: 'expired', healthy };
    if (serverError) return { kind: 'error', healthy, err: serverError };
    if (err) return { kind: 'error', healthy, err };
    return { kind: 'closed', healthy };
  }
}
