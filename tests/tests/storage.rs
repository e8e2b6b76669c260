//! The table laid out for its readers (contract §3, v3), on real ClickHouse 18.16 replicas:
//! every resend of an id folds to one row whatever its time of receipt, the derived device
//! columns, `collector migrate` moving a v1 table with rows to v2 while a collector writes, and
//! the values of a dimension seen most often kept through a midnight flood of junk values
//! (contract v5 §2).

use collector_tests::common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const VISIBLE: Duration = Duration::from_secs(30);

async fn one_value(env: &TestEnv<'_>, sql: &str) -> Value {
    let rows = env.query(0, sql).await;
    assert_eq!(rows.len(), 1, "{sql}: {rows:?}");
    let row = rows[0].as_object().expect("a row is an object");
    assert_eq!(row.len(), 1, "{sql}: one column: {row:?}");
    row.values().next().expect("one column").clone()
}

/// Runs a statement that answers nothing (DDL, INSERT … SELECT) on replica `i`; panics with
/// ClickHouse's answer when it fails.
async fn exec(env: &TestEnv<'_>, i: usize, sql: &str) {
    let resp = http()
        .post(&env.clickhouse[i])
        .body(sql.to_owned())
        .send()
        .await
        .expect("clickhouse answers");
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    assert!(status.is_success(), "{sql}: {status} {text}");
}

async fn count(env: &TestEnv<'_>, sql: &str) -> i64 {
    let v = one_value(env, sql).await;
    as_i64(&v).unwrap_or_else(|| panic!("{sql}: not a number: {v}"))
}

const IPHONE: &str = "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1";

/// A page view that started a second before a month's end (30 November 2026, 23:59:59 UTC) is
/// sent, and resent through a second collector, five minutes after that end by the
/// collectors' clocks (libfaketime, so that the starts sent stay within the 7 days a `ts` may
/// lag its receipt, contract §3, whatever day the test runs): both sends land in the partition
/// and on the day of the page view's start, not of their receipt, and fold to one row. So do
/// a page view of the day before and one of a minute before, and a beacon without any client
/// time, resent through the other collector. The device columns come from the request's user
/// agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_resend_folds_whatever_its_time_of_receipt() {
    let env = TestEnv::new(Stack::shared()).await;
    let c1 = env.collector(&fake_clock("@2026-12-01 00:05:00")).await;
    let c2 = env.collector(&fake_clock("@2026-12-01 00:05:00")).await;
    let month_end_ms: i64 = 1_796_083_199_000; // 2026-11-30T23:59:59Z
    let day_end_ms: i64 = month_end_ms - 86_400_000; // 2026-11-29T23:59:59Z
    let minute_before_ms: i64 = month_end_ms + 241_000; // 2026-12-01T00:04:00Z
    let ua = [("Content-Type", "application/json"), ("User-Agent", IPHONE)];

    let mut ids = Vec::new();
    let mut with_ts = Vec::new();
    for (i, ts) in [month_end_ms, day_end_ms, minute_before_ms]
        .into_iter()
        .enumerate()
    {
        let (id, mut m) = measurement(&env.site);
        m["ts"] = json!(ts);
        m["url"] = json!(format!("https://shop.example/p/{i}"));
        let body = m.to_string();
        let (s1, _, _) = c1.post(body.clone(), &ua).await;
        let (s2, a2, _) = c2.post(body, &ua).await;
        assert_eq!((s1, s2), (202, 202), "{a2}");
        with_ts.push((id.clone(), ts));
        ids.push(id);
    }
    let (bare_id, mut bare) = measurement(&env.site);
    bare.as_object_mut().unwrap().remove("ts");
    for c in [&c1, &c2, &c1] {
        let (s, a, _) = c.post(bare.to_string(), &ua).await;
        assert_eq!(s, 202, "{a}");
    }
    ids.push(bare_id.clone());
    env.wait_rows(&ids, VISIBLE).await;
    let db = &env.db;
    for id in &ids {
        let n = count(
            &env,
            &format!("SELECT count() FROM {db}.measurements FINAL WHERE id = '{id}'"),
        )
        .await;
        assert_eq!(n, 1, "{id} folds to one row");
    }
    filed_on_the_page_views_day(&env, &with_ts).await;
    let month_end = env
        .query(
            0,
            &format!(
                "SELECT DISTINCT _partition_id AS p FROM {db}.measurements WHERE id = '{}'",
                ids[0]
            ),
        )
        .await;
    assert_eq!(
        month_end,
        vec![json!({"p": "202611"})],
        "the page view's month, in UTC"
    );

    let derived = env
        .query(
            0,
            &format!(
                "SELECT DISTINCT device_type, browser, browser_version, os FROM {db}.measurements FINAL \
                 WHERE id IN ('{}', '{bare_id}')",
                ids[0]
            ),
        )
        .await;
    assert_eq!(
        derived,
        vec![
            json!({"device_type": "mobile", "browser": "Mobile Safari", "browser_version": "17", "os": "iOS"})
        ]
    );
}

