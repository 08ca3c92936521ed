// Keeping CRI-O's loaded pin list equal to what its files say: reload when
// the list differs from the one CRI-O is believed to have loaded (or the
// runtime contradicted it), confirm by reading `pinned` back, and pace
// every failure. The pure parts are ./loaded-pins.ts; why a reload must be
// confirmed at all is facts/crio-pinning.md (systemd's job ends when the
// signal is sent, CRI-O applies it 10-40 ms later or refuses it whole).
import type { Logger } from 'pino';
import type { ImageRuntime, RuntimeImage } from '../cri/runtime.ts';
import type { RuntimeView } from '../cri/view.ts';
import type { AgentMetrics } from '../metrics/agent-metrics.ts';
import type { PinProblem } from '../pins/backend.ts';
import { PIN_WAIT_TIMEOUT_MS, waitForPins, type PinProbe } from '../pins/confirm.ts';
import { Backoff, type BackoffPolicy } from '../util/backoff.ts';
import { Cancelled, checkpoint } from '../util/cancel.ts';
import { errMessage } from '../util/problem-log.ts';
import { RetryGate } from '../util/retry.ts';
import type { ConfigRejection } from './crio-config.ts';
import { namesProvenByPins, pinListKey, reloadProbes, tentativeProbes, TENTATIVE_WAIT_MS, type LoadedPins } from './loaded-pins.ts';
import type { Reloader } from './reloader.ts';

/** Where reload problems are recorded as Kubernetes Events. */
export interface PinEvents {
  record(type: 'Normal' | 'Warning', reason: string, message: string, key?: string): void;
}

/** A pin problem without the set-specific part. */
type ReloadFailure = Pick<PinProblem, 'reason' | 'message'>;

const lowercasedLists = new WeakMap<readonly string[], ReadonlySet<string>>();
/**
 * A pin list's patterns lowercased (CRI-O matches case-insensitively), made
 * once per list: asked for every wanted image, a scan of the list each time
 * was 1000 x 1000 comparisons for a set of 1000. Pin lists are never changed
 * once made.
 */
function lowercased(patterns: readonly string[]): ReadonlySet<string> {
  let set = lowercasedLists.get(patterns);
  if (!set) lowercasedLists.set(patterns, (set = new Set(patterns.map((p) => p.toLowerCase()))));
  return set;
}

export interface ReloadSyncOptions {
  runtime: ImageRuntime;
  reloader: Reloader;
  logger: Logger;
  metrics?: AgentMetrics | null;
  events?: PinEvents | null;
  /** Bound of the wait for CRI-O to apply a reload. */
  pinWaitTimeoutMs?: number;
  retryPolicy: BackoffPolicy;
  now: () => number;
}

/** What a reload step did, and the runtime's images afresh when a reload was seen applied. */
export interface ReloadOutcome {
  reloaded: boolean;
  problem?: PinProblem;
  images?: RuntimeImage[];
}

/** The effective list, as a step needs it: the patterns and the folder's refused files. */
export interface EffectiveList {
  patterns: string[];
  rejected: readonly ConfigRejection[];
  pauseImage: string;
}

export class ReloadSync {
  private readonly o: ReloadSyncOptions;
  private readonly log: Logger;
  /** What CRI-O is believed to have loaded, and how far that is known. */
  loaded: LoadedPins | undefined;
  private readonly gate: RetryGate;
  private failure: ReloadFailure | undefined;
  /** A reload is wanted but waits for its backoff. */
  private waiting = false;
  /** References known to be stored names in the runtime (lowercased). */
  private readonly knownNames = new Set<string>();
  /** Pace of reloads made because the runtime contradicted the loaded list. */
  private readonly evidenceBackoff: Backoff;
  private evidenceNextAt = 0;
  private evidenceWaiting = false;

  constructor(o: ReloadSyncOptions) {
    this.o = o;
    this.log = o.logger;
    this.gate = new RetryGate('reloading CRI-O', o.logger, { now: o.now, policy: o.retryPolicy });
    this.evidenceBackoff = new Backoff(o.retryPolicy);
  }

