//! `collector report --crux` (contract v5 §1): a site's numbers as Chrome's field data (CrUX,
//! what Google Search Console shows) reports them, so that a shop reconciles the two.
//!
//! - **Range**: the [`DAYS`] complete UTC days before today, by `page_view_at`.
//! - **Cohorts**: per form factor (`mobile` as `phone`, `tablet`, `desktop`; `bot` and
//!   `unknown` left out) and all three together; Chromium-based browsers only
//!   ([`CHROMIUM`]: CrUX's metrics are Chromium's); once for hard navigations only and once
//!   with soft navigations (`navigation_type = 'soft_navigation'`) too.
//! - **Per cohort**: page views, then for LCP, INP, CLS, FCP and TTFB the p75 and the shares
//!   (weighted by `1 / sample_rate` as everywhere in the report), whether the site passes Core
//!   Web Vitals ([`Verdict`]), and each p75 per day ([`Trend`], [`DAYS`] points).
//!
//! The SQL, over the rows and over the daily roll-up that makes a view of a busy shop fast, is
//! [`super::crux_days`]; this module is what the view is and how its answer is assembled.

use std::collections::BTreeMap;

use serde::Serialize;

use super::sql::{self, quote};
use super::{GroupFigures, Metric, MetricFigures, Rating, ReportDataError};

/// The days a CrUX view covers (CrUX's own 28-day window).
pub const DAYS: u32 = 28;

/// One browser family (uap-core's name, as the `browser` column stores it) counted as
/// Chromium-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Family {
    /// The family.
    pub name: &'static str,
    /// Counted on Android only (an app's in-app browser is Android's WebView there; on other
    /// systems it is something else).
    pub android_only: bool,
    /// The first major version built on Blink (0: every version): Edge before 79 is EdgeHTML,
    /// Opera before 15 (Opera Mobile before 14) is Presto. An unknown version counts.
    pub since: u32,
}

const fn family(name: &'static str, android_only: bool, since: u32) -> Family {
    Family {
        name,
        android_only,
        since,
    }
}

/// The browser families whose engine is Blink, on every OS but iOS (where every browser,
/// Chrome included as `Chrome Mobile iOS`, is WebKit). docs/queries.md lists them.
pub const CHROMIUM: [Family; 26] = [
    family("Chrome", false, 0),
    family("Chrome Mobile", false, 0),
    family("Chrome Mobile WebView", false, 0),
    family("Chromium", false, 0),
    family("Edge", false, 79),
    family("Edge Mobile", true, 0),
    family("Opera", false, 15),
    family("Opera Mobile", false, 14),
    family("Samsung Internet", false, 0),
    family("Yandex Browser", false, 0),
    family("Brave", false, 0),
    family("Vivaldi", false, 0),
    family("Whale", false, 0),
    family("Coc Coc", false, 0),
    family("Amazon Silk", false, 0),
    family("Oculus Browser", false, 0),
    family("MiuiBrowser", false, 0),
    family("Mail.ru Chromium Browser", false, 0),
    family("DuckDuckGo Mobile", true, 0),
    family("Facebook", true, 0),
    family("Instagram", true, 0),
    family("Pinterest", true, 0),
    family("Snapchat", true, 0),
    family("TikTok", true, 0),
    family("LINE", true, 0),
    family("Google", true, 0),
];

/// Whether a row's `browser`, `browser_version` and `os` make it Chromium's (the rule
/// [`chromium_filter`] writes in SQL).
pub fn is_chromium(browser: &str, version: &str, os: &str) -> bool {
    let major: u32 = version.parse().unwrap_or(0);
    os != "iOS"
        && CHROMIUM.iter().any(|f| {
            f.name == browser
                && (!f.android_only || os == "Android")
                && (major == 0 || major >= f.since)
        })
}

/// [`is_chromium`] as a SQL condition on `browser`, `browser_version` and `os`.
pub fn chromium_filter() -> String {
    let names = |pick: &dyn Fn(&Family) -> bool| {
        let n: Vec<String> = CHROMIUM
            .iter()
            .filter(|f| pick(f))
            .map(|f| quote(f.name))
            .collect();
        n.join(", ")
    };
    let mut rule = format!(
        "os != 'iOS' AND (browser IN ({}) OR (os = 'Android' AND browser IN ({})))",
        names(&|f| !f.android_only),
        names(&|f| f.android_only)
    );
    for f in CHROMIUM.iter().filter(|f| f.since > 0) {
        rule.push_str(&format!(
            " AND NOT (browser = {} AND toUInt32OrZero(browser_version) BETWEEN 1 AND {})",
            quote(f.name),
            f.since - 1
        ));
    }
    rule
}

