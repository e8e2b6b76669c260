#!/usr/bin/env bash
# scripts/check-containers.sh - checks the container files (Dockerfile, .dockerignore,
# compose.yaml and its configs under deploy/) on a machine WITHOUT a container engine:
#
#   compose     `docker-compose config -q` (Debian's docker-compose v1 validates the file
#               without an engine), then scripts/check-containers.py on the resolved file:
#               restart policies, drain vs stop_grace_period, replica orders, spool volumes,
#               subnet, published ports, mounted files, pinned images, the demo page copy
#   caddy       `caddy validate` of deploy/caddy/Caddyfile (Debian's Caddy)
#   clickhouse  every XML file parses; the replica configs have the shape scripts/stack.sh
#               writes (macros, remote_servers, zookeeper) and agree with compose.yaml.
#               (Debian's ClickHouse 18.16 cannot load a 24.x-style config, so none is started.)
#   postgres    the local PostgreSQL 15 runs with deploy/postgres/{postgresql,pg_hba}.conf:
#               a primary initialised by init-primary.sh, logins as the collector over TCP,
#               the repository's schema applied as that user, and a standby cloned by
#               standby-entrypoint.sh (pg_basebackup -R) that streams from the primary
#   dockerfile  built when an engine answers (`docker info`); otherwise checked statically,
#               and its dependency layer replayed with `cargo metadata` in place of
#               `cargo build` (the workspace must load from the manifests alone)
#
# Idempotent; installs what is missing with apt-get (docker-compose, caddy, postgresql-15).
# Ends with "containers: N passed, 0 failed"; exits 1 if any check failed. Needs root (apt-get,
# and PostgreSQL runs as the postgres user).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=/usr/bin/python3          # Debian's, which has python3-yaml (a docker-compose dependency)
PG_BIN=/usr/lib/postgresql/15/bin

PASS=0 FAIL=0 SKIP=0
LAST_OK=0                    # whether the last `check` passed
TMP=$(mktemp -d /tmp/check-containers.XXXXXX)
PG=$TMP/pg                   # temporary PostgreSQL servers: $PG/primary, $PG/standby

