// The reference cannot drift from the code: every flag of every command
// (each command's own flag table, src/cli/main.ts `commands`), every
// status reason (src/api/reasons.ts SET_REASONS), every metric (the
// agent's and the controller's registries), every key of the per-node
// status document (src/api/node-status.ts) and every Event reason
// (src/agent/node-sinks.ts) is in the docs, and the docs name nothing the
// code does not have. Each command's --help has a usage line naming every
// one of its flags. The code side comes from the code's own tables, so a
// flag, reason, metric, key or Event added there needs only its line in
// the docs.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { hostname } from 'node:os';
import { DROP_PINS_FLAGS } from '../../src/agent/drop-pins/drop-pins.ts';
import { EVENT_REASONS } from '../../src/agent/node-sinks.ts';
import { STATUS_DOCUMENT_KEYS, STATUS_SET_KEYS } from '../../src/api/node-status.ts';
import { SET_REASONS } from '../../src/api/reasons.ts';
import { commands } from '../../src/cli/main.ts';
import { ControllerMetrics } from '../../src/controller/metrics.ts';
import { AgentMetrics } from '../../src/metrics/agent-metrics.ts';
import type { FlagSpec } from '../../src/util/flags.ts';

const doc = (name: string) => readFile(new URL(`../../docs/${name}`, import.meta.url), 'utf8');

interface Section {
  heading: string;
  /** Table rows: the cells of each, header and separator left out. */
  rows: string[][];
}

/** The page's sections (by heading, any level) with the rows of their tables (headers and separators left out); fenced code left out. */
function sections(md: string): Section[] {
  const out: Section[] = [{ heading: '', rows: [] }];
  let fenced = false;
  let inTable = false;
  for (const line of md.split('\n')) {
    if (line.startsWith('```')) fenced = !fenced;
    const row = !fenced && line.startsWith('|');
    const header = row && !inTable;
    inTable = row;
    if (fenced) continue;
    const h = /^#{1,6} (.*)$/.exec(line);
    if (h) out.push({ heading: h[1]!, rows: [] });
    else if (row && !header && !/^\|[-| ]+\|$/.test(line)) {
      out.at(-1)!.rows.push(line.slice(1, line.endsWith('|') ? -1 : undefined).split(/(?<!\\)\|/).map((c) => c.trim()));
    }
  }
  return out;
}

