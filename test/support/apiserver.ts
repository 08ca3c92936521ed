// An in-process Kubernetes API server for integration tests. It speaks the
// real HTTP and watch protocol (JSON over plain HTTP on 127.0.0.1) well enough
// that @kubernetes/client-node (KubeConfig, CoreV1Api, CustomObjectsApi,
// CoordinationV1Api, Watch, makeInformer/ListWatch) works against it unchanged.
// No kube-apiserver can run on the test machines (shared/facts/test-bed.md).
//
// Served resources:
//   core v1 nodes (cluster-scoped; /status), core v1 events (namespaced),
//   core v1 pods (namespaced; /status; list across namespaces at /api/v1/pods),
//   coordination.k8s.io/v1 leases (namespaced),
//   core v1 secrets (namespaced; see "Secrets" below), core v1 configmaps
//   (namespaced; see "ConfigMaps" below),
//   pinset.dev/v1alpha1 pinnedimagesets (cluster-scoped CRD with the status
//   subresource), served while its CustomResourceDefinition stands (below),
//   and, as plain stored objects for what deploy/ installs: core v1
//   namespaces and serviceaccounts, apps/v1 daemonsets and deployments, the
//   rbac.authorization.k8s.io/v1 kinds, admissionregistration.k8s.io/v1
//   validatingadmissionpolicies and their bindings (and the webhook
//   configurations beside them), and apiextensions.k8s.io/v1
//   customresourcedefinitions; core v1 resourcequotas (namespaced; /status;
//   a create's status dropped, as the quota controller writes it; quota
//   admission is not modelled), and, on an OpenShift API (opts.openshift),
//   security.openshift.io/v1 securitycontextconstraints.
// What kind of cluster it is (test/integration/apiserver-cluster-kinds.test.ts):
//   /version says what opts.version gives (gitVersion, and major and minor
//   from it unless given), and a built-in resource in opts.notServed is
//   not served at all, as on a server that predates it: absent from
//   discovery (its group too when nothing else is left in it) and 404
//   "the server could not find the requested resource" on every verb.
//
// CustomResourceDefinitions (apiextensions-apiserver; test/integration/
// apiserver-crd.test.ts): the server starts with deploy/crds/'s CRD
// installed and Established (ApiServer.start({crd: false}): without it).
// The custom resource type is served while its CRD stands: without it,
// every request on the type (list, watch, get, create) and its discovery
// is 404 "the server could not find the requested resource"
// (customresource_handler.go hands the request to the NotFound handler).
// A CRD created over HTTP loses its status, then is Established (the
// establishing controller). DELETE of a CRD (registry/customresourcedefinition/
// etcd.go Delete) does not delete it: the first one sets deletionTimestamp,
// adds the finalizer customresourcecleanup.apiextensions.k8s.io and the
// condition Terminating=True (InstanceDeletionPending) in one update and
// answers 200 with the object. Then the CRD finalizer
// (controller/finalizer/crd_finalizer.go) sets Terminating=True
// (InstanceDeletionInProgress), deletes every custom resource (each
// watcher gets a DELETED event; one with finalizers is only marked),
// checks at once and then every `crdCleanupPollMs` (5 s, its poll) that
// none is left, sets Terminating=False (InstanceDeletionCompleted) and
// removes its finalizer, which deletes the CRD. While the CRD is
// terminating, creating a custom resource is 403 Forbidden "create not
// allowed while custom resource definition is terminating"; lists, gets,
// watches and deletes still work. Once the CRD is gone, the type's open
// watches end cleanly `crdTeardownMs` (1 s: crdHandler.tearDown's sleep)
// later, even if a CRD of that name was created meanwhile. A CRD created
// again serves the type again, from a watch cache of its own: a watch from
// a resourceVersion older than its creation is 410 Expired.
// Verbs: list (labelSelector, fieldSelector), watch (?watch=true), get, create
// (POST, generateName), update (PUT, optimistic concurrency), patch
// (merge-patch, json-patch, strategic-merge-patch as merge patch on built-in
// types), delete (DeleteOptions preconditions; finalizers delay deletion).
// Discovery: /version, /healthz, /readyz, /livez, /api, /apis, /api/v1, /apis/GROUP/VERSION.
//
// Behaviour that follows the real server (k8s.io/apiserver generic registry,
// watch cache, apiextensions-apiserver customresource strategy):
// - One global resourceVersion counter; a write that changes nothing is not a
//   write (no new resourceVersion, no watch event), as with etcd.
// - Errors are metav1.Status objects (kind Status, status Failure, reason, code).
// - Lists report metadata.resourceVersion; built-in list items carry no
//   kind/apiVersion, custom resource items do.
// - Pagination (etcd3 store, storage/continue.go): `limit` returns at most
//   that many items in key order and, when keys remain, metadata.continue
//   (base64url of {"v":"meta.k8s.io/v1","rv":N,"start":"<last key>\u0000"})
//   and, without selectors, remainingItemCount. Every page of a list is read
//   at the first page's resourceVersion and reports it. A continue token
//   whose resourceVersion has been compacted (compact(), or more than
//   historyLimit writes since) is 410 Expired, offering a token that
//   continues at the latest resourceVersion; a malformed one is 400;
//   continue with a resourceVersion other than "0" is 400. resourceVersion=0
//   is served as from the watch cache: limit ignored, one page.
// - Content negotiation (handlers/negotiation, response.go): the Accept
//   header's clauses by q; `as=PartialObjectMetadata` / `as=PartialObjectMetadataList`
//   with `g=meta.k8s.io;v=v1` (or v1beta1) answer metadata only:
//   {kind: PartialObjectMetadataList, apiVersion: meta.k8s.io/v1, metadata
//   (resourceVersion, continue, remainingItemCount), items: [{kind:
//   PartialObjectMetadata, apiVersion, metadata}]}, each item's whole
//   metadata (managedFields too); watch events carry PartialObjectMetadata
//   objects, bookmarks too, ERROR events their Status. A clause the server
//   cannot serve (an unknown `as=`, `as=` without g/v) is skipped and the
//   next one tried (so `...;as=PartialObjectMetadataList;...,application/json`
//   falls back to whole objects); none left is 406 NotAcceptable. The single
//   form asked for on a list is 406 after the list is read; the list form
//   on a watch sends whole objects (the encoder logs and sends the
//   original); the list form on a single object is 406 (after a write has
//   happened, as on the real server). Responses are application/json.
// - Watch: resourceVersion absent or "0" starts with synthetic ADDED events
//   for current objects; a resourceVersion older than the kept history gets a
//   200 stream with one ERROR event (Status 410 Expired) and the stream ends.
//   An object that stops matching the watch's selectors is sent as DELETED,
//   one that starts matching as ADDED. As the watch cache does (cacher.go
//   indexedWatchers, startDispatching), a watch scoped to one object (its
//   namespace and fieldSelector metadata.name=X) is looked up by that object
//   only: an event of another object never reaches it, at no cost per
//   watcher. The server ends every watch cleanly
//   at timeoutSeconds (without it, after minRequestTimeout * (1 + rand), 30
//   to 60 minutes). allowWatchBookmarks=true: BOOKMARK events as the watch
//   cache sends them, every `bookmarkIntervalMs` (1 minute) and once 2 s
//   before timeoutSeconds, but only once the resource's watch cache has
//   processed an event since the server (re)started: a quiet watch on an
//   untouched resource gets none (see #scheduleBookmark).
// - managedFields: every write records its field manager (?fieldManager=,
//   else the User-Agent's product) as the owner of the fields it changed
//   (operation Update; lists owned whole).
// - Types with a status subresource: writes to the main resource keep the old
//   .status, writes to /status change only .status. pinnedimagesets: status is
//   dropped on create, metadata.generation starts at 1 and increments when
//   anything outside metadata and status changes, PUT needs
//   metadata.resourceVersion (422 without), strategic merge patch is 415.
// - A stale metadata.resourceVersion on PUT, or in a patch body, is 409 Conflict.
// - Field selectors: metadata.name (and metadata.namespace on namespaced types),
//   nodes' spec.unschedulable, events' involvedObject.*, reason, type, source,
//   reportingComponent, pods' spec.nodeName, spec.restartPolicy, spec.schedulerName,
//   spec.serviceAccountName, spec.hostNetwork, status.phase, status.podIP,
//   status.nominatedNodeName; any other field label is 400, as on the real server.
// - Pods created over HTTP start with status {phase: Pending} (the kubelet
//   writes the rest through /status), as pkg/registry/core/pod/strategy.go does.
// - Secrets (pkg/apis/core/v1 conversion and defaults, pkg/registry/core/secret,
//   ValidateSecret, ValidateSecretUpdate): `data` values are base64 (anything
//   else is 400, as the JSON decoder refuses it); `stringData` is written into
//   `data` (base64) and never stored; `type` defaults to Opaque; a data key
//   must be a config-map key ([-._a-zA-Z0-9]+); kubernetes.io/dockerconfigjson
//   needs data[.dockerconfigjson] and kubernetes.io/dockercfg data[.dockercfg],
//   each a JSON object (else 422 with the content redacted); `type` cannot
//   change on update (422, field is immutable). Field selector `type`.
// - ConfigMaps (pkg/apis/core/v1, ValidateConfigMap): `data` values are
//   strings and `binaryData` values base64 (anything else is 400, as the JSON
//   decoder refuses it); each key is a config key, and no key is in both
//   (422).
// - Lease spec.acquireTime/renewTime and Event eventTime (metav1.MicroTime) are
//   stored in the server's microsecond format, 2006-01-02T15:04:05.000000Z.
// Seen from client-node 2.0.1: ListWatch/makeInformer never ask for bookmarks,
// makeInformer takes no field selector (use `new ListWatch(path, new Watch(kc),
// listFn, false, labelSelector, fieldSelector)`), and an informer whose watch
// fails with a transport error emits 'error' and stops until start() is called.
// Not modelled: namespaces (any namespace exists), admission, RBAC,
// server-side apply (415), dryRun, OpenAPI schema validation (see `validators`),
// YAML, protobuf and CBOR encodings and Tables (a request the real server
// would answer in one of those is 406 here, never answered in another form),
// resourceVersionMatch.
//
// Scale: written to hold 5000 Nodes of realistic size (bench/scale.ts);
// lists are paged from the store without copying, the history keeps
// historyLimit events (two copies of the object each).
//
// Test controls (methods on the server object, used by tests directly):
//   ApiServer.start(opts?)       listen on 127.0.0.1:0. opts: crd (default true: the
//                                PinnedImageSet CRD installed), crdCleanupPollMs, crdTeardownMs,
//                                bookmarkIntervalMs
//                                (default 60000, the real server's pace), minRequestTimeoutMs
//                                (default 1800000, kube-apiserver's --min-request-timeout), historyLimit
//                                (watch events kept, default 1000), token (when set,
//                                a request without `Authorization: Bearer <token>` gets
//                                401, and the kubeconfig carries it), validators
//                                (per resource, (obj) => ["field: message"] -> 422),
//                                partialObjectMetadata (default true; false: a server that
//                                transforms nothing, so as= clauses are skipped), version
//                                ({gitVersion, major?, minor?} for /version), notServed
//                                (built-in resources it does not serve), openshift (serve
//                                security.openshift.io).
//   url                          http://127.0.0.1:PORT
//   kubeConfig()                 a KubeConfig for this server
//   writeKubeconfig(dir)         writes DIR/kubeconfig (mode 0600) for another process
//                                (--kubeconfig / KUBECONFIG); resolves to its path
//   create(obj) get(res, name, ns?) list(res, {namespace, labelSelector, fieldSelector}?)
//   update(obj) patch(res, name, mergePatch, ns?) remove(res, name, ns?)
//                                act on the store like a privileged client: watch events
//                                are sent, resourceVersions advance, .status may be set
//                                anywhere, remove() ignores finalizers. Errors throw
//                                KubeStatusError. Results are copies.
//   resourceVersion              the current global resourceVersion
//   compact()                    forget the watch history (etcd compaction): a watch or a
//                                continue token from any older resourceVersion now gets
//                                410 Expired
//   restart()                    what clients see of an API server restart: watches end
//                                cleanly, watches from older resourceVersions get 410, and
//                                no bookmark is sent until the next event (or
//                                progressNotify()); list continue tokens still work (etcd
//                                serves them)
//   progressNotify()             an etcd progress notification: every resource's watch
//                                cache has now processed an event, so bookmarks flow
//   dropWatches({graceful?})     end every open watch: abruptly (socket destroyed,
//                                the client sees an error) or, graceful, with a clean
//                                end of stream (like the server's own watch timeout)
//   openWatches()                the open watches: resource, namespace, query
//   setAvailable(false|true)     while false every connection is destroyed on arrival
//                                and open ones are cut; the port is kept
//   connections                  TCP connections made, refused ones included
//   watchEvents                  watch events written, by resource and type (BOOKMARK and
//                                ERROR included): what the watches cost the server to send
//   requests                     log of {method, path, query, contentType, body, status, userAgent, accept, at};
//                                body is parsed JSON when the request sent JSON
//   waitFor(predicate, timeoutMs?, what?)  poll every 10 ms until predicate returns a
//                                truthy value (returned); a throw counts as "not yet"
//   stop()                       end watches, close every connection, close the listener
import { randomInt, randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import path from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import { dumpYaml, KubeConfig } from '@kubernetes/client-node';
import { parse as parseYaml } from 'yaml';
import { GROUP, KIND, PLURAL, VERSION } from '../../src/api/types.ts';
import { MAX_OBJECT_NAME_LENGTH, NAME_PATTERN } from '../../src/api/validate.ts';

export type ResourceName =
  | 'nodes'
  | 'events'
  | 'leases'
  | 'pods'
  | 'secrets'
  | 'configmaps'
  | 'pinnedimagesets'
  | 'customresourcedefinitions'
  | 'namespaces'
  | 'serviceaccounts'
  | 'daemonsets'
  | 'deployments'
  | 'roles'
  | 'rolebindings'
  | 'clusterroles'
  | 'clusterrolebindings'
  | 'validatingadmissionpolicies'
  | 'validatingadmissionpolicybindings'
  | 'validatingwebhookconfigurations'
  | 'mutatingwebhookconfigurations'
  | 'resourcequotas'
  | 'securitycontextconstraints';

/** The finalizer the API server puts on a CRD being deleted (apiextensions v1 CustomResourceCleanupFinalizer). */
export const CRD_CLEANUP_FINALIZER = 'customresourcecleanup.apiextensions.k8s.io';

export interface ObjectMeta {
  name?: string;
  generateName?: string;
  namespace?: string;
  uid?: string;
  resourceVersion?: string;
  generation?: number;
  creationTimestamp?: string;
  deletionTimestamp?: string;
  deletionGracePeriodSeconds?: number;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  finalizers?: string[];
  [key: string]: unknown;
}

export interface KubeObject {
  apiVersion?: string;
  kind?: string;
  metadata: ObjectMeta;
  [key: string]: unknown;
}

export interface StatusCause {
  reason: string;
  message: string;
  field: string;
}

/** metav1.Status */
export interface KubeStatus {
  kind: 'Status';
  apiVersion: 'v1';
  /** Empty, except the continue token a 410 for an expired continue offers (storage/etcd3 handleCompactedErrorForPaging). */
  metadata: { continue?: string };
  status: 'Failure' | 'Success';
  message?: string;
  reason?: string;
  details?: { name?: string; group?: string; kind?: string; uid?: string; causes?: StatusCause[] };
  code: number;
}

/** A failed request, as the server answers it; thrown by the test controls too. */
export class KubeStatusError extends Error {
  readonly status: KubeStatus;
  constructor(status: KubeStatus) {
    super(`${status.code} ${status.reason}: ${status.message}`);
    this.status = status;
  }
  get code(): number {
    return this.status.code;
  }
  get reason(): string | undefined {
    return this.status.reason;
  }
}

export interface RecordedRequest {
  method: string;
  path: string;
  query: Record<string, string>;
  contentType: string;
  body: unknown;
  /** HTTP status sent (200 for a watch, whatever its events say). */
  status: number;
  /** The User-Agent header. */
  userAgent: string;
  /** The Accept header ('' when absent). */
  accept: string;
  /** When the request arrived (ms since the epoch). */
  at: number;
}

export interface ApiServerOptions {
  bookmarkIntervalMs?: number;
  minRequestTimeoutMs?: number;
  historyLimit?: number;
  token?: string;
  validators?: Partial<Record<ResourceName, (obj: KubeObject) => string[]>>;
  /** false: start without the PinnedImageSet CRD (the type is not served until one is created). Default true. */
  crd?: boolean;
  /** How often the CRD finalizer checks that no custom resource is left (crd_finalizer.go: 5 s). */
  crdCleanupPollMs?: number;
  /** How long after a CRD is gone its type's open watches end (crdHandler.tearDown: 1 s). */
  crdTeardownMs?: number;
  /**
   * What /version answers: the server's gitVersion ("v1.30.5-gke.1014001")
   * and, when they differ from what it says, major and minor (EKS and GKE
   * answer minor "30+"). Default: v1.33.0-pinset-test.
   */
  version?: { gitVersion: string; major?: string; minor?: string };
  /**
   * Built-in resources this server does not serve: absent from discovery,
   * 404 on every verb, as on a server that predates them
   * (validatingadmissionpolicies before Kubernetes 1.30 in
   * admissionregistration.k8s.io/v1, where the webhook configurations are).
   */
  notServed?: ResourceName[];
  /** true: an OpenShift cluster's API, security.openshift.io/v1 SecurityContextConstraints among it. */
  openshift?: boolean;
  /**
   * false: a server that transforms no answer (an aggregated API server on
   * the generic DefaultEndpointRestrictions, or one older than Kubernetes
   * 1.15): an Accept clause with as= is skipped like an unknown one.
   */
  partialObjectMetadata?: boolean;
}

export interface OpenWatch {
  resource: ResourceName;
  namespace: string | undefined;
  query: Record<string, string>;
}

type FieldGetter = (obj: KubeObject) => string;

interface ResourceType {
  group: string;
  version: string;
  plural: ResourceName;
  singular: string;
  kind: string;
  namespaced: boolean;
  /** Built-in type: list items lose kind/apiVersion; strategic merge patch accepted. */
  builtin: boolean;
  statusSubresource: boolean;
  /** Create keeps .status (a kubelet registers its Node with status). */
  statusOnCreate: boolean;
  generation: boolean;
  /** PUT without metadata.resourceVersion is refused (custom resources). */
  requireResourceVersion: boolean;
  /** Field selectors beyond metadata.name (and metadata.namespace when namespaced). */
  fields: Record<string, FieldGetter>;
  /** Fields of type metav1.MicroTime, which the server writes back as RFC 3339 with microseconds. */
  microTimes?: string[];
  /** The status a create over HTTP starts with (when statusOnCreate is false). */
  initialStatus?: () => Record<string, unknown>;
  /** Conversion and defaults as the server decodes a request body (may throw 400). */
  decode?: (obj: KubeObject) => void;
  /**
   * Names checked as path segments (no "/" or "%", not "." or ".."), not
   * as DNS subdomains: RBAC's kinds (pkg/apis/rbac/validation
   * ValidateRBACName), whose names read "system:node" or
   * "system:openshift:scc:privileged".
   */
  pathSegmentNames?: boolean;
  /** The type's own validation (ValidateX / ValidateXUpdate), after the metadata's. */
  check?: (obj: KubeObject, old: KubeObject | undefined) => StatusCause[];
}

const at =
  (dotted: string): FieldGetter =>
  (obj) => {
    let v: unknown = obj;
    for (const k of dotted.split('.')) v = v !== null && typeof v === 'object' ? (v as Record<string, unknown>)[k] : undefined;
    return v === undefined || v === null ? '' : String(v);
  };

// Field labels each type accepts, from pkg/registry/core/{node,event}/strategy.go.
const EVENT_FIELDS: Record<string, FieldGetter> = Object.fromEntries([
  ...['kind', 'namespace', 'name', 'uid', 'apiVersion', 'resourceVersion', 'fieldPath'].map((f) => [`involvedObject.${f}`, at(`involvedObject.${f}`)]),
  ['reason', at('reason')],
  ['reportingComponent', at('reportingComponent')],
  ['source', at('source.component')],
  ['type', at('type')],
]);

// pkg/registry/core/pod/strategy.go PodToSelectableFields.
const POD_FIELDS: Record<string, FieldGetter> = Object.fromEntries(
  ['spec.nodeName', 'spec.restartPolicy', 'spec.schedulerName', 'spec.serviceAccountName', 'status.phase', 'status.podIP', 'status.nominatedNodeName'].map((f) => [f, at(f)]),
);
POD_FIELDS['spec.hostNetwork'] = (o) => String(at('spec.hostNetwork')(o) === 'true');

// Secrets: pkg/apis/core/v1 (stringData into data, type Opaque by default),
// pkg/apis/core/validation ValidateSecret and ValidateSecretUpdate.
const SECRET_DOCKER_KEYS: Record<string, string> = { 'kubernetes.io/dockerconfigjson': '.dockerconfigjson', 'kubernetes.io/dockercfg': '.dockercfg' };

function decodeSecret(obj: KubeObject): void {
  const data = obj.data;
  if (data !== undefined && data !== null) {
    if (!isMap(data)) throw badRequest('Secret in version "v1" cannot be handled as a Secret: data must be an object');
    for (const [k, v] of Object.entries(data)) {
      if (typeof v !== 'string' || !/^[A-Za-z0-9+/]*={0,2}$/.test(v) || v.length % 4 !== 0) {
        throw badRequest(`Secret in version "v1" cannot be handled as a Secret: illegal base64 data in data[${JSON.stringify(k)}]`);
      }
    }
  }
  const stringData = obj.stringData;
  if (isMap(stringData)) {
    const merged = isMap(data) ? { ...data } : {};
    for (const [k, v] of Object.entries(stringData)) merged[k] = Buffer.from(String(v), 'utf8').toString('base64');
    obj.data = merged;
  }
  delete obj.stringData;
  if (!obj.type) obj.type = 'Opaque';
}

function checkSecret(obj: KubeObject, old: KubeObject | undefined): StatusCause[] {
  const causes: StatusCause[] = [];
  const data = (isMap(obj.data) ? obj.data : {}) as Record<string, string>;
  for (const k of Object.keys(data)) {
    if (!/^[-._a-zA-Z0-9]+$/.test(k) || k.length > 253) causes.push({ reason: 'FieldValueInvalid', field: `data[${k}]`, message: `Invalid value: ${JSON.stringify(k)}: a valid config key must consist of alphanumeric characters, '-', '_' or '.'` });
  }
  if (old && old.type !== obj.type) causes.push({ reason: 'FieldValueInvalid', field: 'type', message: `Invalid value: ${JSON.stringify(obj.type)}: field is immutable` });
  const key = SECRET_DOCKER_KEYS[String(obj.type)];
  if (key) {
    const raw = data[key];
    if (raw === undefined) causes.push({ reason: 'FieldValueRequired', field: `data[${key}]`, message: 'Required value' });
    else {
      let ok = false;
      try {
        const v: unknown = JSON.parse(Buffer.from(raw, 'base64').toString('utf8'));
        ok = isMap(v);
      } catch {
        ok = false;
      }
      if (!ok) causes.push({ reason: 'FieldValueInvalid', field: `data[${key}]`, message: 'Invalid value: "<secret contents redacted>": not a JSON object' });
    }
  }
  return causes;
}

// ConfigMaps: pkg/apis/core/v1 (data is map[string]string, binaryData
// map[string][]byte as base64: anything else fails to decode, 400),
// pkg/apis/core/validation ValidateConfigMap (each key a config key, and no
// key in both data and binaryData: 422).
function decodeConfigMap(obj: KubeObject): void {
  for (const field of ['data', 'binaryData'] as const) {
    const m = obj[field];
    if (m === undefined || m === null) continue;
    if (!isMap(m)) throw badRequest(`ConfigMap in version "v1" cannot be handled as a ConfigMap: ${field} must be an object`);
    for (const [k, v] of Object.entries(m)) {
      const ok = typeof v === 'string' && (field === 'data' || (/^[A-Za-z0-9+/]*={0,2}$/.test(v) && v.length % 4 === 0));
      if (!ok) throw badRequest(`ConfigMap in version "v1" cannot be handled as a ConfigMap: ${field === 'data' ? `json: cannot unmarshal ${typeof v} into Go struct field ConfigMap.data of type string` : `illegal base64 data in binaryData[${JSON.stringify(k)}]`}`);
    }
  }
}

function checkConfigMap(obj: KubeObject): StatusCause[] {
  const causes: StatusCause[] = [];
  const data = isMap(obj.data) ? obj.data : {};
  const binary = isMap(obj.binaryData) ? obj.binaryData : {};
  for (const [field, m] of [['data', data], ['binaryData', binary]] as const) {
    for (const k of Object.keys(m)) {
      if (!/^[-._a-zA-Z0-9]+$/.test(k) || k.length > 253) causes.push({ reason: 'FieldValueInvalid', field: `${field}[${k}]`, message: `Invalid value: ${JSON.stringify(k)}: a valid config key must consist of alphanumeric characters, '-', '_' or '.'` });
    }
  }
  for (const k of Object.keys(binary)) if (k in data) causes.push({ reason: 'FieldValueInvalid', field: `data[${k}]`, message: `Invalid value: ${JSON.stringify(k)}: duplicate of key present in binaryData` });
  return causes;
}

const TYPES: readonly ResourceType[] = [
  {
    group: '', version: 'v1', plural: 'nodes', singular: 'node', kind: 'Node', namespaced: false, builtin: true,
    statusSubresource: true, statusOnCreate: true, generation: false, requireResourceVersion: false,
    fields: { 'spec.unschedulable': (o) => String(at('spec.unschedulable')(o) === 'true') },
  },
  {
    group: '', version: 'v1', plural: 'events', singular: 'event', kind: 'Event', namespaced: true, builtin: true,
    statusSubresource: false, statusOnCreate: true, generation: false, requireResourceVersion: false, fields: EVENT_FIELDS,
    microTimes: ['eventTime'],
  },
  {
    group: '', version: 'v1', plural: 'pods', singular: 'pod', kind: 'Pod', namespaced: true, builtin: true,
    statusSubresource: true, statusOnCreate: false, generation: false, requireResourceVersion: false, fields: POD_FIELDS,
    initialStatus: () => ({ phase: 'Pending' }),
  },
  {
    group: 'coordination.k8s.io', version: 'v1', plural: 'leases', singular: 'lease', kind: 'Lease', namespaced: true, builtin: true,
    statusSubresource: false, statusOnCreate: true, generation: false, requireResourceVersion: false, fields: {},
    microTimes: ['spec.acquireTime', 'spec.renewTime'],
  },
  {
    // pkg/registry/core/resourcequota/strategy.go: a create's status is dropped (the quota controller writes it).
    group: '', version: 'v1', plural: 'resourcequotas', singular: 'resourcequota', kind: 'ResourceQuota', namespaced: true, builtin: true,
    statusSubresource: true, statusOnCreate: false, generation: false, requireResourceVersion: false, fields: {},
    initialStatus: () => ({}),
  },
  {
    group: '', version: 'v1', plural: 'secrets', singular: 'secret', kind: 'Secret', namespaced: true, builtin: true,
    statusSubresource: false, statusOnCreate: true, generation: false, requireResourceVersion: false,
    fields: { type: at('type') }, decode: decodeSecret, check: checkSecret,
  },
  {
    group: '', version: 'v1', plural: 'configmaps', singular: 'configmap', kind: 'ConfigMap', namespaced: true, builtin: true,
    statusSubresource: false, statusOnCreate: true, generation: false, requireResourceVersion: false,
    fields: {}, decode: decodeConfigMap, check: checkConfigMap,
  },
  {
    group: GROUP, version: VERSION, plural: PLURAL as ResourceName, singular: KIND.toLowerCase(), kind: KIND, namespaced: false, builtin: false,
    statusSubresource: true, statusOnCreate: false, generation: true, requireResourceVersion: true, fields: {},
  },
  {
    group: 'apiextensions.k8s.io', version: 'v1', plural: 'customresourcedefinitions', singular: 'customresourcedefinition', kind: 'CustomResourceDefinition',
    namespaced: false, builtin: true, statusSubresource: true, statusOnCreate: false, generation: true, requireResourceVersion: false, fields: {},
  },
  ...(
    [
      ['', 'v1', 'namespaces', 'Namespace', false],
      ['', 'v1', 'serviceaccounts', 'ServiceAccount', true],
      ['apps', 'v1', 'daemonsets', 'DaemonSet', true],
      ['apps', 'v1', 'deployments', 'Deployment', true],
      ['rbac.authorization.k8s.io', 'v1', 'roles', 'Role', true],
      ['rbac.authorization.k8s.io', 'v1', 'rolebindings', 'RoleBinding', true],
      ['rbac.authorization.k8s.io', 'v1', 'clusterroles', 'ClusterRole', false],
      ['rbac.authorization.k8s.io', 'v1', 'clusterrolebindings', 'ClusterRoleBinding', false],
      ['admissionregistration.k8s.io', 'v1', 'validatingadmissionpolicies', 'ValidatingAdmissionPolicy', false],
      ['admissionregistration.k8s.io', 'v1', 'validatingadmissionpolicybindings', 'ValidatingAdmissionPolicyBinding', false],
      ['admissionregistration.k8s.io', 'v1', 'validatingwebhookconfigurations', 'ValidatingWebhookConfiguration', false],
      ['admissionregistration.k8s.io', 'v1', 'mutatingwebhookconfigurations', 'MutatingWebhookConfiguration', false],
      // Served by OpenShift only (ApiServerOptions.openshift).
      ['security.openshift.io', 'v1', 'securitycontextconstraints', 'SecurityContextConstraints', false],
    ] as const
  ).map(
    ([group, version, plural, kind, namespaced]): ResourceType => ({
      group, version, plural, singular: kind.toLowerCase(), kind, namespaced, builtin: true,
      statusSubresource: false, statusOnCreate: true, generation: false, requireResourceVersion: false, fields: {},
      pathSegmentNames: group === 'rbac.authorization.k8s.io',
    }),
  ),
];

const apiVersionOf = (rt: ResourceType): string => (rt.group ? `${rt.group}/${rt.version}` : rt.version);
const qualified = (rt: ResourceType): string => (rt.group ? `${rt.plural}.${rt.group}` : rt.plural);
const typeByName = (name: string): ResourceType => {
  const rt = TYPES.find((t) => t.plural === name);
  if (!rt) throw new Error(`the test API server does not serve ${JSON.stringify(name)}`);
  return rt;
};

// ---------------------------------------------------------------------------
// Status objects

function failure(code: number, reason: string, message: string, details?: KubeStatus['details']): KubeStatusError {
  const status: KubeStatus = { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, code };
  if (details) status.details = details;
  return new KubeStatusError(status);
}

/** What the real server answers for a path it serves nothing at (a custom resource whose CRD is gone). */
const noSuchResource = () => failure(404, 'NotFound', 'the server could not find the requested resource', {});
const detailsOf = (rt: ResourceType, name: string) => (rt.group ? { name, group: rt.group, kind: rt.plural } : { name, kind: rt.plural });
const badRequest = (message: string) => failure(400, 'BadRequest', message);
const notFound = (rt: ResourceType, name: string) => failure(404, 'NotFound', `${qualified(rt)} "${name}" not found`, detailsOf(rt, name));
const alreadyExists = (rt: ResourceType, name: string) =>
  failure(409, 'AlreadyExists', `${qualified(rt)} "${name}" already exists`, detailsOf(rt, name));
const conflict = (rt: ResourceType, name: string, why: string) =>
  failure(409, 'Conflict', `Operation cannot be fulfilled on ${qualified(rt)} "${name}": ${why}`, detailsOf(rt, name));
const STALE = 'the object has been modified; please apply your changes to the latest version and try again';

function invalid(rt: ResourceType, name: string, causes: StatusCause[]): KubeStatusError {
  const parts = causes.map((c) => `${c.field}: ${c.message}`);
  const list = parts.length === 1 ? parts[0] : `[${parts.join(', ')}]`;
  const kind = rt.group ? `${rt.kind}.${rt.group}` : rt.kind;
  const details = rt.group ? { name, group: rt.group, kind: rt.kind, causes } : { name, kind: rt.kind, causes };
  return failure(422, 'Invalid', `${kind} "${name}" is invalid: ${list}`, details);
}

const unsupportedPatch = (rt: ResourceType, contentType: string) =>
  failure(
    415,
    'UnsupportedMediaType',
    `the body of the request was in an unknown format (${contentType || 'no Content-Type'}) - accepted media types include: ` +
      `application/json-patch+json, application/merge-patch+json${rt.builtin ? ', application/strategic-merge-patch+json' : ''}`,
  );

// ---------------------------------------------------------------------------
// Content negotiation (k8s.io/apiserver pkg/endpoints/handlers/negotiation
// and response.go): the Accept header picks a media type and, with
// `as=`/`g=`/`v=`, a transformation of the answer.

/** Media types the real server offers for these resources (SupportedMediaTypes), in its order. */
const MEDIA_TYPES = ['application/json', 'application/yaml', 'application/vnd.kubernetes.protobuf'] as const;
/** Custom resources without a transformation: the CRD handler's StandardSerializers. */
const CR_MEDIA_TYPES: readonly string[] = ['application/json', 'application/yaml'];
/** Media types with a stream serializer (YAML has none), for `stream=watch`. */
const STREAM_MEDIA_TYPES: readonly string[] = ['application/json', 'application/vnd.kubernetes.protobuf'];
const META_GROUP = 'meta.k8s.io';
const META_VERSIONS: readonly string[] = ['v1', 'v1beta1'];

/** The transformation an Accept header asked for (MediaTypeOptions.Convert). */
export interface ConvertTarget {
  kind: 'PartialObjectMetadata' | 'PartialObjectMetadataList';
  /** meta.k8s.io/v1 or meta.k8s.io/v1beta1 */
  apiVersion: string;
}

interface AcceptClause {
  type: string;
  subType: string;
  q: number;
  params: Record<string, string>;
}

/** github.com/munnerz/goautoneg ParseAccept: clauses by q, then the more specific first. */
function parseAccept(header: string): AcceptClause[] {
  const clauses: AcceptClause[] = [];
  for (const part of header.split(',')) {
    const [range = '', ...paramParts] = part.split(';');
    const [type = '', subType] = range.split('/', 2).map((x) => x.trim());
    if (subType === undefined && type !== '*') continue;
    const clause: AcceptClause = { type, subType: subType ?? '*', q: 1, params: {} };
    for (const p of paramParts) {
      const eq = p.indexOf('=');
      if (eq < 0) continue;
      const key = p.slice(0, eq).trim();
      const value = p.slice(eq + 1).trim();
      if (key === 'q') clause.q = Number.parseFloat(value) || 0;
      else clause.params[key] = value;
    }
    clauses.push(clause);
  }
  const rank = (c: AcceptClause) => (c.type === '*' ? 2 : c.subType === '*' ? 1 : 0);
  return clauses.map((c, i) => ({ c, i })).sort((a, b) => b.c.q - a.c.q || rank(a.c) - rank(b.c) || a.i - b.i).map((x) => x.c);
}

const notAcceptable = (message: string) => failure(406, 'NotAcceptable', message);

/**
 * The answer's form for this Accept header (NegotiateOutputMediaType with
 * RequestScope.AllowsMediaTypeTransform): the first clause the server can
 * serve wins, a clause asking for a transformation it does not know (an
 * unknown `as=`, or `as=` without `g=meta.k8s.io;v=v1`) is skipped, and when
 * no clause is left the answer is 406. Returns the transformation, if any.
 */
function negotiate(header: string, rt: ResourceType, transforms = true): ConvertTarget | undefined {
  if (header.trim() === '') return undefined;
  for (const clause of parseAccept(header)) {
    for (const mediaType of MEDIA_TYPES) {
      const [type, subType] = mediaType.split('/') as [string, string];
      const matches = (clause.type === type && (clause.subType === subType || clause.subType === '*')) || (clause.type === '*' && clause.subType === '*');
      if (!matches) continue;
      const p = clause.params;
      if (p.stream !== undefined && p.stream !== '' && (p.stream !== 'watch' || !STREAM_MEDIA_TYPES.includes(mediaType))) continue;
      if (p.sv !== undefined && p.sv !== '' && p.sv !== 'v1') continue;
      const converts = p.as !== undefined || p.g !== undefined || p.v !== undefined;
      let target: ConvertTarget | 'Table' | undefined;
      if (!converts) {
        if (!rt.builtin && !CR_MEDIA_TYPES.includes(mediaType)) continue;
      } else {
        if (!transforms || p.g !== META_GROUP || !META_VERSIONS.includes(p.v ?? '')) continue;
        if (p.as === 'PartialObjectMetadata' || p.as === 'PartialObjectMetadataList') target = { kind: p.as, apiVersion: `${META_GROUP}/${p.v}` };
        else if (p.as === 'Table' && (mediaType === 'application/json' || mediaType === 'application/yaml')) target = 'Table';
        else continue;
      }
      // Chosen. The stand-in encodes JSON only and builds no Tables: it
      // refuses what the real server would serve rather than answer in
      // another form than the one asked for.
      if (mediaType !== 'application/json') throw notAcceptable(`the test API server encodes only application/json, not ${mediaType}`);
      if (target === 'Table') throw notAcceptable('the test API server does not build Tables (as=Table)');
      return target;
    }
  }
  throw notAcceptable(`only the following media types are accepted: ${MEDIA_TYPES.join(', ')}`);
}

/** The Go type a transformation error names (%T of the stored object in response.go). */
const goTypeOf = (rt: ResourceType, list: boolean) => (rt.builtin ? `*core.${rt.kind}${list ? 'List' : ''}` : `*unstructured.Unstructured${list ? 'List' : ''}`);

/**
 * An answer as the negotiated transformation makes it (response.go
 * doTransformObject): PartialObjectMetadata carries the whole
 * metadata (managedFields too) and nothing else; asking for the single form
 * on a list, or the list form on a single object, is 406. Status objects
 * pass unchanged.
 */
function transformed(target: ConvertTarget | undefined, rt: ResourceType, body: unknown, list: boolean): unknown {
  if (!target || !isMap(body) || body.kind === 'Status') return body;
  if (target.kind === 'PartialObjectMetadata') {
    if (list) throw notAcceptable(`you requested PartialObjectMetadata, but the requested object is a list (${goTypeOf(rt, true)})`);
    return { kind: 'PartialObjectMetadata', apiVersion: target.apiVersion, metadata: body.metadata };
  }
  if (!list) throw notAcceptable(`you requested PartialObjectMetadataList, but the requested object is not a list (${goTypeOf(rt, false)})`);
  const items = Array.isArray(body.items) ? body.items : [];
  return {
    kind: 'PartialObjectMetadataList',
    apiVersion: target.apiVersion,
    metadata: body.metadata,
    items: items.map((o: KubeObject) => ({ kind: 'PartialObjectMetadata', apiVersion: target.apiVersion, metadata: o.metadata })),
  };
}

// ---------------------------------------------------------------------------
// Continue tokens (k8s.io/apiserver pkg/storage/continue.go): base64url
// (no padding) of {"v":"meta.k8s.io/v1","rv":<list resourceVersion>,"start":<key after the last item>}.

function encodeContinue(startKey: string, rv: number): string {
  return Buffer.from(JSON.stringify({ v: 'meta.k8s.io/v1', rv, start: startKey })).toString('base64url');
}

function decodeContinue(token: string): { startKey: string; rv: number } {
  const invalidToken = (why: string) => badRequest(`invalid continue token: continue key is not valid${why}`);
  if (!/^[A-Za-z0-9_-]*$/.test(token) || token.length % 4 === 1) throw invalidToken(': illegal base64 data');
  let c: unknown;
  try {
    c = JSON.parse(Buffer.from(token, 'base64url').toString('utf8'));
  } catch (err) {
    throw invalidToken(`: ${(err as Error).message}`);
  }
  if (!isMap(c)) throw invalidToken('');
  if (c.v !== 'meta.k8s.io/v1') throw invalidToken(`: server does not recognize this encoded version ${String(c.v)}`);
  if (typeof c.rv !== 'number' || !Number.isInteger(c.rv) || c.rv === 0) throw invalidToken(': incorrect encoded start resourceVersion (version meta.k8s.io/v1)');
  if (typeof c.start !== 'string' || c.start === '') throw invalidToken(': encoded start key empty (version meta.k8s.io/v1)');
  // path.Clean must not change the key: no way out of the resource's prefix.
  const key = c.start.startsWith('/') ? c.start : `/${c.start}`;
  let cleaned = path.posix.normalize(key);
  if (cleaned.length > 1 && cleaned.endsWith('/')) cleaned = cleaned.slice(0, -1);
  if (cleaned !== key) throw invalidToken(`: ${c.start}`);
  return { startKey: key.slice(1), rv: c.rv };
}

/** storage/etcd3/errors.go: the answer to a continue token whose resourceVersion was compacted. */
const INCONSISTENT_CONTINUE =
  'The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, ' +
  'or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an ' +
  'inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.';

// ---------------------------------------------------------------------------
// JSON values: copies, canonical form, merge patch (RFC 7386), JSON patch (RFC 6902)

type JsonMap = Record<string, unknown>;
const isMap = (v: unknown): v is JsonMap => v !== null && typeof v === 'object' && !Array.isArray(v);
const clone = <T>(v: T): T => structuredClone(v);

/** JSON with object keys sorted, for equality that ignores key order. */
function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (isMap(v)) {
    const keys = Object.keys(v).filter((k) => v[k] !== undefined).sort();
    return `{${keys.map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`).join(',')}}`;
  }
  return JSON.stringify(v);
}

export function mergePatch(target: unknown, patch: unknown): unknown {
  if (!isMap(patch)) return clone(patch);
  const out: JsonMap = isMap(target) ? { ...target } : {};
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = mergePatch(out[k], v);
  }
  return out;
}

class PatchError extends Error {}

function pointer(p: unknown): string[] {
  if (typeof p !== 'string' || (p !== '' && !p.startsWith('/'))) throw new PatchError(`invalid JSON pointer ${JSON.stringify(p)}`);
  return p === '' ? [] : p.slice(1).split('/').map((t) => t.replace(/~1/g, '/').replace(/~0/g, '~'));
}

function arrayIndex(arr: unknown[], token: string, allowEnd: boolean): number {
  if (allowEnd && token === '-') return arr.length;
  if (!/^(0|[1-9][0-9]*)$/.test(token)) throw new PatchError(`invalid array index ${JSON.stringify(token)}`);
  const i = Number(token);
  if (i > arr.length || (!allowEnd && i === arr.length)) throw new PatchError(`array index ${i} out of bounds`);
  return i;
}

function getAt(doc: unknown, tokens: string[]): unknown {
  let cur = doc;
  for (const t of tokens) {
    if (Array.isArray(cur)) cur = cur[arrayIndex(cur, t, false)];
    else if (isMap(cur) && Object.hasOwn(cur, t)) cur = cur[t];
    else throw new PatchError(`path /${tokens.join('/')} does not exist`);
  }
  return cur;
}

function addAt(doc: unknown, tokens: string[], value: unknown, replace: boolean): unknown {
  if (tokens.length === 0) return value;
  const parent = getAt(doc, tokens.slice(0, -1));
  const last = tokens[tokens.length - 1]!;
  if (Array.isArray(parent)) {
    const i = arrayIndex(parent, last, !replace);
    parent.splice(i, replace ? 1 : 0, value);
  } else if (isMap(parent)) {
    if (replace && !Object.hasOwn(parent, last)) throw new PatchError(`path /${tokens.join('/')} does not exist`);
    parent[last] = value;
  } else {
    throw new PatchError(`path /${tokens.slice(0, -1).join('/')} is not a container`);
  }
  return doc;
}

function removeAt(doc: unknown, tokens: string[]): unknown {
  if (tokens.length === 0) throw new PatchError('cannot remove the whole document');
  const parent = getAt(doc, tokens.slice(0, -1));
  const last = tokens[tokens.length - 1]!;
  if (Array.isArray(parent)) parent.splice(arrayIndex(parent, last, false), 1);
  else if (isMap(parent) && Object.hasOwn(parent, last)) delete parent[last];
  else throw new PatchError(`path /${tokens.join('/')} does not exist`);
  return doc;
}

export function jsonPatch(target: unknown, ops: unknown): unknown {
  if (!Array.isArray(ops)) throw badRequest('a JSON patch must be a list of operations');
  let doc = clone(target);
  for (const raw of ops) {
    if (!isMap(raw)) throw badRequest('a JSON patch operation must be an object');
    const op = raw;
    const p = pointer(op.path);
    switch (op.op) {
      case 'add':
        doc = addAt(doc, p, clone(op.value), false);
        break;
      case 'replace':
        doc = addAt(doc, p, clone(op.value), true);
        break;
      case 'remove':
        doc = removeAt(doc, p);
        break;
      case 'move': {
        const from = pointer(op.from);
        const v = getAt(doc, from);
        doc = addAt(removeAt(doc, from), p, v, false);
        break;
      }
      case 'copy':
        doc = addAt(doc, p, clone(getAt(doc, pointer(op.from))), false);
        break;
      case 'test':
        if (canonical(getAt(doc, p)) !== canonical(op.value)) throw new PatchError(`test operation failed at ${String(op.path)}`);
        break;
      default:
        throw badRequest(`unknown JSON patch operation ${JSON.stringify(op.op)}`);
    }
  }
  return doc;
}

// ---------------------------------------------------------------------------
// managedFields (k8s.io/apimachinery/pkg/util/managedfields), for writes that
// are not server-side apply: each write's field manager owns the fields the
// write changed, and no other manager owns them any longer; a field removed
// is owned by nobody. One entry per (manager, operation Update, subresource).
// Simplified: lists are owned whole (no k:/v: keys for list items), and the
// "." marker of a map a manager created is left out.

interface ManagedFieldsEntry {
  manager: string;
  operation: 'Update';
  apiVersion: string;
  time: string;
  fieldsType: 'FieldsV1';
  fieldsV1: JsonMap;
  subresource?: string;
}

/** Metadata the server owns; never in managedFields. */
const UNMANAGED_META = new Set([
  'name', 'namespace', 'generateName', 'uid', 'resourceVersion', 'generation', 'creationTimestamp',
  'deletionTimestamp', 'deletionGracePeriodSeconds', 'managedFields', 'selfLink',
]);

/** Leaf paths (maps walked, anything else a leaf) where `a` and `b` differ, and whether each is still set in `b`. */
function changedLeaves(a: unknown, b: unknown, path: string[] = [], out: { path: string[]; set: boolean }[] = []): { path: string[]; set: boolean }[] {
  if (path.length === 1 && (path[0] === 'apiVersion' || path[0] === 'kind')) return out;
  if (path.length === 2 && path[0] === 'metadata' && UNMANAGED_META.has(path[1]!)) return out;
  if (isMap(a) && isMap(b)) {
    for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) changedLeaves(a[k], b[k], [...path, k], out);
    return out;
  }
  if (isMap(b) && a === undefined) {
    for (const k of Object.keys(b)) changedLeaves(undefined, b[k], [...path, k], out);
    if (Object.keys(b).length === 0) out.push({ path, set: true });
    return out;
  }
  if (isMap(a) && b === undefined) {
    for (const k of Object.keys(a)) changedLeaves(a[k], undefined, [...path, k], out);
    return out;
  }
  if (canonical(a) !== canonical(b) && path.length > 0) out.push({ path, set: b !== undefined });
  return out;
}

function fieldsToPaths(fields: unknown, prefix: string[] = [], out: string[][] = []): string[][] {
  if (!isMap(fields)) return out;
  const children = Object.keys(fields).filter((k) => k.startsWith('f:'));
  if (children.length === 0 && prefix.length > 0) out.push(prefix);
  for (const k of children) fieldsToPaths(fields[k], [...prefix, k.slice(2)], out);
  return out;
}

function pathsToFields(paths: string[][]): JsonMap {
  const root: JsonMap = {};
  for (const p of paths) {
    let cur = root;
    for (const k of p) cur = (cur[`f:${k}`] ??= {}) as JsonMap;
  }
  return root;
}

/** Drops `path` and everything under it, and any owned ancestor of it, from `paths`. */
function withoutPath(paths: string[][], path: string[]): string[][] {
  const prefixOf = (a: string[], b: string[]) => a.length <= b.length && a.every((x, i) => x === b[i]);
  return paths.filter((p) => !prefixOf(path, p) && !prefixOf(p, path));
}

function updateManagedFields(
  current: unknown,
  oldObj: unknown,
  newObj: unknown,
  manager: string,
  apiVersion: string,
  subresource: string | undefined,
): ManagedFieldsEntry[] | undefined {
  const entries = (Array.isArray(current) ? current : []).filter(isMap).map((e) => ({ ...(e as unknown as ManagedFieldsEntry) }));
  const changes = changedLeaves(oldObj, newObj);
  const owned = entries.map((e) => fieldsToPaths(e.fieldsV1));
  for (const c of changes) for (let i = 0; i < owned.length; i++) owned[i] = withoutPath(owned[i]!, c.path);
  let mine = entries.findIndex((e) => e.manager === manager && e.operation === 'Update' && (e.subresource ?? '') === (subresource ?? ''));
  if (mine < 0) {
    entries.push({ manager, operation: 'Update', apiVersion, time: now(), fieldsType: 'FieldsV1', fieldsV1: {}, ...(subresource ? { subresource } : {}) });
    owned.push([]);
    mine = entries.length - 1;
  }
  for (const c of changes) if (c.set) owned[mine]!.push(c.path);
  entries[mine]!.time = now();
  entries[mine]!.apiVersion = apiVersion;
  const out = entries
    .map((e, i) => ({ ...e, fieldsV1: pathsToFields(owned[i]!) }))
    .filter((_e, i) => owned[i]!.length > 0);
  return out.length > 0 ? out : undefined;
}

// ---------------------------------------------------------------------------
// Selectors (k8s.io/apimachinery/pkg/labels and pkg/fields syntax)

interface LabelRequirement {
  key: string;
  op: 'in' | 'notin' | 'exists' | 'absent' | 'gt' | 'lt';
  values: string[];
}

function parseLabelSelector(s: string): LabelRequirement[] {
  const parts: string[] = [];
  let depth = 0;
  let cur = '';
  for (const ch of s) {
    if (ch === '(') depth++;
    if (ch === ')') depth--;
    if (ch === ',' && depth === 0) {
      parts.push(cur);
      cur = '';
    } else cur += ch;
  }
  parts.push(cur);
  const reqs: LabelRequirement[] = [];
  for (const raw of parts.map((p) => p.trim()).filter(Boolean)) {
    let m: RegExpMatchArray | null;
    if ((m = raw.match(/^!\s*([^\s=!<>(),]+)$/))) reqs.push({ key: m[1]!, op: 'absent', values: [] });
    else if ((m = raw.match(/^([^\s=!<>(),]+)\s+(in|notin)\s*\(([^()]*)\)$/)))
      reqs.push({ key: m[1]!, op: m[2] as 'in' | 'notin', values: m[3]!.split(',').map((v) => v.trim()) });
    else if ((m = raw.match(/^([^\s=!<>(),]+)\s*(==|=|!=|>|<)\s*([^\s=!<>(),]*)$/))) {
      const op = { '=': 'in', '==': 'in', '!=': 'notin', '>': 'gt', '<': 'lt' } as const;
      reqs.push({ key: m[1]!, op: op[m[2] as keyof typeof op], values: [m[3]!] });
    } else if ((m = raw.match(/^([^\s=!<>(),]+)$/))) reqs.push({ key: m[1]!, op: 'exists', values: [] });
    else throw badRequest(`unable to parse requirement: ${JSON.stringify(raw)}`);
  }
  return reqs;
}

function labelsMatch(reqs: LabelRequirement[], labels: Record<string, string> | undefined): boolean {
  const l = labels ?? {};
  return reqs.every((r) => {
    const has = Object.hasOwn(l, r.key);
    const v = l[r.key];
    switch (r.op) {
      case 'in':
        return has && r.values.includes(v!);
      case 'notin':
        return !has || !r.values.includes(v!);
      case 'exists':
        return has;
      case 'absent':
        return !has;
      case 'gt':
        return has && Number(v) > Number(r.values[0]);
      case 'lt':
        return has && Number(v) < Number(r.values[0]);
    }
  });
}

interface FieldRequirement {
  get: FieldGetter;
  equal: boolean;
  value: string;
}

function parseFieldSelector(rt: ResourceType, s: string): FieldRequirement[] {
  const getters: Record<string, FieldGetter> = { 'metadata.name': at('metadata.name'), ...rt.fields };
  if (rt.namespaced) getters['metadata.namespace'] = at('metadata.namespace');
  return s
    .split(',')
    .map((p) => p.trim())
    .filter(Boolean)
    .map((p) => {
      const m = p.match(/^([^=!]+?)\s*(==|=|!=)\s*(.*)$/);
      if (!m) throw badRequest(`invalid selector: '${s}'; can't understand '${p}'`);
      const get = getters[m[1]!];
      if (!get) throw badRequest(`field label not supported: ${m[1]}`);
      return { get, equal: m[2] !== '!=', value: m[3]! };
    });
}

