//! Who may reach what (contract v4 §1-§4; issue 37), on real servers of the test's own on
//! loopback: ClickHouse 18.16 and 26.x with password-only users and verified TLS, PostgreSQL
//! with `ssl = on` under every `sslmode` that matters, secrets that never show, the operations
//! endpoints private (the collector's own listeners and the shipped HAProxy edge), beacons that
//! must come from the shop's pages, and a client address the client cannot choose.
//!
//! The servers, certificate authorities and HAProxy are in `tests/src/common/access_fixtures.rs`.
//! One file per subject: [`clickhouse`], [`postgres`], [`secrets`], [`operations`],
//! [`origins`], [`budgets`].

use collector_tests::common;
use common::access_fixtures as fixtures;

use std::time::{Duration, Instant};

use common::*;
use fixtures::*;
use serde_json::{json, Value};

mod budgets;
mod clickhouse;
mod operations;
mod origins;
mod postgres;
mod secrets;

/// From a 202 to a visible row: about a second on an idle machine (measured 0.8-1.8 s here);
/// the bound allows for a machine loaded by a parallel CI run, where the replicas lag and the
/// writer waits for them to catch up.
const VISIBLE: Duration = Duration::from_secs(90);
/// How long a collector may take to find a replica down (its prober, on a busy machine).
const NOTICED: Duration = Duration::from_secs(60);

/// Distinct canaries: the passwords, searched for wherever the collector writes or shows.
const CH18_PASSWORD: &str = "ch18-canary-Q7v2Lw9x";
const CH26_PASSWORD: &str = "ch26-canary-Hk3Rt8zP";
const PG_PASSWORD: &str = "pg15-canary-Zm4Nc6yB";
const WRONG_PASSWORD: &str = "wrong-canary-Yp5Ds1qT";
const DASHBOARD_PASSWORD: &str = "dash-canary-Vb8Jw2nE";
const MIGRATE_PASSWORD: &str = "migrate-canary-Tg6Kq3sW";

/// A beacon of `site` on page `url` with a fresh id, and its id.
fn beacon_on(site: &str, url: &str) -> (String, Value) {
    let id = uuid::Uuid::new_v4().to_string();
    (
        id.clone(),
        json!({"id": id, "site": site, "url": url, "lcp_ms": 1200, "ttfb_ms": 80}),
    )
}

/// Posts `n` single beacons of `site` (any page), each answered 202; their ids.
async fn send(c: &Collector, site: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..n {
        let (id, m) = beacon_on(site, "https://shop.example/p/1");
        let (status, body) = c.post_json(&m).await;
        assert_eq!(status, 202, "{body}");
        ids.push(id);
    }
    ids
}

/// The `id IN (...)` list of `ids`.
fn id_list(ids: &[String]) -> String {
    ids.iter()
        .map(|i| format!("'{i}'"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The replica-state line of `/metrics` for `url` with `state` (0 down, 2 healthy).
fn replica_state(url: &str, state: u8) -> String {
    format!("collector_clickhouse_replica_state{{replica=\"{url}\",shard=\"default\"}} {state}")
}

/// Waits until the collector's log has a warning or error line containing every one of
/// `words` (case-insensitively): a clear error, not a debug line; that line.
async fn wait_log_line(c: &Collector, words: &[&str], limit: Duration) -> String {
    wait_until(
        &c.diag,
        &format!("a log line with {words:?}"),
        limit,
        Duration::from_millis(200),
        || async {
            let logs = c.logs();
            logs.lines()
                .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
                .find(|l| {
                    let l = l.to_ascii_lowercase();
                    words.iter().all(|w| l.contains(&w.to_ascii_lowercase()))
                })
                .map(str::to_owned)
                .ok_or_else(|| format!("no such line in {} lines", logs.lines().count()))
        },
    )
    .await
}

/// Contract v4 §1: a password is "never in a log line, a metric, an error answer or a process
/// argument". The collector must run with `RUST_LOG=debug` (its log is checked to be at debug
/// level); its log, `/metrics`, `/proc/PID/cmdline` and `/proc/PID/environ` (the test put only
/// file paths there) hold none of `secrets`.
async fn assert_secrets_hidden(c: &Collector, secrets: &[&str]) {
    let log = c.logs();
    assert!(
        log.contains(" DEBUG "),
        "the collector runs at debug level (RUST_LOG=debug), so its most talkative log is searched"
    );
    let metrics = c.metrics_text().await;
    let pid = c.pid();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    assert!(
        !cmdline.is_empty() && !environ.is_empty(),
        "/proc/{pid} read"
    );
    for secret in secrets {
        for (place, text) in [
            ("its log", log.as_bytes()),
            ("/metrics", metrics.as_bytes()),
            ("/proc/PID/cmdline", &cmdline[..]),
            ("/proc/PID/environ", &environ[..]),
        ] {
            assert!(
                !String::from_utf8_lossy(text).contains(secret),
                "the password {secret:?} shows in {place} of the collector (pid {pid})"
            );
        }
    }
}

/// Settings for a collector or command to connect to ClickHouse as `collector` with the
/// password in `password_file`, verifying TLS against `ca`.
fn ch_auth<'a>(password_file: &'a str, ca: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("COLLECTOR_CLICKHOUSE_USER", "collector"),
        ("COLLECTOR_CLICKHOUSE_PASSWORD_FILE", password_file),
        ("COLLECTOR_CLICKHOUSE_CA_FILE", ca),
    ]
}

/// Two certificate authorities in `dir`: the servers' (`ca`) and another (`other`), whose
/// certificates the collector must refuse.
fn two_cas(dir: &std::path::Path) -> (Pki, Pki) {
    (Pki::new(dir, "ca"), Pki::new(dir, "other"))
}

/// `settings` and `RUST_LOG` `debug`.
fn with_debug_logs<'a>(mut settings: Vec<(&'a str, &'a str)>) -> Vec<(&'a str, &'a str)> {
    settings.push(("RUST_LOG", "debug"));
    settings
}

