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

use std::time::Duration;

use collector_tests::common;

use common::browser::{Browser, Engine};
use common::*;
use serde_json::{json, Value};

const DAY: i64 = 86_400;
/// The metrics as the report names them, their columns and web.dev's thresholds.
const METRICS: [(&str, &str, f64, f64); 5] = [
    ("lcp", "lcp_ms", 2500.0, 4000.0),
    ("inp", "inp_ms", 200.0, 500.0),
    ("cls", "cls", 0.1, 0.25),
    ("fcp", "fcp_ms", 1800.0, 3000.0),
    ("ttfb", "ttfb_ms", 800.0, 1800.0),
];
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

/// The whole `--crux` check on `env`: the fixture's answer, then a Firefox-only site.
async fn crux_answers_what_the_rows_say(env: &TestEnv<'_>) -> Value {
    let rows_made = today();
    let rows = crux_rows();
    insert(env, "shop", &rows).await;
    let report = report_json(env, "shop", &["--crux"]);
    let days: Vec<String> = field(&report, "days")
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(days.len(), 28);
    // Yesterday, as the command saw it: midnight may have passed since the rows were made.
    let yesterday = [utc_date(rows_made - DAY), utc_date(today() - DAY)];
    assert!(
        yesterday.contains(&days[27]),
        "{days:?}: the last complete day is yesterday"
    );
    let cohorts = field(&report, "cohorts").as_array().unwrap();
    assert_eq!(cohorts.len(), 8);
    let verdicts: Vec<&Value> = cohorts
        .iter()
        .map(|c| field(c, "core_web_vitals"))
        .collect();
    for c in cohorts {
        check_cohort(c, &rows, &days);
    }
    assert!(
        verdicts.contains(&&json!("pass"))
            && verdicts.contains(&&json!("fail"))
            && verdicts.contains(&&json!("not_enough_data")),
        "{verdicts:?}"
    );

    // A site whose visitors all use Firefox: no Chromium cohort has data.
    let fox: Vec<Row> = rows
        .iter()
        .map(|r| Row {
            agent: 8,
            ..r.clone()
        })
        .collect();
    insert(env, "fox", &fox).await;
    let fox_report = report_json(env, "fox", &["--crux"]);
    for c in field(&fox_report, "cohorts").as_array().unwrap() {
        assert_eq!(field(c, "core_web_vitals"), "not_enough_data", "{c}");
        assert_eq!(as_number(field(c, "measurements")), Some(0.0), "{c}");
        assert!(field(c, "metrics")
            .as_array()
            .unwrap()
            .iter()
            .all(|f| field(f, "p75").is_null()));
    }
    let table = env.cli(&["report", "--site", "fox", "--crux"]);
    table.success();
    assert!(
        table
            .stdout
            .contains("phone, hard navigations: Core Web Vitals not enough data."),
        "{}",
        table.stdout
    );
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crux_answers_what_the_rows_say_on_clickhouse_18() {
    let env = TestEnv::new(Stack::shared()).await;
    crux_answers_what_the_rows_say(&env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crux_answers_what_the_rows_say_on_clickhouse_26() {
    let env = TestEnv::on_ch26(Stack::shared()).await;
    crux_answers_what_the_rows_say(&env).await;
    let table = env.cli(&["report", "--site", "shop", "--crux"]);
    table.success();
    println!("{}", table.stdout);
    let html = tempfile::tempdir().unwrap().keep().join("crux.html");
    env.cli(&[
        "report",
        "--site",
        "shop",
        "--crux",
        "--html",
        html.to_str().unwrap(),
    ])
    .success();
    screenshot(&env, &html, "crux-screenshot.png").await;
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

/// How many marks of `site`'s days the roll-up holds on the first server.
async fn marks(env: &TestEnv<'_>, site: &str) -> i64 {
    let sql = format!(
        "SELECT count() AS n FROM {}.crux_day_marks WHERE site = '{site}'",
        env.db
    );
    let rows = env.query(0, &sql).await;
    rows.first()
        .and_then(|r| as_i64(col(r, "n")))
        .unwrap_or_else(|| panic!("no count of crux_day_marks: {rows:?}"))
}

/// 150 desktop Chrome page views eight days ago with a poor LCP (9,000.5 ms): enough to move the
/// desktop p75s of that day and of the range.
fn late_rows() -> Vec<Row> {
    (0..150)
        .map(|i| Row {
            device: "desktop",
            agent: 1,
            soft: false,
            rate: 1.0,
            at: today() - 8 * DAY + 3_600 + i,
            release: "",
            metrics: [
                Some(9_000.5),
                Some(48.0),
                Some(0.01),
                Some(900.0),
                Some(100.0),
            ],
        })
        .collect()
}

/// Writes `rows` of `site` with the ids `ids` (one each, in order) into `env`'s first server.
async fn insert_as(env: &TestEnv<'_>, site: &str, rows: &[Row], ids: &[String]) {
    let lines: Vec<String> = rows
        .iter()
        .zip(ids)
        .map(|(r, id)| {
            let mut v: Value = serde_json::from_str(&json_row(site, r)).unwrap();
            v["id"] = json!(id);
            v.to_string()
        })
        .collect();
    let sql = format!(
        "INSERT INTO {}.measurements FORMAT JSONEachRow\n{}",
        env.db,
        lines.join("\n")
    );
    env.exec(0, &sql).await;
}

/// The `--crux` answer for `shop`, checked against `rows`.
fn view_of(env: &TestEnv<'_>, rows: &[Row]) -> Value {
    let report = report_json(env, "shop", &["--crux"]);
    check_crux(&report, rows);
    report
}

/// Waits until `shop`'s rows on the first server that match `filter` number `n` (before
/// `FINAL`): a mutation or a merge done.
async fn wait_rows_matching(env: &TestEnv<'_>, what: &str, filter: &str, n: i64) {
    let rest = format!("WHERE site = 'shop' AND {filter}");
    let limit = Duration::from_secs(60);
    wait_until(
        &env.diag,
        what,
        limit,
        Duration::from_millis(200),
        || async {
            match env.count(&rest).await {
                m if m == n => Ok(()),
                m => Err(format!("{m} rows, not {n}")),
            }
        },
    )
    .await;
}

/// Resends `late` (ids `ids`) with an INP of 900 ms, then merges the table so that each id
/// keeps one copy (the resend, the last written): the view follows the resend both before and
/// after the merge (the merge leaves as many rows as before the resend, in new parts).
async fn resend_and_fold(env: &TestEnv<'_>, rows: &mut [Row], late: &[Row], ids: &[String]) {
    let resent: Vec<Row> = late
        .iter()
        .map(|r| Row {
            metrics: [
                r.metrics[0],
                Some(900.0),
                r.metrics[2],
                r.metrics[3],
                r.metrics[4],
            ],
            ..r.clone()
        })
        .collect();
    insert_as(env, "shop", &resent, ids).await;
    let n = rows.len();
    rows[n - late.len()..].clone_from_slice(&resent);
    view_of(env, rows);
    env.exec(0, &format!("OPTIMIZE TABLE {}.measurements FINAL", env.db))
        .await;
    wait_rows_matching(env, "the merge that folds the resends", "1 = 1", n as i64).await;
    view_of(env, rows);
}

/// The rows of `shop` with the ids `ids`, as an SQL condition (by id: ClickHouse 18.16's
/// mutations drop or change some rows whose condition is NULL, e.g. `lcp_ms = 1` where `lcp_ms`
/// is NULL, seen here).
fn with_ids(ids: &[String]) -> String {
    let quoted: Vec<String> = ids.iter().map(|i| format!("'{i}'")).collect();
    format!("site = 'shop' AND id IN ({})", quoted.join(", "))
}

/// Changes the resent rows' INP back to 48 ms in place (`ALTER … UPDATE`: as many rows as
/// before): the view follows.
async fn update_in_place(env: &TestEnv<'_>, rows: &mut [Row], ids: &[String]) {
    let late = ids.len();
    let update = format!(
        "ALTER TABLE {}.measurements UPDATE inp_ms = 48 WHERE {}",
        env.db,
        with_ids(ids)
    );
    env.exec(0, &update).await;
    let resent = format!("{} AND inp_ms = 900", with_ids(ids));
    wait_rows_matching(env, "the update's mutation", &resent, 0).await;
    let n = rows.len();
    for r in &mut rows[n - late..] {
        r.metrics[1] = Some(48.0);
    }
    view_of(env, rows);
}

/// The daily roll-up (docs/queries.md, "The CrUX view"): a second view reads the days stored
/// by the first and answers the same without computing any again; rows arriving late for a past
/// day, their resend and the merge that folds it, an update in place and their erasure each
/// change the answer exactly as the rows say; a roll-up emptied by hand is computed again; a
/// server without the roll-up's tables answers from the rows, and says so.
async fn the_rollup_follows_the_rows(env: &TestEnv<'_>) {
    let mut rows = crux_rows();
    insert(env, "shop", &rows).await;
    let first = view_of(env, &rows);
    let computed = marks(env, "shop").await;
    let days = field(&first, "days").as_array().unwrap();
    let with_rows: std::collections::BTreeSet<String> = rows
        .iter()
        .map(|r| utc_date(r.at))
        .filter(|d| days.contains(&json!(d)))
        .collect();
    assert_eq!(computed, with_rows.len() as i64, "a mark per day with rows");
    let second = report_json(env, "shop", &["--crux"]);
    assert_eq!(field(&second, "cohorts"), field(&first, "cohorts"));
    assert_eq!(marks(env, "shop").await, computed, "nothing computed again");

    let late = late_rows();
    let ids: Vec<String> = late
        .iter()
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    insert_as(env, "shop", &late, &ids).await;
    rows.extend(late.iter().cloned());
    let third = view_of(env, &rows);
    assert_ne!(field(&third, "cohorts"), field(&first, "cohorts"));
    assert!(
        marks(env, "shop").await > computed,
        "the late rows' day computed again"
    );
    resend_and_fold(env, &mut rows, &late, &ids).await;
    update_in_place(env, &mut rows, &ids).await;

    let erase = format!(
        "ALTER TABLE {}.measurements DELETE WHERE {}",
        env.db,
        with_ids(&ids)
    );
    env.exec(0, &erase).await;
    wait_rows_matching(env, "the erasure's mutation", &with_ids(&ids), 0).await;
    rows.truncate(rows.len() - late.len());
    let fourth = view_of(env, &rows);
    assert_eq!(field(&fourth, "cohorts"), field(&first, "cohorts"));

    env.exec(0, &format!("TRUNCATE TABLE {}.crux_days", env.db))
        .await;
    let emptied = view_of(env, &rows);
    assert_eq!(field(&emptied, "cohorts"), field(&first, "cohorts"));
    for table in ["crux_days", "crux_day_marks"] {
        env.exec(0, &format!("DROP TABLE {}.{table}", env.db)).await;
    }
    let out = env.cli(&["report", "--site", "shop", "--crux", "--format", "json"]);
    out.success();
    assert!(
        out.stderr.contains("no CrUX roll-up on this server"),
        "{}",
        out.stderr
    );
    let fifth: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(field(&fifth, "cohorts"), field(&first, "cohorts"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rollup_follows_the_rows_on_clickhouse_18() {
    let env = TestEnv::new(Stack::shared()).await;
    the_rollup_follows_the_rows(&env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rollup_follows_the_rows_on_clickhouse_26() {
    let env = TestEnv::on_ch26(Stack::shared()).await;
    the_rollup_follows_the_rows(&env).await;
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
    let browser = Browser::start(Engine::Chromium, &env.diag).await;
    browser.client.set_window_size(1000, 2400).await.unwrap();
    browser
        .client
        .goto(&format!("file://{}", html.display()))
        .await
        .unwrap();
    browser.wait_for("document.readyState == 'complete'").await;
    let seen = browser
        .eval("return {resources: performance.getEntriesByType('resource').length, scripts: document.scripts.length, svgs: document.querySelectorAll('svg').length};")
        .await;
    assert_eq!(field(&seen, "resources"), 0, "{seen}");
    assert_eq!(field(&seen, "scripts"), 0, "{seen}");
    assert!(
        field(&seen, "svgs").as_u64().unwrap() >= 16,
        "a chart and a trend per cohort: {seen}"
    );
    let png = browser.client.screenshot().await.unwrap();
    let path = root().join("target").join(name);
    std::fs::write(&path, &png).unwrap();
    println!("screenshot: {} ({} bytes)", path.display(), png.len());
    browser.quit().await;
}

/// Two releases of 2,000 page views each (rates 1 and 0.5), their LCP log-normal around 2 s;
/// release 413's every page view `slower` ms slower. A's rows before `t`, B's after it.
fn releases(slower: f64, t: i64) -> Vec<Row> {
    let mut rng = Lcg(413);
    (0..4000)
        .map(|i| {
            let b = i % 2 == 1;
            let z = (-2.0 * rng.unit().max(1e-12).ln()).sqrt()
                * (std::f64::consts::TAU * rng.unit()).cos();
            let lcp = (7.6 + 0.5 * z).exp() + if b { slower } else { 0.0 };
            Row {
                device: ["mobile", "desktop"][i % 4 / 2],
                agent: 0,
                soft: false,
                rate: if i % 3 == 0 { 0.5 } else { 1.0 },
                at: t + if b { 1 } else { -1 } * (60 + (i as i64 * 97) % DAY),
                release: if b { "413" } else { "412" },
                metrics: [
                    Some((lcp * 10.0).round() / 10.0),
                    Some(100.0),
                    Some(0.05),
                    Some(900.0),
                    Some(300.0),
                ],
            }
        })
        .collect()
}

/// The LCP comparison of a `--compare` or `--deploy` answer: `(low, difference, high, real)`.
fn lcp_difference(report: &Value) -> (f64, f64, f64, bool) {
    let lcp = &field(report, "metrics").as_array().unwrap()[0];
    assert_eq!(field(lcp, "metric"), "lcp");
    for side in ["a", "b"] {
        let e = field(field(lcp, side), "estimate");
        let [low, p75, high] = ["low", "p75", "high"].map(|k| as_number(field(e, k)).unwrap());
        assert!(
            low <= p75 && p75 <= high && high - low < 400.0,
            "{side}: {e}"
        );
    }
    let d = field(lcp, "difference");
    let [low, diff, high] = ["low", "difference", "high"].map(|k| as_number(field(d, k)).unwrap());
    (low, diff, high, field(d, "real").as_bool().unwrap())
}

/// `--compare release=412,413` and `--deploy T` on two releases, one 300 ms slower: real, and the
/// interval holds 300 ms; the same release against itself shifted by nothing: not real.
async fn compare_finds_the_slower_release(env: &TestEnv<'_>) {
    let t = today() - 3 * DAY;
    insert(env, "shop", &releases(300.0, t)).await;
    let by_release = report_json(env, "shop", &["--compare", "release=412,413"]);
    assert_eq!(field(&by_release, "kind"), "compare");
    let (low, diff, high, real) = lcp_difference(&by_release);
    println!("--compare: B - A = {diff:.1} ms [{low:.1}, {high:.1}], real {real}");
    assert!(real && low <= 300.0 && 300.0 <= high, "{low} {diff} {high}");
    let instant = format!("{}T00:00:00Z", utc_date(t));
    let deploy = report_json(env, "shop", &["--deploy", &instant, "--days", "2"]);
    assert_eq!(field(&deploy, "kind"), "deploy");
    let (dl, dd, dh, dr) = lcp_difference(&deploy);
    let near = |x: f64, y: f64| (x - y).abs() < 1e-6;
    assert!(
        near(dl, low) && near(dd, diff) && near(dh, high) && dr == real,
        "the same rows, split by time: {dl} {dd} {dh}"
    );
    let same = |m: &Value| field(m, "difference").clone();
    let metrics = field(&by_release, "metrics").as_array().unwrap();
    assert!(
        metrics[1..]
            .iter()
            .all(|m| field(&same(m), "real") == false),
        "INP..TTFB equal on both sides"
    );
    insert(env, "twin", &releases(0.0, t)).await;
    let (low, diff, high, real) =
        lcp_difference(&report_json(env, "twin", &["--compare", "release=412,413"]));
    println!("one distribution twice: B - A = {diff:.1} ms [{low:.1}, {high:.1}], real {real}");
    assert!(!real && low <= 0.0 && 0.0 <= high, "{low} {diff} {high}");
    // `--by dimension:release`: one group per release, 2,000 rows each.
    let by = report_json(env, "shop", &["--by", "dimension:release"]);
    assert_eq!(field(&by, "by"), "dimension:release");
    let groups: Vec<(String, f64)> = field(&by, "groups")
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                field(g, "group").as_str().unwrap().to_owned(),
                as_number(field(g, "measurements")).unwrap(),
            )
        })
        .collect();
    assert_eq!(
        groups,
        [("412".to_owned(), 2000.0), ("413".to_owned(), 2000.0)],
        "{by}"
    );
    let table = env.cli(&["report", "--site", "shop", "--compare", "release=412,413"]);
    table.success();
    println!("{}", table.stdout);
    assert!(
        table
            .stdout
            .lines()
            .any(|l| l.trim_start().starts_with("LCP") && l.trim_end().ends_with(" real")),
        "{}",
        table.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_finds_the_slower_release_on_clickhouse_18() {
    let env = TestEnv::new(Stack::shared()).await;
    compare_finds_the_slower_release(&env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_finds_the_slower_release_on_clickhouse_26() {
    let env = TestEnv::on_ch26(Stack::shared()).await;
    compare_finds_the_slower_release(&env).await;
    let html = tempfile::tempdir().unwrap().keep().join("compare.html");
    env.cli(&[
        "report",
        "--site",
        "shop",
        "--compare",
        "release=412,413",
        "--html",
        html.to_str().unwrap(),
    ])
    .success();
    check_compare_page(&html);
}

/// The comparison page loads nothing from elsewhere and says which difference is real.
fn check_compare_page(html: &std::path::Path) {
    let page = std::fs::read_to_string(html).unwrap();
    assert!(
        !page.contains("<script") && !page.contains("src="),
        "{page}"
    );
    assert!(page.contains("): real</text>"), "{page}");
}
