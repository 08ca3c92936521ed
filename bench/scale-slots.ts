// The scale benchmark's rollout-slot sections (bench/scale.ts runs them):
// the agents' slot protocol (src/rollout/gate.ts over Lease slots, the
// in-process API server) driven by simulated nodes
// (test/support/rollout-agents.ts), each case twice: "polling" is the
// protocol before the hand-over (no queue, no granter: every waiting node
// polls), "hand-over" is the queue with the controller's granter (`pinset
// controller`, a process of its own, as deployed). Slot Leases of 60 s, the
// agents' default, unless said.
//
//   - a small fleet (6 nodes, 2 s downloads): maxConcurrentNodes 1, the fleet
//     time and how long each freed slot stayed free; maxConcurrentNodes 6,
//     how long until every slot is taken (the first attempts' jitter);
//   - 5000 nodes waiting for 50 slots: the API requests and writes per
//     second while they wait (the holders hold for BENCH_SCALE_SLOT_HOLD_SECONDS,
//     240; measured over its last 90 s, once the polls have reached their
//     pace), then the slots handed over for 60 s of 1 to 5 s downloads, and
//     how long each freed slot stayed free;
//   - the first wave's records: BENCH_SCALE_WAVE_NODES (5000) nodes waiting
//     on one set's first wave follow its record by name while the member
//     lands 20 images, one every 2 s: the API cost of each landing and how
//     long until every node has heard of it.
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { AGENT_FIELD_MANAGER } from '../src/agent/node-sinks.ts';
import { API_VERSION, KIND } from '../src/api/types.ts';
import { FirstWave, type WaveSet } from '../src/rollout/first-wave.ts';
import { clientNodeLeaseApi } from '../src/rollout/lease-api.ts';
import { LeaseWaveRecords } from '../src/rollout/lease-records.ts';
import { LeaseRolloutSlots, type LeaseApi } from '../src/rollout/lease-slots.ts';
import { DEFAULT_SLOT_NAMESPACE, landedName, slotFree, slotIndex, slotSelector, type RolloutSet } from '../src/rollout/slots.ts';
import { silentLogger } from '../src/util/log.ts';
import type { ApiServer, RecordedRequest } from '../test/support/apiserver.ts';
import { handoverLatencies, simulateRollout } from '../test/support/rollout-agents.ts';

const NS = DEFAULT_SLOT_NAMESPACE;
const LEASE_MS = 60_000;
const BIG_NODES = Number(process.env.BENCH_SCALE_HANDOVER_NODES ?? 5000);
const BIG_MAX = Number(process.env.BENCH_SCALE_HANDOVER_MAX ?? 50);
const HOLD_S = Number(process.env.BENCH_SCALE_SLOT_HOLD_SECONDS ?? 240);
const HANDOVER_S = 60;
const SMALL_RUNS = Number(process.env.BENCH_SCALE_SLOT_SMALL_RUNS ?? 3);
const WAVE_NODES = Number(process.env.BENCH_SCALE_WAVE_NODES ?? 5000);
const WAVE_IMAGES = 20;

export type Mode = 'polling' | 'hand-over';
/** BENCH_SCALE_SLOT_MODES, BENCH_SCALE_SLOT_PARTS: which of them to run (all by default). */
const MODES = (process.env.BENCH_SCALE_SLOT_MODES ?? 'polling,hand-over').split(',') as Mode[];
// Any other word would run as polling under that word's name.
for (const m of MODES) if (m !== 'polling' && m !== 'hand-over') throw new Error(`BENCH_SCALE_SLOT_MODES: ${JSON.stringify(m)} is neither "polling" nor "hand-over"`);
const PARTS = new Set((process.env.BENCH_SCALE_SLOT_PARTS ?? 'small,big,wave').split(','));

export interface SlotBenchOptions {
  api: ApiServer;
  say: (line?: string) => void;
  /** `pinset controller` on this API server, leading (its granter on); stop() ends it. */
  startController: () => Promise<{ stop(): Promise<void> }>;
}

