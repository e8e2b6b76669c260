//! The field rules of contract §2, one function each: a request field's undecoded JSON value in,
//! a [`Field`] out. The field table ([`super::fields`]) names one rule per request field; this
//! file knows no field by name.
//!
//! Values arrive undecoded ([`RawValue`], see `beacon::decode`), so that a fault inside one
//! value (a number beyond f64, a lone surrogate escape) is judged here and costs only its field.

use std::borrow::Cow;

use serde_json::value::RawValue;
use url::Url;
use uuid::Uuid;

use super::filing::{MAX_TS_AHEAD_MS, MAX_TS_BEHIND_MS};

/// Longest stored `url`, `referrer` and resource URL, in bytes (contract §2).
pub const MAX_URL_BYTES: usize = 2048;
/// Upper bound of every `*_ms` metric: one hour, in milliseconds (contract §2).
pub const MAX_MS: f64 = 3_600_000.0;
/// Upper bound of `cls` (contract §2).
pub const MAX_CLS: f64 = 100.0;
/// Upper bound of a width in CSS pixels (contract §2).
pub const MAX_VIEWPORT_WIDTH: i64 = 100_000;
/// Longest stored attribution selector, in bytes (contract §2 v3); a longer selector is cut at
/// a character boundary (its start, the element's nearest id or ancestors, still tells where
/// it is).
pub const MAX_SELECTOR_BYTES: usize = 256;
/// The longest user agent stored, in bytes; longer ones are cut at a character boundary.
pub const MAX_USER_AGENT_BYTES: usize = 512;

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
/// Allowed `inp_type` values (contract §2 v3; web-vitals' `interactionType`).
pub const INP_TYPES: &[&str] = &["pointer", "keyboard"];
/// The Network Information API's `effectiveType` values (WICG).
pub const CONNECTION_TYPES: &[&str] = &["slow-2g", "2g", "3g", "4g"];

/// Why a measurement was rejected; the `&'static str` is the error listed in `rejected` and
/// the `reason` label of `collector_measurements_rejected_total`.
pub type Rejection = &'static str;

/// What a measurement is judged with besides its body: the request's receipt and user agent.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// Server receive time, milliseconds since the Unix epoch.
    pub received_at_ms: i64,
    /// The user agent as stored (`beacon::user_agent`).
    pub user_agent: &'a str,
    /// What the user agent says ([`crate::useragent`]).
    pub agent: &'a crate::useragent::Agent,
    /// The client's country, ISO 3166-1 alpha-2, or empty ([`crate::geo`]).
    pub country: &'a str,
}

/// One field's value after its rule.
#[derive(Debug, Clone, PartialEq)]
pub enum Field<T> {
    /// Not sent, or `null`.
    Absent,
    /// Of the field's JSON type, decodable and within its rule: stored.
    Valid(T),
    /// Of another type, a fault inside the value (beyond f64, a lone surrogate), or outside
    /// its rule: dropped and listed in `dropped_fields`.
    Invalid,
    /// Valid, but not stored and not listed: a `ts` outside the skew bounds (stored as NULL
    /// and counted, contract §2). What was sent still files the page view.
    Withheld(T),
}

impl<T> Field<T> {
    /// Keeps a valid value only if `ok` holds for it.
    pub fn check(self, ok: impl FnOnce(&T) -> bool) -> Field<T> {
        match self {
            Field::Valid(v) if !ok(&v) => Field::Invalid,
            other => other,
        }
    }

    /// Turns a valid value into another, or into an invalid field where `f` gives `None`.
    pub fn then<U>(self, f: impl FnOnce(T) -> Option<U>) -> Field<U> {
        match self {
            Field::Valid(v) => f(v).map_or(Field::Invalid, Field::Valid),
            Field::Absent => Field::Absent,
            Field::Invalid => Field::Invalid,
            Field::Withheld(v) => f(v).map_or(Field::Invalid, Field::Withheld),
        }
    }

    /// What is stored: the valid value, else nothing.
    pub fn stored(self) -> Option<T> {
        match self {
            Field::Valid(v) => Some(v),
            _ => None,
        }
    }

    /// What was sent and is valid, stored or withheld.
    pub fn sent(&self) -> Option<&T> {
        match self {
            Field::Valid(v) | Field::Withheld(v) => Some(v),
            _ => None,
        }
    }
}

