//! What every server module is given: the state folder, the timeouts, and the pid files.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::process;

/// Default bound of every wait for a server to answer (`STACK_READY_TIMEOUT`, seconds).
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Default grace between SIGTERM and SIGKILL (`STACK_STOP_TIMEOUT`, seconds).
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest `STACK_READY_TIMEOUT` or `STACK_STOP_TIMEOUT` taken, in seconds (an hour).
pub const MAX_TIMEOUT_SECS: u64 = 3600;

/// The state folder of one stack and its timeouts.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// The state folder: absolute, of `[A-Za-z0-9._/+-]` only (it is embedded in XML and
    /// `stack.env` unescaped), no trailing `/`.
    pub dir: PathBuf,
    /// Bound of every wait for a server to answer.
    pub ready: Duration,
    /// Grace between SIGTERM and SIGKILL.
    pub stop: Duration,
}

/// The command name (/proc/PID/comm, at most 15 bytes) of server `name`'s process:
/// `postgres` for `pg` and `pg-standby`, `java` for `zk`, `python*` for `ch26` and `ch26-K` (its
/// launcher), `clickhouse-serv` for a replica `chI`.
pub fn is_server(name: &str, comm: &str) -> bool {
    match name {
        "pg" | "pg-standby" => comm == "postgres",
        "zk" => comm == "java",
        ch26 if ch26 == "ch26" || ch26.starts_with("ch26-") => comm.starts_with("python"),
        _ => comm == "clickhouse-serv",
    }
}

impl Ctx {
    /// The context of `dir`, with the timeouts from `STACK_READY_TIMEOUT` and
    /// `STACK_STOP_TIMEOUT` (whole seconds) or their defaults.
    pub fn new(dir: &Path) -> Ctx {
        let secs = |var: &str, default: Duration| match std::env::var(var) {
            Err(_) => default,
            Ok(v) => match v.parse::<u64>() {
                Ok(s) if (1..=MAX_TIMEOUT_SECS).contains(&s) => Duration::from_secs(s),
                _ => {
                    log(&format!(
                        "note: {var}={v} is not 1..={MAX_TIMEOUT_SECS} seconds; using {}s",
                        default.as_secs()
                    ));
                    default
                }
            },
        };
        Ctx {
            dir: dir.to_path_buf(),
            ready: secs("STACK_READY_TIMEOUT", READY_TIMEOUT),
            stop: secs("STACK_STOP_TIMEOUT", STOP_TIMEOUT),
        }
    }

    /// `DIR/rel`.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    /// The deadline of a wait that starts now.
    pub fn ready_deadline(&self) -> Instant {
        Instant::now() + self.ready
    }

    /// The pid of server `name` (`pg`, `pg-standby`, `zk`, `ch1`.., `ch26`) when it is alive:
    /// from PostgreSQL's own `postmaster.pid` for `pg` and `pg-standby`, else `DIR/NAME.pid`.
    pub fn pid_of(&self, name: &str) -> Option<u32> {
        let postmaster = self.dir.join(name).join("data/postmaster.pid");
        let file = if (name == "pg" || name == "pg-standby") && postmaster.exists() {
            postmaster
        } else {
            self.dir.join(format!("{name}.pid"))
        };
        process::pid_in(&file, &self.dir.join(name), |comm| is_server(name, comm))
    }

    /// True (and says so) when server `name` is stopped by SIGSTOP: waiting for it to answer
    /// would only run into the timeout.
    pub fn frozen_note(&self, name: &str) -> bool {
        match self.pid_of(name) {
            Some(pid) if process::frozen(pid) => {
                log(&format!(
                    "note: {name} (pid {pid}) is frozen (SIGSTOP); not waiting for it"
                ));
                true
            }
            _ => false,
        }
    }
}

/// "stack: MESSAGE" on stderr.
pub fn log(message: &str) {
    eprintln!("stack: {message}");
}
