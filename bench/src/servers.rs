//! The servers under test, each on core 0: the collector (release build) and nginx with one
//! worker answering `return 204`; the collector's `/metrics`; ClickHouse over HTTP.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::error::{fail, Result};
use crate::procs::{self, Proc};

/// What the stack's `stack.env` gives the collector.
#[derive(Debug, Clone)]
pub struct Backends {
    /// `COLLECTOR_DATABASE_URL`.
    pub database_url: String,
    /// `COLLECTOR_CLICKHOUSE_URLS`, comma-separated.
    pub clickhouse_urls: String,
}

/// A running collector: `serve` under `taskset -c 0`.
#[derive(Debug)]
pub struct Collector {
    proc: Proc,
    /// Its public port (intake).
    pub port: u16,
    /// Its operations port (`/metrics`).
    pub admin: u16,
    /// Its log file.
    pub log: PathBuf,
}

impl Collector {
    /// Starts `bin serve` on `port`/`admin` with the benchmark's settings, spool `spool`,
    /// `extra` settings on top (they win; `COLLECTOR_CLICKHOUSE_SHARDS` there replaces the
    /// stack's URLs), and waits (60 s) for `/readyz`.
    pub fn start(
        bin: &Path,
        ports: (u16, u16),
        spool: &Path,
        log: &Path,
        backends: &Backends,
        extra: &[(&str, &str)],
    ) -> Result<Collector> {
        let (port, admin) = ports;
        let mut cmd = Command::new("taskset");
        cmd.args(["-c", "0"]).arg(bin).arg("serve");
        // `extra` may name the shards instead (not together with the URLs).
        if !extra
            .iter()
            .any(|(k, _)| *k == "COLLECTOR_CLICKHOUSE_SHARDS")
        {
            cmd.env("COLLECTOR_CLICKHOUSE_URLS", &backends.clickhouse_urls);
        }
        cmd.env("COLLECTOR_LISTEN", format!("127.0.0.1:{port}"))
            .env("COLLECTOR_ADMIN_LISTEN", format!("127.0.0.1:{admin}"))
            .env("COLLECTOR_DATABASE_URL", &backends.database_url)
            .env("COLLECTOR_CLICKHOUSE_DATABASE", "collector")
            .env("COLLECTOR_SPOOL_DIR", spool)
            .env("COLLECTOR_SPOOL_MAX_BYTES", "8589934592")
            .env("COLLECTOR_CLIENT_RATE", "0")
            .env("COLLECTOR_SITE_RATE", "0")
            .env("COLLECTOR_DRAIN_GRACE", "0s");
        // Last: `extra` wins over the settings above.
        cmd.envs(extra.iter().copied());
        let proc = Proc::spawn("the collector", cmd, log)?;
        let ready = format!("http://127.0.0.1:{port}/readyz");
        if !wait_until(Duration::from_secs(60), || http_status(&ready) == Some(200)) {
            return Err(fail(format!(
                "the collector not ready on {ready} within 60 s (see {})",
                log.display()
            )));
        }
        Ok(Collector {
            proc,
            port,
            admin,
            log: log.to_path_buf(),
        })
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// The intake URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/api/v1/measurements", self.port)
    }

    /// Its `/metrics`, summed. Errors: the request fails (names the URL).
    pub fn metrics(&self) -> Result<Metrics> {
        let url = format!("http://127.0.0.1:{}/metrics", self.admin);
        let text = ureq::get(&url)
            .timeout(Duration::from_secs(10))
            .call()
            .map_err(|e| fail(format!("GET {url}: {e}")))?
            .into_string()
            .map_err(|e| fail(format!("GET {url}: {e}")))?;
        Ok(Metrics::parse(&text))
    }

