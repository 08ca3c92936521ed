// The three kubelet flags that decide its credential verification policy,
// from its command line as pflag parses it (cmd/kubelet/app/server.go
// NewKubeletCommand, options.go AddFlags): --config (the file), --config-dir
// (the drop-in folder) and --feature-gates.
// - "--name=value" or "--name value"; "_" and "-" are the same in a name
//   (cliflag.WordSepNormalizeFunc); the last --config or --config-dir wins;
//   "--" ends the flags.
// - --feature-gates is "Name=bool,Name=bool", each value as Go's
//   strconv.ParseBool reads it; several of them add up, a later value of a
//   gate winning (cliflag.MapStringBool). On the command line they win over
//   the configuration files' featureGates, gate by gate
//   (kubeletConfigFlagPrecedence), which is why they are read here.

export interface KubeletFlags {
  config?: string;
  configDir?: string;
  /** --feature-gates as given, by gate. */
  featureGates: Record<string, boolean>;
  /** What the kubelet would refuse on this command line (it then does not start). */
  problems: string[];
  /** The index in the arguments of the flag that set each path. */
  at: { config?: number; configDir?: number };
}

const TRUE = new Set(['1', 't', 'T', 'TRUE', 'true', 'True']);
const FALSE = new Set(['0', 'f', 'F', 'FALSE', 'false', 'False']);

/** The flags of `args` (the kubelet's arguments after its program name). */
export function kubeletFlags(args: readonly string[]): KubeletFlags {
  const out: KubeletFlags = { featureGates: {}, problems: [], at: {} };
  for (let i = 0; i < args.length; i++) {
    const arg = args[i]!;
    if (arg === '--') break;
    if (!arg.startsWith('--')) continue;
    const eq = arg.indexOf('=');
    const name = (eq < 0 ? arg.slice(2) : arg.slice(2, eq)).replaceAll('_', '-');
    if (name !== 'config' && name !== 'config-dir' && name !== 'feature-gates') continue;
    const flagAt = i;
    let value: string;
    if (eq >= 0) value = arg.slice(eq + 1);
    else if (i + 1 < args.length) value = args[++i]!;
    else {
      out.problems.push(`--${name} without a value`);
      break;
    }
    if (name === 'config') [out.config, out.at.config] = [value, flagAt];
    else if (name === 'config-dir') [out.configDir, out.at.configDir] = [value, flagAt];
    else addGates(out, value);
  }
  return out;
}

function addGates(out: KubeletFlags, value: string): void {
  for (const pair of value.split(',')) {
    if (pair.trim() === '') continue;
    const eq = pair.indexOf('=');
    const gate = (eq < 0 ? pair : pair.slice(0, eq)).trim();
    const text = eq < 0 ? '' : pair.slice(eq + 1).trim();
    if (TRUE.has(text)) out.featureGates[gate] = true;
    else if (FALSE.has(text)) out.featureGates[gate] = false;
    else out.problems.push(`--feature-gates ${JSON.stringify(pair)}: ${eq < 0 ? 'no "=" (Name=true or Name=false)' : `${JSON.stringify(text)} is not a boolean`}`);
  }
}
