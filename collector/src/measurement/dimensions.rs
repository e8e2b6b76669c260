//! `dimensions` (contract v4 §2): string values a page sets under names its site declared
//! (`--dimension`), e.g. an experiment's variant; stored as the parallel arrays
//! `dimension_names` and `dimension_values`.
//!
//! Two steps, as the site is known only after a body is judged:
//!
//! - [`dimensions`], the field's rule at judgment: a JSON object whose values are strings (any
//!   other value makes the field invalid, dropped whole as `dimensions`). Every pair sent is
//!   kept, names in byte order, for the next step.
//! - [`Measurement::settle_dimensions`] at intake, once the site is known: a pair whose name
//!   the site did not declare, or whose value is longer than [`MAX_VALUE_BYTES`], is dropped
//!   and listed as `dimensions.NAME` (counted in `collector_measurements_field_dropped_total`
//!   under `field="dimensions"`: a label from the client's names would be an unbounded label
//!   set); a kept value is masked as a URL's path, on its percent-decoded text too ([`super::minimise::mask_text`]) and bounded by
//!   [`DistinctValues`].

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

use serde_json::value::RawValue;

use super::rules::{self, Field};
use super::Measurement;

/// Longest value stored, in bytes (contract v4 §2).
pub const MAX_VALUE_BYTES: usize = 64;
/// Most distinct values a collector stores per site, name and UTC day (contract v4 §2).
pub const MAX_DISTINCT: usize = 100;
/// What a value beyond [`MAX_DISTINCT`] is stored as.
pub const OTHER: &str = "(other)";
/// Most (site, name) pairs whose values a collector tracks in one UTC day: 1,000 sites with 5
/// dimensions each. With each pair's at most [`MAX_DISTINCT`] values of at most
/// [`MAX_VALUE_BYTES`] bytes, kept as 64-bit hashes (a collision only lets a new value in
/// uncounted), the tracking holds at most about 5,000 × 100 × 16 bytes (8 MB, counting the
/// hash set's overhead), whatever the traffic; a pair beyond it stores every value as
/// [`OTHER`] until the day ends.
pub const MAX_TRACKED_PAIRS: usize = 5_000;
/// The longest name echoed in `dropped_fields` (`dimensions.NAME`), in bytes: a declared name
/// is at most 32 bytes, so a longer one is cut rather than echoed whole.
pub const MAX_LISTED_NAME_BYTES: usize = 64;
/// The most `dimensions.NAME` entries one beacon lists in `dropped_fields`: a page that sends
/// a hundred undeclared names gets the first 16 listed (all are dropped).
pub const MAX_LISTED_DROPPED: usize = 16;

/// Name and value pairs, as sent.
pub type Pairs<'a> = Vec<(Cow<'a, str>, Cow<'a, str>)>;

/// The `dimensions` rule: a JSON object of string values; names in byte order (a duplicated
/// name takes its last value, as `JSON.parse` does).
pub fn dimensions(value: Option<&RawValue>) -> Field<Pairs<'_>> {
    let Some(raw) = value else {
        return Field::Absent;
    };
    let Ok(map) = serde_json::from_str::<BTreeMap<String, &RawValue>>(raw.get()) else {
        return Field::Invalid;
    };
    let mut out = Vec::with_capacity(map.len());
    for (name, v) in map {
        match rules::string(v) {
            Field::Valid(v) => out.push((Cow::Owned(name), v)),
            _ => return Field::Invalid,
        }
    }
    Field::Valid(out)
}

/// One of the parallel arrays of the judged pairs (names or values); empty when absent or
/// dropped.
pub fn column<'a>(
    judged: &Field<Pairs<'a>>,
    part: impl Fn(&(Cow<'a, str>, Cow<'a, str>)) -> Cow<'a, str>,
) -> Vec<Cow<'a, str>> {
    match judged {
        Field::Valid(pairs) => pairs.iter().map(part).collect(),
        _ => Vec::new(),
    }
}