const median = (xs: number[]) => {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor((s.length - 1) / 2)]!;
};
const pct = (xs: number[], p: number) => {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))]!;
};
const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);
const r1 = (n: number) => Math.round(n * 10) / 10;

function createSet(api: ApiServer, name: string, rollout: Record<string, unknown>): RolloutSet & { uid: string } {
  const existing = api.get('pinnedimagesets', name);
  if (existing) api.remove('pinnedimagesets', name);
  const obj = api.create({ apiVersion: API_VERSION, kind: KIND, metadata: { name }, spec: { rollout, pinnedImages: [{ name: `registry.example.com/bench/${name}@sha256:${'e'.repeat(64)}` }] } });
  return { name, uid: obj.metadata.uid!, maxConcurrentNodes: Number(rollout.maxConcurrentNodes ?? 1) };
}

function clearLeases(api: ApiServer): void {
  for (const l of api.list('leases', { namespace: NS })) if (l.metadata.name !== 'pinset-controller') api.remove('leases', l.metadata.name!, NS);
}

/** The controller's requests: its granter (KubeHttp, User-Agent pinset-controller) and its leader election Lease. */
const byController = (r: RecordedRequest) => r.userAgent.startsWith('pinset-controller') || r.path.endsWith('/leases/pinset-controller');

/** The Lease requests of the agents (or the controller's) in [from, to), per second, by kind. */
function leaseLoad(reqs: readonly RecordedRequest[], from: number, to: number, controller = false) {
  const seconds = (to - from) / 1000;
  const agents = reqs.filter((r) => r.at >= from && r.at < to && r.path.includes('/leases') && byController(r) === controller);
  const kind = (r: RecordedRequest) => (r.query.watch === 'true' ? 'watch' : r.method === 'GET' ? (r.path.endsWith('/leases') ? 'list' : 'get') : r.method.toLowerCase());
  const by: Record<string, number> = {};
  for (const r of agents) by[kind(r)] = (by[kind(r)] ?? 0) + 1;
  const perSecond = Object.fromEntries(Object.entries(by).map(([k, n]) => [k, r1(n / seconds)]));
  const writes = agents.filter((r) => r.method !== 'GET').length;
  return { seconds: Math.round(seconds), requestsPerSecond: r1(agents.length / seconds), writesPerSecond: r1(writes / seconds), conflictsPerSecond: r1(agents.filter((r) => r.status === 409).length / seconds), perSecond };
}

function watchEvents(api: ApiServer): Record<string, number> {
  return { ...(api.watchEvents.leases ?? {}) };
}

function eventRate(before: Record<string, number>, after: Record<string, number>, seconds: number): Record<string, number> {
  const out: Record<string, number> = {};
  for (const k of new Set([...Object.keys(before), ...Object.keys(after)])) out[k] = r1(((after[k] ?? 0) - (before[k] ?? 0)) / seconds);
  return out;
}

async function withController<T>(o: SlotBenchOptions, mode: Mode, f: () => Promise<T>): Promise<T> {
  const c = mode === 'hand-over' ? await o.startController() : undefined;
  try {
    return await f();
  } finally {
    await c?.stop();
    clearLeases(o.api);
  }
}

function slotsFactory(leaseApi: LeaseApi, mode: Mode, leaseMs = LEASE_MS) {
  return (node: string) => new LeaseRolloutSlots({ api: leaseApi, namespace: NS, identity: node, fieldManager: AGENT_FIELD_MANAGER, leaseDurationMs: leaseMs, queue: mode === 'hand-over' });
}