const fieldsMatch = (reqs: FieldRequirement[], obj: KubeObject) => reqs.every((r) => (r.get(obj) === r.value) === r.equal);

/** The value a field selector requires `field` to equal exactly (fields.Selector RequiresExactMatch), if it does. */
function exactFieldValue(selector: string, field: string): string | undefined {
  for (const p of selector.split(',')) {
    const m = p.trim().match(/^([^=!]+?)\s*(==|=)\s*(.*)$/);
    if (m && m[1] === field) return m[3];
  }
  return undefined;
}

// ---------------------------------------------------------------------------
// Object metadata validation (k8s.io/apimachinery/pkg/api/validation)

const NAME_RE = new RegExp(NAME_PATTERN);
const LABEL_VALUE_RE = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;
const QUALIFIED_NAME_RE = /^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$/;
/** TotalAnnotationSizeLimitB in apimachinery's ValidateAnnotations. */
const MAX_ANNOTATIONS_BYTES = 256 * 1024;
/** The apiserver refuses request bodies over 3 MiB. */
const MAX_BODY_BYTES = 3 * 1024 * 1024;

function stringMap(v: unknown, field: string): Record<string, string> | undefined {
  if (v === undefined || v === null) return undefined;
  if (!isMap(v) || Object.values(v).some((x) => typeof x !== 'string')) throw badRequest(`${field}: must be a map of strings`);
  return v as Record<string, string>;
}

