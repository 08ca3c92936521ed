// YAML streams of PinnedImageSet documents (the static folder, `pinset
// validate`), parsed as plain data with the line each document starts on.
// A document with a syntax error comes back as an error with its line and
// spoils only itself; empty and null documents are skipped, as kubectl
// skips them.
import { LineCounter, parseAllDocuments } from 'yaml';

export type YamlDocument = { line: number; value: unknown } | { line: number; error: string };

export function parseYamlDocuments(text: string): YamlDocument[] {
  const lineCounter = new LineCounter();
  const out: YamlDocument[] = [];
  for (const doc of parseAllDocuments(text, { lineCounter, prettyErrors: false, uniqueKeys: true })) {
    const start = doc.contents?.range?.[0] ?? doc.range[0];
    const line = lineCounter.linePos(start).line;
    if (doc.errors.length > 0) {
      const e = doc.errors[0]!;
      const at = e.linePos?.[0]?.line ?? lineCounter.linePos(e.pos[0]).line;
      out.push({ line, error: `line ${at}: invalid YAML: ${e.message.split('\n')[0]}` });
      continue;
    }
    const value: unknown = doc.toJS({ maxAliasCount: 100 });
    if (value !== null && value !== undefined) out.push({ line, value });
  }
  return out;
}
