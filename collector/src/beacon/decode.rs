//! From body bytes to one [`RawBeacon`] per measurement, each field still undecoded.
//!
//! The body is read as `JSON.parse` in a browser would read it (contract §2), so that every
//! fault costs only what it touches:
//!
//! - **Text**: the bytes are decoded as the WHATWG "UTF-8 decode" does (a leading byte-order
//!   mark skipped, an invalid byte replaced by U+FFFD), and bare `NaN`, `Infinity` and
//!   `-Infinity` tokens in value position, which some JSON encoders write, are quoted so that
//!   they reach their field as an invalid value; so are the signed spellings other encoders
//!   and JSON5 write (`-NaN`, `+NaN`, `+Infinity`: a C `printf` of a negative NaN).
//! - **Syntax**: broken JSON syntax (unbalanced brackets, bad tokens, trailing bytes) makes
//!   the whole body malformed.
//! - **Values**: each array item, field name and field value is kept as a borrowed
//!   [`RawValue`], which serde_json skips over without decoding: it checks the number grammar
//!   but not the range, and a `\u` escape's hex digits but not whether a surrogate is paired
//!   (`ignore_value`, `ignore_integer`, `ignore_escape` in serde_json 1.0's `de.rs` and
//!   `read.rs`). So `1e400` or `"\ud83d"` fail only when their own field is judged (the
//!   decoders in [`crate::measurement::rules`]), and that field alone is invalid. Skipping is
//!   iterative, so an unknown field nested as deep as 64 KiB allow is ignored too. The fields
//!   kept are the request fields of the field table ([`RawBeacon`]).
//! - **Shape**: only objects are measurements; an array item that is not one is rejected
//!   alone. A duplicated key takes its last value, as `JSON.parse` does.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{DecodeError, MAX_BATCH};
use crate::measurement::rules::string;
use crate::measurement::{Field, RawBeacon, Rejection};

/// The rejection of an array item that is not a JSON object.
pub const NOT_AN_OBJECT: Rejection = "not a measurement object";

/// The body as text (see the module doc): borrowed unless a byte had to be replaced or a
/// non-finite token quoted.
pub fn text(body: &[u8]) -> Cow<'_, str> {
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    // Valid UTF-8 (nearly every body) is checked a word at a time; only a body with a bad
    // byte pays for the lossy reading, byte by byte.
    let text = match std::str::from_utf8(body) {
        Ok(text) => Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(body),
    };
    // Most bodies hold neither token: one search spares them the rewrite's copy.
    let holds = |token: &str| memchr::memmem::find(text.as_bytes(), token.as_bytes()).is_some();
    if !holds("NaN") && !holds("Infinity") {
        return text;
    }
    match non_finite_as_strings(&text) {
        Some(fixed) => Cow::Owned(fixed),
        None => text,
    }
}

/// The non-finite number spellings of JSON encoders that are not JSON, signed ones first (so
/// that `-NaN` is not read as `-` then `NaN`). Each holds `NaN` or `Infinity`, the two words
/// [`text`] looks for before rewriting.
const NON_FINITE: [&str; 6] = ["-Infinity", "+Infinity", "-NaN", "+NaN", "Infinity", "NaN"];

/// Rewrites bare [`NON_FINITE`] tokens outside strings, in value position (after `:`, `[`, or
/// `,` inside an array; never as an object key), as JSON strings. `None` when there is none.
/// Signed spellings are tokens of their own: a bare `-` left before `NaN` would break the
/// body's syntax, and one field's fault would cost the whole beacon (400).
fn non_finite_as_strings(text: &str) -> Option<String> {
    let body = text.as_bytes();
    let mut out = Vec::with_capacity(body.len() + 16);
    let (mut in_string, mut escaped, mut changed, mut i) = (false, false, false, 0);
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
        if let Some(token) = NON_FINITE
            .into_iter()
            .find(|t| value_position && rest.starts_with(t.as_bytes()))
        {
            out.push(b'"');
            out.extend_from_slice(token.as_bytes());
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
    // Only ASCII tokens were inserted between whole UTF-8 sequences.
    changed.then(|| String::from_utf8(out).expect("still UTF-8"))
}

/// Reads one measurement object into the request fields of the field table
/// ([`RawBeacon::set`]), each value undecoded. `ONE_PASS`: each key read as a string as it
/// comes ([`Key`]), which fails the whole reading on a key with a lone surrogate; else each key
/// skipped as a [`RawValue`] first, and a key that does not decode ignored.
fn object_from_map<'a, A: MapAccess<'a>, const ONE_PASS: bool>(
    mut map: A,
) -> Result<RawBeacon<'a>, A::Error> {
    let mut beacon = RawBeacon::default();
    if ONE_PASS {
        while let Some(Key(key)) = map.next_key::<Key<'a>>()? {
            beacon.set(&key, map.next_value::<&'a RawValue>()?);
        }
        return Ok(beacon);
    }
    while let Some(key) = map.next_key::<&'a RawValue>()? {
        let value = map.next_value::<&'a RawValue>()?;
        // A key that does not decode (a lone surrogate) is no known field's name.
        if let Field::Valid(key) = string(key) {
            beacon.set(&key, value);
        }
    }
    Ok(beacon)
}

