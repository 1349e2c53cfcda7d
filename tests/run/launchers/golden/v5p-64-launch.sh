#!/usr/bin/env bash
# The trainer on this host (written by `dart-jax tpu submit`):
#   bash launch.sh start   stop the trainer this script started before, then start `dart-jax train run.yaml`
#                         detached (it resumes from the run's last checkpoint), output appended to train.log,
#                         its exit code, when it ends, to /mnt/runs/.dart-jax-exit/dart-jax-v5p-64/HOST
#   bash launch.sh stop
set -euo pipefail
cd "$(dirname "$0")"
export PATH="$PWD/.venv/bin:$PATH"
umask 002  # what the trainer writes on the shared root, the group's other users may write too
EXIT=/mnt/runs/.dart-jax-exit/dart-jax-v5p-64/"$(hostname)$(pwd | tr / -)"  # a host (and a workdir: the rehearsal's hosts)
# the launch's session (setsid: its id is the wrapper's): a process of it that runs dart-jax, zombies
# aside. Not the wrapper alone: TERM ends the wrapper at once while the trainer, holding TERM, runs on
alive() { ps -ww -o stat=,args= --sid "$1" 2>/dev/null | awk '$1 !~ /^Z/ && /dart-jax/ { f = 1 } END { exit !f }'; }
gone_within() { local end=$((SECONDS + $2)); while alive "$1"; do [ "$SECONDS" -lt "$end" ] || return 1; sleep 0.1; done; }
stop() {
  [ -f train.pid ] || return 0
  pid=$(cat train.pid); rm -f train.pid
  alive "$pid" || return 0  # gone, or its id was reused
  kill -TERM -- "-$pid" 2>/dev/null || true
  gone_within "$pid" 10 && return 0  # seconds, not tries: ps takes its own time on a loaded host
  kill -KILL -- "-$pid" 2>/dev/null || true  # JAX's preemption notice holds SIGTERM
  gone_within "$pid" 30 || true
}
case "${1:-start}" in
  stop) stop ;;
  start) stop; mkdir -p "$(dirname "$EXIT")"; rm -f "$EXIT"
    setsid bash -c '"$@"; echo $? > "$0.tmp" && mv "$0.tmp" "$0"' "$EXIT" dart-jax train run.yaml \
      >> train.log 2>&1 < /dev/null & echo $! > train.pid ;;
  *) echo "usage: launch.sh start|stop" >&2; exit 2 ;;
esac
