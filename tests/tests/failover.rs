//! Nothing lost: 202 means durable, through killed, frozen, lagging and insert-refusing
//! ClickHouse replicas, a killed collector and a full spool. Real ZooKeeper and three real ClickHouse replicas.
//!
//! The tests share one three-replica stack and take turns (`FAILOVER_TURN`, and the test
//! group `failover-stack` under nextest); each starts by repairing
//! the stack and uses its own databases.

use collector_tests::common;

use std::time::{Duration, Instant};

use common::*;

/// Beacon interval of the steady stream: 50 per second.
const EVERY: Duration = Duration::from_millis(20);
/// How long acknowledged rows may take to appear after the faults are repaired.
const SETTLE: Duration = Duration::from_secs(120);
const SWITCH: Duration = Duration::from_secs(30);

/// Waits until `collector_clickhouse_{metric}{replica=url}` shows `value`.
async fn wait_replica(c: &Collector, metric: &str, url: &str, value: u8) {
    c.wait_replica(metric, url, value, SWITCH).await;
}

fn assert_only_202(report: &TrafficReport) {
    let other: Vec<_> = report.statuses.iter().filter(|(s, _)| **s != 202).collect();
    assert!(
        other.is_empty(),
        "answers other than 202: {other:?} of {:?}",
        report.statuses
    );
    assert!(report.acked.len() > 50, "{:?}", report.statuses);
}

async fn setup<'a>(stack: &'a Stack) -> TestEnv<'a> {
    stack.restore().await;
    TestEnv::new(stack).await
}

/// Waits for this test's turn on the failover stack ([`FAILOVER_TURN`]), then repairs the stack
/// ([`setup`]) and gives the turn (hold it to the end), the stack and the test's databases.
async fn take_turn() -> (
    tokio::sync::MutexGuard<'static, ()>,
    &'static Stack,
    TestEnv<'static>,
) {
    let turn = FAILOVER_TURN.lock().await;
    let stack = Stack::failover();
    let env = setup(stack).await;
    (turn, stack, env)
}

/// Kills the three replicas and waits (at most [`SWITCH`] each) until collector `c` shows
/// each down.
async fn kill_every_replica(stack: &Stack, c: &Collector) {
    for i in 1..=3 {
        stack.replica(i).kill().unwrap();
    }
    for url in &stack.clickhouse_urls() {
        wait_replica(c, "replica_state", url, 0).await;
    }
}

/// Posts 20 measurements for `site` to `c`, asserting each is answered 202; their ids.
async fn post_twenty(c: &Collector, site: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..20 {
        let (id, m) = measurement(site);
        assert_eq!(c.post_json(&m).await.0, 202);
        ids.push(id);
    }
    ids
}

/// Sends SIGKILL to `c` and asserts it has exited within 10 s.
async fn sigkill(c: &mut Collector) {
    c.signal("KILL");
    assert!(
        c.wait_exit(Duration::from_secs(10)).await.is_some(),
        "still running 10 s after SIGKILL (immediate; 10 s allows reaping on a loaded machine)"
    );
}

/// Asserts that `status`, what waiting 40 s for `c` after its SIGTERM gave, is an exit and
/// exit 0; panics with `c`'s logs otherwise.
fn assert_drained(status: Option<std::process::ExitStatus>, c: &Collector) {
    let status = status.unwrap_or_else(|| {
        panic!(
            "still running 40 s after SIGTERM (compose.yaml's stop_grace_period: the drain \
                 takes the 1 s grace, then at most the writer's 10 s deadline):\n{}",
            c.logs()
        )
    });
    assert!(status.success(), "exit {status:?}:\n{}", c.logs());
}

/// Restarts `c` on its spool, writing to the stack's replicas.
async fn restart_on_the_replicas(c: &mut Collector, stack: &Stack) {
    c.set_env(
        "COLLECTOR_CLICKHOUSE_URLS",
        &stack.clickhouse_urls().join(","),
    );
    c.restart().await;
}

/// A failover test under way: its turn on the stack, the repaired stack and a collector with
/// default settings (the steady stream to it apart, see [`Streaming::start`]). Fields drop
/// in the order a test's locals did: the collector, the databases, then the turn.
struct Streaming {
    urls: Vec<String>,
    c: Collector,
    env: TestEnv<'static>,
    stack: &'static Stack,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

impl Streaming {
    /// Takes the turn, repairs the stack ([`setup`]), starts a collector and the steady stream
    /// ([`EVERY`]) to it, and waits (at most [`SWITCH`]) for `acked` acknowledged beacons; the
    /// test and its stream.
    async fn start(acked: usize) -> (Streaming, Traffic) {
        let (_turn, stack, env) = take_turn().await;
        let c = env.collector(&[]).await;
        let urls = stack.clickhouse_urls();
        let traffic = Traffic::start(&c, &env.site, EVERY);
        traffic.wait_acked(acked, SWITCH).await;
        let test = Streaming {
            urls,
            c,
            env,
            stack,
            _turn,
        };
        (test, traffic)
    }

