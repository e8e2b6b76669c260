//! Typed handles to the servers of a running [`Stack`]: their ports and URLs, and
//! `stop`/`kill`/`freeze`/`thaw`/`start` on each. Every action takes the stack's lock.

use crate::ctx::log;
use crate::error::{Error, Result};
use crate::postgres::{self, Pg};
use crate::{ch26, clickhouse, ports, process, zookeeper, Stack};

/// What a signal action does to a server process (see [`signal_named`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// SIGTERM and a wait of the stop timeout, then SIGKILL.
    Stop,
    /// SIGKILL, like a crash.
    Kill,
    /// SIGSTOP: the server hangs with its sockets open.
    Freeze,
    /// SIGCONT.
    Thaw,
}

/// `action` on server `name` of the stack (a replica, ZooKeeper or the 26.x server). Errors:
/// `Freeze` of a server that does not run, a server that survives SIGKILL.
pub(crate) fn signal_named(stack: &Stack, name: &str, action: Action) -> Result<()> {
    let ctx = &stack.ctx;
    let Some(pid) = ctx.pid_of(name) else {
        return match action {
            Action::Thaw => Ok(()),
            Action::Freeze => Err(Error::new(format!("{name} is not running"))),
            _ => {
                log(&format!("{name} is not running"));
                Ok(())
            }
        };
    };
    match action {
        Action::Stop => {
            if process::stop(name, pid, ctx.stop)? {
                let _ = std::fs::remove_file(ctx.path(&format!("{name}.pid")));
            }
            Ok(())
        }
        Action::Kill => process::kill(name, pid),
        Action::Freeze => {
            process::signal(pid, libc::SIGSTOP);
            Ok(())
        }
        Action::Thaw => {
            process::signal(pid, libc::SIGCONT);
            Ok(())
        }
    }
}

/// Reserves server `name`'s ports again while it is down ([`ports::reserve`]), so that no
/// other stack or script is handed them before it starts again (a reservation made at `up`
/// lapses after [`ports::RESERVATION`]). A failure is only logged: the server is down anyway.
fn keep_ports(stack: &Stack, name: &str) {
    let keys: Vec<String> = match name {
        "pg" => vec!["PG_PORT".into()],
        "pg-standby" => vec!["PG_STANDBY_PORT".into()],
        "zk" => vec!["ZK_PORT".into()],
        ch26 if ch26.starts_with("ch26") => {
            let k = ch26
                .strip_prefix("ch26-")
                .map_or(1, |k| k.parse().unwrap_or(1));
            ch26::port_keys(k).to_vec()
        }
        replica => ["HTTP", "TCP", "INTERSERVER"]
            .map(|k| format!("CH{}_{k}_PORT", replica.trim_start_matches("ch")))
            .to_vec(),
    };
    let Ok(env) = stack.env() else { return };
    let kept: Vec<u16> = keys.iter().filter_map(|k| env.port(k)).collect();
    if let Err(e) = ports::reserve(&kept) {
        log(&format!(
            "note: {name}'s ports {kept:?} not reserved again: {e}"
        ));
    }
}

/// Fails when one of `ports` is taken by a process that is not `name`.
fn ensure_free(name: &str, ports: &[u16]) -> Result<()> {
    match ports.iter().find(|p| ports::listening(**p)) {
        Some(p) => Err(Error::new(format!(
            "port {p} of {name} is taken by another process"
        ))),
        None => Ok(()),
    }
}

/// Fails when server `name` is frozen: starting it would only wait for it in vain.
fn refuse_frozen(stack: &Stack, name: &str) -> Result<()> {
    match stack.ctx.pid_of(name) {
        Some(pid) if process::frozen(pid) => Err(Error::new(format!(
            "{name} (pid {pid}) is frozen; thaw it first"
        ))),
        _ => Ok(()),
    }
}

/// The four signal actions of a handle (its server named by its `name()`): `stop`, `kill`, `freeze`, `thaw`, each under the stack's lock.
macro_rules! signal_actions {
    ($handle:ident, $what:literal) => {
        impl $handle<'_> {
            #[doc = concat!("SIGTERM to ", $what, ", SIGKILL after the stop timeout.")]
            pub fn stop(&self) -> Result<()> {
                self.act(Action::Stop)
            }
            #[doc = concat!("SIGKILL to ", $what, ", like a crash.")]
            pub fn kill(&self) -> Result<()> {
                self.act(Action::Kill)
            }
            #[doc = concat!("SIGSTOP to ", $what, ": it hangs with its sockets open. Errors: it does not run.")]
            pub fn freeze(&self) -> Result<()> {
                self.act(Action::Freeze)
            }
            #[doc = concat!("SIGCONT to ", $what, ".")]
            pub fn thaw(&self) -> Result<()> {
                self.act(Action::Thaw)
            }
            fn act(&self, action: Action) -> Result<()> {
                let _lock = self.stack.lock()?;
                signal_named(self.stack, &self.name(), action)?;
                if matches!(action, Action::Stop | Action::Kill) {
                    keep_ports(self.stack, &self.name());
                }
                Ok(())
            }
        }
    };
}

