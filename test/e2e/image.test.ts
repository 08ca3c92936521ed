// The agent from the image (scripts/build-image.sh builds it from the
// Containerfile), run by podman as the DaemonSet runs it: ENTRYPOINT and
// `agent`, uid 0 without capabilities, a read-only root file system, the
// node's /etc/crio mounted read-write as one folder, /var/lib/pinset (the
// node lock) read-write, the runtime's socket
// and storage read-only, static sets and the kubelet's credentials
// read-only. The runtime is a real containerd with a real registry on
// loopback; containerd 1.6 reports no pins, so with CRI-O's drop-in as the
// pin backend (--pin-backend crio) "pinned" means "in the pin file" (as in
// agent.test.ts). Then the mounts a user might write instead: only
// /etc/crio/crio.conf.d. Last, the image
// on containerd 1.7 (its socket and pin backend named by flags): pins through image labels.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { mkdir, mkdtemp, readdir, rm, stat, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, afterEach, before, beforeEach, describe, test } from 'node:test';
import { stringify as dumpYaml } from 'yaml';
import type { NodeSetStatus, PinnedImageSet } from '../../src/api/types.ts';
import { findBinary, missingComponents, requireComponents, type ComponentName } from '../support/components.ts';
import { Containerd, containerdComponent, CriClient } from '../support/containerd.ts';
import { pushMultiLayer, pushSingleLayer, type PushedImage } from '../support/images.ts';
import { readPinFile } from '../support/agent-process.ts';
import { IMAGE, requireImage, runImage, runtimeArgs, ulimitArgs, type ContainerRun } from '../support/pinset-image.ts';
import { crunRefuses, describeCgroups, hostCgroups, hostOciRuntime } from '../support/oci-runtime.ts';
import { Registry } from '../support/registry.ts';

const execFileP = promisify(execFile);
const NEEDS: ComponentName[] = ['containerd', 'runc', 'docker-registry', 'podman'];
const NODE = 'image-node';

function set(name: string, images: PushedImage[]): PinnedImageSet {
  return { apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name }, spec: { pinnedImages: images.map((i) => ({ name: i.ref })) } };
}

function setsOf(r: ContainerRun): NodeSetStatus[] {
  return r.stdout.split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l) as NodeSetStatus);
}

function logLines(r: ContainerRun): Record<string, unknown>[] {
  return r.stderr.split('\n').flatMap((l) => {
    try {
      return [JSON.parse(l) as Record<string, unknown>];
    } catch {
      return [];
    }
  });
}

