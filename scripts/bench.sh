#!/usr/bin/env bash
# Variables named PREFIX_KEY are set by kv_into (printf -v), which shellcheck cannot follow.
# shellcheck disable=SC2154
#
# scripts/bench.sh - the collector's benchmarks, next to nginx answering `return 204`.
#
#   scripts/bench.sh           full run, about 15 minutes (plus a first-time build of the
#                              tools): writes docs/benchmarks.md and prints the table
#   scripts/bench.sh --quick   smoke test, about 2 minutes: a few seconds per step, no
#                              five-minute run, 200 idle connections instead of 10,000, no
#                              profile; prints the table and leaves docs/ alone
#   scripts/bench.sh --ablation the spool append's share of a request, in one run: the
#                              release build, the same build without the append (cargo
#                              feature bench-no-append, never shipped) and nginx `return 204`,
#                              interleaved; throughput, core time per request, CPU per 100,000
#                              beacons, p99 at 70 % and a profile; about 8 minutes (plus two
#                              release builds); writes its section of docs/benchmarks.md
#   scripts/bench.sh --storage the read side: docs/queries.md's queries on 10,000,000 rows
#                              of 2,000 shops, v1's table layout against v2's, on one
#                              ClickHouse 18.16 replica and on the 26.x server (single-server
#                              tables), and the user-agent derivation's cost
#                              per beacon with and without its cache; about 15 minutes;
#                              writes its section of docs/benchmarks.md (scripts/bench/storage.py)
#
# What it does, in one run and on one core allocation:
#   - installs what is missing: the stack's packages (scripts/stack.sh install), wrk and
#     nginx (apt), linux-perf (apt, full run only, optional), and oha 1.16.0 built from its
#     crates.io source with `-Z` lines taken in order instead of at random, so that every
#     request carries a new id (once, into ~/.cache/collector-bench; BENCH_TOOLS_DIR moves it);
#   - builds the collector (cargo build --release -p collector);
#   - starts PostgreSQL, ZooKeeper and 2 ClickHouse replicas (scripts/stack.sh up, in a
#     temporary folder), runs `collector migrate` and registers 20 sites bench-01..bench-20;
#   - pins the server under test (the collector, or nginx with one worker) to core 0 and the
#     load generator to core 1 with taskset; ClickHouse, ZooKeeper and PostgreSQL are not
#     pinned (they run wherever the scheduler puts them);
#   - measures (a) the highest throughput with zero errors, 1 and 10 beacons per request,
#     collector and nginx, with wrk and scripts/bench/beacon.lua (unique ids); (b) latency
#     p50/p99/p99.9 at 70 % of the collector's single-beacon maximum, open loop with oha
#     -q --latency-correction; (c) CPU seconds per 100,000 measurements; (d) peak RSS;
#     (e) RSS growth with 10,000 idle keep-alive connections; (f) time from 202 to a visible
#     row in ClickHouse, and (g) INSERT queries per second and active parts, both during a
#     five-minute run at 70 % load; plus a perf CPU profile of the collector under load.
#
# Every process it starts, and the stack, is stopped on exit (success, failure or Ctrl-C).
# Logs of a failed run are kept and their folder is printed. Traffic goes to 127.0.0.1 only.
set -euo pipefail
SCRIPT_NAME=bench
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # die, wait_until, alloc_ports, bootstrap_site
cd "$(dirname "$0")/.."
root=$PWD

usage() { sed -n '/^# scripts\/bench.sh - /,/section of docs\/benchmarks.md/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
mode=full
for arg in "$@"; do [[ $arg == -h || $arg == --help ]] && usage; done
case ${1:-} in
    "") ;;
    --quick) mode=quick ;;
    --storage) mode=storage ;;
    --ablation) mode=ablation ;;
    -h|--help) usage ;;
    *) usage ;;
esac

SITES=20
OHA_VERSION=1.16.0
if [[ $mode == ablation ]]; then
    TP_SECS=15; TP_CONNS="64 256"; LAT_SECS=20; SOAK_SECS=0; PROBES=0
    IDLE_CONNS=0; PROFILE_SECS=10; WARMUP_SECS=3
elif [[ $mode == full ]]; then
    TP_SECS=20; TP_CONNS="16 64 256"; LAT_SECS=30; SOAK_SECS=300; PROBES=200
    IDLE_CONNS=10000; PROFILE_SECS=15; WARMUP_SECS=5
else
    TP_SECS=3; TP_CONNS="32"; LAT_SECS=5; SOAK_SECS=15; PROBES=10
    IDLE_CONNS=200; PROFILE_SECS=0; WARMUP_SECS=1
fi
LAT_CONNS=64

section() { printf '\n== %s\n' "$*" >&2; }
note() { printf '   %s\n' "$*" >&2; }

# ------------------------------------------------------------------- install ---

tools=${BENCH_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/collector-bench}
oha=$tools/bin/oha

apt_install() { # apt_install PACKAGE...: without starting any service
    local sudo=()
    [[ $EUID -eq 0 ]] || sudo=(sudo)
    local policy=/usr/sbin/policy-rc.d added=0 rc=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
        "${sudo[@]}" chmod 755 "$policy"
        added=1
    fi
    { "${sudo[@]}" apt-get update -qq &&
      "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
    } >&2 || rc=$?
    [[ $added -eq 1 ]] && "${sudo[@]}" rm -f "$policy"
    return $rc
}

perf_usable() {
    command -v perf >/dev/null && perf record -q -e cpu-clock -o /dev/null -- true >/dev/null 2>&1
}

