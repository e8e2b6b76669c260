//! Validation and normalisation of measurements, field by field (contract §2).

use super::*;
use crate::measurement::filing::{FILING_MAX_AHEAD_MS, MAX_TS_AHEAD_MS, MAX_TS_BEHIND_MS};
use crate::measurement::rules::MAX_SELECTOR_BYTES;
use crate::measurement::site::SiteColumns;
use crate::measurement::{DateTime, Measurement};

const NOW: i64 = 1_780_000_000_000;
const ID: &str = "7f1c2a3e-9b4d-4c6e-8f00-123456789abc";

static AGENT: std::sync::LazyLock<crate::useragent::Agent> =
    std::sync::LazyLock::new(|| crate::useragent::Agent {
        device_type: "desktop",
        browser: "Firefox".into(),
        browser_version: "128".into(),
        os: "Linux".into(),
    });

pub(crate) fn ctx() -> Context<'static> {
    Context {
        received_at_ms: NOW,
        user_agent: "UA/1.0",
        agent: &AGENT,
        country: "DE",
    }
}

/// A judged measurement as these tests read it: its row, with the columns only the site
/// stage sets at what no site changes (the rate sent, else 1; the dimensions sent; no page
/// group), and what judging dropped.
#[derive(Debug, PartialEq)]
struct Valid {
    measurement: Measurement<'static>,
    dropped: Vec<&'static str>,
    clock_skewed: bool,
}

