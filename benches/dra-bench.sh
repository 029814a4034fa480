#!/usr/bin/env bash
# The DRA driver on the real single-node cluster (issues 11 and 26), measured; no pass/fail.
# Run as `benches/k8s-bench.sh dra [ROUNDS] [STARTS]` (defaults 12 and 5), on the Kubernetes
# version ACTK_KUBE_VERSION names (the cluster's default otherwise):
#   pod start     in one run on one DGX H100 fixture node, ROUNDS interleaved rounds of
#                   dp   `limits: {nvidia.com/gpu: 2}` served by the device plugin (cdi-cri)
#                   dra  a claim for 2 GPUs (ResourceClaimTemplate, class actk-nvidia) served
#                        by the DRA driver
#                   xr   the same unchanged `limits:` pod served by the DRA driver through the
#                        class's extendedResourceName (KEP-5004; only where the cluster serves
#                        it, 1.36+)
#                 all the same busybox image. A kind is served by one of the two on a node, so
#                 the node label actk.dev/nvidia.server hands nvidia over between the phases
#                 (outside the clock: until the GPUs left one and the other shows 8); the
#                 phase order alternates each round. Milliseconds from `kubectl apply` until
#                 the container started (a watch); per path median [p25 p75], and dra/dp and
#                 xr/dp as the ratio of medians and the median [p25 p75] of per-round ratios
#   prepare       NodePrepareResources as the driver times it (its log line "answered in X
#                 ms": the whole call, the API read of the claim and the CDI spec write
#                 included), every call of the dra and xr pods: p50, p99 (nearest rank: with
#                 fewer than 100 calls this is the slowest), max, count
#   driver start  the DRA driver's pod deleted: seconds until its successor has published
#                 its pool (the 8 GPUs in slices it wrote), median of STARTS
# The image is scripts/k8s/actk-image.sh's (ACTK_IMAGE_PROFILE=debug for the debug build; the
# header says which). Needs root and the cluster's binaries (scripts/k8s/build-kube.sh builds
# them once). Leaves the cluster down at the end (as `make test` does).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
node=$repo/scripts/k8s-node.sh
rounds=${1:-12}
starts=${2:-5}
[ "$(id -u)" = 0 ] || { echo "dra-bench: needs root" >&2; exit 1; }
need() { echo "dra-bench: $*" >&2; exit 1; }

work=$(mktemp -d /tmp/actk-dra-bench-XXXXXX)
trap '"$node" down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
"$repo/fixtures/prepare.sh" nvidia-dgx-h100 "$work/dgx" >/dev/null
# Both servers installed; the node label decides which serves nvidia (default: the driver).
cat >"$work/values.yaml" <<'VALUES'
config:
  strategies: [cdi-cri]
dra:
  enabled: true
  profiles: [nvidia]
  perNodeServer:
    enabled: true
    default: dra
VALUES
"$repo/scripts/k8s/actk-image.sh" >/dev/null
profile=${ACTK_IMAGE_PROFILE:-release}

k() { "$node" kubectl "$@"; }
ms_now() { local t=$EPOCHREALTIME; echo $((${t/./} / 1000)); }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f\n", b - a }'; }
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

"$node" up --root "$work/dgx" --values "$work/values.yaml" >/dev/null 2>"$work/up.log" || { cat "$work/up.log" >&2; exit 1; }
nodename=$(k get nodes -o jsonpath='{.items[0].metadata.name}')
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
paths=(dp dra)
if [ "$(k get deviceclass actk-nvidia -o jsonpath='{.spec.extendedResourceName}')" = nvidia.com/gpu ]; then
  paths+=(xr)
fi

dra_gpus() { # nvidia devices in actk.dev's slices of this node
  k get resourceslices -o json | jq '[.items[] | select(.spec.driver == "actk.dev") | .spec.devices[]?
    | select(.name | startswith("nvidia"))] | length'
}
allocatable() { k get node "$nodename" -o json | jq -r '.status.allocatable["nvidia.com/gpu"] // "0"'; }
server=""
serve() { # dra|device-plugin: hand nvidia to it and wait until it alone shows the 8 GPUs
  [ "$server" = "$1" ] && return 0
  k label node "$nodename" "actk.dev/nvidia.server=$1" --overwrite >/dev/null
  local i
  for ((i = 0; i < 600; i++)); do
    if [ "$1" = dra ]; then
      [ "$(allocatable)" = 0 ] && [ "$(dra_gpus)" = 8 ] && break
    else
      [ "$(dra_gpus)" = 0 ] && [ "$(allocatable)" = 8 ] && break
    fi
    sleep 0.2
  done
  [ "$i" -lt 600 ] || need "nvidia not handed to $1 within 120 s: allocatable $(allocatable), DRA GPUs $(dra_gpus)"
  server=$1
}

pod() { # NAME PATH
  local spec="" claims=""
  case $2 in
    dp | xr) spec="resources: {limits: {nvidia.com/gpu: 2}}" ;;
    dra)
      spec="resources: {claims: [{name: gpus}]}"
      claims="resourceClaims: [{name: gpus, resourceClaimTemplateName: bench-two-gpus}]"
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
      command: ["sh", "-c", "ls /dev/nvidia0 /dev/nvidia1 >/dev/null && exec sleep 3600"]
      $spec
