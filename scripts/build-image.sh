#!/usr/bin/env bash
# Builds pinset's image from ./Containerfile with buildah (no daemon,
# --isolation chroot) into the local containers storage as
# localhost/pinset:dev, and saves it as an OCI layout in .cache/image/oci
# (tag `dev`) for the tests, the node suite and `skopeo copy`.
#
# The Containerfile's base, docker.io/library/node:24-bookworm-slim, is
# taken from the local storage when it is there (pulled by whoever has a
# registry: `podman pull docker.io/library/node:24-bookworm-slim`). When it
# is not, this script builds a stand-in under that name, because the test
# machines reach Debian's mirror and the npm registry only: Debian 12 from
# `debootstrap --variant=minbase`, slimmed as the debian:bookworm-slim image
# is, with Node.js at /usr/local/bin/node (the npm package `node` ships the
# official binary) and npm at /usr/local/bin/npm, as the official image has
# them. The stand-in carries the label dev.pinset.stand-in; a real base is
# never replaced.
#
# Idempotent: the stand-in's root file system is kept as a tarball in
# .cache/image/base, buildah's --layers cache keeps `npm ci`, and the OCI
# layout is written only when the image changed. A second run takes seconds.
#
# Needs root, buildah, debootstrap (for the stand-in) and the repository's
# node_modules (`npm ci`: the Node.js binary and the npm used for `npm pack`).
#
# Environment: PINSET_IMAGE (default localhost/pinset:dev),
# PINSET_IMAGE_CACHE (default .cache/image), PINSET_NPM_VERSION (the npm the
# stand-in carries), PINSET_DEBIAN_MIRROR (default: this machine's own).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
IMAGE="${PINSET_IMAGE:-localhost/pinset:dev}"
CACHE="${PINSET_IMAGE_CACHE:-$ROOT/.cache/image}"
BASE=docker.io/library/node:24-bookworm-slim
# The npm that Node.js 24 releases bundle (11.x); the stand-in's is fetched
# from the npm registry as a package.
NPM_VERSION="${PINSET_NPM_VERSION:-11.21.2}"
# Raise to rebuild the stand-in when the recipe below changes.
STANDIN_RECIPE=1
NODE_BIN="$ROOT/node_modules/node/bin/node"

