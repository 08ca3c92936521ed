// ContainerdLabelPins: the pin backend for containerd (1.6.25+, 1.7.10+,
// 2.x). containerd's CRI plugin reports an image `pinned` while one of its
// image records carries io.cri-containerd.pinned=pinned, and the kubelet's
// image GC skips pinned images (issue 18). So:
//
// - pin: on the image-ID record (`sha256:<config digest>`, CRI's Image.id)
//   of each image a planned reference resolves to, set the pin label and
//   pinset's own label (pinset.dev/pinned=agent) in ONE Update. The ID
//   record, not the reference's: a CRI pull rewrites the pulled reference's
//   record whole (the kubelet's imagePullPolicy: Always wipes a label on a
//   tag or digest record), while the ID record keeps its labels through
//   every pull. The pin belongs to the image.
// - unpin: remove both labels, and only from records that carry pinset's
//   own label, when no planned reference resolves to the image any more. A
//   pin set by hand (the pin label without pinset's) is never touched, and
//   counts as held for the references it covers. Several references to one
//   image keep it pinned while any of them is planned.
// - never unpin on a fault: not while the runtime errored or its view is
//   incomplete, not when the labelled records could not be listed. A
//   failing label Update is a PinProblem (PinLabelFailed) and is retried at
//   a capped backoff (RetryGate); nothing is removed meanwhile.
// - confirm through CRI: after labelling, the last image labelled is polled
//   until CRI reports it pinned (containerd follows a label in a few ms,
//   event-driven), then one ListImages checks them all. An image labelled
//   but reported unpinned is a PinProblem (PinNotReported); a containerd
//   whose version cannot pin (containerdCanPin) is said as `cannotPin`,
//   with the versions that can (the status makes it RuntimeCannotPin once
//   a set's images are present), labels still set so an upgrade pins at its
//   start.
//
// There is nothing to stage (labels need image IDs, known only from the
// runtime's list) and no reload: sync() labels what is present, afterPulls()
// what landed. A name-only pull never helps: the pin is on the image, not on
// a name.
import type { Logger } from 'pino';
import type { ImageRuntime, RuntimeImage } from '../cri/runtime.ts';
import type { PinBackend, PinProblem, PinRemoval, PinsObserved, PinStatus, PinTarget, RuntimeState } from '../pins/backend.ts';
import { mapLimit } from '../util/limit.ts';
import { RetryGate, STEP_RETRY } from '../util/retry.ts';
import type { BackoffPolicy } from '../util/backoff.ts';
import type { ImageRecord } from './images.ts';
import { labelReport, readBack, type LabelChanges, type LabelReport } from './label-readback.ts';
import { diffLabels, idRecord, isDigestRef, isOwn, isPinned, OWN_FILTER, OWN_LABEL, OWN_VALUE, PIN_LABEL, PIN_VALUE, PINS_WHERE, resolveRecords, type LabelDiff, type Resolution } from './labels.ts';
import { containerdCanPin, PINNING_VERSIONS } from './versions.ts';

export { OWN_FILTER, OWN_LABEL, OWN_VALUE, PIN_LABEL, PIN_VALUE, PINS_WHERE } from './labels.ts';

/** containerd follows a label within 3-8 ms (1.7.24 here); past this bound a pin counts as not reported. */
export const CONFIRM_TIMEOUT_MS = 2_500;
/** Label Updates at once (each is a Get and an Update on containerd's socket). */
const LABEL_PARALLELISM = 8;

/** What the backend needs of containerd's Images service (ContainerdImages). */
export interface ImageLabels {
  list(filters?: readonly string[], signal?: AbortSignal): Promise<ImageRecord[]>;
  setLabels(name: string, labels: Record<string, string>, signal?: AbortSignal): Promise<ImageRecord>;
  close(): void;
}

export interface ContainerdLabelPinsOptions {
  images: ImageLabels;
  /** CRI, for reading `pinned` back (the same runtime the core uses). */
  runtime: ImageRuntime;
  log: Logger;
  confirmTimeoutMs?: number;
  policy?: BackoffPolicy;
  now?: () => number;
  random?: () => number;
}

