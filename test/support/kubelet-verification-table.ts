// The scenarios of the node suite's measurement of the kubelet's credential
// verification (test/node/kubelet-verification.node.ts), and the table of
// docs/kubelet-credential-verification.md that records what the real
// kubelet did in each: the node suite fails when the kubelet disagrees with
// the table, and test/unit/kubelet-verification-table.test.ts when the
// table is not whole.
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const TABLE_DOC = join(fileURLToPath(new URL('../..', import.meta.url)), 'docs', 'kubelet-credential-verification.md');

/** The images: by who pulled first (pinset or the kubelet) and by where pinset's credential came from (the set's pull secret or the credential provider). */
export const IMAGES = ['secret-pinset', 'secret-kubelet', 'provider-pinset', 'provider-kubelet'] as const;
export type ImageKey = (typeof IMAGES)[number];
export const CASES = ['none', 'secret', 'other', 'rotated', 'recreated'] as const;
export type Case = (typeof CASES)[number];
/** The namespaces of the cases, each with a Secret `kep-pull` (none has no secret). */
export const NAMESPACES: Record<Case, string> = { none: 'default', secret: 'default', other: 'kep-other', rotated: 'kep-rotated', recreated: 'kep-recreated' };

/** The kubelet configurations measured, in this order: a failed pull leaves no record, so none of them changes what the next one sees. */
export const CONFIGS = ['default', 'NeverVerify', 'pinset', 'allowlist-names', 'AlwaysVerify'] as const;
export type ConfigName = (typeof CONFIGS)[number];

/** What each pod came to, by configuration, image and case. */
export type Outcomes = Record<string, Record<ImageKey, Record<Case, string>>>;

/** The table of docs/kubelet-credential-verification.md: its rows `| <config> | <image> | <none> | <secret> | <other> | <rotated> | <recreated> |`. */
export function documentedOutcomes(text: string): Outcomes {
  const out: Outcomes = {};
  for (const line of text.split('\n')) {
    const cells = line.split('|').slice(1, -1).map((c) => c.trim().replace(/`/g, ''));
    if (cells.length !== CASES.length + 2 || !(CONFIGS as readonly string[]).includes(cells[0]!) || !(IMAGES as readonly string[]).includes(cells[1]!)) continue;
    const [config, image, ...rest] = cells as [string, ImageKey, ...string[]];
    ((out[config] ??= {} as Record<ImageKey, Record<Case, string>>)[image] = Object.fromEntries(CASES.map((c, i) => [c, rest[i]!])) as Record<Case, string>);
  }
  return out;
}

