//! The in-process tier's harness: the whole collector ([`collector::app::run`]) on
//! `127.0.0.1:0` with its two seams replaced by in-memory parts, a site source
//! ([`Sites`]) and ClickHouse servers ([`clickhouse::ClickHouse`]), a spool in a temporary
//! folder, and helpers that fail loudly: a missing metric, a condition never met or an
//! answer that is not HTTP panics with what was looked for.

pub mod clickhouse;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use collector::cli::Cli;
use collector::config::Config;
use collector::settings::{Site, SiteSource, StoreError};
use futures_util::future::BoxFuture;
use http_body_util::{BodyExt, Full};
use serde_json::Value;

pub use self::clickhouse::{ClickHouse, Fault};

/// An in-memory site source: sites by key, a switch that makes every call fail as a store
/// that is down, an optional delay per call, and counts of the calls.
#[derive(Default)]
pub struct Sites {
    sites: Mutex<HashMap<String, Site>>,
    down: AtomicBool,
    delay: Mutex<Duration>,
    /// `fetch` calls made.
    pub fetches: AtomicUsize,
    /// `fetch_all` calls made.
    pub fetch_alls: AtomicUsize,
}

impl Sites {
    /// A source holding `keys`, each enabled, any origin, sampling everything.
    pub fn with(keys: &[&str]) -> Arc<Self> {
        let sites = Sites::default();
        for key in keys {
            sites.put(site(key));
        }
        Arc::new(sites)
    }

    /// Inserts or replaces a site.
    pub fn put(&self, site: Site) {
        self.sites.lock().unwrap().insert(site.key.clone(), site);
    }

    /// Every call fails from now on (`down`), or answers again.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// Each call waits this long (on the runtime's clock) before answering.
    pub fn set_delay(&self, delay: Duration) {
        *self.delay.lock().unwrap() = delay;
    }

    /// `fetch` calls so far.
    pub fn fetch_count(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }

    async fn wait(&self) -> Result<(), StoreError> {
        let delay = *self.delay.lock().unwrap();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::Failed("the in-memory store is down".into()));
        }
        Ok(())
    }
}

impl SiteSource for Sites {
    fn fetch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Site>, StoreError>> {
        self.fetches.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            self.wait().await?;
            Ok(self.sites.lock().unwrap().get(key).cloned())
        })
    }

    fn fetch_all(&self) -> BoxFuture<'_, Result<Vec<Site>, StoreError>> {
        self.fetch_alls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            self.wait().await?;
            let mut all: Vec<Site> = self.sites.lock().unwrap().values().cloned().collect();
            all.sort_by(|a, b| a.key.cmp(&b.key));
            Ok(all)
        })
    }
}

/// An enabled site that allows any origin and samples every page view.
pub fn site(key: &str) -> Site {
    Site::new(key)
}

/// A collector running in this process.
pub struct App {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Where its operations listener listens (`/metrics`, `/readyz` with its reason).
    pub admin: std::net::SocketAddr,
    /// Its spool folder (removed when the app is dropped).
    pub spool: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<bool>>,
    task: Option<tokio::task::JoinHandle<Result<(), collector::RunError>>>,
}

/// Options that keep the in-process tests quick: batches flushed after 50 ms, a short drain
/// grace. Given before the test's own options, which win.
const QUICK: &[(&str, &str)] = &[
    ("--batch-max-age", "50ms"),
    ("--drain-grace", "100ms"),
    ("--log-format", "json"),
];

impl App {
    /// Starts a collector with `sites` and the `clickhouse` servers (in preference order),
    /// the quick options, then `options` (`--name value` pairs of `collector --help`), on a
    /// spool of its own; returns once `/readyz` answers 200.
    pub async fn start(
        sites: Arc<Sites>,
        clickhouse: &[&ClickHouse],
        options: &[(&str, &str)],
    ) -> App {
        let spool = tempfile::tempdir().expect("a temporary spool folder");
        App::start_on(spool, sites, clickhouse, options).await
    }

    /// [`App::start`] on a given spool folder (a restart).
    pub async fn start_on(
        spool: tempfile::TempDir,
        sites: Arc<Sites>,
        clickhouse: &[&ClickHouse],
        options: &[(&str, &str)],
    ) -> App {
        let app = App::launch(spool, sites, clickhouse, options).await;
        let addr = app.addr;
        wait_until("/readyz answers 200", ANSWER_WITHIN, || async move {
            get(addr, "/readyz").await.status == 200
        })
        .await;
        app
    }

