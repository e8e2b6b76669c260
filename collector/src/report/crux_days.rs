//! The SQL of the CrUX view (`collector report --crux`, [`super::crux`]) and its daily roll-up.
//!
//! **The cohort figures of a day** ([`cohort_select`]): the site's Chromium rows of the day,
//! per form factor (`ff`), day and soft navigation or not, each metric's figures as sums and its
//! p75 as a `quantileExactWeightedState` over the values at the display resolution
//! ([`Metric::at_resolution`]: one entry per millisecond, not one per page view). The cohort's
//! filter is a `PREWHERE`: the metric columns are read only for the rows kept.
//!
//! **The roll-up** (`crux_days` and `crux_day_marks`, schema/clickhouse/004 and 005): those
//! figures of each complete day, stored once computed, so that a view of 28 days reads at most
//! 28 × 6 stored groups instead of every row (docs/benchmarks.md, "The CrUX view of a 10 M-row
//! shop"). It is a cache, never the only copy of anything, one per server (not replicated):
//! - a day is read from the roll-up only through a **mark** whose `rows` and `parts` equal what
//!   `measurements` holds for the day now ([`DayRows`]: its rows, duplicates not yet folded
//!   counted, and a hash of the names of the table parts that hold them). A part never changes:
//!   an insert, a merge (one that folds a resend too, whichever copy it keeps) or a mutation
//!   (an erasure, an `ALTER … UPDATE`) that touches the day's rows makes new parts, so the day
//!   no longer matches and is computed again ([`plan`]); the same parts are the same rows, so
//!   `FINAL` reads them the same. A day with no row is not read at all.
//! - a computation writes its groups first and its mark last, under a fresh `computation`
//!   number, the mark with the number of groups it stored, and only for the days whose rows
//!   read again after the groups are stored are still those read before (else the groups may
//!   hold a later state than the mark says: such a day is computed from the rows): a computation cut short leaves groups
//!   no mark points to (never read); two reports computing one day at once each read only their
//!   own groups; a mark whose groups are not all there (the table emptied by hand) is not used
//!   ([`marks_query`]).
//! - a server without the tables (not yet migrated) or a user that may not write them: the
//!   days not in the roll-up are computed from the rows within the view's one query, as they
//!   are before they are stored ([`query`] takes both sources).
//!
//! **The view** ([`query`]) spreads each stored or computed group over the cohorts it belongs
//! to (its form factor and all; hard and hard-and-soft, or only the latter; its day and the
//! whole range) with `arrayJoin` and merges the states (`quantileExactWeightedMerge`), so every
//! p75 is exact over its cohort's rows at that resolution, the roll-up or not. Its answer is
//! one [`sql::Row`] per (cohort, navigations, day) whose group reads `FORM/NAVIGATIONS/DAY`
//! (`all` for the whole range). Everything runs as written on ClickHouse 18.16 and 26.x (the
//! states are `-If` states over a non-Nullable value: both name that type alike, which they do
//! not for a Nullable value).

use serde::Deserialize;

use super::crux::chromium_filter;
use super::sql::{self, quote};
use super::Metric;

/// What `measurements` holds of a site's day (unix days, UTC): the day's rows as stored
/// (duplicates not yet folded and bots counted) and the parts they are in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clickhouse::Row)]
pub struct DayRows {
    /// The day, days since 1970-01-01 (ClickHouse's `Date`).
    pub day: u16,
    /// Rows of the site on that day.
    pub rows: u64,
    /// `cityHash64` of the sorted names of the parts holding them, joined by commas.
    pub parts: u64,
}

/// A mark of `crux_day_marks`: the computation of a day, and the [`DayRows`] it was made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clickhouse::Row)]
pub struct Mark {
    /// The day, days since 1970-01-01.
    pub day: u16,
    /// The day's rows when it was computed.
    pub rows: u64,
    /// The hash of their parts' names then.
    pub parts: u64,
    /// The computation whose groups `crux_days` holds.
    pub computation: u64,
}

/// Where each day of a view comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Days the roll-up holds as they are now: (day, computation).
    pub stored: Vec<(u16, u64)>,
    /// Days with rows that the roll-up lacks or holds as they were before: to compute.
    pub stale: Vec<DayRows>,
}

