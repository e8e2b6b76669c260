//! Issue 52 item 4, ClickHouse's half: rows that earlier releases stored before the v5 rules
//! (the contract v3 layout of `measurements`, the columns v4 added, and the `measurements_v1`
//! copy an earlier `migrate` left) hold e-mail addresses, tokens, card, phone and customer
//! numbers in every string column; `collector migrate`, killed after its first chunk and run
//! again while a collector serves (new page views, and resends of old ones into the partition
//! being rewritten), leaves none of them in any table, and every row there once.

use collector_tests::common;

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// What must be gone, each searched case-insensitively in every string column: an address's
/// local part and domain, base64url and plain tokens, a card number, a customer number, a
/// phone number, a UUID, a session id in a Server-Timing description.
const SECRETS: [&str; 9] = [
    "jane.doe",
    "mailhost",
    "f9Gh2J",
    "Zq9XyW8v",
    "4111",
    "12345678901234",
    "1234567",
    "8a4d-4b7e",
    "sEss10nVaLue",
];

const EMAIL: &str = "jane.doe+shop@mailhost.test";
const B64: &str = "Ab3dE5_f9Gh2J-kL2mN0pQ7rS";
const TOKEN: &str = "Zq9XyW8vU7tS6rQ5pO4n";
const UUID: &str = "3f2b6c1e-8a4d-4b7e-9c1a-2d3e4f5a6b7c";

/// The site of the old rows; it keeps `q` and `utm_*` (from PostgreSQL).
const SHOP: &str = "shop-1";
/// Rows of the v3 layout (the first [`SHARED`] also in `measurements_v1`, as an earlier
/// `migrate` copied them), rows with the columns v4 added, rows only in `measurements_v1`.
const V3_ROWS: usize = 200;
const V4_ROWS: usize = 100;
const SHARED: usize = 40;
const V1_ONLY: usize = 60;

/// A page view's start, milliseconds: in August, September 2026, or an hour ago (this month's
/// partition, which collectors write to while `migrate` rewrites it, and recent enough that a
/// resend of the page view is filed with it).
fn ts_of(i: usize) -> i64 {
    // Once: a resend must carry its row's start, whatever the clock says by then.
    static HOUR_AGO: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    let months = [
        1_788_000_000_000i64,
        1_790_600_000_000,
        *HOUR_AGO.get_or_init(|| now_ms() - 3_600_000),
    ];
    months[i % 3] + i as i64 * 1000
}

