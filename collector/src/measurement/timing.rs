//! `server_timing` (contract v4 §2): the page's navigation Server-Timing entries, judged here,
//! stored as three parallel arrays (`server_timing_name`, `server_timing_dur`,
//! `server_timing_desc`), and the CDN cache status read from them (`cdn_cache`).

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::column::Label;
use super::rules::{self, Field, MAX_MS};

/// Most entries kept; the first ones are kept, the rest ignored (contract v4 §2).
pub const MAX_ENTRIES: usize = 10;
/// Longest `name` and `desc`, in bytes (contract v4 §2).
pub const MAX_TEXT_BYTES: usize = 64;

/// One Server-Timing entry (the `PerformanceServerTiming` of the page's navigation).
#[derive(Debug, Clone, PartialEq)]
pub struct Timing<'a> {
    /// The metric's name, 1 to [`MAX_TEXT_BYTES`] bytes.
    pub name: Cow<'a, str>,
    /// Its duration in milliseconds, 0 to 3,600,000; 0 when not sent (as the browser says).
    pub dur: f64,
    /// Its description, at most [`MAX_TEXT_BYTES`] bytes; empty when not sent.
    pub desc: Cow<'a, str>,
}

/// One entry as sent, its values undecoded; unknown keys are ignored.
#[derive(Deserialize)]
struct RawTiming<'a> {
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    dur: Option<&'a RawValue>,
    #[serde(borrow, default)]
    desc: Option<&'a RawValue>,
}

/// The `server_timing` rule: an array of objects `{"name", "dur", "desc"}`, of which the first
/// [`MAX_ENTRIES`] are judged and kept; any of them broken (not an object, `name` missing,
/// empty or too long, `dur` out of 0 to 3,600,000, `desc` too long or not a string) makes the
/// field invalid, dropped whole. The array is read in one pass ([`Entries`]).
pub fn server_timing(value: Option<&RawValue>) -> Field<Vec<Timing<'_>>> {
    let Some(raw) = value else {
        return Field::Absent;
    };
    match serde_json::from_str::<Entries>(raw.get()) {
        Ok(Entries(entries)) => Field::Valid(entries),
        Err(_) => Field::Invalid,
    }
}

/// The judged entries of a `server_timing` array, read as they come: each of the first
/// [`MAX_ENTRIES`] as a [`RawTiming`], then judged ([`entry`]); the rest skipped as
/// [`RawValue`]s, unjudged. A broken entry fails the reading (issue 53: the array was read
/// twice, once into a list of items, then each item again).
struct Entries<'a>(Vec<Timing<'a>>);

impl<'de> Deserialize<'de> for Entries<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct EntriesVisitor;
        impl<'de> Visitor<'de> for EntriesVisitor {
            type Value = Entries<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of Server-Timing entries")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(MAX_ENTRIES));
                while out.len() < MAX_ENTRIES {
                    let Some(raw) = seq.next_element::<RawTiming<'de>>()? else {
                        return Ok(Entries(out));
                    };
                    out.push(entry(raw).ok_or_else(|| de::Error::custom("a broken entry"))?);
                }
                while seq.next_element::<&'de RawValue>()?.is_some() {}
                Ok(Entries(out))
            }
        }
        d.deserialize_seq(EntriesVisitor)
    }
}

