//! The edge in front of the collectors (deploy/edge/: HAProxy and keepalived), built by
//! `scripts/edge.sh` in network namespaces on the shared stack, under a steady load of unique
//! beacons sent from a client namespace to the floating address over HTTPS, while its parts are
//! crashed one after the other. For every step the test reports the ids acknowledged, the ids
//! stored (FINAL), the duplicates folded and the longest time without a 202, and asserts that
//! every acknowledged id is stored exactly once and that a planned restart fails no request.

use collector_tests::common;

use std::collections::{BTreeMap, HashMap};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

mod crashes;
mod shipped;

/// Beacons per second sent by the client (one new TLS connection each, like distinct browsers).
const BEACONS_PER_SECOND: u64 = 25;
/// keepalived's check interval in the test (the shipped default is 10 s; see docs/edge.md,
/// "Operations: the edge": with 10 s the proxy's 5 s restart comes before the third failed check).
const CHECK_INTERVAL_S: u64 = 1;
/// Generous bound for every wait on a condition (a loaded two-core machine).
const WAIT: Duration = Duration::from_secs(60);

// ------------------------------------------------------------------ edge.sh ---

/// Runs `scripts/edge.sh ARGS` with `envs`; its standard output. Panics with the output on failure.
fn edge_sh(args: &[&str], envs: &[(&str, String)]) -> String {
    let out = Command::new("bash")
        .arg(root().join("scripts/edge.sh"))
        .args(args)
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("run scripts/edge.sh");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "scripts/edge.sh {args:?} failed:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// KEY=VALUE lines into a map.
fn key_values(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

/// The topology of `scripts/edge.sh up`, removed by `down` on drop (also when the test fails;
/// then the folder with the logs is kept and named).
struct Edge {
    dir: PathBuf,
    /// What `up` printed: EDGE_CLIENT_NETNS, EDGE_URL, EDGE_CA.
    env: HashMap<String, String>,
}

impl Edge {
    fn up(stack: &Stack, database: &str) -> Edge {
        // Short and under /tmp: HAProxy's runtime socket lives below it.
        let dir = tempfile::Builder::new()
            .prefix("cedge-")
            .tempdir_in("/tmp")
            .unwrap()
            .keep();
        let mut edge = Edge {
            dir,
            env: HashMap::new(),
        };
        let out = edge_sh(
            &[
                "up",
                edge.dir.to_str().unwrap(),
                stack.dir().to_str().unwrap(),
            ],
            &[
                ("COLLECTOR_BIN", collector_bin().display().to_string()),
                ("EDGE_DATABASE", database.to_owned()),
                ("EDGE_CHECK_INTERVAL", CHECK_INTERVAL_S.to_string()),
            ],
        );
        edge.env = key_values(&out);
        for k in ["EDGE_CLIENT_NETNS", "EDGE_URL", "EDGE_CA"] {
            assert!(
                edge.env.contains_key(k),
                "edge.sh up printed no {k}:\n{out}"
            );
        }
        edge
    }

    fn fault(&self, name: &str) -> String {
        edge_sh(&["fault", self.dir.to_str().unwrap(), name], &[])
            .trim()
            .to_owned()
    }

    /// The edge holding the address (edge1, edge2 or none).
    fn active(&self) -> String {
        edge_sh(&["active", self.dir.to_str().unwrap()], &[])
            .trim()
            .to_owned()
    }

    /// Polls `active` (every 20 ms) until it is `edge`; how long that took.
    fn wait_active(&self, edge: &str) -> Duration {
        let start = Instant::now();
        loop {
            let now = self.active();
            if now == edge {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < WAIT,
                "edge: {edge} did not take the address within {WAIT:?} ({now} holds it)"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn status(&self) -> HashMap<String, String> {
        key_values(&edge_sh(&["status", self.dir.to_str().unwrap()], &[]))
    }

    /// Polls `status` until `cond` holds; the status then. Panics naming `what` after `limit`.
    fn wait_status(
        &self,
        what: &str,
        limit: Duration,
        cond: impl Fn(&HashMap<String, String>) -> bool,
    ) -> HashMap<String, String> {
        let start = Instant::now();
        loop {
            let s = self.status();
            if cond(&s) {
                return s;
            }
            assert!(
                start.elapsed() < limit,
                "edge: {what} not reached within {limit:?}; status: {s:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Injects the fault `fault`, holds it for `held_s` seconds, injects `undo`, and waits until
    /// the edge holding the address sees both paths open; notes what `edge.sh fault` said of
    /// each.
    fn fault_then_reopen(&self, notes: &mut Vec<String>, fault: &str, held_s: u64, undo: &str) {
        notes.push(self.fault(fault));
        sleep(Duration::from_secs(held_s));
        notes.push(self.fault(undo));
        self.wait_paths_open();
    }

    /// Waits until the edge holding the address sees both paths open.
    fn wait_paths_open(&self) {
        self.wait_status("both paths open on the active edge", WAIT, |s| {
            let active = &s["EDGE_ACTIVE"];
            active != "none"
                && s[&format!("EDGE{}_PATHS", &active[4..])] == "preferred:UP,fallback:UP"
        });
    }
}

impl Drop for Edge {
    fn drop(&mut self) {
        let dir = self.dir.to_str().unwrap().to_owned();
        let keep = std::thread::panicking();
        let mut args = vec!["down", dir.as_str()];
        if !keep {
            args.push("--purge");
        }
        let _ = Command::new("bash")
            .arg(root().join("scripts/edge.sh"))
            .args(&args)
            .output();
        if keep {
            eprintln!("edge: logs kept in {dir} (edge1/, edge2/, collector-a/, collector-b/)");
        }
    }
}

// --------------------------------------------------------------------- load ---

/// What became of one beacon.
#[derive(Clone, Debug)]
struct Outcome {
    id: String,
    /// When it was sent and when its answer (or error) came, from the start of the load.
    sent: Duration,
    done: Duration,
    /// HTTP status; 0 when no answer came (connection error, timeout).
    status: u16,
    /// The 202's `duplicates` (the collector had seen the id).
    duplicates: u64,
    error: Option<String>,
}

/// A steady stream of unique beacons from inside the client namespace: a dedicated thread
/// enters the namespace (`setns`) and runs its own single-threaded runtime, so that every socket
/// it opens is the client's.
struct Load {
    stop: Arc<AtomicBool>,
    outcomes: Arc<Mutex<Vec<Outcome>>>,
    /// The requests still unanswered: sequence number → when sent.
    pending: Arc<Mutex<HashMap<u64, Duration>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    start: Instant,
}

impl Load {
    fn start(netns: &str, url: &str, ca: &Path, site: &str) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        let pending = Arc::new(Mutex::new(HashMap::new()));
        let ns_path = format!("/run/netns/{netns}");
        let ca = std::fs::read(ca).unwrap();
        let url = format!("{url}/api/v1/measurements");
        let site = site.to_owned();
        let start = Instant::now();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = {
            let (stop, outcomes, pending) = (stop.clone(), outcomes.clone(), pending.clone());
            std::thread::spawn(move || {
                let ns =
                    std::fs::File::open(&ns_path).unwrap_or_else(|e| panic!("open {ns_path}: {e}"));
                // SAFETY: setns on a valid descriptor; it changes this thread's namespace only.
                let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(
                    rc,
                    0,
                    "setns({ns_path}): {}",
                    std::io::Error::last_os_error()
                );
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let shared = Shared {
                    start,
                    stop,
                    outcomes,
                    pending,
                };
                rt.block_on(run_load(url, ca, site, shared, ready_tx));
            })
        };
        ready_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the load thread did not start");
        Load {
            stop,
            outcomes,
            pending,
            thread: Some(thread),
            start,
        }
    }

    /// Time since the load started.
    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// Waits until every request sent before `before` (time since the load started) has its
    /// answer or error, so that the next fault cannot hit a request of the step before.
    /// Bounded: a request times out after 30 s, so 40 s without settling is a defect of the load.
    fn settle(&self, before: Duration) {
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            let oldest = self.pending.lock().unwrap().values().min().copied();
            match oldest {
                Some(sent) if sent < before => {
                    // A request task that panicked (a broken answer) ends the load thread and
                    // never answers: say so, not "unanswered".
                    let ended = self.thread.as_ref().is_none_or(|t| t.is_finished());
                    assert!(!ended, "the load thread ended (a request of it panicked)");
                    assert!(
                        Instant::now() < deadline,
                        "a request sent {sent:?} into the load was still unanswered 40 s later"
                    );
                }
                _ => return,
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops sending, waits for every answer and returns all outcomes.
    fn finish(mut self) -> Vec<Outcome> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread
            .take()
            .unwrap()
            .join()
            .expect("the load thread panicked");
        let out = self.outcomes.lock().unwrap().clone();
        out
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What the load thread shares with the test.
struct Shared {
    start: Instant,
    stop: Arc<AtomicBool>,
    outcomes: Arc<Mutex<Vec<Outcome>>>,
    pending: Arc<Mutex<HashMap<u64, Duration>>>,
}

async fn run_load(
    url: String,
    ca: Vec<u8>,
    site: String,
    shared: Shared,
    ready: std::sync::mpsc::Sender<()>,
) {
    let Shared {
        start,
        stop,
        outcomes,
        pending,
    } = shared;
    let client = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        // A new connection per beacon: beacons come from many browsers, and a connection kept
        // across a move of the address would measure the client's pool, not the edge.
        .pool_max_idle_per_host(0)
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let _ = ready.send(());
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / BEACONS_PER_SECOND));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tasks = tokio::task::JoinSet::new();
    let mut seq = 0u64;
    while !stop.load(Ordering::SeqCst) {
        tick.tick().await;
        seq += 1;
        // Stamped under the lock, so that a settle never misses a request sent before it looked.
        let sent = {
            let mut pending = pending.lock().unwrap();
            let sent = start.elapsed();
            pending.insert(seq, sent);
            sent
        };
        let (id, body) = measurement(&site);
        let req = client
            .post(&url)
            .header("content-type", "text/plain")
            .body(body.to_string());
        let (outcomes, pending) = (outcomes.clone(), pending.clone());
        tasks.spawn(async move {
            let (status, duplicates, error) = match req.send().await {
                Ok(r) => {
                    let status = r.status().as_u16();
                    match r.text().await {
                        // A 202 says how many it had seen: one that does not is a broken
                        // answer, not 0 duplicates (the panic fails the load thread).
                        Ok(body) if status == 202 => {
                            let answer: serde_json::Value = serde_json::from_str(&body)
                                .unwrap_or_else(|e| panic!("a 202 that is not JSON: {e}: {body}"));
                            let dups = field(&answer, "duplicates").as_u64().unwrap_or_else(|| {
                                panic!("a 202 whose duplicates is not a count: {body}")
                            });
                            (status, dups, None)
                        }
                        Ok(body) => (status, 0, Some(body.chars().take(200).collect())),
                        Err(e) => (status, 0, Some(format!("the body cannot be read: {e}"))),
                    }
                }
                Err(e) => (0, 0, Some(format!("{e:?}").chars().take(300).collect())),
            };
            outcomes.lock().unwrap().push(Outcome {
                id,
                sent,
                done: start.elapsed(),
                status,
                duplicates,
                error,
            });
            pending.lock().unwrap().remove(&seq);
        });
        // A request task that panicked (a broken answer) fails the load, not silently.
        while let Some(done) = tasks.try_join_next() {
            done.expect("a request of the load");
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("a request of the load");
    }
}

/// Blocks this thread for `d` (the steps and the edge's waits run on blocking threads).
fn sleep(d: Duration) {
    std::thread::sleep(d);
}
