#!/usr/bin/env bash
# scripts/bench/report.sh - how fast `collector report --crux` (and `--compare`) answers for a
# shop of 10 M rows on the ClickHouse 26.x server of a stack (docs/benchmarks.md, "The CrUX view
# of a 10 M-row shop"). Usage:
#
#   scripts/stack.sh up DIR --ch26            # any stack with a 26.x server
#   scripts/bench/report.sh DIR [load] [RUNS]   (BENCH_DB: the database, default bench_report;
#                                               BENCH_SITES: some of `big year other`)
#
# `load` (once) creates the database `bench_report` (single-server form, `collector migrate`) and
# writes, with INSERT ... SELECT in chunks of 1 M rows: site `big`, 10 M rows over the last 29
# days; site `year`, 10 M rows over the last 395 days (the retention); site `other`, 3 M rows
# (rows the report must not read). Rows: phones, desktops, tablets, bots and unknown devices;
# Chrome, Edge, Samsung Internet, Firefox, Safari; iOS, Android, Windows; a quarter soft
# navigations; a third at rate 0.5; metrics with sub-millisecond fractions (as browsers report
# them) and NULLs; the dimension `release` 412 or 413. Then RUNS (default 5) runs of `report
# --crux` for `big` and `year` and of `--compare release=412,413` for `big`, each timed, and
# what the server's query log says of them (duration, rows read, CPU).
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:?usage: scripts/bench/report.sh STACK_DIR [load] [RUNS]}
# shellcheck disable=SC1091
source "$dir/stack.env"
runs=5
if [[ ${2:-} == load ]]; then load=1; runs=${3:-5}; else load=0; runs=${2:-5}; fi
url=$CH26_URL
db=${BENCH_DB:-bench_report}
export COLLECTOR_CLICKHOUSE_URLS=$url COLLECTOR_CLICKHOUSE_DATABASE=$db \
  COLLECTOR_CLICKHOUSE_TABLE_FORM=single COLLECTOR_CLICKHOUSE_CLUSTER=$CH26_CLUSTER \
  COLLECTOR_DATABASE_URL=postgres://postgres@127.0.0.1:$PG_PORT/$db
bin=${COLLECTOR_BIN:-target/debug/collector}
ch() { curl -sS --fail-with-body "$url/?max_memory_usage=4000000000" --data-binary @-; }

# Rows of site $1 spread over the last $2 days, numbers $3 to $3 + 999,999 (or $4 rows; $5: the
# time of row `number`, unix seconds, instead).
chunk() {
  cat <<SQL
INSERT INTO ${db}.measurements (id, site, received_at, url, ts, page_view_at, navigation_type,
  ttfb_ms, fcp_ms, lcp_ms, inp_ms, cls, user_agent, sample_rate, device_type, browser,
  browser_version, os, country, dimension_names, dimension_values, page_group)
SELECT generateUUIDv4(), '$1', t, 'https://shop.example/p', toInt64(toUInt32(t)) * 1000, t,
  if(number % 4 = 0, 'soft_navigation', 'navigate'),
  if(number % 11 = 0, NULL, toFloat64(40 + intHash64(number * 5 + 1) % 2000) + (intHash64(number * 7 + 1) % 10000) / 10000),
  toFloat64(300 + intHash64(number * 5 + 2) % 3500) + (intHash64(number * 7 + 2) % 10000) / 10000,
  if(number % 7 = 0, NULL, toFloat64(400 + intHash64(number * 5 + 3) % 5000) + (intHash64(number * 7 + 3) % 10000) / 10000),
  if(number % 5 = 0, NULL, toFloat64(16 + intHash64(number * 5 + 4) % 700)),
  if(number % 9 = 0, NULL, (intHash64(number * 5 + 5) % 400000000) / 1000000000),
  '', if(number % 3 = 0, 0.5, 1),
  ['mobile', 'mobile', 'desktop', 'tablet', 'bot', 'unknown', 'mobile'][number % 7 + 1],
  ['Chrome Mobile', 'Chrome', 'Firefox', 'Mobile Safari', 'Edge', 'Samsung Internet'][number % 6 + 1],
  '131', ['Android', 'Windows', 'iOS'][number % 3 + 1], 'DE',
  ['release'], [toString(number % 2 + 412)], 'product'
FROM (SELECT number, toDateTime(${5:-toUInt32(now()) - intHash32(number) % ($2 * 86400)}, 'UTC') AS t
      FROM numbers($3, ${4:-1000000}))
SQL
}

