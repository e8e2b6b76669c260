//! `dimensions` (contract v4 §2): string values a page sets under names its site declared
//! (`--dimension`), e.g. an experiment's variant; stored as the parallel arrays
//! `dimension_names` and `dimension_values`.
//!
//! Two steps, as the site is known only after a body is judged:
//!
//! - [`dimensions`], the field's rule at judgment: a JSON object whose values are strings (any
//!   other value makes the field invalid, dropped whole as `dimensions`). Every pair sent is
//!   kept, names in byte order, for the next step.
//! - [`settle`] in the site stage ([`super::site`]), once the site is known: a pair whose
//!   name the site did not declare, or whose value is longer than [`MAX_VALUE_BYTES`], is
//!   dropped and listed as `dimensions.NAME` (counted in
//!   `collector_measurements_field_dropped_total` under `field="dimensions"`: a label from the
//!   client's names would be an unbounded label set); a kept value is masked as a URL's path,
//!   on its percent-decoded text too ([`super::minimise::mask_text`]), and bounded by
//!   [`DistinctValues`]: per site, name and UTC day, the [`MAX_DISTINCT`] values seen most
//!   often that day are stored as themselves, the others as [`OTHER`] (contract v5 §2): the
//!   most often seen, not the first seen, so that a flood of junk values just after midnight
//!   cannot turn every real value into [`OTHER`] for the day.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use serde_json::value::RawValue;

use super::heavy_hitters::{Sketch, TopValues};
pub use super::heavy_hitters::{MAX_ADMITTED_PER_DAY, MAX_DISTINCT};
use super::rules::{self, Field};

/// Longest value stored, in bytes (contract v4 §2).
pub const MAX_VALUE_BYTES: usize = 64;
/// What a value not kept is stored as.
pub const OTHER: &str = "(other)";
/// Most (site, name) pairs whose values a collector tracks in one UTC day: 1,000 sites with 5
/// dimensions each. Each pair keeps at most [`MAX_DISTINCT`] values as 64-bit hashes with a
/// 32-bit count (a collision only lets a new value in counted as the kept one), about 2 KiB
/// with the map's overhead; with the one shared 512 KiB sketch of the values not kept, the
/// tracking holds at most about 5,000 × 2 KiB + 0.5 MiB (11 MB) whatever the traffic; a pair
/// beyond it stores every value as [`OTHER`] until the day ends.
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

/// The values stored as themselves per site, name and UTC day by this collector: those seen
/// most often that day (contract v5 §2). Per (site, name) pair at most [`MAX_DISTINCT`]
/// values are kept, each with its count of sightings; the sightings of the values not kept
/// are counted in one count-min sketch shared by all pairs (2 × 2^16 cells, 512 KiB). A value
/// not kept is let in while fewer than [`MAX_DISTINCT`] are kept, else in place of the
/// least-seen kept one when its estimate is strictly greater than that one's count (which
/// goes back into the sketch: the evicted value returns by being seen again), and once
/// [`MAX_ADMITTED_PER_DAY`] were let in per pair and day, more than twice that count. Bounded: [`MAX_TRACKED_PAIRS`]
/// pairs, everything of a day forgotten at once when the first value of a later day
/// arrives. One lock, held for a hash lookup per value, and for a scan of the pair's
/// [`MAX_DISTINCT`] counts for a value not kept.
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
    /// Values kept, by site and name (nested, so that a lookup borrows its keys).
    values: HashMap<String, HashMap<String, TopValues>>,
    /// Sightings of the values not kept, of every pair, keyed by a hash of (site, name,
    /// value's hash).
    sketch: Sketch,
    /// The values' hash and the sketch's keys: random per process.
    hasher: std::hash::RandomState,
}

impl DistinctValues {
    /// What is stored for `value` of dimension `name` of `site` on `day` (days since the
    /// Unix epoch, UTC): the value while it is kept, being one of the [`MAX_DISTINCT`] seen
    /// most often that day (see [`DistinctValues`]), else [`OTHER`]. A value sent as
    /// [`OTHER`] itself takes no place and is not counted.
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
            t.sketch.clear();
        }
        let known = t.values.get_mut(site).and_then(|names| names.get_mut(name));
        let top = match known {
            Some(top) => top,
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
        let hasher = &t.hasher;
        let hash = std::hash::BuildHasher::hash_one(hasher, value.as_ref());
        let key = |v: u64| std::hash::BuildHasher::hash_one(hasher, (site, name, v));
        if top.see(hash, &mut t.sketch, key) {
            value
        } else {
            Cow::Borrowed(OTHER)
        }
    }
}

