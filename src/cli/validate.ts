// `pinset validate FILE...`: offline check of PinnedImageSet YAML with the
// rules the CRD and the agent apply (src/api/validate.ts). Exit 0 when every
// document is valid, 1 when any is not (a YAML syntax error makes its
// document invalid), 2 on a usage error such as an unreadable file.
import { readFile } from 'node:fs/promises';
import { clientSideApplyWarning } from '../api/apply-size.ts';
import { describeProblems, validateSet } from '../api/validate.ts';
import { parseYamlDocuments } from '../api/yaml.ts';
import { helpText, parseFlags, UsageError, type FlagSpec } from '../util/flags.ts';

const FLAGS: readonly FlagSpec[] = [
  { name: 'output', type: 'string', choices: ['text', 'json'], default: 'text', help: 'report format', short: 'o' },
];

const USAGE = 'pinset validate [-o text|json] FILE... ("-" reads standard input)';
const SUMMARY =
  'Checks every PinnedImageSet document in the files, offline, with the same rules as the CRD and the agent.\n' +
  'Prints one line per problem, naming the file, the document and the field, and a warning for a set\n' +
  'too large for client-side "kubectl apply" (use "kubectl apply --server-side").\n' +
  'Exit status: 0 all valid, 1 a document is invalid, 2 usage error.';

const STDIN_LABEL = '<stdin>';

export interface DocumentReport {
  /** 1-based position among the file's non-empty documents. */
  document: number;
  /** 1-based line of the file where the document starts. */
  line: number;
  name: string | null;
  valid: boolean;
  /** "field: message", one per problem (the same text as the human report). */
  problems: string[];
  /** Things that do not make the document invalid but will bite, e.g. too large for client-side apply. */
  warnings: string[];
}

export interface FileReport {
  file: string;
  valid: boolean;
  documents: DocumentReport[];
}

export interface Report {
  valid: boolean;
  files: FileReport[];
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Validate every document of one file's text. */
export function validateText(file: string, text: string): FileReport {
  const documents: DocumentReport[] = parseYamlDocuments(text).map((d, i) => {
    if ('error' in d) return { document: i + 1, line: d.line, name: null, valid: false, problems: [d.error], warnings: [] };
    const md = isObject(d.value) ? d.value.metadata : undefined;
    const name = isObject(md) && typeof md.name === 'string' && md.name !== '' ? md.name : null;
    const problems = describeProblems(validateSet(d.value));
    const warning = clientSideApplyWarning(d.value);
    return { document: i + 1, line: d.line, name, valid: problems.length === 0, problems, warnings: warning ? [warning] : [] };
  });
  return { file, valid: documents.length > 0 && documents.every((d) => d.valid), documents };
}

/** Human report: one line per problem, then one summary line per file. */
export function formatText(report: Report): string {
  const out: string[] = [];
  for (const f of report.files) {
    if (f.documents.length === 0) {
      out.push(`${f.file}: no documents: expected at least one PinnedImageSet`);
      continue;
    }
    for (const d of f.documents) {
      const label = `${f.file}: document ${d.document}${d.name !== null ? ` (name ${printable(d.name)})` : ''}`;
      for (const p of d.problems) out.push(`${label}: ${p}`);
      for (const w of d.warnings) out.push(`${label}: warning: ${w}`);
    }
    const bad = f.documents.filter((d) => !d.valid).length;
    out.push(bad === 0 ? `${f.file}: ${f.documents.length} document(s) valid` : `${f.file}: ${bad} of ${f.documents.length} document(s) invalid`);
  }
  return out.join('\n') + '\n';
}

/** A name as typed, unless it holds characters that would break the line. */
function printable(s: string): string {
  return /^[\x21-\x7e]+$/.test(s) && s.length <= 253 ? s : JSON.stringify(s.length > 120 ? s.slice(0, 120) + '…' : s);
}

async function readAll(stream: NodeJS.ReadableStream): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const c of stream) chunks.push(typeof c === 'string' ? Buffer.from(c) : (c as Buffer));
  return Buffer.concat(chunks).toString('utf8');
}

function describeReadError(file: string, err: unknown): string {
  const code = (err as NodeJS.ErrnoException).code;
  const why =
    code === 'ENOENT' ? 'no such file' :
    code === 'EISDIR' ? 'is a folder; pass the files in it (e.g. dir/*.yaml)' :
    code === 'EACCES' ? 'permission denied' :
    (err as Error).message;
  return `cannot read ${file}: ${why}`;
}

export interface ValidateIO {
  stdin: NodeJS.ReadableStream;
  stdout: NodeJS.WritableStream;
}

/** The command's flags, for its --help and the reference (docs/reference.md; a test holds the two together). */
export const flags = FLAGS;

export async function run(argv: string[], io: ValidateIO = { stdin: process.stdin, stdout: process.stdout }): Promise<number> {
  const { values, positional } = parseFlags(FLAGS, argv);
  if (values.help) {
    io.stdout.write(helpText(USAGE, SUMMARY, FLAGS));
    return 0;
  }
  if (positional.length === 0) throw new UsageError(`no files given\nusage: ${USAGE}`);
  if (positional.filter((f) => f === '-').length > 1) throw new UsageError('"-" (standard input) given more than once');

  // Read everything first: an unreadable file is a usage error, reported
  // before any verdict.
  const inputs: { file: string; text: string }[] = [];
  for (const file of positional) {
    if (file === '-') {
      inputs.push({ file: STDIN_LABEL, text: await readAll(io.stdin) });
      continue;
    }
    try {
      inputs.push({ file, text: await readFile(file, 'utf8') });
    } catch (err) {
      throw new UsageError(describeReadError(file, err));
    }
  }

  const files = inputs.map((i) => validateText(i.file, i.text));
  const report: Report = { valid: files.every((f) => f.valid), files };
  io.stdout.write(values.output === 'json' ? JSON.stringify(report, null, 2) + '\n' : formatText(report));
  return report.valid ? 0 : 1;
}
