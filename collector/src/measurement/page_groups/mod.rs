//! Page groups (contract v4): which group a page view's minimised URL belongs to.
//!
//! A site's rules (`--page-group NAME=PATTERN`, in order; presets in [`presets`]) are compiled
//! once per settings load ([`PageGroups::compile`], kept next to the site's cached settings),
//! and matched per beacon against the stored path ([`PageGroups::group_of`]):
//!
//! - a pattern is a path of `/`-separated segments; the query is never matched;
//! - a segment `*` matches exactly one non-empty path segment; `**`, as the last segment,
//!   matches any rest, none included (`/cart/**` matches `/cart`, `/cart/` and `/cart/x/y`);
//! - any other segment matches the same text; one `*` inside it matches any characters
//!   within that one segment (`*.html` matches `tops-women.html`), an addition to the
//!   contract that the Magento preset needs;
//! - a trailing slash is a segment of its own (empty): `/cart` does not match `/cart/`, so
//!   that a preset can tell Shopware's categories (`/Clothing/`) from its products
//!   (`/Main-product/SW10001`);
//! - the first rule that matches names the group.
//!
//! With no rule matching, the group is the path itself with every masked part, every run of
//! digits and every id-like segment (hexadecimal of 8 or more characters) as `*`
//! ([`automatic`]).

pub mod presets;

use percent_encoding::utf8_percent_encode;

use super::minimise::PATH;

/// One segment of a compiled pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    /// The same text, or, with a `*` inside, this prefix and suffix around anything.
    Text {
        prefix: String,
        suffix: Option<String>,
    },
    /// `*`: any one non-empty segment.
    One,
    /// `**`: any rest (last).
    Rest,
}

/// One compiled rule.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    name: String,
    segments: Vec<Segment>,
}

/// A site's page-group rules, compiled; empty: every page gets its automatic group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageGroups {
    rules: Vec<Rule>,
}

/// The most rules a site has: every beacon of the site is matched against them in order, so
/// their number bounds the work per beacon (the largest preset has 14; 200 leaves a shop room).
pub const MAX_RULES: usize = 200;
/// The longest `NAME=PATTERN`, in bytes.
pub const MAX_RULE_BYTES: usize = 512;
/// The most `/`-separated segments of a pattern.
pub const MAX_SEGMENTS: usize = 64;

/// Why a `NAME=PATTERN` is not a rule ([`check`]); the message is what `collector sites`
/// prints.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// More than [`MAX_RULE_BYTES`] bytes.
    #[error("at most {MAX_RULE_BYTES} bytes")]
    TooLong,
    /// No `=` between a name and a pattern.
    #[error("must be NAME=PATTERN")]
    NotNamePattern,
    /// A name that is not 1 to 64 characters of `A-Za-z0-9._-`.
    #[error("the name must be 1 to 64 characters from A-Za-z0-9._-")]
    BadName,
    /// A pattern that is not a path: not starting with `/`, or with whitespace, `?` or `#`.
    #[error("the pattern must be a path starting with / (no query)")]
    NotAPath,
    /// More than [`MAX_SEGMENTS`] segments.
    #[error("at most {MAX_SEGMENTS} segments")]
    TooManySegments,
    /// `**` anywhere but last.
    #[error("** may only end the pattern")]
    RestNotLast,
    /// Two `*` in one segment (the segment's text).
    #[error("at most one * within the segment {0:?}")]
    TwoStars(String),
}

/// Why a site's list of rules is not one ([`check_all`]); the message is what `collector
/// sites` prints.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PageGroupsError {
    /// More than [`MAX_RULES`] rules (how many).
    #[error("{0} rules: at most {MAX_RULES} (every beacon is matched against them)")]
    TooMany(usize),
    /// The first rule [`check`] refuses, with why.
    #[error("{rule:?}: {error}")]
    Rule {
        /// The rule as given.
        rule: String,
        /// Why it is refused.
        #[source]
        error: RuleError,
    },
}

/// Why a `NAME=PATTERN` is not a rule: not `NAME=PATTERN`, a name not 1 to 64 characters of
/// `A-Za-z0-9._-`, a pattern not a path, more than [`MAX_RULE_BYTES`] bytes or
/// [`MAX_SEGMENTS`] segments, `**` not last, two `*` in one segment.
pub fn check(value: &str) -> Result<(), RuleError> {
    parse(value).map(|_| ())
}

