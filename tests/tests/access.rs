//! Who may reach what (contract v4 §1-§4; issue 37), on real servers of the test's own on
//! loopback: ClickHouse 18.16 and 26.x with password-only users and verified TLS, PostgreSQL
//! with `ssl = on` under every `sslmode` that matters, secrets that never show, the operations
//! endpoints private (the collector's own listeners and the shipped HAProxy edge), beacons that
//! must come from the shop's pages, and a client address the client cannot choose.
//!
//! The servers, certificate authorities and HAProxy are in `tests/src/common/access_fixtures.rs`.

use collector_tests::common;
use common::access_fixtures as fixtures;

use std::time::{Duration, Instant};

use common::*;
use fixtures::*;
use serde_json::{json, Value};

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

/// Issue 37, 1: a standalone ClickHouse 18.16 with one password-only user (`collector`, no
/// password-less `default`) and an `https_port` with a certificate of the test's own CA. With
/// the user, its password file and that CA, `migrate` and the collector work over `https://` and
/// the rows are read back; a collector told to trust another CA, one with a wrong password, and
/// one whose `https://` URL names the plain HTTP port are each refused: their beacons stay
/// spooled, nothing is stored, the log says why and the replica is down in `/metrics`. Given
/// the right CA, the first one then stores what it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clickhouse_18_16_password_only_over_verified_https() {
    let tmp = tempfile::tempdir().unwrap();
    let (pki, other) = two_cas(tmp.path());
    let (pw, hex) = password_file(tmp.path(), "ch.pw", CH18_PASSWORD);
    let (wrong, _) = password_file(tmp.path(), "wrong.pw", WRONG_PASSWORD);
    let (pw, wrong) = (pw.to_str().unwrap(), wrong.to_str().unwrap());
    let (ca, other_ca) = (pki.ca.to_str().unwrap(), other.ca.to_str().unwrap());
    let ch = Ch18Tls::start(&pki, CH18_PASSWORD, &hex).await;
    let reader = pki.client();

    // The server as set up: nobody gets in without the password.
    nobody_without_the_password(&ch, &reader).await;

    let mut env = TestEnv::empty(Stack::shared()).await;
    env.clickhouse = vec![ch.https_url.clone()];
    env.table_form = "single";
    let auth = ch_auth(pw, ca);
    env.cli_with(&auth, &["migrate"]).success();
    env.cli(&["sites", "add", "--key", "site-1"]).success();
    migrate_refused_with_another_ca_or_password(&env, &ch.https_url, pw, wrong, ca, other_ca);
    let mut settings = auth.clone();
    settings.push(("RUST_LOG", "debug"));
    let c = env.collector(&settings).await;
    let ids = send(&c, "site-1", 5).await;
    let started = Instant::now();
    let db = env.db.clone();
    let ch18 = Readback::ch18(&reader, &ch, &db);
    wait_until(
        &env.diag,
        "5 rows read back over https",
        VISIBLE,
        Duration::from_millis(200),
        || async {
            match ch18.count(&ids).await {
                Ok(5) => Ok(()),
                other => Err(format!("{other:?}; server: {}", ch.err_log())),
            }
        },
    )
    .await;
    println!(
        "18.16 https: 5 of 5 rows read back {:?} after the last 202",
        started.elapsed()
    );
    c.wait_metric(&replica_state(&ch.https_url, 2), VISIBLE)
        .await;
    assert_secrets_hidden(&c, &[CH18_PASSWORD]).await;

    // Another CA: the server's certificate is not trusted.
    let mut bad_ca = env.collector(&with_debug_logs(ch_auth(pw, other_ca))).await;
    let (held, line) = refused_and_spooled(
        &bad_ca,
        &ch.https_url,
        3,
        &["replica down", "UnknownIssuer"],
        &ch18,
    )
    .await;
    println!("18.16, another CA: {line}");
    assert_secrets_hidden(&bad_ca, &[CH18_PASSWORD]).await;

    // A wrong password.
    let bad_pw = env.collector(&with_debug_logs(ch_auth(wrong, ca))).await;
    let (_, line) = refused_and_spooled(
        &bad_pw,
        &ch.https_url,
        3,
        &["replica down", "Code: 193", "Wrong password"],
        &ch18,
    )
    .await;
    println!("18.16, wrong password: {line}");
    assert_secrets_hidden(&bad_pw, &[CH18_PASSWORD, WRONG_PASSWORD]).await;

    https_to_the_plain_port_refused(&env, &ch, pw, ca, &ch18).await;

    // The right CA: what the first refused collector held is stored.
    bad_ca.set_env("COLLECTOR_CLICKHOUSE_CA_FILE", ca);
    bad_ca.restart().await;
    wait_counted(
        &env,
        "the 3 held beacons stored once the CA is right",
        &ch18,
        &held,
        3,
    )
    .await;
    bad_ca
        .wait_metric("collector_spool_records 0", VISIBLE)
        .await;
}

/// The 18.16 server `ch` as set up: no password-less `default`, and a wrong password for
/// `collector` refused (193), asked through `reader`.
async fn nobody_without_the_password(ch: &Ch18Tls, reader: &reqwest::Client) {
    let anonymous = clickhouse_query(&ch.http_url, "SELECT 1").await;
    assert!(
        anonymous
            .as_ref()
            .is_err_and(|e| e.contains("Unknown user default")),
        "no password-less default: {anonymous:?}"
    );
    let guessed = ch_query(
        reader,
        &ch.https_url,
        "collector",
        WRONG_PASSWORD,
        "SELECT 1",
    )
    .await;
    assert!(
        guessed.as_ref().is_err_and(|e| e.contains("Code: 193")),
        "wrong password refused (193): {guessed:?}"
    );
}

/// `migrate` with the server's certificate from another CA (`other_ca`) and with a `wrong`
/// password file: each refused (exit 1), naming the server `url` and why, without a password.
fn migrate_refused_with_another_ca_or_password(
    env: &TestEnv<'_>,
    url: &str,
    pw: &str,
    wrong: &str,
    ca: &str,
    other_ca: &str,
) {
    for (refused, why) in [
        (ch_auth(pw, other_ca), "UnknownIssuer"),
        (ch_auth(wrong, ca), "Code: 193"),
    ] {
        let out = env.cli_with(&refused, &["migrate"]);
        assert_eq!(
            out.code, 1,
            "migrate refused ({why}): {}{}",
            out.stdout, out.stderr
        );
        assert!(
            out.stderr.contains(why) && out.stderr.contains(url),
            "migrate names the server and why ({why}): {}",
            out.stderr
        );
        assert!(!out.stderr.contains(WRONG_PASSWORD) && !out.stderr.contains(CH18_PASSWORD));
    }
}

