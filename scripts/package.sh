#!/usr/bin/env bash
# The OS packages of actk (`make deb`, `make rpm`): from what scripts/build-release.sh
# --cli-only put in target/dist (the CLI and the static musl actk-runtime and actk-hook, never
# the debug builds), with the Rust ecosystem's packagers, configured in crates/actk/Cargo.toml
# ([package.metadata.deb], [package.metadata.generate-rpm]):
#   deb  cargo-deb           -> target/debian/actk_<version>-1_<arch>.deb
#   rpm  cargo-generate-rpm  -> target/generate-rpm/actk-<version>-1.<arch>.rpm
# The packager is installed with `cargo install --locked` at the pinned version when missing
# (once per machine; it lands in ~/.cargo/bin). Before packaging, target/pkg gets what the
# packages carry that is made, not kept in git: config.toml (`actk config default` of the
# packaged actk, so the shipped conffile is always what that binary documents). Prints the
# package's path.
# Usage: scripts/package.sh deb|rpm|tools   (tools: only install both packagers; CI does it early,
#        in the background, scripts/ci-prefetch.sh). The install holds a lock
#        (~/.cargo/.actk-packagers.lock), so a second caller waits and reuses it.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
cargo=${CARGO:-cargo}
CARGO_DEB_VERSION=3.8.0
CARGO_GENERATE_RPM_VERSION=0.21.1

# Installs the packager $1 at version $2 when missing, under a lock shared by every caller.
install_tool() {
  local tool=$1 version=$2
  mkdir -p "$HOME/.cargo"
  (
    flock 9
    if ! "$tool" --version 2>/dev/null | grep -q "$version"; then
      echo "package: installing $tool $version (cargo install --locked)" >&2
      "$cargo" install --locked "$tool@$version" >&2
    fi
  ) 9>"$HOME/.cargo/.actk-packagers.lock"
}

kind=${1:-}
case $kind in
deb) tool=cargo-deb; version=$CARGO_DEB_VERSION ;;
rpm) tool=cargo-generate-rpm; version=$CARGO_GENERATE_RPM_VERSION ;;
tools)
  install_tool cargo-deb "$CARGO_DEB_VERSION"
  install_tool cargo-generate-rpm "$CARGO_GENERATE_RPM_VERSION"
  exit 0
  ;;
*) echo "usage: $0 deb|rpm|tools" >&2; exit 2 ;;
esac
for b in actk actk-runtime actk-hook; do
  [ -x "target/dist/$b" ] || { echo "package: target/dist/$b is missing; run scripts/build-release.sh --cli-only" >&2; exit 1; }
done
for b in actk-runtime actk-hook; do
  file -b "target/dist/$b" | grep -q "statically linked" \
    || { echo "package: target/dist/$b is not the static release build (scripts/build-release.sh)" >&2; exit 1; }
done
install_tool "$tool" "$version"

mkdir -p target/pkg
target/dist/actk config default >target/pkg/config.toml

case $kind in
deb)
  # --no-build: the binaries are target/dist's; --no-strip: they are already stripped as built
  # (strip = "debuginfo"), and the static shims must stay byte for byte what was measured.
  "$tool" -p actk --no-build --no-strip --quiet --output target/debian/ >&2
  ls -t target/debian/actk_*.deb | head -n1
  ;;
rpm)
  # -o is a directory only if it exists: otherwise cargo-generate-rpm opens it as the file
  # (EISDIR on the trailing slash).
  mkdir -p target/generate-rpm
  "$tool" -p crates/actk -o target/generate-rpm/ >&2
  ls -t target/generate-rpm/actk-*.rpm | head -n1
  ;;
esac
