//! PostgreSQL 15: the stack's primary (`DIR/pg`) and its optional hot standby
//! (`DIR/pg-standby`), run with PostgreSQL's own tools (`initdb`, `pg_ctl`, `pg_basebackup`,
//! `pg_isready`, `psql`) as the `postgres` user when this process is root (PostgreSQL refuses
//! to run as root).
//!
//! Layout of `DIR/NAME` (NAME = `pg` or `pg-standby`): `data/` (the cluster; `stack.conf` in
//! it is rewritten on every start and included from `postgresql.conf`), `postgres.log` (the
//! server's output), `pg_ctl.log`, `initdb.log` (primary) or `basebackup.log` (standby), and
//! `run/` (the unix socket, unless `DIR` is too deep for one: see [`socket_dir`]).
//! `DIR/NAME.pid` holds the postmaster's pid once it answers.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::ctx::{log, Ctx};
use crate::env::Env;
use crate::error::{Error, Result};
use crate::process::{self, POLL};

mod standby;
pub use standby::{standby_create, standby_promote, standby_role, standby_wait};

/// Folder of PostgreSQL 15's programs (Debian's `postgresql-15`).
pub const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// How long an orphaned backend may take to notice its postmaster died ([`reap_backends`]).
const REAP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a postmaster may take to exit after SIGKILL or a failed `pg_ctl stop`.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound of one `psql` probe ([`in_recovery`] and the replication check), seconds.
const PROBE_SECS: u64 = 5;
/// The `pg_hba.conf` line that lets `postgres` replicate from 127.0.0.1.
const HBA_REPLICATION: &str =
    "host    replication     postgres        127.0.0.1/32            trust";

/// Which PostgreSQL server of the stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pg {
    /// The primary, `DIR/pg`, port `PG_PORT`.
    Primary,
    /// The hot standby, `DIR/pg-standby`, port `PG_STANDBY_PORT`.
    Standby,
}

impl Pg {
    /// The server's name: `pg` or `pg-standby` (its folder under `DIR` and its pid file's name).
    pub fn name(self) -> &'static str {
        match self {
            Pg::Primary => "pg",
            Pg::Standby => "pg-standby",
        }
    }

    /// The server's TCP port on 127.0.0.1 from `env` (`PG_PORT` or `PG_STANDBY_PORT`); None
    /// when that key is missing or not a port.
    pub fn port(self, env: &Env) -> Option<u16> {
        env.port(self.port_key())
    }

    fn port_key(self) -> &'static str {
        match self {
            Pg::Primary => "PG_PORT",
            Pg::Standby => "PG_STANDBY_PORT",
        }
    }

    /// The port, or an error naming the missing key.
    fn need_port(self, env: &Env) -> Result<u16> {
        env.need_port(self.port_key())
    }
}

/// The folder of server `pg`'s unix socket: `DIR/NAME/run`, or, when that path is too long
/// for a socket path (over 80 bytes; the limit is 107 with the file name),
/// `/tmp/stack-pg-HASH` (`-standby` appended for the standby), HASH being the first 12 hex
/// digits of the FNV-1a hash of `DIR`.
pub fn socket_dir(ctx: &Ctx, pg: Pg) -> PathBuf {
    let d = ctx.dir.join(pg.name()).join("run");
    if d.as_os_str().len() + 20 <= 100 {
        return d;
    }
    let hash = fnv1a_hex(ctx.dir.as_os_str().as_encoded_bytes());
    let mut short = format!("/tmp/stack-pg-{}", &hash[..12]);
    if pg == Pg::Standby {
        short.push_str("-standby");
    }
    PathBuf::from(short)
}

/// Bound on one run of PostgreSQL's tools (`initdb`, `pg_ctl`, `pg_basebackup`): the stack's
/// readiness timeout (`pg_ctl -t` waits that long itself) and 30 s for the tool's own work.
fn tool_limit(ctx: &Ctx) -> Duration {
    ctx.ready + Duration::from_secs(30)
}

