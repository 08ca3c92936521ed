// containerd's twin for integration tests: one grpc-js server on a unix
// socket serving the CRI v1 image service subset the agent calls
// (RuntimeService.Version; ImageService ListImages, ImageStatus, PullImage,
// RemoveImage, ImageFsInfo) AND containerd's own Images service (Get, List,
// Update) in namespaces named by the gRPC metadata `containerd-namespace`,
// as containerd serves both on /run/containerd/containerd.sock. Each
// behaviour below was observed on a real containerd (issue 18; 1.6.20 and
// 1.7.24 again here, in test/support/containerd-behaviour.ts, which runs the
// same assertions against this twin and the real daemons).
//
// - Image records, as containerd's metadata store keeps them: a name, labels
//   and a target descriptor, per namespace. CRI's namespace is k8s.io. A CRI
//   pull by a reference stores up to three records of one target: the
//   image ID `sha256:<config digest>` (what PullImage answers and CRI calls
//   Image.id), the tag (a pull by tag) and `repo@<manifest digest>`. The
//   pulled reference's record is REWRITTEN in full (client.Pull's
//   Images.Update without a mask): its labels become
//   {io.cri-containerd.image: managed}, any other label wiped. The other
//   records are created when absent, else only their target and the managed
//   label are set: their labels survive (pkg/cri/server/image_pull.go
//   createImageReference). CRI shows an image's tag and digest records as
//   repo_tags and repo_digests, never its ID record.
// - Images.Update (metadata/images.go): with an update_mask, `labels.<key>`
//   writes that one label (an empty value deletes it), `labels` all labels,
//   `target` the target, `annotations[.<key>]` the target's annotations,
//   anything else is INVALID_ARGUMENT; without one the record is replaced.
//   A label's key and value together may not pass 4096 bytes. An Update
//   whose image has no `target` KILLS containerd 1.7 and 2.x (a nil
//   dereference in services/images/helpers.go, no recovery): the twin dies
//   too (its clients see UNAVAILABLE "Connection dropped", as from the real
//   one), and records it in `updatesWithoutTarget`, so a test can assert no
//   such request was ever sent. 1.6 accepts it.
// - Errors as the real ones word them: a missing namespace is
//   FAILED_PRECONDITION "namespace is required: failed precondition"; an
//   unknown record NOT_FOUND `image "<name>": not found`; a filter that does
//   not parse INVALID_ARGUMENT "filters: parse error: ...". List filters
//   follow containerd's filter syntax for images (name, target.digest,
//   target.mediatype, labels.<key>, annotations.<key>; ==, !=, ~= or
//   presence; a key with other characters than [A-Za-z0-9_] is quoted:
//   labels."pinset.dev/pinned"; `,` is AND within a filter, the filters of a
//   request are ORed).
// - CRI `pinned` by version (pkg/cri/store/image): from 1.6.25, 1.7.10 and
//   in 2.x an image is pinned while any of its records carries exactly
//   io.cri-containerd.pinned=pinned, following a label change `pinDelayMs`
//   later (event-driven; 3-8 ms measured on 1.7.24). 1.6.22-1.6.24 and
//   1.7.3-1.7.9 fix an image's flag when it enters the CRI cache (at its
//   first pull, or at a start, from the record that sorts first) and ignore
//   label changes after that. Up to 1.6.21 and 1.7.2, never pinned. The
//   sandbox image is labelled pinned by its pull (where labels pin).
// - RemoveImage removes every record of the image, pinned or not (only the
//   kubelet's GC honours pins). Records and labels live on across
//   stopServing()/resume() (containerd's bolt store); the CRI cache is
//   rebuilt at each start.
// - Faults: Update (or any Images call) failures can be injected; every
//   Images call is recorded.
//
// Written independently of the agent's code (src/containerd): this is the
// oracle the agent is tested against. The CRI side reads proto/cri-image.proto
// and the Images side proto/containerd-images.proto, through
// @grpc/proto-loader, with the options the agent's clients use.
import { createHash } from 'node:crypto';
import { createServer, type Server as NetServer, type Socket } from 'node:net';
import { mkdtemp, rm, unlink } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { loadCriPackage } from './cri-proto.ts';
import { imagesServiceClient } from './containerd-proto.ts';

export const CRI_NAMESPACE = 'k8s.io';
export const PINNED_LABEL = 'io.cri-containerd.pinned';
export const PINNED_VALUE = 'pinned';
export const CRI_IMAGE_LABEL = 'io.cri-containerd.image';
export const MEDIA_TYPE_MANIFEST = 'application/vnd.oci.image.manifest.v1+json';
/** containerd's labels.Validate: key and value together. */
export const MAX_LABEL_SIZE = 4096;

