//! Every body form lands with the values sent; URLs normalised, `ts` kept; a retried id stored
//! once; a body that arrived is stored when its client leaves at once.

use super::*;

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
        stored_as_sent(row(&rows, id), &env.site, sent_at);
    }
}

/// Row `r` of `site` holds the values [`measurement`] sends (the URL minimised, another site's
/// referrer as its origin), the user agent sent, no `ts`, and `received_at` within 1 s of
/// `sent_at` (Unix seconds: both in whole seconds).
fn stored_as_sent(r: &Value, site: &str, sent_at: i64) {
    assert_eq!(col(r, "site"), site);
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