impl Plan {
    /// Only the stale days whose rows are still as `before` says: a day that changed while it
    /// was computed (`now`: read after its groups were stored) may hold figures of either
    /// state, so it gets no mark and is computed from the rows in the view.
    pub fn unchanged(&self, now: &[DayRows]) -> Vec<DayRows> {
        self.stale
            .iter()
            .filter(|d| now.contains(d))
            .copied()
            .collect()
    }

    /// `computation` of the stale days `marked` was stored and marked: they are read from the
    /// roll-up now; the other stale days stay to compute.
    pub fn stored_as(&mut self, computation: u64, marked: &[DayRows]) {
        let stale = std::mem::take(&mut self.stale);
        let (done, left): (Vec<DayRows>, Vec<DayRows>) =
            stale.into_iter().partition(|d| marked.contains(d));
        self.stale = left;
        self.stored
            .extend(done.into_iter().map(|d| (d.day, computation)));
        self.stored.sort_unstable();
    }
}

/// Each day with rows (`found`) read from the roll-up when a mark of it matches its rows (the
/// greatest such computation: any is right), else to compute.
pub fn plan(found: &[DayRows], marks: &[Mark]) -> Plan {
    let mut plan = Plan::default();
    for d in found.iter().filter(|d| d.rows > 0) {
        let computation = marks
            .iter()
            .filter(|m| m.day == d.day && m.rows == d.rows && m.parts == d.parts)
            .map(|m| m.computation)
            .max();
        match computation {
            Some(c) => plan.stored.push((d.day, c)),
            None => plan.stale.push(*d),
        }
    }
    plan.stored.sort_unstable();
    plan.stale.sort_unstable_by_key(|d| d.day);
    plan
}

/// `day` (days since 1970-01-01) as a `Date` literal.
fn date(day: u16) -> String {
    format!(
        "toDate({})",
        quote(&sql::utc(u64::from(day) * 86_400)[..10])
    )
}

/// The [`DayRows`] of `site` over `[from, to)` (unix seconds, UTC midnights): one row per day
/// with rows. Reads `page_view_at` of the site's rows in the range (`_part` is free).
pub fn rows_query(database: &str, site: &str, from: u64, to: u64) -> String {
    format!(
        "SELECT toUInt16(toDate(page_view_at, 'UTC')) AS day, count() AS rows, \
         cityHash64(arrayStringConcat(arraySort(groupUniqArray(_part)), ',')) AS parts\n\
         FROM {database}.measurements\n\
         WHERE site = {}\n  AND page_view_at >= {} AND page_view_at < {}\nGROUP BY day",
        quote(site),
        sql::datetime(from),
        sql::datetime(to)
    )
}

/// The [`Mark`]s of `site` over `[from, to)` whose groups `crux_days` holds, one per day and
/// [`DayRows`] (its greatest computation).
pub fn marks_query(database: &str, site: &str, from: u64, to: u64) -> String {
    let (site, from, to) = (quote(site), date(day_of(from)), date(day_of(to)));
    // The inner query filters on the column `day`: on 18.16 an alias `day` would stand for it
    // in the `WHERE` too.
    format!(
        "SELECT toUInt16(d) AS day, rows, parts, max(computation) AS computation\n\
         FROM (SELECT day AS d, rows, parts, computation FROM {database}.crux_day_marks\n\
         WHERE site = {site} AND day >= {from} AND day < {to}\n\
         AND (groups = 0 OR (day, computation, groups) IN (SELECT day, computation, toUInt8(count()) \
         FROM {database}.crux_days WHERE site = {site} AND day >= {from} AND day < {to} \
         GROUP BY day, computation)))\nGROUP BY d, rows, parts"
    )
}

/// How many groups `computation` stored per day for `site` (read after it stored them, for
/// its marks): `(day, groups)` rows.
pub fn groups_query(database: &str, site: &str, computation: u64) -> String {
    format!(
        "SELECT toUInt16(d) AS day, toUInt8(count()) AS groups FROM (SELECT day AS d \
         FROM {database}.crux_days WHERE site = {} AND computation = {computation}) GROUP BY d",
        quote(site)
    )
}

/// A row of [`groups_query`]'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clickhouse::Row)]
pub struct StoredGroups {
    /// The day, days since 1970-01-01.
    pub day: u16,
    /// The groups stored for it.
    pub groups: u8,
}

/// The day (days since 1970-01-01) of unix seconds `t`.
fn day_of(t: u64) -> u16 {
    u16::try_from(t / 86_400).unwrap_or(u16::MAX)
}

