//! The container files checked without a container engine: `compose.yaml` (validated by
//! `docker-compose`, then its resolved form), `deploy/caddy/Caddyfile` (`caddy validate`,
//! `caddy fmt`), ClickHouse's and Keeper's XML under `deploy/`, PostgreSQL 15 run with
//! `deploy/postgres`'s files (a primary and a streaming standby), the `Dockerfile` and
//! `.dockerignore` (built when a Docker engine answers, else checked statically with the
//! dependency layer replayed by `cargo metadata`), and the licence notices. One test per fact;
//! the image itself is built and run by `containers_engine.rs`.
//!
//! Needs `docker-compose`, `caddy` and PostgreSQL 15 (`scripts/check-containers.sh` installs
//! them) and root (PostgreSQL runs as the `postgres` user).

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

use collector_tests::common::containers::compose::{
    docker_compose, duration_s, placeholder_env, rel_to_root, Compose, Service, ONE_SHOTS,
    PASSWORDS,
};
use collector_tests::common::containers::deploy_files::{
    each_replica_config, files_under, grants_of, ipv4_net, keeper_xml, password_env, shape,
    with_users_xml, yaml_file,
};
use collector_tests::common::containers::dockerfile::{self, copy_words, Dockerignore};
use collector_tests::common::containers::scratch_pg::{ScratchPg, PG_BIN};
use collector_tests::common::containers::xml::{self, find, find_all, own_text, tag, text};
use collector_tests::common::containers::{
    assert_no_problems, docker_engine_answers, output, run_ok,
};
use collector_tests::common::root;

/// What the drain may take beyond `COLLECTOR_DRAIN_GRACE`: in-flight requests (10 s) and the
/// writer's last flush (10 s), docs/edge.md "Drain".
const DRAIN_EXTRA_S: f64 = 20.0;
/// Services that may publish a port on the host's loopback (monitoring); caddy publishes the
/// public one. No ClickHouse server: its `default` user is reached from inside only.
const LOOPBACK_PORTS: [&str; 2] = ["grafana", "prometheus"];
/// ClickHouse's users (deploy/clickhouse/users.xml): the serving collectors' write user, the
/// one-shot commands' migrate user, and Grafana's.
const CH_WRITER: &str = "collector";
const CH_MIGRATE: &str = "migrate";
const CH_READER: &str = "dashboard";
/// The one-shots of the collector image (logging in as [`CH_MIGRATE`]).
const COLLECTOR_ONE_SHOTS: [&str; 3] = ["migrate", "retention", "seed"];

fn c() -> &'static Compose {
    Compose::resolved()
}

// ------------------------------------------------------------------ compose ---

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

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
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

// --------------------------------------------------------- ClickHouse users ---

/// What the one-shot commands' statements need (docs/deployment.md, "ClickHouse users");
/// anything beyond is refused, so that a widened grant is a deliberate change here too.
const MIGRATE_RIGHTS: [&str; 9] = [
    "SELECT",
    "INSERT",
    "CREATE DATABASE",
    "CREATE TABLE",
    "ALTER ADD COLUMN",
    "ALTER DELETE",
    "ALTER MODIFY TTL",
    "DROP TABLE",
    "OPTIMIZE",
];
/// What the serving collectors' statements need: no ALTER, no DROP, no DELETE (issue 52, 5).
const WRITER_RIGHTS: [&str; 4] = ["SELECT", "INSERT", "CREATE DATABASE", "CREATE TABLE"];
const READER_RIGHTS: [&str; 1] = ["SELECT"];
/// System tables the one-shot commands read that ClickHouse 26.x shows only with a grant
/// (`system.clusters`: `migrate` checks the cluster `measurements_all` reads over).
const MIGRATE_SYSTEM_TABLES: [&str; 6] = [
    "system.replicas",
    "system.mutations",
    "system.parts",
    "system.macros",
    "system.merge_tree_settings",
    "system.clusters",
];
/// Those the serving collectors read (the prober, the schema on a returning replica, the
/// retention's look at the partitions): all but `mutations` (`sites purge` only).
const WRITER_SYSTEM_TABLES: [&str; 5] = [
    "system.replicas",
    "system.parts",
    "system.macros",
    "system.merge_tree_settings",
    "system.clusters",
];
/// The engines of the collector's tables: 26.x creates a table only with TABLE ENGINE
/// (`Distributed`: `measurements_all`, contract v5 §3).
const WRITER_ENGINES: [&str; 3] = [
    "ReplicatedReplacingMergeTree",
    "ReplacingMergeTree",
    "Distributed",
];

fn default_user_problems(users: roxmltree::Node) -> Vec<String> {
    let Some(default) = find(users, "default") else {
        return vec!["`default` is not restricted (no <default> in users.xml)".into()];
    };
    let nets = find(default, "networks");
    let ips: BTreeSet<String> = nets
        .map(|n| find_all(n, "ip").into_iter().map(own_text).collect())
        .unwrap_or_default();
    let others: Vec<String> = nets
        .map(|n| {
            n.children()
                .filter(|e| e.is_element() && tag(*e) != "ip")
                .map(tag)
                .collect()
        })
        .unwrap_or_default();
    let loopback = ips.iter().all(|i| i == "::1" || i == "127.0.0.1");
    if nets.is_none() || ips.is_empty() || !loopback || !others.is_empty() {
        return vec![format!(
            "`default` must come from loopback only (<networks> with ::1/127.0.0.1): found {ips:?} {others:?}"
        )];
    }
    vec![]
}

fn grant_problems(user: &str, el: roxmltree::Node, allowed: &[&str]) -> Vec<String> {
    let mut problems = vec![];
    let grants = grants_of(el);
    if grants.is_empty() {
        problems.push(format!(
            "`{user}`: no <grants> (a user without them gets every right)"
        ));
    }
    let select: BTreeSet<String> = ["SELECT".to_owned()].into();
    let engine: BTreeSet<String> = ["TABLE ENGINE".to_owned()].into();
    for g in grants {
        let (privs, target) = match g {
            Ok(g) => g,
            Err(q) => {
                problems.push(format!(
                    "`{user}`: grant {q:?} is not `GRANT ... ON collector.*`"
                ));
                continue;
            }
        };
        let system_tables: &[&str] = match user {
            CH_WRITER => &WRITER_SYSTEM_TABLES,
            CH_MIGRATE => &MIGRATE_SYSTEM_TABLES,
            _ => &[],
        };
        let writer = !system_tables.is_empty();
        if system_tables.contains(&target.as_str()) {
            if privs != select {
                problems.push(format!(
                    "`{user}`: grants {privs:?} on {target}, want SELECT only"
                ));
            }
        } else if writer && WRITER_ENGINES.contains(&target.as_str()) {
            if privs != engine {
                problems.push(format!(
                    "`{user}`: grants {privs:?} on {target}, want TABLE ENGINE only"
                ));
            }
        } else if target != "collector.*" {
            problems.push(format!(
                "`{user}`: grant on {target}, want collector.* only"
            ));
        } else {
            let beyond: Vec<&String> = privs
                .iter()
                .filter(|p| !allowed.contains(&p.as_str()))
                .collect();
            if !beyond.is_empty() {
                problems.push(format!("`{user}`: grants {beyond:?} beyond {allowed:?}"));
            }
        }
    }
    problems
}

fn user_problems(user: &str, el: roxmltree::Node, allowed: &[&str]) -> Vec<String> {
    let mut problems = vec![];
    if let Some(pw) = find(el, "password") {
        if pw.text().is_some_and(|t| !t.is_empty()) && pw.attribute("from_env").is_none() {
            problems.push(format!(
                "`{user}`: a password written in users.xml (it must come from .env)"
            ));
        }
    }
    if password_env(el).is_none() {
        problems.push(format!("`{user}`: no password from_env"));
    }
    let ips: Vec<String> = find_all(el, "networks/ip")
        .into_iter()
        .map(own_text)
        .collect();
    if ips.is_empty() || ips.iter().any(|i| ipv4_net(i).1 < 24) {
        problems.push(format!(
            "`{user}`: networks {ips:?}: want the stack's subnet"
        ));
    }
    problems.extend(grant_problems(user, el, allowed));
    if find(el, "access_management").is_some()
        && text(el, "access_management").as_deref() != Some("0")
    {
        problems.push(format!("`{user}`: access_management is on"));
    }
    problems
}

