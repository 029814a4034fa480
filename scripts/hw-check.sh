#!/usr/bin/env bash
# hw-check.sh: run scripts/gpu-check on a machine with a real NVIDIA GPU, from the repository.
#
#   scripts/hw-check.sh [gpu-check arguments...]
#
# Builds the release binaries (actk, actk-runtime, actk-hook) when any is missing, then runs
# gpu-check with --bin target/release. When $OUT is set (the device machine's result folder),
# the output is also written to $OUT/gpu-check.txt. Exit status: gpu-check's (0: all passed),
# or 1 when the build fails.

set -u -o pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo" || exit 1
rel="$repo/target/release"

run() {
    local need=0
    for b in actk actk-runtime actk-hook; do
        [ -x "$rel/$b" ] || need=1
    done
    if [ $need = 1 ]; then
        echo "hw-check: building release binaries (cargo build --release -p actk -p actk-runtime -p actk-hook)"
        cargo build --release -p actk -p actk-runtime -p actk-hook 2>&1 | tail -n 5
        [ "${PIPESTATUS[0]}" = 0 ] || { echo "FAIL build: cargo build --release failed"; return 1; }
    fi
    echo "hw-check: $(uname -srm); $(date -u '+%Y-%m-%dT%H:%M:%SZ'); commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    "$repo/scripts/gpu-check" --bin "$rel" "$@"
}

if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    run "$@" 2>&1 | tee "$OUT/gpu-check.txt"
    exit "${PIPESTATUS[0]}"
fi
run "$@"
