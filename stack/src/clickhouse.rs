//! The stack's ClickHouse 18.16 servers (Debian's `clickhouse-server`): `CH_SHARDS` shards
//! (1 unless asked for) of `CH_REPLICAS` replicas each (cluster `collector`), coordinated
//! through the stack's ZooKeeper. Server `i` (1-based, `i = (s-1)*CH_REPLICAS + r`) is replica
//! `r` of shard `s`, with macros `{shard}` = `s` and `{replica}` = `ri` (unique over the
//! cluster), so each shard's replicated tables have ZooKeeper paths of their own.
//!
//! Layout of `DIR/chI`: `config.xml` and `users.xml` (rewritten on every start, replaced only
//! when their text changes: the running server watches them), `data/` (ClickHouse's path),
//! `log/clickhouse-server.log`, `log/clickhouse-server.err.log` (the server's logs) and
//! `log/stdout.log` (its output). `DIR/chI.pid` holds the server's pid; a clean stop removes
//! it, so one left behind marks a killed replica (see [`clear_stale_active`]).

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use crate::ctx::{log, Ctx};
use crate::env::Env;
use crate::error::{Error, Result};
use crate::process::{self, POLL};
use crate::server_config::{Replication, ServerConfig};
use crate::users::{self, Root, User};
use crate::{http, zookeeper};

/// Bound of the wait for a running replica to read a changed profile ([`set_profile`]).
const PROFILE_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound of the `ZooKeeperMain` run of [`clear_stale_active`].
const ZK_CLI_TIMEOUT: Duration = Duration::from_secs(30);

/// The `clickhouse-server` program: the first executable of that name on `PATH`, else
/// `/usr/sbin/clickhouse-server` (which may not exist).
pub fn server_binary() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("clickhouse-server"))
        .find(|p| executable(p))
        .unwrap_or_else(|| PathBuf::from("/usr/sbin/clickhouse-server"))
}

/// `path` is a regular file this process may execute (access(2) X_OK).
fn executable(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access(2) on a NUL-terminated path this function owns.
    path.is_file() && unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0
}

/// The shape of the cluster in `env`: (`CH_SHARDS`, `CH_REPLICAS`), shards and replicas per
/// shard; `CH_SHARDS` missing is 1 (a folder from before shards).
///
/// Errors: `CH_REPLICAS` missing, either not a positive number.
pub fn layout(env: &Env) -> Result<(usize, usize)> {
    let positive = |key: &str, v: &str| {
        v.parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| Error::new(format!("{key} of stack.env is not a positive number: {v}")))
    };
    let replicas = env
        .get("CH_REPLICAS")
        .ok_or_else(|| Error::new("CH_REPLICAS is not set in stack.env"))?;
    let replicas = positive("CH_REPLICAS", replicas)?;
    let shards = match env.get("CH_SHARDS") {
        Some(v) => positive("CH_SHARDS", v)?,
        None => 1,
    };
    Ok((shards, replicas))
}

/// The shard (from 1) of server `i` (from 1) in a cluster of `replicas` per shard.
pub fn shard_of(i: usize, replicas: usize) -> usize {
    (i - 1) / replicas.max(1) + 1
}

/// Server `i`'s config ([`ServerConfig`]) for the state folder `dir`, from the ports of `env`:
/// replica of shard [`shard_of`] `i`, cluster `collector` of every shard.
///
/// Errors: a key missing from `env` (`CH_REPLICAS`, `ZK_PORT`, `CHj_TCP_PORT` of every
/// server, server `i`'s `CHi_HTTP_PORT` and `CHi_INTERSERVER_PORT`).
fn replica_config(dir: &Path, i: usize, env: &Env) -> Result<String> {
    let (shards, replicas) = layout(env)?;
    let shards_tcp = (0..shards)
        .map(|s| {
            (1..=replicas)
                .map(|r| env.need_port(&format!("CH{}_TCP_PORT", s * replicas + r)))
                .collect::<Result<Vec<u16>>>()
        })
        .collect::<Result<Vec<Vec<u16>>>>()?;
    let d = dir.join(format!("ch{i}"));
    Ok(ServerConfig {
        dir: &d,
        http_port: env.need_port(&format!("CH{i}_HTTP_PORT"))?,
        tcp_port: env.need_port(&format!("CH{i}_TCP_PORT"))?,
        tls: None,
        replication: Some(Replication {
            i,
            shard: shard_of(i, replicas),
            interserver_port: env.need_port(&format!("CH{i}_INTERSERVER_PORT"))?,
            zk_port: env.need_port("ZK_PORT")?,
            shards_tcp,
        }),
        local: None,
    }
    .render())
}

