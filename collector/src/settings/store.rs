//! The PostgreSQL settings store (the `sites` table), behind a circuit breaker.
//!
//! Every call goes through a circuit breaker ([`Breaker`]): after a failed query or
//! connection it opens, and the store is not contacted again for `COLLECTOR_SETTINGS_BACKOFF`
//! by any path of this process, however many requests arrive; then exactly one call is let
//! through as a trial, and only its success closes the breaker again. Connections are opened
//! one at a time and the breaker opens before a failed attempt's call returns, so calls that
//! were admitted together make one connection attempt between them, not one each. The pool
//! is deadpool-postgres's, small ([`POOL_SIZE`]), with every wait bounded; its connector is
//! ours ([`HostsConnector`]), for what tokio-postgres's own connect does not do below.
//!
//! - **Hosts that hang.** A URL may list several hosts (a primary and its standby). Each host
//!   gets its own [`HOST_TIMEOUT`] for connecting and answering the start-up handshake, so a
//!   host that accepts TCP and never answers (a frozen postmaster, a black-holed address) costs
//!   that much and the next host is tried; tokio-postgres's own `connect_timeout` covers only
//!   the TCP connect. The host that answered last is tried first next time. A connection that
//!   fails or times out during a call is taken out of the pool, never reused.
//! - **Transaction-mode poolers** (PgBouncer `pool_mode = transaction`): consecutive
//!   statements of one session may run on different server connections, so a named prepared
//!   statement cannot outlive its round trip. Every query therefore uses the unnamed statement
//!   of the extended protocol with its parameter types given (`query_typed`: Parse, Bind,
//!   Execute and Sync in one round trip) or the simple protocol (`batch_execute`), never
//!   `prepare`.
//! - **Errors name their cause**: PostgreSQL's SQLSTATE and message, or the connection error of
//!   every host tried.
//!
//! Host names are resolved by tokio-postgres per new connection, never per request.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

// The runtime's clock, so that tests can pause and advance it.
use tokio::time::Instant;

use deadpool_postgres::{ManagerConfig, Object, Pool, PoolError, RecyclingMethod};
use futures_util::future::BoxFuture;
use tokio::task::JoinHandle;
use tokio_postgres::config::Host;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Config, NoTls};

use super::Site;
use crate::metrics::Metrics;

/// Connections the pool opens at most.
pub const POOL_SIZE: usize = 4;
/// Bound on connecting to one host: TCP connect plus the start-up handshake.
pub const HOST_TIMEOUT: Duration = Duration::from_millis(1500);
/// Bound on one call once a connection is in hand (the query and its answer).
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(3);

/// A settings-store failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store failed recently; it is left alone until the backoff ends.
    #[error("settings store in backoff after a failure")]
    Backoff,
    /// Connection, timeout or query error.
    #[error("settings store: {0}")]
    Failed(String),
    /// The first-fetch budget of never-seen keys is spent (see [`crate::settings`]); the store
    /// was not asked.
    #[error("first-fetch budget of never-seen site keys spent")]
    Limited,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BreakerState {
    /// Calls go through.
    Closed,
    /// Nothing goes through until `until`.
    Open { until: Instant },
    /// One trial is in flight; nothing else goes through.
    HalfOpen,
}

/// The circuit breaker in front of the store: *closed* lets calls through; a failure opens it
/// for the backoff; then one trial (half-open) decides.
#[derive(Debug)]
pub struct Breaker {
    state: Mutex<BreakerState>,
    backoff: Duration,
}

/// Permission for one call; `trial` when it is the single call after a backoff.
#[derive(Debug, Clone, Copy)]
pub struct Admission {
    trial: bool,
}

impl Breaker {
    /// A closed breaker that opens for `backoff` after each failure.
    pub fn new(backoff: Duration) -> Self {
        Breaker {
            state: Mutex::new(BreakerState::Closed),
            backoff,
        }
    }

    /// Lets a call through, or not.
    pub fn admit(&self) -> Option<Admission> {
        let mut state = self.state.lock().unwrap();
        match *state {
            BreakerState::Closed => Some(Admission { trial: false }),
            BreakerState::Open { until } if Instant::now() >= until => {
                *state = BreakerState::HalfOpen;
                Some(Admission { trial: true })
            }
            BreakerState::Open { .. } | BreakerState::HalfOpen => None,
        }
    }