/// Every copy of each id of `with_ts` is on one partition and on the day of its page view's
/// start (`ts`, ms), `page_view_at` that start in seconds.
async fn filed_on_the_page_views_day(env: &TestEnv<'_>, with_ts: &[(String, i64)]) {
    let db = &env.db;
    for (id, ts) in with_ts {
        let rows = env
            .query(
                0,
                &format!(
                    "SELECT DISTINCT _partition_id AS p, toString(toDate(page_view_at)) AS day, \
                     toUInt32(page_view_at) AS at FROM {db}.measurements WHERE id = '{id}'"
                ),
            )
            .await;
        assert_eq!(
            rows.len(),
            1,
            "{id}: every copy on one partition and day: {rows:?}"
        );
        let expect_day = utc_date(ts / 1000);
        assert_eq!(col(&rows[0], "day"), &json!(expect_day), "{id}: {rows:?}");
        assert_eq!(as_i64(col(&rows[0], "at")), Some(ts / 1000), "{id}");
    }
}

/// Waits (up to [`VISIBLE`]) until `id` has `n` stored copies, folded or not; panics with the
/// count it saw.
async fn wait_copies(env: &TestEnv<'_>, id: &str, n: i64) {
    let sql = format!(
        "SELECT count() FROM {}.measurements WHERE id = '{id}'",
        env.db
    );
    let deadline = Instant::now() + VISIBLE;
    loop {
        let got = count(env, &sql).await;
        if got == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{id}: {got} copies, expected {n}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// libfaketime's preload library (Debian's `libfaketime`, installed by `scripts/stack.sh
/// install`); panics when it is missing: this test cannot run without it.
fn libfaketime() -> &'static str {
    const PATH: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
    assert!(
        std::path::Path::new(PATH).exists(),
        "{PATH} is missing: run scripts/stack.sh install (Debian package libfaketime)"
    );
    PATH
}

/// The environment that runs a collector on a wall clock starting at `at` (libfaketime's
/// `FAKETIME` form, e.g. `@2026-12-01 00:05:00`) and going on from there; the monotonic clock
/// is left alone.
fn fake_clock(at: &'static str) -> [(&'static str, &'static str); 3] {
    [
        ("LD_PRELOAD", libfaketime()),
        ("FAKETIME", at),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ]
}

/// A UUIDv7 (RFC 9562 §5.7) made at `ms` Unix milliseconds, as the tracking script makes its
/// ids: the time in the first 48 bits, version 7, variant 10, the rest random.
fn uuid_v7(ms: i64) -> String {
    let mut bytes = *uuid::Uuid::new_v4().as_bytes();
    bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    bytes[6] = 0x70 | (bytes[6] & 0x0f);
    bytes[8] = 0x80 | (bytes[8] & 0x3f);
    uuid::Uuid::from_bytes(bytes).to_string()
}

/// The days (`YYYY-MM-DD` of `page_view_at`) and row counts of `id` under `FINAL`.
async fn days_of(env: &TestEnv<'_>, id: &str) -> Vec<(String, i64)> {
    env.query(
        0,
        &format!(
            "SELECT toString(toDate(page_view_at)) AS day, count() AS n FROM {}.measurements FINAL \
             WHERE id = '{id}' GROUP BY day ORDER BY day",
            env.db
        ),
    )
    .await
    .iter()
    .map(|r| {
        (
            col(r, "day").as_str().unwrap().to_owned(),
            as_i64(col(r, "n")).unwrap(),
        )
    })
    .collect()
}

/// Two collectors whose wall clocks stand on either side of a month's end (libfaketime over
/// the real processes; the monotonic clock left alone): one receives a beacon shortly before
/// midnight on 30 November, the other its resend shortly after, on 1 December. `received_at`
/// of the two copies differs in day and month, yet both land in the page view's partition and
/// day and fold to one row. So does a beacon without `ts` whose id is a UUIDv7, as the script
/// makes them (contract v4 §3): it files by the time in its id. A beacon without `ts` whose id
/// is a UUIDv4 (a client of its own) files by its own receipt: the known limit docs/storage.md
/// states (two rows, nothing lost); its resend on the same side of midnight folds.
async fn resends_across_a_month_end_fold(env: TestEnv<'_>) {
    // A fake clock starts when the process starts; the margin covers a slow start.
    let before = env.collector(&fake_clock("@2026-11-30 23:59:00")).await;
    let after = env.collector(&fake_clock("@2026-12-01 00:00:00")).await;
    let ua = [("Content-Type", "application/json"), ("User-Agent", IPHONE)];
    // Background merges would fold the copies before they are counted.
    for i in 0..env.clickhouse.len() {
        exec(
            &env,
            i,
            &format!("SYSTEM STOP MERGES {}.measurements", env.db),
        )
        .await;
    }

    let (id, mut m) = measurement(&env.site);
    m["ts"] = json!(1_796_083_110_000_i64); // 2026-11-30T23:58:30Z, the page view's start
    for c in [&before, &after] {
        let (s, a, _) = c.post(m.to_string(), &ua).await;
        assert_eq!(s, 202, "{a}");
    }
    let (_, mut v7) = measurement(&env.site);
    let v7_id = uuid_v7(1_796_083_110_000); // made at the page view's start, as the script does
    v7["id"] = json!(v7_id);
    v7.as_object_mut().unwrap().remove("ts");
    for c in [&before, &after] {
        let (s, a, _) = c.post(v7.to_string(), &ua).await;
        assert_eq!(s, 202, "{a}");
    }
    let (bare, mut b) = measurement(&env.site);
    b.as_object_mut().unwrap().remove("ts");
    for c in [&before, &after, &after] {
        let (s, a, _) = c.post(b.to_string(), &ua).await;
        assert_eq!(s, 202, "{a}");
    }
    env.wait_rows(&[id.clone(), v7_id.clone(), bare.clone()], VISIBLE)
        .await;
    // Every send is stored (the two collectors' batches differ), then the copies fold.
    wait_copies(&env, &id, 2).await;
    each_collectors_clock_the_page_views_day(&env, &id).await;
    assert_eq!(
        days_of(&env, &id).await,
        vec![("2026-11-30".to_owned(), 1)],
        "the resend with ts folds"
    );

    wait_copies(&env, &v7_id, 2).await;
    assert_eq!(
        days_of(&env, &v7_id).await,
        vec![("2026-11-30".to_owned(), 1)],
        "without ts, a UUIDv7 id files by its own time: both sends on the page view's day, folded"
    );

    // The second collector's dedup window folds its own resend before it is stored.
    wait_copies(&env, &bare, 2).await;
    assert_eq!(
        days_of(&env, &bare).await,
        vec![("2026-11-30".to_owned(), 1), ("2026-12-01".to_owned(), 1)],
        "without ts and with a UUIDv4 id: one row per day of receipt (the documented limit), the same-day resend folded"
    );
}

/// The two copies of `id`, received before and after midnight by each collector's own clock,
/// are both on the page view's partition and day (November 2026, the 30th).
async fn each_collectors_clock_the_page_views_day(env: &TestEnv<'_>, id: &str) {
    let db = &env.db;
    let copies = env
        .query(
            0,
            &format!(
                "SELECT toString(received_at) AS received, _partition_id AS p, \
                 toString(toDate(page_view_at)) AS day FROM {db}.measurements WHERE id = '{id}' \
                 ORDER BY received_at"
            ),
        )
        .await;
    assert_eq!(copies.len(), 2, "{copies:?}");
    let received: Vec<&str> = copies
        .iter()
        .map(|r| col(r, "received").as_str().expect("received_at"))
        .collect();
    assert!(
        received[0].starts_with("2026-11-30 23:5") && received[1].starts_with("2026-12-01 00:0"),
        "each collector's own clock: {received:?}"
    );
    for r in &copies {
        assert_eq!(
            (col(r, "p"), col(r, "day")),
            (&json!("202611"), &json!("2026-11-30")),
            "{copies:?}"
        );
    }
}

collector_tests::on_both_servers!(
    resends_across_a_month_end_fold:
        a_resend_received_after_midnight_of_a_month_end_folds,
        a_resend_received_after_midnight_of_a_month_end_folds_on_26
);

/// `collector migrate` against `env`'s databases, started and not waited for, its standard
/// output and error each to `output()` (`Stdio::null`, `Stdio::piped`).
fn start_migrate(env: &TestEnv<'_>, output: fn() -> Stdio) -> std::process::Child {
    Command::new(collector_bin())
        .arg("migrate")
        .envs(env.collector_env())
        .stdout(output())
        .stderr(output())
        .spawn()
        .expect("start collector migrate")
}

/// A v1 table (sorted by `id` alone) holding 200,000 rows over four or five months, on both replicas;
/// `migrate` killed (SIGKILL) halfway through its copy; a collector of this release writing
/// before and during the second run: afterwards every v1 id and every acknowledged beacon is in
/// v2 exactly once (under `FINAL` and without it), and v1 is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_moves_a_v1_table_with_rows_to_v2_while_a_collector_writes() {
    let env = TestEnv::empty(Stack::shared()).await;
    let (v1_rows, unmerged) = v1_table(&env).await;

    // The first run, killed once part of the copy is in v2.
    let copied_at_kill = migrate_killed_halfway(&env, v1_rows).await;

    // A collector of this release writes before and during the second run.
    // The collector lives until the end: what it acknowledged is still to be written.
    let (_c, acked, out) = migrate_again_while_a_collector_writes(&env).await;
    check_migrate_summary(&out, v1_rows, copied_at_kill);
    env.wait_rows(&acked, VISIBLE).await;
    check_v2_after_migrate(&env, v1_rows, &unmerged, acked.len()).await;
}