    /// Waits (at most 120 s) until the writer has confirmed everything (`spool_records` 0);
    /// past that, a warning.
    pub fn wait_drained(&self) -> Result<()> {
        let mut left = f64::NAN;
        for _ in 0..600 {
            left = self.metrics()?.spool_records;
            if left == 0.0 {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        crate::note(&format!(
            "warning: the spool did not drain within 120 s ({left} records left)"
        ));
        Ok(())
    }

    /// SIGTERM (drain), up to 30 s, then SIGKILL.
    pub fn stop(self) {
        self.proc.stop();
    }
}

/// The figures of the collector's `/metrics` the benchmark reads, summed over label sets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    /// `collector_measurements_accepted_total`.
    pub accepted: f64,
    /// `collector_measurements_duplicate_total`.
    pub duplicates: f64,
    /// `collector_measurements_rejected_total`.
    pub rejected: f64,
    /// `collector_clickhouse_inserts_total`.
    pub inserts: f64,
    /// `collector_clickhouse_insert_errors_total`.
    pub insert_errors: f64,
    /// `collector_batches_retried_total`.
    pub batches_retried: f64,
    /// `collector_clickhouse_failovers_total`.
    pub failovers: f64,
    /// `collector_http_requests_total` of the intake route with a status other than 202.
    pub intake_other: f64,
    /// `collector_http_shed_total`.
    pub shed: f64,
    /// `collector_spool_records`.
    pub spool_records: f64,
    /// `collector_http_open_connections`.
    pub open_connections: f64,
    /// `collector_spool_kept_aside_total`.
    pub kept_aside: f64,
    /// `collector_spool_sync_duration_seconds_bucket`: each bucket's upper bound (s) and its
    /// cumulative count of group commits, in the exposition's order (ascending, `+Inf` last).
    pub sync_buckets: Vec<(f64, f64)>,
}

/// How long the spool's group commits took between two scrapes, from the
/// `collector_spool_sync_duration_seconds` histogram: quantiles are bucket upper bounds
/// (the histogram doubles from 100 µs, so a figure is at most twice the true one).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Syncs {
    /// Group commits (`write` + `fdatasync`) between the scrapes.
    pub count: f64,
    /// The bucket bound below which half of them ended, in ms.
    pub p50_ms: f64,
    /// The bucket bound below which 99 % of them ended, in ms.
    pub p99_ms: f64,
    /// The bound of the highest bucket any of them reached, in ms (infinite past 13 s).
    pub max_ms: f64,
}

impl Syncs {
    /// The syncs of `after` that `before` had not counted; `None` when either scrape lacks
    /// the histogram or their buckets differ.
    pub fn between(before: &Metrics, after: &Metrics) -> Option<Syncs> {
        let (b, a) = (&before.sync_buckets, &after.sync_buckets);
        if a.is_empty() || a.len() != b.len() || a.iter().zip(b).any(|(x, y)| x.0 != y.0) {
            return None;
        }
        let delta: Vec<(f64, f64)> = a.iter().zip(b).map(|(x, y)| (x.0, x.1 - y.1)).collect();
        let count = delta.last()?.1;
        let bound = |q: f64| {
            delta
                .iter()
                .find(|(_, c)| *c >= q * count && *c > 0.0)
                .map_or(f64::NAN, |(le, _)| le * 1000.0)
        };
        Some(Syncs {
            count,
            p50_ms: bound(0.5),
            p99_ms: bound(0.99),
            max_ms: bound(1.0),
        })
    }
}

impl Metrics {
    /// Sums a Prometheus text exposition; unknown names are ignored.
    pub fn parse(text: &str) -> Metrics {
        let mut m = Metrics::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (name_labels, value) = match line.rsplit_once(' ') {
                Some((a, v)) => (a.trim(), v.parse::<f64>().unwrap_or(0.0)),
                None => continue,
            };
            let (name, labels) = name_labels.split_once('{').unwrap_or((name_labels, ""));
            let slot = match name {
                "collector_measurements_accepted_total" => &mut m.accepted,
                "collector_measurements_duplicate_total" => &mut m.duplicates,
                "collector_measurements_rejected_total" => &mut m.rejected,
                "collector_clickhouse_inserts_total" => &mut m.inserts,
                "collector_clickhouse_insert_errors_total" => &mut m.insert_errors,
                "collector_batches_retried_total" => &mut m.batches_retried,
                "collector_clickhouse_failovers_total" => &mut m.failovers,
                "collector_http_requests_total"
                    if labels.contains("route=\"/api/v1/measurements\"")
                        && !labels.contains("status=\"202\"") =>
                {
                    &mut m.intake_other
                }
                "collector_http_shed_total" => &mut m.shed,
                "collector_spool_records" => &mut m.spool_records,
                "collector_http_open_connections" => &mut m.open_connections,
                "collector_spool_kept_aside_total" => &mut m.kept_aside,
                "collector_spool_sync_duration_seconds_bucket" => {
                    let le = labels
                        .split("le=\"")
                        .nth(1)
                        .and_then(|rest| rest.split('"').next())
                        .map(|b| {
                            if b == "+Inf" {
                                f64::INFINITY
                            } else {
                                b.parse().unwrap_or(f64::NAN)
                            }
                        });
                    if let Some(le) = le {
                        m.sync_buckets.push((le, value));
                    }
                    continue;
                }
                _ => continue,
            };
            *slot += value;
        }
        m
    }
}

/// nginx with one worker answering 204 to everything, on core 0.
#[derive(Debug)]
pub struct Nginx {
    proc: Proc,
    /// Its port.
    pub port: u16,
}

