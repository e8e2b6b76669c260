//! The report's query, and its answer read into figures.
//!
//! One query per report, one row per group, the five metrics side by side as arrays in
//! [`Metric::ALL`]'s order. It is the documented weighting (docs/queries.md, "Sampling" and
//! `vitals_over_a_peak`): page views `sum(1 / sample_rate)`, the p75
//! `quantileExactWeighted(0.75)(x, toUInt64(round(1000 / sample_rate)))`, the shares as sums of
//! `1 / sample_rate` over the measured rows. It runs as written on ClickHouse 18.16 and 26.x:
//! - values are escaped literals ([`quote`]), not query parameters, which 18.16 lacks; times
//!   are `toDateTime('…', 'UTC')` (18.16 refuses a bare string against the sorting key's
//!   `toDate(page_view_at)`);
//! - a sum over a condition on a Nullable column is NULL on 18.16 for a group where the metric
//!   is never measured: `ifNull(…, 0)`;
//! - NULL (not measured) rows drop out of each metric's figures by themselves: aggregates skip
//!   NULLs, and `count(x)` says how many rows the figures rest on.
//!
//! Rows with `sample_rate = 0` (none should exist: intake stores a rate of at least 0.01 for a
//! sampled site) would stand for infinitely many page views and are left out.

use serde::Deserialize;

use super::{GroupBy, GroupFigures, Metric, MetricFigures, ReportDataError};

/// The weight of a row for page-view counts and shares.
const WEIGHT: &str = "1 / sample_rate";

