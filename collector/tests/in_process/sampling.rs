//! A site over its budget is sampled, not refused (contract v4 §2): the whole collector lowers
//! the rate it answers for a loud site, keeps a quiet one at its configured rate, says so in
//! `/metrics`, and stores the rate a beacon was drawn at only where it could have been.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{beacon, get, post, Answer, App, ClickHouse, Sites};

/// Sends `body` as a browser does: with an `Origin` (only browsers' beacons count toward a
/// site's demand), from visitor `visitor`'s address, as a trusted proxy names it (one address
/// counts at most `sampling::CLIENT_DEMAND_MAX` (2) page views a second).
async fn send(app: &App, body: &Value, visitor: u8) -> Answer {
    let from = format!("192.0.2.{visitor}");
    let headers = [
        ("content-type", "application/json"),
        ("origin", "https://shop.example"),
        ("x-forwarded-for", from.as_str()),
    ];
    post(app.addr, "/api/v1/measurements", &headers, body.to_string()).await
}

/// The test's budget (`--site-rate`), measurements per second per site.
const BUDGET: &str = "20";

/// The site's answer: its `sample_rate` and `Cache-Control`.
async fn answer(app: &App, site: &str) -> (f64, String) {
    let a = get(app.addr, &format!("/api/v1/sites/{site}")).await;
    assert_eq!(a.status, 200, "{}", a.text());
    let rate = a.json()["sample_rate"]
        .as_f64()
        .unwrap_or_else(|| panic!("no sample_rate in {}", a.text()));
    (rate, a.header("cache-control"))
}

/// Sends `body`, resending once after `Retry-After` when it is answered 429.
async fn send_once_more(app: &App, body: &Value) -> Answer {
    let first = send(app, body, 1).await;
    if first.status != 429 {
        return first;
    }
    let wait: u64 = first.header("retry-after").parse().expect("Retry-After");
    tokio::time::sleep(Duration::from_secs(wait)).await;
    send(app, body, 1).await
}

