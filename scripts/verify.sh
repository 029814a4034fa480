#!/usr/bin/env bash
# make verify: the robustness properties of issue 6, measured, with one line per property and
# its figure at the end:
#   - scripts/robustness.sh (also `make robustness`, the CI-sized run): property tests of every
#     parser of outside input with PROPTEST_CASES cases per property, each with its own count (a
#     failing one never hides the others); coverage-guided fuzzing (cargo-fuzz, fuzz/) of each
#     target for FUZZ_SECONDS, inputs tried and crashes (must be 0), the inputs that add
#     coverage merged into the committed corpus fuzz/corpus/ (FUZZ_GROW=0 to leave it);
#   - concurrency (crates/e2e/tests/concurrency.rs): containers started at once;
#   - faults (crates/e2e/tests/faults.rs): faults injected;
#   - conformance: runc 1.1.5's own integration suite and runtime-tools' validation programs
#     against plain runc and actk-runtime, with and without requests, the request passes also
#     against runc with the CNCF CDI reference library's injection, and critest on containerd 2.1
#     with actk-runtime as the runc shim's runtime against the same with plain runc (tests/conformance);
#     unexplained differences (must be 0);
#   - the DRA cluster tests on the newest Kubernetes (make test-k8s-newest, 1.37), which CI
#     leaves to this run (its cold build of the 1.37 binaries does not fit CI's time);
#   - leaks: differences HostGuard found inside the tests, plus a snapshot of the host (mount
#     table, /dev, /etc/cdi, /var/run/cdi, daemon.json) before and after this whole run (must be 0).
# Exit status 0 only when every property holds.
#
# Environment: PROPTEST_CASES (default 10000), FUZZ_SECONDS per fuzz target (default 120),
# FUZZ_TARGETS (default: all in fuzz/Cargo.toml), SKIP_FUZZ=1 to leave fuzzing out, FUZZ_GROW
# (default 1: merge new coverage into fuzz/corpus), SKIP_K8S_NEWEST=1 to leave the 1.37 cluster
# tests out, K8S_NEWEST (default v1.37.2).
# Run as root with dockerd started (the Makefile's verify target starts it).
set -u -o pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
CARGO=${CARGO:-cargo}
export PROPTEST_CASES=${PROPTEST_CASES:-10000}
FUZZ_SECONDS=${FUZZ_SECONDS:-120}
work=$(mktemp -d /tmp/actk-verify.XXXXXX)
trap 'rm -rf "$work"' EXIT
export ACTK_VERIFY_COUNTS="$work/counts"
: > "$ACTK_VERIFY_COUNTS"
failed=()
summary=()

log() { printf '\n=== %s\n' "$*"; }

# The host as hostcheck.rs sees it (same fields, same engine directories left out).
host_snapshot() {
  awk '{
      split($0, halves, " - "); n = split(halves[1], l, " "); split(halves[2], r, " ");
      mp = l[5];
      if (mp ~ "^/(var/lib/docker|run/docker|var/run/docker|run/containerd|var/lib/containerd|var/lib/containers|run/containers|run/libpod|run/netns|var/run/netns|run/user|run/runc|run/crun)(/|$)") next;
      print "mount " mp " root=" l[4] " opts=" l[6] " type=" r[1] " source=" r[2]
    }' /proc/self/mountinfo
  find /dev \( -path /dev/pts -o -path /dev/shm -o -path /dev/mqueue -o -path /dev/hugepages \) -prune -o -printf 'dev %p %y %#m\n' 2>/dev/null
  find /etc/cdi /var/run/cdi -type f -exec md5sum {} + 2>/dev/null | sed 's/^/cdi /'
  if [ -e /etc/docker/daemon.json ]; then
    # Runtimes of tests still running elsewhere (actk-e2e-*) are theirs; this run's are gone.
    jq -cS 'if .runtimes then .runtimes |= with_entries(select(.key | startswith("actk-e2e-") | not)) else . end' \
      /etc/docker/daemon.json 2>/dev/null | sed 's/^/daemon.json /' || echo "daemon.json (not JSON)"
  else
    echo "daemon.json absent"
  fi
}

