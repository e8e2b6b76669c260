//! ClickHouse's users in `deploy/`: `default` on loopback, `migrate`, `collector` and
//! `dashboard` confined to their rights, and how each service logs in.

use super::*;

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
