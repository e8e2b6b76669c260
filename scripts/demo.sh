#!/usr/bin/env bash
# The main job: the whole stack on loopback with a demo site and a demo shop page.
#
# Installs what is missing, starts PostgreSQL, ZooKeeper and two ClickHouse replicas in
# .stack/demo, applies the schema, registers the site "demo", serves the demo shop page and
# runs the collector in the foreground. Ctrl-C stops the collector (it drains) and the stack.
#
# Settings: COLLECTOR_LISTEN (default 127.0.0.1:8080), DEMO_PAGE_PORT (default 8000).
set -euo pipefail
SCRIPT_NAME=demo
# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # die, port_listening, bootstrap_site
cd "$(dirname "$0")/.."
root=$PWD

stack_dir="$root/.stack/demo"
page_port="${DEMO_PAGE_PORT:-8000}"
listen="${COLLECTOR_LISTEN:-127.0.0.1:8080}"
admin_listen="${COLLECTOR_ADMIN_LISTEN:-127.0.0.1:9464}"
# One demo per checkout: a second one would share (and, on exit, stop) the first one's stack.
if [[ -f $stack_dir/demo.pid ]] && kill -0 "$(cat "$stack_dir/demo.pid")" 2>/dev/null; then
  die "a demo of this checkout is already running (pid $(cat "$stack_dir/demo.pid")); stop it first (Ctrl-C in its terminal, or kill -TERM $(cat "$stack_dir/demo.pid"))"
fi
# Both ports must be free before anything starts (a taken one would fail out of sight).
for addr in "127.0.0.1:$page_port" "$listen" "$admin_listen"; do
  if port_listening "${addr##*:}"; then
    die "$addr is taken; pick other ports: COLLECTOR_LISTEN=127.0.0.1:18080 COLLECTOR_ADMIN_LISTEN=127.0.0.1:19464 DEMO_PAGE_PORT=18000 scripts/demo.sh"
  fi
done

scripts/stack.sh install --demo
# Only what the demo runs: the collector and the stack binary, in one build (they share their
# dependencies), with the profile `demo` (Cargo.toml: release with less optimisation and no
# debug info, chosen for the time to serving; the image ships the release build). Where cargo
# puts them: CARGO_TARGET_DIR when set.
out="${CARGO_TARGET_DIR:-$root/target}/demo"
if [[ -x $out/collector && -x $out/stack ]]; then
  echo "building the collector and the stack binary if their sources changed (cargo profile demo)..."
else
  echo "building the collector and the stack binary (cargo profile demo; the first time: about" \
    "4 minutes on two idle cores, longer on a busy machine)..."
fi
cargo build --profile demo -p collector --bin collector -p collector-stack --bin stack
bin="$out/collector"
export STACK_BIN="$out/stack"   # what scripts/stack.sh runs

mkdir -p "$stack_dir"
echo $$ >"$stack_dir/demo.pid"
page_pid=
collector_pid=
cleanup() {
  # SIGTERM or SIGINT to this script alone (not its process group, as Ctrl-C) reaches the
  # collector through here: it drains, then the stack stops.
  if [[ -n $collector_pid ]] && kill -0 "$collector_pid" 2>/dev/null; then
    kill -TERM "$collector_pid" 2>/dev/null
    wait "$collector_pid" 2>/dev/null
  fi
  [[ -n $page_pid ]] && kill "$page_pid" 2>/dev/null
  echo "stopping the stack..."
  scripts/stack.sh down "$stack_dir" >/dev/null 2>&1 || true
  rm -f "$stack_dir/demo.pid"
}
# Set before the stack starts: a failure from here on stops it too.
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
scripts/stack.sh up "$stack_dir" --replicas 2 >/dev/null
# shellcheck disable=SC1091
source "$stack_dir/stack.env"