    /// Records the outcome of an admitted call.
    pub fn report(&self, admission: Admission, ok: bool) {
        let mut state = self.state.lock().unwrap();
        *state = match (ok, *state) {
            (true, BreakerState::HalfOpen) if admission.trial => BreakerState::Closed,
            (true, s) => s,
            (false, s) => self.opened(s),
        };
    }

    /// Opens the breaker after a failed connection attempt, before the call that made it
    /// reports: a call admitted while closed and still waiting for a connection then makes
    /// no attempt of its own.
    fn trip(&self) {
        let mut state = self.state.lock().unwrap();
        *state = self.opened(*state);
    }

    /// The state after a failure: open for the backoff; an already open breaker keeps its
    /// end (a late failure does not extend the backoff).
    fn opened(&self, state: BreakerState) -> BreakerState {
        match state {
            BreakerState::Open { until } => BreakerState::Open { until },
            _ => BreakerState::Open {
                until: Instant::now() + self.backoff,
            },
        }
    }

    /// Whether a new connection may be attempted now: not while the breaker is open.
    fn lets_connect(&self) -> bool {
        !matches!(*self.state.lock().unwrap(), BreakerState::Open { .. })
    }

    /// Whether calls currently go through.
    pub fn is_closed(&self) -> bool {
        matches!(*self.state.lock().unwrap(), BreakerState::Closed)
    }
}

/// The store: a bounded pool behind a [`Breaker`]. Cheap to clone.
#[derive(Clone)]
pub struct SettingsStore {
    pool: Pool,
    /// Hosts in the URL: each has [`HOST_TIMEOUT`].
    hosts: usize,
    breaker: Arc<Breaker>,
    metrics: Arc<Metrics>,
}

/// A `sites` row as one JSON object (`to_jsonb(sites)`), so that a column added by a later
/// schema file reads as its default while `migrate` has not run yet (a rolling upgrade), and a
/// column a later release adds is ignored by this one.
const SITE_JSON: &str = "to_jsonb(sites)::text";

/// A `sites` row as JSON: the columns, `purged_at` as whether it is set.
#[derive(serde::Deserialize)]
struct SiteRow {
    #[serde(flatten)]
    site: Site,
    #[serde(default)]
    purged_at: Option<serde_json::Value>,
}

/// The site of one `sites` row read as [`SITE_JSON`]. Errors name the row's problem (a row
/// the table's own constraints let through always reads).
fn site_from_json(text: &str) -> Result<Site, StoreError> {
    let row: SiteRow = serde_json::from_str(text)
        .map_err(|e| StoreError::Failed(format!("a sites row that does not read: {e}")))?;
    let mut site = Site {
        purged: row.purged_at.is_some_and(|v| !v.is_null()),
        ..row.site
    };
    // See MIN_CONFIGURED_RATE: NaN and 0 collect nothing, a denormal rate the least.
    if site.sample_rate.is_nan() || site.sample_rate <= 0.0 {
        site.enabled = false;
        site.sample_rate = 1.0;
    } else if site.sample_rate < super::MIN_CONFIGURED_RATE {
        site.sample_rate = super::MIN_CONFIGURED_RATE;
    }
    Ok(site)
}

/// A PostgreSQL error as a log needs it: the message and, from the server, its SQLSTATE
/// (e.g. `db error: ERROR: prepared statement "s11" does not exist (SQLSTATE 26000)`).
pub fn describe(e: &tokio_postgres::Error) -> String {
    let text = crate::logging::chain(e);
    match e.as_db_error() {
        Some(db) => format!("{text} (SQLSTATE {})", db.code().code()),
        None => text,
    }
}

/// Opens connections host by host (see the module doc), one attempt at a time, and none
/// while the breaker is open: the connector of deadpool-postgres's manager
/// ([`deadpool_postgres::Manager::from_connect`]).
struct HostsConnector {
    /// One single-host configuration per host of the URL, in the URL's order.
    hosts: Vec<Config>,
    /// TLS, as the URL's `sslmode` asks ([`crate::tls::libpq`]); `None` for `disable`.
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
    /// Index of the host that answered last: tried first.
    last_good: AtomicUsize,
    /// Held during each attempt, so that callers waiting for a connection see its outcome.
    connecting: tokio::sync::Mutex<()>,
    breaker: Arc<Breaker>,
}