/// An object key read as a string in one pass, borrowed unless it holds an escape (issue 53:
/// a key skipped as a [`RawValue`] was scanned twice, once skipped, then decoded).
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_borrowed_str<E>(self, key: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(key)))
            }
            fn visit_str<E>(self, key: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(key.to_owned())))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// One measurement object, as [`object_from_map`] reads it item by item.
struct Object<'a>(RawBeacon<'a>);

impl<'de> Deserialize<'de> for Object<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ObjectVisitor;
        impl<'de> Visitor<'de> for ObjectVisitor {
            type Value = Object<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a measurement object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                object_from_map::<A, false>(map).map(Object)
            }
        }
        d.deserialize_map(ObjectVisitor)
    }
}

/// A decoded body element: a measurement object, or the reason it is not one.
pub type Item<'a> = Result<RawBeacon<'a>, Rejection>;

/// Parses body text (from [`text`]) into at most [`MAX_BATCH`] items.
///
/// Errors: empty body, broken JSON syntax, trailing bytes, a top level that is neither object
/// nor array, an empty array, or more than [`MAX_BATCH`] elements.
pub fn parse(text: &str) -> Result<Vec<Item<'_>>, DecodeError> {
    if text.trim_start().is_empty() {
        return Err(DecodeError::Malformed("empty body".into()));
    }
    // One pass reads nearly every body. A body it cannot read (broken syntax, or an array
    // item beyond f64 or with a lone surrogate, which must cost only that item) is read again
    // item by item, each skipped first: that reading decides, and its error is the answer.
    let top = match serde_json::from_str::<TopOf<true>>(text) {
        Ok(top) => top.0,
        Err(_) => {
            serde_json::from_str::<TopOf<false>>(text)
                .map_err(malformed)?
                .0
        }
    };
    match top {
        Top::Items(items) => Ok(items),
        Top::EmptyArray => Err(DecodeError::Malformed("empty array".into())),
        Top::TooMany => Err(DecodeError::Malformed(format!(
            "more than {MAX_BATCH} measurements"
        ))),
    }
}

/// A body that is not JSON, or not an object or array at its top, as answered: serde_json's
/// words for broken syntax, but never its words for a wrong type, which quote the value (a
/// top-level string may be an e-mail address; contract v4 §5: none in an error answer).
fn malformed(e: serde_json::Error) -> DecodeError {
    DecodeError::Malformed(match e.classify() {
        serde_json::error::Category::Data => format!(
            "invalid JSON: not a measurement object or an array of them at line {} column {}",
            e.line(),
            e.column()
        ),
        _ => format!("invalid JSON: {e}"),
    })
}

/// The top-level value of a body.
#[derive(Debug)]
enum Top<'a> {
    /// One object, or an array of 1 to [`MAX_BATCH`] items.
    Items(Vec<Item<'a>>),
    EmptyArray,
    TooMany,
}

/// A body's [`Top`], read in one pass (`ONE_PASS`: each array item read as it comes, which
/// fails the whole reading on an item beyond f64 or with a lone surrogate) or item by item
/// (each item skipped as a [`RawValue`] first, then read: such an item is rejected alone).
/// Both readings give the same items for every body the one pass reads (issue 53: the one
/// pass spares each item of a batch a second scan).
struct TopOf<'a, const ONE_PASS: bool>(Top<'a>);

