//! The processes the benchmark starts, and what `/proc` says about them.
//!
//! Every process is a [`Proc`]: stopped when dropped (SIGTERM, up to 30 s, then SIGKILL),
//! so an error anywhere stops it too. Ctrl-C and SIGTERM set a flag that a watcher thread
//! turns into the same cleanup ([`on_signal_cleanup`]): the live processes, then the stack.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::{fail, Context, Result};

/// How long a process gets between SIGTERM and SIGKILL, as bench.sh's `stop_pid`.
const STOP_GRACE: Duration = Duration::from_secs(30);

/// Pids of the live [`Proc`]s (for the signal watcher).
static LIVE: Mutex<Vec<(String, u32)>> = Mutex::new(Vec::new());
/// The stack folder to bring down on a signal.
static STACK_DIR: Mutex<Option<PathBuf>> = Mutex::new(None);
/// The folder of the run's logs, named when a signal ends the run.
static WORK_DIR: Mutex<Option<PathBuf>> = Mutex::new(None);
static SIGNALLED: AtomicBool = AtomicBool::new(false);

extern "C" fn note_signal(_: libc::c_int) {
    SIGNALLED.store(true, Ordering::SeqCst);
}

/// Installs the SIGINT/SIGTERM handlers and their watcher: on a signal it stops every live
/// [`Proc`], brings down the stack registered with [`register_stack`], says where the logs
/// are, and exits with 130.
pub fn on_signal_cleanup() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, note_signal as *const () as libc::sighandler_t);
        libc::signal(
            libc::SIGTERM,
            note_signal as *const () as libc::sighandler_t,
        );
    }
    std::thread::spawn(|| loop {
        std::thread::sleep(Duration::from_millis(100));
        if !SIGNALLED.load(Ordering::SeqCst) {
            continue;
        }
        eprintln!("\nbench: interrupted; stopping what it started");
        let live: Vec<_> = LIVE.lock().map(|l| l.clone()).unwrap_or_default();
        for (name, pid) in live {
            let _ = stack::process::stop(&name, pid, STOP_GRACE);
        }
        if let Some(dir) = STACK_DIR.lock().ok().and_then(|d| d.clone()) {
            let _ = stack::Stack::down(&dir, true);
        }
        if let Some(dir) = WORK_DIR.lock().ok().and_then(|d| d.clone()) {
            eprintln!("bench: logs kept in {}", dir.display());
        }
        std::process::exit(130);
    });
}

/// The stack in `dir` is brought down on a signal (None: no longer).
pub fn register_stack(dir: Option<&Path>) {
    if let Ok(mut d) = STACK_DIR.lock() {
        *d = dir.map(Path::to_path_buf);
    }
}

/// The run's log folder, named on a signal (None: no longer).
pub fn register_work(dir: Option<&Path>) {
    if let Ok(mut d) = WORK_DIR.lock() {
        *d = dir.map(Path::to_path_buf);
    }
}

