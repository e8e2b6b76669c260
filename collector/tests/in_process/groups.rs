//! Intake with a site's rules (contract v4 §2): page groups from the site's compiled rules
//! (and the automatic group without a match), the dimensions it declared (the others dropped
//! and counted under one label), Server-Timing entries and the CDN cache status read from them.

use std::time::Duration;

use serde_json::json;

use crate::common::{beacon, get, site, wait_until, App, ClickHouse, Sites};

#[tokio::test]
async fn page_groups_dimensions_and_server_timing_are_stored_as_the_site_says() {
    let ch = ClickHouse::start().await;
    let sites = Sites::with(&[]);
    sites.put(collector::settings::Site {
        page_groups: vec!["product=/product/*".into(), "home=/".into()],
        dimensions: vec!["variant".into()],
        ..site("shop")
    });
    let app = App::start(sites, &[&ch], &[]).await;

    let (product, mut p) = beacon("shop");
    p["server_timing"] = json!([
        {"name": "db", "dur": 12.5, "desc": "Postgres"},
        {"name": "cdn-cache", "desc": "HIT"},
    ]);
    p["dimensions"] = json!({"variant": "b", "secret": "x"});
    let (other, mut o) = beacon("shop");
    o["url"] = json!("https://shop.example/orders/4711/items?x=1");
    o["server_timing"] = json!([{"name": "cfCacheStatus", "desc": "expired"}]);
    o["dimensions"] = json!({"variant": "alice@example.com"});
    let (broken, mut b) = beacon("shop");
    b["server_timing"] = json!([{"dur": 1}]);
    b["dimensions"] = json!({"variant": 7});

    let answer = app.send(&json!([p, o, b])).await;
    assert_eq!(answer.status, 202, "{}", answer.text());
    let body = answer.json();
    assert_eq!(body["accepted"], 3, "{body}");
    let mut dropped: Vec<(u64, String)> = body["dropped_fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["index"].as_u64().unwrap(),
                d["field"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    dropped.sort();
    assert_eq!(
        dropped,
        [
            (0, "dimensions.secret".to_owned()),
            (2, "dimensions".to_owned()),
            (2, "server_timing".to_owned())
        ]
    );

    wait_until("3 rows", Duration::from_secs(10), || async {
        ch.rows().len() >= 3
    })
    .await;
    let rows = ch.rows();
    let row = |id| rows.iter().find(|r| r.id == id).unwrap();

    let p = row(product);
    assert_eq!(&*p.page_group, "product");
    assert_eq!(p.server_timing_name, ["db", "cdn-cache"]);
    assert_eq!(p.server_timing_dur, [12.5, 0.0]);
    assert_eq!(
        p.server_timing_desc,
        ["", "HIT"],
        "only a cache entry's desc is kept"
    );
    assert_eq!(&*p.cdn_cache, "hit");
    assert_eq!(p.dimension_names, ["variant"]);
    assert_eq!(p.dimension_values, ["b"]);

    let o = row(other);
    assert_eq!(&*o.page_group, "/orders/*/items", "the automatic group");
    assert_eq!(&*o.cdn_cache, "miss");
    assert_eq!(o.dimension_values, ["*"], "masked as a URL's path");

    let b = row(broken);
    assert!(b.server_timing_name.is_empty() && b.dimension_names.is_empty());
    assert_eq!(&*b.cdn_cache, "");

    let count =
        |field: &str| format!("collector_measurements_field_dropped_total{{field=\"{field}\"}}");
    assert_eq!(app.metric(&count("dimensions")).await, 2.0);
    assert_eq!(app.metric(&count("server_timing")).await, 1.0);
    let metrics = get(app.admin, "/metrics").await.text();
    assert!(!metrics.contains("secret"), "no label of a client's name");
    app.stop(false).await;
}