/// No fall back to plain HTTP: a collector given an https:// URL naming the 18.16 server's
/// plain HTTP port is refused, its beacons spooled.
async fn https_to_the_plain_port_refused(
    env: &TestEnv<'_>,
    ch: &Ch18Tls,
    pw: &str,
    ca: &str,
    ch18: &Readback<'_>,
) {
    // No fall back to plain HTTP: an https:// URL naming the server's plain HTTP port. (Its
    // first probe meets no answer within 2 s: 18.16 waits for the rest of a request that is a
    // TLS hello; the cause then logged once a minute is rustls's "corrupt message".)
    let plain_port = ch.http_url.rsplit(':').next().unwrap();
    let https_to_plain = format!("https://127.0.0.1:{plain_port}");
    let no_fallback = env
        .collector(&[
            ("COLLECTOR_CLICKHOUSE_URLS", &https_to_plain),
            ("COLLECTOR_CLICKHOUSE_USER", "collector"),
            ("COLLECTOR_CLICKHOUSE_PASSWORD_FILE", pw),
            ("COLLECTOR_CLICKHOUSE_CA_FILE", ca),
        ])
        .await;
    let (_, line) = refused_and_spooled(
        &no_fallback,
        &https_to_plain,
        2,
        &["replica down", &https_to_plain],
        ch18,
    )
    .await;
    println!("18.16, https:// to the plain port: {line}");
}

/// Issue 37, 2, issue 42, 2 and issue 52, 5: a ClickHouse 26.x server with the users that
/// ship (`deploy/clickhouse/users.xml`, from the one template: `migrate` and the write user
/// `collector` with the shipped grants, the read-only `dashboard`), here from loopback, by
/// SHA-256 and with the grants on the test's database. `migrate` runs as `migrate`, the
/// collector stores as `collector` with the right password file; with a wrong one the server
/// refuses (516, authentication failed), the beacons stay spooled and the replica is down.
/// Then the shipped rights: [`assert_shipped_rights`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clickhouse_26_with_the_shipped_users() {
    let tmp = tempfile::tempdir().unwrap();
    let (pw, hex) = password_file(tmp.path(), "ch26.pw", CH26_PASSWORD);
    let (migrate_pw, migrate_hex) = password_file(tmp.path(), "migrate.pw", MIGRATE_PASSWORD);
    let (wrong, _) = password_file(tmp.path(), "wrong.pw", WRONG_PASSWORD);
    let (_, dashboard_hex) = password_file(tmp.path(), "dashboard.pw", DASHBOARD_PASSWORD);
    let (pw, wrong) = (pw.to_str().unwrap(), wrong.to_str().unwrap());
    let migrate_pw = migrate_pw.to_str().unwrap();
    let mut env = TestEnv::empty(Stack::shared()).await;
    let hexes = [migrate_hex.as_str(), hex.as_str(), dashboard_hex.as_str()];
    let server = shipped_users_server(&env.db, hexes).await;
    let plain = reqwest::Client::new();
    let guessed = ch_query(&plain, &server.url, "collector", WRONG_PASSWORD, "SELECT 1").await;
    assert!(
        guessed.as_ref().is_err_and(|e| e.contains("516")),
        "a wrong password is refused (516): {guessed:?}"
    );

    env.clickhouse = vec![server.url.clone()];
    env.table_form = "single";
    env.diag.clickhouse(&env.clickhouse, &env.db);
    let auth = [
        ("COLLECTOR_CLICKHOUSE_USER", "collector"),
        ("COLLECTOR_CLICKHOUSE_PASSWORD_FILE", pw),
    ];
    let migrate_auth = [
        ("COLLECTOR_CLICKHOUSE_USER", "migrate"),
        ("COLLECTOR_CLICKHOUSE_PASSWORD_FILE", migrate_pw),
    ];
    env.cli_with(&migrate_auth, &["migrate"]).success();
    env.cli(&["sites", "add", "--key", "site-1"]).success();
    let c = env.collector(&with_debug_logs(auth.to_vec())).await;
    let ids = send(&c, "site-1", 5).await;
    let started = Instant::now();
    let rows = env.wait_rows(&ids, VISIBLE).await;
    println!(
        "26.x with a password: {} of 5 rows {:?} after the last 202",
        rows.len(),
        started.elapsed()
    );
    // As the collector user too (what the server stored was written by it).
    let ch26 = Readback::ch26(&plain, &server.url, &env.db);
    let n = ch26.count(&ids).await;
    assert_eq!(n, Ok(5));
    assert_secrets_hidden(&c, &[CH26_PASSWORD]).await;

    let bad = env
        .collector(&[
            ("COLLECTOR_CLICKHOUSE_USER", "collector"),
            ("COLLECTOR_CLICKHOUSE_PASSWORD_FILE", wrong),
            ("RUST_LOG", "debug"),
        ])
        .await;
    let (_, line) = refused_and_spooled(
        &bad,
        &server.url,
        3,
        &["replica down", "516", "AUTHENTICATION_FAILED"],
        &ch26,
    )
    .await;
    println!("26.x, wrong password: {line}");
    assert_secrets_hidden(&bad, &[CH26_PASSWORD, WRONG_PASSWORD]).await;
    assert_shipped_rights(&env, &server.url, &migrate_auth, &ids).await;
    assert_write_user_rights(&env, &server.url, &auth, &c).await;
}

/// A ClickHouse 26.x server of the test's own with the users of `deploy/` ([`stack::deploy::users`]),
/// from loopback, by the SHA-256 of their passwords (`migrate`, `collector`, `dashboard`), with
/// their grants on `db` in place of `collector`, and the dashboards' profile.
async fn shipped_users_server(db: &str, hex: [&str; 3]) -> Ch26Server {
    use stack::users::{
        grants_on, Password, User, COLLECTOR_GRANTS, DASHBOARD_GRANTS, LOOPBACK, MIGRATE_GRANTS,
    };
    let passwords = stack::deploy::Passwords {
        migrate: Password::Sha256Hex(hex[0]),
        collector: Password::Sha256Hex(hex[1]),
        dashboard: Password::Sha256Hex(hex[2]),
    };
    let [default, migrate, collector, dashboard] = stack::deploy::users(passwords, &LOOPBACK);
    let on_db = |grants: &[&str]| grants_on(grants, db);
    let grants = [
        on_db(&MIGRATE_GRANTS),
        on_db(&COLLECTOR_GRANTS),
        on_db(&DASHBOARD_GRANTS),
    ];
    let grants: Vec<Vec<&str>> = grants
        .iter()
        .map(|g| g.iter().map(String::as_str).collect())
        .collect();
    let users = [
        default,
        User {
            grants: &grants[0],
            ..migrate
        },
        User {
            grants: &grants[1],
            ..collector
        },
        User {
            grants: &grants[2],
            ..dashboard
        },
    ];
    Ch26Server::start_with(&[], &[stack::users::DASHBOARD_PROFILE], &users).await
}

