// Reading the `pinset.dev/status` annotation (format in ./types.ts) that each agent writes on its
// Node. The annotation is data from another process (possibly an older or a
// newer agent, possibly hand-edited), so nothing here trusts it: a bad value
// yields an error string for that node, a bad entry is dropped on its own, and
// no input makes the reader throw.
import {
  STATUS_ANNOTATION,
  STATUS_FORMAT_VERSION,
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

const PHASES: ReadonlySet<string> = new Set<SetPhase>(['Progressing', 'Ready', 'Degraded']);

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function isCount(v: unknown): v is number {
  return typeof v === 'number' && Number.isInteger(v) && v >= 0;
}

function readImages(v: unknown): SetImageCounts | string {
  if (v === undefined) return { wanted: 0, present: 0, pinned: 0, failed: 0, invalid: 0 };
  if (!isRecord(v)) return 'images: not an object';
  const out: SetImageCounts = { wanted: 0, present: 0, pinned: 0, failed: 0, invalid: 0 };
  for (const k of ['wanted', 'present', 'pinned', 'failed', 'invalid'] as const) {
    const n = v[k];
    if (n === undefined) continue;
    if (!isCount(n)) return `images.${k}: not a non-negative integer`;
    out[k] = n;
  }
  return out;
}

function readSetEntry(v: unknown): NodeSetStatus | string {
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
  const images = readImages(v.images);
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

/** Parse the annotation's value. Never throws. */
export function parseNodeStatus(raw: string | undefined): NodeStatusReading {
  if (raw === undefined) return {};
  let doc: unknown;
  try {
    doc = JSON.parse(raw);
  } catch (e) {
    return { error: `${STATUS_ANNOTATION} is not JSON: ${(e as Error).message}` };
  }
  if (!isRecord(doc)) return { error: `${STATUS_ANNOTATION} is not a JSON object` };
  if (doc.version !== STATUS_FORMAT_VERSION) {
    return { error: `${STATUS_ANNOTATION} has format version ${JSON.stringify(doc.version)}, this build reads version ${STATUS_FORMAT_VERSION}` };
  }
  if (!Array.isArray(doc.sets)) return { error: `${STATUS_ANNOTATION}: sets is not a list` };
  const sets: NodeSetStatus[] = [];
  const dropped: string[] = [];
  doc.sets.forEach((e: unknown, i: number) => {
    const r = readSetEntry(e);
    if (typeof r === 'string') dropped.push(`sets[${i}]: ${r}`);
    else sets.push(r);
  });
  const status: NodeStatus = {
    version: STATUS_FORMAT_VERSION,
    node: typeof doc.node === 'string' ? doc.node : '',
    pinFile: typeof doc.pinFile === 'string' ? doc.pinFile : '',
    updatedAt: typeof doc.updatedAt === 'string' ? doc.updatedAt : '',
    sets,
  };
  if (typeof doc.imageFilesystemError === 'string') status.imageFilesystemError = doc.imageFilesystemError;
  if (doc.truncated === true) status.truncated = true;
  return dropped.length > 0 ? { status, droppedEntries: dropped } : { status };
}

/** Read the annotation from a Node's metadata.annotations. Never throws. */
export function readNodeStatus(annotations: Readonly<Record<string, string>> | undefined): NodeStatusReading {
  const raw = annotations?.[STATUS_ANNOTATION];
  return parseNodeStatus(typeof raw === 'string' ? raw : undefined);
}
