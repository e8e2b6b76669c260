//! The script and operations endpoints, and the `sites` commands.

use super::*;

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
    probe_asks_the_operations_listener(&c);

    assert_eq!(http_get(format!("{}/healthz", c.url)).await.status(), 200);
    assert_eq!(http_get(format!("{}/readyz", c.url)).await.status(), 200);
    assert_eq!(
        http_get(format!("{}/metrics", c.url)).await.status(),
        404,
        "the public listener keeps /metrics to the operations listener"
    );
    operations_metrics(&env, &c).await;
}

/// `collector probe` asks `/readyz` of `c`'s operations listener (also named by an unspecified
/// address, probed on loopback): exit 0; with nobody listening, exit 1 and a one-line error.
fn probe_asks_the_operations_listener(c: &Collector) {
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
}

/// The operations listener of `c` exports the intake's, spool's and store's metrics, every
/// ClickHouse server of `env` healthy and the first one written to.
async fn operations_metrics(env: &TestEnv<'_>, c: &Collector) {
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