impl HostsConnector {
    fn new(
        config: &Config,
        tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
        breaker: Arc<Breaker>,
    ) -> Self {
        HostsConnector {
            hosts: single_host_configs(config),
            tls,
            last_good: AtomicUsize::new(0),
            connecting: tokio::sync::Mutex::new(()),
            breaker,
        }
    }
}

/// A connection's bytes: TCP or a Unix socket; or a failure of ours carried as a stream that
/// fails at once, so that tokio-postgres reports it as its own error (deadpool-postgres's
/// connector must return a [`tokio_postgres::Error`], which has no public constructor).
enum PgStream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
    Failed(Option<std::io::Error>),
}

impl PgStream {
    /// Opens the socket to `config`'s one host (TCP, or `DIR/.s.PGSQL.PORT` as libpq does).
    async fn open(config: &Config) -> std::io::Result<PgStream> {
        let port = config.get_ports().first().copied().unwrap_or(5432);
        if let Some(addr) = config.get_hostaddrs().first() {
            return Ok(PgStream::Tcp(
                tokio::net::TcpStream::connect((*addr, port)).await?,
            ));
        }
        match config.get_hosts().first() {
            Some(Host::Tcp(host)) => {
                let stream = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
                let _ = stream.set_nodelay(true);
                Ok(PgStream::Tcp(stream))
            }
            Some(Host::Unix(dir)) => Ok(PgStream::Unix(
                tokio::net::UnixStream::connect(dir.join(format!(".s.PGSQL.{port}"))).await?,
            )),
            None => Err(std::io::Error::other("no host in the database URL")),
        }
    }

    fn failed(&mut self) -> std::io::Error {
        match self {
            PgStream::Failed(e) => e
                .take()
                .unwrap_or_else(|| std::io::Error::other("connection failed")),
            _ => unreachable!("only a failed stream fails"),
        }
    }
}

