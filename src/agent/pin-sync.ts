// What CRI-O has loaded, and how the agent knows: the pure parts of keeping
// CRI-O's pin list equal to what its files say, and the bounded wait that
// confirms a reload.
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
import type { ImageRuntime, RuntimeImage } from '../cri/runtime.ts';
import { anyPinMatches } from '../crio/pin-match.ts';

/** What ListImages answered, indexed by every name it shows (lowercased: CRI-O matches case-insensitively). */
export class RuntimeView {
  readonly images: RuntimeImage[];
  readonly byName = new Map<string, RuntimeImage>();
  constructor(images: RuntimeImage[]) {
    this.images = images;
    for (const img of images) for (const n of [...img.repoDigests, ...img.repoTags]) this.byName.set(n.toLowerCase(), img);
  }
  /** The image the runtime shows under `ref` (as a repo digest or tag), if any. */
  find(ref: string): RuntimeImage | undefined {
    return this.byName.get(ref.toLowerCase());
  }
  /** Replace what is known about one reference (after an ImageStatus). */
  set(ref: string, img: RuntimeImage | null): void {
    if (img) this.byName.set(ref.toLowerCase(), img);
    else this.byName.delete(ref.toLowerCase());
  }
}

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

export interface PinProbe {
  ref: string;
  /** `pinned` once CRI-O has loaded the new list. */
  expect: boolean;
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

export interface PinWaitResult {
  /** Some probe showed the new list. */
  applied: boolean;
  /** Every probe's image went away meanwhile: nothing left to observe (not a refusal). */
  unobservable: boolean;
  /** From the start of the wait to the answer that showed it (or to giving up). */
  waitedMs: number;
  /** Last ImageStatus answer per probe reference (null: not present). */
  last: Map<string, RuntimeImage | null>;
}

export const PIN_WAIT_INTERVAL_MS = 20;
/**
 * CRI-O re-reads its files 10-40 ms after the signal (median 16 ms on
 * 1.32.13); a loaded node may take longer. Past this bound the reload counts
 * as not applied and is retried with backoff.
 */
export const PIN_WAIT_TIMEOUT_MS = 5_000;

/**
 * Polls ImageStatus of the probes until one reports `pinned` as expected,
 * or the bound passes. Probes whose image disappears drop out.
 */
export async function waitForPins(
  runtime: ImageRuntime,
  probes: readonly PinProbe[],
  opts: { intervalMs?: number; timeoutMs?: number; signal?: AbortSignal; now?: () => number } = {},
): Promise<PinWaitResult> {
  const now = opts.now ?? Date.now;
  const started = now();
  const deadline = started + (opts.timeoutMs ?? PIN_WAIT_TIMEOUT_MS);
  const last = new Map<string, RuntimeImage | null>();
  let live = [...probes];
  for (;;) {
    const answers = await Promise.all(live.map((p) => runtime.imageStatus(p.ref).then((img) => ({ p, img }), () => ({ p, img: undefined }))));
    for (const { p, img } of answers) {
      if (img === undefined) continue; // a failed call says nothing; try again
      last.set(p.ref, img);
      if (img && img.pinned === p.expect) return { applied: true, unobservable: false, waitedMs: now() - started, last };
    }
    live = live.filter((p) => last.get(p.ref) !== null);
    if (live.length === 0 || now() >= deadline || opts.signal?.aborted) return { applied: false, unobservable: live.length === 0, waitedMs: now() - started, last };
    await new Promise((r) => setTimeout(r, opts.intervalMs ?? PIN_WAIT_INTERVAL_MS));
  }
}