host_snapshot | sort > "$work/host-before"

log "build"
$CARGO build --workspace --bins || failed+=("build")

log "properties and fuzzing (scripts/robustness.sh)"
# The same runner as the CI-sized `make robustness`, here long, growing the committed corpus.
: > "$work/robustness-summary"
if ! PROPTEST_CASES=$PROPTEST_CASES FUZZ_SECONDS=$FUZZ_SECONDS FUZZ_GROW=${FUZZ_GROW:-1} \
    ROBUSTNESS_SUMMARY="$work/robustness-summary" scripts/robustness.sh 2>&1 | tee "$work/prop.log"; then
  failed+=("properties/fuzzing")
fi

log "concurrency and faults (real engines)"
# A test that cannot run here (not root, dockerd down) fails instead of passing by skipping.
if ! ACTK_E2E_STRICT=1 $CARGO test -p actk-e2e --no-fail-fast --test concurrency --test faults -- --test-threads=4 2>&1 | tee "$work/e2e.log"; then
  failed+=("concurrency/fault tests")
fi
log "conformance: runc's integration suite, the full matrix (tests/conformance/runc-bats)"
# Every file of the suite (CI's `make conformance` runs a share of them), with plain runc
# with a request in every bundle too (runc ignores the variable: it must change nothing) and
# runc with the CNCF reference library's injection of the same GPU (ref-req), the baseline of
# the request pass here.
shims=$(scripts/build-release.sh --shims-only | tail -1)
if ! ACTK_BIN_DIR=$shims PASSES="runc runc-req ref-req actk actk-req" BATS_FILES= \
    tests/conformance/runc-bats/run.sh 2>&1 | tee "$work/runc-bats.log"; then
  failed+=("runc integration suite")
fi
log "conformance: runtime-tools validation (tests/conformance/runtime-tools)"
if ! ACTK_BIN_DIR=$shims tests/conformance/runtime-tools/run.sh 2>&1 | tee "$work/runtime-tools.log"; then
  failed+=("runtime-tools validation")
fi
log "conformance: critest on containerd 2.1 (tests/conformance/critest)"
if ! ACTK_BIN_DIR=$shims tests/conformance/critest/run.sh 2>&1 | tee "$work/critest.log"; then
  failed+=("critest on containerd 2.1")
fi

# The DRA cluster tests on the newest Kubernetes (issue 26): too long for CI when its binaries
# are built cold (Makefile, test-k8s-newest), so here. SKIP_K8S_NEWEST=1 leaves it out.
k8s_newest=skipped
if [ "${SKIP_K8S_NEWEST:-0}" != 1 ]; then
  log "Kubernetes ${K8S_NEWEST:-v1.37.2}: the DRA cluster tests (make test-k8s-newest)"
  if make --no-print-directory test-k8s-newest 2>&1 | tee "$work/k8s-newest.log"; then k8s_newest=passed; else
    k8s_newest=failed; failed+=("DRA cluster tests on the newest Kubernetes")
  fi
fi

# The cluster tests CI leaves out to keep within its time (Makefile, K8S_VERIFY_ONLY), on 1.34.
k8s_more=skipped
if [ "${SKIP_K8S_MORE:-0}" != 1 ]; then
  log "Kubernetes 1.34: the cluster tests CI leaves out (make test-k8s-more)"
  if make --no-print-directory test-k8s-more 2>&1 | tee "$work/k8s-more.log"; then k8s_more=passed; else
    k8s_more=failed; failed+=("cluster tests CI leaves out")
  fi
fi

# HostGuard failures print "the host changed (N difference(s))".
guard_leaks=$(cat "$work/prop.log" "$work/e2e.log" | sed -n 's/.*the host changed (\([0-9]*\) difference.*/\1/p' | awk '{s+=$1} END {print s+0}')

host_snapshot | sort > "$work/host-after"
diff "$work/host-before" "$work/host-after" > "$work/host-diff"
host_leaks=$(grep -c '^[<>]' "$work/host-diff")
leaks=$((guard_leaks + host_leaks))
[ "$leaks" = 0 ] || failed+=("leaks")