/// A replica's config.xml for the state folder `/DIR` with every port 1 and a cluster of one
/// replica: what `tests/tests/containers/` checks the shape of `deploy/`'s replicas
/// against (macros, ZooKeeper node, `remote_servers`).
pub fn sample_config() -> String {
    ServerConfig {
        dir: Path::new("/DIR/ch1"),
        http_port: 1,
        tcp_port: 1,
        tls: None,
        replication: Some(Replication {
            i: 1,
            shard: 1,
            interserver_port: 1,
            zk_port: 1,
            shards_tcp: vec![vec![1]],
        }),
        local: None,
    }
    .render()
}

/// The text of `DIR/chI/users.xml`: user `default` without password from loopback, the
/// default profile of [`users::stack_profile`], no quota limits.
fn users_text(profile: &[(String, String)]) -> String {
    users::users_xml(Root::Yandex, profile, &[], &[User::DEFAULT])
}

/// Writes `text` to `path` through `path.tmp`, renamed over `path` only when the text differs
/// (a running server watches the file and reloads it on change).
fn replace_on_change(path: &Path, text: &str) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    fs_err::write(&tmp, text)?;
    if std::fs::read(path).is_ok_and(|old| old == text.as_bytes()) {
        fs_err::remove_file(&tmp)?;
    } else {
        fs_err::rename(&tmp, path)?;
    }
    Ok(())
}

/// Writes replica `i`'s `DIR/chI/config.xml` and `users.xml` (creating `data/` and `log/`),
/// each replaced atomically and only when its text changes. The config has the replica's
/// ports, ZooKeeper on `ZK_PORT`, macros shard [`shard_of`] `i` / replica `ri`, and cluster
/// `collector` of every shard's replicas; the default profile is [`users::stack_profile`] of
/// `profile`.
///
/// Errors: a key missing from `env` (`CH_REPLICAS`, `ZK_PORT`, `CHj_TCP_PORT` of every
/// replica, replica `i`'s `CHi_HTTP_PORT` and `CHi_INTERSERVER_PORT`), or a file that could
/// not be written.
pub fn write_conf(ctx: &Ctx, i: usize, env: &Env, profile: &[(String, String)]) -> Result<()> {
    let config = replica_config(&ctx.dir, i, env)?;
    let d = ctx.path(&format!("ch{i}"));
    fs_err::create_dir_all(d.join("data"))?;
    fs_err::create_dir_all(d.join("log"))?;
    replace_on_change(&d.join("config.xml"), &config)?;
    replace_on_change(&d.join("users.xml"), &users_text(profile))
}

/// Writes replica `i`'s config with the stack's own profile ([`write_conf`]) and starts it
/// ([`start_existing`]). Does not wait for it to answer (see [`wait`]).
///
/// Errors: those of [`write_conf`] and [`start_existing`].
pub fn launch(ctx: &Ctx, i: usize, env: &Env) -> Result<()> {
    write_conf(ctx, i, env, &[])?;
    start_existing(ctx, i)
}

/// Starts replica `i` detached from its existing `DIR/chI/config.xml` (whose cluster and
/// ZooKeeper port are what the rest of the stack uses): [`server_binary`]
/// `--config-file=DIR/chI/config.xml`, output appended to `DIR/chI/log/stdout.log`, pid in
/// `DIR/chI.pid`. Neither checks the ports nor clears stale ZooKeeper nodes (the caller does:
/// [`clear_stale_active`]).
///
/// Errors: the log could not be opened or the server could not be started.
pub fn start_existing(ctx: &Ctx, i: usize) -> Result<()> {
    let mut cmd = Command::new(server_binary());
    let mut arg = std::ffi::OsString::from("--config-file=");
    arg.push(ctx.path(&format!("ch{i}/config.xml")));
    cmd.arg(arg);
    let log = ctx.path(&format!("ch{i}/log/stdout.log"));
    process::spawn(&ctx.path(&format!("ch{i}.pid")), &log, cmd)?;
    Ok(())
}