impl<'de, const ONE_PASS: bool> Deserialize<'de> for TopOf<'de, ONE_PASS> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TopVisitor<const ONE_PASS: bool>;
        impl<'de, const ONE_PASS: bool> Visitor<'de> for TopVisitor<ONE_PASS> {
            type Value = Top<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a measurement object or an array of them")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Top<'de>, A::Error> {
                object_from_map::<A, ONE_PASS>(map).map(|b| Top::Items(vec![Ok(b)]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Top<'de>, A::Error> {
                if ONE_PASS {
                    items_in_one_pass(seq)
                } else {
                    items_skipped_first(seq)
                }
            }
        }
        d.deserialize_any(TopVisitor::<ONE_PASS>).map(TopOf)
    }
}

/// The items an array's reading makes room for before its first item: 16, more than the
/// batches of 10 of the benchmark and of servers that forward beacons in bulk (issue 53); a
/// longer array grows as before, up to [`MAX_BATCH`].
const BATCH_ROOM: usize = 16;

/// The items of a top-level array, each read as it comes ([`OnePassItem`]).
fn items_in_one_pass<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Top<'de>, A::Error> {
    // serde_json gives no length: room made up front spares a batch of 10 the growth's
    // copies of items this large (about 760 bytes each).
    let mut items = Vec::with_capacity(BATCH_ROOM);
    while let Some(OnePassItem(item)) = seq.next_element()? {
        if items.len() == MAX_BATCH {
            // Still consume the rest so that broken syntax is reported first.
            while seq.next_element::<de::IgnoredAny>()?.is_some() {}
            return Ok(Top::TooMany);
        }
        items.push(item);
    }
    Ok(top_of(items))
}

/// The items of a top-level array, each skipped first: a number item beyond f64 or a string
/// item with a lone surrogate must cost only that item, and only a skipped value can.
fn items_skipped_first<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Top<'de>, A::Error> {
    let mut items = Vec::new();
    while let Some(raw) = seq.next_element::<&'de RawValue>()? {
        if items.len() == MAX_BATCH {
            // Still consume the rest so that broken syntax is reported first.
            while seq.next_element::<&'de RawValue>()?.is_some() {}
            return Ok(Top::TooMany);
        }
        let item = if raw.get().starts_with('{') {
            // Syntax was checked while skipping: this cannot fail.
            Ok(serde_json::from_str::<Object>(raw.get())
                .map_err(de::Error::custom)?
                .0)
        } else {
            Err(NOT_AN_OBJECT)
        };
        items.push(item);
    }
    Ok(top_of(items))
}

/// The [`Top`] of an array's items.
fn top_of(items: Vec<Item<'_>>) -> Top<'_> {
    if items.is_empty() {
        Top::EmptyArray
    } else {
        Top::Items(items)
    }
}

/// An array item read as it comes: an object into its fields ([`object_from_map`]), any
/// other value consumed and rejected as [`NOT_AN_OBJECT`]. Fails on a number beyond f64, on
/// a string with a lone surrogate and on a key with one, which [`parse`] then reads again
/// item by item.
struct OnePassItem<'a>(Item<'a>);

/// What every array item but an object reads as.
fn not_an_object<'a, E>() -> Result<OnePassItem<'a>, E> {
    Ok(OnePassItem(Err(NOT_AN_OBJECT)))
}

