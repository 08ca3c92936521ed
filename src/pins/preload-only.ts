// The backend of a runtime that cannot pin: images are pre-loaded, nothing
// protects them from the kubelet's image garbage collection, and the status
// says so plainly, never a silent Ready:
// - chosen by the operator (`--pin-backend none`): a set is Ready with
//   reason PreloadedNotPinned once its images are present, 0 pinned;
// - found (a containerd that does not report pins, a runtime pinset has no
//   backend for): `cannotPin` names what would pin; the node status says so
//   once, and a set whose images are all present is Degraded with reason
//   RuntimeCannotPin (before that, what keeps them from being present).
import type { Logger } from 'pino';
import type { RuntimeImage } from '../cri/runtime.ts';
import type { PinBackend, PinRemoval, PinsObserved, PinStatus } from './backend.ts';

export class PreloadOnly implements PinBackend {
  readonly name = 'none' as const;
  readonly readsPins = false;
  readonly state = 'none';
  /** Why the runtime cannot pin; undefined when the operator chose pre-loading. */
  private readonly why: string | undefined;
  private readonly where: string;

  /** `quiet`: a stand-in until the runtime says what it is (nothing to log, nothing to pin yet). */
  constructor(o: { logger: Logger; why?: string; runtime?: string; quiet?: boolean }) {
    this.why = o.why;
    this.where = o.runtime ? `none (${o.runtime}: pre-load only)` : 'none (pre-load only)';
    if (o.quiet) return;
    if (o.why) o.logger.warn({ runtime: o.runtime }, `pre-load only, nothing will pin images: ${o.why}`);
    else o.logger.info('--pin-backend none: images are pre-loaded, not pinned; the kubelet may remove them');
  }

  async observe(): Promise<PinsObserved> {
    return { current: [], carried: [] };
  }
  async stage(): Promise<void> {}
  async sync(): Promise<void> {}
  wantsNamePull(): boolean {
    return false;
  }
  async afterPulls(): Promise<void> {}
  async audit(): Promise<void> {}
  inPlace(_img: RuntimeImage): boolean {
    return true;
  }
  status(): PinStatus {
    const why = this.why;
    return {
      where: this.where,
      wrote: false,
      reloaded: false,
      preloadOnly: true,
      held: 0,
      holds: () => false,
      reportsPinned: () => undefined,
      notHeld: (n) => `${n} image(s) present, not pinned`,
      notPinned: (n) => `${n} image(s) present, not pinned`,
      ...(why ? { cannotPin: why } : {}),
      problemFor: () => undefined,
    };
  }
  nextAttemptAt(): number | undefined {
    return undefined;
  }
  watchPaths(): { dir: string; recursive: boolean; name?: string; reason: string }[] {
    return [];
  }
  /** Pre-loading pins nothing, so it removes nothing. */
  async removal(): Promise<PinRemoval> {
    return { done: `${this.where}: nothing to remove`, heldAs: () => undefined, pinnedBy: () => undefined, notApplied: '' };
  }
  close(): void {}
}