  /** At start, trust that CRI-O loaded what its files said before the agent wrote anything: a restart must not reload for nothing. */
  assume(patterns: string[]): void {
    this.loaded ??= { patterns, key: pinListKey(patterns), state: 'assumed', reloadedAt: 0 };
  }

  /** When a waiting reload (or a reload the runtime's answers call for) is due. */
  nextAttemptAt(): number | undefined {
    let at: number | undefined;
    if (this.waiting) at = this.gate.nextAt;
    if (this.evidenceWaiting) at = Math.min(at ?? Infinity, this.evidenceNextAt);
    return at;
  }

  private timeout(): number {
    return this.o.pinWaitTimeoutMs ?? PIN_WAIT_TIMEOUT_MS;
  }

  /** Is `ref` in the list CRI-O is believed to have loaded (and not contradicted)? */
  pinLoaded(ref: string): boolean {
    const l = this.loaded;
    if (!l || l.state === 'stale') return false;
    return lowercased(l.patterns).has(ref.toLowerCase());
  }

  /** What the runtime shows now teaches which references are stored names. */
  learnNames(view: RuntimeView, pauseImage: string): void {
    const l = this.loaded!;
    if (l.state === 'assumed' || l.state === 'confirmed') for (const n of namesProvenByPins(l.patterns, view, pauseImage)) this.knownNames.add(n);
    for (const n of [...this.knownNames]) if (!view.find(n)) this.knownNames.delete(n);
  }

  /** A pull adds the reference as a stored name. */
  pulledName(ref: string): void {
    this.knownNames.add(ref.toLowerCase());
  }

  rejectionProblem(rejected: readonly ConfigRejection[]): ReloadFailure {
    const first = rejected[0]!;
    const more = rejected.length > 1 ? ` (and ${rejected.length - 1} more file(s): ${rejected.slice(1, 4).map((r) => r.path).join(', ')})` : '';
    return {
      reason: 'CrioConfigRejected',
      message: `CRI-O would refuse its configuration, so it can neither apply these pins nor start: ${first.path}: ${first.error}${more}. Fix or remove the file; pinset reloads CRI-O as soon as the folder changes`,
    };
  }

  /** References in `effective` whose pin is not in effect in CRI-O now. */
  private affectedBy(effective: readonly string[]): (ref: string) => boolean {
    const eff = new Set(effective.map((p) => p.toLowerCase()));
    const l = this.loaded;
    const loaded = new Set((l?.patterns ?? []).map((p) => p.toLowerCase()));
    const all = l?.state === 'stale';
    return (ref) => eff.has(ref.toLowerCase()) && (all || !loaded.has(ref.toLowerCase()));
  }

