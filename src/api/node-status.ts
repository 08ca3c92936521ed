// The `pinset.dev/status` annotation each agent writes on its Node: the
// compact version-2 format agents write, and a reader of versions 1 and 2
// (so old and new agents can report side by side during a rolling upgrade).
// Both give the same in-memory NodeStatus (./types.ts).
//
// The annotation is data from another process (possibly an older or a
// newer agent, possibly hand-edited), so the reader trusts nothing: a bad
// value yields an error string for that node, a bad entry is dropped on its
// own, unknown keys are ignored, and no input makes the reader throw.
//
// Version 2, one set (every key but name, gen, phase may be absent):
//   {"name": "upgrade-workers", "uid": "0b6e…", "source": "static",
//    "gen": 3, "done": 2, "phase": "Progressing", "reason": "Pulling",
//    "message": "120 of 412 images present",
//    "images": [412, 120, 412, 0, 0], "estimatedBytes": 13207024435,
//    "bytes": [2147483648, 6603512217], "rate": 5452595, "pullRate": 9437184, "mirrored": true,
//    "failedGen": 2, "error": "ImageNotFound: …"}
// - source: only "static"; absent means "api".
// - gen: desiredGeneration. done: currentGeneration, absent when equal to gen.
// - reason: absent on a Ready set means AllImagesPinned.
// - images: [wanted, present, pinned, failed, invalid], trailing zeros left out.
// - bytes: [present, total] compressed bytes of the set's images on this
//   node, [total] when all are present; rate: bytes per second arriving;
//   pullRate: the same over the seconds a pull of the set ran; mirrored:
//   true when every image of the set is fetched through a mirror first
//   (absent otherwise). They came
//   after the first version-2 agents (readers that predate them ignore
//   them), and a malformed one is left out on its own: the entry
//   stays, as progress is never worth losing a set's phase for.
// - failedGen, error: lastFailedGeneration and lastFailedGenerationError. On
//   a Degraded set they default to gen and "<reason>: <message>" (what a set
//   failing now has), so a failing set does not carry its message twice.
// The document: {"version": 2, "pinFile": …, "updatedAt": …, "sets": […],
// "imageFilesystemError": …, "cannotPin": …, "pins": 12, "pinsKept": …,
// "kubeletVerification": {"policy": …, "source": …, "refuses": […],
// "refusesMore": 3}, "truncated": true, "runtime": {…}}; updatedAt in whole seconds; no node name (the
// annotation is on that Node). cannotPin, pins and pinsKept came after the
// first version-2 agents: readers that predate them ignore them (unknown
// keys are); no cannotPin means the node can pin, and a report without
// `pins` is one whose pin count is unknown (an agent from before them).
// runtime: what the agent found on its node (name, version, pin backend,
// the host paths it uses; src/agent/boot/node-profile.ts), absent from older agents.
import {
  STATUS_ANNOTATION,
  type KubeletVerificationStatus,
  STATUS_FORMAT_VERSION,
  type NodeRuntime,
  type NodeSetStatus,
  type NodeStatus,
  type SetImageCounts,
  type SetPhase,
} from '../api/types.ts';

export interface NodeStatusReading {
  /** The parsed report; absent when the node has no annotation or it could not be read. */
  status?: NodeStatus;
  /** Why the annotation could not be read; absent when it was read or is missing. */
  error?: string;
  /** Set entries left out because they were malformed, as "sets[i]: problem". */
  droppedEntries?: string[];
}

/** The keys of the version-2 document, and of a set's entry in it: what the encoder may write (docs/status.md lists them; a test holds the two together). */
export const STATUS_DOCUMENT_KEYS = ['version', 'pinFile', 'updatedAt', 'sets', 'imageFilesystemError', 'cannotPin', 'pins', 'pinsKept', 'kubeletVerification', 'truncated', 'runtime'] as const;
export const STATUS_SET_KEYS = ['name', 'uid', 'source', 'gen', 'done', 'phase', 'reason', 'message', 'images', 'estimatedBytes', 'bytes', 'rate', 'pullRate', 'mirrored', 'failedGen', 'error'] as const;

const PHASES: ReadonlySet<string> = new Set<SetPhase>(['Progressing', 'Ready', 'Degraded']);
/** The reason a Ready set has unless it says otherwise (version 2 leaves it out). */
export const READY_REASON = 'AllImagesPinned';
const COUNT_KEYS = ['wanted', 'present', 'pinned', 'failed', 'invalid'] as const;

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function isCount(v: unknown): v is number {
  return typeof v === 'number' && Number.isInteger(v) && v >= 0;
}

function zeroCounts(): SetImageCounts {
  return { wanted: 0, present: 0, pinned: 0, failed: 0, invalid: 0 };
}

