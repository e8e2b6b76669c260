//! `collector report --compare NAME=A,B` and `--deploy T` (contract v5 §1): two groups of a
//! site's page views side by side, each metric's p75 with its 95 % confidence interval, and the
//! difference B − A with its own, "real" when that interval excludes 0 ([`super::stats`] says
//! how, and why the coverage is right).
//!
//! - `--compare release=412,413`: over the last `--days`, the page views whose dimension
//!   `release` is `412` (A) against those where it is `413` (B);
//! - `--deploy T`: the `--days` before instant T (A) against the `--days` from T on (B).
//!
//! Values are taken at the display resolution, rounded up ([`Metric::at_resolution`]), as in
//! the CrUX view: a group of a million page views then has a working set of thousands of
//! values, not a million. Three queries over the same rows (bots left out, weighted by
//! `1 / sample_rate`): the first
//! gives, per side and metric, the rows, their weights and the p75; the second the spread of
//! the rows about that p75 (the variance of the weighted share below it, hence the effective
//! size); the third asks `quantilesExactWeightedIf` for each side's p75 and the two levels of
//! its interval ([`super::stats::interval_levels`]). All three are aggregations that
//! ClickHouse runs over every row of the site's range; no row is fetched.

use serde::Serialize;

use super::sql::{self, quote};
use super::stats::{self, Difference, Estimate};
use super::{dimension_value, Metric, ReportDataError, MIN_MEASURED};

/// What is compared with what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sides {
    /// Two values of a dimension (`--compare NAME=A,B`).
    Dimension {
        /// The dimension.
        name: String,
        /// A's value.
        a: String,
        /// B's value.
        b: String,
    },
    /// Before and after an instant (`--deploy T`), Unix seconds.
    Deploy(u64),
}

/// `--compare`'s value: `NAME=A,B`, NAME a dimension's name, A and B two different values
/// without a comma (a dimension's value is at most 64 bytes).
pub fn parse_compare(s: &str) -> Result<Sides, ReportDataError> {
    let bad = || ReportDataError::Compare(s.to_owned());
    let (name, values) = s.split_once('=').ok_or_else(bad)?;
    let (a, b) = values.split_once(',').ok_or_else(bad)?;
    if a.is_empty() || b.is_empty() || b.contains(',') || a == b {
        return Err(bad());
    }
    if a.len() > 64 || b.len() > 64 {
        return Err(ReportDataError::CompareValueLength(s.to_owned()));
    }
    Ok(Sides::Dimension {
        name: super::dimension_name(name)?,
        a: a.to_owned(),
        b: b.to_owned(),
    })
}

/// `--deploy`'s value: an RFC 3339 instant (`2026-12-01T09:30:00Z`; a space for the `T` and no
/// zone are read as UTC), as Unix seconds.
pub fn parse_deploy(s: &str) -> Result<u64, ReportDataError> {
    let t = humantime::parse_rfc3339_weak(s).map_err(|source| ReportDataError::Deploy {
        value: s.to_owned(),
        source,
    })?;
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .map_err(|_| ReportDataError::BeforeEpoch(s.to_owned()))
}

impl Sides {
    /// The range `[from, to)` the rows are read from, for `days` days, asked at `now` (with the
    /// report's 5 minutes ahead for `--compare`, as the plain report).
    pub fn range(&self, days: u32, now: u64) -> (u64, u64) {
        let span = u64::from(days) * 86_400;
        match self {
            Sides::Dimension { .. } => (now.saturating_sub(span), now + 300),
            Sides::Deploy(t) => (t.saturating_sub(span), t + span),
        }
    }

    /// The SQL conditions that put a row on side A and on side B.
    fn conditions(&self) -> (String, String) {
        match self {
            Sides::Dimension { name, a, b } => {
                let v = dimension_value(name);
                (format!("{v} = {}", quote(a)), format!("{v} = {}", quote(b)))
            }
            Sides::Deploy(t) => (
                format!("page_view_at < {}", sql::datetime(*t)),
                format!("page_view_at >= {}", sql::datetime(*t)),
            ),
        }
    }

    /// The names of A and B as the report shows them.
    fn names(&self) -> (String, String) {
        match self {
            Sides::Dimension { name, a, b } => (format!("{name}={a}"), format!("{name}={b}")),
            Sides::Deploy(t) => (
                format!("before {} UTC", sql::utc(*t)),
                format!("from {} UTC", sql::utc(*t)),
            ),
        }
    }
}

/// The `WHERE` of both queries: the report's filter and a row on one side or the other.
fn filter(site: &str, sides: &Sides, (from, to): (u64, u64)) -> String {
    let (a, b) = sides.conditions();
    format!("{}\n  AND (({a}) OR ({b}))", sql::filter(site, from, to))
}

