// `pinset agent` on a containerd that cannot pin: Debian 12's 1.6.20, as a
// containerd node runs the agent (the bundle, `--pin-backend auto`). The
// node's inability to pin never hides what keeps a set's images away: a set
// that does not fit is NoSpace with the estimate's figures, a missing image
// is ImageNotFound, an image behind credentials the node lacks is
// Unauthorized, each naming RuntimeCannotPin beside it and none claiming
// the images are pre-loaded. Only a set whose images are all present is
// RuntimeCannotPin, and the node status says once that the node only
// pre-loads, which `pinset status` shows.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';
import { parseNodeStatus } from '../../src/api/node-status.ts';
import { STATUS_ANNOTATION, type NodeSetStatus, type NodeStatus, type PinnedImageSet } from '../../src/api/types.ts';
import { ApiServer } from '../support/apiserver.ts';
import { argvFor, bundledCli, runAgentOnce, type OnceResult } from '../support/agent-process.ts';
import { staticNode } from '../support/static-node.ts';
import { missingComponents, requireComponents, type ComponentName } from '../support/components.ts';
import { Containerd, containerdComponent, CriClient } from '../support/containerd.ts';
import { pushMultiArch, pushRandom, pushSingleLayer, unknownRef, type PushedImage } from '../support/images.ts';
import { Registry } from '../support/registry.ts';

const run = promisify(execFile);

const NEEDS: ComponentName[] = [containerdComponent('1.6'), 'runc', 'docker-registry', 'htpasswd'];
/** The image filesystem: as small as the one this was first seen on. */
const IMAGE_FS_BYTES = 40 * 1024 * 1024;
const VERSIONS_THAT_PIN = 'pins need 1.6.25 or later 1.6, 1.7.10 or later 1.7, or any 2.x';

function set(name: string, refs: string[]): PinnedImageSet {
  return { apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name }, spec: { pinnedImages: refs.map((r) => ({ name: r })) } };
}

/** The node status the agent logged (--once without an API logs it on stderr). */
function loggedNodeStatus(r: OnceResult): NodeStatus | undefined {
  const lines = r.stderr.split('\n').filter((l) => l.startsWith('{'));
  const statuses = lines.map((l) => JSON.parse(l) as { msg?: string; status?: NodeStatus }).filter((l) => l.msg === 'node status' && l.status);
  return statuses.at(-1)?.status;
}

/** How a message would claim the images are on the node. */
const PRELOADED = /pre-?load/i;

