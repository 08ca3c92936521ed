// The granter's writes (./granter.ts): a grant (the slot in the waiting
// node's name, created or written over its last version, then the node's
// entry marked with the slot's name) and the drop of an entry whose grant
// lapsed. Every write is conditional; a 409 or 404 means the world moved
// since the granter's cache saw it, and is counted, not retried here.
import type { KubeHttp } from '../api/kube-http.ts';
import { API_VERSION, KIND } from '../api/types.ts';
import type { Logger } from '../util/log.ts';
import type { QueueEntryView } from './grants.ts';
import { microTime, type LeaseObject } from './lease-slots.ts';
import { GRANT_ANNOTATION, POOLS, SLOT_MANAGED_BY, slotName, type SlotPoolName } from './slots.ts';

export interface GrantCounts {
  grants: number;
  lapsed: number;
  conflicts: number;
  errors: number;
}

export interface GrantWriteOptions {
  http: KubeHttp;
  namespace: string;
  fieldManager: string;
  log: Logger;
  acceptMs: number;
  now?: () => number;
}

export interface GrantTarget {
  pool: SlotPoolName;
  /** The set's label value. */
  label: string;
  setName: string;
  uid: string | undefined;
  index: number;
  node: string;
  entry: QueueEntryView;
  /** The slot's Lease when it exists (written over at its version). */
  existing: LeaseObject | undefined;
}

const LEASES = (ns: string) => `/apis/coordination.k8s.io/v1/namespaces/${encodeURIComponent(ns)}/leases`;

function codeOf(e: unknown): number | undefined {
  const c = (e as { code?: unknown } | null)?.code;
  return typeof c === 'number' ? c : undefined;
}

function errText(e: unknown): string {
  return (e instanceof Error ? e.message : String(e)).split('\n')[0]!.slice(0, 300);
}

/** Grant slot `t.index` to `t.node`: the slot as written when the node was told, else undefined. */
export async function writeGrant(o: GrantWriteOptions, t: GrantTarget, counts: GrantCounts): Promise<LeaseObject | undefined> {
  const { http, namespace, fieldManager } = o;
  const { node, setName, existing } = t;
  const name = slotName(setName, t.index, t.pool);
  const now = microTime((o.now ?? Date.now)());
  const seconds = Math.max(1, Math.round(o.acceptMs / 1000));
  const spec = { holderIdentity: node, leaseDurationSeconds: seconds, acquireTime: now, renewTime: now };
  let written: LeaseObject;
  try {
    if (existing) {
      const body: LeaseObject = { ...existing, spec: { ...existing.spec, ...spec, leaseTransitions: (existing.spec?.leaseTransitions ?? 0) + 1 } };
      written = await http.json<LeaseObject>('PUT', `${LEASES(namespace)}/${encodeURIComponent(name)}`, { fieldManager }, body);
    } else {
      const body: LeaseObject = {
        apiVersion: 'coordination.k8s.io/v1',
        kind: 'Lease',
        metadata: {
          name,
          namespace,
          labels: { [POOLS[t.pool].slotLabel]: t.label, ...SLOT_MANAGED_BY },
          ...(t.uid ? { ownerReferences: [{ apiVersion: API_VERSION, kind: KIND, name: setName, uid: t.uid }] } : {}),
        },
        spec: { ...spec, leaseTransitions: 0 },
      };
      written = await http.json<LeaseObject>('POST', LEASES(namespace), { fieldManager }, body);
    }
  } catch (e) {
    // Taken (or gone) since the cache saw it: the event that follows brings the next pass.
    if (codeOf(e) === 409 || codeOf(e) === 404) counts.conflicts++;
    else {
      counts.errors++;
      o.log.warn({ set: setName, slot: name, node, err: errText(e) }, 'could not grant a slot; retrying');
    }
    return undefined;
  }
  try {
    await http.json('PATCH', `${LEASES(namespace)}/${encodeURIComponent(t.entry.name)}`, { fieldManager }, { metadata: { annotations: { [GRANT_ANNOTATION]: name } } }, { contentType: 'application/merge-patch+json' });
    counts.grants++;
    o.log.debug({ set: setName, slot: name, node }, 'granted a slot');
    return written;
  } catch (e) {
    // The node left the queue meanwhile (404): the slot goes back now rather than after the accept window.
    if (codeOf(e) !== 404) {
      counts.errors++;
      o.log.warn({ set: setName, slot: name, node, err: errText(e) }, 'granted a slot but could not tell the node; the grant lapses');
      return written;
    }
    counts.conflicts++;
    await http.json('DELETE', `${LEASES(namespace)}/${encodeURIComponent(name)}`, {}, { preconditions: { uid: written.metadata.uid, resourceVersion: written.metadata.resourceVersion } }).catch(() => {});
    return undefined;
  }
}

/** Drop an entry whose grant lapsed (at the version planned on: a node that changed it since keeps it). */
export async function dropEntry(o: GrantWriteOptions, e: QueueEntryView, counts: GrantCounts): Promise<void> {
  try {
    await o.http.json('DELETE', `${LEASES(o.namespace)}/${encodeURIComponent(e.name)}`, {}, { preconditions: { ...(e.uid ? { uid: e.uid } : {}), ...(e.version ? { resourceVersion: e.version } : {}) } });
    counts.lapsed++;
  } catch (err) {
    if (codeOf(err) === 409 || codeOf(err) === 404) counts.conflicts++;
    else {
      counts.errors++;
      o.log.warn({ entry: e.name, err: errText(err) }, 'could not drop a queue entry whose grant lapsed; retrying');
    }
  }
}