  /**
   * Reload CRI-O when the list its files hold differs from the one it is
   * believed to have loaded (or the runtime contradicted it), unless its
   * folder would be refused or the last attempt's backoff runs; then confirm
   * by polling `pinned` of references whose state must flip. One reload per
   * change. Returns the runtime's images afresh when a reload was confirmed.
   */
  async sync(list: EffectiveList, view: RuntimeView, o: { reportsPins: boolean; answered: boolean; signal: AbortSignal; probes?: PinProbe[] }): Promise<ReloadOutcome> {
    const loaded = this.loaded!;
    const effective = list.patterns;
    const key = pinListKey(effective);
    this.waiting = false;
    if (key === loaded.key && (loaded.state === 'assumed' || loaded.state === 'confirmed' || loaded.state === 'unconfirmed')) {
      this.failure = undefined;
      return { reloaded: false };
    }
    const affected = this.affectedBy(effective);
    const { reloader, metrics, runtime } = this.o;
    if (reloader.mode === 'none') {
      // Something else reloads CRI-O (or its next start applies the files):
      // from here on the files are what it is believed to load, unless it
      // says otherwise.
      if (loaded.state !== 'stale') this.loaded = { patterns: effective, key, state: 'assumed', reloadedAt: 0 };
      return { reloaded: false };
    }
    if (list.rejected.length > 0) return { reloaded: false, problem: { ...this.rejectionProblem(list.rejected), affected } };
    if (!this.gate.due()) {
      this.waiting = true;
      return { reloaded: false, problem: this.failure ? { ...this.failure, affected } : undefined };
    }
    if (!o.answered) return { reloaded: false };
    const probes = o.probes ?? (o.reportsPins ? reloadProbes(loaded.patterns, effective, view, this.knownNames, list.pauseImage) : []);
    const started = this.o.now();
    try {
      await reloader.reload(o.signal);
    } catch (e) {
      if (o.signal.aborted) throw new Cancelled('superseded while reloading');
      const err = errMessage(e);
      const delay = this.gate.fail(err, { mode: reloader.mode, note: 'the pin file stays' });
      this.failure = { reason: 'ReloadFailed', message: `CRI-O was not reloaded after its pin list changed (retrying): ${err}` };
      this.waiting = true;
      metrics?.reloads.inc({ result: 'failure' });
      this.o.events?.record('Warning', 'ReloadFailed', `CRI-O reload failed (retrying in ${Math.round(delay / 1000)} s): ${err}`);
      return { reloaded: false, problem: { ...this.failure, affected } };
    }
    const signalledMs = this.o.now() - started;
    if (o.reportsPins && probes.length === 0) {
      // Nothing known to flip; but images the new list pins that the runtime
      // shows unpinned flip if their reference is a stored name (the common
      // case: pulled by digest). A short wait for them spares their
      // name-only pulls; if none flips, the pulls that follow confirm it.
      const tentative = tentativeProbes(loaded.patterns, effective, view);
      if (tentative.length > 0) {
        const r = await waitForPins(runtime, tentative, { timeoutMs: Math.min(TENTATIVE_WAIT_MS, this.timeout()), signal: o.signal });
        checkpoint(o.signal);
        if (r.applied) {
          for (const [ref, img] of r.last) if (img?.pinned) this.knownNames.add(ref.toLowerCase());
          return this.applied(effective, key, started, signalledMs, tentative.length);
        }
      }
    }
    if (!o.reportsPins || probes.length === 0) {
      // Nothing to read back now: the runtime reports no pins, or on CRI-O no
      // reference whose state must flip is present yet. The pulls that
      // follow confirm it (they add names the new list pins).
      this.loaded = { patterns: effective, key, state: o.reportsPins ? 'unconfirmed' : 'assumed', reloadedAt: started };
      this.succeeded();
      this.log.info({ mode: reloader.mode, durationMs: signalledMs, confirmed: false }, o.reportsPins ? 'CRI-O reloaded; nothing present shows the change yet, the pulls that follow confirm it' : 'CRI-O reloaded');
      return { reloaded: true };
    }
    const r = await waitForPins(runtime, probes, { timeoutMs: this.timeout(), signal: o.signal });
    checkpoint(o.signal);
    if (r.applied) return this.applied(effective, key, started, signalledMs, probes.length);
    if (r.unobservable) {
      this.loaded = { patterns: effective, key, state: 'unconfirmed', reloadedAt: started };
      this.succeeded();
      return { reloaded: true };
    }
    this.loaded = { ...loaded, reloadedAt: started };
    return { reloaded: true, problem: this.notApplied(probes[0]!, effective) };
  }

  private succeeded(): void {
    this.gate.succeed({ mode: this.o.reloader.mode });
    this.failure = undefined;
    this.o.metrics?.reloads.inc({ result: 'success' });
  }

  /** A reload seen applied: the list is CRI-O's; `pinned` changed under every image it touches, so the runtime is asked once more. */
  private async applied(effective: string[], key: string, started: number, signalledMs: number, probes: number): Promise<ReloadOutcome> {
    this.loaded = { patterns: effective, key, state: 'confirmed', reloadedAt: started };
    this.succeeded();
    this.o.metrics?.reloadConfirmSeconds.observe((this.o.now() - started) / 1000);
    this.log.info({ mode: this.o.reloader.mode, durationMs: signalledMs, confirmed: true, appliedAfterMs: this.o.now() - started, probes }, 'CRI-O reloaded and applied its pin list');
    const images = await this.o.runtime.listImages().catch(() => undefined);
    return { reloaded: true, images };
  }

