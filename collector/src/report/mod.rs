//! A site's numbers at a glance (`collector report`, contract v4 and v5 §1): per group of page
//! views (device type, country, browser, page group or a dimension's value), the page views and,
//! for LCP, INP, CLS, FCP and TTFB, the p75 and the shares rated good, needing improvement and
//! poor, every figure weighted by `1 / sample_rate` (docs/queries.md, "Sampling"); the CrUX view;
//! and two groups compared with confidence.
//!
//! - [`sql`]: the query per group, built with escaped literals (ClickHouse 18.16 has no query
//!   parameters), and its answer read into a [`Report`];
//! - [`crux`]: `--crux`, the 28 days as CrUX counts them: cohorts, verdict, daily trend;
//!   [`crux_days`]: its SQL, over the rows and over the daily roll-up a busy shop's view reads;
//! - [`compare`]: `--compare NAME=A,B` and `--deploy T`: its three queries and the answer;
//! - [`stats`]: the 95 % intervals of a weighted p75 and of a difference, and why they hold;
//! - [`table`]: the terminal tables; [`html`]: the self-contained pages with inline SVG charts;
//! - the command itself, which asks the servers in turn, is [`crate::cli::report`].
//!
//! Thresholds are web.dev's, each cited at its [`Metric`]: a value is good at or below the
//! good threshold, poor above the poor one, and needs improvement between
//! (<https://web.dev/articles/vitals>, "Core Web Vitals thresholds").

pub mod compare;
pub mod crux;
pub mod crux_days;
pub mod html;
pub mod sql;
pub mod stats;
pub mod table;

use serde::Serialize;

/// What the report cannot take: a command-line value (`--by`, `--compare`, `--deploy`), or a
/// server's answer that is not shaped as its query asks.
#[derive(Debug, thiserror::Error)]
pub enum ReportDataError {
    /// A `--by` value that is none of the groupings.
    #[error("{0:?}: one of device_type, country, browser, page_group, dimension:NAME")]
    GroupBy(String),
    /// A dimension's name that a site could not declare.
    #[error(transparent)]
    Dimension(#[from] crate::settings::SiteValueError),
    /// A `--compare` value that is not `NAME=A,B` with two different values.
    #[error("{0:?}: NAME=A,B (a dimension and two of its values, e.g. release=412,413)")]
    Compare(String),
    /// A `--compare` value with a side longer than a dimension's value can be (64 bytes).
    #[error("{0:?}: a dimension's value is at most 64 bytes")]
    CompareValueLength(String),
    /// A `--deploy` value that is not an RFC 3339 instant.
    #[error("{value:?}: an instant such as 2026-12-01T09:30:00Z ({source})")]
    Deploy {
        /// The value as given.
        value: String,
        /// Why it does not parse.
        source: humantime::TimestampError,
    },
    /// A `--deploy` instant before the Unix epoch.
    #[error("{0:?}: before 1970")]
    BeforeEpoch(String),
    /// A quantiles answer that is not `[low, p75, high]` (what was there instead).
    #[error("quantiles {0:?}, not [low, p75, high]")]
    Quantiles(Option<Vec<f64>>),
    /// A group's row whose arrays do not hold one value per metric.
    #[error("the answer for group {group:?} has arrays of {lengths:?} values, not {metrics}")]
    ArrayLengths {
        /// The group's value.
        group: String,
        /// The arrays' lengths, in the row's column order.
        lengths: [usize; 5],
        /// The number of metrics each should hold.
        metrics: usize,
    },
    /// A CrUX view's group that is not `FORM/NAVIGATIONS/DAY`.
    #[error("a group {0:?} not FORM/NAVIGATIONS/DAY")]
    CruxGroup(String),
}

/// One metric the report shows, in the order it shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    /// Largest Contentful Paint, ms: good ≤ 2500, poor > 4000 (<https://web.dev/articles/lcp>).
    Lcp,
    /// Interaction to Next Paint, ms: good ≤ 200, poor > 500 (<https://web.dev/articles/inp>).
    Inp,
    /// Cumulative Layout Shift, unitless: good ≤ 0.1, poor > 0.25
    /// (<https://web.dev/articles/cls>).
    Cls,
    /// First Contentful Paint, ms: good ≤ 1800, poor > 3000 (<https://web.dev/articles/fcp>).
    Fcp,
    /// Time to First Byte, ms: good ≤ 800, poor > 1800 (<https://web.dev/articles/ttfb>).
    Ttfb,
}

