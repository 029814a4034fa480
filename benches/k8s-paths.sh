#!/usr/bin/env bash
# `benches/k8s-bench.sh paths [ROUNDS]`: pod start by each path that gives a pod its GPUs, on the
# real single-node cluster, interleaved in one run (issue 31). What it measures and prints is
# described in benches/k8s-bench.sh. Leaves the cluster down at the end.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
node=$repo/scripts/k8s-node.sh
rounds=${1:-12}
bin=${ACTK_BIN_DIR:-$repo/target/dist}
need() { echo "k8s-bench paths: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || need "needs root"
[ -x "$bin/actk-nri" ] || need "$bin/actk-nri missing: scripts/build-release.sh"

work=$(mktemp -d /tmp/actk-k8s-paths-XXXXXX)
nri_pid=
stop_nri() {
  if [ -n "$nri_pid" ]; then
    kill "$nri_pid" 2>/dev/null || true
    wait "$nri_pid" 2>/dev/null || true
    nri_pid=
  fi
}
trap 'stop_nri; "$node" down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

"$repo/fixtures/prepare.sh" nvidia-dgx-h100 "$work/dgx" >/dev/null
cat >"$work/values.yaml" <<'VALUES'
config:
  strategies: [cdi-cri]
nodeSetup:
  enabled: true
  policy:
    envRequests: always
VALUES
"$repo/scripts/k8s/actk-image.sh" >/dev/null
"$node" up --root "$work/dgx" --values "$work/values.yaml" >/dev/null 2>"$work/up.log" || { cat "$work/up.log" >&2; exit 1; }
nri_socket=$("$node" env | sed -n 's/^NRI_SOCKET=//p')
cdi_dir=$("$node" env | sed -n 's/^CDI_DIR=//p')
[ -n "$nri_socket" ] && [ -n "$cdi_dir" ] || need "k8s-node.sh env names no NRI_SOCKET or CDI_DIR"
uuids=$(for g in 1b 43; do sed -n 's/^GPU UUID:[[:space:]]*//p' "$work/dgx/proc/driver/nvidia/gpus/0000:$g:00.0/information"; done | paste -sd,)
# actk-nri as the chart runs it, reading the cluster's CDI specs, with env requests trusted.
cat >"$work/nri.toml" <<CONF
root = "$work/dgx"
spec_dirs = ["$cdi_dir"]
[policy]
env_requests = "always"
CONF

start_nri() { # PATH: the path of the pod about to be measured
  [ -z "$nri_pid" ] || return 0
  : >"$work/nri.log"
  ACTK_CONFIG=$work/nri.toml "$bin/actk-nri" --socket "$nri_socket" >>"$work/nri.log" 2>&1 &
  nri_pid=$!
  # Until containerd has synchronized it, not just registered it: containerd holds container
  # creation until then, which took 1.9-2.0 s here after the first start (registered at .19,
  # synchronized at 2 s past), and a long-running plugin pays that once, not per pod.
  local synced=0
  for _ in $(seq 300); do grep -q "synchronized with the runtime" "$work/nri.log" && synced=1 && break; sleep 0.1; done
  [ "$synced" = 1 ] || need "actk-nri was not synchronized by the runtime: $(cat "$work/nri.log")"
  # Then one unmeasured pod of the same path through it: the chart's plugin runs for the node's
  # life, so the pods it costs are served by a warm process. Without this, the first pod after
  # each start paid the plugin's first request (code paged in, first spec-directory read), and
  # the rotation put cdi+nri first after a start in every round and nri in one round of four,
  # which made cdi+nri 1.035x and nri 1.018x of cdi in the first run.
  run_pod warm-nri "$1"
}

path_pod() { # NAME PATH
  local spec rc=""
  case $2 in
    cdi | cdi+nri) spec="resources: {limits: {nvidia.com/gpu: 2}}" ;;
    *) spec="env: [{name: NVIDIA_VISIBLE_DEVICES, value: \"$uuids\"}, {name: NVIDIA_DRIVER_CAPABILITIES, value: all}]" ;;
  esac
  [ "$2" = runtime ] && rc="runtimeClassName: actk"
  cat <<POD
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  hostNetwork: true
  automountServiceAccountToken: false
  restartPolicy: Never
  terminationGracePeriodSeconds: 0
  $rc
  containers:
    - name: c
      image: actk.local/busybox:1.35
      imagePullPolicy: Never
      command: ["sh", "-c", "ls /dev/nvidia0 /dev/nvidia1 >/dev/null && exec sleep 3600"]
      $spec