/** Six nodes, 2 s downloads: maxConcurrentNodes 1 (fleet time, slot idle) and 6 (time until every slot is taken). */
async function smallFleet(o: SlotBenchOptions, leaseApi: LeaseApi, mode: Mode) {
  const nodes = Array.from({ length: 6 }, (_, i) => `small-${i}`);
  const one: { fleetMs: number; firstMs: number; idleMs: number; handoverMs: number[] }[] = [];
  const six: number[] = [];
  for (let run = 0; run < SMALL_RUNS; run++) {
    await withController(o, mode, async () => {
      const set = createSet(o.api, 'small-one', { maxConcurrentNodes: 1 });
      const t0 = Date.now();
      const r = await simulateRollout({ nodes, set, slotsFor: slotsFactory(leaseApi, mode), downloadMs: () => 2000, timeoutMs: 20 * 60_000 });
      const latencies = handoverLatencies(r, 1);
      const firstStart = Math.min(...r.starts) - t0;
      one.push({ fleetMs: Math.max(...r.ends) - t0, firstMs: firstStart, idleMs: firstStart + sum(latencies), handoverMs: latencies });
    });
    await withController(o, mode, async () => {
      const set = createSet(o.api, 'small-six', { maxConcurrentNodes: 6 });
      const t0 = Date.now();
      const r = await simulateRollout({ nodes, set, slotsFor: slotsFactory(leaseApi, mode), downloadMs: () => 2000, timeoutMs: 5 * 60_000 });
      six.push(Math.max(...r.starts) - t0);
    });
  }
  const all = one.flatMap((x) => x.handoverMs);
  return {
    runs: SMALL_RUNS,
    maxOne: {
      fleetSeconds: one.map((x) => r1(x.fleetMs / 1000)),
      firstSlotSeconds: one.map((x) => r1(x.firstMs / 1000)),
      slotIdleSeconds: one.map((x) => r1(x.idleMs / 1000)),
      handoverMedianMs: median(all),
      handoverMaxMs: Math.max(...all),
    },
    maxSix: { allSlotsTakenSeconds: six.map((ms) => r1(ms / 1000)) },
  };
}

/**
 * Whenever more than `max` nodes download at once: what each downloading
 * node held at that moment, read from the API server's store (in process,
 * so the read is exact and immediate): a live slot Lease in its name, an
 * expired one in its name, or none (its slot was written in another node's
 * name, or deleted). `shared` counts live slot Leases claimed by two
 * downloading nodes, which one Lease's one holderIdentity makes impossible
 * unless the count itself is wrong.
 */
function overLimitSampler(api: ApiServer, setName: string, max: number) {
  const downloading = new Set<string>();
  const samples: { at: number; downloading: number; liveInOwnName: number; expiredInOwnName: number; notInOwnName: number; liveSlots: number; without: string[] }[] = [];
  const onChange = (node: string, on: boolean) => {
    if (on) downloading.add(node);
    else downloading.delete(node);
    if (!on || downloading.size <= max) return;
    const now = Date.now();
    const slots = api.list('leases', { namespace: NS, labelSelector: slotSelector(setName) });
    const byHolder = new Map<string, boolean>();
    let liveSlots = 0;
    for (const l of slots) {
      const spec = (l as { spec?: { holderIdentity?: string; renewTime?: string; acquireTime?: string; leaseDurationSeconds?: number } }).spec ?? {};
      const live = !slotFree(spec.holderIdentity, Date.parse(spec.renewTime ?? spec.acquireTime ?? '') || undefined, (spec.leaseDurationSeconds ?? 0) * 1000, now);
      if (live) liveSlots++;
      if (spec.holderIdentity) byHolder.set(spec.holderIdentity, live || byHolder.get(spec.holderIdentity) === true);
    }
    let liveInOwnName = 0;
    let expiredInOwnName = 0;
    const without: string[] = [];
    for (const n of downloading) {
      const h = byHolder.get(n);
      if (h === true) liveInOwnName++;
      else if (h === false) expiredInOwnName++;
      else without.push(n);
    }
    samples.push({ at: now, downloading: downloading.size, liveInOwnName, expiredInOwnName, notInOwnName: without.length, liveSlots, without });
  };
  const summary = () => {
    const worst = samples.reduce<(typeof samples)[number] | undefined>((w, s) => (!w || s.downloading > w.downloading ? s : w), undefined);
    return { momentsOverLimit: samples.length, worst: worst && { ...worst, without: worst.without.length }, worstWithout: worst?.without ?? [], worstAt: worst?.at ?? 0, maxLiveSlots: Math.max(0, ...samples.map((s) => s.liveSlots)), maxLiveInOwnName: Math.max(0, ...samples.map((s) => s.liveInOwnName)) };
  };
  return { onChange, summary };
}

