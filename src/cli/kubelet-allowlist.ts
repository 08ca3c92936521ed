// `pinset kubelet-allowlist`: a kubelet configuration drop-in (for the
// kubelet's --config-dir) that exempts the images of pinset's sets from the
// kubelet's credential verification (KEP-2535), so their pods start from
// the node with no registry in reach: policy NeverVerifyAllowlistedImages,
// and in preloadedImagesVerificationAllowlist, by the kubelet's version
// (src/api/kubelet-verification.ts):
// - 1.36 and later: each repository of the sets as an exact entry. From
//   1.36 the kubelet matches an exact entry on the pod's image without its
//   tag or digest (kubernetes#137629), so no sibling repository is exempted.
// - 1.33 to 1.35, and a version not known: one "/*" entry per parent path of
//   the sets' repositories. There an exact entry is compared with the pod's
//   whole image string, tag or digest included, and matches no pod; a "/*"
//   entry also works from 1.36, exempting the siblings under its path.
// The version is the Node's (--node) or the one asked for
// (--kubelet-version); without either the "/*" form is printed and the
// command says so on its standard error.
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
import {
  allowlistEntryFor,
  allowlistMatching,
  allowlistProblems,
  exactAllowlistEntryFor,
  GATE,
  gateDefault,
  kubeletMinor,
  minimalAllowlist,
  REPOSITORY_MATCHING_SINCE,
  type AllowlistMatching,
} from '../api/kubelet-verification.ts';
import { DEFAULT_PAGE_SIZE, listAll } from '../api/list-pages.ts';
import { selectorMatches } from '../api/selector.ts';
import { GROUP, PLURAL, VERSION, type LabelSelector, type PinnedImageSet } from '../api/types.ts';
import { describeProblems, validateSet } from '../api/validate.ts';
import { parseYamlDocuments } from '../api/yaml.ts';
import { helpText, parseFlags, UsageError, type FlagSpec } from '../util/flags.ts';
import { apiError } from './api-error.ts';
import type { CommandIO } from './resolve.ts';

const FLAGS: readonly FlagSpec[] = [
  { name: 'node', type: 'string', help: 'only the sets that select this Node (its labels and the PinnedImageSets read from the API, with the FILEs\' sets)' },
  { name: 'kubeconfig', env: 'KUBECONFIG', type: 'string', help: 'kubeconfig file, with --node; the usual search (~/.kube/config, in-cluster) when unset' },
  { name: 'timeout', env: 'PINSET_KUBELET_ALLOWLIST_TIMEOUT', type: 'duration', default: '15s', help: 'give up on an API request after this long' },
  {
    name: 'kubelet-version',
    type: 'string',
    help: 'without --node: print the drop-in for a kubelet of this version (e.g. 1.36 or v1.35.6): each repository as an exact entry from 1.36, "/*" entries before; unset, the "/*" form that every version from 1.33 takes',
  },
  {
    name: 'kubelet-gate-on',
    type: 'bool',
    default: false,
    help: "with --node or --kubelet-version: the kubelet is 1.33 or 1.34 and runs with the feature gate KubeletEnsureSecretPulledImages on (off by default there; a kubelet with it off refuses the drop-in and does not start, so without this flag nothing is printed for such a kubelet)",
  },
];

const USAGE = 'pinset kubelet-allowlist [--node NAME | --kubelet-version VERSION] [--kubelet-gate-on] [--kubeconfig FILE] [--timeout DURATION] [FILE|DIR...]';
const SUMMARY =
  "Prints a kubelet configuration drop-in (for the kubelet's --config-dir) that keeps the kubelet's\n" +
  'credential verification (Kubernetes 1.35 and later) from refusing the images of the sets offline:\n' +
  'imagePullCredentialsVerificationPolicy NeverVerifyAllowlistedImages, and in\n' +
  'preloadedImagesVerificationAllowlist each repository of the sets as an exact entry for a kubelet\n' +
  '1.36 or later, or one "/*" entry per parent path of the sets\' repositories for 1.33 to 1.35.\n' +
  'FILE: PinnedImageSet YAML; DIR: its .yaml, .yml and .json files (as the agent\'s static folder).\n' +
  "With --node, the sets that select that node, from the API and the FILEs, for that node's kubelet version;\n" +
  'with --kubelet-version, for that version; with neither, the "/*" form (said on the standard error).\n' +
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

/**
 * The entries covering every image of `sets`, sorted, each with what it
 * covers: for "repository" matching (1.36 and later) each repository
 * exactly, for "image" matching the minimal "/*" entries.
 */
