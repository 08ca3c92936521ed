// The objects of the manifests as the cluster holds them: each one's path
// found through discovery (the resource a kind is served as, and whether
// it is namespaced, from the API server itself), read and deleted by that
// path. For `pinset uninstall`, which deletes only what carries pinset's
// label (inspect()), and exactly the object it inspected (remove() with the
// uid as a precondition: an object deleted and made again by someone else
// meanwhile is not theirs to lose).
import { KubeApiError, type KubeHttp } from '../api/kube-http.ts';
import { METADATA_WATCH_ACCEPT } from '../api/list-pages.ts';
import { apiError } from './api-error.ts';
import { describeObject, isPinsets, PINSET_LABEL, PINSET_LABEL_VALUE, type ManifestObject } from './manifests.ts';

/** What the cluster holds of one object. */
export type ObjectState = 'present' | 'terminating' | 'absent' | 'not served';

/** One object as the cluster holds it: its state, and whether it carries pinset's label (and its uid) when it is there. */
export interface Inspected {
  state: ObjectState;
  pinsets: boolean;
  uid?: string;
}

/** The order objects are removed in: the agents and the controller first (nothing writes meanwhile), the CRD and the namespace last. */
const REMOVAL_ORDER = [
  'DaemonSet',
  'Deployment',
  'ValidatingAdmissionPolicyBinding',
  'ValidatingAdmissionPolicy',
  'RoleBinding',
  'ClusterRoleBinding',
  'Role',
  'ClusterRole',
  'ServiceAccount',
  '',
  'CustomResourceDefinition',
  'Namespace',
];

/** The objects in removal order; kinds not named above go after the service accounts, in manifest order. */
export function inRemovalOrder(objects: readonly ManifestObject[]): ManifestObject[] {
  const rank = (o: ManifestObject) => (REMOVAL_ORDER.includes(o.kind) ? REMOVAL_ORDER.indexOf(o.kind) : REMOVAL_ORDER.indexOf(''));
  return objects.map((o, i) => ({ o, i })).sort((a, b) => rank(a.o) - rank(b.o) || a.i - b.i).map((x) => x.o);
}

interface ApiResource {
  name: string;
  kind: string;
  namespaced: boolean;
}

export class ClusterObjects {
  readonly #http: KubeHttp;
  readonly #timeoutMs: number;
  readonly #discovery = new Map<string, Promise<ApiResource[] | null>>();

  constructor(http: KubeHttp, timeoutMs: number) {
    this.#http = http;
    this.#timeoutMs = timeoutMs;
  }

  /** The resources of an API group version; null when the cluster does not serve it. */
  #resources(apiVersion: string): Promise<ApiResource[] | null> {
    let r = this.#discovery.get(apiVersion);
    if (!r) {
      const path = apiVersion.includes('/') ? `/apis/${apiVersion}` : `/api/${apiVersion}`;
      r = this.#http.json<{ resources?: ApiResource[] }>('GET', path, {}, undefined, { timeoutMs: this.#timeoutMs }).then(
        (list) => (list.resources ?? []).filter((x) => !x.name.includes('/')),
        (err: unknown) => {
          if (err instanceof KubeApiError && err.code === 404) return null;
          throw err;
        },
      );
      // A failed discovery is asked again next time.
      r.catch(() => this.#discovery.delete(apiVersion));
      this.#discovery.set(apiVersion, r);
    }
    return r;
  }

  /** The object's path on the API server; null when its kind is not served. */
  async pathOf(o: ManifestObject): Promise<string | null> {
    const res = (await this.#resources(o.apiVersion))?.find((x) => x.kind === o.kind);
    if (!res) return null;
    const base = o.apiVersion.includes('/') ? `/apis/${o.apiVersion}` : `/api/${o.apiVersion}`;
    const ns = res.namespaced ? `/namespaces/${encodeURIComponent(o.namespace ?? 'default')}` : '';
    return `${base}${ns}/${res.name}/${encodeURIComponent(o.name)}`;
  }

  async state(o: ManifestObject): Promise<ObjectState> {
    return (await this.inspect(o)).state;
  }

  /** The object's state, labels and uid, read as metadata only. */
  async inspect(o: ManifestObject): Promise<Inspected> {
    const path = await this.pathOf(o);
    if (!path) return { state: 'not served', pinsets: false };
    try {
      const got = await this.#http.json<{ metadata?: { deletionTimestamp?: string; uid?: string; labels?: Record<string, string> } }>('GET', path, {}, undefined, { timeoutMs: this.#timeoutMs, accept: METADATA_WATCH_ACCEPT });
      return { state: got.metadata?.deletionTimestamp ? 'terminating' : 'present', pinsets: isPinsets(got.metadata?.labels), ...(got.metadata?.uid ? { uid: got.metadata.uid } : {}) };
    } catch (err) {
      if (err instanceof KubeApiError && err.code === 404) return { state: 'absent', pinsets: false };
      throw err;
    }
  }

  /**
   * Deletes the object, its dependents in the background (a DaemonSet's
   * pods); what there was to delete. With `uid`, only that object: one made
   * anew under its name since is refused (409), as a failure.
   */
  async remove(o: ManifestObject, uid?: string): Promise<ObjectState> {
    const path = await this.pathOf(o);
    if (!path) return 'not served';
    try {
      await this.#http.json('DELETE', path, {}, { kind: 'DeleteOptions', apiVersion: 'v1', propagationPolicy: 'Background', ...(uid ? { preconditions: { uid } } : {}) }, { timeoutMs: this.#timeoutMs });
      return 'present';
    } catch (err) {
      if (err instanceof KubeApiError && err.code === 404) return 'absent';
      throw new Error(`${describeObject(o)}: ${apiError(err)}`);
    }
  }

  /**
   * Creates the object from its manifest (its status left out, as the
   * server would drop it), with pinset's label, as the install set it: a
   * manifest read from a kustomization's files lacks what its `labels` add.
   */
  async create(o: ManifestObject): Promise<void> {
    const path = await this.pathOf(o);
    if (!path) throw new Error(`${describeObject(o)}: ${o.apiVersion} ${o.kind} is not served by this cluster`);
    const { status: _status, ...doc } = structuredClone(o.doc) as { status?: unknown; metadata?: { labels?: Record<string, string> } };
    const body = { ...doc, metadata: { ...doc.metadata, labels: { ...doc.metadata?.labels, [PINSET_LABEL]: PINSET_LABEL_VALUE } } };
    await this.#http.json('POST', path.slice(0, path.lastIndexOf('/')), { fieldManager: 'pinset-uninstall' }, body, { timeoutMs: this.#timeoutMs });
  }
}
