// `pinset validate` as a person runs it: a subprocess of src/cli/main.ts,
// judged by its exit status and by what it prints.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';

const ROOT = path.resolve(import.meta.dirname, '../..');
const NODE = path.join(ROOT, 'node_modules/.bin/node');
const MAIN = path.join(ROOT, 'src/cli/main.ts');
const GOOD = path.join(ROOT, 'test/fixtures/sets/good');
const BAD = path.join(ROOT, 'test/fixtures/sets/bad');
const H = '3ddd18007da0e2a1e7da24b251a2d691f53a918f9e2dedf116c0bd39de1149fe';

interface Result {
  code: number | null;
  stdout: string;
  stderr: string;
}

function pinset(args: string[], stdin?: string): Promise<Result> {
  return new Promise((resolve, reject) => {
    const child = spawn(NODE, [MAIN, ...args], { cwd: ROOT, stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
    child.stdin.end(stdin ?? '');
  });
}

function set(name: string, images: string[], extra = ''): string {
  return `apiVersion: pinset.dev/v1alpha1
kind: PinnedImageSet
metadata:
  name: ${name}
spec:${extra}
  pinnedImages:
${images.map((i) => `    - name: ${JSON.stringify(i)}`).join('\n')}
`;
}

let dir: string;
before(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'pinset-validate-'));
});
after(async () => {
  await rm(dir, { recursive: true, force: true });
});

async function file(name: string, text: string): Promise<string> {
  const p = path.join(dir, name);
  await writeFile(p, text);
  return p;
}

