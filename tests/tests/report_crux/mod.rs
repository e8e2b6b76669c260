//! `collector report --crux`, `--compare` and `--deploy` (contract v5 §1, issue 54) against real
//! servers, ClickHouse 18.16 and 26.x: known rows written straight into `measurements`, and
//! every figure the command prints checked against what this file works out from those rows.
//!
//! - `--crux`: 3,000 rows over 30 days (phones failing, desktops passing, tablets too few;
//!   Chrome, Edge, Samsung Internet, Facebook's Android in-app browser, and the non-Chromium
//!   EdgeHTML, Chrome on iOS, Safari and Firefox; bots; soft navigations; rates 1, 0.5 and
//!   0.25): every cohort's p75s, shares, page views, Core Web Vitals verdict and daily trend
//!   equal what is computed here (p75s exactly: `quantileExactWeighted`'s definition over the
//!   values at the display resolution). A Firefox-only site: not enough data everywhere.
//! - `--compare release=412,413` and `--deploy`: two releases of 2,000 page views each, one
//!   300 ms slower: marked real, the interval holds 300 ms. The same release twice: not real.
//! - The daily roll-up `--crux` reads: the same answer from the stored days; late rows, their
//!   resend folded by a merge, an update in place and an erasure followed; a roll-up emptied by
//!   hand computed again; the rows alone where the server has no roll-up.
//! - The CrUX page in headless Chromium: it loads nothing; its screenshot is saved.

use collector_tests::common;

use common::browser::static_report_page;
use common::*;
use serde_json::{json, Value};

const DAY: i64 = 86_400;
/// `(browser, version, os, counted as Chromium)`: what the docs list, seen from outside.
const AGENTS: [(&str, &str, &str, bool); 9] = [
    ("Chrome Mobile", "131", "Android", true),
    ("Chrome", "131", "Windows", true),
    ("Samsung Internet", "24", "Android", true),
    ("Edge", "131", "Windows", true),
    ("Facebook", "468", "Android", true),
    ("Edge", "18", "Windows", false),
    ("Chrome Mobile iOS", "131", "iOS", false),
    ("Mobile Safari", "17", "iOS", false),
    ("Firefox", "128", "Linux", false),
];

/// One row: where and when, and its metrics (`None`: not measured).
#[derive(Debug, Clone)]
struct Row {
    device: &'static str,
    agent: usize,
    soft: bool,
    rate: f64,
    at: i64,
    release: &'static str,
    metrics: [Option<f64>; 5],
}

/// Knuth's MMIX LCG: the same rows on every run.
struct Lcg(u64);

