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
        let remembered = clickhouse::layout(&env).ok();
        let replicas = options.replicas.or(remembered.map(|(_, r)| r)).unwrap_or(2);
        let shards = options.shards.or(remembered.map(|(s, _)| s)).unwrap_or(1);
        let layout = Layout::checked(shards, replicas)?;
        let with_ch26 = options
            .ch26
            .or(options.ch26_servers.map(|_| true))
            .unwrap_or_else(|| env.get("CH26_HTTP_PORT").is_some());
        let ch26_servers = if with_ch26 {
            let k = options
                .ch26_servers
                .or_else(|| Some(ch26::servers(&env)).filter(|k| *k > 0))
                .unwrap_or(1);
            if !(1..=ch26::MAX_SERVERS).contains(&k) {
                return Err(Error::new(format!(
                    "ch26 servers must be 1..={} (asked for, or CH26_SERVERS of stack.env): {k}",
                    ch26::MAX_SERVERS
                )));
            }
            k
        } else {
            0
        };
        let layout = Layout {
            ch26: ch26_servers,
            ..layout
        };
        check_binaries(layout.ch26 > 0)?;
        let t0 = Instant::now();
        stack.ensure_ports(&mut env, layout)?;
        let env = stack.write_env(&env, layout)?;
        let started = stack.start_all(&env, layout)?;
        stack.stop_extra_replicas(layout.servers())?;
        stack.write_env(&env, layout)?;
        if started {
            log(&format!("up in {:.1}s", t0.elapsed().as_secs_f64()));
        } else {
            log("already running");
        }
        Ok(stack)
    }

    /// Starts every server of `env` that is not running and waits for all: ZooKeeper,
    /// PostgreSQL's initdb and the 26.x servers concurrently, the replicas once ZooKeeper
    /// answers. A running 26.x server whose config changed (another cluster) is restarted.
    /// True when something was started.
    fn start_all(&self, env: &Env, layout: Layout) -> Result<bool> {
        let ctx = &self.ctx;
        let mut started = false;
        if ctx.pid_of("zk").is_none() {
            zookeeper::launch(ctx, env)?;
            started = true;
        }
        for k in 1..=layout.ch26 {
            let name = ch26::name(k);
            if ctx.pid_of(&name).is_some()
                && !ctx.frozen_note(&name)
                && ch26::config_changed(ctx, env, k)
            {
                log(&format!(
                    "restarting the ClickHouse 26.x server {name} (its cluster changed)"
                ));
                signal_named(self, &name, Action::Stop)?;
            }
            if ctx.pid_of(&name).is_none() {
                ch26::launch(ctx, env, k)?;
                started = true;
            }
        }
        if ctx.pid_of("pg").is_none() {
            postgres::init(ctx)?;
            postgres::launch(ctx, Pg::Primary, env)?;
            started = true;
        }
        if !ctx.frozen_note("zk") {
            zookeeper::wait(ctx, env)?;
        }
        let servers = layout.servers();
        let mut down = Vec::new();
        for i in 1..=servers {
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
        for i in 1..=servers {
            if !ctx.frozen_note(&format!("ch{i}")) {
                clickhouse::wait(ctx, i, env)?;
            }
        }
        for k in 1..=layout.ch26 {
            if !ctx.frozen_note(&ch26::name(k)) {
                ch26::wait(ctx, env, k)?;
            }
        }
        for k in layout.ch26 + 1..=ch26::MAX_SERVERS {
            let name = ch26::name(k);
            if ctx.pid_of(&name).is_some() {
                log(&format!(
                    "stopping the ClickHouse 26.x server {name} (not asked for)"
                ));
                signal_named(self, &name, Action::Stop)?;
            }
        }
        Ok(started)
    }

    /// Servers beyond `servers` (from an earlier `up` with more) are not in the cluster
    /// definition any more: stops them.
    fn stop_extra_replicas(&self, servers: usize) -> Result<()> {
        for n in servers + 1..=MAX_REPLICAS {
            if self.ctx.pid_of(&format!("ch{n}")).is_some() {
                log(&format!("stopping replica {n} (servers {servers})"));
                signal_named(self, &format!("ch{n}"), Action::Stop)?;
            }
        }
        Ok(())
    }

    /// Sets every port of `env` that is missing, and picks a new one for a server that is not
    /// running when its old port has been taken meanwhile.
    fn ensure_ports(&self, env: &mut Env, layout: Layout) -> Result<()> {
        let mut groups: Vec<(String, Vec<String>)> = vec![
            ("pg".into(), vec!["PG_PORT".into()]),
            ("zk".into(), vec!["ZK_PORT".into()]),
        ];
        for i in 1..=layout.servers() {
            let keys = ["HTTP", "TCP", "INTERSERVER"].map(|k| format!("CH{i}_{k}_PORT"));
            groups.push((format!("ch{i}"), keys.to_vec()));
        }
        for k in 1..=layout.ch26 {
            groups.push((ch26::name(k), ch26::port_keys(k).to_vec()));
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
    fn write_env(&self, ports: &Env, layout: Layout) -> Result<Env> {
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
        env.set("CH_SHARDS", layout.shards);
        env.set("CH_REPLICAS", layout.replicas);
        env.set("CH_SERVERS", layout.servers());
        env.set("CH_CLUSTER", "collector");
        env.set("CH_SHARD", 1);
        let mut shards: Vec<Vec<String>> = vec![Vec::new(); layout.shards];
        for i in 1..=layout.servers() {
            for k in ["HTTP", "TCP", "INTERSERVER"] {
                let key = format!("CH{i}_{k}_PORT");
                env.set(&key, p(&key));
            }
            let shard = clickhouse::shard_of(i, layout.replicas);
            env.set(&format!("CH{i}_SHARD"), shard);
            env.set(&format!("CH{i}_REPLICA"), format!("r{i}"));
            let url = format!("http://127.0.0.1:{}", p(&format!("CH{i}_HTTP_PORT")));
            env.set(&format!("CH{i}_URL"), &url);
            shards[shard - 1].push(url);
        }
        env.set("CLICKHOUSE_URL", &shards[0][0]);
        // Shard 1 alone when there are several: a collector given only this list writes to
        // one shard, as it did before shards.
        env.set("CLICKHOUSE_URLS", shards[0].join(","));
        let named: Vec<String> = shards
            .iter()
            .enumerate()
            .map(|(s, urls)| format!("shard{}={}", s + 1, urls.join(",")))
            .collect();
        env.set("CLICKHOUSE_SHARDS", named.join(";"));
        if layout.ch26 > 0 {
            env.set("CH26_SERVERS", layout.ch26);
            env.set("CH26_CLUSTER", ch26::CLUSTER26);
            let mut named = Vec::new();
            for k in 1..=layout.ch26 {
                let [http_key, tcp_key] = ch26::port_keys(k);
                let url = format!("http://127.0.0.1:{}", p(&http_key));
                if k == 1 {
                    env.set("CH26_HTTP_PORT", p(&http_key));
                    env.set("CH26_TCP_PORT", p(&tcp_key));
                    env.set("CH26_URL", &url);
                }
                env.set(&format!("CH26_{k}_HTTP_PORT"), p(&http_key));
                env.set(&format!("CH26_{k}_TCP_PORT"), p(&tcp_key));
                env.set(&format!("CH26_{k}_URL"), &url);
                named.push(format!("{}={url}", ch26::shard_name(k)));
            }
            env.set("CH26_SHARDS", named.join(";"));
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
        let layout = Layout::of(&env);
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
            env = self.write_env(&env, layout)?;
            postgres::launch(ctx, Pg::Standby, &env)?;
        }
        postgres::standby_wait(ctx, &env)?;
        self.write_env(&env, layout)?;
        if !ctx.path("pg-standby/data/standby.signal").exists() {
            log("note: the standby has been promoted; it runs as a primary");
        }
        Ok(())
    }
}

/// What `up` runs: `shards` × `replicas` 18.16 servers and `ch26` 26.x servers (0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    shards: usize,
    replicas: usize,
    ch26: usize,
}

impl Layout {
    /// `shards` of `replicas` each, checked (no 26.x server). Errors: a count of 0, or more
    /// than [`MAX_REPLICAS`] servers in all.
    fn checked(shards: usize, replicas: usize) -> Result<Layout> {
        if shards == 0 || replicas == 0 || shards.saturating_mul(replicas) > MAX_REPLICAS {
            return Err(Error::new(format!(
                "shards × replicas must be 1..={MAX_REPLICAS} servers, each at least 1 (asked \
                 for, or CH_SHARDS and CH_REPLICAS of stack.env): {shards} × {replicas}"
            )));
        }
        Ok(Layout {
            shards,
            replicas,
            ch26: 0,
        })
    }

    /// As `env` (a written `stack.env`) has it; 1 shard of 2 replicas when it says nothing.
    fn of(env: &Env) -> Layout {
        let (shards, replicas) = clickhouse::layout(env).unwrap_or((1, 2));
        Layout {
            shards,
            replicas,
            ch26: ch26::servers(env),
        }
    }

    /// The 18.16 servers in all.
    fn servers(&self) -> usize {
        self.shards * self.replicas
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
            .chain((1..=ch26::MAX_SERVERS).map(ch26::name))
            .chain(["zk".to_owned()])
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
        for k in 1..=ch26::MAX_SERVERS {
            let _ = std::fs::remove_file(ctx.path(&format!("{}.pid", ch26::name(k))));
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ports(servers: usize, ch26: usize) -> Env {
        let mut env = Env::default();
        env.set("PG_PORT", 20001);
        env.set("ZK_PORT", 20002);
        for i in 1..=servers {
            env.set(&format!("CH{i}_HTTP_PORT"), 20100 + i);
            env.set(&format!("CH{i}_TCP_PORT"), 20200 + i);
            env.set(&format!("CH{i}_INTERSERVER_PORT"), 20300 + i);
        }
        for k in 1..=ch26 {
            let [http, tcp] = ch26::port_keys(k);
            env.set(&http, 20400 + k);
            env.set(&tcp, 20500 + k);
        }
        env
    }

    fn written(layout: Layout) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let stack = Stack {
            ctx: Ctx::new(dir.path()),
        };
        let env = stack
            .write_env(&ports(layout.servers(), layout.ch26), layout)
            .unwrap();
        assert_eq!(Env::read(&dir.path().join("stack.env")).unwrap(), env);
        env
    }

    #[test]
    fn two_shards_of_two_and_two_26x_servers_in_stack_env() {
        let env = written(Layout {
            shards: 2,
            replicas: 2,
            ch26: 2,
        });
        let get = |k: &str| env.get(k).unwrap_or_else(|| panic!("{k} missing"));
        assert_eq!(get("CH_SHARDS"), "2");
        assert_eq!(get("CH_REPLICAS"), "2");
        assert_eq!(get("CH_SERVERS"), "4");
        assert_eq!(get("CH_CLUSTER"), "collector");
        for (i, shard) in [(1, "1"), (2, "1"), (3, "2"), (4, "2")] {
            assert_eq!(get(&format!("CH{i}_SHARD")), shard);
            assert_eq!(get(&format!("CH{i}_REPLICA")), format!("r{i}"));
            assert_eq!(
                get(&format!("CH{i}_URL")),
                format!("http://127.0.0.1:{}", 20100 + i)
            );
        }
        assert_eq!(get("CLICKHOUSE_URL"), "http://127.0.0.1:20101");
        assert_eq!(
            get("CLICKHOUSE_URLS"),
            "http://127.0.0.1:20101,http://127.0.0.1:20102"
        );
        assert_eq!(
            get("CLICKHOUSE_SHARDS"),
            "shard1=http://127.0.0.1:20101,http://127.0.0.1:20102;\
             shard2=http://127.0.0.1:20103,http://127.0.0.1:20104"
        );
        assert_eq!(get("CH26_SERVERS"), "2");
        assert_eq!(get("CH26_CLUSTER"), "collector26");
        assert_eq!(get("CH26_HTTP_PORT"), "20401");
        assert_eq!(get("CH26_TCP_PORT"), "20501");
        assert_eq!(get("CH26_URL"), "http://127.0.0.1:20401");
        for k in 1..=2 {
            assert_eq!(get(&format!("CH26_{k}_HTTP_PORT")), (20400 + k).to_string());
            assert_eq!(get(&format!("CH26_{k}_TCP_PORT")), (20500 + k).to_string());
            assert_eq!(
                get(&format!("CH26_{k}_URL")),
                format!("http://127.0.0.1:{}", 20400 + k)
            );
        }
        assert_eq!(
            get("CH26_SHARDS"),
            "ch26a=http://127.0.0.1:20401;ch26b=http://127.0.0.1:20402"
        );
        assert_eq!(
            Layout::of(&env),
            Layout {
                shards: 2,
                replicas: 2,
                ch26: 2
            }
        );
    }

    #[test]
    fn one_shard_keeps_every_key_it_had() {
        let env = written(Layout {
            shards: 1,
            replicas: 3,
            ch26: 0,
        });
        let get = |k: &str| env.get(k).unwrap_or_else(|| panic!("{k} missing"));
        assert_eq!(get("CH_REPLICAS"), "3");
        assert_eq!(get("CH_SHARD"), "1");
        assert_eq!(
            get("CLICKHOUSE_URLS"),
            "http://127.0.0.1:20101,http://127.0.0.1:20102,http://127.0.0.1:20103"
        );
        assert_eq!(
            get("CLICKHOUSE_SHARDS"),
            format!("shard1={}", get("CLICKHOUSE_URLS"))
        );
        assert!(env.get("CH26_HTTP_PORT").is_none() && env.get("CH26_SHARDS").is_none());
    }

    #[test]
    fn at_most_nine_servers() {
        assert!(Layout::checked(3, 3).is_ok());
        assert!(Layout::checked(2, 5).is_err());
        assert!(Layout::checked(0, 2).is_err());
        assert!(Layout::checked(1, 0).is_err());
    }
}
