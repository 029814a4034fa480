#!/usr/bin/env bash
# Build (or reuse) the Kubernetes binaries the tests run: kubelet, kube-apiserver, kube-scheduler,
# kube-controller-manager, kubectl, from k8s.io/kubernetes through the Go module proxy.
#
# Usage: scripts/k8s/build-kube.sh          prints the bin directory on stdout (last line)
# Env:   ACTK_KUBE_VERSION   k8s.io/kubernetes version (default v1.34.4)
#        ACTK_KUBE_CACHE     cache root outside the clone (default /var/cache/actk/kube)
#
# The binaries go to $ACTK_KUBE_CACHE/$VERSION-go$GOVERSION/bin and are reused when all five are
# there and a stamp says they were built completely (a cold build on 2 cores: ~15-25 minutes).
# Go is a test-peer tool only; nothing of actk is built with it. CGO_ENABLED=0: static binaries.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
version=${ACTK_KUBE_VERSION:-v1.34.4}
cache=${ACTK_KUBE_CACHE:-/var/cache/actk/kube}
command -v go >/dev/null || { echo "build-kube: go not found (Go 1.24+ is needed to build the test cluster)" >&2; exit 1; }
gover=$(go env GOVERSION)
out=$cache/$version-$gover
bins=(kubelet kube-apiserver kube-scheduler kube-controller-manager kubectl)

if [ -f "$out/complete" ]; then
  ok=1
  for b in "${bins[@]}"; do [ -x "$out/bin/$b" ] || ok=0; done
  if [ $ok = 1 ]; then echo "build-kube: reusing $out/bin" >&2; echo "$out/bin"; exit 0; fi
fi

mkdir -p "$out"
exec 9>"$out/.lock"
flock 9
# Another build may have finished while we waited for the lock.
if [ -f "$out/complete" ]; then echo "$out/bin"; exit 0; fi

start=$(date +%s)
export CGO_ENABLED=0 GOFLAGS=-mod=mod
mod=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
[ -f "$mod" ] || { echo "build-kube: could not download k8s.io/kubernetes@$version (Go module proxy reachable?)" >&2; exit 1; }
minor=${version#v1.}
staging=v0.$minor
go_directive=$(sed -n 's/^go \(.*\)$/\1/p' "$mod" | head -n 1)
godebug=$(grep '^godebug ' "$mod" || true)
# Each `k8s.io/X => ./staging/src/k8s.io/X` line becomes `k8s.io/X => k8s.io/X v0.MINOR.PATCH`.
replaces=$(sed -n '/^replace (/,/^)/p' "$mod" | sed -n 's#^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/src/.*$#\t\1 => \1 '"$staging"'#p')
[ -n "$replaces" ] || { echo "build-kube: no staging replace block found in $mod" >&2; exit 1; }
echo "build-kube: $(echo "$replaces" | wc -l) staging modules pinned to $staging" >&2

work=$out/src
rm -rf "$work"
mkdir -p "$work"
awk -v v="$version" -v g="$go_directive" -v d="$godebug" -v r="$replaces" '
  /^\/\// { next }
  { gsub("@VERSION@", v); gsub("@GO@", g); gsub("@GODEBUG@", d); if ($0 == "@REPLACES@") { print r; next } print }
' "$repo/scripts/k8s/kube-bins/go.mod.in" >"$work/go.mod"
cd "$work"
for b in "${bins[@]}"; do
  case $b in kubectl) pkg=k8s.io/kubernetes/cmd/kubectl ;; *) pkg=k8s.io/kubernetes/cmd/$b ;; esac
  go get "$pkg@$version" >&2
done
mkdir -p "$out/bin"
for b in "${bins[@]}"; do
  echo "build-kube: building $b" >&2
  go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/client-go/pkg/version.gitVersion=$version" \
    -o "$out/bin/$b" "k8s.io/kubernetes/cmd/$b" >&2
done
end=$(date +%s)
echo "built $version with $gover in $((end - start)) s on $(nproc) cores" >"$out/complete"
echo "build-kube: $(cat "$out/complete")" >&2
echo "$out/bin"
