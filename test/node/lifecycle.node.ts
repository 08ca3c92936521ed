// pinset's life on a real node (run by test/node/run.ts, `npm run
// test:node`, once per runtime: PINSET_NODE_RUNTIME is crio or containerd):
// the shipped image as the shipped DaemonSet's pod, on a real kubelet, a real
// CRI-O or containerd and a real kube-apiserver, with Kubernetes' own
// controllers when given. An image pinned by a set is never removed by the
// kubelet's image garbage collection, so its pods start with no registry in
// reach; replacing the agent (an upgrade, or a crash) never unpins anything;
// private images are pinned with the credentials the node has, as the
// kubelet gets them, and no credential leaks.
//
// The steps run in order on one node, on the kubelet's own clock: its image
// GC runs every 5 minutes, the first real pass about 300 s after it starts
// (facts/test-bed.md), so the suite takes about 11 minutes per runtime.
//  0. `pinset preflight` against the real kube-apiserver, before anything is
//     applied: nothing will fail on this node.
//  1. deploy/ (the one install for every runtime) applied with server-side apply,
//     with the credential provider component of deploy/credential-providers/
//     (the plugin folder the kubelet's own flags name, mounted read-only),
//     the image replaced by the one scripts/build-image.sh built, pushed to
//     a loopback registry. The DaemonSet's pod, made by the daemonset
//     controller and placed by the scheduler (or, without them, made as they
//     would), Running and Ready with its own mounts, security context and
//     projected token, on a Node that is not Ready: no CNI plugin yet, as on
//     a first node. The controller's pod waits for the Node.
//  2. The network installed (a CNI bridge network): the Node Ready, the
//     controller's pod placed and Ready, holding its Lease.
//  3. An administrator's hand pin (outside pinset), then three sets: their
//     images pulled and pinned, each set Ready. An image no set names was
//     pulled before (a workload's leftover).
//  3b. Registry credentials (./real-node-credentials.ts): the runtime alone
//     is refused by the private registries; a pod of a private image, with
//     no pull secret, runs (the kubelet's plugin exec); a set of private
//     images pinned and Ready (the agent's exec of the same plugin, in its
//     pod); a set naming a pull secret in pinset-system pinned with it; the
//     agent's RBAC for Secrets asked of the API server; no credential in the
//     agents' logs, the Node, the Events or the sets. These sets join the
//     GC passes and the agent's replacements below.
//  4. The DaemonSet rolled to a second build of the image, the registry
//     stopped: every pinned image reported pinned in every 100 ms sample,
//     nothing pulled, no second drop-in (CRI-O) and no pin label removed
//     (containerd), the new pod holding the node lock within the grace
//     period.
//  5. The kubelet's first GC pass (age path, imageMaximumGCAge 1m): the
//     unpinned image removed, no pinned image removed.
//  6. The registry stopped: a pod of a pinned image Running ("already
//     present on machine"), a pod of the collected image in ImagePullBackOff.
//  7. One set deleted: its image unpinned by the agent, then collected at
//     the next pass; the other sets' images and the hand pin survive it.
//  8. The kubelet stopped, the agent SIGKILLed (its stop hook never runs),
//     the DaemonSet rolled back, the kubelet started again: the new pod
//     adopts the pins (every sample pinned; it unpins a set deleted after).
//  9. Still no credential in any output, after the whole run.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fetch } from 'undici';
import { gateDefault } from '../../src/api/kubelet-verification.ts';
import { STATUS_ANNOTATION } from '../../src/api/types.ts';
import type { CheckOutcome } from '../../src/cli/preflight-checks.ts';
import { run as runPreflight } from '../../src/cli/preflight.ts';
import { runCli } from '../support/cli-run.ts';
import { readPluginLog, TEST_PLUGIN_NAME } from '../support/credential-plugin.ts';
import { ensureNamespaceBasics, realNodeMissing, startRealNode, type RealNode } from '../support/real-node.ts';
import { PLUGIN_ARGS, PULL_SECRET_NAME, secretsIn } from '../support/real-node-credentials.ts';
import { AGENT_NAMESPACE, AGENT_SELECTOR, CONTROLLER_SELECTOR, containerInitPid, podLogDir, readPodLogDir } from '../support/real-node-deploy.ts';
import { sec, SETS_API, SuiteNode, until, workloadPod as podFor } from '../support/real-node-suite.ts';
import { imageLayout, pushPinsetImage, pushRebuiltPinsetImage, pushSmallImage, pushWorkloadImage, type NodeImage } from '../support/real-node-images.ts';
import { canLowerOomScore, ContainerdNodeRuntime, CrioNodeRuntime, runtimeMissing, type PinWriteRecord, type RuntimeName } from '../support/real-node-runtime.ts';
import { AgentPodWatch, PinSampler, type PinSamples, type WatchedPod } from '../support/real-node-watch.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const GC_PERIOD_MS = 5 * 60_000;

const runtimeName = (process.env.PINSET_NODE_RUNTIME ?? 'crio') as RuntimeName;
const found = realNodeMissing();
const skip = 'why' in found ? found.why : (runtimeMissing(runtimeName) ?? undefined);
const realControllers = 'bins' in found && !('why' in found.bins.controllers);
const runtimeLabel = runtimeName === 'crio' ? 'CRI-O' : 'containerd';
const controllersLabel = realControllers ? 'kube-controller-manager and kube-scheduler' : 'the daemonset controller imitated';

let node: RealNode | undefined;
let suite: SuiteNode | undefined;
type ImageName = 'pinset' | 'pinsetNext' | 'pinnedA' | 'pinnedB' | 'unpinned' | 'retired' | 'handPinned' | 'privatePod' | 'privateA' | 'privateB' | 'privateProbe' | 'secretA';
const images: Record<ImageName, NodeImage> = {} as never;
const figures: Record<string, unknown> = { runtime: runtimeName, controllers: realControllers ? 'kube-controller-manager, kube-scheduler' : 'imitated' };