    /// Starts a collector without waiting for it to be ready.
    pub async fn launch(
        spool: tempfile::TempDir,
        sites: Arc<Sites>,
        clickhouse: &[&ClickHouse],
        options: &[(&str, &str)],
    ) -> App {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin_addr = admin.local_addr().unwrap();
        let urls: Vec<String> = clickhouse.iter().map(|c| c.url()).collect();
        // A test that names its shards gives them itself (not together with the URLs).
        let sharded = options.iter().any(|(n, _)| *n == "--clickhouse-shards");
        let mut args: Vec<String> = vec![
            "collector".into(),
            "--listen".into(),
            addr.to_string(),
            "--admin-listen".into(),
            admin_addr.to_string(),
            "--spool-dir".into(),
            spool.path().display().to_string(),
            // Never contacted: the site source is in memory.
            "--database-url".into(),
            "postgres://unused@127.0.0.1:9/unused".into(),
        ];
        if !sharded {
            args.push("--clickhouse-urls".into());
            args.push(urls.join(","));
        }
        let quick = QUICK
            .iter()
            .filter(|(name, _)| !options.iter().any(|(given, _)| given == name));
        for (name, value) in quick.chain(options) {
            args.push((*name).into());
            args.push((*value).into());
        }
        let cli = Cli::try_parse_from(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        let config = Config::from_args(&cli.args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<bool>();
        let seams = collector::app::Seams {
            listener,
            admin,
            sites,
            metrics: Arc::new(collector::metrics::Metrics::new()),
        };
        let task = tokio::spawn(collector::app::run(config, seams, async move {
            stopped.await.unwrap_or(false)
        }));
        App {
            addr,
            admin: admin_addr,
            spool,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops it as SIGTERM (`grace`: `/readyz` 503 first) or SIGINT would, and waits for the
    /// drain to end; returns how long that took and the spool folder.
    pub async fn stop(mut self, grace: bool) -> (Duration, tempfile::TempDir) {
        let began = Instant::now();
        self.signal(grace);
        let spool = self.stopped().await;
        (began.elapsed(), spool)
    }

    /// Sends the stop signal (SIGTERM: `grace`; SIGINT: not) without waiting.
    pub fn signal(&mut self, grace: bool) {
        let stop = self.stop.take().expect("the stop signal is sent once");
        let _ = stop.send(grace);
    }

    /// Waits (at most 60 s) for the collector to end after [`App::signal`]; panics when it
    /// failed or did not end. Returns the spool folder.
    pub async fn stopped(mut self) -> tempfile::TempDir {
        let result = tokio::time::timeout(Duration::from_secs(60), self.task.take().unwrap())
            .await
            .expect("the collector drained within 60 s")
            .expect("the collector's task did not panic");
        if let Err(e) = result {
            panic!("the collector failed: {e}");
        }
        self.spool
    }

    /// Waits (at most [`ANSWER_WITHIN`]) for a collector that cannot start to end, and returns
    /// its error; panics when it serves or does not end.
    pub async fn failed(mut self) -> String {
        let result = tokio::time::timeout(ANSWER_WITHIN, self.task.take().unwrap())
            .await
            .expect("the collector ended within ANSWER_WITHIN")
            .expect("the collector's task did not panic");
        match result {
            Err(e) => e.to_string(),
            Ok(()) => panic!("the collector started and ended without an error"),
        }
    }

    /// POSTs `body` to the intake.
    pub async fn send(&self, body: &Value) -> Answer {
        post(
            self.addr,
            "/api/v1/measurements",
            &[("content-type", "application/json")],
            body.to_string(),
        )
        .await
    }

    /// The value of one series of `/metrics`, e.g. `collector_measurements_accepted_total` or
    /// `collector_clickhouse_replica_state{replica="0"}`; panics when it is not exposed.
    pub async fn metric(&self, series: &str) -> f64 {
        let text = get(self.admin, "/metrics").await.text();
        metric_in(&text, series)
            .unwrap_or_else(|| panic!("no series {series} in /metrics:\n{text}"))
    }
}

/// The value of `series` in a Prometheus text exposition, if it is there.
pub fn metric_in(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?;
        let value = rest.strip_prefix(' ')?;
        value.split_whitespace().next()?.parse().ok()
    })
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Answer {
    /// Status code.
    pub status: u16,
    /// Headers, names lowercase.
    pub headers: http::HeaderMap,
    /// Body.
    pub body: Bytes,
}

impl Answer {
    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; panics with the body when it is not.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// A header's value; panics naming it when it is missing.
    pub fn header(&self, name: &str) -> String {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("no {name} header in {:?}", self.headers))
            .to_str()
            .unwrap()
            .to_owned()
    }
}

/// How long a helper waits for an answer, and for a starting collector to be ready, before it
/// fails: an answer takes milliseconds and a start about 2 s here, but a debug build starting
/// beside the whole test run on 2 cores (a container image building, load average 11) was
/// measured taking over 10 s to answer its first `/readyz` (fresh-clone run ciD, issue 50).
pub const ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// One request over a new connection; panics when no HTTP answer comes within
/// [`ANSWER_WITHIN`].
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Answer {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    let (mut sender, connection) = hyper::client::conn::http1::handshake::<_, Full<Bytes>>(
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("HTTP handshake");
    tokio::spawn(connection);
    let mut builder = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let req = builder.body(Full::new(body.into())).unwrap();
    let answer = async {
        let res = sender.send_request(req).await.expect("an HTTP answer");
        let status = res.status().as_u16();
        let headers = res.headers().clone();
        let body = res
            .into_body()
            .collect()
            .await
            .expect("the answer's body")
            .to_bytes();
        Answer {
            status,
            headers,
            body,
        }
    };
    tokio::time::timeout(ANSWER_WITHIN, answer)
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no answer within {ANSWER_WITHIN:?}"))
}

/// `GET path`.
pub async fn get(addr: SocketAddr, path: &str) -> Answer {
    request(addr, "GET", path, &[], Bytes::new()).await
}

/// `POST path` with `body`.
pub async fn post(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Answer {
    request(addr, "POST", path, headers, body).await
}

/// Polls `condition` every 20 ms until it holds; panics naming `what` after `timeout`.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !condition().await {
        assert!(Instant::now() < deadline, "waited {timeout:?} for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A measurement with a fresh id for `site`, and its id.
pub fn beacon(site: &str) -> (uuid::Uuid, Value) {
    let id = uuid::Uuid::new_v4();
    let v = serde_json::json!({
        "id": id, "site": site, "url": "https://shop.example/product/1?color=red",
        "ttfb_ms": 120.5, "fcp_ms": 800, "lcp_ms": 1500.25, "cls": 0.05, "inp_ms": 64,
        "dom_content_loaded_ms": 900, "load_ms": 1800, "viewport_width": 1280,
        "navigation_type": "navigate", "effective_connection_type": "4g",
    });
    (id, v)
}
