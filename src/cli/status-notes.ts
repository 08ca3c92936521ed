// What `pinset status` says after its table, once per node or per reason
// rather than on every row: the nodes whose runtime cannot pin (why, and
// the versions that pin), and the nodes keeping pins that no set asks for
// (an observation the agent cannot trust: the API not listed, the CRD
// missing or being deleted), with how to remove those.

/** Nodes named per reason after the table; the rest are counted. */
const NAMES_PER_REASON = 5;

export function oneLine(s: string): string {
  return s.replace(/\s+/g, ' ').trim();
}

function named(names: string[]): string {
  const more = names.length > NAMES_PER_REASON ? ` and ${names.length - NAMES_PER_REASON} more` : '';
  return `${names.slice(0, NAMES_PER_REASON).join(', ')}${more}`;
}

/**
 * What follows the table when some nodes only pre-load: once per distinct
 * reason (nodes of one runtime version share one), the first nodes by name
 * and why their runtime cannot pin, with the versions that pin.
 */
export function preloadOnlyLines(nodes: readonly { name: string; cannotPin?: string }[]): string[] {
  const byWhy = new Map<string, string[]>();
  for (const n of nodes) {
    if (!n.cannotPin) continue;
    const names = byWhy.get(n.cannotPin);
    if (names) names.push(n.name);
    else byWhy.set(n.cannotPin, [n.name]);
  }
  if (byWhy.size === 0) return [];
  const lines = ['', "Pre-load only: these nodes' runtimes cannot pin, so nothing keeps the kubelet's image garbage collection from removing their images."];
  for (const [why, names] of byWhy) {
    names.sort();
    lines.push(`  ${named(names)}: ${oneLine(why)}`);
  }
  return lines;
}

/**
 * What follows the table when some nodes keep pins no set asks for (the
 * node status's `pinsKept`): the first nodes by name, each with its
 * agent's words (how many, and why), then how to remove them.
 */
export function pinsKeptLines(nodes: readonly { name: string; pinsKept?: string }[]): string[] {
  const keeping = nodes.filter((n) => n.pinsKept).sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  if (keeping.length === 0) return [];
  const lines = ['', 'Pins kept that no set asks for now (they go when the agent can read its sets again; to remove them: `pinset uninstall`, or `pinset agent --drop-pins` on the node):'];
  for (const n of keeping.slice(0, NAMES_PER_REASON)) lines.push(`  ${n.name}: ${oneLine(n.pinsKept!)}`);
  const rest = keeping.length - NAMES_PER_REASON;
  if (rest > 0) lines.push(`  and ${rest} more ${rest === 1 ? 'node' : 'nodes'}`);
  return lines;
}

/** What `pinset status` keeps of a node's kubeletVerification. */
export interface KubeletNote {
  name: string;
  kubeletVerification?: { policy: string; source: string; refuses?: string[]; refusesMore?: number };
}

/** The words for one node's verdict, shared by the nodes with the same; undefined when its pinned images start offline (or the agent cannot tell). */
function kubeletVerdict(kv: NonNullable<KubeletNote['kubeletVerification']>): string | undefined {
  const from = `policy ${kv.policy} (${kv.source})`;
  if (kv.policy === 'Invalid') return `the kubelet refuses its configuration and does not start with it: ${kv.source}`;
  if (kv.refuses && kv.refuses.length > 0) {
    const more = kv.refusesMore ? ` and ${kv.refusesMore} more` : '';
    return `${from}: pods of ${kv.refuses.join(', ')}${more} need the registry unless their credentials match the kubelet's own record of a pull`;
  }
  if (kv.policy === 'NeverVerifyPreloadedImages') return `${from}: holds only for images the kubelet never pulled itself`;
  return undefined;
}

/**
 * What follows the table when the kubelet's credential verification
 * (KEP-2535) will refuse pinned images offline on some nodes, as their
 * agents read the kubelets' configuration: once per distinct verdict, the
 * first nodes by name, then what to do.
 */
export function kubeletVerificationLines(nodes: readonly KubeletNote[]): string[] {
  const byVerdict = new Map<string, string[]>();
  for (const n of nodes) {
    const verdict = n.kubeletVerification && kubeletVerdict(n.kubeletVerification);
    if (!verdict) continue;
    const names = byVerdict.get(verdict);
    if (names) names.push(n.name);
    else byVerdict.set(verdict, [n.name]);
  }
  if (byVerdict.size === 0) return [];
  const lines = [
    '',
    "Kubelet credential verification: pinned images may not start offline on these nodes (docs/kubelet-credential-verification.md; `pinset kubelet-allowlist --node NAME` prints the kubelet drop-in that exempts a node's sets):",
  ];
  for (const [verdict, names] of byVerdict) {
    names.sort();
    lines.push(`  ${named(names)}: ${oneLine(verdict)}`);
  }
  return lines;
}
