#!/usr/bin/env bash
# critest (cri-tools' CRI validation suite) on containerd 2.1 with actk-runtime as the runc
# shim's runtime binary, compared test by test with the same suite on the same containerd with
# plain runc (issue 25).
#
# - critest: built once from the sigs.k8s.io/cri-tools module zip (the Go module proxy; critest
#   is a Go test binary, `go test -c ./cmd/critest`) at CRITEST_VERSION (default v1.34.0, the
#   crictl the CRI tests use; the proxy serves no v1.32/v1.33, the CRI of containerd 2.1 is
#   k8s.io/cri-api v0.32: v1.34's tests use nothing newer than the fields containerd 2.1 serves).
# - containerd 2.1 from Debian forky (scripts/k8s/fetch-forky.sh), started by this script in a
#   network (and IPC) namespace of its own with its own root, state and sockets; runc's shim runs runc
#   (pass `runc`) or actk-runtime (pass `actk`, or `actk-req` with NVIDIA_VISIBLE_DEVICES=0
#   added to every bundle by ../runc-bats/with-request.sh) as its BinaryName.
# - images: critest pulls its images from registry.k8s.io and gcr.io, which this machine cannot
#   reach. A `registry` (github.com/distribution/distribution/v3, built from the module proxy)
#   listens on 127.0.0.1:5000 inside the network namespace, containerd's hosts.toml makes it the
#   mirror of both, and offline stand-ins are pushed to it under the same repository names:
#   busybox from the host's busybox-static (the image layout of scripts/k8s/base-images.sh), the
#   user images of cri-tools' images/build (USER 1002, www-data, 1003:1004, www-data:1004, the
#   predefined-group image), and the tagged test images (test-image-tag, -latest, -1..3, -tags).
#   The digest-pinned image cannot be rebuilt with its digest; nginx and hostnet-nginx are
#   not stood in for (the networking tests are not run): see SKIP.
#   busybox-static lacks two applets the specs call (pgrep, ipcs): standin.c provides them.
# - the run: FOCUS / SKIP (ginkgo regular expressions; defaults below) keep the parts about the
#   runtime: container lifecycle, exec/attach/logs, mounts and propagation, security context,
#   pod sandboxes, multiple containers, idempotence; networking, port forwarding, image
#   management, AppArmor and SELinux (nothing actk-runtime touches, and needing images or
#   kernel features this VM lacks) are left out.
# A difference from the baseline not in allow.tsv is run again (RETRIES, both runtimes) and
# counts only when it stays. Output: $OUT (default target/conformance/critest): the ginkgo JSON
# report and log of each pass, results, summary.txt. Exit 0 when no unexplained difference.
#
# Env: ACTK_BIN_DIR (default target/debug) or ACTK_RUNTIME and ACTK_HOOK, ACTK_CLI, PASSES
# (default "runc actk actk-req"), FOCUS, SKIP, RETRIES (default 1), ACTK_CONFORMANCE_CACHE.
# Needs root, go, jq, curl, unshare, ip, busybox-static.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
export PATH=$PATH:/usr/local/go/bin:/usr/sbin:/sbin
die() { echo "critest: $*" >&2; exit 2; }

critest_version=${CRITEST_VERSION:-v1.34.0}
registry_version=v3.0.0
FOCUS=${FOCUS:-'\[k8s.io\] (Container|PodSandbox|Security Context|Streaming|Multiple Containers|Idempotence|Runtime info)'}
SKIP=${SKIP:-'[Pp]ort ?[Ff]orward|AppArmor|SELinux|[Nn]etworking|DNS|[Hh]ost[Nn]et|[Ii]mage [Mm]anager|digest|should support network'}
PASSES=${PASSES:-runc actk actk-req}
RETRIES=${RETRIES:-1}
OUT=${OUT:-$repo/target/conformance/critest}
bin_dir=${ACTK_BIN_DIR:-$repo/target/debug}
actk_runtime=${ACTK_RUNTIME:-$bin_dir/actk-runtime}
actk_hook=${ACTK_HOOK:-$bin_dir/actk-hook}
actk_cli=${ACTK_CLI:-$repo/target/debug/actk}
cache_root=${ACTK_CONFORMANCE_CACHE:-/var/cache/actk/conformance}
cache=$cache_root/critest-$critest_version-h4

