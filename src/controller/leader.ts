// Leader election on a coordination.k8s.io/v1 Lease, with the semantics of
// client-go's tools/leaderelection (LeaseLock):
// - a candidate takes the Lease when it does not exist, has no holder, or its
//   holder's renewTime + leaseDurationSeconds has passed;
// - the leader renews every retryPeriod and steps down when no renewal has
//   succeeded for renewDeadline (shorter than the lease duration, so it stops
//   acting before anyone else may take over);
// - every write carries the resourceVersion that was read, so of two
//   candidates racing for the same Lease the API server accepts one and
//   answers 409 Conflict to the other;
// - on a clean stop the leader clears holderIdentity, so another replica takes
//   over at its next retry instead of waiting for the lease to expire.
// Expiry is judged from the record's renewTime, so replicas are assumed to
// have clocks synchronised to well within the lease duration (NTP).
import { performance } from 'node:perf_hooks';
import { CoordinationV1Api, V1MicroTime, type KubeConfig, type V1Lease, type V1LeaseSpec } from '@kubernetes/client-node';
import type { Logger } from '../util/log.ts';

export interface LeaderElectionConfig {
  kubeConfig: KubeConfig;
  namespace: string;
  name: string;
  /** Unique per replica (the pod name). */
  identity: string;
  leaseDurationMs: number;
  renewDeadlineMs: number;
  retryPeriodMs: number;
  log: Logger;
  onStartedLeading?: () => void;
  onStoppedLeading?: () => void;
}

type Attempt = 'held' | 'other';

/** The Lease's writes are the controller's: they carry its field manager. */
const LEASE_FIELD_MANAGER = 'pinset-controller';

function apiCode(err: unknown): number | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'number' ? code : undefined;
}

function errorText(err: unknown): string {
  const code = apiCode(err);
  const msg = err instanceof Error ? err.message : String(err);
  return code !== undefined ? `HTTP ${code}: ${msg.split('\n')[0]}` : msg;
}

/** The Lease's timestamps are MicroTime: RFC 3339 with six fractional digits. */
function microTime(ms: number): V1MicroTime {
  return new V1MicroTime(ms);
}

/** client-node hands MicroTime fields back as the JSON string; accept a Date too. */
function timeMs(t: unknown): number | undefined {
  if (t instanceof Date) return Number.isNaN(t.getTime()) ? undefined : t.getTime();
  if (typeof t === 'string' && t !== '') {
    const ms = Date.parse(t);
    return Number.isNaN(ms) ? undefined : ms;
  }
  return undefined;
}

/** Check the durations the way client-go does (leaseDuration > renewDeadline > retryPeriod). */
export function leaderElectionConfigErrors(c: { leaseDurationMs: number; renewDeadlineMs: number; retryPeriodMs: number }): string[] {
  const errs: string[] = [];
  if (c.retryPeriodMs <= 0) errs.push('the retry period must be greater than zero');
  if (c.leaseDurationMs < 1000) errs.push('the lease duration must be at least 1s (the Lease stores whole seconds)');
  if (c.renewDeadlineMs >= c.leaseDurationMs) errs.push('the renew deadline must be shorter than the lease duration');
  if (c.retryPeriodMs >= c.renewDeadlineMs) errs.push('the retry period must be shorter than the renew deadline');
  return errs;
}

export class LeaderElector {
  readonly #cfg: LeaderElectionConfig;
  readonly #api: CoordinationV1Api;
  readonly #leaseSeconds: number;
  #leader = false;
  #lastRenew = 0;
  #stopped = false;
  #loop: Promise<void> | undefined;
  #wake: (() => void) | undefined;
  #observedHolder: string | undefined;

  constructor(cfg: LeaderElectionConfig) {
    const errs = leaderElectionConfigErrors(cfg);
    if (errs.length > 0) throw new Error(`leader election: ${errs.join('; ')}`);
    this.#cfg = cfg;
    this.#api = cfg.kubeConfig.makeApiClient(CoordinationV1Api);
    this.#leaseSeconds = Math.max(1, Math.round(cfg.leaseDurationMs / 1000));
  }

  get identity(): string {
    return this.#cfg.identity;
  }

  isLeader(): boolean {
    return this.#leader;
  }

