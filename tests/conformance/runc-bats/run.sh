#!/usr/bin/env bash
# runc's own integration suite (tests/integration, bats) pointed at actk-runtime, compared test
# by test with the same suite run against plain runc on the same machine (issue 25).
#
# The suite is the one of the installed runc's tag (Debian bookworm: runc 1.1.5 -> v1.1.5), taken
# from its Go module zip (the module proxy is reachable; GitHub is not). Its helpers (recvtty,
# sd-helper, seccompagent) are built from the same zip, and the two images it downloads are
# replaced by offline stand-ins (get-images.sh is swapped for one that names them):
#   busybox: the host's busybox-static with every applet linked, the layout of the
#            docker-library busybox image (no /proc, /sys: the suite relies on their absence);
#   debian:  `debootstrap --variant=minbase bookworm` (the suite's is buster-slim; only
#            hooks.bats uses it, for ldconfig).
# All of it is built once into a versioned cache outside the clone (ACTK_CONFORMANCE_CACHE,
# default /var/cache/actk/conformance).
#
# Passes (PASSES, space separated; default "runc actk actk-req"):
#   runc      RUNC=runc                                  the baseline
#   actk      RUNC=actk-runtime, no requests            must give runc's result everywhere
#   actk-req  RUNC=actk-runtime, with-request.sh adds NVIDIA_VISIBLE_DEVICES=0 to every bundle
#             it creates; actk-runtime serves it from the CDI spec of a prepared
#             nvidia-dgx-h100 fixture (devices, driver libraries, the ldcache hook)
#   runc-req  RUNC=runc with the same request (runc ignores the variable: shows that the request
#             by itself changes no result)
#   ref-req   RUNC=runc, the same request, and the GPU's CDI devices (nvidia.com/gpu=0 from the
#             same generated spec) injected into every bundle by the CNCF reference library
#             (tests/peers/cdi-oracle) as a CDI-aware engine does: what the same containers do
#             with the reference's edits instead of actk's. `make verify` runs all five.
# actk-runtime runs with its own config (ACTK_CONFIG): the real runc as its runtime, the
# fixture as host root, the generated spec as its only spec directory, no hooks.d.
# actk passes fail on differences from their baseline: actk from runc, actk-req from ref-req
# when it ran, else runc-req, else runc. runc-req and ref-req are compared with runc for
# information only (a difference there is the reference's or the request's, not actk's).
#
# A difference listed in allow.tsv (with its reason) is reported and allowed. Any other test
# whose result (pass / fail / skip) differs from the baseline's is run again (RETRIES times,
# both runtimes) before it counts: timing tests of the suite (events --interval, pause) flake
# on a loaded machine; a difference that disappears is reported as flaky, one that stays fails.
# An allow-list entry whose difference did not show is reported as stale.
#
# Output: one table of counts per pass, every difference with the failing test's output, and
# the summary in $OUT/summary.txt (OUT default target/conformance/runc-bats). Exit 0 when no
# unexplained difference.
#
# Env: ACTK_BIN_DIR (default target/debug) or ACTK_RUNTIME and ACTK_HOOK, ACTK_CLI (default
# target/debug/actk), RUNC (default: runc on PATH), BATS_FILES (default: every *.bats, e.g.
# "run.bats exec.bats"), RETRIES (default 1), PASS_TIMEOUT per file (s, default 600).
# Needs root, bats (>= 1.2.1; Debian's 1.8.2), jq, gawk, go, gcc, libseccomp-dev, debootstrap,
# busybox-static, util-linux's script(1) (runc's CI runs the suite under `script` for a tty).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
export PATH=$PATH:/usr/local/go/bin:/usr/sbin:/sbin

die() { echo "runc-bats: $*" >&2; exit 2; }

# ---------------------------------------------------------------- one pass (run under script)
if [ "${1:-}" = __pass ]; then
  # $2 = suite dir, $3 = output dir; RUNC and the rest come in the environment.
  suite=$2 out=$3
  cd "$suite"
  for f in ${BATS_FILES:-*.bats}; do
    timeout --foreground -k 10 "${PASS_TIMEOUT:-600}" bats --tap --timing "$f" >"$out/${f%.bats}.tap" 2>&1 || true
  done
  exit 0
fi
if [ "${1:-}" = __one ]; then
  # $2 = suite dir, $3 = file, $4 = filter regex, $5 = output file
  cd "$2"
  timeout --foreground -k 10 120 bats --tap --timing -f "$4" "$3" >"$5" 2>&1 || true
  exit 0
