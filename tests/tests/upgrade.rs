//! An upgrade over a spool of the release before RowBinary spools (issue 14).
//!
//! `tests/fixtures/spool-v1/` is a spool folder written by that release (git 819a3b7): 40
//! measurements in 12 requests, never delivered (its ClickHouse was unreachable), in the JSON
//! format behind the `CSPOOL01` magic. `tests/fixtures/make-spool.sh` says how it was
//! made. This release must deliver every one of them, with its values, and go on in its own
//! format; `collector spool dump` must list them before that.

use collector_tests::common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::Value;

/// The ids in the fixture's segments, read from the JSON text (independently of the
/// collector's decoder).
fn fixture_ids(dir: &Path) -> Vec<String> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(dir.join("segments")).unwrap() {
        let data = std::fs::read(entry.unwrap().path()).unwrap();
        let text = String::from_utf8_lossy(&data);
        for part in text.split("\"id\":\"").skip(1) {
            ids.push(part[..36].to_owned());
        }
    }
    assert_eq!(ids.len(), 40, "the fixture holds 40 measurements");
    ids
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A copy, in a new temporary folder, of the fixture spool `tests/fixtures/NAME`, and the ids
/// it holds (its `sent-ids` file); asserts there are 40.
fn fixture_spool(name: &str) -> (Vec<String>, tempfile::TempDir) {
    let fixture = root().join("tests/fixtures").join(name);
    let ids: Vec<String> = std::fs::read_to_string(fixture.join("sent-ids"))
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(ids.len(), 40, "the fixture holds 40 measurements");
    let spool = tempfile::tempdir().unwrap();
    copy_dir(&fixture, spool.path());
    (ids, spool)
}

/// Starts a collector of `env` on the spool folder `spool` and waits (at most 60 s) until the
/// rows of `ids` are stored; asserts there are 40. The collector and the rows.
async fn deliver(env: &TestEnv<'_>, spool: &Path, ids: &[String]) -> (Collector, Vec<Value>) {
    let c = env
        .collector(&[("COLLECTOR_SPOOL_DIR", spool.to_str().unwrap())])
        .await;
    let rows = env.wait_rows(ids, Duration::from_secs(60)).await;
    assert_eq!(rows.len(), 40);
    (c, rows)
}

/// The 8-byte magic of each segment file in the spool folder `spool`.
fn segment_magics(spool: &Path) -> Vec<String> {
    let mut magics = Vec::new();
    for entry in std::fs::read_dir(spool.join("segments")).unwrap() {
        let data = std::fs::read(entry.unwrap().path()).unwrap();
        magics.push(String::from_utf8_lossy(&data[..8]).into_owned());
    }
    magics
}

/// Asserts the values every fixture measurement was made with: site, user agent, viewport,
/// and an LCP over 1000 ms with a fraction of .5.
fn assert_fixture_row(r: &Value) {
    assert_eq!(col(r, "site"), "upgrade-fixture", "{r}");
    assert_eq!(col(r, "user_agent"), "fixture/1", "{r}");
    assert_eq!(col(r, "viewport_width"), 390, "{r}");
    let lcp = col(r, "lcp_ms").as_f64().unwrap();
    assert!(lcp > 1000.0 && lcp.fract() == 0.5, "{r}");
}

