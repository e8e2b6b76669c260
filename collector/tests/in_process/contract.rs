//! The HTTP contract (contract §2) against the whole collector: every status of the intake,
//! what each stores, the error bodies, CORS, the script and the operations endpoints.

use std::io::Write;
use std::time::Duration;

use serde_json::json;

use crate::common::{beacon, get, post, request, site, wait_until, App, ClickHouse, Sites};

/// Waits until the server holds `n` rows, then checks that no more arrive for a moment
/// (the writer flushes every 50 ms here).
async fn exactly(ch: &ClickHouse, n: usize) {
    let what = format!("{n} rows in {}", ch.url());
    wait_until(&what, Duration::from_secs(10), || async {
        ch.rows().len() >= n
    })
    .await;
    // Not a wait for a condition: nothing more may arrive in four flush intervals.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        ch.rows().len(),
        n,
        "rows: {:?}",
        ch.rows().iter().map(|r| r.id).collect::<Vec<_>>()
    );
}

/// A refused request: its name, headers, body and status.
type Case = (
    &'static str,
    Vec<(&'static str, &'static str)>,
    Vec<u8>,
    u16,
);

const JSON: &[(&str, &str)] = &[("content-type", "application/json")];

#[tokio::test]
async fn accepted_duplicates_rejected_and_dropped_fields_are_reported_and_stored_once() {
    let ch = ClickHouse::start().await;
    let app = App::start(Sites::with(&["shop"]), &[&ch], &[]).await;
    let (id, first) = beacon("shop");
    let answer = app.send(&first).await;
    assert_eq!(answer.status, 202);
    assert_eq!(answer.json()["accepted"], 1);
    assert_eq!(answer.json()["duplicates"], 0);

    // A retry with the same id is acknowledged as a duplicate and stored once.
    let answer = app.send(&first).await;
    assert_eq!(answer.status, 202);
    assert_eq!(
        (
            answer.json()["accepted"].clone(),
            answer.json()["duplicates"].clone()
        ),
        (json!(0), json!(1))
    );

    // One valid, one without `url` (rejected), one with an invalid metric (dropped, kept).
    let (kept_id, mut kept) = beacon("shop");
    kept["lcp_ms"] = json!(-5);
    let (_, mut no_url) = beacon("shop");
    no_url.as_object_mut().unwrap().remove("url");
    let answer = app.send(&json!([kept, no_url])).await;
    assert_eq!(answer.status, 202, "{}", answer.text());
    let body = answer.json();
    assert_eq!(body["accepted"], 1);
    assert_eq!(body["rejected"][0]["index"], 1, "{body}");
    assert_eq!(
        body["dropped_fields"],
        json!([{"index": 0, "field": "lcp_ms"}]),
        "{body}"
    );

    exactly(&ch, 2).await;
    let rows = ch.rows();
    let stored = |id| {
        rows.iter()
            .find(|r| r.id == id)
            .unwrap_or_else(|| panic!("no row {id}"))
    };
    assert_eq!(stored(id).lcp_ms, Some(1500.25));
    assert_eq!(stored(kept_id).lcp_ms, None, "a dropped field is NULL");
    assert_eq!(stored(kept_id).fcp_ms, Some(800.0), "the rest is kept");
    assert_eq!(
        app.metric("collector_measurements_accepted_total").await,
        2.0
    );
    assert_eq!(
        app.metric("collector_measurements_duplicate_total").await,
        1.0
    );
    assert_eq!(
        app.metric("collector_measurements_field_dropped_total{field=\"lcp_ms\"}")
            .await,
        1.0
    );
    app.stop(false).await;
}