/// The first query: per side (`a` or `b`), rows, and per metric the rows that measured it,
/// the sum of their weights and their weighted p75.
pub fn sums_query(database: &str, site: &str, sides: &Sides, range: (u64, u64)) -> String {
    let (a, _) = sides.conditions();
    let per_metric = |item: &dyn Fn(Metric, &str) -> String| {
        let items: Vec<String> = Metric::ALL.iter().map(|&m| item(m, m.column())).collect();
        format!("[{}]", items.join(", "))
    };
    format!(
        "SELECT\n    if({a}, 'a', 'b') AS side,\n    count() AS measurements,\n    sum(1 / sample_rate) AS page_views,\n    {} AS measured,\n    {} AS weights,\n    {} AS p75\nFROM {database}.measurements FINAL\n{}\nGROUP BY side\nORDER BY side",
        per_metric(&|_, c| format!("count({c})")),
        per_metric(&|_, c| format!("ifNull(sumIf(1 / sample_rate, {c} IS NOT NULL), 0)")),
        per_metric(&|m, _| format!(
            "quantileExactWeighted(0.75)({}, toUInt64(round(1000 / sample_rate)))",
            m.resolution_sql()
        )),
        filter(site, sides, range)
    )
}

/// One row of [`sums_query`]'s answer.
#[derive(Debug, Clone, serde::Deserialize, clickhouse::Row)]
pub struct SumsRow {
    /// `a` or `b`.
    pub side: String,
    /// Rows.
    pub measurements: u64,
    /// Page views (weighted).
    pub page_views: f64,
    /// Per metric, the rows that measured it.
    pub measured: Vec<u64>,
    /// Per metric, the sum of their weights.
    pub weights: Vec<f64>,
    /// Per metric, the weighted p75 (NULL when nothing was measured).
    pub p75: Vec<Option<f64>>,
}

/// The second query: per side and metric, the spread about the side's p75,
/// `Σ w² ([x ≤ p75] − 0.75)²` ([`stats::effective_size`]).
pub fn spread_query(
    database: &str,
    site: &str,
    sides: &Sides,
    range: (u64, u64),
    sums: &[SumsRow; 2],
) -> String {
    let conditions = sides.conditions();
    let side = |which: usize| {
        let cond = if which == 0 {
            &conditions.0
        } else {
            &conditions.1
        };
        let items: Vec<String> = Metric::ALL
            .iter()
            .enumerate()
            .map(|(i, m)| match sums[which].p75.get(i).copied().flatten() {
                Some(p75) => {
                    let c = m.column();
                    format!(
                        "ifNull(sumIf(pow(1 / sample_rate, 2) * pow(if({} <= {p75}, 1, 0) - 0.75, 2), {c} IS NOT NULL AND ({cond})), 0)",
                        m.resolution_sql()
                    )
                }
                None => "toFloat64(0)".to_owned(),
            })
            .collect();
        format!("[\n        {}\n    ]", items.join(",\n        "))
    };
    format!(
        "SELECT\n    {} AS a,\n    {} AS b\nFROM {database}.measurements FINAL\n{}",
        side(0),
        side(1),
        filter(site, sides, range)
    )
}

/// [`spread_query`]'s answer: per side, per metric, the spread (empty: no row measured).
#[derive(Debug, Clone, Default, serde::Deserialize, clickhouse::Row)]
pub struct SpreadRow {
    /// Side A.
    pub a: Vec<f64>,
    /// Side B.
    pub b: Vec<f64>,
}

/// Per side, per metric: the levels `(low, high)` of the interval.
pub type Levels = [Vec<(f64, f64)>; 2];

/// The levels each side's interval needs, from the first two queries' answers.
pub fn levels(sums: &[SumsRow; 2], spread: &SpreadRow) -> Levels {
    let spreads = [&spread.a, &spread.b];
    [0, 1].map(|which| {
        (0..Metric::ALL.len())
            .map(|i| {
                let n_eff = stats::effective_size(
                    sums[which].weights.get(i).copied().unwrap_or(0.0),
                    spreads[which].get(i).copied().unwrap_or(0.0),
                );
                stats::interval_levels(n_eff)
            })
            .collect()
    })
}

/// The third query: per side, per metric, the weighted quantiles `[low, 0.75, high]` at the
/// side's levels.
pub fn quantiles_query(
    database: &str,
    site: &str,
    sides: &Sides,
    range: (u64, u64),
    levels: &Levels,
) -> String {
    let conditions = sides.conditions();
    let side = |which: usize| {
        let cond = if which == 0 {
            &conditions.0
        } else {
            &conditions.1
        };
        let items: Vec<String> = Metric::ALL
            .iter()
            .zip(&levels[which])
            .map(|(m, (lo, hi))| {
                let c = m.column();
                format!(
                    "quantilesExactWeightedIf({lo}, 0.75, {hi})(assumeNotNull({}), toUInt64(round(1000 / sample_rate)), {c} IS NOT NULL AND ({cond}))",
                    m.resolution_sql()
                )
            })
            .collect();
        format!("[\n        {}\n    ]", items.join(",\n        "))
    };
    format!(
        "SELECT\n    {} AS a,\n    {} AS b\nFROM {database}.measurements FINAL\n{}",
        side(0),
        side(1),
        filter(site, sides, range)
    )
}

