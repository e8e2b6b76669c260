//! What a test prints when it gives up waiting (issue 38): one report for every wait, so that a
//! failure can be diagnosed without a rerun.
//!
//! A [`Diag`] belongs to one test ([`super::TestEnv::diag`]); what the test starts registers
//! itself with it: each collector (its log, its spool, its URL), the ClickHouse servers and
//! the database of the test, each shop (nginx's beacon log) and each browser (its console).
//! [`Diag::give_up`] panics with the reason and [`Diag::report`]:
//!
//! - per collector: whether it answers, its spool's record count (`collector_spool_records`
//!   from `/metrics` while it runs, and what `collector spool dump` reads from the folder),
//!   its replica states, and the tail of its log;
//! - per ClickHouse server: its `system.replicas` row for the test's `measurements` (read-only,
//!   session expired, queue, log pointer, delay) and the table's row count, or why it did not
//!   answer within [`ASK`];
//! - per shop: every beacon nginx answered (time, status, ids);
//! - per browser: the page's console, lifecycle events and sends as the page recorded them
//!   (`window.__console`, see [`super::browser::RECORDER`]), and what the engine wrote to its
//!   driver's log (Firefox and Chromium: the console of every page, also of pages already
//!   left).
//!
//! Every part is bounded in time ([`ASK`] per question, asked concurrently) and in size (the
//! last [`TAIL`] lines), and a part that cannot be had says why: a report never hangs a
//! failing test and never passes silence off as "nothing".

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

thread_local! {
    /// The report of the test running on this thread ([`Diag::make_current`]).
    static CURRENT: std::cell::RefCell<Option<Diag>> = const { std::cell::RefCell::new(None) };
}

/// Bound on each question the report asks a server or a browser.
pub const ASK: Duration = Duration::from_secs(3);
/// Lines of each log shown.
pub const TAIL: usize = 40;

/// What a test registered for its report; cheap to clone (one shared registry per test).
#[derive(Clone, Default)]
pub struct Diag(Arc<Mutex<Watched>>);

#[derive(Default)]
struct Watched {
    /// The ClickHouse servers of the test, and the database whose `measurements` is shown.
    clickhouse: Vec<String>,
    database: Option<String>,
    /// The stack servers behind some of those URLs: (URL, the stack's folder, replica `i`
    /// from 1, or 0 for the 26.x server).
    servers: Vec<(String, PathBuf, usize)>,
    collectors: Vec<WatchedCollector>,
    beacon_logs: Vec<PathBuf>,
    browsers: Vec<WatchedBrowser>,
    /// Further files a test wants shown (e.g. Prometheus's log): (name, path).
    files: Vec<(String, PathBuf)>,
    /// The panic under way is a [`Diag::give_up`]'s, whose message has the report.
    reported: bool,
}

#[derive(Clone)]
struct WatchedCollector {
    url: String,
    log: PathBuf,
    spool: PathBuf,
    env: Vec<(String, String)>,
}

#[derive(Clone)]
struct WatchedBrowser {
    engine: String,
    console: Option<PathBuf>,
    client: fantoccini::Client,
}

impl Diag {
    /// An empty registry.
    pub fn new() -> Diag {
        Diag::default()
    }

