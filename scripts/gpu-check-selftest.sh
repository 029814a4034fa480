#!/usr/bin/env bash
# gpu-check-selftest.sh: exercise scripts/gpu-check without a GPU, on the nvidia-dgx-h100
# fixture and, for the MIG checks, the nvidia-dgx-a100 fixture (root: prepare.sh mknods their
# device nodes; gcc, runc and busybox needed).
#
#   scripts/gpu-check-selftest.sh [--bin DIR]
#
# Stands in for the driver with a small dynamic glibc program compiled here (like the real
# nvidia-smi it needs the host's loader and libc inside the busybox container) that answers
# `-L` and `--query-gpu=index,pci.bus_id,uuid` for the GPUs whose /dev/nvidiaN exist under
# $FAKE_ROOT (the fixture on the host; the container's /dev inside it), with the fixture's UUIDs
# and bus ids, and under them the MIG devices of the fixture's NVML state (nvml.tsv, read here
# independently of actk) whose compute-instance capability node exists. It is both the
# `nvidia-smi` on PATH and the fixture's /usr/bin/nvidia-smi that actk mounts into the
# container. Then:
#   1. gpu-check must pass every check (12 passed, 0 failed, exit 0) on the DGX H100 (MIG off)
#      and on the DGX A100 (17 MIG devices: mig-devices compares them, mig-container runs one);
#   1b. with the stand-in hiding the A100's last MIG device, mig-devices must FAIL;
#   2. with the stand-in reporting GPUs 0 and 1 swapped, gpu-check must fail list-uuids and
#      list-bus-ids and exit non-zero;
#   3. without nvidia-smi on PATH, every GPU check must FAIL with "nvidia-smi not found" and the
#      script must still end with its summary line;
#   and no temporary directory or mount of gpu-check may be left behind.
# Prints `PASS`/`FAIL` per case and exits non-zero on any FAIL.

