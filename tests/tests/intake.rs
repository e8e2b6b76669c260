//! The whole path, beacon to ClickHouse, against real PostgreSQL and replicated ClickHouse.

use collector_tests::common;

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
    let matching: Vec<&Value> = rows.iter().filter(|r| col(r, "id") == id).collect();
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
        assert_eq!(col(r, "site"), env.site.as_str());
        assert_eq!(
            col(r, "url"),
            "https://shop.example/product/1",
            "minimised: only utm_* kept"
        );
        assert_eq!(col(r, "ttfb_ms"), 120.5);
        assert_eq!(col(r, "fcp_ms"), 800.0);
        assert_eq!(col(r, "lcp_ms"), 1500.25);
        assert_eq!(col(r, "cls"), 0.05);
        assert_eq!(col(r, "inp_ms"), 64.0);
        assert_eq!(col(r, "dom_content_loaded_ms"), 900.0);
        assert_eq!(col(r, "load_ms"), 1800.0);
        assert_eq!(col(r, "viewport_width"), 1280);
        assert_eq!(col(r, "navigation_type"), "navigate");
        assert_eq!(col(r, "effective_connection_type"), "4g");
        assert_eq!(
            col(r, "referrer"),
            "https://search.example",
            "another site: its origin"
        );
        assert_eq!(col(r, "user_agent"), "TestBrowser/1.0");
        assert_eq!(col(r, "ts"), &Value::Null, "{r}");
        let received = col(r, "received_at").as_i64().unwrap();
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
    m1["url"] = json!("HTTPS://user:secret@Shop.Example:443/Produkt/Grün?utm_source=x#reviews");
    let ts = now_ms() - 1500;
    m1["ts"] = json!(ts);
    let (id2, mut m2) = measurement(&env.site);
    m2["url"] = json!("https://shop.example/Produkt/Gr%C3%BCn?utm_source=x");
    let (s, a) = c.post_json(&json!([m1, m2])).await;
    assert_eq!((s, a["accepted"].clone()), (202, json!(2)), "{a}");
    let rows = env.wait_rows(&[id1.clone(), id2.clone()], VISIBLE).await;
    assert_eq!(
        col(row(&rows, &id1), "url"),
        "https://shop.example/Produkt/Gr%C3%BCn?utm_source=x",
        "a kept parameter (utm_*) stays"
    );
    assert_eq!(col(row(&rows, &id2), "url"), col(row(&rows, &id1), "url"));
    assert_eq!(as_i64(col(row(&rows, &id1), "ts")), Some(ts));
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
        let n = env.count(&format!("FINAL WHERE id = '{id}'")).await;
        let all = env
            .measurements("toString(id) AS id, _part", &format!("WHERE id = '{id}'"))
            .await;
        assert_eq!(n, 1, "{id}: {n} under FINAL; without FINAL: {all:?}");
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
    env.add_site("strict", &["--origin", "https://shop.example"]);
    env.add_site("off", &["--disabled"]);
    let c = env.collector(&[]).await;
    let mut bad_ids = Vec::new();
    let (cases, strict) = bad_cases(&env.site, &mut bad_ids);
    for (name, body, headers, want) in cases {
        let (status, answer, resp_headers) = c.post(body, &headers).await;
        assert_eq!(status, want, "{name}: {answer}");
        assert!(
            answer["error"].is_string(),
            "{name}: JSON error body, got {answer}"
        );
        assert!(resp_headers.get("retry-after").is_none(), "{name}");
    }

    // A refusal is readable by the refused page (CORS on the 403), so its script stops there.
    let (s, _, h) = c
        .post(strict.clone(), &[("origin", "https://evil.example")])
        .await;
    assert_eq!(s, 403);
    assert_eq!(h["access-control-allow-origin"], "https://evil.example");

    // The allowed origin and no origin both pass for the strict site.
    let (s, _, h) = c
        .post(strict.clone(), &[("origin", "https://shop.example")])
        .await;
    assert_eq!(s, 202);
    assert_eq!(h["access-control-allow-origin"], "https://shop.example");
    let (_, strict_again) = measurement("strict");
    let (s, _, _) = c.post(strict_again.to_string(), &[]).await;
    assert_eq!(s, 202);

    nothing_refused_stored(&env, &c, &bad_ids, &strict).await;
}

