//! The report as a terminal table: a heading, then per group a line with its page views and one
//! aligned row per metric (p75, its rating, the three shares, what they rest on). Columns line
//! up across groups, so that a shop owner compares mobile with desktop down one column.

use super::compare::{Comparison, MetricComparison, SideFigures};
use super::crux::{CruxReport, Trend};
use super::{percent, thousands, Metric, MetricFigures, Report};

/// The column headings of a metric row; numbers are right-aligned, words left-aligned.
const HEADINGS: [&str; 7] = [
    "metric",
    "p75",
    "rating",
    "good",
    "needs improvement",
    "poor",
    "measured",
];
/// Which columns are right-aligned (numbers).
const RIGHT: [bool; 7] = [false, true, false, true, true, true, true];

/// The whole table, lines ending in `\n`.
pub fn render(report: &Report) -> String {
    let mut out = heading(report);
    if report.groups.is_empty() {
        out.push_str(&format!(
            "\nNo page views of {} in these {} days.\n",
            report.site, report.days
        ));
        return out;
    }
    let rows: Vec<Vec<[String; 7]>> = report
        .groups
        .iter()
        .map(|g| metric_rows(&g.metrics))
        .collect();
    let mut widths = HEADINGS.map(str::len);
    for row in rows.iter().flatten() {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for (group, rows) in report.groups.iter().zip(&rows) {
        out.push_str(&format!(
            "\n{}: {} page views ({} measurements)\n",
            report.by.display(&group.group),
            thousands(group.page_views),
            thousands(group.measurements as f64)
        ));
        out.push_str(&line(&HEADINGS.map(str::to_owned), &widths));
        for row in rows {
            out.push_str(&line(row, &widths));
        }
    }
    out
}

/// What the report covers and how to read it.
fn heading(report: &Report) -> String {
    format!(
        "Site {}: the last {} ({} to {} UTC, 5 minutes past now for browsers' clocks that run \
         ahead), by {}\n\
         Page views weighted by 1 / sample_rate; bots left out. p75: the 75th percentile. \
         Shares of the page views that measured the metric; measured: the measurements they \
         rest on (under 100: not enough data, no figures).\n\
         Thresholds (web.dev): LCP 2,500/4,000 ms, INP 200/500 ms, CLS 0.1/0.25, \
         FCP 1,800/3,000 ms, TTFB 800/1,800 ms.\n",
        report.site,
        super::days(report.days),
        report.from,
        report.to,
        report.by
    )
}

/// The cells of one group's metric rows.
fn metric_rows(metrics: &[MetricFigures]) -> Vec<[String; 7]> {
    metrics
        .iter()
        .map(|f| {
            let dash = || "-".to_owned();
            let shares = f.shares().map(|s| s.map(percent));
            let [good, ni, poor] = shares.unwrap_or_else(|| [dash(), dash(), dash()]);
            [
                f.metric.name().to_owned(),
                f.p75.map_or_else(dash, |v| f.metric.format(v)),
                f.missing()
                    .or(f.rating.map(|r| r.label()))
                    .unwrap_or("-")
                    .to_owned(),
                good,
                ni,
                poor,
                thousands(f.measured as f64),
            ]
        })
        .collect()
}

/// One indented line of cells padded to `widths`.
fn line(cells: &[String; 7], widths: &[usize; 7]) -> String {
    let mut out = String::from(" ");
    for (i, cell) in cells.iter().enumerate() {
        let pad = " ".repeat(widths[i] - cell.chars().count());
        out.push_str("  ");
        if RIGHT[i] {
            out.push_str(&pad);
            out.push_str(cell);
        } else {
            out.push_str(cell);
            out.push_str(&pad);
        }
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

/// The CrUX view as a table: per cohort its verdict, then the metric rows as in [`render`]
/// with each metric's daily p75 as a line of 28 bars (`·`: not enough data that day).
pub fn render_crux(report: &CruxReport) -> String {
    let families: Vec<&str> = report.chromium.iter().map(|f| f.name).collect();
    let mut out = format!(
        "Site {}: the CrUX view, the {} complete UTC days {} to {} (from {} to {} UTC)\n\
         Chromium-based browsers only ({}; not on iOS); bots and unknown devices left out; page \
         views weighted by 1 / sample_rate. Core Web Vitals pass when LCP, INP and CLS are each \
         good at p75 (each measured by 100 page views or more). Trend: the p75 per day, oldest \
         first, low to high (·: under 100 measurements that day).\n",
        report.site,
        report.days.len(),
        report.days.first().map_or("", String::as_str),
        report.days.last().map_or("", String::as_str),
        report.from,
        report.to,
        families.join(", "),
    );
    // A cohort without a single page view has not enough data, whatever the engines measure.
    let rows: Vec<Vec<[String; 7]>> = report
        .cohorts
        .iter()
        .map(|c| {
            let mut rows = metric_rows(&c.metrics);
            if c.measurements == 0 {
                rows.iter_mut()
                    .for_each(|r| r[2] = "not enough data".to_owned());
            }
            rows
        })
        .collect();
    let mut widths = HEADINGS.map(str::len);
    for row in rows.iter().flatten() {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for (cohort, rows) in report.cohorts.iter().zip(&rows) {
        out.push_str(&format!(
            "\n{}, {}: Core Web Vitals {}. {} page views ({} measurements)\n",
            cohort.form_factor.label(),
            cohort.navigations.label(),
            cohort.core_web_vitals.label(),
            thousands(cohort.page_views),
            thousands(cohort.measurements as f64)
        ));
        let mut head = line(&HEADINGS.map(str::to_owned), &widths);
        head.insert_str(head.len() - 1, "  trend");
        out.push_str(&head);
        for (row, trend) in rows.iter().zip(&cohort.trend) {
            let mut l = line(row, &widths);
            l.insert_str(l.len() - 1, &format!("  {}", sparkline(trend)));
            out.push_str(&l);
        }
    }
    out
}

/// A trend as one character per day: eight heights between its lowest and highest p75, `·`
/// for a day without enough data.
pub fn sparkline(trend: &Trend) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let known = trend.p75.iter().flatten();
    let lo = known.clone().copied().fold(f64::INFINITY, f64::min);
    let hi = known.copied().fold(f64::NEG_INFINITY, f64::max);
    trend
        .p75
        .iter()
        .map(|p| match p {
            None => '·',
            Some(v) if hi > lo => BARS[(((v - lo) / (hi - lo)) * 7.0).round() as usize],
            Some(_) => BARS[3],
        })
        .collect()
}

/// A p75 and its interval: `2,710 ms [2,650, 2,790]`.
fn estimate_cell(metric: Metric, side: &SideFigures) -> String {
    match &side.estimate {
        Some(e) => format!(
            "{} [{}, {}]",
            metric.format(e.p75),
            bare(metric, e.low),
            bare(metric, e.high)
        ),
        None if side.measured == 0 => "not measured".to_owned(),
        None => format!("not enough data ({})", thousands(side.measured as f64)),
    }
}

/// A value without its unit, as inside an interval: `2,650`, `0.105`.
fn bare(metric: Metric, v: f64) -> String {
    match metric {
        Metric::Cls => format!("{v:.3}"),
        _ => thousands(v.round()),
    }
}

/// A signed value: `+300 ms`, `-0.010`; no sign on what shows as 0.
fn signed(metric: Metric, v: f64) -> String {
    let (text, zero) = match metric {
        Metric::Cls => (format!("{:.3}", v.abs()), (v.abs() * 1000.0).round() == 0.0),
        _ => (
            format!("{} ms", thousands(v.abs().round())),
            v.abs().round() == 0.0,
        ),
    };
    match (zero, v < 0.0) {
        (true, _) => text,
        (false, true) => format!("-{text}"),
        (false, false) => format!("+{text}"),
    }
}

/// The cells of one metric's comparison row.
fn comparison_row(m: &MetricComparison) -> Vec<String> {
    let (diff, verdict) = match &m.difference {
        Some(d) => (
            format!(
                "{} [{}, {}]",
                signed(m.metric, d.difference),
                signed(m.metric, d.low),
                signed(m.metric, d.high)
            ),
            if d.real { "real" } else { "not real" }.to_owned(),
        ),
        None => ("-".to_owned(), "not enough data".to_owned()),
    };
    vec![
        m.metric.name().to_owned(),
        estimate_cell(m.metric, &m.a),
        estimate_cell(m.metric, &m.b),
        diff,
        verdict,
    ]
}

/// A comparison as a table: per metric A's and B's p75 with their intervals, B − A with its
/// interval, and whether the difference is real.
pub fn render_comparison(c: &Comparison) -> String {
    let mut out = format!(
        "Site {}: A = {} against B = {}, page views from {} to {} UTC\n\
         A: {} page views ({} measurements); B: {} page views ({} measurements)\n\
         Page views weighted by 1 / sample_rate; bots left out. Each p75 with its 95 % confidence \
         interval; B - A with its own; real: that interval excludes 0. Under 100 measurements: \
         not enough data.\n\n",
        c.site,
        c.a.name,
        c.b.name,
        c.from,
        c.to,
        thousands(c.a.page_views),
        thousands(c.a.measurements as f64),
        thousands(c.b.page_views),
        thousands(c.b.measurements as f64),
    );
    let mut rows = vec![[
        "metric",
        "A: p75 [95 % CI]",
        "B: p75 [95 % CI]",
        "B - A [95 % CI]",
        "",
    ]
    .map(str::to_owned)
    .to_vec()];
    rows.extend(c.metrics.iter().map(comparison_row));
    let mut widths = [0; 5];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in &rows {
        let mut l = String::from(" ");
        for (cell, w) in row.iter().zip(widths) {
            l.push_str("  ");
            l.push_str(cell);
            l.push_str(&" ".repeat(w - cell.chars().count()));
        }
        out.push_str(l.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::report::{GroupBy, GroupFigures, Metric, MetricFigures};

    /// A report of three groups: one with a hostile browser name, one with a metric not
    /// measured, one of 3 page views (not enough data).
    pub(crate) fn sample() -> Report {
        let group = |name: &str, views: f64| GroupFigures {
            group: name.into(),
            measurements: if name == "small" { 3 } else { 150 },
            page_views: views,
            metrics: Metric::ALL
                .iter()
                .map(|&m| {
                    let (good, poor) = m.thresholds();
                    let mid = Some((good + poor) / 2.0);
                    match name {
                        "" if m == Metric::Cls => MetricFigures::new(m, 0, 0.0, None, 0.0, 0.0),
                        "small" => MetricFigures::new(m, 3, 4.0, mid, 2.0, 1.0),
                        _ => MetricFigures::new(m, 150, 200.0, mid, 100.0, 50.0),
                    }
                })
                .collect(),
        };
        Report {
            site: "shop".into(),
            days: 7,
            by: GroupBy::Browser,
            from: "2026-11-26 12:00:00".into(),
            to: "2026-12-03 12:00:00".into(),
            server: "http://127.0.0.1:8123".into(),
            groups: vec![
                group("<script>alert(1)</script>", 1234.0),
                group("", 200.0),
                group("small", 4.0),
            ],
        }
    }

    #[test]
    fn columns_line_up_across_groups() {
        let text = render(&sample());
        assert!(text.starts_with("Site shop: the last 7 days"), "{text}");
        assert!(
            text.contains("\n<script>alert(1)</script>: 1,234 page views (150 measurements)\n"),
            "{text}"
        );
        assert!(text.contains("\n(unknown): 200 page views"), "{text}");
        let lcp: Vec<&str> = text.lines().filter(|l| l.contains("LCP")).collect();
        assert_eq!(
            lcp.len(),
            4,
            "the thresholds line and a row per group: {text}"
        );
        assert_eq!(
            lcp[1],
            "   LCP     3,250 ms  needs improvement   50%                25%   25%       150"
        );
        // 3 page views: no number but what they are (contract v5 §1).
        assert_eq!(
            lcp[3],
            "   LCP            -  not enough data       -                  -     -         3"
        );
        let cls = text
            .lines()
            .filter(|l| l.trim_start().starts_with("CLS"))
            .nth(1)
            .unwrap();
        assert_eq!(
            cls,
            "   CLS            -  not measured          -                  -     -         0"
        );
        let widths: std::collections::HashSet<usize> = text
            .lines()
            .filter(|l| l.trim_start().starts_with("metric"))
            .map(|l| l.find("rating").unwrap())
            .collect();
        assert_eq!(widths.len(), 1, "one layout for every group: {text}");
    }

    #[test]
    fn a_site_without_page_views_in_the_range_says_so() {
        let report = Report {
            groups: vec![],
            ..sample()
        };
        assert!(render(&report).ends_with("\nNo page views of shop in these 7 days.\n"));
    }

    #[test]
    fn a_trend_is_28_bars_and_a_gap_is_a_dot() {
        let mut p75 = vec![None; 28];
        p75[0] = Some(100.0);
        p75[27] = Some(200.0);
        p75[13] = Some(150.0);
        let t = Trend {
            metric: Metric::Lcp,
            p75,
            measured: vec![0; 28],
        };
        let line = sparkline(&t);
        assert_eq!(line.chars().count(), 28);
        assert!(line.starts_with('▁') && line.ends_with('█'), "{line}");
        assert_eq!(line.chars().nth(13), Some('▅'), "{line}");
        assert_eq!(line.chars().filter(|c| *c == '·').count(), 25);
    }

    #[test]
    fn a_comparison_row_says_whether_the_difference_is_real() {
        use crate::report::compare::{MetricComparison, SideFigures};
        use crate::report::stats::{Difference, Estimate};
        let side = |p75: f64| SideFigures {
            measured: 2000,
            enough_data: true,
            estimate: Some(Estimate {
                p75,
                low: p75 - 50.0,
                high: p75 + 60.0,
            }),
        };
        let m = MetricComparison {
            metric: Metric::Lcp,
            a: side(2500.0),
            b: side(2800.0),
            difference: Some(Difference {
                difference: 300.0,
                low: 210.4,
                high: 389.6,
                real: true,
            }),
        };
        assert_eq!(
            comparison_row(&m),
            [
                "LCP",
                "2,500 ms [2,450, 2,560]",
                "2,800 ms [2,750, 2,860]",
                "+300 ms [+210 ms, +390 ms]",
                "real"
            ]
        );
        let short = MetricComparison {
            a: SideFigures {
                measured: 42,
                enough_data: false,
                estimate: None,
            },
            difference: None,
            ..m
        };
        assert_eq!(comparison_row(&short)[1], "not enough data (42)");
        assert_eq!(comparison_row(&short)[4], "not enough data");
        assert_eq!(signed(Metric::Cls, -0.0004), "0.000");
    }
}
