//! Shards (contract v5 §3) against in-memory ClickHouse servers: each site's rows reach its own
//! shard only; a shard that hangs holds back only its own sites, and delivers them once each
//! when it answers again; a site on a shard the collector does not know is refused whole.

use std::time::Duration;

use collector::settings::Site;
use collector::writer::probe::PROBE_INTERVAL;
use serde_json::Value;
use uuid::Uuid;

use crate::common::{beacon, site, wait_until, App, ClickHouse, Fault, Sites};

/// Sites `shop.a` on shard `a`, `shop.b` on shard `b`, and `shop.c` on shard `c`, which the
/// collector is not told of.
fn sites() -> std::sync::Arc<Sites> {
    let sites = Sites::with(&[]);
    for (key, shard) in [("shop.a", "a"), ("shop.b", "b"), ("shop.c", "c")] {
        sites.put(Site {
            shard: shard.into(),
            ..site(key)
        });
    }
    sites
}

/// A collector writing shard `a` to `a` and shard `b` to `b`.
async fn start(a: &ClickHouse, b: &ClickHouse) -> App {
    let shards = format!("a={};b={}", a.url(), b.url());
    App::start(sites(), &[], &[("--clickhouse-shards", &shards)]).await
}

/// Sends one beacon of `site`, asserts its 202, returns its id.
async fn sent(app: &App, site: &str) -> Uuid {
    let (id, body) = beacon(site);
    let answer = app.send(&body).await;
    assert_eq!(answer.status, 202, "{site}: {}", answer.text());
    id
}

/// The ids `ch` holds, with how often.
fn ids(ch: &ClickHouse) -> Vec<Uuid> {
    let mut ids: Vec<Uuid> = ch.rows().iter().map(|r| r.id).collect();
    ids.sort();
    ids
}

/// Waits until `ch` holds exactly `want` (each once), failing after `timeout`.
async fn holds_exactly(ch: &ClickHouse, want: &[Uuid], timeout: Duration) {
    let mut want = want.to_vec();
    want.sort();
    let what = format!("{} rows, each once, in {}", want.len(), ch.url());
    wait_until(&what, timeout, || async { ids(ch).len() >= want.len() }).await;
    assert_eq!(ids(ch), want, "{}", ch.url());
}