/** What lastFailedGenerationError is for a set that fails now: version 2 leaves it out when it is this. */
export function failureText(reason: string, message: string | undefined): string {
  return `${reason}: ${message ?? ''}`;
}

// ---------------------------------------------------------------------------
// Writing (version 2)

/** metav1.Time style: whole seconds, as the annotation needs no more. */
function wholeSeconds(t: string): string {
  return /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z$/.test(t) ? t.replace(/\.\d+Z$/, 'Z') : t;
}

function encodeSet(s: NodeSetStatus): Partial<Record<(typeof STATUS_SET_KEYS)[number], unknown>> {
  const e: Partial<Record<(typeof STATUS_SET_KEYS)[number], unknown>> = { name: s.name };
  if (s.uid) e.uid = s.uid;
  if (s.source === 'static') e.source = 'static';
  e.gen = s.desiredGeneration;
  if (s.currentGeneration !== s.desiredGeneration) e.done = s.currentGeneration;
  e.phase = s.phase;
  if (!(s.phase === 'Ready' && s.reason === READY_REASON)) e.reason = s.reason;
  if (s.message !== undefined) e.message = s.message;
  const counts = COUNT_KEYS.map((k) => s.images[k]);
  while (counts.length > 0 && counts[counts.length - 1] === 0) counts.pop();
  e.images = counts;
  if (s.estimatedBytes !== undefined) e.estimatedBytes = s.estimatedBytes;
  if (s.bytes) e.bytes = s.bytes.present === s.bytes.total ? [s.bytes.total] : [s.bytes.present, s.bytes.total];
  if (s.rate !== undefined) e.rate = Math.round(s.rate);
  if (s.pullRate !== undefined) e.pullRate = Math.round(s.pullRate);
  if (s.mirrored === true) e.mirrored = true;
  const failingNow = s.phase === 'Degraded';
  if (s.lastFailedGeneration !== undefined && !(failingNow && s.lastFailedGeneration === s.desiredGeneration)) e.failedGen = s.lastFailedGeneration;
  if (s.lastFailedGenerationError !== undefined && !(failingNow && s.lastFailedGenerationError === failureText(s.reason, s.message))) {
    e.error = s.lastFailedGenerationError;
  }
  return e;
}

/** The node's `runtime` as written; anything malformed is left out (an older or newer writer's shape), never guessed. */
function readRuntime(v: unknown): NodeRuntime | undefined {
  if (!isRecord(v) || typeof v.source !== 'string' || typeof v.pinBackend !== 'string' || typeof v.socket !== 'string' || typeof v.lock !== 'string') return undefined;
  const r: NodeRuntime = { source: v.source, pinBackend: v.pinBackend, socket: v.socket, lock: v.lock };
  for (const k of ['name', 'version', 'layout', 'dropInDir', 'hostsDir', 'problem'] as const) if (typeof v[k] === 'string') r[k] = v[k];
  if (Array.isArray(v.imageFs) && v.imageFs.every((x) => typeof x === 'string')) r.imageFs = v.imageFs as string[];
  return r;
}

/** The annotation's value for `status`, in the format agents write (version 2). */
export function encodeNodeStatus(status: NodeStatus): string {
  const doc: Partial<Record<(typeof STATUS_DOCUMENT_KEYS)[number], unknown>> = {
    version: STATUS_FORMAT_VERSION,
    pinFile: status.pinFile,
    updatedAt: wholeSeconds(status.updatedAt),
    sets: status.sets.map(encodeSet),
  };
  if (status.imageFilesystemError) doc.imageFilesystemError = status.imageFilesystemError;
  if (status.cannotPin) doc.cannotPin = status.cannotPin;
  if (status.pins !== undefined) doc.pins = status.pins;
  if (status.pinsKept) doc.pinsKept = status.pinsKept;
  if (status.kubeletVerification) doc.kubeletVerification = status.kubeletVerification;
  if (status.truncated) doc.truncated = true;
  if (status.runtime) doc.runtime = status.runtime;
  return JSON.stringify(doc);
}

/** Bytes of the annotation's value for `status`. */
export function encodedSize(status: NodeStatus): number {
  return Buffer.byteLength(encodeNodeStatus(status), 'utf8');
}

// ---------------------------------------------------------------------------
// Reading version 1: the set entry as NodeSetStatus spells it.

function readImagesV1(v: unknown): SetImageCounts | string {
  if (v === undefined) return zeroCounts();
  if (!isRecord(v)) return 'images: not an object';
  const out = zeroCounts();
  for (const k of COUNT_KEYS) {
    const n = v[k];
    if (n === undefined) continue;
    if (!isCount(n)) return `images.${k}: not a non-negative integer`;
    out[k] = n;
  }
  return out;
}