/// Resends to `c`, 50 ms apart, the page views of `ids` (the old rows `i` with `i % 3 == 2`,
/// filed in this month's partition) as a browser would: the same id, site and start, the
/// address and token in the URL again. Asserts each is answered 202.
async fn resend_recent(c: &Collector, ids: &[String]) -> Vec<String> {
    let mut resent = Vec::new();
    for (i, id) in ids.iter().enumerate().filter(|(i, _)| i % 3 == 2).take(20) {
        let mut beacon = json!({
            "id": id, "site": SHOP, "ts": ts_of(i), "lcp_ms": 1400,
        });
        beacon["url"] = v1_row(id, ts_of(i))["url"].clone();
        let (status, body) = c.post_json(&beacon).await;
        assert_eq!(status, 202, "{body}");
        resent.push(id.clone());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    resent
}

/// A row as a release before v4 stored it: the columns every layout has.
fn v1_row(id: &str, ts: i64) -> Value {
    json!({
        // Quoted: 18.16 reads a DateTime from JSON text only.
        "id": id, "site": SHOP, "received_at": (ts / 1000).to_string(), "ts": ts, "sample_rate": 1,
        "url": format!("https://shop.test/account/{EMAIL}/card/4111-1111-1111-1111?token={TOKEN}&q=jane.doe%40mailhost.test&utm_source=news"),
        "referrer": format!("https://mail.other.test/inbox/12345678901234?u={EMAIL}"),
        "user_agent": format!("Mozilla/5.0 (Linux; Android 14) InApp/2.1 {EMAIL} {B64} Chrome/131.0.6778.135"),
        "lcp_ms": 1500.5,
    })
}

/// A row of the contract v3 layout: the attribution's selectors and resource URLs too.
fn v3_row(id: &str, ts: i64) -> Value {
    let mut row = v1_row(id, ts);
    let more = json!({
        // 18.16 fills a column a JSONEachRow row leaves out with its type's default, not the
        // column's DEFAULT: given, as the v3 release did.
        "page_view_at": (ts / 1000).to_string(),
        "lcp_target": format!("#order-{UUID}"),
        "inp_target": format!("button.reset-{B64}"),
        "cls_target": "div#u-12345678901234",
        "lcp_url": format!("https://cdn.test/avatars/{EMAIL}.jpg?sig={TOKEN}"),
        "inp_script_url": format!("https://cdn.test/js/{B64}/app.js"),
    });
    row.as_object_mut()
        .unwrap()
        .extend(more.as_object().unwrap().clone());
    row
}

/// A row with the columns v4 added: Server-Timing, dimensions, the page group.
fn v4_row(id: &str, ts: i64) -> Value {
    let mut row = v3_row(id, ts);
    let more = json!({
        "server_timing_name": ["cdn-cache", "db", format!("u-{EMAIL}")],
        "server_timing_dur": [0.0, 12.5, 1.0],
        "server_timing_desc": ["HIT", "session=sEss10nVaLue1234", ""],
        "dimension_names": ["customer", "phone"],
        "dimension_values": ["jane.doe%40mailhost.test", "+49 170 1234567"],
        "page_group": format!("/p/{B64}"),
        "country": "DE",
    });
    row.as_object_mut()
        .unwrap()
        .extend(more.as_object().unwrap().clone());
    row
}

/// `ddl` in `form`: the engine line replaced by `ReplacingMergeTree` in the single form.
fn in_form(ddl: &str, form: &str) -> String {
    if form != "single" {
        return ddl.to_owned();
    }
    let engine = ddl.lines().find(|l| l.starts_with("ENGINE")).unwrap();
    ddl.replace(engine, "ENGINE = ReplacingMergeTree")
}

/// The current DDL of `measurements` cut after the column `last`, and the column lines after
/// it (each `name type`).
fn table_until(db: &str, last: &str) -> (String, Vec<String>) {
    let ddl = std::fs::read_to_string(root().join("schema/clickhouse/002_measurements.sql"))
        .unwrap()
        .replace("{database}", db);
    let lines: Vec<&str> = ddl.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.trim_start().starts_with(&format!("{last} ")))
        .unwrap_or_else(|| panic!("the DDL declares {last}"));
    let close = at + lines[at..].iter().position(|l| l.starts_with(')')).unwrap();
    let later = lines[at + 1..close]
        .iter()
        .map(|l| l.trim().trim_end_matches(',').to_owned())
        .collect();
    let mut kept = lines[..at].to_vec();
    kept.push(lines[at].trim_end().trim_end_matches(','));
    kept.extend_from_slice(&lines[close..]);
    (kept.join("\n"), later)
}

/// Inserts `rows` as JSONEachRow into `table` of this test's database on its first server.
async fn insert(env: &TestEnv<'_>, table: &str, rows: &[Value]) {
    let body: Vec<String> = rows.iter().map(Value::to_string).collect();
    let sql = format!(
        "INSERT INTO {}.{table} FORMAT JSONEachRow\n{}",
        env.db,
        body.join("\n")
    );
    env.exec(0, &sql).await;
}