/// The distinct values stored per site, name and UTC day by this collector, bounded
/// ([`MAX_DISTINCT`] per pair, [`MAX_TRACKED_PAIRS`] pairs, everything of a day forgotten at
/// once when the first value of the next day arrives). One lock, held for a hash lookup per
/// value.
#[derive(Debug, Default)]
pub struct DistinctValues {
    inner: Mutex<Tracked>,
}

#[derive(Debug, Default)]
struct Tracked {
    /// The UTC day tracked, days since the Unix epoch.
    day: u32,
    /// (site, name) pairs tracked: the bound's count.
    pairs: usize,
    /// Values stored, by site and name (nested, so that a lookup borrows its keys), as hashes.
    values: HashMap<String, HashMap<String, HashSet<u64>>>,
    /// The values' hash: random per process.
    hasher: std::hash::RandomState,
}

impl DistinctValues {
    /// What is stored for `value` of dimension `name` of `site` on `day` (days since the
    /// Unix epoch, UTC): the value while it is one of the first [`MAX_DISTINCT`] distinct ones
    /// of the day, else [`OTHER`]. A value sent as [`OTHER`] itself takes no place.
    pub fn admit<'v>(&self, site: &str, name: &str, day: u32, value: Cow<'v, str>) -> Cow<'v, str> {
        if value == OTHER {
            return value;
        }
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let t = &mut *guard;
        if day > t.day {
            t.day = day;
            t.pairs = 0;
            t.values.clear();
        }
        let known = t.values.get_mut(site).and_then(|names| names.get_mut(name));
        let seen = match known {
            Some(seen) => seen,
            None if t.pairs >= MAX_TRACKED_PAIRS => return Cow::Borrowed(OTHER),
            None => {
                t.pairs += 1;
                t.values
                    .entry(site.to_owned())
                    .or_default()
                    .entry(name.to_owned())
                    .or_default()
            }
        };
        let hash = std::hash::BuildHasher::hash_one(&t.hasher, value.as_ref());
        if seen.contains(&hash) {
            return value;
        }
        if seen.len() >= MAX_DISTINCT {
            return Cow::Borrowed(OTHER);
        }
        seen.insert(hash);
        value
    }
}