cleanup() {
    local d
    for d in "$PG"/*/pgdata; do
        [[ -f $d/postmaster.pid ]] || continue
        runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$d" stop -m immediate -w -t 10 >/dev/null 2>&1 || true
    done
    rm -rf "$TMP"
}
trap cleanup EXIT

pass() { PASS=$((PASS + 1)); printf 'ok    %s\n' "$1"; }
skip() { SKIP=$((SKIP + 1)); printf 'skip  %s\n' "$1"; }
fail() {
    FAIL=$((FAIL + 1)); printf 'FAIL  %s\n' "$1"
    if [[ -n ${2:-} && -s $2 ]]; then sed 's/^/      /' "$2" | tail -n 25; fi
}
# check NAME CMD...: runs CMD (a function or a command) in a subshell that stops at its first
# failing command, output to a file shown only on failure. Sets LAST_OK; always returns 0.
# (Bash ignores `set -e` inside a function called as an `if` condition, hence a subshell
# started outside of any condition.)
check() {
    local name=$1 out rc
    shift
    out=$(mktemp "$TMP/out.XXXXXX")
    set +e
    ( set -e; "$@" ) >"$out" 2>&1
    rc=$?
    set -e
    if [[ $rc -eq 0 ]]; then pass "$name"; LAST_OK=1; else fail "$name" "$out"; LAST_OK=0; fi
}

# --------------------------------------------------------------- installs ---

pkg_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

install_missing() {
    local need=() p
    for p in docker-compose caddy python3-yaml; do pkg_installed "$p" || need+=("$p"); done
    [[ -x $PG_BIN/postgres && -x $PG_BIN/pg_basebackup ]] || need+=(postgresql-15)
    [[ ${#need[@]} -eq 0 ]] && return 0
    [[ $EUID -eq 0 ]] || { echo "check-containers: run as root to install: ${need[*]}" >&2; exit 1; }
    echo "check-containers: installing ${need[*]}" >&2
    # Keep the packages' maintainer scripts from starting Caddy or PostgreSQL as services.
    local policy=/usr/sbin/policy-rc.d added=0 rc=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        added=1
    fi
    {
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" ||
            { apt-get update -qq &&
                DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"; }
    } >"$TMP/apt.log" 2>&1 || rc=$?
    [[ $added -eq 1 ]] && rm -f "$policy"
    if [[ $rc -ne 0 ]]; then
        tail -n 20 "$TMP/apt.log" >&2
        echo "check-containers: apt-get install ${need[*]} failed" >&2
        exit 1
    fi
}

# ---------------------------------------------------------------- compose ---

# compose ENV_FILE ARGS...: docker-compose on compose.yaml with the passwords of ENV_FILE
# only (not the caller's environment, not a real .env).
compose() {
    env -u POSTGRES_PASSWORD -u COLLECTOR_DB_PASSWORD -u REPLICATION_PASSWORD -u GRAFANA_ADMIN_PASSWORD \
        docker-compose --env-file "$1" --project-directory "$ROOT" -f "$ROOT/compose.yaml" "${@:2}"
}
compose_requires_passwords() {
    : >"$TMP/empty.env"
    if compose "$TMP/empty.env" config -q >"$TMP/nopw.out" 2>&1; then
        echo "docker-compose config passed without POSTGRES_PASSWORD & co"
        return 1
    fi
    grep -q 'in .env' "$TMP/nopw.out"
}

# ------------------------------------------------------------------ caddy ---

caddy_validate() {
    # Caddy wants somewhere to keep its state: not the caller's home.
    XDG_DATA_HOME=$TMP/caddy XDG_CONFIG_HOME=$TMP/caddy HOME=$TMP/caddy \
        caddy validate --adapter caddyfile --config "$ROOT/deploy/caddy/Caddyfile"
}
caddy_formatted() {
    caddy fmt "$ROOT/deploy/caddy/Caddyfile" | diff -u "$ROOT/deploy/caddy/Caddyfile" -
}

# --------------------------------------------------------------- postgres ---

as_pg() { runuser -u postgres -- "$@"; }
free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# pg_start NAME PORT: the server of $PG/NAME/pgdata with the deploy configs, on loopback.
pg_start() {
    as_pg "$PG_BIN/pg_ctl" -D "$PG/$1/pgdata" -l "$PG/$1.log" -w -t 30 start -o "\
        -c config_file=$PG/postgresql.conf -c hba_file=$PG/pg_hba.conf \
        -c port=$2 -c listen_addresses=127.0.0.1 -c unix_socket_directories=$PG" >/dev/null ||
        { cat "$PG/$1.log"; return 1; }
}
# sql PORT DB SQL: as the postgres superuser over the unix socket (peer authentication).
sql() { as_pg "$PG_BIN/psql" -X -qtA -v ON_ERROR_STOP=1 -h "$PG" -p "$1" -d "$2" -c "$3"; }
# wait_for PORT DB SQL WANT: until SQL answers WANT (10 s at most).
wait_for() {
    local i got=""
    for ((i = 0; i < 100; i++)); do
        got=$(sql "$1" "$2" "$3" 2>/dev/null || true)
        [[ $got == "$4" ]] && return 0
        sleep 0.1
    done
    echo "port $1: '$3' answered '$got', not '$4'"
    return 1
}

pg_primary() {
    # The postgres user must reach the folder (mktemp makes it 0700, owned by root).
    chmod 755 "$TMP"
    mkdir -p "$PG/primary"
    install -m 644 deploy/postgres/postgresql.conf deploy/postgres/pg_hba.conf "$PG/"
    install -m 755 deploy/postgres/init-primary.sh deploy/postgres/standby-entrypoint.sh "$PG/"
    chown -R postgres: "$PG"
    as_pg "$PG_BIN/initdb" -D "$PG/primary/pgdata" -U postgres --encoding=UTF8 --locale=C \
        --no-sync --no-instructions >"$PG/initdb.log" 2>&1 || { cat "$PG/initdb.log"; return 1; }
    pg_start primary "$P1"
    # As the image's entrypoint runs it: over the unix socket, as POSTGRES_USER.
    as_pg env PATH="$PG_BIN:$PATH" PGHOST="$PG" PGPORT="$P1" POSTGRES_USER=postgres \
        COLLECTOR_DB_PASSWORD=collector-pw REPLICATION_PASSWORD=replication-pw \
        bash "$PG/init-primary.sh"
}

# The collectors' login: SCRAM over TCP, the repository's schema applied as that user (what
# `collector migrate` does), and no superuser login over TCP.
pg_collector_login() {
    local url="host=127.0.0.1 port=$P1 dbname=collector user=collector connect_timeout=5" f
    for f in schema/postgres/*.sql; do
        PGPASSWORD=collector-pw "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 "$url" -f "$f"
    done
    [[ $(PGPASSWORD=collector-pw "$PG_BIN/psql" -X -qtA -v ON_ERROR_STOP=1 "$url" \
        -c "INSERT INTO sites (key) VALUES ('check') RETURNING key") == check ]]
    if PGPASSWORD=x "$PG_BIN/psql" -X -qtA -c 'SELECT 1' \
        "host=127.0.0.1 port=$P1 dbname=postgres user=postgres connect_timeout=5" >/dev/null 2>&1; then
        echo "the postgres superuser can log in over TCP"
        return 1
    fi
}

pg_standby() {
    # Run as root, as in the container: the script itself switches to postgres.
    env PATH="$PG_BIN:$PATH" PGDATA="$PG/standby/pgdata" PRIMARY_HOST=127.0.0.1 PRIMARY_PORT="$P1" \
        REPLICATION_USER=replicator REPLICATION_PASSWORD=replication-pw REPLICATION_SLOT=standby \
        bash "$PG/standby-entrypoint.sh" true
    if [[ ! -f $PG/standby/pgdata/standby.signal ]]; then
        echo "no standby.signal: pg_basebackup -R did not run"
        return 1
    fi
    pg_start standby "$P2"
    wait_for "$P2" postgres 'SELECT pg_is_in_recovery()' t
    wait_for "$P1" postgres "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'" 1
    wait_for "$P1" postgres "SELECT active FROM pg_replication_slots WHERE slot_name = 'standby'" t
    # A row written on the primary after the clone reaches the standby.
    sql "$P1" collector "INSERT INTO sites (key) VALUES ('streamed')" >/dev/null
    wait_for "$P2" collector "SELECT count(*) FROM sites WHERE key = 'streamed'" 1
}

pg_stop_all() {
    local d
    for d in "$PG"/*/pgdata; do
        [[ -f $d/postmaster.pid ]] || continue
        as_pg "$PG_BIN/pg_ctl" -D "$d" stop -m fast -w -t 30 >/dev/null
    done
}

