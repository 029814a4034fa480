#!/usr/bin/env bash
# The actk container image, built from this checkout's own release build and written as an OCI
# tar without a registry or a container engine (for a registry, use the Containerfile at the
# repository root: same binaries, same paths).
#
# Usage: scripts/k8s/actk-image.sh [--profile release|debug] [--out FILE] [--no-build]
#   --profile   release (default $ACTK_IMAGE_PROFILE, else release): the release build as it is
#               installed, scripts/build-release.sh's target/dist (actk-runtime and actk-hook
#               static, built on their own); debug: target/debug as `cargo build` leaves it
#   --out       the OCI tar (default target/k8s/actk-image.tar)
#   --no-build  use the binaries already in target/dist (release) or target/debug
# Without --no-build the binaries are built only when the sources changed since they were last
# built here (a digest of every tracked or new file under crates/, the Cargo files and the build
# script, kept beside the binaries): an unchanged checkout reuses them and the image.
# Prints "REF TAR" as its last line; REF is actk.local/actk:VERSION-HASH, HASH naming the
# binaries, so a new build gets a new tag and a `helm upgrade` with it rolls the pods.
#
# Contents: /usr/bin/{actk,actk-device-plugin,actk-dra-driver,actk-nri,actk-exporter,actk-runtime,actk-hook} and the
# shared libraries the dynamically linked ones load (glibc, libgcc_s: what `ldd` lists), nothing
# else: no shell, no package manager. actk-runtime and actk-hook are static in a release image:
# `actk node setup` copies them onto the node, where they then depend on nothing of its libc.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=scripts/lib/cargo-outside-test.sh
. "$repo/scripts/lib/cargo-outside-test.sh"
profile=${ACTK_IMAGE_PROFILE:-release}
out=$repo/target/k8s/actk-image.tar
build=1
while [ $# -gt 0 ]; do
  case $1 in
    --profile) profile=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    *) echo "actk-image: unknown argument $1" >&2; exit 2 ;;
  esac
done
bins=(actk actk-device-plugin actk-dra-driver actk-nri actk-exporter actk-runtime actk-hook)
# The packages that build them (actk-dra-driver is the binary of crate actk-dra).
pkgs_of=(actk actk-device-plugin actk-dra actk-nri actk-exporter actk-runtime actk-hook)
case $profile in release | debug) ;; *) echo "actk-image: --profile $profile: use release or debug" >&2; exit 2 ;; esac
target=${CARGO_TARGET_DIR:-$repo/target}
case $target in /*) ;; *) target=$repo/$target ;; esac
if [ "$profile" = release ]; then dir=$repo/target/dist; else dir=$target/debug; fi
# The sources the binaries come from, as one digest ("" outside a git checkout: always build).
sources_digest() {
  (cd "$repo" && git rev-parse --git-dir >/dev/null 2>&1) || return 0
  (cd "$repo" && git ls-files -z -co --exclude-standard -- Cargo.toml Cargo.lock 'rust-toolchain*' crates scripts/build-release.sh scripts/lib/hot-text-link.sh \
    | sort -z | xargs -0 -r sha256sum 2>/dev/null; echo "$profile") | sha256sum | cut -c1-32
}
stamp=$dir/.actk-image-sources
if [ $build = 1 ]; then
  digest=$(sources_digest)
  have=1
  for b in "${bins[@]}"; do [ -x "$dir/$b" ] || have=0; done
  if [ -n "$digest" ] && [ $have = 1 ] && [ "$(cat "$stamp" 2>/dev/null)" = "$digest" ]; then
    echo "actk-image: sources unchanged since the $profile binaries in $dir were built: not rebuilding" >&2
  elif [ "$profile" = release ]; then
    dir=$(cd "$repo" && scripts/build-release.sh | tail -n 1)
    [ -z "$digest" ] || echo "$digest" >"$stamp"
  else
    pkgs=()
    for p in "${pkgs_of[@]}"; do pkgs+=(-p "$p"); done
    (cd "$repo" && cargo build "${pkgs[@]}" >&2)
    [ -z "$digest" ] || echo "$digest" >"$stamp"
  fi
fi
for b in "${bins[@]}"; do
  [ -x "$dir/$b" ] || { echo "actk-image: $dir/$b is missing (build it, or drop --no-build)" >&2; exit 1; }
done

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml" | head -n 1)
hash=$(cd "$dir" && sha256sum "${bins[@]}" | sha256sum | cut -c1-12)
ref=actk.local/actk:$version-$hash
if [ -f "$out" ] && [ "$(cat "$out.ref" 2>/dev/null)" = "$ref" ]; then
  echo "$ref $out"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
r=$work/rootfs
mkdir -p "$r/usr/bin" "$r/etc" "$r/tmp"
chmod 1777 "$r/tmp"
for b in "${bins[@]}"; do
  install -m 0755 "$dir/$b" "$r/usr/bin/$b"
  # A debug build carries hundreds of MB of debug info that no pod needs.
  if [ "$profile" = debug ] && command -v strip >/dev/null; then strip --strip-debug "$r/usr/bin/$b"; fi
done
# The loader and libraries, at the paths the binaries ask for (merged /usr: /lib -> usr/lib).
ln -s usr/lib "$r/lib"
ln -s usr/lib64 "$r/lib64"
mkdir -p "$r/usr/lib" "$r/usr/lib64"
# `ldd` of a static binary says "not a dynamic executable" and fails: it needs nothing.
for lib in $(for b in "${bins[@]}"; do ldd "$dir/$b" 2>/dev/null || true; done | grep -o '/[^ ]*' | sort -u); do
  dest=$r/usr${lib#/usr}
  mkdir -p "$(dirname "$dest")"
  cp -L "$lib" "$dest"
done
echo 'root:x:0:0:root:/:/usr/bin/actk' >"$r/etc/passwd"
echo 'root:x:0:' >"$r/etc/group"
# The image carries the version and commit the binaries report (`actk --version`), as the
# chart's appVersion carries the version (crates/actk/tests/version.rs checks both).
revision=$("$dir/actk" --version | sed -n 's/.*(commit \(.*\))$/\1/p')
"$repo/scripts/k8s/oci-image.sh" "$r" "$ref" "$out" --entrypoint '["/usr/bin/actk-device-plugin"]' \
  --label "org.opencontainers.image.version=$version" --label "org.opencontainers.image.revision=$revision" >/dev/null
echo "$ref" >"$out.ref"
echo "$ref $out"
