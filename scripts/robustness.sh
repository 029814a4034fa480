#!/usr/bin/env bash
# The property and fuzz part of the robustness report, shared by the CI-sized run
# (`make robustness`, called by .ci/run) and the long run (`make verify`, scripts/verify.sh):
#   - every property test of a parser of outside input (crates/*/tests/prop_*.rs, each
#     `check("NAME", ...)`) with PROPTEST_CASES cases: one line per property with the inputs it
#     tried; a failing property reports its own count and is marked, and never stops the others
#     (cargo test --no-fail-fast; each property is its own #[test]);
#   - every cargo-fuzz target of fuzz/Cargo.toml for FUZZ_SECONDS over the corpus committed in
#     fuzz/corpus/<target>: inputs tried and crashes (must be 0) per target.
#
# Environment:
#   PROPTEST_CASES   cases per property (default 1000; the long run uses 10000)
#   FUZZ_SECONDS     seconds per fuzz target (default 15; the long run uses 120)
#   FUZZ_TARGETS     targets to run (default: every [[bin]] of fuzz/Cargo.toml)
#   FUZZ_GROW=1      merge the inputs that add coverage into the committed corpus fuzz/corpus/
#                    (the long run does; commit what it adds). Otherwise new inputs go to
#                    fuzz/target/corpus/ and the committed corpus is only read.
#   SKIP_FUZZ=1      properties only
#   SKIP_PROPERTIES=1  fuzz targets only (.ci/run runs the two parts apart: the properties
#                    early, the fuzz targets last, built meanwhile by scripts/ci-prefetch.sh)
#   FUZZ_BUILD_ONLY=1  build every fuzz target as the run would, run none, report nothing
#   ACTK_VERIFY_COUNTS  report file the tests append `name count [failed]` lines to (default: a
#                    temporary file); the caller may add its own lines to it
#   ROBUSTNESS_SUMMARY  file to append the PASS/FAIL lines to (default: printed only)
# Exit status 0 only when every property held and every fuzz target ran without a crash.
set -u -o pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
CARGO=${CARGO:-cargo}
export PROPTEST_CASES=${PROPTEST_CASES:-1000}
FUZZ_SECONDS=${FUZZ_SECONDS:-15}
work=$(mktemp -d /tmp/actk-robustness.XXXXXX)
trap 'rm -rf "$work"' EXIT
if [ -z "${ACTK_VERIFY_COUNTS:-}" ]; then
  export ACTK_VERIFY_COUNTS="$work/counts"
  : > "$ACTK_VERIFY_COUNTS"
fi
summary=()
failed=()
started=$(date +%s)

log() { printf '\n=== %s\n' "$*"; }
line() { summary+=("$(printf '%-5s %-60s %s' "$1" "$2" "$3")"); }

