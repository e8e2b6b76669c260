//! ClickHouse 18.16 with a password-only user over verified https, and ClickHouse 26.x with the
//! users that ship.

use super::*;

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
    read_back_over_https(&env, &ch18, &ch, &ids, started).await;
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

/// Waits until the 5 `ids` are read back from the 18.16 server `ch` over https (`ch18`),
/// giving up after [`VISIBLE`] with the server's error log; prints how long after `started`.
async fn read_back_over_https(
    env: &TestEnv<'_>,
    ch18: &Readback<'_>,
    ch: &Ch18Tls,
    ids: &[String],
    started: Instant,
) {
    wait_until(
        &env.diag,
        "5 rows read back over https",
        VISIBLE,
        Duration::from_millis(200),
        || async {
            match ch18.count(ids).await {
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