/// A v1 table (sorted by `id` alone) of `env`'s database on both replicas, holding 200,000
/// rows over four or five months and one id more stored twice, unmerged: its rows counted
/// under v1's `FINAL` (200,001), and that id.
async fn v1_table(env: &TestEnv<'_>) -> (i64, String) {
    let db = env.db.clone();
    let v1 = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../schema/clickhouse/v1/measurements.sql"
    ))
    .expect("schema/clickhouse/v1/measurements.sql");
    for i in 0..env.stack.clickhouse_urls().len() {
        exec(env, i, &format!("CREATE DATABASE IF NOT EXISTS {db}")).await;
        exec(env, i, &v1.replace("{database}", &db)).await;
    }
    let v1_rows: i64 = 200_000;
    exec(
        env,
        0,
        &format!(
            "INSERT INTO {db}.measurements (id, site, received_at, url, ts, user_agent) \
             SELECT generateUUIDv4(), concat('site-', toString(number % 50)), \
             toUInt32(1788000000 + intDiv(number, 50000) * 2678400 + number % 50000), \
             'https://shop.example/', if(number % 4 = 0, NULL, toInt64(1788000000 + intDiv(number, 50000) * 2678400 + number % 50000) * 1000), \
             '{IPHONE}' FROM system.numbers LIMIT {v1_rows}"
        ),
    )
    .await;
    let total = format!("SELECT count() FROM {db}.measurements");
    assert_eq!(count(env, &total).await, v1_rows);
    // One more id, stored twice without ts and not merged yet (merges stopped), its copies
    // received 30 s apart across midnight of 14 October: one row under v1's FINAL, and it must
    // stay one in v2, although its copies would file under two days there.
    for i in 0..env.stack.clickhouse_urls().len() {
        exec(env, i, &format!("SYSTEM STOP MERGES {db}.measurements")).await;
    }
    let unmerged = uuid::Uuid::new_v4().to_string();
    for at in [1_792_022_390, 1_792_022_420] {
        exec(
            env,
            0,
            &format!(
                "INSERT INTO {db}.measurements (id, site, received_at, url, ts, user_agent) \
                 VALUES ('{unmerged}', 'site-0', {at}, 'https://shop.example/', NULL, '{IPHONE}')"
            ),
        )
        .await;
    }
    assert_eq!(count(env, &total).await, v1_rows + 2);
    let v1_rows = v1_rows + 1;

    (v1_rows, unmerged)
}

