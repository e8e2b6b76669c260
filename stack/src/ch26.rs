//! The ClickHouse 26.x servers beside the replicas (`up --ch26 [--ch26-servers K]`):
//! chdb-core's clickhouse-local from PyPI, run by `scripts/ch26/server.py` (one server per
//! process) from a Python venv in a folder where [`write_config`] put its `config.xml` and
//! `users.xml` (from the one template, [`crate::server_config`] and [`crate::users`]). Not
//! replicas: no ZooKeeper, no interserver port, not in the cluster `collector`. Each of the
//! stack's K servers (K = `CH26_SERVERS`, 1 by default) is an unreplicated shard of the
//! cluster [`CLUSTER26`] (`collector26`) in every one's `remote_servers`. The tests' own 26.x
//! servers are made the same way (without a cluster).
//!
//! Server `k` (from 1) is named [`name`] `k`: `ch26` for the first (as before there were
//! several), `ch26-K` for the others. Layout of `DIR/NAME`: `data/` (the server's path),
//! `log/server.log` (its output: the server's own log files stay empty, it says what it has
//! to say on stderr), `stop.fifo` (a line written to it stops it). `DIR/NAME.pid` holds the
//! launcher's pid. Its ports are [`port_keys`] `k` of `stack.env`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::ctx::Ctx;
use crate::env::Env;
use crate::error::{Error, Result};
pub use crate::server_config::CLUSTER26;
use crate::server_config::{Local, ServerConfig};
use crate::users::{users_xml, Root, User};
use crate::{http, process};

/// The pip requirement of the 26.x server: ClickHouse 26.9 as clickhouse-local.
pub const PACKAGE: &str = "chdb-core==26.9.0";

/// Poll interval of [`wait`] (the server is ready about 1 s after its start).
const POLL: Duration = Duration::from_millis(50);

/// Most 26.x servers a stack runs (shards `ch26a`..`ch26i`).
pub const MAX_SERVERS: usize = 9;

/// The name of the stack's 26.x server `k` (from 1): its folder and pid file under `DIR`;
/// `ch26` for the first, `ch26-K` for the others.
pub fn name(k: usize) -> String {
    if k == 1 {
        "ch26".to_owned()
    } else {
        format!("ch26-{k}")
    }
}

/// The `stack.env` keys holding server `k`'s HTTP and TCP ports: `CH26_HTTP_PORT` and
/// `CH26_TCP_PORT` for the first (`CH26_1_*` repeat them), `CH26_K_HTTP_PORT` and
/// `CH26_K_TCP_PORT` for the others.
pub fn port_keys(k: usize) -> [String; 2] {
    if k == 1 {
        ["CH26_HTTP_PORT".to_owned(), "CH26_TCP_PORT".to_owned()]
    } else {
        [format!("CH26_{k}_HTTP_PORT"), format!("CH26_{k}_TCP_PORT")]
    }
}

/// The shard name of server `k` in `CH26_SHARDS`: `ch26a`, `ch26b`, ...
pub fn shard_name(k: usize) -> String {
    let letter = char::from(b'a' + u8::try_from(k.saturating_sub(1) % 26).unwrap_or(0));
    format!("ch26{letter}")
}

/// How many 26.x servers `env` describes: `CH26_SERVERS`, else 1 when `CH26_HTTP_PORT` is set
/// (a folder from before there were several), else 0.
pub fn servers(env: &Env) -> usize {
    match env.get("CH26_SERVERS").and_then(|v| v.parse().ok()) {
        Some(k) => k,
        None => usize::from(env.get("CH26_HTTP_PORT").is_some()),
    }
}

/// The value of environment variable `name` when set and not empty (the shell's `${NAME:-}`).
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The venv holding chdb-core: `STACK_CH26_VENV`, else
/// `${XDG_CACHE_HOME:-$HOME/.cache}/collector-stack/ch26-venv` (`HOME` defaulting to `/root`);
/// empty variables count as unset.
pub fn venv() -> PathBuf {
    if let Some(v) = var("STACK_CH26_VENV") {
        return PathBuf::from(v);
    }
    let cache = var("XDG_CACHE_HOME").map_or_else(
        || PathBuf::from(var("HOME").unwrap_or_else(|| "/root".to_owned())).join(".cache"),
        PathBuf::from,
    );
    cache.join("collector-stack/ch26-venv")
}

/// The launcher script, `scripts/ch26/server.py` of the repository this crate was built from.
pub fn launcher() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .unwrap_or(manifest)
        .join("scripts/ch26/server.py")
}

/// The venv's `bin/python`.
fn python() -> PathBuf {
    venv().join("bin/python")
}