/// [`quantiles_query`]'s answer: per side, per metric, `[low, p75, high]` (empty: no row
/// measured).
#[derive(Debug, Clone, Default, serde::Deserialize, clickhouse::Row)]
pub struct QuantilesRow {
    /// Side A.
    pub a: Vec<Vec<f64>>,
    /// Side B.
    pub b: Vec<Vec<f64>>,
}

/// One side of one metric.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SideFigures {
    /// Rows that measured it.
    pub measured: u64,
    /// Whether they reach [`MIN_MEASURED`].
    pub enough_data: bool,
    /// The p75 and its 95 % interval; `None` without enough data.
    pub estimate: Option<Estimate>,
}

/// One metric, A against B.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricComparison {
    /// The metric.
    pub metric: Metric,
    /// A's figures.
    pub a: SideFigures,
    /// B's figures.
    pub b: SideFigures,
    /// B − A with its interval; `None` unless both sides have enough data.
    pub difference: Option<Difference>,
}

/// One side as a whole.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SideSummary {
    /// `release=412`, `before 2026-12-01 09:30:00 UTC`.
    pub name: String,
    /// Rows.
    pub measurements: u64,
    /// Page views (weighted).
    pub page_views: f64,
}

/// The comparison of a site's two groups of page views.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// The site key.
    pub site: String,
    /// `compare` or `deploy`.
    pub kind: &'static str,
    /// The range the rows come from, `YYYY-MM-DD hh:mm:ss` UTC (inclusive).
    pub from: String,
    /// Its end (exclusive).
    pub to: String,
    /// Side A.
    pub a: SideSummary,
    /// Side B.
    pub b: SideSummary,
    /// The confidence of every interval.
    pub confidence: f64,
    /// The ClickHouse server that answered.
    pub server: String,
    /// Per metric, in [`Metric::ALL`]'s order.
    pub metrics: Vec<MetricComparison>,
}

/// The answer of the first query as `[A, B]`, a side without rows as zeros.
pub fn sums_by_side(rows: Vec<SumsRow>) -> [SumsRow; 2] {
    let zero = |side: &str| SumsRow {
        side: side.to_owned(),
        measurements: 0,
        page_views: 0.0,
        measured: vec![0; Metric::ALL.len()],
        weights: vec![0.0; Metric::ALL.len()],
        p75: vec![None; Metric::ALL.len()],
    };
    let find = |side: &str| {
        rows.iter()
            .find(|r| r.side == side)
            .cloned()
            .unwrap_or_else(|| zero(side))
    };
    [find("a"), find("b")]
}