export COLLECTOR_LISTEN="$listen"
export COLLECTOR_ADMIN_LISTEN="$admin_listen"
export COLLECTOR_DATABASE_URL="$DATABASE_URL"
export COLLECTOR_CLICKHOUSE_URLS="$(for i in $(seq 1 "$CH_REPLICAS"); do v="CH${i}_URL"; printf '%s,' "${!v}"; done | sed 's/,$//')"
export COLLECTOR_CLICKHOUSE_DATABASE=collector
export COLLECTOR_SPOOL_DIR="$stack_dir/spool"
# The visitor's country, from the CC0 database the install step fetched (stack.env names it).
[[ -s ${GEO_DB:-} ]] && export COLLECTOR_GEO_DB="$GEO_DB"
collector_url="http://$COLLECTOR_LISTEN"
# The same settings for the collector's other commands (sites, report, migrate, sites purge),
# for an operator's shell: `set -a; . .stack/demo/collector.env; set +a`.
for v in COLLECTOR_DATABASE_URL COLLECTOR_CLICKHOUSE_URLS COLLECTOR_CLICKHOUSE_DATABASE \
  COLLECTOR_SPOOL_DIR COLLECTOR_GEO_DB; do
  if [[ -n ${!v:-} ]]; then printf "%s='%s'\n" "$v" "${!v}"; fi
done >"$stack_dir/collector.env"

COLLECTOR=("$bin")
# The page sets the dimension `variant` (an experiment's), which the site declares.
bootstrap_site "$stack_dir/bootstrap.log" demo --origin "http://127.0.0.1:$page_port" --origin "http://localhost:$page_port" \
  --dimension variant

# The demo shop page, with the script tag pointing at this collector, served with a CDN's
# Server-Timing (scripts/demo-page.py).
page_dir="$stack_dir/page"
mkdir -p "$page_dir"
sed "s#__COLLECTOR__#$collector_url#g" demo/index.html > "$page_dir/index.html"
cp demo/*.svg "$page_dir/" 2>/dev/null || true
python3 scripts/demo-page.py "$page_port" "$page_dir" >"$stack_dir/page.log" 2>&1 &
page_pid=$!

cat <<MSG

  collector      $collector_url   (script: $collector_url/script.js)
  operations     http://$COLLECTOR_ADMIN_LISTEN   (metrics: /metrics, readiness with its reason: /readyz)
  demo shop page http://127.0.0.1:$page_port/   (open it, then switch tab or close it: one beacon is sent)
  ClickHouse     $CH1_URL  (replicas: $COLLECTOR_CLICKHOUSE_URLS)
  PostgreSQL     $DATABASE_URL

  Send a measurement by hand (as a browser would: with its Origin and a browser's user agent;
  curl's own is stored as a bot, which reports leave out):
    curl -si $collector_url/api/v1/measurements -H 'content-type: application/json' \\
      -H 'origin: http://127.0.0.1:$page_port' \\
      -A 'Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36' \\
      -d '{"id":"'\$(cat /proc/sys/kernel/random/uuid)'","site":"demo","url":"http://127.0.0.1:$page_port/products/shoe-42","lcp_ms":1234,"ttfb_ms":95,"server_timing":[{"name":"cdn-cache","desc":"MISS"},{"name":"origin","dur":80}],"dimensions":{"variant":"b"}}'

  See the rows (within about a second):
    clickhouse-client --port $CH1_TCP_PORT --query "SELECT id, site, url, page_group, cdn_cache, dimension_values, lcp_ms, received_at FROM collector.measurements FINAL ORDER BY received_at DESC LIMIT 10"
    curl -s '$CH1_URL/' --data-binary "SELECT id, site, url, page_group, cdn_cache, dimension_values, lcp_ms, received_at FROM collector.measurements FINAL ORDER BY received_at DESC LIMIT 10 FORMAT PrettyCompact"

  The collector's other commands against this stack (sites, report, migrate, sites purge) take
  its settings from the environment; in another shell:
    set -a; . $stack_dir/collector.env; set +a
  A site's numbers at a glance (p75 and good / needs improvement / poor per device type;
  --by page_group|country|browser|dimension:variant, --format json, --html FILE for a page with
  charts; --crux: the 28 complete days before today, so not today's page views):
    $bin report --site demo --days 1
    $bin report --site demo --days 1 --by page_group

  Ctrl-C stops the collector (it drains) and the stack; started in the background (&), this
  script ignores SIGINT as every background job of a shell script does: send it SIGTERM.

MSG
# In the background with a wait, so that a signal to this script runs cleanup (bash defers
# traps while a foreground child runs).
"$bin" serve &
collector_pid=$!
wait "$collector_pid"
