// The CLI as a user installs it: `npm pack` of this checkout (dist/ as
// `npm run build` made it, checked to be built from these sources), then
// `npm install -g` of the tarball into an empty prefix, offline and with an
// empty npm cache: the package needs nothing from a registry, as every
// dependency is inlined in the bundle. Then `pinset` and `kubectl-pinset`
// from that prefix's bin folder, from a folder outside the repository, with
// nothing on PATH but Node.js 24 and /usr/bin:/bin (`env`, which runs each
// program's first line). Node.js strips no types under node_modules
// (ERR_UNSUPPORTED_NODE_MODULES_TYPE_STRIPPING), so bin entries pointing at
// the .ts sources would fail here.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, readFile, rm, symlink } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { bundleProblem } from '../../scripts/build.ts';

const ROOT = path.resolve(import.meta.dirname, '../..');

interface Ran {
  code: number;
  stdout: string;
  stderr: string;
}

function runIn(cwd: string, env: NodeJS.ProcessEnv, file: string, args: string[], timeout = 120_000): Promise<Ran> {
  return new Promise((resolve) => {
    execFile(file, args, { cwd, env, timeout, maxBuffer: 16 << 20 }, (err, stdout, stderr) =>
      resolve({ code: err ? (typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : -1) : 0, stdout, stderr }),
    );
  });
}

const npm = ['/usr/bin/npm', ...(process.env.PATH ?? '').split(path.delimiter).map((d) => path.join(d, 'npm'))].find((p) => existsSync(p));

describe('npm install -g of the packed package, on Node.js 24 alone', () => {
  let work: string;
  let prefix: string;
  let env: NodeJS.ProcessEnv;
  let pkg: { name: string; version: string; bin: Record<string, string> };

  before(async () => {
    const problem = await bundleProblem();
    if (problem) throw new Error(problem);
    if (!npm) throw new Error('npm not found on PATH');
    pkg = JSON.parse(await readFile(path.join(ROOT, 'package.json'), 'utf8'));
    work = await mkdtemp(path.join(tmpdir(), 'pinset-npm-install-'));
    prefix = path.join(work, 'prefix');
    // Node.js 24 (this test's own, node_modules/.bin/node) and nothing else of the repository.
    const nodeOnly = path.join(work, 'node-24');
    await mkdir(nodeOnly);
    await symlink(process.execPath, path.join(nodeOnly, 'node'));
    env = { PATH: [path.join(prefix, 'bin'), nodeOnly, '/usr/bin', '/bin'].join(path.delimiter), HOME: work, npm_config_cache: path.join(work, 'npm-cache'), npm_config_update_notifier: 'false' };
  });
  after(async () => {
    if (work) await rm(work, { recursive: true, force: true });
  });

  test('packs (bin entries and files from dist/ only) and installs offline into an empty prefix', { timeout: 240_000 }, async () => {
    assert.deepEqual(pkg.bin, { pinset: 'dist/pinset.mjs', 'kubectl-pinset': 'dist/kubectl-pinset.mjs' });
    // --ignore-scripts: the package's prepack builds dist/, which is built and checked already.
    const packed = await runIn(ROOT, env, npm!, ['pack', '--ignore-scripts', '--pack-destination', work, '--json']);
    assert.equal(packed.code, 0, packed.stderr);
    const [info] = JSON.parse(packed.stdout) as { filename: string; files: { path: string }[] }[];
    const files = info!.files.map((f) => f.path);
    assert.ok(files.includes('dist/pinset.mjs') && files.includes('dist/kubectl-pinset.mjs') && files.includes('dist/deploy/kustomization.yaml'), 'the programs and the manifests uninstall reads');
    assert.deepEqual(files.filter((f) => !f.startsWith('dist/') && f !== 'package.json' && f !== 'README.md'), [], 'nothing but dist/, package.json and README.md');
    assert.ok(!files.some((f) => f.endsWith('.ts')), 'no TypeScript source');

    const installed = await runIn(work, env, npm!, ['install', '--global', '--prefix', prefix, '--offline', '--no-audit', '--no-fund', path.join(work, info!.filename)]);
    assert.equal(installed.code, 0, installed.stderr);
    const home = path.join(prefix, 'lib', 'node_modules', pkg.name);
    assert.equal(existsSync(path.join(home, 'node_modules')), false, 'no dependency installed beside it');
    assert.deepEqual((await readdir(path.join(prefix, 'bin'))).sort(), ['kubectl-pinset', 'pinset']);
  });

  test('pinset --version', async () => {
    const r = await runIn(work, env, 'pinset', ['--version']);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, `pinset ${pkg.version}\n`);
    assert.equal(r.stderr, '');
  });

  test('pinset status --help and pinset preflight --help: the commands load from the installed bundle', async () => {
    const status = await runIn(work, env, 'pinset', ['status', '--help']);
    assert.equal(status.code, 0, status.stderr);
    assert.match(status.stdout, /^usage: pinset status /);
    const preflight = await runIn(work, env, 'pinset', ['preflight', '--help']);
    assert.equal(preflight.code, 0, preflight.stderr);
    assert.match(preflight.stdout, /^usage: pinset preflight /);
  });

  test('kubectl-pinset --help: the people\'s commands, not the daemons', async () => {
    const r = await runIn(work, env, 'kubectl-pinset', ['--help']);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /^usage: kubectl pinset <command>/);
    for (const c of ['preflight', 'status', 'kubelet-allowlist', 'uninstall']) assert.match(r.stdout, new RegExp(`^  ${c} `, 'm'), c);
    assert.doesNotMatch(r.stdout, /^ {2}(agent|controller) /m);
  });

  test('a command that reads files runs whole: pinset validate of the first example set', async () => {
    const r = await runIn(work, env, 'pinset', ['validate', path.join(ROOT, 'examples/first-set.yaml')]);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /1 document\(s\) valid/);
  });
});