/// Asserts that `sql` as `user` is refused with one of `codes` (ClickHouse's error names).
async fn assert_refused(url: &str, user: &str, password: &str, sql: &str, codes: &[&str]) {
    let answer = ch_exec(&reqwest::Client::new(), url, user, password, sql).await;
    assert!(
        answer
            .as_ref()
            .is_err_and(|e| codes.iter().any(|c| e.contains(c))),
        "`{user}` must be refused {sql:?} with one of {codes:?}: {answer:?}"
    );
}

/// The shipped rights on the 26.x server at `url` (database `env.db`, `ids` of site-1 stored):
/// as `migrate` (`auth`), `retention` and `sites purge site-1` succeed and the purge leaves
/// none of `ids`; a database of its own, user management and `system.processes` are refused.
/// As `dashboard`: reading `env.db` and setting `max_execution_time` answer; any other setting,
/// writing and DDL are refused. What docs/deployment.md ("ClickHouse users") promises.
async fn assert_shipped_rights(
    env: &TestEnv<'_>,
    url: &str,
    auth: &[(&str, &str); 2],
    ids: &[String],
) {
    let spool = tempfile::tempdir().unwrap();
    let spool = spool.path().to_str().unwrap();
    let with = |extra: (&'static str, &'static str)| {
        vec![auth[0], auth[1], ("COLLECTOR_SPOOL_DIR", spool), extra]
    };
    env.cli_with(&with(("COLLECTOR_RETENTION", "30d")), &["retention"])
        .success();
    env.cli_with(
        &with(("COLLECTOR_SETTINGS_TTL", "1s")),
        &["sites", "purge", "site-1"],
    )
    .success();
    let plain = reqwest::Client::new();
    let left = Readback::ch26(&plain, url, &env.db).count(ids).await;
    assert_eq!(
        left,
        Ok(0),
        "`sites purge` as `collector` deleted the site's rows"
    );
    let db = &env.db;
    let denied = ["ACCESS_DENIED"];
    for sql in [
        format!("CREATE DATABASE other_{db}"),
        format!("CREATE USER u_{db}"),
        "SELECT count() FROM system.processes".to_owned(),
    ] {
        assert_refused(url, "migrate", MIGRATE_PASSWORD, &sql, &denied).await;
        assert_refused(url, "collector", CH26_PASSWORD, &sql, &denied).await;
    }
    let read = format!("SELECT count() FROM {db}.measurements SETTINGS max_execution_time = 30");
    let answer = ch_exec(&plain, url, "dashboard", DASHBOARD_PASSWORD, &read).await;
    assert_eq!(answer.as_deref(), Ok("0\n"), "`dashboard` reads: {read}");
    let readonly = ["READONLY", "ACCESS_DENIED", "SETTING_CONSTRAINT_VIOLATION"];
    for sql in [
        format!("SELECT count() FROM {db}.measurements SETTINGS max_threads = 1"),
        format!("SELECT count() FROM {db}.measurements SETTINGS max_execution_time = 601"),
        format!("ALTER TABLE {db}.measurements DELETE WHERE 1"),
        format!("CREATE DATABASE other_{db}"),
    ] {
        assert_refused(url, "dashboard", DASHBOARD_PASSWORD, &sql, &readonly).await;
    }
}

/// Issue 52, 5: the write user `collector` (`auth`) of the 26.x server at `url` (database
/// `env.db`, the table made and its TTL of 30 days set by `migrate`) may not `DROP`, `ALTER` (delete,
/// update, TTL, columns) or `TRUNCATE`: `ACCESS_DENIED`. Its own daily retention run
/// (`collector retention` as `collector`) exits 0: the TTL `migrate`'s run set is left as it
/// is. And what the serving collector `c` sends works: with the table dropped (as `migrate`),
/// its prober makes it anew (`CREATE ... IF NOT EXISTS` as `collector`) and new beacons are
/// stored.
async fn assert_write_user_rights(
    env: &TestEnv<'_>,
    url: &str,
    auth: &[(&str, &str); 2],
    c: &Collector,
) {
    let db = &env.db;
    let denied = ["ACCESS_DENIED"];
    for sql in [
        format!("DROP TABLE {db}.measurements"),
        format!("TRUNCATE TABLE {db}.measurements"),
        format!("ALTER TABLE {db}.measurements DELETE WHERE 1"),
        format!("ALTER TABLE {db}.measurements UPDATE site = 'x' WHERE 1"),
        format!("ALTER TABLE {db}.measurements MODIFY TTL page_view_at + INTERVAL 1 DAY"),
        format!("ALTER TABLE {db}.measurements ADD COLUMN IF NOT EXISTS x UInt8"),
        format!("ALTER TABLE {db}.measurements DROP PARTITION 202601"),
        format!("DROP DATABASE {db}"),
    ] {
        assert_refused(url, "collector", CH26_PASSWORD, &sql, &denied).await;
    }
    let spool = tempfile::tempdir().unwrap();
    let spool = spool.path().to_str().unwrap();
    // The retention `assert_shipped_rights` had `migrate` apply.
    let out = env.cli_with(
        &[
            auth[0],
            auth[1],
            ("COLLECTOR_SPOOL_DIR", spool),
            ("COLLECTOR_RETENTION", "30d"),
        ],
        &["retention"],
    );
    println!("26.x, retention as the write user: {}", out.stdout.trim());
    out.success();
    let plain = reqwest::Client::new();
    let drop = format!("DROP TABLE {db}.measurements SYNC");
    let dropped = ch_exec(&plain, url, "migrate", MIGRATE_PASSWORD, &drop).await;
    assert!(dropped.is_ok(), "`migrate` drops the table: {dropped:?}");
    // A site of its own: site-1 is purged, and the collector drops a purged site's beacons.
    env.cli(&["sites", "add", "--key", "site-2"]).success();
    let ids = send(c, "site-2", 3).await;
    let started = Instant::now();
    // The table first (a query on a missing table fails), then the rows.
    let exists = format!("EXISTS TABLE {db}.measurements");
    loop {
        let answer = ch_exec(&plain, url, "migrate", MIGRATE_PASSWORD, &exists).await;
        if answer.as_deref() == Ok("1\n") {
            break;
        }
        assert!(
            started.elapsed() < VISIBLE,
            "the write user's prober did not make {db}.measurements anew within {VISIBLE:?}: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    env.wait_rows(&ids, VISIBLE).await;
    println!(
        "26.x, the table made anew by the write user's prober: 3 rows {:?} after the last 202",
        started.elapsed()
    );
}

/// `postgres://postgres@127.0.0.1:PORT/DB` with `query` (e.g. `sslmode=...`).
fn pg_url(pg: &OwnPg, db: &str, query: &str) -> String {
    format!("postgres://postgres@127.0.0.1:{}/{db}?{query}", pg.port)
}

/// The settings store's settings: `COLLECTOR_DATABASE_URL` `url`, the password from the file
/// `password_file`.
fn store_settings<'a>(url: &'a str, password_file: &'a str) -> [(&'a str, &'a str); 2] {
    [
        ("COLLECTOR_DATABASE_URL", url),
        ("COLLECTOR_DATABASE_PASSWORD_FILE", password_file),
    ]
}

/// The lines of a PostgreSQL log that say a connection to `db` was let in.
fn authorized(log: &str, db: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("connection authorized") && l.contains(&format!("database={db}")))
        .count()
}

