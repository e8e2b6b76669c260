//! A client's share of a site's budget: it cannot choose its address behind a trusted proxy,
//! and one client flooding a site takes only its share.

use super::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// One client rotating the address it claims: `n` beacons back to back from its own loopback
/// address through `client` to `url`, each with a new `X-Forwarded-For` and `Forwarded` value of
/// its choosing. The answers by status and how long it took.
async fn rotate(
    client: &reqwest::Client,
    url: &str,
    n: usize,
) -> (std::collections::BTreeMap<u16, usize>, Duration) {
    let mut statuses = std::collections::BTreeMap::new();
    let start = Instant::now();
    for i in 0..n {
        let claimed = format!("198.51.100.{}", i % 250 + 1);
        let (_, m) = beacon_on("site-1", "https://shop.example/");
        let headers = [
            ("x-forwarded-for", claimed.clone()),
            ("forwarded", format!("for={claimed}")),
        ];
        *statuses
            .entry(post_status(client, url, &m, &headers).await)
            .or_default() += 1;
    }
    (statuses, start.elapsed())
}

/// The per-client rate of the test: 2 a second, bursts of 4.
const CLIENT_RATE: &str = "2";

/// What the per-client rate lets through in `elapsed`, with one second of slack for a busy
/// machine; checked to be well below the 60 beacons sent (a run so slow that the rate would let
/// most of them through would prove nothing).
fn client_budget(elapsed: Duration) -> usize {
    let budget = 4 + 2 * (elapsed.as_secs() as usize + 1);
    assert!(
        budget <= 40,
        "60 beacons took {elapsed:?}: too slow for the rate to show (budget {budget})"
    );
    budget
}

/// 60 beacons rotating the address they claim through `url` from `rotating`: no more than one
/// client's budget gets through, the rest is 429, and `other` then still has its own budget.
/// Returns how many were refused.
async fn one_clients_budget(
    label: &str,
    rotating: &reqwest::Client,
    other: &reqwest::Client,
    url: &str,
) -> usize {
    let (statuses, took) = rotate(rotating, url, 60).await;
    let budget = client_budget(took);
    let through = statuses.get(&202).copied().unwrap_or(0);
    let refused = statuses.get(&429).copied().unwrap_or(0);
    println!("{label}: 60 beacons rotating X-Forwarded-For/Forwarded in {took:?}: {statuses:?} (budget {budget})");
    assert!(
        through <= budget,
        "{label}: {through} got through, budget {budget}: {statuses:?}"
    );
    assert_eq!(
        refused,
        60 - through,
        "{label}: the rest is 429: {statuses:?}"
    );
    let (_, m) = beacon_on("site-1", "https://shop.example/");
    assert_eq!(
        post_status(other, url, &m, &[]).await,
        202,
        "{label}: another client has its own budget"
    );
    refused
}

/// The settings of a collector behind a proxy on 127.0.0.1 that it trusts, reading the client
/// address from `header`, [`CLIENT_RATE`] beacons a second per client.
fn behind_a_trusted_proxy(header: &str) -> [(&str, &str); 3] {
    [
        ("COLLECTOR_TRUSTED_PROXIES", "127.0.0.1/32"),
        ("COLLECTOR_CLIENT_IP_HEADER", header),
        ("COLLECTOR_CLIENT_RATE", CLIENT_RATE),
    ]
}

