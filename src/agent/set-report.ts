// Report: each set's status on this node from one reconcile's facts
// (./status.ts, pure), written to the Node annotation by the reporter (at
// its own pace), Events for changes of phase, and the agent's metrics. What
// a set's generations were is remembered across reconciles and, through
// the annotation, across restarts.
//
// Each set's bytes on the node (src/api/set-bytes.ts) are counted from the
// sizes pull admission keeps (./known-sizes.ts), what the runtime holds,
// and what it says is still arriving (the download progress seam,
// src/pins/downloads.ts: containerd's ingests; none on CRI-O, where an
// image counts when it lands); the rate from the bytes at each report
// (SetRates), over the last minutes and over the seconds a pull of the set
// ran (the puller says which of its images it pulls now). Reports are made as a reconcile goes, when an image lands
// and every few seconds while pulls run: one read of what is arriving at a
// time, and a report asked for while one is read is made with it, from the
// newest facts (so bytes never go back because of an older read).
import type { NodeRuntime, NodeSetStatus, SetPhase } from '../api/types.ts';
import { readNodeStatus } from '../api/node-status.ts';
import { setBytes, SetRates } from '../api/set-bytes.ts';
import type { RuntimeInfo } from '../cri/runtime.ts';
import type { AgentMetrics } from '../metrics/agent-metrics.ts';
import type { PinStatus } from '../pins/backend.ts';
import type { DownloadProgress } from '../pins/downloads.ts';
import type { SetEstimate } from './estimate.ts';
import type { KnownSizes } from './known-sizes.ts';
import type { KubeObserver } from './kube.ts';
import type { EventRecorder } from './node-sinks.ts';
import { wantedKey, type Plan } from './plan.ts';
import type { ImagePuller } from './puller.ts';
import type { Admitted } from './pull-admission.ts';
import type { RuntimeSnapshot } from './runtime-state.ts';
import { computeSetStatuses, historyFromStatus, makeNodeStatus, pinsKeptMessage, type SetHistory } from './status.ts';
import type { StatusReporter } from './status-reporter.ts';
import type { DiskCheck } from './disk.ts';
import type { KubeletConfigWatch } from './kubelet-watch.ts';

export interface SetReportOptions {
  nodeName: string;
  reporter: StatusReporter;
  kube?: KubeObserver | null;
  events?: EventRecorder | null;
  metrics?: AgentMetrics | null;
  diskCheck?: DiskCheck | null;
  /** The kubelet's configuration, found on the node (or given by --kubelet-config, --kubelet-config-dir); null: not reported. */
  kubeletConfig?: KubeletConfigWatch | null;
  /** What the agent found on its node, with the pin backend in use, for the node status. */
  nodeRuntime?: () => NodeRuntime | undefined;
  /** What the runtime tells of downloads under way (absent: an image counts when it lands). */
  downloads?: DownloadProgress | null;
  now: () => number;
}

/** The node's runtime as its profile described it, with the pin backend in use and the runtime's last answer in their places (both may change after the start). */
export function currentRuntime(described: NodeRuntime, pinBackend: string, info: RuntimeInfo | undefined): NodeRuntime {
  const { name, version, ...rest } = described;
  const runtime = info ? { name: info.runtimeName, version: info.runtimeVersion } : name !== undefined ? { name, version } : {};
  return { ...runtime, ...rest, pinBackend };
}

/** One reconcile's facts, as they stand when a report is made. */
export interface ReportFacts {
  plan: Plan;
  runtime: RuntimeSnapshot;
  pins: PinStatus;
  puller: ImagePuller;
  estimates: ReadonlyMap<string, SetEstimate>;
  admitted?: Admitted;
  /** Per set key: why one of its pull secrets cannot be used. */
  pullSecretProblems?: ReadonlyMap<string, string>;
  /** The sizes of the wanted images' blobs, as pull admission keeps them. */
  sizes?: Pick<KnownSizes, 'blobs'> & Partial<Pick<KnownSizes, 'mirrored'>>;
}