const errMessage = (e: unknown) => (e instanceof Error ? e.message : String(e));

export class ContainerdLabelPins implements PinBackend {
  readonly name = 'containerd' as const;
  /** containerd's CRI reports `pinned` from the label (the versions that honour it are chosen by src/agent/boot/pin-kit.ts). */
  readonly readsPins = true;
  /** Labels changed in the current reconcile. */
  private changed = false;
  private readonly images: ImageLabels;
  private readonly runtime: ImageRuntime;
  private readonly log: Logger;
  private readonly confirmTimeoutMs: number;
  private readonly labelGate: RetryGate;
  /** Re-checks a pin CRI did not report (a restart into another version, a slow event). */
  private readonly reportGate: RetryGate;

  /** The references the core planned to pin (stage()); wanted targets are added in sync(). */
  private planned: readonly string[] = [];
  /** Planned reference -> the image-ID record it resolved to, at the last sync. */
  private resolved = new Map<string, string>();
  /** Image-ID records carrying the pin label (pinset's or a hand pin), as last known. */
  private pinnedRecords = new Set<string>();
  /** The digest references of images pinset labelled, from observe(). */
  private current: string[] = [];
  /** Records carrying pinset's label, as last listed; undefined until a list answered. */
  private ownRecords: number | undefined;
  /** The same, as observe() last found it (before a sync changed them). */
  private observedOwn: number | undefined;
  private labelProblem: (PinProblem & { records: Set<string> }) | undefined;
  private notReported: (PinProblem & { records: Set<string> }) | undefined;
  /** Why this containerd cannot pin (its version), once it answered. */
  private cannotPin: string | undefined;
  private lastState: string | undefined;
  private loggedHandPins = '';

  constructor(opts: ContainerdLabelPinsOptions) {
    this.images = opts.images;
    this.runtime = opts.runtime;
    this.log = opts.log.child({ pins: 'containerd' });
    this.confirmTimeoutMs = opts.confirmTimeoutMs ?? CONFIRM_TIMEOUT_MS;
    const gate = { policy: opts.policy ?? STEP_RETRY, now: opts.now, random: opts.random };
    this.labelGate = new RetryGate('labelling images in containerd', this.log, gate);
    this.reportGate = new RetryGate('confirming containerd reports the pins', this.log, gate);
  }

  get state(): string | undefined {
    return this.lastState;
  }

  /**
   * The digest references of the images whose records carry pinset's label
   * (one List of every record: the labelled ID records, and the names that
   * share their targets). Hand pins are not the agent's to carry: they stay
   * as they are, whatever the plan. A failed List keeps the last answer.
   */
  async observe(): Promise<PinsObserved> {
    try {
      const records = await this.images.list();
      this.ownRecords = records.filter((r) => isOwn(r.labels)).length;
      const ownTargets = new Set(records.filter((r) => isOwn(r.labels) && r.target).map((r) => r.target!.digest));
      this.current = [...new Set(records.filter((r) => r.target && ownTargets.has(r.target.digest) && isDigestRef(r.name)).map((r) => r.name))].sort();
      this.observedOwn = this.ownRecords;
    } catch (e) {
      this.log.warn({ err: errMessage(e), kept: this.current.length }, 'cannot list containerd image records: the pins held are taken as last seen');
    }
    return { current: this.current, carried: [] };
  }

  /** Nothing to write before the runtime's list is known: labels go on image IDs. */
  async stage(pins: readonly string[]): Promise<void> {
    this.planned = [...pins];
    this.changed = false;
  }

  async sync(runtime: RuntimeState, wanted: readonly PinTarget[], signal: AbortSignal): Promise<void> {
    await this.apply(runtime, wanted, { unpin: true, signal });
  }

  async afterPulls(runtime: RuntimeState, wanted: readonly PinTarget[], _pulled: readonly PinTarget[], signal: AbortSignal): Promise<void> {
    // Pins only: what landed is labelled; removals were decided in sync().
    await this.apply(runtime, wanted, { unpin: false, signal });
  }

