//! The sample rate served and stored; `migrate` adds it to an existing table.

use super::*;

/// Issue 13, kind 8 (server side): the site's `sample_rate` is served to the script and stored
/// with each measurement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sample_rate_is_served_and_stored() {
    let env = TestEnv::new(Stack::shared()).await;
    env.add_site("sampled", &["--sample-rate", "0.25"]);
    env.add_site("off", &["--disabled"]);
    let c = env.collector(&[]).await;
    let r = http_get(format!("{}/api/v1/sites/sampled", c.url)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["access-control-allow-origin"], "*");
    // 5 s, not 60, while this collector has not measured the site yet (its first 10 s,
    // contract v4 "A site over its budget"); the in-process tier sees the 60 after it.
    assert_eq!(r.headers()["cache-control"], "public, max-age=5");
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"site": "sampled", "sample_rate": 0.25})
    );
    let r = http_get(format!("{}/api/v1/sites/off", c.url)).await;
    assert_eq!(r.status(), 404, "a disabled site");

    let (sampled, m) = measurement("sampled");
    let (default, d) = measurement(&env.site);
    assert_eq!(c.post_json(&json!([m, d])).await.0, 202);
    let rows = env
        .wait_rows(&[sampled.clone(), default.clone()], VISIBLE)
        .await;
    assert_eq!(stored(&rows, &sampled, "sample_rate"), 0.25);
    assert_eq!(stored(&rows, &default, "sample_rate"), 1.0);
}

/// `collector migrate` adds the `sample_rate` column to a table created by the release before
/// it, on every replica (ClickHouse 18.16 has no `ADD COLUMN IF NOT EXISTS`), and stays
/// idempotent; rows then carry the rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_adds_sample_rate_to_an_existing_table() {
    let env = TestEnv::new(Stack::shared()).await;
    // A ClickHouse database of its own, so that its ZooKeeper path is fresh.
    let old_db = format!("{}_old", env.db);
    let urls = env.clickhouse.clone();
    // The old release's table, in the form this run's servers take.
    let old_table = match env.table_form {
        "single" => OLD_TABLE.replace(
            "ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/measurements', '{replica}')",
            "ReplacingMergeTree",
        ),
        _ => OLD_TABLE.to_owned(),
    };
    for url in &urls {
        clickhouse_exec(url, &format!("CREATE DATABASE {old_db}"))
            .await
            .unwrap();
        clickhouse_exec(url, &old_table.replace("{database}", &old_db))
            .await
            .unwrap();
    }
    let migrate = || {
        std::process::Command::new(collector_bin())
            .arg("migrate")
            .envs(env.collector_env())
            .env("COLLECTOR_CLICKHOUSE_DATABASE", &old_db)
            .output()
            .unwrap()
    };
    for run in 0..2 {
        let out = migrate();
        assert!(
            out.status.success(),
            "run {run}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for url in &urls {
        let cols = clickhouse_query(
            url,
            &format!(
                "SELECT type, default_expression FROM system.columns \
                 WHERE database = '{old_db}' AND table = 'measurements' AND name = 'sample_rate'"
            ),
        )
        .await
        .unwrap();
        assert_eq!(cols.len(), 1, "{url}: {cols:?}");
        assert_eq!(col(&cols[0], "type"), "Float64");
    }
    let c = env
        .collector(&[("COLLECTOR_CLICKHOUSE_DATABASE", &old_db)])
        .await;
    let (id, m) = measurement(&env.site);
    assert_eq!(c.post_json(&m).await.0, 202);
    let sql = format!("SELECT sample_rate FROM {old_db}.measurements FINAL WHERE id = '{id}'");
    let start = std::time::Instant::now();
    loop {
        let rows = env.query(0, &sql).await;
        if let Some(r) = rows.first() {
            assert_eq!(col(r, "sample_rate"), 1.0);
            break;
        }
        if start.elapsed() >= VISIBLE {
            env.diag
                .give_up(format!("{id} never visible in {old_db}"))
                .await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The measurements table as the release before `sample_rate` created it.
const OLD_TABLE: &str = "CREATE TABLE {database}.measurements
(
    id UUID, site String, received_at DateTime, url String, ts Nullable(Int64),
    referrer Nullable(String), navigation_type Nullable(String), ttfb_ms Nullable(Float64),
    fcp_ms Nullable(Float64), lcp_ms Nullable(Float64), inp_ms Nullable(Float64),
    dom_content_loaded_ms Nullable(Float64), load_ms Nullable(Float64), cls Nullable(Float64),
    viewport_width Nullable(UInt32), effective_connection_type Nullable(String), user_agent String
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/measurements', '{replica}')
PARTITION BY toYYYYMM(received_at)
ORDER BY id";
