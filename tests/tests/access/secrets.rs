//! Neither password shows anywhere: log lines, `/metrics`, output, arguments, environment.

use super::*;

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
