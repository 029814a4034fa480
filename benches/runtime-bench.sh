#!/usr/bin/env bash
# Cost of actk-runtime against the floor of any config.json-editing shim (issues 3 and 14).
#
# ROUNDS interleaved rounds (default 300) of create / state / start / wait / delete of a busybox
# bundle that asks for 8 GPUs, one cycle of every variant per round, driven by benches/cycle-bench.c
# (containerd's runc shim in miniature: subreaper of the container, waits for it to exit):
#   actk-cdi    actk-runtime, CDI spec on the node (`actk cdi generate`): no discovery
#   actk-disc   actk-runtime, no spec: discovery of the host root on every create
#   actk-cdi64, actk-disc64   the same on a 64-GPU host built from the DGX fixture (same request)
#   floor       a static C shim that reads, writes back and renames config.json, then execs runc
#               (benches/floor-shim.c, built here): the least a config.json-editing shim does
#   exec-only   the same shim built to only exec runc
#   floor-musl, exec-only-musl   the same two linked with musl (musl-gcc, apt-get install
#               musl-tools; left out without it): actk-runtime's release build is static musl
#               (scripts/build-release.sh), and glibc's start-up costs every exec 0.2-0.3 ms of
#               CPUID exits in a VM that musl's does not, so these are the like-for-like floor
#   runc        plain runc
# floor, exec-only and runc run on the pre-edited bundle (the edits actk-runtime makes, applied
# once), so the low-level work is the same for every variant. Two fixtures with 8 GPUs: the DGX H100
# (NVIDIA_VISIBLE_DEVICES=0,...,7) and the MI300X (AMD_VISIBLE_DEVICES=0,...,7).
#
# Prints, per fixture: every variant's median wall and CPU time per call and per cycle; ratios of
# the cycle to runc's with the per-cycle difference (medians of differences paired by round); and
# the issue-14 figures: actk minus the floor per cycle (target <= 1.0 ms), every non-create call
# minus exec-only (target <= 0.3 ms), create with discovery minus the floor's create (<= 1.5 ms),
# and actk's create cost over the floor on the 64-GPU host against the 8-GPU host (<= 2x); the
# first and third also against floor-musl when it is built. Then, per fixture, the create
# figures again from a create-only pass with true(1) as every shim's runc (create_only below):
# the shim's own cost with runc's noise taken out, the steadier reading of the two.
# No pass/fail: a measurement, not a test.
#
# Usage: benches/runtime-bench.sh [ROUNDS]
# Needs: root, runc, gcc, jq, /bin/busybox (busybox-static), and the release binaries as they are
# installed: `scripts/build-release.sh` (static actk-runtime and actk-hook, built on their own so
# that they link none of the CLI's features) writes them to target/dist; ACTK_BIN_DIR overrides.
# ACTK_BENCH_FIXTURES overrides the fixture list ("nvidia-dgx-h100 amd-mi300x").
# ACTK_BENCH_BASELINE=DIR adds base-cdi and base-disc: the actk-runtime in DIR (with the actk-hook
# next to it, so that its edits are the same), e.g. an earlier commit's target/dist, in the same
# interleaved rounds, and prints what a change gained against it (one run on a noisy machine
# compares where two runs do not).
set -euo pipefail

rounds=${1:-300}
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=${ACTK_BIN_DIR:-$repo/target/dist}
fixtures=${ACTK_BENCH_FIXTURES:-nvidia-dgx-h100 amd-mi300x}
baseline=${ACTK_BENCH_BASELINE:-}