/// The layouts of an installation that went through releases v1 to v4 before this one, with
/// their rows: `measurements` made by the v3 release, its rows, the v4 columns added and rows
/// with them; `measurements_v1` as an earlier `migrate` left it. The ids of the rows of each.
async fn earlier_releases(env: &TestEnv<'_>) -> (Vec<String>, Vec<String>) {
    let low_cardinality = if env.table_form == "replicated" {
        "/?allow_experimental_low_cardinality_type=1"
    } else {
        "/"
    };
    let (v3, later) = table_until(&env.db, "cls_value");
    let v1 = std::fs::read_to_string(root().join("schema/clickhouse/v1/measurements.sql"))
        .unwrap()
        .replace(
            "{database}.measurements",
            &format!("{}.measurements_v1", env.db),
        )
        .replace("{database}", &env.db);
    for ch in &env.clickhouse {
        let url = format!("{ch}{low_cardinality}");
        clickhouse_exec(ch, &format!("CREATE DATABASE IF NOT EXISTS {}", env.db))
            .await
            .unwrap();
        clickhouse_exec(&url, &in_form(&v3, env.table_form))
            .await
            .unwrap();
        clickhouse_exec(ch, &in_form(&v1, env.table_form))
            .await
            .unwrap();
    }
    let ids: Vec<String> = (0..V3_ROWS + V4_ROWS + V1_ONLY)
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    let v3_rows: Vec<Value> = (0..V3_ROWS).map(|i| v3_row(&ids[i], ts_of(i))).collect();
    insert(env, "measurements", &v3_rows).await;
    for column in later {
        let sql = format!("ALTER TABLE {}.measurements ADD COLUMN {column}", env.db);
        clickhouse_exec(&format!("{}{low_cardinality}", env.clickhouse[0]), &sql)
            .await
            .unwrap();
    }
    let v4_rows: Vec<Value> = (V3_ROWS..V3_ROWS + V4_ROWS)
        .map(|i| v4_row(&ids[i], ts_of(i)))
        .collect();
    insert(env, "measurements", &v4_rows).await;
    let v1_ids: Vec<usize> = (0..SHARED).chain(V3_ROWS + V4_ROWS..ids.len()).collect();
    let v1_rows: Vec<Value> = v1_ids.iter().map(|&i| v1_row(&ids[i], ts_of(i))).collect();
    insert(env, "measurements_v1", &v1_rows).await;
    let v1_ids = v1_ids.iter().map(|&i| ids[i].clone()).collect();
    (ids, v1_ids)
}

/// How many rows of each table of this test's database on server `i` hold one of the
/// [`SECRETS`] in any string column, under `FINAL`: `table: n` for each table with any.
async fn secrets_left(env: &TestEnv<'_>, i: usize) -> Vec<String> {
    let columns = env
        .query(
            i,
            &format!(
                "SELECT table, name, type FROM system.columns WHERE database = '{}' \
                 AND table IN ('measurements', 'measurements_v1') AND type LIKE '%String%'",
                env.db
            ),
        )
        .await;
    let mut left = Vec::new();
    for table in ["measurements", "measurements_v1"] {
        let mut found = Vec::new();
        for c in columns.iter().filter(|c| col(c, "table") == table) {
            let (name, ty) = (
                col(c, "name").as_str().unwrap(),
                col(c, "type").as_str().unwrap(),
            );
            for s in SECRETS {
                found.push(if ty.starts_with("Array") {
                    format!("arrayExists(x -> positionCaseInsensitive(x, '{s}') > 0, {name})")
                } else {
                    format!("positionCaseInsensitive(ifNull(toString({name}), ''), '{s}') > 0")
                });
            }
        }
        let sql = format!(
            "SELECT count() AS n FROM {}.{table} FINAL WHERE {}",
            env.db,
            found.join(" OR ")
        );
        let n = as_i64(col(&env.query(i, &sql).await[0], "n")).unwrap();
        if n > 0 {
            left.push(format!("{table}: {n}"));
        }
    }
    left
}

/// Asserts every `id` is in `table` once under `FINAL` on the first server, and `others` rows
/// besides (a collector's new ones).
async fn assert_once(env: &TestEnv<'_>, table: &str, ids: &[String], site: &str) {
    let rows = env
        .query(
            0,
            &format!(
                "SELECT toString(id) AS id, count() AS n FROM {}.{table} FINAL WHERE site = '{site}' GROUP BY id",
                env.db
            ),
        )
        .await;
    let mut stored: Vec<String> = rows
        .iter()
        .map(|r| {
            assert_eq!(
                as_i64(col(r, "n")),
                Some(1),
                "{table}: once under FINAL: {r}"
            );
            col(r, "id").as_str().unwrap().to_owned()
        })
        .collect();
    stored.sort();
    let mut expected = ids.to_vec();
    expected.sort();
    assert_eq!(stored.len(), expected.len(), "{table}: rows of {site}");
    assert!(stored == expected, "{table}: the ids written, each once");
}

