//! Beacon decoding and validation: request body bytes in, [`Measurement`]s out.
//!
//! Pure functions with no I/O, so every rule of the contract (§2, `POST /api/v1/measurements`)
//! is unit-tested here:
//! - [`media`]: the content type and coding, and gzip inflated with the [`MAX_BODY_BYTES`]
//!   limit enforced while inflating, so a gzip bomb costs at most that much memory;
//! - [`decode`]: the body as `JSON.parse` reads it, one object or an array of at most
//!   [`MAX_BATCH`], each field kept undecoded so that a fault inside one value (beyond f64, a
//!   lone surrogate) costs only that field;
//! - [`validate`]: a missing or invalid required field rejects that measurement; an invalid
//!   optional field is dropped and listed, and the rest of the measurement is kept.

pub mod decode;
pub mod media;

use std::borrow::Cow;

use serde_json::value::RawValue;
use url::Url;
use uuid::Uuid;

use crate::measurement::{page_view_at, DateTime, Label, Measurement, MAX_USER_AGENT_BYTES};
pub use decode::{parse, text, Field, Item, RawBeacon};
pub use media::{content_type_ok, encoding, inflate, Encoding};

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
pub const MAX_VIEWPORT_WIDTH: i64 = 100_000;
/// A `ts` this far ahead of `received_at` is skewed: 5 minutes, in milliseconds (contract §2).
pub const MAX_TS_AHEAD_MS: i64 = 5 * 60 * 1000;
pub use crate::measurement::{FILING_MAX_AHEAD_MS, MAX_TS_BEHIND_MS};

/// Stored `navigation_type` values (contract §2): the Navigation Timing `type` values plus
/// `back_forward_cache`, `prerender`, `restore` and (v3) `soft_navigation`, as the
/// `web-vitals` library reports them.
pub const NAVIGATION_TYPES: [&str; 7] = [
    "navigate",
    "reload",
    "back_forward",
    "back_forward_cache",
    "prerender",
    "restore",
    "soft_navigation",
];
/// Spellings of the `web-vitals` library (its `navigationType`) and what is stored for them.
pub const NAVIGATION_TYPE_ALIASES: [(&str, &str); 3] = [
    ("back-forward", "back_forward"),
    ("back-forward-cache", "back_forward_cache"),
    ("soft-navigation", "soft_navigation"),
];
/// Longest stored `lcp_target`, `inp_target` and `cls_target`, in bytes (contract §2 v3); a
/// longer selector is cut at a character boundary (its start, the element's nearest id or
/// ancestors, still tells where it is).
pub const MAX_SELECTOR_BYTES: usize = 256;
/// Allowed `inp_type` values (contract §2 v3; web-vitals' `interactionType`).
pub const INP_TYPES: [&str; 2] = ["pointer", "keyboard"];
/// Allowed `effective_connection_type` values (Network Information API, WICG).
pub const CONNECTION_TYPES: [&str; 4] = ["slow-2g", "2g", "3g", "4g"];

/// Why a body could not be decoded at all. Each maps to one HTTP status in `error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// More than [`MAX_BODY_BYTES`] (after inflating): 413.
    #[error("body larger than {MAX_BODY_BYTES} bytes")]
    TooLarge,
    /// Broken JSON syntax, empty, trailing bytes, broken gzip, more than [`MAX_BATCH`]: 400.
    #[error("{0}")]
    Malformed(String),
}

/// Request context a measurement is completed with.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// Server receive time, milliseconds since the Unix epoch.
    pub received_at_ms: i64,
    /// The user agent as stored ([`user_agent`]).
    pub user_agent: &'a str,
    /// What the user agent says ([`crate::useragent`]).
    pub agent: &'a crate::useragent::Agent,
}

/// A measurement that passed validation, with what was dropped on the way. It borrows its
/// strings from the request body and headers where it can (`'a`).
#[derive(Debug, Clone, PartialEq)]
pub struct Valid<'a> {
    /// The row to store. Its `sample_rate` is 1 until intake sets the site's.
    pub measurement: Measurement<'a>,
    /// Names of the optional fields that were present but invalid, and dropped.
    pub dropped: Vec<&'static str>,
    /// Whether a present `ts` was outside the accepted skew and stored as NULL.
    pub clock_skewed: bool,
}

/// Why a measurement was rejected; the `&'static str` is the error listed in `rejected`
/// and the `reason` label of `collector_measurements_rejected_total`.
pub type Rejection = &'static str;

/// The rejection of a measurement whose site is not registered or is disabled.
pub const UNKNOWN_SITE: Rejection = "unknown or disabled site";

