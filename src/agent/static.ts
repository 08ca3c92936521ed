// Sets from the static folder (--static-dir): YAML files of PinnedImageSet
// documents, for nodes that must pin before (or without) an API server,
// e.g. a bootstrap host, or a ConfigMap mounted into the agent's pod.
//
// The folder as Kubernetes and people fill it:
// - A ConfigMap or Secret volume holds each key as a symbolic link
//   (`sets.yaml -> ..data/sets.yaml`, `..data -> ..2026_11_24_...`), which
//   the kubelet swaps atomically on an update. Files reached through links
//   are read. Names starting with "." are skipped: the kubelet's own `..`
//   entries, and hidden files (editor swap files, partial copies).
// - Only names ending in .yaml, .yml or .json are set files.
// - A set file that stops being a readable regular file (its link target
//   gone, a link loop, a folder in its place, permission denied, an I/O
//   error, a YAML problem of any kind, too large) keeps the sets of its last
//   readable content, and is reported, until it is readable again or its
//   name is gone from the folder. Only a name removed from the folder
//   removes its sets: "faults never unpin". So this source remembers what
//   each file last contributed. A file that has been unreadable since the
//   agent started has no such memory: its sets are unknown, and the planner
//   keeps every current pin instead.
// - One file's problem never touches another file's sets.
import * as fsp from 'node:fs/promises';
import * as path from 'node:path';
import type { Logger } from 'pino';
import type { parseYamlDocuments } from '../api/yaml.ts';
import { readRegularFileBytes, ReadRefusedError } from '../util/regular-file.ts';
import type { ObservedSet, SourceProblem } from './plan.ts';

const SET_FILE = /\.(ya?ml|json)$/i;

/**
 * Largest set file read. A ConfigMap holds at most 1 MiB in all, and a set
 * of 500 references (the API's limit) is about 60 KiB of YAML; a larger file
 * is a mistake, and is refused before it is parsed.
 */
export const STATIC_FILE_MAX_BYTES = 1024 * 1024;

export interface StaticFileProblem {
  /** The file's path (or the folder's, when the folder itself cannot be read). */
  file: string;
  error: string;
  /** Names of the sets kept from the file's last readable content; null when that content is unknown. */
  held: string[] | null;
}

export interface StaticRead {
  /** Sets read now, and sets held from files that are unreadable now (marked `held`). */
  sets: ObservedSet[];
  /** Every file that could not be read as sets, for logs and status. */
  problems: StaticFileProblem[];
  /** Files (or the folder) whose sets are unknown: the planner keeps the current pins for them. */
  unknown: SourceProblem[];
  /** Set files found, read or not. */
  files: string[];
}

type ParseResult = { sets: ObservedSet[] } | { error: string };

interface FileState {
  /** Sets from the file's last readable content; undefined when it has not been readable since the agent started. */
  good?: ObservedSet[];
  /** The problem reported now ('' when readable): a log line is written when it changes. */
  problem: string;
}

function codeOf(e: unknown): string | undefined {
  return (e as NodeJS.ErrnoException | null)?.code;
}

function describeError(e: unknown): string {
  const code = codeOf(e);
  switch (code) {
    case 'ELOOP':
      return 'a loop of symbolic links (ELOOP)';
    case 'EACCES':
    case 'EPERM':
      return `permission denied (${code})`;
    case 'EIO':
      return 'an I/O error (EIO)';
    default:
      return (e instanceof Error ? e.message : String(e)).split('\n')[0]!.slice(0, 300);
  }
}

/** Why the bounded reader (../util/regular-file.ts) refused a set file, said as the set's status says it. */
function describeRefusal(e: ReadRefusedError): string {
  switch (e.code) {
    case 'EISDIR':
      return 'it is a folder, not a file';
    case 'EFTYPE':
      return 'it is not a regular file';
    case 'EFBIG':
      return e.size === undefined ? `it is more than the ${STATIC_FILE_MAX_BYTES}-byte limit for a set file` : `it is ${e.size} bytes, more than the ${STATIC_FILE_MAX_BYTES}-byte limit for a set file`;
  }
}

/**
 * The file's text, or why it cannot be read; 'gone' when its name is no
 * longer in the folder. Read bounded, and only as a regular file: a FIFO in
 * the folder is refused at once, never waited on.
 */
async function readSetFile(file: string): Promise<{ text: string } | { error: string } | 'gone'> {
  let bytes: Buffer;
  try {
    bytes = await readRegularFileBytes(file, { maxBytes: STATIC_FILE_MAX_BYTES });
  } catch (e) {
    if (e instanceof ReadRefusedError) return { error: describeRefusal(e) };
    if (codeOf(e) !== 'ENOENT') return { error: describeError(e) };
    // Gone, or a symbolic link whose target is gone (a ConfigMap key removed
    // while its link stays, a link to an unmounted path).
    const st = await fsp.lstat(file).catch(() => null);
    if (!st) return 'gone';
    if (st.isSymbolicLink()) {
      const target = await fsp.readlink(file).catch(() => '?');
      return { error: `its symbolic link points to ${target}, which does not exist` };
    }
    return { error: describeError(e) };
  }
  try {
    return { text: new TextDecoder('utf-8', { fatal: true }).decode(bytes) };
  } catch {
    return { error: 'it is not UTF-8 text' };
  }
}

type YamlReader = typeof parseYamlDocuments;
let yamlReader: YamlReader | undefined;

/** The YAML parser, loaded when the first set file is parsed: a node with no static sets never loads it. */
async function loadYamlReader(): Promise<YamlReader> {
  return (yamlReader ??= (await import('../api/yaml.ts')).parseYamlDocuments);
}

