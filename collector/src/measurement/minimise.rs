//! What is kept of a URL (contract v4 §2, §5): minimised before anything reaches disk.
//!
//! - A page `url`: scheme, host, port and path, and of the query only the parameters the site
//!   keeps (`--keep-query`: names, or prefixes ending in `*`; default `utm_*`), in their
//!   order; a query left empty is dropped with its `?`.
//! - A `referrer`: from another site (its host is neither the page's host nor the host of one
//!   of the site's origins), its origin only; from the same site, minimised as `url`.
//! - A resource URL (`lcp_url`, `inp_script_url`): scheme, host, port and path.
//! - In every path and kept value, matched on its percent-decoded text ([`mask`]): an e-mail
//!   address, a run of 13 or more digits (card, phone, customer numbers), a UUID, and a run of
//!   20 or more letters and digits that mixes both (reset and session tokens, signed ids) are
//!   each replaced by `*`.
//!
//! Why: what anchors such as Plausible and Cloudflare Web Analytics do (no query strings, "to
//! avoid collecting potentially sensitive data"), and what shops' URLs hold (a reset token in
//! a query, an e-mail in an avatar's file name, a session id in a path; aws-rum-web PR #26,
//! wellcomecollection PR #8131). The input is a URL already normalised by the `url` rule.

use std::borrow::Cow;
use std::sync::LazyLock;

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};
use regex::Regex;
use url::Url;

/// What [`mask`] writes in place of what it hides.
pub const MASK: &str = "*";
/// A run of digits this long or longer is masked (card, phone and customer numbers).
pub const DIGIT_RUN: usize = 13;
/// A run of letters and digits mixing both this long or longer is masked (tokens).
pub const TOKEN_RUN: usize = 20;

/// The characters a URL path has percent-encoded besides non-ASCII ones: the WHATWG URL
/// Standard's path percent-encode set (<https://url.spec.whatwg.org/#path-percent-encode-set>),
/// as the `url` crate writes a path. Page-group rules are matched against paths in this form.
pub(crate) const PATH: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}');

/// The characters a path segment's text is percent-encoded with when a masked segment is
/// written back: [`PATH`], and `/`, `%`.
const SEGMENT: &AsciiSet = &PATH.add(b'/').add(b'%');

/// E-mail addresses, UUIDs, and runs of 13 or more letters and digits (judged in
/// [`mask_run`]). An address's parts are any characters but separators, so that non-ASCII
/// ones (`andré@müller.de`, RFC 6531) and a decoding's U+FFFD are found as well.
static HIDDEN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?x)
        [^\s@/\\?\#&=<>"',;:()\[\]]+ @ [^\s@/\\?\#&=<>"',;:()\[\].%]+ (?:\.[^\s@/\\?\#&=<>"',;:()\[\].%]+)+
      | [0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}
      | [A-Za-z0-9]{13,}"#,
    )
    .expect("a valid pattern")
});

/// `text` with every e-mail address, UUID, run of [`DIGIT_RUN`] or more digits and run of
/// [`TOKEN_RUN`] or more letters and digits mixing both replaced by [`MASK`]; borrowed when
/// nothing was found.
pub fn mask(text: &str) -> Cow<'_, str> {
    if !may_hide(text) {
        return Cow::Borrowed(text);
    }
    HIDDEN.replace_all(text, |c: &regex::Captures<'_>| mask_run(&c[0]))
}

/// How many times [`mask_text`] percent-decodes a text (`%2540` is `@` encoded twice).
pub const DECODINGS: usize = 3;

