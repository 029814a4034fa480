#!/usr/bin/env bash
# Sharing GPUs between pods on the real single-node cluster (issue 27), measured; no pass/fail.
# Run as `benches/k8s-bench.sh sharing [ROUNDS] [PODS]` (defaults 3 and 64), on the Kubernetes
# version ACTK_KUBE_VERSION names (the cluster's default otherwise; before 1.36 the cluster is
# started with DRAConsumableCapacity=true). On one DGX H100 fixture node (8 GPUs), PODS pods
# that each hold an eighth of a GPU:
#   dra  a claim for an eighth of a GPU's published `memory` (ResourceClaimTemplate, class
#        actk-nvidia, capacity.requests.memory: the GPU's memory / 8, rounded down to MiB):
#        KEP-5075 consumable capacity, 8 claims on each GPU. Pod i's template names GPU i % 8
#        (CEL on `index`): Kubernetes 1.34's allocator does not go on to the next device once a
#        matching one is partly allocated (kubernetes/kubernetes#133705, fixed by #133706 in
#        1.35), so claims that could take any GPU would all wait after the first eight. Even
#        pinned, 1.34.4 places only 7 eighths on GPUs 1-7 (8 on GPU 0): the same allocator
#        defect counts another device's consumption; run PODS=56 there (7 a GPU), 64 on 1.35+
#   dp   `limits: {nvidia.com/gpu: 1}` served by the device plugin's time-slicing, 8 replicas
#        of each GPU (sharing.timeSlicing), the whole-device equivalent
# Each round applies all PODS pods of one path at once and takes the seconds until every one is
# Running (a watch: `kubectl wait --for=condition=Ready`), then deletes them (and, for dra,
# waits for their claims to go) outside the clock; the node label actk.dev/nvidia.server hands
# nvidia over between the phases, outside the clock too; the order alternates each round.
# Prints each path's median and the ratio dra/dp of medians and of each round.
# Needs root and the cluster's binaries (scripts/k8s/build-kube.sh builds them once). Leaves the
# cluster down at the end (as `make test` does).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
node=$repo/scripts/k8s-node.sh
rounds=${1:-3}
pods=${2:-64}
[ "$(id -u)" = 0 ] || { echo "sharing-bench: needs root" >&2; exit 1; }
need() { echo "sharing-bench: $*" >&2; exit 1; }
((pods % 8 == 0 && pods <= 64)) || need "PODS must be a multiple of 8, at most 64 (8 GPUs, 8 shares each)"

version=${ACTK_KUBE_VERSION:-}
minor=$(echo "${version#v}" | cut -d. -f2)
if [ -z "$version" ] || [ "${minor:-0}" -lt 36 ]; then
  export ACTK_KUBE_FEATURE_GATES=${ACTK_KUBE_FEATURE_GATES:+$ACTK_KUBE_FEATURE_GATES,}DRAConsumableCapacity=true
fi

work=$(mktemp -d /tmp/actk-sharing-bench-XXXXXX)
trap '"$node" down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
"$repo/fixtures/prepare.sh" nvidia-dgx-h100 "$work/dgx" >/dev/null
cat >"$work/values.yaml" <<'VALUES'
config:
  strategies: [cdi-cri]
sharing:
  timeSlicing:
    resources:
      - {name: nvidia.com/gpu, replicas: 8}
dra:
  enabled: true
  sharing: true
  profiles: [nvidia]
  perNodeServer:
    enabled: true
    default: dra
VALUES
"$repo/scripts/k8s/actk-image.sh" >/dev/null
profile=${ACTK_IMAGE_PROFILE:-release}

k() { "$node" kubectl "$@"; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f\n", b - a }'; }

"$node" up --root "$work/dgx" --values "$work/values.yaml" >/dev/null 2>"$work/up.log" || { cat "$work/up.log" >&2; exit 1; }
nodename=$(k get nodes -o jsonpath='{.items[0].metadata.name}')

dra_gpus() { # shareable nvidia devices in actk.dev's slices of this node
  k get resourceslices -o json | jq '[.items[] | select(.spec.driver == "actk.dev") | .spec.devices[]?
    | select((.name | startswith("nvidia")) and .allowMultipleAllocations == true)] | length'
}
allocatable() { k get node "$nodename" -o json | jq -r '.status.allocatable["nvidia.com/gpu"] // "0"'; }
server=""
serve() { # dra|device-plugin: hand nvidia to it and wait until it alone serves the GPUs
  [ "$server" = "$1" ] && return 0
  k label node "$nodename" "actk.dev/nvidia.server=$1" --overwrite >/dev/null
  local i
  for ((i = 0; i < 600; i++)); do
    if [ "$1" = dra ]; then
      [ "$(allocatable)" = 0 ] && [ "$(dra_gpus)" = 8 ] && break
    else
      [ "$(dra_gpus)" = 0 ] && [ "$(allocatable)" = 64 ] && break
    fi
    sleep 0.2
  done
  [ "$i" -lt 600 ] || need "nvidia not handed to $1 within 120 s: allocatable $(allocatable), shareable DRA GPUs $(dra_gpus) (is DRAConsumableCapacity on?)"
  server=$1
}
serve dra
mib=$(k get resourceslices -o json | jq -r '[.items[] | select(.spec.driver == "actk.dev") | .spec.devices[]?
  | select(.name == "nvidia-0")][0].capacity.memory.value')
