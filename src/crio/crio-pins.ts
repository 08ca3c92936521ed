// CRI-O's pin backend: the agent's one drop-in holding `pinned_images`
// (./pinfile.ts), written when its content changes; CRI-O reloaded over
// D-Bus or systemctl and the reload confirmed by reading `pinned` back
// (./reload-sync.ts); a folder CRI-O would refuse found by reading it as
// CRI-O does (./crio-config.ts). Each failing step keeps its own pace: the
// write (~1 s doubling to ~1 min, and a cheap check every 2 s that brings
// the retry forward once the folder is writable with space again) and the
// reload. A fault never removes a pin: the previous file stays in place.
import * as fs from 'node:fs';
import * as fsp from 'node:fs/promises';
import * as path from 'node:path';
import type { Logger } from 'pino';
import type { RuntimeImage } from '../cri/runtime.ts';
import type { PinBackend, PinProblem, PinRemoval, PinsObserved, PinStatus, PinTarget, RuntimeState } from '../pins/backend.ts';
import { checkpoint } from '../util/cancel.ts';
import { errMessage, ProblemLog } from '../util/problem-log.ts';
import { RetryGate } from '../util/retry.ts';
import type { ConfigRejection } from './crio-config.ts';
import { pinMatches } from './pin-match.ts';
import { effectivePins, renderPinFile, type DropinPins, type DropinScan, type PinFile } from './pinfile.ts';
import { ReloadSync, type EffectiveList, type ReloadOutcome, type ReloadSyncOptions } from './reload-sync.ts';

/** While the pin file cannot be written, this often a cheap check (access + statfs) looks for the cause clearing. */
const WRITE_PROBE_MS = 2_000;
/** Free space under which the drop-in folder counts as full for that check. */
const WRITE_PROBE_MIN_FREE = 64 * 1024;

/** What the reloads need (./reload-sync.ts), and the pin file. */
export interface CrioPinsOptions extends ReloadSyncOptions {
  pinFile: PinFile;
  /** The write probe found the folder writable again: retry now. */
  onWritable: (why: string) => void;
}

export class CrioPins implements PinBackend {
  readonly name = 'crio' as const;
  private readonly o: CrioPinsOptions;
  private readonly log: Logger;
  private readonly problems: ProblemLog;
  private readonly reloads: ReloadSync;
  private readonly writeGate: RetryGate;
  private writeProbe: NodeJS.Timeout | undefined;
  private writeProbeOk: boolean | undefined;
  private lastRejectionKey = '[]';
  private noPinsLogged = false;

  // This reconcile's facts.
  private scan: DropinScan | undefined;
  private pinsInFile: ReadonlySet<string> = new Set();
  private list: EffectiveList = { patterns: [], rejected: [], pauseImage: '' };
  private writeError: string | undefined;
  private problem: PinProblem | undefined;
  private reportsPins = false;
  private held: number | undefined;
  private wrote = false;
  private reloaded = false;

  constructor(o: CrioPinsOptions) {
    this.o = o;
    this.log = o.logger;
    this.problems = new ProblemLog(o.logger);
    this.writeGate = new RetryGate('writing the pin file', o.logger, { now: o.now, policy: o.retryPolicy });
    this.reloads = new ReloadSync(o);
  }

  get readsPins(): boolean {
    return this.reportsPins;
  }

  get state(): string | undefined {
    return this.reloads.loaded?.state;
  }

  async observe(): Promise<PinsObserved> {
    const scan = (this.scan = await this.o.pinFile.scan());
    this.problems.begin();
    for (const f of scan.overriding) this.problems.warn({ file: f.file, pinFile: this.o.pinFile.name }, 'a drop-in sorting after the pin file sets pinned_images and overrides every pin');
    return { current: scan.ownPins, carried: scan.before.flatMap((b) => b.pins) };
  }