/// How a value rates against its metric's thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rating {
    /// At or below the good threshold.
    Good,
    /// Above the good threshold, at or below the poor one.
    NeedsImprovement,
    /// Above the poor threshold.
    Poor,
}

impl Rating {
    /// How a shop owner reads it.
    pub fn label(self) -> &'static str {
        match self {
            Rating::Good => "good",
            Rating::NeedsImprovement => "needs improvement",
            Rating::Poor => "poor",
        }
    }
}

impl Metric {
    /// Every metric, in the report's order.
    pub const ALL: [Metric; 5] = [
        Metric::Lcp,
        Metric::Inp,
        Metric::Cls,
        Metric::Fcp,
        Metric::Ttfb,
    ];

    /// Its column in `measurements` (contract §2).
    pub fn column(self) -> &'static str {
        match self {
            Metric::Lcp => "lcp_ms",
            Metric::Inp => "inp_ms",
            Metric::Cls => "cls",
            Metric::Fcp => "fcp_ms",
            Metric::Ttfb => "ttfb_ms",
        }
    }

    /// Its short name, as web.dev writes it.
    pub fn name(self) -> &'static str {
        match self {
            Metric::Lcp => "LCP",
            Metric::Inp => "INP",
            Metric::Cls => "CLS",
            Metric::Fcp => "FCP",
            Metric::Ttfb => "TTFB",
        }
    }

    /// `(good, poor)`: good at or below the first, poor above the second; milliseconds, CLS
    /// unitless (web.dev, cited at each variant).
    pub fn thresholds(self) -> (f64, f64) {
        match self {
            Metric::Lcp => (2500.0, 4000.0),
            Metric::Inp => (200.0, 500.0),
            Metric::Cls => (0.1, 0.25),
            Metric::Fcp => (1800.0, 3000.0),
            Metric::Ttfb => (800.0, 1800.0),
        }
    }

    /// How `value` rates (see [`Metric::thresholds`]).
    pub fn rate(self, value: f64) -> Rating {
        let (good, poor) = self.thresholds();
        if value <= good {
            Rating::Good
        } else if value <= poor {
            Rating::NeedsImprovement
        } else {
            Rating::Poor
        }
    }

    /// A value at the report's display resolution, rounded up: whole milliseconds, CLS to
    /// 0.001. What the CrUX view's p75s are taken over ([`crux`]): it keeps the quantiles'
    /// working sets to one entry per millisecond, not one per distinct float, and rounding up
    /// keeps every rating (the thresholds lie on that grid). A value within 10⁻⁶ of a step
    /// above it counts as that step, so that float noise (`0.123 · 1000 =
    /// 123.00000000000001`) does not move it a step up. [`Metric::resolution_sql`] is the same
    /// in SQL, operation for operation.
    pub fn at_resolution(self, value: f64) -> f64 {
        match self {
            Metric::Cls => (value * 1000.0 - 0.000_001).ceil() / 1000.0,
            _ => (value - 0.000_001).ceil(),
        }
    }

    /// [`Metric::at_resolution`] of its column, in SQL.
    pub fn resolution_sql(self) -> String {
        let c = self.column();
        match self {
            Metric::Cls => format!("ceil({c} * 1000 - 0.000001) / 1000"),
            _ => format!("ceil({c} - 0.000001)"),
        }
    }

    /// `value` as a shop owner reads it: whole milliseconds with thousands separated
    /// (`2,710 ms`), CLS with three decimals (`0.105`), so that a value just above a threshold
    /// does not print as the threshold.
    pub fn format(self, value: f64) -> String {
        match self {
            Metric::Cls => format!("{value:.3}"),
            _ => format!("{} ms", thousands(value.round())),
        }
    }
}