function setObject(name: string, refs: string[], pullSecrets?: string[]) {
  return { apiVersion: 'pinset.dev/v1alpha1', kind: 'PinnedImageSet', metadata: { name }, spec: { ...(pullSecrets ? { pullSecrets: pullSecrets.map((s) => ({ name: s })) } : {}), pinnedImages: refs.map((r) => ({ name: r })) } };
}

const n = () => node!;
const sn = () => suite!;
const podLogsDir = () => sn().podLogsDir;
const nodeStatus = () => sn().nodeStatus();
const listPods = (ns: string, selector: string) => sn().listPods(ns, selector);
const readyAgentPod = (image: NodeImage) => sn().readyAgentPod(image);
const context = () => sn().context();
const podState = (namespace: string, name: string) => sn().podState(namespace, name);
const workloadPod = (name: string, image: string) => podFor(n().nodeName, name, image);
const applyDeploy = (image: NodeImage) => sn().applyDeploy(image);

async function pinned(ref: string): Promise<boolean | null> {
  const img = await n().cri.imageStatus(ref);
  return img ? img.pinned : null;
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
    pinnedSkipped: inPass(/Image is pinned, skipping garbage collection/).map((l) => (/imageID="([^"]+)"/.exec(l)?.[1] ?? l).replace(/^sha256:/, '')),
    removed: inPass(/Removing image to free bytes/).map((l) => (/imageID="([^"]+)"/.exec(l)?.[1] ?? l).replace(/^sha256:/, '')),
  };
}

async function agentMetrics(): Promise<string> {
  return (await fetch(`http://127.0.0.1:${sn().bed.agentMetricsPort}/metrics`, { signal: AbortSignal.timeout(5000) })).text();
}

/** The pinset_pulls_total of the agent serving metrics now (its pulls since it started), by `result`. */
async function agentPulls(): Promise<Record<string, number>> {
  const text = await agentMetrics();
  const out: Record<string, number> = {};
  for (const m of text.matchAll(/^pinset_pulls_total\{([^}]*)\} (\d+)/gm)) {
    const result = /result="([^"]+)"/.exec(m[1]!)?.[1] ?? '?';
    out[result] = (out[result] ?? 0) + Number(m[2]);
  }
  return out;
}

/** pinset's drop-in files in CRI-O's drop-in folder (none on containerd). */
function pinsetDropIns(): string[] {
  const rt = n().runtime;
  return rt instanceof CrioNodeRuntime ? readdirSync(rt.dropInDir).filter((f) => f.startsWith('99-pinset-')) : [];
}

/** The images CRI reports pinned now, by image ID (the expected set of a sampler). */
async function pinnedNow(): Promise<Array<{ ref: string; id: string }>> {
  return (await n().cri.listImages()).filter((i) => i.pinned).map((i) => ({ ref: i.repoDigests[0] ?? i.repoTags[0] ?? i.id, id: i.id }));
}

interface NewSet {
  refs: string[];
  pullSecrets?: string[];
}

/**
 * Creates `sets` and waits until each one's images are all reported pinned,
 * the set is Ready in the Node's status and (with the controller) in its own
 * status; resolves to the seconds from creation to each, by set. Asserts
 * each is Ready with every image pinned.
 */
async function createSetsUntilReady(sets: Record<string, NewSet>): Promise<{ pinned: Record<string, number>; ready: Record<string, number>; statusReady?: Record<string, number> }> {
  const t0 = Date.now();
  for (const [name, set] of Object.entries(sets)) await n().api.create(SETS_API, setObject(name, set.refs, set.pullSecrets));
  const pinnedAt: Record<string, number> = {};
  const readyAt: Record<string, number> = {};
  const rolledUpAt: Record<string, number> = {};
  await until(`every image of ${Object.keys(sets).join(', ')} pinned and each Ready`, 180_000, async () => {
    for (const [name, set] of Object.entries(sets)) {
      if (!pinnedAt[name] && (await Promise.all(set.refs.map(pinned))).every((p) => p === true)) pinnedAt[name] = Date.now();
    }
    const status = (await nodeStatus()).status;
    for (const s of status?.sets ?? []) if (s.phase === 'Ready' && !readyAt[s.name] && s.name in sets) readyAt[s.name] = Date.now();
    if (realControllers) {
      for (const s of (await n().api.get(SETS_API)).items as any[]) {
        if (s.metadata.name in sets && !rolledUpAt[s.metadata.name] && (s.status?.conditions ?? []).some((c: any) => c.type === 'Ready' && c.status === 'True')) rolledUpAt[s.metadata.name] = Date.now();
      }
    }
    return Object.keys(sets).every((s) => pinnedAt[s] && readyAt[s] && (!realControllers || rolledUpAt[s]));
  }, context);
  const status = (await nodeStatus()).status!;
  for (const [name, set] of Object.entries(sets)) {
    const s = status.sets.find((x) => x.name === name)!;
    assert.equal(s.phase, 'Ready', `${name}: ${JSON.stringify(s)}`);
    assert.equal(s.images.pinned, set.refs.length);
  }
  const since = (m: Record<string, number>) => Object.fromEntries(Object.entries(m).map(([k, v]) => [k, sec(v - t0)]));
  return { pinned: since(pinnedAt), ready: since(readyAt), ...(realControllers ? { statusReady: since(rolledUpAt) } : {}) };
}

/** The agent's execs of the test plugin and the failed ones, by its own metrics (since it started). */
async function agentPluginExecs(): Promise<{ execs: number; errors: number }> {
  const text = await agentMetrics();
  const value = (metric: string) => Number(new RegExp(`^${metric}\\{plugin="${TEST_PLUGIN_NAME}"\\} (\\d+)`, 'm').exec(text)?.[1] ?? 0);
  return { execs: value('pinset_credential_provider_plugin_duration_seconds_count'), errors: value('pinset_credential_provider_plugin_errors_total') };
}