/// One entry, or `None` when it breaks the rule.
fn entry(raw: RawTiming<'_>) -> Option<Timing<'_>> {
    let name = rules::text(raw.name)
        .check(|n| (1..=MAX_TEXT_BYTES).contains(&n.len()))
        .stored()?;
    let dur = match raw.dur.map(rules::number) {
        None => 0.0,
        Some(Field::Valid(d)) if (0.0..=MAX_MS).contains(&d) => d,
        Some(_) => return None,
    };
    let desc = match rules::text(raw.desc) {
        Field::Absent => Cow::Borrowed(""),
        Field::Valid(d) if d.len() <= MAX_TEXT_BYTES => d,
        _ => return None,
    };
    Some(Timing { name, dur, desc })
}

/// One of the parallel arrays of the judged entries: `part` of each, in order; empty when the
/// field was absent or dropped.
pub fn column<'a, T>(judged: &Field<Vec<Timing<'a>>>, part: impl Fn(&Timing<'a>) -> T) -> Vec<T> {
    match judged {
        Field::Valid(entries) => entries.iter().map(part).collect(),
        _ => Vec::new(),
    }
}

/// The entry names that carry a CDN's cache status: `cdn-cache` (Akamai, and the convention
/// RUM vendors document) and `cfCacheStatus` (Cloudflare).
pub const CACHE_ENTRIES: [&str; 2] = ["cdn-cache", "cfCacheStatus"];

/// An entry's name as stored: masked as a URL's path, on its percent-decoded text too ([`super::minimise::mask_text`]), so that a
/// name that carries an address, a token or a long number does not reach disk.
pub fn stored_name<'a>(t: &Timing<'a>) -> Cow<'a, str> {
    match super::minimise::mask_text(&t.name) {
        Cow::Borrowed(_) => t.name.clone(),
        Cow::Owned(m) => Cow::Owned(m),
    }
}

/// An entry's `desc` as stored: kept for the cache entries ([`CACHE_ENTRIES`]) only, masked;
/// empty for every other entry. Shop platforms put visitor and session ids in `desc` (Shopify's
/// `_y` and `_s` carry UUIDs that last a year: found by an adversarial review), and no reader
/// needs another entry's description.
pub fn stored_desc<'a>(t: &Timing<'a>) -> Cow<'a, str> {
    if !CACHE_ENTRIES.contains(&t.name.as_ref()) {
        return Cow::Borrowed("");
    }
    match super::minimise::mask_text(&t.desc) {
        Cow::Borrowed(_) => t.desc.clone(),
        Cow::Owned(m) => Cow::Owned(m),
    }
}

