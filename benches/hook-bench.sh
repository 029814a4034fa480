#!/usr/bin/env bash
# Cost of actk-hook on the Docker --gpus path: `docker run --gpus all` vs `docker run` on the
# same image, interleaved in one run (so drift of the machine hits both alike), printing the
# median and mean wall times and their ratio/difference. Target (issue 4): <= 5 ms added per container.
#
# Usage: benches/hook-bench.sh [ROUNDS] [IMAGE]     (default 30 rounds, actk-busybox:latest)
# Needs: root, dockerd started by scripts/start-dockerd.sh (hook on its PATH), a host root in
# /etc/actk/config.toml (`root = ...`; on a machine without GPUs, a prepared fixture:
# `sh fixtures/prepare.sh nvidia-dgx-h100 /tmp/dgx` then `root = "/tmp/dgx"`). The script
# installs such a config itself when ACTK_BENCH_FIXTURE=NAME is set, and restores the old one;
# with ACTK_BENCH_CDI=1 it also generates the CDI spec (`actk cdi generate`) the hook then reads
# instead of discovering the host on every container.
set -euo pipefail

rounds=${1:-30}
image=${2:-actk-busybox:latest}
repo=$(cd "$(dirname "$0")/.." && pwd)

docker image inspect "$image" >/dev/null 2>&1 || { echo "hook-bench: image $image not found (the e2e tests import actk-busybox)" >&2; exit 1; }

restore=
if [ -n "${ACTK_BENCH_FIXTURE:-}" ]; then
  # The e2e tests take this lock around their own /etc/actk/config.toml.
  exec 9>/run/lock/actk-e2e-global-config.lock
  flock 9
  fx=$(mktemp -d /tmp/actk-bench-fixture-XXXXXX)
  sh "$repo/fixtures/prepare.sh" "$ACTK_BENCH_FIXTURE" "$fx/root" >/dev/null
  mkdir -p /etc/actk
  if [ -e /etc/actk/config.toml ]; then cp -p /etc/actk/config.toml "$fx/config.toml.saved"; fi
  restore=1
  specs=[]
  if [ -n "${ACTK_BENCH_CDI:-}" ]; then
    # With a generated CDI spec the hook takes the edits from it instead of discovering the host.
    actk=${ACTK_BIN:-$repo/target/debug/actk}
    "$actk" cdi generate --root "$fx/root" -o "$fx/cdi" >/dev/null
    specs="[\"$fx/cdi\"]"
  fi
  printf 'root = "%s"\nspec_dirs = %s\n' "$fx/root" "$specs" > /etc/actk/config.toml
fi
cleanup() {
  if [ -n "$restore" ]; then
    if [ -e "$fx/config.toml.saved" ]; then cp -p "$fx/config.toml.saved" /etc/actk/config.toml; else rm -f /etc/actk/config.toml; fi
    rm -rf "$fx"
  fi
}
trap cleanup EXIT

# Warm up both paths (image layers, page cache).
docker run --rm "$image" true >/dev/null
docker run --rm --gpus all "$image" true >/dev/null

now_ns() { date +%s%N; }
plain=() gpus=()
for _ in $(seq 1 "$rounds"); do
  t0=$(now_ns); docker run --rm "$image" true >/dev/null; t1=$(now_ns)
  docker run --rm --gpus all "$image" true >/dev/null; t2=$(now_ns)
  plain+=($(( (t1 - t0) / 1000 ))); gpus+=($(( (t2 - t1) / 1000 )))
done

stats() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1; s+=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.1f %.1f", m/1000, s/NR/1000}'; }
read -r pm pa <<<"$(stats "${plain[@]}")"
read -r gm ga <<<"$(stats "${gpus[@]}")"
echo "rounds: $rounds (interleaved), image: $image"
printf 'docker run               median %8.1f ms  mean %8.1f ms\n' "$pm" "$pa"
printf 'docker run --gpus all    median %8.1f ms  mean %8.1f ms\n' "$gm" "$ga"
awk -v pm="$pm" -v gm="$gm" -v pa="$pa" -v ga="$ga" 'BEGIN {
  printf "ratio (median) %.3fx   added per container: median %+.1f ms, mean %+.1f ms (target <= 5 ms)\n", gm/pm, gm-pm, ga-pa }'
echo "(the difference includes Docker's own --gpus device-request handling, not only actk-hook)"

# The hook alone: `runc run` of one busybox bundle with actk-hook as its prestart hook vs the
# same bundle without the hook, interleaved. ACTK_HOOK picks the binary (default: release build
# when present, else debug).
hook=${ACTK_HOOK:-$repo/target/release/actk-hook}
[ -x "$hook" ] || hook=$repo/target/debug/actk-hook
work=$(mktemp -d /tmp/actk-bench-bundle-XXXXXX)
mkdir -p "$work/plain/rootfs/bin"
cp /bin/busybox "$work/plain/rootfs/bin/busybox"
ln -s busybox "$work/plain/rootfs/bin/true"
runc spec --bundle "$work/plain"
cfg=${ACTK_CONFIG:-/etc/actk/config.toml}
python3 - "$work/plain/config.json" "$hook" "$cfg" <<'PY'
import json, sys, copy
p, hook, cfg = sys.argv[1:]
c = json.load(open(p))
c["process"].update(terminal=False, args=["/bin/true"])
c["process"]["env"].append("NVIDIA_VISIBLE_DEVICES=all")
c["root"]["readonly"] = False
json.dump(c, open(p, "w"))
h = copy.deepcopy(c)
h["hooks"] = {"prestart": [{"path": hook, "args": ["nvidia-container-runtime-hook", "prestart"], "env": ["ACTK_CONFIG=" + cfg]}]}
open(p + ".hooked", "w").write(json.dumps(h))
PY
mkdir -p "$work/hooked"
cp -a "$work/plain/rootfs" "$work/hooked/rootfs"
mv "$work/plain/config.json.hooked" "$work/hooked/config.json"
plain=() hooked=()
for i in $(seq 1 "$rounds"); do
  t0=$(now_ns); runc run --bundle "$work/plain" "actk-bench-p$$-$i" </dev/null >/dev/null; t1=$(now_ns)
  runc run --bundle "$work/hooked" "actk-bench-h$$-$i" </dev/null >/dev/null; t2=$(now_ns)
  plain+=($(( (t1 - t0) / 1000 ))); hooked+=($(( (t2 - t1) / 1000 )))
done
rm -rf "$work"
read -r pm pa <<<"$(stats "${plain[@]}")"
read -r hm ha <<<"$(stats "${hooked[@]}")"
echo "hook: $hook"
printf 'runc run                 median %8.1f ms  mean %8.1f ms\n' "$pm" "$pa"
printf 'runc run + actk-hook     median %8.1f ms  mean %8.1f ms\n' "$hm" "$ha"
awk -v pm="$pm" -v hm="$hm" 'BEGIN { printf "hook alone: %+.1f ms per container (median)\n", hm-pm }'
