#!/usr/bin/env bash
# What a container start costs through the shims that ship, next to plain runc, the floor of any
# config.json-editing shim and NVIDIA's runtime (issues 3, 14, 31). Two passes:
#
#   benches/runtime-bench.sh [ROUNDS]         compare (default; ROUNDS default 200)
#   benches/runtime-bench.sh scale [ROUNDS]   nodes of 8, 64 and 256 devices (ROUNDS default 150)
#   benches/runtime-bench.sh stages [ROUNDS]  a create's cost stage by stage (ROUNDS default 150)
#
# compare, per fixture (the DGX H100 asking for its 8 GPUs, the MI300X for its 8), all variants
# interleaved in one run with the order shuffled each round (benches/cycle-bench.c):
#   actk-cdi     target/dist's actk-runtime, a CDI spec on the node (`actk cdi generate`)
#   actk-disc    the same with no spec: discovery of the host root on every create
#   nvidia-cdi   NVIDIA's nvidia-container-runtime (DGX only; scripts/fetch-nvidia-runtime.sh
#                builds it from the Go module proxy into a cache outside the clone: a test peer,
#                never a dependency of actk) in mode "cdi" against the same CDI spec
#   floor        a static C shim that reads, writes back and renames config.json, then execs runc
#                (benches/floor-shim.c): the least a config.json-editing shim does
#   exec-only    the same shim built to only exec runc
#   floor-musl, exec-only-musl   the two linked with musl (musl-gcc: apt-get install
#                musl-tools), like actk-runtime's release build: glibc's start-up costs every exec
#                0.2-0.3 ms of CPUID exits in a VM and musl's does not, so these are the
#                like-for-like floor, used for the targets when built
#   runc         plain runc
# floor, exec-only and runc run on the pre-edited bundle (the edits actk-runtime makes, applied
# once), so the low-level work is the same for every variant; before any timing every shim's
# edits are made once (with true(1) as its runc) and compared with that bundle's: device nodes,
# cgroup device rules, mounts, env, hooks and GIDs must be the same set, or the run stops and
# prints the difference. Bundles live on a tmpfs, as containerd keeps them under /run; every
# binary is dropped from the page cache before the rounds (see `evict`).
# Two runs of cycle-bench per fixture:
#   cycles        ROUNDS rounds of create, state, start, wait (the container runs true) and
#                 delete of every variant
#   single calls  2 x ROUNDS rounds of create, state, start and delete of every shim with true(1)
#                 as its runc: each call's own cost without runc's milliseconds of noise, the
#                 steadier reading (the targets are read from it)
# Printed: per variant and call the medians of wall ms, CPU ms (wait4: the process and all it
# runs), minor faults and peak RSS KiB; per-round ratios of the cycle to runc (median and
# p25..p75, wall and CPU); paired differences A - B by round (median and p25..p75); then the
# issue-31 figures with their targets: create CPU over the floor's create <= 0.5 ms with a spec,
# <= 1.0 ms with discovery, every other call at the floor; and the floor's own create, the
# machine's speed in that run, which every over-the-floor figure scales with.
#
# scale, per vendor fixture (NVIDIA DGX H100, AMD MI300X CPX partitions, AWS Trainium trn1, Intel
# Gaudi2 on the DRM accel subsystem): synthetic nodes of 8, 64 and 256 devices built from the
# real layout (fixtures/generate.py --devices; NVIDIA stops at 254 GPUs, the driver's minors),
# with a spec and with discovery, asking for 8 devices ("8 of N": what grows is the node) and
# for all of them ("all N": what grows is also the request); create only, true(1) as runc,
# ROUNDS interleaved rounds of all of a vendor's variants. Prints each create's CPU over
# floor-musl's, the 64/8 and 256/8 ratios (target: 64 devices <= 1.5x of 8, every vendor, spec
# and discovery, for 8 of N) and, for all N, the CPU per added device from 8 to 64 and from 64
# to 256 (linear when the two agree).
#
# stages, per fixture of compare: where the create's CPU goes. actk-runtime built with the cargo
# feature `bench-stages` (crates/actk-core/src/bench_stage.rs; built here with
# `scripts/build-release.sh --shims-only --features actk-runtime/bench-stages`, copied out, then
# the plain shims built again in its place; ACTK_BENCH_STAGES_BIN=FILE names one built already) ends its create at the stage ACTK_BENCH_STAGE names. One variant per stage,
# create only with true(1) as runc, all in the same interleaved rounds with NVIDIA's runtime (as
# in compare, whose Go runtime leaves the caches cold between calls) and the musl floors; a
# spec run and a discovery run. Before timing, every stage variant is run once and must end
# without writing config.json (and `full`, the whole create, must write it), so that a stage name
# the shim does not know fails the bench instead of timing the whole create. Prints each stage's
# CPU as the paired difference from the stage before it (median [p25 p75], faults).
#
# ACTK_BENCH_CALLGRIND=1 adds instruction counts (valgrind's callgrind, dumped when the shim
# calls execve): every create of the scale pass and the compare pass's actk creates once each.
# They repeat to the instruction on a loaded machine, where CPU figures do not.
# ACTK_BENCH_CALLGRIND_KEEP=DIR keeps each profile as DIR/<pass>-<variant>.cg, for
# callgrind_annotate (build with debug info to see lines: CARGO_PROFILE_RELEASE_DEBUG=1).
#
# No pass/fail: a measurement, not a test. On a busy machine the CPU figures are the steadier
# (`uptime` is printed with them); take them on a quiet one.
#
# Needs: root, runc, gcc, jq, python3, /bin/busybox (busybox-static), the release binaries
# (`scripts/build-release.sh` -> target/dist; ACTK_BIN_DIR overrides), go for the NVIDIA peer
# (ACTK_BENCH_NVIDIA=0 leaves it out), musl-gcc for the musl floors, valgrind for callgrind.
# ACTK_BENCH_NODE_LIBS=1 gives compare's fixture roots a node's ld.so.cache: this machine's own
# libraries of /usr/lib/x86_64-linux-gnu (hard links, or copies across file systems) beside the
# fixture's, and the cache written again by `ldconfig -r` (a node's holds one to three thousand
# entries, a fixture's a few dozen; issue 31). The entry count is printed.
# ACTK_BENCH_FIXTURES overrides compare's fixture list, ACTK_BENCH_VENDORS scale's
# ("nvidia amd neuron gaudi"). ACTK_BENCH_BASELINE=DIR adds base-cdi and base-disc to compare:
# the actk-runtime in DIR (with the actk-hook next to it), e.g. an earlier commit's target/dist,
# in the same interleaved rounds.
set -euo pipefail