impl Measurement<'_> {
    /// Keeps of the dimensions sent the ones `declared` by the site, their values masked and
    /// bounded by `distinct` (see the module doc); returns the names dropped, each as
    /// `dimensions.NAME`.
    pub fn settle_dimensions(
        &mut self,
        declared: &[String],
        distinct: &DistinctValues,
    ) -> Vec<String> {
        let mut dropped = Vec::new();
        if self.dimension_names.is_empty() {
            return dropped;
        }
        let day = self.received_at.0 / 86_400;
        let names = std::mem::take(&mut self.dimension_names);
        let values = std::mem::take(&mut self.dimension_values);
        for (name, value) in names.into_iter().zip(values) {
            if !declared.iter().any(|d| *d == name) || value.len() > MAX_VALUE_BYTES {
                if dropped.len() < MAX_LISTED_DROPPED {
                    let listed = rules::truncate(&name, MAX_LISTED_NAME_BYTES);
                    dropped.push(format!("dimensions.{listed}"));
                }
                continue;
            }
            let masked = match super::minimise::mask_text(&value) {
                Cow::Borrowed(_) => value,
                Cow::Owned(m) => Cow::Owned(m),
            };
            let stored = distinct.admit(&self.site, &name, day, masked);
            self.dimension_names.push(name);
            self.dimension_values.push(stored);
        }
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judge(json: &str) -> Field<Pairs<'_>> {
        let raw: &RawValue = serde_json::from_str(json).unwrap();
        dimensions(Some(raw))
    }

    #[test]
    fn an_object_of_strings_in_name_order() {
        let Field::Valid(p) = judge(r#"{"variant":"b","page_type":"pdp","variant":"c"}"#) else {
            panic!("valid")
        };
        assert_eq!(
            p,
            vec![
                (Cow::from("page_type"), Cow::from("pdp")),
                ("variant".into(), "c".into())
            ]
        );
        assert_eq!(judge(r#"{"variant":1}"#), Field::Invalid);
        assert_eq!(judge(r#"["variant"]"#), Field::Invalid);
        assert_eq!(judge(r#""variant""#), Field::Invalid);
        assert_eq!(judge("{}"), Field::Valid(vec![]));
    }

    fn row(pairs: &[(&str, &str)]) -> Measurement<'static> {
        Measurement {
            site: "shop".into(),
            received_at: super::super::DateTime(86_400 * 20_000 + 5),
            dimension_names: pairs.iter().map(|p| Cow::Owned(p.0.to_owned())).collect(),
            dimension_values: pairs.iter().map(|p| Cow::Owned(p.1.to_owned())).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn undeclared_and_long_ones_are_dropped_and_values_masked() {
        let declared = vec!["variant".to_owned(), "page_type".to_owned()];
        let long = "x".repeat(65);
        let mut m = row(&[
            ("ab", "1"),
            ("page_type", &long),
            ("variant", "alice@example.com"),
        ]);
        let dropped = m.settle_dimensions(&declared, &DistinctValues::default());
        assert_eq!(dropped, ["dimensions.ab", "dimensions.page_type"]);
        assert_eq!(m.dimension_names, ["variant"]);
        assert_eq!(m.dimension_values, ["*"]);
    }

    #[test]
    fn percent_encoded_addresses_and_numbers_are_masked_too() {
        let declared = vec!["customer".to_owned(), "variant".to_owned()];
        let mut m = row(&[
            ("customer", "for%20jane%40example.com"),
            ("variant", "50%25%20off"),
        ]);
        m.settle_dimensions(&declared, &DistinctValues::default());
        assert_eq!(m.dimension_values, ["for *", "50%25%20off"]);
        let mut m = row(&[("customer", "%34%31%31%31111111111111")]);
        m.settle_dimensions(&declared, &DistinctValues::default());
        assert_eq!(m.dimension_values, ["*"], "4111… a card number, encoded");
    }

    #[test]
    fn many_undeclared_names_list_sixteen() {
        let names: Vec<String> = (0..100).map(|i| format!("n{i:03}")).collect();
        let pairs: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "v")).collect();
        let mut m = row(&pairs);
        let dropped = m.settle_dimensions(&["variant".to_owned()], &DistinctValues::default());
        assert_eq!(dropped.len(), MAX_LISTED_DROPPED);
        assert!(m.dimension_names.is_empty());
    }

    #[test]
    fn a_value_sent_as_other_takes_no_place() {
        let d = DistinctValues::default();
        for _ in 0..3 {
            assert_eq!(d.admit("s", "v", 1, OTHER.into()), OTHER);
        }
        for i in 0..MAX_DISTINCT {
            assert_eq!(
                d.admit("s", "v", 1, format!("v{i}").into()),
                format!("v{i}")
            );
        }
    }

    #[test]
    fn at_most_a_hundred_distinct_values_a_day_then_other() {
        let d = DistinctValues::default();
        for i in 0..MAX_DISTINCT {
            assert_eq!(
                d.admit("s", "v", 1, format!("v{i}").into()),
                format!("v{i}")
            );
        }
        assert_eq!(d.admit("s", "v", 1, "new".into()), OTHER);
        assert_eq!(
            d.admit("s", "v", 1, "v7".into()),
            "v7",
            "a known one still is"
        );
        assert_eq!(d.admit("s", "w", 1, "new".into()), "new", "per name");
        assert_eq!(d.admit("t", "v", 1, "new".into()), "new", "per site");
        assert_eq!(d.admit("s", "v", 2, "new".into()), "new", "per day");
        assert_eq!(
            d.inner.lock().unwrap().values.len(),
            1,
            "the day before is forgotten"
        );
    }

    #[test]
    fn pairs_beyond_the_bound_store_other() {
        let d = DistinctValues::default();
        for i in 0..MAX_TRACKED_PAIRS {
            d.admit(&format!("s{i}"), "v", 1, "a".into());
        }
        assert_eq!(d.admit("one-more", "v", 1, "a".into()), OTHER);
        assert_eq!(d.admit("s1", "v", 1, "b".into()), "b");
    }
}