signal_actions!(ZooKeeper, "ZooKeeper");
signal_actions!(Replica, "the replica");
signal_actions!(
    Ch26,
    "the 26.x server (its launcher shuts it down on SIGTERM)"
);

/// One of the stack's PostgreSQL servers: the primary, or its hot standby.
#[derive(Debug, Clone, Copy)]
pub struct Postgres<'a> {
    pub(crate) stack: &'a Stack,
    pub(crate) pg: Pg,
}

impl Postgres<'_> {
    /// Its TCP port on 127.0.0.1; None for a standby never started.
    pub fn port(&self) -> Option<u16> {
        self.pg.port(&self.stack.env().ok()?)
    }

    /// `postgres://postgres@127.0.0.1:PORT/DB` (superuser, trust authentication).
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{db}",
            self.port().unwrap_or_default()
        )
    }

    /// `pg_ctl stop -m fast` (SIGKILL after the stop timeout).
    pub fn stop(&self) -> Result<()> {
        let _lock = self.stack.lock()?;
        postgres::stop(&self.stack.ctx, self.pg)?;
        keep_ports(self.stack, self.pg.name());
        Ok(())
    }

    /// SIGKILL to the postmaster only, like a crash; its backends exit by themselves.
    pub fn kill(&self) -> Result<()> {
        let _lock = self.stack.lock()?;
        postgres::kill(&self.stack.ctx, self.pg)?;
        keep_ports(self.stack, self.pg.name());
        Ok(())
    }

    /// SIGSTOP to the postmaster and every backend: a pooled connection hangs too.
    pub fn freeze(&self) -> Result<()> {
        let _lock = self.stack.lock()?;
        postgres::freeze(&self.stack.ctx, self.pg)
    }

    /// SIGCONT to the postmaster and every backend.
    pub fn thaw(&self) -> Result<()> {
        let _lock = self.stack.lock()?;
        postgres::thaw(&self.stack.ctx, self.pg)
    }

    /// Starts it when it does not run and waits until it accepts connections. The standby is
    /// cloned from the running primary the first time (`pg_basebackup -R -X stream`) and
    /// added to `stack.env` (`PG_STANDBY_*`, `DATABASE_URL_FAILOVER`).
    pub fn start(&self) -> Result<()> {
        let _lock = self.stack.lock()?;
        let ctx = &self.stack.ctx;
        refuse_frozen(self.stack, self.pg.name())?;
        match self.pg {
            Pg::Primary => {
                let env = self.stack.env()?;
                if ctx.pid_of("pg").is_none() {
                    ensure_free("PostgreSQL", &[env.port("PG_PORT").unwrap_or_default()])?;
                    postgres::launch(ctx, Pg::Primary, &env)?;
                }
                postgres::wait_primary(ctx, &env)
            }
            Pg::Standby => self.stack.standby_start(),
        }
    }

    /// Promotes the standby to a primary and waits until it is out of recovery. It does not
    /// fence the old primary: do not start that one again while the promoted one runs.
    pub fn promote(&self) -> Result<()> {
        let _lock = self.stack.lock()?;
        postgres::standby_promote(&self.stack.ctx, &self.stack.env()?)
    }
}

/// The stack's standalone ZooKeeper.
#[derive(Debug, Clone, Copy)]
pub struct ZooKeeper<'a> {
    pub(crate) stack: &'a Stack,
}

impl ZooKeeper<'_> {
    fn name(&self) -> String {
        "zk".into()
    }
    /// Its client port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.stack.port("ZK_PORT")
    }
    /// Starts it when it does not run; waits until it serves (`srvr` says standalone).
    pub fn start(&self) -> Result<()> {
        let _lock = self.stack.lock()?;
        refuse_frozen(self.stack, "zk")?;
        let env = self.stack.env()?;
        if self.stack.ctx.pid_of("zk").is_none() {
            ensure_free("ZooKeeper", &[self.port()])?;
            zookeeper::launch(&self.stack.ctx, &env)?;
        }
        zookeeper::wait(&self.stack.ctx, &env)
    }
}

/// ClickHouse 18.16 server `i` (from 1, over all shards): replica `ri` of shard
/// [`Replica::shard`].
#[derive(Debug, Clone, Copy)]
pub struct Replica<'a> {
    pub(crate) stack: &'a Stack,
    pub(crate) i: usize,
}