/// The cohort columns, as `(alias, expression)`: the names `crux_days` stores them under,
/// after `site`, `day` and `computation`.
fn cohort_columns() -> Vec<(String, String)> {
    let mut columns = vec![
        // A `String`, as `crux_days` stores it: 18.16's `toString` of a LowCardinality
        // column is LowCardinality, which its `UNION ALL` with a stored day refuses.
        ("ff".to_owned(), "CAST(device_type AS String)".to_owned()),
        ("day".to_owned(), "toDate(page_view_at, 'UTC')".to_owned()),
        (
            "soft".to_owned(),
            "toUInt8(ifNull(navigation_type, '') = 'soft_navigation')".to_owned(),
        ),
        ("n".to_owned(), "count()".to_owned()),
        ("pv".to_owned(), "sum(1 / sample_rate)".to_owned()),
    ];
    for m in Metric::ALL {
        let (c, (good, poor)) = (m.column(), m.thresholds());
        let name = m.name().to_lowercase();
        columns.extend([
            (format!("{name}_rows"), format!("count({c})")),
            (
                format!("{name}_page_views"),
                format!("ifNull(sumIf(1 / sample_rate, {c} IS NOT NULL), 0)"),
            ),
            (
                format!("{name}_p75"),
                format!(
                    "quantileExactWeightedStateIf(0.75)(assumeNotNull({}), \
                     toUInt64(round(1000 / sample_rate)), {c} IS NOT NULL)",
                    m.resolution_sql()
                ),
            ),
            (
                format!("{name}_good"),
                format!("ifNull(sumIf(1 / sample_rate, {c} <= {good}), 0)"),
            ),
            (
                format!("{name}_poor"),
                format!("ifNull(sumIf(1 / sample_rate, {c} > {poor}), 0)"),
            ),
        ]);
    }
    columns
}

/// The cohort figures of `site`'s `days` computed from its rows (see the module doc); `None`
/// without days.
pub fn cohort_select(database: &str, site: &str, days: &[u16]) -> Option<String> {
    let (first, last) = (*days.iter().min()?, *days.iter().max()?);
    let columns: Vec<String> = cohort_columns()
        .into_iter()
        .map(|(alias, expr)| format!("{expr} AS {alias}"))
        .collect();
    let listed: Vec<String> = days.iter().map(|&d| date(d)).collect();
    // PREWHERE: the metrics are read only for the rows the cohort keeps. Before FINAL is
    // safe here: every column it tests is the same in every send of one page view (its id).
    Some(format!(
        "SELECT {}\nFROM {database}.measurements FINAL\nPREWHERE {}\n  AND toDate(page_view_at, 'UTC') IN ({})\n  AND device_type IN ('mobile', 'tablet', 'desktop')\n  AND {}\nGROUP BY ff, day, soft",
        columns.join(", "),
        sql::filter(
            site,
            u64::from(first) * 86_400,
            (u64::from(last) + 1) * 86_400
        )
        .trim_start_matches("WHERE "),
        listed.join(", "),
        chromium_filter()
    ))
}

/// The stored cohort figures of `site` for `stored` (day, computation) pairs; `None` without
/// any.
pub fn stored_select(database: &str, site: &str, stored: &[(u16, u64)]) -> Option<String> {
    if stored.is_empty() {
        return None;
    }
    let names: Vec<String> = cohort_columns().into_iter().map(|(a, _)| a).collect();
    let pairs: Vec<String> = stored
        .iter()
        .map(|&(d, c)| format!("({}, toUInt64({c}))", date(d)))
        .collect();
    Some(format!(
        "SELECT {}\nFROM {database}.crux_days\nWHERE site = {} AND (day, computation) IN ({})",
        names.join(", "),
        quote(site),
        pairs.join(", ")
    ))
}

/// Stores the cohort figures of `site`'s `days` under `computation` (before their marks).
pub fn store_query(database: &str, site: &str, days: &[u16], computation: u64) -> Option<String> {
    let select = cohort_select(database, site, days)?;
    let names: Vec<String> = cohort_columns().into_iter().map(|(a, _)| a).collect();
    Some(format!(
        "INSERT INTO {database}.crux_days (site, computation, {})\nSELECT {}, toUInt64({computation}), {}\nFROM ({select})",
        names.join(", "),
        quote(site),
        names.join(", ")
    ))
}

