#!/usr/bin/env bash
# The DRA driver on the real single-node cluster (issue 11), measured; no pass/fail:
#   driver start to slice  the DRA driver's pod deleted: seconds until its successor has
#                          published a new pool generation (every slice of it) in the API
#                          server, median of STARTS
#   pod start              ROUNDS busybox pods with `limits: {nvidia.com/gpu: 2}` through the
#                          device plugin (cdi-cri) and ROUNDS without devices, interleaved; then
#                          the same with a claim for 2 GPUs (ResourceClaimTemplate, class
#                          actk-nvidia) through the DRA driver. Seconds from `kubectl apply`
#                          until the container started; medians, each path's ratio to its plain
#                          pods, and DRA / device plugin
# A kind is served by the device plugin or the DRA driver, never both, so the two paths run
# one after the other on the same cluster, each with plain pods of its own.
#
# Usage: benches/dra-bench.sh [ROUNDS] [STARTS]     (defaults 10 and 5)
# Needs root and the test cluster's binaries (scripts/k8s/build-kube.sh builds them once).
# Leaves the cluster down at the end (as `make test` does).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
node=$repo/scripts/k8s-node.sh
rounds=${1:-10}
starts=${2:-5}
[ "$(id -u)" = 0 ] || { echo "dra-bench: needs root" >&2; exit 1; }

work=$(mktemp -d /tmp/actk-dra-bench-XXXXXX)
trap '"$node" down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
"$repo/fixtures/prepare.sh" nvidia-dgx-h100 "$work/dgx" >/dev/null
printf 'config:\n  strategies: [cdi-cri]\n' >"$work/dp.yaml"
printf 'devicePlugin:\n  enabled: false\ndra:\n  enabled: true\n  profiles: [nvidia]\n' >"$work/dra.yaml"
"$repo/scripts/k8s/actk-image.sh" >/dev/null

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f\n", b - a }'; }
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
k() { "$node" kubectl "$@"; }

pod() { # NAME MODE(plain|dp|dra)
  local limits="" claims="" rc=""
  case $2 in
    dp) limits="resources: {limits: {nvidia.com/gpu: 2}}" ;;
    dra)
      claims="resourceClaims: [{name: gpus, resourceClaimTemplateName: bench-two-gpus}]"
      rc="resources: {claims: [{name: gpus}]}"
      ;;
  esac
  cat <<POD
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  hostNetwork: true
  automountServiceAccountToken: false
  restartPolicy: Never
  terminationGracePeriodSeconds: 0
  $claims
  containers:
    - name: c
      image: actk.local/busybox:1.35
      imagePullPolicy: Never
      command: ["sleep", "3600"]
      $limits
      $rc
POD
}
start_time() { # NAME MODE
  local t0 t1
  pod "$1" "$2" >"$work/$1.yaml"
  t0=$(now)
  k apply -f "$work/$1.yaml" >/dev/null
  # A watch, not a poll: kubectl returns as soon as the kubelet reports the container started.
  k wait --for=jsonpath='{.status.containerStatuses[0].started}'=true "pod/$1" --timeout=120s >/dev/null
  t1=$(now)
  k delete pod "$1" --grace-period=0 --force --wait=true >/dev/null 2>&1
  secs "$t0" "$t1"
}
rounds_of() { # MODE
  : >"$work/$1"
  : >"$work/plain-$1"
  start_time "warm-$1" "$1" >/dev/null
  for ((i = 0; i < rounds; i++)); do
    start_time "$1-$i" "$1" >>"$work/$1"
    start_time "plain-$1-$i" plain >>"$work/plain-$1"
  done
}

# Device plugin path.
"$node" up --root "$work/dgx" --values "$work/dp.yaml" >/dev/null 2>"$work/up.log" || { cat "$work/up.log" >&2; exit 1; }
rounds_of dp

# DRA path: the chart with the driver instead of the plugin, and the claim template.
"$node" install --root "$work/dgx" --values "$work/dra.yaml" >/dev/null 2>"$work/install.log" || {
  cat "$work/install.log" >&2
  exit 1
}
k apply -f - >/dev/null <<'TEMPLATE'
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: bench-two-gpus}
spec:
  spec:
    devices:
      requests:
        - name: gpus
          exactly: {deviceClassName: actk-nvidia, count: 2}
TEMPLATE
generation() { # the newest complete pool generation of driver actk.dev on this node, or 0
  k get resourceslices -o json | jq '[.items[] | select(.spec.driver == "actk.dev") | .spec.pool]
    | group_by(.generation) | map(select(length == .[0].resourceSliceCount) | .[0].generation) | max // 0'
}
until [ "$(generation)" -gt 0 ]; do sleep 0.2; done
rounds_of dra

# Driver start to slice.
: >"$work/slice"
for ((i = 0; i < starts; i++)); do
  g0=$(generation)
  t0=$(now)
  k -n kube-system delete pod -l app.kubernetes.io/name=actk-dra-driver --wait=false >/dev/null
  until [ "$(generation)" -gt "$g0" ]; do sleep 0.1; done
  t1=$(now)
  secs "$t0" "$t1" >>"$work/slice"
done

dp=$(median <"$work/dp")
pdp=$(median <"$work/plain-dp")
dra=$(median <"$work/dra")
pdra=$(median <"$work/plain-dra")
echo "dra-bench: single-node cluster (kubelet $(k version -o json 2>/dev/null | jq -r .clientVersion.gitVersion), containerd 2.1), DGX H100 fixture, $(nproc) cores"
echo "  driver pod deleted to its successor's pool published, median of $starts: $(median <"$work/slice") s"
echo "  pod start (apply to running), median of $rounds, 2 GPUs:"
echo "    device plugin: ${dp} s (plain ${pdp} s, ratio $(ratio "$dp" "$pdp"))"
echo "    DRA claim:     ${dra} s (plain ${pdra} s, ratio $(ratio "$dra" "$pdra"))"
echo "    DRA / device plugin, each over its plain pods: $(awk -v a="$dra" -v b="$pdra" -v c="$dp" -v d="$pdp" 'BEGIN { printf "%.2f", (a / b) / (c / d) }')"
echo "  machine load average: $(cut -d' ' -f1-3 /proc/loadavg)"