# ------------------------------------------------------------- dockerfile ---

engine_available() { command -v docker >/dev/null && timeout 10 docker info >/dev/null 2>&1; }

docker_build() { docker build -t collector:check "$ROOT"; }

# The builder's first `cargo build` RUN (the dependency layer) replayed in a copy of what the
# COPY lines before it bring in, with `cargo` standing for `cargo metadata --locked`: the
# stand-in sources must let Cargo load the workspace, and Cargo.lock must fit the manifests.
dependency_layer() {
    local dir=$TMP/layer real_cargo src dst
    real_cargo=$(command -v cargo)
    mkdir -p "$dir/src" "$dir/bin"
    "$PY" - "$ROOT" "$dir/copies" "$dir/run.sh" <<'PYTHON'
import importlib.util, sys
root, copies_file, run_file = sys.argv[1:4]
spec = importlib.util.spec_from_file_location("cc", root + "/scripts/check-containers.py")
cc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cc)
builder = cc.stages(cc.dockerfile_instructions(root + "/Dockerfile"))[0]
copies, run = [], None
for ins, args in builder["ins"]:
    if ins == "COPY":
        words = [w for w in args.split() if not w.startswith("--")]
        copies += [f"{s}\t{words[-1]}" for s in words[:-1]]
    elif ins == "RUN" and "cargo build" in args:
        run = args
        break
if run is None:
    sys.exit("no RUN with cargo build in the builder stage")
