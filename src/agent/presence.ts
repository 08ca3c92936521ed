// Removed images come back. CRI RemoveImage (`crictl rmi`) removes pinned
// images without complaint and tells nobody, so between reconciles one
// ListImages every --presence-check-interval asks whether the images in
// place at the last reconcile are still there (and pinned); a missing one
// is named in a log line and an ImageRemoved Event, and pulled again.
import type { Logger } from 'pino';
import type { ImageRuntime } from '../cri/runtime.ts';
import { RuntimeView } from '../cri/view.ts';
import type { PinBackend } from '../pins/backend.ts';
import type { EventRecorder } from './node-sinks.ts';
import type { Plan } from './plan.ts';
import type { RuntimeSnapshot } from './runtime-state.ts';

/**
 * Between reconciles, one ListImages at least this often: RemoveImage (e.g.
 * `crictl rmi`) removes pinned images without complaint and tells nobody,
 * so a removed image is noticed within this bound and pulled again.
 */
export const PRESENCE_CHECK_MS = 30_000;

export class Presence {
  private readonly log: Logger;
  private readonly events: EventRecorder | null | undefined;
  /** Wanted images the runtime held in place at the last reconcile: key -> reference. */
  private inPlace = new Map<string, string>();
  /** Wanted images the last reconcile saw present (so the disk check runs early only when something may be pulled). */
  knownPresent: ReadonlySet<string> = new Set();
  lastListAt = 0;

  constructor(log: Logger, events?: EventRecorder | null) {
    this.log = log;
    this.events = events;
  }

  /** A wanted image that was in place and is gone: named in a log line and an Event. */
  noteRemoved(plan: Plan, runtime: RuntimeSnapshot): void {
    if (runtime.error) return;
    for (const w of plan.wanted) {
      if (!this.inPlace.has(w.key) || runtime.found(w)) continue;
      const ref = w.reference.reference;
      const sets = w.sets.map((k) => k.split('/').slice(1).join('/'));
      this.log.warn({ image: ref, sets }, 'a pinned image was removed from the runtime; pulling it again');
      this.events?.record('Warning', 'ImageRemoved', `image ${ref} of set(s) ${sets.join(', ')} was removed from the runtime although pinned; pulling it again`, ref);
      this.inPlace.delete(w.key);
    }
  }

  /** What this reconcile ended with, for the checks until the next one. */
  record(plan: Plan, runtime: RuntimeSnapshot, pins: PinBackend, now: number): void {
    if (runtime.error) return;
    const inPlace = new Map<string, string>();
    const present = new Set<string>();
    for (const w of plan.wanted) {
      const img = runtime.found(w);
      if (!img) continue;
      present.add(w.key);
      if (!w.runtimeHandler && pins.inPlace(img)) inPlace.set(w.key, w.reference.reference);
    }
    this.inPlace = inPlace;
    this.knownPresent = present;
    this.lastListAt = now;
  }

  /** When the next check is due, if one is needed. */
  nextCheckAt(runtimeFailing: boolean, intervalMs: number): number | undefined {
    if (runtimeFailing || this.inPlace.size === 0) return undefined;
    return this.lastListAt + intervalMs;
  }

  /** One ListImages: true when a full reconcile must follow (an image in place is gone or unpinned, or the runtime failed). */
  async check(runtime: ImageRuntime, pins: PinBackend, now: number): Promise<boolean> {
    this.lastListAt = now;
    try {
      const view = new RuntimeView(await runtime.listImages());
      for (const ref of this.inPlace.values()) {
        const img = view.find(ref);
        if (!img || !pins.inPlace(img)) {
          this.log.debug({ image: ref }, 'presence check: a pinned image is missing or unpinned');
          return true;
        }
      }
      return false;
    } catch {
      // The reconcile records the outage and paces what follows.
      return true;
    }
  }
}
