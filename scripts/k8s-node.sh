#!/usr/bin/env bash
# A real single-node Kubernetes cluster on this machine with actk deployed by its Helm chart:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd 2 and a kubelet,
# all real, all on 127.0.0.1 (the kubelet and the API server advertise the machine's own address,
# which they refuse to be loopback), pods on the host network.
#
#   scripts/k8s-node.sh up [--version V] [--root DIR] [--values FILE] [--topology-policy POLICY]
#        builds or reuses the Kubernetes binaries (version V: v1.34.4, v1.37.2, ...; default
#        $ACTK_KUBE_VERSION, else scripts/k8s/build-kube.sh's), starts the cluster (a running one
#        of another version or feature gates is taken down first), builds and imports the actk
#        image, installs the chart for a node whose devices are under DIR (default: / when this
#        host has accelerators, else the simulated DGX H100 node /var/lib/actk/simulated-node),
#        waits until every part the values enable runs and the node shows devices (allocatable
#        extended resources for the device plugin, actk.dev ResourceSlices for the DRA driver);
#        the last line is `export KUBECONFIG=...`
#   scripts/k8s-node.sh kubectl ARGS...   the matching kubectl, on this cluster (none running: says so)
#   scripts/k8s-node.sh helm ARGS...      helm, on this cluster
#   scripts/k8s-node.sh down [--purge]    stops everything; no process, mount, cgroup, socket or
#        CDI spec is left (--purge also drops the cached certificates and image tars)
# Parts of `up`, for test harnesses (crates/actk-testsupport/src/cluster.rs):
#   start [--version V] [--topology-policy POLICY]   the cluster without the chart (reused when
#                                         running with that version and feature gates)
#   install [--root DIR] [--values FILE] [--no-wait]   the actk image and `helm upgrade --install`,
#                                         then every DaemonSet of the release rolled out (Helm's
#                                         --wait cannot tell for one that rolls one pod at a time)
#   wait-allocatable                      until an extended resource is allocatable
#   wait-devices                          until the enabled parts show devices (see up)
#   restart kubelet|containerd            stop and start one component (state kept)
#   env                                   KEY=VALUE lines: paths and names of this cluster
#   status                                which components run
#
# Env: ACTK_K8S_STATE (default /var/lib/actk-k8s), ACTK_K8S_RUN (default /run/actk-k8s),
#      ACTK_KUBE_VERSION / ACTK_KUBE_CACHE (scripts/k8s/build-kube.sh), ACTK_KUBE_FEATURE_GATES
#      (`--feature-gates` of every component, e.g. DRAExtendedResource=true on 1.34; default
#      none: what the version turns on by default), ACTK_FORKY_PREFIX
#      (scripts/k8s/fetch-forky.sh), ACTK_IMAGE_PROFILE (release, default; or debug) for the image.
# One cluster per machine: every command but env/kubectl/helm holds the flock
# /run/lock/actk-k8s-cluster.lock (a caller that holds it already sets ACTK_K8S_LOCK_HELD=1).
# Facts this relies on (root without CAP_SYS_RESOURCE, cgroup v1 hybrid, no systemd, podman's
# 10.88/16): ../shared/KUBERNETES.md, summarised in docs/kubernetes.md.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
S=${ACTK_K8S_STATE:-/var/lib/actk-k8s}
R=${ACTK_K8S_RUN:-/run/actk-k8s}
LOCK=/run/lock/actk-k8s-cluster.lock
NODE_NAME=actk-node
RELEASE=actk-device-plugin
NAMESPACE=kube-system
CHART=$repo/deploy/helm/actk-device-plugin
ETCD_PORT=23790
API_PORT=6443
SERVICE_CIDR=10.96.0.0/24
SERVICE_IP=10.96.0.1
CGROUP_ROOT=actk-k8s
KC=$S/kubeconfig
SOCK=$R/containerd/containerd.sock
CDI_DIR=$R/cdi
KUBELET_DIR=$S/kubelet
# The kubelet's device manager keeps this path whatever --root-dir says (pluginapi.DevicePluginPath).
DP_DIR=/var/lib/kubelet/device-plugins
LOGS=$S/logs

say() { echo "k8s-node: $*" >&2; }
die() { echo "k8s-node: $*" >&2; exit 1; }

