#!/usr/bin/env bash
# Start dockerd (once) so that `docker run --gpus` reaches actk.
#
# Docker 20.10 registers its `--gpus` device driver only when an executable named
# `nvidia-container-runtime-hook` is on dockerd's PATH at start (ENVIRONMENT.md). We put a
# directory holding that name (a symlink to actk-hook) first on dockerd's PATH; a dockerd that
# already runs without it is restarted, since the driver list is fixed at start.
#
# Usage: scripts/start-dockerd.sh [PATH-TO-actk-hook]
#   default hook: $ACTK_HOOK, else target/debug/actk-hook of this checkout.
# Env: ACTK_HOOKBIN (dir for the symlink, default /usr/local/lib/actk/hookbin),
#      ACTK_DOCKERD_LOG (default /var/log/actk-dockerd.log), ACTK_DOCKERD_TIMEOUT (s, default 60).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
hook=${1:-${ACTK_HOOK:-$repo/target/debug/actk-hook}}
hookbin=${ACTK_HOOKBIN:-/usr/local/lib/actk/hookbin}
log=${ACTK_DOCKERD_LOG:-/var/log/actk-dockerd.log}
timeout=${ACTK_DOCKERD_TIMEOUT:-60}

if [ "$(id -u)" != 0 ]; then
  echo "start-dockerd: must run as root (dockerd needs it)" >&2
  exit 1
fi
command -v dockerd >/dev/null || { echo "start-dockerd: dockerd not found; run scripts/install-deps.sh" >&2; exit 1; }

mkdir -p "$hookbin"
ln -sfn "$hook" "$hookbin/nvidia-container-runtime-hook"
if [ ! -x "$hook" ]; then
  echo "start-dockerd: warning: $hook does not exist yet (build it with 'cargo build --workspace --bins');" \
       "docker run --gpus will not be offered until dockerd restarts with it" >&2
fi

# The pid of a running dockerd, if any (pgrep -x matches the process name exactly).
running_pid() { pgrep -x dockerd | head -n 1 || true; }

# True when dockerd (pid $1) has our hook directory first on its PATH.
has_hookbin() {
  tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null | grep -qx "PATH=$hookbin:.*"
}

# Marker: dockerd was started while the hook did not exist, so it did not register --gpus.
marker=$hookbin/.dockerd-started-without-hook

# Wait until `docker info` answers, or fail with the log tail.
wait_for_docker() {
  for _ in $(seq 1 "$timeout"); do
    if docker info >/dev/null 2>&1; then
      echo "start-dockerd: dockerd answers"
      return 0
    fi
    sleep 1
  done
  echo "start-dockerd: dockerd did not answer 'docker info' within ${timeout} s; last lines of $1:" >&2
  tail -n 30 "$1" >&2 2>/dev/null || journalctl -u docker.service -n 30 --no-pager >&2 || true
  exit 1
}

# On a host where systemd manages docker.service (a usual Debian 12 install), give the service
# the PATH through a drop-in and let systemd restart it: killing a systemd-managed dockerd would
# race with its Restart= policy.
if [ "$(cat /proc/1/comm 2>/dev/null)" = systemd ] && systemctl cat docker.service >/dev/null 2>&1; then
  dropin=/etc/systemd/system/docker.service.d/actk-hook-path.conf
  want=$(printf '[Service]\nEnvironment=PATH=%s:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' "$hookbin")
  changed=
  if [ "$(cat "$dropin" 2>/dev/null)" != "$want" ]; then
    mkdir -p "$(dirname "$dropin")"
    printf '%s\n' "$want" >"$dropin"
    systemctl daemon-reload
    changed=y
  fi
  pid=$(systemctl show -p MainPID --value docker.service 2>/dev/null || echo 0)
  if [ -n "$changed" ] || [ "${pid:-0}" = 0 ] || ! has_hookbin "$pid" || { [ -e "$marker" ] && [ -x "$hook" ]; }; then
    if [ -x "$hook" ]; then rm -f "$marker"; else touch "$marker"; fi
    echo "start-dockerd: (re)starting docker.service with $hookbin first on its PATH ($dropin)"
    systemctl restart docker.service
  fi
  wait_for_docker /dev/null
  exit 0
fi

pid=$(running_pid)
reason=
if [ -n "$pid" ] && ! has_hookbin "$pid"; then
  reason="runs without $hookbin on its PATH"
elif [ -n "$pid" ] && [ -e "$marker" ] && [ -x "$hook" ]; then
  reason="was started before $hook existed"
fi
if [ -n "$reason" ]; then
  echo "start-dockerd: dockerd ($pid) $reason; restarting it so --gpus works"
  kill "$pid"
  for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "start-dockerd: dockerd ($pid) did not stop within 30 s" >&2
    exit 1
  fi
  pid=
fi

if [ -z "$pid" ]; then
  # A stale pid file makes dockerd refuse to start.
  rm -f /var/run/docker.pid
  if [ -x "$hook" ]; then rm -f "$marker"; else touch "$marker"; fi
  PATH="$hookbin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    nohup dockerd >>"$log" 2>&1 </dev/null &
  echo "start-dockerd: started dockerd (pid $!), log in $log"
fi

wait_for_docker "$log"