/** Why a name is not a path segment (apimachinery pkg/api/validation/path IsValidPathSegmentName), or undefined. */
function pathSegmentProblem(name: string): string | undefined {
  if (name === '.' || name === '..') return `may not be '${name}'`;
  for (const c of ['/', '%']) if (name.includes(c)) return `may not contain '${c}'`;
  return undefined;
}

function metaCauses(meta: ObjectMeta, pathSegmentNames = false): StatusCause[] {
  const causes: StatusCause[] = [];
  const bad = (field: string, message: string, reason = 'FieldValueInvalid') => causes.push({ reason, message, field });
  const segment = pathSegmentNames && typeof meta.name === 'string' ? pathSegmentProblem(meta.name) : undefined;
  if (!meta.name) bad('metadata.name', 'Required value: name or generateName is required', 'FieldValueRequired');
  else if (pathSegmentNames) {
    if (segment) bad('metadata.name', `Invalid value: ${JSON.stringify(meta.name)}: ${segment}`);
  } else if (typeof meta.name !== 'string' || meta.name.length > MAX_OBJECT_NAME_LENGTH || !NAME_RE.test(meta.name))
    bad(
      'metadata.name',
      `Invalid value: ${JSON.stringify(meta.name)}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character`,
    );
  for (const [k, v] of Object.entries(stringMap(meta.labels, 'metadata.labels') ?? {})) {
    const slash = k.lastIndexOf('/');
    const prefix = slash >= 0 ? k.slice(0, slash) : undefined;
    const name = k.slice(slash + 1);
    if ((prefix !== undefined && (prefix.length > 253 || !NAME_RE.test(prefix))) || name.length > 63 || !QUALIFIED_NAME_RE.test(name))
      bad('metadata.labels', `Invalid value: ${JSON.stringify(k)}: a label key must be a qualified name, optionally prefixed by a DNS subdomain`);
    if (v.length > 63 || !LABEL_VALUE_RE.test(v))
      bad(`metadata.labels`, `Invalid value: ${JSON.stringify(v)}: a valid label must be an empty string or at most 63 alphanumeric characters, '-', '_' or '.'`);
  }
  const annotations = stringMap(meta.annotations, 'metadata.annotations') ?? {};
  const size = Object.entries(annotations).reduce((n, [k, v]) => n + Buffer.byteLength(k) + Buffer.byteLength(v), 0);
  if (size > MAX_ANNOTATIONS_BYTES) bad('metadata.annotations', `Too long: must have at most ${MAX_ANNOTATIONS_BYTES} bytes`, 'FieldValueTooLong');
  if (meta.finalizers !== undefined && (!Array.isArray(meta.finalizers) || meta.finalizers.some((f) => typeof f !== 'string')))
    throw badRequest('metadata.finalizers: must be a list of strings');
  return causes;
}