/// One id twice in one request counts once: `accepted` 2, `duplicates` 1, two rows, and
/// `collector_measurements_accepted_total` counts measurements, not requests.
#[tokio::test]
async fn an_id_repeated_within_one_request_is_a_duplicate() {
    let ch = ClickHouse::start().await;
    let app = App::start(Sites::with(&["shop"]), &[&ch], &[]).await;
    let (a, first) = beacon("shop");
    let (b, second) = beacon("shop");
    let answer = app.send(&json!([first, second, first])).await;
    assert_eq!(answer.status, 202, "{}", answer.text());
    let body = answer.json();
    assert_eq!(
        (body["accepted"].clone(), body["duplicates"].clone()),
        (json!(2), json!(1)),
        "{body}"
    );
    exactly(&ch, 2).await;
    let mut stored: Vec<_> = ch.rows().iter().map(|r| r.id).collect();
    let mut sent = vec![a, b];
    stored.sort();
    sent.sort();
    assert_eq!(stored, sent);
    assert_eq!(
        app.metric("collector_measurements_accepted_total").await,
        2.0
    );
    assert_eq!(
        app.metric("collector_measurements_duplicate_total").await,
        1.0
    );
    app.stop(false).await;
}

/// Requests the intake must refuse, each with its name, headers, body and status: bad JSON,
/// no valid measurement, too many, unknown or disabled site, origin not allowed, too large,
/// wrong type, charset or encoding.
fn refusals() -> Vec<Case> {
    let big = vec![b' '; 64 * 1024 + 1];
    vec![
        ("broken JSON", JSON.to_vec(), b"{\"id\":".to_vec(), 400),
        (
            "bytes after the value",
            JSON.to_vec(),
            format!("{} x", beacon("shop").1).into_bytes(),
            400,
        ),
        (
            "no valid measurement",
            JSON.to_vec(),
            json!([{"site": "shop"}]).to_string().into_bytes(),
            400,
        ),
        (
            "more than 50",
            JSON.to_vec(),
            json!(vec![beacon("shop").1; 51]).to_string().into_bytes(),
            400,
        ),
        (
            "unknown site",
            JSON.to_vec(),
            beacon("nowhere").1.to_string().into_bytes(),
            403,
        ),
        (
            "disabled site",
            JSON.to_vec(),
            beacon("closed").1.to_string().into_bytes(),
            403,
        ),
        (
            "origin not allowed",
            vec![
                ("content-type", "application/json"),
                ("origin", "https://evil.example"),
            ],
            beacon("strict").1.to_string().into_bytes(),
            403,
        ),
        ("body over 64 KiB", JSON.to_vec(), big, 413),
        (
            "image/png",
            vec![("content-type", "image/png")],
            beacon("shop").1.to_string().into_bytes(),
            415,
        ),
        (
            "a charset other than UTF-8",
            vec![("content-type", "application/json; charset=latin1")],
            beacon("shop").1.to_string().into_bytes(),
            415,
        ),
        (
            "br encoding",
            vec![
                ("content-type", "application/json"),
                ("content-encoding", "compress"),
            ],
            beacon("shop").1.to_string().into_bytes(),
            415,
        ),
    ]
}

#[tokio::test]
async fn each_refusal_has_its_status_a_json_error_and_stores_nothing() {
    let ch = ClickHouse::start().await;
    let sites = Sites::with(&["shop"]);
    sites.put(collector::settings::Site {
        enabled: false,
        ..site("closed")
    });
    sites.put(collector::settings::Site {
        allowed_origins: vec!["https://shop.example".into()],
        ..site("strict")
    });
    let app = App::start(sites, &[&ch], &[]).await;
    let addr = app.addr;
    let path = "/api/v1/measurements";
    let cases = refusals();
    for (name, headers, body, status) in cases {
        let answer = post(addr, path, &headers, body).await;
        assert_eq!(answer.status, status, "{name}: {}", answer.text());
        if status != 413 {
            let error = answer.json()["error"].clone();
            assert!(
                error.as_str().is_some_and(|e| !e.is_empty()),
                "{name}: {}",
                answer.text()
            );
        }
    }
    for (method, path, status) in [
        ("GET", "/nowhere", 404),
        ("PUT", "/api/v1/measurements", 405),
    ] {
        let answer = request(addr, method, path, &[], "").await;
        assert_eq!(answer.status, status, "{method} {path}");
        assert!(
            answer.json()["error"].is_string(),
            "{method} {path}: {}",
            answer.text()
        );
    }
    // Nothing of any of them was stored: a good beacon after them is the only row.
    let (id, good) = beacon("shop");
    assert_eq!(app.send(&good).await.status, 202);
    exactly(&ch, 1).await;
    assert_eq!(ch.rows()[0].id, id);
    app.stop(false).await;
}

