// A CRI v1 image service in grpc-js that behaves like CRI-O where pins are
// concerned, for integration tests of code that talks CRI.
//
// - Images live in memory; "pulls" come from a catalogue the test defines
//   (reference -> size, optional basic-auth credentials). Errors look like a
//   runtime's: unknown reference -> NOT_FOUND, wrong or missing credentials ->
//   UNKNOWN with "401 Unauthorized" in the text (containerd's wording, see
//   facts/cri-v1-image-service.md).
// - Pins follow CRI-O (internal/storage/image.go, pkg/config/config.go and
//   pkg/config/reload.go): on reload() the drop-in folder is walked in
//   lexical order, every file decoded onto a fresh config, so a later file's
//   crio.image.pinned_images replaces an earlier one; a file that does not
//   decode fails the reload and the old list stays. Image.pinned is true when
//   any of the image's names matches a pattern, case-insensitively. Nothing
//   changes until reload(), as CRI-O needs a SIGHUP.
//   The matching is written here independently of the production pin code:
//   this is the oracle the agent is tested against.
// - Every call is recorded; the AuthConfig of a pull is kept apart from the
//   request so tests can assert which credentials were sent.
// - Failures, delays and a gate that holds pulls can be injected; a pull
//   the client cancels is recorded and never lands.
//
// Protos are loaded with the options the production client uses, so the
// handlers here see and return camelCase field names (repoTags, runtimeHandler).
import * as grpc from '@grpc/grpc-js';
import { loadCriPackage } from '../../src/cri/client.ts';
import { createHash } from 'node:crypto';
import { lstat, mkdtemp, readFile, readdir, rm, unlink } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse as parseToml } from 'smol-toml';

// The wire schema and loader options are the agent's (src/cri/client.ts); the
// pin semantics below are written independently of it.
export { PROTO_PATH } from '../../src/cri/client.ts';

/** CRI-O 1.31's default pause image; CRI-O always pins its pause image. */
export const DEFAULT_PAUSE_IMAGE = 'registry.k8s.io/pause:3.10';

export type CriMethod = 'Version' | 'ListImages' | 'ImageStatus' | 'PullImage' | 'RemoveImage' | 'ImageFsInfo';

export interface CatalogueImage {
  size: number;
  /** Image ID (config digest); default derived from the reference. Two references with one id are one image. */
  id?: string;
  /** Names the stored image gets; default: the reference itself (a digest reference as repo digest, else as tag). */
  repoTags?: string[];
  repoDigests?: string[];
  /** Credentials the "registry" requires for this image. */
  needsAuth?: { username: string; password: string };
}

export interface FakeCrioOptions {
  /** CRI-O's drop-in folder (crio.conf.d); read at start() and on reload(). A missing folder means no drop-ins. */
  dropInDir: string;
  catalogue?: Record<string, CatalogueImage>;
  /** Always pinned, as CRI-O pins its pause image; default DEFAULT_PAUSE_IMAGE. */
  pauseImage?: string;
  /** Runtime handlers PullImage accepts besides ""; default any. */
  runtimeHandlers?: string[];
  /** ImageFsInfo mountpoint; default the fake's own temp folder (a real path, so statfs works on it). */
  imageFsMountpoint?: string;
}

/** CRI AuthConfig as received (camelCase). */
export interface ReceivedAuth {
  username: string;
  password: string;
  auth: string;
  serverAddress: string;
  identityToken: string;
  registryToken: string;
}

export interface RecordedCall {
  method: CriMethod;
  /** The decoded request, without PullImageRequest.auth. */
  request: Record<string, unknown>;
  /** PullImageRequest.auth (null when none was sent); always null for other methods. */
  auth: ReceivedAuth | null;
}

export interface CancelledCall {
  method: CriMethod;
  image: string;
}

export interface InjectedFailure {
  /** How many matching calls fail; default 1. */
  times?: number;
  /** gRPC status code, e.g. grpc.status.UNAVAILABLE. */
  code: number;
  message: string;
}

