//! Beacon decoding and validation: request body bytes in, [`Measurement`]s out.
//!
//! Pure functions with no I/O, so every rule of the contract (§2, `POST /api/v1/measurements`)
//! is unit-tested here:
//! - the body is one measurement object or an array of at most [`MAX_BATCH`] of them;
//! - a leading UTF-8 byte-order mark is skipped; bytes after the JSON value are malformed;
//! - gzip is inflated with the [`MAX_BODY_BYTES`] limit enforced while inflating, so a gzip
//!   bomb costs at most that much memory;
//! - a missing or invalid required field rejects that measurement; an invalid optional field
//!   is dropped and listed, and the rest of the measurement is kept.

use std::borrow::Cow;
use std::io::Read;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use url::Url;
use uuid::Uuid;

use crate::measurement::{Measurement, MAX_USER_AGENT_BYTES};

/// Largest accepted body, in bytes, after decompression (contract §2: 64 KiB).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Most measurements in one array body (contract §2).
pub const MAX_BATCH: usize = 50;
/// Longest stored `url` and `referrer`, in bytes (contract §2).
pub const MAX_URL_BYTES: usize = 2048;
/// Upper bound of every `*_ms` metric: one hour, in milliseconds (contract §2).
pub const MAX_MS: f64 = 3_600_000.0;
/// Upper bound of `cls` (contract §2).
pub const MAX_CLS: f64 = 100.0;
/// Upper bound of `viewport_width`, CSS pixels (contract §2).
pub const MAX_VIEWPORT_WIDTH: u64 = 100_000;
/// A `ts` this far ahead of `received_at` is skewed: 5 minutes, in milliseconds (contract §2).
pub const MAX_TS_AHEAD_MS: i64 = 5 * 60 * 1000;
/// A `ts` this far behind `received_at` is skewed: 7 days, in milliseconds (contract §2).
pub const MAX_TS_BEHIND_MS: i64 = 7 * 24 * 60 * 60 * 1000;

/// Allowed `navigation_type` values: the Navigation Timing `type` values plus `prerender`
/// and `restore` (bfcache), as used by the `web-vitals` library.
pub const NAVIGATION_TYPES: [&str; 5] =
    ["navigate", "reload", "back_forward", "prerender", "restore"];
/// Allowed `effective_connection_type` values (Network Information API, WICG).
pub const CONNECTION_TYPES: [&str; 4] = ["slow-2g", "2g", "3g", "4g"];

/// Why a body could not be decoded at all. Each maps to one HTTP status in `error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// More than [`MAX_BODY_BYTES`] (after inflating): 413.
    #[error("body larger than {MAX_BODY_BYTES} bytes")]
    TooLarge,
    /// Not valid JSON, empty, trailing bytes, broken gzip, more than [`MAX_BATCH`]: 400.
    #[error("{0}")]
    Malformed(String),
}

/// Content-Encoding of a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// No encoding (`identity` or absent).
    Identity,
    /// `gzip` (RFC 1952).
    Gzip,
}

/// Judges the `Content-Type` header: `application/json`, `text/plain` (what
/// `navigator.sendBeacon` sends for a string) or none are accepted, whatever their parameters.
pub fn content_type_ok(value: Option<&[u8]>) -> bool {
    let Some(value) = value else { return true };
    let Ok(value) = std::str::from_utf8(value) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json") || essence.eq_ignore_ascii_case("text/plain")
}

/// Judges the `Content-Encoding` header; `None` for an unsupported one (415).
pub fn encoding(value: Option<&[u8]>) -> Option<Encoding> {
    let Some(value) = value else {
        return Some(Encoding::Identity);
    };
    let value = std::str::from_utf8(value).ok()?.trim();
    if value.is_empty() || value.eq_ignore_ascii_case("identity") {
        Some(Encoding::Identity)
    } else if value.eq_ignore_ascii_case("gzip") || value.eq_ignore_ascii_case("x-gzip") {
        Some(Encoding::Gzip)
    } else {
        None
    }
}

