//! Site settings that survive their database: real PostgreSQL stopped, blocked, slowed and
//! failed over while beacons keep arriving. Each test has its own stack (it breaks PostgreSQL).

use collector_tests::common;

use std::time::{Duration, Instant};

use common::*;

const SETTLE: Duration = Duration::from_secs(30);
/// A beacon answered from the settings cache takes one spool sync; one that waited on the store
/// takes the store's 3 s call bound (`settings::store::QUERY_TIMEOUT`). Half that bound tells
/// them apart with room for a machine whose disk syncs slowly under load (issue 38: 500 ms was
/// too tight beside a build).
const STORE_WAIT_BOUND: Duration = Duration::from_millis(1500);

/// Lines of the stack's PostgreSQL log that contain `needle`; panics naming the log when it
/// cannot be read (no log is not "no such line").
fn pg_log_count(stack: &Stack, needle: &str) -> usize {
    let path = stack.dir().join("pg/postgres.log");
    let log = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("the PostgreSQL log {}: {e}", path.display()));
    log.lines().filter(|l| l.contains(needle)).count()
}

async fn pg(stack: &Stack, db: &str, sql: &str) {
    let (client, conn) = tokio_postgres::connect(&stack.database_url(db), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client.batch_execute(sql).await.unwrap();
}

/// Posts one fresh measurement for `site`; status and how long the answer took.
async fn beacon(c: &Collector, site: &str) -> (u16, Duration) {
    let (_, m) = measurement(site);
    let start = Instant::now();
    let (status, _) = c.post_json(&m).await;
    (status, start.elapsed())
}

/// Posts a beacon for `site` to `c` every 100 ms until one is refused with 403 (the site was
/// disabled and the collector has seen it); every answer before must be 202 (panics with its
/// body). Gives up through the test's report with `why` alone when none is refused within
/// `limit`.
async fn wait_disabled(c: &Collector, site: &str, limit: Duration, why: &str) {
    poll_until(&c.diag, limit, Duration::from_millis(100), || async {
        let (_, m) = measurement(site);
        let (status, body) = c.post_json(&m).await;
        if status == 403 {
            return Ok(());
        }
        assert_eq!(status, 202, "{body}");
        Err(why.to_owned())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_store_costs_known_sites_nothing_and_a_change_arrives_after() {
    let stack = Stack::own(1);
    let env = TestEnv::new(&stack).await;
    let c = env
        .collector(&[
            ("COLLECTOR_SETTINGS_TTL", "1s"),
            ("COLLECTOR_SETTINGS_BACKOFF", "3s"),
        ])
        .await;
    let (status, up_latency) = beacon(&c, &env.site).await;
    assert_eq!(status, 202);

    stack.postgres().stop().unwrap();
    let mut slowest = Duration::ZERO;
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < Duration::from_secs(8) {
        let (status, took) = beacon(&c, &env.site).await;
        assert_eq!(
            status, 202,
            "a known site is served from the last known settings"
        );
        slowest = slowest.max(took);
        n += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The loop went on through the stop: a quiet machine answers about 300 in 8 s (20 ms
    // pause and a few ms each); 20 allows 400 ms a beacon on a loaded one.
    assert!(
        n >= 20,
        "{n} beacons in 8 s with the store stopped (slowest {slowest:?})"
    );
    // No request waits on the store: far below the 3 s connect/query bound.
    assert!(
        slowest < STORE_WAIT_BOUND,
        "slowest answer {slowest:?} (with the store up: {up_latency:?}); a request that waited \
         on the store would take its 3 s call bound, one from the cache one spool sync: \
         {STORE_WAIT_BOUND:?} (half the call bound) tells them apart on a loaded machine"
    );
    assert!(c.metric("collector_settings_stale_served_total").await > 0.0);
    assert_eq!(c.metric("collector_settings_store_up").await, 0.0);
    // A never-seen site cannot be judged now: 503 with Retry-After, not 403.
    let (_, m) = measurement("never-seen");
    let (status, _, headers) = c.post(m.to_string(), &[]).await;
    assert_eq!(status, 503);
    assert!(headers.contains_key("retry-after"));

    stack.postgres().start().unwrap();
    env.cli(&["sites", "disable", &env.site]).success();
    // TTL (1 s) + backoff (3 s) + one reload period (1 s), with slack for a busy machine.
    wait_disabled(
        &c,
        &env.site,
        Duration::from_secs(10),
        "the disabled site was still accepted 10 s after the change: the TTL (1 s), \
         the backoff (3 s) and a reload (1 s) are 5 s, plus 5 s for a loaded machine",
    )
    .await;
    assert_eq!(c.metric("collector_settings_store_up").await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_store_gets_at_most_one_connection_attempt_per_backoff() {
    let stack = Stack::own(1);
    let env = TestEnv::new(&stack).await;
    let c = env.collector(&[("COLLECTOR_SETTINGS_TTL", "1s")]).await; // backoff: the 10 s default
    assert_eq!(beacon(&c, &env.site).await.0, 202);

    // The server stays up and logs every attempt, but refuses this database.
    let refused = format!(
        "database \"{}\" is not currently accepting connections",
        env.db
    );
    pg(&stack, "postgres", &format!("ALTER DATABASE {db} ALLOW_CONNECTIONS false; SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db}'", db = env.db)).await;
    let before = pg_log_count(&stack, &refused);
    let start = Instant::now();
    let traffic = Traffic::start(&c, &env.site, Duration::from_millis(5));
    tokio::time::sleep(Duration::from_secs(25)).await;
    let report = traffic.stop().await;
    let window = start.elapsed();
    let attempts = pg_log_count(&stack, &refused) - before;

    assert_eq!(
        report.statuses.keys().copied().collect::<Vec<_>>(),
        vec![202],
        "{:?}",
        report.statuses
    );
    assert!(report.acked.len() > 1000, "{:?}", report.statuses);
    let allowed = (window.as_secs() / 10 + 1) as usize;
    assert!(attempts >= 1, "the store was tried at all");
    assert!(
        attempts <= allowed,
        "{attempts} connection attempts in {window:?}, at most {allowed} allowed: one per \
         backoff (10 s) over the window, plus the first"
    );
    pg(
        &stack,
        "postgres",
        &format!("ALTER DATABASE {} ALLOW_CONNECTIONS true", env.db),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_while_the_store_is_down_serves_the_snapshot() {
    let stack = Stack::own(1);
    let env = TestEnv::new(&stack).await;
    env.cli(&[
        "sites",
        "add",
        "--key",
        "strict",
        "--origin",
        "https://shop.example",
    ])
    .success();
    let mut c = env.collector(&[("COLLECTOR_SETTINGS_TTL", "2s")]).await;
    assert_eq!(c.metric("collector_settings_from_snapshot").await, 0.0);
    c.kill().await;
    stack.postgres().stop().unwrap();
    c.restart().await;

    assert!(
        c.logs()
            .contains("serving the last known settings from the snapshot"),
        "{}",
        c.logs()
    );
    assert_eq!(c.metric("collector_settings_from_snapshot").await, 1.0);
    assert_eq!(c.status_of("/readyz").await, 200);
    let (id, m) = measurement(&env.site);
    assert_eq!(c.post_json(&m).await.0, 202);
    // The snapshot keeps each site's rules, not just its existence.
    let (_, strict) = measurement("strict");
    assert_eq!(
        c.post(strict.to_string(), &[("origin", "https://evil.example")])
            .await
            .0,
        403
    );
    assert_eq!(
        c.post(strict.to_string(), &[("origin", "https://shop.example")])
            .await
            .0,
        202
    );
    let (_, unknown) = measurement("never-seen");
    assert_eq!(c.post(unknown.to_string(), &[]).await.0, 503);
    env.assert_stored_once(&[id], SETTLE).await;

    stack.postgres().start().unwrap();
    c.wait_metric("collector_settings_from_snapshot 0", SETTLE)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_requests_for_a_new_site_make_one_query() {
    let stack = Stack::own(1);
    let env = TestEnv::new(&stack).await;
    let c = env.collector(&[]).await;
    // Registered after start: never seen by the collector.
    env.cli(&["sites", "add", "--key", "fresh"]).success();

    // Hold the sites table so the first fetch waits in PostgreSQL.
    let (locker, conn) =
        tokio_postgres::connect(&stack.database_url(&env.db), tokio_postgres::NoTls)
            .await
            .unwrap();
    tokio::spawn(conn);
    locker
        .batch_execute("BEGIN; LOCK TABLE sites IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();

    let (watcher, conn) =
        tokio_postgres::connect(&stack.database_url("postgres"), tokio_postgres::NoTls)
            .await
            .unwrap();
    tokio::spawn(conn);
    let count_sql = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = '{}' AND query LIKE '%FROM sites WHERE key = $1%' AND state = 'active'",
        env.db
    );

    let posts = (0..1000).map(|_| {
        let (_, m) = measurement("fresh");
        let c = &c;
        async move { c.post(m.to_string(), &[]).await }
    });
    let all = futures::future::join_all(posts);
    let observe = async {
        let mut most = 0i64;
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(2500) {
            let n: i64 = watcher.query_one(&count_sql, &[]).await.unwrap().get(0);
            most = most.max(n);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        most
    };
    let (answers, most) = tokio::join!(all, observe);
    locker.batch_execute("COMMIT").await.unwrap();

    assert_eq!(
        most, 1,
        "queries for the new key seen at once in pg_stat_activity"
    );
    for (status, body, headers) in &answers {
        assert!(*status == 202 || *status == 503, "{status} {body}");
        if *status == 503 {
            assert!(headers.contains_key("retry-after"));
        }
    }
    // The query either answered or timed out (3 s) while the table was held; either way the
    // store saw one query for the key, and once released the key is served from the cache.
    let start = Instant::now();
    loop {
        let (_, m) = measurement("fresh");
        if c.post_json(&m).await.0 == 202 {
            break;
        }
        if start.elapsed() >= SETTLE {
            c.diag.give_up("the new site never became known").await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn intake_goes_on_through_a_failover_to_the_standby() {
    let stack = Stack::own(1);
    let env = TestEnv::new(&stack).await;
    stack.pg_standby().start().unwrap();
    let standby_port = stack.pg_standby().port().expect("the standby's port");
    let both = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{standby_port}/{}",
        stack.postgres().port().unwrap(),
        env.db
    );
    let c = env
        .collector(&[
            ("COLLECTOR_DATABASE_URL", &both),
            ("COLLECTOR_SETTINGS_TTL", "1s"),
            ("COLLECTOR_SETTINGS_BACKOFF", "2s"),
        ])
        .await;

    let traffic = Traffic::start(&c, &env.site, Duration::from_millis(20));
    traffic.wait_acked(50, SETTLE).await;
    stack.postgres().stop().unwrap();
    stack.pg_standby().promote().unwrap();
    traffic.wait_acked(100, SETTLE).await;
    let report = traffic.stop().await;
    assert_eq!(
        report.statuses.keys().copied().collect::<Vec<_>>(),
        vec![202],
        "{:?}",
        report.statuses
    );

    // A change made on the promoted standby reaches the collector.
    let writable = format!("{both}?target_session_attrs=read-write");
    let out = std::process::Command::new(collector_bin())
        .args(["sites", "disable", &env.site])
        .env("COLLECTOR_DATABASE_URL", &writable)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_disabled(
        &c,
        &env.site,
        SETTLE,
        "the change on the promoted standby never arrived",
    )
    .await;
}

/// Started while the store is down and with no snapshot, the collector is not ready; once the
/// store is back it is ready within the backoff (10 s by default), not the TTL (60 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_started_without_the_store_is_ready_soon_after_it_returns() {
    let stack = Stack::own(1);
    let env = TestEnv::new(&stack).await;
    stack.postgres().stop().unwrap();
    let c = env.collector(&[]).await;
    assert_eq!(c.status_of("/readyz").await, 503);
    stack.postgres().start().unwrap();
    let back = Instant::now();
    while c.status_of("/readyz").await != 200 {
        if back.elapsed() >= Duration::from_secs(40) {
            c.diag
                .give_up(
                    "not ready 40 s after the store returned: within the backoff (10 s) plus a \
                     reload expected, 30 s more for a loaded machine, and still less than the \
                     TTL (60 s) it must not wait for",
                )
                .await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "figures: ready {:?} after the store returned",
        back.elapsed()
    );
    assert_eq!(beacon(&c, &env.site).await.0, 202);
}

/// `stack.sh pg freeze` stops every process of the server, not only the postmaster (each
/// backend is its own process group): a connection opened before the freeze gets no answer,
/// and answers again after the thaw. Meanwhile a known site is accepted at once, from the
/// cache, and the store's breaker opens once its calls time out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_store_hangs_its_open_connections_and_costs_known_sites_nothing() {
    let stack = Stack::own(1);
    let env = TestEnv::new(&stack).await;
    let c = env.collector(&[("COLLECTOR_SETTINGS_TTL", "1s")]).await;
    assert_eq!(beacon(&c, &env.site).await.0, 202);
    let (client, conn) =
        tokio_postgres::connect(&stack.database_url("postgres"), tokio_postgres::NoTls)
            .await
            .expect("connect to PostgreSQL");
    tokio::spawn(conn);
    client.simple_query("SELECT 1").await.expect("SELECT 1");

    stack.postgres().freeze().unwrap();
    let hung = tokio::time::timeout(Duration::from_secs(2), client.simple_query("SELECT 1")).await;
    assert!(
        hung.is_err(),
        "an open connection answered a frozen server: {hung:?}"
    );
    for _ in 0..20 {
        let (status, took) = beacon(&c, &env.site).await;
        assert_eq!(status, 202);
        assert!(
            took < STORE_WAIT_BOUND,
            "a known site waited {took:?} on a frozen store: one from the cache takes one spool \
             sync, one that waited on the store its 3 s call bound; {STORE_WAIT_BOUND:?} tells \
             them apart"
        );
    }
    // Refreshes time out (3 s per call) and open the breaker.
    c.wait_metric("collector_settings_store_up 0", SETTLE).await;

    stack.postgres().thaw().unwrap();
    let back = tokio::time::timeout(Duration::from_secs(10), client.simple_query("SELECT 1")).await;
    assert!(matches!(back, Ok(Ok(_))), "after the thaw: {back:?}");
    c.wait_metric("collector_settings_store_up 1", SETTLE).await;
}

/// 100 requests per second, a fifth of them for random site keys that exist nowhere: the
/// store gets at most `FIRST_FETCH_RATE` (5) first-fetch queries per second plus its full loads
/// and refreshes, whatever the keys; the known site is accepted throughout; a random key is
/// answered 403 (fetched: unknown) or 429 with `Retry-After` (over the budget: load shed, not a
/// 5xx that would page), never 202 nor 5xx; and a site added during the run is accepted within
/// one TTL of its addition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_site_keys_cost_the_store_a_bounded_rate() {
    let env = TestEnv::new(Stack::shared()).await;
    let ttl = Duration::from_secs(5);
    let c = env.collector(&[("COLLECTOR_SETTINGS_TTL", "5s")]).await;
    let before = c.metric("collector_settings_store_queries_total").await;
    let start = Instant::now();
    let window = Duration::from_secs(20);
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let mut answers = Vec::new();
    let mut added: Option<Instant> = None;
    for n in 0u64.. {
        if start.elapsed() >= window {
            break;
        }
        tick.tick().await;
        if added.is_none() && start.elapsed() > Duration::from_secs(5) {
            env.cli(&["sites", "add", "--key", "added-later"]).success();
            added = Some(Instant::now());
        }
        let site = match n % 5 {
            0 => format!("rnd-{}", uuid::Uuid::new_v4().simple()),
            1 if added.is_some() => "added-later".to_owned(),
            _ => env.site.clone(),
        };
        let (_, m) = measurement(&site);
        let req = http()
            .post(format!("{}/api/v1/measurements", c.url))
            .json(&m)
            .send();
        let sent = Instant::now();
        answers.push(tokio::spawn(async move {
            let r = req.await.expect("an answer");
            (
                site,
                sent,
                r.status().as_u16(),
                r.headers().contains_key("retry-after"),
            )
        }));
    }
    let secs = start.elapsed().as_secs_f64();
    let spent = c.metric("collector_settings_store_queries_total").await - before;
    let added = added.expect("the late site was added");
    let (known, random, late_first) = tally(answers, added).await;
    assert_eq!(
        known.keys().copied().collect::<Vec<_>>(),
        vec![202],
        "known site: {known:?}"
    );
    assert!(
        random.keys().all(|s| *s == 403 || *s == 429),
        "random keys: {random:?}"
    );
    let random_total: usize = random.values().sum();
    assert!(random_total >= 300, "{random:?}");
    assert!(
        random.get(&429).is_some_and(|n| *n > 0),
        "over the budget: 429: {random:?}"
    );
    let limited = c
        .metric("collector_settings_first_fetch_limited_total")
        .await;
    assert!(
        limited >= random[&429] as f64,
        "{limited} limited, {random:?}"
    );
    // 5 first fetches per second (and a burst of 5); a full load and a refresh per known site
    // per TTL; one query per second of slack. Without the budget: about 20 per second.
    let bound = 6.0 * secs + 5.0 + 3.0 * (secs / ttl.as_secs_f64() + 1.0);
    assert!(
        spent <= bound,
        "{spent} store queries in {secs:.1} s for {random_total} random keys (bound {bound:.0})"
    );
    let late_first = late_first.expect("the site added during the run was never accepted");
    assert!(
        late_first <= ttl + Duration::from_secs(2),
        "the site added during the run was first accepted {late_first:?} after its addition: \
         at most one TTL ({ttl:?}: how long the cache may hold what it knew before), plus 2 s for \
         the store's query and the beacons' own pace on a loaded machine"
    );
    println!(
        "{spent} store queries in {secs:.1} s ({:.1}/s), random keys {random:?}, the late site accepted {late_first:?} after its addition",
        spent / secs
    );
}

/// One beacon's answer: its site, when it was sent, its status and whether it had
/// `Retry-After`.
type Answer = tokio::task::JoinHandle<(String, Instant, u16, bool)>;

/// The `answers` by status for the known site and for random keys (each 429 asserted to have
/// `Retry-After`), and the first acceptance of the site added at `added`, after its addition.
async fn tally(
    answers: Vec<Answer>,
    added: Instant,
) -> (
    std::collections::BTreeMap<u16, usize>,
    std::collections::BTreeMap<u16, usize>,
    Option<Duration>,
) {
    let mut known = std::collections::BTreeMap::<u16, usize>::new();
    let mut random = std::collections::BTreeMap::<u16, usize>::new();
    let mut late_first: Option<Duration> = None;
    for a in answers {
        let (site, sent, status, retry_after) = a.await.unwrap();
        if site.starts_with("rnd-") {
            *random.entry(status).or_default() += 1;
            assert!(status != 429 || retry_after, "a 429 without Retry-After");
        } else if site == "added-later" {
            if status == 202 {
                let after = sent.saturating_duration_since(added);
                late_first = Some(late_first.map_or(after, |f| f.min(after)));
            }
        } else {
            *known.entry(status).or_default() += 1;
        }
    }
    (known, random, late_first)
}