/// Creates the primary's cluster in `DIR/pg/data` with `initdb` (user postgres, trust
/// authentication for local and host connections, UTF8, locale C) and makes its
/// `postgresql.conf` include `stack.conf`. Does nothing when `DIR/pg/data/PG_VERSION` exists;
/// a half-made `data` folder is removed first.
///
/// Errors: `initdb` failed (with the tail of `DIR/pg/initdb.log`), a file could not be
/// written, or the postgres user could not be created or given access to `DIR`.
pub fn init(ctx: &Ctx) -> Result<()> {
    let pg = ctx.path("pg");
    if pg.join("data/PG_VERSION").is_file() {
        return Ok(());
    }
    make_reachable(ctx)?;
    fs_err::create_dir_all(&pg)?;
    remove_dir_if_present(&pg.join("data"))?;
    chown_pg(&pg);
    let initdb_log = pg.join("initdb.log");
    fs_err::File::create(&initdb_log)?; // bash: > (truncated), run_logged appends
    let mut cmd = as_pg(&format!("{PG_BIN}/initdb"));
    cmd.arg("-D").arg(pg.join("data"));
    cmd.args(["-U", "postgres", "--auth-local=trust", "--auth-host=trust"]);
    cmd.args([
        "--encoding=UTF8",
        "--locale=C",
        "--no-sync",
        "--no-instructions",
    ]);
    process::run_logged(cmd, &initdb_log, "initdb", &[], tool_limit(ctx))?;
    append(&pg.join("data/postgresql.conf"), "include = 'stack.conf'\n")
}

/// Starts server `pg` with `pg_ctl start -w` (bounded by `ctx.ready`), after rewriting its
/// `stack.conf` with the ports from `env` and, when no postmaster of it is alive, clearing
/// the stale lock files a killed one left (its data folder's `postmaster.pid` and its unix
/// socket's locks) once that postmaster's orphaned backends are gone ([`reap_backends`]).
/// Removes `DIR/NAME.pid` ([`wait_primary`] / [`standby_wait`] write it).
///
/// Errors: the port(s) missing from `env` (`PG_PORT`, and `PG_STANDBY_PORT` for the
/// standby), `pg_ctl start` failed or timed out (with the tails of `DIR/NAME/pg_ctl.log` and
/// `DIR/NAME/postgres.log`), a file could not be written.
pub fn launch(ctx: &Ctx, pg: Pg, env: &Env) -> Result<()> {
    let name = pg.name();
    let dir = ctx.path(name);
    make_reachable(ctx)?;
    write_conf(ctx, pg, env)?;
    remove_file_if_present(&ctx.path(&format!("{name}.pid")))?;
    if ctx.pid_of(name).is_none() {
        let postmaster_pid = dir.join("data/postmaster.pid");
        let old = std::fs::read_to_string(&postmaster_pid).unwrap_or_default();
        if old.lines().next().is_some() {
            reap_backends(ctx, pg);
        }
        remove_file_if_present(&postmaster_pid)?;
        remove_socket_locks(&socket_dir(ctx, pg));
    }
    let mut cmd = as_pg(&format!("{PG_BIN}/pg_ctl"));
    cmd.arg("-D").arg(dir.join("data"));
    cmd.arg("-l").arg(dir.join("postgres.log"));
    cmd.args(["-w", "-t", &ctx.ready.as_secs().to_string(), "start"]);
    let what = format!("pg_ctl start ({name})");
    process::run_logged(
        cmd,
        &dir.join("pg_ctl.log"),
        &what,
        &[&dir.join("postgres.log")],
        tool_limit(ctx),
    )
}

/// Waits (up to `ctx.ready`) until the primary is alive and accepts connections on
/// 127.0.0.1:`PG_PORT`, writes its pid to `DIR/pg.pid`, and creates the database
/// `collector` when it is missing.
///
/// Errors: `PG_PORT` missing from `env`; no answer in time (with the tail of
/// `DIR/pg/postgres.log`); `CREATE DATABASE` failed (with psql's message).
pub fn wait_primary(ctx: &Ctx, env: &Env) -> Result<()> {
    let port = Pg::Primary.need_port(env)?;
    let deadline = ctx.ready_deadline();
    let pid = loop {
        if let Some(pid) = ctx.pid_of("pg") {
            if isready(port, 1) {
                break pid;
            }
        }
        if Instant::now() >= deadline {
            return Err(Error::with_logs(
                format!(
                    "PostgreSQL did not accept connections on 127.0.0.1:{port} within {}s",
                    ctx.ready.as_secs()
                ),
                &[&ctx.path("pg/postgres.log")],
            ));
        }
        std::thread::sleep(POLL);
    };
    fs_err::write(ctx.path("pg.pid"), format!("{pid}\n"))?;
    let exists = "SELECT 1 FROM pg_database WHERE datname = 'collector'";
    if psql(ctx, port, exists)?.trim() != "1" {
        psql(ctx, port, "CREATE DATABASE collector")?;
    }
    Ok(())
}

