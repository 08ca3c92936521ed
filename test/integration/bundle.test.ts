// The bundle (scripts/build.ts, `npm run build`) as the image and the systemd
// unit ship it. Built here into a folder outside the repository, so nothing
// in it can reach a node_modules folder: what runs, runs from dist/ alone.
// Checked: the freshness stamp the end-to-end tests rely on, that what the
// sources load lazily stays out of each command's start-up, an agent --once
// run from the bundle on a CRI-O stand-in node (pins confirmed after a reload
// through D-Bus, the lazily loaded D-Bus client included), and the controller
// from the bundle against the in-process API server (the Kubernetes client as
// the bundle trims it: scripts/build.ts pureModules, slimUndici).
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { cp, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { Metafile } from 'esbuild';
import { build, bundleProblem, hashbangNodeFlags, NODE_FLAGS } from '../../scripts/build.ts';
import { readPinFile } from '../support/agent-process.ts';
import { ApiServer, type KubeObject } from '../support/apiserver.ts';
import { requireComponents } from '../support/components.ts';
import { startCrioNode, type CrioNode } from '../support/crio-node.ts';

const IMAGE = `registry.test/bundle/app@sha256:${'a'.repeat(64)}`;

/** Packages (under node_modules) among an output file's inputs. */
function packagesOf(meta: Metafile, output: string): Set<string> {
  const out = new Set<string>();
  for (const input of Object.keys(meta.outputs[output]!.inputs)) {
    const m = /node_modules\/((?:@[^/]+\/)?[^/]+)\//.exec(input);
    if (m) out.add(m[1]!);
  }
  return out;
}

/** The output files loaded with `output`: through static imports only, or through dynamic import() too. */
function closure(meta: Metafile, output: string, withDynamic: boolean): string[] {
  const seen = new Set<string>([output]);
  const todo = [output];
  while (todo.length) {
    for (const imp of meta.outputs[todo.pop()!]!.imports) {
      if (imp.external || seen.has(imp.path)) continue;
      if (imp.kind !== 'import-statement' && !(withDynamic && imp.kind === 'dynamic-import')) continue;
      seen.add(imp.path);
      todo.push(imp.path);
    }
  }
  return [...seen];
}

function packagesLoaded(meta: Metafile, output: string, withDynamic: boolean): Set<string> {
  return new Set(closure(meta, output, withDynamic).flatMap((o) => [...packagesOf(meta, o)]));
}

/** The output file that the source module `entry` (a command's main, or the CLI) became. */
/** Run dist/pinset.mjs as a command (through its #! line, Node.js 24 first on PATH) from `cwd`, with nothing else of this machine's environment. */
function runBundle(dist: string, args: string[], cwd: string, env: Record<string, string> = {}): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const fullEnv = { PATH: `${path.dirname(process.execPath)}:/usr/bin:/bin`, ...env };
  return new Promise((resolve) => {
    execFile(path.join(dist, 'pinset.mjs'), args, { cwd, env: fullEnv, timeout: 50_000 }, (err, stdout, stderr) =>
      resolve({ code: err ? ((err as { code?: number }).code ?? null) : 0, stdout, stderr }),
    );
  });
}

function outputOf(meta: Metafile, entry: string): string {
  const found = Object.entries(meta.outputs).find(([, o]) => o.entryPoint === entry);
  assert.ok(found, `no output for ${entry}`);
  return found[0];
}