impl Nginx {
    /// Writes `dir/nginx.conf` and starts nginx on `port`; waits (10 s) for a 204.
    pub fn start(dir: &Path, port: u16, log: &Path) -> Result<Nginx> {
        let d = dir.display();
        std::fs::create_dir_all(dir.join("tmp"))
            .map_err(|e| fail(format!("creating {d}/tmp: {e}")))?;
        let conf = format!(
            "worker_processes 1;\nworker_rlimit_nofile 20000;\ndaemon off;\nmaster_process on;\npid {d}/nginx.pid;\n\
             error_log {d}/error.log warn;\nevents {{ worker_connections 16384; }}\nhttp {{\n    access_log off;\n\
             \x20   keepalive_timeout 120s;\n    keepalive_requests 1000000000;\n    client_body_temp_path {d}/tmp/body;\n\
             \x20   proxy_temp_path {d}/tmp/proxy;\n    fastcgi_temp_path {d}/tmp/fastcgi;\n    uwsgi_temp_path {d}/tmp/uwsgi;\n\
             \x20   scgi_temp_path {d}/tmp/scgi;\n    server {{\n        listen 127.0.0.1:{port};\n        location / {{ return 204; }}\n    }}\n}}\n"
        );
        crate::tools::write(&dir.join("nginx.conf"), &conf)?;
        let mut cmd = Command::new("taskset");
        cmd.args(["-c", "0", "nginx", "-p"])
            .arg(dir)
            .arg("-e")
            .arg(dir.join("error.log"))
            .arg("-c")
            .arg(dir.join("nginx.conf"));
        let proc = Proc::spawn("nginx", cmd, log)?;
        let nginx = Nginx { proc, port };
        let url = nginx.url();
        if !wait_until(Duration::from_secs(10), || http_status(&url) == Some(204)) {
            return Err(fail(format!(
                "nginx not answering 204 on {url} within 10 s (see {d}/error.log)"
            )));
        }
        Ok(nginx)
    }

    /// The URL the load goes to (the same path as the collector's).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/api/v1/measurements", self.port)
    }

    /// The master and its workers.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids = vec![self.proc.pid()];
        pids.extend(procs::children(self.proc.pid()));
        pids
    }

    /// SIGTERM, up to 30 s, then SIGKILL.
    pub fn stop(self) {
        self.proc.stop();
    }
}

/// The axum floor (`bench/src/bin/axum-floor.rs`: 202 after reading the body, nothing else)
/// under `taskset -c 0`, as the collector runs.
#[derive(Debug)]
pub struct Floor {
    proc: Proc,
    /// Its port.
    pub port: u16,
}

impl Floor {
    /// Starts `bin 127.0.0.1:port`; waits (10 s) for a 202.
    pub fn start(bin: &Path, port: u16, log: &Path) -> Result<Floor> {
        let mut cmd = Command::new("taskset");
        cmd.args(["-c", "0"])
            .arg(bin)
            .arg(format!("127.0.0.1:{port}"));
        let proc = Proc::spawn("the axum floor", cmd, log)?;
        let floor = Floor { proc, port };
        let url = floor.url();
        if !wait_until(Duration::from_secs(10), || http_status(&url) == Some(202)) {
            return Err(fail(format!(
                "the axum floor ({}) not answering 202 on {url} within 10 s (see {})",
                bin.display(),
                log.display()
            )));
        }
        Ok(floor)
    }

    /// The URL the load goes to (the same path as the collector's).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/api/v1/measurements", self.port)
    }

    /// Its process.
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// SIGTERM, up to 30 s, then SIGKILL.
    pub fn stop(self) {
        self.proc.stop();
    }
}

/// Polls `ok` every 100 ms until it holds (true) or `limit` passes (false).
pub fn wait_until(limit: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !ok() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    true
}

/// The status of a GET of `url` (2 s timeout), None when it fails to connect.
pub fn http_status(url: &str) -> Option<u16> {
    match ureq::get(url).timeout(Duration::from_secs(2)).call() {
        Ok(r) => Some(r.status()),
        Err(ureq::Error::Status(code, _)) => Some(code),
        Err(_) => None,
    }
}

/// A ClickHouse server's HTTP interface.
#[derive(Debug, Clone)]
pub struct ClickHouse {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
}