/// Why a site's list of rules is not one: more than [`MAX_RULES`], or a rule that [`check`]
/// refuses (the first one, with its error).
pub fn check_all(rules: &[String]) -> Result<(), PageGroupsError> {
    if rules.len() > MAX_RULES {
        return Err(PageGroupsError::TooMany(rules.len()));
    }
    rules.iter().try_for_each(|r| {
        check(r).map_err(|error| PageGroupsError::Rule {
            rule: r.clone(),
            error,
        })
    })
}

/// Parses one `NAME=PATTERN`.
fn parse(value: &str) -> Result<Rule, RuleError> {
    if value.len() > MAX_RULE_BYTES {
        return Err(RuleError::TooLong);
    }
    let (name, pattern) = value.split_once('=').ok_or(RuleError::NotNamePattern)?;
    if !super::rules::is_site_key(name) {
        return Err(RuleError::BadName);
    }
    let Some(path) = pattern.strip_prefix('/') else {
        return Err(RuleError::NotAPath);
    };
    if pattern
        .chars()
        .any(|c| c.is_whitespace() || c == '?' || c == '#')
    {
        return Err(RuleError::NotAPath);
    }
    let parts: Vec<&str> = path.split('/').collect();
    if parts.len() > MAX_SEGMENTS {
        return Err(RuleError::TooManySegments);
    }
    let mut segments = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        segments.push(match *part {
            "**" if i + 1 == parts.len() => Segment::Rest,
            "**" => return Err(RuleError::RestNotLast),
            "*" => Segment::One,
            text => match text.split_once('*') {
                None => Segment::Text {
                    prefix: stored_form(text),
                    suffix: None,
                },
                Some((_, after)) if after.contains('*') => {
                    return Err(RuleError::TwoStars(text.to_owned()))
                }
                Some((before, after)) => Segment::Text {
                    prefix: stored_form(before),
                    suffix: Some(stored_form(after)),
                },
            },
        });
    }
    Ok(Rule {
        name: name.to_owned(),
        segments,
    })
}

/// A rule's segment text as a stored path writes it: `/größe` is matched as `/gr%C3%B6%C3%9Fe`
/// (text already percent-encoded stays as it is, its hexadecimal digits in upper case).
fn stored_form(text: &str) -> String {
    upper_hex(&utf8_percent_encode(text, PATH).to_string()).into_owned()
}

/// `text` with the hexadecimal digits of every `%XX` in upper case (RFC 3986 §6.2.2.1: the
/// same octet either way); borrowed when it has none in lower case.
fn upper_hex(text: &str) -> std::borrow::Cow<'_, str> {
    let b = text.as_bytes();
    let lower = |i: usize| {
        b[i] == b'%'
            && i + 2 < b.len()
            && b[i + 1].is_ascii_hexdigit()
            && b[i + 2].is_ascii_hexdigit()
            && (b[i + 1].is_ascii_lowercase() || b[i + 2].is_ascii_lowercase())
    };
    if !(0..b.len()).any(lower) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = b.to_vec();
    for i in 0..b.len() {
        if lower(i) {
            out[i + 1].make_ascii_uppercase();
            out[i + 2].make_ascii_uppercase();
        }
    }
    // Only ASCII hexadecimal digits changed case: still UTF-8.
    std::borrow::Cow::Owned(String::from_utf8(out).expect("ASCII changes keep UTF-8"))
}

impl PageGroups {
    /// Compiles a site's rules, in order; a rule that does not parse, and every rule past the
    /// first [`MAX_RULES`], is left out (only a row written by hand gets here: `collector
    /// sites` checks the list with [`check_all`]).
    pub fn compile(rules: &[String]) -> PageGroups {
        PageGroups {
            rules: rules
                .iter()
                .take(MAX_RULES)
                .filter_map(|r| parse(r).ok())
                .collect(),
        }
    }

