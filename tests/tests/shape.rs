//! The shape users run (issue 11): several collectors on one replicated table, ClickHouse
//! behaviour of current releases, and servers that hang instead of refusing.
//!
//! Real servers throughout (PostgreSQL 15, ZooKeeper, ClickHouse 18.16 replicas). What 18.16
//! cannot show (a current `version()`, `insert_deduplication_token`, an exception after a
//! `200`) comes from the test-only stand-in of `common::standin`, an HTTP proxy in front of a
//! real replica whose doc comment cites the ClickHouse documentation for each behaviour.
//!
//! Tests that stop a replica use the failover stack (one at a time: `FAILOVER_TURN`); the others use
//! the shared stack and leave its servers alone.

use collector_tests::common;

use std::time::{Duration, Instant};

use common::standin::{InsertMode, StandIn, TokenMemory};
use common::*;

/// How long acknowledged rows may take to appear.
const STORED: Duration = Duration::from_secs(60);

/// `collector_clickhouse_{metric}{replica="url"}`.
fn replica_metric(metric: &str, url: &str) -> String {
    format!("collector_clickhouse_{metric}{{replica=\"{url}\",shard=\"default\"}}")
}

/// `collector_clickhouse_insert_errors_total` of the replica `url`, kind `transient`.
fn transient_errors(url: &str) -> String {
    format!("collector_clickhouse_insert_errors_total{{replica=\"{url}\",shard=\"default\",kind=\"transient\"}}")
}

/// Two stand-ins ([`StandIn`]) in front of the stack's two replicas, sharing one memory of
/// tokens, and their URLs as `COLLECTOR_CLICKHOUSE_URLS`.
async fn stand_ins(stack: &Stack) -> (StandIn, StandIn, String) {
    let urls = stack.clickhouse_urls();
    let tokens = TokenMemory::new();
    let s1 = StandIn::start(&urls[0], tokens.clone()).await;
    let s2 = StandIn::start(&urls[1], tokens.clone()).await;
    let replicas = format!("{},{}", s1.url, s2.url);
    (s1, s2, replicas)
}

/// Posts one measurement to `c` and asserts 202; its id.
async fn post_one(c: &Collector, site: &str) -> String {
    let (id, m) = measurement(site);
    let (status, body) = c.post_json(&m).await;
    assert_eq!(status, 202, "{body}");
    id
}

