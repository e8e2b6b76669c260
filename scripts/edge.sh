#!/usr/bin/env bash
# scripts/edge.sh - the edge in front of the collectors (deploy/edge/: HAProxy and keepalived),
# built on this machine in network namespaces on top of a stack started by scripts/stack.sh, and
# broken on purpose. The tests drive it (tests/tests/edge_failover/); anyone can reproduce each
# step by hand.
#
# Subcommands
#   edge.sh up DIR STACK_DIR
#       Builds the topology (below) on top of the servers that `scripts/stack.sh up STACK_DIR`
#       started: the namespaces, two collectors (the ingress paths), both edges (HAProxy under a
#       stand-in for systemd's Restart=always/RestartSec, keepalived), a test CA and the one
#       certificate both edges serve; runs `collector migrate` and registers the site `demo`
#       (any origin) if it is missing. Waits until the floating address answers through an edge
#       and both paths, then prints shell-sourceable lines (also kept in DIR/edge.env):
#           EDGE_CLIENT_NETNS=<namespace of the client>
#           EDGE_URL=https://192.0.2.100:443
#           EDGE_CA=<PEM file of the test CA>
#   edge.sh fault DIR NAME
#       kill-preferred     SIGKILL the preferred path's collector
#       restart-preferred  start it again (same port and spool) and wait until it is ready
#       freeze-preferred   SIGSTOP it (connections are accepted, requests hang)
#       thaw-preferred     SIGCONT it
#       kill-active-proxy  SIGKILL the HAProxy processes of the edge holding the floating
#                          address; the stand-in supervisor starts it again RestartSec later
#       cut-active-edge    set the link of the edge holding the address down (at the bridge)
#       restore-edge       set the links cut by cut-active-edge up again; wait until one edge
#                          holds the address
#       planned-restart    restart the active edge with sign-off first, by the shipped
#                          deploy/edge/planned-restart.sh: drain (new connections to the address
#                          dropped, open ones finish), stop its keepalived (a priority-0 advert:
#                          the other edge takes the address at once), restart HAProxy gracefully,
#                          wait until it serves, start keepalived again (as backup), undrain
#       paths-down         SIGKILL both collectors
#       paths-up           start both again and wait until they are ready
#       Each fault returns once done (kill-active-proxy and cut-active-edge do not wait for the
#       address to move: see `status`). Prints one line saying what it did.
#   edge.sh status DIR
#       KEY=VALUE lines: EDGE_ACTIVE (edge1, edge2 or none: the edge holding the address whose
#       link is up), and for N in 1 2: EDGEN_ADDRESS (holds the floating address: yes/no),
#       EDGEN_LINK (up/down), EDGEN_PROXY (serving: answers its monitor URI; running; stopped),
#       EDGEN_KEEPALIVED (running/stopped), EDGEN_PATHS
#       (the paths as that edge's HAProxy sees them, e.g. preferred:UP,fallback:DOWN), and
#       COLLECTOR_A / COLLECTOR_B (running/frozen/stopped).
#   edge.sh active DIR
#       Prints edge1, edge2 or none: the edge holding the address whose link is up (quicker than
#       status, for polling).
#   edge.sh down DIR [--purge]
#       Stops every process and removes every namespace `up` made (idempotent). --purge also
#       deletes DIR (logs, spools, the test CA).
#
# Topology (addresses from 192.0.2.0/24, TEST-NET-1, inside the namespaces only; nothing is added
# to the root namespace, nothing leaves the machine):
#
#   cedge-T-client  lan0 192.0.2.10 ─┐
#   cedge-T-edge1   lan0 192.0.2.11 ─┼─ br0 in cedge-T-lan       floating address 192.0.2.100/24
#   cedge-T-edge2   lan0 192.0.2.12 ─┘                           (keepalived, VRRP unicast)
#
#   HAProxy in each edge namespace ── 127.0.0.1 of the root namespace ──► collector-a (preferred)
#                                                                      └► collector-b (fallback)
#   The collectors run in the root namespace beside the stack (loopback only). The edges reach
#   them through HAProxy's `namespace` server option: the root namespace is given a name
#   (cedge-T-host, `ip netns attach`), and the servers' sockets are opened in it. So the
#   processes broken by the faults are the collectors themselves, as in production, with no relay
#   in between whose own behaviour would blur what the edge sees.
#
# T is derived from DIR, so several topologies can coexist. DIR holds edge.env, the TLS files
# (tls/), collector-a/ and collector-b/ (spool, log, pid, port) and edge1/, edge2/ (haproxy.log,
# keepalived.log, run/: pid files, the HAProxy runtime socket, the lock of the single-instance
# guard).
#
# Environment: COLLECTOR_BIN (default: target/release/collector, else target/debug/collector),
# EDGE_DATABASE (PostgreSQL and ClickHouse database of the collectors; default collector),
# EDGE_CHECK_INTERVAL (seconds between keepalived's checks of the local proxy; default 10, as
# shipped), EDGE_HOLD_MS (see deploy/edge/haproxy.cfg), EDGE_KEEP_FAILED (set: a failed `up`
# leaves what it built, for a look; `down` removes it). Needs root (namespaces).
set -euo pipefail
SCRIPT_NAME=edge
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # log, die, wait_until, alloc_ports, ...

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEPLOY=$ROOT/deploy/edge
SELF=$ROOT/scripts/edge.sh
NET=192.0.2
VIP=$NET.100
PORT=443
WAIT=${EDGE_WAIT_TIMEOUT:-60}   # seconds any wait may take

