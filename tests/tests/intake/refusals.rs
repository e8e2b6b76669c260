//! Bad requests get their status and store nothing; invalid optional fields are dropped and
//! listed; the per-client rate.

use super::*;

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