/** metav1.MicroTime's wire format (RFC3339Micro in apimachinery). */
function normalizeMicroTimes(rt: ResourceType, obj: KubeObject): void {
  for (const dotted of rt.microTimes ?? []) {
    const keys = dotted.split('.');
    const parent = keys.slice(0, -1).reduce<unknown>((o, k) => (isMap(o) ? o[k] : undefined), obj);
    const last = keys[keys.length - 1]!;
    if (!isMap(parent) || typeof parent[last] !== 'string') continue;
    const value = parent[last] as string;
    const utc = value.match(/^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z$/);
    const t = new Date(value);
    if (!utc && Number.isNaN(t.getTime()))
      throw invalid(rt, String(obj.metadata.name ?? ''), [{ reason: 'FieldValueInvalid', field: dotted, message: `Invalid value: ${JSON.stringify(value)}: not a timestamp` }]);
    parent[last] = utc ? `${utc[1]}.${(utc[2] ?? '').padEnd(6, '0').slice(0, 6)}Z` : t.toISOString().replace(/Z$/, '000Z');
  }
}

const now = () => new Date().toISOString().replace(/\.\d+Z$/, 'Z');
const NAME_SUFFIX_CHARS = 'bcdfghjklmnpqrstvwxz2456789'; // k8s.io/apiserver/pkg/storage/names
const nameSuffix = () => Array.from({ length: 5 }, () => NAME_SUFFIX_CHARS[randomInt(NAME_SUFFIX_CHARS.length)]).join('');