function readSetEntryV1(v: unknown): NodeSetStatus | string {
  if (!isRecord(v)) return 'not an object';
  if (typeof v.name !== 'string' || v.name === '') return 'name: missing';
  if (v.uid !== undefined && typeof v.uid !== 'string') return 'uid: not a string';
  if (v.source !== 'api' && v.source !== 'static') return 'source: not "api" or "static"';
  if (!isCount(v.desiredGeneration)) return 'desiredGeneration: not a non-negative integer';
  if (!isCount(v.currentGeneration)) return 'currentGeneration: not a non-negative integer';
  if (v.lastFailedGeneration !== undefined && !isCount(v.lastFailedGeneration)) return 'lastFailedGeneration: not a non-negative integer';
  if (v.lastFailedGenerationError !== undefined && typeof v.lastFailedGenerationError !== 'string') {
    return 'lastFailedGenerationError: not a string';
  }
  if (typeof v.phase !== 'string' || !PHASES.has(v.phase)) return 'phase: not Progressing, Ready or Degraded';
  if (v.reason !== undefined && typeof v.reason !== 'string') return 'reason: not a string';
  if (v.message !== undefined && typeof v.message !== 'string') return 'message: not a string';
  if (v.estimatedBytes !== undefined && !isCount(v.estimatedBytes)) return 'estimatedBytes: not a non-negative integer';
  const images = readImagesV1(v.images);
  if (typeof images === 'string') return images;
  const entry: NodeSetStatus = {
    name: v.name,
    source: v.source,
    desiredGeneration: v.desiredGeneration,
    currentGeneration: v.currentGeneration,
    images,
    phase: v.phase as SetPhase,
    reason: typeof v.reason === 'string' ? v.reason : '',
  };
  if (typeof v.uid === 'string' && v.uid !== '') entry.uid = v.uid;
  if (v.lastFailedGeneration !== undefined) entry.lastFailedGeneration = v.lastFailedGeneration as number;
  if (typeof v.lastFailedGenerationError === 'string') entry.lastFailedGenerationError = v.lastFailedGenerationError;
  if (typeof v.message === 'string') entry.message = v.message;
  if (v.estimatedBytes !== undefined) entry.estimatedBytes = v.estimatedBytes as number;
  return entry;
}

// ---------------------------------------------------------------------------
// Reading version 2 (see the top of this file).

function readImagesV2(v: unknown): SetImageCounts | string {
  if (v === undefined) return zeroCounts();
  if (!Array.isArray(v) || v.length > COUNT_KEYS.length) return `images: not a list of at most ${COUNT_KEYS.length} counts`;
  const out = zeroCounts();
  for (let i = 0; i < v.length; i++) {
    if (!isCount(v[i])) return `images[${i}]: not a non-negative integer`;
    out[COUNT_KEYS[i]!] = v[i] as number;
  }
  return out;
}

/** A set's `bytes`: [present, total] or [total] (all present); undefined when absent or malformed. */
function readBytes(v: unknown): NodeSetStatus['bytes'] {
  if (!Array.isArray(v) || !v.every(isCount)) return undefined;
  if (v.length === 1) return { present: v[0], total: v[0] };
  if (v.length === 2 && v[0] <= v[1]) return { present: v[0], total: v[1] };
  return undefined;
}

function readSetEntryV2(v: unknown): NodeSetStatus | string {
  if (!isRecord(v)) return 'not an object';
  if (typeof v.name !== 'string' || v.name === '') return 'name: missing';
  if (v.uid !== undefined && typeof v.uid !== 'string') return 'uid: not a string';
  if (v.source !== undefined && v.source !== 'api' && v.source !== 'static') return 'source: not "api" or "static"';
  if (!isCount(v.gen)) return 'gen: not a non-negative integer';
  if (v.done !== undefined && !isCount(v.done)) return 'done: not a non-negative integer';
  if (typeof v.phase !== 'string' || !PHASES.has(v.phase)) return 'phase: not Progressing, Ready or Degraded';
  if (v.reason !== undefined && typeof v.reason !== 'string') return 'reason: not a string';
  if (v.message !== undefined && typeof v.message !== 'string') return 'message: not a string';
  if (v.estimatedBytes !== undefined && !isCount(v.estimatedBytes)) return 'estimatedBytes: not a non-negative integer';
  if (v.failedGen !== undefined && !isCount(v.failedGen)) return 'failedGen: not a non-negative integer';
  if (v.error !== undefined && typeof v.error !== 'string') return 'error: not a string';
  const images = readImagesV2(v.images);
  if (typeof images === 'string') return images;
  const phase = v.phase as SetPhase;
  const reason = typeof v.reason === 'string' ? v.reason : phase === 'Ready' ? READY_REASON : '';
  const entry: NodeSetStatus = {
    name: v.name,
    source: v.source === 'static' ? 'static' : 'api',
    desiredGeneration: v.gen,
    currentGeneration: v.done === undefined ? v.gen : (v.done as number),
    images,
    phase,
    reason,
  };
  if (typeof v.uid === 'string' && v.uid !== '') entry.uid = v.uid;
  if (typeof v.message === 'string') entry.message = v.message;
  if (v.estimatedBytes !== undefined) entry.estimatedBytes = v.estimatedBytes as number;
  const bytes = readBytes(v.bytes);
  if (bytes) entry.bytes = bytes;
  if (isCount(v.rate)) entry.rate = v.rate;
  if (isCount(v.pullRate)) entry.pullRate = v.pullRate;
  if (v.mirrored === true) entry.mirrored = true;
  const failingNow = phase === 'Degraded';
  if (v.failedGen !== undefined) entry.lastFailedGeneration = v.failedGen as number;
  else if (failingNow) entry.lastFailedGeneration = v.gen;
  if (typeof v.error === 'string') entry.lastFailedGenerationError = v.error;
  else if (failingNow) entry.lastFailedGenerationError = failureText(reason, entry.message);
  return entry;
}

