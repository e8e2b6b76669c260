//! `--compare` and `--deploy`: two releases, one slower, and the same release twice.

use super::*;

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

/// Two releases the site never sent, and a deploy after every row: both sides empty is "not
/// measured" on both sides, exit 0, not a server that did not answer.
fn an_empty_comparison_has_no_data(env: &TestEnv<'_>) {
    for args in [
        ["--compare", "release=998,999"],
        ["--deploy", "2030-01-01T00:00:00Z"],
    ] {
        let report = report_json(env, "shop", &args);
        for m in field(&report, "metrics").as_array().unwrap() {
            for side in ["a", "b"] {
                assert_eq!(field(field(m, side), "measured"), 0, "{args:?}: {m}");
            }
            assert!(field(m, "difference").is_null(), "{args:?}: {m}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_finds_the_slower_release_on_clickhouse_18() {
    let env = TestEnv::new(Stack::shared()).await;
    compare_finds_the_slower_release(&env).await;
    an_empty_comparison_has_no_data(&env);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_finds_the_slower_release_on_clickhouse_26() {
    let env = TestEnv::on_ch26(Stack::shared()).await;
    compare_finds_the_slower_release(&env).await;
    an_empty_comparison_has_no_data(&env);
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