    /// How many rules the site has compiled (at most [`MAX_RULES`]).
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Whether the site has no rule (every page gets its automatic group).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The group of a page at `url` (a stored, minimised URL): the first rule's name whose
    /// pattern its path matches, else [`automatic`] of the path.
    pub fn group_of(&self, url: &str) -> String {
        let path = path_of(url);
        // A page's links may write `%c3` where a rule is compiled to `%C3`: matched alike.
        let upper = upper_hex(path);
        let segments: Vec<&str> = upper
            .strip_prefix('/')
            .unwrap_or(&upper)
            .split('/')
            .collect();
        self.rules
            .iter()
            .find(|r| matches(&r.segments, &segments))
            .map_or_else(|| automatic(path), |r| r.name.clone())
    }
}

/// The path of a URL `scheme://host[:port]/path[?query]` (`/` when it has none).
fn path_of(url: &str) -> &str {
    let rest = super::minimise::split_scheme(url).map_or(url, |(_, r)| r);
    let path = rest.find('/').map_or("/", |i| &rest[i..]);
    path.split(['?', '#']).next().unwrap_or("/")
}

/// Whether path `segments` match a pattern's.
fn matches(pattern: &[Segment], segments: &[&str]) -> bool {
    let mut i = 0;
    for p in pattern {
        match p {
            Segment::Rest => return true,
            Segment::One => match segments.get(i) {
                Some(s) if !s.is_empty() => {}
                _ => return false,
            },
            Segment::Text { prefix, suffix } => {
                let Some(s) = segments.get(i) else {
                    return false;
                };
                let ok = match suffix {
                    None => s == prefix,
                    Some(suffix) => {
                        s.len() >= prefix.len() + suffix.len()
                            && s.starts_with(prefix.as_str())
                            && s.ends_with(suffix.as_str())
                    }
                };
                if !ok {
                    return false;
                }
            }
        }
        i += 1;
    }
    i == segments.len()
}

