// The static folder as Kubernetes and people fill it: ConfigMap links, files
// that stop being readable (and keep their sets), YAML of every kind of bad,
// and one bad file never touching another's sets. Real files, links, FIFOs
// and kernel errors; EACCES from a child process that runs without root.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import * as fsp from 'node:fs/promises';
import * as os from 'node:os';
import * as path from 'node:path';
import { pathToFileURL } from 'node:url';
import { StaticSource, STATIC_FILE_MAX_BYTES, type StaticRead } from '../../src/agent/static.ts';
import { captureLogs } from '../support/log-capture.ts';

const ref = (name: string, c: string) => `quay.io/org/${name}@sha256:${c.repeat(64)}`;

function setYaml(name: string, images: string[]): string {
  return ['apiVersion: pinset.dev/v1alpha1', 'kind: PinnedImageSet', `metadata: {name: ${name}}`, 'spec:', '  pinnedImages:', ...images.map((i) => `  - name: ${i}`), ''].join('\n');
}

let root: string;
before(async () => {
  root = await fsp.mkdtemp(path.join(os.tmpdir(), 'pinset-static-'));
  await fsp.chmod(root, 0o755);
});
after(async () => {
  await fsp.rm(root, { recursive: true, force: true });
});

let n = 0;
async function folder(): Promise<string> {
  const d = path.join(root, String(n++));
  await fsp.mkdir(d, { mode: 0o755 });
  await fsp.chmod(d, 0o755);
  return d;
}

/** A logger whose lines are kept. */
const names = (r: StaticRead) => r.sets.map((s) => (s.object as { metadata: { name: string } }).metadata.name);
const heldNames = (r: StaticRead) => r.sets.filter((s) => s.held).map((s) => (s.object as { metadata: { name: string } }).metadata.name);

/**
 * A ConfigMap volume as the kubelet writes it (pkg/volume/util/atomic_writer.go):
 * the files in a timestamped folder, `..data` linking to it, and one link per
 * key through `..data`. An update writes a new folder and swaps `..data`.
 */
async function configMap(dir: string, files: Record<string, string>, stamp: string): Promise<void> {
  const ts = path.join(dir, `..${stamp}`);
  await fsp.mkdir(ts);
  for (const [k, v] of Object.entries(files)) await fsp.writeFile(path.join(ts, k), v);
  await fsp.symlink(`..${stamp}`, path.join(dir, '..data_tmp'));
  await fsp.rename(path.join(dir, '..data_tmp'), path.join(dir, '..data'));
  for (const k of Object.keys(files)) await fsp.symlink(`..data/${k}`, path.join(dir, k)).catch((e: NodeJS.ErrnoException) => (e.code === 'EEXIST' ? undefined : Promise.reject(e)));
}

describe('StaticSource: what is read', () => {
  test('a ConfigMap volume: keys reached through links are read, the kubelet’s `..` entries are not', async () => {
    const dir = await folder();
    await configMap(dir, { 'sets.yaml': setYaml('from-configmap', [ref('a', 'a')]), 'more.yml': setYaml('more', [ref('b', 'b')]) }, '2026_11_24_10_00_00.000000001');
    const src = new StaticSource(dir);
    const r = await src.read();
    assert.deepEqual(names(r).sort(), ['from-configmap', 'more']);
    assert.deepEqual(r.problems, []);
    assert.deepEqual(r.files.map((f) => path.basename(f)).sort(), ['more.yml', 'sets.yaml']);

    // An update: a new timestamped folder, ..data swapped atomically.
    await configMap(dir, { 'sets.yaml': setYaml('from-configmap', [ref('c', 'c')]), 'more.yml': setYaml('more', [ref('b', 'b')]) }, '2026_11_24_10_05_00.000000002');
    const r2 = await src.read();
    const cm = r2.sets.find((s) => (s.object as { metadata: { name: string } }).metadata.name === 'from-configmap')!;
    assert.deepEqual((cm.object as { spec: { pinnedImages: { name: string }[] } }).spec.pinnedImages, [{ name: ref('c', 'c') }]);
  });

  test('hidden names and names without .yaml, .yml or .json are not set files', async () => {
    const dir = await folder();
    await fsp.writeFile(path.join(dir, '.hidden.yaml'), setYaml('hidden', [ref('a', 'a')]));
    await fsp.writeFile(path.join(dir, 'notes.txt'), 'not: [a set');
    await fsp.writeFile(path.join(dir, 'set.json'), JSON.stringify({ apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name: 'json' }, spec: { pinnedImages: [] } }));
    const r = await new StaticSource(dir).read();
    assert.deepEqual(names(r), ['json']);
    assert.deepEqual(r.problems, []);
  });

  test('a missing folder means no static sets', async () => {
    const r = await new StaticSource(path.join(root, 'no-such-folder')).read();
    assert.deepEqual(r, { sets: [], problems: [], unknown: [], files: [] });
  });
});