fi

[ "$(id -u)" = 0 ] || die "run as root (the suite runs runc as root)"
for t in bats jq gawk go gcc script debootstrap flock; do
  command -v "$t" >/dev/null || die "$t not found (scripts/install-deps.sh installs what this needs)"
done
[ -e /usr/include/seccomp.h ] || die "libseccomp-dev is missing (the suite's seccompagent links libseccomp)"

runc_bin=${RUNC:-$(command -v runc)} || die "runc not found"
runc_ver=$("$runc_bin" --version | sed -n '1s/^runc version \([0-9][0-9.]*\).*/\1/p')
[ -n "$runc_ver" ] || die "cannot read the version of $runc_bin"
tag=v$runc_ver
# ACTK_BIN_DIR: where actk-runtime and actk-hook are (the Makefile gives the release shims'
# directory, what is installed); ACTK_RUNTIME / ACTK_HOOK name one binary each.
bin_dir=${ACTK_BIN_DIR:-$repo/target/debug}
actk_runtime=${ACTK_RUNTIME:-$bin_dir/actk-runtime}
actk_hook=${ACTK_HOOK:-$bin_dir/actk-hook}
actk_cli=${ACTK_CLI:-$repo/target/debug/actk}
for b in "$actk_runtime" "$actk_hook" "$actk_cli"; do
  [ -x "$b" ] || die "$b not found (cargo build --workspace --bins)"
done
PASSES=${PASSES:-runc actk actk-req}
RETRIES=${RETRIES:-1}
OUT=${OUT:-$repo/target/conformance/runc-bats}
rm -rf "$OUT"
mkdir -p "$OUT"

# ------------------------------------------------ the suite, its helpers and images (cached)
# The cache key has the harness's own version: a change to what is built here builds anew.
cache_root=${ACTK_CONFORMANCE_CACHE:-/var/cache/actk/conformance}
cache=$cache_root/runc-$tag-h2
mkdir -p "$cache_root"
exec 8>"$cache_root/.runc-$tag.lock"
flock 8
if [ ! -e "$cache/complete" ]; then
  echo "runc-bats: building the runc $tag suite, its helpers and images into $cache (once)" >&2
  rm -rf "$cache.tmp"
  mkdir -p "$cache.tmp/images"
  # The module zip through the Go module proxy (a scratch module so no go.mod is touched).
  gotmp=$(mktemp -d)
  mod=$(cd "$gotmp" && GOFLAGS=-mod=mod GO111MODULE=on go mod download -json "github.com/opencontainers/runc@$tag" | jq -r .Dir)
  rm -rf "$gotmp"
  [ -d "$mod/tests/integration" ] || die "the runc $tag module has no tests/integration ($mod)"
  cp -r "$mod" "$cache.tmp/src"
  chmod -R u+w "$cache.tmp/src"
  rm -rf "$cache.tmp/src/vendor"
  # Module zips keep no file modes.
  find "$cache.tmp/src" -name '*.sh' -exec chmod +x {} +
  (cd "$cache.tmp/src" && GOFLAGS=-mod=mod GOTOOLCHAIN=local go build -tags seccomp -o "$cache.tmp/bin/" \
    ./contrib/cmd/recvtty ./contrib/cmd/sd-helper ./contrib/cmd/seccompagent) >&2
  for c in sd-helper seccompagent; do cp "$cache.tmp/bin/$c" "$cache.tmp/src/contrib/cmd/$c/$c"; done
  # recvtty is started in the background by each test and inherits bats' output pipes; one that
  # outlives its test (teardown can run before it wrote its pid file) keeps bats waiting for
  # EOF forever. The wrapper gives it no descriptor of bats'.
  cp "$cache.tmp/bin/recvtty" "$cache.tmp/src/contrib/cmd/recvtty/recvtty.bin"
  cat >"$cache.tmp/src/contrib/cmd/recvtty/recvtty" <<'EOF'