/**
 * Every change of a slot Lease's holder, replayed from the API server's
 * record of requests (their bodies, in order of arrival, the successful
 * writes only): who wrote it (the controller's granter, or an agent), and
 * whether the holder it replaced was still live then (its renewTime plus
 * its duration after the write), which the protocol never allows, or had
 * expired, and by how long.
 */
function holderChanges(reqs: readonly RecordedRequest[], setName: string, from: number) {
  type Spec = { holderIdentity?: string; renewTime?: string; acquireTime?: string; leaseDurationSeconds?: number };
  const state = new Map<string, Spec>();
  const out = { overLive: 0, overExpired: 0, byController: 0, byAgents: 0, expiredForMs: [] as number[], renewGapsMs: [] as number[] };
  for (const r of reqs) {
    if (!r.path.includes('/leases') || r.status >= 300 || r.method === 'GET') continue;
    const name = r.method === 'POST' ? ((r.body as { metadata?: { name?: string } })?.metadata?.name ?? '') : decodeURIComponent(r.path.split('/').pop()!);
    if (slotIndex(setName, name) === undefined) continue;
    if (r.method === 'DELETE') {
      state.delete(name);
      continue;
    }
    const spec = ((r.body as { spec?: Spec })?.spec ?? {}) as Spec;
    // A create succeeds only where no Lease of that name is: it replaces no
    // holder, whatever this replay last saw there (the bench clears the
    // Leases between parts in process, outside the record of requests).
    const prev = r.method === 'POST' ? undefined : state.get(name);
    state.set(name, spec);
    if (r.at < from || !prev?.holderIdentity) continue;
    const prevUntil = Date.parse(prev.renewTime ?? prev.acquireTime ?? '') + (prev.leaseDurationSeconds ?? 0) * 1000;
    if (prev.holderIdentity === spec.holderIdentity) {
      out.renewGapsMs.push(Date.parse(spec.renewTime ?? '') - Date.parse(prev.renewTime ?? prev.acquireTime ?? ''));
      continue;
    }
    if (byController(r)) out.byController++;
    else out.byAgents++;
    if (prevUntil > r.at) out.overLive++;
    else {
      out.overExpired++;
      out.expiredForMs.push(r.at - prevUntil);
    }
  }
  return {
    holderChanges: out.byController + out.byAgents,
    byController: out.byController,
    byAgents: out.byAgents,
    overALiveHolder: out.overLive,
    overAnExpiredHolder: out.overExpired,
    expiredForMsMedian: median(out.expiredForMs),
    renewals: out.renewGapsMs.length,
    renewGapMsMedian: median(out.renewGapsMs),
    renewGapMsMax: Math.max(0, ...out.renewGapsMs),
  };
}

/** For a node downloading without a slot in its name at `at`: every slot request naming it, and what came after on that slot, until `at`. */
function slotHistory(reqs: readonly RecordedRequest[], setName: string, node: string, at: number) {
  const nameOf = (r: RecordedRequest) => (r.method === 'POST' ? ((r.body as { metadata?: { name?: string } })?.metadata?.name ?? '') : decodeURIComponent(r.path.split('/').pop()!.split('?')[0]!));
  const holderOf = (r: RecordedRequest) => (r.body as { spec?: { holderIdentity?: string; leaseDurationSeconds?: number; renewTime?: string } } | undefined)?.spec;
  const mine = reqs.filter((r) => r.at <= at && r.path.includes('/leases') && r.method !== 'GET' && slotIndex(setName, nameOf(r)) !== undefined && holderOf(r)?.holderIdentity === node);
  const last = mine.at(-1);
  if (!last) return { node, none: true };
  const slot = nameOf(last);
  const after = reqs.filter((r) => r.at >= mine[0]!.at && r.at <= at + 1000 && r.path.includes('/leases') && r.method !== 'GET' && nameOf(r) === slot);
  const t0 = mine[0]!.at;
  return { node, slot, events: after.map((r) => ({ ms: r.at - t0, method: r.method, status: r.status, by: byController(r) ? 'controller' : r.userAgent.slice(0, 20), holder: holderOf(r)?.holderIdentity, seconds: holderOf(r)?.leaseDurationSeconds, renewTime: holderOf(r)?.renewTime, pre: (r.body as { preconditions?: unknown } | undefined)?.preconditions })), sampleMs: at - t0 };
}