case $mib in *Mi) ;; *) need "nvidia-0's memory capacity is $mib, not MiB" ;; esac
eighth=$((${mib%Mi} / 8))Mi
for ((g = 0; g < 8; g++)); do
  k apply -f - >/dev/null <<TEMPLATE
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: bench-eighth-$g}
spec:
  spec:
    devices:
      requests:
        - name: gpu
          exactly:
            deviceClassName: actk-nvidia
            selectors: [{cel: {expression: 'device.attributes["actk.dev"].index == $g'}}]
            capacity: {requests: {memory: $eighth}}
TEMPLATE
done

pod() { # NAME PATH GPU
  local spec claims=""
  case $2 in
    dp) spec="resources: {limits: {nvidia.com/gpu: 1}}" ;;
    dra)
      spec="resources: {claims: [{name: gpu}]}"
      claims="resourceClaims: [{name: gpu, resourceClaimTemplateName: bench-eighth-$3}]"
      ;;
  esac
  cat <<POD
---
apiVersion: v1
kind: Pod
metadata: {name: $1, labels: {actk-bench: sharing}}
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
      command: ["sh", "-c", "ls /dev/nvidia[0-7] >/dev/null && exec sleep 3600"]
      resources: {requests: {cpu: 1m, memory: 8Mi}}
      $spec
POD
}
phase() { # ROUND PATH -> seconds from applying PODS pods to all Ready
  local i t0 t1
  : >"$work/pods.yaml"
  for ((i = 0; i < pods; i++)); do pod "s$1-$2-$i" "$2" $((i % 8)) >>"$work/pods.yaml"; done
  t0=$(now)
  k apply -f "$work/pods.yaml" >/dev/null
  k wait --for=condition=Ready pod -l actk-bench=sharing --timeout=600s >/dev/null \
    || need "$2: not every pod ran: $(k get pods -l actk-bench=sharing --no-headers | grep -v Running | head -n 5)"
  t1=$(now)
  k delete pods -l actk-bench=sharing --grace-period=0 --force --wait=true >/dev/null 2>&1
  if [ "$2" = dra ]; then
    k wait --for=delete resourceclaims --all --timeout=120s >/dev/null 2>&1 || true
  fi
  secs "$t0" "$t1"
}

: >"$work/samples"
for ((r = 0; r < rounds; r++)); do
  if ((r % 2 == 0)); then order=(dp dra); else order=(dra dp); fi
  for p in "${order[@]}"; do
    case $p in dp) serve device-plugin ;; dra) serve dra ;; esac
    echo "$r $p $(phase "$r" "$p")" >>"$work/samples"
  done
done
k label node "$nodename" actk.dev/nvidia.server- >/dev/null

echo "sharing-bench: single-node cluster (Kubernetes $(k version -o json 2>/dev/null | jq -r .serverVersion.gitVersion)${ACTK_KUBE_FEATURE_GATES:+, gates $ACTK_KUBE_FEATURE_GATES}), DGX H100 fixture, $pods pods of an eighth of a GPU ($eighth of $mib), actk $profile build, $rounds rounds, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%Y-%m-%dT%H:%MZ)"
awk '
function med(a, n,   i, j, t) {
  for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
  return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{ v[$2, $1] = $3; if ($1 + 1 > n) n = $1 + 1 }
END {
  for (r = 0; r < n; r++) { dp[r + 1] = v["dp", r]; dra[r + 1] = v["dra", r]; q[r + 1] = v["dra", r] / v["dp", r]; rows = rows sprintf(" %.2f/%.2f", v["dra", r], v["dp", r]) }
  mdp = med(dp, n); mdra = med(dra, n)
  printf "  all pods Running after apply: dp (time-slicing replicas) median %.2f s, dra (consumable capacity) median %.2f s\n", mdp, mdra
  printf "  dra/dp: %.3fx (ratio of medians), per-round ratio median %.3fx; rounds dra/dp s:%s\n", mdra / mdp, med(q, n), rows
}' "$work/samples"
