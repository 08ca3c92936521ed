// The reload seam: make CRI-O re-read its configuration after the pin file
// changed. Implementations: over D-Bus to systemd (ReloadUnit,
// ./reload-dbus.ts), `systemctl reload` or none (./reload.ts); what they
// share is here.
import type { Logger } from '../util/log.ts';

export type ReloadMode = 'dbus' | 'systemctl' | 'none';

export interface Reloader {
  readonly mode: ReloadMode;
  /** Resolves when the reload finished successfully; rejects with ReloadError. */
  reload(signal?: AbortSignal): Promise<void>;
  close(): void;
}

export class ReloadError extends Error {
  override name = 'ReloadError';
}

export const DEFAULT_RELOAD_TIMEOUT_MS = 60_000;
export const DEFAULT_CRIO_UNIT = 'crio.service';

/** Longest piece of foreign text (stderr, D-Bus error text) copied into an error message. */
const MAX_DETAIL_CHARS = 1024;

export interface ReloaderOptions {
  /** systemd unit to reload; default crio.service. A name without a unit suffix gets ".service", as systemctl does. */
  unit?: string;
  logger?: Logger;
  /** Upper bound for one reload, from the call to the job's end; default 60 s. */
  timeoutMs?: number;
}

// systemd's unit types (systemd.unit(5)); a name without one of these
// suffixes is completed with ".service", as systemctl's unit_name_mangle does.
// The D-Bus API does not complete names: ReloadUnit("crio") fails.
const UNIT_SUFFIXES = ['service', 'socket', 'device', 'mount', 'automount', 'swap', 'target', 'path', 'timer', 'slice', 'scope'];
// Characters systemd allows in unit names (unit_name_is_valid), at most 255 in all.
const UNIT_NAME = /^[A-Za-z0-9:_.\\@-]+$/;

/** The unit name systemd will accept, or an Error saying why the name is unusable. */
export function normalizeUnitName(unit: string): string {
  if (!UNIT_NAME.test(unit) || unit.startsWith('-') || unit.startsWith('.')) {
    throw new Error(`invalid systemd unit name ${JSON.stringify(unit)}: use letters, digits and ":_.\\@-", e.g. crio.service`);
  }
  const dot = unit.lastIndexOf('.');
  const full = dot > 0 && UNIT_SUFFIXES.includes(unit.slice(dot + 1)) ? unit : `${unit}.service`;
  if (full.length > 255) throw new Error(`invalid systemd unit name ${JSON.stringify(unit)}: longer than 255 characters`);
  return full;
}

export function bounded(text: string): string {
  const t = text.trim();
  return t.length > MAX_DETAIL_CHARS ? `${t.slice(0, MAX_DETAIL_CHARS)}… (${t.length - MAX_DETAIL_CHARS} more characters)` : t;
}

export function abortError(unit: string, signal: AbortSignal): ReloadError {
  return new ReloadError(`reload of ${unit} aborted`, { cause: signal.reason });
}