/** BIG_NODES nodes want a set of BIG_MAX slots: the cost while they wait, then the hand-overs. */
async function bigFleet(o: SlotBenchOptions, leaseApi: LeaseApi, mode: Mode) {
  return withController(o, mode, async () => {
    const set = createSet(o.api, 'big-fleet', { maxConcurrentNodes: BIG_MAX });
    const stop = new AbortController();
    const t0 = Date.now();
    const holdUntil = t0 + HOLD_S * 1000;
    const over = overLimitSampler(o.api, set.name, BIG_MAX);
    // How late this process's timers and I/O callbacks run: renewals, grants and watch events all wait for it.
    const loopDelay = monitorEventLoopDelay({ resolution: 20 });
    const run = simulateRollout({
      nodes: Array.from({ length: BIG_NODES }, (_, i) => `big-${i}`),
      set,
      slotsFor: slotsFactory(leaseApi, mode),
      // The first holders hold until the wait has been measured; then 1 to 5 s each.
      downloadMs: () => (Date.now() < holdUntil ? holdUntil - Date.now() : 1000 + Math.floor(Math.random() * 4000)),
      timeoutMs: 60 * 60_000,
      signal: stop.signal,
      onChange: over.onChange,
    });
    const from = holdUntil - Math.min(90_000, HOLD_S * 500);
    await sleep(from - Date.now());
    const eventsBefore = watchEvents(o.api);
    const openWatches = o.api.openWatches().filter((w) => w.resource === 'leases').length;
    await sleep(holdUntil - Date.now());
    const waiting = leaseLoad(o.api.requests, from, holdUntil);
    const controller = leaseLoad(o.api.requests, from, holdUntil, true);
    const events = eventRate(eventsBefore, watchEvents(o.api), (holdUntil - from) / 1000);
    loopDelay.enable();
    await sleep(HANDOVER_S * 1000);
    loopDelay.disable();
    stop.abort();
    const r = await run;
    const lost = r.lostWhileDownloading;
    const ends = [...r.ends].sort((a, b) => a - b);
    const latencies = handoverLatencies(r, BIG_MAX).filter((_, i) => ends[i]! >= holdUntil);
    return {
      nodes: BIG_NODES,
      maxConcurrentNodes: BIG_MAX,
      waiting: { ...waiting, watchEventsPerSecond: events, openLeaseWatches: openWatches, controller },
      handover: {
        handovers: latencies.length,
        medianMs: median(latencies),
        p99Ms: pct(latencies, 0.99),
        maxMs: Math.max(...latencies),
        maxDownloadingAtOnce: r.maxConcurrent,
        // The nodes that kept downloading after a renewal found their slot another's (the agent finishes the download under way).
        lostWhileDownloading: lost.length,
        lostAfterMsMedian: median(lost.map((l) => l.afterMs)),
        overLimit: over.summary(),
        slotWrites: holderChanges(o.api.requests, set.name, holdUntil),
        slotWritesWholeRun: holderChanges(o.api.requests, set.name, t0),
        withoutSlot: over.summary().worstWithout.slice(0, 4).map((n) => slotHistory(o.api.requests, set.name, n, over.summary().worstAt)),
        eventLoopDelayMs: { p50: r1(loopDelay.percentile(50) / 1e6), p99: r1(loopDelay.percentile(99) / 1e6), max: r1(loopDelay.max / 1e6) },
      },
    };
  });
}

