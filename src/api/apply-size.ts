// How big an object's annotations become under client-side `kubectl apply`,
// which stores the whole object it applied in the annotation
// kubectl.kubernetes.io/last-applied-configuration. The API server refuses
// an object whose annotations (keys plus values) pass 256 KiB
// (apimachinery ValidateAnnotations, TotalAnnotationSizeLimitB), so a large
// set (about 2000 images) can be created with `kubectl apply --server-side`
// or `kubectl create` but not with plain `kubectl apply`.
//
// kubectl (apply.GetModifiedConfiguration) removes the annotation from the
// object, leaving an empty annotations map when there was none, encodes the
// object as JSON (Go's encoding/json through the unstructured JSON encoder:
// map keys sorted, <, > and & escaped, a newline at the end) and stores that
// text as the annotation's value.

export const LAST_APPLIED_ANNOTATION = 'kubectl.kubernetes.io/last-applied-configuration';
/** apimachinery/pkg/api/validation TotalAnnotationSizeLimitB. */
export const MAX_ANNOTATIONS_BYTES = 256 * 1024;

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };

/** JSON as Go's encoding/json writes it: keys sorted, HTML-sensitive characters escaped. */
export function goJson(value: unknown): string {
  if (value === null || value === undefined) return 'null';
  if (typeof value === 'string') return JSON.stringify(value).replace(/[<>&\u2028\u2029]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
  if (typeof value === 'number' || typeof value === 'boolean') return JSON.stringify(value);
  if (value instanceof Date) return goJson(value.toISOString());
  if (Array.isArray(value)) return `[${value.map(goJson).join(',')}]`;
  if (typeof value === 'object') {
    const o = value as Record<string, unknown>;
    const keys = Object.keys(o)
      .filter((k) => o[k] !== undefined)
      .sort((a, b) => (Buffer.compare(Buffer.from(a), Buffer.from(b))));
    return `{${keys.map((k) => `${goJson(k)}:${goJson(o[k])}`).join(',')}}`;
  }
  return 'null';
}

export interface ApplySize {
  /** Bytes of the last-applied-configuration value kubectl would write. */
  lastAppliedBytes: number;
  /** Bytes of all annotations (keys and values) on the object kubectl would send. */
  annotationsBytes: number;
}

/** The annotation sizes of `obj` as client-side `kubectl apply` would send it. */
export function clientSideApplySize(obj: Record<string, unknown>): ApplySize {
  const metadata = { ...((obj.metadata as Record<string, unknown> | undefined) ?? {}) };
  const annotations = { ...((metadata.annotations as Record<string, string> | undefined) ?? {}) };
  delete annotations[LAST_APPLIED_ANNOTATION];
  metadata.annotations = annotations;
  const encoded = goJson({ ...obj, metadata } as Json) + '\n';
  const lastAppliedBytes = Buffer.byteLength(encoded, 'utf8');
  let annotationsBytes = Buffer.byteLength(LAST_APPLIED_ANNOTATION) + lastAppliedBytes;
  for (const [k, v] of Object.entries(annotations)) annotationsBytes += Buffer.byteLength(k) + Buffer.byteLength(String(v));
  return { lastAppliedBytes, annotationsBytes };
}

/** A warning for `pinset validate`, or null when client-side apply works. */
export function clientSideApplyWarning(obj: unknown): string | null {
  if (obj === null || typeof obj !== 'object' || Array.isArray(obj)) return null;
  const { annotationsBytes } = clientSideApplySize(obj as Record<string, unknown>);
  if (annotationsBytes <= MAX_ANNOTATIONS_BYTES) return null;
  return (
    `too large for client-side "kubectl apply": its ${LAST_APPLIED_ANNOTATION} annotation would make the annotations ` +
    `${annotationsBytes} bytes, over the API server's limit of ${MAX_ANNOTATIONS_BYTES}; ` +
    `apply it with "kubectl apply --server-side" (or create it with "kubectl create")`
  );
}