POD
}
serve_for() { case $1 in dp) serve device-plugin ;; *) serve dra ;; esac; }
start_ms() { # NAME PATH -> ms from apply to the container started (its server already serving)
  local t0 t1
  pod "$1" "$2" >"$work/$1.yaml"
  t0=$(ms_now)
  k apply -f "$work/$1.yaml" >/dev/null
  # A watch, not a poll: kubectl returns as soon as the kubelet reports the container started.
  k wait --for=jsonpath='{.status.containerStatuses[0].started}'=true "pod/$1" --timeout=120s >/dev/null \
    || need "$2: pod $1 did not start: $(k describe pod "$1" | tail -n 20)"
  t1=$(ms_now)
  if [ "$2" = xr ]; then
    [ -n "$(k get pod "$1" -o jsonpath='{.status.extendedResourceClaimStatus.resourceClaimName}')" ] \
      || need "xr: pod $1 was not served by DRA"
  fi
  k delete pod "$1" --grace-period=0 --force --wait=true >/dev/null 2>&1
  echo $((t1 - t0))
}

# One warm-up pod per path, then the rounds: the device plugin's phase first in even rounds,
# the driver's (dra and xr, their order alternating too) first in odd ones.
for p in "${paths[@]}"; do
  serve_for "$p"
  start_ms "warm-$p" "$p" >/dev/null
done
: >"$work/samples"
for ((r = 0; r < rounds; r++)); do
  dra_phase=(dra)
  [ "${#paths[@]}" = 3 ] && { if ((r % 4 < 2)); then dra_phase=(dra xr); else dra_phase=(xr dra); fi; }
  if ((r % 2 == 0)); then order=(dp "${dra_phase[@]}"); else order=("${dra_phase[@]}" dp); fi
  for p in "${order[@]}"; do
    serve_for "$p"
    echo "$r $p $(start_ms "p$r-$p" "$p")" >>"$work/samples"
  done
done
serve dra

# NodePrepareResources as the driver timed it, every call since it started (warm-ups included).
k -n kube-system logs -l app.kubernetes.io/name=actk-dra-driver --tail=-1 2>/dev/null \
  | sed -n 's/.*NodePrepareResources: [0-9]* claim(s) answered in \([0-9.]*\) ms.*/\1/p' >"$work/prepare"

# Driver start to slice: a new process counts its pool generations from 1 again, so its
# publish is told by the slices' resourceVersions changing with the 8 GPUs in them.
slice_versions() {
  k get resourceslices -o json | jq -c '[.items[] | select(.spec.driver == "actk.dev") | .metadata.resourceVersion] | sort'
}
: >"$work/slice"
for ((i = 0; i < starts; i++)); do
  v0=$(slice_versions)
  t0=$(now)
  k -n kube-system delete pod -l app.kubernetes.io/name=actk-dra-driver --wait=false >/dev/null
  for ((j = 0; j < 1200; j++)); do [ "$(slice_versions)" != "$v0" ] && [ "$(dra_gpus)" = 8 ] && break; sleep 0.1; done
  [ "$j" -lt 1200 ] || need "the restarted driver published no slice"
  t1=$(now)
  secs "$t0" "$t1" >>"$work/slice"
done

k label node "$nodename" actk.dev/nvidia.server- >/dev/null

echo "dra-bench: single-node cluster (Kubernetes $(k version -o json 2>/dev/null | jq -r .serverVersion.gitVersion), containerd 2.1), DGX H100 fixture, 2 GPUs, actk $profile build, $rounds interleaved rounds, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%Y-%m-%dT%H:%MZ)"
awk -v paths="${paths[*]}" '
function q(a, n, p,   i, j, t, pos, lo) {
  for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
  pos = p * (n - 1) + 1; lo = int(pos)
  return (lo < n) ? a[lo] + (pos - lo) * (a[lo + 1] - a[lo]) : a[lo]
}
{ v[$2, $1] = $3; if ($1 + 1 > rounds) rounds = $1 + 1 }
END {
  np = split(paths, ps, " ")
  printf "  pod start, apply to started: %-4s %9s %17s   %s\n", "path", "median ms", "[p25 p75]", "vs dp: ratio of medians, per-round ratio median [p25 p75]"
  for (k = 1; k <= np; k++) {
    p = ps[k]
    for (r = 0; r < rounds; r++) x[r + 1] = v[p, r]
    m[p] = q(x, rounds, 0.5); lo = q(x, rounds, 0.25); hi = q(x, rounds, 0.75)
    for (r = 0; r < rounds; r++) d[r + 1] = v[p, r] / v["dp", r]
    printf "  %30s %-4s %9.0f %8.0f %8.0f   %.3fx, %.3fx [%.3f %.3f]\n", "", p, m[p], lo, hi, m[p] / m["dp"], q(d, rounds, 0.5), q(d, rounds, 0.25), q(d, rounds, 0.75)
  }
}' "$work/samples"
sort -n "$work/prepare" | awk '{ v[NR] = $1 } END {
  if (NR == 0) { print "  NodePrepareResources: no timed call in the driver log"; exit }
  r50 = int(0.5 * NR + 0.999999); r99 = int(0.99 * NR + 0.999999)
  printf "  NodePrepareResources (driver log, %d calls): p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", NR, v[r50], v[r99], v[NR] }'
echo "  driver pod deleted to its successor's pool published, median of $starts: $(median <"$work/slice") s"