interface FailureRule extends Required<InjectedFailure> {
  method: CriMethod;
  ref: string | undefined;
}

interface InflightPull {
  cancelled: boolean;
  onCancel: Promise<void>;
  cancel(): void;
}

interface StoredImage {
  id: string;
  repoTags: string[];
  repoDigests: string[];
  size: number;
  runtimeHandler: string;
}

/** The wire shape of runtime.v1.Image, camelCase. */
export interface CriImage {
  id: string;
  repoTags: string[];
  repoDigests: string[];
  size: number;
  uid: null;
  username: string;
  spec: { image: string; annotations: Record<string, string>; userSpecifiedImage: string; runtimeHandler: string; imageRef: string };
  pinned: boolean;
}

interface ImageSpecIn {
  image?: string;
  runtimeHandler?: string;
}

// ---------------------------------------------------------------------------
// Pins, by CRI-O's rules

/**
 * Does a pinned_images pattern match an image name? CRI-O compiles each
 * pattern to a case-insensitive regexp (CompileRegexpsForPinnedImages):
 * "*kw*" is a keyword found anywhere; "prefix*" becomes the regexp
 * "(?i)prefix.*", which Go's MatchString does not anchor, so the prefix may
 * also occur inside a name; anything else must equal the whole name.
 */
export function pinPatternMatches(pattern: string, name: string): boolean {
  const p = pattern.toLowerCase();
  const n = name.toLowerCase();
  if (p === '*') return true;
  if (p.length >= 2 && p.startsWith('*') && p.endsWith('*')) return n.includes(p.slice(1, -1));
  if (p.endsWith('*')) return n.includes(p.slice(0, -1));
  return n === p;
}

/** Byte-wise order of names, as Go's sort.Strings (filepath.Walk) orders them. */
function byteOrder(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a), Buffer.from(b));
}

/**
 * The files CRI-O decodes from its drop-in folder, in order: filepath.Walk
 * (UpdateFromPath) visits entries lexically, depth first, and decodes
 * everything that is not a directory. A missing folder means none.
 */
async function dropInFiles(dir: string): Promise<string[]> {
  const out: string[] = [];
  const walk = async (d: string) => {
    const names = (await readdir(d)).sort(byteOrder);
    for (const name of names) {
      const p = join(d, name);
      const st = await lstat(p);
      if (st.isDirectory()) await walk(p);
      else out.push(p);
    }
  };
  try {
    await lstat(dir);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw err;
  }
  await walk(dir);
  return out;
}

/** pinned_images after decoding every drop-in onto a fresh config; throws like CRI-O on a file it cannot decode. */
export async function readPinnedImages(dropInDir: string): Promise<string[]> {
  let pinned: string[] = [];
  for (const file of await dropInFiles(dropInDir)) {
    const text = await readFile(file, 'utf8');
    let doc: Record<string, unknown>;
    try {
      doc = parseToml(text) as Record<string, unknown>;
    } catch (err) {
      throw new Error(`unable to decode configuration ${file}: ${(err as Error).message}`);
    }
    const crio = doc.crio as Record<string, unknown> | undefined;
    const image = crio?.image as Record<string, unknown> | undefined;
    if (image && 'pinned_images' in image) {
      const list = image.pinned_images;
      if (!Array.isArray(list) || !list.every((x) => typeof x === 'string')) {
        throw new Error(`unable to decode configuration ${file}: crio.image.pinned_images must be an array of strings`);
      }
      // A slice decoded from a later file replaces the earlier one.
      pinned = [...list];
    }
  }
  return pinned;
}

// ---------------------------------------------------------------------------

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

function grpcError(code: number, details: string): Partial<grpc.StatusObject> {
  return { code, details };
}

function imageIdFor(ref: string): string {
  return `sha256:${createHash('sha256').update(`config of ${ref}`).digest('hex')}`;
}

function namesFor(ref: string, entry: CatalogueImage): { repoTags: string[]; repoDigests: string[] } {
  const isDigest = ref.includes('@');
  return {
    repoTags: entry.repoTags ?? (isDigest ? [] : [ref]),
    repoDigests: entry.repoDigests ?? (isDigest ? [ref] : []),
  };
}

