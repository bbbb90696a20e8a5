#!/usr/bin/env bash
# Start or stop a Docker daemon for commbench's container cluster (root, no systemd needed).
#
#   docker/dockerd.sh start   # a daemon answers already: say so, exit 0; else start dockerd
#                             # in the background and wait until it answers (exit 1 if not)
#   docker/dockerd.sh stop    # stop the daemon only if `start` started it (its pid file)
#   docker/dockerd.sh status  # exit 0 when a daemon answers
#
# `start` prints one line: "started <pid>" or "running" — tests read it to know
# whether they must stop the daemon again. Log: $COMMBENCH_DOCKERD_LOG
# (default /var/log/commbench-dockerd.log).
set -euo pipefail
PIDFILE=${COMMBENCH_DOCKERD_PIDFILE:-/run/commbench-dockerd.pid}
LOG=${COMMBENCH_DOCKERD_LOG:-/var/log/commbench-dockerd.log}
WAIT=${COMMBENCH_DOCKERD_WAIT:-60}

answers() { docker info >/dev/null 2>&1; }

case "${1:-}" in
  start)
    if answers; then echo running; exit 0; fi
    command -v dockerd >/dev/null \
      || { echo "dockerd.sh: dockerd not found: install docker.io (scripts/setup.sh --with-test-deps)" >&2; exit 1; }
    [ "$(id -u)" = 0 ] || { echo "dockerd.sh: starting dockerd needs root" >&2; exit 1; }
    # setsid: the daemon must not die with the shell or test that started it.
    setsid dockerd --pidfile "$PIDFILE.dockerd" >>"$LOG" 2>&1 < /dev/null &
    pid=$!
    echo "$pid" > "$PIDFILE"
    for _ in $(seq "$((WAIT * 4))"); do
      if answers; then echo "started $pid"; exit 0; fi
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.25
    done
    echo "dockerd.sh: dockerd did not answer within ${WAIT}s; last lines of $LOG:" >&2
    tail -n 15 "$LOG" >&2 || true
    kill "$pid" 2>/dev/null || true
    rm -f "$PIDFILE"
    exit 1
    ;;
  stop)
    [ -f "$PIDFILE" ] || { echo "not started here"; exit 0; }
    pid=$(cat "$PIDFILE")
    if kill "$pid" 2>/dev/null; then
      for _ in $(seq 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
      kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$PIDFILE"
    echo "stopped $pid"
    ;;
  status)
    answers
    ;;
  *)
    echo "usage: docker/dockerd.sh start|stop|status" >&2
    exit 2
    ;;
esac
