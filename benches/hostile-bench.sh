#!/usr/bin/env bash
# Root CPU and memory of a container start against the worst image of each class of issue 29
# (findings 2 and 3), as ratios to a plain image's start, for one or two builds of actk in one
# run (rounds interleaved, so drift of the machine hits every column alike):
#   plain   busybox with a glibc-style /etc/ld.so.conf (so the ld.so.cache step runs)
#   cache   /etc/ld.so.cache: 349,000 entries naming one 8 MiB string (finding 2)
#   elf     1,000 links to one crafted library (254 PT_NOTE, 4000 DT_NEEDED) in the injected
#           library directory (finding 3)
#   dropin  226,000 compat drop-in lines in /etc/ld.so.conf.d (finding 3)
# Each start is `runc run` of a fresh copy of the image on the nvidia-dgx-h100 fixture asking for
# GPU 0, through actk-hook as the prestart hook (the `docker run --gpus` path) and through
# actk-runtime (its update-ldcache and enable-cuda-compat createContainer hooks). Printed per
# build, path and class: the hooks' CPU (user+sys) and largest RSS, from wait4(2) around each
# hook, and the whole start's CPU (runc and everything it waited for); then each as a ratio to
# the plain start. Every hook runs under prlimit (2 GiB of address space, 120 s of CPU): a
# build that would take more is stopped there, and its figure is marked `>` (killed, with what it
# had spent).
#
# Usage: benches/hostile-bench.sh [ROUNDS]        (default 3)
# Env:   ACTK_BIN       dir of the build to measure (actk-hook, actk-runtime; default: this
#                       checkout's target/release if built, else target/debug)
#        ACTK_BEFORE_BIN  dir of a second build, e.g. the parent commit's:
#                         git worktree add --detach /tmp/actk-before <commit>
#                         (cd /tmp/actk-before && CARGO_TARGET_DIR=/tmp/actk-before-target \
#                            cargo build -p actk-hook -p actk-runtime)
#                         ACTK_BEFORE_BIN=/tmp/actk-before-target/debug benches/hostile-bench.sh 2
# Needs: root, runc, prlimit, python3, cargo (builds the hostile-file writer,
# `cargo build -p actk-testsupport --example hostile_image`).
set -euo pipefail

rounds=${1:-3}
repo=$(cd "$(dirname "$0")/.." && pwd)
[ "$(id -u)" = 0 ] || { echo "hostile-bench: must run as root (runc, device nodes)" >&2; exit 1; }
for t in runc prlimit python3; do
  command -v "$t" >/dev/null || { echo "hostile-bench: $t not found (scripts/install-deps.sh)" >&2; exit 1; }
