//! The edge services of `compose.yaml`: host network, capabilities, `deploy/edge` mounted.

use super::*;

#[test]
fn edge_services_host_network_capabilities_deploy_edge_mounted_one_container_each() {
    let mut problems = vec![];
    let edge: Vec<(&str, Service)> = c()
        .services()
        .into_iter()
        .filter(|(_, s)| s.list("profiles").iter().any(|p| p == "edge"))
        .collect();
    let names: Vec<&str> = edge.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        ["edge-haproxy", "edge-keepalived"],
        "the services of profile edge"
    );
    for (name, svc) in &edge {
        if svc.str("network_mode") != Some("host") {
            problems.push(format!(
                "{name}: network_mode {:?}, want 'host' (VRRP)",
                svc.str("network_mode")
            ));
        }
        if svc.str("container_name").is_none_or(str::is_empty) {
            problems.push(format!(
                "{name}: no container_name (the engine's single-instance guard)"
            ));
        }
        if svc.binds().get("/etc/collector-edge").map(String::as_str) != Some("deploy/edge") {
            problems.push(format!(
                "{name}: deploy/edge is not mounted at /etc/collector-edge"
            ));
        }
        let script = if *name == "edge-haproxy" {
            "haproxy-run.sh"
        } else {
            "keepalived-run.sh"
        };
        let command = svc.list("command");
        let want = format!("/etc/collector-edge/{script}");
        if command.first() != Some(&want) {
            problems.push(format!("{name}: command {command:?}, want [{want:?}]"));
        } else if !executable(&root().join("deploy/edge").join(script)) {
            problems.push(format!("deploy/edge/{script} is not executable"));
        }
    }
    let caps = edge[1].1.list("cap_add");
    for cap in ["NET_ADMIN", "NET_RAW"] {
        if !caps.iter().any(|c| c == cap) {
            problems.push(format!("edge-keepalived lacks {cap}"));
        }
    }
    if edge[0].1.str("stop_signal") != Some("SIGUSR1") {
        problems.push("edge-haproxy: stop_signal is not SIGUSR1 (HAProxy's soft stop)".into());
    }
    assert_no_problems(problems);
}

fn executable(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
}
