//! `up`, `down` and `status` of a whole [`Stack`].

use std::path::Path;
use std::time::Instant;

use crate::ctx::{log, Ctx};
use crate::env::Env;
use crate::error::{Error, Result};
use crate::handles::{signal_named, Action};
use crate::postgres::{self, Pg};
use crate::MAX_REPLICAS;
use crate::{
    ch26, checked_dir, clickhouse, holds_stack, ports, process, zookeeper, Stack, UpOptions,
};

impl Stack {
    /// Starts whatever part of the stack in `dir` is not running (creating `dir`), waits
    /// until every server answers (each wait bounded by `STACK_READY_TIMEOUT`, 60 s), and
    /// writes `DIR/stack.env`. Idempotent; restarts from the data in `dir`, keeping the
    /// previous ports when they are free. Frozen servers are noted, not waited for.
    ///
    /// Errors: a missing binary (run `scripts/stack.sh install`), a server that exits or does
    /// not answer in time (with its log's last lines), a bad `dir` or replica count.
    pub fn up(dir: &Path, options: UpOptions) -> Result<Stack> {
        let dir = checked_dir(dir)?;
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::new(format!("cannot create {}: {e}", dir.display())))?;
        // Now that it exists: the canonical path, as every later call sees it.
        let dir = checked_dir(&dir)?;
        let stack = Stack {
            ctx: Ctx::new(&dir),
        };
        let _lock = stack.lock()?;
        let mut env = stack.env()?;
        let replicas = options
            .replicas
            .or_else(|| env.port("CH_REPLICAS").map(usize::from))
            .unwrap_or(2);
        if !(1..=MAX_REPLICAS).contains(&replicas) {
            return Err(Error::new(format!(
                "replicas must be 1..={MAX_REPLICAS} (asked for, or CH_REPLICAS of stack.env): {replicas}"
            )));
        }
        let with_ch26 = options
            .ch26
            .unwrap_or_else(|| env.get("CH26_HTTP_PORT").is_some());
        check_binaries(with_ch26)?;
        let t0 = Instant::now();
        stack.ensure_ports(&mut env, replicas, with_ch26)?;
        let env = stack.write_env(&env, replicas, with_ch26)?;
        let started = stack.start_all(&env, replicas, with_ch26)?;
        stack.stop_extra_replicas(replicas)?;
        stack.write_env(&env, replicas, with_ch26)?;
        if started {
            log(&format!("up in {:.1}s", t0.elapsed().as_secs_f64()));
        } else {
            log("already running");
        }
        Ok(stack)
    }

    /// Starts every server of `env` that is not running and waits for all: ZooKeeper,
    /// PostgreSQL's initdb and the 26.x server concurrently, the replicas once ZooKeeper
    /// answers. True when something was started.
    fn start_all(&self, env: &Env, replicas: usize, with_ch26: bool) -> Result<bool> {
        let ctx = &self.ctx;
        let mut started = false;
        if ctx.pid_of("zk").is_none() {
            zookeeper::launch(ctx, env)?;
            started = true;
        }
        if with_ch26 && ctx.pid_of("ch26").is_none() {
            ch26::launch(ctx, env)?;
            started = true;
        }
        if ctx.pid_of("pg").is_none() {
            postgres::init(ctx)?;
            postgres::launch(ctx, Pg::Primary, env)?;
            started = true;
        }
        if !ctx.frozen_note("zk") {
            zookeeper::wait(ctx, env)?;
        }
        let mut down = Vec::new();
        for i in 1..=replicas {
            clickhouse::write_conf(ctx, i, env, &[])?;
            if ctx.pid_of(&format!("ch{i}")).is_none() {
                down.push(i);
            }
        }
        if !down.is_empty() {
            clickhouse::clear_stale_active(ctx, &down, env);
            for i in &down {
                clickhouse::launch(ctx, *i, env)?;
            }
            started = true;
        }
        if !ctx.frozen_note("pg") {
            postgres::wait_primary(ctx, env)?;
        }
        // Every replica, not only the ones just started: after a ZooKeeper restart the
        // running ones may still be read-only.
        for i in 1..=replicas {
            if !ctx.frozen_note(&format!("ch{i}")) {
                clickhouse::wait(ctx, i, env)?;
            }
        }
        if with_ch26 {
            if !ctx.frozen_note("ch26") {
                ch26::wait(ctx, env)?;
            }
        } else if ctx.pid_of("ch26").is_some() {
            log("stopping the ClickHouse 26.x server (not asked for)");
            signal_named(self, "ch26", Action::Stop)?;
        }
        Ok(started)
    }

    /// Replicas beyond `replicas` (from an earlier `up` with more) are not in the cluster
    /// definition any more: stops them.
    fn stop_extra_replicas(&self, replicas: usize) -> Result<()> {
        for n in replicas + 1..=MAX_REPLICAS {
            if self.ctx.pid_of(&format!("ch{n}")).is_some() {
                log(&format!("stopping replica {n} (replicas {replicas})"));
                signal_named(self, &format!("ch{n}"), Action::Stop)?;
            }
        }
        Ok(())
    }

    /// Sets every port of `env` that is missing, and picks a new one for a server that is not
    /// running when its old port has been taken meanwhile.
    fn ensure_ports(&self, env: &mut Env, replicas: usize, with_ch26: bool) -> Result<()> {
        let mut groups: Vec<(String, Vec<String>)> = vec![
            ("pg".into(), vec!["PG_PORT".into()]),
            ("zk".into(), vec!["ZK_PORT".into()]),
        ];
        for i in 1..=replicas {
            let keys = ["HTTP", "TCP", "INTERSERVER"].map(|k| format!("CH{i}_{k}_PORT"));
            groups.push((format!("ch{i}"), keys.to_vec()));
        }
        if with_ch26 {
            groups.push((
                "ch26".into(),
                vec!["CH26_HTTP_PORT".into(), "CH26_TCP_PORT".into()],
            ));
        }
        for (name, keys) in groups {
            let missing = keys.iter().any(|k| env.port(k).is_none());
            let taken = self.ctx.pid_of(&name).is_none()
                && keys
                    .iter()
                    .any(|k| env.port(k).is_some_and(ports::listening));
            if missing || taken {
                for (k, p) in keys.iter().zip(ports::alloc(keys.len())?) {
                    env.set(k, p);
                }
            }
        }
        Ok(())
    }

    /// Writes `DIR/stack.env` from the ports in `ports` (the keys are listed in [`crate`]) and
    /// returns what it wrote.
    fn write_env(&self, ports: &Env, replicas: usize, with_ch26: bool) -> Result<Env> {
        let dir = self.ctx.dir.display().to_string();
        let p = |k: &str| ports.get(k).unwrap_or_default().to_owned();
        let pg = p("PG_PORT");
        let mut env = Env::default();
        env.set("STACK_DIR", &dir);
        env.set("PG_PORT", &pg);
        env.set("PG_DATA", format!("{dir}/pg/data"));
        env.set(
            "PG_SOCKET_DIR",
            postgres::socket_dir(&self.ctx, Pg::Primary).display(),
        );
        env.set("PG_USER", "postgres");
        env.set("PG_DATABASE", "collector");
        env.set(
            "DATABASE_URL",
            format!("postgres://postgres@127.0.0.1:{pg}/collector"),
        );
        if let Some(geo) = std::env::var_os("STACK_GEO_DB") {
            if std::fs::metadata(&geo).is_ok_and(|m| m.len() > 0) {
                env.set("GEO_DB", Path::new(&geo).display());
            }
        }
        env.set("ZK_PORT", p("ZK_PORT"));
        env.set("ZK_HOSTS", format!("127.0.0.1:{}", p("ZK_PORT")));
        env.set("CH_REPLICAS", replicas);
        env.set("CH_CLUSTER", "collector");
        env.set("CH_SHARD", 1);
        let mut urls = Vec::new();
        for i in 1..=replicas {
            for k in ["HTTP", "TCP", "INTERSERVER"] {
                let key = format!("CH{i}_{k}_PORT");
                env.set(&key, p(&key));
            }
            env.set(&format!("CH{i}_REPLICA"), format!("r{i}"));
            let url = format!("http://127.0.0.1:{}", p(&format!("CH{i}_HTTP_PORT")));
            env.set(&format!("CH{i}_URL"), &url);
            urls.push(url);
        }
        env.set("CLICKHOUSE_URL", &urls[0]);
        env.set("CLICKHOUSE_URLS", urls.join(","));
        if with_ch26 {
            env.set("CH26_HTTP_PORT", p("CH26_HTTP_PORT"));
            env.set("CH26_TCP_PORT", p("CH26_TCP_PORT"));
            env.set(
                "CH26_URL",
                format!("http://127.0.0.1:{}", p("CH26_HTTP_PORT")),
            );
        }
        // Kept by every rewrite once the standby exists.
        let standby = p("PG_STANDBY_PORT");
        if !standby.is_empty() && self.ctx.path("pg-standby/data/PG_VERSION").exists() {
            env.set("PG_STANDBY_PORT", &standby);
            env.set("PG_STANDBY_DATA", format!("{dir}/pg-standby/data"));
            env.set(
                "DATABASE_URL_FAILOVER",
                format!("postgres://postgres@127.0.0.1:{pg},127.0.0.1:{standby}/collector"),
            );
        }
        env.write(&self.ctx.path("stack.env"))?;
        Ok(env)
    }

    /// The standby's start (the lock is held): cloned the first time, a port picked when it
    /// has none or its old one is taken, `stack.env` rewritten before and after.
    pub(crate) fn standby_start(&self) -> Result<()> {
        let ctx = &self.ctx;
        let mut env = self.env()?;
        if env.get("STACK_DIR").is_none() {
            return Err(Error::new(format!(
                "no stack.env in {} (run up first)",
                ctx.dir.display()
            )));
        }
        let replicas = env.port("CH_REPLICAS").map_or(2, usize::from);
        let with_ch26 = env.get("CH26_HTTP_PORT").is_some();
        if ctx.pid_of("pg-standby").is_some() {
            log("the standby is already running");
        } else {
            if !ctx.path("pg-standby/data/PG_VERSION").exists() {
                postgres::standby_create(ctx, &env)?;
            }
            if env.port("PG_STANDBY_PORT").is_none_or(ports::listening) {
                env.set("PG_STANDBY_PORT", ports::alloc(1)?[0]);
            }
            // Early, so that status and down know of it even if the start fails.
            env = self.write_env(&env, replicas, with_ch26)?;
            postgres::launch(ctx, Pg::Standby, &env)?;
        }
        postgres::standby_wait(ctx, &env)?;
        self.write_env(&env, replicas, with_ch26)?;
        if !ctx.path("pg-standby/data/standby.signal").exists() {
            log("note: the standby has been promoted; it runs as a primary");
        }
        Ok(())
    }
}

