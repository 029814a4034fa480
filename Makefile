# actk: the two commands of the README's quick start, and their parts.
#   make demo   install what is missing, build, prepare a simulated node when the host has no
#               accelerators, run a container through actk-runtime and show what it sees
#   make test   install what is missing, build the binaries, start dockerd, run every test
# Run as root on Debian 12.

SHELL := /bin/bash
# rustup installs cargo here; a fresh root shell may not have it on PATH yet.
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo

.PHONY: demo test deps build dockerd

deps:
	scripts/install-deps.sh

build: deps
	$(CARGO) build --workspace --bins

demo: build
	scripts/demo.sh

# Binaries are built before dockerd starts: dockerd offers `--gpus` only when the hook
# (target/debug/actk-hook, linked as nvidia-container-runtime-hook) exists at its start, and the
# end-to-end tests run the built actk, actk-runtime and actk-hook.
test: build
	scripts/start-dockerd.sh
	$(CARGO) test --workspace --no-fail-fast
