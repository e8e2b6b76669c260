//! The report as one self-contained HTML page (`--html FILE`): inline CSS and inline SVG, no
//! script, no external style, font or image, so that it opens from a mail attachment or a file
//! share as it was written.
//!
//! Per group, one chart of five bars, one per metric: the shares of page views rated good,
//! needing improvement and poor stacked left to right (web.dev's colours), the thresholds
//! written at the edges between them, and the p75 marked at 75 % of the bar with its value:
//! as on PageSpeed Insights' field data, the mark falls in the segment that rates the p75.
//!
//! Every value that comes from the database or the command line (site key, group names such as
//! browser names, times) goes through [`escape`].

use std::fmt::Write;

use super::compare::{Comparison, MetricComparison};
use super::crux::{CruxReport, Trend, Verdict};
use super::{percent, thousands, GroupFigures, MetricFigures, Rating, Report};

/// Where a bar starts and how wide it is, in SVG user units.
const BAR_X: f64 = 120.0;
const BAR_W: f64 = 460.0;
/// The height of one metric's row and of its bar.
const ROW_H: f64 = 52.0;
/// The height of one metric's row in a comparison: two bars, then the difference under them.
const COMPARE_ROW_H: f64 = 62.0;
const BAR_H: f64 = 20.0;
/// The chart's width.
const WIDTH: f64 = 780.0;

/// `s` with `&`, `<`, `>`, `"` and `'` as character references: safe as text and as a
/// quoted attribute value.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The fill of a rating's segment (web.dev's and Lighthouse's colours).
fn fill(rating: Rating) -> &'static str {
    match rating {
        Rating::Good => "#0cce6b",
        Rating::NeedsImprovement => "#ffa400",
        Rating::Poor => "#ff4e42",
    }
}

/// A darker shade of a rating's colour, for text on white.
fn ink(rating: Rating) -> &'static str {
    match rating {
        Rating::Good => "#08773f",
        Rating::NeedsImprovement => "#a35f00",
        Rating::Poor => "#c5221f",
    }
}

/// The page.
pub fn render(report: &Report) -> String {
    let site = escape(&report.site);
    let mut page = format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{site}: the last {days}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <h1>{site}: the last {days}</h1>\n\
         <p class=\"sub\">{from} to {to} UTC (5 minutes past now for browsers' clocks that run ahead), by {by}. Page views weighted by 1&#8202;/&#8202;sample_rate; \
         bots left out. Answered by {server}.</p>\n{legend}",
        days = super::days(report.days),
        from = escape(&report.from),
        to = escape(&report.to),
        by = escape(&report.by.to_string()),
        server = escape(&report.server),
        legend = legend(),
    );
    if report.groups.is_empty() {
        let _ = writeln!(page, "<p>No page views of {site} in these days.</p>");
    }
    for group in &report.groups {
        page.push_str(&section(report, group));
    }
    page.push_str(
        "<footer>Thresholds: web.dev, https://web.dev/articles/vitals (LCP, INP, CLS) and \
         https://web.dev/articles/fcp, https://web.dev/articles/ttfb. A value is good at or \
         below the first threshold and poor above the second. p75: the 75th percentile of the \
         page views that measured the metric; a metric measured by fewer than 100 page views \
         shows no figures (not enough data).</footer>\n</body>\n</html>\n",
    );
    page
}

/// The page's only style.
const STYLE: &str = "body{font:15px/1.4 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;\
color:#202124;margin:24px auto;max-width:820px;padding:0 16px}h1{font-size:22px;margin:0 0 4px}\
h2{font-size:17px;margin:28px 0 4px}h2 small{font-weight:normal;color:#5f6368}\
.sub,footer{color:#5f6368;font-size:13px}.legend span{display:inline-block;width:12px;\
height:12px;border-radius:2px;margin:0 4px 0 14px;vertical-align:-1px}\
footer{margin-top:32px;border-top:1px solid #dadce0;padding-top:8px}svg{display:block}\
.verdict{font-size:13px;font-weight:600;padding:2px 8px;border-radius:10px;margin-left:6px}\
.pass{background:#e6f4ea;color:#08773f}.fail{background:#fce8e6;color:#c5221f}\
.none{background:#f1f3f4;color:#5f6368}";

