// `pinset preflight`: what this cluster needs for pinset, read from its API
// before anything is applied (and as often after), one check at a time,
// each saying what is fine, what will fail and what to do:
//
//  - kubernetes: the admission policies of deploy/admission are
//    ValidatingAdmissionPolicies of admissionregistration.k8s.io/v1 (stable
//    in Kubernetes 1.30: k8s.io/apiserver pkg/features/kube_features.go
//    ValidatingAdmissionPolicy, KEP-3488) and check the node a service
//    account token is bound to, extra["authentication.kubernetes.io/node-name"]
//    (kubernetes pkg/features/kube_features.go ServiceAccountTokenPodNodeInfo:
//    alpha and off in 1.29, beta and on from 1.30, KEP-4193);
//  - openshift: on OpenShift (the API group security.openshift.io), an SCC
//    that admits the agent's pod must be granted to its service account;
//  - priority class: a cluster that limits system-node-critical (the
//    agent's class) to namespaces holding a ResourceQuota for it, as GKE
//    does (the ResourceQuota admission's limitedResources: kubernetes.io
//    "Limit Priority Class consumption by default"), needs one in pinset's
//    namespace;
//  - nodes: the DaemonSet selects kubernetes.io/os=linux;
//  - runtimes: what pins on each node (status.nodeInfo.containerRuntimeVersion);
//  - kubelets: what the kubelet's credential verification (KEP-2535) needs
//    per kubelet version (src/api/kubelet-verification.ts gateDefault);
//  - sets: a set whose selector matches no node the agent runs on.
//
// Everything is read, nothing written. The reading (readCluster,
// ./preflight-facts.ts) is apart from the checks (preflightChecks,
// ./preflight-checks.ts, pure), which tests give clusters of every kind.
// Here: the command, its flags and its report. Exit status 0 when nothing
// will fail.
import type { KubeConfig } from '@kubernetes/client-node';
import { loadClientKubeConfig } from '../api/kubeconfig.ts';
import { helpText, parseFlags, type FlagSpec } from '../util/flags.ts';
import { setsOfFiles } from './kubelet-allowlist.ts';
import { plural, preflightChecks, type CheckOutcome, type CheckResult } from './preflight-checks.ts';
import { apiError } from './api-error.ts';
import { readCluster, type ClusterFacts } from './preflight-facts.ts';
import type { CommandIO } from './resolve.ts';
import { terminalWidth } from './status.ts';

/** deploy/'s namespace. */
export const DEFAULT_NAMESPACE = 'pinset-system';

const FLAGS: readonly FlagSpec[] = [
  { name: 'kubeconfig', env: 'KUBECONFIG', type: 'string', help: 'kubeconfig file; the usual search (~/.kube/config, in-cluster) when unset' },
  { name: 'namespace', env: 'PINSET_NAMESPACE', type: 'string', default: DEFAULT_NAMESPACE, help: "the namespace pinset's agents run in (deploy/'s, unless an overlay moves them)" },
  { name: 'timeout', env: 'PINSET_PREFLIGHT_TIMEOUT', type: 'duration', default: '15s', help: 'give up on an API request after this long' },
  { name: 'output', short: 'o', type: 'string', default: 'text', choices: ['text', 'json'], help: 'output format' },
];

const USAGE = 'pinset preflight [--kubeconfig FILE] [--namespace NAME] [-o text|json] [FILE|DIR...]';
const SUMMARY =
  'Reads the cluster and says, check by check, what is fine for pinset, what will fail and what to do:\n' +
  "the API server's version and admission policies, OpenShift's SCC, a limit on the priority class\n" +
  "system-node-critical (GKE's), the nodes' OS and runtimes, what each kubelet version needs for pinned\n" +
  'images to start offline, and sets (from the API and the FILEs) that select no node. Changes nothing.\n' +
  'Exit status: 0 nothing will fail, 1 something will (or the API could not be read), 2 usage error.\n' +
  'See docs/installing.md.';

export const flags = FLAGS;

/** `text` in lines of at most `width` characters, every line after the first indented by `indent`. */
function wrap(text: string, width: number, indent: number): string {
  const room = Math.max(40, width - indent);
  const lines: string[] = [];
  let line = '';
  for (const word of text.split(' ')) {
    if (line && line.length + 1 + word.length > room) {
      lines.push(line);
      line = word;
    } else line = line ? `${line} ${word}` : word;
  }
  lines.push(line);
  return lines.join(`\n${' '.repeat(indent)}`);
}

const RESULT_LABEL: Record<CheckResult, string> = { ok: 'ok', note: 'note', fail: 'FAIL' };
const NAME_WIDTH = 16;

/** The report as text: one entry per check (result, check, what it found, what to do), then the verdict. */
export function renderReport(f: Pick<ClusterFacts, 'server' | 'version'>, checks: readonly CheckOutcome[], width: number): string {
  const indent = 6 + NAME_WIDTH;
  const out = [`pinset preflight: ${f.server}, Kubernetes ${f.version.gitVersion || 'version not reported'}`, ''];
  for (const c of checks) {
    out.push(`${RESULT_LABEL[c.result].padEnd(6)}${c.check.padEnd(NAME_WIDTH)}${wrap(c.message, width, indent)}`);
    if (c.todo) out.push(`${' '.repeat(indent)}${wrap(`to do: ${c.todo}`, width, indent)}`);
  }
  const failing = checks.filter((c) => c.result === 'fail').map((c) => c.check);
  out.push('', failing.length ? `${plural(failing.length, 'check')} will fail: ${failing.join(', ')}.` : 'Nothing will fail.');
  return `${out.join('\n')}\n`;
}

export async function run(argv: string[], io: CommandIO = { stdin: process.stdin, stdout: process.stdout, stderr: process.stderr }): Promise<number> {
  const { values, positional } = parseFlags(FLAGS, argv);
  if (values.help) {
    io.stdout.write(helpText(USAGE, SUMMARY, FLAGS));
    return 0;
  }
  const files = await setsOfFiles(positional);
  let kc: KubeConfig;
  try {
    kc = loadClientKubeConfig(values.kubeconfig as string | undefined);
  } catch (err) {
    io.stderr.write(`pinset preflight: ${(err as Error).message}\n`);
    return 1;
  }
  let facts: ClusterFacts;
  try {
    facts = await readCluster(kc, {
      namespace: values.namespace as string,
      timeoutMs: values.timeout as number,
      fileSets: files.sets.map((s) => ({ name: s.name, origin: s.origin, selector: s.selector })),
      fileProblems: files.problems,
    });
  } catch (err) {
    io.stderr.write(`pinset preflight: cannot read the API server at ${kc.getCurrentCluster()?.server ?? '(no cluster)'}: ${apiError(err)}\n`);
    return 1;
  }
  const checks = preflightChecks(facts);
  if (values.output === 'json') io.stdout.write(`${JSON.stringify({ server: facts.server, version: facts.version.gitVersion, checks }, null, 2)}\n`);
  else io.stdout.write(renderReport(facts, checks, terminalWidth()));
  return checks.some((c) => c.result === 'fail') ? 1 : 0;
}
