#!/usr/bin/env bash
# opencontainers/runtime-tools' runtime validation suite (validation/*, TAP programs) pointed
# at actk-runtime and compared, test by test, with the same programs against plain runc
# (issue 25; `make verify`).
#
# The suite comes from its Go module zip (RUNTIME_TOOLS_VERSION, default the pseudo-version
# CDI's reference library and containerd pin: the last runtime-tools of the runtime-spec 1.0.2
# era that runc 1.1 follows). `runtimetest` (static) and every validation program are built
# once into a versioned cache (ACTK_CONFORMANCE_CACHE, default /var/cache/actk/conformance);
# the programs unpack the module's own rootfs-amd64.tar.gz into each bundle.
#
# Passes, baselines and rule as in ../runc-bats/run.sh: runc, actk (RUNTIME=actk-runtime, no
# requests), actk-req (every bundle asks for NVIDIA_VISIBLE_DEVICES=0 on a prepared
# nvidia-dgx-h100 fixture), ref-req (runc with the reference library's injection of the same
# GPU, the baseline of actk-req), runc-req. A result is one TAP line of one program
# ("program#N"): pass, fail or skip; a program that dies prints no plan and counts as failed.
# A difference not in allow.tsv is run again (RETRIES) and fails when it stays.
#
# Output: target/conformance/runtime-tools/ (TAP per program and pass, summary.txt). Env as
# run.sh of runc-bats: ACTK_BIN_DIR / ACTK_RUNTIME / ACTK_HOOK, ACTK_CLI, RUNC, PASSES,
# RETRIES (default 1), TESTS (program names, default all).
set -euo pipefail
# In a private mount namespace: linux_rootfs_propagation's "shared" container propagates its
# mounts to the namespace the bundle lives in, and a failed program can leave its container's
# mounts behind; here they stay in this namespace and go with it.
if [ -z "${ACTK_RUNTIME_TOOLS_NS:-}" ]; then
  ACTK_RUNTIME_TOOLS_NS=1 exec unshare -m --propagation private "$0" "$@"
fi
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
export PATH=$PATH:/usr/local/go/bin:/usr/sbin:/sbin
die() { echo "runtime-tools: $*" >&2; exit 2; }

[ "$(id -u)" = 0 ] || die "run as root (the suite runs containers)"
for t in jq go flock tar; do command -v "$t" >/dev/null || die "$t not found (scripts/install-deps.sh)"; done
version=${RUNTIME_TOOLS_VERSION:-v0.9.1-0.20221107090550-2e043c6bd626}
runc_bin=${RUNC:-$(command -v runc)} || die "runc not found"
bin_dir=${ACTK_BIN_DIR:-$repo/target/debug}
actk_runtime=${ACTK_RUNTIME:-$bin_dir/actk-runtime}
actk_hook=${ACTK_HOOK:-$bin_dir/actk-hook}
actk_cli=${ACTK_CLI:-$repo/target/debug/actk}
for b in "$actk_runtime" "$actk_hook" "$actk_cli"; do [ -x "$b" ] || die "$b not found (cargo build --workspace --bins)"; done
PASSES=${PASSES:-runc ref-req actk actk-req}
RETRIES=${RETRIES:-1}
OUT=${OUT:-$repo/target/conformance/runtime-tools}
rm -rf "$OUT"
mkdir -p "$OUT"

# ------------------------------------------------------------------ the suite, built once
cache_root=${ACTK_CONFORMANCE_CACHE:-/var/cache/actk/conformance}
cache=$cache_root/runtime-tools-$version-h1
mkdir -p "$cache_root"
exec 8>"$cache_root/.runtime-tools.lock"
flock 8
if [ ! -e "$cache/complete" ]; then
  echo "runtime-tools: building runtime-tools $version's validation suite into $cache (once, a few minutes)" >&2
  rm -rf "$cache.tmp"
  gotmp=$(mktemp -d)
  mod=$(cd "$gotmp" && GOFLAGS=-mod=mod GO111MODULE=on go mod download -json "github.com/opencontainers/runtime-tools@$version" | jq -r .Dir)
  rm -rf "$gotmp"
  [ -d "$mod/validation" ] || die "no validation/ in the runtime-tools module ($mod)"
  cp -r "$mod" "$cache.tmp"
  chmod -R u+w "$cache.tmp"
  rm -rf "$cache.tmp/vendor" "$cache.tmp/Godeps"
  # runtimetest runs inside the suite's busybox rootfs: static.
  (cd "$cache.tmp" && CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local go build -o "$cache.tmp/bin/" ./cmd/runtimetest ./validation/...) >&2
  touch "$cache.tmp/complete"
  mv "$cache.tmp" "$cache"
