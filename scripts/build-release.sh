#!/usr/bin/env bash
# Release build as installed and shipped in the image (issue 14):
# - actk-runtime and actk-hook, the binaries run once per container start, built on their own
#   (no feature unification with the CLI: scripts/check-shim-deps.sh) as static, non-PIE
#   executables: no dynamic loader, no relocations, fewer page faults per exec
#   (`-C target-feature=+crt-static -C relocation-model=static`, glibc static on
#   *-unknown-linux-gnu). RUSTFLAGS for one target triple given with --target apply to that
#   target's artifacts only, so build scripts and proc macros stay dynamic as they must.
#   Output: target/<host triple>/release/{actk-runtime,actk-hook}.
# - everything else (actk, actk-device-plugin, actk-nri) as usual: target/release/.
# All of them are then copied into target/dist/, the one directory to install or put in an
# image (actk finds actk-runtime and actk-hook next to itself). Prints target/dist's path.
# Usage: scripts/build-release.sh [CARGO ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo=${CARGO:-cargo}
host=$(rustc -vV | sed -n 's/^host: //p')
case $host in
  *-unknown-linux-gnu) ;;
  *) echo "build-release: static glibc linking is set up for *-unknown-linux-gnu, not $host" >&2; exit 1 ;;
esac
var=CARGO_TARGET_$(echo "$host" | tr 'a-z-' 'A-Z_')_RUSTFLAGS
env "$var=-C target-feature=+crt-static -C relocation-model=static" \
  "$cargo" build --release --target "$host" -p actk-runtime -p actk-hook "$@" >&2
"$cargo" build --release --workspace --bins --exclude actk-runtime --exclude actk-hook --exclude actk-e2e \
  --exclude actk-testsupport "$@" >&2
for b in actk-runtime actk-hook; do
  file -b "target/$host/release/$b" | grep -q "statically linked" \
    || { echo "build-release: target/$host/release/$b is not statically linked" >&2; exit 1; }
done
dist=$PWD/target/dist
mkdir -p "$dist"
for b in target/release/*; do
  [ -f "$b" ] && [ -x "$b" ] && case ${b##*/} in actk-runtime | actk-hook | *.d) ;; *) cp -p "$b" "$dist/" ;; esac
done
cp -p "target/$host/release/actk-runtime" "target/$host/release/actk-hook" "$dist/"
echo "$dist"
