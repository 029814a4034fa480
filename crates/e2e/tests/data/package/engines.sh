#!/bin/sh
# The engines part of crates/e2e/tests/package.rs, run inside the fresh Debian 12 root (chroot,
# own mount, network and PID namespaces, /run a tmpfs as after a boot) where the actk .deb is
# installed and /etc/actk/config.toml points at the simulated node. Everything is done as an
# admin would, with Debian's docker.io and podman; results are printed as `@@key=value` lines
# for the test to check. Arguments: the refresh unit's ExecStart line.
set -u
execstart=$1
say() { printf '@@%s=%s\n' "$1" "$(echo "$2" | tr '\n' ' ' | sed 's/ *$//')"; }
nodes() { grep -Eo 'nvidia[0-9]+' | sort -u | tr '\n' ' ' | sed 's/ $//'; }
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive

# What systemd runs at boot: the unit's own ExecStart with its EnvironmentFile (in a subshell:
# the file's variables must not reach the package scripts below as environment).
(
    set -a
    . /etc/default/actk
    set +a
    eval "$execstart"
) >/var/tmp/refresh.log 2>&1
say refresh_rc $?
say spec "$(ls /var/run/cdi)"

# The admin asks for engine registrations (/etc/default/actk, then reconfigure); the package
# manager's environment overrides the file.
sed -i 's/^ACTK_RUNTIME_CONFIGURE=""/ACTK_RUNTIME_CONFIGURE="docker"/' /etc/default/actk
dpkg-reconfigure actk >/var/tmp/reconfigure.log 2>&1
say reconfigure_docker_rc $?
ACTK_RUNTIME_CONFIGURE=podman dpkg-reconfigure actk >>/var/tmp/reconfigure.log 2>&1
say reconfigure_podman_rc $?
say daemon_json "$(cat /etc/docker/daemon.json 2>&1)"
say containers_conf "$(grep -A2 'actk' /etc/containers/containers.conf 2>&1)"
say registrations "$(cat /var/lib/actk/runtime-registrations 2>&1)"

# dockerd as docker.service starts it (systemd's default PATH, so /usr/bin/nvidia-container-runtime-hook
# is found and `--gpus` offered), its containers under a cgroup parent of their own beside the
# machine's dockerd.
dockerd --cgroup-parent=actk-pkgtest >/var/tmp/dockerd.log 2>&1 &
for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
say docker_up "$(docker info --format '{{.ServerVersion}} {{json .Runtimes}}' 2>&1)"
docker import /var/tmp/busybox.tar actk-busybox:pkgtest >/dev/null
say gpus1 "$(docker run --rm --network none --gpus 1 actk-busybox:pkgtest ls /dev 2>&1 | nodes)"
say runtime_actk "$(docker run --rm --network none --runtime actk -e NVIDIA_VISIBLE_DEVICES=1,3 actk-busybox:pkgtest ls /dev 2>&1 | nodes)"

# podman reads the specs the unit wrote. Its defaults need two flags on this machine (crun fails
# on hybrid cgroups, no systemd for its cgroup manager) and the rlimits ENVIRONMENT.md names.
pm() { podman --cgroup-manager=cgroupfs --runtime runc "$@"; }
pm import /var/tmp/busybox.tar actk-busybox:pkgtest >/dev/null 2>&1
say podman_cdi "$(pm run --rm --network none --ulimit nofile=1024:1024 --ulimit nproc=4096:4096 --device nvidia.com/gpu=0 actk-busybox:pkgtest ls /dev 2>&1 | nodes)"

# actk who: a --gpus container (the hook) and an actk-runtime container, both running.
docker run -d --network none --name who-hook --gpus device=2 actk-busybox:pkgtest sleep 300 >/dev/null
docker run -d --network none --name who-shim --runtime actk -e NVIDIA_VISIBLE_DEVICES=5 actk-busybox:pkgtest sleep 300 >/dev/null
actk who --json >/var/tmp/who.json 2>/var/tmp/who.err
say who_rc $?
say who "$(cat /var/tmp/who.json)"
say who_table "$(actk who 2>&1 | grep -E 'who-(hook|shim)')"
docker rm -f who-hook who-shim >/dev/null 2>&1

# The engines stop as at shutdown; then the admin purges the package.
kill "$(cat /var/run/docker.pid)" 2>/dev/null
for _ in $(seq 1 30); do [ -e /var/run/docker.pid ] || break; sleep 1; done
dpkg --purge actk >/var/tmp/purge.log 2>&1
say purge_rc $?
say spec_after_purge "$(ls /var/run/cdi 2>&1)"
say daemon_json_after_purge "$(cat /etc/docker/daemon.json 2>&1)"
