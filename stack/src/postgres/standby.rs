//! The hot standby (`DIR/pg-standby`): made from the primary with `pg_basebackup`, awaited
//! while it replays, promoted, and asked its role; the primary's replication access it needs.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use super::*;

/// Clones the running primary into `DIR/pg-standby/data` with `pg_basebackup -R -X stream`
/// (bounded by `ctx.ready`; cloned into `data.tmp` and renamed when complete, so that
/// `data/PG_VERSION` always means a whole copy), after making sure the primary accepts
/// replication connections from 127.0.0.1 (a trust line is put first in its `pg_hba.conf`
/// and it is reloaded if not). `primary_conninfo` is dropped from the copy's
/// `postgresql.auto.conf`: [`launch`] writes it to `stack.conf`, following `PG_PORT`.
///
/// Errors: `pg_basebackup` missing; the primary not running, frozen, refusing replication
/// connections for `ctx.ready` (with the tail of its log); `pg_basebackup` failed (with the
/// tails of `basebackup.log` and the primary's log); `PG_PORT` missing from `env`.
pub fn standby_create(ctx: &Ctx, env: &Env) -> Result<()> {
    let port = Pg::Primary.need_port(env)?;
    let d = ctx.path("pg-standby");
    let basebackup = format!("{PG_BIN}/pg_basebackup");
    if !is_executable(Path::new(&basebackup)) {
        return Err(Error::new(format!(
            "{basebackup} is missing; run: scripts/stack.sh install"
        )));
    }
    let dir = ctx.dir.display();
    if ctx.pid_of("pg").is_none() {
        return Err(Error::new(format!(
            "PostgreSQL (the primary) is not running; run: up {dir}"
        )));
    }
    if ctx.frozen_note("pg") {
        return Err(Error::new(format!(
            "PostgreSQL (the primary) is frozen; use: pg {dir} thaw"
        )));
    }
    allow_replication(ctx, port)?;
    make_reachable(ctx)?;
    fs_err::create_dir_all(&d)?;
    chown_pg(&d);
    let tmp = d.join("data.tmp");
    remove_dir_if_present(&tmp)?;
    log(&format!(
        "cloning the primary (127.0.0.1:{port}) into {}",
        d.join("data").display()
    ));
    run_basebackup(ctx, port, &tmp)?;
    drop_primary_conninfo(&tmp.join("postgresql.auto.conf"))?;
    fs_err::rename(&tmp, d.join("data"))?;
    Ok(())
}

/// `pg_basebackup` of the primary on `port` into `target`, as postgres, within `ctx.ready`.
fn run_basebackup(ctx: &Ctx, port: u16, target: &Path) -> Result<()> {
    let mut cmd = as_pg("timeout");
    cmd.arg(ctx.ready.as_secs().to_string());
    cmd.arg(format!("{PG_BIN}/pg_basebackup"));
    cmd.args([
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-U",
        "postgres",
        "-w",
    ]);
    cmd.arg("-D").arg(target);
    cmd.args(["-R", "-X", "stream", "-c", "fast", "--no-sync"]);
    process::run_logged(
        cmd,
        &ctx.path("pg-standby/basebackup.log"),
        &format!("pg_basebackup from 127.0.0.1:{port}"),
        &[&ctx.path("pg/postgres.log")],
        tool_limit(ctx),
    )
}

/// Removes the `primary_conninfo = ...` lines of `auto_conf` (written in place: the file
/// keeps its owner and mode).
pub(super) fn drop_primary_conninfo(auto_conf: &Path) -> Result<()> {
    let text = fs_err::read_to_string(auto_conf)?;
    let kept: String = text
        .split_inclusive('\n')
        .filter(|line| {
            let rest = line.strip_prefix("primary_conninfo").map(str::trim_start);
            !rest.is_some_and(|r| r.starts_with('='))
        })
        .collect();
    fs_err::write(auto_conf, kept)?;
    Ok(())
}

/// Waits (up to `ctx.ready`) until the standby accepts connections and is in recovery, or
/// out of it when it has been promoted (no `standby.signal`); then writes its pid to
/// `DIR/pg-standby.pid`.
///
/// Errors: `PG_STANDBY_PORT` missing from `env`; the standby exited, or is not in the
/// expected state in time (both with the tail of `DIR/pg-standby/postgres.log`).
pub fn standby_wait(ctx: &Ctx, env: &Env) -> Result<()> {
    let port = Pg::Standby.need_port(env)?;
    let d = ctx.path("pg-standby");
    let want = d.join("data/standby.signal").is_file();
    let deadline = ctx.ready_deadline();
    let log_file = d.join("postgres.log");
    loop {
        let Some(pid) = ctx.pid_of("pg-standby") else {
            return Err(Error::with_logs(
                "the PostgreSQL standby exited during startup",
                &[&log_file],
            ));
        };
        let got = in_recovery(port);
        if got == Some(want) {
            fs_err::write(ctx.path("pg-standby.pid"), format!("{pid}\n"))?;
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Error::with_logs(
                format!(
                    "PostgreSQL standby on 127.0.0.1:{port}: pg_is_in_recovery() is '{}', not '{}', after {}s",
                    tf(got),
                    tf(Some(want)),
                    ctx.ready.as_secs()
                ),
                &[&log_file],
            ));
        }
        std::thread::sleep(POLL);
    }
}