/// What the page views are grouped by (`--by`): a column, or (contract v5) a dimension's value
/// (`dimension:NAME`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum GroupBy {
    /// `mobile`, `tablet`, `desktop`, `unknown` (bots are left out).
    #[default]
    DeviceType,
    /// ISO 3166-1 alpha-2, empty where unknown.
    Country,
    /// The browser family (`Chrome`, `Mobile Safari`, ...).
    Browser,
    /// The page group (contract v4): a rule's name, or the path with its variable parts as
    /// `*`; empty for rows stored before page groups.
    PageGroup,
    /// The value of the dimension NAME (`--by dimension:NAME`, contract v5): a name the site
    /// declares (`[a-z0-9_]`, 1 to 32 bytes); empty for page views that did not send it.
    Dimension(String),
}

impl std::str::FromStr for GroupBy {
    type Err = ReportDataError;

    /// `device_type`, `country`, `browser`, `page_group` or `dimension:NAME`.
    fn from_str(s: &str) -> Result<GroupBy, ReportDataError> {
        Ok(match s {
            "device_type" => GroupBy::DeviceType,
            "country" => GroupBy::Country,
            "browser" => GroupBy::Browser,
            "page_group" => GroupBy::PageGroup,
            _ => match s.strip_prefix("dimension:") {
                Some(name) => GroupBy::Dimension(dimension_name(name)?),
                None => return Err(ReportDataError::GroupBy(s.to_owned())),
            },
        })
    }
}

impl std::fmt::Display for GroupBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GroupBy::Dimension(name) => write!(f, "dimension:{name}"),
            other => f.write_str(other.column()),
        }
    }
}

impl Serialize for GroupBy {
    /// As written on the command line: `device_type`, `dimension:release`.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// `name` when it is a dimension's name as `sites update --dimension` accepts it (1 to 32 bytes
/// of `[a-z0-9_]`, [`crate::settings::check_dimensions`]), else why not.
pub fn dimension_name(name: &str) -> Result<String, ReportDataError> {
    crate::settings::check_dimensions(&[name.to_owned()])?;
    Ok(name.to_owned())
}

impl GroupBy {
    /// Its column in `measurements`; for a dimension, `dimension_values`.
    pub fn column(&self) -> &'static str {
        match self {
            GroupBy::DeviceType => "device_type",
            GroupBy::Country => "country",
            GroupBy::Browser => "browser",
            GroupBy::PageGroup => "page_group",
            GroupBy::Dimension(_) => "dimension_values",
        }
    }

    /// The SQL expression of a row's group: the column, or the dimension's value (`''` where
    /// the row has no such dimension: `indexOf` is then 0 and element 0 of an array is its
    /// type's default, on 18.16 and 26.x alike).
    pub fn expression(&self) -> String {
        match self {
            GroupBy::Dimension(name) => dimension_value(name),
            other => format!("toString({})", other.column()),
        }
    }

    /// A group's name for display: an empty value (no country found, an unknown browser)
    /// reads `(unknown)`; for a dimension, `(not sent)`.
    pub fn display(&self, group: &str) -> String {
        match (group.is_empty(), self) {
            (true, GroupBy::Dimension(_)) => "(not sent)".to_owned(),
            (true, _) => "(unknown)".to_owned(),
            (false, _) => group.to_owned(),
        }
    }
}

/// The SQL expression of the value of the dimension `name` (validated by [`dimension_name`])
/// in a row, `''` where the row has none.
pub fn dimension_value(name: &str) -> String {
    format!(
        "dimension_values[indexOf(dimension_names, {})]",
        sql::quote(name)
    )
}

/// The fewest page views (stored rows, whatever their weight: a weight adds no information) a
/// metric must be measured by in a group for its figures to be shown (contract v5 §1): below
/// it, "not enough data", never a number. A p75 of two page views once raised a "critical" LCP
/// alarm of 31 s against PageSpeed Insights' 1 s (adobe/spacecat #2935).
pub const MIN_MEASURED: u64 = 100;

