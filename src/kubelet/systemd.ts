// The kubelet's command line as systemd builds it from its unit: the
// [Service] section's Environment=, EnvironmentFile= and ExecStart=, the
// environment files read as systemd reads them, and $VAR / ${VAR} expanded
// in the arguments. Most distributions start the kubelet so, and keep its
// --config and --config-dir there: kubeadm's 10-kubeadm.conf and its
// kubeadm-flags.env and /etc/default/kubelet, EKS nodeadm's
// /etc/eks/kubelet/environment, OpenShift's kubelet.service, AKS's
// /etc/default/kubelet. Sources, systemd v256:
// - src/shared/conf-parser.c config_parse: lines, comments ("#", ";"), a
//   trailing backslash joining the next line (comment lines skipped), the
//   unit and then its drop-ins parsed as one;
// - src/core/load-fragment.c config_parse_environ (each word of
//   Environment= an assignment, an empty value resets the list),
//   config_parse_unit_env_file (EnvironmentFile=, "-" optional, empty
//   resets), config_parse_exec (ExecStart=, its prefixes "-@:+!", empty
//   resets; ":" turns expansion off);
// - src/basic/env-file.c parse_env_file_internal (the environment file's
//   grammar, below in parseEnvironmentFile);
// - src/basic/extract-word.c extract_first_word (the word splitting, with
//   EXTRACT_UNQUOTE | EXTRACT_RELAX, and EXTRACT_CUNESCAPE in unit files);
// - src/basic/env-util.c replace_env_argv ("$FOO" alone as a word is
//   split at whitespace into zero or more words, quotes honoured; "${FOO}"
//   anywhere is replaced by the value as it is; "$$" is "$");
// - src/core/execute.c: variables of the environment files override those
//   of Environment= (systemd.exec(5), EnvironmentFile=).

