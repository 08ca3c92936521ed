// `pinset snapshot`: a set of the images pods run now, by the digests the
// runtime reports (status.containerStatuses[].imageID, and the init and
// ephemeral containers' too), so a site can pin everything it runs before
// its registry link goes away. An imageID with no registry digest (an
// image built or loaded on the node: "sha256:<id>" only) cannot be pulled
// again, so it is listed as skipped with the reason.
// Exit status: 0 a set was printed, 1 the API could not be read or no image
// qualified, 2 usage error.
import { CoreV1Api, type KubeConfig, type V1Pod } from '@kubernetes/client-node';
import { stringify } from 'yaml';
import { loadClientKubeConfig } from '../api/kubeconfig.ts';
import { parseReference } from '../api/reference.ts';
import { parseLabelList } from '../api/selector.ts';
import { API_VERSION, KIND } from '../api/types.ts';
import { describeProblems, validateSet } from '../api/validate.ts';
import { helpText, parseFlags, UsageError, type FlagSpec } from '../util/flags.ts';
import { apiError } from './api-error.ts';
import type { CommandIO } from './resolve.ts';

export const SNAPSHOT_FLAGS: readonly FlagSpec[] = [
  { name: 'namespace', short: 'n', type: 'string', help: 'pods of this namespace (default: the kubeconfig context\'s, else "default")' },
  { name: 'all-namespaces', short: 'A', type: 'bool', default: false, help: 'pods of every namespace' },
  { name: 'selector', short: 'l', type: 'string', help: 'label selector for pods, as kubectl takes it (e.g. app=web,tier!=cache)' },
  { name: 'node-selector', type: 'string', help: 'k=v,...: only pods on nodes with these labels; the set selects those nodes too' },
  { name: 'name', type: 'string', default: 'running-images', help: 'name of the set' },
  { name: 'output', short: 'o', type: 'string', choices: ['yaml', 'json'], default: 'yaml', help: 'output format' },
  { name: 'kubeconfig', env: 'KUBECONFIG', type: 'string', help: 'kubeconfig file; the usual search (~/.kube/config, in-cluster) when unset' },
  { name: 'timeout', env: 'PINSET_SNAPSHOT_TIMEOUT', type: 'duration', default: '60s', help: 'give up reading the API after this long' },
];

const USAGE = 'pinset snapshot [--namespace NS | --all-namespaces] [-l SELECTOR] [--node-selector k=v] [--name NAME] [-o yaml|json]';
const SUMMARY =
  'Prints a PinnedImageSet of the images that pods run now, by the digests the runtime reports\n' +
  '(containers, init containers and ephemeral containers). Images with no registry digest are\n' +
  'listed on stderr as skipped, with the reason.\n' +
  'Exit status: 0 a set was printed, 1 the API could not be read or no image qualified, 2 usage error.';

export interface SkippedImage {
  pod: string;
  container: string;
  image: string;
  reason: string;
}

export interface Snapshot {
  images: string[];
  skipped: SkippedImage[];
}

/**
 * The pinnable reference in an imageID, or why there is none. Runtimes
 * report "host/path@sha256:…" (CRI-O, containerd), dockershim reported
 * "docker-pullable://host/path@sha256:…"; an image with no repo digest
 * shows as "sha256:<image id>" (or "docker://sha256:…").
 */
export function pinnableImageID(imageID: string): { ref: string } | { reason: string } {
  const id = imageID.replace(/^docker-pullable:\/\//, '').replace(/^docker:\/\//, '');
  if (!id) return { reason: 'no imageID yet (the container has not started)' };
  if (/^sha256:[a-f0-9]{64}$/.test(id)) return { reason: `no registry digest: the runtime knows it only as image ${id.slice(0, 19)}… (built or loaded on the node), so it cannot be pulled again` };
  // Docker Hub images are reported without a host by some runtimes.
  const withHost = /^[^/]+\.[^/]+\/|^[^/]+:\d+\/|^localhost\//.test(id) ? id : `docker.io/${id.includes('/') ? '' : 'library/'}${id}`;
  const r = parseReference(withHost);
  return r.ok ? { ref: r.value.reference } : { reason: `imageID ${JSON.stringify(imageID.slice(0, 200))} is not a registry digest reference` };
}

/** The images of the pods; running and pending pods only (a finished pod's images are not in use). */
export function snapshotOf(pods: readonly V1Pod[]): Snapshot {
  const images = new Set<string>();
  const skipped: SkippedImage[] = [];
  for (const pod of pods) {
    const phase = pod.status?.phase;
    if (phase === 'Succeeded' || phase === 'Failed') continue;
    const podName = `${pod.metadata?.namespace ?? ''}/${pod.metadata?.name ?? ''}`;
    const statuses = [...(pod.status?.initContainerStatuses ?? []), ...(pod.status?.containerStatuses ?? []), ...(pod.status?.ephemeralContainerStatuses ?? [])];
    for (const st of statuses) {
      const p = pinnableImageID(st.imageID ?? '');
      if ('ref' in p) images.add(p.ref);
      else skipped.push({ pod: podName, container: st.name, image: st.image ?? '', reason: p.reason });
    }
  }
  return { images: [...images].sort(), skipped };
}

async function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  p.catch(() => {});
  try {
    return await Promise.race([p, new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`no answer within ${ms}ms while ${what}`)), ms)))]);
  } finally {
    clearTimeout(timer);
  }
}