/// Inflates a body if needed, never producing more than [`MAX_BODY_BYTES`].
pub fn inflate(body: &[u8], encoding: Encoding) -> Result<Cow<'_, [u8]>, DecodeError> {
    match encoding {
        Encoding::Identity if body.len() > MAX_BODY_BYTES => Err(DecodeError::TooLarge),
        Encoding::Identity => Ok(Cow::Borrowed(body)),
        Encoding::Gzip => {
            let mut out = Vec::with_capacity((body.len() * 4).min(MAX_BODY_BYTES + 1));
            // `take` stops the decoder one byte past the limit: a bomb never inflates further.
            flate2::read::MultiGzDecoder::new(body)
                .take(MAX_BODY_BYTES as u64 + 1)
                .read_to_end(&mut out)
                .map_err(|e| DecodeError::Malformed(format!("invalid gzip body: {e}")))?;
            if out.len() > MAX_BODY_BYTES {
                return Err(DecodeError::TooLarge);
            }
            Ok(Cow::Owned(out))
        }
    }
}

/// One element of a body, with every known field left untyped so that a wrong type in an
/// optional field costs only that field. Unknown fields are ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct RawBeacon {
    id: Option<Value>,
    site: Option<Value>,
    url: Option<Value>,
    ts: Option<Value>,
    referrer: Option<Value>,
    navigation_type: Option<Value>,
    ttfb_ms: Option<Value>,
    fcp_ms: Option<Value>,
    lcp_ms: Option<Value>,
    inp_ms: Option<Value>,
    dom_content_loaded_ms: Option<Value>,
    load_ms: Option<Value>,
    cls: Option<Value>,
    viewport_width: Option<Value>,
    effective_connection_type: Option<Value>,
}

/// A decoded body element: a beacon object, or the reason it is not one.
pub type Item = Result<RawBeacon, &'static str>;

/// Parses a (decompressed) body into at most [`MAX_BATCH`] items.
///
/// Errors: empty body, invalid JSON, trailing bytes, a top level that is neither object nor
/// array, an empty array, or more than [`MAX_BATCH`] elements.
pub fn parse(body: &[u8]) -> Result<Vec<Item>, DecodeError> {
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(DecodeError::Malformed("empty body".into()));
    }
    let top = match serde_json::from_slice::<Top>(body) {
        Ok(top) => top,
        Err(first) => {
            // `JSON.stringify` never emits NaN or Infinity, but other clients (Python's json
            // module by default) do. Read them as strings so that they cost only their field.
            match non_finite_as_strings(body) {
                Some(fixed) => {
                    serde_json::from_slice::<Top>(&fixed).map_err(|_| malformed(first))?
                }
                None => return Err(malformed(first)),
            }
        }
    };
    match top {
        Top::One(beacon) => Ok(vec![Ok(*beacon)]),
        Top::Many(items) if items.is_empty() => Err(DecodeError::Malformed("empty array".into())),
        Top::Many(items) => Ok(items),
        Top::TooMany => Err(DecodeError::Malformed(format!(
            "more than {MAX_BATCH} measurements"
        ))),
    }
}

fn malformed(e: serde_json::Error) -> DecodeError {
    DecodeError::Malformed(format!("invalid JSON: {e}"))
}

/// The top-level value of a body.
enum Top {
    One(Box<RawBeacon>),
    Many(Vec<Item>),
    TooMany,
}

impl<'de> Deserialize<'de> for Top {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TopVisitor;
        impl<'de> Visitor<'de> for TopVisitor {
            type Value = Top;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a measurement object or an array of them")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Top, A::Error> {
                RawBeacon::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(|b| Top::One(Box::new(b)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Top, A::Error> {
                let mut items = Vec::new();
                while let Some(raw) = seq.next_element::<&'de RawValue>()? {
                    if items.len() == MAX_BATCH {
                        // Still consume the rest so that trailing garbage is reported first.
                        while seq.next_element::<de::IgnoredAny>()?.is_some() {}
                        return Ok(Top::TooMany);
                    }
                    items.push(
                        serde_json::from_str::<RawBeacon>(raw.get())
                            .map_err(|_| "not a measurement object"),
                    );
                }
                Ok(Top::Many(items))
            }
        }
        d.deserialize_any(TopVisitor)
    }
}

