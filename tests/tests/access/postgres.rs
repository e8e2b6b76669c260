//! The settings store on a PostgreSQL 15 with TLS, under each `sslmode`.

use super::*;

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
