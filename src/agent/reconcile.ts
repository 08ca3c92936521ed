// One reconcile, as DESIGN.md names its phases: observe, plan (pure), pins,
// pull admission, pulls, verify, report. Each phase is a call into the part
// that owns its state; the pin backend (src/pins/backend.ts) is the one
// seam between this core and the runtime's way of pinning. Idempotent:
// running it twice changes nothing.
import type { Logger } from 'pino';
import type { NodeSetStatus } from '../api/types.ts';
import type { PinBackend, PinTarget } from '../pins/backend.ts';
import type { PinChoice } from '../pins/choice.ts';
import type { FirstWave } from '../rollout/first-wave.ts';
import type { RolloutGate } from '../rollout/gate.ts';
import { checkpoint } from '../util/cancel.ts';
import { errMessage } from '../util/problem-log.ts';
import type { SetSources } from './observe.ts';
import type { AgentCredentials } from './image-credentials.ts';
import { planReconcile, type Plan, type WantedImage } from './plan.ts';
import type { Presence } from './presence.ts';
import type { PullAdmission } from './pull-admission.ts';
import { WaveLandings } from './rollout-hook.ts';
import { progressReportMs, pullsNeeded, runPulls } from './pulls.ts';
import type { ImagePuller } from './puller.ts';
import type { RuntimeObserver } from './runtime-state.ts';
import type { SetReport } from './set-report.ts';

export interface ReconcileResult {
  plan: Plan;
  sets: NodeSetStatus[];
  wrote: boolean;
  reloaded: boolean;
  pullsAttempted: number;
  runtimeReachable: boolean;
}

/** The parts a reconcile calls, each owning its state across reconciles. */
export interface ReconcileParts {
  log: Logger;
  runtime: RuntimeObserver;
  sets: SetSources;
  pins: PinChoice;
  admission: PullAdmission;
  puller: ImagePuller;
  rolloutGate?: RolloutGate | null;
  firstWave?: FirstWave | null;
  credentials?: AgentCredentials | null;
  presence: Presence;
  report: SetReport;
  now: () => number;
}

const target = (w: WantedImage): PinTarget => ({ ref: w.reference.reference, runtimeHandler: w.runtimeHandler });

/** One reconcile. Throws Cancelled when superseded (`signal` aborted) at its next safe point. */
export async function reconcile(p: ReconcileParts, signal: AbortSignal): Promise<ReconcileResult> {
  // 1. Observe. What the runtime holds is asked for at once and read once
  // the pins are staged: the pin file's fsyncs and its answer overlap.
  const observing = p.runtime.observe();
  p.report.seed();
  const pins: PinBackend = p.pins.for(await p.runtime.identified());
  const observed = await p.sets.observe();
  const held = await pins.observe();
  checkpoint(signal);

  // 2. Plan (pure): the sets that select this node, the wanted images, the pin list.
  const plan = planReconcile({ ...observed, currentPins: held.current, carriedPins: held.carried });
  p.sets.notePlan(plan);
  p.credentials?.notePlan(plan);
  p.admission.prepare(plan, p.presence.knownPresent, observing, signal);

  // 3. Pins: the list staged while the runtime answers, then applied and confirmed.
  await pins.stage(plan.pins);
  const runtime = await observing;
  await runtime.readHandlerImages(plan.wanted);
  p.presence.noteRemoved(plan, runtime);
  const targets = plan.wanted.map(target);
  await pins.sync(runtime, targets, signal);
  checkpoint(signal);

  // 4. Pull admission: what is missing, and what of it may start now (disk, rollout slots, size estimate).
  await p.credentials?.secretsReady();
  const need = pullsNeeded(plan, runtime, pins, p.puller, p.log);
  const admitted = await p.admission.admit(plan, need.toPull, need.isName, runtime, p.sets.problems, signal);
  const report = (final = false) =>
    p.report.report({ plan, runtime, pins: pins.status(), puller: p.puller, estimates: p.admission.estimates, sizes: p.admission.imageSizes, admitted, pullSecretProblems: p.credentials?.setProblems(plan, final) });
  const progress = () => void report().catch((e: unknown) => p.log.warn({ err: errMessage(e) }, 'progress report failed'));

  // 5. Pulls, reporting progress while they run (as each image lands, and every few seconds); a first-wave node records each image as it lands.
  const waitingForSlot = need.toPull.length - admitted.pulling.length;
  const reportEveryMs = progressReportMs(p.report.progressIntervalMs);
  const landings = new WaveLandings(p.firstWave, plan, (w) => !!runtime.found(w));
  const onLanded = (w: WantedImage) => landings.landed(w);
  const { pulled, failed, attempted } = await runPulls({ puller: p.puller, log: p.log, runtime, pins, report: progress, reportEveryMs, waitingForSlot, onLanded, mayStart: admitted.mayStart, oneAtATime: admitted.oneAtATime }, need, admitted.pulling, signal);
  await landings.settle(failed.filter((w) => !need.isName(w)));
  if (admitted.pulling.length > 0) await p.rolloutGate?.releaseAll();

  // 6. Verify: what landed is pinned and confirmed, then read back; last, the runtime checked against its pins.
  if (pulled.length > 0) {
    await pins.afterPulls(runtime, targets, pulled.map(target), signal);
    await runtime.verify(pulled);
  }
  await pins.audit(runtime, targets, signal);

  // 7. Report.
  p.admission.forgetDone(plan, runtime);
  const sets = await report(true);
  p.presence.record(plan, runtime, pins, p.now());
  const status = pins.status();
  return { plan, sets, wrote: status.wrote, reloaded: status.reloaded, pullsAttempted: attempted, runtimeReachable: runtime.error === undefined };
}