export function allowlistEntries(sets: readonly AllowlistSet[], matching: AllowlistMatching = 'image'): AllowlistEntry[] {
  if (matching === 'repository') return exactEntries(sets);
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

/** Each repository of the sets as an exact entry, sorted, with the sets naming it. */
function exactEntries(sets: readonly AllowlistSet[]): AllowlistEntry[] {
  const bySet = new Map<string, Set<string>>();
  for (const s of sets) {
    for (const image of s.images) {
      const repository = exactAllowlistEntryFor(image);
      const names = bySet.get(repository) ?? new Set<string>();
      names.add(s.name);
      bySet.set(repository, names);
    }
  }
  return [...bySet.keys()].sort().map((entry) => ({ entry, sets: [...bySet.get(entry)!].sort(), repositories: [entry] }));
}

/** Which form is printed, and why: the kubelet's version as known. */
export interface DropinForm {
  matching: AllowlistMatching;
  /** The version the form is for ("v1.36.2"), undefined when not known. */
  kubeletVersion?: string;
  /** One sentence: the form and why. */
  why: string;
}

/** The form for a kubelet version, from the Node (--node) or asked for (--kubelet-version, or neither: undefined). */
export function dropinForm(kubeletVersion: string | undefined, from: 'node' | 'asked'): DropinForm {
  if (kubeletVersion === undefined) {
    return {
      matching: 'image',
      why:
        from === 'node'
          ? 'the Node reports no kubelet version: "/*" entries, which kubelets 1.33 to 1.35 need and later ones take too (exempting the sibling repositories under each path)'
          : 'no kubelet version given: "/*" entries, which kubelets 1.33 to 1.35 need and later ones take too (exempting the sibling repositories under each path); for a kubelet 1.36 or later, --kubelet-version (or --node) prints each repository as an exact entry instead',
    };
  }
  const matching = allowlistMatching(kubeletVersion);
  return matching === 'repository'
    ? { matching, kubeletVersion, why: `kubelet ${kubeletVersion}: each repository as an exact entry, which from 1.${REPOSITORY_MATCHING_SINCE} matches that repository with any tag or digest and no sibling (kubernetes#137629)` }
    : { matching, kubeletVersion, why: `kubelet ${kubeletVersion}: "/*" entries, as before 1.${REPOSITORY_MATCHING_SINCE} an exact entry is compared with the pod's whole image, tag or digest included, and matches no pod` };
}

const HEADER = [
  ' A kubelet configuration drop-in from `pinset kubelet-allowlist`: the images of',
  " pinset's sets start from the node without the registry, whatever credentials",
  " their pods have. Save it in the kubelet's --config-dir under a name ending in",
  ' ".conf" (e.g. 50-pinset.conf, sorting after the files it must override) and',
  ' restart the kubelet. For Kubernetes 1.35 and later: a kubelet with the feature',
  ' gate KubeletEnsureSecretPulledImages off (the default of 1.33 and 1.34) refuses',
  ' these fields and does not start; 1.32 ignores them.',
];
const PREFIX_FORM = [
  ' Each "/*" entry exempts every repository below its path, sibling repositories',
  ' of the pinned ones included. The kubelet matches the image as the pod spells',
  ' it: pods must spell registry host and path as the sets do (not "nginx" for',
  ' "docker.io/library/nginx"); a tag or a digest may differ.',
];
const EXACT_FORM = [
  ' Each entry exempts one repository of the sets, whatever tag or digest a pod',
  ' names; sibling repositories stay verified. Only for kubelets 1.36 and later:',
  ' a kubelet 1.35 or earlier compares such an entry with the whole image, tag or',
  ' digest included, and then exempts nothing. Pods must spell registry host and',
  ' path as the sets do (not "nginx" for "docker.io/library/nginx").',
];

/** A sentence as comment lines of at most 80 columns ("# " and the text). */
function wrapped(text: string): string[] {
  const lines: string[] = [];
  let line = '';
  for (const word of text.split(' ')) {
    if (line && line.length + 1 + word.length > 78) {
      lines.push(` ${line}`);
      line = word;
    } else line = line ? `${line} ${word}` : word;
  }
  if (line) lines.push(` ${line}`);
  return lines;
}

/** The drop-in as YAML text, comments included. Entries are checked with the kubelet's rules first. */
export function renderDropin(entries: readonly AllowlistEntry[], source: string, form: DropinForm = dropinForm(undefined, 'asked')): string {
  const problems = allowlistProblems(
    entries.map((e) => e.entry),
    form.matching,
  );
  if (problems.length > 0) throw new Error(`an allowlist entry the kubelet would refuse: ${problems.join('; ')}`);
  const doc = new Document({
    apiVersion: 'kubelet.config.k8s.io/v1beta1',
    kind: 'KubeletConfiguration',
    imagePullCredentialsVerificationPolicy: 'NeverVerifyAllowlistedImages',
    preloadedImagesVerificationAllowlist: entries.map((e) => e.entry),
  });
  const exact = form.matching === 'repository';
  doc.commentBefore = [...HEADER, ...(exact ? EXACT_FORM : PREFIX_FORM), ...wrapped(`Form: ${form.why}.`), ` Sets: ${source}.`].join('\n');
  const list = doc.get('preloadedImagesVerificationAllowlist', true) as YAMLSeq<Scalar>;
  entries.forEach((e, i) => {
    const item = list.items[i]!;
    const sets = ` ${e.sets.length === 1 ? 'set' : 'sets'} ${e.sets.join(', ')}`;
    item.commentBefore = exact ? sets : [`${sets}: covers ${e.repositories.join(', ')}`, ` and any other repository under ${e.entry.slice(0, -2)}/`].join('\n');
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
 * fields and does not start (validation.go). An unknown version counts as
 * 1.35. `nodeName` undefined: the version was asked for (--kubelet-version).
 */
export function kubeletVersionProblem(nodeName: string | undefined, version: string | undefined, gateOn: boolean): string | undefined {
  const gate = gateDefault(version);
  const who = nodeName === undefined ? `kubelet ${version}` : `node ${nodeName} runs kubelet ${version}`;
  if (!gate.known) return `${who}, which does not verify the credentials of images already on the node (that came in 1.33): it needs no drop-in`;
  if (!gate.on && !gateOn) {
    return `${who}: there the feature gate ${GATE} is off unless the kubelet turns it on, and a kubelet with it off refuses these fields and does not start. With the gate off the kubelet does not verify, and pinned images start offline without a drop-in; if this kubelet runs with the gate on, add --kubelet-gate-on`;
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
  const askedVersion = values['kubelet-version'] as string | undefined;
  if (!nodeName && positionals.length === 0) throw new UsageError(`give set files or folders, or --node\nusage: ${USAGE}`);
  if (nodeName && askedVersion !== undefined) throw new UsageError(`--kubelet-version is for files without --node: with --node, the Node's own kubelet version decides\nusage: ${USAGE}`);
  if (askedVersion !== undefined && kubeletMinor(askedVersion) === undefined) throw new UsageError(`--kubelet-version ${JSON.stringify(askedVersion)} is not a Kubernetes version (e.g. 1.36 or v1.35.6)\nusage: ${USAGE}`);
  if (values['kubelet-gate-on'] && !nodeName && askedVersion === undefined) throw new UsageError(`--kubelet-gate-on goes with --node or --kubelet-version\nusage: ${USAGE}`);
  if (askedVersion !== undefined) {
    const refused = kubeletVersionProblem(undefined, askedVersion, Boolean(values['kubelet-gate-on']));
    if (refused) {
      io.stderr.write(`pinset kubelet-allowlist: ${refused}; nothing printed\n`);
      return 1;
    }
  }
  const fromFiles = await setsOfFiles(positionals);
  let sets = fromFiles.sets;
  const problems = [...fromFiles.problems];
  let form = dropinForm(askedVersion, 'asked');
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
      form = dropinForm(fromApi.kubeletVersion, 'node');
    } catch (err) {
      const why = err instanceof KubeApiError && err.code === 404 ? `Node ${nodeName} does not exist` : apiError(err);
      io.stderr.write(`pinset kubelet-allowlist: cannot read the node and its sets from the API: ${why}\n`);
      return 1;
    }
  }
  if (problems.length > 0) {
    for (const p of problems) io.stderr.write(`pinset kubelet-allowlist: ${p}\n`);
    io.stderr.write('pinset kubelet-allowlist: nothing printed: an allowlist without those sets would leave their images verified\n');
    return 1;
  }
  const entries = allowlistEntries(sets, form.matching);
  if (entries.length === 0) {
    io.stderr.write(`pinset kubelet-allowlist: ${nodeName ? `no set selects node ${nodeName}` : 'the files hold no images'}; nothing to allow\n`);
    return 1;
  }
  const names = [...new Set(sets.map((s) => s.name))].sort();
  const source = `${names.join(', ')}${nodeName ? ` (those selecting node ${nodeName})` : ''}`;
  io.stdout.write(renderDropin(entries, source, form));
  if (!nodeName) io.stderr.write(`pinset kubelet-allowlist: printed for ${form.why}\n`);
  return 0;
}
