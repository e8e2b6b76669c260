#!/usr/bin/env python3
"""The read side of the measurements table, measured: v1's layout against v2's.

    storage.py --clickhouse URL [--rows N] [--sites N] [--runs N] [--doc docs/benchmarks.md] [--note TEXT]

Creates database `bench_storage` on the ClickHouse server at URL with two tables of the same
columns (schema/clickhouse/002_measurements.sql) and the same generated rows:
  - `measurements`: v2 as shipped, ORDER BY (site, toDate(page_view_at), id),
    PARTITION BY toYYYYMM(page_view_at);
  - `measurements_v1`: v1's layout, ORDER BY id, PARTITION BY toYYYYMM(received_at), so that
    the same query text runs on both and only the layout differs.
Rows: N (default 10,000,000) page views of SITES (default 2,000) shops over the 30 days
before 2026-12-11 00:00 UTC (two monthly partitions), shops' sizes skewed as real ones are
(site k's share falls with k: the index is floor(SITES * u^3) for u uniform), eight user agents
(an iPhone's WebKit measures no LCP, INP or CLS; Firefox no CLS; one crawler). Every value is
a hash of the row number, so every run stores the same rows.

Then runs each query of docs/queries.md (as the test does: by its marker, parameters bound as
literals) for the largest shop and a median one over the last 7 days, on both tables, as
written (FINAL) and without FINAL, RUNS times each (after one warm-up), and reports the median
rows read, bytes read and server time (system.query_log on 18.16; the X-ClickHouse-Summary
header where the server sends one). With --doc, writes the table into the file between
<!-- MARKER:begin --> and <!-- MARKER:end --> (--marker, default `storage`; appended when
absent) and keeps the rest. --single-server makes both tables plain ReplacingMergeTree (a
server without ZooKeeper, such as the stack's 26.x one).

Standard library only. Drops bench_storage at the end unless --keep.
"""

import argparse
import json
import os
import re
import statistics
import sys
import time
import urllib.parse
import urllib.request
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
END = 1796947200  # 2026-12-11 00:00:00 UTC
DAYS = 30

# (user agent, device_type, browser, browser_version, os, measures LCP/INP, measures CLS)
AGENTS = [
    ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1",
     "mobile", "Mobile Safari", "17", "iOS", False, False),
    ("Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Mobile Safari/537.36",
     "mobile", "Chrome Mobile", "131", "Android", True, True),
    ("Mozilla/5.0 (Linux; Android 14; SM-S921B) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/130.0.0.0 Mobile Safari/537.36",
     "mobile", "Chrome Mobile", "130", "Android", True, True),
    ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
     "desktop", "Chrome", "131", "Windows", True, True),
    ("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
     "desktop", "Chrome", "131", "Mac OS X", True, True),
    ("Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
     "desktop", "Firefox", "128", "Linux", True, False),
    ("Mozilla/5.0 (iPad; CPU OS 16_6 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/16.6 Mobile/15E148 Safari/604.1",
     "tablet", "Mobile Safari", "16", "iOS", False, False),
    ("Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
     "bot", "Googlebot", "2", "Other", True, True),
]