/// Runs `collector migrate` with chunks of 10 rows and kills it (SIGKILL) once it has said it
/// finished its first chunk; what it printed.
fn migrate_killed_after_first_chunk(env: &TestEnv<'_>) -> String {
    let mut child = Command::new(collector_bin())
        .arg("migrate")
        .envs(env.collector_env())
        .env("COLLECTOR_MIGRATE_CHUNK_ROWS", "10")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start collector migrate");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let start = Instant::now();
    loop {
        let left = Duration::from_secs(120).saturating_sub(start.elapsed());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let chunk = line.contains(" rows read, ");
                seen.push(line);
                if chunk {
                    break;
                }
            }
            Err(e) => panic!("no chunk said within 120 s ({e}): {}", seen.join("\n")),
        }
    }
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        None,
        "migrate was still running when killed: {}",
        seen.join("\n")
    );
    seen.join("\n")
}

/// What the rows show after `migrate`: the site's kept parameter (from PostgreSQL) masked but
/// there, `utm_source` kept, another site's referrer its origin, version numbers kept.
async fn assert_what_is_kept(env: &TestEnv<'_>, id: &str) {
    let sql = format!(
        "SELECT url, referrer, user_agent, lcp_url FROM {}.measurements FINAL WHERE id = '{id}'",
        env.db
    );
    let row = &env.query(0, &sql).await[0];
    assert_eq!(
        col(row, "url"),
        "https://shop.test/account/*/card/*?q=*&utm_source=news",
        "{row}"
    );
    assert_eq!(col(row, "referrer"), "https://mail.other.test", "{row}");
    assert_eq!(
        col(row, "user_agent"),
        "Mozilla/5.0 (Linux; Android 14) InApp/2.1 * * Chrome/131.0.6778.135",
        "{row}"
    );
    assert_eq!(col(row, "lcp_url"), "https://cdn.test/avatars/*", "{row}");
}

async fn earlier_rows_minimised(env: TestEnv<'_>) {
    // PostgreSQL's half of migrate; no ClickHouse answers at 127.0.0.1:9 (exit 1, by design).
    let pg_only = env.cli_with(
        &[("COLLECTOR_CLICKHOUSE_URLS", "http://127.0.0.1:9")],
        &["migrate"],
    );
    assert_eq!(pg_only.code, 1, "{}", pg_only.stderr);
    env.add_site(SHOP, &["--keep-query", "q", "--keep-query", "utm_*"]);
    env.add_site(&env.site, &[]);
    let (ids, v1_ids) = earlier_releases(&env).await;
    assert!(!secrets_left(&env, 0).await.is_empty());

    let first = migrate_killed_after_first_chunk(&env);
    eprintln!("the first migrate, killed:\n{first}");
    assert!(
        !secrets_left(&env, 0).await.is_empty(),
        "the killed run left work for the next"
    );

    let c = env.collector(&[]).await;
    let traffic = Traffic::start(&c, &env.site, Duration::from_millis(20));
    traffic.wait_acked(5, Duration::from_secs(60)).await;
    let started = Instant::now();
    let migrate = {
        let (bin, vars) = (collector_bin(), env.collector_env());
        tokio::task::spawn_blocking(move || {
            Command::new(bin)
                .arg("migrate")
                .envs(vars)
                .env("COLLECTOR_MIGRATE_CHUNK_ROWS", "50")
                .output()
                .expect("run collector migrate")
        })
    };
    let (second, resent) = tokio::join!(migrate, resend_recent(&c, &ids));
    let second = second.unwrap();
    eprintln!(
        "the second migrate ({:.1} s):\n{}{}",
        started.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&second.stdout),
        String::from_utf8_lossy(&second.stderr)
    );
    assert!(second.status.success(), "{:?}", second.status);
    let report = traffic.stop().await;
    assert!(!report.acked.is_empty());
    env.assert_stored_once(&report.acked, Duration::from_secs(60))
        .await;
    env.assert_stored_once(&resent, Duration::from_secs(60))
        .await;

    no_secret_left_on_any_server(&env).await;
    assert_once(&env, "measurements", &ids, SHOP).await;
    assert_once(&env, "measurements_v1", &v1_ids, SHOP).await;
    assert_what_is_kept(&env, &ids[0]).await;

    a_third_migrate_rewrites_nothing(&env);
}

