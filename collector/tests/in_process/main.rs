//! The in-process tier: the whole collector in this process, on `127.0.0.1:0`, with an
//! in-memory site source and in-memory ClickHouse servers (`common`). No root, no servers,
//! no network beyond loopback. What only real servers can show (replication, kills, the
//! pooler, a full disk, browsers, the edge, containers) is in `tests/tests/` of the
//! workspace.

mod cache;
mod common;
mod contract;
mod drain;
mod groups;
mod sampling;
mod shards;
mod writer;

use std::time::Duration;

use common::{beacon, wait_until, App, ClickHouse, Sites};

/// Waits until the server holds `n` rows.
async fn rows(ch: &ClickHouse, n: usize) {
    let what = format!("{n} rows in {}", ch.url());
    wait_until(&what, Duration::from_secs(10), || async {
        ch.rows().len() >= n
    })
    .await;
}

#[tokio::test]
async fn a_beacon_is_answered_202_and_stored_once() {
    let ch = ClickHouse::start().await;
    let app = App::start(Sites::with(&["shop"]), &[&ch], &[]).await;
    let (id, body) = beacon("shop");
    let answer = app.send(&body).await;
    assert_eq!(answer.status, 202, "{}", answer.text());
    rows(&ch, 1).await;
    let stored = ch.rows();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].id, id);
    assert_eq!(stored[0].lcp_ms, Some(1500.25));
    assert_eq!(
        app.metric("collector_measurements_accepted_total").await,
        1.0
    );
    app.stop(false).await;
}