/// Runs `migrate` and kills it (SIGKILL) once part of the copy is in v2; the rows v2 held at
/// the kill, fewer than `v1_rows`.
async fn migrate_killed_halfway(env: &TestEnv<'_>, v1_rows: i64) -> i64 {
    let db = &env.db;
    let total = format!("SELECT count() FROM {db}.measurements");
    let mut first = start_migrate(env, Stdio::null);
    let start = Instant::now();
    let copied_at_kill = loop {
        let v2 = env
            .query(
                0,
                &format!(
                    "SELECT count() AS n FROM system.columns WHERE database = '{db}' \
                     AND table = 'measurements' AND name = 'page_view_at'"
                ),
            )
            .await;
        if as_i64(col(&v2[0], "n")) == Some(1) {
            let n = count(env, &total).await;
            if n > 0 {
                first.kill().expect("kill migrate");
                break n;
            }
        }
        assert!(
            first.try_wait().unwrap().is_none(),
            "migrate finished before it could be killed halfway"
        );
        if start.elapsed() >= Duration::from_secs(120) {
            env.diag.give_up("migrate never started copying").await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    first.wait().unwrap();
    assert!(
        copied_at_kill < v1_rows,
        "killed halfway: {copied_at_kill} of {v1_rows} copied"
    );

    copied_at_kill
}

/// Registers `site-1`, starts a collector and posts 30 beacons before and 30 during a second
/// `migrate`; the collector, the acknowledged ids and the migrate's output (asserted
/// successful).
async fn migrate_again_while_a_collector_writes(
    env: &TestEnv<'_>,
) -> (Collector, Vec<String>, std::process::Output) {
    env.cli(&["sites", "add", "--key", "site-1"]).success();
    let c = env.collector(&[]).await;
    let mut acked = Vec::new();
    for _ in 0..30 {
        let (id, m) = measurement(&env.site);
        assert_eq!(c.post_json(&m).await.0, 202);
        acked.push(id);
    }
    let second = {
        let cmd = start_migrate(env, Stdio::piped);
        tokio::task::spawn_blocking(move || cmd.wait_with_output().unwrap())
    };
    for _ in 0..30 {
        let (id, m) = measurement(&env.site);
        assert_eq!(c.post_json(&m).await.0, 202);
        acked.push(id);
    }
    let out = second.await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (c, acked, out)
}

/// The second run's summary: all `v1_rows` in at least 4 months, copied now or there
/// already, and only what the killed run had not copied (`copied_at_kill` seen at the kill).
fn check_migrate_summary(out: &std::process::Output, v1_rows: i64, copied_at_kill: i64) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    // "… copied into measurements: R rows in 4 months, C copied now, T there already"
    let summary = stdout
        .lines()
        .find_map(|l| {
            l.split_once("measurements_v1 copied into measurements: ")
                .map(|x| x.1)
        })
        .unwrap_or_else(|| panic!("migrate says what it did: {stdout}"));
    let numbers: Vec<i64> = summary
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    let [rows, months, copied_now, there_already] = numbers[..] else {
        panic!("four numbers in {summary:?}")
    };
    assert!(rows == v1_rows && months >= 4, "{summary}");
    assert_eq!(copied_now + there_already, v1_rows, "{summary}");
    assert!(
        there_already >= copied_at_kill && copied_now > 0,
        "the second run copied only what the killed one had not ({copied_at_kill} seen at the kill): {summary}"
    );
}

/// After the migration: v1's unmerged copies are one row, every v1 id and every one of
/// `acked` acknowledged beacons is in v2 exactly once (under `FINAL` and without it), v1 is
/// kept, and copied rows get the derived columns.
async fn check_v2_after_migrate(env: &TestEnv<'_>, v1_rows: i64, unmerged: &str, acked: usize) {
    let db = &env.db;
    let total = format!("SELECT count() FROM {db}.measurements");
    assert_eq!(
        count(
            env,
            &format!("SELECT count() FROM {db}.measurements FINAL WHERE id = '{unmerged}'")
        )
        .await,
        1,
        "v1's unmerged copies of one id are one row in v2"
    );
    let want = v1_rows + acked as i64;
    assert_eq!(
        count(env, &format!("SELECT count() FROM {db}.measurements FINAL")).await,
        want,
        "rows after FINAL"
    );
    assert_eq!(
        count(env, &format!("SELECT uniqExact(id) FROM {db}.measurements")).await,
        want,
        "distinct ids"
    );
    assert_eq!(count(env, &total).await, want, "no copy doubled a row");
    assert_eq!(
        count(
            env,
            &format!(
                "SELECT count() FROM {db}.measurements_v1 WHERE id NOT IN (SELECT id FROM {db}.measurements)"
            )
        )
        .await,
        0,
        "every v1 id is in v2"
    );
    assert_eq!(
        count(env, &format!("SELECT count() FROM {db}.measurements_v1")).await,
        v1_rows + 1,
        "v1 kept, its unmerged copies too, until the operator drops it"
    );
    assert_eq!(
        one_value(
            env,
            &format!("SELECT groupUniqArray(device_type) FROM {db}.measurements WHERE id IN (SELECT id FROM {db}.measurements_v1)")
        )
        .await,
        json!(["mobile"]),
        "copied rows get the derived columns"
    );
}

/// One beacon of site `site` carrying the dimension `variant` = `value`, and its id.
fn with_variant(site: &str, value: &str) -> (String, Value) {
    let (id, mut m) = measurement(site);
    m["dimensions"] = json!({ "variant": value });
    (id, m)
}

/// Sends `batch` in one request to `c`; panics unless every beacon is accepted whole.
async fn send_batch(c: &Collector, batch: Vec<Value>) {
    let ua = [("Content-Type", "application/json"), ("User-Agent", IPHONE)];
    let n = batch.len();
    let (s, a, _) = c.post(Value::Array(batch).to_string(), &ua).await;
    assert_eq!((s, &a["accepted"]), (202, &json!(n)), "{a}");
    assert_eq!(a["dropped_fields"], json!([]), "{a}");
}

/// Sends to `c` 1,000 junk values of `site`'s dimension `variant`, each once, 50 beacons a
/// request, then each of `real` 10 times, a request a round; returns the junk beacons' ids
/// and, per round, the real values' ids in `real`'s order.
async fn flood_then_real(
    c: &Collector,
    site: &str,
    real: &[String],
) -> (Vec<String>, Vec<Vec<String>>) {
    let mut junk = Vec::new();
    for chunk in (0..1_000).collect::<Vec<_>>().chunks(50) {
        let (ids, batch): (Vec<_>, Vec<_>) = chunk
            .iter()
            .map(|i| with_variant(site, &format!("junk-{i:04}")))
            .unzip();
        junk.extend(ids);
        send_batch(c, batch).await;
    }
    let mut rounds = Vec::new();
    for _ in 0..10 {
        let (ids, batch): (Vec<_>, Vec<_>) = real.iter().map(|v| with_variant(site, v)).unzip();
        rounds.push(ids);
        send_batch(c, batch).await;
    }
    (junk, rounds)
}

/// The attack on dimensions (contract v5 §2: the values stored are those seen most
/// often that day), done when "twenty real values of a dimension each sent by many clients
/// stay distinct through a midnight flood of 1,000 junk values". The collector's wall clock
/// starts at 00:00:00 UTC of the test's day (libfaketime; the monotonic clock left alone), so
/// the flood, 1,000 junk values each sent once, is the day's first; then come 20 real values,
/// each sent 10 times, round after round as page views come ([`flood_then_real`]). Until v5
/// the first 100 values of the day were kept and every real value was stored as `(other)` all
/// day; now each real value is stored as itself from its second sighting on, and of the flood
/// only the first 100 are. The site's budget is off (`COLLECTOR_SITE_RATE=0`) so that no
/// beacon is sampled away; the rule does not look at client addresses (only the rate limits
/// do, off here), so every beacon comes from the test's one address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_real_dimension_values_stay_distinct_through_a_midnight_flood() {
    let env = TestEnv::new(Stack::shared()).await;
    let site = "dims";
    env.add_site(site, &["--dimension", "variant"]);
    let midnight = format!("@{} 00:00:00", utc_date(now_ms() / 1000));
    let c = env
        .collector(&[
            ("LD_PRELOAD", libfaketime()),
            ("FAKETIME", &midnight),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
            ("COLLECTOR_SITE_RATE", "0"),
        ])
        .await;
    let real: Vec<String> = (0..20).map(|i| format!("real-{i:02}")).collect();
    let (junk, rounds) = flood_then_real(&c, site, &real).await;

    let all = 1_000 + 20 * 10;
    wait_until(
        &env.diag,
        "every beacon stored",
        VISIBLE,
        Duration::from_millis(200),
        || async {
            let n = env.count(&format!("FINAL WHERE site = '{site}'")).await;
            if n == all {
                Ok(())
            } else {
                Err(format!("{n} of {all} rows"))
            }
        },
    )
    .await;
    let rows = env
        .final_rows(
            "toString(id) AS id, dimension_values[indexOf(dimension_names, 'variant')] AS value, \
             toUInt32(received_at) AS received_at",
            &format!("site = '{site}'"),
        )
        .await;
    let stored: std::collections::HashMap<&str, &str> = rows
        .iter()
        .map(|r| {
            (
                col(r, "id").as_str().unwrap(),
                col(r, "value").as_str().unwrap(),
            )
        })
        .collect();
    let received: Vec<i64> = rows
        .iter()
        .map(|r| as_i64(col(r, "received_at")).unwrap())
        .collect();
    let first = *received.iter().min().unwrap();
    assert!(
        first % 86_400 < 300,
        "the flood came just after midnight: {first}"
    );
    // The first 100 take the places; the rest only by the sketch's overcount (a junk value
    // sharing both its cells with earlier ones counts 2: one run in about 13 sees one).
    let junk_kept = junk
        .iter()
        .filter(|id| stored[id.as_str()] != "(other)")
        .count();
    assert!(
        (100..=110).contains(&junk_kept),
        "{junk_kept} junk values stored as themselves"
    );
    for (v, value) in real.iter().enumerate() {
        let seen: Vec<&str> = rounds.iter().map(|ids| stored[ids[v].as_str()]).collect();
        assert!(
            seen[1..].iter().all(|s| s == value),
            "{value}: stored as itself from its second sighting on: {seen:?}"
        );
    }
}