/// Free text as stored (a dimension's value, a `Server-Timing` name or description): as
/// [`mask`], and matched on its percent-decoded text too, decoded up to [`DECODINGS`] times, so
/// that `jane%40example.com` and `jane%2540example.com` are found as an address is in a URL.
/// Where the most decoded text reveals something to hide, it is stored masked; where only a
/// less decoded one does, [`MASK`] is stored whole; else the text as sent, masked as [`mask`]
/// does (borrowed when nothing was found).
pub fn mask_text(text: &str) -> Cow<'_, str> {
    let mut levels: Vec<String> = Vec::new();
    let mut current: Cow<'_, str> = Cow::Borrowed(text);
    for _ in 0..DECODINGS {
        if !current.contains('%') {
            break;
        }
        let decoded = percent_decode_str(&current)
            .decode_utf8_lossy()
            .into_owned();
        if decoded == current {
            break;
        }
        levels.push(decoded.clone());
        current = Cow::Owned(decoded);
    }
    if let Some(deepest) = levels.last() {
        if let Cow::Owned(hidden) = mask(deepest) {
            return Cow::Owned(hidden);
        }
        // Found only half decoded (rare: decoding further broke it up): the whole text goes.
        if levels.iter().any(|l| matches!(mask(l), Cow::Owned(_))) {
            return Cow::Borrowed(MASK);
        }
    }
    mask(text)
}

/// Whether `text` may hold something [`mask`] hides: an `@`, a run of 13 letters and digits
/// (which the digit and token cases need), or a run of 36 hexadecimal digits and dashes (a
/// UUID's length). A cheap scan that spares most URLs the pattern.
fn may_hide(text: &str) -> bool {
    let (mut run, mut hex) = (0, 0);
    for b in text.bytes() {
        if b == b'@' {
            return true;
        }
        run = if b.is_ascii_alphanumeric() {
            run + 1
        } else {
            0
        };
        hex = if b.is_ascii_hexdigit() || b == b'-' {
            hex + 1
        } else {
            0
        };
        if run >= DIGIT_RUN || hex >= 36 {
            return true;
        }
    }
    false
}

/// What one match of [`HIDDEN`] becomes: an e-mail address or a UUID is masked; a run of
/// letters and digits is masked when it is all digits or a token, else only its digit runs of
/// [`DIGIT_RUN`] or more are.
fn mask_run(found: &str) -> String {
    if found.contains('@') || found.contains('-') {
        return MASK.to_owned();
    }
    let digits = found.bytes().filter(u8::is_ascii_digit).count();
    let letters = found.len() - digits;
    if letters == 0 || (found.len() >= TOKEN_RUN && digits > 0) {
        return MASK.to_owned();
    }
    let mut out = String::with_capacity(found.len());
    let mut rest = found;
    while !rest.is_empty() {
        let run = rest.bytes().take_while(u8::is_ascii_digit).count();
        if run >= DIGIT_RUN {
            out.push_str(MASK);
        } else {
            out.push_str(&rest[..run]);
        }
        rest = &rest[run..];
        let other = rest.bytes().take_while(|b| !b.is_ascii_digit()).count();
        out.push_str(&rest[..other]);
        rest = &rest[other..];
    }
    out
}

/// Whether a query parameter `name` is one of `keep` (a name, or a prefix ending in `*`).
pub fn kept(name: &str, keep: &[String]) -> bool {
    keep.iter().any(|k| match k.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == k,
    })
}

/// A page URL as stored: scheme, host, port, the masked path, and the kept query parameters
/// with masked values (see the module doc). `url` is normalised (WHATWG); `None` if it does
/// not parse (it always does after the `url` rule).
pub fn page_url(url: &str, keep: &[String]) -> Option<String> {
    let mut u = Url::parse(url).ok()?;
    mask_path(&mut u);
    let query: Option<String> = u.query().map(|q| {
        let mut out = url::form_urlencoded::Serializer::new(String::new());
        for (name, value) in url::form_urlencoded::parse(q.as_bytes()) {
            if kept(&name, keep) {
                out.append_pair(&name, &mask(&value));
            }
        }
        out.finish()
    });
    u.set_query(query.as_deref().filter(|q| !q.is_empty()));
    Some(u.into())
}

/// A resource URL as stored: scheme, host, port and the masked path.
pub fn resource_url(url: &str) -> Option<String> {
    let mut u = Url::parse(url).ok()?;
    mask_path(&mut u);
    u.set_query(None);
    Some(u.into())
}