need() { echo "runtime-bench: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || need "needs root (runc, mknod)"
for b in actk-runtime actk-hook actk; do
  [ -x "$bin/$b" ] || need "$bin/$b not built: scripts/build-release.sh"
done
if [ -n "$baseline" ]; then
  for b in actk-runtime actk-hook; do [ -x "$baseline/$b" ] || need "ACTK_BENCH_BASELINE: no $baseline/$b"; done
fi
runc=$(command -v runc) || need "runc not on PATH"
command -v gcc >/dev/null || need "gcc not on PATH"
command -v jq >/dev/null || need "jq not on PATH"
[ -x /bin/busybox ] || need "/bin/busybox missing (apt-get install busybox-static)"

work=$(mktemp -d /tmp/actk-runtime-bench-XXXXXX)
cleanup() {
  for id in $(runc list -q 2>/dev/null | grep "^actk-bench-" || true); do runc delete --force "$id" >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
trap cleanup EXIT

gcc -O2 -o "$work/cycle-bench" "$repo/benches/cycle-bench.c"
# Each floor is linked in build/ and copied into place, like target/dist's binaries; then every
# binary a variant runs is dropped from the page cache (evict, before the rounds), so that all
# are read back from disk as a node reads an installed binary after boot. How a file's pages sit
# in the page cache changes what a process started from it pays to fault them in: on this
# project's VM actk-runtime's create cost 0.2-0.3 ms more CPU right after the linker or cp wrote
# the file than after its pages were read back from disk, which is more than most changes the
# bench is run to compare.
mkdir -p "$work/build"
floor_build() { # CC NAME RUNC [-DEXEC_ONLY]
  "$1" -O2 -static -DRUNC_PATH="\"$3\"" ${4:-} -o "$work/build/$2" "$repo/benches/floor-shim.c"
  cp "$work/build/$2" "$work/$2"
}
evict() { # FILE... : written back, then dropped from the page cache
  local f
  for f in "$@"; do
    sync "$f"
    dd if="$f" iflag=nocache count=0 status=none
  done
}
floor_build gcc floor "$runc"
floor_build gcc exec-only "$runc" -DEXEC_ONLY
# The create-only pass: the same floor with true(1) as its runc.
floor_build gcc floor-true /bin/true
floors=(floor exec-only)
true_floors=(floor-true)
if command -v musl-gcc >/dev/null; then
  floor_build musl-gcc floor-musl "$runc"
  floor_build musl-gcc exec-only-musl "$runc" -DEXEC_ONLY
  floor_build musl-gcc floor-musl-true /bin/true
  floors+=(floor-musl exec-only-musl)
  true_floors+=(floor-musl-true)
else
  echo "runtime-bench: no musl-gcc (apt-get install musl-tools): no floor-musl" >&2
fi

echo "actk-runtime: $(stat -c %s "$bin/actk-runtime") bytes, $(file -b "$bin/actk-runtime" | cut -d, -f1-2), $(grep -q GLIBC "$bin/actk-runtime" && echo glibc || echo musl)"

# A 64-GPU host from a prepared DGX H100 root: for PCI domains 0001..0007 a copy of each of the 8
# GPUs at the same bus number, with its own procfs information (UUID, bus, minor), PCI sysfs entry
# and /dev/nvidiaN (as benches/discovery.rs in actk-core builds it).
extend_dgx_to_64() { # ROOT
  local root=$1 minor=8 domain bdf nbdf g
  local gpus=$root/proc/driver/nvidia/gpus
  local originals=("$gpus"/0000:*)
  for domain in 1 2 3 4 5 6 7; do
    for g in "${originals[@]}"; do
      bdf=${g##*/}
      nbdf=$(printf '%04x%s' "$domain" "${bdf:4}")
      mkdir -p "$gpus/$nbdf" "$root/sys/devices/pci$(printf %04x "$domain"):00/$nbdf"
      sed -e "s/^GPU UUID:.*/GPU UUID: \t GPU-5e7e7e7e-0000-4000-8000-$(printf %012x "$minor")/" \
        -e "s/^Bus Location:.*/Bus Location: \t $nbdf/" -e "s/^Device Minor:.*/Device Minor: \t $minor/" \
        "$g/information" >"$gpus/$nbdf/information"
      cp "$root/sys/bus/pci/devices/$bdf/numa_node" "$root/sys/devices/pci$(printf %04x "$domain"):00/$nbdf/numa_node"
      ln -s "../../../devices/pci$(printf %04x "$domain"):00/$nbdf" "$root/sys/bus/pci/devices/$nbdf"
      mknod -m 666 "$root/dev/nvidia$minor" c 195 "$minor"
      minor=$((minor + 1))
    done
  done
}

make_bundle() { # DIR ENV...
  local dir=$1; shift
  mkdir -p "$dir/rootfs/bin" "$dir/rootfs/dev" "$dir/rootfs/proc" "$dir/rootfs/sys" "$dir/rootfs/tmp"
  cp /bin/busybox "$dir/rootfs/bin/busybox"
  ln -sf busybox "$dir/rootfs/bin/true"
  ln -sf busybox "$dir/rootfs/bin/sh"
  runc spec --bundle "$dir"
  local env='["PATH=/bin"'
  for e in "$@"; do env="$env, \"$e\""; done
  env="$env]"
  jq --argjson env "$env" '.process.terminal = false | .process.args = ["/bin/true"] | .process.env = $env | .root.path = "rootfs" | .root.readonly = false' \
    "$dir/config.json" >"$dir/config.json.new"
  mv "$dir/config.json.new" "$dir/config.json"
}

write_config() { # FILE ROOT SPEC_DIR [RUNTIME]
  cat >"$1" <<EOF
runtimes = ["${4:-$runc}"]
root = "$2"
spec_dirs = ["$3"]
hooks_dirs = ["$work/hooks.d"]
profiles_dir = "$work/profiles.d"
EOF
}

summary() { # what a config.json asks runc to do
  jq -r '"\(.linux.devices | length) device nodes, \(.mounts | length) mounts, \([.hooks[]?[]] | length) hooks"' "$1"
}

# On a shared machine other processes' bursts land on some cycles and not others; the cycles run
# at a high priority (nice -n -15; ACTK_BENCH_NICE overrides) to take part of that noise out.
# (SCHED_FIFO would take more, but runc cannot put an RT task into a cgroup v1 cpu group.)
rt="nice -n ${ACTK_BENCH_NICE:--15}"

# The figures of a run, from its paired differences "A - B  call wall/cpu ...": pick A B CALL
# prints "wall/cpu" ms from $out (the fixture's out.txt unless set); cpu_of only the CPU.
pick() { awk -v row="$1 - $2 " -v call="$3" 'index($0, row) == 1 { for (i = 1; i <= NF; i++) if ($i == call) print $(i+1) }' "${out:-$d/out.txt}"; }
cpu_of() { pick "$@" | cut -d/ -f2 | tr -d +; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

# The shim's own cost, without runc: every shim configured with true(1) as its low-level runtime
# (the floors built so), 2 x ROUNDS interleaved rounds of `create` alone. runc's create is the
# same work for every variant by construction (floor and runc get the pre-edited bundle), so
# this is the full cycle's create difference with runc's milliseconds of noise taken out of
# every sample: the steadier reading of the create figures.
create_only() { # FIXTURE
  local fx=$1 v cfg shim f out=$d/create.txt
  local args=()
  for v in "${variants[@]}"; do
    cfg=${v#actk-} shim=$bin/actk-runtime
    case $v in base-*) cfg=${v#base-} shim=$baseline/actk-runtime ;; esac
    sed 's#^runtimes = .*#runtimes = ["/bin/true"]#' "$d/$cfg.toml" >"$d/$cfg-true.toml"
    args+=(-v "$v" -r "$shim" -b "$d/$v" -o "$d/$v.orig.json" -e "ACTK_CONFIG=$d/$cfg-true.toml")
  done
  for f in "${true_floors[@]}"; do args+=(-v "${f%-true}" -r "$work/$f" -b "$d/${f%-true}"); done
  for v in "${variants[@]}"; do for f in "${true_floors[@]}"; do args+=(-P "$v:${f%-true}"); done; done
  if [ -n "$baseline" ]; then args+=(-P actk-cdi:base-cdi -P actk-disc:base-disc); fi
  echo "-- create only, true(1) as runc ($fx, $((rounds * 2)) interleaved rounds; paired medians, wall/cpu ms)"
  $rt "$work/cycle-bench" -C 1 -n $((rounds * 2)) "${args[@]}" | grep ' - ' | sed 's/ state.*//' >"$out"
  cat "$out"
  echo "actk-disc create - floor create: $(pick actk-disc floor create) (target <= 1.5)"
  echo "actk-cdi create - floor create: $(pick actk-cdi floor create)"
  f=floor
  if [ ${#true_floors[@]} = 2 ]; then
    f=floor-musl
    echo "against floor-musl: actk-disc create $(pick actk-disc floor-musl create), actk-cdi create $(pick actk-cdi floor-musl create)"
  fi
  if [ -n "$baseline" ]; then
    echo "against the baseline ($baseline): actk-cdi create $(pick actk-cdi base-cdi create), actk-disc create $(pick actk-disc base-disc create)"
  fi
  if [ "$fx" = nvidia-dgx-h100 ]; then
    local m c8 c64
    for m in cdi disc; do
      c8=$(cpu_of "actk-$m" $f create) c64=$(cpu_of "actk-${m}64" $f create)
      echo "64-GPU host vs 8-GPU host, actk-$m create CPU over $f's: $c64 vs $c8 ms = $(ratio "$c64" "$c8")x (target <= 2)"
    done
  fi
}

evict "$bin/actk-runtime" "$bin/actk-hook" "$runc" "$work"/floor* "$work"/exec-only*
[ -z "$baseline" ] || evict "$baseline/actk-runtime" "$baseline/actk-hook"
mkdir -p "$work/hooks.d" "$work/profiles.d"
for fx in $fixtures; do
  case $fx in
    # All capabilities: a CDI spec holds every capability's files, so discovery must mount the
    # same for the two actk variants to hand runc the same work as the pre-edited bundle.
    nvidia-dgx-h100) vendor=nvidia request="NVIDIA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 NVIDIA_DRIVER_CAPABILITIES=all" ;;
    amd-mi300x) vendor=amd request=AMD_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 ;;
    *) need "no request known for fixture $fx" ;;
  esac
  d=$work/$fx
  mkdir -p "$d/cdi" "$d/nocdi"
  sh "$repo/fixtures/prepare.sh" "$fx" "$d/root" >/dev/null
  "$bin/actk" cdi generate --root "$d/root" --vendor "$vendor" --ldcache-hook "$bin/actk-hook" --output "$d/cdi" >/dev/null
  write_config "$d/disc.toml" "$d/root" "$d/nocdi"
  write_config "$d/cdi.toml" "$d/root" "$d/cdi"
  variants=(actk-cdi actk-disc)
  if [ "$fx" = nvidia-dgx-h100 ]; then
    cp -a "$d/root" "$d/root64"
    extend_dgx_to_64 "$d/root64"
    mkdir -p "$d/cdi64"
    "$bin/actk" cdi generate --root "$d/root64" --vendor nvidia --ldcache-hook "$bin/actk-hook" --output "$d/cdi64" >/dev/null
    write_config "$d/disc64.toml" "$d/root64" "$d/nocdi"
    write_config "$d/cdi64.toml" "$d/root64" "$d/cdi64"
    variants+=(actk-cdi64 actk-disc64)
  fi
  if [ -n "$baseline" ]; then variants+=(base-cdi base-disc); fi
  for v in "${variants[@]}" "${floors[@]}" runc; do make_bundle "$d/$v" $request; done
  # The shim variants get the unedited config.json back before every create.
  for v in "${variants[@]}"; do cp "$d/$v/config.json" "$d/$v.orig.json"; done
  # The pre-edited bundle: what actk-runtime writes (discovery), made once with true(1) as runc.
  write_config "$d/edit.toml" "$d/root" "$d/nocdi" /bin/true
  ACTK_CONFIG=$d/edit.toml "$bin/actk-runtime" create --bundle "$d/runc" edit-once
  for v in "${floors[@]}"; do cp "$d/runc/config.json" "$d/$v/config.json"; done
  write_config "$d/edit-cdi.toml" "$d/root" "$d/cdi" /bin/true
  mkdir -p "$d/check" && cp "$d/actk-cdi.orig.json" "$d/check/config.json"
  ACTK_CONFIG=$d/edit-cdi.toml "$bin/actk-runtime" create --bundle "$d/check" edit-once

  echo
  echo "== $fx: $request, $rounds interleaved rounds"
  echo "edits: discovery $(summary "$d/runc/config.json"); CDI spec $(summary "$d/check/config.json")"
  args=()
  for v in "${variants[@]}"; do
    cfg=${v#actk-}
    shim=$bin/actk-runtime
    case $v in base-*) cfg=${v#base-} shim=$baseline/actk-runtime ;; esac
    args+=(-v "$v" -r "$shim" -b "$d/$v" -o "$d/$v.orig.json" -e "ACTK_CONFIG=$d/$cfg.toml")
  done
  for v in "${floors[@]}"; do args+=(-v "$v" -r "$work/$v" -b "$d/$v"); done
  args+=(-v runc -r "$runc" -b "$d/runc")
  for v in "${variants[@]}" "${floors[@]}"; do args+=(-R "$v:runc"); done
  args+=(-P actk-cdi:floor -P actk-disc:floor -P actk-cdi:exec-only -P actk-disc:exec-only -P floor:exec-only -P exec-only:runc)
  if [ "$fx" = nvidia-dgx-h100 ]; then args+=(-P actk-cdi64:floor -P actk-disc64:floor); fi
  if [ ${#floors[@]} = 4 ]; then
    args+=(-P actk-cdi:floor-musl -P actk-disc:floor-musl -P actk-cdi:exec-only-musl -P floor:floor-musl -P floor-musl:exec-only-musl)
    if [ "$fx" = nvidia-dgx-h100 ]; then args+=(-P actk-cdi64:floor-musl -P actk-disc64:floor-musl); fi
  fi
  if [ -n "$baseline" ]; then args+=(-P actk-cdi:base-cdi -P actk-disc:base-disc -P base-disc:floor); fi
  echo "per call: median wall and CPU ms; ratios to runc (cycle medians) and paired per-cycle differences;"
  echo "then A - B: paired median differences per call, wall/cpu ms"
  $rt "$work/cycle-bench" -n "$rounds" -t "$d/samples.tsv" "${args[@]}" | tee "$d/out.txt"
  # Figures of issue 14 from the paired differences: "wall/cpu" ms.
  echo "-- issue 14 figures ($fx; paired medians, wall/cpu ms; on a loaded machine the CPU figure is the steadier)"
  for a in actk-cdi actk-disc; do
    echo "$a - floor per cycle: $(pick "$a" floor cycle) (target <= 1.0)"
    echo "$a - exec-only: state $(pick "$a" exec-only state), start $(pick "$a" exec-only start), delete $(pick "$a" exec-only delete) (target <= 0.3 each)"
  done
  echo "actk-disc create - floor create: $(pick actk-disc floor create) (target <= 1.5)"
  if [ ${#floors[@]} = 4 ]; then
    echo "against floor-musl: actk-cdi per cycle $(pick actk-cdi floor-musl cycle), actk-disc per cycle $(pick actk-disc floor-musl cycle), actk-disc create $(pick actk-disc floor-musl create); actk-cdi - exec-only-musl: state $(pick actk-cdi exec-only-musl state), start $(pick actk-cdi exec-only-musl start), delete $(pick actk-cdi exec-only-musl delete); floor - floor-musl per cycle $(pick floor floor-musl cycle)"
  fi
  if [ -n "$baseline" ]; then
    echo "against the baseline ($baseline): actk-cdi create $(pick actk-cdi base-cdi create), actk-disc create $(pick actk-disc base-disc create); base-disc create - floor create: $(pick base-disc floor create)"
  fi
  if [ "$fx" = nvidia-dgx-h100 ]; then
    # Over floor-musl when built: over the glibc floor actk-cdi's create costs about nothing
    # (its CPU difference is near 0 and of either sign), which makes a ratio meaningless.
    f=floor
    [ ${#floors[@]} = 4 ] && f=floor-musl
    for m in cdi disc; do
      c8=$(cpu_of "actk-$m" $f create) c64=$(cpu_of "actk-${m}64" $f create)
      echo "64-GPU host vs 8-GPU host, actk-$m create CPU over $f's: $c64 vs $c8 ms = $(ratio "$c64" "$c8")x (target <= 2)"
    done
  fi
  create_only "$fx"
done