type Bytes = { present: number; total: number };

export class SetReport {
  private readonly o: SetReportOptions;
  private history = new Map<string, SetHistory>();
  private readonly lastPhase = new Map<string, SetPhase>();
  private seeded = false;
  private readonly rates = new SetRates();
  /** The report waiting for its read of what is arriving, and the newest facts it is to be made from. */
  private pending: Promise<NodeSetStatus[]> | undefined;
  private latest: ReportFacts | undefined;

  constructor(o: SetReportOptions) {
    this.o = o;
  }

  /** The reporter's first wait for a progress-only write. */
  get progressIntervalMs(): number {
    return this.o.reporter.progressIntervalMs;
  }

  /** What the Node's annotation says already (once the Node is known): identical content is not written again, generations carry on. */
  seed(): void {
    if (this.seeded) return;
    const node = this.o.kube?.currentNode();
    if (!node && this.o.kube) return;
    this.seeded = true;
    const previous = readNodeStatus(node?.metadata?.annotations).status ?? null;
    this.o.reporter.seed(previous);
    for (const [k, v] of historyFromStatus(previous)) if (!this.history.has(k)) this.history.set(k, v);
  }

  /** Report the sets from `f` (or from facts newer still, when another report is asked for while this one reads what is arriving). */
  report(f: ReportFacts): Promise<NodeSetStatus[]> {
    this.latest = f;
    this.pending ??= this.arriving(f).then((arriving) => {
      this.pending = undefined;
      return this.make(this.latest!, arriving);
    });
    return this.pending;
  }

  /** What the runtime says is arriving of the blobs of the wanted images it does not hold; undefined when there is nothing to ask. */
  private async arriving(f: ReportFacts): Promise<ReadonlyMap<string, number> | undefined> {
    const { downloads } = this.o;
    if (!downloads || !f.sizes || f.runtime.error) return undefined;
    const held = new Set<string>();
    const missing = new Map<string, number>();
    for (const w of f.plan.wanted) {
      const blobs = f.sizes.blobs(w.reference.reference);
      if (!blobs) continue;
      if (f.runtime.found(w)) for (const d of blobs.keys()) held.add(d);
      else for (const [d, n] of blobs) missing.set(d, n);
    }
    for (const d of held) missing.delete(d);
    if (missing.size === 0) return undefined;
    return downloads.arrived(missing).catch(() => undefined);
  }

  /** Each planned set's bytes, where the sizes of all its images are known, and its rates while it downloads (over the last minutes, and over the seconds a pull of it ran); rates of sets no longer planned are forgotten. */
  private bytesOf(f: ReportFacts, arriving: ReadonlyMap<string, number> | undefined): { bytes: Map<string, Bytes>; rates: Map<string, number>; pullRates: Map<string, number>; mirrored: Set<string> } {
    const bytes = new Map<string, Bytes>();
    const rates = new Map<string, number>();
    const pullRates = new Map<string, number>();
    const mirrored = new Set<string>();
    const { sizes, runtime } = f;
    this.rates.retain(new Set(f.plan.sets.map((s) => s.key)));
    if (!sizes || runtime.error) return { bytes, rates, pullRates, mirrored };
    const at = this.o.now();
    const byKey = new Map(f.plan.wanted.map((w) => [w.key, w]));
    for (const s of f.plan.sets) {
      let pulling = false;
      const images = s.references.flatMap((r) => {
        const w = byKey.get(wantedKey(r.reference, s.runtimeHandler));
        if (w && f.puller.pulling(w.key)) pulling = true;
        return w ? [{ blobs: sizes.blobs(r.reference), present: Boolean(runtime.found(w)) }] : [];
      });
      const b = images.length > 0 ? setBytes(images, arriving) : undefined;
      if (!b) continue;
      bytes.set(s.key, b);
      if (sizes.mirrored && s.references.every((r) => sizes.mirrored!(r.reference))) mirrored.add(s.key);
      const rate = this.rates.observe(s.key, b, at, pulling);
      if (rate !== undefined) rates.set(s.key, rate);
      const pullRate = this.rates.pullRate(s.key, b);
      if (pullRate !== undefined) pullRates.set(s.key, pullRate);
    }
    return { bytes, rates, pullRates, mirrored };
  }