    fn with<R>(&self, f: impl FnOnce(&mut Watched) -> R) -> R {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The ClickHouse servers whose `system.replicas` row for `database.measurements` is shown.
    pub fn clickhouse(&self, urls: &[String], database: &str) {
        self.with(|w| {
            w.clickhouse = urls.to_vec();
            w.database = Some(database.to_owned());
        });
    }

    /// The stack server behind ClickHouse `url`: replica `i` (from 1) of the stack in `dir`, or
    /// its 26.x server (`i` = 0). The report adds its process state, and when it does not
    /// answer, the tails of its logs.
    pub fn stack_server(&self, url: &str, dir: &Path, i: usize) {
        self.with(|w| w.servers.push((url.to_owned(), dir.to_owned(), i)));
    }

    /// A collector: its URL, log, spool folder and the environment it runs with (for
    /// `collector spool dump`).
    pub fn collector(&self, url: &str, log: &Path, spool: &Path, env: &[(String, String)]) {
        self.with(|w| {
            w.collectors.push(WatchedCollector {
                url: url.to_owned(),
                log: log.to_owned(),
                spool: spool.to_owned(),
                env: env.to_vec(),
            })
        });
    }

    /// A shop's beacon log (nginx's, one line per beacon: time, status, body).
    pub fn beacon_log(&self, path: &Path) {
        self.with(|w| w.beacon_logs.push(path.to_owned()));
    }

    /// A browser: its session and the file its driver writes the engine's console to.
    pub fn browser(&self, engine: &str, client: &fantoccini::Client, console: Option<&Path>) {
        self.with(|w| {
            w.browsers.push(WatchedBrowser {
                engine: engine.to_owned(),
                console: console.map(Path::to_owned),
                client: client.clone(),
            })
        });
    }

    /// Any other file to show the tail of, under `name`.
    pub fn file(&self, name: &str, path: &Path) {
        self.with(|w| w.files.push((name.to_owned(), path.to_owned())));
    }

    /// Panics with `why` followed by the [`Diag::report`]. (An `async fn` cannot be typed
    /// `-> !`: callers go on as if it returned, which it never does.)
    pub async fn give_up(&self, why: impl std::fmt::Display) {
        let report = self.report().await;
        self.with(|w| w.reported = true);
        panic!("{why}\n{report}");
    }

    /// Makes this the report of the test running on this thread: a failed assertion of the
    /// test (any panic on its thread that is not a [`Diag::give_up`]) prints it too, from a
    /// panic hook, while what the test started still runs.
    pub fn make_current(&self) {
        static HOOK: std::sync::Once = std::sync::Once::new();
        HOOK.call_once(|| {
            let default = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                default(info);
                if let Some(diag) = CURRENT.with(|c| c.borrow().clone()) {
                    diag.report_after_panic();
                }
            }));
        });
        CURRENT.with(|c| *c.borrow_mut() = Some(self.clone()));
    }

    /// Undoes [`Diag::make_current`] (the test is over).
    pub fn clear_current(&self) {
        CURRENT.with(|c| {
            let mine = c
                .borrow()
                .as_ref()
                .is_some_and(|d| Arc::ptr_eq(&d.0, &self.0));
            if mine {
                *c.borrow_mut() = None;
            }
        });
    }

    /// Prints the report to stderr, unless this panic is a [`Diag::give_up`]'s, whose message
    /// has it. Runs it on a thread and runtime of its own: the test's thread is panicking
    /// inside its runtime.
    fn report_after_panic(&self) {
        if self.with(|w| std::mem::replace(&mut w.reported, false)) {
            return;
        }
        let diag = self.clone();
        let report = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map(|rt| rt.block_on(diag.report()))
                .unwrap_or_else(|e| format!("(no runtime for the report: {e})"))
        })
        .join()
        .unwrap_or_else(|_| "(the report itself panicked)".into());
        eprintln!("the test panicked (a failed assertion, or a panic it catches); what it had started:\n{report}");
    }

    /// Everything registered, as text (see the module doc).
    pub async fn report(&self) -> String {
        let w = self.with(|w| {
            (
                w.clickhouse.clone(),
                w.database.clone(),
                w.servers.clone(),
                w.collectors.clone(),
                w.beacon_logs.clone(),
                w.browsers.clone(),
                w.files.clone(),
            )
        });
        let (clickhouse, database, servers, collectors, beacon_logs, browsers, files) = w;
        let collectors = futures::future::join_all(
            collectors
                .iter()
                .enumerate()
                .map(|(i, c)| collector_part(i, c)),
        );
        let replicas = futures::future::join_all(
            clickhouse
                .iter()
                .map(|url| replica_part(url, database.as_deref())),
        );
        let browser_parts = futures::future::join_all(browsers.iter().map(browser_part));
        let (collectors, replicas, browser_parts) =
            futures::join!(collectors, replicas, browser_parts);
        let mut out = String::from("==== diagnostics (tests/src/common/diag.rs) ====\n");
        if collectors.is_empty() {
            out.push_str("-- no collector was started by this test\n");
        }
        for part in collectors {
            out.push_str(&part);
        }
        if replicas.is_empty() {
            out.push_str("-- no ClickHouse server registered by this test\n");
        }
        for (url, part) in clickhouse.iter().zip(replicas) {
            out.push_str(&part);
            if let Some((_, dir, i)) = servers.iter().find(|(u, _, _)| u == url) {
                out.push_str(&server_part(
                    dir,
                    *i,
                    part.contains("error sending request"),
                ));
            }
        }
        for log in &beacon_logs {
            out.push_str(&format!(
                "-- beacons nginx answered ({}): time status body\n{}\n",
                log.display(),
                tail(log, TAIL)
            ));
        }
        for part in browser_parts {
            out.push_str(&part);
        }
        for (name, path) in &files {
            out.push_str(&format!(
                "-- {name} ({}), last {TAIL} lines:\n{}\n",
                path.display(),
                tail(path, TAIL)
            ));
        }
        out.push_str("==== end of diagnostics ====");
        out
    }
}

