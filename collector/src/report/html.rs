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

use super::{percent, thousands, GroupFigures, MetricFigures, Rating, Report};

/// Where a bar starts and how wide it is, in SVG user units.
const BAR_X: f64 = 120.0;
const BAR_W: f64 = 460.0;
/// The height of one metric's row and of its bar.
const ROW_H: f64 = 52.0;
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
         <p class=\"sub\">{from} to {to} UTC, by {by}. Page views weighted by 1&#8202;/&#8202;sample_rate; \
         bots left out. Answered by {server}.</p>\n{legend}",
        days = super::days(report.days),
        from = escape(&report.from),
        to = escape(&report.to),
        by = escape(report.by.column()),
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
footer{margin-top:32px;border-top:1px solid #dadce0;padding-top:8px}svg{display:block}";

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
    let height = ROW_H * group.metrics.len() as f64 + 8.0;
    let mut out = format!(
        "<section>\n<h2>{name} <small>{} page views ({} measurements)</small></h2>\n\
         <svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         viewBox=\"0 0 {WIDTH} {height}\" role=\"img\" aria-label=\"{name}: shares and p75 per metric\" \
         font-family=\"system-ui,sans-serif\" font-size=\"12\">\n",
        thousands(group.page_views),
        thousands(group.measurements as f64),
    );
    for (i, figures) in group.metrics.iter().enumerate() {
        out.push_str(&metric_row(figures, 8.0 + ROW_H * i as f64));
    }
    out.push_str("</svg>\n</section>\n");
    out
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
}
