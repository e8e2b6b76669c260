//! The collector under test: the real `collector serve` binary as a child process on free
//! ports, its intake, metrics and log.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{body_of, free_port, http, log_text, process, root, Diag};

/// The `collector` binary, built if needed.
pub fn collector_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(p) = std::env::var("COLLECTOR_BIN") {
            return PathBuf::from(p);
        }
        let status = Command::new(env!("CARGO"))
            .args(["build", "-q", "-p", "collector", "--bin", "collector"])
            .current_dir(root())
            .status()
            .expect("cargo build");
        assert!(status.success(), "building the collector failed");
        std::env::var_os("CARGO_TARGET_DIR")
            .map_or_else(|| root().join("target"), PathBuf::from)
            .join("debug/collector")
    })
    .clone()
}

/// A running `collector serve` child process.
pub struct Collector {
    child: Option<Child>,
    /// Base URL, e.g. `http://127.0.0.1:PORT`.
    pub url: String,
    /// Port it listens on.
    pub port: u16,
    /// Base URL of its operations listener (`COLLECTOR_ADMIN_LISTEN`: `/metrics`, and
    /// `/readyz` with its reason), e.g. `http://127.0.0.1:PORT`.
    pub admin_url: String,
    /// Port of its operations listener.
    pub admin_port: u16,
    env: Vec<(String, String)>,
    /// Spool folder (kept for restarts).
    pub spool: tempfile::TempDir,
    /// Log file.
    pub log: PathBuf,
    /// The test's report for a wait that gives up (this collector is registered with it).
    pub diag: Diag,
}

impl Collector {
    /// Starts a collector with the settings `env` and the spool folder `spool` (named in `env`
    /// or not), on free ports, registered with `diag`; waits until `/healthz` answers.
    pub(crate) async fn start(
        mut env: Vec<(String, String)>,
        spool: tempfile::TempDir,
        diag: Diag,
    ) -> Collector {
        let port = free_port();
        env.push(("COLLECTOR_LISTEN".into(), format!("127.0.0.1:{port}")));
        let admin_port = match env.iter().find(|(k, _)| k == "COLLECTOR_ADMIN_LISTEN") {
            Some((_, v)) => v.rsplit(':').next().unwrap().parse().unwrap(),
            None => {
                let p = free_port();
                env.push(("COLLECTOR_ADMIN_LISTEN".into(), format!("127.0.0.1:{p}")));
                p
            }
        };
        let log = spool.path().with_extension("log");
        let url = format!("http://127.0.0.1:{port}");
        let admin_url = format!("http://127.0.0.1:{admin_port}");
        // The spool the collector uses: the test's own folder when it names one.
        let spool_dir = env
            .iter()
            .rfind(|(k, _)| k == "COLLECTOR_SPOOL_DIR")
            .map_or_else(|| spool.path().to_owned(), |(_, v)| PathBuf::from(v));
        diag.collector(&admin_url, &log, &spool_dir, &env);
        let mut c = Collector {
            child: None,
            url,
            port,
            admin_url,
            admin_port,
            env,
            spool,
            log,
            diag,
        };
        c.spawn().await;
        c
    }

    /// Starts a collector with exactly the settings `env` (none of [`TestEnv::collector_env`](super::TestEnv::collector_env)'s
    /// added: e.g. `COLLECTOR_CLICKHOUSE_SHARDS`, which must not come with
    /// `COLLECTOR_CLICKHOUSE_URLS`) in a spool folder of its own (`COLLECTOR_SPOOL_DIR` set
    /// here), on free ports, registered with `diag`.
    pub async fn start_with_env(mut env: Vec<(String, String)>, diag: Diag) -> Collector {
        let spool = tempfile::tempdir().unwrap();
        env.push((
            "COLLECTOR_SPOOL_DIR".into(),
            spool.path().to_str().unwrap().into(),
        ));
        Collector::start(env, spool, diag).await
    }

