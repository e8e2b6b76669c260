//! The dashboard queries of `docs/queries.md`, run as written there against rows that two real
//! collectors stored on real ClickHouse 18.16 replicas from beacons with real user agents, some
//! resent, and against the same rows on a real ClickHouse 26.x server with the parameters bound
//! by the server: each answer is checked against values worked out by hand from the beacons.

use collector_tests::common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const VISIBLE: Duration = Duration::from_secs(30);
const DAY_MS: i64 = 86_400_000;

const IPHONE: &str = "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1";
const ANDROID: &str = "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Mobile Safari/537.36";
const CHROME: &str = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36";
const FIREFOX: &str = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0";
const IPAD: &str = "Mozilla/5.0 (iPad; CPU OS 16_6 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/16.6 Mobile/15E148 Safari/604.1";
const GOOGLEBOT: &str = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)";

/// The SQL of the query named `name` in `docs/queries.md` (the ```sql block after its
/// `<!-- query: name -->` marker); panics when there is none.
fn documented(name: &str) -> String {
    let path = root().join("docs/queries.md");
    let doc = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let marker = format!("<!-- query: {name} -->");
    let after = doc
        .split_once(&marker)
        .unwrap_or_else(|| panic!("no {marker} in {}", path.display()))
        .1;
    let body = after
        .trim_start()
        .strip_prefix("```sql\n")
        .unwrap_or_else(|| panic!("{marker} is not followed by a ```sql block"));
    body.split_once("```")
        .unwrap_or_else(|| panic!("the block of {marker} is not closed"))
        .0
        .to_owned()
}

/// `sql` with this test's database and every `{name:Type}` parameter replaced by its literal
/// (ClickHouse 18.16 has no query parameters); panics naming a parameter left unbound.
fn bind(sql: &str, db: &str, params: &[(&str, String)]) -> String {
    let mut sql = sql.replace("collector.measurements", &format!("{db}.measurements"));
    for (name, literal) in params {
        let start = format!("{{{name}:");
        while let Some(i) = sql.find(&start) {
            let end = i + sql[i..].find('}').expect("a parameter ends with }");
            sql.replace_range(i..=end, literal);
        }
    }
    assert!(
        !sql.contains(":String}") && !sql.contains(":DateTime") && !sql.contains(":UInt32}"),
        "a parameter is left unbound: {sql}"
    );
    sql
}

/// Runs `sql` and returns its rows; panics with ClickHouse's answer when it fails or when
/// the answer has no `data` array.
async fn rows_of(env: &TestEnv<'_>, sql: &str) -> Vec<Value> {
    let resp = http()
        .post(&env.stack.clickhouse_urls()[0])
        .body(format!("{sql} FORMAT JSON"))
        .send()
        .await
        .expect("clickhouse answers");
    let status = resp.status();
    let text = resp.text().await.expect("an answer body");
    assert!(status.is_success(), "{sql}\n{status}: {text}");
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    v["data"]
        .as_array()
        .unwrap_or_else(|| panic!("no data in {text}"))
        .clone()
}

/// Checks `rows` against `expected`, row by row: every column named in an expected row must
/// be present with that value (numbers within 1e-9, `null` for NULL); other columns are not
/// checked.
fn assert_rows(query: &str, rows: &[Value], expected: &[Value]) {
    assert_eq!(
        rows.len(),
        expected.len(),
        "{query}: {} rows, expected {}: {rows:#?}",
        rows.len(),
        expected.len()
    );
    for (i, (row, want)) in rows.iter().zip(expected).enumerate() {
        for (column, want) in want.as_object().expect("an expected row is an object") {
            let got = row
                .get(column)
                .unwrap_or_else(|| panic!("{query}: row {i} has no column {column}: {row}"));
            let same = match want {
                Value::String(_) => got == want,
                Value::Null => got.is_null(),
                _ => match (as_number(got), as_number(want)) {
                    (Some(a), Some(b)) => (a - b).abs() < 1e-9,
                    _ => false,
                },
            };
            assert!(
                same,
                "{query}: row {i}, {column} is {got}, expected {want}: {row}"
            );
        }
    }
}

