#!/usr/bin/env bash
# Extract Debian forky's containerd 2.1, Docker 28.5 (dockerd, docker CLI) and etcd 3.5 into a
# project prefix, without touching the system's apt sources: apt-get runs with its own source
# list, lists and cache under the prefix, downloads the .debs, and dpkg-deb -x unpacks them.
# They run on bookworm's libc with bookworm's runc 1.1.5 (forky's runc needs glibc 2.38).
#
# Usage: scripts/k8s/fetch-forky.sh        prints the prefix on stdout (last line)
# Env:   ACTK_FORKY_PREFIX   default /var/cache/actk/forky
#        ACTK_DEBIAN_MIRROR  default http://deb.debian.org/debian
# Binaries then are under PREFIX/root/usr/bin (containerd, ctr, containerd-shim-runc-v2, dockerd,
# docker, docker-proxy, etcd, etcdctl). Reused when the stamp PREFIX/complete names the same packages.
set -euo pipefail
prefix=${ACTK_FORKY_PREFIX:-/var/cache/actk/forky}
mirror=${ACTK_DEBIAN_MIRROR:-http://deb.debian.org/debian}
pkgs=(containerd docker.io docker-cli etcd-server etcd-client)
want="${pkgs[*]}"

if [ -f "$prefix/complete" ] && [ "$(head -n 1 "$prefix/complete")" = "$want" ] && [ -x "$prefix/root/usr/bin/containerd" ]; then
  echo "fetch-forky: reusing $prefix" >&2
  echo "$prefix"
  exit 0
fi
mkdir -p "$prefix"
exec 9>"$prefix/.lock"
flock 9

apt_dir=$prefix/apt
mkdir -p "$apt_dir/sources.list.d" "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$prefix/debs"
cat >"$apt_dir/sources.list.d/forky.sources" <<SRC
Types: deb
URIs: $mirror
Suites: forky
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
apt_opts=(
  -o "Dir::Etc::sourcelist=/dev/null"
  -o "Dir::Etc::sourceparts=$apt_dir/sources.list.d"
  -o "Dir::State::Lists=$apt_dir/lists"
  -o "Dir::Cache=$apt_dir/cache"
  -o "Dir::State::status=/dev/null"
  -o "APT::Get::List-Cleanup=false"
)
apt-get "${apt_opts[@]}" update -qq >&2
cd "$prefix/debs"
rm -f ./*.deb
apt-get "${apt_opts[@]}" download "${pkgs[@]}" >&2
rm -rf "$prefix/root"
mkdir -p "$prefix/root"
for deb in ./*.deb; do dpkg-deb -x "$deb" "$prefix/root"; done
for b in containerd ctr containerd-shim-runc-v2 dockerd docker etcd; do
  [ -x "$prefix/root/usr/bin/$b" ] || [ -x "$prefix/root/usr/sbin/$b" ] || { echo "fetch-forky: $b missing after extraction" >&2; exit 1; }
done
{ echo "$want"; ls ./*.deb; } >"$prefix/complete"
echo "fetch-forky: $(tr '\n' ' ' <"$prefix/complete")" >&2
echo "$prefix"