  start(): void {
    if (this.#loop) return;
    this.#stopped = false;
    this.#loop = this.#run();
  }

  /**
   * Stop campaigning. With release (the default) a leader first stops acting
   * as leader, then clears holderIdentity; without it the Lease is left to
   * expire, as when a process dies.
   */
  async stop(opts: { release?: boolean } = {}): Promise<void> {
    this.#stopped = true;
    this.#wake?.();
    await this.#loop;
    this.#loop = undefined;
    this.#stepDown('stopping');
    if (opts.release ?? true) await this.#release();
  }

  async #run(): Promise<void> {
    const { log, retryPeriodMs, renewDeadlineMs, leaseDurationMs } = this.#cfg;
    while (!this.#stopped) {
      // A leader may spend at most what is left of its renew deadline on one
      // attempt; a hanging API server must not keep a stale leader acting.
      const budget = this.#leader ? Math.max(0, this.#lastRenew + renewDeadlineMs - performance.now()) : leaseDurationMs;
      let result: Attempt | 'timeout' | 'error';
      try {
        result = await within(this.#tryAcquireOrRenew(), budget);
      } catch (err) {
        result = 'error';
        log.warn({ lease: this.#leaseRef(), err: errorText(err) }, 'cannot acquire or renew the lease');
      }
      if (this.#stopped) break;
      if (result === 'held') {
        this.#lastRenew = performance.now();
        if (!this.#leader) {
          this.#leader = true;
          log.info({ lease: this.#leaseRef(), identity: this.#cfg.identity }, 'became leader');
          this.#callback(this.#cfg.onStartedLeading);
        }
      } else if (this.#leader) {
        if (result === 'other') this.#stepDown('another replica holds the lease');
        else if (performance.now() - this.#lastRenew >= renewDeadlineMs) this.#stepDown(`no renewal succeeded within the renew deadline of ${renewDeadlineMs}ms`);
      }
      // Candidates spread their retries a little so they do not knock in step.
      const wait = this.#leader ? retryPeriodMs : retryPeriodMs * (1 + Math.random() * 0.2);
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, wait);
        this.#wake = () => {
          clearTimeout(t);
          resolve();
        };
      });
      this.#wake = undefined;
    }
  }

  #stepDown(why: string): void {
    if (!this.#leader) return;
    this.#leader = false;
    const fields = { lease: this.#leaseRef(), identity: this.#cfg.identity, reason: why };
    if (this.#stopped) this.#cfg.log.info(fields, 'stopped leading');
    else this.#cfg.log.warn(fields, 'stopped leading');
    this.#callback(this.#cfg.onStoppedLeading);
  }

  #callback(fn: (() => void) | undefined): void {
    try {
      fn?.();
    } catch (err) {
      this.#cfg.log.error({ err: errorText(err) }, 'leader election callback failed');
    }
  }

  #leaseRef(): string {
    return `${this.#cfg.namespace}/${this.#cfg.name}`;
  }

  async #read(): Promise<V1Lease | undefined> {
    try {
      return await this.#api.readNamespacedLease({ name: this.#cfg.name, namespace: this.#cfg.namespace });
    } catch (err) {
      if (apiCode(err) === 404) return undefined;
      throw err;
    }
  }

  #observe(holder: string): void {
    if (holder === this.#observedHolder) return;
    this.#observedHolder = holder;
    if (holder !== this.#cfg.identity) {
      this.#cfg.log.info({ lease: this.#leaseRef(), holder: holder || null }, holder ? 'lease held by another replica' : 'lease is free');
    }
  }

  async #tryAcquireOrRenew(): Promise<Attempt> {
    const { namespace, name, identity } = this.#cfg;
    const now = Date.now();
    const lease = await this.#read();
    if (!lease) {
      const body: V1Lease = {
        apiVersion: 'coordination.k8s.io/v1',
        kind: 'Lease',
        metadata: { name, namespace },
        spec: {
          holderIdentity: identity,
          leaseDurationSeconds: this.#leaseSeconds,
          acquireTime: microTime(now),
          renewTime: microTime(now),
          leaseTransitions: 0,
        },
      };
      try {
        await this.#api.createNamespacedLease({ namespace, body, fieldManager: LEASE_FIELD_MANAGER });
        this.#observe(identity);
        return 'held';
      } catch (err) {
        if (apiCode(err) === 409) return 'other';
        throw err;
      }
    }

    const spec: V1LeaseSpec = lease.spec ?? {};
    const holder = spec.holderIdentity ?? '';
    this.#observe(holder);
    if (holder !== '' && holder !== identity) {
      const renewed = timeMs(spec.renewTime);
      const seconds = spec.leaseDurationSeconds ?? this.#leaseSeconds;
      if (renewed !== undefined && now <= renewed + seconds * 1000) return 'other';
      this.#cfg.log.info({ lease: this.#leaseRef(), holder }, 'the holder stopped renewing; taking over');
    }

    const next: V1LeaseSpec =
      holder === identity
        ? { ...spec, holderIdentity: identity, leaseDurationSeconds: this.#leaseSeconds, acquireTime: spec.acquireTime ?? microTime(now), renewTime: microTime(now) }
        : {
            ...spec,
            holderIdentity: identity,
            leaseDurationSeconds: this.#leaseSeconds,
            acquireTime: microTime(now),
            renewTime: microTime(now),
            leaseTransitions: (spec.leaseTransitions ?? 0) + 1,
          };
    try {
      // metadata carries the resourceVersion just read: the optimistic lock.
      await this.#api.replaceNamespacedLease({ name, namespace, body: { ...lease, spec: next }, fieldManager: LEASE_FIELD_MANAGER });
      this.#observe(identity);
      return 'held';
    } catch (err) {
      if (apiCode(err) === 409) return 'other';
      throw err;
    }
  }

  async #release(): Promise<void> {
    const { log, identity, name, namespace } = this.#cfg;
    try {
      const r = await within(
        (async () => {
          const lease = await this.#read();
          if (!lease || lease.spec?.holderIdentity !== identity) return;
          const now = Date.now();
          const spec: V1LeaseSpec = { ...lease.spec, leaseDurationSeconds: 1, acquireTime: microTime(now), renewTime: microTime(now) };
          delete spec.holderIdentity;
          await this.#api.replaceNamespacedLease({ name, namespace, body: { ...lease, spec }, fieldManager: LEASE_FIELD_MANAGER });
          log.info({ lease: this.#leaseRef(), identity }, 'released the lease');
        })(),
        Math.min(this.#cfg.renewDeadlineMs, 5000),
      );
      if (r === 'timeout') log.warn({ lease: this.#leaseRef() }, 'releasing the lease timed out; it expires on its own');
    } catch (err) {
      log.warn({ lease: this.#leaseRef(), err: errorText(err) }, 'cannot release the lease; it expires on its own');
    }
  }
}

/** The promise's value, or 'timeout' when it takes longer than `ms`. */
async function within<T>(p: Promise<T>, ms: number): Promise<T | 'timeout'> {
  let timer: NodeJS.Timeout | undefined;
  p.catch(() => {}); // an abandoned attempt must not become an unhandled rejection
  try {
    return await Promise.race([
      p,
      new Promise<'timeout'>((resolve) => {
        timer = setTimeout(() => resolve('timeout'), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}