/// The ZooKeeper path and replica name of the first
/// `Replicated...MergeTree('<path>', *'<replica>'` in `sql` (line by line, as `grep -o`),
/// with `{shard}` replaced by `shard` and `{replica}` by `ri`.
fn replicated_path(sql: &str, shard: usize, i: usize) -> Option<(String, String)> {
    let subst = |s: &str| {
        s.replace("{shard}", &shard.to_string())
            .replace("{replica}", &format!("r{i}"))
    };
    sql.lines()
        .find_map(|line| {
            line.match_indices("Replicated")
                .find_map(|(at, _)| engine_args(&line[at + "Replicated".len()..]))
        })
        .map(|(path, rep)| (subst(path), subst(rep)))
}

/// After `Replicated`: `[A-Za-z]*MergeTree('PATH', *'REPLICA'` → (PATH, REPLICA).
fn engine_args(rest: &str) -> Option<(&str, &str)> {
    let letters = rest.len()
        - rest
            .trim_start_matches(|c: char| c.is_ascii_alphabetic())
            .len();
    if !rest[..letters].ends_with("MergeTree") {
        return None;
    }
    let rest = rest[letters..].strip_prefix("('")?;
    let (path, rest) = rest.split_once('\'')?;
    let rest = rest.strip_prefix(',')?.trim_start_matches(' ');
    let rest = rest.strip_prefix('\'')?;
    let (rep, _) = rest.split_once('\'')?;
    Some((path, rep))
}

/// The entries of `dir` not starting with `.`, sorted (as a shell glob lists them).
fn glob_entries(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// The `ZooKeeperMain` commands deleting the `is_active` nodes of replica `i`'s replicated
/// tables (from `DIR/chI/data/metadata/*/*.sql`), a replica of shard `shard`.
fn stale_commands(ctx: &Ctx, i: usize, shard: usize) -> String {
    let mut cmds = String::new();
    for db in glob_entries(&ctx.path(&format!("ch{i}/data/metadata"))) {
        for f in glob_entries(&db) {
            if f.extension().is_none_or(|e| e != "sql") || !f.is_file() {
                continue;
            }
            let Ok(sql) = std::fs::read(&f) else { continue };
            if let Some((path, rep)) = replicated_path(&String::from_utf8_lossy(&sql), shard, i) {
                cmds.push_str(&format!("delete {path}/replicas/{rep}/is_active\n"));
            }
        }
    }
    cmds
}

/// Deletes the stale ZooKeeper `is_active` nodes of those of `replicas` that were killed
/// (their `DIR/chI.pid` is still there; a clean stop removes it). A killed replica's
/// ephemeral nodes outlive it until its session times out (~10 s), and ClickHouse 18.16
/// started meanwhile would rejoin up to ~20 s late. Call it only while those replicas are
/// dead. Best effort: nothing when ZooKeeper (`ZK_PORT`) does not answer `ruok`; the
/// `ZooKeeperMain` run (bounded by 30 s) logs to `DIR/zk/zkcli.log` and its failure is
/// ignored.
pub fn clear_stale_active(ctx: &Ctx, replicas: &[usize], env: &Env) {
    let mut cmds = String::new();
    let mut killed = Vec::new();
    let per_shard = layout(env).map_or(usize::MAX, |(_, r)| r);
    for &i in replicas {
        if !ctx.path(&format!("ch{i}.pid")).is_file() {
            continue;
        }
        killed.push(i.to_string());
        cmds.push_str(&stale_commands(ctx, i, shard_of(i, per_shard)));
    }
    let Some(port) = env.port("ZK_PORT") else {
        return;
    };
    if cmds.is_empty() || !zookeeper::ruok(port) {
        return;
    }
    log(&format!(
        "removing stale ZooKeeper is_active nodes of killed replica(s) {}",
        killed.join(" ")
    ));
    let _ = run_zk_cli(ctx, port, &cmds);
}

/// Runs `ZooKeeperMain -server 127.0.0.1:PORT` with `cmds` on its stdin, output appended to
/// `DIR/zk/zkcli.log`, killed after 30 s.
fn run_zk_cli(ctx: &Ctx, port: u16, cmds: &str) -> Result<()> {
    let out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(ctx.path("zk/zkcli.log"))?;
    let jars = zookeeper::ZK_JARS;
    let mut child = Command::new("java")
        .args([
            "-Xmx64m",
            "-XX:-UsePerfData",
            "-XX:TieredStopAtLevel=1",
            "-cp",
        ])
        .arg(format!("{jars}/zookeeper.jar:{jars}/slf4j-simple.jar"))
        .arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
        .arg("org.apache.zookeeper.ZooKeeperMain")
        .arg("-server")
        .arg(format!("127.0.0.1:{port}"))
        .stdin(Stdio::piped())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(cmds.as_bytes());
    }
    let deadline = Instant::now() + ZK_CLI_TIMEOUT;
    while child.try_wait()?.is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(POLL);
    }
    Ok(())
}

