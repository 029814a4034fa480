#!/usr/bin/env bash
# The demo of `make demo`: start a container through actk-runtime and show what it sees.
#
# 1. Host root: `/` when this host has accelerators (/proc/driver/nvidia, /dev/neuron*, /dev/kfd,
#    /dev/accel/*); otherwise a simulated NVIDIA DGX H100 node (8 GPUs) made by
#    `fixtures/prepare.sh nvidia-dgx-h100 /var/lib/actk/simulated-node` (mknod'd nodes, gcc-built
#    driver libraries, a real ld.so.cache). Override with ACTK_DEMO_ROOT=DIR.
# 2. `actk list` on that root.
# 3. A busybox OCI bundle run by `actk-runtime run` (actk-runtime stands where runc would),
#    asking for devices with the usual variables; the container prints its devices, env and the
#    driver libraries it got.
# 4. The same through Docker (`docker run --runtime actk-demo`) when dockerd answers.
# Nothing global is changed except /var/lib/actk/ (demo state) and, for step 4 only, a runtime
# `actk-demo` in /etc/docker/daemon.json that is removed again at the end.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
bin=${ACTK_BIN_DIR:-$repo/target/debug}
state=/var/lib/actk
demo=$state/demo
[ "$(id -u)" = 0 ] || { echo "demo: run as root (mknod, runc)" >&2; exit 1; }
for b in actk actk-runtime; do
  [ -x "$bin/$b" ] || { echo "demo: $bin/$b is missing; build with 'cargo build --workspace --bins'" >&2; exit 1; }
done

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

# --- 1. host root -------------------------------------------------------------------------------
has_accelerators() {
  [ -e /proc/driver/nvidia/version ] && return 0
  compgen -G '/dev/neuron[0-9]*' >/dev/null && return 0
  [ -e /dev/kfd ] && return 0
  compgen -G '/dev/accel/accel[0-9]*' >/dev/null && return 0
  return 1
}
if [ -n "${ACTK_DEMO_ROOT:-}" ]; then
  root=$ACTK_DEMO_ROOT
  say "Host root: $root (ACTK_DEMO_ROOT)"
elif has_accelerators; then
  root=/
  say "Host root: / (this host has accelerators)"
else
  root=$state/simulated-node
  say "This host has no accelerators: preparing a simulated NVIDIA DGX H100 node in $root"
  rm -rf "$root"
  "$repo/fixtures/prepare.sh" nvidia-dgx-h100 "$root"
fi

# What to ask for: on the simulated node GPUs 1 and 3; on a real host every device of each vendor
# present.
requests=()
if [ "$root" != / ]; then
  requests+=(NVIDIA_VISIBLE_DEVICES=1,3)
else
  [ -e /proc/driver/nvidia/version ] && requests+=(NVIDIA_VISIBLE_DEVICES=all)
  compgen -G '/dev/neuron[0-9]*' >/dev/null && requests+=(AWS_NEURON_VISIBLE_DEVICES=ALL)
  [ -e /dev/kfd ] && requests+=(AMD_VISIBLE_DEVICES=all)
  compgen -G '/dev/accel/accel[0-9]*' >/dev/null && requests+=(HABANA_VISIBLE_DEVICES=all)
fi

mkdir -p "$demo"
config=$demo/config.toml
cat >"$config" <<TOML
# actk configuration for the demo (the real one lives in /etc/actk/config.toml).
root = "$root"
runtimes = ["runc", "crun"]
TOML
export ACTK_CONFIG=$config

# --- 2. actk list -------------------------------------------------------------------------------
say "actk list --root $root"
"$bin/actk" list --root "$root"

# --- 3. a container through actk-runtime ----------------------------------------------------------
# What the container runs: its device nodes, its selection env, the driver libraries mounted in.
show='echo "-- device nodes:"; ls -l /dev | grep -E "nvidia|neuron|kfd|dri|accel" || echo "(none)";
echo "-- env:"; env | grep -E "VISIBLE|CAPABILITIES|NEURON" | sort;
echo "-- driver libraries:"; for d in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib /lib; do
  [ -d $d ] && ls $d 2>/dev/null | grep -E "^lib(nvidia|cuda|nvcuvid|nrt|amdhip|hl-)" | sed "s|^|$d/|"; done; true'

bundle=$demo/bundle
rm -rf "$bundle"
mkdir -p "$bundle/rootfs"
busybox=$(command -v busybox)
( cd "$bundle/rootfs"
  mkdir -p bin sbin usr/bin usr/sbin etc dev proc sys tmp root
  cp "$busybox" bin/busybox
  bin/busybox --list-full | while read -r a; do [ -e "$a" ] || ln -s /bin/busybox "$a"; done
  echo 'root:x:0:0:root:/root:/bin/sh' >etc/passwd )
runc spec --bundle "$bundle"
env_json=$(printf '%s\n' "PATH=/usr/sbin:/usr/bin:/sbin:/bin" "${requests[@]}" | jq -R . | jq -s .)
jq --argjson env "$env_json" --arg show "$show" \
  '.process.terminal=false | .process.args=["sh","-c",$show] | .process.env=$env | .root.readonly=false' \
  "$bundle/config.json" >"$bundle/config.json.new"
mv "$bundle/config.json.new" "$bundle/config.json"

say "runc bundle through actk-runtime: ${requests[*]:-(no request)}"
echo "\$ actk-runtime run --bundle $bundle actk-demo-$$"
"$bin/actk-runtime" run --bundle "$bundle" "actk-demo-$$"

# --- 4. the same through Docker -----------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
  say "Docker: dockerd is not running; skipped (scripts/start-dockerd.sh starts it)"
  exit 0
fi
if ! docker image inspect actk-busybox:latest >/dev/null 2>&1; then
  tar -C "$bundle/rootfs" -c . | docker import - actk-busybox:latest >/dev/null
fi
# dockerd starts runtimes with its own environment, so the demo's config travels in a wrapper.
wrapper=$demo/actk-runtime
printf '#!/bin/sh\nACTK_CONFIG=%s exec %s "$@"\n' "$config" "$bin/actk-runtime" >"$wrapper"
chmod 755 "$wrapper"
cleanup() {
  "$bin/actk" runtime configure --runtime docker --name actk-demo --remove >/dev/null || true
  kill -HUP "$(cat /var/run/docker.pid)" 2>/dev/null || true
}
trap cleanup EXIT
"$bin/actk" runtime configure --runtime docker --name actk-demo --path "$wrapper"
kill -HUP "$(cat /var/run/docker.pid)"
for _ in $(seq 1 50); do docker info --format '{{json .Runtimes}}' | grep -q '"actk-demo"' && break; sleep 0.2; done
args=()
for r in "${requests[@]}"; do args+=(-e "$r"); done
say "docker run --rm --runtime actk-demo ${args[*]} actk-busybox sh -c ..."
docker run --rm --network none --runtime actk-demo "${args[@]}" actk-busybox:latest sh -c "$show"
