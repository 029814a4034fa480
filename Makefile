# actk: the two commands of the README's quick start, and their parts.
#   make demo   install what is missing, build, prepare a simulated node when the host has no
#               accelerators, run a container through actk-runtime and show what it sees
#   make test   install what is missing, build the binaries, start dockerd, run every test
# Run as root on Debian 12.

SHELL := /bin/bash
# rustup installs cargo here; a fresh root shell may not have it on PATH yet.
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo

.PHONY: demo test test-k8s deps build dockerd lint deb rpm

deps:
	scripts/install-deps.sh

build: deps
	$(CARGO) build --workspace --bins

demo: build
	scripts/demo.sh

# Binaries are built before dockerd starts: dockerd offers `--gpus` only when the hook
# (target/debug/actk-hook, linked as nvidia-container-runtime-hook) exists at its start, and the
# end-to-end tests run the built actk, actk-runtime and actk-hook; the static release
# actk-runtime and actk-hook are tested too (crates/e2e/tests/release_shims.rs), and so is the
# .deb and the .rpm of the release build (crates/e2e/tests/package.rs). The whole release build (which
# test-k8s needs anyway) comes first, so the .deb holds the same actk as the image.
# ACTK_E2E_STRICT=1: an end-to-end test that cannot run (dockerd down, not root) fails instead
# of skipping, so this target never passes by skipping.
# The cluster tests (crates/k8s-e2e) run as their own step after every other test: they start a
# real single-node Kubernetes cluster, which must not run beside the other end-to-end tests. They
# run even when an earlier test failed, so one failure never hides the cluster's results.
test: build
	scripts/build-release.sh >/dev/null
	scripts/package.sh deb >/dev/null
	scripts/package.sh rpm >/dev/null
	scripts/start-dockerd.sh
	ACTK_E2E_STRICT=1 $(CARGO) test --workspace --exclude actk-k8s-e2e --no-fail-fast; w=$$?; \
	  $(MAKE) test-k8s; k=$$?; \
	  [ $$w = 0 ] && [ $$k = 0 ]

# The OS packages (scripts/package.sh; docs/architecture.md "OS packages"): the CLI and the static
# release actk-runtime and actk-hook (target/dist from build-release.sh --cli-only), the CDI
# refresh units of deploy/systemd and the udev rule, by cargo-deb into target/debian/ and by
# cargo-generate-rpm into target/generate-rpm/ (each installed with `cargo install --locked` on
# first use). `make test` builds both: crates/e2e/tests/package.rs installs the .deb on a fresh
# Debian 12 root, and the .rpm with rpm into an empty root, checking it carries what the .deb does.
deb:
	scripts/build-release.sh --cli-only >/dev/null
	scripts/package.sh deb

rpm:
	scripts/build-release.sh --cli-only >/dev/null
	scripts/package.sh rpm

# The real single-node cluster (scripts/k8s-node.sh; docs/kubernetes.md): Kubernetes 1.34 built
# from the Go module proxy into /var/cache/actk/kube (once per machine, ~10-25 min cold),
# containerd 2.1 and etcd from Debian forky, the actk image from the release build. Every test
# there is #[ignore]d (so `cargo test --workspace` never starts a cluster) and run here one at a
# time; `k8s-node.sh down` runs last, always, and is itself tested.
K8S_TEST = ACTK_E2E_STRICT=1 $(CARGO) test -p actk-k8s-e2e --no-fail-fast
# Cluster tests that only `make verify` runs (test-k8s-more), to keep a cold CI run inside its 90
# minutes: chart upgrade paths whose parts CI still covers (helm --wait, earlier values rendered
# by the deploy tests, named configs on the cluster by node label, NVIDIA's ConfigMap format by
# crates/actk-device-plugin's tests).
K8S_VERIFY_ONLY = helm_wait_fails_for_a_plugin_that_does_not_come_up_and_the_old_one_serves \
  reuse_values_upgrade_from_an_earlier_chart_revision two_releases_keep_to_their_own_specs \
  up_with_dra_values_waits_for_slices_not_extended_resources nvidia_configmap_and_chart_values_carry_over