/// Issue 37, 3: a PostgreSQL 15 of the test's own with `ssl = on` (a certificate of the test's
/// CA), password authentication and plain TCP refused. The collector and its commands read the
/// site settings with `sslmode=verify-full` and `sslrootcert=` that CA, the password from
/// `COLLECTOR_DATABASE_PASSWORD_FILE` (the server shows their connections encrypted); another CA
/// under `verify-full` fails with a clear error (the command exits non-zero, the collector
/// never loads the settings: its beacons 503, `/readyz` says why); `sslmode=require` against a
/// server without TLS fails and nothing of it goes on in plain (that server logs no connection
/// let in, though it would take the same password in plain).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_with_tls_under_each_sslmode() {
    let tmp = tempfile::tempdir().unwrap();
    let (pki, other) = two_cas(tmp.path());
    let (pw, _) = password_file(tmp.path(), "pg.pw", PG_PASSWORD);
    let pw = pw.to_str().unwrap();
    let (ca, other_ca) = (pki.ca.display(), other.ca.display());
    let pg = OwnPg::start(Some(&pki), PG_PASSWORD).await;
    let plain_pg = OwnPg::start(None, PG_PASSWORD).await;
    for server in [&pg, &plain_pg] {
        server
            .admin("postgres")
            .await
            .batch_execute("CREATE DATABASE access")
            .await
            .unwrap();
    }
    let env = TestEnv::empty(Stack::shared()).await;
    let verify_full = pg_url(
        &pg,
        "access",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    );
    let store = store_settings(&verify_full, pw);
    env.cli_with(&store, &["migrate"]).success();
    env.cli_with(&store, &["sites", "add", "--key", "tls-site"])
        .success();
    // The password is what the file gives: without the file the server refuses.
    let out = env.cli_with(&store[..1], &["sites", "list"]);
    assert_ne!(out.code, 0, "no password: {}{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("password"),
        "the server asked for a password: {}",
        out.stderr
    );
    let listed = env.cli_with(&store, &["sites", "list"]);
    assert!(
        listed.success().stdout.contains("tls-site"),
        "{}",
        listed.stdout
    );

    let c = env.collector(&with_debug_logs(store.to_vec())).await;
    let ids = send(&c, "tls-site", 3).await;
    env.wait_rows(&ids, VISIBLE).await;
    assert_eq!(c.metric("collector_settings_store_up").await, 1.0);
    let admin = pg.admin("postgres").await;
    let row = admin
        .query_one(
            "SELECT count(*) FILTER (WHERE s.ssl) AS tls, count(*) FILTER (WHERE NOT s.ssl) AS plain \
             FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.datname = 'access' AND a.backend_type = 'client backend'",
            &[],
        )
        .await
        .unwrap();
    let (tls, plain): (i64, i64) = (row.get("tls"), row.get("plain"));
    println!("PostgreSQL verify-full: the collector's connections: {tls} encrypted, {plain} plain");
    assert_eq!(plain, 0, "no plain connection to the settings store");
    assert!(tls >= 1, "the collector holds an encrypted connection");
    assert_secrets_hidden(&c, &[PG_PASSWORD]).await;

    // Another CA under verify-full: a clear error, no settings.
    another_ca_refused(&env, &pg, pw, &other_ca.to_string()).await;

    // sslmode=require against a server without TLS: fails, never goes on in plain.
    require_never_goes_on_in_plain(&env, &plain_pg, pw).await;
}

/// Another CA (`other_ca`) under `verify-full` to `pg`: a clear error naming the certificate
/// from `sites list`, and a collector that never loads the settings (its beacons 503,
/// `/readyz` says why, the log names the certificate), without the password anywhere.
async fn another_ca_refused(env: &TestEnv<'_>, pg: &OwnPg, pw: &str, other_ca: &str) {
    let wrong_ca = pg_url(
        pg,
        "access",
        &format!("sslmode=verify-full&sslrootcert={other_ca}"),
    );
    let untrusted = store_settings(&wrong_ca, pw);
    let out = env.cli_with(&untrusted, &["sites", "list"]);
    assert_ne!(out.code, 0, "another CA: {}{}", out.stdout, out.stderr);
    assert!(
        out.stderr.to_ascii_lowercase().contains("certificate"),
        "the error names the certificate: {}",
        out.stderr
    );
    assert!(!out.stderr.contains(PG_PASSWORD), "{}", out.stderr);
    println!("PostgreSQL, another CA: {}", out.stderr.trim());
    let refused = env.collector(&with_debug_logs(untrusted.to_vec())).await;
    let (id, m) = beacon_on("tls-site", "https://shop.example/");
    let (status, body) = refused.post_json(&m).await;
    assert_eq!(
        status, 503,
        "a never-seen site while the store cannot be read: {body}"
    );
    let ready = http_get(format!("{}/readyz", refused.admin_url)).await;
    assert_eq!(ready.status(), 503);
    let reason = ready.text().await.unwrap();
    assert!(reason.contains("site settings not loaded"), "{reason}");
    assert_eq!(refused.metric("collector_settings_store_up").await, 0.0);
    let line = wait_log_line(&refused, &["certificate"], NOTICED).await;
    println!("PostgreSQL, another CA, the collector's log: {line}");
    assert!(env.rows(std::slice::from_ref(&id)).await.is_empty());
    assert_secrets_hidden(&refused, &[PG_PASSWORD]).await;
}

/// `sslmode=require` against `plain_pg`, a server without TLS: the command fails, saying TLS
/// was refused, and neither it nor a collector goes on in plain (no connection let in after).
async fn require_never_goes_on_in_plain(env: &TestEnv<'_>, plain_pg: &OwnPg, pw: &str) {
    let disable = pg_url(plain_pg, "access", "sslmode=disable");
    let plain_store = store_settings(&disable, pw);
    env.cli_with(&plain_store, &["migrate"]).success();
    env.cli_with(&plain_store, &["sites", "add", "--key", "plain-site"])
        .success();
    let before = authorized(&plain_pg.log(), "access");
    assert!(
        before >= 2,
        "sslmode=disable connected in plain: {}",
        plain_pg.log()
    );
    let require = pg_url(plain_pg, "access", "sslmode=require");
    let out = env.cli_with(&store_settings(&require, pw), &["sites", "list"]);
    assert_ne!(
        out.code, 0,
        "sslmode=require to a server without TLS must fail: {}{}",
        out.stdout, out.stderr
    );
    let err = out.stderr.to_ascii_lowercase();
    assert!(
        err.contains("tls") || err.contains("ssl"),
        "the error says TLS was refused: {}",
        out.stderr
    );
    assert!(!out.stdout.contains("plain-site"), "{}", out.stdout);
    println!(
        "PostgreSQL, require to a plain server: {}",
        out.stderr.trim()
    );
    let required = env.collector(&store_settings(&require, pw)).await;
    let (_, m) = beacon_on("plain-site", "https://shop.example/");
    let (status, body) = required.post_json(&m).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(required.metric("collector_settings_store_up").await, 0.0);
    assert_eq!(
        authorized(&plain_pg.log(), "access"),
        before,
        "no connection let in after sslmode=require: {}",
        plain_pg.log()
    );
}

