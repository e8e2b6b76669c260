//! The throw-away server stack of the tests and the demo: PostgreSQL 15, a standalone
//! ZooKeeper, ClickHouse 18.16 servers (Debian's): S shards (1 unless asked for) of R
//! replicas each, and on request K ClickHouse 26.x servers (PyPI's `chdb-core`, run by
//! `scripts/ch26/server.py`; 1 unless asked for), all on loopback ports under one state
//! folder.
//!
//! - [`Stack`]: [`Stack::up`] starts whatever is not running and waits until every server
//!   answers; [`Stack::open`] finds a running one; [`Stack::down`] stops it.
//! - [`handles`]: typed handles ([`Postgres`], [`ZooKeeper`], [`Replica`], [`Ch26`]) with
//!   their ports and `stop`/`kill`/`freeze`/`thaw`/`start`.
//! - The servers: [`postgres`] (and its hot standby), [`zookeeper`], [`clickhouse`] (the
//!   replicas), [`ch26`]; [`server_config`], the one `config.xml` template, [`users`], the one `users.xml`
//!   template of every ClickHouse server, and [`deploy`], the files of `deploy/` rendered from
//!   it.
//! - The plumbing: [`ctx`] (the state folder, timeouts, pid files), [`process`] (detached
//!   servers, signals, bounded stops), [`ports`] (random loopback ports reserved
//!   machine-wide, shared with `scripts/lib.sh`), [`env`] (`DIR/stack.env`), [`http`] (the
//!   probes), [`error`].
//!
//! `src/main.rs` is the command line (`scripts/stack.sh` hands every subcommand but
//! `install` to it); the tests use the library.
//!
//! # Shards
//!
//! `up --shards S --replicas R` runs S×R 18.16 servers (at most [`MAX_REPLICAS`]) on the one
//! ZooKeeper: server `i` = (s-1)·R + r (from 1) is replica `r` of shard `s`, with macros
//! `{shard}` = `s` and `{replica}` = `ri` (unique over the cluster), so that
//! `/clickhouse/tables/{shard}/...` differs per shard. Every server's `remote_servers` has the
//! cluster `collector` of the S shards in order, each with `internal_replication` on and its R
//! replicas' TCP ports on 127.0.0.1. With S = 1 (the default) this is the one shard of R
//! replicas the stack always ran. `--ch26-servers K` runs K 26.x servers, each an unreplicated
//! shard of the cluster `collector26` (their TCP ports) in every 26.x server's
//! `remote_servers`. The folder remembers S, R and K for the next `up`.
//!
//! # `DIR/stack.env`
//!
//! Written by `up`, `KEY=VALUE` lines: `STACK_DIR`, `PG_PORT`, `PG_DATA`, `PG_SOCKET_DIR`,
//! `PG_USER` (postgres), `PG_DATABASE` (collector), `DATABASE_URL`, `GEO_DB` (when
//! `STACK_GEO_DB` names a non-empty file), `ZK_PORT`, `ZK_HOSTS`, `CH_SHARDS` (S),
//! `CH_REPLICAS` (R, replicas per shard), `CH_SERVERS` (S×R), `CH_CLUSTER` (collector),
//! `CH_SHARD` (1, the shard of server 1), per server (i = 1..=S×R) `CHi_HTTP_PORT`,
//! `CHi_TCP_PORT`, `CHi_INTERSERVER_PORT`, `CHi_SHARD` (s), `CHi_REPLICA` (ri), `CHi_URL`;
//! `CLICKHOUSE_URL` (server 1), `CLICKHOUSE_URLS` (comma-separated: every server when S = 1;
//! when S > 1 only shard 1's replicas, so that a collector given it alone writes to one shard
//! as before), `CLICKHOUSE_SHARDS` (every shard in the collector's
//! `COLLECTOR_CLICKHOUSE_SHARDS` syntax: `shard1=URL,URL;shard2=URL,URL`, replicas in order;
//! with S = 1 just `shard1=...`); with the 26.x servers `CH26_SERVERS` (K), `CH26_CLUSTER`
//! (collector26), `CH26_HTTP_PORT`, `CH26_TCP_PORT`, `CH26_URL` (server 1), per server
//! (k = 1..=K) `CH26_k_HTTP_PORT`, `CH26_k_TCP_PORT`, `CH26_k_URL`, and `CH26_SHARDS`
//! (`ch26a=URL;ch26b=URL;...`, each server an unreplicated shard); once the standby exists
//! `PG_STANDBY_PORT`, `PG_STANDBY_DATA`, `DATABASE_URL_FAILOVER` (a multi-host URL).

pub mod ch26;
pub mod clickhouse;
pub mod ctx;
pub mod deploy;
pub mod env;
pub mod error;
pub mod handles;
pub mod http;
mod lifecycle;
pub mod ports;
pub mod postgres;
pub mod process;
pub mod server_config;
mod status;
pub mod users;
pub mod zookeeper;

use std::path::{Path, PathBuf};

pub use error::{Error, Result};
pub use handles::{Action, Ch26, Postgres, Replica, ZooKeeper};
pub use status::Health;

use ctx::Ctx;
use env::Env;
use postgres::Pg;
use process::Flock;

/// Most ClickHouse 18.16 servers a stack runs, over all its shards (their names are one
/// digit: `ch1`..`ch9`).
pub const MAX_REPLICAS: usize = 9;
/// How long an operation waits for another one on the same folder (its lock), in seconds.
pub const LOCK_WAIT_SECS: u64 = 300;

