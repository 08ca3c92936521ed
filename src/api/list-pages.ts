// A whole collection read page by page (`limit` and `continue`), as
// client-go's pager (k8s.io/client-go/tools/pager) reads it for a
// reflector: no single answer holds every object, and the caller keeps of
// each item only what it needs, so a list of 5000 Nodes never sits in
// memory whole. Every page of one list is read at the first page's
// resourceVersion (the API server keeps it consistent), so the result is a
// snapshot a watch can start from.
//
// Metadata only: the Accept headers of client-go's metadata client (less
// protobuf), with plain JSON as the last clause. The API server answers
// PartialObjectMetadataList / PartialObjectMetadata (metadata.* of each
// object, nothing of spec or status); a server that cannot transform (an
// aggregated API server, one older than Kubernetes 1.15) skips the first
// clause and answers whole objects, which callers reduce the same way.
import { KubeApiError, type KubeHttp } from './kube-http.ts';

/** Items per request: client-go's pager and kubectl's --chunk-size default. */
export const DEFAULT_PAGE_SIZE = 500;

export const METADATA_LIST_ACCEPT = 'application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json';
/** For watches and single objects: the list form on a watch is refused per event by the server (whole objects). */
export const METADATA_WATCH_ACCEPT = 'application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json';
export const METADATA_LIST_KIND = 'PartialObjectMetadataList';

interface ListPage<T> {
  kind?: string;
  metadata?: { resourceVersion?: string; continue?: string; remainingItemCount?: number };
  items?: T[];
}

export interface ListAllOptions {
  http: KubeHttp;
  /** Collection path, e.g. /api/v1/nodes. */
  path: string;
  labelSelector?: string;
  fieldSelector?: string;
  /** Items per request; 0 reads the list in one request. */
  pageSize?: number;
  /** Accept header, e.g. METADATA_LIST_ACCEPT. */
  accept?: string;
  /** Per request. */
  timeoutMs?: number;
  /** Called after each page has been read and reduced. */
  onPage?: (pageNumber: number) => void | Promise<void>;
}

export interface ListAllResult<U> {
  items: U[];
  /** The list's resourceVersion: where a watch continues from. */
  resourceVersion: string;
  /** The kind of list the server sent (PartialObjectMetadataList when metadata only was granted). */
  kind: string;
  /** Requests made, the failed one of a restart included. */
  requests: number;
}

/**
 * Every item of a collection, each reduced by `keep` as its page arrives.
 * A continue token can expire (410) when the list takes longer than the API
 * server keeps its history (etcd compacts every 5 minutes): the list then
 * starts over once, from the first page, so the result is still one
 * consistent snapshot; a second expiry is an error for the caller to retry
 * with its backoff. (client-go's pager falls back to one unpaginated list
 * instead: at thousands of objects that is the answer this avoids.)
 */
export async function listAll<T, U>(opts: ListAllOptions, keep: (item: T) => U): Promise<ListAllResult<U>> {
  const limit = opts.pageSize ?? DEFAULT_PAGE_SIZE;
  let requests = 0;
  for (let attempt = 1; ; attempt++) {
    const items: U[] = [];
    let token = '';
    let resourceVersion = '';
    let kind = '';
    let pageNumber = 0;
    try {
      do {
        requests++;
        const page: ListPage<T> = await opts.http.json<ListPage<T>>(
          'GET',
          opts.path,
          { labelSelector: opts.labelSelector, fieldSelector: opts.fieldSelector, limit: limit > 0 ? limit : undefined, continue: token || undefined },
          undefined,
          { accept: opts.accept, timeoutMs: opts.timeoutMs },
        );
        pageNumber++;
        if (pageNumber === 1) {
          resourceVersion = page.metadata?.resourceVersion ?? '';
          kind = page.kind ?? '';
        }
        for (const item of Array.isArray(page.items) ? page.items : []) items.push(keep(item));
        token = page.metadata?.continue ?? '';
        await opts.onPage?.(pageNumber);
      } while (token !== '');
      return { items, resourceVersion, kind, requests };
    } catch (err) {
      const expired = err instanceof KubeApiError && err.code === 410 && token !== '';
      if (!expired) throw err;
      if (attempt >= 2) {
        throw new KubeApiError(410, `listing ${opts.path}: the list's continue token expired twice before its last page (${err.message}); will list again`, err.reason);
      }
    }
  }
}
