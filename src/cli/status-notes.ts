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
