//! Issue 13: each broken piece of a body costs only itself; a user agent outside ASCII.

use super::*;

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
