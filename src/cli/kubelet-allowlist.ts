// `pinset kubelet-allowlist`: a kubelet configuration drop-in (for the
// kubelet's --config-dir) that exempts the images of pinset's sets from the
// kubelet's credential verification (KEP-2535), so their pods start from
// the node with no registry in reach: policy NeverVerifyAllowlistedImages,
// and in preloadedImagesVerificationAllowlist one "/*" entry per parent path
// of the sets' repositories. Why "/*" and not the repositories' names: in
// 1.35 an entry without "/*" is compared with the pod's whole image string,
// tag or digest included, and matches no pod (src/api/kubelet-verification.ts).
//
// Sets come from files (PinnedImageSet YAML, or folders of them as the
// agent's static folder holds them) and, with --node, from the API: then
// only the sets that select that node (its labels read from the API) count.
// Written with the YAML library, each entry checked with the kubelet's own
// rules first; any problem in the input prints nothing and exits 1.
import type { KubeConfig } from '@kubernetes/client-node';
import { readdir, readFile, stat } from 'node:fs/promises';
import * as path from 'node:path';
import { Document, YAMLSeq, Scalar } from 'yaml';
import { KubeApiError, KubeHttp } from '../api/kube-http.ts';
import { loadClientKubeConfig } from '../api/kubeconfig.ts';
import { allowlistEntryFor, allowlistProblems, GATE, gateDefault, minimalAllowlist } from '../api/kubelet-verification.ts';
import { DEFAULT_PAGE_SIZE, listAll } from '../api/list-pages.ts';
import { selectorMatches } from '../api/selector.ts';
import { GROUP, PLURAL, VERSION, type LabelSelector, type PinnedImageSet } from '../api/types.ts';
import { describeProblems, validateSet } from '../api/validate.ts';
import { parseYamlDocuments } from '../api/yaml.ts';
import { helpText, parseFlags, UsageError, type FlagSpec } from '../util/flags.ts';
import type { CommandIO } from './resolve.ts';

const FLAGS: readonly FlagSpec[] = [
  { name: 'node', type: 'string', help: 'only the sets that select this Node (its labels and the PinnedImageSets read from the API, with the FILEs\' sets)' },
  { name: 'kubeconfig', env: 'KUBECONFIG', type: 'string', help: 'kubeconfig file, with --node; the usual search (~/.kube/config, in-cluster) when unset' },
  { name: 'timeout', env: 'PINSET_KUBELET_ALLOWLIST_TIMEOUT', type: 'duration', default: '15s', help: 'give up on an API request after this long' },
  {
    name: 'kubelet-gate-on',
    type: 'bool',
    default: false,
    help: "with --node: the node's kubelet is 1.33 or 1.34 and runs with the feature gate KubeletEnsureSecretPulledImages on (off by default there; a kubelet with it off refuses the drop-in and does not start, so without this flag nothing is printed for such a node)",
  },
];

const USAGE = 'pinset kubelet-allowlist [--node NAME [--kubelet-gate-on]] [--kubeconfig FILE] [--timeout DURATION] [FILE|DIR...]';
const SUMMARY =
  "Prints a kubelet configuration drop-in (for the kubelet's --config-dir) that keeps the kubelet's\n" +
  'credential verification (Kubernetes 1.35 and later) from refusing the images of the sets offline:\n' +
  'imagePullCredentialsVerificationPolicy NeverVerifyAllowlistedImages, and one "/*" entry per parent\n' +
  'path of the sets\' repositories in preloadedImagesVerificationAllowlist.\n' +
  'FILE: PinnedImageSet YAML; DIR: its .yaml, .yml and .json files (as the agent\'s static folder).\n' +
  "With --node, the sets that select that node, from the API and the FILEs, for that node's kubelet version.\n" +
  'Exit status: 0 printed, 1 nothing printed (a set or the API could not be read, no set selects the node,\n' +
  "or the node's kubelet has no use for the drop-in or would refuse it), 2 usage error or a FILE or DIR\n" +
  'that cannot be read.\n' +
  'See docs/kubelet-credential-verification.md.';

export const flags = FLAGS;

/** A set as this command needs it. */
export interface AllowlistSet {
  name: string;
  /** "api", or the file it was read from. */
  origin: string;
  selector?: LabelSelector;
  images: string[];
}

const SET_FILE = /\.(ya?ml|json)$/i;

/** Sets of one file's text; problems named by file, document and field. */
export function setsOfText(file: string, text: string): { sets: AllowlistSet[]; problems: string[] } {
  const sets: AllowlistSet[] = [];
  const problems: string[] = [];
  parseYamlDocuments(text).forEach((d, i) => {
    const label = `${file}: document ${i + 1}`;
    if ('error' in d) return void problems.push(`${label}: ${d.error}`);
    const set = setOf(d.value, file);
    if (typeof set === 'string') problems.push(`${label}: ${set}`);
    else sets.push(set);
  });
  return { sets, problems };
}