# --------------------------------------------------------------------------------- inside
# `__inner WORK`: in the run's own network and mount namespaces (see the bottom of the file).
if [ "${1:-}" = __inner ]; then
  work=$2
  ip link set lo up
  forky=$(cat "$work/forky")
  # The registry, and the stand-ins pushed to it.
  cat >"$work/registry.yml" <<EOF
version: 0.1
log: {level: warn}
storage:
  filesystem: {rootdirectory: $work/registry}
  delete: {enabled: true}
http:
  addr: 127.0.0.1:5000
EOF
  "$cache/bin/registry" serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
  echo $! >"$work/registry.pid"
  for _ in $(seq 100); do curl -fsS http://127.0.0.1:5000/v2/ >/dev/null 2>&1 && break; sleep 0.1; done
  curl -fsS http://127.0.0.1:5000/v2/ >/dev/null || die "the registry did not start: $(cat "$work/registry.log")"
  # push LAYOUT_DIR REPO TAG: an OCI image layout's one manifest, with its blobs.
  push() {
    local dir=$1 repo=$2 tag=$3 man d loc
    man=$(jq -r '.manifests[0].digest' "$dir/index.json")
    for d in $(jq -r '.config.digest, .layers[].digest' "$dir/blobs/sha256/${man#sha256:}"); do
      curl -fsS -o /dev/null -I "http://127.0.0.1:5000/v2/$repo/blobs/$d" 2>/dev/null && continue
      loc=$(curl -fsS -D - -o /dev/null -X POST "http://127.0.0.1:5000/v2/$repo/blobs/uploads/" | awk -F': ' 'tolower($1) == "location" {print $2}' | tr -d '\r')
      case $loc in http*) ;; *) loc=http://127.0.0.1:5000$loc ;; esac
      case $loc in *\?*) loc="$loc&digest=$d" ;; *) loc="$loc?digest=$d" ;; esac
      curl -fsS -o /dev/null -X PUT -H 'Content-Type: application/octet-stream' --data-binary "@$dir/blobs/sha256/${d#sha256:}" "$loc"
    done
    curl -fsS -o /dev/null -X PUT -H 'Content-Type: application/vnd.oci.image.manifest.v1+json' \
      --data-binary "@$dir/blobs/sha256/${man#sha256:}" "http://127.0.0.1:5000/v2/$repo/manifests/$tag"
  }
  while read -r ref dir; do
    host=${ref%%/*} rest=${ref#*/}
    push "$cache/images/$dir" "${rest%:*}" "${rest##*:}" || die "pushing $ref"
  done <"$cache/images/refs"
  # containerd's mirrors: both registries the suite names resolve to the local one.
  for h in registry.k8s.io gcr.io; do
    mkdir -p "$work/certs.d/$h"
    printf 'server = "https://%s"\n[host."http://127.0.0.1:5000"]\n  capabilities = ["pull", "resolve"]\n' "$h" >"$work/certs.d/$h/hosts.toml"
  done
  mkdir -p "$work/cni"
  # Pods get a network of their own (critest's pods are not host-network): a bridge with
  # host-local addresses, inside this run's network namespace, so nothing of the host's changes