const WHITESPACE = ' \t\n\r';
const NEWLINE = '\n\r';
const SHELL_NEED_ESCAPE = '"\\`$';
const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * The assignments of an environment file (EnvironmentFile=, /etc/default/*)
 * as systemd's parse_env_file_internal reads them: KEY=VALUE lines,
 * comments from "#" or ";" at a line's start, a value in single quotes
 * taken as it is, in double quotes with \" \\ \` \$ unescaped (another
 * escaped character keeps its backslash), unquoted with a backslash taking
 * the next character (a backslash-newline joins lines) and trailing
 * whitespace dropped; a later assignment wins. A line without "=" is
 * ignored, as is a key that is no variable name.
 */
export function parseEnvironmentFile(text: string): Map<string, string> {
  const out = new Map<string, string>();
  type State = 'preKey' | 'key' | 'preValue' | 'value' | 'valueEscape' | 'single' | 'double' | 'doubleEscape' | 'comment';
  let state: State = 'preKey';
  let key = '';
  let value = '';
  let lastValueWhitespace = -1;
  const push = () => {
    const k = key.trimEnd();
    if (ENV_NAME.test(k)) out.set(k, value);
    key = '';
    value = '';
  };
  for (const c of text) {
    switch (state) {
      case 'preKey':
        if (c === '#' || c === ';') state = 'comment';
        else if (!WHITESPACE.includes(c)) {
          state = 'key';
          key = c;
        }
        break;
      case 'key':
        if (NEWLINE.includes(c)) {
          state = 'preKey';
          key = '';
        } else if (c === '=') {
          state = 'preValue';
          lastValueWhitespace = -1;
        } else key += c;
        break;
      case 'preValue':
        if (NEWLINE.includes(c)) {
          state = 'preKey';
          push();
        } else if (c === "'") state = 'single';
        else if (c === '"') state = 'double';
        else if (c === '\\') state = 'valueEscape';
        else if (!WHITESPACE.includes(c)) {
          state = 'value';
          value += c;
        }
        break;
      case 'value':
        if (NEWLINE.includes(c)) {
          state = 'preKey';
          if (lastValueWhitespace >= 0) value = value.slice(0, lastValueWhitespace);
          push();
        } else if (c === '\\') {
          state = 'valueEscape';
          lastValueWhitespace = -1;
        } else {
          if (!WHITESPACE.includes(c)) lastValueWhitespace = -1;
          else if (lastValueWhitespace < 0) lastValueWhitespace = value.length;
          value += c;
        }
        break;
      case 'valueEscape':
        state = 'value';
        if (!NEWLINE.includes(c)) value += c;
        break;
      case 'single':
        if (c === "'") state = 'preValue';
        else value += c;
        break;
      case 'double':
        if (c === '"') state = 'preValue';
        else if (c === '\\') state = 'doubleEscape';
        else value += c;
        break;
      case 'doubleEscape':
        state = 'double';
        if (SHELL_NEED_ESCAPE.includes(c)) value += c;
        else if (c !== '\n') value += `\\${c}`;
        break;
      case 'comment':
        if (NEWLINE.includes(c)) state = 'preKey';
        break;
    }
  }
  if (state === 'value' && lastValueWhitespace >= 0) value = value.slice(0, lastValueWhitespace);
  if (['preValue', 'value', 'valueEscape', 'single', 'double', 'doubleEscape'].includes(state)) push();
  return out;
}

const C_ESCAPES: Record<string, string> = { n: '\n', t: '\t', r: '\r', a: '\x07', b: '\b', f: '\f', v: '\v', s: ' ' };

/**
 * Words as extract_first_word splits them with EXTRACT_UNQUOTE and
 * EXTRACT_RELAX: at whitespace, single and double quotes anywhere in a
 * word removed (their content taken whole), a backslash taking the next
 * character in and out of quotes; `cUnescape` (unit files) reads \n, \t
 * and the like as C does. An unclosed quote or a trailing backslash ends
 * the last word.
 */
export function splitWords(text: string, cUnescape = false): string[] {
  const words: string[] = [];
  let word: string | undefined;
  let quote: string | undefined;
  let escaped = false;
  for (const c of text) {
    if (escaped) {
      escaped = false;
      word = (word ?? '') + (cUnescape ? (C_ESCAPES[c] ?? c) : c);
    } else if (quote) {
      if (c === quote) quote = undefined;
      else if (c === '\\') escaped = true;
      else word += c;
    } else if (WHITESPACE.includes(c)) {
      if (word !== undefined) words.push(word);
      word = undefined;
    } else if (c === "'" || c === '"') {
      quote = c;
      word ??= '';
    } else if (c === '\\') escaped = true;
    else word = (word ?? '') + c;
  }
  if (word !== undefined) words.push(word);
  return words;
}

/** What a service's unit and drop-ins say about its start. */
export interface ServiceDirectives {
  /** Environment= assignments, a later one winning. */
  environment: Map<string, string>;
  /** EnvironmentFile= paths on the host, in order; optional ones ("-") may be missing. */
  environmentFiles: { path: string; optional: boolean }[];
  /** The last ExecStart=: its arguments after the program; `expand` false with the ":" prefix. */
  execStart?: { args: string[]; expand: boolean };
}

/** The [Service] directives of a unit file followed by its drop-ins (each a file's text, in the order systemd reads them). */
export function serviceDirectives(unitTexts: readonly string[]): ServiceDirectives {
  const out: ServiceDirectives = { environment: new Map(), environmentFiles: [] };
  for (const text of unitTexts) {
    let section = '';
    for (const line of logicalLines(text)) {
      const header = /^\[(.+)\]$/.exec(line);
      if (header) {
        section = header[1]!;
        continue;
      }
      const eq = line.indexOf('=');
      if (section !== 'Service' || eq < 0) continue;
      const name = line.slice(0, eq).trim();
      const value = line.slice(eq + 1).trim();
      if (name === 'Environment') {
        if (value === '') out.environment.clear();
        for (const assignment of splitWords(value, true)) {
          const at = assignment.indexOf('=');
          if (at > 0 && ENV_NAME.test(assignment.slice(0, at))) out.environment.set(assignment.slice(0, at), assignment.slice(at + 1));
        }
      } else if (name === 'EnvironmentFile') {
        if (value === '') out.environmentFiles = [];
        else out.environmentFiles.push(value.startsWith('-') ? { path: value.slice(1), optional: true } : { path: value, optional: false });
      } else if (name === 'ExecStart') {
        if (value === '') {
          delete out.execStart;
          continue;
        }
        const prefix = /^[-@:+!]*/.exec(value)![0];
        const words = splitWords(value.slice(prefix.length).replaceAll('%%', '%'), true);
        out.execStart = { args: words.slice(prefix.includes('@') ? 2 : 1), expand: !prefix.includes(':') };
      }
    }
  }
  return out;
}

/** A unit file's lines as config_parse joins them: comments dropped, a trailing backslash joining the next line with a space. */
function logicalLines(text: string): string[] {
  const out: string[] = [];
  let continued: string | undefined;
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line.startsWith('#') || line.startsWith(';')) continue;
    let backslashes = 0;
    for (let i = line.length - 1; i >= 0 && line[i] === '\\'; i--) backslashes++;
    const joined = continued === undefined ? line : `${continued}${line}`;
    if (backslashes % 2 === 1) continued = `${joined.slice(0, -1)} `;
    else {
      continued = undefined;
      if (joined.trim()) out.push(joined.trim());
    }
  }
  if (continued !== undefined && continued.trim()) out.push(continued.trim());
  return out;
}

/** An argument of the command line, with the variable it came from. */
export interface Argument {
  word: string;
  /** The environment variable the word came from ("$FOO" alone, or the first "${FOO}" in it). */
  variable?: string;
}

/** ExecStart='s arguments with the environment's variables put in, as replace_env_argv does. */
export function expandArguments(args: readonly string[], env: ReadonlyMap<string, string>): Argument[] {
  const out: Argument[] = [];
  for (const arg of args) {
    const whole = /^\$([A-Za-z_][A-Za-z0-9_]*)$/.exec(arg);
    if (whole) {
      out.push(...splitWords(env.get(whole[1]!) ?? '').map((word) => ({ word, variable: whole[1]! })));
      continue;
    }
    let variable: string | undefined;
    const word = arg.replace(/\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}/g, (_m: string, name?: string) => {
      if (name === undefined) return '$';
      variable ??= name;
      return env.get(name) ?? '';
    });
    out.push(variable === undefined ? { word } : { word, variable });
  }
  return out;
}
