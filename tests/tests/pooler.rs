//! The settings store behind a transaction-mode connection pooler: Debian's PgBouncer 1.18
//! with `pool_mode = transaction` in front of the test PostgreSQL. Consecutive statements of
//! one client may run on different server connections there, and a server connection passes
//! from client to client with whatever was prepared on it, so a named prepared statement
//! breaks (`prepared statement "s0" already exists` / `... does not exist`). `collector
//! migrate`, the `sites` commands and `collector serve` must all work through it.

use collector_tests::common;

use std::time::{Duration, Instant};

use common::*;

/// `SHOW name` on PgBouncer's admin console (simple protocol, which it requires): the rows.
async fn admin(bouncer: &PgBouncer, command: &str) -> Vec<Vec<String>> {
    pg_connect(
        &bouncer.database_url("pgbouncer"),
        "the pgbouncer admin console",
    )
    .await
    .simple_query(command)
    .await
    .unwrap_or_else(|e| panic!("{command}: {e}"))
    .into_iter()
    .filter_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => Some(
            (0..r.len())
                .map(|i| r.get(i).unwrap_or("").to_owned())
                .collect(),
        ),
        _ => None,
    })
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_sites_and_serve_work_through_pgbouncer_in_transaction_mode() {
    let stack = Stack::shared();
    let env = TestEnv::empty(stack).await;
    let db = env.db.clone();
    let pg_port: u16 = stack.postgres().port().unwrap();
    let bouncer = PgBouncer::start(pg_port, &db).await;
    let mode = admin(&bouncer, "SHOW CONFIG").await;
    assert!(
        mode.iter()
            .any(|r| r[0] == "pool_mode" && r[1] == "transaction"),
        "pgbouncer is not in transaction mode: {mode:?}"
    );
    let url = bouncer.database_url(&db);
    // The settings store reached through the pooler.
    let via = [("COLLECTOR_DATABASE_URL", url.as_str())];

    // migrate through the pooler, twice (idempotent: the second finds everything there).
    migrate_twice(&env, &bouncer, &via);

    // 20 consecutive `sites` commands, each a new client of the pooler: every one succeeds.
    twenty_sites_commands(&env, &via);

    // A running collector whose settings store is the pooler.
    let c = env
        .collector(&[
            ("COLLECTOR_DATABASE_URL", url.as_str()),
            ("COLLECTOR_SETTINGS_TTL", "2s"),
        ])
        .await;
    ready_with_every_site_loaded(&c).await;
    let mut acked = Vec::new();
    let (id, m) = measurement(&env.site);
    assert_eq!(c.post_json(&m).await.0, 202);
    acked.push(id);

    // A site added after the start is served (first fetched on demand, then in the reloads).
    env.cli_with(&via, &["sites", "add", "--key", "late-site"])
        .success();
    let (id, m) = measurement("late-site");
    let (status, body) = c.post_json(&m).await;
    assert_eq!(status, 202, "{body}\n{}", c.logs());
    acked.push(id);

    // Through several reloads (TTL 2 s) the store stays up and its queries keep flowing.
    store_up_through_reloads(&c).await;
    // Beacons of both sites after the reloads, every one accepted.
    for site in [env.site.as_str(), "late-site", "pool-0"] {
        let (id, m) = measurement(site);
        let (status, body) = c.post_json(&m).await;
        assert_eq!(status, 202, "{site}: {body}");
        acked.push(id);
    }
    env.assert_stored_once(&acked, Duration::from_secs(30))
        .await;

    // The pooler really shared server connections among more clients than it has.
    let servers = admin(&bouncer, "SHOW SERVERS").await.len();
    assert!(servers <= 3, "{servers} server connections (pool size 3)");

    let logs = c.logs();
    assert!(
        !logs.contains("settings store failed"),
        "store errors behind pgbouncer:\n{logs}"
    );
    assert_eq!(
        warning_lines(&logs),
        Vec::<&str>::new(),
        "warnings while serving through pgbouncer"
    );
}

/// `migrate` through the pooler (the settings `via`), twice: both succeed, the second finding
/// everything there.
fn migrate_twice(env: &TestEnv<'_>, bouncer: &PgBouncer, via: &[(&str, &str)]) {
    for run in 1..=2 {
        let out = env.cli_with(via, &["migrate"]);
        assert_eq!(
            out.code,
            0,
            "migrate run {run} through pgbouncer:\nstdout: {}\nstderr: {}\npgbouncer: {}",
            out.stdout,
            out.stderr,
            bouncer.log()
        );
        assert!(
            out.stdout.contains("postgres: schema applied"),
            "{}",
            out.stdout
        );
    }
}

/// 20 consecutive `sites` commands (add, disable, enable, list) through the pooler (the
/// settings `via`), each a new client of it: every one succeeds.
fn twenty_sites_commands(env: &TestEnv<'_>, via: &[(&str, &str)]) {
    env.cli_with(via, &["sites", "add", "--key", &env.site])
        .success();
    let mut failures = Vec::new();
    for i in 0..20 {
        let key = format!("pool-{}", i / 4);
        let out = match i % 4 {
            0 => env.cli_with(
                via,
                &["sites", "add", "--key", &key, "--sample-rate", "0.5"],
            ),
            1 => env.cli_with(via, &["sites", "disable", &key]),
            2 => env.cli_with(via, &["sites", "enable", &key]),
            _ => env.cli_with(via, &["sites", "list"]),
        };
        if out.code != 0 || (i % 4 == 3 && !out.stdout.contains(&key)) {
            failures.push(format!(
                "call {i} ({key}): exit {}: {}{}",
                out.code,
                out.stdout.trim(),
                out.stderr.trim()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of 20 sites commands failed through pgbouncer:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Waits (30 s) until the collector `c` behind the pooler is ready, and asserts it loaded every
/// site at the start.
async fn ready_with_every_site_loaded(c: &Collector) {
    let (limit, every) = (Duration::from_secs(30), Duration::from_millis(100));
    poll_until(&c.diag, limit, every, || async {
        match c.status_of("/readyz").await {
            200 => Ok(()),
            _ => Err(format!(
                "collector behind pgbouncer never ready:\n{}",
                c.logs()
            )),
        }
    })
    .await;
    assert!(
        c.logs().contains("settings: loaded every site"),
        "no full load at start:\n{}",
        c.logs()
    );
}

/// Through several reloads (TTL 2 s, until 3 more store queries) the store of `c` stays up;
/// gives up after 30 s.
async fn store_up_through_reloads(c: &Collector) {
    let queries = "collector_settings_store_queries_total";
    let q0 = c.metric(queries).await;
    let start = Instant::now();
    let mut samples = 0;
    loop {
        assert_eq!(
            c.metric("collector_settings_store_up").await,
            1.0,
            "settings store marked down behind pgbouncer after {samples} samples:\n{}",
            c.logs()
        );
        samples += 1;
        let q = c.metric(queries).await;
        if q >= q0 + 3.0 {
            break;
        }
        if start.elapsed() >= Duration::from_secs(30) {
            c.diag
                .give_up(format!("{queries} moved from {q0} to {q} only in 30 s"))
                .await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
