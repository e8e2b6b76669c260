//! The report as a terminal table: a heading, then per group a line with its page views and one
//! aligned row per metric (p75, its rating, the three shares, what they rest on). Columns line
//! up across groups, so that a shop owner compares mobile with desktop down one column.

use super::{percent, thousands, Report};

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
    let rows: Vec<Vec<[String; 7]>> = report.groups.iter().map(metric_rows).collect();
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
        "Site {}: the last {} ({} to {} UTC), by {}\n\
         Page views weighted by 1 / sample_rate; bots left out. p75: the 75th percentile. \
         Shares of the page views that measured the metric; measured: the measurements they \
         rest on (under 100: not enough data, no figures).\n\
         Thresholds (web.dev): LCP 2,500/4,000 ms, INP 200/500 ms, CLS 0.1/0.25, \
         FCP 1,800/3,000 ms, TTFB 800/1,800 ms.\n",
        report.site,
        super::days(report.days),
        report.from,
        report.to,
        report.by.column()
    )
}

/// The cells of one group's metric rows.
fn metric_rows(group: &super::GroupFigures) -> Vec<[String; 7]> {
    group
        .metrics
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
}
