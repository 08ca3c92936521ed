// The reload seam: make CRI-O re-read its configuration after the pin file
// changed. Implementations in ./reload.ts: over D-Bus to systemd
// (ReloadUnit), `systemctl reload`, or none.

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
