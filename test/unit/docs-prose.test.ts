// The docs' prose, where a machine can hold it to the repository (the
// reference's tables are test/unit/reference-drift.test.ts's):
//  - every section of BENCHMARKS.md cited by number ("BENCHMARKS.md,
//    section 15") or by title exists, and a numbered one is about what the
//    citing sentence says: its heading shares a word with the sentence;
//  - every deploy/ path and examples/ file the docs name exists;
//  - every link between the pages goes to a page and a heading that exist;
//  - what `kubectl explain` and npm show of pinset (the CRD's and the
//    package's descriptions) name both runtimes it pins on.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { parse } from 'yaml';

const ROOT = path.resolve(import.meta.dirname, '../..');
const read = (rel: string) => readFileSync(path.join(ROOT, rel), 'utf8');

/** Files under `dir` (relative to the root) whose names match. */
function filesUnder(dir: string, re: RegExp): string[] {
  const out: string[] = [];
  const walk = (rel: string) => {
    for (const e of readdirSync(path.join(ROOT, rel), { withFileTypes: true })) {
      const p = path.posix.join(rel, e.name);
      if (e.isDirectory()) walk(p);
      else if (re.test(e.name)) out.push(p);
    }
  };
  walk(dir);
  return out.sort();
}

/** The pages people read. */
const PAGES = ['README.md', 'ARCHITECTURE.md', ...filesUnder('docs', /\.md$/)];
/** Where BENCHMARKS.md is cited: the pages, the manifests' comments, the code's comments. */
const CITING = [...PAGES, ...filesUnder('deploy', /\.(ya?ml|service)$/), ...filesUnder('src', /\.ts$/)];

/** A file's text as prose: comment markers and markdown list markers dropped, lines joined. */
function prose(rel: string): string {
  return read(rel)
    .split('\n')
    .map((l) => l.replace(/^\s*(?:\/\/+|\/\*\*?|\*\/?|#(?!#)|[-*]\s|\d+\.\s)?\s*/, ''))
    .join(' ');
}

/** The sentence around [start, end): from the previous sentence's end to the next one's. */
function sentenceAround(text: string, start: number, end: number): string {
  const before = text.slice(0, start);
  const from = Math.max(before.lastIndexOf('. '), before.lastIndexOf(': '), before.lastIndexOf('; '), before.lastIndexOf('  ')) + 1;
  const after = text.slice(end).search(/\.\s|;\s|$/);
  return text.slice(from, end + after);
}

// Words that say nothing about a section's subject.
const STOP = new Set(['about', 'after', 'agent', 'also', 'before', 'benchmarks', 'each', 'every', 'from', 'into', 'more', 'most', 'only', 'other', 'pinset', 'section', 'than', 'that', 'their', 'them', 'then', 'there', 'they', 'this', 'what', 'when', 'which', 'with']);

/** A text's words of four letters or more, each by its first four (so "pull" and "pulls", "upgrade" and "upgrading" meet). */
function keys(text: string): Set<string> {
  return new Set((text.toLowerCase().match(/[a-z]{4,}/g) ?? []).filter((w) => !STOP.has(w)).map((w) => w.slice(0, 4)));
}

/** BENCHMARKS.md's sections: number to heading ("## 15. What a pull waits on its credentials"), and every heading's text. */
function benchmarkSections(): { numbered: Map<number, string>; headings: string[] } {
  const numbered = new Map<number, string>();
  const headings: string[] = [];
  for (const line of read('BENCHMARKS.md').split('\n')) {
    const h = /^#{2,6} (.*)$/.exec(line);
    if (!h) continue;
    const n = /^(\d+)\. (.*)$/.exec(h[1]!);
    if (n && line.startsWith('## ')) numbered.set(Number(n[1]), n[2]!);
    headings.push(n ? n[2]! : h[1]!);
  }
  return { numbered, headings };
}

/** GitHub's anchor for a heading: lower case, punctuation but "-" and "_" dropped, spaces to "-". */
const anchorOf = (heading: string) =>
  heading
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N}\s_-]/gu, '')
    .replace(/\s/g, '-');

function anchorsOf(rel: string): Set<string> {
  const out = new Set<string>();
  let fenced = false;
  for (const line of read(rel).split('\n')) {
    if (line.startsWith('```')) fenced = !fenced;
    const h = !fenced && /^#{1,6} (.*)$/.exec(line);
    if (h) out.add(anchorOf(h[1]!));
  }
  return out;
}