impl<'de> Deserialize<'de> for OnePassItem<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ItemVisitor;
        impl<'de> Visitor<'de> for ItemVisitor {
            type Value = OnePassItem<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array item")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                object_from_map::<A, true>(map).map(|b| OnePassItem(Ok(b)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<de::IgnoredAny>()?.is_some() {}
                not_an_object()
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                not_an_object()
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                not_an_object()
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                not_an_object()
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                not_an_object()
            }
            fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
                not_an_object()
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                not_an_object()
            }
        }
        d.deserialize_any(ItemVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::measurement::rules::{integer, number};

    /// Every request field is a column, in column order, but those without a column of their
    /// own (`server_timing`, `dimensions`: stored as arrays the collector sets), and the
    /// columns that are not request fields are exactly those the collector sets.
    #[test]
    fn request_fields_are_the_columns_the_client_sends() {
        let fields: Vec<&str> = crate::measurement::request_fields().collect();
        let sent: Vec<&str> = crate::measurement::COLUMNS
            .iter()
            .copied()
            .filter(|c| fields.contains(c))
            .collect();
        let without_column = ["server_timing", "dimensions"];
        assert_eq!(&fields[fields.len() - 2..], without_column);
        assert_eq!(sent, fields[..fields.len() - 2]);
        let set_here: Vec<&str> = crate::measurement::COLUMNS
            .iter()
            .copied()
            .filter(|c| !fields.contains(c))
            .collect();
        assert_eq!(
            set_here,
            [
                "received_at",
                "user_agent",
                "page_view_at",
                "device_type",
                "browser",
                "browser_version",
                "os",
                "country",
                "server_timing_name",
                "server_timing_dur",
                "server_timing_desc",
                "cdn_cache",
                "dimension_names",
                "dimension_values",
                "page_group"
            ]
        );
    }

    fn raw(json: &str) -> Box<RawValue> {
        RawValue::from_string(json.to_owned()).unwrap()
    }

    #[test]
    fn text_is_read_as_a_browser_reads_it() {
        assert_eq!(text(b"\xEF\xBB\xBF{}"), "{}");
        assert!(matches!(text(b"{\"a\":1}"), Cow::Borrowed(_)));
        assert_eq!(text(b"{\"a\":\"x\xffy\"}"), "{\"a\":\"x\u{FFFD}y\"}");
        assert_eq!(
            text(b"{\"a\":NaN,\"b\":[Infinity,-Infinity],\"NaN\":\"NaN\"}"),
            "{\"a\":\"NaN\",\"b\":[\"Infinity\",\"-Infinity\"],\"NaN\":\"NaN\"}"
        );
        assert!(matches!(text(b"{\"u\":\"/NaN\"}"), Cow::Borrowed(_)));
        assert_eq!(
            text(b"{\"a\":-NaN,\"b\":[+NaN, +Infinity],\"c\":\"-NaN\"}"),
            "{\"a\":\"-NaN\",\"b\":[\"+NaN\", \"+Infinity\"],\"c\":\"-NaN\"}"
        );
    }

    #[test]
    fn strings() {
        assert_eq!(string(&raw(r#""abc""#)), Field::Valid("abc".into()));
        assert_eq!(
            string(&raw(r#""a\"b\u00fc""#)),
            Field::Valid("a\"bü".into())
        );
        assert_eq!(
            string(&raw(r#""\ud83d\ude00""#)),
            Field::Valid("\u{1F600}".into())
        );
        assert_eq!(string(&raw(r#""cut \ud83d""#)), Field::Invalid);
        assert_eq!(string(&raw(r#""\ude00 alone""#)), Field::Invalid);
        assert_eq!(string(&raw("12")), Field::Invalid);
        assert_eq!(string(&raw("[\"a\"]")), Field::Invalid);
    }

    #[test]
    fn numbers() {
        assert_eq!(number(&raw("12.5")), Field::Valid(12.5));
        assert_eq!(number(&raw("-0")), Field::Valid(0.0));
        assert_eq!(number(&raw("1e400")), Field::Invalid);
        assert_eq!(number(&raw("-1e400")), Field::Invalid);
        assert_eq!(number(&raw("1e-400")), Field::Valid(0.0));
        assert_eq!(number(&raw("\"12\"")), Field::Invalid);
        assert_eq!(number(&raw("\"NaN\"")), Field::Invalid);
        assert_eq!(number(&raw("true")), Field::Invalid);
    }

    /// `number` and `integer` read with `str::parse` what a second serde_json deserializer
    /// (with `float_roundtrip`, as built) read before: the same value or the same refusal, on
    /// hand-picked spellings and 20,000 drawn ones (digits, fractions, exponents, signs,
    /// halfway cases and the ends of f64 and i64).
    #[test]
    fn numbers_read_as_serde_json_reads_them() {
        let by_serde = |s: &str| match serde_json::from_str::<f64>(s) {
            Ok(x) if x.is_finite() => Field::Valid(x),
            _ => Field::Invalid,
        };
        let integer_by_serde = |s: &str| match serde_json::from_str::<i64>(s) {
            Ok(n) => Field::Valid(n),
            Err(_) => match by_serde(s) {
                Field::Valid(x)
                    if x.fract() == 0.0 && x >= i64::MIN as f64 && x < i64::MAX as f64 =>
                {
                    Field::Valid(x as i64)
                }
                _ => Field::Invalid,
            },
        };
        let mut spellings: Vec<String> = [
            "0",
            "-0",
            "0.0",
            "-0.0",
            "1",
            "-1",
            "9007199254740993",
            "9223372036854775807",
            "9223372036854775808",
            "-9223372036854775808",
            "-9223372036854775809",
            "18446744073709551616",
            "1.7976931348623157e308",
            "1.7976931348623159e308",
            "2.2250738585072014e-308",
            "4.9e-324",
            "2.4e-324",
            "2.5e-324",
            "1e-400",
            "1e400",
            "0.1",
            "0.30000000000000004",
            "9007199254740993.0",
            "1E5",
            "1e+5",
            "1e-5",
            "123456789012345678901234567890",
            "2.00000000000000011102230246251565404236316680908203125",
            "1.00000000000000011102230246251565404236316680908203125",
            "1280.000",
            "1.28e3",
        ]
        .map(str::to_owned)
        .to_vec();
        let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..20_000 {
            let r = next();
            let digits = |n: u64, len: u64| {
                let mut s = (n % 9 + 1).to_string();
                for i in 1..len {
                    s.push(char::from(b'0' + ((n >> (i % 60)) % 10) as u8));
                }
                s
            };
            let mut s = String::new();
            if r & 1 == 1 {
                s.push('-');
            }
            s += &digits(next(), 1 + r % 20);
            if r & 2 == 2 {
                s = format!("{s}.{}", digits(next(), 1 + (r >> 8) % 25));
            }
            if r & 4 == 4 {
                let sign = ["", "+", "-"][((r >> 16) % 3) as usize];
                s = format!("{s}e{sign}{}", (r >> 20) % 330);
            }
            spellings.push(s);
        }
        for s in &spellings {
            assert_eq!(number(&raw(s)), by_serde(s), "number {s}");
            assert_eq!(integer(&raw(s)), integer_by_serde(s), "integer {s}");
        }
    }

    #[test]
    fn integers_in_any_spelling() {
        for spelling in ["1280", "1280.0", "1.28e3", "128000e-2", "1280.000"] {
            assert_eq!(integer(&raw(spelling)), Field::Valid(1280), "{spelling}");
        }
        assert_eq!(integer(&raw("-0.0")), Field::Valid(0));
        assert_eq!(
            integer(&raw("9007199254740993")),
            Field::Valid(9_007_199_254_740_993),
            "exact beyond 2^53"
        );
        for bad in ["1280.5", "1e400", "1e19", "\"1280\"", "[1280]"] {
            assert_eq!(integer(&raw(bad)), Field::Invalid, "{bad}");
        }
    }

    #[test]
    fn keys_last_duplicate_wins_and_null_is_absent() {
        let items = parse(r#"{"lcp_ms":1,"lcp_ms":2,"fcp_ms":3,"fcp_ms":null}"#).unwrap();
        let b = items[0].as_ref().unwrap();
        assert_eq!(b.lcp_ms.unwrap().get(), "2");
        assert!(b.fcp_ms.is_none());
        let items = parse(r#"{"lcp\u005fms":4,"\ud800":1}"#).unwrap();
        assert_eq!(
            items[0].as_ref().unwrap().lcp_ms.unwrap().get(),
            "4",
            "an escaped key names its field"
        );
    }

    #[test]
    fn faults_inside_values_do_not_break_the_body() {
        let items =
            parse(r#"[{"lcp_ms":1e400,"referrer":"\ud83d"}, 1e400, "\udc00", [1], {}]"#).unwrap();
        assert_eq!(items.len(), 5);
        let first = items[0].as_ref().unwrap();
        assert_eq!(first.lcp_ms.unwrap().get(), "1e400");
        assert_eq!(first.referrer.unwrap().get(), r#""\ud83d""#);
        for item in &items[1..4] {
            assert_eq!(item.as_ref().unwrap_err(), &NOT_AN_OBJECT);
        }
        assert!(items[4].is_ok());
    }

    #[test]
    fn deep_unknown_fields_are_skipped() {
        let depth = 20_000;
        let deep = format!(
            "{{\"x\":{}{},\"lcp_ms\":5}}",
            "[".repeat(depth),
            "]".repeat(depth)
        );
        let items = parse(&deep).unwrap();
        assert_eq!(items[0].as_ref().unwrap().lcp_ms.unwrap().get(), "5");
        let deep_item = format!("[{}{},{{}}]", "[".repeat(depth), "]".repeat(depth));
        let items = parse(&deep_item).unwrap();
        assert_eq!(items[0].as_ref().unwrap_err(), &NOT_AN_OBJECT);
        assert!(items[1].is_ok());
    }

    /// The one pass reads every body it can exactly as the item-by-item reading does, and
    /// cannot read those whose faults must cost one item only, which `parse` reads again.
    #[test]
    fn the_one_pass_reads_as_the_item_by_item_reading() {
        let many = format!("[{}]", vec!["{}"; MAX_BATCH + 1].join(","));
        let read = |body: &str, one_pass: bool| {
            if one_pass {
                serde_json::from_str::<TopOf<true>>(body).map(|t| format!("{:?}", t.0))
            } else {
                serde_json::from_str::<TopOf<false>>(body).map(|t| format!("{:?}", t.0))
            }
        };
        for body in [
            r#"{"id":"a","lcp_ms":1e400,"referrer":"\ud83d","x":[1,{"y":2}]}"#,
            r#"[{"id":"a","lcp_ms":5},{"id":"b","lcp_ms":5,"id":"c"}]"#,
            r#"[1, -2, 3.5, "s", "\u00e9", true, null, [1,[2]], {}, {"cls":0.1}]"#,
            r#"[[1e400, "\ud83d"], {}]"#,
            r#"[{"lcp\u005fms":7,"\u0063ls":0.5,"\ud83d\ude00":1}]"#,
            "[]",
            &many,
        ] {
            let one = read(body, true).expect(body);
            assert_eq!(one, read(body, false).unwrap(), "{body}");
        }
        assert_eq!(
            parse(&many).unwrap_err().to_string(),
            DecodeError::Malformed(format!("more than {MAX_BATCH} measurements")).to_string()
        );
        for body in [r#"[{}, 1e400]"#, r#"[{}, "\udc00"]"#] {
            assert!(read(body, true).is_err(), "{body}");
            let items = parse(body).unwrap();
            assert_eq!(items.last().unwrap().as_ref().unwrap_err(), &NOT_AN_OBJECT);
        }
        // A key with a lone surrogate fails the one pass; item by item it is ignored alone.
        for body in [r#"[{"cls":0.5,"\ud83d":1}]"#, r#"{"cls":0.5,"\ud83d":1}"#] {
            assert!(read(body, true).is_err(), "{body}");
            let items = parse(body).unwrap();
            let beacon = items[0].as_ref().unwrap();
            assert_eq!(number(beacon.cls.unwrap()), Field::Valid(0.5), "{body}");
        }
        let items = parse(r#"[{"lcp\u005fms":7}]"#).unwrap();
        assert_eq!(
            number(items[0].as_ref().unwrap().lcp_ms.unwrap()),
            Field::Valid(7.0)
        );
    }

    #[test]
    fn broken_syntax_is_malformed() {
        for bad in [
            "",
            "  \n",
            "[]",
            "{} x",
            "{}{}",
            "{\"a\":",
            "[{}",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "{'a':1}",
            "{\"a\":tru}",
            "{\"a\":01}",
            "{\"a\":\"\\x\"}",
            "{\"a\":\"raw\ncontrol\"}",
            "{\"a\":1,NaN:1}",
            "{NaN:1}",
            "42",
            "\"x\"",
            "null",
        ] {
            assert!(
                matches!(parse(&text(bad.as_bytes())), Err(DecodeError::Malformed(_))),
                "{bad:?}"
            );
        }
        assert!(parse("{} \n").is_ok(), "trailing whitespace is not garbage");
    }

    #[test]
    fn a_wrong_top_level_value_is_not_quoted() {
        for body in [r#""jane@example.com""#, "4111111111111111", "true"] {
            let error = parse(body).unwrap_err().to_string();
            assert!(
                error.contains("not a measurement object"),
                "{body}: {error}"
            );
            assert!(
                !error.contains("jane") && !error.contains("4111"),
                "{error}"
            );
        }
    }

    #[test]
    fn at_most_fifty() {
        let fifty = format!("[{}]", vec!["{}"; MAX_BATCH].join(","));
        assert_eq!(parse(&fifty).unwrap().len(), MAX_BATCH);
        let fifty_one = format!("[{}]", vec!["{}"; MAX_BATCH + 1].join(","));
        assert!(matches!(parse(&fifty_one), Err(DecodeError::Malformed(_))));
        let fifty_one_broken = format!("[{},]", vec!["{}"; MAX_BATCH + 1].join(","));
        assert!(parse(&fifty_one_broken)
            .unwrap_err()
            .to_string()
            .contains("invalid JSON"));
    }
}