/// Decodes a JSON string, borrowing it when it has no escape.
pub fn string(raw: &RawValue) -> Field<Cow<'_, str>> {
    let text = raw.get();
    if !text.starts_with('"') {
        return Field::Invalid;
    }
    if !text.contains('\\') {
        return Field::Valid(Cow::Borrowed(&text[1..text.len() - 1]));
    }
    match serde_json::from_str::<String>(text) {
        Ok(s) => Field::Valid(Cow::Owned(s)),
        Err(_) => Field::Invalid,
    }
}

/// Decodes a JSON number as f64; a number beyond f64's range is invalid.
///
/// Read by `str::parse`, not by a second serde_json deserializer (issue 53): a [`RawValue`]
/// that starts with `-` or a digit is a JSON number serde_json checked while skipping it, and
/// JSON's number grammar is a part of the one `f64::from_str` reads; both round correctly
/// (serde_json's `float_roundtrip`), and both give an infinity beyond f64, invalid here.
pub fn number(raw: &RawValue) -> Field<f64> {
    let text = raw.get();
    if !text.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
        return Field::Invalid;
    }
    match text.parse::<f64>() {
        Ok(x) if x.is_finite() => Field::Valid(x),
        _ => Field::Invalid,
    }
}

/// Decodes a JSON number with no fractional part, in any spelling (`1280`, `1280.0`,
/// `1.28e3`): JavaScript has one number type, and `Number.isInteger(1280.0)` holds.
pub fn integer(raw: &RawValue) -> Field<i64> {
    // Exact first, so that integers beyond 2^53 written as such are not rounded. A JSON
    // integer is a part of what `i64::from_str` reads (see [`number`]).
    let text = raw.get();
    if text.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
        if let Ok(n) = text.parse::<i64>() {
            return Field::Valid(n);
        }
    }
    match number(raw) {
        // i64::MAX as f64 is 2^63, itself out of range: the bound is exclusive.
        Field::Valid(x) if x.fract() == 0.0 && x >= i64::MIN as f64 && x < i64::MAX as f64 => {
            Field::Valid(x as i64)
        }
        _ => Field::Invalid,
    }
}

/// A field that may be absent: its value's rule, or [`Field::Absent`].
fn present<'a, T>(
    value: Option<&'a RawValue>,
    rule: impl FnOnce(&'a RawValue) -> Field<T>,
) -> Field<T> {
    value.map_or(Field::Absent, rule)
}

/// A string field.
pub fn text(value: Option<&RawValue>) -> Field<Cow<'_, str>> {
    present(value, string)
}

/// A measurement id: a UUID (any version but nil), in any of the forms `Uuid::try_parse`
/// reads.
pub fn id(value: Option<&RawValue>) -> Field<Uuid> {
    text(value).then(|s| Uuid::try_parse(&s).ok().filter(|id| !id.is_nil()))
}

/// A site key: an opaque, case-sensitive string of 1 to 64 characters from `A-Za-z0-9._-`
/// (contract §2).
pub fn site_key(value: Option<&RawValue>) -> Field<Cow<'_, str>> {
    text(value).check(|s| is_site_key(s))
}

/// Whether `s` is a site key ([`site_key`]).
pub fn is_site_key(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A URL field (`url`, `referrer`, the resource URLs), normalised ([`normalise_url`]).
pub fn url(value: Option<&RawValue>) -> Field<Cow<'_, str>> {
    text(value).then(|u| {
        if is_written_normalised(&u) {
            // Kept as sent, borrowed from the body: no parse, no copy.
            return (u.len() <= MAX_URL_BYTES).then_some(u);
        }
        normalised_by_the_url_crate(&u).map(Cow::Owned)
    })
}

/// A resource URL (`lcp_url`, `inp_script_url`): normalised, then scheme, host, port and
/// masked path only ([`super::minimise::resource_url`], contract v4 §2).
pub fn resource_url(value: Option<&RawValue>) -> Field<Cow<'_, str>> {
    text(value).then(|u| {
        let normalised = normalise_url(&u)?;
        super::minimise::resource_url(&normalised).map(Cow::Owned)
    })
}

/// A sampling rate: a number from 0 to 1 (contract v4 `sample_rate`).
pub fn rate(value: Option<&RawValue>) -> Field<f64> {
    within(value, 1.0)
}

/// A `ts`: an integer, milliseconds since the Unix epoch; withheld (stored as NULL, counted)
/// when more than [`MAX_TS_AHEAD_MS`] ahead of or [`MAX_TS_BEHIND_MS`] behind the receipt
/// (contract §2).
pub fn client_time(received_at_ms: i64) -> impl Fn(Option<&RawValue>) -> Field<i64> {
    move |value| match present(value, integer) {
        Field::Valid(t)
            if t > received_at_ms.saturating_add(MAX_TS_AHEAD_MS)
                || t < received_at_ms.saturating_sub(MAX_TS_BEHIND_MS) =>
        {
            Field::Withheld(t)
        }
        other => other,
    }
}