impl Lcg {
    fn unit(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A value in `[lo, hi)`, a multiple of `step`.
    fn range(&mut self, lo: f64, hi: f64, step: f64) -> f64 {
        ((lo + self.unit() * (hi - lo)) / step).round() * step
    }
}

/// Today's UTC midnight, Unix seconds.
fn today() -> i64 {
    let now = now_ms() / 1000;
    now - now.rem_euclid(DAY)
}

/// The CrUX fixture: 3,000 rows from 29 days before today to today, 40 % of them yesterday and
/// 20 % eight days ago (days with enough data), the rest spread over every day; 75 tablets (not
/// enough data).
fn crux_rows() -> Vec<Row> {
    let mut rng = Lcg(54);
    let t0 = today();
    (0..3000)
        .map(|i| {
            let device = match i % 40 {
                4 => "tablet",
                _ => [
                    "mobile", "mobile", "desktop", "mobile", "desktop", "bot", "unknown", "desktop",
                ][i % 8],
            };
            let day = match i % 5 {
                0 | 1 => 1,
                2 => 8,
                _ => (i as i64 * 7) % 30,
            };
            let at = t0 - day * DAY + (i as i64 * 37) % DAY;
            let fast = device == "desktop";
            let mut m = |gap: usize, lo: f64, hi: f64, step: f64| {
                let v = rng.range(lo, hi, step);
                (i % gap != 3).then_some(v)
            };
            let metrics = if fast {
                [
                    m(7, 400.0, 2400.0, 0.1),
                    m(5, 16.0, 190.0, 8.0),
                    m(9, 0.0, 0.09, 0.0001),
                    m(1000, 300.0, 2000.0, 0.1),
                    m(11, 40.0, 900.0, 0.5),
                ]
            } else {
                [
                    m(7, 900.0, 6000.0, 0.1),
                    m(5, 16.0, 700.0, 8.0),
                    m(9, 0.0, 0.4, 0.0001),
                    m(1000, 300.0, 4000.0, 0.1),
                    m(11, 40.0, 2600.0, 0.5),
                ]
            };
            Row {
                device,
                agent: (i / 8 + i % 3) % AGENTS.len(),
                soft: i % 3 == 0,
                rate: [1.0, 0.5, 0.25][i % 3 / 2 + i % 2],
                at,
                release: "",
                metrics,
            }
        })
        .collect()
}

/// `row` as a line of JSONEachRow for `site` (every column given: 18.16 fills an omitted one
/// with its type's zero, not its DEFAULT).
fn json_row(site: &str, row: &Row) -> String {
    let (browser, version, os, _) = AGENTS[row.agent];
    let s = row.at.rem_euclid(DAY);
    let time = format!(
        "{} {:02}:{:02}:{:02}",
        utc_date(row.at),
        s / 3600,
        s / 60 % 60,
        s % 60
    );
    let (names, values) = if row.release.is_empty() {
        (json!([]), json!([]))
    } else {
        (json!(["release"]), json!([row.release]))
    };
    let mut v = json!({
        "id": uuid::Uuid::new_v4().to_string(), "site": site, "url": "https://shop.example/",
        "received_at": time, "ts": row.at * 1000, "page_view_at": time, "user_agent": "",
        "sample_rate": row.rate, "device_type": row.device, "browser": browser,
        "browser_version": version, "os": os, "country": "", "page_group": "",
        "navigation_type": if row.soft { "soft_navigation" } else { "navigate" },
        "dimension_names": names, "dimension_values": values,
    });
    for ((_, column, ..), value) in METRICS.iter().zip(row.metrics) {
        v[*column] = json!(value);
    }
    v.to_string()
}

/// Writes `rows` of `site` into `env`'s first server.
async fn insert(env: &TestEnv<'_>, site: &str, rows: &[Row]) {
    let lines: Vec<String> = rows.iter().map(|r| json_row(site, r)).collect();
    let sql = format!(
        "INSERT INTO {}.measurements FORMAT JSONEachRow\n{}",
        env.db,
        lines.join("\n")
    );
    env.exec(0, &sql).await;
}

/// The report's JSON answer to `args` for `site`.
fn report_json(env: &TestEnv<'_>, site: &str, args: &[&str]) -> Value {
    let mut all = vec!["report", "--site", site, "--format", "json"];
    all.extend_from_slice(args);
    let out = env.cli(&all);
    out.success();
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

/// A value at the display resolution, rounded up (docs/queries.md, "The CrUX view").
fn at_resolution(metric: usize, v: f64) -> f64 {
    if metric == 2 {
        (v * 1000.0 - 0.000_001).ceil() / 1000.0
    } else {
        (v - 0.000_001).ceil()
    }
}

/// One metric's figures over some rows, worked out here: `(measured, p75, [good, ni, poor])`,
/// p75 and shares `None` under 100 measured.
fn figures(rows: &[&Row], metric: usize) -> (u64, Option<f64>, Option<[f64; 3]>) {
    let (_, _, good, poor) = METRICS[metric];
    let measured: Vec<(f64, f64)> = rows
        .iter()
        .filter_map(|r| r.metrics[metric].map(|v| (v, r.rate)))
        .collect();
    if measured.len() < 100 {
        return (measured.len() as u64, None, None);
    }
    let mut values: Vec<(f64, u64)> = measured
        .iter()
        .map(|&(v, r)| (at_resolution(metric, v), (1000.0 / r).round() as u64))
        .collect();
    values.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: u64 = values.iter().map(|v| v.1).sum();
    let threshold = (0.75 * total as f64).ceil() as u64;
    let mut acc = 0;
    let p75 = values.iter().find(|v| {
        acc += v.1;
        acc >= threshold
    });
    let views: f64 = measured.iter().map(|(_, r)| 1.0 / r).sum();
    let share = |keep: &dyn Fn(f64) -> bool| {
        measured
            .iter()
            .filter(|(v, _)| keep(*v))
            .map(|(_, r)| 1.0 / r)
            .sum::<f64>()
            / views
    };
    let (g, p) = (share(&|v| v <= good), share(&|v| v > poor));
    (
        measured.len() as u64,
        p75.map(|v| v.0),
        Some([g, 1.0 - g - p, p]),
    )
}

/// The rows of a cohort: Chromium, not bot nor unknown, of the form factor (`all`: any of the
/// three), hard only unless `soft`, on `day` (`None`: any day of the report's).
fn cohort<'r>(
    rows: &'r [Row],
    days: &[String],
    ff: &str,
    soft: bool,
    day: Option<&str>,
) -> Vec<&'r Row> {
    rows.iter()
        .filter(|r| AGENTS[r.agent].3 && ["mobile", "tablet", "desktop"].contains(&r.device))
        .filter(|r| ff == "all" || r.device == ff)
        .filter(|r| soft || !r.soft)
        .filter(|r| {
            let d = utc_date(r.at);
            day.map_or(days.contains(&d), |want| d == want)
        })
        .collect()
}