/// Posts a new measurement to `c` (asserting 202), then waits (at most 60 s each) until its
/// row is stored and `c`'s spool holds no record.
async fn post_one_and_drain(env: &TestEnv<'_>, c: &Collector) {
    let (id, m) = measurement(&env.site);
    let (status, body) = c.post_json(&m).await;
    assert_eq!(status, 202, "{body}");
    env.wait_rows(&[id], Duration::from_secs(60)).await;
    c.wait_metric("collector_spool_records 0", Duration::from_secs(60))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spool_of_the_previous_release_is_delivered_after_the_upgrade() {
    let stack = Stack::shared();
    let env = TestEnv::new(stack).await;
    let fixture = root().join("tests/fixtures/spool-v1");
    let ids = fixture_ids(&fixture);
    let spool = tempfile::tempdir().unwrap();
    copy_dir(&fixture, spool.path());
    let spool_dir = spool.path().to_str().unwrap();

    // The dump lists every measurement the old spool holds, without taking its lock.
    let dump = env.cli_with(&[("COLLECTOR_SPOOL_DIR", spool_dir)], &["spool", "dump"]);
    dump.success();
    let mut listed: Vec<String> = dump
        .stdout
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["row"]["id"].as_str().unwrap().to_owned()
        })
        .collect();
    listed.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(listed, expected, "{}", dump.stderr);
    assert!(dump.stderr.contains("40 rows"), "{}", dump.stderr);

    let (c, rows) = deliver(&env, spool.path(), &ids).await;
    for r in &rows {
        assert_fixture_row(r);
        assert_eq!(col(r, "navigation_type"), "navigate", "{r}");
        assert!(
            !col(r, "url").as_str().unwrap().contains('?'),
            "minimised at open (contract v5 §5): a site the settings do not know keeps no query parameter: {r}"
        );
        assert_eq!(col(r, "sample_rate"), 1.0, "{r}");
    }
    env.assert_stored_once(&ids, Duration::from_secs(60)).await;

    // New beacons go on in this release's format, after the old segment.
    post_one_and_drain(&env, &c).await;
    // Every append waited for a group commit, and the histogram of their durations says so.
    assert!(
        c.metric("collector_spool_sync_duration_seconds_count")
            .await
            >= 1.0,
        "no group commit timed"
    );
    let magics = segment_magics(spool.path());
    assert!(
        magics.iter().all(|m| m == "CSPOOL05"),
        "the delivered old segment is gone and new ones are this release's format (v5): {magics:?}"
    );
}

/// The columns contract v3 adds (attribution), in table order.
const ATTRIBUTION: [&str; 14] = [
    "lcp_target",
    "inp_target",
    "cls_target",
    "lcp_url",
    "lcp_resource_load_delay_ms",
    "lcp_resource_load_duration_ms",
    "lcp_element_render_delay_ms",
    "inp_type",
    "inp_input_delay_ms",
    "inp_processing_duration_ms",
    "inp_presentation_delay_ms",
    "inp_script_url",
    "cls_time_ms",
    "cls_value",
];

/// `measurements` as the release before the attribution columns created it: this release's
/// DDL with its column list cut after `os` (v2 of the table; every column after it was added
/// since, the attribution first), in `form` (`replicated` or `single`).
fn previous_table(db: &str, form: &str) -> String {
    let ddl = std::fs::read_to_string(root().join("schema/clickhouse/002_measurements.sql"))
        .unwrap()
        .replace("{database}", db);
    let lines: Vec<&str> = ddl.lines().collect();
    let os = lines
        .iter()
        .position(|l| l.trim_start().starts_with("os LowCardinality(String)"))
        .expect("the DDL declares os");
    let close = lines[os..]
        .iter()
        .position(|l| l.starts_with(')'))
        .expect("the column list ends")
        + os;
    assert!(
        lines[os + 1].trim_start().starts_with(ATTRIBUTION[0]),
        "the attribution columns follow os"
    );
    let mut kept = lines[..os].to_vec();
    let last = lines[os].trim_end().trim_end_matches(',');
    kept.push(last);
    kept.extend_from_slice(&lines[close..]);
    let mut sql = kept.join("\n");
    if form == "single" {
        let engine = sql
            .lines()
            .find(|l| l.starts_with("ENGINE"))
            .unwrap()
            .to_owned();
        sql = sql.replace(&engine, "ENGINE = ReplacingMergeTree");
    }
    sql
}

