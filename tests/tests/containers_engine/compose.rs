//! compose.yaml's services on podman's Docker API: one-shots, the standby, collectors
//! delivering, replication and ZooKeeper closed, the write user confined.

use super::*;

/// compose.yaml's services on podman's API socket: the project, its derived file, the ports.
struct Services<'a> {
    podman: &'static Podman,
    project: &'a Project,
    api: &'a ApiService,
    file: std::path::PathBuf,
    ports: BTreeMap<String, u16>,
    stack: &'a Stack,
}

impl Services<'_> {
    /// `docker-compose -p PROJECT -f FILE ARGS` on the API socket.
    fn compose(&self, args: &[&str]) -> std::process::Command {
        let file = self.file.display().to_string();
        let mut all = vec!["-p", &self.project.name, "-f", &file];
        all.extend_from_slice(args);
        self.api.compose(&all)
    }

    /// The container of service `service` (docker-compose v1's name).
    fn container(&self, service: &str) -> String {
        format!("{}_{service}_1", self.project.name)
    }

    /// psql as `postgres` inside service `service`'s container, on its loopback port.
    fn psql(&self, service: &str, db: &str, sql: &str) -> String {
        let port = self.ports[service].to_string();
        let c = self.container(service);
        self.podman.run(&[
            "exec",
            "-u",
            "postgres",
            &c,
            "psql",
            "-qtA",
            "-h",
            "/var/run/postgresql",
            "-p",
            &port,
            "-U",
            "postgres",
            "-d",
            db,
            "-c",
            sql,
        ])
    }
}

/// The value of `var` in compose.yaml's resolved environment of service `service` (the
/// placeholder .env of the checks: every password `check`).
fn compose_env(service: &str, var: &str) -> String {
    let env = Compose::resolved().service(service).env();
    env.get(var)
        .cloned()
        .unwrap_or_else(|| panic!("no {var} in {service}'s environment in compose.yaml"))
}

