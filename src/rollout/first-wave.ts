// The first wave (spec.rollout.firstWave): a set can ask that each of its
// images is first fetched by a few nodes, so that a cache between the nodes
// and the registry (a pull-through distribution, Spegel, Dragonfly) fetches
// it over the link once; the other nodes pull the image only once a
// first-wave node holds it, from inside the cluster. This is the protocol a
// node follows; it decides which downloads wait, and nothing else.
//
// - Seats: firstWave.nodes seats per set, held as slots of their own pool
//   (`<set>-<i>.first-wave`, ./slots.ts) through the same claims as rollout
//   slots (./claims.ts): taken by polling or handed over from a queue by the
//   controller (./grants.ts), renewed while held, freed by expiry when the
//   holder dies. A node that needs some of the set's images asks for a seat;
//   the nodes that get one are the first wave. A member whose pull fails
//   gives its seat up (failed()) and takes none of that set for a while, so
//   another node takes its place; one that goes away loses its seat when the
//   Lease expires. So the fleet never waits on one node.
// - Records: the holder of seat i keeps a record of what it has landed, a
//   Lease of its own, `<set>-<i>.landed` (its annotations: a hash of the
//   set's image list and a bitmap over the list's sorted digests). Members
//   write it when they start and as images land (at most once a second); it
//   is never renewed, so it changes only when an image lands. Every other
//   node watches the set's few records by name (the API server dispatches
//   a named watch only its object's events: ./grants.ts), so it hears of
//   each landing and of no renewal. A landing is monotone: what a member has
//   pulled through the cache stays there when the member goes.
// - Image by image: a non-member's image waits only until it is landed, so
//   the fleet starts on the first images while the first wave fetches the
//   rest. An image wanted by any set that does not ask for a first wave (or
//   of a set this node is in the first wave of) never waits. A member fetches
//   the images no member has landed one at a time, in the set's order
//   (oneAtATime): its pulls share the link, which they saturate, so k of
//   them in parallel end no sooner together and land nothing before most of
//   the wave's time; one at a time lands the first image after 1/k of it,
//   and the fleet follows image by image, in the order every node agrees on.
// - Never forever: a set whose first wave lands nothing new for stallMs (30
//   minutes; a pull that hangs ends long before, containerd's progress
//   timeout is 5 minutes) is waited for no more on this node, which then
//   pulls the rest itself, as if the set had not asked.
// - The first wave works with rollout slots (admit() first, then the gate:
//   only images that may go ask for a slot, and the granter serves a set's
//   first-wave members before its other nodes) and with static sets (their
//   seats and records go by the set's name and a hash of its images, so only
//   nodes with the same file share them), wherever there is an API.
//
// API cost per image landing: one write of the member's record (several
// landings within a second share one), and one watch event to each node
// waiting on the set; nothing per renewal. The figures are in
// BENCHMARKS.md, section 11 ("The first wave's records").
import type { Logger } from 'pino';
import { SlotClaims, type SlotClaimsOptions } from './claims.ts';
import { decodeLanded, imageListHash, RecordWriter, sortedDigests, type LandedRecord, type WaveRecords } from './landed.ts';
import type { RolloutSet, RolloutSlots } from './slots.ts';

/** A set that asks for a first wave, as a node sees it now. */
export interface WaveSet {
  /** The name its seats and records go by: the set's name (a static set's: staticWaveName()). */
  name: string;
  /** The set's uid (its Leases go when it goes); absent for a static set. */
  uid?: string;
  /** spec.rollout.firstWave.nodes (>= 1). */
  nodes: number;
  /** Every image of the set, by digest. */
  digests: readonly string[];
}

/** An image to download: its key, its digest and the keys of the sets that want it. */
export interface WaveImage {
  key: string;
  digest: string;
  sets: readonly string[];
}

/** A set's first wave as this node sees it: what its status says. */
export interface SetWave {
  /** This node is in the set's first wave. */
  member: boolean;
  /** The nodes in the first wave, as their records say (this one first when it is one). */
  members: string[];
  /** Of the set's images, how many a first-wave node holds. */
  landed: number;
  images: number;
  /** Keys of this node's images that wait for the first wave. */
  waitingFor: string[];
  /** The first wave landed nothing for stallMs: this node no longer waits for it. */
  stalled?: boolean;
  /** This node may not use the first wave's Leases (403): it pulls without waiting. */
  forbidden?: string;
  /** The last attempt at a seat failed (the API could not be reached, ...). */
  error?: string;
}