POD
}

ms_now() { local t=$EPOCHREALTIME; echo $((${t/./} / 1000)); }
# Sets `ms`, not echoed: a call in $(...) ran in a subshell, where start_nri's and stop_nri's
# record of the running actk-nri was lost. Each round then started one more plugin, and
# containerd failed the next pod: plugins "10-actk" and "10-actk" both tried to set an annotation.
# Applies pod NAME of PATH, waits until its container started, deletes it; sets t0 and t1, the
# ms at the apply and at the start.
run_pod() { # NAME PATH
  path_pod "$1" "$2" >"$work/$1.yaml"
  t0=$(ms_now)
  "$node" kubectl apply -f "$work/$1.yaml" >/dev/null
  # A watch, not a poll: kubectl returns as soon as the kubelet reports the container started.
  "$node" kubectl wait --for=jsonpath='{.status.containerStatuses[0].started}'=true "pod/$1" --timeout=120s >/dev/null \
    || need "$2: pod $1 did not start: $("$node" kubectl describe pod "$1" | tail -n 20)"
  t1=$(ms_now)
  "$node" kubectl delete pod "$1" --grace-period=0 --force --wait=true >/dev/null 2>&1
}
start_ms() { # NAME PATH -> ms: ms from apply to the container started
  case $2 in cdi+nri | nri) start_nri "$2" ;; *) stop_nri ;; esac
  run_pod "$1" "$2"
  ms=$((t1 - t0))
}

paths=(cdi cdi+nri nri runtime)
for p in "${paths[@]}"; do start_ms "warm-${p/+/-}" "$p"; done
: >"$work/samples"
for ((r = 0; r < rounds; r++)); do
  for ((j = 0; j < ${#paths[@]}; j++)); do
    p=${paths[$(((j + r) % ${#paths[@]}))]}
    start_ms "p$r-${p/+/-}" "$p"
    echo "$r $p $ms" >>"$work/samples"
  done
done
stop_nri

echo "k8s-bench paths: single-node cluster (containerd 2.1), DGX H100 fixture, 2 GPUs, $rounds interleaved rounds, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
awk -v paths="${paths[*]}" '
function q(a, n, p,   i, j, t, pos, lo) {
  for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
  pos = p * (n - 1) + 1; lo = int(pos)
  return (lo < n) ? a[lo] + (pos - lo) * (a[lo + 1] - a[lo]) : a[lo]
}
{ v[$2, $1] = $3; if ($1 + 1 > rounds) rounds = $1 + 1 }
END {
  np = split(paths, ps, " ")
  for (k = 1; k <= np; k++) { for (r = 0; r < rounds; r++) x[r + 1] = v[ps[k], r]; m[ps[k]] = q(x, rounds, 0.5) }
  printf "%-8s %9s %9s   %s\n", "path", "median s", "vs cdi", "paired difference to cdi, ms: median [p25 p75]"
  for (k = 1; k <= np; k++) {
    p = ps[k]
    for (r = 0; r < rounds; r++) d[r + 1] = v[p, r] - v["cdi", r]
    t = (p == "cdi+nri" || p == "nri") ? sprintf(" (target <= 1.02x: %s)", (m[p] / m["cdi"] <= 1.02) ? "met" : "NOT met") : ""
    printf "%-8s %9.3f %8.3fx   %+.0f [%+.0f %+.0f]%s\n", p, m[p] / 1000, m[p] / m["cdi"], q(d, rounds, 0.5), q(d, rounds, 0.25), q(d, rounds, 0.75), t
  }
}' "$work/samples"
