// Go's time.ParseDuration, for the durations of the kubelet's credential
// provider config and of its plugins' answers (./credential-provider-config.ts,
// ./credential-provider.ts). A module of its own: the plugins' runner is loaded
// with every agent, the config reader (and its YAML parser) only when a config
// is given.

const UNIT_MS: Record<string, number> = { ns: 1e-6, us: 1e-3, 'µs': 1e-3, 'μs': 1e-3, ms: 1, s: 1_000, m: 60_000, h: 3_600_000 };

/** Go's time.ParseDuration ("12h", "1h30m", "0", "500ms"), in ms. Throws on anything it refuses. */
export function parseGoDuration(s: string): number {
  const bad = () => new Error(`time: invalid duration ${JSON.stringify(s)}`);
  let rest = s;
  let sign = 1;
  if (rest[0] === '-' || rest[0] === '+') {
    sign = rest[0] === '-' ? -1 : 1;
    rest = rest.slice(1);
  }
  if (rest === '0') return 0;
  if (rest === '') throw bad();
  let total = 0;
  while (rest !== '') {
    const m = /^([0-9]*)(\.[0-9]*)?([^0-9.]*)/.exec(rest)!;
    const [whole, int, frac, unit] = [m[0], m[1]!, m[2] ?? '', m[3]!];
    if (int === '' && frac.length <= 1) throw bad();
    if (unit === '') throw new Error(`time: missing unit in duration ${JSON.stringify(s)}`);
    const ms = UNIT_MS[unit];
    if (ms === undefined) throw new Error(`time: unknown unit ${JSON.stringify(unit)} in duration ${JSON.stringify(s)}`);
    total += Number(`${int || '0'}${frac === '.' ? '' : frac}`) * ms;
    rest = rest.slice(whole.length);
  }
  return sign * total;
}