/** WAVE_NODES nodes wait on a set's first wave, following its record by name; the member lands WAVE_IMAGES images, one every 2 s. */
async function waveRecords(o: SlotBenchOptions, leaseApi: LeaseApi) {
  const api = o.api;
  const set = createSet(api, 'wave-bench', { firstWave: { nodes: 1 } });
  const digests = Array.from({ length: WAVE_IMAGES }, (_, i) => `sha256:${i.toString(16).padStart(64, '0')}`);
  const wave: WaveSet = { name: set.name, uid: set.uid, nodes: 1, digests };
  const images = digests.map((d) => ({ key: `registry.example.com/bench/wave@${d}`, digest: d, sets: ['api/wave-bench'] }));
  const waves = new Map([['api/wave-bench', wave]]);
  const heard = new Map<number, number[]>();
  let landing = -1;
  const make = (node: string, onChange?: () => void) =>
    new FirstWave({
      // No queue here: the seats' queue is measured above; this is the records' cost.
      slots: new LeaseRolloutSlots({ api: leaseApi, namespace: NS, identity: node, fieldManager: AGENT_FIELD_MANAGER, leaseDurationMs: LEASE_MS, queue: false }),
      records: new LeaseWaveRecords({ api: leaseApi, namespace: NS, identity: node, fieldManager: AGENT_FIELD_MANAGER }),
      logger: silentLogger(),
      ...(onChange ? { onChange } : {}),
    });
  const member = make('wave-member');
  await member.admit(images, waves);
  const seatAt = Date.now() + 11_000; // after the first attempt's spread
  await sleep(seatAt - Date.now());
  if (!(await member.admit(images, waves)).sets.get('api/wave-bench')!.member) throw new Error('the bench member got no seat');
  const others = Array.from({ length: WAVE_NODES }, (_, i) =>
    make(`wave-${i}`, () => {
      if (landing >= 0) heard.set(landing, [...(heard.get(landing) ?? []), Date.now()]);
    }),
  );
  try {
    for (const w of others) await w.admit(images, waves);
    const name = landedName(set.name, 0);
    await api.waitFor(() => api.openWatches().filter((w) => w.query.fieldSelector === `metadata.name=${name}`).length >= WAVE_NODES, 300_000, 'every node following the record');
    const quietFrom = Date.now();
    const quietEvents = watchEvents(api);
    // Longer than the watch cache's bookmark interval (1 minute): the quiet cost includes the bookmarks.
    await sleep(75_000);
    const quiet = { ...leaseLoad(api.requests, quietFrom, Date.now()), watchEventsPerSecond: eventRate(quietEvents, watchEvents(api), (Date.now() - quietFrom) / 1000) };
    const perLanding: { writes: number; events: number; heardBy: number; allHeardMs: number; medianHeardMs: number; recordBytes: number }[] = [];
    for (let i = 0; i < WAVE_IMAGES; i++) {
      const from = api.requests.length;
      const before = watchEvents(api).MODIFIED ?? 0;
      landing = i;
      const t = Date.now();
      await member.held(new Set(digests.slice(0, i + 1)));
      await api.waitFor(() => (heard.get(i)?.length ?? 0) >= WAVE_NODES, 60_000, `every node told of landing ${i}`).catch(() => undefined);
      await sleep(Math.max(0, t + 2000 - Date.now()));
      const times = (heard.get(i) ?? []).map((h) => h - t);
      const writes = api.requests.slice(from).filter((r) => r.path.includes('/leases') && r.method !== 'GET').length;
      perLanding.push({
        writes,
        events: (watchEvents(api).MODIFIED ?? 0) - before,
        heardBy: times.length,
        allHeardMs: times.length ? Math.max(...times) : NaN,
        medianHeardMs: median(times),
        recordBytes: Buffer.byteLength(JSON.stringify(api.get('leases', name, NS))),
      });
    }
    return {
      nodes: WAVE_NODES,
      images: WAVE_IMAGES,
      quiet,
      perLanding: {
        writes: median(perLanding.map((p) => p.writes)),
        watchEvents: median(perLanding.map((p) => p.events)),
        heardByAll: perLanding.every((p) => p.heardBy >= WAVE_NODES),
        allHeardMedianMs: median(perLanding.map((p) => p.allHeardMs)),
        allHeardMaxMs: Math.max(...perLanding.map((p) => p.allHeardMs)),
        nodeHeardMedianMs: median(perLanding.map((p) => p.medianHeardMs)),
        recordBytes: Math.max(...perLanding.map((p) => p.recordBytes)),
      },
    };
  } finally {
    await Promise.all([member, ...others].map((w) => w.close()));
    clearLeases(api);
  }
}