#[tokio::test]
async fn a_loud_site_is_answered_a_lower_rate_and_its_beacons_say_what_they_were_drawn_at() {
    let ch = ClickHouse::start().await;
    let app = App::start(
        Sites::with(&["loud", "quiet"]),
        &[&ch],
        &[
            ("--site-rate", BUDGET),
            ("--trusted-proxies", "127.0.0.1/32"),
        ],
    )
    .await;
    assert_eq!(answer(&app, "loud").await.0, 1.0);
    // A site this collector has not measured yet is kept 5 s only (sampling::WARMUP).
    assert_eq!(
        answer(&app, "quiet").await,
        (1.0, "public, max-age=5".to_owned())
    );
    let quiet_seen = Instant::now();

    // Five times the budget, a beacon a second from each of 100 visitors (each counts at most
    // 2 page views a second: sampling::CLIENT_DEMAND_MAX), until the answer is lowered. The
    // sampler measures every second (sampling::TICK); allowed: 12 s, mostly for the requests.
    let start = Instant::now();
    let limit = Duration::from_secs(12);
    let lowered = loop {
        for visitor in 0..100 {
            let status = send(&app, &beacon("loud").1, visitor).await.status;
            assert!(status == 202 || status == 429, "{status}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (rate, _) = answer(&app, "loud").await;
        if rate < 0.5 {
            break rate;
        }
        assert!(start.elapsed() < limit, "still {rate} after {limit:?}");
    };
    let traffic_end = Instant::now();
    // About 20 of 100 a second; the first tick may have seen part of a second.
    assert!((0.1..0.5).contains(&lowered), "{lowered}");
    // Asked again at once: a tick (every second) may have fallen between the two answers and
    // lowered the rate once more (see "Rising demand" below), never raised it.
    let (rate, cache) = answer(&app, "loud").await;
    assert!(
        rate <= lowered && (0.1..0.5).contains(&rate),
        "{rate} after {lowered}"
    );
    assert_eq!(cache, "public, max-age=5", "a lowered rate is kept 5 s");
    // Once its demand is known (10 s after it was first seen), a quiet site is kept 60 s.
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(quiet_seen.elapsed())).await;
    assert_eq!(
        answer(&app, "quiet").await,
        (1.0, "public, max-age=60".to_owned())
    );
    // Rising demand is the mean of 3 ticks (sampling::TICK, 1 s), so the ticks after the
    // first lowered answer may lower the rate once more while that mean catches up with the
    // traffic; a rate is never raised within 30 s. Settled: 3 ticks and 1 s of tolerance
    // after the last loud request.
    tokio::time::sleep(Duration::from_secs(4).saturating_sub(traffic_end.elapsed())).await;
    let (settled, _) = answer(&app, "loud").await;
    assert!(
        settled <= lowered && (0.1..0.5).contains(&settled),
        "settled at {settled} after {lowered}"
    );
    let series = "collector_site_sample_rate{site=\"loud\"}";
    assert_eq!(app.metric(series).await, settled);
    assert_eq!(app.metric("collector_sites_sampled").await, 1.0);
    let text = get(app.admin, "/metrics").await.text();
    assert!(
        !text.contains("collector_site_sample_rate{site=\"quiet\"}"),
        "only sampled sites are labelled"
    );

    // What each beacon says it was drawn at, and what is stored: a sent rate is believed
    // between the lowest rate answered (`settled`) and the configured one.
    let cases: [(&str, Option<f64>, f64); 6] = [
        ("loud", Some(lowered), lowered),
        ("loud", Some(1.0), 1.0),
        ("loud", Some(0.0001), settled),
        ("loud", None, settled),
        ("quiet", Some(0.5), 1.0),
        ("quiet", None, 1.0),
    ];
    let mut want = std::collections::HashMap::new();
    for (site, sent, stored) in cases {
        let (id, mut body) = beacon(site);
        if let Some(r) = sent {
            body["sample_rate"] = json!(r);
        }
        let a = send_once_more(&app, &body).await;
        assert_eq!(a.status, 202, "{site} {sent:?}: {}", a.text());
        want.insert(id, (site, sent, stored));
    }
    crate::common::wait_until(
        "the six beacons stored",
        Duration::from_secs(10),
        || async { want.keys().all(|id| ch.rows().iter().any(|r| r.id == *id)) },
    )
    .await;
    for row in ch.rows().iter().filter(|r| want.contains_key(&r.id)) {
        let (site, sent, stored) = want[&row.id];
        assert_eq!(row.sample_rate, stored, "{site} sent {sent:?}");
    }
    app.stop(false).await;
}

/// The adversarial reviews' attack: a flood with a forged `Origin`, at five times a budget of
/// 50, every beacon claiming the lowest rate, through a trusted proxy that names its client
/// `from(request)`. Returns the site's rate after 6 s and the stored rows' rates.
async fn flood(from: impl Fn(usize) -> String) -> (f64, Vec<f64>) {
    let ch = ClickHouse::start().await;
    let app = App::start(
        Sites::with(&["shop"]),
        &[&ch],
        &[("--site-rate", "50"), ("--trusted-proxies", "127.0.0.1/32")],
    )
    .await;
    let start = Instant::now();
    let mut sent = Vec::new();
    let mut n = 0;
    while start.elapsed() < Duration::from_secs(6) {
        let batch: Vec<Value> = (0..25)
            .map(|_| {
                let (id, mut b) = beacon("shop");
                b["sample_rate"] = json!(0.01);
                sent.push(id);
                b
            })
            .collect();
        let client = from(n);
        n += 1;
        let headers = [
            ("content-type", "application/json"),
            ("origin", "https://shop.example"),
            ("x-forwarded-for", client.as_str()),
        ];
        let status = post(
            app.addr,
            "/api/v1/measurements",
            &headers,
            json!(batch).to_string(),
        )
        .await
        .status;
        assert!(status == 202 || status == 429, "{status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rate = answer(&app, "shop").await.0;
    crate::common::wait_until(
        "some of the flood stored",
        Duration::from_secs(10),
        || async { ch.rows().iter().any(|r| sent.contains(&r.id)) },
    )
    .await;
    let stored = ch
        .rows()
        .iter()
        .filter(|r| sent.contains(&r.id))
        .map(|r| r.sample_rate)
        .collect();
    app.stop(false).await;
    (rate, stored)
}

/// One address: it counts at most `sampling::CLIENT_DEMAND_MAX` (2) page views a second, so
/// the site's rate stays 1 and the flood's rows weigh 1 each.
#[tokio::test]
async fn a_flood_from_one_address_does_not_lower_a_sites_rate() {
    let (rate, stored) = flood(|_| "192.0.2.7".to_owned()).await;
    assert_eq!(rate, 1.0, "the flood moved the rate");
    assert!(stored.iter().all(|&r| r == 1.0), "{stored:?}");
}

/// Every request from another address of one IPv6 /64 (the second review's attack: 2^64
/// addresses to choose from): the /64 is one client.
#[tokio::test]
async fn a_flood_from_one_ipv6_subscriber_does_not_lower_a_sites_rate() {
    let (rate, stored) = flood(|n| format!("2001:db8:1:2::{:x}", n + 1)).await;
    assert_eq!(rate, 1.0, "the flood moved the rate");
    assert!(stored.iter().all(|&r| r == 1.0), "{stored:?}");
}
