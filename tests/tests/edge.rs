//! At the edge: behind a real nginx under a path prefix, client addresses, slow clients,
//! idle connections, overload, drain and quiet logs.

use collector_tests::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const SETTLE: Duration = Duration::from_secs(30);

async fn post_via(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> (u16, reqwest::header::HeaderMap) {
    let mut req = client
        .post(url)
        .header("content-type", "text/plain")
        .body(body.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.headers().clone())
}

/// POSTs a new measurement for `site` to `url` through `client` with `headers`; the status.
async fn status_via(
    client: &reqwest::Client,
    url: &str,
    site: &str,
    headers: &[(&str, &str)],
) -> u16 {
    post_via(client, url, &measurement(site).1, headers).await.0
}

/// A collector for `env` that cannot reach ClickHouse (`http://127.0.0.1:1`: everything stays
/// in its spool of at most `spool_max_bytes`), with the setting `extra`; and its intake URL.
async fn spooling_only(
    env: &TestEnv<'_>,
    spool_max_bytes: &str,
    extra: (&str, &str),
) -> (Collector, String) {
    let c = env
        .collector(&[
            ("COLLECTOR_CLICKHOUSE_URLS", "http://127.0.0.1:1"),
            ("COLLECTOR_SPOOL_MAX_BYTES", spool_max_bytes),
            extra,
        ])
        .await;
    let url = format!("{}/api/v1/measurements", c.url);
    (c, url)
}

/// A client builder that keeps up to `max_idle` idle connections per host.
fn pooled(max_idle: usize) -> reqwest::ClientBuilder {
    reqwest::Client::builder().pool_max_idle_per_host(max_idle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_and_intake_work_through_nginx_under_a_prefix() {
    let env = TestEnv::new(Stack::shared()).await;
    env.add_site("shop", &["--origin", "https://shop.example"]);
    let c = env
        .collector(&[("COLLECTOR_TRUSTED_PROXIES", "127.0.0.1/32")])
        .await;
    let proxy = Nginx::start(c.port, "").await;

    let direct = http_get(format!("{}/script.js", c.url))
        .await
        .bytes()
        .await
        .unwrap();
    let r = http_get(format!("{}/perf/script.js", proxy.url)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["content-type"],
        "text/javascript; charset=utf-8"
    );
    assert_eq!(r.bytes().await.unwrap(), direct);

    // A beacon as the script sends it, with a shop's 16 KiB of cookies.
    let (id, m) = measurement("shop");
    let cookie = format!("session={}", "c".repeat(15 * 1024));
    let (status, headers) = post_via(
        &http(),
        &format!("{}/perf/api/v1/measurements", proxy.url),
        &m,
        &[("origin", "https://shop.example"), ("cookie", &cookie)],
    )
    .await;
    assert_eq!(status, 202);
    assert_eq!(
        headers["access-control-allow-origin"],
        "https://shop.example"
    );
    assert_eq!(headers["access-control-allow-credentials"], "true");

    // The preflight through the prefix, judged by the site's origins.
    let pre = |origin: &'static str| {
        http()
            .request(
                reqwest::Method::OPTIONS,
                format!("{}/perf/api/v1/measurements?site=shop", proxy.url),
            )
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .send()
    };
    let ok = pre("https://shop.example").await.unwrap();
    assert_eq!(ok.status(), 204);
    assert_eq!(
        ok.headers()["access-control-allow-origin"],
        "https://shop.example"
    );
    assert_eq!(pre("https://evil.example").await.unwrap().status(), 403);

    let rows = env.wait_rows(std::slice::from_ref(&id), SETTLE).await;
    assert_eq!(rows.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_address_depends_on_the_trusted_proxies() {
    let env = TestEnv::new(Stack::shared()).await;
    // One request per second per client, bursts of two: the third request of one client in
    // a row is 429, so which requests share a bucket shows which address the collector saw.
    let limited = [("COLLECTOR_CLIENT_RATE", "1")];
    let a = client_from("127.0.0.5");
    let b = client_from("127.0.0.6");

    // Behind a trusted nginx: two clients are told apart, whatever they claim.
    let mut trusted = limited.to_vec();
    trusted.push(("COLLECTOR_TRUSTED_PROXIES", "127.0.0.1/32"));
    let c = env.collector(&trusted).await;
    let proxy = Nginx::start(c.port, "").await;
    let intake = format!("{}/perf/api/v1/measurements", proxy.url);
    for n in 0..3 {
        // A client-supplied X-Forwarded-For from an untrusted client is not believed.
        let spoof = format!("198.51.100.{n}");
        let (status, headers) = post_via(
            &a,
            &intake,
            &measurement(&env.site).1,
            &[("x-forwarded-for", &spoof)],
        )
        .await;
        assert_eq!(
            status,
            if n < 2 { 202 } else { 429 },
            "request {n} of client a"
        );
        if status == 429 {
            assert!(headers.contains_key("retry-after"));
        }
    }
    assert_eq!(
        status_via(&b, &intake, &env.site, &[]).await,
        202,
        "client b has its own bucket"
    );
    drop((c, proxy));

    // Behind an nginx that is not trusted: every client is the proxy.
    let c = env.collector(&limited).await;
    let proxy = Nginx::start(c.port, "").await;
    let intake = format!("{}/perf/api/v1/measurements", proxy.url);
    assert_eq!(status_via(&a, &intake, &env.site, &[]).await, 202);
    assert_eq!(status_via(&a, &intake, &env.site, &[]).await, 202);
    assert_eq!(
        status_via(&b, &intake, &env.site, &[]).await,
        429,
        "b shares the proxy's bucket"
    );

    // Directly from an untrusted peer, forwarding headers are ignored.
    let direct = format!("{}/api/v1/measurements", c.url);
    let c_client = client_from("127.0.0.7");
    for n in 0..3 {
        let xff = format!("203.0.113.{n}");
        let status = status_via(&c_client, &direct, &env.site, &[("x-forwarded-for", &xff)]).await;
        assert_eq!(status, if n < 2 { 202 } else { 429 });
    }
    assert!(c.metric("collector_http_rate_limited_total").await >= 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_intake_and_client_address_work_through_caddy_under_a_prefix() {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env
        .collector(&[
            ("COLLECTOR_TRUSTED_PROXIES", "127.0.0.1/32"),
            ("COLLECTOR_CLIENT_RATE", "1"),
        ])
        .await;
    let proxy = Caddy::start(c.port).await;
    let r = http_get(format!("{}/perf/script.js", proxy.url)).await;
    assert_eq!(r.status(), 200);
    assert!(String::from_utf8_lossy(&r.bytes().await.unwrap()).contains("sendBeacon"));

    let intake = format!("{}/perf/api/v1/measurements", proxy.url);
    let (a, b) = (client_from("127.0.0.5"), client_from("127.0.0.6"));
    let (id, m) = measurement(&env.site);
    assert_eq!(
        post_via(&a, &intake, &m, &[("x-forwarded-for", "198.51.100.1")])
            .await
            .0,
        202
    );
    assert_eq!(
        status_via(
            &a,
            &intake,
            &env.site,
            &[("x-forwarded-for", "198.51.100.2")]
        )
        .await,
        202
    );
    assert_eq!(
        status_via(&a, &intake, &env.site, &[]).await,
        429,
        "client a is 127.0.0.5 whatever it claims"
    );
    assert_eq!(
        status_via(&b, &intake, &env.site, &[]).await,
        202,
        "client b is told apart"
    );
    assert_eq!(env.wait_rows(&[id], SETTLE).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_forwarding_form_is_read_or_ignored_without_error() {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env
        .collector(&[("COLLECTOR_TRUSTED_PROXIES", "127.0.0.0/8")])
        .await;
    let forms: [(&str, &str); 12] = [
        ("x-forwarded-for", "192.0.2.1"),
        ("x-forwarded-for", "192.0.2.1:8080"),
        ("x-forwarded-for", "[2001:db8::1]:443"),
        ("x-forwarded-for", "2001:db8::1"),
        ("x-forwarded-for", "::ffff:192.0.2.1"),
        ("x-forwarded-for", "unknown"),
        ("x-forwarded-for", ""),
        ("x-forwarded-for", ",,, ,"),
        ("forwarded", "for=\"[2001:db8:cafe::17]:4711\";proto=https"),
        ("forwarded", "for=unknown, for=_hidden"),
        ("forwarded", "for=\"\""),
        ("forwarded", "garbage;;=;for"),
    ];
    for (name, value) in forms {
        let (status, body, _) = c
            .post(measurement(&env.site).1.to_string(), &[(name, value)])
            .await;
        assert_eq!(status, 202, "{name}: {value}: {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_is_cut_off_while_others_are_served() {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env
        .collector(&[
            ("COLLECTOR_HEADER_TIMEOUT", "2s"),
            ("COLLECTOR_BODY_TIMEOUT", "2s"),
        ])
        .await;
    let port = c.port;

    // Slowloris: headers one byte every 300 ms, never finished.
    let slow_headers = std::thread::spawn(move || slow_headers(port));
    // A slow body: complete headers, then a byte a second.
    let slow_body = std::thread::spawn(move || slow_body(port));

    // Meanwhile, others are served promptly.
    for _ in 0..20 {
        let start = Instant::now();
        let (status, _) = c.post_json(&measurement(&env.site).1).await;
        assert_eq!(status, 202);
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "a beacon took {:?} while slow clients held connections (one spool sync, \
             milliseconds; 1 s allows for a loaded machine)",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cut_after = slow_headers.join().unwrap();
    assert!(
        cut_after < Duration::from_secs(5),
        "slow headers cut off after {cut_after:?}: the header timeout is 2 s, seen by the \
         client within two of its 300 ms writes; 5 s allows 2.4 s more for a loaded machine"
    );
    let (cut_after, response) = slow_body.join().unwrap();
    assert!(
        cut_after < Duration::from_secs(5),
        "slow body cut off after {cut_after:?}: the body timeout is 2 s, seen by the client \
         within two of its 1 s writes; 5 s allows 1 s more for a loaded machine"
    );
    assert!(
        response.starts_with("HTTP/1.1 400") || response.is_empty(),
        "{response}"
    );
}

/// Slowloris against the collector on `port`: headers one byte every 300 ms, never finished
/// (given up after 8 s); how long until the collector cut the connection.
fn slow_headers(port: u16) -> Duration {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let start = Instant::now();
    for b in b"POST /api/v1/measurements HTTP/1.1\r\nHost: x\r\nX-Slow: "
        .iter()
        .chain([b'a'; 200].iter())
    {
        if s.write_all(&[*b]).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
        if start.elapsed() > Duration::from_secs(8) {
            break;
        }
    }
    let mut buf = [0u8; 256];
    let _ = s.read(&mut buf);
    start.elapsed()
}

/// A slow body to the collector on `port`: complete headers, then a byte a second (8 at most);
/// how long until the collector cut it, and its answer.
fn slow_body(port: u16) -> (Duration, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"POST /api/v1/measurements HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{")
        .unwrap();
    let start = Instant::now();
    let mut response = Vec::new();
    for _ in 0..8 {
        std::thread::sleep(Duration::from_secs(1));
        if s.write_all(b" ").is_err() {
            break;
        }
    }
    let _ = s.read_to_end(&mut response);
    (
        start.elapsed(),
        String::from_utf8_lossy(&response).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_up_to_16_kib_pass_and_larger_get_431() {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env.collector(&[]).await;
    let m = measurement(&env.site).1.to_string();
    let just_under = "c".repeat(16 * 1024 - 200);
    let (status, _, _) = c.post(m.clone(), &[("cookie", &just_under)]).await;
    assert_eq!(status, 202);
    let over = "c".repeat(17 * 1024);
    let (status, _, _) = c.post(m.clone(), &[("cookie", &over)]).await;
    assert_eq!(status, 431);
    let way_over = "c".repeat(64 * 1024);
    let (status, _, _) = c.post(m, &[("cookie", &way_over)]).await;
    assert_eq!(status, 431);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_idle_connections_cost_bounded_memory() {
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let env = TestEnv::new(Stack::shared()).await;
    let c = env.collector(&[("COLLECTOR_HEADER_TIMEOUT", "120s")]).await;
    // Warm up the allocator and every pool with some real requests first.
    for _ in 0..50 {
        assert_eq!(c.post_json(&measurement(&env.site).1).await.0, 202);
    }
    let before = rss_bytes(c.pid());
    let port = c.port;
    // 10,000 keep-alive connections, each after one served request, then idle.
    let conns = tokio::task::spawn_blocking(move || {
        let mut conns = Vec::with_capacity(10_000);
        for _ in 0..10_000 {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            conns.push(s);
        }
        for s in &mut conns {
            let mut buf = [0u8; 128];
            let n = s.read(&mut buf).unwrap();
            assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        }
        conns
    })
    .await
    .unwrap();
    let open = c.metric("collector_http_open_connections").await;
    assert!(open >= 10_000.0, "open connections: {open}");
    let after = rss_bytes(c.pid());
    let growth = after.saturating_sub(before);
    println!(
        "RSS before {} MiB, with 10,000 idle connections {} MiB: growth {} MiB",
        before >> 20,
        after >> 20,
        growth >> 20
    );
    // The goal (docs/edge.md, "Limits"): at most 64 MiB for 10,000 idle connections. Measured
    // at once, so the connections answered in the last 0.1 s still hold their hyper buffers
    // (server/connection.rs parks a connection 0.1 s after its answer); it was 118 MiB when every
    // connection kept them (issue 39).
    assert!(growth <= 64 << 20, "RSS grew by {} MiB", growth >> 20);
    // The collector still serves.
    assert_eq!(c.post_json(&measurement(&env.site).1).await.0, 202);
    drop(conns);
}

/// 200 requests at a time for 8 s against one place in flight, a small spool and no
/// ClickHouse: every answer is 202, 429 or a 503 with `Retry-After`, some are shed, and the
/// memory stays bounded. A request holds its place only while it is worked on, up to its
/// rows joining the spool's open group (not while it waits for the sync, issue 53), so the
/// bound is reached by requests worked on at once: four runtime threads on the two cores
/// (`TOKIO_WORKER_THREADS`), one place. With 4 places and 2 threads no request was shed
/// once the wait held no place (fresh-clone run of 8c5cbf7: 2,016 answered 202, 16,984 429);
/// so, about 25,400 of 34,400 were shed in each of two runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_gets_only_202_429_or_503_with_retry_after_and_bounded_memory() {
    let env = TestEnv::new(Stack::shared()).await;
    // ClickHouse unreachable, a small spool and one request worked on at once.
    let c = env
        .collector(&[
            ("COLLECTOR_CLICKHOUSE_URLS", "http://127.0.0.1:1"),
            ("COLLECTOR_SPOOL_MAX_BYTES", "2000000"),
            ("COLLECTOR_MAX_IN_FLIGHT", "1"),
            ("TOKIO_WORKER_THREADS", "4"),
        ])
        .await;
    let url = format!("{}/api/v1/measurements", c.url);
    let client = pooled(256)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let mut missing_retry_after = 0;
    let mut slowest_accepted = Duration::ZERO;
    let start = Instant::now();
    let mut peak_rss = 0;
    while start.elapsed() < Duration::from_secs(8) {
        let batch = (0..200).map(|_| {
            let body = measurement(&env.site).1.to_string();
            let req = client.post(&url).body(body);
            async move {
                let t = Instant::now();
                let r = req.send().await.unwrap();
                (
                    r.status().as_u16(),
                    r.headers().contains_key("retry-after"),
                    t.elapsed(),
                )
            }
        });
        for (status, retry_after, took) in futures::future::join_all(batch).await {
            *statuses.entry(status).or_default() += 1;
            if status == 503 && !retry_after {
                missing_retry_after += 1;
            }
            if status == 202 {
                slowest_accepted = slowest_accepted.max(took);
            }
        }
        peak_rss = peak_rss.max(rss_bytes(c.pid()));
    }
    let unexpected: Vec<_> = statuses
        .keys()
        .filter(|s| ![202, 429, 503].contains(*s))
        .collect();
    assert!(unexpected.is_empty(), "{statuses:?}");
    assert!(
        statuses.get(&503).copied().unwrap_or(0) > 0,
        "overload was reached: {statuses:?}"
    );
    assert_eq!(missing_retry_after, 0);
    assert!(peak_rss < 300 << 20, "peak RSS {} MiB", peak_rss >> 20);
    println!(
        "statuses {statuses:?}, slowest 202 {slowest_accepted:?}, peak RSS {} MiB",
        peak_rss >> 20
    );
    assert!(c.metric("collector_http_shed_total").await > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_turns_readyz_first_then_drains_and_loses_nothing() {
    let env = TestEnv::new(Stack::shared()).await;
    let mut c = env
        .collector(&[
            ("COLLECTOR_DRAIN_GRACE", "2s"),
            ("COLLECTOR_BATCH_MAX_AGE", "3s"),
        ])
        .await;
    let traffic = Traffic::start(&c, &env.site, Duration::from_millis(10));
    traffic.wait_acked(100, SETTLE).await;
    assert_eq!(c.status_of("/readyz").await, 200);

    let signalled = Instant::now();
    c.signal("TERM");
    // /readyz turns 503 at once, while the listener still answers.
    let mut saw_503_at = None;
    while signalled.elapsed() < Duration::from_secs(2) {
        match c.status_of("/readyz").await {
            503 => {
                saw_503_at = Some(signalled.elapsed());
                break;
            }
            200 => tokio::time::sleep(Duration::from_millis(10)).await,
            other => panic!("readyz answered {other} during the grace"),
        }
    }
    let saw_503_at = saw_503_at.expect("readyz never answered 503 while the listener was open");
    assert!(
        saw_503_at < Duration::from_millis(500),
        "/readyz answered 503 only {saw_503_at:?} after SIGTERM: at once is expected (polled \
         every 10 ms; 500 ms allows for signal delivery and a loaded machine)"
    );
    let status = c
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("exits after draining");
    assert_eq!(status.code(), Some(0));
    assert!(
        signalled.elapsed() >= Duration::from_secs(2),
        "exited {:?} after SIGTERM: the listener must stay open for the whole 2 s grace \
         (no tolerance: the grace is the least time)",
        signalled.elapsed()
    );
    let report = traffic.stop().await;
    let bad: Vec<_> = report
        .statuses
        .iter()
        .filter(|(s, _)| ![0, 202].contains(*s))
        .collect();
    assert!(bad.is_empty(), "{:?}", report.statuses);

    c.restart().await;
    env.assert_stored_once(&report.acked, SETTLE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warning_repeated_ten_thousand_times_is_logged_about_once_a_second() {
    let env = TestEnv::new(Stack::shared()).await;
    // Every intake request is refused by a full spool: each would log a warning. The spool
    // (its smallest bound, 1 MiB) is filled first while ClickHouse is unreachable.
    let (c, url) = spooling_only(&env, "1048576", ("COLLECTOR_SITE_RATE", "0")).await;
    let client = pooled(64).build().unwrap();
    let filling = Instant::now();
    'fill: loop {
        let batch = (0..100).map(|_| {
            client
                .post(&url)
                .body(measurement(&env.site).1.to_string())
                .send()
        });
        for r in futures::future::join_all(batch).await {
            if r.unwrap().status() == 503 {
                break 'fill;
            }
        }
        if filling.elapsed() >= Duration::from_secs(60) {
            c.diag.give_up("the spool never filled").await;
        }
    }
    let body = measurement(&env.site).1.to_string();
    let start = Instant::now();
    let mut sent = 0;
    while sent < 10_000 {
        let batch = (0..100).map(|_| client.post(&url).body(body.clone()).send());
        for r in futures::future::join_all(batch).await {
            assert_eq!(r.unwrap().status(), 503);
        }
        sent += 100;
    }
    let elapsed = start.elapsed();
    let lines = c
        .logs()
        .lines()
        .filter(|l| l.contains("intake answered 503"))
        .count();
    // One line a second at most (`warn_limited`), in every second the run touched (its
    // whole seconds plus one partial at each end), and one more for the filling phase.
    let allowed = elapsed.as_secs() as usize + 3;
    assert!(
        lines >= 1 && lines <= allowed,
        "{lines} lines for 10,000 warnings in {elapsed:?}; allowed 1 to {allowed}: one a \
         second over the whole seconds, plus the two partial seconds at the ends and the \
         filling phase's line"
    );
    assert!(c.metric("collector_log_suppressed_total").await >= 9_000.0);
}

/// Connections that announce a body and send it slowly hold a connection each (bounded by
/// `COLLECTOR_MAX_CONNECTIONS` and the body timeout), never one of the
/// `COLLECTOR_MAX_IN_FLIGHT` slots: beacons sent meanwhile are accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_senders_do_not_take_the_in_flight_slots() {
    use tokio::io::AsyncWriteExt;
    let env = TestEnv::new(Stack::shared()).await;
    let c = env.collector(&[("COLLECTOR_MAX_IN_FLIGHT", "4")]).await;
    let mut slow = Vec::new();
    for _ in 0..20 {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", c.port))
            .await
            .unwrap();
        s.write_all(
            b"POST /api/v1/measurements HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 1000\r\n\r\n{",
        )
        .await
        .unwrap();
        slow.push(s);
    }
    // Give the server time to read every head and start waiting for the bodies.
    let start = Instant::now();
    while c.metric("collector_http_open_connections").await < 20.0 {
        if start.elapsed() >= Duration::from_secs(10) {
            c.diag
                .give_up("the slow connections were not accepted")
                .await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut ids = Vec::new();
    for _ in 0..10 {
        let (id, m) = measurement(&env.site);
        let (status, body) = c.post_json(&m).await;
        assert_eq!(status, 202, "{body}");
        ids.push(id);
    }
    env.wait_rows(&ids, Duration::from_secs(60)).await;
    assert_eq!(c.metric("collector_http_shed_total").await, 0.0);
    drop(slow);
}
