// pinset's promise on a real node (run by test/node/run.ts, `npm run
// test:node`): the shipped image as the shipped DaemonSet's pod, on a real
// kubelet, CRI-O and kube-apiserver; an image pinned by a set is never
// removed by the kubelet's image garbage collection, so its pods start with
// no registry in reach.
//
// The steps run in order on one node, on the kubelet's own clock: its image
// GC runs every 5 minutes, the first real pass about 300 s after it starts
// (facts/test-bed.md), so the suite takes about 11 minutes.
//  1. deploy/ applied with server-side apply (the image replaced by the one
//     scripts/build-image.sh built, pushed to a loopback registry); the
//     DaemonSet's pod created as the daemonset controller would, Running and
//     Ready with its own mounts, security context and projected token.
//  2. Two sets created: their images pulled and pinned in CRI-O, each set
//     Ready in the Node's pinset.dev/status. An image no set names was
//     pulled before (a workload's leftover).
//  3. The kubelet's first GC pass (age path, imageMaximumGCAge 1m): the
//     unpinned image removed, no pinned image removed.
//  4. The registry stopped: a pod of a pinned image Running ("already
//     present on machine"), a pod of the collected image in ImagePullBackOff.
//  5. One set deleted: its image unpinned by the agent, then collected at
//     the next pass; the other set's unused image survives that pass too.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { STATUS_ANNOTATION } from '../../src/api/types.ts';
import { readNodeStatus } from '../../src/api/node-status.ts';
import { freePort } from '../support/registry.ts';
import {
  canLowerOomScore,
  ensureNamespaceBasics,
  imageLayout,
  podFromDaemonSet,
  podLogs,
  pushPinsetImage,
  pushWorkloadImage,
  realNodeMissing,
  startRealNode,
  writeDeployOverlay,
  type NodeImage,
  type RealNode,
} from '../support/real-node.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const GC_PERIOD_MS = 5 * 60_000;

const found = realNodeMissing();
const skip = 'why' in found ? found.why : undefined;

let node: RealNode | undefined;
let agentPod: { namespace: string; name: string } | undefined;
const images: Record<'pinset' | 'pinnedA' | 'pinnedB' | 'unpinned' | 'retired', NodeImage> = {} as never;
const figures: Record<string, unknown> = {};

function setObject(name: string, refs: string[]) {
  return { apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name }, spec: { pinnedImages: refs.map((r) => ({ name: r })) } };
}

async function until<T>(what: string, timeoutMs: number, check: () => Promise<T | undefined | false | null>, context: () => Promise<string> | string = () => ''): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await check();
    if (v !== undefined && v !== false && v !== null) return v;
    if (Date.now() > deadline) throw new Error(`${what}: not within ${Math.round(timeoutMs / 1000)} s\n${await context()}`);
    await sleep(200);
  }
}

const n = () => node!;
const sec = (ms: number) => Math.round(ms / 100) / 10;

async function nodeStatus() {
  const obj = await n().api.get(`/api/v1/nodes/${n().nodeName}`);
  return readNodeStatus(obj.metadata.annotations ?? {});
}

async function pinned(ref: string): Promise<boolean | null> {
  const img = await n().cri.imageStatus(ref);
  return img ? img.pinned : null;
}

/** What went on, for a failure message: the agent's pod, its log, the kubelet's and CRI-O's last lines. */
async function context(): Promise<string> {
  const out: string[] = [];
  if (agentPod) {
    const pod = await n().api.find(`/api/v1/namespaces/${agentPod.namespace}/pods/${agentPod.name}`).catch(() => null);
    out.push(`agent pod status: ${JSON.stringify(pod?.status?.containerStatuses ?? pod?.status ?? null)}`);
    out.push(`agent log:\n${podLogs(n(), agentPod.namespace, agentPod.name, 15)}`);
  }
  out.push(`node annotation: ${JSON.stringify((await nodeStatus().catch(() => null))?.status ?? null)}`);
  out.push(`kubelet:\n${n().kubelet.logTail(15)}`, `crio:\n${n().crio.log().split('\n').slice(-10).join('\n')}`);
  return out.join('\n');
}

/** klog's line time (I1126 22:50:01.123456 ...) as epoch ms; the year is this one. */
function klogTime(line: string): number | null {
  const m = /^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d+)/.exec(line);
  if (!m) return null;
  const d = new Date();
  d.setMonth(Number(m[1]) - 1, Number(m[2]));
  d.setHours(Number(m[3]), Number(m[4]), Number(m[5]), Math.floor(Number(m[6]) / 1000));
  return d.getTime();
}