#[test]
fn clickhouse_users_default_on_loopback_migrate_collector_and_dashboard_confined() {
    let mut problems = vec![];
    with_users_xml(|root| {
        let users = find(root, "users").expect("deploy/clickhouse/users.xml has no <users>");
        problems.extend(default_user_problems(users));
        let mut env_names = BTreeMap::new();
        for (user, allowed) in [
            (CH_MIGRATE, &MIGRATE_RIGHTS[..]),
            (CH_WRITER, &WRITER_RIGHTS[..]),
            (CH_READER, &READER_RIGHTS[..]),
        ] {
            let Some(el) = find(users, user) else {
                problems.push(format!("no user `{user}`"));
                continue;
            };
            problems.extend(user_problems(user, el, allowed));
            env_names.insert(user, password_env(el));
        }
        if let Some(reader) = find(users, CH_READER) {
            let prof = text(reader, "profile").unwrap_or_default();
            let readonly = text(root, &format!("profiles/{prof}/readonly"));
            if !matches!(readonly.as_deref(), Some("1" | "2")) {
                problems.push(format!(
                    "`{CH_READER}`: profile {prof:?} has readonly {readonly:?}, want 1 (or 2)"
                ));
            }
        }
        // Every replica gets the passwords (from .env: compose refuses to start without them).
        for name in &c().clickhouse {
            let env = c().service(name).env();
            for (user, var) in &env_names {
                if let Some(var) = var {
                    if env.get(var).is_none_or(String::is_empty) {
                        problems.push(format!(
                            "{name}: {var} (the password of `{user}`) is not in its environment"
                        ));
                    }
                }
            }
        }
    });
    assert_no_problems(problems);
}

/// The environment variable of user `user`'s password in deploy/clickhouse/users.xml.
fn user_password_env(user: &str) -> Option<String> {
    with_users_xml(|root| find(root, &format!("users/{user}")).and_then(password_env))
}

/// The ClickHouse passwords of `.env` (`CLICKHOUSE_*`): `credentials` refuses a placeholder
/// of each.
fn clickhouse_passwords() -> Vec<&'static str> {
    PASSWORDS
        .into_iter()
        .filter(|v| v.starts_with("CLICKHOUSE_"))
        .collect()
}

/// `credentials` writes the password of each of `users` (user, the variable users.xml reads
/// it from) from its environment, gives the files to uid 10001, runs without a network, and
/// first refuses (exit 1) a placeholder (`change-me-...`, any case) in any ClickHouse password.
fn credentials_command_problems(cred: Service, users: &[(&str, &Option<String>)]) -> Vec<String> {
    let mut problems = vec![];
    let command = cred.list("command").join(" ").replace("$$", "$");
    for (user, var) in users {
        match var {
            Some(var) if cred.env().get(var).is_some_and(|v| !v.is_empty()) => {
                if !command.contains(&format!("${var}")) {
                    problems.push(format!("credentials: its command does not write ${var}"));
                }
            }
            _ => problems.push(format!(
                "credentials: {var:?} (the password of `{user}`) is not in its environment"
            )),
        }
    }
    if !command.contains("chown 10001:10001") {
        problems.push("credentials: the file is not given to uid 10001 (the collector)".into());
    }
    let placeholder = "[Cc][Hh][Aa][Nn][Gg][Ee]-[Mm][Ee]*) ";
    let refusal = command.split_once(placeholder).map(|(_, r)| r);
    if !refusal.is_some_and(|r| r.split(";;").next().is_some_and(|r| r.contains("exit 1"))) {
        problems.push(format!(
            "credentials: does not exit 1 on a placeholder ({placeholder:?} then exit 1)"
        ));
    }
    for var in clickhouse_passwords() {
        if !command.contains(var) || cred.env().get(var).is_none_or(String::is_empty) {
            problems.push(format!(
                "credentials: does not check {var} for a placeholder (in its command and environment)"
            ));
        }
    }
    if cred.str("network_mode") != Some("none") {
        problems.push(format!(
            "credentials: network_mode {:?}, want 'none'",
            cred.str("network_mode")
        ));
    }
    problems
}

/// Service `name` logs in to ClickHouse as `user` with the password file `credentials` writes
/// (a volume of its, mounted read-only here), and has not the password `var` itself in its
/// environment. The file's volume, if any.
fn password_file_problems(
    name: &str,
    svc: Service,
    cred: Service,
    (user, var): (&str, &Option<String>),
) -> (Vec<String>, Option<String>) {
    let mut problems = vec![];
    let env = svc.env();
    if env.get("COLLECTOR_CLICKHOUSE_USER").map(String::as_str) != Some(user) {
        problems.push(format!(
            "{name}: COLLECTOR_CLICKHOUSE_USER {:?}, want {user:?}",
            env.get("COLLECTOR_CLICKHOUSE_USER")
        ));
    }
    let pw = env
        .get("COLLECTOR_CLICKHOUSE_PASSWORD_FILE")
        .cloned()
        .unwrap_or_default();
    if pw.is_empty() {
        problems.push(format!("{name}: no COLLECTOR_CLICKHOUSE_PASSWORD_FILE"));
        return (problems, None);
    }
    // The file's folder is a volume `credentials` writes, mounted read-only here.
    let (folder, _) = pw.rsplit_once('/').unwrap_or(("", &pw));
    let command = cred.list("command").join(" ").replace("$$", "$");
    let mut volume = None;
    let written = cred
        .mounts()
        .into_iter()
        .find(|m| m.kind == "volume" && m.target == folder);
    match (
        svc.mounts().into_iter().find(|m| m.target == folder),
        written,
    ) {
        (Some(m), Some(w)) if m.kind == "volume" && m.source == w.source => {
            volume = Some(m.source.clone());
            if !m.read_only {
                problems.push(format!("{name}: {folder} is mounted writable"));
            } else if !command.contains(&format!(" {pw} ")) || !command.contains("mv -f") {
                problems.push(format!("{name}: credentials does not write {pw}"));
            }
        }
        _ => problems.push(format!(
            "{name}: {folder} is not a volume credentials writes at the same place"
        )),
    }
    if let Some(var) = var {
        if env.contains_key(var) {
            problems.push(format!(
                "{name}: {var} is in its environment (it must only get the file)"
            ));
        }
    }
    (problems, volume)
}

#[test]
fn collectors_and_one_shots_log_in_with_the_password_file_credentials_writes() {
    let cred = c().get("credentials").expect("no service credentials");
    let writer = (CH_WRITER, &user_password_env(CH_WRITER));
    let migrate = (CH_MIGRATE, &user_password_env(CH_MIGRATE));
    let mut problems = credentials_command_problems(cred, &[writer, migrate]);
    if writer.1 == migrate.1 {
        problems.push(format!(
            "`{CH_WRITER}` and `{CH_MIGRATE}` read one password variable: {:?}",
            writer.1
        ));
    }
    let mut volumes: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    let services = c()
        .collectors
        .iter()
        .map(|n| (n.as_str(), writer))
        .chain(COLLECTOR_ONE_SHOTS.iter().map(|n| (*n, migrate)));
    for (name, login) in services {
        if let Some(svc) = c().get(name) {
            let (found, volume) = password_file_problems(name, svc, cred, login);
            problems.extend(found);
            volumes.entry(login.0).or_default().extend(volume);
        }
    }
    // A serving collector cannot read the migrate user's password: not one volume.
    let migrate_volumes = volumes.get(CH_MIGRATE).cloned().unwrap_or_default();
    if migrate_volumes.is_empty() || volumes.get(CH_WRITER) == Some(&migrate_volumes) {
        problems.push(format!(
            "the one-shots' password volumes {volumes:?}: want one of their own"
        ));
    }
    for name in &c().collectors {
        for m in c().service(name).mounts() {
            if migrate_volumes.contains(&m.source) {
                problems.push(format!(
                    "{name} mounts {}, the migrate user's password",
                    m.source
                ));
            }
        }
    }
    if c().service("migrate").depends_condition("credentials")
        != Some("service_completed_successfully")
    {
        problems.push("migrate does not wait for credentials to complete successfully".into());
    }
    assert_no_problems(problems);
}

