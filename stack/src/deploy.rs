//! The ClickHouse files of the compose stack under `deploy/clickhouse/` that are rendered from
//! the stack's templates (`stack render-deploy` writes them; a unit test fails while a
//! committed file differs): `users.xml`, from [`crate::users`]; `cluster.xml` and each
//! replica's `rN.xml`, from the sections of [`crate::server_config`] that the stack's own
//! replicas are made of (ZooKeeper, the cluster, macros); and the two-shard example under
//! `deploy/shards/` (beside its hand-written `compose.shards.yaml`): `cluster.xml`, the
//! cluster `collector` of both shards, and the second shard's replicas' `r4.xml` and `r5.xml`.

use std::path::Path;

use crate::server_config::{
    cluster_of_shards_xml, interserver_credentials_xml, macros_xml, remote_servers_xml,
    shard_macros_xml, with_identity, zookeeper_xml, Value,
};
use crate::users::{self, Password, Profile, Root, User, UsersXml};
use crate::Result;

/// The compose stack's network (`x-subnet` in `compose.yaml`; `tests/tests/containers/`
/// checks that they agree): where the collectors and Grafana log in to ClickHouse from.
pub const SUBNET: &str = "172.30.80.0/24";

/// The environment variable a replica reads the `collector` user's password from (`.env`).
pub const COLLECTOR_PASSWORD_ENV: &str = "CLICKHOUSE_COLLECTOR_PASSWORD";

/// The environment variable a replica reads the `migrate` user's password from (`.env`).
pub const MIGRATE_PASSWORD_ENV: &str = "CLICKHOUSE_MIGRATE_PASSWORD";

/// The environment variable a replica reads the interserver password from (`.env`;
/// [`crate::server_config::interserver_credentials_xml`]).
pub const INTERSERVER_PASSWORD_ENV: &str = "CLICKHOUSE_INTERSERVER_PASSWORD";

/// The environment variable a replica reads its Keeper identity from: `clickhouse:PASSWORD`,
/// which compose.yaml makes of `CLICKHOUSE_KEEPER_PASSWORD` (`.env`;
/// [`crate::server_config::with_identity`]).
pub const KEEPER_IDENTITY_ENV: &str = "CLICKHOUSE_KEEPER_IDENTITY";

/// The environment variable a replica reads the `dashboard` user's password from (`.env`).
pub const DASHBOARD_PASSWORD_ENV: &str = "CLICKHOUSE_DASHBOARD_PASSWORD";

/// The path of the rendered `users.xml` in the repository.
pub const USERS_XML: &str = "deploy/clickhouse/users.xml";

const USERS_COMMENT: &str = "Who gets into ClickHouse: the whole users.xml of every replica
     (compose.yaml mounts it over /etc/clickhouse-server/users.xml and sets
     CLICKHOUSE_SKIP_USER_SETUP=1, so that the image's entrypoint leaves users alone and this
     file alone decides). Rendered by `scripts/stack.sh render-deploy` from the template in
     stack/src/users.rs and stack/src/deploy.rs, where each right is explained: do not edit it
     here (a unit test fails while the two differ).

     default    every right, no password, from each server's own loopback only: the compose
                healthcheck (wget inside the container) and an operator's
                `docker compose exec clickhouse-r1 clickhouse-client`. No other container and
                no process on the host reaches it (compose.yaml publishes no ClickHouse port).
     migrate    the one-shot commands (migrate, seed, retention, sites purge), from the
                stack's network only, password CLICKHOUSE_MIGRATE_PASSWORD (.env; compose.yaml
                hands it to the one-shots as a file); on the database `collector` only: create,
                alter (add columns, delete, TTL), drop and optimize tables, and read the
                system tables those need (docs/deployment.md, \"ClickHouse users\").
     collector  the serving collectors (the write user), from the stack's network only,
                password CLICKHOUSE_COLLECTOR_PASSWORD (.env; a file of their own): on
                `collector` only SELECT, INSERT and CREATE (the prober's CREATE ... IF NOT
                EXISTS on a replica that returns without the table), and read the system tables
                `serve` reads; no ALTER, no DROP, no DELETE.
     dashboard  Grafana's ClickHouse data source: SELECT on `collector` only, readonly=1 (no
                setting changed but max_execution_time, which the data source's driver sends),
                from the stack's network only, password CLICKHOUSE_DASHBOARD_PASSWORD (.env).

     The passwords are read from the server's environment (from_env; compose.yaml passes them
     from .env and refuses to start without them). Beware: a server started with this file but
     without a variable gives that user an EMPTY password (measured on 26.9), so set both
     wherever the file is used. The subnet must be the one in compose.yaml (x-subnet);
     tests/tests/containers/ checks that they agree, and all the above.";

