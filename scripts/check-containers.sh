#!/usr/bin/env bash
# scripts/check-containers.sh - checks the container files (Dockerfile, .dockerignore,
# compose.yaml and its configs under deploy/) on a machine WITHOUT a container engine:
#
#   compose     `docker-compose config -q` (Debian's docker-compose v1 validates the file
#               without an engine), then scripts/check-containers.py on the resolved file:
#               restart policies, drain vs stop_grace_period, replica orders, spool volumes,
#               subnet, published ports, mounted files, pinned images, the demo page copy,
#               the edge services (host networking, capabilities, deploy/edge mounted),
#               ClickHouse's users (deploy/clickhouse/users.xml: `default` from loopback only,
#               `collector` and the read-only `dashboard` with passwords from .env), the
#               collectors' password file (`credentials`), Grafana's ClickHouse data source;
#               and that compose refuses to start without each password of .env
#   caddy       `caddy validate` of deploy/caddy/Caddyfile (Debian's Caddy)
#   clickhouse  every XML file parses; the replica configs have the shape scripts/stack.sh
#               writes (macros, remote_servers, zookeeper) and agree with compose.yaml.
#               (Debian's ClickHouse 18.16 cannot load a 24.x-style config, so none is started.)
#   postgres    the local PostgreSQL 15 runs with deploy/postgres/{postgresql,pg_hba}.conf:
#               a primary initialised by init-primary.sh, logins as the collector over TCP,
#               the repository's schema applied as that user, and a standby cloned by
#               standby-entrypoint.sh (pg_basebackup -R) that streams from the primary
#   dockerfile  built when a Docker engine answers (`docker info`); otherwise checked
#               statically, and its dependency layer replayed with `cargo metadata` in place
#               of `cargo build` (the workspace must load from the manifests alone)
#   licences    collector/THIRD-PARTY-LICENSES is what scripts/third-party-licenses.py makes
#               of Cargo.lock now, and the runtime stage copies it (and LICENSE) into
#               /usr/share/doc/collector
#
# Idempotent; installs what is missing with apt-get (docker-compose, caddy, postgresql-15).
# Ends with "containers: N passed, 0 failed"; exits 1 if any check failed. Needs root (apt-get,
# and PostgreSQL runs as the postgres user).
#
# scripts/check-containers.sh --engine   (scripts/test.sh runs it after the tests)
#   The image and the compose services for real, with podman (installed with apt-get with
#   runc, debootstrap and docker-compose when missing; fails where `podman info` fails: a check
#   that cannot run here does not pass). Every container uses host networking on 127.0.0.1 only.
#   base        scripts/local-base-images.sh: debian:bookworm-slim, rust:1-bookworm and a
#               postgres:15 stand-in made locally (no registry is reachable), cached
#   image       `podman build --format docker` of the unchanged Dockerfile (nice 10; layer
#               cache, plus cargo's download cache and target folder mounted during RUN from
#               /var/cache/collector-images/cargo); USER, HEALTHCHECK, STOPSIGNAL, VOLUME
#               in the image; its size (base + binary only, no build tools); the licence
#               notices in /usr/share/doc/collector
#   run         against its own loopback stack (scripts/stack.sh, three replicas), the image
#               run as compose.yaml runs a collector: `migrate` and `sites add` from the image;
#               a bad setting exits 2 with its one-line error in `podman logs`; HEALTHCHECK
#               (`podman healthcheck run`) fails while the settings store was never
#               reachable and passes once sites are loaded; uid 10001, read-only root, only
#               the spool volume writable; beacons land in ClickHouse; `podman stop` drains
#               with exit 0 within compose.yaml's stop_grace_period; with every replica
#               stopped, beacons are acknowledged, the container is removed, and a new one on
#               the same volume delivers each of them once when the replicas return
#   compose     the services of compose.yaml this machine can run (postgres-primary,
#               postgres-standby with the postgres:15 stand-in, credentials, migrate, seed,
#               collector-a, collector-b; the collectors log in to ClickHouse as `collector`
#               with the password file `credentials` writes, which the loopback replicas get
#               as a user in users.d/), started by `docker-compose up -d` on podman's API socket
#               (`podman system service`) with their depends_on conditions, talking to the
#               loopback ClickHouse replicas; the compose file is derived from compose.yaml
#               by `scripts/check-containers.py engine-compose` (host network, loopback ports,
#               prefixed volumes, ulimits within this VM's; see engine_compose there). Health
#               checks run every 2 s via `podman healthcheck run` (podman runs them from
#               systemd timers, and this machine has no systemd). Keeper, the ClickHouse 25.3
#               servers and Caddy are not run (no images for them here): they stay checked
#               statically. Ends with "containers-engine: N passed, 0 failed".
set -euo pipefail
SCRIPT_NAME=check-containers
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # log, die, wait_until, alloc_ports, ...
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=/usr/bin/python3          # Debian's, which has python3-yaml (a docker-compose dependency)
PG_BIN=/usr/lib/postgresql/15/bin

PASS=0 FAIL=0 SKIP=0
LAST_OK=0                    # whether the last `check` passed
SHOW_OK=0                    # 1: also show the output of passing checks
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
    if [[ $rc -eq 0 ]]; then
        pass "$name"
        LAST_OK=1
        # --engine: what a passing check saw too (timings, sizes, counts).
        if [[ $SHOW_OK -eq 1 && -s $out ]]; then sed 's/^/      /' "$out" | tail -n 12; fi
    else
        fail "$name" "$out"
        LAST_OK=0
    fi
}

# --------------------------------------------------------------- installs ---

pkg_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