/// Rewrites bare `NaN`, `Infinity` and `-Infinity` tokens outside strings as JSON strings.
/// Returns `None` when there is none, so that the original parse error stands.
fn non_finite_as_strings(body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(body.len() + 16);
    let (mut in_string, mut escaped, mut changed, mut i) = (false, false, false, 0);
    // Open containers, and the last significant byte: a token is only rewritten in value
    // position (after `:`, `[`, or `,` inside an array), never as an object key.
    let mut containers = Vec::new();
    let mut last = 0u8;
    while i < body.len() {
        let b = body[i];
        if in_string {
            out.push(b);
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => {
                    in_string = false;
                    last = b'"';
                }
                _ => {}
            }
            i += 1;
            continue;
        }
        let rest = &body[i..];
        let value_position =
            last == b':' || last == b'[' || (last == b',' && containers.last() == Some(&b'['));
        if let Some(token) = [&b"-Infinity"[..], b"Infinity", b"NaN"]
            .into_iter()
            .find(|t| value_position && rest.starts_with(t))
        {
            out.push(b'"');
            out.extend_from_slice(token);
            out.push(b'"');
            i += token.len();
            changed = true;
            last = b'"';
            continue;
        }
        match b {
            b'{' | b'[' => containers.push(b),
            b'}' | b']' => {
                containers.pop();
            }
            _ => {}
        }
        if !b.is_ascii_whitespace() {
            last = b;
        }
        in_string = b == b'"';
        out.push(b);
        i += 1;
    }
    changed.then_some(out)
}

/// Request context a measurement is completed with.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// Server receive time, milliseconds since the Unix epoch.
    pub received_at_ms: i64,
    /// The request's `User-Agent` header, if any and valid UTF-8.
    pub user_agent: &'a str,
}

/// A measurement that passed validation, with what was dropped on the way.
#[derive(Debug, Clone, PartialEq)]
pub struct Valid {
    /// The row to store.
    pub measurement: Measurement,
    /// Names of the optional fields that were present but invalid, and dropped.
    pub dropped: Vec<&'static str>,
    /// Whether a present `ts` was outside the accepted skew and stored as NULL.
    pub clock_skewed: bool,
}

/// Why a measurement was rejected; the `&'static str` is the error listed in `rejected`
/// and the `reason` label of `collector_measurements_rejected_total`.
pub type Rejection = &'static str;

/// Validates one body element against the field rules of the contract (§2).
///
/// Errors (rejections): `not a measurement object`, `missing id`, `invalid id`, `missing site`,
/// `invalid site`, `missing url`, `invalid url`.
pub fn validate(item: Item, ctx: &Context<'_>) -> Result<Valid, Rejection> {
    let raw = item?;
    let id = match raw.id {
        None => return Err("missing id"),
        Some(Value::String(s)) => match Uuid::try_parse(&s) {
            Ok(id) if !id.is_nil() => id,
            _ => return Err("invalid id"),
        },
        Some(_) => return Err("invalid id"),
    };
    let site = match raw.site {
        None => return Err("missing site"),
        Some(Value::String(s)) if is_site_key(&s) => s,
        Some(_) => return Err("invalid site"),
    };
    let url = match raw.url {
        None => return Err("missing url"),
        Some(Value::String(s)) => normalise_url(&s).ok_or("invalid url")?,
        Some(_) => return Err("invalid url"),
    };

    let mut dropped = Vec::new();
    let mut field = |name: &'static str, value: Option<Value>, check: &dyn Fn(&Value) -> bool| {
        let value = value?;
        if check(&value) {
            Some(value)
        } else {
            dropped.push(name);
            None
        }
    };
    let ms = |v: &Value| {
        v.as_f64()
            .is_some_and(|x| x.is_finite() && (0.0..=MAX_MS).contains(&x))
    };
    let short_string = |v: &Value| v.as_str().is_some_and(|s| s.len() <= MAX_URL_BYTES);
    let one_of = |allowed: &'static [&'static str]| {
        move |v: &Value| v.as_str().is_some_and(|s| allowed.contains(&s))
    };
    let f64_of = |v: Option<Value>| v.and_then(|v| v.as_f64());
    let string_of = |v: Option<Value>| match v {
        Some(Value::String(s)) => Some(s),
        _ => None,
    };

    let ts = field("ts", raw.ts, &|v| v.as_i64().is_some()).and_then(|v| v.as_i64());
    let referrer = string_of(field("referrer", raw.referrer, &short_string));
    let navigation_type = string_of(field(
        "navigation_type",
        raw.navigation_type,
        &one_of(&NAVIGATION_TYPES),
    ));
    let ttfb_ms = f64_of(field("ttfb_ms", raw.ttfb_ms, &ms));
    let fcp_ms = f64_of(field("fcp_ms", raw.fcp_ms, &ms));
    let lcp_ms = f64_of(field("lcp_ms", raw.lcp_ms, &ms));
    let inp_ms = f64_of(field("inp_ms", raw.inp_ms, &ms));
    let dom_content_loaded_ms = f64_of(field(
        "dom_content_loaded_ms",
        raw.dom_content_loaded_ms,
        &ms,
    ));
    let load_ms = f64_of(field("load_ms", raw.load_ms, &ms));
    let cls = f64_of(field("cls", raw.cls, &|v| {
        v.as_f64()
            .is_some_and(|x| x.is_finite() && (0.0..=MAX_CLS).contains(&x))
    }));
    let viewport_width = field("viewport_width", raw.viewport_width, &|v| {
        v.as_u64().is_some_and(|x| x <= MAX_VIEWPORT_WIDTH)
    })
    .and_then(|v| v.as_u64())
    .map(|x| x as u32);
    let effective_connection_type = string_of(field(
        "effective_connection_type",
        raw.effective_connection_type,
        &one_of(&CONNECTION_TYPES),
    ));

    let skewed = |t: i64| {
        t > ctx.received_at_ms.saturating_add(MAX_TS_AHEAD_MS)
            || t < ctx.received_at_ms.saturating_sub(MAX_TS_BEHIND_MS)
    };
    let clock_skewed = ts.is_some_and(skewed);
    let ts = ts.filter(|t| !skewed(*t));

    Ok(Valid {
        measurement: Measurement {
            id,
            site,
            received_at: (ctx.received_at_ms.max(0) / 1000).min(u32::MAX as i64) as u32,
            url,
            ts,
            referrer,
            navigation_type,
            ttfb_ms,
            fcp_ms,
            lcp_ms,
            inp_ms,
            dom_content_loaded_ms,
            load_ms,
            cls,
            viewport_width,
            effective_connection_type,
            user_agent: truncate(ctx.user_agent, MAX_USER_AGENT_BYTES).to_owned(),
        },
        dropped,
        clock_skewed,
    })
}