// ---------------------------------------------------------------------------
// The server

interface HistoryEvent {
  rv: number;
  plural: ResourceName;
  type: 'ADDED' | 'MODIFIED' | 'DELETED';
  object: KubeObject;
  /** The stored object before the change (MODIFIED, DELETED). */
  prev?: KubeObject;
}

interface WatchEvent {
  type: 'ADDED' | 'MODIFIED' | 'DELETED' | 'BOOKMARK' | 'ERROR';
  object: unknown;
}

interface Watcher {
  rt: ResourceType;
  namespace: string | undefined;
  labels: LabelRequirement[];
  fields: FieldRequirement[];
  bookmarks: boolean;
  /** The transformation of every event's object the Accept header asked for. */
  convert: ConvertTarget | undefined;
  query: Record<string, string>;
  res: http.ServerResponse;
  timers: NodeJS.Timeout[];
  /** When the server ends this watch (ms since the epoch). */
  deadline: number;
  /** `<namespace>/<name>` of the one object the watch is scoped to (fieldSelector metadata.name=X), as the watch cache indexes it. */
  scope?: string;
}

interface WriteOptions {
  /** The request targets the /status subresource. */
  status?: boolean;
  /** A test control: may set .status anywhere, needs no resourceVersion. */
  privileged?: boolean;
  /** The field manager of the write (?fieldManager=, else the User-Agent's product). */
  manager?: string;
}

/** Field manager of the test controls' writes. */
export const TEST_CONTROL_MANAGER = 'test-control';

const objectKey = (namespace: string | undefined, name: string) => `${namespace ?? ''}/${name}`;

