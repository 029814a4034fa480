#!/bin/sh
# The runtime as runc's integration suite calls it ($RUNC), with an accelerator request added to
# every bundle it creates: on `create`, `run` and `restore` the bundle's config.json gets
# ACTK_REQUEST_ENV (default NVIDIA_VISIBLE_DEVICES=0) appended to process.env, then the real
# runtime (ACTK_REQUEST_RUNTIME: runc or actk-runtime) is exec'd with the arguments unchanged.
# Every other call goes straight through. A config.json that jq cannot edit (a test that breaks
# it on purpose) is left as it is, so the runtime reports what it would have reported.
#
# With ACTK_REQUEST_CDI_INJECT (the CDI reference oracle, tests/peers/cdi-oracle) the bundle
# then also gets the CDI devices ACTK_REQUEST_CDI_NAMES (default nvidia.com/gpu=0) from the
# spec directory ACTK_REQUEST_SPEC_DIR, injected by the reference library as a CDI-aware engine
# does before it calls runc: the `ref-req` baseline of the request passes. An injection that
# fails fails the call (exit 1, the reason on stderr).
#
# Why a wrapper and not a change to the suite: the tests rewrite config.json many times
# (update_config) after `runc spec`; the request must be there when the runtime reads it.
set -u
real=${ACTK_REQUEST_RUNTIME:?ACTK_REQUEST_RUNTIME names the runtime to run}
req=${ACTK_REQUEST_ENV:-NVIDIA_VISIBLE_DEVICES=0}

# Find the subcommand: the first word that is not a global option or a global option's value
# (runc 1.1's global options with a value: --root, --log, --log-format, --criu, --rootless).
sub=
bundle=.
skip=0
after_sub=0
for a in "$@"; do
  if [ "$skip" = 1 ]; then
    skip=0
    [ "$after_sub" = 2 ] && bundle=$a && after_sub=1
    continue
  fi
  if [ "$after_sub" = 0 ]; then
    case $a in
      --root | --log | --log-format | --criu | --rootless) skip=1 ;;
      -*) ;;
      *) sub=$a; after_sub=1 ;;
    esac
  else
    case $a in
      --bundle | -b) skip=1; after_sub=2 ;;
      --bundle=*) bundle=${a#--bundle=} ;;
      -b=*) bundle=${a#-b=} ;;
    esac
  fi
done

case $sub in
  create | run | restore)
    cfg=$bundle/config.json
    if [ -f "$cfg" ] && jq --arg e "$req" '.process.env = ((.process.env // []) + [$e])' "$cfg" >"$cfg.actk-req" 2>/dev/null; then
      # Same inode, same mode: only the content changes (cat, not mv).
      cat "$cfg.actk-req" >"$cfg"
    fi
    rm -f "$cfg.actk-req"
    if [ -n "${ACTK_REQUEST_CDI_INJECT:-}" ] && [ -f "$cfg" ]; then
      # shellcheck disable=SC2086
      "$ACTK_REQUEST_CDI_INJECT" inject "${ACTK_REQUEST_SPEC_DIR:?}" "$cfg" ${ACTK_REQUEST_CDI_NAMES:-nvidia.com/gpu=0} || exit 1
    fi
    ;;
esac
exec "$real" "$@"
