//! Processes of the stack's servers: started detached in a session of their own, found again
//! through `DIR/NAME.pid` (checked against `/proc`, so that a recycled pid or a zombie is not
//! taken for a server), signalled, and stopped with a bounded grace period.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Poll interval of every wait on a process.
pub const POLL: Duration = Duration::from_millis(100);

/// A `flock(2)` held on a file until dropped; compatible with the shell's `flock`.
#[derive(Debug)]
pub struct Flock {
    _file: File,
}

impl Flock {
    /// Takes an exclusive lock on `path` (created if missing), waiting up to `seconds`.
    pub fn exclusive(path: &Path, seconds: u64) -> Result<Flock> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| Error::new(format!("{}: {e}", path.display())))?;
        let deadline = Instant::now() + Duration::from_secs(seconds);
        loop {
            // SAFETY: flock on a file descriptor this function owns.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc == 0 {
                return Ok(Flock { _file: file });
            }
            if Instant::now() >= deadline {
                return Err(Error::new(format!(
                    "timed out after {seconds}s waiting for the lock on {}",
                    path.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The one-letter state of `pid` in /proc (`R`, `S`, `D`, `T`, `Z`, ...), if it exists.
pub fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// `pid` is alive: it exists and is not a zombie (PID 1 here may never reap one). A process
/// whose main thread is a zombie while other threads still exit (and hold its sockets) is
/// alive.
pub fn alive(pid: u32) -> bool {
    match state(pid) {
        None | Some('X') => false,
        Some('Z') => std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|tasks| {
                tasks.filter_map(|t| t.ok()).any(|t| {
                    let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                    let s = stat.rsplit_once(") ").and_then(|(_, r)| r.chars().next());
                    matches!(s, Some(s) if s != 'Z' && s != 'X')
                })
            })
            .unwrap_or(false),
        Some(_) => true,
    }
}

/// `pid` is stopped by SIGSTOP.
pub fn frozen(pid: u32) -> bool {
    state(pid) == Some('T')
}

/// The command line of `pid`, its arguments joined by spaces.
pub fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// One of the arguments of `pid` names `dir` or a path under it: it is `dir`, starts with
/// `dir/`, or its value after a `=` does (`--config-file=DIR/...`). Not a mere substring:
/// `/var/tmp/s1/...` is not under `/tmp/s1`, nor is `/tmp/s10`.
pub fn mentions(pid: u32, dir: &Path) -> bool {
    let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    String::from_utf8_lossy(&raw)
        .split('\0')
        .any(|arg| names(arg, dir) || arg.split_once('=').is_some_and(|(_, v)| names(v, dir)))
}

/// Whether the path `arg` is `dir` or under it.
fn names(arg: &str, dir: &Path) -> bool {
    let dir = dir.display().to_string();
    arg.strip_prefix(&dir)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The pid in `pidfile` (its first line), if that process is alive, its command name
/// (/proc/PID/comm) passes `comm_ok` and one of its arguments names a path under `dir`
/// ([`mentions`]): guards against a recycled pid.
pub fn pid_in(pidfile: &Path, dir: &Path, comm_ok: impl Fn(&str) -> bool) -> Option<u32> {
    let text = std::fs::read_to_string(pidfile).ok()?;
    let pid: u32 = text.lines().next()?.trim().parse().ok()?;
    (alive(pid) && comm_ok(&comm(pid)) && mentions(pid, dir)).then_some(pid)
}

/// Sends `signal` to `pid`; a process already gone is no error.
pub fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) with a pid read from /proc or a pid file; errors are ignored on purpose.
    unsafe {
        libc::kill(pid as i32, signal);
    }
}

/// Waits until `pid` is gone (or a zombie); false after `timeout`.
pub fn wait_exit(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while alive(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL);
    }
    true
}

/// SIGCONT, SIGTERM, a wait of `grace`, then SIGKILL. Ok(true) when it exited on SIGTERM,
/// Ok(false) when SIGKILL was needed (a replica's pid file is then kept as the mark of an
/// unclean exit); an error if it survived SIGKILL for 10 s.
pub fn stop(name: &str, pid: u32, grace: Duration) -> Result<bool> {
    signal(pid, libc::SIGCONT);
    signal(pid, libc::SIGTERM);
    if wait_exit(pid, grace) {
        return Ok(true);
    }
    eprintln!(
        "stack: {name} (pid {pid}) ignored SIGTERM for {}s; sending SIGKILL",
        grace.as_secs()
    );
    signal(pid, libc::SIGKILL);
    if !wait_exit(pid, Duration::from_secs(10)) {
        return Err(Error::new(format!("{name} (pid {pid}) survived SIGKILL")));
    }
    Ok(false)
}

/// SIGKILL and a wait of up to 10 s.
pub fn kill(name: &str, pid: u32) -> Result<()> {
    signal(pid, libc::SIGKILL);
    if wait_exit(pid, Duration::from_secs(10)) {
        Ok(())
    } else {
        Err(Error::new(format!("{name} (pid {pid}) survived SIGKILL")))
    }
}

/// `log` opened for appending (created if missing); the error names it.
fn open_log(log: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| Error::new(format!("opening {}: {e}", log.display())))
}