/// A number of milliseconds, 0 to [`MAX_MS`].
pub fn ms(value: Option<&RawValue>) -> Field<f64> {
    within(value, MAX_MS)
}

/// A layout shift score, 0 to [`MAX_CLS`].
pub fn cls(value: Option<&RawValue>) -> Field<f64> {
    within(value, MAX_CLS)
}

/// A number from 0 to `max`.
fn within(value: Option<&RawValue>, max: f64) -> Field<f64> {
    present(value, number).check(|x| (0.0..=max).contains(x))
}

/// A width in CSS pixels, an integer from 0 to [`MAX_VIEWPORT_WIDTH`].
pub fn css_pixels(value: Option<&RawValue>) -> Field<u32> {
    present(value, integer)
        .check(|x| (0..=MAX_VIEWPORT_WIDTH).contains(x))
        .then(|x| u32::try_from(x).ok())
}

/// One of `allowed`, stored as written there.
pub fn one_of(
    allowed: &'static [&'static str],
) -> impl for<'a> Fn(Option<&'a RawValue>) -> Field<Cow<'a, str>> {
    move |value| text(value).then(|t| allowed.iter().find(|k| **k == t).map(|k| Cow::Borrowed(*k)))
}

/// A `navigation_type` ([`navigation_type`]).
pub fn navigation(value: Option<&RawValue>) -> Field<Cow<'_, str>> {
    text(value).then(|t| navigation_type(&t).map(Cow::Borrowed))
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

/// A part of a metric (an LCP part, an INP phase, the largest shift of CLS): a number from 0
/// to the metric's value as sent, to `max` when the metric was not sent, and invalid when the
/// metric was sent invalid (nothing to be within). The parts are differences of the browser's
/// timestamps, so a part may exceed its metric by floating-point rounding: a relative 1e-9 is
/// allowed.
pub fn part_of(metric: &Field<f64>, max: f64) -> impl Fn(Option<&RawValue>) -> Field<f64> {
    let bound = match metric {
        Field::Valid(m) => Some(Some(*m)),
        Field::Absent | Field::Withheld(_) => Some(None),
        Field::Invalid => None,
    };
    move |value| {
        within(value, max).check(|x| match bound {
            Some(Some(m)) => *x <= m * (1.0 + 1e-9) + 1e-9,
            Some(None) => true,
            None => false,
        })
    }
}