#[test]
fn the_write_user_may_not_alter_drop_or_delete() {
    let mut problems = vec![];
    with_users_xml(|root| {
        let Some(writer) = find(root, &format!("users/{CH_WRITER}")) else {
            problems.push(format!("no user `{CH_WRITER}`"));
            return;
        };
        for grant in find_all(writer, "grants/query") {
            let q = own_text(grant).to_ascii_uppercase();
            // The rights, between GRANT and ON.
            let privs = q.split(" ON ").next().unwrap_or(&q);
            for right in [
                "ALTER", "DROP", "DELETE", "TRUNCATE", "ALL", "OPTIMIZE", "SYSTEM",
            ] {
                if privs
                    .split(|c: char| !c.is_ascii_alphanumeric())
                    .any(|w| w == right)
                {
                    problems.push(format!("`{CH_WRITER}` may {right}: {q}"));
                }
            }
        }
    });
    for name in &c().collectors {
        let user = c()
            .service(name)
            .env()
            .get("COLLECTOR_CLICKHOUSE_USER")
            .cloned();
        if user.as_deref() != Some(CH_WRITER) {
            problems.push(format!("{name} logs in as {user:?}, not as the write user"));
        }
    }
    assert_no_problems(problems);
}

#[test]
fn grafana_clickhouse_data_source_logs_in_as_dashboard_with_its_password() {
    let mut problems = vec![];
    let graf = c().get("grafana").expect("no grafana service");
    let var = user_password_env(CH_READER).unwrap_or_default();
    let doc = yaml_file("deploy/grafana/provisioning/datasources/clickhouse.yml");
    let sources: Vec<&serde_yaml::Value> = doc["datasources"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter(|d| d["type"].as_str() == Some("grafana-clickhouse-datasource"))
        .collect();
    let [ds] = &sources[..] else {
        panic!("want one ClickHouse data source, found {}", sources.len());
    };
    let username = ds["jsonData"]["username"].as_str();
    if username != Some(CH_READER) {
        problems.push(format!(
            "data source username {username:?}, want {CH_READER:?}"
        ));
    }
    let host = ds["jsonData"]["host"].as_str().unwrap_or("");
    if !c().clickhouse.iter().any(|n| n == host) {
        problems.push(format!(
            "data source host {host:?} is not a ClickHouse service"
        ));
    }
    let password = ds["secureJsonData"]["password"].as_str().unwrap_or("");
    if ![
        format!("${var}"),
        format!("${{{var}}}"),
        format!("$__env{{{var}}}"),
    ]
    .contains(&password.to_owned())
    {
        problems.push(format!("data source password {password:?}, want ${var}"));
    }
    let env = graf.env();
    if var.is_empty() || env.get(&var).is_none_or(String::is_empty) {
        problems.push(format!("grafana: {var} is not in its environment"));
    }
    if !env
        .get("GF_INSTALL_PLUGINS")
        .is_some_and(|p| p.contains("grafana-clickhouse-datasource"))
    {
        problems.push(
            "grafana: GF_INSTALL_PLUGINS does not install grafana-clickhouse-datasource".into(),
        );
    }
    assert_no_problems(problems);
}

#[test]
fn every_bind_mounted_file_exists_under_deploy() {
    let mut problems = vec![];
    let mut used = 0;
    for (name, svc) in c().services() {
        for m in svc.mounts().into_iter().filter(|m| m.kind == "bind") {
            let rel = rel_to_root(&m.source);
            used += 1;
            if !root().join(&rel).exists() {
                problems.push(format!("{name}: {rel} does not exist"));
            } else if !(rel == "deploy" || rel.starts_with("deploy/")) {
                problems.push(format!("{name}: {rel} is outside deploy/"));
            }
        }
    }
    if used == 0 {
        problems.push("no bind mounts found (compose config changed shape?)".into());
    }
    assert_no_problems(problems);
}

#[test]
fn third_party_images_pinned_to_a_version() {
    let mut problems = vec![];
    for (name, svc) in c().services() {
        if svc.get("build").is_some() {
            continue;
        }
        let image = svc.str("image").unwrap_or("");
        let last = image.rsplit('/').next().unwrap_or("");
        let tag = if last.contains(':') {
            image.rsplit(':').next().unwrap_or("")
        } else {
            ""
        };
        if tag.is_empty() || tag == "latest" {
            problems.push(format!(
                "{name}: image {image:?} is not pinned to a version"
            ));
        }
    }
    assert_no_problems(problems);
}

// --------------------------------------------------------------- monitoring ---

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

// -------------------------------------------------------------------- caddy ---

#[test]
fn caddyfile_validates() {
    let dir = tempfile::tempdir().unwrap();
    // Caddy wants somewhere to keep its state: not the caller's home.
    run_ok(
        Command::new("caddy")
            .args(["validate", "--adapter", "caddyfile", "--config"])
            .arg(root().join("deploy/caddy/Caddyfile"))
            .env("XDG_DATA_HOME", dir.path())
            .env("XDG_CONFIG_HOME", dir.path())
            .env("HOME", dir.path()),
    );
}

#[test]
fn caddyfile_is_formatted() {
    let path = root().join("deploy/caddy/Caddyfile");
    let formatted = run_ok(Command::new("caddy").arg("fmt").arg(&path));
    let text = std::fs::read_to_string(&path).unwrap();
    if formatted != text {
        let first = text
            .lines()
            .zip(formatted.lines())
            .position(|(a, b)| a != b)
            .map_or(text.lines().count().min(formatted.lines().count()), |i| i);
        panic!(
            "deploy/caddy/Caddyfile is not as `caddy fmt` writes it: from line {}:\n  file: {:?}\n  fmt:  {:?}",
            first + 1,
            text.lines().nth(first),
            formatted.lines().nth(first)
        );
    }
}

#[test]
fn caddy_balances_perf_over_the_collectors_with_health_checks_demo_root_mounted() {
    let mut problems = vec![];
    let raw = std::fs::read_to_string(root().join("deploy/caddy/Caddyfile")).unwrap();
    let body: String = raw
        .lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let block = regex::Regex::new(
        r"(?s)handle\s+@collector\s*\{\s*uri\s+strip_prefix\s+/perf\s.*?reverse_proxy\s+([^{\n]+)\{(.*?)\}",
    )
    .unwrap();
    let m = block
        .captures(&body)
        .expect("no `handle @collector` that strips /perf with a reverse_proxy block");
    let matcher = regex::Regex::new(r"@collector\s+path_regexp\s+(\S+)")
        .unwrap()
        .captures(&body);
    if !matcher.is_some_and(|m| !m[1].contains("metrics") && m[1].contains("script")) {
        problems.push("the @collector matcher does not name only the public paths".into());
    }
    if !regex::Regex::new(r"(?s)handle\s+/perf/\*\s*\{\s*respond\s+\S.*?404")
        .unwrap()
        .is_match(&body)
    {
        problems.push("the rest of /perf/* is not answered 404".into());
    }
    let upstreams = sorted(m[1].split_whitespace().map(str::to_owned).collect());
    let want: Vec<String> = c().collectors.iter().map(|n| format!("{n}:8080")).collect();
    if upstreams != want {
        problems.push(format!(
            "upstreams {upstreams:?} are not the collectors {want:?}"
        ));
    }
    if !regex::Regex::new(r"(?m)^\s*health_uri\s+/readyz\s*$")
        .unwrap()
        .is_match(&m[2])
    {
        problems.push("no active health check `health_uri /readyz`".into());
    }
    let targets = c().get("caddy").expect("no caddy service").binds();
    if targets.get("/etc/caddy/Caddyfile").map(String::as_str) != Some("deploy/caddy/Caddyfile") {
        problems.push("caddy does not mount deploy/caddy/Caddyfile at /etc/caddy/Caddyfile".into());
    }
    let root_dir = regex::Regex::new(r"root\s+\*\s+(\S+)")
        .unwrap()
        .captures(&body);
    if root_dir.is_none_or(|r| targets.get(&r[1]).map(String::as_str) != Some("deploy/demo")) {
        problems.push("the file_server root is not deploy/demo mounted into caddy".into());
    }
    assert_no_problems(problems);
}

/// The uid and gid of a compose `user: UID:GID`, when both are numbers.
fn uid_gid(user: &str) -> Option<(u32, u32)> {
    let (u, g) = user.split_once(':')?;
    Some((u.parse().ok()?, g.parse().ok()?))
}

/// Issue 52, 5: Caddy runs as a user that is not root, with no capability (a port above
/// 1024: the Caddyfile's site and the port compose publishes to), a read-only root and
/// no-new-privileges; its volumes are handed to that user first by `caddy-volumes` (chown,
/// no network, CHOWN and DAC_READ_SEARCH only), which it waits for.
#[test]
fn caddy_runs_as_a_user_not_root_on_a_port_above_1024_without_capabilities() {
    let mut problems = vec![];
    let caddy = c().service("caddy");
    let user = caddy.str("user").unwrap_or("");
    let ids = uid_gid(user);
    if ids.is_none_or(|(u, g)| u == 0 || g == 0) {
        problems.push(format!("caddy: user {user:?}, want UID:GID, not root"));
    }
    if caddy.list("cap_drop") != ["ALL"] || !caddy.list("cap_add").is_empty() {
        problems.push(format!(
            "caddy: cap_drop {:?} cap_add {:?}, want ALL and none",
            caddy.list("cap_drop"),
            caddy.list("cap_add")
        ));
    }
    if !caddy
        .list("security_opt")
        .contains(&"no-new-privileges:true".to_owned())
    {
        problems.push("caddy: no no-new-privileges:true".into());
    }
    if caddy.get("read_only").and_then(serde_yaml::Value::as_bool) != Some(true) {
        problems.push("caddy: its root is not read-only".into());
    }
    let raw = std::fs::read_to_string(root().join("deploy/caddy/Caddyfile")).unwrap();
    let sites: Vec<u16> = raw
        .lines()
        .filter_map(|l| l.strip_prefix(':')?.strip_suffix(" {")?.parse().ok())
        .collect();
    let targets: Vec<u64> = caddy
        .get("ports")
        .and_then(serde_yaml::Value::as_sequence)
        .into_iter()
        .flatten()
        .filter_map(|p| p.get("target").and_then(serde_yaml::Value::as_u64))
        .collect();
    if sites.is_empty() || sites.iter().any(|p| *p <= 1024) {
        problems.push(format!(
            "the Caddyfile's sites listen on {sites:?}: want ports above 1024"
        ));
    }
    if targets.is_empty()
        || targets
            .iter()
            .any(|t| !sites.iter().any(|s| u64::from(*s) == *t))
    {
        problems.push(format!(
            "caddy publishes to {targets:?}, not to its sites' {sites:?}"
        ));
    }
    problems.extend(caddy_volumes_problems(caddy, user));
    assert_no_problems(problems);
}

/// `caddy-volumes` hands Caddy's named volumes to `user` and Caddy waits for it.
fn caddy_volumes_problems(caddy: Service, user: &str) -> Vec<String> {
    let mut problems = vec![];
    let Some(init) = c().get("caddy-volumes") else {
        return vec!["no service caddy-volumes".into()];
    };
    if caddy.depends_condition("caddy-volumes") != Some("service_completed_successfully") {
        problems.push("caddy: does not wait for caddy-volumes to complete successfully".into());
    }
    let named = |s: Service| -> BTreeMap<String, String> {
        s.mounts()
            .into_iter()
            .filter(|m| m.kind == "volume")
            .map(|m| (m.source, m.target))
            .collect()
    };
    let (volumes, chowned) = (named(caddy), named(init));
    let entry = init.list("entrypoint");
    let targets: BTreeSet<&String> = volumes.values().collect();
    let paths: BTreeSet<&String> = entry.iter().skip(3).collect();
    if volumes.is_empty()
        || volumes != chowned
        || entry.get(..3) != Some(&["chown".to_owned(), "-R".to_owned(), user.to_owned()][..])
        || paths != targets
    {
        problems.push(format!(
            "caddy-volumes: {entry:?} on {chowned:?}, want chown -R {user} of caddy's {volumes:?}"
        ));
    }
    let caps = init.list("cap_add");
    if init.str("network_mode") != Some("none")
        || init.list("cap_drop") != ["ALL"]
        || caps != ["CHOWN", "DAC_READ_SEARCH"]
    {
        problems.push(format!(
            "caddy-volumes: network {:?}, capabilities {caps:?}: want none, ALL dropped, CHOWN and DAC_READ_SEARCH",
            init.str("network_mode")
        ));
    }
    problems
}

#[test]
fn deploy_demo_is_demo_with_the_script_under_perf() {
    let mut problems = vec![];
    let mut names: Vec<_> = std::fs::read_dir(root().join("demo"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    for f in names {
        let f = f.to_string_lossy();
        let Ok(b) = std::fs::read(root().join("deploy/demo").join(&*f)) else {
            problems.push(format!("deploy/demo/{f} is missing (copy of demo/{f})"));
            continue;
        };
        let mut a = std::fs::read(root().join("demo").join(&*f)).unwrap();
        if f == "index.html" {
            a = String::from_utf8(a)
                .unwrap()
                .replace("src=\"__COLLECTOR__/", "src=\"/perf/")
                .into_bytes();
        }
        if a != b {
            let beyond = if f == "index.html" {
                " (beyond __COLLECTOR__ -> /perf)"
            } else {
                ""
            };
            problems.push(format!("deploy/demo/{f} differs from demo/{f}{beyond}"));
        }
    }
    let index = std::fs::read_to_string(root().join("deploy/demo/index.html")).unwrap();
    if index.contains("__COLLECTOR__") {
        problems.push("deploy/demo/index.html still has the __COLLECTOR__ placeholder".into());
    }
    assert_no_problems(problems);
}

// --------------------------------------------------------------- ClickHouse ---

#[test]
fn every_xml_file_under_deploy_parses() {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "xml") {
                out.push(p);
            }
        }
    }
    let mut files = vec![];
    walk(&root().join("deploy"), &mut files);
    assert!(!files.is_empty(), "no XML file under deploy/");
    let problems = files
        .iter()
        .filter_map(|f| {
            roxmltree::Document::parse(&xml::read(f))
                .err()
                .map(|e| format!("{}: {e}", f.display()))
        })
        .collect();
    assert_no_problems(problems);
}

