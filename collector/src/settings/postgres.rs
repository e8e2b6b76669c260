//! Connections to PostgreSQL for the settings store: the connector of its pool
//! ([`HostsConnector`]), for what tokio-postgres's own connect does not do.
//!
//! - **Hosts that hang.** A URL may list several hosts (a primary and its standby). Each host
//!   gets its own [`HOST_TIMEOUT`] for connecting and answering the start-up handshake, so a
//!   host that accepts TCP and never answers (a frozen postmaster, a black-holed address) costs
//!   that much and the next host is tried; tokio-postgres's own `connect_timeout` covers only
//!   the TCP connect. The host that answered last is tried first next time.
//! - **One attempt at a time, none in backoff.** Connections are opened one at a time, and
//!   none while the [`Breaker`] is open; a failed attempt trips it before its call returns.
//! - **Errors name their cause**: PostgreSQL's SQLSTATE and message ([`describe`]), or the
//!   connection error of every host tried.
//!
//! Host names are resolved by tokio-postgres per new connection, never per request.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::task::JoinHandle;
use tokio_postgres::config::Host;
use tokio_postgres::{Config, NoTls};

use super::breaker::Breaker;

/// Bound on connecting to one host: TCP connect plus the start-up handshake.
pub const HOST_TIMEOUT: Duration = Duration::from_millis(1500);

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
pub(super) struct HostsConnector {
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
    /// A connector to every host of `config`, in its order, that asks `breaker` before each
    /// attempt and trips it when every host failed.
    pub(super) fn new(
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

    /// Hosts in the URL, each tried within [`HOST_TIMEOUT`].
    pub(super) fn host_count(&self) -> usize {
        self.hosts.len()
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

/// `config`'s one host as a log names it: `host:port`, or the socket folder.
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