/// Issue 37, 4: one collector with both passwords (ClickHouse 18.16 over https, PostgreSQL over
/// TLS), at debug level, working; then the commands (`migrate`, `sites list`) and a collector
/// refused for a wrong password: neither password shows in a log line, `/metrics`, a command's
/// output, a process argument or the process environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_show() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::new(tmp.path(), "ca");
    let (ch_pw, hex) = password_file(tmp.path(), "ch.pw", CH18_PASSWORD);
    let (pg_pw, _) = password_file(tmp.path(), "pg.pw", PG_PASSWORD);
    let (wrong, _) = password_file(tmp.path(), "wrong.pw", WRONG_PASSWORD);
    let (ch_pw, pg_pw, wrong) = (
        ch_pw.to_str().unwrap(),
        pg_pw.to_str().unwrap(),
        wrong.to_str().unwrap(),
    );
    let ca = pki.ca.to_str().unwrap();
    let ch = Ch18Tls::start(&pki, CH18_PASSWORD, &hex).await;
    let pg = OwnPg::start(Some(&pki), PG_PASSWORD).await;
    pg.admin("postgres")
        .await
        .batch_execute("CREATE DATABASE access")
        .await
        .unwrap();
    let mut env = TestEnv::empty(Stack::shared()).await;
    env.clickhouse = vec![ch.https_url.clone()];
    env.table_form = "single";
    let store = pg_url(
        &pg,
        "access",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    );
    let mut settings = ch_auth(ch_pw, ca);
    settings.extend([
        ("COLLECTOR_DATABASE_URL", store.as_str()),
        ("COLLECTOR_DATABASE_PASSWORD_FILE", pg_pw),
        ("RUST_LOG", "debug"),
    ]);
    let secrets = [CH18_PASSWORD, PG_PASSWORD, WRONG_PASSWORD];
    for args in [
        &["migrate"][..],
        &["sites", "add", "--key", "site-1"],
        &["sites", "list"],
    ] {
        let out = env.cli_with(&settings, args);
        out.success();
        for s in secrets {
            assert!(
                !out.stdout.contains(s) && !out.stderr.contains(s),
                "collector {args:?} shows {s:?}:\n{}{}",
                out.stdout,
                out.stderr
            );
        }
    }
    let c = env.collector(&settings).await;
    let ids = send(&c, "site-1", 3).await;
    let reader = pki.client();
    let db = env.db.clone();
    let ch18 = Readback::ch18(&reader, &ch, &db);
    wait_counted(&env, "3 rows over https", &ch18, &ids, 3).await;
    assert_secrets_hidden(&c, &secrets).await;

    // Refused for a wrong ClickHouse password: the error is logged, the password is not.
    let mut refused_settings = settings.clone();
    refused_settings.retain(|(k, _)| *k != "COLLECTOR_CLICKHOUSE_PASSWORD_FILE");
    refused_settings.push(("COLLECTOR_CLICKHOUSE_PASSWORD_FILE", wrong));
    let refused = env.collector(&refused_settings).await;
    send(&refused, "site-1", 1).await;
    refused
        .wait_metric(&replica_state(&ch.https_url, 0), NOTICED)
        .await;
    wait_log_line(&refused, &["replica down", "193"], NOTICED).await;
    assert_secrets_hidden(&refused, &[CH18_PASSWORD, PG_PASSWORD, WRONG_PASSWORD]).await;
}

/// `GET url` through `client`: status and body.
async fn get(client: &reqwest::Client, url: &str) -> (u16, String) {
    let r = client
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: no answer: {e}"));
    let status = r.status().as_u16();
    (status, r.text().await.unwrap())
}

