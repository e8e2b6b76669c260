//! Prometheus scrapes the collectors with `deploy/`'s rules; Grafana gets the dashboard.

use super::*;

#[test]
fn prometheus_scrapes_the_collectors_with_deploy_rules_grafana_gets_the_dashboard() {
    let mut problems = vec![];
    let prom = c().get("prometheus").expect("no prometheus service");
    if prom.binds().get("/etc/prometheus").map(String::as_str) != Some("deploy/prometheus") {
        problems.push("prometheus does not mount deploy/prometheus at /etc/prometheus".into());
    }
    let config = yaml_file("deploy/prometheus/prometheus.yml");
    let jobs = config["scrape_configs"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    let job = jobs
        .iter()
        .find(|j| j["job_name"].as_str() == Some("collector"));
    let mut targets: Vec<String> = job
        .and_then(|j| j["static_configs"].as_sequence())
        .into_iter()
        .flatten()
        .flat_map(|sc| sc["targets"].as_sequence().cloned().unwrap_or_default())
        .filter_map(|t| t.as_str().map(str::to_owned))
        .collect();
    targets.sort();
    let want: Vec<String> = c().collectors.iter().map(|n| format!("{n}:9464")).collect();
    if targets != want {
        problems.push(format!(
            "job collector scrapes {targets:?}, not the collectors' operations listeners {want:?}"
        ));
    }
    for f in config["rule_files"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|f| f.as_str())
    {
        if !root().join("deploy/prometheus").join(f).exists() {
            problems.push(format!("rule file {f} is not in deploy/prometheus"));
        }
    }
    problems.extend(grafana_problems());
    assert_no_problems(problems);
}

fn grafana_problems() -> Vec<String> {
    let mut problems = vec![];
    let binds = c().get("grafana").expect("no grafana service").binds();
    let provider = yaml_file("deploy/grafana/provisioning/dashboards/collector.yml");
    let path = provider["providers"][0]["options"]["path"]
        .as_str()
        .unwrap_or("");
    if binds
        .get(&format!("{path}/collector.json"))
        .map(String::as_str)
        != Some("deploy/grafana/collector.json")
    {
        problems.push(format!(
            "grafana does not mount deploy/grafana/collector.json under {path}"
        ));
    }
    for sub in ["datasources", "dashboards"] {
        let want = format!("deploy/grafana/provisioning/{sub}");
        if binds.get(&format!("/etc/grafana/provisioning/{sub}")) != Some(&want) {
            problems.push(format!("grafana does not mount {want}"));
        }
    }
    let sources = yaml_file("deploy/grafana/provisioning/datasources/prometheus.yml");
    let uids: BTreeSet<String> = sources["datasources"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter(|d| d["url"].as_str() == Some("http://prometheus:9090"))
        .filter_map(|d| d["uid"].as_str().map(str::to_owned))
        .collect();
    let text = std::fs::read_to_string(root().join("deploy/grafana/collector.json")).unwrap();
    let dashboard: serde_json::Value =
        serde_json::from_str(&text).expect("deploy/grafana/collector.json is JSON");
    let panels = dashboard["panels"].as_array().cloned().unwrap_or_default();
    let uid = |v: &serde_json::Value| v["datasource"]["uid"].as_str().map(str::to_owned);
    let mut used: BTreeSet<Option<String>> = panels.iter().map(uid).collect();
    for p in &panels {
        used.extend(p["targets"].as_array().into_iter().flatten().map(uid));
    }
    if used.is_empty()
        || !used
            .iter()
            .all(|u| u.as_ref().is_some_and(|u| uids.contains(u)))
    {
        problems.push(format!(
            "dashboard data sources {used:?} are not the provisioned Prometheus {uids:?}"
        ));
    }
    problems
}