test-k8s: build
	scripts/k8s/build-kube.sh >/dev/null
	scripts/k8s/fetch-forky.sh >/dev/null
	scripts/build-release.sh >/dev/null
	$(K8S_TEST) -- --ignored --test-threads=1 --skip k8s_node_down $(foreach t,$(K8S_VERIFY_ONLY),--skip $(t)); s=$$?; \
	  $(K8S_TEST) --test down -- --ignored; d=$$?; \
	  [ $$s = 0 ] && [ $$d = 0 ]

# The cluster tests CI leaves out (K8S_VERIFY_ONLY), on 1.34; `make verify` runs them.
.PHONY: test-k8s-more
test-k8s-more: build
	scripts/k8s/build-kube.sh >/dev/null
	scripts/k8s/fetch-forky.sh >/dev/null
	scripts/build-release.sh >/dev/null
	$(K8S_TEST) --test chart -- --ignored --test-threads=1 --exact $(K8S_VERIFY_ONLY); s=$$?; \
	  scripts/k8s-node.sh down >/dev/null; d=$$?; \
	  [ $$s = 0 ] && [ $$d = 0 ]

# The DRA cluster tests again on the newest Kubernetes (issue 26; docs/kubernetes.md "Versions"):
# 1.37 binaries are built once per machine into /var/cache/actk/kube (measured cold here: 4785 s
# on 2 shared cores, beside 1060 s for 1.34.4), then every test of dra, dra_told,
# dra_frontier and dra_health runs on it. Not in CI (a fresh CI machine builds 1.37 cold: 20-80 min on top of
# the 45 of today, over the 90-minute budget); `make verify` runs it. CI runs the same tests on
# 1.34 in test-k8s, where the 1.36+ features check that the driver works without them.
K8S_NEWEST ?= v1.37.2
.PHONY: test-k8s-newest
test-k8s-newest: build
	ACTK_KUBE_VERSION=$(K8S_NEWEST) scripts/k8s/build-kube.sh >/dev/null
	scripts/k8s/fetch-forky.sh >/dev/null
	scripts/build-release.sh >/dev/null
	ACTK_KUBE_VERSION=$(K8S_NEWEST) $(K8S_TEST) --test dra --test dra_told --test dra_frontier --test dra_health -- --ignored --test-threads=1; s=$$?; \
	  scripts/k8s-node.sh down >/dev/null; d=$$?; \
	  [ $$s = 0 ] && [ $$d = 0 ]

# Other projects' own test suites pointed at actk (issue 25; tests/conformance/README.md):
# runc 1.1.5's integration suite (bats) against plain runc, then against the release
# actk-runtime without requests and with a GPU request in every bundle; a test whose result
# differs from runc's fails unless tests/conformance/runc-bats/allow.tsv says why. .ci/run calls
# it after `make test`. (The CDI reference oracle, crates/e2e/tests/cdi_oracle.rs, is a cargo
# test and runs in `make test`.) All three passes, over CONFORMANCE_BATS: the files about what
# actk-runtime touches (the container's lifecycle, exec, devices, mounts, hooks, user
# namespaces, help, terminals); the full suite took ~20 min here, this share about half
# (tests/conformance/README.md has the figures). `make conformance CONFORMANCE_BATS=` runs
# every file; `make verify` runs every file and the full matrix (runc with requests too).
CONFORMANCE_BATS ?= create.bats run.bats start.bats start_detached.bats start_hello.bats exec.bats \
	delete.bats kill.bats state.bats list.bats help.bats spec.bats hooks.bats dev.bats mounts.bats \
	mask.bats userns.bats tty.bats cwd.bats umask.bats root.bats version.bats debug.bats \
	no_pivot.bats ps.bats