/// Every [`Rejection`] intake can give: the `reason` values of
/// `collector_measurements_rejected_total`, each exported from the start at 0.
pub const REJECTION_REASONS: [Rejection; 8] = [
    "not a measurement object",
    "missing id",
    "invalid id",
    "missing site",
    "invalid site",
    "missing url",
    "invalid url",
    UNKNOWN_SITE,
];

/// The optional fields, dropped one by one when invalid: the `field` values of
/// `collector_measurements_field_dropped_total`, each exported from the start at 0.
pub const OPTIONAL_FIELDS: [&str; 26] = [
    "ts",
    "referrer",
    "navigation_type",
    "ttfb_ms",
    "fcp_ms",
    "lcp_ms",
    "inp_ms",
    "dom_content_loaded_ms",
    "load_ms",
    "cls",
    "viewport_width",
    "effective_connection_type",
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
    "inp_presentation_delay_ms",
    "inp_script_url",
    "cls_time_ms",
    "cls_value",
];

/// Validates one body element against the field rules of the contract (§2).
///
/// Errors (rejections): `not a measurement object`, `missing id`, `invalid id`, `missing site`,
/// `invalid site`, `missing url`, `invalid url`.
pub fn validate<'a>(item: Item<'a>, ctx: &Context<'a>) -> Result<Valid<'a>, Rejection> {
    let raw = item?;
    let id = required(raw.id, "missing id", "invalid id")?;
    let id = match Uuid::try_parse(&id) {
        Ok(id) if !id.is_nil() => id,
        _ => return Err("invalid id"),
    };
    let site = required(raw.site, "missing site", "invalid site")?;
    if !is_site_key(&site) {
        return Err("invalid site");
    }
    let url = required(raw.url, "missing url", "invalid url")?;
    let url = normalise_url(&url).ok_or("invalid url")?;

    let mut dropped = Dropped(Vec::new());
    let integer = |value: Option<&RawValue>| value.map_or(Field::Absent, decode::integer);
    let number = |value: Option<&RawValue>, max: f64| {
        value
            .map_or(Field::Absent, decode::number)
            .check(|x| (0.0..=max).contains(x))
    };

    let ts = dropped.keep("ts", integer(raw.ts));
    let referrer = dropped.keep(
        "referrer",
        optional_text(raw.referrer).then(|r| normalise_url(&r)),
    );
    let navigation_type = dropped.keep(
        "navigation_type",
        optional_text(raw.navigation_type).then(|t| navigation_type(&t)),
    );
    let ttfb_ms = dropped.keep("ttfb_ms", number(raw.ttfb_ms, MAX_MS));
    let fcp_ms = dropped.keep("fcp_ms", number(raw.fcp_ms, MAX_MS));
    let lcp_ms = dropped.keep("lcp_ms", number(raw.lcp_ms, MAX_MS));
    let inp_ms = dropped.keep("inp_ms", number(raw.inp_ms, MAX_MS));
    let dom_content_loaded_ms = dropped.keep(
        "dom_content_loaded_ms",
        number(raw.dom_content_loaded_ms, MAX_MS),
    );
    let load_ms = dropped.keep("load_ms", number(raw.load_ms, MAX_MS));
    let cls = dropped.keep("cls", number(raw.cls, MAX_CLS));
    let viewport_width = dropped
        .keep(
            "viewport_width",
            integer(raw.viewport_width).check(|x| (0..=MAX_VIEWPORT_WIDTH).contains(x)),
        )
        .map(|x| x as u32);
    let effective_connection_type = dropped.keep(
        "effective_connection_type",
        optional_text(raw.effective_connection_type).check(|t| CONNECTION_TYPES.contains(&&**t)),
    );
    // Attribution (v3): a part or phase within its metric; without the metric, within the
    // metric's own bound; with the metric sent but dropped as invalid, nothing to be within.
    let invalid_metric = |name: &str| dropped.0.contains(&name);
    let bound = |metric: Option<f64>, name: &str| (!invalid_metric(name)).then_some(metric);
    let (lcp_bound, inp_bound, cls_bound) = (
        bound(lcp_ms, "lcp_ms"),
        bound(inp_ms, "inp_ms"),
        bound(cls, "cls"),
    );
    let within = |value: Option<&RawValue>, metric: Option<Option<f64>>, max: f64| {
        number(value, max).check(|x| metric.is_some_and(|m| within_metric(*x, m)))
    };
    let lcp_target = dropped.keep("lcp_target", selector(raw.lcp_target));
    let inp_target = dropped.keep("inp_target", selector(raw.inp_target));
    let cls_target = dropped.keep("cls_target", selector(raw.cls_target));
    let lcp_url = dropped.keep(
        "lcp_url",
        optional_text(raw.lcp_url).then(|u| normalise_url(&u)),
    );
    let lcp_resource_load_delay_ms = dropped.keep(
        "lcp_resource_load_delay_ms",
        within(raw.lcp_resource_load_delay_ms, lcp_bound, MAX_MS),
    );
    let lcp_resource_load_duration_ms = dropped.keep(
        "lcp_resource_load_duration_ms",
        within(raw.lcp_resource_load_duration_ms, lcp_bound, MAX_MS),
    );
    let lcp_element_render_delay_ms = dropped.keep(
        "lcp_element_render_delay_ms",
        within(raw.lcp_element_render_delay_ms, lcp_bound, MAX_MS),
    );
    let inp_type = dropped.keep(
        "inp_type",
        optional_text(raw.inp_type).then(|t| INP_TYPES.iter().find(|k| **k == t).copied()),
    );
    let inp_input_delay_ms = dropped.keep(
        "inp_input_delay_ms",
        within(raw.inp_input_delay_ms, inp_bound, MAX_MS),
    );
    let inp_processing_duration_ms = dropped.keep(
        "inp_processing_duration_ms",
        within(raw.inp_processing_duration_ms, inp_bound, MAX_MS),
    );
    let inp_presentation_delay_ms = dropped.keep(
        "inp_presentation_delay_ms",
        within(raw.inp_presentation_delay_ms, inp_bound, MAX_MS),
    );
    let inp_script_url = dropped.keep(
        "inp_script_url",
        optional_text(raw.inp_script_url).then(|u| normalise_url(&u)),
    );
    let cls_time_ms = dropped.keep("cls_time_ms", number(raw.cls_time_ms, MAX_MS));
    let cls_value = dropped.keep("cls_value", within(raw.cls_value, cls_bound, MAX_CLS));

    let skewed = |t: i64| {
        t > ctx.received_at_ms.saturating_add(MAX_TS_AHEAD_MS)
            || t < ctx.received_at_ms.saturating_sub(MAX_TS_BEHIND_MS)
    };
    let clock_skewed = ts.is_some_and(skewed);
    let filing_ts = crate::measurement::filing_ts(ts, ctx.received_at_ms);
    let ts = ts.filter(|t| !skewed(*t));
    let received_at = DateTime((ctx.received_at_ms.max(0) / 1000).min(u32::MAX as i64) as u32);
    let agent = ctx.agent;

    Ok(Valid {
        measurement: Measurement {
            id,
            site,
            received_at,
            url: url.into(),
            ts,
            referrer: referrer.map(Cow::Owned),
            navigation_type: navigation_type.map(Cow::Borrowed),
            ttfb_ms,
            fcp_ms,
            lcp_ms,
            inp_ms,
            dom_content_loaded_ms,
            load_ms,
            cls,
            viewport_width,
            effective_connection_type,
            user_agent: Cow::Borrowed(ctx.user_agent),
            sample_rate: 1.0,
            page_view_at: page_view_at(filing_ts, received_at),
            device_type: Label(Cow::Borrowed(agent.device_type)),
            browser: Label(Cow::Borrowed(&agent.browser)),
            browser_version: Label(Cow::Borrowed(&agent.browser_version)),
            os: Label(Cow::Borrowed(&agent.os)),
            lcp_target,
            inp_target,
            cls_target,
            lcp_url: lcp_url.map(Cow::Owned),
            lcp_resource_load_delay_ms,
            lcp_resource_load_duration_ms,
            lcp_element_render_delay_ms,
            inp_type: inp_type.map(Cow::Borrowed),
            inp_input_delay_ms,
            inp_processing_duration_ms,
            inp_presentation_delay_ms,
            inp_script_url: inp_script_url.map(Cow::Owned),
            cls_time_ms,
            cls_value,
        },
        dropped: dropped.0,
        clock_skewed,
    })
}