/// Every measurement written by [`measurement`] has the same size (a UUID id, the same
/// fields), so two fresh spools hold their records at the same positions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_collectors_with_fresh_spools_store_every_same_sized_beacon_once() {
    let stack = Stack::shared();
    let env = TestEnv::new(stack).await;
    let (s1, s2, replicas) = stand_ins(stack).await;
    // Short batches, so that each batch holds the one measurement just sent.
    let settings = [
        ("COLLECTOR_CLICKHOUSE_URLS", replicas.as_str()),
        ("COLLECTOR_BATCH_MAX_AGE", "50ms"),
    ];
    let a = env.collector(&settings).await;
    let b = env.collector(&settings).await;
    for c in [&a, &b] {
        c.wait_metric(
            &format!("{} 2", replica_metric("replica_state", &s1.url)),
            STORED,
        )
        .await;
    }

    let mut acked = Vec::new();
    for round in 0..15 {
        // The same position in both spools: a token made of positions alone is the same.
        let ida = post_one(&a, &env.site).await;
        let idb = post_one(&b, &env.site).await;
        let pair = [ida, idb];
        // Each pair is stored before the next is sent, so the batches line up.
        let start = Instant::now();
        loop {
            if env.rows(&pair).await.len() == 2 {
                break;
            }
            if start.elapsed() >= Duration::from_secs(20) {
                env.diag
                    .give_up(format!(
                        "round {round}: only {:?} of {pair:?} stored; stand-ins {:?} {:?}",
                        env.rows(&pair).await,
                        s1.stats(),
                        s2.stats()
                    ))
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        acked.extend(pair);
    }
    env.assert_stored_once(&acked, STORED).await;

    let (t1, t2) = (s1.stats(), s2.stats());
    assert!(
        t1.version_rewrites > 0,
        "the collectors never asked for version(): {t1:?}"
    );
    let with_token = t1.inserts_with_token + t2.inserts_with_token;
    let written = t1.inserts_written + t2.inserts_written;
    assert!(
        with_token >= 30 && written >= 30,
        "30 measurements in one-row batches: {t1:?} {t2:?}"
    );
    assert_eq!(
        t1.inserts_deduplicated + t2.inserts_deduplicated,
        0,
        "no batch of one collector may carry another's token"
    );
    eprintln!(
        "figures: two collectors: {} acked, {} stored once, 0 lost; inserts with a token {with_token}, dropped as seen 0",
        acked.len(),
        acked.len()
    );
}

/// Current releases can fail an INSERT after the status line: `200 OK` with the error in
/// `X-ClickHouse-Exception-Code` (the stand-in's doc comment has the sources).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insert_answered_200_with_an_exception_header_is_a_failure() {
    let stack = Stack::shared();
    let env = TestEnv::new(stack).await;
    let (s1, s2, replicas) = stand_ins(stack).await;
    // 999: KEEPER_EXCEPTION, a transient failure of a replicated INSERT.
    s1.set_insert_mode(InsertMode::ExceptionHeader(999));
    let c = env
        .collector(&[("COLLECTOR_CLICKHOUSE_URLS", replicas.as_str())])
        .await;

    // Spread over 12 s: the replica's probes pass, so it comes back after each outage and
    // fails again (it flaps).
    let mut acked = Vec::new();
    for _ in 0..24 {
        acked.push(post_one(&c, &env.site).await);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    env.assert_stored_once(&acked, STORED).await;

    let (t1, t2) = (s1.stats(), s2.stats());
    assert!(
        t1.inserts_failed_after_status >= 1,
        "the preferred replica was never tried: {t1:?}"
    );
    assert_eq!(t1.inserts_written, 0, "{t1:?}");
    assert!(t2.inserts_written >= 1, "{t2:?}");
    let errors = transient_errors(&s1.url);
    assert!(c.metric(&errors).await >= 1.0);
    assert!(c.metric(&replica_metric("inserts_total", &s2.url)).await >= 1.0);
    assert_eq!(c.metric("collector_spool_kept_aside_rows_total").await, 0.0);
    assert!(c.metric("collector_clickhouse_failovers_total").await >= 1.0);
    // Nothing confirmed on the strength of the 200 alone: the spool is empty only because
    // the rows reached the second replica.
    c.wait_metric("collector_spool_records 0", STORED).await;
    // However often it flaps (its probes pass, its inserts fail), one warning.
    let logs = c.logs();
    let down_lines = logs
        .lines()
        .filter(|l| l.contains("replica down;") && l.contains(&s1.url))
        .count();
    assert_eq!(down_lines, 1, "{logs}");
    assert!(
        logs.contains("X-ClickHouse-Exception-Code") || logs.contains("999"),
        "the cause is not named:\n{logs}"
    );
    eprintln!(
        "figures: exception after 200: {} acked, {} stored once; {} inserts answered 200 with the header, {} written to the next replica",
        acked.len(),
        acked.len(),
        t1.inserts_failed_after_status,
        t2.inserts_written
    );
}

/// The nice value of each thread of process `pid`, by thread name (`/proc/PID/task/*/stat`,
/// field 19, proc(5)).
fn thread_nice(pid: u32) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let stat = std::fs::read_to_string(task.unwrap().path().join("stat")).unwrap();
        // `pid (comm) state ...`: the name may hold spaces; fields after the last `)`.
        let open = stat.find('(').unwrap();
        let close = stat.rfind(')').unwrap();
        let name = stat[open + 1..close].to_owned();
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        // Field 19 of the whole line is field 17 after `pid (comm)`, index 16.
        out.push((name, fields[16].parse().unwrap()));
    }
    out
}