describe('StaticSource.peek: a look while a change settles', () => {
  test('the readable files\' sets, with nothing logged or remembered: a file half written is left out, then read() reports it as before', async () => {
    const dir = await folder();
    await fsp.writeFile(path.join(dir, 'good.yaml'), setYaml('good', [ref('a', 'a')]));
    await fsp.writeFile(path.join(dir, 'half.yaml'), 'apiVersion: pinset.dev/v1alpha1\nkind: PinnedImageSet\nspec: [unclosed\n');
    const { logger, lines } = captureLogs('debug');
    const src = new StaticSource(dir, logger);
    const peeked = await src.peek();
    assert.deepEqual(peeked.map((s) => (s.object as { metadata: { name: string } }).metadata.name), ['good']);
    assert.equal(lines.length, 0, `a look logs nothing: ${JSON.stringify(lines)}`);
    // read() still meets the bad file as new: unknown since the start, logged once.
    const r = await src.read();
    assert.deepEqual(names(r), ['good']);
    assert.deepEqual(r.unknown.map((u) => path.basename(u.origin)), ['half.yaml']);
    assert.equal(lines.filter((l) => l.msg === 'static set file unreadable since the agent started; its sets are unknown, so the current pins are kept').length, 1, JSON.stringify(lines));
    // The text read() meets is the one peek() parsed: the same objects, not parsed again.
    assert.equal(r.sets[0]!.object, peeked[0]!.object);
  });
});

