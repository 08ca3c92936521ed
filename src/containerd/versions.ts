// Which containerd versions honour the pin label. containerd's CRI plugin
// reports an image `pinned` when one of its records carries
// io.cri-containerd.pinned=pinned (pkg/cri/store/image). It learned the
// label in 1.6.22 and 1.7.3, but until 1.6.25 and 1.7.10
// (containerd/containerd#9381) it read it only when an image entered its
// cache, so a label set after the pull, which is how pinset pins, did not
// count. Every 2.x honours it. Issue 18 observed this on 1.6.20, 1.6.39,
// 1.7.9, 1.7.24, 1.7.29 and 2.1.5.

export type CanPin = { ok: true } | { ok: false; why: string };

/** The versions that honour a pin label set after the pull, for messages. */
export const PINNING_VERSIONS = '1.6.25 or later 1.6, 1.7.10 or later 1.7, or any 2.x';

/**
 * Parses containerd's version as CRI Version or `containerd --version`
 * reports it: "1.7.24", "v1.7.24", Debian's "1.7.24~ds1", "2.1.5+unknown",
 * "1.7.0-rc.1". Undefined for anything else.
 */
export function parseContainerdVersion(version: string): { major: number; minor: number; patch: number; prerelease: boolean } | undefined {
  const m = /^v?(\d+)\.(\d+)(?:\.(\d+))?([-~+].*)?$/.exec(version.trim());
  if (!m) return undefined;
  // Debian's "~ds1" marks a repacked source, not a pre-release; "-rc.1", "-beta.0" are.
  const prerelease = m[4] !== undefined && /^-(alpha|beta|rc)/i.test(m[4]);
  return { major: Number(m[1]), minor: Number(m[2]), patch: Number(m[3] ?? 0), prerelease };
}

/**
 * Whether a containerd of this version sets aside a hosts.toml without any
 * [host] table (its `server` alone): 1.6 and 1.7 before 1.7.32 fail to read
 * one ("invalid `host` tree") and fall back to the folder's certificate
 * files (containerd/containerd#10004 fixed it for 2.0 and 1.7.32). Unknown
 * versions are taken to read it.
 */
export function containerdNeedsHostTable(version: string): boolean {
  const v = parseContainerdVersion(version);
  if (!v || v.major !== 1) return false;
  return v.minor < 7 || (v.minor === 7 && v.patch < 32);
}

/** Whether a containerd of this version honours io.cri-containerd.pinned=pinned set after an image is pulled. */
export function containerdCanPin(version: string): CanPin {
  const v = parseContainerdVersion(version);
  if (!v) return { ok: false, why: `cannot tell whether containerd "${version}" honours the pin label (not a version number); pins need ${PINNING_VERSIONS}` };
  const { major, minor, patch } = v;
  const needs = `containerd ${version} does not honour io.cri-containerd.pinned set after the pull; pins need ${PINNING_VERSIONS}`;
  if (major >= 2) return { ok: true };
  if (major < 1 || minor < 6) return { ok: false, why: needs };
  // A 1.6.25-rc or 1.7.10-rc may predate the fix: only a release counts.
  const atLeast = (p: number) => patch > p || (patch === p && !v.prerelease);
  if (minor === 6) return atLeast(25) ? { ok: true } : { ok: false, why: needs };
  if (minor === 7) return atLeast(10) ? { ok: true } : { ok: false, why: needs };
  // 1.8 and later 1.x never shipped; were one to, it would carry the fix.
  return { ok: true };
}