/// The passwords of the compose stack's users (but `default`, which has none).
#[derive(Debug, Clone, Copy)]
pub struct Passwords<'a> {
    /// The migrate user's ([`users::migrate`]).
    pub migrate: Password<'a>,
    /// The write user's ([`users::collector`]).
    pub collector: Password<'a>,
    /// The dashboards' user's ([`users::dashboard`]).
    pub dashboard: Password<'a>,
}

/// The users of the compose stack's replicas with `passwords` and from `networks`: `default`
/// (no password, loopback, every right), then [`users::migrate`], [`users::collector`] and
/// [`users::dashboard`]. The tests run these on a ClickHouse 26.x server with loopback
/// networks and SHA-256 passwords.
pub fn users<'a>(passwords: Passwords<'a>, networks: &'a [&'a str]) -> [User<'a>; 4] {
    [
        User::DEFAULT,
        users::migrate(passwords.migrate, networks),
        users::collector(passwords.collector, networks),
        users::dashboard(passwords.dashboard, networks),
    ]
}

/// The profiles of the compose stack's replicas: `default` without settings (the server's
/// defaults) and [`users::DASHBOARD_PROFILE`].
pub const PROFILES: [Profile<'static>; 2] = [
    Profile {
        name: "default",
        settings: &[],
        changeable_in_readonly: &[],
    },
    users::DASHBOARD_PROFILE,
];

/// The text of `deploy/clickhouse/users.xml`: [`PROFILES`] and [`users`] with the passwords
/// from [`MIGRATE_PASSWORD_ENV`], [`COLLECTOR_PASSWORD_ENV`] and [`DASHBOARD_PASSWORD_ENV`]
/// and the network [`SUBNET`].
pub fn users_xml() -> String {
    let networks = [SUBNET];
    let passwords = Passwords {
        migrate: Password::FromEnv(MIGRATE_PASSWORD_ENV),
        collector: Password::FromEnv(COLLECTOR_PASSWORD_ENV),
        dashboard: Password::FromEnv(DASHBOARD_PASSWORD_ENV),
    };
    let users = users(passwords, &networks);
    UsersXml {
        root: Root::ClickHouse,
        comment: USERS_COMMENT,
        profiles: &PROFILES,
        users: &users,
    }
    .render()
}

/// The path of the rendered `cluster.xml` in the repository.
pub const CLUSTER_XML: &str = "deploy/clickhouse/cluster.xml";

/// The paths of the rendered replica files in the repository: `deploy/clickhouse/rN.xml`.
pub const REPLICA_XML: [&str; 3] = [
    "deploy/clickhouse/r1.xml",
    "deploy/clickhouse/r2.xml",
    "deploy/clickhouse/r3.xml",
];

/// The compose stack's replicas: `clickhouse-r1..r3` (compose service names).
const REPLICAS: usize = 3;

const CLUSTER_COMMENT: &str =
    "<!-- Shared by the three ClickHouse replicas (mounted as config.d/cluster.xml); each replica's
     own rN.xml adds its macros and the host name it advertises to the others.
     Rendered by `scripts/stack.sh render-deploy` from the sections the stack's own replicas
     are made of (stack/src/server_config.rs, stack/src/deploy.rs): do not edit it here (a
     unit test fails while the two differ). One shard of replicas in the cluster `collector`,
     internal_replication on (the replicated table copies the data, not the Distributed
     engine), and the coordination service under <zookeeper>, here the three-node ClickHouse
     Keeper ensemble. -->
