#!/usr/bin/env bash
# Container start through containerd 2.1's CRI with 8 GPUs, by every path actk offers (issue 14),
# interleaved in one run:
#   none        a container without devices                              (containerd A)
#   cdi-cri     8 CDI names in the CRI CDIDevices field: containerd applies the specs
#               `actk cdi generate` wrote (what the device plugin's cdi-cri strategy does) (A)
#   runtime     NVIDIA_VISIBLE_DEVICES=0..7 through RuntimeClass actk (actk-runtime as runc) (A)
#   nri         NVIDIA_VISIBLE_DEVICES=0..7 answered by the actk NRI plugin               (B)
# A and B are two containerd 2.1 instances on their own sockets (A has no NRI plugin attached,
# so the first three pay nothing for it); each variant has its own pod sandbox, made once.
# Per round and variant: `crictl create`, `crictl start`, wait for the exit, `crictl rm`. Prints
# the median wall time of create, start and create+start+exit (to the exit time containerd
# recorded) per variant, their ratios to
# cdi-cri and to none, and the paired per-round difference nri - cdi-cri (target: nri <= 1.01x of
# cdi-cri). crictl's own start-up is in every figure alike. No pass/fail: a measurement.
#
# Usage: benches/cri-bench.sh [ROUNDS]      (default 100)
# Needs: root, forky's containerd (scripts/k8s/fetch-forky.sh), crictl (scripts/fetch-crictl.sh),
# the images of scripts/k8s/base-images.sh, and the release binaries (scripts/build-release.sh ->
# target/dist; ACTK_BIN_DIR overrides).
set -euo pipefail