/// A stack server's process state and, when it did not answer (`failed`) or does not run,
/// the tails of its logs.
fn server_part(dir: &Path, i: usize, failed: bool) -> String {
    let stack = match stack::Stack::open(dir) {
        Ok(s) => s,
        Err(e) => return format!("   process: {e}\n"),
    };
    let (health, files) = if i == 0 {
        match stack.ch26() {
            Some(c) => (c.health(), c.log_files()),
            None => return "   process: the stack has no 26.x server\n".into(),
        }
    } else {
        let r = stack.replica(i);
        (r.health(), r.log_files())
    };
    let pid = health.1.map_or("-".to_owned(), |p| p.to_string());
    let mut out = format!("   process: {:?}, pid {pid}\n", health.0);
    if failed || health.0 != stack::Health::Running {
        for f in files {
            out.push_str(&format!(
                "   {}, last {TAIL} lines:\n{}\n",
                f.display(),
                tail(&f, TAIL)
            ));
        }
    }
    out
}

/// The last `n` lines of a file, or why it cannot be read.
pub fn tail(path: &Path, n: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) if text.trim().is_empty() => "(empty)".into(),
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(n);
            let skipped = if from > 0 {
                format!("({from} earlier lines not shown)\n")
            } else {
                String::new()
            };
            format!("{skipped}{}", lines[from..].join("\n"))
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// `GET url` within [`ASK`]: the body, or why there is none.
async fn ask_get(url: &str) -> Result<String, String> {
    let get = super::body_of(super::http().get(url));
    tokio::time::timeout(ASK, get)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {ASK:?}")))
}

async fn collector_part(i: usize, c: &WatchedCollector) -> String {
    let mut out = format!("-- collector {} (operations listener {})\n", i + 1, c.url);
    match ask_get(&format!("{}/metrics", c.url)).await {
        Ok(text) => {
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| {
                    l.starts_with("collector_spool_records")
                        || l.starts_with("collector_spool_oldest_record_age_seconds")
                        || l.starts_with("collector_clickhouse_replica_state")
                        || l.starts_with("collector_clickhouse_active_replica")
                        || l.starts_with("collector_measurements_accepted_total")
                })
                .collect();
            out.push_str(&format!("   /metrics: {}\n", lines.join("\n             ")));
        }
        Err(e) => out.push_str(&format!("   /metrics: {e} (not running?)\n")),
    }
    out.push_str(&format!(
        "   spool {}: {}\n",
        c.spool.display(),
        spool_count(c).await
    ));
    out.push_str(&format!(
        "   log {}, last {TAIL} lines:\n{}\n",
        c.log.display(),
        tail(&c.log, TAIL)
    ));
    out
}

/// What `collector spool dump` reads from the spool folder (it takes no lock): its summary
/// line ("N rows in F frames ... not yet confirmed by ClickHouse").
async fn spool_count(c: &WatchedCollector) -> String {
    if !c.spool.exists() {
        return "(the folder is gone: the test dropped this collector)".into();
    }
    let run = tokio::process::Command::new(super::collector_bin())
        .args(["spool", "dump"])
        .envs(c.env.iter().cloned())
        .env("COLLECTOR_SPOOL_DIR", &c.spool)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(Duration::from_secs(10), run).await {
        Ok(Ok(out)) => {
            let text = String::from_utf8_lossy(&out.stderr);
            let text = text.trim();
            if out.status.success() {
                format!("collector spool dump: {text}")
            } else {
                format!("collector spool dump failed ({}): {text}", out.status)
            }
        }
        Ok(Err(e)) => format!("collector spool dump did not run: {e}"),
        Err(_) => "collector spool dump took more than 10 s".into(),
    }
}