/** `kubectl auth can-i <args>` as the admin, asked of the API server: "yes" or "no". */
async function canI(args: string[]): Promise<string> {
  try {
    return (await n().kubectl(['auth', 'can-i', ...args])).trim();
  } catch (err) {
    // "no" exits 1.
    const e = err as { code?: number; stdout?: string };
    if (e.code === 1 && e.stdout?.trim() === 'no') return 'no';
    throw err;
  }
}

/**
 * Where the bed's registry credentials appear in what pinset and the
 * cluster report: every container log the kubelet keeps (the agents', the
 * controller's, the workloads'), the Node, every Event, every set. Each
 * finding names the secret, never prints it.
 */
/** The same search in the kubelet's and the runtime's own logs: not pinset's output, reported for what it is. */
function credentialsInNodeLogs(): string[] {
  const secrets = n().credentials.secrets;
  return [join(n().state, 'kubelet.log'), ...n().runtime.logFiles()].flatMap((f) => secretsIn(readFileSync(f, 'utf8'), secrets).map((w) => `${w} in ${f}`));
}

interface Replacement {
  samples: PinSamples;
  writes: PinWriteRecord;
  oldPod: WatchedPod;
  newPod: WatchedPod;
  /** containerd: the image records carrying the pin label when the replacement started. */
  pinLabelledAtStart: Set<string>;
}

/**
 * Replaces the agent's pod by one running `to` while sampling CRI `pinned`
 * of every image pinned at the start and watching the pods and the
 * runtime's pin writes. `between` runs after the watches start and before
 * the DaemonSet changes (the SIGKILL case stops the kubelet and kills the
 * agent there); `beforeWait` after it changed.
 */
async function replaceAgent(from: NodeImage, to: NodeImage, hooks: { between?: (old: any) => Promise<void>; beforeWait?: () => Promise<void> } = {}): Promise<Replacement> {
  const old = await readyAgentPod(from);
  assert.ok(old, `an agent pod runs ${from.ref}`);
  const expected = await pinnedNow();
  const pinLabelledAtStart = new Set<string>();
  const rt = n().runtime;
  if (rt instanceof ContainerdNodeRuntime) {
    for (const [name, labels] of await rt.imageLabels()) if (labels['io.cri-containerd.pinned'] === 'pinned') pinLabelledAtStart.add(name);
  }
  const sampler = new PinSampler(n().cri, expected);
  const watch = new AgentPodWatch(n().api, podLogsDir());
  const writes = await n().runtime.watchPinWrites();
  await watch.start();
  sampler.start();
  let samples: PinSamples;
  let record: PinWriteRecord;
  try {
    await hooks.between?.(old);
    await applyDeploy(to);
    await hooks.beforeWait?.();
    await sn().imitated?.sync();
    await until(`the agent pod running ${to.ref} Ready`, 240_000, () => readyAgentPod(to), context);
    // A few samples with the new agent settled in: a late unpin would show.
    await sleep(3000);
  } finally {
    await watch.stop();
    samples = await sampler.stop();
    record = await writes.stop();
  }
  const oldPod = watch.pods.get(old.metadata.uid)!;
  const newPod = [...watch.pods.values()].find((p) => p.image === to.ref && p.uid !== old.metadata.uid)!;
  assert.ok(newPod, 'the new pod was seen');
  return { samples, writes: record, oldPod, newPod, pinLabelledAtStart };
}

/** What every replacement must show: every pin held in every sample, nothing pulled, the runtime's pins not rewritten. */
async function assertPinsHeld(t: { diagnostic(s: string): void }, r: Replacement, dropInBefore: string[]): Promise<void> {
  t.diagnostic(`${r.samples.samples} samples of CRI pinned (every ${100} ms, longest gap ${r.samples.longestGapMs} ms): lowest ${r.samples.lowestPinned}/${r.samples.expected} pinned; ${r.samples.errors} failed reads`);
  // The 3 s after the new pod is Ready alone make 30.
  assert.ok(r.samples.samples >= 20, `the sampler ran (${r.samples.samples} samples)`);
  assert.deepEqual(r.samples.lapses.slice(0, 5), [], 'every pinned image reported pinned in every sample');
  assert.equal(r.samples.lowestPinned, r.samples.expected);
  assert.equal(r.samples.errors, 0, `the runtime answered every sample (${r.samples.lastError})`);
  const pulls = await agentPulls();
  assert.equal(Object.values(pulls).reduce((a, b) => a + b, 0), 0, `the new agent pulled nothing (pinset_pulls_total ${JSON.stringify(pulls)})`);
  if (r.writes.dropIns) {
    t.diagnostic(`drop-in files seen: ${JSON.stringify(r.writes.dropIns.names)} (at most ${r.writes.dropIns.mostAtOnce} at once); reloads asked: ${r.writes.dropIns.reloads}`);
    assert.deepEqual(r.writes.dropIns.names, dropInBefore, 'the one drop-in file, the same one, and no other');
    assert.equal(r.writes.dropIns.mostAtOnce, 1);
  }
  if (r.writes.labelUpdates) {
    const removed = r.writes.labelUpdates.filter((u) => r.pinLabelledAtStart.has(u.name) && u.labels['io.cri-containerd.pinned'] !== 'pinned');
    t.diagnostic(`containerd image record updates during the replacement: ${r.writes.labelUpdates.length} (${JSON.stringify(r.writes.labelUpdates.map((u) => u.name))})`);
    assert.deepEqual(removed, [], 'no pin label removed from a record that had it');
  }
}