/// The automatic group of a path: each segment that is id-like (8 or more hexadecimal digits
/// and nothing else) becomes `*`, and in the others each run of digits does; masked parts are
/// `*` already. `/orders/4711/items` is `/orders/*/items`, `/p/shoe-42` is `/p/shoe-*`.
pub fn automatic(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for (i, segment) in path.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        if segment.len() >= 8 && segment.bytes().all(|b| b.is_ascii_hexdigit()) {
            out.push('*');
            continue;
        }
        let mut in_digits = false;
        let mut chars = segment.chars();
        while let Some(c) = chars.next() {
            // A percent-encoded byte (`%C3`: part of a non-ASCII letter) is text, not digits.
            let rest = chars.as_str().as_bytes();
            if c == '%' && rest.len() >= 2 && rest[..2].iter().all(u8::is_ascii_hexdigit) {
                out.push('%');
                out.push_str(&chars.as_str()[..2]);
                chars.nth(1);
                in_digits = false;
            } else if c.is_ascii_digit() {
                if !in_digits {
                    out.push('*');
                }
                in_digits = true;
            } else {
                out.push(c);
                in_digits = false;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(rules: &[&str]) -> PageGroups {
        let rules: Vec<String> = rules.iter().map(|r| r.to_string()).collect();
        for r in &rules {
            check(r).unwrap();
        }
        PageGroups::compile(&rules)
    }

    #[test]
    fn first_match_wins_and_the_query_is_not_matched() {
        let g = groups(&["sale=/p/sale-*", "product=/p/*", "home=/", "cart=/cart/**"]);
        assert_eq!(
            g.group_of("https://s.example/p/sale-shoes?utm_source=x"),
            "sale"
        );
        assert_eq!(g.group_of("https://s.example/p/shoes"), "product");
        assert_eq!(g.group_of("https://s.example/"), "home");
        assert_eq!(g.group_of("https://s.example"), "home");
        assert_eq!(g.group_of("https://s.example/?q=1"), "home");
        for cart in ["/cart", "/cart/", "/cart/a/b"] {
            assert_eq!(g.group_of(&format!("https://s.example{cart}")), "cart");
        }
        assert_eq!(
            g.group_of("https://s.example/p/shoes/reviews"),
            "/p/shoes/reviews",
            "* is one segment"
        );
        assert_eq!(g.group_of("https://s.example/p/"), "/p/", "* is not empty");
        assert_eq!(g.group_of("https://s.example/cartx"), "/cartx");
    }

    #[test]
    fn a_trailing_slash_is_a_segment() {
        let g = groups(&["category=/*/", "product=/*/*"]);
        assert_eq!(g.group_of("https://s.example/Clothing/"), "category");
        assert_eq!(
            g.group_of("https://s.example/Main-product/SW10001"),
            "product"
        );
        assert_eq!(g.group_of("https://s.example/Clothing"), "/Clothing");
    }

    #[test]
    fn bad_rules_are_refused() {
        for (bad, why) in [
            ("product", "must be NAME=PATTERN"),
            (
                "=/p/*",
                "the name must be 1 to 64 characters from A-Za-z0-9._-",
            ),
            (
                "a b=/p",
                "the name must be 1 to 64 characters from A-Za-z0-9._-",
            ),
            (
                "p=p/*",
                "the pattern must be a path starting with / (no query)",
            ),
            (
                "p=/p?x=1",
                "the pattern must be a path starting with / (no query)",
            ),
            ("p=/**/x", "** may only end the pattern"),
            ("p=/a*b*c", "at most one * within the segment \"a*b*c\""),
            (
                "p=/p /q",
                "the pattern must be a path starting with / (no query)",
            ),
        ] {
            assert_eq!(check(bad).unwrap_err().to_string(), why, "{bad}");
        }
        assert_eq!(
            check_all(&["ok=/".into(), "product".into()])
                .unwrap_err()
                .to_string(),
            "\"product\": must be NAME=PATTERN"
        );
        assert_eq!(
            PageGroups::compile(&["bad".into(), "ok=/".into()])
                .rules
                .len(),
            1
        );
    }

    #[test]
    fn non_ascii_rules_match_and_automatic_groups_keep_encoded_letters() {
        let g = groups(&["groesse=/kategorie/größe-*"]);
        assert_eq!(
            g.group_of("https://s.example/kategorie/gr%C3%B6%C3%9Fe-42"),
            "groesse"
        );
        assert_eq!(
            g.group_of("https://s.example/kategorie/gr%c3%b6%c3%9fe-42"),
            "groesse",
            "lower-case escapes are the same octets"
        );
        assert_eq!(upper_hex("/a%2fb%zz%"), "/a%2Fb%zz%");
        assert_eq!(
            automatic("/kategorie/gr%C3%B6%C3%9Fe-42/%E2%82%AC9"),
            "/kategorie/gr%C3%B6%C3%9Fe-*/%E2%82%AC*"
        );
    }

    #[test]
    fn rules_are_bounded_in_number_length_and_segments() {
        let many: Vec<String> = (0..=MAX_RULES).map(|i| format!("g{i}=/p{i}")).collect();
        assert!(check_all(&many[..MAX_RULES]).is_ok());
        assert_eq!(
            check_all(&many).unwrap_err().to_string(),
            "201 rules: at most 200 (every beacon is matched against them)"
        );
        assert_eq!(PageGroups::compile(&many).rules.len(), MAX_RULES);
        let long = format!("g=/{}", "a".repeat(MAX_RULE_BYTES));
        assert_eq!(check(&long).unwrap_err().to_string(), "at most 512 bytes");
        let deep = format!("g={}", "/a".repeat(MAX_SEGMENTS + 1));
        assert_eq!(check(&deep).unwrap_err().to_string(), "at most 64 segments");
        assert!(check(&format!("g={}", "/a".repeat(MAX_SEGMENTS))).is_ok());
    }

    #[test]
    fn automatic_groups_hide_what_varies() {
        for (path, group) in [
            ("/orders/4711/items", "/orders/*/items"),
            ("/p/*", "/p/*"),
            ("/p/shoe-42", "/p/shoe-*"),
            ("/t/deadbeef01", "/t/*"),
            ("/t/deadbee", "/t/deadbee"),
            ("/t/cafebabe", "/t/*"),
            ("/blog/2026/12/03/sale", "/blog/*/*/*/sale"),
            ("/", "/"),
            ("/collections/shoes", "/collections/shoes"),
        ] {
            assert_eq!(automatic(path), group, "{path}");
        }
        assert_eq!(
            PageGroups::default().group_of("https://s.example/orders/*/items?utm_x=1"),
            "/orders/*/items"
        );
    }
}