/// Waits (at most [`VISIBLE`], polling every 200 ms) until `server` holds `n` of `ids`
/// ([`Readback::count`]); gives up through the test's report naming `what` and the last count.
async fn wait_counted(
    env: &TestEnv<'_>,
    what: &str,
    server: &Readback<'_>,
    ids: &[String],
    n: i64,
) {
    wait_until(
        &env.diag,
        what,
        VISIBLE,
        Duration::from_millis(200),
        || async {
            match server.count(ids).await {
                Ok(got) if got == n => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
}

/// How the test reads back what a ClickHouse server of its own holds: as `collector` with
/// `password` through `client`, the test's table in `db`.
struct Readback<'a> {
    client: &'a reqwest::Client,
    url: &'a str,
    password: &'a str,
    db: &'a str,
}

impl<'a> Readback<'a> {
    /// The test's 18.16 server `ch` over https, through `client` (which trusts its CA).
    fn ch18(client: &'a reqwest::Client, ch: &'a Ch18Tls, db: &'a str) -> Readback<'a> {
        Readback {
            client,
            url: &ch.https_url,
            password: CH18_PASSWORD,
            db,
        }
    }

    /// A 26.x server of the test's own at `url` with the shipped users, through `client`.
    fn ch26(client: &'a reqwest::Client, url: &'a str, db: &'a str) -> Readback<'a> {
        Readback {
            client,
            url,
            password: CH26_PASSWORD,
            db,
        }
    }

    /// How many of `ids` the server holds in the test's table, under `FINAL`.
    async fn count(&self, ids: &[String]) -> Result<i64, String> {
        let rows = ch_query(
            self.client,
            self.url,
            "collector",
            self.password,
            &format!(
                "SELECT count() AS n FROM {}.measurements FINAL WHERE toString(id) IN ({})",
                self.db,
                id_list(ids)
            ),
        )
        .await?;
        as_i64(col(&rows[0], "n")).ok_or_else(|| format!("not a count: {rows:?}"))
    }
}

/// A collector refused by its only ClickHouse server (`url`) keeps what it acknowledged in its
/// spool: `n` beacons sent to it answered 202, the replica shown down (0), a warning with
/// `words`, the spool holding them and the test's own count on the server (`server`) finding
/// none of them. Their ids and that warning.
async fn refused_and_spooled(
    c: &Collector,
    url: &str,
    n: usize,
    words: &[&str],
    server: &Readback<'_>,
) -> (Vec<String>, String) {
    let ids = send(c, "site-1", n).await;
    c.wait_metric(&replica_state(url, 0), NOTICED).await;
    let line = wait_log_line(c, words, NOTICED).await;
    assert_eq!(
        c.metric("collector_spool_records").await,
        ids.len() as f64,
        "the acknowledged beacons stay spooled"
    );
    assert_eq!(
        server.count(&ids).await.expect("the test reads the server"),
        0,
        "nothing stored"
    );
    (ids, line)
}

/// The status of one beacon POSTed to `url` through `client` with `headers`.
async fn post_status(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
    headers: &[(&str, String)],
) -> u16 {
    let mut req = client
        .post(url)
        .header("content-type", "text/plain")
        .body(body.to_string());
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    req.send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or_else(|e| panic!("POST {url}: no answer: {e}"))
}

/// `postgres://postgres@127.0.0.1:PORT/DB` with `query` (e.g. `sslmode=...`).
fn pg_url(pg: &OwnPg, db: &str, query: &str) -> String {
    format!("postgres://postgres@127.0.0.1:{}/{db}?{query}", pg.port)
}
