#!/bin/sh
# Restarts this edge's proxy without failing a request (requirement 4, deploy/edge/README.md):
#
#   1. the other edge must be healthy (its proxy answers on its own address), or nothing starts;
#   2. drain: new connections to the floating address are dropped silently here (an iptables
#      rule on SYN packets; browsers' TCP stacks send the SYN again after about a second), and
#      the connections already open finish (established or half-open ones to the address, at
#      most EDGE_DRAIN_TIMEOUT seconds);
#   3. sign off: keepalived stops cleanly (a priority-0 advert: the other edge takes the address
#      at once, and the SYNs sent again reach it);
#   4. the proxy restarts here and is waited for; keepalived starts again and rejoins as backup
#      (nopreempt: the address stays where it is);
#   5. the drop rule goes (also when a step fails).
#
# The order matters: a connection that is open while the address moves is lost (its next packet
# reaches the other edge, which answers with a reset), so none may be open at that moment.
#
# Environment: what keepalived-run.sh reads (EDGE_VIP, EDGE_PEER; EDGE_BIND gives the port,
# default 443), EDGE_DRAIN_TIMEOUT (seconds, default 12), and how to stop and start the parts
# (defaults: the systemd units of this folder):
#   EDGE_KEEPALIVED_STOP   systemctl stop collector-edge-keepalived
#   EDGE_PROXY_RESTART     systemctl restart collector-edge-haproxy
#   EDGE_KEEPALIVED_START  systemctl start collector-edge-keepalived
# scripts/edge.sh sets them to its own process control, so that the test runs this very script.
# Needs root (iptables).
set -eu
vip=${EDGE_VIP:?EDGE_VIP is not set}
vip=${vip%/*}
peer=${EDGE_PEER:?EDGE_PEER is not set}
bind=${EDGE_BIND:-:443}
port=${bind##*:}
# Above haproxy.cfg's `timeout http-keep-alive` (10 s), so that HAProxy has closed the idle
# keep-alive connections before the address moves.
drain_timeout=${EDGE_DRAIN_TIMEOUT:-12}
keepalived_stop=${EDGE_KEEPALIVED_STOP:-systemctl stop collector-edge-keepalived}
proxy_restart=${EDGE_PROXY_RESTART:-systemctl restart collector-edge-haproxy}
keepalived_start=${EDGE_KEEPALIVED_START:-systemctl start collector-edge-keepalived}
rule="-d $vip -p tcp --dport $port --syn -m comment --comment collector-edge-drain -j DROP"

say() { echo "planned-restart $(date +%H:%M:%S.%3N): $*" >&2; }
healthz() { curl --silent --fail --insecure --max-time 2 --output /dev/null "https://$1:$port/edge/healthz"; }
# open_connections: established or half-open TCP connections to the floating address. With
# two states `ss` prints a State column first (with one it does not), so the local address is
# looked for in any column rather than in a fixed one.
open_connections() {
    ss -Htn state established state syn-recv "( sport = :$port )" |
        awk -v a="$vip:$port" '{ for (i = 1; i <= NF; i++) if ($i == a) { n++; break } } END { print n + 0 }'
}
holds_address() { ip -o -4 addr show | grep -qF " $vip/"; }
# wait_for SECONDS WHAT CMD...: polls CMD every 50 ms.
wait_for() {
    limit=$1 what=$2
    shift 2
    end=$(( $(date +%s) + limit ))
    until "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$end" ] || { say "gave up waiting ${limit}s for: $what"; return 1; }
        sleep 0.05
    done
}
undrain() {
    while iptables -C INPUT $rule 2>/dev/null; do iptables -D INPUT $rule; done
}
recover() {
    undrain
    sh -c "$keepalived_start" || true
}

healthz "$peer" || { say "the other edge ($peer) does not answer: not signing off"; exit 1; }
holds_address || say "note: this edge does not hold $vip; restarting without moving it"

trap 'say "failed; removing the drop rule, starting keepalived"; recover' EXIT
iptables -C INPUT $rule 2>/dev/null || iptables -I INPUT $rule
say "draining: new connections to $vip:$port are dropped; $(open_connections) open"
no_open_connections() { [ "$(open_connections)" -eq 0 ]; }
wait_for "$drain_timeout" "the open connections to finish" no_open_connections ||
    say "going on with $(open_connections) connections open"

say "signing off: $keepalived_stop"
sh -c "$keepalived_stop"
wait_for 15 "$vip to leave this edge" sh -c "! ip -o -4 addr show | grep -qF ' $vip/'"
wait_for 15 "the other edge to answer on $vip" healthz "$vip"
say "the other edge holds $vip; restarting the proxy: $proxy_restart"
sh -c "$proxy_restart"
wait_for 60 "the proxy to serve again" healthz 127.0.0.1
say "the proxy serves; rejoining as backup: $keepalived_start"
sh -c "$keepalived_start"
trap - EXIT
undrain
say "done"