/// Starts `cmd` detached: in a session of its own (so that a terminal's Ctrl-C or a test
/// harness killing its process group does not reach it), stdin from /dev/null, stdout and
/// stderr appended to `log`, and writes its pid to `pidfile`. The child is not waited for:
/// a thread reaps it when it exits, so that it never stays a zombie of this process.
pub fn spawn(pidfile: &Path, log: &Path, mut cmd: Command) -> Result<u32> {
    let _ = std::fs::remove_file(pidfile);
    let out = open_log(log)?;
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    // SAFETY: setsid() is async-signal-safe; it runs in the child between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::new(format!("could not start {cmd:?}: {e}")))?;
    let pid = child.id();
    fs_err::write(pidfile, format!("{pid}\n"))?;
    std::thread::spawn(move || {
        let _ = child.wait();
    });
    Ok(pid)
}

/// Runs `cmd` to its end, at most `limit`, with stdin from /dev/null and its output appended
/// to `log`; an error naming `what` (and the tails of `log` and `more_logs`) when it fails or
/// is still running after `limit` (then its whole process group is killed: as root the tools
/// run under `runuser`, which forks, and killing `runuser` alone would leave the tool).
pub fn run_logged(
    mut cmd: Command,
    log: &Path,
    what: &str,
    more_logs: &[&Path],
    limit: Duration,
) -> Result<()> {
    let out = open_log(log)?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .process_group(0)
        .spawn()
        .map_err(|e| Error::new(format!("{what}: could not run {cmd:?}: {e}")))?;
    let mut logs = vec![log];
    logs.extend_from_slice(more_logs);
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            // SAFETY: kill(2) of the process group this function made (its leader's pid).
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            let msg = format!("{what} still running after {}s: killed", limit.as_secs());
            return Err(Error::with_logs(msg, &logs));
        }
        std::thread::sleep(POLL);
    };
    if status.success() {
        return Ok(());
    }
    Err(Error::with_logs(format!("{what} failed ({status})"), &logs))
}

/// The pids whose parent is `pid`.
pub fn children(pid: u32) -> Vec<u32> {
    all_pids()
        .into_iter()
        .filter(|p| stat_field(*p, 1) == Some(pid))
        .collect()
}

/// The live processes whose working folder is `dir` (canonical).
pub fn with_cwd(dir: &Path) -> Vec<u32> {
    all_pids()
        .into_iter()
        .filter(|p| {
            std::fs::read_link(format!("/proc/{p}/cwd")).is_ok_and(|cwd| cwd == dir) && alive(*p)
        })
        .collect()
}

/// Every pid in /proc.
pub fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The short command name of `pid` (/proc/PID/comm).
pub fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Field `n` after the state in /proc/PID/stat: 1 = ppid, 2 = pgrp, 3 = session.
fn stat_field(pid: u32, n: usize) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?
        .1
        .split_whitespace()
        .nth(n)?
        .parse()
        .ok()
}

/// `path` made absolute against the current folder.
pub fn absolute(path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .unwrap_or_else(|_| PathBuf::from("/"))
            .join(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_names_its_folder_or_one_under_it() {
        let dir = Path::new("/tmp/s1/ch26");
        for yes in ["/tmp/s1/ch26", "/tmp/s1/ch26/", "/tmp/s1/ch26/data"] {
            assert!(names(yes, dir), "{yes}");
        }
        for no in [
            "/tmp/s1/ch2",
            "/tmp/s1/ch260",
            "/var/tmp/s1/ch26",
            "/tmp/s1",
        ] {
            assert!(!names(no, dir), "{no}");
        }
    }
}