if ((load)); then
  psql "postgres://postgres@127.0.0.1:$PG_PORT/postgres" -qc "CREATE DATABASE $db" 2>/dev/null || true
  "$bin" migrate >/dev/null
  for site in ${BENCH_SITES:-big year other}; do
    case $site in
      big) for i in $(seq 0 9); do chunk big 29 $((i * 1000000)) | ch; done ;;
      year) for i in $(seq 0 9); do chunk year 395 $((i * 1000000)) | ch; done ;;
      other) for i in 0 1 2; do chunk other 29 $((i * 1000000)) | ch; done ;;
    esac
  done
fi
echo "rows per site:"; echo "SELECT site, count() FROM ${db}.measurements GROUP BY site ORDER BY site" | ch
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
started=$(echo "SELECT toUnixTimestamp(now())" | ch)
# The CrUX view of each site: the first view with the daily roll-up emptied (every day computed
# from the rows and stored), RUNS views reading the stored days, then one after a late row for
# yesterday (that day computed again).
crux() { /usr/bin/time -f "report --crux --site $1 ($2): %e s" "$bin" report --site "$1" --crux --format json >/dev/null; }
for site in ${BENCH_SITES:-big year}; do
  [[ $site == other ]] && continue
  echo "ALTER TABLE ${db}.crux_day_marks DELETE WHERE site = '$site'" | ch
  until [[ $(echo "SELECT count() FROM ${db}.crux_day_marks WHERE site = '$site'" | ch) == 0 ]]; do sleep 0.2; done
  crux "$site" "roll-up empty"
  for _ in $(seq "$runs"); do crux "$site" "roll-up full"; done
  # One row at 23:00 yesterday (UTC), received now.
  chunk "$site" 1 0 1 "toUInt32(toStartOfDay(now())) - 3600" | ch
  crux "$site" "a late row yesterday"
done
for _ in $(seq "$runs"); do
  /usr/bin/time -f "report --compare release=412,413 --site big: %e s" \
    "$bin" report --site big --compare release=412,413 --format json >/dev/null
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "SYSTEM FLUSH LOGS" | ch
echo "every query the commands sent, oldest first (ms, rows read, bytes read, CPU s, memory):"
ch <<SQL
SELECT query_duration_ms AS ms, read_rows, formatReadableSize(read_bytes) AS read,
  round(ProfileEvents['UserTimeMicroseconds'] / 1e6, 2) AS cpu_s, formatReadableSize(memory_usage) AS memory,
  extract(query, 'site = ''([a-z]+)''') AS site,
  multiIf(query LIKE 'INSERT INTO ${db}.crux_days%', 'crux: store days', query LIKE 'INSERT INTO ${db}.crux_day_marks%', 'crux: marks',
          query LIKE '%count() AS rows%', 'crux: day rows', query LIKE '%FROM ${db}.crux_day_marks%', 'crux: read marks',
          query LIKE '%quantileExactWeightedMerge%', 'crux: view', query LIKE '%quantilesExactWeightedIf%', 'compare 3',
          query LIKE '%pow(1 / sample_rate%', 'compare 2', 'compare 1') AS kind
FROM system.query_log
WHERE type = 'QueryFinish' AND event_time >= toDateTime($started)
  AND (query LIKE '%${db}.measurements%' OR query LIKE '%${db}.crux_d%') AND query NOT LIKE '%system.query_log%'
  AND query NOT LIKE 'ALTER%' AND query NOT LIKE 'SELECT count() FROM ${db}.crux_day_marks%'
  AND query NOT LIKE 'INSERT INTO ${db}.measurements%' AND query NOT LIKE 'SELECT site, count()%'
ORDER BY event_time, query_start_time_microseconds
FORMAT PrettyCompactMonoBlock
SQL