/// `s` as a ClickHouse string literal: quoted, with `\` and `'` escaped (ClickHouse's "String
/// literals" syntax; the same on 18.16 and 26.x).
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '\0' => out.push_str("\\0"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// Unix seconds as `YYYY-MM-DD hh:mm:ss`, UTC.
pub fn utc(unix: u64) -> String {
    let t = crate::clickhouse::erase::utc_datetime(unix);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// Unix seconds as a `DateTime('UTC')` literal that 18.16 compares with the sorting key.
pub fn datetime(unix: u64) -> String {
    format!("toDateTime({}, 'UTC')", quote(&utc(unix)))
}

/// The report's query for `site` in `database`, grouped `by`, over `[from, to)` (Unix
/// seconds). `database` is a validated name (`[A-Za-z_][A-Za-z0-9_]*`).
pub fn report_query(database: &str, site: &str, by: &GroupBy, from: u64, to: u64) -> String {
    let per_metric = |name: &str, item: &dyn Fn(Metric, &str) -> String| {
        let items: Vec<String> = Metric::ALL
            .iter()
            .map(|&m| format!("        {}", item(m, m.column())))
            .collect();
        format!("    [\n{}\n    ] AS {name}", items.join(",\n"))
    };
    let columns = [
        format!("    {} AS grp", by.expression()),
        "    count() AS measurements".to_owned(),
        format!("    sum({WEIGHT}) AS page_views"),
        per_metric("measured", &|_, c| format!("count({c})")),
        per_metric("measured_page_views", &|_, c| {
            format!("sumIf({WEIGHT}, {c} IS NOT NULL)")
        }),
        per_metric("p75", &|_, c| {
            format!("quantileExactWeighted(0.75)({c}, toUInt64(round(1000 / sample_rate)))")
        }),
        per_metric("good_page_views", &|m, c| {
            format!("ifNull(sumIf({WEIGHT}, {c} <= {}), 0)", m.thresholds().0)
        }),
        per_metric("poor_page_views", &|m, c| {
            format!("ifNull(sumIf({WEIGHT}, {c} > {}), 0)", m.thresholds().1)
        }),
    ];
    format!(
        "SELECT\n{}\nFROM {database}.measurements FINAL\n{}\nGROUP BY grp\nORDER BY page_views DESC, grp",
        columns.join(",\n"),
        filter(site, from, to)
    )
}

/// The `WHERE` of the report: the site, the range on `page_view_at` (the sorting key's second
/// column), no bots, no rate of 0.
pub fn filter(site: &str, from: u64, to: u64) -> String {
    format!(
        "WHERE site = {}\n  AND page_view_at >= {} AND page_view_at < {}\n  AND device_type != 'bot'\n  AND sample_rate > 0",
        quote(site),
        datetime(from),
        datetime(to)
    )
}

/// How many rows of `site` the server holds at all (any time, bots too): 0 means ClickHouse
/// does not know the site.
pub fn known_query(database: &str, site: &str) -> String {
    format!(
        "SELECT count() FROM {database}.measurements WHERE site = {}",
        quote(site)
    )
}

/// One row of [`report_query`]'s answer (RowBinary, in the query's column order).
#[derive(Debug, Clone, Deserialize, clickhouse::Row)]
pub struct Row {
    /// The group's value.
    pub grp: String,
    /// Rows in the group.
    pub measurements: u64,
    /// Weighted page views.
    pub page_views: f64,
    /// Per metric: rows in which it was measured.
    pub measured: Vec<u64>,
    /// Per metric: the page views those stand for.
    pub measured_page_views: Vec<f64>,
    /// Per metric: the weighted p75, NULL when nothing was measured.
    pub p75: Vec<Option<f64>>,
    /// Per metric: page views rated good.
    pub good_page_views: Vec<f64>,
    /// Per metric: page views rated poor.
    pub poor_page_views: Vec<f64>,
}

impl Row {
    /// The group's figures; an error when an array does not hold one value per metric.
    pub fn figures(self) -> Result<GroupFigures, ReportDataError> {
        let n = Metric::ALL.len();
        let lengths = [
            self.measured.len(),
            self.measured_page_views.len(),
            self.p75.len(),
            self.good_page_views.len(),
            self.poor_page_views.len(),
        ];
        if lengths.iter().any(|&l| l != n) {
            return Err(ReportDataError::ArrayLengths {
                group: self.grp,
                lengths,
                metrics: n,
            });
        }
        let metrics = Metric::ALL
            .iter()
            .enumerate()
            .map(|(i, &m)| {
                MetricFigures::new(
                    m,
                    self.measured[i],
                    self.measured_page_views[i],
                    self.p75[i],
                    self.good_page_views[i],
                    self.poor_page_views[i],
                )
            })
            .collect();
        Ok(GroupFigures {
            group: self.grp,
            measurements: self.measurements,
            page_views: self.page_views,
            metrics,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_are_escaped() {
        assert_eq!(quote("shop"), "'shop'");
        assert_eq!(quote("a'b"), r"'a\'b'");
        assert_eq!(
            quote(r"a\'; DROP TABLE x; --"),
            r"'a\\\'; DROP TABLE x; --'"
        );
        assert_eq!(quote("a\nb\0"), r"'a\nb\0'");
    }

    #[test]
    fn times_are_utc_datetime_literals() {
        // 2026-12-03T12:00:00Z
        assert_eq!(utc(1_796_299_200), "2026-12-03 12:00:00");
        assert_eq!(utc(1_796_299_200 + 3661), "2026-12-03 13:01:01");
        assert_eq!(
            datetime(0),
            "toDateTime('1970-01-01 00:00:00', 'UTC')",
            "a bare string would be refused by 18.16 against toDate(page_view_at)"
        );
    }

    #[test]
    fn the_query_is_the_documented_weighting_with_the_thresholds_and_the_filter() {
        let sql = report_query("db", "it's", &GroupBy::Browser, 0, 86_400);
        assert!(
            sql.starts_with("SELECT\n    toString(browser) AS grp,"),
            "{sql}"
        );
        assert!(sql.contains("FROM db.measurements FINAL\n"), "{sql}");
        assert!(sql.contains(r"WHERE site = 'it\'s'"), "{sql}");
        assert!(sql.contains(
            "page_view_at >= toDateTime('1970-01-01 00:00:00', 'UTC') AND page_view_at < toDateTime('1970-01-02 00:00:00', 'UTC')"
        ));
        assert!(sql.contains("device_type != 'bot'"));
        assert!(sql.contains("sum(1 / sample_rate) AS page_views"));
        for m in Metric::ALL {
            let c = m.column();
            let (good, poor) = m.thresholds();
            for part in [
                format!("count({c})"),
                format!("sumIf(1 / sample_rate, {c} IS NOT NULL)"),
                format!("quantileExactWeighted(0.75)({c}, toUInt64(round(1000 / sample_rate)))"),
                format!("ifNull(sumIf(1 / sample_rate, {c} <= {good}), 0)"),
                format!("ifNull(sumIf(1 / sample_rate, {c} > {poor}), 0)"),
            ] {
                assert!(sql.contains(&part), "{part} in {sql}");
            }
        }
        assert!(
            sql.contains("cls <= 0.1)") && sql.contains("lcp_ms > 4000)"),
            "{sql}"
        );
        assert!(
            !sql.contains('?'),
            "the client would read a ? as a placeholder"
        );
        assert_eq!(
            known_query("db", "x'y"),
            r"SELECT count() FROM db.measurements WHERE site = 'x\'y'"
        );
    }

    #[test]
    fn docs_queries_md_shows_the_query_as_sent() {
        // 2026-11-26 12:00:00 to 2026-12-03 12:05:00 UTC.
        let now = 1_796_299_200;
        let sql = report_query(
            "collector",
            "shop",
            &GroupBy::DeviceType,
            now - 7 * 86_400,
            now + 300,
        );
        // Read at run time, not compiled in: the image's build context leaves docs/ out.
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/queries.md");
        let doc = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let doc = doc.as_str();
        assert!(
            doc.contains(&format!("```sql\n{sql}\n```")),
            "docs/queries.md, \"A site at a glance\", should show:\n{sql}"
        );
    }

    #[test]
    fn a_row_becomes_figures_and_a_short_array_is_an_error() {
        let row = Row {
            grp: "mobile".into(),
            measurements: 400,
            page_views: 600.0,
            measured: vec![400, 300, 0, 400, 99],
            measured_page_views: vec![600.0, 400.0, 0.0, 600.0, 150.0],
            p75: vec![Some(3000.0), Some(100.0), None, Some(900.0), Some(100.0)],
            good_page_views: vec![300.0, 400.0, 0.0, 600.0, 150.0],
            poor_page_views: vec![150.0, 0.0, 0.0, 0.0, 0.0],
        };
        let f = row.clone().figures().unwrap();
        assert_eq!(f.metrics[0].shares(), Some([0.5, 0.25, 0.25]));
        assert_eq!(f.metrics[2].shares(), None);
        assert_eq!(f.metrics[2].p75, None);
        assert_eq!(
            f.metrics[4].missing(),
            Some("not enough data"),
            "99 measured"
        );
        let short = Row {
            p75: vec![None],
            ..row
        };
        assert!(short.figures().is_err());
    }
}
