//! What is kept of a URL (contract v5 §2, §5): minimised before anything reaches disk.
//!
//! - A page `url`: scheme, host, port and path, and of the query only the parameters the site
//!   keeps (`--keep-query`: names, or prefixes ending in `*`; default `utm_*`), in their
//!   order, never one named as a secret ([`kept`], v5); a query left empty is dropped with its
//!   `?`.
//! - A `referrer`: from another site (its host is neither the page's host nor the host of one
//!   of the site's origins), its origin only; from the same site, minimised as `url`.
//! - A resource URL (`lcp_url`, `inp_script_url`): scheme, host, port and path.
//! - In every path segment and kept value, matched on its percent-decoded text (decoded until
//!   it no longer changes, at most [`DECODINGS`] rounds; still encoded after that, masked
//!   whole): an e-mail address (its `+tag` included, in a query value also when the `+` reads
//!   as a space), a number of [`DIGIT_RUN`] or more digits (also when single spaces, dots,
//!   dashes or parentheses break it, with an optional leading `+`: cards, phones, IBANs,
//!   customer numbers), a UUID, a run of [`TOKEN_RUN`] or more letters and digits that mixes
//!   both, and a token in the base64url alphabet ([`B64_RUN`]) are each replaced by `*`
//!   ([`mask`]).
//! - The user agent: e-mail addresses, UUIDs and tokens masked, numbers not ([`mask_agent`]).
//!
//! Why: what anchors such as Plausible and Cloudflare Web Analytics do (no query strings, "to
//! avoid collecting potentially sensitive data"), and what shops' URLs hold (a reset token in
//! a query, an e-mail in an avatar's file name, a session id in a path; aws-rum-web PR #26,
//! wellcomecollection PR #8131). The input is a URL already normalised by the `url` rule.
//!
//! Every rule is a regular expression of the `regex` crate (no backtracking) or one pass over
//! the bytes, so masking stays linear in the text's length.

use std::borrow::Cow;
use std::sync::LazyLock;

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};
use regex::Regex;
use url::Url;

/// What [`mask`] writes in place of what it hides.
pub const MASK: &str = "*";
/// A number of this many digits or more is masked (card, phone, account and customer
/// numbers; v5): also when single spaces, dots, dashes or parentheses break it
/// (`4111-1111-1111-1111`, `+49 170 1234567`, `(030) 1234-5678`), with an optional leading
/// `+`; a `/` never joins two numbers (`/2026/12/06/42` stays). Not in the user agent.
pub const DIGIT_RUN: usize = 10;
/// A run of ASCII letters and digits mixing both this long or longer is masked (tokens).
pub const TOKEN_RUN: usize = 20;
/// A run of the base64url alphabet (letters, digits, `-`, `_`, `.`, `~`) this long or longer
/// is masked when upper-case letters, lower-case letters and digits each occur at least twice
/// in it and, inside one piece (between two of `-`, `_`, `.`, `~`), an upper-case letter
/// follows a lower-case letter or a digit (v5: magic links, JWTs; `Nike-Air-Max-90-Black`
/// stays).
pub const B64_RUN: usize = 16;
/// How many rounds a text is percent-decoded at most (`%2540` is `@` encoded twice); a text
/// that would still change on one more round is masked whole (v5).
pub const DECODINGS: usize = 3;

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
/// written back: [`PATH`], and `/`, `%`, `\` (which a special URL's path reads as `/`): the
/// segment stays one segment, and the URL stays as the `url` crate writes it.
const SEGMENT: &AsciiSet = &PATH.add(b'/').add(b'%').add(b'\\');

/// UUIDs, in either case.
static UUID: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}")
        .expect("a valid pattern")
});

/// Which rules a text is masked by.
#[derive(Clone, Copy)]
struct Rules {
    /// A space may stand for a `+tag`'s `+` in an e-mail address (a query value).
    spaced: bool,
    /// Numbers of [`DIGIT_RUN`] or more digits are masked (not in the user agent).
    numbers: bool,
}