/// A required string field: missing when absent or `null`.
fn required<'a>(
    value: Option<&'a RawValue>,
    missing: Rejection,
    invalid: Rejection,
) -> Result<Cow<'a, str>, Rejection> {
    match optional_text(value) {
        Field::Absent => Err(missing),
        Field::Valid(s) => Ok(s),
        Field::Invalid => Err(invalid),
    }
}

/// An optional string field.
fn optional_text(value: Option<&RawValue>) -> Field<Cow<'_, str>> {
    value.map_or(Field::Absent, decode::string)
}

/// A CSS selector of an attribution target (v3): a non-empty string of tag names, ids and
/// classes, so without whitespace (no id, class token or tag name holds any, HTML Standard
/// §3.2.6), control or invisible format characters (bidirectional overrides, zero-width
/// spaces: Unicode category Cf); cut to [`MAX_SELECTOR_BYTES`] at a character boundary.
fn selector(value: Option<&RawValue>) -> Field<Cow<'_, str>> {
    optional_text(value)
        .check(|s| {
            !s.is_empty()
                && !s
                    .chars()
                    .any(|c| c.is_whitespace() || c.is_control() || is_format(c))
        })
        .then(|s| {
            Some(match s {
                Cow::Borrowed(b) => Cow::Borrowed(truncate(b, MAX_SELECTOR_BYTES)),
                Cow::Owned(o) => Cow::Owned(truncate(&o, MAX_SELECTOR_BYTES).to_owned()),
            })
        })
}