    /// Waits (at most [`SWITCH`]) until the collector writes to replica `i` (1-based) again.
    async fn wait_active(&self, i: usize) {
        wait_replica(&self.c, "active_replica", &self.urls[i - 1], 1).await;
    }

    /// Waits (at most [`SWITCH`]) until the collector writes to a replica other than `i`
    /// (1-based); which one it is (1-based). Either of the others is right: a replica that
    /// was fetching parts from the lost one falls behind and is demoted to catching up after
    /// three lagging probes (`writer::replicas`), and the writer then takes the next caught-up
    /// one (a fresh-clone run once saw replica 2 demoted so while replica 1 was frozen).
    async fn wait_failed_over_from(&self, i: usize) -> usize {
        let gauge = |url: &str| {
            format!("collector_clickhouse_active_replica{{replica=\"{url}\",shard=\"default\"}}")
        };
        wait_until(
            &self.c.diag,
            &format!("the writer to move from replica {i} to another"),
            SWITCH,
            Duration::from_millis(100),
            || async {
                let text = self.c.metrics_text().await;
                let active: Vec<usize> = (1..=self.urls.len())
                    .filter(|&j| metric_value(&text, &gauge(&self.urls[j - 1])) == Some(1.0))
                    .collect();
                match active[..] {
                    [j] if j != i => Ok(j),
                    _ => Err(format!("active replicas (1-based): {active:?}")),
                }
            },
        )
        .await
    }

