// The image scripts/build-image.sh builds from the Containerfile:
// localhost/pinset:dev in the local containers storage, and the same image
// as an OCI layout (.cache/image/oci, tag `dev`, described by
// .cache/image/image.json) for whatever loads it elsewhere (`skopeo copy
// oci:.cache/image/oci:dev docker://...`). Tests run it with podman, as the
// DaemonSet runs it: uid 0, no capabilities, a read-only root file system,
// host paths mounted, with the OCI runtime chosen for the host's cgroup
// layout (./oci-runtime.ts: runc, which runs on every layout). Under CI (.ci/setup builds it) a missing or stale
// image fails the test; elsewhere the test is skipped, saying how to build it.
import { execFile, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import type { TestContext } from 'node:test';
import { promisify } from 'node:util';
import { sourceHash, ROOT } from '../../scripts/build.ts';
import { AgentProcess } from './agent-process.ts';
import { findBinary, isCI, missingMessage, trackChild } from './components.ts';
import { hostOciRuntime } from './oci-runtime.ts';

const run = promisify(execFile);

export const IMAGE = process.env.PINSET_IMAGE || 'localhost/pinset:dev';
export const IMAGE_CACHE = process.env.PINSET_IMAGE_CACHE || path.join(ROOT, '.cache/image');
/** The OCI layout of the image, as a containers-image reference (skopeo, buildah, podman). */
export const IMAGE_LAYOUT_REF = `oci:${path.join(IMAGE_CACHE, 'oci')}:dev`;
export const BUILD_COMMAND = 'sudo bash scripts/build-image.sh';

let checked: Promise<string | null> | undefined;

/** Why the image cannot be used for a test of these sources, or null (asked once per test process). */
export function imageProblem(): Promise<string | null> {
  checked ??= findImageProblem();
  return checked;
}

async function findImageProblem(): Promise<string | null> {
  const podman = findBinary('podman');
  if (!podman) return missingMessage(['podman']);
  if (process.getuid?.() !== 0) return 'running the image needs root here (its storage is the system one): run the end-to-end tests as root';
  const oci = hostOciRuntime();
  if (!oci.runtime) return oci.problem;
  try {
    await run(podman, ['image', 'exists', IMAGE]);
  } catch {
    return `no image ${IMAGE} in the local containers storage: build it with \`${BUILD_COMMAND}\``;
  }
  // What the image's bundle was built from (scripts/build.ts writes it), against the sources here.
  let info: { sourceHash?: string };
  try {
    const { stdout } = await run(podman, [...runtimeArgs(), 'run', '--rm', ...ulimitArgs(), '--network', 'none', '--entrypoint', 'cat', IMAGE, '/app/dist/build-info.json']);
    info = JSON.parse(stdout) as { sourceHash?: string };
  } catch (e) {
    return `cannot read /app/dist/build-info.json from ${IMAGE}: ${(e as Error).message.trim().slice(0, 400)}`;
  }
  if (info.sourceHash !== (await sourceHash())) {
    return `${IMAGE} was built from other sources than these (src/, proto/, deploy/, scripts/ or the dependencies changed since): build it again with \`${BUILD_COMMAND}\``;
  }
  return null;
}

/**
 * True when the image can be used. Otherwise, under CI, throws (the test
 * fails); elsewhere skips the test with the reason, also on stderr, and
 * returns false: the caller must return at once.
 */
export async function requireImage(t: TestContext): Promise<boolean> {
  const problem = await imageProblem();
  if (!problem) return true;
  if (isCI()) throw new Error(`CI=true and ${problem}`);
  process.stderr.write(`\n*** SKIPPED image test "${t.name}": ${problem} ***\n\n`);
  t.skip(`SKIPPED: ${problem}`);
  return false;
}

/** `--runtime <path>` for podman run: the OCI runtime chosen for this host (./oci-runtime.ts). */
export function runtimeArgs(): string[] {
  const oci = hostOciRuntime();
  if (!oci.runtime) throw new Error(oci.problem);
  return ['--runtime', oci.path];
}

/**
 * --ulimit values podman can apply here. Its defaults (open files 1048576)
 * are above this machine's hard limits, and raising a hard limit needs
 * CAP_SYS_RESOURCE, which root lacks in these VMs: runc then fails with
 * "error setting rlimits". The container gets this process's open-file
 * limit and 4096 processes (podman's own runtime runs with fewer than this
 * shell allows).
 */
export function ulimitArgs(): string[] {
  let nofile = 1024;
  try {
    const m = /^Max open files\s+\S+\s+(\d+)/m.exec(readFileSync('/proc/self/limits', 'utf8'));
    if (m) nofile = Math.min(Number(m[1]), 1048576);
  } catch {
    // not Linux: keep the small default
  }
  return ['--ulimit', `nofile=${nofile}:${nofile}`, '--ulimit', 'nproc=4096:4096'];
}

export interface ContainerRun {
  code: number | null;
  stdout: string;
  stderr: string;
}

export interface RunImageOptions {
  /** host path -> container path, with `:ro` appended for read-only. */
  volumes?: string[];
  env?: Record<string, string>;
  /** The DaemonSet's readOnlyRootFilesystem (default true). */
  readOnly?: boolean;
  timeoutMs?: number;
  /** The image to run; default IMAGE. */
  image?: string;
}

/**
 * `podman run` of the image with `args` after its ENTRYPOINT, as the
 * DaemonSet's container runs: uid 0, every capability dropped, no privilege
 * escalation, a read-only root file system, the host's network (as the
 * agent reaches a loopback registry).
 */
function runArgv(name: string, args: string[], opts: RunImageOptions): string[] {
  return [
    ...runtimeArgs(),
    'run', '--rm', '--name', name,
    '--network', 'host',
    '--user', '0:0',
    '--cap-drop', 'all',
    '--security-opt', 'no-new-privileges',
    ...(opts.readOnly === false ? [] : ['--read-only']),
    ...ulimitArgs(),
    ...(opts.volumes ?? []).flatMap((v) => ['--volume', v]),
    ...Object.entries(opts.env ?? {}).flatMap(([k, v]) => ['--env', `${k}=${v}`]),
    opts.image ?? IMAGE,
    ...args,
  ];
}

function podmanBinary(): string {
  const podman = findBinary('podman');
  if (!podman) throw new Error(missingMessage(['podman']));
  return podman;
}

/** Runs the image to its end (see runArgv); removed afterwards, also on timeout. */
export async function runImage(args: string[], opts: RunImageOptions = {}): Promise<ContainerRun> {
  const podman = podmanBinary();
  const name = `pinset-test-${randomBytes(4).toString('hex')}`;
  const child = spawn(podman, runArgv(name, args, opts), { stdio: ['ignore', 'pipe', 'pipe'] });
  trackChild(child);
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
  child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    child.kill('SIGKILL');
  }, opts.timeoutMs ?? 120_000);
  try {
    const code = await new Promise<number | null>((resolve, reject) => {
      child.once('error', reject);
      child.once('close', (c) => resolve(c));
    });
    if (timedOut) throw new Error(`podman run ${args.join(' ')} did not end in ${opts.timeoutMs ?? 120_000} ms\n${stderr.slice(-3000)}`);
    return { code, stdout, stderr };
  } finally {
    clearTimeout(timer);
    // The container, should podman have been killed before it removed it.
    await run(podman, ['rm', '--force', '--ignore', '--time', '0', name]).catch(() => {});
  }
}