export class ApiServer {
  readonly url: string;
  readonly requests: RecordedRequest[] = [];
  /** TCP connections made to the server, refused ones (while unavailable) included. */
  connections = 0;
  /** Watch events written, by resource, then by type. */
  readonly watchEvents: Record<string, Record<string, number>> = {};
  readonly #server: http.Server;
  readonly #bookmarkIntervalMs: number;
  readonly #minRequestTimeoutMs: number;
  readonly #historyLimit: number;
  readonly #token: string | undefined;
  readonly #validators: ApiServerOptions['validators'];
  readonly #partialObjectMetadata: boolean;
  readonly #version: { major: string; minor: string; gitVersion: string };
  readonly #notServed: ReadonlySet<ResourceName>;
  readonly #openshift: boolean;
  readonly #objects = new Map(
    TYPES.map((t): [ResourceName, Map<string, KubeObject>] => [t.plural, new Map()]),
  );
  readonly #watches = new Set<Watcher>();
  /** Watches scoped to one object, by `<plural>/<namespace>/<name>` (the watch cache's allWatchers[namespacedName]), and the others. */
  readonly #scoped = new Map<string, Set<Watcher>>();
  readonly #unscoped = new Set<Watcher>();
  readonly #sockets = new Set<Socket>();
  #history: HistoryEvent[] = [];
  /**
   * Per resource, the resourceVersion of the last event its watch cache
   * processed since the server started (cacher.go dispatchEvents'
   * lastProcessedResourceVersion): until there is one, no bookmark is sent.
   */
  readonly #lastProcessedRv = new Map<ResourceName, number>();
  /**
   * Every event up to and including this resourceVersion has left the
   * history (etcd's compaction): no watch and no list page from an older
   * resourceVersion.
   */
  #compactedRv = 0;
  /** The watch cache starts here (a restart): watches from older resourceVersions get 410; list pages do not (etcd serves them). */
  #watchFloorRv = 0;
  /** A custom resource type's watch cache starts here when its CRD was created again: older watches get 410. */
  readonly #typeFloorRv = new Map<ResourceName, number>();
  #rv = 1;
  #available = true;
  #stopped = false;
  readonly #crdCleanupPollMs: number;
  readonly #crdTeardownMs: number;
  /** Timers of the CRD finalizer and of type teardowns, cleared by stop(). */
  readonly #timers = new Set<NodeJS.Timeout>();

  private constructor(server: http.Server, opts: ApiServerOptions) {
    this.#server = server;
    this.#bookmarkIntervalMs = opts.bookmarkIntervalMs ?? 60_000;
    this.#minRequestTimeoutMs = opts.minRequestTimeoutMs ?? 1_800_000;
    this.#historyLimit = opts.historyLimit ?? 1000;
    this.#token = opts.token;
    this.#validators = opts.validators;
    this.#partialObjectMetadata = opts.partialObjectMetadata ?? true;
    const gitVersion = opts.version?.gitVersion ?? 'v1.33.0-pinset-test';
    const [, major = '', minor = ''] = /^v?(\d+)\.(\d+)/.exec(gitVersion) ?? [];
    this.#version = { major: opts.version?.major ?? major, minor: opts.version?.minor ?? minor, gitVersion };
    this.#notServed = new Set(opts.notServed ?? []);
    this.#openshift = opts.openshift ?? false;
    this.#crdCleanupPollMs = opts.crdCleanupPollMs ?? 5_000;
    this.#crdTeardownMs = opts.crdTeardownMs ?? 1_000;
    if (opts.crd ?? true) this.#installCrd();
    this.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    server.on('request', (req, res) => this.#onRequest(req, res));
    server.on('connection', (socket: Socket) => {
      this.connections++;
      if (!this.#available) {
        socket.destroy();
        return;
      }
      this.#sockets.add(socket);
      socket.on('close', () => this.#sockets.delete(socket));
    });
  }

  static async start(opts: ApiServerOptions = {}): Promise<ApiServer> {
    const server = http.createServer();
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(0, '127.0.0.1', () => resolve());
    });
    return new ApiServer(server, opts);
  }

  get resourceVersion(): string {
    return String(this.#rv);
  }

  get available(): boolean {
    return this.#available;
  }

  // ------------------------------------------------------------------ clients

  #kubeconfigDocument(): Record<string, unknown> {
    const name = 'pinset-test';
    return {
      apiVersion: 'v1',
      kind: 'Config',
      clusters: [{ name, cluster: { server: this.url, 'insecure-skip-tls-verify': true } }],
      users: [{ name, user: this.#token ? { token: this.#token } : {} }],
      contexts: [{ name, context: { cluster: name, user: name } }],
      'current-context': name,
    };
  }

  kubeConfig(): KubeConfig {
    const kc = new KubeConfig();
    kc.loadFromString(dumpYaml(this.#kubeconfigDocument()));
    return kc;
  }

  async writeKubeconfig(dir: string): Promise<string> {
    const file = path.join(dir, 'kubeconfig');
    await writeFile(file, dumpYaml(this.#kubeconfigDocument()), { mode: 0o600 });
    return file;
  }

  // ------------------------------------------------------------ test controls

  #typeOf(obj: KubeObject): ResourceType {
    const rt = TYPES.find((t) => t.kind === obj?.kind && apiVersionOf(t) === obj?.apiVersion);
    if (!rt) throw new Error(`the test API server does not serve ${obj?.apiVersion} ${obj?.kind}`);
    return rt;
  }

  #ns(rt: ResourceType, namespace: string | undefined): string | undefined {
    return rt.namespaced ? (namespace ?? 'default') : undefined;
  }

  create(obj: KubeObject): KubeObject {
    const rt = this.#typeOf(obj);
    if (!this.#serves(rt)) throw noSuchResource();
    return this.#create(rt, this.#ns(rt, obj.metadata?.namespace), obj, { privileged: true, manager: TEST_CONTROL_MANAGER });
  }

  get(resource: ResourceName, name: string, namespace?: string): KubeObject | undefined {
    const rt = typeByName(resource);
    const obj = this.#bucket(rt).get(objectKey(this.#ns(rt, namespace), name));
    return obj && clone(obj);
  }

  list(resource: ResourceName, opts: { namespace?: string; labelSelector?: string; fieldSelector?: string } = {}): KubeObject[] {
    const rt = typeByName(resource);
    const labels = parseLabelSelector(opts.labelSelector ?? '');
    const fields = parseFieldSelector(rt, opts.fieldSelector ?? '');
    return this.#objectsOf(rt, opts.namespace)
      .filter((o) => labelsMatch(labels, o.metadata.labels) && fieldsMatch(fields, o))
      .map(clone);
  }

  update(obj: KubeObject): KubeObject {
    const rt = this.#typeOf(obj);
    return this.#update(rt, this.#ns(rt, obj.metadata?.namespace), String(obj.metadata?.name), obj, { privileged: true, manager: TEST_CONTROL_MANAGER });
  }

  patch(resource: ResourceName, name: string, patch: JsonMap, namespace?: string): KubeObject {
    const rt = typeByName(resource);
    return this.#patch(rt, this.#ns(rt, namespace), name, 'application/merge-patch+json', patch, { privileged: true, manager: TEST_CONTROL_MANAGER });
  }

  remove(resource: ResourceName, name: string, namespace?: string): boolean {
    const rt = typeByName(resource);
    const old = this.#bucket(rt).get(objectKey(this.#ns(rt, namespace), name));
    if (old) this.#commitDelete(rt, old);
    // A CRD removed whole (its finalizer skipped): its objects stay in
    // storage, unserved, as they stay in etcd, and come back with the CRD.
    if (old && rt.plural === 'customresourcedefinitions') this.#tearDown(name);
    return old !== undefined;
  }

  compact(): void {
    this.#history = [];
    this.#compactedRv = this.#rv;
  }

  /**
   * What clients see of an API server restart: every watch ends, the new
   * watch cache starts at the current resourceVersion (a watch from an older
   * one gets 410 Expired) and has processed no event yet (no bookmarks until
   * one arrives). The stored objects stay, as they do in etcd.
   */
  restart(): void {
    this.dropWatches({ graceful: true });
    this.#watchFloorRv = this.#rv;
    this.#lastProcessedRv.clear();
  }

  /**
   * An etcd progress notification reaching every watch cache: each has now
   * processed the current resourceVersion, so bookmarks flow from here on
   * (etcd sends these every 10 minutes by default).
   */
  progressNotify(): void {
    for (const t of TYPES) this.#lastProcessedRv.set(t.plural, this.#rv);
  }

  dropWatches(opts: { graceful?: boolean } = {}): number {
    const n = this.#watches.size;
    for (const w of [...this.#watches]) {
      this.#closeWatch(w);
      if (opts.graceful) w.res.end();
      else w.res.socket?.destroy();
    }
    return n;
  }

  openWatches(): OpenWatch[] {
    return [...this.#watches].map((w) => ({ resource: w.rt.plural, namespace: w.namespace, query: { ...w.query } }));
  }

  setAvailable(available: boolean): void {
    this.#available = available;
    if (available) return;
    for (const w of this.#watches) this.#closeWatch(w);
    for (const s of this.#sockets) s.destroy();
  }

  async waitFor<T>(predicate: () => T | Promise<T>, timeoutMs = 5000, what = 'a condition'): Promise<T> {
    const deadline = Date.now() + timeoutMs;
    let lastError: unknown;
    for (;;) {
      try {
        const v = await predicate();
        if (v) return v;
      } catch (err) {
        lastError = err;
      }
      if (Date.now() > deadline) {
        const cause = lastError instanceof Error ? ` (last error: ${lastError.message})` : '';
        throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${cause}`);
      }
      await delay(10);
    }
  }

  async stop(): Promise<void> {
    if (this.#stopped) return;
    this.#stopped = true;
    for (const t of this.#timers) clearTimeout(t);
    for (const w of [...this.#watches]) {
      this.#closeWatch(w);
      w.res.end();
    }
    const closed = new Promise<void>((resolve) => this.#server.close(() => resolve()));
    this.#server.closeAllConnections();
    await closed;
  }

  // -------------------------------------------------------------------- store

  #bucket(rt: ResourceType): Map<string, KubeObject> {
    return this.#objects.get(rt.plural)!;
  }

  /** Per resource, its keys in order, kept until an object is created or deleted (the watch cache's B-tree is ordered too). */
  readonly #sortedKeys = new Map<ResourceName, string[]>();

  /** Objects of a type in key order (namespace, name), as etcd lists them. */
  #objectsOf(rt: ResourceType, namespace: string | undefined): KubeObject[] {
    const bucket = this.#bucket(rt);
    let keys = this.#sortedKeys.get(rt.plural);
    if (!keys || keys.length !== bucket.size) {
      keys = [...bucket.keys()].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
      this.#sortedKeys.set(rt.plural, keys);
    }
    const out: KubeObject[] = [];
    for (const k of keys) {
      const o = bucket.get(k);
      if (o && (namespace === undefined || o.metadata.namespace === namespace)) out.push(o);
    }
    return out;
  }

  #mustGet(rt: ResourceType, namespace: string | undefined, name: string): KubeObject {
    const obj = this.#bucket(rt).get(objectKey(namespace, name));
    if (!obj) throw notFound(rt, name);
    return obj;
  }

  #record(rt: ResourceType, type: HistoryEvent['type'], object: KubeObject, prev?: KubeObject): void {
    const ev: HistoryEvent = { rv: this.#rv, plural: rt.plural, type, object: clone(object), prev: prev && clone(prev) };
    this.#history.push(ev);
    this.#lastProcessedRv.set(rt.plural, ev.rv);
    while (this.#history.length > this.#historyLimit) this.#compactedRv = this.#history.shift()!.rv;
    const dispatch = (w: Watcher) => {
      const out = this.#convert(w, ev);
      if (out) this.#send(w, out);
    };
    for (const w of [...(this.#scoped.get(`${rt.plural}/${objectKey(object.metadata.namespace, object.metadata.name!)}`) ?? [])]) dispatch(w);
    for (const w of [...this.#unscoped]) if (w.rt === rt) dispatch(w);
  }

  #commitCreate(rt: ResourceType, obj: KubeObject, opts: WriteOptions = {}): KubeObject {
    delete obj.metadata.managedFields;
    if (opts.manager !== undefined) obj.metadata.managedFields = updateManagedFields(undefined, {}, obj, opts.manager, apiVersionOf(rt), opts.status ? 'status' : undefined);
    this.#rv += 1;
    obj.metadata.resourceVersion = String(this.#rv);
    this.#bucket(rt).set(objectKey(obj.metadata.namespace, obj.metadata.name!), obj);
    this.#sortedKeys.delete(rt.plural);
    this.#record(rt, 'ADDED', obj);
    return clone(obj);
  }

  #commitUpdate(rt: ResourceType, old: KubeObject, next: KubeObject, opts: WriteOptions = {}): KubeObject {
    next.metadata.resourceVersion = old.metadata.resourceVersion;
    // managedFields sent by a client are the ones it read; the server keeps its own.
    if (old.metadata.managedFields !== undefined) next.metadata.managedFields = old.metadata.managedFields;
    else delete next.metadata.managedFields;
    // A write that changes nothing changes no managedFields either.
    if (canonical(next) === canonical(old)) return clone(old);
    if (opts.manager !== undefined)
      next.metadata.managedFields = updateManagedFields(old.metadata.managedFields, old, next, opts.manager, apiVersionOf(rt), opts.status ? 'status' : undefined);
    if (next.metadata.deletionTimestamp && !next.metadata.finalizers?.length) {
      // The last finalizer is gone: the update completes the deletion.
      this.#commitDelete(rt, old);
      return { ...clone(next), metadata: { ...clone(next.metadata), resourceVersion: String(this.#rv) } };
    }
    this.#rv += 1;
    next.metadata.resourceVersion = String(this.#rv);
    this.#bucket(rt).set(objectKey(next.metadata.namespace, next.metadata.name!), next);
    this.#record(rt, 'MODIFIED', next, old);
    return clone(next);
  }

  /** Removes `stored`; the DELETED event carries its last content with the deletion's resourceVersion. */
  #commitDelete(rt: ResourceType, stored: KubeObject): void {
    this.#rv += 1;
    this.#bucket(rt).delete(objectKey(stored.metadata.namespace, stored.metadata.name!));
    this.#sortedKeys.delete(rt.plural);
    const last = clone(stored);
    last.metadata.resourceVersion = String(this.#rv);
    this.#record(rt, 'DELETED', last, stored);
  }

  // ------------------------------------------------------------------- verbs

  #prepare(rt: ResourceType, input: unknown): KubeObject {
    if (!isMap(input)) throw badRequest('the request body must be a JSON object');
    const obj = clone(input) as KubeObject;
    const apiVersion = apiVersionOf(rt);
    if (obj.apiVersion !== undefined && obj.apiVersion !== apiVersion)
      throw badRequest(`the API version in the data (${String(obj.apiVersion)}) does not match the expected API version (${apiVersion})`);
    if (obj.kind !== undefined && obj.kind !== rt.kind)
      throw badRequest(`the kind in the data (${String(obj.kind)}) does not match the expected kind (${rt.kind})`);
    if (obj.metadata === undefined || obj.metadata === null) obj.metadata = {};
    if (!isMap(obj.metadata)) throw badRequest('metadata must be an object');
    const out: KubeObject = { apiVersion, kind: rt.kind, ...obj };
    out.apiVersion = apiVersion;
    out.kind = rt.kind;
    rt.decode?.(out);
    return out;
  }

  #validate(rt: ResourceType, obj: KubeObject, old?: KubeObject): void {
    normalizeMicroTimes(rt, obj);
    const causes = metaCauses(obj.metadata, rt.pathSegmentNames);
    if (causes.length === 0 && rt.check) causes.push(...rt.check(obj, old));
    if (causes.length === 0) {
      for (const line of this.#validators?.[rt.plural]?.(clone(obj)) ?? []) {
        const i = line.indexOf(': ');
        causes.push({ reason: 'FieldValueInvalid', field: i > 0 ? line.slice(0, i) : '<nil>', message: i > 0 ? line.slice(i + 2) : line });
      }
    }
    if (causes.length) throw invalid(rt, String(obj.metadata.name ?? ''), causes);
  }

  #create(rt: ResourceType, namespace: string | undefined, input: unknown, opts: WriteOptions = {}): KubeObject {
    const obj = this.#prepare(rt, input);
    const meta = obj.metadata;
    if (!rt.builtin && this.#crdCondition(qualified(rt), 'Terminating') === 'True') {
      // customresource_handler.go forbidCreateAdmission.
      const n = typeof meta.name === 'string' ? meta.name : '';
      throw failure(403, 'Forbidden', `${qualified(rt)} "${n}" is forbidden: create not allowed while custom resource definition is terminating`, detailsOf(rt, n));
    }
    if (rt.namespaced) {
      if (meta.namespace !== undefined && namespace !== undefined && meta.namespace !== namespace)
        throw badRequest('the namespace of the provided object does not match the namespace sent on the request');
      meta.namespace = namespace ?? meta.namespace;
    } else delete meta.namespace;
    if (!meta.name && typeof meta.generateName === 'string' && meta.generateName) meta.name = meta.generateName + nameSuffix();
    if (rt.statusSubresource && !rt.statusOnCreate && !opts.privileged) {
      delete obj.status;
      if (rt.initialStatus) obj.status = rt.initialStatus();
    }
    this.#validate(rt, obj);
    if (this.#bucket(rt).has(objectKey(meta.namespace, meta.name!))) throw alreadyExists(rt, meta.name!);
    if (!opts.privileged || !meta.uid) meta.uid = randomUUID();
    if (!opts.privileged || !meta.creationTimestamp) meta.creationTimestamp = now();
    delete meta.deletionTimestamp;
    delete meta.deletionGracePeriodSeconds;
    if (rt.generation) meta.generation = 1;
    else delete meta.generation;
    const created = this.#commitCreate(rt, obj, opts);
    if (rt.plural === 'customresourcedefinitions') return this.#establish(meta.name!) ?? created;
    return created;
  }

  #update(rt: ResourceType, namespace: string | undefined, name: string, input: unknown, opts: WriteOptions = {}): KubeObject {
    const old = this.#mustGet(rt, namespace, name);
    const obj = this.#prepare(rt, input);
    const meta = obj.metadata;
    if (meta.name !== undefined && meta.name !== name)
      throw badRequest(`the name of the object (${String(meta.name)}) does not match the name on the URL (${name})`);
    if (rt.namespaced && meta.namespace !== undefined && meta.namespace !== namespace)
      throw badRequest('the namespace of the provided object does not match the namespace sent on the request');
    if (meta.resourceVersion !== undefined && meta.resourceVersion !== '') {
      if (meta.resourceVersion !== old.metadata.resourceVersion) throw conflict(rt, name, STALE);
    } else if (rt.requireResourceVersion && !opts.privileged) {
      throw invalid(rt, name, [{ reason: 'FieldValueInvalid', field: 'metadata.resourceVersion', message: 'Invalid value: 0x0: must be specified for an update' }]);
    }
    let next: KubeObject;
    if (opts.status) {
      // Only .status changes through /status (customresource statusStrategy.PrepareForUpdate).
      next = clone(old);
      if (obj.status !== undefined) next.status = obj.status;
      else delete next.status;
    } else {
      next = obj;
      const m = next.metadata;
      m.name = name;
      if (rt.namespaced) m.namespace = namespace;
      for (const k of ['uid', 'creationTimestamp', 'deletionTimestamp', 'deletionGracePeriodSeconds', 'generation'] as const) {
        if (old.metadata[k] !== undefined) (m as JsonMap)[k] = old.metadata[k];
        else delete m[k];
      }
      if (rt.statusSubresource && !opts.privileged) {
        if (old.status !== undefined) next.status = clone(old.status);
        else delete next.status;
      }
      // customresource strategy PrepareForUpdate: the generation counts
      // changes outside metadata and status (a test control may set .status
      // through the main resource; that is no spec change).
      const content = (o: KubeObject) => canonical({ ...o, metadata: undefined, status: undefined });
      if (rt.generation && content(old) !== content(next)) m.generation = (old.metadata.generation ?? 0) + 1;
    }
    this.#validate(rt, next, old);
    return this.#commitUpdate(rt, old, next, opts);
  }

  #patch(rt: ResourceType, namespace: string | undefined, name: string, contentType: string, patch: unknown, opts: WriteOptions = {}): KubeObject {
    const old = this.#mustGet(rt, namespace, name);
    let patched: unknown;
    try {
      if (contentType === 'application/merge-patch+json') patched = mergePatch(old, patch);
      // Strategic merge patch equals merge patch for maps; lists are replaced rather than merged by key.
      else if (contentType === 'application/strategic-merge-patch+json' && rt.builtin) patched = mergePatch(old, patch);
      else if (contentType === 'application/json-patch+json') patched = jsonPatch(old, patch);
      else throw unsupportedPatch(rt, contentType);
    } catch (err) {
      if (err instanceof PatchError) throw failure(422, 'Invalid', err.message);
      throw err;
    }
    if (!isMap(patched) || !isMap(patched.metadata)) throw badRequest('the patched object must be an object with metadata');
    // A resourceVersion in the patch is a precondition; without one the patch applies to the current object.
    const rv = patched.metadata.resourceVersion;
    if (rv !== undefined && rv !== old.metadata.resourceVersion) throw conflict(rt, name, STALE);
    patched.metadata.resourceVersion = old.metadata.resourceVersion;
    return this.#update(rt, namespace, name, patched, opts);
  }

  #delete(rt: ResourceType, namespace: string | undefined, name: string, options: unknown): KubeObject | KubeStatus {
    const old = this.#mustGet(rt, namespace, name);
    const pre = isMap(options) && isMap(options.preconditions) ? options.preconditions : {};
    if (pre.uid !== undefined && pre.uid !== old.metadata.uid)
      throw conflict(rt, name, `Precondition failed: UID in precondition: ${String(pre.uid)}, UID in object meta: ${old.metadata.uid}`);
    if (pre.resourceVersion !== undefined && pre.resourceVersion !== old.metadata.resourceVersion)
      throw conflict(
        rt,
        name,
        `Precondition failed: ResourceVersion in precondition: ${String(pre.resourceVersion)}, ResourceVersion in object meta: ${old.metadata.resourceVersion}`,
      );
    if (rt.plural === 'customresourcedefinitions') return this.#deleteCrd(rt, old);
    if (old.metadata.finalizers?.length) {
      // Deletion waits for the finalizers; the object is marked and returned.
      if (old.metadata.deletionTimestamp) return clone(old);
      const next = clone(old);
      next.metadata.deletionTimestamp = now();
      next.metadata.deletionGracePeriodSeconds = 0;
      if (rt.generation) next.metadata.generation = (old.metadata.generation ?? 0) + 1;
      return this.#commitUpdate(rt, old, next);
    }
    this.#commitDelete(rt, old);
    return { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Success', details: { ...detailsOf(rt, name), uid: old.metadata.uid }, code: 200 };
  }

  // -------------------------------------------------------------- CRDs

  /** A custom resource type is served while its CRD stands, Established (built-in types always). */
  #serves(rt: ResourceType): boolean {
    if (this.#notServed.has(rt.plural)) return false;
    if (rt.group === 'security.openshift.io') return this.#openshift;
    return rt.builtin || this.#crdCondition(qualified(rt), 'Established') === 'True';
  }

  #crd(name: string): KubeObject | undefined {
    return this.#bucket(typeByName('customresourcedefinitions')).get(objectKey(undefined, name));
  }

  #crdCondition(name: string, type: string): string | undefined {
    const conditions = (this.#crd(name)?.status as { conditions?: { type: string; status: string }[] } | undefined)?.conditions ?? [];
    return conditions.find((c) => c.type === type)?.status;
  }

  /** apihelpers.SetCRDCondition: replace the condition of that type; lastTransitionTime moves only when the status does. */
  #withCondition(crd: KubeObject, c: { type: string; status: string; reason: string; message: string }): KubeObject {
    const next = clone(crd);
    const status = (next.status ??= {}) as { conditions?: JsonMap[] };
    const conditions = status.conditions ?? [];
    const old = conditions.find((x) => x.type === c.type);
    const cond = { ...c, lastTransitionTime: old && old.status === c.status ? old.lastTransitionTime : now() };
    status.conditions = old ? conditions.map((x) => (x === old ? cond : x)) : [...conditions, cond];
    return next;
  }

  /** The PinnedImageSet CRD of deploy/crds/, installed and Established before the server takes a request (no watch event). */
  #installCrd(): void {
    const file = path.join(import.meta.dirname, '../../deploy/crds/pinset.dev_pinnedimagesets.yaml');
    const crd = parseYaml(readFileSync(file, 'utf8')) as KubeObject;
    crd.metadata = { ...crd.metadata, uid: randomUUID(), creationTimestamp: now(), generation: 1, resourceVersion: String(this.#rv) };
    crd.status = { ...this.#establishedStatus(crd), storedVersions: [VERSION] };
    this.#bucket(typeByName('customresourcedefinitions')).set(objectKey(undefined, crd.metadata.name!), crd);
  }

  #establishedStatus(crd: KubeObject): JsonMap {
    const t = now();
    const names = (crd.spec as { names?: unknown } | undefined)?.names ?? {};
    return {
      acceptedNames: names,
      conditions: [
        { type: 'NamesAccepted', status: 'True', reason: 'NoConflicts', message: 'no conflicts found', lastTransitionTime: t },
        { type: 'Established', status: 'True', reason: 'InitialNamesAccepted', message: 'the initial names have been accepted', lastTransitionTime: t },
      ],
    };
  }

  /**
   * The naming and establishing controllers: a CRD just created is
   * Established (one status update). Its type gets a new storage and watch
   * cache, which starts now: a watch from an older resourceVersion is 410
   * Expired (cacher.go "too old resource version"), so a client relists.
   */
  #establish(name: string): KubeObject | undefined {
    const rt = typeByName('customresourcedefinitions');
    const crd = this.#crd(name);
    if (!crd) return undefined;
    const cr = TYPES.find((t) => !t.builtin && qualified(t) === name);
    if (cr) this.#typeFloorRv.set(cr.plural, this.#rv);
    const next = clone(crd);
    next.status = { ...(isMap(crd.status) ? crd.status : {}), ...this.#establishedStatus(crd) };
    return this.#commitUpdate(rt, crd, next, { status: true, manager: 'kube-apiserver' });
  }

  /** registry/customresourcedefinition/etcd.go Delete: mark, add the cleanup finalizer, say Terminating; the finalizer does the rest. */
  #deleteCrd(rt: ResourceType, old: KubeObject): KubeObject {
    if (old.metadata.deletionTimestamp) {
      if (old.metadata.finalizers?.length) return clone(old);
      this.#commitDelete(rt, old);
      return clone(old);
    }
    let next = clone(old);
    next.metadata.deletionTimestamp = now();
    if (!next.metadata.finalizers?.includes(CRD_CLEANUP_FINALIZER)) next.metadata.finalizers = [...(next.metadata.finalizers ?? []), CRD_CLEANUP_FINALIZER];
    next = this.#withCondition(next, {
      type: 'Terminating',
      status: 'True',
      reason: 'InstanceDeletionPending',
      message: 'CustomResourceDefinition marked for deletion; CustomResource deletion will begin soon',
    });
    const out = this.#commitUpdate(rt, old, next);
    this.#later(0, () => this.#finalizeCrd(old.metadata.name!, Date.now()));
    return out;
  }

  #later(ms: number, fn: () => void): void {
    if (this.#stopped) return;
    const t = setTimeout(() => {
      this.#timers.delete(t);
      if (!this.#stopped) fn();
    }, ms);
    this.#timers.add(t);
  }

  /** One pass of controller/finalizer/crd_finalizer.go sync for the CRD `name`, first run at `started`. */
  #finalizeCrd(name: string, started: number): void {
    const crdType = typeByName('customresourcedefinitions');
    const crd = this.#crd(name);
    if (!crd?.metadata.deletionTimestamp || !crd.metadata.finalizers?.includes(CRD_CLEANUP_FINALIZER)) return;
    let cur = this.#commitUpdate(crdType, crd, this.#withCondition(crd, { type: 'Terminating', status: 'True', reason: 'InstanceDeletionInProgress', message: 'CustomResource deletion is in progress' }), { status: true, manager: 'kube-apiserver' });
    const cr = TYPES.find((t) => !t.builtin && qualified(t) === name);
    let done: { status: string; reason: string; message: string };
    if (!cr || this.#crdCondition(name, 'Established') !== 'True') {
      done = { status: 'False', reason: 'NeverEstablished', message: 'resource was never established' };
    } else {
      // DeleteCollection: each object deleted as a DELETE would (one with finalizers only marked).
      for (const o of this.#objectsOf(cr, undefined)) {
        try {
          this.#delete(cr, o.metadata.namespace, o.metadata.name!, undefined);
        } catch {
          // gone meanwhile
        }
      }
      if (this.#objectsOf(cr, undefined).length > 0) {
        // Polled (the first check is at once); after a minute the pass fails and is requeued.
        if (Date.now() - started < 60_000) {
          this.#later(this.#crdCleanupPollMs, () => this.#finalizeCrd(name, started));
          return;
        }
        const left = this.#objectsOf(cr, undefined).length;
        this.#commitUpdate(crdType, cur, this.#withCondition(cur, { type: 'Terminating', status: 'True', reason: 'InstanceDeletionCheck', message: `could not confirm zero CustomResources remaining: ${left} left` }), { status: true });
        this.#later(this.#crdCleanupPollMs, () => this.#finalizeCrd(name, Date.now()));
        return;
      }
      done = { status: 'False', reason: 'InstanceDeletionCompleted', message: 'removed all instances' };
    }
    cur = this.#crd(name)!;
    const next = this.#withCondition(cur, { type: 'Terminating', ...done });
    next.metadata.finalizers = (next.metadata.finalizers ?? []).filter((f) => f !== CRD_CLEANUP_FINALIZER);
    // The last finalizer gone, the update deletes the CRD.
    this.#commitUpdate(crdType, cur, next, { status: true, manager: 'kube-apiserver' });
    if (!this.#crd(name)) this.#tearDown(name);
  }

  /**
   * crdHandler.tearDown: a second after the CRD is gone, its type's storage
   * stops, and with it every watch opened on it (a clean end), even if the
   * CRD was created again meanwhile (that one has a storage of its own).
   */
  #tearDown(crdName: string): void {
    const cr = TYPES.find((t) => !t.builtin && qualified(t) === crdName);
    if (!cr) return;
    const opened = [...this.#watches].filter((w) => w.rt === cr);
    this.#later(this.#crdTeardownMs, () => {
      for (const w of opened) {
        if (!this.#watches.has(w)) continue;
        this.#closeWatch(w);
        w.res.end();
      }
    });
  }

  /**
   * A list, paginated as etcd3's store and the cacher page it: `limit`
   * items at most, in key order, and a continue token when keys remain
   * after the last one (matching the selectors or not, as etcd's `More`);
   * every page of one list is read at the first page's resourceVersion,
   * which each page reports; remainingItemCount only without selectors.
   * A token whose resourceVersion was compacted is 410 Expired, with a
   * token that continues at the latest resourceVersion. resourceVersion=0
   * is served from the watch cache, which ignores limit; resourceVersion=N
   * with limit is a list at exactly N (the legacy rule of
   * storage.ValidateListOptions).
   */
  #list(rt: ResourceType, namespace: string | undefined, query: Record<string, string>): JsonMap {
    const labels = parseLabelSelector(query.labelSelector ?? '');
    const fields = parseFieldSelector(rt, query.fieldSelector ?? '');
    const rvParam = query.resourceVersion ?? '';
    const token = query.continue ?? '';
    if (query.limit !== undefined && !/^-?[0-9]+$/.test(query.limit)) throw badRequest(`limit: invalid value ${JSON.stringify(query.limit)}`);
    let limit = query.limit === undefined ? 0 : Number(query.limit);
    let atRv: number | undefined;
    let startKey: string | undefined;
    if (token !== '') {
      const c = decodeContinue(token);
      if (rvParam !== '' && rvParam !== '0') throw badRequest('specifying resource version is not allowed when using continue');
      if (c.rv > 0) atRv = c.rv;
      startKey = c.startKey;
    } else if (rvParam === '0') {
      limit = 0;
    } else if (rvParam !== '') {
      if (!/^[0-9]+$/.test(rvParam)) throw badRequest(`invalid resource version: ${JSON.stringify(rvParam)}`);
      if (limit > 0) atRv = Number(rvParam);
    }
    const listRv = atRv ?? this.#rv;
    // Keys as etcd3 stores them below the resource's prefix: namespace/name, or name.
    const keyOf = (o: KubeObject) => (rt.namespaced && namespace === undefined ? `${o.metadata.namespace}/${o.metadata.name}` : String(o.metadata.name));
    let objects = atRv === undefined ? this.#objectsOf(rt, namespace) : this.#objectsAt(rt, namespace, atRv, token);
    if (startKey !== undefined) objects = objects.filter((o) => keyOf(o) >= startKey);
    const page: KubeObject[] = [];
    let last = -1;
    for (let i = 0; i < objects.length && (limit <= 0 || page.length < limit); i++) {
      const o = objects[i]!;
      last = i;
      if (labelsMatch(labels, o.metadata.labels) && fieldsMatch(fields, o)) page.push(o);
    }
    const metadata: JsonMap = { resourceVersion: String(listRv) };
    const remaining = objects.length - (last + 1);
    if (limit > 0 && remaining > 0) {
      metadata.continue = encodeContinue(`${keyOf(objects[last]!)}\u0000`, listRv);
      if (labels.length === 0 && fields.length === 0) metadata.remainingItemCount = remaining;
    }
    const items = page.map((o) => {
      if (!rt.builtin) return o;
      const { apiVersion: _a, kind: _k, ...rest } = o;
      return rest;
    });
    return { kind: `${rt.kind}List`, apiVersion: apiVersionOf(rt), metadata, items };
  }

  /**
   * The objects of a type as they were at resourceVersion `rv`, in key
   * order: today's, with every later change in the history undone. 410
   * Expired when the history no longer reaches back that far.
   */
  #objectsAt(rt: ResourceType, namespace: string | undefined, rv: number, token: string): KubeObject[] {
    if (rv < this.#compactedRv) {
      if (token === '') throw failure(410, 'Expired', 'The resourceVersion for the provided list is too old.');
      const err = failure(410, 'Expired', INCONSISTENT_CONTINUE);
      const { startKey } = decodeContinue(token);
      err.status.metadata = { continue: encodeContinue(startKey, -1) };
      throw err;
    }
    const at = new Map(this.#bucket(rt));
    for (let i = this.#history.length - 1; i >= 0; i--) {
      const ev = this.#history[i]!;
      if (ev.rv <= rv) break;
      if (ev.plural !== rt.plural) continue;
      const key = objectKey(ev.object.metadata.namespace, ev.object.metadata.name!);
      if (ev.type === 'ADDED') at.delete(key);
      else at.set(key, ev.prev!);
    }
    return [...at.entries()]
      .filter(([, o]) => namespace === undefined || o.metadata.namespace === namespace)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([, o]) => o);
  }

  // ------------------------------------------------------------------- watch

  #matches(w: Watcher, obj: KubeObject): boolean {
    return (
      (w.namespace === undefined || obj.metadata.namespace === w.namespace) &&
      labelsMatch(w.labels, obj.metadata.labels) &&
      fieldsMatch(w.fields, obj)
    );
  }

  /** What a watcher sees of a change, as the watch cache's cacheWatcher.convertToWatchEvent decides. */
  #convert(w: Watcher, ev: HistoryEvent): WatchEvent | undefined {
    const cur = ev.type !== 'DELETED' && this.#matches(w, ev.object);
    const prev = ev.prev !== undefined && this.#matches(w, ev.prev);
    if (cur) return { type: prev ? 'MODIFIED' : 'ADDED', object: ev.object };
    if (prev) return { type: 'DELETED', object: { ...ev.prev, metadata: { ...ev.prev!.metadata, resourceVersion: String(ev.rv) } } };
    return undefined;
  }

  #send(w: Watcher, ev: WatchEvent): void {
    if (w.res.writableEnded || w.res.destroyed) return;
    const counts = (this.watchEvents[w.rt.plural] ??= {});
    counts[ev.type] = (counts[ev.type] ?? 0) + 1;
    let object = ev.object;
    if (w.convert && ev.type !== 'ERROR') {
      // watchEmbeddedEncoder: an object the transformation refuses (the
      // list form asked for on a watch) is logged and sent unchanged.
      try {
        object = transformed(w.convert, w.rt, object, false);
      } catch {
        object = ev.object;
      }
    }
    w.res.write(`${JSON.stringify({ type: ev.type, object })}\n`);
  }

  #bookmark(w: Watcher, annotations?: Record<string, string>, rv: string = this.resourceVersion): WatchEvent {
    const metadata: JsonMap = { resourceVersion: rv };
    if (annotations) metadata.annotations = annotations;
    return { type: 'BOOKMARK', object: { kind: w.rt.kind, apiVersion: apiVersionOf(w.rt), metadata } };
  }

  #closeWatch(w: Watcher): void {
    for (const t of w.timers) clearTimeout(t);
    w.timers = [];
    this.#watches.delete(w);
    this.#unscoped.delete(w);
    if (w.scope === undefined) return;
    const set = this.#scoped.get(w.scope);
    set?.delete(w);
    if (set?.size === 0) this.#scoped.delete(w.scope);
  }

  #watch(rt: ResourceType, namespace: string | undefined, query: Record<string, string>, res: http.ServerResponse, convert?: ConvertTarget): void {
    const rvParam = query.resourceVersion ?? '';
    let since: number | undefined;
    if (rvParam !== '' && rvParam !== '0') {
      if (!/^[0-9]+$/.test(rvParam)) throw badRequest(`invalid resource version: ${JSON.stringify(rvParam)}`);
      since = Number(rvParam);
    }
    // Without timeoutSeconds the server picks minRequestTimeout * (1 + rand)
    // (apiserver endpoints/handlers/get.go: 30 to 60 minutes by default).
    let timeoutMs = this.#minRequestTimeoutMs * (1 + Math.random());
    if (query.timeoutSeconds !== undefined) {
      if (!/^[0-9]+$/.test(query.timeoutSeconds)) throw badRequest(`invalid timeoutSeconds: ${JSON.stringify(query.timeoutSeconds)}`);
      timeoutMs = Number(query.timeoutSeconds) * 1000;
    }
    const w: Watcher = {
      rt,
      namespace,
      labels: parseLabelSelector(query.labelSelector ?? ''),
      fields: parseFieldSelector(rt, query.fieldSelector ?? ''),
      bookmarks: query.allowWatchBookmarks === 'true',
      convert,
      query,
      res,
      timers: [],
      deadline: Date.now() + timeoutMs,
    };
    res.writeHead(200, { 'Content-Type': 'application/json', 'Cache-Control': 'no-cache, private' });
    res.flushHeaders();
    const initial = query.sendInitialEvents === 'true';
    if (since === undefined || initial) {
      for (const o of this.#objectsOf(rt, namespace)) if (this.#matches(w, o)) this.#send(w, { type: 'ADDED', object: o });
      if (initial && w.bookmarks) this.#send(w, this.#bookmark(w, { 'k8s.io/initial-events-end': 'true' }));
    } else if (since < Math.max(this.#compactedRv, this.#watchFloorRv, this.#typeFloorRv.get(rt.plural) ?? 0)) {
      const floor = Math.max(this.#compactedRv, this.#watchFloorRv, this.#typeFloorRv.get(rt.plural) ?? 0);
      const status = failure(410, 'Expired', `too old resource version: ${since} (${floor + 1})`).status;
      this.#send(w, { type: 'ERROR', object: status });
      res.end();
      return;
    } else {
      for (const ev of this.#history) {
        if (ev.rv <= since || ev.plural !== rt.plural) continue;
        const out = this.#convert(w, ev);
        if (out) this.#send(w, out);
      }
    }
    this.#watches.add(w);
    // cacher.go Watch: the scope is the request's namespace and the name its field selector requires exactly.
    const name = exactFieldValue(query.fieldSelector ?? '', 'metadata.name');
    if (name !== undefined && (namespace !== undefined || !rt.namespaced)) {
      w.scope = `${rt.plural}/${objectKey(namespace, name)}`;
      const set = this.#scoped.get(w.scope) ?? new Set<Watcher>();
      set.add(w);
      this.#scoped.set(w.scope, set);
    } else this.#unscoped.add(w);
    res.on('close', () => this.#closeWatch(w));
    if (w.bookmarks) this.#scheduleBookmark(w);
    const timer = setTimeout(() => {
      this.#closeWatch(w);
      res.end();
    }, timeoutMs);
    w.timers.push(timer.unref());
  }

  /**
   * Bookmarks as the watch cache sends them (cacher.go, cache_watcher.go
   * nextBookmarkTime): a watcher that allows them is due one every
   * bookmarkFrequency (1 minute) and one 2 s before its deadline, whichever
   * comes first; a due watcher gets one only if its resource's cache has
   * processed an event since the server started ("Never send a bookmark
   * event if we did not see an event here"), at that event's
   * resourceVersion, and is then due again. So a quiet watch on a resource
   * nothing has touched since the server started gets no bookmark at all.
   */
  #scheduleBookmark(w: Watcher, lastDue = -Infinity): void {
    const now = Date.now();
    const next = Math.min(now + this.#bookmarkIntervalMs, w.deadline - 2000);
    // A timer may fire a millisecond early: the pre-timeout time that just
    // came due is not due again.
    if (next < now || next <= lastDue) return;
    const t = setTimeout(() => {
      w.timers = w.timers.filter((x) => x !== t);
      if (!this.#watches.has(w)) return;
      const rv = this.#lastProcessedRv.get(w.rt.plural);
      if (rv !== undefined) this.#send(w, this.#bookmark(w, undefined, String(rv)));
      this.#scheduleBookmark(w, next);
    }, next - now);
    w.timers.push(t.unref());
  }

  // -------------------------------------------------------------------- HTTP

  #onRequest(req: http.IncomingMessage, res: http.ServerResponse): void {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size <= MAX_BODY_BYTES) chunks.push(chunk);
    });
    req.on('end', () => this.#respond(req, res, Buffer.concat(chunks), size));
  }

  #respond(req: http.IncomingMessage, res: http.ServerResponse, raw: Buffer, size: number): void {
    const url = new URL(req.url ?? '/', this.url);
    const contentType = (req.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase();
    const entry: RecordedRequest = {
      method: req.method ?? 'GET',
      path: url.pathname,
      query: Object.fromEntries(url.searchParams),
      contentType,
      body: undefined,
      status: 0,
      userAgent: req.headers['user-agent'] ?? '',
      accept: req.headers.accept ?? '',
      at: Date.now(),
    };
    this.requests.push(entry);
    try {
      if (this.#token !== undefined && req.headers.authorization !== `Bearer ${this.#token}`) throw failure(401, 'Unauthorized', 'Unauthorized');
      if (size > MAX_BODY_BYTES) throw failure(413, 'RequestEntityTooLarge', 'the request is too large');
      if (raw.length > 0) {
        const text = raw.toString('utf8');
        entry.body = text;
        if (contentType === '' || contentType.includes('json')) {
          try {
            entry.body = JSON.parse(text);
          } catch {
            throw badRequest('the request body is not valid JSON');
          }
        }
      }
      this.#route(entry, res);
    } catch (err) {
      const status = err instanceof KubeStatusError ? err.status : failure(500, 'InternalError', String(err)).status;
      if (!res.headersSent) sendJson(res, status.code, status);
      else res.destroy();
    }
    entry.status = res.statusCode;
  }

  #route(r: RecordedRequest, res: http.ServerResponse): void {
    const { method, query } = r;
    const discovery = this.#discovery(r.path);
    if (discovery !== undefined) {
      if (method !== 'GET') throw failure(405, 'MethodNotAllowed', 'the server does not allow this method on the requested resource');
      if (typeof discovery === 'string') {
        res.writeHead(200, { 'Content-Type': 'text/plain; charset=utf-8' });
        res.end(discovery);
      } else sendJson(res, 200, discovery);
      return;
    }
    const target = parseResourcePath(r.path);
    if (!target || !this.#serves(target.rt)) throw noSuchResource();
    const { rt, namespace, name, sub } = target;
    if (sub !== undefined && (sub !== 'status' || !rt.statusSubresource)) throw notFound(rt, name ?? '');
    const notAllowed = () => failure(405, 'MethodNotAllowed', 'the server does not allow this method on the requested resource');
    // Every handler negotiates first, so a 406 comes before any change;
    // the transformation is applied to the answer, after the change.
    const convert = negotiate(r.accept, rt, this.#partialObjectMetadata);
    const answer = (code: number, body: unknown, list = false) => sendJson(res, code, transformed(convert, rt, body, list));
    if (name === undefined) {
      if (method === 'GET') {
        if (query.watch === 'true' || query.watch === '1') this.#watch(rt, namespace, query, res, convert);
        else answer(200, this.#list(rt, namespace, query), true);
        return;
      }
      if (method === 'POST' && (namespace !== undefined || !rt.namespaced)) return answer(201, this.#create(rt, namespace, r.body, { manager: fieldManagerOf(r) }));
      throw notAllowed();
    }
    const opts = { status: sub === 'status', manager: fieldManagerOf(r) };
    switch (method) {
      case 'GET':
        return answer(200, this.#mustGet(rt, namespace, name));
      case 'PUT':
        return answer(200, this.#update(rt, namespace, name, r.body, opts));
      case 'PATCH':
        return answer(200, this.#patch(rt, namespace, name, r.contentType, r.body, opts));
      case 'DELETE':
        if (sub) throw notAllowed();
        return answer(200, this.#delete(rt, namespace, name, r.body));
      default:
        throw notAllowed();
    }
  }

  #discovery(pathname: string): JsonMap | string | undefined {
    const p = pathname.replace(/\/+$/, '') || '/';
    if (p === '/healthz' || p === '/readyz' || p === '/livez') return 'ok';
    if (p === '/version') return { ...this.#version, platform: 'linux/amd64', goVersion: 'none (in-process test server)' };
    if (p === '/api') return { kind: 'APIVersions', versions: ['v1'], serverAddressByClientCIDRs: [{ clientCIDR: '0.0.0.0/0', serverAddress: new URL(this.url).host }] };
    const served = TYPES.filter((t) => this.#serves(t));
    const groups = [...new Set(served.filter((t) => t.group).map((t) => `${t.group}/${t.version}`))];
    if (p === '/apis') {
      const list = groups.map((gv) => {
        const [name, version] = gv.split('/') as [string, string];
        const v = { groupVersion: gv, version };
        return { name, versions: [v], preferredVersion: v };
      });
      return { kind: 'APIGroupList', apiVersion: 'v1', groups: list };
    }
    const gv = p === '/api/v1' ? 'v1' : p.startsWith('/apis/') ? p.slice('/apis/'.length) : undefined;
    const types = served.filter((t) => apiVersionOf(t) === gv);
    if (types.length === 0) return undefined;
    const resources = types.flatMap((t) => {
      const main = {
        name: t.plural, singularName: t.singular, namespaced: t.namespaced, kind: t.kind,
        verbs: ['create', 'delete', 'get', 'list', 'patch', 'update', 'watch'],
      };
      return t.statusSubresource ? [main, { name: `${t.plural}/status`, singularName: '', namespaced: t.namespaced, kind: t.kind, verbs: ['get', 'patch', 'update'] }] : [main];
    });
    return { kind: 'APIResourceList', apiVersion: 'v1', groupVersion: gv!, resources };
  }
}

/**
 * The field manager of a write: ?fieldManager=, else the product part of the
 * User-Agent (apiserver handlers/rest.go prefixFromUserAgent). At most 128
 * printable characters (ValidateFieldManager).
 */
function fieldManagerOf(r: RecordedRequest): string {
  const given = r.query.fieldManager;
  if (given !== undefined) {
    if (given.length > 128) throw failure(422, 'Invalid', `fieldManager: Too long: may not be more than 128 bytes`);
    if (/[\p{C}]/u.test(given)) throw failure(422, 'Invalid', `fieldManager: Invalid value: ${JSON.stringify(given)}: must only contain printable characters`);
    return given;
  }
  return r.userAgent.split('/')[0]!;
}

function parseResourcePath(pathname: string): { rt: ResourceType; namespace?: string; name?: string; sub?: string } | undefined {
  const seg = pathname.split('/').filter(Boolean).map(decodeURIComponent);
  let group: string;
  let rest: string[];
  if (seg[0] === 'api' && seg.length >= 2) [group, rest] = ['', seg.slice(1)];
  else if (seg[0] === 'apis' && seg.length >= 3) [group, rest] = [seg[1]!, seg.slice(2)];
  else return undefined;
  const version = rest[0];
  rest = rest.slice(1);
  let namespace: string | undefined;
  if (rest[0] === 'namespaces' && rest.length >= 3) {
    namespace = rest[1];
    rest = rest.slice(2);
  }
  if (rest.length < 1 || rest.length > 3) return undefined;
  const rt = TYPES.find((t) => t.group === group && t.version === version && t.plural === rest[0]);
  if (!rt || (namespace !== undefined && !rt.namespaced) || (namespace === undefined && rt.namespaced && rest.length > 1)) return undefined;
  return { rt, namespace, name: rest[1], sub: rest[2] };
}

function sendJson(res: http.ServerResponse, code: number, body: unknown): void {
  const data = JSON.stringify(body);
  res.writeHead(code, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(data) });
  res.end(data);
}