/// What [`Stack::up`] starts.
#[derive(Debug, Clone, Copy, Default)]
pub struct UpOptions {
    /// ClickHouse 18.16 replicas per shard (shards × replicas at most [`MAX_REPLICAS`]);
    /// None: as the folder was last started, or 2.
    pub replicas: Option<usize>,
    /// Run the ClickHouse 26.x servers (Some(false) stops them); None: as last started.
    pub ch26: Option<bool>,
    /// ClickHouse 18.16 shards, from 1; None: as the folder was last started, or 1.
    pub shards: Option<usize>,
    /// How many 26.x servers when they run, 1..=[`ch26::MAX_SERVERS`]; None: as last
    /// started, or 1.
    pub ch26_servers: Option<usize>,
}

/// A stack in a state folder. Operations on one folder are serialised by `flock` on
/// `DIR/.lock` (shared with any other process working on it); the ports live in
/// `DIR/stack.env`, read again by every call.
#[derive(Debug)]
pub struct Stack {
    ctx: Ctx,
}

impl Stack {
    /// The stack of an existing folder (it need not run). Errors: no such folder, or a path
    /// [`Stack::up`] would refuse.
    pub fn open(dir: &Path) -> Result<Stack> {
        let dir = checked_dir(dir)?;
        if !dir.join("stack.env").is_file() {
            return Err(Error::new(format!(
                "no stack in {} (no stack.env)",
                dir.display()
            )));
        }
        Ok(Stack {
            ctx: Ctx::new(&dir),
        })
    }

    /// The state folder.
    pub fn dir(&self) -> &Path {
        &self.ctx.dir
    }

    /// `DIR/stack.env` as it is now (empty before the first `up`).
    pub fn env(&self) -> Result<Env> {
        Env::read(&self.ctx.path("stack.env"))
    }

    /// The PostgreSQL primary.
    pub fn postgres(&self) -> Postgres<'_> {
        Postgres {
            stack: self,
            pg: Pg::Primary,
        }
    }

    /// The PostgreSQL hot standby (not started by `up`; [`Postgres::start`] creates it).
    pub fn pg_standby(&self) -> Postgres<'_> {
        Postgres {
            stack: self,
            pg: Pg::Standby,
        }
    }

    /// ZooKeeper.
    pub fn zookeeper(&self) -> ZooKeeper<'_> {
        ZooKeeper { stack: self }
    }

    /// ClickHouse replica `i`, from 1.
    pub fn replica(&self, i: usize) -> Replica<'_> {
        Replica { stack: self, i }
    }

    /// Every ClickHouse 18.16 server of every shard, in order (shard 1's replicas first).
    pub fn replicas(&self) -> Vec<Replica<'_>> {
        let n = self
            .env()
            .ok()
            .and_then(|e| clickhouse::layout(&e).ok())
            .map_or(0, |(shards, replicas)| shards * replicas);
        (1..=n).map(|i| self.replica(i)).collect()
    }

    /// The first ClickHouse 26.x server, when the stack runs one.
    pub fn ch26(&self) -> Option<Ch26<'_>> {
        self.ch26_server(1)
    }

    /// The ClickHouse 26.x server `k` (from 1), when the stack runs that many.
    pub fn ch26_server(&self, k: usize) -> Option<Ch26<'_>> {
        let env = self.env().ok()?;
        (k >= 1 && k <= ch26::servers(&env)).then_some(Ch26 { stack: self, k })
    }

    /// Every ClickHouse 26.x server, in order.
    pub fn ch26_servers(&self) -> Vec<Ch26<'_>> {
        let k = self.env().map_or(0, |e| ch26::servers(&e));
        (1..=k).map(|k| Ch26 { stack: self, k }).collect()
    }

    fn lock(&self) -> Result<Flock> {
        Flock::exclusive(&self.ctx.path(".lock"), LOCK_WAIT_SECS)
    }

    /// Port `key` of `stack.env`; 0 when missing (a request to it fails, saying the port).
    fn port(&self, key: &str) -> u16 {
        self.env().ok().and_then(|e| e.port(key)).unwrap_or(0)
    }
}

/// `dir` holds a stack: its `stack.env`, or nothing but what `up` makes before it writes
/// that file (`.lock`, pid files, `pg`, `pg-standby`, `zk`, `ch1`..`ch9`, `ch26`,
/// `ch26-2`..`ch26-9`). An empty folder counts.
fn holds_stack(dir: &Path) -> bool {
    if dir.join("stack.env").is_file() {
        return true;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.filter_map(|e| e.ok()).all(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        let replica =
            name.len() == 3 && name.starts_with("ch") && name.as_bytes()[2].is_ascii_digit();
        let more_ch26 =
            name.len() == 6 && name.starts_with("ch26-") && name.as_bytes()[5].is_ascii_digit();
        name == ".lock"
            || name.ends_with(".pid")
            || replica
            || more_ch26
            || matches!(name.as_str(), "pg" | "pg-standby" | "zk" | "ch26")
    })
}

/// `dir` made absolute and checked: no `.` or `..` component, resolved through symbolic
/// links when it exists (one stack, one path: the pid checks compare paths), only
/// `[A-Za-z0-9._/+-]` (it is embedded in XML and `stack.env` as is), not `/`, no trailing `/`.
fn checked_dir(dir: &Path) -> Result<PathBuf> {
    use std::path::Component;
    if dir
        .components()
        .any(|c| matches!(c, Component::CurDir | Component::ParentDir))
    {
        return Err(Error::new(format!(
            "DIR must not contain . or .. components: {}",
            dir.display()
        )));
    }
    let dir = process::absolute(dir);
    let dir = dir.canonicalize().unwrap_or(dir);
    let text = dir.to_string_lossy().trim_end_matches('/').to_owned();
    let ok = text.len() > 1
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._/+-".contains(c));
    if !ok {
        return Err(Error::new(format!(
            "DIR may only contain [A-Za-z0-9._/+-] and must not be /: {}",
            dir.display()
        )));
    }
    Ok(PathBuf::from(text))
}
