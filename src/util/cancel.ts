// A reconcile superseded by a newer desired state stops at its next safe
// point by throwing Cancelled; nothing it leaves behind is half-done.
export class Cancelled extends Error {
  override name = 'Cancelled';
}

export function checkpoint(signal: AbortSignal): void {
  if (signal.aborted) throw new Cancelled('superseded by a newer desired state');
}