  /** Write the file if its content changed (at the write's own pace while it fails). */
  async stage(pins: readonly string[]): Promise<void> {
    const { pinFile, metrics } = this.o;
    const scan = this.scan!;
    this.wrote = this.reloaded = false;
    this.writeError = this.problem = undefined;
    // No pin at all: no file. An empty list in the file that sorts last
    // would replace (unpin) every earlier file's pins.
    const content = pins.length > 0 ? renderPinFile(pins) : null;
    if (scan.ownContent !== content) {
      if (this.writeGate.due()) {
        try {
          if (content === null) {
            const removed = await pinFile.remove();
            this.log.info({ pinFile: pinFile.path, removed }, 'pin file removed: the agent holds no pin on this node');
          } else {
            await pinFile.write(content);
            this.log.info({ pinFile: pinFile.path, pins: pins.length, created: scan.ownContent === null ? true : undefined }, 'pin file written');
            const stale = await pinFile.removeStaleOwnedFiles();
            if (stale.length) this.log.info({ removed: stale }, 'removed older pin files of this agent');
          }
          this.wrote = true;
          this.writeGate.succeed({ pinFile: pinFile.path });
          metrics?.pinFileWrites.inc();
        } catch (e) {
          this.writeError = errMessage(e);
          this.writeGate.fail(this.writeError, { pinFile: pinFile.path, note: 'the previous file stays in place' });
          this.startWriteProbe();
        }
      } else {
        this.writeError = this.writeGate.error ?? 'waiting to retry';
      }
    } else if (this.writeGate.failing) {
      this.writeGate.succeed({ pinFile: pinFile.path });
    }
    if (!this.writeGate.failing) this.stopWriteProbe();
    const hasOwnFile = this.wrote ? content !== null : scan.ownContent !== null;
    this.pinsInFile = new Set(this.wrote ? pins : scan.ownPins);
    this.held = hasOwnFile ? this.pinsInFile.size : 0;
    // What CRI-O loads from its folder now, and whether it would load it at all.
    const rejected = scan.rejected.filter((r) => !(this.wrote && r.path === pinFile.path));
    this.list = { patterns: effectivePins(scan, hasOwnFile ? [...this.pinsInFile] : null), rejected, pauseImage: scan.pauseImage };
    this.noteRejected(rejected);
    this.reloads.assume(effectivePins(scan, scan.ownContent !== null ? scan.ownPins : null));
  }

  /** Bring CRI-O's loaded list to what its files say: reload, confirm. */
  async sync(runtime: RuntimeState, _wanted: readonly PinTarget[], signal: AbortSignal): Promise<void> {
    if (runtime.error) {
      // CRI-O is unreachable and would refuse its configuration: that is likely why.
      if (this.list.rejected.length > 0) this.problem = { ...this.reloads.rejectionProblem(this.list.rejected), affected: () => true, affectsAll: true };
      return;
    }
    this.reportsPins = (runtime.info?.runtimeName ?? '').toLowerCase() === 'cri-o';
    if (!this.reportsPins && !this.noPinsLogged) {
      this.noPinsLogged = true;
      this.log.info({ runtime: runtime.info?.runtimeName }, 'the runtime reports no pins: images count as in place when it holds them under the set reference, and reloads are not confirmed');
    }
    if (this.reportsPins) this.reloads.learnNames(runtime.view, this.list.pauseImage);
    const r = await this.reloads.sync(this.list, runtime.view, { reportsPins: this.reportsPins, answered: runtime.answered, signal });
    await this.took(r, runtime);
    checkpoint(signal);
  }

  private async took(r: ReloadOutcome | undefined, runtime: RuntimeState): Promise<void> {
    if (!r) return;
    this.reloaded ||= r.reloaded;
    this.problem = r.problem ?? this.problem;
    if (r.images) await runtime.refresh(r.images);
  }

  wantsNamePull(ref: string, img: RuntimeImage): boolean {
    return this.reportsPins && !img.pinned && this.pinsInFile.has(ref) && this.reloads.pinLoaded(ref);
  }

  async afterPulls(_runtime: RuntimeState, _wanted: readonly PinTarget[], pulled: readonly PinTarget[], signal: AbortSignal): Promise<void> {
    const byName = pulled.filter((p) => !p.runtimeHandler).map((p) => p.ref);
    for (const ref of byName) this.reloads.pulledName(ref);
    if (this.reportsPins) this.problem = (await this.reloads.confirmByPulled(byName, this.list.patterns, signal)) ?? this.problem;
  }