/// The colour key.
fn legend() -> String {
    let mut out = String::from("<p class=\"legend\">");
    for r in [Rating::Good, Rating::NeedsImprovement, Rating::Poor] {
        let _ = write!(
            out,
            "<span style=\"background:{}\"></span>{}",
            fill(r),
            r.label()
        );
    }
    out.push_str(" &#9660; p75</p>\n");
    out
}

/// One group: its heading and its chart.
fn section(report: &Report, group: &GroupFigures) -> String {
    let name = escape(&report.by.display(&group.group));
    let heading = format!(
        "{name} <small>{} page views ({} measurements)</small>",
        thousands(group.page_views),
        thousands(group.measurements as f64),
    );
    format!(
        "<section>\n<h2>{heading}</h2>\n{}</section>\n",
        chart(&name, &group.metrics)
    )
}

/// The chart of a group's metrics (`name` already escaped), one bar per metric.
fn chart(name: &str, metrics: &[MetricFigures]) -> String {
    let height = ROW_H * metrics.len() as f64 + 8.0;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         viewBox=\"0 0 {WIDTH} {height}\" role=\"img\" aria-label=\"{name}: shares and p75 per metric\" \
         font-family=\"system-ui,sans-serif\" font-size=\"12\">\n",
    );
    for (i, figures) in metrics.iter().enumerate() {
        out.push_str(&metric_row(figures, 8.0 + ROW_H * i as f64));
    }
    out.push_str("</svg>\n");
    out
}

/// The head of a page and its heading, `title` and `sub` already escaped.
fn page_head(title: &str, sub: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{title}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <h1>{title}</h1>\n<p class=\"sub\">{sub}</p>\n",
    )
}

/// The CrUX view as a page: per cohort its verdict, its chart and its daily trend.
pub fn render_crux(report: &CruxReport) -> String {
    let families: Vec<String> = report.chromium.iter().map(|f| escape(f.name)).collect();
    let mut page = page_head(
        &format!("{}: the CrUX view", escape(&report.site)),
        &format!(
            "The {} complete UTC days {} to {}. Chromium-based browsers only ({}; not on iOS); \
             bots and unknown devices left out; page views weighted by 1&#8202;/&#8202;sample_rate. \
             Answered by {}.",
            report.days.len(),
            escape(report.days.first().map_or("", String::as_str)),
            escape(report.days.last().map_or("", String::as_str)),
            families.join(", "),
            escape(&report.server),
        ),
    );
    page.push_str(&legend());
    for c in &report.cohorts {
        let name = format!("{}, {}", c.form_factor.label(), c.navigations.label());
        let _ = write!(
            page,
            "<section>\n<h2>{name} <span class=\"verdict {}\">Core Web Vitals: {}</span> \
             <small>{} page views ({} measurements)</small></h2>\n{}{}</section>\n",
            verdict_class(c.core_web_vitals),
            c.core_web_vitals.label(),
            thousands(c.page_views),
            thousands(c.measurements as f64),
            chart(&name, &c.metrics),
            trend_chart(&name, &report.days, &c.trend),
        );
    }
    page.push_str(
        "<footer>As CrUX reports field data: a cohort passes Core Web Vitals when LCP, INP and \
         CLS are each good at p75, and a pass needs each measured by at least 100 page views. \
         Trend: each metric's p75 per day; a gap is a day under 100 measurements. Thresholds: \
         web.dev, https://web.dev/articles/vitals.</footer>\n</body>\n</html>\n",
    );
    page
}