# Every property's test file (each `check("NAME", ...)`): crates/*/tests/prop_*.rs, one
# `--test` each (the names are unique across the workspace).
mapfile -t prop_files < <(ls crates/*/tests/prop_*.rs 2>/dev/null)
test_args=()
for f in "${prop_files[@]}"; do
  test_args+=(--test "$(basename "$f" .rs)")
done

# cargo-fuzz (scripts/install-deps.sh installs it; here for a machine without it).
need_cargo_fuzz() {
  command -v cargo-fuzz >/dev/null || $CARGO install cargo-fuzz --locked
}
# The same build command as the run below, so that the run's own build finds nothing to do.
fuzz_build() {
  (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz build -a -s none)
}
if [ "${FUZZ_BUILD_ONLY:-0}" = 1 ]; then
  need_cargo_fuzz && fuzz_build
  exit
fi

prop_secs=0
if [ "${SKIP_PROPERTIES:-0}" != 1 ]; then
  log "property tests, PROPTEST_CASES=$PROPTEST_CASES"
  t0=$(date +%s)
  # One cargo call over the package set `make test` builds (--workspace --exclude
  # actk-k8s-e2e): Cargo unifies features over the packages a call selects, so the dependencies
  # built here are the very ones `make test` then reuses (a call per crate, `-p`, built them
  # with other features, rustix's for one, and `make test` built them again). --no-fail-fast: a
  # failing test binary must not keep the others from running.
  if ! $CARGO test --workspace --exclude actk-k8s-e2e --no-fail-fast "${test_args[@]}" 2>&1 | tee -a "$work/prop.log"; then
    failed+=("property tests")
  fi
  prop_secs=$(( $(date +%s) - t0 ))

  # One line per property, named in the sources (so a property that never ran shows 0, not nothing).
  mapfile -t props < <(grep -ohE 'check\("[^"]+"' "${prop_files[@]}" | sed 's/check("//; s/"$//' | sort -u)
  for p in "${props[@]}"; do
    if [[ "$p" == *" "* ]]; then
      # The count file is "name count [failed]": a name with a space would never be counted.
      line FAIL "property: $p" "name has a space; use - in check(\"...\")"
      failed+=("property name \"$p\"")
      continue
    fi
    n=$(awk -v k="$p" '$1 == k {s += $2} END {print s+0}' "$ACTK_VERIFY_COUNTS")
    bad=$(awk -v k="$p" '$1 == k && $3 == "failed" {print "y"}' "$ACTK_VERIFY_COUNTS" | head -1)
    if [ -n "$bad" ]; then
      line FAIL "property: $p" "failed after $n inputs (see the test output above)"
    elif [ "$n" -ge "$PROPTEST_CASES" ]; then
      line PASS "property: $p (no panic, errors name the input)" "$n inputs tried"
    else
      line FAIL "property: $p" "$n inputs tried (expected $PROPTEST_CASES; the test did not run or stopped)"
    fi
  done
fi

fuzz_secs=0
if [ "${SKIP_FUZZ:-0}" != 1 ]; then
  log "coverage-guided fuzzing, ${FUZZ_SECONDS}s per target"
  t0=$(date +%s)
  need_cargo_fuzz || failed+=("cargo install cargo-fuzz")
  targets=${FUZZ_TARGETS:-$(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^actk-fuzz$')}
  # Build every target once (the first run would otherwise carry the whole build).
  # -a: debug assertions and overflow checks; -s none: no sanitizer (no unsafe parsing code).
  # RUSTC_BOOTSTRAP=1: cargo-fuzz's -Z flags on the stable toolchain (fuzz/README.md).
  fuzz_build > "$work/fuzz-build.log" 2>&1 ||
    { tail -20 "$work/fuzz-build.log"; failed+=("cargo fuzz build"); }
  for t in $targets; do
    mkdir -p "fuzz/target/corpus/$t" "fuzz/artifacts/$t" "fuzz/corpus/$t"
    before=$(find "fuzz/artifacts/$t" -type f | wc -l)
    # New inputs go to the first directory; the committed seeds in fuzz/corpus are read.
    (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run -a -s none "$t" "target/corpus/$t" "corpus/$t" -- \
        -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 -rss_limit_mb=4096) > "$work/fuzz-$t.log" 2>&1
    rc=$?
    tail -3 "$work/fuzz-$t.log"
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/fuzz-$t.log" | tail -1)
    crashes=$(( $(find "fuzz/artifacts/$t" -type f | wc -l) - before ))
    if [ "$rc" != 0 ] || [ "$crashes" != 0 ] || [ -z "$runs" ]; then
      failed+=("fuzz $t")
      grep -m5 -E "panicked|ERROR|SUMMARY" "$work/fuzz-$t.log"
      line FAIL "fuzz: $t (${FUZZ_SECONDS}s, libFuzzer)" "${runs:-0} inputs tried, $crashes crashes (exit $rc)"
    else
      line PASS "fuzz: $t (${FUZZ_SECONDS}s, libFuzzer)" "$runs inputs tried, 0 crashes"
    fi
    if [ "${FUZZ_GROW:-0}" = 1 ]; then
      # Keep only what adds coverage: libFuzzer's merge of the new inputs into the committed corpus.
      n0=$(find "fuzz/corpus/$t" -type f | wc -l)
      (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run -a -s none "$t" "corpus/$t" "target/corpus/$t" -- -merge=1) \
        > "$work/fuzz-merge-$t.log" 2>&1 || failed+=("fuzz corpus merge $t")
      echo "fuzz/corpus/$t: $n0 -> $(find "fuzz/corpus/$t" -type f | wc -l) inputs (commit the new ones)"
    fi
  done
  fuzz_secs=$(( $(date +%s) - t0 ))
fi

log "robustness summary ($prop_secs s properties, $fuzz_secs s fuzzing incl. build, $(( $(date +%s) - started )) s in all)"
printf '%s\n' "${summary[@]}"
if [ -n "${ROBUSTNESS_SUMMARY:-}" ]; then
  printf '%s\n' "${summary[@]}" >> "$ROBUSTNESS_SUMMARY"
fi
if grep -q '^FAIL' <(printf '%s\n' "${summary[@]}") || [ ${#failed[@]} != 0 ]; then
  echo "robustness: FAILED: ${failed[*]:-see FAIL lines}"
  exit 1
fi
echo "robustness: every property holds, no fuzz target crashed"
