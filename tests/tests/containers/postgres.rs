//! PostgreSQL 15 run with `deploy/postgres`'s files: a primary and a streaming standby.

use super::*;

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