  /** Nothing to check after verification: a label stays until removed, and sync() reads them all each reconcile. */
  async audit(): Promise<void> {}

  /** The pin is on the image: pulling another name of it changes nothing. */
  wantsNamePull(_ref?: string, _img?: RuntimeImage): boolean {
    return false;
  }

  inPlace(img: RuntimeImage): boolean {
    return img.pinned;
  }

  status(): PinStatus {
    const resolved = this.resolved;
    const pinned = this.pinnedRecords;
    const problems = [this.labelProblem, this.notReported].filter((p): p is PinProblem & { records: Set<string> } => p !== undefined);
    return {
      where: PINS_WHERE,
      wrote: this.changed,
      reloaded: false,
      held: this.ownRecords,
      notHeld: (n) => `${n} image(s) are present but not yet labelled ${PIN_LABEL}=${PIN_VALUE}`,
      notPinned: (n) => `${n} image(s) are labelled ${PIN_LABEL}=${PIN_VALUE} but not yet reported pinned by containerd`,
      holds: (ref) => {
        const rec = resolved.get(ref);
        return rec !== undefined && pinned.has(rec);
      },
      reportsPinned: (img) => img.pinned,
      cannotPin: this.cannotPin,
      problemFor: (refs) => {
        for (const p of problems) if (p.affectsAll || refs.some((r) => p.affected(r))) return { reason: p.reason, message: p.message };
        return undefined;
      },
    };
  }

  nextAttemptAt(): number | undefined {
    const at = [this.labelGate, this.reportGate].filter((g) => g.failing).map((g) => g.nextAt);
    return at.length ? Math.min(...at) : undefined;
  }

  watchPaths(): { dir: string; recursive: boolean; name?: string; reason: string }[] {
    return [];
  }

  /** A new containerd: its labels are read again at the next sync; a waiting retry may run now. */
  runtimeRestarted(): void {
    this.labelGate.expedite();
    this.reportGate.expedite();
  }

  /**
   * After the removal: the records that carried pinset's label as observe()
   * found them, and what pins an image now that is not pinset's: a record of
   * it with the pin label and without pinset's (a pin set by hand).
   */
  async removal(): Promise<PinRemoval> {
    let records: ImageRecord[] = [];
    try {
      records = (await this.images.list([`labels."${PIN_LABEL}"`])).filter((r) => isPinned(r.labels) && !isOwn(r.labels));
    } catch {
      records = [];
    }
    const held = new Set(this.current.map((r) => r.toLowerCase()));
    const own = this.observedOwn;
    return {
      done: own ? `removed pinset's labels (${OWN_LABEL}, ${PIN_LABEL}) from ${own} image record(s) in containerd` : "no containerd image carries pinset's label: nothing to remove",
      heldAs: (img) => [...img.repoDigests, ...img.repoTags].find((n) => held.has(n.toLowerCase())),
      pinnedBy: (img) => {
        const digests = new Set(img.repoDigests.map((d) => d.slice(d.lastIndexOf('@') + 1)));
        const r = records.find((x) => x.name === idRecord(img) || (x.target && digests.has(x.target.digest)));
        return r ? `the label ${PIN_LABEL}=${PIN_VALUE} on ${r.name} (not pinset's)` : undefined;
      },
      notApplied: 'the runtime has not applied the change; run `pinset agent --drop-pins` again',
    };
  }

  close(): void {
    this.images.close();
  }

  // ---------------------------------------------------------------------------