/// The class of a verdict's badge.
fn verdict_class(v: Verdict) -> &'static str {
    match v {
        Verdict::Pass => "pass",
        Verdict::Fail => "fail",
        Verdict::NotEnoughData => "none",
    }
}

/// A cohort's daily p75s: per metric a line over the days (broken where a day has not enough
/// data), its lowest and highest p75 written beside it.
fn trend_chart(name: &str, days: &[String], trend: &[Trend]) -> String {
    let height = TREND_ROW * trend.len() as f64 + 24.0;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         viewBox=\"0 0 {WIDTH} {height}\" role=\"img\" aria-label=\"{name}: p75 per day\" \
         font-family=\"system-ui,sans-serif\" font-size=\"11\">\n\
         <text x=\"0\" y=\"12\" fill=\"#5f6368\">p75 per day</text>\
         <text x=\"{BAR_X}\" y=\"12\" fill=\"#5f6368\">{}</text>\
         <text x=\"{:.1}\" y=\"12\" fill=\"#5f6368\" text-anchor=\"end\">{}</text>\n",
        escape(days.first().map_or("", String::as_str)),
        BAR_X + BAR_W,
        escape(days.last().map_or("", String::as_str)),
    );
    for (i, t) in trend.iter().enumerate() {
        out.push_str(&trend_line(days, t, 20.0 + TREND_ROW * i as f64));
    }
    out.push_str("</svg>\n");
    out
}

/// The height of one metric's row of a trend chart, and of its band.
const TREND_ROW: f64 = 36.0;
const TREND_H: f64 = 26.0;

/// One metric's daily p75s, its band's top at `top`: a line broken where a day has not enough
/// data, a dot per day coloured by its rating, its lowest and highest p75 beside it.
fn trend_line(days: &[String], t: &Trend, top: f64) -> String {
    let step = BAR_W / (days.len().max(2) - 1) as f64;
    let mut out = format!(
        "<text x=\"0\" y=\"{:.1}\" font-weight=\"600\">{}</text>\
         <rect x=\"{BAR_X}\" y=\"{top:.1}\" width=\"{BAR_W}\" height=\"{TREND_H}\" fill=\"#f8f9fa\"/>",
        top + 17.0,
        t.metric.name()
    );
    let known: Vec<f64> = t.p75.iter().flatten().copied().collect();
    if known.is_empty() {
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#5f6368\">not enough data on any day</text>",
            BAR_X + 8.0,
            top + 17.0
        );
        return out;
    }
    let lo = known.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = known.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let y = |v: f64| {
        let frac = if hi > lo { (v - lo) / (hi - lo) } else { 0.5 };
        top + TREND_H - 3.0 - frac * (TREND_H - 6.0)
    };
    let mut path = String::new();
    let mut pen_down = false;
    for (d, p) in t.p75.iter().enumerate() {
        let Some(v) = p else {
            pen_down = false;
            continue;
        };
        let (x, y) = (BAR_X + step * d as f64, y(*v));
        let _ = write!(path, "{}{x:.1} {y:.1}", if pen_down { "L" } else { "M" });
        pen_down = true;
        let _ = write!(
            out,
            "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"2\" fill=\"{}\"><title>{}: {}</title></circle>",
            fill(t.metric.rate(*v)),
            escape(&days[d]),
            escape(&t.metric.format(*v))
        );
    }
    let _ = writeln!(
        out,
        "<path d=\"{path}\" fill=\"none\" stroke=\"#5f6368\" stroke-width=\"1.5\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\" fill=\"#5f6368\">{} to {}</text>",
        BAR_X + BAR_W + 16.0,
        top + 17.0,
        escape(&t.metric.format(lo)),
        escape(&t.metric.format(hi))
    );
    out
}

