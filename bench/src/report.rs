//! The results as tables: the main table (printed, and in docs/benchmarks.md), the runs
//! table, the ablation's table, the full run's document, and marked sections of it.

use std::path::Path;

use crate::error::{Context, Result};
use crate::results::{parse_kv, Results};

/// Marks the hand-written reading that a full run keeps when it rewrites the document.
pub const ANALYSIS_BEGIN: &str = "<!-- analysis:begin (kept when bench.sh rewrites this file) -->";
/// Its end; everything after it is kept too.
pub const ANALYSIS_END: &str = "<!-- analysis:end -->";
/// The full run's document around the tables (`@key@` placeholders).
const TEMPLATE: &str = include_str!("benchmarks.md.in");

/// `x` with `digits` decimals, thousands grouped by commas, then `unit`; "n/a" for NaN.
pub fn fmt(x: f64, digits: usize, unit: &str) -> String {
    if x.is_nan() {
        return "n/a".into();
    }
    let text = format!("{:.*}", digits, x.abs());
    let (int, frac) = text
        .split_once('.')
        .map_or((text.as_str(), ""), |(i, f)| (i, f));
    let mut grouped = String::new();
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    let sign = if x < 0.0 && text.chars().any(|c| c.is_ascii_digit() && c != '0') {
        "-"
    } else {
        ""
    };
    let frac = if frac.is_empty() {
        String::new()
    } else {
        format!(".{frac}")
    };
    format!("{sign}{grouped}{frac}{unit}")
}

/// "met", "NOT met", or "not measured" (None).
pub fn verdict(ok: Option<bool>) -> &'static str {
    match ok {
        None => "not measured",
        Some(true) => "met",
        Some(false) => "NOT met",
    }
}

fn known(x: f64) -> Option<f64> {
    (!x.is_nan()).then_some(x)
}

/// One row of the main table: figure, collector, nginx, goal, result.
pub type Row = [String; 5];

/// The rows of the main table, from a run's results.
pub fn figures(r: &Results) -> Vec<Row> {
    let mut rows = throughput_rows(r);
    let lat = |who: &str, p: &str| fmt(r.num(&format!("lat_{who}_{p}_ms")), 2, " ms");
    let (p99, n99) = (r.num("lat_collector_p99_ms"), r.num("lat_nginx_p99_ms"));
    rows.push([
        format!(
            "(b) latency p50 / p99 / p99.9 at {} req/s (70 % of collector max), open loop",
            r.get("lat_rate")
        ),
        format!(
            "{} / {} / {}",
            lat("collector", "p50"),
            lat("collector", "p99"),
            lat("collector", "p999")
        ),
        format!(
            "{} / {} / {}",
            lat("nginx", "p50"),
            lat("nginx", "p99"),
            lat("nginx", "p999")
        ),
        "p99 <= 3 x nginx's p99".into(),
        format!(
            "{} x nginx: {}",
            fmt(p99 / n99, 1, ""),
            verdict(known(p99 + n99).map(|_| p99 <= 3.0 * n99))
        ),
    ]);
    rows.extend(wide_latency_rows(r));
    rows.push([
        "(c) CPU seconds per 100,000 measurements: at 70 % load (1/request)".into(),
        fmt(r.num("cpu_per_100k_soak"), 2, " s"),
        String::new(),
        String::new(),
        String::new(),
    ]);
    let (cpu1, cpu10) = (r.num("cpu_per_100k_max_1"), r.num("cpu_per_100k_max_10"));
    rows.push([
        "(c) CPU seconds per 100,000 measurements: at max, 1 / 10 per request".into(),
        format!("{} / {}", fmt(cpu1, 2, " s"), fmt(cpu10, 2, " s")),
        String::new(),
        "<= 1.7 s / <= 0.4 s".into(),
        verdict(known(cpu1 + cpu10).map(|_| cpu1 <= 1.7 && cpu10 <= 0.4)).into(),
    ]);
    rows.push([
        "(d) peak RSS under load (VmHWM)".into(),
        fmt(r.num("peak_rss_kb") / 1024.0, 1, " MiB"),
        fmt(r.num("nginx_peak_rss_kb") / 1024.0, 1, " MiB"),
        String::new(),
        String::new(),
    ]);
    rows.extend(soak_rows(r));
    rows
}