  /** Resolve, diff, label, read back: each a step below, in that order. */
  private async apply(runtime: RuntimeState, wanted: readonly PinTarget[], o: { unpin: boolean; signal: AbortSignal }): Promise<void> {
    if (runtime.error !== undefined || !runtime.answered) {
      // Nothing is known of what containerd holds: no label changes at all.
      this.lastState = 'runtime unavailable: labels left as they are';
      return;
    }
    this.cannotPin = this.versionProblem(runtime);
    const r = await resolveRecords(runtime, this.planned, wanted, (ref, handler) => this.runtime.imageStatus(ref, handler));
    this.resolved = r.resolved;
    if (!this.labelGate.due()) {
      this.lastState = `label updates failing; retrying at ${new Date(this.labelGate.nextAt).toISOString()}`;
      return;
    }
    const labelled = await this.listLabelled(r, o.signal);
    if (!labelled) return;
    const d = diffLabels(r, labelled, o.unpin);
    this.noteHandPins(d.handPins, r.byRecord);
    const done = await this.label(d, r, o.signal);
    await this.readBackChanges(runtime, r, d, done, o.signal);
    this.lastState = this.labelProblem
      ? 'label updates failing'
      : this.cannotPin
        ? 'labels set; this containerd does not honour them'
        : this.notReported
          ? 'labels set; not reported pinned'
          : 'labels set and reported';
  }

  /** The records that carry a pin label now (pinset's and by hand); undefined when containerd could not list them (a label problem). */
  private async listLabelled(r: Resolution, signal: AbortSignal): Promise<ImageRecord[] | undefined> {
    try {
      return await this.images.list([`labels."${PIN_LABEL}"`, OWN_FILTER], signal);
    } catch (e) {
      this.failLabels(`cannot list containerd image records: ${errMessage(e)}`, new Set(r.byRecord.keys()), r.refs);
      return undefined;
    }
  }

  /** Label, at most a few at once; the first failure stops the rest (containerd refuses them all alike). `d.labels` follows each answer. */
  private async label(d: LabelDiff, r: Resolution, signal: AbortSignal): Promise<{ pinned: string[]; unpinned: string[] }> {
    let failure: string | undefined;
    const failed = new Set<string>();
    const done = { pinned: [] as string[], unpinned: [] as string[] };
    const jobs = [...d.toPin.map((rec) => ({ rec, pin: true })), ...d.toUnpin.map((rec) => ({ rec, pin: false }))];
    await mapLimit(jobs, LABEL_PARALLELISM, async ({ rec, pin }) => {
      if (failure !== undefined || signal.aborted) {
        failed.add(rec);
        return;
      }
      try {
        const x = await this.images.setLabels(rec, pin ? { [PIN_LABEL]: PIN_VALUE, [OWN_LABEL]: OWN_VALUE } : { [PIN_LABEL]: '', [OWN_LABEL]: '' }, signal);
        d.labels.set(rec, x.labels);
        (pin ? done.pinned : done.unpinned).push(rec);
      } catch (e) {
        if ((e as { kind?: string }).kind === 'NotFound') {
          d.labels.delete(rec); // the image went away meanwhile: nothing to label
          return;
        }
        failed.add(rec);
        failure ??= `${pin ? 'pinning' : 'unpinning'} image ${r.byRecord.get(rec)?.refs[0] ?? rec} (${rec}): ${errMessage(e)}`;
      }
    });
    this.pinnedRecords = new Set([...d.labels].filter(([, l]) => isPinned(l)).map(([n]) => n));
    this.ownRecords = [...d.labels.values()].filter(isOwn).length;
    if (failure !== undefined) this.failLabels(failure, failed, r.refs.filter((ref) => failed.has(r.resolved.get(ref) ?? '')));
    else if (!signal.aborted) {
      this.labelGate.succeed();
      this.labelProblem = undefined;
    }
    return done;
  }

  /** What CRI reports now: an image whose pinset label went may stay pinned by another record's label. */
  private async readBackChanges(runtime: RuntimeState, r: Resolution, d: LabelDiff, done: { pinned: string[]; unpinned: string[] }, signal: AbortSignal): Promise<void> {
    const sameImage = (a: string, b: string) => d.targetOf.get(a) !== undefined && d.targetOf.get(a) === d.targetOf.get(b);
    const changes: LabelChanges = {
      pinned: done.pinned,
      removed: done.unpinned.map((record) => ({
        record,
        heldBy: [...d.labels].filter(([n, l]) => n !== record && sameImage(n, record) && isPinned(l) && !isOwn(l)).map(([n]) => n),
      })),
    };
    const images = await readBack(this.runtime, changes, { timeoutMs: this.confirmTimeoutMs, signal, wait: !this.cannotPin });
    if (images) await runtime.refresh(images);
    if (done.pinned.length || done.unpinned.length) {
      this.changed = true;
      this.logChanges(labelReport(changes, images), (done.pinned[0] && r.byRecord.get(done.pinned[0])?.refs[0]) || done.unpinned[0]);
    }
    this.confirm(runtime, r.byRecord, images);
  }