/// Waits (60 s per server) until no row of any ClickHouse server of `env` holds a secret.
async fn no_secret_left_on_any_server(env: &TestEnv<'_>) {
    for i in 0..env.clickhouse.len() {
        poll_until(
            &env.diag,
            Duration::from_secs(60),
            Duration::from_millis(500),
            || async {
                let left = secrets_left(env, i).await;
                left.is_empty()
                    .then_some(())
                    .ok_or(format!("server {i}: rows still holding a secret: {left:?}"))
            },
        )
        .await;
    }
}

/// A third `migrate` succeeds, rewrites nothing and says it skips what is minimised already.
fn a_third_migrate_rewrites_nothing(env: &TestEnv<'_>) {
    let third = env.cli(&["migrate"]);
    eprintln!("the third migrate:\n{}{}", third.stdout, third.stderr);
    third.success();
    assert!(
        third.stdout.contains(" 0 rewritten"),
        "the third run rewrites nothing: {}",
        third.stdout
    );
    assert!(
        third.stderr.contains("minimised already"),
        "the third run skips what is done: {}",
        third.stderr
    );
}

collector_tests::on_both_servers!(
    earlier_rows_minimised:
        rows_of_earlier_releases_are_minimised_on_18_16 => empty,
        rows_of_earlier_releases_are_minimised_on_26 => empty_on_ch26
);

/// A purged site's rows that a purge has not deleted yet (it waits for the collectors to read
/// the mark first) are not written again by `migrate`, so they cannot outlive the purge's
/// deletion; another site's rows are minimised beside them.
async fn purged_sites_rows_not_written_again(env: TestEnv<'_>) {
    env.cli(&["migrate"]).success();
    env.add_site(SHOP, &[]);
    env.add_site("gone-1", &[]);
    let rows: Vec<Value> = (0..60)
        .map(|i| {
            let mut row = v4_row(&uuid::Uuid::new_v4().to_string(), ts_of(i));
            if i % 2 == 0 {
                row["site"] = "gone-1".into();
            }
            row
        })
        .collect();
    insert(&env, "measurements", &rows).await;
    pg_connect(&env.stack.database_url(&env.db), "the test's database")
        .await
        .batch_execute("UPDATE sites SET purged_at = now() WHERE key = 'gone-1'")
        .await
        .unwrap();
    let out = env.cli(&["migrate"]);
    out.success();
    assert!(out.stdout.contains(" 30 rewritten"), "{}", out.stdout);
    let leaky = |site: &str| {
        format!(
            "SELECT count() AS n FROM {}.measurements FINAL WHERE site = '{site}' \
             AND position(url, 'mailhost') > 0",
            env.db
        )
    };
    // Written again, they would be minimised: they are as they were, until the purge deletes them.
    let gone = env.query(0, &leaky("gone-1")).await;
    assert_eq!(
        as_i64(col(&gone[0], "n")),
        Some(30),
        "gone-1's rows untouched"
    );
    let shop = env.query(0, &leaky(SHOP)).await;
    assert_eq!(
        as_i64(col(&shop[0], "n")),
        Some(0),
        "{SHOP}'s rows minimised"
    );
}

collector_tests::on_both_servers!(
    purged_sites_rows_not_written_again:
        a_purged_sites_rows_are_not_written_again_on_18_16 => empty,
        a_purged_sites_rows_are_not_written_again_on_26 => empty_on_ch26
);