/// A URL path segment's, a selector's or a free text's rules.
const PATH_RULES: Rules = Rules {
    spaced: false,
    numbers: true,
};
/// A kept query value's rules.
const VALUE_RULES: Rules = Rules {
    spaced: true,
    numbers: true,
};
/// The user agent's rules.
const AGENT_RULES: Rules = Rules {
    spaced: false,
    numbers: false,
};

/// `text` with every e-mail address, UUID, number of [`DIGIT_RUN`] or more digits, run of
/// [`TOKEN_RUN`] or more letters and digits mixing both and base64url token ([`B64_RUN`])
/// replaced by [`MASK`]; borrowed when nothing was found. `text` is taken as it is (see
/// [`mask_text`] for a text that may be percent-encoded).
pub fn mask(text: &str) -> Cow<'_, str> {
    mask_with(text, PATH_RULES)
}

/// The user agent as stored (contract v5 §2): as [`mask_text`] (on its percent-decoded text:
/// an in-app browser may write `email=jane%40example.com`) but its numbers are not masked, so
/// that version numbers (`Chrome/131.0.6778.135`) stay; borrowed when nothing was found.
pub fn mask_agent(text: &str) -> Cow<'_, str> {
    match mask_decoded(text, DECODINGS, AGENT_RULES, true) {
        Some(masked) => Cow::Owned(masked),
        None => Cow::Borrowed(text),
    }
}

/// `text` masked by `rules`, one rule after the other, each one pass (or, for UUIDs, a
/// regular expression without backtracking): e-mail addresses first (a token or a number
/// inside one goes with it), then UUIDs, tokens and numbers.
fn mask_with(text: &str, rules: Rules) -> Cow<'_, str> {
    if !may_hide(text, rules) {
        return Cow::Borrowed(text);
    }
    let mut out = Cow::Borrowed(text);
    if let Some(masked) = mask_emails(text, rules.spaced) {
        out = Cow::Owned(masked);
    }
    if may_hold_uuid(&out) {
        let found = match UUID.replace_all(&out, MASK) {
            Cow::Owned(masked) => Some(masked),
            Cow::Borrowed(_) => None,
        };
        if let Some(masked) = found {
            out = Cow::Owned(masked);
        }
    }
    if let Some(masked) = mask_tokens(&out) {
        out = Cow::Owned(masked);
    }
    if rules.numbers {
        if let Some(masked) = mask_numbers(&out) {
            out = Cow::Owned(masked);
        }
    }
    out
}

/// Free text as stored (a dimension's value, a `Server-Timing` name or description): as
/// [`mask`], on its percent-decoded text (decoded until it no longer changes, at most
/// [`DECODINGS`] rounds), so that `jane%40example.com` and `jane%2540example.com` are found
/// as an address is in a URL. See [`mask_decoded`] for what is stored; borrowed when nothing
/// was found.
pub fn mask_text(text: &str) -> Cow<'_, str> {
    match mask_decoded(text, DECODINGS, PATH_RULES, true) {
        Some(masked) => Cow::Owned(masked),
        None => Cow::Borrowed(text),
    }
}

/// One round of percent-decoding of `text`, `None` when it would not change it.
fn decode_once(text: &str) -> Option<String> {
    if !text.contains('%') {
        return None;
    }
    let decoded = percent_decode_str(text).decode_utf8_lossy();
    (decoded != text).then(|| decoded.into_owned())
}

