//! Keep only what a shop may keep (contract v4 §2, §3, §5; issue 36), on real servers: URLs
//! minimised before anything reaches disk, a canary of personal data searched for in every
//! byte the collector writes, the country from a database of the test's own (and the database
//! replaced while running), rows past the retention gone, and a site erased on every replica,
//! one of them down for the first run.

use collector_tests::common;

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const VISIBLE: Duration = Duration::from_secs(30);

/// A beacon of `site` with `id` and `fields` over the minimal ones.
fn beacon(site: &str, id: &str, fields: Value) -> Value {
    let mut m = json!({"id": id, "site": site, "url": "https://shop.example/"});
    for (k, v) in fields.as_object().unwrap() {
        m[k] = v.clone();
    }
    m
}

/// The beacon: a page after a password reset, as a real shop's page sends it.
fn reset_password(site: &str, id: &str) -> Value {
    beacon(
        site,
        id,
        json!({
            "url": "https://shop.example/account/reset-password?token=RESETTOKEN123&email=alice%40example.com&order_id=100234&utm_source=newsletter",
            "referrer": "https://shop.example/checkout/confirm?order=100234&sessionid=SESS999&email=alice@example.com",
            "lcp_url": "https://cdn.shop.example/avatars/alice@example.com.jpg?sig=SIGNEDURLSECRET",
            "lcp_ms": 1200,
        }),
    )
}

async fn reset_password_stored_minimised(env: TestEnv<'_>) {
    env.add_site("shop", &["--origin", "https://shop.example"]);
    let c = env.collector(&[]).await;
    let id = uuid::Uuid::new_v4().to_string();
    let (status, body) = c.post_json(&reset_password("shop", &id)).await;
    assert_eq!(status, 202, "{body}");
    env.wait_rows(std::slice::from_ref(&id), VISIBLE).await;
    let r = &stored(&env, &id, "url, referrer, lcp_url").await;
    assert_eq!(
        col(r, "url"),
        "https://shop.example/account/reset-password?utm_source=newsletter",
        "a kept utm_source survives, nothing else of the query: {r}"
    );
    assert_eq!(col(r, "referrer"), "https://shop.example/checkout/confirm");
    assert_eq!(col(r, "lcp_url"), "https://cdn.shop.example/avatars/*");
    // Another site's referrer keeps its origin only.
    let other = uuid::Uuid::new_v4().to_string();
    let m = beacon(
        "shop",
        &other,
        json!({"referrer": "https://search.example/results?q=alice%40example.com"}),
    );
    assert_eq!(c.post_json(&m).await.0, 202);
    let rows = env.wait_rows(std::slice::from_ref(&other), VISIBLE).await;
    assert_eq!(col(&rows[0], "referrer"), "https://search.example");
}

collector_tests::on_both_servers!(
    reset_password_stored_minimised:
        a_reset_password_beacon_is_stored_minimised_on_18_16,
        a_reset_password_beacon_is_stored_minimised_on_26
);

/// The canary's strings: an e-mail address, a token, and a client address.
const EMAIL_LOCAL: &str = "canary7f3a9qx";
const TOKEN: &str = "Tok3nCanary9f8e7d6c5b4a";
const CLIENT: &str = "198.51.100.177";
const FORGED: &str = "198.51.100.211";

/// A beacon carrying the canary in every URL field and selector.
fn canary_beacon(site: &str, id: &str) -> Value {
    let email = format!("{EMAIL_LOCAL}@example.com");
    beacon(
        site,
        id,
        json!({
            "url": format!("https://shop.example/u/{email}/{TOKEN}?email={email}&token={TOKEN}&utm_campaign={email}"),
            "referrer": format!("https://shop.example/r/{TOKEN}?e={email}"),
            "lcp_url": format!("https://cdn.shop.example/{email}.jpg?sig={TOKEN}"),
            "inp_script_url": format!("https://cdn.shop.example/js/{TOKEN}.js?u={email}"),
            "lcp_target": format!("#order-{TOKEN}"),
            "lcp_ms": 900,
        }),
    )
}

