// `npm run demo`: pinset on one local node in a minute, with no cluster and
// no network. Starts an OCI registry and containerd 1.7 (Debian trixie's,
// unpacked by .ci/setup into .cache/containerd-1.7) on loopback in a
// temporary folder, pushes a few images, writes the example sets of
// examples/demo-set.yaml (with the pushed digests) into a static folder,
// runs `pinset agent --once` against containerd's socket, and shows what it
// did: the images pulled and pinned (CRI's `pinned`, the label that pins
// them). Everything it starts is stopped by PID before it exits.
import { spawn } from 'node:child_process';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { stringify as dumpYaml } from 'yaml';
import { parseYamlDocuments } from '../src/api/yaml.ts';
import type { NodeSetStatus, PinnedImageSet } from '../src/api/types.ts';
import { ContainerdImages } from '../src/containerd/images.ts';
import { PIN_LABEL } from '../src/containerd/label-pins.ts';
import { COMPONENTS, installCommand, missingComponents, type ComponentName } from '../test/support/components.ts';
import { Containerd, containerdComponent, CriClient } from '../test/support/containerd.ts';
import { pushMultiArch, pushMultiLayer, pushSingleLayer, type PushedImage } from '../test/support/images.ts';
import { Registry } from '../test/support/registry.ts';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const SET_FILE = path.join(ROOT, 'examples', 'demo-set.yaml');
const NODE = 'demo-node';
const NEEDS: ComponentName[] = [containerdComponent('1.7'), 'runc', 'docker-registry'];

function say(line = ''): void {
  process.stdout.write(`${line}\n`);
}

function preflight(): string | null {
  const missing = missingComponents(NEEDS);
  if (missing.length > 0) {
    return `the demo needs ${missing.map((n) => COMPONENTS[n].binary).join(', ')}, which ${missing.length === 1 ? 'is' : 'are'} not installed. Install with:\n\n  ${installCommand(missing)}\n`;
  }
  if (process.getuid?.() !== 0) {
    return 'the demo runs containerd, which needs root here: run it as root (e.g. sudo npm run demo).\n';
  }
  return null;
}

/** Replace each reference's digest with the one pushed for its repository. */
function withPushedDigests(docs: PinnedImageSet[], pushed: Map<string, PushedImage>): PinnedImageSet[] {
  return docs.map((set) => ({
    ...set,
    spec: {
      ...set.spec,
      pinnedImages: set.spec.pinnedImages.map((img) => {
        const repo = img.name.slice(0, img.name.indexOf('@'));
        const hit = pushed.get(repo);
        if (!hit) throw new Error(`${SET_FILE}: no image pushed for ${repo}`);
        return { name: hit.ref };
      }),
    },
  }));
}

function runAgent(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const env = { ...process.env };
  delete env.KUBECONFIG;
  for (const k of Object.keys(env)) if (k.startsWith('PINSET_')) delete env[k];
  const child = spawn(process.execPath, [path.join(ROOT, 'src', 'cli', 'main.ts'), 'agent', ...args], { env, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
  child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
  return new Promise((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code) => resolve({ code, stdout, stderr }));
  });
}

function describeSet(s: NodeSetStatus): string {
  const i = s.images;
  const counts = `wanted ${i.wanted}, present ${i.present}, pinned ${i.pinned}, failed ${i.failed}, invalid ${i.invalid}`;
  return `  ${s.name.padEnd(18)} ${s.phase.padEnd(12)} ${s.reason.padEnd(18)} ${counts}${s.message ? `\n  ${''.padEnd(18)} ${s.message}` : ''}`;
}