#[tokio::test]
async fn sendbeacon_text_plain_gzip_and_repeated_slashes_are_accepted() {
    let ch = ClickHouse::start().await;
    let app = App::start(Sites::with(&["shop"]), &[&ch], &[]).await;
    let addr = app.addr;
    let (a, text) = beacon("shop");
    let answer = post(
        addr,
        "/api/v1/measurements",
        &[("content-type", "text/plain;charset=UTF-8")],
        text.to_string(),
    )
    .await;
    assert_eq!(answer.status, 202, "{}", answer.text());
    let (b, plain) = beacon("shop");
    let answer = post(addr, "//api/v1/measurements/", &[], plain.to_string()).await;
    assert_eq!(
        answer.status,
        202,
        "no content type, repeated and trailing slashes: {}",
        answer.text()
    );
    let (c, gz) = beacon("shop");
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(gz.to_string().as_bytes()).unwrap();
    let answer = post(
        addr,
        "/api/v1/measurements",
        &[
            ("content-type", "application/json"),
            ("content-encoding", "gzip"),
        ],
        encoder.finish().unwrap(),
    )
    .await;
    assert_eq!(answer.status, 202, "{}", answer.text());
    exactly(&ch, 3).await;
    let mut ids: Vec<_> = ch.rows().iter().map(|r| r.id).collect();
    let mut sent = vec![a, b, c];
    ids.sort();
    sent.sort();
    assert_eq!(ids, sent);
    app.stop(false).await;
}

#[tokio::test]
async fn preflights_echo_an_allowed_origin_with_credentials() {
    let ch = ClickHouse::start().await;
    let sites = Sites::with(&[]);
    sites.put(collector::settings::Site {
        allowed_origins: vec!["https://shop.example".into()],
        ..site("strict")
    });
    let app = App::start(sites, &[&ch], &[]).await;
    let preflight = |origin: &'static str| {
        let addr = app.addr;
        async move {
            request(
                addr,
                "OPTIONS",
                "/api/v1/measurements",
                &[
                    ("origin", origin),
                    ("access-control-request-method", "POST"),
                    ("access-control-request-headers", "content-type"),
                ],
                "",
            )
            .await
        }
    };
    let answer = preflight("https://shop.example").await;
    assert!(answer.status < 300, "{}", answer.status);
    assert_eq!(
        answer.header("access-control-allow-origin"),
        "https://shop.example"
    );
    assert_eq!(answer.header("access-control-allow-credentials"), "true");
    assert!(answer
        .header("vary")
        .to_ascii_lowercase()
        .contains("origin"));
    let allowed = answer
        .header("access-control-allow-headers")
        .to_ascii_lowercase();
    assert!(allowed.contains("content-type"), "{allowed}");
    // Contract v5 §2: without `?site=`, an origin no site lists gets no CORS answer; one
    // written otherwise (case, default port) is the listed origin.
    let unlisted = preflight("https://evil.example").await;
    assert_eq!(unlisted.status, 403, "{}", unlisted.text());
    assert!(unlisted
        .headers
        .get("access-control-allow-origin")
        .is_none());
    let spelled = preflight("HTTPS://Shop.Example:443").await;
    assert_eq!(spelled.status, 204, "{}", spelled.text());
    // An origin the site allows is accepted with its beacon; no `*` ever.
    let (_, body) = beacon("strict");
    let answer = post(
        app.addr,
        "/api/v1/measurements",
        &[
            ("content-type", "application/json"),
            ("origin", "https://shop.example"),
        ],
        body.to_string(),
    )
    .await;
    assert_eq!(answer.status, 202);
    assert_eq!(
        answer.header("access-control-allow-origin"),
        "https://shop.example"
    );
    app.stop(false).await;
}