  async audit(runtime: RuntimeState, wanted: readonly PinTarget[], signal: AbortSignal): Promise<void> {
    if (!this.reportsPins || runtime.error) return;
    const unpinned = wanted
      .filter((w) => {
        if (w.runtimeHandler || !this.pinsInFile.has(w.ref)) return false;
        const img = runtime.view.find(w.ref);
        return img !== undefined && !img.pinned;
      })
      .map((w) => w.ref);
    await this.took(await this.reloads.checkEvidence(this.list, runtime.view, unpinned, { answered: runtime.answered, signal }), runtime);
  }

  inPlace(img: RuntimeImage): boolean {
    return !this.reportsPins || img.pinned;
  }

  status(): PinStatus {
    return crioPinStatus({
      pinFile: this.o.pinFile.name,
      pinsInFile: this.pinsInFile,
      reportsPins: this.reportsPins,
      overriding: this.scan?.overriding ?? [],
      writeError: this.writeError,
      problem: this.problem,
      wrote: this.wrote,
      reloaded: this.reloaded,
      held: this.held,
    });
  }

  nextAttemptAt(runtimeReachable: boolean): number | undefined {
    let at = runtimeReachable ? this.reloads.nextAttemptAt() : undefined;
    if (this.writeGate.failing) at = Math.min(at ?? Infinity, this.writeGate.nextAt);
    return at;
  }

  watchPaths(): { dir: string; recursive: boolean; name?: string; reason: string }[] {
    const { pinFile } = this.o;
    return [
      // CRI-O reads the whole folder, subfolders included: a change anywhere
      // may fix (or break) what a reload would load.
      { dir: pinFile.dir, recursive: true, reason: 'drop-in folder changed' },
      { dir: path.dirname(pinFile.mainConfig), recursive: false, name: path.basename(pinFile.mainConfig), reason: 'crio.conf changed' },
    ];
  }

  /** Logs (once per change) and records an Event when CRI-O would refuse its folder. */
  private noteRejected(rejected: readonly ConfigRejection[]): void {
    const key = JSON.stringify(rejected);
    this.o.metrics?.configRejected.set(rejected.length);
    if (key === this.lastRejectionKey) return;
    this.lastRejectionKey = key;
    if (rejected.length === 0) {
      this.log.info('CRI-O would accept its configuration again');
      return;
    }
    this.log.error({ files: rejected }, 'CRI-O would refuse its configuration (a reload would fail, a restart would not start): not reloading until the folder changes');
    this.o.events?.record('Warning', 'CrioConfigRejected', this.reloads.rejectionProblem(rejected).message);
  }

  /** While writing fails: a cheap check (access + statfs) every few seconds brings the retry forward when the cause clears. */
  private startWriteProbe(): void {
    if (this.writeProbe) return;
    const dir = this.o.pinFile.dir;
    const check = async () => {
      let ok: boolean;
      try {
        await fsp.access(dir, fs.constants.W_OK);
        const st = await fsp.statfs(dir);
        // Root may use the blocks reserved for it; others only the available ones.
        const free = (process.getuid?.() === 0 ? st.bfree : st.bavail) * st.bsize;
        ok = free >= WRITE_PROBE_MIN_FREE;
      } catch {
        ok = false;
      }
      if (ok && this.writeProbeOk === false && this.writeGate.failing) {
        this.log.info({ dir }, 'the drop-in folder looks writable again; retrying the pin file now');
        this.writeGate.expedite();
        this.o.onWritable('drop-in folder writable again');
      }
      this.writeProbeOk = ok;
    };
    void check();
    this.writeProbe = setInterval(() => void check(), WRITE_PROBE_MS);
    this.writeProbe.unref();
  }

  private stopWriteProbe(): void {
    clearInterval(this.writeProbe);
    this.writeProbe = undefined;
    this.writeProbeOk = undefined;
  }