/** The code spans of a cell or a heading. */
const spans = (text: string) => [...text.matchAll(/`([^`]+)`/g)].map((m) => m[1]!);

/** A differences report: what one side has and the other lacks. */
function drift(what: string, code: Iterable<string>, docs: Iterable<string>, where: string): string[] {
  const c = new Set(code);
  const d = new Set(docs);
  return [
    ...[...c].filter((x) => !d.has(x)).map((x) => `${what} ${x} is in the code but not in ${where}`),
    ...[...d].filter((x) => !c.has(x)).map((x) => `${what} ${x} is in ${where} but not in the code`),
  ];
}

/** Each command's flag table, as the code has it: every command of `pinset`, and the agent's --drop-pins mode. */
async function codeFlags(): Promise<Map<string, readonly FlagSpec[]>> {
  const out = new Map<string, readonly FlagSpec[]>();
  for (const [name, c] of Object.entries(commands)) out.set(name, (await c.load()).flags);
  out.set('agent --drop-pins', DROP_PINS_FLAGS);
  return out;
}

/** The flags docs/reference.md gives each command: the table rows under a heading naming `pinset <command>` (one heading may name several). */
function docFlags(md: string): Map<string, Map<string, string>> {
  const out = new Map<string, Map<string, string>>();
  for (const s of sections(md)) {
    const named = spans(s.heading).filter((x) => x.startsWith('pinset ')).map((x) => x.slice('pinset '.length));
    for (const row of s.rows) {
      const flags = spans(row[0]!).filter((x) => x.startsWith('--'));
      if (flags.length === 0) continue;
      for (const cmd of named) {
        const m = out.get(cmd) ?? new Map<string, string>();
        for (const f of flags) m.set(f.slice(2), spans(row[1] ?? '')[0] ?? '');
        out.set(cmd, m);
      }
    }
  }
  return out;
}

/** The default column docs/reference.md gives each command's flags: command -> flag -> the cell. */
function docDefaults(md: string): Map<string, Map<string, string>> {
  const out = new Map<string, Map<string, string>>();
  for (const s of sections(md)) {
    const named = spans(s.heading).filter((x) => x.startsWith('pinset ')).map((x) => x.slice('pinset '.length));
    for (const row of s.rows) {
      for (const f of spans(row[0]!).filter((x) => x.startsWith('--'))) {
        for (const cmd of named) out.set(cmd, (out.get(cmd) ?? new Map<string, string>()).set(f.slice(2), row[2] ?? ''));
      }
    }
  }
  return out;
}

/** What `pinset <argv> --help` prints. */
async function helpOf(name: string, argv: string[]): Promise<string> {
  const cmd = commands[name]!;
  let text = '';
  const write = process.stdout.write.bind(process.stdout);
  process.stdout.write = ((chunk: string | Uint8Array) => ((text += String(chunk)), true)) as typeof process.stdout.write;
  try {
    assert.equal(await (await cmd.load()).run([...argv, '--help']), 0);
  } finally {
    process.stdout.write = write;
  }
  return text;
}

/** Whether a usage line names a flag: its long name, or its one-letter alias. */
function names(usage: string, s: FlagSpec): boolean {
  const token = (f: string) => new RegExp(`(^|[\\s\\[|(])${f}(?![\\w-])`).test(usage);
  return token(`--${s.name}`) || (s.short !== undefined && token(`-${s.short}`));
}

describe('the reference and the code name the same things', () => {
  test('every flag of every command, with its environment variable, in docs/reference.md, and no flag the code lacks', async () => {
    const md = await doc('reference.md');
    const code = await codeFlags();
    const docs = docFlags(md);
    const problems: string[] = drift('the command', [...code.keys()].map((c) => `pinset ${c}`), [...docs.keys()].map((c) => `pinset ${c}`), 'docs/reference.md');
    for (const [cmd, specs] of code) {
      const d = docs.get(cmd) ?? new Map<string, string>();
      problems.push(...drift(`the flag of pinset ${cmd}`, specs.map((s) => `--${s.name}`), [...d.keys()].map((f) => `--${f}`), 'docs/reference.md'));
      for (const s of specs) {
        const env = d.get(s.name);
        if (env !== undefined && env !== (s.env ?? '')) problems.push(`pinset ${cmd} --${s.name}: the environment variable is ${s.env ?? '(none)'} in the code, ${env || '(none)'} in docs/reference.md`);
      }
    }
    assert.deepEqual(problems, []);
  });

  test('every default a flag has in the code is the one docs/reference.md gives, in a code span', async () => {
    // A default computed where the code runs (a host name) must not be in
    // the flag's table: --help and this page would show the machine that
    // made them.
    const defaults = docDefaults(await doc('reference.md'));
    const problems: string[] = [];
    for (const [cmd, specs] of await codeFlags()) {
      if (cmd === 'agent --drop-pins') continue; // its table has no default column: the agent's own applies
      for (const s of specs) {
        if (s.default === undefined) continue;
        if (String(s.default) === hostname()) problems.push(`pinset ${cmd} --${s.name}: its default is this machine's host name, a value of wherever --help runs`);
        const cell = defaults.get(cmd)?.get(s.name);
        if (cell !== undefined && cell !== `\`${String(s.default)}\``) problems.push(`pinset ${cmd} --${s.name}: the default is ${JSON.stringify(String(s.default))} in the code, ${JSON.stringify(cell)} in docs/reference.md`);
      }
    }
    assert.deepEqual(problems, []);
  });

  test('every command\'s --help has a usage line naming every one of its flags', async () => {
    const problems: string[] = [];
    for (const [cmd, specs] of await codeFlags()) {
      const [name, ...argv] = cmd.split(' ');
      const help = await helpOf(name!, argv);
      const usage = /^usage: [\s\S]*?(?=\n\n)/.exec(help)?.[0];
      if (!usage) {
        problems.push(`pinset ${cmd} --help has no usage line`);
        continue;
      }
      for (const s of specs) if (!names(usage, s)) problems.push(`pinset ${cmd} --help: the usage line does not name --${s.name}`);
    }
    assert.deepEqual(problems, []);
  });

  test('every status reason in docs/status.md\'s table, in the order in which they win, with its phase and kind', async () => {
    const rows = sections(await doc('status.md'))
      .flatMap((s) => s.rows)
      .filter((r) => /^\d+$/.test(r[0]!));
    assert.deepEqual(drift('the reason', SET_REASONS.map((r) => r.reason), rows.map((r) => spans(r[1]!)[0]!), 'docs/status.md'), []);
    assert.deepEqual(
      rows.map((r) => [Number(r[0]), spans(r[1]!)[0], r[2], r[3]]),
      SET_REASONS.map((r, i) => [i + 1, r.reason, r.phase, r.kind]),
    );
    for (const r of rows) assert.ok(r[5] && r[5].length > 0, `${r[1]}: what to do about it`);
  });

  test('every key of the per-node status document, and of a set\'s entry, in docs/status.md', async () => {
    const text = await doc('status.md');
    const tableAfter = (label: string) => {
      const at = text.indexOf(`${label}\n`);
      assert.ok(at >= 0, `docs/status.md has "${label}"`);
      const lines = text.slice(at + label.length + 1).split('\n');
      const rows = [];
      let i = lines.findIndex((l) => l.startsWith('|'));
      for (; i < lines.length && lines[i]!.startsWith('|'); i++) rows.push(lines[i]!);
      return rows.slice(2).flatMap((r) => spans(r.split('|')[1]!));
    };
    assert.deepEqual(drift('the document key', STATUS_DOCUMENT_KEYS, tableAfter("The document's keys:"), 'docs/status.md'), []);
    assert.deepEqual(drift('the set key', STATUS_SET_KEYS, tableAfter("A set's keys:"), 'docs/status.md'), []);
  });

  test('every metric of the agent and of the controller, with its labels, in docs/reference.md', async () => {
    const rows = sections(await doc('reference.md')).find((s) => s.heading === 'Metrics')?.rows ?? [];
    const docs = new Map(rows.map((r) => [spans(r[0]!)[0]!, { process: r[1], labels: spans(r[2] ?? '').sort() }]));
    const code = new Map<string, { process: string; labels: string[] }>();
    for (const [process, registry] of [['agent', new AgentMetrics().registry], ['controller', new ControllerMetrics().registry]] as const) {
      for (const m of registry.getMetricsAsArray()) {
        code.set(m.name, { process, labels: [...((m as unknown as { labelNames?: string[] }).labelNames ?? [])].sort() });
      }
    }
    const problems = drift('the metric', code.keys(), docs.keys(), 'docs/reference.md');
    for (const [name, c] of code) {
      const d = docs.get(name);
      if (d && (d.process !== c.process || d.labels.join() !== c.labels.join())) problems.push(`${name}: ${c.process} {${c.labels}} in the code, ${d.process} {${d.labels}} in docs/reference.md`);
    }
    assert.deepEqual(problems, []);
  });

  test('every Event reason the agent records in docs/reference.md', async () => {
    const rows = sections(await doc('reference.md')).find((s) => s.heading === 'Events')?.rows ?? [];
    assert.deepEqual(drift('the Event reason', EVENT_REASONS, rows.map((r) => spans(r[0]!)[0]!), 'docs/reference.md'), []);
  });
});
