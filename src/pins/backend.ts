// The runtime seam for pins. The reconcile core asks a PinBackend to make
// the container runtime hold the planned pin list, and to say, per
// reference, whether the runtime holds it pinned under that name and, if
// not, why. The core never knows which runtime it talks to:
//
// - CRI-O (src/crio/crio-pins.ts): one drop-in holding `pinned_images`,
//   reloaded over D-Bus or systemctl, confirmed by reading `pinned` back;
// - containerd 1.6.25+, 1.7.10+, 2.x (src/containerd/label-pins.ts): the
//   label `io.cri-containerd.pinned=pinned` on each wanted image's image-ID
//   record, through containerd's Images API, confirmed the same way;
// - a runtime that cannot pin (./preload-only.ts): images pre-loaded, the
//   status saying plainly that nothing protects them (`cannotPin`).
//
// Every backend keeps its own retry pace and its own confirmation: a
// failing step is retried at a capped exponential backoff and never
// removes a pin.
import type { SetReason } from '../api/reasons.ts';
import type { RuntimeImage, RuntimeInfo } from '../cri/runtime.ts';
import type { RuntimeView } from '../cri/view.ts';

/** The runtime families a backend is chosen for (`--pin-backend`). */
export type PinBackendName = 'crio' | 'containerd' | 'none';

/**
 * Why pins the agent asked for are not in effect. A set holding one of the
 * `affected` references (or every set, with `affectsAll`) has this problem;
 * its severity beside the set's other problems is its reason's
 * (src/api/reasons.ts).
 */
export interface PinProblem {
  reason: SetReason;
  message: string;
  /** References whose pin is not in effect because of it. */
  affected: (ref: string) => boolean;
  affectsAll?: boolean;
}

/** The pins a backend finds before the plan is made. */
export interface PinsObserved {
  /** The references the agent's pins hold now: kept as they are while an observation is incomplete. */
  current: readonly string[];
  /** Pins set outside the agent that the agent's list carries over (CRI-O: the drop-ins read before its file). */
  carried: readonly string[];
}

/** What the runtime holds, as the core observed it this reconcile. */
export interface RuntimeState {
  /** The runtime answered Version since its last outage (CRI-O is never signalled before that). */
  readonly answered: boolean;
  readonly info: RuntimeInfo | undefined;
  /** Why the runtime could not be asked what it holds; undefined when it answered. */
  readonly error: string | undefined;
  readonly view: RuntimeView;
  /** Replace the view with a fresh ListImages (after a pin change that flips `pinned` on many images). */
  refresh(images: RuntimeImage[]): Promise<void>;
}

/** One image the plan wants, as the backend sees it. */
export interface PinTarget {
  /** The set's reference (by digest). */
  ref: string;
  runtimeHandler: string;
}

/** What the status needs from the pins, per set reference. */
export interface PinStatus {
  /** What the node status calls the place pins are kept (the pin file's name; containerd's label). */
  readonly where: string;
  /** The pin configuration changed in this reconcile (a file written, labels set). */
  readonly wrote: boolean;
  /** The runtime was told to apply it (CRI-O reloaded). */
  readonly reloaded: boolean;
  /** Whether the agent's pin configuration holds this reference (the pin file; a label it set or a hand pin it keeps). */
  holds(ref: string): boolean;
  /** The runtime's own `pinned` for an image it holds; undefined when this backend cannot read pins back. */
  reportsPinned(img: RuntimeImage): boolean | undefined;
  /** Pre-loading only: images count as in place when present, 0 pinned; a set is then Ready, PreloadedNotPinned (or RuntimeCannotPin with `cannotPin`). */
  readonly preloadOnly?: boolean;
  /**
   * How many pins the backend's own configuration holds now (CRI-O: the
   * references in its drop-in, 0 without one; containerd: the images
   * carrying pinset's label); undefined while that cannot be known. The
   * node status reports it; `pinset uninstall` waits for 0.
   */
  readonly held: number | undefined;
  /** WaitingForPin's message: `n` images present whose reference the configuration does not hold yet. */
  notHeld(n: number): string;
  /** WaitingForPin's message: `n` images held and present that the runtime does not report pinned yet. */
  notPinned(n: number): string;
  /** A problem that overrides every pin of every set (CRI-O: a later drop-in replacing pinned_images). */
  overridden?: { reason: SetReason; message: string };
  /**
   * Why this node's runtime cannot pin at all, naming the versions that
   * can; undefined where pins work or pre-loading was chosen. Not a
   * PinProblem: the status says it once for the node, and for a set only
   * once nothing keeps its images from being present (RuntimeCannotPin),
   * since only then are they pre-loaded.
   */
  readonly cannotPin?: string;
  /** The first problem keeping these references' pins from effect, in the order they are reported. */
  problemFor(refs: readonly string[]): { reason: SetReason; message: string } | undefined;
}