fi
flock -u 8

# ------------------------------------------------------------ actk-runtime's world for the run
work=$(mktemp -d /tmp/actk-runtime-tools.XXXXXX)
chmod 755 "$work"
# Containers a program left behind (runc's default state root; only ours, by bundle).
cleanup_containers() {
  local id
  for id in $("$runc_bin" list --format json 2>/dev/null | jq -r --arg w "$work/" '.[]? | select(.bundle | startswith($w)) | .id'); do
    "$runc_bin" delete -f "$id" >/dev/null 2>&1 || true
  done
}
safe_rm() {
  local d=$1 m
  awk -v d="$d" 'index($2, d "/") == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  if awk -v d="$d" 'index($2, d "/") == 1 {f = 1} END {exit !f}' /proc/mounts; then
    echo "runtime-tools: mounts remain under $d; left in place" >&2
    return 0
  fi
  rm -rf --one-file-system "$d"
}
trap 'cleanup_containers; safe_rm "$work"' EXIT
sh "$repo/fixtures/prepare.sh" nvidia-dgx-h100 "$work/fixture" >/dev/null
mkdir -p "$work/cdi"
"$actk_cli" cdi generate --root "$work/fixture" --vendor nvidia --ldcache-hook "$actk_hook" --output "$work/cdi" >/dev/null
cat >"$work/config.toml" <<EOF
runtimes = ["$runc_bin"]
spec_dirs = ["$work/cdi"]
hooks_dirs = []
root = "$work/fixture"
log_file = "$OUT/actk-runtime.log"
hook_path = "$actk_hook"
EOF
declare -A pass_runtime=([runc]=$runc_bin [runc-req]=$runc_bin [ref-req]=$runc_bin [actk]=$actk_runtime [actk-req]=$actk_runtime)
peer=
if [[ " $PASSES " == *" ref-req "* ]]; then
  peer=$("$repo/tests/peers/cdi-oracle/build.sh" | tail -1)/cdi-oracle
fi
run_env() {
  local p=$1
  echo "ACTK_CONFIG=$work/config.toml TMPDIR=$work/tmp-$p"
  case $p in
    ref-req) echo "RUNTIME=$here/../runc-bats/with-request.sh ACTK_REQUEST_RUNTIME=${pass_runtime[$p]} ACTK_REQUEST_CDI_INJECT=$peer ACTK_REQUEST_SPEC_DIR=$work/cdi" ;;
    *-req) echo "RUNTIME=$here/../runc-bats/with-request.sh ACTK_REQUEST_RUNTIME=${pass_runtime[$p]}" ;;
    *) echo "RUNTIME=${pass_runtime[$p]}" ;;
  esac
}
tests=${TESTS:-$(cd "$cache/bin" && ls | grep -vx runtimetest)}