#[test]
fn replica_configs_have_the_shape_the_stack_writes() {
    let sample = stack::clickhouse::sample_config();
    let doc =
        roxmltree::Document::parse(&sample).expect("the stack's sample replica config parses");
    let top: Vec<_> = doc
        .root_element()
        .children()
        .filter(|n| n.is_element())
        .collect();
    let want = shape(&top);
    let mut problems = vec![];
    each_replica_config(|name, top, files| {
        for (key, got) in shape(top) {
            if got != want[key] {
                problems.push(format!(
                    "{name} ({files}): {key} {got} != the stack's {}",
                    want[key]
                ));
            }
        }
    });
    assert_no_problems(problems);
}

#[test]
fn replica_macros_interserver_hosts_cluster_and_keeper_nodes_match_compose() {
    let keeper_port = keeper_xml(|k| text(k, "keeper_server/tcp_port"));
    let mut problems = vec![];
    let mut seen = BTreeSet::new();
    each_replica_config(|name, top, files| {
        let first = |path: &str| {
            xml::find_all_in(top.iter().copied(), path)
                .first()
                .map(|n| own_text(*n))
        };
        let rn = name.rsplit('-').next().unwrap(); // clickhouse-r1 -> r1
        let replica = first("macros/replica");
        if replica.as_deref() != Some(rn) {
            problems.push(format!(
                "{name}: macro replica {replica:?}, want {rn:?} ({files})"
            ));
        }
        if !seen.insert(replica.clone()) {
            problems.push(format!("macro replica {replica:?} is used twice"));
        }
        let host = first("interserver_http_host");
        if host.as_deref() != Some(name) {
            problems.push(format!(
                "{name}: interserver_http_host {host:?}, want the service name"
            ));
        }
        let replicas = xml::find_all_in(
            top.iter().copied(),
            "remote_servers/collector/shard/replica",
        );
        let hosts = sorted(
            replicas
                .into_iter()
                .map(|r| text(r, "host").unwrap_or_default())
                .collect(),
        );
        if hosts != c().clickhouse {
            problems.push(format!(
                "{name}: cluster collector lists {hosts:?}, want {:?}",
                c().clickhouse
            ));
        }
        let mut zk: Vec<(Option<String>, Option<String>)> =
            xml::find_all_in(top.iter().copied(), "zookeeper/node")
                .into_iter()
                .map(|n| (text(n, "host"), text(n, "port")))
                .collect();
        zk.sort();
        let want: Vec<_> = c()
            .keepers
            .iter()
            .map(|k| (Some(k.clone()), keeper_port.clone()))
            .collect();
        if zk != want {
            problems.push(format!(
                "{name}: zookeeper nodes {zk:?}, want the keepers {:?} on {keeper_port:?}",
                c().keepers
            ));
        }
        let users_at: Vec<String> = c()
            .service(name)
            .mounts()
            .into_iter()
            .filter(|m| m.kind == "bind" && m.source.ends_with("deploy/clickhouse/users.xml"))
            .map(|m| m.target)
            .collect();
        if !users_at
            .iter()
            .any(|t| t == "/etc/clickhouse-server/users.xml")
        {
            problems.push(format!(
                "{name}: deploy/clickhouse/users.xml is not mounted as the server's users.xml"
            ));
        }
    });
    assert_no_problems(problems);
}