/// A started process, stopped when dropped.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Option<Child>,
    pid: u32,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr appended to `log`; `name` is how messages call it.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Result<Proc> {
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .context(|| format!("opening {}", log.display()))?;
        let err = out.try_clone().context(|| format!("{}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .context(|| format!("starting {name} ({cmd:?})"))?;
        let pid = child.id();
        if let Ok(mut live) = LIVE.lock() {
            live.push((name.to_owned(), pid));
        }
        Ok(Proc {
            name: name.to_owned(),
            child: Some(child),
            pid,
        })
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// It has exited (and is reaped).
    pub fn exited(&mut self) -> bool {
        match &mut self.child {
            Some(child) => !matches!(child.try_wait(), Ok(None)),
            None => true,
        }
    }

    /// Waits until it exits; returns whether it exited 0 and its CPU time (user + system,
    /// seconds, from `wait4`'s rusage). Errors: `limit` passed (it is then stopped).
    pub fn wait_cpu(mut self, limit: Duration) -> Result<(bool, f64)> {
        let deadline = Instant::now() + limit;
        loop {
            let mut status = 0;
            // SAFETY: an all-zero rusage is a valid value for wait4 to fill in.
            let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: wait4 on our own child, with valid pointers; WNOHANG never blocks.
            let got =
                unsafe { libc::wait4(self.pid as i32, &mut status, libc::WNOHANG, &mut usage) };
            if got == self.pid as i32 {
                self.forget();
                let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
                let ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
                return Ok((ok, secs(usage.ru_utime) + secs(usage.ru_stime)));
            }
            if got < 0 {
                return Err(fail(format!(
                    "waiting for {} (pid {})",
                    self.name, self.pid
                )));
            }
            if Instant::now() >= deadline {
                return Err(fail(format!(
                    "{} (pid {}) still running after {} s",
                    self.name,
                    self.pid,
                    limit.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, up to 30 s, then SIGKILL; reaps it.
    pub fn stop(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(None)) {
            stack::process::signal(self.pid, libc::SIGTERM);
            let deadline = Instant::now() + STOP_GRACE;
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            if matches!(child.try_wait(), Ok(None)) {
                eprintln!("bench: {} ignored SIGTERM for 30 s: SIGKILL", self.name);
                let _ = child.kill();
            }
            let _ = child.wait();
        }
        self.forget();
    }

    fn forget(&mut self) {
        self.child = None;
        if let Ok(mut live) = LIVE.lock() {
            live.retain(|(_, pid)| *pid != self.pid);
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// What `/proc/PID/stat` and `/proc/PID/status` say of a set of processes, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcFigures {
    /// CPU time, user + system, seconds.
    pub cpu_secs: f64,
    /// Peak resident set (`VmHWM`), kB.
    pub hwm_kb: u64,
    /// Resident set now (`VmRSS`), kB.
    pub rss_kb: u64,
}

/// Clock ticks per second (`getconf CLK_TCK`).
pub fn ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime + stime of one `/proc/PID/stat` line, in clock ticks (fields 14 and 15).
pub fn parse_stat_ticks(stat: &str) -> Option<u64> {
    let rest = stat.rsplit_once(") ")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// `key`'s value in kB of a `/proc/PID/status` text (`VmHWM:   12345 kB`); 0 when absent.
pub fn parse_status_kb(status: &str, key: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The figures of `pids`, summed. Errors: a process is gone (names the file).
pub fn figures(pids: &[u32]) -> Result<ProcFigures> {
    let mut sum = ProcFigures::default();
    for pid in pids {
        let path = format!("/proc/{pid}/stat");
        let stat = std::fs::read_to_string(&path).context(|| path.clone())?;
        let t = parse_stat_ticks(&stat).ok_or_else(|| fail(format!("{path}: unreadable")))?;
        let path = format!("/proc/{pid}/status");
        let status = std::fs::read_to_string(&path).context(|| path.clone())?;
        sum.cpu_secs += t as f64 / ticks();
        sum.hwm_kb += parse_status_kb(&status, "VmHWM");
        sum.rss_kb += parse_status_kb(&status, "VmRSS");
    }
    Ok(sum)
}

/// Busy, total and interrupt (hard + soft) seconds of one CPU since boot.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CoreTimes {
    /// Not idle nor waiting for I/O, seconds.
    pub busy: f64,
    /// All time, seconds (guest time is already in user).
    pub total: f64,
    /// Hard and soft interrupts, seconds (no process is charged for them).
    pub irq: f64,
}

/// The `cpuN` line of a `/proc/stat` text, in seconds at `ticks` per second.
pub fn parse_core(stat: &str, core: usize, ticks: f64) -> Option<CoreTimes> {
    let prefix = format!("cpu{core} ");
    let line = stat.lines().find(|l| l.starts_with(&prefix))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map_while(|x| x.parse().ok())
        .collect();
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    let total: u64 = v.iter().take(8).sum();
    Some(CoreTimes {
        busy: (total - idle) as f64 / ticks,
        total: total as f64 / ticks,
        irq: (v.get(5)? + v.get(6)?) as f64 / ticks,
    })
}

/// CPU 0's times now. Errors: /proc/stat unreadable or without a `cpu0` line.
pub fn core0() -> Result<CoreTimes> {
    let text = std::fs::read_to_string("/proc/stat").context(|| "/proc/stat".into())?;
    parse_core(&text, 0, ticks()).ok_or_else(|| fail("/proc/stat has no cpu0 line"))
}

/// The direct children of `pid` (nginx's workers).
pub fn children(pid: u32) -> Vec<u32> {
    stack::process::children(pid)
}

/// The first three fields of /proc/loadavg ("0.52 0.61 0.70"), or "?".
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// Pins the calling thread to `core` (the load generator's core).
pub fn pin_thread(core: usize) {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET and sched_setaffinity(0) act on this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// How the stack's servers share their core with the load generator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Share {
    /// `SCHED_IDLE`, in an autogroup at nice 19: they run only when the load generator leaves
    /// the core idle.
    Idle,
    /// `SCHED_OTHER`, nice 0, in an autogroup at nice 0: an equal share.
    Equal,
}

impl Share {
    /// The nice value of the autogroup of each server (`/proc/PID/autogroup`).
    ///
    /// Why the autogroup too: with `kernel.sched_autogroup_enabled = 1` (Debian's default),
    /// each session is a task group, and the kernel first shares a core between the groups by
    /// their weight (1,024 at nice 0), and only then between a group's threads by their policy
    /// (sched(7), "The autogroup feature"). `scripts/stack.sh` starts every server in a session
    /// of its own (`setsid`). So `SCHED_IDLE` alone left each busy server a whole group's
    /// share, as much as the load generator's: a busy loop at `SCHED_IDLE` in a session of its
    /// own took 251 of 499 ticks from a `SCHED_OTHER` one; with its autogroup at nice 19
    /// (weight 15), 7. Merging replicas stalled oha for 0.3-1.5 s at a time, and the p99 at
    /// 70 % fell from 282 to 15 ms once they had nice 19 (docs/benchmarks.md, "Reading
    /// (issue 53: the stack's autogroups)").
    fn autogroup_nice(self) -> i32 {
        match self {
            Share::Idle => 19,
            Share::Equal => 0,
        }
    }
}

/// Pins every server of the stack in `dir` to `cores` with the scheduling policy of `share`:
/// each process named by a `*.pid` file there (ClickHouse, ZooKeeper, PostgreSQL), its
/// descendants, and all their threads (threads and processes started later inherit both).
/// Each process's autogroup takes [`Share::autogroup_nice`]. Returns the pinned processes'
/// pids, sorted.
///
/// Why: in the throughput and latency runs the server under test has core 0 to itself, as
/// nginx and the axum floor do. The stack's servers stand for databases that run on other
/// machines in production; left on core 0, ClickHouse's ingestion of the collector's rows took
/// 12-46 % of that core in the batch runs (docs/benchmarks.md, "Setup"). On core 1 with an
/// equal share it took 50 % of the load generator's core in a single-beacon run at 256
/// connections, and the collector's core idled 24 % waiting for wrk; with [`Share::Idle`] wrk
/// goes first. Errors: the folder unreadable, or no pid file in it.
pub fn pin_stack(dir: &Path, cores: &[usize], share: Share) -> Result<Vec<u32>> {
    let mut roots = Vec::new();
    for entry in std::fs::read_dir(dir).context(|| dir.display().to_string())? {
        let path = entry.context(|| dir.display().to_string())?.path();
        if path.extension().is_some_and(|e| e == "pid") {
            if let Some(pid) = std::fs::read_to_string(&path)
                .ok()
                .and_then(|t| t.trim().parse::<u32>().ok())
            {
                roots.push(pid);
            }
        }
    }
    if roots.is_empty() {
        return Err(fail(format!("{}: no *.pid file to pin", dir.display())));
    }
    let mut pinned = Vec::new();
    while let Some(pid) = roots.pop() {
        if pinned.contains(&pid) {
            continue;
        }
        roots.extend(children(pid));
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten();
        for tid in tasks
            .flatten()
            .filter_map(|t| t.file_name().to_str()?.parse().ok())
        {
            pin_task(tid, cores, share)?;
        }
        set_autogroup(pid, share)?;
        pinned.push(pid);
    }
    pinned.sort_unstable();
    Ok(pinned)
}

/// Pins the thread `tid` to `cores` under `share`'s policy; a thread that ended meanwhile is
/// skipped. Errors: the kernel refused either call (the run would not be what it says).
fn pin_task(tid: libc::pid_t, cores: &[usize], share: Share) -> Result<()> {
    let policy = match share {
        Share::Idle => libc::SCHED_IDLE,
        Share::Equal => libc::SCHED_OTHER,
    };
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET, sched_setaffinity and sched_setscheduler
    // act on `tid` only (priority 0 is the only one either policy takes).
    let failed = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &core in cores {
            libc::CPU_SET(core, &mut set);
        }
        let param = libc::sched_param { sched_priority: 0 };
        libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0
            || libc::sched_setscheduler(tid, policy, &param) != 0
    };
    let error = std::io::Error::last_os_error();
    if failed && error.raw_os_error() != Some(libc::ESRCH) {
        return Err(fail(format!(
            "thread {tid}: cannot pin to cores {cores:?} at {share:?}: {error}"
        )));
    }
    Ok(())
}

/// Sets the nice value of the autogroup (session task group) of `pid` to `share`'s. A kernel
/// without autogroups (no `/proc/PID/autogroup`), or a process that ended meanwhile, is
/// skipped. Errors: the kernel refused the write.
fn set_autogroup(pid: u32, share: Share) -> Result<()> {
    let path = format!("/proc/{pid}/autogroup");
    match std::fs::write(&path, share.autogroup_nice().to_string()) {
        Err(e)
            if e.kind() != std::io::ErrorKind::NotFound
                && e.raw_os_error() != Some(libc::ESRCH) =>
        {
            Err(fail(format!(
                "{path}: cannot set nice {}: {e}",
                share.autogroup_nice()
            )))
        }
        _ => Ok(()),
    }
}

/// Raises this process's open-file limit to its hard limit (`ulimit -n $(ulimit -Hn)`);
/// children inherit it.
pub fn raise_nofile() {
    // SAFETY: getrlimit/setrlimit with a valid struct.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Captured from a running collector (`cat /proc/PID/stat`, `/proc/PID/status`).
    const STAT: &str = "812345 (collector) S 812300 812345 812300 0 -1 4194560 15933 0 0 0 1523 311 0 0 20 0 6 0 2231456 1316864000 6210 18446744073709551615 1 1 0 0 0 0 0 4096 17991 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0";
    const STATUS: &str = "Name:\tcollector\nUmask:\t0022\nState:\tS (sleeping)\nVmPeak:\t 1316864 kB\nVmSize:\t 1286000 kB\nVmHWM:\t   41236 kB\nVmRSS:\t   24840 kB\nThreads:\t6\n";
    const PROC_STAT: &str = "cpu  1001 2 3003 40000 50 60 70 0 0 0\ncpu0 600 1 1500 20000 30 40 50 0 0 0\ncpu1 401 1 1503 20000 20 20 20 0 0 0\nintr 1\n";

    #[test]
    fn stat_gives_utime_plus_stime() {
        assert_eq!(parse_stat_ticks(STAT), Some(1523 + 311));
        assert_eq!(parse_stat_ticks("garbage"), None);
        // A command name with spaces and parentheses does not shift the fields.
        let odd = STAT.replace("(collector)", "(a) b (c)");
        assert_eq!(parse_stat_ticks(&odd), Some(1834));
    }

    #[test]
    fn status_gives_kilobytes() {
        assert_eq!(parse_status_kb(STATUS, "VmHWM"), 41236);
        assert_eq!(parse_status_kb(STATUS, "VmRSS"), 24840);
        assert_eq!(parse_status_kb(STATUS, "VmSwap"), 0);
    }

    #[test]
    fn core_line_in_seconds() {
        let c = parse_core(PROC_STAT, 0, 100.0).unwrap();
        assert_eq!(
            c.total,
            (600 + 1 + 1500 + 20000 + 30 + 40 + 50) as f64 / 100.0
        );
        assert_eq!(c.busy, (600 + 1 + 1500 + 40 + 50) as f64 / 100.0);
        assert_eq!(c.irq, 0.9);
        assert_eq!(parse_core(PROC_STAT, 5, 100.0), None);
    }

    /// The pinned threads' `Cpus_allowed_list`, read back from /proc.
    fn allowed(pid: u32) -> Vec<String> {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .map(|t| {
                let status = std::fs::read_to_string(t.unwrap().path().join("status")).unwrap();
                let line = status.lines().find(|l| l.starts_with("Cpus_allowed_list:"));
                line.unwrap().split_whitespace().nth(1).unwrap().to_owned()
            })
            .collect()
    }

    /// The scheduling policy of `pid`'s main thread, read back from the kernel.
    fn policy(pid: u32) -> libc::c_int {
        // SAFETY: sched_getscheduler only reads; an ended pid answers -1.
        unsafe { libc::sched_getscheduler(pid as libc::pid_t) }
    }

    /// The nice value of `pid`'s autogroup ("/autogroup-42 nice 19"), or None on a kernel
    /// without autogroups.
    fn autogroup_nice(pid: u32) -> Option<i32> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/autogroup")).ok()?;
        Some(text.split_whitespace().nth(2).unwrap().parse().unwrap())
    }

    #[test]
    fn a_stack_is_pinned_with_its_children() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            pin_stack(dir.path(), &[0], Share::Idle).is_err(),
            "no pid file is an error"
        );
        // A parent shell (named by a pid file, in a session of its own as stack.sh starts
        // each server) with a child it starts: both move.
        let mut shell = Command::new("sh");
        shell.args(["-c", "sleep 30 & wait"]);
        // SAFETY: setsid() is async-signal-safe; it runs in the child between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            shell.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let mut parent = shell.spawn().unwrap();
        std::fs::write(dir.path().join("srv.pid"), format!("{}\n", parent.id())).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let child = loop {
            if let Some(&c) = children(parent.id()).first() {
                break c;
            }
            assert!(
                Instant::now() < deadline,
                "the shell started no child in 10 s"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        let pinned = pin_stack(dir.path(), &[0], Share::Idle).unwrap();
        let (a, b) = (allowed(parent.id()), allowed(child));
        let idle = (policy(parent.id()), policy(child));
        let idle_group = autogroup_nice(child);
        pin_stack(dir.path(), &[0, 1], Share::Equal).unwrap();
        let both = allowed(child);
        let equal = (policy(child), autogroup_nice(child));
        let _ = parent.kill();
        let _ = parent.wait();
        let _ = Command::new("kill").arg(child.to_string()).status();
        let mut want = vec![parent.id(), child];
        want.sort_unstable();
        assert_eq!(pinned, want);
        assert_eq!((a, b), (vec!["0".to_owned()], vec!["0".to_owned()]));
        assert_eq!(idle, (libc::SCHED_IDLE, libc::SCHED_IDLE));
        assert_eq!(idle_group, Some(19));
        assert_eq!(equal, (libc::SCHED_OTHER, Some(0)));
        let two = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap() != "0\n";
        assert_eq!(both, vec![if two { "0-1" } else { "0" }.to_owned()]);
    }
}