/// A form factor as CrUX names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FormFactor {
    /// The three together.
    All,
    /// `device_type = 'mobile'`.
    Phone,
    /// `tablet`.
    Tablet,
    /// `desktop`.
    Desktop,
}

impl FormFactor {
    /// In the order the report shows them.
    pub const ALL: [FormFactor; 4] = [
        FormFactor::All,
        FormFactor::Phone,
        FormFactor::Tablet,
        FormFactor::Desktop,
    ];

    /// The `device_type` it is (`all` for the three together).
    pub fn device_type(self) -> &'static str {
        match self {
            FormFactor::All => "all",
            FormFactor::Phone => "mobile",
            FormFactor::Tablet => "tablet",
            FormFactor::Desktop => "desktop",
        }
    }

    /// How a shop owner reads it.
    pub fn label(self) -> &'static str {
        match self {
            FormFactor::All => "all form factors",
            FormFactor::Phone => "phone",
            FormFactor::Tablet => "tablet",
            FormFactor::Desktop => "desktop",
        }
    }
}

/// Which navigations a cohort counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Navigations {
    /// Hard navigations only (every `navigation_type` but `soft_navigation`), as CrUX's
    /// classic metrics.
    Hard,
    /// Soft navigations too, as CrUX's experimental soft-navigation metrics.
    HardAndSoft,
}

impl Navigations {
    /// In the order the report shows them.
    pub const ALL: [Navigations; 2] = [Navigations::Hard, Navigations::HardAndSoft];

    /// Its name in the query's answer and in JSON.
    pub fn key(self) -> &'static str {
        match self {
            Navigations::Hard => "hard",
            Navigations::HardAndSoft => "hard_and_soft",
        }
    }

    /// How a shop owner reads it.
    pub fn label(self) -> &'static str {
        match self {
            Navigations::Hard => "hard navigations",
            Navigations::HardAndSoft => "hard and soft navigations",
        }
    }
}

/// Whether a cohort passes Core Web Vitals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// LCP, INP and CLS each good at p75.
    Pass,
    /// Each of the three has enough data, and one is not good at p75.
    Fail,
    /// One of the three is measured by fewer than [`super::MIN_MEASURED`] page views: no
    /// verdict (contract v5 §1: a pass needs all three to have enough).
    NotEnoughData,
}

impl Verdict {
    /// The verdict on a cohort's figures (LCP, INP and CLS among them).
    pub fn of(metrics: &[MetricFigures]) -> Verdict {
        let core = [Metric::Lcp, Metric::Inp, Metric::Cls];
        let ratings: Vec<Option<Rating>> = core
            .iter()
            .map(|m| {
                metrics
                    .iter()
                    .find(|f| f.metric == *m)
                    .and_then(|f| f.rating)
            })
            .collect();
        if ratings.iter().any(Option::is_none) {
            Verdict::NotEnoughData
        } else if ratings.iter().all(|r| *r == Some(Rating::Good)) {
            Verdict::Pass
        } else {
            Verdict::Fail
        }
    }

    /// How a shop owner reads it.
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Pass => "passes",
            Verdict::Fail => "fails",
            Verdict::NotEnoughData => "not enough data",
        }
    }
}

/// One metric's p75 per day.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Trend {
    /// The metric.
    pub metric: Metric,
    /// Per day of [`CruxReport::days`], the p75; `None` where fewer than
    /// [`super::MIN_MEASURED`] page views measured it that day.
    pub p75: Vec<Option<f64>>,
    /// Per day, the measurements (rows) that measured it.
    pub measured: Vec<u64>,
}

/// One cohort's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cohort {
    /// The form factor.
    pub form_factor: FormFactor,
    /// The navigations counted.
    pub navigations: Navigations,
    /// Measurements (rows).
    pub measurements: u64,
    /// Page views they stand for.
    pub page_views: f64,
    /// Per metric, over the whole range, in [`Metric::ALL`]'s order.
    pub metrics: Vec<MetricFigures>,
    /// Whether it passes Core Web Vitals.
    pub core_web_vitals: Verdict,
    /// Per metric, its p75 per day.
    pub trend: Vec<Trend>,
}

/// The CrUX view of one site.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CruxReport {
    /// The site key.
    pub site: String,
    /// Start of the range, `YYYY-MM-DD hh:mm:ss` UTC (inclusive): [`DAYS`] days before today.
    pub from: String,
    /// End of the range, UTC (exclusive): today's midnight.
    pub to: String,
    /// The days, `YYYY-MM-DD`, oldest first ([`DAYS`] of them).
    pub days: Vec<String>,
    /// The browser families counted as Chromium.
    pub chromium: Vec<Family>,
    /// The ClickHouse server that answered.
    pub server: String,
    /// Per form factor ([`FormFactor::ALL`]) and navigations ([`Navigations::ALL`]), in that
    /// order: eight cohorts, present also when empty.
    pub cohorts: Vec<Cohort>,
}