/// The dimensions a site stores of those sent: the `dimension_names` and `dimension_values`
/// columns, and the names dropped, each as `dimensions.NAME`.
#[derive(Debug, Default, PartialEq)]
pub struct Settled<'a> {
    /// The names kept, in byte order.
    pub names: Vec<Cow<'a, str>>,
    /// Their values as stored, in the same order.
    pub values: Vec<Cow<'a, str>>,
    /// The names dropped, each as `dimensions.NAME`, at most [`MAX_LISTED_DROPPED`].
    pub dropped: Vec<String>,
}

/// Keeps of the pairs sent (`sent`, in byte order) the ones `declared` by `site`, their values
/// masked and bounded by `distinct` for the UTC day `day` (days since the Unix epoch; see the
/// module doc).
pub fn settle<'a>(
    sent: Pairs<'a>,
    declared: &[String],
    distinct: &DistinctValues,
    site: &str,
    day: u32,
) -> Settled<'a> {
    let mut out = Settled {
        names: Vec::with_capacity(sent.len()),
        values: Vec::with_capacity(sent.len()),
        dropped: Vec::new(),
    };
    for (name, value) in sent {
        if !declared.iter().any(|d| *d == name) || value.len() > MAX_VALUE_BYTES {
            if out.dropped.len() < MAX_LISTED_DROPPED {
                let listed = rules::truncate(&name, MAX_LISTED_NAME_BYTES);
                out.dropped.push(format!("dimensions.{listed}"));
            }
            continue;
        }
        let masked = match super::minimise::mask_text(&value) {
            Cow::Borrowed(_) => value,
            Cow::Owned(m) => Cow::Owned(m),
        };
        let stored = distinct.admit(site, &name, day, masked);
        out.names.push(name);
        out.values.push(stored);
    }
    out
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

    /// The pairs sent.
    fn sent(pairs: &[(&str, &str)]) -> Pairs<'static> {
        pairs
            .iter()
            .map(|p| (Cow::Owned(p.0.to_owned()), Cow::Owned(p.1.to_owned())))
            .collect()
    }

    /// `pairs` settled for site `shop` on day 20,000.
    fn settled(pairs: &[(&str, &str)], declared: &[String]) -> Settled<'static> {
        settle(
            sent(pairs),
            declared,
            &DistinctValues::default(),
            "shop",
            20_000,
        )
    }

    #[test]
    fn undeclared_and_long_ones_are_dropped_and_values_masked() {
        let declared = vec!["variant".to_owned(), "page_type".to_owned()];
        let long = "x".repeat(65);
        let s = settled(
            &[
                ("ab", "1"),
                ("page_type", &long),
                ("variant", "alice@example.com"),
            ],
            &declared,
        );
        assert_eq!(s.dropped, ["dimensions.ab", "dimensions.page_type"]);
        assert_eq!(s.names, ["variant"]);
        assert_eq!(s.values, ["*"]);
    }

    #[test]
    fn percent_encoded_addresses_and_numbers_are_masked_too() {
        let declared = vec!["customer".to_owned(), "variant".to_owned()];
        let s = settled(
            &[
                ("customer", "for%20jane%40example.com"),
                ("variant", "50%25%20off"),
            ],
            &declared,
        );
        assert_eq!(s.values, ["for *", "50%25%20off"]);
        let s = settled(&[("customer", "%34%31%31%31111111111111")], &declared);
        assert_eq!(s.values, ["*"], "4111… a card number, encoded");
    }

    #[test]
    fn many_undeclared_names_list_sixteen() {
        let names: Vec<String> = (0..100).map(|i| format!("n{i:03}")).collect();
        let pairs: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "v")).collect();
        let s = settled(&pairs, &["variant".to_owned()]);
        assert_eq!(s.dropped.len(), MAX_LISTED_DROPPED);
        assert!(s.names.is_empty());
    }

    /// Whether `value` of dimension `v` of site `s` on `day` is stored as itself.
    fn stored(d: &DistinctValues, day: u32, value: &str) -> bool {
        let out = d.admit("s", "v", day, Cow::Borrowed(value));
        assert!(out == value || out == OTHER, "{value}: {out}");
        out == value
    }

    /// The values kept now and those let in this day for dimension `v` of site `s`.
    fn kept_and_admitted(d: &DistinctValues) -> (usize, usize) {
        let t = d.inner.lock().unwrap();
        t.values
            .get("s")
            .and_then(|names| names.get("v"))
            .map_or((0, 0), |top| (top.kept(), top.admitted()))
    }

    #[test]
    fn a_value_sent_as_other_takes_no_place() {
        let d = DistinctValues::default();
        for _ in 0..3 {
            assert_eq!(d.admit("s", "v", 1, OTHER.into()), OTHER);
        }
        assert_eq!(kept_and_admitted(&d), (0, 0), "not even the pair's");
        for i in 0..MAX_DISTINCT {
            assert!(stored(&d, 1, &format!("v{i}")), "v{i}");
        }
        for _ in 0..1_000 {
            assert_eq!(d.admit("s", "v", 1, OTHER.into()), OTHER);
        }
        assert_eq!(kept_and_admitted(&d), (MAX_DISTINCT, MAX_DISTINCT));
        for i in 0..MAX_DISTINCT {
            assert!(stored(&d, 1, &format!("v{i}")), "v{i} still kept");
        }
    }

    /// Was `at_most_a_hundred_distinct_values_a_day_then_other` (the first 100 kept for the
    /// day): the 101st value seen once is still `(other)`, but now gets in once seen more
    /// often than the least-seen kept one.
    #[test]
    fn at_most_a_hundred_kept_a_new_one_seen_once_is_other() {
        let d = DistinctValues::default();
        for i in 0..MAX_DISTINCT {
            assert!(stored(&d, 1, &format!("v{i}")), "v{i}");
        }
        assert_eq!(d.admit("s", "v", 1, "new".into()), OTHER, "seen as often");
        assert_eq!(
            d.admit("s", "v", 1, "v7".into()),
            "v7",
            "a known one still is"
        );
        assert_eq!(d.admit("s", "w", 1, "new".into()), "new", "per name");
        assert_eq!(d.admit("t", "v", 1, "new".into()), "new", "per site");
        assert!(stored(&d, 1, "new"), "seen twice: more than a kept one");
        assert_eq!(kept_and_admitted(&d), (MAX_DISTINCT, MAX_DISTINCT + 1));
        assert_eq!(d.admit("s", "v", 2, "new2".into()), "new2", "per day");
        assert_eq!(
            d.inner.lock().unwrap().values.len(),
            1,
            "the day before is forgotten"
        );
    }

    /// The issue's attack (contract v5 §2): 1,000 junk values, each seen once, come first in
    /// the day; then 20 real values, each seen 10 times, interleaved.
    #[test]
    fn a_flood_of_junk_first_cannot_hold_the_places_of_values_seen_often() {
        let d = DistinctValues::default();
        let mut junk_stored = 0;
        for i in 0..1_000 {
            junk_stored += usize::from(stored(&d, 1, &format!("junk-{i}")));
            assert!(kept_and_admitted(&d).0 <= MAX_DISTINCT);
        }
        // The first 100 fill the places; another only by the sketch's overcount (a junk
        // value sharing both its cells with earlier ones is counted 2: one run in about 13).
        assert!(
            (MAX_DISTINCT..=MAX_DISTINCT + 10).contains(&junk_stored),
            "{junk_stored}"
        );
        let real: Vec<String> = (0..20).map(|i| format!("real-{i}")).collect();
        let mut sightings = vec![Vec::new(); real.len()];
        for _ in 0..10 {
            for (value, seen) in real.iter().zip(&mut sightings) {
                seen.push(stored(&d, 1, value));
                assert!(kept_and_admitted(&d).0 <= MAX_DISTINCT);
            }
        }
        for (value, seen) in real.iter().zip(&sightings) {
            let first = seen.iter().position(|s| *s);
            assert!(first.is_some_and(|f| f <= 1), "{value}: {seen:?}");
            let from = first.unwrap_or(seen.len());
            assert!(seen[from..].iter().all(|s| *s), "kept once in: {seen:?}");
            assert!(seen[5..].iter().all(|s| *s), "{value}: {seen:?}");
        }
    }

    #[test]
    fn a_value_seen_more_often_than_the_least_seen_takes_its_place_not_as_often() {
        let d = DistinctValues::default();
        for i in 0..MAX_DISTINCT - 1 {
            for _ in 0..10 {
                assert!(stored(&d, 1, &format!("v{i}")));
            }
        }
        for _ in 0..5 {
            assert!(stored(&d, 1, "least"));
        }
        for n in 1..=5 {
            assert!(!stored(&d, 1, "new"), "seen {n} times, `least` 5");
        }
        assert!(stored(&d, 1, "new"), "6 times: more than `least`");
        assert_eq!(kept_and_admitted(&d), (MAX_DISTINCT, MAX_DISTINCT + 1));
        assert!(stored(&d, 1, "v0"), "only the least-seen one left");
        // `least`'s 5 sightings went back into the sketch: one more makes it as often as
        // `new` (6), not more; the next one more.
        assert!(!stored(&d, 1, "least"));
        assert!(stored(&d, 1, "least"), "7 times: back in place of `new`");
        assert!(!stored(&d, 1, "new"), "7 times, `least` 7");
        assert_eq!(kept_and_admitted(&d), (MAX_DISTINCT, MAX_DISTINCT + 2));
    }

    /// Lets in `MAX_ADMITTED_PER_DAY` values of day 1, each seen until let in; returns the
    /// last one.
    fn spend_the_admissions(d: &DistinctValues) -> String {
        let mut i = 0;
        while kept_and_admitted(d).1 < MAX_ADMITTED_PER_DAY {
            let value = format!("v{i}");
            i += 1;
            // Seen until let in: once more than the least-seen kept one, which rises.
            let sightings = (1..=100).find(|_| stored(d, 1, &value));
            assert!(sightings.is_some(), "{value} never let in");
            assert!(kept_and_admitted(d).0 <= MAX_DISTINCT);
        }
        format!("v{}", i - 1)
    }

    #[test]
    fn past_a_thousand_let_in_a_newcomer_must_be_seen_twice_as_often() {
        let d = DistinctValues::default();
        let last = spend_the_admissions(&d);
        assert_eq!(kept_and_admitted(&d), (MAX_DISTINCT, MAX_ADMITTED_PER_DAY));
        assert!(stored(&d, 1, &last), "the kept ones stay");
        // The least-seen kept values were let in at about 10 sightings: a newcomer seen as
        // often no longer gets in, one seen more than twice as often does.
        let sightings = (1..=1_000).find(|_| stored(&d, 1, "late"));
        let sightings = sightings.expect("a value seen 1,000 times gets a place");
        assert!((15..=60).contains(&sightings), "{sightings}");
        assert_eq!(kept_and_admitted(&d).0, MAX_DISTINCT);
        assert!(stored(&d, 2, "late"), "the next day starts afresh");
        assert_eq!(kept_and_admitted(&d), (1, 1));
    }

    /// The adversarial review's flood (issue 52): 100 values seen once, 100 seen twice, ...,
    /// 100 seen ten times (5,500 sightings, the 1,000 admissions spent), then 20 real values
    /// each seen 10,000 times: every real value ends stored as itself.
    #[test]
    fn a_graded_flood_cannot_freeze_the_places_against_real_values() {
        let d = DistinctValues::default();
        for times in 1..=10 {
            for n in 0..100 {
                for _ in 0..times {
                    stored(&d, 1, &format!("junk-{times}-{n}"));
                }
            }
        }
        // Some may have found no place (a tie with the least-seen kept value, or the sketch's
        // collisions under its random seed: 998 of 1,000 admissions spent in one run): a few
        // more, each seen 11 times, one more than any kept junk value.
        let mut extra = 0;
        while kept_and_admitted(&d).1 < MAX_ADMITTED_PER_DAY && extra < 50 {
            extra += 1;
            for _ in 0..11 {
                stored(&d, 1, &format!("junk-extra-{extra}"));
            }
        }
        assert_eq!(
            kept_and_admitted(&d).1,
            MAX_ADMITTED_PER_DAY,
            "admissions spent"
        );
        // Each round, each real value seen once; the least-seen kept junk was seen 10 times.
        let rounds = (1..=10_000).find(|_| {
            let kept = (0..20).filter(|n| stored(&d, 1, &format!("real-{n}")));
            kept.count() == 20
        });
        let rounds = rounds.expect("every real value stored as itself");
        assert!(
            (21..=30).contains(&rounds),
            "seen more than twice 10 times: {rounds}"
        );
    }

    #[test]
    fn a_new_day_forgets_the_kept_values_and_the_counts() {
        let d = DistinctValues::default();
        for i in 0..MAX_DISTINCT {
            for _ in 0..10 {
                assert!(stored(&d, 1, &format!("v{i}")));
            }
        }
        for _ in 0..9 {
            assert!(!stored(&d, 1, "late"), "fewer than 10 times");
        }
        for i in 0..MAX_DISTINCT {
            assert!(stored(&d, 2, &format!("w{i}")), "w{i}: a new day's places");
        }
        assert!(
            !stored(&d, 2, "late"),
            "its 9 sightings of day 1 are forgotten"
        );
        assert!(!stored(&d, 2, "v0"), "so are the kept ones'");
        assert!(stored(&d, 2, "w0"));
        assert!(
            stored(&d, 1, "w1"),
            "a late value of an earlier day counts toward the current one"
        );
        assert_eq!(kept_and_admitted(&d), (MAX_DISTINCT, MAX_DISTINCT));
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