/// The two-shard example's override, as written (its `!reset` tags kept), merge keys applied.
const SHARDS_OVERRIDE: &str = "deploy/shards/compose.shards.yaml";

/// A compose file as written (no docker-compose: anchors and `<<` merges applied by
/// `serde_yaml`, no interpolation).
fn raw_compose(rel: &str) -> serde_yaml::Value {
    let mut doc = yaml_file(rel);
    doc.apply_merge()
        .unwrap_or_else(|e| panic!("{rel}: merge keys: {e}"));
    doc
}

/// The hosts of `http://HOST:8123` URLs, comma-separated.
fn url_hosts(urls: &str) -> Vec<String> {
    urls.split(',')
        .map(|u| {
            let rest = u.trim().trim_start_matches("http://");
            rest.split([':', '/']).next().unwrap_or_default().to_owned()
        })
        .collect()
}

#[test]
fn shards_override_services_cluster_file_and_collector_shards_agree() {
    use serde_yaml::Value;
    let base = raw_compose("compose.yaml");
    let over = raw_compose(SHARDS_OVERRIDE);
    let names = |doc: &Value| -> BTreeSet<String> {
        doc["services"]
            .as_mapping()
            .expect("services")
            .keys()
            .filter_map(|k| k.as_str().map(str::to_owned))
            .collect()
    };
    let (base_names, over_names) = (names(&base), names(&over));
    let all: BTreeSet<String> = base_names.union(&over_names).cloned().collect();
    let mut problems = vec![];

    // The cluster file: shards of clickhouse-rN:9000, every one a compose service.
    let cluster = shards_cluster_file(&mut problems);
    let servers: Vec<&String> = cluster.iter().flatten().collect();
    for host in &servers {
        if !all.contains(*host) {
            problems.push(format!(
                "cluster replica {host} is no service of compose.yaml + the override"
            ));
        }
    }
    // Every ClickHouse server of either file is in the cluster.
    for (doc, file) in [(&base, "compose.yaml"), (&over, SHARDS_OVERRIDE)] {
        for (name, svc) in doc["services"].as_mapping().unwrap() {
            let name = name.as_str().unwrap();
            let image = svc["image"].as_str().unwrap_or_default();
            if image.starts_with("clickhouse/clickhouse-server")
                && !servers.iter().any(|s| *s == name)
            {
                problems.push(format!(
                    "{file}: ClickHouse server {name} is not in the cluster file"
                ));
            }
        }
    }

    // Each server: the cluster file mounted by the override, macros of its shard.
    servers_mount_the_cluster_file_and_their_macros(&base, &over, &cluster, &mut problems);
    // Every service that names ClickHouse in compose.yaml names both shards in the override,
    // without COLLECTOR_CLICKHOUSE_URLS, each shard the cluster file's replicas.
    services_name_both_shards(&base, &over, &cluster, &mut problems);
    // The new servers' data volumes are declared, with fixed names like compose.yaml's.
    for host in servers.iter().filter(|h| !base_names.contains(**h)) {
        let vol = &over["volumes"][host.as_str()]["name"];
        if vol.as_str() != Some(&format!("collector-{host}")) {
            problems.push(format!(
                "{host}: volume {host} must be named collector-{host}, is {vol:?}"
            ));
        }
    }
    assert_no_problems(problems);
}

/// The replicas (hosts) of each shard of the shards' cluster file
/// ([`stack::deploy::SHARDS_CLUSTER_XML`]); what is wrong with it (not two shards, a shard
/// without `internal_replication`, a replica on a port other than 9000) added to `problems`.
fn shards_cluster_file(problems: &mut Vec<String>) -> Vec<Vec<String>> {
    let path = root().join(stack::deploy::SHARDS_CLUSTER_XML);
    let text = xml::read(&path);
    let doc = xml::parse(&path, &text);
    let cluster: Vec<Vec<String>> = find_all(doc.root_element(), "remote_servers/collector/shard")
        .into_iter()
        .map(|shard| {
            if text_of(shard, "internal_replication") != "true" {
                problems.push("a shard without internal_replication true".to_owned());
            }
            find_all(shard, "replica")
                .into_iter()
                .map(|r| {
                    if text_of(r, "port") != "9000" {
                        problems.push(format!("replica {}: port is not 9000", text_of(r, "host")));
                    }
                    text_of(r, "host")
                })
                .collect()
        })
        .collect();
    if cluster.len() != 2 {
        problems.push(format!(
            "the cluster file has {} shards, want 2",
            cluster.len()
        ));
    }
    cluster
}

/// The source (without `./`) of the volume of compose service `svc` mounted at `target`.
fn mount(svc: &serde_yaml::Value, target: &str) -> Option<String> {
    svc["volumes"].as_sequence()?.iter().find_map(|v| {
        let v = v.as_str()?;
        let mut parts = v.split(':');
        let (src, dst) = (parts.next()?, parts.next()?);
        (dst == target).then(|| src.trim_start_matches("./").to_owned())
    })
}

/// Each server of `cluster`: the cluster file mounted by the override (`over`), and macros
/// (its `replica.xml`, of `over` or `base`) of its shard and its own replica name.
fn servers_mount_the_cluster_file_and_their_macros(
    base: &serde_yaml::Value,
    over: &serde_yaml::Value,
    cluster: &[Vec<String>],
    problems: &mut Vec<String>,
) {
    let mut replicas_seen = BTreeSet::new();
    for (j, shard) in cluster.iter().enumerate() {
        for host in shard {
            let svc = &over["services"][host.as_str()];
            let cluster_file = mount(svc, "/etc/clickhouse-server/config.d/cluster.xml");
            if cluster_file.as_deref() != Some(stack::deploy::SHARDS_CLUSTER_XML) {
                problems.push(format!(
                    "{host}: the override mounts {cluster_file:?} as config.d/cluster.xml, want {}",
                    stack::deploy::SHARDS_CLUSTER_XML
                ));
            }
            let target = "/etc/clickhouse-server/config.d/replica.xml";
            let Some(macros) =
                mount(svc, target).or_else(|| mount(&base["services"][host.as_str()], target))
            else {
                problems.push(format!("{host}: no config.d/replica.xml mounted"));
                continue;
            };
            let mpath = root().join(&macros);
            let mtext = xml::read(&mpath);
            let mdoc = xml::parse(&mpath, &mtext);
            let shard_macro = text_of(mdoc.root_element(), "macros/shard");
            if shard_macro != (j + 1).to_string() {
                problems.push(format!(
                    "{host} ({macros}): macro shard {shard_macro:?}, want {}",
                    j + 1
                ));
            }
            let replica = text_of(mdoc.root_element(), "macros/replica");
            if !replicas_seen.insert(replica.clone()) || !host.ends_with(&format!("-{replica}")) {
                problems.push(format!(
                    "{host} ({macros}): macro replica {replica:?} reused or not its name"
                ));
            }
        }
    }
}

/// Every service of `base` that names ClickHouse names both shards in the override (`over`),
/// `!reset`s `COLLECTOR_CLICKHOUSE_URLS`, and lists each shard with the replicas of
/// `cluster`, as `http://HOST:8123` URLs.
fn services_name_both_shards(
    base: &serde_yaml::Value,
    over: &serde_yaml::Value,
    cluster: &[Vec<String>],
    problems: &mut Vec<String>,
) {
    use serde_yaml::Value;
    let want_names = ["default", "b"];
    for (name, svc) in base["services"].as_mapping().unwrap() {
        let name = name.as_str().unwrap();
        if svc["environment"]
            .get("COLLECTOR_CLICKHOUSE_URLS")
            .is_none()
        {
            continue;
        }
        let env = &over["services"][name]["environment"];
        match env.get("COLLECTOR_CLICKHOUSE_URLS") {
            Some(Value::Tagged(t)) if t.tag == "reset" => {}
            other => problems.push(format!(
                "{name}: the override must `!reset` COLLECTOR_CLICKHOUSE_URLS, has {other:?}"
            )),
        }
        let Some(shards) = env
            .get("COLLECTOR_CLICKHOUSE_SHARDS")
            .and_then(Value::as_str)
        else {
            problems.push(format!(
                "{name}: no COLLECTOR_CLICKHOUSE_SHARDS in the override"
            ));
            continue;
        };
        let parsed: Vec<(&str, Vec<String>)> = shards
            .split(';')
            .filter_map(|part| part.split_once('='))
            .map(|(n, urls)| (n.trim(), url_hosts(urls)))
            .collect();
        let got_names: Vec<&str> = parsed.iter().map(|(n, _)| *n).collect();
        if got_names != want_names {
            problems.push(format!("{name}: shards {got_names:?}, want {want_names:?}"));
        }
        for ((shard, hosts), want) in parsed.iter().zip(cluster) {
            if sorted(hosts.clone()) != sorted(want.clone()) {
                problems.push(format!(
                    "{name}: shard {shard} lists {hosts:?}, the cluster file's shard has {want:?}"
                ));
            }
        }
        for url in shards.split([';', ',']) {
            let url = url.split_once('=').map_or(url, |(_, u)| u);
            if !url.starts_with("http://") || !url.ends_with(":8123") {
                problems.push(format!("{name}: {url} is not http://HOST:8123"));
            }
        }
    }
}