/// Issue 37, 5: the operations endpoints are private. On the public listener `/metrics` is 404
/// and `/readyz` gives the status only (`{"error":"not ready"}` when not ready); the operations
/// listener (`COLLECTOR_ADMIN_LISTEN`) serves `/metrics` and `/readyz` with its reason. Through
/// the shipped HAProxy edge (`deploy/edge/haproxy.cfg` started by `deploy/edge/haproxy-run.sh`,
/// as root, the shipped user and group): `/metrics` 404, `/script.js` 200, a beacon 202 and
/// stored; HAProxy's workers run as user `haproxy`, its master as root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_endpoints_are_private_and_the_edge_passes_only_the_public_paths() {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env.collector(&[]).await;
    let public = http();
    assert_eq!(get(&public, &format!("{}/metrics", c.url)).await.0, 404);
    assert_eq!(
        get(&public, &format!("{}/readyz", c.url)).await,
        (200, "ready\n".into())
    );
    let (status, metrics) = get(&public, &format!("{}/metrics", c.admin_url)).await;
    assert_eq!(status, 200);
    assert!(metrics.contains("collector_spool_records "), "{metrics}");
    assert_eq!(
        get(&public, &format!("{}/readyz", c.admin_url)).await,
        (200, "ready\n".into())
    );
    // Not ready (its settings store cannot be reached, so its site settings never load): the
    // public listener says so and no more, the operations listener says why.
    let nowhere = format!("postgres://postgres@127.0.0.1:{}/x", free_port());
    let unready = env
        .collector(&[("COLLECTOR_DATABASE_URL", nowhere.as_str())])
        .await;
    let (status, body) = get(&public, &format!("{}/readyz", unready.url)).await;
    assert_eq!((status, body.as_str()), (503, r#"{"error":"not ready"}"#));
    let (status, body) = get(&public, &format!("{}/readyz", unready.admin_url)).await;
    assert_eq!(status, 503);
    let reason: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        field(&reason, "error"),
        "site settings not loaded",
        "{body}"
    );
    assert_eq!(
        get(&public, &format!("{}/metrics", unready.url)).await.0,
        404
    );

    // The shipped edge in front.
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the edge is started as root, as its systemd unit does, so that it can drop to haproxy"
    );
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::new(tmp.path(), "edge");
    let edge = EdgeHaproxy::start(&pki, c.port).await;
    let client = pki.client();
    for path in ["/metrics", "//metrics/", "/api/v1/other", "/metrics?x=1"] {
        let (status, body) = get(&client, &format!("{}{path}", edge.url)).await;
        assert_eq!(
            (status, body.as_str()),
            (404, r#"{"error":"not found"}"#),
            "{path}"
        );
    }
    let (status, script) = get(&client, &format!("{}/script.js", edge.url)).await;
    assert_eq!(status, 200);
    assert!(
        script.len() > 1000,
        "the tracking script: {} bytes",
        script.len()
    );
    let (id, m) = beacon_on("site-1", "https://shop.example/");
    let answer = client
        .post(format!("{}/api/v1/measurements", edge.url))
        .header("content-type", "text/plain")
        .body(m.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 202, "{}", edge.logs());
    env.wait_rows(std::slice::from_ref(&id), VISIBLE).await;

    let haproxy = uid_of("haproxy");
    let master = edge.master_pid();
    assert_eq!(
        uids(master),
        vec![0; 4],
        "the master stays root (it reloads)"
    );
    let workers = edge.worker_pids();
    assert!(
        !workers.is_empty(),
        "no worker of master {master}: {}",
        edge.logs()
    );
    for w in &workers {
        assert_eq!(
            uids(*w),
            vec![haproxy; 4],
            "worker {w}: real, effective, saved and fs uid are haproxy's ({haproxy})"
        );
    }
    println!("edge: master {master} uid 0, workers {workers:?} uid {haproxy} (haproxy)");
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

/// Issue 37, 6: beacons must come from the shop's pages. For a site with an origin, a beacon
/// whose `url` is on another host is rejected (`url_not_allowed`, in the answer and the metric)
/// and not stored, while one on the site's host is. Then a flood without `Origin` at three times
/// the site's rate (`COLLECTOR_SITE_RATE` 20/s: 60/s for 10 s) beside real visitors with the
/// shop's `Origin` at 5/s: at least 99 % of the visitors' beacons are answered 202 and stored,
/// and the flood gets no more than its own budget (a tenth of the site's: 2/s, bursts of 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beacons_must_come_from_the_shops_pages() {
    let env = TestEnv::new(Stack::shared()).await;
    env.add_site("shop", &["--origin", "https://shop.example"]);
    let c = env.collector(&[("COLLECTOR_SITE_RATE", "20")]).await;
    another_hosts_page_rejected(&env, &c).await;
    // Another host however the URL is written, and the site's host however it is written.
    hosts_however_written(&env, &c).await;

    // The flood and the visitors, side by side.
    let url = format!("{}/api/v1/measurements", c.url);
    let flooder = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let visitor = flooder.clone();
    let length = Duration::from_secs(10);
    let flood = tokio::spawn(flood_without_origin(flooder, url.clone(), length));
    let (acked, sent, slowest, visitor_statuses) = visitors(&visitor, &url, length).await;
    let (flood_statuses, flood_for) = flood.await.unwrap();
    let flood_sent: usize = flood_statuses.values().sum();
    println!(
        "flood without Origin: {flood_sent} in {flood_for:?}, answers {flood_statuses:?}; \
         visitors: {sent} sent, answers {visitor_statuses:?}, slowest answer {slowest:?}"
    );
    assert!(
        acked.len() * 100 >= sent * 99,
        "at least 99 % of the visitors' beacons answered 202: {} of {sent} ({visitor_statuses:?})",
        acked.len()
    );
    let stored = env.wait_rows(&acked, VISIBLE).await;
    assert!(
        stored.len() * 100 >= sent * 99,
        "{} stored of {sent}",
        stored.len()
    );
    // The flood's budget: 2/s with a burst of 4 over its run; one second of slack for the
    // timing of a busy machine (the limiter's clock starts before the first tick).
    let flood_acked = flood_statuses.get(&202).copied().unwrap_or(0);
    let budget = 4 + 2 * (flood_for.as_secs() as usize + 1);
    assert!(
        flood_acked <= budget,
        "the flood got {flood_acked} through, its budget is {budget}: {flood_statuses:?}"
    );
    assert!(
        flood_statuses.get(&429).copied().unwrap_or(0) >= flood_sent - budget,
        "the rest of the flood is answered 429: {flood_statuses:?}"
    );
    assert!(
        flood_sent >= 500,
        "the flood ran at about 60/s: {flood_sent}"
    );
}

/// A beacon of another host's page is rejected (`url_not_allowed`) beside one on the site's
/// host, and refused (403) alone; neither is stored, the site's one is.
async fn another_hosts_page_rejected(env: &TestEnv<'_>, c: &Collector) {
    let (good, good_m) = beacon_on("shop", "https://shop.example/cart");
    let (bad, bad_m) = beacon_on("shop", "https://evil.example/cart");
    let (status, answer, _) = c
        .post(
            json!([good_m, bad_m]).to_string(),
            &[
                ("content-type", "application/json"),
                ("origin", "https://shop.example"),
            ],
        )
        .await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(
        field(&answer, "rejected"),
        &json!([{"index": 1, "error": "url_not_allowed"}])
    );
    let (alone, alone_m) = beacon_on("shop", "https://shop.example.evil.example/");
    let (status, answer, _) = c
        .post(alone_m.to_string(), &[("content-type", "application/json")])
        .await;
    assert_eq!(status, 403, "a beacon on another host alone: {answer}");
    env.wait_rows(std::slice::from_ref(&good), VISIBLE).await;
    assert!(
        env.rows(&[bad.clone(), alone.clone()]).await.is_empty(),
        "the beacons of another host's pages are not stored"
    );
}

/// URLs of another host, however written, that must be rejected for the site
/// `https://shop.example`.
const HOSTILE: [&str; 9] = [
    "https://shop.example@evil.example/",
    "https://shop.example:pw@evil.example/p",
    "https://evil.example\\@shop.example/",
    "https://evil.example#@shop.example",
    "https://evil.example?@shop.example",
    "https://evil.example/shop.example",
    "https://shop.example.evil.example/",
    "https://evilshop.example/",
    "https://[::1]/shop.example",
];

/// [`HOSTILE`] URLs in one batch with URLs of the site's host written in other ways: every one
/// of another host rejected and not stored, none of the site's.
async fn hosts_however_written(env: &TestEnv<'_>, c: &Collector) {
    let hostile = HOSTILE;
    let friendly = [
        "https://SHOP.example/p",
        "http://shop.example:8080/p",
        "https://shop.example:443/p?utm_source=x",
        "https://user@shop.example/p",
    ];
    let mut batch = Vec::new();
    let mut ids = Vec::new();
    for url in hostile.iter().chain(&friendly) {
        let (id, m) = beacon_on("shop", url);
        ids.push(id);
        batch.push(m);
    }
    let (status, answer, _) = c
        .post(
            Value::Array(batch).to_string(),
            &[
                ("content-type", "application/json"),
                ("origin", "https://shop.example"),
            ],
        )
        .await;
    assert_eq!(status, 202, "{answer}");
    let expected: Vec<Value> = (0..hostile.len())
        .map(|i| json!({"index": i, "error": "url_not_allowed"}))
        .collect();
    assert_eq!(
        field(&answer, "rejected"),
        &Value::Array(expected),
        "every page of another host rejected, none of the site's: {hostile:?} then {friendly:?}"
    );
    assert_eq!(field(&answer, "accepted"), friendly.len());
    let stored = env.wait_rows(&ids[hostile.len()..], VISIBLE).await;
    assert_eq!(stored.len(), friendly.len());
    assert!(
        env.rows(&ids[..hostile.len()]).await.is_empty(),
        "no page of another host stored"
    );
    assert_eq!(
        c.metric("collector_measurements_rejected_total{reason=\"url_not_allowed\"}")
            .await,
        (2 + hostile.len()) as f64
    );
}