describe('the bundle', () => {
  let tmp: string;
  let dist: string;
  let meta: Metafile;

  before(async () => {
    tmp = await mkdtemp(path.join(os.tmpdir(), 'pinset-bundle-'));
    dist = path.join(tmp, 'dist');
    meta = (await build({ outdir: dist })).metafile;
  });
  after(async () => {
    await rm(tmp, { recursive: true, force: true });
  });

  test('records what it was built from; a missing or stale bundle is refused with what to run', async () => {
    assert.equal(await bundleProblem(dist), null);
    const infoFile = path.join(dist, 'build-info.json');
    const info = JSON.parse(await readFile(infoFile, 'utf8')) as { sourceHash: string };
    assert.match(info.sourceHash, /^[0-9a-f]{64}$/);
    await writeFile(infoFile, JSON.stringify({ ...info, sourceHash: '0'.repeat(64) }));
    assert.match((await bundleProblem(dist)) ?? '', /other sources.*npm run build/);
    await writeFile(infoFile, JSON.stringify(info));
    assert.match((await bundleProblem(path.join(tmp, 'nothing-here'))) ?? '', /no bundle.*npm run build/);
  });

  test('each program\'s first line runs Node.js with the flags the image and the systemd unit rely on', async () => {
    for (const program of ['pinset.mjs', 'kubectl-pinset.mjs']) {
      const text = await readFile(path.join(dist, program), 'utf8');
      assert.match(text, /^#!\/usr\/bin\/env -S node /, program);
      assert.deepEqual(hashbangNodeFlags(text), NODE_FLAGS, program);
    }
  });

  test('the CLI and the kubectl plugin load no dependency before they know the command', () => {
    assert.deepEqual([...packagesLoaded(meta, outputOf(meta, 'scripts/bundle-entries/pinset.ts'), false)], []);
    assert.deepEqual([...packagesLoaded(meta, outputOf(meta, 'src/cli/kubectl-pinset.ts'), false)], []);
  });

  test('both programs run from the bundle', { timeout: 60_000 }, async () => {
    const fixture = path.resolve(import.meta.dirname, '../fixtures/sets/good/minimal.yaml');
    const pinset = await runBundle(dist, ['validate', fixture], tmp);
    assert.equal(pinset.code, 0, pinset.stderr);
    assert.match(pinset.stdout, /valid/);
    const plugin = await new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
      execFile(path.join(dist, 'kubectl-pinset.mjs'), ['--help'], { cwd: tmp, env: { PATH: `${path.dirname(process.execPath)}:/usr/bin:/bin` } }, (err, stdout, stderr) =>
        resolve({ code: err ? ((err as { code?: number }).code ?? null) : 0, stdout, stderr }),
      );
    });
    assert.equal(plugin.code, 0, plugin.stderr);
    assert.match(plugin.stdout, /^usage: kubectl pinset /);
    assert.doesNotMatch(plugin.stdout, /\bagent\b/, 'the daemons are not kubectl verbs');
  });

  test('a command\'s modules come from the code cache baked into the bundle, wherever it is copied, and nothing is compiled anew', async () => {
    // Moved as the image and the systemd unit move it (the cache names its modules relative to itself).
    const moved = path.join(tmp, 'moved', 'lib');
    await mkdir(path.dirname(moved), { recursive: true });
    await cp(dist, moved, { recursive: true });
    const r = await runBundle(moved, ['agent', '--help'], tmp, { NODE_DEBUG_NATIVE: 'COMPILE_CACHE' });
    assert.equal(r.code, 0, r.stderr);
    const agent = path.basename(outputOf(meta, 'src/agent/boot/main.ts'));
    assert.match(r.stderr, new RegExp(`V8 code cache for ESM file://${moved}/${agent.replace('.', '\\.')} was accepted`), r.stderr);
    assert.doesNotMatch(r.stderr, /was rejected|writing cache for/, r.stderr);
  });

  test('the agent loads the Kubernetes client, prom-client, the D-Bus client and systeminformation only on demand', () => {
    const agent = outputOf(meta, 'src/agent/boot/main.ts');
    const eager = packagesLoaded(meta, agent, false);
    const lazy = packagesLoaded(meta, agent, true);
    for (const p of ['@kubernetes/client-node', 'undici', 'prom-client', '@homebridge/dbus-native', 'systeminformation']) {
      assert.equal(eager.has(p), false, `${p} is loaded when the agent starts`);
      assert.ok(lazy.has(p), `${p} is in the bundle, behind an import()`);
    }
    assert.ok(eager.has('@grpc/grpc-js'), 'the CRI client is part of every agent');
  });

  test('the controller does not load the agent\'s node-side clients', () => {
    const loaded = packagesLoaded(meta, outputOf(meta, 'src/controller/main.ts'), true);
    for (const p of ['@grpc/grpc-js', '@homebridge/dbus-native', 'systeminformation']) assert.equal(loaded.has(p), false, p);
  });

  describe('agent --once from the bundle, on a CRI-O stand-in node', () => {
    let node: CrioNode | undefined;
    after(async () => {
      await node?.stop();
    });

    test('pulls and pins a static set, with proto/ and every dependency from dist/', { timeout: 60_000 }, async (t) => {
      if (!requireComponents(t, ['dbus-daemon'])) return;
      node = await startCrioNode({ catalogue: { [IMAGE]: { size: 1000 } } });
      const work = path.join(tmp, 'node');
      await mkdir(path.join(work, 'sets.d'), { recursive: true });
      const set = { apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name: 'boot' }, spec: { pinnedImages: [{ name: IMAGE }] } };
      await writeFile(path.join(work, 'sets.d', 'boot.yaml'), JSON.stringify(set));
      const args = [
        'agent', '--once', '--node-name', 'bundle-node', '--static-dir', path.join(work, 'sets.d'),
        '--cri-endpoint', node.endpoint, '--crio-dropin-dir', node.dropInDir, '--state-dir', node.stateDir, '--reload', 'dbus',
        '--auth-file', path.join(work, 'none.json'),
      ];
      // From the temporary folder: nothing points back into this repository.
      const r = await runBundle(dist, args, tmp, node.env);
      assert.equal(r.code, 0, r.stderr);
      const sets = r.stdout.trim().split('\n').map((l) => JSON.parse(l) as { name: string; phase: string });
      assert.deepEqual(sets.map((s) => [s.name, s.phase]), [['boot', 'Ready']]);
      assert.equal(node.crio.pullCount(IMAGE), 1, 'the stand-in was asked to pull');
      assert.deepEqual((await readPinFile(node.dropInDir))?.pins, [IMAGE]);
    });
  });

  test('the controller from the bundle rolls the nodes up into a set\'s status, through the trimmed Kubernetes client', { timeout: 60_000 }, async (t) => {
    const api = await ApiServer.start();
    t.after(() => api.stop());
    const kubeconfig = await api.writeKubeconfig(tmp);
    api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name: 'node-a', labels: {} } });
    api.create({ apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name: 'web' }, spec: { pinnedImages: [{ name: IMAGE }] } } as unknown as KubeObject);
    const child = spawn(path.join(dist, 'pinset.mjs'), ['controller', '--kubeconfig', kubeconfig, '--leader-elect=false', '--metrics-addr', ''], {
      cwd: tmp,
      env: { PATH: `${path.dirname(process.execPath)}:/usr/bin:/bin` },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout.on('data', (d: Buffer) => (output += d.toString()));
    child.stderr.on('data', (d: Buffer) => (output += d.toString()));
    const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
    t.after(() => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    });
    const status = await api.waitFor(
      () => (api.get('pinnedimagesets', 'web') as { status?: { observedGeneration?: number; nodes?: { matched: number } } }).status,
      20_000,
      `the set's status from the bundled controller; its output:\n${output}`,
    );
    assert.equal(status?.observedGeneration, 1);
    assert.equal(status?.nodes?.matched, 1);
    child.kill('SIGTERM');
    assert.equal(await exited, 0, output);
  });
});
