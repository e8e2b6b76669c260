//! Readers of `deploy/`'s files for the static container checks: YAML files, ClickHouse's
//! `users.xml` and its grants, the replicas' merged `config.d` files and their shape, Keeper's
//! config, IPv4 networks.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use super::compose::{rel_to_root, Compose};
use super::xml::{self, find, find_all, own_text, tag, text};
use crate::common::root;

/// A shard of a cluster: its internal_replication and the fields of its replicas.
pub type Shard = (Option<String>, BTreeSet<String>);

/// An IPv4 network `a.b.c.d/n` as (address, prefix); panics on anything else.
pub fn ipv4_net(s: &str) -> (Ipv4Addr, u32) {
    let (a, n) = s.trim().split_once('/').unwrap_or((s.trim(), "32"));
    let a: Ipv4Addr = a.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
    let n: u32 = n.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
    assert!(
        n <= 32 && u32::from(a) & !(u32::MAX.checked_shl(32 - n).unwrap_or(0)) == 0,
        "{s}: host bits set"
    );
    (a, n)
}

/// The root element of deploy/clickhouse/users.xml, given to `f`.
pub fn with_users_xml<T>(f: impl FnOnce(roxmltree::Node) -> T) -> T {
    let path = root().join("deploy/clickhouse/users.xml");
    let text = xml::read(&path);
    let doc = xml::parse(&path, &text);
    f(doc.root_element())
}

/// A user's `<grants><query>GRANT ... ON x</query>` as (privileges, target); a query of
/// another shape is `Err(query)`.
pub fn grants_of(user: roxmltree::Node) -> Vec<Result<(BTreeSet<String>, String), String>> {
    let re = regex::Regex::new(r"(?is)^\s*GRANT\s+(.+?)\s+ON\s+(\S+)\s*$").unwrap();
    let ws = regex::Regex::new(r"\s+").unwrap();
    find_all(user, "grants/query")
        .into_iter()
        .map(|q| {
            let q = q.text().unwrap_or("");
            let m = re.captures(q).ok_or_else(|| q.trim().to_owned())?;
            let privs = m[1]
                .split(',')
                .map(|p| ws.replace_all(p.trim(), " ").to_uppercase())
                .collect();
            Ok((privs, m[2].to_owned()))
        })
        .collect()
}

/// The environment variable a user's password is read from (`from_env`).
pub fn password_env(user: roxmltree::Node) -> Option<String> {
    [
        "password",
        "password_sha256_hex",
        "password_double_sha1_hex",
    ]
    .iter()
    .filter_map(|t| find(user, t))
    .find_map(|e| e.attribute("from_env").map(str::to_owned))
}

/// A YAML file of the repository.
pub fn yaml_file(rel: &str) -> serde_yaml::Value {
    let text = std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// What must match between the stack's replica config and the deploy one: macro names, the
/// shard macro, ZooKeeper node fields, clusters (per shard: internal_replication and replica
/// fields).
pub fn shape(top: &[roxmltree::Node]) -> BTreeMap<&'static str, String> {
    let tags = |nodes: Vec<roxmltree::Node>| -> BTreeSet<String> {
        nodes
            .into_iter()
            .flat_map(|n| n.children().filter(|c| c.is_element()).map(tag))
            .collect()
    };
    let clusters: BTreeMap<String, Vec<Shard>> =
        xml::find_all_in(top.iter().copied(), "remote_servers/*")
            .into_iter()
            .map(|cl| {
                let shards = find_all(cl, "shard")
                    .into_iter()
                    .map(|sh| {
                        (
                            text(sh, "internal_replication"),
                            tags(find_all(sh, "replica")),
                        )
                    })
                    .collect();
                (tag(cl), shards)
            })
            .collect();
    let macros: BTreeSet<String> = xml::find_all_in(top.iter().copied(), "macros/*")
        .into_iter()
        .map(tag)
        .collect();
    let shard = xml::find_all_in(top.iter().copied(), "macros/shard")
        .first()
        .map(|n| own_text(*n));
    BTreeMap::from([
        ("macros", format!("{macros:?}")),
        ("shard macro", format!("{shard:?}")),
        (
            "zookeeper node",
            format!(
                "{:?}",
                tags(xml::find_all_in(top.iter().copied(), "zookeeper/node"))
            ),
        ),
        ("clusters", format!("{clusters:?}")),
    ])
}

/// Calls `f(service, top-level elements, files)` for each ClickHouse service with the merged
/// children of the config.d files it mounts (cluster.xml and its rN.xml); panics when an
/// element is in more than one of them.
pub fn each_replica_config(mut f: impl FnMut(&str, &[roxmltree::Node], &str)) {
    let c = Compose::resolved();
    for name in &c.clickhouse {
        let files: Vec<String> = c
            .service(name)
            .mounts()
            .into_iter()
            .filter(|m| {
                m.kind == "bind" && m.target.starts_with("/etc/clickhouse-server/config.d/")
            })
            .map(|m| rel_to_root(&m.source))
            .collect();
        let texts: Vec<String> = files.iter().map(|r| xml::read(&root().join(r))).collect();
        let docs: Vec<roxmltree::Document> = files
            .iter()
            .zip(&texts)
            .map(|(r, t)| xml::parse(&root().join(r), t))
            .collect();
        let mut top: Vec<roxmltree::Node> = vec![];
        for d in &docs {
            for child in d.root_element().children().filter(|n| n.is_element()) {
                assert!(
                    !top.iter().any(|t| t.tag_name() == child.tag_name()),
                    "{name}: <{}> is in more than one config.d file",
                    tag(child)
                );
                top.push(child);
            }
        }
        f(name, &top, &files.join(", "));
    }
}

/// Keeper's `deploy/keeper/keeper.xml` root element, given to `f`.
pub fn keeper_xml<T>(f: impl FnOnce(roxmltree::Node) -> T) -> T {
    let path = root().join("deploy/keeper/keeper.xml");
    let text = xml::read(&path);
    f(xml::parse(&path, &text).root_element())
}

/// Every file under `rel` (itself when a file), relative to the repository.
pub fn files_under(rel: &str) -> Vec<String> {
    let path = root().join(rel);
    if !path.is_dir() {
        return vec![rel.to_owned()];
    }
    let mut out = vec![];
    for e in std::fs::read_dir(&path).unwrap() {
        let name = e.unwrap().file_name();
        out.extend(files_under(&format!(
            "{}/{}",
            rel.trim_end_matches('/'),
            name.to_string_lossy()
        )));
    }
    out
}
