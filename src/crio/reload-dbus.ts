// DbusReloader: asks systemd over the system bus to reload CRI-O, the way
// `systemctl reload` does, without needing the systemctl binary inside the
// agent's image: Manager.ReloadUnit(unit, "replace") returns a job, and the
// job's end is the Manager signal JobRemoved(u id, o job, s unit, s result).
// https://www.freedesktop.org/software/systemd/man/latest/org.freedesktop.systemd1.html
import type { EventEmitter } from 'node:events';
import type { Socket } from 'node:net';
import type { Logger } from '../util/log.ts';
import { abortError, bounded, DEFAULT_CRIO_UNIT, DEFAULT_RELOAD_TIMEOUT_MS, normalizeUnitName, ReloadError, type Reloader, type ReloaderOptions } from './reloader.ts';

const SYSTEMD_NAME = 'org.freedesktop.systemd1';
const SYSTEMD_PATH = '/org/freedesktop/systemd1';
const MANAGER_IFACE = 'org.freedesktop.systemd1.Manager';

export interface DbusReloaderOptions extends ReloaderOptions {
  /**
   * D-Bus address of the system bus. Default: what the library's systemBus()
   * uses, DBUS_SYSTEM_BUS_ADDRESS or unix:path=/var/run/dbus/system_bus_socket,
   * read when a connection is made.
   */
  busAddress?: string;
}

// The parts of @homebridge/dbus-native used here (its own typings cover less).
interface DbusMessage {
  type?: number;
  serial?: number;
  replySerial?: number;
  path?: string;
  interface?: string;
  member?: string;
  destination?: string;
  sender?: string;
  errorName?: string;
  signature?: string;
  body?: unknown[];
}
/** What the library passes to a reply callback for an error reply. */
interface DbusErrorReply {
  name?: string;
  message?: string;
}
interface DbusConnection extends EventEmitter {
  stream: Socket;
  end(): void;
}
type ReplyCallback = (this: { message?: DbusMessage }, err: DbusErrorReply | null | undefined, ...values: unknown[]) => void;
interface DbusBus {
  connection: DbusConnection;
  invoke(msg: DbusMessage, callback: ReplyCallback): void;
  addMatch(rule: string, callback: ReplyCallback): void;
}
interface DbusNative {
  createClient(opts: { busAddress?: string }): DbusBus;
  systemBus(): DbusBus;
  messageType: { methodCall: number; methodReturn: number; error: number; signal: number };
}
// Loaded on first use: nodes that reload with systemctl (or not at all) never pay for it.
let dbusLib: DbusNative;
async function loadDbus(): Promise<void> {
  dbusLib ??= (await import('@homebridge/dbus-native')).default as unknown as DbusNative;
}

/** systemd's answer to a method call, with the unique bus name it came from. */
interface CallResult {
  values: unknown[];
  sender: string | undefined;
}

interface JobRemoved {
  id: number;
  job: string;
  unit: string;
  result: string;
  sender: string | undefined;
}

/** A D-Bus error reply from systemd or the bus. */
class DbusCallError extends Error {
  override name = 'DbusCallError';
  readonly dbusName: string;
  constructor(dbusName: string, text: string) {
    super(text ? `${dbusName}: ${text}` : dbusName);
    this.dbusName = dbusName;
  }
}

/**
 * One connection to the bus, subscribed to systemd's job signals. Once the
 * connection fails or ends the session is dead: every pending call fails at
 * once (the library would otherwise wait forever for their replies) and the
 * reloader opens a new session for the next reload.
 */
class BusSession {
  readonly address: string;
  readonly bus: DbusBus;
  /** AddMatch and Subscribe done. */
  readonly ready: Promise<void>;
  #dead: Error | undefined;
  readonly #pending = new Set<(err: Error) => void>();
  readonly #jobListeners = new Set<(ev: JobRemoved) => void>();