/// One metric's figures in one group; page views are weighted by `1 / sample_rate`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricFigures {
    /// The metric.
    pub metric: Metric,
    /// Measurements (rows) in which it was measured (not NULL): what the figures rest on.
    pub measured: u64,
    /// The page views those stand for.
    pub measured_page_views: f64,
    /// Whether `measured` reaches [`MIN_MEASURED`]: without it, the p75, the rating and the
    /// shares are `None` ("not enough data").
    pub enough_data: bool,
    /// The 75th percentile (weighted, exact); `None` when nothing was measured, or not
    /// enough.
    pub p75: Option<f64>,
    /// How the p75 rates.
    pub rating: Option<Rating>,
    /// Share of the measured page views rated good, 0 to 1; `None` when nothing was measured.
    pub good: Option<f64>,
    /// Share needing improvement.
    pub needs_improvement: Option<f64>,
    /// Share rated poor.
    pub poor: Option<f64>,
}

impl MetricFigures {
    /// The figures from weighted page-view sums: `measured_views` with the metric, of which
    /// `good_views` good and `poor_views` poor.
    pub fn new(
        metric: Metric,
        measured: u64,
        measured_views: f64,
        p75: Option<f64>,
        good_views: f64,
        poor_views: f64,
    ) -> MetricFigures {
        let enough_data = measured >= MIN_MEASURED;
        let share = |v: f64| (enough_data && measured_views > 0.0).then(|| v / measured_views);
        let (good, poor) = (share(good_views), share(poor_views));
        let p75 = p75.filter(|_| enough_data);
        MetricFigures {
            metric,
            measured,
            measured_page_views: measured_views,
            enough_data,
            p75,
            rating: p75.map(|v| metric.rate(v)),
            good,
            // From the page views, not `1 - good - poor`: that leaves float dust (5.55e-17)
            // where nothing needs improvement.
            needs_improvement: share(measured_views - good_views - poor_views).map(|n| n.max(0.0)),
            poor,
        }
    }

    /// The three shares, good first, when enough was measured.
    pub fn shares(&self) -> Option<[f64; 3]> {
        Some([self.good?, self.needs_improvement?, self.poor?])
    }

    /// What stands in for the figures when they are not shown: "not measured" (no page view
    /// measured it) or "not enough data" (fewer than [`MIN_MEASURED`]); `None` when shown.
    pub fn missing(&self) -> Option<&'static str> {
        match (self.enough_data, self.measured) {
            (true, _) => None,
            (false, 0) => Some("not measured"),
            (false, _) => Some("not enough data"),
        }
    }
}

/// One group's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupFigures {
    /// The group's value as stored (`mobile`, `DE`, `Firefox`; may be empty).
    pub group: String,
    /// Measurements (rows) in the group.
    pub measurements: u64,
    /// Page views they stand for (`sum(1 / sample_rate)`).
    pub page_views: f64,
    /// One entry per metric, in [`Metric::ALL`]'s order.
    pub metrics: Vec<MetricFigures>,
}

/// The report of one site over one time range.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The site key.
    pub site: String,
    /// The range's length in days.
    pub days: u32,
    /// How page views are grouped (`device_type`, ..., `dimension:NAME`).
    pub by: GroupBy,
    /// Start of the range, `YYYY-MM-DD hh:mm:ss` UTC (inclusive).
    pub from: String,
    /// End of the range, UTC (exclusive).
    pub to: String,
    /// The ClickHouse server that answered.
    pub server: String,
    /// The groups, most page views first.
    pub groups: Vec<GroupFigures>,
}