/// The second latency run (more connections, [`crate::WIDE_CONNS`]) against issue
/// 53's goal, and the syncs of both runs beside them (a sync stall must not stall intake
/// longer than the stall itself).
fn wide_latency_rows(r: &Results) -> Vec<Row> {
    let lat = |who: &str, p: &str| fmt(r.num(&format!("latwide_{who}_{p}_ms")), 2, " ms");
    let p99 = r.num("latwide_collector_p99_ms");
    let syncs = |key: &str| {
        let kv = parse_kv(r.get(key));
        let s = |k: &str| kv.get(k).copied().unwrap_or("-").to_owned();
        format!(
            "{}: p50 <= {} ms, p99 <= {} ms, max <= {} ms",
            s("count"),
            s("p50"),
            s("p99"),
            s("max")
        )
    };
    vec![
        [
            format!(
                "(b) latency p50 / p99 / p99.9 at {} req/s (70 % of the collector's best over {1}) over {1} connections",
                r.get("latwide_rate"),
                r.get("latwide_conns"),
            ),
            format!(
                "{} / {} / {} (max {})",
                lat("collector", "p50"),
                lat("collector", "p99"),
                lat("collector", "p999"),
                lat("collector", "max")
            ),
            format!(
                "{} / {} / {}",
                lat("nginx", "p50"),
                lat("nginx", "p99"),
                lat("nginx", "p999")
            ),
            "p99 <= 25 ms (issue 53)".into(),
            verdict(known(p99).map(|p| p <= 25.0)).into(),
        ],
        [
            "(b) syncs during the two latency runs (`collector_spool_sync_duration_seconds`, bucket bounds)".into(),
            format!(
                "{}; {}",
                syncs("lat_collector_syncs"),
                syncs("latwide_collector_syncs")
            ),
            String::new(),
            String::new(),
            String::new(),
        ],
    ]
}

fn throughput_rows(r: &Results) -> Vec<Row> {
    [(1, "35", 0.35), (10, "50", 0.50)]
        .iter()
        .map(|&(batch, pct, goal)| {
            let c = r.num(&format!("tp_collector_{batch}_beacons"));
            let n = r.num(&format!("tp_nginx_{batch}_beacons"));
            let ratio = if n > 0.0 { c / n } else { f64::NAN };
            let conns = |who: &str| format!(" (c={})", r.get(&format!("tp_{who}_{batch}_conns")));
            let plural = if batch == 1 {
                "beacon/request"
            } else {
                "beacons/request"
            };
            [
                format!("(a) max throughput, {batch} {plural}, beacons/s, 0 errors"),
                fmt(c, 0, "") + &conns("collector"),
                fmt(n, 0, "") + &conns("nginx"),
                format!("collector >= {pct} % of nginx"),
                format!(
                    "{} % of nginx: {}",
                    fmt(ratio * 100.0, 1, ""),
                    verdict(known(ratio).map(|x| x >= goal))
                ),
            ]
        })
        .collect()
}

fn soak_rows(r: &Results) -> Vec<Row> {
    let growth = r.num("idle_growth_kb") / 1024.0;
    let n_idle = r.get("idle_conns");
    let idle_n = known(r.num("idle_conns")).unwrap_or(1.0).max(1.0);
    let v99 = r.num("vis_p99_ms");
    let ips = r.num("soak_inserts_per_s");
    vec![
        [
            format!("(e) RSS growth with {n_idle} idle keep-alive connections"),
            format!("{} ({} open)", fmt(growth, 1, " MiB"), r.get("idle_open")),
            String::new(),
            "<= 64 MiB for 10,000".into(),
            format!(
                "{}{}",
                verdict(known(growth).map(|g| g * 10000.0 / idle_n <= 64.0)),
                if n_idle == "10000" {
                    ""
                } else {
                    " (scaled to 10,000)"
                }
            ),
        ],
        [
            format!(
                "(f) 202 -> visible in ClickHouse, p50 / p99 ({} of {} probes)",
                r.get("vis_visible"),
                r.get("vis_probes")
            ),
            format!(
                "{} / {}",
                fmt(r.num("vis_p50_ms"), 0, " ms"),
                fmt(v99, 0, " ms")
            ),
            String::new(),
            "p99 <= 1.5 s".into(),
            verdict(known(v99).map(|v| v <= 1500.0)).into(),
        ],
        [
            format!(
                "(g) INSERT queries/s over {} s at 70 % load; active parts after",
                r.get("soak_secs")
            ),
            format!(
                "{}; {} parts (replica 2: {})",
                fmt(ips, 2, "/s"),
                r.get("soak_parts_r1"),
                r.get("soak_parts_r2")
            ),
            String::new(),
            "<= 2 INSERT/s per collector".into(),
            verdict(known(ips).map(|i| i <= 2.0)).into(),
        ],
    ]
}