  constructor(address: string | undefined) {
    this.address = address ?? (process.env.DBUS_SYSTEM_BUS_ADDRESS || 'unix:path=/var/run/dbus/system_bus_socket');
    // systemBus() reads DBUS_SYSTEM_BUS_ADDRESS itself; an explicit address goes through createClient.
    this.bus = address === undefined ? dbusLib.systemBus() : dbusLib.createClient({ busAddress: address });
    const conn = this.bus.connection;
    // Registered before any I/O can fail: an 'error' without a listener would crash the process.
    conn.on('error', (err: Error) => this.#die(err));
    conn.on('end', () => this.#die(new Error('the bus closed the connection')));
    conn.stream.on('close', () => this.#die(new Error('connection closed')));
    // The agent's lifetime must not hang on an idle bus connection; a reload
    // in flight keeps the process alive through its own timer.
    conn.stream.unref();
    conn.on('message', (msg: DbusMessage) => this.#onMessage(msg));

    const rule = `type='signal',sender='${SYSTEMD_NAME}',path='${SYSTEMD_PATH}',interface='${MANAGER_IFACE}',member='JobRemoved'`;
    this.ready = (async () => {
      await this.#invoke((cb) => this.bus.addMatch(rule, cb));
      // systemd emits job signals on the system bus only while someone is
      // subscribed; a second Subscribe from the same connection is refused
      // with AlreadySubscribed, which is fine.
      try {
        await this.callManager('Subscribe');
      } catch (err) {
        if (!(err instanceof DbusCallError && err.dbusName === 'org.freedesktop.systemd1.AlreadySubscribed')) throw err;
      }
    })();
    // A session whose setup failed is finished: the next reload starts over
    // (systemd may have joined the bus by then).
    this.ready.catch((err: Error) => this.#die(err));
  }

  get dead(): boolean {
    return this.#dead !== undefined;
  }

  callManager(member: string, signature?: string, body?: unknown[]): Promise<CallResult> {
    const msg: DbusMessage = { destination: SYSTEMD_NAME, path: SYSTEMD_PATH, interface: MANAGER_IFACE, member };
    if (signature) {
      msg.signature = signature;
      msg.body = body;
    }
    return this.#invoke((cb) => this.bus.invoke(msg, cb));
  }

  /** Calls listener for every JobRemoved signal until the returned function is called. */
  onJobRemoved(listener: (ev: JobRemoved) => void): () => void {
    this.#jobListeners.add(listener);
    return () => this.#jobListeners.delete(listener);
  }

  /** Adds a listener for the session's death; returns the remover. Called at once if already dead. */
  onDeath(listener: (err: Error) => void): () => void {
    if (this.#dead) {
      listener(this.#dead);
      return () => {};
    }
    this.#pending.add(listener);
    return () => this.#pending.delete(listener);
  }

  close(): void {
    this.#die(new Error('reloader closed'));
  }

  #invoke(send: (cb: ReplyCallback) => void): Promise<CallResult> {
    return new Promise<CallResult>((resolve, reject) => {
      if (this.#dead) return reject(this.#dead);
      const pending = this.#pending;
      const onDeath = (err: Error) => reject(err);
      pending.add(onDeath);
      send(function (err, ...values) {
        pending.delete(onDeath);
        // The library calls this with the reply's message as this.message.
        const sender = this?.message?.sender;
        if (err) reject(new DbusCallError(err.name ?? 'org.freedesktop.DBus.Error.Failed', err.message ?? ''));
        else resolve({ values, sender });
      });
    });
  }

  #onMessage(msg: DbusMessage): void {
    if (msg.type !== dbusLib.messageType.signal) return;
    if (msg.interface !== MANAGER_IFACE || msg.member !== 'JobRemoved' || msg.path !== SYSTEMD_PATH) return;
    const [id, job, unit, result] = msg.body ?? [];
    if (typeof job !== 'string' || typeof result !== 'string') return;
    const ev: JobRemoved = { id: Number(id), job, unit: String(unit), result, sender: msg.sender };
    for (const l of [...this.#jobListeners]) l(ev);
  }

  #die(err: Error): void {
    if (this.#dead) return;
    this.#dead = err;
    const listeners = [...this.#pending];
    this.#pending.clear();
    this.#jobListeners.clear();
    for (const l of listeners) l(err);
    try {
      this.bus.connection.stream.destroy();
    } catch {
      // already gone
    }
  }
}

function describeCallError(err: unknown, unit: string, address: string): ReloadError {
  if (err instanceof DbusCallError) {
    const detail = bounded(err.message);
    switch (err.dbusName) {
      case 'org.freedesktop.systemd1.NoSuchUnit':
        return new ReloadError(`systemd has no unit ${unit} (${detail}); check --crio-unit`, { cause: err });
      case 'org.freedesktop.DBus.Error.AccessDenied':
      case 'org.freedesktop.DBus.Error.InteractiveAuthorizationRequired':
        return new ReloadError(
          `systemd refused to reload ${unit} (${detail}); the agent needs root or a polkit rule allowing it to reload ${unit}`,
          { cause: err },
        );
      case 'org.freedesktop.DBus.Error.ServiceUnknown':
      case 'org.freedesktop.DBus.Error.NameHasNoOwner':
        return new ReloadError(`systemd is not on the system bus at ${address} (${detail})`, { cause: err });
      default:
        return new ReloadError(`systemd could not reload ${unit}: ${detail}`, { cause: err });
    }
  }
  const e = err instanceof Error ? err : new Error(String(err));
  return new ReloadError(`D-Bus connection to ${address} failed while reloading ${unit}: ${bounded(e.message)}`, { cause: e });
}

/** Reloads a unit through systemd's D-Bus API and waits for the reload job to end. */
export class DbusReloader implements Reloader {
  readonly mode = 'dbus' as const;
  readonly unit: string;
  readonly timeoutMs: number;
  readonly #busAddress: string | undefined;
  readonly #logger: Logger | undefined;
  #session: BusSession | undefined;
  #closed = false;

  constructor(opts: DbusReloaderOptions = {}) {
    this.unit = normalizeUnitName(opts.unit ?? DEFAULT_CRIO_UNIT);
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_RELOAD_TIMEOUT_MS;
    this.#busAddress = opts.busAddress;
    this.#logger = opts.logger;
  }

  /**
   * Resolves once systemd reports the reload job "done". Rejects with a
   * ReloadError on any other result, a D-Bus error, a lost connection, the
   * timeout, or an abort (cause: the signal's reason). An abort or timeout
   * stops the wait only: a job systemd already queued still runs.
   */
  async reload(signal?: AbortSignal): Promise<void> {
    if (this.#closed) throw new ReloadError(`reloader closed; cannot reload ${this.unit}`);
    if (signal?.aborted) throw abortError(this.unit, signal);
    const started = Date.now();
    // A dead session (bus restarted, connection dropped) is replaced here, so
    // a dropped connection costs one failed reload at most, never all later ones.
    if (!this.#session || this.#session.dead) {
      await loadDbus();
      try {
        this.#session = new BusSession(this.#busAddress);
      } catch (err) {
        // The library throws at once on an address it cannot parse.
        const address = this.#busAddress ?? process.env.DBUS_SYSTEM_BUS_ADDRESS ?? '(default system bus)';
        throw new ReloadError(`cannot use D-Bus address ${JSON.stringify(address)} to reload ${this.unit}: ${(err as Error).message}`, { cause: err });
      }
    }
    const session = this.#session;
    const unit = this.unit;

    // Every wait below races against this one: timeout, abort, or the
    // connection dying. Nothing waits on the bus unbounded.
    let timer: NodeJS.Timeout | undefined;
    let onAbort: (() => void) | undefined;
    let removeDeath: (() => void) | undefined;
    let stage = 'connecting to the system bus';
    let jobPath: string | undefined;
    const stop = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        const what = jobPath ? `waiting for job ${jobPath} to finish` : stage;
        reject(new ReloadError(`reload of ${unit} timed out after ${this.timeoutMs} ms ${what} (bus ${session.address})`));
      }, this.timeoutMs);
      if (signal) {
        onAbort = () => reject(abortError(unit, signal));
        signal.addEventListener('abort', onAbort, { once: true });
      }
      removeDeath = session.onDeath((err) => reject(describeCallError(err, unit, session.address)));
    });
    stop.catch(() => {});

    // JobRemoved can arrive before ReloadUnit's reply (a job can finish
    // before systemd's reply is read), so signals are collected from before
    // the call, and looked up once the reply names the job.
    const seen: JobRemoved[] = [];
    let waiter: ((ev: JobRemoved) => void) | undefined;
    const removeJobs = session.onJobRemoved((ev) => {
      if (waiter) waiter(ev);
      else seen.push(ev);
    });

    try {
      await Promise.race([session.ready, stop]).catch((err) => {
        throw err instanceof ReloadError ? err : describeCallError(err, unit, session.address);
      });
      stage = `calling ReloadUnit(${unit})`;
      const reply = await Promise.race([session.callManager('ReloadUnit', 'ss', [unit, 'replace']), stop]).catch((err) => {
        throw err instanceof ReloadError ? err : describeCallError(err, unit, session.address);
      });
      const job = reply.values[0];
      if (typeof job !== 'string') throw new ReloadError(`systemd answered ReloadUnit(${unit}) without a job path`);
      jobPath = job;
      // Job paths are only unique per systemd instance: match the sender of the reply too.
      const ours = (ev: JobRemoved) => ev.job === job && (reply.sender === undefined || ev.sender === reply.sender);
      this.#logger?.debug({ unit, job }, 'reload job queued');
      const early = seen.find(ours);
      const done = early
        ? early
        : await Promise.race([
            new Promise<JobRemoved>((resolve) => {
              waiter = (ev) => {
                if (ours(ev)) resolve(ev);
              };
            }),
            stop,
          ]);
      if (done.result !== 'done') {
        throw new ReloadError(`reload of ${unit} ended with result "${done.result}" (job ${job}); see journalctl -u ${unit}`);
      }
      this.#logger?.info({ unit, job, durationMs: Date.now() - started }, 'reloaded');
    } catch (err) {
      const e = err instanceof ReloadError ? err : describeCallError(err, unit, session.address);
      this.#logger?.warn({ unit, err: e.message }, 'reload failed');
      throw e;
    } finally {
      clearTimeout(timer);
      if (signal && onAbort) signal.removeEventListener('abort', onAbort);
      removeDeath?.();
      removeJobs();
    }
  }

  close(): void {
    this.#closed = true;
    this.#session?.close();
    this.#session = undefined;
  }
}