impl ClickHouse {
    /// The answer to `sql` (trimmed), with URL parameters `params`. Errors name the server,
    /// the code and the statement.
    pub fn query_with(
        &self,
        sql: &str,
        params: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<(String, Option<String>)> {
        let mut req = ureq::post(&format!("{}/", self.url)).timeout(timeout);
        for (k, v) in params {
            req = req.query(k, v);
        }
        let short: String = sql.chars().take(300).collect();
        match req.send_string(sql) {
            Ok(r) => {
                let summary = r.header("X-ClickHouse-Summary").map(str::to_owned);
                let body = r.into_string().map_err(|e| {
                    fail(format!(
                        "ClickHouse {}: reading the answer to {short}: {e}",
                        self.url
                    ))
                })?;
                if body.contains("__exception__") || body.contains("DB::Exception") {
                    return Err(fail(format!(
                        "ClickHouse {}: exception in the answer to {short}: {}",
                        self.url,
                        tail(&body)
                    )));
                }
                Ok((body.trim().to_owned(), summary))
            }
            Err(ureq::Error::Status(code, r)) => {
                let body = r.into_string().unwrap_or_default();
                Err(fail(format!(
                    "ClickHouse {}: {code} {} for {short}",
                    self.url,
                    tail(&body)
                )))
            }
            Err(e) => Err(fail(format!("ClickHouse {}: {e} for {short}", self.url))),
        }
    }

    /// The answer to `sql` (30 s at most).
    pub fn query(&self, sql: &str) -> Result<String> {
        Ok(self.query_with(sql, &[], Duration::from_secs(30))?.0)
    }

    /// The answer to `sql` as a number. Errors: not a number (names the statement).
    pub fn number(&self, sql: &str) -> Result<u64> {
        let text = self.query(sql)?;
        text.parse().map_err(|_| {
            fail(format!(
                "ClickHouse {}: {sql}: not a number: {text}",
                self.url
            ))
        })
    }
}

fn tail(text: &str) -> &str {
    let start = text.len().saturating_sub(2000);
    let start = (start..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    text[start..].trim()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Captured from a collector's operations listener during a benchmark (a subset of lines).
    const METRICS: &str =
        "# HELP collector_measurements_accepted_total Measurements accepted (202).
# TYPE collector_measurements_accepted_total counter
collector_measurements_accepted_total{site=\"bench-01\"} 1520
collector_measurements_accepted_total{site=\"bench-02\"} 1480
collector_measurements_duplicate_total 3
collector_http_requests_total{route=\"/api/v1/measurements\",method=\"POST\",status=\"202\"} 3000
collector_http_requests_total{route=\"/api/v1/measurements\",method=\"POST\",status=\"503\"} 2
collector_http_requests_total{route=\"/readyz\",method=\"GET\",status=\"503\"} 7
collector_clickhouse_inserts_total{replica=\"http://127.0.0.1:21001\"} 12
collector_clickhouse_inserts_total{replica=\"http://127.0.0.1:21002\"} 1
collector_spool_records 0
collector_http_open_connections 32
";

    #[test]
    fn metrics_summed_over_labels() {
        let m = Metrics::parse(METRICS);
        assert_eq!(m.accepted, 3000.0);
        assert_eq!(m.duplicates, 3.0);
        assert_eq!(m.intake_other, 2.0);
        assert_eq!(m.inserts, 13.0);
        assert_eq!(m.spool_records, 0.0);
        assert_eq!(m.open_connections, 32.0);
        assert_eq!(m.shed, 0.0);
    }

    const BEFORE: &str = "collector_spool_sync_duration_seconds_bucket{le=\"0.0001\"} 1\n\
        collector_spool_sync_duration_seconds_bucket{le=\"0.0002\"} 2\n\
        collector_spool_sync_duration_seconds_bucket{le=\"0.0004\"} 2\n\
        collector_spool_sync_duration_seconds_bucket{le=\"+Inf\"} 2\n";
    const AFTER: &str = "collector_spool_sync_duration_seconds_bucket{le=\"0.0001\"} 1\n\
        collector_spool_sync_duration_seconds_bucket{le=\"0.0002\"} 52\n\
        collector_spool_sync_duration_seconds_bucket{le=\"0.0004\"} 101\n\
        collector_spool_sync_duration_seconds_bucket{le=\"+Inf\"} 102\n";

    #[test]
    fn syncs_between_two_scrapes_are_read_from_the_bucket_bounds() {
        let s = Syncs::between(&Metrics::parse(BEFORE), &Metrics::parse(AFTER)).unwrap();
        assert_eq!(s.count, 100.0);
        assert_eq!(s.p50_ms, 0.2);
        assert_eq!(s.p99_ms, 0.4);
        assert_eq!(s.max_ms, f64::INFINITY);
    }

    #[test]
    fn no_histogram_is_no_figure() {
        assert_eq!(
            Syncs::between(&Metrics::parse(""), &Metrics::parse(AFTER)),
            None
        );
    }
}