  private make(f: ReportFacts, arriving: ReadonlyMap<string, number> | undefined): NodeSetStatus[] {
    const { runtime, pins, plan } = f;
    const present = (w: Plan['wanted'][number]) => Boolean(runtime.found(w));
    const { bytes, rates, pullRates, mirrored } = this.bytesOf(f, arriving);
    const { sets, history } = computeSetStatuses({
      plan,
      pins,
      present,
      pinnedByRuntime: (w) => {
        const img = runtime.found(w);
        return img ? pins.reportsPinned(img) : undefined;
      },
      failure: (k) => f.puller.failure(k),
      runtimeError: runtime.error,
      history: this.history,
      estimates: f.estimates,
      rolloutWaits: f.admitted?.waits,
      rolloutUnenforced: f.admitted?.unenforced,
      firstWaves: f.admitted?.waves,
      pullSecretProblems: f.pullSecretProblems,
      bytes,
      rates,
      pullRates,
      mirrored,
    });
    this.history = history;
    this.o.reporter.report(
      makeNodeStatus(this.o.nodeName, pins.where, sets, new Date(this.o.now()).toISOString(), {
        imageFilesystemError: this.o.diskCheck?.unmeasured,
        cannotPin: pins.cannotPin,
        pins: pins.held,
        pinsKept: pinsKeptMessage(plan),
        kubeletVerification: this.o.kubeletConfig?.status(plan),
        runtime: this.o.nodeRuntime?.(),
      }),
    );
    this.recordEvents(sets, plan);
    this.updateMetrics(plan, sets, present, runtime.error === undefined);
    return sets;
  }

  private recordEvents(sets: NodeSetStatus[], plan: Plan): void {
    const ev = this.o.events;
    for (const s of sets) {
      const key = `${s.source}/${s.name}`;
      const before = this.lastPhase.get(key);
      this.lastPhase.set(key, s.phase);
      if (!ev) continue;
      if (s.phase === 'Ready' && before !== 'Ready') {
        const held = s.reason === 'PreloadedNotPinned' ? 'present, pre-loaded only (not pinned)' : 'present and pinned';
        ev.record('Normal', 'SetReady', `set ${s.name} (generation ${s.desiredGeneration}): all ${s.images.wanted} images ${held}`, key);
      }
      if (s.phase === 'Degraded' && s.reason === 'PinsOverridden') ev.record('Warning', 'PinsOverridden', s.message ?? s.reason, key);
      else if (s.phase === 'Degraded' && s.images.failed > 0) ev.record('Warning', 'PullFailed', `set ${s.name}: ${s.message ?? s.reason}`, key);
    }
    for (const k of [...this.lastPhase.keys()]) if (!plan.sets.some((s) => s.key === k)) this.lastPhase.delete(k);
  }

  private updateMetrics(plan: Plan, sets: NodeSetStatus[], present: (w: Plan['wanted'][number]) => boolean, reached: boolean): void {
    const m = this.o.metrics;
    if (!m) return;
    for (const p of ['Ready', 'Progressing', 'Degraded'] as SetPhase[]) m.setsByPhase.set({ phase: p }, sets.filter((s) => s.phase === p).length);
    m.imagesPinned.set(plan.pins.length);
    m.imagesWanted.set(plan.wanted.length);
    m.imagesPresent.set(plan.wanted.filter(present).length);
    if (reached) m.lastSuccess.set(this.o.now() / 1000);
  }
}
