#!/usr/bin/env bash
# Writes crates/actk-runtime/hot-text.txt: the functions a container start runs in
# actk-runtime, which scripts/lib/hot-text-link.sh lays out together at the front of .text
# (issue 31; docs/performance.md, "Hot text").
#
# The functions come from callgrind (valgrind): every function that runs, up to the exec of the
# low-level runtime, in a create by CDI spec and a create by discovery on the NVIDIA DGX H100,
# AMD MI300X, AWS trn1 and Intel Gaudi2 fixtures (8 devices asked for), and in state, start and
# delete. First appearance orders them: state, start and delete first (what every call runs),
# then the NVIDIA create by spec, the path most starts take. Names are the mangled symbols of
# this build; hot-text-link.sh matches them again at every link, so that a later build with
# other hashes still finds them.
#
# Usage: scripts/hot-text.sh [SHIM]   SHIM default: the static actk-runtime that
#        `scripts/build-release.sh --shims-only` builds (it is built when missing).
# Env:   VALGRIND  the valgrind to run (default: valgrind on PATH). Debian 12's 3.19 answers
#                  openat2(2) with ENOSYS, so discovery under it takes the path walk of kernels
#                  before 5.6 and the list would miss the functions of the openat2 path; a
#                  valgrind without openat2 is refused. Debian forky's 3.27 has it (extracted
#                  from its .deb: docs/performance.md says how).
# Needs: root (mknod in the fixtures), runc (for `runc spec`), jq, the release `actk` for the
# CDI specs (target/dist/actk; ACTK_BIN_DIR overrides).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
vg=${VALGRIND:-valgrind}
need() { echo "hot-text: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || need "needs root (the fixtures' device nodes)"
command -v "$vg" >/dev/null || need "no valgrind ($vg)"
for t in jq runc; do command -v $t >/dev/null || need "$t not on PATH"; done
shim=${1:-}
if [ -z "$shim" ]; then
  shim=$("$repo/scripts/build-release.sh" --shims-only | tail -n 1)/actk-runtime
fi
actk=${ACTK_BIN_DIR:-$repo/target/dist}/actk
[ -x "$shim" ] || need "$shim is not an executable"
[ -x "$actk" ] || need "$actk not built: scripts/build-release.sh"

work=$(mktemp -d /tmp/actk-hot-text-XXXXXX)
[ -n "${ACTK_HOT_TEXT_KEEP:-}" ] || trap 'rm -rf "$work"' EXIT

# shellcheck source=scripts/lib/valgrind-openat2.sh
. "$repo/scripts/lib/valgrind-openat2.sh"
valgrind_has_openat2 "$vg" "$work" || need "$("$vg" --version) answers openat2(2) with ENOSYS: set VALGRIND to one that has it (3.22 or later)"

# Every function with a cost in a callgrind profile, by mangled name, in the profile's order.
names() { sed -n 's/^c\{0,1\}fn=([0-9]*) //p' "$@" | sed "s/'[0-9]*\$//"; }
run() { # NAME CONFIG ARGS...: profile one call of the shim into $work/NAME.cg*
  local name=$1 cfg=$2
  shift 2
  ACTK_CONFIG=$cfg "$vg" --tool=callgrind --demangle=no --dump-instr=no --dump-before=execve \
    --callgrind-out-file="$work/$name.cg" "$shim" "$@" >/dev/null 2>"$work/$name.log" || true
  compgen -G "$work/$name.cg*" >/dev/null || { tail -n 5 "$work/$name.log" >&2; need "callgrind run $name failed"; }
}

order=()
for fx in nvidia-dgx-h100 amd-mi300x aws-trn1-32xlarge gaudi2; do
  case $fx in
    nvidia-dgx-h100) vendor=nvidia request='"NVIDIA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7", "NVIDIA_DRIVER_CAPABILITIES=all"' ;;
    amd-mi300x) vendor=amd request='"AMD_VISIBLE_DEVICES=0,1,2,3,4,5,6,7"' ;;
    aws-trn1-32xlarge) vendor=neuron request='"AWS_NEURON_VISIBLE_DEVICES=0-7"' ;;
    gaudi2) vendor=gaudi request='"HABANA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7"' ;;
  esac
  d=$work/$fx
  mkdir -p "$d/cdi" "$d/nocdi" "$d/hooks.d" "$d/profiles.d" "$d/bundle/rootfs"
  sh "$repo/fixtures/prepare.sh" "$fx" "$d/root" >/dev/null
  caps=()
  [ "$vendor" = nvidia ] && caps=(--capabilities all)
  "$actk" cdi generate --root "$d/root" --vendor "$vendor" "${caps[@]}" --ldcache-hook /usr/bin/actk-hook \
    --output "$d/cdi" >/dev/null
  runc spec --bundle "$d/bundle"
  jq ".process.terminal = false | .process.args = [\"/bin/true\"] | .process.env = [\"PATH=/bin\", $request] | .root.path = \"rootfs\"" \
    "$d/bundle/config.json" >"$d/config.orig.json"
  for m in cdi nocdi; do
    printf 'runtimes = ["/bin/true"]\nroot = "%s"\nspec_dirs = ["%s"]\nhooks_dirs = ["%s"]\nprofiles_dir = "%s"\nhook_path = "/usr/bin/actk-hook"\n' \
      "$d/root" "$d/$m" "$d/hooks.d" "$d/profiles.d" >"$d/$m.toml"
    cp "$d/config.orig.json" "$d/bundle/config.json"
    run "$fx-$m" "$d/$m.toml" create --bundle "$d/bundle" --pid-file "$d/pid" hot-text
    order+=("$work/$fx-$m.cg"*)
  done
  if [ "$vendor" = nvidia ]; then
    # First in the list: what every call runs (state, start and delete are little more than
    # that), so that those calls fault in the fewest windows of text.
    common=()
    for c in state start delete; do
      run "$c" "$d/cdi.toml" "$c" hot-text
      common+=("$work/$c.cg"*)
    done
    order=("${common[@]}" "${order[@]}")
  fi
done

out=$repo/crates/actk-runtime/hot-text.txt
{
  echo "# The functions actk-runtime runs in a container start, laid out together at the front of"
  echo "# .text by scripts/lib/hot-text-link.sh (issue 31). Written by scripts/hot-text.sh; do not edit."
  echo "# $("$shim" --version 2>/dev/null | head -n 1), $(rustc --version), $("$vg" --version)"
  # Symbols only: callgrind also names unnamed code by address and the C start-up as "(below main)",
  # so the start-up of every call (crt1's _start, musl's __libc_start_main) is named here.
  { printf '%s\n' _start _start_c __libc_start_main libc_start_main_stage2 main
    names "${order[@]}"; } | grep -E '^[A-Za-z_.$][A-Za-z0-9_.$]*$' | awk '!seen[$0]++'
} >"$out.new"
mv "$out.new" "$out"
echo "hot-text: $(grep -vc '^#' "$out") functions in $out" >&2