/// `text` (percent-encoded or not) masked by `rules` on its text decoded `rounds` times at
/// most: `None` when nothing is to be hidden; else what is stored: [`MASK`] whole when the
/// text is still percent-encoded after `rounds` rounds, or when only a less decoded form
/// reveals something to hide (decoding further broke it up; `text` itself counts only with
/// `given`: a path segment's URL encoding is not text); else the most decoded text, masked.
fn mask_decoded(text: &str, rounds: usize, rules: Rules, given: bool) -> Option<String> {
    let mut levels: Vec<String> = Vec::new();
    for _ in 0..rounds {
        let current = levels.last().map_or(text, String::as_str);
        match decode_once(current) {
            Some(decoded) => levels.push(decoded),
            None => break,
        }
    }
    let Some((deepest, shallower)) = levels.split_last() else {
        return match mask_with(text, rules) {
            Cow::Owned(masked) => Some(masked),
            Cow::Borrowed(_) => None,
        };
    };
    if decode_once(deepest).is_some() {
        return Some(MASK.to_owned());
    }
    if let Cow::Owned(masked) = mask_with(deepest, rules) {
        return Some(masked);
    }
    let given = given.then_some(text);
    if given
        .into_iter()
        .chain(shallower.iter().map(String::as_str))
        .any(|l| matches!(mask_with(l, rules), Cow::Owned(_)))
    {
        return Some(MASK.to_owned());
    }
    None
}

/// Whether `c` may be part of an e-mail address's local part: any character but whitespace and
/// separators, so that a `+tag`, non-ASCII ones (`andré@müller.de`, RFC 6531) and a
/// decoding's U+FFFD are found as well.
fn is_local(c: char) -> bool {
    !c.is_whitespace()
        && !matches!(
            c,
            '@' | '/'
                | '\\'
                | '?'
                | '#'
                | '&'
                | '='
                | '<'
                | '>'
                | '"'
                | '\''
                | ','
                | ';'
                | ':'
                | '('
                | ')'
                | '['
                | ']'
        )
}

/// Whether `c` may be part of a label of an e-mail address's domain: as [`is_local`], but
/// neither `.` nor `%`.
fn is_label(c: char) -> bool {
    is_local(c) && c != '.' && c != '%'
}

/// The length in bytes of the run of characters for which `class` holds at the end of `text`.
fn run_before(text: &str, class: fn(char) -> bool) -> usize {
    text.chars()
        .rev()
        .take_while(|&c| class(c))
        .map(char::len_utf8)
        .sum()
}

/// The length in bytes of the run of characters for which `class` holds at the start of
/// `text`.
fn run_after(text: &str, class: fn(char) -> bool) -> usize {
    text.chars()
        .take_while(|&c| class(c))
        .map(char::len_utf8)
        .sum()
}

/// `text` with every e-mail address replaced by [`MASK`]; `None` when there is none. An
/// address: a local part (characters of [`is_local`]; with `spaced`, single spaces may join
/// runs of them: `+tag`s whose `+` was read as a space), `@`, and two or more labels
/// ([`is_label`]) joined by dots. One pass from `@` to `@`: a local part never reaches back
/// over an `@`, nor a domain forward over one.
fn mask_emails(text: &str, spaced: bool) -> Option<String> {
    let mut out: Option<String> = None;
    let mut copied = 0;
    let mut from = 0;
    while let Some(found) = text[from..].find('@') {
        let at = from + found;
        from = at + 1;
        let local = run_before(&text[copied..at], is_local);
        if local == 0 {
            continue;
        }
        let mut start = at - local;
        // A `+tag` may hold `+` itself (`jane+a+b@`): every space before the address that
        // joins two runs of the local part's characters may have been a `+`.
        while spaced && text[copied..start].ends_with(' ') {
            let tag = run_before(&text[copied..start - 1], is_local);
            if tag == 0 {
                break;
            }
            start -= 1 + tag;
        }
        let domain = &text[at + 1..];
        let mut end = run_after(domain, is_label);
        let mut labels = usize::from(end > 0);
        while labels > 0 {
            let Some(next) = domain[end..].strip_prefix('.') else {
                break;
            };
            let label = run_after(next, is_label);
            if label == 0 {
                break;
            }
            end += 1 + label;
            labels += 1;
        }
        if labels < 2 {
            continue;
        }
        let end = at + 1 + end;
        let o = out.get_or_insert_with(|| String::with_capacity(text.len()));
        o.push_str(&text[copied..start]);
        o.push_str(MASK);
        copied = end;
        from = end;
    }
    out.map(|mut o| {
        o.push_str(&text[copied..]);
        o
    })
}