export interface WaveAdmission<T> {
  /** The images that may go now (on to the rollout gate). */
  allowed: T[];
  /** The images that wait for the first wave. */
  waiting: T[];
  /** By set key, every set with a first wave that this node still has images of. */
  sets: Map<string, SetWave>;
  /**
   * By set key, the images this node fetches for the set's first wave (it
   * is a member, and no member has landed them), in the set's order: to be
   * pulled one at a time. An image goes under the first such set only.
   */
  oneAtATime: Map<string, T[]>;
}

export interface FirstWaveOptions {
  slots: RolloutSlots;
  records: WaveRecords;
  logger: Logger;
  /** Seat claims' pacing (./claims.ts); the defaults are the rollout slots'. */
  claims?: Pick<SlotClaimsOptions, 'renewIntervalMs' | 'retry' | 'firstAttemptSpreadMs'>;
  /** Called when something changed between calls (a seat granted, an image landed): admit again now. */
  onChange?: (why: string) => void;
  /** A set whose first wave lands nothing new for this long is no longer waited for (default 30 minutes). */
  stallMs?: number;
  /** A member writes its record at most this often (default 1 s). */
  recordIntervalMs?: number;
  /** A member whose pull failed takes no seat of that set again for this long (default: the lease duration). */
  failedCooldownMs?: number;
  now?: () => number;
  random?: () => number;
}

export const DEFAULT_STALL_MS = 30 * 60_000;
export const DEFAULT_RECORD_INTERVAL_MS = 1_000;


interface SetState {
  key: string;
  wave: WaveSet;
  seat: RolloutSet;
  sorted: string[];
  hash: string;
  records: Map<number, LandedRecord | null>;
  watches: Map<number, { close(): Promise<void> }>;
  /** Landed, by the records of this image list. */
  landed: Set<string>;
  /** Since when this node waits with nothing new landed (ms since epoch). */
  progressAt: number;
  stalled: boolean;
  /** As a member: the writer of its seat's record. */
  writer?: RecordWriter;
  /** No seat before this (ms since epoch): this node's pull failed while a member. */
  cooldownUntil: number;
  /** This node waits for images the records do not show yet. */
  waiting: boolean;
  /** The last seat attempt was refused (403). */
  forbidden?: boolean;
}

export class FirstWave {
  readonly #claims: SlotClaims;
  readonly #records: WaveRecords;
  readonly #log: Logger;
  readonly #onChange: ((why: string) => void) | undefined;
  readonly #stallMs: number;
  readonly #recordMs: number;
  readonly #cooldownMs: number;
  readonly #now: () => number;
  readonly #identity: string;
  /** By set key. */
  readonly #sets = new Map<string, SetState>();
  #closed = false;