#[tokio::test]
async fn a_shard_that_hangs_holds_back_only_its_own_sites() {
    let (a, b) = (ClickHouse::start().await, ClickHouse::start().await);
    let app = start(&a, &b).await;
    b.set_fault(Fault::Hang);
    let (mut on_a, mut on_b) = (Vec::new(), Vec::new());
    for _ in 0..20 {
        on_a.push(sent(&app, "shop.a").await);
        on_b.push(sent(&app, "shop.b").await);
    }
    // Shard a's batches flush after 50 ms: a second is ample, with shard b hanging.
    holds_exactly(&a, &on_a, Duration::from_secs(2)).await;
    assert!(b.rows().is_empty(), "shard b hangs and stored nothing");
    // The rows reach the server before the writer confirms them and moves shard a's cursor:
    // its spool gauge falls to 0 a moment after, so wait for it rather than read it once.
    let on_a_spool = r#"collector_spool_records{shard="a"}"#;
    wait_until(on_a_spool, Duration::from_secs(2), || async {
        app.metric(on_a_spool).await == 0.0
    })
    .await;
    let held = r#"collector_spool_records{shard="b"}"#;
    assert_eq!(app.metric(held).await, 20.0, "{held}");
    assert_eq!(app.metric("collector_spool_records").await, 20.0);
    assert!(
        app.metric(r#"collector_spool_oldest_record_age_seconds{shard="b"}"#)
            .await
            > 0.0
    );
    assert_eq!(
        app.metric(r#"collector_spool_oldest_record_age_seconds{shard="a"}"#)
            .await,
        0.0
    );
    // Back: delivered once each within a few probe intervals and the insert's backoff.
    b.set_fault(Fault::None);
    holds_exactly(&b, &on_b, PROBE_INTERVAL * 10 + Duration::from_secs(10)).await;
    assert_eq!(ids(&a).len(), 20, "nothing of shard b's reached shard a");
    app.stop(false).await;
}

#[tokio::test]
async fn a_request_of_two_shards_sites_is_split_between_them() {
    let (a, b) = (ClickHouse::start().await, ClickHouse::start().await);
    let app = start(&a, &b).await;
    let (id_a, one) = beacon("shop.a");
    let (id_b, two) = beacon("shop.b");
    let answer = app.send(&Value::Array(vec![one, two])).await;
    assert_eq!(answer.status, 202, "{}", answer.text());
    holds_exactly(&a, &[id_a], Duration::from_secs(2)).await;
    holds_exactly(&b, &[id_b], Duration::from_secs(2)).await;
    app.stop(false).await;
}

#[tokio::test]
async fn a_site_on_an_unknown_shard_is_refused_whole_and_counted() {
    let (a, b) = (ClickHouse::start().await, ClickHouse::start().await);
    let app = start(&a, &b).await;
    let (_, on_a) = beacon("shop.a");
    let (_, on_c) = beacon("shop.c");
    let answer = app.send(&Value::Array(vec![on_a, on_c])).await;
    assert_eq!(answer.status, 503, "{}", answer.text());
    assert!(answer.header("retry-after").parse::<u64>().unwrap() >= 1);
    let reason = r#"collector_measurements_rejected_total{reason="unknown_shard"}"#;
    assert_eq!(app.metric(reason).await, 2.0);
    // Nothing of the request is stored, on shard a either: a later beacon's row arrives
    // alone.
    let later = sent(&app, "shop.a").await;
    holds_exactly(&a, &[later], Duration::from_secs(2)).await;
    assert!(b.rows().is_empty());
    app.stop(false).await;
}

#[tokio::test]
async fn a_spool_left_by_a_shard_no_longer_configured_stops_serve() {
    let (a, b) = (ClickHouse::start().await, ClickHouse::start().await);
    let app = start(&a, &b).await;
    b.set_fault(Fault::Refuse);
    sent(&app, "shop.b").await;
    let (_, spool) = app.stop(false).await;
    // Shard b left out: its spool still holds a measurement, so serve refuses to start.
    let only_a = format!("a={}", a.url());
    let app = App::launch(spool, sites(), &[], &[("--clickhouse-shards", &only_a)]).await;
    let error = app.failed().await;
    assert!(error.contains("shard b: 1 unconfirmed records"), "{error}");
}

#[tokio::test]
async fn the_drain_ends_by_its_deadline_with_a_shard_hanging_and_the_restart_delivers_it() {
    use collector::writer::probe::PROBE_TIMEOUT;
    use collector::writer::DRAIN_DEADLINE;
    let (a, b) = (ClickHouse::start().await, ClickHouse::start().await);
    let app = start(&a, &b).await;
    b.set_fault(Fault::Hang);
    let on_a = sent(&app, "shop.a").await;
    let on_b = sent(&app, "shop.b").await;
    holds_exactly(&a, &[on_a], Duration::from_secs(2)).await;
    // SIGINT: no grace. Shard b's insert hangs: the drain gives up on it at its deadline,
    // then its prober's probe in flight ends by its timeout; a second of margin, as the
    // single-shard drain test (writer.rs) allows.
    let (took, spool) = app.stop(false).await;
    let bound = DRAIN_DEADLINE + PROBE_TIMEOUT + Duration::from_secs(1);
    assert!(
        took >= DRAIN_DEADLINE && took <= bound,
        "drained in {took:?}: the writer tries until {DRAIN_DEADLINE:?}, the collector ends by {bound:?}"
    );
    assert!(b.rows().is_empty());
    // Restarted on the same spool with shard b answering: its measurement arrives once, and
    // shard a's is not sent again.
    b.set_fault(Fault::None);
    let shards = format!("a={};b={}", a.url(), b.url());
    let app = App::start_on(spool, sites(), &[], &[("--clickhouse-shards", &shards)]).await;
    holds_exactly(&b, &[on_b], Duration::from_secs(10)).await;
    assert_eq!(ids(&a), vec![on_a]);
    app.stop(false).await;
}

#[tokio::test]
async fn a_shard_whose_spool_share_is_full_refuses_its_own_sites_only() {
    let (a, b) = (ClickHouse::start().await, ClickHouse::start().await);
    let shards = format!("a={};b={}", a.url(), b.url());
    // 2 MiB in all: 1 MiB a shard, the least the spool takes is the whole bound's minimum.
    let app = App::start(
        sites(),
        &[],
        &[
            ("--clickhouse-shards", &shards),
            ("--spool-max-bytes", "2097152"),
            ("--site-rate", "0"),
        ],
    )
    .await;
    b.set_fault(Fault::Refuse);
    // Fill shard b's share: beacons of about 1 KiB each until one is refused.
    let mut refused = None;
    for i in 0..5000 {
        let (_, body) = beacon("shop.b");
        let answer = app.send(&body).await;
        if answer.status != 202 {
            refused = Some((i, answer.status));
            break;
        }
    }
    let (after, status) = refused.expect("shard b's share filled within 5000 beacons");
    assert_eq!(status, 503, "a full share is 503");
    assert!(after > 100, "refused after {after} beacons only");
    // Shard a's sites are still accepted, and the collector stays ready.
    let on_a = sent(&app, "shop.a").await;
    holds_exactly(&a, &[on_a], Duration::from_secs(2)).await;
    assert_eq!(crate::common::get(app.admin, "/readyz").await.status, 200);
    // A request of both shards' sites: 503 while b is full, but a's part became durable; its
    // retries (the same ids) fold it as a duplicate: stored once, not once per retry.
    let (mixed_a, one) = beacon("shop.a");
    let (_, two) = beacon("shop.b");
    let body = Value::Array(vec![one, two]);
    for _ in 0..3 {
        assert_eq!(app.send(&body).await.status, 503);
    }
    let drained = r#"collector_spool_records{shard="a"}"#;
    let what = format!("{drained} is 0");
    wait_until(&what, Duration::from_secs(5), || async {
        app.metric(drained).await == 0.0
    })
    .await;
    holds_exactly(&a, &[on_a, mixed_a], Duration::from_secs(2)).await;
    app.stop(false).await;
}