/// Issue 26: a collector of this release meets a table and a spool of the previous release
/// (git 01a61c9; `tests/fixtures/spool-v3/`, 40 measurements in `CSPOOL03`, made by
/// `tests/fixtures/make-spool.sh`). Without `migrate`, its prober adds the attribution columns
/// to the table of every server; the old spool's rows are delivered with their values and
/// their attribution NULL, and a new beacon's attribution is stored. `migrate` afterwards
/// finds nothing to do.
async fn previous_release_upgraded(env: TestEnv<'_>) {
    previous_tables(&env).await;
    // PostgreSQL's half of migrate; no ClickHouse answers at 127.0.0.1:9 (exit 1, by design).
    let pg_only = env.cli_with(
        &[("COLLECTOR_CLICKHOUSE_URLS", "http://127.0.0.1:9")],
        &["migrate"],
    );
    assert_eq!(pg_only.code, 1, "{}", pg_only.stderr);
    env.cli(&["sites", "add", "--key", "site-1"]).success();

    let (ids, spool) = fixture_spool("spool-v3");
    let (c, rows) = deliver(&env, spool.path(), &ids).await;
    for r in &rows {
        assert_fixture_row(r);
    }
    env.assert_stored_once(&ids, Duration::from_secs(60)).await;
    let nulls = env
        .query(
            0,
            &format!(
                "SELECT count() AS n FROM {}.measurements WHERE site = 'upgrade-fixture' AND {}",
                env.db,
                ATTRIBUTION
                    .iter()
                    .map(|c| format!("isNull({c})"))
                    .collect::<Vec<_>>()
                    .join(" AND ")
            ),
        )
        .await;
    assert_eq!(
        as_i64(col(&nulls[0], "n")),
        Some(40),
        "old rows: attribution NULL"
    );

    a_new_row_carries_attribution(&env, &c).await;
    env.cli(&["migrate"]).success();
}

/// The previous release's table of `env`'s form on each of its ClickHouse servers.
async fn previous_tables(env: &TestEnv<'_>) {
    for ch in &env.clickhouse {
        clickhouse_exec(ch, &format!("CREATE DATABASE IF NOT EXISTS {}", env.db))
            .await
            .unwrap();
        // 18.16 creates LowCardinality columns only with this setting (26.x refuses it).
        let url = if env.table_form == "replicated" {
            format!("{ch}/?allow_experimental_low_cardinality_type=1")
        } else {
            ch.clone()
        };
        clickhouse_exec(&url, &previous_table(&env.db, env.table_form))
            .await
            .unwrap();
    }
}

/// After `migrate`, a beacon with attribution sent through `c` is stored with it, every server
/// of `env` having the 14 attribution columns; one not sent (`inp_target`) is NULL.
async fn a_new_row_carries_attribution(env: &TestEnv<'_>, c: &Collector) {
    let (id, mut m) = measurement(&env.site);
    m["lcp_target"] = "main>img.hero".into();
    m["lcp_element_render_delay_ms"] = 12.5.into();
    m["inp_type"] = "pointer".into();
    m["cls_value"] = 0.05.into();
    let (status, body) = c.post_json(&m).await;
    assert_eq!(status, 202, "{body}");
    env.wait_rows(std::slice::from_ref(&id), Duration::from_secs(60))
        .await;
    for (i, ch) in env.clickhouse.iter().enumerate() {
        let columns = clickhouse_query(
            ch,
            &format!(
                "SELECT count() AS n FROM system.columns WHERE database = '{}' AND table = 'measurements' AND name IN ({})",
                env.db,
                ATTRIBUTION.iter().map(|c| format!("'{c}'")).collect::<Vec<_>>().join(",")
            ),
        )
        .await
        .unwrap();
        assert_eq!(as_i64(col(&columns[0], "n")), Some(14), "server {i}: {ch}");
    }
    let columns = "lcp_target, lcp_element_render_delay_ms, inp_type, cls_value, inp_target";
    let row = env.final_rows(columns, &format!("id = '{id}'")).await;
    assert_eq!(row.len(), 1);
    assert_eq!(col(&row[0], "lcp_target"), "main>img.hero");
    assert_eq!(col(&row[0], "lcp_element_render_delay_ms"), 12.5);
    assert_eq!(col(&row[0], "inp_type"), "pointer");
    assert_eq!(col(&row[0], "cls_value"), 0.05);
    assert_eq!(col(&row[0], "inp_target"), &Value::Null, "{}", row[0]);
}