/// The SHA-256 of `password` in lower-case hex, as users.xml takes it.
fn sha256_hex(password: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(password.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The ClickHouse users of compose.yaml's collector-image services and their passwords (from
/// .env, here the placeholder `check`, which `credentials` writes into their password files):
/// the collectors' write user `collector` and the one-shots' `migrate`.
fn compose_clickhouse_users() -> [(&'static str, String); 2] {
    [
        (
            "collector",
            compose_env("credentials", "CLICKHOUSE_COLLECTOR_PASSWORD"),
        ),
        (
            "migrate",
            compose_env("credentials", "CLICKHOUSE_MIGRATE_PASSWORD"),
        ),
    ]
}

/// The collectors log in to ClickHouse as `collector`, the one-shots as `migrate`, each with
/// its password from .env. The loopback replicas are ClickHouse 18.16, whose users.xml has no
/// grants: each gets those users (the same passwords, by their SHA-256, from loopback) from
/// the stack's users template; `default` stays for the checks' own queries. Their queries
/// alone go to system.query_log (log_queries). (The grants are checked on 26.x:
/// [`write_user_is_confined`].)
fn clickhouse_collector_users(stack: &Stack) {
    for (user, password) in compose_clickhouse_users() {
        let started = Instant::now();
        for r in stack.replicas() {
            r.add_user(user, &sha256_hex(&password), &["log_queries=1"])
                .unwrap_or_else(|e| panic!("adding user {user} to a replica: {e}"));
        }
        for r in stack.replicas() {
            let url = r.url();
            wait_for(
                &format!("replica {} to let `{user}` in", r.i()),
                60 * SECOND,
                SECOND / 2,
                || select1_as(&url, user, &password),
            );
            assert!(
                select1_as(&url, user, &format!("not-{password}")).is_err(),
                "replica {} takes a wrong password",
                r.i()
            );
        }
        eprintln!(
            "note: user {user} on the 3 replicas in {:.1?}",
            started.elapsed()
        );
    }
}

/// Before the loopback replicas start: each gets, as `chI/config.d/hardening.xml`, what
/// deploy/clickhouse/cluster.xml adds to compose's replicas ([`stack::server_config::hardening_xml`]):
/// interserver credentials (user `interserver`) and a ZooKeeper digest identity, with compose's
/// values of CLICKHOUSE_INTERSERVER_PASSWORD and CLICKHOUSE_KEEPER_IDENTITY.
fn harden_replicas(dir: &std::path::Path, replicas: usize) {
    use stack::server_config::{hardening_xml, Value};
    let password = compose_env("clickhouse-r1", "CLICKHOUSE_INTERSERVER_PASSWORD");
    let identity = compose_env("clickhouse-r1", "CLICKHOUSE_KEEPER_IDENTITY");
    let text = hardening_xml(
        stack::users::Root::Yandex,
        Value::Text(&password),
        Value::Text(&identity),
    );
    for i in 1..=replicas {
        let conf_d = dir.join(format!("ch{i}/config.d"));
        std::fs::create_dir_all(&conf_d).unwrap();
        std::fs::write(conf_d.join("hardening.xml"), &text).unwrap();
    }
}

/// `docker-compose up -d`: the services in dependency order, each condition
/// (service_healthy, service_completed_successfully) waited for as on Docker (600 s at most).
fn compose_up(s: &Services) {
    let file = s.file.display().to_string();
    let out = output(
        std::process::Command::new("timeout")
            .args([
                "600",
                "docker-compose",
                "-p",
                &s.project.name,
                "-f",
                &file,
                "up",
                "-d",
                "--no-build",
            ])
            .env("DOCKER_HOST", format!("unix://{}", s.api.socket.display())),
    );
    if out.status.success() {
        return;
    }
    let filter = format!("label=com.docker.compose.project={}", s.project.name);
    let ps = s
        .podman
        .try_run(&[
            "ps",
            "-a",
            "--filter",
            &filter,
            "--format",
            "{{.Names}} {{.Status}}",
        ])
        .1;
    let mut logs = String::new();
    for c in ps.lines().filter_map(|l| l.split_whitespace().next()) {
        let (_, out, err) = s.podman.try_run(&["logs", "--tail", "8", c]);
        logs.push_str(&format!("--- podman logs {c}\n{out}{err}"));
    }
    panic!(
        "docker-compose up failed ({}):\n{}{}\n{ps}\n{logs}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// credentials, migrate, retention and seed exit 0; site demo registered; the password files 0600 uid
/// 10001.
fn one_shots_done(s: &Services) {
    // seed may still run: nothing waits for it.
    for service in ["credentials", "migrate", "retention", "seed"] {
        let c = s.container(service);
        let out = output(
            std::process::Command::new("timeout")
                .args(["60", "podman", "wait", &c])
                .env("CONTAINERS_CONF", s.podman.conf_file()),
        );
        let status = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(out.status.success(), "{service} did not exit within 60 s");
        assert_eq!(status, "0", "{service}'s exit status");
    }
    let sites = s.psql("postgres-primary", "collector", "SELECT key FROM sites");
    assert!(
        sites.lines().any(|l| l == "demo"),
        "site demo is not registered: {sites:?}"
    );
    // The password files, the collectors' and the one-shots' (each in a volume of its own):
    // the collector's uid alone may read them.
    for volume in ["collector-secrets", "migrate-secrets"] {
        let volume = format!("{}-{volume}:/s:ro", s.project.name);
        let stat = s.podman.run(&[
            "run",
            "--rm",
            "--network",
            "none",
            "-v",
            &volume,
            "--entrypoint",
            "stat",
            IMAGE,
            "-c",
            "%n: owner %u, mode %a, %s bytes",
            "/s/clickhouse-password",
        ]);
        assert!(
            stat.contains("owner 10001, mode 600,"),
            "the password file in {volume}: {stat}"
        );
    }
}

/// postgres-standby, cloned by standby-entrypoint.sh, streams from postgres-primary.
fn standby_streams(s: &Services) {
    let streaming = "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'";
    wait_for(
        "postgres-standby streaming from postgres-primary",
        60 * SECOND,
        SECOND,
        || match s.psql("postgres-primary", "postgres", streaming).as_str() {
            "1" => Ok(()),
            n => Err(format!("{n} streaming")),
        },
    );
    let recovery = s.psql("postgres-standby", "postgres", "SELECT pg_is_in_recovery()");
    assert_eq!(recovery, "t", "postgres-standby is not in recovery");
}

/// collector-a and collector-b healthy; beacons to each land in ClickHouse, inserted as
/// ClickHouse's `collector` (only its queries are logged).
fn collectors_deliver(s: &Services) -> Vec<String> {
    let mut ids = vec![];
    for service in ["collector-a", "collector-b"] {
        let c = s.container(service);
        wait_for(
            &format!("{service} healthy"),
            90 * SECOND,
            SECOND,
            || match s.podman.inspect(&c, "{{.State.Health.Status}}").as_str() {
                "healthy" => Ok(()),
                other => Err(other.to_owned()),
            },
        );
        let user = s.podman.inspect(&c, "{{.Config.User}}");
        let ro = s.podman.inspect(&c, "{{.HostConfig.ReadonlyRootfs}}");
        eprintln!("note: {service}: healthy; user {user}, read-only root {ro}");
        ids.extend(send_beacons(s.ports[service], "demo", 50));
    }
    let urls: Vec<String> = s.stack.replicas().iter().map(|r| r.url()).collect();
    wait_for(
        "100 measurements of site demo in ClickHouse, each once under FINAL",
        60 * SECOND,
        SECOND,
        || stored_once(&urls[0], "demo", &ids),
    );
    let (mut inserted, mut created) = (0, 0);
    for url in &urls {
        clickhouse(url, "SYSTEM FLUSH LOGS").unwrap();
        let sql = "SELECT sum(written_rows) FROM system.query_log \
                   WHERE user = 'collector' AND type = 2 AND query LIKE 'INSERT INTO %measurements%'";
        let n: i64 = clickhouse(url, sql).unwrap().parse().unwrap();
        // `migrate` made the table as `migrate`; the collectors made nothing.
        let sql =
            "SELECT countIf(user = 'migrate'), countIf(user = 'collector') FROM system.query_log \
                   WHERE type = 2 AND query LIKE 'CREATE TABLE%measurements%'";
        let made = clickhouse(url, sql).unwrap();
        let (by_migrate, by_collector) = made.split_once('\t').unwrap_or(("0", "?"));
        eprintln!("note: {url}: {n} rows inserted as collector; CREATE TABLE as migrate {by_migrate}, as collector {by_collector}");
        assert_eq!(by_collector, "0", "{url}: the collectors made the table");
        inserted += n;
        created += by_migrate.parse::<i64>().unwrap();
    }
    assert!(
        inserted >= ids.len() as i64,
        "{inserted} rows inserted as collector, want at least {}",
        ids.len()
    );
    assert!(
        created >= 1,
        "no CREATE TABLE of measurements ran as migrate"
    );
    ids
}

/// Issue 52, 5: the replicas' interserver port answers a part fetch without compose's
/// interserver credentials (or with a wrong password) 401, and with them something else (the
/// part asked for does not exist); the collectors' rows `ids` (inserted into r1 and r2) reach
/// every replica, r3 by fetches alone, through it (60 s at most). Then [`zookeeper_is_closed`].
fn replication_is_closed(s: &Services, ids: &[String]) {
    let password = compose_env("clickhouse-r1", "CLICKHOUSE_INTERSERVER_PASSWORD");
    let user = stack::server_config::INTERSERVER_USER;
    for r in s.stack.replicas() {
        let port = r.interserver_port();
        let bare = interserver_fetch(port, None).unwrap();
        let wrong = interserver_fetch(port, Some((user, "not-the-password"))).unwrap();
        let right = interserver_fetch(port, Some((user, &password))).unwrap();
        eprintln!(
            "note: replica {} interserver port: without credentials {bare:?}; wrong {wrong:?}; right {right:?}",
            r.i()
        );
        assert_eq!(
            bare.0,
            401,
            "replica {}: a fetch without credentials",
            r.i()
        );
        assert_eq!(
            wrong.0,
            401,
            "replica {}: a fetch with a wrong password",
            r.i()
        );
        assert_ne!(
            right.0,
            401,
            "replica {}: a fetch with the credentials",
            r.i()
        );
    }
    for r in s.stack.replicas() {
        let url = r.url();
        wait_for(
            &format!("the collectors' {} rows on replica {}", ids.len(), r.i()),
            60 * SECOND,
            SECOND,
            || stored_once(&url, "demo", ids),
        );
    }
    zookeeper_is_closed(s);
}

/// A ZooKeeper client without the replicas' digest (compose's CLICKHOUSE_KEEPER_IDENTITY) gets
/// NOAUTH listing the replicas of the table `migrate` made or creating a node among them, as
/// one with a wrong digest does; with it, it lists r1, r2, r3.
fn zookeeper_is_closed(s: &Services) {
    let identity = compose_env("clickhouse-r1", "CLICKHOUSE_KEEPER_IDENTITY");
    let url = s.stack.replica(1).url();
    let sql = "SELECT zookeeper_path FROM system.replicas WHERE database = 'collector' AND table = 'measurements'";
    let path = clickhouse(&url, sql).unwrap();
    assert!(
        path.starts_with("/clickhouse/tables/"),
        "the table's ZooKeeper path: {path:?}"
    );
    let replicas = format!("{path}/replicas");
    let port = s.stack.zookeeper().port();
    let mut anonymous = zk::Session::open(port).unwrap();
    let listed = anonymous.children(&replicas).unwrap();
    let created = anonymous.create(&format!("{replicas}/intruder")).unwrap();
    let mut wrong = zk::Session::open(port).unwrap();
    wrong
        .add_digest("clickhouse:not-the-password")
        .unwrap()
        .unwrap();
    let wrong_listed = wrong.children(&replicas).unwrap();
    let mut own = zk::Session::open(port).unwrap();
    own.add_digest(&identity).unwrap().unwrap();
    let own_listed = own.children(&replicas).unwrap().map(|mut v| {
        v.sort();
        v
    });
    eprintln!("note: ZooKeeper {replicas}: without the digest list {listed:?}, create {created:?}; wrong digest {wrong_listed:?}; with it {own_listed:?}");
    assert_eq!(
        listed,
        Err(NO_AUTH),
        "listing {replicas} without the digest"
    );
    assert_eq!(
        created,
        Err(NO_AUTH),
        "creating a node under {replicas} without the digest"
    );
    assert_eq!(
        wrong_listed,
        Err(NO_AUTH),
        "listing {replicas} with a wrong digest"
    );
    assert_eq!(own_listed, Ok(vec!["r1".into(), "r2".into(), "r3".into()]));
}

/// Issue 52, 5: the write user `collector` as deploy/clickhouse/users.xml ships it (the one
/// template, stack/src/deploy.rs; here from loopback, its password compose's by SHA-256) on a
/// ClickHouse 26.x server, which has grants (the loopback replicas, 18.16, have none): with a
/// table `migrate` made in `collector`, its INSERT and SELECT work and its `DROP TABLE`,
/// `TRUNCATE` and `ALTER ... DELETE` are refused (ACCESS_DENIED); `migrate` may drop it.
fn write_user_is_confined() {
    use stack::users::{Password, LOOPBACK};
    let [(writer, writer_pw), (migrate, migrate_pw)] = compose_clickhouse_users();
    let dashboard_pw = compose_env("clickhouse-r1", "CLICKHOUSE_DASHBOARD_PASSWORD");
    let hex = [&migrate_pw, &writer_pw, &dashboard_pw].map(|p| sha256_hex(p));
    let passwords = stack::deploy::Passwords {
        migrate: Password::Sha256Hex(&hex[0]),
        collector: Password::Sha256Hex(&hex[1]),
        dashboard: Password::Sha256Hex(&hex[2]),
    };
    let users = stack::deploy::users(passwords, &LOOPBACK);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let profiles = [stack::users::DASHBOARD_PROFILE];
    let server = runtime.block_on(Ch26Server::start_with(&[], &profiles, &users));
    let url = server.url.as_str();
    let table = "collector.write_check";
    for sql in [
        "CREATE DATABASE IF NOT EXISTS collector".to_owned(),
        format!("CREATE TABLE {table} (x UInt8) ENGINE = ReplacingMergeTree ORDER BY x"),
    ] {
        clickhouse_as(url, migrate, &migrate_pw, &sql).unwrap();
    }
    let insert = clickhouse_as(
        url,
        writer,
        &writer_pw,
        &format!("INSERT INTO {table} VALUES (7)"),
    );
    assert_eq!(insert.as_deref(), Ok(""), "the write user's INSERT");
    let count = clickhouse_as(
        url,
        writer,
        &writer_pw,
        &format!("SELECT count() FROM {table}"),
    );
    assert_eq!(count.as_deref(), Ok("1"), "the write user's SELECT");
    for sql in [
        format!("DROP TABLE {table}"),
        format!("TRUNCATE TABLE {table}"),
        format!("ALTER TABLE {table} DELETE WHERE 1"),
    ] {
        let answer = clickhouse_as(url, writer, &writer_pw, &sql);
        eprintln!("note: 26.x, the write user's {sql}: {answer:?}");
        assert!(
            answer.as_ref().is_err_and(|e| e.contains("ACCESS_DENIED")),
            "the write user's {sql:?} must be refused (ACCESS_DENIED): {answer:?}"
        );
    }
    let dropped = clickhouse_as(url, migrate, &migrate_pw, &format!("DROP TABLE {table}"));
    assert_eq!(dropped.as_deref(), Ok(""), "`migrate` drops the table");
}

/// `docker-compose down -v` of the project when dropped.
struct Down<'a>(&'a Services<'a>);

impl Drop for Down<'_> {
    fn drop(&mut self) {
        let _ = self.0.compose(&["down", "-v", "--timeout", "10"]).output();
    }
}

#[test]
#[ignore = "podman: scripts/check-containers.sh --engine"]
fn compose_services_run_on_podmans_docker_api() {
    let podman = podman();
    let stack = Stack::own_prepared(3, |dir| harden_replicas(dir, 3));
    let project = Project::new("compose");
    let dir = tempfile::tempdir().unwrap();
    let api = ApiService::start(podman, &dir.path().join("podman.sock"));
    let version = run_ok(&mut api.compose(&["version", "--short"]));
    eprintln!(
        "note: docker-compose {} on podman's API socket",
        version.trim()
    );
    clickhouse_collector_users(&stack);
    let p = stack::ports::alloc(6).expect("loopback ports");
    let names = [
        "postgres-primary",
        "postgres-standby",
        "collector-a",
        "collector-b",
        "collector-a-admin",
        "collector-b-admin",
    ];
    let ports: BTreeMap<String, u16> = names.iter().map(|n| n.to_string()).zip(p).collect();
    let local = Local {
        image: IMAGE.into(),
        postgres_image: PG_STANDIN.into(),
        volume_prefix: project.name.clone(),
        nofile: podman.nofile,
        nproc: NPROC,
        ports: ports.clone(),
        clickhouse: stack
            .replicas()
            .iter()
            .map(|r| (format!("clickhouse-r{}", r.i()), r.url()))
            .collect(),
    };
    let derived = derive(&Compose::resolved().doc, &local);
    // As JSON (which YAML reads): serde_yaml writes the string `no` (restart) unquoted, which
    // docker-compose's YAML 1.1 parser reads as false.
    let file = dir.path().join("compose.engine.json");
    std::fs::write(&file, serde_json::to_string_pretty(&derived).unwrap()).unwrap();
    let services = Services {
        podman,
        project: &project,
        api: &api,
        file,
        ports,
        stack: &stack,
    };
    let _down = Down(&services);
    let _ticker = HealthTicker::start(&project.name);
    compose_up(&services);
    one_shots_done(&services);
    standby_streams(&services);
    let ids = collectors_deliver(&services);
    // What issue 52, 5 added to this check, timed.
    let started = Instant::now();
    replication_is_closed(&services, &ids);
    write_user_is_confined();
    eprintln!(
        "note: interserver, ZooKeeper and write-user checks took {:.1?}",
        started.elapsed()
    );
    let c = services.container("collector-a");
    stopped_in_grace(&c, || {
        run_ok(&mut services.compose(&["stop", "collector-a"]));
    });
}