";

/// The `<zookeeper>` section of the compose stack's replicas: Keeper's three nodes
/// (`keeper-N:9181`, session 30 s, operations 10 s) and the identity from
/// [`KEEPER_IDENTITY_ENV`], with a comment saying what it does.
fn keeper_xml() -> String {
    let keepers: Vec<(String, u16)> = (1..=3).map(|i| (format!("keeper-{i}"), 9181)).collect();
    format!(
        "{KEEPER_COMMENT}{}",
        with_identity(
            &zookeeper_xml(&keepers, 30_000, Some(10_000)),
            Value::FromEnv(KEEPER_IDENTITY_ENV)
        )
    )
}

const KEEPER_COMMENT: &str =
    "    <!-- Keeper's digest authentication: each replica logs in as clickhouse:PASSWORD
         (CLICKHOUSE_KEEPER_IDENTITY, which compose.yaml makes of CLICKHOUSE_KEEPER_PASSWORD in
         .env), and every node it creates gets the ACL of that identity alone: another client
         on the network gets NOAUTH reading or changing the replication metadata. -->
";

const INTERSERVER_COMMENT: &str = "
    <!-- Part fetches on the interserver port 9009 take HTTP Basic authentication: a request
         without user `interserver` and CLICKHOUSE_INTERSERVER_PASSWORD (.env) answers 401.
         The replicas send them when they fetch from each other. -->
";

/// The text of `deploy/clickhouse/cluster.xml`: [`keeper_xml`], the cluster of
/// `clickhouse-rN:9000` replacing the image's example clusters, the interserver port 9009 with
/// its credentials (password from [`INTERSERVER_PASSWORD_ENV`]) and the memory share of three
/// replicas on one machine.
pub fn cluster_xml() -> String {
    let replicas: Vec<(String, u16)> = (1..=REPLICAS)
        .map(|i| (format!("clickhouse-r{i}"), 9000))
        .collect();
    format!(
        "<?xml version=\"1.0\"?>\n{CLUSTER_COMMENT}<clickhouse>\n{}\n    <!-- replace: drop the example clusters of the image's default config.xml. -->\n{}{INTERSERVER_COMMENT}{}{CLUSTER_TAIL}",
        keeper_xml(),
        remote_servers_xml(&replicas, true),
        interserver_credentials_xml(Value::FromEnv(INTERSERVER_PASSWORD_ENV)),
    )
}

const CLUSTER_TAIL: &str = "
    <!-- The image listens on all addresses already (config.d/docker_related_config.xml).
         Replicas fetch parts from each other on the interserver port 9009. -->
    <interserver_http_port>9009</interserver_http_port>

    <!-- The three replicas share one machine in this file; on separate machines, raise it. -->
    <max_server_memory_usage_to_ram_ratio>0.3</max_server_memory_usage_to_ram_ratio>
</clickhouse>
";

/// The text of `deploy/clickhouse/rN.xml` for replica `i` (1-based): its macros (replica
/// `rI`), the host it advertises for part fetches and its display name, both
/// `clickhouse-rI`.
pub fn replica_xml(i: usize) -> String {
    format!(
        "<?xml version=\"1.0\"?>
<!-- ClickHouse replica r{i} (mounted as config.d/replica.xml of service clickhouse-r{i}).
     Rendered by `scripts/stack.sh render-deploy` (stack/src/deploy.rs): do not edit it here.
     The macros fill the {{shard}} and {{replica}} placeholders of the replicated table's
     ZooKeeper path and replica name in schema/clickhouse/002_measurements.sql. -->
<clickhouse>
{}    <!-- What this replica registers in Keeper as its address for part fetches: the compose
         service name, which the other replicas resolve on the stack's network (the default,
         the container's host name, is a random id). -->
    <interserver_http_host>clickhouse-r{i}</interserver_http_host>
    <display_name>clickhouse-r{i}</display_name>
</clickhouse>
",
        macros_xml(&format!("r{i}"))
    )
}

