#!/usr/bin/env bash
# Write an OCI image (image-spec 1.1 image layout, tarred) from a root filesystem directory,
# without a registry or a container engine: one uncompressed layer, a config, a manifest and an
# index.json whose manifest carries the image name, so that `ctr -n k8s.io images import OUT.tar`
# (containerd), `podman load -i` and `skopeo copy oci-archive:` all take it.
#
# Usage: scripts/k8s/oci-image.sh ROOTFS NAME:TAG OUT.tar [--entrypoint JSON] [--cmd JSON] [--env K=V]...
#   JSON is an array of strings: --entrypoint '["/usr/bin/actk-device-plugin"]'
# Prints the manifest digest (sha256:...) on stdout.
#
# The layer tar is reproducible (sorted names, mtime 0, uid/gid 0): the same ROOTFS gives the same
# digests, so a rebuild that changed nothing is recognised by its digest and not imported again.
set -euo pipefail

die() { echo "oci-image: $*" >&2; exit 2; }
[ $# -ge 3 ] || die "usage: oci-image.sh ROOTFS NAME:TAG OUT.tar [--entrypoint JSON] [--cmd JSON] [--env K=V]..."
rootfs=$1 ref=$2 out=$3
shift 3
[ -d "$rootfs" ] || die "root filesystem $rootfs is not a directory"
case "$ref" in *:*) ;; *) die "image name $ref needs a tag (NAME:TAG)" ;; esac
command -v jq >/dev/null || die "jq not found (scripts/install-deps.sh installs it)"
entrypoint=null cmd=null env='[]'
while [ $# -gt 0 ]; do
  case $1 in
    --entrypoint) entrypoint=$2; shift 2 ;;
    --cmd) cmd=$2; shift 2 ;;
    --env) env=$(jq -c --arg e "$2" '. + [$e]' <<<"$env"); shift 2 ;;
    *) die "unknown option $1" ;;
  esac
done
for j in "$entrypoint" "$cmd"; do
  jq -e 'type == "null" or (type == "array" and all(type == "string"))' <<<"$j" >/dev/null 2>&1 \
    || die "--entrypoint/--cmd must be a JSON array of strings, got: $j"
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
blobs=$work/layout/blobs/sha256
mkdir -p "$blobs"

# put FILE: move FILE into the blob store, print "DIGEST SIZE".
put() {
  local d s
  d=$(sha256sum "$1" | cut -d' ' -f1)
  s=$(stat -c %s "$1")
  mv "$1" "$blobs/$d"
  echo "$d $s"
}

tar -C "$rootfs" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=posix \
  --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime -cf "$work/layer.tar" .
read -r layer_digest layer_size < <(put "$work/layer.tar")

jq -nc --argjson ep "$entrypoint" --argjson cmd "$cmd" --argjson env "$env" --arg diff "sha256:$layer_digest" '{
  architecture: "amd64", os: "linux",
  config: ({Env: (if ($env | length) > 0 then $env else ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"] end)}
           + (if $ep then {Entrypoint: $ep} else {} end) + (if $cmd then {Cmd: $cmd} else {} end)),
  rootfs: {type: "layers", diff_ids: [$diff]},
  history: [{created_by: "scripts/k8s/oci-image.sh"}]
}' >"$work/config.json"
read -r config_digest config_size < <(put "$work/config.json")

jq -nc --arg cd "sha256:$config_digest" --argjson cs "$config_size" --arg ld "sha256:$layer_digest" --argjson ls "$layer_size" '{
  schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json",
  config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $cd, size: $cs},
  layers: [{mediaType: "application/vnd.oci.image.layer.v1.tar", digest: $ld, size: $ls}]
}' >"$work/manifest.json"
read -r manifest_digest manifest_size < <(put "$work/manifest.json")

# io.containerd.image.name: the full name ctr gives the image; org.opencontainers.image.ref.name:
# the tag, as the image-layout spec names it.
jq -nc --arg md "sha256:$manifest_digest" --argjson ms "$manifest_size" --arg name "$ref" --arg tag "${ref##*:}" '{
  schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json",
  manifests: [{mediaType: "application/vnd.oci.image.manifest.v1+json", digest: $md, size: $ms,
               platform: {architecture: "amd64", os: "linux"},
               annotations: {"io.containerd.image.name": $name, "org.opencontainers.image.ref.name": $tag}}]
}' >"$work/layout/index.json"
echo '{"imageLayoutVersion":"1.0.0"}' >"$work/layout/oci-layout"

mkdir -p "$(dirname "$out")"
tar -C "$work/layout" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$out.tmp" .
mv "$out.tmp" "$out"
echo "sha256:$manifest_digest"