#!/bin/sh
# actk: recvtty without bats' descriptors (tests/conformance/runc-bats/run.sh says why).
exec "$(dirname "$0")/recvtty.bin" "$@" </dev/null >/dev/null 2>&1 3>&- 4>&-
EOF
  chmod +x "$cache.tmp/src/contrib/cmd/recvtty/recvtty"
  # busybox: the host's busybox-static, applets as links, the docker-library image's layout.
  bb=$cache.tmp/busybox
  mkdir -p "$bb"/{bin,dev,etc,home,root,tmp,usr/sbin,var/spool/mail,var/www}
  chmod 1777 "$bb/tmp"
  chmod 700 "$bb/root"
  cp /bin/busybox "$bb/bin/busybox"
  for a in $(/bin/busybox --list-full); do
    [ "$a" = bin/busybox ] && continue
    mkdir -p "$bb/$(dirname "$a")"
    [ -e "$bb/$a" ] || ln -s /bin/busybox "$bb/$a"
  done
  printf '%s\n' root:x:0:0:root:/root:/bin/sh daemon:x:1:1:daemon:/usr/sbin:/bin/false \
    nobody:x:65534:65534:nobody:/home:/bin/false >"$bb/etc/passwd"
  printf '%s\n' root:x:0: daemon:x:1: tty:x:5: users:x:100: nogroup:x:65534: >"$bb/etc/group"
  tar -C "$bb" -cf "$cache.tmp/images/busybox.tar" .
  rm -rf "$bb"
  # debian: a bookworm minbase (what the e2e tests build too: reuse theirs when it is there).
  deb=$repo/target/actk-e2e/glibc-rootfs
  if [ ! -x "$deb/sbin/ldconfig" ]; then
    deb=$cache.tmp/debian
    debootstrap --variant=minbase bookworm "$deb" "${ACTK_DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$cache.tmp/debootstrap.log" 2>&1 \
      || die "debootstrap failed: $(tail -3 "$cache.tmp/debootstrap.log")"
  fi
  tar -C "$deb" --exclude ./var/cache/apt/archives --exclude ./var/lib/apt/lists -cf "$cache.tmp/images/debian.tar" .
  rm -rf "$cache.tmp/debian"
  cat >"$cache.tmp/src/tests/integration/get-images.sh" <<EOF
#!/bin/bash
# actk: offline stand-ins for the images runc's get-images.sh downloads (run.sh says how they are made).
echo BUSYBOX_IMAGE=$cache/images/busybox.tar
echo DEBIAN_IMAGE=$cache/images/debian.tar
EOF
  chmod +x "$cache.tmp/src/tests/integration/get-images.sh"
  touch "$cache.tmp/complete"
  rm -rf "$cache"
  mv "$cache.tmp" "$cache"
  # The paths written above name $cache, which is where the tree now is.
fi
flock -u 8
suite=$cache/src/tests/integration