/// `cdn_cache` (contract v4): from the first entry named as in [`CACHE_ENTRIES`], its `desc`
/// compared case-insensitively: `HIT` is `hit`; `MISS`, `EXPIRED` are `miss`; `STALE`,
/// `UPDATING`, `REVALIDATED` are `stale`; `BYPASS`, `PASS`, `DYNAMIC` are `pass`; anything
/// else, or no such entry, is empty.
pub fn cdn_cache(judged: &Field<Vec<Timing<'_>>>) -> Label<'static> {
    let Field::Valid(entries) = judged else {
        return Label::default();
    };
    let Some(entry) = entries
        .iter()
        .find(|t| CACHE_ENTRIES.contains(&t.name.as_ref()))
    else {
        return Label::default();
    };
    let d = entry.desc.trim();
    let status = if d.eq_ignore_ascii_case("HIT") {
        "hit"
    } else if ["MISS", "EXPIRED"]
        .iter()
        .any(|s| d.eq_ignore_ascii_case(s))
    {
        "miss"
    } else if ["STALE", "UPDATING", "REVALIDATED"]
        .iter()
        .any(|s| d.eq_ignore_ascii_case(s))
    {
        "stale"
    } else if ["BYPASS", "PASS", "DYNAMIC"]
        .iter()
        .any(|s| d.eq_ignore_ascii_case(s))
    {
        "pass"
    } else {
        ""
    };
    Label(Cow::Borrowed(status))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judge(json: &str) -> Field<Vec<Timing<'_>>> {
        let raw: &RawValue = serde_json::from_str(json).unwrap();
        server_timing(Some(raw))
    }

    #[test]
    fn entries_are_kept_in_order_with_defaults() {
        let Field::Valid(t) =
            judge(r#"[{"name":"db","dur":12.5,"desc":"Postgres"},{"name":"app","x":1}]"#)
        else {
            panic!("valid")
        };
        assert_eq!(t.len(), 2);
        assert_eq!(
            (&*t[0].name, t[0].dur, &*t[0].desc),
            ("db", 12.5, "Postgres")
        );
        assert_eq!((&*t[1].name, t[1].dur, &*t[1].desc), ("app", 0.0, ""));
    }

    #[test]
    fn only_a_cache_entrys_desc_is_stored_and_names_are_masked() {
        let Field::Valid(t) = judge(
            r#"[{"name":"_y","desc":"6c6e910e-2f0c-4d7a-9a55-0c1f5e2b7d11"},{"name":"cdn-cache","desc":"HIT"},{"name":"bob@example.com"}]"#,
        ) else {
            panic!("valid")
        };
        assert_eq!(stored_desc(&t[0]), "", "a visitor id");
        assert_eq!(stored_desc(&t[1]), "HIT");
        assert!(
            !stored_name(&t[2]).contains("bob@"),
            "{}",
            stored_name(&t[2])
        );
        assert_eq!(stored_name(&t[1]), "cdn-cache");
    }

    #[test]
    fn the_first_ten_are_kept() {
        let many: Vec<String> = (0..15)
            .map(|i| format!(r#"{{"name":"m{i}","dur":{i}}}"#))
            .collect();
        let json = format!("[{}]", many.join(","));
        let Field::Valid(t) = judge(&json) else {
            panic!("valid")
        };
        assert_eq!(t.len(), MAX_ENTRIES);
        assert_eq!(t[9].name, "m9");
    }

    #[test]
    fn a_broken_entry_drops_the_field() {
        let long = "x".repeat(65);
        for bad in [
            r#"{"name":"db"}"#.to_owned(),
            r#"[{"dur":1}]"#.to_owned(),
            r#"[{"name":""}]"#.to_owned(),
            r#"[{"name":"db","dur":-1}]"#.to_owned(),
            r#"[{"name":"db","dur":3600001}]"#.to_owned(),
            r#"[{"name":"db","dur":"1"}]"#.to_owned(),
            r#"[{"name":"db","desc":7}]"#.to_owned(),
            r#"[1]"#.to_owned(),
            format!(r#"[{{"name":"{long}"}}]"#),
            format!(r#"[{{"name":"db","desc":"{long}"}}]"#),
        ] {
            assert_eq!(judge(&bad), Field::Invalid, "{bad}");
        }
        assert_eq!(judge("[]"), Field::Valid(vec![]));
        assert_eq!(server_timing(None), Field::Absent);
    }

    #[test]
    fn the_cache_status_of_the_first_cache_entry() {
        for (json, status) in [
            (r#"[{"name":"cdn-cache","desc":"HIT"}]"#, "hit"),
            (r#"[{"name":"cfCacheStatus","desc":"miss"}]"#, "miss"),
            (r#"[{"name":"cdn-cache","desc":"Expired"}]"#, "miss"),
            (r#"[{"name":"cdn-cache","desc":"STALE"}]"#, "stale"),
            (r#"[{"name":"cdn-cache","desc":"updating"}]"#, "stale"),
            (r#"[{"name":"cdn-cache","desc":"REVALIDATED"}]"#, "stale"),
            (r#"[{"name":"cdn-cache","desc":"BYPASS"}]"#, "pass"),
            (r#"[{"name":"cdn-cache","desc":"pass"}]"#, "pass"),
            (r#"[{"name":"cfCacheStatus","desc":"DYNAMIC"}]"#, "pass"),
            (r#"[{"name":"cdn-cache","desc":"WEIRD"}]"#, ""),
            (r#"[{"name":"cdn-cache"}]"#, ""),
            (r#"[{"name":"edge","desc":"HIT"}]"#, ""),
            (
                r#"[{"name":"db","desc":"HIT"},{"name":"cdn-cache","desc":"MISS"},{"name":"cfCacheStatus","desc":"HIT"}]"#,
                "miss",
            ),
        ] {
            assert_eq!(&*cdn_cache(&judge(json)), status, "{json}");
        }
        assert_eq!(&*cdn_cache(&Field::Invalid), "");
    }
}