/// A site key: an opaque, case-sensitive string of 1 to 64 characters from `A-Za-z0-9._-`
/// (contract §2).
pub fn is_site_key(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Normalises a page URL by the WHATWG URL Standard (the `url` crate implements it), so that
/// a raw UTF-8 path and its percent-encoded form are one URL; drops the fragment and any
/// `user:password@`. `None` unless it is an absolute `http`/`https` URL with a host and both
/// its given and normalised forms fit [`MAX_URL_BYTES`].
pub fn normalise_url(s: &str) -> Option<String> {
    if s.len() > MAX_URL_BYTES {
        return None;
    }
    let mut url = Url::parse(s).ok()?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return None;
    }
    url.set_fragment(None);
    url.set_username("").ok()?;
    url.set_password(None).ok()?;
    let url: String = url.into();
    (url.len() <= MAX_URL_BYTES).then_some(url)
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const NOW: i64 = 1_780_000_000_000;
    const ID: &str = "7f1c2a3e-9b4d-4c6e-8f00-123456789abc";

    fn ctx() -> Context<'static> {
        Context {
            received_at_ms: NOW,
            user_agent: "UA/1.0",
        }
    }

    fn one(json: &str) -> Result<Valid, Rejection> {
        let mut items = parse(json.as_bytes()).expect("parses");
        assert_eq!(items.len(), 1);
        validate(items.remove(0), &ctx())
    }

    fn with(extra: &str) -> String {
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
        assert_eq!(m.received_at, (NOW / 1000) as u32);
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
            "navigation_type":"teleport","effective_connection_type":"5g","referrer":7,"inp_ms":3600000"#,
        ))
        .unwrap();
        assert_eq!(
            v.dropped,
            [
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
        let v = one(&with(r#","lcp_ms":NaN,"fcp_ms":Infinity,"inp_ms":-Infinity,"referrer":"NaN in a string","ttfb_ms":3"#)).unwrap();
        assert_eq!(v.dropped, ["fcp_ms", "lcp_ms", "inp_ms"]);
        assert_eq!(v.measurement.referrer.as_deref(), Some("NaN in a string"));
        assert_eq!(v.measurement.ttfb_ms, Some(3.0));
        let arr = parse(b"[{\"lcp_ms\":[NaN, Infinity]}]").unwrap();
        assert_eq!(arr.len(), 1);
        // Not in value position: the body stays malformed.
        assert!(matches!(
            parse(b"{\"a\":1,NaN:1}"),
            Err(DecodeError::Malformed(_))
        ));
        assert!(matches!(parse(b"{NaN:1}"), Err(DecodeError::Malformed(_))));
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

    #[test]
    fn body_shapes() {
        assert_eq!(parse(b"\xEF\xBB\xBF{}").unwrap().len(), 1);
        assert_eq!(parse(b"[{},{}]").unwrap().len(), 2);
        assert!(matches!(parse(b""), Err(DecodeError::Malformed(_))));
        assert!(matches!(parse(b"  \n"), Err(DecodeError::Malformed(_))));
        assert!(matches!(parse(b"[]"), Err(DecodeError::Malformed(_))));
        assert!(matches!(parse(b"{} x"), Err(DecodeError::Malformed(_))));
        assert!(matches!(parse(b"{}{}"), Err(DecodeError::Malformed(_))));
        assert!(matches!(parse(b"{\"a\":"), Err(DecodeError::Malformed(_))));
        assert!(matches!(parse(b"42"), Err(DecodeError::Malformed(_))));
        assert!(matches!(parse(b"\"x\""), Err(DecodeError::Malformed(_))));
        assert!(
            parse(b"{} \n").is_ok(),
            "trailing whitespace is not garbage"
        );
        let items = parse(b"[{}, 3, \"x\"]").unwrap();
        assert!(items[0].is_ok());
        assert_eq!(items[1].as_ref().unwrap_err(), &"not a measurement object");
        let fifty = format!("[{}]", vec!["{}"; MAX_BATCH].join(","));
        assert_eq!(parse(fifty.as_bytes()).unwrap().len(), MAX_BATCH);
        let fifty_one = format!("[{}]", vec!["{}"; MAX_BATCH + 1].join(","));
        assert!(matches!(
            parse(fifty_one.as_bytes()),
            Err(DecodeError::Malformed(_))
        ));
    }

    #[test]
    fn headers() {
        assert!(content_type_ok(None));
        assert!(content_type_ok(Some(b"application/json")));
        assert!(content_type_ok(Some(b"text/plain;charset=UTF-8")));
        assert!(content_type_ok(Some(b"Application/JSON ; charset=utf-8")));
        assert!(!content_type_ok(Some(b"application/x-www-form-urlencoded")));
        assert!(!content_type_ok(Some(b"multipart/form-data; boundary=x")));
        assert_eq!(encoding(None), Some(Encoding::Identity));
        assert_eq!(encoding(Some(b"gzip")), Some(Encoding::Gzip));
        assert_eq!(encoding(Some(b"br")), None);
        assert_eq!(encoding(Some(b"deflate")), None);
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn gzip_limits() {
        let body = with("");
        assert_eq!(
            &*inflate(&gzip(body.as_bytes()), Encoding::Gzip).unwrap(),
            body.as_bytes()
        );
        let bomb = gzip(&vec![b' '; 50 * 1024 * 1024]);
        assert!(bomb.len() < MAX_BODY_BYTES);
        assert_eq!(inflate(&bomb, Encoding::Gzip), Err(DecodeError::TooLarge));
        let exact = gzip(&vec![b' '; MAX_BODY_BYTES]);
        assert_eq!(
            inflate(&exact, Encoding::Gzip).unwrap().len(),
            MAX_BODY_BYTES
        );
        let full = gzip(body.as_bytes());
        assert!(matches!(
            inflate(&full[..full.len() - 6], Encoding::Gzip),
            Err(DecodeError::Malformed(_))
        ));
        assert!(matches!(
            inflate(b"not gzip", Encoding::Gzip),
            Err(DecodeError::Malformed(_))
        ));
        assert_eq!(
            inflate(&vec![b' '; MAX_BODY_BYTES + 1], Encoding::Identity),
            Err(DecodeError::TooLarge)
        );
    }

    #[test]
    fn user_agent_is_truncated_on_a_char_boundary() {
        assert_eq!(truncate("aé", 2), "a");
        assert_eq!(truncate("abc", 5), "abc");
    }
}