# ------------------------------------------------------------ actk-runtime's world for the run
work=$(mktemp -d /tmp/actk-runc-bats.XXXXXX)
# The userns tests mount the rootfs as another user: every directory above it must be searchable.
chmod 755 "$work"
cleanup_procs() {
  # Helpers of the suite that outlived their test (only ours: matched by executable path).
  local p exe
  for p in /proc/[0-9]*; do
    exe=$(readlink "$p/exe" 2>/dev/null) || continue
    case $exe in "$cache"/*) kill -9 "${p#/proc/}" 2>/dev/null || true ;; esac
  done
}
# Never rm -rf through a mount: a test that failed half-way can leave one under $work.
safe_rm() {
  local d=$1 m
  awk -v d="$d" 'index($2, d "/") == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  if awk -v d="$d" 'index($2, d "/") == 1 {f = 1} END {exit !f}' /proc/mounts; then
    echo "runc-bats: mounts remain under $d; left in place" >&2
    return 0
  fi
  rm -rf --one-file-system "$d"
}
trap 'cleanup_procs; safe_rm "$work"' EXIT
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

# ----------------------------------------------------------------------------- the passes
declare -A pass_runtime=([runc]=$runc_bin [runc-req]=$runc_bin [ref-req]=$runc_bin [actk]=$actk_runtime [actk-req]=$actk_runtime)
peer=
if [[ " $PASSES " == *" ref-req "* ]]; then
  peer=$("$repo/tests/peers/cdi-oracle/build.sh" | tail -1)/cdi-oracle
fi
run_env() {
  # env(1) arguments for pass $1
  local p=$1
  echo "ACTK_CONFIG=$work/config.toml TMPDIR=$work/tmp-$p"
  case $p in
    ref-req) echo "RUNC=$here/with-request.sh ACTK_REQUEST_RUNTIME=${pass_runtime[$p]} ACTK_REQUEST_CDI_INJECT=$peer ACTK_REQUEST_SPEC_DIR=$work/cdi" ;;
    *-req) echo "RUNC=$here/with-request.sh ACTK_REQUEST_RUNTIME=${pass_runtime[$p]}" ;;
    *) echo "RUNC=${pass_runtime[$p]}" ;;
  esac
}

# TAP files of a pass -> "file: name<TAB>pass|fail|skip<TAB>ms" lines
results() {
  local dir=$1 f
  for f in "$dir"/*.tap; do
    awk -v file="$(basename "$f" .tap).bats" '
      { sub(/\r$/, "") }
      /^(not )?ok [0-9]+ / {
        st = ($1 == "not") ? "fail" : "pass"
        line = $0
        sub(/^(not )?ok [0-9]+ /, "", line)
        if (line ~ / # skip/) { st = "skip"; sub(/ # skip.*$/, "", line) }
        ms = ""
        if (match(line, / in [0-9]+ms$/)) { ms = substr(line, RSTART + 4); sub(/ms$/, "", ms); line = substr(line, 1, RSTART - 1) }
        print file ": " line "\t" st "\t" ms
      }' "$f"
  done
}

declare -A secs
for p in $PASSES; do
  [ -n "${pass_runtime[$p]:-}" ] || die "unknown pass $p (runc, runc-req, ref-req, actk, actk-req)"
  mkdir -p "$OUT/$p" "$work/tmp-$p"
  chmod 755 "$work/tmp-$p"
  note=
  case $p in *-req) note=", a request in every bundle" ;; esac
  echo "runc-bats: pass $p (RUNC=${pass_runtime[$p]}$note)" >&2
  start=$(date +%s)
  # shellcheck disable=SC2046
  env $(run_env "$p") script -q -e -c "'$0' __pass '$suite' '$OUT/$p'" /dev/null </dev/null >"$OUT/$p.script.log" 2>&1 || true
  cleanup_procs
  secs[$p]=$(($(date +%s) - start))
  results "$OUT/$p" >"$OUT/$p.results"
  [ -s "$OUT/$p.results" ] || die "pass $p produced no results (see $OUT/$p.script.log)"
done

# --------------------------------------------------------------------------- comparison
# Every difference is counted and reported, none stops the report.
set +e +o pipefail
# The failing test's own output (TAP comment lines) of pass $1, test key $2.
detail() {
  local p=$1 key=$2 file=${2%%: *} name=${2#*: }
  awk -v name="$name" '
    { sub(/\r$/, "") }
    /^(not )?ok [0-9]+ / { l = $0; sub(/^(not )?ok [0-9]+ /, "", l); sub(/( in [0-9]+ms)?( # skip.*)?$/, "", l); on = (l == name); next }
    on && /^#/ { print "      " $0 }' "$OUT/$p/${file%.bats}.tap" | tail -25 || true
}
rerun() {
  # rerun pass $1's test $2 once; prints its result
  local p=$1 key=$2 file=${2%%: *} name=${2#*: } re o
  re="^$(printf '%s' "$name" | sed 's/[][\.*^$()+?{}|/]/\\&/g')\$"
  o=$work/rerun-$p.tap
  mkdir -p "$work/tmp-$p"
  chmod 755 "$work/tmp-$p"
  # shellcheck disable=SC2046
  env $(run_env "$p") script -q -e -c "'$0' __one '$suite' '$file' '$re' '$o'" /dev/null </dev/null >/dev/null 2>&1 || true
  cleanup_procs
  mkdir -p "$work/rr" && rm -f "$work/rr/"*.tap && cp "$o" "$work/rr/${file%.bats}.tap"
  results "$work/rr" | awk -F'\t' -v k="$key" '$1 == k {print $2}'
}

allow=$here/allow.tsv
# allowed MODE KEY -> prints the reason when (mode, key) is allow-listed
allowed() {
  # prints "ENTRY-MODE<TAB>REASON"
  awk -F'\t' -v m="$1" -v k="$2" '!/^#/ && NF >= 3 && ($1 == m || $1 == "any") && $2 == k {print $1 "\t" $3; exit}' "$allow"
}

summary=$OUT/summary.txt
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }
count() { awk -F'\t' -v s="$2" '$2 == s' "$OUT/$1.results" | wc -l; }

say "runc integration suite $tag (runc $runc_ver), $(awk 'END {print NR}' "$OUT/$(echo "$PASSES" | awk '{print $1}').results") tests"
say "$(printf '%-10s %6s %6s %6s %8s' pass passed failed skipped seconds)"
for p in $PASSES; do
  say "$(printf '%-10s %6d %6d %6d %8d' "$p" "$(count "$p" pass)" "$(count "$p" fail)" "$(count "$p" skip)" "${secs[$p]}")"
done

unexplained=0
req_base=runc
declare -A seen_allowed
for p in $PASSES; do
  case $p in runc) continue ;; esac
  base=runc
  mode=none
  case $p in
    runc-req | ref-req)
      # Information: what the request (and the reference's edits) change for plain runc.
      n=0
      while IFS=$'\t' read -r key want got; do
        n=$((n + 1))
        say "  info   [$p] $key: runc $want, $p $got"
      done < <(LC_ALL=C join -t $'\t' <(cut -f1,2 "$OUT/runc.results" | LC_ALL=C sort) <(cut -f1,2 "$OUT/$p.results" | LC_ALL=C sort) | awk -F'\t' '$2 != $3')
      say "$p vs runc: $n differing results (information; not actk's)"
      continue
      ;;
    actk-req)
      mode=request
      for b in ref-req runc-req; do
        if [[ " $PASSES " == *" $b "* ]]; then base=$b; break; fi
      done
      req_base=$base
      ;;
  esac
  n_diff=0 n_allowed=0 n_flaky=0 n_bad=0
  while IFS=$'\t' read -r key want got; do
    n_diff=$((n_diff + 1))
    hit=$(allowed "$mode" "$key")
    if [ -n "$hit" ]; then
      reason=${hit#*$'\t'}
      n_allowed=$((n_allowed + 1))
      seen_allowed["${hit%%$'\t'*}|$key"]=1
      say "  allowed [$p] $key: $base $want, $p $got -- $reason"
      continue
    fi
    flaky=
    for ((i = 0; i < RETRIES; i++)); do
      w=$(rerun "$base" "$key")
      g=$(rerun "$p" "$key")
      if [ "$w" = "$g" ]; then flaky="$w"; break; fi
    done
    if [ -n "$flaky" ]; then
      n_flaky=$((n_flaky + 1))
      say "  flaky  [$p] $key: $base $want, $p $got; both $flaky when run again"
      continue
    fi
    n_bad=$((n_bad + 1))
    say "  DIFFERS [$p] $key: $base $want, $p $got"
    detail "$p" "$key" | tee -a "$summary"
  done < <(LC_ALL=C join -t $'\t' <(cut -f1,2 "$OUT/$base.results" | LC_ALL=C sort) <(cut -f1,2 "$OUT/$p.results" | LC_ALL=C sort) | awk -F'\t' '$2 != $3')
  # A test in one pass and not the other (a pass cut short) is a difference too.
  missing=$(LC_ALL=C comm -3 <(cut -f1 "$OUT/$base.results" | LC_ALL=C sort) <(cut -f1 "$OUT/$p.results" | LC_ALL=C sort) | wc -l)
  if [ "$missing" != 0 ]; then
    say "  DIFFERS [$p] $missing tests ran in only one of $base and $p"
    n_bad=$((n_bad + missing))
  fi
  say "$p vs $base: $n_diff differing results: $n_allowed allowed, $n_flaky flaky (agreed when run again), $n_bad unexplained"
  unexplained=$((unexplained + n_bad))
done
# Allow-list entries that did not show (fixed since, or a pass that did not run).
while IFS=$'\t' read -r m k _; do
  case $m in '#'* | '') continue ;; esac
  case $m in
    none) [[ " $PASSES " == *" actk "* ]] || continue ;;
    # The entries describe differences from plain runc; against the reference's edits some
    # are no difference (the reference fails the same way), so only a runc baseline says stale.
    request) [[ " $PASSES " == *" actk-req "* && $req_base == runc ]] || continue ;;
    *) [[ " $PASSES " == *" actk "* && " $PASSES " == *" actk-req "* && $req_base == runc ]] || continue ;;
  esac
  [ -n "${seen_allowed["$m|$k"]:-}" ] || say "  stale allow-list entry ($m) $k: no difference any more; remove it from allow.tsv"
done <"$allow"
say "unexplained differences: $unexplained"
[ "$unexplained" = 0 ]