impl tokio::io::AsyncRead for PgStream {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match &mut *self {
            PgStream::Tcp(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            PgStream::Unix(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            PgStream::Failed(_) => std::task::Poll::Ready(Err(self.failed())),
        }
    }
}

impl tokio::io::AsyncWrite for PgStream {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match &mut *self {
            PgStream::Tcp(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            PgStream::Unix(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            PgStream::Failed(_) => std::task::Poll::Ready(Err(self.failed())),
        }
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match &mut *self {
            PgStream::Tcp(s) => std::pin::Pin::new(s).poll_flush(cx),
            PgStream::Unix(s) => std::pin::Pin::new(s).poll_flush(cx),
            PgStream::Failed(_) => std::task::Poll::Ready(Err(self.failed())),
        }
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match &mut *self {
            PgStream::Tcp(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            PgStream::Unix(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            PgStream::Failed(_) => std::task::Poll::Ready(Ok(())),
        }
    }
}

/// `message` as a [`tokio_postgres::Error`] ("error communicating with the server: ...").
async fn store_error(config: &Config, message: String) -> tokio_postgres::Error {
    match config
        .connect_raw(
            PgStream::Failed(Some(std::io::Error::other(message))),
            NoTls,
        )
        .await
    {
        Err(e) => e,
        Ok(_) => unreachable!("a failed stream never completes a handshake"),
    }
}

/// `config` split into one configuration per host, each carrying every other setting.
fn single_host_configs(config: &Config) -> Vec<Config> {
    let hosts = config.get_hosts();
    let addrs = config.get_hostaddrs();
    let ports = config.get_ports();
    let n = hosts.len().max(addrs.len());
    if n <= 1 {
        return vec![config.clone()];
    }
    (0..n)
        .map(|i| {
            let mut c = Config::new();
            if let Some(v) = config.get_user() {
                c.user(v);
            }
            if let Some(v) = config.get_password() {
                c.password(v);
            }
            if let Some(v) = config.get_dbname() {
                c.dbname(v);
            }
            if let Some(v) = config.get_options() {
                c.options(v);
            }
            if let Some(v) = config.get_application_name() {
                c.application_name(v);
            }
            match hosts.get(i) {
                Some(Host::Tcp(h)) => {
                    c.host(h);
                }
                Some(Host::Unix(p)) => {
                    c.host_path(p);
                }
                None => {}
            }
            if let Some(a) = addrs.get(i) {
                c.hostaddr(*a);
            }
            // One port for every host, or one port per host (libpq's rule).
            if let Some(&p) = ports.get(if ports.len() == 1 { 0 } else { i }) {
                c.port(p);
            }
            c.ssl_mode(config.get_ssl_mode())
                .target_session_attrs(config.get_target_session_attrs())
                .channel_binding(config.get_channel_binding())
                .keepalives(config.get_keepalives())
                .keepalives_idle(config.get_keepalives_idle());
            if let Some(t) = config.get_tcp_user_timeout() {
                c.tcp_user_timeout(*t);
            }
            c
        })
        .collect()
}

fn host_name(config: &Config) -> String {
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        Some(Host::Unix(p)) => p.display().to_string(),
        None => config
            .get_hostaddrs()
            .first()
            .map_or_else(|| "?".into(), |a| a.to_string()),
    };
    match config.get_ports().first() {
        Some(p) => format!("{host}:{p}"),
        None => host,
    }
}

impl HostsConnector {
    /// One connection to `config`'s one host: the socket, TLS where the URL asks for it (never
    /// over a Unix socket, as libpq), the start-up handshake; the connection's task spawned.
    async fn attempt(
        &self,
        config: &Config,
    ) -> Result<(tokio_postgres::Client, JoinHandle<()>), tokio_postgres::Error> {
        let stream = match PgStream::open(config).await {
            Ok(stream) => stream,
            Err(e) => PgStream::Failed(Some(e)),
        };
        let ended = |e: tokio_postgres::Error| {
            tracing::debug!(error = %describe(&e), "settings store: connection ended");
        };
        let tcp_host = match config.get_hosts().first() {
            Some(Host::Tcp(h)) => Some(h.clone()),
            _ => None,
        };
        match (&self.tls, tcp_host) {
            (Some(tls), Some(host)) => {
                let connect = <tokio_postgres_rustls::MakeRustlsConnect as tokio_postgres::tls::MakeTlsConnect<PgStream>>::make_tls_connect(&mut tls.clone(), &host)
                    .expect("infallible");
                let (client, connection) = config.connect_raw(stream, connect).await?;
                Ok((
                    client,
                    tokio::spawn(async move { connection.await.unwrap_or_else(ended) }),
                ))
            }
            _ => {
                let mut plain = config.clone();
                plain.ssl_mode(tokio_postgres::config::SslMode::Disable);
                let (client, connection) = plain.connect_raw(stream, NoTls).await?;
                Ok((
                    client,
                    tokio::spawn(async move { connection.await.unwrap_or_else(ended) }),
                ))
            }
        }
    }
}

impl deadpool_postgres::Connect for HostsConnector {
    fn connect(
        &self,
        _: &Config,
    ) -> BoxFuture<'_, Result<(tokio_postgres::Client, JoinHandle<()>), tokio_postgres::Error>>
    {
        Box::pin(async move {
            let _one = self.connecting.lock().await;
            if !self.breaker.lets_connect() {
                return Err(store_error(
                    &self.hosts[0],
                    "not connecting: the last attempt failed within the backoff".into(),
                )
                .await);
            }
            let n = self.hosts.len();
            let first = self.last_good.load(Ordering::Relaxed) % n;
            let mut failures = Vec::new();
            for k in 0..n {
                let i = (first + k) % n;
                let config = &self.hosts[i];
                // The TCP connect, TLS and the start-up handshake, all within the host's bound.
                match tokio::time::timeout(HOST_TIMEOUT, self.attempt(config)).await {
                    Ok(Ok((client, task))) => {
                        self.last_good.store(i, Ordering::Relaxed);
                        tracing::debug!(host = %host_name(config), tried = k + 1, "settings store: connected");
                        return Ok((client, task));
                    }
                    Ok(Err(e)) => failures.push(format!("{}: {}", host_name(config), describe(&e))),
                    Err(_) => failures.push(format!(
                        "{}: no answer within {HOST_TIMEOUT:?}",
                        host_name(config)
                    )),
                }
            }
            self.breaker.trip();
            Err(store_error(&self.hosts[0], failures.join("; ")).await)
        })
    }
}

impl SettingsStore {
    /// A pool over `database_url`; connects lazily. `backoff`: see [`Breaker`].
    pub fn new(
        database_url: &str,
        password: Option<&crate::config::Secret>,
        backoff: Duration,
        metrics: Arc<Metrics>,
    ) -> Result<Self, StoreError> {
        let (url, ssl) = crate::tls::libpq::split(database_url).map_err(StoreError::Failed)?;
        let mut config: Config = url
            .parse()
            .map_err(|e| StoreError::Failed(crate::logging::chain(&e)))?;
        if let Some(password) = password {
            config.password(password.expose());
        }
        config.ssl_mode(ssl.negotiation());
        let tls = ssl
            .client_config()
            .map_err(StoreError::Failed)?
            .map(|c| tokio_postgres_rustls::MakeRustlsConnect::new((*c).clone()));
        config.connect_timeout(HOST_TIMEOUT);
        if config.get_application_name().is_none() {
            config.application_name("collector");
        }
        let breaker = Arc::new(Breaker::new(backoff));
        let connector = HostsConnector::new(&config, tls, breaker.clone());
        let hosts = connector.hosts.len();
        let connect_budget = HOST_TIMEOUT * hosts as u32;
        // Fast recycling: a pooled connection is checked for being closed, no query (a
        // transaction-mode pooler gains nothing from DISCARD ALL, and it costs a round trip).
        let manager = deadpool_postgres::Manager::from_connect(
            config,
            connector,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(QUERY_TIMEOUT))
            .create_timeout(Some(connect_budget + Duration::from_millis(100)))
            .recycle_timeout(Some(HOST_TIMEOUT))
            .build()
            .map_err(|e| StoreError::Failed(e.to_string()))?;
        Ok(SettingsStore {
            pool,
            hosts,
            breaker,
            metrics,
        })
    }

