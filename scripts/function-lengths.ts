// How long the functions of src/ are: every function, method, constructor,
// accessor and arrow function with a body, from the line its declaration
// starts on to the line its body ends on (a function nested in another
// counts in both). Parsed with TypeScript's own parser, so a brace in a
// string or a comment counts for nothing.
//
//   node scripts/function-lengths.ts src/agent/boot      # longest first
//   node scripts/function-lengths.ts src/agent/boot --over 40
//   node scripts/function-lengths.ts src/agent --json
import { readdirSync, readFileSync, statSync } from 'node:fs';
import * as path from 'node:path';
import ts from 'typescript';

export interface FunctionLength {
  file: string;
  name: string;
  line: number;
  lines: number;
}

function files(p: string): string[] {
  if (!statSync(p).isDirectory()) return p.endsWith('.ts') ? [p] : [];
  return readdirSync(p).flatMap((e) => files(path.join(p, e)));
}

function nameOf(node: ts.Node, sf: ts.SourceFile): string {
  const named = node as ts.Node & { name?: ts.Node };
  if (named.name) return named.name.getText(sf);
  if (ts.isConstructorDeclaration(node)) return 'constructor';
  const parent = node.parent;
  if (parent && (ts.isVariableDeclaration(parent) || ts.isPropertyAssignment(parent) || ts.isPropertyDeclaration(parent))) return parent.name.getText(sf);
  return '(anonymous)';
}

/** The functions with a body in `file` (relative to `root` in the result), longest first. */
export function functionLengths(root: string, file: string): FunctionLength[] {
  const sf = ts.createSourceFile(file, readFileSync(file, 'utf8'), ts.ScriptTarget.Latest, true);
  const out: FunctionLength[] = [];
  const visit = (node: ts.Node) => {
    if (ts.isFunctionLike(node) && (node as ts.FunctionLikeDeclaration).body) {
      // A declaration's first line is where its name is, not its doc comment.
      const start = sf.getLineAndCharacterOfPosition(node.getStart(sf)).line;
      const end = sf.getLineAndCharacterOfPosition(node.getEnd()).line;
      out.push({ file: path.relative(root, file), name: nameOf(node, sf), line: start + 1, lines: end - start + 1 });
    }
    ts.forEachChild(node, visit);
  };
  visit(sf);
  return out;
}

/** Every function under `dir` (a folder or a file), longest first. */
export function lengthsUnder(dir: string, root = process.cwd()): FunctionLength[] {
  return files(dir)
    .flatMap((f) => functionLengths(root, f))
    .sort((a, b) => b.lines - a.lines || a.file.localeCompare(b.file) || a.line - b.line);
}

if (import.meta.main) {
  const args = process.argv.slice(2);
  const overAt = args.indexOf('--over');
  const over = overAt >= 0 ? Number(args[overAt + 1]) : undefined;
  const dirs = args.filter((a, i) => !a.startsWith('--') && (overAt < 0 || i !== overAt + 1));
  const all = dirs.flatMap((d) => lengthsUnder(d)).sort((a, b) => b.lines - a.lines);
  const shown = over === undefined ? all.slice(0, 15) : all.filter((f) => f.lines > over);
  const text = args.includes('--json')
    ? JSON.stringify(shown, null, 2)
    : [`${all.length} functions in ${dirs.join(', ')}; ${over === undefined ? 'the longest' : `over ${over} lines: ${shown.length}`}`, ...shown.map((f) => `${String(f.lines).padStart(4)}  ${f.file}:${f.line}  ${f.name}`)].join('\n');
  process.stdout.write(`${text}\n`);
  process.exitCode = over !== undefined && shown.length > 0 ? 1 : 0;
}