log() { printf 'build-image: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

[ "$(id -u)" -eq 0 ] || die "run as root: buildah's chroot isolation and debootstrap need it"
command -v buildah >/dev/null || die "buildah is not installed (apt-get install buildah)"
[ -x "$NODE_BIN" ] || die "$NODE_BIN is missing: run \`npm ci\` first (the devDependency \`node\` ships Node.js 24)"

mkdir -p "$CACHE"
T0=$(now)
WORKING_CONTAINER=""
trap '[ -z "$WORKING_CONTAINER" ] || buildah rm "$WORKING_CONTAINER" >/dev/null 2>&1 || true' EXIT

# The machine's own Debian mirror (deb822 sources first, then sources.list).
debian_mirror() {
  if [ -n "${PINSET_DEBIAN_MIRROR:-}" ]; then echo "$PINSET_DEBIAN_MIRROR"; return; fi
  local uri=""
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    uri=$(awk '/^URIs:/ && $2 !~ /security/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
    uri=$(awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; exit } }' /etc/apt/sources.list)
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}

label_of() { # image label
  buildah inspect --type image --format "{{index .OCIv1.Config.Labels \"$2\"}}" "$1" 2>/dev/null || true
}

# ---------------------------------------------------------------------------
# 1. The base image.

NODE_VERSION="$("$NODE_BIN" --version | sed 's/^v//')"
STANDIN_KEY="bookworm-node${NODE_VERSION}-npm${NPM_VERSION}-r${STANDIN_RECIPE}"

# Writes the stand-in's root file system as a tarball: $1.
build_standin_rootfs() {
  local tar="$1" work="$CACHE/base/work" mirror
  mirror="$(debian_mirror)"
  rm -rf "$work"
  mkdir -p "$work"
  local rootfs="$work/rootfs"
  log "debootstrap --variant=minbase bookworm from $mirror"
  local t=$(now)
  nice debootstrap --variant=minbase --components=main bookworm "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log" >&2; die "debootstrap failed (log: $work/debootstrap.log)"; }
  log "debootstrap: $(took "$t")"

  # What debuerreotype does for the official *-slim images: no manual
  # pages, documentation (copyright files stay), locales or info pages,
  # now and for packages installed later; no apt lists or caches.
  mkdir -p "$rootfs/etc/dpkg/dpkg.cfg.d"
  cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
EOF
  find "$rootfs/usr/share/doc" -mindepth 1 -not -type d -not -name copyright -delete
  find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$rootfs"/usr/share/{groff,info,linda,locale,man}/* "$rootfs"/usr/share/lintian/overrides/*
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
    "$rootfs"/var/cache/apt/archives/partial/* "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/* \
    "$rootfs"/etc/hostname "$rootfs"/etc/resolv.conf "$rootfs"/etc/apt/sources.list
  cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  # The container engine provides /dev, /proc, /sys and /run.
  find "$rootfs/dev" "$rootfs/proc" "$rootfs/sys" "$rootfs/run" -mindepth 1 -delete 2>/dev/null || true

  # Node.js and npm where the official image has them, and its user `node`.
  install -m 0755 "$NODE_BIN" "$rootfs/usr/local/bin/node"
  local npmtgz="$CACHE/base/npm-$NPM_VERSION.tgz"
  if [ ! -s "$npmtgz" ]; then
    (cd "$work" && npm pack --silent "npm@$NPM_VERSION" >/dev/null) || die "npm pack npm@$NPM_VERSION failed"
    mv "$work/npm-$NPM_VERSION.tgz" "$npmtgz"
  fi
  mkdir -p "$rootfs/usr/local/lib/node_modules/npm"
  tar -xzf "$npmtgz" -C "$rootfs/usr/local/lib/node_modules/npm" --strip-components=1 --no-same-owner
  ln -sf ../lib/node_modules/npm/bin/npm-cli.js "$rootfs/usr/local/bin/npm"
  ln -sf ../lib/node_modules/npm/bin/npx-cli.js "$rootfs/usr/local/bin/npx"
  chroot "$rootfs" groupadd --gid 1000 node
  chroot "$rootfs" useradd --uid 1000 --gid node --shell /bin/bash --create-home node
  local got
  got="$(chroot "$rootfs" /usr/local/bin/node --version) npm $(chroot "$rootfs" /usr/local/bin/npm --version)"
  log "stand-in has node $got"

  tar --numeric-owner --xattrs -C "$rootfs" -cf "$tar.part" .
  mv "$tar.part" "$tar"
  rm -rf "$work"
}

import_standin() {
  local tar="$CACHE/base/rootfs-$STANDIN_KEY.tar"
  if [ ! -s "$tar" ]; then
    mkdir -p "$CACHE/base"
    command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install debootstrap)"
    rm -f "$CACHE"/base/rootfs-*.tar
    build_standin_rootfs "$tar"
  fi
  local t=$(now) ctr
  ctr=$(buildah from --pull=never scratch)
  WORKING_CONTAINER="$ctr"
  buildah add --quiet "$ctr" "$tar" / >/dev/null
  buildah config \
    --os linux --arch "$(buildah info --format '{{.host.arch}}')" \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env NODE_VERSION="$NODE_VERSION" \
    --cmd '["node"]' \
    --label dev.pinset.stand-in="$STANDIN_KEY" \
    --label org.opencontainers.image.description="Stand-in for $BASE built locally by pinset's scripts/build-image.sh (Debian 12 minbase, Node.js $NODE_VERSION, npm $NPM_VERSION); not the official image" \
    "$ctr"
  buildah commit --quiet --rm "$ctr" "$BASE" >/dev/null
  WORKING_CONTAINER=""
  log "stand-in $BASE imported ($STANDIN_KEY): $(took "$t")"
}

if buildah inspect --type image "$BASE" >/dev/null 2>&1; then
  have="$(label_of "$BASE" dev.pinset.stand-in)"
  if [ -z "$have" ]; then
    log "base $BASE: the one in local storage (not a stand-in)"
  elif [ "$have" != "$STANDIN_KEY" ]; then
    log "base $BASE: stand-in $have is outdated; building $STANDIN_KEY"
    import_standin
  else
    log "base $BASE: stand-in $STANDIN_KEY, already imported"
  fi
else
  log "base $BASE is not in local storage: building a stand-in"
  import_standin
fi
BASE_ID="$(buildah inspect --type image --format '{{.FromImageID}}' "$BASE")"
T_BASE=$(took "$T0")

# ---------------------------------------------------------------------------
# 2. The image, from the Containerfile as a user builds it. The build stage's
# `npm ci` reaches the npm registry through the host's network (chroot
# isolation shares it).

# A host that reaches the registry through a TLS-inspecting proxy trusts its
# CA through npm's `cafile` (or NODE_EXTRA_CA_CERTS): the build's RUN steps
# see that file and an npmrc naming it through read-only bind mounts, which
# leave nothing in the image, so the Containerfile and the image stay as a
# user elsewhere builds them.
BUILD_TRUST=()
cafile="$(npm config get cafile 2>/dev/null || true)"
[ "$cafile" != null ] && [ "$cafile" != undefined ] || cafile=""
cafile="${cafile:-${NODE_EXTRA_CA_CERTS:-}}"
if [ -n "$cafile" ] && [ -f "$cafile" ]; then
  printf 'cafile=/run/pinset-build-ca.crt\n' >"$CACHE/build-npmrc"
  BUILD_TRUST=(-v "$(readlink -f "$cafile"):/run/pinset-build-ca.crt:ro" -v "$CACHE/build-npmrc:/usr/local/etc/npmrc:ro")
  log "the build's npm trusts $cafile (npm's cafile here), through bind mounts"
fi

T1=$(now)
PREVIOUS_ID="$(buildah inspect --type image --format '{{.FromImageID}}' "$IMAGE" 2>/dev/null || true)"
log "buildah bud -f Containerfile -t $IMAGE"
nice buildah bud \
  --isolation chroot \
  --network host \
  --pull=never \
  --layers \
  --force-rm \
  --quiet \
  "${BUILD_TRUST[@]}" \
  -f "$ROOT/Containerfile" \
  -t "$IMAGE" \
  "$ROOT" >"$CACHE/build.log" 2>&1 \
  || { tail -40 "$CACHE/build.log" >&2; die "buildah bud failed (log: $CACHE/build.log)"; }
T_IMAGE=$(took "$T1")
IMAGE_ID="$(buildah inspect --type image --format '{{.FromImageID}}' "$IMAGE")"
# The image this one replaced, now untagged (--layers keeps the build's
# intermediate images as its cache; `buildah rmi --prune` removes those).
if [ -n "$PREVIOUS_ID" ] && [ "$PREVIOUS_ID" != "$IMAGE_ID" ]; then
  buildah rmi "$PREVIOUS_ID" >/dev/null 2>&1 || true
fi

# ---------------------------------------------------------------------------
# 3. The OCI layout (gzip layers, as a registry serves them), rewritten only
# when the image changed, and image.json beside it: what was built, and its
# size compressed (the layer blobs a node downloads) and uncompressed (the
# layer tar streams a node unpacks), the base's share apart.

LAYOUT="$CACHE/oci"
INFO="$CACHE/image.json"
if [ -f "$INFO" ] && grep -q "\"imageId\": \"$IMAGE_ID\"" "$INFO" && [ -f "$LAYOUT/index.json" ]; then
  log "OCI layout $LAYOUT:dev is up to date"
else
  rm -rf "$LAYOUT" "$LAYOUT.part"
  buildah push --quiet --format oci --compression-format gzip "$IMAGE" "oci:$LAYOUT.part:dev" >/dev/null
  mv "$LAYOUT.part" "$LAYOUT"
  BASE_LAYERS="$(buildah inspect --type image --format '{{len .OCIv1.RootFS.DiffIDs}}' "$BASE")"
  "$NODE_BIN" -e '
    const fs = require("node:fs"), path = require("node:path"), zlib = require("node:zlib");
    const [layout, info, baseLayers, ...kv] = process.argv.slice(1);
    const blob = (d) => path.join(layout, "blobs", ...d.split(":"));
    const index = JSON.parse(fs.readFileSync(path.join(layout, "index.json"), "utf8"));
    const manifest = JSON.parse(fs.readFileSync(blob(index.manifests[0].digest), "utf8"));
    const layers = manifest.layers.map((l, i) => ({
      digest: l.digest,
      mediaType: l.mediaType,
      compressed: l.size,
      uncompressed: zlib.gunzipSync(fs.readFileSync(blob(l.digest))).length,
      fromBase: i < Number(baseLayers),
    }));
    const sum = (ls, k) => ls.reduce((s, l) => s + l[k], 0);
    const part = (ls) => ({ compressed: sum(ls, "compressed"), uncompressed: sum(ls, "uncompressed") });
    const out = Object.fromEntries(kv.map((s) => s.split(/=(.*)/s).slice(0, 2)));
    out.size = { total: part(layers), base: part(layers.filter((l) => l.fromBase)), pinset: part(layers.filter((l) => !l.fromBase)) };
    out.layers = layers;
    fs.writeFileSync(info, JSON.stringify(out, null, 2) + "\n");
    const mb = (n) => (n / 1e6).toFixed(1) + " MB";
    const { total, pinset } = out.size;
    console.error(`build-image: size ${mb(total.compressed)} compressed, ${mb(total.uncompressed)} uncompressed; the pinset layers ${mb(pinset.compressed)} / ${mb(pinset.uncompressed)}`);
  ' "$LAYOUT" "$INFO" "$BASE_LAYERS" \
    "image=$IMAGE" "imageId=$IMAGE_ID" "base=$BASE" "baseId=$BASE_ID" \
    "baseStandIn=$(label_of "$BASE" dev.pinset.stand-in)" "ociLayout=$LAYOUT:dev" \
    "builtAt=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
fi

log "base: $T_BASE, image: $T_IMAGE, total: $(took "$T0")"
log "$IMAGE ($IMAGE_ID), OCI layout $LAYOUT:dev"