describe('the docs cite BENCHMARKS.md truly', () => {
  const { numbered, headings } = benchmarkSections();

  test('BENCHMARKS.md has numbered sections (what the citations below are checked against)', () => {
    assert.ok(numbered.size >= 10, `${numbered.size} numbered sections`);
    assert.equal(numbered.get(15), 'What a pull waits on its credentials');
  });

  test('a section cited by number exists; cited by a page, its heading shares a word with the citing sentence', () => {
    // The manifests' and the code's comments may cite a figure from deep in
    // a section: for them, the section's existence only.
    const problems: string[] = [];
    let cited = 0;
    for (const rel of CITING) {
      const text = prose(rel);
      for (const m of text.matchAll(/BENCHMARKS\.md,?\s+\(?section\s+(\d+)/g)) {
        cited++;
        const n = Number(m[1]);
        const heading = numbered.get(n);
        if (!heading) {
          problems.push(`${rel}: BENCHMARKS.md has no section ${n}`);
          continue;
        }
        if (!PAGES.includes(rel)) continue;
        const sentence = sentenceAround(text, m.index, m.index + m[0].length);
        const shared = [...keys(heading)].filter((k) => keys(sentence).has(k));
        if (shared.length === 0) problems.push(`${rel}: "${sentence.trim()}" cites section ${n}, "${heading}", which is about something else`);
      }
    }
    assert.ok(cited >= 6, `found ${cited} citations by number`);
    assert.deepEqual(problems, []);
  });

  test('the check catches a citation of the wrong section', () => {
    const sentence = 'A cached answer costs a pull about 17 µs (BENCHMARKS.md, section 14).';
    assert.equal([...keys(numbered.get(14)!)].filter((k) => keys(sentence).has(k)).length, 0, 'section 14 is about the upgrade hand-over');
    assert.ok([...keys(numbered.get(15)!)].some((k) => keys(sentence).has(k)), 'section 15 is about what a pull waits on');
  });

  test('a section cited by its title ("Scale: 5000 Nodes") or a word of one (footprint, memory) exists', () => {
    const problems: string[] = [];
    for (const rel of CITING) {
      const text = prose(rel);
      for (const m of text.matchAll(/BENCHMARKS\.md,\s+"([^"]+)"/g)) {
        if (!headings.some((h) => h.toLowerCase() === m[1]!.toLowerCase())) problems.push(`${rel}: BENCHMARKS.md has no section "${m[1]}"`);
      }
      for (const m of text.matchAll(/BENCHMARKS\.md,?\s+\(?([a-z]+)[),.]/g)) {
        if (m[1] === 'section') continue;
        if (!headings.some((h) => new RegExp(`\\b${m[1]}\\b`, 'i').test(h))) problems.push(`${rel}: no heading of BENCHMARKS.md is about "${m[1]}"`);
      }
    }
    assert.deepEqual(problems, []);
  });
});

describe('the docs name what the repository has', () => {
  test('every deploy/ path the docs name exists (a <placeholder> stands for any entry of its folder)', () => {
    const problems: string[] = [];
    let named = 0;
    for (const rel of PAGES) {
      for (const m of read(rel).matchAll(/(?<![\w-])deploy\/[\w.\/<>-]*/g)) {
        named++;
        const p = m[0].replace(/[.,:]+$/, '');
        const [fixed] = p.split(/\/<[^>]*>/);
        const target = path.join(ROOT, fixed!);
        if (!existsSync(target)) problems.push(`${rel}: ${p} does not exist`);
        else if (fixed !== p && (!statSync(target).isDirectory() || readdirSync(target).length === 0)) problems.push(`${rel}: ${p}: ${fixed} holds nothing`);
      }
    }
    assert.ok(named >= 30, `found ${named} deploy/ paths`);
    assert.deepEqual(problems, []);
  });

  test('every examples/ file the docs name exists', () => {
    const problems: string[] = [];
    for (const rel of PAGES) {
      for (const m of read(rel).matchAll(/(?<![\w-])examples\/[\w.-]+\.(?:ya?ml|ts)/g)) if (!existsSync(path.join(ROOT, m[0]))) problems.push(`${rel}: ${m[0]} does not exist`);
    }
    assert.deepEqual(problems, []);
  });

  test('every link between the pages goes to a page, and a heading, that exist', () => {
    const problems: string[] = [];
    for (const rel of PAGES) {
      const text = read(rel).replace(/```[\s\S]*?```/g, '');
      for (const m of text.matchAll(/\]\(([^)\s]+)\)/g)) {
        const link = m[1]!;
        if (/^[a-z]+:/.test(link)) continue;
        const [file, anchor] = link.split('#') as [string, string | undefined];
        const target = file ? path.posix.normalize(path.posix.join(path.posix.dirname(rel), file)) : rel;
        if (!existsSync(path.join(ROOT, target))) {
          problems.push(`${rel}: ${link}: no ${target}`);
          continue;
        }
        if (anchor !== undefined && target.endsWith('.md') && !anchorsOf(target).has(anchor)) problems.push(`${rel}: ${link}: ${target} has no heading #${anchor}`);
      }
    }
    assert.deepEqual(problems, []);
  });
});

describe('what kubectl and npm show of pinset', () => {
  test('the CRD\'s description (kubectl explain pinnedimageset) and the package\'s name both runtimes', () => {
    const crd = parse(read('deploy/crds/pinset.dev_pinnedimagesets.yaml')) as { spec: { versions: { schema: { openAPIV3Schema: { description: string } } }[] } };
    const pkg = JSON.parse(read('package.json')) as { description: string };
    for (const [what, text] of [['the CRD', crd.spec.versions[0]!.schema.openAPIV3Schema.description], ['package.json', pkg.description]] as const) {
      assert.match(text, /CRI-O/, what);
      assert.match(text, /containerd/, what);
    }
  });
});