/// A referrer as stored: its origin alone when its host is not `page_host` nor one for which
/// `same_site` holds, else minimised as a page URL.
pub fn referrer(
    url: &str,
    page_host: Option<&str>,
    same_site: impl Fn(&str) -> bool,
    keep: &[String],
) -> Option<String> {
    let u = Url::parse(url).ok()?;
    let host = u.host_str()?;
    if Some(host) == page_host || same_site(host) {
        page_url(url, keep)
    } else {
        Some(u.origin().ascii_serialization())
    }
}

impl super::Measurement<'_> {
    /// Minimises this measurement's `url` and `referrer` as its site keeps them: `keep`, the
    /// query parameters it keeps; `origins`, its allowed origins (`scheme://host[:port]`),
    /// whose hosts count as the same site for a referrer.
    pub fn minimise(&mut self, keep: &[String], origins: &[String]) {
        if let Some(url) = page_url(&self.url, keep) {
            self.url = Cow::Owned(url);
        }
        let page_host = Url::parse(&self.url).ok();
        let page_host = page_host.as_ref().and_then(Url::host_str);
        let same_site = |host: &str| origins.iter().any(|o| origin_host(o) == host);
        if let Some(r) = &self.referrer {
            let minimised = referrer(r, page_host, same_site, keep);
            self.referrer = minimised.map(Cow::Owned);
        }
    }
}

/// The host of an origin `scheme://host[:port]`.
fn origin_host(origin: &str) -> &str {
    let rest = origin.split_once("://").map_or(origin, |(_, r)| r);
    // An IPv6 host is bracketed, and its port follows the bracket.
    match rest.strip_prefix('[') {
        Some(v6) => v6.split(']').next().map_or(rest, |h| &rest[..h.len() + 2]),
        None => rest.split(':').next().unwrap_or(rest),
    }
}

