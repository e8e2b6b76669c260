//! Observability: a real Prometheus scraping a real collector, and the Grafana dashboard
//! checked against what the collector exports.
//!
//! - `prometheus_scrapes_the_collector_and_alerts_on_no_healthy_replica`: Debian's Prometheus
//!   (2.42) runs with `deploy/prometheus/prometheus.yml` and `deploy/prometheus/alerts.yml`
//!   against a collector on a private stack; through Prometheus's HTTP API the test sees the
//!   target up, every rule evaluating without error and nothing pending on a healthy collector,
//!   `CollectorNoHealthyReplica` firing after every ClickHouse replica is stopped and resolving
//!   after they return, and `CollectorDown` firing once the collector is gone. Only the scrape
//!   target and the scrape/evaluation intervals (15 s to 1 s) differ from the deployed config;
//!   the rules, their `for` durations included, are the deployed file unchanged, so the test
//!   waits out the real minute of each alert.
//! - `dashboard_queries_name_metrics_the_collector_exports`: `deploy/grafana/collector.json` is
//!   valid JSON and every metric its queries name is in `/metrics` of a running collector.
//!   (Grafana itself is not packaged for Debian 12, so the dashboard is checked statically;
//!   the scrape test also runs every dashboard query through the real Prometheus.)

use collector_tests::common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

mod alerts;
mod queries;

/// The test's Prometheus: scrape and evaluation intervals, and the scrape timeout (the deployed
/// 15 s, 15 s and 10 s made 1 s so that the test waits out an alert's `for` and little more).
const SCRAPE_INTERVAL: Duration = Duration::from_secs(1);
const EVALUATION_INTERVAL: Duration = Duration::from_secs(1);
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(1);
/// How far Prometheus moves a scrape's timestamp to its schedule (`scrape.timestamp-tolerance`,
/// 2 ms in 2.42; applied when the interval exceeds 100 times it).
const SCRAPE_TIMESTAMP_ALIGNMENT: Duration = Duration::from_millis(2);

/// How much earlier than `for` after the change a `for` alert can fire, measured from an
/// instant taken before the change was made: the first sample that shows the change is
/// stamped with the start of its scrape, which may have begun up to [`SCRAPE_TIMEOUT`] before
/// the change (a scrape in flight when the collector was killed fails then; one in flight
/// when a replica state changed reads the new value), moved up to
/// [`SCRAPE_TIMESTAMP_ALIGNMENT`] onto its schedule. The evaluation that sets the alert
/// pending is stamped no earlier than the samples it sees (a query at `t` reads samples at or
/// before `t`), and the alert fires at the first evaluation stamped `for` after that one: the
/// [`EVALUATION_INTERVAL`] and the [`SCRAPE_INTERVAL`] only make it later.
const FIRE_EARLY_TOLERANCE: Duration = SCRAPE_TIMEOUT.saturating_add(SCRAPE_TIMESTAMP_ALIGNMENT);

/// Asserts that alert `name` with `for: held_for` fired no earlier than its `for` allows,
/// `elapsed` after an instant taken before the change that raised it.
fn assert_fired_after_its_for(name: &str, held_for: Duration, elapsed: Duration) {
    let bound = held_for.saturating_sub(FIRE_EARLY_TOLERANCE);
    assert!(
        elapsed >= bound,
        "{name} fired {elapsed:?} after the change: before its `for: {held_for:?}` allows, \
         which is {bound:?} (the `for` less {FIRE_EARLY_TOLERANCE:?}: a scrape timeout of \
         {SCRAPE_TIMEOUT:?}, since the first sample is stamped with its scrape's start, and \
         {SCRAPE_TIMESTAMP_ALIGNMENT:?} of timestamp alignment; scrape and evaluation every \
         {SCRAPE_INTERVAL:?} and {EVALUATION_INTERVAL:?} only delay it)"
    );
}

/// How long a series expected from a healthy scrape may take to appear in Prometheus.
const SERIES: Duration = Duration::from_secs(30);

/// Debian's `prometheus` on a free loopback port with its data in a temporary folder, using
/// the deployed configuration with the overrides named in the module doc. Stopped on drop.
struct Prometheus {
    child: Child,
    url: String,
    /// Its configuration, data and log (removed on drop).
    _dir: tempfile::TempDir,
    /// The test's report for a wait that gives up (Prometheus's log is registered with it).
    diag: Diag,
}

/// `text` with the one occurrence of `from` replaced by `to`; panics when `from` does not occur
/// exactly once (the deployed file changed shape: update this test with it).
fn replace_once(text: &str, from: &str, to: &str) -> String {
    let n = text.matches(from).count();
    assert_eq!(
        n, 1,
        "deploy/prometheus/prometheus.yml: expected {from:?} exactly once, found {n} times"
    );
    text.replacen(from, to, 1)
}