  /**
   * After the removal: the pin file as observe() found it (its pins, which
   * CRI-O's patterns may be), and what pins an image now that is not
   * pinset's: the last file that sets pinned_images (CRI-O keeps only its
   * list), or the pause image.
   */
  async removal(): Promise<PinRemoval> {
    const { pinFile, reloader } = this.o;
    const held = this.scan?.ownPins ?? [];
    const now = await pinFile.scan();
    const last = now.overriding.at(-1) ?? now.before.at(-1);
    const namesOf = (img: RuntimeImage) => [...img.repoDigests, ...img.repoTags];
    return {
      done:
        this.scan?.ownContent != null
          ? `removed ${pinFile.path} (${held.length} pin(s)); CRI-O ${reloader.mode === 'none' ? 'not reloaded (--reload none)' : `reloaded (${reloader.mode})`}`
          : `no pinset drop-in in ${pinFile.dir}: nothing to remove`,
      heldAs: (img) => namesOf(img).find((n) => held.some((p) => pinMatches(p, n))),
      pinnedBy: (img) => {
        const names = namesOf(img);
        if (now.pauseImage && names.some((n) => pinMatches(now.pauseImage, n))) return `CRI-O's pause image (${now.pauseImage})`;
        const pattern = last?.pins.find((p) => names.some((n) => pinMatches(p, n)));
        return pattern && last ? `${last.file} (pinned_images "${pattern}")` : undefined;
      },
      notApplied: reloader.mode === 'none' && this.reportsPins ? 'reload CRI-O (systemctl reload crio) to apply the change' : 'the runtime has not applied the change; run `pinset agent --drop-pins` again',
    };
  }

  close(): void {
    this.stopWriteProbe();
  }
}

/** What CRI-O's pins say for the node status: the reasons and messages docs/status.md documents. */
export function crioPinStatus(f: {
  pinFile: string;
  /** Pins the agent's file holds on disk after this reconcile. */
  pinsInFile: ReadonlySet<string>;
  reportsPins: boolean;
  /** Drop-ins sorting after the pin file that set pinned_images. */
  overriding: readonly DropinPins[];
  /** The pin file could not be written. */
  writeError?: string;
  /** Why pins in the file are not (yet) in effect: ReloadFailed, ReloadNotApplied, CrioConfigRejected. */
  problem?: PinProblem;
  wrote?: boolean;
  reloaded?: boolean;
  /** Pins in the agent's file (0 without one); undefined before the folder was read. */
  held?: number;
}): PinStatus {
  const { pinFile: where, pinsInFile, writeError, problem, overriding } = f;
  const others = overriding.length > 1 ? ` (and ${overriding.length - 1} more ${overriding.length - 1 === 1 ? 'file' : 'files'})` : '';
  return {
    where,
    wrote: f.wrote ?? false,
    reloaded: f.reloaded ?? false,
    held: f.held,
    holds: (ref) => pinsInFile.has(ref),
    reportsPinned: (img) => (f.reportsPins ? img.pinned : undefined),
    notHeld: (n) => `${n} image(s) are present but not yet in the pin file ${where}`,
    notPinned: (n) => `${n} image(s) are in the pin file but not yet reported pinned by the runtime`,
    ...(overriding.length > 0
      ? {
          overridden: {
            reason: 'PinsOverridden',
            message: `${overriding[0]!.file}${others} sets pinned_images and sorts after ${where}; CRI-O keeps only the last list, so no pin of this set is in effect. Remove pinned_images there (pins in files that sort before ${where} are carried over)`,
          },
        }
      : {}),
    problemFor: (refs) => {
      // A write that fails leaves the previous file in place: only sets with references it lacks are held up.
      if (writeError && refs.some((r) => !pinsInFile.has(r))) return { reason: 'PinFileWriteFailed', message: `the pin file ${where} could not be written: ${writeError}` };
      if (problem && (problem.affectsAll || refs.some((r) => problem.affected(r)))) return { reason: problem.reason, message: problem.message };
      return undefined;
    },
  };
}