/// Beacons without `Origin` to `url` through `client` at 60/s for `length`: the answers by
/// status, and how long it ran.
async fn flood_without_origin(
    flooder: reqwest::Client,
    flood_url: String,
    length: Duration,
) -> (std::collections::BTreeMap<u16, usize>, Duration) {
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / 60));
    let mut sent = Vec::new();
    let start = Instant::now();
    while start.elapsed() < length {
        tick.tick().await;
        let (client, url) = (flooder.clone(), flood_url.clone());
        let (_, m) = beacon_on("shop", "https://shop.example/p/flood");
        sent.push(tokio::spawn(async move {
            post_status(&client, &url, &m, &[]).await
        }));
    }
    let elapsed = start.elapsed();
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for s in sent {
        *statuses.entry(s.await.unwrap()).or_default() += 1;
    }
    (statuses, elapsed)
}

/// Visitors' beacons with the shop's `Origin` to `url` through `visitor` at 5/s for `length`:
/// the ids answered 202, the number sent, the slowest answer and the answers by status.
async fn visitors(
    visitor: &reqwest::Client,
    url: &str,
    length: Duration,
) -> (
    Vec<String>,
    usize,
    Duration,
    std::collections::BTreeMap<u16, usize>,
) {
    let origin = [("origin", "https://shop.example".to_owned())];
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let mut visits = Vec::new();
    let start = Instant::now();
    while start.elapsed() < length {
        tick.tick().await;
        let (client, url, headers) = (visitor.clone(), url.to_owned(), origin.clone());
        let (id, m) = beacon_on("shop", "https://shop.example/p/visit");
        visits.push(tokio::spawn(async move {
            let sent = Instant::now();
            let status = post_status(&client, &url, &m, &headers).await;
            (id, status, sent.elapsed())
        }));
    }
    let mut acked = Vec::new();
    let mut slowest = Duration::ZERO;
    let mut visitor_statuses = std::collections::BTreeMap::<u16, usize>::new();
    let sent = visits.len();
    for v in visits {
        let (id, status, took) = v.await.unwrap();
        *visitor_statuses.entry(status).or_default() += 1;
        slowest = slowest.max(took);
        if status == 202 {
            acked.push(id);
        }
    }
    (acked, sent, slowest, visitor_statuses)
}

/// One client rotating the address it claims: `n` beacons back to back from its own loopback
/// address through `client` to `url`, each with a new `X-Forwarded-For` and `Forwarded` value of
/// its choosing. The answers by status and how long it took.
async fn rotate(
    client: &reqwest::Client,
    url: &str,
    n: usize,
) -> (std::collections::BTreeMap<u16, usize>, Duration) {
    let mut statuses = std::collections::BTreeMap::new();
    let start = Instant::now();
    for i in 0..n {
        let claimed = format!("198.51.100.{}", i % 250 + 1);
        let (_, m) = beacon_on("site-1", "https://shop.example/");
        let headers = [
            ("x-forwarded-for", claimed.clone()),
            ("forwarded", format!("for={claimed}")),
        ];
        *statuses
            .entry(post_status(client, url, &m, &headers).await)
            .or_default() += 1;
    }
    (statuses, start.elapsed())
}

/// The per-client rate of the test: 2 a second, bursts of 4.
const CLIENT_RATE: &str = "2";

/// What the per-client rate lets through in `elapsed`, with one second of slack for a busy
/// machine; checked to be well below the 60 beacons sent (a run so slow that the rate would let
/// most of them through would prove nothing).
fn client_budget(elapsed: Duration) -> usize {
    let budget = 4 + 2 * (elapsed.as_secs() as usize + 1);
    assert!(
        budget <= 40,
        "60 beacons took {elapsed:?}: too slow for the rate to show (budget {budget})"
    );
    budget
}

/// 60 beacons rotating the address they claim through `url` from `rotating`: no more than one
/// client's budget gets through, the rest is 429, and `other` then still has its own budget.
/// Returns how many were refused.
async fn one_clients_budget(
    label: &str,
    rotating: &reqwest::Client,
    other: &reqwest::Client,
    url: &str,
) -> usize {
    let (statuses, took) = rotate(rotating, url, 60).await;
    let budget = client_budget(took);
    let through = statuses.get(&202).copied().unwrap_or(0);
    let refused = statuses.get(&429).copied().unwrap_or(0);
    println!("{label}: 60 beacons rotating X-Forwarded-For/Forwarded in {took:?}: {statuses:?} (budget {budget})");
    assert!(
        through <= budget,
        "{label}: {through} got through, budget {budget}: {statuses:?}"
    );
    assert_eq!(
        refused,
        60 - through,
        "{label}: the rest is 429: {statuses:?}"
    );
    let (_, m) = beacon_on("site-1", "https://shop.example/");
    assert_eq!(
        post_status(other, url, &m, &[]).await,
        202,
        "{label}: another client has its own budget"
    );
    refused
}

/// The settings of a collector behind a proxy on 127.0.0.1 that it trusts, reading the client
/// address from `header`, [`CLIENT_RATE`] beacons a second per client.
fn behind_a_trusted_proxy(header: &str) -> [(&str, &str); 3] {
    [
        ("COLLECTOR_TRUSTED_PROXIES", "127.0.0.1/32"),
        ("COLLECTOR_CLIENT_IP_HEADER", header),
        ("COLLECTOR_CLIENT_RATE", CLIENT_RATE),
    ]
}