/// Whether `text` has a run of 36 hexadecimal digits and dashes (a UUID's length).
fn may_hold_uuid(text: &str) -> bool {
    let mut run = 0;
    text.bytes().any(|b| {
        run = if b.is_ascii_hexdigit() || b == b'-' {
            run + 1
        } else {
            0
        };
        run >= 36
    })
}

/// Whether a byte belongs to the base64url alphabet (with `.` and `~`, as in JWTs and
/// URL-safe tokens).
fn is_b64(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~')
}

/// Whether `text` may hold something [`mask_with`] hides under `rules`: an `@`, a run of
/// [`B64_RUN`] base64url characters (which a UUID, a token and a run of [`TOKEN_RUN`] need),
/// or [`DIGIT_RUN`] digits in all. A cheap scan that spares most texts the rules.
fn may_hide(text: &str, rules: Rules) -> bool {
    let (mut run, mut digits) = (0, 0);
    for b in text.bytes() {
        if b == b'@' {
            return true;
        }
        run = if is_b64(b) { run + 1 } else { 0 };
        if b.is_ascii_digit() {
            digits += 1;
        }
        if run >= B64_RUN || (rules.numbers && digits >= DIGIT_RUN) {
            return true;
        }
    }
    false
}

/// Whether a run of the base64url alphabet is a token (see [`B64_RUN`]).
fn is_b64_token(run: &[u8]) -> bool {
    if run.len() < B64_RUN {
        return false;
    }
    let (mut upper, mut lower, mut digit, mut camel) = (0, 0, 0, false);
    let mut previous = b'-';
    for &b in run {
        if b.is_ascii_uppercase() {
            upper += 1;
            camel |= previous.is_ascii_lowercase() || previous.is_ascii_digit();
        } else if b.is_ascii_lowercase() {
            lower += 1;
        } else if b.is_ascii_digit() {
            digit += 1;
        }
        previous = b;
    }
    camel && upper >= 2 && lower >= 2 && digit >= 2
}

