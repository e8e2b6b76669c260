#!/bin/sh
# Starts the edge proxy in the foreground, once per host: the single-instance guard of
# requirement 2 (deploy/edge/README.md). Used as is by the systemd unit
# (collector-edge-haproxy.service), the container (compose.yaml, service edge-haproxy) and the
# test topology (scripts/edge.sh).
#
# The guard: an exclusive lock on $EDGE_RUN_DIR/haproxy.lock, taken without waiting and held by
# HAProxy itself (the descriptor is inherited through exec, by the master and its workers). While
# any process of a previous instance lives, a new start exits with 75 and systemd tries again
# RestartSec later. (`noreuseport` in haproxy.cfg is the second guard: a second HAProxy cannot
# bind the public port either.)
#
# Environment: everything haproxy.cfg reads (EDGE_*), EDGE_RUN_DIR (default /run/collector-edge),
# HAPROXY (default /usr/sbin/haproxy). Extra arguments go to haproxy.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
run=${EDGE_RUN_DIR:-/run/collector-edge}
export EDGE_RUN_DIR="$run"
haproxy=${HAPROXY:-/usr/sbin/haproxy}
mkdir -p "$run"
exec 9>>"$run/haproxy.lock"
if ! flock -n 9; then
    echo "haproxy-run: another edge proxy holds $run/haproxy.lock; not starting a second one" >&2
    exit 75
fi
"$haproxy" -c -q -f "$here/haproxy.cfg"
# -Ws: master-worker mode (a reload, SIGUSR2, starts new workers and lets the old ones finish;
# a crashed worker makes the master exit, so that the supervisor restarts the whole proxy) and
# readiness notification to systemd when NOTIFY_SOCKET is set.
exec "$haproxy" -Ws -f "$here/haproxy.cfg" -p "$run/haproxy.pid" "$@"
