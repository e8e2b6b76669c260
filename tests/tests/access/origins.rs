//! Beacons must come from the shop's pages: another host's are rejected, a flood without
//! `Origin` gets its own small budget.

use super::*;

/// Issue 37, 6: beacons must come from the shop's pages. For a site with an origin, a beacon
/// whose `url` is on another host is rejected (`url_not_allowed`, in the answer and the metric)
/// and not stored, while one on the site's host is. Then a flood without `Origin` at three times
/// the site's rate (`COLLECTOR_SITE_RATE` 20/s: 60/s for 10 s) beside real visitors with the
/// shop's `Origin` at 5/s: at least 99 % of the visitors' beacons are answered 202 and stored,
/// and the flood gets no more than its own budget (a tenth of the site's: 2/s, bursts of 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beacons_must_come_from_the_shops_pages() {
    let env = TestEnv::new(Stack::shared()).await;
    env.add_site("shop", &["--origin", "https://shop.example"]);
    let c = env.collector(&[("COLLECTOR_SITE_RATE", "20")]).await;
    another_hosts_page_rejected(&env, &c).await;
    // Another host however the URL is written, and the site's host however it is written.
    hosts_however_written(&env, &c).await;

    // The flood and the visitors, side by side.
    let url = format!("{}/api/v1/measurements", c.url);
    let flooder = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let visitor = flooder.clone();
    let length = Duration::from_secs(10);
    let flood = tokio::spawn(flood_without_origin(flooder, url.clone(), length));
    let (acked, sent, slowest, visitor_statuses) = visitors(&visitor, &url, length).await;
    let (flood_statuses, flood_for) = flood.await.unwrap();
    let flood_sent: usize = flood_statuses.values().sum();
    println!(
        "flood without Origin: {flood_sent} in {flood_for:?}, answers {flood_statuses:?}; \
         visitors: {sent} sent, answers {visitor_statuses:?}, slowest answer {slowest:?}"
    );
    assert!(
        acked.len() * 100 >= sent * 99,
        "at least 99 % of the visitors' beacons answered 202: {} of {sent} ({visitor_statuses:?})",
        acked.len()
    );
    let stored = env.wait_rows(&acked, VISIBLE).await;
    assert!(
        stored.len() * 100 >= sent * 99,
        "{} stored of {sent}",
        stored.len()
    );
    // The flood's budget: 2/s with a burst of 4 over its run; one second of slack for the
    // timing of a busy machine (the limiter's clock starts before the first tick).
    let flood_acked = flood_statuses.get(&202).copied().unwrap_or(0);
    let budget = 4 + 2 * (flood_for.as_secs() as usize + 1);
    assert!(
        flood_acked <= budget,
        "the flood got {flood_acked} through, its budget is {budget}: {flood_statuses:?}"
    );
    assert!(
        flood_statuses.get(&429).copied().unwrap_or(0) >= flood_sent - budget,
        "the rest of the flood is answered 429: {flood_statuses:?}"
    );
    assert!(
        flood_sent >= 500,
        "the flood ran at about 60/s: {flood_sent}"
    );
}

/// A beacon of another host's page is rejected (`url_not_allowed`) beside one on the site's
/// host, and refused (403) alone; neither is stored, the site's one is.
async fn another_hosts_page_rejected(env: &TestEnv<'_>, c: &Collector) {
    let (good, good_m) = beacon_on("shop", "https://shop.example/cart");
    let (bad, bad_m) = beacon_on("shop", "https://evil.example/cart");
    let (status, answer, _) = c
        .post(
            json!([good_m, bad_m]).to_string(),
            &[
                ("content-type", "application/json"),
                ("origin", "https://shop.example"),
            ],
        )
        .await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(
        field(&answer, "rejected"),
        &json!([{"index": 1, "error": "url_not_allowed"}])
    );
    let (alone, alone_m) = beacon_on("shop", "https://shop.example.evil.example/");
    let (status, answer, _) = c
        .post(alone_m.to_string(), &[("content-type", "application/json")])
        .await;
    assert_eq!(status, 403, "a beacon on another host alone: {answer}");
    env.wait_rows(std::slice::from_ref(&good), VISIBLE).await;
    assert!(
        env.rows(&[bad.clone(), alone.clone()]).await.is_empty(),
        "the beacons of another host's pages are not stored"
    );
}