/// Stops server `pg` with `pg_ctl stop -m fast` (after SIGCONT to all its processes, so that
/// a frozen one can exit), bounded by `ctx.stop`; SIGKILL to the postmaster when that fails.
/// Then waits for its orphaned backends ([`reap_backends`]) and removes `DIR/NAME.pid`. Nothing
/// to do (but the pid file's removal) when it is not running.
///
/// Errors: the postmaster still alive 10 s after that.
pub fn stop(ctx: &Ctx, pg: Pg) -> Result<()> {
    let name = pg.name();
    let pidfile = ctx.path(&format!("{name}.pid"));
    let Some(pid) = ctx.pid_of(name) else {
        return remove_file_if_present(&pidfile);
    };
    signal_group(libc::SIGCONT, pid);
    let mut cmd = as_pg(&format!("{PG_BIN}/pg_ctl"));
    cmd.arg("-D").arg(ctx.path(name).join("data"));
    cmd.args([
        "stop",
        "-m",
        "fast",
        "-w",
        "-t",
        &ctx.stop.as_secs().to_string(),
    ]);
    if !status_logged(cmd, &ctx.path(name).join("pg_ctl.log")) {
        log(&format!(
            "pg_ctl stop ({name}) failed; sending SIGKILL to postmaster {pid}"
        ));
        process::signal(pid, libc::SIGKILL);
    }
    if !process::wait_exit(pid, EXIT_TIMEOUT) {
        return Err(Error::new(format!("postmaster {pid} did not exit")));
    }
    reap_backends(ctx, pg);
    remove_file_if_present(&pidfile)
}

/// SIGKILL to server `pg`'s postmaster only, like a crash (after SIGCONT to all its
/// processes); waits up to 10 s for it to die, then for its backends ([`reap_backends`]).
/// Nothing to do when it is not running. Its pid files stay (a later [`launch`] clears them).
///
/// Errors: the postmaster survived SIGKILL for 10 s.
pub fn kill(ctx: &Ctx, pg: Pg) -> Result<()> {
    let Some(pid) = ctx.pid_of(pg.name()) else {
        return Ok(());
    };
    signal_group(libc::SIGCONT, pid);
    process::signal(pid, libc::SIGKILL);
    if !process::wait_exit(pid, EXIT_TIMEOUT) {
        return Err(Error::new("postmaster survived SIGKILL"));
    }
    reap_backends(ctx, pg);
    Ok(())
}

/// SIGSTOP to server `pg`'s postmaster and every process it runs ([`signal_group`]), so that
/// its open connections hang too.
///
/// Errors: "NAME is not running".
pub fn freeze(ctx: &Ctx, pg: Pg) -> Result<()> {
    match ctx.pid_of(pg.name()) {
        Some(pid) => {
            signal_group(libc::SIGSTOP, pid);
            Ok(())
        }
        None => Err(Error::new(format!("{} is not running", pg.name()))),
    }
}

/// SIGCONT to server `pg`'s processes ([`signal_group`]); says "NAME is not running" (no
/// error) when it is not running.
pub fn thaw(ctx: &Ctx, pg: Pg) -> Result<()> {
    match ctx.pid_of(pg.name()) {
        Some(pid) => signal_group(libc::SIGCONT, pid),
        None => log(&format!("{} is not running", pg.name())),
    }
    Ok(())
}

/// The server on 127.0.0.1:`port` accepts connections (`pg_isready`, user postgres, database
/// postgres, within 2 s).
pub fn is_ready(port: u16) -> bool {
    isready(port, 2)
}

