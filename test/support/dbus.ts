// A private D-Bus bus (a real dbus-daemon) and a systemd stand-in on it, so
// the D-Bus reloader can be tested unchanged: point DBUS_SYSTEM_BUS_ADDRESS
// (or DbusReloader's busAddress) at PrivateBus.address.
//
// The stand-in owns org.freedesktop.systemd1 and serves the two Manager
// methods the reloader uses, with systemd's observable behaviour:
// ReloadUnit(ss) -> o returns a job path at once, runs the reload, then
// signals JobRemoved(u id, o job, s unit, s result); unknown units get
// org.freedesktop.systemd1.NoSuchUnit; job signals go out only while some
// client has called Subscribe().
// https://www.freedesktop.org/software/systemd/man/latest/org.freedesktop.systemd1.html
import { spawn, type ChildProcessByStdio } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { EventEmitter } from 'node:events';
import type { Socket } from 'node:net';
import type { Readable } from 'node:stream';
import dbusNative from '@homebridge/dbus-native';

function xmlEscape(s: string): string {
  return s.replace(/[<>&'"]/g, (c) => ({ '<': '&lt;', '>': '&gt;', '&': '&amp;', "'": '&apos;', '"': '&quot;' })[c]!);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A dbus-daemon on a unix socket in a temporary folder, stopped by its own PID. */
export class PrivateBus {
  readonly dir: string;
  readonly socketPath: string;
  readonly configPath: string;
  /** `unix:path=...`, the form DBUS_SYSTEM_BUS_ADDRESS takes. */
  readonly address: string;
  pid: number | undefined;
  #child: ChildProcessByStdio<null, Readable, Readable> | undefined;

  /** `socketPath` defaults to `<dir>/bus.sock`; a node bed puts it where the system bus socket goes. */
  constructor(dir: string, socketPath = join(dir, 'bus.sock')) {
    this.dir = dir;
    this.socketPath = socketPath;
    this.configPath = join(dir, 'bus.conf');
    this.address = `unix:path=${this.socketPath}`;
  }

  /** Starts (or starts again, on the same socket path) the daemon. */
  async start(): Promise<void> {
    if (this.pid !== undefined) throw new Error('dbus-daemon already running');
    // The policy of facts/test-bed.md: anyone may own any name and send anywhere.
    const config =
      '<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN" "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">\n' +
      `<busconfig><type>session</type><listen>unix:path=${xmlEscape(this.socketPath)}</listen><auth>EXTERNAL</auth>` +
      '<policy context="default"><allow send_destination="*" eavesdrop="true"/><allow eavesdrop="true"/><allow own="*"/></policy></busconfig>\n';
    await writeFile(this.configPath, config);
    // Run as our own child rather than with --fork: a forked daemon is
    // reparented to PID 1, and in a container whose PID 1 does not reap, every
    // stopped bus would stay behind as a zombie. --print-pid still says when
    // it is ready, and the PID is what stop() signals.
    const child = spawn('dbus-daemon', [`--config-file=${this.configPath}`, '--nofork', '--print-pid=1'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const pid = await new Promise<number>((resolvePid, reject) => {
      let out = '';
      const timer = setTimeout(() => reject(new Error(`dbus-daemon printed no PID within 10 s: ${stderr}`)), 10_000);
      child.on('error', (err) => {
        clearTimeout(timer);
        reject(err);
      });
      child.on('exit', (code) => {
        clearTimeout(timer);
        reject(new Error(`dbus-daemon exited with ${code}: ${stderr}`));
      });
      child.stdout.setEncoding('utf8').on('data', (d: string) => {
        out += d;
        const line = out.split('\n')[0]!;
        if (out.includes('\n')) {
          clearTimeout(timer);
          resolvePid(Number(line.trim()));
        }
      });
    });
    if (!Number.isInteger(pid) || pid <= 0) throw new Error(`dbus-daemon printed no PID (${pid})`);
    this.pid = pid;
    this.#child = child;
    for (let i = 0; i < 100 && !existsSync(this.socketPath); i++) await sleep(20);
    if (!existsSync(this.socketPath)) {
      await this.stop();
      throw new Error(`dbus-daemon (pid ${pid}) did not create ${this.socketPath}`);
    }
  }

  /** Stops the daemon by its PID; the folder stays (start() again to restart on the same path). */
  async stop(): Promise<void> {
    const pid = this.pid;
    const child = this.#child;
    if (pid === undefined) return;
    this.pid = undefined;
    this.#child = undefined;
    const exited = child && child.exitCode === null && child.signalCode === null ? new Promise<void>((r) => child.once('exit', () => r())) : Promise.resolve();
    try {
      process.kill(pid, 'SIGTERM');
    } catch {
      return;
    }
    // Unref'd: once the daemon is gone, the grace period keeps the tests' process alive no longer.
    const killed = await Promise.race([exited.then(() => true), new Promise((r) => setTimeout(r, 5_000).unref()).then(() => false)]);
    if (!killed) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone meanwhile
      }
      await exited;
    }
  }

  /** Stops the daemon and removes the folder. */
  async dispose(): Promise<void> {
    await this.stop();
    await rm(this.dir, { recursive: true, force: true });
  }
}

/** `socketPath`: where the bus listens (a node's /run/dbus/system_bus_socket under a host root); default in its own folder. */
export async function startPrivateBus(socketPath?: string): Promise<PrivateBus> {
  const dir = await mkdtemp(join(tmpdir(), 'pinset-dbus-'));
  const bus = socketPath ? new PrivateBus(dir, socketPath) : new PrivateBus(dir);
  try {
    await bus.start();
  } catch (err) {
    await bus.dispose();
    throw err;
  }
  return bus;
}

// ---------------------------------------------------------------------------
// systemd stand-in

interface DbusMessage {
  sender?: string;
}
interface StandInBus {
  connection: EventEmitter & { stream: Socket; end(): void };
  requestName(name: string, flags: number, cb: (err: { name?: string; message?: string } | null, code?: number) => void): void;
  exportInterface(impl: object, path: string, iface: object): void;
  sendSignal(path: string, iface: string, member: string, signature: string, body: unknown[]): void;
}
const dbusLib = dbusNative as unknown as { createClient(opts: { busAddress: string }): StandInBus };

export const SYSTEMD_NAME = 'org.freedesktop.systemd1';
export const SYSTEMD_PATH = '/org/freedesktop/systemd1';
export const MANAGER_IFACE = 'org.freedesktop.systemd1.Manager';

// RequestName flags and replies (D-Bus specification, "org.freedesktop.DBus.RequestName").
const DBUS_NAME_FLAG_DO_NOT_QUEUE = 4;
const DBUS_REQUEST_NAME_REPLY_PRIMARY_OWNER = 1;

/** An Error the library turns into a D-Bus error reply named dbusName. */
class DbusReplyError extends Error {
  readonly dbusName: string;
  constructor(dbusName: string, message: string) {
    super(message);
    this.dbusName = dbusName;
  }
}

export interface SystemdStandInOptions {
  /** The private bus's address (PrivateBus.address). */
  address: string;
  /** Units ReloadUnit accepts; default ["crio.service"]. */
  units?: string[];
  /** Runs as the reload job; a throw (or rejection) makes the job end "failed". */
  onReload?: (unit: string) => unknown;
  /**
   * Send JobRemoved before the ReloadUnit reply, as when a job finishes before
   * the caller has read systemd's reply.
   */
  signalBeforeReply?: boolean;
}

export interface ReloadRecord {
  unit: string;
  mode: string;
  job: string;
  /** JobRemoved result, once the job ended. */
  result?: string;
  /** Unique bus name of the caller. */
  caller?: string;
}

export class SystemdStandIn {
  readonly bus: StandInBus;
  readonly units: Set<string>;
  onReload: ((unit: string) => unknown) | undefined;
  signalBeforeReply: boolean;
  /** Every ReloadUnit call that created a job, in order. */
  readonly reloads: ReloadRecord[] = [];
  /** Unique names of the clients that called Subscribe(). */
  readonly subscribers = new Set<string>();
  /** Jobs that ended while nobody was subscribed (systemd sends no signal then). */
  readonly unsignalledJobs: string[] = [];
  #failNext = 0;
  #denyReason: string | undefined;
  #nextJob = 100;
  #closed = false;

  constructor(bus: StandInBus, opts: SystemdStandInOptions) {
    this.bus = bus;
    this.units = new Set(opts.units ?? ['crio.service']);
    this.onReload = opts.onReload;
    this.signalBeforeReply = opts.signalBeforeReply ?? false;
  }

  /** Reloads that ended "done" (optionally of one unit). */
  reloadCount(unit?: string): number {
    return this.reloads.filter((r) => r.result === 'done' && (unit === undefined || r.unit === unit)).length;
  }

  /** The next n reload jobs end "failed" without running onReload. */
  failNextReloads(n: number): void {
    this.#failNext = n;
  }

  /** Refuse ReloadUnit with org.freedesktop.DBus.Error.AccessDenied, as systemd does for a caller polkit does not authorise. */
  denyReloads(reason = 'Access denied'): void {
    this.#denyReason = reason;
  }

  allowReloads(): void {
    this.#denyReason = undefined;
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.bus.connection.stream.destroy();
  }

  // D-Bus methods: the library passes the body's arguments, then the message.
  async reloadUnit(unit: string, mode: string, msg: DbusMessage): Promise<string> {
    if (this.#denyReason !== undefined) {
      throw new DbusReplyError('org.freedesktop.DBus.Error.AccessDenied', this.#denyReason);
    }
    if (!this.units.has(unit)) {
      // systemd's text for BUS_ERROR_NO_SUCH_UNIT
      throw new DbusReplyError('org.freedesktop.systemd1.NoSuchUnit', `Unit ${unit} not found.`);
    }
    if (mode !== 'replace' && mode !== 'fail') {
      throw new DbusReplyError('org.freedesktop.DBus.Error.InvalidArgs', `Job mode ${mode} invalid.`);
    }
    const id = this.#nextJob++;
    const job = `${SYSTEMD_PATH}/job/${id}`;
    const record: ReloadRecord = { unit, mode, job, caller: msg.sender };
    this.reloads.push(record);
    if (this.signalBeforeReply) {
      await this.#runJob(id, record);
    } else {
      // After the reply has been written, as systemd runs jobs from its event loop.
      setImmediate(() => void this.#runJob(id, record));
    }
    return job;
  }

  subscribe(msg: DbusMessage): void {
    if (msg.sender) this.subscribers.add(msg.sender);
  }

  async #runJob(id: number, record: ReloadRecord): Promise<void> {
    let result = 'done';
    if (this.#failNext > 0) {
      this.#failNext--;
      result = 'failed';
    } else {
      try {
        await this.onReload?.(record.unit);
      } catch {
        result = 'failed';
      }
    }
    record.result = result;
    if (this.#closed) return;
    if (this.subscribers.size === 0) {
      this.unsignalledJobs.push(record.job);
      return;
    }
    this.bus.sendSignal(SYSTEMD_PATH, MANAGER_IFACE, 'JobRemoved', 'uoss', [id, record.job, record.unit, result]);
  }
}

/** Connects to the bus, owns org.freedesktop.systemd1 and exports the Manager object. */
export async function startSystemdStandIn(opts: SystemdStandInOptions): Promise<SystemdStandIn> {
  const bus = dbusLib.createClient({ busAddress: opts.address });
  const standIn = new SystemdStandIn(bus, opts);
  const failed = new Promise<never>((_, reject) => {
    bus.connection.on('error', (err: Error) => reject(err));
  });
  failed.catch(() => {});
  // Keep later connection errors (the daemon stopped under a test) from crashing the process.
  bus.connection.on('end', () => {});

  bus.exportInterface(
    {
      ReloadUnit: (unit: string, mode: string, msg: DbusMessage) => standIn.reloadUnit(unit, mode, msg),
      Subscribe: (msg: DbusMessage) => standIn.subscribe(msg),
      Unsubscribe: (msg: DbusMessage) => {
        if (msg.sender) standIn.subscribers.delete(msg.sender);
      },
    },
    SYSTEMD_PATH,
    {
      name: MANAGER_IFACE,
      methods: {
        ReloadUnit: ['ss', 'o', ['name', 'mode'], ['job']],
        Subscribe: ['', '', [], []],
        Unsubscribe: ['', '', [], []],
      },
      signals: { JobRemoved: ['uoss', 'id', 'job', 'unit', 'result'] },
    },
  );

  const code = await Promise.race([
    new Promise<number | undefined>((resolve, reject) =>
      bus.requestName(SYSTEMD_NAME, DBUS_NAME_FLAG_DO_NOT_QUEUE, (err, c) =>
        err ? reject(new Error(`RequestName(${SYSTEMD_NAME}): ${err.name}: ${err.message}`)) : resolve(c),
      ),
    ),
    failed,
  ]);
  if (code !== DBUS_REQUEST_NAME_REPLY_PRIMARY_OWNER) {
    standIn.close();
    throw new Error(`could not own ${SYSTEMD_NAME} (RequestName reply ${code})`);
  }
  return standIn;
}