/// Issue 14: on a small host the writer's batch work must not hold up request tasks. It runs
/// on a thread of its own, 10 nice levels below the request runtime's threads (which keep the
/// process's, whatever `nice` the test itself runs under).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_runs_on_its_own_thread_at_a_lower_priority() {
    let stack = Stack::shared();
    let env = TestEnv::new(stack).await;
    let c = env.collector(&[]).await;
    let id = post_one(&c, &env.site).await;
    env.wait_rows(&[id], STORED).await;
    let threads = thread_nice(c.pid());
    let of = |name: &str| -> Vec<i64> {
        threads
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, nice)| *nice)
            .collect()
    };
    let process = of("collector");
    assert_eq!(process.len(), 1, "{threads:?}");
    let workers = of("tokio-rt-worker");
    assert!(
        !workers.is_empty() && workers.iter().all(|n| *n == process[0]),
        "request threads: {threads:?}"
    );
    assert_eq!(of("writer"), [(process[0] + 10).min(19)], "{threads:?}");
}

/// ClickHouse closes an idle keep-alive connection after `keep_alive_timeout` (3 s by
/// default); a batch sent on a connection the server just closed must be sent again on a new
/// one, not count as a replica failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_keep_alive_connection_is_not_a_failover() {
    let stack = Stack::shared();
    let env = TestEnv::new(stack).await;
    let urls = stack.clickhouse_urls();
    let c = env.collector(&[]).await;
    c.wait_metric(
        &format!("{} 1", replica_metric("active_replica", &urls[0])),
        STORED,
    )
    .await;

    let mut acked = Vec::new();
    let start = Instant::now();
    let mut i = 0u64;
    while start.elapsed() < Duration::from_secs(60) {
        acked.push(post_one(&c, &env.site).await);
        // Around the server's 3 s, where a reused connection meets the server's close.
        tokio::time::sleep(Duration::from_millis(2900 + (i % 5) * 200)).await;
        i += 1;
        assert_eq!(
            c.metric(&replica_metric("active_replica", &urls[0])).await,
            1.0,
            "after {i} beacons the preferred replica is not active:\n{}",
            c.logs()
        );
        assert_eq!(
            c.metric(&replica_metric("replica_state", &urls[0])).await,
            2.0
        );
    }
    env.assert_stored_once(&acked, STORED).await;
    assert_eq!(c.metric("collector_clickhouse_failovers_total").await, 0.0);
    let errors = transient_errors(&urls[0]);
    assert_eq!(c.metric(&errors).await, 0.0);
    assert!(
        !c.logs().contains("WARN"),
        "warnings on a healthy replica:\n{}",
        c.logs()
    );
    eprintln!(
        "figures: keep-alive: {} beacons over {:?}, {} acked and stored once, 0 failovers",
        i,
        start.elapsed(),
        acked.len()
    );
}

