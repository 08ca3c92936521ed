// The granter's heartbeat (./granter.ts): the Lease GRANTER_LEASE, renewed
// by the leading replica every 10 s for 30 s while its grants go through,
// deleted when it stops leading. A queued node that reads it live skips most
// of its polls (./claims.ts); without it the nodes poll as ever.
import type { KubeHttp } from '../api/kube-http.ts';
import type { Logger } from '../util/log.ts';
import { microTime, type LeaseObject } from './lease-slots.ts';
import { GRANTER_LEASE } from './slots.ts';

/** The heartbeat is renewed this often, and holds this long. */
export const HEARTBEAT_EVERY_MS = 10_000;
export const HEARTBEAT_SECONDS = 30;

const codeOf = (e: unknown) => (e as { code?: unknown } | null)?.code;

export interface GranterHeartbeatOptions {
  http: KubeHttp;
  namespace: string;
  fieldManager: string;
  /** The replica's name, the heartbeat's holder. */
  identity: string;
  log: Logger;
  now: () => number;
}

export class GranterHeartbeat {
  readonly #o: GranterHeartbeatOptions;
  readonly #path: string;
  #timer: NodeJS.Timeout | undefined;
  #beating = false;

  constructor(o: GranterHeartbeatOptions) {
    this.#o = o;
    this.#path = `/apis/coordination.k8s.io/v1/namespaces/${encodeURIComponent(o.namespace)}/leases/${GRANTER_LEASE}`;
  }

  /** Beat now and every HEARTBEAT_EVERY_MS while `healthy()` says the grants go through. */
  start(healthy: () => boolean): void {
    if (this.#timer) return;
    const beat = () => {
      if (healthy()) void this.#beat();
    };
    this.#timer = setInterval(beat, HEARTBEAT_EVERY_MS);
    this.#timer.unref?.();
    beat();
  }

  /** Stop beating and delete the heartbeat (if it is still this replica's), so the queued nodes poll again at once. */
  async stop(): Promise<void> {
    if (!this.#timer) return;
    clearInterval(this.#timer);
    this.#timer = undefined;
    try {
      const cur = await this.#o.http.json<LeaseObject>('GET', this.#path);
      if (cur.spec?.holderIdentity !== this.#o.identity) return;
      await this.#o.http.json('DELETE', this.#path, {}, { preconditions: { uid: cur.metadata.uid, resourceVersion: cur.metadata.resourceVersion } });
    } catch {
      // It lapses on its own.
    }
  }

  async #beat(): Promise<void> {
    if (this.#beating) return;
    this.#beating = true;
    const { http, namespace, fieldManager, identity } = this.#o;
    const now = microTime(this.#o.now());
    const spec = { holderIdentity: identity, leaseDurationSeconds: HEARTBEAT_SECONDS, renewTime: now };
    try {
      let cur: LeaseObject | undefined;
      try {
        cur = await http.json<LeaseObject>('GET', this.#path);
      } catch (e) {
        if (codeOf(e) !== 404) throw e;
      }
      if (cur) await http.json('PUT', this.#path, { fieldManager }, { ...cur, spec: { ...cur.spec, ...spec } });
      else await http.json('POST', `/apis/coordination.k8s.io/v1/namespaces/${encodeURIComponent(namespace)}/leases`, { fieldManager }, { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: GRANTER_LEASE, namespace }, spec: { ...spec, acquireTime: now } });
    } catch (e) {
      this.#o.log.debug({ err: (e instanceof Error ? e.message : String(e)).slice(0, 300) }, "the granter's heartbeat was not renewed; the next beat tries again");
    } finally {
      this.#beating = false;
    }
  }
}
