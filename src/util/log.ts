// Logging: one JSON object per line (pino), stable keys: node, set, image,
// err. Credentials never reach a log line: the redaction below is a second
// line of defence; the first is that no code passes an AuthConfig to a logger.
import { pino, type Logger, type DestinationStream } from 'pino';

export type { Logger };

export const REDACT_PATHS = [
  'auth',
  'password',
  'auth.password',
  'auth.auth',
  'auth.identityToken',
  'auth.registryToken',
  '*.password',
  '*.auth',
  '*.identityToken',
  '*.registryToken',
  'token',
  '*.token',
];

export function createLogger(opts: { level?: string; name?: string; destination?: DestinationStream | NodeJS.WritableStream; base?: Record<string, unknown> } = {}): Logger {
  return pino(
    {
      level: opts.level ?? 'info',
      name: opts.name ?? 'pinset',
      base: opts.base ?? {},
      timestamp: pino.stdTimeFunctions.isoTime,
      redact: { paths: REDACT_PATHS, censor: '[redacted]' },
      formatters: { level: (label) => ({ level: label }) },
    },
    (opts.destination ?? pino.destination({ fd: 1, sync: true })) as DestinationStream,
  );
}

/** A logger that drops everything (tests that don't look at logs). */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