/// Every place the canary could hide that holds it: the paths named.
fn canary_hits(haystack: &[u8]) -> Vec<&'static str> {
    let text = String::from_utf8_lossy(haystack);
    [EMAIL_LOCAL, TOKEN, CLIENT, FORGED]
        .into_iter()
        .filter(|needle| text.contains(needle))
        .collect()
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// Contract v4 §5: beacons carrying a unique e-mail, token and client address in every URL
/// field and a selector (JSON and gzip bodies, through a trusted proxy, one site's rows refused
/// by the table so that they are kept aside), then every byte of the spool folder and its
/// kept-aside files, the collector's log at debug level, `/metrics` and every column of every
/// row: no hit. On the 26.x server, whose constraints make the kept-aside files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_of_personal_data_is_in_no_file_row_log_or_metric() {
    let env = TestEnv::on_ch26(Stack::shared()).await;
    env.add_site("refused", &["--keep-query", "utm_*"]);
    env.exec(
        0,
        &format!(
            "ALTER TABLE {}.measurements ADD CONSTRAINT refuse CHECK site != 'refused'",
            env.db
        ),
    )
    .await;
    let c = env
        .collector(&[
            ("COLLECTOR_TRUSTED_PROXIES", "127.0.0.1/32"),
            ("RUST_LOG", "debug"),
        ])
        .await;
    let proxy = [
        ("content-type", "application/json"),
        ("x-forwarded-for", CLIENT),
        // A header the proxy would pass through from the client: never read.
        ("forwarded", "for=198.51.100.211"),
    ];
    let mut ids = Vec::new();
    for (i, site) in ["site-1", "refused", "site-1"].iter().enumerate() {
        let id = uuid::Uuid::new_v4().to_string();
        let body = canary_beacon(site, &id).to_string();
        let (status, answer, _) = if i == 2 {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            gz.write_all(body.as_bytes()).unwrap();
            let mut headers = proxy.to_vec();
            headers.push(("content-encoding", "gzip"));
            c.post(gz.finish().unwrap(), &headers).await
        } else {
            c.post(body, &proxy).await
        };
        assert_eq!(status, 202, "{answer}");
        if *site != "refused" {
            ids.push(id);
        }
    }
    env.wait_rows(&ids, VISIBLE).await;
    c.wait_metric("collector_spool_kept_aside_rows_total 1", VISIBLE)
        .await;

    let mut files = Vec::new();
    files_under(c.spool.path(), &mut files);
    let kept: Vec<_> = files
        .iter()
        .filter(|p| p.to_string_lossy().contains("kept-aside/"))
        .collect();
    assert!(!kept.is_empty(), "the refused row is kept aside: {files:?}");
    for path in &files {
        let hits = canary_hits(&std::fs::read(path).unwrap());
        assert!(hits.is_empty(), "{}: {hits:?}", path.display());
    }
    let rows = env
        .query(0, &format!("SELECT * FROM {}.measurements", env.db))
        .await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    let hits = canary_hits(serde_json::to_string(&rows).unwrap().as_bytes());
    assert!(hits.is_empty(), "rows: {hits:?} in {rows:?}");
    let metrics = reqwest::get(format!("{}/metrics", c.admin_url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(canary_hits(metrics.as_bytes()).is_empty(), "/metrics");
    let log = c.logs();
    assert!(log.contains("DEBUG"), "the log is at debug level");
    let hits = canary_hits(log.as_bytes());
    assert!(hits.is_empty(), "the log: {hits:?}");
}

/// Writes a tiny country database with `tests/fixtures/geo-db.pl` (Debian's
/// libmaxmind-db-writer-perl) and checks it with `mmdblookup` (mmdb-bin).
fn geo_db(path: &Path, layout: &str, networks: &[&str]) {
    let script = root().join("tests/fixtures/geo-db.pl");
    let out = std::process::Command::new("perl")
        .arg(&script)
        .arg(path)
        .arg(layout)
        .args(networks)
        .output()
        .expect("perl runs (scripts/stack.sh install installs libmaxmind-db-writer-perl)");
    assert!(
        out.status.success(),
        "{}: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let (network, cc) = networks[0].split_once('=').unwrap();
    let ip = network.split('/').next().unwrap();
    let check = std::process::Command::new("mmdblookup")
        .args(["--file", path.to_str().unwrap(), "--ip", ip])
        .output()
        .expect("mmdblookup runs (scripts/stack.sh install installs mmdb-bin)");
    assert!(
        String::from_utf8_lossy(&check.stdout).contains(&format!("\"{cc}\"")),
        "mmdblookup {ip}: {}",
        String::from_utf8_lossy(&check.stdout)
    );
}

/// Posts one beacon from `client` through the trusted proxy (127.0.0.1) and returns the country
/// stored for it.
async fn country_of(env: &TestEnv<'_>, c: &Collector, client: &str) -> String {
    let id = uuid::Uuid::new_v4().to_string();
    let headers = [
        ("content-type", "application/json"),
        ("x-forwarded-for", client),
    ];
    let (status, answer, _) = c
        .post(beacon(&env.site, &id, json!({})).to_string(), &headers)
        .await;
    assert_eq!(status, 202, "{answer}");
    env.wait_rows(std::slice::from_ref(&id), VISIBLE).await;
    col(&stored(env, &id, "country").await, "country")
        .as_str()
        .unwrap()
        .to_owned()
}

/// The `columns` of the row `id` (under `FINAL`, from the first server).
async fn stored(env: &TestEnv<'_>, id: &str, columns: &str) -> Value {
    let rows = env
        .query(
            0,
            &format!(
                "SELECT {columns} FROM {}.measurements FINAL WHERE id = '{id}'",
                env.db
            ),
        )
        .await;
    assert_eq!(rows.len(), 1, "{id}: {rows:?}");
    rows[0].clone()
}

/// The country from a database of the test's own, for IPv4 and IPv6 addresses through
/// `X-Forwarded-For`; the file replaced while the collector runs is used within a minute
/// (the reload check runs every 10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_country_comes_from_the_database_and_a_replaced_file_is_used() {
    let env = TestEnv::new(Stack::shared()).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("countries.mmdb");
    geo_db(&db, "geolite2", &["192.0.2.0/24=FR", "2001:db8:1::/48=JP"]);
    let c = env
        .collector(&[
            ("COLLECTOR_GEO_DB", db.to_str().unwrap()),
            ("COLLECTOR_TRUSTED_PROXIES", "127.0.0.1/32"),
        ])
        .await;
    assert_eq!(country_of(&env, &c, "192.0.2.9").await, "FR");
    assert_eq!(country_of(&env, &c, "2001:db8:1::5").await, "JP");
    assert_eq!(country_of(&env, &c, "203.0.113.5").await, "", "not listed");
    assert_eq!(country_of(&env, &c, "10.1.2.3").await, "", "private");

    geo_db(&db, "ip-location-db", &["192.0.2.0/24=IT"]);
    let replaced = Instant::now();
    // The reload check's 10 s, plus a beacon's way to a row: well within the minute allowed.
    let limit = Duration::from_secs(60);
    loop {
        let country = country_of(&env, &c, "192.0.2.9").await;
        if country == "IT" {
            break;
        }
        assert_eq!(country, "FR", "the old database until the new one is read");
        assert!(
            replaced.elapsed() < limit,
            "the replaced database was not used within {limit:?} (its reload check runs every 10 s)"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        c.logs().contains("the country database was replaced"),
        "{}",
        c.logs()
    );
}

/// Issue 52, 2 (contract v5 §1): a shop's own proxy (`sites update --trusted-proxy`) is
/// believed for that shop's beacons only. Behind the operator's edge (loopback, the global
/// list), a request whose `X-Forwarded-For` is `visitor, shop proxy` names the visitor for the
/// shop that trusts the proxy (the visitor's country stored) and the proxy for another shop
/// (its country), also when one batch holds both shops' beacons.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shops_own_proxy_names_the_client_of_its_own_beacons_only() {
    let env = TestEnv::new(Stack::shared()).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("countries.mmdb");
    geo_db(&db, "geolite2", &["192.0.2.0/24=FR", "198.51.100.0/24=BR"]);
    env.add_site("proxied", &[]);
    env.add_site("other", &[]);
    let update = env.cli(&[
        "sites",
        "update",
        "proxied",
        "--trusted-proxy",
        "198.51.100.0/24",
    ]);
    update.success();
    let list = env.cli(&["sites", "list"]);
    assert!(
        list.stdout.contains("trusted_proxies=198.51.100.0/24"),
        "{}",
        list.stdout
    );
    let bad = env.cli(&[
        "sites",
        "update",
        "proxied",
        "--trusted-proxy",
        "198.51.100.0/33",
    ]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    let c = env
        .collector(&[
            ("COLLECTOR_GEO_DB", db.to_str().unwrap()),
            ("COLLECTOR_TRUSTED_PROXIES", "127.0.0.1/32"),
        ])
        .await;
    let ids: Vec<String> = (0..2).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    let batch = json!([
        beacon("proxied", &ids[0], json!({})),
        beacon("other", &ids[1], json!({})),
    ]);
    let headers = [
        ("content-type", "application/json"),
        ("x-forwarded-for", "192.0.2.9, 198.51.100.5"),
    ];
    let (status, answer, _) = c.post(batch.to_string(), &headers).await;
    assert_eq!(status, 202, "{answer}");
    env.wait_rows(&ids, VISIBLE).await;
    let country = |v: Value| col(&v, "country").as_str().unwrap().to_owned();
    assert_eq!(
        country(stored(&env, &ids[0], "country").await),
        "FR",
        "the shop's proxy names its visitor"
    );
    assert_eq!(
        country(stored(&env, &ids[1], "country").await),
        "BR",
        "for another shop the proxy is the client"
    );
}

/// Rows of `site` by `page_view_at`, inserted straight into ClickHouse (old ones cannot come
/// through intake).
async fn insert_rows_at(env: &TestEnv<'_>, site: &str, times: &[&str]) {
    for t in times {
        env.exec(
            0,
            &format!(
                "INSERT INTO {}.measurements (id, site, received_at, url, page_view_at) \
                 SELECT generateUUIDv4(), '{site}', toDateTime('{t}', 'UTC'), 'https://a.example/', toDateTime('{t}', 'UTC')",
                env.db
            ),
        )
        .await;
    }
}

async fn count_site(env: &TestEnv<'_>, replica: usize, site: &str) -> i64 {
    let rows = env
        .query(
            replica,
            &format!(
                "SELECT count() AS n FROM {}.measurements WHERE site = '{site}'",
                env.db
            ),
        )
        .await;
    as_i64(col(&rows[0], "n")).unwrap()
}

/// `collector retention` with a 30-day retention: the months that ended before it are gone
/// on every server, the recent rows are kept; where the server has table TTLs, the table has
/// one.
async fn retention_applies(env: TestEnv<'_>) {
    let old = ["2024-01-15 10:00:00", "2025-06-01 00:00:00"];
    let now = utc_date(now_ms() / 1000);
    let recent = format!("{now} 00:00:00");
    insert_rows_at(&env, "aged", &old).await;
    insert_rows_at(&env, "aged", &[&recent]).await;
    let out = env.cli_with(&[("COLLECTOR_RETENTION", "30d")], &["retention"]);
    out.success();
    assert!(out.stdout.contains("partitions dropped"), "{}", out.stdout);
    for i in 0..env.clickhouse.len() {
        // A replicated DROP PARTITION reaches the other replica through ZooKeeper.
        let deadline = Instant::now() + VISIBLE;
        while count_site(&env, i, "aged").await != 1 {
            assert!(
                Instant::now() < deadline,
                "server {i}: old rows still there"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let ttl = env
        .query(
            0,
            &format!(
                "SELECT engine_full FROM system.tables WHERE database = '{}' AND name = 'measurements'",
                env.db
            ),
        )
        .await;
    let engine = col(&ttl[0], "engine_full").as_str().unwrap();
    if env.table_form == "single" {
        assert!(engine.contains("TTL"), "26.x has a table TTL: {engine}");
    }
}

collector_tests::on_both_servers!(
    retention_applies:
        retention_drops_what_is_older_on_18_16,
        retention_drops_what_is_older_on_26
);

/// Posts `n` beacons of `site` and returns their ids.
async fn send(c: &Collector, site: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..n {
        let id = uuid::Uuid::new_v4().to_string();
        let (status, body) = c.post_json(&beacon(site, &id, json!({}))).await;
        assert_eq!(status, 202, "{body}");
        ids.push(id);
    }
    ids
}

/// A kept-aside file with a row of each of `sites`, as the writer writes them.
fn kept_aside_file(spool: &Path, sites: &[&str]) -> std::path::PathBuf {
    let dir = spool.join("kept-aside");
    std::fs::create_dir_all(&dir).unwrap();
    let rows: Vec<Value> = sites
        .iter()
        .map(|s| json!({"id": "x", "site": s}))
        .collect();
    let path = dir.join("00000000000000000001-000000000008-000000.json");
    std::fs::write(
        &path,
        serde_json::to_vec(&json!({"reason": "Code: 117", "measurements": rows})).unwrap(),
    )
    .unwrap();
    path
}

/// `collector sites purge` while collectors serve: the site is disabled, its rows deleted on
/// every server (`unreachable`: the server to stop for the first run, then start for the
/// second; stack.sh's 1-based replica number), its kept-aside records deleted, and a collector that still held its records in
/// its spool drops them instead of inserting them; another site's rows stay.
async fn purge_erases(env: TestEnv<'_>, unreachable: Option<usize>) {
    let settings = [("COLLECTOR_SETTINGS_TTL", "1s")];
    env.cli(&["sites", "add", "--key", "erased"]).success();
    let c = env.collector(&settings).await;
    let kept = send(&c, "site-1", 5).await;
    let erased = send(&c, "erased", 5).await;
    env.wait_rows(&kept, VISIBLE).await;
    env.wait_rows(&erased, VISIBLE).await;
    // A second collector that cannot insert yet holds records of the site in its spool.
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let mut late = env
        .collector(&[("COLLECTOR_CLICKHOUSE_URLS", &nowhere), settings[0]])
        .await;
    let held = send(&late, "erased", 3).await;
    assert_eq!(late.metric("collector_spool_records").await, 3.0);
    let spool = tempfile::tempdir().unwrap();
    let aside = kept_aside_file(spool.path(), &["erased", "site-1"]);
    let with_spool = [
        settings[0],
        ("COLLECTOR_SPOOL_DIR", spool.path().to_str().unwrap()),
    ];

    if let Some(i) = unreachable {
        env.stack.replica(i).stop().unwrap();
        let out = env.cli_with(&with_spool, &["sites", "purge", "erased"]);
        assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
        assert!(
            out.stderr.contains(&env.clickhouse[i - 1]),
            "names the server it could not reach: {}",
            out.stderr
        );
        env.stack.repair();
    }
    let out = env.cli_with(&with_spool, &["sites", "purge", "erased"]);
    out.success();
    assert!(out.stdout.contains("site erased erased"), "{}", out.stdout);

    // The late collector, now given the servers, drops what it held of the erased site. Its
    // writer may have dropped them already, when it read them after the mark (a loaded
    // machine can hold its lower-priority thread back for seconds): counted there then.
    let dropped_before = late.metric("collector_spool_purged_rows_total").await;
    late.set_env("COLLECTOR_CLICKHOUSE_URLS", &env.clickhouse.join(","));
    late.restart().await;
    let left = format!("collector_spool_purged_rows_total {}", 3.0 - dropped_before);
    late.wait_metric(&left, VISIBLE).await;
    late.wait_metric("collector_spool_records 0", VISIBLE).await;
    for i in 0..env.clickhouse.len() {
        assert_eq!(count_site(&env, i, "erased").await, 0, "server {i}");
        assert_eq!(count_site(&env, i, "site-1").await, 5, "server {i}");
    }
    assert!(env.rows(&held).await.is_empty(), "held rows never inserted");
    let late_id = uuid::Uuid::new_v4().to_string();
    let (status, _) = c.post_json(&beacon("erased", &late_id, json!({}))).await;
    assert_eq!(status, 403, "the erased site is disabled");
    let left: Value = serde_json::from_slice(&std::fs::read(&aside).unwrap()).unwrap();
    assert_eq!(left["measurements"].as_array().unwrap().len(), 1);
    assert_eq!(left["measurements"][0]["site"], "site-1");
    let list = env.cli(&["sites", "list"]);
    assert!(list.stdout.contains("erased\tpurged"), "{}", list.stdout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_erases_a_site_on_every_replica_one_of_them_down_for_the_first_run() {
    let _turn = FAILOVER_TURN.lock().await;
    let stack = Stack::failover();
    stack.restore().await;
    purge_erases(TestEnv::new(stack).await, Some(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_erases_a_site_on_26() {
    purge_erases(TestEnv::on_ch26(Stack::shared()).await, None).await;
}

/// Writes into the spool folder `dir` a kept-aside file and a damaged segment's copy, each
/// with rows of site `erased` and of `site-1`, as a collector keeps them aside. The ids of
/// the rows of `erased`, and of `site-1`.
fn files_of_both_sites(dir: &Path) -> (Vec<String>, Vec<String>) {
    let (mut erased, mut kept) = (Vec::new(), Vec::new());
    let mut row = |site: &str| {
        let id = uuid::Uuid::new_v4().to_string();
        let ids = if site == "erased" {
            &mut erased
        } else {
            &mut kept
        };
        ids.push(id.clone());
        let url = "https://shop.example/p/1";
        spool_files::v1_row(&id, site, url, "https://shop.example/", "UA/1")
    };
    let json = [row("erased"), row("site-1"), row("erased")];
    let damaged = [vec![row("erased"), row("site-1")], vec![row("erased")]];
    let name = "00000000000000000003-000000000008-000000.json";
    spool_files::write_kept_aside(dir, name, &json);
    spool_files::write_damaged(dir, 2, &damaged);
    (erased, kept)
}

/// Whether some file under `dir` holds the row `id`: as text (a kept-aside file) or as its
/// RowBinary bytes (a segment).
fn holds_row(dir: &Path, id: &str) -> bool {
    !spool_files::files_holding(dir, id).is_empty()
        || !spool_files::files_holding(dir, spool_files::uuid_row_bytes(id)).is_empty()
}

/// Contract v5 §5: `sites purge`, run where no spool holds anything (a compose container's
/// empty folder), reaches the kept-aside files and damaged-segment copies of every serving
/// collector (two here, each with its own spool folder), waits until each has recorded that
/// it did, and names each with the rows it deleted; another site's rows stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_from_one_host_reaches_every_collectors_kept_aside_and_damaged_files() {
    let env = TestEnv::new(Stack::shared()).await;
    env.cli(&["sites", "add", "--key", "erased"]).success();
    let ttl = ("COLLECTOR_SETTINGS_TTL", "1s");
    let folders = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut collectors = Vec::new();
    let mut rows = Vec::new();
    for dir in &folders {
        rows.push(files_of_both_sites(dir.path()));
        let spool = ("COLLECTOR_SPOOL_DIR", dir.path().to_str().unwrap());
        collectors.push(env.collector(&[ttl, spool]).await);
    }
    let here = tempfile::tempdir().unwrap();
    let elsewhere = [ttl, ("COLLECTOR_SPOOL_DIR", here.path().to_str().unwrap())];
    let out = env.cli_with(&elsewhere, &["sites", "purge", "erased"]);
    out.success();
    for (dir, (erased, kept)) in folders.iter().zip(&rows) {
        let name = dir.path().canonicalize().unwrap();
        let line = format!(
            "{}: 4 kept-aside and damaged-segment records",
            name.display()
        );
        assert!(out.stdout.contains(&line), "{line:?} in\n{}", out.stdout);
        for id in erased {
            assert!(
                !holds_row(dir.path(), id),
                "{id} of erased still in {name:?}"
            );
        }
        for id in kept {
            assert!(
                holds_row(dir.path(), id),
                "{id} of site-1 gone from {name:?}"
            );
        }
    }
    drop(collectors);
}
