//! The replica state machine: failover, catch-up gating, trials, logging.

use super::*;

/// A probe that failed with `cause`.
fn failed(cause: &str) -> Result<Probe, ProbeError> {
    Err(ProbeError::ClickHouse(clickhouse::error::Error::Custom(
        cause.to_owned(),
    )))
}

fn passed(caught_up: bool) -> Result<Probe, ProbeError> {
    Ok(Probe {
        caught_up,
        dedup_token: false,
        schema: true,
        replicated: true,
    })
}

fn replicas(n: usize) -> Replicas {
    use clap::Parser;
    let urls: Vec<String> = (0..n).map(|i| format!("http://r{i}:8123")).collect();
    let cli = crate::cli::Cli::try_parse_from([
        "collector",
        "--clickhouse-urls",
        &urls.join(","),
        "--clickhouse-database",
        "db",
    ])
    .unwrap();
    let config = crate::config::Config::from_args(&cli.args).unwrap();
    let ch = &config.clickhouse;
    Replicas::new(ch, &ch.shards[0], Arc::new(Metrics::new()))
}

#[test]
fn one_failure_does_not_close_a_replica() {
    let r = replicas(2);
    r.insert_failed(0, "refused");
    r.insert_failed(0, "refused");
    assert_eq!(r.pick(), 0);
    r.insert_failed(0, "refused");
    assert_eq!(r.state(0), State::Down);
    assert_eq!(r.pick(), 1);
}

#[test]
fn returning_replica_must_pass_several_probes() {
    let r = replicas(3);
    for _ in 0..PROBE_FAILURES_TO_DOWN {
        r.probed(0, failed("down"), false);
    }
    assert_eq!(r.pick(), 1);
    r.probed(0, passed(false), false);
    assert_eq!(r.state(0), State::CatchingUp);
    for _ in 0..10 {
        r.probed(0, passed(false), false);
    }
    assert_eq!(r.pick(), 1, "lagging replica is not written to");
    for n in 1..=PASSES_TO_HEALTHY {
        assert_eq!(r.pick(), 1);
        r.probed(0, passed(true), false);
        assert_eq!(r.state(0) == State::Healthy, n == PASSES_TO_HEALTHY);
    }
    assert_eq!(r.pick(), 0, "back to the preferred replica");
}

#[test]
fn a_healthy_replica_briefly_behind_stays_in_use() {
    let r = replicas(2);
    r.probed(0, passed(false), false);
    r.probed(0, passed(true), false);
    r.probed(0, passed(false), false);
    r.probed(0, passed(false), false);
    assert_eq!(
        r.state(0),
        State::Healthy,
        "lags between passes are not consecutive"
    );
    assert_eq!(r.pick(), 0);
    r.probed(0, passed(false), false);
    assert_eq!(
        r.state(0),
        State::CatchingUp,
        "three lagging probes in a row"
    );
    assert_eq!(r.pick(), 1);
}

#[test]
fn a_failed_probe_resets_the_passes() {
    let r = replicas(2);
    for _ in 0..PROBE_FAILURES_TO_DOWN {
        r.probed(0, failed("down"), false);
    }
    r.probed(0, passed(true), false);
    r.probed(0, passed(true), false);
    r.probed(0, failed("down"), false);
    r.probed(0, passed(true), false);
    assert_ne!(r.state(0), State::Healthy);
}

#[test]
fn everything_down_rotates() {
    let r = replicas(3);
    for i in 0..3 {
        r.probed(i, failed("down"), true);
    }
    let picks: Vec<usize> = (0..6).map(|_| r.pick()).collect();
    let mut distinct = picks.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct, [0, 1, 2], "{picks:?}");
}

#[test]
fn a_replica_without_the_schema_is_never_picked() {
    let r = replicas(3);
    let lacking = Ok(Probe {
        caught_up: true,
        dedup_token: false,
        schema: false,
        replicated: false,
    });
    r.probed(0, lacking, true);
    assert_eq!(r.state(0), State::Down);
    assert_eq!(r.pick(), 1);
    r.probed(1, failed("down"), true);
    r.probed(2, failed("down"), true);
    let picks: Vec<usize> = (0..6).map(|_| r.pick()).collect();
    assert!(!picks.contains(&0), "not even in rotation: {picks:?}");
    r.probed(0, passed(true), false);
    assert_eq!(r.state(0), State::CatchingUp, "schema applied: catching up");
    r.probed(0, passed(true), false);
    r.probed(0, passed(true), false);
    assert_eq!(r.pick(), 0, "caught up: preferred again");
}