/// A comparison as a page: per metric both p75s with their intervals drawn on one scale, and
/// the difference with its interval.
pub fn render_comparison(c: &Comparison) -> String {
    let mut page = page_head(
        &format!("{}: {} against {}", escape(&c.site), escape(&c.a.name), escape(&c.b.name)),
        &format!(
            "Page views from {} to {} UTC; A: {} page views ({} measurements), B: {} page views \
             ({} measurements). Weighted by 1&#8202;/&#8202;sample_rate; bots left out. Answered by {}.",
            escape(&c.from),
            escape(&c.to),
            thousands(c.a.page_views),
            thousands(c.a.measurements as f64),
            thousands(c.b.page_views),
            thousands(c.b.measurements as f64),
            escape(&c.server),
        ),
    );
    let height = COMPARE_ROW_H * c.metrics.len() as f64 + 8.0;
    let _ = writeln!(
        page,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         viewBox=\"0 0 {WIDTH} {height}\" role=\"img\" aria-label=\"p75 of A and B with 95 % intervals\" \
         font-family=\"system-ui,sans-serif\" font-size=\"12\">"
    );
    for (i, m) in c.metrics.iter().enumerate() {
        page.push_str(&comparison_row(m, 8.0 + COMPARE_ROW_H * i as f64));
    }
    page.push_str(
        "</svg>\n<footer>Each p75 with its 95 % confidence interval (the weighted order-statistic \
         interval); the difference B &#8722; A with its own 95 % interval, real when that interval \
         excludes 0. A side measured by fewer than 100 page views shows no figures (not enough \
         data).</footer>\n</body>\n</html>\n",
    );
    page
}

/// One metric of a comparison, its top at `y`: A and B as dots with their intervals on one
/// scale, and the difference written beside them.
fn comparison_row(m: &MetricComparison, y: f64) -> String {
    let mut out = format!(
        "<text x=\"0\" y=\"{:.1}\" font-size=\"14\" font-weight=\"600\">{}</text>",
        y + 14.0,
        m.metric.name()
    );
    let sides = [("A", &m.a, "#1a73e8"), ("B", &m.b, "#e8710a")];
    let ends: Vec<f64> = sides
        .iter()
        .filter_map(|s| s.1.estimate)
        .flat_map(|e| [e.low, e.high])
        .collect();
    let lo = ends.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = ends.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let x = |v: f64| {
        BAR_X
            + if hi > lo {
                (v - lo) / (hi - lo) * BAR_W
            } else {
                BAR_W / 2.0
            }
    };
    for (k, (label, side, colour)) in sides.iter().enumerate() {
        let row_y = y + 8.0 + 16.0 * k as f64;
        match side.estimate {
            Some(e) => {
                let _ = write!(
                    out,
                    "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"{colour}\">{label}</text>\
                     <path d=\"M{:.1} {row_y:.1}H{:.1}\" stroke=\"{colour}\" stroke-width=\"2\"/>\
                     <circle cx=\"{:.1}\" cy=\"{row_y:.1}\" r=\"4\" fill=\"{colour}\"><title>{label}: p75 {}, 95 % CI {} to {}</title></circle>",
                    BAR_X - 14.0,
                    row_y + 4.0,
                    x(e.low),
                    x(e.high),
                    x(e.p75),
                    escape(&m.metric.format(e.p75)),
                    escape(&m.metric.format(e.low)),
                    escape(&m.metric.format(e.high)),
                );
            }
            None => {
                let _ = write!(
                    out,
                    "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#5f6368\">{label}: {}</text>",
                    BAR_X,
                    row_y + 4.0,
                    if side.measured == 0 {
                        "not measured"
                    } else {
                        "not enough data"
                    }
                );
            }
        }
    }
    let text = match &m.difference {
        Some(d) => format!(
            "B &#8722; A {} ({} to {}): {}",
            escape(&signed(m, d.difference)),
            escape(&signed(m, d.low)),
            escape(&signed(m, d.high)),
            if d.real { "real" } else { "not real" }
        ),
        None => "not enough data".to_owned(),
    };
    // Under the two bars, from where they start: to their right it would run past the chart's
    // width ("B − A +853 ms (+781 ms to +926 ms): real" is about 300 px).
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" font-weight=\"600\">{text}</text>",
        BAR_X,
        y + 46.0
    );
    out
}

