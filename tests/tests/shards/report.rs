//! `collector report` and a fleet query agree with the site's shard.

use super::*;

/// The report of `site`, in JSON; panics unless it exits 0.
fn report(env: &TestEnv<'_>, shards: &str, site: &str) -> Value {
    let out = cli(
        env,
        shards,
        &[],
        &["report", "--site", site, "--format", "json"],
    );
    out.success();
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

/// Page views and the LCP p75 summed over the report's groups (one group here).
fn report_figures(report: &Value) -> (f64, Option<f64>) {
    let groups = field(report, "groups")
        .as_array()
        .expect("groups is a list");
    assert_eq!(groups.len(), 1, "one device type: {report}");
    let g = &groups[0];
    let lcp = field(g, "metrics")
        .as_array()
        .unwrap()
        .iter()
        .find(|m| field(m, "metric").as_str().unwrap().contains("lcp"))
        .unwrap_or_else(|| panic!("no LCP figures: {g}"));
    (
        as_number(field(g, "page_views")).unwrap(),
        as_number(field(lcp, "p75")),
    )
}

const P75: &str = "quantileExactWeighted(0.75)(lcp_ms, toUInt64(round(1000 / sample_rate)))";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_and_a_fleet_query_agree_with_the_sites_shard() {
    let (_turn, stack, env) = take_turn().await;
    let shards = shards_of(stack);
    let s = setting(&shards);
    cli(&env, &s, &[], &["migrate"]).success();
    add_sites(&env, &s, &[("rep.a", "shard1"), ("rep.b", "shard2")]);
    let c = Collector::start_with_env(settings(&env, &s, &[]), env.diag.clone()).await;
    let mut log = Vec::new();
    // 120: a report shows a metric's figures from 100 page views on (contract v5 §1).
    for i in 0..120 {
        log.push(post(&c.url, "rep.b", Some(400.0 + 97.0 * i as f64)).await);
    }
    for i in 0..10 {
        log.push(post(&c.url, "rep.a", Some(9000.0 + i as f64)).await);
    }
    assert!(log.iter().all(|x| x.status == 202), "{:?}", statuses(&log));
    let home = HashMap::from([("rep.a", 0), ("rep.b", 1)]);
    wait_placed(&env, &shards, &home, &log, Duration::from_secs(30)).await;

    let shard2 = &shards[1].1[0];
    let direct = env_query(
        shard2,
        &format!(
            "SELECT sum(1 / sample_rate) AS pv, {P75} AS p75 FROM {}.measurements FINAL \
             WHERE site = 'rep.b' AND device_type != 'bot' AND sample_rate > 0",
            env.db
        ),
    )
    .await;
    let (pv, p75) = (
        as_number(col(&direct[0], "pv")).unwrap(),
        as_number(col(&direct[0], "p75")),
    );
    let r = report(&env, &s, "rep.b");
    println!("report: {r}");
    assert_eq!(
        field(&r, "server").as_str(),
        Some(shard2.as_str()),
        "read from shard2's first replica"
    );
    let (rpv, rp75) = report_figures(&r);
    assert!(
        (rpv - pv).abs() < 1e-9 && pv == 120.0,
        "page views: report {rpv}, shard2 {pv}"
    );
    assert_eq!(rp75, p75, "LCP p75: report, shard2");

    // The fleet's table, read on a shard1 server, and shard2's own table agree.
    let fleet = |table: &str| {
        format!(
            "SELECT count() AS n, {P75} AS p75 FROM {}.{table} FINAL WHERE site = 'rep.b' \
             AND page_view_at >= now() - INTERVAL 7 DAY AND device_type != 'bot'",
            env.db
        )
    };
    let all = env_query(&shards[0].1[0], &fleet("measurements_all")).await;
    let own = env_query(shard2, &fleet("measurements")).await;
    println!("through measurements_all on shard1: {all:?}; shard2 alone: {own:?}");
    assert_eq!(as_i64(col(&all[0], "n")), Some(120));
    assert_eq!(
        as_number(col(&all[0], "p75")),
        as_number(col(&own[0], "p75"))
    );
    assert_eq!(as_number(col(&own[0], "p75")), p75);

    // Shard1 down: shard2's site is still reported, shard1's is not.
    let t0 = Instant::now();
    for i in servers_of(stack, 1) {
        act(stack, t0, "stop", i);
    }
    let r = report(&env, &s, "rep.b");
    assert_eq!(
        report_figures(&r),
        (rpv, rp75),
        "the report with shard1 down: {r}"
    );
    let out = cli(
        &env,
        &s,
        &[],
        &["report", "--site", "rep.a", "--format", "json"],
    );
    println!(
        "rep.a with shard1 down: exit {}: {}",
        out.code,
        out.stderr.trim()
    );
    assert_ne!(
        out.code, 0,
        "shard1's site has no report while shard1 is down: {}",
        out.stdout
    );
}