.PHONY: conformance
conformance: build
	ACTK_BIN_DIR=$$(scripts/build-release.sh --shims-only | tail -1) BATS_FILES="$(CONFORMANCE_BATS)" \
	  tests/conformance/runc-bats/run.sh

# critest (cri-tools' CRI validation) on containerd 2.1 with the release actk-runtime as the runc
# shim's runtime binary, compared spec by spec with plain runc (tests/conformance/critest, in its
# own network namespace with a local registry serving offline stand-ins of its images). The
# runtime's parts of the suite (tests/conformance/README.md); `make verify` runs it, CI does not.
.PHONY: conformance-critest
conformance-critest: build
	ACTK_BIN_DIR=$$(scripts/build-release.sh --shims-only | tail -1) tests/conformance/critest/run.sh

# CI-sized robustness run (.ci/run calls it): every property test at PROPTEST_CASES (default
# 1000) cases and every cargo-fuzz target for FUZZ_SECONDS (default 15) over the committed corpus
# fuzz/corpus, one line per property/target with its own count; a failing one never hides the
# others. scripts/robustness.sh; `make verify` below is the long run of the same runner.
.PHONY: robustness
robustness: deps
	scripts/robustness.sh

# Robustness report (issue 6): property tests with PROPTEST_CASES cases (default 10000), each
# cargo-fuzz target for FUZZ_SECONDS (default 120; new coverage merged into fuzz/corpus), 32 containers at once, injected faults and a
# host snapshot before/after; one line per property with its figure. Not part of `make test`.
.PHONY: verify
verify: build
	scripts/start-dockerd.sh
	scripts/verify.sh

# The house style and lints (rustfmt.toml, [workspace.lints]); CI runs this before `make test`.
# check-shim-deps: actk-runtime and actk-hook link nothing only the CLI needs (docs/architecture.md, "Build").
lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p actk-runtime --features bench-stages -- -D warnings
	scripts/check-shim-deps.sh

# Container start against plain runc, the floor shim and NVIDIA's runtime (issue 31;
# docs/performance.md): the shipped shims of target/dist, NVIDIA's nvidia-container-runtime built
# from the Go module proxy into /var/cache/actk/peers (a test peer, never a dependency).
# BENCH_ROUNDS overrides the rounds; ACTK_BENCH_CALLGRIND=1 adds instruction counts. A
# measurement, not a test: run it on a quiet machine. bench-scale: nodes of 8, 64 and 256
# devices of every vendor; bench-stages: a create's CPU stage by stage (a build with the
# bench-stages feature, never shipped); bench-paths: pod start by NRI, engine CDI and RuntimeClass on the
# real cluster (scripts/k8s-node.sh, one per machine; left down); bench-dra: pod start through
# DRA against the device plugin, NodePrepareResources p50/p99 (ACTK_KUBE_VERSION picks 1.34/1.37);
# bench-sharing: 64 pods of an eighth of a GPU, DRA consumable capacity against time-slicing.
.PHONY: bench-runtime bench-scale bench-stages bench-paths bench-dra bench-sharing
bench-runtime: deps
	scripts/build-release.sh >/dev/null
	scripts/fetch-nvidia-runtime.sh >/dev/null
	benches/runtime-bench.sh $(BENCH_ROUNDS)

bench-scale: deps
	scripts/build-release.sh >/dev/null
	benches/runtime-bench.sh scale $(BENCH_ROUNDS)

bench-stages: deps
	scripts/build-release.sh >/dev/null
	scripts/fetch-nvidia-runtime.sh >/dev/null
	benches/runtime-bench.sh stages $(BENCH_ROUNDS)

bench-paths: deps
	scripts/build-release.sh >/dev/null
	benches/k8s-bench.sh paths $(BENCH_ROUNDS)

bench-dra: deps
	benches/k8s-bench.sh dra $(BENCH_ROUNDS)

bench-sharing: deps
	benches/k8s-bench.sh sharing $(BENCH_ROUNDS)