/// The server on 127.0.0.1:`http_port` answers `SELECT 1` over HTTP with `1` (within 2 s).
pub fn select1(http_port: u16) -> bool {
    http::get(&format!("http://127.0.0.1:{http_port}/?query=SELECT%201")).as_deref() == Some("1")
}

/// Replica `i`'s logs shown with its errors: the error log and the output.
fn logs(ctx: &Ctx, i: usize) -> [PathBuf; 2] {
    [
        ctx.path(&format!("ch{i}/log/clickhouse-server.err.log")),
        ctx.path(&format!("ch{i}/log/stdout.log")),
    ]
}

/// Waits, polling every 100 ms for up to `ctx.ready` in all, until replica `i` answers
/// `SELECT 1` on `CHi_HTTP_PORT`, then, when ZooKeeper answers `ruok`, until none of its
/// replicated tables is read-only or has an expired session (existing ones attach read-only
/// and become writable once their ZooKeeper session is up). With ZooKeeper down it says so and
/// returns after the `SELECT 1`.
///
/// Errors (with the tails of the replica's error log and output): the replica exited during
/// startup (saying so when ZooKeeper is not answering), no `SELECT 1` or tables still
/// read-only at the timeout; or `CHi_HTTP_PORT`/`ZK_PORT` missing from `env`.
pub fn wait(ctx: &Ctx, i: usize, env: &Env) -> Result<()> {
    let h = env.need_port(&format!("CH{i}_HTTP_PORT"))?;
    let zk = env.need_port("ZK_PORT")?;
    let deadline = ctx.ready_deadline();
    let [err_log, out_log] = logs(ctx, i);
    let logs: [&Path; 2] = [&err_log, &out_log];
    let secs = ctx.ready.as_secs();
    while !select1(h) {
        if ctx.pid_of(&format!("ch{i}")).is_none() {
            let mut why = format!("ClickHouse replica {i} exited during startup");
            // 18.16 aborts startup when it cannot reach ZooKeeper while attaching
            // existing replicated tables.
            if !zookeeper::ruok(zk) {
                why.push_str(&format!(" (ZooKeeper on 127.0.0.1:{zk} is not answering: ClickHouse 18.16 cannot attach replicated tables without it)"));
            }
            return Err(Error::with_logs(why, &logs));
        }
        if Instant::now() >= deadline {
            let msg = format!(
                "ClickHouse replica {i} did not answer SELECT 1 on 127.0.0.1:{h} within {secs}s"
            );
            return Err(Error::with_logs(msg, &logs));
        }
        std::thread::sleep(POLL);
    }
    if !zookeeper::ruok(zk) {
        log(&format!("note: ZooKeeper is not answering; replica {i} serves SELECTs but its replicated tables are read-only"));
        return Ok(());
    }
    let url = format!("http://127.0.0.1:{h}/");
    let query = "SELECT count() FROM system.replicas WHERE is_readonly OR is_session_expired";
    while http::post(&url, query).as_deref() != Some("0") {
        if Instant::now() >= deadline {
            let msg = format!("ClickHouse replica {i}: replicated tables still read-only after {secs}s (ZooKeeper on 127.0.0.1:{zk}?)");
            return Err(Error::with_logs(msg, &logs));
        }
        std::thread::sleep(POLL);
    }
    Ok(())
}

/// The server at `url` shows `setting` = `value` in its session's `system.settings`.
/// Fails when replica `i` (at `url`) does not know one of the settings of `profile`: a
/// profile with an unknown setting would make every query of the server fail.
fn refuse_unknown(url: &str, i: usize, profile: &[(String, String)]) -> Result<()> {
    if profile.is_empty() {
        return Ok(());
    }
    let names: Vec<String> = profile.iter().map(|(k, _)| format!("'{k}'")).collect();
    let query = format!(
        "SELECT name FROM system.settings WHERE name IN ({})",
        names.join(",")
    );
    let known = http::post(url, &query)
        .ok_or_else(|| Error::new(format!("replica {i} does not answer at {url}")))?;
    let known: Vec<&str> = known.lines().collect();
    let unknown: Vec<&str> = profile
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| !known.contains(k))
        .collect();
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(Error::new(format!(
            "profile: replica {i} knows no setting {}",
            unknown.join(", ")
        )))
    }
}