    /// Stops the stream `traffic`, asserts every answer was 202, and waits (at most
    /// [`SETTLE`]) until every acknowledged beacon is stored exactly once.
    async fn stop_and_assert_stored(&self, traffic: Traffic) {
        let report = traffic.stop().await;
        assert_only_202(&report);
        self.env.assert_stored_once(&report.acked, SETTLE).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_and_restarting_the_preferred_replica_loses_nothing() {
    let (s, traffic) = Streaming::start(50).await;
    s.stack.replica(1).kill().unwrap();
    s.wait_failed_over_from(1).await;
    wait_replica(&s.c, "replica_state", &s.urls[0], 0).await;
    traffic.wait_acked(100, SWITCH).await;

    s.stack.replica(1).start().unwrap();
    s.wait_active(1).await;
    traffic.wait_acked(50, SWITCH).await;
    s.stop_and_assert_stored(traffic).await;
    assert!(s.c.metric("collector_clickhouse_failovers_total").await >= 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freezing_and_thawing_the_preferred_replica_loses_nothing() {
    let (s, traffic) = Streaming::start(50).await;
    s.stack.replica(1).freeze().unwrap();
    s.wait_failed_over_from(1).await;
    traffic.wait_acked(100, SWITCH).await;
    s.stack.replica(1).thaw().unwrap();
    s.wait_active(1).await;
    traffic.wait_acked(50, SWITCH).await;
    s.stop_and_assert_stored(traffic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_each_replica_in_turn_loses_nothing() {
    // The first 30 acknowledged beacons are waited for by `start`, the others in the loop.
    let (s, traffic) = Streaming::start(30).await;
    for i in 1..=3 {
        if i > 1 {
            traffic.wait_acked(30, SWITCH).await;
        }
        s.stack.replica(i).kill().unwrap();
        wait_replica(&s.c, "replica_state", &s.urls[i - 1], 0).await;
        traffic.wait_acked(50, SWITCH).await;
        s.stack.replica(i).start().unwrap();
        wait_replica(&s.c, "replica_state", &s.urls[i - 1], 2).await;
    }
    s.wait_active(1).await;
    s.stop_and_assert_stored(traffic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_replicas_down_for_thirty_seconds_loses_nothing() {
    let (s, traffic) = Streaming::start(50).await;
    kill_every_replica(s.stack, &s.c).await;
    let before = traffic.snapshot().acked.len();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let during = traffic.snapshot().acked.len() - before;
    assert!(
        during > 500,
        "intake kept answering 202 from the spool: {during}"
    );
    assert!(s.c.metric("collector_spool_records").await > 0.0);
    assert_eq!(
        s.c.status_of("/readyz").await,
        200,
        "the spool has room: still ready"
    );

    s.stack.repair();
    s.wait_active(1).await;
    traffic.wait_acked(50, SWITCH).await;
    s.stop_and_assert_stored(traffic).await;
    s.c.wait_metric("collector_spool_records 0", SETTLE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_killed_mid_stream_replays_its_spool() {
    let (_turn, _, env) = take_turn().await;
    // A slow flush keeps acknowledged but unwritten measurements in the spool when it dies.
    let mut c = env.collector(&[("COLLECTOR_BATCH_MAX_AGE", "3s")]).await;
    let traffic = Traffic::start(&c, &env.site, EVERY);
    traffic.wait_acked(100, SWITCH).await;
    sigkill(&mut c).await;
    c.restart().await;
    traffic.wait_acked(100, SWITCH).await;
    let report = traffic.stop().await;

    let refused: usize = report
        .statuses
        .iter()
        .filter(|(s, _)| **s != 202 && **s != 0)
        .map(|(_, n)| n)
        .sum();
    assert_eq!(
        refused, 0,
        "only refused connections while it was down: {:?}",
        report.statuses
    );
    env.assert_stored_once(&report.acked, SETTLE).await;
    assert!(c.logs().contains("spool: replaying"), "{}", c.logs());
}

/// Killed with groups in flight at its maximum rate (issue 28): 64 clients back to back, so
/// that a group is always being synced while the next fills; every id answered 202 is stored
/// exactly once after the restart. The site's budget is off (`COLLECTOR_SITE_RATE=0`): on a
/// quiet machine the flood after the restart (the cut requests sent again at once) passes the
/// default 2,000 a second, and a 429 is not what this test is about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_killed_with_groups_in_flight_at_its_maximum_rate_loses_nothing() {
    let (_turn, _, env) = take_turn().await;
    let mut c = env
        .collector(&[
            ("COLLECTOR_BATCH_MAX_AGE", "3s"),
            ("COLLECTOR_SITE_RATE", "0"),
        ])
        .await;
    let flood = Traffic::flood(&c, &env.site, 64);
    flood.wait_acked(2000, SWITCH).await;
    let (acked0, syncs0) = (
        flood.snapshot().acked.len(),
        c.metric("collector_spool_sync_duration_seconds_count")
            .await,
    );
    flood.wait_acked(2000, SWITCH).await;
    let (acked1, syncs1) = (
        flood.snapshot().acked.len(),
        c.metric("collector_spool_sync_duration_seconds_count")
            .await,
    );
    let per_sync = (acked1 - acked0) as f64 / (syncs1 - syncs0).max(1.0);
    assert!(
        per_sync > 2.0,
        "{per_sync:.1} requests per sync: groups were not shared, nothing was in flight together"
    );
    sigkill(&mut c).await;
    let cut = flood.snapshot().statuses.get(&0).copied().unwrap_or(0);
    assert!(
        cut > 0,
        "no request was cut by the kill: none was in flight"
    );
    c.restart().await;
    flood.wait_acked(500, SWITCH).await;
    let report = flood.stop().await;

    let other: Vec<_> = report
        .statuses
        .iter()
        .filter(|(s, _)| **s != 202 && **s != 0)
        .collect();
    assert!(other.is_empty(), "answers other than 202: {other:?}");
    eprintln!(
        "killed at {per_sync:.1} requests per sync; {cut} requests cut; {} acknowledged",
        report.acked.len()
    );
    env.assert_stored_once(&report.acked, SETTLE).await;
    assert!(c.logs().contains("spool: replaying"), "{}", c.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_spool_answers_503_and_keeps_what_it_acknowledged() {
    let (_turn, stack, env) = take_turn().await;
    let c = env
        .collector(&[("COLLECTOR_SPOOL_MAX_BYTES", "1048576")])
        .await;
    kill_every_replica(stack, &c).await;
    let traffic = Traffic::start(&c, &env.site, Duration::from_millis(5));
    // 1 MiB holds about 4,000 of these rows: 20 s at the traffic's 200 a second, but 32 s at
    // the 125 a second a fresh-clone run beside the other tests managed (CI run of 0057309's
    // parent, "the spool never filled: {202: 3765}" after 30 s). 120 s: room for 30 a second.
    let fill = Duration::from_secs(120);
    let start = std::time::Instant::now();
    while !traffic.snapshot().statuses.contains_key(&503) {
        if start.elapsed() >= fill {
            c.diag
                .give_up(format!(
                    "the spool never filled: {:?}",
                    traffic.snapshot().statuses
                ))
                .await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        c.status_of("/readyz").await,
        503,
        "a full spool is not ready"
    );
    let report = traffic.stop().await;
    assert_eq!(report.unavailable_without_retry_after, 0);
    let unexpected: Vec<_> = report
        .statuses
        .iter()
        .filter(|(s, _)| **s != 202 && **s != 503)
        .collect();
    assert!(unexpected.is_empty(), "{:?}", report.statuses);

    stack.repair();
    env.assert_stored_once(&report.acked, SETTLE).await;
    c.wait_metric("collector_spool_records 0", SETTLE).await;
    let start = std::time::Instant::now();
    while c.status_of("/readyz").await != 200 {
        if start.elapsed() >= SWITCH {
            c.diag.give_up("ready again once the spool drained").await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (id, m) = measurement(&env.site);
    assert_eq!(c.post_json(&m).await.0, 202);
    env.assert_stored_once(&[id], SETTLE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_is_not_written_to_until_it_catches_up() {
    let (s, traffic) = Streaming::start(50).await;
    let (c, urls) = (&s.c, &s.urls);
    // Freeze the preferred replica so the writer fails over, then let it answer again but keep
    // it from fetching what it missed: it must stay "catching up" and unused.
    s.stack.replica(1).freeze().unwrap();
    s.wait_failed_over_from(1).await;
    traffic.wait_acked(100, SWITCH).await;
    s.stack.replica(1).thaw().unwrap();
    clickhouse_exec(
        &urls[0],
        &format!("SYSTEM STOP FETCHES {}.measurements", s.env.db),
    )
    .await
    .unwrap();
    traffic.wait_acked(100, SWITCH).await;
    wait_replica(c, "replica_state", &urls[0], 1).await;
    // Over 20 rounds (a quarter second apart) in which another replica has been healthy for
    // the last 2 s, the lagging replica stays catching up and unused. A round in which no
    // other was healthy does not count: with no healthy replica, writing to a catching-up
    // one is the rule (`writer::replicas`), and a fresh-clone run once saw the other replica
    // miss its probes under the run's load, the lagging one written to meanwhile. The active
    // gauge changes at the writer's next pick, made before every insert (about one a second
    // under this traffic): hence the 2 s.
    let gauge = |metric: &str, url: &str| {
        format!("collector_clickhouse_{metric}{{replica=\"{url}\",shard=\"default\"}}")
    };
    let (mut counted, mut healthy_since) = (0, None::<Instant>);
    let start = Instant::now();
    while counted < 20 {
        assert!(
            start.elapsed() < SWITCH,
            "another replica was healthy for 2 s at a stretch in only {counted} of 20 rounds"
        );
        let text = c.metrics_text().await;
        let value = |name: String| {
            metric_value(&text, &name).unwrap_or_else(|| panic!("no metric line {name}"))
        };
        assert_eq!(
            value(gauge("replica_state", &urls[0])),
            1.0,
            "lagging: catching up"
        );
        if urls[1..]
            .iter()
            .any(|url| value(gauge("replica_state", url)) == 2.0)
        {
            let since = *healthy_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= Duration::from_secs(2) {
                assert_eq!(
                    value(gauge("active_replica", &urls[0])),
                    0.0,
                    "lagging: unused"
                );
                counted += 1;
            }
        } else {
            healthy_since = None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    clickhouse_exec(
        &urls[0],
        &format!("SYSTEM START FETCHES {}.measurements", s.env.db),
    )
    .await
    .unwrap();
    s.wait_active(1).await;
    s.stop_and_assert_stored(traffic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_spool_tail_is_replayed_up_to_the_last_whole_record() {
    let (_turn, stack, env) = take_turn().await;
    // Nowhere to write: everything stays in the spool.
    let mut c = env
        .collector(&[("COLLECTOR_CLICKHOUSE_URLS", "http://127.0.0.1:1")])
        .await;
    let ids = post_twenty(&c, &env.site).await;
    c.kill().await;
    // A crash mid-write: the last record is cut in half.
    let segments = c.spool.path().join("segments");
    let mut files: Vec<_> = std::fs::read_dir(&segments)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let last = files
        .iter()
        .rev()
        .find(|p| std::fs::metadata(p).unwrap().len() > 8)
        .unwrap()
        .clone();
    let len = std::fs::metadata(&last).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&last)
        .unwrap()
        .set_len(len - 40)
        .unwrap();

    // Restart with the real replicas on the same spool.
    restart_on_the_replicas(&mut c, stack).await;
    env.assert_stored_once(&ids[..19], SETTLE).await;
    assert!(
        env.rows(&ids[19..]).await.is_empty(),
        "the torn record is not replayed as garbage"
    );
    assert!(c.logs().contains("spool: cut a torn tail"), "{}", c.logs());
}

/// SIGTERM while no replica can be written, with a batch already being retried: the drain
/// still ends (the writer gives up after `DRAIN_DEADLINE` and leaves the batch in the spool)
/// and the process exits 0 within compose.yaml's `stop_grace_period` (40 s), so an engine
/// never has to SIGKILL it; the next start delivers everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_every_replica_down_drains_and_exits_0() {
    let (_turn, stack, env) = take_turn().await;
    let mut c = env
        .collector(&[
            ("COLLECTOR_CLICKHOUSE_URLS", "http://127.0.0.1:1"),
            ("COLLECTOR_DRAIN_GRACE", "1s"),
        ])
        .await;
    let ids = post_twenty(&c, &env.site).await;
    // The bug this guards against: a batch begun before the signal retried forever.
    let start = std::time::Instant::now();
    while c.metric("collector_batches_retried_total").await < 1.0 {
        if start.elapsed() >= SWITCH {
            c.diag
                .give_up("collector_batches_retried_total never rose above 0")
                .await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.signal("TERM");
    assert_drained(c.wait_exit(Duration::from_secs(40)).await, &c);
    assert!(c.logs().contains("drain deadline passed"), "{}", c.logs());

    restart_on_the_replicas(&mut c, stack).await;
    env.assert_stored_once(&ids, SETTLE).await;
}

/// SIGTERM while every replica hangs (connections accepted, never answered), the shape a
/// frozen cluster or a black-holed address has: the drain still ends within compose.yaml's
/// `stop_grace_period` (40 s) with exit 0, and the next start delivers everything.
///
/// The replicas are frozen as the collector sees them, by a proxy in front of each
/// (`common::freeze`), not by SIGSTOP (issue 38): the freeze lasts the drain (the 1 s grace
/// and the writer's 10 s deadline), longer than the stack's ZooKeeper session timeout
/// (10 s), and a SIGSTOPped replica lost its session at every run; ClickHouse 18.16 then
/// re-initialized it 0 to 70 s after the thaw (measured over 21 runs, per replica), read-only
/// meanwhile, and the test measured that instead of the collector: late in a CI run, 20 ids
/// were still missing on replica 1 120 s after the restart. After the thaw the test waits for
/// two things: the restarted collector confirms every record (its spool empty: ClickHouse
/// took them), and replica 1, where the rows are read, shows each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_every_replica_frozen_drains_and_exits_0() {
    let (_turn, stack, env) = take_turn().await;
    let mut proxies = Vec::new();
    for url in stack.clickhouse_urls() {
        proxies.push(common::freeze::Freezable::start(&url).await);
    }
    let urls: Vec<&str> = proxies.iter().map(|p| p.url.as_str()).collect();
    let mut c = env
        .collector(&[
            ("COLLECTOR_DRAIN_GRACE", "1s"),
            ("COLLECTOR_CLICKHOUSE_URLS", &urls.join(",")),
        ])
        .await;
    for p in &proxies {
        p.freeze();
    }
    let ids = post_twenty(&c, &env.site).await;
    c.signal("TERM");
    let waited = std::time::Instant::now();
    let status = c.wait_exit(Duration::from_secs(40)).await;
    for p in &proxies {
        p.thaw();
    }
    assert_drained(status, &c);
    eprintln!(
        "figures: every replica frozen: exit 0 {:?} after SIGTERM",
        waited.elapsed()
    );
    c.restart().await;
    let restarted = Instant::now();
    // The replicas answer at once: the restart's first probe round, the replayed batch, a part
    // fetched by the other replicas take seconds; SWITCH (30 s) leaves the rest to a loaded
    // machine.
    c.wait_metric("collector_spool_records 0", SWITCH).await;
    let delivered = restarted.elapsed();
    env.assert_stored_once(&ids, SWITCH).await;
    eprintln!(
        "figures: every replica frozen: all {} ids confirmed by the collector {delivered:?} and \
         stored on replica 1 {:?} after the restart",
        ids.len(),
        restarted.elapsed()
    );
}

/// How long the preferred replica refuses inserts in the refusal tests.
const REFUSING: Duration = Duration::from_secs(20);

/// The preferred replica answers SELECTs but refuses every insert for [`REFUSING`] (its user's
/// profile given `settings`), then takes inserts again. Its state must go healthy → down →
/// healthy once, never cycling through catching up while it refuses; one "down" line naming
/// `cause` and one "back" line; nothing acknowledged lost.
async fn a_replica_that_refuses_inserts(settings: &[&str], cause: &str) {
    let (_turn, stack, env) = take_turn().await;
    let c = env.collector(&[]).await;
    let urls = stack.clickhouse_urls();
    let r1 = urls[0].clone();
    let state = format!("collector_clickhouse_replica_state{{replica=\"{r1}\",shard=\"default\"}}");
    let errors =
        format!("collector_clickhouse_insert_errors_total{{replica=\"{r1}\",shard=\"default\",kind=\"transient\"}}");
    wait_replica(&c, "replica_state", &r1, 2).await;
    let traffic = Traffic::start(&c, &env.site, EVERY);
    traffic.wait_acked(50, SWITCH).await;
    let before = c.logs().len();

    stack.replica(1).profile(settings).unwrap();
    let mut states = vec![c.metric(&state).await];
    let refusing = Instant::now();
    wait_replica(&c, "active_replica", &urls[1], 1).await;
    let errors_at_down = c.metric(&errors).await;
    while refusing.elapsed() < REFUSING {
        states.push(c.metric(&state).await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // It answered SELECTs all along (the probe's kind of query): this is the shape where a
    // probe alone would call it healthy.
    let answer = clickhouse_query(&r1, "SELECT count() AS n FROM system.replicas")
        .await
        .expect("the refusing replica answers SELECTs");
    assert_eq!(answer.len(), 1, "{answer:?}");
    let trials_failed = c.metric(&errors).await - errors_at_down;

    stack.replica(1).profile(&[]).unwrap();
    let restored = Instant::now();
    while c.metric(&state).await != 2.0 {
        if restored.elapsed() >= SETTLE {
            c.diag.give_up(format!("replica 1 not healthy {SETTLE:?} after it took inserts again; states {states:?}")).await;
        }
        states.push(c.metric(&state).await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let back_after = restored.elapsed();
    states.push(2.0);
    wait_replica(&c, "active_replica", &r1, 1).await;
    traffic.wait_acked(50, SWITCH).await;
    let report = traffic.stop().await;

    let mut sequence = states.clone();
    sequence.dedup();
    let logs = c.logs();
    let about_r1: Vec<&str> = logs[before..]
        .lines()
        .filter(|l| l.contains(r1.as_str()) && !l.contains(" DEBUG "))
        .collect();
    let shown = about_r1.join("\n");
    eprintln!(
        "refusal ({settings:?}): states {sequence:?} over {} samples, {trials_failed} failed \
         trial inserts while refusing, healthy {back_after:?} after the profile was restored; \
         lines about {r1}:\n{shown}",
        states.len()
    );
    assert_eq!(
        sequence,
        [2.0, 0.0, 2.0],
        "state of replica 1 while it refused"
    );
    assert!(
        trials_failed >= 1.0,
        "no trial insert was sent while it refused (probes passing for {REFUSING:?})"
    );
    let down: Vec<&&str> = about_r1
        .iter()
        .filter(|l| l.contains("replica down"))
        .collect();
    assert_eq!(down.len(), 1, "lines at going down:\n{shown}");
    assert!(
        down[0].contains(" WARN ") && down[0].contains(cause),
        "the down line must name the refusal ({cause}): {}",
        down[0]
    );
    let back: Vec<&&str> = about_r1
        .iter()
        .filter(|l| l.contains("replica back"))
        .collect();
    assert_eq!(back.len(), 1, "lines at coming back:\n{shown}");
    assert!(back[0].contains("trial insert succeeded"), "{}", back[0]);
    assert_only_202(&report);
    env.assert_stored_once(&report.acked, SETTLE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_replica_is_back_only_when_an_insert_succeeds() {
    a_replica_that_refuses_inserts(&["readonly=1"], "Code: 164").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_over_its_memory_limit_is_back_only_when_an_insert_succeeds() {
    // 3 MB: enough for the probe's SELECTs, too little for an INSERT's buffers (18.16:
    // "Memory limit (for query) exceeded: would use 3.07 MiB").
    a_replica_that_refuses_inserts(&["max_memory_usage=3000000"], "Code: 241").await;
}
