// Flags for every command: each flag has an environment-variable twin, a
// default and one line of help, declared in one table per command.
// Precedence: command line, then environment, then default.

export type FlagType = 'string' | 'int' | 'number' | 'bool' | 'duration';

export interface FlagSpec {
  name: string;
  /** Environment variable twin; omit only for flags that make no sense in the environment. */
  env?: string;
  type: FlagType;
  default?: string | number | boolean;
  help: string;
  required?: boolean;
  /** Allowed values for string flags. */
  choices?: readonly string[];
  /** One-letter alias, e.g. "o" for -o. */
  short?: string;
  /** An empty value (also from the environment) is meaningful, e.g. "" disables a listener. */
  allowEmpty?: boolean;
}

export type FlagValues = Record<string, string | number | boolean | undefined>;

export class UsageError extends Error {
  override name = 'UsageError';
}

/** "30s", "5m", "1h", "250ms" or a bare number of seconds, to milliseconds. */
export function parseDuration(s: string): number {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(s.trim());
  if (!m) throw new UsageError(`${JSON.stringify(s)} is not a duration (e.g. 250ms, 30s, 5m, 1h)`);
  const n = Number(m[1]);
  const unit = m[2] ?? 's';
  return Math.round(n * { ms: 1, s: 1000, m: 60_000, h: 3_600_000 }[unit]!);
}

function convert(spec: FlagSpec, raw: string, from: string): string | number | boolean {
  switch (spec.type) {
    case 'string':
      if (spec.choices && !spec.choices.includes(raw)) {
        throw new UsageError(`${from}: ${JSON.stringify(raw)} is not one of ${spec.choices.join(', ')}`);
      }
      return raw;
    case 'int': {
      if (!/^\d+$/.test(raw)) throw new UsageError(`${from}: ${JSON.stringify(raw)} is not a whole number`);
      return Number(raw);
    }
    case 'number': {
      if (!/^\d+(?:\.\d+)?$/.test(raw)) throw new UsageError(`${from}: ${JSON.stringify(raw)} is not a number`);
      return Number(raw);
    }
    case 'bool':
      if (['', 'true', '1', 'yes'].includes(raw)) return true;
      if (['false', '0', 'no'].includes(raw)) return false;
      throw new UsageError(`${from}: ${JSON.stringify(raw)} is not true or false`);
    case 'duration':
      try {
        return parseDuration(raw);
      } catch (e) {
        throw new UsageError(`${from}: ${(e as Error).message}`);
      }
  }
}

/**
 * Parse argv against the specs. Returns values keyed by flag name plus the
 * positional arguments. `--help` sets values.help = true.
 */
export function parseFlags(
  specs: readonly FlagSpec[],
  argv: readonly string[],
  env: Record<string, string | undefined> = process.env,
): { values: FlagValues; positional: string[] } {
  const byName = new Map(specs.map((s) => [s.name, s]));
  const byShort = new Map(specs.filter((s) => s.short).map((s) => [s.short!, s]));
  const values: FlagValues = {};
  const positional: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === '--') {
      positional.push(...argv.slice(i + 1));
      break;
    }
    if (arg === '-h' || arg === '--help') {
      values.help = true;
      continue;
    }
    if (arg === '-' || !arg.startsWith('-')) {
      positional.push(arg);
      continue;
    }
    if (!arg.startsWith('--')) {
      // -o value, -o=value, -ovalue
      const spec = byShort.get(arg[1]!);
      if (!spec) throw new UsageError(`unknown flag ${arg.slice(0, 2)}`);
      let raw: string;
      if (arg.length > 2) raw = arg.slice(arg[2] === '=' ? 3 : 2);
      else if (spec.type === 'bool') raw = 'true';
      else {
        if (i + 1 >= argv.length) throw new UsageError(`-${spec.short} needs a value`);
        raw = argv[++i]!;
      }
      values[spec.name] = convert(spec, raw, `-${spec.short}`);
      continue;
    }
    const eq = arg.indexOf('=');
    const name = arg.slice(2, eq < 0 ? undefined : eq);
    const spec = byName.get(name);
    if (!spec) throw new UsageError(`unknown flag --${name}`);
    let raw: string;
    if (eq >= 0) raw = arg.slice(eq + 1);
    else if (spec.type === 'bool') raw = 'true';
    else {
      if (i + 1 >= argv.length) throw new UsageError(`--${name} needs a value`);
      raw = argv[++i]!;
    }
    values[name] = convert(spec, raw, `--${name}`);
  }
  for (const spec of specs) {
    if (values[spec.name] !== undefined) continue;
    const fromEnv = spec.env ? env[spec.env] : undefined;
    if (fromEnv !== undefined && (fromEnv !== '' || spec.allowEmpty)) values[spec.name] = convert(spec, fromEnv, spec.env!);
    else if (spec.default !== undefined) {
      values[spec.name] = spec.type === 'duration' && typeof spec.default === 'string' ? parseDuration(spec.default) : spec.default;
    }
  }
  if (!values.help) {
    for (const spec of specs) {
      if (spec.required && (values[spec.name] === undefined || values[spec.name] === '')) {
        throw new UsageError(`--${spec.name}${spec.env ? ` (or ${spec.env})` : ''} is required`);
      }
    }
  }
  return { values, positional };
}

/** Whether a usage line names the flag, by its long name or its one-letter alias. */
export function usageNames(usage: string, spec: FlagSpec): boolean {
  const named = (f: string) => new RegExp(`(^|[\\s\\[|(])${f.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}(?![\\w-])`).test(usage);
  return named(`--${spec.name}`) || (spec.short !== undefined && named(`-${spec.short}`));
}

function flagOperand(s: FlagSpec): string {
  const flag = s.type === 'bool' ? `--${s.name}` : `--${s.name} ${s.choices ? s.choices.join('|') : s.type.toUpperCase()}`;
  return s.required ? flag : `[${flag}]`;
}

/** The usage line with every flag it does not name yet, in place of its "[flags]" (or at its end), wrapped. */
export function usageLine(usage: string, specs: readonly FlagSpec[]): string {
  const missing = specs.filter((s) => !usageNames(usage, s)).map(flagOperand).join(' ');
  const whole = !missing ? usage : usage.includes('[flags]') ? usage.replace('[flags]', missing) : `${usage} ${missing}`;
  const lines: string[] = [];
  let line = '';
  for (const word of whole.match(/\[[^\]]*\]|\S+/g) ?? []) {
    if (line && line.length + word.length + 1 > 100) {
      lines.push(line);
      line = word;
    } else line = line ? `${line} ${word}` : word;
  }
  lines.push(line);
  return lines.join('\n       ');
}

/** Help text: a usage line naming every flag, then one line per flag with its env twin and default. */
export function helpText(usage: string, summary: string, specs: readonly FlagSpec[]): string {
  const rows = specs.map((s) => {
    const left = `  ${s.short ? `-${s.short}, ` : ''}--${s.name}${s.type === 'bool' ? '' : ` ${s.choices ? s.choices.join('|') : s.type}`}`;
    const extra = [s.env ? `env ${s.env}` : '', s.default !== undefined ? `default ${JSON.stringify(s.default)}` : '', s.required ? 'required' : '']
      .filter(Boolean)
      .join(', ');
    return `${left.padEnd(36)} ${s.help}${extra ? ` (${extra})` : ''}`;
  });
  return `usage: ${usageLine(usage, specs)}\n\n${summary}\n\nflags:\n${rows.join('\n')}\n`;
}