/// The path of the two-shard example's rendered `cluster.xml` in the repository.
pub const SHARDS_CLUSTER_XML: &str = "deploy/shards/cluster.xml";

/// The paths of the rendered files of the second shard's replicas (`clickhouse-r4`,
/// `clickhouse-r5`) in the repository.
pub const SHARD_B_REPLICA_XML: [&str; 2] = ["deploy/shards/r4.xml", "deploy/shards/r5.xml"];

/// The two-shard example's shards: the collector's shard name (`COLLECTOR_CLICKHOUSE_SHARDS`
/// in `deploy/shards/compose.shards.yaml`), the `{shard}` macro of its replicas, and their
/// numbers `N` (service `clickhouse-rN`, macro `{replica}` = `rN`). The first is
/// compose.yaml's one shard as it is (its replicas keep macro shard 1 and their data).
pub const SHARDS: [(&str, &str, &[usize]); 2] = [("default", "1", &[1, 2, 3]), ("b", "2", &[4, 5])];

const SHARDS_CLUSTER_COMMENT: &str =
    "<!-- The two-shard example (deploy/shards/compose.shards.yaml): mounted as
     config.d/cluster.xml of all five ClickHouse servers in place of deploy/clickhouse/cluster.xml.
     Rendered by `scripts/stack.sh render-deploy` (stack/src/deploy.rs): do not edit it here (a
     unit test fails while the two differ). The cluster `collector` of two shards, each of
     replicas of its own ReplicatedReplacingMergeTree (internal_replication on): shard 1 is
     compose.yaml's clickhouse-r1..r3 (collector shard `default`, macro shard 1, as before),
     shard 2 the new clickhouse-r4 and clickhouse-r5 (collector shard `b`, macro shard 2, so
     their tables have Keeper paths of their own). The Distributed table measurements_all reads
     over both. The same three-node Keeper ensemble coordinates both shards. -->
";

/// The text of `deploy/shards/cluster.xml`: [`cluster_xml`] with the cluster `collector` of
/// both shards of [`SHARDS`] and the memory share of five servers on one machine.
pub fn shards_cluster_xml() -> String {
    let shards: Vec<Vec<(String, u16)>> = SHARDS
        .iter()
        .map(|(_, _, replicas)| {
            replicas
                .iter()
                .map(|i| (format!("clickhouse-r{i}"), 9000))
                .collect()
        })
        .collect();
    format!(
        "<?xml version=\"1.0\"?>\n{SHARDS_CLUSTER_COMMENT}<clickhouse>\n{}\n    <!-- replace: drop the example clusters of the image's default config.xml. -->\n{}{INTERSERVER_COMMENT}{}{}",
        keeper_xml(),
        cluster_of_shards_xml("collector", &shards, true, true),
        interserver_credentials_xml(Value::FromEnv(INTERSERVER_PASSWORD_ENV)),
        CLUSTER_TAIL
            .replace("The three replicas share", "The five servers share")
            .replace("<max_server_memory_usage_to_ram_ratio>0.3<", "<max_server_memory_usage_to_ram_ratio>0.18<"),
    )
}

/// The text of `deploy/shards/rN.xml` for the second shard's replica `i` (4 or 5): as
/// [`replica_xml`], with macro shard 2.
pub fn shard_b_replica_xml(i: usize) -> String {
    let (_, shard, _) = SHARDS[1];
    format!(
        "<?xml version=\"1.0\"?>
<!-- ClickHouse replica r{i} of shard 2 (collector shard `b`) of the two-shard example (mounted
     as config.d/replica.xml of service clickhouse-r{i} by deploy/shards/compose.shards.yaml).
     Rendered by `scripts/stack.sh render-deploy` (stack/src/deploy.rs): do not edit it here.
     The macros fill the {{shard}} and {{replica}} placeholders of the replicated table's
     ZooKeeper path and replica name in schema/clickhouse/002_measurements.sql. -->
<clickhouse>
{}    <interserver_http_host>clickhouse-r{i}</interserver_http_host>
    <display_name>clickhouse-r{i}</display_name>
</clickhouse>
",
        shard_macros_xml(shard, &format!("r{i}"))
    )
}