/// Issue 37, 7: the client address cannot be chosen by the client. A collector behind a trusted
/// proxy (`COLLECTOR_TRUSTED_PROXIES` 127.0.0.1, `COLLECTOR_CLIENT_IP_HEADER` X-Forwarded-For,
/// `COLLECTOR_CLIENT_RATE` 2/s, bursts of 4): a client that sends 60 beacons, each claiming
/// another address in `X-Forwarded-For` and `Forwarded`, through a real nginx (the shipped
/// guide's configuration) and then through the shipped HAProxy edge, gets no more than one
/// client's budget and the rest 429; so does one behind an nginx that appends to `Forwarded`,
/// to a collector reading `Forwarded`; another client meanwhile keeps its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cannot_choose_its_address_behind_a_trusted_proxy() {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env
        .collector(&behind_a_trusted_proxy("X-Forwarded-For"))
        .await;
    // A second collector that reads `Forwarded`, behind an nginx location that appends the
    // peer to the `Forwarded` the client sent (RFC 7239's way) and passes its
    // `X-Forwarded-For` through untouched.
    let by_forwarded = env.collector(&behind_a_trusted_proxy("Forwarded")).await;
    let fwd = format!(
        "location /fwd/ {{\n  proxy_pass http://127.0.0.1:{}/;\n  \
         proxy_set_header Forwarded \"$http_forwarded, for=$remote_addr\";\n}}",
        by_forwarded.port
    );
    let nginx = Nginx::start(c.port, &fwd).await;
    let through_nginx = format!("{}/perf/api/v1/measurements", nginx.url);
    let mut refused = one_clients_budget(
        "nginx",
        &client_from("127.0.0.5"),
        &client_from("127.0.0.6"),
        &through_nginx,
    )
    .await;

    let appended = format!("{}/fwd/api/v1/measurements", nginx.url);
    one_clients_budget(
        "nginx appending Forwarded",
        &client_from("127.0.0.9"),
        &client_from("127.0.0.10"),
        &appended,
    )
    .await;

    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::new(tmp.path(), "edge");
    let edge = EdgeHaproxy::start(&pki, c.port).await;
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&pki.ca).unwrap()).unwrap();
    let from = |source: &str| {
        reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(ca.clone())
            .local_address(source.parse::<std::net::IpAddr>().unwrap())
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap()
    };
    let through_edge = format!("{}/api/v1/measurements", edge.url);
    refused += one_clients_budget(
        "HAProxy",
        &from("127.0.0.7"),
        &from("127.0.0.8"),
        &through_edge,
    )
    .await;
    assert_eq!(
        c.metric("collector_http_rate_limited_total").await,
        refused as f64,
        "every 429 counted, and no other"
    );
}

/// Issue 52, 1 (contract v5 §2, "A site's budget is shared among its clients"): one client
/// floods a site at ten times its budget (`COLLECTOR_SITE_RATE` 40/s: 8 requests a second of
/// 50 beacons each, 400/s) with the shop's `Origin`, beside 20 visitors at a beacon a second
/// each, all named by a trusted proxy's `X-Forwarded-For`. The visitors keep at least 99 % of
/// their page views (answered 202 and stored), the flood is answered 429 beyond its share (at
/// most the site's budget over its run gets through, and its requests of 50 never fit a share
/// of 40 among 21 clients), and the site's rate is not lowered: the flood counts for at most 2
/// page views a second toward the demand (`sampling::CLIENT_DEMAND_MAX`), the visitors' 20 and
/// its 2 are under 90 % of the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_flooding_a_site_takes_only_its_share_of_the_budget() {
    let env = TestEnv::new(Stack::shared()).await;
    env.add_site("shared", &["--origin", "https://shop.example"]);
    let c = env
        .collector(&[
            ("COLLECTOR_SITE_RATE", "40"),
            ("COLLECTOR_TRUSTED_PROXIES", "127.0.0.1/32,::1/128"),
        ])
        .await;
    let url = format!("{}/api/v1/measurements", c.url);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    // The flood lasts as long as the visitors take to send their 300 page views (15 s on an
    // idle machine, longer on a busy one): every visit meets it.
    let visiting = Arc::new(AtomicBool::new(true));
    let flood = tokio::spawn(flood_of_one_client(
        http.clone(),
        url.clone(),
        visiting.clone(),
    ));
    let (acked, sent, visitor_statuses) = twenty_visitors(&http, &url, VISITS).await;
    visiting.store(false, Ordering::Relaxed);
    let (flood_statuses, flood_for) = flood.await.unwrap();
    let flood_sent: usize = flood_statuses.values().sum();
    println!(
        "flood: {flood_sent} requests of 50 in {flood_for:?}, answers {flood_statuses:?}; \
         visitors: {sent} sent, answers {visitor_statuses:?}"
    );
    assert!(
        acked.len() * 100 >= sent * 99,
        "at least 99 % of the visitors' page views answered 202: {} of {sent} ({visitor_statuses:?})",
        acked.len()
    );
    let stored = env.wait_rows(&acked, VISIBLE).await;
    assert_eq!(stored.len(), acked.len(), "every acknowledged visit stored");
    let flood_acked = flood_statuses.get(&202).copied().unwrap_or(0);
    assert_eq!(
        flood_acked, 0,
        "a request of 50 is beyond the flooder's share: {flood_statuses:?}"
    );
    assert_eq!(
        flood_statuses.get(&429).copied().unwrap_or(0),
        flood_sent,
        "{flood_statuses:?}"
    );
    let over_share = c.metric("collector_http_over_share_total").await;
    assert_eq!(over_share, flood_sent as f64, "every flood request counted");
    let answer: Value = http
        .get(format!("{}/api/v1/sites/shared", c.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        answer["sample_rate"],
        json!(1.0),
        "the flood lowered the rate: {answer}"
    );
}