# One program of pass $1 into $2 (a TAP file); the programs read ./rootfs-amd64.tar.gz and
# ./runtimetest from their working directory.
run_one() {
  local p=$1 t=$2 tap=$3 d=$work/cwd-$p
  mkdir -p "$d" "$work/tmp-$p"
  chmod 755 "$work/tmp-$p"
  [ -e "$d/runtimetest" ] || { cp "$cache/bin/runtimetest" "$d/"; cp "$cache/rootfs-amd64.tar.gz" "$d/"; }
  # shellcheck disable=SC2046
  (cd "$d" && env $(run_env "$p") timeout -k 10 120 "$cache/bin/$t" >"$tap" 2>&1) || echo "# exit status $?" >>"$tap"
  cleanup_containers
}
# TAP of program $2 -> "program: description #K<TAB>pass|fail|skip|todo" (K counts repeats of
# one description): keyed by what is checked, not by its number, since a container with more
# mounts or devices gets more numbered checks. A program with no plan line ("1..N") died: one
# "program: (no TAP plan) #1 fail" line.
results_of() {
  awk -v t="$2" '
    /^(not )?ok [0-9]+/ {
      st = ($1 == "not") ? "fail" : "pass"
      d = $0; sub(/^(not )?ok [0-9]+ ?(- )?/, "", d)
      if (d ~ /^# (SKIP|skip)/) { st = "skip"; sub(/^# (SKIP|skip) ?/, "", d) }
      else if (d ~ /^# (TODO|todo)/) { st = "todo"; sub(/^# (TODO|todo) ?/, "", d) }
      k = t ": " d; seen[k]++
      print k " #" seen[k] "\t" st
    }
    /^1\.\.[0-9]+/ { plan = 1 }
    END { if (!plan) print t ": (no TAP plan: the program died) #1\tfail" }' "$1"
}

declare -A secs
for p in $PASSES; do
  [ -n "${pass_runtime[$p]:-}" ] || die "unknown pass $p"
  echo "runtime-tools: pass $p (RUNTIME=${pass_runtime[$p]})" >&2
  mkdir -p "$OUT/$p"
  start=$(date +%s)
  for t in $tests; do
    run_one "$p" "$t" "$OUT/$p/$t.tap"
    results_of "$OUT/$p/$t.tap" "$t"
  done >"$OUT/$p.results"
  secs[$p]=$(($(date +%s) - start))
done

# --------------------------------------------------------------------------- comparison
set +e +o pipefail
allow=$here/allow.tsv
summary=$OUT/summary.txt
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }
count() { awk -F'\t' -v s="$2" '$2 == s' "$OUT/$1.results" | wc -l; }
say "runtime-tools $version validation: $(echo "$tests" | wc -w) programs, $(awk 'END {print NR}' "$OUT/$(echo "$PASSES" | awk '{print $1}').results") results"
say "$(printf '%-10s %6s %6s %6s %6s %8s' pass passed failed skipped todo seconds)"
for p in $PASSES; do
  say "$(printf '%-10s %6d %6d %6d %6d %8d' "$p" "$(count "$p" pass)" "$(count "$p" fail)" "$(count "$p" skip)" "$(count "$p" todo)" "${secs[$p]}")"
done
# Programs of pass $1 with their verdict: "program<TAB>pass|fail" (fail: a failed check or no plan).
verdicts() {
  awk -F'\t' '{t = $1; sub(/: .*/, "", t); if (!(t in v)) v[t] = "pass"; if ($2 == "fail") v[t] = "fail"}
    END {for (t in v) print t "\t" v[t]}' "$OUT/$1.results" | LC_ALL=C sort
}
allowed_entry() {
  awk -F'\t' -v m="$1" -v k="$2" '!/^#/ && NF >= 3 && ($1 == m || $1 == "any") && $2 == k {print $1 "\t" $3; exit}' "$allow"
}
# Without requests both passes run the same configs: every check must agree.
compare_checks() {
  local base=$1 p=$2 key want got t hit flaky i rr w g d
  while IFS=$'\t' read -r key want got; do
    n_diff=$((n_diff + 1))
    t=${key%%: *}
    hit=$(allowed_entry "$mode" "$key")
    if [ -n "$hit" ]; then
      n_allowed=$((n_allowed + 1))
      seen["${hit%%$'\t'*}|$key"]=1
      say "  allowed [$p] $key: $base $want, $p $got -- ${hit#*$'\t'}"
      continue
    fi
    flaky=
    for ((i = 0; i < RETRIES; i++)); do
      # One rerun of a program per pass and round serves every differing check of it.
      rr=$work/rerun/$i
      mkdir -p "$rr/$base" "$rr/$p"
      [ -e "$rr/$base/$t.tap" ] || run_one "$base" "$t" "$rr/$base/$t.tap"
      [ -e "$rr/$p/$t.tap" ] || run_one "$p" "$t" "$rr/$p/$t.tap"
      w=$(results_of "$rr/$base/$t.tap" "$t" | awk -F'\t' -v k="$key" '$1 == k {print $2}')
      g=$(results_of "$rr/$p/$t.tap" "$t" | awk -F'\t' -v k="$key" '$1 == k {print $2}')
      if [ "$w" = "$g" ]; then flaky=${w:-absent}; break; fi
    done
    if [ -n "$flaky" ]; then
      n_flaky=$((n_flaky + 1))
      say "  flaky  [$p] $key: $base $want, $p $got; both $flaky when run again"
      continue
    fi
    n_bad=$((n_bad + 1))
    say "  DIFFERS [$p] $key: $base $want, $p $got"
    d=${key#*: }
    grep -A8 -F -- "${d% #*}" "$OUT/$p/$t.tap" 2>/dev/null | head -12 | cut -c1-300 | sed 's/^/      /' | tee -a "$summary"
  done < <(LC_ALL=C join -t $'\t' <(cut -f1,2 "$OUT/$base.results" | LC_ALL=C sort) <(cut -f1,2 "$OUT/$p.results" | LC_ALL=C sort) | awk -F'\t' '$2 != $3')
  # A check the baseline made and this pass did not is a difference; one only this pass made
  # counts as long as it does not fail.
  missing=$(LC_ALL=C comm -23 <(cut -f1 "$OUT/$base.results" | LC_ALL=C sort) <(cut -f1 "$OUT/$p.results" | LC_ALL=C sort))
  # Checks go missing together when a program's container did not start (runc refused it:
  # "cannot allocate memory" adding a seccomp rule on a loaded machine): the program runs again
  # in both passes (RETRIES) and counts as flaky when both then give the same results.
  if [ -n "$missing" ]; then
    local prog keys n_keys
    for prog in $(echo "$missing" | sed 's/: .*//' | LC_ALL=C sort -u); do
      keys=$(echo "$missing" | awk -v t="$prog" 'index($0, t ": ") == 1')
      n_keys=$(echo "$keys" | wc -l)
      flaky=
      for ((i = 0; i < RETRIES; i++)); do
        rr=$work/rerun/$i
        mkdir -p "$rr/$base" "$rr/$p"
        [ -e "$rr/$base/$prog.tap" ] || run_one "$base" "$prog" "$rr/$base/$prog.tap"
        [ -e "$rr/$p/$prog.tap" ] || run_one "$p" "$prog" "$rr/$p/$prog.tap"
        if [ "$(results_of "$rr/$base/$prog.tap" "$prog" | LC_ALL=C sort)" = "$(results_of "$rr/$p/$prog.tap" "$prog" | LC_ALL=C sort)" ]; then
          flaky=1
          break
        fi
      done
      if [ -n "$flaky" ]; then
        n_flaky=$((n_flaky + n_keys))
        say "  flaky  [$p] $prog: $n_keys checks of $base missing in $p ($(grep -m1 -E 'failed|error' "$OUT/$p/$prog.tap" | cut -c1-200)); every result agrees when run again"
        continue
      fi
      n_bad=$((n_bad + n_keys))
      echo "$keys" | while read -r k; do say "  DIFFERS [$p] $k: in $base, not in $p"; done
    done
  fi
  extra=$(LC_ALL=C join -t $'\t' <(LC_ALL=C comm -13 <(cut -f1 "$OUT/$base.results" | LC_ALL=C sort) <(cut -f1 "$OUT/$p.results" | LC_ALL=C sort)) \
    <(LC_ALL=C sort "$OUT/$p.results"))
  if [ -n "$extra" ]; then
    n_extra=$(echo "$extra" | wc -l)
    bad_extra=$(echo "$extra" | awk -F'\t' '$2 == "fail"')
    say "  $p made $n_extra checks $base did not (its container has more to check): $(echo "$extra" | awk -F'\t' '{print $2}' | sort | uniq -c | tr -s ' \n' ' ')"
    if [ -n "$bad_extra" ]; then
      n_bad=$((n_bad + $(echo "$bad_extra" | wc -l)))
      echo "$bad_extra" | while IFS=$'\t' read -r k st; do say "  DIFFERS [$p] $k: only in $p, and $st"; done
    fi
  fi
}
# With a request the configs differ (another runtime's edits: mounts in another order, other
# node owners), so the checks differ too; what must agree is each program's verdict.
compare_programs() {
  local base=$1 p=$2 t want got hit
  while IFS=$'\t' read -r t want got; do
    n_diff=$((n_diff + 1))
    hit=$(allowed_entry "$mode" "$t")
    if [ -n "$hit" ]; then
      n_allowed=$((n_allowed + 1))
      seen["${hit%%$'\t'*}|$t"]=1
      say "  allowed [$p] $t: $base $want, $p $got -- ${hit#*$'\t'}"
      continue
    fi
    # Run both programs once more: a verdict that agrees then was a flake.
    run_one "$base" "$t" "$work/rerun-$base-$t.tap"
    run_one "$p" "$t" "$work/rerun-$p-$t.tap"
    if [ "$(results_of "$work/rerun-$base-$t.tap" "$t" | awk -F'\t' '$2 == "fail"' | wc -l | tr -d ' ' | sed 's/^[1-9][0-9]*$/fail/;s/^0$/pass/')" = \
      "$(results_of "$work/rerun-$p-$t.tap" "$t" | awk -F'\t' '$2 == "fail"' | wc -l | tr -d ' ' | sed 's/^[1-9][0-9]*$/fail/;s/^0$/pass/')" ]; then
      n_flaky=$((n_flaky + 1))
      say "  flaky  [$p] $t: $base $want, $p $got; the same verdict when run again"
      continue
    fi
    n_bad=$((n_bad + 1))
    say "  DIFFERS [$p] $t: $base $want, $p $got; its failed checks:"
    awk -F'\t' -v t="$t" 'index($1, t ": ") == 1 && $2 == "fail" {print "      " $1}' "$OUT/$p.results" | head -10 | tee -a "$summary"
  done < <(LC_ALL=C join -t $'\t' <(verdicts "$base") <(verdicts "$p") | awk -F'\t' '$2 != $3')
}
unexplained=0
declare -A seen
for p in $PASSES; do
  case $p in runc) continue ;; esac
  base=runc mode=none
  case $p in
    runc-req | ref-req)
      # Information: what the request (and the reference's edits) change for plain runc.
      n=$(LC_ALL=C join -t $'\t' <(cut -f1,2 "$OUT/runc.results" | LC_ALL=C sort) <(cut -f1,2 "$OUT/$p.results" | LC_ALL=C sort) | awk -F'\t' '$2 != $3' | wc -l)
      say "$p vs runc: $n differing results (information; not actk's)"
      continue
      ;;
    actk-req)
      mode=request
      for b in ref-req runc-req; do
        if [[ " $PASSES " == *" $b "* ]]; then base=$b; break; fi
      done
      ;;
  esac
  n_diff=0 n_allowed=0 n_flaky=0 n_bad=0
  if [ "$mode" = request ]; then
    compare_programs "$base" "$p"
  else
    compare_checks "$base" "$p"
  fi
  what="differing results"
  [ "$mode" = request ] && what="programs with another verdict"
  say "$p vs $base: $n_diff $what: $n_allowed allowed, $n_flaky flaky (agreed when run again), $n_bad unexplained"
  unexplained=$((unexplained + n_bad))
done
while IFS=$'\t' read -r m k _; do
  case $m in '#'* | '') continue ;; esac
  [ -n "${seen["$m|$k"]:-}" ] || say "  stale allow-list entry ($m) $k: no difference any more; remove it from allow.tsv"
done <"$allow"
say "unexplained differences: $unexplained"
[ "$unexplained" = 0 ]