/// The range of a CrUX view asked at `now` (Unix seconds): `[today − 28 days, today)`, UTC
/// midnights.
pub fn range(now: u64) -> (u64, u64) {
    let today = now - now % 86_400;
    (today - u64::from(DAYS) * 86_400, today)
}

/// The view from the query's answer (`rows`, see [`super::crux_days::query`]), for the days from `from`.
pub fn assemble(
    site: &str,
    server: &str,
    (from, to): (u64, u64),
    rows: Vec<sql::Row>,
) -> Result<CruxReport, ReportDataError> {
    let days: Vec<String> = (0..u64::from(DAYS))
        .map(|d| sql::utc(from + d * 86_400)[..10].to_owned())
        .collect();
    let mut found: BTreeMap<(String, String, String), GroupFigures> = BTreeMap::new();
    for row in rows {
        let mut parts = row.grp.splitn(3, '/').map(str::to_owned);
        let key = match (parts.next(), parts.next(), parts.next()) {
            (Some(f), Some(n), Some(d)) => (f, n, d),
            _ => return Err(ReportDataError::CruxGroup(row.grp)),
        };
        found.insert(key, row.figures()?);
    }
    let mut take = |ff: FormFactor, nav: Navigations, day: &str| {
        let key = (
            ff.device_type().to_owned(),
            nav.key().to_owned(),
            day.to_owned(),
        );
        found.remove(&key).unwrap_or_else(|| empty(day))
    };
    let mut cohorts = Vec::new();
    for ff in FormFactor::ALL {
        for nav in Navigations::ALL {
            let whole = take(ff, nav, "all");
            let daily: Vec<GroupFigures> = days.iter().map(|d| take(ff, nav, d)).collect();
            cohorts.push(cohort(ff, nav, whole, &daily));
        }
    }
    Ok(CruxReport {
        site: site.to_owned(),
        from: sql::utc(from),
        to: sql::utc(to),
        days,
        chromium: CHROMIUM.to_vec(),
        server: server.to_owned(),
        cohorts,
    })
}

/// The figures of a group without rows.
fn empty(group: &str) -> GroupFigures {
    GroupFigures {
        group: group.to_owned(),
        measurements: 0,
        page_views: 0.0,
        metrics: Metric::ALL
            .iter()
            .map(|&m| MetricFigures::new(m, 0, 0.0, None, 0.0, 0.0))
            .collect(),
    }
}