/// One client (`X-Forwarded-For` 198.51.100.7, the shop's `Origin`) posting 8 requests a
/// second of 50 beacons each to `flood_url` through `flooder` while `on` holds: the answers by
/// status, and how long it ran.
async fn flood_of_one_client(
    flooder: reqwest::Client,
    flood_url: String,
    on: Arc<AtomicBool>,
) -> (std::collections::BTreeMap<u16, usize>, Duration) {
    let mut tick = tokio::time::interval(Duration::from_millis(125));
    let headers = [
        ("origin", "https://shop.example".to_owned()),
        ("x-forwarded-for", "198.51.100.7".to_owned()),
    ];
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let start = Instant::now();
    while on.load(Ordering::Relaxed) {
        tick.tick().await;
        let batch: Vec<Value> = (0..50)
            .map(|_| beacon_on("shared", "https://shop.example/p/flood").1)
            .collect();
        let status = post_status(&flooder, &flood_url, &json!(batch), &headers).await;
        *statuses.entry(status).or_default() += 1;
    }
    (statuses, start.elapsed())
}

/// Page views the twenty visitors send in all.
const VISITS: usize = 300;

/// 20 visitors (`X-Forwarded-For` 192.0.2.1 to .20, the shop's `Origin`) at a beacon a second
/// each (one every 50 ms among them) to `url` through `http`, `visits` in all: the ids
/// answered 202, the number sent and the answers by status.
async fn twenty_visitors(
    http: &reqwest::Client,
    url: &str,
    visits: usize,
) -> (Vec<String>, usize, std::collections::BTreeMap<u16, usize>) {
    // A late tick is not made up by a burst: a visitor's beacons stay about a second apart.
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sending = Vec::new();
    for k in 0..visits {
        tick.tick().await;
        let headers = vec![
            ("origin", "https://shop.example".to_owned()),
            ("x-forwarded-for", format!("192.0.2.{}", k % 20 + 1)),
        ];
        let (client, url) = (http.clone(), url.to_owned());
        let (id, m) = beacon_on("shared", "https://shop.example/p/visit");
        sending.push(tokio::spawn(async move {
            (id, post_status(&client, &url, &m, &headers).await)
        }));
    }
    let mut acked = Vec::new();
    let mut visitor_statuses = std::collections::BTreeMap::<u16, usize>::new();
    let sent = sending.len();
    for v in sending {
        let (id, status) = v.await.unwrap();
        *visitor_statuses.entry(status).or_default() += 1;
        if status == 202 {
            acked.push(id);
        }
    }
    (acked, sent, visitor_statuses)
}
