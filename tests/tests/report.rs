//! `collector report` (contract v4 §1, issue 40) against real servers: 1,000 known rows of a shop
//! (phones, desktops, tablets and bots, a third sampled at 0.5, metrics left NULL as engines
//! that cannot measure them leave them, a hostile browser name) written straight into the
//! `measurements` table of the 18.16 replicas and of the 26.x single server. Per device type the
//! report must answer what the test works out itself: page views and shares weighted by
//! `1 / sample_rate` computed here from the rows, and p75s within 2 % of
//! `quantileExactWeighted` asked of the server independently (and of the same weighted p75
//! computed here). A metric measured by fewer than 100 rows in a group (contract v5 §1: the
//! tablets' LCP, INP and TTFB here) must read "not enough data": no p75, no shares. The HTML page is opened in headless Chromium, which must load nothing, and
//! its screenshot saved to `target/report-screenshot.png`.

use collector_tests::common;

use std::collections::BTreeMap;

use common::browser::static_report_page;
use common::*;
use serde_json::{json, Value};

const SITE: &str = "shop";
const DAY: i64 = 86_400;
/// The hostile browser name some desktop rows carry: it must reach the page as text.
const HOSTILE: &str = "<script>alert('x')</script>";

/// One row the test writes: device type, browser, sample rate, age in seconds, metrics in
/// [`METRICS`]' order (`None`: not measured).
#[derive(Debug, Clone)]
struct Row {
    device: &'static str,
    browser: &'static str,
    rate: f64,
    age: i64,
    metrics: [Option<f64>; 5],
}

/// A small deterministic generator (Knuth's MMIX LCG): the same rows on every run.
struct Lcg(u64);

impl Lcg {
    /// A value in `[lo, hi)`, rounded to `step`.
    fn next(&mut self, lo: f64, hi: f64, step: f64) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let unit = (self.0 >> 11) as f64 / (1u64 << 53) as f64;
        ((lo + unit * (hi - lo)) / step).round() * step
    }
}

/// The 1,000 rows within the last 7 days: 40 % phones, 30 % desktops, 10 % tablets, 10 %
/// unknown devices, 10 % bots; every third row sampled at 0.5; INP missing on a fifth, LCP on
/// a seventh, TTFB on an eleventh, CLS on every tablet (an engine that cannot measure it) and
/// on a quarter of the rest.
fn rows() -> Vec<Row> {
    let mut rng = Lcg(40);
    (0..1000)
        .map(|i| {
            let device = match i % 10 {
                0..=3 => "mobile",
                4..=6 => "desktop",
                7 => "tablet",
                8 => "unknown",
                _ => "bot",
            };
            let browser = match (device, i % 3) {
                ("desktop", 0) => HOSTILE,
                ("desktop", _) => "Chrome",
                ("mobile", _) => "Chrome Mobile",
                _ => "Mobile Safari",
            };
            let mut some = |gap: usize, lo: f64, hi: f64, step: f64| {
                let v = rng.next(lo, hi, step);
                (i % gap != 0).then_some(v)
            };
            let metrics = [
                some(7, 400.0, 6000.0, 1.0),
                some(5, 16.0, 900.0, 8.0),
                some(4, 0.0, 0.45, 0.001).filter(|_| device != "tablet"),
                some(1000, 300.0, 4200.0, 1.0),
                some(11, 40.0, 2600.0, 0.5),
            ];
            Row {
                device,
                browser,
                rate: if i % 3 == 0 { 0.5 } else { 1.0 },
                age: 3600 + (i as i64 * 2999) % (6 * DAY),
                metrics,
            }
        })
        .collect()
}