    /// Whether the store is believed up (the breaker is closed).
    pub fn is_up(&self) -> bool {
        self.breaker.is_closed()
    }

    /// Runs `f` with a pooled client if the breaker admits it: the connection within the hosts'
    /// budget, then `f` within [`QUERY_TIMEOUT`]. A connection whose call timed out or failed
    /// other than by a server error is closed, never returned to the pool.
    async fn call<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        F: for<'c> FnOnce(&'c tokio_postgres::Client) -> Query<'c, T>,
    {
        let admission = self.breaker.admit().ok_or(StoreError::Backoff)?;
        self.metrics.settings.store_queries.inc();
        let result = match self.pool.get().await {
            Err(PoolError::Backend(e)) => Err(StoreError::Failed(describe(&e))),
            Err(PoolError::Timeout(_)) => Err(StoreError::Failed(format!(
                "no connection within {:?} (every host tried)",
                HOST_TIMEOUT * self.hosts as u32
            ))),
            Err(e) => Err(StoreError::Failed(e.to_string())),
            Ok(client) => match tokio::time::timeout(QUERY_TIMEOUT, f(&client)).await {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => {
                    // A server error (with a SQLSTATE) leaves the connection usable.
                    if e.as_db_error().is_none() {
                        drop(Object::take(client));
                    }
                    Err(StoreError::Failed(describe(&e)))
                }
                Err(_) => {
                    drop(Object::take(client));
                    Err(StoreError::Failed(format!(
                        "no answer within {QUERY_TIMEOUT:?}"
                    )))
                }
            },
        };
        self.breaker.report(admission, result.is_ok());
        self.metrics
            .settings
            .store_up
            .set(self.breaker.is_closed() as i64);
        if let Err(e) = &result {
            crate::logging::warn_limited(
                "settings_store",
                || tracing::warn!(error = %e, "settings store failed; leaving it alone for the backoff"),
            );
        }
        result
    }

    /// One site by key; `Ok(None)` when it does not exist.
    pub async fn fetch(&self, key: &str) -> Result<Option<Site>, StoreError> {
        let sql = format!("SELECT {SITE_JSON} FROM sites WHERE key = $1");
        // Owned: the call's future may only borrow its connection.
        let key = key.to_owned();
        let row: Option<String> = self
            .call(|c| {
                Box::pin(async move {
                    let rows = c.query_typed(&sql, &[(&key, Type::TEXT)]).await?;
                    rows.first().map(|r| r.try_get(0)).transpose()
                })
            })
            .await?;
        row.as_deref().map(site_from_json).transpose()
    }