/// `pg_isready` with a connection timeout of `secs` seconds.
fn isready(port: u16, secs: u32) -> bool {
    Command::new(format!("{PG_BIN}/pg_isready"))
        .args(["-q", "-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-U", "postgres", "-d", "postgres", "-t", &secs.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `SELECT pg_is_in_recovery()` on 127.0.0.1:`port`: Some(true) on a standby, Some(false) on
/// a primary, None when the server does not answer within 5 s (e.g. frozen or stopped).
pub fn in_recovery(port: u16) -> Option<bool> {
    let conn =
        format!("host=127.0.0.1 port={port} user=postgres dbname=postgres connect_timeout=2");
    let out = Command::new("timeout")
        .arg(PROBE_SECS.to_string())
        .arg(format!("{PG_BIN}/psql"))
        .args(["-X", "-q", "-tA", "-c", "SELECT pg_is_in_recovery()", &conn])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    match String::from_utf8_lossy(&out.stdout).trim() {
        "t" => Some(true),
        "f" => Some(false),
        _ => None,
    }
}

/// After server `pg`'s postmaster died: waits up to 10 s for its orphaned backends to notice
/// and exit, then SIGKILLs those left. A backend is a process named `postgres` whose working
/// folder is the data folder (`DIR/NAME/data`, where PostgreSQL puts it): not one found by the dead postmaster's pid or
/// process group, which the kernel may have handed to another process meanwhile (pid_max is
/// 32768 here; each backend is a process group of its own anyway).
pub fn reap_backends(ctx: &Ctx, pg: Pg) {
    let data = ctx.path(pg.name()).join("data");
    let Ok(data) = data.canonicalize() else {
        return;
    };
    let deadline = Instant::now() + REAP_TIMEOUT;
    loop {
        let left: Vec<u32> = process::with_cwd(&data)
            .into_iter()
            .filter(|p| process::comm(*p) == "postgres")
            .collect();
        if left.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            log(&format!(
                "killing leftover PostgreSQL processes of {}: {left:?}",
                data.display()
            ));
            for pid in left {
                process::signal(pid, libc::SIGKILL);
            }
            std::thread::sleep(POLL);
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends `sig` to the postmaster `pid` and to each of its children (each backend is a
/// process group of its own, so a group signal would not reach them). SIGSTOP goes to the
/// postmaster first (it then forks no new backend) and the children are listed after it;
/// any other signal goes to the children first, then the postmaster. Processes already gone
/// are no error.
pub fn signal_group(sig: i32, pid: u32) {
    let mut children = process::children(pid);
    if sig == libc::SIGSTOP {
        process::signal(pid, sig);
        children = process::children(pid);
    }
    for child in children {
        process::signal(child, sig);
    }
    if sig != libc::SIGSTOP {
        process::signal(pid, sig);
    }
}

// ------------------------------------------------------------------ helpers ---

/// `program` as a command run as the postgres user when this process is root.
fn as_pg(program: &str) -> Command {
    if is_root() {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--", program]);
        cmd
    } else {
        Command::new(program)
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid(2) cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The postgres user's uid and gid, if it exists.
fn pg_user() -> Option<(u32, u32)> {
    // SAFETY: getpwnam with a NUL-terminated literal; the fields are copied out at once (no
    // other thread of this crate calls getpwnam).
    unsafe {
        let pw = libc::getpwnam(c"postgres".as_ptr());
        (!pw.is_null()).then(|| ((*pw).pw_uid, (*pw).pw_gid))
    }
}

/// `chown postgres: path`; failures (not root, no such user) are ignored, as in bash.
fn chown_pg(path: &Path) {
    if let Some((uid, gid)) = pg_user() {
        let _ = std::os::unix::fs::chown(path, Some(uid), Some(gid));
    }
}

/// As root: creates the postgres user if missing, and adds the search bit (o+x) to each
/// folder from `DIR` up that the postgres user cannot enter (test harness temp folders are
/// often 0700), saying so. Nothing to do when not root.
///
/// Errors: `useradd` failed; a folder's mode could not be changed.
fn make_reachable(ctx: &Ctx) -> Result<()> {
    if !is_root() {
        return Ok(());
    }
    if pg_user().is_none() {
        let status = Command::new("useradd")
            .args(["--system", "--home-dir", "/var/lib/postgresql"])
            .args(["--shell", "/bin/bash", "postgres"])
            .stdin(Stdio::null())
            .status()?;
        if !status.success() {
            return Err(Error::new(format!("useradd postgres failed ({status})")));
        }
    }
    for d in ctx.dir.ancestors() {
        if d.as_os_str().is_empty() || d == Path::new("/") {
            break;
        }
        let reachable = Command::new("runuser")
            .args(["-u", "postgres", "--", "test", "-x"])
            .arg(d)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !reachable {
            log(&format!(
                "note: chmod o+x {} so that the postgres user can reach {}/pg",
                d.display(),
                ctx.dir.display()
            ));
            add_mode(d, 0o001)?;
        }
    }
    Ok(())
}

/// Adds the permission `bits` to `path`'s mode.
fn add_mode(path: &Path, bits: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut perms = fs_err::metadata(path)?.permissions();
    perms.set_mode(perms.mode() | bits);
    std::fs::set_permissions(path, perms)
        .map_err(|e| Error::new(format!("chmod o+x {}: {e}", path.display())))
}

/// Writes `DIR/NAME/data/stack.conf` (and creates the socket folder): the ports from `env`,
/// the same settings on both servers, and for the standby `hot_standby` and the
/// `primary_conninfo` pointing at `PG_PORT`.
fn write_conf(ctx: &Ctx, pg: Pg, env: &Env) -> Result<()> {
    let port = pg.need_port(env)?;
    let sock = socket_dir(ctx, pg);
    fs_err::create_dir_all(&sock)?;
    chown_pg(&sock);
    let standby = match pg {
        Pg::Primary => String::new(),
        // primary_conninfo is here rather than in postgresql.auto.conf (where pg_basebackup
        // -R put it) so that it follows PG_PORT should `up` re-pick it. Both settings are
        // ignored once promoted.
        Pg::Standby => format!(
            "\nhot_standby = on\nprimary_conninfo = 'host=127.0.0.1 port={} user=postgres application_name=pg-standby'",
            Pg::Primary.need_port(env)?
        ),
    };
    let conf = ctx.path(pg.name()).join("data/stack.conf");
    fs_err::write(&conf, conf_text(port, &sock, &standby))?;
    chown_pg(&conf);
    Ok(())
}

/// The text of `stack.conf`. The same settings on both servers: a hot standby needs
/// max_connections and max_wal_senders >= the primary's, and a promoted one serves standbys
/// itself. wal_keep_size lets a standby that was stopped for a while catch up by streaming
/// (no replication slot: a forgotten one would keep WAL forever).
fn conf_text(port: u16, sock: &Path, standby: &str) -> String {
    format!(
        "# generated by the collector-stack crate - rewritten on every start
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{}'
max_connections = 100
shared_buffers = 64MB
wal_level = replica
max_wal_senders = 5
wal_keep_size = 128MB
log_connections = on
log_disconnections = on
logging_collector = off
log_line_prefix = '%m [%p] %q%u@%d '
fsync = on{standby}
",
        sock.display()
    )
}

/// Runs `sql` with psql on the primary at 127.0.0.1:`port` (database postgres, unaligned
/// tuples only, stopping at the first error, within `ctx.ready`): its output.
fn psql(ctx: &Ctx, port: u16, sql: &str) -> Result<String> {
    let out = Command::new("timeout")
        .arg(ctx.ready.as_secs().to_string())
        .arg(format!("{PG_BIN}/psql"))
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1"])
        .args([
            "-p",
            &port.to_string(),
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-tA",
        ])
        .args(["-c", sql])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::new(format!("could not run psql: {e}")))?;
    if !out.status.success() {
        return Err(Error::new(format!(
            "psql -c '{sql}' on 127.0.0.1:{port} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `cmd` with stdin from /dev/null and its output appended to `log`: true on success.
fn status_logged(mut cmd: Command, log: &Path) -> bool {
    let Ok(out) = OpenOptions::new().create(true).append(true).open(log) else {
        return false;
    };
    let Ok(err) = out.try_clone() else {
        return false;
    };
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .status()
        .is_ok_and(|s| s.success())
}

/// Removes the unix socket's files (`.s.PGSQL.*`) in `sock`, if any.
fn remove_socket_locks(sock: &Path) {
    let Ok(entries) = std::fs::read_dir(sock) else {
        return;
    };
    for entry in entries.flatten() {
        if entry
            .file_name()
            .as_encoded_bytes()
            .starts_with(b".s.PGSQL.")
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn remove_file_if_present(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Error::new(format!("{}: {e}", path.display())))
        }
        _ => Ok(()),
    }
}

fn remove_dir_if_present(path: &Path) -> Result<()> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Error::new(format!("{}: {e}", path.display())))
        }
        _ => Ok(()),
    }
}

/// Appends `text` to `path` (which keeps its owner and mode).
fn append(path: &Path, text: &str) -> Result<()> {
    let mut f = OpenOptions::new().append(true).open(path)?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `t`, `f` or nothing, as psql prints `pg_is_in_recovery()`.
fn tf(value: Option<bool>) -> &'static str {
    match value {
        Some(true) => "t",
        Some(false) => "f",
        None => "",
    }
}

/// The 64-bit FNV-1a hash of `data` in lower-case hex (16 digits): a stable short name for a
/// folder, no security.
fn fnv1a_hex(data: &[u8]) -> String {
    let hash = data.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, byte| {
        (h ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_its_reference_values() {
        // FNV-1a 64 test vectors (draft-eastlake-fnv, section 6): "" and "a".
        assert_eq!(fnv1a_hex(b""), "cbf29ce484222325");
        assert_eq!(fnv1a_hex(b"a"), "af63dc4c8601ec8c");
    }

    #[test]
    fn socket_dir_is_short_enough() {
        let short = Ctx::new(Path::new("/tmp/s"));
        assert_eq!(
            socket_dir(&short, Pg::Standby),
            Path::new("/tmp/s/pg-standby/run")
        );
        let deep = Ctx::new(Path::new(&format!("/tmp/{}", "d".repeat(90))));
        let hash = &fnv1a_hex(deep.dir.as_os_str().as_encoded_bytes())[..12];
        assert_eq!(
            socket_dir(&deep, Pg::Primary),
            PathBuf::from(format!("/tmp/stack-pg-{hash}"))
        );
        assert_eq!(
            socket_dir(&deep, Pg::Standby),
            PathBuf::from(format!("/tmp/stack-pg-{hash}-standby"))
        );
    }

    #[test]
    fn conninfo_lines_are_dropped() {
        let dir = std::env::temp_dir().join(format!("stack-pg-auto-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("postgresql.auto.conf");
        std::fs::write(
            &f,
            "# x\nprimary_conninfo = 'a'\nprimary_conninfo_x = 1\nport = 1\n",
        )
        .unwrap();
        standby::drop_primary_conninfo(&f).unwrap();
        let text = std::fs::read_to_string(&f).unwrap();
        assert_eq!(text, "# x\nprimary_conninfo_x = 1\nport = 1\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Inits and launches a primary in a temp folder, clones a standby from it, promotes it,
    /// and stops both. Needs PostgreSQL 15.
    #[test]
    #[ignore]
    fn primary_and_standby_for_real() {
        let dir = std::env::temp_dir().join(format!("stack-pg-real-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ctx = Ctx::new(&dir);
        let ports = crate::ports::alloc(2).unwrap();
        let mut env = Env::default();
        env.set("PG_PORT", ports[0]);
        env.set("PG_STANDBY_PORT", ports[1]);
        let result = (|| -> Result<()> {
            init(&ctx)?;
            launch(&ctx, Pg::Primary, &env)?;
            wait_primary(&ctx, &env)?;
            assert!(is_ready(ports[0]));
            assert_eq!(in_recovery(ports[0]), Some(false));
            standby_create(&ctx, &env)?;
            launch(&ctx, Pg::Standby, &env)?;
            standby_wait(&ctx, &env)?;
            assert_eq!(in_recovery(ports[1]), Some(true));
            assert!(standby_role(&ctx, &env).starts_with("standby of"));
            freeze(&ctx, Pg::Standby)?;
            assert!(ctx.frozen_note("pg-standby"));
            thaw(&ctx, Pg::Standby)?;
            standby_promote(&ctx, &env)?;
            assert_eq!(in_recovery(ports[1]), Some(false));
            kill(&ctx, Pg::Primary)?;
            assert!(ctx.pid_of("pg").is_none());
            launch(&ctx, Pg::Primary, &env)?; // over the killed one's stale lock files
            wait_primary(&ctx, &env)
        })();
        let stopped = stop(&ctx, Pg::Standby).and(stop(&ctx, Pg::Primary));
        std::fs::remove_dir_all(&dir).unwrap();
        result.unwrap();
        stopped.unwrap();
    }
}
