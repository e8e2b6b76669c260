#!/usr/bin/env python3
"""Helpers of scripts/bench.sh (standard library only; `profile` runs perf report).

    bench.py bodies OUT N NONCE SITES         N single-beacon bodies, one per line, unique ids
    bench.py metrics URL                      the collector's /metrics, summed: KEY=VALUE lines
    bench.py proc PID [PID...]                cpu seconds (utime+stime), VmHWM, VmRSS (kB)
    bench.py core0                            busy, total, interrupt seconds of CPU 0 since boot
    bench.py probes --port P --clickhouse URL --out F ...   time from 202 to a visible row
    bench.py idle --port P --count N --ready F ...          hold N idle keep-alive connections
    bench.py oha FILE                         KEY=VALUE figures of an oha JSON result
    bench.py json-kv FILE [PREFIX]            top-level scalars of a JSON object
    bench.py profile PERF_DATA OUT_MD [NOTE]  the profile section of docs/benchmarks.md
    bench.py report RESULTS OUT_MD [--doc --dir D]   the table (stdout) and docs/benchmarks.md
    bench.py ablation RESULTS OUT_MD [--profile MD]  the ablation's table (stdout) and its
                                              section of docs/benchmarks.md

Results travel between the steps as KEY=VALUE lines in one file (see bench.sh).
"""

import argparse
import http.client
import json
import os
import random
import re
import resource
import signal
import socket
import sys
import time
import urllib.request
import uuid

# ----------------------------------------------------------------- small tools ---


PATHS = ["/", "/products/{a}", "/products/{a}?variant={b}", "/category/{b}",
         "/search?q=item+{a}", "/cart", "/checkout/shipping", "/account/orders/{a}"]
NAV = ["navigate"] * 4 + ["reload", "back_forward", "prerender", "restore"]
ECT = ["4g"] * 4 + ["3g", "2g", "slow-2g"]
WIDTHS = [360, 375, 390, 412, 414, 768, 1024, 1280, 1366, 1440, 1536, 1920]
REFERRERS = ["https://www.google.com/", "https://www.bing.com/", "https://duckduckgo.com/",
             "https://shop{s:02d}.example/"]


def beacon(rng, ident, site, now_ms):
    """One measurement like the wrk script's (same fields, similar values)."""
    ttfb = 40 + rng.random() * 900
    fcp = ttfb + rng.random() * 1500
    lcp = fcp + rng.random() * 2500
    path = rng.choice(PATHS).format(a=rng.randint(1, 99999), b=rng.randint(1, 50))
    return {
        "id": ident,
        "site": f"bench-{site:02d}",
        "url": f"https://shop{site:02d}.example{path}",
        "ts": now_ms - rng.randint(0, 3000),
        "referrer": rng.choice(REFERRERS).format(s=site),
        "navigation_type": rng.choice(NAV),
        "ttfb_ms": round(ttfb, 1),
        "fcp_ms": round(fcp, 1),
        "lcp_ms": round(lcp, 1),
        "inp_ms": round(8 + rng.random() * 592, 1),
        "dom_content_loaded_ms": round(fcp + rng.random() * 800, 1),
        "load_ms": round(lcp + rng.random() * 3000, 1),
        "cls": round(rng.random() * rng.random() * 0.6, 3),
        "viewport_width": rng.choice(WIDTHS),
        "effective_connection_type": rng.choice(ECT),
    }


def cmd_bodies(args):
    """Bodies for oha -Z: one JSON object per line; ids never repeat (nonce + counter)."""
    rng = random.Random(int(args.nonce, 16))
    now_ms = int(time.time() * 1000)
    with open(args.out, "w") as f:
        for i in range(args.n):
            ident = "%s-%04x-4%03x-%x%03x-%012x" % (
                args.nonce, 0xffff, rng.randrange(4096), rng.randint(8, 11),
                rng.randrange(4096), i + 1)
            site = rng.randint(1, args.sites)
            f.write(json.dumps(beacon(rng, ident, site, now_ms), separators=(",", ":")))
            f.write("\n")
    return 0


LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')


def scrape(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = LINE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        out.setdefault(name, []).append((labels, value))
    return out


def cmd_metrics(args):
    """KEY=VALUE lines of the figures bench.sh needs, summed over label sets."""
    m = scrape(args.url)

    def total(name, pred=lambda labels: True):
        return sum(v for labels, v in m.get(name, []) if pred(labels))

    intake = lambda labels: 'route="/api/v1/measurements"' in labels
    figures = {
        "accepted": total("collector_measurements_accepted_total"),
        "duplicates": total("collector_measurements_duplicate_total"),
        "rejected": total("collector_measurements_rejected_total"),
        "inserts": total("collector_clickhouse_inserts_total"),
        "insert_errors": total("collector_clickhouse_insert_errors_total"),
        "batches_retried": total("collector_batches_retried_total"),
        "failovers": total("collector_clickhouse_failovers_total"),
        "intake_202": total("collector_http_requests_total",
                            lambda l: intake(l) and 'status="202"' in l),
        "intake_other": total("collector_http_requests_total",
                              lambda l: intake(l) and 'status="202"' not in l),
        "shed": total("collector_http_shed_total"),
        "rate_limited": total("collector_http_rate_limited_total"),
        "spool_records": total("collector_spool_records"),
        "spool_bytes": total("collector_spool_bytes"),
        "open_connections": total("collector_http_open_connections"),
        "kept_aside": total("collector_spool_kept_aside_total"),
    }
    for k, v in figures.items():
        print(f"{k}={v:.0f}")
    return 0


def proc_figures(pid):
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2:].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime (fields 14, 15)
    status = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            status[k] = v.strip()
    kb = lambda key: int(status.get(key, "0 kB").split()[0])
    return cpu, kb("VmHWM"), kb("VmRSS")


