// Reloaders: make CRI-O re-read its drop-ins after the pin file changed.
//
// - DbusReloader (./reload-dbus.ts) asks systemd over the system bus, the way `systemctl reload`
//   does, without needing the systemctl binary inside the agent's image:
//   Manager.ReloadUnit(unit, "replace") returns a job, and the job's end is the
//   Manager signal JobRemoved(u id, o job, s unit, s result).
//   https://www.freedesktop.org/software/systemd/man/latest/org.freedesktop.systemd1.html
// - SystemctlReloader runs `systemctl reload <unit>` (for hosts where the
//   agent runs as a systemd service next to CRI-O).
// - NoReloader, for setups where something else reloads CRI-O.
import { execFile } from 'node:child_process';
import { abortError, bounded, DEFAULT_CRIO_UNIT, DEFAULT_RELOAD_TIMEOUT_MS, normalizeUnitName, ReloadError, type ReloaderOptions, type ReloadMode, type Reloader } from './reloader.ts';
import type { Logger } from '../util/log.ts';
import { DbusReloader, type DbusReloaderOptions } from './reload-dbus.ts';

export { DbusReloader, DEFAULT_CRIO_UNIT, DEFAULT_RELOAD_TIMEOUT_MS, normalizeUnitName, ReloadError };
export type { ReloaderOptions, ReloadMode, Reloader };

export interface SystemctlReloaderOptions extends ReloaderOptions {
  /** The systemctl program; default "systemctl", looked up on PATH. */
  systemctl?: string;
}

export function createReloader(mode: ReloadMode, opts: DbusReloaderOptions = {}): Reloader {
  switch (mode) {
    case 'dbus':
      return new DbusReloader(opts);
    case 'systemctl':
      return new SystemctlReloader(opts);
    case 'none':
      return new NoReloader();
    default:
      throw new Error(`unknown reload mode ${JSON.stringify(mode)} (expected dbus, systemctl or none)`);
  }
}

// ---------------------------------------------------------------------------
// systemctl

interface ExecFailure extends Error {
  code?: number | string;
  killed?: boolean;
  signal?: NodeJS.Signals | null;
}

/** Runs `systemctl reload <unit>`; systemctl itself waits for the reload job to end. */
export class SystemctlReloader implements Reloader {
  readonly mode = 'systemctl' as const;
  readonly unit: string;
  readonly timeoutMs: number;
  readonly #systemctl: string;
  readonly #logger: Logger | undefined;

  constructor(opts: SystemctlReloaderOptions = {}) {
    this.unit = normalizeUnitName(opts.unit ?? DEFAULT_CRIO_UNIT);
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_RELOAD_TIMEOUT_MS;
    this.#systemctl = opts.systemctl ?? 'systemctl';
    this.#logger = opts.logger;
  }

  reload(signal?: AbortSignal): Promise<void> {
    const unit = this.unit;
    if (signal?.aborted) return Promise.reject(abortError(unit, signal));
    const started = Date.now();
    return new Promise<void>((resolve, reject) => {
      execFile(
        this.#systemctl,
        ['reload', unit],
        { timeout: this.timeoutMs, signal, maxBuffer: 1024 * 1024, encoding: 'utf8', windowsHide: true },
        (error, _stdout, stderr) => {
          if (!error) {
            this.#logger?.info({ unit, durationMs: Date.now() - started }, 'reloaded');
            return resolve();
          }
          const err = error as ExecFailure;
          const detail = bounded(String(stderr ?? ''));
          let e: ReloadError;
          if (err.name === 'AbortError') {
            e = abortError(unit, signal!);
          } else if (err.code === 'ENOENT') {
            e = new ReloadError(`cannot run ${this.#systemctl} to reload ${unit}: not found on PATH (use --reload dbus or none)`, { cause: err });
          } else if (typeof err.code === 'string') {
            e = new ReloadError(`cannot run ${this.#systemctl} to reload ${unit}: ${err.code}`, { cause: err });
          } else if (err.killed || (err.code == null && err.signal)) {
            const why = err.killed && err.signal === 'SIGTERM' ? `timed out after ${this.timeoutMs} ms` : `killed by ${err.signal}`;
            e = new ReloadError(`systemctl reload ${unit} ${why}${detail ? `: ${detail}` : ''}`, { cause: err });
          } else {
            e = new ReloadError(`systemctl reload ${unit} failed with exit code ${err.code}${detail ? `: ${detail}` : ''}`, { cause: err });
          }
          this.#logger?.warn({ unit, err: e.message }, 'reload failed');
          reject(e);
        },
      );
    });
  }

  close(): void {}
}

// ---------------------------------------------------------------------------

/** Mode "none": CRI-O is reloaded by something else (or pins apply at its next restart). */
export class NoReloader implements Reloader {
  readonly mode = 'none' as const;
  reload(): Promise<void> {
    return Promise.resolve();
  }
  close(): void {}
}