function authMatches(auth: ReceivedAuth | null, want: { username: string; password: string }): boolean {
  if (!auth) return false;
  if (auth.username === want.username && auth.password === want.password) return true;
  return auth.auth !== '' && auth.auth === Buffer.from(`${want.username}:${want.password}`).toString('base64');
}

/** The image service stand-in. Create with startFakeCrio(). */
export class FakeCrio {
  readonly dir: string;
  readonly socketPath: string;
  readonly dropInDir: string;
  readonly catalogue: Map<string, CatalogueImage>;
  readonly pauseImage: string;
  readonly imageFsMountpoint: string;
  readonly runtimeHandlers: string[] | undefined;
  /** Every call received, in order. */
  readonly calls: RecordedCall[] = [];
  /** Calls the client cancelled (or that were cut off by stopServing()). */
  readonly cancelled: CancelledCall[] = [];
  /** Successful reloads of the drop-in folder (start() counts as the first). */
  reloadCount = 0;

  #server: grpc.Server | undefined;
  readonly #images = new Map<string, StoredImage>();
  #pinned: string[] = [];
  #failures: FailureRule[] = [];
  #pullDelayMs = 0;
  #gate: { promise: Promise<void>; release: () => void } | undefined;
  readonly #held: string[] = [];
  readonly #inflight = new Set<InflightPull>();
  readonly #pkg: grpc.GrpcObject;

  constructor(dir: string, opts: FakeCrioOptions) {
    this.dir = dir;
    this.socketPath = join(dir, 'crio.sock');
    this.dropInDir = opts.dropInDir;
    this.catalogue = new Map(Object.entries(opts.catalogue ?? {}));
    this.pauseImage = opts.pauseImage ?? DEFAULT_PAUSE_IMAGE;
    this.imageFsMountpoint = opts.imageFsMountpoint ?? dir;
    this.runtimeHandlers = opts.runtimeHandlers;
    this.#pkg = loadCriPackage();
  }

  /** `unix:///abs/path.sock`, the form of --cri-endpoint. */
  get endpoint(): string {
    return `unix://${this.socketPath}`;
  }

  get serving(): boolean {
    return this.#server !== undefined;
  }

  // ---- pins

  /** Re-reads the drop-in folder, as CRI-O does on SIGHUP. Throws (keeping the old list) if a file does not decode. */
  async reload(): Promise<void> {
    this.#pinned = await readPinnedImages(this.dropInDir);
    this.reloadCount++;
  }