# (containerd adds the loopback network itself).
  cat >"$work/cni/10-critest.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "actk-critest", "plugins": [
  {"type": "bridge", "bridge": "critest0", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.99.0.0/16"}]], "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": "$work/cni-ipam"}}]}
EOF

  # one pass: containerd with the pass's runtime binary, then critest (FOCUS/SKIP, or $3 for a rerun)
  run_pass() {
    local p=$1 focus=$2 report=$3 log=$4 d=$work/c-$p
    rm -rf "$d"
    mkdir -p "$d"
    cat >"$d/config.toml" <<EOF
version = 3
root = "$d/root"
state = "$d/state"
[grpc]
  address = "$d/c.sock"
[ttrpc]
  address = "$d/c.sock.ttrpc"
[debug]
  address = "$d/debug.sock"
[plugins.'io.containerd.internal.v1.opt']
  path = "$d/opt"
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "$work/certs.d"
[plugins.'io.containerd.cri.v1.runtime']
  # Root here lacks CAP_SYS_RESOURCE: runc cannot lower oom_score_adj below its own.
  restrict_oom_score_adj = true
  enable_cdi = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['/usr/lib/cni']
    conf_dir = "$work/cni"
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = 'io.containerd.runc.v2'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = "$work/bin/$p"
      SystemdCgroup = false
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
EOF
    PATH=$forky/usr/bin:$PATH "$forky/usr/bin/containerd" --config "$d/config.toml" >"$d/containerd.log" 2>&1 &
    local cpid=$!
    for _ in $(seq 300); do [ -S "$d/c.sock" ] && break; sleep 0.2; done
    sleep 1
    (cd "$work" && timeout -k 10 "${CRITEST_TIMEOUT:-3000}" "$cache/bin/critest" \
      --runtime-endpoint "unix://$d/c.sock" --image-endpoint "unix://$d/c.sock" \
      --ginkgo.focus "$focus" --ginkgo.skip "$SKIP" --ginkgo.no-color \
      --ginkgo.json-report "$report" >"$log" 2>&1) || true
    # Pods first, so their shims and mounts go with them.
    kill "$cpid" 2>/dev/null || true
    wait "$cpid" 2>/dev/null || true
    for s in $(pgrep -f "containerd-shim-runc-v2 .*-address $d/c.sock" || true); do kill -9 "$s" 2>/dev/null || true; done
    awk -v d="$d" 'index($2, d "/") == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  }
  for p in $INNER_PASSES; do
    echo "critest: pass $p ($(cat "$work/bin/$p.what"))" >&2
    start=$(date +%s)
    run_pass "$p" "$FOCUS" "$OUT/$p.json" "$OUT/$p.log"
    echo $(($(date +%s) - start)) >"$OUT/$p.seconds"
  done
  # Reruns asked for by the comparison (a file of "pass<TAB>regex<TAB>report" lines).
  if [ -f "$work/reruns" ]; then
    while IFS=$'\t' read -r p re rep; do
      echo "critest: $p again: $re" >&2
      run_pass "$p" "$re" "$rep" "$OUT/rerun-$p.log"
    done <"$work/reruns"
  fi
  kill "$(cat "$work/registry.pid")" 2>/dev/null || true
  exit 0
fi

# --------------------------------------------------------------------------------- outside
[ "$(id -u)" = 0 ] || die "run as root (containerd and its containers run as root)"
for t in go jq curl unshare ip gcc flock; do
  command -v "$t" >/dev/null || die "$t not found (scripts/install-deps.sh installs what this needs)"
done
for b in "$actk_runtime" "$actk_hook" "$actk_cli"; do
  [ -x "$b" ] || die "$b not found (cargo build --workspace --bins)"
done
runc_bin=${RUNC:-$(command -v runc)} || die "runc not found"
forky=$("$repo/scripts/k8s/fetch-forky.sh" | tail -n 1)/root
[ -x "$forky/usr/bin/containerd" ] || die "containerd 2 not found under $forky (scripts/k8s/fetch-forky.sh)"

# ------------------------------------------------ critest, the registry and the images (cached)
mkdir -p "$cache_root"
exec 8>"$cache_root/.critest-$critest_version.lock"
flock 8
if [ ! -e "$cache/complete" ]; then
  echo "critest: building critest $critest_version, registry $registry_version and the stand-in images into $cache (once)" >&2
  rm -rf "$cache.tmp"
  mkdir -p "$cache.tmp/bin" "$cache.tmp/images"
  gotmp=$(mktemp -d)
  mod=$(cd "$gotmp" && GOFLAGS=-mod=mod GO111MODULE=on go mod download -json "sigs.k8s.io/cri-tools@$critest_version" | jq -r .Dir)
  [ -d "$mod/cmd/critest" ] || die "the cri-tools $critest_version module has no cmd/critest ($mod)"
  cp -r "$mod" "$cache.tmp/src"
  chmod -R u+w "$cache.tmp/src"
  rm -rf "$cache.tmp/src/vendor"
  (cd "$cache.tmp/src" && CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local go test -c -o "$cache.tmp/bin/critest" ./cmd/critest) >&2
  (cd "$gotmp" && GOBIN=$cache.tmp/bin CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local \
    go install "github.com/distribution/distribution/v3/cmd/registry@$registry_version") >&2
  rm -rf "$gotmp" "$cache.tmp/src"
  # The stand-ins: one busybox tree (host busybox-static, cri-tools' users and groups), imaged
  # with a USER or a marker file as cri-tools' images/build does.
  bb=$cache.tmp/busybox
  mkdir -p "$bb"/{bin,etc,home,root,tmp,proc,sys,dev,var/www}
  chmod 1777 "$bb/tmp"
  cp /bin/busybox "$bb/bin/busybox"
  # Hard links, as in the busybox image: a masked /bin/ls (the MaskedPaths spec) must not mask
  # the file every applet is.
  for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln "$bb/bin/busybox" "$bb/bin/$a"; done
  # The busybox 1.29 image's pgrep and ipcs, which Debian's busybox-static leaves out.
  gcc -static -Os -s -o "$cache.tmp/standin" "$here/standin.c"
  mkdir -p "$bb/usr/bin"
  cp "$cache.tmp/standin" "$bb/usr/bin/pgrep"
  ln "$bb/usr/bin/pgrep" "$bb/usr/bin/ipcs"
  printf '%s\n' root:x:0:0:root:/root:/bin/sh www-data:x:33:33:www-data:/var/www:/bin/false \
    default-user:x:1000:1000::/home/default-user:/bin/sh nobody:x:65534:65534:nobody:/home:/bin/false >"$bb/etc/passwd"
  printf '%s\n' root:x:0: www-data:x:33: default-user:x:1000: group-defined-in-image:x:50000:default-user \
    users:x:100: nogroup:x:65534: >"$bb/etc/group"
  n=0
  image() {
    # image REF [oci-image.sh options...]: writes the layout dir and a line of images/refs
    local ref=$1
    shift
    n=$((n + 1))
    [ $# -gt 0 ] || set -- --cmd '["/bin/sh"]'
    "$repo/scripts/k8s/oci-image.sh" "$bb" "$ref" "$cache.tmp/images/$n.tar" "$@" >/dev/null
    mkdir -p "$cache.tmp/images/$n"
    tar -C "$cache.tmp/images/$n" -xf "$cache.tmp/images/$n.tar"
    rm -f "$cache.tmp/images/$n.tar"
    echo "$ref $n" >>"$cache.tmp/images/refs"
  }
  image registry.k8s.io/e2e-test-images/busybox:1.29-2
  # The sandbox image containerd pulls for every pod: the cluster's static pause.
  n=$((n + 1))
  "$repo/scripts/k8s/base-images.sh" "$cache.tmp/base" >/dev/null
  mkdir -p "$cache.tmp/images/$n"
  tar -C "$cache.tmp/images/$n" -xf "$cache.tmp/base/pause.tar"
  rm -rf "$cache.tmp/base"
  echo "registry.k8s.io/pause:3.10 $n" >>"$cache.tmp/images/refs"
  cri=gcr.io/k8s-staging-cri-tools
  for u in "user-uid:1002" "user-username:www-data" "user-uid-group:1003:1004" "user-username-group:www-data:1004" "predefined-group:1000"; do
    name=${u%%:*} user=${u#*:}
    n=$((n + 1))
    "$repo/scripts/k8s/oci-image.sh" "$bb" "$cri/test-image-$name:latest" "$cache.tmp/images/$n.tar" --cmd '["/bin/sh"]' >/dev/null
    mkdir -p "$cache.tmp/images/$n"
    tar -C "$cache.tmp/images/$n" -xf "$cache.tmp/images/$n.tar"
    rm -f "$cache.tmp/images/$n.tar"
    # USER: oci-image.sh writes no user; set it in the config and re-point the manifest.
    lay=$cache.tmp/images/$n
    man=$(jq -r '.manifests[0].digest' "$lay/index.json")
    cfg=$(jq -r '.config.digest' "$lay/blobs/sha256/${man#sha256:}")
    jq -c --arg u "$user" '.config.User = $u' "$lay/blobs/sha256/${cfg#sha256:}" >"$lay/cfg.json"
    c2=sha256:$(sha256sum "$lay/cfg.json" | cut -d' ' -f1)
    mv "$lay/cfg.json" "$lay/blobs/sha256/${c2#sha256:}"
    jq -c --arg d "$c2" --argjson s "$(stat -c %s "$lay/blobs/sha256/${c2#sha256:}")" '.config.digest = $d | .config.size = $s' \
      "$lay/blobs/sha256/${man#sha256:}" >"$lay/man.json"
    m2=sha256:$(sha256sum "$lay/man.json" | cut -d' ' -f1)
    mv "$lay/man.json" "$lay/blobs/sha256/${m2#sha256:}"
    jq -c --arg d "$m2" --argjson s "$(stat -c %s "$lay/blobs/sha256/${m2#sha256:}")" '.manifests[0].digest = $d | .manifests[0].size = $s' \
      "$lay/index.json" >"$lay/index.new" && mv "$lay/index.new" "$lay/index.json"
    echo "$cri/test-image-$name:latest $n" >>"$cache.tmp/images/refs"
  done
  for t in test-image-latest:latest test-image-tag:test test-image-tag:all test-image-1:latest test-image-2:latest test-image-3:latest; do
    # A marker file per image (cri-tools' image-test: ADD ${TEST}), so that each is its own image.
    : >"$bb/${t%%:*}"
    image "$cri/$t"
    rm -f "$bb/${t%%:*}"
  done
  # The e2e-test-images critest runs as programs (nginx, httpd, nonewprivs): standin.c says
  # what each does.
  mkdir -p "$bb/usr/sbin" "$bb/var/run"
  cp "$cache.tmp/standin" "$bb/usr/sbin/nginx"
  image registry.k8s.io/e2e-test-images/nginx:1.14-2 --entrypoint '["/usr/sbin/nginx"]'
  rm -f "$bb/usr/sbin/nginx"
  mkdir -p "$bb/usr/local/apache2/bin"
  cp "$cache.tmp/standin" "$bb/usr/local/apache2/bin/httpd"
  image registry.k8s.io/e2e-test-images/httpd:2.4.39-4 --entrypoint '["/usr/local/apache2/bin/httpd"]'
  rm -rf "$bb/usr/local/apache2"
  mkdir -p "$bb/usr/local/bin"
  cp "$cache.tmp/standin" "$bb/usr/local/bin/nnp"
  chmod 4755 "$bb/usr/local/bin/nnp"
  image registry.k8s.io/e2e-test-images/nonewprivs:1.3 --entrypoint '["/usr/local/bin/nnp"]'
  rm -rf "$bb/usr/local/bin" "$cache.tmp/standin"
  : >"$bb/same-image"
  for t in 1 2 3; do image "$cri/test-image-tags:$t"; done
  rm -f "$bb/same-image"
  rm -rf "$bb"
  touch "$cache.tmp/complete"
  rm -rf "$cache"
  mv "$cache.tmp" "$cache"
fi
flock -u 8

# ------------------------------------------------------------ the run's world
rm -rf "$OUT"
mkdir -p "$OUT"
work=$(mktemp -d /tmp/actk-critest.XXXXXX)
chmod 755 "$work"
trap 'awk -v d="$work" '"'"'index($2, d "/") == 1 {print $2}'"'"' /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done; rm -rf --one-file-system "$work"' EXIT
echo "$forky" >"$work/forky"
sh "$repo/fixtures/prepare.sh" nvidia-dgx-h100 "$work/fixture" >/dev/null
mkdir -p "$work/cdi" "$work/bin"
"$actk_cli" cdi generate --root "$work/fixture" --vendor nvidia --ldcache-hook "$actk_hook" --output "$work/cdi" >/dev/null
cat >"$work/config.toml" <<EOF
runtimes = ["$runc_bin"]
spec_dirs = ["$work/cdi"]
hooks_dirs = []
root = "$work/fixture"
log_file = "$OUT/actk-runtime.log"
hook_path = "$actk_hook"
EOF
peer=
if [[ " $PASSES " == *" ref-req "* ]]; then
  peer=$("$repo/tests/peers/cdi-oracle/build.sh" | tail -1)/cdi-oracle
fi
# The runtime binary of each pass, as the shim calls it (BinaryName).
wrapper() {
  local p=$1 what=$2
  shift 2
  { echo '#!/bin/sh'; printf 'exec env'; printf ' %q' "$@"; echo ' "$@"'; } >"$work/bin/$p"
  chmod +x "$work/bin/$p"
  echo "$what" >"$work/bin/$p.what"
}
for p in $PASSES; do
  case $p in
    runc) wrapper runc "plain runc" "$runc_bin" ;;
    actk) wrapper actk "actk-runtime, no requests" "ACTK_CONFIG=$work/config.toml" "$actk_runtime" ;;
    actk-req) wrapper actk-req "actk-runtime, NVIDIA_VISIBLE_DEVICES=0 in every bundle" "ACTK_CONFIG=$work/config.toml" \
      "ACTK_REQUEST_RUNTIME=$actk_runtime" "$here/../runc-bats/with-request.sh" ;;
    runc-req) wrapper runc-req "plain runc, the same request" "ACTK_REQUEST_RUNTIME=$runc_bin" "$here/../runc-bats/with-request.sh" ;;
    ref-req) wrapper ref-req "plain runc, the request and nvidia.com/gpu=0 injected by the CDI reference library" \
      "ACTK_REQUEST_RUNTIME=$runc_bin" "ACTK_REQUEST_CDI_INJECT=$peer" "ACTK_REQUEST_SPEC_DIR=$work/cdi" "$here/../runc-bats/with-request.sh" ;;
    *) die "unknown pass $p (runc, runc-req, ref-req, actk, actk-req)" ;;
  esac
