// What CRI-O has loaded, and how the agent knows: the pure parts of keeping
// CRI-O's pin list equal to what its files say (the wait that confirms a
// reload is src/pins/confirm.ts).
//
// Why confirmation is needed (facts/crio-pinning.md, observed on CRI-O
// 1.32.13): CRI-O's unit reloads with `kill -HUP`, so the systemd job ends
// (and `systemctl reload` returns) when the signal is sent; CRI-O re-reads
// its files 10-40 ms later, and refuses the whole reload if one file does
// not decode, while the job still ends "done". So a reload counts only once
// ImageStatus reports `pinned` as the new list says.
//
// What is observable: CRI-O matches pins against an image's STORED NAMES,
// and ListImages/ImageStatus show repo_digests computed from names x digests,
// so they cannot tell whether the set's reference is a stored name. The
// agent knows a reference is a stored name when it pulled it itself (a pull
// adds the name) or when CRI-O reports the image pinned while its loaded list
// holds that reference and no other pattern could match the image. Only such
// references make a probe: its `pinned` must flip when the new list loads.
import { createHash } from 'node:crypto';
import type { RuntimeImage } from '../cri/runtime.ts';
import type { RuntimeView } from '../cri/view.ts';
import type { PinProbe } from '../pins/confirm.ts';
import { anyPinMatches } from './pin-match.ts';

/**
 * How far the agent trusts that CRI-O's pin list is `patterns`:
 * - assumed: read from the files at start (CRI-O reads them when it starts);
 * - confirmed: a reload was seen applied (a probe flipped);
 * - unconfirmed: reloaded, but nothing observable changed yet (pulls that
 *   follow confirm it);
 * - notApplied: a reload ended but CRI-O did not apply it within the bound;
 * - stale: the runtime contradicted it (a reference it holds by name and
 *   the list pins is reported unpinned): CRI-O has not loaded its files.
 */
export type LoadState = 'assumed' | 'confirmed' | 'unconfirmed' | 'notApplied' | 'stale';

export interface LoadedPins {
  patterns: string[];
  key: string;
  state: LoadState;
  /** When the last reload was signalled (ms), for `unconfirmed`. */
  reloadedAt: number;
}

/**
 * Equal for lists with the same patterns, in any order and with repeats. A
 * digest, not the joined list: the key of the list CRI-O is believed to have
 * loaded is kept for as long as the agent runs, and a list of 1000 pins
 * joined is a string of 100 KB.
 */
export function pinListKey(patterns: readonly string[]): string {
  return createHash('sha256').update(JSON.stringify([...new Set(patterns)].sort())).digest('base64');
}

/** Patterns other than `self` (and the pause image) that could match one of the image's names. */
function othersMatch(patterns: readonly string[], self: string, img: RuntimeImage, pauseImage: string): boolean {
  const names = [...img.repoDigests, ...img.repoTags];
  const others = patterns.filter((p) => p.toLowerCase() !== self.toLowerCase());
  return anyPinMatches([...others, pauseImage], names);
}

/**
 * References the runtime reports pinned while `loaded` pins them exactly and
 * nothing else could: they are stored names (CRI-O matches names only).
 */
export function namesProvenByPins(loaded: readonly string[], view: RuntimeView, pauseImage: string): string[] {
  const out: string[] = [];
  // Exact patterns only: a reference is never a glob. Other globs are few; exact ones are checked through the set.
  const exact = new Set(loaded.filter((p) => !p.includes('*')).map((p) => p.toLowerCase()));
  const globs = loaded.filter((p) => p.includes('*'));
  for (const p of exact) {
    const img = view.find(p);
    if (!img?.pinned) continue;
    const names = [...img.repoDigests, ...img.repoTags].map((n) => n.toLowerCase());
    if (names.some((n) => n !== p && exact.has(n))) continue;
    if (anyPinMatches([...globs, pauseImage], names)) continue;
    out.push(p);
  }
  return out;
}

/**
 * References whose `pinned` must change when CRI-O loads `next` instead of
 * `prev`: held by name (known), present, and reported otherwise now.
 * At most `max`: CRI-O loads a list as a whole, so one flip proves it.
 */
export function reloadProbes(
  prev: readonly string[],
  next: readonly string[],
  view: RuntimeView,
  knownNames: ReadonlySet<string>,
  pauseImage: string,
  max = 8,
): PinProbe[] {
  const prevSet = new Set(prev.map((p) => p.toLowerCase()));
  const nextSet = new Set(next.map((p) => p.toLowerCase()));
  const probes: PinProbe[] = [];
  for (const p of nextSet) {
    if (probes.length >= max) break;
    if (prevSet.has(p) || !knownNames.has(p)) continue;
    const img = view.find(p);
    if (img && img.runtimeHandler === '' && !img.pinned) probes.push({ ref: p, expect: true });
  }
  for (const p of prevSet) {
    if (probes.length >= max) break;
    if (nextSet.has(p) || !knownNames.has(p)) continue;
    const img = view.find(p);
    if (img && img.runtimeHandler === '' && img.pinned && !othersMatch(next, p, img, pauseImage)) probes.push({ ref: p, expect: false });
  }
  return probes;
}

/**
 * References the new list adds whose images the runtime shows unpinned, not
 * known to be stored names: they flip only if they are. A short wait on them
 * confirms the common case (images pulled by digest) without a pull.
 */
export function tentativeProbes(prev: readonly string[], next: readonly string[], view: RuntimeView, max = 8): PinProbe[] {
  const prevSet = new Set(prev.map((p) => p.toLowerCase()));
  const probes: PinProbe[] = [];
  for (const p of new Set(next.map((x) => x.toLowerCase()))) {
    if (probes.length >= max) break;
    if (prevSet.has(p) || p.includes('*')) continue;
    const img = view.find(p);
    if (img && img.runtimeHandler === '' && !img.pinned) probes.push({ ref: p, expect: true });
  }
  return probes;
}

/**
 * How long to wait on tentative probes before leaving the confirmation to
 * the pulls that follow. CRI-O re-reads 10-40 ms after the signal; waiting
 * longer only delays the name-only pulls when no reference is a stored
 * name, and a reload applied later is still confirmed after the pulls.
 */
export const TENTATIVE_WAIT_MS = 250;