/** How a containerd version treats the pin label (pkg/cri/store/image). */
export type PinBehaviour = 'live' | 'fixed-at-entry' | 'never';

/** Parses "1.7.24", "v1.7.24", "1.7.24~ds1"; null for anything else. */
function parseVersion(v: string): [number, number, number] | null {
  const m = /^v?(\d+)\.(\d+)\.(\d+)/.exec(v.trim());
  return m ? [Number(m[1]), Number(m[2]), Number(m[3])] : null;
}

/** The pin behaviour of a containerd version, as issue 18 found it (1.6.20, 1.6.39, 1.7.9, 1.7.24, 1.7.29, 2.1.5). */
export function pinBehaviourOf(version: string): PinBehaviour {
  const v = parseVersion(version);
  if (!v) throw new Error(`not a containerd version: ${version}`);
  const [major, minor, patch] = v;
  if (major >= 2) return 'live';
  if (major < 1 || minor < 6) return 'never';
  if (minor === 6) return patch >= 25 ? 'live' : patch >= 22 ? 'fixed-at-entry' : 'never';
  if (minor === 7) return patch >= 10 ? 'live' : patch >= 3 ? 'fixed-at-entry' : 'never';
  return 'live';
}

/** Whether an Update without image.target kills this version (1.7 and 2.x). */
export function diesOnUpdateWithoutTarget(version: string): boolean {
  const v = parseVersion(version);
  if (!v) throw new Error(`not a containerd version: ${version}`);
  return v[0] >= 2 || (v[0] === 1 && v[1] >= 7);
}

/** What the "registry" serves for a reference (fully qualified, by tag or by digest). */
export interface CatalogueImage {
  size: number;
  /** For a tag: the manifest digest it resolves to (default derived from the reference). Ignored for a digest reference. */
  digest?: string;
  /** The config digest, `sha256:<64 hex>` (default derived from the manifest digest: one manifest, one image). */
  id?: string;
  /** Credentials the "registry" requires. */
  needsAuth?: { username: string; password: string };
}

export interface FakeContainerdOptions {
  /** containerd's version, e.g. '1.7.24' (default), '1.6.20', '1.7.9', '2.1.5'; CRI Version answers it as runtime_version. */
  version?: string;
  catalogue?: Record<string, CatalogueImage>;
  /** CRI's sandbox image: its pulls are labelled pinned. */
  sandboxImage?: string;
  /** How long after a label change CRI's `pinned` follows it; default 5 ms. */
  pinDelayMs?: number;
  /** ImageFsInfo's mountpoint; default the twin's temp folder. */
  imageFsMountpoint?: string;
}

export interface Descriptor {
  mediaType: string;
  digest: string;
  size: number;
  annotations: Record<string, string>;
}

/** An image record as containerd's metadata store holds it. */
export interface ImageRecord {
  name: string;
  labels: Record<string, string>;
  target: Descriptor;
  createdAt: number;
  updatedAt: number;
}

export type ImagesMethod = 'Get' | 'List' | 'Update';

export interface ImagesCall {
  method: ImagesMethod;
  namespace: string | undefined;
  request: Record<string, any>;
  /** gRPC status code answered (undefined when the twin died on it). */
  code?: number;
}

export interface UpdateWithoutTarget {
  name: string;
  namespace: string | undefined;
  paths: string[];
  /** The version died of it (1.7, 2.x). */
  died: boolean;
}

export interface InjectedFailure {
  /** How many matching calls fail; default 1. */
  times?: number;
  code: number;
  message: string;
  /** Only calls naming this image (Get, Update). */
  name?: string;
}

interface FailureRule {
  method: ImagesMethod;
  times: number;
  code: number;
  message: string;
  name: string | undefined;
}

/** The wire shape of runtime.v1.Image, camelCase. */
export interface CriImage {
  id: string;
  repoTags: string[];
  repoDigests: string[];
  size: number;
  uid: null;
  username: string;
  spec: null;
  pinned: boolean;
}

interface Content {
  /** `sha256:<hex>` of the config. */
  id: string;
  size: number;
}

const hexOf = (text: string) => createHash('sha256').update(text).digest('hex');

function grpcError(code: number, details: string): Partial<grpc.StatusObject> {
  return { code, details };
}

interface Ref {
  repo: string;
  tag?: string;
  digest?: string;
}

/** `host/path:tag` or `host/path@sha256:...`; null for anything else (an image ID, a bare name). */
function parseRef(s: string): Ref | null {
  const at = s.indexOf('@');
  if (at > 0) return { repo: s.slice(0, at), digest: s.slice(at + 1) };
  const slash = s.lastIndexOf('/');
  const colon = s.lastIndexOf(':');
  if (colon > slash && slash > 0) return { repo: s.slice(0, colon), tag: s.slice(colon + 1) };
  return null;
}

