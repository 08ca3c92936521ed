// Whether the PinnedImageSets the agent lists are the sets as their owners
// left them, or sets going away with their CustomResourceDefinition.
//
// Deleting a CRD deletes its objects first: the API server marks the CRD
// (deletionTimestamp, the finalizer customresourcecleanup.apiextensions.k8s.io,
// condition Terminating), its finalizer controller deletes every object
// (watchers get a DELETED event for each), then removes the CRD; the
// type's watches end and a list is 404 from then on
// (apiextensions-apiserver pkg/registry/customresourcedefinition/etcd.go
// Delete, pkg/controller/finalizer/crd_finalizer.go). To a watcher, sets
// deleted that way look exactly like sets deleted by their owners. Taking
// them as deleted would unpin every node's images, cluster-wide, because
// someone removed (or reinstalled) a CRD: the disk the pins hold would be
// the kubelet's to reclaim, and a disconnected node would lose images it
// cannot pull again.
//
// So a deletion counts only when the CRD is there and not being deleted:
// after every list of the sets and every DELETED event the agent reads
// the CRD (one GET of its metadata, needing `get` on that one CRD by name
// in RBAC). While it is being deleted, is missing, or cannot be read, the
// sets are an incomplete observation: the current pins stay, and the node
// status and a log line say why and how to unpin (`pinset uninstall`,
// which deletes the sets one by one while the CRD stands, or
// `pinset agent --drop-pins` on the node). A CRD created again and listed
// is the truth again, empty or not.
import type { Logger } from 'pino';
import { KubeApiError, type KubeHttp } from '../api/kube-http.ts';
import { METADATA_WATCH_ACCEPT } from '../api/list-pages.ts';
import { CRD_NAME } from '../api/types.ts';
import { Backoff, type BackoffPolicy } from '../util/backoff.ts';

export const CRD_PATH = `/apis/apiextensions.k8s.io/v1/customresourcedefinitions/${CRD_NAME}`;
const HOW_TO_UNPIN = 'to remove them: `pinset uninstall`, or `pinset agent --drop-pins` on this node';

export type CrdState =
  | { kind: 'served' }
  | { kind: 'terminating'; since: string }
  | { kind: 'missing' }
  | { kind: 'unknown'; error: string };

export interface CrdCheckOptions {
  http: KubeHttp;
  log: Logger;
  /** The state changed: the sets may be taken as listed again, or not. */
  onChange: (why: string) => void;
  timeoutMs?: number;
  backoff?: BackoffPolicy;
}

export class CrdCheck {
  readonly #o: CrdCheckOptions;
  readonly #backoff: Backoff;
  #state: CrdState = { kind: 'unknown', error: 'not read yet' };
  #wanted = false;
  #running: Promise<void> | undefined;
  #retry: NodeJS.Timeout | undefined;
  #stopped = false;

  constructor(o: CrdCheckOptions) {
    this.#o = o;
    this.#backoff = new Backoff(o.backoff ?? { baseMs: 1_000, capMs: 30_000 });
  }

  get state(): CrdState {
    return this.#state;
  }

  /** The CRD stands and is not being deleted: the listed sets are the sets. */
  get served(): boolean {
    return this.#state.kind === 'served';
  }

  /** Read the CRD again (after a list, a DELETED event); calls made while one read runs make one more read. */
  recheck(): void {
    if (this.#stopped) return;
    this.#wanted = true;
    clearTimeout(this.#retry);
    this.#retry = undefined;
    this.#running ??= this.#loop();
  }

  /** A list or watch of the sets answered 404: the type is not served. */
  notServed(): void {
    this.#set({ kind: 'missing' });
  }

  /** Resolves once no read is running (a read that failed waits for its retry without holding this). */
  async settled(): Promise<void> {
    while (this.#running) await this.#running;
  }

  /** Why the listed sets cannot be taken as they are, and what to do; undefined while the CRD is served. */
  problem(): string | undefined {
    const s = this.#state;
    switch (s.kind) {
      case 'served':
        return undefined;
      case 'missing':
        return `the CustomResourceDefinition ${CRD_NAME} is not installed, so the sets cannot be listed; the pins stay (${HOW_TO_UNPIN})`;
      case 'terminating':
        return `the CustomResourceDefinition ${CRD_NAME} is being deleted (since ${s.since}): its sets go with it, which is not taken as their deletion, so their pins stay (${HOW_TO_UNPIN})`;
      case 'unknown':
        return `cannot tell whether the CustomResourceDefinition ${CRD_NAME} is being deleted (${s.error}), so the sets as listed are not applied yet; retrying`;
    }
  }

  stop(): void {
    this.#stopped = true;
    clearTimeout(this.#retry);
  }

  async #loop(): Promise<void> {
    try {
      while (this.#wanted && !this.#stopped) {
        this.#wanted = false;
        await this.#readOnce();
      }
    } finally {
      this.#running = undefined;
    }
  }

  async #readOnce(): Promise<void> {
    try {
      const crd = await this.#o.http.json<{ metadata?: { deletionTimestamp?: string } }>('GET', CRD_PATH, {}, undefined, {
        timeoutMs: this.#o.timeoutMs ?? 15_000,
        accept: METADATA_WATCH_ACCEPT,
      });
      this.#backoff.reset();
      const since = crd?.metadata?.deletionTimestamp;
      this.#set(since ? { kind: 'terminating', since } : { kind: 'served' });
    } catch (err) {
      if (err instanceof KubeApiError && err.code === 404) {
        this.#backoff.reset();
        this.#set({ kind: 'missing' });
        return;
      }
      let error = (err instanceof Error ? err.message : String(err)).slice(0, 300);
      if (err instanceof KubeApiError && err.code === 403) error += `; the agent needs get on customresourcedefinitions ${CRD_NAME} (deploy/agent/rbac.yaml)`;
      const delay = this.#backoff.fail();
      this.#set({ kind: 'unknown', error });
      if (this.#stopped) return;
      this.#retry = setTimeout(() => this.recheck(), delay);
      this.#retry.unref();
    }
  }

  #set(next: CrdState): void {
    const before = this.#state;
    this.#state = next;
    if (JSON.stringify(before) === JSON.stringify(next)) return;
    const why = this.problem();
    if (why) this.#o.log.warn({ crd: CRD_NAME, state: next.kind }, why);
    else if (before.kind !== 'unknown' || before.error !== 'not read yet') this.#o.log.info({ crd: CRD_NAME }, 'the CustomResourceDefinition is served again: the sets are taken as listed');
    this.#o.onChange(`the CustomResourceDefinition ${CRD_NAME} is ${next.kind}`);
  }
}