/** Every pod the flags ask for, page by page (500 a page, as kubectl asks). */
async function listPods(api: CoreV1Api, namespace: string | undefined, labelSelector: string | undefined): Promise<V1Pod[]> {
  const pods: V1Pod[] = [];
  let cont: string | undefined;
  do {
    const page = namespace === undefined
      ? await api.listPodForAllNamespaces({ labelSelector, limit: 500, _continue: cont })
      : await api.listNamespacedPod({ namespace, labelSelector, limit: 500, _continue: cont });
    pods.push(...page.items);
    cont = page.metadata?._continue || undefined;
  } while (cont);
  return pods;
}

/** The command's flags, for its --help and the reference (docs/reference.md; a test holds the two together). */
export const flags = SNAPSHOT_FLAGS;

export async function run(argv: string[], io: CommandIO = { stdin: process.stdin, stdout: process.stdout, stderr: process.stderr }): Promise<number> {
  const { values } = parseFlags(SNAPSHOT_FLAGS, argv);
  if (values.help) {
    io.stdout.write(helpText(USAGE, SUMMARY, SNAPSHOT_FLAGS));
    return 0;
  }
  if (values['all-namespaces'] && values.namespace) throw new UsageError('--namespace and --all-namespaces exclude each other');
  let nodeLabels: Record<string, string> | undefined;
  if (values['node-selector'] !== undefined) {
    try {
      nodeLabels = parseLabelList(values['node-selector'] as string);
    } catch (e) {
      throw new UsageError(`--node-selector: ${(e as Error).message}`);
    }
  }
  let kc: KubeConfig;
  try {
    kc = loadClientKubeConfig(values.kubeconfig as string | undefined);
  } catch (e) {
    io.stderr.write(`pinset snapshot: ${(e as Error).message}\n`);
    return 1;
  }
  const server = kc.getCurrentCluster()?.server ?? '(no cluster)';
  const namespace = values['all-namespaces'] ? undefined : ((values.namespace as string | undefined) ?? kc.getContextObject(kc.getCurrentContext())?.namespace ?? 'default');
  const api = kc.makeApiClient(CoreV1Api);
  const timeoutMs = values.timeout as number;
  let pods: V1Pod[];
  try {
    pods = await withTimeout(listPods(api, namespace, values.selector as string | undefined), timeoutMs, 'listing pods');
    if (nodeLabels) {
      const selector = Object.entries(nodeLabels).map(([k, v]) => `${k}=${v}`).join(',');
      const nodes = await withTimeout(api.listNode({ labelSelector: selector }), timeoutMs, 'listing nodes');
      const names = new Set(nodes.items.map((n) => n.metadata?.name));
      pods = pods.filter((p) => p.spec?.nodeName && names.has(p.spec.nodeName));
    }
  } catch (e) {
    io.stderr.write(`pinset snapshot: cannot list ${nodeLabels ? 'pods and nodes' : 'pods'} from the API server at ${server}: ${apiError(e)}\n`);
    return 1;
  }
  const snap = snapshotOf(pods);
  for (const s of snap.skipped) io.stderr.write(`pinset snapshot: skipped ${s.pod} container ${s.container} (${s.image}): ${s.reason}\n`);
  const where = namespace === undefined ? 'any namespace' : `namespace ${namespace}`;
  if (snap.images.length === 0) {
    io.stderr.write(`pinset snapshot: no pod in ${where}${values.selector ? ` matching ${values.selector}` : ''}${nodeLabels ? ' on the selected nodes' : ''} runs an image with a registry digest; no set printed\n`);
    return 1;
  }
  const set = {
    apiVersion: API_VERSION,
    kind: KIND,
    metadata: { name: values.name as string },
    spec: { ...(nodeLabels ? { nodeSelector: { matchLabels: nodeLabels } } : {}), pinnedImages: snap.images.map((name) => ({ name })) },
  };
  const problems = describeProblems(validateSet(set));
  if (problems.length) {
    for (const p of problems) io.stderr.write(`pinset snapshot: ${p}\n`);
    return 1;
  }
  if (values.output === 'json') io.stdout.write(`${JSON.stringify(set, null, 2)}\n`);
  else {
    const header = `# pinset snapshot of ${snap.images.length} image(s) run by pods in ${where}${values.selector ? ` matching ${values.selector}` : ''}${snap.skipped.length ? `; ${snap.skipped.length} container(s) skipped (see stderr)` : ''}\n`;
    io.stdout.write(header + stringify(set, { lineWidth: 0 }));
  }
  return 0;
}