def die(msg):
    print(f"storage.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


class Server:
    """A ClickHouse HTTP endpoint; every failure is fatal and names the statement."""

    def __init__(self, url):
        self.url = url.rstrip("/") + "/"

    def post(self, sql, params=None, timeout=1800):
        q = urllib.parse.urlencode(params or {})
        req = urllib.request.Request(self.url + ("?" + q if q else ""), data=sql.encode(), method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                body = resp.read().decode()
                headers = resp.headers
        except urllib.error.HTTPError as e:
            die(f"{e.code} {e.read().decode()[:2000]}\n--- for ---\n{sql[:2000]}")
        if "__exception__" in body[-4096:] or headers.get("X-ClickHouse-Exception-Code"):
            die(f"exception in the answer: {body[-2000:]}\n--- for ---\n{sql[:2000]}")
        return body, headers

    def rows(self, sql, params=None):
        body, _ = self.post(sql + " FORMAT JSON", params)
        data = json.loads(body).get("data")
        if data is None:
            die(f"no data in the answer to {sql}")
        return data

    def value(self, sql):
        rows = self.rows(sql)
        if len(rows) != 1 or len(rows[0]) != 1:
            die(f"{sql}: expected one value, got {rows}")
        return next(iter(rows[0].values()))


def ddl(database, single_server):
    """The v2 DDL and the v1-layout DDL of the same columns, for `database`; with
    `single_server`, in a plain ReplacingMergeTree (a server without ZooKeeper or Keeper)."""
    with open(os.path.join(ROOT, "schema/clickhouse/002_measurements.sql")) as f:
        v2 = f.read()
    if single_server:
        engine = re.search(r"^ENGINE = ReplicatedReplacingMergeTree\(.*\)$", v2, re.M)
        if not engine:
            die("schema/clickhouse/002_measurements.sql has no replicated ENGINE line: update storage.py")
        v2 = v2.replace(engine.group(0), "ENGINE = ReplacingMergeTree")
    v2 = v2.replace("{database}", database).rstrip().rstrip(";")
    v1 = v2
    replacements = [
        (f"{database}.measurements\n", f"{database}.measurements_v1\n"),
        ("PARTITION BY toYYYYMM(page_view_at)", "PARTITION BY toYYYYMM(received_at)"),
        ("ORDER BY (site, toDate(page_view_at), id)", "ORDER BY id"),
    ]
    if not single_server:
        replacements.append(("/measurements_v2'", "/measurements_v1_layout'"))
    for old, new in replacements:
        if old not in v1:
            die(f"schema/clickhouse/002_measurements.sql no longer contains {old!r}: update storage.py")
        v1 = v1.replace(old, new)
    return v2, v1


def generate(database, rows, sites):
    """INSERT … SELECT of `rows` generated page views into `database`.measurements."""
    arr = lambda i: "[" + ", ".join("'" + a[i].replace("'", "\\'") + "'" for a in AGENTS) + "]"
    webkit = "[" + ", ".join(str(int(not a[5])) for a in AGENTS) + "]"
    no_cls = "[" + ", ".join(str(int(not a[6])) for a in AGENTS) + "]"
    start = END - DAYS * 86400
    return f"""
INSERT INTO {database}.measurements
    (id, site, received_at, url, ts, referrer, navigation_type, ttfb_ms, fcp_ms, lcp_ms, inp_ms,
     dom_content_loaded_ms, load_ms, cls, viewport_width, effective_connection_type, user_agent,
     sample_rate, page_view_at, device_type, browser, browser_version, os)
SELECT
    generateUUIDv4(),
    concat('site-', toString(s)),
    toDateTime(t + cityHash64(number, 9) % 30, 'UTC'),
    concat('https://shop', toString(s), '.example/p/', toString(cityHash64(number, 2) % 60),
           if(cityHash64(number, 10) % 3 = 0, '?utm_source=mail', '')),
    toNullable(toInt64(t) * 1000),
    CAST(NULL AS Nullable(String)),
    toNullable('navigate'),
    toNullable(toFloat64(40 + cityHash64(number, 11) % 900)),
    toNullable(toFloat64(400 + cityHash64(number, 12) % 2500)),
    if({webkit}[u + 1] = 1, CAST(NULL AS Nullable(Float64)), toNullable(toFloat64(500 + cityHash64(number, 4) % 6000))),
    if({webkit}[u + 1] = 1 OR cityHash64(number, 5) % 4 = 0, CAST(NULL AS Nullable(Float64)), toNullable(toFloat64(16 + cityHash64(number, 5) % 700))),
    toNullable(toFloat64(800 + cityHash64(number, 13) % 3000)),
    toNullable(toFloat64(1500 + cityHash64(number, 14) % 5000)),
    if({no_cls}[u + 1] = 1, CAST(NULL AS Nullable(Float64)), toNullable((cityHash64(number, 6) % 400) / 1000.)),
    toNullable(toUInt32(360 + cityHash64(number, 15) % 1600)),
    toNullable('4g'),
    {arr(0)}[u + 1],
    1,
    toDateTime(t, 'UTC'),
    {arr(1)}[u + 1],
    {arr(2)}[u + 1],
    {arr(3)}[u + 1],
    {arr(4)}[u + 1]
FROM (
    SELECT
        number,
        toUInt32(floor(pow(cityHash64(number, 1) / 18446744073709551616., 3) * {sites})) AS s,
        toUInt32({start} + cityHash64(number, 3) % {DAYS * 86400}) AS t,
        toUInt8(cityHash64(number, 7) % {len(AGENTS)}) AS u
    FROM system.numbers
    LIMIT {rows}
)
"""


def documented_queries():
    """(name, sql) of every `<!-- query: name -->` block of docs/queries.md, in order."""
    with open(os.path.join(ROOT, "docs/queries.md")) as f:
        doc = f.read()
    found = re.findall(r"<!-- query: (\w+) -->\s*```sql\n(.*?)```", doc, re.S)
    if not found:
        die("no queries found in docs/queries.md")
    return found


def bind(sql, table, params):
    sql = sql.replace("collector.measurements", table)
    for name, literal in params.items():
        sql = re.sub(r"\{" + name + r":\w+\}", literal, sql)
    if re.search(r"\{\w+:\w+\}", sql):
        die(f"a parameter is left unbound: {sql}")
    return sql


def wait_merges(server, database, limit=600):
    start = time.time()
    while True:
        n = int(server.value(f"SELECT count() FROM system.merges WHERE database = '{database}'"))
        if n == 0:
            return time.time() - start
        if time.time() - start > limit:
            die(f"merges still running after {limit} s")
        time.sleep(2)


def measure(server, sql, runs, has_query_log):
    """Median (rows read, bytes read, server ms, client ms) of `runs` runs after a warm-up."""
    server.post(sql + " FORMAT Null")
    ids, client_ms, summaries = [], [], []
    for _ in range(runs):
        qid = str(uuid.uuid4())
        ids.append(qid)
        t0 = time.perf_counter()
        _, headers = server.post(sql + " FORMAT Null", {"query_id": qid, "log_queries": "1"})
        client_ms.append((time.perf_counter() - t0) * 1000)
        summary = headers.get("X-ClickHouse-Summary")
        if summary:
            summaries.append(json.loads(summary))
    if has_query_log:
        server.post("SYSTEM FLUSH LOGS")
        id_list = ", ".join(f"'{i}'" for i in ids)
        logged = server.rows(
            "SELECT query_id, read_rows, read_bytes, query_duration_ms FROM system.query_log "
            f"WHERE query_id IN ({id_list}) AND type = 2")
        if len(logged) != runs:
            die(f"system.query_log has {len(logged)} of {runs} runs of {sql[:200]}")
        rows = [int(r["read_rows"]) for r in logged]
        bytes_ = [int(r["read_bytes"]) for r in logged]
        server_ms = [float(r["query_duration_ms"]) for r in logged]
    elif len(summaries) == runs:
        rows = [int(s["read_rows"]) for s in summaries]
        bytes_ = [int(s["read_bytes"]) for s in summaries]
        server_ms = [int(s.get("elapsed_ns", 0)) / 1e6 for s in summaries]
    else:
        die("the server has neither system.query_log nor X-ClickHouse-Summary")
    med = statistics.median
    return med(rows), med(bytes_), med(server_ms), med(client_ms)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clickhouse", required=True, help="the server's HTTP URL")
    p.add_argument("--database", default="bench_storage", help="created, and dropped at the end (default %(default)s)")
    p.add_argument("--rows", type=int, default=10_000_000, help="rows generated (default %(default)s)")
    p.add_argument("--sites", type=int, default=2000, help="shops (default %(default)s)")
    p.add_argument("--runs", type=int, default=3, help="runs per query after a warm-up (default %(default)s)")
    p.add_argument("--doc", help="the Markdown file to write the table into")
    p.add_argument("--keep", action="store_true", help="keep the database")
    p.add_argument("--note", default="", help="a line printed under the table")
    p.add_argument("--single-server", action="store_true",
                   help="plain ReplacingMergeTree tables (a server without replication)")
    p.add_argument("--marker", default="storage",
                   help="the section's markers in --doc: <!-- MARKER:begin --> ... <!-- MARKER:end -->")
    a = p.parse_args()
    server = Server(a.clickhouse)
    version = server.value("SELECT version()")
    db = a.database
    # 18.16 creates LowCardinality columns only with this setting; 26.x refuses it as unknown.
    known = int(server.value("SELECT count() FROM system.settings WHERE name = 'allow_experimental_low_cardinality_type'"))
    settings = {"allow_experimental_low_cardinality_type": "1"} if known else {}
    server.post(f"DROP DATABASE IF EXISTS {db}")
    server.post(f"CREATE DATABASE {db}")
    v2, v1 = ddl(db, a.single_server)
    server.post(v2, settings)
    server.post(v1, settings)

    t0 = time.time()
    # The stack's servers cap a query at 1 GiB; a load of 10,000,000 wide rows needs more.
    load = {"max_memory_usage": str(8 << 30)}
    server.post(generate(db, a.rows, a.sites), load)
    server.post(f"INSERT INTO {db}.measurements_v1 SELECT * FROM {db}.measurements", load)
    load_s = time.time() - t0
    merge_s = wait_merges(server, db)
    parts = {t: int(server.value(
        f"SELECT count() FROM system.parts WHERE database = '{db}' AND table = '{t}' AND active"))
        for t in ("measurements", "measurements_v1")}
    stored = int(server.value(f"SELECT count() FROM {db}.measurements"))
    if stored != a.rows:
        die(f"{stored} rows stored of {a.rows}")
    print(f"{a.rows} rows loaded in {load_s:.0f} s, merges settled in {merge_s:.0f} s, "
          f"active parts v2 {parts['measurements']}, v1 layout {parts['measurements_v1']}", file=sys.stderr)

    sizes = server.rows(
        f"SELECT site, count() AS n FROM {db}.measurements "
        f"WHERE page_view_at >= toDateTime({END - 7 * 86400}, 'UTC') GROUP BY site ORDER BY n DESC, site")
    largest, median = sizes[0], sizes[len(sizes) // 2]
    shops = [("largest", largest), ("median", median)]
    has_query_log = int(server.value("SELECT count() FROM system.tables WHERE database = 'system' AND name = 'query_log'")) > 0 \
        or version.startswith("18.")
    params = {
        "from": f"toDateTime({END - 7 * 86400}, 'UTC')",
        "to": f"toDateTime({END}, 'UTC')",
        "min_page_views": "20",
    }
    results = []
    for name, sql in documented_queries():
        for shop, row in shops:
            params["site"] = f"'{row['site']}'"
            for table, layout in ((f"{db}.measurements_v1", "v1"), (f"{db}.measurements", "v2")):
                for final in (True, False):
                    text = bind(sql, table, params)
                    if not final:
                        text = text.replace(f"{table} FINAL", table)
                    r = measure(server, text, a.runs, has_query_log)
                    results.append((name, shop, row, layout, final, r))
                    print(f"{name:26} {shop:8} {layout} {'FINAL' if final else 'plain':5} "
                          f"rows {r[0]:>10,.0f}  {r[2]:8.1f} ms", file=sys.stderr)

    table = render(results, version, a, load_s, parts, shops)
    if a.note:
        table += "\n" + a.note + "\n"
    print(table)
    if a.doc:
        write_doc(a.doc, table, a.marker)
    if not a.keep:
        server.post(f"DROP DATABASE IF EXISTS {db}")


def render(results, version, a, load_s, parts, shops):
    by = {(n, s, l, f): r for n, s, _, l, f, r in results}
    names = list(dict.fromkeys(n for n, *_ in results))
    out = [
        f"## Storage: one shop's dashboard, v1 against v2, ClickHouse {version.split('.')[0]}.x",
        "",
        f"Generated by `scripts/bench.sh --storage` on {time.strftime('%Y-%m-%d', time.gmtime())}, ClickHouse "
        f"{version}, " + ("the stack's single 26.x server, plain ReplacingMergeTree tables." if a.single_server
                          else "one replica of the stack (replicated tables).") + f" {a.rows:,} rows of {a.sites:,} shops over 30 days (two monthly "
        f"partitions), loaded in {load_s:.0f} s; active parts after merges: v2 {parts['measurements']}, "
        f"v1 layout {parts['measurements_v1']}. Same rows and columns in both tables; v1 layout = "
        "`ORDER BY id`, `PARTITION BY toYYYYMM(received_at)`; v2 = `ORDER BY (site, toDate(page_view_at), id)`, "
        "`PARTITION BY toYYYYMM(page_view_at)`. Each query is `docs/queries.md`'s, for the last 7 days, "
        f"median of {a.runs} runs after a warm-up; rows and bytes read and time are the server's "
        "(`system.query_log`, or `X-ClickHouse-Summary`).",
        "",
        "Shops: " + "; ".join(f"{s} = `{r['site']}` ({int(r['n']):,} rows in the 7 days)" for s, r in shops) + ".",
        "",
        "| query | shop | FINAL | v1 rows read | v2 rows read | v1 ms | v2 ms | v1 MB read | v2 MB read |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n in names:
        for s, _ in shops:
            for f in (True, False):
                r1, r2 = by[(n, s, "v1", f)], by[(n, s, "v2", f)]
                out.append(
                    f"| `{n}` | {s} | {'yes' if f else 'no'} | {r1[0]:,.0f} | {r2[0]:,.0f} | {r1[2]:,.0f} | "
                    f"{r2[2]:,.0f} | {r1[1] / 1e6:,.1f} | {r2[1] / 1e6:,.1f} |")
    return "\n".join(out) + "\n"


def write_doc(path, table, marker):
    old = open(path).read() if os.path.exists(path) else ""
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    block = f"{begin}\n{table}{end}"
    if begin in old and end in old:
        new = old[:old.index(begin)] + block + old[old.index(end) + len(end):]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(new)


if __name__ == "__main__":
    main()
