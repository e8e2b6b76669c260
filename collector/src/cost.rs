//! What one beacon costs at intake, in process: the benches run by hand, without I/O
//! ([`beacon_cost`], [`v4_intake_cost`]: times, `--ignored --nocapture`), and the beacon the
//! instruction-count gate counts through the whole intake, router to spool
//! ([`intake_cost_counted`], `scripts/cost-gate.sh`, issue 53).

use crate::beacon::tests::{ctx, row_of, with};
use crate::beacon::*;
use crate::measurement::page_groups::{presets, PageGroups};
use crate::measurement::site::{SiteColumns, SiteRules};

/// The body of a typical beacon: every Core Web Vital, attribution, the navigation timings.
const COMMON: &str = r#","ts":1780000000000,"referrer":"https://search.example/?q=shoes","navigation_type":"navigate","ttfb_ms":120.5,"fcp_ms":800,"lcp_ms":1500.25,"inp_ms":64,"cls":0.05,"dom_content_loaded_ms":900,"load_ms":1800,"viewport_width":1280,"effective_connection_type":"4g","lcp_target":"main>img.hero","lcp_resource_load_delay_ms":100,"lcp_resource_load_duration_ms":400,"lcp_element_render_delay_ms":50,"inp_type":"pointer","inp_input_delay_ms":4,"inp_processing_duration_ms":40,"inp_presentation_delay_ms":20"#;
/// Its start: an id, the site and a product-in-collection URL with a kept and a dropped parameter.
const START: &str = r#"{"id":"7f1c2a3e-9b4d-4c6e-8f00-123456789abc","site":"shop-1","url":"https://shop.example/collections/summer/products/linen-shirt-42?utm_source=x&fbclid=abc""#;
/// Its end with three Server-Timing entries and two dimensions (contract v4).
const V4_END: &str = r#","server_timing":[{"name":"cdn-cache","desc":"HIT"},{"name":"edge","dur":3.5},{"name":"db","dur":12,"desc":"postgres"}],"dimensions":{"variant":"b","page_type":"pdp"}}"#;

/// Runs `f` with a site's rules as a shop sets them: `utm_*` kept, the Shopify page-group
/// preset (13 rules), two declared dimensions, rate 1 with a sampler that never lowers it.
fn with_site<R>(f: impl FnOnce(&SiteRules<'_>, &PageGroups) -> R) -> R {
    let rules: Vec<String> = presets::SHOPIFY.iter().map(|r| r.to_string()).collect();
    let groups = PageGroups::compile(&rules);
    let declared = vec!["variant".to_owned(), "page_type".to_owned()];
    let keep = vec!["utm_*".to_owned()];
    let distinct = crate::measurement::dimensions::DistinctValues::default();
    let sampler =
        crate::sampling::Sampler::new(0, std::sync::Arc::new(crate::metrics::Metrics::new()));
    let site = SiteRules {
        key: "shop-1",
        keep_query: &keep,
        origins: &[],
        page_groups: &groups,
        dimensions: &declared,
        sample_rate: 1.0,
        sampler: &sampler,
        distinct: &distinct,
    };
    f(&site, &groups)
}

/// The site the counted path posts to, as a shop sets it: its one origin, `utm_*` kept, the
/// Shopify page-group preset (13 rules), two declared dimensions, every page view sent.
fn counted_site() -> crate::settings::Site {
    let mut site = crate::settings::Site::new("shop-1");
    site.allowed_origins = vec!["https://shop.example".to_owned()];
    site.page_groups = presets::SHOPIFY.iter().map(|r| r.to_string()).collect();
    site.dimensions = vec!["variant".to_owned(), "page_type".to_owned()];
    site
}

/// The settings store of the counted path: one site, in memory (the seam production fills
/// with PostgreSQL, [`crate::settings::SiteSource`]); asked once, by the full load at start.
struct OneSite(crate::settings::Site);

impl crate::settings::SiteSource for OneSite {
    fn fetch<'a>(
        &'a self,
        key: &'a str,
    ) -> futures_util::future::BoxFuture<
        'a,
        Result<Option<crate::settings::Site>, crate::settings::StoreError>,
    > {
        Box::pin(async move { Ok((self.0.key == key).then(|| self.0.clone())) })
    }

    fn fetch_all(
        &self,
    ) -> futures_util::future::BoxFuture<
        '_,
        Result<Vec<crate::settings::Site>, crate::settings::StoreError>,
    > {
        Box::pin(async move { Ok(vec![self.0.clone()]) })
    }
}