/// `n` (a whole number) with its thousands separated by commas: `12,345`.
pub fn thousands(n: f64) -> String {
    let digits = format!("{:.0}", n.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0.0 && digits != "0" {
        out.insert(0, '-');
    }
    out
}

/// A share (0 to 1) as a whole percentage: `61%`.
pub fn percent(share: f64) -> String {
    format!("{:.0}%", share * 100.0)
}

/// `days` as a heading says it: "day" or "N days".
fn days(days: u32) -> String {
    if days == 1 {
        "day".to_owned()
    } else {
        format!("{days} days")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_rate_by_the_web_dev_thresholds_at_their_edges() {
        let cases = [
            (Metric::Lcp, 2500.0, Rating::Good),
            (Metric::Lcp, 2500.1, Rating::NeedsImprovement),
            (Metric::Lcp, 4000.0, Rating::NeedsImprovement),
            (Metric::Lcp, 4000.1, Rating::Poor),
            (Metric::Inp, 200.0, Rating::Good),
            (Metric::Inp, 201.0, Rating::NeedsImprovement),
            (Metric::Inp, 500.0, Rating::NeedsImprovement),
            (Metric::Inp, 501.0, Rating::Poor),
            (Metric::Cls, 0.0, Rating::Good),
            (Metric::Cls, 0.1, Rating::Good),
            (Metric::Cls, 0.100_01, Rating::NeedsImprovement),
            (Metric::Cls, 0.25, Rating::NeedsImprovement),
            (Metric::Cls, 0.26, Rating::Poor),
            (Metric::Fcp, 1800.0, Rating::Good),
            (Metric::Fcp, 3000.0, Rating::NeedsImprovement),
            (Metric::Fcp, 3001.0, Rating::Poor),
            (Metric::Ttfb, 800.0, Rating::Good),
            (Metric::Ttfb, 1800.0, Rating::NeedsImprovement),
            (Metric::Ttfb, 1800.5, Rating::Poor),
        ];
        for (metric, value, rating) in cases {
            assert_eq!(metric.rate(value), rating, "{metric:?} {value}");
        }
    }

    #[test]
    fn shares_are_of_the_measured_page_views_and_absent_without_any() {
        let f = MetricFigures::new(Metric::Lcp, 100, 400.0, Some(3000.0), 200.0, 100.0);
        assert_eq!(f.shares(), Some([0.5, 0.25, 0.25]));
        assert_eq!(f.rating, Some(Rating::NeedsImprovement));
        assert_eq!(f.missing(), None);
        // 1 - 0.7 - 0.3 is 5.55e-17 in floats; none needs improvement.
        let split = MetricFigures::new(Metric::Lcp, 100, 10.0, Some(900.0), 7.0, 3.0);
        assert_eq!(split.needs_improvement, Some(0.0));
        let none = MetricFigures::new(Metric::Cls, 0, 0.0, None, 0.0, 0.0);
        assert_eq!(none.shares(), None);
        assert_eq!(none.rating, None);
        assert_eq!(none.missing(), Some("not measured"));
    }

    /// Contract v5 §1: 99 page views (their weight aside) are not enough; no number is shown.
    #[test]
    fn fewer_than_a_hundred_page_views_are_not_enough_data() {
        let f = MetricFigures::new(Metric::Lcp, 99, 9900.0, Some(31000.0), 0.0, 9900.0);
        assert!(!f.enough_data);
        assert_eq!((f.p75, f.rating, f.shares()), (None, None, None));
        assert_eq!(f.missing(), Some("not enough data"));
        assert_eq!(f.measured, 99, "what it rests on is still said");
    }

    #[test]
    fn values_at_the_resolution_keep_their_rating() {
        assert_eq!(Metric::Lcp.at_resolution(2500.0), 2500.0);
        assert_eq!(Metric::Lcp.at_resolution(2500.01), 2501.0);
        assert_eq!(Metric::Lcp.at_resolution(2499.2), 2500.0);
        assert_eq!(Metric::Cls.at_resolution(0.1), 0.1);
        assert_eq!(
            Metric::Cls.at_resolution(0.123),
            0.123,
            "not 0.124 by float noise"
        );
        assert_eq!(Metric::Cls.at_resolution(0.1001), 0.101);
        assert_eq!(Metric::Cls.at_resolution(0.0), 0.0);
        assert_eq!(
            Metric::Cls.resolution_sql(),
            "ceil(cls * 1000 - 0.000001) / 1000"
        );
    }

    #[test]
    fn numbers_read_as_a_shop_owner_reads_them() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1000.0), "1,000");
        assert_eq!(thousands(1_234_567.0), "1,234,567");
        assert_eq!(Metric::Lcp.format(2709.6), "2,710 ms");
        assert_eq!(Metric::Cls.format(0.1049), "0.105");
        assert_eq!(percent(0.614), "61%");
        assert_eq!(GroupBy::Country.display(""), "(unknown)");
    }
}