stamp() { date +%H:%M:%S.%3N; }

usage() {
    sed -n '/^# Subcommands/,/^# Topology/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
}

# ------------------------------------------------------------------ state ---

set_dir() {
    DIR=${1:-}
    [[ -n $DIR ]] || usage
    [[ $DIR == /* ]] || die "DIR must be an absolute path: $DIR"
    [[ $DIR =~ ^/[A-Za-z0-9._/+-]+$ ]] || die "DIR may only contain [A-Za-z0-9._/+-]: $DIR"
    DIR=${DIR%/}
    # HAProxy's runtime socket lives in DIR/edgeN/run; a unix socket path has 107 bytes at most.
    (( ${#DIR} <= 80 )) || die "DIR is too long for the unix sockets under it (80 bytes at most): $DIR"
    TAG=$(printf '%s' "$DIR" | md5sum | cut -c1-6)
    NS_LAN=cedge-$TAG-lan
    NS_CLIENT=cedge-$TAG-client
    NS_HOST=cedge-$TAG-host
    ENV_FILE=$DIR/edge.env
}

ns_of() { echo "cedge-$TAG-$1"; }          # ns_of edge1
ns_exists() { [[ -e /run/netns/$1 ]]; }

load_state() {
    [[ -f $DIR/state ]] || die "no edge topology in $DIR (run: scripts/edge.sh up DIR STACK_DIR)"
    local k v
    while IFS='=' read -r k v; do
        [[ $k =~ ^[A-Z][A-Z0-9_]*$ ]] && printf -v "$k" '%s' "$v"
    done <"$DIR/state"
}

# ------------------------------------------------------------- processes ---

proc_state() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
    stat=${stat##*) }
    echo "${stat%% *}"
}

# alive PIDFILE: prints the pid if that process lives (zombies count as dead).
alive() {
    local pid st
    pid=$(cat "$1" 2>/dev/null || true)
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    st=$(proc_state "$pid")
    [[ -n $st && $st != Z && $st != X ]] || return 1
    echo "$pid"
}

wait_gone() { # wait_gone PID SECONDS
    local deadline=$(( $(now_ms) + $2 * 1000 )) st
    while :; do
        st=$(proc_state "$1")
        [[ -z $st || $st == Z || $st == X ]] && return 0
        (( $(now_ms) < deadline )) || return 1
        sleep 0.05
    done
}

# spawn PIDFILE LOGFILE CMD...: CMD detached in its own session, stdio to LOGFILE; the child
# writes its pid before exec'ing CMD.
spawn() {
    local pidfile=$1 logfile=$2 deadline
    shift 2
    rm -f "$pidfile"
    setsid bash -c 'echo $$ >"$0"; exec "$@"' "$pidfile" "$@" </dev/null >>"$logfile" 2>&1 &
    deadline=$(( $(now_ms) + 5000 ))
    until [[ -s $pidfile ]]; do
        (( $(now_ms) < deadline )) || die "could not start: $*"
        sleep 0.02
    done
}

# stop_pid PID SECONDS [SIGNAL]: SIGCONT, SIGNAL (default TERM), wait, then SIGKILL.
stop_pid() {
    local pid=$1 limit=$2 sig=${3:-TERM}
    kill -CONT "$pid" 2>/dev/null || true
    kill "-$sig" "$pid" 2>/dev/null || true
    wait_gone "$pid" "$limit" && return 0
    log "pid $pid ignored SIG$sig for ${limit}s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    wait_gone "$pid" 10 || true
}

# ------------------------------------------------------------- collectors ---

collector_bin() {
    if [[ -n ${COLLECTOR_BIN:-} ]]; then
        echo "$COLLECTOR_BIN"
    elif [[ -x ${CARGO_TARGET_DIR:-$ROOT/target}/release/collector ]]; then
        echo "${CARGO_TARGET_DIR:-$ROOT/target}/release/collector"
    elif [[ -x ${CARGO_TARGET_DIR:-$ROOT/target}/debug/collector ]]; then
        echo "${CARGO_TARGET_DIR:-$ROOT/target}/debug/collector"
    else
        die "no collector binary: cargo build -p collector --bin collector (or set COLLECTOR_BIN)"
    fi
}

# collector_env NAME: the environment of collector NAME (a or b) as KEY=VALUE words.
collector_env() {
    local port
    port=$(cat "$DIR/collector-$1/port")
    echo "COLLECTOR_LISTEN=127.0.0.1:$port" \
        "COLLECTOR_ADMIN_LISTEN=127.0.0.1:$(cat "$DIR/collector-$1/admin-port")" \
        "COLLECTOR_DATABASE_URL=postgres://postgres@127.0.0.1:$PG_PORT/$DATABASE" \
        "COLLECTOR_CLICKHOUSE_URLS=$CLICKHOUSE_URLS" \
        "COLLECTOR_CLICKHOUSE_DATABASE=$DATABASE" \
        "COLLECTOR_SPOOL_DIR=$DIR/collector-$1/spool" \
        "COLLECTOR_TRUSTED_PROXIES=127.0.0.1/32" \
        "COLLECTOR_CLIENT_RATE=0"
    # COLLECTOR_TRUSTED_PROXIES: the edges' connections come from 127.0.0.1 (their sockets are
    # opened in the root namespace), with the client's address in X-Forwarded-For.
    # COLLECTOR_CLIENT_RATE=0: the test client is one address playing many browsers.
}

collector_ready() {
    curl -fsS --max-time 2 -o /dev/null "http://127.0.0.1:$(cat "$DIR/collector-$1/port")/readyz"
}

collector_start() {
    local name=$1 bin
    bin=$(collector_bin)
    if alive "$DIR/collector-$name/pid" >/dev/null; then
        log "collector-$name is already running"
    else
        # shellcheck disable=SC2046 # one word per variable
        spawn "$DIR/collector-$name/pid" "$DIR/collector-$name/collector.log" \
            env $(collector_env "$name") "$bin" serve
    fi
    wait_until "$WAIT" "collector-$name ready on port $(cat "$DIR/collector-$name/port")" \
        collector_ready "$name"
}

collector_signal() { # collector_signal NAME SIGNAL
    local pid
    pid=$(alive "$DIR/collector-$1/pid") || die "collector-$1 is not running"
    kill "-$2" "$pid"
    echo "$pid"
}

collector_state() {
    local pid
    if pid=$(alive "$DIR/collector-$1/pid"); then
        [[ $(proc_state "$pid") == T ]] && echo frozen || echo running
    else
        echo stopped
    fi
}

# ------------------------------------------------------------------ edges ---

edge_ns() { ns_of "$1"; }
edge_ip() { [[ $1 == edge1 ]] && echo "$NET.11" || echo "$NET.12"; }
peer_of() { [[ $1 == edge1 ]] && echo edge2 || echo edge1; }

# edge_env EDGE: the environment of an edge's processes, one KEY=VALUE per line
# (deploy/edge/edge.env.example explains each).
edge_env() {
    local e=$1
    printf '%s\n' \
        "EDGE_NAME=$e" \
        "EDGE_RUN_DIR=$DIR/$e/run" \
        "EDGE_BIND=:$PORT" \
        "EDGE_CERT=$DIR/tls/edge.pem" \
        "EDGE_PREFERRED=127.0.0.1:$(cat "$DIR/collector-a/port")" \
        "EDGE_FALLBACK=127.0.0.1:$(cat "$DIR/collector-b/port")" \
        "EDGE_SERVER_OPTIONS=namespace $NS_HOST" \
        "EDGE_MAXCONN=4000" \
        "EDGE_INTERFACE=lan0" \
        "EDGE_ADDRESS=$(edge_ip "$e")" \
        "EDGE_PEER=$(edge_ip "$(peer_of "$e")")" \
        "EDGE_VIP=$VIP/24" \
        "EDGE_PRIORITY=$([[ $e == edge1 ]] && echo 250 || echo 240)" \
        "EDGE_VRID=51" \
        "EDGE_CHECK_URL=https://127.0.0.1:$PORT/edge/healthz" \
        "EDGE_CHECK_INTERVAL=$CHECK_INTERVAL" \
        "EDGE_USER=root" "EDGE_GROUP=root" "EDGE_CHROOT=/"
    # EDGE_USER, EDGE_GROUP, EDGE_CHROOT: this topology's edges reach the collectors through
    # `namespace` (setns for every connection), which only root may do; the shipped default
    # (haproxy, /var/lib/haproxy) is tested on its own (tests/tests/access/).
    # Only when given: otherwise haproxy.cfg's default applies.
    [[ -z ${EDGE_HOLD_MS:-} ]] || echo "EDGE_HOLD_MS=$EDGE_HOLD_MS"
    # EDGE_MAXCONN: HAProxy needs two descriptors per connection, and the hard limit of open
    # files here may be lower than the unit's LimitNOFILE.
}

# The restart delay of the shipped unit: the stand-in supervisor uses the same.
restart_sec() {
    local s
    s=$(sed -n 's/^RestartSec=\([0-9][0-9]*\)s\{0,1\}$/\1/p' "$DEPLOY/collector-edge-haproxy.service")
    [[ $s =~ ^[0-9]+$ ]] || die "no RestartSec=N in $DEPLOY/collector-edge-haproxy.service"
    echo "$s"
}

# _supervise EDGE_DIR: runs inside the edge's namespace, in place of systemd: starts
# deploy/edge/haproxy-run.sh and, whenever it exits, starts it again RestartSec seconds later
# (at once after a planned restart, as `systemctl restart` would; never after `down`).
cmd_supervise() {
    local d=$1 delay rc
    delay=$(restart_sec)
    while [[ ! -e $d/stop ]]; do
        echo "supervisor $(stamp): starting deploy/edge/haproxy-run.sh"
        rc=0
        "$DEPLOY/haproxy-run.sh" || rc=$?
        echo "supervisor $(stamp): the proxy exited with status $rc"
        [[ -e $d/stop ]] && break
        if [[ -e $d/restart-now ]]; then
            rm -f "$d/restart-now"
        else
            echo "supervisor $(stamp): restarting in ${delay}s (Restart=always, RestartSec=$delay)"
            sleep "$delay"
        fi
    done
}

proxy_start() {
    local e=$1
    rm -f "$DIR/$e/stop"
    if alive "$DIR/$e/supervisor.pid" >/dev/null; then
        return 0
    fi
    local env
    mapfile -t env < <(edge_env "$e")
    spawn "$DIR/$e/supervisor.pid" "$DIR/$e/haproxy.log" \
        ip netns exec "$(edge_ns "$e")" env "${env[@]}" bash "$SELF" _supervise "$DIR/$e"
}

proxy_answers() {
    ip netns exec "$(edge_ns "$1")" curl -fsS -k --max-time 2 -o /dev/null \
        "https://127.0.0.1:$PORT/edge/healthz"
}

# proxy_pids EDGE: the HAProxy processes in the edge's namespace.
proxy_pids() {
    local pid
    for pid in $(ip netns pids "$(edge_ns "$1")" 2>/dev/null); do
        [[ $(cat "/proc/$pid/comm" 2>/dev/null) == haproxy ]] && echo "$pid"
    done
    return 0
}

keepalived_start() {
    local e=$1
    alive "$DIR/$e/keepalived.pid" >/dev/null && return 0
    local env
    mapfile -t env < <(edge_env "$e")
    spawn "$DIR/$e/keepalived.pid" "$DIR/$e/keepalived.log" \
        ip netns exec "$(edge_ns "$e")" env "${env[@]}" "$DEPLOY/keepalived-run.sh"
}

keepalived_stop() { # the sign-off: SIGTERM, keepalived sends priority 0 and drops the address
    local pid
    pid=$(alive "$DIR/$1/keepalived.pid") || return 0
    stop_pid "$pid" 30
}

holds_address() { ip -n "$(edge_ns "$1")" -o -4 addr show dev lan0 2>/dev/null | grep -qF " $VIP/"; }
link_up() { [[ ! -e $DIR/$1/cut ]]; }

# active_edge: the edge holding the address with its link up (what the client reaches).
active_edge() {
    local e
    for e in edge1 edge2; do
        if holds_address "$e" && link_up "$e"; then echo "$e"; return 0; fi
    done
    echo none
}
one_holder() {
    local n=0 e
    for e in edge1 edge2; do holds_address "$e" && n=$((n + 1)); done
    (( n == 1 ))
}

# paths EDGE: "preferred:UP,fallback:UP" from the edge's HAProxy (runtime API over its socket).
paths() {
    local sock=$DIR/$1/run/haproxy.sock out
    out=$(echo "show stat ingress 4 -1" | socat -t 2 stdio "unix-connect:$sock" 2>/dev/null) || { echo unknown; return 0; }
    awk -F, '$1 == "ingress" && $2 != "BACKEND" { printf "%s%s:%s", sep, $2, $18; sep = "," }' <<<"$out"
    echo
}

client_reaches_edge() {
    ip netns exec "$NS_CLIENT" curl -fsS --max-time 3 --cacert "$DIR/tls/ca.pem" -o /dev/null \
        "https://$VIP:$PORT/readyz"
}

# ---------------------------------------------------------------- network ---

net_up() {
    local e
    ip netns add "$NS_LAN"
    ip -n "$NS_LAN" link set lo up
    ip -n "$NS_LAN" link add br0 type bridge
    ip -n "$NS_LAN" link set br0 up
    add_host() { # add_host NAMESPACE PORTNAME ADDRESS
        ip netns add "$1"
        ip -n "$1" link set lo up
        ip -n "$NS_LAN" link add "$2" type veth peer name lan0 netns "$1"
        ip -n "$NS_LAN" link set "$2" master br0 up
        ip -n "$1" addr add "$3/24" dev lan0
        ip -n "$1" link set lan0 up
    }
    add_host "$NS_CLIENT" client "$NET.10"
    for e in edge1 edge2; do add_host "$(edge_ns "$e")" "$e" "$(edge_ip "$e")"; done
    # The root namespace by name, for HAProxy's `namespace` server option (see the top).
    ip netns attach "$NS_HOST" $$
}

tls_files() {
    local t=$DIR/tls
    mkdir -p "$t"
    [[ -s $t/edge.pem ]] && return 0
    (
        cd "$t"
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
            -subj "/CN=collector edge test CA" -keyout ca.key -out ca.pem
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
            -subj "/CN=$VIP" -keyout edge.key -out edge.csr
        printf 'subjectAltName=IP:%s,DNS:edge.test\nextendedKeyUsage=serverAuth\n' "$VIP" >ext.cnf
        openssl x509 -req -in edge.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \
            -extfile ext.cnf -out edge.crt
        # One file with chain and key, the same for both edges (requirement 3).
        cat edge.crt edge.key >edge.pem
        chmod 600 ca.key edge.key edge.pem
    ) >"$t/openssl.log" 2>&1 || { cat "$t/openssl.log" >&2; die "could not make the test certificates"; }
}

# ------------------------------------------------------------ subcommands ---

cmd_up() {
    set_dir "${1:-}"
    local stack=${2:-} e k v
    [[ -n $stack && -f $stack/stack.env ]] || die "no stack.env in '${stack}' (scripts/stack.sh up STACK_DIR first)"
    [[ $EUID -eq 0 ]] || die "needs root (network namespaces)"
    for k in haproxy keepalived socat curl openssl iptables ss; do
        command -v "$k" >/dev/null || die "$k is missing; run: scripts/stack.sh install"
    done
    if ns_exists "$NS_LAN" || [[ -f $DIR/state ]]; then
        die "a topology exists for $DIR; run: scripts/edge.sh down $DIR"
    fi
    while IFS='=' read -r k v; do
        [[ $k =~ ^[A-Z][A-Z0-9_]*$ ]] && printf -v "$k" '%s' "$v"
    done <"$stack/stack.env"
    DATABASE=${EDGE_DATABASE:-collector}
    CHECK_INTERVAL=${EDGE_CHECK_INTERVAL:-10}
    [[ $DATABASE =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || die "EDGE_DATABASE must be an identifier: $DATABASE"
    mkdir -p "$DIR"/{collector-a,collector-b}/spool "$DIR"/{edge1,edge2}/run
    # Markers a previous topology in this DIR may have left.
    rm -f "$DIR"/{edge1,edge2}/{cut,stop,restart-now}
    local pa pb aa ab ports
    ports=$(alloc_ports 4)
    read -r pa pb aa ab <<<"$ports"
    echo "$pa" >"$DIR/collector-a/port"
    echo "$pb" >"$DIR/collector-b/port"
    # Each collector's operations listener (/metrics, /readyz with its reason): a port of its
    # own, or the second would find the default 127.0.0.1:9464 taken.
    echo "$aa" >"$DIR/collector-a/admin-port"
    echo "$ab" >"$DIR/collector-b/admin-port"
    {
        echo "STACK_DIR=$stack"
        echo "PG_PORT=$PG_PORT"
        echo "CLICKHOUSE_URLS=$CLICKHOUSE_URLS"
        echo "DATABASE=$DATABASE"
        echo "CHECK_INTERVAL=$CHECK_INTERVAL"
    } >"$DIR/state"
    local t0
    t0=$(now_ms)
    # Whatever fails from here on (every failure exits) leaves nothing behind.
    UP_DONE=0
    trap 'if [[ $UP_DONE != 1 && -z ${EDGE_KEEP_FAILED:-} ]]; then log "up failed; removing what was built"; cmd_down "$DIR" || true; fi' EXIT

    tls_files
    local bin envs COLLECTOR
    bin=$(collector_bin)
    read -ra envs <<<"$(collector_env a)"
    COLLECTOR=(env "${envs[@]}" "$bin")
    # The site demo, any origin (no --origin).
    bootstrap_site "$DIR/bootstrap.log" --if-missing demo
    collector_start a
    collector_start b

    net_up
    for e in edge1 edge2; do proxy_start "$e"; done
    for e in edge1 edge2; do wait_until "$WAIT" "the proxy of $e answering" proxy_answers "$e"; done
    for e in edge1 edge2; do keepalived_start "$e"; done
    wait_until "$WAIT" "an edge holding $VIP" one_holder
    wait_until "$WAIT" "the client reaching https://$VIP:$PORT/readyz" client_reaches_edge
    UP_DONE=1
    {
        echo "EDGE_CLIENT_NETNS=$NS_CLIENT"
        echo "EDGE_URL=https://$VIP:$PORT"
        echo "EDGE_CA=$DIR/tls/ca.pem"
    } >"$ENV_FILE"
    log "up in $(( ($(now_ms) - t0) / 100 ))00 ms; $(active_edge) holds $VIP; logs in $DIR/{edge1,edge2,collector-a,collector-b}"
    cat "$ENV_FILE"
}

cmd_fault() {
    set_dir "${1:-}"
    load_state
    local name=${2:-} e peer pid deadline
    case $name in
        kill-preferred)
            pid=$(collector_signal a KILL)
            wait_gone "$pid" 10 || die "collector-a (pid $pid) survived SIGKILL"
            echo "killed collector-a (pid $pid), the preferred path" ;;
        restart-preferred)
            collector_start a
            echo "collector-a (the preferred path) is ready" ;;
        freeze-preferred)
            pid=$(collector_signal a STOP)
            echo "froze collector-a (pid $pid), the preferred path" ;;
        thaw-preferred)
            pid=$(collector_signal a CONT)
            echo "thawed collector-a (pid $pid), the preferred path" ;;
        kill-active-proxy)
            e=$(active_edge)
            [[ $e != none ]] || die "no edge holds $VIP"
            pid=$(proxy_pids "$e" | tr '\n' ' ')
            [[ -n $pid ]] || die "the proxy of $e is not running"
            # shellcheck disable=SC2086
            kill -KILL $pid
            echo "killed the proxy of $e (pids $pid), which held $VIP" ;;
        cut-active-edge)
            e=$(active_edge)
            [[ $e != none ]] || die "no edge holds $VIP"
            touch "$DIR/$e/cut"
            ip -n "$NS_LAN" link set "$e" down
            echo "cut $e off (its link is down), which held $VIP" ;;
        restore-edge)
            local restored=""
            for e in edge1 edge2; do
                [[ -e $DIR/$e/cut ]] || continue
                ip -n "$NS_LAN" link set "$e" up
                rm -f "$DIR/$e/cut"
                restored+=" $e"
            done
            [[ -n $restored ]] || die "no edge is cut off"
            wait_until "$WAIT" "one edge holding $VIP after restoring$restored" one_holder
            echo "restored$restored; $(active_edge) holds $VIP" ;;
        planned-restart)
            e=$(active_edge)
            [[ $e != none ]] || die "no edge holds $VIP"
            local env
            mapfile -t env < <(edge_env "$e")
            # The shipped procedure, with this script's process control in place of systemctl.
            ip netns exec "$(edge_ns "$e")" env "${env[@]}" \
                EDGE_KEEPALIVED_STOP="bash $SELF _edge $DIR keepalived-stop $e" \
                EDGE_PROXY_RESTART="bash $SELF _edge $DIR proxy-restart $e" \
                EDGE_KEEPALIVED_START="bash $SELF _edge $DIR keepalived-start $e" \
                "$DEPLOY/planned-restart.sh" >>"$DIR/$e/planned-restart.log" 2>&1 ||
                { tail -n 20 "$DIR/$e/planned-restart.log" >&2; die "planned restart of $e failed"; }
            echo "restarted $e with sign-off (drain, keepalived stopped, proxy restarted, rejoined as backup); $(active_edge) holds $VIP" ;;
        paths-down)
            local pa pb
            pa=$(collector_signal a KILL)
            pb=$(collector_signal b KILL)
            wait_gone "$pa" 10 && wait_gone "$pb" 10 || die "a collector survived SIGKILL"
            echo "killed both paths: collector-a (pid $pa) and collector-b (pid $pb)" ;;
        paths-up)
            collector_start a
            collector_start b
            echo "both paths are ready" ;;
        *) usage ;;
    esac
}

# _edge DIR ACTION EDGE: the process control that deploy/edge/planned-restart.sh calls in place
# of systemctl (see planned-restart in cmd_fault).
cmd_edge_internal() {
    set_dir "${1:-}"
    load_state
    local action=$2 e=$3 pid
    case $action in
        keepalived-stop) keepalived_stop "$e" ;;
        keepalived-start) keepalived_start "$e" ;;
        proxy-restart)
            # As `systemctl restart` would: stop gracefully (SIGUSR1: soft stop, requests in
            # flight finish) and start at once, then return once it serves.
            pid=$(alive "$DIR/$e/run/haproxy.pid") || die "the proxy of $e is not running"
            touch "$DIR/$e/restart-now"
            kill -USR1 "$pid"
            wait_gone "$pid" 30 || die "the proxy of $e did not stop"
            wait_until "$WAIT" "the proxy of $e answering again" proxy_answers "$e" ;;
        *) die "unknown action $action" ;;
    esac
}

cmd_status() {
    set_dir "${1:-}"
    load_state
    local e n
    echo "EDGE_ACTIVE=$(active_edge)"
    for e in edge1 edge2; do
        n=${e#edge}
        echo "EDGE${n}_ADDRESS=$(holds_address "$e" && echo yes || echo no)"
        echo "EDGE${n}_LINK=$(link_up "$e" && echo up || echo down)"
        if proxy_answers "$e"; then
            echo "EDGE${n}_PROXY=serving"
        elif [[ -n $(proxy_pids "$e") ]]; then
            echo "EDGE${n}_PROXY=running"
        else
            echo "EDGE${n}_PROXY=stopped"
        fi
        echo "EDGE${n}_KEEPALIVED=$(alive "$DIR/$e/keepalived.pid" >/dev/null && echo running || echo stopped)"
        echo "EDGE${n}_PATHS=$(paths "$e")"
    done
    echo "COLLECTOR_A=$(collector_state a)"
    echo "COLLECTOR_B=$(collector_state b)"
}

cmd_down() {
    set_dir "${1:-}"
    local purge=${2:-} e ns pid pids
    for e in edge1 edge2; do
        [[ -d $DIR/$e ]] && touch "$DIR/$e/stop"
    done
    # Every process in our namespaces (HAProxy, keepalived, supervisors, checks) is ours.
    for ns in "$(ns_of edge1)" "$(ns_of edge2)" "$NS_CLIENT" "$NS_LAN"; do
        ns_exists "$ns" || continue
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        # shellcheck disable=SC2086
        [[ -z $pids ]] || kill -CONT $pids 2>/dev/null || true
        # shellcheck disable=SC2086
        [[ -z $pids ]] || kill -TERM $pids 2>/dev/null || true
    done
    for ns in "$(ns_of edge1)" "$(ns_of edge2)" "$NS_CLIENT" "$NS_LAN"; do
        ns_exists "$ns" || continue
        for pid in $(ip netns pids "$ns" 2>/dev/null || true); do
            wait_gone "$pid" 10 || { kill -KILL "$pid" 2>/dev/null || true; wait_gone "$pid" 5 || true; }
        done
        ip netns del "$ns" 2>/dev/null || log "could not remove namespace $ns"
    done
    ns_exists "$NS_HOST" && { ip netns del "$NS_HOST" 2>/dev/null || log "could not remove $NS_HOST"; }
    for e in a b; do
        # SIGINT: drain without the grace period (the writer still flushes what it can).
        pid=$(alive "$DIR/collector-$e/pid") && stop_pid "$pid" 30 INT
    done
    if [[ $purge == --purge ]]; then
        rm -rf "$DIR"
    elif [[ -d $DIR ]]; then
        rm -f "$DIR/state" "$ENV_FILE"
    fi
    log "down: $DIR"
}

main() {
    local cmd=${1:-}
    shift || true
    case $cmd in
        up)         cmd_up "$@" ;;
        fault)      cmd_fault "$@" ;;
        status)     cmd_status "$@" ;;
        active)     set_dir "${1:-}"; load_state; active_edge ;;
        down)       cmd_down "$@" ;;
        _supervise) cmd_supervise "$@" ;;
        _edge)      cmd_edge_internal "$@" ;;
        *)          usage ;;
    esac
}

main "$@"