node_ip() {
  local ip
  ip=$(ip -4 route get 192.0.2.255 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' | head -n 1)
  [ -n "$ip" ] && [ "${ip%%.*}" != 127 ] || ip=$(ip -4 -o addr show scope global | awk '{print $4}' | cut -d/ -f1 | grep -v '^10\.88\.' | grep -v '^172\.17\.' | head -n 1)
  [ -n "$ip" ] || die "no non-loopback IPv4 address: the kubelet and kube-apiserver refuse a loopback node address"
  echo "$ip"
}

take_lock() {
  [ "${ACTK_K8S_LOCK_HELD:-}" = 1 ] && return 0
  mkdir -p "$(dirname "$LOCK")"
  exec 8>"$LOCK"
  if ! flock -n 8; then
    say "waiting for $LOCK (another cluster user on this machine)"
    flock 8
  fi
}

# Where the binaries are: found once by `start` (which builds or fetches them) and remembered in
# $S/bins for the other commands.
[ -f "$S/bins" ] && . "$S/bins"
kube_bin() {
  if [ -z "${KBIN:-}" ] || [ ! -x "$KBIN/$1" ]; then KBIN=$("$repo/scripts/k8s/build-kube.sh" | tail -n 1); fi
  echo "$KBIN/$1"
}
forky() {
  if [ -z "${FORKY:-}" ] || [ ! -x "$FORKY/usr/bin/$1" ]; then FORKY=$("$repo/scripts/k8s/fetch-forky.sh" | tail -n 1)/root; fi
  echo "$FORKY/usr/bin/$1"
}
helm_bin() {
  local h
  for h in "${ACTK_HELM:-}" "$repo/target/tools/helm"; do [ -n "$h" ] && [ -x "$h" ] && { echo "$h"; return; }; done
  if command -v helm >/dev/null; then command -v helm; return; fi
  "$repo/deploy/helm/install-helm.sh" "$repo/target/tools" >&2
  echo "$repo/target/tools/helm"
}
kubectl_() { "$(kube_bin kubectl)" --kubeconfig "$KC" "$@"; }
# `--feature-gates=...` for every component when ACTK_KUBE_FEATURE_GATES (or the running
# cluster's, remembered in $S/bins) names any.
gates_flag() {
  local g=${KGATES:-${ACTK_KUBE_FEATURE_GATES:-}}
  [ -n "$g" ] && echo "--feature-gates=$g"
  return 0
}
# The Kubernetes version of the binaries in DIR (`v1.37.2`), or `unknown`.
version_of() {
  local v
  v=$("$1/kubelet" --version 2>/dev/null | sed -n 's/^Kubernetes //p')
  echo "${v:-unknown}"
}
# For the commands a user runs against the cluster: never start a Kubernetes build or a cluster.
require_cluster() {
  running kube-apiserver && [ -f "$KC" ] && [ -n "${KBIN:-}" ] && return 0
  die "no cluster is running on this machine: scripts/k8s-node.sh up starts one"
}
ctr_() { "$(forky ctr)" --address "$SOCK" --namespace k8s.io "$@"; }

# --- processes ---------------------------------------------------------------------------------
pidfile() { echo "$R/pids/$1.pid"; }
running() {
  local f p
  f=$(pidfile "$1")
  [ -f "$f" ] || return 1
  p=$(cat "$f")
  [ -n "$p" ] && [ -d "/proc/$p" ] && grep -q -- "${2:-$1}" "/proc/$p/cmdline" 2>/dev/null
}
# launch NAME CMD...: start CMD in its own session, log to $LOGS/NAME.log, pid in $R/pids.
launch() {
  local name=$1
  shift
  mkdir -p "$R/pids" "$LOGS"
  # 8>&-: the cluster lock stays with this script, not with the daemons it starts.
  setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null 8>&- &
  echo $! >"$(pidfile "$name")"
}
# stop NAME [SECONDS]: SIGTERM, then SIGKILL after SECONDS (default 10).
stop() {
  local f p i
  f=$(pidfile "$1")
  [ -f "$f" ] || return 0
  p=$(cat "$f")
  if [ -n "$p" ] && [ -d "/proc/$p" ]; then
    kill -TERM "$p" 2>/dev/null || true
    for ((i = 0; i < ${2:-10} * 10; i++)); do [ -d "/proc/$p" ] || break; sleep 0.1; done
    if [ -d "/proc/$p" ]; then kill -KILL "$p" 2>/dev/null || true; sleep 0.2; fi
  fi
  rm -f "$f"
}
# wait_for WHAT SECONDS CMD...: until CMD succeeds.
wait_for() {
  local what=$1 secs=$2 i
  shift 2
  for ((i = 0; i < secs * 5; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  die "$what did not come up within ${secs}s (logs: $LOGS)"
}

# --- certificates and kubeconfig -----------------------------------------------------------------
pki() {
  local ip=$1 d=$S/pki
  if [ -f "$d/complete" ] && [ "$(cat "$d/complete")" = "$ip" ] && [ -f "$d/admin.crt" ]; then return; fi
  say "writing certificates for $ip"
  rm -rf "$d"
  mkdir -p "$d"
  openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 -subj /CN=actk-k8s-ca \
    -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -sha256 -subj /CN=kube-apiserver \
    -keyout "$d/apiserver.key" -out "$d/apiserver.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,IP:%s,IP:%s,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\n' \
    "$ip" "$SERVICE_IP" >"$d/apiserver.ext"
  openssl x509 -req -sha256 -days 3650 -in "$d/apiserver.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" \
    -CAcreateserial -extfile "$d/apiserver.ext" -out "$d/apiserver.crt" 2>/dev/null
  # One client certificate for every component, test and user (system:masters): the API server
  # turns anonymous access off under AlwaysAllow, so a throw-away cluster still needs a name.
  openssl req -newkey rsa:2048 -nodes -sha256 -subj "/O=system:masters/CN=actk-admin" \
    -keyout "$d/admin.key" -out "$d/admin.csr" 2>/dev/null
  printf 'extendedKeyUsage=clientAuth\n' >"$d/admin.ext"
  openssl x509 -req -sha256 -days 3650 -in "$d/admin.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" \
    -CAcreateserial -extfile "$d/admin.ext" -out "$d/admin.crt" 2>/dev/null
  openssl genrsa -out "$d/sa.key" 2048 2>/dev/null
  openssl rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
  echo "$ip" >"$d/complete"
}

kubeconfig() {
  # AlwaysAllow and one admin certificate: a throw-away test cluster on loopback, one kubeconfig
  # for every component and test.
  cat >"$KC" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: actk
    cluster:
      server: https://127.0.0.1:$API_PORT
      certificate-authority: $S/pki/ca.crt
users:
  - name: actk-admin
    user:
      client-certificate: $S/pki/admin.crt
      client-key: $S/pki/admin.key
contexts:
  - name: actk
    context: {cluster: actk, user: actk-admin}
current-context: actk
EOF
}

# --- components --------------------------------------------------------------------------------
start_control_plane() {
  local ip=$1
  if ! running etcd; then
    mkdir -p "$S/etcd"
    launch etcd "$(forky etcd)" --name actk --data-dir "$S/etcd" \
      --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
      --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
      --initial-cluster actk=http://127.0.0.1:23800 --listen-metrics-urls '' --log-level warn --unsafe-no-fsync
  fi
  wait_for etcd 30 curl -sf "http://127.0.0.1:$ETCD_PORT/health"
  if ! running kube-apiserver; then
    launch kube-apiserver "$(kube_bin kube-apiserver)" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
      --bind-address 127.0.0.1 --secure-port "$API_PORT" --advertise-address "$ip" \
      --tls-cert-file "$S/pki/apiserver.crt" --tls-private-key-file "$S/pki/apiserver.key" \
      --client-ca-file "$S/pki/ca.crt" --service-cluster-ip-range "$SERVICE_CIDR" \
      --service-account-issuer https://kubernetes.default.svc.cluster.local \
      --service-account-key-file "$S/pki/sa.pub" --service-account-signing-key-file "$S/pki/sa.key" \
      --authorization-mode AlwaysAllow --allow-privileged=true \
      --kubelet-client-certificate "$S/pki/admin.crt" --kubelet-client-key "$S/pki/admin.key" \
      --kubelet-preferred-address-types InternalIP --profiling=false --v=1 $(gates_flag)
  fi
  wait_for kube-apiserver 90 curl -sf --cacert "$S/pki/ca.crt" --cert "$S/pki/admin.crt" --key "$S/pki/admin.key" \
    "https://127.0.0.1:$API_PORT/readyz"
  if ! running kube-controller-manager; then
    launch kube-controller-manager "$(kube_bin kube-controller-manager)" --kubeconfig "$KC" \
      --bind-address 127.0.0.1 --leader-elect=false --use-service-account-credentials=false \
      --service-account-private-key-file "$S/pki/sa.key" --root-ca-file "$S/pki/ca.crt" \
      --cluster-signing-cert-file "$S/pki/ca.crt" --cluster-signing-key-file "$S/pki/ca.key" \
      --authentication-kubeconfig "$KC" --authorization-kubeconfig "$KC" --profiling=false --v=1 $(gates_flag)
  fi
  if ! running kube-scheduler; then
    launch kube-scheduler "$(kube_bin kube-scheduler)" --kubeconfig "$KC" --bind-address 127.0.0.1 \
      --leader-elect=false --authentication-kubeconfig "$KC" --authorization-kubeconfig "$KC" --profiling=false --v=1 $(gates_flag)
  fi
}

containerd_config() {
  mkdir -p "$S/containerd" "$S/cni/net.d" "$CDI_DIR" "$R/containerd"
  # A loopback-only network: the CRI reports NetworkReady; pods use the host network.
  cat >"$S/cni/net.d/10-actk-loopback.conflist" <<'EOF'
{"cniVersion": "1.0.0", "name": "actk-loopback", "plugins": [{"type": "loopback"}]}
EOF
  cat >"$S/containerd/config.toml" <<EOF
# containerd 2 for the actk test node (written by scripts/k8s-node.sh at every start).
version = 3
root = "$S/containerd/root"
state = "$R/containerd/state"

[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = "actk.local/pause:3.10"
  [plugins.'io.containerd.cri.v1.runtime']
    # root here lacks CAP_SYS_RESOURCE: runc cannot lower oom_score_adj below its own.
    restrict_oom_score_adj = true
    enable_cdi = true
    cdi_spec_dirs = ["$CDI_DIR"]
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = "$(command -v runc)"
          Root = "$R/runc"
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["/usr/lib/cni"]
      conf_dir = "$S/cni/net.d"
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
  [plugins.'io.containerd.nri.v1.nri']
    socket_path = "$R/nri/nri.sock"
    plugin_path = "$S/nri/plugins"
    plugin_config_path = "$S/nri/conf.d"
  [plugins.'io.containerd.internal.v1.opt']
    path = "$S/containerd/opt"
EOF
}

start_containerd() {
  if ! running containerd-supervisor "containerd.stop"; then
    command -v runc >/dev/null || die "runc not found (scripts/install-deps.sh installs it)"
    containerd_config
    rm -f "$R/containerd.stop"
    # Like systemd's Restart=always for containerd.service: actk's node setup restarts
    # containerd (SIGTERM) after registering actk-runtime, and the supervisor starts it again.
    local bin path
    bin=$(forky containerd)
    path="$(dirname "$bin"):$PATH"
    launch containerd-supervisor env PATH="$path" bash -c \
      'while [ ! -e "$1" ]; do "$2" --config "$3" --log-level warn; sleep 0.5; done' \
      containerd.stop "$R/containerd.stop" "$bin" "$S/containerd/config.toml"
  fi
  wait_for containerd 30 "$(forky ctr)" --address "$SOCK" version
}

containerd_pid() {
  pgrep -f -x "$(forky containerd) --config $S/containerd/config.toml --log-level warn" | head -n 1
}

import_image() { # TAR
  ctr_ images import "$1" >/dev/null
}

base_images() {
  local ref tar
  while read -r ref tar; do import_image "$tar"; done < <("$repo/scripts/k8s/base-images.sh" "$S/images")
}

kubelet_config() { # IP POLICY
  mkdir -p "$KUBELET_DIR" "$S/pod-logs"
  cat >"$S/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $1
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
containerRuntimeEndpoint: unix://$SOCK
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_ROOT
# This host is cgroup v1 (hybrid); kubelets since 1.35 refuse it unless told (field since 1.31).
failCgroupV1: false
failSwapOn: false
# root here lacks CAP_SYS_RESOURCE; NOFILE's hard limit is 20000.
oomScoreAdj: 0
maxOpenFiles: 20000
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $S/pki/ca.crt}
authorization: {mode: AlwaysAllow}
# The disk is shared with builds: do not evict or collect images on its fill level.
evictionHard: {memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
podLogsDir: $S/pod-logs
nodeStatusUpdateFrequency: 1s
topologyManagerPolicy: $2
topologyManagerScope: container
shutdownGracePeriod: 0s
EOF
}

cgroup_dirs() { for c in /sys/fs/cgroup/*/; do [ -d "$c$CGROUP_ROOT" ] && echo "$c$CGROUP_ROOT"; done; return 0; }

start_kubelet() { # IP POLICY
  local old=""
  [ -f "$S/kubelet-config.yaml" ] && old=$(cat "$S/kubelet-config.yaml")
  kubelet_config "$1" "$2"
  if running kubelet && [ "$old" != "$(cat "$S/kubelet-config.yaml")" ]; then
    say "kubelet configuration changed (topology policy $2): restarting the kubelet"
    stop kubelet 20
  fi
  if ! running kubelet; then
    local c
    # The kubelet wants its cgroup root in every hierarchy (name=systemd included).
    for c in /sys/fs/cgroup/*/; do mkdir -p "$c$CGROUP_ROOT"; done
    launch kubelet "$(kube_bin kubelet)" --config "$S/kubelet-config.yaml" --kubeconfig "$KC" \
      --root-dir "$KUBELET_DIR" --cert-dir "$KUBELET_DIR/pki" --hostname-override "$NODE_NAME" --node-ip "$1" --v=1 $(gates_flag)
  fi
  wait_for "node $NODE_NAME Ready" 120 node_ready
}

node_ready() {
  [ "$(kubectl_ get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ] \
    && [ -z "$(kubectl_ get node "$NODE_NAME" -o 'jsonpath={.spec.taints[?(@.key=="node.kubernetes.io/not-ready")].key}' 2>/dev/null)" ]
}

cmd_start() {
  local policy=none
  while [ $# -gt 0 ]; do
    case $1 in
      --topology-policy) policy=$2; shift 2 ;;
      --version)
        case ${2:-} in v1.[0-9]*.[0-9]*) ;; *) die "--version ${2:-}: give a k8s.io/kubernetes version such as v1.37.2" ;; esac
        export ACTK_KUBE_VERSION=$2
        shift 2
        ;;
      *) die "start: unknown argument $1" ;;
    esac
  done
  case $policy in none | best-effort | restricted | single-numa-node) ;; *) die "--topology-policy $policy: use none, best-effort, restricted or single-numa-node" ;; esac
  [ "$(id -u)" = 0 ] || die "run as root (kubelet, containerd, mounts)"
  local ip old_kbin=${KBIN:-} old_gates=${KGATES:-}
  ip=$(node_ip)
  KBIN="" FORKY=""
  kube_bin kubelet >/dev/null
  forky containerd >/dev/null
  # Components of another version (or other feature gates) are not mixed in: a 1.34 API server
  # cannot read what a 1.37 one stored, so the whole cluster goes, etcd's data with it.
  if { running kube-apiserver || running kubelet; } &&
    { [ "$old_kbin" != "$KBIN" ] || [ "$old_gates" != "${ACTK_KUBE_FEATURE_GATES:-}" ]; }; then
    say "the running cluster is $(version_of "$old_kbin")${old_gates:+ with gates $old_gates}; taking it down for $(version_of "$KBIN")${ACTK_KUBE_FEATURE_GATES:+ with gates $ACTK_KUBE_FEATURE_GATES}"
    local new_kbin=$KBIN
    cmd_down >/dev/null
    KBIN=$new_kbin
  fi
  KGATES=${ACTK_KUBE_FEATURE_GATES:-}
  mkdir -p "$S" "$R" "$LOGS"
  printf 'KBIN=%q\nFORKY=%q\nKGATES=%q\n' "$KBIN" "$FORKY" "$KGATES" >"$S/bins"
  pki "$ip"
  kubeconfig
  start_control_plane "$ip"
  start_containerd
  base_images
  start_kubelet "$ip" "$policy"
  # The default ServiceAccount is made by the controller-manager; pods of the chart need it.
  wait_for "ServiceAccount default" 60 kubectl_ -n default get serviceaccount default
  echo "export KUBECONFIG=$KC"
}

