//! Signing off (contract §2, operations): on SIGTERM `/readyz` fails first while intake
//! still accepts, then the listener closes, then what was accepted is flushed.

use std::time::{Duration, Instant};

use crate::common::{beacon, get, wait_until, App, ClickHouse, Sites};

#[tokio::test]
async fn readiness_fails_first_intake_accepts_through_the_grace_then_the_listener_closes() {
    let ch = ClickHouse::start().await;
    let mut app = App::start(Sites::with(&["shop"]), &[&ch], &[("--drain-grace", "1s")]).await;
    let addr = app.addr;
    let began = Instant::now();
    app.signal(true);
    wait_until(
        "/readyz answers 503 draining",
        Duration::from_millis(500),
        || async move { get(addr, "/readyz").await.status == 503 },
    )
    .await;
    // The reason on the operations listener only (contract v4); the public one says no more.
    assert!(get(app.admin, "/readyz").await.text().contains("draining"));
    let public = get(addr, "/readyz").await.text();
    assert!(!public.contains("draining"), "{public}");
    // Still within the grace: beacons are accepted and stored.
    let mut ids = Vec::new();
    for _ in 0..5 {
        let (id, body) = beacon("shop");
        assert_eq!(app.send(&body).await.status, 202);
        ids.push(id);
    }
    assert!(
        began.elapsed() < Duration::from_secs(1),
        "the grace outlasted the checks"
    );
    let spool = app.stopped().await;
    let took = began.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(5),
        "drained in {took:?}: after the 1 s grace, well before any deadline"
    );
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the listener is closed"
    );
    // Flushed before it ended: every beacon accepted during the grace is stored once.
    let mut stored: Vec<_> = ch.rows().iter().map(|r| r.id).collect();
    stored.sort();
    ids.sort();
    assert_eq!(stored, ids);
    drop(spool);
}

#[tokio::test]
async fn sigint_closes_at_once() {
    let ch = ClickHouse::start().await;
    let app = App::start(Sites::with(&["shop"]), &[&ch], &[("--drain-grace", "30s")]).await;
    let (took, _) = app.stop(false).await;
    assert!(
        took < Duration::from_secs(3),
        "no grace on SIGINT: {took:?}"
    );
}

/// The writer's drain ends [`collector::writer::DRAIN_DEADLINE`] after the drain began,
/// however many batches are left, even when each batch alone would finish in time: a slow
/// replica (2 s per INSERT) and a backlog of 10 one-row batches (20 s of inserts).
#[tokio::test]
async fn the_drain_ends_at_its_deadline_with_a_backlog_on_a_slow_replica() {
    let ch = ClickHouse::start().await;
    let sites = Sites::with(&["shop"]);
    let options = [("--batch-max-rows", "1"), ("--drain-grace", "100ms")];
    let app = App::start(sites.clone(), &[&ch], &options).await;
    ch.set_insert_delay(Duration::from_secs(2));
    let mut ids = Vec::new();
    for _ in 0..10 {
        let (id, body) = beacon("shop");
        assert_eq!(app.send(&body).await.status, 202);
        ids.push(id);
    }
    let (took, spool) = app.stop(false).await;
    let bound = collector::writer::DRAIN_DEADLINE + Duration::from_secs(3);
    assert!(
        took < bound,
        "drained in {took:?}: the writer's deadline counts from the drain's start ({bound:?})"
    );
    assert!(
        ch.rows().len() < 10,
        "the backlog outlasts the deadline here"
    );
    // Restarted on the same spool, with the replica fast again: every id once.
    ch.set_insert_delay(Duration::ZERO);
    let app = App::start_on(spool, sites, &[&ch], &[]).await;
    let what = "the 10 acknowledged rows after the restart";
    wait_until(what, Duration::from_secs(10), || async {
        ch.rows().len() >= 10
    })
    .await;
    let mut stored: Vec<_> = ch.rows().iter().map(|r| r.id).collect();
    stored.sort();
    ids.sort();
    assert_eq!(stored, ids, "each acknowledged id once");
    app.stop(false).await;
}
