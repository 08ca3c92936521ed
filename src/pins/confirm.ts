// The bounded wait that confirms a pin change: ImageStatus polled until the
// runtime reports `pinned` as expected. CRI-O applies a reload 10-40 ms
// after the signal (facts/crio-pinning.md); containerd follows a label
// change within about a second. Both report it through CRI's `pinned`,
// which is what the kubelet's image garbage collection reads.
import type { ImageRuntime, RuntimeImage } from '../cri/runtime.ts';

export interface PinProbe {
  ref: string;
  /** `pinned` once CRI-O has loaded the new list. */
  expect: boolean;
}

export interface PinWaitResult {
  /** Some probe showed the new list. */
  applied: boolean;
  /** Every probe's image went away meanwhile: nothing left to observe (not a refusal). */
  unobservable: boolean;
  /** From the start of the wait to the answer that showed it (or to giving up). */
  waitedMs: number;
  /** Last ImageStatus answer per probe reference (null: not present). */
  last: Map<string, RuntimeImage | null>;
}

export const PIN_WAIT_INTERVAL_MS = 20;
/**
 * CRI-O re-reads its files 10-40 ms after the signal (median 16 ms on
 * 1.32.13); a loaded node may take longer. Past this bound the reload counts
 * as not applied and is retried with backoff.
 */
export const PIN_WAIT_TIMEOUT_MS = 5_000;

/**
 * Polls ImageStatus of the probes until one reports `pinned` as expected,
 * or the bound passes. Probes whose image disappears drop out.
 */
export async function waitForPins(
  runtime: ImageRuntime,
  probes: readonly PinProbe[],
  opts: { intervalMs?: number; timeoutMs?: number; signal?: AbortSignal; now?: () => number } = {},
): Promise<PinWaitResult> {
  const now = opts.now ?? Date.now;
  const started = now();
  const deadline = started + (opts.timeoutMs ?? PIN_WAIT_TIMEOUT_MS);
  const last = new Map<string, RuntimeImage | null>();
  let live = [...probes];
  for (;;) {
    const answers = await Promise.all(live.map((p) => runtime.imageStatus(p.ref).then((img) => ({ p, img }), () => ({ p, img: undefined }))));
    for (const { p, img } of answers) {
      if (img === undefined) continue; // a failed call says nothing; try again
      last.set(p.ref, img);
      if (img && img.pinned === p.expect) return { applied: true, unobservable: false, waitedMs: now() - started, last };
    }
    live = live.filter((p) => last.get(p.ref) !== null);
    if (live.length === 0 || now() >= deadline || opts.signal?.aborted) return { applied: false, unobservable: live.length === 0, waitedMs: now() - started, last };
    await new Promise((r) => setTimeout(r, opts.intervalMs ?? PIN_WAIT_INTERVAL_MS));
  }
}