/// Masks each path segment of `u` on its percent-decoded text; a segment left as it was keeps
/// its original encoding.
fn mask_path(u: &mut Url) {
    let path = u.path();
    if !may_hide(&percent_decode_str(path).decode_utf8_lossy()) {
        return;
    }
    let masked: Vec<Cow<'_, str>> = path
        .split('/')
        .map(|segment| {
            let text = percent_decode_str(segment).decode_utf8_lossy();
            match mask(&text) {
                Cow::Borrowed(_) => Cow::Borrowed(segment),
                Cow::Owned(m) => Cow::Owned(utf8_percent_encode(&m, SEGMENT).to_string()),
            }
        })
        .collect();
    let path = masked.join("/");
    u.set_path(&path);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keep(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    /// The issue's reset-password beacon (issue 36): what is stored of it.
    #[test]
    fn a_reset_password_page_keeps_nothing_personal() {
        let utm = keep(&["utm_*"]);
        assert_eq!(
            page_url(
                "https://shop.example/account/reset-password?token=RESETTOKEN123&email=alice%40example.com&order_id=100234&utm_source=mail",
                &utm
            )
            .unwrap(),
            "https://shop.example/account/reset-password?utm_source=mail"
        );
        let same = |h: &str| h == "shop.example";
        assert_eq!(
            referrer(
                "https://shop.example/checkout/confirm?order=100234&sessionid=SESS999&email=alice@example.com",
                Some("shop.example"),
                same,
                &utm
            )
            .unwrap(),
            "https://shop.example/checkout/confirm"
        );
        assert_eq!(
            resource_url(
                "https://cdn.shop.example/avatars/alice@example.com.jpg?sig=SIGNEDURLSECRET"
            )
            .unwrap(),
            "https://cdn.shop.example/avatars/*"
        );
    }

    #[test]
    fn a_referrer_from_another_site_is_its_origin() {
        let none = |_: &str| false;
        assert_eq!(
            referrer(
                "https://www.search.example:8443/q?x=alice",
                Some("shop.example"),
                none,
                &[]
            )
            .unwrap(),
            "https://www.search.example:8443"
        );
        assert_eq!(
            referrer(
                "https://shop.example/p/1?utm_medium=x&q=1",
                Some("shop.example"),
                none,
                &keep(&["utm_*"])
            )
            .unwrap(),
            "https://shop.example/p/1?utm_medium=x"
        );
        let origins = |h: &str| h == "www.shop.example";
        assert_eq!(
            referrer(
                "https://www.shop.example/cart",
                Some("shop.example"),
                origins,
                &[]
            )
            .unwrap(),
            "https://www.shop.example/cart",
            "a host of the site's origins is the same site"
        );
    }

    #[test]
    fn origin_hosts() {
        assert_eq!(origin_host("https://shop.example"), "shop.example");
        assert_eq!(origin_host("http://shop.example:8080"), "shop.example");
        assert_eq!(origin_host("http://[::1]:8080"), "[::1]");
    }

    #[test]
    fn kept_parameters_keep_their_order_and_names_or_prefixes() {
        let k = keep(&["q", "utm_*", "page"]);
        assert_eq!(
            page_url("https://a.example/s?x=1&page=2&q=shoes&utm_a=b&qq=3", &k).unwrap(),
            "https://a.example/s?page=2&q=shoes&utm_a=b"
        );
        assert_eq!(
            page_url("https://a.example/s?x=1", &k).unwrap(),
            "https://a.example/s"
        );
        assert_eq!(
            page_url("https://a.example/s?", &k).unwrap(),
            "https://a.example/s"
        );
        assert_eq!(
            page_url("https://a.example/s?q=alice%40example.com", &k).unwrap(),
            "https://a.example/s?q=*"
        );
    }

    #[test]
    fn what_is_masked_and_what_is_not() {
        for (text, stored) in [
            ("alice@example.com", "*"),
            ("mail-bob.smith+x@sub.example.co.uk/done", "*/done"),
            ("4111111111111111", "*"),
            ("1234567890123", "*"),
            ("123456789012", "123456789012"),
            ("order-100234", "order-100234"),
            ("550e8400-e29b-41d4-a716-446655440000", "*"),
            ("eyJhbGciOiJIUzI1NiJ9x", "*"),
            ("aB3dE5gH7jK9mN1pQ3sT", "*"),
            ("trail-runner-2", "trail-runner-2"),
            ("abcdefghijklmnopqrstuvwxyz", "abcdefghijklmnopqrstuvwxyz"),
            ("sku1234567890123", "sku*"),
            ("jsessionid=A1B2C3D4E5F6G7H8I9J0", "jsessionid=*"),
        ] {
            assert_eq!(mask(text), stored, "{text}");
        }
        assert!(matches!(mask("/products/shoes"), Cow::Borrowed(_)));
    }

    #[test]
    fn free_text_is_masked_on_every_decoding() {
        for (text, stored) in [
            ("jane%40example.com", "*"),
            ("jane%2540example.com", "*"),
            ("andr%C3%A9%40example.com", "*"),
            ("andré@müller.de", "*"),
            ("jane%C0%40example.com", "*"),
            ("jan%C3%A9@example.com%204111111111111111", "* *"),
            ("50%25%20off", "50%25%20off"),
            ("plain text", "plain text"),
            ("mailto:jane@example.com", "mailto:*"),
        ] {
            assert_eq!(mask_text(text), stored, "{text}");
        }
        assert!(matches!(mask_text("50%25%20off"), Cow::Borrowed(_)));
    }

    #[test]
    fn paths_are_masked_on_their_decoded_text_and_keep_their_encoding_otherwise() {
        assert_eq!(
            resource_url("https://a.example/u/alice%40example.com/caf%C3%A9?x=1").unwrap(),
            "https://a.example/u/*/caf%C3%A9"
        );
        assert_eq!(
            page_url("https://a.example/orders/4111111111111111/items", &[]).unwrap(),
            "https://a.example/orders/*/items"
        );
        assert_eq!(
            page_url("https://a.example/;jsessionid=A1B2C3D4E5F6G7H8I9J0", &[]).unwrap(),
            "https://a.example/;jsessionid=*"
        );
    }
}
