// The API side of the agent's observation: one list+watch on
// PinnedImageSets and one on this node's Node object (field selector on its
// name), and, once a set names a pull secret, one on the Secrets of the
// agents' own namespace (./pull-secrets.ts; of each Secret only its type
// and its pull-secret key are kept), through ListWatchCache
// (src/api/list-watch.ts): long watches with
// bookmarks, resourceVersions kept across reconnects, a relist on 410 Gone,
// capped and jittered backoff on failures. The caches keep the last
// successful observation while the API is away: a fault never looks like a
// deleted set. Nor does a CRD being deleted (./crd-check.ts): the sets are
// taken as listed only while their CRD stands.
import { createHash } from 'node:crypto';
import type { KubeConfig, V1Node } from '@kubernetes/client-node';
import type { Logger } from 'pino';
import { KubeApiError, KubeHttp } from '../api/kube-http.ts';
import { ListWatchCache, type ListWatchOptions } from '../api/list-watch.ts';
import { GROUP, PLURAL, VERSION, type PinnedImageSet } from '../api/types.ts';
import { CrdCheck } from './crd-check.ts';
import { AGENT_FIELD_MANAGER } from './node-sinks.ts';
import { pullSecretView, type SecretLike, type SecretStore } from './pull-secrets.ts';

export interface KubeObserverOptions {
  /** Watch tuning; see ListWatchOptions. */
  minWatchTimeoutMs?: number;
  watch?: Partial<Pick<ListWatchOptions, 'idleGraceMs' | 'healthyAfterMs' | 'backoff'>>;
  /** The agents' namespace, whose Secrets sets may name as pull secrets (default pinset-system). */
  secretNamespace?: string;
  /** A Secret there was added, changed or deleted (by name): no desired state changed, only what a pull may use. */
  onSecretChange?: (name: string) => void;
}

/**
 * Calls `onChange` only when what the agent acts on changed: `relevant`
 * reduces an object to that (for the Node: its labels, not the kubelet's
 * heartbeats nor the agent's own status annotation).
 */
function watchRelevant<T extends { metadata?: { name?: string; namespace?: string } }>(
  cache: ListWatchCache<T>,
  what: string,
  onChange: (why: string) => void,
  relevant: (obj: T) => unknown,
): void {
  // Per object, a digest of what is relevant: a set's spec of 1000 images is 100 KB as JSON.
  const seen = new Map<string, string>();
  const key = (o: T) => `${o.metadata?.namespace ?? ''}/${o.metadata?.name ?? ''}`;
  const changed = (obj: T) => {
    const now = createHash('sha256').update(JSON.stringify(relevant(obj))).digest('base64');
    if (seen.get(key(obj)) === now) return false;
    seen.set(key(obj), now);
    return true;
  };
  cache.on('add', (o) => changed(o) && onChange(`${what} added`));
  cache.on('update', (o) => changed(o) && onChange(`${what} updated`));
  cache.on('delete', (o) => {
    seen.delete(key(o));
    onChange(`${what} deleted`);
  });
  // The cache is filled when this fires; one reconcile looks at all of it.
  cache.on('synced', () => setImmediate(() => onChange(`${what} listed`)));
}

export class KubeObserver {
  readonly nodeName: string;
  readonly http: KubeHttp;
  private readonly sets: ListWatchCache<PinnedImageSet>;
  private readonly node: ListWatchCache<V1Node>;
  private secretCache: ListWatchCache<SecretLike> | undefined;
  private stopped = false;
  /** The agents' namespace's Secrets, watched from the first watch() on. */
  readonly secrets: SecretStore;
  private readonly crd: CrdCheck;