install_missing() {
    local need=() p
    for p in docker-compose caddy python3-yaml; do pkg_installed "$p" || need+=("$p"); done
    [[ -x $PG_BIN/postgres && -x $PG_BIN/pg_basebackup ]] || need+=(postgresql-15)
    [[ ${#need[@]} -eq 0 ]] && return 0
    [[ $EUID -eq 0 ]] || die "run as root to install: ${need[*]}"
    log "installing ${need[*]}"
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
        die "apt-get install ${need[*]} failed"
    fi
}

# ---------------------------------------------------------------- compose ---

# The passwords compose.yaml takes from .env (deploy/env.example), each required.
PASSWORDS=(POSTGRES_PASSWORD COLLECTOR_DB_PASSWORD REPLICATION_PASSWORD GRAFANA_ADMIN_PASSWORD
    CLICKHOUSE_COLLECTOR_PASSWORD CLICKHOUSE_DASHBOARD_PASSWORD)
# placeholder_env FILE [LEAVE_OUT]: every password "check", but LEAVE_OUT.
placeholder_env() {
    local v
    for v in "${PASSWORDS[@]}"; do [[ $v == "${2:-}" ]] || echo "$v=check"; done >"$1"
}

# compose ENV_FILE ARGS...: docker-compose on compose.yaml with the passwords of ENV_FILE
# only (not the caller's environment, not a real .env).
compose() {
    local unset=() v
    for v in "${PASSWORDS[@]}"; do unset+=(-u "$v"); done
    env "${unset[@]}" docker-compose --env-file "$1" --project-directory "$ROOT" -f "$ROOT/compose.yaml" "${@:2}"
}
# No password at all, and each one left out in turn: `config` fails and names it. And
# deploy/env.example sets exactly these.
compose_requires_passwords() {
    local v
    : >"$TMP/empty.env"
    if compose "$TMP/empty.env" config -q >"$TMP/nopw.out" 2>&1; then
        echo "docker-compose config passed without any password"
        return 1
    fi
    grep -q 'in .env' "$TMP/nopw.out"
    for v in "${PASSWORDS[@]}"; do
        placeholder_env "$TMP/less.env" "$v"
        if compose "$TMP/less.env" config -q >"$TMP/nopw.out" 2>&1; then
            echo "docker-compose config passed without $v"
            return 1
        fi
        grep -q "set $v in .env" "$TMP/nopw.out" || { echo "without $v: $(cat "$TMP/nopw.out")"; return 1; }
    done
    diff <(printf '%s\n' "${PASSWORDS[@]}" | sort) \
        <(grep -oE '^[A-Z_]+=' deploy/env.example | tr -d = | sort) ||
        { echo "deploy/env.example does not set exactly the passwords above"; return 1; }
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

# pg_start NAME PORT: the server of $PG/NAME/pgdata with the deploy configs, on loopback.
pg_start() {
    as_pg "$PG_BIN/pg_ctl" -D "$PG/$1/pgdata" -l "$PG/$1.log" -w -t 30 start -o "\
        -c config_file=$PG/postgresql.conf -c hba_file=$PG/pg_hba.conf \
        -c port=$2 -c listen_addresses=127.0.0.1 -c unix_socket_directories=$PG" >/dev/null ||
        { cat "$PG/$1.log"; return 1; }
}
# sql PORT DB SQL: as the postgres superuser over the unix socket (peer authentication).
sql() { as_pg "$PG_BIN/psql" -X -qtA -v ON_ERROR_STOP=1 -h "$PG" -p "$1" -d "$2" -c "$3"; }
sql_is() { [[ $(sql "$1" "$2" "$3" 2>/dev/null) == "$4" ]]; }   # sql_is PORT DB SQL WANT
# wait_for PORT DB SQL WANT: until SQL answers WANT (10 s at most); says what it answers if not.
wait_for() {
    (wait_until 10 "port $1: '$3' answering '$4'" sql_is "$@") ||
        { echo "port $1: '$3' answers '$(sql "$1" "$2" "$3" 2>&1 || true)'"; return 1; }
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

# ----------------------------------------------------------------- engine ---
# `--engine`: the image built with podman from the unchanged Dockerfile and run against a
# loopback stack (scripts/stack.sh), then the part of compose.yaml that runs on this machine.
# Every container uses host networking and listens on 127.0.0.1 only (no bridge network:
# this machine sends no traffic to other addresses).

IMAGE=localhost/collector:check
BUILDER_IMAGE=localhost/collector-builder:check   # the builder stage, kept for the layer cache
PG_STANDIN=localhost/postgres-standin:15
ENGINE_PKGS=(podman runc debootstrap docker-compose)
COMPOSE_SERVICES=(postgres-primary postgres-standby credentials migrate seed collector-a collector-b)

engine_install_missing() {
    local need=() p
    for p in "${ENGINE_PKGS[@]}"; do pkg_installed "$p" || need+=("$p"); done
    [[ ${#need[@]} -eq 0 ]] && return 0
    [[ $EUID -eq 0 ]] || die "run as root to install: ${need[*]}"
    log "installing ${need[*]}"
    {
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" ||
            { apt-get update -qq &&
                DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"; }
    } >"$TMP/apt-engine.log" 2>&1 || { tail -n 20 "$TMP/apt-engine.log" >&2; exit 1; }
}

# Podman's settings for every podman process of this run, the API service included: runc and
# cgroupfs (no systemd here) and ulimits within the host's hard limits (this VM refuses
# podman's defaults, which are above them: root has no CAP_SYS_RESOURCE). The file replaces
# the system ones (that is how CONTAINERS_CONF works), so it repeats Debian's defaults.
engine_conf() {
    local nofile nproc
    # nofile: the host's hard limit (the collector wants many); nproc: 4096 (runc cannot set
    # the host's own hard limit here either).
    nofile=$(ulimit -Hn)
    nproc=4096
    [[ $nofile == unlimited ]] && nofile=1048576
    NOFILE=$nofile
    cat >"$TMP/containers.conf" <<CONF
[containers]
default_capabilities = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "NET_BIND_SERVICE",
  "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"]
default_sysctls = ["net.ipv4.ping_group_range=0 0"]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
    export CONTAINERS_CONF=$TMP/containers.conf
}

# podman, less one error line it prints for every container with a HEALTHCHECK: it cannot
# make the systemd timer that would run the check (this machine has no systemd). The checks
# run health checks with `podman healthcheck run` instead.
pm() { podman "$@" 2> >(grep -v 'systemd connection' >&2); }

engine_works() {
    podman info --format '{{.Host.OCIRuntime.Name}} {{.Store.GraphDriverName}}'
    pm run --rm --network host docker.io/library/debian:bookworm-slim true
}

ch() { curl -sS -m 10 "$CH1_URL/" --data-binary "$1"; }

# The collector's settings for the containers of the engine checks (the loopback stack).
collector_env() {
    printf '%s\n' -e "COLLECTOR_DATABASE_URL=$DATABASE_URL" -e "COLLECTOR_CLICKHOUSE_URLS=$CLICKHOUSE_URLS" \
        -e COLLECTOR_DRAIN_GRACE=5s
}

# run_collector NAME PORT VOLUME: the image as compose.yaml runs a collector (read-only root,
# no capabilities, no-new-privileges; here also no tmpfs on /tmp, /run: nothing but the
# spool writable), on the named spool VOLUME, listening on 127.0.0.1:PORT.
run_collector() {
    local name=$1 port=$2 vol=$3 envs
    mapfile -t envs < <(collector_env)
    pm run -d --name "$name" --network host --read-only --read-only-tmpfs=false \
        --cap-drop ALL --security-opt no-new-privileges:true \
        -v "$vol:/var/lib/collector/spool" "${envs[@]}" -e "COLLECTOR_LISTEN=127.0.0.1:$port" \
        -e "COLLECTOR_ADMIN_LISTEN=127.0.0.1:$(admin_port "$port")" \
        "$IMAGE" >/dev/null
}

# one_shot ARGS...: a collector command in a throw-away container (tmpfs spool, as compose).
one_shot() {
    local envs
    mapfile -t envs < <(collector_env)
    pm run --rm --network host --read-only --read-only-tmpfs=false --tmpfs /var/lib/collector/spool \
        "${envs[@]}" "$IMAGE" "$@"
}

http_code() { curl -s -o /dev/null -m 5 -w '%{http_code}' "$1" || true; }
ready() { [[ $(http_code "http://127.0.0.1:$1/readyz") == 200 ]]; }
listening() { [[ $(http_code "http://127.0.0.1:$1/healthz") == 200 ]]; }
healthy() { pm healthcheck run "$1"; }
# The operations listener's port of a collector whose public port is $1 (/metrics is not
# served on the public one): allocated beside it (pair_admin_ports).
declare -A ADMIN_PORTS=()
admin_port() { [[ -n ${ADMIN_PORTS[$1]:-} ]] || die "no operations port for $1"; echo "${ADMIN_PORTS[$1]}"; }
pair_admin_ports() { # pair_admin_ports PORT...: an operations port for each public one
    local p a
    set -- "$@" $(alloc_ports $#)
    local n=$(($# / 2)) i
    for ((i = 1; i <= n; i++)); do
        p=${!i}; a=$((i + n)); ADMIN_PORTS[$p]=${!a}
    done
}
spool_records() {
    curl -sS -m 5 "http://127.0.0.1:$(admin_port "$1")/metrics" | awk '$1 == "collector_spool_records" { print $2 }'
}
spool_empty() { [[ $(spool_records "$1") == 0 ]]; }

# send_beacons PORT SITE COUNT IDS_FILE: COUNT measurements in arrays of at most 50; every
# request must be answered 202 with all of its measurements accepted. Appends the ids.
send_beacons() {
    local port=$1 site=$2 n=$3 ids=$4 sent=0 k id body code
    while ((sent < n)); do
        body="["
        for ((k = 0; k < 50 && sent < n; k++, sent++)); do
            id=$(cat /proc/sys/kernel/random/uuid)
            echo "$id" >>"$ids"
            ((k > 0)) && body+=","
            body+="{\"id\":\"$id\",\"site\":\"$site\",\"url\":\"https://shop.example/p/$sent\",\"lcp_ms\":$((1000 + sent))}"
        done
        body+="]"
        code=$(curl -sS -m 30 -o "$TMP/answer.json" -w '%{http_code}' -H 'content-type: application/json' \
            --data-binary "$body" "http://127.0.0.1:$port/api/v1/measurements" || true)
        if [[ $code != 202 ]] || ! grep -q "\"accepted\":${k}[,}]" "$TMP/answer.json"; then
            echo "POST of $k measurements to 127.0.0.1:$port answered $code: $(cat "$TMP/answer.json" 2>/dev/null)"
            return 1
        fi
    done
}

# stored_once IDS_FILE SITE: every id of IDS_FILE is stored exactly once under FINAL, and the
# site has no other id.
stored_once() {
    ch "SELECT toString(id), count() FROM collector.measurements FINAL WHERE site = '$2' GROUP BY id FORMAT TSV" \
        >"$TMP/stored.tsv" || return 1
    sort "$1" >"$TMP/want"
    cut -f1 "$TMP/stored.tsv" | sort >"$TMP/got"
    cmp -s "$TMP/want" "$TMP/got" && ! awk '$2 != 1 { f = 1 } END { exit !f }' "$TMP/stored.tsv"
}
# wait_stored IDS_FILE SITE SECONDS: waits for stored_once; says what is stored either way.
wait_stored() {
    if ! (wait_until "$3" "$(wc -l <"$1") measurements of site $2 in ClickHouse, each once under FINAL" \
        stored_once "$1" "$2"); then
        stored_once "$1" "$2" || true
        echo "stored: $(wc -l <"$TMP/got") distinct ids, $(comm -23 "$TMP/want" "$TMP/got" | wc -l) missing," \
            "$(comm -13 "$TMP/want" "$TMP/got" | wc -l) unexpected," \
            "$(awk '$2 != 1' "$TMP/stored.tsv" | wc -l) more than once"
        return 1
    fi
    echo "$(wc -l <"$1") measurements of site $2 stored once each;" \
        "rows before merges (no FINAL): $(ch "SELECT count() FROM collector.measurements WHERE site = '$2'")"
}

# stop_timed CONTAINER: podman stop with compose's stop_grace_period as the timeout; the
# container must exit 0 (not killed) before it runs out.
stop_timed() {
    local t0 took rc
    t0=$(date +%s%N)
    pm stop -t "$STOP_GRACE" "$1" >/dev/null
    took=$((($(date +%s%N) - t0) / 1000000))
    rc=$(pm inspect --format '{{.State.ExitCode}}' "$1")
    echo "$1: podman stop took $((took / 1000)).$((took % 1000 / 100)) s (stop_grace_period ${STOP_GRACE} s), exit status $rc"
    [[ $rc == 0 ]] && ((took < STOP_GRACE * 1000))
}

# --- the checks, in the order engine_main runs them ---

image_build() {
    local t0=$SECONDS cache=${COLLECTOR_IMAGE_CACHE:-/var/cache/collector-images}/cargo builder
    mkdir -p "$cache/registry" "$cache/git" "$cache/target"
    # Low priority (the machine is shared); host network for the RUN steps (crates.io); the
    # docker format keeps HEALTHCHECK (an OCI image config has no such field).
    # Between runs, podman's layer cache skips the dependency layer while the manifests and
    # Cargo.lock are unchanged. Beyond that, the builder's RUN steps get cargo's download
    # cache and /src/target from $cache (bind mounts during RUN only: not in any layer), so a
    # changed Cargo.lock recompiles only what changed. One build at a time uses them (flock):
    # the dependency step deletes the collector's outputs in that shared target folder.
    (
        flock -w 3600 7 || { echo "timed out waiting for $cache/.lock"; exit 1; }
        nice -n 10 podman build --format docker --network host \
            --ulimit "nofile=$NOFILE:$NOFILE" --ulimit nproc=4096:4096 \
            -v "$cache/registry:/usr/local/cargo/registry" -v "$cache/git:/usr/local/cargo/git" \
            -v "$cache/target:/src/target" \
            -t "$IMAGE" "$ROOT" >"$TMP/build.log">&1
        # Disk: the builder stage's last image is tagged (its layers stay cached), then the
        # images of earlier builds (untagged, made FROM the local base images) are pruned.
        builder=$(awk '/^\[1\/2\] STEP/ { s = 1 } /^\[2\/2\]/ { exit } s && /^--> / { id = $NF } END { print id }' \
            "$TMP/build.log")
        [[ -n $builder ]] && podman tag "$builder" "$BUILDER_IMAGE"
        podman image prune -f --filter label=collector.local-base >/dev/null
    ) 7>"$cache/.lock" || { tail -n 40 "$TMP/build.log"; return 1; }
    # (A check runs in a subshell: what the summary needs goes through files.)
    echo "$((SECONDS - t0)) s, $(grep -c '^--> Using cache' "$TMP/build.log" || true) steps from podman's layer cache" |
        tee "$TMP/build.note"
}

image_config() {
    local got want
    got=$(pm image inspect --format '{{.Config.User}}|{{json .Config.Healthcheck.Test}}|{{.Config.StopSignal}}|{{json .Config.Volumes}}|{{json .Config.Entrypoint}}' "$IMAGE")
    want='10001:10001|["CMD","/usr/local/bin/collector","probe"]|SIGTERM|{"/var/lib/collector/spool":{}}|["/usr/local/bin/collector"]'
    echo "got:  $got"
    echo "want: $want"
    [[ $got == "$want" ]]
}

image_size() {
    local size base bin tools
    size=$(pm image inspect --format '{{.Size}}' "$IMAGE")
    base=$(pm image inspect --format '{{.Size}}' docker.io/library/debian:bookworm-slim)
    bin=$(pm run --rm --network host --entrypoint stat "$IMAGE" -c %s /usr/local/bin/collector)
    # shellcheck disable=SC2016 # expanded by the container's shell
    tools=$(pm run --rm --network host --entrypoint sh "$IMAGE" -c \
        'for t in cc gcc ld cargo rustc rustup make git curl; do command -v $t || true; done')
    echo "image $((size / 1000000)) MB: base $((base / 1000000)) MB + collector binary $((bin / 1000000)) MB" \
        "+ $(((size - base - bin) / 1000)) kB" | tee "$TMP/size.note"
    # Small: the base, the binary and nothing else of note (no build stage left over), at
    # most 40 MiB added to the base (issue 39's goal).
    if ((size - base - bin > 5000000)); then echo "more than 5 MB beyond the base and the binary"; return 1; fi
    if ((size - base > 40 * 1048576)); then echo "adds $(((size - base) / 1048576)) MiB to its base, more than 40"; return 1; fi
    if [[ -n $tools ]]; then echo "build tools in the runtime image: $tools"; return 1; fi
}

# The licence notices: the project's LICENSE and the generated third-party file, as in the
# repository, readable by the collector's user.
image_licenses() {
    local f
    for f in LICENSE collector/THIRD-PARTY-LICENSES; do
        pm run --rm --network host --entrypoint cat "$IMAGE" "/usr/share/doc/collector/$(basename "$f")" >"$TMP/lic" ||
            { echo "no /usr/share/doc/collector/$(basename "$f") in the image"; return 1; }
        cmp "$TMP/lic" "$ROOT/$f" || { echo "/usr/share/doc/collector/$(basename "$f") is not $f"; return 1; }
        echo "/usr/share/doc/collector/$(basename "$f"): $(wc -c <"$TMP/lic") bytes, = $f"
    done
    grep -c '^  ' "$ROOT/collector/THIRD-PARTY-LICENSES" | sed 's/$/ listed lines (crates, data)/'
}

# The image's binary keeps readable backtraces: its DWARF line tables are there, compressed
# (the Dockerfile's objcopy), and resolve an address of `collector::main` to main.rs and a line
# (binutils reads compressed sections as Rust's backtrace does).
image_backtraces() {
    local bin=$TMP/collector-from-image sections addr where
    pm run --rm --network host --entrypoint cat "$IMAGE" /usr/local/bin/collector >"$bin"
    sections=$(readelf -S -W "$bin")
    grep -E '\.debug_line .* C ' <<<"$sections" || { echo "no compressed .debug_line:"; echo "$sections"; return 1; }
    grep -E '\.debug_info .* C ' <<<"$sections" || { echo "no compressed .debug_info"; return 1; }
    # awk reads all of nm's output: leaving early would kill nm with SIGPIPE (status 141,
    # which pipefail makes this check's failure) whenever the symbol is not near the end.
    addr=$(nm -C "$bin" | awk '$3 == "collector::main" && a == "" { a = $1 } END { print a }')
    [[ -n $addr ]] || { echo "no symbol collector::main"; return 1; }
    where=$(addr2line -f -C -e "$bin" "0x$addr")
    echo "collector::main at 0x$addr: $where"
    [[ $where == *"collector/src/main.rs:"[0-9]* ]]
}

bad_setting() {
    local rc lines
    pm run --name "$PROJECT-bad" --network host -e COLLECTOR_BATCH_MAX_ROWS=many "$IMAGE" >/dev/null 2>&1 || true
    rc=$(pm inspect --format '{{.State.ExitCode}}' "$PROJECT-bad")
    pm logs "$PROJECT-bad" >"$TMP/bad.log" 2>&1 || true
    lines=$(wc -l <"$TMP/bad.log")
    cat "$TMP/bad.log"
    [[ $rc == 2 ]] || { echo "exit status $rc, want 2"; return 1; }
    [[ $lines == 1 ]] || { echo "$lines lines in podman logs, want 1"; return 1; }
    grep -q 'COLLECTOR_BATCH_MAX_ROWS' "$TMP/bad.log"
}

migrate_and_sites() {
    local COLLECTOR=(one_shot)
    bootstrap_site "$TMP/bootstrap.log" engine-a engine-b
    one_shot sites list | cut -f1 | sort | tr '\n' ' ' | tee "$TMP/sites"
    echo
    grep -q 'engine-a engine-b' "$TMP/sites"
}

never_reachable() {
    local port i
    port=$(alloc_ports 1)
    # A settings store that never answers: a closed loopback port.
    pm run -d --name "$PROJECT-nostore" --network host --read-only --read-only-tmpfs=false \
        -e "COLLECTOR_DATABASE_URL=postgres://collector@127.0.0.1:$(alloc_ports 1)/collector" \
        -e "COLLECTOR_CLICKHOUSE_URLS=$CLICKHOUSE_URLS" -e "COLLECTOR_LISTEN=127.0.0.1:$port" \
        "$IMAGE" >/dev/null
    wait_until 60 "the collector without a settings store to listen on 127.0.0.1:$port" listening "$port"
    # Three times over several seconds: a store never reached keeps the check failing.
    for i in 1 2 3; do
        if pm healthcheck run "$PROJECT-nostore"; then
            echo "podman healthcheck run passed (try $i) without a settings store"
            return 1
        fi
        sleep 2
    done
    pm inspect --format '{{range .State.Health.Log}}exit {{.ExitCode}}: {{.Output}}{{"\n"}}{{end}}' "$PROJECT-nostore"
    pm rm -f -v "$PROJECT-nostore" >/dev/null # and its spool, an anonymous volume
}

healthcheck_passes() {
    pm volume create "$SPOOL_VOL" >/dev/null
    run_collector "$PROJECT-1" "$PORT1" "$SPOOL_VOL"
    wait_until 90 "podman healthcheck run $PROJECT-1 to pass" healthy "$PROJECT-1"
    pm inspect --format '{{.State.Health.Status}}' "$PROJECT-1" | tee "$TMP/health"
    [[ $(cat "$TMP/health") == healthy ]]
}

# uid 10001 and what its process can write: the root filesystem is mounted read-only, and of
# all mounts and the image's usual folders only the spool volume takes a new file (plus the
# engine's per-container IPC mounts /dev/shm and /dev/mqueue, in memory, as on Docker).
confinement() {
    local pid ids writable
    pid=$(pm inspect --format '{{.State.Pid}}' "$PROJECT-1")
    ids=$(awk '/^(Uid|Gid):/ { print $1, $2, $3, $4, $5 }' "/proc/$pid/status" | tr '\n' ' ')
    echo "process $pid: $ids"
    [[ $ids == "Uid: 10001 10001 10001 10001 Gid: 10001 10001 10001 10001 " ]] || return 1
    awk '$5 == "/" { print "/ mounted " $6 }' "/proc/$pid/mountinfo" | tee "$TMP/rootmount"
    grep -q '^/ mounted ro' "$TMP/rootmount"
    # shellcheck disable=SC2016 # expanded by the container's shell
    writable=$(pm exec "$PROJECT-1" sh -c '
        for d in $(awk "{ print \$5 }" /proc/self/mountinfo) / /tmp /var/tmp /run /var/lib/collector \
                 /usr/local/bin /etc /root /home /var/cache /var/log; do
            [ -d "$d" ] || continue
            f="$d/.write-check.$$"
            if touch "$f" 2>/dev/null; then rm -f "$f"; echo "$d"; fi
        done | sort -u' | tr '\n' ' ')
    echo "writable for uid 10001: $writable"
    [[ $writable == "/dev/mqueue /dev/shm /var/lib/collector/spool " ]]
}

beacons_land() {
    : >"$TMP/ids-a"
    send_beacons "$PORT1" engine-a 100 "$TMP/ids-a"
    wait_stored "$TMP/ids-a" engine-a 60
}

stop_drains() {
    stop_timed "$PROJECT-1"
    pm logs "$PROJECT-1" 2>&1 | grep -iE 'drain|stop' | tail -n 5 || true
}

spool_survives() {
    local i n
    pm rm "$PROJECT-1" >/dev/null # the spool volume is named: it stays
    run_collector "$PROJECT-2" "$PORT2" "$SPOOL_VOL"
    wait_until 90 "$PROJECT-2 ready" ready "$PORT2"
    for ((i = 1; i <= CH_REPLICAS; i++)); do "$ROOT/scripts/stack.sh" replica "$STACK" "$i" stop; done
    : >"$TMP/ids-b"
    send_beacons "$PORT2" engine-b 150 "$TMP/ids-b"
    n=$(spool_records "$PORT2")
    echo "all $CH_REPLICAS replicas stopped: 150 measurements answered 202; collector_spool_records $n"
    if [[ -z $n ]] || ((n < 150)); then echo "collector_spool_records is '$n', want at least 150"; return 1; fi
    stop_timed "$PROJECT-2"
    pm rm "$PROJECT-2" >/dev/null
    if pm container exists "$PROJECT-2"; then echo "$PROJECT-2 still exists"; return 1; fi
    echo "$PROJECT-2 removed; $PROJECT-3 on the same volume $SPOOL_VOL"
    run_collector "$PROJECT-3" "$PORT3" "$SPOOL_VOL"
    wait_until 60 "$PROJECT-3 to answer /healthz" listening "$PORT3"
    if [[ $(ch "SELECT 1" 2>/dev/null) == 1 ]]; then echo "ClickHouse answers before it was started again"; return 1; fi
    for ((i = 1; i <= CH_REPLICAS; i++)); do "$ROOT/scripts/stack.sh" replica "$STACK" "$i" start; done
    wait_stored "$TMP/ids-b" engine-b 180
    wait_until 60 "collector_spool_records 0 on $PROJECT-3" spool_empty "$PORT3"
    stop_timed "$PROJECT-3"
}

# ---- compose.yaml on podman's API socket ----

# compose.yaml's collectors log in to ClickHouse as `collector` with the password from .env
# (here the placeholder of $TMP/env), which `credentials` writes into their password file. The
# loopback replicas are ClickHouse 18.16, whose users.xml has no grants: each gets that user
# (the same password, by its SHA-256; from loopback) in users.d/, written from the stack's
# users template (`stack.sh replica DIR I user`), where the server finds it by itself; `default` stays
# for the checks' own queries. Waits until every replica lets it in, and refuses a wrong password.
# Its queries alone go to system.query_log (log_queries in its profile): compose_collectors
# reads there that the collectors' inserts came as `collector`.
ch_collector_user() {
    local i url pw hex
    pw=$(sed -n 's/^CLICKHOUSE_COLLECTOR_PASSWORD=//p' "$TMP/env")
    hex=$(printf '%s' "$pw" | sha256sum | cut -d' ' -f1)
    for ((i = 1; i <= CH_REPLICAS; i++)); do
        "$ROOT/scripts/stack.sh" replica "$STACK" "$i" user collector "$hex" log_queries=1
    done
    for ((i = 1; i <= CH_REPLICAS; i++)); do
        url=CH${i}_URL
        wait_until 60 "replica $i to let \`collector\` in" ch_as "${!url}" collector "$pw"
        if ch_as "${!url}" collector "not-$pw" 2>/dev/null; then echo "replica $i takes a wrong password"; return 1; fi
    done
    echo "user collector on $CH_REPLICAS replicas; a wrong password refused"
}
ch_as() { # ch_as URL USER PASSWORD: SELECT 1 as that user (headers, as the collector sends)
    [[ $(curl -sS -m 5 -H "X-ClickHouse-User: $2" -H "X-ClickHouse-Key: $3" "$1/?query=SELECT%201") == 1 ]]
}

api_service() {
    rm -f "$TMP/podman.sock"
    podman system service --time=0 "unix://$TMP/podman.sock" >"$TMP/podman-service.log" 2>&1 &
    echo $! >"$TMP/api.pid"
    wait_until 30 "podman's API socket $TMP/podman.sock" \
        curl -sf --unix-socket "$TMP/podman.sock" http://d/_ping
    DOCKER_HOST=unix://$TMP/podman.sock docker-compose version --short
}

# Stands in for the systemd timers podman would use to run health checks: every 2 s,
# `podman healthcheck run` on each running container of the project that has one, so that
# the health status that compose's depends_on conditions wait for is kept current.
health_ticker() {
    local c
    while sleep 2; do
        for c in $(podman ps --filter "label=com.docker.compose.project=$PROJECT" --format '{{.Names}}' 2>/dev/null); do
            podman healthcheck run "$c" >/dev/null 2>&1 || true
        done
    done
}

dc() { DOCKER_HOST=unix://$TMP/podman.sock docker-compose -p "$PROJECT" -f "$TMP/compose.engine.yaml" "$@"; }
cname() { echo "${PROJECT}_$1_1"; }

compose_up() {
    "$PY" "$ROOT/scripts/check-containers.py" engine-compose "$TMP/compose.yaml" "$TMP/compose.engine.yaml" \
        image="$IMAGE" postgres_image="$PG_STANDIN" volume_prefix="$PROJECT" nofile="$NOFILE" nproc=4096 \
        postgres-primary="$CP1" postgres-standby="$CP2" collector-a="$CA" collector-b="$CB" \
        collector-a-admin="$(admin_port "$CA")" collector-b-admin="$(admin_port "$CB")" \
        clickhouse-r1="$CH1_URL" clickhouse-r2="$CH2_URL" clickhouse-r3="$CH3_URL"
    health_ticker >/dev/null 2>&1 &
    echo $! >"$TMP/ticker.pid"
    # `up` starts the services in dependency order and waits for each condition
    # (service_healthy, service_completed_successfully) as it does on Docker.
    if ! timeout 600 env DOCKER_HOST="unix://$TMP/podman.sock" \
        docker-compose -p "$PROJECT" -f "$TMP/compose.engine.yaml" up -d --no-build 2>&1; then
        pm ps -a --filter "label=com.docker.compose.project=$PROJECT" --format '{{.Names}} {{.Status}}'
        for c in $(podman ps -a --filter "label=com.docker.compose.project=$PROJECT" --format '{{.Names}}'); do
            echo "--- podman logs $c"
            pm logs "$c" 2>&1 | tail -n 8
        done
        return 1
    fi
}

compose_one_shots() {
    local s st
    # seed may still run: nothing waits for it.
    for s in credentials migrate seed; do
        st=$(timeout 60 podman wait "$(cname "$s")" 2>/dev/null) || { echo "$s did not exit within 60 s"; return 1; }
        echo "$s: exit status $st"
        [[ $st == 0 ]] || return 1
    done
    pm exec -u postgres "$(cname postgres-primary)" psql -qtA -h /var/run/postgresql -p "$CP1" -U postgres -d collector \
        -c 'SELECT key FROM sites' | tee "$TMP/compose-sites"
    grep -qx demo "$TMP/compose-sites"
    # The collectors' password file: the collector's uid alone may read it.
    pm run --rm --network none -v "$PROJECT-collector-secrets:/s:ro" --entrypoint stat "$IMAGE" \
        -c '%n: owner %u, mode %a, %s bytes' /s/clickhouse-password | tee "$TMP/pwfile"
    grep -q 'owner 10001, mode 600,' "$TMP/pwfile"
}

standby_streams() {
    [[ $(podman exec -u postgres "$(cname postgres-primary)" psql -qtA -h /var/run/postgresql -p "$CP1" -U postgres -d postgres \
        -c "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'") == 1 ]]
}
compose_standby() {
    wait_until 60 "postgres-standby streaming from postgres-primary" standby_streams
    pm exec -u postgres "$(cname postgres-standby)" psql -qtA -h /var/run/postgresql -p "$CP2" -U postgres -d postgres \
        -c 'SELECT pg_is_in_recovery()' | tee "$TMP/recovery"
    [[ $(cat "$TMP/recovery") == t ]]
}

compose_healthy() { [[ $(podman inspect --format '{{.State.Health.Status}}' "$1") == healthy ]]; }
compose_collectors() {
    local c port
    : >"$TMP/ids-c"
    for c in collector-a collector-b; do
        [[ $c == collector-a ]] && port=$CA || port=$CB
        wait_until 90 "$c healthy" compose_healthy "$(cname "$c")"
        echo "$c: healthy; user $(pm inspect --format '{{.Config.User}}' "$(cname "$c")")," \
            "read-only root $(pm inspect --format '{{.HostConfig.ReadonlyRootfs}}' "$(cname "$c")")"
        send_beacons "$port" demo 50 "$TMP/ids-c"
    done
    wait_stored "$TMP/ids-c" demo 60
    # Those rows came as ClickHouse's `collector` (only its queries are logged), over the
    # replicas the two collectors prefer.
    local i url n=0 got
    for ((i = 1; i <= CH_REPLICAS; i++)); do
        url=CH${i}_URL
        curl -sS -m 10 "${!url}/" --data-binary "SYSTEM FLUSH LOGS" >/dev/null
        got=$(curl -sS -m 10 "${!url}/" --data-binary "SELECT sum(written_rows) FROM system.query_log
            WHERE user = 'collector' AND type = 2 AND query LIKE 'INSERT INTO %measurements%'")
        echo "replica $i: $got rows inserted as collector"
        n=$((n + got))
    done
    ((n >= $(wc -l <"$TMP/ids-c"))) || { echo "$n rows inserted as collector, want at least $(wc -l <"$TMP/ids-c")"; return 1; }
}

compose_stop() {
    local t0 took rc
    t0=$(date +%s%N)
    dc stop collector-a 2>&1
    took=$((($(date +%s%N) - t0) / 1000000))
    rc=$(pm inspect --format '{{.State.ExitCode}}' "$(cname collector-a)")
    echo "docker-compose stop collector-a took $((took / 1000)).$((took % 1000 / 100)) s" \
        "(stop_grace_period ${STOP_GRACE} s), exit status $rc"
    [[ $rc == 0 ]] && ((took < STOP_GRACE * 1000))
}

engine_cleanup() {
    local c pid
    if [[ -f $TMP/ticker.pid ]]; then kill "$(cat "$TMP/ticker.pid")" 2>/dev/null || true; fi
    if [[ -f $TMP/api.pid && -f $TMP/compose.engine.yaml ]]; then
        dc down -v --timeout 10 >/dev/null 2>&1 || true
    fi
    # Every container of this run (their names start with the project's).
    for c in $(podman ps -a --format '{{.Names}}' 2>/dev/null | grep "^${PROJECT}[-_]" || true); do
        pm rm -f -v "$c" >/dev/null 2>&1 || true
    done
    # The spool volume and any volume of the compose project `down -v` did not remove.
    for c in $(podman volume ls -q 2>/dev/null | grep "^$PROJECT-" || true); do
        pm volume rm -f "$c" >/dev/null 2>&1 || true
    done
    if [[ -f $TMP/api.pid ]]; then
        pid=$(cat "$TMP/api.pid")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    if [[ -n ${STACK:-} ]]; then "$ROOT/scripts/stack.sh" down "$STACK" --purge >/dev/null 2>&1 || true; fi
    cleanup
}

engine_main() {
    local t0=$SECONDS tb
    PROJECT=collector-check-$$
    trap engine_cleanup EXIT
    engine_install_missing
    "$ROOT/scripts/stack.sh" install
    engine_conf
    if ! podman info >/dev/null 2>&1; then
        # A check that cannot run here fails: it does not pass by saying so.
        echo "fail  podman does not work on this machine (podman info failed): the image and compose checks cannot run"
        podman info 2>&1 | tail -5 | sed 's/^/      /'
        echo "containers-engine: 0 passed, 1 failed"
        return 1
    fi
    tb=$SECONDS
    "$ROOT/scripts/local-base-images.sh"
    echo "note  base images ready in $((SECONDS - tb)) s (scripts/local-base-images.sh)"
    check "engine: podman runs a container (runc, host network)" engine_works
    check "image: podman build --format docker of the Dockerfile" image_build
    if [[ $LAST_OK -eq 0 ]]; then
        echo "containers-engine: $PASS passed, $FAIL failed"
        return 1
    fi
    echo "note  build: $(cat "$TMP/build.note")"
    check "image: USER 10001:10001, HEALTHCHECK collector probe, STOPSIGNAL SIGTERM, spool VOLUME" image_config
    check "image: small (the base and the binary only), no build tools" image_size
    check "image: the binary's line tables are there, compressed (readable backtraces)" image_backtraces
    check "image: licence notices in /usr/share/doc/collector (LICENSE, THIRD-PARTY-LICENSES)" image_licenses
    check "run: a bad setting exits 2 with its one-line error in podman logs" bad_setting

    # The loopback stack: PostgreSQL, ZooKeeper and three ClickHouse replicas (as compose.yaml).
    STACK=$TMP/stack
    "$ROOT/scripts/stack.sh" up "$STACK" --replicas 3 >"$TMP/stack.log" 2>&1 || { cat "$TMP/stack.log"; return 1; }
    # shellcheck disable=SC1091
    source "$STACK/stack.env"
    STOP_GRACE=$("$PY" "$ROOT/scripts/check-containers.py" stop-grace "$TMP/compose.yaml" collector-a)
    ports=$(alloc_ports 3)
    read -r PORT1 PORT2 PORT3 <<<"$ports"
    pair_admin_ports "$PORT1" "$PORT2" "$PORT3"
    SPOOL_VOL=$PROJECT-spool

    check "run: collector migrate and sites add from the image (loopback PostgreSQL and ClickHouse)" migrate_and_sites
    check "run: HEALTHCHECK fails while the settings store was never reachable" never_reachable
    check "run: HEALTHCHECK passes (podman healthcheck run) once sites are loaded" healthcheck_passes
    check "run: uid 10001, read-only root, only the spool volume writable" confinement
    check "run: beacons sent to the container land in ClickHouse" beacons_land
    check "run: podman stop (SIGTERM) drains, exit 0 within compose's stop_grace_period" stop_drains
    check "run: replicas stopped, beacons acknowledged, container removed; a new one on the volume delivers each once" \
        spool_survives

    ports=$(alloc_ports 4)
    read -r CP1 CP2 CA CB <<<"$ports"
    pair_admin_ports "$CA" "$CB"
    check "compose: podman's API socket (podman system service) answers docker-compose" api_service
    [[ $LAST_OK -eq 1 ]] && check "compose: the loopback replicas have compose's ClickHouse user \`collector\`" \
        ch_collector_user
    if [[ $LAST_OK -eq 1 ]]; then
        check "compose: docker-compose up -d ${COMPOSE_SERVICES[*]} (depends_on conditions met)" compose_up
        if [[ $LAST_OK -eq 1 ]]; then
            check "compose: credentials, migrate and seed exited 0 (as ClickHouse's \`collector\`); site demo registered; password file 0600 uid 10001" \
                compose_one_shots
            check "compose: postgres-standby, cloned by standby-entrypoint.sh, streams from postgres-primary" compose_standby
            check "compose: collector-a and collector-b healthy; beacons to each land in ClickHouse, inserted as \`collector\`" \
                compose_collectors
            check "compose: docker-compose stop collector-a drains, exit 0 within stop_grace_period" compose_stop
        fi
    fi

    echo "note  $(cat "$TMP/size.note" 2>/dev/null || echo 'image size unknown'); engine checks took $((SECONDS - t0)) s"
    echo "containers-engine: $PASS passed, $FAIL failed"
    [[ $FAIL -eq 0 ]]
}

# ------------------------------------------------------------------- main ---

main() {
    local t0=$SECONDS static=()
    install_missing
    if [[ ${1:-} == --engine ]]; then
        SHOW_OK=1
        placeholder_env "$TMP/env"
        compose "$TMP/env" config >"$TMP/compose.yaml"
        engine_main
        return
    fi

    # Placeholder passwords: compose.yaml requires them (from .env).
    placeholder_env "$TMP/env"
    check "compose: docker-compose config -q" compose "$TMP/env" config -q
    check "compose: refuses to start without the passwords from .env (each of them; deploy/env.example sets them)" \
        compose_requires_passwords
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
    ports=$(alloc_ports 2)
    read -r P1 P2 <<<"$ports"
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

    if command -v cargo >/dev/null; then
        check "licences: collector/THIRD-PARTY-LICENSES is current (scripts/third-party-licenses.py --check)" \
            "$PY" scripts/third-party-licenses.py --check
    else
        skip "licences: collector/THIRD-PARTY-LICENSES is current (no cargo on this machine)"
    fi

    echo "($((SECONDS - t0)) s)"
    local summary="containers: $PASS passed, $FAIL failed"
    if ((SKIP > 0)); then summary+=", $SKIP skipped"; fi
    echo "$summary"
    [[ $FAIL -eq 0 ]]
}

main "$@"