mode=compare
case ${1:-} in scale | stages) mode=$1; shift ;; esac
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=${ACTK_BIN_DIR:-$repo/target/dist}
fixtures=${ACTK_BENCH_FIXTURES:-nvidia-dgx-h100 amd-mi300x}
vendors=${ACTK_BENCH_VENDORS:-nvidia amd neuron gaudi}
baseline=${ACTK_BENCH_BASELINE:-}
callgrind=${ACTK_BENCH_CALLGRIND:-0}
with_nvidia=${ACTK_BENCH_NVIDIA:-1}
if [ "$mode" = compare ]; then rounds=${1:-200}; else rounds=${1:-150}; fi

need() { echo "runtime-bench: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || need "needs root (runc, mknod, mount)"
for b in actk-runtime actk-hook actk; do
  [ -x "$bin/$b" ] || need "$bin/$b not built: scripts/build-release.sh"
done
if [ -n "$baseline" ]; then
  for b in actk-runtime actk-hook; do [ -x "$baseline/$b" ] || need "ACTK_BENCH_BASELINE: no $baseline/$b"; done
fi
runc=$(command -v runc) || need "runc not on PATH"
for t in gcc jq python3; do command -v $t >/dev/null || need "$t not on PATH"; done
[ -x /bin/busybox ] || need "/bin/busybox missing (apt-get install busybox-static)"
[ "$callgrind" = 0 ] || command -v valgrind >/dev/null || need "ACTK_BENCH_CALLGRIND=1 needs valgrind"
nvidia_rt=
if [ "$mode" != scale ] && [ "$with_nvidia" = 1 ]; then
  nvidia_rt=$("$repo/scripts/fetch-nvidia-runtime.sh" | tail -n 1) || need "cannot build NVIDIA's runtime (ACTK_BENCH_NVIDIA=0 leaves it out)"
fi

# Binaries on disk in $work (read back from disk like an installed binary, see evict); bundles
# and host roots on a tmpfs in $run, as containerd keeps bundles under /run and the kernel's
# /dev, /sys and /proc are in memory.
work=$(mktemp -d /tmp/actk-runtime-bench-XXXXXX)
run=$work/run
mkdir -p "$run"
mount -t tmpfs -o size=4g,mode=0755 actk-bench "$run"
cleanup() {
  for id in $(runc list -q 2>/dev/null | grep "^actk-bench-" || true); do runc delete --force "$id" >/dev/null 2>&1 || true; done
  umount "$run" 2>/dev/null || umount -l "$run" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# Valgrind 3.19 (bookworm's) answers openat2(2) with ENOSYS, so discovery under it walks every
# path name by name, as on a kernel before 5.6, and callgrind counts that fallback. Forky's
# 3.27 implements openat2 (docs/performance.md: how to run it from its extracted .deb).
if [ "$callgrind" != 0 ]; then
  # shellcheck source=scripts/lib/valgrind-openat2.sh
  . "$repo/scripts/lib/valgrind-openat2.sh"
  if ! valgrind_has_openat2 valgrind "$work"; then
    echo "runtime-bench: $(valgrind --version) has no openat2: callgrind's discovery rows count the path walk of kernels before 5.6" >&2
  fi
fi

gcc -O2 -o "$work/cycle-bench" "$repo/benches/cycle-bench.c"
# Each floor is linked in build/ and copied into place, like target/dist's binaries; then every
# binary a variant runs is dropped from the page cache (evict, before the rounds), so that all
# are read back from disk as a node reads an installed binary after boot. How a file's pages sit
# in the page cache changes what a process started from it pays to fault them in: on this
# project's VM actk-runtime's create cost 0.2-0.3 ms more CPU right after the linker or cp wrote
# the file than after its pages were read back from disk, which is more than most changes the
# bench is run to compare.
mkdir -p "$work/build"
# ACTK_BENCH_NODE_LIBS=1: this machine's libraries added to fixture root $1, its ld.so.cache
# written again (see the header).
node_libs() {
  [ "${ACTK_BENCH_NODE_LIBS:-0}" = 1 ] || return 0
  local from=/usr/lib/x86_64-linux-gnu to=$1/usr/lib/x86_64-linux-gnu f
  mkdir -p "$to"
  for f in "$from"/lib*.so*; do
    if [ -e "$to/${f##*/}" ] || [ -L "$to/${f##*/}" ]; then continue; fi
    if [ -L "$f" ]; then
      cp -P "$f" "$to/"
    elif [ -f "$f" ]; then
      ln "$f" "$to/" 2>/dev/null || cp "$f" "$to/"
    fi
  done
  ldconfig -r "$1" || need "ldconfig -r $1 failed"
  echo "node libraries: $1/etc/ld.so.cache holds $(ldconfig -C "$1/etc/ld.so.cache" -p 2>/dev/null | head -n 1)"
}

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
floor_build gcc floor-true /bin/true
floor_build gcc exec-only-true /bin/true -DEXEC_ONLY
floors=(floor exec-only)
floor=floor exec_only=exec-only
if command -v musl-gcc >/dev/null; then
  floor_build musl-gcc floor-musl "$runc"
  floor_build musl-gcc exec-only-musl "$runc" -DEXEC_ONLY
  floor_build musl-gcc floor-musl-true /bin/true
  floor_build musl-gcc exec-only-musl-true /bin/true -DEXEC_ONLY
  floors+=(floor-musl exec-only-musl)
  floor=floor-musl exec_only=exec-only-musl
else
  echo "runtime-bench: no musl-gcc (apt-get install musl-tools): the targets are read against the glibc floor" >&2
fi

echo "runtime-bench $mode: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the start"
echo "actk-runtime: $(stat -c %s "$bin/actk-runtime") bytes, $(file -b "$bin/actk-runtime" | cut -d, -f1-2), $(grep -q GLIBC "$bin/actk-runtime" && echo glibc || echo musl); $("$bin/actk-runtime" --version 2>/dev/null | head -n 1 || true)"
[ -z "$nvidia_rt" ] || echo "nvidia-container-runtime: $nvidia_rt ($(stat -c %s "$nvidia_rt") bytes, $(file -b "$nvidia_rt" | cut -d, -f1-2))"

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
hook_path = "$bin/actk-hook"
EOF
}

# NVIDIA's runtime as its packages configure it (config.toml of nvidia-container-toolkit-base),
# but in mode "cdi" with the spec directory of the actk variants and runc (or true) as runtime.
write_nvidia_config() { # FILE SPEC_DIR RUNTIME
  cat >"$1" <<EOF
[nvidia-container-runtime]
log-level = "info"
mode = "cdi"
runtimes = ["$3"]
[nvidia-container-runtime.modes.cdi]
annotation-prefixes = ["cdi.k8s.io/"]
default-kind = "nvidia.com/gpu"
spec-dirs = ["$2"]
EOF
}

# What a config.json asks runc to set up for devices, as a set: sorted, annotations left out
# (actk marks what it served there), so that two shims' edits compare whatever their order. A
# bind mount without a type is a bind mount with type "bind" to runc (the `bind` option decides),
# and the reference library (NVIDIA's runtime) leaves the type out where actk writes it.
edits_of() { # CONFIG.JSON
  jq -S '{devices: ([.linux.devices[]?] | sort_by(.path)),
          device_rules: ([.linux.resources.devices[]?] | unique),
          mounts: ([.mounts[]? | if .type == null and ((.options // []) | (index("bind") != null or index("rbind") != null)) then .type = "bind" else . end] | sort_by(.destination)),
          env: ([.process.env[]?] | sort),
          hooks: ((.hooks // {}) | map_values(sort_by(.path, (.args | tostring)))),
          additional_gids: ([.process.user.additionalGids[]?] | sort)}' "$1"
}
summary() { # CONFIG.JSON: what it asks runc to do
  jq -r '"\(.linux.devices | length) device nodes, \(.mounts | length) mounts, \([.hooks[]?[]] | length) hooks"' "$1"
}

# On a shared machine other processes' bursts land on some cycles and not others; the cycles run
# at a high priority (nice -n -15; ACTK_BENCH_NICE overrides) to take part of that noise out.
# (SCHED_FIFO would take more, but runc cannot put an RT task into a cgroup v1 cpu group.)
rt="nice -n ${ACTK_BENCH_NICE:--15}"

# The figures of a run, from its paired differences "A - B CALL wall M [P25 P75] cpu M [P25 P75]":
# pick A B CALL FIELD prints that field's median (FIELD wall or cpu) from $out; spread the
# whole "M [P25 P75]".
pick() { awk -v head="$1 - $2 $3" -v f="$4" 'index($0, head " ") == 1 { for (i = 1; i <= NF; i++) if ($i == f) print $(i+1) }' "$out"; }
spread() { awk -v head="$1 - $2 $3" -v f="$4" 'index($0, head " ") == 1 { for (i = 1; i <= NF; i++) if ($i == f) print $(i+1), $(i+2), $(i+3) }' "$out"; }
cpu_over() { pick "$1" "$2" "$3" cpu | tr -d +; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
verdict() { awk -v v="$1" -v t="$2" 'BEGIN { print (v <= t) ? "met" : "NOT met" }'; }

# Instructions of one create under callgrind up to the exec of the low-level runtime
# (--dump-before=execve; the exec'd program is not traced). Prints the count.
instructions() { # CONFIG BUNDLE ORIGINAL [SHIM]
  local out=$work/cg.$$ shim=${4:-$bin/actk-runtime}
  cp "$3" "$2/config.json"
  rm -f "$out" "$out".*
  ACTK_CONFIG=$1 valgrind --tool=callgrind --dump-before=execve --callgrind-out-file="$out" \
    "$shim" create --bundle "$2" --pid-file "$2/cg.pid" actk-bench-cg >/dev/null 2>"$work/cg.log" || true
  [ -s "$out.1" ] || { tail -n 5 "$work/cg.log" >&2; need "callgrind run failed"; }
  awk '/^summary:/ { print $2 }' "$out.1"
  [ -z "${ACTK_BENCH_CALLGRIND_KEEP:-}" ] || cp "$out.1" "$ACTK_BENCH_CALLGRIND_KEEP/$(basename "$(dirname "$2")")-$(basename "$2").cg"
  rm -f "$out" "$out".*
}

mkdir -p "$work/hooks.d" "$work/profiles.d"

compare() {
  local fx=$1 vendor request d v cfg shim f
  case $fx in
    # All capabilities: a CDI spec holds every capability's files, so discovery must mount the
    # same for the two actk variants to hand runc the same work as the pre-edited bundle.
    nvidia-dgx-h100) vendor=nvidia request="NVIDIA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 NVIDIA_DRIVER_CAPABILITIES=all" ;;
    amd-mi300x) vendor=amd request=AMD_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 ;;
    *) need "no request known for fixture $fx" ;;
  esac
  d=$run/$fx
  mkdir -p "$d/cdi" "$d/nocdi"
  sh "$repo/fixtures/prepare.sh" "$fx" "$d/root" >/dev/null
  node_libs "$d/root"
  # NVIDIA: every capability in the spec, NVSwitch nodes (`fabric`) included, as the request
  # asks for all of them (a spec without --capabilities leaves the capability-only nodes out).
  local caps=()
  [ "$vendor" = nvidia ] && caps=(--capabilities all)
  "$bin/actk" cdi generate --root "$d/root" --vendor "$vendor" "${caps[@]}" --ldcache-hook "$bin/actk-hook" --output "$d/cdi" >/dev/null
  write_config "$d/disc.toml" "$d/root" "$d/nocdi"
  write_config "$d/cdi.toml" "$d/root" "$d/cdi"
  local variants=(actk-cdi actk-disc)
  local peers=()
  if [ "$vendor" = nvidia ] && [ -n "$nvidia_rt" ]; then peers=(nvidia-cdi); fi
  if [ -n "$baseline" ]; then variants+=(base-cdi base-disc); fi
  local shims=("${variants[@]}" "${peers[@]}")
  for v in "${shims[@]}" "${floors[@]}" runc; do make_bundle "$d/$v" $request; done
  # The shim variants get the unedited config.json back before every create.
  for v in "${shims[@]}"; do cp "$d/$v/config.json" "$d/$v.orig.json"; done
  # Each shim's configuration with runc, and with true(1) for the single calls.
  declare -A envs envs_true
  for v in "${shims[@]}"; do
    case $v in
      nvidia-cdi)
        write_nvidia_config "$d/nvidia.toml" "$d/cdi" "$runc"
        write_nvidia_config "$d/nvidia-true.toml" "$d/cdi" /bin/true
        envs[$v]=NVIDIA_CTK_CONFIG_FILE_PATH=$d/nvidia.toml envs_true[$v]=NVIDIA_CTK_CONFIG_FILE_PATH=$d/nvidia-true.toml ;;
      *)
        cfg=${v#*-}
        sed 's#^runtimes = .*#runtimes = ["/bin/true"]#' "$d/$cfg.toml" >"$d/$cfg-true.toml"
        envs[$v]=ACTK_CONFIG=$d/$cfg.toml envs_true[$v]=ACTK_CONFIG=$d/$cfg-true.toml ;;
    esac
  done
  shim_of() { case $1 in nvidia-cdi) echo "$nvidia_rt" ;; base-*) echo "$baseline/actk-runtime" ;; *) echo "$bin/actk-runtime" ;; esac; }

  # The pre-edited bundle: what actk-runtime writes (discovery), made once with true(1) as runc.
  ACTK_CONFIG=$d/disc-true.toml "$bin/actk-runtime" create --bundle "$d/runc" edit-once
  for v in "${floors[@]}"; do cp "$d/runc/config.json" "$d/$v/config.json"; done
  # Every shim's edits, made once the same way, against it.
  edits_of "$d/runc/config.json" >"$d/edits.want"
  local differ=0
  for v in "${shims[@]}"; do
    mkdir -p "$d/check-$v" && cp "$d/$v.orig.json" "$d/check-$v/config.json"
    env "${envs_true[$v]}" "$(shim_of "$v")" create --bundle "$d/check-$v" edit-once >/dev/null
    edits_of "$d/check-$v/config.json" >"$d/edits.$v"
    if ! diff -u "$d/edits.want" "$d/edits.$v" >"$d/edits.$v.diff"; then
      echo "runtime-bench: $fx: $v's edits differ from actk-disc's (- actk-disc, + $v):" >&2
      head -n 60 "$d/edits.$v.diff" >&2
      differ=1
    fi
  done
  [ $differ = 0 ] || need "$fx: the variants' edits differ; their times would not compare the same work"

  echo
  echo "== $fx: $request"
  echo "edits: $(summary "$d/runc/config.json"), the same set from ${shims[*]}"
  local args=() one=()
  for v in "${shims[@]}"; do
    args+=(-v "$v" -r "$(shim_of "$v")" -b "$d/$v" -o "$d/$v.orig.json" -e "${envs[$v]}")
  done
  for v in "${floors[@]}"; do args+=(-v "$v" -r "$work/$v" -b "$d/$v"); done
  args+=(-v runc -r "$runc" -b "$d/runc")
  for v in "${shims[@]}" "${floors[@]}"; do args+=(-R "$v:runc"); done
  for v in "${shims[@]}"; do args+=(-P "$v:$floor" -P "$v:$exec_only"); done
  args+=(-P "floor:exec-only" -P "exec-only:runc")
  [ "$floor" = floor ] || args+=(-P "floor:floor-musl" -P "floor-musl:exec-only-musl")
  if [ -n "$baseline" ]; then args+=(-P actk-cdi:base-cdi -P actk-disc:base-disc); fi
  echo "-- cycles: create, state, start, wait, delete; $rounds interleaved rounds"
  $rt "$work/cycle-bench" -n "$rounds" -t "$d/cycles.tsv" "${args[@]}" | tee "$d/cycles.txt"

  # Single calls: every shim with true(1) as its runc, the floors built so.
  one=()
  for v in "${shims[@]}"; do
    one+=(-v "$v" -r "$(shim_of "$v")" -b "$d/$v" -o "$d/$v.orig.json" -e "${envs_true[$v]}")
  done
  local tf=(floor exec-only)
  [ "$floor" = floor ] || tf+=(floor-musl exec-only-musl)
  for f in "${tf[@]}"; do
    cp "$d/$f/config.json" "$d/$f.true.json"
    one+=(-v "$f" -r "$work/$f-true" -b "$d/$f" -o "$d/$f.true.json")
  done
  for v in "${shims[@]}"; do one+=(-P "$v:$floor" -P "$v:$exec_only"); done
  one+=(-P "$floor:$exec_only")
  if [ -n "$baseline" ]; then one+=(-P actk-cdi:base-cdi -P actk-disc:base-disc); fi
  echo "-- single calls: create, state, start, delete with true(1) as every shim's runc; $((rounds * 2)) interleaved rounds"
  $rt "$work/cycle-bench" -S 1 -n $((rounds * 2)) -t "$d/calls.tsv" "${one[@]}" | tee "$d/calls.txt"

  echo "-- issue 31 figures ($fx; CPU ms over $floor's call from the single calls, median [p25 p75]; load average $(cut -d' ' -f1-3 /proc/loadavg))"
  out=$d/calls.txt
  local c
  for v in "${shims[@]}"; do
    c=$(cpu_over "$v" "$floor" create)
    case $v in
      actk-cdi) echo "actk-cdi create: $(spread "$v" "$floor" create cpu) ms (target <= 0.5: $(verdict "$c" 0.5))" ;;
      actk-disc) echo "actk-disc create: $(spread "$v" "$floor" create cpu) ms (target <= 1.0: $(verdict "$c" 1.0))" ;;
      *) echo "$v create: $(spread "$v" "$floor" create cpu) ms" ;;
    esac
    echo "$v over $exec_only: state $(spread "$v" "$exec_only" state cpu), start $(spread "$v" "$exec_only" start cpu), delete $(spread "$v" "$exec_only" delete cpu) ms (target: at the floor)"
  done
  # The VM's speed moves every figure above with it: two runs on this project's VM an hour
  # apart read 0.47 and 0.77 ms for the floor's own create and +0.84 and +1.46 for actk-disc's
  # (issue 31). Runs are compared by their paired figures, or at a like floor.
  echo "the machine's speed in this run: $floor's own create $(awk -v v="$floor" '$1 == v && $2 == "create" { split($3, m, "/"); print m[2] }' "$out") ms CPU (median); every figure over it scales with it"
  out=$d/cycles.txt
  echo "per cycle over runc (wall/CPU ratio medians): $(for v in "${shims[@]}" "${floors[@]}"; do awk -v h="$v / runc cycle" 'index($0, h " ") == 1 { printf "%s %s/%s; ", h, $6, $10 }' "$out"; done)"
  if [ "$callgrind" = 1 ]; then
    local ic ib
    ic=$(instructions "$d/cdi-true.toml" "$d/check-actk-cdi" "$d/actk-cdi.orig.json")
    ib=$(instructions "$d/disc-true.toml" "$d/check-actk-disc" "$d/actk-disc.orig.json")
    echo "callgrind, instructions up to the exec: actk-cdi create $ic, actk-disc create $ib"
  fi
}