  /** The pinned_images list in effect (without the pause image). */
  pinnedPatterns(): string[] {
    return [...this.#pinned];
  }

  isPinned(names: readonly string[]): boolean {
    const patterns = [...this.#pinned, this.pauseImage];
    return names.some((n) => patterns.some((p) => pinPatternMatches(p, n)));
  }

  // ---- image store

  /** The stored images as ListImages reports them. */
  images(): CriImage[] {
    return [...this.#images.values()].map((img) => this.#toCri(img));
  }

  /** The stored image a reference or id names (runtime handler ""), as ImageStatus reports it, or null. */
  image(ref: string, runtimeHandler = ''): CriImage | null {
    const img = this.#find(ref, runtimeHandler);
    return img ? this.#toCri(img) : null;
  }

  /** Puts a catalogue image in the store without a PullImage call (an image already on the node). */
  preload(ref: string, runtimeHandler = ''): void {
    const entry = this.catalogue.get(ref);
    if (!entry) throw new Error(`preload: ${ref} is not in the catalogue`);
    this.#store(ref, entry, runtimeHandler);
  }

  /** Drops an image from the store (as if garbage-collected). */
  evict(ref: string, runtimeHandler = ''): boolean {
    const img = this.#find(ref, runtimeHandler);
    if (!img) return false;
    this.#images.delete(this.#key(img.id, img.runtimeHandler));
    return true;
  }

  /** PullImage calls (optionally for one reference) received so far. */
  pullCount(ref?: string): number {
    return this.calls.filter((c) => c.method === 'PullImage' && (ref === undefined || (c.request.image as ImageSpecIn | null)?.image === ref)).length;
  }

  // ---- fault injection

  /** The next `times` calls of `method` (for PullImage: of `ref`, if given) fail with code and message. */
  failCalls(method: CriMethod, failure: InjectedFailure & { ref?: string }): void {
    this.#failures.push({ method, ref: failure.ref, times: failure.times ?? 1, code: failure.code, message: failure.message });
  }

  /** The next `times` pulls of ref fail with code and message. */
  failPulls(ref: string, failure: InjectedFailure): void {
    this.failCalls('PullImage', { ...failure, ref });
  }

  /** Every pull waits this long before doing anything. */
  delayPulls(ms: number): void {
    this.#pullDelayMs = ms;
  }

  /** From now on pulls wait at the gate until releasePulls(). */
  holdPulls(): void {
    if (this.#gate) return;
    let release!: () => void;
    const promise = new Promise<void>((r) => (release = r));
    this.#gate = { promise, release };
  }

  releasePulls(): void {
    const gate = this.#gate;
    this.#gate = undefined;
    gate?.release();
  }

  /** References of the pulls waiting at the gate now. */
  heldPulls(): string[] {
    return [...this.#held];
  }

  /** Resolves once at least n pulls wait at the gate. */
  async waitForHeldPulls(n: number, timeoutMs = 10_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (this.#held.length < n) {
      if (Date.now() > deadline) throw new Error(`waited ${timeoutMs} ms for ${n} held pulls; ${this.#held.length} held`);
      await sleep(10);
    }
  }

  // ---- serving

  async start(): Promise<void> {
    // CRI-O reads its drop-ins at start and refuses to start on one it cannot decode.
    await this.reload();
    await this.#serve();
  }

  /** The runtime goes away: in-flight calls are cut off, the socket disappears. The store stays. */
  stopServing(): void {
    const server = this.#server;
    this.#server = undefined;
    // Pulls in flight die with the runtime (grpc-js reports the cut-off streams only later).
    for (const pull of this.#inflight) pull.cancel();
    server?.forceShutdown();
  }

  /**
   * The runtime comes back on the same socket path. Like a restarted CRI-O it
   * re-reads its drop-ins first (throwing if one does not decode), unless
   * rereadConfig is false.
   */
  async resume(opts: { rereadConfig?: boolean } = {}): Promise<void> {
    if (this.#server) return;
    if (opts.rereadConfig ?? true) await this.reload();
    await this.#serve();
  }

  /** Stops serving and removes the temp folder. */
  async stop(): Promise<void> {
    this.releasePulls();
    this.stopServing();
    await rm(this.dir, { recursive: true, force: true });
  }

  async #serve(): Promise<void> {
    await unlink(this.socketPath).catch(() => {});
    const server = new grpc.Server();
    const v1 = (this.#pkg.runtime as grpc.GrpcObject).v1 as grpc.GrpcObject;
    const runtimeService = v1.RuntimeService as grpc.ServiceClientConstructor;
    const imageService = v1.ImageService as grpc.ServiceClientConstructor;
    server.addService(runtimeService.service, {
      Version: this.#unary('Version', async () => ({
        version: '0.1.0',
        runtimeName: 'cri-o',
        runtimeVersion: '1.31.0',
        runtimeApiVersion: 'v1',
      })),
    });
    server.addService(imageService.service, {
      ListImages: this.#unary('ListImages', async (req: { filter?: { image?: ImageSpecIn | null } | null }) => {
        const name = req.filter?.image?.image ?? '';
        const images = [...this.#images.values()].filter((img) => name === '' || this.#names(img).includes(name) || this.#idMatches(img, name));
        return { images: images.map((img) => this.#toCri(img)) };
      }),
      ImageStatus: this.#unary('ImageStatus', async (req: { image?: ImageSpecIn | null }) => {
        const img = this.#find(req.image?.image ?? '', req.image?.runtimeHandler ?? '');
        return { image: img ? this.#toCri(img) : null, info: {} };
      }),
      PullImage: this.#unary('PullImage', (req: { image?: ImageSpecIn | null; auth?: ReceivedAuth | null }, call, failure) =>
        this.#pull(req, call, failure),
      ),
      RemoveImage: this.#unary('RemoveImage', async (req: { image?: ImageSpecIn | null }) => {
        // Idempotent, as CRI requires: removing an absent image is not an error.
        const img = this.#find(req.image?.image ?? '', req.image?.runtimeHandler ?? '');
        if (img) this.#images.delete(this.#key(img.id, img.runtimeHandler));
        return {};
      }),
      ImageFsInfo: this.#unary('ImageFsInfo', async () => {
        const used = [...this.#images.values()].reduce((s, img) => s + img.size, 0);
        const usage = {
          timestamp: String(BigInt(Date.now()) * 1_000_000n),
          fsId: { mountpoint: this.imageFsMountpoint },
          usedBytes: { value: used },
          inodesUsed: { value: this.#images.size },
        };
        return { imageFilesystems: [usage], containerFilesystems: [] };
      }),
    });
    await new Promise<void>((resolveBind, reject) =>
      server.bindAsync(this.endpoint, grpc.ServerCredentials.createInsecure(), (err) => (err ? reject(err) : resolveBind())),
    );
    this.#server = server;
  }

  #unary<Req extends object>(
    method: CriMethod,
    handle: (req: Req, call: grpc.ServerUnaryCall<Req, unknown>, failure: FailureRule | undefined) => Promise<unknown>,
  ): grpc.handleUnaryCall<Req, unknown> {
    return (call, callback) => {
      const req = call.request;
      const { auth, ...rest } = req as Req & { auth?: ReceivedAuth | null };
      this.calls.push({ method, request: structuredClone(rest) as Record<string, unknown>, auth: method === 'PullImage' ? (auth ?? null) : null });
      const failure = this.#takeFailure(method, (req as { image?: ImageSpecIn | null }).image?.image);
      // Pulls check injected failures themselves, after any delay or gate.
      if (failure && method !== 'PullImage') {
        callback(grpcError(failure.code, failure.message));
        return;
      }
      handle(req, call, failure).then(
        (res) => callback(null, res),
        (err: Partial<grpc.StatusObject>) => callback(err),
      );
    };
  }

