#!/usr/bin/env bash
# What CI needs late, built early at the lowest CPU priority (.ci/run starts it in the
# background after `make deps`): the packagers scripts/package.sh installs, the Kubernetes
# binaries of the test cluster (scripts/k8s/build-kube.sh, ~18 min of CPU cold), containerd
# and etcd from Debian forky (scripts/k8s/fetch-forky.sh) and the fuzz targets, which .ci/run
# runs last (scripts/robustness.sh, FUZZ_BUILD_ONLY=1: the same build command as the run). At
# nice 19 it takes only the CPU that lint, the builds and the tests leave idle (the end-to-end
# tests wait on containers much of the time), so work that used to run alone overlaps them.
# Each step holds the same lock as the foreground call that needs its result: that call waits
# for this one and then reuses what it built (or builds it itself if this one failed). Nothing
# here mounts, makes device nodes or writes CDI specs, so the host snapshots of the tests
# (crates/actk-testsupport/src/hostcheck.rs) never see it.
# Usage: nice -n 19 scripts/ci-prefetch.sh   (prints one line per step with its seconds)
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH:/usr/local/go/bin"
rc=0
step() {
  local t0=$SECONDS err
  err=/tmp/actk-ci-prefetch.$(basename "$1").err
  if "$@" >/dev/null 2>"$err"; then
    echo "ci-prefetch: $* done in $((SECONDS - t0)) s"
  else
    echo "ci-prefetch: $* failed after $((SECONDS - t0)) s (the foreground call retries it):"
    tail -n 20 "$err"
    rc=1
  fi
}
step scripts/package.sh tools
step scripts/k8s/build-kube.sh
step scripts/k8s/fetch-forky.sh
step env FUZZ_BUILD_ONLY=1 scripts/robustness.sh
exit $rc
