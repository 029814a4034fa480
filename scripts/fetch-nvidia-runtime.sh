#!/usr/bin/env bash
# NVIDIA's nvidia-container-runtime as a test peer for benches/runtime-bench.sh (issue 31): built
# from the Go module proxy (github.com/NVIDIA/nvidia-container-toolkit, cmd/nvidia-container-runtime;
# the module has no replace directives, so `go install pkg@version` builds exactly the tagged
# source) into a versioned cache outside the clone that later runs reuse. It is never a
# dependency of actk: only the bench runs it, to show what actk's shim costs next to NVIDIA's.
# Prints the binary's path (last line).
#
# Usage: scripts/fetch-nvidia-runtime.sh
# Env: ACTK_PEERS_CACHE (default /var/cache/actk/peers), ACTK_NVIDIA_RUNTIME_VERSION (default below)
set -euo pipefail
version=${ACTK_NVIDIA_RUNTIME_VERSION:-v1.20.2}
cache=${ACTK_PEERS_CACHE:-/var/cache/actk/peers}/nvidia-container-runtime/$version
if [ -x "$cache/nvidia-container-runtime" ]; then
  echo "$cache/nvidia-container-runtime"
  exit 0
fi
export PATH=$PATH:/usr/local/go/bin
command -v go >/dev/null || { echo "fetch-nvidia-runtime: go not found (Go builds NVIDIA's runtime)" >&2; exit 1; }
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if [ ! -x "$cache/nvidia-container-runtime" ]; then
  echo "fetch-nvidia-runtime: building nvidia-container-runtime $version (a few minutes, once)" >&2
  # Linked as NVIDIA's Makefile links its release binaries (cgo on, stripped, the same external
  # linker flags and version stamp), so that the peer starts as the packaged one does;
  # -trimpath so that the binary does not depend on where the module cache is.
  GOBIN=$cache GOFLAGS=-trimpath go install -ldflags "-s -w \
'-extldflags=-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files -Wl,-z,lazy' \
-X github.com/NVIDIA/nvidia-container-toolkit/internal/info.version=${version#v}" \
    "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime@$version" >&2
fi
echo "$cache/nvidia-container-runtime"
