// LeaseApi (./lease-slots.ts) on @kubernetes/client-node's CoordinationV1Api,
// with the KubeConfig's credentials, and its watch of one Lease on the
// list+watch cache (src/api/list-watch.ts: client-node's Watch cuts quiet
// watches, see src/api/kube-http.ts). Loaded only where an API is configured.
import { CoordinationV1Api, type KubeConfig, type V1Lease } from '@kubernetes/client-node';
import { KubeHttp } from '../api/kube-http.ts';
import { ListWatchCache } from '../api/list-watch.ts';
import { silentLogger, type Logger } from '../util/log.ts';
import { LeaseApiError, type LeaseApi, type LeaseObject } from './lease-slots.ts';

function apiError(e: unknown): unknown {
  const code = (e as { code?: unknown } | null)?.code;
  if (typeof code !== 'number') return e;
  const body = (e as { body?: unknown }).body;
  let message = '';
  try {
    const parsed = typeof body === 'string' ? JSON.parse(body) : body;
    if (parsed && typeof parsed.message === 'string') message = parsed.message;
  } catch {
    // not a Status object
  }
  return new LeaseApiError(code, `HTTP ${code}${message ? `: ${message}` : ''}`);
}

async function call<T>(f: () => Promise<T>): Promise<T> {
  try {
    return await f();
  } catch (e) {
    throw apiError(e);
  }
}

// client-node hands MicroTime fields through as the JSON strings they are
// (V1MicroTime is not in its type map), so the shapes match LeaseObject.
const asObject = (l: V1Lease): LeaseObject => l as unknown as LeaseObject;
const asLease = (l: LeaseObject): V1Lease => l as unknown as V1Lease;

export interface LeaseApiOptions {
  /** The watches' failures are logged here (default: nowhere). */
  logger?: Logger;
  /** timeoutSeconds of each watch is drawn from [min, 2 * min) (src/api/list-watch.ts). */
  minWatchTimeoutMs?: number;
  /** User-Agent of the watches. */
  userAgent?: string;
}

export function clientNodeLeaseApi(kc: KubeConfig, opts: LeaseApiOptions = {}): LeaseApi {
  const api = kc.makeApiClient(CoordinationV1Api);
  let http: KubeHttp | undefined;
  const log = opts.logger ?? silentLogger();
  return {
    list: (namespace, labelSelector) =>
      call(async () => (await api.listNamespacedLease({ namespace, labelSelector, resourceVersion: '0' })).items.map(asObject)),
    get: async (namespace, name) => {
      try {
        return asObject(await api.readNamespacedLease({ namespace, name }));
      } catch (e) {
        const err = apiError(e);
        if (err instanceof LeaseApiError && err.code === 404) return null;
        throw err;
      }
    },
    create: (namespace, lease, fieldManager) => call(async () => asObject(await api.createNamespacedLease({ namespace, body: asLease(lease), fieldManager }))),
    replace: (namespace, lease, fieldManager) =>
      call(async () => asObject(await api.replaceNamespacedLease({ namespace, name: lease.metadata.name, body: asLease(lease), fieldManager }))),
    delete: (namespace, name, preconditions) =>
      call(async () => {
        await api.deleteNamespacedLease({ namespace, name, body: { preconditions } });
      }),
    watch: (namespace, name, handlers, seed) => {
      http ??= new KubeHttp(kc, { userAgent: opts.userAgent ?? 'pinset-agent' });
      const cache = new ListWatchCache<LeaseObject>({
        http,
        path: `/apis/coordination.k8s.io/v1/namespaces/${encodeURIComponent(namespace)}/leases`,
        what: `lease ${name}`,
        log,
        fieldSelector: `metadata.name=${name}`,
        ...(opts.minWatchTimeoutMs ? { minWatchTimeoutMs: opts.minWatchTimeoutMs } : {}),
      });
      const current = () => cache.get(name, namespace) ?? null;
      cache
        .on('add', (l) => handlers.object(l))
        .on('update', (l) => handlers.object(l))
        .on('delete', () => handlers.object(null))
        // After a list: whatever is there (a Lease gone while the watch was down is reported by the list as a delete).
        .on('synced', () => {
          if (!current()) handlers.object(null);
        })
        .on('failure', (err) => handlers.failed(err as Error & { code?: number }));
      if (seed?.metadata.resourceVersion) cache.seed([seed], seed.metadata.resourceVersion);
      cache.start();
      return { stop: () => cache.stop() };
    },
  };
}