/// One cohort from its whole range's figures and its days' figures.
fn cohort(ff: FormFactor, nav: Navigations, whole: GroupFigures, daily: &[GroupFigures]) -> Cohort {
    let trend = Metric::ALL
        .iter()
        .enumerate()
        .map(|(i, &metric)| Trend {
            metric,
            p75: daily.iter().map(|d| d.metrics[i].p75).collect(),
            measured: daily.iter().map(|d| d.metrics[i].measured).collect(),
        })
        .collect();
    Cohort {
        form_factor: ff,
        navigations: nav,
        measurements: whole.measurements,
        page_views: whole.page_views,
        core_web_vitals: Verdict::of(&whole.metrics),
        metrics: whole.metrics,
        trend,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::useragent::parse;

    /// What uap-core makes of real user agents, and whether each is Chromium's.
    #[test]
    fn blink_browsers_are_chromium_and_webkit_and_gecko_are_not() {
        let cases = [
            ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36", true),
            ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36 Edg/131.0.0.0", true),
            ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/70.0.3538.102 Safari/537.36 Edge/18.19582", false),
            ("Mozilla/5.0 (Linux; Android 10; K) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Mobile Safari/537.36", true),
            ("Mozilla/5.0 (Linux; Android 13; SM-S918B) AppleWebKit/537.36 (KHTML, like Gecko) SamsungBrowser/24.0 Chrome/117.0.0.0 Mobile Safari/537.36", true),
            ("Mozilla/5.0 (Linux; Android 13; M2101K6G) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Mobile Safari/537.36 OPR/79.0.0.0", true),
            ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36 OPR/114.0.0.0", true),
            ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 YaBrowser/24.10.0.0 Safari/537.36", true),
            ("Mozilla/5.0 (Linux; Android 14; SM-A546B Build/UP1A.231005.007; wv) AppleWebKit/537.36 (KHTML, like Gecko) Version/4.0 Chrome/125.0.6422.165 Mobile Safari/537.36 [FB_IAB/FB4A;FBAV/468.1.0.56.78;]", true),
            ("Mozilla/5.0 (Linux; Android 14; Pixel 8 Build/UQ1A.240205.004; wv) AppleWebKit/537.36 (KHTML, like Gecko) Version/4.0 Chrome/121.0.6167.178 Mobile Safari/537.36 GSA/15.5.38.28.arm64", true),
            ("Mozilla/5.0 (Linux; Android 13; SM-X200) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36", true),
            ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) CriOS/131.0.6778.73 Mobile/15E148 Safari/604.1", false),
            ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) EdgiOS/131.0.2903.68 Version/17.0 Mobile/15E148 Safari/604.1", false),
            ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148 [FBAN/FBIOS;FBAV/470.0.0.38.109;FBBV/617024452;FBDV/iPhone14,5;FBMD/iPhone;FBSN/iOS;FBSV/17.5;FBSS/3;FBID/phone;FBLC/en_US;FBOP/5;FBRV/620064826]", false),
            ("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Safari/605.1.15", false),
            ("Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0", false),
            ("Mozilla/5.0 (Android 14; Mobile; rv:128.0) Gecko/128.0 Firefox/128.0", false),
        ];
        for (ua, want) in cases {
            let a = parse(ua);
            assert_eq!(
                is_chromium(&a.browser, &a.browser_version, &a.os),
                want,
                "{ua}: {a:?}"
            );
        }
    }

    #[test]
    fn the_sql_rule_is_the_rust_rule() {
        let rule = chromium_filter();
        assert!(
            rule.starts_with("os != 'iOS' AND (browser IN ('Chrome', 'Chrome Mobile', "),
            "{rule}"
        );
        assert!(
            rule.contains(
                "OR (os = 'Android' AND browser IN ('Edge Mobile', 'DuckDuckGo Mobile', 'Facebook'"
            ),
            "{rule}"
        );
        assert!(
            rule.contains(
                " AND NOT (browser = 'Edge' AND toUInt32OrZero(browser_version) BETWEEN 1 AND 78)"
            ),
            "{rule}"
        );
        assert!(
            is_chromium("Edge", "", "Windows"),
            "an unknown version counts"
        );
        assert!(!is_chromium("Edge", "18", "Windows"));
        assert!(!is_chromium("Facebook", "470", "iOS"));
        assert!(!is_chromium("Facebook", "470", "Windows"));
    }

    #[test]
    fn the_range_is_28_complete_utc_days_before_today() {
        // 2026-12-03 12:00:00 UTC.
        let (from, to) = range(1_796_299_200);
        assert_eq!(sql::utc(from), "2026-11-05 00:00:00");
        assert_eq!(sql::utc(to), "2026-12-03 00:00:00");
    }

    /// The verdict: all three good passes; one not good fails; one short of data, none.
    #[test]
    fn a_pass_needs_three_good_p75s_with_enough_data() {
        let figures = |lcp: f64, n: u64| {
            Metric::ALL
                .iter()
                .map(|&m| {
                    let v = if m == Metric::Lcp {
                        lcp
                    } else {
                        m.thresholds().0
                    };
                    MetricFigures::new(m, n, n as f64, Some(v), 0.0, 0.0)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(Verdict::of(&figures(2500.0, 100)), Verdict::Pass);
        assert_eq!(Verdict::of(&figures(2501.0, 100)), Verdict::Fail);
        assert_eq!(Verdict::of(&figures(2000.0, 99)), Verdict::NotEnoughData);
        let mut short_inp = figures(9000.0, 100);
        short_inp[1] = MetricFigures::new(Metric::Inp, 99, 99.0, Some(10.0), 99.0, 0.0);
        assert_eq!(Verdict::of(&short_inp), Verdict::NotEnoughData);
    }

    #[test]
    fn an_answer_without_rows_is_eight_empty_cohorts() {
        let (from, to) = range(1_796_299_200);
        let r = assemble("shop", "http://x", (from, to), vec![]).unwrap();
        assert_eq!(r.cohorts.len(), 8);
        assert_eq!(r.days.len(), 28);
        assert_eq!(r.days[0], "2026-11-05");
        assert_eq!(r.days[27], "2026-12-02");
        for c in &r.cohorts {
            assert_eq!(c.core_web_vitals, Verdict::NotEnoughData);
            assert!(c
                .trend
                .iter()
                .all(|t| t.p75.len() == 28 && t.p75.iter().all(Option::is_none)));
        }
    }
}