impl Prometheus {
    async fn start(targets: &[String], diag: &Diag) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let deploy = root().join("deploy/prometheus");
        let deployed = std::fs::read_to_string(deploy.join("prometheus.yml")).unwrap();
        let mut config = replace_once(
            &deployed,
            "      - targets: [collector-a:9464, collector-b:9464]",
            &format!("      - targets: [{}]", targets.join(", ")),
        );
        let secs = |d: Duration| format!("{}s", d.as_secs());
        for (from, to) in [
            (
                "  scrape_interval: 15s",
                &format!("  scrape_interval: {}", secs(SCRAPE_INTERVAL)),
            ),
            (
                "  evaluation_interval: 15s",
                &format!("  evaluation_interval: {}", secs(EVALUATION_INTERVAL)),
            ),
            (
                "  scrape_timeout: 10s",
                &format!("  scrape_timeout: {}", secs(SCRAPE_TIMEOUT)),
            ),
            (
                "  - alerts.yml",
                &format!("  - {}", deploy.join("alerts.yml").display()),
            ),
        ] {
            config = replace_once(&config, from, to);
        }
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let port = free_port();
        let log = dir.path().join("prometheus.log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start prometheus (scripts/stack.sh install installs Debian's package)");
        diag.file("prometheus's log", &log);
        let mut prom = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _dir: dir,
            diag: diag.clone(),
        };
        let ready = format!("{}/-/ready", prom.url);
        process::wait_ready(
            &format!("prometheus on {}", prom.url),
            &mut prom.child,
            Duration::from_secs(60),
            Duration::from_millis(100),
            || async { body_of(http().get(&ready)).await.map(drop) },
            || log_text(&log),
        )
        .await;
        prom
    }

    /// `GET /api/v1/<path>` with `query` parameters; its `data`. Panics unless the API
    /// answers `"status": "success"`.
    async fn api(&self, path: &str, query: &[(&str, &str)]) -> Value {
        let resp = http()
            .get(format!("{}/api/v1/{path}", self.url))
            .query(query)
            .send()
            .await
            .unwrap_or_else(|e| panic!("prometheus /api/v1/{path}: {e}"));
        let body: Value = resp.json().await.expect("prometheus answers JSON");
        assert_eq!(
            body["status"], "success",
            "prometheus /api/v1/{path} {query:?}: {body}"
        );
        body["data"].clone()
    }

    /// An instant query's result vector; panics naming the query when the answer has no
    /// `result` list (no result list is not "no series").
    async fn query(&self, promql: &str) -> Vec<Value> {
        let data = self.api("query", &[("query", promql)]).await;
        field(&data, "result")
            .as_array()
            .unwrap_or_else(|| panic!("{promql}: the result is not a vector: {data}"))
            .clone()
    }

    /// Rule group evaluations so far (`prometheus_rule_group_iterations_total` from
    /// Prometheus's own `/metrics`, summed over its groups); panics when it has none.
    async fn rule_iterations(&self) -> f64 {
        let url = format!("{}/metrics", self.url);
        let text = body_of(http().get(&url))
            .await
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        let values: Vec<f64> = text
            .lines()
            .filter(|l| l.starts_with("prometheus_rule_group_iterations_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect();
        assert!(
            !values.is_empty(),
            "no prometheus_rule_group_iterations_total in {url}"
        );
        values.iter().sum()
    }

    /// Active (pending or firing) alerts named `name`.
    async fn alerts(&self, name: &str) -> Vec<Value> {
        let data = self.api("alerts", &[]).await;
        data["alerts"]
            .as_array()
            .expect("alerts list")
            .iter()
            .filter(|a| a["labels"]["alertname"] == name)
            .cloned()
            .collect()
    }

    /// Gives up a wait through the test's report, with Prometheus's view added: its targets
    /// (last scrape, its error) and every active alert.
    async fn give_up(&self, why: String) {
        let targets = self.api("targets", &[]).await;
        let alerts = self.api("alerts", &[]).await;
        self.diag
            .give_up(format!(
                "{why}\nprometheus targets: {targets}\nprometheus alerts: {alerts}"
            ))
            .await;
    }

    /// Waits until alert `name` is firing (at most `limit`); returns it.
    async fn wait_firing(&self, name: &str, limit: Duration) -> Value {
        let start = Instant::now();
        loop {
            let alerts = self.alerts(name).await;
            if let Some(a) = alerts.iter().find(|a| a["state"] == "firing") {
                return a.clone();
            }
            if start.elapsed() >= limit {
                self.give_up(format!(
                    "alert {name} not firing after {limit:?}; active: {alerts:?}"
                ))
                .await;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Waits until alert `name` is neither pending nor firing (at most `limit`).
    async fn wait_resolved(&self, name: &str, limit: Duration) {
        let start = Instant::now();
        loop {
            let alerts = self.alerts(name).await;
            if alerts.is_empty() {
                return;
            }
            if start.elapsed() >= limit {
                self.give_up(format!(
                    "alert {name} still active after {limit:?}: {alerts:?}"
                ))
                .await;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Waits until `promql` returns at least one series (at most `limit`); returns them.
    async fn wait_query(&self, promql: &str, limit: Duration) -> Vec<Value> {
        let start = Instant::now();
        loop {
            let result = self.query(promql).await;
            if !result.is_empty() {
                return result;
            }
            if start.elapsed() >= limit {
                self.give_up(format!("{promql} returned nothing for {limit:?}"))
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        // SIGTERM lets it close its TSDB; SIGKILL only if it hangs.
        terminate(&mut self.child, Duration::from_secs(10));
    }
}

/// The value of an unlabelled metric in `/metrics` of `collector`; panics, showing what was
/// there, when it is missing (a missing metric is not 0).
async fn metric_value(collector: &Collector, name: &str) -> f64 {
    let text = metrics_text(collector).await;
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}"))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

async fn metrics_text(collector: &Collector) -> String {
    let resp = http()
        .get(format!("{}/metrics", collector.admin_url))
        .send()
        .await
        .expect("GET /metrics");
    assert!(resp.status().is_success(), "/metrics: {}", resp.status());
    resp.text().await.unwrap()
}

/// The series names a collector's `/metrics` can hold: every `# TYPE` family with the
/// suffixes of its type (OpenMetrics: a counter's samples end in `_total`, a histogram's in
/// `_bucket`, `_sum`, `_count`, an info metric's in `_info`).
fn exported_series(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').expect("# TYPE name type");
        match kind.trim() {
            "counter" => {
                names.insert(format!("{name}_total"));
                names.insert(format!("{name}_created"));
            }
            "histogram" => {
                for s in ["_bucket", "_sum", "_count", "_created"] {
                    names.insert(format!("{name}{s}"));
                }
            }
            "info" => {
                names.insert(format!("{name}_info"));
            }
            _ => {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

/// PromQL keywords besides the grouping ones ([`GROUPING`], keywords too), for [`metric_names`].
const KEYWORDS: &[&str] = &[
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "atan2",
    "inf",
    "nan",
    // Aggregations, which may stand before `by (...)` rather than before their `(`.
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
];
/// PromQL's grouping keywords, before a label list, for [`metric_names`].
const GROUPING: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// Metric names a PromQL expression selects: identifiers outside label matchers, strings,
/// range brackets and grouping label lists, that are neither functions, aggregations (an
/// identifier followed by `(`), keywords nor Grafana variables.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let (mut names, mut i, mut last_word) = (BTreeSet::new(), 0, String::new());
    let skip_to = |i: usize, close: char| -> usize {
        let mut j = i + 1;
        let mut quote = None;
        while j < chars.len() {
            match (quote, chars[j]) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), '\\') => j += 1,
                (Some(_), _) => {}
                (None, '"' | '\'' | '`') => quote = Some(chars[j]),
                (None, c) if c == close => return j + 1,
                _ => {}
            }
            j += 1;
        }
        panic!("unclosed {close:?} in {expr}");
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '{' {
            i = skip_to(i, '}');
        } else if c == '[' {
            i = skip_to(i, ']');
        } else if c == '"' || c == '\'' || c == '`' {
            let mut j = i + 1;
            while chars[j] != c {
                j += if chars[j] == '\\' { 2 } else { 1 };
            }
            i = j + 1;
        } else if c == '(' && GROUPING.contains(&last_word.as_str()) {
            i = skip_to(i, ')');
            last_word.clear();
        } else if c == '$' {
            i += 1;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut j = i;
            while j < chars.len() && chars[j].is_whitespace() {
                j += 1;
            }
            let call = j < chars.len() && chars[j] == '(';
            let lower = word.to_ascii_lowercase();
            let keyword = KEYWORDS.contains(&lower.as_str()) || GROUPING.contains(&lower.as_str());
            if !call && !keyword {
                names.insert(word.clone());
            }
            last_word = word;
        } else if c.is_ascii_digit() || c == '.' {
            // A number or a duration such as 5m.
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else {
            if !c.is_whitespace() {
                last_word.clear();
            }
            i += 1;
        }
    }
    names
}

fn dashboard_path() -> PathBuf {
    root().join("deploy/grafana/collector.json")
}

/// Every query of the dashboard: (panel title, expression).
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(dashboard_path()).unwrap();
    let dash: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("deploy/grafana/collector.json is not valid JSON: {e}"));
    let mut queries = Vec::new();
    for panel in dash["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().expect("panel title").to_owned();
        let targets = panel["targets"].as_array().expect("panel targets");
        assert!(!targets.is_empty(), "panel {title:?} has no query");
        for t in targets {
            let expr = t["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("panel {title:?}: a target without expr"));
            queries.push((title.clone(), expr.to_owned()));
        }
    }
    for var in dash["templating"]["list"].as_array().expect("templating") {
        let q = var["query"]["query"].as_str().expect("variable query");
        // label_values(SELECTOR, label): the selector is PromQL.
        let selector = q
            .strip_prefix("label_values(")
            .and_then(|r| r.rsplit_once(','))
            .map(|(s, _)| s)
            .unwrap_or_else(|| panic!("variable query {q:?} is not label_values(...)"));
        queries.push((format!("variable {}", var["name"]), selector.to_owned()));
    }
    queries
}

/// A dashboard expression as Prometheus would get it from Grafana with every collector
/// selected.
fn grafana_expanded(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$__interval", "15s")
        .replace("$instance", ".*")
}
