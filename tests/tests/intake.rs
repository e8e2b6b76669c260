//! The whole path, beacon to ClickHouse, against real PostgreSQL and replicated ClickHouse.

mod common;

use std::io::Write;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const VISIBLE: Duration = Duration::from_secs(20);

/// A request case: name, body, headers, and the expected status or count.
type Case<'a> = (&'a str, Vec<u8>, Vec<(&'a str, &'a str)>, u16);

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

fn row<'a>(rows: &'a [Value], id: &str) -> &'a Value {
    let matching: Vec<&Value> = rows.iter().filter(|r| r["id"] == id).collect();
    assert_eq!(matching.len(), 1, "exactly one row for {id} in {rows:?}");
    matching[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_body_form_lands_with_the_values_sent() {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env.collector(&[]).await;
    let sent_at = now_ms() / 1000;
    let mut ids = Vec::new();
    let mut bodies: Vec<Case> = Vec::new();

    let next = |ids: &mut Vec<String>| {
        let (id, m) = measurement(&env.site);
        ids.push(id);
        m
    };
    let one = next(&mut ids);
    bodies.push((
        "object",
        one.to_string().into_bytes(),
        vec![("content-type", "application/json")],
        1,
    ));
    let (a, b) = (next(&mut ids), next(&mut ids));
    bodies.push((
        "array",
        json!([a, b]).to_string().into_bytes(),
        vec![("content-type", "application/json; charset=utf-8")],
        2,
    ));
    let plain = next(&mut ids);
    bodies.push((
        "text/plain",
        plain.to_string().into_bytes(),
        vec![("content-type", "text/plain;charset=UTF-8")],
        1,
    ));
    let bare = next(&mut ids);
    bodies.push(("no content type", bare.to_string().into_bytes(), vec![], 1));
    let gz = next(&mut ids);
    bodies.push((
        "gzip",
        gzip(gz.to_string().as_bytes()),
        vec![("content-encoding", "gzip")],
        1,
    ));
    let bom = next(&mut ids);
    let mut with_bom = b"\xEF\xBB\xBF".to_vec();
    with_bom.extend_from_slice(bom.to_string().as_bytes());
    bodies.push((
        "BOM",
        with_bom,
        vec![("content-type", "application/json")],
        1,
    ));

    for (name, body, headers, n) in bodies {
        let mut h = headers.clone();
        h.push(("user-agent", "TestBrowser/1.0"));
        let (status, answer, _) = c.post(body, &h).await;
        assert_eq!(status, 202, "{name}: {answer}");
        assert_eq!(answer["accepted"], n, "{name}: {answer}");
        assert_eq!(answer["duplicates"], 0, "{name}");
        assert_eq!(answer["rejected"], json!([]), "{name}");
    }

    let rows = env.wait_rows(&ids, VISIBLE).await;
    assert_eq!(rows.len(), ids.len(), "{rows:?}");
    for id in &ids {
        let r = row(&rows, id);
        assert_eq!(r["site"], env.site);
        assert_eq!(r["url"], "https://shop.example/product/1?color=red");
        assert_eq!(r["ttfb_ms"], 120.5);
        assert_eq!(r["fcp_ms"], 800.0);
        assert_eq!(r["lcp_ms"], 1500.25);
        assert_eq!(r["cls"], 0.05);
        assert_eq!(r["inp_ms"], 64.0);
        assert_eq!(r["dom_content_loaded_ms"], 900.0);
        assert_eq!(r["load_ms"], 1800.0);
        assert_eq!(r["viewport_width"], 1280);
        assert_eq!(r["navigation_type"], "navigate");
        assert_eq!(r["effective_connection_type"], "4g");
        assert_eq!(r["referrer"], "https://search.example/?q=shoes");
        assert_eq!(r["user_agent"], "TestBrowser/1.0");
        assert_eq!(r["ts"], Value::Null);
        let received = r["received_at"].as_i64().unwrap();
        assert!(
            (received - sent_at).abs() <= 1,
            "received_at {received} vs sent {sent_at}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urls_are_stored_normalised_and_ts_kept() {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env.collector(&[]).await;
    let (id1, mut m1) = measurement(&env.site);
    m1["url"] = json!("HTTPS://user:secret@Shop.Example:443/Produkt/Grün?x=1#reviews");
    let ts = now_ms() - 1500;
    m1["ts"] = json!(ts);
    let (id2, mut m2) = measurement(&env.site);
    m2["url"] = json!("https://shop.example/Produkt/Gr%C3%BCn?x=1");
    let (s, a) = c.post_json(&json!([m1, m2])).await;
    assert_eq!((s, a["accepted"].clone()), (202, json!(2)), "{a}");
    let rows = env.wait_rows(&[id1.clone(), id2.clone()], VISIBLE).await;
    assert_eq!(
        row(&rows, &id1)["url"],
        "https://shop.example/Produkt/Gr%C3%BCn?x=1"
    );
    assert_eq!(row(&rows, &id2)["url"], row(&rows, &id1)["url"]);
    assert_eq!(as_i64(&row(&rows, &id1)["ts"]), Some(ts));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_id_is_stored_once_and_answered_as_duplicate() {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env.collector(&[]).await;

    let (id, m) = measurement(&env.site);
    let (s1, a1) = c.post_json(&m).await;
    let (s2, a2) = c.post_json(&m).await;
    assert_eq!(
        (s1, a1["accepted"].clone(), a1["duplicates"].clone()),
        (202, json!(1), json!(0))
    );
    assert_eq!(
        (s2, a2["accepted"].clone(), a2["duplicates"].clone()),
        (202, json!(0), json!(1))
    );

    // In parallel: exactly one of the answers counts it accepted, the other as duplicate.
    let (pid, pm) = measurement(&env.site);
    let (r1, r2) = tokio::join!(c.post_json(&pm), c.post_json(&pm));
    assert_eq!((r1.0, r2.0), (202, 202));
    let accepted = r1.1["accepted"].as_u64().unwrap() + r2.1["accepted"].as_u64().unwrap();
    let dups = r1.1["duplicates"].as_u64().unwrap() + r2.1["duplicates"].as_u64().unwrap();
    assert_eq!((accepted, dups), (1, 1), "{} {}", r1.1, r2.1);

    // The same id twice in one array.
    let (aid, am) = measurement(&env.site);
    let (s, a) = c.post_json(&json!([am, am])).await;
    assert_eq!(
        (s, a["accepted"].clone(), a["duplicates"].clone()),
        (202, json!(1), json!(1))
    );

    // After a restart the dedup window is empty: storage folds the retry.
    let mut c = c;
    env.wait_rows(&[id.clone(), pid.clone(), aid.clone()], VISIBLE)
        .await;
    c.restart().await;
    let (s3, a3) = c.post_json(&m).await;
    assert_eq!(
        (s3, a3["accepted"].clone()),
        (202, json!(1)),
        "a fresh window stores it again"
    );
    let (marker, mm) = measurement(&env.site);
    c.post_json(&mm).await;
    env.wait_rows(&[marker], VISIBLE).await;

    for id in [&id, &pid, &aid] {
        let n = env
            .query(
                0,
                &format!(
                    "SELECT count() AS n FROM {}.measurements FINAL WHERE id = '{id}'",
                    env.db
                ),
            )
            .await;
        let all = env
            .query(
                0,
                &format!(
                    "SELECT toString(id) AS id, _part FROM {}.measurements WHERE id = '{id}'",
                    env.db
                ),
            )
            .await;
        assert_eq!(
            as_i64(&n[0]["n"]),
            Some(1),
            "{id}: {n:?}; without FINAL: {all:?}"
        );
    }
    assert_eq!(
        c.metric("collector_measurements_duplicate_total").await,
        0.0,
        "counter restarts with the process"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_their_status_and_store_nothing() {
    let env = TestEnv::new(Stack::shared()).await;
    env.cli(&[
        "sites",
        "add",
        "--key",
        "strict",
        "--origin",
        "https://shop.example",
    ])
    .success();
    env.cli(&["sites", "add", "--key", "off", "--disabled"])
        .success();
    let c = env.collector(&[]).await;
    let mut bad_ids = Vec::new();
    let mut fresh = |site: &str| {
        let (id, m) = measurement(site);
        bad_ids.push(id);
        m
    };

    let valid = fresh(&env.site).to_string();
    let big = json!([fresh(&env.site), {"padding": "x".repeat(70 * 1024)}]).to_string();
    let bomb = gzip(&[b' '; 10 * 1024 * 1024]);
    let truncated = {
        let g = gzip(fresh(&env.site).to_string().as_bytes());
        g[..g.len() - 8].to_vec()
    };
    let unknown = fresh("no-such-site").to_string();
    let disabled = fresh("off").to_string();
    let strict = fresh("strict").to_string();
    let cases: Vec<Case> = vec![
        ("malformed JSON", b"{\"id\": ".to_vec(), vec![], 400),
        ("empty body", Vec::new(), vec![], 400),
        (
            "trailing garbage",
            format!("{valid} garbage").into_bytes(),
            vec![],
            400,
        ),
        (
            "two values",
            format!("{valid}{valid}").into_bytes(),
            vec![],
            400,
        ),
        ("over 64 KiB", big.into_bytes(), vec![], 413),
        ("gzip bomb", bomb, vec![("content-encoding", "gzip")], 413),
        (
            "truncated gzip",
            truncated,
            vec![("content-encoding", "gzip")],
            400,
        ),
        ("unknown site", unknown.into_bytes(), vec![], 403),
        ("disabled site", disabled.into_bytes(), vec![], 403),
        (
            "origin not allowed",
            strict.clone().into_bytes(),
            vec![("origin", "https://evil.example")],
            403,
        ),
        (
            "form content type",
            valid.clone().into_bytes(),
            vec![("content-type", "application/x-www-form-urlencoded")],
            415,
        ),
        (
            "brotli body",
            valid.clone().into_bytes(),
            vec![("content-encoding", "br")],
            415,
        ),
        (
            "51 measurements",
            json!(vec![json!({}); 51]).to_string().into_bytes(),
            vec![],
            400,
        ),
        (
            "nothing valid",
            json!([{"id": "x"}]).to_string().into_bytes(),
            vec![],
            400,
        ),
    ];
    for (name, body, headers, want) in cases {
        let (status, answer, resp_headers) = c.post(body, &headers).await;
        assert_eq!(status, want, "{name}: {answer}");
        if want != 413 && want != 415 {
            assert!(
                answer["error"].is_string(),
                "{name}: JSON error body, got {answer}"
            );
        }
        assert!(resp_headers.get("retry-after").is_none(), "{name}");
    }

    // The allowed origin and no origin both pass for the strict site.
    let (s, _, h) = c
        .post(strict.clone(), &[("origin", "https://shop.example")])
        .await;
    assert_eq!(s, 202);
    assert_eq!(h["access-control-allow-origin"], "https://shop.example");
    let (_, strict_again) = measurement("strict");
    let (s, _, _) = c.post(strict_again.to_string(), &[]).await;
    assert_eq!(s, 202);

    // Nothing of the refused requests was stored: once a later marker is visible, the
    // writer (which keeps spool order) has passed everything before it.
    let strict_id = serde_json::from_str::<Value>(&strict).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (marker, m) = measurement(&env.site);
    assert_eq!(c.post_json(&m).await.0, 202);
    env.wait_rows(std::slice::from_ref(&marker), VISIBLE).await;
    let stored: Vec<String> = env
        .rows(&bad_ids)
        .await
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        stored,
        vec![strict_id],
        "only the strict-site measurement sent with an allowed origin is stored"
    );
    assert!(
        c.metric("collector_measurements_rejected_total{reason=\"unknown or disabled site\"}")
            .await
            >= 2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_optional_fields_are_dropped_and_listed() {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env.collector(&[]).await;
    let mut ids = Vec::new();
    let mut bodies = Vec::new();
    for lcp in ["NaN", "-5", "1764000000000", "\"fast\""] {
        let (id, m) = measurement(&env.site);
        ids.push(id);
        // Spliced as raw text: Python's json module, for one, writes a bare NaN.
        let text = m
            .to_string()
            .replacen("\"lcp_ms\":1500.25", &format!("\"lcp_ms\":{lcp}"), 1);
        assert!(text.contains(lcp));
        bodies.push(text);
    }
    let (skew_id, mut skewed) = measurement(&env.site);
    skewed["ts"] = json!(now_ms() / 1000);
    bodies.push(skewed.to_string());
    let array = format!("[{}]", bodies.join(","));
    let (status, answer, _) = c.post(array, &[("content-type", "text/plain")]).await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["accepted"], 5);
    let dropped = answer["dropped_fields"].as_array().unwrap();
    assert_eq!(dropped.len(), 4, "{answer}");
    for (i, d) in dropped.iter().enumerate() {
        assert_eq!(d, &json!({"index": i, "field": "lcp_ms"}));
    }

    ids.push(skew_id.clone());
    let rows = env.wait_rows(&ids, VISIBLE).await;
    for id in &ids[..4] {
        let r = row(&rows, id);
        assert_eq!(r["lcp_ms"], Value::Null, "{r}");
        assert_eq!(
            r["fcp_ms"], 800.0,
            "the other metrics of the page view are kept"
        );
    }
    assert_eq!(row(&rows, &skew_id)["ts"], Value::Null);
    assert_eq!(row(&rows, &skew_id)["lcp_ms"], 1500.25);
    assert_eq!(
        c.metric("collector_measurements_clock_skew_total").await,
        1.0
    );
    assert_eq!(
        c.metric("collector_measurements_field_dropped_total{field=\"lcp_ms\"}")
            .await,
        4.0
    );
    assert_eq!(c.metric("collector_measurements_accepted_total").await, 5.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_and_operations_endpoints() {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env.collector(&[]).await;
    let r = http()
        .get(format!("{}/script.js", c.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["content-type"],
        "text/javascript; charset=utf-8"
    );
    assert_eq!(r.headers()["cache-control"], "public, max-age=3600");
    let etag = r.headers()["etag"].to_str().unwrap().to_owned();
    assert!(
        etag.starts_with('"') && etag.ends_with('"'),
        "strong etag {etag}"
    );
    let plain = r.bytes().await.unwrap();
    assert!(std::str::from_utf8(&plain).unwrap().contains("sendBeacon"));

    let r = http()
        .get(format!("{}/script.js", c.url))
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 304);
    let r = http()
        .get(format!("{}/script.js", c.url))
        .header("accept-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["content-encoding"], "gzip");
    let gz = r.bytes().await.unwrap();
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut out).unwrap();
    assert_eq!(out, plain);
    let r = http()
        .get(format!("{}/script.js", c.url))
        .header("accept-encoding", "gzip, br")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["content-encoding"], "br");

    // The container health check needs no shell tools: `collector probe` asks /readyz.
    let probe = |listen: String| {
        std::process::Command::new(collector_bin())
            .arg("probe")
            .env("COLLECTOR_LISTEN", listen)
            .output()
            .unwrap()
    };
    assert_eq!(
        probe(format!("127.0.0.1:{}", c.port)).status.code(),
        Some(0)
    );
    assert_eq!(
        probe(format!("0.0.0.0:{}", c.port)).status.code(),
        Some(0),
        "an unspecified address is probed on loopback"
    );
    let nobody = probe(format!("127.0.0.1:{}", free_port()));
    assert_eq!(nobody.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&nobody.stderr)
            .trim()
            .lines()
            .count(),
        1
    );

    assert_eq!(
        http()
            .get(format!("{}/healthz", c.url))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        http()
            .get(format!("{}/readyz", c.url))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let metrics = http()
        .get(format!("{}/metrics", c.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in [
        "collector_measurements_accepted_total",
        "collector_measurements_duplicate_total",
        "collector_spool_bytes",
        "collector_spool_records",
        "collector_settings_store_up 1",
        "collector_settings_stale_served_total",
    ] {
        assert!(metrics.contains(name), "{name} missing from\n{metrics}");
    }
    for url in env.stack.clickhouse_urls() {
        assert!(
            metrics.contains(&format!(
                "collector_clickhouse_replica_state{{replica=\"{url}\"}} 2"
            )),
            "{metrics}"
        );
    }
    let first = &env.stack.clickhouse_urls()[0];
    assert!(
        metrics.contains(&format!(
            "collector_clickhouse_active_replica{{replica=\"{first}\"}} 1"
        )),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_manages_sites_and_rejects_bad_settings() {
    let env = TestEnv::new(Stack::shared()).await;
    env.cli(&[
        "sites",
        "add",
        "--key",
        "shop.b",
        "--origin",
        "HTTPS://Shop.B.Example/",
        "--sample-rate",
        "0.5",
    ])
    .success();
    let list = env.cli(&["sites", "list"]);
    assert!(
        list.stdout
            .contains("shop.b\tenabled\tsample_rate=0.5\torigins=https://shop.b.example"),
        "{}",
        list.stdout
    );
    env.cli(&["sites", "disable", "shop.b"]).success();
    assert!(env
        .cli(&["sites", "list"])
        .stdout
        .contains("shop.b\tdisabled"));
    env.cli(&["sites", "enable", "shop.b"]).success();
    assert_eq!(env.cli(&["sites", "disable", "missing"]).code, 1);
    assert_eq!(env.cli(&["sites", "add", "--key", "bad key"]).code, 2);
    // Migrate is idempotent.
    env.cli(&["migrate"]).success();

    let out = std::process::Command::new(collector_bin())
        .arg("serve")
        .env("COLLECTOR_SETTINGS_TTL", "soon")
        .env("COLLECTOR_LISTEN", "not-an-address")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("COLLECTOR_SETTINGS_TTL") && err.contains("COLLECTOR_LISTEN"),
        "{err}"
    );
    let out = std::process::Command::new(collector_bin())
        .arg("--no-such-flag")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim().lines().count(),
        1
    );
}