def cmd_proc(args):
    cpu = hwm = rss = 0
    for pid in args.pids:
        c, h, r = proc_figures(pid)
        cpu, hwm, rss = cpu + c, hwm + h, rss + r
    print(f"cpu={cpu:.2f} hwm_kb={hwm} rss_kb={rss}")
    return 0


def cmd_core0(_args):
    """Busy, total and interrupt (hard+soft) seconds of CPU 0 since boot (/proc/stat)."""
    ticks = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu0 "):
                v = [int(x) for x in line.split()[1:]]
                idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
                total = sum(v[:8])  # guest time is already in user
                irq = v[5] + v[6]  # hardirq + softirq: not in any process's utime/stime
                print(f"{(total - idle) / ticks:.2f} {total / ticks:.2f} {irq / ticks:.2f}")
                return 0
    return 1


def percentile(values, p):
    """Nearest-rank percentile of a list (p in 0..100)."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(-(-p * len(s) // 100)) - 1))
    return s[k]


# ------------------------------------------------------------ time to visibility ---


def cmd_probes(args):
    """Sends probe beacons one at a time; for each, the time from its 202 to the first
    poll of ClickHouse (every 20 ms) that finds the row. Writes a JSON summary."""
    col = http.client.HTTPConnection(args.host, args.port, timeout=10)
    ch_host, ch_port = args.clickhouse.split("//", 1)[1].rsplit(":", 1)
    ch = http.client.HTTPConnection(ch_host, int(ch_port), timeout=10)
    rng = random.Random()
    seen, non202, timeouts, errors = [], 0, 0, []
    stop_at = time.time() + args.seconds
    sent = 0
    while sent < args.count and time.time() < stop_at:
        sent += 1
        ident = str(uuid.uuid4())
        site = rng.randint(1, args.sites)
        body = json.dumps(beacon(rng, ident, site, int(time.time() * 1000)))
        try:
            col.request("POST", "/api/v1/measurements", body,
                        {"Content-Type": "text/plain;charset=UTF-8",
                         "Origin": f"https://shop{site:02d}.example"})
            r = col.getresponse()
            r.read()
        except Exception as e:  # a dropped connection is a finding, not a crash
            errors.append(f"post: {e}")
            col.close()
            continue
        t202 = time.monotonic()
        if r.status != 202:
            non202 += 1
            continue
        query = (f"SELECT count() FROM {args.database}.measurements "
                 f"WHERE site = 'bench-{site:02d}' AND id = toUUID('{ident}')")
        k = 0
        while True:
            k += 1
            next_poll = t202 + k * args.interval
            delay = next_poll - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            try:
                ch.request("POST", "/", query)
                resp = ch.getresponse()
                text = resp.read().decode().strip()
            except Exception as e:
                errors.append(f"clickhouse: {e}")
                ch.close()
                text = "0"
            now = time.monotonic()
            if text.isdigit() and int(text) > 0:
                seen.append(now - t202)
                break
            if now - t202 > args.timeout:
                timeouts += 1
                break
    ms = [s * 1000 for s in seen]
    out = {
        "probes": sent,
        "visible": len(seen),
        "non202": non202,
        "timeouts": timeouts,
        "errors": errors[:5],
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
        "max_ms": max(ms) if ms else float("nan"),
    }
    with open(args.out, "w") as f:
        json.dump(out, f)
    return 0


# --------------------------------------------------------------- idle connections ---


def cmd_idle(args):
    """Opens N connections, sends one GET /healthz on each, reads its answer, and keeps them
    all open (idle keep-alive) until SIGTERM or --hold seconds."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = args.count + 100
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(want, soft)), hard))
    request = b"GET /healthz HTTP/1.1\r\nHost: bench\r\nConnection: keep-alive\r\n\r\n"
    socks, failed, ok = [], 0, 0
    for _ in range(args.count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(10)
        try:
            s.connect((args.host, args.port))
            s.sendall(request)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    raise ConnectionError("closed")
                data += chunk
            head, _, rest = data.partition(b"\r\n\r\n")
            m = re.search(rb"(?i)content-length:\s*(\d+)", head)
            need = int(m.group(1)) if m else 0
            while len(rest) < need:
                chunk = s.recv(4096)
                if not chunk:
                    raise ConnectionError("closed")
                rest += chunk
            if not head.startswith(b"HTTP/1.1 200"):
                raise ConnectionError(head.split(b"\r\n", 1)[0].decode(errors="replace"))
            ok += 1
            socks.append(s)
        except Exception:
            failed += 1
            s.close()
    with open(args.ready, "w") as f:
        f.write(f"open={ok} failed={failed}\n")
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    end = time.monotonic() + args.hold
    while not stop and time.monotonic() < end:
        time.sleep(0.2)
    # Still open at the end? A server that closed an idle connection early shows up here.
    still = 0
    for s in socks:
        try:
            s.setblocking(False)
            if s.recv(1) == b"":
                continue
        except BlockingIOError:
            still += 1
        except OSError:
            pass
    with open(args.ready, "a") as f:
        f.write(f"still_open={still}\n")
    for s in socks:
        s.close()
    return 0


def cmd_oha(args):
    """KEY=VALUE figures of an oha JSON result (latencies in ms)."""
    with open(args.file) as f:
        d = json.load(f)
    lat = d.get("latencyPercentiles", {})
    ms = lambda k: (lat.get(k) or float("nan")) * 1000
    codes = d.get("statusCodeDistribution", {})
    ok = sum(v for k, v in codes.items() if k.startswith("2"))
    bad = sum(v for k, v in codes.items() if not k.startswith("2"))
    errors = sum(d.get("errorDistribution", {}).values())
    print(f"rps={d['summary']['requestsPerSec']:.1f}")
    print(f"p50_ms={ms('p50'):.3f}")
    print(f"p99_ms={ms('p99'):.3f}")
    print(f"p999_ms={ms('p99.9'):.3f}")
    print(f"max_ms={d['summary']['slowest'] * 1000:.3f}")
    print(f"ok={ok}")
    print(f"non2xx={bad}")
    print(f"errors={errors}")
    return 0


def cmd_json_kv(args):
    """Top-level scalars of a JSON object as PREFIXKEY=VALUE lines."""
    with open(args.file) as f:
        d = json.load(f)
    for k, v in d.items():
        if isinstance(v, float):
            print(f"{args.prefix}{k}={v:.1f}")
        elif isinstance(v, (int, str)):
            print(f"{args.prefix}{k}={v}")
    return 0


# ----------------------------------------------------------------------- profile ---

# Stages of the collector, by the inclusive share ("children") of the frames that stand for
# them; the largest share among matching frames counts (frames nest, so shares never add).
STAGES = [
    ("connection tasks (hyper read/parse/write + router + handler)", r"^collector::server::serve::\{\{closure\}\}::\{\{closure\}\}"),
    ("  hyper: read and parse a request (incl. recv)", r"^(hyper::proto::h1::role::Server::parse|parse<hyper_util::rt::tokio::TokioIo|hyper::proto::h1::io::Buffered<.*>::parse$)"),
    ("  socket writes of answers (writev)", r"^(__GI___writev|__x64_sys_writev)$"),
    ("  router and middlewares (incl. handler)", r"^(axum::middleware::from_fn::Next::run|<axum::middleware::from_fn::FromFn<)"),
    ("    intake stations `endpoints::intake::accept`", r"^collector::endpoints::intake::(post|accept)"),
    ("      body parse `beacon::parse` (serde_json)", r"^(collector::beacon::)?parse$"),
    ("      validation `beacon::validate`", r"^(collector::beacon::)?validate$"),
    ("        URL normalisation `beacon::normalise_url`", r"^(collector::beacon::)?normalise_url$"),
    ("      site settings `SiteSettings::lookup`", r"^(collector::settings::SiteSettings::)?lookup(::\{\{closure\}\})?$"),
    ("      dedup window `Dedup::claim`", r"^(collector::dedup::Dedup::)?claim$"),
    ("      rows encoded once for the spool `EncodedRows::encode` (RowBinary)", r"^(collector::measurement::EncodedRows::)?encode"),
    ("spool appender thread `Appender::run`", r"^(collector::spool::appender::Appender::(run|commit(_group)?)|commit_group)$"),
    ("  fdatasync", r"^__x64_sys_fdatasync$"),
    ("writer thread (own runtime, nice +10) `writer::run`", r"^(collector::writer::run|collector::writer::spawn::\{\{closure\}\})"),
    ("  spool read `SpoolReader::read_available` (pread, no decoding)", r"^collector::spool::reader::SpoolReader::read_(available|frames)"),
    ("  ClickHouse insert `replicas::insert_rows` (LZ4, HTTP)", r"^collector::writer::replicas::insert_rows"),
    ("    LZ4 compression (clickhouse client)", r"^lz4_flex::block::compress::compress"),
    ("decoding at the spool boundary (rows or JSON decoded between intake and ClickHouse)", r"^(collector::measurement::(decode_all|row_bounds|Measurement::decode)|collector::spool::format::(to_rowbinary|scan_v1)|serde_json::de::from_slice)"),
    ("socket reads (recv)", r"^(__libc_recv|__x64_sys_recvfrom)$"),
    ("epoll_wait", r"^__x64_sys_epoll_wait$"),
    ("futex (thread wake-ups)", r"^__x64_sys_futex$"),
    ("all system calls", r"^do_syscall_64$"),
]

CATEGORIES = [
    ("kernel", lambda kind, sym: kind == "k"),
    ("allocator (jemalloc, or glibc malloc/free)", lambda kind, sym: sym.startswith("_rjem_") or re.search(
        r"malloc|_int_free|cfree|free$|realloc|calloc|unlink_chunk|tcache|consolidate|^free", sym)),
    ("memcpy/memmove/memset", lambda kind, sym: re.search(r"mem(cpy|move|set|cmp)", sym)),
    ("moka (caches)", lambda kind, sym: "moka::" in sym),
    ("serde_json", lambda kind, sym: "serde_json" in sym or "serde_core" in sym),
    ("hashing (SipHash)", lambda kind, sym: "sip::" in sym or "hash_one" in sym),
    ("url", lambda kind, sym: sym.startswith("url::") or "idna" in sym),
    ("hyper/http/axum/tower", lambda kind, sym: re.search(r"hyper|^http::|httparse|axum|tower", sym)),
    ("tokio", lambda kind, sym: "tokio::" in sym or "mio::" in sym),
    ("clickhouse client, lz4", lambda kind, sym: "clickhouse" in sym or "lz4" in sym.lower()),
    ("collector code", lambda kind, sym: "collector::" in sym),
]

ROW = re.compile(r"^\s*([\d.]+)%\s+([\d.]+)%\s+\[(.)\]\s+(.*?)(?:\s+-)*\s*$")


def perf_rows(data):
    """(children %, self %, kind k/., symbol) of every frame, from one perf report."""
    import subprocess
    out = subprocess.run(
        ["perf", "report", "-i", data, "--children", "--sort", "symbol", "-g", "none",
         "--stdio", "--percent-limit", "0.05"],
        capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        m = ROW.match(line)
        if m:
            sym = m.group(4).replace("(inlined)", "").strip()
            rows.append((float(m.group(1)), float(m.group(2)), m.group(3), sym))
    return rows


def short(sym, n=110):
    """Drops generic arguments (they make Rust frames unreadable); keeps `<A as B>::f`."""
    keep = 1 if sym.startswith("<") else 0
    out, depth = [], 0
    for ch in sym:
        if ch == "<":
            depth += 1
            if depth == keep + 1:
                out.append("<…>")
            if depth > keep:
                continue
        elif ch == ">" and depth:
            depth -= 1
            if depth >= keep:
                continue
        elif depth > keep:
            continue
        out.append(ch)
    s = "".join(out)
    return s if len(s) <= n else s[: n - 1] + "…"


def cmd_profile(args):
    rows = perf_rows(args.data)
    incl = [(c, kind, sym) for c, _, kind, sym in rows]
    flat = sorted(((s, kind, sym) for _, s, kind, sym in rows if s > 0), reverse=True)
    lines = [f"CPU profile of the collector under wrk at its best single-beacon connection count "
             f"(`perf record -e cpu-clock -F 499 --call-graph dwarf`, {args.note}); shares are of "
             f"the collector's on-CPU samples (all its threads, all on core 0).", ""]
    lines += ["Where the time goes, by stage (inclusive; stages nest, so they do not add up):", "",
              "| stage | share |", "| --- | --- |"]
    for label, pattern in STAGES:
        rx = re.compile(pattern)
        best = max((pct for pct, _, sym in incl if rx.search(sym)),
                   default=0.0)
        lines.append(f"| {label} | {best:.1f} % |")
    alloc = sum(pct for pct, _, sym in incl
                if re.match(r"^__GI___libc_(malloc|free|realloc)|^__libc_calloc|^_rjem_(malloc|sdallocx|realloc|calloc|free)$|^_rjem_je_(malloc_default|sdallocx_default)$", sym))
    lines.append(f"| allocator: malloc + free + realloc + calloc (inclusive, summed; glibc or jemalloc) | {alloc:.1f} % |")
    lines += ["", "Self time by kind of code (each sample counted once, first match):", "",
              "| kind | share |", "| --- | --- |"]
    totals = {label: 0.0 for label, _ in CATEGORIES}
    other = 0.0
    for pct, kind, sym in flat:
        for label, pred in CATEGORIES:
            if pred(kind, sym):
                totals[label] += pct
                break
        else:
            other += pct
    for label, _ in CATEGORIES:
        lines.append(f"| {label} | {totals[label]:.1f} % |")
    lines.append(f"| other (libc, std, ...) | {other:.1f} % |")
    lines += ["", f"Top {args.top} functions by self time:", "", "| self | function |", "| --- | --- |"]
    for pct, kind, sym in flat[: args.top]:
        lines.append(f"| {pct:.2f} % | `{short(sym)}`{' (kernel)' if kind == 'k' else ''} |")
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


# ------------------------------------------------------------------------ report ---


def load_results(path):
    r = {}
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if "=" in line:
                k, v = line.split("=", 1)
                r[k] = v
    return r


def num(r, key, default=float("nan")):
    try:
        return float(r[key])
    except (KeyError, ValueError):
        return default


def fmt(x, digits=0, unit=""):
    if x != x:  # NaN
        return "n/a"
    if digits == 0:
        return f"{x:,.0f}{unit}"
    return f"{x:,.{digits}f}{unit}"


def verdict(ok):
    if ok is None:
        return "not measured"
    return "met" if ok else "NOT met"


def figures(r):
    """(label, collector, nginx, goal, verdict) rows of the main table."""
    rows = []
    c1, n1 = num(r, "tp_collector_1_beacons"), num(r, "tp_nginx_1_beacons")
    c10, n10 = num(r, "tp_collector_10_beacons"), num(r, "tp_nginx_10_beacons")
    ratio1 = c1 / n1 if n1 == n1 and n1 > 0 else float("nan")
    ratio10 = c10 / n10 if n10 == n10 and n10 > 0 else float("nan")
    conns = lambda k: f" (c={r.get(k, '?')})"
    rows.append(("(a) max throughput, 1 beacon/request, beacons/s, 0 errors",
                 fmt(c1) + conns("tp_collector_1_conns"), fmt(n1) + conns("tp_nginx_1_conns"),
                 "collector >= 35 % of nginx",
                 f"{fmt(ratio1 * 100, 1)} % of nginx: " + verdict(ratio1 >= 0.35 if ratio1 == ratio1 else None)))
    rows.append(("(a) max throughput, 10 beacons/request, beacons/s, 0 errors",
                 fmt(c10) + conns("tp_collector_10_conns"), fmt(n10) + conns("tp_nginx_10_conns"),
                 "collector >= 50 % of nginx",
                 f"{fmt(ratio10 * 100, 1)} % of nginx: " + verdict(ratio10 >= 0.50 if ratio10 == ratio10 else None)))
    rate = r.get("lat_rate", "?")
    lat = lambda who, p: fmt(num(r, f"lat_{who}_{p}_ms"), 2, " ms")
    p99 = num(r, "lat_collector_p99_ms")
    n99 = num(r, "lat_nginx_p99_ms")
    rows.append((f"(b) latency p50 / p99 / p99.9 at {rate} req/s (70 % of collector max), open loop",
                 f"{lat('collector', 'p50')} / {lat('collector', 'p99')} / {lat('collector', 'p999')}",
                 f"{lat('nginx', 'p50')} / {lat('nginx', 'p99')} / {lat('nginx', 'p999')}",
                 "p99 <= 3 x nginx's p99",
                 f"{fmt(p99 / n99, 1)} x nginx: " + verdict(p99 <= 3 * n99 if p99 == p99 and n99 == n99 else None)))
    rows.append(("(c) CPU seconds per 100,000 measurements: at 70 % load (1/request)",
                 fmt(num(r, "cpu_per_100k_soak"), 2, " s"), "", "", ""))
    cpu1, cpu10 = num(r, "cpu_per_100k_max_1"), num(r, "cpu_per_100k_max_10")
    rows.append(("(c) CPU seconds per 100,000 measurements: at max, 1 / 10 per request",
                 fmt(cpu1, 2, " s") + " / " + fmt(cpu10, 2, " s"),
                 "", "<= 1.7 s / <= 0.4 s",
                 verdict(cpu1 <= 1.7 and cpu10 <= 0.4 if cpu1 == cpu1 and cpu10 == cpu10 else None)))
    rows.append(("(d) peak RSS under load (VmHWM)",
                 fmt(num(r, "peak_rss_kb") / 1024, 1, " MiB"),
                 fmt(num(r, "nginx_peak_rss_kb") / 1024, 1, " MiB"), "", ""))
    growth = num(r, "idle_growth_kb") / 1024
    n_idle = r.get("idle_conns", "?")
    rows.append((f"(e) RSS growth with {n_idle} idle keep-alive connections",
                 fmt(growth, 1, " MiB") + f" ({r.get('idle_open', '?')} open)", "",
                 "<= 64 MiB for 10,000",
                 verdict((growth * 10000 / max(1.0, num(r, 'idle_conns', 1))) <= 64 if growth == growth else None)
                 + ("" if n_idle == "10000" else " (scaled to 10,000)")))
    v99 = num(r, "vis_p99_ms")
    rows.append((f"(f) 202 -> visible in ClickHouse, p50 / p99 ({r.get('vis_visible', '?')} of {r.get('vis_probes', '?')} probes)",
                 fmt(num(r, "vis_p50_ms"), 0, " ms") + " / " + fmt(v99, 0, " ms"), "",
                 "p99 <= 1.5 s", verdict(v99 <= 1500 if v99 == v99 else None)))
    ips = num(r, "soak_inserts_per_s")
    rows.append((f"(g) INSERT queries/s over {r.get('soak_secs', '?')} s at 70 % load; active parts after",
                 fmt(ips, 2, "/s") + f"; {r.get('soak_parts_r1', '?')} parts (replica 2: {r.get('soak_parts_r2', '?')})",
                 "", "<= 2 INSERT/s per collector", verdict(ips <= 2 if ips == ips else None)))
    return rows


def text_table(rows):
    head = ("figure", "collector", "nginx 204", "goal", "result")
    widths = [max(len(str(row[i])) for row in rows + [head]) for i in range(5)]
    line = lambda row: "  ".join(str(c).ljust(widths[i]) for i, c in enumerate(row)).rstrip()
    out = [line(head), line(["-" * w for w in widths])]
    out += [line(row) for row in rows]
    return "\n".join(out)


def md_table(rows):
    out = ["| figure | collector | nginx `return 204` | goal | result |",
           "| --- | --- | --- | --- | --- |"]
    for row in rows:
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |")
    return "\n".join(out)


def runs_table(r):
    out = ["| server | measurements/request | connections | requests/s | beacons/s | errors | core 0: server / interrupts / other processes | load generator (core 1) |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for key in sorted(k for k in r if k.startswith("run_")):
        d = dict(kv.split(":", 1) for kv in r[key].split(","))
        out.append(f"| {d['server']} | {d['batch']} | {d['conns']} | {fmt(float(d['rps']))} | "
                   f"{fmt(float(d['rps']) * int(d['batch']))} | {d['errors']} | "
                   f"{d.get('srv_pct', '?')} % / {d.get('irq_pct', '?')} % / {d.get('other_pct', '?')} % | {d['gen_cpu']} % |")
    return "\n".join(out)


def warnings_md(warnings, failovers):
    if not warnings.strip():
        return ""
    out = ["Most frequent collector warnings (count, line):", "", "```", warnings, "```"]
    if failovers.strip():
        out += ["", f"Replica switches at: {failovers.strip()}"]
    return "\n".join(out)


ANALYSIS_BEGIN = "<!-- analysis:begin (kept when bench.sh rewrites this file) -->"
ANALYSIS_END = "<!-- analysis:end -->"


def cmd_report(args):
    r = load_results(args.results)
    rows = figures(r)
    print(text_table(rows))
    if not args.doc:
        return 0
    kept, tail = "", "\n"
    if os.path.exists(args.out):
        with open(args.out) as f:
            old = f.read()
        if ANALYSIS_BEGIN in old and ANALYSIS_END in old:
            kept = old[old.index(ANALYSIS_BEGIN) + len(ANALYSIS_BEGIN):old.index(ANALYSIS_END)]
            # Notes added below the section by hand are kept too.
            tail = old[old.index(ANALYSIS_END) + len(ANALYSIS_END):] or "\n"
    if not kept.strip():
        kept = "\n_(No reading written yet: add it here; bench.sh keeps this section.)_\n"

    def read(name):
        path = os.path.join(args.dir, name)
        if not os.path.exists(path):
            return ""
        with open(path) as f:
            return f.read().rstrip()

    doc = f"""# Benchmarks: collector next to nginx

Generated by `scripts/bench.sh` (full run) on {r.get('date', '?')}. Re-run with
`scripts/bench.sh` (about 15 minutes; `scripts/bench.sh --quick` is the smoke test and
does not touch this file). Everything runs on loopback on one machine.

> **Noise.** Load average {r.get('loadavg_start', '?')} at the start, {r.get('loadavg_end', '?')}
> at the end (the benchmark's own servers and load generators count in it). What else ran on
> core 0 during each throughput run is in the last columns of the table below ("other
> processes"). The figures are one run, not a median of several; read them as orders of
> magnitude and ratios, not as a capacity plan. The machine is a virtual machine whose cores
> may be shared with other guests: nginx's own figures moved by up to 7 % between two full
> runs a quarter of an hour apart, and short side experiments have seen one collector build
> do 15,000 and 30,000 single beacons/s a minute apart.

## Machine and versions

| | |
| --- | --- |
| CPU | {r.get('cpu_model', '?')}, `nproc` = {r.get('nproc', '?')}{(', virtual machine (' + r['virt'] + ')') if r.get('virt') else ''} |
| RAM | {r.get('mem', '?')} |
| kernel | {r.get('kernel', '?')} |
| OS | {r.get('os', '?')} |
| collector | git {r.get('git_rev', '?')}, release build (`cargo build --release -p collector`) |
| ClickHouse | {r.get('clickhouse_version', '?')} (two replicas, one shard, ZooKeeper) |
| nginx | {r.get('nginx_version', '?')} |
| load generators | {r.get('wrk_version', '?')}; {r.get('oha_version', '?')} |
| profiler | {r.get('perf_version', 'none')} |

## Setup

- `scripts/stack.sh up DIR --replicas 2`: PostgreSQL 15, ZooKeeper and two ClickHouse
  replicas on loopback. **They are not pinned**: they run on whichever core the scheduler
  picks, so ClickHouse inserts and merges compete with both the server under test and the
  load generator, as they would on a small real host.
- `collector migrate`, then `collector sites add --key bench-NN` for {r.get('sites', '?')}
  sites (any origin, sample rate 1).
- **Server under test on core 0** (`taskset -c 0`): the collector (release build; the tokio
  request runtime then has one worker thread, plus the spool's threads (appender at nice +10, preparer, watchdog) and the
  writer's thread with its own runtime at nice +10, all on core 0) or
  nginx (one worker, `location / {{ return 204; }}`, access log off). **Load generator on
  core 1** (`taskset -c 1`).
- Collector settings: `COLLECTOR_CLIENT_RATE=0 COLLECTOR_SITE_RATE=0` (one load source must not
  be rate-limited), `COLLECTOR_SPOOL_MAX_BYTES=8589934592`, spool on the local disk (durable:
  every 202 waits for `fdatasync`, group commit), everything else at its default (batches,
  dedup window, the bound of 512 intake requests in flight: see docs/contract.md's settings table
  at the revision above).
- Beacons: `scripts/bench/beacon.lua` (wrk) and `bench.py bodies` (oha) build realistic
  measurements: {r.get('sites', '?')} sites, varied page URLs, referrers, user agents and metric
  values, `Content-Type: text/plain;charset=UTF-8` like `sendBeacon`, an `Origin` header, and
  an id that never repeats within the run (run nonce, thread, counter). nginx gets exactly the
  same requests.
- (a) `wrk -t1 -cC -d{r.get('tp_secs', '?')}s` at C = {r.get('tp_conns', '?')} connections, for
  1 and for 10 measurements per request, collector and nginx alternating; the best run with
  0 socket errors and 0 non-2xx answers counts; beacons/s = requests/s x measurements per
  request. Before each collector run the spool is left to drain, so each run starts clean.
- (b) oha {r.get('oha_version', '?').replace('oha ', '')} open loop: `oha -q RATE --latency-correction -c 64 -z
  {r.get('lat_secs', '?')}s`, with `-Z FILE` (one body per line). Stock oha picks `-Z` lines at
  random, which would repeat ids; bench.sh builds oha from its crates.io source with a
  one-line patch that takes the lines in order, and writes more lines than requests, so ids
  never repeat. Latency is measured from each request's scheduled send time (no coordinated
  omission).
- (c) utime+stime of the collector process (`/proc/PID/stat`) across a run, divided by the
  growth of `collector_measurements_accepted_total`. (d) `VmHWM` from `/proc/PID/status` after
  all load steps. (e) A fresh collector with `COLLECTOR_HEADER_TIMEOUT=120s`; `bench.py idle`
  opens the connections, sends one `GET /healthz` on each and keeps them open; growth =
  `VmRSS` with them open - `VmRSS` before.
- (f), (g): a {r.get('soak_secs', '?')} s run at {r.get('soak_target', '?')} beacons/s (70 %)
  with wrk pacing each of {r.get('soak_conns', '?')} connections (`delay()` of
  {r.get('soak_delay_ms', '?')} ms; achieved {r.get('soak_rate', '?')} beacons/s). Meanwhile
  `bench.py probes` sends probe beacons one at a time and polls replica 1 (the preferred one)
  every 20 ms with `SELECT count() FROM collector.measurements WHERE site = ... AND id = ...`;
  time to visibility = first poll that sees the row - the 202 (20 ms resolution). INSERTs/s =
  growth of `collector_clickhouse_inserts_total` / duration, checked against the
  `InsertQuery` event counter of the replicas ({r.get('soak_ch_insert_queries', '?')} INSERT
  queries counted by ClickHouse; `system.query_log`: {r.get('soak_query_log', '?')}).

Commands (as run; DIR is a temporary folder):

```
{read('commands.txt')}
```

## Figures

{md_table(rows)}

Every throughput run. Core 0 shares, in % of core 0 over the run: the server's own CPU time
(utime+stime), interrupt time (hard and soft IRQ, mostly loopback TCP, which no process is
charged for) and other processes (the stack, the other engineer's tests).

{runs_table(r)}

A load generator near 100 % of core 1 means that run measured wrk more than the server: read
such an nginx figure as a lower bound (which flatters the collector's ratio).

Collector health over the whole run: {r.get('health', '?')}

{warnings_md(read('collector-warnings.txt'), read('failover-times.txt'))}

## Where the time goes

{read('profile.md') or '_No profile: perf was not usable on this machine._'}

{ANALYSIS_BEGIN}{kept}{ANALYSIS_END}{tail}"""
    with open(args.out, "w") as f:
        f.write(doc)
    print(f"\nwrote {args.out}")
    return 0


ABLATION_GOALS = {"no_append": 0.6, "nginx": 0.35}
# CPU seconds per 100,000 single beacons, at most (issue 28).
ABLATION_CPU_GOAL = 1.8


def parse_kv(text):
    """`a:1,b:x` -> {"a": "1", "b": "x"}."""
    return dict(part.split(":", 1) for part in text.split(",") if ":" in part)


def cmd_ablation(args):
    """The ablation's table: each variant's runs, its best, the ratios and the goals."""
    r = load_results(args.results)
    names = {"main": "main (durable append)", "no_append": "main without the append (bench-no-append)",
             "nginx": "nginx `return 204`"}
    best = {v: parse_kv(r.get(f"abl_best_{v}", "")) for v in names}
    rps = {v: float(best[v].get("rps", "nan") or "nan") for v in names}
    runs = sorted(k for k in r if k.startswith("abl_run_"))
    conns = sorted({int(k.split("_")[3]) for k in runs})
    rounds = int(r.get("abl_rounds", "1"))
    head = ["variant"] + [f"c={c} round {i}" for c in conns for i in range(1, rounds + 1)] + \
        ["best req/s", "core µs per request (best run)", "CPU s per 100k beacons (best run)"]
    rows = []
    for v, name in names.items():
        cells = [name]
        for c in conns:
            for i in range(1, rounds + 1):
                run = parse_kv(r.get(f"abl_run_{i}_{c}_{v}", ""))
                err = run.get("errors", "?")
                cells.append(f"{float(run.get('rps', 'nan')):,.0f}" + ("" if err == "0" else f" ({err} errors)"))
        cells += [fmt(rps[v]), best[v].get("us", "-"), best[v].get("cpu100k", "-")]
        rows.append(cells)
    table = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    table += ["| " + " | ".join(row) + " |" for row in rows]
    cpu = float(best["main"].get("cpu100k", "nan"))
    p99, p99n = num(r, "abl_lat_collector_p99_ms"), num(r, "abl_lat_nginx_p99_ms")
    goals = []
    for v, goal in ABLATION_GOALS.items():
        ratio = rps["main"] / rps[v] if rps[v] > 0 else float("nan")
        goals.append(f"| main / {names[v]} | {ratio:.2f}× | ≥ {goal}× | {verdict(ratio >= goal)} |")
    goals.append(f"| CPU per 100,000 single beacons (main) | {cpu:.2f} s | ≤ {ABLATION_CPU_GOAL} s | "
                 f"{verdict(cpu <= ABLATION_CPU_GOAL)} |")
    goals.append(f"| p99 at {r.get('abl_lat_rate', '?')} req/s (70 % of main's best), open loop | "
                 f"{fmt(p99, 2, ' ms')} (nginx at the same rate: {fmt(p99n, 2, ' ms')}; p99.9 "
                 f"{fmt(num(r, 'abl_lat_collector_p999_ms'), 2, ' ms')} / {fmt(num(r, 'abl_lat_nginx_p999_ms'), 2, ' ms')}; "
                 f"errors {r.get('abl_lat_collector_errors', '?')} / {r.get('abl_lat_nginx_errors', '?')}) | reported | - |")
    text = "\n".join(table) + "\n\n| figure | measured | goal | |\n| --- | --- | --- | --- |\n" + "\n".join(goals) + "\n"
    print(text)
    if not args.out or args.out == "/dev/null":
        return 0
    prof = ""
    if args.profile and os.path.exists(args.profile):
        with open(args.profile) as f:
            prof = f.read().rstrip()
    section = f"""Generated by `scripts/bench.sh --ablation` on {r.get('date', '?')}, git {r.get('git_rev', '?')},
{r.get('cpu_model', '?')} (`nproc` = {r.get('nproc', '?')}), kernel {r.get('kernel', '?')}; load average
{r.get('loadavg_start', '?')} at the start, {r.get('loadavg_end', '?')} at the end. The server under test on core 0, `wrk -t1`
with `scripts/bench/beacon.lua` (one beacon per request, unique ids) on core 1, {r.get('tp_secs', '?')} s per run,
the three variants interleaved; a run with any error or non-202 does not count as best. Core µs per
request = the server's utime+stime over the run / requests answered. Two collectors run side by
side (each idle while the other is measured), with their own spools on the local ext4 disk.

{text}
<details><summary>Profile of main at its best connection count</summary>

{prof or '_No profile: perf was not usable._'}

</details>
"""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from storage import write_doc  # the one writer of a marked section of docs/benchmarks.md
    write_doc(args.out, section, "ablation")
    print(f"wrote the ablation section of {args.out}")
    return 0



def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bodies")
    b.add_argument("out")
    b.add_argument("n", type=int)
    b.add_argument("nonce")
    b.add_argument("sites", type=int)
    m = sub.add_parser("metrics")
    m.add_argument("url")
    pr = sub.add_parser("proc")
    pr.add_argument("pids", nargs="+")
    sub.add_parser("core0")
    q = sub.add_parser("probes")
    q.add_argument("--host", default="127.0.0.1")
    q.add_argument("--port", type=int, required=True)
    q.add_argument("--clickhouse", required=True, help="http://127.0.0.1:PORT of replica 1")
    q.add_argument("--database", default="collector")
    q.add_argument("--count", type=int, default=200)
    q.add_argument("--seconds", type=float, default=280, help="send no probe after this")
    q.add_argument("--sites", type=int, default=20)
    q.add_argument("--interval", type=float, default=0.02)
    q.add_argument("--timeout", type=float, default=30)
    q.add_argument("--out", required=True)
    i = sub.add_parser("idle")
    i.add_argument("--host", default="127.0.0.1")
    i.add_argument("--port", type=int, required=True)
    i.add_argument("--count", type=int, default=10000)
    i.add_argument("--hold", type=float, default=120)
    i.add_argument("--ready", required=True)
    o = sub.add_parser("oha")
    o.add_argument("file")
    j = sub.add_parser("json-kv")
    j.add_argument("file")
    j.add_argument("prefix", nargs="?", default="")
    pf = sub.add_parser("profile")
    pf.add_argument("data")
    pf.add_argument("out")
    pf.add_argument("note", nargs="?", default="")
    pf.add_argument("--top", type=int, default=25)
    rp = sub.add_parser("report")
    rp.add_argument("results")
    rp.add_argument("out")
    rp.add_argument("--doc", action="store_true")
    rp.add_argument("--dir", default=".", help="folder with commands.txt and profile.md")
    ab = sub.add_parser("ablation")
    ab.add_argument("results")
    ab.add_argument("out")
    ab.add_argument("--profile", default="")
    args = p.parse_args()
    return {
        "bodies": cmd_bodies, "metrics": cmd_metrics,
        "proc": cmd_proc, "probes": cmd_probes,
        "idle": cmd_idle, "report": cmd_report, "oha": cmd_oha, "json-kv": cmd_json_kv,
        "profile": cmd_profile, "core0": cmd_core0, "ablation": cmd_ablation,
    }[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
