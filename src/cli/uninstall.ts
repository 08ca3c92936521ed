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
//    DaemonSet for its grace period).
// --dry-run prints that plan and changes nothing. --keep-pins keeps the
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
import { describeObject, readManifests, type ManifestObject } from './manifests.ts';
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


/** What the cluster holds now, for the plan. */
interface Found {
  /** The sets' names; null when their type is not served (the CRD missing). */
  sets: string[] | null;
  crd: ObjectState;
  nodes: NodePins[];
  objects: { o: ManifestObject; state: ObjectState }[];
}

/** The sets' names; null when their type is not served (the CRD missing). */
async function listSets(http: KubeHttp, timeoutMs: number): Promise<string[] | null> {
  try {
    return (await listAll<{ metadata?: { name?: string } }, string>({ http, path: SETS_PATH, accept: METADATA_LIST_ACCEPT, timeoutMs }, (s) => s.metadata?.name ?? '')).items.sort();
  } catch (err) {
    if (err instanceof KubeApiError && err.code === 404) return null;
    throw err;
  }
}

async function look(http: KubeHttp, cluster: ClusterObjects, objects: ManifestObject[], timeoutMs: number): Promise<Found> {
  const sets = await listSets(http, timeoutMs);
  const now = new Date();
  const nodes = (
    await listAll<{ metadata?: { name?: string; annotations?: Record<string, string> } }, NodePins>({ http, path: '/api/v1/nodes', accept: METADATA_LIST_ACCEPT, timeoutMs }, (n) =>
      nodePins(n.metadata?.name ?? '', n.metadata?.annotations, now),
    )
  ).items.sort((a, b) => (a.node < b.node ? -1 : 1));
  const states = [];
  for (const o of inRemovalOrder(objects)) states.push({ o, state: await cluster.state(o) });
  return { sets, crd: await cluster.state(objects.find((o) => o.kind === CRD_REF.kind && o.name === CRD_NAME) ?? CRD_REF), nodes, objects: states };
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
  lines.push(`${step++}. Remove what the manifests install (${plural(f.objects.length, 'object')}), in this order:`);
  for (const { o: obj, state } of f.objects) lines.push(`   ${describeObject(obj)}${state === 'present' ? '' : ` (${state})`}`);
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
        'Removes pinset from the cluster: deletes every PinnedImageSet, waits until every node\'s agent reports it holds no pins, then removes what the manifests install: the agents and the controller first, the rest once their pods are gone.',
        UNINSTALL_FLAGS,
      ),
    );
    return 0;
  }
  const say = (s: string) => process.stdout.write(`${s}\n`);
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
  const waitMs = values['wait-timeout'] as number;
  const keepPins = values['keep-pins'] === true;
  const server = kc.getCurrentCluster()?.server ?? '(no cluster)';
  const http = new KubeHttp(kc, { userAgent: 'pinset-uninstall', connectTimeoutMs: timeoutMs });
  const cluster = new ClusterObjects(http, timeoutMs);
  const crdManifest = manifests.objects.find((o) => o.kind === CRD_REF.kind && o.name === CRD_NAME);
  try {
    let found: Found;
    try {
      found = await look(http, cluster, manifests.objects, timeoutMs);
    } catch (err) {
      return fail(`cannot read the cluster at ${server}: ${apiError(err)}; nothing was changed`);
    }
    process.stdout.write(planText(found, { keepPins, waitMs, server, from: manifests.from, crdInManifests: crdManifest !== undefined }));
    if (values['dry-run']) {
      say('Dry run: nothing was changed.');
      return 0;
    }
    let left: NodePins[] = [];
    if (!keepPins) {
      let sets = found.sets ?? [];
      if ((found.crd === 'absent' || found.crd === 'terminating') && crdManifest) {
        const deadline = Date.now() + waitMs;
        const again = await reinstallCrd(cluster, crdManifest, found.crd, deadline, say);
        if (again) return fail(`${again}; nothing else was changed`);
        // Listed once the type is served (Established): a CRD removed without
        // its finalizer leaves its objects in storage, and they come back with it.
        for (;;) {
          const listed = await listSets(http, timeoutMs).catch((err: unknown) => apiError(err));
          if (Array.isArray(listed)) {
            sets = listed;
            break;
          }
          if (Date.now() > deadline) return fail(`the PinnedImageSets cannot be listed after the CRD was installed again: ${listed ?? 'not served'}`);
          await new Promise((r) => setTimeout(r, 1_000));
        }
      }
      for (const name of sets) {
        try {
          await http.json('DELETE', `${SETS_PATH}/${encodeURIComponent(name)}`, {}, undefined, { timeoutMs });
        } catch (err) {
          if (!(err instanceof KubeApiError && err.code === 404)) return fail(`cannot delete the PinnedImageSet ${name}: ${apiError(err)}; nothing else was changed`);
        }
      }
      say(`Deleted ${plural(sets.length, 'PinnedImageSet')}.`);
      const log = createLogger({ level: 'warn', destination: process.stderr });
      const waited = await waitForNoPins({ http, log, timeoutMs: waitMs, out: process.stdout, tty: Boolean(process.stdout.isTTY) });
      left = waited.left;
      say(
        left.length === 0
          ? `Every node reports no pins (${plural(waited.clear.length, 'node')}).`
          : `${plural(left.length, 'node')} still ${left.length === 1 ? 'holds' : 'hold'} pins after ${Math.round(waitMs / 1000)}s (named below); removing pinset all the same.`,
      );
      if (waited.silent.length > 0) say(`No pinset agent has reported from ${plural(waited.silent.length, 'node')}, so none is known to hold pins there: ${waited.silent.join(', ')}.`);
    }
    const failures: string[] = [];
    const remove = async (objects: readonly { o: ManifestObject }[]) => {
      for (const { o } of objects) {
        try {
          const was = await cluster.remove(o);
          say(was === 'present' ? `Removed ${describeObject(o)}.` : `${describeObject(o)}: ${was === 'absent' ? 'already gone' : 'not served by this cluster'}.`);
        } catch (err) {
          failures.push(apiError(err));
          say(`Could not remove ${apiError(err)}`);
        }
      }
    };
    // The agents and the controller first; what they need (RBAC, ServiceAccounts, the CRD) once their pods are gone.
    const workloads = found.objects.filter(({ o }) => WORKLOAD_KINDS.has(o.kind));
    await remove(workloads);
    const pods = await waitForPodsGone({ http, workloads: workloads.map(({ o }) => o), timeoutMs: waitMs, requestTimeoutMs: timeoutMs, out: process.stdout, tty: Boolean(process.stdout.isTTY) });
    if (pods.left.length > 0 || pods.why) {
      say(
        `${pods.why ? `${pods.why}; ` : ''}${pods.left.length > 0 ? `${podsOf(pods.left)} ${pods.left.length === 1 ? 'is' : 'are'} still there after ${Math.round(waitMs / 1000)}s: ${podNames(pods.left)}. ` : ''}` +
          `Nothing else was removed: the pods need their RBAC, ServiceAccounts and CRD until they stop. Run \`pinset uninstall${keepPins ? ' --keep-pins' : ''}\` again once they are gone.`,
      );
      return 1;
    }
    if (workloads.length > 0) say(`The agents' and the controller's pods are gone (${(pods.elapsedMs / 1000).toFixed(1)}s).`);
    await remove(found.objects.filter(({ o }) => !WORKLOAD_KINDS.has(o.kind)));
    if (left.length > 0) {
      say(`\n${plural(left.length, 'node')} may still hold pinset's pins, and no agent is left to remove them:`);
      for (const n of left) say(`  ${n.node}: ${n.state === 'holding' ? `${plural(n.pins, 'pin')}: ${n.why}` : n.state === 'unknown' ? n.why : ''}`);
      for (const line of dropPinsAdvice(left)) say(line);
    }
    if (failures.length > 0) say(`\n${plural(failures.length, 'object')} could not be removed; run \`pinset uninstall\` again once the cause is fixed.`);
    if (left.length === 0 && failures.length === 0) say(keepPins ? 'pinset is removed; the nodes keep their pins (see `pinset agent --drop-pins`).' : 'pinset is removed, and no node holds a pin of its.');
    return left.length === 0 && failures.length === 0 ? 0 : 1;
  } finally {
    http.close();
  }
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