/// One page view: the day (0: the first of the two days asked for, 1: the second, -2: two
/// days before the range), user agent, URL path and LCP, INP and CLS (`None`: not measured).
type PageView = (
    i64,
    &'static str,
    &'static str,
    Option<f64>,
    Option<f64>,
    Option<f64>,
);

const SHOP: [PageView; 15] = [
    (0, IPHONE, "/", None, None, None),
    (0, IPAD, "/", None, None, None),
    (0, IPHONE, "/p/shoes", None, None, None),
    (0, ANDROID, "/", Some(2000.0), Some(100.0), Some(0.05)),
    (0, ANDROID, "/p/shoes", Some(4500.0), Some(300.0), Some(0.3)),
    (0, ANDROID, "/p/shoes", Some(4500.0), Some(300.0), Some(0.3)),
    (0, CHROME, "/", Some(1000.0), Some(50.0), Some(0.1)),
    (
        0,
        CHROME,
        "/p/shoes?color=red",
        Some(3000.0),
        Some(250.0),
        Some(0.1),
    ),
    (0, FIREFOX, "/", Some(1500.0), Some(80.0), None),
    (0, FIREFOX, "/p/shoes", Some(3000.0), Some(250.0), None),
    (0, GOOGLEBOT, "/", Some(800.0), None, Some(0.0)),
    (1, ANDROID, "/", Some(3000.0), Some(120.0), Some(0.0)),
    (1, CHROME, "/", Some(3000.0), Some(60.0), Some(0.02)),
    (1, FIREFOX, "/", Some(3000.0), Some(60.0), None),
    // Outside the range asked for.
    (-2, CHROME, "/", Some(9999.0), Some(999.0), Some(0.9)),
];

/// Indexes into [`SHOP`] of the page views whose beacon is also resent through the second
/// collector.
const RESENT: [usize; 3] = [4, 6, 9];

/// The page-group rule of the shop (`/` has none: its automatic group is `/`).
const PAGE_GROUP_RULE: &str = "product=/p/*";

/// What some page views of [`SHOP`] also carry (v4): by index, a CDN cache entry of
/// Server-Timing (its name and `desc`) with the TTFB it came with (the others keep the
/// beacon's 120.5 ms and send no Server-Timing), and the value of the dimension `variant`.
const CACHE: [(usize, &str, &str, f64); 6] = [
    (0, "cdn-cache", "HIT", 40.0),
    (3, "cdn-cache", "HIT", 40.0),
    (6, "cfCacheStatus", "hit", 40.0),
    (4, "cdn-cache", "MISS", 900.0),
    (7, "cfCacheStatus", "EXPIRED", 900.0),
    (5, "cdn-cache", "STALE", 300.0),
];
const VARIANT: [(usize, &str); 7] = [
    (3, "a"),
    (6, "a"),
    (8, "a"),
    (0, "b"),
    (4, "b"),
    (7, "b"),
    (9, "b"),
];

/// Adds to beacon `i` of [`SHOP`] its Server-Timing, TTFB and variant ([`CACHE`], [`VARIANT`]).
fn with_extras(i: usize, m: &mut Value) {
    if let Some(&(_, name, desc, ttfb)) = CACHE.iter().find(|c| c.0 == i) {
        m["server_timing"] = json!([{"name": "app", "dur": 10}, {"name": name, "desc": desc}]);
        m["ttfb_ms"] = json!(ttfb);
    }
    if let Some(&(_, variant)) = VARIANT.iter().find(|v| v.0 == i) {
        m["dimensions"] = json!({ "variant": variant });
    }
}