fn setting_is(url: &str, setting: &str, value: &str) -> bool {
    let query = format!("SELECT value FROM system.settings WHERE name = '{setting}'");
    http::post(url, &query).as_deref() == Some(value)
}

/// Splits and checks `SETTING=VALUE` words: SETTING of `[a-z_]+`, VALUE of `[A-Za-z0-9_.]+`;
/// a setting given twice keeps its last value, in the place of its first.
fn parse_settings(settings: &[&str]) -> Result<Vec<(String, String)>> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (k, v) in split_settings(settings)? {
        match out.iter_mut().find(|(name, _)| *name == k) {
            Some(kept) => kept.1 = v,
            None => out.push((k, v)),
        }
    }
    Ok(out)
}

fn split_settings(settings: &[&str]) -> Result<Vec<(String, String)>> {
    let name_ok = |k: &str| !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_');
    let value_ok = |v: &str| {
        !v.is_empty()
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    };
    settings
        .iter()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) if name_ok(k) && value_ok(v) => Ok((k.to_owned(), v.to_owned())),
            _ => Err(Error::new(format!("profile: not SETTING=VALUE: {kv}"))),
        })
        .collect()
}

/// Adds user `name` to replica `i`: `DIR/chI/users.d/NAME.xml` (which the server reads beside
/// its `users.xml` by itself, within seconds) from the stack's template: the user from
/// loopback with the password whose SHA-256 is `password_sha256_hex`, and a profile `name`
/// that is the default profile with `settings` (`SETTING=VALUE` words) over it. Does not wait
/// for the server to read it.
///
/// Errors: a name that is not `[a-z_]+`, a hash that is not 64 hex digits, a bad setting,
/// or a file that could not be written.
pub fn add_user(
    ctx: &Ctx,
    i: usize,
    name: &str,
    password_sha256_hex: &str,
    settings: &[&str],
) -> Result<()> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
        return Err(Error::new(format!(
            "user: not a user name ([a-z_]+): {name:?}"
        )));
    }
    if password_sha256_hex.len() != 64
        || !password_sha256_hex.chars().all(|c| c.is_ascii_hexdigit())
    {
        return Err(Error::new(
            "user: the password's SHA-256 must be 64 hex digits",
        ));
    }
    let given = parse_settings(settings)?;
    let mut profile = vec![("profile", "default")];
    profile.extend(given.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let text = users::UsersXml {
        root: Root::Yandex,
        comment: "",
        profiles: &[users::Profile {
            name,
            settings: &profile,
            changeable_in_readonly: &[],
        }],
        users: &[User {
            name,
            password: users::Password::Sha256Hex(password_sha256_hex),
            profile: name,
            ..User::DEFAULT
        }],
    }
    .render();
    let dir = ctx.path(&format!("ch{i}/users.d"));
    fs_err::create_dir_all(&dir)?;
    replace_on_change(&dir.join(format!("{name}.xml")), &text)
}

/// The modification time of `path`, in whole seconds since the epoch.
fn mtime_secs(path: &Path) -> Result<u64> {
    let modified = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .map_err(|e| Error::new(format!("{}: {e}", path.display())))?;
    Ok(modified
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()))
}