/// `YYYY-MM-DD hh:mm:ss` of Unix seconds, UTC.
fn utc_time(secs: i64) -> String {
    let s = secs.rem_euclid(DAY);
    format!(
        "{} {:02}:{:02}:{:02}",
        utc_date(secs),
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

/// The page group of a row of `device` (v4: `--by page_group`): phones' rows are of the
/// product pages, desktops' of the home page, the others' of categories.
fn page_group(device: &str) -> &'static str {
    match device {
        "mobile" => "product",
        "desktop" => "/",
        _ => "category",
    }
}

/// `--by page_group` groups the same rows as `--by device_type`, by their page group: each
/// group's measurements and page views are those of its devices.
fn check_by_page_group(env: &TestEnv<'_>, by_device: &Value) {
    let out = env.cli(&[
        "report",
        "--site",
        SITE,
        "--by",
        "page_group",
        "--format",
        "json",
    ]);
    out.success();
    let report: Value =
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout));
    assert_eq!(field(&report, "by"), "page_group");
    let sums = |r: &Value, group_of: &dyn Fn(&str) -> String| {
        let mut sums = std::collections::BTreeMap::<String, (f64, f64)>::new();
        for g in field(r, "groups").as_array().expect("groups is a list") {
            let name = group_of(field(g, "group").as_str().unwrap());
            let e = sums.entry(name).or_default();
            e.0 += as_number(field(g, "measurements")).unwrap();
            e.1 += as_number(field(g, "page_views")).unwrap();
        }
        sums
    };
    let got = sums(&report, &|g| g.to_owned());
    let want = sums(by_device, &|d| page_group(d).to_owned());
    assert_eq!(got.keys().collect::<Vec<_>>(), ["/", "category", "product"]);
    for (group, (measurements, views)) in &want {
        let (m, v) = got[group];
        assert_eq!(m, *measurements, "{group}");
        assert!(
            (v - views).abs() < 1e-6,
            "{group}: {v} page views, not {views}"
        );
    }
}

/// `row` as a line of JSONEachRow for `site`, its page view `row.age` seconds before `now`.
/// Every column is given: 18.16 fills an omitted one with its type's zero, not its DEFAULT.
fn json_row(site: &str, row: &Row, now: i64) -> String {
    let at = now - row.age;
    let mut v = json!({
        "id": uuid::Uuid::new_v4().to_string(), "site": site, "url": "https://shop.example/",
        "received_at": utc_time(at), "ts": at * 1000, "page_view_at": utc_time(at),
        "user_agent": "", "sample_rate": row.rate, "device_type": row.device,
        "browser": row.browser, "browser_version": "", "os": "", "country": "",
        "page_group": page_group(row.device),
    });
    for ((_, column, ..), value) in METRICS.iter().zip(row.metrics) {
        v[*column] = json!(value);
    }
    v.to_string()
}

/// Writes the rows, five rows of the shop older than the range (numbers that would show if they
/// counted) and three of another site, into `env`'s first ClickHouse server.
async fn insert(env: &TestEnv<'_>, rows: &[Row], now: i64) {
    let mut lines: Vec<String> = rows.iter().map(|r| json_row(SITE, r, now)).collect();
    let mut outlier = rows[1].clone();
    outlier.metrics = [
        Some(60_000.0),
        Some(9000.0),
        Some(9.0),
        Some(60_000.0),
        Some(9000.0),
    ];
    for _ in 0..5 {
        lines.push(json_row(
            SITE,
            &Row {
                age: 10 * DAY,
                ..outlier.clone()
            },
            now,
        ));
    }
    for _ in 0..3 {
        lines.push(json_row(
            "another-shop",
            &Row {
                age: 60,
                ..outlier.clone()
            },
            now,
        ));
    }
    let sql = format!(
        "INSERT INTO {}.measurements FORMAT JSONEachRow\n{}",
        env.db,
        lines.join("\n")
    );
    env.exec(0, &sql).await;
}

/// Figures of one metric in one group, worked out here.
#[derive(Debug, Default)]
struct Expected {
    measured: u64,
    measured_views: f64,
    good: f64,
    poor: f64,
    /// `(value, weight)` pairs, weights as the query rounds them (`round(1000 / rate)`).
    values: Vec<(f64, u64)>,
}

impl Expected {
    /// The weighted p75 as ClickHouse's `quantileExactWeighted` defines it: the smallest value
    /// whose cumulative weight reaches `ceil(0.75 * total)`.
    fn p75(&self) -> Option<f64> {
        let mut sorted = self.values.clone();
        sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total: u64 = sorted.iter().map(|v| v.1).sum();
        let threshold = (0.75 * total as f64).ceil() as u64;
        let mut acc = 0;
        sorted.into_iter().find_map(|(v, w)| {
            acc += w;
            (acc >= threshold).then_some(v)
        })
    }
}

/// Per device type: measurements, page views and each metric's figures.
type Want = BTreeMap<&'static str, (u64, f64, Vec<Expected>)>;
/// Per device type and metric, the server's `(quantileExactWeighted, quantileExact)`.
type ServerP75s = BTreeMap<String, Vec<(Option<f64>, Option<f64>)>>;