/// A difference with its sign, in the metric's unit.
fn signed(m: &MetricComparison, v: f64) -> String {
    let text = m.metric.format(v.abs());
    if v < 0.0 && text.chars().any(|c| c.is_ascii_digit() && c != '0') {
        format!("-{text}")
    } else if v > 0.0 && text.chars().any(|c| c.is_ascii_digit() && c != '0') {
        format!("+{text}")
    } else {
        text
    }
}

/// One metric's row of the chart, its top at `y`.
fn metric_row(f: &MetricFigures, y: f64) -> String {
    let mut out = format!(
        "<text x=\"0\" y=\"{:.1}\" font-size=\"14\" font-weight=\"600\">{}</text>\
         <text x=\"0\" y=\"{:.1}\" fill=\"#5f6368\">{} measured</text>\n",
        y + 14.0,
        f.metric.name(),
        y + 30.0,
        thousands(f.measured as f64)
    );
    let (Some(shares), Some(p75), Some(rating)) = (f.shares(), f.p75, f.rating) else {
        let _ = writeln!(
            out,
            "<rect x=\"{BAR_X}\" y=\"{:.1}\" width=\"{BAR_W}\" height=\"{BAR_H}\" fill=\"#f1f3f4\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" fill=\"#5f6368\">{}</text>",
            y + 2.0,
            BAR_X + 8.0,
            y + 16.0,
            f.missing().unwrap_or("not measured")
        );
        return out;
    };
    out.push_str(&bar(f, shares, y));
    // The p75 at 75 % of the bar: the share left of it is the three quarters below the p75.
    let x = BAR_X + 0.75 * BAR_W;
    let _ = writeln!(
        out,
        "<path d=\"M{x:.1} {:.1}v{:.1}M{:.1} {:.1}h10l-5 7z\" stroke=\"#202124\" stroke-width=\"2\" fill=\"#202124\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"14\" font-weight=\"600\" fill=\"{}\">p75 {}</text>\
         <text x=\"{:.1}\" y=\"{:.1}\" fill=\"{}\">{}</text>",
        y,
        BAR_H + 4.0,
        x - 5.0,
        y - 6.0,
        BAR_X + BAR_W + 16.0,
        y + 14.0,
        ink(rating),
        escape(&f.metric.format(p75)),
        BAR_X + BAR_W + 16.0,
        y + 30.0,
        ink(rating),
        rating.label()
    );
    out
}