async fn replica_part(url: &str, database: Option<&str>) -> String {
    let Some(db) = database else {
        return format!("-- ClickHouse {url}: (no test database registered)\n");
    };
    let replicas = format!(
        "SELECT * FROM system.replicas WHERE database = '{db}' AND table = 'measurements' FORMAT JSON"
    );
    let count = format!("SELECT count() AS n FROM {db}.measurements FORMAT JSON");
    let (replicas, count) = futures::join!(ask_query(url, &replicas), ask_query(url, &count));
    let replicas = match replicas {
        Ok(rows) if rows.is_empty() => {
            "no row (the table is not replicated here, or does not exist)".into()
        }
        Ok(rows) => rows
            .iter()
            .map(|r| {
                // Only the columns that tell a replica's state; the row has about 40.
                let keep = [
                    "is_leader",
                    "is_readonly",
                    "is_session_expired",
                    "future_parts",
                    "parts_to_check",
                    "queue_size",
                    "inserts_in_queue",
                    "merges_in_queue",
                    "queue_oldest_time",
                    "log_max_index",
                    "log_pointer",
                    "last_queue_update",
                    "absolute_delay",
                    "total_replicas",
                    "active_replicas",
                    "zookeeper_exception",
                ];
                keep.iter()
                    .filter_map(|k| r.get(*k).map(|v| format!("{k}={v}")))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect::<Vec<_>>()
            .join("\n      "),
        Err(e) => e,
    };
    let count = match count {
        Ok(rows) => rows
            .first()
            .and_then(|r| r.get("n"))
            .map_or_else(|| format!("{rows:?}"), |n| n.to_string()),
        Err(e) => e,
    };
    format!(
        "-- ClickHouse {url}: {db}.measurements rows: {count}\n   system.replicas: {replicas}\n"
    )
}

/// A query's JSON rows within [`ASK`], or why there are none.
async fn ask_query(url: &str, sql: &str) -> Result<Vec<Value>, String> {
    let run = async {
        let text = super::body_of(super::http().post(url).body(sql.to_owned())).await?;
        super::data_rows(&text)
    };
    tokio::time::timeout(ASK, run)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {ASK:?} (frozen or overloaded?)")))
}

async fn browser_part(b: &WatchedBrowser) -> String {
    let mut out = format!("-- browser {}\n", b.engine);
    let page = tokio::time::timeout(
        ASK,
        b.client.execute(
            "return {url: location.href, visibility: document.visibilityState, \
             console: window.__console || null, errors: window.__errors || null};",
            vec![],
        ),
    )
    .await;
    match page {
        Ok(Ok(v)) => {
            out.push_str(&format!(
                "   page {} ({}), errors {}\n   its console, lifecycle and sends (window.__console):\n",
                v["url"], v["visibility"], v["errors"]
            ));
            match v["console"].as_array() {
                Some(lines) if !lines.is_empty() => {
                    for l in lines {
                        out.push_str(&format!("      {}\n", l.as_str().unwrap_or_default()));
                    }
                }
                Some(_) => out.push_str("      (empty)\n"),
                None => out.push_str("      (this page has no recorder)\n"),
            }
        }
        Ok(Err(e)) => out.push_str(&format!("   page: cannot be read: {e}\n")),
        Err(_) => out.push_str(&format!("   page: no answer within {ASK:?}\n")),
    }
    match &b.console {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map(|t| {
                    t.lines()
                        // Firefox prints `console.log: "..."`, Chromium `:INFO:CONSOLE(...)`.
                        .filter(|l| l.starts_with("console.") || l.contains(":CONSOLE"))
                        .map(str::to_owned)
                        .collect::<Vec<_>>()
                })
                .unwrap_or_else(|e| vec![format!("(cannot read {}: {e})", path.display())]);
            let from = text.len().saturating_sub(TAIL * 2);
            out.push_str(&format!(
                "   the engine's console, every page ({}), last {} of {} lines:\n      {}\n",
                path.display(),
                text.len() - from,
                text.len(),
                text[from..].join("\n      ")
            ));
        }
        None => out.push_str(
            "   (this engine's console is not reachable from outside: the page's own record above)\n",
        ),
    }
    out
}

/// Polls `check` every `every` until it gives `Ok`, and returns that; after `limit`, gives up
/// through `diag` naming `what` and the last `Err` (what was seen instead).
pub async fn wait_until<T, F, Fut>(
    diag: &Diag,
    what: &str,
    limit: Duration,
    every: Duration,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    loop {
        let last = match check().await {
            Ok(v) => return v,
            Err(e) => e,
        };
        if start.elapsed() >= limit {
            diag.give_up(format!(
                "gave up after {:?} (limit {limit:?}) waiting for {what}; last seen: {last}",
                start.elapsed()
            ))
            .await;
        }
        tokio::time::sleep(every).await;
    }
}

/// Polls `check` every `every` until it gives `Ok`, and returns that; when it gives `Err` and
/// `limit` has passed since the first poll, gives up through `diag` with that `Err` as the
/// whole message (unlike [`wait_until`], which frames it).
pub async fn poll_until<T, F, Fut>(diag: &Diag, limit: Duration, every: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    loop {
        match check().await {
            Ok(v) => return v,
            Err(why) if start.elapsed() >= limit => diag.give_up(why).await,
            Err(_) => {}
        }
        tokio::time::sleep(every).await;
    }
}
