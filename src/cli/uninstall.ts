// `pinset uninstall`: remove pinset from a cluster without leaving a pin
// behind. `kubectl delete -k deploy/` would stop the agents with their pins
// in place, and nothing would ever remove them: the kubelet could never
// collect those images. In order:
// 1. delete every PinnedImageSet, one by one, while their CRD stands (the
//    agents take that as the sets' deletion, and unpin; src/agent/crd-check.ts);
// 2. wait until every node's agent reports it holds no pins (./uninstall-wait.ts),
//    naming the nodes that do not;
// 3. remove what the manifests install (./manifests.ts), agents first, the
//    CRD and the namespace last (./cluster-objects.ts): the rest only once
//    the agents' and the controller's pods are gone, since they need their
//    RBAC, ServiceAccounts and CRD until they stop (a pod outlives its
//    DaemonSet for its grace period). Only what is pinset's: an object that
//    lacks pinset's label (app.kubernetes.io/part-of=pinset) stays, and a
//    Namespace stays unless it holds nothing but pinset's objects
//    (./namespace-contents.ts), each said with why.
// --dry-run prints that plan, those decisions included, and changes nothing. --keep-pins keeps the
// sets and the pins: the agents are removed first and the sets go with
// their CRD, which no agent takes as the sets' deletion. A CRD found
// missing (or being deleted) is installed again from the manifests first:
// while it is missing the agents keep their pins, so they must see the
// sets gone to unpin. A node still holding pins when the time is up is
// named, with what to do (`pinset agent --drop-pins` on it), and the exit
// status is 1.
import type { KubeConfig } from '@kubernetes/client-node';
import { KubeApiError, KubeHttp } from '../api/kube-http.ts';
import { loadClientKubeConfig } from '../api/kubeconfig.ts';
import { listAll, METADATA_LIST_ACCEPT } from '../api/list-pages.ts';
import { CRD_NAME, GROUP, PLURAL, VERSION } from '../api/types.ts';
import { helpText, parseFlags, type FlagSpec } from '../util/flags.ts';
import { createLogger } from '../util/log.ts';
import { apiError } from './api-error.ts';
import { ClusterObjects, inRemovalOrder, type ObjectState } from './cluster-objects.ts';
import { describeObject, PINSET_LABEL, PINSET_LABEL_VALUE, readManifests, type ManifestObject } from './manifests.ts';
import { namespaceContents, whyKept } from './namespace-contents.ts';
import { dropPinsAdvice, nodePins, podNames, podsOf, waitForNoPins, waitForPodsGone, type NodePins } from './uninstall-wait.ts';

export const UNINSTALL_FLAGS: readonly FlagSpec[] = [
  { name: 'kubeconfig', env: 'KUBECONFIG', type: 'string', help: 'kubeconfig file; the usual search (~/.kube/config, in-cluster) when unset' },
  {
    name: 'manifests',
    env: 'PINSET_MANIFESTS',
    type: 'string',
    help: 'what pinset was installed with: a kustomization folder (deploy/, deploy/containerd/), a YAML file, or - for standard input (`kubectl kustomize DIR | pinset uninstall --manifests -`); default: the deploy/ shipped with this pinset',
  },
  { name: 'dry-run', env: 'PINSET_DRY_RUN', type: 'bool', default: false, help: 'print the plan (sets, nodes and their pins, objects) and change nothing' },
  { name: 'keep-pins', env: 'PINSET_KEEP_PINS', type: 'bool', default: false, help: 'keep the sets\' pins on the nodes: do not delete the sets nor wait for the nodes; the agents go first and the sets with their CRD' },
  { name: 'wait-timeout', env: 'PINSET_WAIT_TIMEOUT', type: 'duration', default: '5m', help: 'how long to wait for every node\'s agent to report it holds no pins (a node that has not by then is named), and then for the agents\' and the controller\'s pods to go' },
  { name: 'request-timeout', env: 'PINSET_REQUEST_TIMEOUT', type: 'duration', default: '15s', help: 'give up on one API request after this long' },
];

const SETS_PATH = `/apis/${GROUP}/${VERSION}/${PLURAL}`;
const CRD_REF: ManifestObject = { apiVersion: 'apiextensions.k8s.io/v1', kind: 'CustomResourceDefinition', name: CRD_NAME, doc: {} };
/** The kinds whose pods run pinset: removed first, and their pods waited for before what those need. */
const WORKLOAD_KINDS: ReadonlySet<string> = new Set(['DaemonSet', 'Deployment']);