collector_tests::on_both_servers!(
    previous_release_upgraded:
        a_table_and_spool_of_the_previous_release_are_upgraded_on_18_16 => empty,
        a_table_and_spool_of_the_previous_release_are_upgraded_on_26 => empty_on_ch26
);

/// The spool of the release before opaque frames (git e9fea1f; `tests/fixtures/spool-v4/`, 40
/// measurements in `CSPOOL04`, made by `tests/fixtures/make-spool.sh`) is delivered exactly once
/// with every value, through `spool dump` first, and new beacons go on in `CSPOOL05`, whose
/// frames carry their layout.
async fn spool_of_the_release_before_opaque_frames_replayed(env: TestEnv<'_>) {
    let (ids, spool) = fixture_spool("spool-v4");
    let spool_dir = spool.path().to_str().unwrap();
    let dump = env.cli_with(&[("COLLECTOR_SPOOL_DIR", spool_dir)], &["spool", "dump"]);
    dump.success();
    assert_eq!(dump.stdout.lines().count(), 40, "{}", dump.stderr);
    assert!(dump.stderr.contains("40 rows"), "{}", dump.stderr);

    let (c, rows) = deliver(&env, spool.path(), &ids).await;
    for r in &rows {
        assert_fixture_row(r);
        assert_eq!(col(r, "navigation_type"), "navigate", "{r}");
    }
    env.assert_stored_once(&ids, Duration::from_secs(60)).await;

    post_one_and_drain(&env, &c).await;
    let magics = segment_magics(spool.path());
    assert!(
        !magics.is_empty() && magics.iter().all(|m| m == "CSPOOL05"),
        "the delivered CSPOOL04 segment is gone and new ones are CSPOOL05: {magics:?}"
    );
}

collector_tests::on_both_servers!(
    spool_of_the_release_before_opaque_frames_replayed:
        a_spool_of_the_release_before_opaque_frames_is_delivered_on_18_16,
        a_spool_of_the_release_before_opaque_frames_is_delivered_on_26
);

/// A reset token and an e-mail address's local part, as a release before v4 stored them: in
/// the URL's path and query, the referrer and the user agent.
const TOKEN: &str = "Zq7Kp2Xw9Rt4Lm8Nv3Bc";
const LOCAL_PART: &str = "jane.doe";

/// A row of site `old-shop` holding both secrets, as the JSON release stored it; and its id.
fn leaky_row() -> (String, Value) {
    let id = uuid::Uuid::new_v4().to_string();
    let url = format!(
        "https://shop.example/reset/{TOKEN}?token={TOKEN}&email={LOCAL_PART}%40example.com&utm_source=news"
    );
    let referrer = format!("https://mail.example/inbox/{TOKEN}?u={LOCAL_PART}@example.com");
    let agent = format!("Mozilla/5.0 (in-app; {LOCAL_PART}@example.com) Chrome/131.0.0.0");
    let row = spool_files::v1_row(&id, "old-shop", &url, &referrer, &agent);
    (id, row)
}

