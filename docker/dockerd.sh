#!/usr/bin/env bash
# Start or stop a Docker daemon for commbench's container cluster (root, no systemd needed).
#
#   docker/dockerd.sh start   # a daemon answers already: say so, exit 0; else start dockerd
#                             # in the background and wait until it answers (exit 1 if not)
#   docker/dockerd.sh stop    # stop the daemon only if `start` started it (its pid file),
#                             # then remove what it left in the network: the docker0
#                             # bridge, its iptables chains (DOCKER*, filter and nat), the
#                             # FORWARD/nat rules that lead to them or name docker0 or a
#                             # compose bridge (br-*), the MASQUERADE of 172.17.0.0/16, and
#                             # the FORWARD policy DROP (set back to what it was at start)
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

# dockerd sets FORWARD's policy to DROP and leaves it, its chains and docker0 behind when
# it stops; DROP then silently cuts bridged traffic of everything else (the emulated
# cluster's namespaces). Remember the policy before the daemon starts, restore it after.
forward_policy() { iptables -S FORWARD 2>/dev/null | sed -n 's/^-P FORWARD //p'; }

clean_network() {
  if command -v iptables >/dev/null; then
    local table line
    for table in filter nat; do
      # rules of the built-in chains that jump to Docker's chains or name its bridges
      iptables -t "$table" -S 2>/dev/null \
        | grep -E '^-A (FORWARD|INPUT|OUTPUT|PREROUTING|POSTROUTING) ' \
        | grep -E -- '-j DOCKER|docker0|br-[0-9a-f]{12}|-s 172\.17\.0\.0/16 .*MASQUERADE' \
        | while read -r line; do
            eval "iptables -t $table -D ${line#-A }" || true
          done
      for chain in $(iptables -t "$table" -S 2>/dev/null | sed -n 's/^-N \(DOCKER[A-Z0-9-]*\)$/\1/p'); do
        iptables -t "$table" -F "$chain" || true
      done
      for chain in $(iptables -t "$table" -S 2>/dev/null | sed -n 's/^-N \(DOCKER[A-Z0-9-]*\)$/\1/p'); do
        iptables -t "$table" -X "$chain" || true
      done
    done
    local before
    before=$(cat "$PIDFILE.forward" 2>/dev/null || echo ACCEPT)
    [ "$(forward_policy)" = "$before" ] || iptables -P FORWARD "$before" || true
  fi
  if ip link show docker0 >/dev/null 2>&1; then ip link delete docker0 || true; fi
  rm -f "$PIDFILE.forward"
}

case "${1:-}" in
  start)
    if answers; then echo running; exit 0; fi
    command -v dockerd >/dev/null \
      || { echo "dockerd.sh: dockerd not found: install docker.io (scripts/setup.sh --with-test-deps)" >&2; exit 1; }
    [ "$(id -u)" = 0 ] || { echo "dockerd.sh: starting dockerd needs root" >&2; exit 1; }
    # The policy to restore at stop; with a previous daemon's chains still here, its
    # DROP may be theirs: then the kernel's default, ACCEPT.
    if command -v iptables >/dev/null && ! iptables -S 2>/dev/null | grep -q '^-N DOCKER'; then
      forward_policy > "$PIDFILE.forward"
    fi
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
    clean_network
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
