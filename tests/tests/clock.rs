//! A wall clock that steps (as NTP or an operator steps it), under a real collector: libfaketime
//! moves the process's wall clock back and forward by an hour while ClickHouse is unreachable
//! and measurements wait in the spool. Their age, the one number that says "data is late",
//! and the settings' age are measured on the monotonic clock and move with neither step.

use collector_tests::common;

use std::time::{Duration, Instant};

use common::*;

const PRELOAD: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// Waits (up to 10 s) until `collector_spool_oldest_record_age_seconds` satisfies `ok`;
/// returns the reading, or panics with the last one.
async fn wait_age(c: &Collector, what: &str, ok: impl Fn(f64) -> bool) -> f64 {
    let start = Instant::now();
    loop {
        let age = c.metric("collector_spool_oldest_record_age_seconds").await;
        if ok(age) {
            return age;
        }
        if start.elapsed() >= Duration::from_secs(10) {
            c.diag.give_up(format!("{what}: the age read {age}")).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stepped_wall_clock_moves_the_spool_and_settings_ages_neither_way() {
    assert!(
        std::path::Path::new(PRELOAD).exists(),
        "{PRELOAD} is missing: run scripts/stack.sh install (Debian package libfaketime)"
    );
    let env = TestEnv::new(Stack::shared()).await;
    let clock = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(clock.path(), "+0\n").unwrap();
    // Nothing listens there: every insert fails and the measurements stay in the spool.
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let c = env
        .collector(&[
            ("COLLECTOR_CLICKHOUSE_URLS", &nowhere),
            ("LD_PRELOAD", PRELOAD),
            ("FAKETIME_TIMESTAMP_FILE", clock.path().to_str().unwrap()),
            ("FAKETIME_NO_CACHE", "1"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ])
        .await;
    for _ in 0..11 {
        let (_, m) = measurement(&env.site);
        assert_eq!(c.post_json(&m).await.0, 202);
    }
    assert_eq!(c.metric("collector_spool_records").await, 11.0);
    let before = wait_age(&c, "waiting", |a| a >= 2.0).await;

    std::fs::write(clock.path(), "-1h\n").unwrap();
    let back = wait_age(&c, "after a step of -1 h", |a| a > 0.0).await;
    assert!(
        back >= before && back < before + 30.0,
        "after a step of -1 h the age read {back} (before: {before}): it must not go back, \
         and may grow by the seconds the test took since (30 s at most on a loaded machine), \
         never by the hour"
    );
    std::fs::write(clock.path(), "+1h\n").unwrap();
    let ahead = wait_age(&c, "after a step of +1 h", |a| a > 0.0).await;
    assert!(
        ahead >= back && ahead < before + 60.0,
        "after a step of +1 h the age read {ahead} (before: {before}): it grows only by the \
         seconds the test took since (60 s at most on a loaded machine), never by the hour"
    );
    // The step did reach the collector: its answers' `Date` (hyper reads the wall clock) is an
    // hour ahead; and the settings age, on the monotonic clock too, did not jump with it.
    let (_, m) = measurement(&env.site);
    let (status, _, headers) = c.post(m.to_string(), &[]).await;
    assert_eq!(status, 202);
    let date = headers
        .get("date")
        .and_then(|d| d.to_str().ok())
        .and_then(|d| httpdate::parse_http_date(d).ok())
        .expect("a Date header on the answer");
    let ahead_by = date
        .duration_since(std::time::SystemTime::now())
        .map_or(0.0, |d| d.as_secs_f64());
    assert!(
        (3500.0..3700.0).contains(&ahead_by),
        "the collector's wall clock is {ahead_by} s ahead, not about an hour (3,600 s within \
         100 s: `Date` has whole seconds, and the answer and this reading are moments apart)"
    );
    let settings_age = c.metric("collector_settings_age_seconds").await;
    assert!(
        settings_age < 120.0,
        "a +1 h step moved the settings age to {settings_age} s"
    );
}