/** Image GC passes the kubelet finished (succeeded or failed) after `since`, with their times. */
function gcPasses(since: number): Array<{ at: number; ok: boolean; line: string }> {
  return n()
    .kubeletLog(/Image garbage collection (succeeded|failed)/)
    .map((line) => ({ at: klogTime(line) ?? 0, ok: line.includes('succeeded'), line }))
    .filter((p) => p.at >= since);
}

/** Waits for the first GC pass to end after `since`; returns it with the kubelet's image GC lines of that pass. */
async function nextGcPass(since: number, label: string) {
  const startedAt = n().kubeletStartedAt;
  const expected = startedAt + Math.ceil((since - startedAt) / GC_PERIOD_MS) * GC_PERIOD_MS;
  const pass = await until(`the kubelet's image GC pass after ${new Date(since).toISOString()} (${label})`, Math.max(0, expected - Date.now()) + 120_000, async () => gcPasses(since)[0], context);
  const windowStart = pass.at - 60_000;
  const inPass = (re: RegExp) => n().kubeletLog(re).filter((l) => (klogTime(l) ?? 0) >= windowStart && (klogTime(l) ?? 0) <= pass.at + 1000);
  return {
    ...pass,
    secondsAfterKubeletStart: sec(pass.at - startedAt),
    pinnedSkipped: inPass(/Image is pinned, skipping garbage collection/).map((l) => /imageID="([^"]+)"/.exec(l)?.[1] ?? l),
    removed: inPass(/Removing image to free bytes/).map((l) => /imageID="([^"]+)"/.exec(l)?.[1] ?? l),
  };
}

async function podState(namespace: string, name: string) {
  const pod = await n().api.get(`/api/v1/namespaces/${namespace}/pods/${name}`);
  const cs = pod.status?.containerStatuses?.[0];
  return { phase: pod.status?.phase as string, waiting: cs?.state?.waiting?.reason as string | undefined, running: Boolean(cs?.state?.running), ready: Boolean(cs?.ready), pod };
}

function workloadPod(name: string, image: string) {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name, namespace: 'default', labels: { 'app.kubernetes.io/name': name } },
    spec: {
      nodeName: n().nodeName,
      // The bed has no CNI plugin: only host-network pods start.
      hostNetwork: true,
      automountServiceAccountToken: false,
      terminationGracePeriodSeconds: 1,
      containers: [{ name: 'main', image, imagePullPolicy: 'IfNotPresent' }],
    },
  };
}

