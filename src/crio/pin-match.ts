// How CRI-O matches pinned_images patterns against an image's stored names
// (internal/storage/image.go, CompileRegexpsForPinnedImages and
// FilterPinnedImage in CRI-O 1.32), case-insensitively:
// - "*keyword*": the keyword anywhere in the name (regexp "(?i)keyword");
// - "prefix*": regexp "(?i)prefix.*", which Go's MatchString does NOT
//   anchor, so the prefix may occur anywhere in the name too;
// - anything else: the whole name ("(?i)^pattern$").
// Observed on CRI-O 1.32.13 (facts/crio-pinning.md): `org/gl*` pins
// `registry.test/org/glob@...`.

export function pinMatches(pattern: string, name: string): boolean {
  const p = pattern.toLowerCase();
  const n = name.toLowerCase();
  if (p.startsWith('*') && p.endsWith('*') && p.length >= 2) return n.includes(p.slice(1, -1));
  if (p.endsWith('*')) return n.includes(p.slice(0, -1));
  return n === p;
}

/** Does any pattern match any of the names? */
export function anyPinMatches(patterns: readonly string[], names: readonly string[]): boolean {
  return patterns.some((p) => names.some((n) => pinMatches(p, n)));
}
