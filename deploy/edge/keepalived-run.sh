#!/bin/sh
# Starts keepalived (VRRP only) in the foreground with deploy/edge/keepalived.conf and this edge's
# parameters taken from the environment. Used as is by the systemd unit
# (collector-edge-keepalived.service), the container (compose.yaml, service edge-keepalived) and
# the test topology (scripts/edge.sh).
#
#   EDGE_NAME            this edge's name (router_id; default: the host name)
#   EDGE_INTERFACE       interface that carries the floating address, e.g. eth0
#   EDGE_ADDRESS         this edge's own address on it (VRRP adverts are sent from it)
#   EDGE_PEER            the other edge's address
#   EDGE_VIP             the floating address with its prefix length, e.g. 203.0.113.10/24
#   EDGE_PRIORITY        1-254; give the edge that should start as the holder the higher one
#   EDGE_VRID            VRRP virtual router id, 1-255, the same on both edges (default 51)
#   EDGE_CHECK_URL       the local proxy's monitor URI (default https://127.0.0.1:443/edge/healthz)
#   EDGE_CHECK_INTERVAL  seconds between checks of the local proxy (default 10)
#   EDGE_RUN_DIR         folder for the generated file and pid files (default /run/collector-edge)
#   KEEPALIVED           the binary (default /usr/sbin/keepalived)
#
# Stopping keepalived cleanly (SIGTERM) is the sign-off of requirement 4: it sends a VRRP advert
# of priority 0 and removes the address, and the other edge takes it at once.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
run=${EDGE_RUN_DIR:-/run/collector-edge}
mkdir -p "$run"
missing=""
for v in EDGE_INTERFACE EDGE_ADDRESS EDGE_PEER EDGE_VIP EDGE_PRIORITY; do
    eval "[ -n \"\${$v:-}\" ]" || missing="$missing $v"
done
if [ -n "$missing" ]; then
    echo "keepalived-run: not set:$missing (see deploy/edge/edge.env.example)" >&2
    exit 2
fi
conf=$run/keepalived.conf
{
    echo "# Written by $0 at each start; the parameters of $here/keepalived.conf."
    echo "\$EDGE_NAME=${EDGE_NAME:-$(uname -n)}"
    echo "\$EDGE_INTERFACE=$EDGE_INTERFACE"
    echo "\$EDGE_ADDRESS=$EDGE_ADDRESS"
    echo "\$EDGE_PEER=$EDGE_PEER"
    echo "\$EDGE_VIP=$EDGE_VIP"
    echo "\$EDGE_PRIORITY=$EDGE_PRIORITY"
    echo "\$EDGE_VRID=${EDGE_VRID:-51}"
    echo "\$EDGE_CHECK_URL=${EDGE_CHECK_URL:-https://127.0.0.1:443/edge/healthz}"
    echo "\$EDGE_CHECK_INTERVAL=${EDGE_CHECK_INTERVAL:-10}"
    echo "include $here/keepalived.conf"
} >"$conf.tmp"
mv -f "$conf.tmp" "$conf"
# keepalived refuses to start while its pid files name a live keepalived: the single-instance
# guard for this daemon.
exec "${KEEPALIVED:-/usr/sbin/keepalived}" --dont-fork --log-console --log-detail --vrrp \
    --use-file "$conf" --pid "$run/keepalived.pid" --vrrp_pid "$run/keepalived-vrrp.pid" "$@"