/// A CSS selector of an attribution target (v3): a non-empty string of tag names, ids and
/// classes, so without whitespace (no id, class token or tag name holds any, HTML Standard
/// §3.2.6), control or invisible format characters (bidirectional overrides, zero-width
/// spaces: Unicode category Cf); masked as a URL's path, on its percent-decoded text too (an
/// id may carry an order number or a token; contract v4 §5, [`super::minimise::mask_text`]),
/// then cut to [`MAX_SELECTOR_BYTES`] at a
/// character boundary: masked before it is cut (contract v5 §2), so that a secret across the
/// cut is not left as a prefix too short to be recognised. The body's bound (contract §1)
/// bounds the text masked, and masking is linear.
pub fn selector(value: Option<&RawValue>) -> Field<Cow<'_, str>> {
    text(value)
        .check(|s| {
            !s.is_empty()
                && !s
                    .chars()
                    .any(|c| c.is_whitespace() || c.is_control() || is_format(c))
        })
        .then(|s| {
            Some(match super::minimise::mask_text(&s) {
                Cow::Borrowed(_) => match s {
                    Cow::Borrowed(b) => Cow::Borrowed(truncate(b, MAX_SELECTOR_BYTES)),
                    Cow::Owned(o) => Cow::Owned(truncate(&o, MAX_SELECTOR_BYTES).to_owned()),
                },
                Cow::Owned(masked) => Cow::Owned(truncate(&masked, MAX_SELECTOR_BYTES).to_owned()),
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

/// Normalises a page URL (also a referrer) by the WHATWG URL Standard (the `url` crate
/// implements it), so that a raw UTF-8 path and its percent-encoded form are one URL; drops
/// the fragment and any `user:password@`. `None` unless it is an absolute `http`/`https` URL
/// with a host whose stored form fits [`MAX_URL_BYTES`] (what was sent may be longer, e.g. by
/// a long fragment: the limit is on what is stored).
pub fn normalise_url(s: &str) -> Option<String> {
    if is_written_normalised(s) {
        return (s.len() <= MAX_URL_BYTES).then(|| s.to_owned());
    }
    normalised_by_the_url_crate(s)
}

/// [`normalise_url`] by the `url` crate, for every URL.
fn normalised_by_the_url_crate(s: &str) -> Option<String> {
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

/// Whether `s` is already written as [`normalise_url`] writes it, read in one scan of a narrow
/// form, so that the `url` crate's parse (about 4,000 instructions a URL, issue 53) is spared
/// the URLs browsers send: `http://` or `https://` in lower case; a host of lower-case letters,
/// digits, `-` and `.` with no empty label, no `xn--` label and a last label that holds a
/// letter and does not start with `0x` (so that the URL Standard reads it as a domain, neither
/// an IPv4 address nor punycode); no user info, no port; a path from `/` without a `.` after a
/// `/` or any `%2e` (no dot segment to resolve); a query; no fragment; and only characters that
/// neither the path's nor the special query's percent-encode set holds. Anything else is
/// `false`, and parsed. `rules::tests::the_narrow_form_is_what_the_url_crate_writes` holds
/// this to the crate on drawn URLs.
pub fn is_written_normalised(s: &str) -> bool {
    let Some(rest) = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
    else {
        return false;
    };
    let rest = rest.as_bytes();
    let host_end = plain_domain_end(rest);
    host_end > 0 && rest.get(host_end) == Some(&b'/') && is_plain_path_and_query(&rest[host_end..])
}

/// The length of the domain at the start of `rest` if it is one the URL Standard keeps as
/// written ([`is_written_normalised`]), up to the first `/`, `?` or `#`; else 0.
fn plain_domain_end(rest: &[u8]) -> usize {
    let (mut label_start, mut letter) = (0, false);
    let mut end = rest.len();
    for (i, &b) in rest.iter().enumerate() {
        match b {
            b'a'..=b'z' => letter = true,
            b'0'..=b'9' | b'-' => {}
            b'.' | b'/' | b'?' | b'#' => {
                let label = &rest[label_start..i];
                if label.is_empty() || label.starts_with(b"xn--") {
                    return 0;
                }
                if b != b'.' {
                    end = i;
                    break;
                }
                (label_start, letter) = (i + 1, false);
            }
            _ => return 0,
        }
    }
    let last = &rest[label_start..end];
    if last.is_empty() || last.starts_with(b"xn--") || !letter || last.starts_with(b"0x") {
        return 0;
    }
    end
}

/// What a path (`1`) and a query (`2`) keep as written of each byte, by the percent-encode
/// sets of the URL Standard: letters, digits and `-._~!$&()*+,;=:@/%` in both; `'` in the
/// path only (the special query set holds it); `?` in the query only (it ends the path).
static KEPT: [u8; 256] = {
    let mut kept = [0u8; 256];
    let mut b = 0;
    while b < 128 {
        if (b as u8).is_ascii_alphanumeric() {
            kept[b] = 3;
        }
        b += 1;
    }
    let both = b"-._~!$&()*+,;=:@/%";
    let mut i = 0;
    while i < both.len() {
        kept[both[i] as usize] = 3;
        i += 1;
    }
    kept[b'\'' as usize] = 1;
    kept[b'?' as usize] = 2;
    kept
};

/// Whether `tail` (from the path's `/`) is a path and query the URL Standard keeps as written
/// ([`is_written_normalised`]): only bytes of [`KEPT`], no `.` after a `/` and no `%2e` in the
/// path (no dot segment to resolve).
fn is_plain_path_and_query(tail: &[u8]) -> bool {
    let mut set = 1;
    for (i, &b) in tail.iter().enumerate() {
        if b == b'?' && set == 1 {
            set = 2;
            continue;
        }
        if KEPT[usize::from(b)] & set == 0 {
            return false;
        }
        if set == 1
            && ((b == b'.' && i > 0 && tail[i - 1] == b'/')
                || (b == b'%'
                    && tail.get(i + 1) == Some(&b'2')
                    && matches!(tail.get(i + 2), Some(b'e' | b'E'))))
        {
            return false;
        }
    }
    true
}

/// `s` cut to at most `max` bytes at a character boundary.
pub fn truncate(s: &str, max: usize) -> &str {
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

    /// The pieces URLs are drawn from: each list starts with its pieces of the narrow form (as
    /// many as the number beside it), drawn three times in four, so that both readings are
    /// exercised; the rest are what the URL Standard treats apart.
    #[rustfmt::skip]
    const SCHEMES: (&[&str], usize) = (
        &["https://", "http://", "HTTPS://", "ftp://", "https:/", "http:\\\\", "https:"],
        2,
    );
    #[rustfmt::skip]
    const LABELS: (&[&str], usize) = (
        &["shop", "example", "a", "com", "a-b", "localhost", "123", "1", "-", "0", "9a", "a-",
          "ab--cd", "xn--", "xn--p1ai", "0x", "0x1f", "ex_ample", "EXAMPLE", "ß", "münchen", "",
          "%41", "a@b", "user:pw@h", "[::1]", "127"],
        13,
    );
    #[rustfmt::skip]
    const PORTS: (&[&str], usize) = (&["", ":", ":443", ":80", ":8080", ":x"], 1);
    #[rustfmt::skip]
    const SEGMENTS: (&[&str], usize) = (
        &["", "a.b", "products", "linen-shirt-42", "%41", "%zz", "%", "'", "~",
          "!$&()*+,;=:@", "x..", "%2", ".", "..", "%2e", "%2E%2e", ".well-known", "é", " ",
          "\"", "<", ">", "`", "{", "}", "|", "^", "\\", "\t", "a\nb", "#frag", "?", "[", "]"],
        12,
    );
    #[rustfmt::skip]
    const QUERY: (&[&str], usize) = (
        &["utm_source=x", "a=b", "&", "q=shoes", "%20", "?", "/", "", "=", "%2e", "'", " ",
          "é", "#", "{", "^", "|", "\\", "`", "\""],
        10,
    );

    /// Every URL the narrow form takes is one the `url` crate writes back unchanged, so that
    /// [`normalise_url`] gives what the crate alone gave, on 40,000 drawn URLs (upper case,
    /// IPv4 and IPv6 hosts, punycode, user info, ports, dot segments plain and encoded, the
    /// characters each percent-encode set holds, backslashes, white space, non-ASCII text,
    /// fragments).
    #[test]
    fn the_narrow_form_is_what_the_url_crate_writes() {
        let mut seed = 0x2545_F491_4F6C_DD1D_u64;
        let mut next = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let mut pick = |(pieces, plain): (&[&'static str], usize)| {
            let n = if next(4) != 0 { plain } else { pieces.len() };
            pieces[next(n)]
        };
        let (mut narrow, drawn) = (0, 40_000);
        for round in 0..drawn {
            let mut s = String::new();
            if round % 50 == 0 {
                s.push(' ');
            }
            s += pick(SCHEMES);
            for label in 0..1 + round % 4 {
                if label > 0 {
                    s.push('.');
                }
                s += pick(LABELS);
            }
            if round % 11 == 0 {
                s.push('.');
            }
            s += pick(PORTS);
            if round % 9 != 0 {
                for _ in 0..round % 6 {
                    s.push('/');
                    s += pick(SEGMENTS);
                }
            }
            if round % 3 == 0 {
                s.push('?');
                for _ in 0..round % 5 {
                    s += pick(QUERY);
                }
            }
            if round % 13 == 0 {
                s += "#x";
            }
            if is_written_normalised(&s) {
                narrow += 1;
                let crate_wrote = normalised_by_the_url_crate(&s);
                assert_eq!(crate_wrote.as_deref(), Some(s.as_str()), "{s:?}");
            }
            assert_eq!(normalise_url(&s), normalised_by_the_url_crate(&s), "{s:?}");
        }
        // About 4,300 take the narrow form (this seed).
        assert!(
            narrow > drawn / 20 && narrow < drawn / 2,
            "{narrow} of {drawn}"
        );
        for (s, narrow) in [
            ("https://shop.example/", true),
            (
                "https://shop.example/collections/linen-shirt-42?utm_source=x&fbclid=abc",
                true,
            ),
            ("https://search.example/?q=shoes", true),
            ("https://shop.example/it's", true),
            ("https://shop.example", false),
            ("https://Shop.example/", false),
            ("https://shop.example:443/", false),
            ("https://shop.example/a#b", false),
            ("https://1.2.3.4/", false),
            ("https://shop.0x1f/", false),
            ("https://xn--p1ai.example/", false),
            ("https://shop.example/./a", false),
            ("https://shop.example/%2E%2e/a", false),
            ("https://shop.example/a?b='c'", false),
        ] {
            assert_eq!(is_written_normalised(s), narrow, "{s}");
        }
    }
}
