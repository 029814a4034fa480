#!/usr/bin/env bash
# Build the CDI reference oracle (main.go, tags.cncf.io/container-device-interface through the
# Go module proxy) and gather the reference's own test corpus, once per version of this peer,
# into a cache outside the clone. Prints the cache directory, which holds:
#   cdi-oracle            the peer binary (see main.go)
#   corpus/schema/{good,bad}/*.json   the schema test data of the reference (its v0.8.1 module
#                         zip: the schema moved to a module of its own that the proxy does not
#                         serve, and the data has not changed since)
#   corpus/tests/*.yaml   every spec literal of the reference's pkg/cdi tests (the version in go.mod)
#
# Usage: tests/peers/cdi-oracle/build.sh     Env: ACTK_CDI_ORACLE_CACHE (default
# /var/cache/actk/cdi-oracle). Needs Go >= 1.23 (go.mod).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export PATH=$PATH:/usr/local/go/bin
command -v go >/dev/null || { echo "cdi-oracle: go not found (Go builds this test peer)" >&2; exit 1; }
key=$(cat "$here/go.mod" "$here/go.sum" "$here/main.go" "$here/build.sh" | sha256sum | cut -c1-16)
root=${ACTK_CDI_ORACLE_CACHE:-/var/cache/actk/cdi-oracle}
cache=$root/$key
if [ -e "$cache/complete" ]; then
  echo "$cache"
  exit 0
fi
mkdir -p "$root"
exec 9>"$root/.lock"
flock 9
if [ ! -e "$cache/complete" ]; then
  echo "cdi-oracle: building the CDI reference oracle into $cache (once)" >&2
  rm -rf "$cache.tmp"
  mkdir -p "$cache.tmp/corpus/schema"
  (cd "$here" && GOFLAGS=-mod=mod go build -trimpath -o "$cache.tmp/cdi-oracle" .) >&2
  ref=$(cd "$here" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' tags.cncf.io/container-device-interface)
  "$cache.tmp/cdi-oracle" extract "$ref/pkg/cdi" "$cache.tmp/corpus/tests"
  tmp=$(mktemp -d)
  old=$(cd "$tmp" && GOFLAGS=-mod=mod GO111MODULE=on go mod download -json tags.cncf.io/container-device-interface@v0.8.1 | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  rm -rf "$tmp"
  [ -d "$old/schema/testdata" ] || { echo "cdi-oracle: no schema/testdata in $old" >&2; exit 1; }
  cp -r "$old/schema/testdata/." "$cache.tmp/corpus/schema/"
  chmod -R u+w "$cache.tmp/corpus"
  touch "$cache.tmp/complete"
  rm -rf "$cache"
  mv "$cache.tmp" "$cache"
fi
echo "$cache"
