//! Logs that neither cry wolf nor hide the cause, counted line by line on real servers:
//! a healthy start and a clean restart log no warning at all, and a replica that stays down
//! produces one line when it goes down (with the connection's cause), at most one summary a
//! minute while it stays down, and one line when it is back.

use collector_tests::common;

use std::time::{Duration, Instant};

use common::*;

/// Waits until `c` answers `/readyz` with 200, or panics after 30 s.
async fn wait_ready(c: &Collector) {
    let start = Instant::now();
    while c.status_of("/readyz").await != 200 {
        if start.elapsed() >= Duration::from_secs(30) {
            c.diag
                .give_up(format!("collector not ready after 30 s:\n{}", c.logs()))
                .await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Posts `n` fresh measurements for `site`, each answered 202; their ids.
async fn send(c: &Collector, site: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..n {
        let (id, m) = measurement(site);
        let (status, body) = c.post_json(&m).await;
        assert_eq!(status, 202, "{body}");
        ids.push(id);
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_start_and_a_clean_restart_log_no_warning() {
    let stack = Stack::shared();
    let env = TestEnv::new(stack).await;
    // Debug lines of the spool, to see that the restart met what a clean stop leaves.
    let mut c = env
        .collector(&[
            ("COLLECTOR_DRAIN_GRACE", "1s"),
            ("RUST_LOG", "info,collector::spool=debug"),
        ])
        .await;
    wait_ready(&c).await;
    let mut acked = send(&c, &env.site, 20).await;
    env.assert_stored_once(&acked, Duration::from_secs(30))
        .await;

    // A clean stop, a start that receives nothing, another clean stop: that run leaves a
    // segment holding just its header, which the third start removes.
    let mut third_run = 0;
    for run in 1..=2 {
        c.signal("TERM");
        let status = c
            .wait_exit(Duration::from_secs(40))
            .await
            .unwrap_or_else(|| panic!("run {run}: no exit within 40 s of SIGTERM"));
        assert!(status.success(), "run {run}: exit {status}:\n{}", c.logs());
        assert!(c.logs().ends_with("collector: stopped\n"), "{}", c.logs());
        third_run = c.logs().len();
        c.restart().await;
        wait_ready(&c).await;
    }
    acked.extend(send(&c, &env.site, 20).await);
    env.assert_stored_once(&acked, Duration::from_secs(30))
        .await;
    let logs = c.logs();
    let restart = &logs[third_run..];
    assert!(
        restart.contains("spool: removing an empty segment"),
        "the third start did not meet the empty segment a clean stop leaves:\n{restart}"
    );
    assert_eq!(
        warning_lines(&logs),
        Vec::<&str>::new(),
        "WARN/ERROR lines on a healthy start and a clean restart"
    );
}

/// How long the replica stays down: more than [`DOWN_SUMMARY_INTERVAL`] (60 s) so that one
/// summary is due, less than two.
const OUTAGE: Duration = Duration::from_secs(70);

/// Waits until collector `c` shows the replica `url` in `replica_state` `state` (at most
/// `limit`), then writing to the replica `active` (at most 30 s); the time since `since`.
async fn wait_switched(
    c: &Collector,
    (url, state, limit): (&str, u8, Duration),
    active: &str,
    since: Instant,
) -> Duration {
    c.wait_replica("replica_state", url, state, limit).await;
    c.wait_replica("active_replica", active, 1, Duration::from_secs(30))
        .await;
    since.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_down_for_a_minute_logs_a_bounded_number_of_lines() {
    let stack = Stack::own(2);
    let env = TestEnv::new(&stack).await;
    let c = env.collector(&[]).await;
    let urls = stack.clickhouse_urls();
    let (r1, r2) = (urls[0].clone(), urls[1].clone());
    for r in [&r1, &r2] {
        c.wait_replica("replica_state", r, 2, Duration::from_secs(30))
            .await;
    }
    let traffic = Traffic::start(&c, &env.site, Duration::from_millis(50));
    traffic.wait_acked(20, Duration::from_secs(30)).await;
    let before = c.logs().len();

    stack.replica(1).kill().unwrap();
    let killed = Instant::now();
    let marked_down = wait_switched(&c, (&r1, 0, Duration::from_secs(30)), &r2, killed).await;
    // Beacons keep flowing to the other replica during the whole outage.
    while killed.elapsed() < OUTAGE {
        traffic.wait_acked(10, Duration::from_secs(30)).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stack.replica(1).start().unwrap();
    let back = wait_switched(&c, (&r1, 2, Duration::from_secs(90)), &r1, Instant::now()).await;
    traffic.wait_acked(20, Duration::from_secs(30)).await;
    let report = traffic.stop().await;
    env.assert_stored_once(&report.acked, Duration::from_secs(60))
        .await;

    let logs = c.logs();
    let window = &logs[before..];
    let about_r1: Vec<&str> = window.lines().filter(|l| l.contains(r1.as_str())).collect();
    let shown = about_r1.join("\n");
    let down: Vec<&&str> = about_r1
        .iter()
        .filter(|l| l.contains("replica down"))
        .collect();
    let summaries = about_r1
        .iter()
        .filter(|l| l.contains("replica still down"))
        .count();
    let returned = about_r1
        .iter()
        .filter(|l| l.contains("replica back"))
        .count();
    eprintln!(
        "outage: marked down {marked_down:?} after the kill, healthy again {back:?} after the \
         start; {} lines about {r1}:\n{shown}",
        about_r1.len()
    );
    // One line when it goes down, a WARN naming the connection's cause.
    assert_eq!(down.len(), 1, "lines at going down:\n{shown}");
    assert!(
        down[0].contains(" WARN ")
            && (down[0].contains("Connection refused") || down[0].contains("connection refused")),
        "the down line must name the cause: {}",
        down[0]
    );
    // Down for OUTAGE (70 s) less the time to notice, plus the time to come back: at least
    // one summary is due (after 60 s down), and at most one per whole minute it was not back.
    let most = (OUTAGE + back).as_secs() / 60;
    assert!(
        (1..=most).contains(&(summaries as u64)),
        "{summaries} summaries while down (1 to {most} due):\n{shown}"
    );
    assert_eq!(returned, 1, "lines at coming back:\n{shown}");
    assert_eq!(
        about_r1.len(),
        2 + summaries,
        "lines about the replica: exactly down, the summaries, back:\n{shown}"
    );
    let warned = warning_lines(window);
    assert_eq!(
        warned.len(),
        1 + summaries,
        "WARN/ERROR lines during the outage (down and the summary only):\n{}",
        warned.join("\n")
    );
}