/// The main table as aligned text (what a run prints).
pub fn text_table(rows: &[Row]) -> String {
    let head: Row = ["figure", "collector", "nginx 204", "goal", "result"].map(String::from);
    let width = |i: usize| {
        rows.iter()
            .chain([&head])
            .map(|r| r[i].chars().count())
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..5).map(width).collect();
    let line = |row: &Row| {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        cells.join("  ").trim_end().to_owned()
    };
    let rule: Row = widths
        .iter()
        .map(|w| "-".repeat(*w))
        .collect::<Vec<_>>()
        .try_into()
        .unwrap_or_default();
    let mut out = vec![line(&head), line(&rule)];
    out.extend(rows.iter().map(line));
    out.join("\n")
}

/// The main table in Markdown.
pub fn md_table(rows: &[Row]) -> String {
    let mut out = vec![
        "| figure | collector | nginx `return 204` | goal | result |".to_owned(),
        "| --- | --- | --- | --- | --- |".to_owned(),
    ];
    for row in rows {
        let cells: Vec<String> = row.iter().map(|c| c.replace('|', "\\|")).collect();
        out.push(format!("| {} |", cells.join(" | ")));
    }
    out.join("\n")
}

/// Every throughput run (`run_NN` records) in Markdown.
pub fn runs_table(r: &Results) -> String {
    let mut out = vec![
        "| server | measurements/request | connections | requests/s | beacons/s | errors | core 0: server / interrupts / other processes | load generator (core 1) |".to_owned(),
        "| --- | --- | --- | --- | --- | --- | --- | --- |".to_owned(),
    ];
    for (_, v) in r.with_prefix("run_") {
        let d = parse_kv(v);
        let g = |k: &str| d.get(k).copied().unwrap_or("?");
        let rps: f64 = g("rps").parse().unwrap_or(f64::NAN);
        let batch: f64 = g("batch").parse().unwrap_or(f64::NAN);
        out.push(format!(
            "| {} | {} | {} | {} | {} | {} | {} % / {} % / {} % | {} % |",
            g("server"),
            g("batch"),
            g("conns"),
            fmt(rps, 0, ""),
            fmt(rps * batch, 0, ""),
            g("errors"),
            g("srv_pct"),
            g("irq_pct"),
            g("other_pct"),
            g("gen_cpu")
        ));
    }
    out.join("\n")
}

fn warnings_md(warnings: &str, failovers: &str) -> String {
    if warnings.trim().is_empty() {
        return String::new();
    }
    let mut out =
        format!("Most frequent collector warnings (count, line):\n\n```\n{warnings}\n```");
    if !failovers.trim().is_empty() {
        out += &format!("\n\nReplica switches at: {}", failovers.trim());
    }
    out
}

/// `@key@` in `template` replaced by `value(key)`, in one pass (values are not rescanned).
pub fn fill(template: &str, value: impl Fn(&str) -> String) -> String {
    let re = regex::Regex::new(r"@([a-z0-9_]+)@").expect("a valid pattern");
    re.replace_all(template, |c: &regex::Captures| value(&c[1]))
        .into_owned()
}

