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
    assert!(get(addr, "/readyz").await.text().contains("draining"));
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