    /// Every site, ordered by key.
    pub async fn fetch_all(&self) -> Result<Vec<Site>, StoreError> {
        let sql = format!("SELECT {SITE_JSON} FROM sites ORDER BY key");
        let rows: Vec<String> = self
            .call(|c| {
                Box::pin(async move {
                    let rows = c.query_typed(&sql, &[]).await?;
                    rows.iter().map(|r| r.try_get(0)).collect()
                })
            })
            .await?;
        rows.iter().map(|r| site_from_json(r)).collect()
    }

    /// Inserts or updates a site; an existing site keeps the shard it was placed on.
    pub async fn upsert(&self, site: &Site) -> Result<(), StoreError> {
        let site = site.clone();
        self.call(|c| {
            Box::pin(async move {
                let params: [(&(dyn ToSql + Sync), Type); 9] = [
                    (&site.key, Type::TEXT),
                    (&site.allowed_origins, Type::TEXT_ARRAY),
                    (&site.sample_rate, Type::FLOAT8),
                    (&site.enabled, Type::BOOL),
                    (&site.keep_query, Type::TEXT_ARRAY),
                    (&site.page_groups, Type::TEXT_ARRAY),
                    (&site.dimensions, Type::TEXT_ARRAY),
                    (&site.shard, Type::TEXT),
                    (&site.trusted_proxies, Type::TEXT_ARRAY),
                ];
                // A site saved again is no longer erased: `purged_at` is cleared. Its shard is
                // set when the row is made and never changed here (contract v5 §3).
                c.query_typed(
                    "INSERT INTO sites (key, allowed_origins, sample_rate, enabled, keep_query, page_groups, dimensions, shard, trusted_proxies)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                     ON CONFLICT (key) DO UPDATE SET allowed_origins = EXCLUDED.allowed_origins,
                       sample_rate = EXCLUDED.sample_rate, enabled = EXCLUDED.enabled,
                       keep_query = EXCLUDED.keep_query, page_groups = EXCLUDED.page_groups,
                       dimensions = EXCLUDED.dimensions, trusted_proxies = EXCLUDED.trusted_proxies,
                       purged_at = NULL, updated_at = now()",
                    &params,
                )
                .await
                .map(|_| ())
            })
        })
        .await
    }

    /// Marks a site erased: disabled, and `purged_at` set if it was not (every collector then
    /// drops its records still in a spool). How long ago it was first marked; `Ok(None)` when
    /// there is no such site.
    pub async fn mark_purged(&self, key: &str) -> Result<Option<Duration>, StoreError> {
        let key = key.to_owned();
        self.call(|c| {
            Box::pin(async move {
                let rows = c
                    .query_typed(
                        "UPDATE sites SET enabled = false, purged_at = COALESCE(purged_at, now()), updated_at = now() \
                         WHERE key = $1 RETURNING extract(epoch FROM now() - purged_at)::float8",
                        &[(&key, Type::TEXT)],
                    )
                    .await?;
                rows.first()
                    .map(|r| r.try_get::<_, f64>(0))
                    .transpose()
                    .map(|age| age.map(|a| Duration::from_secs_f64(a.max(0.0))))
            })
        })
        .await
    }

    /// Enables or disables a site; `Ok(false)` when there is no such site.
    pub async fn set_enabled(&self, key: &str, enabled: bool) -> Result<bool, StoreError> {
        let key = key.to_owned();
        self.call(|c| {
            Box::pin(async move {
                let rows = c
                    .query_typed(
                        "UPDATE sites SET enabled = $2, updated_at = now() WHERE key = $1 RETURNING key",
                        &[(&key, Type::TEXT), (&enabled, Type::BOOL)],
                    )
                    .await?;
                Ok(rows.len() == 1)
            })
        })
        .await
    }