done
# Its own IPC namespace too: the HostIpc specs make a System V segment (ipcmk) in critest's
# namespace and never remove it.
inner() { INNER_PASSES=$1 OUT=$OUT FOCUS=$FOCUS SKIP=$SKIP unshare --net --mount --ipc --propagation private "$0" __inner "$work"; }
inner "$PASSES"

# ginkgo JSON report -> "name<TAB>passed|failed|skipped" lines
results() {
  jq -r '.[0].SpecReports[]? | select(.LeafNodeType == "It" and (.NumAttempts // 0) > 0)
    | [([.ContainerHierarchyTexts[]?, .LeafNodeText] | join(" ")), (if .State == "passed" then "pass" elif .State == "skipped" or .State == "pending" then "skip" else "fail" end)]
    | @tsv' "$1" 2>/dev/null | LC_ALL=C sort
}
for p in $PASSES; do
  [ -s "$OUT/$p.json" ] || die "pass $p produced no report (see $OUT/$p.log)"
  results "$OUT/$p.json" >"$OUT/$p.results"
done

# --------------------------------------------------------------------------- comparison
set +e +o pipefail
summary=$OUT/summary.txt
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }
count() { awk -F'\t' -v s="$2" '$2 == s' "$OUT/$1.results" | wc -l; }
first=$(echo "$PASSES" | awk '{print $1}')
say "critest $critest_version on containerd $("$forky/usr/bin/containerd" --version | awk '{print $3}'), $(awk 'END {print NR}' "$OUT/$first.results") specs run (focus: $FOCUS; skip: $SKIP)"
say "$(printf '%-10s %6s %6s %6s %8s' pass passed failed skipped seconds)"
for p in $PASSES; do
  say "$(printf '%-10s %6d %6d %6d %8d' "$p" "$(count "$p" pass)" "$(count "$p" fail)" "$(count "$p" skip)" "$(cat "$OUT/$p.seconds")")"