# --- actk on the node --------------------------------------------------------------------------
has_accelerators() {
  [ -e /proc/driver/nvidia/version ] && return 0
  compgen -G '/dev/neuron[0-9]*' >/dev/null && return 0
  [ -e /dev/kfd ] && return 0
  compgen -G '/dev/accel/accel[0-9]*' >/dev/null && return 0
  return 1
}

default_root() {
  if has_accelerators; then echo /; return; fi
  local sim=/var/lib/actk/simulated-node
  if [ ! -c "$sim/dev/nvidia0" ]; then
    say "no accelerators here: preparing the simulated DGX H100 node in $sim"
    rm -rf "$sim"
    "$repo/fixtures/prepare.sh" nvidia-dgx-h100 "$sim" >&2
  fi
  echo "$sim"
}

cmd_install() {
  local root="" values=() wait=1
  while [ $# -gt 0 ]; do
    case $1 in
      --root) root=$2; shift 2 ;;
      --values) [ -f "$2" ] || die "--values $2: no such file"; values+=(-f "$2"); shift 2 ;;
      --no-wait) wait=0; shift ;;
      *) die "install: unknown argument $1" ;;
    esac
  done
  [ -n "$root" ] || root=$(default_root)
  case $root in /*) ;; *) root=$(cd "$root" && pwd) ;; esac
  local ref tar
  read -r ref tar < <("$repo/scripts/k8s/actk-image.sh" --out "$S/images/actk.tar" | tail -n 1)
  import_image "$tar"
  cat >"$S/harness-values.yaml" <<EOF
# Written by scripts/k8s-node.sh: where this test node keeps things.
image:
  repository: ${ref%:*}
  tag: "${ref##*:}"
  pullPolicy: Never
hostRoot: $root
# No pod network on this node: every pod uses the host's.
hostNetwork: true
cdi:
  specDirs: [$CDI_DIR]
# This kubelet's PodResources socket (under its --root-dir).
kubeletPodResourcesDir: $KUBELET_DIR/pod-resources
nodeSetup:
  installDir: $S/node-setup
  containerd:
    config: $S/containerd/config.toml
    socket: $SOCK
# The NRI plugin (nri.enabled): this containerd's NRI socket.
nri:
  socket: $R/nri/nri.sock
  # Its Events (nri.gate: false) go to the API server on the host's loopback, as the DRA driver's.
  extraEnv:
    - {name: KUBERNETES_SERVICE_HOST, value: "127.0.0.1"}
    - {name: KUBERNETES_SERVICE_PORT, value: "$API_PORT"}
# The DRA driver (dra.enabled): this kubelet's plugin dirs (--root-dir), and the API server on the
# host's loopback, as no kube-proxy makes the service IP reachable.
dra:
  kubeletPluginsDir: $KUBELET_DIR/plugins
  kubeletRegistryDir: $KUBELET_DIR/plugins_registry
  extraEnv:
    - {name: KUBERNETES_SERVICE_HOST, value: "127.0.0.1"}
    - {name: KUBERNETES_SERVICE_PORT, value: "$API_PORT"}
# The device plugin reads its Node for named configs (config.map): the API server as above.
extraEnv:
  - {name: KUBERNETES_SERVICE_HOST, value: "127.0.0.1"}
  - {name: KUBERNETES_SERVICE_PORT, value: "$API_PORT"}
# The exporter and the node labeller (on by default) only where a test enables them: the other
# tests keep their pods to what they test (and two releases would share the exporter's host port).
exporter:
  enabled: false
nodeLabeller:
  enabled: false
  extraEnv:
    - {name: KUBERNETES_SERVICE_HOST, value: "127.0.0.1"}
    - {name: KUBERNETES_SERVICE_PORT, value: "$API_PORT"}
EOF
  local args=(upgrade --install "$RELEASE" "$CHART" --namespace "$NAMESPACE" -f "$S/harness-values.yaml" "${values[@]}")
  [ $wait = 1 ] && args+=(--wait --timeout 3m)
  "$(helm_bin)" --kubeconfig "$KC" "${args[@]}" >&2
  [ $wait = 1 ] && wait_rollouts
  return 0
}

# Every DaemonSet of the release rolled out: its pods updated and available on the node. Helm's
# --wait counts a DaemonSet that rolls one pod at a time (maxUnavailable 1: the node setup, the
# NRI plugin, the DRA driver) ready once the new pod is scheduled, on a one-node cluster even
# when that pod fails; `kubectl rollout status` waits for it to be available.
wait_rollouts() {
  local ds
  for ds in $(kubectl_ -n "$NAMESPACE" get ds -l "app.kubernetes.io/instance=$RELEASE" -o name); do
    if ! kubectl_ -n "$NAMESPACE" rollout status "$ds" --timeout=3m >&2; then
      kubectl_ -n "$NAMESPACE" get pods -l "app.kubernetes.io/instance=$RELEASE" -o wide >&2 || true
      die "$ds did not roll out; its pods' logs: $0 kubectl -n $NAMESPACE logs $ds --all-containers"
    fi
  done
}

# Extended resources (vendor/name, not kubernetes.io or hugepages) allocatable on the node, as
# NAME=COUNT lines.
allocatable() {
  kubectl_ get node "$NODE_NAME" -o json | jq -r '.status.allocatable | to_entries[]
    | select((.key | contains("/")) and (.key | startswith("kubernetes.io/") | not) and (.key | startswith("hugepages-") | not))
    | "\(.key)=\(.value)"'
}

# Devices of the release's DRA driver published for this node (ResourceSlices of actk.dev).
dra_devices() {
  kubectl_ get resourceslices -o json | jq -r --arg n "$NODE_NAME" '[.items[] | select(.spec.driver == "actk.dev" and .spec.nodeName == $n) | .spec.devices // [] | length] | add // 0'
}

# What the installed values enable, as words: device-plugin, dra.
enabled_parts() {
  "$(helm_bin)" --kubeconfig "$KC" get values "$RELEASE" -n "$NAMESPACE" --all -o json \
    | jq -r '[(if .devicePlugin.enabled != false then "device-plugin" else empty end), (if .dra.enabled == true then "dra" else empty end)] | join(" ")'
}

# Until a part the values enable shows devices: the device plugin's extended resources in the
# node's allocatable, or the DRA driver's devices in its ResourceSlices.
cmd_wait_devices() {
  local parts i n
  parts=$(enabled_parts)
  [ -n "$parts" ] || die "the release enables neither the device plugin nor the DRA driver"
  for ((i = 0; i < 300; i++)); do
    case " $parts " in *" device-plugin "*) if allocatable | grep -qv '=0$'; then allocatable >&2; return 0; fi ;; esac
    case " $parts " in *" dra "*)
      n=$(dra_devices 2>/dev/null || echo 0)
      if [ "${n:-0}" -gt 0 ]; then say "the DRA driver publishes $n devices for $NODE_NAME"; return 0; fi ;;
    esac
    sleep 0.2
  done
  die "no devices within 60s from the parts enabled ($parts): no extended resource allocatable and no actk.dev ResourceSlice device on $NODE_NAME; logs: $0 kubectl -n $NAMESPACE logs -l app.kubernetes.io/instance=$RELEASE --all-containers"
}

cmd_wait_allocatable() {
  local i
  for ((i = 0; i < 300; i++)); do
    if allocatable | grep -qv '=0$'; then allocatable >&2; return 0; fi
    sleep 0.2
  done
  die "no extended resource became allocatable on $NODE_NAME within 60s; plugin logs: $0 kubectl -n $NAMESPACE logs ds/$RELEASE --all-containers"
}

cmd_up() {
  local start=() install=()
  while [ $# -gt 0 ]; do
    case $1 in
      --root | --values) install+=("$1" "$2"); shift 2 ;;
      --topology-policy | --version) start+=("$1" "$2"); shift 2 ;;
      *) die "up: unknown argument $1 (see the usage at the top of $0)" ;;
    esac
  done
  local t0=$SECONDS
  cmd_start "${start[@]}" >/dev/null
  cmd_install "${install[@]}"
  cmd_wait_devices
  say "node $NODE_NAME ready with devices in $((SECONDS - t0)) s"
  echo "export KUBECONFIG=$KC"
}

# --- teardown ----------------------------------------------------------------------------------
# Mount points under $S or $R, deepest first.
our_mounts() {
  awk '{print $5}' /proc/self/mountinfo | while read -r m; do
    m=$(printf '%b' "${m//\\/\\0}")
    case $m in "$S" | "$S"/* | "$R" | "$R"/*) echo "$m" ;; esac
  done | awk '{print length, $0}' | sort -rn | cut -d' ' -f2-
}

kill_cgroup_procs() {
  local d p
  for d in $(cgroup_dirs); do
    find "$d" -name cgroup.procs 2>/dev/null | while read -r p; do
      xargs -r kill -KILL <"$p" 2>/dev/null || true
    done
  done
}

cmd_down() {
  local purge=0
  [ "${1:-}" = --purge ] && purge=1
  stop kubelet 20
  if [ -S "$SOCK" ] && [ -n "${FORKY:-}${ACTK_FORKY_PREFIX:-}" ] || [ -x /var/cache/actk/forky/root/usr/bin/ctr ]; then
    local id
    for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
    sleep 0.5
    for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete -f "$id" >/dev/null 2>&1 || true; done
    for id in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$id" >/dev/null 2>&1 || true; done
  fi
  touch "$R/containerd.stop" 2>/dev/null || true
  stop containerd-supervisor 2
  local p
  for p in $(pgrep -f -- "--config $S/containerd/config.toml" || true); do kill -TERM "$p" 2>/dev/null || true; done
  sleep 0.5
  for p in $(pgrep -f -- "--config $S/containerd/config.toml" || true); do kill -KILL "$p" 2>/dev/null || true; done
  # Shims outlive containerd; processes left in the pods' cgroups are the pods'.
  for p in $(pgrep -f -- "-address $SOCK" || true); do kill -KILL "$p" 2>/dev/null || true; done
  kill_cgroup_procs
  stop kube-scheduler
  stop kube-controller-manager
  stop kube-apiserver
  stop etcd
  local m
  for m in $(our_mounts); do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || say "cannot unmount $m"; done
  local d i
  for ((i = 0; i < 20; i++)); do
    kill_cgroup_procs
    for d in $(cgroup_dirs); do find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true; done
    [ -z "$(cgroup_dirs)" ] && break
    sleep 0.25
  done
  [ -z "$(cgroup_dirs)" ] || say "cgroups left: $(cgroup_dirs | tr '\n' ' ')"
  # The kubelet links every container log into /var/log/containers; drop the links to ours.
  if [ -d /var/log/containers ]; then
    find /var/log/containers -maxdepth 1 -type l -lname "$S/*" -delete 2>/dev/null || true
  fi
  # The device-plugins directory is the kubelet's (fixed path): its socket, the plugins' sockets
  # and its checkpoint of allocations, which must not outlive the cluster.
  if [ -d "$DP_DIR" ]; then
    find "$DP_DIR" -mindepth 1 -delete 2>/dev/null || true
    rmdir "$DP_DIR" 2>/dev/null && rmdir /var/lib/kubelet 2>/dev/null || true
  fi
  rm -rf "$R" "$S/etcd" "$KUBELET_DIR" "$S/containerd" "$S/cni" "$S/nri" "$S/pod-logs" "$S/node-setup" \
    "$S/kubelet-config.yaml" "$S/harness-values.yaml"
  [ $purge = 1 ] && rm -rf "$S"
  say "down: nothing of the cluster runs any more (logs kept in $LOGS)"
}

cmd_restart() {
  local ip
  ip=$(node_ip)
  case ${1:-} in
    kubelet)
      stop kubelet 20
      start_kubelet "$ip" "$(sed -n 's/^topologyManagerPolicy: //p' "$S/kubelet-config.yaml")"
      ;;
    containerd)
      local p
      p=$(containerd_pid)
      [ -n "$p" ] && kill -TERM "$p"
      sleep 1
      wait_for containerd 30 "$(forky ctr)" --address "$SOCK" version
      ;;
    *) die "restart kubelet|containerd" ;;
  esac
}

cmd_env() {
  cat <<EOF
KUBECONFIG=$KC
KUBECTL=$(kube_bin kubectl)
KUBE_VERSION=$(version_of "$(dirname "$(kube_bin kubelet)")")
KUBE_FEATURE_GATES=${KGATES:-}
HELM=$(helm_bin)
CTR=$(forky ctr)
NODE_NAME=$NODE_NAME
NODE_IP=$(node_ip)
STATE_DIR=$S
RUN_DIR=$R
LOG_DIR=$LOGS
KUBELET_DIR=$KUBELET_DIR
DEVICE_PLUGIN_DIR=$DP_DIR
PLUGINS_REGISTRY_DIR=$KUBELET_DIR/plugins_registry
CDI_DIR=$CDI_DIR
CONTAINERD_SOCKET=$SOCK
CONTAINERD_CONFIG=$S/containerd/config.toml
NRI_SOCKET=$R/nri/nri.sock
CGROUP_ROOT=/$CGROUP_ROOT
RELEASE=$RELEASE
NAMESPACE=$NAMESPACE
CHART=$CHART
LOCK=$LOCK
EOF
}

cmd_status() {
  local c
  for c in etcd kube-apiserver kube-controller-manager kube-scheduler containerd-supervisor kubelet; do
    if running "$c" "$([ $c = containerd-supervisor ] && echo containerd.stop || echo $c)"; then echo "$c running"; else echo "$c stopped"; fi
  done
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case $cmd in
  up) take_lock; cmd_up "$@" ;;
  start) take_lock; cmd_start "$@" ;;
  install) take_lock; cmd_install "$@" ;;
  wait-allocatable) cmd_wait_allocatable ;;
  wait-devices) cmd_wait_devices ;;
  down) take_lock; cmd_down "$@" ;;
  restart) take_lock; cmd_restart "$@" ;;
  kubectl) require_cluster; kubectl_ "$@" ;;
  helm) require_cluster; exec "$(helm_bin)" --kubeconfig "$KC" "$@" ;;
  ctr) require_cluster; ctr_ "$@" ;;
  env) cmd_env ;;
  status) cmd_status ;;
  *) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