    async fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(collector_bin())
            .arg("serve")
            .envs(self.env.iter().cloned())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", collector_bin().display()));
        let child = self.child.insert(child);
        let healthz = format!("{}/healthz", self.url);
        process::wait_ready(
            &format!("the collector on {}", self.url),
            child,
            Duration::from_secs(30),
            Duration::from_millis(50),
            || async { body_of(http().get(&healthz)).await.map(drop) },
            || log_text(&self.log),
        )
        .await;
    }

    /// The collector's log so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log)
            .unwrap_or_else(|e| panic!("the collector's log {}: {e}", self.log.display()))
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Sends `signal` (e.g. "TERM", "KILL") to the process.
    pub fn signal(&self, signal: &str) {
        let _ = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status();
    }

    /// Waits for the process to exit (at most `limit`); its exit status.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// SIGKILL and wait.
    pub async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Changes a setting for the next [`Collector::restart`].
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_owned(), value.to_owned()));
    }

    /// Starts the process again with the same settings, spool and port.
    pub async fn restart(&mut self) {
        self.kill().await;
        self.spawn().await;
    }

    /// POSTs `body` to the intake with `headers`.
    pub async fn post(
        &self,
        body: impl Into<reqwest::Body>,
        headers: &[(&str, &str)],
    ) -> (u16, Value, reqwest::header::HeaderMap) {
        let mut req = http()
            .post(format!("{}/api/v1/measurements", self.url))
            .body(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let url = format!("{}/api/v1/measurements", self.url);
        let resp = req
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {url}: no answer: {e}"));
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp
            .text()
            .await
            .unwrap_or_else(|e| panic!("POST {url}: the body of the {status} answer: {e}"));
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
            headers,
        )
    }

    /// POSTs JSON with `Content-Type: application/json`. A 503 `spool write timed out` (the
    /// spool's sync outlived its 5 s limit: a disk saturated by the machine's other work, as
    /// a CI runner building beside the tests) is resent after its `Retry-After`, at most twice,
    /// as the script resends it; every other answer is returned as it came.
    pub async fn post_json(&self, body: &Value) -> (u16, Value) {
        let mut attempt = 0;
        loop {
            let (s, v, headers) = self
                .post(body.to_string(), &[("content-type", "application/json")])
                .await;
            attempt += 1;
            if s != 503 || v["error"] != "spool write timed out" || attempt == 3 {
                return (s, v);
            }
            let wait = headers
                .get("retry-after")
                .and_then(|h| h.to_str().ok()?.parse::<u64>().ok())
                .expect("a 503 without Retry-After");
            eprintln!(
                "{}: 503 spool write timed out (a slow disk); resent after {wait} s",
                self.url
            );
            tokio::time::sleep(Duration::from_secs(wait)).await;
        }
    }

    /// The value of a metric line (exact name with labels); panics naming it when `/metrics`
    /// has no such line (a misspelt name is not 0).
    pub async fn metric(&self, name: &str) -> f64 {
        let text = self.metrics_text().await;
        metric_value(&text, name).unwrap_or_else(|| {
            let family = name.split('{').next().unwrap_or(name);
            panic!(
                "no metric line {name:?} in /metrics; lines of {family}:\n{}",
                text.lines()
                    .filter(|l| l.starts_with(family))
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        })
    }

    /// The value of a metric line, `None` while it is absent (a labelled series appears with
    /// its first event): for waiting on one.
    pub async fn metric_if_present(&self, name: &str) -> Option<f64> {
        metric_value(&self.metrics_text().await, name)
    }

    /// The text of `/metrics` on the admin listener; panics when it does not answer.
    pub async fn metrics_text(&self) -> String {
        http()
            .get(format!("{}/metrics", self.admin_url))
            .send()
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("/metrics body")
    }

    /// Waits until `/metrics` shows the gauge `collector_clickhouse_{metric}` of the replica
    /// `url` at `value` (`replica_state`: 0 down, 1 catching up, 2 healthy; `active_replica`:
    /// 1 written to), or panics after `limit` ([`Collector::wait_metric`]).
    pub async fn wait_replica(&self, metric: &str, url: &str, value: u8, limit: Duration) {
        self.wait_metric(
            &format!(
                "collector_clickhouse_{metric}{{replica=\"{url}\",shard=\"default\"}} {value}"
            ),
            limit,
        )
        .await;
    }

    /// Waits until `/metrics` shows `line` (exact name with labels and value) or panics after
    /// `limit`.
    pub async fn wait_metric(&self, line: &str, limit: Duration) {
        let start = Instant::now();
        let url = format!("{}/metrics", self.admin_url);
        loop {
            // No answer (a restart under way) is waited through; the last one is shown.
            let text = match http().get(&url).send().await {
                Ok(r) => match r.text().await {
                    Ok(t) => t,
                    Err(e) => format!("(GET {url}: the body cannot be read: {e})"),
                },
                Err(e) => format!("(GET {url}: no answer: {e})"),
            };
            if text.lines().any(|l| l == line) {
                return;
            }
            if start.elapsed() >= limit {
                self.diag
                    .give_up(format!(
                        "{} never showed {line:?} in {limit:?}; its last answer:\n{}",
                        self.url,
                        text.lines()
                            .filter(|l| l.starts_with("collector_clickhouse")
                                || l.starts_with("collector_spool")
                                || l.starts_with("(GET"))
                            .collect::<Vec<_>>()
                            .join("\n")
                    ))
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Status code of `GET path`; panics naming the URL when the collector does not answer
    /// (no answer is not a status).
    pub async fn status_of(&self, path: &str) -> u16 {
        let url = format!("{}{path}", self.url);
        http()
            .get(&url)
            .send()
            .await
            .map(|r| r.status().as_u16())
            .unwrap_or_else(|e| panic!("GET {url}: no answer: {e}"))
    }
}

/// The value on the line of `name` (exact name with labels) in a metrics text.
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(' '))
            .map(|v| {
                v.trim()
                    .parse()
                    .unwrap_or_else(|e| panic!("metric {name}: {v:?}: {e}"))
            })
    })
}

impl Drop for Collector {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Lines of a collector log (text format: `<time>  WARN target: ...`) at WARN or ERROR level.
/// Panics when no line of `logs` carries a level at all: an empty log, or one in another
/// format, would otherwise read as "no warnings".
pub fn warning_lines(logs: &str) -> Vec<&str> {
    const LEVELS: [&str; 5] = [" TRACE ", " DEBUG ", " INFO ", " WARN ", " ERROR "];
    assert!(
        logs.lines()
            .any(|l| LEVELS.iter().any(|level| l.contains(level))),
        "no log line with a level (TRACE, DEBUG, INFO, WARN, ERROR) to look for warnings in: \
         an empty log or not the text format:\n{logs}"
    );
    logs.lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect()
}