describe('pinset validate', () => {
  test('good files: exit 0 and one "N document(s) valid" line per file', async () => {
    const files = (await readdir(GOOD)).sort().map((f) => path.join('test/fixtures/sets/good', f));
    const r = await pinset(['validate', ...files, 'examples/upgrade-workers.yaml']);
    assert.equal(r.code, 0, r.stdout + r.stderr);
    assert.equal(r.stderr, '');
    assert.match(r.stdout, /^test\/fixtures\/sets\/good\/selectors\.yaml: 3 document\(s\) valid$/m);
    assert.match(r.stdout, /^examples\/upgrade-workers\.yaml: 1 document\(s\) valid$/m);
    assert.equal(r.stdout.trim().split('\n').length, files.length + 1);
  });

  test('the bad fixtures: exit 1, naming the file, the document, the set and the field, one summary per file', async () => {
    const files = (await readdir(BAD)).sort().map((f) => path.join('test/fixtures/sets/bad', f));
    const r = await pinset(['validate', ...files]);
    assert.equal(r.code, 1);
    const cases: [string, RegExp][] = [
      ['tag.yaml', /^test\/fixtures\/sets\/bad\/tag\.yaml: document 1 \(name tag\): spec\.pinnedImages\[0\]\.name: .*names a tag/m],
      ['short-digest.yaml', /: document 1 \(name short-digest\): spec\.pinnedImages\[0\]\.name: .*63 hex characters/m],
      ['uppercase-hex.yaml', /: document 1 \(name uppercase-hex\): spec\.pinnedImages\[0\]\.name: .*uppercase hex/m],
      ['no-host.yaml', /: document 1 \(name no-host\): spec\.pinnedImages\[0\]\.name: .*no registry host/m],
      ['injection.yaml', /: document 1 \(name injection\): spec\.pinnedImages\[0\]\.name: .*quotes, brackets or control characters/m],
      ['zero-items.yaml', /: document 1 \(name zero-items\): spec\.pinnedImages: must have at least 1 item/m],
      ['bad-operator.yaml', /: document 1 \(name bad-operator\): spec\.nodeSelector\.matchExpressions\[0\]\.operator: must be one of/m],
      ['in-without-values.yaml', /: document 1 \(name in-without-values\): spec\.nodeSelector\.matchExpressions\[0\]\.values: must be non-empty/m],
    ];
    for (const [name, message] of cases) {
      const lines = r.stdout.split('\n').filter((l) => l.startsWith(`test/fixtures/sets/bad/${name}: `)).join('\n');
      assert.match(lines, message, name);
    }
    for (const f of files) assert.match(r.stdout, new RegExp(`^${f.replaceAll('.', '\\.')}: 1 of 1 document\\(s\\) invalid$`, 'm'));
  });

  test('the injection attempt is printed quoted, on one line', async () => {
    const r = await pinset(['validate', path.join(BAD, 'injection.yaml')]);
    const lines = r.stdout.trim().split('\n');
    assert.equal(lines.length, 2, r.stdout);
    assert.match(lines[0]!, /\\"\]\\n\[crio\.runtime\]/);
  });

  test('a bad document among good ones: the document number, its name and the exact item', async () => {
    const good = [`quay.io/org/a@sha256:${H}`, `quay.io/org/b@sha256:${H}`, `quay.io/org/c@sha256:${H}`];
    const p = await file(
      'mixed.yaml',
      [set('first', good), set('second', [...good, 'quay.io/org/d:latest'], '\n  runtimeHandler: Bad_Handler'), set('third', good)].join('---\n'),
    );
    const r = await pinset(['validate', p]);
    assert.equal(r.code, 1);
    assert.match(r.stdout, new RegExp(`^${p}: document 2 \\(name second\\): spec\\.pinnedImages\\[3\\]\\.name: "quay\\.io/org/d:latest" names a tag`, 'm'));
    assert.match(r.stdout, new RegExp(`^${p}: document 2 \\(name second\\): spec\\.runtimeHandler: `, 'm'));
    assert.doesNotMatch(r.stdout, /document [13]/);
    assert.match(r.stdout, new RegExp(`^${p}: 1 of 3 document\\(s\\) invalid$`, 'm'));
  });

  test('a YAML syntax error: that document is invalid, with its line; the others are still checked', async () => {
    const p = await file('syntax.yaml', `${set('ok', [`quay.io/org/a@sha256:${H}`])}---\nmetadata: {name: [broken\nspec: {}\n---\n${set('bad', ['nginx'])}`);
    const r = await pinset(['validate', p]);
    assert.equal(r.code, 1);
    assert.match(r.stdout, new RegExp(`^${p}: document 2: line 10: invalid YAML: `, 'm'));
    assert.match(r.stdout, new RegExp(`^${p}: document 3 \\(name bad\\): spec\\.pinnedImages\\[0\\]\\.name: `, 'm'));
    assert.match(r.stdout, new RegExp(`^${p}: 2 of 3 document\\(s\\) invalid$`, 'm'));
  });

  test('documents that are not sets at all', async () => {
    const p = await file('other.yaml', 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm}\ndata: {a: b}\n---\n- just\n- a list\n');
    const r = await pinset(['validate', p]);
    assert.equal(r.code, 1);
    assert.match(r.stdout, new RegExp(`^${p}: document 1 \\(name cm\\): kind: must be PinnedImageSet`, 'm'));
    assert.match(r.stdout, new RegExp(`^${p}: document 2: must be an object$`, 'm'));
  });

  test('a file with no documents is not a valid set file', async () => {
    const p = await file('empty.yaml', '# nothing here\n---\n');
    const r = await pinset(['validate', p]);
    assert.equal(r.code, 1);
    assert.match(r.stdout, new RegExp(`^${p}: no documents`, 'm'));
  });

  test('"-" reads standard input', async () => {
    const [good, bad] = await Promise.all([
      pinset(['validate', '-'], set('from-stdin', [`quay.io/org/a@sha256:${H}`])),
      pinset(['validate', '-'], set('from-stdin', [`quay.io/org/a@sha256:${H.toUpperCase()}`])),
    ]);
    assert.equal(good.code, 0);
    assert.equal(good.stdout, '<stdin>: 1 document(s) valid\n');
    assert.equal(bad.code, 1);
    assert.match(bad.stdout, /^<stdin>: document 1 \(name from-stdin\): spec\.pinnedImages\[0\]\.name: .*uppercase/m);
  });

  test('-o json: a report a program can read', async () => {
    const p = await file('two.yaml', `${set('fine', [`quay.io/org/a@sha256:${H}`])}---\n${set('broken', ['quay.io/org/a@sha256:abc'])}`);
    const flags = [['-o', 'json'], ['-ojson'], ['--output=json']];
    const results = await Promise.all(flags.map((flag) => pinset(['validate', ...flag, p])));
    for (const [i, flag] of flags.entries()) {
      const r = results[i]!;
      assert.equal(r.code, 1, flag.join(' '));
      const report = JSON.parse(r.stdout);
      assert.equal(report.valid, false);
      assert.equal(report.files.length, 1);
      const [doc1, doc2] = report.files[0].documents;
      assert.deepEqual(doc1, { document: 1, line: 1, name: 'fine', valid: true, problems: [], warnings: [] });
      assert.equal(doc2.document, 2);
      assert.equal(doc2.name, 'broken');
      assert.equal(doc2.valid, false);
      assert.match(doc2.problems[0], /^spec\.pinnedImages\[0\]\.name: .*3 hex characters/);
    }
    const ok = await pinset(['validate', '-o', 'json', path.join(GOOD, 'minimal.yaml')]);
    assert.equal(ok.code, 0);
    assert.equal(JSON.parse(ok.stdout).valid, true);
  });

  test('usage errors exit 2 with a message on stderr', async () => {
    await mkdir(path.join(dir, 'folder'), { recursive: true });
    const [none, missing, folder, format, flag] = await Promise.all([
      pinset(['validate']),
      pinset(['validate', path.join(GOOD, 'minimal.yaml'), path.join(dir, 'nope.yaml')]),
      pinset(['validate', path.join(dir, 'folder')]),
      pinset(['validate', '-o', 'yaml', path.join(GOOD, 'minimal.yaml')]),
      pinset(['validate', '-x', path.join(GOOD, 'minimal.yaml')]),
    ]);
    assert.equal(none.code, 2);
    assert.match(none.stderr, /pinset validate: no files given/);
    assert.equal(none.stdout, '');

    assert.equal(missing.code, 2);
    assert.match(missing.stderr, new RegExp(`cannot read ${path.join(dir, 'nope.yaml')}: no such file`));
    assert.equal(missing.stdout, '', 'no verdict when an input cannot be read');

    assert.equal(folder.code, 2);
    assert.match(folder.stderr, /is a folder/);

    assert.equal(format.code, 2);
    assert.match(format.stderr, /"yaml" is not one of text, json/);

    assert.equal(flag.code, 2);
    assert.match(flag.stderr, /unknown flag -x/);
  });

  test('a set too large for client-side kubectl apply: valid, with a warning that says what to use instead', async () => {
    const images = (n: number) => Array.from({ length: n }, (_, i) => `quay.io/org/component-${String(i).padStart(4, '0')}@sha256:${H}`);
    const big = await file('big.yaml', set('big', images(2500)));
    const small = await file('small.yaml', set('small', images(1500)));
    const r = await pinset(['validate', big, small]);
    assert.equal(r.code, 0, 'a warning does not make the set invalid');
    const lines = r.stdout.trim().split('\n');
    const warnings = lines.filter((l) => l.includes('warning:'));
    assert.equal(warnings.length, 1, r.stdout);
    assert.match(warnings[0]!, new RegExp(`^${big.replaceAll('/', '\\/')}: document 1 \\(name big\\): warning: too large for client-side "kubectl apply"`));
    assert.match(warnings[0]!, /over the API server's limit of 262144; apply it with "kubectl apply --server-side"/);
    const json = JSON.parse((await pinset(['validate', '-o', 'json', big])).stdout);
    assert.equal(json.valid, true);
    assert.equal(json.files[0].documents[0].warnings.length, 1);
  });

  test('--help: usage and flags, exit 0', async () => {
    const r = await pinset(['validate', '--help']);
    assert.equal(r.code, 0);
    assert.match(r.stdout, /^usage: pinset validate/);
    assert.match(r.stdout, /--output text\|json/);
  });
});