#[test]
fn a_preferred_replica_back_is_active_without_a_batch() {
    let r = replicas(2);
    for _ in 0..PROBE_FAILURES_TO_DOWN {
        r.probed(0, failed("refused"), false);
    }
    assert_eq!(r.pick(), 1);
    for _ in 0..PASSES_TO_HEALTHY + 1 {
        r.probed(0, passed(true), false);
    }
    assert_eq!(r.state(0), State::Healthy);
    assert_eq!(
        r.inner.lock().unwrap().active,
        0,
        "active again before any pick"
    );
}

#[test]
fn a_flapping_replica_is_logged_down_once_an_interval() {
    let r = replicas(2);
    for _ in 0..5 {
        for _ in 0..PROBE_FAILURES_TO_DOWN {
            r.probed(0, failed("connection refused"), false);
        }
        assert_eq!(r.state(0), State::Down);
        for _ in 0..PASSES_TO_HEALTHY + 1 {
            r.probed(0, passed(true), false);
        }
        assert_eq!(r.state(0), State::Healthy);
    }
    let h = &r.inner.lock().unwrap().health[0];
    assert_eq!(
        h.flaps, 4,
        "the first outage logged, the four after it counted"
    );
    assert!(h.down_logged.is_some() && h.back_logged.is_some());
}

/// Makes replica `i`'s next trial due now.
fn trial_due(r: &Replicas, i: usize) {
    r.inner.lock().unwrap().health[i].next_trial = Some(Instant::now());
}

#[test]
fn a_replica_refusing_inserts_is_back_only_when_a_trial_insert_succeeds() {
    let r = replicas(2);
    for _ in 0..FAILURES_TO_DOWN {
        r.insert_failed(
            0,
            "Code: 164. DB::Exception: Cannot insert into table in readonly mode",
        );
    }
    assert_eq!(r.state(0), State::Down);
    assert_eq!(r.pick(), 1);
    let failovers = r.metrics.clickhouse.failovers.get();
    for _ in 0..PASSES_TO_HEALTHY - 1 {
        r.probed(0, passed(true), false);
        assert_eq!(r.state(0), State::Down, "probes pass: still down");
        assert_eq!(r.pick(), 1, "no trial before the catch-up passes");
    }
    r.probed(0, passed(false), false);
    assert_eq!(
        r.state(0),
        State::Down,
        "lagging: still down, not catching up"
    );
    for _ in 0..PASSES_TO_HEALTHY {
        r.probed(0, passed(true), false);
    }
    assert_eq!(r.state(0), State::Down);
    assert_eq!(r.pick(), 0, "the trial");
    assert_eq!(r.active(), 1, "a trial does not make the replica active");
    r.insert_failed(0, "Code: 164. DB::Exception: readonly");
    assert_eq!(r.state(0), State::Down, "a failed trial: still down");
    for _ in 0..10 {
        r.probed(0, passed(true), false);
        assert_eq!(r.pick(), 1, "the next trial waits");
    }
    {
        let h = &r.inner.lock().unwrap().health[0];
        assert_eq!(h.trials_failed, 1);
        assert_eq!(
            h.last_error, "insert (trial): Code: 164. DB::Exception: readonly",
            "the latest refusal"
        );
        let wait = h
            .next_trial
            .unwrap()
            .saturating_duration_since(Instant::now());
        assert!(
            wait > TRIAL_INTERVAL_MIN / 2 && wait <= TRIAL_INTERVAL_MIN * 2,
            "{wait:?}"
        );
    }
    trial_due(&r, 0);
    assert_eq!(r.pick(), 0, "the second trial");
    r.insert_succeeded(0);
    assert_eq!(
        r.state(0),
        State::Healthy,
        "a trial that succeeded: healthy at once"
    );
    assert_eq!(r.active(), 0, "active again before any pick");
    assert_eq!(r.pick(), 0, "preferred again");
    assert_eq!(
        r.metrics.clickhouse.failovers.get(),
        failovers + 1,
        "trials are not failovers"
    );
    let h = &r.inner.lock().unwrap().health[0];
    assert!(!h.awaits_insert && h.down_since.is_none() && h.next_trial.is_none());
}