rounds=${1:-100}
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=${ACTK_BIN_DIR:-$repo/target/dist}
need() { echo "cri-bench: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || need "needs root"
for b in actk actk-runtime actk-hook actk-nri; do [ -x "$bin/$b" ] || need "$bin/$b missing: scripts/build-release.sh"; done
forky=$("$repo/scripts/k8s/fetch-forky.sh" 2>/dev/null | tail -n 1)/root
crictl=$("$repo/scripts/fetch-crictl.sh" | tail -n 1)
runc=$(command -v runc) || need "runc not on PATH"
work=$(mktemp -d /tmp/actk-cri-bench-XXXXXX)
pids=()
cleanup() {
  for s in a b; do
    [ -S "$work/$s/c.sock" ] || continue
    for p in $("$crictl" -r "unix://$work/$s/c.sock" pods -q 2>/dev/null); do
      "$crictl" -r "unix://$work/$s/c.sock" stopp "$p" >/dev/null 2>&1 || true
      "$crictl" -r "unix://$work/$s/c.sock" rmp -f "$p" >/dev/null 2>&1 || true
    done
  done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  { grep -o " $work[^ ]*" /proc/self/mounts || true; } | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

sh "$repo/fixtures/prepare.sh" nvidia-dgx-h100 "$work/root" >/dev/null
mkdir -p "$work/cdi" "$work/hooks.d" "$work/profiles.d"
"$bin/actk" cdi generate --root "$work/root" --vendor nvidia --ldcache-hook "$bin/actk-hook" --output "$work/cdi" >/dev/null
cat >"$work/actk.toml" <<EOF
runtimes = ["$runc"]
root = "$work/root"
spec_dirs = ["$work/cdi"]
hooks_dirs = ["$work/hooks.d"]
profiles_dir = "$work/profiles.d"
hook_path = "$bin/actk-hook"
EOF
# RuntimeClass actk as `actk node setup` installs it: the runtime with its actk.toml beside it
# (containerd's runc shim runs it with containerd's environment; no wrapper).
mkdir -p "$work/install"
cp "$bin/actk-runtime" "$bin/actk-hook" "$work/install/"
cp "$work/actk.toml" "$work/install/actk.toml"
images=$("$repo/scripts/k8s/base-images.sh" "$repo/target/actk-e2e/images")
pause_ref=$(awk '/pause/ {print $1}' <<<"$images") pause_tar=$(awk '/pause/ {print $2}' <<<"$images")
busybox_ref=$(awk '/busybox/ {print $1}' <<<"$images") busybox_tar=$(awk '/busybox/ {print $2}' <<<"$images")

start_containerd() { # NAME
  local d=$work/$1
  mkdir -p "$d/cni" "$d/opt" "$d/nri-plugins" "$d/nri-conf"
  echo '{"cniVersion": "1.0.0", "name": "bench", "plugins": [{"type": "loopback"}]}' >"$d/cni/10-loopback.conflist"
  cat >"$d/config.toml" <<EOF
version = 3
root = "$d/root"
state = "$d/state"
[grpc]
  address = "$d/c.sock"
[ttrpc]
  address = "$d/c.sock.ttrpc"
[debug]
  address = "$d/debug.sock"
[plugins.'io.containerd.internal.v1.opt']
  path = "$d/opt"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$pause_ref"
[plugins.'io.containerd.cri.v1.runtime']
  # Root here lacks CAP_SYS_RESOURCE: runc cannot lower oom_score_adj below its own.
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = ["$work/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['/usr/lib/cni']
    conf_dir = "$d/cni"
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = 'io.containerd.runc.v2'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = "$runc"
      SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.actk]
    runtime_type = 'io.containerd.runc.v2'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.actk.options]
      BinaryName = "$work/install/actk-runtime"
      SystemdCgroup = false
[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = "$d/nri.sock"
  plugin_path = "$d/nri-plugins"
  plugin_config_path = "$d/nri-conf"
EOF
  PATH=$forky/usr/bin:$PATH "$forky/usr/bin/containerd" --config "$d/config.toml" >"$d/log" 2>&1 &
  pids+=($!)
  for _ in $(seq 600); do "$crictl" -r "unix://$d/c.sock" info >/dev/null 2>&1 && break; sleep 0.1; done
  for t in "$pause_tar" "$busybox_tar"; do
    "$forky/usr/bin/ctr" --address "$d/c.sock" -n k8s.io images import --local "$t" >/dev/null
  done
}
start_containerd a
start_containerd b
ACTK_CONFIG=$work/actk.toml "$bin/actk-nri" --socket "$work/b/nri.sock" >"$work/nri.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do grep -q "registered with NRI" "$work/nri.log" && break; sleep 0.1; done
grep -q "registered with NRI" "$work/nri.log" || need "actk-nri did not register: $(cat "$work/nri.log")"

# crictl looks for /etc/crictl.yaml and warns on every call without one: give it its own.
echo "timeout: 60" >"$work/crictl.yaml"
export CRI_CONFIG_FILE=$work/crictl.yaml
cri() { local s=$1; shift; "$crictl" -r "unix://$work/$s/c.sock" -i "unix://$work/$s/c.sock" --timeout 60s "$@"; }
gpus=0,1,2,3,4,5,6,7
cdi_devices='[{"name":"nvidia.com/gpu=0"},{"name":"nvidia.com/gpu=1"},{"name":"nvidia.com/gpu=2"},{"name":"nvidia.com/gpu=3"},{"name":"nvidia.com/gpu=4"},{"name":"nvidia.com/gpu=5"},{"name":"nvidia.com/gpu=6"},{"name":"nvidia.com/gpu=7"}]'
variants=(none cdi-cri runtime nri)
declare -A sock pod cfg handler
for v in "${variants[@]}"; do
  case $v in
    nri) sock[$v]=b ;;
    *) sock[$v]=a ;;
  esac
  handler[$v]=; [ "$v" = runtime ] && handler[$v]="--runtime actk"
  echo "{\"metadata\": {\"name\": \"bench-$v\", \"namespace\": \"default\", \"uid\": \"bench-$v-$$\"}, \"log_directory\": \"$work/logs/$v\", \"linux\": {\"security_context\": {\"namespace_options\": {\"network\": 2}}}}" >"$work/pod-$v.json"
  case $v in
    none) extra='' ;;
    cdi-cri) extra=", \"CDI_devices\": $cdi_devices" ;;
    *) extra=", \"envs\": [{\"key\": \"NVIDIA_VISIBLE_DEVICES\", \"value\": \"$gpus\"}, {\"key\": \"NVIDIA_DRIVER_CAPABILITIES\", \"value\": \"all\"}]" ;;
  esac
  echo "{\"metadata\": {\"name\": \"c\"}, \"image\": {\"image\": \"$busybox_ref\"}, \"command\": [\"true\"], \"log_path\": \"c.log\", \"linux\": {}$extra}" >"$work/ctr-$v.json"
  # shellcheck disable=SC2086
  pod[$v]=$(cri "${sock[$v]}" runp ${handler[$v]} "$work/pod-$v.json")