/// `judged` as a row of no site's rules (see [`Valid`]).
pub(crate) fn row_of(mut judged: Judged<'_>) -> Measurement<'_> {
    let (names, values) = judged
        .dimensions
        .take()
        .unwrap_or_default()
        .into_iter()
        .unzip();
    let sample_rate = judged.sample_rate.unwrap_or(1.0);
    judged.into_row(SiteColumns {
        sample_rate,
        dimension_names: names,
        dimension_values: values,
        page_group: Default::default(),
    })
}

fn one(json: &str) -> Result<Valid, Rejection> {
    let text = text(json.as_bytes());
    let mut items = parse(&text).expect("parses");
    assert_eq!(items.len(), 1);
    validate(items.remove(0), &ctx()).map(|mut v| {
        let dropped = std::mem::take(&mut v.dropped);
        let clock_skewed = v.clock_skewed;
        Valid {
            measurement: row_of(v).into_owned(),
            dropped,
            clock_skewed,
        }
    })
}

pub(crate) fn with(extra: &str) -> String {
    format!(r#"{{"id":"{ID}","site":"shop-1","url":"https://shop.example/p?x=1"{extra}}}"#)
}

#[test]
fn full_measurement_keeps_every_value() {
    let v = one(&with(
        r#","ts":1779999999000,"referrer":"https://google.com/","navigation_type":"reload",
        "ttfb_ms":12.5,"fcp_ms":100,"lcp_ms":250.25,"inp_ms":40,"dom_content_loaded_ms":300,
        "load_ms":900,"cls":0.12,"viewport_width":390,"effective_connection_type":"4g","extra":[1]"#,
    ))
    .unwrap();
    let m = v.measurement;
    assert_eq!(m.id.to_string(), ID);
    assert_eq!(m.site, "shop-1");
    assert_eq!(m.url, "https://shop.example/p?x=1");
    assert_eq!(m.received_at.0, (NOW / 1000) as u32);
    assert_eq!(m.ts, Some(1_779_999_999_000));
    assert_eq!(m.referrer.as_deref(), Some("https://google.com/"));
    assert_eq!(m.navigation_type.as_deref(), Some("reload"));
    assert_eq!(
        (m.ttfb_ms, m.fcp_ms, m.lcp_ms, m.inp_ms),
        (Some(12.5), Some(100.0), Some(250.25), Some(40.0))
    );
    assert_eq!(
        (m.dom_content_loaded_ms, m.load_ms, m.cls),
        (Some(300.0), Some(900.0), Some(0.12))
    );
    assert_eq!(m.viewport_width, Some(390));
    assert_eq!(m.effective_connection_type.as_deref(), Some("4g"));
    assert_eq!(m.user_agent, "UA/1.0");
    assert!(v.dropped.is_empty());
    assert!(!v.clock_skewed);
}

/// Contract v5 §2: a selector is masked before it is cut, so that a card number or a token
/// across the 256-byte cut is masked whole, not left as a prefix too short to be recognised.
#[test]
fn a_selector_is_masked_before_it_is_cut() {
    for secret in [
        "4929817344029951",
        "Qz7_Wm4-Hp2kR9sT6vB3nL",
        "jo.ann%2540example.org",
    ] {
        // The secret starts 8 bytes before the cut: cut first, 8 bytes of it would stay.
        let prefix = format!("div.{}#", "a".repeat(MAX_SELECTOR_BYTES - 8 - 5));
        assert_eq!(prefix.len(), MAX_SELECTOR_BYTES - 8);
        let v = one(&with(&format!(
            r#","lcp_ms":1000,"lcp_target":"{prefix}{secret}""#
        )))
        .unwrap();
        let stored = v.measurement.lcp_target.as_deref().unwrap().to_owned();
        assert_eq!(stored, format!("{prefix}*"), "{secret}");
        assert!(!stored.contains(&secret[..8]), "{secret}: {stored}");
    }
}

/// Contract v3: attribution fields are stored as sent when valid; selectors are cut at
/// 256 bytes on a character boundary, URLs normalised by the `url` rules.
#[test]
fn attribution_is_kept_bounded_and_normalised() {
    let long = format!("html>body>div.{}", "é".repeat(200));
    let v = one(&with(&format!(
        r##","lcp_ms":1000,"inp_ms":200,"cls":0.25,"navigation_type":"soft-navigation",
        "lcp_target":"main>img.hero","inp_target":"{long}","cls_target":"#banner",
        "lcp_url":"HTTPS://CDN.example:443/a b.jpg#x","lcp_resource_load_delay_ms":100,
        "lcp_resource_load_duration_ms":400.5,"lcp_element_render_delay_ms":1000,
        "inp_type":"keyboard","inp_input_delay_ms":0,"inp_processing_duration_ms":150.25,
        "inp_presentation_delay_ms":49.75,"inp_script_url":"https://shop.example/app.js?v=1",
        "cls_time_ms":1500.5,"cls_value":0.25"##
    )))
    .unwrap();
    assert!(v.dropped.is_empty(), "{:?}", v.dropped);
    let m = v.measurement;
    assert_eq!(m.navigation_type.as_deref(), Some("soft_navigation"));
    assert_eq!(m.lcp_target.as_deref(), Some("main>img.hero"));
    let inp_target = m.inp_target.as_deref().unwrap();
    assert!(inp_target.len() <= MAX_SELECTOR_BYTES && inp_target.len() >= MAX_SELECTOR_BYTES - 1);
    assert!(long.starts_with(inp_target));
    assert_eq!(m.cls_target.as_deref(), Some("#banner"));
    assert_eq!(m.lcp_url.as_deref(), Some("https://cdn.example/a%20b.jpg"));
    assert_eq!(
        (
            m.lcp_resource_load_delay_ms,
            m.lcp_resource_load_duration_ms,
            m.lcp_element_render_delay_ms
        ),
        (Some(100.0), Some(400.5), Some(1000.0))
    );
    assert_eq!(m.inp_type.as_deref(), Some("keyboard"));
    assert_eq!(
        (
            m.inp_input_delay_ms,
            m.inp_processing_duration_ms,
            m.inp_presentation_delay_ms
        ),
        (Some(0.0), Some(150.25), Some(49.75))
    );
    assert_eq!(
        m.inp_script_url.as_deref(),
        Some("https://shop.example/app.js"),
        "a resource URL keeps no query (contract v4)"
    );
    assert_eq!((m.cls_time_ms, m.cls_value), (Some(1500.5), Some(0.25)));
}

/// Contract v3: an attribution field that breaks its rule is dropped and listed; the rest
/// of the measurement stays.
#[test]
fn broken_attribution_costs_only_itself() {
    let v = one(&with(
        r#","lcp_ms":1000,"inp_ms":200,"cls":0.1,"lcp_target":"","inp_target":"a\nb",
        "cls_target":7,"lcp_url":"data:image/png;base64,AAAA","lcp_resource_load_delay_ms":1000.5,
        "lcp_resource_load_duration_ms":-1,"lcp_element_render_delay_ms":"5","inp_type":"touch",
        "inp_input_delay_ms":200.01,"inp_processing_duration_ms":1e400,
        "inp_presentation_delay_ms":null,"inp_script_url":"chrome-extension://abc/x.js",
        "cls_time_ms":3600001,"cls_value":0.2"#,
    ))
    .unwrap();
    assert_eq!(
        v.dropped,
        [
            "lcp_target",
            "inp_target",
            "cls_target",
            "lcp_url",
            "lcp_resource_load_delay_ms",
            "lcp_resource_load_duration_ms",
            "lcp_element_render_delay_ms",
            "inp_type",
            "inp_input_delay_ms",
            "inp_processing_duration_ms",
            "inp_script_url",
            "cls_time_ms",
            "cls_value",
        ]
    );
    let m = v.measurement;
    assert_eq!(
        (m.lcp_ms, m.inp_ms, m.cls),
        (Some(1000.0), Some(200.0), Some(0.1))
    );
    assert_eq!(
        m.inp_presentation_delay_ms, None,
        "null is absent, not dropped"
    );
    // A selector with whitespace or an invisible format character is not one we build.
    for bad in [
        "my password is hunter2",
        "div\u{202E}.evil",
        "a\u{2028}b",
        "\u{200B}",
    ] {
        let v = one(&with(&format!(
            r#","lcp_target":{}"#,
            serde_json::to_string(bad).unwrap()
        )))
        .unwrap();
        assert_eq!(v.dropped, ["lcp_target"], "{bad:?}");
    }
    // A metric sent but dropped as invalid bounds nothing: its parts go too.
    let v = one(&with(
        r#","lcp_ms":-5,"lcp_resource_load_delay_ms":999999,"cls":"x","cls_value":0.1"#,
    ))
    .unwrap();
    assert_eq!(
        v.dropped,
        ["lcp_ms", "cls", "lcp_resource_load_delay_ms", "cls_value"]
    );
    // Without their metric, parts are bounded by the metric's own range.
    let v = one(&with(r#","lcp_resource_load_delay_ms":5000,"cls_value":2"#)).unwrap();
    assert!(v.dropped.is_empty(), "{:?}", v.dropped);
    // A part equal to its metric up to float rounding is kept.
    let v = one(&with(
        r#","lcp_ms":0.30000000000000004,"lcp_element_render_delay_ms":0.3000000000000001"#,
    ))
    .unwrap();
    assert!(v.dropped.is_empty(), "{:?}", v.dropped);
}

#[test]
fn required_fields() {
    assert_eq!(
        one(r#"{"site":"s","url":"https://a.b/"}"#),
        Err("missing id")
    );
    assert_eq!(
        one(&format!(r#"{{"id":"{ID}","url":"https://a.b/"}}"#)),
        Err("missing site")
    );
    assert_eq!(
        one(&format!(r#"{{"id":"{ID}","site":"s"}}"#)),
        Err("missing url")
    );
    assert_eq!(
        one(r#"{"id":"nope","site":"s","url":"https://a.b/"}"#),
        Err("invalid id")
    );
    assert_eq!(
        one(r#"{"id":12,"site":"s","url":"https://a.b/"}"#),
        Err("invalid id")
    );
    assert_eq!(
        one(r#"{"id":"00000000-0000-0000-0000-000000000000","site":"s","url":"https://a.b/"}"#),
        Err("invalid id")
    );
    for site in ["", "has space", "ü", &"x".repeat(65)] {
        assert_eq!(
            one(&format!(
                r#"{{"id":"{ID}","site":"{site}","url":"https://a.b/"}}"#
            )),
            Err("invalid site")
        );
    }
    for url in [
        "/relative",
        "ftp://a.b/",
        "javascript:alert(1)",
        "https://",
        &format!("https://a.b/{}", "x".repeat(2048)),
    ] {
        assert_eq!(
            one(&format!(r#"{{"id":"{ID}","site":"s","url":"{url}"}}"#)),
            Err("invalid url"),
            "{url}"
        );
    }
}

#[test]
fn id_is_stored_canonical() {
    let upper = ID.to_uppercase();
    let v = one(&format!(
        r#"{{"id":"{upper}","site":"s","url":"https://a.b/"}}"#
    ))
    .unwrap();
    assert_eq!(v.measurement.id.to_string(), ID);
}

#[test]
fn url_normalisation() {
    assert_eq!(
        normalise_url("HTTPS://User:Pw@Shop.Example:443/a b/ü?q=1#frag").unwrap(),
        "https://shop.example/a%20b/%C3%BC?q=1"
    );
    assert_eq!(
        normalise_url("https://shop.example/%C3%BC").unwrap(),
        normalise_url("https://shop.example/ü").unwrap()
    );
    assert_eq!(
        normalise_url("http://shop.example").unwrap(),
        "http://shop.example/"
    );
    assert_eq!(
        normalise_url("https://shop.example/a/../b").unwrap(),
        "https://shop.example/b"
    );
}

#[test]
fn invalid_optional_fields_are_dropped_and_listed() {
    let v = one(&with(
        r#","lcp_ms":-1,"fcp_ms":1e20,"ttfb_ms":"12","cls":101,"viewport_width":1.5,
        "navigation_type":"teleport","effective_connection_type":"5g","referrer":7,"inp_ms":3600000,
        "ts":"1779999999000""#,
    ))
    .unwrap();
    assert_eq!(
        v.dropped,
        [
            "ts",
            "referrer",
            "navigation_type",
            "ttfb_ms",
            "fcp_ms",
            "lcp_ms",
            "cls",
            "viewport_width",
            "effective_connection_type"
        ]
    );
    assert_eq!(v.measurement.lcp_ms, None);
    assert_eq!(
        v.measurement.inp_ms,
        Some(3_600_000.0),
        "the bound itself is allowed"
    );
}

#[test]
fn epoch_sized_lcp_is_dropped() {
    let v = one(&with(r#","lcp_ms":1780000000000,"fcp_ms":5"#)).unwrap();
    assert_eq!(v.dropped, ["lcp_ms"]);
    assert_eq!(v.measurement.fcp_ms, Some(5.0));
}

#[test]
fn nan_and_infinity_tokens_cost_only_their_field() {
    let v = one(&with(r#","lcp_ms":NaN,"fcp_ms":Infinity,"inp_ms":-Infinity,"referrer":"https://ref.example/NaN?Infinity","ttfb_ms":3"#)).unwrap();
    assert_eq!(v.dropped, ["fcp_ms", "lcp_ms", "inp_ms"]);
    assert_eq!(
        v.measurement.referrer.as_deref(),
        Some("https://ref.example/NaN?Infinity")
    );
    assert_eq!(v.measurement.ttfb_ms, Some(3.0));
    let v = one(&with(r#","lcp_ms":[NaN, Infinity],"navigation_type":NaN"#)).unwrap();
    assert_eq!(v.dropped, ["navigation_type", "lcp_ms"]);
    // Issue 39: a signed NaN cost the whole beacon (400, broken syntax), not its field.
    let v = one(&with(
        r#","lcp_ms":-NaN,"cls":+NaN,"fcp_ms":+Infinity,"ttfb_ms":3"#,
    ))
    .unwrap();
    assert_eq!(v.dropped, ["fcp_ms", "lcp_ms", "cls"]);
    assert_eq!(v.measurement.ttfb_ms, Some(3.0));
}

#[test]
fn null_optional_is_absent_not_dropped() {
    let v = one(&with(r#","lcp_ms":null"#)).unwrap();
    assert!(v.dropped.is_empty());
    assert_eq!(v.measurement.lcp_ms, None);
}

#[test]
fn clock_skew() {
    let ahead = one(&with(&format!(r#","ts":{}"#, NOW + MAX_TS_AHEAD_MS + 1))).unwrap();
    assert!(ahead.clock_skewed);
    assert_eq!(ahead.measurement.ts, None);
    let seconds = one(&with(&format!(r#","ts":{}"#, NOW / 1000))).unwrap();
    assert!(
        seconds.clock_skewed,
        "a ts in seconds is 1970 in milliseconds"
    );
    assert_eq!(seconds.measurement.ts, None);
    assert!(seconds.dropped.is_empty());
    let edge = one(&with(&format!(r#","ts":{}"#, NOW - MAX_TS_BEHIND_MS))).unwrap();
    assert_eq!(edge.measurement.ts, Some(NOW - MAX_TS_BEHIND_MS));
    let float = one(&with(r#","ts":1.5"#)).unwrap();
    assert_eq!(float.dropped, ["ts"]);
}

/// Two sends of one beacon whose `ts` is minutes ahead of the first receipt and within the
/// skew bound at the second (a client clock a little more than 5 minutes fast): the first
/// stores `ts` as NULL (skewed) and the second keeps it, yet both file the page view at
/// `ts`, so they share the day and partition and fold. Beyond a day ahead, the receipt files.
#[test]
fn a_ts_files_the_page_view_whether_or_not_it_is_stored() {
    let at = |ts: i64, received_at_ms: i64| {
        let text = text(with(&format!(r#","ts":{ts}"#)).into_bytes().as_slice()).into_owned();
        let item = parse(&text).expect("parses").remove(0);
        let ctx = Context {
            received_at_ms,
            ..ctx()
        };
        let v = validate(item, &ctx).unwrap();
        (v.ts, v.page_view_at, v.clock_skewed)
    };
    let ts = NOW + MAX_TS_AHEAD_MS + 20_000;
    let first = at(ts, NOW);
    let resend = at(ts, NOW + 30_000);
    assert_eq!(first, (None, DateTime((ts / 1000) as u32), true));
    assert_eq!(resend, (Some(ts), DateTime((ts / 1000) as u32), false));
    let far = NOW + FILING_MAX_AHEAD_MS + 1;
    assert_eq!(at(far, NOW), (None, DateTime((NOW / 1000) as u32), true));
    let old = NOW - MAX_TS_BEHIND_MS - 1;
    assert_eq!(at(old, NOW), (None, DateTime((NOW / 1000) as u32), true));
}

/// Issue 13, kind 1: a fault that JSON parsers report inside one value (beyond f64, a lone
/// surrogate escape) costs that field, or the measurement if the field is required.
#[test]
fn a_fault_inside_a_value_costs_only_its_field() {
    let v = one(&with(
        r#","lcp_ms":1e400,"cls":-1e400,"referrer":"https://ref.example/q=\ud83d","fcp_ms":7,
        "effective_connection_type":"\udc00","ts":1e400"#,
    ))
    .unwrap();
    assert_eq!(
        v.dropped,
        [
            "ts",
            "referrer",
            "lcp_ms",
            "cls",
            "effective_connection_type"
        ]
    );
    assert_eq!(v.measurement.fcp_ms, Some(7.0));
    assert_eq!(v.measurement.url, "https://shop.example/p?x=1");
    assert_eq!(
        one(&format!(
            r#"{{"id":"{ID}","site":"s","url":"https://a.example/\ud83d"}}"#
        )),
        Err("invalid url"),
        "a required field with a fault rejects its measurement"
    );
    assert_eq!(
        one(&format!(
            r#"{{"id":"{ID}","site":"s\ud83d","url":"https://a.b/"}}"#
        )),
        Err("invalid site")
    );
    // A paired surrogate is a character, not a fault.
    let v = one(&with(r#","referrer":"https://ref.example/\ud83d\ude00""#)).unwrap();
    assert_eq!(
        v.measurement.referrer.as_deref(),
        Some("https://ref.example/%F0%9F%98%80")
    );
}

/// Issue 13, kind 1: a duplicated key takes its last value, as `JSON.parse` does.
#[test]
fn a_duplicated_key_takes_its_last_value() {
    let v = one(&with(
        r#","lcp_ms":1,"lcp_ms":2,"url":"https://shop.example/last""#,
    ))
    .unwrap();
    assert_eq!(v.measurement.lcp_ms, Some(2.0));
    assert_eq!(v.measurement.url, "https://shop.example/last");
    let v = one(&with(r#","fcp_ms":"bad","fcp_ms":3"#)).unwrap();
    assert!(v.dropped.is_empty(), "the first value is forgotten");
    assert_eq!(v.measurement.fcp_ms, Some(3.0));
}

/// Issue 13, kind 2: only objects are measurements.
#[test]
fn only_objects_are_measurements() {
    let body = format!(
        r#"[["{ID}","shop-1","https://shop.example/"], {}, "x", 1, null, true]"#,
        with("")
    );
    let text = text(body.as_bytes());
    let items = parse(&text).unwrap();
    let results: Vec<_> = items
        .into_iter()
        .map(|i| validate(i, &ctx()).map(|v| v.site.into_owned()))
        .collect();
    assert_eq!(
        results,
        [
            Err("not a measurement object"),
            Ok("shop-1".to_owned()),
            Err("not a measurement object"),
            Err("not a measurement object"),
            Err("not a measurement object"),
            Err("not a measurement object"),
        ]
    );
}

/// Issue 13, kind 3: JavaScript has one number type; an integral float is an integer.
#[test]
fn integer_fields_take_integral_floats() {
    let v = one(&with(&format!(
        r#","viewport_width":1280.0,"ts":{}.0"#,
        NOW - 1000
    )))
    .unwrap();
    assert_eq!(v.measurement.viewport_width, Some(1280));
    assert_eq!(v.measurement.ts, Some(NOW - 1000));
    assert!(v.dropped.is_empty());
    assert_eq!(
        one(&with(r#","viewport_width":1.28e3"#))
            .unwrap()
            .measurement
            .viewport_width,
        Some(1280)
    );
    let v = one(&with(r#","viewport_width":1280.5"#)).unwrap();
    assert_eq!(v.dropped, ["viewport_width"]);
    let v = one(&with(r#","viewport_width":100001"#)).unwrap();
    assert_eq!(v.dropped, ["viewport_width"]);
}

/// Issue 13, kind 5: the referrer follows the rules of `url`.
#[test]
fn referrer_follows_the_url_rules() {
    let stored = |r: &str| {
        let v = one(&with(&format!(
            r#","referrer":{}"#,
            serde_json::to_string(r).unwrap()
        )))
        .unwrap();
        (v.measurement.referrer.map(|r| r.into_owned()), v.dropped)
    };
    assert_eq!(
        stored("https://user:secret@Ref.Example/x#frag"),
        (Some("https://ref.example/x".to_owned()), vec![])
    );
    assert_eq!(
        stored("https://ref.example/ü"),
        (Some("https://ref.example/%C3%BC".to_owned()), vec![])
    );
    for bad in [
        "javascript:alert(1)",
        "data:text/html,x",
        "ftp://ref.example/",
        "/relative",
        "",
        &format!("https://ref.example/{}", "x".repeat(2048)),
    ] {
        assert_eq!(stored(bad), (None, vec!["referrer"]), "{bad}");
    }
}

/// Issue 13, kind 10: the web-vitals library's spellings, and `back_forward_cache`.
#[test]
fn navigation_type_spellings() {
    for (sent, kept) in [
        ("back-forward", "back_forward"),
        ("back-forward-cache", "back_forward_cache"),
        ("back_forward_cache", "back_forward_cache"),
        ("back_forward", "back_forward"),
        ("prerender", "prerender"),
        ("restore", "restore"),
    ] {
        let v = one(&with(&format!(r#","navigation_type":"{sent}""#))).unwrap();
        assert_eq!(
            v.measurement.navigation_type.as_deref(),
            Some(kept),
            "{sent}"
        );
    }
    for bad in ["Navigate", "back forward", "bfcache"] {
        let v = one(&with(&format!(r#","navigation_type":"{bad}""#))).unwrap();
        assert_eq!(v.dropped, ["navigation_type"], "{bad}");
    }
}

/// Issue 13, kind 11: the 2048-byte limit applies to the stored form only.
#[test]
fn url_limit_applies_to_the_stored_form() {
    let long_fragment = format!("https://shop.example/p#{}", "f".repeat(5000));
    assert_eq!(
        normalise_url(&long_fragment).as_deref(),
        Some("https://shop.example/p")
    );
    let exact = format!("https://shop.example/{}", "x".repeat(2048 - 21));
    assert_eq!(normalise_url(&exact).map(|u| u.len()), Some(2048));
    let over = format!("https://shop.example/{}", "x".repeat(2048 - 20));
    assert_eq!(normalise_url(&over), None);
    // Growing by normalisation counts: each ü is stored as 6 bytes.
    let grows = format!("https://shop.example/{}", "ü".repeat(400));
    assert!(grows.len() < 2048);
    assert_eq!(normalise_url(&grows), None);
}

/// Issue 13, kind 4: a header byte outside ASCII is kept, as UTF-8 (lossy).
#[test]
fn user_agent_is_lossy_utf8_cut_at_512_bytes() {
    assert_eq!(user_agent(None), "");
    assert_eq!(user_agent(Some(b"Mozilla/5.0 (X11)")), "Mozilla/5.0 (X11)");
    assert_eq!(
        user_agent(Some(b"Caf\xe9 Browser/1")),
        "Caf\u{FFFD} Browser/1"
    );
    assert_eq!(user_agent(Some("Café/1".as_bytes())), "Café/1");
    let mut long = vec![b'a'; 511];
    long.extend_from_slice("é".as_bytes());
    assert_eq!(
        user_agent(Some(&long)),
        "a".repeat(511),
        "cut on a char boundary"
    );
    let long = [b'a'; 2000];
    assert_eq!(user_agent(Some(&long)).len(), MAX_USER_AGENT_BYTES);
    let mut invalid_first = vec![0xff];
    invalid_first.extend_from_slice(&[b'a'; 600]);
    let ua = user_agent(Some(&invalid_first));
    assert_eq!(ua.len(), 512);
    assert!(ua.starts_with('\u{FFFD}'));
}

#[test]
fn user_agent_is_truncated_on_a_char_boundary() {
    assert_eq!(truncate("aé", 2), "a");
    assert_eq!(truncate("abc", 5), "abc");
}