/// Promotes the running standby (`pg_ctl promote -w`, bounded by `ctx.ready`) and waits (up
/// to `ctx.ready`) until clients see it out of recovery. Says so and does nothing when it is
/// promoted already. It does not fence the old primary.
///
/// Errors: `PG_STANDBY_PORT` missing from `env`; the standby not running or frozen;
/// `pg_ctl promote` failed or it is still in recovery after `ctx.ready` (with the tails of
/// its `pg_ctl.log` / `postgres.log`).
pub fn standby_promote(ctx: &Ctx, env: &Env) -> Result<()> {
    let port = Pg::Standby.need_port(env)?;
    let d = ctx.path("pg-standby");
    let dir = ctx.dir.display();
    let Some(pid) = ctx.pid_of("pg-standby") else {
        return Err(Error::new(format!(
            "the standby is not running; run: pg-standby {dir} start"
        )));
    };
    if process::frozen(pid) {
        return Err(Error::new(format!(
            "the standby is frozen; use: pg-standby {dir} thaw"
        )));
    }
    if in_recovery(port) == Some(false) {
        log("the standby is already promoted");
        return Ok(());
    }
    let mut cmd = as_pg(&format!("{PG_BIN}/pg_ctl"));
    cmd.arg("-D").arg(d.join("data"));
    cmd.args(["promote", "-w", "-t", &ctx.ready.as_secs().to_string()]);
    let log_file = d.join("postgres.log");
    let pg_ctl_log = d.join("pg_ctl.log");
    let limit = tool_limit(ctx);
    process::run_logged(cmd, &pg_ctl_log, "pg_ctl promote", &[&log_file], limit)?;
    // pg_ctl -w waits for the control file to say "in production"; wait for what clients
    // see too.
    let deadline = ctx.ready_deadline();
    while in_recovery(port) != Some(false) {
        if Instant::now() >= deadline {
            return Err(Error::with_logs(
                format!(
                    "PostgreSQL standby on 127.0.0.1:{port} still in recovery {}s after promote",
                    ctx.ready.as_secs()
                ),
                &[&log_file],
            ));
        }
        std::thread::sleep(POLL);
    }
    log(&format!("promoted: 127.0.0.1:{port} is a primary now"));
    Ok(())
}

/// The standby's role for a status line: `standby of 127.0.0.1:PG_PORT` while it has a
/// `standby.signal`, else `promoted`.
pub fn standby_role(ctx: &Ctx, env: &Env) -> String {
    if ctx.path("pg-standby/data/standby.signal").is_file() {
        format!("standby of 127.0.0.1:{}", env.get("PG_PORT").unwrap_or(""))
    } else {
        "promoted".to_owned()
    }
}

/// The primary on `port` accepts a replication connection from postgres at 127.0.0.1
/// (`IDENTIFY_SYSTEM`, within 5 s).
fn replication_ok(port: u16) -> bool {
    let conn = format!(
        "host=127.0.0.1 port={port} user=postgres dbname=replication replication=true connect_timeout=2"
    );
    Command::new("timeout")
        .arg(PROBE_SECS.to_string())
        .arg(format!("{PG_BIN}/psql"))
        .args(["-X", "-q", "-tA", "-c", "IDENTIFY_SYSTEM", &conn])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Makes the primary on `port` accept replication connections from postgres at 127.0.0.1:
/// initdb's trust setup already does; otherwise a trust line is put first in `pg_hba.conf`
/// (the first matching line wins), the server reloaded, and the change awaited (up to
/// `ctx.ready`).
fn allow_replication(ctx: &Ctx, port: u16) -> Result<()> {
    if replication_ok(port) {
        return Ok(());
    }
    let hba = ctx.path("pg/data/pg_hba.conf");
    let text = fs_err::read_to_string(&hba)?;
    if !text.lines().any(|l| l == HBA_REPLICATION) {
        log(&format!(
            "allowing replication connections from 127.0.0.1 in {}",
            hba.display()
        ));
        let new = format!(
            "# added by the collector-stack crate for pg-standby\n{HBA_REPLICATION}\n{text}"
        );
        fs_err::write(&hba, new)?; // in place: keeps the file's owner and mode
    }
    let mut cmd = as_pg(&format!("{PG_BIN}/pg_ctl"));
    cmd.arg("-D").arg(ctx.path("pg/data")).arg("reload");
    status_logged(cmd, &ctx.path("pg/pg_ctl.log"));
    // The reload is asynchronous.
    let deadline = ctx.ready_deadline();
    while !replication_ok(port) {
        if Instant::now() >= deadline {
            return Err(Error::with_logs(
                format!(
                    "PostgreSQL on 127.0.0.1:{port} refuses replication connections from postgres"
                ),
                &[&ctx.path("pg/postgres.log")],
            ));
        }
        std::thread::sleep(POLL);
    }
    Ok(())
}