describe('pinset agent from the image, on containerd', () => {
  let registry: Registry;
  let containerd: Containerd;
  let cri: CriClient;
  let ready = false;
  let work: string;
  /** The node's /etc/crio. */
  let etcCrio: string;
  let dropIn: string;
  /** The node's /var/lib/pinset: the node lock. */
  let state: string;
  let sets: string;
  let authFile: string;

  before(async () => {
    if (missingComponents(NEEDS).length > 0 || process.getuid?.() !== 0) return; // each test reports it
    registry = await Registry.start();
    containerd = await Containerd.start({ mirrors: { 'registry.test': registry.url } });
    cri = new CriClient(containerd.endpoint);
    ready = true;
  });

  after(async () => {
    cri?.close();
    await containerd?.stop();
    await registry?.stop();
  });

  beforeEach(async () => {
    if (!ready) return;
    work = await mkdtemp(path.join(os.tmpdir(), 'pinset-e2e-image-'));
    etcCrio = path.join(work, 'etc-crio');
    dropIn = path.join(etcCrio, 'crio.conf.d');
    state = path.join(work, 'var-lib-pinset');
    sets = path.join(work, 'sets.d');
    authFile = path.join(work, 'config.json');
    await mkdir(dropIn, { recursive: true });
    await mkdir(state);
    await mkdir(sets);
    await writeFile(authFile, JSON.stringify({ auths: {} }), { mode: 0o600 });
  });

  afterEach(async () => {
    if (work) await rm(work, { recursive: true, force: true });
  });

  /**
   * `agent --once` in the image with the DaemonSet's paths (the flags'
   * defaults: /etc/crio/crio.conf.d, /etc/pinset/sets.d,
   * /var/lib/kubelet/config.json), NODE_NAME from the environment as the
   * DaemonSet sets it, and containerd's folder (socket and image
   * filesystem) read-only at its own path.
   */
  function runAgent(crioMounts: string[], opts: { readOnly?: boolean } = {}): Promise<ContainerRun> {
    return runImage(['agent', '--once', '--cri-endpoint', containerd.endpoint, '--reload', 'none', '--pin-backend', 'crio'], {
      volumes: [...crioMounts, `${state}:/var/lib/pinset`, `${containerd.dir}:${containerd.dir}:ro`, `${sets}:/etc/pinset/sets.d:ro`, `${authFile}:/var/lib/kubelet/config.json:ro`],
      env: { NODE_NAME: NODE },
      readOnly: opts.readOnly,
    });
  }

  test("the image runs with the OCI runtime chosen for this host's cgroup layout, which says which", async (t) => {
    if (!requireComponents(t, NEEDS) || !(await requireImage(t))) return;
    const oci = hostOciRuntime();
    assert.ok(oci.runtime, oci.runtime ? '' : oci.problem);
    const cgroups = hostCgroups();
    t.diagnostic(`OCI runtime: ${oci.why}`);
    if (crunRefuses(cgroups)) assert.notEqual(oci.runtime, 'crun', describeCgroups(cgroups));
    // A container kept after it ends, so podman can say which runtime ran it.
    const podman = findBinary('podman')!;
    const name = `pinset-test-runtime-${process.pid}`;
    try {
      await execFileP(podman, [...runtimeArgs(), 'create', '--name', name, ...ulimitArgs(), '--network', 'none', '--read-only', '--cap-drop', 'all', IMAGE, '--help']);
      const { stdout } = await execFileP(podman, ['start', '--attach', name]);
      assert.match(stdout, /usage: pinset <command>/, 'pinset --help printed its usage');
      const { stdout: ran } = await execFileP(podman, ['inspect', '--format', '{{.OCIRuntime}} {{.State.ExitCode}}', name]);
      assert.equal(ran.trim(), `${oci.path} 0`, 'podman ran it with the chosen runtime, and it exited 0');
    } finally {
      await execFileP(podman, ['rm', '--force', '--ignore', name]).catch(() => {});
    }
  });

  test("the DaemonSet's mounts: the set Ready, the images in containerd, the pin file in the node's drop-in folder", async (t) => {
    if (!requireComponents(t, NEEDS) || !(await requireImage(t))) return;
    const single = await pushSingleLayer(registry, 'image/single');
    const layered = await pushMultiLayer(registry, 'image/layered', 3);
    await writeFile(path.join(sets, 'sets.yaml'), dumpYaml(set('from-image', [single, layered])));

    const r = await runAgent([`${etcCrio}:/etc/crio`]);
    assert.equal(r.code, 0, r.stderr);
    const [s, ...rest] = setsOf(r);
    assert.deepEqual(rest, []);
    assert.deepEqual([s?.name, s?.source, s?.phase, s?.reason], ['from-image', 'static', 'Ready', 'AllImagesPinned']);
    assert.deepEqual(s?.images, { wanted: 2, present: 2, pinned: 2, failed: 0, invalid: 0 });
    const starting = logLines(r).find((l) => l.msg === 'pinset agent starting');
    assert.equal(starting?.dropInDir, '/etc/crio/crio.conf.d', 'the default drop-in folder, inside the container');

    const listed = await cri.listImages();
    for (const img of [single, layered]) assert.equal(listed.find((i) => i.repoDigests.includes(img.ref))?.id, img.id, `containerd holds ${img.ref}`);
    assert.deepEqual((await readPinFile(dropIn))?.pins, [single.ref, layered.ref].sort(), "the pin file, in the node's folder");
    assert.ok((await stat(path.join(state, 'agent.lock'))).isFile(), "the node lock in the node's /var/lib/pinset");
    assert.ok((await stat(path.join(etcCrio, '.pinset', 'agent.lock'))).isFile(), 'and where earlier versions kept it, taken too');
  });

  test('only crio.conf.d mounted: refused with what to mount instead, the pins kept; with a read-only root, no start at all', async (t) => {
    if (!requireComponents(t, NEEDS) || !(await requireImage(t))) return;
    const first = await pushSingleLayer(registry, 'image/first');
    const second = await pushSingleLayer(registry, 'image/second');
    await writeFile(path.join(sets, 'sets.yaml'), dumpYaml(set('apps', [first])));
    const ok = await runAgent([`${etcCrio}:/etc/crio`]);
    assert.equal(ok.code, 0, ok.stderr);
    const pinned = await readPinFile(dropIn);
    assert.deepEqual(pinned?.pins, [first.ref]);

    // A writable root: the staging folder /etc/crio/.pinset lands in the container, on another mount.
    await writeFile(path.join(sets, 'sets.yaml'), dumpYaml(set('apps', [first, second])));
    const r = await runAgent([`${dropIn}:/etc/crio/crio.conf.d`], { readOnly: false });
    assert.equal(r.code, 1, r.stderr);
    const s = setsOf(r)[0];
    assert.deepEqual([s?.phase, s?.reason], ['Degraded', 'PinFileWriteFailed']);
    assert.match(s?.message ?? '', /\/etc\/crio\/crio\.conf\.d is a mount point of its own, apart from the staging folder \/etc\/crio\/\.pinset: the pin file cannot be renamed into place \(EXDEV\)\. Mount \/etc\/crio read-write as one mount instead/);
    const atStart = logLines(r).find((l) => l.level === 'error' && /EXDEV/.test(String(l.msg)));
    assert.ok(atStart, `the error is logged at start\n${r.stderr.slice(-2000)}`);
    assert.ok(s?.message?.endsWith(String(atStart.msg)), 'the status and the log say the same');
    assert.deepEqual(await readPinFile(dropIn), pinned, 'the pin file is as it was');
    assert.deepEqual(await readdir(dropIn), [path.basename(pinned!.file)], 'nothing else in the drop-in folder');

    // The shipped DaemonSet's read-only root with the same mount: the staging folder cannot even be made.
    const ro = await runAgent([`${dropIn}:/etc/crio/crio.conf.d`]);
    assert.equal(ro.code, 2, ro.stderr);
    const refused = logLines(ro).find((l) => l.level === 'error');
    assert.match(String(refused?.msg), /the agent needs \/etc\/crio\/\.pinset and \/etc\/crio\/crio\.conf\.d writable, on one mount \(the DaemonSet mounts the host's \/etc\/crio at \/host\/etc\/crio, writable over its read-only \/etc;/);
    assert.deepEqual(await readPinFile(dropIn), pinned, 'the pin file is as it was');
  });

  test("on containerd 1.7, its socket and pin backend named by flags: the set Ready, the images pinned through their labels, no CRI-O folder", async (t) => {
    const needs: ComponentName[] = [containerdComponent('1.7'), 'runc', 'docker-registry', 'podman'];
    if (!requireComponents(t, needs) || !(await requireImage(t))) return;
    const c17 = await Containerd.start({ version: '1.7', mirrors: { 'registry.test': registry.url } });
    const cri17 = new CriClient(c17.endpoint);
    try {
      const img = await pushSingleLayer(registry, 'image/on-containerd');
      await writeFile(path.join(sets, 'sets.yaml'), dumpYaml(set('on-containerd', [img])));
      // The overlay's flags and mounts: containerd's folder read-only (socket and image filesystem), /var/lib/pinset for the lock,
      // containerd's registry hosts read-only at /etc/containerd/certs.d (they map registry.test to the loopback registry).
      const r = await runImage(['agent', '--once', '--cri-endpoint', c17.endpoint, '--pin-backend', 'containerd'], {
        volumes: [`${c17.dir}:${c17.dir}:ro`, `${state}:/var/lib/pinset`, `${sets}:/etc/pinset/sets.d:ro`, `${authFile}:/var/lib/kubelet/config.json:ro`, `${c17.certsDir}:/etc/containerd/certs.d:ro`],
        env: { NODE_NAME: NODE },
      });
      assert.equal(r.code, 0, r.stderr);
      const [s, ...rest] = setsOf(r);
      assert.deepEqual(rest, []);
      assert.deepEqual([s?.phase, s?.reason, s?.images.pinned], ['Ready', 'AllImagesPinned', 1]);
      assert.equal((await cri17.imageStatus(img.ref))?.pinned, true, 'containerd reports the image pinned');
      assert.ok((await stat(path.join(state, 'agent.lock'))).isFile(), 'the node lock in /var/lib/pinset');
      const estimate = logLines(r).find((l) => l.msg === 'disk estimate for the images to pull');
      assert.equal(estimate?.unknown, 0, `the size estimate reached registry.test through the mounted hosts: ${r.stderr}`);
    } finally {
      cri17.close();
      await c17.stop();
    }
  });
});
