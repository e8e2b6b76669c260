//! The site-settings cache (`collector::settings::SiteSettings`) over an in-memory source,
//! on tokio's paused clock: fresh, stale-while-revalidate, the store down, the negative
//! cache, single flight and the first-fetch budget; and, through the whole collector, a
//! site answered from the cache while the store is down.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use collector::metrics::Metrics;
use collector::settings::{Lookup, SiteSettings, FIRST_FETCH_RATE};

use crate::common::{beacon, App, ClickHouse, Sites};

const TTL: Duration = Duration::from_secs(60);

fn cache(sites: &Arc<Sites>) -> (SiteSettings, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new());
    (
        SiteSettings::new(sites.clone(), TTL, None, metrics.clone()),
        metrics,
    )
}

fn known(lookup: &Lookup) -> bool {
    matches!(lookup, Lookup::Known(_))
}

#[tokio::test(start_paused = true)]
async fn fresh_entries_do_not_ask_the_store_and_stale_ones_are_answered_at_once() {
    let sites = Sites::with(&["shop"]);
    let (settings, metrics) = cache(&sites);
    settings.reload().await.expect("a full load");
    assert!(known(&settings.lookup("shop").await));
    tokio::time::advance(TTL - Duration::from_secs(1)).await;
    assert!(known(&settings.lookup("shop").await));
    assert_eq!(sites.fetch_count(), 0, "fresh: the store is not asked");

    // Stale, and the store now takes an hour to answer: the lookup does not wait for it.
    tokio::time::advance(Duration::from_secs(2)).await;
    sites.set_delay(Duration::from_secs(3600));
    let lookups = (0..20).map(|_| settings.lookup("shop"));
    let answers = tokio::time::timeout(
        Duration::from_millis(1),
        futures_util::future::join_all(lookups),
    )
    .await
    .expect("stale answers without waiting");
    assert!(answers.iter().all(known));
    tokio::task::yield_now().await;
    assert_eq!(
        sites.fetch_count(),
        1,
        "one background refresh for 20 stale lookups"
    );
    assert_eq!(metrics.settings.stale_served.get(), 20);
}

#[tokio::test(start_paused = true)]
async fn a_refresh_brings_changes_and_the_store_down_keeps_the_last_known_state() {
    let sites = Sites::with(&["shop"]);
    let (settings, _) = cache(&sites);
    settings.reload().await.unwrap();
    sites.put(collector::settings::Site {
        enabled: false,
        ..crate::common::site("shop")
    });
    tokio::time::advance(TTL).await;
    let Lookup::Known(before) = settings.lookup("shop").await else {
        panic!("known")
    };
    assert!(before.enabled, "the stale value is answered first");
    // Wait for the background refresh (no real time passes: the source answers at once).
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    let Lookup::Known(after) = settings.lookup("shop").await else {
        panic!("known")
    };
    assert!(!after.enabled, "the refresh brought the change");

    sites.set_down(true);
    tokio::time::advance(TTL * 10).await;
    for _ in 0..5 {
        let Lookup::Known(site) = settings.lookup("shop").await else {
            panic!("the last known state while the store is down")
        };
        assert!(!site.enabled);
        tokio::task::yield_now().await;
    }
    assert!(matches!(
        settings.lookup("never-seen").await,
        Lookup::Unavailable
    ));
    assert!(settings.reload().await.is_err());
}

#[tokio::test]
async fn unknown_keys_are_remembered_and_a_never_seen_key_is_fetched_once() {
    let sites = Sites::with(&["shop"]);
    let (settings, _) = cache(&sites);
    assert!(matches!(settings.lookup("nowhere").await, Lookup::Unknown));
    assert!(matches!(settings.lookup("nowhere").await, Lookup::Unknown));
    assert_eq!(sites.fetch_count(), 1, "the unknown key is remembered");

    // Twenty requests for one never-seen key while the store is slow: one fetch.
    sites.set_delay(Duration::from_millis(200));
    let lookups = (0..20).map(|_| settings.lookup("shop"));
    let answers = futures_util::future::join_all(lookups).await;
    assert!(answers.iter().all(known));
    assert_eq!(sites.fetches.load(Ordering::SeqCst), 2, "single flight");
}

#[tokio::test]
async fn never_seen_keys_beyond_the_first_fetch_budget_are_limited() {
    let sites = Sites::with(&[]);
    let (settings, metrics) = cache(&sites);
    let keys: Vec<String> = (0..FIRST_FETCH_RATE + 3)
        .map(|i| format!("random-{i}"))
        .collect();
    let mut limited = 0;
    for key in &keys {
        match settings.lookup(key).await {
            Lookup::Unknown => {}
            Lookup::Limited => limited += 1,
            other => panic!("{key}: {other:?}"),
        }
    }
    assert_eq!(limited, 3, "{FIRST_FETCH_RATE} per second, then limited");
    assert_eq!(
        sites.fetch_count(),
        FIRST_FETCH_RATE as usize,
        "the limited keys never reached the store"
    );
    assert_eq!(metrics.settings.first_fetch_limited.get(), 3);
}

#[tokio::test]
async fn the_collector_serves_a_cached_site_while_the_store_is_down_and_503s_a_new_one() {
    let ch = ClickHouse::start().await;
    let sites = Sites::with(&["shop"]);
    let app = App::start(sites.clone(), &[&ch], &[("--settings-ttl", "1s")]).await;
    sites.set_down(true);
    // Not a wait for a condition: past the TTL (the least it may be), every entry is stale.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (_, body) = beacon("shop");
    assert_eq!(
        app.send(&body).await.status,
        202,
        "stale settings serve while the store is down"
    );
    let (_, body) = beacon("new-shop");
    let answer = app.send(&body).await;
    assert_eq!(answer.status, 503, "{}", answer.text());
    assert!(answer.header("retry-after").parse::<u64>().unwrap() >= 1);
    assert!(app.metric("collector_settings_stale_served_total").await >= 1.0);
    app.stop(false).await;
}

/// A site's page-group rules are compiled once per load of its settings, kept with the cached
/// entry: every lookup between two loads answers the same compiled entry, and a load brings
/// the new rules.
#[tokio::test(start_paused = true)]
async fn page_group_rules_are_compiled_once_per_load() {
    let sites = Sites::with(&[]);
    sites.put(collector::settings::Site {
        page_groups: vec!["product=/p/*".into()],
        ..crate::common::site("shop")
    });
    let (settings, _) = cache(&sites);
    settings.reload().await.unwrap();
    let lookup = || async {
        match settings.lookup("shop").await {
            Lookup::Known(site) => site,
            _ => panic!("known"),
        }
    };
    let (a, b) = (lookup().await, lookup().await);
    assert!(Arc::ptr_eq(&a, &b), "one compiled entry between loads");
    assert_eq!(a.page_groups.group_of("https://s.example/p/1"), "product");
    sites.put(collector::settings::Site {
        page_groups: vec!["item=/p/*".into()],
        ..crate::common::site("shop")
    });
    settings.reload().await.unwrap();
    let c = lookup().await;
    assert!(!Arc::ptr_eq(&a, &c));
    assert_eq!(c.page_groups.group_of("https://s.example/p/1"), "item");
}