# Scale: a vendor's synthetic nodes of 8, 64 and 256 devices (fixtures/generate.py --devices).
scale() {
  local vendor=$1 fx env sizes n req m v d caps=()
  [ "$vendor" = nvidia ] && caps=(--capabilities all)
  case $vendor in
    nvidia) fx=nvidia-dgx-h100 env=NVIDIA_VISIBLE_DEVICES sizes="8 64 254" ;;
    amd) fx=amd-mi300x-cpx env=AMD_VISIBLE_DEVICES sizes="8 64 256" ;;
    neuron) fx=aws-trn1-32xlarge env=AWS_NEURON_VISIBLE_DEVICES sizes="8 64 256" ;;
    gaudi) fx=gaudi2 env=HABANA_VISIBLE_DEVICES sizes="8 64 256" ;;
    *) need "no scale fixture for vendor $vendor" ;;
  esac
  d=$run/scale-$vendor
  mkdir -p "$d/nocdi"
  for n in $sizes; do
    python3 "$repo/fixtures/generate.py" --devices "$n" --out "$d/src-$n" "$fx" >/dev/null
    sh "$repo/fixtures/prepare.sh" "$d/src-$n" "$d/root-$n" >/dev/null
    rm -rf "$d/src-$n"
    mkdir -p "$d/cdi-$n"
    "$bin/actk" cdi generate --root "$d/root-$n" --vendor "$vendor" "${caps[@]}" --ldcache-hook "$bin/actk-hook" --output "$d/cdi-$n" >/dev/null 2>&1
    write_config "$d/cdi-$n.toml" "$d/root-$n" "$d/cdi-$n" /bin/true
    write_config "$d/disc-$n.toml" "$d/root-$n" "$d/nocdi" /bin/true
  done
  local eight=0,1,2,3,4,5,6,7
  local extra=()
  [ "$vendor" = nvidia ] && extra=(NVIDIA_DRIVER_CAPABILITIES=all)
  make_bundle "$d/b-8" "$env=$eight" "${extra[@]}"
  make_bundle "$d/b-all" "$env=all" "${extra[@]}"
  cp "$d/b-8/config.json" "$d/b-8.orig.json"
  cp "$d/b-all/config.json" "$d/b-all.orig.json"
  local args=() names=()
  for req in 8 all; do
    for m in cdi disc; do
      for n in $sizes; do
        v=$m-$req-of-$n
        [ "$req" = all ] && v=$m-all-$n
        names+=("$v")
        mkdir -p "$d/$v" && cp "$d/b-$req.orig.json" "$d/$v/config.json"
        args+=(-v "$v" -r "$bin/actk-runtime" -b "$d/$v" -o "$d/b-$req.orig.json" -e "ACTK_CONFIG=$d/$m-$n.toml")
        args+=(-P "$v:$floor")
      done
    done
  done
  mkdir -p "$d/floor" && cp "$d/b-8.orig.json" "$d/floor/config.json"
  args+=(-v "$floor" -r "$work/$floor-true" -b "$d/floor" -o "$d/b-8.orig.json")
  echo
  echo "== scale $vendor ($fx form): $env=$eight and $env=all on nodes of $sizes devices; create only, $rounds interleaved rounds"
  out=$d/out.txt
  $rt "$work/cycle-bench" -C 1 -n "$rounds" -t "$d/samples.tsv" "${args[@]}" | tee "$out"
  echo "-- CPU ms over $floor's create (median [p25 p75]); load average $(cut -d' ' -f1-3 /proc/loadavg)"
  local s=($sizes) c8 c64 c256
  for m in cdi disc; do
    c8=$(cpu_over "$m-8-of-${s[0]}" "$floor" create) c64=$(cpu_over "$m-8-of-${s[1]}" "$floor" create) c256=$(cpu_over "$m-8-of-${s[2]}" "$floor" create)
    echo "$vendor $m, 8 of N: N=${s[0]} $c8, N=${s[1]} $c64, N=${s[2]} $c256; ${s[1]}/${s[0]} $(ratio "$c64" "$c8")x (target <= 1.5: $(verdict "$(ratio "$c64" "$c8")" 1.5)), ${s[2]}/${s[0]} $(ratio "$c256" "$c8")x"
    c8=$(cpu_over "$m-all-${s[0]}" "$floor" create) c64=$(cpu_over "$m-all-${s[1]}" "$floor" create) c256=$(cpu_over "$m-all-${s[2]}" "$floor" create)
    echo "$vendor $m, all N: N=${s[0]} $c8, N=${s[1]} $c64, N=${s[2]} $c256; per added device $(awk -v a="$c8" -v b="$c64" -v n="$(( s[1] - s[0] ))" 'BEGIN { printf "%.1f", (b - a) / n * 1000 }') µs (${s[0]}..${s[1]}), $(awk -v a="$c64" -v b="$c256" -v n="$(( s[2] - s[1] ))" 'BEGIN { printf "%.1f", (b - a) / n * 1000 }') µs (${s[1]}..${s[2]})"
  done
  if [ "$callgrind" = 1 ]; then
    echo "-- callgrind: instructions of one create up to the exec (repeatable on a loaded machine)"
    declare -A ir
    for v in "${names[@]}"; do
      m=${v%%-*} n=${v##*-} req=8
      case $v in *-all-*) req=all ;; esac
      ir[$v]=$(instructions "$d/$m-$n.toml" "$d/$v" "$d/b-$req.orig.json")
    done
    for m in cdi disc; do
      echo "$vendor $m, 8 of N: $(for n in $sizes; do printf 'N=%s %s, ' "$n" "${ir[$m-8-of-$n]}"; done)${s[1]}/${s[0]} $(ratio "${ir[$m-8-of-${s[1]}]}" "${ir[$m-8-of-${s[0]}]}")x, ${s[2]}/${s[0]} $(ratio "${ir[$m-8-of-${s[2]}]}" "${ir[$m-8-of-${s[0]}]}")x"
      echo "$vendor $m, all N: $(for n in $sizes; do printf 'N=%s %s, ' "$n" "${ir[$m-all-$n]}"; done)per added device $(( (ir[$m-all-${s[1]}] - ir[$m-all-${s[0]}]) / (s[1] - s[0]) )) (${s[0]}..${s[1]}), $(( (ir[$m-all-${s[2]}] - ir[$m-all-${s[1]}]) / (s[2] - s[1]) )) (${s[1]}..${s[2]})"
    done
  fi
  rm -rf "$d"
}