#[tokio::test]
async fn headers_up_to_16_kib_pass_and_beyond_get_431() {
    let ch = ClickHouse::start().await;
    let app = App::start(Sites::with(&["shop"]), &[&ch], &[]).await;
    let cookie = "c=".to_string() + &"x".repeat(15 * 1024);
    let (_, body) = beacon("shop");
    let answer = post(
        app.addr,
        "/api/v1/measurements",
        &[("content-type", "application/json"), ("cookie", &cookie)],
        body.to_string(),
    )
    .await;
    assert_eq!(answer.status, 202, "a 15 KiB cookie passes");
    let cookie = "c=".to_string() + &"x".repeat(17 * 1024);
    let answer = post(
        app.addr,
        "/api/v1/measurements",
        &[("cookie", &cookie)],
        body.to_string(),
    )
    .await;
    assert_eq!(answer.status, 431);
    app.stop(false).await;
}

#[tokio::test]
async fn the_script_is_served_from_memory_with_revalidation() {
    let ch = ClickHouse::start().await;
    let app = App::start(Sites::with(&["shop"]), &[&ch], &[]).await;
    let answer = get(app.addr, "/script.js").await;
    assert_eq!(answer.status, 200);
    assert!(answer.header("content-type").contains("javascript"));
    assert!(answer.text().contains("sendBeacon"), "the tracking script");
    let etag = answer.header("etag");
    let again = request(
        app.addr,
        "GET",
        "/script.js",
        &[("if-none-match", &etag)],
        "",
    )
    .await;
    assert_eq!(again.status, 304);
    assert_eq!(get(app.addr, "/healthz").await.status, 200);
    assert_eq!(get(app.addr, "/readyz").await.status, 200);
    // Contract v4: /metrics is on the operations listener only.
    assert_eq!(get(app.addr, "/metrics").await.status, 404);
    assert_eq!(get(app.admin, "/metrics").await.status, 200);
    assert_eq!(get(app.admin, "/readyz").await.status, 200);
    assert_eq!(
        get(app.admin, "/script.js").await.status,
        404,
        "nothing public there"
    );
    app.stop(false).await;
}

/// Issue 39, two inputs the acceptance checks have tried since contract v2: a JSON `-NaN` in
/// one metric costs that field alone (as `NaN` does), and an `Origin` with the default port
/// written out is the site's own origin.
#[tokio::test]
async fn a_signed_nan_costs_its_field_and_a_default_port_is_the_same_origin() {
    let ch = ClickHouse::start().await;
    let sites = Sites::with(&[]);
    sites.put(collector::settings::Site {
        allowed_origins: vec!["https://shop.example".into()],
        ..site("strict")
    });
    let app = App::start(sites, &[&ch], &[]).await;
    let (id, body) = beacon("strict");
    let text = body.to_string();
    assert!(text.contains("\"lcp_ms\":1500.25"), "{text}");
    let text = text.replace("\"lcp_ms\":1500.25", "\"lcp_ms\":-NaN");
    let answer = post(
        app.addr,
        "/api/v1/measurements",
        &[
            ("content-type", "application/json"),
            ("origin", "https://shop.example:443"),
        ],
        text,
    )
    .await;
    assert_eq!(answer.status, 202, "{}", answer.text());
    assert_eq!(answer.json()["accepted"], 1, "{}", answer.text());
    assert_eq!(
        answer.json()["dropped_fields"],
        json!([{"index": 0, "field": "lcp_ms"}]),
        "{}",
        answer.text()
    );
    // Another port is another origin: refused, nothing stored.
    let (_, other) = beacon("strict");
    let answer = post(
        app.addr,
        "/api/v1/measurements",
        &[
            ("content-type", "application/json"),
            ("origin", "https://shop.example:8443"),
        ],
        other.to_string(),
    )
    .await;
    assert_eq!(answer.status, 403, "{}", answer.text());
    exactly(&ch, 1).await;
    let row = &ch.rows()[0];
    assert_eq!(row.id, id);
    assert_eq!(row.lcp_ms, None, "the -NaN field alone is dropped");
    assert_eq!((row.fcp_ms, row.ttfb_ms), (Some(800.0), Some(120.5)));
    app.stop(false).await;
}