/// The collector's public router over the state production assembles
/// ([`crate::app::intake_state`]): the default options but two (the site rate, whose limiter
/// is still asked, so high that a fast run is never refused; the settings TTL, so long that no
/// refresh starts mid-run), the settings loaded whole from [`OneSite`], a real spool (the
/// production open, [`crate::shards::open`]) in `spool_dir`, the country fixture database.
async fn counted_router(spool_dir: &std::path::Path) -> axum::Router {
    use clap::Parser;
    let spool_dir = spool_dir.display().to_string();
    let args = [
        "collector",
        "--spool-dir",
        &spool_dir,
        "--database-url",
        "postgres://unused@127.0.0.1:9/unused",
        "--clickhouse-urls",
        "http://127.0.0.1:9",
        "--site-rate",
        "1000000",
        "--settings-ttl",
        "1h",
    ];
    let cli = crate::cli::Cli::try_parse_from(args).unwrap();
    let config = crate::config::Config::from_args(&cli.args).unwrap();
    let metrics = std::sync::Arc::new(crate::metrics::Metrics::new());
    let source = std::sync::Arc::new(OneSite(counted_site()));
    let settings =
        crate::settings::SiteSettings::new(source, config.settings.ttl, None, metrics.clone());
    assert_eq!(settings.reload().await.unwrap(), 1);
    let rules = crate::purges::rules(&settings);
    let (spools, _readers) = crate::shards::open(&config, &rules, &metrics).unwrap();
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let countries = crate::geo::Countries::open(&fixtures.join("geo-geolite2.mmdb")).unwrap();
    let state = crate::app::intake_state(&config, settings, spools, countries, &metrics);
    crate::endpoints::router(state)
}

/// The beacon the instruction-count gate counts (issue 53, `scripts/cost-gate.sh`, its budget
/// in `bench/intake-cost.txt`): `COST_BEACONS` (default 2,000) v4 beacons, one per request
/// (or `COST_BATCH` per request, a JSON array, for a count by hand of batches), one after another, through the collector's whole intake in process, production's own
/// functions all the way: the router (the request counted and timed), `intake::post`
/// (headers, body, the request's task), and every station of `accept`: the in-flight bound,
/// decode, judge (the user agent from its cache, the country from the fixture database),
/// the site stage (the settings from the in-memory cache, the origin, the shard, minimise,
/// page group, dimensions, sample rate, the sampler's demand), shedding, the rates, the dedup
/// claim, the RowBinary encoding and the append into the spool's open group, committed by the
/// spool's own thread (its `pwrite` and `fdatasync` are system calls: callgrind counts none of
/// the kernel's work, so the disk is left out by the count itself); then the 202's JSON.
/// Each beacon has an id of its own (else it would be a duplicate, not stored). The spool is
/// on a tmpfs (`/dev/shm`) when there is one, only so that a run is quick.
///
/// Not counted: hyper's HTTP/1 parse and write and the connection task
/// (`crate::server::connection`: they need a socket), the kernel.
#[test]
#[ignore]
fn intake_cost_counted() {
    let n: u32 = std::env::var("COST_BEACONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let shm = std::path::Path::new("/dev/shm");
    let spool = if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .unwrap();
    let batch: u32 = std::env::var("COST_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let bytes = runtime.block_on(async {
        let router = counted_router(spool.path()).await;
        let one = counted_body();
        let id_at = one.find("123456789abc").unwrap();
        let mut bytes = 0;
        for i in 0..n.div_ceil(batch) {
            // The id's last 12 hex digits: the beacon's number.
            let numbered = |j: u32| {
                let mut body = one.clone();
                let k = i * batch + j;
                body.replace_range(id_at..id_at + 12, &format!("{k:012x}"));
                body
            };
            let body = if batch == 1 {
                numbered(0)
            } else {
                format!(
                    "[{}]",
                    (0..batch).map(numbered).collect::<Vec<_>>().join(",")
                )
            };
            bytes += post_one(&router, &body, batch).await;
        }
        bytes
    });
    println!("{n} beacons, {bytes} bytes answered");
}

/// The counted beacon's body: [`START`], [`COMMON`] with its `ts` a second ago (a `ts` far
/// from now is withheld as clock skew), [`V4_END`].
fn counted_body() -> String {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        - 1000;
    let common = COMMON.replace("1780000000000", &now_ms.to_string());
    format!("{START}{common}{V4_END}")
}