/// The stacked bar of the three shares, with each share in its segment where it fits and the
/// thresholds under the edges between the segments.
fn bar(f: &MetricFigures, shares: [f64; 3], y: f64) -> String {
    let ratings = [Rating::Good, Rating::NeedsImprovement, Rating::Poor];
    let mut out = String::new();
    let mut x = BAR_X;
    let mut edges = Vec::new();
    for (share, rating) in shares.into_iter().zip(ratings) {
        let w = share * BAR_W;
        let _ = write!(
            out,
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{w:.1}\" height=\"{BAR_H}\" fill=\"{}\"><title>{}: {}</title></rect>",
            y + 2.0,
            fill(rating),
            rating.label(),
            percent(share)
        );
        if w >= 34.0 {
            // Centred in its segment, unless the p75's mark would cross it: then beside it.
            let mark = BAR_X + 0.75 * BAR_W;
            let centre = x + w / 2.0;
            let label_x = if (centre - mark).abs() >= 18.0 {
                centre
            } else if mark - x >= 36.0 {
                mark - 18.0
            } else {
                mark + 18.0
            };
            let _ = write!(
                out,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#202124\">{}</text>",
                label_x,
                y + 16.0,
                percent(share)
            );
        }
        x += w;
        edges.push(x);
    }
    let (good, poor) = f.metric.thresholds();
    // Under their edges, but never on each other: "≤ good" ends at least 70 before the bar's
    // end, "> poor" begins at least 10 after it (both 100 % good: found by a newcomer).
    let good_x = edges[0].clamp(BAR_X + 60.0, BAR_X + BAR_W - 70.0);
    let poor_x = edges[1].min(BAR_X + BAR_W - 60.0).max(good_x + 10.0);
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#5f6368\" font-size=\"11\">\u{2264} {}</text>\
         <text x=\"{:.1}\" y=\"{:.1}\" fill=\"#5f6368\" font-size=\"11\">&gt; {}</text>",
        good_x,
        y + BAR_H + 16.0,
        f.metric.format(good),
        poor_x,
        y + BAR_H + 16.0,
        f.metric.format(poor)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::table::tests::sample;

    #[test]
    fn escape_makes_markup_text() {
        assert_eq!(
            escape(r#"<script>alert("x&'y")</script>"#),
            "&lt;script&gt;alert(&quot;x&amp;&#39;y&quot;)&lt;/script&gt;"
        );
    }

    #[test]
    fn a_hostile_group_name_is_text_and_the_page_loads_nothing() {
        let page = render(&sample());
        assert!(!page.contains("<script"), "{page}");
        assert!(
            page.contains("<h2>&lt;script&gt;alert(1)&lt;/script&gt; <small>1,234 page views"),
            "{page}"
        );
        assert!(page.contains("aria-label=\"&lt;script&gt;alert(1)&lt;/script&gt;: shares"));
        for attr in ["src=", "href=", "url(", "@import", "<link", "<img"] {
            assert!(!page.contains(attr), "{attr} in {page}");
        }
        assert_eq!(page.matches("<svg ").count(), 3);
        assert!(page.contains(">p75 3,250 ms</text>"), "{page}");
        assert!(page.contains(">not measured</text>"), "{page}");
        // The group of 3 page views: no number, five times (contract v5 §1).
        assert_eq!(page.matches(">not enough data</text>").count(), 5, "{page}");
        assert!(page.contains("&gt; 4,000 ms</text>"), "{page}");
    }

    #[test]
    fn the_segments_are_as_wide_as_the_shares() {
        let page = render(&sample());
        // 50 %, 25 %, 25 % of the bar.
        assert!(page.contains(&format!(
            "width=\"{:.1}\" height=\"{BAR_H}\" fill=\"#0cce6b\"",
            BAR_W / 2.0
        )));
        assert!(page.contains(&format!(
            "width=\"{:.1}\" height=\"{BAR_H}\" fill=\"#ff4e42\"",
            BAR_W / 4.0
        )));
    }

    /// A CrUX page of a site with a hostile name: escaped, eight cohorts with a chart and a
    /// trend each, a verdict badge, nothing loaded.
    #[test]
    fn the_crux_page_is_self_contained_and_escaped() {
        let mut r = crate::report::crux::assemble("x<b>", "s", (0, 28 * 86_400), vec![]).unwrap();
        r.cohorts[0].trend[0].p75[3] = Some(2000.0);
        r.cohorts[0].trend[0].p75[4] = Some(3000.0);
        let page = render_crux(&r);
        assert!(
            page.contains("<h1>x&lt;b&gt;: the CrUX view</h1>"),
            "{page}"
        );
        assert_eq!(page.matches("<svg ").count(), 16);
        assert_eq!(page.matches("class=\"verdict none\"").count(), 8);
        assert!(
            page.contains("<title>1970-01-04: 2,000 ms</title>"),
            "{page}"
        );
        assert!(page.contains(">2,000 ms to 3,000 ms</text>"), "{page}");
        for attr in [
            "src=", "href=", "url(", "@import", "<link", "<img", "<script",
        ] {
            assert!(!page.contains(attr), "{attr}");
        }
    }
}
