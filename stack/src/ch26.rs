//! One real ClickHouse 26.x server beside the replicas (`up --ch26`): chdb-core's
//! clickhouse-local from PyPI, run by `scripts/ch26/server.py` from a Python venv in a folder
//! where [`write_config`] put its `config.xml` and `users.xml` (from the one template,
//! [`crate::server_config`] and [`crate::users`]). Not a replica: no ZooKeeper, no
//! interserver port, not in the cluster. The tests' own 26.x servers are made the same way.
//!
//! Layout of `DIR/ch26`: `data/` (the server's path), `log/server.log` (its output: the
//! server's own log files stay empty, it says what it has to say on stderr), `stop.fifo` (a
//! line written to it stops it). `DIR/ch26.pid` holds the launcher's pid.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::ctx::Ctx;
use crate::env::Env;
use crate::error::{Error, Result};
use crate::server_config::{Local, ServerConfig};
use crate::users::{users_xml, Root, User};
use crate::{http, process};

/// The pip requirement of the 26.x server: ClickHouse 26.9 as clickhouse-local.
pub const PACKAGE: &str = "chdb-core==26.9.0";

/// Poll interval of [`wait`] (the server is ready about 1 s after its start).
const POLL: Duration = Duration::from_millis(50);

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
    fs_err::create_dir_all(d.join("data"))?;
    fs_err::create_dir_all(d.join("log"))?;
    let name = format!("ch26:{}", d.display());
    let config = ServerConfig {
        dir: d,
        http_port,
        tcp_port,
        tls: None,
        replication: None,
        local: Some(Local {
            display_name: &name,
        }),
    };
    fs_err::write(d.join("config.xml"), config.render())?;
    fs_err::write(d.join("users.xml"), users_xml)?;
    Ok(())
}

/// The command that runs the server of folder `d` (written by [`write_config`]): the venv's
/// python running [`launcher`] with `--workdir d`.
pub fn command(d: &Path) -> Command {
    let mut cmd = Command::new(python());
    cmd.arg(launcher()).arg("--workdir").arg(d);
    cmd
}

/// Starts the 26.x server detached in `DIR/ch26` ([`write_config`] with the ports
/// `CH26_HTTP_PORT`/`CH26_TCP_PORT` and `default` without a password, from loopback);
/// output appended to `DIR/ch26/log/server.log`, pid in `DIR/ch26.pid`. Does not wait for it
/// to answer (see [`wait`]).
///
/// Errors: a port missing from `env`, a folder or file that could not be written, or a
/// launcher that could not be started.
pub fn launch(ctx: &Ctx, env: &Env) -> Result<()> {
    let http_port = env.need_port("CH26_HTTP_PORT")?;
    let tcp_port = env.need_port("CH26_TCP_PORT")?;
    let d = ctx.path("ch26");
    let users = users_xml(Root::ClickHouse, &[], &[], &[User::DEFAULT]);
    write_config(&d, http_port, tcp_port, &users)?;
    process::spawn(
        &ctx.path("ch26.pid"),
        &d.join("log/server.log"),
        command(&d),
    )?;
    Ok(())
}

/// The name this DIR's server answers `SELECT displayName()` with ([`write_config`]).
fn display_name(ctx: &Ctx) -> String {
    format!("ch26:{}/ch26", ctx.dir.display())
}

/// The 26.x server on `CH26_HTTP_PORT` answers `GET /ping` with `Ok.` and is this DIR's (its
/// `displayName()` is `ch26:DIR/ch26`), not another server on a port taken meanwhile. Each
/// request is bounded by 2 s; false when the port is missing from `env`.
pub fn ping(ctx: &Ctx, env: &Env) -> bool {
    let Some(port) = env.port("CH26_HTTP_PORT") else {
        return false;
    };
    let url = format!("http://127.0.0.1:{port}");
    http::get(&format!("{url}/ping")).as_deref() == Some("Ok.")
        && http::get(&format!("{url}/?query=SELECT%20displayName()"))
            .is_some_and(|name| name == display_name(ctx))
}

/// Waits, polling every 50 ms for up to `ctx.ready`, until [`ping`] succeeds.
///
/// Errors (with the tail of `DIR/ch26/log/server.log`): "the ClickHouse 26.x server exited
/// during startup" when its process (`DIR/ch26.pid`) is gone, "...did not answer /ping (as
/// ch26:DIR/ch26) on 127.0.0.1:PORT within Ns" at the timeout; or `CH26_HTTP_PORT` missing.
pub fn wait(ctx: &Ctx, env: &Env) -> Result<()> {
    let port = env.need_port("CH26_HTTP_PORT")?;
    let deadline = ctx.ready_deadline();
    let log = ctx.path("ch26/log/server.log");
    while !ping(ctx, env) {
        if ctx.pid_of("ch26").is_none() {
            return Err(Error::with_logs(
                "the ClickHouse 26.x server exited during startup",
                &[&log],
            ));
        }
        if Instant::now() >= deadline {
            let msg = format!(
                "the ClickHouse 26.x server did not answer /ping (as {}) on 127.0.0.1:{port} within {}s",
                display_name(ctx),
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
        assert_eq!(display_name(&ctx), "ch26:/tmp/st/ch26");
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
        assert!(!ping(&ctx, &Env::default()));
        assert!(wait(&ctx, &Env::default()).is_err());
    }
}
