// YAML streams of PinnedImageSet documents (the static folder, `pinset
// validate`), parsed as plain data with the line each document starts on.
// A document with any problem (syntax, an unresolved alias, an alias bomb,
// nesting too deep) comes back as an error with its line and spoils only
// itself; nothing the parser throws escapes. Empty and null documents are
// skipped, as kubectl skips them.
import { LineCounter, isCollection, isPair, parseAllDocuments, type Document } from 'yaml';

export type YamlDocument = { line: number; value: unknown } | { line: number; error: string };

/**
 * Aliases one document may expand, weighted by the size of what they
 * repeat (the `yaml` package's own measure). A set never needs aliases; a
 * few are harmless; a "billion laughs" document needs thousands and is
 * refused before it is expanded.
 */
export const YAML_MAX_ALIAS_COUNT = 100;

/**
 * Collections nested in collections: a PinnedImageSet needs 6 levels
 * (spec.nodeSelector.matchExpressions[].values[]). Anything much deeper is
 * not a set, and the parser and converter recurse once per level, so a
 * limit keeps a hostile file from exhausting the stack.
 */
export const YAML_MAX_DEPTH = 64;

/** Depth of the deepest collection, walked without recursion. Aliases are not followed (YAML_MAX_ALIAS_COUNT bounds them). */
function nestingDepth(doc: Document.Parsed): number {
  let max = 0;
  const stack: { node: unknown; depth: number }[] = [{ node: doc.contents, depth: 0 }];
  while (stack.length > 0) {
    const { node, depth } = stack.pop()!;
    if (isPair(node)) {
      stack.push({ node: node.key, depth }, { node: node.value, depth });
    } else if (isCollection(node)) {
      max = Math.max(max, depth + 1);
      if (max > YAML_MAX_DEPTH) return max;
      for (const item of node.items) stack.push({ node: item, depth: depth + 1 });
    }
  }
  return max;
}

function firstLine(e: unknown): string {
  return (e instanceof Error ? e.message : String(e)).split('\n')[0]!.slice(0, 300);
}

export function parseYamlDocuments(text: string): YamlDocument[] {
  const lineCounter = new LineCounter();
  const out: YamlDocument[] = [];
  let docs: Document.Parsed[];
  try {
    docs = parseAllDocuments(text, { lineCounter, prettyErrors: false, uniqueKeys: true }) as Document.Parsed[];
  } catch (e) {
    return [{ line: 1, error: `line 1: invalid YAML: ${firstLine(e)}` }];
  }
  for (const doc of docs) {
    const start = doc.contents?.range?.[0] ?? doc.range[0];
    const line = lineCounter.linePos(start).line;
    if (doc.errors.length > 0) {
      const e = doc.errors[0]!;
      const at = e.linePos?.[0]?.line ?? lineCounter.linePos(e.pos[0]).line;
      out.push({ line, error: `line ${at}: invalid YAML: ${firstLine(e)}` });
      continue;
    }
    if (nestingDepth(doc) > YAML_MAX_DEPTH) {
      out.push({ line, error: `line ${line}: invalid YAML: nested more than ${YAML_MAX_DEPTH} levels deep` });
      continue;
    }
    let value: unknown;
    try {
      // An unresolved alias and an alias bomb both throw here (ReferenceError).
      value = doc.toJS({ maxAliasCount: YAML_MAX_ALIAS_COUNT });
    } catch (e) {
      out.push({ line, error: `line ${line}: invalid YAML: ${firstLine(e)}` });
      continue;
    }
    if (value !== null && value !== undefined) out.push({ line, value });
  }
  return out;
}
