// No container engine runs on these machines, so the Containerfile is
// replayed by hand: each stage gets a folder standing for its root file
// system, COPY lines copy what they say (from the build context through
// .dockerignore, or from an earlier stage), the npm lines (npm ci, npm run
// build) run as written, and ENTRYPOINT + CMD run with this repository's
// Node.js 24 as the image's `node`: with --help, and as `agent --once`
// against a CRI socket that is not there, which loads the gRPC client and
// proto/ from the image's files. An instruction this replay does not know fails the test
// rather than being skipped.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { cp, mkdir, mkdtemp, readFile, rm, stat } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';

const ROOT = path.resolve(import.meta.dirname, '../..');
const NODE = path.join(ROOT, 'node_modules/.bin/node');

interface Instruction {
  op: string;
  args: string;
  line: number;
}

/** Instructions with line continuations joined; comments and blank lines dropped. */
function parseContainerfile(text: string): Instruction[] {
  const out: Instruction[] = [];
  let pending = '';
  let startLine = 0;
  text.split('\n').forEach((raw, i) => {
    const line = raw.replace(/\r$/, '');
    if (!pending && (/^\s*#/.test(line) || line.trim() === '')) return;
    if (!pending) startLine = i + 1;
    if (line.endsWith('\\')) {
      pending += line.slice(0, -1) + ' ';
      return;
    }
    const full = (pending + line).trim();
    pending = '';
    const m = /^(\S+)\s*(.*)$/.exec(full)!;
    out.push({ op: m[1]!.toUpperCase(), args: m[2]!, line: startLine });
  });
  return out;
}

interface Stage {
  name: string;
  from: string;
  instructions: Instruction[];
}

function stagesOf(instructions: Instruction[]): Stage[] {
  const stages: Stage[] = [];
  for (const ins of instructions) {
    if (ins.op === 'FROM') {
      const m = /^(\S+)(?:\s+AS\s+(\S+))?$/i.exec(ins.args);
      assert.ok(m, `line ${ins.line}: FROM ${ins.args}`);
      stages.push({ name: m[2] ?? String(stages.length), from: m[1]!, instructions: [] });
    } else {
      assert.ok(stages.length > 0, `line ${ins.line}: ${ins.op} before FROM`);
      stages.at(-1)!.instructions.push(ins);
    }
  }
  return stages;
}

/** The exec form ["a", "b"] of ENTRYPOINT, CMD and RUN. */
function execForm(ins: Instruction): string[] {
  const v = JSON.parse(ins.args) as unknown;
  assert.ok(Array.isArray(v) && v.every((x) => typeof x === 'string'), `line ${ins.line}: ${ins.op} must use the JSON (exec) form`);
  return v as string[];
}

/**
 * .dockerignore as BuildKit reads it: a path is excluded when the last
 * pattern matching it or one of its parent folders is not a "!" exception.
 */
function dockerignore(text: string): (rel: string) => boolean {
  const rules = text
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l && !l.startsWith('#'))
    .map((l) => {
      const negate = l.startsWith('!');
      const pattern = path.posix.normalize((negate ? l.slice(1) : l).replace(/^\/+/, ''));
      const source = pattern
        .split(/(\*\*|\*|\?)/)
        .map((part) => (part === '**' ? '.*' : part === '*' ? '[^/]*' : part === '?' ? '[^/]' : part.replace(/[.+^${}()|[\]\\]/g, '\\$&')))
        .join('');
      return { negate, re: new RegExp(`^${source}$`) };
    });
  return (rel: string) => {
    const parts = rel.split('/');
    const candidates = parts.map((_, i) => parts.slice(0, i + 1).join('/'));
    let excluded = false;
    for (const r of rules) if (candidates.some((c) => r.re.test(c))) excluded = !r.negate;
    return excluded;
  };
}

/** Split a shell-form RUN line into words; only plain words are supported. */
function words(cmd: string): string[] {
  assert.doesNotMatch(cmd, /[|&;<>()$`"'\\]/, `RUN ${cmd}: only a plain command is replayed`);
  return cmd.trim().split(/\s+/);
}

const text = await readFile(path.join(ROOT, 'Containerfile'), 'utf8');
const stages = stagesOf(parseContainerfile(text));
const isIgnored = dockerignore(await readFile(path.join(ROOT, '.dockerignore'), 'utf8'));

describe('Containerfile', () => {
  const build = stages[0]!;
  const runtime = stages.at(-1)!;
  const only = (s: Stage, op: string) => s.instructions.filter((i) => i.op === op);

  test('multi-stage: a Node.js 24 build stage that installs from the lock file and bundles, a Node.js 24 runtime that installs nothing', () => {
    assert.ok(stages.length >= 2, 'at least a build and a runtime stage');
    assert.equal(build.from, 'node:24-bookworm-slim');
    assert.match(runtime.from, /^(node:24-bookworm-slim|gcr\.io\/distroless\/nodejs24-debian12(:nonroot)?)$/);
    const runs = only(build, 'RUN').map((i) => i.args);
    assert.equal(runs.length, 2);
    assert.match(runs[0]!, /^npm ci( |$)/);
    assert.equal(words(runs[0]!).includes('--omit=dev'), false, 'the bundler is a devDependency');
    assert.equal(runs[1], 'npm run build');
    assert.deepEqual(only(runtime, 'RUN'), [], 'the runtime stage copies the bundle and runs nothing');
  });

  test('`pinset agent` is the default command, run from the bundle', () => {
    assert.deepEqual(execForm(only(runtime, 'ENTRYPOINT').at(-1)!), ['/app/dist/pinset.mjs'], 'the bundle, run by its own first line (node with its flags)');
    assert.deepEqual(execForm(only(runtime, 'CMD').at(-1)!), ['agent']);
    assert.equal(only(runtime, 'USER').length, 0, 'the agent runs as root (see the comment in the Containerfile); the controller Deployment sets its own uid');
  });

  test('.dockerignore keeps what the COPY lines need and drops local state', () => {
    for (const p of ['package.json', 'package-lock.json', 'src/cli/main.ts', 'src/api/reference.ts', 'proto/cri-image.proto', 'scripts/build.ts', 'scripts/bundle-shims/undici.cjs', 'deploy/kustomization.yaml']) assert.equal(isIgnored(p), false, p);
    for (const p of ['node_modules/ajv/package.json', 'dist/pinset.mjs', '.git/config', 'test/unit/crd.test.ts']) assert.equal(isIgnored(p), true, p);
  });

  describe('replayed without a container engine', () => {
    let tmp: string;
    const roots = new Map<string, string>();
    const workdirs = new Map<string, string>();
    const env: Record<string, string> = {};

    before(async () => {
      tmp = await mkdtemp(path.join(os.tmpdir(), 'pinset-image-'));
    });
    after(async () => {
      await rm(tmp, { recursive: true, force: true });
    });

    /** A path inside a stage's root file system. */
    const inStage = (stage: string, p: string) => path.join(roots.get(stage)!, p);

    async function copy(stage: Stage, ins: Instruction, cwd: string): Promise<void> {
      const parts = ins.args.split(/\s+/);
      const from = parts[0]!.startsWith('--from=') ? parts.shift()!.slice('--from='.length) : undefined;
      assert.ok(!parts[0]!.startsWith('--'), `line ${ins.line}: COPY flag ${parts[0]} not replayed`);
      const dest = parts.pop()!;
      const destAbs = path.posix.resolve(cwd, dest);
      const intoFolder = dest.endsWith('/') || parts.length > 1;
      for (const src of parts) {
        let source: string;
        let filter: ((s: string) => boolean) | undefined;
        if (from !== undefined) {
          assert.ok(roots.has(from), `line ${ins.line}: no stage ${from} before this one`);
          source = inStage(from, path.posix.resolve(workdirs.get(from) ?? '/', src));
        } else {
          assert.equal(isIgnored(src), false, `line ${ins.line}: ${src} is excluded by .dockerignore`);
          source = path.join(ROOT, src);
          filter = (s) => !isIgnored(path.relative(ROOT, s).split(path.sep).join('/'));
        }
        assert.ok(existsSync(source), `line ${ins.line}: ${src} does not exist`);
        // A folder's contents are copied, not the folder itself.
        const target = (await stat(source)).isDirectory() || !intoFolder ? inStage(stage.name, destAbs) : inStage(stage.name, path.posix.join(destAbs, path.basename(src)));
        await mkdir(path.dirname(target), { recursive: true });
        await cp(source, target, { recursive: true, filter, verbatimSymlinks: true });
      }
    }

    test('every stage replays: COPY, WORKDIR, ENV and the npm lines', { timeout: 300_000 }, async () => {
      for (const stage of stages) {
        roots.set(stage.name, path.join(tmp, `stage-${stage.name}`));
        await mkdir(roots.get(stage.name)!, { recursive: true });
        let cwd = '/';
        for (const ins of stage.instructions) {
          switch (ins.op) {
            case 'WORKDIR':
              cwd = path.posix.resolve(cwd, ins.args);
              await mkdir(inStage(stage.name, cwd), { recursive: true });
              break;
            case 'ENV': {
              const m = /^([A-Za-z_][A-Za-z0-9_]*)=(\S*)$/.exec(ins.args);
              assert.ok(m, `line ${ins.line}: only ENV NAME=value is replayed`);
              if (stage === runtime) env[m[1]!] = m[2]!;
              break;
            }
            case 'COPY':
              await copy(stage, ins, cwd);
              break;
            case 'RUN': {
              const [cmd, ...args] = words(ins.args);
              assert.equal(cmd, 'npm', `line ${ins.line}: only npm ci and npm run build are replayed`);
              assert.ok(args[0] === 'ci' || (args[0] === 'run' && args[1] === 'build' && args.length === 2), `line ${ins.line}: only npm ci and npm run build are replayed`);
              // --prefer-offline: the npm cache of this machine serves what it holds.
              // Node.js 24 first on PATH, as in the node:24 image.
              const extra = args[0] === 'ci' ? ['--prefer-offline', '--no-audit', '--no-fund'] : [];
              await promisify(execFile)('npm', [...args, ...extra], {
                cwd: inStage(stage.name, cwd),
                env: { ...process.env, PATH: `${path.dirname(NODE)}${path.delimiter}${process.env.PATH ?? ''}`, npm_config_update_notifier: 'false' },
                maxBuffer: 16 << 20,
              });
              break;
            }
            case 'ENTRYPOINT':
            case 'CMD':
              break;
            default:
              assert.fail(`line ${ins.line}: ${ins.op} is not replayed by this test; teach it`);
          }
        }
        workdirs.set(stage.name, cwd);
      }
      // The bundle inlines every dependency: nothing from npm is in the runtime image, nor the sources.
      assert.equal(existsSync(inStage(runtime.name, '/app/node_modules')), false, 'no node_modules in the runtime image');
      assert.equal(existsSync(inStage(runtime.name, '/app/src')), false, 'no sources in the runtime image');
      assert.ok(existsSync(inStage(runtime.name, '/app/dist/pinset.mjs')));
      assert.ok(existsSync(inStage(runtime.name, '/app/dist/proto/cri-image.proto')));
      assert.ok(existsSync(inStage(runtime.name, '/app/dist/licenses.txt')));
    });

    /** ENTRYPOINT + CMD (or `command` in place of CMD) in the replayed runtime stage. */
    function runImage(command: string[] | null, extra: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
      const argv = [...execForm(only(runtime, 'ENTRYPOINT').at(-1)!), ...(command ?? execForm(only(runtime, 'CMD').at(-1)!)), ...extra];
      // The program as the kernel runs it: through its #! line, which finds `node` on PATH (this repository's Node.js 24).
      const [program, ...args] = argv.map((a) => (a.startsWith('/app/') ? inStage(runtime.name, a) : a));
      return new Promise((resolve, reject) => {
        const child = spawn(program!, args, {
          cwd: inStage(runtime.name, workdirs.get(runtime.name)!),
          // The image's environment, not this machine's: no NODE_NAME, no KUBECONFIG.
          env: { PATH: `${path.dirname(NODE)}:/usr/bin:/bin`, HOME: tmp, ...env },
          stdio: ['ignore', 'pipe', 'pipe'],
        });
        let stdout = '';
        let stderr = '';
        child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
        child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
        child.on('error', reject);
        child.on('close', (code) => resolve({ code, stdout, stderr }));
      });
    }

    test('ENTRYPOINT + CMD --help: the agent starts and prints its help', { timeout: 60_000 }, async () => {
      assert.ok(workdirs.has(runtime.name), 'the replay above must have run');
      const result = await runImage(null, ['--help']);
      assert.equal(result.code, 0, result.stderr);
      assert.match(result.stdout, /^usage: pinset agent/);
      assert.match(result.stdout, /--node-name/);
    });

    test('the image\'s agent loads its CRI client and proto/ from the bundle (agent --once, no runtime there)', { timeout: 60_000 }, async () => {
      assert.ok(workdirs.has(runtime.name), 'the replay above must have run');
      const scratch = path.join(tmp, 'once');
      await mkdir(path.join(scratch, 'sets.d'), { recursive: true });
      await mkdir(path.join(scratch, 'crio.conf.d'));
      const socket = path.join(scratch, 'no-runtime.sock');
      const result = await runImage(['agent'], [
        '--once', '--node-name', 'image-test', '--static-dir', path.join(scratch, 'sets.d'), '--cri-endpoint', `unix://${socket}`,
        '--crio-dropin-dir', path.join(scratch, 'crio.conf.d'), '--state-dir', path.join(scratch, 'state'), '--reload', 'none', '--auth-file', path.join(scratch, 'none.json'),
      ]);
      assert.doesNotMatch(result.stderr, /ERR_MODULE_NOT_FOUND|Cannot find (module|package)|no such file.*\.proto/i, result.stderr);
      assert.match(result.stderr, /"msg":"pinset agent starting"/, result.stderr);
      // The gRPC client was made from the proto and tried the socket (gRPC's UNAVAILABLE, naming it).
      assert.match(result.stderr, /UNAVAILABLE[^"\n]*no-runtime\.sock/, result.stderr);
      assert.notEqual(result.code, null, 'the agent exits by itself');
    });
  });
});
