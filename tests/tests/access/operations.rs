//! The operations endpoints are private; the edge passes only the public paths.

use super::*;

/// `GET url` through `client`: status and body.
async fn get(client: &reqwest::Client, url: &str) -> (u16, String) {
    let r = client
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: no answer: {e}"));
    let status = r.status().as_u16();
    (status, r.text().await.unwrap())
}

/// Issue 37, 5: the operations endpoints are private. On the public listener `/metrics` is 404
/// and `/readyz` gives the status only (`{"error":"not ready"}` when not ready); the operations
/// listener (`COLLECTOR_ADMIN_LISTEN`) serves `/metrics` and `/readyz` with its reason. Through
/// the shipped HAProxy edge (`deploy/edge/haproxy.cfg` started by `deploy/edge/haproxy-run.sh`,
/// as root, the shipped user and group): `/metrics` 404, `/script.js` 200, a beacon 202 and
/// stored; HAProxy's workers run as user `haproxy`, its master as root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_endpoints_are_private_and_the_edge_passes_only_the_public_paths() {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env.collector(&[]).await;
    let public = http();
    assert_eq!(get(&public, &format!("{}/metrics", c.url)).await.0, 404);
    assert_eq!(
        get(&public, &format!("{}/readyz", c.url)).await,
        (200, "ready\n".into())
    );
    let (status, metrics) = get(&public, &format!("{}/metrics", c.admin_url)).await;
    assert_eq!(status, 200);
    assert!(metrics.contains("collector_spool_records "), "{metrics}");
    assert_eq!(
        get(&public, &format!("{}/readyz", c.admin_url)).await,
        (200, "ready\n".into())
    );
    // Not ready (its settings store cannot be reached, so its site settings never load): the
    // public listener says so and no more, the operations listener says why.
    unready_says_why_on_the_operations_listener_only(&env).await;

    // The shipped edge in front.
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "the edge is started as root, as its systemd unit does, so that it can drop to haproxy"
    );
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::new(tmp.path(), "edge");
    let edge = EdgeHaproxy::start(&pki, c.port).await;
    let client = pki.client();
    for path in ["/metrics", "//metrics/", "/api/v1/other", "/metrics?x=1"] {
        let (status, body) = get(&client, &format!("{}{path}", edge.url)).await;
        assert_eq!(
            (status, body.as_str()),
            (404, r#"{"error":"not found"}"#),
            "{path}"
        );
    }
    let (status, script) = get(&client, &format!("{}/script.js", edge.url)).await;
    assert_eq!(status, 200);
    assert!(
        script.len() > 1000,
        "the tracking script: {} bytes",
        script.len()
    );
    let (id, m) = beacon_on("site-1", "https://shop.example/");
    let answer = client
        .post(format!("{}/api/v1/measurements", edge.url))
        .header("content-type", "text/plain")
        .body(m.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 202, "{}", edge.logs());
    env.wait_rows(std::slice::from_ref(&id), VISIBLE).await;

    edge_workers_run_as_haproxy(&edge);
}

/// A collector of `env` whose settings store cannot be reached: its public `/readyz` says
/// "not ready" and no more, its operations listener says why; `/metrics` stays private.
async fn unready_says_why_on_the_operations_listener_only(env: &TestEnv<'_>) {
    let public = http();
    let nowhere = format!("postgres://postgres@127.0.0.1:{}/x", free_port());
    let unready = env
        .collector(&[("COLLECTOR_DATABASE_URL", nowhere.as_str())])
        .await;
    let (status, body) = get(&public, &format!("{}/readyz", unready.url)).await;
    assert_eq!((status, body.as_str()), (503, r#"{"error":"not ready"}"#));
    let (status, body) = get(&public, &format!("{}/readyz", unready.admin_url)).await;
    assert_eq!(status, 503);
    let reason: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        field(&reason, "error"),
        "site settings not loaded",
        "{body}"
    );
    assert_eq!(
        get(&public, &format!("{}/metrics", unready.url)).await.0,
        404
    );
}

/// The edge's HAProxy master stays root (it reloads); its workers run as user `haproxy`.
fn edge_workers_run_as_haproxy(edge: &EdgeHaproxy) {
    let haproxy = uid_of("haproxy");
    let master = edge.master_pid();
    assert_eq!(
        uids(master),
        vec![0; 4],
        "the master stays root (it reloads)"
    );
    let workers = edge.worker_pids();
    assert!(
        !workers.is_empty(),
        "no worker of master {master}: {}",
        edge.logs()
    );
    for w in &workers {
        assert_eq!(
            uids(*w),
            vec![haproxy; 4],
            "worker {w}: real, effective, saved and fs uid are haproxy's ({haproxy})"
        );
    }
    println!("edge: master {master} uid 0, workers {workers:?} uid {haproxy} (haproxy)");
}