export interface PinBackend {
  readonly name: PinBackendName;
  /** The runtime reports `pinned` through CRI, and this backend reads it back (known once the runtime answered). */
  readonly readsPins: boolean;
  /** Before the plan: the pins held for the agent now, and those carried over. Logs its own findings once per change. */
  observe(): Promise<PinsObserved>;
  /**
   * Stage the planned list where the runtime reads it (CRI-O: write the
   * drop-in). Runs while the core waits for the runtime's image list, so a
   * backend that needs that list does its work in sync().
   */
  stage(pins: readonly string[]): Promise<void>;
  /** Make the runtime apply the staged list and confirm it (reload and read back; label and read back). */
  sync(runtime: RuntimeState, wanted: readonly PinTarget[], signal: AbortSignal): Promise<void>;
  /**
   * A present image reported unpinned under a reference the list pins:
   * would pulling the reference by name (downloading nothing) pin it?
   * CRI-O pins stored names, so a name it lacks is added by a pull.
   */
  wantsNamePull(ref: string, img: RuntimeImage): boolean;
  /** After pulls, before they are verified: pin what landed and confirm by it. */
  afterPulls(runtime: RuntimeState, wanted: readonly PinTarget[], pulled: readonly PinTarget[], signal: AbortSignal): Promise<void>;
  /** Last, with the verified view: see that the runtime has not dropped what it was told (CRI-O: reload when it contradicts its files). */
  audit(runtime: RuntimeState, wanted: readonly PinTarget[], signal: AbortSignal): Promise<void>;
  /** An image counts as in place when the runtime holds it under the reference and this says so. */
  inPlace(img: RuntimeImage): boolean;
  /** This reconcile's outcome, for the node status. */
  status(): PinStatus;
  /** When a failed or waiting step of this backend wants the next reconcile, if one does (`runtimeReachable` false: only steps that need no runtime count). */
  nextAttemptAt(runtimeReachable: boolean): number | undefined;
  /** Paths whose change should trigger a reconcile (a fixed configuration, a writable folder). */
  watchPaths(): { dir: string; recursive: boolean; name?: string; reason: string }[];
  /** The runtime's socket changed (a restarted runtime): a retry waiting on it may run now. */
  runtimeRestarted?(): void;
  /** For the reconcile's log line: how far the runtime's pins are known to follow the list. */
  readonly state: string | undefined;
  /**
   * For `pinset agent --drop-pins`, after observe(), stage([]) and sync():
   * what was removed and what still pins what, read now.
   */
  removal(): Promise<PinRemoval>;
  close(): void;
}

/** What a backend says once it has removed its pins (an empty plan staged and synced): the removal's report, in the runtime's own terms. */
export interface PinRemoval {
  /** One line: what was removed, as observe() found it before the removal, or that there was nothing to remove. */
  done: string;
  /** The name under which pinset's pins (as observe() found them) held `img`; undefined when they did not hold it. */
  heldAs(img: RuntimeImage): string | undefined;
  /** The pin that is not pinset's and holds `img` (another drop-in, CRI-O's pause image, a label set by hand); undefined when there is none. */
  pinnedBy(img: RuntimeImage): string | undefined;
  /** What to do when the runtime still reports pinned an image that nothing but pinset's removed pin held. */
  notApplied: string;
}