describe('StaticSource: a file that stops being readable keeps its sets', () => {
  // Each case: a good file, read once; then broken in one way; the sets stay
  // (marked held, naming the file), the other file is untouched; then the
  // file is fixed or removed.
  const cases: { name: string; breakIt: (file: string, dir: string) => Promise<void>; error: RegExp }[] = [
    {
      name: 'its link target gone',
      breakIt: async (_file, dir) => {
        await fsp.rm(path.join(dir, 'real', 'mine.yaml'));
      },
      error: /symbolic link points to real\/mine\.yaml, which does not exist/,
    },
    {
      name: 'a link loop',
      breakIt: async (file, dir) => {
        await fsp.rm(file);
        await fsp.symlink('loop-b', file);
        await fsp.symlink(path.basename(file), path.join(dir, 'loop-b'));
      },
      error: /loop of symbolic links \(ELOOP\)/,
    },
    {
      name: 'replaced by a folder',
      breakIt: async (file) => {
        await fsp.rm(file);
        await fsp.mkdir(file);
        await fsp.writeFile(path.join(file, 'inside.yaml'), setYaml('inside', [ref('c', 'c')]));
      },
      error: /it is a folder, not a file/,
    },
    {
      name: 'replaced by a FIFO (not a regular file; reading it must not hang)',
      breakIt: async (file) => {
        await fsp.rm(file);
        execFileSync('mkfifo', [file]);
      },
      error: /not a regular file/,
    },
    {
      name: 'an I/O error (a link to /proc/self/mem: reading its first page fails with EIO in the kernel)',
      breakIt: async (file) => {
        await fsp.rm(file);
        await fsp.symlink('/proc/self/mem', file);
      },
      error: /I\/O error \(EIO\)/,
    },
    {
      name: 'a YAML syntax error',
      breakIt: (file) => fsp.writeFile(file, 'apiVersion: pinset.dev/v1alpha1\nspec:\n\t- tab\n'),
      error: /document 1: line 3: invalid YAML: Tabs are not allowed/,
    },
    {
      name: 'an unresolved alias',
      breakIt: (file) => fsp.writeFile(file, setYaml('x', [ref('a', 'a')]).replace('metadata: {name: x}', 'metadata: *nowhere')),
      error: /Unresolved alias/,
    },
    {
      name: 'an alias bomb',
      breakIt: (file) =>
        fsp.writeFile(
          file,
          ['a: &a ["x","x","x","x","x","x","x","x","x"]', ...'bcdefgh'.split('').map((c, i) => `${c}: &${c} [${Array(9).fill(`*${'abcdefgh'[i]}`).join(',')}]`), ''].join('\n'),
        ),
      error: /Excessive alias count/,
    },
    {
      name: 'nesting too deep',
      breakIt: (file) => fsp.writeFile(file, `spec: ${'['.repeat(5000)}${']'.repeat(5000)}\n`),
      error: /invalid YAML: (nested more than 64 levels deep|Maximum call stack size exceeded)/,
    },
    {
      name: 'too large',
      breakIt: (file) => fsp.writeFile(file, setYaml('big', [ref('a', 'a')]) + '#'.repeat(STATIC_FILE_MAX_BYTES)),
      error: /more than the 1048576-byte limit/,
    },
    {
      name: 'not UTF-8',
      breakIt: (file) => fsp.writeFile(file, Buffer.from([0x61, 0x3a, 0x20, 0xff, 0xfe, 0x0a])),
      error: /not UTF-8 text/,
    },
    {
      name: 'a second document with an error (the file applies whole or not at all)',
      breakIt: (file) => fsp.appendFile(file, '---\nmetadata: *nowhere\n'),
      error: /document 2: .*Unresolved alias/,
    },
  ];

  for (const c of cases) {
    test(c.name, async () => {
      const dir = await folder();
      const file = path.join(dir, 'mine.yaml');
      // Reached through a link, as from a ConfigMap (a folder name is not a set file).
      await fsp.mkdir(path.join(dir, 'real'));
      await fsp.writeFile(path.join(dir, 'real', 'mine.yaml'), setYaml('mine', [ref('a', 'a')]));
      await fsp.symlink('real/mine.yaml', file);
      await fsp.writeFile(path.join(dir, 'other.yaml'), setYaml('other', [ref('b', 'b')]));
      const { logger, lines } = captureLogs();
      const src = new StaticSource(dir, logger);
      const first = await src.read();
      assert.ok(names(first).includes('mine') && names(first).includes('other'));

      await c.breakIt(file, dir);
      const r = await src.read();
      const problem = r.problems.find((p) => p.file === file);
      assert.ok(problem, `a problem for ${file}: ${JSON.stringify(r.problems)}`);
      assert.match(problem.error, c.error);
      assert.deepEqual(problem.held, ['mine']);
      assert.deepEqual(heldNames(r), ['mine'], 'its set is held');
      assert.deepEqual(r.sets.find((s) => s.held)!.held, { file, error: problem.error });
      assert.ok(names(r).includes('other'), 'the other file’s set is untouched');
      assert.equal(r.sets.find((s) => (s.object as { metadata: { name: string } }).metadata.name === 'other')!.held, undefined);
      assert.deepEqual(r.unknown, [], 'the last content is known: nothing unknown');

      // Logged once, not on every read.
      await src.read();
      await src.read();
      const warned = lines.filter((l) => l.file === file && l.level === 'warn');
      assert.equal(warned.length, 1, JSON.stringify(lines));
      assert.deepEqual(warned[0]!.heldSets, ['mine']);

      // Removed from the folder: only now its set goes.
      await fsp.rm(file, { recursive: true, force: true });
      const gone = await src.read();
      assert.deepEqual(names(gone), ['other'], 'the held set is gone with the name');
      assert.deepEqual(gone.problems.filter((p) => p.file === file), []);
      assert.ok(lines.some((l) => l.file === file && /removed from the folder/.test(String(l.msg))));
    });
  }

  test('readable again: the new content applies and the recovery is logged once', async () => {
    const dir = await folder();
    const file = path.join(dir, 'mine.yaml');
    await fsp.writeFile(file, setYaml('mine', [ref('a', 'a')]));
    const { logger, lines } = captureLogs();
    const src = new StaticSource(dir, logger);
    await src.read();
    await fsp.writeFile(file, 'spec: [unclosed\n');
    assert.deepEqual(heldNames(await src.read()), ['mine']);
    await fsp.writeFile(file, setYaml('mine', [ref('c', 'c')]) + '---\n' + setYaml('added', [ref('d', 'd')]));
    const r = await src.read();
    assert.deepEqual(names(r), ['mine', 'added']);
    assert.deepEqual(heldNames(r), []);
    assert.deepEqual(r.problems, []);
    assert.equal(lines.filter((l) => l.msg === 'static set file readable again').length, 1, JSON.stringify(lines));
  });

  test('unreadable since the start: its sets are unknown (the planner keeps every current pin), the other file applies', async () => {
    const dir = await folder();
    await fsp.writeFile(path.join(dir, 'bad.yaml'), 'a: *nowhere\n');
    await fsp.writeFile(path.join(dir, 'good.yaml'), setYaml('good', [ref('a', 'a')]));
    const r = await new StaticSource(dir).read();
    assert.deepEqual(names(r), ['good']);
    assert.deepEqual(r.unknown, [{ origin: path.join(dir, 'bad.yaml'), error: r.problems[0]!.error }]);
    assert.equal(r.problems[0]!.held, null);
    assert.match(r.problems[0]!.error, /Unresolved alias/);
  });

  test('the folder replaced by a file: the sets last read from it are held', async () => {
    const dir = await folder();
    await fsp.writeFile(path.join(dir, 'a.yaml'), setYaml('a', [ref('a', 'a')]));
    const src = new StaticSource(dir);
    await src.read();
    await fsp.rm(dir, { recursive: true });
    await fsp.writeFile(dir, 'not a folder');
    const r = await src.read();
    assert.deepEqual(heldNames(r), ['a']);
    assert.match(r.problems[0]!.error, /cannot read the static folder/);
    assert.deepEqual(r.unknown, []);
  });
});