/** A set from an object, or what is wrong with it (every problem: an entry left out would leave images verified). */
function setOf(obj: unknown, origin: string): AllowlistSet | string {
  const v = validateSet(obj);
  const problems = describeProblems(v);
  if (problems.length > 0) return problems.join('; ');
  const s = obj as PinnedImageSet;
  return { name: s.metadata.name, origin, selector: s.spec.nodeSelector, images: v.images.map((i) => i.reference) };
}

async function filesOf(arg: string): Promise<string[]> {
  let isDir: boolean;
  try {
    isDir = (await stat(arg)).isDirectory();
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    throw new UsageError(`cannot read ${arg}: ${code === 'ENOENT' ? 'no such file or folder' : (code ?? (e as Error).message)}`);
  }
  if (!isDir) return [arg];
  const names = (await readdir(arg)).filter((n) => !n.startsWith('.') && SET_FILE.test(n)).sort();
  return names.map((n) => path.join(arg, n));
}

/** The sets of FILE and DIR arguments, with what is wrong in them; an unreadable one is a usage error (exit 2). */
export async function setsOfFiles(args: readonly string[]): Promise<{ sets: AllowlistSet[]; problems: string[] }> {
  const out = { sets: [] as AllowlistSet[], problems: [] as string[] };
  for (const arg of args) {
    for (const file of await filesOf(arg)) {
      let text: string;
      try {
        text = await readFile(file, 'utf8');
      } catch (e) {
        throw new UsageError(`cannot read ${file}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
      }
      const r = setsOfText(file, text);
      out.sets.push(...r.sets);
      out.problems.push(...r.problems);
    }
  }
  return out;
}

/** The allowlist's entries, each with the sets and repositories it covers. */
export interface AllowlistEntry {
  entry: string;
  sets: string[];
  repositories: string[];
}

/** The minimal "/*" entries covering every image of `sets`, sorted, each with what it covers. */
export function allowlistEntries(sets: readonly AllowlistSet[]): AllowlistEntry[] {
  const wanted = new Map<string, { set: string; repository: string }[]>();
  for (const s of sets) {
    for (const image of s.images) {
      const entry = allowlistEntryFor(image);
      if (!entry) continue; // set references always name a host and a path (src/api/reference.ts)
      const repository = image.slice(0, image.lastIndexOf('@') < 0 ? image.length : image.lastIndexOf('@'));
      const list = wanted.get(entry) ?? [];
      list.push({ set: s.name, repository });
      wanted.set(entry, list);
    }
  }
  const kept = minimalAllowlist(wanted.keys());
  return kept.map((entry) => {
    const prefix = entry.slice(0, -1);
    const covered = [...wanted].filter(([e]) => e.slice(0, -1).startsWith(prefix)).flatMap(([, c]) => c);
    return { entry, sets: [...new Set(covered.map((c) => c.set))].sort(), repositories: [...new Set(covered.map((c) => c.repository))].sort() };
  });
}

const HEADER = [
  ' A kubelet configuration drop-in from `pinset kubelet-allowlist`: the images of',
  " pinset's sets start from the node without the registry, whatever credentials",
  " their pods have. Save it in the kubelet's --config-dir under a name ending in",
  ' ".conf" (e.g. 50-pinset.conf, sorting after the files it must override) and',
  ' restart the kubelet. For Kubernetes 1.35 and later: a kubelet with the feature',
  ' gate KubeletEnsureSecretPulledImages off (the default of 1.33 and 1.34) refuses',
  ' these fields and does not start; 1.32 ignores them.',
  ' Each "/*" entry exempts every repository below its path, sibling repositories',
  ' of the pinned ones included. The kubelet matches the image as the pod spells',
  ' it: pods must spell registry host and path as the sets do (not "nginx" for',
  ' "docker.io/library/nginx"); a tag or a digest may differ.',
];

/** The drop-in as YAML text, comments included. Entries are checked with the kubelet's rules first. */
export function renderDropin(entries: readonly AllowlistEntry[], source: string): string {
  const problems = allowlistProblems(entries.map((e) => e.entry));
  if (problems.length > 0) throw new Error(`an allowlist entry the kubelet would refuse: ${problems.join('; ')}`);
  const doc = new Document({
    apiVersion: 'kubelet.config.k8s.io/v1beta1',
    kind: 'KubeletConfiguration',
    imagePullCredentialsVerificationPolicy: 'NeverVerifyAllowlistedImages',
    preloadedImagesVerificationAllowlist: entries.map((e) => e.entry),
  });
  doc.commentBefore = [...HEADER, ` Sets: ${source}.`].join('\n');
  const list = doc.get('preloadedImagesVerificationAllowlist', true) as YAMLSeq<Scalar>;
  entries.forEach((e, i) => {
    const item = list.items[i]!;
    item.commentBefore = [` ${e.sets.length === 1 ? 'set' : 'sets'} ${e.sets.join(', ')}: covers ${e.repositories.join(', ')}`, ` and any other repository under ${e.entry.slice(0, -2)}/`].join('\n');
  });
  return doc.toString({ lineWidth: 0 });
}

interface NodeObject {
  metadata?: { labels?: Record<string, string> };
  status?: { nodeInfo?: { kubeletVersion?: string } };
}

/**
 * Why the drop-in must not be given to a kubelet of `version`, or undefined:
 * before 1.33 there is no verification to exempt from; in 1.33 and 1.34 the
 * gate is off unless turned on, and a kubelet with it off refuses the two
 * fields and does not start (validation.go). An unknown version counts as 1.35.
 */
export function kubeletVersionProblem(nodeName: string, version: string | undefined, gateOn: boolean): string | undefined {
  const gate = gateDefault(version);
  if (!gate.known) return `node ${nodeName} runs kubelet ${version}, which does not verify the credentials of images already on the node (that came in 1.33): it needs no drop-in`;
  if (!gate.on && !gateOn) {
    return `node ${nodeName} runs kubelet ${version}: there the feature gate ${GATE} is off unless the kubelet turns it on, and a kubelet with it off refuses these fields and does not start. With the gate off the kubelet does not verify, and pinned images start offline without a drop-in; if this kubelet runs with the gate on, add --kubelet-gate-on`;
  }
  return undefined;
}

async function setsOfNode(nodeName: string, kc: KubeConfig, timeoutMs: number): Promise<{ labels: Record<string, string>; kubeletVersion?: string; sets: AllowlistSet[]; problems: string[] }> {
  const http = new KubeHttp(kc, { userAgent: 'pinset-kubelet-allowlist', connectTimeoutMs: timeoutMs });
  try {
    const node = await http.json<NodeObject>('GET', `/api/v1/nodes/${encodeURIComponent(nodeName)}`, {}, undefined, { timeoutMs });
    const list = await listAll<unknown, unknown>({ http, path: `/apis/${GROUP}/${VERSION}/${PLURAL}`, pageSize: DEFAULT_PAGE_SIZE, timeoutMs }, (o) => o);
    const sets: AllowlistSet[] = [];
    const problems: string[] = [];
    for (const o of list.items) {
      const s = setOf(o, 'api');
      const name = (o as { metadata?: { name?: string } })?.metadata?.name ?? '?';
      if (typeof s === 'string') problems.push(`PinnedImageSet ${name}: ${s}`);
      else sets.push(s);
    }
    return { labels: node?.metadata?.labels ?? {}, kubeletVersion: node?.status?.nodeInfo?.kubeletVersion, sets, problems };
  } finally {
    http.close();
  }
}

export async function run(argv: string[], io: CommandIO = { stdin: process.stdin, stdout: process.stdout, stderr: process.stderr }): Promise<number> {
  const { values, positional: positionals } = parseFlags(FLAGS, argv);
  if (values.help) {
    io.stdout.write(helpText(USAGE, SUMMARY, FLAGS));
    return 0;
  }
  const nodeName = values.node as string | undefined;
  if (!nodeName && positionals.length === 0) throw new UsageError(`give set files or folders, or --node\nusage: ${USAGE}`);
  if (values['kubelet-gate-on'] && !nodeName) throw new UsageError(`--kubelet-gate-on goes with --node\nusage: ${USAGE}`);
  const fromFiles = await setsOfFiles(positionals);
  let sets = fromFiles.sets;
  const problems = [...fromFiles.problems];
  if (nodeName) {
    let kc: KubeConfig;
    try {
      kc = loadClientKubeConfig(values.kubeconfig as string | undefined);
    } catch (err) {
      io.stderr.write(`pinset kubelet-allowlist: ${(err as Error).message}\n`);
      return 1;
    }
    try {
      const fromApi = await setsOfNode(nodeName, kc, values.timeout as number);
      const refused = kubeletVersionProblem(nodeName, fromApi.kubeletVersion, Boolean(values['kubelet-gate-on']));
      if (refused) {
        io.stderr.write(`pinset kubelet-allowlist: ${refused}; nothing printed\n`);
        return 1;
      }
      problems.push(...fromApi.problems);
      sets = [...fromApi.sets, ...sets].filter((s) => selectorMatches(s.selector, fromApi.labels));
    } catch (err) {
      const why = err instanceof KubeApiError && err.code === 404 ? `Node ${nodeName} does not exist` : (err as Error).message;
      io.stderr.write(`pinset kubelet-allowlist: cannot read the node and its sets from the API: ${why}\n`);
      return 1;
    }
  }
  if (problems.length > 0) {
    for (const p of problems) io.stderr.write(`pinset kubelet-allowlist: ${p}\n`);
    io.stderr.write('pinset kubelet-allowlist: nothing printed: an allowlist without those sets would leave their images verified\n');
    return 1;
  }
  const entries = allowlistEntries(sets);
  if (entries.length === 0) {
    io.stderr.write(`pinset kubelet-allowlist: ${nodeName ? `no set selects node ${nodeName}` : 'the files hold no images'}; nothing to allow\n`);
    return 1;
  }
  const names = [...new Set(sets.map((s) => s.name))].sort();
  const source = `${names.join(', ')}${nodeName ? ` (those selecting node ${nodeName})` : ''}`;
  io.stdout.write(renderDropin(entries, source));
  return 0;
}