/// `text` with every base64url token ([`B64_RUN`]) and every run of [`TOKEN_RUN`] or more
/// ASCII letters and digits that mixes both replaced by [`MASK`]; `None` when there is none.
/// One pass: each maximal run of the base64url alphabet is judged whole (a part of a run is a
/// token only if the run is), then its runs of letters and digits.
fn mask_tokens(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let mut out: Option<String> = None;
    let mut copied = 0;
    let hide = |out: &mut Option<String>, from: usize, to: usize, copied: &mut usize| {
        let o = out.get_or_insert_with(|| String::with_capacity(text.len()));
        o.push_str(&text[*copied..from]);
        o.push_str(MASK);
        *copied = to;
    };
    let mut i = 0;
    while i < b.len() {
        if !is_b64(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && is_b64(b[i]) {
            i += 1;
        }
        if i - start < B64_RUN {
            continue;
        }
        if is_b64_token(&b[start..i]) {
            hide(&mut out, start, i, &mut copied);
            continue;
        }
        let mut j = start;
        while j < i {
            if !b[j].is_ascii_alphanumeric() {
                j += 1;
                continue;
            }
            let from = j;
            let (mut letters, mut digits) = (false, false);
            while j < i && b[j].is_ascii_alphanumeric() {
                letters |= b[j].is_ascii_alphabetic();
                digits |= b[j].is_ascii_digit();
                j += 1;
            }
            if j - from >= TOKEN_RUN && letters && digits {
                hide(&mut out, from, j, &mut copied);
            }
        }
    }
    out.map(|mut o| {
        o.push_str(&text[copied..]);
        o
    })
}

/// `text` with every number of [`DIGIT_RUN`] or more digits replaced by [`MASK`]; `None` when
/// there is none. A number: an optional `+`, an optional `(`, then groups of digits joined by
/// an optional `)`, an optional single space, dot or dash and an optional `(` (at least one of
/// them); a `)` closing an opened `(` after the last group is part of it. One pass: a number
/// is read to its end before the next one is looked for.
fn mask_numbers(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let n = b.len();
    let mut out: Option<String> = None;
    let mut copied = 0;
    let mut i = 0;
    while i < n {
        let start = i;
        let mut j = i;
        if b[j] == b'+' {
            j += 1;
        }
        let mut open = 0i32;
        if j < n && b[j] == b'(' {
            j += 1;
            open = 1;
        }
        if j >= n || !b[j].is_ascii_digit() {
            i += 1;
            continue;
        }
        let mut digits = 0;
        let mut end;
        loop {
            while j < n && b[j].is_ascii_digit() {
                digits += 1;
                j += 1;
            }
            end = j;
            let mut k = j;
            let (mut closed, mut opened) = (0, 0);
            if k < n && b[k] == b')' {
                k += 1;
                closed = 1;
            }
            if k < n && matches!(b[k], b' ' | b'.' | b'-') {
                k += 1;
            }
            if k < n && b[k] == b'(' {
                k += 1;
                opened = 1;
            }
            if k > j && k < n && b[k].is_ascii_digit() {
                open += opened - closed;
                j = k;
            } else {
                break;
            }
        }
        if open > 0 && end < n && b[end] == b')' {
            end += 1;
        }
        if digits >= DIGIT_RUN {
            let o = out.get_or_insert_with(|| String::with_capacity(n));
            o.push_str(&text[copied..start]);
            o.push_str(MASK);
            copied = end;
        }
        i = end;
    }
    out.map(|mut o| {
        o.push_str(&text[copied..]);
        o
    })
}

/// The query parameters never kept, whatever pattern asks for them (v5), compared
/// case-insensitively; so is a name ending in `token` or `_key`.
pub const NEVER_KEPT: [&str; 16] = [
    "token",
    "email",
    "e-mail",
    "mail",
    "password",
    "pass",
    "pwd",
    "secret",
    "session",
    "sessionid",
    "sid",
    "sig",
    "signature",
    "auth",
    "code",
    "key",
];

/// Whether a query parameter `name` names a secret ([`NEVER_KEPT`]), on each of its
/// percent-decodings too (at most [`DECODINGS`] rounds).
fn never_kept(name: &str) -> bool {
    let secret = |n: &str| {
        // An ASCII name (nearly all) is compared without a lowercased copy (issue 53); any
        // other is lowercased as Unicode does, where `\u{212A}ey` (a Kelvin sign) is `key`.
        let lower;
        let n = if n.is_ascii() {
            n
        } else {
            lower = n.to_lowercase();
            lower.as_str()
        };
        let ends = |tail: &str| {
            n.len() >= tail.len()
                && n.as_bytes()[n.len() - tail.len()..].eq_ignore_ascii_case(tail.as_bytes())
        };
        NEVER_KEPT.iter().any(|s| n.eq_ignore_ascii_case(s)) || ends("token") || ends("_key")
    };
    let mut current = Cow::Borrowed(name);
    for _ in 0..DECODINGS {
        if secret(&current) {
            return true;
        }
        match decode_once(&current) {
            Some(decoded) => current = Cow::Owned(decoded),
            None => return false,
        }
    }
    secret(&current)
}

/// Whether a query parameter `name` is one of `keep` (a name, or a prefix ending in `*`) and
/// does not name a secret ([`NEVER_KEPT`]).
pub fn kept(name: &str, keep: &[String]) -> bool {
    keep.iter().any(|k| match k.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == k,
    }) && !never_kept(name)
}

