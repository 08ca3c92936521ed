// --min-watch-timeout (./list-watch.ts), apart from the list+watch cache: the
// agent reads its flags before it knows whether it talks to an API, and a
// node on static sets alone never loads the API's HTTP client.
import { UsageError, type FlagSpec, type FlagValues } from '../util/flags.ts';

export const DEFAULT_MIN_WATCH_TIMEOUT_MS = 10 * 60_000;

/** --min-watch-timeout, as the agent and the controller take it; `note` ends its help. */
export function minWatchTimeoutFlag(note = ''): FlagSpec {
  return {
    name: 'min-watch-timeout',
    env: 'PINSET_MIN_WATCH_TIMEOUT',
    type: 'duration',
    default: '10m',
    help: `each API watch asks the server to end it after a random time between this and twice this, then resumes${note}`,
  };
}

/** The --min-watch-timeout given, in ms; less than 1 s is a usage error. */
export function minWatchTimeoutMs(values: FlagValues): number {
  const ms = Number(values['min-watch-timeout']);
  if (ms < 1000) throw new UsageError('--min-watch-timeout must be at least 1s');
  return ms;
}
