//! The HTTP server: the accept loop with its connection and header limits, path
//! normalisation, and drain. It serves whatever [`Router`] it is given
//! ([`crate::endpoints::router`]) and imports neither the endpoints nor their state. Each
//! connection is served by [`connection`]: hyper for each request, nothing between them.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::http::uri::PathAndQuery;
use axum::http::{Request, Uri};
use axum::Router;
use hyper_util::rt::TokioTimer;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;

mod connection;
use connection::Connection;

/// Largest request header section accepted, in bytes (contract §2: up to 16 KiB must pass,
/// more is answered 431).
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// Largest request head (request line and headers) hyper parses; beyond, it answers 431
/// itself. The exact 16 KiB header rule is applied after parsing ([`MAX_HEADER_BYTES`]).
const MAX_HEAD_BYTES: usize = MAX_HEADER_BYTES + 8 * 1024;
/// hyper's read buffer bound per connection.
const READ_BUFFER_BYTES: usize = MAX_HEAD_BYTES + 8 * 1024;
/// Most request header lines accepted (hyper answers 431 beyond); 16 KiB of ordinary
/// headers is far fewer lines.
pub const MAX_HEADERS: usize = 512;
/// On shutdown, how long in-flight requests may take to finish.
pub const CONNECTION_DRAIN: Duration = Duration::from_secs(10);

/// Connection-level limits of [`serve`].
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Open connections at most; more are closed at accept.
    pub max_connections: usize,
    /// Time to send complete request headers, and keep-alive idle timeout.
    pub header_timeout: Duration,
}

/// Serves `router` on `listener` until `close` resolves; then stops accepting, lets in-flight
/// requests finish (at most [`CONNECTION_DRAIN`]) and returns.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    metrics: Arc<Metrics>,
    close: impl Future<Output = ()>,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    // hyper starts the header timer whenever it waits for a request head; between requests
    // the connection waits without hyper, for the same time (connection.rs).
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_header_size(MAX_HEAD_BYTES)
        .max_buf_size(READ_BUFFER_BYTES)
        .max_headers(MAX_HEADERS)
        // A client that closes its side right after sending (a quitting browser does) still
        // gets its request processed: without this hyper drops the request at the EOF, and
        // a beacon whose body arrived whole would be lost (contract v3, §2 metrics).
        .half_close(true)
        .keep_alive(true);
    let http = Arc::new(http);
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let draining = CancellationToken::new();
    let tasks = TaskTracker::new();
    tokio::pin!(close);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    crate::logging::warn_limited("accept", || tracing::warn!(error = %e, "accept failed"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut close => break,
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            metrics.http.connections_refused.inc();
            crate::logging::warn_limited("connection_limit", || {
                tracing::warn!("connection limit reached; closing new connections")
            });
            drop(stream);
            continue;
        };
        metrics.http.open_connections.inc();
        let _ = stream.set_nodelay(true);
        let connection = Connection {
            stream,
            peer,
            router: router.clone(),
            http: http.clone(),
            idle_timeout: limits.header_timeout,
            draining: draining.clone(),
        };
        let metrics = metrics.clone();
        tasks.spawn(async move {
            connection.run().await;
            metrics.http.open_connections.dec();
            drop(permit);
        });
    }
    drop(listener);
    // Idle connections close at once; a request in progress is answered (with
    // `Connection: close`) within the drain limit.
    draining.cancel();
    tasks.close();
    if tokio::time::timeout(CONNECTION_DRAIN, tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!("in-flight requests did not finish within the drain limit");
    }
}

/// Collapses repeated slashes and drops a trailing one (`//api/v1/measurements/` is
/// `/api/v1/measurements`), before routing: proxies and hand-written URLs produce both, and
/// the contract (§2) wants them to reach the endpoint rather than a 404 or a redirect.
fn normalise_path(uri: &mut Uri) {
    let path = uri.path();
    if !path.contains("//") && (path.len() == 1 || !path.ends_with('/')) {
        return;
    }
    let mut normal = String::with_capacity(path.len());
    for segment in path.split('/').filter(|s| !s.is_empty()) {
        normal.push('/');
        normal.push_str(segment);
    }
    if normal.is_empty() {
        normal.push('/');
    }
    if let Some(query) = uri.query() {
        normal.push('?');
        normal.push_str(query);
    }
    let mut parts = std::mem::take(uri).into_parts();
    // Made of the pieces of a valid path and query: it parses.
    parts.path_and_query = PathAndQuery::from_maybe_shared(normal).ok();
    *uri = Uri::from_parts(parts).unwrap_or_default();
}

fn header_bytes<B>(req: &Request<B>) -> usize {
    req.headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_with_repeated_and_trailing_slashes_are_normalised() {
        for (sent, routed) in [
            ("/api/v1/measurements", "/api/v1/measurements"),
            ("//api/v1/measurements", "/api/v1/measurements"),
            ("/api/v1/measurements/", "/api/v1/measurements"),
            ("//api//v1///measurements//", "/api/v1/measurements"),
            ("/script.js?v=2", "/script.js?v=2"),
            ("//script.js/?v=2", "/script.js?v=2"),
            ("/", "/"),
            ("//", "/"),
        ] {
            let mut uri: Uri = sent.parse().unwrap();
            normalise_path(&mut uri);
            assert_eq!(uri.to_string(), routed, "{sent}");
        }
        let mut absolute: Uri = "http://collector.example//readyz/".parse().unwrap();
        normalise_path(&mut absolute);
        assert_eq!(absolute.to_string(), "http://collector.example/readyz");
    }
}