/// A URL as the `url` crate writes an http(s) URL with a host (the `url` rule's output,
/// [`super::rules::normalise_url`]), read by position: minimising needs no second parse
/// (issue 53). `scheme://[userinfo@]host[:port]path[?query][#fragment]`, the path starting
/// with `/`, or absent (an origin, as a referrer from another site is stored: read as `/`).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Written<'a> {
    /// `scheme://`, the user info and its `@` (none after the `url` rule).
    before_host: &'a str,
    /// The host (an IPv6 one in brackets) and its port, `:` included.
    host_port: &'a str,
    /// The host alone, as [`Url::host_str`] gives it.
    host: &'a str,
    /// The path, from its `/`.
    path: &'a str,
    /// The query, without its `?` (`Some("")` for a lone `?`).
    query: Option<&'a str>,
    /// The fragment, from its `#` (none after the `url` rule).
    fragment: &'a str,
}

impl<'a> Written<'a> {
    /// `url`'s parts, `None` when it is not written as above.
    fn read(url: &'a str) -> Option<Written<'a>> {
        let (scheme, rest) = split_scheme(url)?;
        let scheme_end = scheme.len() + 3;
        // A byte search: `find` with a set of chars compares each char with each of the set.
        let path_at = rest
            .bytes()
            .position(|b| matches!(b, b'/' | b'?' | b'#'))
            .unwrap_or(rest.len());
        // Byte searches throughout (issue 53: `rfind`, `split` and `split_once` with a char
        // each set up a char searcher, which cost a beacon more than the scans).
        let authority = &rest[..path_at];
        let host_at = memchr::memrchr(b'@', authority.as_bytes()).map_or(0, |at| at + 1);
        let host_port = &authority[host_at..];
        let host = match host_port.strip_prefix('[') {
            Some(v6) => &host_port[..memchr::memchr(b']', v6.as_bytes())? + 2],
            None => {
                let colon = memchr::memchr(b':', host_port.as_bytes());
                &host_port[..colon.unwrap_or(host_port.len())]
            }
        };
        let tail = &rest[path_at..];
        let (tail, fragment) =
            tail.split_at(memchr::memchr(b'#', tail.as_bytes()).unwrap_or(tail.len()));
        let (path, query) = match memchr::memchr(b'?', tail.as_bytes()) {
            Some(at) => (&tail[..at], Some(&tail[at + 1..])),
            None => (tail, None),
        };
        // An origin as stored for a referrer from another site has no path: the `url` crate
        // writes its path as `/`.
        let path = if path.is_empty() { "/" } else { path };
        (!host.is_empty()).then_some(Written {
            before_host: &url[..scheme_end + host_at],
            host_port,
            host,
            path,
            query,
            fragment,
        })
    }

    /// Its origin, `scheme://host[:port]`, as [`url::Origin::ascii_serialization`] writes it.
    fn origin(&self) -> String {
        let scheme = split_scheme(self.before_host).map_or("", |(scheme, _)| scheme);
        let mut origin = String::with_capacity(scheme.len() + 3 + self.host_port.len());
        origin.push_str(scheme);
        origin.push_str("://");
        origin.push_str(self.host_port);
        origin
    }

    /// Its origin as [`Written::origin`] writes it, borrowed from `url` (the text it was read
    /// from) when that begins with it: no user info, which the `url` rule removes.
    fn origin_in(&self, url: &'a str) -> Cow<'a, str> {
        let end = self.before_host.len() + self.host_port.len();
        match url.get(..end) {
            Some(origin) if self.before_host.ends_with("://") => Cow::Borrowed(origin),
            _ => Cow::Owned(self.origin()),
        }
    }

    /// It as a page URL is stored ([`Written::minimised`]), `None` when that is `url` (the
    /// text it was read from) as it is: a path with nothing to mask, a query absent or kept
    /// whole and no fragment, as most pages' URLs are (issue 53: each was written anew).
    fn minimised_in(&self, url: &str, keep: &[String]) -> Option<String> {
        let path = mask_path(self.path);
        let query = self.query.map(|q| kept_query(q, keep));
        let whole = url.len()
            == self.before_host.len()
                + self.host_port.len()
                + self.path.len()
                + self.query.map_or(0, |q| q.len() + 1)
                + self.fragment.len();
        let query_kept = match (self.query, &query) {
            (Some(q), Some(kept)) => !q.is_empty() && kept == q,
            _ => true,
        };
        let untouched =
            whole && self.fragment.is_empty() && matches!(path, Cow::Borrowed(_)) && query_kept;
        (!untouched).then(|| self.written(&path, query.as_deref().unwrap_or("")))
    }

    /// It as a page URL is stored: the path masked, of the query only the parameters `keep`
    /// keeps, masked (a query left empty dropped with its `?`).
    fn minimised(&self, keep: &[String]) -> String {
        let path = mask_path(self.path);
        let query = self.query.map(|q| kept_query(q, keep)).unwrap_or_default();
        self.written(&path, &query)
    }

    /// It written with `path` and `query` (without its `?`; none when empty) for its own.
    fn written(&self, path: &str, query: &str) -> String {
        let mut out = String::with_capacity(
            self.before_host.len() + self.host_port.len() + path.len() + query.len() + 1,
        );
        out.push_str(self.before_host);
        out.push_str(self.host_port);
        out.push_str(path);
        if !query.is_empty() {
            out.push('?');
            out.push_str(query);
        }
        out.push_str(self.fragment);
        out
    }
}

/// Of the query `q` (without its `?`), the parameters `keep` keeps, in their order, names and
/// values masked, form-encoded.
fn kept_query(q: &str, keep: &[String]) -> String {
    let mut out = url::form_urlencoded::Serializer::new(String::new());
    for (name, value) in url::form_urlencoded::parse(q.as_bytes()) {
        if kept(&name, keep) {
            // Parsing the query decoded it once (reading `+` as a space). A name kept by a
            // prefix (`utm_*`) is masked as a value is: the rest of it is the client's.
            let name =
                mask_decoded(&name, DECODINGS - 1, VALUE_RULES, true).map_or(name, Cow::Owned);
            match mask_decoded(&value, DECODINGS - 1, VALUE_RULES, true) {
                Some(masked) => out.append_pair(&name, &masked),
                None => out.append_pair(&name, &value),
            };
        }
    }
    out.finish()
}

/// A page URL as stored: scheme, host, port, the masked path, and the kept query parameters
/// with masked names and values (see the module doc). `url` is parsed and written by the
/// `url` crate first; `None` if it does not parse or is no URL with a host.
pub fn page_url(url: &str, keep: &[String]) -> Option<String> {
    let url = Url::parse(url).ok()?;
    Some(Written::read(url.as_str())?.minimised(keep))
}

/// A resource URL as stored: scheme, host, port and the masked path. `url` is normalised
/// (the `url` rule's output); `None` if it is not written so.
pub fn resource_url(url: &str) -> Option<String> {
    let w = Written::read(url)?;
    Some(format!(
        "{}{}{}",
        w.before_host,
        w.host_port,
        mask_path(w.path)
    ))
}

/// A referrer as stored: its origin alone when its host is not `page_host` nor one for which
/// `same_site` holds, else minimised as a page URL; borrowed from `url` where that is what
/// is stored. `url` is normalised (the `url` rule's output); `None` if it is not written so.
pub fn referrer<'u>(
    url: &'u str,
    page_host: Option<&str>,
    same_site: impl Fn(&str) -> bool,
    keep: &[String],
) -> Option<Cow<'u, str>> {
    let w = Written::read(url)?;
    if Some(w.host) == page_host || same_site(w.host) {
        Some(
            w.minimised_in(url, keep)
                .map_or(Cow::Borrowed(url), Cow::Owned),
        )
    } else {
        Some(w.origin_in(url))
    }
}