async function main(): Promise<number> {
  const problem = preflight();
  if (problem) {
    process.stderr.write(`pinset demo: ${problem}`);
    return 1;
  }

  const work = await mkdtemp(path.join(os.tmpdir(), 'pinset-demo-'));
  let registry: Registry | undefined;
  let containerd: Containerd | undefined;
  let stopping: Promise<void> | undefined;
  const stopAll = () =>
    (stopping ??= (async () => {
      await containerd?.stop();
      await registry?.stop();
      await rm(work, { recursive: true, force: true });
    })());
  const onSignal = (sig: NodeJS.Signals) => {
    process.stderr.write(`\npinset demo: ${sig}, stopping everything\n`);
    void stopAll().then(() => process.exit(130));
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);

  try {
    say('pinset demo: one node, a local registry, containerd, and the agent run once.\n');
    registry = await Registry.start();
    say(`registry    distribution on ${registry.url} (pid ${registry.pid}), known to containerd as registry.test`);
    containerd = await Containerd.start({ version: '1.7', mirrors: { 'registry.test': registry.url } });
    say(`containerd  1.7 (CRI and its Images service) on ${containerd.endpoint} (pid ${containerd.pid}), native snapshotter\n`);

    const pushed = new Map<string, PushedImage>();
    for (const img of [
      await pushSingleLayer(registry, 'demo/hello'),
      await pushMultiLayer(registry, 'demo/layered', 3),
      await pushMultiArch(registry, 'demo/multiarch'),
      await pushSingleLayer(registry, 'demo/gpu-tools'),
    ]) {
      pushed.set(`registry.test/${img.repo}`, img);
      say(`pushed      ${img.ref}`);
    }

    const staticDir = path.join(work, 'sets.d');
    await mkdir(staticDir);
    const docs = parseYamlDocuments(await readFile(SET_FILE, 'utf8')).map((d) => ('value' in d ? d.value : null)).filter(Boolean) as PinnedImageSet[];
    const sets = withPushedDigests(docs, pushed);
    await writeFile(path.join(staticDir, 'demo-set.yaml'), sets.map((s) => dumpYaml(s)).join('---\n'));
    say(`\nsets        ${sets.map((s) => s.metadata.name).join(', ')} (from examples/demo-set.yaml) in ${staticDir}`);

    const args = [
      '--once',
      '--node-name', NODE,
      '--node-labels', 'pinset.dev/demo-gpu=true',
      '--static-dir', staticDir,
      '--cri-endpoint', containerd.endpoint,
      '--crio-dropin-dir', path.join(work, 'no-crio', 'crio.conf.d'),
      '--state-dir', path.join(work, 'state'),
      '--auth-file', path.join(work, 'no-auth.json'),
      '--metrics-addr', '',
    ];
    say(`\n$ pinset agent ${args.join(' ')}\n`);
    const started = Date.now();
    const result = await runAgent(args);
    const took = Date.now() - started;

    const statuses: NodeSetStatus[] = [];
    for (const line of result.stdout.split('\n')) if (line.trim()) statuses.push(JSON.parse(line) as NodeSetStatus);
    say(`result (exit code ${result.code}, ${took} ms):`);
    for (const s of statuses) say(describeSet(s));
    const reported = new Set(statuses.map((s) => s.name));
    for (const s of sets) if (!reported.has(s.metadata.name)) say(`  ${s.metadata.name.padEnd(18)} not selected by this node`);

    const cri = new CriClient(containerd.endpoint);
    const records = new ContainerdImages(containerd.endpoint);
    try {
      const images = await cri.listImages();
      say(`\ncontainerd now holds (CRI ListImages; pinned: the kubelet's image garbage collection skips the image):`);
      for (const img of images) {
        const label = (await records.get(img.id))?.labels[PIN_LABEL];
        say(`  ${img.repoDigests.join(', ')}\n    ${img.id.slice(0, 19)}  ${img.size} bytes  pinned: ${img.pinned}${label ? `  (label ${PIN_LABEL}=${label} on ${img.id.slice(0, 19)})` : ''}`);
      }
    } finally {
      records.close();
      cri.close();
    }

    if (result.code !== 0) {
      say(`\nthe agent's log (stderr):\n${result.stderr.trimEnd()}`);
      return 1;
    }
    say(`\nThe kubelet keeps pinned images through its garbage collection; on CRI-O the same sets pin through a drop-in (docs/runtimes.md).`);
    return 0;
  } finally {
    await stopAll();
    say('stopped     containerd and the registry; temporary files removed.');
  }
}

main().then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    process.stderr.write(`pinset demo: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exitCode = 1;
  },
);
