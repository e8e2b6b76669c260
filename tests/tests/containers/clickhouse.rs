//! ClickHouse's and Keeper's XML under `deploy/`: replica configs, macros, the shards'
//! override, Keeper's members and credentials.

use super::*;

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
