#!/usr/bin/env bash
# Cost of actk-runtime (issue 3, item 7): create/start/delete cycles of a busybox bundle that
# asks for 8 GPUs (8 GPU nodes + control nodes + driver library mounts) on the DGX H100 fixture,
# interleaved in one run so that drift of the machine hits every variant alike:
#   shim    actk-runtime -> runc on the bundle (plans and applies the edits on every create)
#   edited  plain runc on the same bundle with the same edits already applied
#   plain   plain runc on the bundle with no devices at all
# Prints the median wall time and the CPU time (user+sys of the runtime processes) per cycle and
# the ratios shim/edited (actk's own cost; target <= 1.02) and edited/plain (the edits' cost for
# runc, for information). No pass/fail: this is a measurement, not a test.
#
# Usage: benches/runtime-bench.sh [ROUNDS]      (default 40)
# Needs: root, runc, /bin/busybox (busybox-static), and release binaries
# (`cargo build --release -p actk-runtime -p actk-hook`; ACTK_BIN_DIR overrides target/release).
# With ACTK_BENCH_CDI=1 the devices come from a CDI spec (`actk cdi generate`) instead of
# discovery on every create (then `actk` must be built too).
set -euo pipefail

rounds=${1:-40}
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=${ACTK_BIN_DIR:-$repo/target/release}
shim=$bin/actk-runtime

[ "$(id -u)" = 0 ] || { echo "runtime-bench: needs root (runc, mknod)" >&2; exit 1; }
[ -x "$shim" ] || { echo "runtime-bench: $shim not built: cargo build --release -p actk-runtime -p actk-hook" >&2; exit 1; }
command -v runc >/dev/null || { echo "runtime-bench: runc not on PATH" >&2; exit 1; }
[ -x /bin/busybox ] || { echo "runtime-bench: /bin/busybox missing (apt-get install busybox-static)" >&2; exit 1; }

work=$(mktemp -d /tmp/actk-runtime-bench-XXXXXX)
cleanup() {
  for v in shim edited plain; do runc delete --force "actk-bench-$v-$$" >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
trap cleanup EXIT

sh "$repo/fixtures/prepare.sh" nvidia-dgx-h100 "$work/root" >/dev/null
mkdir -p "$work/cdi" "$work/hooks.d"
cat >"$work/config.toml" <<EOF
runtimes = ["runc"]
root = "$work/root"
spec_dirs = ["$work/cdi"]
hooks_dirs = ["$work/hooks.d"]
profiles_dir = "$work/profiles.d"
EOF
export ACTK_CONFIG=$work/config.toml
if [ "${ACTK_BENCH_CDI:-}" = 1 ]; then
  "$bin/actk" cdi generate --root "$work/root" --vendor nvidia --output "$work/cdi" >/dev/null
fi

# One bundle per variant, each with its own copy of a static busybox rootfs.
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
make_bundle "$work/shim" NVIDIA_VISIBLE_DEVICES=all
make_bundle "$work/plain"
make_bundle "$work/edited" NVIDIA_VISIBLE_DEVICES=all
# The edited bundle: what the shim writes, made once by a shim whose low-level runtime is true(1).
sed 's|^runtimes = .*|runtimes = ["/bin/true"]|' "$work/config.toml" >"$work/config-edit.toml"
ACTK_CONFIG=$work/config-edit.toml "$shim" create --bundle "$work/edited" edit-once
# The shim must find the request again on every create: give it a fresh copy each cycle.
cp "$work/shim/config.json" "$work/shim-config.json.orig"
devices=$(jq '.linux.devices | length' "$work/edited/config.json")
mounts=$(( $(jq '.mounts | length' "$work/edited/config.json") - $(jq '.mounts | length' "$work/plain/config.json") ))
echo "bundle asks for 8 GPUs: $devices device nodes, $mounts library/tool mounts added; $rounds interleaved rounds"

cycle() { # RUNTIME BUNDLE ID
  "$1" create --bundle "$2" "$3" >/dev/null
  "$1" start "$3"
  "$1" delete --force "$3"
}

now_ns() { date +%s%N; }
# CPU time of the finished children of process $1 (cutime + cstime, in clock ticks).
child_ticks() { awk '{print $16 + $17}' "/proc/$1/stat"; }

declare -A wall cpu
for v in shim edited plain; do wall[$v]=""; cpu[$v]=""; done
for ((i = 0; i < rounds; i++)); do
  for v in shim edited plain; do
    [ "$v" = shim ] && cp "$work/shim-config.json.orig" "$work/shim/config.json"
    rt=runc; [ "$v" = shim ] && rt=$shim
    # A subshell, so that its finished children's CPU time is its own.
    read -r w c < <(
      me=$BASHPID
      t0=$(now_ns); c0=$(child_ticks "$me")
      cycle "$rt" "$work/$v" "actk-bench-$v-$$"
      t1=$(now_ns); c1=$(child_ticks "$me")
      echo $(( (t1 - t0) / 1000 )) $(( c1 - c0 ))
    )
    wall[$v]+="$w "; cpu[$v]+="$c "
  done
done

hz=$(getconf CLK_TCK)
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
sum() { tr ' ' '\n' | awk '{s+=$1} END {print s+0}'; }
for v in shim edited plain; do
  m=$(echo "${wall[$v]}" | median)
  c=$(echo "${cpu[$v]}" | sum)
  printf '%-7s median wall %8.2f ms/cycle   cpu %8.2f ms/cycle\n' "$v" "$(echo "$m / 1000" | bc -l)" "$(echo "$c * 1000 / $hz / $rounds" | bc -l)"
  declare "med_$v=$m" "cpu_$v=$c"
done
ratio() { echo "scale=3; $1 / $2" | bc -l; }
echo "shim/edited (actk-runtime's own cost, target <= 1.02): wall $(ratio "$med_shim" "$med_edited")x, cpu $(ratio "$cpu_shim" "$cpu_edited")x"
echo "edited/plain (the edits' cost for runc, for information): wall $(ratio "$med_edited" "$med_plain")x, cpu $(ratio "$cpu_edited" "$cpu_plain")x"