describe('pinset on a real node: kubelet, CRI-O, kube-apiserver', { skip }, () => {
  before(async () => {
    if (skip || !('bins' in found)) return;
    const bins = found.bins;
    const t0 = Date.now();
    node = await startRealNode(bins);
    figures.bedStartSeconds = sec(Date.now() - t0);
    const layout = imageLayout();
    images.pinset = await pushPinsetImage(bins.skopeo, n().registry, layout);
    images.pinnedA = await pushWorkloadImage(n().registry, layout, 'pinned-a');
    images.pinnedB = await pushWorkloadImage(n().registry, layout, 'pinned-b');
    images.unpinned = await pushWorkloadImage(n().registry, layout, 'unpinned');
    images.retired = await pushWorkloadImage(n().registry, layout, 'retired');
  });

  after(async () => {
    if (!node) return;
    process.stdout.write(`\nnode suite figures: ${JSON.stringify(figures)}\n`);
    const notes = await node.stop();
    if (notes.length) process.stdout.write(`node suite cleanup: ${notes.join('; ')}\n`);
    node = undefined;
  });

  test('deploy/ applies server-side and the DaemonSet pod runs the image with its own mounts, security context and token', async (t) => {
    const overlay = await writeDeployOverlay(join(n().state, 'overlay'), images.pinset);
    const applied = await n().kubectl(['apply', '--server-side', '--field-manager=pinset-node-suite', '-k', overlay]);
    t.diagnostic(`kubectl apply --server-side: ${applied.trim().split('\n').length} objects`);
    await ensureNamespaceBasics(n().api, 'pinset-system', n().pki);
    await until('the PinnedImageSet CRD served', 30_000, async () => (await n().api.request('GET', '/apis/pinset.dev/v1alpha1/pinnedimagesets')).status === 200);
    const ds = await n().api.get('/apis/apps/v1/namespaces/pinset-system/daemonsets/pinset-agent');
    assert.equal(ds.spec.template.spec.containers[0].image, images.pinset.ref, 'the overlay replaced the image by the built one');
    const metricsPort = await freePort();
    const pod = podFromDaemonSet(ds, { nodeName: n().nodeName, hostPath: n().hostPath, apiServerPort: n().apiServerPort, metricsPort });
    const t0 = Date.now();
    const created = await n().api.create('/api/v1/namespaces/pinset-system/pods', pod);
    agentPod = { namespace: 'pinset-system', name: created.metadata.name };
    const state = await until('the agent pod Running and Ready', 180_000, async () => {
      const s = await podState(agentPod!.namespace, agentPod!.name);
      return s.running && s.ready ? s : undefined;
    }, context);
    figures.agentPodReadySeconds = sec(Date.now() - t0);
    // The pod as admitted: the template's container, as the DaemonSet ships it.
    const c = state.pod.spec.containers[0];
    const shipped = ds.spec.template.spec.containers[0];
    assert.deepEqual(c.securityContext, shipped.securityContext);
    assert.deepEqual(c.volumeMounts.filter((m: any) => !m.mountPath.startsWith('/var/run/secrets/')), shipped.volumeMounts);
    assert.ok(c.volumeMounts.some((m: any) => m.mountPath === '/var/run/secrets/kubernetes.io/serviceaccount'), 'the projected service-account token is mounted');
    assert.equal(state.pod.spec.serviceAccountName, 'pinset-agent');
    const imageId: string = state.pod.status.containerStatuses[0].imageID;
    assert.ok(imageId.endsWith(`@${images.pinset.digest}`), `the agent runs the built image (${imageId})`);
    if (!canLowerOomScore()) t.diagnostic('no priority class: this machine cannot lower an oom_score_adj (CAP_SYS_RESOURCE), which system-node-critical needs');
  });

  test('sets created: their images pulled and pinned in CRI-O, each set Ready in the Node annotation', async (t) => {
    // A workload's leftover that no set names: the kubelet may collect it.
    await n().cri.pullImage(images.unpinned.ref);
    const sets = { workloads: [images.pinnedA.ref, images.pinnedB.ref], retired: [images.retired.ref] };
    const t0 = Date.now();
    for (const [name, refs] of Object.entries(sets)) await n().api.create('/apis/pinset.dev/v1alpha1/pinnedimagesets', setObject(name, refs));
    const pinnedAt: Record<string, number> = {};
    const readyAt: Record<string, number> = {};
    await until('every image pinned and every set Ready', 180_000, async () => {
      for (const [name, refs] of Object.entries(sets)) {
        if (!pinnedAt[name] && (await Promise.all(refs.map(pinned))).every((p) => p === true)) pinnedAt[name] = Date.now();
      }
      const status = (await nodeStatus()).status;
      for (const s of status?.sets ?? []) if (s.phase === 'Ready' && !readyAt[s.name] && s.name in sets) readyAt[s.name] = Date.now();
      return Object.keys(sets).every((s) => pinnedAt[s] && readyAt[s]);
    }, context);
    figures.setCreatedToImagesPinnedSeconds = Object.fromEntries(Object.entries(pinnedAt).map(([k, v]) => [k, sec(v - t0)]));
    figures.setCreatedToReadySeconds = Object.fromEntries(Object.entries(readyAt).map(([k, v]) => [k, sec(v - t0)]));
    t.diagnostic(`set created -> images pinned on the node: ${JSON.stringify(figures.setCreatedToImagesPinnedSeconds)} s; -> Ready in ${STATUS_ANNOTATION}: ${JSON.stringify(figures.setCreatedToReadySeconds)} s`);
    const status = (await nodeStatus()).status!;
    for (const name of Object.keys(sets)) {
      const s = status.sets.find((x) => x.name === name)!;
      assert.equal(s.phase, 'Ready', `${name}: ${JSON.stringify(s)}`);
      assert.equal(s.images.pinned, sets[name as keyof typeof sets].length);
    }
    assert.equal(await pinned(images.unpinned.ref), false, 'the leftover is present and not pinned');
  });

  test("the kubelet's image GC (age path) removes the unpinned image and no pinned one", async (t) => {
    const pass = await nextGcPass(n().kubeletStartedAt + 60_000, 'first real pass');
    t.diagnostic(`GC pass ${pass.secondsAfterKubeletStart} s after the kubelet started: removed ${JSON.stringify(pass.removed)}, skipped as pinned ${JSON.stringify(pass.pinnedSkipped)}`);
    assert.ok(pass.ok, `the pass failed: ${pass.line}`);
    await until('the unpinned image removed', 30_000, async () => (await n().cri.imageStatus(images.unpinned.ref)) === null, context);
    for (const img of [images.pinnedA, images.pinnedB, images.retired]) assert.equal(await pinned(img.ref), true, `${img.ref} still present and pinned`);
    assert.ok((await n().cri.imageStatus(images.pinset.ref)) !== null, 'the agent image (in use) is present');
    const pinnedIds = [images.pinnedA, images.pinnedB, images.retired].map((i) => i.id);
    assert.deepEqual(pass.removed.filter((id) => pinnedIds.includes(id)), [], 'no pinned image removed');
    assert.ok(pass.removed.includes(images.unpinned.id), `the kubelet removed the unpinned image (${images.unpinned.id})`);
    for (const id of pinnedIds) assert.ok(pass.pinnedSkipped.includes(id), `the kubelet skipped ${id} as pinned`);
    figures.firstGcPass = { secondsAfterKubeletStart: pass.secondsAfterKubeletStart, removed: pass.removed.length, pinnedRemoved: 0, pinnedSkipped: pass.pinnedSkipped.length };
  });

  test('registry stopped: a pod of a pinned image runs, a pod of the collected image cannot pull', async (t) => {
    await n().registry.pause();
    const t0 = Date.now();
    await n().api.create('/api/v1/namespaces/default/pods', workloadPod('pinned-workload', images.pinnedA.ref));
    await n().api.create('/api/v1/namespaces/default/pods', workloadPod('collected-workload', images.unpinned.ref));
    await until('the pinned image\'s pod Running', 120_000, async () => (await podState('default', 'pinned-workload')).running, context);
    figures.pinnedPodRunningWithoutRegistrySeconds = sec(Date.now() - t0);
    const events = (await n().api.get('/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3Dpinned-workload')).items as any[];
    assert.ok(events.some((e) => e.reason === 'Pulled' && /already present on machine/.test(e.message)), `Pulled: already present (${events.map((e) => e.message).join(' | ')})`);
    const blocked = await until('the collected image\'s pod in ImagePullBackOff', 120_000, async () => {
      const s = await podState('default', 'collected-workload');
      return s.waiting === 'ImagePullBackOff' ? s : undefined;
    }, context);
    assert.equal(blocked.running, false);
    t.diagnostic(`pinned-workload Running ${figures.pinnedPodRunningWithoutRegistrySeconds} s after creation; collected-workload ${blocked.waiting}`);
  });

  test('a set deleted: its image unpinned, then collected at the next pass; the other set survives the pass', async (t) => {
    const t0 = Date.now();
    await n().api.delete('/apis/pinset.dev/v1alpha1/pinnedimagesets/retired');
    await until('the deleted set\'s image unpinned', 60_000, async () => (await pinned(images.retired.ref)) === false, context);
    figures.setDeletedToUnpinnedSeconds = sec(Date.now() - t0);
    await until('the deleted set gone from the Node annotation', 120_000, async () => !(await nodeStatus()).status?.sets.some((s) => s.name === 'retired'), context);
    const pass = await nextGcPass(Date.now(), 'after the set was deleted');
    t.diagnostic(`GC pass ${pass.secondsAfterKubeletStart} s after the kubelet started: removed ${JSON.stringify(pass.removed)}, skipped as pinned ${JSON.stringify(pass.pinnedSkipped)}`);
    assert.ok(pass.ok, `the pass failed: ${pass.line}`);
    await until('the deleted set\'s image removed', 30_000, async () => (await n().cri.imageStatus(images.retired.ref)) === null, context);
    assert.ok(pass.removed.includes(images.retired.id), 'the kubelet removed the deleted set\'s image');
    assert.equal(await pinned(images.pinnedB.ref), true, 'the unused image of the remaining set survived its second pass');
    assert.equal(await pinned(images.pinnedA.ref), true);
    assert.ok(!pass.removed.includes(images.pinnedB.id) && !pass.removed.includes(images.pinnedA.id), 'no pinned image removed');
    const status = (await nodeStatus()).status!;
    assert.equal(status.sets.find((s) => s.name === 'workloads')?.phase, 'Ready');
    figures.secondGcPass = { secondsAfterKubeletStart: pass.secondsAfterKubeletStart, removed: pass.removed.length, pinnedRemoved: 0, pinnedSkipped: pass.pinnedSkipped.length };
    figures.pinnedUnusedImageSurvivedGcPasses = 2;
  });
});
