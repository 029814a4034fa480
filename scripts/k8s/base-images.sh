#!/usr/bin/env bash
# The two images every test pod needs, as OCI tars (no registry here): the pod sandbox image
# (a static pause built from scripts/k8s/pause/pause.c) and a busybox image (Debian's static
# busybox with a link per applet). Reused when present and built from the same inputs.
#
# Usage: scripts/k8s/base-images.sh OUTDIR
# Writes OUTDIR/pause.tar and OUTDIR/busybox.tar and prints, one per line, "REF TAR" for each.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: base-images.sh OUTDIR}
pause_ref=actk.local/pause:3.10
busybox_ref=actk.local/busybox:1.35
mkdir -p "$out"

# stamp NAME INPUTS...: true when OUTDIR/NAME.tar was built from these exact inputs.
stamp_of() { sha256sum "$@" | sha256sum | cut -d' ' -f1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

stamp=$(stamp_of "$here/pause/pause.c" "$here/oci-image.sh")
if [ "$(cat "$out/pause.stamp" 2>/dev/null)" != "$stamp" ] || [ ! -f "$out/pause.tar" ]; then
  command -v gcc >/dev/null || { echo "base-images: gcc not found (scripts/install-deps.sh installs it)" >&2; exit 1; }
  mkdir -p "$work/pause"
  gcc -static -Os -s -o "$work/pause/pause" "$here/pause/pause.c"
  "$here/oci-image.sh" "$work/pause" "$pause_ref" "$out/pause.tar" --entrypoint '["/pause"]' >/dev/null
  echo "$stamp" >"$out/pause.stamp"
fi

busybox=/bin/busybox
[ -x "$busybox" ] || { echo "base-images: $busybox not found (apt-get install busybox-static)" >&2; exit 1; }
if ldd "$busybox" >/dev/null 2>&1; then
  echo "base-images: $busybox is dynamically linked; install busybox-static" >&2
  exit 1
fi
stamp=$(stamp_of "$busybox" "$here/oci-image.sh")
if [ "$(cat "$out/busybox.stamp" 2>/dev/null)" != "$stamp" ] || [ ! -f "$out/busybox.tar" ]; then
  r=$work/busybox
  mkdir -p "$r/bin" "$r/etc" "$r/tmp" "$r/proc" "$r/sys" "$r/dev"
  cp "$busybox" "$r/bin/busybox"
  for a in $("$busybox" --list); do [ "$a" = busybox ] || ln -s busybox "$r/bin/$a"; done
  echo 'root:x:0:0:root:/root:/bin/sh' >"$r/etc/passwd"
  echo 'root:x:0:' >"$r/etc/group"
  chmod 1777 "$r/tmp"
  "$here/oci-image.sh" "$r" "$busybox_ref" "$out/busybox.tar" --cmd '["/bin/sh"]' >/dev/null
  echo "$stamp" >"$out/busybox.stamp"
fi
echo "$pause_ref $out/pause.tar"
echo "$busybox_ref $out/busybox.tar"