done
allow=$here/allow.tsv
allowed() { awk -F'\t' -v k="$1" '!/^#/ && NF >= 2 && $1 == k {print $2; exit}' "$allow"; }
# The failure message of pass $1's spec $2.
detail() {
  jq -r --arg n "$2" '.[0].SpecReports[]? | select(([.ContainerHierarchyTexts[]?, .LeafNodeText] | join(" ")) == $n)
    | .Failure.Message // empty' "$OUT/$1.json" 2>/dev/null | head -20 | sed 's/^/      /'
}
unexplained=0
for p in $PASSES; do
  case $p in runc | runc-req | ref-req) continue ;; esac
  base=runc
  if [ "$p" = actk-req ]; then
    for b in ref-req runc-req; do [[ " $PASSES " == *" $b "* ]] && { base=$b; break; }; done
  fi
  [[ " $PASSES " == *" $base "* ]] || { say "$p: no baseline pass $base ran"; continue; }
  n_diff=0 n_allowed=0 n_flaky=0 n_bad=0
  while IFS=$'\t' read -r key want got; do
    n_diff=$((n_diff + 1))
    reason=$(allowed "$key")
    if [ -n "$reason" ]; then
      n_allowed=$((n_allowed + 1))
      say "  allowed [$p] $key: $base $want, $p $got -- $reason"
      continue
    fi
    flaky=
    for ((i = 0; i < RETRIES; i++)); do
      # Unanchored at the start: ginkgo's text of a spec begins before "[k8s.io]".
      re="$(printf '%s' "$key" | sed 's/[][\.*^$()+?{}|/]/\\&/g')\$"
      : >"$work/reruns"
      printf '%s\t%s\t%s\n' "$base" "$re" "$work/rerun-$base.json" "$p" "$re" "$work/rerun-$p.json" >>"$work/reruns"
      inner ""
      w=$(results "$work/rerun-$base.json" | awk -F'\t' -v k="$key" '$1 == k {print $2}')
      g=$(results "$work/rerun-$p.json" | awk -F'\t' -v k="$key" '$1 == k {print $2}')
      echo "critest: again: $base $w, $p $g" >&2
      rm -f "$work/reruns"
      if [ -n "$w" ] && [ "$w" = "$g" ]; then flaky=$w; break; fi
    done
    if [ -n "$flaky" ]; then
      n_flaky=$((n_flaky + 1))
      say "  flaky  [$p] $key: $base $want, $p $got; both $flaky when run again"
      continue
    fi
    n_bad=$((n_bad + 1))
    say "  DIFFERS [$p] $key: $base $want, $p $got"
    detail "$p" "$key" | tee -a "$summary"
  done < <(LC_ALL=C join -t $'\t' "$OUT/$base.results" "$OUT/$p.results" | awk -F'\t' '$2 != $3')
  missing=$(LC_ALL=C comm -3 <(cut -f1 "$OUT/$base.results") <(cut -f1 "$OUT/$p.results") | wc -l)
  if [ "$missing" != 0 ]; then
    say "  DIFFERS [$p] $missing specs ran in only one of $base and $p"
    n_bad=$((n_bad + missing))
  fi
  say "$p vs $base: $n_diff differing results: $n_allowed allowed, $n_flaky flaky (agreed when run again), $n_bad unexplained"
  unexplained=$((unexplained + n_bad))
done
say "unexplained differences: $unexplained"
[ "$unexplained" = 0 ]
