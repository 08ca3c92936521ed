// A CRI v1 image service in grpc-js that behaves like CRI-O 1.32 where pins,
// names and reloads are concerned, for integration tests of code that talks
// CRI. Each behaviour below was observed on a real CRI-O 1.32.13
// (facts/crio-pinning.md, "Observed on a real CRI-O") and has a test of its
// own in test/integration/fake-crio.test.ts.
//
// - Images are stored under NAMES, apart from their digests, as
//   containers/storage keeps them. A pull by tag stores `repo:tag` only; a
//   pull by digest stores `repo@digest`; a multi-arch index pulled by its
//   index digest is stored under that one name, with the index and the
//   platform manifest among its digests. ListImages and ImageStatus report
//   repo_digests as every repo among the names times every digest
//   (internal/storage/image.go makeRepoDigests), so they cannot tell which
//   names are stored. ImageStatus of `repo@digest` finds an image whose
//   digests hold that digest and one of whose names has that repo (c/image
//   storage ResolveReference). A pull of content already stored adds the
//   name and downloads no layer (CRI-O fetches the manifest and the config
//   only): `downloads` counts the pulls that stored new content, so tests
//   can assert "no layer downloaded".
// - Pins follow CRI-O (pkg/config, internal/storage/image.go): the drop-in
//   folder is walked as Go's filepath.Walk does (byte order, subfolders where
//   they sort, dotfiles and names without .conf included, symbolic links
//   read through, a dangling link or a link to a folder an error), every
//   file decoded onto one config, a later crio.image.pinned_images replacing
//   an earlier one. Image.pinned is true when a pattern matches one of the
//   image's STORED NAMES (not its repo digests), case-insensitively: `*kw*`
//   anywhere, `prefix*` an unanchored prefix, anything else the whole name.
//   The pause image is always pinned under its configured name.
// - Reloads as systemd drives them: sighup() returns at once (the unit's
//   ExecReload is `kill -HUP $MAINPID`, so the reload job ends when the
//   signal is sent) and the files are re-read 10-40 ms later; until then the
//   old list answers. A file it cannot decode (or a dangling link) refuses the
//   whole reload, keeping the old list, and refuses a start. A SIGHUP before
//   the socket serves (the first ~50 ms after a start) kills the process.
// - RemoveImage removes pinned images without complaint; by a name, when
//   the image has other names, it removes that name only (UntagImage).
// - CRI answers as CRI-O 1.32.13 gives them (/work notes of a real run):
//   Image.id is the config digest without "sha256:"; PullImage answers
//   `repo@<platform manifest digest>`; ListImages leaves `spec` unset and
//   ImageStatus sets it to annotations only; a runtime handler is ignored;
//   registry failures are UNKNOWN with containers/image's words ("manifest
//   unknown", "authentication required", "RegistryUnavailable: ...").
// - The socket file exists a little before CRI-O installs its SIGHUP
//   handler: a SIGHUP then still kills it. Only once a CRI call answered is
//   a SIGHUP safe.
// - Every call is recorded; the AuthConfig of a pull is kept apart from the
//   request so tests can assert which credentials were sent. Failures,
//   delays and a gate that holds pulls can be injected; a pull the client
//   cancels is recorded and never lands.
//
// The pin matching and the folder reading are written here independently of
// the production code: this is the oracle the agent is tested against.
// Protos are loaded with the options the production client uses, so the
// handlers here see and return camelCase field names (repoTags, runtimeHandler).
import * as grpc from '@grpc/grpc-js';
import { loadCriPackage } from './cri-proto.ts';
import { createHash } from 'node:crypto';
import { lstat, mkdtemp, readFile, readdir, rm, stat, unlink } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { parse as parseToml } from 'smol-toml';

// The wire schema and loader options are the agent's (src/cri/client.ts); the
// pin semantics below are written independently of it.
export { PROTO_PATH } from './cri-proto.ts';

/** CRI-O 1.32's default pause image (pkg/config DefaultPauseImage); CRI-O always pins its pause image. */
export const DEFAULT_PAUSE_IMAGE = 'registry.k8s.io/pause:3.10';
/** What the real runtime this stand-in copies answers to Version. */
export const CRIO_VERSION = '1.32.13';