/// Issue 37, 7: the client address cannot be chosen by the client. A collector behind a trusted
/// proxy (`COLLECTOR_TRUSTED_PROXIES` 127.0.0.1, `COLLECTOR_CLIENT_IP_HEADER` X-Forwarded-For,
/// `COLLECTOR_CLIENT_RATE` 2/s, bursts of 4): a client that sends 60 beacons, each claiming
/// another address in `X-Forwarded-For` and `Forwarded`, through a real nginx (the shipped
/// guide's configuration) and then through the shipped HAProxy edge, gets no more than one
/// client's budget and the rest 429; so does one behind an nginx that appends to `Forwarded`,
/// to a collector reading `Forwarded`; another client meanwhile keeps its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cannot_choose_its_address_behind_a_trusted_proxy() {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env
        .collector(&behind_a_trusted_proxy("X-Forwarded-For"))
        .await;
    // A second collector that reads `Forwarded`, behind an nginx location that appends the
    // peer to the `Forwarded` the client sent (RFC 7239's way) and passes its
    // `X-Forwarded-For` through untouched.
    let by_forwarded = env.collector(&behind_a_trusted_proxy("Forwarded")).await;
    let fwd = format!(
        "location /fwd/ {{\n  proxy_pass http://127.0.0.1:{}/;\n  \
         proxy_set_header Forwarded \"$http_forwarded, for=$remote_addr\";\n}}",
        by_forwarded.port
    );
    let nginx = Nginx::start(c.port, &fwd).await;
    let through_nginx = format!("{}/perf/api/v1/measurements", nginx.url);
    let mut refused = one_clients_budget(
        "nginx",
        &client_from("127.0.0.5"),
        &client_from("127.0.0.6"),
        &through_nginx,
    )
    .await;

    let appended = format!("{}/fwd/api/v1/measurements", nginx.url);
    one_clients_budget(
        "nginx appending Forwarded",
        &client_from("127.0.0.9"),
        &client_from("127.0.0.10"),
        &appended,
    )
    .await;

    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::new(tmp.path(), "edge");
    let edge = EdgeHaproxy::start(&pki, c.port).await;
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&pki.ca).unwrap()).unwrap();
    let from = |source: &str| {
        reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(ca.clone())
            .local_address(source.parse::<std::net::IpAddr>().unwrap())
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap()
    };
    let through_edge = format!("{}/api/v1/measurements", edge.url);
    refused += one_clients_budget(
        "HAProxy",
        &from("127.0.0.7"),
        &from("127.0.0.8"),
        &through_edge,
    )
    .await;
    assert_eq!(
        c.metric("collector_http_rate_limited_total").await,
        refused as f64,
        "every 429 counted, and no other"
    );
}

/// Issue 52, 1 (contract v5 §2, "A site's budget is shared among its clients"): one client
/// floods a site at ten times its budget (`COLLECTOR_SITE_RATE` 40/s: 8 requests a second of
/// 50 beacons each, 400/s) with the shop's `Origin`, beside 20 visitors at a beacon a second
/// each, all named by a trusted proxy's `X-Forwarded-For`. The visitors keep at least 99 % of
/// their page views (answered 202 and stored), the flood is answered 429 beyond its share (at
/// most the site's budget over its run gets through, and its requests of 50 never fit a share
/// of 40 among 21 clients), and the site's rate is not lowered: the flood counts for at most 2
/// page views a second toward the demand (`sampling::CLIENT_DEMAND_MAX`), the visitors' 20 and
/// its 2 are under 90 % of the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_flooding_a_site_takes_only_its_share_of_the_budget() {
    let env = TestEnv::new(Stack::shared()).await;
    env.add_site("shared", &["--origin", "https://shop.example"]);
    let c = env
        .collector(&[
            ("COLLECTOR_SITE_RATE", "40"),
            ("COLLECTOR_TRUSTED_PROXIES", "127.0.0.1/32,::1/128"),
        ])
        .await;
    let url = format!("{}/api/v1/measurements", c.url);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let length = Duration::from_secs(15);
    let flood = tokio::spawn(flood_of_one_client(http.clone(), url.clone(), length));
    let (acked, sent, visitor_statuses) = twenty_visitors(&http, &url, length).await;
    let (flood_statuses, flood_for) = flood.await.unwrap();
    let flood_sent: usize = flood_statuses.values().sum();
    println!(
        "flood: {flood_sent} requests of 50 in {flood_for:?}, answers {flood_statuses:?}; \
         visitors: {sent} sent, answers {visitor_statuses:?}"
    );
    assert!(sent >= 250, "the visitors sent {sent} only");
    assert!(
        acked.len() * 100 >= sent * 99,
        "at least 99 % of the visitors' page views answered 202: {} of {sent} ({visitor_statuses:?})",
        acked.len()
    );
    let stored = env.wait_rows(&acked, VISIBLE).await;
    assert_eq!(stored.len(), acked.len(), "every acknowledged visit stored");
    let flood_acked = flood_statuses.get(&202).copied().unwrap_or(0);
    assert_eq!(
        flood_acked, 0,
        "a request of 50 is beyond the flooder's share: {flood_statuses:?}"
    );
    assert_eq!(
        flood_statuses.get(&429).copied().unwrap_or(0),
        flood_sent,
        "{flood_statuses:?}"
    );
    let over_share = c.metric("collector_http_over_share_total").await;
    assert_eq!(over_share, flood_sent as f64, "every flood request counted");
    let answer: Value = http
        .get(format!("{}/api/v1/sites/shared", c.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        answer["sample_rate"],
        json!(1.0),
        "the flood lowered the rate: {answer}"
    );
}

/// One client (`X-Forwarded-For` 198.51.100.7, the shop's `Origin`) posting 8 requests a
/// second of 50 beacons each to `flood_url` through `flooder` for `length`: the answers by
/// status, and how long it ran.
async fn flood_of_one_client(
    flooder: reqwest::Client,
    flood_url: String,
    length: Duration,
) -> (std::collections::BTreeMap<u16, usize>, Duration) {
    let mut tick = tokio::time::interval(Duration::from_millis(125));
    let headers = [
        ("origin", "https://shop.example".to_owned()),
        ("x-forwarded-for", "198.51.100.7".to_owned()),
    ];
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let start = Instant::now();
    while start.elapsed() < length {
        tick.tick().await;
        let batch: Vec<Value> = (0..50)
            .map(|_| beacon_on("shared", "https://shop.example/p/flood").1)
            .collect();
        let status = post_status(&flooder, &flood_url, &json!(batch), &headers).await;
        *statuses.entry(status).or_default() += 1;
    }
    (statuses, start.elapsed())
}

/// 20 visitors (`X-Forwarded-For` 192.0.2.1 to .20, the shop's `Origin`) at a beacon a second
/// each to `url` through `http` for `length`: the ids answered 202, the number sent and the
/// answers by status.
async fn twenty_visitors(
    http: &reqwest::Client,
    url: &str,
    length: Duration,
) -> (Vec<String>, usize, std::collections::BTreeMap<u16, usize>) {
    // A late tick is not made up by a burst: a visitor's beacons stay about a second apart.
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut visits = Vec::new();
    let start = Instant::now();
    let mut k = 0usize;
    while start.elapsed() < length {
        tick.tick().await;
        let headers = vec![
            ("origin", "https://shop.example".to_owned()),
            ("x-forwarded-for", format!("192.0.2.{}", k % 20 + 1)),
        ];
        k += 1;
        let (client, url) = (http.clone(), url.to_owned());
        let (id, m) = beacon_on("shared", "https://shop.example/p/visit");
        visits.push(tokio::spawn(async move {
            (id, post_status(&client, &url, &m, &headers).await)
        }));
    }
    let mut acked = Vec::new();
    let mut visitor_statuses = std::collections::BTreeMap::<u16, usize>::new();
    let sent = visits.len();
    for v in visits {
        let (id, status) = v.await.unwrap();
        *visitor_statuses.entry(status).or_default() += 1;
        if status == 202 {
            acked.push(id);
        }
    }
    (acked, sent, visitor_statuses)
}