/// Minimises a measurement's `url` and `referrer` as its site keeps them: `keep`, the query
/// parameters it keeps; `origins`, its allowed origins (`scheme://host[:port]`), whose hosts
/// count as the same site for a referrer. Both are normalised (the `url` rule's output), read
/// by position ([`Written`]), not parsed again.
pub fn urls(
    url: &mut Cow<'_, str>,
    referrer: &mut Option<Cow<'_, str>>,
    keep: &[String],
    origins: &[String],
) {
    let page = Written::read(url);
    let page_host = page.map(|p| p.host);
    let same_site = |host: &str| origins.iter().any(|o| origin_host(o) == host);
    if let Some(r) = referrer.as_deref() {
        // What is stored is most often the referrer itself or its origin, a prefix of it:
        // then it is cut to that length, not written again (issue 53).
        let stored = match self::referrer(r, page_host, same_site, keep) {
            None => None,
            Some(Cow::Borrowed(prefix)) => Some(Err(prefix.len())),
            Some(Cow::Owned(written)) => Some(Ok(written)),
        };
        match stored {
            None => *referrer = None,
            Some(Ok(written)) => *referrer = Some(Cow::Owned(written)),
            Some(Err(len)) => {
                if let Some(text) = referrer {
                    match text {
                        Cow::Borrowed(s) => *s = &s[..len],
                        Cow::Owned(s) => s.truncate(len),
                    }
                }
            }
        }
    }
    if let Some(minimised) = page.and_then(|p| p.minimised_in(url, keep)) {
        *url = Cow::Owned(minimised);
    }
}

