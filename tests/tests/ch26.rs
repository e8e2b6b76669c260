//! The whole path on a real ClickHouse 26.x server (issue 23): `migrate` in the single-server
//! table form, beacons to rows, two collectors' tokens, a refused batch bisected by a real
//! `CHECK` constraint, and an INSERT that fails after storing part of its rows.
//!
//! The server is the stack's (`scripts/stack.sh up --ch26`): ClickHouse 26.9 from the PyPI
//! package chdb-core, its clickhouse-local listening on HTTP (`scripts/ch26/server.py`). It
//! cannot replicate, so the table is the single-server form (a `ReplacingMergeTree` with
//! `non_replicated_deduplication_window`), and what is replication-specific stays on the 18.16
//! replicas (`failover.rs`, `shape.rs`).
//!
//! Asynchronous inserts cannot be shown on this server: clickhouse-local lists `async_insert=1`
//! as its default but does not queue inserts (an INSERT with `async_insert=1` and a 5 s busy
//! timeout returned in 30 ms, its row there at once). The collector turns them off for its own
//! inserts on every server that knows tokens (`writer::replicas`).

use collector_tests::common;

use std::time::Duration;

use common::*;
use serde_json::Value;

/// How long acknowledged rows may take to appear.
const STORED: Duration = Duration::from_secs(60);

/// Starts a collector on `env` with `extra` settings and waits until it counts the 26.x
/// server healthy.
async fn collector(env: &TestEnv<'_>, extra: &[(&str, &str)]) -> Collector {
    let c = env.collector(extra).await;
    let url = &env.clickhouse[0];
    c.wait_metric(
        &format!("collector_clickhouse_replica_state{{replica=\"{url}\",shard=\"default\"}} 2"),
        STORED,
    )
    .await;
    c
}

/// How many rows the test's table holds before `FINAL` folds them.
async fn rows_before_final(env: &TestEnv<'_>) -> Option<i64> {
    count_of(
        env,
        &format!("SELECT count() AS n FROM {}.measurements", env.db),
    )
    .await
}

/// How many rows the test's table holds for the test's site before `FINAL` folds them.
async fn site_rows_before_final(env: &TestEnv<'_>) -> Option<i64> {
    let sql = format!(
        "SELECT count() AS n FROM {}.measurements WHERE site = '{}'",
        env.db, env.site
    );
    count_of(env, &sql).await
}

/// The count `n` that `sql` (one row) answers.
async fn count_of(env: &TestEnv<'_>, sql: &str) -> Option<i64> {
    as_i64(col(&one_row(env, sql).await, "n"))
}