# Sum the counts the tests appended (`what number`) per `what`.
count() { awk -v k="$1" '$1 == k {s += $2} END {print s+0}' "$ACTK_VERIFY_COUNTS"; }

line() { summary+=("$(printf '%-5s %-58s %s' "$1" "$2" "$3")"); }
ok_if() { if [ "$1" ]; then echo PASS; else echo FAIL; fi; }

while IFS= read -r l; do summary+=("$l"); done < "$work/robustness-summary"
n=$(count hook-state-inputs)
line "$(ok_if "$( [ "$n" -gt 0 ] && echo y)")" "property: hook state on stdin (actk-hook binary, exit 1)" "$n inputs tried"
for what in containers-at-once-runc-actk-runtime containers-at-once-docker-runtime containers-at-once-docker-gpus-hook; do
  n=$(count "$what")
  if [ "$n" -ge 32 ]; then fig="$n containers started at once, all succeeded"; else fig="$n containers (test failed or could not run)"; fi
  line "$(ok_if "$( [ "$n" -ge 32 ] && echo y)")" "concurrency: ${what#containers-at-once-}" "$fig"
done
line "$(ok_if "$( [ "$(count cdi-spec-reads-validated)" -gt 0 ] && echo y)")" "concurrency: CDI spec rewritten while containers start" \
  "$(count cdi-regenerations-during-starts) rewrites, $(count cdi-spec-reads-validated) reads all whole, $(count containers-started-during-regeneration) containers"
line "$(ok_if "$( [ "$(count runtime-configure-racers)" -gt 0 ] && echo y)")" "concurrency: actk runtime configure racing with itself" "$(count runtime-configure-racers) racers, no entry lost"
for what in faults-hook-sigkill faults-runtime-sigkill faults-spec-dir-full faults-spec-dir-read-only faults-device-node-removed faults-runtime-crash; do
  n=$(count "$what")
  if [ "$n" -gt 0 ]; then fig="$n faults injected, each failed cleanly"; else fig="0 faults (test failed or could not run)"; fi
  line "$(ok_if "$( [ "$n" -gt 0 ] && echo y)")" "faults: ${what#faults-}" "$fig"
done
for suite in runc-bats runtime-tools critest; do
  unexpl=$(sed -n 's/^unexplained differences: //p' "$work/$suite.log" | tail -1)
  counts=$(awk '$1 ~ /^(runc|runc-req|ref-req|actk|actk-req)$/ && NF >= 5 {printf "%s%s %s/%s/%s", sep, $1, $2, $3, $4; sep = ", "}' "$work/$suite.log")
  line "$(ok_if "$( [ "${unexpl:-x}" = 0 ] && echo y)")" "conformance: $suite vs runc" \
    "${unexpl:-?} unexplained differences (passed/failed/skipped: $counts)"
done
k8s_counts=$(grep -E '^test result:' "$work/k8s-newest.log" 2>/dev/null | awk '{p += $4; f += $6} END {printf "%d passed, %d failed", p, f}')
line "$(if [ "$k8s_more" = failed ]; then echo FAIL; else echo PASS; fi)" "kubernetes 1.34: cluster tests CI leaves out" "$k8s_more"
line "$(if [ "$k8s_newest" = failed ]; then echo FAIL; else echo PASS; fi)" "kubernetes ${K8S_NEWEST:-v1.37.2}: DRA cluster tests" "$k8s_newest${k8s_counts:+ ($k8s_counts)}"
line "$(ok_if "$( [ "$leaks" = 0 ] && echo y)")" "host cleanliness: mounts, /dev, CDI dirs, daemon.json" "$leaks leaks found ($guard_leaks in tests, $host_leaks over the run)"

log "summary"
printf '%s\n' "${summary[@]}"
if [ "$host_leaks" != 0 ]; then
  echo "host differences over the run:"; cat "$work/host-diff"
fi
if grep -q '^FAIL' <(printf '%s\n' "${summary[@]}") || [ ${#failed[@]} != 0 ]; then
  echo "verify: FAILED: ${failed[*]:-see FAIL lines}"
  exit 1
fi
echo "verify: every property holds"