/// `url` split at its first `://`: what precedes (the scheme) and the rest, as
/// `url.split_once("://")` splits it; found by a byte search for `:` (issue 53: the substring
/// search that `split_once` sets up on every call cost more than the scan itself).
pub fn split_scheme(url: &str) -> Option<(&str, &str)> {
    let bytes = url.as_bytes();
    let mut from = 0;
    while let Some(i) = memchr::memchr(b':', &bytes[from..]) {
        let at = from + i;
        if bytes[at + 1..].starts_with(b"//") {
            return Some((&url[..at], &url[at + 3..]));
        }
        from = at + 1;
    }
    None
}

/// The host of an origin `scheme://host[:port]`.
fn origin_host(origin: &str) -> &str {
    let rest = split_scheme(origin).map_or(origin, |(_, r)| r);
    // An IPv6 host is bracketed, and its port follows the bracket.
    match rest.strip_prefix('[') {
        Some(v6) => v6.split(']').next().map_or(rest, |h| &rest[..h.len() + 2]),
        None => rest.split(':').next().unwrap_or(rest),
    }
}

/// `path` (from its `/`, as the `url` crate writes it) with each segment masked on its
/// percent-decoded text ([`mask_decoded`]); a segment left as it was keeps its original
/// encoding, a masked one is written with [`SEGMENT`].
fn mask_path(path: &str) -> Cow<'_, str> {
    if !path.contains('%') && !may_hide(path, PATH_RULES) {
        return Cow::Borrowed(path);
    }
    let mut changed = false;
    let masked: Vec<Cow<'_, str>> = path
        .split('/')
        .map(
            |segment| match mask_decoded(segment, DECODINGS, PATH_RULES, false) {
                None => Cow::Borrowed(segment),
                Some(m) => {
                    changed = true;
                    Cow::Owned(utf8_percent_encode(&m, SEGMENT).to_string())
                }
            },
        )
        .collect();
    if changed {
        Cow::Owned(masked.join("/"))
    } else {
        Cow::Borrowed(path)
    }
}

#[cfg(test)]
mod tests;
