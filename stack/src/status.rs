//! What a [`Stack`] runs: the summary `up` prints and the health of `status`.

use std::fmt::Write;

use crate::error::Result;
use crate::postgres;
use crate::{ch26, clickhouse, process, zookeeper, Stack};

/// How a server is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// No live process.
    Stopped,
    /// Stopped by SIGSTOP.
    Frozen,
    /// Running, but its probe does not answer.
    Unhealthy,
    /// Running and answering its probe.
    Running,
}

impl Stack {
    /// The health of server `name`, probed by `probe` when it runs and is not frozen.
    pub(crate) fn health(&self, name: &str, probe: impl FnOnce() -> bool) -> (Health, Option<u32>) {
        let pid = self.ctx.pid_of(name);
        let health = match pid {
            None => Health::Stopped,
            Some(p) if process::frozen(p) => Health::Frozen,
            Some(_) if probe() => Health::Running,
            Some(_) => Health::Unhealthy,
        };
        (health, pid)
    }

    /// One line per server (`NAME STATE pid PID ENDPOINT`) and whether every server runs and
    /// answers its probe. A stopped standby is shown but does not count (it is optional).
    pub fn status(&self) -> Result<(String, bool)> {
        let env = self.env()?;
        let mut out = format!("stack {}\n", self.dir().display());
        let mut ok = true;
        let mut line = |label: &str, (health, pid): (Health, Option<u32>), endpoint: String| {
            let pid = pid.map_or("-".to_owned(), |p| p.to_string());
            let state = format!("{health:?}").to_lowercase();
            let _ = writeln!(out, "  {label:<12} {state:<9} pid {pid:<7} {endpoint}");
            health
        };
        let pg = env.port("PG_PORT").unwrap_or(0);
        ok &= line(
            "postgres",
            self.health("pg", || postgres::is_ready(pg)),
            format!("127.0.0.1:{pg}"),
        ) == Health::Running;
        if self.ctx.path("pg-standby/data/PG_VERSION").exists() {
            let sb = env.port("PG_STANDBY_PORT").unwrap_or(0);
            let role = postgres::standby_role(&self.ctx, &env);
            let h = line(
                "pg-standby",
                self.health("pg-standby", || postgres::is_ready(sb)),
                format!("127.0.0.1:{sb}  ({role})"),
            );
            ok &= matches!(h, Health::Running | Health::Stopped);
        }
        let zk = env.port("ZK_PORT").unwrap_or(0);
        ok &= line(
            "zookeeper",
            self.health("zk", || zookeeper::ruok(zk)),
            format!("127.0.0.1:{zk}"),
        ) == Health::Running;
        for r in self.replicas() {
            let port = r.http_port();
            let h = self.health(&format!("ch{}", r.i), || clickhouse::select1(port));
            ok &= line(&format!("clickhouse{}", r.i), h, r.url()) == Health::Running;
        }
        for c in self.ch26_servers() {
            let h = self.health(&ch26::name(c.k), || ch26::ping(&self.ctx, &env, c.k));
            let label = match c.k {
                1 => "clickhouse26".to_owned(),
                k => format!("clickhouse26-{k}"),
            };
            ok &= line(&label, h, c.url()) == Health::Running;
        }
        Ok((out, ok))
    }

    /// What `up` prints: each server's pid and endpoints, and the `stack.env` path.
    pub fn summary(&self) -> Result<String> {
        let env = self.env()?;
        let pid = |name: &str| {
            self.ctx
                .pid_of(name)
                .map_or(String::new(), |p| p.to_string())
        };
        let mut out = format!("stack {}\n", self.dir().display());
        let pg = self.postgres();
        let _ = writeln!(
            out,
            "  postgres    pid {:<7} 127.0.0.1:{}  {}",
            pid("pg"),
            pg.port().unwrap_or(0),
            pg.url("collector")
        );
        if self.ctx.path("pg-standby/data/PG_VERSION").exists() {
            let _ = writeln!(
                out,
                "  pg-standby  pid {:<7} 127.0.0.1:{}  ({})",
                pid("pg-standby"),
                self.pg_standby().port().unwrap_or(0),
                postgres::standby_role(&self.ctx, &env)
            );
        }
        let zk = self.zookeeper().port();
        let _ = writeln!(out, "  zookeeper   pid {:<7} 127.0.0.1:{zk}", pid("zk"));
        let per_shard = clickhouse::layout(&env).map_or(usize::MAX, |(_, r)| r);
        for r in self.replicas() {
            let _ = writeln!(
                out,
                "  clickhouse{:<2} pid {:<7} {}  tcp {}  interserver {}  shard {}",
                r.i,
                pid(&format!("ch{}", r.i)),
                r.url(),
                r.tcp_port(),
                r.interserver_port(),
                clickhouse::shard_of(r.i, per_shard)
            );
        }
        for c in self.ch26_servers() {
            let label = match c.k {
                1 => "clickhouse26".to_owned(),
                k => format!("clickhouse26-{k}"),
            };
            let _ = writeln!(
                out,
                "  {label} pid {:<7} {}  tcp {}  (ClickHouse 26.x, shard {} of {})",
                pid(&ch26::name(c.k)),
                c.url(),
                c.tcp_port(),
                ch26::shard_name(c.k),
                ch26::CLUSTER26
            );
        }
        let _ = writeln!(out, "  env: {}", self.ctx.path("stack.env").display());
        Ok(out)
    }
}