set -u -o pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=$repo/target/release
[ -x "$bin/actk" ] || bin=$repo/target/debug
if [ "${1:-}" = --bin ] && [ $# -ge 2 ]; then bin=$2; fi
bin=$(cd "$bin" && pwd) || { echo "FAIL setup: no directory $bin"; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/actk-gpu-selftest.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
command -v gcc >/dev/null || { echo "FAIL setup: gcc not found"; exit 1; }

cat >"$work/smi.c" <<'EOF'
/* nvidia-smi stand-in for gpu-check-selftest.sh; SWAP=1 swaps GPUs 0 and 1, MIGDROP=1 hides the
 * last MIG device. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static const char *gpu[][2] = {
#include "table.h"
};
struct mig { int gpu; const char *profile; int index; const char *uuid; int cap; };
static const struct mig migs[] = {
#include "migs.h"
    {-1, 0, 0, 0, 0}
};
int main(int argc, char **argv) {
    const char *root = getenv("FAKE_ROOT");
    int swap = getenv("SWAP") != NULL;
    int nmig = (int)(sizeof migs / sizeof migs[0]) - 1 - (getenv("MIGDROP") ? 1 : 0);
    int n = sizeof gpu / sizeof gpu[0];
    if (argc < 2) return 2;
    for (int i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/dev/nvidia%d", root ? root : "", i);
        if (access(path, F_OK) != 0) continue;
        int g = swap && i < 2 ? 1 - i : i;
        if (strcmp(argv[1], "-L") == 0) {
            printf("GPU %d: NVIDIA GPU (UUID: %s)\n", i, gpu[g][0]);
            for (int m = 0; m < nmig; m++) {
                if (migs[m].gpu != i) continue;
                snprintf(path, sizeof path, "%s/dev/nvidia-caps/nvidia-cap%d", root ? root : "", migs[m].cap);
                if (access(path, F_OK) != 0) continue;
                printf("  MIG %-13s Device %2d: (UUID: %s)\n", migs[m].profile, migs[m].index, migs[m].uuid);
            }
        } else if (strncmp(argv[1], "--query-gpu=", 12) == 0) {
            char bus[64];
            snprintf(bus, sizeof bus, "0000%s", gpu[g][1]);
            for (char *c = bus; *c; c++) *c = (char)toupper((unsigned char)*c);
            printf("%d, %s, %s\n", i, bus, gpu[g][0]);
        }
    }
    return 0;
}
EOF

# prepare NAME: the fixture in $work/NAME with the stand-in built for it ($work/NAME-path).
prepare() {
    local name=$1 root=$work/$1
    if ! "$repo/fixtures/prepare.sh" "$name" "$root" >"$work/prepare.log" 2>&1; then
        echo "FAIL setup: fixtures/prepare.sh $name failed: $(tail -n 1 "$work/prepare.log")"
        exit 1
    fi
    mkdir -p "$work/$name-src" "$work/$name-path"
    # The fixture's GPUs, from actk list: "{\"UUID\", \"bus\"}," per line, index order.
    if ! "$bin/actk" list --root "$root" \
        | sed -n 's/^nvidia.com\/gpu \([0-9]*\): .*(UUID: \([^)]*\)) bus \([^ ]*\).*/{"\2", "\3"},/p' >"$work/$name-src/table.h" \
        || [ ! -s "$work/$name-src/table.h" ]; then
        echo "FAIL setup: actk list --root $root gave no GPUs"
        exit 1
    fi
    # MIG devices from the NVML double's state, with the minor of each CI access file.
    : >"$work/$name-src/migs.h"
    if [ -f "$root/nvml-double/state.tsv" ]; then
        awk -F'\t' '$1 == "gpu" { for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] } minor[f["index"]] = f["minor"] }
                    $1 == "mig" { for (i = 2; i <= NF; i++) { split($i, kv, "="); m[kv[1]] = kv[2] }
                                  print m["gpu"], minor[m["gpu"]], m["gi"], m["ci"], m["profile"], m["index"], m["uuid"] }' \
            "$root/nvml-double/state.tsv" | while read -r g minor gi ci profile index uuid; do
            cap=$(sed -n 's/^DeviceFileMinor: *//p' "$root/proc/driver/nvidia/capabilities/gpu$minor/mig/gi$gi/ci$ci/access")
            printf '{%s, "%s", %s, "%s", %s},\n' "$g" "$profile" "$index" "$uuid" "$cap"
        done >"$work/$name-src/migs.h"
    fi
    if ! gcc -O -I"$work/$name-src" -o "$work/$name-path/nvidia-smi" "$work/smi.c" 2>"$work/gcc.log"; then
        echo "FAIL setup: compiling the nvidia-smi stand-in: $(head -n 1 "$work/gcc.log")"
        exit 1
    fi
    cp "$work/$name-path/nvidia-smi" "$root/usr/bin/nvidia-smi"
}
# The compute check's stand-in for scripts/cuda-probe.c (the fixtures have no real libcuda): it
# passes only when the container has the device nodes cuInit needs, /dev/nvidiactl,
# /dev/nvidia-uvm and /dev/nvidia0. gpu-check takes it from --bin, so the binaries are linked
# into a directory of their own beside it.
cat >"$work/probe.c" <<'EOF'
#include <stdio.h>
#include <unistd.h>
int main(void) {
    const char *need[] = {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0"};
    for (int i = 0; i < 3; i++)
        if (access(need[i], F_OK) != 0) { printf("cuda: cuInit(0) failed: 100 (no %s)\n", need[i]); return 1; }
    printf("cuda: 1 device(s); device 0: stand-in, 64 MiB allocated and checked\n");
    return 0;
}
EOF
mkdir -p "$work/bin"
for b in actk actk-runtime actk-hook; do ln -s "$bin/$b" "$work/bin/$b"; done
if ! gcc -O -o "$work/bin/cuda-probe" "$work/probe.c" 2>"$work/gcc.log"; then
    echo "FAIL setup: compiling the cuda-probe stand-in: $(head -n 1 "$work/gcc.log")"
    exit 1
fi
prepare nvidia-dgx-h100
prepare nvidia-dgx-a100
bin=$work/bin
root=$work/nvidia-dgx-h100
a100=$work/nvidia-dgx-a100

failed=0
check() { if [ "$2" = ok ]; then echo "PASS $1"; else echo "FAIL $1: $2"; failed=1; fi; }
leftovers() { ls -d "${TMPDIR:-/tmp}"/actk-gpu-check.* 2>/dev/null; grep actk-gpu-check /proc/mounts; }
gpu_check() { # ROOT [ENV=VALUE...]: gpu-check against fixture ROOT with its stand-in
    local r=$1; shift
    env "$@" PATH="$r-path:$PATH" FAKE_ROOT="$r" ACTK_ROOT="$r" "$repo/scripts/gpu-check" --bin "$bin" 2>&1
}

out=$(gpu_check "$root")
rc=$?
if [ $rc = 0 ] && printf '%s\n' "$out" | grep -qx '12 passed, 0 failed'; then check all-pass ok
else check all-pass "exit $rc: $(printf '%s' "$out" | grep -v '^PASS' | tr '\n' ' ')"; fi

out=$(gpu_check "$a100")
rc=$?
if [ $rc = 0 ] && printf '%s\n' "$out" | grep -qx '12 passed, 0 failed' && printf '%s\n' "$out" | grep -qx 'PASS mig-container' \
    && ! printf '%s\n' "$out" | grep -q 'no MIG device'; then check mig-all-pass ok
else check mig-all-pass "exit $rc: $(printf '%s' "$out" | grep -v '^PASS' | tr '\n' ' ')"; fi

out=$(gpu_check "$a100" MIGDROP=1)
rc=$?
if [ $rc != 0 ] && printf '%s\n' "$out" | grep -q '^FAIL mig-devices: '; then check mig-missing-fails ok
else check mig-missing-fails "exit $rc: $(printf '%s' "$out" | tr '\n' ' ')"; fi

out=$(gpu_check "$root" SWAP=1)
rc=$?
if [ $rc != 0 ] && printf '%s\n' "$out" | grep -q '^FAIL list-uuids: ' && printf '%s\n' "$out" | grep -q '^FAIL list-bus-ids: ' \
    && printf '%s\n' "$out" | grep -q '^PASS list-count'; then check swapped-order-fails ok
else check swapped-order-fails "exit $rc: $(printf '%s' "$out" | tr '\n' ' ')"; fi

# No nvidia-smi: a PATH with only what gpu-check itself needs besides the driver.
mkdir -p "$work/nosmi"
out=$(PATH="$work/nosmi:/usr/sbin:/usr/bin:/sbin:/bin" "$repo/scripts/gpu-check" --bin "$bin" 2>&1)
rc=$?
nf=$(printf '%s\n' "$out" | grep -c 'nvidia-smi not found')
if [ $rc != 0 ] && [ "$nf" -ge 7 ] && printf '%s\n' "$out" | tail -n 1 | grep -q '^[0-9]* passed, [1-9][0-9]* failed$'; then check no-nvidia-smi ok
else check no-nvidia-smi "exit $rc, $nf 'nvidia-smi not found' lines: $(printf '%s' "$out" | tr '\n' ' ')"; fi

left=$(leftovers)
if [ -z "$left" ]; then check nothing-left ok; else check nothing-left "$left"; fi
exit $failed