# oha picks `-Z` body lines at random, which would repeat ids (and the collector would
# answer duplicates without touching the spool). Build it from its crates.io source with the
# lines taken in order; bench.sh writes more lines than requests.
ensure_oha() {
    local stamp=$tools/oha-$OHA_VERSION-in-order.stamp
    [[ -x $oha && -f $stamp ]] && return 0
    section "building oha $OHA_VERSION with -Z lines in order (once; about 4 minutes on 2 cores)"
    command -v cargo >/dev/null || die "cargo is missing"
    mkdir -p "$tools"
    local fetch=$tools/fetch src cargo_home=${CARGO_HOME:-$HOME/.cargo}
    rm -rf "$fetch" "$tools/oha-src"
    mkdir -p "$fetch/src"
    printf '[package]\nname = "fetch-oha"\nversion = "0.0.0"\nedition = "2021"\npublish = false\n\n[dependencies]\noha = "=%s"\n\n[workspace]\n' \
        "$OHA_VERSION" >"$fetch/Cargo.toml"
    : >"$fetch/src/lib.rs"
    cargo fetch -q --manifest-path "$fetch/Cargo.toml"
    src=$(find "$cargo_home/registry/src" -mindepth 2 -maxdepth 2 -type d -name "oha-$OHA_VERSION" 2>/dev/null | head -n1)
    if [[ -z $src ]]; then
        local crate
        crate=$(find "$cargo_home/registry/cache" -name "oha-$OHA_VERSION.crate" 2>/dev/null | head -n1)
        [[ -n $crate ]] || die "cannot find the source of oha $OHA_VERSION after cargo fetch"
        tar -xzf "$crate" -C "$tools"
        src=$tools/oha-$OHA_VERSION
    fi
    cp -r "$src" "$tools/oha-src"
    chmod -R u+w "$tools/oha-src"
    python3 - "$tools/oha-src/src/request_generator.rs" <<'PY'
import sys
path = sys.argv[1]
text = open(path).read()
old = "BodyGenerator::Random(choices) => choices.choose(rng).cloned().unwrap_or_default(),"
new = ("BodyGenerator::Random(choices) => {\n"
       "                // collector bench: lines in order, so that ids never repeat\n"
       "                let _ = rng;\n"
       "                static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);\n"
       "                if choices.is_empty() { Bytes::new() } else {\n"
       "                    choices[NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % choices.len()].clone()\n"
       "                }\n"
       "            }")
if old not in text:
    sys.exit("oha source changed: cannot apply the in-order -Z patch")
open(path, "w").write(text.replace(old, new))
PY
    cargo install -q --locked --force --path "$tools/oha-src" --root "$tools" --target-dir "$tools/target" 2>&1 |
        grep -v '^warning' >&2 || true
    [[ -x $oha ]] || die "oha build failed"
    rm -rf "$tools/target" "$fetch"
    touch "$stamp"
}