/// Writes into `dir` what a release before v4 left: a spool of 5 rows in 3 requests, a
/// kept-aside file of 2 rows and a damaged segment's copy of 1, every row with both secrets.
/// The ids of the spool's rows.
fn write_leaky_spool(dir: &Path) -> Vec<String> {
    let mut rows: Vec<(String, Value)> = (0..8).map(|_| leaky_row()).collect();
    let aside: Vec<Value> = rows.drain(5..).map(|(_, r)| r).collect();
    let ids: Vec<String> = rows.iter().map(|(id, _)| id.clone()).collect();
    let r: Vec<Value> = rows.into_iter().map(|(_, r)| r).collect();
    let requests = [r[..2].to_vec(), r[2..3].to_vec(), r[3..].to_vec()];
    spool_files::write_v1_spool(dir, &requests);
    let name = "00000000000000000001-000000000008-000000.json";
    spool_files::write_kept_aside(dir, name, &aside[..2]);
    spool_files::write_damaged(dir, 9, &[aside[2..].to_vec()]);
    for needle in [TOKEN, LOCAL_PART] {
        assert_eq!(spool_files::files_holding(dir, needle).len(), 3, "{needle}");
    }
    ids
}

/// Asserts that no file anywhere under `dir` holds a byte sequence of either secret.
fn assert_no_secret_in(dir: &Path, when: &str) {
    for needle in [TOKEN, LOCAL_PART] {
        let found = spool_files::files_holding(dir, needle);
        assert!(found.is_empty(), "{when}: {needle:?} still in {found:?}");
    }
}

/// Asserts that the rows of `ids` hold neither secret in any column, and are minimised as
/// site `old-shop` keeps them (`utm_*`, its origin `https://shop.example`).
async fn assert_minimised_in_clickhouse(env: &TestEnv<'_>, ids: &[String]) {
    let rows = env.rows(ids).await;
    assert_eq!(rows.len(), ids.len());
    let all = env.measurements("*", "WHERE site = 'old-shop'").await;
    assert_eq!(all.len(), ids.len(), "every record once, no copy: {all:?}");
    let text = serde_json::to_string(&all).unwrap();
    for needle in [TOKEN, LOCAL_PART] {
        assert!(!text.contains(needle), "{needle:?} stored: {text}");
    }
    for r in &rows {
        assert_eq!(
            col(r, "url"),
            "https://shop.example/reset/*?utm_source=news"
        );
        assert_eq!(col(r, "referrer"), "https://mail.example");
        assert_eq!(
            col(r, "user_agent"),
            "Mozilla/5.0 (in-app; *) Chrome/131.0.0.0"
        );
    }
}

/// Contract v5 §5: what a release before v4 left in a spool folder, with secrets, is
/// minimised when a collector of this release starts on it: its segments are rewritten before
/// they are delivered (so while ClickHouse is unreachable too), its kept-aside file and
/// damaged-segment copy rewritten; then every record arrives once, minimised.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_spool_with_secrets_is_minimised_at_start_and_delivered_once() {
    let env = TestEnv::new(Stack::shared()).await;
    let origin = ["--origin", "https://shop.example"];
    env.cli(&[&["sites", "add", "--key", "old-shop"][..], &origin].concat())
        .success();
    let spool = tempfile::tempdir().unwrap();
    let ids = write_leaky_spool(spool.path());
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let mut c = env
        .collector(&[
            ("COLLECTOR_SPOOL_DIR", spool.path().to_str().unwrap()),
            ("COLLECTOR_CLICKHOUSE_URLS", &nowhere),
        ])
        .await;
    assert_eq!(
        c.metric("collector_spool_records").await,
        5.0,
        "held, not lost"
    );
    assert_no_secret_in(spool.path(), "started, nothing delivered");
    c.set_env("COLLECTOR_CLICKHOUSE_URLS", &env.clickhouse.join(","));
    c.restart().await;
    env.assert_stored_once(&ids, Duration::from_secs(60)).await;
    c.wait_metric("collector_spool_records 0", Duration::from_secs(60))
        .await;
    assert_no_secret_in(spool.path(), "delivered");
    assert_minimised_in_clickhouse(&env, &ids).await;
}