function byteOrder(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a), Buffer.from(b));
}

// ---------------------------------------------------------------------------
// containerd's filter syntax (pkg/filters), as far as image records need it

type Selector = { path: string[]; op?: '==' | '!=' | '~='; value?: string };

class FilterParseError extends Error {}

/** One filter string: selectors joined by ','. Throws FilterParseError as containerd refuses. */
export function parseFilter(input: string): Selector[] {
  let i = 0;
  const fail = (why: string): never => {
    throw new FilterParseError(`filters: parse error: [${input.slice(0, i)} >|${input.slice(i, i + 1)}|< ${input.slice(i + 1)}]: ${why}: invalid argument`);
  };
  const quoted = (): string => {
    const q = input[i]!;
    i++;
    let out = '';
    while (i < input.length && input[i] !== q) {
      if (input[i] === '\\' && i + 1 < input.length) i++;
      out += input[i++];
    }
    if (i >= input.length) {
      i--;
      fail('quoted literal not terminated');
    }
    i++;
    return out;
  };
  const field = (): string => {
    if (input[i] === '"' || input[i] === '`') return quoted();
    const m = /^[A-Za-z0-9_]+/.exec(input.slice(i));
    if (!m) return fail('expected field or quoted');
    i += m[0].length;
    return m[0];
  };
  const selectors: Selector[] = [];
  for (;;) {
    const path = [field()];
    while (input[i] === '.') {
      i++;
      path.push(field());
    }
    const sel: Selector = { path };
    if (i < input.length && input[i] !== ',') {
      const op = input.slice(i, i + 2);
      if (op !== '==' && op !== '!=' && op !== '~=') fail('expected an operator ("=="|"!="|"~=")');
      sel.op = op as Selector['op'];
      i += 2;
      if (input[i] === '"' || input[i] === '`') sel.value = quoted();
      else {
        const m = /^[^,"`]*/.exec(input.slice(i))!;
        if (m[0] === '') fail('expected value or quoted');
        sel.value = m[0];
        i += m[0].length;
      }
    }
    selectors.push(sel);
    if (i >= input.length) return selectors;
    if (input[i] !== ',') fail('expected a separator or EOF');
    i++;
  }
}

/** metadata/adaptors.go adaptImage: the value at a field path, and whether it is there. */
function imageField(r: ImageRecord, path: string[]): { value: string; present: boolean } {
  const none = { value: '', present: false };
  const [head, ...rest] = path;
  switch (head) {
    case 'name':
      return { value: r.name, present: r.name !== '' };
    case 'target':
      if (rest[0] === 'digest') return { value: r.target.digest, present: r.target.digest !== '' };
      if (rest[0] === 'mediatype') return { value: r.target.mediaType, present: r.target.mediaType !== '' };
      return none;
    case 'labels':
    case 'annotations': {
      const map = head === 'labels' ? r.labels : r.target.annotations;
      const key = rest.join('.');
      return key in map ? { value: map[key]!, present: true } : none;
    }
    default:
      return none;
  }
}

function matches(r: ImageRecord, selectors: Selector[]): boolean {
  return selectors.every((s) => {
    const { value, present } = imageField(r, s.path);
    if (!s.op) return present;
    if (!present) return false;
    if (s.op === '==') return value === s.value;
    if (s.op === '!=') return value !== s.value;
    return new RegExp(s.value!).test(value);
  });
}

// ---------------------------------------------------------------------------

type ProcessState = 'stopped' | 'serving' | 'dead';

/** The twin. Create with startFakeContainerd(). */
export class FakeContainerd {
  readonly dir: string;
  readonly socketPath: string;
  readonly version: string;
  readonly pinBehaviour: PinBehaviour;
  readonly catalogue: Map<string, CatalogueImage>;
  readonly sandboxImage: string | undefined;
  readonly imageFsMountpoint: string;
  pinDelayMs: number;
  /** Every Images call received, in order. */
  readonly imagesCalls: ImagesCall[] = [];
  /** Every CRI call received (method and image reference), in order. */
  readonly criCalls: { method: string; image: string }[] = [];
  /** Every Update whose image carried no target (the agent must never send one). */
  readonly updatesWithoutTarget: UpdateWithoutTarget[] = [];
  /** Pulls that stored content the node did not have. */
  readonly downloads: string[] = [];
  /** How many times the process died (an Update without target on 1.7 or 2.x). */
  deaths = 0;

  #state: ProcessState = 'stopped';
  #server: grpc.Server | undefined;
  /** The "process": a listener on the socket whose connections are handed to the gRPC server, so stopping it drops them as an exit does. */
  #listener: NetServer | undefined;
  readonly #sockets = new Set<Socket>();
  /** namespace -> name -> record: containerd's metadata store, kept across restarts. */
  readonly #records = new Map<string, Map<string, ImageRecord>>();
  /** Manifest digest -> content (the content store). */
  readonly #content = new Map<string, Content>();
  /** CRI's view of `pinned` per image ID, as its cache last learned it. */
  readonly #criPinned = new Map<string, boolean>();
  readonly #timers = new Set<NodeJS.Timeout>();
  #failures: FailureRule[] = [];

  constructor(dir: string, opts: FakeContainerdOptions = {}) {
    this.dir = dir;
    this.socketPath = join(dir, 'containerd.sock');
    this.version = opts.version ?? '1.7.24';
    this.pinBehaviour = pinBehaviourOf(this.version);
    this.catalogue = new Map(Object.entries(opts.catalogue ?? {}));
    this.sandboxImage = opts.sandboxImage;
    this.pinDelayMs = opts.pinDelayMs ?? 5;
    this.imageFsMountpoint = opts.imageFsMountpoint ?? dir;
  }

  /** `unix:///abs/path.sock`, the form of --cri-endpoint. */
  get endpoint(): string {
    return `unix://${this.socketPath}`;
  }

  get serving(): boolean {
    return this.#state === 'serving';
  }

  /** Died of an Update without target (until resume()). */
  get dead(): boolean {
    return this.#state === 'dead';
  }

  // ---- the metadata store, for tests

  #ns(namespace: string): Map<string, ImageRecord> {
    let m = this.#records.get(namespace);
    if (!m) this.#records.set(namespace, (m = new Map()));
    return m;
  }

  /** A copy of a record (namespace k8s.io unless given), or undefined. */
  record(name: string, namespace = CRI_NAMESPACE): ImageRecord | undefined {
    const r = this.#records.get(namespace)?.get(name);
    return r ? structuredClone(r) : undefined;
  }

  /** Every record's name in a namespace, in containerd's (byte) order. */
  recordNames(namespace = CRI_NAMESPACE): string[] {
    return [...(this.#records.get(namespace)?.keys() ?? [])].sort(byteOrder);
  }

  /** Labels a record directly, as `ctr -n k8s.io images label NAME k=v` would (an empty value removes). */
  label(name: string, labels: Record<string, string>, namespace = CRI_NAMESPACE): void {
    const r = this.#records.get(namespace)?.get(name);
    if (!r) throw new Error(`no image record ${name} in ${namespace}`);
    for (const [k, v] of Object.entries(labels)) {
      if (v === '') delete r.labels[k];
      else r.labels[k] = v;
    }
    r.updatedAt = Date.now();
    this.#labelsChanged(namespace);
  }

  /** Puts a catalogue image on the node as a CRI pull would (no PullImage call recorded, no download counted). */
  preload(ref: string): string {
    const entry = this.catalogue.get(ref);
    if (!entry) throw new Error(`preload: ${ref} is not in the catalogue`);
    return this.#storePull(ref, entry).id;
  }

  /** Deletes one record, as `ctr -n k8s.io images rm NAME` does (the image stays while other records name it). */
  removeRecord(name: string, namespace = CRI_NAMESPACE): boolean {
    const gone = this.#records.get(namespace)?.delete(name) ?? false;
    if (gone) this.#labelsChanged(namespace);
    return gone;
  }

  /** Removes the image (every record of it), as CRI RemoveImage or the kubelet's GC would. */
  evict(ref: string): boolean {
    const id = this.#resolve(ref);
    if (!id) return false;
    this.#removeImage(id);
    return true;
  }

  /** The image as CRI ImageStatus reports it, or null. */
  criImage(ref: string): CriImage | null {
    const id = this.#resolve(ref);
    return id ? this.#toCri(id) : null;
  }

  /** What CRI's cache says of `pinned` now (it follows label changes pinDelayMs later). */
  criPinned(ref: string): boolean | undefined {
    const id = this.#resolve(ref);
    return id ? (this.#criPinned.get(id) ?? false) : undefined;
  }

  /** Update calls so far (optionally of one record). */
  updates(name?: string): ImagesCall[] {
    return this.imagesCalls.filter((c) => c.method === 'Update' && (name === undefined || c.request.image?.name === name));
  }

  pullCount(ref?: string): number {
    return this.criCalls.filter((c) => c.method === 'PullImage' && (ref === undefined || c.image === ref)).length;
  }

  // ---- faults

  /** The next `times` calls of an Images method (optionally for one name) fail with code and message. */
  failImagesCalls(method: ImagesMethod, failure: InjectedFailure): void {
    this.#failures.push({ method, times: failure.times ?? 1, code: failure.code, message: failure.message, name: failure.name });
  }

  /** The next `times` Updates fail: containerd refusing the label change (a full disk for its bolt file, a lock timeout). */
  failUpdates(failure: InjectedFailure): void {
    this.failImagesCalls('Update', failure);
  }

  clearFailures(): void {
    this.#failures = [];
  }

  // ---- the process

  async start(): Promise<void> {
    if (this.#state === 'serving') return;
    this.#rebuildCriCache();
    await this.#serve();
    this.#state = 'serving';
  }

  /** containerd stops (a restart's first half, or an outage): calls are cut off, the socket goes. Records persist. */
  stopServing(): void {
    this.#stopProcess('stopped');
  }

  /** containerd starts again on the same socket and store (after stopServing() or a death). */
  async resume(): Promise<void> {
    await this.start();
  }

  /** Stop then start, keeping the store: what a `systemctl restart containerd` does (the real one takes ~0.1 s). */
  async restart(downMs = 50): Promise<void> {
    this.stopServing();
    await new Promise((r) => setTimeout(r, downMs));
    await this.start();
  }

  /** Stops serving and removes the temp folder. */
  async stop(): Promise<void> {
    this.stopServing();
    await rm(this.dir, { recursive: true, force: true });
  }

  /**
   * As the process exits: its connections drop (clients see UNAVAILABLE,
   * not a cancelled call), the listener goes, and with it the socket file.
   */
  #stopProcess(next: ProcessState): void {
    const server = this.#server;
    const listener = this.#listener;
    this.#server = undefined;
    this.#listener = undefined;
    this.#state = next;
    for (const t of this.#timers) clearTimeout(t);
    this.#timers.clear();
    for (const s of this.#sockets) s.destroy();
    this.#sockets.clear();
    listener?.close();
    server?.forceShutdown();
    void unlink(this.socketPath).catch(() => {});
  }

  // ---- CRI's image cache

  /** The image IDs the CRI namespace holds, each with its records. */
  #imagesById(): Map<string, ImageRecord[]> {
    const out = new Map<string, ImageRecord[]>();
    for (const r of this.#records.get(CRI_NAMESPACE)?.values() ?? []) {
      const content = this.#content.get(r.target.digest);
      if (!content) continue;
      let list = out.get(content.id);
      if (!list) out.set(content.id, (list = []));
      list.push(r);
    }
    return out;
  }

  #recordsPin(records: readonly ImageRecord[]): boolean {
    return records.some((r) => r.labels[PINNED_LABEL] === PINNED_VALUE);
  }

  /** At a start, CRI loads every record: 'live' from all of them, 'fixed-at-entry' from the first in byte order. */
  #rebuildCriCache(): void {
    this.#criPinned.clear();
    for (const [id, records] of this.#imagesById()) {
      const first = [...records].sort((a, b) => byteOrder(a.name, b.name))[0]!;
      this.#criPinned.set(id, this.pinBehaviour === 'live' ? this.#recordsPin(records) : this.pinBehaviour === 'fixed-at-entry' ? this.#recordsPin([first]) : false);
    }
  }

  /** A label changed in `namespace`: CRI's event handler catches up pinDelayMs later ('live' only). */
  #labelsChanged(namespace: string | undefined): void {
    if (namespace !== CRI_NAMESPACE || this.pinBehaviour !== 'live') return;
    const apply = () => {
      for (const [id, records] of this.#imagesById()) this.#criPinned.set(id, this.#recordsPin(records));
    };
    if (this.pinDelayMs <= 0) return apply();
    const t = setTimeout(() => {
      this.#timers.delete(t);
      if (this.#state === 'serving') apply();
    }, this.pinDelayMs);
    this.#timers.add(t);
  }

  /** The image ID a CRI reference names: `sha256:<id>` (or a unique prefix of its hex), or a record's name. */
  #resolve(ref: string): string | undefined {
    if (ref === '') return undefined;
    const byId = this.#imagesById();
    const hex = ref.startsWith('sha256:') ? ref.slice(7) : ref;
    if (/^[0-9a-f]{6,64}$/.test(hex)) {
      const found = [...byId.keys()].filter((id) => id.slice(7).startsWith(hex));
      if (found.length === 1) return found[0];
    }
    const r = this.#records.get(CRI_NAMESPACE)?.get(ref);
    return r ? this.#content.get(r.target.digest)?.id : undefined;
  }

  #toCri(id: string): CriImage | null {
    const records = this.#imagesById().get(id);
    if (!records) return null;
    const names = records.map((r) => r.name).filter((n) => n !== id);
    return {
      id,
      repoTags: names.filter((n) => parseRef(n)?.tag !== undefined).sort(),
      repoDigests: names.filter((n) => parseRef(n)?.digest !== undefined).sort(),
      size: Math.max(0, ...records.map((r) => this.#content.get(r.target.digest)?.size ?? 0)),
      uid: null,
      username: '',
      spec: null,
      pinned: this.#criPinned.get(id) ?? false,
    };
  }

  #removeImage(id: string): void {
    const ns = this.#records.get(CRI_NAMESPACE);
    for (const [name, r] of ns ?? []) if (this.#content.get(r.target.digest)?.id === id) ns!.delete(name);
    this.#criPinned.delete(id);
  }

  /** What a CRI pull stores (pkg/cri/server/image_pull.go). */
  #storePull(ref: string, entry: CatalogueImage): { id: string; downloaded: boolean } {
    const parsed = parseRef(ref)!;
    const manifest = parsed.digest ?? entry.digest ?? `sha256:${hexOf(`manifest of ${ref}`)}`;
    const id = entry.id ?? `sha256:${hexOf(`config of ${manifest}`)}`;
    const downloaded = !this.#content.has(manifest);
    const isNew = !this.#imagesById().has(id);
    this.#content.set(manifest, { id, size: entry.size });
    const target: Descriptor = { mediaType: MEDIA_TYPE_MANIFEST, digest: manifest, size: 400 + (entry.size % 97), annotations: {} };
    const labels: Record<string, string> = { [CRI_IMAGE_LABEL]: 'managed' };
    const sandbox = this.sandboxImage !== undefined && ref === this.sandboxImage;
    if (sandbox) labels[PINNED_LABEL] = PINNED_VALUE;
    const ns = this.#ns(CRI_NAMESPACE);
    const now = Date.now();
    // client.Pull: the pulled reference is created, or replaced whole (Update without a mask).
    const old = ns.get(ref);
    ns.set(ref, { name: ref, labels: { ...labels }, target: structuredClone(target), createdAt: old?.createdAt ?? now, updatedAt: now });
    // createImageReference for the image ID, the tag and repo@digest: created
    // when absent; else the target and the managed label set, other labels kept.
    for (const name of [id, parsed.tag !== undefined ? ref : '', `${parsed.repo}@${manifest}`]) {
      if (name === '' || name === ref) continue;
      const existing = ns.get(name);
      if (!existing) {
        ns.set(name, { name, labels: { ...labels }, target: structuredClone(target), createdAt: now, updatedAt: now });
        continue;
      }
      existing.target = structuredClone(target);
      existing.labels[CRI_IMAGE_LABEL] = 'managed';
      if (sandbox) existing.labels[PINNED_LABEL] = PINNED_VALUE;
      existing.updatedAt = now;
    }
    // CRI's cache learns of the pull at once (imageStore.Update per reference).
    const records = this.#imagesById().get(id)!;
    if (this.pinBehaviour === 'live') this.#criPinned.set(id, this.#recordsPin(records));
    else if (this.pinBehaviour === 'fixed-at-entry') {
      if (isNew) this.#criPinned.set(id, this.#recordsPin([ns.get(ref)!]));
    } else this.#criPinned.set(id, false);
    return { id, downloaded };
  }

  // ---- serving

  async #serve(): Promise<void> {
    await unlink(this.socketPath).catch(() => {});
    const server = new grpc.Server();
    const v1 = ((loadCriPackage().runtime as grpc.GrpcObject).v1 as grpc.GrpcObject) as Record<string, grpc.ServiceClientConstructor>;
    server.addService(v1.RuntimeService!.service, {
      Version: this.#cri('Version', async () => ({ version: '0.1.0', runtimeName: 'containerd', runtimeVersion: this.version, runtimeApiVersion: 'v1' })),
    });
    server.addService(v1.ImageService!.service, {
      ListImages: this.#cri('ListImages', async () => ({ images: [...this.#imagesById().keys()].map((id) => this.#toCri(id)) })),
      ImageStatus: this.#cri('ImageStatus', async (req) => {
        const id = this.#resolve(req.image?.image ?? '');
        return { image: id ? this.#toCri(id) : null, info: {} };
      }),
      PullImage: this.#cri('PullImage', async (req) => {
        const ref = req.image?.image ?? '';
        const entry = this.catalogue.get(ref);
        const parsed = parseRef(ref);
        if (!entry || !parsed) throw grpcError(grpc.status.NOT_FOUND, `failed to pull and unpack image "${ref}": failed to resolve reference "${ref}": ${ref}: not found`);
        if (entry.needsAuth) {
          const a = req.auth ?? {};
          const basic = Buffer.from(`${entry.needsAuth.username}:${entry.needsAuth.password}`).toString('base64');
          const ok = (a.username === entry.needsAuth.username && a.password === entry.needsAuth.password) || (a.auth !== undefined && a.auth === basic);
          if (!ok) throw grpcError(grpc.status.UNKNOWN, `failed to pull and unpack image "${ref}": failed to resolve reference "${ref}": pulling from host ${parsed.repo.split('/')[0]} failed with status code [manifests ${parsed.digest ?? parsed.tag}]: 401 Unauthorized`);
        }
        const { id, downloaded } = this.#storePull(ref, entry);
        if (downloaded) this.downloads.push(ref);
        return { imageRef: id };
      }),
      RemoveImage: this.#cri('RemoveImage', async (req) => {
        const id = this.#resolve(req.image?.image ?? '');
        if (id) this.#removeImage(id);
        return {};
      }),
      ImageFsInfo: this.#cri('ImageFsInfo', async () => {
        const usage = { timestamp: String(BigInt(Date.now()) * 1_000_000n), fsId: { mountpoint: this.imageFsMountpoint }, usedBytes: { value: 4096 * (1 + this.#content.size) }, inodesUsed: { value: 1 + this.#content.size } };
        return { imageFilesystems: [usage], containerFilesystems: [] };
      }),
    });
    server.addService(imagesServiceClient().service, {
      Get: this.#images('Get', async (req, ns) => {
        const r = this.#ns(ns).get(req.name ?? '');
        if (!r) throw grpcError(grpc.status.NOT_FOUND, `image "${req.name ?? ''}": not found`);
        return { image: toWire(r) };
      }),
      List: this.#images('List', async (req, ns) => {
        let parsed: Selector[][];
        try {
          parsed = ((req.filters ?? []) as string[]).map(parseFilter);
        } catch (e) {
          if (e instanceof FilterParseError) throw grpcError(grpc.status.INVALID_ARGUMENT, e.message);
          throw e;
        }
        const all = [...this.#ns(ns).values()].sort((a, b) => byteOrder(a.name, b.name));
        return { images: all.filter((r) => parsed.length === 0 || parsed.some((f) => matches(r, f))).map(toWire) };
      }),
      Update: this.#images('Update', async (req, ns) => this.#update(req, ns)),
    });
    const injector = server.createConnectionInjector(grpc.ServerCredentials.createInsecure());
    const listener = createServer((socket) => {
      this.#sockets.add(socket);
      socket.once('close', () => this.#sockets.delete(socket));
      injector.injectConnection(socket);
    });
    await new Promise<void>((resolve, reject) => {
      listener.once('error', reject);
      listener.listen(this.socketPath, () => resolve());
    });
    this.#server = server;
    this.#listener = listener;
  }

  #cri(method: string, handle: (req: any) => Promise<unknown>): grpc.handleUnaryCall<any, unknown> {
    return (call, callback) => {
      if (this.#state !== 'serving') return callback(grpcError(grpc.status.UNAVAILABLE, 'Connection dropped'));
      this.criCalls.push({ method, image: call.request?.image?.image ?? '' });
      handle(call.request).then(
        (res) => callback(null, res),
        (err: Partial<grpc.StatusObject>) => callback(err),
      );
    };
  }

  #images(method: ImagesMethod, handle: (req: any, ns: string) => Promise<unknown>): grpc.handleUnaryCall<any, unknown> {
    return (call, callback) => {
      if (this.#state !== 'serving') return callback(grpcError(grpc.status.UNAVAILABLE, 'Connection dropped'));
      const ns = call.metadata.get('containerd-namespace')[0]?.toString();
      const rec: ImagesCall = { method, namespace: ns, request: structuredClone(call.request) };
      this.imagesCalls.push(rec);
      const answer = (err: Partial<grpc.StatusObject> | null, res?: unknown) => {
        rec.code = err ? err.code : grpc.status.OK;
        callback(err, res);
      };
      if (!ns) return answer(grpcError(grpc.status.FAILED_PRECONDITION, 'namespace is required: failed precondition'));
      const name = method === 'Get' ? call.request.name : method === 'Update' ? call.request.image?.name : undefined;
      const i = this.#failures.findIndex((f) => f.method === method && (f.name === undefined || f.name === name));
      if (i >= 0) {
        const f = this.#failures[i]!;
        if (--f.times <= 0) this.#failures.splice(i, 1);
        return answer(grpcError(f.code, f.message));
      }
      if (method === 'Update' && call.request.image && !call.request.image.target) {
        const died = diesOnUpdateWithoutTarget(this.version);
        this.updatesWithoutTarget.push({ name: call.request.image.name ?? '', namespace: ns, paths: call.request.updateMask?.paths ?? [], died });
        if (died) {
          // panic: runtime error: invalid memory address or nil pointer dereference
          // (services/images/helpers.go descFromProto); the whole daemon exits.
          this.deaths++;
          process.stderr.write(`fake containerd ${this.version}: Images.Update of "${call.request.image.name}" without target: nil pointer dereference; containerd died\n`);
          this.#stopProcess('dead');
          return;
        }
      }
      handle(call.request, ns).then(
        (res) => answer(null, res),
        (err: Partial<grpc.StatusObject>) => answer(err),
      );
    };
  }

  /** services/images/local.go Update and metadata/images.go imageStore.Update. */
  async #update(req: any, ns: string): Promise<unknown> {
    const image = req.image ?? {};
    const name: string = image.name ?? '';
    if (name === '') throw grpcError(grpc.status.INVALID_ARGUMENT, 'Image.Name required');
    const stored = this.#ns(ns).get(name);
    if (!stored) throw grpcError(grpc.status.NOT_FOUND, `image "${name}": not found`);
    const given: ImageRecord = {
      name,
      labels: { ...(image.labels ?? {}) },
      target: { mediaType: image.target?.mediaType ?? '', digest: image.target?.digest ?? '', size: Number(image.target?.size ?? 0), annotations: { ...(image.target?.annotations ?? {}) } },
      createdAt: 0,
      updatedAt: 0,
    };
    const updated = structuredClone(stored);
    const paths: string[] = req.updateMask?.paths ?? [];
    if (paths.length > 0) {
      for (const p of paths) {
        if (p.startsWith('labels.')) {
          const key = p.slice('labels.'.length);
          updated.labels[key] = given.labels[key] ?? '';
        } else if (p.startsWith('annotations.')) {
          const key = p.slice('annotations.'.length);
          updated.target.annotations[key] = given.target.annotations[key] ?? '';
        } else if (p === 'labels') updated.labels = given.labels;
        else if (p === 'target') updated.target = given.target;
        else if (p === 'annotations') updated.target.annotations = given.target.annotations;
        else throw grpcError(grpc.status.INVALID_ARGUMENT, `cannot update "${p}" field on image "${name}": invalid argument`);
      }
    } else {
      updated.labels = given.labels;
      updated.target = given.target;
    }
    for (const [k, v] of Object.entries(updated.labels)) {
      const size = Buffer.byteLength(k) + Buffer.byteLength(v);
      if (size > MAX_LABEL_SIZE) throw grpcError(grpc.status.INVALID_ARGUMENT, `image.Labels: label key and value length (${size} bytes) greater than maximum size (${MAX_LABEL_SIZE} bytes), key: ${k}: invalid argument`);
    }
    if (!/^sha256:[0-9a-f]{64}$/.test(updated.target.digest)) throw grpcError(grpc.status.INVALID_ARGUMENT, `Target.Digest "${updated.target.digest}" invalid: invalid checksum digest format: invalid argument`);
    if (updated.target.size <= 0) throw grpcError(grpc.status.INVALID_ARGUMENT, 'Target.Size must be greater than zero: invalid argument');
    if (updated.target.mediaType === '') throw grpcError(grpc.status.INVALID_ARGUMENT, 'Target.MediaType must be set: invalid argument');
    // boltutil writeMap: an empty value is not stored.
    for (const [k, v] of Object.entries(updated.labels)) if (v === '') delete updated.labels[k];
    for (const [k, v] of Object.entries(updated.target.annotations)) if (v === '') delete updated.target.annotations[k];
    updated.createdAt = stored.createdAt;
    updated.updatedAt = Date.now();
    this.#ns(ns).set(name, updated);
    this.#labelsChanged(ns);
    return { image: toWire(updated) };
  }
}

function timestamp(ms: number): { seconds: number; nanos: number } {
  return { seconds: Math.floor(ms / 1000), nanos: (ms % 1000) * 1_000_000 };
}

function toWire(r: ImageRecord): object {
  return { name: r.name, labels: { ...r.labels }, target: structuredClone(r.target), createdAt: timestamp(r.createdAt), updatedAt: timestamp(r.updatedAt) };
}

/** Creates a temp folder and serves on `<tmp>/containerd.sock`. Stop with stop(). */
export async function startFakeContainerd(opts: FakeContainerdOptions = {}): Promise<FakeContainerd> {
  const c = new FakeContainerd(await mkdtemp(join(tmpdir(), 'pinset-fake-ctrd-')), opts);
  try {
    await c.start();
  } catch (err) {
    await c.stop();
    throw err;
  }
  return c;
}