/// The row of `sql` (one row expected), failing loudly when there is none.
async fn one_row(env: &TestEnv<'_>, sql: &str) -> Value {
    let rows = env.query(0, sql).await;
    assert_eq!(rows.len(), 1, "{sql}: {rows:?}");
    rows[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_creates_the_single_server_form_on_clickhouse_26() {
    let stack = Stack::shared();
    let env = TestEnv::empty_on_ch26(stack).await;
    let version = one_row(&env, "SELECT version() AS v").await;
    assert!(
        col(&version, "v").as_str().unwrap().starts_with("26."),
        "{version}"
    );

    // The default form needs replication; this server has none, and migrate says what to do.
    let replicated = env.cli_with(
        &[("COLLECTOR_CLICKHOUSE_TABLE_FORM", "replicated")],
        &["migrate"],
    );
    assert_ne!(replicated.code, 0, "{}", replicated.stdout);
    assert!(
        replicated
            .stderr
            .contains("set COLLECTOR_CLICKHOUSE_TABLE_FORM=single"),
        "{}",
        replicated.stderr
    );

    for _ in 0..2 {
        let out = env.cli(&["migrate"]);
        out.success();
        assert!(
            out.stdout.contains("schema applied (single form)"),
            "{}",
            out.stdout
        );
    }
    let table = one_row(
        &env,
        &format!(
            "SELECT engine, sorting_key, partition_key, create_table_query FROM system.tables \
             WHERE database = '{}' AND name = 'measurements'",
            env.db
        ),
    )
    .await;
    assert_eq!(col(&table, "engine"), "ReplacingMergeTree", "{table}");
    assert_eq!(col(&table, "sorting_key"), "site, toDate(page_view_at), id");
    assert_eq!(col(&table, "partition_key"), "toYYYYMM(page_view_at)");
    assert!(
        col(&table, "create_table_query")
            .as_str()
            .unwrap()
            .contains("non_replicated_deduplication_window = 1000"),
        "{table}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beacons_become_one_row_each_on_clickhouse_26() {
    let stack = Stack::shared();
    let env = TestEnv::on_ch26(stack).await;
    let c = collector(&env, &[]).await;
    let mut sent = Vec::new();
    for _ in 0..4 {
        let batch: Vec<(String, Value)> = (0..5).map(|_| measurement(&env.site)).collect();
        let body = Value::Array(batch.iter().map(|(_, m)| m.clone()).collect());
        let (status, answer) = c.post_json(&body).await;
        assert_eq!(
            (status, answer["accepted"].as_u64()),
            (202, Some(5)),
            "{answer}"
        );
        sent.extend(batch);
    }
    let ids: Vec<String> = sent.iter().map(|(id, _)| id.clone()).collect();
    let rows = env.wait_rows(&ids, STORED).await;
    assert_eq!(rows.len(), 20);
    for row in &rows {
        let (_, m) = sent.iter().find(|(id, _)| col(row, "id") == id).unwrap();
        for name in ["site", "navigation_type", "effective_connection_type"] {
            assert_eq!(col(row, name), field(m, name), "{name} of {row}");
        }
        // Minimised (contract v4 §2): the query keeps only utm_*, a referrer from another site
        // its origin.
        assert_eq!(col(row, "url"), "https://shop.example/product/1", "{row}");
        assert_eq!(col(row, "referrer"), "https://search.example", "{row}");
        for name in [
            "ttfb_ms",
            "fcp_ms",
            "lcp_ms",
            "inp_ms",
            "cls",
            "dom_content_loaded_ms",
            "load_ms",
            "viewport_width",
        ] {
            let stored = col(row, name)
                .as_f64()
                .unwrap_or_else(|| panic!("{name} not stored as a number: {row}"));
            assert_eq!(stored, field(m, name).as_f64().unwrap(), "{name} of {row}");
        }
    }
    assert_eq!(
        rows_before_final(&env).await,
        Some(20),
        "one row per id, before FINAL"
    );
    assert!(
        c.logs().contains("measurements is not replicated here"),
        "the collector says there is no catch-up to gate on:\n{}",
        c.logs()
    );
}

/// Two fresh spools hold same-sized records at the same positions; the server folds an INSERT
/// whose token it has seen (checked first), so a token shared by the two collectors would drop
/// a row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_collectors_with_fresh_spools_never_share_a_token_on_clickhouse_26() {
    let stack = Stack::shared();
    let env = TestEnv::on_ch26(stack).await;
    let url = &env.clickhouse[0];
    // The table folds a repeated token: the second insert below stores nothing.
    let (first, mut row) = measurement("token-check");
    let (second, _) = measurement("token-check");
    for id in [&first, &second] {
        row["id"] = Value::String(id.clone());
        row["received_at"] = Value::from(now_ms() / 1000);
        let resp = http()
            .post(url)
            .query(&[
                (
                    "query",
                    format!("INSERT INTO {}.measurements FORMAT JSONEachRow", env.db),
                ),
                ("insert_deduplication_token", "the-same-token".into()),
                ("async_insert", "0".into()),
            ])
            .body(row.to_string())
            .send()
            .await
            .expect("the 26.x server answers");
        assert!(resp.status().is_success(), "{:?}", resp.text().await);
    }
    let folded = one_row(
        &env,
        &format!(
            "SELECT groupArray(toString(id)) AS ids FROM {}.measurements WHERE site = 'token-check'",
            env.db
        ),
    )
    .await;
    assert_eq!(
        col(&folded, "ids"),
        &serde_json::json!([first]),
        "a seen token stores nothing"
    );

    let settings = [("COLLECTOR_BATCH_MAX_AGE", "50ms")];
    let a = collector(&env, &settings).await;
    let b = collector(&env, &settings).await;
    let mut acked = Vec::new();
    for _ in 0..15 {
        let mut pair = Vec::new();
        for c in [&a, &b] {
            let (id, m) = measurement(&env.site);
            let (status, body) = c.post_json(&m).await;
            assert_eq!(status, 202, "{body}");
            pair.push(id);
        }
        // Each pair is stored before the next is sent, so the batches line up.
        env.wait_rows(&pair, STORED).await;
        acked.extend(pair);
    }
    env.assert_stored_once(&acked, STORED).await;
    assert_eq!(
        site_rows_before_final(&env).await,
        Some(30),
        "30 one-row batches, none folded"
    );
}

/// Sends 12 requests of 5 measurements, three of them for `check-refused`, which the table's
/// real `CHECK` constraint refuses (code 469), and checks that exactly those three are kept
/// aside and every other is stored once; the good rows, and their copies before `FINAL`.
/// `server`: a 26.x server of the test's own instead of the stack's.
async fn a_refused_batch_is_bisected(server: Option<&str>) -> (usize, usize) {
    refused_by(server, "site != 'check-refused'", "Code: 469").await
}

/// As [`a_refused_batch_is_bisected`], the rows refused by the constraint `check`, each kept
/// aside with a reason holding `code`.
async fn refused_by(server: Option<&str>, check: &str, code: &str) -> (usize, usize) {
    let stack = Stack::shared();
    let mut env = TestEnv::empty_on_ch26(stack).await;
    if let Some(url) = server {
        env.clickhouse = vec![url.to_owned()];
    }
    env.cli(&["migrate"]).success();
    env.cli(&["sites", "add", "--key", "site-1"]).success();
    env.cli(&["sites", "add", "--key", "check-refused"])
        .success();
    env.exec(
        0,
        &format!(
            "ALTER TABLE {}.measurements ADD CONSTRAINT refused CHECK {check}",
            env.db
        ),
    )
    .await;
    // Copies stay apart, so that what the refused inserts stored can be counted.
    env.exec(0, &format!("SYSTEM STOP MERGES {}.measurements", env.db))
        .await;
    // Long batches: every request below lands in one batch, refused as a whole.
    let c = collector(&env, &[("COLLECTOR_BATCH_MAX_AGE", "3s")]).await;
    let (mut good, mut bad) = (Vec::new(), Vec::new());
    for request in 0..12 {
        let mut items = Vec::new();
        for i in 0..5 {
            // Late in the batch, so that blocks of good rows come before each refused row.
            let refused = matches!((request, i), (5, 3) | (9, 0) | (11, 4));
            let (id, m) = measurement(if refused { "check-refused" } else { &env.site });
            if refused { &mut bad } else { &mut good }.push(id);
            items.push(m);
        }
        let (status, body) = c.post_json(&Value::Array(items)).await;
        assert_eq!(
            (status, body["accepted"].as_u64()),
            (202, Some(5)),
            "{body}"
        );
    }
    c.wait_metric("collector_spool_records 0", STORED).await;
    env.assert_stored_once(&good, STORED).await;
    assert!(env.rows(&bad).await.is_empty(), "a refused row was stored");

    let aside = c.spool.path().join("kept-aside");
    let mut kept = Vec::new();
    for entry in std::fs::read_dir(&aside).expect("a kept-aside folder") {
        let path = entry.unwrap().path();
        let file: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert!(
            file["reason"].as_str().unwrap().contains(code),
            "{path:?}: {file}"
        );
        for m in file["measurements"].as_array().unwrap() {
            kept.push(m["id"].as_str().unwrap().to_owned());
        }
    }
    kept.sort();
    bad.sort();
    assert_eq!(kept, bad, "exactly the refused rows are kept aside");
    assert_eq!(c.metric("collector_spool_kept_aside_rows_total").await, 3.0);
    let copies = site_rows_before_final(&env).await;
    (good.len(), copies.unwrap() as usize)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_batch_keeps_aside_only_its_refused_rows_on_clickhouse_26() {
    let (good, copies) = a_refused_batch_is_bisected(None).await;
    eprintln!("figures: 26.x refused batch: {good} good rows stored once under FINAL, {copies} copies before it");
    assert_eq!(
        copies, good,
        "with the default block sizes a refused insert stores nothing"
    );
}

/// With small insert blocks the server stores the blocks before the refused row and still
/// answers the refusal (measured on 26.9: 10 of 50 rows left by a refused insert in blocks of
/// 10): the bisection sends those rows again, and `FINAL` folds the copies. Small blocks are a
/// profile setting of a 26.x server of this test's own (the collector sends no such setting).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insert_that_stores_part_of_its_rows_before_failing_loses_nothing_on_clickhouse_26() {
    let server = Ch26Server::start(&[
        "max_insert_block_size=8",
        "min_insert_block_size_rows=8",
        "min_insert_block_size_bytes=0",
        "input_format_parallel_parsing=0",
    ])
    .await;
    let (good, copies) = a_refused_batch_is_bisected(Some(&server.url)).await;
    eprintln!("figures: 26.x partly stored insert: {good} good rows stored once under FINAL, {copies} copies before it");
    assert!(
        copies > good,
        "no refused insert stored part of its rows ({copies} copies of {good} rows): the test did not make the partial insert it means to"
    );
}

/// A batch whose answer is lost after the server stored it is sent again with the same token,
/// and the server folds the copy: one row per id before `FINAL` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_batch_is_folded_by_the_server_on_clickhouse_26() {
    let stack = Stack::shared();
    let mut env = TestEnv::on_ch26(stack).await;
    let proxy = common::lost_answer::LostAnswers::start(&env.clickhouse[0]).await;
    env.clickhouse = vec![proxy.url.clone()];
    let c = collector(&env, &[("COLLECTOR_BATCH_MAX_AGE", "50ms")]).await;
    env.exec(0, &format!("SYSTEM STOP MERGES {}.measurements", env.db))
        .await;
    let mut acked = Vec::new();
    for _ in 0..5 {
        proxy.lose_next_inserts(1);
        let (id, m) = measurement(&env.site);
        let (status, body) = c.post_json(&m).await;
        assert_eq!(status, 202, "{body}");
        env.wait_rows(std::slice::from_ref(&id), STORED).await;
        acked.push(id);
    }
    c.wait_metric("collector_spool_records 0", STORED).await;
    let (lost, inserts) = proxy.counts();
    assert_eq!(lost, 5, "one answer lost per batch ({inserts} inserts)");
    assert!(inserts >= 10, "each batch sent again: {inserts} inserts");
    env.assert_stored_once(&acked, STORED).await;
    assert_eq!(
        rows_before_final(&env).await,
        Some(5),
        "the server folded each resent batch by its token (merges stopped)"
    );
    eprintln!(
        "figures: 26.x lost answers: {lost} answers lost, {inserts} inserts, 5 rows before FINAL"
    );
}

/// `migrate` moves a v1 table (sorted by `id` alone; here in the single-server form) to v2 on
/// 26.x: 20,000 rows over four months and one id stored twice, unmerged, across midnight;
/// afterwards v2 has every v1 id once under `FINAL`, v1 is kept, and a collector writes to v2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_moves_a_v1_table_to_v2_on_clickhouse_26() {
    let env = TestEnv::empty_on_ch26(Stack::shared()).await;
    let db = env.db.clone();
    let v1 = std::fs::read_to_string(root().join("schema/clickhouse/v1/measurements.sql"))
        .expect("schema/clickhouse/v1/measurements.sql");
    let engine = v1
        .lines()
        .find(|l| l.starts_with("ENGINE = ReplicatedReplacingMergeTree("))
        .expect("v1's ENGINE line");
    env.exec(0, &format!("CREATE DATABASE {db}")).await;
    env.exec(
        0,
        &v1.replace(engine, "ENGINE = ReplacingMergeTree")
            .replace("{database}", &db),
    )
    .await;
    env.exec(0, &format!("SYSTEM STOP MERGES {db}.measurements"))
        .await;
    env.exec(
        0,
        &format!(
            "INSERT INTO {db}.measurements (id, site, received_at, url, ts, user_agent) \
             SELECT generateUUIDv4(), concat('site-', toString(number % 50)), \
             toUInt32(1788000000 + intDiv(number, 5000) * 2678400 + number % 5000), \
             'https://shop.example/', if(number % 4 = 0, NULL, toInt64(1788000000 + intDiv(number, 5000) * 2678400 + number % 5000) * 1000), \
             'Mozilla/5.0' FROM system.numbers LIMIT 20000"
        ),
    )
    .await;
    let unmerged = uuid::Uuid::new_v4().to_string();
    for at in [1_792_022_390, 1_792_022_420] {
        env.exec(
            0,
            &format!(
                "INSERT INTO {db}.measurements (id, site, received_at, url, ts, user_agent) \
                 VALUES ('{unmerged}', 'site-0', {at}, 'https://shop.example/', NULL, 'Mozilla/5.0')"
            ),
        )
        .await;
    }
    let out = env.cli(&["migrate"]);
    out.success();
    assert!(
        out.stdout
            .contains("measurements_v1 copied into measurements: 20001 rows in 4 months, 20001 copied now, 0 there already"),
        "{}",
        out.stdout
    );
    let counts = one_row(
        &env,
        &format!(
            "SELECT (SELECT count() FROM {db}.measurements FINAL) AS v2, \
             (SELECT uniqExact(id) FROM {db}.measurements) AS ids, \
             (SELECT count() FROM {db}.measurements_v1) AS v1, \
             (SELECT count() FROM {db}.measurements_v1 AS o WHERE o.id NOT IN (SELECT id FROM {db}.measurements)) AS missing, \
             (SELECT engine FROM system.tables WHERE database = '{db}' AND name = 'measurements') AS engine"
        ),
    )
    .await;
    assert_eq!(as_i64(col(&counts, "v2")), Some(20001), "{counts}");
    assert_eq!(as_i64(col(&counts, "ids")), Some(20001), "{counts}");
    assert_eq!(
        as_i64(col(&counts, "v1")),
        Some(20002),
        "v1 kept as it was: {counts}"
    );
    assert_eq!(as_i64(col(&counts, "missing")), Some(0), "{counts}");
    assert_eq!(col(&counts, "engine"), "ReplacingMergeTree", "{counts}");

    env.cli(&["sites", "add", "--key", "site-1"]).success();
    let c = collector(&env, &[]).await;
    let mut acked = Vec::new();
    for _ in 0..10 {
        let (id, m) = measurement(&env.site);
        assert_eq!(c.post_json(&m).await.0, 202);
        acked.push(id);
    }
    env.assert_stored_once(&acked, STORED).await;
}

/// A constraint that throws for a row (`throwIf`, code 395) instead of being false is bad data
/// too: before it was classified so, one such row held every batch behind it, retried for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_a_constraint_throws_for_is_kept_aside_on_clickhouse_26() {
    let (good, copies) = refused_by(None, "throwIf(site = 'check-refused') = 0", "Code: 395").await;
    assert_eq!(copies, good, "{copies} copies of {good} rows");
}