  /** Every labelled wanted image must be reported pinned, in the fresh list when there is one. */
  private confirm(runtime: RuntimeState, byRecord: Map<string, { img: RuntimeImage; refs: string[] }>, images: RuntimeImage[] | undefined): void {
    const byId = new Map((images ?? runtime.view.images).map((i) => [idRecord(i), i]));
    const unreported = [...byRecord.keys()].filter((rec) => this.pinnedRecords.has(rec) && byId.has(rec) && !byId.get(rec)!.pinned);
    if (unreported.length === 0 || this.cannotPin) {
      if (this.notReported) this.reportGate.succeed();
      this.notReported = undefined;
      return;
    }
    const first = byRecord.get(unreported[0]!)!;
    const records = new Set(unreported);
    const refsOf = new Set(unreported.flatMap((r) => byRecord.get(r)!.refs));
    const version = runtime.info?.runtimeVersion ?? 'of unknown version';
    const message =
      `containerd ${version} does not report image ${first.refs[0]} pinned although its record ${unreported[0]} carries ${PIN_LABEL}=${PIN_VALUE}` +
      (unreported.length > 1 ? ` (and ${unreported.length - 1} more images)` : '') +
      `; pins need containerd ${PINNING_VERSIONS}`;
    this.notReported = { reason: 'PinNotReported', message, affected: (ref) => refsOf.has(ref), records };
    this.reportGate.fail(message, { images: unreported.length });
  }

  /**
   * One line per pass, counting what CRI reports (not what was written),
   * and one naming an image that stays pinned by a label that is not
   * pinset's: its pinset pin is gone, the administrator's stays.
   */
  private logChanges(r: LabelReport, image: string | undefined): void {
    const unknown = r.pinned === undefined ? { readBack: 'CRI could not list the images' } : {};
    this.log.info({ labelled: r.labelled, labelsRemoved: r.labelsRemoved, pinned: r.pinned, unpinned: r.unpinned, stillPinned: r.stillPinned.length, image, ...unknown }, 'containerd image labels updated');
    const first = r.stillPinned[0];
    if (first) {
      this.log.info(
        { image: first.record, pinnedBy: first.heldBy, label: `${PIN_LABEL}=${PIN_VALUE}`, images: r.stillPinned.length },
        first.heldBy.length > 0
          ? "pinset's pin removed; containerd still reports the image pinned, by a label that is not pinset's (kept as it is)"
          : "pinset's pin removed; containerd still reports the image pinned",
      );
    }
  }

  private failLabels(error: string, records: Set<string>, refs: readonly string[]): void {
    const affected = new Set(refs);
    this.labelProblem = {
      reason: 'PinLabelFailed',
      message: `${error}; no pin is removed, retrying`,
      affected: (ref) => affected.has(ref),
      records,
    };
    this.labelGate.fail(error, { images: records.size });
    this.lastState = 'label updates failing';
  }

  private versionProblem(runtime: RuntimeState): string | undefined {
    const version = runtime.info?.runtimeVersion;
    if (!version) return undefined;
    const can = containerdCanPin(version);
    return can.ok ? undefined : can.why;
  }

  private noteHandPins(handPins: string[], byRecord: Map<string, { img: RuntimeImage; refs: string[] }>): void {
    const key = handPins.sort().join(',');
    if (key === this.loggedHandPins) return;
    this.loggedHandPins = key;
    if (handPins.length) this.log.info({ images: handPins.length, image: byRecord.get(handPins[0]!)?.refs[0] }, `images pinned by hand (${PIN_LABEL} without ${OWN_LABEL}) are kept as they are, and never unpinned by the agent`);
  }
}