install_tools() {
    section "installing what is missing"
    scripts/stack.sh install
    local need=()
    command -v wrk >/dev/null || need+=(wrk)
    command -v nginx >/dev/null || need+=(nginx)
    command -v taskset >/dev/null || need+=(util-linux)
    command -v python3 >/dev/null || need+=(python3)
    if [[ $mode != quick ]] && ! command -v perf >/dev/null; then
        apt_install linux-perf || note "linux-perf could not be installed: no profile"
    fi
    if (( ${#need[@]} )); then apt_install "${need[@]}" || die "apt-get install ${need[*]} failed"; fi
    ensure_oha
    if [[ $mode == ablation ]]; then
        # The same source without the append; built first, so that target/release/collector
        # is the shipped build afterwards (only the collector crate is rebuilt each time).
        section "building the collector without the spool append (release, feature bench-no-append)"
        cargo build -q --release -p collector --bin collector --features bench-no-append
        cp target/release/collector target/release/collector-no-append
    fi
    section "building the collector (release)"
    cargo build -q --release -p collector --bin collector
}

# ----------------------------------------------------------------- processes ---

work="" logs="" collector_pid="" noappend_pid="" nginx_pid="" bg_pids=() status=1
bin=$root/target/release/collector
bench_py() { python3 "$root/scripts/bench/bench.py" "$@"; }

cleanup() {
    local rc=$?
    set +e
    for pid in "${bg_pids[@]}"; do kill "$pid" 2>/dev/null; done
    [[ -n $collector_pid ]] && stop_pid "$collector_pid"
    [[ -n $noappend_pid ]] && stop_pid "$noappend_pid"
    [[ -n $nginx_pid ]] && stop_pid "$nginx_pid"
    if [[ -n $work ]]; then
        scripts/stack.sh down "$work/stack" --purge >/dev/null 2>&1
        rm -rf "$work/spool" "$work/spool-no-append" "$work/bodies.txt" "$work/nginx/tmp"
        if [[ $status -eq 0 ]]; then
            # The logs of the last successful run (collector log, wrk/oha outputs, perf.data).
            rm -rf "$root/target/bench-last"
            mkdir -p "$root/target"
            mv "$work" "$root/target/bench-last" && printf 'logs: target/bench-last\n' >&2
        else
            rm -f "$work/perf.data"
            printf '\nbench: failed (exit %s); logs kept in %s\n' "$rc" "$work" >&2
        fi
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ $mode == storage ]]; then
    scripts/stack.sh install
    work=$(mktemp -d /tmp/collector-bench.XXXXXX)
    section "the user-agent derivation's cost per beacon (cargo test --release, ignored test user_agent_cost)"
    ua_cost=$(cargo test -q --release -p collector --lib user_agent_cost -- --ignored --nocapture 2>&1 | grep '^user agent per beacon:') \
        || die "the user_agent_cost test printed no figure"
    note "$ua_cost"
    section "starting one ClickHouse 18.16 replica and the 26.x server in $work/stack"
    scripts/stack.sh up "$work/stack" --replicas 1 --ch26 >"$work/stack-up.log" 2>&1 || { cat "$work/stack-up.log" >&2; die "stack up failed"; }
    # shellcheck disable=SC1091
    source "$work/stack/stack.env"
    section "loading and querying on 18.16 (scripts/bench/storage.py)"
    python3 scripts/bench/storage.py --clickhouse "$CH1_URL" --doc docs/benchmarks.md --note "${ua_cost}."
    section "the same on 26.x, single-server tables"
    python3 scripts/bench/storage.py --clickhouse "$CH26_URL" --single-server --marker storage-26 --doc docs/benchmarks.md
    status=0
    exit 0
fi

stop_pid() { # SIGTERM, up to 30 s, then SIGKILL
    local pid=$1 i
    kill -TERM "$pid" 2>/dev/null || return 0
    for (( i = 0; i < 300; i++ )); do
        kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null; return 0; }
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
}

results=""
put() { printf '%s=%s\n' "$1" "$2" >>"$results"; }
cmd() { printf '%s\n' "$*" | sed "s#$work#DIR#g; s#$root/##g; s#$tools#TOOLS#g" >>"$logs/commands.txt"; }

# kv_into PREFIX < KEY=VALUE lines: sets shell variables PREFIX_KEY
kv_into() {
    local prefix=$1 k v
    while IFS='=' read -r k v; do
        [[ $k =~ ^[A-Za-z0-9_]+$ ]] || continue
        printf -v "${prefix}_$k" '%s' "$v"
    done
}

# metrics PREFIX [PORT]: the collector on public PORT's /metrics, read on its operations listener.
declare -A admin_of=()
metrics() { local p=${2:-$cport}; kv_into "$1" < <(bench_py metrics "http://127.0.0.1:${admin_of[$p]:-$p}/metrics"); }
proc_cpu() { bench_py proc "$1" | sed 's/ .*//; s/cpu=//'; }

start_collector() { # start_collector [ENV=VALUE...]: $bin on $cport, spool $work/spool
    launch_collector "$bin" "$cport" "$work/spool" "$logs/collector.log" "$@"
    collector_pid=$launched_pid
}

launch_collector() { # launch_collector BIN PORT SPOOL LOG [ENV=VALUE...]: sets launched_pid
    local bin=$1 port=$2 spool=$3 log=$4
    shift 4
    [[ -n ${admin_of[$port]:-} ]] || admin_of[$port]=$(alloc_ports 1)
    env "$@" \
        COLLECTOR_LISTEN="127.0.0.1:$port" \
        COLLECTOR_ADMIN_LISTEN="127.0.0.1:${admin_of[$port]}" \
        COLLECTOR_DATABASE_URL="$DATABASE_URL" \
        COLLECTOR_CLICKHOUSE_URLS="$CLICKHOUSE_URLS" \
        COLLECTOR_CLICKHOUSE_DATABASE=collector \
        COLLECTOR_SPOOL_DIR="$spool" \
        COLLECTOR_SPOOL_MAX_BYTES=8589934592 \
        COLLECTOR_CLIENT_RATE=0 \
        COLLECTOR_SITE_RATE=0 \
        COLLECTOR_DRAIN_GRACE=0s \
        taskset -c 0 "$bin" serve >>"$log" 2>&1 &
    launched_pid=$!
    wait_until 60 "the collector ready on 127.0.0.1:$port (see $log)" \
        curl -fsS --max-time 2 -o /dev/null "http://127.0.0.1:$port/readyz"
}

stop_collector() {
    stop_pid "$collector_pid"
    collector_pid=""
}

wait_drained() { # until the writer has confirmed everything (at most 120 s)
    local i
    for (( i = 0; i < 600; i++ )); do
        metrics D
        [[ ${D_spool_records:-1} == 0 ]] && return 0
        sleep 0.2
    done
    note "warning: the spool did not drain within 120 s (${D_spool_records:-?} records left)"
}

nonce_base=$(( (RANDOM << 16 | RANDOM) & 0x7ffff000 ))
nonce_n=0
next_nonce() { nonce_n=$((nonce_n + 1)); printf -v nonce '%08x' $((nonce_base + nonce_n)); } # sets $nonce

# run_wrk URL CONNS SECS BATCH SCRIPT: sets W_requests, W_rps, W_errors, W_gen_cpu (% of core 1)
run_wrk() {
    local url=$1 conns=$2 secs=$3 batch=$4 script=$5 nonce out
    next_nonce
    out=$logs/wrk-$nonce.txt
    cmd taskset -c 1 wrk -t1 -c"$conns" -d"${secs}s" --timeout 5s -s "$script" "$url" -- "$nonce" "$batch" "$SITES"
    (
        taskset -c 1 wrk -t1 -c"$conns" -d"${secs}s" --timeout 5s -s "$script" "$url" -- "$nonce" "$batch" "$SITES" >"$out" 2>&1 || true
        cat "/proc/$BASHPID/stat" >"$out.stat"
    )
    local line
    line=$(grep '^BENCH_WRK ' "$out" || true)
    [[ -n $line ]] || { cat "$out" >&2; die "wrk failed"; }
    kv_into W < <(tr ' ' '\n' <<<"${line#BENCH_WRK }")
    W_errors=$(( W_connect + W_read + W_write + W_status + W_timeout ))
    W_rps=$(python3 -c "print(f'{$W_requests / ($W_duration_us / 1e6):.1f}')")
    # children's utime+stime of the subshell = wrk's CPU time
    local stat rest
    stat=$(cat "$out.stat"); rest=${stat##*) }
    # shellcheck disable=SC2086
    set -- $rest
    W_gen_cpu=$(python3 -c "print(round(100 * (${14} + ${15}) / $(getconf CLK_TCK) / ($W_duration_us / 1e6)))")
}

# latency_run NAME URL RATE KEY: oha open loop at RATE req/s for LAT_SECS on URL; puts
# KEY_NAME_{p50,p99,p999,max}_ms and KEY_NAME_errors (a collector's duplicates are counted)
latency_run() {
    local server=$1 url=$2 rate=$3 key=$4 lines sent extra=""
    lines=$(( rate * LAT_SECS * 12 / 10 + 1000 ))
    wait_drained
    next_nonce
    bench_py bodies "$work/bodies.txt" "$lines" "$nonce" "$SITES"
    oha_cmd=(taskset -c 1 "$oha" --no-tui --worker-threads 1 -z "${LAT_SECS}s" -q "$rate" --latency-correction -w
             -c "$LAT_CONNS" -m POST -T 'text/plain;charset=UTF-8' -H 'Origin: https://shop01.example'
             -H 'User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0'
             -Z "$work/bodies.txt" --output-format json -o "$logs/oha-$key-$server.json" "$url")
    cmd "${oha_cmd[@]}"
    [[ $server == collector ]] && metrics B
    "${oha_cmd[@]}" >"$logs/oha-$key-$server.log" 2>&1 || { cat "$logs/oha-$key-$server.log" >&2; die "oha failed"; }
    kv_into O < <(bench_py oha "$logs/oha-$key-$server.json")
    sent=$(( O_ok + O_non2xx + O_errors ))
    (( sent < lines )) || note "warning: oha sent $sent requests but only $lines bodies exist: ids repeated"
    if [[ $server == collector ]]; then
        metrics A
        extra=" accepted=$(( ${A_accepted%.*} - ${B_accepted%.*} )) duplicates=$(( ${A_duplicates%.*} - ${B_duplicates%.*} ))"
    fi
    note "$server: $O_rps req/s, p50 $O_p50_ms ms, p99 $O_p99_ms ms, p99.9 $O_p999_ms ms, max $O_max_ms ms; 2xx=$O_ok other=$O_non2xx errors=$O_errors$extra"
    put "${key}_${server}_p50_ms" "$O_p50_ms"
    put "${key}_${server}_p99_ms" "$O_p99_ms"
    put "${key}_${server}_p999_ms" "$O_p999_ms"
    put "${key}_${server}_max_ms" "$O_max_ms"
    put "${key}_${server}_errors" "$((O_non2xx + O_errors))"
    rm -f "$work/bodies.txt"
}

# profile_run PORT_PID CONNS: perf record of PID for PROFILE_SECS under wrk at CONNS on
# $curl_url; writes $logs/profile.md (nothing when perf is not usable)
profile_run() {
    local pid=$1 conns=$2 wrk_pid prof_note
    if ! perf_usable; then
        note "perf is not usable here: no profile"
        return 0
    fi
    section "profile: perf record -g (dwarf) of the collector for ${PROFILE_SECS}s under wrk at c=$conns"
    put perf_version "$(perf version 2>/dev/null | head -n1)"
    wait_drained
    next_nonce
    taskset -c 1 wrk -t1 -c"$conns" -d"$((PROFILE_SECS + 4))s" -s "$lua" "$curl_url" -- "$nonce" 1 "$SITES" >"$logs/wrk-profile.txt" 2>&1 &
    wrk_pid=$!; bg_pids+=("$wrk_pid")
    sleep 2
    cmd taskset -c 1 perf record -e cpu-clock -F 499 --call-graph dwarf,16384 -p COLLECTOR_PID -o DIR/perf.data -- sleep "$PROFILE_SECS"
    taskset -c 1 perf record -q -e cpu-clock -F 499 --call-graph dwarf,16384 -p "$pid" \
        -o "$work/perf.data" -- sleep "$PROFILE_SECS" >"$logs/perf-record.log" 2>&1 || note "perf record failed"
    wait "$wrk_pid" || true
    bg_pids=()
    prof_note=$(python3 - "$logs/wrk-profile.txt" "$conns" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"requests=(\d+) duration_us=(\d+)", text)
rate = f"{int(m.group(1)) / (int(m.group(2)) / 1e6):,.0f} req/s with the profiler attached" if m else "rate unknown"
print(f"wrk -t1 -c{sys.argv[2]}, 1 beacon per request, {rate}")
PY
)
    if [[ -s $work/perf.data ]]; then
        bench_py profile "$work/perf.data" "$logs/profile.md" "$prof_note" || note "perf report failed"
    fi
}

# ---------------------------------------------------------------------- main ---

install_tools

work=$(mktemp -d /tmp/collector-bench.XXXXXX)
logs=$work
results=$work/results
: >"$results"
: >"$logs/commands.txt"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

section "starting the stack in $work/stack"
cmd scripts/stack.sh up DIR/stack --replicas 2
scripts/stack.sh up "$work/stack" --replicas 2 >"$logs/stack-up.log" 2>&1 || { cat "$logs/stack-up.log" >&2; die "stack up failed"; }
# shellcheck disable=SC1091
source "$work/stack/stack.env"
export COLLECTOR_DATABASE_URL=$DATABASE_URL COLLECTOR_CLICKHOUSE_URLS=$CLICKHOUSE_URLS
cmd collector migrate
cmd "for i in 01..$SITES: collector sites add --key bench-\$i"
COLLECTOR=("$bin")
mapfile -t site_keys < <(seq -f 'bench-%02g' 1 "$SITES")
bootstrap_site "$logs/collector.log" "${site_keys[@]}"

ch() { curl -sS --max-time 30 "$CH1_URL/" --data-binary "$1"; }
ch2() { curl -sS --max-time 30 "$CH2_URL/" --data-binary "$1"; }

# Machine and versions.
put date "$(date -u '+%Y-%m-%d %H:%M UTC')"
put nproc "$(nproc)"
put cpu_model "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)"
put mem "$(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)"
put kernel "$(uname -sr)"
put virt "$( (lscpu 2>/dev/null | sed -n 's/^Hypervisor vendor:[[:space:]]*//p'; systemd-detect-virt 2>/dev/null) | head -n1)"
put os "$(. /etc/os-release && echo "$PRETTY_NAME")"
put git_rev "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- collector schema Cargo.lock 2>/dev/null || echo ' (with uncommitted changes)')"
put clickhouse_version "$(ch 'SELECT version()')"
put nginx_version "$(nginx -v 2>&1 | sed 's#.*/##; s#^#nginx #')"
put wrk_version "$(wrk -v 2>&1 | head -n1 | awk '{print "wrk " $2}')"
put oha_version "$("$oha" --version | awk '{print "oha " $2}') (-Z in order)"
put loadavg_start "$(cut -d' ' -f1-3 /proc/loadavg)"
put sites "$SITES"
put tp_secs "$TP_SECS"
put tp_conns "${TP_CONNS// /, }"
put lat_secs "$LAT_SECS"

# nginx: one worker answering 204 to everything, on core 0.
nport=$(alloc_ports 1)
mkdir -p "$work/nginx/tmp"
cat >"$work/nginx/nginx.conf" <<EOF
worker_processes 1;
worker_rlimit_nofile 20000;
daemon off;
master_process on;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log warn;
events { worker_connections 16384; }
http {
    access_log off;
    keepalive_timeout 120s;
    keepalive_requests 1000000000;
    client_body_temp_path $work/nginx/tmp/body;
    proxy_temp_path $work/nginx/tmp/proxy;
    fastcgi_temp_path $work/nginx/tmp/fastcgi;
    uwsgi_temp_path $work/nginx/tmp/uwsgi;
    scgi_temp_path $work/nginx/tmp/scgi;
    server {
        listen 127.0.0.1:$nport;
        location / { return 204; }
    }
}
EOF
cmd taskset -c 0 nginx -p DIR/nginx -e DIR/nginx/error.log -c DIR/nginx/nginx.conf "  # worker_processes 1; location / { return 204; }"
taskset -c 0 nginx -p "$work/nginx" -e "$work/nginx/error.log" -c "$work/nginx/nginx.conf" >"$logs/nginx.log" 2>&1 &
nginx_pid=$!
nurl=http://127.0.0.1:$nport/api/v1/measurements
nginx_answers() { [[ $(curl -s -o /dev/null -w '%{http_code}' "$nurl" 2>/dev/null) == 204 ]]; }
wait_until 10 "nginx answering 204 on $nurl (see $work/nginx/error.log)" nginx_answers
# shellcheck disable=SC2046
nginx_pids() { echo "$nginx_pid" $(pgrep -P "$nginx_pid"); }

section "starting the collector on core 0"
cport=$(alloc_ports 1)
curl_url=http://127.0.0.1:$cport/api/v1/measurements
cmd taskset -c 0 env COLLECTOR_CLIENT_RATE=0 COLLECTOR_SITE_RATE=0 COLLECTOR_SPOOL_MAX_BYTES=8589934592 \
    COLLECTOR_SPOOL_DIR=DIR/spool COLLECTOR_DRAIN_GRACE=0s COLLECTOR_LISTEN=127.0.0.1:PORT ... collector serve
start_collector
lua=$root/scripts/bench/beacon.lua

section "warm-up (${WARMUP_SECS}s each)"
run_wrk "$curl_url" 16 "$WARMUP_SECS" 1 "$lua"
note "collector: $W_rps req/s, $W_errors errors"
run_wrk "$nurl" 16 "$WARMUP_SECS" 1 "$lua"
note "nginx:     $W_rps req/s, $W_errors errors"
wait_drained

# ---------------------------------------------------------------- ablation ---

if [[ $mode == ablation ]]; then
    # The release build, the same build without the spool append (feature bench-no-append:
    # every station up to and including the RowBinary encoding, then 202) and nginx, each
    # at each connection count, in ABL_ROUNDS interleaved rounds.
    ABL_ROUNDS=2
    aport=$(alloc_ports 1)
    aurl=http://127.0.0.1:$aport/api/v1/measurements
    cmd "same, COLLECTOR_LISTEN=127.0.0.1:PORT2 COLLECTOR_SPOOL_DIR=DIR/spool-no-append target/release/collector-no-append serve"
    launch_collector "$root/target/release/collector-no-append" "$aport" "$work/spool-no-append" "$logs/collector-no-append.log"
    noappend_pid=$launched_pid
    run_wrk "$aurl" 16 "$WARMUP_SECS" 1 "$lua"
    note "no-append: $W_rps req/s, $W_errors errors (warm-up)"
    put abl_rounds "$ABL_ROUNDS"
    section "ablation: wrk -t1 ${TP_SECS}s at $TP_CONNS connections, 1 beacon per request, main / no-append / nginx, $ABL_ROUNDS rounds"
    for variant in main no-append nginx; do printf -v "abest_${variant//-/_}" '%s' 0; done
    for (( round = 1; round <= ABL_ROUNDS; round++ )); do
        for conns in $TP_CONNS; do
            for variant in main no-append nginx; do
                case $variant in
                    main) url=$curl_url port=$cport; pids=("$collector_pid"); wait_drained ;;
                    no-append) url=$aurl port=$aport; pids=("$noappend_pid") ;;
                    nginx) url=$nurl port=""; read -ra pids <<<"$(nginx_pids)" ;;
                esac
                [[ -n $port ]] && metrics B "$port"
                cpu0=$(bench_py proc "${pids[@]}" | sed 's/ .*//; s/cpu=//')
                run_wrk "$url" "$conns" "$TP_SECS" 1 "$lua"
                cpu1=$(bench_py proc "${pids[@]}" | sed 's/ .*//; s/cpu=//')
                extra="" cpu100k=""
                if [[ -n $port ]]; then
                    metrics A "$port"
                    accepted=$(( ${A_accepted%.*} - ${B_accepted%.*} ))
                    non202=$(( ${A_intake_other%.*} - ${B_intake_other%.*} ))
                    cpu100k=$(python3 -c "print(f'{($cpu1 - $cpu0) / max(1, $accepted) * 1e5:.2f}')")
                    extra=" accepted=$accepted non-202=$non202 cpu/100k=${cpu100k}s"
                    # wrk counts a request cut off at the end of the run too: allow that much slack.
                    if (( non202 > 0 || accepted + conns < W_requests )); then
                        W_errors=$(( W_errors + non202 + 1 ))
                        extra+=" (mismatch: $W_requests sent)"
                    fi
                fi
                us=$(python3 -c "print(f'{($cpu1 - $cpu0) / max(1, $W_requests) * 1e6:.1f}')")
                note "$variant c=$conns round $round: $W_rps req/s, errors=$W_errors, ${us} µs of core per request, wrk CPU ${W_gen_cpu}%$extra"
                v=${variant//-/_}
                put "abl_run_${round}_${conns}_$v" "rps:$W_rps,errors:$W_errors,us:$us,cpu100k:${cpu100k:--},gen_cpu:$W_gen_cpu"
                best_var="abest_$v"
                if (( W_errors == 0 )) && python3 -c "import sys; sys.exit(0 if $W_rps > ${!best_var} else 1)"; then
                    printf -v "$best_var" '%s' "$W_rps"
                    printf -v "abestc_$v" '%s' "$conns"
                    printf -v "abestus_$v" '%s' "$us"
                    printf -v "abest100k_$v" '%s' "${cpu100k:--}"
                fi
                sleep 1
            done
        done
    done
    for v in main no_append nginx; do
        b="abest_$v" c="abestc_$v" u="abestus_$v" k="abest100k_$v"
        put "abl_best_$v" "rps:${!b},conns:${!c:--},us:${!u:--},cpu100k:${!k:--}"
    done
    [[ $abest_main != 0 ]] || die "no run of main without errors: cannot derive the 70 % rate"
    stop_pid "$noappend_pid"; noappend_pid=""
    rate=$(python3 -c "print(int($abest_main * 0.7))")
    put abl_lat_rate "$rate"
    section "ablation: latency, oha open loop at $rate req/s (70 % of main's best), ${LAT_SECS}s, $LAT_CONNS connections"
    latency_run collector "$curl_url" "$rate" abl_lat
    latency_run nginx "$nurl" "$rate" abl_lat
    (( PROFILE_SECS > 0 )) && profile_run "$collector_pid" "$abestc_main"
    put loadavg_end "$(cut -d' ' -f1-3 /proc/loadavg)"
    stop_collector
    section "results (ablation)"
    bench_py ablation "$results" "$root/docs/benchmarks.md" --profile "$logs/profile.md"
    status=0
    exit 0
fi

# ------------------------------------------------------- (a) throughput (c) CPU ---

section "(a) throughput: wrk ${TP_SECS}s runs at $TP_CONNS connections, 1 and 10 beacons per request"
run_n=0
for batch in 1 10; do
    for server in collector nginx; do
        printf -v "best_${server}_$batch" '%s' 0
        printf -v "bestc_${server}_$batch" '%s' "-"
    done
    for conns in $TP_CONNS; do
        for server in collector nginx; do
            if [[ $server == collector ]]; then
                wait_drained
                metrics B
                cpu0=$(proc_cpu "$collector_pid")
                read -r core0_busy0 core0_total0 core0_irq0 < <(bench_py core0)
                run_wrk "$curl_url" "$conns" "$TP_SECS" "$batch" "$lua"
                read -r core0_busy1 core0_total1 core0_irq1 < <(bench_py core0)
                cpu1=$(proc_cpu "$collector_pid")
                metrics A
                accepted=$(( ${A_accepted%.*} - ${B_accepted%.*} ))
                non202=$(( ${A_intake_other%.*} - ${B_intake_other%.*} ))
                cpu100k=$(python3 -c "print(f'{($cpu1 - $cpu0) / max(1, $accepted) * 1e5:.2f}')")
                extra=" accepted=$accepted non-202=$non202 cpu/100k=${cpu100k}s"
                expected=$(python3 -c "print(round($W_requests * $batch))")
                # wrk counts a request cut off at the end of the run too: allow that much slack.
                if (( non202 > 0 || accepted + batch * conns < expected )); then
                    W_errors=$(( W_errors + non202 + 1 ))
                    extra+=" (mismatch: $expected sent)"
                fi
            else
                extra=""
                read -ra npids <<<"$(nginx_pids)"
                cpu0=$(bench_py proc "${npids[@]}" | sed 's/ .*//; s/cpu=//')
                read -r core0_busy0 core0_total0 core0_irq0 < <(bench_py core0)
                run_wrk "$nurl" "$conns" "$TP_SECS" "$batch" "$lua"
                read -r core0_busy1 core0_total1 core0_irq1 < <(bench_py core0)
                cpu1=$(bench_py proc "${npids[@]}" | sed 's/ .*//; s/cpu=//')
            fi
            # Core 0 during the run: the server's share, and what other processes took.
            read -r srv_pct irq_pct other_pct < <(python3 -c "
t = max(1e-9, $core0_total1 - $core0_total0); s = $cpu1 - $cpu0; i = $core0_irq1 - $core0_irq0
print(round(100 * s / t), round(100 * i / t), max(0, round(100 * ($core0_busy1 - $core0_busy0 - s - i) / t)))")
            note "$server batch=$batch c=$conns: $W_rps req/s, errors=$W_errors, core 0: server ${srv_pct}% irq ${irq_pct}% others ${other_pct}%, wrk CPU ${W_gen_cpu}%$extra"
            run_n=$((run_n + 1))
            put "run_$(printf '%02d' $run_n)" "server:$server,batch:$batch,conns:$conns,rps:$W_rps,errors:$W_errors,gen_cpu:$W_gen_cpu,srv_pct:$srv_pct,irq_pct:$irq_pct,other_pct:$other_pct"
            best_var="best_${server}_$batch"
            if (( W_errors == 0 )) && python3 -c "import sys; sys.exit(0 if $W_rps > ${!best_var} else 1)"; then
                printf -v "$best_var" '%s' "$W_rps"
                printf -v "bestc_${server}_$batch" '%s' "$conns"
                [[ $server == collector ]] && printf -v "cpu100k_$batch" '%s' "$cpu100k"
            fi
            sleep 1
        done
    done
done
for batch in 1 10; do
    for server in collector nginx; do
        b="best_${server}_$batch" c="bestc_${server}_$batch"
        put "tp_${server}_${batch}_rps" "${!b}"
        put "tp_${server}_${batch}_beacons" "$(python3 -c "print(${!b} * $batch)")"
        put "tp_${server}_${batch}_conns" "${!c}"
    done
    v="cpu100k_$batch"
    put "cpu_per_100k_max_$batch" "${!v:-nan}"
done
[[ $best_collector_1 != 0 ]] || die "no collector run without errors: cannot derive the 70 % rate"

# ---------------------------------------------------------------- profile -------

if (( PROFILE_SECS > 0 )); then
    profile_run "$collector_pid" "$bestc_collector_1"
fi

# ------------------------------------------------------------- (b) latency ---

rate=$(python3 -c "print(int($best_collector_1 * 0.7))")
put lat_rate "$rate"
section "(b) latency: oha open loop at $rate req/s (70 %), ${LAT_SECS}s, $LAT_CONNS connections"
for server in collector nginx; do
    [[ $server == collector ]] && url=$curl_url || url=$nurl
    latency_run "$server" "$url" "$rate" lat
done

# ---------------------------------------------- (f) visibility (g) inserts/parts ---

section "(f)+(g) ${SOAK_SECS}s at $rate beacons/s with $PROBES probes"
wait_drained
# wrk paces each connection with delay(): rate ~ conns / (delay + latency).
soak_delay_ms=20
p50=$(grep '^lat_collector_p50_ms=' "$results" | cut -d= -f2)
soak_conns=$(python3 -c "import math; print(min(480, max(1, math.ceil($rate * ($soak_delay_ms + min(5.0, float('$p50'))) / 1000))))")
paced=$work/beacon-paced.lua
cat "$lua" >"$paced"
printf '\nfunction delay()\n   return %d\nend\n' "$soak_delay_ms" >>"$paced"
# Calibrate: one short paced run, then scale the connections to hit the target rate.
run_wrk "$curl_url" "$soak_conns" "$(( SOAK_SECS > 60 ? 5 : 2 ))" 1 "$paced"
# At most 480: more would cross COLLECTOR_MAX_IN_FLIGHT (512) if the collector falls behind.
soak_conns=$(python3 -c "import math; print(min(480, max(1, math.ceil($soak_conns * $rate / max(1.0, $W_rps)))))")
note "pacing: $W_rps req/s in the calibration run; $soak_conns connections with delay() of $soak_delay_ms ms"
wait_drained
put soak_secs "$SOAK_SECS"
put soak_target "$rate"
put soak_conns "$soak_conns"
put soak_delay_ms "$soak_delay_ms"
events() { # InsertQuery events of replica URL
    curl -sS --max-time 10 "$1/" --data-binary "SELECT value FROM system.events WHERE event = 'InsertQuery'" | grep -o '^[0-9]*' || echo 0
}
ev1_0=$(events "$CH1_URL"); ev2_0=$(events "$CH2_URL")
metrics B
cpu0=$(proc_cpu "$collector_pid")
t0=$(date +%s)
next_nonce
cmd taskset -c 1 wrk -t1 -c"$soak_conns" -d"${SOAK_SECS}s" --timeout 5s -s DIR/beacon-paced.lua "$curl_url" -- NONCE 1 "$SITES" "  # beacon.lua + delay() of ${soak_delay_ms} ms"
taskset -c 1 wrk -t1 -c"$soak_conns" -d"${SOAK_SECS}s" --timeout 5s -s "$paced" "$curl_url" -- "$nonce" 1 "$SITES" >"$logs/wrk-soak.txt" 2>&1 &
wrk_pid=$!; bg_pids+=("$wrk_pid")
sleep $(( SOAK_SECS > 60 ? 10 : 2 ))
probe_secs=$(( SOAK_SECS - (SOAK_SECS > 60 ? 25 : 5) ))
cmd taskset -c 1 python3 scripts/bench/bench.py probes --port PORT --clickhouse CH1_URL --count "$PROBES" --seconds "$probe_secs" --out DIR/probes.json
taskset -c 1 python3 "$root/scripts/bench/bench.py" probes --port "$cport" --clickhouse "$CH1_URL" \
    --count "$PROBES" --seconds "$probe_secs" --sites "$SITES" --out "$logs/probes.json" &
probe_pid=$!; bg_pids+=("$probe_pid")
wait "$probe_pid" || die "the probes failed"
wait "$wrk_pid" || true
bg_pids=()
t1=$(date +%s)
cpu1=$(proc_cpu "$collector_pid")
metrics A
line=$(grep '^BENCH_WRK ' "$logs/wrk-soak.txt" || true)
[[ -n $line ]] || { cat "$logs/wrk-soak.txt" >&2; die "wrk (soak) failed"; }
kv_into W < <(tr ' ' '\n' <<<"${line#BENCH_WRK }")
soak_accepted=$(( ${A_accepted%.*} - ${B_accepted%.*} ))
soak_inserts=$(( ${A_inserts%.*} - ${B_inserts%.*} ))
soak_dur=$(python3 -c "print($W_duration_us / 1e6)")
put soak_rate "$(python3 -c "print(round($W_requests / $soak_dur))")"
put soak_errors "$(( W_connect + W_read + W_write + W_status + W_timeout ))"
put cpu_per_100k_soak "$(python3 -c "print(f'{($cpu1 - $cpu0) / max(1, $soak_accepted) * 1e5:.2f}')")"
put soak_inserts_per_s "$(python3 -c "print(f'{$soak_inserts / max(1, $t1 - $t0):.2f}')")"
put soak_parts_r1 "$(ch "SELECT count() FROM system.parts WHERE active AND database = 'collector' AND table = 'measurements'")"
put soak_parts_r2 "$(ch2 "SELECT count() FROM system.parts WHERE active AND database = 'collector' AND table = 'measurements'")"
ev1_1=$(events "$CH1_URL"); ev2_1=$(events "$CH2_URL")
put soak_ch_insert_queries "$(( ev1_1 - ev1_0 + ev2_1 - ev2_0 )) (collector: $soak_inserts)"
ch 'SYSTEM FLUSH LOGS' >/dev/null 2>&1 || sleep 8
qlog=$(ch "SELECT count() FROM system.query_log WHERE type = 'QueryFinish' AND query LIKE 'INSERT INTO%measurements%' AND event_time >= toDateTime($t0) AND event_time <= toDateTime($((t1 + 2)))" 2>/dev/null || echo "")
if [[ $qlog =~ ^[0-9]+$ && $qlog -gt 0 ]]; then
    put soak_query_log "$qlog INSERTs on replica 1"
else
    put soak_query_log "no INSERT rows (the collector's queries run with log_queries off)"
fi
kv_into V < <(bench_py json-kv "$logs/probes.json")
put vis_probes "$V_probes"; put vis_visible "$V_visible"
put vis_p50_ms "$V_p50_ms"; put vis_p99_ms "$V_p99_ms"; put vis_max_ms "$V_max_ms"
note "load: $(grep '^soak_rate=' "$results" | cut -d= -f2) beacons/s achieved; accepted=$soak_accepted; inserts=$soak_inserts"
note "visibility: $V_visible of $V_probes probes, p50 $V_p50_ms ms, p99 $V_p99_ms ms, max $V_max_ms ms (non-202 $V_non202, timeouts $V_timeouts)"

# (d) peak RSS over everything so far.
put peak_rss_kb "$(bench_py proc "$collector_pid" | sed 's/.*hwm_kb=\([0-9]*\).*/\1/')"
read -ra npids <<<"$(nginx_pids)"
put nginx_peak_rss_kb "$(bench_py proc "${npids[@]}" | sed 's/.*hwm_kb=\([0-9]*\).*/\1/')"

# Collector health over the whole load: answers other than 202, shed, insert errors, log lines.
metrics H
warns=$(grep -cE ' (WARN|ERROR) ' "$logs/collector.log" || true)
put health "$(printf '%s answers other than 202 on intake, %s shed, %s rejected, %s duplicates, %s insert errors, %s batch retries, %s failovers, %s kept aside; %s WARN/ERROR log lines' \
    "${H_intake_other%.*}" "${H_shed%.*}" "${H_rejected%.*}" "${H_duplicates%.*}" "${H_insert_errors%.*}" "${H_batches_retried%.*}" \
    "${H_failovers%.*}" "${H_kept_aside%.*}" "$warns")"
grep -E ' (WARN|ERROR) ' "$logs/collector.log" | sed 's/^[^ ]* *//; s/127\.0\.0\.1:[0-9]*/127.0.0.1:PORT/g' |
    sort | uniq -c | sort -rn | head -n 5 >"$logs/collector-warnings.txt" || true
# When a replica changed state (there is no failure in this benchmark to switch for); the
# writer's own "switching replica" lines are debug level.
grep -E 'replica state|replica down|replica back' "$logs/collector.log" | awk '{print $1}' | tr '\n' ' ' >"$logs/failover-times.txt" || true
stop_collector

# --------------------------------------------------------- (e) idle connections ---

section "(e) $IDLE_CONNS idle keep-alive connections (fresh collector, COLLECTOR_HEADER_TIMEOUT=120s)"
start_collector COLLECTOR_HEADER_TIMEOUT=120s
for (( i = 0; i < 50; i++ )); do curl -s -o /dev/null "http://127.0.0.1:$cport/healthz"; done
sleep 2
rss0=$(bench_py proc "$collector_pid" | sed 's/.*rss_kb=//')
cmd taskset -c 1 python3 scripts/bench/bench.py idle --port PORT --count "$IDLE_CONNS" --hold 120 --ready DIR/idle.txt
rm -f "$work/idle.txt"
taskset -c 1 python3 "$root/scripts/bench/bench.py" idle --port "$cport" --count "$IDLE_CONNS" --hold 120 --ready "$work/idle.txt" &
idle_pid=$!; bg_pids+=("$idle_pid")
for (( i = 0; i < 1200; i++ )); do [[ -s $work/idle.txt ]] && break; sleep 0.1; done
[[ -s $work/idle.txt ]] || die "the idle connections were not opened within 120 s"
sleep 3
rss1=$(bench_py proc "$collector_pid" | sed 's/.*rss_kb=//')
metrics I
kill "$idle_pid" 2>/dev/null || true
wait "$idle_pid" 2>/dev/null || true
bg_pids=()
idle_open=$(sed -n 's/^open=\([0-9]*\).*/\1/p' "$work/idle.txt")
put idle_conns "$IDLE_CONNS"
put idle_open "$idle_open"
put idle_growth_kb "$(( rss1 - rss0 ))"
note "RSS $((rss0 / 1024)) MiB -> $((rss1 / 1024)) MiB with $idle_open open ($(tr '\n' ' ' <"$work/idle.txt")); collector_http_open_connections=${I_open_connections%.*}"
stop_collector
stop_pid "$nginx_pid"; nginx_pid=""
put loadavg_end "$(cut -d' ' -f1-3 /proc/loadavg)"

# ------------------------------------------------------------------- report ---

section "results ($mode run)"
if [[ $mode == full ]]; then
    bench_py report "$results" "$root/docs/benchmarks.md" --doc --dir "$logs"
else
    bench_py report "$results" /dev/null
fi
printf '\nhealth: %s\n' "$(grep '^health=' "$results" | cut -d= -f2-)"
if [[ -s $logs/collector-warnings.txt ]]; then
    printf 'most frequent collector warnings:\n'; cat "$logs/collector-warnings.txt"
fi
status=0