/**
 * The image run as the kubelet runs the DaemonSet's container, until it is
 * stopped: `agent` logs (JSON lines on stdout) parsed as they arrive
 * (AgentProcess), stopped as the kubelet stops a pod (the stop signal,
 * SIGTERM, then SIGKILL once the grace period has passed: `podman stop
 * --time`) or killed at once (SIGKILL, no stop hook at all).
 */
export class ImageContainer {
  readonly name: string;
  readonly image: string;
  /** The `podman run` process, attached to the container: its log lines, its exit status (the container's). */
  readonly process: AgentProcess;

  private constructor(name: string, image: string, process: AgentProcess) {
    this.name = name;
    this.image = image;
    this.process = process;
  }

  static start(args: string[], opts: Omit<RunImageOptions, 'timeoutMs'> = {}): ImageContainer {
    const name = `pinset-test-${randomBytes(4).toString('hex')}`;
    const child = spawn(podmanBinary(), runArgv(name, args, opts), { stdio: ['ignore', 'pipe', 'pipe'] });
    return new ImageContainer(name, opts.image ?? IMAGE, AgentProcess.attach(child));
  }

  get running(): boolean {
    return this.process.running;
  }

  /** The ID of the image the container runs (podman inspect), once it exists. */
  async imageId(): Promise<string> {
    const { stdout } = await run(podmanBinary(), ['container', 'inspect', '--format', '{{.Image}}', this.name]);
    return stdout.trim();
  }

  /** As the kubelet stops a pod's container: SIGTERM, SIGKILL after `graceSeconds`. Resolves with the exit status. */
  async stop(graceSeconds: number): Promise<number | null> {
    await run(podmanBinary(), ['stop', '--time', String(graceSeconds), this.name], { timeout: (graceSeconds + 30) * 1000 }).catch(() => {});
    return this.process.exited;
  }

  /** SIGKILL, as a node's OOM killer or a crash would stop it. Resolves with the exit status. */
  async kill(): Promise<number | null> {
    await run(podmanBinary(), ['kill', '--signal', 'KILL', this.name]).catch(() => {});
    return this.process.exited;
  }

  /** Gone, whatever state it is in. Safe to call twice. */
  async remove(): Promise<void> {
    await run(podmanBinary(), ['rm', '--force', '--ignore', '--time', '0', this.name]).catch(() => {});
    if (this.process.running) this.process.child.kill('SIGKILL');
    await this.process.exited;
  }
}

/**
 * A build of the image apart from IMAGE: a working container from it, one
 * label, committed under `tag` (buildah). Its image ID differs from
 * IMAGE's and from any other such build's; the bundle inside is the same.
 * Remove it with removeImage().
 */
export async function buildVariant(tag: string, label: Record<string, string>): Promise<string> {
  const buildah = findBinary('buildah');
  if (!buildah) throw new Error(missingMessage(['buildah']));
  const { stdout: ctr } = await run(buildah, ['from', '--pull-never', '--quiet', IMAGE]);
  const container = ctr.trim();
  try {
    await run(buildah, ['config', ...Object.entries(label).flatMap(([k, v]) => ['--label', `${k}=${v}`]), container]);
    const { stdout: id } = await run(buildah, ['commit', '--quiet', container, tag]);
    return id.trim();
  } finally {
    await run(buildah, ['rm', container]).catch(() => {});
  }
}

/** Removes a tag this test process made (never IMAGE). */
export async function removeImage(tag: string): Promise<void> {
  if (tag === IMAGE) throw new Error(`refusing to remove ${IMAGE}: other tests use it`);
  await run(podmanBinary(), ['rmi', '--ignore', tag]).catch(() => {});
}

/** The tags of a repository in the local storage (`localhost/name`), e.g. to find what an earlier run left behind. */
export async function imageTags(repository: string): Promise<string[]> {
  const { stdout } = await run(podmanBinary(), ['images', '--format', '{{.Repository}}:{{.Tag}}', '--filter', `reference=${repository}`]);
  return stdout.split('\n').filter((l) => l.startsWith(`${repository}:`));
}