export async function runSlotBench(o: SlotBenchOptions): Promise<Record<string, unknown>> {
  const leaseApi = clientNodeLeaseApi(o.api.kubeConfig());
  const out: Record<string, unknown> = {};
  for (const mode of PARTS.has('small') ? MODES : []) {
    const small = await smallFleet(o, leaseApi, mode);
    o.say(
      `slots, ${mode}: 6 nodes, 2 s downloads, maxConcurrentNodes 1: fleet ${small.maxOne.fleetSeconds.join(', ')} s (12 s with no idle slot), slot free ${small.maxOne.slotIdleSeconds.join(', ')} s in all (of it before the first download ${small.maxOne.firstSlotSeconds.join(', ')} s), ` +
        `each hand-over median ${small.maxOne.handoverMedianMs} ms, max ${small.maxOne.handoverMaxMs} ms; maxConcurrentNodes 6: every slot taken after ${small.maxSix.allSlotsTakenSeconds.join(', ')} s`,
    );
    out[`${mode} small`] = small;
  }
  for (const mode of PARTS.has('big') ? MODES : []) {
    const big = await bigFleet(o, leaseApi, mode);
    o.say(
      `slots, ${mode}: ${big.nodes} nodes waiting for ${big.maxConcurrentNodes} slots: ${big.waiting.requestsPerSecond} agent Lease requests/s ${JSON.stringify(big.waiting.perSecond)}, ${big.waiting.writesPerSecond} writes/s (${big.waiting.conflictsPerSecond} 409/s), ` +
        `watch events/s ${JSON.stringify(big.waiting.watchEventsPerSecond)}, ${big.waiting.openLeaseWatches} Lease watches open; the controller ${big.waiting.controller.requestsPerSecond} requests/s ${JSON.stringify(big.waiting.controller.perSecond)}; then ${big.handover.handovers} hand-overs: median ${big.handover.medianMs} ms, p99 ${big.handover.p99Ms} ms, max ${big.handover.maxMs} ms (at most ${big.handover.maxDownloadingAtOnce} downloading; ${big.handover.lostWhileDownloading} lost their slot while downloading; over the limit ${JSON.stringify({ ...big.handover.overLimit, worstWithout: undefined })}; downloading without a slot ${JSON.stringify(big.handover.withoutSlot)}; slot writes ${JSON.stringify(big.handover.slotWrites)} (from the start: ${JSON.stringify(big.handover.slotWritesWholeRun)}); event loop delay ms ${JSON.stringify(big.handover.eventLoopDelayMs)})`,
    );
    out[`${mode} ${BIG_NODES}`] = big;
  }
  if (WAVE_NODES > 0 && PARTS.has('wave')) {
    const w = await waveRecords(o, leaseApi);
    o.say(
      `first wave: ${w.nodes} nodes following one record: quiet ${w.quiet.requestsPerSecond} requests/s ${JSON.stringify(w.quiet.perSecond)}, watch events/s ${JSON.stringify(w.quiet.watchEventsPerSecond)}; ` +
        `per landing ${w.perLanding.writes} write(s), ${w.perLanding.watchEvents} watch events of ${w.perLanding.recordBytes} B, every node told after ${w.perLanding.allHeardMedianMs} ms (median; max ${w.perLanding.allHeardMaxMs} ms, half of them after ${w.perLanding.nodeHeardMedianMs} ms)`,
    );
    out.firstWaveRecords = w;
  }
  return out;
}