/// The venv holds chdb-core at [`PACKAGE`]'s version: its `bin/python` is executable and its
/// marker `.stack-installed` (written last by the install) names [`PACKAGE`].
pub fn installed() -> bool {
    use std::os::unix::ffi::OsStrExt;
    let python = python();
    let Ok(c) = std::ffi::CString::new(python.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access(2) on a NUL-terminated path this function owns.
    let executable = unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0;
    let marker = std::fs::read_to_string(venv().join(".stack-installed")).unwrap_or_default();
    executable && marker.trim_end_matches('\n') == PACKAGE
}

/// Writes the server folder `d`'s `config.xml` (from [`crate::server_config`]: HTTP and TCP
/// ports on 127.0.0.1, data in `d/data`, `displayName()` = `ch26:` and `d`) and its
/// `users.xml` (`users_xml`, text from [`crate::users`]; it must keep a password-less
/// `default` from loopback: clickhouse-local runs its own query as `default`), and makes
/// `d/data` and `d/log`.
///
/// Errors: a folder or file that could not be written.
pub fn write_config(d: &Path, http_port: u16, tcp_port: u16, users_xml: &str) -> Result<()> {
    write_cluster_config(d, http_port, tcp_port, users_xml, &[])
}

/// [`write_config`] with the cluster [`CLUSTER26`] in `remote_servers`: one shard of one
/// replica per TCP port of `cluster_tcp` (on 127.0.0.1), in order; none when it is empty.
///
/// Errors: a folder or file that could not be written.
pub fn write_cluster_config(
    d: &Path,
    http_port: u16,
    tcp_port: u16,
    users_xml: &str,
    cluster_tcp: &[u16],
) -> Result<()> {
    fs_err::create_dir_all(d.join("data"))?;
    fs_err::create_dir_all(d.join("log"))?;
    fs_err::write(
        d.join("config.xml"),
        config_text(d, http_port, tcp_port, cluster_tcp),
    )?;
    fs_err::write(d.join("users.xml"), users_xml)?;
    Ok(())
}

/// The `config.xml` of the server of folder `d` ([`write_cluster_config`]).
fn config_text(d: &Path, http_port: u16, tcp_port: u16, cluster_tcp: &[u16]) -> String {
    let name = format!("ch26:{}", d.display());
    ServerConfig {
        dir: d,
        http_port,
        tcp_port,
        tls: None,
        replication: None,
        local: Some(Local {
            display_name: &name,
            cluster26_tcp: cluster_tcp,
        }),
    }
    .render()
}

/// The command that runs the server of folder `d` (written by [`write_config`]): the venv's
/// python running [`launcher`] with `--workdir d`.
pub fn command(d: &Path) -> Command {
    let mut cmd = Command::new(python());
    cmd.arg(launcher()).arg("--workdir").arg(d);
    cmd
}

/// Server `k`'s HTTP and TCP ports and the TCP ports of the cluster [`CLUSTER26`] (servers
/// 1..=[`servers`]), from `env`.
fn stack_ports(env: &Env, k: usize) -> Result<(u16, u16, Vec<u16>)> {
    let [http_key, tcp_key] = port_keys(k);
    let cluster = (1..=servers(env).max(k))
        .map(|j| env.need_port(&port_keys(j)[1]))
        .collect::<Result<Vec<u16>>>()?;
    Ok((env.need_port(&http_key)?, env.need_port(&tcp_key)?, cluster))
}

/// Server `k`'s `config.xml` on disk differs from what `env` asks for now (another cluster
/// or other ports): a running server must be restarted to take it. False when `env` lacks
/// a port (launching then says which).
pub fn config_changed(ctx: &Ctx, env: &Env, k: usize) -> bool {
    let Ok((http, tcp, cluster)) = stack_ports(env, k) else {
        return false;
    };
    let d = ctx.path(&name(k));
    let text = config_text(&d, http, tcp, &cluster);
    std::fs::read_to_string(d.join("config.xml")).map_or(true, |old| old != text)
}

/// Starts the stack's 26.x server `k` detached in `DIR/NAME` ([`name`]; [`write_cluster_config`]
/// with the ports [`port_keys`] `k`, the cluster of servers 1..=`CH26_SERVERS` and `default`
/// without a password, from loopback); output appended to `DIR/NAME/log/server.log`, pid in
/// `DIR/NAME.pid`. Does not wait for it to answer (see [`wait`]).
///
/// Errors: a port missing from `env`, a folder or file that could not be written, or a
/// launcher that could not be started.
pub fn launch(ctx: &Ctx, env: &Env, k: usize) -> Result<()> {
    let (http_port, tcp_port, cluster) = stack_ports(env, k)?;
    let d = ctx.path(&name(k));
    let users = users_xml(Root::ClickHouse, &[], &[], &[User::DEFAULT]);
    write_cluster_config(&d, http_port, tcp_port, &users, &cluster)?;
    process::spawn(
        &ctx.path(&format!("{}.pid", name(k))),
        &d.join("log/server.log"),
        command(&d),
    )?;
    Ok(())
}

/// The name this DIR's server `k` answers `SELECT displayName()` with ([`write_config`]).
fn display_name(ctx: &Ctx, k: usize) -> String {
    format!("ch26:{}/{}", ctx.dir.display(), name(k))
}

/// The 26.x server `k` answers `GET /ping` on its HTTP port with `Ok.` and is this DIR's (its
/// `displayName()` is `ch26:DIR/NAME`), not another server on a port taken meanwhile. Each
/// request is bounded by 2 s; false when the port is missing from `env`.
pub fn ping(ctx: &Ctx, env: &Env, k: usize) -> bool {
    let Some(port) = env.port(&port_keys(k)[0]) else {
        return false;
    };
    let url = format!("http://127.0.0.1:{port}");
    http::get(&format!("{url}/ping")).as_deref() == Some("Ok.")
        && http::get(&format!("{url}/?query=SELECT%20displayName()"))
            .is_some_and(|n| n == display_name(ctx, k))
}

/// Waits, polling every 50 ms for up to `ctx.ready`, until [`ping`] of server `k` succeeds.
///
/// Errors (with the tail of `DIR/NAME/log/server.log`): "the ClickHouse 26.x server NAME
/// exited during startup" when its process (`DIR/NAME.pid`) is gone, "...did not answer /ping
/// (as ch26:DIR/NAME) on 127.0.0.1:PORT within Ns" at the timeout; or its HTTP port missing.
pub fn wait(ctx: &Ctx, env: &Env, k: usize) -> Result<()> {
    let port = env.need_port(&port_keys(k)[0])?;
    let deadline = ctx.ready_deadline();
    let n = name(k);
    let log = ctx.path(&format!("{n}/log/server.log"));
    while !ping(ctx, env, k) {
        if ctx.pid_of(&n).is_none() {
            return Err(Error::with_logs(
                format!("the ClickHouse 26.x server {n} exited during startup"),
                &[&log],
            ));
        }
        if Instant::now() >= deadline {
            let msg = format!(
                "the ClickHouse 26.x server {n} did not answer /ping (as {}) on 127.0.0.1:{port} within {}s",
                display_name(ctx, k),
                ctx.ready.as_secs()
            );
            return Err(Error::with_logs(msg, &[&log]));
        }
        std::thread::sleep(POLL);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launcher_is_the_repository_script() {
        assert!(launcher().ends_with("scripts/ch26/server.py"));
        assert!(launcher().is_file());
    }

    #[test]
    fn display_name_is_ch26_and_workdir() {
        let ctx = Ctx::new(Path::new("/tmp/st"));
        assert_eq!(display_name(&ctx, 1), "ch26:/tmp/st/ch26");
        assert_eq!(display_name(&ctx, 2), "ch26:/tmp/st/ch26-2");
    }

    #[test]
    fn the_config_names_the_folder_ports_and_users() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("ch26");
        write_config(&d, 20001, 20002, "<yandex/>").unwrap();
        let config = std::fs::read_to_string(d.join("config.xml")).unwrap();
        let name = format!("<display_name>ch26:{}</display_name>", d.display());
        assert!(config.contains(&name), "{config}");
        assert!(config.contains("<http_port>20001</http_port>"));
        assert!(config.contains("<tcp_port>20002</tcp_port>"));
        let users = format!("<users_config>{}/users.xml</users_config>", d.display());
        assert!(config.contains(&users), "{config}");
        for absent in [
            "<logger>",
            "keep_alive_timeout",
            "user_files_path",
            "zookeeper",
        ] {
            assert!(!config.contains(absent), "{absent} in {config}");
        }
        assert_eq!(
            std::fs::read_to_string(d.join("users.xml")).unwrap(),
            "<yandex/>"
        );
        assert!(d.join("data").is_dir() && d.join("log").is_dir());
    }

    #[test]
    fn ping_without_port_is_false() {
        let ctx = Ctx::new(Path::new("/tmp/st"));
        assert!(!ping(&ctx, &Env::default(), 1));
        assert!(wait(&ctx, &Env::default(), 2).is_err());
    }
}