/// A settings host that accepts connections and never answers (a frozen primary) listed
/// first: the collector gets ready from the next host and serves a site added after it
/// started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_settings_host_listed_first_costs_only_its_timeout() {
    let stack = Stack::shared();
    let env = TestEnv::new(stack).await;
    let hang = Hang::start().await;
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{}",
        hang.port,
        stack.postgres().port().unwrap(),
        env.db
    );
    let c = env
        .collector(&[("COLLECTOR_DATABASE_URL", url.as_str())])
        .await;
    let start = Instant::now();
    while c.status_of("/readyz").await != 200 {
        if start.elapsed() >= Duration::from_secs(15) {
            c.diag.give_up(format!("not ready:\n{}", c.logs())).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(hang.accepted() >= 1, "the hung host was never tried");
    let ready_after = start.elapsed();

    env.cli(&["sites", "add", "--key", "late-site"]).success();
    let asked = Instant::now();
    let (id, m) = measurement("late-site");
    let (status, body) = c.post_json(&m).await;
    assert_eq!(status, 202, "{body}");
    let answered = asked.elapsed();
    assert!(
        answered < Duration::from_secs(5),
        "the first beacon of a new site took {answered:?}: its first fetch may try the hung \
         host first (HOST_TIMEOUT, 1.5 s) before the next; 5 s allows 3.5 s more for the query \
         and a loaded machine"
    );
    env.wait_rows(&[id], STORED).await;
    let ids = [post_one(&c, &env.site).await];
    env.wait_rows(&ids, STORED).await;
    eprintln!(
        "figures: hung settings host: ready {ready_after:?} after /healthz, a site added later answered 202 in {answered:?}"
    );
}

/// A count from a `SELECT count() AS n` on replica `url`, or ClickHouse's refusal while the
/// replica or the table is not there (for waiting on it; the refusal is shown). An answer
/// without its one row and column `n` fails at once: it is no count.
async fn count_or_refusal(url: &str, sql: &str) -> Result<i64, String> {
    let rows = clickhouse_query(url, sql).await?;
    assert_eq!(rows.len(), 1, "{url}: {sql}: one row: {rows:?}");
    let n = col(&rows[0], "n");
    Ok(as_i64(n).unwrap_or_else(|| panic!("{url}: {sql}: n is not a count: {n}")))
}

/// A deploy while one replica is down: `migrate` succeeds naming it, the collector never
/// writes to it while it lacks the table, and when it returns it gets the table and every row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_with_a_replica_down_and_the_replica_gets_the_table_when_it_returns() {
    let _turn = FAILOVER_TURN.lock().await;
    let stack = Stack::failover();
    stack.restore().await;
    let urls = stack.clickhouse_urls();
    stack.replica(3).kill().unwrap();
    // The down replica first: the collector's preferred one.
    let order = format!("{},{},{}", urls[2], urls[0], urls[1]);

    let env = TestEnv::empty(stack).await;
    let out = env.cli_with(&[("COLLECTOR_CLICKHOUSE_URLS", &order)], &["migrate"]);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr
            .contains(&urls[2].trim_end_matches('/').to_string()),
        "migrate does not name the replica it could not reach:\n{}",
        out.stderr
    );
    env.cli_with(
        &[("COLLECTOR_CLICKHOUSE_URLS", &order)],
        &["sites", "add", "--key", "site-1"],
    )
    .success();

    let c = env
        .collector(&[("COLLECTOR_CLICKHOUSE_URLS", order.as_str())])
        .await;
    let mut acked = Vec::new();
    for _ in 0..20 {
        acked.push(post_one(&c, &env.site).await);
    }
    env.assert_stored_once(&acked, STORED).await;
    // Every replica's series exists from the start (at 0): a missing one fails here.
    assert_eq!(
        c.metric(&replica_metric("inserts_total", &urls[2])).await,
        0.0
    );

    stack.replica(3).start().unwrap();
    let returned = Instant::now();
    let sql = format!("SELECT count() AS n FROM {}.measurements FINAL", env.db);
    let start = Instant::now();
    loop {
        let count = count_or_refusal(&urls[2], &sql).await;
        if count == Ok(20) {
            break;
        }
        if start.elapsed() >= Duration::from_secs(90) {
            c.diag
                .give_up(format!("replica 3 has {count:?} of 20 rows:\n{}", c.logs()))
                .await;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let rows_after = returned.elapsed();
    // Caught up, it is the preferred replica again and takes the next batches.
    c.wait_metric(
        &format!("{} 2", replica_metric("replica_state", &urls[2])),
        Duration::from_secs(60),
    )
    .await;
    for _ in 0..5 {
        acked.push(post_one(&c, &env.site).await);
    }
    c.wait_metric(
        &format!("{} 1", replica_metric("active_replica", &urls[2])),
        Duration::from_secs(30),
    )
    .await;
    env.assert_stored_once(&acked, STORED).await;
    assert!(c.metric(&replica_metric("inserts_total", &urls[2])).await >= 1.0);
    assert_eq!(c.metric("collector_spool_kept_aside_rows_total").await, 0.0);
    let permanent = format!(
        "collector_clickhouse_insert_errors_total{{replica=\"{}\",shard=\"default\",kind=\"permanent\"}}",
        urls[2]
    );
    assert_eq!(c.metric(&permanent).await, 0.0);
    eprintln!(
        "figures: migrate with a replica down: exit 0 naming it; {} acked, all stored once; the returned replica had all 20 earlier rows {rows_after:?} after its start",
        acked.len()
    );
}

/// Two collectors on one table; one is SIGKILLed mid-stream and the clients resend what it
/// did not answer to the other, as an edge does. The killed one restarts on its spool. Every
/// acknowledged id is stored, once under FINAL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_killed_mid_stream_while_clients_resend_to_the_other_loses_nothing() {
    let stack = Stack::shared();
    let env = TestEnv::new(stack).await;
    let mut a = env.collector(&[]).await;
    let b = env.collector(&[]).await;
    let url_a = format!("{}/api/v1/measurements", a.url);
    let url_b = format!("{}/api/v1/measurements", b.url);

    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let resent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut senders = Vec::new();
    for _ in 0..4 {
        let (url_a, url_b, acked, resent, stopped) = (
            url_a.clone(),
            url_b.clone(),
            acked.clone(),
            resent.clone(),
            stopped.clone(),
        );
        let site = env.site.clone();
        senders.push(tokio::spawn(async move {
            send_with_resends(site, url_a, url_b, acked, resent, stopped).await
        }));
    }
    let wait_acked = |n: usize| {
        let acked = acked.clone();
        async move {
            let start = Instant::now();
            let target = acked.lock().unwrap().len() + n;
            while acked.lock().unwrap().len() < target {
                assert!(start.elapsed() < Duration::from_secs(30), "traffic stalled");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    wait_acked(200).await;
    a.kill().await;
    wait_acked(200).await;
    let _ = stop.send(true);
    for s in senders {
        s.await.unwrap();
    }
    assert!(
        resent.load(std::sync::atomic::Ordering::SeqCst) >= 100,
        "the clients hardly resent anything"
    );
    // What the killed collector spooled (acknowledged or not) it delivers after a restart.
    a.restart().await;
    let acked = acked.lock().unwrap().clone();
    env.assert_stored_once(&acked, STORED).await;
    let counts = env
        .measurements("count() AS n, uniqExact(id) AS u", "FINAL")
        .await;
    assert_eq!(
        as_i64(col(&counts[0], "n")),
        as_i64(col(&counts[0], "u")),
        "one row per id under FINAL: {counts:?}"
    );
    a.wait_metric("collector_spool_records 0", STORED).await;
    let raw = env.count("").await;
    eprintln!(
        "figures: collector killed mid-stream: {} acked, {} resent to the other, all stored; {:?} rows before FINAL, {:?} under FINAL (one per id)",
        acked.len(),
        resent.load(std::sync::atomic::Ordering::SeqCst),
        raw,
        as_i64(col(&counts[0], "n"))
    );
}

/// The ids acknowledged so far, which the senders record in.
type Acked = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// One client sending beacons of `site` to `url_a` until `stopped`, resending each that was not
/// answered 202 to `url_b` (up to 5 times, 200 ms apart; it must take it): each acknowledged id
/// recorded in `acked`, each resend counted in `resent`.
async fn send_with_resends(
    site: String,
    url_a: String,
    url_b: String,
    acked: Acked,
    resent: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stopped: tokio::sync::watch::Receiver<bool>,
) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    while !*stopped.borrow() {
        let (id, m) = measurement(&site);
        let body = m.to_string();
        let first = client
            .post(&url_a)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await;
        let mut ok = matches!(&first, Ok(r) if r.status().as_u16() == 202);
        if !ok {
            resent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            for _ in 0..5 {
                let r = client
                    .post(&url_b)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await;
                if matches!(&r, Ok(r) if r.status().as_u16() == 202) {
                    ok = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            assert!(ok, "the second collector did not take {id}");
        }
        acked.lock().unwrap().push(id);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