/// Every rendered file: its path in the repository and its text.
pub fn files() -> Vec<(&'static str, String)> {
    let mut files = vec![(USERS_XML, users_xml()), (CLUSTER_XML, cluster_xml())];
    for (i, path) in REPLICA_XML.iter().enumerate() {
        files.push((path, replica_xml(i + 1)));
    }
    files.push((SHARDS_CLUSTER_XML, shards_cluster_xml()));
    for (path, i) in SHARD_B_REPLICA_XML.iter().zip(SHARDS[1].2) {
        files.push((path, shard_b_replica_xml(*i)));
    }
    files
}

/// Writes every rendered file under `repo` (the repository's root) whose text differs; returns
/// the paths written (relative to `repo`).
///
/// Errors: a file that could not be read or written.
pub fn render(repo: &Path) -> Result<Vec<&'static str>> {
    let mut written = Vec::new();
    for (path, text) in files() {
        if write_on_change(&repo.join(path), &text)? {
            written.push(path);
        }
    }
    Ok(written)
}

/// Writes `text` to `path` unless the file holds it already; whether it wrote.
fn write_on_change(path: &Path, text: &str) -> Result<bool> {
    if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(false);
    }
    if let Some(dir) = path.parent() {
        fs_err::create_dir_all(dir)?;
    }
    fs_err::write(path, text)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_deploy_file_is_the_rendered_template() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for (path, text) in files() {
            let committed = std::fs::read_to_string(repo.join(path)).unwrap();
            assert!(
                committed == text,
                "{path} is not what the template renders: run \
                 `scripts/stack.sh render-deploy` and commit the result"
            );
        }
    }

    #[test]
    fn a_deploy_replica_has_its_macros_and_host() {
        let text = replica_xml(2);
        assert!(text.contains("<shard>1</shard>\n        <replica>r2</replica>"));
        assert!(text.contains("<interserver_http_host>clickhouse-r2</interserver_http_host>"));
        let cluster = cluster_xml();
        assert!(cluster.contains("<node><host>keeper-3</host><port>9181</port></node>"));
        assert!(cluster.contains("<remote_servers replace=\"true\">"));
        assert!(cluster.contains("<replica><host>clickhouse-r3</host><port>9000</port></replica>"));
        assert!(cluster.contains(
            "        <identity from_env=\"CLICKHOUSE_KEEPER_IDENTITY\"/>\n    </zookeeper>\n"
        ));
        assert!(cluster.contains("    <interserver_http_credentials>\n        <user>interserver</user>\n        <password from_env=\"CLICKHOUSE_INTERSERVER_PASSWORD\"/>\n"));
        let shards = shards_cluster_xml();
        for hardening in ["<identity from_env=", "<interserver_http_credentials>"] {
            assert!(shards.contains(hardening), "{hardening} in {shards}");
        }
    }

    #[test]
    fn the_two_shard_example_has_both_shards_and_shard_2_macros() {
        let cluster = shards_cluster_xml();
        let r = |i: usize| {
            format!("                <replica><host>clickhouse-r{i}</host><port>9000</port></replica>\n")
        };
        let shard_1 = format!("            <shard>\n                <internal_replication>true</internal_replication>\n{}{}{}            </shard>\n", r(1), r(2), r(3));
        let shard_2 = format!("            <shard>\n                <internal_replication>true</internal_replication>\n{}{}            </shard>\n", r(4), r(5));
        assert!(cluster.contains(&format!(
            "    <remote_servers replace=\"true\">\n        <collector>\n{shard_1}{shard_2}        </collector>\n"
        )));
        assert!(cluster.contains("<max_server_memory_usage_to_ram_ratio>0.18<"));
        assert!(cluster.contains("<node><host>keeper-2</host><port>9181</port></node>"));
        let r5 = shard_b_replica_xml(5);
        assert!(r5.contains("<shard>2</shard>\n        <replica>r5</replica>"));
        assert!(r5.contains("<interserver_http_host>clickhouse-r5</interserver_http_host>"));
    }
}