    /// Runs DDL statements (the PostgreSQL half of `collector migrate`), with the simple
    /// protocol.
    pub async fn apply(&self, sql: &str) -> Result<(), StoreError> {
        let sql = sql.to_owned();
        self.call(|c| Box::pin(async move { c.batch_execute(&sql).await }))
            .await
    }
}

/// The future of one store call, borrowing its connection.
type Query<'c, T> =
    std::pin::Pin<Box<dyn Future<Output = Result<T, tokio_postgres::Error>> + Send + 'c>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_rate_below_the_least_is_read_disabled_or_raised() {
        let row = |rate: &str| {
            site_from_json(&format!(
                r#"{{"key":"s","allowed_origins":[],"sample_rate":{rate},"enabled":true}}"#
            ))
            .unwrap()
        };
        let zero = row("0");
        assert!(!zero.enabled, "0 collects nothing");
        let tiny = row("1e-300");
        assert!(tiny.enabled);
        assert_eq!(tiny.sample_rate, crate::settings::MIN_CONFIGURED_RATE);
        assert_eq!(row("0.25").sample_rate, 0.25);
    }

    #[test]
    fn one_trial_call_after_the_backoff() {
        let breaker = Breaker::new(Duration::from_millis(50));
        let a = breaker.admit().unwrap();
        let b = breaker.admit().unwrap();
        breaker.report(a, false);
        breaker.report(b, false);
        assert!(breaker.admit().is_none(), "open for the backoff");
        std::thread::sleep(Duration::from_millis(60));
        let trial = breaker.admit().expect("one trial after the backoff");
        assert!(breaker.admit().is_none(), "only one trial at a time");
        breaker.report(trial, false);
        assert!(breaker.admit().is_none(), "a failed trial opens it again");
        std::thread::sleep(Duration::from_millis(60));
        let trial = breaker.admit().unwrap();
        breaker.report(trial, true);
        assert!(breaker.is_closed());
        assert!(breaker.admit().is_some() && breaker.admit().is_some());
    }

    #[test]
    fn a_late_failure_does_not_extend_the_backoff() {
        let breaker = Breaker::new(Duration::from_secs(60));
        let (a, b) = (breaker.admit().unwrap(), breaker.admit().unwrap());
        breaker.report(a, false);
        let first = *breaker.state.lock().unwrap();
        breaker.report(b, false);
        assert_eq!(*breaker.state.lock().unwrap(), first);
    }

    /// A listener that accepts TCP connections and closes them at once (a server that refuses
    /// every session); returns its port and the count of connections it accepted.
    async fn refusing_server() -> (u16, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                drop(socket);
            }
        });
        (port, accepted)
    }

    /// A host that accepts TCP and never answers costs [`HOST_TIMEOUT`], then the next host
    /// is tried; the error names each host and what it did.
    #[tokio::test]
    async fn a_hanging_host_costs_its_timeout_and_the_next_is_tried() {
        let hanging = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let hang_port = hanging.local_addr().unwrap().port();
        let held = Arc::new(Mutex::new(Vec::new()));
        let keep = held.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = hanging.accept().await {
                keep.lock().unwrap().push(socket);
            }
        });
        let (refuse_port, accepted) = refusing_server().await;
        let store = SettingsStore::new(
            &format!("postgres://u@127.0.0.1:{hang_port},127.0.0.1:{refuse_port}/db"),
            None,
            Duration::from_secs(60),
            Arc::new(Metrics::new()),
        )
        .unwrap();
        let start = Instant::now();
        let Err(StoreError::Failed(e)) = store.fetch("a-site").await else {
            panic!("no store answers");
        };
        let took = start.elapsed();
        assert!(
            took >= HOST_TIMEOUT && took < HOST_TIMEOUT * 2,
            "{took:?}: {e}"
        );
        assert!(
            e.contains(&format!("127.0.0.1:{hang_port}: no answer within 1.5s")),
            "{e}"
        );
        assert!(e.contains(&format!("127.0.0.1:{refuse_port}: ")), "{e}");
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "the next host was tried"
        );
        assert_eq!(held.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn calls_admitted_together_make_one_connection_attempt() {
        let (port, accepted) = refusing_server().await;
        let store = SettingsStore::new(
            &format!("postgres://u@127.0.0.1:{port}/db"),
            None,
            Duration::from_secs(60),
            Arc::new(Metrics::new()),
        )
        .unwrap();
        let calls: Vec<_> = (0..POOL_SIZE * 2)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move { store.fetch(&format!("site-{i}")).await })
            })
            .collect();
        for call in calls {
            assert!(call.await.unwrap().is_err());
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert!(!store.is_up());
        assert_eq!(store.fetch("later").await, Err(StoreError::Backoff));
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "none during the backoff"
        );
    }
}