/// The columns intake derives from beacon `i` of [`SHOP`] at `path` and its extras, as a row
/// written straight into the table carries them (the 26.x test).
fn derived_v4(i: usize, path: &str, m: &mut Value) {
    let cache = CACHE.iter().find(|c| c.0 == i).map_or("", |c| match c.2 {
        "HIT" | "hit" => "hit",
        "STALE" => "stale",
        _ => "miss",
    });
    m["cdn_cache"] = json!(cache);
    m["page_group"] = json!(if path.starts_with("/p/") {
        "product"
    } else {
        path
    });
    if let Some(&(_, variant)) = VARIANT.iter().find(|v| v.0 == i) {
        m["dimension_names"] = json!(["variant"]);
        m["dimension_values"] = json!([variant]);
    }
    for key in ["server_timing", "dimensions"] {
        m.as_object_mut().unwrap().remove(key);
    }
}

/// What each documented query must answer for [`SHOP`] (days `d0` and `d1` as `YYYY-MM-DD`),
/// worked out by hand; every percentile sits inside a run of equal values, so that ClickHouse's
/// interpolating `quantile` and an exact one agree.
fn expected_answers(d0: &str, d1: &str) -> Vec<(&'static str, Vec<Value>)> {
    let mut answers = expected_vitals(d0, d1);
    answers.extend(expected_breakdowns());
    answers
}

/// [`expected_answers`] of the queries of the vitals themselves: per day and device, LCP's
/// distribution and histogram, the slowest pages.
fn expected_vitals(d0: &str, d1: &str) -> Vec<(&'static str, Vec<Value>)> {
    vec![
        (
            "vitals_by_day_and_device",
            vec![
                json!({"day": d0, "device_type": "desktop", "rows": 4, "page_views": 8,
                   "lcp_measured": 4, "lcp_p75_ms": 3000, "inp_measured": 4, "inp_p75_ms": 250,
                   "cls_measured": 2, "cls_p75": 0.1, "fcp_p75_ms": 800, "ttfb_p75_ms": 120.5}),
                json!({"day": d0, "device_type": "mobile", "rows": 5, "page_views": 10,
                   "lcp_measured": 3, "lcp_p75_ms": 4500, "inp_measured": 3, "inp_p75_ms": 300,
                   "cls_measured": 3, "cls_p75": 0.3}),
                json!({"day": d0, "device_type": "tablet", "rows": 1, "page_views": 2,
                   "lcp_measured": 0, "lcp_p75_ms": null, "inp_measured": 0, "inp_p75_ms": null,
                   "cls_measured": 0, "cls_p75": null, "fcp_p75_ms": 800}),
                json!({"day": d1, "device_type": "desktop", "rows": 2, "page_views": 4,
                   "lcp_measured": 2, "lcp_p75_ms": 3000, "inp_measured": 2, "inp_p75_ms": 60,
                   "cls_measured": 1, "cls_p75": 0.02}),
                json!({"day": d1, "device_type": "mobile", "rows": 1, "page_views": 2,
                   "lcp_measured": 1, "lcp_p75_ms": 3000, "inp_measured": 1, "inp_p75_ms": 120,
                   "cls_measured": 1, "cls_p75": 0}),
            ],
        ),
        // Page views weigh 1 / sample_rate: two each (the shop samples half).
        (
            "lcp_distribution",
            vec![
                json!({"device_type": "desktop", "rows": 6, "page_views": 12, "lcp_measured": 6,
                   "good": 4, "needs_improvement": 8, "poor": 0}),
                json!({"device_type": "mobile", "rows": 6, "page_views": 12, "lcp_measured": 4,
                   "good": 2, "needs_improvement": 2, "poor": 4}),
                // Nothing measured: counts of 0, not NULL.
                json!({"device_type": "tablet", "rows": 1, "page_views": 2, "lcp_measured": 0,
                   "good": 0, "needs_improvement": 0, "poor": 0}),
            ],
        ),
        (
            "lcp_histogram",
            vec![
                json!({"bucket_ms": 1000, "rows": 1, "page_views": 2}),
                json!({"bucket_ms": 1500, "rows": 1, "page_views": 2}),
                json!({"bucket_ms": 2000, "rows": 1, "page_views": 2}),
                json!({"bucket_ms": 3000, "rows": 5, "page_views": 10}),
                json!({"bucket_ms": 4500, "rows": 2, "page_views": 4}),
            ],
        ),
        (
            "slowest_pages",
            vec![
                json!({"page": "/p/shoes", "rows": 5, "page_views": 10, "lcp_measured": 4,
                   "lcp_p75_ms": 4500, "inp_p75_ms": 300, "cls_p75": 0.3}),
                json!({"page": "/", "rows": 8, "page_views": 16, "lcp_measured": 6,
                   "lcp_p75_ms": 3000}),
            ],
        ),
    ]
}