#[test]
fn a_less_preferred_replica_refusing_inserts_gets_trials_too() {
    let r = replicas(2);
    for _ in 0..FAILURES_TO_DOWN {
        r.insert_failed(
            1,
            "Code: 241. DB::Exception: Memory limit (for query) exceeded",
        );
    }
    for _ in 0..PASSES_TO_HEALTHY {
        r.probed(1, passed(true), false);
    }
    assert_eq!(r.pick(), 1, "the trial");
    r.insert_succeeded(1);
    assert_eq!(r.state(1), State::Healthy);
    assert_eq!(r.pick(), 0);
}

#[test]
fn trial_intervals_double_up_to_their_bound() {
    for failed in 0..40 {
        let d = trial_interval(failed);
        let cap = TRIAL_INTERVAL_MIN
            .saturating_mul(1 << failed.min(16))
            .min(TRIAL_INTERVAL_MAX);
        assert!(d >= cap / 2 && d <= cap, "{failed}: {d:?}");
    }
    assert!(trial_interval(30) >= TRIAL_INTERVAL_MAX / 2);
}

#[test]
fn an_insert_that_succeeds_in_rotation_leaves_the_return_to_the_probes() {
    let r = replicas(1);
    for _ in 0..FAILURES_TO_DOWN {
        r.insert_failed(0, "Code: 252. DB::Exception: Too many parts");
    }
    r.probed(0, failed("timeout"), false);
    assert_eq!(r.pick(), 0, "rotation: the only replica");
    r.insert_succeeded(0);
    assert_eq!(r.state(0), State::Down);
    r.probed(0, passed(true), false);
    assert_eq!(
        r.state(0),
        State::CatchingUp,
        "the insert proved it: the probes decide"
    );
    r.probed(0, passed(true), false);
    r.probed(0, passed(true), false);
    assert_eq!(r.state(0), State::Healthy);
}

#[test]
fn an_outage_lasts_until_the_replica_is_healthy_again() {
    let r = replicas(2);
    let down_since = |r: &Replicas| r.inner.lock().unwrap().health[0].down_since.map(|d| d.0);
    for _ in 0..PROBE_FAILURES_TO_DOWN {
        r.probed(0, failed("refused"), false);
    }
    let since = down_since(&r).expect("down");
    r.probed(0, passed(false), false);
    assert_eq!(r.state(0), State::CatchingUp);
    for _ in 0..PROBE_FAILURES_TO_DOWN {
        r.probed(0, failed("refused"), false);
    }
    assert_eq!(r.state(0), State::Down);
    assert_eq!(
        down_since(&r),
        Some(since),
        "down again while catching up: same outage"
    );
    for _ in 0..PASSES_TO_HEALTHY {
        r.probed(0, passed(true), false);
    }
    assert_eq!(r.state(0), State::Healthy);
    assert_eq!(down_since(&r), None, "back: the outage is over");
}

#[test]
fn a_down_replica_keeps_the_cause_that_took_it_down() {
    let r = replicas(2);
    for _ in 0..FAILURES_TO_DOWN {
        r.insert_failed(0, "Code: 252. DB::Exception: Too many parts");
    }
    assert_eq!(r.state(0), State::Down);
    r.insert_failed(0, "replica marked down during the insert: ...");
    assert_eq!(
        r.inner.lock().unwrap().health[0].last_error,
        "insert: Code: 252. DB::Exception: Too many parts"
    );
}

#[test]
fn catching_up_is_used_when_nothing_is_healthy() {
    let r = replicas(2);
    r.probed(0, failed("down"), true);
    r.probed(1, passed(false), true);
    assert_eq!(r.pick(), 1);
}
