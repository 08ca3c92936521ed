// The scenarios of the node suite's measurement of the kubelet's credential
// verification (test/node/kubelet-verification.node.ts), and the tables of
// docs/kubelet-credential-verification.md that record what the real
// kubelet of each version did in each: the node suite fails when the
// kubelet disagrees with its version's table, and
// test/unit/kubelet-verification-table.test.ts when a table is not whole.
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const TABLE_DOC = join(fileURLToPath(new URL('../..', import.meta.url)), 'docs', 'kubelet-credential-verification.md');

/**
 * The images: by who pulled first (pinset or the kubelet) and by where
 * pinset's credential came from (the set's pull secret or the credential
 * provider); and a sibling repository of the secret-* ones (same registry
 * and path) that no set names, put on the node through CRI by another
 * client than the kubelet.
 */
export const IMAGES = ['secret-pinset', 'secret-kubelet', 'provider-pinset', 'provider-kubelet', 'secret-sibling'] as const;
export type ImageKey = (typeof IMAGES)[number];
/** The images of the set `offline`: every image but the sibling. */
export const PINNED: readonly ImageKey[] = IMAGES.filter((i) => i !== 'secret-sibling');
export const CASES = ['none', 'secret', 'other', 'rotated', 'recreated'] as const;
export type Case = (typeof CASES)[number];
/** The namespaces of the cases, each with a Secret `kep-pull` (none has no secret). */
export const NAMESPACES: Record<Case, string> = { none: 'default', secret: 'default', other: 'kep-other', rotated: 'kep-rotated', recreated: 'kep-recreated' };

/** The kubelet configurations measured, in this order: a failed pull leaves no record, so none of them changes what the next one sees. */
export const CONFIGS = ['default', 'NeverVerify', 'pinset', 'allowlist-names', 'AlwaysVerify'] as const;
export type ConfigName = (typeof CONFIGS)[number];

/** The kubelet minors with a table: 1.35 (entries matched on the whole image) and 1.36 (on the repository). */
export const TABLE_MINORS = [35, 36] as const;

/** What each pod came to, by configuration, image and case. */
export type Outcomes = Record<string, Record<ImageKey, Record<Case, string>>>;

/** The heading of a version's table. */
export const tableHeading = (minor: number) => `Measured on a real Kubernetes 1.${minor} kubelet`;

/**
 * The table of docs/kubelet-credential-verification.md for kubelet 1.`minor`:
 * the rows `| <config> | <image> | <none> | <secret> | <other> | <rotated> | <recreated> |`
 * of the section headed tableHeading(minor), up to the next heading of its level.
 */
export function documentedOutcomes(text: string, minor: number): Outcomes {
  const out: Outcomes = {};
  let inSection = false;
  for (const line of text.split('\n')) {
    if (line.startsWith('## ')) inSection = line.slice(3).trim() === tableHeading(minor);
    if (!inSection) continue;
    const cells = line.split('|').slice(1, -1).map((c) => c.trim().replace(/`/g, ''));
    if (cells.length !== CASES.length + 2 || !(CONFIGS as readonly string[]).includes(cells[0]!) || !(IMAGES as readonly string[]).includes(cells[1]!)) continue;
    const [config, image, ...rest] = cells as [string, ImageKey, ...string[]];
    ((out[config] ??= {} as Record<ImageKey, Record<Case, string>>)[image] = Object.fromEntries(CASES.map((c, i) => [c, rest[i]!])) as Record<Case, string>);
  }
  return out;
}