/// [`expected_answers`] of the queries that break the vitals down: by page group, CDN cache,
/// dimension and browser.
fn expected_breakdowns() -> Vec<(&'static str, Vec<Value>)> {
    vec![
        // The site's rule `product=/p/*`; `/` has no rule: its automatic group is itself.
        // Weighted p75s are exact: the value where the cumulated weight reaches 3/4.
        (
            "by_page_group",
            vec![
                json!({"page_group": "/", "rows": 8, "page_views": 16, "lcp_measured": 6,
                   "lcp_p75_ms": 3000, "inp_p75_ms": 100, "cls_p75": 0.05}),
                json!({"page_group": "product", "rows": 5, "page_views": 10, "lcp_measured": 4,
                   "lcp_p75_ms": 4500, "inp_p75_ms": 300, "cls_p75": 0.3}),
            ],
        ),
        (
            "ttfb_by_cdn_cache",
            vec![
                json!({"cdn_cache": "", "rows": 7, "page_views": 14, "ttfb_p75_ms": 120.5}),
                json!({"cdn_cache": "hit", "rows": 3, "page_views": 6, "ttfb_p75_ms": 40}),
                json!({"cdn_cache": "miss", "rows": 2, "page_views": 4, "ttfb_p75_ms": 900}),
                json!({"cdn_cache": "stale", "rows": 1, "page_views": 2, "ttfb_p75_ms": 300}),
            ],
        ),
        (
            "lcp_by_dimension",
            vec![
                json!({"value": "a", "rows": 3, "page_views": 6, "lcp_measured": 3,
                   "lcp_p75_ms": 2000}),
                json!({"value": "b", "rows": 4, "page_views": 8, "lcp_measured": 3,
                   "lcp_p75_ms": 4500}),
            ],
        ),
        (
            "by_browser",
            vec![
                json!({"browser": "Chrome Mobile", "browser_version": "131", "rows": 4,
                   "lcp_measured": 4, "lcp_p75_ms": 4500, "inp_measured": 4,
                   "cls_measured": 4, "cls_p75": 0.3}),
                json!({"browser": "Chrome", "browser_version": "131", "rows": 3,
                   "lcp_measured": 3, "lcp_p75_ms": 3000, "cls_measured": 3, "cls_p75": 0.1}),
                json!({"browser": "Firefox", "browser_version": "128", "rows": 3,
                   "lcp_measured": 3, "lcp_p75_ms": 3000, "cls_measured": 0, "cls_p75": null}),
                json!({"browser": "Mobile Safari", "browser_version": "17", "rows": 2,
                   "lcp_measured": 0, "lcp_p75_ms": null, "inp_measured": 0,
                   "inp_p75_ms": null, "cls_measured": 0, "cls_p75": null}),
                json!({"browser": "Mobile Safari", "browser_version": "16", "rows": 1,
                   "lcp_measured": 0, "lcp_p75_ms": null}),
            ],
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_dashboard_queries_answer_what_the_beacons_say() {
    let env = TestEnv::new(Stack::shared()).await;
    // The shop samples half of its page views: every row stands for two.
    env.add_site(
        "shop",
        &[
            "--sample-rate",
            "0.5",
            "--page-group",
            PAGE_GROUP_RULE,
            "--dimension",
            "variant",
        ],
    );
    let c1 = env.collector(&[]).await;
    let c2 = env.collector(&[]).await;

    // Noon UTC three and two days ago: `ts` must be within the contract's 7 days of skew.
    let first_day = (now_ms() / DAY_MS - 3) * DAY_MS;
    let mut ids = Vec::new();
    for (i, &(day, ua, path, lcp, inp, cls)) in SHOP.iter().enumerate() {
        let (id, mut m) = measurement("shop");
        m["ts"] = json!(first_day + day * DAY_MS + DAY_MS / 2);
        m["url"] = json!(format!("https://shop.example{path}"));
        m["lcp_ms"] = json!(lcp);
        m["inp_ms"] = json!(inp);
        m["cls"] = json!(cls);
        with_extras(i, &mut m);
        let headers = [("Content-Type", "application/json"), ("User-Agent", ua)];
        let (s, a, _) = c1.post(m.to_string(), &headers).await;
        assert_eq!(s, 202, "{a}");
        assert_eq!(a["dropped_fields"], json!([]), "{a}");
        if RESENT.contains(&i) {
            let (s, a, _) = c2.post(m.to_string(), &headers).await;
            assert_eq!(s, 202, "{a}");
        }
        ids.push(id);
    }
    // Another shop's page view in the same range, with numbers that would show if it leaked.
    let (other, mut m) = measurement(&env.site);
    m["ts"] = json!(first_day + DAY_MS / 2);
    m["lcp_ms"] = json!(9999);
    let (s, a, _) = c2
        .post(
            m.to_string(),
            &[
                ("Content-Type", "application/json"),
                ("User-Agent", ANDROID),
            ],
        )
        .await;
    assert_eq!(s, 202, "{a}");
    ids.push(other);
    env.wait_rows(&ids, VISIBLE).await;
    assert_eq!(
        env.count("WHERE site = 'shop'").await,
        (SHOP.len() + RESENT.len()) as i64,
        "the resends are stored as rows of their own until they fold"
    );

    let day = |d: i64| utc_date((first_day + d * DAY_MS) / 1000);
    let (d0, d1, d2) = (day(0), day(1), day(2));
    let params = [
        ("site", "'shop'".to_owned()),
        ("from", format!("toDateTime('{d0} 00:00:00', 'UTC')")),
        ("to", format!("toDateTime('{d2} 00:00:00', 'UTC')")),
        ("min_page_views", "2".to_owned()),
        ("dimension", "'variant'".to_owned()),
    ];
    for (name, expected) in expected_answers(&d0, &d1) {
        let sql = bind(&documented(name), &env.db, &params);
        assert_rows(name, &rows_of(&env, &sql).await, &expected);
    }
}

/// The device columns intake derives from each user agent of [`SHOP`] (checked against
/// the collector by the 18.16 test, whose rows come through intake).
fn derived(ua: &str) -> (&'static str, &'static str, &'static str) {
    match ua {
        IPHONE => ("mobile", "Mobile Safari", "17"),
        IPAD => ("tablet", "Mobile Safari", "16"),
        ANDROID => ("mobile", "Chrome Mobile", "131"),
        CHROME => ("desktop", "Chrome", "131"),
        FIREFOX => ("desktop", "Firefox", "128"),
        GOOGLEBOT => ("bot", "Googlebot", "2"),
        other => panic!("no derived columns for {other}"),
    }
}

/// Posts `body` to the 26.x server at `url` with query `params`; panics with its answer
/// unless it is 200 without an exception (26.x may report one at the end of a 200 body).
async fn ch26(url: &str, body: String, params: &[(&str, String)]) -> String {
    let resp = http()
        .post(url)
        .query(params)
        .body(body.clone())
        .send()
        .await
        .expect("the 26.x server answers");
    let status = resp.status();
    let code = resp.headers().get("x-clickhouse-exception-code").cloned();
    let text = resp.text().await.expect("an answer body");
    assert!(
        status.is_success() && code.is_none() && !text.contains("__exception__"),
        "{body}\n{status} {code:?}: {text}"
    );
    text
}

/// The same rows written straight into the v2 table on a real ClickHouse 26.x server (the
/// single-server form that `collector migrate` creates with `COLLECTOR_CLICKHOUSE_TABLE_FORM=single`),
/// resends as inserts of their own, `page_view_at` left to its DEFAULT: every documented query
/// runs with its parameters bound by the server (`param_…`), as written, and answers as on 18.16.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_queries_bind_their_parameters_on_clickhouse_26() {
    let url = Stack::shared().ch26_url();
    let version = ch26(&url, "SELECT version()".into(), &[]).await;
    assert!(version.starts_with("26."), "{version}");
    // The single-server form, as `collector migrate` creates it there.
    let env = TestEnv::empty_on_ch26(Stack::shared()).await;
    env.cli(&["migrate"]).success();
    let db = env.db.clone();
    let first_day = (now_ms() / DAY_MS - 3) * DAY_MS;
    insert_the_shop_on_26(&url, &db, first_day).await;

    let defaults = ch26(
        &url,
        format!(
            "SELECT count() FROM {db}.measurements WHERE page_view_at != toDateTime(intDiv(ts, 1000), 'UTC') FORMAT TSV"
        ),
        &[],
    )
    .await;
    assert_eq!(
        defaults.trim(),
        "0",
        "page_view_at's DEFAULT is the page view's start"
    );

    let day = |d: i64| utc_date((first_day + d * DAY_MS) / 1000);
    let (d0, d1, d2) = (day(0), day(1), day(2));
    let params = [
        ("param_site", "shop".to_owned()),
        ("param_from", format!("{d0} 00:00:00")),
        ("param_to", format!("{d2} 00:00:00")),
        ("param_min_page_views", "2".to_owned()),
        ("param_dimension", "variant".to_owned()),
    ];
    for (name, expected) in expected_answers(&d0, &d1) {
        let sql = documented(name).replace("collector.measurements", &format!("{db}.measurements"));
        let text = ch26(&url, format!("{sql} FORMAT JSON"), &params).await;
        let answer: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        let got = answer["data"]
            .as_array()
            .unwrap_or_else(|| panic!("no data in {text}"));
        assert_rows(name, got, &expected);
    }
    ch26(&url, format!("DROP DATABASE {db}"), &[]).await;
}

/// [`SHOP`]'s page views inserted into database `db` of the 26.x server `url` as the collector
/// writes them, from the day starting at `first_day` (ms); each of [`RESENT`] again, later, in
/// a batch of its own; and a page view of another site.
async fn insert_the_shop_on_26(url: &str, db: &str, first_day: i64) {
    let row = |i: usize, (day, ua, path, lcp, inp, cls): PageView| {
        let (device_type, browser, browser_version) = derived(ua);
        let (id, mut m) = measurement("shop");
        let ts = first_day + day * DAY_MS + DAY_MS / 2;
        m["ts"] = json!(ts);
        m["received_at"] = json!(ts / 1000 + 5);
        m["url"] = json!(format!("https://shop.example{path}"));
        m["lcp_ms"] = json!(lcp);
        m["inp_ms"] = json!(inp);
        m["cls"] = json!(cls);
        m["user_agent"] = json!(ua);
        m["sample_rate"] = json!(0.5);
        m["device_type"] = json!(device_type);
        m["browser"] = json!(browser);
        m["browser_version"] = json!(browser_version);
        with_extras(i, &mut m);
        derived_v4(i, path.split('?').next().unwrap(), &mut m);
        (id, m)
    };
    let insert = |rows: Vec<Value>| {
        let body = rows
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n");
        ch26(
            url,
            format!("INSERT INTO {db}.measurements FORMAT JSONEachRow\n{body}"),
            &[],
        )
    };
    let rows: Vec<Value> = SHOP.iter().enumerate().map(|(i, &v)| row(i, v).1).collect();
    insert(rows.clone()).await;
    // Each resend arrives later, in a batch of its own, with its own receipt time.
    for &i in &RESENT {
        let mut again = rows[i].clone();
        again["received_at"] = json!(as_i64(&again["received_at"]).unwrap() + 600);
        insert(vec![again]).await;
    }
    let (_, mut other) = row(usize::MAX, (0, ANDROID, "/", Some(9999.0), None, None));
    other["site"] = json!("another-shop");
    insert(vec![other]).await;
}

#[test]
fn bind_replaces_every_parameter_and_refuses_an_unbound_one() {
    let sql = "SELECT 1 FROM collector.measurements WHERE site = {site:String} AND a >= {from:DateTime} AND b < {from:DateTime}";
    assert_eq!(
        bind(sql, "t1", &[("site", "'s'".into()), ("from", "x".into())]),
        "SELECT 1 FROM t1.measurements WHERE site = 's' AND a >= x AND b < x"
    );
    let unbound = std::panic::catch_unwind(|| bind(sql, "t1", &[("site", "'s'".into())]));
    assert!(unbound.is_err());
}

/// Issue 26: the documented attribution queries (`lcp_causes`, `inp_causes`, `cls_causes`)
/// answer what the beacons' attribution says, per page and element, leaving out bots and page
/// views that did not measure the metric. Percentiles of two values interpolate linearly
/// (ClickHouse's `quantile`: p75 of 1000 and 2000 is 1750).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_attribution_queries_say_what_to_fix() {
    let env = TestEnv::new(Stack::shared()).await;
    env.cli(&["sites", "add", "--key", "fix"]).success();
    let c = env.collector(&[]).await;
    let day0 = (now_ms() / DAY_MS - 1) * DAY_MS;
    let ids = send_attribution_beacons(&c, day0).await;
    env.wait_rows(&ids, VISIBLE).await;
    let d0 = utc_date(day0 / 1000);
    let d1 = utc_date((day0 + DAY_MS) / 1000);
    let params = [
        ("site", "'fix'".to_owned()),
        ("from", format!("toDateTime('{d0} 00:00:00', 'UTC')")),
        ("to", format!("toDateTime('{d1} 00:00:00', 'UTC')")),
    ];
    let expected = attribution_answers();
    for (name, rows) in expected {
        let sql = bind(&documented(name), &env.db, &params);
        assert_rows(name, &rows_of(&env, &sql).await, &rows);
    }
}

/// Four beacons of site `fix` on the day starting at `day0` (ms), with attribution: two of
/// `/product` (the hero image), a text LCP of `/cart`, and a crawler's; their ids.
async fn send_attribution_beacons(c: &Collector, day0: i64) -> Vec<String> {
    let hero = json!({"lcp_target": "main>img.hero", "lcp_url": "https://cdn.example/hero.jpg",
        "inp_target": "#add", "inp_type": "pointer", "inp_script_url": "https://shop.example/app.js",
        "cls_target": "main>img.hero"});
    let beacons = [
        (
            CHROME,
            "/product",
            json!({"ttfb_ms": 200, "lcp_ms": 2000, "lcp_resource_load_delay_ms": 600,
            "lcp_resource_load_duration_ms": 400, "lcp_element_render_delay_ms": 800, "inp_ms": 300,
            "inp_input_delay_ms": 20, "inp_processing_duration_ms": 250, "inp_presentation_delay_ms": 30,
            "cls": 0.2, "cls_value": 0.15, "cls_time_ms": 1200}),
        ),
        (
            ANDROID,
            "/product",
            json!({"ttfb_ms": 100, "lcp_ms": 1000, "lcp_resource_load_delay_ms": 300,
            "lcp_resource_load_duration_ms": 200, "lcp_element_render_delay_ms": 400, "inp_ms": 100,
            "inp_input_delay_ms": 10, "inp_processing_duration_ms": 80, "inp_presentation_delay_ms": 10,
            "cls": 0.1, "cls_value": 0.1, "cls_time_ms": 1000}),
        ),
        // Text LCP (no resource), no interaction, no shift.
        (
            FIREFOX,
            "/cart",
            json!({"ttfb_ms": 100, "lcp_ms": 500, "lcp_target": "main>h1",
            "lcp_resource_load_delay_ms": 0, "lcp_resource_load_duration_ms": 0,
            "lcp_element_render_delay_ms": 400, "cls": 0}),
        ),
        // A crawler's numbers, which would show if bots were counted.
        (
            GOOGLEBOT,
            "/product",
            json!({"lcp_ms": 9000, "inp_ms": 9000, "cls": 9}),
        ),
    ];
    let mut ids = Vec::new();
    for (i, (ua, path, fields)) in beacons.iter().enumerate() {
        let (id, mut m) = measurement("fix");
        for key in [
            "ttfb_ms",
            "fcp_ms",
            "lcp_ms",
            "inp_ms",
            "cls",
            "load_ms",
            "dom_content_loaded_ms",
        ] {
            m.as_object_mut().unwrap().remove(key);
        }
        m["ts"] = json!(day0 + DAY_MS / 2 + i as i64);
        m["url"] = json!(format!("https://shop.example{path}"));
        if i < 2 {
            for (k, v) in hero.as_object().unwrap() {
                m[k] = v.clone();
            }
        }
        for (k, v) in fields.as_object().unwrap() {
            m[k] = v.clone();
        }
        let headers = [("Content-Type", "application/json"), ("User-Agent", *ua)];
        let (s, a, _) = c.post(m.to_string(), &headers).await;
        assert_eq!(s, 202, "{a}");
        assert_eq!(a["dropped_fields"], json!([]), "{a}");
        ids.push(id);
    }
    ids
}

/// What each documented attribution query must answer for [`send_attribution_beacons`]'s
/// beacons, worked out by hand (the crawler's not counted).
fn attribution_answers() -> [(&'static str, Vec<Value>); 3] {
    [
        (
            "lcp_causes",
            vec![
                json!({"page": "/product", "lcp_target": "main>img.hero", "lcp_url": "https://cdn.example/hero.jpg",
                    "page_views": 2, "lcp_p75_ms": 1750, "ttfb_avg_ms": 150, "load_delay_avg_ms": 450,
                    "load_duration_avg_ms": 300, "render_delay_avg_ms": 600}),
                json!({"page": "/cart", "lcp_target": "main>h1", "lcp_url": null, "page_views": 1,
                    "lcp_p75_ms": 500, "ttfb_avg_ms": 100, "load_delay_avg_ms": 0,
                    "load_duration_avg_ms": 0, "render_delay_avg_ms": 400}),
            ],
        ),
        (
            "inp_causes",
            vec![json!({"inp_target": "#add", "inp_type": "pointer",
                "inp_script_url": "https://shop.example/app.js", "page_views": 2, "inp_p75_ms": 250,
                "input_delay_avg_ms": 15, "processing_avg_ms": 165, "presentation_avg_ms": 20})],
        ),
        (
            "cls_causes",
            vec![
                json!({"page": "/product", "cls_target": "main>img.hero", "page_views": 2,
                "cls_p75": 0.175, "largest_shift_avg": 0.125, "shift_time_median_ms": 1100}),
            ],
        ),
    ]
}