/// The comparison from both answers.
pub fn assemble(
    site: &str,
    server: &str,
    sides: &Sides,
    (from, to): (u64, u64),
    sums: &[SumsRow; 2],
    quantiles: &QuantilesRow,
) -> Result<Comparison, ReportDataError> {
    let side = |which: usize, i: usize| -> Result<SideFigures, ReportDataError> {
        let measured = sums[which].measured.get(i).copied().unwrap_or(0);
        let enough_data = measured >= MIN_MEASURED;
        let q = if which == 0 {
            &quantiles.a
        } else {
            &quantiles.b
        };
        let estimate = match (enough_data, q.get(i).map(Vec::as_slice)) {
            (false, _) => None,
            (true, Some(&[low, p75, high])) => Some(Estimate { p75, low, high }),
            (true, other) => return Err(ReportDataError::Quantiles(other.map(<[f64]>::to_vec))),
        };
        Ok(SideFigures {
            measured,
            enough_data,
            estimate,
        })
    };
    let mut metrics = Vec::new();
    for (i, &metric) in Metric::ALL.iter().enumerate() {
        let (a, b) = (side(0, i)?, side(1, i)?);
        let difference = a
            .estimate
            .zip(b.estimate)
            .map(|(a, b)| stats::difference(&a, &b));
        metrics.push(MetricComparison {
            metric,
            a,
            b,
            difference,
        });
    }
    let (name_a, name_b) = sides.names();
    let summary = |name: String, s: &SumsRow| SideSummary {
        name,
        measurements: s.measurements,
        page_views: s.page_views,
    };
    Ok(Comparison {
        site: site.to_owned(),
        kind: match sides {
            Sides::Dimension { .. } => "compare",
            Sides::Deploy(_) => "deploy",
        },
        from: sql::utc(from),
        to: sql::utc(to),
        a: summary(name_a, &sums[0]),
        b: summary(name_b, &sums[1]),
        confidence: 0.95,
        server: server.to_owned(),
        metrics,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_and_deploy_values_are_read_or_refused_clearly() {
        assert_eq!(
            parse_compare("release=412,413").ok(),
            Some(Sides::Dimension {
                name: "release".into(),
                a: "412".into(),
                b: "413".into()
            })
        );
        for bad in [
            "release",
            "release=412",
            "release=412,",
            "release=1,2,3",
            "release=4,4",
            "Rel=1,2",
        ] {
            assert!(parse_compare(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_deploy("2026-12-03T12:00:00Z").ok(),
            Some(1_796_299_200)
        );
        assert_eq!(
            parse_deploy("2026-12-03 12:00:00").ok(),
            Some(1_796_299_200)
        );
        assert!(parse_deploy("yesterday").is_err());
        assert_eq!(
            Sides::Deploy(1_000_000).range(2, 0),
            (1_000_000 - 172_800, 1_000_000 + 172_800)
        );
    }

    #[test]
    fn the_queries_split_the_rows_by_side() {
        let sides = parse_compare("release=4'12,413").unwrap();
        let range = (0, 86_400);
        let q = sums_query("db", "shop", &sides, range);
        assert!(q.contains(r"if(dimension_values[indexOf(dimension_names, 'release')] = '4\'12', 'a', 'b') AS side"), "{q}");
        assert!(q.contains("AND ((dimension_values[indexOf(dimension_names, 'release')] = '4\\'12') OR (dimension_values[indexOf(dimension_names, 'release')] = '413'))"), "{q}");
        assert!(q.contains("device_type != 'bot'"), "{q}");
        let levels = [vec![(0.7, 0.8); 5], vec![(0.725, 0.775); 5]];
        let q = quantiles_query("db", "shop", &Sides::Deploy(86_400), range, &levels);
        assert!(q.contains("quantilesExactWeightedIf(0.7, 0.75, 0.8)(assumeNotNull(ceil(lcp_ms - 0.000001)), toUInt64(round(1000 / sample_rate)), lcp_ms IS NOT NULL AND (page_view_at < toDateTime('1970-01-02 00:00:00', 'UTC')))"), "{q}");
        assert!(
            q.contains("quantilesExactWeightedIf(0.725, 0.75, 0.775)(assumeNotNull(ceil(ttfb_ms - 0.000001))"),
            "{q}"
        );
    }

    #[test]
    fn the_spread_is_about_each_sides_own_p75() {
        let mut sums = sums_by_side(vec![]);
        sums[0].p75[0] = Some(2500.0);
        sums[1].p75[0] = Some(2800.0);
        let q = spread_query("db", "shop", &Sides::Deploy(86_400), (0, 172_800), &sums);
        assert!(q.contains("ifNull(sumIf(pow(1 / sample_rate, 2) * pow(if(ceil(lcp_ms - 0.000001) <= 2500, 1, 0) - 0.75, 2), lcp_ms IS NOT NULL AND (page_view_at < toDateTime('1970-01-02 00:00:00', 'UTC'))), 0)"), "{q}");
        assert!(
            q.contains("if(ceil(lcp_ms - 0.000001) <= 2800, 1, 0)"),
            "{q}"
        );
        assert_eq!(
            q.matches("toFloat64(0)").count(),
            8,
            "nothing measured: no spread"
        );
    }

    #[test]
    fn a_side_short_of_data_shows_no_difference() {
        let sums = sums_by_side(vec![SumsRow {
            side: "b".into(),
            measurements: 500,
            page_views: 500.0,
            measured: vec![500, 500, 99, 500, 500],
            weights: vec![500.0; 5],
            p75: vec![Some(100.0); 5],
        }]);
        assert_eq!(sums[0].measurements, 0, "A had no rows");
        let q = QuantilesRow {
            a: vec![vec![0.0; 3]; 5],
            b: vec![vec![90.0, 100.0, 110.0]; 5],
        };
        let c = assemble("shop", "s", &Sides::Deploy(86_400), (0, 172_800), &sums, &q).unwrap();
        assert_eq!(c.kind, "deploy");
        assert!(c
            .metrics
            .iter()
            .all(|m| m.difference.is_none() && !m.a.enough_data));
        assert_eq!(
            c.metrics[0].b.estimate,
            Some(Estimate {
                p75: 100.0,
                low: 90.0,
                high: 110.0
            })
        );
        assert_eq!(c.metrics[2].b.estimate, None, "99 measured");
    }
}