done
after=${ACTK_BIN:-$repo/target/release}
[ -x "$after/actk-hook" ] || after=$repo/target/debug
builds=("after=$after")
[ -n "${ACTK_BEFORE_BIN:-}" ] && builds=("before=$ACTK_BEFORE_BIN" "${builds[@]}")
for b in "${builds[@]}"; do
  d=${b#*=}
  [ -x "$d/actk-hook" ] && [ -x "$d/actk-runtime" ] || { echo "hostile-bench: no actk-hook/actk-runtime in $d" >&2; exit 1; }
done

work=$(mktemp -d /tmp/actk-hostile-bench-XXXXXX)
trap 'rm -rf "$work"' EXIT
(cd "$repo" && cargo build -q -p actk-testsupport --example hostile_image)
writer=$repo/target/debug/examples/hostile_image
sh "$repo/fixtures/prepare.sh" nvidia-dgx-h100 "$work/fixture" >/dev/null

# The images: a busybox rootfs, and a copy of it per hostile class.
img=$work/img
mkdir -p "$img/plain"/{bin,etc/ld.so.conf.d,proc,sys,dev,tmp,usr/lib/x86_64-linux-gnu}
cp /bin/busybox "$img/plain/bin/busybox"
for a in sh true ls; do ln -s busybox "$img/plain/bin/$a"; done
echo 'include /etc/ld.so.conf.d/*.conf' > "$img/plain/etc/ld.so.conf"
for c in cache elf dropin; do
  cp -a "$img/plain" "$img/$c"
  "$writer" "$c" "$img/$c" /usr/lib/x86_64-linux-gnu 1000
done

# measure.py OUT CMD...: runs CMD (stdin passed on), appends "user_s sys_s maxrss_kb status" of
# it and everything it waited for (wait4's rusage, microseconds) to OUT, exits as CMD did.
cat > "$work/measure.py" <<'PY'
import os, sys
out, cmd = sys.argv[1], sys.argv[2:]
pid = os.fork()
if pid == 0:
    os.execv(cmd[0], cmd)
_, status, ru = os.wait4(pid, 0)
with open(out, "a") as f:
    f.write(f"{ru.ru_utime:.6f} {ru.ru_stime:.6f} {ru.ru_maxrss} {status}\n")
sys.exit(os.waitstatus_to_exitcode(status) & 0xff)
PY

# Per build: a hook wrapper (prlimit, measure.py appending to $work/hook.times) and a config
# whose hook_path is that wrapper, so actk-runtime's hooks are measured the same way.
for b in "${builds[@]}"; do
  name=${b%%=*} dir=${b#*=}
  cat > "$work/hook-$name" <<EOF
#!/bin/sh
exec /usr/bin/prlimit --as=2147483648 --cpu=120 -- /usr/bin/python3 -S $work/measure.py $work/hook.times $dir/actk-hook "\$@"
EOF
  chmod 755 "$work/hook-$name"
  printf 'root = "%s"\nhook_path = "%s"\nspec_dirs = []\n' "$work/fixture" "$work/hook-$name" > "$work/config-$name.toml"
done

# One start of build NAME (binaries in DIR) through VIA (hook|runtime) with image CLASS: fresh
# rootfs copy, config.json from `runc spec`; prints "hook_cpu_s hook_rss_kb start_cpu_s killed"
# (killed = 1 when a hook ended by a signal or failed).
start() {
  local name=$1 dir=$2 via=$3 class=$4 b=$work/bundle
  rm -rf "$b"; mkdir -p "$b"
  cp -a "$img/$class" "$b/rootfs"
  (cd "$b" && runc spec)
  python3 - "$b/config.json" "$via" "$work/hook-$name" "$work/config-$name.toml" <<'PY'
import json, sys
p, via, hook, cfg = sys.argv[1:]
c = json.load(open(p))
c["process"].update(terminal=False, args=["/bin/true"])
c["process"]["env"].append("NVIDIA_VISIBLE_DEVICES=0")
c["root"]["readonly"] = False
if via == "hook":
    c["hooks"] = {"prestart": [{"path": hook, "args": ["nvidia-container-runtime-hook", "prestart"], "env": ["ACTK_CONFIG=" + cfg]}]}
json.dump(c, open(p, "w"))
PY
  : > "$work/hook.times"
  : > "$work/start.times"
  local id="actk-hb-$$-$RANDOM" cmd=("$(command -v runc)")
  [ "$via" = runtime ] && cmd=(/usr/bin/env "ACTK_CONFIG=$work/config-$name.toml" "$dir/actk-runtime")
  python3 -S "$work/measure.py" "$work/start.times" "${cmd[@]}" run --bundle "$b" "$id" \
    </dev/null >/dev/null 2>"$work/start.err" || true
  runc delete -f "$id" >/dev/null 2>&1 || true
  # A hook's status other than 0 (a signal from prlimit, a failure) marks the figures.
  awk -v start="$(cat "$work/start.times")" '
    NF == 4 { cpu += $1 + $2; if ($3 > rss) rss = $3; if ($4 != 0) killed = 1 }
    END { split(start, s, " "); printf "%.4f %d %.4f %d\n", cpu, rss, s[1] + s[2], killed + 0 }' "$work/hook.times"
}

classes=(plain cache elf dropin)
declare -A hcpu hrss scpu killed
for r in $(seq 1 "$rounds"); do
  for b in "${builds[@]}"; do
    name=${b%%=*}
    for via in hook runtime; do
      for c in "${classes[@]}"; do
        read -r hc hr sc k <<<"$(start "$name" "${b#*=}" "$via" "$c")"
        key="$name $via $c"
        hcpu[$key]+="$hc " hrss[$key]+="$hr " scpu[$key]+="$sc " killed[$key]+="$k "
      done
    done
  done
done

median() { printf '%s\n' $1 | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
anyk() { case " $1 " in *" 1 "*) echo ">";; *) echo " ";; esac; }
echo "rounds: $rounds (interleaved); medians; hook CPU and RSS from wait4 around each hook,"
echo "start CPU = runc (or actk-runtime + runc) and all it waited for; '>' = a hook was killed"
echo "(prlimit: 2 GiB address space, 120 s CPU) or failed, figures are what it had spent"
for b in "${builds[@]}"; do
  name=${b%%=*}
  echo
  echo "== $name (${b#*=})"
  printf '%-8s %-7s %12s %12s %12s   %s\n' path class "hook CPU s" "hook RSS MB" "start CPU s" "ratios to plain: hook CPU, hook RSS, start CPU"
  for via in hook runtime; do
    p="$name $via plain"
    pc=$(median "${hcpu[$p]}") pr=$(median "${hrss[$p]}") ps=$(median "${scpu[$p]}")
    for c in "${classes[@]}"; do
      key="$name $via $c"
      hc=$(median "${hcpu[$key]}") hr=$(median "${hrss[$key]}") sc=$(median "${scpu[$key]}") k=$(anyk "${killed[$key]}")
      awk -v via="$via" -v c="$c" -v k="$k" -v hc="$hc" -v hr="$hr" -v sc="$sc" -v pc="$pc" -v pr="$pr" -v ps="$ps" 'BEGIN {
        printf "%-8s %-7s %s%11.4f %s%11.1f %s%11.4f   %s%.1fx  %s%.1fx  %s%.1fx\n", via, c, k, hc, k, hr/1024, k, sc,
          k, (pc > 0 ? hc/pc : 0), k, (pr > 0 ? hr/pr : 0), k, (ps > 0 ? sc/ps : 0) }'
    done
  done
done
