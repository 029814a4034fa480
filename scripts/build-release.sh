#!/usr/bin/env bash
# Release build as installed and shipped in the image (issue 14):
# - actk-runtime and actk-hook, the binaries run once per container start (four calls of
#   actk-runtime per container), built on their own (no feature unification with the CLI:
#   scripts/check-shim-deps.sh) as static, non-PIE executables: no dynamic loader, no
#   relocations, no dependency on the node's glibc version. With musl
#   (x86_64-unknown-linux-musl, when its rustup target is installed: scripts/install-deps.sh
#   adds it) and dlmalloc as the allocator; else with glibc (*-unknown-linux-gnu, +crt-static).
#   musl because glibc's start-up asks the CPU for its cache sizes with some 40 CPUID
#   instructions (init_cacheinfo), and in a virtual machine every CPUID exits to the
#   hypervisor: 0.2-0.3 ms per exec on this project's VM, none on musl, which asks nothing.
#   A static musl program cannot dlopen, so for the one container start that needs NVML (a MIG
#   device without a CDI spec) actk-runtime runs the `actk` next to it
#   (actk_core::discover::nvml::read).
#   `-C target-feature=+crt-static -C relocation-model=static`: RUSTFLAGS for one target triple
#   given with --target apply to that target's artifacts only, so build scripts and proc macros
#   stay dynamic as they must. Output: target/<triple>/release/{actk-runtime,actk-hook}.
#   ACTK_RELEASE_LIBC=glibc forces the glibc build.
# - everything else (actk, actk-device-plugin, actk-nri, actk-exporter) as usual: target/release/.
# All of them are then copied into target/dist/, the one directory to install or put in an
# image (actk finds actk-runtime and actk-hook next to itself). Prints target/dist's path.
# Usage: scripts/build-release.sh [--shims-only | --cli-only] [CARGO ARGS...]
#   --shims-only   only the static actk-runtime and actk-hook (no target/dist); prints their
#                  directory
#   --cli-only     the static shims and the CLI `actk`, into target/dist: what the OS packages
#                  ship (`make deb`, `make rpm`), without the Kubernetes binaries
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/cargo-outside-test.sh
. scripts/lib/cargo-outside-test.sh
cargo=${CARGO:-cargo}
shims_only=0
cli_only=0
if [ "${1:-}" = --shims-only ]; then shims_only=1; shift; fi
if [ "${1:-}" = --cli-only ]; then cli_only=1; shift; fi
host=$(rustc -vV | sed -n 's/^host: //p')
case $host in
  *-unknown-linux-gnu) ;;
  *) echo "build-release: static linking is set up for *-unknown-linux-gnu hosts, not $host" >&2; exit 1 ;;
esac
musl=${host%-unknown-linux-gnu}-unknown-linux-musl
shim_target=$host
if [ "${ACTK_RELEASE_LIBC:-musl}" = musl ]; then
  if rustc --print sysroot >/dev/null && [ -d "$(rustc --print sysroot)/lib/rustlib/$musl/lib" ]; then
    shim_target=$musl
  else
    echo "build-release: no $musl target installed (rustup target add $musl): actk-runtime and actk-hook link glibc statically" >&2
  fi
fi
var=CARGO_TARGET_$(echo "$shim_target" | tr 'a-z-' 'A-Z_')_RUSTFLAGS
# Fat LTO in one codegen unit for these two only (the workspace's release profile is thin LTO
# in 4 units, which builds the rest faster): the optimiser inlines across crates into
# serde_json and toml, and actk-runtime is 16% smaller (5.2 to 4.3 MB). Measured against the
# thin build with both read back from disk (benches/runtime-bench.sh's create-only pass, with
# the lazy pointers of cdi/validate.rs): about 0.1-0.2 ms less CPU per create, the larger part
# on a create from a CDI spec.
# Linked by scripts/lib/hot-text-link.sh: rust-lld, with the functions a container start runs
# (crates/actk-runtime/hot-text.txt) packed at the front of .text, 22 fewer page faults per
# create (issue 31). It writes what it matched to target/<triple>/release/<binary>.hot-text.
env "$var=-C target-feature=+crt-static -C relocation-model=static -C linker=$PWD/scripts/lib/hot-text-link.sh" \
  ACTK_HOT_TEXT_DIR="$PWD" ACTK_GCC_LD="$(rustc --print sysroot)/lib/rustlib/$host/bin/gcc-ld" \
  CARGO_PROFILE_RELEASE_LTO=fat CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1 \
  "$cargo" build --release --target "$shim_target" -p actk-runtime -p actk-hook "$@" >&2
# Only a link writes the report (it stays beside the binary it describes): a build with
# nothing to link prints the last one.
[ ! -f "target/$shim_target/release/actk-runtime.hot-text" ] || cat "target/$shim_target/release/actk-runtime.hot-text" >&2
for b in actk-runtime actk-hook; do
  file -b "target/$shim_target/release/$b" | grep -q "statically linked" \
    || { echo "build-release: target/$shim_target/release/$b is not statically linked" >&2; exit 1; }
done
# The stage exits of benches/runtime-bench.sh's `stages` pass (feature bench-stages) never ship.
case " $* " in
  *bench-stages*) ;;
  *) ! grep -q ACTK_BENCH_STAGE "target/$shim_target/release/actk-runtime" \
       || { echo "build-release: actk-runtime was built with the bench-stages feature; it must not ship" >&2; exit 1; } ;;
esac
if [ "$shims_only" = 1 ]; then
  echo "$PWD/target/$shim_target/release"
  exit 0
fi
if [ "$cli_only" = 1 ]; then
  "$cargo" build --release -p actk --bin actk "$@" >&2
else
  "$cargo" build --release --workspace --bins --exclude actk-runtime --exclude actk-hook --exclude actk-e2e \
    --exclude actk-testsupport "$@" >&2
fi
dist=$PWD/target/dist
mkdir -p "$dist"
# A binary already there byte for byte is left as it is: a build that found nothing to do
# rewrites nothing (a test may be running target/dist's binaries meanwhile).
put() { cmp -s "$1" "$dist/${1##*/}" || cp -p "$1" "$dist/"; }
for b in target/release/*; do
  [ -f "$b" ] && [ -x "$b" ] && case ${b##*/} in actk-runtime | actk-hook | *.d) ;; *) put "$b" ;; esac
done
put "target/$shim_target/release/actk-runtime"
put "target/$shim_target/release/actk-hook"
echo "$dist"
