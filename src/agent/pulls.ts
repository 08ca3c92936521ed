// What to pull, and pulling it. An image is in place when the runtime holds
// it under the set's own reference (and, where the pin backend reads pins
// back, reports it pinned). Otherwise:
// - absent: a download, unless the runtime holds the same content under
//   another name (any repository, a mirror's name: both runtimes store
//   content by digest), then a name-only pull that adds the name;
// - present but not pinned under that name while the pin is loaded (CRI-O
//   pins stored names): a name-only pull.
import type { Logger } from 'pino';
import type { PinBackend } from '../pins/backend.ts';
import { Cancelled } from '../util/cancel.ts';
import type { Plan, WantedImage } from './plan.ts';
import type { ImagePuller, PullKind, PullResult } from './puller.ts';
import type { RuntimeSnapshot } from './runtime-state.ts';

/** While pulls run, status is recomputed this often, and as each image lands (the reporter decides what is written, and when). */
export const PROGRESS_REPORT_MS = 5_000;

/**
 * How often status is recomputed while pulls run: every PROGRESS_REPORT_MS,
 * or as often as progress may be written when that is shorter (a pace
 * shrunk with --status-progress-interval, whose least is a second), so
 * what is written is never older than the pace it is written at.
 */
export function progressReportMs(progressIntervalMs: number): number {
  return Math.min(PROGRESS_REPORT_MS, Math.max(1_000, progressIntervalMs));
}

export interface PullPlan {
  /** Wanted images to pull, in plan order. */
  toPull: WantedImage[];
  kinds: ReadonlyMap<string, PullKind>;
  isName: (w: WantedImage) => boolean;
}

/** Which wanted images need a pull, and of which kind; the others are marked present (no retry pending). */
export function pullsNeeded(plan: Plan, runtime: RuntimeSnapshot, pins: PinBackend, puller: ImagePuller, log: Logger): PullPlan {
  const cancelled = puller.retain(new Set(plan.wanted.map((w) => w.key)));
  if (cancelled.length) log.info({ cancelled: cancelled.length }, 'cancelled pulls of images no longer wanted');
  const kinds = new Map<string, PullKind>();
  if (!runtime.error) {
    const held = runtime.heldDigests();
    for (const w of plan.wanted) {
      const img = runtime.found(w);
      if (!img) kinds.set(w.key, held.has(w.reference.digest) ? 'name' : 'download');
      else if (pins.wantsNamePull(w.reference.reference, img)) kinds.set(w.key, 'name');
      // In place, or waiting for a reload only: no pull, and no pull retry pending.
      else puller.markPresent(w.key);
    }
  }
  return { toPull: plan.wanted.filter((w) => kinds.has(w.key)), kinds, isName: (w) => kinds.get(w.key) === 'name' };
}

/**
 * Pull `pulling` (bounded parallelism and per-image retries are the
 * puller's), reporting progress while they run. Returns the images pulled and those whose pull failed.
 */
export async function runPulls(
  o: { puller: ImagePuller; log: Logger; runtime: RuntimeSnapshot; pins: PinBackend; report: () => void; reportEveryMs: number; waitingForSlot: number; onLanded?: (w: WantedImage) => void; mayStart?: (w: WantedImage) => boolean | undefined; oneAtATime?: ReadonlyMap<string, string> },
  need: PullPlan,
  pulling: readonly WantedImage[],
  signal: AbortSignal,
): Promise<{ pulled: WantedImage[]; failed: WantedImage[]; attempted: number }> {
  if (pulling.length === 0) return { pulled: [], failed: [], attempted: 0 };
  const { puller, runtime } = o;
  const downloads = pulling.filter((w) => need.kinds.get(w.key) === 'download').length;
  o.log.info(
    { missing: downloads, nameOnly: pulling.length - downloads, due: pulling.filter((w) => puller.isDue(w.key)).length, waitingForSlot: o.waitingForSlot || undefined },
    'pulling missing images',
  );
  const byKey = new Map(pulling.map((m) => [m.key, m]));
  // Until verified, a landed image counts as pinned only where pins are not read back.
  const assumePinned = !o.pins.readsPins;
  const landed = (r: PullResult) => {
    const w = byKey.get(r.key);
    if (!r.ok || !w) return;
    runtime.landed(w, r.imageRef, assumePinned);
    o.onLanded?.(w);
    o.report();
  };
  o.report(); // a set that starts pulling shows Progressing now
  const progress = setInterval(o.report, o.reportEveryMs);
  let results: PullResult[];
  try {
    const mayStart = o.mayStart;
    results = await puller.pull(pulling, signal, { onEach: landed, kindOf: (k) => need.kinds.get(k) ?? 'download', mayStart: mayStart && ((k) => mayStart(byKey.get(k)!) !== false), oneAtATime: o.oneAtATime }).catch((e) => {
      if (signal.aborted) throw new Cancelled('superseded');
      throw e;
    });
  } finally {
    clearInterval(progress);
  }
  // A pull held back (its rollout slot lost before it started) neither landed nor failed: the next reconcile asks for a slot again.
  const tried = results.filter((r) => !r.heldBack);
  const of = (ok: boolean) => tried.filter((r) => r.ok === ok).map((r) => byKey.get(r.key)).filter((w): w is WantedImage => w !== undefined);
  return { pulled: of(true), failed: of(false), attempted: tried.length };
}