/// Per device type (bots left out): measurements, page views and each metric's figures.
fn expected(rows: &[Row]) -> Want {
    let mut out = Want::new();
    for row in rows.iter().filter(|r| r.device != "bot") {
        let e = out.entry(row.device).or_insert_with(|| {
            (
                0,
                0.0,
                METRICS.iter().map(|_| Expected::default()).collect(),
            )
        });
        let w = 1.0 / row.rate;
        e.0 += 1;
        e.1 += w;
        for ((_, _, good, poor), (x, value)) in METRICS.iter().zip(e.2.iter_mut().zip(row.metrics))
        {
            let Some(v) = value else { continue };
            x.measured += 1;
            x.measured_views += w;
            x.good += if v <= *good { w } else { 0.0 };
            x.poor += if v > *poor { w } else { 0.0 };
            x.values.push((v, (1000.0 / row.rate).round() as u64));
        }
    }
    out
}

/// The p75s the server computes for each device type and metric, asked independently of the
/// report: `(weighted, unweighted)`, `quantileExactWeighted` and `quantileExact`.
async fn server_p75s(env: &TestEnv<'_>, from: i64) -> ServerP75s {
    let columns: Vec<String> = METRICS
        .iter()
        .map(|(name, c, ..)| {
            format!(
                "quantileExactWeighted(0.75)({c}, toUInt64(round(1000 / sample_rate))) AS {name}_w, \
                 quantileExact(0.75)({c}) AS {name}_x"
            )
        })
        .collect();
    let sql = format!(
        "SELECT toString(device_type) AS device, {} FROM {}.measurements FINAL \
         WHERE site = '{SITE}' AND page_view_at >= toDateTime('{}', 'UTC') AND device_type != 'bot' \
         GROUP BY device",
        columns.join(", "),
        env.db,
        utc_time(from)
    );
    env.query(0, &sql)
        .await
        .into_iter()
        .map(|r| {
            let device = col(&r, "device").as_str().unwrap().to_owned();
            let p75s = METRICS
                .iter()
                .map(|(name, ..)| {
                    (
                        as_number(col(&r, &format!("{name}_w"))),
                        as_number(col(&r, &format!("{name}_x"))),
                    )
                })
                .collect();
            (device, p75s)
        })
        .collect()
}

/// Checks the JSON report against the rows and the server's own p75s; prints what it measured.
fn check_report(report: &Value, want: &Want, server: &ServerP75s) {
    let groups = field(report, "groups")
        .as_array()
        .expect("groups is a list");
    let got: Vec<&str> = groups
        .iter()
        .map(|g| field(g, "group").as_str().unwrap())
        .collect();
    assert_eq!(
        got.len(),
        want.len(),
        "{got:?}: bots and other sites left out"
    );
    for group in groups {
        let device = field(group, "group").as_str().unwrap();
        let (measurements, views, metrics) = &want[device];
        assert_eq!(
            as_number(field(group, "measurements")),
            Some(*measurements as f64),
            "{device}"
        );
        let page_views = as_number(field(group, "page_views")).unwrap();
        assert!(
            (page_views - views).abs() < 1e-9,
            "{device}: {page_views} page views, {views} expected"
        );
        let figures = field(group, "metrics").as_array().unwrap();
        for (((name, ..), x), (f, (weighted, exact))) in METRICS
            .iter()
            .zip(metrics)
            .zip(figures.iter().zip(&server[device]))
        {
            assert_eq!(field(f, "metric"), name);
            assert_eq!(
                as_number(field(f, "measured")),
                Some(x.measured as f64),
                "{device} {name}"
            );
            let p75 = as_number(field(f, "p75"));
            let shares = ["good", "needs_improvement", "poor"].map(|s| as_number(field(f, s)));
            let enough = x.measured >= 100;
            assert_eq!(field(f, "enough_data"), &json!(enough), "{device} {name}");
            if x.measured == 0 {
                assert_eq!(*weighted, None, "{device} {name}: not measured");
            }
            if !enough {
                assert_eq!(
                    p75, None,
                    "{device} {name}: {} measured, not enough",
                    x.measured
                );
                assert_eq!(shares, [None; 3], "{device} {name}");
                println!(
                    "{device:8} {name:4} {} measured: not enough data, p75 and shares null",
                    x.measured
                );
                continue;
            }
            let p75 = p75.unwrap_or_else(|| panic!("{device} {name}: no p75 in {f}"));
            let (server_w, rust_w) = (weighted.unwrap(), x.p75().unwrap());
            let off = |reference: f64| (p75 - reference).abs() / reference.abs().max(1e-12);
            assert!(
                off(server_w) <= 0.02,
                "{device} {name}: p75 {p75}, quantileExactWeighted {server_w}"
            );
            assert!(
                off(rust_w) <= 0.02,
                "{device} {name}: p75 {p75}, weighted p75 here {rust_w}"
            );
            let want_shares =
                [x.good, x.measured_views - x.good - x.poor, x.poor].map(|v| v / x.measured_views);
            for (s, (got, want)) in ["good", "needs_improvement", "poor"]
                .iter()
                .zip(shares.iter().zip(want_shares))
            {
                let got = got.unwrap_or_else(|| panic!("{device} {name}: no {s} share"));
                assert!(
                    (got - want).abs() < 1e-9,
                    "{device} {name}: {s} {got}, expected {want}"
                );
            }
            println!(
                "{device:8} {name:4} n={:3} p75 {p75} | quantileExactWeighted {server_w} (diff {:.3} %) | here {rust_w} | quantileExact {} (diff {:.3} %) | good {:.4} ni {:.4} poor {:.4}",
                x.measured,
                off(server_w) * 100.0,
                exact.unwrap(),
                off(exact.unwrap()) * 100.0,
                want_shares[0],
                want_shares[1],
                want_shares[2],
            );
        }
    }
}