/// The trimmed text at `path` below `node`, "" when missing.
fn text_of(node: roxmltree::Node, path: &str) -> String {
    text(node, path).unwrap_or_default()
}

#[test]
fn keeper_raft_members_are_the_keeper_services_ids_from_their_environment() {
    let mut problems = vec![];
    keeper_xml(|k| {
        let servers: BTreeMap<Option<String>, Option<String>> =
            find_all(k, "keeper_server/raft_configuration/server")
                .into_iter()
                .map(|s| (text(s, "id"), text(s, "hostname")))
                .collect();
        let hostnames = sorted(
            servers
                .values()
                .map(|h| h.clone().unwrap_or_default())
                .collect(),
        );
        if hostnames != c().keepers || c().keepers.len() != 3 {
            problems.push(format!(
                "raft servers {servers:?} are not the three keeper services {:?}",
                c().keepers
            ));
        }
        let env_name = find(k, "keeper_server/server_id")
            .and_then(|s| s.attribute("from_env"))
            .expect("keeper_server/server_id must come from_env");
        for name in &c().keepers {
            let got = c().service(name).env().get(env_name).cloned();
            let member = servers.get(&got).cloned().flatten();
            if member.as_deref() != Some(name) {
                problems.push(format!(
                    "{name}: {env_name}={got:?} is the raft id of {member:?}"
                ));
            }
        }
    });
    assert_no_problems(problems);
}

/// `var`'s value in service `name`'s resolved environment, or a problem naming it.
fn env_of(name: &str, var: &str, problems: &mut Vec<String>) -> String {
    let value = c()
        .service(name)
        .env()
        .get(var)
        .cloned()
        .unwrap_or_default();
    if value.is_empty() {
        problems.push(format!("{name}: {var} is not in its environment"));
    }
    value
}

/// Issue 52, 5: every replica asks HTTP Basic authentication on its interserver port (user and
/// password, the password from its environment: .env's CLICKHOUSE_INTERSERVER_PASSWORD, the same
/// on all) and logs in to Keeper with a digest identity `clickhouse:` + .env's
/// CLICKHOUSE_KEEPER_PASSWORD (ClickHouse then gives every node it creates that identity's ACL).
#[test]
fn replicas_ask_interserver_credentials_and_log_in_to_keeper_with_a_digest() {
    let mut problems = vec![];
    let mut seen = BTreeSet::new();
    each_replica_config(|name, top, files| {
        let creds = xml::find_all_in(top.iter().copied(), "interserver_http_credentials");
        let user = creds
            .first()
            .and_then(|c| text(*c, "user"))
            .unwrap_or_default();
        let pw_var = creds
            .first()
            .and_then(|c| find(*c, "password"))
            .and_then(|p| p.attribute("from_env"));
        let identity = xml::find_all_in(top.iter().copied(), "zookeeper/identity");
        let id_var = identity.first().and_then(|i| i.attribute("from_env"));
        match (user.is_empty(), pw_var) {
            (false, Some(var)) => {
                let pw = env_of(name, var, &mut problems);
                seen.insert(format!("interserver {user}:{pw}"));
            }
            _ => problems.push(format!(
                "{name} ({files}): no <interserver_http_credentials> with a user and a password from_env"
            )),
        }
        match id_var {
            Some(var) => {
                let id = env_of(name, var, &mut problems);
                // compose makes it of .env's password: "check" in the placeholder env.
                if id != "clickhouse:check" {
                    problems.push(format!(
                        "{name}: {var} is {id:?}, want clickhouse:${{CLICKHOUSE_KEEPER_PASSWORD}}"
                    ));
                }
                seen.insert(format!("identity {id}"));
            }
            None => problems.push(format!(
                "{name} ({files}): no <zookeeper><identity from_env=...>"
            )),
        }
    });
    if seen.len() != 2 {
        problems.push(format!(
            "the replicas differ in their credentials: {seen:?}"
        ));
    }
    // The two-shard example: its cluster file and its new replicas the same.
    let shards = std::fs::read_to_string(root().join("deploy/shards/cluster.xml")).unwrap();
    let cluster = std::fs::read_to_string(root().join("deploy/clickhouse/cluster.xml")).unwrap();
    for element in ["<interserver_http_credentials>", "<identity from_env="] {
        let line = |t: &str| t.lines().find(|l| l.contains(element)).map(str::to_owned);
        if line(&shards).is_none() || line(&shards) != line(&cluster) {
            problems.push(format!(
                "deploy/shards/cluster.xml lacks {element} as cluster.xml has it"
            ));
        }
    }
    let raw = raw_compose("deploy/shards/compose.shards.yaml");
    let env = &raw["x-clickhouse-b"]["environment"];
    for var in [
        "CLICKHOUSE_INTERSERVER_PASSWORD",
        "CLICKHOUSE_KEEPER_IDENTITY",
    ] {
        if env[var].as_str().is_none_or(|v| !v.contains(":?set ")) {
            problems.push(format!(
                "compose.shards.yaml's replicas: {var} is not required from .env"
            ));
        }
    }
    assert_no_problems(problems);
}

/// Keeper takes from any client only the read-only four-letter words, `mntr` (its health
/// check) among them.
#[test]
fn keeper_answers_only_read_only_four_letter_words() {
    let list = keeper_xml(|root| text(root, "keeper_server/four_letter_word_white_list"));
    let words: BTreeSet<String> = list
        .unwrap_or_default()
        .split(',')
        .map(|w| w.trim().to_owned())
        .collect();
    let read_only = ["ruok", "mntr", "srvr", "stat", "isro", "conf", "envi"];
    let beyond: Vec<&String> = words
        .iter()
        .filter(|w| !read_only.contains(&w.as_str()))
        .collect();
    assert!(
        words.contains("mntr") && beyond.is_empty(),
        "deploy/keeper/keeper.xml's four_letter_word_white_list {words:?}: want mntr and no word beyond {read_only:?}"
    );
}

/// No replica starts before `credentials` has checked the passwords (it refuses a
/// placeholder): each depends on it with service_completed_successfully.
#[test]
fn replicas_start_only_once_credentials_passed() {
    let mut problems = vec![];
    for name in &c().clickhouse {
        if c().service(name).depends_condition("credentials")
            != Some("service_completed_successfully")
        {
            problems.push(format!(
                "{name}: does not depend on credentials with service_completed_successfully"
            ));
        }
    }
    assert_no_problems(problems);
}

// --------------------------------------------------------------------- edge ---

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

// ------------------------------------------------------------ the Dockerfile ---

/// The licence notices in the image: the project's LICENSE and the generated third-party
/// file, copied from the build context by the runtime stage.
const LICENSE_FILES: [&str; 2] = ["LICENSE", "collector/THIRD-PARTY-LICENSES"];
const LICENSE_DIR: &str = "/usr/share/doc/collector/";