/// Posts `body` as a browser's `sendBeacon` does, through `router` as the connection's
/// service calls it (its peer in `ConnectInfo`); the answer's length. Panics unless it is a
/// 202 that stored all `count` measurements.
async fn post_one(router: &axum::Router, body: &str, count: u32) -> usize {
    use axum::http::{header, Request};
    use tower::Service;
    let mut req = Request::post("/api/v1/measurements")
        .header(header::HOST, "collector.example")
        .header(header::CONTENT_TYPE, "text/plain;charset=UTF-8")
        .header(header::CONTENT_LENGTH, body.len())
        .header(header::ORIGIN, "https://shop.example")
        .header(
            header::USER_AGENT,
            "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) \
             Chrome/131.0.0.0 Safari/537.36",
        )
        .body(axum::body::Body::from(body.to_owned()))
        .unwrap();
    let peer: std::net::SocketAddr = "192.0.2.9:50000".parse().unwrap();
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(peer));
    let response = router.clone().call(req).await.unwrap();
    let status = response.status();
    let answer = axum::body::to_bytes(response.into_body(), 4096)
        .await
        .unwrap();
    let stored = format!(r#"{{"accepted":{count},"duplicates":0,"rejected":[]"#);
    assert!(
        status == 202 && answer.starts_with(stored.as_bytes()),
        "{status} {}",
        String::from_utf8_lossy(&answer)
    );
    answer.len()
}

/// The intake's cost per beacon for what this crate does with its body (text, parse, the field
/// table's rules, the RowBinary encoding), without I/O: 20,000 typical beacons. Run by hand
/// (`cargo test --release -p collector beacon_cost -- --ignored --nocapture`, under
/// `valgrind --tool=callgrind` for an instruction count that does not depend on the machine's
/// load); a speed figure is not a test.
#[test]
#[ignore]
fn beacon_cost() {
    let body = with(COMMON);
    let start = std::time::Instant::now();
    let mut bytes = 0;
    for _ in 0..20_000 {
        let text = text(body.as_bytes());
        let items = parse(&text).unwrap();
        let valid: Vec<_> = items
            .into_iter()
            .map(|item| row_of(validate(item, &ctx()).unwrap()))
            .collect();
        bytes += crate::measurement::encode(&valid).payload.len();
    }
    println!(
        "{} bytes encoded; {:?} per beacon",
        bytes,
        start.elapsed() / 20_000
    );
}

/// The cost per beacon of contract v4's additions at intake (issue 40), without I/O: the
/// station work of [`beacon_cost`] plus what intake does once the site is known (minimise),
/// first as before the additions, then with a body carrying three Server-Timing entries and
/// two dimensions, the page group from the Shopify preset (13 rules) and the dimensions
/// settled. Run by hand (`cargo test --release -p collector v4_intake_cost -- --ignored
/// --nocapture`); a speed figure is not a test.
#[test]
#[ignore]
fn v4_intake_cost() {
    let before = format!("{START}{COMMON}}}");
    let after = format!("{START}{COMMON}{V4_END}");
    let keep = vec!["utm_*".to_owned()];
    with_site(|site, groups| {
        const N: u32 = 20_000;
        // `groups`: the page group from the preset; `dims`: the whole site stage, the dimensions
        // settled too.
        let run = |body: &str, groups: Option<&PageGroups>, dims: bool| {
            let start = std::time::Instant::now();
            let mut bytes = 0;
            for _ in 0..N {
                let text = text(body.as_bytes());
                let valid: Vec<_> = parse(&text)
                    .unwrap()
                    .into_iter()
                    .map(|item| {
                        let mut judged = validate(item, &ctx()).unwrap();
                        if dims {
                            let (m, dropped) = crate::measurement::site::settle(judged, site);
                            assert!(dropped.is_empty());
                            return m;
                        }
                        crate::measurement::minimise::urls(
                            &mut judged.url,
                            &mut judged.referrer,
                            &keep,
                            &[],
                        );
                        let page_group = groups.map_or_else(Default::default, |g| {
                            crate::measurement::Label(g.group_of(&judged.url).into())
                        });
                        let sample_rate = judged.sample_rate.unwrap_or(1.0);
                        judged.into_row(SiteColumns {
                            sample_rate,
                            dimension_names: vec![],
                            dimension_values: vec![],
                            page_group,
                        })
                    })
                    .collect();
                bytes += crate::measurement::encode(&valid).payload.len();
            }
            (start.elapsed() / N, bytes / N as usize)
        };
        // The least of 7 rounds, interleaved: the machine is shared.
        let mut best = [std::time::Duration::MAX; 3];
        for _ in 0..7 {
            for (i, (body, g, d)) in [
                (&before, None, false),
                (&before, Some(groups), false),
                (&after, Some(groups), true),
            ]
            .into_iter()
            .enumerate()
            {
                best[i] = best[i].min(run(body, g, d).0);
            }
        }
        println!(
        "per beacon, least of 7 rounds: before {:?}; with the page group (Shopify preset) {:?}; \
         with Server-Timing (3 entries) and 2 dimensions in the body too {:?}",
        best[0], best[1], best[2]
    );
        let start = std::time::Instant::now();
        for _ in 0..N {
            std::hint::black_box(groups.group_of(std::hint::black_box(
                "https://shop.example/collections/summer/products/linen-shirt-42?utm_source=x",
            )));
        }
        println!("group_of alone: {:?}", start.elapsed() / N);
    });
}