/// The whole check on `env`'s servers: rows in, the report in JSON, as a table and as HTML,
/// an unknown site and a bad key, a first server that does not answer.
async fn report_answers_what_the_rows_say(env: &TestEnv<'_>) -> std::path::PathBuf {
    let now = now_ms() / 1000;
    let rows = rows();
    insert(env, &rows, now).await;
    let out = env.cli(&["report", "--site", SITE, "--format", "json"]);
    out.success();
    let report: Value =
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout));
    assert_eq!(field(&report, "by"), "device_type");
    assert_eq!(field(&report, "days"), 7);
    let server = server_p75s(env, now - 7 * DAY).await;
    check_report(&report, &expected(&rows), &server);
    check_by_page_group(env, &report);

    // The table: one block per device type, the hostile name as it is (a terminal runs nothing).
    let table = env.cli(&["report", "--site", SITE, "--by", "browser", "--days", "30"]);
    table.success();
    println!("{}", table.stdout);
    assert!(
        table.stdout.contains(&format!("\n{HOSTILE}: ")),
        "{}",
        table.stdout
    );
    assert!(
        table.stdout.contains("Site shop: the last 30 days"),
        "{}",
        table.stdout
    );
    let html = tempfile::tempdir().unwrap().keep().join("report.html");
    env.cli(&[
        "report",
        "--site",
        SITE,
        "--by",
        "browser",
        "--html",
        html.to_str().unwrap(),
    ])
    .success();
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        !page.contains("<script"),
        "the browser name is text in the page"
    );
    assert!(page.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"));
    assert!(
        !regex::Regex::new(r#"(?i)(src|href)\s*=\s*["']?\s*(https?:)?//"#)
            .unwrap()
            .is_match(&page),
        "the page loads nothing from elsewhere"
    );

    let unknown = env.cli(&["report", "--site", "nobody"]);
    assert_eq!(unknown.code, 1, "{}", unknown.stderr);
    assert!(
        unknown.stderr.contains("no site \"nobody\""),
        "{}",
        unknown.stderr
    );
    let bad = env.cli(&["report", "--site", "no/such key"]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    // A first server that does not answer: the next one does (the single-server form lists
    // one server only).
    if env.table_form == "replicated" {
        let urls = format!(
            "http://127.0.0.1:{},{}",
            free_port(),
            env.clickhouse.join(",")
        );
        let out = env.cli_with(
            &[("COLLECTOR_CLICKHOUSE_URLS", &urls)],
            &["report", "--site", SITE, "--format", "json"],
        );
        out.success();
        let again: Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(field(&again, "server"), env.clickhouse[0].as_str());
        assert_eq!(field(&again, "groups"), field(&report, "groups"));
    }
    html
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_answers_what_the_rows_say_on_clickhouse_18() {
    let env = TestEnv::new(Stack::shared()).await;
    report_answers_what_the_rows_say(&env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_answers_what_the_rows_say_on_clickhouse_26() {
    let env = TestEnv::on_ch26(Stack::shared()).await;
    let html = report_answers_what_the_rows_say(&env).await;
    // The page in headless Chromium: it loads nothing, runs nothing, shows the name as text.
    let seen = static_report_page(
        &env.diag,
        &html,
        1600,
        "return {svgs: document.querySelectorAll('svg').length, \
         headings: [].map.call(document.querySelectorAll('h2'), function (h) { return h.firstChild.textContent.trim(); })};",
        "report-screenshot.png",
    )
    .await;
    assert!(field(&seen, "svgs").as_u64().unwrap() >= 3, "{seen}");
    assert!(
        field(&seen, "headings")
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h == HOSTILE),
        "{seen}"
    );
}
