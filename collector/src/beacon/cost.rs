//! What one beacon costs at intake, in process and without I/O: the benches run by hand
//! ([`beacon_cost`], [`v4_intake_cost`]: times, `--ignored --nocapture`) and the beacon the
//! instruction-count gate counts ([`intake_cost_counted`], `scripts/cost-gate.sh`, issue 53).

use super::tests::{ctx, row_of, with};
use super::*;
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

/// The beacon the instruction-count gate counts (issue 53, `scripts/cost-gate.sh`, its budget
/// in `bench/intake-cost.txt`): `COST_BEACONS` (default 20,000) bodies of one v4 beacon
/// through every station there is without I/O: the text, the parse, the judgement, the site
/// stage ([`with_site`]: minimise, page group, dimensions settled, rate) and the RowBinary
/// encoding. Not here: the HTTP stack, the site lookup, the claim and the spool append.
#[test]
#[ignore]
fn intake_cost_counted() {
    let n: u32 = std::env::var("COST_BEACONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let body = format!("{START}{COMMON}{V4_END}");
    let bytes = with_site(|site, _| {
        let mut bytes = 0;
        for _ in 0..n {
            let text = text(body.as_bytes());
            let rows: Vec<_> = parse(&text)
                .unwrap()
                .into_iter()
                .map(|item| {
                    let judged = validate(item, &ctx()).unwrap();
                    crate::measurement::site::settle(judged, site).0
                })
                .collect();
            bytes += crate::measurement::encode(&rows).payload.len();
        }
        bytes
    });
    println!("{n} beacons, {bytes} bytes encoded");
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
