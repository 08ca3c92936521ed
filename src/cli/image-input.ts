// The input of `pinset resolve` and `pinset size`: files of PinnedImageSet
// documents (YAML, images by tag or digest), or plain lists of image
// references, one a line (blank lines and # comments skipped). A file is a
// set file when any line starts a top-level apiVersion or kind key.
import { readFile } from 'node:fs/promises';
import { API_VERSION, KIND } from '../api/types.ts';
import { parseYamlDocuments } from '../api/yaml.ts';
import { UsageError } from '../util/flags.ts';

export interface InputImage {
  /** As written. */
  name: string;
  /** Where it was written, for messages: "sets.yaml: document 2 (set web): spec.pinnedImages[3].name" or "list.txt:7". */
  where: string;
}

export interface InputSet {
  file: string;
  /** The document as parsed (a PinnedImageSet), or null for a plain list. */
  object: Record<string, unknown> | null;
  images: InputImage[];
}

export interface Inputs {
  sets: InputSet[];
  /** Documents that are not usable sets: each a message naming the file and document. */
  problems: string[];
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

export const STDIN_LABEL = '<stdin>';

async function readAll(stream: NodeJS.ReadableStream): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const c of stream) chunks.push(typeof c === 'string' ? Buffer.from(c) : (c as Buffer));
  return Buffer.concat(chunks).toString('utf8');
}

/** Parse one file's text. */
export function parseInput(file: string, text: string): Inputs {
  if (/^(apiVersion|kind)\s*:/m.test(text)) return parseSetFile(file, text);
  const images: InputImage[] = [];
  text.split('\n').forEach((line, i) => {
    const t = line.replace(/#.*$/, '').trim();
    if (t) images.push({ name: t, where: `${file}:${i + 1}` });
  });
  return { sets: [{ file, object: null, images }], problems: images.length ? [] : [`${file}: no image references and no PinnedImageSet documents`] };
}

function parseSetFile(file: string, text: string): Inputs {
  const sets: InputSet[] = [];
  const problems: string[] = [];
  parseYamlDocuments(text).forEach((d, i) => {
    const label = `${file}: document ${i + 1}`;
    if ('error' in d) return void problems.push(`${label}: ${d.error}`);
    const doc = d.value;
    if (!isObject(doc) || doc.apiVersion !== API_VERSION || doc.kind !== KIND) {
      return void problems.push(`${label}: not a ${KIND} (apiVersion ${API_VERSION})`);
    }
    const md = isObject(doc.metadata) ? doc.metadata : {};
    const setLabel = `${label}${typeof md.name === 'string' ? ` (set ${md.name})` : ''}`;
    const list = isObject(doc.spec) ? doc.spec.pinnedImages : undefined;
    if (!Array.isArray(list)) return void problems.push(`${setLabel}: spec.pinnedImages must be a list of {name: <image>}`);
    const images: InputImage[] = [];
    list.forEach((item: unknown, j: number) => {
      const field = `spec.pinnedImages[${j}].name`;
      if (!isObject(item) || typeof item.name !== 'string') problems.push(`${setLabel}: ${field}: required, a string`);
      else images.push({ name: item.name, where: `${setLabel}: ${field}` });
    });
    sets.push({ file, object: doc, images });
  });
  if (sets.length === 0 && problems.length === 0) problems.push(`${file}: no documents`);
  return { sets, problems };
}

/** Read every FILE ("-" is standard input). An unreadable file is a usage error, reported before any work. */
export async function readInputs(files: readonly string[], stdin: NodeJS.ReadableStream, usage: string): Promise<Inputs> {
  if (files.length === 0) throw new UsageError(`no files given\nusage: ${usage}`);
  if (files.filter((f) => f === '-').length > 1) throw new UsageError('"-" (standard input) given more than once');
  const out: Inputs = { sets: [], problems: [] };
  for (const file of files) {
    let text: string;
    if (file === '-') text = await readAll(stdin);
    else {
      try {
        text = await readFile(file, 'utf8');
      } catch (e) {
        const code = (e as NodeJS.ErrnoException).code;
        const why = code === 'ENOENT' ? 'no such file' : code === 'EISDIR' ? 'is a folder; pass the files in it' : code === 'EACCES' ? 'permission denied' : (e as Error).message;
        throw new UsageError(`cannot read ${file}: ${why}`);
      }
    }
    const parsed = parseInput(file === '-' ? STDIN_LABEL : file, text);
    out.sets.push(...parsed.sets);
    out.problems.push(...parsed.problems);
  }
  return out;
}
