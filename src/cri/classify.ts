// Turning runtime failures into kinds the agent acts on. CRI carries
// registry failures as gRPC status codes plus text; containerd and CRI-O
// both put the registry's answer in the message (facts/cri-v1-image-service.md):
// wrong credentials -> UNKNOWN "401 Unauthorized"; unknown digest -> NOT_FOUND;
// registry down -> UNKNOWN "connection refused"; no socket -> UNAVAILABLE.
import { status as Status, type ServiceError } from '@grpc/grpc-js';
import { RuntimeError, type FailureKind } from './runtime.ts';

const MAX_MESSAGE = 2048;

const patterns: [FailureKind, RegExp][] = [
  ['NoSpace', /no space left on device|ENOSPC|disk quota exceeded/i],
  ['Unauthorized', /\b401\b|\b403\b|unauthori[sz]ed|authentication required|access denied|denied: |forbidden|invalid username\/password|incorrect username or password/i],
  ['NotFound', /\b404\b|not found|manifest unknown|name unknown|blob unknown|no such image|does not exist/i],
  ['Unavailable', /connection refused|connection reset|no such host|i\/o timeout|timeout|timed out|\b50[234]\b|service unavailable|bad gateway|network is unreachable|no route to host|EOF|tls handshake/i],
];

/** Classify a failure message from a registry or runtime. */
export function classifyMessage(message: string): FailureKind {
  for (const [kind, re] of patterns) if (re.test(message)) return kind;
  return 'Other';
}

export function classifyGrpcError(err: ServiceError, method: string): RuntimeError {
  const text = (err.details || err.message || '').slice(0, MAX_MESSAGE);
  let kind: FailureKind;
  switch (err.code) {
    case Status.CANCELLED:
      kind = 'Canceled';
      break;
    case Status.UNAVAILABLE:
    case Status.DEADLINE_EXCEEDED:
      kind = 'Unavailable';
      break;
    case Status.NOT_FOUND:
      kind = 'NotFound';
      break;
    case Status.UNAUTHENTICATED:
    case Status.PERMISSION_DENIED:
      kind = 'Unauthorized';
      break;
    case Status.RESOURCE_EXHAUSTED:
      kind = /space|disk/i.test(text) ? 'NoSpace' : classifyMessage(text);
      break;
    default:
      kind = classifyMessage(text);
  }
  const codeName = Status[err.code] ?? String(err.code);
  return new RuntimeError(kind, `${method}: ${codeName}: ${text}`, err.code);
}

/** True when the runtime itself (its socket) could not be reached, as opposed to a registry. */
export function isRuntimeDown(err: unknown): boolean {
  return err instanceof RuntimeError && (err.code === Status.UNAVAILABLE || err.code === Status.DEADLINE_EXCEEDED);
}
