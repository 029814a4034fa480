#!/usr/bin/env bash
# The per-container binaries (actk-runtime, actk-hook) link nothing that only the CLI needs
# (issue 14): no JSON schema, no YAML, no clap. They depend on actk-core without its `schema`
# and `yaml` features; this checks their dependency graph as Cargo resolves it when they are
# built on their own (`cargo build -p actk-runtime -p actk-hook`, as the release build, image
# and bench do). A `cargo build --workspace` unifies features across packages and links the
# CLI's features into them too: see docs/architecture.md, "Build".
# Usage: scripts/check-shim-deps.sh   (exit 1 naming the crate and the path that pulls it in)
set -euo pipefail
cd "$(dirname "$0")/.."
forbidden=(jsonschema serde-saphyr saphyr clap fancy-regex reqwest)
bad=0
for pkg in actk-runtime actk-hook; do
  deps=$(cargo tree -e normal -p "$pkg" --prefix none --format '{p}' | awk '{print $1}' | sort -u)
  for f in "${forbidden[@]}"; do
    if grep -qx "$f" <<<"$deps"; then
      echo "check-shim-deps: $pkg links $f, which only the CLI needs; it comes in through:" >&2
      cargo tree -e normal,features -p "$pkg" -i "$f" >&2 || true
      bad=1
    fi
  done
done
[ "$bad" = 0 ] && echo "check-shim-deps: actk-runtime and actk-hook link none of: ${forbidden[*]}"
exit "$bad"