export type CriMethod = 'Version' | 'ListImages' | 'ImageStatus' | 'PullImage' | 'RemoveImage' | 'ImageFsInfo';

/**
 * What the "registry" serves for a reference. A digest reference names its
 * own manifest (or, with platformDigest, an index). A tag reference
 * resolves to `digest` (default: one derived from the reference).
 */
export interface CatalogueImage {
  size: number;
  /** For a tag reference: the manifest (or index) digest the tag points at. Ignored for digest references. */
  digest?: string;
  /** The resolved digest names a multi-arch index; this is the node platform's manifest in it. */
  platformDigest?: string;
  /** Image ID (config digest, 64 hex); default derived from the platform manifest digest, so one manifest is one image. */
  id?: string;
  /** Credentials the "registry" requires for this image. */
  needsAuth?: { username: string; password: string };
}

export interface FakeCrioOptions {
  /** CRI-O's drop-in folder (crio.conf.d); read at start and on each reload. A missing folder means no drop-ins. */
  dropInDir: string;
  /** CRI-O's main configuration file, read before the drop-ins; default `<dropInDir>/../crio.conf`. Missing = none. */
  mainConfig?: string;
  catalogue?: Record<string, CatalogueImage>;
  /** Always pinned, as CRI-O pins its pause image; default DEFAULT_PAUSE_IMAGE. */
  pauseImage?: string;
  /** ImageFsInfo mountpoint; default the fake's own temp folder (a real path, so statfs works on it). */
  imageFsMountpoint?: string;
  /** Where its socket is (a node's /run/crio/crio.sock under a host root); default crio.sock in its own folder. */
  socketPath?: string;
  /** Delay between a SIGHUP and the re-read of the files, drawn uniformly from [min, max] ms; default [10, 40] as observed. */
  reloadDelayMs?: [number, number];
  /** Time from a start to serving on the socket, during which a SIGHUP kills the process; default 50 ms. */
  startupMs?: number;
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

/** One SIGHUP as the process handled it. */
export interface ReloadRecord {
  /** When the signal arrived and when the files were re-read (Date.now()). */
  signalledAt: number;
  appliedAt?: number;
  /** CRI-O's "Unable to reload configuration" error, when it refused. */
  error?: string;
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
  /** Config digest, 64 hex without "sha256:" (what CRI-O reports as Image.id). */
  id: string;
  /** Stored names, in the order they were added. */
  names: string[];
  /** Manifest digests: the image's own manifest first, then any index it was pulled through. */
  digests: string[];
  size: number;
}

/** The wire shape of runtime.v1.Image, camelCase. */
export interface CriImage {
  id: string;
  repoTags: string[];
  repoDigests: string[];
  size: number;
  uid: null;
  username: string;
  /** Unset in ListImages; in ImageStatus an ImageSpec holding the image's annotations only. */
  spec: { image: string; annotations: Record<string, string>; userSpecifiedImage: string; runtimeHandler: string; imageRef: string } | null;
  pinned: boolean;
}

interface ImageSpecIn {
  image?: string;
  runtimeHandler?: string;
}

// ---------------------------------------------------------------------------
// References, as far as this stand-in needs them

interface Ref {
  repo: string;
  tag?: string;
  digest?: string;
}

/** `host/path:tag` or `host/path@sha256:...`; null for anything else (a bare name, an id). */
function parseRef(s: string): Ref | null {
  const at = s.indexOf('@');
  if (at > 0) return { repo: s.slice(0, at), digest: s.slice(at + 1) };
  const slash = s.lastIndexOf('/');
  const colon = s.lastIndexOf(':');
  if (colon > slash && slash > 0) return { repo: s.slice(0, colon), tag: s.slice(colon + 1) };
  return null;
}

function repoOf(name: string): string {
  return parseRef(name)?.repo ?? name;
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
 * (UpdateFromPath) lstat()s each entry, descends into real folders in byte
 * order, and hands everything else (files, links of any kind) to
 * os.ReadFile, which follows links. A folder that does not exist means none.
 */
async function dropInFiles(dir: string): Promise<string[]> {
  try {
    await stat(dir);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
  }
  const out: string[] = [];
  const walk = async (p: string) => {
    const st = await lstat(p);
    if (!st.isDirectory()) {
      out.push(p);
      return;
    }
    for (const name of (await readdir(p)).sort(byteOrder)) await walk(join(p, name));
  };
  await walk(dir);
  return out;
}

/** What decoding one file onto CRI-O's config yields; throws as CRI-O fails it ("unable to decode configuration"). */
function decodeFile(file: string, text: string): { pinned?: string[]; pause?: string } {
  let doc: Record<string, unknown>;
  try {
    doc = parseToml(text) as Record<string, unknown>;
  } catch (err) {
    throw new Error(`unable to decode configuration ${file}: ${(err as Error).message.split('\n')[0]}`);
  }
  const bad = (key: string, want: string) => new Error(`unable to decode configuration ${file}: toml: ${key}: incompatible types: destination has type ${want}`);
  const crio = doc.crio;
  if (crio === undefined) return {};
  if (typeof crio !== 'object' || crio === null || Array.isArray(crio)) throw bad('crio', 'struct');
  const image = (crio as Record<string, unknown>).image;
  if (image === undefined) return {};
  if (typeof image !== 'object' || image === null || Array.isArray(image)) throw bad('crio.image', 'struct');
  const out: { pinned?: string[]; pause?: string } = {};
  const img = image as Record<string, unknown>;
  if ('pinned_images' in img) {
    const list = img.pinned_images;
    if (!Array.isArray(list) || !list.every((x) => typeof x === 'string')) throw bad('crio.image.pinned_images', '[]string');
    out.pinned = [...list];
  }
  if ('pause_image' in img) {
    if (typeof img.pause_image !== 'string') throw bad('crio.image.pause_image', 'string');
    out.pause = img.pause_image;
  }
  return out;
}

export interface CrioConfigView {
  pinned: string[];
  pauseImage: string;
}

/**
 * pinned_images and pause_image after decoding crio.conf (if present) and
 * every drop-in onto one config, as Reload() does; throws like CRI-O on a
 * file it cannot read or decode.
 */
export async function readCrioConfig(dropInDir: string, mainConfig: string | null = join(dirname(dropInDir), 'crio.conf'), defaultPause = DEFAULT_PAUSE_IMAGE): Promise<CrioConfigView> {
  const view: CrioConfigView = { pinned: [], pauseImage: defaultPause };
  const files: string[] = [];
  // Reload(): os.Stat(singleConfigPath); a missing file is skipped.
  if (mainConfig && (await stat(mainConfig).then(() => true, () => false))) files.push(mainConfig);
  files.push(...(await dropInFiles(dropInDir)));
  for (const file of files) {
    const d = decodeFile(file, await readFile(file, 'utf8'));
    // A slice decoded from a later file replaces the earlier one.
    if (d.pinned) view.pinned = d.pinned;
    if (d.pause !== undefined) view.pauseImage = d.pause;
  }
  return view;
}

/** pinned_images as CRI-O would load them from the drop-in folder alone; throws as CRI-O refuses, on a file it cannot read or decode. */
export async function readPinnedImages(dropInDir: string): Promise<string[]> {
  return (await readCrioConfig(dropInDir, null)).pinned;
}

// ---------------------------------------------------------------------------

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

function grpcError(code: number, details: string): Partial<grpc.StatusObject> {
  return { code, details };
}

function shortNameError(ref: string): string {
  return `short-name "${ref}" did not resolve to an alias and no unqualified-search registries are defined in "/etc/containers/registries.conf"`;
}

function hexOf(text: string): string {
  return createHash('sha256').update(text).digest('hex');
}

function authMatches(auth: ReceivedAuth | null, want: { username: string; password: string }): boolean {
  if (!auth) return false;
  if (auth.username === want.username && auth.password === want.password) return true;
  return auth.auth !== '' && auth.auth === Buffer.from(`${want.username}:${want.password}`).toString('base64');
}

/** The content a catalogue entry resolves to: its manifest digests (own first, index after) and image id. */
function resolveEntry(ref: string, entry: CatalogueImage): { digests: string[]; id: string } {
  const parsed = parseRef(ref);
  const resolved = parsed?.digest ?? entry.digest ?? `sha256:${hexOf(`manifest of ${ref}`)}`;
  const digests = entry.platformDigest ? [entry.platformDigest, resolved] : [resolved];
  return { digests, id: entry.id ?? hexOf(`config of ${digests[0]}`) };
}

type ProcessState = 'stopped' | 'starting' | 'serving' | 'dead';

/** The image service stand-in. Create with startFakeCrio(). */
export class FakeCrio {
  readonly dir: string;
  readonly socketPath: string;
  readonly dropInDir: string;
  readonly mainConfig: string;
  readonly catalogue: Map<string, CatalogueImage>;
  readonly defaultPauseImage: string;
  readonly imageFsMountpoint: string;
  reloadDelayMs: [number, number];
  startupMs: number;
  /** Every call received, in order. */
  readonly calls: RecordedCall[] = [];
  /** Calls the client cancelled (or that were cut off by stopServing()). */
  readonly cancelled: CancelledCall[] = [];
  /** Pulls that stored content the store did not have (a layer download); name-only pulls are not here. */
  readonly downloads: string[] = [];
  /** Every SIGHUP handled, in order. */
  readonly reloads: ReloadRecord[] = [];
  /** Successful reads of the configuration (a start counts as the first). */
  reloadCount = 0;
  /** Exit status once the process died (129: killed by SIGHUP during start-up). */
  exitCode: number | undefined;

  #server: grpc.Server | undefined;
  #state: ProcessState = 'stopped';
  #ready: Promise<void> = Promise.resolve();
  #markReady: () => void = () => {};
  readonly #images = new Map<string, StoredImage>();
  #pinned: string[] = [];
  #pauseImage: string;
  #failures: FailureRule[] = [];
  #refuseReloads: string | undefined;
  #pullDelayMs = 0;
  #gate: { promise: Promise<void>; release: () => void } | undefined;
  readonly #held: string[] = [];
  readonly #inflight = new Set<InflightPull>();
  readonly #timers = new Set<NodeJS.Timeout>();
  readonly #pkg: grpc.GrpcObject;

  constructor(dir: string, opts: FakeCrioOptions) {
    this.dir = dir;
    this.socketPath = opts.socketPath ?? join(dir, 'crio.sock');
    this.dropInDir = opts.dropInDir;
    this.mainConfig = opts.mainConfig ?? join(dirname(opts.dropInDir), 'crio.conf');
    this.catalogue = new Map(Object.entries(opts.catalogue ?? {}));
    this.defaultPauseImage = opts.pauseImage ?? DEFAULT_PAUSE_IMAGE;
    this.#pauseImage = this.defaultPauseImage;
    this.imageFsMountpoint = opts.imageFsMountpoint ?? dir;
    this.reloadDelayMs = opts.reloadDelayMs ?? [10, 40];
    this.startupMs = opts.startupMs ?? 50;
    this.#pkg = loadCriPackage();
  }

  /** `unix:///abs/path.sock`, the form of --cri-endpoint. */
  get endpoint(): string {
    return `unix://${this.socketPath}`;
  }

  get serving(): boolean {
    return this.#state === 'serving';
  }

  /** The process exists (starting or serving). */
  get running(): boolean {
    return this.#state === 'starting' || this.#state === 'serving';
  }

  /** The configured pause image (always pinned). */
  get pauseImage(): string {
    return this.#pauseImage;
  }

  // ---- pins and reloads

  /**
   * Re-reads crio.conf and the drop-ins now, as CRI-O's reload does.
   * Throws (keeping the old list) if a file cannot be read or decoded.
   */
  async reload(): Promise<void> {
    const view = await readCrioConfig(this.dropInDir, this.mainConfig, this.defaultPauseImage);
    this.#pinned = view.pinned;
    this.#pauseImage = view.pauseImage;
    this.reloadCount++;
  }

  /**
   * What `kill -HUP $MAINPID` does: returns at once; the files are re-read
   * reloadDelayMs later. Before the socket serves, the signal kills the
   * process (exit 129). Throws when there is no process to signal.
   */
  sighup(): void {
    if (this.#state === 'starting') {
      this.#die(129);
      return;
    }
    if (this.#state !== 'serving') throw new Error('crio.service is not active: no process to signal');
    const rec: ReloadRecord = { signalledAt: Date.now() };
    this.reloads.push(rec);
    const [min, max] = this.reloadDelayMs;
    const t = setTimeout(() => {
      this.#timers.delete(t);
      if (this.#state !== 'serving') return;
      if (this.#refuseReloads !== undefined) {
        rec.error = `Unable to reload configuration: ${this.#refuseReloads}`;
        return;
      }
      this.reload().then(
        () => (rec.appliedAt = Date.now()),
        (err: Error) => {
          // CRI-O logs "Unable to reload configuration" and keeps the old config.
          rec.error = `Unable to reload configuration: ${err.message}`;
        },
      );
    }, min + Math.random() * (max - min));
    this.#timers.add(t);
  }

  /** Resolves once every SIGHUP so far was handled (applied or refused). */
  async settled(timeoutMs = 5_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (this.reloads.some((r) => r.appliedAt === undefined && r.error === undefined) && this.#state === 'serving') {
      if (Date.now() > deadline) throw new Error(`reloads not handled within ${timeoutMs} ms`);
      await sleep(5);
    }
  }

  /** The pinned_images list in effect (without the pause image). */
  pinnedPatterns(): string[] {
    return [...this.#pinned];
  }

  isPinned(names: readonly string[]): boolean {
    const patterns = [...this.#pinned, this.#pauseImage];
    return names.some((n) => patterns.some((p) => pinPatternMatches(p, n)));
  }

  // ---- image store

  /** The stored images as ListImages reports them. */
  images(): CriImage[] {
    return [...this.#images.values()].map((img) => this.#toCri(img, false));
  }

  /** The stored image a reference or id names, as ImageStatus reports it, or null. */
  image(ref: string): CriImage | null {
    const img = this.#find(ref);
    return img ? this.#toCri(img, true) : null;
  }

  /** The names an image is stored under (what pins match), or null when ImageStatus would not find it. */
  storedNames(ref: string): string[] | null {
    const img = this.#find(ref);
    return img ? [...img.names] : null;
  }

  /** Puts a catalogue image in the store without a PullImage call or a download (an image already on the node). */
  preload(ref: string): void {
    const entry = this.catalogue.get(ref);
    if (!entry) throw new Error(`preload: ${ref} is not in the catalogue`);
    this.#store(ref, entry);
  }

  /** Drops an image from the store with all its names (as if garbage-collected). */
  evict(ref: string): boolean {
    const img = this.#find(ref);
    if (!img) return false;
    this.#images.delete(img.id);
    return true;
  }

  /** PullImage calls (optionally for one reference) received so far. */
  pullCount(ref?: string): number {
    return this.calls.filter((c) => c.method === 'PullImage' && (ref === undefined || (c.request.image as ImageSpecIn | null)?.image === ref)).length;
  }

  /** Pulls (optionally of one reference) that downloaded content. */
  downloadCount(ref?: string): number {
    return this.downloads.filter((r) => ref === undefined || r === ref).length;
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

  /**
   * Signalled reloads fail with `reason` (keeping the old list) whatever the
   * drop-ins say, as when a file outside the folder breaks Reload() (a
   * registries.conf CRI-O cannot parse, a seccomp profile it cannot load).
   */
  refuseReloads(reason = 'system registries reload failed: /etc/containers/registries.conf: invalid configuration'): void {
    this.#refuseReloads = reason;
  }

  acceptReloads(): void {
    this.#refuseReloads = undefined;
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

  // ---- the process

  /**
   * Starts: reads the configuration (throwing, as CRI-O exits, on a file it
   * cannot read or decode), then serves after startupMs.
   */
  async start(): Promise<void> {
    if (this.running) return;
    this.exitCode = undefined;
    await this.reload();
    await this.#boot();
  }

  /**
   * As CRI-O starts: the socket is created first; CRI calls wait until the
   * server is up (startupMs later); a SIGHUP before then kills the process.
   */
  async #boot(): Promise<void> {
    this.#state = 'starting';
    let markReady!: () => void;
    this.#ready = new Promise<void>((r) => (markReady = r));
    this.#markReady = markReady;
    await this.#serve();
    if (this.startupMs > 0) await sleep(this.startupMs);
    if (this.#state !== 'starting') throw new Error(`CRI-O died while starting (exit ${this.exitCode})`);
    this.#state = 'serving';
    markReady();
  }

  /** The runtime goes away: in-flight calls are cut off, the socket disappears. The store stays. */
  stopServing(): void {
    this.#stopProcess('stopped');
  }

  /**
   * The runtime comes back on the same socket path: like a restarted CRI-O
   * it reads its configuration first (throwing if a file does not decode),
   * unless rereadConfig is false.
   */
  async resume(opts: { rereadConfig?: boolean } = {}): Promise<void> {
    if (this.running) return;
    if (opts.rereadConfig === false) {
      this.exitCode = undefined;
      await this.#boot();
      return;
    }
    await this.start();
  }

  /** Stops serving and removes the temp folder. */
  async stop(): Promise<void> {
    this.releasePulls();
    this.stopServing();
    await rm(this.dir, { recursive: true, force: true });
  }

  #die(code: number): void {
    this.exitCode = code;
    this.#stopProcess('dead');
  }

  #stopProcess(next: ProcessState): void {
    const server = this.#server;
    this.#server = undefined;
    this.#state = next;
    this.#markReady(); // calls waiting for the start-up find the process gone
    for (const t of this.#timers) clearTimeout(t);
    this.#timers.clear();
    // Pulls in flight die with the runtime (grpc-js reports the cut-off streams only later).
    for (const pull of this.#inflight) pull.cancel();
    server?.forceShutdown();
    // A dead CRI-O leaves its socket file behind, as a killed process does.
    if (next === 'stopped') void unlink(this.socketPath).catch(() => {});
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
        runtimeVersion: CRIO_VERSION,
        runtimeApiVersion: 'v1',
      })),
    });
    server.addService(imageService.service, {
      ListImages: this.#unary('ListImages', async (req: { filter?: { image?: ImageSpecIn | null } | null }) => {
        const name = req.filter?.image?.image ?? '';
        const images = [...this.#images.values()].filter((img) => name === '' || this.#matches(img, name));
        return { images: images.map((img) => this.#toCri(img, false)) };
      }),
      ImageStatus: this.#unary('ImageStatus', async (req: { image?: ImageSpecIn | null }) => {
        const ref = req.image?.image ?? '';
        if (ref === '') throw grpcError(grpc.status.UNKNOWN, 'no image specified');
        if (ref.startsWith('sha256:')) throw grpcError(grpc.status.UNKNOWN, shortNameError(ref));
        const img = this.#find(ref);
        return { image: img ? this.#toCri(img, true) : null, info: {} };
      }),
      PullImage: this.#unary('PullImage', (req: { image?: ImageSpecIn | null; auth?: ReceivedAuth | null }, call, failure) =>
        this.#pull(req, call, failure),
      ),
      RemoveImage: this.#unary('RemoveImage', async (req: { image?: ImageSpecIn | null }) => {
        const ref = req.image?.image ?? '';
        if (ref === '') throw grpcError(grpc.status.UNKNOWN, 'no image specified');
        if (ref.startsWith('sha256:')) throw grpcError(grpc.status.UNKNOWN, shortNameError(ref));
        // Idempotent, as CRI requires; pinned images go too (CRI-O does not refuse them).
        const img = this.#find(ref);
        if (!img) return {};
        // server/image_remove.go: an id deletes the image; a name is untagged
        // (UntagImage) while the image has other names, and the last name deletes it.
        const others = img.names.filter((n) => n !== ref);
        if (!this.#idMatches(img, ref) && others.length > 0) img.names = others;
        else this.#images.delete(img.id);
        return {};
      }),
      ImageFsInfo: this.#unary('ImageFsInfo', async () => {
        const used = 4096 * (1 + this.#images.size);
        // CRI-O walks its image metadata folder (`<root>/<driver>-images`) for
        // these numbers: a few KiB, not the layers. Both lists hold the same entry.
        const usage = {
          timestamp: String(BigInt(Date.now()) * 1_000_000n),
          fsId: { mountpoint: this.imageFsMountpoint },
          usedBytes: { value: used },
          inodesUsed: { value: 1 + this.#images.size },
        };
        return { imageFilesystems: [usage], containerFilesystems: [usage] };
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
    return async (call, callback) => {
      if (this.#state === 'starting') await this.#ready;
      if (this.#state !== 'serving') {
        callback(grpcError(grpc.status.UNAVAILABLE, 'connection closed before the server answered'));
        return;
      }
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
      return await this.#pullAfterWaits(ref, req.auth ?? null, injected, pull);
    } finally {
      answered = true;
      this.#inflight.delete(pull);
    }
  }

  async #pullAfterWaits(
    ref: string,
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
    // containers/image's words, all UNKNOWN (2), as CRI-O 1.32.13 answered them.
    // The runtime handler of the ImageSpec is ignored, as CRI-O ignores it.
    if (ref === '') throw grpcError(grpc.status.UNKNOWN, 'cannot parse input: "": repository name must have at least one component');
    const parsed = parseRef(ref);
    const entry = this.catalogue.get(ref);
    if (!entry) {
      const what = parsed?.digest ?? parsed?.tag ?? ref;
      throw grpcError(grpc.status.UNKNOWN, `initializing source docker://${ref}: reading manifest ${what} in ${parsed?.repo ?? ref}: manifest unknown`);
    }
    if (entry.needsAuth && !authMatches(auth, entry.needsAuth)) {
      const what = parsed?.digest ?? parsed?.tag ?? ref;
      throw grpcError(grpc.status.UNKNOWN, `initializing source docker://${ref}: reading manifest ${what} in ${parsed?.repo ?? ref}: authentication required`);
    }
    const { img, downloaded } = this.#store(ref, entry);
    if (downloaded) this.downloads.push(ref);
    // CRI-O answers with a digested reference of the image's own manifest
    // (the platform manifest for an index), not the image id.
    return { imageRef: `${repoOf(ref)}@${img.digests[0]}` };
  }

  /** Stores `ref` as a name of its content; `downloaded` is false when the content was already there. */
  #store(ref: string, entry: CatalogueImage): { img: StoredImage; downloaded: boolean } {
    const { digests, id } = resolveEntry(ref, entry);
    const existing = this.#images.get(id);
    if (existing) {
      // containers/storage: the pull finds the image by id and adds the name (and any new digest).
      if (!existing.names.includes(ref)) existing.names.push(ref);
      for (const d of digests) if (!existing.digests.includes(d)) existing.digests.push(d);
      return { img: existing, downloaded: false };
    }
    const img: StoredImage = { id, names: [ref], digests, size: entry.size };
    this.#images.set(id, img);
    return { img, downloaded: true };
  }

  /** The full id or a prefix of it (CRI-O: HeuristicallyTryResolvingStringAsIDPrefix); `sha256:<id>` is a short name to CRI-O. */
  #idMatches(img: StoredImage, s: string): boolean {
    return s.length >= 6 && /^[0-9a-f]+$/.test(s) && img.id.startsWith(s);
  }

  /** ImageStatus's lookup: an id (or prefix), a stored name, or repo@digest with that digest and a name in that repo. */
  #matches(img: StoredImage, s: string): boolean {
    if (this.#idMatches(img, s) || img.names.includes(s)) return true;
    const r = parseRef(s);
    if (!r?.digest) return false;
    return img.digests.includes(r.digest) && img.names.some((n) => repoOf(n) === r.repo);
  }

  #find(ref: string): StoredImage | undefined {
    if (ref === '') return undefined;
    for (const img of this.#images.values()) if (this.#matches(img, ref)) return img;
    return undefined;
  }

  /** ListImages leaves `spec` unset; ImageStatus sets it to an ImageSpec with the annotations only. */
  #toCri(img: StoredImage, withSpec: boolean): CriImage {
    const tags = img.names.filter((n) => parseRef(n)?.tag !== undefined);
    const digested = img.names.filter((n) => parseRef(n)?.digest !== undefined);
    // makeRepoDigests: the digested names, then every repo among the names times every digest.
    const repoDigests = new Set(digested);
    for (const repo of new Set(img.names.map(repoOf))) for (const d of img.digests) repoDigests.add(`${repo}@${d}`);
    return {
      id: img.id,
      repoTags: tags.sort(),
      repoDigests: [...repoDigests].sort(),
      size: img.size,
      uid: null,
      username: '',
      spec: withSpec ? { image: '', annotations: {}, userSpecifiedImage: '', runtimeHandler: '', imageRef: '' } : null,
      pinned: this.isPinned(img.names),
    };
  }
}

/** Creates a temp folder, reads the configuration and serves on `<tmp>/crio.sock`. Stop with stop(). */
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