#[test]
fn image_gets_the_licence_notices_in_usr_share_doc_collector() {
    let mut problems = vec![];
    let stages = dockerfile::stages();
    let ignore = Dockerignore::read();
    let mut copied = BTreeMap::new();
    for (i, a) in &stages.last().expect("a stage").ins {
        if i == "COPY" && !a.contains("--from") {
            let words = copy_words(a);
            for src in &words[..words.len() - 1] {
                copied.insert(src.to_string(), words[words.len() - 1].to_owned());
            }
        }
    }
    for f in LICENSE_FILES {
        let base = f.rsplit('/').next().unwrap();
        match copied.get(f) {
            None => problems.push(format!(
                "the runtime stage does not COPY {f} (licence notices)"
            )),
            Some(dst) if dst != LICENSE_DIR && *dst != format!("{LICENSE_DIR}{base}") => {
                problems.push(format!("{f} is copied to {dst}, want {LICENSE_DIR}"))
            }
            Some(_) if !dockerfile::exists(f) => problems.push(format!("{f} does not exist")),
            Some(_) if ignore.excluded(f) => problems.push(format!(
                "{f} is left out of the build context by .dockerignore"
            )),
            Some(_) => {}
        }
    }
    if let Ok(body) = std::fs::read_to_string(root().join("collector/THIRD-PARTY-LICENSES")) {
        for folder in ["crawler-user-agents", "uap-core"] {
            if !body.contains(&format!("collector/assets/{folder}/LICENSE")) {
                problems.push(format!(
                    "collector/THIRD-PARTY-LICENSES lacks the licence of collector/assets/{folder}"
                ));
            }
        }
    }
    assert_no_problems(problems);
}

#[test]
fn third_party_licenses_file_is_current() {
    run_ok(
        Command::new("python3")
            .arg(root().join("scripts/third-party-licenses.py"))
            .arg("--check")
            .current_dir(root()),
    );
}

/// With a Docker engine (`docker info` answers), the Dockerfile is built (once per run) and
/// the static Dockerfile checks give way to that; returns whether it was built.
fn built_by_docker() -> bool {
    static BUILT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *BUILT.get_or_init(|| {
        if !docker_engine_answers() {
            eprintln!("note: no container engine answers (docker info): the Dockerfile is checked statically");
            return false;
        }
        run_ok(Command::new("docker").args(["build", "-t", "collector:check"]).arg(root()));
        true
    })
}

fn runtime_problems(fi: &[(String, String)]) -> Vec<String> {
    let mut problems = vec![];
    let of = |name: &str| -> Vec<&str> {
        fi.iter()
            .filter(|(i, _)| i == name)
            .map(|(_, a)| a.as_str())
            .collect()
    };
    let user = of("USER")
        .last()
        .map(|u| u.split(':').next().unwrap_or("").to_owned());
    match user.as_deref() {
        None | Some("root" | "0") => {
            problems.push(format!("runtime USER {user:?}: must be a non-root user"))
        }
        Some(u) if !u.chars().all(|c| c.is_ascii_digit()) => problems.push(format!(
            "runtime USER {u}: use a fixed numeric uid (volumes are chowned by number)"
        )),
        _ => {}
    }
    let hc = of("HEALTHCHECK")
        .last()
        .map(|h| h.split_once("CMD").map_or("", |(_, c)| c.trim()).to_owned());
    let probe: Option<Vec<String>> = hc.as_deref().and_then(|c| serde_json::from_str(c).ok());
    if probe != Some(vec!["/usr/local/bin/collector".into(), "probe".into()]) {
        problems.push(format!(
            "HEALTHCHECK {hc:?}: want CMD [\"/usr/local/bin/collector\", \"probe\"]"
        ));
    }
    if of("STOPSIGNAL") != ["SIGTERM"] {
        problems.push("STOPSIGNAL SIGTERM is missing".into());
    }
    let env: BTreeMap<String, String> = of("ENV")
        .into_iter()
        .flat_map(dockerfile::env_pairs)
        .collect();
    let spool = env.get("COLLECTOR_SPOOL_DIR");
    let vols: Vec<String> = of("VOLUME")
        .into_iter()
        .flat_map(|a| {
            serde_json::from_str::<Vec<String>>(a)
                .unwrap_or_else(|_| a.split_whitespace().map(str::to_owned).collect())
        })
        .collect();
    if !spool.is_some_and(|s| vols.contains(s)) {
        problems.push(format!(
            "no VOLUME for the spool (COLLECTOR_SPOOL_DIR={spool:?}, VOLUME {vols:?})"
        ));
    }
    // The operations listener is private (issue 52, 5): the image binds it to loopback and
    // does not EXPOSE it; compose.yaml opens it on its own network for Prometheus.
    for (var, want) in [
        ("COLLECTOR_LISTEN", "0.0.0.0:8080"),
        ("COLLECTOR_ADMIN_LISTEN", "127.0.0.1:9464"),
    ] {
        if env.get(var).map(String::as_str) != Some(want) {
            problems.push(format!("{var}={:?}, want {want}", env.get(var)));
        }
    }
    let exposed: Vec<&str> = of("EXPOSE")
        .into_iter()
        .flat_map(|a| a.split_whitespace())
        .collect();
    if exposed != ["8080"] {
        problems.push(format!(
            "EXPOSE {exposed:?}, want 8080 only (never the operations listener)"
        ));
    }
    if !of("COPY")
        .iter()
        .any(|a| a.contains("--from=builder") && a.contains("/usr/local/bin/collector"))
    {
        problems.push(
            "the runtime does not COPY --from=builder the binary to /usr/local/bin/collector"
                .into(),
        );
    }
    problems
}

#[test]
fn dockerfile_multi_stage_non_root_probe_healthcheck_stopsignal_spool_volume() {
    if built_by_docker() {
        return;
    }
    let stages = dockerfile::stages();
    assert!(
        stages.len() >= 2,
        "want a multi-stage build, found {} stage(s)",
        stages.len()
    );
    let (builder, last) = (&stages[0], &stages[stages.len() - 1]);
    let mut problems = vec![];
    if builder.alias.as_deref() != Some("builder") || !builder.from.starts_with("rust:") {
        problems.push(format!(
            "first stage is FROM {} AS {:?}, want a rust image AS builder",
            builder.from, builder.alias
        ));
    }
    if !builder
        .ins
        .iter()
        .any(|(i, a)| i == "RUN" && a.contains("cargo build --release -p collector --locked"))
    {
        problems
            .push("the builder never runs `cargo build --release -p collector --locked`".into());
    }
    if !(last.from.starts_with("debian:bookworm-slim") || last.from.contains("distroless/cc")) {
        problems.push(format!(
            "runtime stage FROM {}: want debian:bookworm-slim or distroless cc",
            last.from
        ));
    }
    problems.extend(runtime_problems(&last.ins));
    // Cache-friendly order: only manifests are copied before the first cargo build.
    let mut before = vec![];
    for (i, a) in &builder.ins {
        if i == "RUN" && a.contains("cargo build") {
            break;
        }
        if i == "COPY" {
            let words = copy_words(a);
            before.extend(words[..words.len() - 1].iter().map(|w| w.to_string()));
        }
    }
    let stray: Vec<&String> = before
        .iter()
        .filter(|p| !matches!(p.rsplit('/').next(), Some("Cargo.toml" | "Cargo.lock")))
        .collect();
    if before.is_empty() || !stray.is_empty() {
        problems.push(format!(
            "the first cargo build should see only manifests (dependency layer), but it sees {stray:?} of {before:?}"
        ));
    }
    assert_no_problems(problems);
}