open(copies_file, "w").write("\n".join(copies) + "\n")
open(run_file, "w").write("set -e\n" + run + "\n")
PYTHON
    while IFS=$'\t' read -r src dst; do
        [[ $dst == . || $dst == */ ]] && dst=${dst%/}/$(basename "$src")
        mkdir -p "$(dirname "$dir/src/$dst")"
        cp "$ROOT/$src" "$dir/src/$dst"
    done <"$dir/copies"
    cat >"$dir/bin/cargo" <<SHIM
#!/bin/sh
# Stands for "cargo build": load the workspace, with the lock file as it is (offline when the
# registry index is cached).
"$real_cargo" metadata --format-version 1 --locked --offline >/dev/null 2>"$dir/meta.err" && exit 0
grep -q offline "$dir/meta.err" || { cat "$dir/meta.err" >&2; exit 1; }
exec "$real_cargo" metadata --format-version 1 --locked >/dev/null
SHIM
    chmod 755 "$dir/bin/cargo"
    (cd "$dir/src" && PATH="$dir/bin:$PATH" sh "$dir/run.sh")
}

# ------------------------------------------------------------------- main ---

main() {
    local t0=$SECONDS static=()
    install_missing

    # Placeholder passwords: compose.yaml requires them (from .env).
    printf '%s\n' POSTGRES_PASSWORD=check COLLECTOR_DB_PASSWORD=check REPLICATION_PASSWORD=check \
        GRAFANA_ADMIN_PASSWORD=check >"$TMP/env"
    check "compose: docker-compose config -q" compose "$TMP/env" config -q
    check "compose: refuses to start without the passwords from .env" compose_requires_passwords
    if compose "$TMP/env" config >"$TMP/compose.yaml" 2>"$TMP/compose.err"; then
        engine_available || static=(--dockerfile)
        "$PY" "$ROOT/scripts/check-containers.py" "$TMP/compose.yaml" "${static[@]}" >"$TMP/py.out" 2>&1 || true
        cat "$TMP/py.out"
        PASS=$((PASS + $(grep -c '^ok ' "$TMP/py.out" || true)))
        FAIL=$((FAIL + $(grep -c '^FAIL ' "$TMP/py.out" || true)))
        # A crash of the checker itself counts too.
        if grep -q '^Traceback' "$TMP/py.out" || ! grep -qE '^(ok|FAIL) ' "$TMP/py.out"; then
            fail "scripts/check-containers.py crashed"
        fi
    else
        fail "compose: docker-compose config" "$TMP/compose.err"
    fi

    check "caddy: caddy validate deploy/caddy/Caddyfile" caddy_validate
    check "caddy: deploy/caddy/Caddyfile is formatted (caddy fmt)" caddy_formatted

    # shellcheck disable=SC2016 # expanded by the inner bash
    check "postgres: deploy/postgres/*.sh parse (bash -n)" \
        bash -ec 'for f in deploy/postgres/*.sh; do bash -n "$f"; done'
    P1=$(free_port)
    P2=$(free_port)
    check "postgres: a primary runs with deploy/postgres configs; init-primary.sh creates roles, database, slot" \
        pg_primary
    if [[ $LAST_OK -eq 1 ]]; then
        check "postgres: collector logs in over TCP (SCRAM), schema/postgres applies; no TCP superuser" \
            pg_collector_login
        check "postgres: standby-entrypoint.sh clones with pg_basebackup -R; the standby streams" pg_standby
    else
        skip "postgres: collector login and standby (no primary)"
    fi
    check "postgres: servers stop cleanly" pg_stop_all

    if engine_available; then
        check "dockerfile: docker build" docker_build
    else
        echo "note  no container engine answers (docker info): the Dockerfile is checked statically"
        if command -v cargo >/dev/null; then
            check "dockerfile: dependency layer loads the workspace from the manifests (cargo metadata --locked)" \
                dependency_layer
        else
            skip "dockerfile: dependency layer (no cargo on this machine)"
        fi
    fi

    echo "($((SECONDS - t0)) s)"
    local summary="containers: $PASS passed, $FAIL failed"
    if ((SKIP > 0)); then summary+=", $SKIP skipped"; fi
    echo "$summary"
    [[ $FAIL -eq 0 ]]
}

main "$@"