impl Replica<'_> {
    fn name(&self) -> String {
        format!("ch{}", self.i)
    }
    /// Its number, from 1.
    pub fn i(&self) -> usize {
        self.i
    }
    /// Its shard, from 1 (`CHi_SHARD`; 1 in a stack of one shard).
    pub fn shard(&self) -> usize {
        self.stack
            .env()
            .ok()
            .and_then(|e| clickhouse::layout(&e).ok())
            .map_or(1, |(_, replicas)| clickhouse::shard_of(self.i, replicas))
    }
    /// Its HTTP port on 127.0.0.1.
    pub fn http_port(&self) -> u16 {
        self.stack.port(&format!("CH{}_HTTP_PORT", self.i))
    }
    /// Its native protocol port.
    pub fn tcp_port(&self) -> u16 {
        self.stack.port(&format!("CH{}_TCP_PORT", self.i))
    }
    /// Its interserver (replication fetch) port.
    pub fn interserver_port(&self) -> u16 {
        self.stack.port(&format!("CH{}_INTERSERVER_PORT", self.i))
    }
    /// `http://127.0.0.1:HTTP_PORT` (user `default`, no password).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port())
    }
    /// Starts it again from its config, ports and data when it does not run (clearing the
    /// stale ZooKeeper `is_active` nodes a kill left), then waits until `SELECT 1` answers
    /// and its replicated tables are writable.
    pub fn start(&self) -> Result<()> {
        let _lock = self.stack.lock()?;
        let (ctx, i) = (&self.stack.ctx, self.i);
        refuse_frozen(self.stack, &self.name())?;
        let env = self.stack.env()?;
        if ctx.pid_of(&self.name()).is_none() {
            let ports = [self.http_port(), self.tcp_port(), self.interserver_port()];
            ensure_free(&format!("replica {i}"), &ports)?;
            clickhouse::clear_stale_active(ctx, &[i], &env);
            clickhouse::start_existing(ctx, i)?;
        }
        clickhouse::wait(ctx, i, &env)
    }
    /// Its process now: running (and answering `SELECT 1`), unhealthy, frozen or stopped, with
    /// its pid.
    pub fn health(&self) -> (crate::Health, Option<u32>) {
        let port = self.http_port();
        self.stack
            .health(&self.name(), || clickhouse::select1(port))
    }
    /// Its log files: the error log and what it wrote to stdout/stderr.
    pub fn log_files(&self) -> Vec<std::path::PathBuf> {
        let d = self.stack.ctx.path(&self.name()).join("log");
        vec![d.join("clickhouse-server.err.log"), d.join("stdout.log")]
    }
    /// Its users.xml's default profile with `settings` (`NAME=VALUE`) added (none: the
    /// stack's own profile again), once the running server reads them (within 30 s).
    /// `readonly=1` makes it refuse inserts while it still answers SELECTs.
    pub fn profile(&self, settings: &[&str]) -> Result<()> {
        let _lock = self.stack.lock()?;
        let env = self.stack.env()?;
        clickhouse::set_profile(&self.stack.ctx, self.i, &env, settings)
    }

    /// Adds a user with a password and a profile of its own ([`clickhouse::add_user`]).
    pub fn add_user(&self, name: &str, password_sha256_hex: &str, settings: &[&str]) -> Result<()> {
        let _lock = self.stack.lock()?;
        clickhouse::add_user(&self.stack.ctx, self.i, name, password_sha256_hex, settings)
    }
}

/// One of the stack's ClickHouse 26.x servers (`up` with `ch26`): server `k` (from 1), an
/// unreplicated shard of the cluster `collector26`, not a replica.
#[derive(Debug, Clone, Copy)]
pub struct Ch26<'a> {
    pub(crate) stack: &'a Stack,
    pub(crate) k: usize,
}

impl Ch26<'_> {
    fn name(&self) -> String {
        ch26::name(self.k)
    }
    /// Its number, from 1.
    pub fn k(&self) -> usize {
        self.k
    }
    /// Its HTTP port on 127.0.0.1.
    pub fn http_port(&self) -> u16 {
        self.stack.port(&ch26::port_keys(self.k)[0])
    }
    /// Its native TCP port on 127.0.0.1.
    pub fn tcp_port(&self) -> u16 {
        self.stack.port(&ch26::port_keys(self.k)[1])
    }
    /// Its process now (running when `/ping` answers as this stack's server), with its pid.
    pub fn health(&self) -> (crate::Health, Option<u32>) {
        let ctx = &self.stack.ctx;
        let env = self.stack.env().unwrap_or_default();
        self.stack
            .health(&self.name(), || ch26::ping(ctx, &env, self.k))
    }
    /// Its log file (the server's output; its own log files stay empty).
    pub fn log_files(&self) -> Vec<std::path::PathBuf> {
        vec![self
            .stack
            .ctx
            .path(&format!("{}/log/server.log", self.name()))]
    }
    /// `http://127.0.0.1:HTTP_PORT` (user `default`, no password, time zone UTC).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port())
    }
    /// Starts it when it does not run; waits until `/ping` answers as this stack's server.
    pub fn start(&self) -> Result<()> {
        let _lock = self.stack.lock()?;
        let name = self.name();
        refuse_frozen(self.stack, &name)?;
        let env = self.stack.env()?;
        if self.stack.ctx.pid_of(&name).is_none() {
            if !ch26::installed() {
                return Err(Error::new(format!(
                    "{} is not installed in {}; run: scripts/stack.sh install",
                    ch26::PACKAGE,
                    ch26::venv().display()
                )));
            }
            ensure_free(
                &format!("the ClickHouse 26.x server {name}"),
                &[self.http_port(), self.tcp_port()],
            )?;
            ch26::launch(&self.stack.ctx, &env, self.k)?;
        }
        ch26::wait(&self.stack.ctx, &env, self.k)
    }
}
