//! The dashboard's and the alerts' queries: PromQL read, and every series they query exported
//! by a fresh collector.

use super::*;

#[test]
fn selectors_and_samples_are_read_and_matched() {
    let expr = r#"sum(rate(collector_http_requests_total{route="/api/v1/measurements", status=~"5..", job="collector"}[5m])) / sum(rate(collector_http_requests_total[5m]))"#;
    let found = selectors(expr, "collector_http_requests_total");
    assert_eq!(found.len(), 2);
    assert_eq!(found[1], vec![]);
    let s = samples("# TYPE x counter\ncollector_http_requests_total{route=\"/api/v1/measurements\",status=\"503\"} 0\nplain 1\n");
    assert_eq!(s.len(), 2);
    assert!(satisfies(&s[0].1, &found[0]));
    assert!(!satisfies(&s[1].1, &found[0]));
    let ok = [("status".to_owned(), "202".to_owned())];
    assert!(!satisfies(
        &ok,
        &[("status".into(), "=~".into(), "5..".into())]
    ));
}

#[test]
fn metric_names_are_read_from_promql() {
    let names = metric_names(
        "histogram_quantile(0.99, sum by (le) (rate(a_bucket{route=\"/x\", i=~\"$instance\"}[$__rate_interval]))) \
         / on (instance) group_left (replica) b_total > bool 0.5 and up{job='c'} offset 5m",
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["a_bucket", "b_total", "up"]
    );
}

#[tokio::test]
async fn dashboard_queries_name_metrics_the_collector_exports() {
    let stack = Stack::shared();
    let env = TestEnv::new(stack).await;
    let collector = env.collector(&[]).await;
    // One request, so that the labelled families are not all empty (they are checked by
    // their `# TYPE` line either way).
    let (_, m) = measurement(&env.site);
    assert_eq!(collector.post_json(&m).await.0, 202);
    let exported = exported_series(&metrics_text(&collector).await);
    assert!(
        exported.contains("collector_spool_oldest_record_age_seconds"),
        "{exported:?}"
    );
    let queries = dashboard_queries();
    assert!(queries.len() >= 10, "{queries:?}");
    let mut missing = Vec::new();
    for (panel, expr) in &queries {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "panel {panel:?}: no metric in {expr}");
        for name in names {
            // `up` is made by Prometheus for every target, not by the collector.
            if name != "up" && !exported.contains(&name) {
                missing.push(format!("{panel}: {name}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "dashboard metrics not in /metrics: {missing:?}\nexported: {exported:?}"
    );
}

/// Every `expr` of `deploy/prometheus/alerts.yml` (one-line or `|` blocks): (alert, expression).
fn alert_expressions() -> Vec<(String, String)> {
    let path = root().join("deploy/prometheus/alerts.yml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let lines: Vec<&str> = text.lines().collect();
    let (mut out, mut alert) = (Vec::new(), String::new());
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        if let Some(name) = trimmed.strip_prefix("- alert:") {
            alert = name.trim().to_owned();
        }
        let Some(rest) = trimmed.strip_prefix("expr:") else {
            continue;
        };
        let indent = line.len() - trimmed.len();
        let expr = if rest.trim() == "|" {
            lines[i + 1..]
                .iter()
                .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
                .map(|l| l.trim())
                .collect::<Vec<_>>()
                .join(" ")
        } else {
            rest.trim().to_owned()
        };
        out.push((alert.clone(), expr));
    }
    out
}

/// The samples of a `/metrics` text: (name, labels). Not its `# TYPE` lines: a family
/// without a series shows nothing to a query.
fn samples(text: &str) -> Vec<(String, Vec<(String, String)>)> {
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let name_end = line.find(['{', ' ']).expect("a sample line has a value");
        let mut labels = Vec::new();
        if line[name_end..].starts_with('{') {
            let body = &line[name_end + 1..line.rfind('}').expect("labels end with }")];
            for pair in body.split("\",") {
                let (k, v) = pair.split_once("=\"").expect("label=\"value\"");
                labels.push((k.to_owned(), v.trim_end_matches('"').to_owned()));
            }
        }
        out.push((line[..name_end].to_owned(), labels));
    }
    out
}

/// The label matchers that follow `name` in `expr` (each `name{...}`; an empty list for a
/// bare `name`): (label, operator, value). Matchers on `job` and `instance` (added by
/// Prometheus) and on Grafana variables are left out.
fn selectors(expr: &str, name: &str) -> Vec<Vec<(String, String, String)>> {
    let matcher = regex::Regex::new(r#"(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)""#).unwrap();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = expr[from..].find(name).map(|i| i + from) {
        from = i + name.len();
        let before = expr[..i].chars().last();
        let after = expr[from..].chars().next();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_')
            || after.is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let mut list = Vec::new();
        if after == Some('{') {
            let end = from + expr[from..].find('}').expect("a selector ends with }");
            for c in matcher.captures_iter(&expr[from..end]) {
                let (k, op, v) = (&c[1], &c[2], &c[3]);
                if k != "job" && k != "instance" && !v.contains('$') {
                    list.push((k.to_owned(), op.to_owned(), v.to_owned()));
                }
            }
        }
        out.push(list);
    }
    out
}

/// Whether a sample's labels satisfy every matcher (PromQL: regular expressions are anchored).
fn satisfies(labels: &[(String, String)], matchers: &[(String, String, String)]) -> bool {
    matchers.iter().all(|(k, op, v)| {
        let got = labels
            .iter()
            .find(|(l, _)| l == k)
            .map_or("", |(_, x)| x.as_str());
        let re = || regex::Regex::new(&format!("^(?:{v})$")).expect("a PromQL regex");
        match op.as_str() {
            "=" => got == v,
            "!=" => got != v,
            "=~" => re().is_match(got),
            "!~" => !re().is_match(got),
            _ => unreachable!(),
        }
    })
}

/// A collector that has received nothing yet exports a series of every metric the dashboard
/// and the alerts query (labelled families with their known label values at 0), so a quiet or
/// fresh collector's panels show 0, not "no data".
#[tokio::test]
async fn a_fresh_collector_exports_every_series_the_dashboard_and_alerts_query() {
    let env = TestEnv::new(Stack::shared()).await;
    let collector = env.collector(&[]).await;
    let samples = samples(&metrics_text(&collector).await);
    let alerts = alert_expressions();
    assert!(alerts.len() >= 10, "{alerts:?}");
    let mut missing = Vec::new();
    let mut checked = 0;
    for (place, expr) in dashboard_queries().into_iter().chain(alerts) {
        for name in metric_names(&expr) {
            // `up` is made by Prometheus for every target, not by the collector.
            if name == "up" {
                continue;
            }
            let found = selectors(&expr, &name);
            assert!(
                !found.is_empty(),
                "{place}: {name} not found again in {expr}"
            );
            for matchers in found {
                checked += 1;
                if !samples
                    .iter()
                    .any(|(n, labels)| *n == name && satisfies(labels, &matchers))
                {
                    missing.push(format!("{place}: {name}{matchers:?}"));
                }
            }
        }
    }
    assert!(checked >= 20, "only {checked} selectors checked");
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "queried but without a series on a fresh collector: {missing:?}"
    );
}