# Stages: see the header. The stage names of crates/actk-core/src/bench_stage.rs, in order.
stage_names_cdi="start config parse profiles requests registry plan apply hooks write"
stage_names_disc="start config parse profiles requests registry ldcache devices control inventory plan apply hooks write"
stages() {
  local fx=$1 vendor request d m v prev args names
  case $fx in
    nvidia-dgx-h100) vendor=nvidia request="NVIDIA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 NVIDIA_DRIVER_CAPABILITIES=all" ;;
    amd-mi300x) vendor=amd request=AMD_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 ;;
    *) need "no request known for fixture $fx" ;;
  esac
  d=$run/stages-$fx
  mkdir -p "$d/cdi" "$d/nocdi"
  sh "$repo/fixtures/prepare.sh" "$fx" "$d/root" >/dev/null
  local caps=()
  [ "$vendor" = nvidia ] && caps=(--capabilities all)
  "$bin/actk" cdi generate --root "$d/root" --vendor "$vendor" "${caps[@]}" --ldcache-hook "$bin/actk-hook" --output "$d/cdi" >/dev/null
  write_config "$d/cdi.toml" "$d/root" "$d/cdi" /bin/true
  write_config "$d/disc.toml" "$d/root" "$d/nocdi" /bin/true
  make_bundle "$d/orig" $request
  cp "$d/orig/config.json" "$d/orig.json"
  local peer=()
  if [ -n "$nvidia_rt" ] && [ "$vendor" = nvidia ]; then
    write_nvidia_config "$d/nvidia-true.toml" "$d/cdi" /bin/true
    make_bundle "$d/nvidia-cdi" $request
    peer=(-v nvidia-cdi -r "$nvidia_rt" -b "$d/nvidia-cdi" -o "$d/orig.json" -e "NVIDIA_CTK_CONFIG_FILE_PATH=$d/nvidia-true.toml")
  fi
  for v in "$floor" "$exec_only"; do make_bundle "$d/$v" $request; done
  for m in cdi disc; do
    if [ $m = cdi ]; then names=$stage_names_cdi; else names=$stage_names_disc; fi
    args=()
    for v in $names full; do
      make_bundle "$d/$m-$v" $request
      local e=()
      [ $v = full ] || e=(-e "ACTK_BENCH_STAGE=$v")
      # Every stage ends before the write; the whole create writes.
      cp "$d/orig.json" "$d/$m-$v/config.json"
      env ACTK_CONFIG="$d/$m.toml" ${e[1]:+"${e[1]}"} "$stages_bin" create --bundle "$d/$m-$v" stage-check >/dev/null \
        || need "$fx: $m stage $v: the create failed"
      if [ $v = full ] || [ $v = write ]; then
        ! cmp -s "$d/orig.json" "$d/$m-$v/config.json" || need "$fx: $m stage $v: config.json was not written"
      else
        cmp -s "$d/orig.json" "$d/$m-$v/config.json" || need "$fx: $m stage $v: the create went past the stage (is it built with --features actk-runtime/bench-stages, and does it know the stage $v?)"
      fi
      args+=(-v "$m-$v" -r "$stages_bin" -b "$d/$m-$v" -o "$d/orig.json" -e "ACTK_CONFIG=$d/$m.toml" "${e[@]}")
    done
    args+=("${peer[@]}")
    for v in "$floor" "$exec_only"; do args+=(-v "$v" -r "$work/$v-true" -b "$d/$v"); done
    # A stage ends the process with exit(2), so `start` (the shim up to its own code) is not
    # read against a floor that execs; `full - write` is the exec of the runtime.
    prev=
    for v in $names full; do [ -z "$prev" ] || args+=(-P "$m-$v:$prev"); prev=$m-$v; done
    args+=(-P "$m-full:$floor" -P "$floor:$exec_only")
    echo
    echo "== $fx, $m: create only, true(1) as runc; $rounds interleaved rounds; each line: a stage minus the one before it"
    $rt "$work/cycle-bench" -C 1 -n "$rounds" "${args[@]}" | tee "$d/$m.txt" | grep -E "^($m-[a-z]+|$floor) - .* create "
  done
  rm -rf "$d"
}