  #takeFailure(method: CriMethod, ref: string | undefined): FailureRule | undefined {
    const i = this.#failures.findIndex((f) => f.method === method && (f.ref === undefined || f.ref === '*' || f.ref === ref));
    if (i < 0) return undefined;
    const rule = this.#failures[i]!;
    if (--rule.times <= 0) this.#failures.splice(i, 1);
    return rule;
  }

  async #pull(
    req: { image?: ImageSpecIn | null; auth?: ReceivedAuth | null },
    call: grpc.ServerUnaryCall<unknown, unknown>,
    injected: FailureRule | undefined,
  ): Promise<unknown> {
    const ref = req.image?.image ?? '';
    const handler = req.image?.runtimeHandler ?? '';
    let answered = false;
    let resolveCancel!: () => void;
    const pull: InflightPull = {
      cancelled: false,
      onCancel: new Promise<void>((r) => (resolveCancel = r)),
      cancel: () => {
        if (answered || pull.cancelled) return;
        pull.cancelled = true;
        this.cancelled.push({ method: 'PullImage', image: ref });
        resolveCancel();
      },
    };
    // grpc-js also emits 'cancelled' after a call's status went out; only a
    // cancel before the answer is the client (or a shutdown) cutting it off.
    call.on('cancelled', () => pull.cancel());
    if (call.cancelled) pull.cancel();
    this.#inflight.add(pull);
    try {
      return await this.#pullAfterWaits(ref, handler, req.auth ?? null, injected, pull);
    } finally {
      answered = true;
      this.#inflight.delete(pull);
    }
  }

  async #pullAfterWaits(
    ref: string,
    handler: string,
    auth: ReceivedAuth | null,
    injected: FailureRule | undefined,
    pull: InflightPull,
  ): Promise<unknown> {
    if (this.#pullDelayMs > 0) await Promise.race([sleep(this.#pullDelayMs), pull.onCancel]);
    const gate = this.#gate;
    if (gate && !pull.cancelled) {
      this.#held.push(ref);
      await Promise.race([gate.promise, pull.onCancel]);
      this.#held.splice(this.#held.indexOf(ref), 1);
    }
    // A cancelled pull never lands; the client is gone, so the answer is moot.
    if (pull.cancelled) throw grpcError(grpc.status.CANCELLED, 'context canceled');

    if (injected) throw grpcError(injected.code, injected.message);
    if (ref === '') throw grpcError(grpc.status.INVALID_ARGUMENT, 'image spec is empty');
    if (handler !== '' && this.runtimeHandlers && !this.runtimeHandlers.includes(handler)) {
      throw grpcError(grpc.status.UNKNOWN, `failed to pull image "${ref}": runtime handler "${handler}" is not configured`);
    }
    const entry = this.catalogue.get(ref);
    if (!entry) {
      throw grpcError(grpc.status.NOT_FOUND, `failed to pull and unpack image "${ref}": failed to resolve reference "${ref}": ${ref}: not found`);
    }
    if (entry.needsAuth && !authMatches(auth, entry.needsAuth)) {
      const host = ref.split('/')[0];
      throw grpcError(
        grpc.status.UNKNOWN,
        `failed to pull and unpack image "${ref}": failed to resolve reference "${ref}": unexpected status from HEAD request to https://${host}/v2/: 401 Unauthorized`,
      );
    }
    const img = this.#store(ref, entry, handler);
    return { imageRef: img.id };
  }

  #key(id: string, runtimeHandler: string): string {
    return `${runtimeHandler}\u0000${id}`;
  }

  #store(ref: string, entry: CatalogueImage, runtimeHandler: string): StoredImage {
    const id = entry.id ?? imageIdFor(ref);
    const names = namesFor(ref, entry);
    const key = this.#key(id, runtimeHandler);
    const existing = this.#images.get(key);
    if (existing) {
      for (const t of names.repoTags) if (!existing.repoTags.includes(t)) existing.repoTags.push(t);
      for (const d of names.repoDigests) if (!existing.repoDigests.includes(d)) existing.repoDigests.push(d);
      return existing;
    }
    const img: StoredImage = { id, ...names, size: entry.size, runtimeHandler };
    this.#images.set(key, img);
    return img;
  }

  #names(img: StoredImage): string[] {
    return [...img.repoDigests, ...img.repoTags];
  }

  #idMatches(img: StoredImage, s: string): boolean {
    return s === img.id || `sha256:${s}` === img.id;
  }

  #find(ref: string, runtimeHandler: string): StoredImage | undefined {
    if (ref === '') return undefined;
    for (const img of this.#images.values()) {
      if (img.runtimeHandler !== runtimeHandler) continue;
      if (this.#idMatches(img, ref) || this.#names(img).includes(ref)) return img;
    }
    return undefined;
  }

  #toCri(img: StoredImage): CriImage {
    return {
      id: img.id,
      repoTags: [...img.repoTags],
      repoDigests: [...img.repoDigests],
      size: img.size,
      uid: null,
      username: '',
      spec: { image: img.id, annotations: {}, userSpecifiedImage: '', runtimeHandler: img.runtimeHandler, imageRef: '' },
      pinned: this.isPinned(this.#names(img)),
    };
  }
}

/** Creates a temp folder, reads the drop-ins and serves on `<tmp>/crio.sock`. Stop with stop(). */
export async function startFakeCrio(opts: FakeCrioOptions): Promise<FakeCrio> {
  const crio = new FakeCrio(await mkdtemp(join(tmpdir(), 'pinset-fake-crio-')), opts);
  try {
    await crio.start();
  } catch (err) {
    await crio.stop();
    throw err;
  }
  return crio;
}