const plural = (n: number, one: string, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;


/** What happens to one object of the manifests: removed, or kept and why. */
type Decision = { remove: true } | { remove: false; why: string };

/** One object of the manifests as the cluster holds it, and what happens to it. */
interface Planned {
  o: ManifestObject;
  state: ObjectState;
  /** It carries pinset's label. */
  pinsets: boolean;
  uid?: string;
  decision: Decision;
}

/** What the cluster holds now, for the plan. */
interface Found {
  /** The sets' names; null when their type is not served (the CRD missing). */
  sets: string[] | null;
  crd: ObjectState;
  nodes: NodePins[];
  objects: Planned[];
}

/** What every step needs: the API, how to say things, the flags. */
interface Run {
  http: KubeHttp;
  cluster: ClusterObjects;
  manifests: ManifestObject[];
  say: (s: string) => void;
  timeoutMs: number;
  waitMs: number;
  keepPins: boolean;
}

const NOT_LABELLED = `not pinset's: it lacks the label ${PINSET_LABEL}=${PINSET_LABEL_VALUE}`;

/** The sets' names; null when their type is not served (the CRD missing). */
async function listSets(http: KubeHttp, timeoutMs: number): Promise<string[] | null> {
  try {
    return (await listAll<{ metadata?: { name?: string } }, string>({ http, path: SETS_PATH, accept: METADATA_LIST_ACCEPT, timeoutMs }, (s) => s.metadata?.name ?? '')).items.sort();
  } catch (err) {
    if (err instanceof KubeApiError && err.code === 404) return null;
    throw err;
  }
}

/** Whether a Namespace that carries pinset's label may go: it holds nothing else. */
async function namespaceDecision(r: Pick<Run, 'http' | 'timeoutMs' | 'manifests'>, name: string): Promise<Decision> {
  const why = whyKept(await namespaceContents(r.http, name, { timeoutMs: r.timeoutMs, manifests: r.manifests }));
  return why ? { remove: false, why } : { remove: true };
}

/** What happens to one object: only what is there and carries pinset's label goes; a Namespace only when it holds nothing but pinset's. */
async function plan(r: Run, o: ManifestObject): Promise<Planned> {
  const { state, pinsets, uid } = await r.cluster.inspect(o);
  const base = { o, state, pinsets, ...(uid ? { uid } : {}) };
  if (state !== 'present' && state !== 'terminating') return { ...base, decision: { remove: true } };
  if (!pinsets) return { ...base, decision: { remove: false, why: NOT_LABELLED } };
  if (o.kind === 'Namespace' && o.apiVersion === 'v1') return { ...base, decision: await namespaceDecision(r, o.name) };
  return { ...base, decision: { remove: true } };
}

async function look(r: Run): Promise<Found> {
  // The sets and their CRD first, together: the plan's first steps follow from them.
  const sets = await listSets(r.http, r.timeoutMs);
  const crd = await r.cluster.state(r.manifests.find((o) => o.kind === CRD_REF.kind && o.name === CRD_NAME) ?? CRD_REF);
  const now = new Date();
  const nodes = (
    await listAll<{ metadata?: { name?: string; annotations?: Record<string, string> } }, NodePins>({ http: r.http, path: '/api/v1/nodes', accept: METADATA_LIST_ACCEPT, timeoutMs: r.timeoutMs }, (n) =>
      nodePins(n.metadata?.name ?? '', n.metadata?.annotations, now),
    )
  ).items.sort((a, b) => (a.node < b.node ? -1 : 1));
  const objects: Planned[] = [];
  for (const o of inRemovalOrder(r.manifests)) objects.push(await plan(r, o));
  return { sets, crd, nodes, objects };
}

function nodeLine(n: NodePins): string {
  switch (n.state) {
    case 'clear':
      return `${n.node}: no pins`;
    case 'silent':
      return `${n.node}: no report (no pinset agent has written one)`;
    case 'holding':
      return `${n.node}: ${plural(n.pins, 'pin')}`;
    case 'unknown':
      return `${n.node}: pins unknown: ${n.why}`;
  }
}

/** One object's line in the plan: as it is there, and what happens to it when that is not plain removal. */
function objectLine(p: Planned): string {
  const state = p.state === 'present' ? '' : ` (${p.state})`;
  if (!p.decision.remove) return `${describeObject(p.o)}${state}: kept: ${p.decision.why}`;
  return `${describeObject(p.o)}${state}${p.o.kind === 'Namespace' && p.state === 'present' ? ': it holds only pinset\'s objects' : ''}`;
}

function planText(f: Found, o: { keepPins: boolean; waitMs: number; server: string; from: string; crdInManifests: boolean }): string {
  const lines = [`Uninstalling pinset from ${o.server}, as the manifests of ${o.from} install it.`];
  let step = 1;
  const holding = f.nodes.filter((n) => n.state === 'holding' || n.state === 'unknown');
  if (o.keepPins) {
    lines.push(`${step++}. Keep the sets and their pins (--keep-pins): the agents go first, then the sets with their CRD, which no agent takes as their deletion.`);
    if (holding.length > 0) lines.push(`   ${plural(holding.length, 'node')} keep their pins, which only \`pinset agent --drop-pins\` on each will remove.`);
  } else {
    if (f.crd === 'absent' || f.crd === 'terminating') {
      lines.push(
        `${step++}. The CustomResourceDefinition ${CRD_NAME} is ${f.crd === 'absent' ? 'missing' : 'being deleted'}: agents keep their pins while it is. ` +
          (o.crdInManifests
            ? `${f.crd === 'terminating' ? 'Wait for it to go, then i' : 'I'}nstall it again from the manifests, so that the agents see the sets deleted (next step) and unpin.`
            : 'The manifests do not hold it, so it cannot be installed again: the agents will not unpin.'),
      );
    }
    const sets = f.sets ?? [];
    const which = f.sets === null ? 'those there are once the CRD is back' : sets.length === 0 ? 'none' : `${sets.length} (${sets.slice(0, 10).join(', ')}${sets.length > 10 ? ', ...' : ''})`;
    lines.push(`${step++}. Delete every PinnedImageSet: ${which}.`);
    lines.push(`${step++}. Wait up to ${Math.round(o.waitMs / 1000)}s until every node's agent reports it holds no pins:`);
    for (const n of f.nodes) lines.push(`   ${nodeLine(n)}`);
    if (f.nodes.length === 0) lines.push('   (no nodes)');
  }
  const kept = f.objects.filter((p) => !p.decision.remove).length;
  lines.push(`${step++}. Remove what the manifests install and is pinset's (${plural(f.objects.length, 'object')}${kept > 0 ? `, ${kept} of them kept` : ''}), in this order:`);
  for (const p of f.objects) lines.push(`   ${objectLine(p)}`);
  return `${lines.join('\n')}\n`;
}

/** The command's flags, for its --help and the reference (docs/reference.md; a test holds the two together). */
export const flags = UNINSTALL_FLAGS;

export async function run(argv: string[]): Promise<number> {
  const { values } = parseFlags(UNINSTALL_FLAGS, argv);
  if (values.help) {
    process.stdout.write(
      helpText(
        'pinset uninstall [--dry-run] [--keep-pins] [--manifests DIR|FILE|-] [--wait-timeout D] [--request-timeout D] [--kubeconfig FILE]',
        'Removes pinset from the cluster: deletes every PinnedImageSet, waits until every node\'s agent reports it holds no pins, then removes what the manifests install and carries pinset\'s label: the agents and the controller first, the rest once their pods are gone; a namespace only when it holds nothing else.',
        UNINSTALL_FLAGS,
      ),
    );
    return 0;
  }
  const fail = (s: string) => {
    process.stderr.write(`pinset uninstall: ${s}\n`);
    return 1;
  };
  let kc: KubeConfig;
  let manifests: Awaited<ReturnType<typeof readManifests>>;
  try {
    kc = loadClientKubeConfig(values.kubeconfig as string | undefined);
    manifests = await readManifests(values.manifests as string | undefined);
  } catch (err) {
    return fail(apiError(err));
  }
  const timeoutMs = values['request-timeout'] as number;
  const server = kc.getCurrentCluster()?.server ?? '(no cluster)';
  const http = new KubeHttp(kc, { userAgent: 'pinset-uninstall', connectTimeoutMs: timeoutMs });
  const r: Run = {
    http,
    cluster: new ClusterObjects(http, timeoutMs),
    manifests: manifests.objects,
    say: (s) => process.stdout.write(`${s}\n`),
    timeoutMs,
    waitMs: values['wait-timeout'] as number,
    keepPins: values['keep-pins'] === true,
  };
  try {
    let found: Found;
    try {
      found = await look(r);
    } catch (err) {
      return fail(`cannot read the cluster at ${server}: ${apiError(err)}; nothing was changed`);
    }
    const crdManifest = r.manifests.find((o) => o.kind === CRD_REF.kind && o.name === CRD_NAME);
    process.stdout.write(planText(found, { keepPins: r.keepPins, waitMs: r.waitMs, server, from: manifests.from, crdInManifests: crdManifest !== undefined }));
    if (values['dry-run']) {
      r.say('Dry run: nothing was changed.');
      return 0;
    }
    const unpinned = r.keepPins ? { left: [] } : await unpinEveryNode(r, found, crdManifest);
    if ('error' in unpinned) return fail(unpinned.error);
    const workloads = await removeWorkloads(r, found);
    if (!workloads) return 1;
    const rest = await removeTheRest(r, found);
    return report(r, unpinned.left, [...workloads.failures, ...rest.failures], [...workloads.kept, ...rest.kept]);
  } finally {
    http.close();
  }
}

/**
 * Steps 1 and 2: the CRD installed again when it is missing (the agents keep
 * their pins while it is), every set deleted, the nodes waited for. The
 * nodes still holding pins when the time is up, or an error that stops
 * everything (nothing else changed).
 */
async function unpinEveryNode(r: Run, found: Found, crdManifest: ManifestObject | undefined): Promise<{ left: NodePins[] } | { error: string }> {
  let sets = found.sets ?? [];
  if ((found.crd === 'absent' || found.crd === 'terminating') && crdManifest) {
    const deadline = Date.now() + r.waitMs;
    const again = await reinstallCrd(r.cluster, crdManifest, found.crd, deadline, r.say);
    if (again) return { error: `${again}; nothing else was changed` };
    // Listed once the type is served (Established): a CRD removed without
    // its finalizer leaves its objects in storage, and they come back with it.
    for (;;) {
      const listed = await listSets(r.http, r.timeoutMs).catch((err: unknown) => apiError(err));
      if (Array.isArray(listed)) {
        sets = listed;
        break;
      }
      if (Date.now() > deadline) return { error: `the PinnedImageSets cannot be listed after the CRD was installed again: ${listed ?? 'not served'}` };
      await new Promise((res) => setTimeout(res, 1_000));
    }
  }
  for (const name of sets) {
    try {
      await r.http.json('DELETE', `${SETS_PATH}/${encodeURIComponent(name)}`, {}, undefined, { timeoutMs: r.timeoutMs });
    } catch (err) {
      if (!(err instanceof KubeApiError && err.code === 404)) return { error: `cannot delete the PinnedImageSet ${name}: ${apiError(err)}; nothing else was changed` };
    }
  }
  r.say(`Deleted ${plural(sets.length, 'PinnedImageSet')}.`);
  const log = createLogger({ level: 'warn', destination: process.stderr });
  const waited = await waitForNoPins({ http: r.http, log, timeoutMs: r.waitMs, out: process.stdout, tty: Boolean(process.stdout.isTTY) });
  r.say(
    waited.left.length === 0
      ? `Every node reports no pins (${plural(waited.clear.length, 'node')}).`
      : `${plural(waited.left.length, 'node')} still ${waited.left.length === 1 ? 'holds' : 'hold'} pins after ${Math.round(r.waitMs / 1000)}s (named below); removing pinset all the same.`,
  );
  if (waited.silent.length > 0) r.say(`No pinset agent has reported from ${plural(waited.silent.length, 'node')}, so none is known to hold pins there: ${waited.silent.join(', ')}.`);
  return { left: waited.left };
}

/** What was removed and kept: the failures, and the objects kept (each said with why). */
interface Removal {
  failures: string[];
  kept: string[];
}

/**
 * Removes the objects planned for removal, saying each, each only as it
 * was inspected (its uid a precondition of the delete). A Namespace of
 * pinset's is looked into again first: its pods and whatever else went
 * meanwhile, or came.
 */
async function removeEach(r: Run, objects: readonly Planned[]): Promise<Removal> {
  const out: Removal = { failures: [], kept: [] };
  for (const planned of objects) {
    // Not there when planned (or going): looked at again, as it may be now (the CRD installed again, a namespace made meanwhile).
    const again = planned.state !== 'present';
    const p = again ? await plan(r, planned.o).catch((err: unknown): Planned => ({ ...planned, decision: { remove: false, why: `it cannot be read: ${apiError(err)}` } })) : planned;
    const decision =
      !again && p.o.kind === 'Namespace' && p.pinsets
        ? await namespaceDecision(r, p.o.name).catch((err: unknown): Decision => ({ remove: false, why: `what it holds cannot be listed: ${apiError(err)}` }))
        : p.decision;
    if (!decision.remove) {
      r.say(`Kept ${describeObject(p.o)}: ${decision.why}.`);
      out.kept.push(describeObject(p.o));
      continue;
    }
    try {
      const was = await r.cluster.remove(p.o, p.uid);
      r.say(was === 'present' ? `Removed ${describeObject(p.o)}.` : `${describeObject(p.o)}: ${was === 'absent' ? 'already gone' : 'not served by this cluster'}.`);
    } catch (err) {
      out.failures.push(apiError(err));
      r.say(`Could not remove ${apiError(err)}`);
    }
  }
  return out;
}

/**
 * Step 3's start: the agents and the controller, then the wait for their
 * pods. The failures so far, or undefined when the pods are still there
 * (said; nothing else is removed: the pods need their RBAC, ServiceAccounts
 * and CRD until they stop).
 */
async function removeWorkloads(r: Run, found: Found): Promise<Removal | undefined> {
  const workloads = found.objects.filter((p) => WORKLOAD_KINDS.has(p.o.kind));
  const removal = await removeEach(r, workloads);
  const removed = workloads.filter((p) => p.decision.remove).map((p) => p.o);
  const pods = await waitForPodsGone({ http: r.http, workloads: removed, timeoutMs: r.waitMs, requestTimeoutMs: r.timeoutMs, out: process.stdout, tty: Boolean(process.stdout.isTTY) });
  if (pods.left.length > 0 || pods.why) {
    r.say(
      `${pods.why ? `${pods.why}; ` : ''}${pods.left.length > 0 ? `${podsOf(pods.left)} ${pods.left.length === 1 ? 'is' : 'are'} still there after ${Math.round(r.waitMs / 1000)}s: ${podNames(pods.left)}. ` : ''}` +
        `Nothing else was removed: the pods need their RBAC, ServiceAccounts and CRD until they stop. Run \`pinset uninstall${r.keepPins ? ' --keep-pins' : ''}\` again once they are gone.`,
    );
    return undefined;
  }
  if (removed.length > 0) r.say(`The agents' and the controller's pods are gone (${(pods.elapsedMs / 1000).toFixed(1)}s).`);
  return removal;
}

/** Step 3's rest: the policies, RBAC, service accounts, the CRD, the namespace last. */
function removeTheRest(r: Run, found: Found): Promise<Removal> {
  return removeEach(r, found.objects.filter((p) => !WORKLOAD_KINDS.has(p.o.kind)));
}

/** The closing lines and the exit status: 1 when a node may still hold pins or an object could not be removed. */
function report(r: Run, left: readonly NodePins[], failures: readonly string[], kept: readonly string[]): number {
  if (left.length > 0) {
    r.say(`\n${plural(left.length, 'node')} may still hold pinset's pins, and no agent is left to remove them:`);
    for (const n of left) r.say(`  ${n.node}: ${n.state === 'holding' ? `${plural(n.pins, 'pin')}: ${n.why}` : n.state === 'unknown' ? n.why : ''}`);
    for (const line of dropPinsAdvice(left)) r.say(line);
  }
  if (failures.length > 0) r.say(`\n${plural(failures.length, 'object')} could not be removed; run \`pinset uninstall\` again once the cause is fixed.`);
  if (kept.length > 0) r.say(`Kept, as not pinset's alone (said above): ${kept.join(', ')}.`);
  if (left.length === 0 && failures.length === 0) r.say(r.keepPins ? 'pinset is removed; the nodes keep their pins (see `pinset agent --drop-pins`).' : 'pinset is removed, and no node holds a pin of its.');
  return left.length === 0 && failures.length === 0 ? 0 : 1;
}

/** The CRD installed again (once the one being deleted is gone); an error message, or undefined. */
async function reinstallCrd(cluster: ClusterObjects, crd: ManifestObject, state: ObjectState, deadline: number, say: (s: string) => void): Promise<string | undefined> {
  if (state === 'terminating') {
    say(`Waiting for the CustomResourceDefinition ${CRD_NAME} being deleted to go...`);
    for (;;) {
      const now = await cluster.state(crd).catch((err: unknown) => apiError(err));
      if (now === 'absent') break;
      if (Date.now() > deadline) return `the CustomResourceDefinition ${CRD_NAME} did not go within --wait-timeout (last: ${now})`;
      await new Promise((r) => setTimeout(r, 1_000));
    }
  }
  try {
    await cluster.create(crd);
  } catch (err) {
    return `cannot install the CustomResourceDefinition ${CRD_NAME} again: ${apiError(err)}`;
  }
  say(`Installed the CustomResourceDefinition ${CRD_NAME} again.`);
  return undefined;
}