stages_bin=
if [ "$mode" = stages ]; then
  stages_bin=${ACTK_BENCH_STAGES_BIN:-}
  if [ -z "$stages_bin" ]; then
    mkdir -p "$work/stages"
    cp "$("$repo/scripts/build-release.sh" --shims-only --features actk-runtime/bench-stages | tail -n 1)/actk-runtime" "$work/stages/actk-runtime"
    stages_bin=$work/stages/actk-runtime
    # The shipped build back in target/<triple>/release.
    "$repo/scripts/build-release.sh" --shims-only >/dev/null
  fi
  [ -x "$stages_bin" ] || need "no stage shim $stages_bin"
fi

bins=("$bin/actk-runtime" "$bin/actk-hook" "$runc" "$work"/floor* "$work"/exec-only*)
[ -z "$stages_bin" ] || bins+=("$stages_bin")
[ -z "$nvidia_rt" ] || bins+=("$nvidia_rt")
[ -z "$baseline" ] || bins+=("$baseline/actk-runtime" "$baseline/actk-hook")
evict "${bins[@]}"
if [ "$mode" = compare ]; then
  for fx in $fixtures; do compare "$fx"; done
elif [ "$mode" = stages ]; then
  for fx in $fixtures; do stages "$fx"; done
else
  for v in $vendors; do scale "$v"; done
fi
echo
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
