//! The tests' child processes: a server just started, waited for until it answers; a tool run
//! to its end, its output; a log for a failure message; a process's memory; a stop with grace.

use std::future::Future;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Waits until the server `child` (named `what` in messages, e.g. "pgbouncer on
/// 127.0.0.1:PORT") answers: `ready` is asked every `every` and says `Ok(())` once it does,
/// else what it saw instead (no answer, a status, a body). Panics, showing `logs()` and the last
/// thing `ready` saw, when the child exits first or has not answered within `limit`.
pub async fn wait_ready<F, Fut>(
    what: &str,
    child: &mut Child,
    limit: Duration,
    every: Duration,
    mut ready: F,
    logs: impl Fn() -> String,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let start = Instant::now();
    loop {
        let last = match ready().await {
            // An answer from a process that already ended is another server's (one that
            // holds the port it could not bind): not ready.
            Ok(()) if matches!(child.try_wait(), Ok(None)) => return,
            Ok(()) => "answered, but by another process: it has ended".to_owned(),
            Err(last) => last,
        };
        match child.try_wait() {
            Ok(None) => {}
            Ok(Some(status)) => panic!(
                "{what} exited with {status} before it was ready (last: {last}):\n{}",
                logs()
            ),
            Err(e) => panic!(
                "{what}: cannot tell whether it still runs ({e}):\n{}",
                logs()
            ),
        }
        assert!(
            start.elapsed() < limit,
            "{what} not ready after {limit:?} (last: {last}):\n{}",
            logs()
        );
        tokio::time::sleep(every).await;
    }
}

/// Runs `cmd` (named `what` in messages) to its end; its standard output followed by its
/// standard error. Panics when it cannot be started (naming the error) or exits other than 0
/// (with its status and that output).
pub fn output_of(what: &str, cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e} (scripts/stack.sh install installs it)"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{text}",
        out.status
    );
    text
}

/// The text of a log file for a failure message; names the file and the error when it cannot
/// be read (an empty string would look like an empty log).
pub fn log_text(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| format!("(the log {} cannot be read: {e})", path.display()))
}

/// Resident set size of process `pid`, in bytes.
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kb * 1024
}

/// Stops `child` with SIGTERM, waiting up to `grace` for it to exit, then SIGKILL.
pub fn terminate(child: &mut Child, grace: Duration) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let start = Instant::now();
    while start.elapsed() < grace {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}