/// The full run's document: the template filled from `r` and the files of `logs`
/// (commands.txt, profile.md, collector-warnings.txt, failover-times.txt), with the reading
/// between the analysis markers of `old` (and what follows it) kept.
pub fn document(r: &Results, logs: &Path, old: &str) -> String {
    let read = |name: &str| {
        std::fs::read_to_string(logs.join(name))
            .map(|t| t.trim_end().to_owned())
            .unwrap_or_default()
    };
    let rows = figures(r);
    let body = fill(TEMPLATE, |key| match key {
        "virt" => r
            .opt("virt")
            .filter(|v| !v.is_empty())
            .map(|v| format!(", virtual machine ({v})"))
            .unwrap_or_default(),
        "perf_version" => r.opt("perf_version").unwrap_or("none").to_owned(),
        "oha_bare" => r.get("oha_version").trim_start_matches("oha ").to_owned(),
        "commands" => read("commands.txt"),
        "figures" => md_table(&rows),
        "runs" => runs_table(r),
        "warnings" => warnings_md(&read("collector-warnings.txt"), &read("failover-times.txt")),
        "profile" => Some(read("profile.md"))
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "_No profile: perf was not usable on this machine._".into()),
        other => r.get(other).to_owned(),
    });
    let (mut kept, mut tail) = (String::new(), "\n".to_owned());
    if let (Some(b), Some(e)) = (old.find(ANALYSIS_BEGIN), old.find(ANALYSIS_END)) {
        kept = old[b + ANALYSIS_BEGIN.len()..e].to_owned();
        let after = &old[e + ANALYSIS_END.len()..];
        tail = if after.is_empty() {
            "\n".into()
        } else {
            after.to_owned()
        };
    }
    if kept.trim().is_empty() {
        kept = "\n_(No reading written yet: add it here; bench.sh keeps this section.)_\n".into();
    }
    format!(
        "{}\n\n{ANALYSIS_BEGIN}{kept}{ANALYSIS_END}{tail}",
        body.trim_end()
    )
}

/// Writes `text` into `path` between `<!-- MARKER:begin -->` and `<!-- MARKER:end -->`
/// (appended when absent), keeping the rest.
pub fn write_section(path: &Path, text: &str, marker: &str) -> Result<()> {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    std::fs::write(path, replace_section(&old, text, marker))
        .context(|| format!("writing {}", path.display()))
}

