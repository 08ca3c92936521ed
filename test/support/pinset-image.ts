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
}

/**
 * `podman run` of the image with `args` after its ENTRYPOINT, as the
 * DaemonSet's container runs: uid 0, every capability dropped, no privilege
 * escalation, a read-only root file system, the host's network (as the
 * agent reaches a loopback registry). Removed afterwards, also on timeout.
 */
export async function runImage(args: string[], opts: RunImageOptions = {}): Promise<ContainerRun> {
  const podman = findBinary('podman');
  if (!podman) throw new Error(missingMessage(['podman']));
  const name = `pinset-test-${randomBytes(4).toString('hex')}`;
  const argv = [
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
    IMAGE,
    ...args,
  ];
  const child = spawn(podman, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
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