/** Every document of a file, or the file's first problem: a file is applied whole or not at all. */
function parseSetFile(file: string, text: string, parseYaml: YamlReader): ParseResult {
  const sets: ObservedSet[] = [];
  const docs = parseYaml(text);
  for (const [i, d] of docs.entries()) {
    if ('error' in d) return { error: `document ${i + 1}: ${d.error}` };
    sets.push({ source: 'static', object: d.value, origin: `${file} (document ${i + 1}, line ${d.line})` });
  }
  return { sets };
}

function setNames(sets: readonly ObservedSet[]): string[] {
  return sets.map((s) => {
    const name = (s.object as { metadata?: { name?: unknown } } | null)?.metadata?.name;
    return typeof name === 'string' && name ? name : '(unnamed)';
  });
}

/** The static folder, read once per reconcile, remembering what each file last contributed. */
export class StaticSource {
  readonly dir: string;
  private readonly log: Logger | undefined;
  private readonly files = new Map<string, FileState>();
  /** The folder has been listed at least once: every file in it then is remembered. */
  private listedOnce = false;
  private folderProblem = '';
  /** Each file's text last parsed (by read or peek) and what it gave: identical text is not parsed again. */
  private readonly parsed = new Map<string, { text: string; result: ParseResult }>();

  constructor(dir: string, logger?: Logger) {
    this.dir = dir;
    this.log = logger;
  }

  private async parse(name: string, text: string): Promise<ParseResult> {
    const last = this.parsed.get(name);
    if (last?.text === text) return last.result;
    const result = parseSetFile(path.join(this.dir, name), text, await loadYamlReader());
    this.parsed.set(name, { text, result });
    return result;
  }

  private async list(): Promise<string[]> {
    return (await fsp.readdir(this.dir)).filter((n) => !n.startsWith('.') && SET_FILE.test(n)).sort();
  }

  /**
   * The sets the folder's readable files hold now, for a look ahead while a
   * change settles (./lookahead.ts): read and parsed as read() does (which
   * then finds the parse made), but nothing remembered, held or logged.
   */
  async peek(): Promise<ObservedSet[]> {
    const sets: ObservedSet[] = [];
    for (const name of await this.list().catch(() => [])) {
      const raw = await readSetFile(path.join(this.dir, name));
      if (raw === 'gone' || 'error' in raw) continue;
      const result = await this.parse(name, raw.text);
      if ('sets' in result) sets.push(...result.sets);
    }
    return sets;
  }

  async read(): Promise<StaticRead> {
    const out: StaticRead = { sets: [], problems: [], unknown: [], files: [] };
    let names: string[];
    try {
      names = await this.list();
    } catch (e) {
      const code = codeOf(e);
      if (code === 'ENOENT') {
        // No folder: no static sets (every file's name is gone).
        names = [];
      } else {
        return this.folderUnreadable(out, `cannot read the static folder: ${describeError(e)}`);
      }
    }
    if (this.folderProblem) {
      this.log?.info({ dir: this.dir }, 'static folder readable again');
      this.folderProblem = '';
    }
    this.listedOnce = true;

    const listed = new Set(names);
    for (const name of this.parsed.keys()) if (!listed.has(name)) this.parsed.delete(name);
    for (const [name, st] of this.files) {
      if (listed.has(name)) continue;
      this.files.delete(name);
      if (st.good?.length) this.log?.info({ file: path.join(this.dir, name), sets: setNames(st.good) }, 'static set file removed from the folder; its sets no longer apply');
    }
    for (const name of names) {
      const file = path.join(this.dir, name);
      const raw = await readSetFile(file);
      if (raw === 'gone') {
        this.files.delete(name);
        this.parsed.delete(name);
        continue;
      }
      out.files.push(file);
      const st = this.files.get(name) ?? { problem: '' };
      this.files.set(name, st);
      const result: ParseResult = 'error' in raw ? raw : await this.parse(name, raw.text);
      if ('sets' in result) {
        if (st.problem) this.log?.info({ file, sets: setNames(result.sets) }, 'static set file readable again');
        st.problem = '';
        st.good = result.sets;
        out.sets.push(...result.sets);
      } else {
        this.hold(out, file, st, result.error);
      }
    }
    return out;
  }

  /** A file that cannot be read now: its last readable sets stay, marked as held. */
  private hold(out: StaticRead, file: string, st: FileState, error: string): void {
    const held = st.good ? setNames(st.good) : null;
    out.problems.push({ file, error, held });
    if (st.good) out.sets.push(...st.good.map((s) => ({ ...s, held: { file, error } })));
    else out.unknown.push({ origin: file, error });
    if (st.problem !== error) {
      st.problem = error;
      if (held) this.log?.warn({ file, err: error, heldSets: held }, 'static set file unreadable; keeping the pins of its last readable content until it is readable again or removed');
      else this.log?.warn({ file, err: error }, 'static set file unreadable since the agent started; its sets are unknown, so the current pins are kept');
    }
  }

  private folderUnreadable(out: StaticRead, error: string): StaticRead {
    if (this.folderProblem !== error) {
      this.folderProblem = error;
      this.log?.warn({ dir: this.dir, err: error }, 'static folder unreadable; keeping the pins of the files last read from it');
    }
    for (const [name, st] of this.files) {
      const file = path.join(this.dir, name);
      out.files.push(file);
      this.hold(out, file, st, error);
    }
    // Files never read (nothing listed yet) are unknown.
    if (!this.listedOnce) out.unknown.push({ origin: this.dir, error });
    return out;
  }
}
