//! ClickHouse 26.x servers as two unreplicated shards.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ch26_servers_as_two_unreplicated_shards_store_each_site_on_its_own() {
    let (_turn, stack, env) = take_turn().await;
    let shards = parse_shards(&stack_value(stack, "CH26_SHARDS"));
    assert_eq!(shards.len(), 2, "two 26.x servers: {shards:?}");
    let s = setting(&shards);
    let extra = [
        ("COLLECTOR_CLICKHOUSE_TABLE_FORM", "single"),
        (
            "COLLECTOR_CLICKHOUSE_CLUSTER",
            stack_value(stack, "CH26_CLUSTER").leak() as &str,
        ),
    ];
    cli(&env, &s, &extra, &["migrate"]).success();
    let (a, b) = (shards[0].0.as_str(), shards[1].0.as_str());
    cli(
        &env,
        &s,
        &extra,
        &["sites", "add", "--key", "x.a", "--shard", a],
    )
    .success();
    cli(
        &env,
        &s,
        &extra,
        &["sites", "add", "--key", "x.b", "--shard", b],
    )
    .success();
    let c = Collector::start_with_env(settings(&env, &s, &extra), env.diag.clone()).await;
    let mut log = Vec::new();
    for _ in 0..20 {
        log.push(post(&c.url, "x.a", None).await);
        log.push(post(&c.url, "x.b", None).await);
    }
    assert!(log.iter().all(|x| x.status == 202), "{:?}", statuses(&log));
    let home = HashMap::from([("x.a", 0), ("x.b", 1)]);
    wait_placed(&env, &shards, &home, &log, Duration::from_secs(30)).await;
    for (name, urls) in &shards {
        let sql = format!("SELECT count() AS n FROM {}.measurements_all FINAL", env.db);
        let rows = env_query(&urls[0], &sql).await;
        assert_eq!(
            as_i64(col(&rows[0], "n")),
            Some(40),
            "measurements_all on {name}"
        );
    }
}