  private confirm(how: string, waitedMs: number): void {
    if (!this.loaded) return;
    this.loaded = { ...this.loaded, state: 'confirmed' };
    this.o.metrics?.reloadConfirmSeconds.observe((this.o.now() - this.loaded.reloadedAt) / 1000);
    this.log.info({ how, waitedMs, appliedAfterMs: this.o.now() - this.loaded.reloadedAt }, 'CRI-O applied the reload');
  }

  /** A reload CRI-O did not apply within the bound: retried at the reload's pace; the sets say so. */
  private notApplied(probe: PinProbe, effective: readonly string[]): PinProblem | undefined {
    if (!this.loaded) return undefined;
    const message = `CRI-O did not apply its pin list within ${this.timeout()} ms of the reload: ImageStatus of ${probe.ref} still reports pinned=${!probe.expect}. CRI-O logs why ("Unable to reload configuration"); retrying`;
    // The list CRI-O holds is unknown: the references it pinned before may still be in effect, the new ones are not.
    const previous = this.loaded.state === 'unconfirmed' ? [] : this.loaded.patterns;
    this.loaded = { patterns: previous, key: pinListKey(previous), state: 'notApplied', reloadedAt: this.loaded.reloadedAt };
    const delay = this.gate.fail(message, { image: probe.ref });
    this.failure = { reason: 'ReloadNotApplied', message };
    this.waiting = true;
    this.o.metrics?.reloads.inc({ result: 'not_applied' });
    this.o.events?.record('Warning', 'ReloadNotApplied', `${message} in ${Math.round(delay / 1000)} s`);
    return { ...this.failure, affected: this.affectedBy(effective) };
  }

  /**
   * A reload that nothing could confirm before is confirmed by the pulled
   * images now: they hold their names, so once CRI-O has loaded its list
   * they report pinned.
   */
  async confirmByPulled(pulled: readonly string[], effective: readonly string[], signal: AbortSignal): Promise<PinProblem | undefined> {
    if (this.loaded?.state !== 'unconfirmed') return undefined;
    const probes: PinProbe[] = pulled.filter((ref) => this.pinLoaded(ref)).slice(0, 8).map((ref) => ({ ref, expect: true }));
    if (probes.length === 0) return undefined;
    const timeoutMs = Math.max(0, this.loaded.reloadedAt + this.timeout() - this.o.now());
    const r = await waitForPins(this.o.runtime, probes, { timeoutMs, signal });
    if (r.applied) this.confirm('pulled images report pinned', r.waitedMs);
    else if (!r.unobservable) return this.notApplied(probes[0]!, effective);
    return undefined;
  }

  /**
   * The runtime contradicting the loaded list: a reference CRI-O holds by
   * name, that the list it is believed to have loaded pins, reported
   * unpinned. CRI-O has not loaded its files (the agent stopped between
   * writing and reloading, or CRI-O was reloaded behind its back): reload,
   * paced, confirmed by those very references.
   */
  async checkEvidence(
    list: EffectiveList,
    view: RuntimeView,
    unpinned: readonly string[],
    o: { answered: boolean; signal: AbortSignal },
  ): Promise<ReloadOutcome | undefined> {
    const loaded = this.loaded!;
    const recentReload = loaded.state === 'unconfirmed' && this.o.now() - loaded.reloadedAt < this.timeout();
    const contradicting = recentReload ? [] : unpinned.filter((ref) => this.knownNames.has(ref.toLowerCase()) && this.pinLoaded(ref));
    this.evidenceWaiting = false;
    if (contradicting.length === 0) {
      this.evidenceBackoff.reset();
      return undefined;
    }
    this.log.warn({ images: contradicting.length, image: contradicting[0], state: loaded.state }, "CRI-O reports images unpinned that its files pin and that it holds by name: it has not loaded its files; reloading");
    this.loaded = { ...loaded, state: 'stale' };
    if (this.o.now() < this.evidenceNextAt) {
      this.evidenceWaiting = true;
      return undefined;
    }
    this.evidenceNextAt = this.o.now() + this.evidenceBackoff.fail();
    const probes = contradicting.slice(0, 8).map((ref) => ({ ref, expect: true }));
    return this.sync(list, view, { reportsPins: true, answered: o.answered, signal: o.signal, probes });
  }
}