/// URLs of another host, however written, that must be rejected for the site
/// `https://shop.example`.
const HOSTILE: [&str; 9] = [
    "https://shop.example@evil.example/",
    "https://shop.example:pw@evil.example/p",
    "https://evil.example\\@shop.example/",
    "https://evil.example#@shop.example",
    "https://evil.example?@shop.example",
    "https://evil.example/shop.example",
    "https://shop.example.evil.example/",
    "https://evilshop.example/",
    "https://[::1]/shop.example",
];

/// [`HOSTILE`] URLs in one batch with URLs of the site's host written in other ways: every one
/// of another host rejected and not stored, none of the site's.
async fn hosts_however_written(env: &TestEnv<'_>, c: &Collector) {
    let hostile = HOSTILE;
    let friendly = [
        "https://SHOP.example/p",
        "http://shop.example:8080/p",
        "https://shop.example:443/p?utm_source=x",
        "https://user@shop.example/p",
    ];
    let mut batch = Vec::new();
    let mut ids = Vec::new();
    for url in hostile.iter().chain(&friendly) {
        let (id, m) = beacon_on("shop", url);
        ids.push(id);
        batch.push(m);
    }
    let (status, answer, _) = c
        .post(
            Value::Array(batch).to_string(),
            &[
                ("content-type", "application/json"),
                ("origin", "https://shop.example"),
            ],
        )
        .await;
    assert_eq!(status, 202, "{answer}");
    let expected: Vec<Value> = (0..hostile.len())
        .map(|i| json!({"index": i, "error": "url_not_allowed"}))
        .collect();
    assert_eq!(
        field(&answer, "rejected"),
        &Value::Array(expected),
        "every page of another host rejected, none of the site's: {hostile:?} then {friendly:?}"
    );
    assert_eq!(field(&answer, "accepted"), friendly.len());
    let stored = env.wait_rows(&ids[hostile.len()..], VISIBLE).await;
    assert_eq!(stored.len(), friendly.len());
    assert!(
        env.rows(&ids[..hostile.len()]).await.is_empty(),
        "no page of another host stored"
    );
    assert_eq!(
        c.metric("collector_measurements_rejected_total{reason=\"url_not_allowed\"}")
            .await,
        (2 + hostile.len()) as f64
    );
}

/// Beacons without `Origin` to `url` through `client` at 60/s for `length`: the answers by
/// status, and how long it ran.
async fn flood_without_origin(
    flooder: reqwest::Client,
    flood_url: String,
    length: Duration,
) -> (std::collections::BTreeMap<u16, usize>, Duration) {
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / 60));
    let mut sent = Vec::new();
    let start = Instant::now();
    while start.elapsed() < length {
        tick.tick().await;
        let (client, url) = (flooder.clone(), flood_url.clone());
        let (_, m) = beacon_on("shop", "https://shop.example/p/flood");
        sent.push(tokio::spawn(async move {
            post_status(&client, &url, &m, &[]).await
        }));
    }
    let elapsed = start.elapsed();
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for s in sent {
        *statuses.entry(s.await.unwrap()).or_default() += 1;
    }
    (statuses, elapsed)
}

/// Visitors' beacons with the shop's `Origin` to `url` through `visitor` at 5/s for `length`:
/// the ids answered 202, the number sent, the slowest answer and the answers by status.
async fn visitors(
    visitor: &reqwest::Client,
    url: &str,
    length: Duration,
) -> (
    Vec<String>,
    usize,
    Duration,
    std::collections::BTreeMap<u16, usize>,
) {
    let origin = [("origin", "https://shop.example".to_owned())];
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let mut visits = Vec::new();
    let start = Instant::now();
    while start.elapsed() < length {
        tick.tick().await;
        let (client, url, headers) = (visitor.clone(), url.to_owned(), origin.clone());
        let (id, m) = beacon_on("shop", "https://shop.example/p/visit");
        visits.push(tokio::spawn(async move {
            let sent = Instant::now();
            let status = post_status(&client, &url, &m, &headers).await;
            (id, status, sent.elapsed())
        }));
    }
    let mut acked = Vec::new();
    let mut slowest = Duration::ZERO;
    let mut visitor_statuses = std::collections::BTreeMap::<u16, usize>::new();
    let sent = visits.len();
    for v in visits {
        let (id, status, took) = v.await.unwrap();
        *visitor_statuses.entry(status).or_default() += 1;
        slowest = slowest.max(took);
        if status == 202 {
            acked.push(id);
        }
    }
    (acked, sent, slowest, visitor_statuses)
}