/// Checks one cohort of the JSON answer against the rows.
fn check_cohort(c: &Value, rows: &[Row], days: &[String]) {
    let ff = match field(c, "form_factor").as_str().unwrap() {
        "phone" => "mobile",
        other => other,
    };
    let soft = field(c, "navigations") == "hard_and_soft";
    let mine = cohort(rows, days, ff, soft, None);
    let name = format!("{ff} soft={soft}");
    assert_eq!(
        as_number(field(c, "measurements")),
        Some(mine.len() as f64),
        "{name}"
    );
    let mut ratings = Vec::new();
    for (i, f) in field(c, "metrics").as_array().unwrap().iter().enumerate() {
        let (measured, p75, shares) = figures(&mine, i);
        assert_eq!(
            as_number(field(f, "measured")),
            Some(measured as f64),
            "{name} {}",
            METRICS[i].0
        );
        assert_eq!(
            as_number(field(f, "p75")),
            p75,
            "{name} {}: p75",
            METRICS[i].0
        );
        let got = ["good", "needs_improvement", "poor"].map(|s| as_number(field(f, s)));
        match shares {
            None => assert_eq!(got, [None; 3], "{name} {}", METRICS[i].0),
            Some(want) => {
                for (g, w) in got.iter().zip(want) {
                    assert!(
                        (g.unwrap() - w).abs() < 1e-9,
                        "{name} {}: {got:?} {want:?}",
                        METRICS[i].0
                    );
                }
            }
        }
        ratings.push(p75.map(|v| v <= METRICS[i].2));
    }
    let want = match &ratings[..3] {
        r if r.iter().any(Option::is_none) => "not_enough_data",
        r if r.iter().all(|g| *g == Some(true)) => "pass",
        _ => "fail",
    };
    assert_eq!(field(c, "core_web_vitals"), want, "{name}");
    for (i, t) in field(c, "trend").as_array().unwrap().iter().enumerate() {
        let p75s = field(t, "p75").as_array().unwrap();
        assert_eq!(p75s.len(), 28, "{name}");
        for (d, got) in days.iter().zip(p75s) {
            let (_, want, _) = figures(&cohort(rows, days, ff, soft, Some(d)), i);
            assert_eq!(as_number(got), want, "{name} {} on {d}", METRICS[i].0);
        }
    }
    println!("{name:22} {want:15} {} rows", mine.len());
}

/// The cohorts of a `--crux` answer, each checked against `rows`.
fn check_crux(report: &Value, rows: &[Row]) {
    let days: Vec<String> = field(report, "days")
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().to_owned())
        .collect();
    for c in field(report, "cohorts").as_array().unwrap() {
        check_cohort(c, rows, &days);
    }
}

/// Opens `html` in headless Chromium: it must load nothing and run nothing; saves its
/// screenshot as `target/NAME`.
async fn screenshot(env: &TestEnv<'_>, html: &std::path::Path, name: &str) {
    let page = std::fs::read_to_string(html).unwrap();
    assert!(
        !regex::Regex::new(r#"(?i)(src|href)\s*=|url\(|@import"#)
            .unwrap()
            .is_match(&page),
        "nothing from elsewhere"
    );
    let seen = static_report_page(
        &env.diag,
        html,
        2400,
        "return {svgs: document.querySelectorAll('svg').length};",
        name,
    )
    .await;
    assert!(
        field(&seen, "svgs").as_u64().unwrap() >= 16,
        "a chart and a trend per cohort: {seen}"
    );
}

mod compare;
mod crux;
mod rollup;