/// Whether `c` is an invisible format character (Unicode general category Cf, as of Unicode
/// 15: soft hyphen, Arabic and Syriac marks, zero-width and bidirectional controls,
/// invisible operators, the byte-order mark, interlinear annotation, and the tags block).
fn is_format(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{0600}'..='\u{0605}' | '\u{061C}' | '\u{06DD}' | '\u{070F}'
        | '\u{0890}'..='\u{0891}' | '\u{08E2}' | '\u{180E}' | '\u{200B}'..='\u{200F}'
        | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{206F}'
        | '\u{FEFF}' | '\u{FFF9}'..='\u{FFFB}' | '\u{110BD}' | '\u{110CD}'
        | '\u{13430}'..='\u{1343F}' | '\u{1BCA0}'..='\u{1BCA3}' | '\u{1D173}'..='\u{1D17A}'
        | '\u{E0001}' | '\u{E0020}'..='\u{E007F}')
}

/// Whether an attribution part or phase `x` lies within its metric's value (when the metric
/// came valid). The parts are differences of the browser's timestamps, so a part may exceed
/// its metric by floating-point rounding: a relative 1e-9 is allowed.
fn within_metric(x: f64, metric: Option<f64>) -> bool {
    metric.is_none_or(|m| x <= m * (1.0 + 1e-9) + 1e-9)
}

/// The optional fields dropped so far, in the order they were judged.
struct Dropped(Vec<&'static str>);

impl Dropped {
    /// The value of a valid field; an invalid one is listed under `name`.
    fn keep<T>(&mut self, name: &'static str, field: Field<T>) -> Option<T> {
        match field {
            Field::Absent => None,
            Field::Valid(v) => Some(v),
            Field::Invalid => {
                self.0.push(name);
                None
            }
        }
    }
}

/// The stored form of a `navigation_type` value (see [`NAVIGATION_TYPE_ALIASES`]), if it is
/// one.
pub fn navigation_type(value: &str) -> Option<&'static str> {
    NAVIGATION_TYPES
        .into_iter()
        .find(|t| *t == value)
        .or_else(|| {
            NAVIGATION_TYPE_ALIASES
                .into_iter()
                .find_map(|(alias, stored)| (alias == value).then_some(stored))
        })
}

/// A site key: an opaque, case-sensitive string of 1 to 64 characters from `A-Za-z0-9._-`
/// (contract §2).
pub fn is_site_key(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Normalises a page URL (also a referrer) by the WHATWG URL Standard (the `url` crate
/// implements it), so that a raw UTF-8 path and its percent-encoded form are one URL; drops
/// the fragment and any `user:password@`. `None` unless it is an absolute `http`/`https` URL
/// with a host whose stored form fits [`MAX_URL_BYTES`] (what was sent may be longer, e.g. by
/// a long fragment: the limit is on what is stored).
pub fn normalise_url(s: &str) -> Option<String> {
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

/// The user agent as stored (contract §2): the `User-Agent` header's bytes as UTF-8, an invalid
/// byte replaced by U+FFFD, cut at [`MAX_USER_AGENT_BYTES`] on a character boundary; empty
/// without the header.
pub fn user_agent(header: Option<&[u8]>) -> String {
    let Some(bytes) = header else {
        return String::new();
    };
    // Cut the bytes first so that a huge header is not decoded whole; the lossy form can
    // only be longer, so it is cut again.
    let head = &bytes[..bytes.len().min(MAX_USER_AGENT_BYTES)];
    truncate(&String::from_utf8_lossy(head), MAX_USER_AGENT_BYTES).to_owned()
}

/// `s` cut to at most `max` bytes at a character boundary.
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
mod tests;
