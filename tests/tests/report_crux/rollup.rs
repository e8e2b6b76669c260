//! The CrUX view's daily roll-up (`crux_days`, `crux_day_marks`) follows the rows.

use std::time::Duration;

use super::*;

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
