#!/usr/bin/env bash
# The linker of the static shims (scripts/build-release.sh passes it as `-C linker=` for the shim
# target only; issue 31): cc with rust-lld, and the functions a container start runs laid out
# together at the front of .text.
#
# Why: a create runs about 500 functions spread over the 3.5 MB of actk-runtime's .text. Each
# text page fault maps the 64 KiB around it (the kernel's fault-around), so a create took about
# 40 text faults over 38 distinct 64 KiB windows. Packed, the same functions fit in 15 windows:
# 22 fewer faults, 1.4 MiB less RSS and 0.07-0.10 ms less CPU per create on the project's VM
# (docs/performance.md, "Hot text").
#
# How: lld's --symbol-ordering-file places the listed symbols' sections (rustc emits one section
# per function) first, in the list's order. The list is crates/<crate>/hot-text.txt, written by
# scripts/hot-text.sh from callgrind runs of the shim. Its symbols carry the hash of a Rust
# build (legacy mangling `..17h<16 hex>E`, v0's crate disambiguators `Cs<base62>_`); a new
# compiler, a dependency update or a version bump changes those hashes. So the list is matched
# against the symbols the objects being linked define: a listed name found as written is placed
# as it is; one not found is matched with its hashes left out, which places every instance of
# that function (a generic one may have several), and a name matching nothing is dropped. The
# binary is correct whatever the list says; only its layout depends on it. Each link writes
# what it matched to <target dir>/<profile>/<binary>.hot-text (scripts/build-release.sh prints
# it; regenerate the list when "as written" falls well below the listed count).
#
# Args: those rustc gives a cc linker. Env: ACTK_GCC_LD, the toolchain's gcc-ld directory (default:
# the one of `rustc` on PATH); ACTK_HOT_TEXT_DIR, the repository root (the lists
# are read from it); unset, or no list for the binary being linked: cc with rust-lld, unordered.
# Without rust-lld next to rustc (gcc-ld/ld.lld of the toolchain): plain cc, unordered.
set -euo pipefail

out=
objs=()
# The arguments rustc gives, with those of a response file (`@FILE`, one per line, which rustc
# writes when the command line is too long) read for the output and the objects; cc reads the
# file itself.
args=()
for a in "$@"; do
  if [ "${a#@}" != "$a" ] && [ -f "${a#@}" ]; then
    mapfile -t more <"${a#@}"
    args+=("${more[@]}")
  else
    args+=("$a")
  fi
done
prev=
for a in "${args[@]}"; do
  [ "$prev" = -o ] && out=$a
  case $a in *.o) objs+=("$a") ;; esac
  prev=$a
done

# deps/actk_runtime-<hash> -> actk-runtime; its report beside the binary, written by every
# link (a link that does not order says why), so that it never describes an earlier link.
name=${out##*/}
name=${name%-*}
name=${name//_/-}
report=
[ -z "$out" ] || report=$(dirname "$(dirname "$out")")/$name.hot-text
unordered() { # WHY: link with "$@" left as rustc gave them
  [ -z "$report" ] || echo "hot text of $name: not ordered ($1)" >"$report"
}

gcc_ld=${ACTK_GCC_LD:-}
if [ -z "$gcc_ld" ] && command -v rustc >/dev/null; then
  gcc_ld=$(rustc --print sysroot)/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/bin/gcc-ld
fi
if [ ! -x "$gcc_ld/ld.lld" ]; then
  unordered "no rust-lld (gcc-ld/ld.lld of the toolchain): linked by cc's own linker"
  exec cc "$@"
fi
lld=(-fuse-ld=lld "-B$gcc_ld")

list=${ACTK_HOT_TEXT_DIR:+$ACTK_HOT_TEXT_DIR/crates/$name/hot-text.txt}
if [ -z "$out" ] || [ -z "$list" ] || [ ! -f "$list" ] || [ ${#objs[@]} = 0 ]; then
  unordered "no list ${list:-(ACTK_HOT_TEXT_DIR unset)}, or no objects"
  exec cc "${lld[@]}" "$@"
fi

order=$out.hot-text-order
# Defined functions of the objects (the LTO module holds all Rust code; libc's come from its
# archive and are listed by their plain names, which never change). A failing nm fails the
# link, with its message.
nm --defined-only -P "${objs[@]}" | awk '$2 ~ /^[TtWw]$/ { print $1 }' >"$order.defined"
if [ ! -s "$order.defined" ]; then
  echo "hot-text-link: nm found no functions in ${objs[*]}" >&2
  exit 1
fi
awk -v report="$report" -v list="$list" '
  function key(s) {
    sub(/17h[0-9a-f]+E$/, "", s)
    gsub(/Cs[0-9A-Za-z]+_/, "Cs_", s)
    return s
  }
  FILENAME == ARGV[1] { defined[$1] = 1; k = key($1); bykey[k] = bykey[k] " " $1; next }
  /^#/ || NF == 0 { next }
  {
    listed++
    if ($1 in defined) { if (!($1 in put)) { put[$1] = 1; print $1 }; exact++; next }
    k = key($1)
    if (k != $1 && k in bykey) {
      n = split(bykey[k], syms, " ")
      for (i = 1; i <= n; i++) if (!(syms[i] in put)) { put[syms[i]] = 1; print syms[i]; extra++ }
      bykey_hit++
      next
    }
    # Not defined by the Rust objects: a libc function (placed by its plain name) or gone.
    if (k == $1) { print $1; plain++ } else missing++
  }
  END {
    printf "hot text of %s: %d listed; %d found as written, %d by name without hashes (%d symbols), %d C names passed on, %d not found\n", \
      list, listed, exact, bykey_hit, extra, plain, missing > report
  }
' "$order.defined" "$list" >"$order"
rm -f "$order.defined"
exec cc "${lld[@]}" "$@" "-Wl,--symbol-ordering-file=$order" -Wl,--no-warn-symbol-ordering
