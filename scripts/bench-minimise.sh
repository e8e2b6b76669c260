#!/usr/bin/env bash
# scripts/bench-minimise.sh STACK_ENV [ROWS] [--ch26] - how fast `collector migrate` minimises
# rows an earlier release stored (docs/privacy.md, "Data stored before v5").
#
# On a running stack (scripts/stack.sh up DIR --replicas 2 --ch26; STACK_ENV is DIR/stack.env):
# a fresh database pair, ROWS rows (default 200000) of the current layout over three months with
# an address, tokens and long numbers in every string column, then `collector migrate` (the
# release build) twice: the first rewrites every row, the second finds every partition marked.
# Prints both summaries, the wall times and what is left; drops the databases after.
set -euo pipefail
cd "$(dirname "$0")/.."
env_file=$1 rows=${2:-200000} on=${3:-}
# shellcheck source=/dev/null
source "$env_file"
cargo build -q --release -p collector
bin=${CARGO_TARGET_DIR:-target}/release/collector
db=bench_minimise_$$
if [[ $on == --ch26 ]]; then
  urls=$CH26_URL form=single query_url="$CH26_URL/"
else
  urls=$CLICKHOUSE_URLS form=replicated query_url="$CLICKHOUSE_URL/?allow_experimental_low_cardinality_type=1"
fi
ch() { curl -sS --fail-with-body "$query_url" --data-binary @-; }
pg="postgres://postgres@127.0.0.1:$PG_PORT"
drop() {
  for u in ${urls//,/ }; do curl -sS "$u" --data-binary "DROP DATABASE IF EXISTS $db" || true; done
  psql -q "$pg/postgres" -c "DROP DATABASE IF EXISTS $db" || true
}
trap drop EXIT
psql -q "$pg/postgres" -c "CREATE DATABASE $db"
export COLLECTOR_DATABASE_URL="$pg/$db" COLLECTOR_CLICKHOUSE_URLS=$urls \
  COLLECTOR_CLICKHOUSE_DATABASE=$db COLLECTOR_CLICKHOUSE_TABLE_FORM=$form
"$bin" migrate >/dev/null
"$bin" sites add --key shop-1 --keep-query q --keep-query 'utm_*' >/dev/null
ch <<SQL
INSERT INTO $db.measurements (id, site, received_at, page_view_at, ts, url, referrer, user_agent,
  lcp_ms, lcp_target, lcp_url, server_timing_name, server_timing_dur, server_timing_desc,
  dimension_names, dimension_values, page_group)
SELECT generateUUIDv4(), 'shop-1', toDateTime(1788000000 + number * 20, 'UTC') AS t, t,
  toInt64(toUInt32(t)) * 1000,
  concat('https://shop.test/account/jane', toString(number), '@mailhost.test/p/', toString(number % 1000),
    '?token=Zq9XyW8vU7tS6rQ5pO4n&q=x', toString(number), '&utm_source=news'),
  'https://mail.other.test/inbox/12345678901234',
  'Mozilla/5.0 (Linux; Android 14) InApp/2.1 jane@mailhost.test Chrome/131.0.6778.135',
  1500.5, '#order-12345678901234', 'https://cdn.test/a/jane@mailhost.test.jpg',
  ['cdn-cache', 'db'], [0.0, 1.0], ['HIT', 'session=Zq9XyW8vU7tS6rQ5pO4n'],
  ['phone'], ['+49 170 1234567'], '/p/*'
FROM system.numbers LIMIT $rows
SQL
echo "rows: $(echo "SELECT count() FROM $db.measurements" | ch)"
for run in first second; do
  start=$(date +%s%N)
  "$bin" migrate 2>/dev/null | grep "stored rows"
  echo "$run migrate: $(( ($(date +%s%N) - start) / 1000000 )) ms"
done
leaky="position(url, 'mailhost') > 0 OR position(user_agent, 'mailhost') > 0"
echo "left with an address: $(echo "SELECT count() FROM $db.measurements FINAL WHERE $leaky" | ch) under FINAL," \
  "$(echo "SELECT count() FROM $db.measurements WHERE $leaky" | ch) on disk (versions not merged away)," \
  "rows under FINAL: $(echo "SELECT count() FROM $db.measurements FINAL" | ch)"