  constructor(opts: FirstWaveOptions) {
    this.#records = opts.records;
    this.#log = opts.logger;
    this.#onChange = opts.onChange;
    this.#stallMs = opts.stallMs ?? DEFAULT_STALL_MS;
    this.#recordMs = opts.recordIntervalMs ?? DEFAULT_RECORD_INTERVAL_MS;
    this.#cooldownMs = opts.failedCooldownMs ?? opts.slots.leaseDurationMs;
    this.#now = opts.now ?? Date.now;
    this.#identity = opts.slots.identity;
    this.#claims = new SlotClaims({
      slots: opts.slots,
      logger: opts.logger,
      ...opts.claims,
      onLost: (k) => {
        void this.#sets.get(k)?.writer?.close();
        opts.onChange?.('first-wave seat lost');
      },
      ...(opts.onChange ? { onChange: opts.onChange } : {}),
      ...(opts.now ? { now: opts.now } : {}),
      ...(opts.random ? { random: opts.random } : {}),
    });
  }

  /** When something is due without an event (a seat attempt, a stall, a cooldown's end), ms since epoch. */
  nextAttemptAt(): number | undefined {
    let at = this.#claims.nextAttemptAt();
    const min = (t: number) => (at = at === undefined ? t : Math.min(at, t));
    for (const st of this.#sets.values()) {
      if (st.waiting && !st.stalled) min(st.progressAt + this.#stallMs);
      if (st.cooldownUntil > this.#now()) min(st.cooldownUntil);
    }
    return at;
  }

  /**
   * Of `images` (the downloads due now), those that may go, and those that
   * wait for the first wave; `waves`: by set key, the sets that ask for one
   * (a set not in it does not).
   */
  async admit<T extends WaveImage>(images: readonly T[], waves: ReadonlyMap<string, WaveSet>): Promise<WaveAdmission<T>> {
    const missing = new Map<string, T[]>();
    for (const w of images) for (const k of w.sets) if (waves.has(k)) (missing.get(k) ?? missing.set(k, []).get(k)!).push(w);
    // A set with nothing left to fetch on this node: its seat freed, its records no longer followed.
    for (const k of [...this.#sets.keys()]) if (!missing.has(k)) await this.#forget(k, 'nothing left to download');
    const sets = new Map<string, SetWave>();
    const oneAtATime = new Map<string, T[]>();
    const fetching = new Set<T>();
    const waitsFor = new Map<string, (w: T) => boolean>();
    for (const [k, ofSet] of missing) {
      const st = await this.#state(k, waves.get(k)!);
      let forbidden: string | undefined;
      let error: string | undefined;
      if (ofSet.every((w) => st.landed.has(w.digest))) {
        // Everything this node lacks has landed: it needs no seat (a member's last landings are written first).
        await this.#leaveWave(k, st, 'every image it lacks has landed');
        st.waiting = false;
        sets.set(k, { member: false, members: this.#members(st), landed: st.landed.size, images: st.sorted.length, waitingFor: [] });
        continue;
      }
      if (this.#now() >= st.cooldownUntil && !this.#closed) {
        const state = await this.#claims.want(k, st.seat);
        const wait = this.#claims.waitOf(k);
        error = wait?.error;
        if (state === 'forbidden') forbidden = wait?.error ?? 'forbidden';
      }
      await this.#becameMember(k, st);
      // A node refused the Leases (403) cannot read the records either: it follows none until a seat attempt gets through.
      st.forbidden = forbidden !== undefined;
      this.#follow(k, st, st.forbidden ? 0 : st.wave.nodes);
      const member = st.writer !== undefined;
      if (!member && st.waiting && !st.stalled && this.#now() - st.progressAt >= this.#stallMs) {
        st.stalled = true;
        this.#log.warn({ set: st.wave.name, landed: st.landed.size, images: st.sorted.length, stallMinutes: Math.round(this.#stallMs / 60_000) }, 'the first wave landed nothing new for a while; pulling the rest of the set without waiting for it');
      }
      if (member) {
        const order = new Map(st.wave.digests.map((d, i) => [d, i]));
        const fetch = ofSet.filter((w) => !st.landed.has(w.digest) && !fetching.has(w)).sort((a, b) => order.get(a.digest)! - order.get(b.digest)!);
        for (const w of fetch) fetching.add(w);
        if (fetch.length > 0) oneAtATime.set(k, fetch);
      }
      const waits = !member && !forbidden && !st.stalled;
      waitsFor.set(k, (w) => waits && !st.landed.has(w.digest));
      const waitingFor = waits ? ofSet.filter((w) => !st.landed.has(w.digest)).map((w) => w.key) : [];
      if (waitingFor.length > 0 && !st.waiting) st.progressAt = this.#now();
      st.waiting = waitingFor.length > 0;
      sets.set(k, {
        member,
        members: this.#members(st),
        landed: st.landed.size,
        images: st.sorted.length,
        waitingFor,
        ...(st.stalled ? { stalled: true } : {}),
        ...(forbidden ? { forbidden } : {}),
        ...(error && !forbidden ? { error } : {}),
      });
    }
    const allowed: T[] = [];
    const waiting: T[] = [];
    for (const w of images) {
      const held = w.sets.length > 0 && w.sets.every((k) => waitsFor.get(k)?.(w) === true);
      (held ? waiting : allowed).push(w);
    }
    return { allowed, waiting, sets, oneAtATime };
  }

  /**
   * What this node holds now, by digest (after pulls, or any time): a
   * member records the images of its sets it holds, for the others.
   */
  async held(present: ReadonlySet<string>): Promise<void> {
    for (const st of this.#sets.values()) st.writer?.note(present);
    await Promise.all([...this.#sets.values()].map((st) => st.writer?.writing));
  }

  /** A pull of these sets' images failed on this node: where it is in the first wave, it steps out, so another node takes its place. */
  async failed(setKeys: Iterable<string>): Promise<void> {
    for (const k of new Set(setKeys)) {
      const st = this.#sets.get(k);
      if (!st?.writer) continue;
      st.cooldownUntil = this.#now() + this.#cooldownMs;
      await this.#leaveWave(k, st, 'a pull of the set failed on this node');
      this.#log.warn({ set: st.wave.name, cooldownMs: this.#cooldownMs }, 'a pull failed on this first-wave node; gave its seat to another node');
    }
  }

  /** Stop: free every seat, leave every queue, stop following records (a member's last landings are written first). */
  async close(): Promise<void> {
    this.#closed = true;
    for (const k of [...this.#sets.keys()]) await this.#forget(k, 'stopping');
    await this.#claims.close();
  }

  async #state(k: string, wave: WaveSet): Promise<SetState> {
    const hash = imageListHash(wave.digests);
    let st = this.#sets.get(k);
    if (st && (st.hash !== hash || st.wave.name !== wave.name)) {
      // A new image list (a new generation): a new first wave.
      await this.#forget(k, 'the set changed');
      st = undefined;
    }
    if (!st) {
      st = {
        key: k,
        wave,
        seat: { name: wave.name, ...(wave.uid ? { uid: wave.uid } : {}), maxConcurrentNodes: wave.nodes, pool: 'first-wave' },
        sorted: sortedDigests(wave.digests),
        hash,
        records: new Map(),
        watches: new Map(),
        landed: new Set(),
        progressAt: this.#now(),
        stalled: false,
        cooldownUntil: -Infinity,
        waiting: false,
      };
      this.#sets.set(k, st);
    }
    st.wave = wave;
    st.seat = { ...st.seat, maxConcurrentNodes: wave.nodes };
    if (!st.forbidden) this.#follow(k, st, wave.nodes);
    return st;
  }

  /** Watch the set's first `count` records (one per seat), by name, and no other. */
  #follow(k: string, st: SetState, count: number): void {
    for (let i = 0; i < count; i++) {
      if (st.watches.has(i)) continue;
      st.watches.set(
        i,
        this.#records.watch(st.seat, i, (r) => {
          if (this.#sets.get(k) !== st) return;
          st.records.set(i, r);
          this.#merge(st);
        }),
      );
    }
    for (const [i, w] of st.watches) {
      if (i < count) continue;
      st.watches.delete(i);
      st.records.delete(i);
      void w.close();
    }
  }

  #merge(st: SetState): void {
    const before = st.landed.size;
    for (const r of st.records.values()) if (r && r.images === st.hash) for (const d of decodeLanded(st.sorted, r.landed)) st.landed.add(d);
    if (st.landed.size === before) return;
    st.progressAt = this.#now();
    if (st.waiting && !st.stalled) this.#onChange?.('the first wave landed an image');
  }

  #members(st: SetState): string[] {
    const others = new Set<string>();
    for (const r of st.records.values()) if (r && r.images === st.hash && r.holder !== this.#identity) others.add(r.holder);
    return [...(st.writer ? [this.#identity] : []), ...[...others].sort()];
  }

  /** Note a seat just taken: its record is written in this node's name at once, so the others see who is in the first wave. */
  async #becameMember(k: string, st: SetState): Promise<void> {
    const slot = this.#claims.heldSlot(k);
    if (st.writer && st.writer.index === slot?.index) return;
    await st.writer?.close();
    st.writer = undefined;
    if (!slot) return;
    this.#log.info({ set: st.wave.name, seat: slot.index, of: st.wave.nodes }, 'in the first wave of the set: fetching its images for the other nodes');
    const { sorted, hash, seat: set } = st;
    st.writer = new RecordWriter({ records: this.#records, set, index: slot.index, sorted, hash, identity: this.#identity, intervalMs: this.#recordMs, now: this.#now, logger: this.#log });
    await st.writer.writing;
  }

  /** Out of the set's first wave (no seat, not queued for one), its records still followed. */
  async #leaveWave(k: string, st: SetState, why: string): Promise<void> {
    await st.writer?.close();
    st.writer = undefined;
    await this.#claims.drop(k, why);
  }

  async #forget(k: string, why: string): Promise<void> {
    const st = this.#sets.get(k);
    if (!st) return;
    await this.#leaveWave(k, st, why);
    this.#sets.delete(k);
    await Promise.all([...st.watches.values()].map((w) => w.close()));
  }
}
