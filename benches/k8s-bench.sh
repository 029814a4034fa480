#!/usr/bin/env bash
# The real single-node cluster (issue 9), measured; no pass/fail, this is a measurement:
#   up, cold     `scripts/k8s-node.sh up` after `down --purge`: no cluster state, no images, no
#                certificates; with --cold-build also no Kubernetes binaries and empty Go module
#                and build caches (a fresh machine: the Kubernetes build is part of the figure)
#   up, cached   `down`, then `up` again: binaries, certificates and image tars reused
#   pod start    ROUNDS busybox pods with `limits: {nvidia.com/gpu: 2}` and ROUNDS without
#                devices, interleaved (so drift of the machine hits both alike): seconds from
#                `kubectl apply` until `kubectl wait` sees the container started; medians and
#                their ratio (the 2-GPU pod gets 2 GPU nodes, the control
#                nodes and the DGX fixture's 53 driver file mounts from the CDI spec)
# Both `up` figures end when the node's allocatable shows the DGX fixture's 8 GPUs.
#
# Usage: benches/k8s-bench.sh [--cold-build] [ROUNDS]     (ROUNDS default 10)
#
#        benches/k8s-bench.sh paths [ROUNDS]                 (ROUNDS default 12)
# Pod start by each path that gives a pod its GPUs (issue 31), interleaved in one run on the
# same cluster, the order rotating each round; 2 GPUs of the DGX fixture, all capabilities:
#   cdi         `limits: {nvidia.com/gpu: 2}`, the device plugin's cdi-cri strategy: containerd
#               applies the CDI spec itself; no NRI plugin attached (the reference)
#   cdi+nri     the same pod with actk-nri attached to containerd's NRI socket (it sees the pod
#               and finds nothing to serve: what attaching the plugin costs every other pod)
#   nri         NVIDIA_VISIBLE_DEVICES=<the 2 GPUs' UUIDs>, default runtime: actk-nri serves it
#   runtime     the same env, `runtimeClassName: actk`: actk-runtime (node setup) serves it
# The env pods ask without the device plugin, so the node's trust policy takes env requests
# (envRequests: always, a node whose pod authors are trusted: the bench's own actk-nri config
# and nodeSetup.policy); they skip the kubelet's Allocate call, one local gRPC call. actk-nri
# runs on the node as a process (target/dist/actk-nri, the image's binary), started before a
# cdi+nri or nri pod and stopped before a cdi or runtime pod, outside the measured time, and
# serves one unmeasured pod of the same path after each start (warm, as the chart's plugin). Every
# container checks that it sees both GPU nodes (it never starts otherwise).
# Prints median seconds from `kubectl apply` to the container started (a watch), each path's
# median over cdi's and the paired per-round differences to cdi (median, p25..p75, ms).
# Target: cdi+nri and nri within 2% of cdi.
#
#        benches/k8s-bench.sh dra [ROUNDS] [STARTS]          (defaults 12 and 5)
# The DRA driver against the device plugin on one node (issue 26), in one interleaved run:
# pod start of a 2-GPU claim and of an unchanged `limits: {nvidia.com/gpu: 2}` pod served by
# DRA (1.36+) as ratios to the same `limits:` pod served by the device plugin, the driver's
# NodePrepareResources p50/p99, and driver start to slice; described in benches/dra-bench.sh.
# On the version ACTK_KUBE_VERSION names (v1.34.4, v1.37.2).
#
#        benches/k8s-bench.sh sharing [ROUNDS] [PODS]        (defaults 3 and 64)
# 64 pods holding an eighth of a GPU each (issue 27): claims for an eighth of a GPU's memory
# (DRA consumable capacity) against the device plugin's time-slicing replicas, seconds until
# all run and their ratio; described in benches/sharing-bench.sh.
#
# Needs root; the first run on a machine builds Kubernetes (scripts/k8s/build-kube.sh).
# Leaves the cluster down at the end (as `make test` does).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
node=$repo/scripts/k8s-node.sh
if [ "${1:-}" = paths ]; then
  exec "$repo/benches/k8s-paths.sh" "${@:2}"