describe(`pinset on a real node: kubelet, ${runtimeLabel}, kube-apiserver, ${controllersLabel}`, { skip }, () => {
  before(async () => {
    if (skip || !('bins' in found)) return;
    const bins = found.bins;
    if ('why' in bins.controllers) process.stdout.write(`node suite: no real controllers (${bins.controllers.why}): the agent's pod is made as the daemonset controller would, and the controller's Deployment runs no pod\n`);
    const t0 = Date.now();
    node = await startRealNode(bins, runtimeName);
    figures.bedStartSeconds = sec(Date.now() - t0);
    suite = await SuiteNode.on(n());
    const layout = imageLayout();
    images.pinset = await pushPinsetImage(bins.skopeo, n().registry, layout);
    images.pinsetNext = await pushRebuiltPinsetImage(n().registry, layout, 'next');
    for (const name of ['pinnedA', 'pinnedB', 'unpinned', 'retired', 'handPinned'] as const) images[name] = await pushWorkloadImage(n().registry, layout, name.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`));
    // The private registries: a workload image to run as a pod (pinset's layers uploaded once more), and images of a single layer of their own for the sets.
    const c = n().credentials;
    images.privatePod = await pushWorkloadImage(c.pluginRegistry, layout, 'private-pod', { host: c.pluginHost });
    for (const name of ['privateA', 'privateB', 'privateProbe'] as const) images[name] = await pushSmallImage(c.pluginRegistry, name.replace(/[A-Z]/g, (ch) => `-${ch.toLowerCase()}`), c.pluginHost);
    images.secretA = await pushSmallImage(c.secretRegistry, 'secret-a', c.secretHost);
  });

  after(async () => {
    if (!node) return;
    process.stdout.write(`\nnode suite figures (${runtimeName}): ${JSON.stringify(figures)}\n`);
    const notes = await node.stop();
    if (notes.length) process.stdout.write(`node suite cleanup: ${notes.join('; ')}\n`);
    node = undefined;
  });

  test('pinset preflight against the real kube-apiserver, before the install: the API, the node and its runtime pass, the kubelet gets what its version needs; nothing will fail', async (t) => {
    const r = await runCli(runPreflight, ['--kubeconfig', n().kubeconfig, '-o', 'json']);
    const checks = Object.fromEntries((JSON.parse(r.stdout) as { checks: CheckOutcome[] }).checks.map((c) => [c.check, c]));
    for (const c of Object.values(checks)) t.diagnostic(`preflight ${c.result} ${c.check}: ${c.message}`);
    assert.equal(r.code, 0, `${r.stdout}${r.stderr}`);
    for (const name of ['kubernetes', 'openshift', 'priority class', 'nodes', 'runtimes', 'sets']) assert.equal(checks[name]?.result, 'ok', `${name}: ${checks[name]?.message}`);
    // From 1.33 a note (1.35: the drop-in; 1.33 and 1.34: none with the gate off); before, nothing to do.
    assert.equal(checks.kubelets?.result, gateDefault(n().kubeletVersion).known ? 'note' : 'ok', checks.kubelets?.message);
  });

  test(`deploy/ applies server-side on ${runtimeLabel}; the DaemonSet's pod runs the image with its own mounts, security context and token, Ready on a Node that is not (no CNI yet)`, async (t) => {
    const t0 = Date.now();
    t.diagnostic(`kubectl apply --server-side: ${await applyDeploy(images.pinset)} objects`);
    await until('the PinnedImageSet CRD served', 30_000, async () => (await n().api.request('GET', SETS_API)).status === 200);
    const ds = await n().api.get(`/apis/apps/v1/namespaces/${AGENT_NAMESPACE}/daemonsets/pinset-agent`);
    assert.equal(ds.spec.template.spec.containers[0].image, images.pinset.ref, 'the overlay replaced the image by the built one');
    const imitated = sn().imitated;
    if (imitated) {
      // What kube-controller-manager would publish in the namespace.
      await ensureNamespaceBasics(n().api, AGENT_NAMESPACE, n().pki);
      await imitated.sync();
    }
    const pod = await until('the agent pod Running and Ready', 180_000, () => readyAgentPod(images.pinset), context);
    figures.agentPodReadySeconds = sec(Date.now() - t0);
    // Not Ready, for want of a network: as a first node before its CNI plugin.
    const nodeObj = await n().api.get(`/api/v1/nodes/${n().nodeName}`);
    const ready = (nodeObj.status.conditions as any[]).find((c) => c.type === 'Ready');
    assert.equal(ready.status, 'False', `the Node is not Ready (${ready.message})`);
    assert.match(ready.message, /network/i);
    t.diagnostic(`Node Ready=${ready.status}: ${ready.message}; taints ${JSON.stringify(nodeObj.spec.taints ?? [])}`);
    // The pod as admitted: the template's container, as the DaemonSet ships it.
    const c = pod.spec.containers[0];
    const shipped = ds.spec.template.spec.containers[0];
    assert.equal(pod.spec.hostNetwork, true, 'on the node\'s network: no pod network yet');
    assert.deepEqual(c.securityContext, shipped.securityContext);
    assert.deepEqual(c.volumeMounts.filter((m: any) => !m.mountPath.startsWith('/var/run/secrets/')), shipped.volumeMounts);
    assert.ok(c.volumeMounts.some((m: any) => m.mountPath === '/var/run/secrets/kubernetes.io/serviceaccount'), 'the projected service-account token is mounted');
    assert.equal(pod.spec.serviceAccountName, 'pinset-agent');
    assert.ok(pod.status.containerStatuses[0].imageID.endsWith(`@${images.pinset.digest}`), `the agent runs the built image (${pod.status.containerStatuses[0].imageID})`);
    assert.deepEqual(pod.metadata.ownerReferences.map((o: any) => `${o.kind}/${o.name}/${o.controller}`), ['DaemonSet/pinset-agent/true']);
    if (n().controllers) {
      const events = (await n().api.get(`/api/v1/namespaces/${AGENT_NAMESPACE}/events?fieldSelector=involvedObject.name%3D${pod.metadata.name}`)).items as any[];
      assert.ok(events.some((e) => e.reason === 'Scheduled' && (e.reportingComponent === 'default-scheduler' || e.source?.component === 'default-scheduler')), 'placed by the scheduler');
      // Never evicted from a node that is not ready or unreachable (the daemonset controller adds these).
      for (const key of ['node.kubernetes.io/not-ready', 'node.kubernetes.io/unreachable']) assert.ok((pod.spec.tolerations as any[]).some((x) => x.key === key && x.effect === 'NoExecute'), key);
      // The controller's pod waits: the Node is tainted not-ready, and the Deployment does not tolerate it.
      const blocked = await until('the controller pod unschedulable for the not-ready taint', 60_000, async () => {
        const [p] = await listPods(AGENT_NAMESPACE, CONTROLLER_SELECTOR);
        const cond = (p?.status?.conditions ?? []).find((x: any) => x.type === 'PodScheduled');
        // 1.32's scheduler names the taint; 1.35's says "had untolerated taint(s)", and the Node's one taint is that one.
        return cond?.status === 'False' && /node\.kubernetes\.io\/not-ready|untolerated taint\(s\)/.test(cond.message) ? cond : undefined;
      }, context);
      assert.deepEqual((nodeObj.spec.taints ?? []).map((x: any) => x.key), ['node.kubernetes.io/not-ready'], 'the taint the controller pod does not tolerate is not-ready');
      t.diagnostic(`controller pod: ${blocked.reason}: ${blocked.message}`);
    } else {
      t.diagnostic('no kube-controller-manager and kube-scheduler: the pod was made as the daemonset controller would');
    }
    if (!canLowerOomScore()) t.diagnostic('no priority class: this machine cannot lower an oom_score_adj (CAP_SYS_RESOURCE), which system-node-critical needs');
  });

  test('the network installed: the Node Ready, the controller\'s pod placed, Ready and holding its Lease', { skip: !realControllers && 'no kube-controller-manager and kube-scheduler given' }, async (t) => {
    const t0 = Date.now();
    await n().runtime.installNetwork();
    await until('the Node Ready without its not-ready taint', 120_000, async () => {
      const obj = await n().api.get(`/api/v1/nodes/${n().nodeName}`);
      const ready = (obj.status.conditions as any[]).find((c) => c.type === 'Ready');
      return ready.status === 'True' && !(obj.spec.taints ?? []).some((x: any) => x.key === 'node.kubernetes.io/not-ready');
    }, context);
    figures.networkToNodeReadySeconds = sec(Date.now() - t0);
    const pod = await until('the controller pod Running and Ready', 120_000, async () => {
      const [p] = await listPods(AGENT_NAMESPACE, CONTROLLER_SELECTOR);
      return p?.status?.containerStatuses?.[0]?.ready ? p : undefined;
    }, context);
    const lease = await until('the controller holding its Lease', 60_000, async () => {
      const l = await n().api.find(`/apis/coordination.k8s.io/v1/namespaces/${AGENT_NAMESPACE}/leases/pinset-controller`);
      return l?.spec?.holderIdentity === pod.metadata.name ? l : undefined;
    }, context);
    figures.networkToControllerLeaderSeconds = sec(Date.now() - t0);
    t.diagnostic(`Node Ready ${figures.networkToNodeReadySeconds} s after the network was installed; ${lease.spec.holderIdentity} leads ${figures.networkToControllerLeaderSeconds} s after`);
  });

  test(`an administrator's hand pin, then sets: their images pulled and pinned in ${runtimeLabel}, each set Ready`, async (t) => {
    // A workload's leftover that no set names: the kubelet may collect it.
    await n().cri.pullImage(images.unpinned.ref);
    // A pin that is not pinset's: it must outlive everything pinset does.
    await n().cri.pullImage(images.handPinned.ref);
    t.diagnostic(`hand pin: ${await n().runtime.handPin(images.handPinned.ref)}`);
    await until('the hand-pinned image reported pinned', 60_000, async () => (await pinned(images.handPinned.ref)) === true, context);
    const sets: Record<string, NewSet> = {
      workloads: { refs: [images.pinnedA.ref, images.pinnedB.ref] },
      // It lists the hand-pinned image too: deleting it must leave that pin.
      retired: { refs: [images.retired.ref, images.handPinned.ref] },
      // pinset's own release and the next one: an upgrade needs no registry.
      release: { refs: [images.pinset.ref, images.pinsetNext.ref] },
    };
    const took = await createSetsUntilReady(sets);
    figures.setCreatedToImagesPinnedSeconds = took.pinned;
    figures.setCreatedToReadySeconds = took.ready;
    if (took.statusReady) figures.setCreatedToStatusReadySeconds = took.statusReady;
    t.diagnostic(`set created -> images pinned on the node: ${JSON.stringify(took.pinned)} s; -> Ready in ${STATUS_ANNOTATION}: ${JSON.stringify(took.ready)} s${took.statusReady ? `; -> the set's status Ready (the controller): ${JSON.stringify(took.statusReady)} s` : ''}`);
    assert.equal(await pinned(images.unpinned.ref), false, 'the leftover is present and not pinned');
  });

  test('registry credentials as the node has them: the runtime alone is refused; the kubelet and the agent each get them from the same plugin; a pull secret in pinset-system; its RBAC on the API server; no credential in any output', async (t) => {
    const c = n().credentials;
    // The runtime has no credential of its own for either private registry.
    const refusals: string[] = [];
    for (const img of [images.privateProbe, images.secretA]) {
      await assert.rejects(n().cri.pullImage(img.ref), (err: Error) => {
        assert.match(err.message, /401|unauthori[sz]ed|authentication required|authorization failed/i, `${img.ref}: ${err.message}`);
        refusals.push(err.message.slice(0, 160));
        return true;
      }, `${runtimeLabel} pulls ${img.ref} with no credential`);
    }
    t.diagnostic(`${runtimeLabel} alone: ${refusals.join(' | ')}`);

    // The agent's pod has the plugin folder the kubelet's flags name, read-only, from the component.
    const agentPod = await readyAgentPod(images.pinset);
    assert.ok(agentPod, 'the agent pod runs');
    const mount = (agentPod.spec.containers[0].volumeMounts as any[]).find((m) => m.mountPath === c.binDir);
    assert.ok(mount?.readOnly, `the plugin folder ${c.binDir} mounted read-only (${JSON.stringify(mount)})`);
    const configured = readPodLogDir(podLogDir(podLogsDir(), agentPod)).lines.find((l) => l.msg === 'credential provider plugins configured') as any;
    assert.ok(configured, 'the agent read the credential provider config at start');
    assert.equal(configured.config, c.configPath);
    assert.deepEqual(configured.providers.map((p: any) => p.name), [TEST_PLUGIN_NAME]);

    // The kubelet: a pod of a private image, no pull secret anywhere.
    const t0 = Date.now();
    const pod = workloadPod('private-workload', images.privatePod.ref);
    await n().api.create('/api/v1/namespaces/default/pods', pod);
    await until('the private image\'s pod Running', 120_000, async () => (await podState('default', 'private-workload')).running, context);
    const privatePodRunningSeconds = sec(Date.now() - t0);
    const created = (await podState('default', 'private-workload')).pod;
    assert.equal(created.spec.imagePullSecrets, undefined, 'the pod names no pull secret');
    const sa = await n().api.get('/api/v1/namespaces/default/serviceaccounts/default');
    assert.equal(sa.imagePullSecrets, undefined, 'nor does its service account');
    const podEvents = (await n().api.get('/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3Dprivate-workload')).items as any[];
    assert.ok(podEvents.some((e) => e.reason === 'Pulled' && /Successfully pulled image/.test(e.message)), `the kubelet pulled it (${podEvents.map((e) => e.message).join(' | ')})`);
    const kubeletExecs = await readPluginLog(c.kubeletExecLog);
    assert.ok(kubeletExecs.length >= 1, 'the kubelet ran the plugin');
    for (const e of kubeletExecs) {
      assert.match(e.request.image ?? '', new RegExp(`^${`${c.pluginHost}/${images.privatePod.repo}`.replace(/\./g, '\\.')}(@sha256:[0-9a-f]{64})?$`), 'the kubelet asked for the pod\'s image');
      assert.equal(e.request.apiVersion, 'credentialprovider.kubelet.k8s.io/v1');
      assert.deepEqual(e.args, PLUGIN_ARGS, 'with the config\'s args');
      assert.equal(e.env.TEST_PLUGIN_CACHE_KEY_TYPE, 'Registry', 'and the config\'s env');
    }
    t.diagnostic(`private-workload Running ${privatePodRunningSeconds} s after creation; the kubelet's plugin execs: ${kubeletExecs.length} (${kubeletExecs.map((e) => e.request.image).join(', ')})`);

    // The agent: a set of private images, with the same plugin in its pod.
    const execsBefore = await agentPluginExecs();
    const pullsBefore = (await agentPulls()).success ?? 0;
    const privateSet = await createSetsUntilReady({ private: { refs: [images.privateA.ref, images.privateB.ref] } });
    const execsAfter = await agentPluginExecs();
    assert.ok(execsAfter.execs > execsBefore.execs, `the agent ran the plugin (${JSON.stringify(execsBefore)} -> ${JSON.stringify(execsAfter)})`);
    assert.equal(execsAfter.errors, execsBefore.errors, 'and it never failed');
    assert.equal((await agentPulls()).success! - pullsBefore, 2, 'the agent pulled both images');
    // Not the kubelet: its execs (the only ones with its environment's exec log) asked for the pod's image alone.
    assert.equal((await readPluginLog(c.kubeletExecLog)).length, kubeletExecs.length, 'the kubelet ran the plugin no more');
    t.diagnostic(`set of private images created -> pinned ${JSON.stringify(privateSet.pinned)} s, -> Ready ${JSON.stringify(privateSet.ready)} s${privateSet.statusReady ? `, -> its status Ready ${JSON.stringify(privateSet.statusReady)} s` : ''}; the agent's plugin execs: ${execsAfter.execs - execsBefore.execs}, failed: ${execsAfter.errors - execsBefore.errors}`);

    // A pull secret in the agents' namespace: the only credential for its registry.
    await n().api.create(`/api/v1/namespaces/${AGENT_NAMESPACE}/secrets`, c.pullSecret);
    const secretSet = await createSetsUntilReady({ 'private-pull-secret': { refs: [images.secretA.ref], pullSecrets: [PULL_SECRET_NAME] } });
    assert.equal((await agentPluginExecs()).execs, execsAfter.execs, `the plugin was not asked for ${c.secretHost} (its matchImages do not match it)`);
    t.diagnostic(`set naming the pull secret created -> pinned ${JSON.stringify(secretSet.pinned)} s, -> Ready ${JSON.stringify(secretSet.ready)} s${secretSet.statusReady ? `, -> its status Ready ${JSON.stringify(secretSet.statusReady)} s` : ''}`);

    // The agent's RBAC for Secrets, as the API server decides it.
    const as = ['--as', `system:serviceaccount:${AGENT_NAMESPACE}:pinset-agent`];
    const rbac: Record<string, string> = {};
    for (const [what, args] of Object.entries({
      'get secrets -n pinset-system': ['get', 'secrets', '-n', AGENT_NAMESPACE],
      'list secrets -n pinset-system': ['list', 'secrets', '-n', AGENT_NAMESPACE],
      'watch secrets -n pinset-system': ['watch', 'secrets', '-n', AGENT_NAMESPACE],
      'get secrets --all-namespaces': ['get', 'secrets', '--all-namespaces'],
      'get secrets -n default': ['get', 'secrets', '-n', 'default'],
      'get secrets -n kube-system': ['get', 'secrets', '-n', 'kube-system'],
      'create secrets -n pinset-system': ['create', 'secrets', '-n', AGENT_NAMESPACE],
    })) rbac[what] = await canI([...args, ...as]);
    t.diagnostic(`kubectl auth can-i ... ${as.join(' ')}: ${JSON.stringify(rbac)}`);
    assert.deepEqual(rbac, {
      'get secrets -n pinset-system': 'no',
      'list secrets -n pinset-system': 'yes',
      'watch secrets -n pinset-system': 'yes',
      'get secrets --all-namespaces': 'no',
      'get secrets -n default': 'no',
      'get secrets -n kube-system': 'no',
      'create secrets -n pinset-system': 'no',
    });

    const found = await sn().credentialFindings();
    assert.deepEqual(found.findings, [], 'no credential in the pods\' logs, the Node, the Events or the sets');
    t.diagnostic(`no credential in ${found.logFiles} container log file(s), the Node, the Events or the sets; the kubelet's and ${runtimeLabel}'s own logs: ${JSON.stringify(credentialsInNodeLogs())}`);
    figures.credentials = {
      runtimeAloneRefused: refusals.length,
      privatePodCreatedToRunningSeconds: privatePodRunningSeconds,
      kubeletPluginExecs: kubeletExecs.length,
      privateSetCreatedToPinnedSeconds: privateSet.pinned.private,
      privateSetCreatedToReadySeconds: privateSet.ready.private,
      ...(privateSet.statusReady ? { privateSetCreatedToStatusReadySeconds: privateSet.statusReady.private } : {}),
      agentPluginExecs: execsAfter.execs - execsBefore.execs,
      agentPluginErrors: execsAfter.errors - execsBefore.errors,
      pullSecretSetCreatedToPinnedSeconds: secretSet.pinned['private-pull-secret'],
      pullSecretSetCreatedToReadySeconds: secretSet.ready['private-pull-secret'],
      credentialFindings: 0,
    };
  });

  test('an upgrade: the DaemonSet rolled to a second build with the registry stopped; every pin held at every instant, nothing pulled, the node lock taken within the grace period', async (t) => {
    const dropInBefore = pinsetDropIns();
    await n().registry.pause();
    let r: Replacement;
    try {
      r = await replaceAgent(images.pinset, images.pinsetNext);
    } finally {
      await n().registry.resume();
    }
    await assertPinsHeld(t, r, dropInBefore);
    const ds = await n().api.get(`/apis/apps/v1/namespaces/${AGENT_NAMESPACE}/daemonsets/pinset-agent`);
    const graceMs = ds.spec.template.spec.terminationGracePeriodSeconds * 1000;
    const stopping = AgentPodWatch.line(r.oldPod, 'stopping');
    const lock = AgentPodWatch.line(r.newPod, 'node lock held');
    assert.ok(r.oldPod.deletingSeenAt, 'the old pod was deleted');
    assert.ok(stopping, `the old agent stopped on its signal (${r.oldPod.log.slice(-3).map((l) => l.msg).join(' | ')})`);
    assert.ok(lock, `the new agent took the node lock (${r.newPod.log.slice(0, 5).map((l) => l.msg).join(' | ')})`);
    const lockAfterDeletionMs = lock.at - r.oldPod.deletingSeenAt!;
    assert.ok(lockAfterDeletionMs < graceMs, `the new pod took the node lock ${lockAfterDeletionMs} ms after the old one's deletion, within its grace period (${graceMs} ms)`);
    const events = (await n().api.get(`/api/v1/namespaces/${AGENT_NAMESPACE}/events?fieldSelector=involvedObject.name%3D${r.newPod.name}`)).items as any[];
    assert.ok(events.some((e) => e.reason === 'Pulled' && /already present on machine/.test(e.message)), `the new image was there already (${events.map((e) => e.message).join(' | ')})`);
    figures.upgrade = {
      samples: r.samples.samples,
      lowestPinned: `${r.samples.lowestPinned}/${r.samples.expected}`,
      deletionToLockSeconds: sec(lockAfterDeletionMs),
      oldStoppingToLockSeconds: sec(lock.at - stopping.at),
      deletionToNewReadySeconds: sec(r.newPod.readyAt! - r.oldPod.deletingSeenAt!),
      ...(r.writes.dropIns ? { reloads: r.writes.dropIns.reloads } : { labelUpdates: r.writes.labelUpdates!.length }),
    };
    t.diagnostic(`upgrade: ${JSON.stringify(figures.upgrade)}`);
  });

  test("the kubelet's image GC (age path) removes the unpinned image and no pinned one", async (t) => {
    const pass = await nextGcPass(n().kubeletStartedAt + 60_000, 'first real pass');
    t.diagnostic(`GC pass ${pass.secondsAfterKubeletStart} s after the kubelet started: removed ${JSON.stringify(pass.removed)}, skipped as pinned ${JSON.stringify(pass.pinnedSkipped)}`);
    assert.ok(pass.ok, `the pass failed: ${pass.line}`);
    await until('the unpinned image removed', 30_000, async () => (await n().cri.imageStatus(images.unpinned.ref)) === null, context);
    // The private sets' images among them: pulled with the plugin's credential and a pull secret.
    const kept = [images.pinnedA, images.pinnedB, images.retired, images.handPinned, images.pinset, images.privateA, images.privateB, images.secretA];
    for (const img of kept) assert.equal(await pinned(img.ref), true, `${img.ref} still present and pinned`);
    const keptIds = kept.map((i) => i.id);
    assert.deepEqual(pass.removed.filter((id) => keptIds.includes(id)), [], 'no pinned image removed');
    assert.ok(pass.removed.includes(images.unpinned.id), `the kubelet removed the unpinned image (${images.unpinned.id})`);
    // pinset's previous build: pinned, no longer in use, not collected.
    for (const id of keptIds) assert.ok(pass.pinnedSkipped.includes(id), `the kubelet skipped ${id} as pinned`);
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

  test('a set deleted: its image unpinned, then collected at the next pass; the other sets and the hand pin survive the pass', async (t) => {
    const t0 = Date.now();
    await n().api.delete(`${SETS_API}/retired`);
    await until('the deleted set\'s image unpinned', 60_000, async () => (await pinned(images.retired.ref)) === false, context);
    figures.setDeletedToUnpinnedSeconds = sec(Date.now() - t0);
    assert.equal(await pinned(images.handPinned.ref), true, 'the hand pin stays: the set listed the image, but the pin is not pinset\'s');
    await until('the deleted set gone from the Node annotation', 120_000, async () => !(await nodeStatus()).status?.sets.some((s) => s.name === 'retired'), context);
    const pass = await nextGcPass(Date.now(), 'after the set was deleted');
    t.diagnostic(`GC pass ${pass.secondsAfterKubeletStart} s after the kubelet started: removed ${JSON.stringify(pass.removed)}, skipped as pinned ${JSON.stringify(pass.pinnedSkipped)}`);
    assert.ok(pass.ok, `the pass failed: ${pass.line}`);
    await until('the deleted set\'s image removed', 30_000, async () => (await n().cri.imageStatus(images.retired.ref)) === null, context);
    assert.ok(pass.removed.includes(images.retired.id), 'the kubelet removed the deleted set\'s image');
    for (const img of [images.pinnedA, images.pinnedB, images.handPinned, images.pinset, images.privateA, images.privateB, images.secretA]) {
      assert.equal(await pinned(img.ref), true, `${img.ref} pinned after the pass`);
      assert.ok(!pass.removed.includes(img.id), `${img.ref} not removed`);
    }
    const status = (await nodeStatus()).status!;
    for (const name of ['workloads', 'private', 'private-pull-secret']) assert.equal(status.sets.find((s) => s.name === name)?.phase, 'Ready', name);
    figures.secondGcPass = { secondsAfterKubeletStart: pass.secondsAfterKubeletStart, removed: pass.removed.length, pinnedRemoved: 0, pinnedSkipped: pass.pinnedSkipped.length };
    figures.pinnedUnusedImageSurvivedGcPasses = 2;
  });

  test('an agent SIGKILLed while the kubelet is down (no stop hook), the DaemonSet rolled back: the new pod adopts its pins', async (t) => {
    const dropInBefore = pinsetDropIns();
    let killedAt = 0;
    let kubeletBackAt = 0;
    // The registry is still stopped (from the test before): nothing can be pulled.
    const r = await replaceAgent(images.pinsetNext, images.pinset, {
      between: async (old) => {
        // The kubelet first, or it would restart the container at once.
        await n().stopKubelet();
        const pid = await containerInitPid(old.status.containerStatuses[0].containerID.replace(/^[a-z-]+:\/\//, ''));
        process.kill(pid, 'SIGKILL');
        killedAt = Date.now();
        await until(`the agent's process ${pid} gone`, 10_000, async () => {
          try {
            process.kill(pid, 0);
            return false;
          } catch {
            return true;
          }
        });
      },
      beforeWait: async () => {
        // The daemonset controller marks the old pod for deletion; only a kubelet can let it go.
        if (n().controllers) await until('the old pod marked for deletion', 30_000, async () => (await listPods(AGENT_NAMESPACE, AGENT_SELECTOR)).every((p) => p.metadata.deletionTimestamp), context);
        await n().startKubelet();
        kubeletBackAt = Date.now();
      },
    });
    await assertPinsHeld(t, r, dropInBefore);
    assert.equal(AgentPodWatch.line(r.oldPod, 'stopping'), undefined, 'the old agent never ran its stop hook');
    assert.equal(r.oldPod.restarts, 0, 'the old container was not started again');
    assert.deepEqual(r.oldPod.logFiles, ['agent/0.log']);
    const lock = AgentPodWatch.line(r.newPod, 'node lock held');
    assert.ok(lock, 'the new agent took the node lock');
    assert.equal(lock.tookOver, undefined, 'the lock was free: the kernel released the killed holder\'s flock');
    // Adoption: the pins the killed agent set are the new one's to remove.
    const t0 = Date.now();
    await n().api.delete(`${SETS_API}/workloads`);
    await until('the new agent unpins the deleted set\'s images', 60_000, async () => (await pinned(images.pinnedA.ref)) === false && (await pinned(images.pinnedB.ref)) === false, context);
    assert.equal(await pinned(images.handPinned.ref), true, 'the hand pin stays');
    assert.equal(await pinned(images.pinset.ref), true, 'the release set stays pinned');
    for (const img of [images.privateA, images.privateB, images.secretA]) assert.equal(await pinned(img.ref), true, `${img.ref}: the private sets stay pinned`);
    figures.sigkill = {
      samples: r.samples.samples,
      lowestPinned: `${r.samples.lowestPinned}/${r.samples.expected}`,
      killToKubeletBackSeconds: sec(kubeletBackAt - killedAt),
      kubeletBackToLockSeconds: sec(lock.at - kubeletBackAt),
      deletedSetUnpinnedByNewAgentSeconds: sec(Date.now() - t0),
    };
    t.diagnostic(`SIGKILL: ${JSON.stringify(figures.sigkill)}`);
  });

  test('after the whole run (two agents replaced, a crash, the GC passes): no registry credential in the pods\' logs, the Node, the Events or the sets', async (t) => {
    const found = await sn().credentialFindings();
    assert.deepEqual(found.findings, []);
    const nodeLogs = credentialsInNodeLogs();
    t.diagnostic(`searched ${found.logFiles} container log file(s), the Node, every Event and every set: none; the kubelet's and ${runtimeLabel}'s own logs: ${JSON.stringify(nodeLogs)}`);
    figures.credentialsAtEnd = { findings: found.findings.length, logFiles: found.logFiles, inNodeLogs: nodeLogs.length };
  });
});
