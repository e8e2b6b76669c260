//! The services of `compose.yaml`: validation, passwords, restarts, replicas, spool volumes,
//! networks and published ports.

use super::*;

#[test]
fn compose_file_validates() {
    let dir = tempfile::tempdir().unwrap();
    placeholder_env(&dir.path().join("env"), None);
    let out = docker_compose(&dir.path().join("env"), &["config", "-q"]);
    assert!(
        out.status.success(),
        "docker-compose config -q: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn compose_refuses_to_start_without_each_password() {
    let dir = tempfile::tempdir().unwrap();
    let env = dir.path().join("env");
    // `docker-compose config -q` on `env` fails and says `says`.
    let refused = |without: &str, says: &str| {
        let out = docker_compose(&env, &["config", "-q"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "docker-compose config passed without {without}"
        );
        assert!(err.contains(says), "without {without} it says: {err}");
    };
    std::fs::write(&env, "").unwrap();
    refused("any password", "in .env");
    for v in PASSWORDS {
        placeholder_env(&env, Some(v));
        refused(v, &format!("set {v} in .env"));
    }
    let example = std::fs::read_to_string(root().join("deploy/env.example")).unwrap();
    let set: BTreeSet<&str> = example
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .filter(|k| !k.is_empty() && k.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .collect();
    assert_eq!(
        set,
        PASSWORDS.into_iter().collect::<BTreeSet<_>>(),
        "deploy/env.example does not set exactly the passwords compose.yaml requires"
    );
}

#[test]
fn long_running_services_restart_unless_stopped_one_shots_never() {
    let mut problems = vec![];
    for (name, svc) in c().services() {
        let want = if ONE_SHOTS.contains(&name) {
            "no"
        } else {
            "unless-stopped"
        };
        let got = svc.str("restart").unwrap_or("no");
        if got != want {
            problems.push(format!("{name}: restart {got:?}, want {want:?}"));
        }
    }
    for name in ONE_SHOTS {
        if c().get(name).is_none() {
            problems.push(format!("one-shot service {name} is missing"));
        }
    }
    assert_no_problems(problems);
}

fn replica_urls() -> Vec<String> {
    c().clickhouse
        .iter()
        .map(|n| format!("http://{n}:8123"))
        .collect()
}

fn urls_of(svc: Service) -> Vec<String> {
    let env = svc.env();
    let urls = env
        .get("COLLECTOR_CLICKHOUSE_URLS")
        .map_or("", String::as_str);
    urls.split(',').map(str::to_owned).collect()
}

#[test]
fn migrate_reaches_every_replica_collectors_and_seed_wait_for_it() {
    let mut problems = vec![];
    let migrate = c().service("migrate");
    let command = migrate.list("command");
    if command != ["migrate"] {
        problems.push(format!("migrate: command {command:?}, want [\"migrate\"]"));
    }
    // The TTL, which the collectors' write user may not ALTER, set as `migrate` after it.
    let retention = c().service("retention");
    let command = retention.list("command");
    if command != ["retention"]
        || retention.depends_condition("migrate") != Some("service_completed_successfully")
        || sorted(urls_of(retention)) != sorted(replica_urls())
    {
        problems.push(format!(
            "retention: command {command:?}, want [\"retention\"] on every replica after migrate completed"
        ));
    }
    let urls = urls_of(migrate);
    if sorted(urls.clone()) != sorted(replica_urls()) {
        problems.push(format!(
            "migrate must reach every replica: {urls:?} != {:?}",
            replica_urls()
        ));
    }
    for name in c().collectors.iter().map(String::as_str).chain(["seed"]) {
        if c().service(name).depends_condition("migrate") != Some("service_completed_successfully")
        {
            problems.push(format!(
                "{name}: must depend on migrate with service_completed_successfully"
            ));
        }
    }
    assert_no_problems(problems);
}

#[test]
fn collectors_stop_grace_covers_the_drain_probe_healthcheck_both_postgres_hosts() {
    let mut problems = vec![];
    if c().collectors.len() < 2 {
        problems.push(format!(
            "want at least two collectors, found {:?}",
            c().collectors
        ));
    }
    for name in &c().collectors {
        let svc = c().service(name);
        let env = svc.env();
        let grace = duration_s(
            env.get("COLLECTOR_DRAIN_GRACE")
                .map_or("5s", String::as_str),
        );
        let stop = duration_s(svc.str("stop_grace_period").unwrap_or("10s"));
        if stop <= grace + DRAIN_EXTRA_S {
            problems.push(format!(
                "{name}: stop_grace_period {stop}s is not above drain grace {grace}s + {DRAIN_EXTRA_S}s"
            ));
        }
        let test = svc.get("healthcheck").map(|h| Service(h).list("test"));
        if test.as_deref()
            != Some(&["CMD", "/usr/local/bin/collector", "probe"].map(String::from)[..])
        {
            problems.push(format!(
                "{name}: healthcheck {test:?} is not `collector probe`"
            ));
        }
        // A multi-host URL: postgres://user:pw@a:5432,b:5432/db.
        let netloc = env
            .get("COLLECTOR_DATABASE_URL")
            .and_then(|u| u.split_once("://"))
            .map(|(_, rest)| rest.split('/').next().unwrap_or(""))
            .unwrap_or("");
        let hosts: Vec<&str> = netloc
            .rsplit('@')
            .next()
            .unwrap_or("")
            .split(',')
            .map(|h| h.rsplit_once(':').map_or(h, |(h, _)| h))
            .collect();
        if hosts != ["postgres-primary", "postgres-standby"] {
            problems.push(format!(
                "{name}: COLLECTOR_DATABASE_URL hosts {hosts:?}, want postgres-primary then postgres-standby"
            ));
        }
    }
    assert_no_problems(problems);
}

#[test]
fn collectors_list_the_same_three_replicas_in_different_orders() {
    let mut problems = vec![];
    let want = sorted(replica_urls());
    if want.len() != 3 {
        problems.push(format!(
            "want three ClickHouse replicas, found {:?}",
            c().clickhouse
        ));
    }
    let mut orders = BTreeMap::new();
    for name in &c().collectors {
        let urls = urls_of(c().service(name));
        if sorted(urls.clone()) != want {
            problems.push(format!(
                "{name}: replicas {urls:?} are not exactly {want:?}"
            ));
        }
        orders.insert(name.clone(), urls);
    }
    let distinct: BTreeSet<_> = orders.values().collect();
    if distinct.len() != orders.len() {
        problems.push(format!("collectors share a preference order: {orders:?}"));
    }
    let firsts: Vec<&String> = orders.values().filter_map(|o| o.first()).collect();
    if firsts.iter().collect::<BTreeSet<_>>().len() != firsts.len() {
        problems.push(format!(
            "collectors prefer the same first replica: {firsts:?}"
        ));
    }
    assert_no_problems(problems);
}

/// The spool folder the image declares (`ENV COLLECTOR_SPOOL_DIR` of the Dockerfile).
fn spool_dir() -> String {
    let mut dir = "/var/lib/collector/spool".to_owned();
    for (ins, args) in dockerfile::instructions() {
        if ins == "ENV" {
            if let Some(d) = dockerfile::env_pairs(&args).get("COLLECTOR_SPOOL_DIR") {
                dir = d.clone();
            }
        }
    }
    dir
}

#[test]
fn one_spool_volume_per_collector_shared_with_no_one() {
    let spool_dir = spool_dir();
    let mut problems = vec![];
    let mut owner: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (name, svc) in c().services() {
        for m in svc.mounts() {
            if m.kind == "volume" && !m.source.is_empty() {
                owner.entry(m.source).or_default().push(name);
            }
        }
    }
    for name in &c().collectors {
        let svc = c().service(name);
        let vols: Vec<String> = svc
            .mounts()
            .into_iter()
            .filter(|m| m.kind == "volume" && m.target == spool_dir)
            .map(|m| m.source)
            .collect();
        let [vol] = &vols[..] else {
            problems.push(format!(
                "{name}: want one named volume at {spool_dir}, found {vols:?}"
            ));
            continue;
        };
        if owner[vol] != [name.as_str()] {
            problems.push(format!(
                "spool volume {vol} is mounted by {:?}: one collector each",
                owner[vol]
            ));
        }
        let spool = svc
            .env()
            .get("COLLECTOR_SPOOL_DIR")
            .cloned()
            .unwrap_or(spool_dir.clone());
        if spool != spool_dir {
            problems.push(format!(
                "{name}: COLLECTOR_SPOOL_DIR {spool} is not the volume's {spool_dir}"
            ));
        }
    }
    assert_no_problems(problems);
}

#[test]
fn fixed_subnet_is_the_trusted_proxies_and_the_clickhouse_users_network() {
    let mut problems = vec![];
    let subnets: Vec<String> = c().doc["networks"]
        .as_mapping()
        .into_iter()
        .flatten()
        .flat_map(|(_, n)| {
            n["ipam"]["config"]
                .as_sequence()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|cfg| cfg["subnet"].as_str().map(str::to_owned))
        .collect();
    let [subnet] = &subnets[..] else {
        panic!("want one network with a fixed subnet, found {subnets:?}");
    };
    let net = ipv4_net(subnet);
    for name in &c().collectors {
        let trusted = c()
            .service(name)
            .env()
            .get("COLLECTOR_TRUSTED_PROXIES")
            .cloned()
            .unwrap_or_default();
        let nets: Vec<_> = trusted
            .split(',')
            .filter(|t| !t.trim().is_empty())
            .map(ipv4_net)
            .collect();
        if nets != [net] {
            problems.push(format!(
                "{name}: COLLECTOR_TRUSTED_PROXIES {trusted:?} is not the subnet {subnet}"
            ));
        }
    }
    with_users_xml(|root| {
        for user in [CH_MIGRATE, CH_WRITER, CH_READER] {
            let ips: Vec<String> = find_all(root, &format!("users/{user}/networks/ip"))
                .into_iter()
                .map(own_text)
                .collect();
            if ips != [subnet.clone()] {
                problems.push(format!("deploy/clickhouse/users.xml lets `{user}` in from {ips:?}, not from {subnet} only"));
            }
        }
    });
    assert_no_problems(problems);
}

#[test]
fn only_caddy_publishes_ports_monitoring_on_loopback_no_clickhouse() {
    let mut problems = vec![];
    for (name, svc) in c().services() {
        let Some(serde_yaml::Value::Sequence(ports)) = svc.get("ports") else {
            continue;
        };
        for p in ports {
            let host_ip = match p {
                serde_yaml::Value::Mapping(_) => p
                    .get("host_ip")
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .to_owned(),
                other => {
                    let s = collector_tests::common::containers::compose::scalar(other);
                    let parts: Vec<&str> = s.split(':').collect();
                    if parts.len() == 3 {
                        parts[0].to_owned()
                    } else {
                        String::new()
                    }
                }
            };
            if name == "caddy" || (LOOPBACK_PORTS.contains(&name) && host_ip == "127.0.0.1") {
                continue;
            }
            problems.push(format!(
                "{name} publishes {p:?} (only caddy may, and {} on 127.0.0.1)",
                LOOPBACK_PORTS.join(", ")
            ));
        }
    }
    if c().get("caddy").is_none_or(|s| s.list("ports").is_empty()) {
        problems.push("caddy publishes no port".into());
    }
    assert_no_problems(problems);
}