fi
if [ "${1:-}" = dra ]; then
  exec "$repo/benches/dra-bench.sh" "${@:2}"
fi
if [ "${1:-}" = sharing ]; then
  exec "$repo/benches/sharing-bench.sh" "${@:2}"
fi
cold_build=0
[ "${1:-}" = --cold-build ] && { cold_build=1; shift; }
rounds=${1:-10}
[ "$(id -u)" = 0 ] || { echo "k8s-bench: needs root" >&2; exit 1; }

work=$(mktemp -d /tmp/actk-k8s-bench-XXXXXX)
trap '"$node" down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
"$repo/fixtures/prepare.sh" nvidia-dgx-h100 "$work/dgx" >/dev/null
printf 'config:\n  strategies: [cdi-cri]\n' >"$work/values.yaml"
# The actk image is built before the clock starts: it is actk's release build, not the cluster's.
"$repo/scripts/k8s/actk-image.sh" >/dev/null

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f\n", b - a }'; }

up() {
  local t0 t1
  t0=$(now)
  "$node" up --root "$work/dgx" --values "$work/values.yaml" >/dev/null 2>"$work/up.log" || { cat "$work/up.log" >&2; exit 1; }
  t1=$(now)
  secs "$t0" "$t1"
}

"$node" down --purge >/dev/null 2>&1 || true
if [ $cold_build = 1 ]; then
  export ACTK_KUBE_CACHE=$work/kube-cache GOMODCACHE=$work/gomod GOCACHE=$work/gocache
fi
cold=$(up)
build_note=""
if [ $cold_build = 1 ]; then
  build_note=" (Kubernetes built: $(cat "$work"/kube-cache/*/complete))"
fi
"$node" down >/dev/null 2>&1
cached=$(up)

# pod start: apply, then poll until the container runs.
pod() { # NAME GPUS
  local limits=""
  [ "$2" -gt 0 ] && limits="resources: {limits: {nvidia.com/gpu: $2}}"
  cat <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  hostNetwork: true
  automountServiceAccountToken: false
  restartPolicy: Never
  terminationGracePeriodSeconds: 0
  containers:
    - name: c
      image: actk.local/busybox:1.35
      imagePullPolicy: Never
      command: ["sleep", "3600"]
      $limits
EOF
}
start_time() { # NAME GPUS
  local t0 t1
  pod "$1" "$2" >"$work/$1.yaml"
  t0=$(now)
  "$node" kubectl apply -f "$work/$1.yaml" >/dev/null
  # A watch, not a poll: kubectl returns as soon as the kubelet reports the container started.
  "$node" kubectl wait --for=jsonpath='{.status.containerStatuses[0].started}'=true "pod/$1" --timeout=120s >/dev/null
  t1=$(now)
  "$node" kubectl delete pod "$1" --grace-period=0 --force --wait=true >/dev/null 2>&1
  secs "$t0" "$t1"
}
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
: >"$work/gpu" && : >"$work/plain"
start_time warm-up 2 >/dev/null
for ((i = 0; i < rounds; i++)); do
  start_time "gpu-$i" 2 >>"$work/gpu"
  start_time "plain-$i" 0 >>"$work/plain"
done
g=$(median <"$work/gpu")
p=$(median <"$work/plain")

echo "k8s-bench: single-node cluster (kubelet $("$node" kubectl version -o json 2>/dev/null | jq -r .clientVersion.gitVersion), containerd 2.1), DGX H100 fixture, $(nproc) cores"
echo "  up to allocatable, cold:   ${cold} s$build_note"
echo "  up to allocatable, cached: ${cached} s"
echo "  pod start (apply to running), median of $rounds: 2 GPUs ${g} s, no devices ${p} s, ratio $(awk -v g="$g" -v p="$p" 'BEGIN { printf "%.2f", g / p }')"
echo "  machine load average: $(cut -d' ' -f1-3 /proc/loadavg)"