/// Marks `days` of `site` as computed by `computation` (after its groups are stored), each
/// with the number of groups `stored` says it has there ([`groups_query`]; a day it lacks
/// has none).
pub fn marks_insert(
    database: &str,
    site: &str,
    days: &[DayRows],
    stored: &[StoredGroups],
    computation: u64,
) -> String {
    let values: Vec<String> = days
        .iter()
        .map(|d| {
            let groups = stored
                .iter()
                .find(|s| s.day == d.day)
                .map_or(0, |s| s.groups);
            format!(
                "({}, {}, {}, {}, {groups}, {computation})",
                quote(site),
                quote(&sql::utc(u64::from(d.day) * 86_400)[..10]),
                d.rows,
                d.parts
            )
        })
        .collect();
    format!(
        "INSERT INTO {database}.crux_day_marks (site, day, rows, parts, groups, computation) VALUES {}",
        values.join(", ")
    )
}

/// The view over `sources` (selects of the cohort columns: [`stored_select`],
/// [`cohort_select`]), at least one.
pub fn query(sources: &[String]) -> String {
    let per_metric = |name: &str, item: &dyn Fn(&str) -> String| {
        let items: Vec<String> = Metric::ALL
            .iter()
            .map(|m| item(&m.name().to_lowercase()))
            .collect();
        format!("    [{}] AS {name}", items.join(", "))
    };
    let columns = [
        "    concat(arrayJoin([ff, 'all']), '/', \
         arrayJoin(if(soft = 1, ['hard_and_soft'], ['hard', 'hard_and_soft'])), '/', \
         arrayJoin([toString(day), 'all'])) AS grp"
            .to_owned(),
        "    sum(n) AS measurements".to_owned(),
        "    sum(pv) AS page_views".to_owned(),
        per_metric("measured", &|m| format!("sum({m}_rows)")),
        per_metric("measured_page_views", &|m| format!("sum({m}_page_views)")),
        per_metric("p75", &|m| {
            format!(
                "if(sum({m}_rows) = 0, NULL, toNullable(quantileExactWeightedMerge(0.75)({m}_p75)))"
            )
        }),
        per_metric("good_page_views", &|m| format!("sum({m}_good)")),
        per_metric("poor_page_views", &|m| format!("sum({m}_poor)")),
    ];
    format!(
        "SELECT\n{}\nFROM\n(\n{}\n)\nGROUP BY grp\nORDER BY grp",
        columns.join(",\n"),
        sources.join("\nUNION ALL\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const DDL: &str = include_str!("../../../schema/clickhouse/004_crux_days.sql");

    fn rows(day: u16, rows: u64, parts: u64) -> DayRows {
        DayRows { day, rows, parts }
    }

    fn mark(day: u16, rows: u64, parts: u64, computation: u64) -> Mark {
        Mark {
            day,
            rows,
            parts,
            computation,
        }
    }

    /// A day is read from the roll-up only while a mark matches both its rows and its parts; a
    /// day without rows is not read.
    #[test]
    fn a_day_is_stored_only_while_its_rows_match_a_mark() {
        let found = [
            rows(20_400, 10, 500),
            rows(20_401, 11, 600),
            rows(20_402, 12, 700),
            rows(20_403, 13, 800),
            rows(20_404, 0, 0),
        ];
        let marks = [
            mark(20_400, 10, 500, 7),
            mark(20_400, 10, 500, 9),
            mark(20_401, 10, 600, 3), // a row arrived since, or was erased
            mark(20_402, 12, 699, 4), // a merge or a mutation made new parts
            mark(20_405, 5, 100, 1),  // a day whose rows are all gone
        ];
        let mut p = plan(&found, &marks);
        assert_eq!(p.stored, vec![(20_400, 9)]);
        assert_eq!(
            p.stale.iter().map(|d| d.day).collect::<Vec<_>>(),
            [20_401, 20_402, 20_403]
        );
        // While they were computed, a row arrived for 20,402.
        let now = [
            rows(20_401, 11, 600),
            rows(20_402, 13, 701),
            rows(20_403, 13, 800),
        ];
        let marked = p.unchanged(&now);
        assert_eq!(
            marked.iter().map(|d| d.day).collect::<Vec<_>>(),
            [20_401, 20_403]
        );
        p.stored_as(42, &marked);
        assert_eq!(p.stored, vec![(20_400, 9), (20_401, 42), (20_403, 42)]);
        assert_eq!(p.stale.iter().map(|d| d.day).collect::<Vec<_>>(), [20_402]);
    }

    /// `crux_days` holds `site`, `day`, `computation` and the cohort columns, in that order,
    /// and nothing else.
    #[test]
    fn the_table_holds_the_cohort_columns() {
        let declared: Vec<&str> = DDL
            .lines()
            .map(str::trim)
            .filter(|l| !l.starts_with("--") && !l.is_empty())
            .skip_while(|l| *l != "(")
            .skip(1)
            .take_while(|l| *l != ")")
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        let mut want = vec![
            "site".to_owned(),
            "day".to_owned(),
            "computation".to_owned(),
        ];
        want.extend(
            cohort_columns()
                .into_iter()
                .filter(|(a, _)| a != "day")
                .map(|(a, _)| a),
        );
        let mut declared_sorted: Vec<String> = declared.iter().map(|s| s.to_string()).collect();
        declared_sorted.sort();
        want.sort();
        assert_eq!(declared_sorted, want);
        for (alias, expr) in cohort_columns() {
            if alias.ends_with("_p75") {
                assert!(
                    expr.starts_with("quantileExactWeightedStateIf(0.75)("),
                    "{expr}"
                );
                assert!(DDL.contains(&format!(
                    "{alias} AggregateFunction(quantileExactWeighted(0.75), Float64, UInt64)"
                )));
            }
        }
    }

    /// The computed days: the range from the first to the day after the last, and only those
    /// days; the site's rows only; the cohort's filter before the metric columns are read.
    #[test]
    fn a_computed_day_is_read_from_its_range_alone() {
        // 2026-11-05 is day 20,762.
        let q = cohort_select("db", "shop", &[20_764, 20_762]).unwrap();
        assert!(q.contains("page_view_at >= toDateTime('2026-11-05 00:00:00', 'UTC') AND page_view_at < toDateTime('2026-11-08 00:00:00', 'UTC')"), "{q}");
        assert!(
            q.contains("IN (toDate('2026-11-07'), toDate('2026-11-05'))"),
            "{q}"
        );
        assert!(q.contains("PREWHERE site = 'shop'"), "{q}");
        assert!(
            q.contains("device_type IN ('mobile', 'tablet', 'desktop')"),
            "{q}"
        );
        assert!(q.contains("GROUP BY ff, day, soft"), "{q}");
        assert!(cohort_select("db", "shop", &[]).is_none());
        let s = store_query("db", "shop", &[20_762], 77).unwrap();
        assert!(
            s.starts_with(
                "INSERT INTO db.crux_days (site, computation, ff, day, soft, n, pv, lcp_rows, "
            ),
            "{s}"
        );
        assert!(s.contains("SELECT 'shop', toUInt64(77), ff, day,"), "{s}");
        let m = marks_insert(
            "db",
            "shop",
            &[rows(20_762, 5, 99), rows(20_763, 2, 98)],
            &[StoredGroups {
                day: 20_762,
                groups: 4,
            }],
            77,
        );
        assert_eq!(m, "INSERT INTO db.crux_day_marks (site, day, rows, parts, groups, computation) VALUES ('shop', '2026-11-05', 5, 99, 4, 77), ('shop', '2026-11-06', 2, 98, 0, 77)");
        let q = marks_query("db", "shop", 20_762 * 86_400, 20_790 * 86_400);
        assert!(q.contains("AND (groups = 0 OR (day, computation, groups) IN (SELECT day, computation, toUInt8(count()) FROM db.crux_days WHERE site = 'shop' AND day >= toDate('2026-11-05') AND day < toDate('2026-12-03') GROUP BY day, computation))"), "{q}");
        let r = stored_select("db", "shop", &[(20_762, 77)]).unwrap();
        assert!(
            r.ends_with("WHERE site = 'shop' AND (day, computation) IN ((toDate('2026-11-05'), toUInt64(77)))"),
            "{r}"
        );
        assert!(stored_select("db", "shop", &[]).is_none());
    }

    #[test]
    fn the_view_unites_its_sources() {
        let q = query(&["SELECT a".to_owned(), "SELECT b".to_owned()]);
        assert!(q.contains("(\nSELECT a\nUNION ALL\nSELECT b\n)"), "{q}");
        assert!(q.contains(
            "if(sum(lcp_rows) = 0, NULL, toNullable(quantileExactWeightedMerge(0.75)(lcp_p75)))"
        ));
    }
}