describe('pinset agent on containerd 1.6.20, which cannot pin', () => {
  let registry: Registry;
  let privateRegistry: Registry;
  let containerd: Containerd;
  let cri: CriClient;
  let work: string;
  let cli: string;
  let ready = false;

  before(async () => {
    cli = await bundledCli();
    if (missingComponents(NEEDS).length > 0 || process.getuid?.() !== 0) return; // each test reports it
    registry = await Registry.start();
    privateRegistry = await Registry.start({ auth: { username: 'puller', password: 'Pr1vate-pw-6e0d1a' } });
    containerd = await Containerd.start({ rootBytes: IMAGE_FS_BYTES, mirrors: { 'registry.test': registry.url, 'private.registry.test': privateRegistry.url } });
    cri = new CriClient(containerd.endpoint);
    work = await mkdtemp(path.join(os.tmpdir(), 'pinset-e2e-cannot-pin-'));
    ready = true;
  });

  after(async () => {
    cri?.close();
    await containerd?.stop();
    await registry?.stop();
    await privateRegistry?.stop();
    if (work) await rm(work, { recursive: true, force: true });
  });

  /** A node of its own: a static folder, no CRI-O folder, no credentials; the size estimate reads containerd's own registry hosts. */
  async function node(name: string) {
    const n = await staticNode(path.join(work, name), name, containerd.endpoint, { extra: ['--containerd-hosts-dir', containerd.certsDir] });
    return { ...n, run: (extra: string[] = []) => runAgentOnce([...n.flags, ...extra], { cli }) };
  }

  async function held(img: PushedImage): Promise<boolean> {
    return (await cri.listImages()).some((i) => i.repoDigests.includes(img.ref) || i.id === img.id);
  }

  function bySet(r: OnceResult, name: string): NodeSetStatus {
    const s = r.sets.find((x) => x.name === name);
    assert.ok(s, `a status for ${name} in ${r.stdout}\n${r.stderr.slice(-3000)}`);
    return s;
  }

  function namesCannotPin(s: NodeSetStatus): void {
    assert.match(s.message!, /; also RuntimeCannotPin: containerd 1\.6\.20\S* does not honour io\.cri-containerd\.pinned set after the pull; /, 'the node\'s inability to pin is named beside it');
    assert.ok(s.message!.includes(VERSIONS_THAT_PIN), 'with the versions that pin');
    assert.doesNotMatch(s.message!, PRELOADED, 'and nothing says the images are there');
  }

  test('a set that does not fit, and a multi-arch set in the same batch: NoSpace with the estimate\'s figures, nothing pulled', async (t) => {
    if (!requireComponents(t, NEEDS) || !ready) return;
    // 24 MiB of incompressible data: 48 MiB estimated (x2), against about 34 MiB below the 85% watermark of 40 MiB.
    const big = await pushRandom(registry, 'cannot-pin/big', 24 * 1024 * 1024);
    const multi = await pushMultiArch(registry, 'cannot-pin/multi');
    const n = await node('nospace');
    await n.writeSets(set('big', [big.ref]), set('multi', [multi.ref]));

    const r = await n.run();
    assert.equal(r.code, 1, r.stderr);
    for (const name of ['big', 'multi']) {
      const s = bySet(r, name);
      assert.equal(s.phase, 'Degraded', JSON.stringify(s));
      assert.equal(s.reason, 'NoSpace', s.message);
      assert.match(s.message!, /: needs [\d.]+ MiB, [\d.]+ MiB free below the 85% watermark on \//, 'the estimate\'s figures');
      namesCannotPin(s);
      assert.equal(s.images.present, 0);
      assert.equal(s.images.pinned, 0);
    }
    assert.ok(bySet(r, 'big').estimatedBytes! >= 48 * 1024 * 1024, 'the estimate is on the set');
    assert.equal(await held(big), false, 'containerd holds none of the batch');
    assert.equal(await held(multi), false);
    const said = loggedNodeStatus(r);
    assert.match(said?.cannotPin ?? '', /^containerd 1\.6\.20\S* does not honour/, 'the node says once that it cannot pin');
    assert.ok(said!.cannotPin!.endsWith(VERSIONS_THAT_PIN));
  });

  test('a missing image: ImageNotFound, naming RuntimeCannotPin beside it', async (t) => {
    if (!requireComponents(t, NEEDS) || !ready) return;
    const here = await pushSingleLayer(registry, 'cannot-pin/here');
    const missing = unknownRef('cannot-pin/missing');
    const n = await node('notfound');
    await n.writeSets(set('apps', [here.ref, missing]));

    const r = await n.run();
    assert.equal(r.code, 1, r.stderr);
    const s = bySet(r, 'apps');
    assert.equal(s.phase, 'Degraded');
    assert.equal(s.reason, 'ImageNotFound', s.message);
    assert.match(s.message!, /^registry registry\.test has no image registry\.test\/cannot-pin\/missing@sha256:/);
    namesCannotPin(s);
    assert.deepEqual(s.images, { wanted: 2, present: 1, pinned: 0, failed: 1, invalid: 0 });
    assert.equal(await held(here), true, 'the image that exists is pulled all the same');
  });

  test('an image behind credentials the node does not have: Unauthorized, naming RuntimeCannotPin beside it', async (t) => {
    if (!requireComponents(t, NEEDS) || !ready) return;
    const secret = await pushSingleLayer(privateRegistry, 'cannot-pin/secret', { host: 'private.registry.test' });
    const n = await node('unauthorized');
    await n.writeSets(set('private', [secret.ref]));

    const r = await n.run();
    assert.equal(r.code, 1, r.stderr);
    const s = bySet(r, 'private');
    assert.equal(s.phase, 'Degraded');
    assert.equal(s.reason, 'Unauthorized', s.message);
    assert.match(s.message!, /^registry private\.registry\.test refused the credentials for /);
    namesCannotPin(s);
    assert.equal(await held(secret), false);
  });

  test('every image present: RuntimeCannotPin, pre-loaded and not protected; the Node\'s status says so once and `pinset status` marks the node', async (t) => {
    if (!requireComponents(t, NEEDS) || !ready) return;
    const api = await ApiServer.start();
    t.after(() => api.stop());
    const name = 'cannot-pin-node';
    api.create({ apiVersion: 'v1', kind: 'Node', metadata: { name, labels: { 'kubernetes.io/hostname': name } } });
    const a = await pushSingleLayer(registry, 'cannot-pin/a');
    const b = await pushSingleLayer(registry, 'cannot-pin/b');
    const n = await node(name);
    await n.writeSets(set('apps', [a.ref]), set('tools', [b.ref]));
    const kubeconfig = await api.writeKubeconfig(n.dir);

    const r = await n.run(['--kubeconfig', kubeconfig]);
    assert.equal(r.code, 1, 'not Ready: nothing pins the images');
    for (const s of r.sets) {
      assert.equal(s.phase, 'Degraded');
      assert.equal(s.reason, 'RuntimeCannotPin');
      assert.match(s.message!, /^1 of 1 images present \(pre-loaded\) but not pinned: containerd 1\.6\.20\S* does not honour /);
      assert.ok(s.message!.includes(VERSIONS_THAT_PIN));
      assert.deepEqual(s.images, { wanted: 1, present: 1, pinned: 0, failed: 0, invalid: 0 });
    }
    for (const img of [a, b]) assert.equal((await cri.imageStatus(img.ref))?.pinned, false, 'containerd 1.6.20 reports nothing pinned');

    const raw = api.get('nodes', name)?.metadata.annotations?.[STATUS_ANNOTATION];
    const status = parseNodeStatus(raw).status;
    assert.match(status?.cannotPin ?? '', /^containerd 1\.6\.20\S* does not honour .*; pins need 1\.6\.25 or later 1\.6/);
    assert.equal(raw!.split('"cannotPin"').length, 2, 'said once for the node');

    const out = await run(process.execPath, [...argvFor(cli), 'status', '--kubeconfig', kubeconfig], { env: { ...process.env, COLUMNS: '300' } });
    const lines = out.stdout.trimEnd().split('\n');
    const row = lines.find((l) => l.includes('apps'))!;
    // BYTES ("100% of 1.0 MiB" where the agent reports bytes) and ETA (none: nothing left) before GENERATION.
    assert.match(row, new RegExp(`^${name} \\(pre-load only\\)\\s+apps \\(static\\)\\s+Degraded\\s+1/1\\s+(?:-|100% of \\S+ \\S+)\\s+-\\s+0/1\\s+\\S+\\s+RuntimeCannotPin: 1 of 1 images present \\(pre-loaded\\)`));
    assert.ok(lines.includes(`  ${name}: ${status!.cannotPin}`), out.stdout);
  });
});