/// The bad requests, each a case (name, body, headers, the status it must get), for the site
/// `site` and the sites `strict` (origin `https://shop.example`), `off` (disabled) and none;
/// the ids of every measurement in them added to `bad_ids`; and the `strict` site's body.
fn bad_cases<'a>(site: &str, bad_ids: &mut Vec<String>) -> (Vec<Case<'a>>, String) {
    let mut fresh = |site: &str| {
        let (id, m) = measurement(site);
        bad_ids.push(id);
        m
    };

    let valid = fresh(site).to_string();
    let big = json!([fresh(site), {"padding": "x".repeat(70 * 1024)}]).to_string();
    let bomb = gzip(&[b' '; 10 * 1024 * 1024]);
    let truncated = {
        let g = gzip(fresh(site).to_string().as_bytes());
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
    (cases, strict)
}

/// Nothing of the refused requests (`bad_ids`) was stored but the strict site's measurement
/// (`strict`), sent again with an allowed origin; unknown and disabled sites are counted.
async fn nothing_refused_stored(
    env: &TestEnv<'_>,
    c: &Collector,
    bad_ids: &[String],
    strict: &str,
) {
    // Nothing of the refused requests was stored: once a later marker is visible, the
    // writer (which keeps spool order) has passed everything before it.
    let strict_id = serde_json::from_str::<Value>(strict).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (marker, m) = measurement(&env.site);
    assert_eq!(c.post_json(&m).await.0, 202);
    env.wait_rows(std::slice::from_ref(&marker), VISIBLE).await;
    let stored: Vec<String> = env
        .rows(bad_ids)
        .await
        .iter()
        .map(|r| col(r, "id").as_str().unwrap().to_owned())
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
        assert_eq!(col(r, "lcp_ms"), &Value::Null, "{r}");
        assert_eq!(
            col(r, "fcp_ms"),
            800.0,
            "the other metrics of the page view are kept"
        );
    }
    assert_eq!(col(row(&rows, &skew_id), "ts"), &Value::Null);
    assert_eq!(col(row(&rows, &skew_id), "lcp_ms"), 1500.25);
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

/// GETs `/script.js` from collector `c` with the request header `name: value`; the response.
async fn script_with(c: &Collector, name: &str, value: &str) -> reqwest::Response {
    http()
        .get(format!("{}/script.js", c.url))
        .header(name, value)
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_and_operations_endpoints() {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env.collector(&[]).await;
    let r = http_get(format!("{}/script.js", c.url)).await;
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

    let r = script_with(&c, "if-none-match", &etag).await;
    assert_eq!(r.status(), 304);
    let r = script_with(&c, "accept-encoding", "gzip").await;
    assert_eq!(r.headers()["content-encoding"], "gzip");
    let gz = r.bytes().await.unwrap();
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut out).unwrap();
    assert_eq!(out, plain);
    let r = script_with(&c, "accept-encoding", "gzip, br").await;
    assert_eq!(r.headers()["content-encoding"], "br");

    // The container health check needs no shell tools: `collector probe` asks /readyz on the
    // operations listener.
    let probe = |listen: String| {
        std::process::Command::new(collector_bin())
            .arg("probe")
            .env("COLLECTOR_ADMIN_LISTEN", listen)
            .output()
            .unwrap()
    };
    assert_eq!(
        probe(format!("127.0.0.1:{}", c.admin_port)).status.code(),
        Some(0)
    );
    assert_eq!(
        probe(format!("0.0.0.0:{}", c.admin_port)).status.code(),
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

    assert_eq!(http_get(format!("{}/healthz", c.url)).await.status(), 200);
    assert_eq!(http_get(format!("{}/readyz", c.url)).await.status(), 200);
    assert_eq!(
        http_get(format!("{}/metrics", c.url)).await.status(),
        404,
        "the public listener keeps /metrics to the operations listener"
    );
    let metrics = http_get(format!("{}/metrics", c.admin_url))
        .await
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
    for url in &env.clickhouse {
        assert!(
            metrics.contains(&format!(
                "collector_clickhouse_replica_state{{replica=\"{url}\",shard=\"default\"}} 2"
            )),
            "{metrics}"
        );
    }
    let first = &env.clickhouse[0];
    assert!(
        metrics.contains(&format!(
            "collector_clickhouse_active_replica{{replica=\"{first}\",shard=\"default\"}} 1"
        )),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_manages_sites_and_rejects_bad_settings() {
    let env = TestEnv::new(Stack::shared()).await;
    env.add_site(
        "shop.b",
        &[
            "--origin",
            "HTTPS://Shop.B.Example/",
            "--sample-rate",
            "0.5",
        ],
    );
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
    // A page URL is not an origin (contract §1): refused, not cut to its origin.
    let page = env.cli(&[
        "sites",
        "add",
        "--key",
        "shop.c",
        "--origin",
        "https://shop.example/path",
    ]);
    assert_eq!(page.code, 2, "{}", page.stderr);
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

/// Column `column` of `id`'s row; panics when the row has no such column (see [`col`]: a
/// `Null` read from a missing key would pass an assertion that the value is NULL).
fn stored<'a>(rows: &'a [Value], id: &str, column: &str) -> &'a Value {
    col(row(rows, id), column)
}

/// Issue 13, kinds 1, 2, 3, 5, 10 and 11, end to end: each broken piece costs only itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_broken_piece_costs_only_itself() {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env.collector(&[]).await;
    let (ids, inner_id, body) = broken_pieces(&env.site);
    let (status, answer, _) = c.post(body, &[("content-type", "text/plain")]).await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["accepted"], 10, "{answer}");
    assert_eq!(
        answer["rejected"],
        json!([
            {"index": 10, "error": "not a measurement object"},
            {"index": 11, "error": "not a measurement object"},
        ])
    );
    assert_eq!(
        answer["dropped_fields"],
        json!([
            {"index": 0, "field": "lcp_ms"},
            {"index": 1, "field": "referrer"},
            {"index": 4, "field": "viewport_width"},
            {"index": 6, "field": "referrer"},
        ])
    );

    each_piece_stored_without_its_fault(&env, &ids, &inner_id).await;

    single_objects_lose_the_field_not_the_body(&env, &c).await;
}

/// One body of 12 items for `site`, each broken in its own way (raw JSON text: the faults are
/// ones a JSON encoder cannot write): the ids of the 10 measurements, the id in the inner array
/// (item 10), and the body.
fn broken_pieces(site: &str) -> (Vec<String>, String, String) {
    let mut ids = Vec::new();
    let mut items: Vec<String> = Vec::new();
    // Each item is raw JSON text: the faults are ones a JSON encoder cannot write.
    let mut item = |extra: &str| {
        let (id, m) = measurement(site);
        ids.push(id);
        let text = m.to_string();
        items.push(format!("{}{extra}}}", &text[..text.len() - 1]));
    };
    item(r#","lcp_ms":1e400"#); // 0: beyond f64
    item(r#","referrer":"https://ref.example/q=\ud83d""#); // 1: cut mid-emoji
    item(r#","lcp_ms":1,"lcp_ms":2"#); // 2: duplicated key
    item(r#","viewport_width":1280.0"#); // 3: an integral float
    item(r#","viewport_width":1280.5"#); // 4: a fraction
    item(r#","referrer":"https://user:secret@Ref.Example/x#frag""#); // 5
    item(r#","referrer":"javascript:alert(1)""#); // 6
    item(r#","navigation_type":"back-forward-cache""#); // 7: web-vitals' spelling
    item(r#","navigation_type":"back-forward""#); // 8
    let long_fragment = format!(r#","url":"https://shop.example/long#{}""#, "f".repeat(3000));
    item(&long_fragment); // 9: raw URL > 2048 bytes, stored form short
    let (inner_id, _) = measurement(site);
    items.push(format!(
        r#"["{inner_id}","{}","https://shop.example/"]"#,
        site
    )); // 10: an inner array is no measurement
    items.push("1e400".into()); // 11: a number item beyond f64
    let body = format!("[{}]", items.join(","));
    assert!(body.len() < 64 * 1024);
    (ids, inner_id, body)
}

/// Each of the 10 measurements of [`broken_pieces`] (`ids`) stored with its broken field
/// dropped or normalised and the rest kept; the inner array's id (`inner_id`) not stored.
async fn each_piece_stored_without_its_fault(env: &TestEnv<'_>, ids: &[String], inner_id: &str) {
    let rows = env.wait_rows(ids, VISIBLE).await;
    assert_eq!(rows.len(), 10);
    assert_eq!(stored(&rows, &ids[0], "lcp_ms"), &Value::Null);
    assert_eq!(stored(&rows, &ids[0], "fcp_ms"), 800.0, "the rest is kept");
    assert_eq!(stored(&rows, &ids[1], "referrer"), &Value::Null);
    assert_eq!(stored(&rows, &ids[1], "lcp_ms"), 1500.25);
    assert_eq!(
        stored(&rows, &ids[2], "lcp_ms"),
        2.0,
        "the last duplicate wins"
    );
    assert_eq!(stored(&rows, &ids[3], "viewport_width"), 1280);
    assert_eq!(stored(&rows, &ids[4], "viewport_width"), &Value::Null);
    assert_eq!(
        stored(&rows, &ids[5], "referrer"),
        "https://ref.example",
        "another site's referrer: its origin"
    );
    assert_eq!(stored(&rows, &ids[6], "referrer"), &Value::Null);
    assert_eq!(
        stored(&rows, &ids[7], "navigation_type"),
        "back_forward_cache"
    );
    assert_eq!(stored(&rows, &ids[8], "navigation_type"), "back_forward");
    assert_eq!(stored(&rows, &ids[9], "url"), "https://shop.example/long");
    assert!(
        env.rows(&[inner_id.to_owned()]).await.is_empty(),
        "the inner array's id was not stored"
    );
}

/// As single objects: the same faults cost the field, not the body; a fault in a required
/// field costs its measurement only; broken syntax is still a malformed body.
async fn single_objects_lose_the_field_not_the_body(env: &TestEnv<'_>, c: &Collector) {
    // As single objects: the same faults cost the field, not the body.
    for fault in [
        r#","lcp_ms":1e400"#,
        r#","referrer":"\udc00""#,
        r#","cls":-1e999"#,
    ] {
        let (id, m) = measurement(&env.site);
        let text = m.to_string();
        let body = format!("{}{fault}}}", &text[..text.len() - 1]);
        let (status, answer, _) = c.post(body, &[]).await;
        assert_eq!(status, 202, "{fault}: {answer}");
        assert_eq!(answer["accepted"], 1, "{fault}: {answer}");
        assert_eq!(
            answer["dropped_fields"].as_array().unwrap().len(),
            1,
            "{answer}"
        );
        env.wait_rows(&[id], VISIBLE).await;
    }
    // A fault in a required field costs its measurement only.
    let (_, m) = measurement(&env.site);
    let text = m.to_string();
    let (status, answer, _) = c
        .post(
            format!(
                r#"{},"url":"https://shop.example/\ud83d"}}"#,
                &text[..text.len() - 1]
            ),
            &[],
        )
        .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(
        answer["rejected"],
        json!([{"index": 0, "error": "invalid url"}])
    );
    // Broken syntax is still a malformed body.
    for broken in [
        r#"[{"id":1},]"#,
        r#"{"lcp_ms":1e400"#,
        "[{} {}]",
        r#"{"a":01}"#,
    ] {
        let (status, answer, _) = c.post(broken, &[]).await;
        assert_eq!(status, 400, "{broken}: {answer}");
        assert!(
            answer["error"].as_str().unwrap().contains("invalid JSON"),
            "{answer}"
        );
    }
}

/// Issue 13, kind 4: a header byte outside ASCII does not cost the user agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_agent_outside_ascii_is_stored_as_lossy_utf8() {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env.collector(&[]).await;
    let send = |ua: Vec<u8>| {
        let (id, m) = measurement(&env.site);
        let url = format!("{}/api/v1/measurements", c.url);
        async move {
            let r = http()
                .post(url)
                .header(
                    "user-agent",
                    reqwest::header::HeaderValue::from_bytes(&ua).unwrap(),
                )
                .body(m.to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 202);
            id
        }
    };
    let latin1 = send(b"Caf\xe9Browser/1.0 (\xfcber)".to_vec()).await;
    let utf8 = send("Café/2 (ünïcødé)".as_bytes().to_vec()).await;
    // 510 ASCII bytes then a 3-byte character: the cut at 512 falls inside it.
    let mut long = vec![b'a'; 510];
    long.extend_from_slice("€ and more".as_bytes());
    let long_id = send(long).await;
    let rows = env
        .wait_rows(&[latin1.clone(), utf8.clone(), long_id.clone()], VISIBLE)
        .await;
    assert_eq!(
        stored(&rows, &latin1, "user_agent"),
        "Caf\u{FFFD}Browser/1.0 (\u{FFFD}ber)"
    );
    assert_eq!(stored(&rows, &utf8, "user_agent"), "Café/2 (ünïcødé)");
    assert_eq!(stored(&rows, &long_id, "user_agent"), &"a".repeat(510));
}

/// Raw HTTP/1.1 on a fresh connection: the status line and headers of the answer, read with
/// a bound (a server that waits for more would make this fail, not hang).
async fn raw_http(port: u16, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let read = async {
        loop {
            let n = stream.read(&mut chunk).await.unwrap_or(0);
            buf.extend_from_slice(&chunk[..n]);
            if n == 0 || buf.windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .unwrap_or_else(|_| panic!("no answer within 60 s to {request:?}"));
    String::from_utf8_lossy(&buf).into_owned()
}

/// Issue 13, kind 6: the request line and headers, as HTTP says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_edges_are_answered_as_http_says() {
    let env = TestEnv::new(Stack::shared()).await;
    // A body timeout far beyond the test's patience: an answer proves nobody waited for it.
    let c = env.collector(&[("COLLECTOR_BODY_TIMEOUT", "1h")]).await;
    let head = raw_http(
        c.port,
        "POST /api/v1/measurements HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 1000000\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    // An empty Content-Type header, as some clients send it, is no content type.
    let (empty_id, m) = measurement(&env.site);
    let body = m.to_string();
    let head = raw_http(
        c.port,
        &format!(
            "POST /api/v1/measurements HTTP/1.1\r\nHost: x\r\nContent-Type:\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 202"), "{head}");

    let mut ids = vec![empty_id];
    let mut accepted = |headers: &'static [(&'static str, &'static str)]| {
        let (id, m) = measurement(&env.site);
        ids.push(id);
        (m.to_string(), headers)
    };
    for (body, headers) in [
        accepted(&[("content-type", "Application/JSON; Charset=\"UTF-8\"")]),
        accepted(&[("content-type", "text/plain; foo=bar;charset=utf8")]),
    ] {
        let (status, answer, _) = c.post(body, headers).await;
        assert_eq!(status, 202, "{headers:?}: {answer}");
    }
    let (gz_id, gz) = measurement(&env.site);
    ids.push(gz_id);
    let (status, answer, _) = c
        .post(
            gzip(gz.to_string().as_bytes()),
            &[("content-encoding", "GZIP")],
        )
        .await;
    assert_eq!(status, 202, "{answer}");
    let (status, answer, _) = c
        .post(
            measurement(&env.site).1.to_string(),
            &[("content-type", "text/plain; charset=iso-8859-1")],
        )
        .await;
    assert_eq!(status, 415, "{answer}");
    assert!(answer["error"].is_string());

    // Repeated and trailing slashes reach the intake; nothing redirects; every error is JSON.
    ids.extend(paths_as_http_says(&c, &env.site).await);
    env.wait_rows(&ids, VISIBLE).await;
}

/// Repeated and trailing slashes reach the intake of `c` (a beacon of `site` each: their ids);
/// nothing redirects; every error is JSON.
async fn paths_as_http_says(c: &Collector, site: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for path in [
        "//api/v1/measurements",
        "/api/v1/measurements/",
        "//api//v1/measurements//",
    ] {
        let (id, m) = measurement(site);
        ids.push(id);
        let r = http()
            .post(format!("{}{path}", c.url))
            .body(m.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202, "{path}");
    }
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for (method, path, want) in [
        ("GET", "/nope", 404),
        ("POST", "/api/v2/measurements", 404),
        ("GET", "/api/v1/measurements", 405),
        ("DELETE", "/script.js", 405),
        ("PUT", "//api/v1/measurements/", 405),
        ("GET", "/api/v1/sites/no-such-site", 404),
        ("GET", "/api/v1/sites/bad%20key", 404),
    ] {
        let r = no_redirects
            .request(method.parse().unwrap(), format!("{}{path}", c.url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), want, "{method} {path}");
        assert_eq!(
            r.headers()["content-type"],
            "application/json",
            "{method} {path}"
        );
        let body: Value = r.json().await.unwrap();
        assert!(body["error"].is_string(), "{method} {path}: {body}");
    }
    let r = no_redirects
        .get(format!("{}//script.js/", c.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    ids
}

/// Issue 13, kind 7: a 304 only for the ETag of the variant this request would get, and the
/// coding chosen by q-values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_etags_and_codings_are_per_variant() {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env.collector(&[]).await;
    let get = |accept: Option<&'static str>, inm: Option<String>| {
        let mut req = http().get(format!("{}/script.js", c.url));
        if let Some(a) = accept {
            req = req.header("accept-encoding", a);
        }
        if let Some(i) = inm {
            req = req.header("if-none-match", i);
        }
        async move {
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            let h = r.headers().clone();
            let coding = h
                .get("content-encoding")
                .map(|v| v.to_str().unwrap().to_owned());
            let etag = h["etag"].to_str().unwrap().to_owned();
            assert_eq!(h["vary"], "Accept-Encoding");
            (status, coding, etag)
        }
    };
    let (_, coding, plain) = get(None, None).await;
    assert_eq!(coding, None);
    let (_, coding, gz) = get(Some("gzip"), None).await;
    assert_eq!(coding.as_deref(), Some("gzip"));
    let (_, coding, br) = get(Some("gzip, br"), None).await;
    assert_eq!(coding.as_deref(), Some("br"));
    assert!(plain != gz && gz != br && plain != br);

    // The gzip variant's ETag from a client that does not accept gzip: a full answer.
    assert_eq!(
        get(None, Some(gz.clone())).await,
        (200, None, plain.clone())
    );
    assert_eq!(get(Some("br"), Some(gz.clone())).await.0, 200);
    assert_eq!(get(Some("gzip"), Some(gz.clone())).await.0, 304);
    assert_eq!(
        get(None, Some(format!("W/{plain}"))).await.0,
        304,
        "weak comparison"
    );
    assert_eq!(
        get(Some("gzip"), Some(format!("\"other\", W/{gz}")))
            .await
            .0,
        304
    );
    assert_eq!(get(Some("gzip"), Some("*".into())).await.0, 304);
    // q-values.
    for (accept, want) in [
        ("gzip;q=1, br;q=0.5", Some("gzip")),
        ("br;q=0, gzip", Some("gzip")),
        ("gzip;q=0", None),
        ("identity;q=1, gzip;q=0.5", None),
        ("*", Some("br")),
    ] {
        assert_eq!(get(Some(accept), None).await.1.as_deref(), want, "{accept}");
    }
}

/// Issue 13, kind 8 (server side): the site's `sample_rate` is served to the script and stored
/// with each measurement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sample_rate_is_served_and_stored() {
    let env = TestEnv::new(Stack::shared()).await;
    env.add_site("sampled", &["--sample-rate", "0.25"]);
    env.add_site("off", &["--disabled"]);
    let c = env.collector(&[]).await;
    let r = http_get(format!("{}/api/v1/sites/sampled", c.url)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["access-control-allow-origin"], "*");
    // 5 s, not 60, while this collector has not measured the site yet (its first 10 s,
    // contract v4 "A site over its budget"); the in-process tier sees the 60 after it.
    assert_eq!(r.headers()["cache-control"], "public, max-age=5");
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"site": "sampled", "sample_rate": 0.25})
    );
    let r = http_get(format!("{}/api/v1/sites/off", c.url)).await;
    assert_eq!(r.status(), 404, "a disabled site");

    let (sampled, m) = measurement("sampled");
    let (default, d) = measurement(&env.site);
    assert_eq!(c.post_json(&json!([m, d])).await.0, 202);
    let rows = env
        .wait_rows(&[sampled.clone(), default.clone()], VISIBLE)
        .await;
    assert_eq!(stored(&rows, &sampled, "sample_rate"), 0.25);
    assert_eq!(stored(&rows, &default, "sample_rate"), 1.0);
}

/// `collector migrate` adds the `sample_rate` column to a table created by the release before
/// it, on every replica (ClickHouse 18.16 has no `ADD COLUMN IF NOT EXISTS`), and stays
/// idempotent; rows then carry the rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_adds_sample_rate_to_an_existing_table() {
    let env = TestEnv::new(Stack::shared()).await;
    // A ClickHouse database of its own, so that its ZooKeeper path is fresh.
    let old_db = format!("{}_old", env.db);
    let urls = env.clickhouse.clone();
    // The old release's table, in the form this run's servers take.
    let old_table = match env.table_form {
        "single" => OLD_TABLE.replace(
            "ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/measurements', '{replica}')",
            "ReplacingMergeTree",
        ),
        _ => OLD_TABLE.to_owned(),
    };
    for url in &urls {
        clickhouse_exec(url, &format!("CREATE DATABASE {old_db}"))
            .await
            .unwrap();
        clickhouse_exec(url, &old_table.replace("{database}", &old_db))
            .await
            .unwrap();
    }
    let migrate = || {
        std::process::Command::new(collector_bin())
            .arg("migrate")
            .envs(env.collector_env())
            .env("COLLECTOR_CLICKHOUSE_DATABASE", &old_db)
            .output()
            .unwrap()
    };
    for run in 0..2 {
        let out = migrate();
        assert!(
            out.status.success(),
            "run {run}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for url in &urls {
        let cols = clickhouse_query(
            url,
            &format!(
                "SELECT type, default_expression FROM system.columns \
                 WHERE database = '{old_db}' AND table = 'measurements' AND name = 'sample_rate'"
            ),
        )
        .await
        .unwrap();
        assert_eq!(cols.len(), 1, "{url}: {cols:?}");
        assert_eq!(col(&cols[0], "type"), "Float64");
    }
    let c = env
        .collector(&[("COLLECTOR_CLICKHOUSE_DATABASE", &old_db)])
        .await;
    let (id, m) = measurement(&env.site);
    assert_eq!(c.post_json(&m).await.0, 202);
    let sql = format!("SELECT sample_rate FROM {old_db}.measurements FINAL WHERE id = '{id}'");
    let start = std::time::Instant::now();
    loop {
        let rows = env.query(0, &sql).await;
        if let Some(r) = rows.first() {
            assert_eq!(col(r, "sample_rate"), 1.0);
            break;
        }
        if start.elapsed() >= VISIBLE {
            env.diag
                .give_up(format!("{id} never visible in {old_db}"))
                .await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The measurements table as the release before `sample_rate` created it.
const OLD_TABLE: &str = "CREATE TABLE {database}.measurements
(
    id UUID, site String, received_at DateTime, url String, ts Nullable(Int64),
    referrer Nullable(String), navigation_type Nullable(String), ttfb_ms Nullable(Float64),
    fcp_ms Nullable(Float64), lcp_ms Nullable(Float64), inp_ms Nullable(Float64),
    dom_content_loaded_ms Nullable(Float64), load_ms Nullable(Float64), cls Nullable(Float64),
    viewport_width Nullable(UInt32), effective_connection_type Nullable(String), user_agent String
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/measurements', '{replica}')
PARTITION BY toYYYYMM(received_at)
ORDER BY id";

/// Issue 13, kind 9: the per-client rate is off by default; when on, it is keyed by site and
/// client; a trusted proxy that sends no forwarding header is logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_client_rate_is_off_by_default_and_keyed_by_site() {
    let env = TestEnv::new(Stack::shared()).await;
    env.cli(&["sites", "add", "--key", "site-2"]).success();
    // Default: 400 requests at once from one address all pass (the old default, 50/s with
    // bursts of 100, would refuse some unless they took over 6 s).
    let c = env.collector(&[]).await;
    let bodies: Vec<Value> = (0..400).map(|_| measurement(&env.site).1).collect();
    let all = futures::future::join_all(bodies.iter().map(|m| c.post_json(m))).await;
    let refused = all.iter().filter(|(s, _)| *s != 202).count();
    assert_eq!(refused, 0, "{:?}", all.iter().find(|(s, _)| *s != 202));
    drop(c);

    let c = env
        .collector(&[
            ("COLLECTOR_CLIENT_RATE", "1"),
            ("COLLECTOR_TRUSTED_PROXIES", "127.0.0.1/32"),
        ])
        .await;
    let status = |site: &'static str| {
        let c = &c;
        async move { c.post_json(&measurement(site).1).await.0 }
    };
    assert_eq!(status("site-1").await, 202);
    assert_eq!(status("site-1").await, 202);
    assert_eq!(
        status("site-1").await,
        429,
        "over the burst of 2 for site-1"
    );
    assert_eq!(status("site-2").await, 202, "site-2 has its own bucket");
    assert_eq!(c.metric("collector_http_rate_limited_total").await, 1.0);
    // 127.0.0.1 is trusted but sent no X-Forwarded-For: said in the log, not once per request.
    for _ in 0..20 {
        status("site-2").await;
    }
    let warnings = c
        .logs()
        .matches("sent no COLLECTOR_CLIENT_IP_HEADER")
        .count();
    assert!(
        (1..20).contains(&warnings),
        "{warnings} warnings for 22 requests:\n{}",
        c.logs()
    );
}

/// The helpers fail loudly: a metric that is not there is not 0, rows that never come are
/// not an empty answer, a column that is not there is not NULL, a log without levels has no
/// "no warnings", a collector that does not answer has no status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helpers_fail_loudly_on_what_they_cannot_find() {
    use futures::FutureExt;
    let env = TestEnv::new(Stack::shared()).await;
    let mut c = env.collector(&[]).await;
    assert_eq!(c.metric("collector_measurements_accepted_total").await, 0.0);
    let misspelt = std::panic::AssertUnwindSafe(c.metric("collector_measurement_accepted_total"))
        .catch_unwind()
        .await;
    assert!(misspelt.is_err(), "a misspelt metric must not read as 0");
    let never = std::panic::AssertUnwindSafe(env.wait_rows(
        &[uuid::Uuid::new_v4().to_string()],
        Duration::from_millis(300),
    ))
    .catch_unwind()
    .await;
    assert!(never.is_err(), "rows that never come must fail the wait");

    let (id, m) = measurement(&env.site);
    assert_eq!(c.post_json(&m).await.0, 202);
    let rows = env.wait_rows(std::slice::from_ref(&id), VISIBLE).await;
    assert_eq!(
        col(&rows[0], "ts"),
        &Value::Null,
        "a NULL column reads as NULL"
    );
    let missing = std::panic::catch_unwind(|| col(&rows[0], "no_such_column").clone());
    assert!(missing.is_err(), "a missing column must not read as NULL");
    let missing = std::panic::catch_unwind(|| field(&json!({"accepted": 1}), "duplicates").clone());
    assert!(missing.is_err(), "a missing field must not read as null");

    // A collector's log carries levels: warning_lines reads it.
    warning_lines(&c.logs());
    let unparsed = std::panic::catch_unwind(|| warning_lines("").len());
    assert!(
        unparsed.is_err(),
        "an empty log must not read as no warnings"
    );
    let unparsed = std::panic::catch_unwind(|| warning_lines(r#"{"level":"WARN"}"#).len());
    assert!(
        unparsed.is_err(),
        "a log in another format must not read as no warnings"
    );

    c.kill().await;
    let unanswered = std::panic::AssertUnwindSafe(c.status_of("/readyz"))
        .catch_unwind()
        .await;
    assert!(unanswered.is_err(), "no answer must not read as a status");
}

/// Contract v3, §2 metrics (issue 27, item 5): a browser that quits closes its connections
/// right after sending. Each of these clients sends a whole request, then closes its socket
/// at once, without reading the answer: every measurement is stored once and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_arrived_is_stored_and_counted_when_the_client_leaves_at_once() {
    use tokio::io::AsyncWriteExt;
    let env = TestEnv::new(Stack::shared()).await;
    let c = env.collector(&[]).await;
    const CLIENTS: usize = 10;
    let mut ids = Vec::new();
    for _ in 0..CLIENTS {
        let (id, m) = measurement(&env.site);
        let body = m.to_string();
        let request = format!(
            "POST /api/v1/measurements HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", c.port))
            .await
            .unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        drop(stream);
        ids.push(id);
    }
    env.assert_stored_once(&ids, Duration::from_secs(30)).await;
    c.wait_metric(
        &format!("collector_measurements_accepted_total {CLIENTS}"),
        Duration::from_secs(10),
    )
    .await;
}
