#!/usr/bin/env bash
# crictl (cri-tools) for the CRI end-to-end tests against containerd 2 (issue 14): built from the
# Go module proxy with `go install` (the module has no replace directives) into a versioned cache
# outside the clone that later runs reuse. Prints the crictl path (last line).
#
# Usage: scripts/fetch-crictl.sh     Env: ACTK_CRICTL_CACHE (default /var/cache/actk/crictl)
set -euo pipefail
version=v1.34.0
cache=${ACTK_CRICTL_CACHE:-/var/cache/actk/crictl}/$version
if [ -x "$cache/crictl" ]; then
  echo "$cache/crictl"
  exit 0
fi
export PATH=$PATH:/usr/local/go/bin
command -v go >/dev/null || { echo "fetch-crictl: go not found (Go builds the CRI test client)" >&2; exit 1; }
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if [ ! -x "$cache/crictl" ]; then
  echo "fetch-crictl: building crictl $version (a few minutes, once)" >&2
  GOBIN=$cache CGO_ENABLED=0 go install "sigs.k8s.io/cri-tools/cmd/crictl@$version" >&2
fi
echo "$cache/crictl"