  constructor(kc: KubeConfig, nodeName: string, log: Logger, onChange: (why: string) => void, opts: KubeObserverOptions = {}) {
    this.nodeName = nodeName;
    this.http = new KubeHttp(kc, { userAgent: AGENT_FIELD_MANAGER });
    const common = { http: this.http, log, minWatchTimeoutMs: opts.minWatchTimeoutMs, ...opts.watch };
    this.secrets = this.secretStore(opts.secretNamespace ?? 'pinset-system', common, (name) => opts.onSecretChange?.(name));
    this.sets = new ListWatchCache<PinnedImageSet>({ ...common, what: 'pinnedimagesets', path: `/apis/${GROUP}/${VERSION}/${PLURAL}` });
    // Before a reconcile reads a list or a deletion, the CRD is read: sets
    // that go with their CRD are not deleted sets.
    this.crd = new CrdCheck({ http: this.http, log, onChange, ...(opts.watch?.backoff ? { backoff: opts.watch.backoff } : {}) });
    this.sets.on('synced', () => this.crd.recheck());
    this.sets.on('delete', () => this.crd.recheck());
    // A set seen while the CRD was not known to stand: it may stand again.
    this.sets.on('add', () => {
      if (!this.crd.served) this.crd.recheck();
    });
    this.sets.on('failure', (err) => {
      if (err instanceof KubeApiError && err.code === 404) this.crd.notServed();
    });
    // The controller's status writes change nothing for the agent.
    watchRelevant(this.sets, 'pinnedimagesets', onChange, (s) => [s.metadata?.uid, s.metadata?.generation, s.spec]);
    this.node = new ListWatchCache<V1Node>({ ...common, what: 'node', path: '/api/v1/nodes', fieldSelector: `metadata.name=${nodeName}` });
    watchRelevant(this.node, 'node', onChange, (n) => n.metadata?.labels ?? {});
  }

  async start(): Promise<void> {
    this.sets.start();
    this.node.start();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.crd.stop();
    await Promise.all([this.sets.stop(), this.node.stop(), this.secretCache?.stop()]);
    this.http.close();
  }

  /** Waits for a read of the CRD that a list or a deletion started (see ./crd-check.ts). */
  async settled(): Promise<void> {
    await this.crd.settled();
  }

  /**
   * A list+watch of the namespace's Secrets, made and started on the first
   * watch(): a cluster whose sets name no pull secret costs no watch. Of
   * each Secret only its name, type and pull-secret key are kept.
   */
  private secretStore(namespace: string, common: Omit<ListWatchOptions, 'path' | 'what'>, changed: (name: string) => void): SecretStore {
    const self = this;
    return {
      namespace,
      watch() {
        if (self.secretCache || self.stopped) return;
        const cache = new ListWatchCache<SecretLike>({ ...common, what: 'secrets', path: `/api/v1/namespaces/${encodeURIComponent(namespace)}/secrets` }, (o) => pullSecretView(o as SecretLike));
        const seen = new Map<string, string | undefined>();
        const note = (o: SecretLike) => {
          const name = o.metadata?.name ?? '';
          const rv = JSON.stringify([o.type, o.data]);
          if (seen.get(name) === rv) return;
          seen.set(name, rv);
          changed(name);
        };
        cache.on('add', note).on('update', note).on('delete', (o) => {
          seen.delete(o.metadata?.name ?? '');
          changed(o.metadata?.name ?? '');
        });
        self.secretCache = cache;
        cache.start();
      },
      get synced() {
        return self.secretCache?.synced ?? false;
      },
      get(name: string) {
        return self.secretCache?.get(name, namespace);
      },
      whenSynced(ms: number) {
        const cache = self.secretCache;
        if (!cache) return Promise.resolve(false);
        if (cache.synced) return Promise.resolve(true);
        return new Promise<boolean>((resolve) => {
          const timer = setTimeout(() => resolve(false), ms);
          cache.on('synced', () => {
            clearTimeout(timer);
            resolve(true);
          });
        });
      },
    };
  }

  /**
   * The sets from the last successful observation, or null if none has
   * succeeded yet or the CRD is not known to stand (missing, being
   * deleted, unreadable): then nothing is known of the sets.
   */
  currentSets(): PinnedImageSet[] | null {
    return this.sets.synced && this.crd.served ? this.sets.list() : null;
  }

  /** Why currentSets() is null, when it is for another reason than a list not done yet. */
  setsProblem(): string | undefined {
    return this.sets.synced || this.crd.state.kind === 'missing' ? this.crd.problem() : undefined;
  }

  /** This node as last observed, or null if it has not been read. */
  currentNode(): V1Node | null {
    if (!this.node.synced) return null;
    return this.node.get(this.nodeName) ?? null;
  }

  get synced(): boolean {
    return this.sets.synced && this.node.synced;
  }
}