/// Fails naming the first binary `up` needs that is missing.
fn check_binaries(with_ch26: bool) -> Result<()> {
    let pg = Path::new(postgres::PG_BIN);
    let zk = Path::new(zookeeper::ZK_JARS);
    let needed = [
        clickhouse::server_binary(),
        pg.join("postgres"),
        pg.join("initdb"),
        pg.join("pg_ctl"),
        pg.join("psql"),
        zk.join("zookeeper.jar"),
        zk.join("slf4j-simple.jar"),
    ];
    if let Some(missing) = needed.iter().find(|b| !b.exists()) {
        return Err(Error::new(format!(
            "{} is missing; run: scripts/stack.sh install",
            missing.display()
        )));
    }
    if !on_path("java") {
        return Err(Error::new("java is missing; run: scripts/stack.sh install"));
    }
    if with_ch26 && !ch26::installed() {
        return Err(Error::new(format!(
            "{} is not installed in {}; run: scripts/stack.sh install",
            ch26::PACKAGE,
            ch26::venv().display()
        )));
    }
    Ok(())
}

/// `name` is an executable file in a folder of `PATH`.
fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(name).is_file()))
}

impl Stack {
    /// Stops every server of the stack in `dir` (the standby and the 26.x server too; frozen
    /// ones are thawed first so that they can act on SIGTERM): the ClickHouse servers in
    /// parallel, then ZooKeeper, then PostgreSQL, then any stray server process of `dir` that
    /// lost its pid file. `purge` also deletes `dir`. A missing `dir` is no error.
    pub fn down(dir: &Path, purge: bool) -> Result<()> {
        let dir = checked_dir(dir)?;
        if !dir.is_dir() {
            log(&format!("no stack in {}", dir.display()));
            return Ok(());
        }
        if !holds_stack(&dir) {
            // Not a stack's folder (a parent of stacks, a mistyped path): stopping the
            // processes that name paths under it, or deleting it, could hit anything.
            return Err(Error::new(format!(
                "{} holds no stack (no stack.env, and files a stack does not make): \
                 not stopped, not purged",
                dir.display()
            )));
        }
        let stack = Stack {
            ctx: Ctx::new(&dir),
        };
        let lock = stack.lock()?;
        let ctx = &stack.ctx;
        let servers: Vec<String> = (1..=crate::MAX_REPLICAS)
            .map(|i| format!("ch{i}"))
            .chain(["ch26".to_owned(), "zk".to_owned()])
            .collect();
        for name in &servers {
            if let Some(pid) = ctx.pid_of(name) {
                process::signal(pid, libc::SIGCONT);
            }
        }
        for pg in [Pg::Primary, Pg::Standby] {
            if let Some(pid) = ctx.pid_of(pg.name()) {
                postgres::signal_group(libc::SIGCONT, pid);
            }
        }
        let clickhouse: Vec<(&String, u32)> = servers[..servers.len() - 1]
            .iter()
            .filter_map(|n| Some((n, ctx.pid_of(n)?)))
            .collect();
        for (_, pid) in &clickhouse {
            process::signal(*pid, libc::SIGTERM);
        }
        for (name, pid) in clickhouse {
            // The pid file of a replica killed at last stays: it marks an unclean exit whose
            // ZooKeeper node the next start must clear.
            if process::stop(name, pid, ctx.stop)? {
                let _ = std::fs::remove_file(ctx.path(&format!("{name}.pid")));
            }
        }
        let _ = std::fs::remove_file(ctx.path("ch26.pid"));
        if let Some(pid) = ctx.pid_of("zk") {
            process::stop("zk", pid, ctx.stop)?;
        }
        let _ = std::fs::remove_file(ctx.path("zk.pid"));
        postgres::stop(ctx, Pg::Standby)?;
        postgres::stop(ctx, Pg::Primary)?;
        sweep_strays(ctx)?;
        if purge {
            for pg in [Pg::Primary, Pg::Standby] {
                let sock = postgres::socket_dir(ctx, pg);
                if sock.starts_with("/tmp") && sock.to_string_lossy().contains("stack-pg-") {
                    let _ = std::fs::remove_dir_all(sock);
                }
            }
            // Under the lock (held on the lock file, which goes with the folder): an action
            // waiting for it then finds no stack instead of one half deleted.
            std::fs::remove_dir_all(&dir)
                .map_err(|e| Error::new(format!("purge {}: {e}", dir.display())))?;
            drop(lock);
            log(&format!("stopped and purged {}", dir.display()));
        } else {
            drop(lock);
            log("stopped");
        }
        Ok(())
    }
}

/// The safety net of `down`: stops any ClickHouse, ZooKeeper, PostgreSQL or 26.x launcher
/// process of this folder that lost its pid file (a start that failed half-way).
fn sweep_strays(ctx: &Ctx) -> Result<()> {
    for pid in process::all_pids() {
        let comm = process::comm(pid);
        let ours = if comm.starts_with("python") {
            process::cmdline(pid).contains("ch26/server.py")
        } else {
            matches!(comm.as_str(), "clickhouse-serv" | "java" | "postgres")
        };
        if ours && process::mentions(pid, &ctx.dir) && process::alive(pid) {
            log(&format!("stopping stray {comm} (pid {pid})"));
            process::stop(&comm, pid, ctx.stop)?;
        }
    }
    Ok(())
}