/// Rewrites replica `i`'s `users.xml` with `settings` (`SETTING=VALUE` words) added to the
/// default profile (none: the stack's own profile again), makes sure its modification time
/// (whole seconds, what the server compares) changed, and waits up to 30 s per setting until
/// the running server's session shows every value (none given: `readonly=0` and
/// `max_memory_usage=1073741824`).
///
/// Errors: "profile: not SETTING=VALUE: WORD" for a malformed word (nothing written), a
/// missing `users.xml`, those of [`write_conf`], or "timed out after 30s waiting for: replica
/// I reading SETTING=VALUE from users.xml".
pub fn set_profile(ctx: &Ctx, i: usize, env: &Env, settings: &[&str]) -> Result<()> {
    let profile = parse_settings(settings)?;
    let url = format!(
        "http://127.0.0.1:{}/",
        env.need_port(&format!("CH{i}_HTTP_PORT"))?
    );
    refuse_unknown(&url, i, &profile)?;
    let file = ctx.path(&format!("ch{i}/users.xml"));
    let before = mtime_secs(&file)?;
    write_conf(ctx, i, env, &profile)?;
    // A second change within the same second would go unseen by the server.
    while mtime_secs(&file)? == before {
        std::thread::sleep(Duration::from_millis(200));
        OpenOptions::new()
            .write(true)
            .open(&file)?
            .set_modified(SystemTime::now())?;
    }
    let told = if settings.is_empty() {
        "the stack default".to_owned()
    } else {
        settings.join(" ")
    };
    let wanted = if profile.is_empty() {
        vec![("readonly", "0"), ("max_memory_usage", "1073741824")]
    } else {
        profile
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    };
    for (k, v) in wanted {
        let deadline = Instant::now() + PROFILE_TIMEOUT;
        while !setting_is(&url, k, v) {
            if Instant::now() >= deadline {
                // A profile the server cannot take breaks every query: back to the default.
                write_conf(ctx, i, env, &[])?;
                return Err(Error::new(format!(
                    "timed out after {}s waiting for: replica {i} reading {k}={v} from \
                     users.xml (the stack's default profile is written back)",
                    PROFILE_TIMEOUT.as_secs()
                )));
            }
            std::thread::sleep(POLL);
        }
    }
    log(&format!("replica {i} profile: {told}"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env3() -> Env {
        let mut env = Env::default();
        env.set("ZK_PORT", 20100);
        env.set("CH_REPLICAS", 3);
        for j in 1..=3 {
            env.set(&format!("CH{j}_HTTP_PORT"), 20200 + j);
            env.set(&format!("CH{j}_TCP_PORT"), 20300 + j);
            env.set(&format!("CH{j}_INTERSERVER_PORT"), 20400 + j);
        }
        env
    }

    fn kv(k: &str, v: &str) -> (String, String) {
        (k.to_owned(), v.to_owned())
    }

    #[test]
    fn a_replica_config_takes_its_ports_from_the_env() {
        let text = replica_config(Path::new("/tmp/st"), 2, &env3()).unwrap();
        assert!(text.contains("<http_port>20202</http_port>"));
        assert!(text.contains("<interserver_http_port>20402</interserver_http_port>"));
        assert!(text.contains("<node><host>127.0.0.1</host><port>20100</port></node>"));
        assert!(text.contains("<replica><host>127.0.0.1</host><port>20303</port></replica>"));
        assert!(text.contains("<users_config>/tmp/st/ch2/users.xml</users_config>"));
    }

    fn env_2x2() -> Env {
        let mut env = Env::default();
        env.set("ZK_PORT", 20100);
        env.set("CH_SHARDS", 2);
        env.set("CH_REPLICAS", 2);
        for j in 1..=4 {
            env.set(&format!("CH{j}_HTTP_PORT"), 20200 + j);
            env.set(&format!("CH{j}_TCP_PORT"), 20300 + j);
            env.set(&format!("CH{j}_INTERSERVER_PORT"), 20400 + j);
        }
        env
    }

    #[test]
    fn two_shards_of_two_replicas_from_the_env() {
        let env = env_2x2();
        assert_eq!(layout(&env).unwrap(), (2, 2));
        assert_eq!(
            (1..=4).map(|i| shard_of(i, 2)).collect::<Vec<_>>(),
            [1, 1, 2, 2]
        );
        let shard_xml = |ports: [u16; 2]| {
            let mut x = String::from("            <shard>\n                <internal_replication>true</internal_replication>\n");
            for p in ports {
                x.push_str(&format!(
                    "                <replica><host>127.0.0.1</host><port>{p}</port></replica>\n"
                ));
            }
            x + "            </shard>\n"
        };
        let cluster = format!(
            "        <collector>\n{}{}        </collector>\n",
            shard_xml([20301, 20302]),
            shard_xml([20303, 20304])
        );
        for (i, shard) in [(1, 1), (2, 1), (3, 2), (4, 2)] {
            let text = replica_config(Path::new("/tmp/st"), i, &env).unwrap();
            let macros = format!("<shard>{shard}</shard>\n        <replica>r{i}</replica>");
            assert!(text.contains(&macros), "server {i}: {text}");
            assert!(text.contains(&cluster), "server {i}: {text}");
            assert!(text.contains(&format!("<tcp_port>{}</tcp_port>", 20300 + i)));
        }
    }

    #[test]
    fn a_folder_from_before_shards_is_one_shard() {
        let env = env3();
        assert_eq!(layout(&env).unwrap(), (1, 3));
        let text = replica_config(Path::new("/tmp/st"), 3, &env).unwrap();
        assert!(text.contains("<shard>1</shard>\n        <replica>r3</replica>"));
        assert_eq!(text.matches("<shard>\n").count(), 1);
        let mut bad = env3();
        bad.set("CH_SHARDS", 0);
        assert!(layout(&bad).is_err());
    }

    #[test]
    fn missing_port_is_an_error() {
        let mut env = env3();
        env.remove("CH3_TCP_PORT");
        let err = replica_config(Path::new("/tmp/st"), 1, &env).err().unwrap();
        assert_eq!(err.to_string(), "CH3_TCP_PORT is not set in stack.env");
    }

    #[test]
    fn users_xml_has_the_base_profile_then_the_given_settings() {
        let given = [kv("readonly", "1"), kv("max_memory_usage", "5")];
        let users = users_text(&given);
        assert!(users.contains(
            "        <default>\n            <use_uncompressed_cache>0</use_uncompressed_cache>\n"
        ));
        assert!(users.contains(
            "<max_memory_usage>5</max_memory_usage>\n        </default>\n    </profiles>"
        ));
    }

    #[test]
    fn settings_are_validated_as_bash() {
        assert!(parse_settings(&["readonly=1", "load_balancing=in_order", "x=1.5"]).is_ok());
        for bad in [
            "readonly",
            "Readonly=1",
            "readonly=",
            "=1",
            "a=b=c",
            "a=1 2",
            "a-b=1",
        ] {
            let err = parse_settings(&[bad]).err().unwrap();
            assert_eq!(
                err.to_string(),
                format!("profile: not SETTING=VALUE: {bad}")
            );
        }
    }

    #[test]
    fn a_setting_given_twice_keeps_its_last_value() {
        let got = parse_settings(&["readonly=1", "max_threads=2", "readonly=0"]).unwrap();
        assert_eq!(got, [kv("readonly", "0"), kv("max_threads", "2")]);
    }

    #[test]
    fn stale_active_path_from_metadata() {
        let sql = "ATTACH TABLE events\n(\n    `ts` DateTime\n)\nENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/events', '{replica}', ts)\nORDER BY ts\n";
        assert_eq!(
            replicated_path(sql, 1, 2),
            Some(("/clickhouse/tables/1/events".to_owned(), "r2".to_owned()))
        );
        assert_eq!(
            replicated_path(sql, 2, 3),
            Some(("/clickhouse/tables/2/events".to_owned(), "r3".to_owned()))
        );
        let plain = "ENGINE = ReplicatedMergeTree('/ch/t',   'fixed') ORDER BY x";
        assert_eq!(
            replicated_path(plain, 1, 1),
            Some(("/ch/t".to_owned(), "fixed".to_owned()))
        );
        assert_eq!(
            replicated_path("ENGINE = MergeTree() ORDER BY x", 1, 1),
            None
        );
        assert_eq!(
            replicated_path("ENGINE = Replicated1MergeTree('/a', 'b')", 1, 1),
            None
        );
    }

    #[test]
    fn stale_commands_read_metadata_and_replace_on_change() {
        let dir = std::env::temp_dir().join(format!("stack-ch-{}", std::process::id()));
        let db = dir.join("ch1/data/metadata/default");
        std::fs::create_dir_all(&db).unwrap();
        std::fs::write(
            db.join("t.sql"),
            "ENGINE = ReplicatedMergeTree('/t/{shard}', '{replica}')\n",
        )
        .unwrap();
        std::fs::write(
            db.join("t.sql.tmp"),
            "ENGINE = ReplicatedMergeTree('/x', 'y')\n",
        )
        .unwrap();
        let ctx = Ctx::new(&dir);
        assert_eq!(
            stale_commands(&ctx, 1, 1),
            "delete /t/1/replicas/r1/is_active\n"
        );
        let f = dir.join("users.xml");
        replace_on_change(&f, "a").unwrap();
        let t0 = std::fs::metadata(&f).unwrap().modified().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        replace_on_change(&f, "a").unwrap();
        assert_eq!(std::fs::metadata(&f).unwrap().modified().unwrap(), t0);
        assert!(!dir.join("users.xml.tmp").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