/// `old` with the section `marker` holding `text`.
pub fn replace_section(old: &str, text: &str, marker: &str) -> String {
    let (begin, end) = (
        format!("<!-- {marker}:begin -->"),
        format!("<!-- {marker}:end -->"),
    );
    let block = format!("{begin}\n{text}{end}");
    match (old.find(&begin), old.find(&end)) {
        (Some(b), Some(e)) if b < e => format!("{}{block}{}", &old[..b], &old[e + end.len()..]),
        _ => format!("{}\n\n{block}\n", old.trim_end_matches('\n')),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The results of a --quick run (DIR/results), trimmed to what the table reads.
    const QUICK: &str = "tp_collector_1_beacons=12211.3\ntp_collector_1_conns=32\ntp_nginx_1_beacons=31555.0\ntp_nginx_1_conns=32
tp_collector_10_beacons=48101.0\ntp_collector_10_conns=32\ntp_nginx_10_beacons=30100.7\ntp_nginx_10_conns=32
lat_rate=8547\nlat_collector_p50_ms=1.021\nlat_collector_p99_ms=4.410\nlat_collector_p999_ms=12.005
lat_nginx_p50_ms=0.310\nlat_nginx_p99_ms=0.902\nlat_nginx_p999_ms=2.300\ncpu_per_100k_soak=1.62
latwide_conns=256\nlatwide_rate=7000\nlatwide_collector_p50_ms=1.100\nlatwide_collector_p99_ms=27.250\nlatwide_collector_p999_ms=31.000
latwide_collector_max_ms=33.400\nlatwide_nginx_p50_ms=0.300\nlatwide_nginx_p99_ms=0.950\nlatwide_nginx_p999_ms=2.100
lat_collector_syncs=count:9000,p50:0.8,p99:3.2,max:51.2\nlatwide_collector_syncs=count:8800,p50:0.8,p99:1.6,max:25.6
cpu_per_100k_max_1=1.55\ncpu_per_100k_max_10=0.31\npeak_rss_kb=41236\nnginx_peak_rss_kb=9216
idle_conns=200\nidle_open=200\nidle_growth_kb=512\nvis_probes=10\nvis_visible=10\nvis_p50_ms=260.0\nvis_p99_ms=480.0
soak_secs=15\nsoak_inserts_per_s=1.20\nsoak_parts_r1=6\nsoak_parts_r2=6
run_01=server:collector,batch:1,conns:32,rps:12211.3,errors:0,gen_cpu:41,srv_pct:97,irq_pct:2,other_pct:1\n";

    #[test]
    fn numbers_grouped() {
        assert_eq!(fmt(12211.3, 0, ""), "12,211");
        assert_eq!(fmt(1234567.891, 2, " s"), "1,234,567.89 s");
        assert_eq!(fmt(999.0, 1, ""), "999.0");
        assert_eq!(fmt(-1234.0, 0, ""), "-1,234");
        assert_eq!(fmt(f64::NAN, 2, " ms"), "n/a");
    }

    #[test]
    fn main_table_rows() {
        let rows = figures(&Results::from_lines(QUICK));
        assert_eq!(rows.len(), 11);
        assert_eq!(rows[0][1], "12,211 (c=32)");
        assert_eq!(rows[0][4], "38.7 % of nginx: met");
        assert_eq!(rows[1][4], "159.8 % of nginx: met");
        assert_eq!(
            rows[2][0],
            "(b) latency p50 / p99 / p99.9 at 8547 req/s (70 % of collector max), open loop"
        );
        assert_eq!(rows[2][1], "1.02 ms / 4.41 ms / 12.01 ms");
        assert_eq!(rows[2][4], "4.9 x nginx: NOT met");
        assert_eq!(
            rows[3][0],
            "(b) latency p50 / p99 / p99.9 at 7000 req/s (70 % of the collector's best over 256) over 256 connections"
        );
        assert_eq!(rows[3][1], "1.10 ms / 27.25 ms / 31.00 ms (max 33.40 ms)");
        assert_eq!(rows[3][4], "NOT met");
        assert_eq!(
            rows[4][1],
            "9000: p50 <= 0.8 ms, p99 <= 3.2 ms, max <= 51.2 ms; 8800: p50 <= 0.8 ms, p99 <= 1.6 ms, max <= 25.6 ms"
        );
        assert_eq!(rows[6][4], "met");
        assert_eq!(rows[7][1], "40.3 MiB");
        assert_eq!(rows[8][4], "met (scaled to 10,000)");
        assert_eq!(rows[9][1], "260 ms / 480 ms");
        assert_eq!(rows[10][1], "1.20/s; 6 parts (replica 2: 6)");
        let md = md_table(&rows);
        assert!(
            md.starts_with("| figure | collector | nginx `return 204` | goal | result |\n| --- |")
        );
        assert!(md.contains("| (d) peak RSS under load (VmHWM) | 40.3 MiB | 9.0 MiB |  |  |"));
        let text = text_table(&rows);
        assert!(text.lines().nth(1).unwrap().starts_with("------"));
        assert!(runs_table(&Results::from_lines(QUICK))
            .contains("| collector | 1 | 32 | 12,211 | 12,211 | 0 | 97 % / 2 % / 1 % | 41 % |"));
    }

    #[test]
    fn unmeasured_is_said() {
        let rows = figures(&Results::from_lines(""));
        assert_eq!(rows[0][4], "n/a % of nginx: not measured");
        assert_eq!(rows[3][4], "not measured");
        assert_eq!(rows[9][4], "not measured");
    }

    #[test]
    fn sections_replaced_or_appended() {
        let doc = "a\n<!-- s:begin -->\nold\n<!-- s:end -->\nb\n";
        assert_eq!(
            replace_section(doc, "new\n", "s"),
            "a\n<!-- s:begin -->\nnew\n<!-- s:end -->\nb\n"
        );
        assert_eq!(
            replace_section("a\n", "new\n", "t"),
            "a\n\n<!-- t:begin -->\nnew\n<!-- t:end -->\n"
        );
    }

    #[test]
    fn reading_kept() {
        let old = format!("x\n{ANALYSIS_BEGIN}\nmine\n{ANALYSIS_END}\n\nbelow\n");
        let doc = document(&Results::from_lines(QUICK), Path::new("/nonexistent"), &old);
        assert!(doc.starts_with("# Benchmarks: collector next to nginx\n"));
        assert!(doc.ends_with(&format!(
            "{ANALYSIS_BEGIN}\nmine\n{ANALYSIS_END}\n\nbelow\n"
        )));
        assert!(doc.contains("_No profile: perf was not usable on this machine._"));
        assert!(!doc.contains('@'), "every placeholder filled");
    }
}