#[test]
fn dockerfile_copy_sources_and_compiled_in_files_are_in_the_build_context() {
    if built_by_docker() {
        return;
    }
    let mut problems = vec![];
    let ignore = Dockerignore::read();
    for must_go in ["target", ".stack", ".git", "spool", ".env", "deploy"] {
        if !ignore.excluded(&format!("{must_go}/x")) && !ignore.excluded(must_go) {
            problems.push(format!(
                ".dockerignore lets {must_go} into the build context"
            ));
        }
    }
    let mut sources = vec![];
    for (i, a) in &dockerfile::stages()[0].ins {
        if i == "COPY" && !a.contains("--from") {
            let words: Vec<&str> = a.split_whitespace().collect();
            sources.extend(
                words[..words.len() - 1]
                    .iter()
                    .filter(|w| !w.starts_with("--"))
                    .map(|w| w.to_string()),
            );
        }
    }
    for s in &sources {
        if !dockerfile::exists(s) {
            problems.push(format!("COPY {s}: does not exist"));
        } else if files_under(s).iter().all(|f| ignore.excluded(f)) {
            // A folder counts as sent when some file in it is (an allow-list re-includes parts).
            problems.push(format!(
                "COPY {s}: left out of the build context by .dockerignore"
            ));
        }
    }
    let in_builder = |rel: &str| {
        sources
            .iter()
            .any(|s| rel == s || rel.starts_with(&format!("{}/", s.trim_end_matches('/'))))
    };
    let include = regex::Regex::new(r#"include_(?:str|bytes)!\(\s*"([^"]+)""#).unwrap();
    let mut found = 0;
    for file in files_under("collector/src")
        .into_iter()
        .filter(|f| f.ends_with(".rs"))
    {
        let body = std::fs::read_to_string(root().join(&file)).unwrap();
        let dir = file.rsplit_once('/').map_or("", |(d, _)| d);
        for m in include.captures_iter(&body) {
            found += 1;
            let rel = rel_to_root(&format!("{dir}/{}", &m[1]));
            if !dockerfile::exists(&rel) {
                problems.push(format!("{file} includes {rel}, which does not exist"));
            } else if ignore.excluded(&rel) {
                problems.push(format!("{rel} (compiled in) is left out by .dockerignore"));
            } else if !in_builder(&rel) {
                problems.push(format!(
                    "{rel} (compiled in) is not copied into the builder"
                ));
            }
        }
    }
    if found == 0 {
        problems.push("no include_str! found in collector/src (expected the schema files)".into());
    }
    assert_no_problems(problems);
}

#[test]
fn dockerfile_dependency_layer_loads_the_workspace_from_the_manifests() {
    if built_by_docker() {
        return;
    }
    // The builder's first `cargo build` RUN replayed in a copy of what the COPY lines before
    // it bring in, with `cargo` standing for `cargo metadata --locked`: the stand-in sources
    // must let Cargo load the workspace, and Cargo.lock must fit the manifests.
    let dir = tempfile::tempdir().unwrap();
    let (src, bin) = (dir.path().join("src"), dir.path().join("bin"));
    std::fs::create_dir_all(&bin).unwrap();
    let mut run = None;
    for (i, a) in &dockerfile::stages()[0].ins {
        if i == "COPY" {
            let words = copy_words(a);
            let dst = words[words.len() - 1];
            for s in &words[..words.len() - 1] {
                let to = if dst == "." || dst.ends_with('/') {
                    format!(
                        "{}/{}",
                        dst.trim_end_matches('/'),
                        s.rsplit('/').next().unwrap()
                    )
                } else {
                    dst.to_owned()
                };
                let to = src.join(to);
                std::fs::create_dir_all(to.parent().unwrap()).unwrap();
                std::fs::copy(root().join(s), &to).unwrap_or_else(|e| panic!("COPY {s}: {e}"));
            }
        } else if i == "RUN" && a.contains("cargo build") {
            run = Some(a.clone());
            break;
        }
    }
    let run = run.expect("no RUN with cargo build in the builder stage");
    // An absolute path: the shim below comes first on PATH and is itself named `cargo` (a bare
    // name would run the shim again and again).
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| {
        let which = run_ok(Command::new("sh").args(["-c", "command -v cargo"]));
        let path = which.trim().to_owned();
        assert!(
            path.starts_with('/'),
            "cargo is not on PATH as a file: {path:?}"
        );
        path
    });
    let err = dir.path().join("meta.err");
    // Stands for "cargo build": load the workspace with the lock file as it is (offline when
    // the registry index is cached).
    let shim = format!(
        "#!/bin/sh\n\"{cargo}\" metadata --format-version 1 --locked --offline >/dev/null 2>\"{e}\" && exit 0\n\
         grep -q offline \"{e}\" || {{ cat \"{e}\" >&2; exit 1; }}\n\
         exec \"{cargo}\" metadata --format-version 1 --locked >/dev/null\n",
        e = err.display()
    );
    std::fs::write(bin.join("cargo"), shim).unwrap();
    run_ok(Command::new("chmod").arg("755").arg(bin.join("cargo")));
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    run_ok(
        Command::new("sh")
            .args(["-ec", &run])
            .current_dir(&src)
            .env("PATH", path),
    );
}

// ----------------------------------------------------------------- postgres ---

#[test]
fn postgres_scripts_parse() {
    let mut n = 0;
    for e in std::fs::read_dir(root().join("deploy/postgres")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "sh") {
            n += 1;
            run_ok(Command::new("bash").arg("-n").arg(&p));
        }
    }
    assert!(n > 0, "no deploy/postgres/*.sh");
}

/// psql as `user` over TCP to `db` on 127.0.0.1:`port` with `password`.
fn psql_tcp(port: u16, db: &str, user: &str, password: &str) -> Command {
    let mut cmd = Command::new(format!("{PG_BIN}/psql"));
    cmd.args(["-X", "-qtA", "-v", "ON_ERROR_STOP=1"])
        .arg(format!(
            "host=127.0.0.1 port={port} dbname={db} user={user} connect_timeout=5"
        ))
        .env("PGPASSWORD", password);
    cmd
}

/// The primary: initdb, started with the deploy configs, then init-primary.sh as the image's
/// entrypoint runs it (over the unix socket, as POSTGRES_USER).
fn primary(pg: &ScratchPg, port: u16) {
    pg.initdb("primary");
    pg.start("primary", port);
    run_ok(
        Command::new("runuser")
            .args(["-u", "postgres", "--", "env"])
            .arg(format!(
                "PATH={PG_BIN}:{}",
                std::env::var("PATH").unwrap_or_default()
            ))
            .arg(format!("PGHOST={}", pg.path().display()))
            .arg(format!("PGPORT={port}"))
            .args([
                "POSTGRES_USER=postgres",
                "COLLECTOR_DB_PASSWORD=collector-pw",
                "REPLICATION_PASSWORD=replication-pw",
            ])
            .arg("bash")
            .arg(pg.path().join("init-primary.sh")),
    );
}

/// The collectors' login: SCRAM over TCP, the repository's schema applied as that user (what
/// `collector migrate` does), and no superuser login over TCP.
fn collector_login(port: u16) {
    let mut files: Vec<_> = std::fs::read_dir(root().join("schema/postgres"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "sql"))
        .collect();
    files.sort();
    for f in files {
        run_ok(
            psql_tcp(port, "collector", "collector", "collector-pw")
                .arg("-f")
                .arg(f),
        );
    }
    let key = run_ok(
        psql_tcp(port, "collector", "collector", "collector-pw").args([
            "-c",
            "INSERT INTO sites (key) VALUES ('check') RETURNING key",
        ]),
    );
    assert_eq!(
        key.trim(),
        "check",
        "the collector's INSERT into sites over TCP"
    );
    let superuser = output(psql_tcp(port, "postgres", "postgres", "x").args(["-c", "SELECT 1"]));
    assert!(
        !superuser.status.success(),
        "the postgres superuser can log in over TCP"
    );
}

/// The standby cloned by standby-entrypoint.sh (run as root, as in the container: the
/// script itself switches to postgres), started, streaming from the primary.
fn standby(pg: &ScratchPg, primary: u16, port: u16) {
    run_ok(
        Command::new("env")
            .arg(format!(
                "PATH={PG_BIN}:{}",
                std::env::var("PATH").unwrap_or_default()
            ))
            .arg(format!("PGDATA={}", pg.data("standby").display()))
            .arg("PRIMARY_HOST=127.0.0.1")
            .arg(format!("PRIMARY_PORT={primary}"))
            .args([
                "REPLICATION_USER=replicator",
                "REPLICATION_PASSWORD=replication-pw",
                "REPLICATION_SLOT=standby",
            ])
            .arg("bash")
            .arg(pg.path().join("standby-entrypoint.sh"))
            .arg("true"),
    );
    assert!(
        pg.data("standby").join("standby.signal").exists(),
        "no standby.signal: pg_basebackup -R did not run"
    );
    pg.start("standby", port);
    let limit = Duration::from_secs(10);
    pg.wait_for(port, "postgres", "SELECT pg_is_in_recovery()", "t", limit);
    let streaming = "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'";
    pg.wait_for(primary, "postgres", streaming, "1", limit);
    let slot = "SELECT active FROM pg_replication_slots WHERE slot_name = 'standby'";
    pg.wait_for(primary, "postgres", slot, "t", limit);
    // A row written on the primary after the clone reaches the standby.
    pg.sql(
        primary,
        "collector",
        "INSERT INTO sites (key) VALUES ('streamed')",
    )
    .expect("INSERT on the primary");
    pg.wait_for(
        port,
        "collector",
        "SELECT count(*) FROM sites WHERE key = 'streamed'",
        "1",
        limit,
    );
}

#[test]
fn postgres_primary_and_streaming_standby_run_with_the_deploy_configs() {
    let pg = ScratchPg::new();
    let ports = stack::ports::alloc(2).expect("two loopback ports");
    primary(&pg, ports[0]);
    collector_login(ports[0]);
    standby(&pg, ports[0], ports[1]);
    let unclean = pg.stop_all("fast");
    assert!(
        unclean.is_empty(),
        "servers that did not stop cleanly: {unclean:?}"
    );
}
