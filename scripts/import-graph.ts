// The import graph of src/, held to its layers: every import (static,
// dynamic or type-only) runs from a folder to one on the same layer or
// below, no files import each other in a loop, and within agent/ only the
// composition root (agent/boot/) imports a runtime's folder (crio/,
// containerd/): the rest of the agent reaches the runtime through the pin
// seam (pins/), so it does not know which runtime it pins on. Prints the
// figures and exits 1 when a rule breaks:
//
//   node scripts/import-graph.ts          # circles, upward imports, largest files
//   node scripts/import-graph.ts --json
//
// The layers, lowest first (ARCHITECTURE.md says what each folder owns):
import { readdirSync, readFileSync, statSync } from 'node:fs';
import * as path from 'node:path';

export const LAYERS: readonly (readonly string[])[] = [
  ['util'],
  ['api', 'cri'],
  ['registry', 'metrics', 'rollout', 'kubelet'],
  ['pins'],
  ['crio', 'containerd'],
  ['agent', 'controller'],
  ['cli'],
];

/** The runtimes' folders: within agent/, only the composition root imports them. */
export const RUNTIME_FOLDERS: readonly string[] = ['crio', 'containerd'];
/** The agent's composition root: what a node runs is decided and built there (ARCHITECTURE.md). */
export const COMPOSITION_ROOT = 'agent/boot/';

export interface ImportGraph {
  files: Map<string, { lines: number; imports: string[] }>;
  circles: string[][];
  upward: { from: string; to: string }[];
  /** Imports of a runtime's folder from agent/ outside its composition root. */
  runtimeInAgent: { from: string; to: string }[];
  largest: { file: string; lines: number }[];
}

function walk(dir: string): string[] {
  const out: string[] = [];
  for (const e of readdirSync(dir)) {
    const p = path.join(dir, e);
    if (statSync(p).isDirectory()) out.push(...walk(p));
    else if (p.endsWith('.ts')) out.push(p);
  }
  return out;
}

const IMPORT_RE = /(?:^|\n)\s*(?:import|export)\s[^;]*?from\s+'([^']+)'|import\(\s*'([^']+)'\s*\)/g;

function layerOf(file: string): number {
  const folder = file.split('/')[0]!;
  const i = LAYERS.findIndex((l) => l.includes(folder));
  return i < 0 ? Infinity : i;
}

/** Strongly connected components of more than one file (Tarjan), each sorted. */
function loops(files: Map<string, { imports: string[] }>): string[][] {
  let index = 0;
  const idx = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const on = new Set<string>();
  const out: string[][] = [];
  const visit = (v: string) => {
    idx.set(v, index);
    low.set(v, index++);
    stack.push(v);
    on.add(v);
    for (const w of files.get(v)?.imports ?? []) {
      if (!files.has(w)) continue;
      if (!idx.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (on.has(w)) low.set(v, Math.min(low.get(v)!, idx.get(w)!));
    }
    if (low.get(v) === idx.get(v)) {
      const c: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        on.delete(w);
        c.push(w);
      } while (w !== v);
      if (c.length > 1) out.push(c.sort());
    }
  };
  for (const v of files.keys()) if (!idx.has(v)) visit(v);
  return out;
}

export function importGraph(srcDir: string): ImportGraph {
  const files = new Map<string, { lines: number; imports: string[] }>();
  for (const abs of walk(srcDir)) {
    const text = readFileSync(abs, 'utf8');
    const rel = path.relative(srcDir, abs);
    const imports: string[] = [];
    for (const m of text.matchAll(IMPORT_RE)) {
      const spec = m[1] ?? m[2]!;
      if (!spec.startsWith('.')) continue;
      const target = path.relative(srcDir, path.resolve(path.dirname(abs), spec));
      if (!target.startsWith('..')) imports.push(target);
    }
    files.set(rel, { lines: text.split('\n').length - (text.endsWith('\n') ? 1 : 0), imports });
  }
  const upward: ImportGraph['upward'] = [];
  const runtimeInAgent: ImportGraph['runtimeInAgent'] = [];
  const inAgent = (f: string) => f.startsWith('agent/') && !f.startsWith(COMPOSITION_ROOT);
  for (const [from, f] of files) {
    for (const to of f.imports) {
      if (layerOf(to) > layerOf(from)) upward.push({ from, to });
      if (inAgent(from) && RUNTIME_FOLDERS.includes(to.split('/')[0]!)) runtimeInAgent.push({ from, to });
    }
  }
  const largest = [...files].map(([file, f]) => ({ file, lines: f.lines })).sort((a, b) => b.lines - a.lines);
  return { files, circles: loops(files), upward, runtimeInAgent, largest };
}

if (import.meta.main) {
  const g = importGraph(path.join(import.meta.dirname, '..', 'src'));
  const unlayered = [...new Set([...g.files.keys()].map((f) => f.split('/')[0]!).filter((d) => !d.endsWith('.ts') && !LAYERS.flat().includes(d)))];
  if (process.argv.includes('--json')) {
    process.stdout.write(JSON.stringify({ files: g.files.size, circles: g.circles, upward: g.upward, runtimeInAgent: g.runtimeInAgent, unlayered, largest: g.largest.slice(0, 5) }, null, 2) + '\n');
  } else {
    process.stdout.write(`${g.files.size} files in src/; layers (lowest first): ${LAYERS.map((l) => l.join(' ')).join(' < ')}\n`);
    process.stdout.write(`circles: ${g.circles.length}${g.circles.map((c) => `\n  ${c.join(' <-> ')}`).join('')}\n`);
    process.stdout.write(`imports from a lower folder to a higher one: ${g.upward.length}${g.upward.map((u) => `\n  ${u.from} -> ${u.to}`).join('')}\n`);
    process.stdout.write(
      `imports of ${RUNTIME_FOLDERS.map((r) => `${r}/`).join(' or ')} from agent/ outside ${COMPOSITION_ROOT}: ${g.runtimeInAgent.length}${g.runtimeInAgent.map((u) => `\n  ${u.from} -> ${u.to}`).join('')}\n`,
    );
    if (unlayered.length) process.stdout.write(`folders in no layer: ${unlayered.join(', ')}\n`);
    process.stdout.write(`largest files: ${g.largest.slice(0, 5).map((l) => `${l.file} ${l.lines}`).join(', ')}\n`);
  }
  process.exitCode = g.circles.length || g.upward.length || g.runtimeInAgent.length || unlayered.length ? 1 : 0;
}