describe('StaticSource without root: permission denied', () => {
  // Root reads any file (CAP_DAC_OVERRIDE), so EACCES needs a reader without
  // it: a child process running as nobody (65534), reading as the agent does.
  const asRoot = process.getuid?.() === 0;
  test('a file and then the folder become unreadable: sets held, named, the other file untouched', { skip: asRoot ? false : 'needs root to start a child as another user' }, async () => {
    const dir = await folder();
    const mine = path.join(dir, 'mine.yaml');
    await fsp.writeFile(mine, setYaml('mine', [ref('a', 'a')]), { mode: 0o644 });
    await fsp.writeFile(path.join(dir, 'other.yaml'), setYaml('other', [ref('b', 'b')]), { mode: 0o644 });
    const script = path.join(root, `eacces-${n++}.mjs`);
    await fsp.writeFile(
      script,
      [
        'import { createInterface } from "node:readline";',
        'const { StaticSource } = await import(process.argv[2]);',
        'const src = new StaticSource(process.argv[3]);',
        'const rl = createInterface({ input: process.stdin });',
        'const show = (r) => ({ sets: r.sets.map((s) => [s.object.metadata.name, Boolean(s.held)]), problems: r.problems, unknown: r.unknown });',
        'process.stdout.write(JSON.stringify(show(await src.read())) + "\\n");',
        'for await (const _ of rl) process.stdout.write(JSON.stringify(show(await src.read())) + "\\n");',
      ].join('\n'),
    );
    await fsp.chmod(script, 0o644);
    const moduleUrl = pathToFileURL(path.resolve(import.meta.dirname, '../../src/agent/static.ts')).href;
    const child = spawn(process.execPath, [script, moduleUrl, dir], { uid: 65534, gid: 65534, stdio: ['pipe', 'pipe', 'pipe'] });
    let err = '';
    child.stderr.on('data', (d: Buffer) => (err += d));
    const replies: string[] = [];
    let waiting: ((l: string) => void) | undefined;
    let buf = '';
    child.stdout.on('data', (d: Buffer) => {
      buf += d;
      let i: number;
      while ((i = buf.indexOf('\n')) >= 0) {
        const l = buf.slice(0, i);
        buf = buf.slice(i + 1);
        if (waiting) {
          const w = waiting;
          waiting = undefined;
          w(l);
        } else replies.push(l);
      }
    });
    const next = () =>
      new Promise<{ sets: [string, boolean][]; problems: { file: string; error: string; held: string[] | null }[]; unknown: unknown[] }>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`no answer from the child: ${err}`)), 20_000);
        const done = (l: string) => {
          clearTimeout(timer);
          resolve(JSON.parse(l));
        };
        if (replies.length) done(replies.shift()!);
        else waiting = done;
      });
    try {
      const first = await next();
      assert.deepEqual(first.sets, [['mine', false], ['other', false]], err);
      await fsp.chmod(mine, 0o000);
      child.stdin.write('read\n');
      const r = await next();
      assert.deepEqual(r.sets, [['mine', true], ['other', false]]);
      assert.equal(r.problems[0]!.file, mine);
      assert.match(r.problems[0]!.error, /permission denied \(EACCES\)/);
      assert.deepEqual(r.problems[0]!.held, ['mine']);

      await fsp.chmod(mine, 0o644);
      await fsp.chmod(dir, 0o000);
      child.stdin.write('read\n');
      const r2 = await next();
      assert.deepEqual(r2.sets, [['mine', true], ['other', true]], 'the folder unreadable: every file it held is held');
      assert.match(r2.problems[0]!.error, /cannot read the static folder: permission denied/);
      assert.deepEqual(r2.unknown, []);
    } finally {
      await fsp.chmod(dir, 0o755).catch(() => {});
      child.kill('SIGKILL');
    }
  });
});