// ---------------------------------------------------------------------------

/** Parse the annotation's value (version 1 or 2). Never throws. */
export function parseNodeStatus(raw: string | undefined): NodeStatusReading {
  if (raw === undefined) return {};
  let doc: unknown;
  try {
    doc = JSON.parse(raw);
  } catch (e) {
    return { error: `${STATUS_ANNOTATION} is not JSON: ${(e as Error).message}` };
  }
  if (!isRecord(doc)) return { error: `${STATUS_ANNOTATION} is not a JSON object` };
  if (doc.version !== 1 && doc.version !== 2) {
    return { error: `${STATUS_ANNOTATION} has format version ${JSON.stringify(doc.version)}; this build reads versions 1 and 2 (upgrade pinset to read it)` };
  }
  if (!Array.isArray(doc.sets)) return { error: `${STATUS_ANNOTATION}: sets is not a list` };
  const readEntry = doc.version === 1 ? readSetEntryV1 : readSetEntryV2;
  const sets: NodeSetStatus[] = [];
  const dropped: string[] = [];
  doc.sets.forEach((e: unknown, i: number) => {
    const r = readEntry(e);
    if (typeof r === 'string') dropped.push(`sets[${i}]: ${r}`);
    else sets.push(r);
  });
  const status: NodeStatus = {
    version: doc.version,
    ...(typeof doc.node === 'string' ? { node: doc.node } : doc.version === 1 ? { node: '' } : {}),
    pinFile: typeof doc.pinFile === 'string' ? doc.pinFile : '',
    updatedAt: typeof doc.updatedAt === 'string' ? doc.updatedAt : '',
    sets,
  };
  if (typeof doc.imageFilesystemError === 'string') status.imageFilesystemError = doc.imageFilesystemError;
  if (typeof doc.cannotPin === 'string' && doc.cannotPin !== '') status.cannotPin = doc.cannotPin;
  // A bad count is no count: the pins are then unknown, never taken for 0.
  if (isCount(doc.pins)) status.pins = doc.pins;
  if (typeof doc.pinsKept === 'string' && doc.pinsKept !== '') status.pinsKept = doc.pinsKept;
  const kv = readKubeletVerification(doc.kubeletVerification);
  if (kv) status.kubeletVerification = kv;
  if (doc.truncated === true) status.truncated = true;
  const runtime = readRuntime(doc.runtime);
  if (runtime) status.runtime = runtime;
  return dropped.length > 0 ? { status, droppedEntries: dropped } : { status };
}

/** The document's kubeletVerification; undefined when absent or malformed (a bad one is no verdict, never a wrong one). */
function readKubeletVerification(v: unknown): KubeletVerificationStatus | undefined {
  if (!isRecord(v) || typeof v.policy !== 'string' || v.policy === '' || typeof v.source !== 'string') return undefined;
  const out: KubeletVerificationStatus = { policy: v.policy, source: v.source };
  if (Array.isArray(v.refuses) && v.refuses.length > 0 && v.refuses.every((s) => typeof s === 'string')) out.refuses = v.refuses as string[];
  if (isCount(v.refusesMore) && v.refusesMore > 0) out.refusesMore = v.refusesMore;
  return out;
}

/** Read the annotation from a Node's metadata.annotations. Never throws. */
export function readNodeStatus(annotations: Readonly<Record<string, string>> | undefined): NodeStatusReading {
  const raw = annotations?.[STATUS_ANNOTATION];
  return parseNodeStatus(typeof raw === 'string' ? raw : undefined);
}
