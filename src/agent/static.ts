// Sets from the static folder (--static-dir): YAML files of PinnedImageSet
// documents, for nodes that must pin before (or without) an API server,
// e.g. a bootstrap host. A missing folder means no static sets. A file that
// cannot be read or parsed is reported; its sets are unknown, so the
// planner keeps the current pins rather than drop them.
import * as fsp from 'node:fs/promises';
import * as path from 'node:path';
import { parseYamlDocuments } from '../api/yaml.ts';
import type { ObservedSet, SourceProblem } from './plan.ts';

const SET_FILE = /\.(ya?ml|json)$/i;

export interface StaticRead {
  sets: ObservedSet[];
  problems: SourceProblem[];
  /** Files read, for logs. */
  files: string[];
}

export async function readStaticSets(dir: string): Promise<StaticRead> {
  const out: StaticRead = { sets: [], problems: [], files: [] };
  let names: string[];
  try {
    names = (await fsp.readdir(dir, { withFileTypes: true })).filter((e) => e.isFile() && SET_FILE.test(e.name) && !e.name.startsWith('.')).map((e) => e.name).sort();
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT' || code === 'ENOTDIR') return out;
    out.problems.push({ origin: dir, error: `cannot read the static folder: ${(e as Error).message}` });
    return out;
  }
  for (const name of names) {
    const file = path.join(dir, name);
    out.files.push(file);
    let text: string;
    try {
      text = await fsp.readFile(file, 'utf8');
    } catch (e) {
      out.problems.push({ origin: file, error: `cannot read: ${(e as Error).message}` });
      continue;
    }
    const docs = parseYamlDocuments(text);
    docs.forEach((d, i) => {
      const origin = `${file} (document ${i + 1}, line ${d.line})`;
      if ('error' in d) out.problems.push({ origin, error: d.error });
      else out.sets.push({ source: 'static', object: d.value, origin });
    });
  }
  return out;
}