done

now_us() { local t=$EPOCHREALTIME; echo $(( ${t/./} )); }
cycle() { # VARIANT -> "create_us start_us total_us"
  local v=$1 s=${sock[$1]} id t0 t1 t2
  t0=$(now_us)
  id=$(cri "$s" create "${pod[$v]}" "$work/ctr-$v.json" "$work/pod-$v.json")
  t1=$(now_us)
  cri "$s" start "$id" >/dev/null
  t2=$(now_us)
  until [ "$(cri "$s" inspect -o go-template --template '{{.status.state}}' "$id")" = CONTAINER_EXITED ]; do sleep 0.005; done
  # The exit as containerd recorded it (finishedAt, ns), not when this loop saw it: each crictl
  # call takes tens of ms, which made create..exit as coarse as the polling.
  local code fin t3
  read -r code fin < <(cri "$s" inspect -o go-template --template '{{.status.exitCode}} {{.status.finishedAt}}' "$id")
  [ "$code" = 0 ] || need "$v: container exited with $code"
  t3=$(date -d "$fin" +%s%6N)
  cri "$s" rm "$id" >/dev/null
  echo "$((t1 - t0)) $((t2 - t1)) $((t3 - t0))"
}
for v in "${variants[@]}"; do cycle "$v" >/dev/null; done # warm-up, and each path works
declare -A samples
for ((r = 0; r < rounds; r++)); do
  for ((j = 0; j < ${#variants[@]}; j++)); do
    v=${variants[$(( (j + r) % ${#variants[@]} ))]}
    samples[$v]+="$r $(cycle "$v")"$'\n'
  done
done

echo "containerd 2.1 CRI, 8 GPUs (12 device nodes, 60 mounts), $rounds interleaved rounds; median ms (crictl's own start-up included)"
for v in "${variants[@]}"; do printf '%s' "${samples[$v]}" >"$work/s-$v"; done
awk -v variants="${variants[*]}" -v dir="$work" '
function median(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t } return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
BEGIN {
  nv = split(variants, vs, " ")
  for (k = 1; k <= nv; k++) {
    v = vs[k]; n = 0
    while ((getline line < (dir "/s-" v)) > 0) { split(line, f, " "); n++; c[v, n] = f[2]; s[v, n] = f[3]; t[v, n] = f[4]; r[v, f[1]] = f[4] }
    rounds = n
    for (i = 1; i <= n; i++) { a1[i] = c[v, i]; a2[i] = s[v, i]; a3[i] = t[v, i] }
    mc[v] = median(a1, n) / 1000; ms[v] = median(a2, n) / 1000; mt[v] = median(a3, n) / 1000
  }
  printf "%-8s %9s %9s %16s %12s %12s\n", "variant", "create", "start", "create..exit", "vs cdi-cri", "vs none"
  for (k = 1; k <= nv; k++) { v = vs[k]; printf "%-8s %9.2f %9.2f %16.2f %11.3fx %11.3fx\n", v, mc[v], ms[v], mt[v], mt[v] / mt["cdi-cri"], mt[v] / mt["none"] }
  for (i = 0; i < rounds; i++) d[i + 1] = r["nri", i] - r["cdi-cri", i]
  printf "nri / cdi-cri (create..exit): %.3fx (target <= 1.01); paired per-round difference nri - cdi-cri: %+.2f ms\n", mt["nri"] / mt["cdi-cri"], median(d, rounds) / 1000
  printf "create call alone: nri / cdi-cri %.3fx, runtime / cdi-cri %.3fx\n", mc["nri"] / mc["cdi-cri"], mc["runtime"] / mc["cdi-cri"]
}'
